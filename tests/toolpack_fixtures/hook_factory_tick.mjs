// createSchedulerToolpack returning an object with a tick() method.
export function createSchedulerToolpack(context) {
  return {
    tick() {
      return [{ kind: `factory.tick.${context.toolpackId}` }];
    },
  };
}
