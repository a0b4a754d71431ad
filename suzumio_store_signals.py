"""The messages and signals tables: inserts with their events, reads, and delivery."""

from suzumio_errors import BadRequest, NotFound
from suzumio_records import (
    KIND_MESSAGE,
    KIND_WAIT,
    SIGNAL_PENDING,
    SIGNAL_STATUSES,
    SIGNAL_TRANSITIONS,
    dump_json,
    format_ts,
    load_json,
    message_json,
    omit_none,
    signal_json,
    to_datetime,
    truncate,
)

SIGNAL_COLUMNS = ("id", "project", "kind", "source_agent", "source_activation", "target_agent", "target_channel",
                  "priority", "payload_json", "status", "useful_effect", "created_at", "not_before")


class SignalRows:
    """ProjectStore's SignalRows part: SQL over its tables, on the store's connections and write path."""

    def insert_message(self, tx, sender, body, recipient, channel, priority, idempotency_key=None):
        """One message row and its message.created event; the caller has routed and checked it, and
        looked its idempotency key up (keyed_message)."""
        message_id = tx.id("msg")
        tx.execute("INSERT INTO messages (id, project, sender, recipient, channel, priority, body, "
                   "created_at, idempotency_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (message_id, self.project_id, sender, recipient, channel, priority, body, tx.ts,
                    idempotency_key))
        message = omit_none({"id": message_id, "project": self.project_id, "sender": sender,
                             "recipient": recipient, "channel": channel, "priority": priority,
                             "body": body, "createdAt": tx.ts})
        self.add_event(tx, "message.created", message)
        return message

    def keyed_message(self, tx, idempotency_key):
        """The Message JSON recorded with `idempotency_key` in this project, or None; read in the write
        transaction `tx`, so a send that finds none inserts before any other can look."""
        row = tx.one("SELECT * FROM messages WHERE project = ? AND idempotency_key = ?",
                     (self.project_id, idempotency_key))
        return None if row is None else message_json(row)

    def list_messages(self, limit=100, full_body=False):
        """The newest `limit` messages, oldest first; bodies truncated to 12000 unless full_body."""
        rows = self._query("SELECT * FROM messages WHERE project = ? ORDER BY created_at DESC, rowid DESC "
                           "LIMIT ?", (self.project_id, int(limit)))
        result = [message_json(r) for r in reversed(rows)]
        if not full_body:
            for item in result:
                item["body"] = truncate(item["body"], 12000)
        return result

    def message(self, message_id):
        """Full message JSON; NotFound `Unknown message: <id>`."""
        row = self._query_one("SELECT * FROM messages WHERE project = ? AND id = ?",
                              (self.project_id, message_id))
        if row is None:
            raise NotFound(f"Unknown message: {message_id}")
        return message_json(row)

    def direct_messages(self, a=None, b=None, limit=40):
        """Direct messages (no channel); between a and b when both are given. Newest first."""
        sql = "SELECT * FROM messages WHERE project = ? AND channel IS NULL AND recipient IS NOT NULL"
        params = [self.project_id]
        if a is not None and b is not None:
            sql += " AND ((sender = ? AND recipient = ?) OR (sender = ? AND recipient = ?))"
            params += [a, b, b, a]
        rows = self._query(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?", params + [int(limit)])
        return [message_json(r) for r in rows]

    def last_exchanges(self, agent_id, delivering=()):
        """({recipient: when agent_id last sent it a direct message}, {sender: when that agent's last message
        to agent_id was created}) counting only messages delivered to agent_id, or among the signal ids
        `delivering`: both read from what the agent has been given, so a replay reads the same."""
        sent = dict(self._query("SELECT recipient, MAX(created_at) FROM messages WHERE project = ? AND sender = ? "
                                "AND recipient IS NOT NULL AND channel IS NULL GROUP BY recipient",
                                (self.project_id, agent_id)))
        marks = ",".join("?" * len(delivering))
        received = dict(self._query(
            "SELECT json_extract(payload_json, '$.sender') AS sender, MAX(created_at) FROM signals WHERE project = ? "
            "AND target_agent = ? AND kind = ? AND (delivered_activation_id IS NOT NULL"
            + (f" OR id IN ({marks})" if delivering else "") + ") GROUP BY sender",
            (self.project_id, agent_id, KIND_MESSAGE, *delivering)))
        return sent, received

    def answered_from(self, tx, activation_id, agent_id):
        """Whether the activation sent `agent_id` a message or declared a wait, as `tx` sees it."""
        return tx.one("SELECT 1 FROM signals WHERE project = ? AND source_activation = ? AND ((kind = ? AND "
                      "target_agent = ?) OR kind = ?) LIMIT 1",
                      (self.project_id, activation_id, KIND_MESSAGE, agent_id, KIND_WAIT)) is not None

    def direct_pairs(self, limit):
        """The most recently active (sender, recipient) pairs of direct messages: {sender, recipient,
        count, lastAt}, at most `limit`."""
        return [dict(row) for row in self._query(
            "SELECT sender, recipient, COUNT(*) AS count, MAX(created_at) AS lastAt FROM messages "
            "WHERE project = ? AND channel IS NULL AND recipient IS NOT NULL GROUP BY sender, recipient "
            "ORDER BY MAX(created_at) DESC, MAX(rowid) DESC LIMIT ?", (self.project_id, int(limit)))]

    def insert_signal(self, tx, kind, *, target_agent, status, useful_effect, source_agent=None,
                      source_activation=None, target_channel=None, priority, payload, not_before=None):
        """One signal row and its signal.created event (docs/design/store.md); returns the Signal JSON."""
        signal_id = tx.id("sig")
        values = (signal_id, self.project_id, kind, source_agent, source_activation, target_agent,
                  target_channel, priority, dump_json(payload), status, int(useful_effect), tx.ts,
                  not_before or tx.ts)
        tx.execute("INSERT INTO signals (id, project, kind, source_agent, source_activation, "
                   "target_agent, target_channel, priority, payload_json, status, useful_effect, "
                   "created_at, not_before, delivered_at, delivered_activation_id) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                   values)
        # The row as written, not read back: one statement less inside the write lock
        signal = signal_json(dict(zip(SIGNAL_COLUMNS, values, strict=True), delivered_at=None,
                                  delivered_activation_id=None))
        self.add_event(tx, "signal.created", signal)
        return signal

    def ready_signals(self, agent_id, priorities, limit, now=None):
        """The agent's pending signals of the given priorities whose not_before has come, oldest first
        by priority then creation, at most `limit`."""
        ts = format_ts(to_datetime(now))
        rows = self._query(f"SELECT * FROM signals WHERE project = ? AND target_agent = ? AND status = ? "
                           f"AND not_before <= ? AND priority IN ({','.join('?' * len(priorities))}) "
                           f"ORDER BY priority, created_at, rowid LIMIT ?",
                           (self.project_id, agent_id, SIGNAL_PENDING, ts, *priorities, int(limit)))
        return [signal_json(r) for r in rows]

    def agents_with_ready_signals(self, agent_ids, now=None, conn=None, ts=None):
        """The ids among `agent_ids` that have a pending signal whose not_before has come: one statement
        for a tick's agents, so that an idle agent costs no ready_signals query."""
        if not agent_ids:
            return set()
        with self._reading(conn) as reader:
            rows = reader.execute(f"SELECT DISTINCT target_agent FROM signals WHERE project = ? "
                                  f"AND target_agent IN ({','.join('?' * len(agent_ids))}) AND status = ? "
                                  f"AND not_before <= ?",
                                  (self.project_id, *agent_ids, SIGNAL_PENDING, ts or format_ts(to_datetime(now))))
            return {row[0] for row in rows}

    def useful_effects(self, activation_id):
        """How many signals an activation emitted that count as a useful effect."""
        return self._query_one("SELECT COUNT(*) FROM signals WHERE project = ? AND source_activation = ? "
                               "AND useful_effect = 1", (self.project_id, activation_id))[0]

    def signal(self, signal_id):
        row = self._query_one("SELECT * FROM signals WHERE project = ? AND id = ?",
                              (self.project_id, signal_id))
        if row is None:
            raise NotFound(f"Unknown signal: {signal_id}")
        return signal_json(row)

    def earliest_delayed_signal(self, now=None, conn=None, ts=None):
        """The earliest `not_before` after `now` of the project's pending signals, or None."""
        with self._reading(conn) as reader:
            return reader.execute("SELECT MIN(not_before) FROM signals WHERE project = ? AND status = ? "
                                  "AND not_before > ?",
                                  (self.project_id, SIGNAL_PENDING, ts or format_ts(to_datetime(now)))).fetchone()[0]

    def has_pending_signals(self, now=None):
        """Any ready signal in the project."""
        return self._query_one("SELECT 1 FROM signals WHERE project = ? AND status = 'pending' "
                               "AND target_agent IS NOT NULL AND not_before <= ? LIMIT 1",
                               (self.project_id, format_ts(to_datetime(now)))) is not None

    def has_pending_signals_for_agent(self, agent_id, include_delayed=False, now=None):
        """Any ready pending signal for the agent; delayed ones count with include_delayed."""
        sql = "SELECT 1 FROM signals WHERE project = ? AND target_agent = ? AND status = 'pending'"
        params = [self.project_id, agent_id]
        if not include_delayed:
            sql += " AND not_before <= ?"
            params.append(format_ts(to_datetime(now)))
        return self._query_one(sql + " LIMIT 1", params) is not None

    def list_signals(self, target_agent=None, status=None, limit=25, kind=None):
        """Newest-first Signal JSON, optionally filtered (coordination.signals panel)."""
        if status is not None and status not in SIGNAL_STATUSES:
            raise BadRequest(f"Invalid signal status: {status}")
        sql, params = "SELECT * FROM signals WHERE project = ?", [self.project_id]
        for column, value in (("target_agent", target_agent), ("status", status), ("kind", kind)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        rows = self._query(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?", params + [int(limit)])
        return [signal_json(r) for r in rows]

    def signal_counts(self):
        """Signal counts grouped by (status, priority), ordered by status then priority."""
        rows = self._query("SELECT status, priority, COUNT(*) AS n FROM signals WHERE project = ? "
                           "GROUP BY status, priority ORDER BY status, priority", (self.project_id,))
        return [{"status": r["status"], "priority": r["priority"], "count": r["n"]} for r in rows]

    def messages_received(self, agent_id, limit):
        """The payloads of the last `limit` messages delivered to the agent, newest first."""
        rows = self._query("SELECT payload_json FROM signals WHERE project = ? AND target_agent = ? AND kind = ? "
                           "AND delivered_activation_id IS NOT NULL ORDER BY delivered_at DESC, rowid DESC LIMIT ?",
                           (self.project_id, agent_id, KIND_MESSAGE, int(limit)))
        return [load_json(row["payload_json"], {}) for row in rows]

    def signals_delivered_to(self, activation_id, kind=None):
        """Signals delivered to one activation, in delivery order."""
        sql = "SELECT * FROM signals WHERE project = ? AND delivered_activation_id = ?"
        params = [self.project_id, activation_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        return [signal_json(r) for r in self._query(sql + " ORDER BY delivered_at, rowid", params)]

    def activation_priority(self, activation_id):
        """The highest priority ("P0" first) of the signals delivered to one activation, None without any."""
        row = self._query_one("SELECT MIN(priority) AS priority FROM signals WHERE project = ? "
                              "AND delivered_activation_id = ?", (self.project_id, activation_id))
        return row["priority"] if row else None

    def latest_signal(self, kind, target_agent=None):
        """Newest signal of a kind (for one target when given), any status, or None."""
        sql, params = "SELECT * FROM signals WHERE project = ? AND kind = ?", [self.project_id, kind]
        if target_agent is not None:
            sql += " AND target_agent = ?"
            params.append(target_agent)
        row = self._query_one(sql + " ORDER BY created_at DESC, rowid DESC LIMIT 1", params)
        return signal_json(row) if row else None

    def deliver_signals(self, tx, agent_id, signal_ids, activation_id):
        """pending -> delivered, only for rows still pending and targeted at the agent."""
        sources, target = SIGNAL_TRANSITIONS["deliver"]
        delivered = []
        for signal_id in signal_ids:
            cursor = tx.execute(f"UPDATE signals SET status = ?, delivered_at = ?, "
                                f"delivered_activation_id = ? WHERE project = ? AND id = ? "
                                f"AND target_agent = ? AND status IN ({','.join('?' * len(sources))})",
                                (target, tx.ts, activation_id, self.project_id, signal_id, agent_id,
                                 *sources))
            if cursor.rowcount:
                delivered.append(signal_id)
        return delivered

    def mark_signals_delivered(self, agent_id, signals, activation_id, now=None):
        """Mark signals (ids or Signal JSON) delivered; returns the ids that changed."""
        ids = [s["id"] if isinstance(s, dict) else s for s in signals]
        with self.write(now) as tx:
            return self.deliver_signals(tx, agent_id, ids, activation_id)
