"""The effects table: the ledger of external tool calls as rows (intended, done, failed, in doubt, and a
person's resolution). A mixin of suzumio_store.ProjectStore; what a call's effect is and when it is in
doubt are suzumio_effects' rules."""

from suzumio_records import EFFECT_INTENDED, EFFECT_TRANSITIONS, dump_json, load_json, omit_none

# The table of migration 11 (suzumio_store.MIGRATIONS). One row per external tool call (`tool_call_id`
# unique: a start asked again records nothing new); `executor` is where the call runs (`runner` or
# `controller`), which says whose crash leaves it in doubt, and `process` which controller process ran it;
# `told_at` is when its agent was told it is in doubt.
MIGRATION_EFFECTS = [
    """CREATE TABLE effects (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL, tool TEXT NOT NULL, input_json TEXT NOT NULL, call_key TEXT,
        executor TEXT NOT NULL CHECK (executor IN ('runner', 'controller')), process TEXT,
        state TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed', 'in_doubt')),
        started_at TEXT NOT NULL, finished_at TEXT, doubted_at TEXT, why TEXT,
        told_at TEXT, resolution TEXT CHECK (resolution IN ('done', 'not_done')), resolved_at TEXT,
        resolved_by TEXT, note TEXT)""",
    "CREATE UNIQUE INDEX idx_effects_tool_call ON effects (project, tool_call_id)",
    "CREATE INDEX idx_effects_project_state ON effects (project, state, started_at)",
    "CREATE INDEX idx_effects_activation ON effects (project, activation_id, state)",
]


def effect_json(row):
    """One ledger entry as the API, the CLI and the control room show it."""
    return omit_none({
        "id": row["id"], "agent": row["agent_id"], "activation": row["activation_id"], "tool": row["tool"],
        "input": load_json(row["input_json"], {}), "state": row["state"], "callKey": row["call_key"],
        "startedAt": row["started_at"], "toolCallId": row["tool_call_id"], "executor": row["executor"],
        "finishedAt": row["finished_at"], "doubtedAt": row["doubted_at"], "why": row["why"],
        "resolvedAt": row["resolved_at"], "resolution": row["resolution"], "resolvedBy": row["resolved_by"],
        "note": row["note"]})


class EffectRows:
    """ProjectStore's EffectRows part: SQL over the effects table, on the store's connections and write path."""

    def insert_effect(self, tx, agent_id, activation_id, tool_call_id, tool, tool_input, call_key, executor,
                      process=None):
        """The intended row of one external call; None when the call already has one (asked again)."""
        effect_id = tx.id("eff")
        inserted = tx.execute(
            "INSERT INTO effects (id, project, agent_id, activation_id, tool_call_id, tool, input_json, call_key, "
            "executor, process, state, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (project, tool_call_id) DO NOTHING",
            (effect_id, self.project_id, agent_id, activation_id, tool_call_id, tool,
             dump_json({} if tool_input is None else tool_input), call_key, executor, process, EFFECT_INTENDED,
             tx.ts)).rowcount
        return effect_id if inserted else None

    def move_effect(self, tx, effect_id, trigger, extra_sets="", extra_params=()):
        """One conditional state change by `trigger` (records.EFFECT_TRANSITIONS); whether it changed."""
        sources, target = EFFECT_TRANSITIONS[trigger]
        return bool(tx.execute(
            f"UPDATE effects SET state = ?{extra_sets} WHERE project = ? AND id = ? "
            f"AND state IN ({','.join('?' * len(sources))})",
            (target, *extra_params, self.project_id, effect_id, *sources)).rowcount)

    def effect_of_call(self, tx, tool_call_id):
        return tx.one("SELECT * FROM effects WHERE project = ? AND tool_call_id = ?", (self.project_id, tool_call_id))

    def open_effects(self, tx, activation_id=None, executor=None, not_process=None):
        """The intended rows, of one activation, one executor, and another process than `not_process`
        when given, oldest first."""
        where, params = "project = ? AND state = ?", [self.project_id, EFFECT_INTENDED]
        if activation_id is not None:
            where += " AND activation_id = ?"
            params.append(activation_id)
        if executor is not None:
            where += " AND executor = ?"
            params.append(executor)
        if not_process is not None:
            where += " AND process IS NOT ?"
            params.append(not_process)
        return tx.all(f"SELECT * FROM effects WHERE {where} ORDER BY started_at, rowid", params)

    def untold_effects(self, activation_id):
        """The activation's effects in doubt that its agent has not been told of, oldest first."""
        return self._query("SELECT * FROM effects WHERE project = ? AND activation_id = ? AND state = 'in_doubt' "
                           "AND told_at IS NULL ORDER BY started_at, rowid", (self.project_id, activation_id))

    def mark_told(self, tx, effect_ids):
        for effect_id in effect_ids:
            tx.execute("UPDATE effects SET told_at = ? WHERE project = ? AND id = ? AND told_at IS NULL",
                       (tx.ts, self.project_id, effect_id))

    def effect_row(self, effect_id, conn=None):
        with self._reading(conn) as reader:
            return reader.execute("SELECT * FROM effects WHERE project = ? AND id = ?",
                                  (self.project_id, effect_id)).fetchone()

    def effect_rows(self, state=None, limit=200):
        """The ledger, newest first; only `state` when given."""
        where, params = "project = ?", [self.project_id]
        if state is not None:
            where += " AND state = ?"
            params.append(state)
        return self._query(f"SELECT * FROM effects WHERE {where} ORDER BY started_at DESC, rowid DESC LIMIT ?",
                           (*params, int(limit)))

    def running_call_key(self, activation_id):
        """The call key of the activation's tool call that is running now (the newest), or None: the
        `Idempotency-Key` the egress proxy adds to the requests that call makes."""
        row = self._query_one("SELECT call_key FROM tool_calls WHERE project = ? AND activation_id = ? "
                              "AND status = 'running' AND call_key IS NOT NULL ORDER BY created_at DESC, rowid DESC "
                              "LIMIT 1", (self.project_id, activation_id))
        return row["call_key"] if row else None

    def has_open_effects(self, executor, not_process):
        """Whether an intended effect of `executor` was run by another process than `not_process`."""
        return self._query_one("SELECT 1 FROM effects WHERE project = ? AND state = ? AND executor = ? "
                               "AND process IS NOT ? LIMIT 1",
                               (self.project_id, EFFECT_INTENDED, executor, not_process)) is not None

    def in_doubt_count(self):
        row = self._query_one("SELECT COUNT(*) AS n FROM effects WHERE project = ? AND state = 'in_doubt'",
                              (self.project_id,))
        return row["n"]
