// Runner module of the example `notes` toolpack. It runs inside each activation (in the container on
// docker-chat, as a host process on local), once per activation, and must register every tool the
// manifest declares.

export function createRunnerToolpack(context) {
  return {
    tools: {
      // Support-backed: the controller module owns the notebook, so forward the model's input.
      "notes.add": (input) => context.callSupport("notes.add", input),

      // Runner-local: pure computation, no controller round trip beyond the audit record.
      "notes.word_count": (input) => {
        if (typeof input.text !== "string") throw new Error("text is required");
        const words = input.text.split(/\s+/).filter(Boolean).length;
        return {
          title: "word count",
          output: `${words} words`,
          metadata: { words, agent: context.agentId },
        };
      },
    },
  };
}
