// A scheduler hook that never resolves.
export function schedulerTick() {
  return new Promise(() => {});
}
