// Default-export factory whose result is the handler map itself.
export default function (context) {
  return {
    "d.tool": (input) => ({ output: `default ${context.agent.id} ${input.x}` }),
  };
}
