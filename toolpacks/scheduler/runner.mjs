// Runner module of the packaged `scheduler` toolpack: every tool forwards its input to the
// controller module through the toolpack's support route (docs/design/toolpacks.md).
const TOOLS = ["schedule.once", "schedule.recurring", "schedule.list", "schedule.cancel"];

export function createRunnerToolpack(context) {
  return {
    tools: Object.fromEntries(TOOLS.map((name) => [name, (input) => context.callSupport(name, input)])),
  };
}
