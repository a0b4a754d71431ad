// Runner module whose default export returns the handler map directly.
export default function (context) {
  return {
    "d.run": (input) => ({ output: `default ${context.toolpackId} ${input.x ?? "none"}` }),
    label: "not a tool",
  };
}
