// A hook that sends a message and reads it back within the same invocation.
export function schedulerTick(context) {
  context.store.sendMessage({ sender: "scheduler", recipient: "pm", body: "hi" });
  const row = context.store.db.prepare("select count(*) as n from messages").get();
  return { signals: [{ kind: "x.count", targetAgent: "pm", payload: { n: row.n } }] };
}
