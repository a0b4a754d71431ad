// WebUI handler as a single function export receiving (entryId, input).
export function webui(entryId, input) {
  return { output: `function ${entryId} ${JSON.stringify(input)}` };
}
