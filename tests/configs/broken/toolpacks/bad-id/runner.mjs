export function createRunnerToolpack() { return { tools: {} }; }
