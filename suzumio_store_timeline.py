"""The team view's time-range pages over activations, messages and signals."""

from suzumio_records import (
    ACT_RUNNING,
    KIND_MESSAGE,
    KIND_SUBMITTED,
    KIND_WAIT,
    load_json,
    message_json,
    omit_none,
    public_activation_json,
    truncate,
)


class TimelineReads:
    """ProjectStore's TimelineReads part: SQL over its tables, on the store's connections and write path."""

    def timeline_page(self, since=None, until=None, limit=500):
        """One time-range page of the team view: activations and messages in [since, until),
        newest first by start/creation until `limit` items, widened to keep equal timestamps together.
        The page's lower bound comes back as `since`; `more` says older items exist (next: until=since).
        Activations that ended inside the window, and (on the newest page) all running ones, are
        included too, so a bar that began on an older page is current; clients merge by id."""
        def newest_times(conn, table, col):
            sql, params = f"SELECT {col} AS ts FROM {table} WHERE project = ?", [self.project_id]
            if since is not None:
                sql += f" AND {col} >= ?"
                params.append(since)
            if until is not None:
                sql += f" AND {col} < ?"
                params.append(until)
            return [r["ts"] for r in conn.execute(sql + f" ORDER BY {col} DESC LIMIT ?", params + [int(limit) + 1])]

        with self.snapshot() as conn:
            # Each side walks its (project, time) index; the page's bound is the limit-th newest of both.
            newest = sorted(newest_times(conn, "activations", "started_at")
                            + newest_times(conn, "messages", "created_at"), reverse=True)[:int(limit) + 1]
            more = len(newest) > limit
            low = newest[limit - 1] if more else since
            window, window_params = "", []
            if low is not None:
                window += " AND {col} >= ?"
                window_params.append(low)
            if until is not None:
                window += " AND {col} < ?"
                window_params.append(until)

            def rows(sql, col, extra=()):
                return conn.execute(sql + window.format(col=col) + f" ORDER BY {col}, rowid",
                                    [self.project_id, *extra, *window_params])

            messages = [message_json(r) for r in rows("SELECT * FROM messages WHERE project = ?", "created_at")]
            acts = {r["id"]: r for r in rows("SELECT * FROM activations WHERE project = ?", "started_at")}
            for r in rows("SELECT * FROM activations WHERE project = ? AND completed_at IS NOT NULL",
                          "completed_at"):
                acts.setdefault(r["id"], r)
            if until is None:
                for r in conn.execute("SELECT * FROM activations WHERE project = ? AND status = ?",
                                      (self.project_id, ACT_RUNNING)):
                    acts.setdefault(r["id"], r)
            woke = {}
            ids = list(acts)
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                for r in conn.execute(
                        "SELECT * FROM signals WHERE project = ? AND delivered_activation_id IN "
                        f"({','.join('?' * len(chunk))}) ORDER BY created_at, rowid", [self.project_id, *chunk]):
                    woke.setdefault(r["delivered_activation_id"], []).append(timeline_signal(r))
            marks = [timeline_signal(r) for r in rows(
                "SELECT * FROM signals WHERE project = ? AND kind IN (?, ?)", "created_at",
                (KIND_WAIT, KIND_SUBMITTED))]
        activations = []
        for row in sorted(acts.values(), key=lambda r: (r["started_at"], r["id"])):
            item = public_activation_json(row)
            for key in ("text", "error"):
                if key in item:
                    item[key] = truncate(item[key], TIMELINE_TEXT_LIMIT)
            item["signals"] = woke.get(row["id"], [])
            activations.append(item)
        for item in messages:
            item["body"] = truncate(item["body"], TIMELINE_TEXT_LIMIT)
        return omit_none({
            "since": low, "until": until, "more": more, "activations": activations, "messages": messages,
            "waits": [m for m in marks if m["kind"] == KIND_WAIT],
            "approvals": [m for m in marks if m["kind"] == KIND_SUBMITTED]})


TIMELINE_TEXT_LIMIT = 2000


def timeline_signal(row):
    """A signal as the team view draws it: what woke an activation, a wait, or a submission."""
    payload = load_json(row["payload_json"], {})
    return omit_none({
        "id": row["id"], "kind": row["kind"], "priority": row["priority"], "sourceAgent": row["source_agent"],
        "sourceActivation": row["source_activation"], "targetAgent": row["target_agent"],
        "messageId": payload.get("id") if row["kind"] == KIND_MESSAGE else payload.get("messageId"),
        "reason": payload.get("reason"), "createdAt": row["created_at"],
        "deliveredActivationId": row["delivered_activation_id"]})
