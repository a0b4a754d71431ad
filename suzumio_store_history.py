"""The agent history tables: messages, parts and compactions."""
import json
from pathlib import Path

from suzumio_errors import BadRequest, NotFound
from suzumio_records import (
    HISTORY_ROLES,
    compaction_json,
    dump_json,
    history_json,
    history_part_type,
    omit_none,
    require_running,
)


class HistoryRows:
    """ProjectStore's HistoryRows part: SQL over its tables, on the store's connections and write path."""

    def add_history(self, tx, agent_id, activation_id, role, kind, content, metadata=None, parts=None):
        sequence = tx.one("SELECT COALESCE(MAX(sequence), 0) + 1 FROM agent_history_messages "
                          "WHERE project = ? AND agent_id = ?", (self.project_id, agent_id))[0]
        message_id = tx.id("hist")
        tx.execute("INSERT INTO agent_history_messages (id, project, agent_id, activation_id, role, kind, "
                   "content, sequence, metadata_json, compaction_id, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                   (message_id, self.project_id, agent_id, activation_id, role, kind, content, sequence,
                    dump_json(metadata or {}), tx.ts))
        parts = parts or [{"type": history_part_type(role), "text": content}]
        for index, part in enumerate(parts):
            tx.execute("INSERT INTO agent_history_parts (id, project, agent_id, message_id, activation_id, "
                       "part_index, type, text, tool_call_id, tool_name, input_json, output, error, "
                       "metadata_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (tx.id("hpart"), self.project_id, agent_id, message_id, activation_id, index,
                        part.get("type") or history_part_type(role), part.get("text"),
                        part.get("toolCallId"), part.get("toolName"), part.get("inputJson"),
                        part.get("output"), part.get("error"), dump_json(part.get("metadata") or {}),
                        tx.ts))
        self.add_event(tx, "agent_history.message", omit_none({
            "id": message_id, "agentId": agent_id, "activationId": activation_id, "role": role, "kind": kind,
            "chars": len(content)}))
        return self._history_rows(tx.conn, "id = ?", (message_id,))[0]

    def append_history(self, agent_id, activation_id, role, kind, content, metadata=None, parts=None,
                       now=None):
        """docs/design/store.md via the runner route; a given activation must be the agent's and running."""
        if role not in HISTORY_ROLES:
            raise BadRequest(f"Invalid history role: {role}")
        for name, value in (("kind", kind), ("content", content)):
            if not isinstance(value, str) or not value.strip():
                raise BadRequest(f"{name} is required")
        metadata = metadata if isinstance(metadata, dict) else {}
        with self.write(now) as tx:
            self.require_agent(agent_id, tx.conn)
            if activation_id is not None:
                require_running(self.owned_activation(tx.conn, agent_id, activation_id), "history")
            return self.add_history(tx, agent_id, activation_id, role, kind, content, metadata, parts)

    def _history_rows(self, conn, where, params, order="sequence", limit=None, content_limit=None,
                      part_limit=None):
        sql = f"SELECT * FROM agent_history_messages WHERE project = ? AND {where} ORDER BY {order}"
        args = [self.project_id, *params]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = conn.execute(sql, args).fetchall()
        if not rows:
            return []
        parts = {}
        ids = [r["id"] for r in rows]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            for part in conn.execute(f"SELECT * FROM agent_history_parts WHERE project = ? AND message_id IN "
                                     f"({','.join('?' * len(chunk))}) ORDER BY part_index",
                                     [self.project_id, *chunk]):
                parts.setdefault(part["message_id"], []).append(part)
        return [history_json(r, parts.get(r["id"], []), content_limit, part_limit) for r in rows]

    def active_history(self, agent_id):
        """docs/design/store.md: unarchived rows, compaction markers first, then by sequence; with parts."""
        with self.snapshot() as conn:
            self.require_agent(agent_id, conn)
            return self.active_history_rows(conn, agent_id)

    def active_history_rows(self, conn, agent_id):
        return self._history_rows(conn, "agent_id = ? AND compaction_id IS NULL", (agent_id,),
                                  order="(role = 'compaction') DESC, sequence")

    def history_page(self, agent_id, limit=100, before=None, include_archived=True):
        """docs/http-api.md page: newest first, with nextBefore when the page is full."""
        limit = min(500, max(1, int(limit)))
        where, params = "agent_id = ?", [agent_id]
        if before is not None:
            where += " AND sequence < ?"
            params.append(int(before))
        if not include_archived:
            where += " AND compaction_id IS NULL"
        with self.snapshot() as conn:
            self.require_agent(agent_id, conn)
            rows = self._history_rows(conn, where, params, order="sequence DESC", limit=limit,
                                      content_limit=40000, part_limit=20000)
        page = {"agentId": agent_id}
        if len(rows) == limit:
            page["nextBefore"] = rows[-1]["sequence"]
        page["messages"] = rows
        return page

    def archive_history(self, tx, compaction_id, agent_id, activation_id, marker_id, path, head, raw_chars,
                        summary, reason=None, selected_model=None):
        """Mark the `head` rows archived under one compaction and write its row and event; returns the
        compaction record (docs/design/store.md)."""
        ids = [m["id"] for m in head]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            tx.execute(f"UPDATE agent_history_messages SET compaction_id = ? WHERE project = ? "
                       f"AND compaction_id IS NULL AND id IN ({','.join('?' * len(chunk))})",
                       [compaction_id, self.project_id, *chunk])
        sequences = [m["sequence"] for m in head]
        tx.execute("INSERT INTO agent_history_compactions (id, project, agent_id, activation_id, "
                   "summary_message_id, archive_path, start_sequence, end_sequence, "
                   "archived_message_count, raw_chars, summary, reason, selected_model, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (compaction_id, self.project_id, agent_id, activation_id, marker_id, str(path),
                    min(sequences), max(sequences), len(head), raw_chars, summary, reason,
                    selected_model, tx.ts))
        self.add_event(tx, "agent_history.compacted", omit_none({
            "compactionId": compaction_id, "agentId": agent_id, "activationId": activation_id,
            "archivedMessageCount": len(head), "rawChars": raw_chars}))
        return compaction_json(tx.one("SELECT * FROM agent_history_compactions WHERE id = ?", (compaction_id,)))

    def history_archive(self, agent_id, compaction_id):
        """docs/http-api.md: {compaction, archive}; the agent segment is not matched (reference)."""
        row = self._query_one("SELECT * FROM agent_history_compactions WHERE project = ? AND id = ?",
                              (self.project_id, compaction_id))
        if row is None:
            raise NotFound(f"Unknown history compaction: {compaction_id}")
        archive = json.loads(Path(row["archive_path"]).read_text(encoding="utf-8"))
        return {"compaction": compaction_json(row), "archive": archive}
