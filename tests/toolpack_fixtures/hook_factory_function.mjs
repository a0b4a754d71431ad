// createSchedulerToolpack returning the hook function itself.
export function createSchedulerToolpack(context) {
  return () => ({ signals: [{ kind: "factory.function", payload: { now: context.now } }] });
}
