// Runner side of review-tools: every tool is forwarded to the controller, the result returned unchanged.
export function createRunnerToolpack(context) {
  return {
    tools: {
      "review.summarize": (input) => context.callSupport("review.summarize", input),
      "review.probe": (input) => context.callSupport("review.probe", input),
      "review.hang": (input) => context.callSupport("review.hang", input),
    },
  };
}
