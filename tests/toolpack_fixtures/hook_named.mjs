// schedulerTick export: echoes the context it saw as one signal request.
export function schedulerTick(context) {
  return [
    {
      kind: "x.ping",
      targetAgent: "pm",
      payload: {
        now: context.now,
        agents: context.agents.map((agent) => [agent.id, agent.activeActivationId]),
        project: context.project,
        toolpackId: context.toolpackId,
      },
    },
  ];
}
