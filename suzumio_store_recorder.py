"""Rows of the flight recorder (docs/replay.md): the model exchanges the controller's proxy forwarded, in
order per activation, and the artifact versions recorded after each activation. A mixin of
suzumio_store.ProjectStore, which owns the connections and the one write path; the rules (what to record,
hashing, blobs on disk, replay) are suzumio_recorder's."""
import zlib

from suzumio_records import dump_json, load_json

# A request repeats the activation's whole history so far: compressed, a recording grows far slower.
REQUEST_COMPRESSION = 6

# The tables of migration 7 (suzumio_store.MIGRATIONS). `seq` orders a project's artifact versions: the
# state of an agent's folder after an activation is, per path, its newest row up to that activation.
MIGRATION_RECORDER = [
    """CREATE TABLE model_exchanges (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, activation_id TEXT NOT NULL, agent_id TEXT NOT NULL,
        request_index INTEGER NOT NULL, provider_id TEXT NOT NULL, preset_id TEXT NOT NULL,
        request_zlib BLOB NOT NULL, status INTEGER, headers_json TEXT NOT NULL, answer TEXT NOT NULL,
        overflow INTEGER NOT NULL DEFAULT 0, usage_json TEXT NOT NULL, retries INTEGER NOT NULL,
        error TEXT, replayed INTEGER NOT NULL DEFAULT 0, started_at TEXT NOT NULL,
        duration_ms INTEGER NOT NULL)""",
    ("CREATE UNIQUE INDEX idx_model_exchanges_activation_index "
     "ON model_exchanges (activation_id, request_index)"),
    """CREATE TABLE artifact_versions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, project TEXT NOT NULL, activation_id TEXT NOT NULL,
        agent_id TEXT NOT NULL, path TEXT NOT NULL, digest TEXT, size INTEGER NOT NULL,
        created_at TEXT NOT NULL)""",
    "CREATE INDEX idx_artifact_versions_agent_path ON artifact_versions (project, agent_id, path, seq)",
    "CREATE INDEX idx_artifact_versions_activation ON artifact_versions (activation_id)",
    # One row per recorded activation: the newest artifact version seq when its folder was recorded.
    """CREATE TABLE artifact_snapshots (
        activation_id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL,
        upto_seq INTEGER NOT NULL, changes INTEGER NOT NULL, bytes INTEGER NOT NULL, created_at TEXT NOT NULL)""",
    # Where a replay or a fork came from (one row, in the new project's own database).
    """CREATE TABLE project_origins (
        project TEXT PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('replay', 'fork')), source TEXT NOT NULL,
        at_activation TEXT, tools TEXT CHECK (tools IN ('live', 'recorded')),
        on_diverge TEXT CHECK (on_diverge IN ('stop', 'live')), diverged_json TEXT,
        injected_messages INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL)""",
]

EXCHANGE_COLUMNS = ("id, activation_id, agent_id, request_index, provider_id, preset_id, request_zlib, status, "
                    "headers_json, answer, overflow, usage_json, retries, error, replayed, started_at, duration_ms")


def exchange_json(row):
    """One recorded model exchange as the API and the replay read it."""
    return {"id": row["id"], "activationId": row["activation_id"], "agentId": row["agent_id"],
            "index": row["request_index"], "providerId": row["provider_id"], "presetId": row["preset_id"],
            "request": load_json(zlib.decompress(row["request_zlib"]).decode("utf-8"), {}), "status": row["status"],
            "headers": load_json(row["headers_json"], {}), "answer": row["answer"],
            "overflow": bool(row["overflow"]), "usage": load_json(row["usage_json"], {}),
            "retries": row["retries"], "error": row["error"], "replayed": bool(row["replayed"]),
            "startedAt": row["started_at"], "durationMs": row["duration_ms"]}


class RecorderRows:
    """The recorder's reads and writes of one project store (a ProjectStore mixin)."""

    def record_exchange(self, activation_id, agent_id, provider_id, preset_id, request, *, status, headers,
                        answer, overflow, usage, retries, error, started_at, duration_ms, replayed=False,
                        now=None, packed=None):
        """Append one model exchange of an activation; its index is the next of that activation. `packed`:
        the request as pack_request made it, for a caller that writes inside a transaction it opened."""
        if packed is None:
            packed = self.pack_request(request)  # outside the write lock
        with self.write(now) as tx:
            index = tx.one("SELECT COUNT(*) FROM model_exchanges WHERE activation_id = ?", (activation_id,))[0]
            tx.execute(f"INSERT INTO model_exchanges (project, {EXCHANGE_COLUMNS}) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (self.project_id, tx.id("mx"), activation_id, agent_id, index, provider_id, preset_id,
                        packed, status, dump_json(headers or {}), answer or "", int(bool(overflow)),
                        dump_json(usage or {}), int(retries), error, int(bool(replayed)), started_at,
                        int(duration_ms)))
            return index

    @staticmethod
    def pack_request(request):
        """A request's stored form (compressed JSON)."""
        return zlib.compress(dump_json(request).encode("utf-8"), REQUEST_COMPRESSION)

    def exchanges(self, activation_id=None):
        """The recorded exchanges of one activation (or of the project), in the order they were made."""
        where, params = "project = ?", [self.project_id]
        if activation_id is not None:
            where, params = where + " AND activation_id = ?", params + [activation_id]
        rows = self._query(f"SELECT {EXCHANGE_COLUMNS} FROM model_exchanges WHERE {where} "
                           "ORDER BY rowid", params)
        return [exchange_json(row) for row in rows]

    def exchange_bytes(self, activation_id):
        """The bytes one activation's recorded exchanges take in their columns (requests compressed)."""
        row = self._query_one("SELECT COALESCE(SUM(LENGTH(request_zlib) + LENGTH(answer) + LENGTH(headers_json) "
                              "+ LENGTH(usage_json)), 0) AS bytes FROM model_exchanges WHERE activation_id = ?",
                              (activation_id,))
        return row["bytes"]

    def artifact_state(self, agent_id, upto_activation=None):
        """{path: (digest, size)} of an agent's artifact folder as recorded after `upto_activation` (else
        after its newest recorded activation); deleted paths are left out, and an activation whose folder
        was not recorded gives None."""
        params = [self.project_id, agent_id]
        bound = ""
        if upto_activation is not None:
            snap = self._query_one("SELECT upto_seq FROM artifact_snapshots WHERE activation_id = ?",
                                   (upto_activation,))
            if snap is None:
                return None
            bound, params = "AND seq <= ?", params + [snap["upto_seq"]]
        rows = self._query("SELECT path, digest, size FROM artifact_versions WHERE seq IN ("
                           "SELECT MAX(seq) FROM artifact_versions WHERE project = ? AND agent_id = ? "
                           f"{bound} GROUP BY path)", params)
        return {row["path"]: (row["digest"], row["size"]) for row in rows if row["digest"] is not None}

    def artifact_snapshot(self, activation_id):
        """{changes, bytes, createdAt} of an activation whose folder was recorded, else None."""
        row = self._query_one("SELECT changes, bytes, created_at FROM artifact_snapshots WHERE activation_id = ?",
                              (activation_id,))
        return None if row is None else {"changes": row["changes"], "bytes": row["bytes"],
                                         "createdAt": row["created_at"]}

    def record_artifact_versions(self, activation_id, agent_id, changes, stored_bytes, now=None):
        """What changed in an agent's folder after an activation, [(path, digest or None, size)], and the
        blob bytes that recording added; False when that activation was recorded already."""
        with self.write(now) as tx:
            if tx.one("SELECT 1 FROM artifact_snapshots WHERE activation_id = ?", (activation_id,)):
                return False
            for path, digest, size in changes:
                tx.execute("INSERT INTO artifact_versions (project, activation_id, agent_id, path, digest, size, "
                           "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           (self.project_id, activation_id, agent_id, path, digest, int(size), tx.ts))
            upto = tx.one("SELECT COALESCE(MAX(seq), 0) FROM artifact_versions WHERE project = ?",
                          (self.project_id,))[0]
            tx.execute("INSERT INTO artifact_snapshots (activation_id, project, agent_id, upto_seq, changes, bytes, "
                       "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (activation_id, self.project_id, agent_id, upto, len(changes), int(stored_bytes), tx.ts))
            return True

    def artifact_versions(self, activation_id=None):
        """The recorded artifact changes (of one activation, or all), oldest first."""
        where, params = "project = ?", [self.project_id]
        if activation_id is not None:
            where, params = where + " AND activation_id = ?", params + [activation_id]
        rows = self._query("SELECT seq, activation_id, agent_id, path, digest, size, created_at "
                           f"FROM artifact_versions WHERE {where} ORDER BY seq", params)
        return [{"seq": r["seq"], "activationId": r["activation_id"], "agentId": r["agent_id"],
                 "path": r["path"], "digest": r["digest"], "size": r["size"], "createdAt": r["created_at"]}
                for r in rows]

    def recorded_digests(self):
        """Every blob digest an artifact version still names."""
        rows = self._query("SELECT DISTINCT digest FROM artifact_versions WHERE project = ? AND digest IS NOT NULL",
                           (self.project_id,))
        return {row["digest"] for row in rows}

    def prune_recordings(self, keep_activations, now=None):
        """Keep the recordings of the newest `keep_activations` activations: older exchanges and snapshots
        go, and so do older artifact versions a later version of the same path supersedes, so the folder
        state at the cut stays whole. Returns how many rows went."""
        with self.write(now) as tx:
            cut = tx.one("SELECT started_at FROM activations WHERE project = ? ORDER BY started_at DESC, rowid DESC "
                         "LIMIT 1 OFFSET ?", (self.project_id, int(keep_activations)))
            if cut is None:
                return 0
            old = ("SELECT id FROM activations WHERE project = ? AND started_at <= ?")
            gone = tx.execute(f"DELETE FROM model_exchanges WHERE project = ? AND activation_id IN ({old})",
                              (self.project_id, self.project_id, cut[0])).rowcount
            # An old version a later one of its path supersedes is no state anyone can restore any more,
            # nor is an old deletion; the rest is the folder's state at the cut.
            gone += tx.execute(f"DELETE FROM artifact_versions AS a WHERE project = ? AND activation_id IN ({old}) "
                               "AND (digest IS NULL OR EXISTS (SELECT 1 FROM artifact_versions AS b WHERE "
                               "b.project = a.project AND b.agent_id = a.agent_id AND b.path = a.path "
                               "AND b.seq > a.seq))", (self.project_id, self.project_id, cut[0])).rowcount
            gone += tx.execute(f"DELETE FROM artifact_snapshots WHERE project = ? AND activation_id IN ({old})",
                               (self.project_id, self.project_id, cut[0])).rowcount
            return gone

    # -- replay and fork origins (suzumio_replay owns what they mean)

    def set_origin(self, kind, source, at_activation=None, tools=None, on_diverge=None, now=None):
        with self.write(now) as tx:
            tx.execute("INSERT INTO project_origins (project, kind, source, at_activation, tools, on_diverge, "
                       "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (self.project_id, kind, source, at_activation, tools, on_diverge, tx.ts))

    def origin(self, conn=None):
        """{kind, source, at, tools, onDiverge, diverged, injectedMessages, ended} or None."""
        with self._reading(conn) as conn:
            row = conn.execute("SELECT * FROM project_origins WHERE project = ?", (self.project_id,)).fetchone()
        if row is None:
            return None
        return {"kind": row["kind"], "source": row["source"], "at": row["at_activation"], "tools": row["tools"],
                "onDiverge": row["on_diverge"], "diverged": load_json(row["diverged_json"], None),
                "injectedMessages": row["injected_messages"], "ended": bool(row["ended"]),
                "createdAt": row["created_at"]}

    def mark_diverged(self, tx, divergence):
        """The replay's first divergence; False when one was recorded already."""
        return tx.execute("UPDATE project_origins SET diverged_json = ? WHERE project = ? AND diverged_json IS NULL",
                          (dump_json(divergence), self.project_id)).rowcount == 1

    def mark_injected(self, tx, count):
        """The replay delivered the source's first `count` user messages (only ever moves forward)."""
        return tx.execute("UPDATE project_origins SET injected_messages = ? WHERE project = ? "
                          "AND injected_messages = ?", (count, self.project_id, count - 1)).rowcount == 1

    def mark_replay_ended(self, tx):
        return tx.execute("UPDATE project_origins SET ended = 1 WHERE project = ? AND ended = 0",
                          (self.project_id,)).rowcount == 1

    def activation_ids_in_order(self, conn=None):
        """Every activation id of the project in the order they started."""
        with self._reading(conn) as conn:
            rows = conn.execute("SELECT id FROM activations WHERE project = ? ORDER BY started_at, rowid",
                                (self.project_id,)).fetchall()
        return [row["id"] for row in rows]

    def event_positions(self, types):
        """[(rowid, type, data)] of the project's events of `types`, oldest first."""
        rows = self._query(f"SELECT rowid, type, data_json FROM events WHERE project = ? AND type IN "
                           f"({','.join('?' * len(types))}) ORDER BY rowid", (self.project_id, *types))
        return [(row["rowid"], row["type"], load_json(row["data_json"], {})) for row in rows]

    def tool_calls_of(self, activation_id):
        """The audited tool calls of one activation in the order they started."""
        rows = self._query("SELECT id, tool, input_json, status, output, error FROM tool_calls "
                           "WHERE project = ? AND activation_id = ? ORDER BY created_at, rowid",
                           (self.project_id, activation_id))
        return [dict(row) for row in rows]

    def write_calls_of(self, agent_id, before):
        """The agent's completed file.write and file.patch calls started by `before` (a timestamp), oldest first."""
        rows = self._query("SELECT id, tool, input_json, status, output, error FROM tool_calls WHERE project = ? "
                           "AND agent_id = ? AND status = 'completed' AND tool IN ('file.write', 'file.patch') "
                           "AND created_at <= ? ORDER BY created_at, rowid", (self.project_id, agent_id, before))
        return [dict(row) for row in rows]

    def model_call_usages(self):
        """[(usage dict, cost_usd or None)] of every model call of the project, oldest first."""
        rows = self._query("SELECT usage_json, cost_usd FROM model_calls WHERE project = ? ORDER BY rowid",
                           (self.project_id,))
        return [(load_json(row["usage_json"], {}), row["cost_usd"]) for row in rows]

    def record_replayed_model_call(self, activation_id, agent_id, provider_id, preset_id, status, usage,
                                   recorded_cost=None, now=None):
        """A model call the replay answered from its source's recording: the recorded usage is kept and
        shown (with what it cost when it was made, `recordedCostUsd`), but it counts nothing for the
        budget (`tokens` 0) and costs nothing."""
        usage = dict(usage if isinstance(usage, dict) else {}, replayed=True)
        if recorded_cost is not None:
            usage["recordedCostUsd"] = recorded_cost
        with self.write(now) as tx:
            self.owned_activation(tx.conn, agent_id, activation_id)
            tx.execute("INSERT INTO model_calls (id, project, activation_id, agent_id, provider_id, preset_id, "
                       "status, tokens, usage_json, created_at, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, 0)",
                       (tx.id("mcall"), self.project_id, activation_id, agent_id, provider_id, preset_id,
                        int(status), dump_json(usage), tx.ts))

    # -- forks: the source's rows up to the fork point, copied into the new project

    def fork_rows(self, table, cut_ts, kept):
        """The rows of `table` a fork at `cut_ts` keeps (`kept`: the activation ids that ended by then),
        as dicts, in their order."""
        marks = ",".join("?" * len(kept)) or "NULL"
        by_time = "created_at <= ?"
        by_activation = f"activation_id IN ({marks})"
        where = {
            "messages": (by_time, [cut_ts]),
            "signals": (by_time, [cut_ts]),
            "events": (by_time, [cut_ts]),
            "activations": (f"id IN ({marks})", list(kept)),
            "agent_history_messages": (f"{by_time} AND (activation_id IS NULL OR {by_activation})",
                                       [cut_ts, *kept]),
            "agent_history_parts": (f"{by_time} AND (activation_id IS NULL OR {by_activation})", [cut_ts, *kept]),
            "agent_history_compactions": (f"{by_time} AND (activation_id IS NULL OR {by_activation})",
                                          [cut_ts, *kept]),
        }.get(table, (by_activation, list(kept)))
        rows = self._query(f"SELECT * FROM {table} WHERE project = ? AND {where[0]} ORDER BY rowid",
                           (self.project_id, *where[1]))
        return [dict(row) for row in rows]

    def insert_fork_rows(self, table, rows, now=None):
        """Insert copied rows (their `project` already this project's) into `table`."""
        if not rows:
            return
        columns = list(rows[0])  # artifact versions keep their seq, which the copied snapshots name
        with self.write(now) as tx:
            for row in rows:
                tx.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                           [row[column] for column in columns])

    def reopen_signals(self, kept, now=None):
        """A fork's signals delivered to activations it did not keep are pending again."""
        marks = ",".join("?" * len(kept)) or "NULL"
        with self.write(now) as tx:
            tx.execute(f"UPDATE signals SET status = 'pending', delivered_at = NULL, delivered_activation_id = NULL "
                       f"WHERE project = ? AND delivered_activation_id IS NOT NULL "
                       f"AND delivered_activation_id NOT IN ({marks})", (self.project_id, *kept))
