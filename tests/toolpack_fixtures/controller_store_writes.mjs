// Controller module of the read-only facade test (tests/test_toolpacks.py): its tools ask the store
// facade's read path (store.db.prepare(sql).all / .get, the store.db.all / store.db.get callbacks) to
// delete every event, and its write path (.run) to append one.
export function createControllerToolpack(context) {
  return {
    tools: {
      "probe.delete_through_all": () => {
        const rows = context.store.db.prepare("DELETE FROM events").all();
        return { output: `all answered ${JSON.stringify(rows)}` };
      },
      "probe.delete_through_get": () => {
        const row = context.store.db.prepare("DELETE FROM events WHERE project = ? RETURNING id").get(context.project);
        return { output: `get answered ${JSON.stringify(row)}` };
      },
      "probe.count": () => {
        const row = context.store.db.prepare("SELECT COUNT(*) AS n FROM events").get();
        return { output: `events ${row.n}` };
      },
    },
  };
}
