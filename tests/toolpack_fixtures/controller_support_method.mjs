// A factory result with support(tool, input), which takes precedence over handler maps.
export async function createControllerToolpack() {
  return {
    async support(tool, input) {
      return { output: `support ${tool} ${JSON.stringify(input)}` };
    },
    tools: { "s.tool": () => ({ output: "not this one" }) },
  };
}
