// A factory that registers no tool handlers.
export function createControllerToolpack() {
  return { tools: {} };
}
