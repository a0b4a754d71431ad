// WebUI handlers as a plain `webui` export (no createWebuiToolpack).
export const webui = {
  "m.entry": (input) => ({ output: `map ${input.n}` }),
};
