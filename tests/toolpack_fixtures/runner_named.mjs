// Runner module with a named factory; tools exercise callSupport and recordSignal.
export async function createRunnerToolpack(context) {
  return {
    tools: {
      "r.context": async () => ({
        output: JSON.stringify({
          keys: Object.keys(context).sort(),
          project: context.project,
          agentId: context.agentId,
          activationId: context.activationId,
          workspace: context.workspace,
          toolpackId: context.toolpackId,
        }),
      }),
      "r.support": (input) => context.callSupport("r.support", input),
      "r.supportNoInput": () => context.callSupport("r.support"),
      "r.signal": (input) => context.recordSignal(input).then((value) => ({ output: JSON.stringify(value) })),
      "r.throw": () => {
        throw new Error("runner side failed");
      },
      "r.invalid": () => ({ title: "no output" }),
      "r.noisy": () => {
        console.log("runner log line");
        process.stdout.write("runner stdout write\n");
        return { output: "quiet", title: "t", metadata: { a: 1 }, extra: "dropped" };
      },
    },
    notAFunction: 1,
  };
}
