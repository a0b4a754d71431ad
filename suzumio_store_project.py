"""The project row, its status and the events table."""
import json
import secrets
import sqlite3
from collections import namedtuple

from suzumio_errors import BadRequest, Conflict, NotFound
from suzumio_records import (
    ACT_FAILED,
    ACT_RUNNING,
    AGENT_QUIET,
    PROJECT_INITIALIZED,
    PROJECT_RUNNING,
    PROJECT_STATUSES,
    PROJECT_TRANSITIONS,
    agent_json,
    dump_json,
    event_row_json,
    format_ts,
    load_json,
    project_row_json,
    shrink,
    to_datetime,
    truncate,
)

# The rowid cursors of the events table walk its rowids: `+project` keeps SQLite off the (project,
# created_at) index, which every event of a project file matches, so a read of the newest events costs
# the events read, not a scan and a sort of all of them.
BY_ROWID = "+project = ?"

TickReads = namedtuple("TickReads", "project agents ready origin delayed running_starts")


class ProjectRows:
    """ProjectStore's ProjectRows part: SQL over its tables, on the store's connections and write path."""

    def _create(self, task, config, agents, config_path, now):
        with self.write(now) as tx:
            try:
                tx.execute("INSERT INTO projects (id, name, status, task, config_json, submitted_report, "
                           "created_at, updated_at) VALUES (?, ?, ?, ?, ?, NULL, ?, ?)",
                           (self.project_id, self.project_id, PROJECT_INITIALIZED, task, dump_json(config),
                            tx.ts, tx.ts))
            except sqlite3.IntegrityError:
                raise Conflict(f"Project already initialized: {self.project_id}") from None
            for seed in agents:
                tx.execute("INSERT INTO agents (id, project, role, display_name, status, prompt, model, "
                           "tools_json, workspace_path, token, active_activation_id, container_name, "
                           "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
                           (seed.id, self.project_id, seed.role, seed.display_name, AGENT_QUIET,
                            seed.prompt or "", seed.model, dump_json(list(seed.tools)),
                            str(self.workspace(seed.id)), secrets.token_urlsafe(24), tx.ts, tx.ts))
            self.add_event(tx, "project.initialized", {"configPath": str(config_path)})

    def project_row(self, conn=None):
        with self._reading(conn) as reader:
            row = reader.execute("SELECT * FROM projects WHERE id = ?", (self.project_id,)).fetchone()
        if row is None:
            raise NotFound(f"Unknown project: {self.project_id}")
        return row

    def project(self):
        """The project row without config_json."""
        return project_row_json(self.project_row())

    def tick_reads(self, now=None):
        """What a scheduler tick reads before it decides anything, on one borrowed reader: the project;
        and while it runs, its agents (id order), the ids of agents with a ready pending signal, the replay
        origin, the earliest delayed signal's not_before and the running activations' start times. An idle
        tick reads nothing else, and nothing at all while the database is unchanged (database_version) and
        no delayed signal fell due; the records returned are shared between ticks and only read."""
        ts = format_ts(to_datetime(now))
        # Never waits for a write in progress (a burst of route commits): then the rows are read.
        version = self.database_version(wait=False)
        cached = self._tick_cache
        # Nothing committed since the last reads, the clock did not go back (a test's clock may) and no
        # delayed signal became ready: they all still hold.
        if (version is not None and cached is not None and cached[0] == version and cached[1] <= ts
                and (cached[2].delayed is None or cached[2].delayed > ts)):
            return cached[2]
        reads = self._tick_reads(ts)
        self._tick_cache = (version, ts, reads)
        return reads

    def _tick_reads(self, ts):
        with self._reading() as conn:
            # Whether an origin exists rides on the project's statement; a project that does not run (where
            # routes post most messages) costs this statement only.
            row = conn.execute("SELECT p.*, EXISTS (SELECT 1 FROM project_origins WHERE project = p.id) "
                               "AS has_origin FROM projects p WHERE p.id = ?", (self.project_id,)).fetchone()
            if row is None:
                raise NotFound(f"Unknown project: {self.project_id}")
            project = project_row_json(row)
            if project["status"] != PROJECT_RUNNING:
                return TickReads(project, [], set(), None, None, [])
            agents = self._tick_agents(conn)
            ready = self.agents_with_ready_signals([agent["id"] for agent in agents], conn=conn, ts=ts)
            origin = self.origin(conn) if row["has_origin"] else None
            # A tick expires an activation through its agent's binding: with no agent bound, no timeout
            # can be due.
            bound = any("activeActivationId" in agent for agent in agents)
            return TickReads(project, agents, ready, origin, self.earliest_delayed_signal(conn=conn, ts=ts),
                             self.running_starts(conn) if bound else [])

    def _tick_agents(self, conn):
        """The agent records as list_agents() reads them, shared between ticks while a row is unchanged:
        an idle project's agents are decoded once, not on every tick. The callers only read them."""
        rows = conn.execute("SELECT * FROM agents WHERE project = ? ORDER BY id", (self.project_id,)).fetchall()
        cache, fresh = self._tick_agent_cache, {}
        for row in rows:
            key = tuple(row)
            fresh[key] = cache.get(key) or agent_json(row)
        self._tick_agent_cache = fresh  # only the current rows: the cache never outgrows the agents
        return list(fresh.values())

    def config(self):
        """The resolved configuration dict stored at init (cached: it never changes)."""
        if self._config is None:
            self._config = json.loads(self.project_row()["config_json"])
        return self._config

    def set_project_status(self, tx, trigger_or_status, extra=None):
        sources, target = PROJECT_TRANSITIONS.get(trigger_or_status, (PROJECT_STATUSES, trigger_or_status))
        if target not in PROJECT_STATUSES:
            raise BadRequest(f"Invalid project status: {target}")
        sets, params = "status = ?, updated_at = ?", [target, tx.ts]
        for column, value in (extra or {}).items():
            sets += f", {column} = ?"
            params.append(value)
        placeholders = ",".join("?" * len(sources))
        cursor = tx.execute(f"UPDATE projects SET {sets} WHERE id = ? AND status IN ({placeholders})",
                            params + [self.project_id, *sources])
        if cursor.rowcount == 0:
            raise Conflict(f"Project {self.project_id} cannot become {target}")
        self.add_event(tx, "project.status", {"status": target})

    def set_status(self, status, now=None):
        """Write a project status (any of the enum) with its project.status event."""
        with self.write(now) as tx:
            self.set_project_status(tx, status)
        return self.project()

    def start(self, now=None):
        """Project -> running (from any status). The caller ticks afterwards."""
        with self.write(now) as tx:
            self.set_project_status(tx, "start")
        return self.project()

    def add_event(self, tx, type_, data):
        cursor = tx.execute("INSERT INTO events (id, project, type, data_json, created_at) VALUES (?, ?, ?, ?, ?)",
                            (tx.id("evt"), self.project_id, type_, dump_json(data if data is not None else {}),
                             tx.ts))
        self._uncommitted_event = cursor.lastrowid  # under the write lock; becomes event_watermark at COMMIT

    def append_event(self, type_, data=None, now=None):
        """Append one event row (docs/design/store.md)."""
        if not isinstance(type_, str) or not type_:
            raise BadRequest("type is required")
        with self.write(now) as tx:
            self.add_event(tx, type_, data)

    def list_events(self, limit=200, shrink_data=False, before=None, event_type=None, agent=None):
        """Newest events first as raw rows; shrink_data shrinks large payloads (docs/http-api.md). `before`
        (an event id) pages: only events older than it; `event_type` keeps one type, or the types under a
        prefix ending in `.` (`tool.`); `agent` keeps the events whose agentId or sender is that agent."""
        where, params = ["project = ?"], [self.project_id]
        if before is not None:
            cursor = self._query_one("SELECT created_at, rowid AS rid FROM events WHERE project = ? AND id = ?",
                                     (self.project_id, before))
            if cursor is None:
                raise NotFound(f"Unknown event: {before}")
            where.append("(created_at < ? OR (created_at = ? AND rowid < ?))")
            params += [cursor["created_at"], cursor["created_at"], cursor["rid"]]
        if event_type:
            if event_type.endswith("."):
                where.append("substr(type, 1, ?) = ?")
                params += [len(event_type), event_type]
            else:
                where.append("type = ?")
                params.append(event_type)
        if agent:
            where.append("(json_extract(data_json, '$.agentId') = ? OR json_extract(data_json, '$.sender') = ?)")
            params += [agent, agent]
        rows = self._query(f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY created_at DESC, rowid DESC "
                           "LIMIT ?", (*params, int(limit)))
        result = [event_row_json(r) for r in rows]
        if shrink_data:
            for item in result:
                try:
                    item["data_json"] = dump_json(shrink(json.loads(item["data_json"]), 4000))
                except ValueError:
                    item["data_json"] = dump_json({"raw": truncate(item["data_json"], 4000)})
        return result

    def events_after(self, cursor_rowid, limit=None):
        """Events inserted after the rowid cursor, oldest first, as (rowid, raw row) pairs."""
        sql = f"SELECT rowid AS rid, * FROM events WHERE {BY_ROWID} AND rowid > ? ORDER BY rowid"
        params = [self.project_id, int(cursor_rowid)]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [(r["rid"], event_row_json(r)) for r in self._query(sql, params)]

    def event_replay(self, limit):
        """SSE start (docs/http-api.md): the newest `limit` events oldest first, and the cursor."""
        with self.snapshot() as conn:
            rows = conn.execute(f"SELECT rowid AS rid, * FROM events WHERE {BY_ROWID} ORDER BY rowid DESC "
                                "LIMIT ?", (self.project_id, int(limit))).fetchall()
            cursor = self.latest_event_rowid(conn)
        return [(r["rid"], event_row_json(r)) for r in reversed(rows)], cursor

    def latest_event_rowid(self, conn=None):
        """The rowid of the project's newest event, 0 when there is none."""
        with self._reading(conn) as conn:
            row = conn.execute(f"SELECT rowid FROM events WHERE {BY_ROWID} ORDER BY rowid DESC LIMIT 1",
                               (self.project_id,)).fetchone()
        return row[0] if row else 0

    def event_rowid(self, event_id):
        """The rowid of an event of this project (Last-Event-ID), or None."""
        row = self._query_one("SELECT rowid FROM events WHERE project = ? AND id = ?",
                              (self.project_id, event_id))
        return row[0] if row else None

    def latest_event(self, type_, match=None):
        """Newest event of a type whose data fields equal `match` (monitor dedupe), or None."""
        sql = "SELECT * FROM events WHERE project = ? AND type = ?"
        params = [self.project_id, type_]
        for key, value in (match or {}).items():
            sql += " AND json_extract(data_json, ?) = ?"
            params += [f'$."{key}"', value]
        row = self._query_one(sql + " ORDER BY created_at DESC, rowid DESC LIMIT 1", params)
        if row is None:
            return None
        data = event_row_json(row)
        data["data"] = load_json(row["data_json"], {})
        return data

    def project_stats(self):
        """docs/http-api.md stats object."""
        # One statement for all eight counts: the project list asks this of every project.
        row = self._query_one(
            "SELECT (SELECT COUNT(*) FROM messages WHERE project = :p) AS messageCount, "
            "(SELECT COUNT(*) FROM activations WHERE project = :p) AS activationCount, "
            "(SELECT COUNT(*) FROM activations WHERE project = :p AND status = :failed) AS failedActivationCount, "
            "(SELECT COUNT(*) FROM activations WHERE project = :p AND status = :running) AS runningActivationCount, "
            "(SELECT COUNT(*) FROM tool_calls WHERE project = :p) AS toolCallCount, "
            "(SELECT COUNT(*) FROM agent_history_messages WHERE project = :p) AS historyMessageCount, "
            "(SELECT COUNT(*) FROM agent_history_compactions WHERE project = :p) AS historyCompactionCount, "
            "(SELECT COUNT(*) FROM events WHERE project = :p) AS eventCount",
            {"p": self.project_id, "failed": ACT_FAILED, "running": ACT_RUNNING})
        return dict(row)

    def project_summary(self, full=True):
        """docs/http-api.md (full=False) / (full=True) project summary."""
        with self.snapshot():
            data = self.project()
            if not full:
                data["task"] = truncate(data["task"], 1000)
            data["stats"] = self.project_stats()
            data["spend"], data["agentSpend"] = self.project_spend()
            data["agentEgress"] = self.egress_totals()
            data["origin"] = self.origin()  # a replay's or fork's source (docs/replay.md), else None
            data["agents"] = self.public_agents()
            data["recentActivations"] = self.list_activations(10) if full else []
            data["recentMessages"] = self.list_messages(10) if full else []
        return data
