// Runner module of the packaged `plan` toolpack: every tool forwards its input to the controller
// module through the toolpack's support route (docs/design/toolpacks.md).
const TOOLS = ["plan.create", "plan.status", "plan.update", "plan.set_item_status", "plan.close"];

export function createRunnerToolpack(context) {
  return {
    tools: Object.fromEntries(TOOLS.map((name) => [name, (input) => context.callSupport(name, input)])),
  };
}
