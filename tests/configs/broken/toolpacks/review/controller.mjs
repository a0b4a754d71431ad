export function createControllerToolpack() { return { tools: {} }; }
