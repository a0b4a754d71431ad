"""The activations and tool_calls tables."""
import json

from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound
from suzumio_records import (
    ACT_FAILED,
    ACT_RUNNING,
    ACTIVATION_TRANSITIONS,
    PROJECT_RUNNING,
    TOOL_CALL_TRANSITIONS,
    TOOL_COMPLETED,
    TOOL_RUNNING,
    activation_json,
    dump_json,
    load_json,
    omit_none,
    preview,
    public_activation_json,
    require_running,
    tool_call_row_json,
    truncate,
)


class ActivationRows:
    """ProjectStore's ActivationRows part: SQL over its tables, on the store's connections and write path."""

    def activation_row(self, activation_id, conn=None):
        with self._reading(conn) as reader:
            row = reader.execute("SELECT * FROM activations WHERE project = ? AND id = ?",
                                 (self.project_id, activation_id)).fetchone()
        if row is None:
            raise NotFound(f"Unknown activation: {activation_id}")
        return row

    def owned_activation(self, conn, agent_id, activation_id):
        row = self.activation_row(activation_id, conn)
        if agent_id is not None and row["agent_id"] != agent_id:
            raise Forbidden(f"Activation {activation_id} does not belong to {agent_id}")
        return row

    def require_activation(self, agent_id, activation_id, running_for=None):
        """Checks E–F of docs/http-api.md, plus G when running_for is "tool" or "history"."""
        with self._reading() as conn:
            row = self.owned_activation(conn, agent_id, activation_id)
        if running_for is not None:
            require_running(row, running_for)
        return activation_json(row)

    def claim_agent(self, tx, agent_id, activation_id):
        """Bind the agent to a new activation if the project is running and the agent has no running
        activation (one conditional write); returns whether it changed."""
        guard = (" AND NOT EXISTS (SELECT 1 FROM activations a WHERE a.project = agents.project "
                 "AND a.id = agents.active_activation_id AND a.status = 'running')"
                 " AND EXISTS (SELECT 1 FROM projects p WHERE p.id = agents.project AND p.status = ?)")
        return bool(self.move_agent(tx, agent_id, "activation_created", active=activation_id,
                                    extra_where=guard, extra_params=(PROJECT_RUNNING,)))

    def insert_activation(self, tx, activation_id, agent_id, prompt):
        """The running activation row (the caller writes its activation.started event once its signals
        are delivered)."""
        directory = self.activation_dir(activation_id)
        tx.execute("INSERT INTO activations (id, project, agent_id, status, prompt, input_path, "
                   "output_path, container_name, started_at, completed_at, text, error, "
                   "emitted_messages, usage_json, context_json) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, NULL, NULL, 0, NULL, NULL)",
                   (activation_id, self.project_id, agent_id, ACT_RUNNING, prompt,
                    str(directory / "input.json"), str(directory / "result.json"), tx.ts))

    def mark_completed(self, tx, activation_id, agent_id, text, usage):
        """running -> completed with text, usage and the count of messages the agent sent meanwhile;
        the agent back to quiet. Returns whether the activation was still running."""
        emitted = (", emitted_messages = (SELECT COUNT(*) FROM messages m WHERE m.project = ? "
                   "AND m.sender = ? AND m.created_at >= activations.started_at), "
                   "text = ?, usage_json = ?")
        if not self.end_activation(tx, activation_id, "complete", emitted,
                                   (self.project_id, agent_id, text, dump_json(usage))):
            return False
        self.move_agent(tx, agent_id, "activation_completed", bound_to=activation_id)
        return True

    def set_activation_container(self, activation_id, name, now=None, node=None):
        """Record the container (or local-<pid>) name, and the node when known, on the activation and
        its agent; re-read it."""
        with self.write(now) as tx:
            row = self.activation_row(activation_id, tx.conn)
            tx.execute("UPDATE activations SET container_name = ?, node = COALESCE(?, node) "
                       "WHERE project = ? AND id = ?", (name, node, self.project_id, activation_id))
            self.move_agent(tx, row["agent_id"], "container_attached", active=activation_id,
                             bound_to=activation_id, container_name=name)
            return activation_json(self.activation_row(activation_id, tx.conn))

    def set_activation_node(self, activation_id, node, now=None):
        """Record the machine an activation runs on (a Swarm task's node, once the manager placed it)."""
        with self.write(now) as tx:
            tx.execute("UPDATE activations SET node = ? WHERE project = ? AND id = ?",
                       (node, self.project_id, activation_id))

    def end_activation(self, tx, activation_id, trigger, extra_sets, extra_params):
        sources, target = ACTIVATION_TRANSITIONS[trigger]
        cursor = tx.execute(f"UPDATE activations SET status = ?, completed_at = ?{extra_sets} "
                            f"WHERE project = ? AND id = ? AND status IN ({','.join('?' * len(sources))})",
                            (target, tx.ts, *extra_params, self.project_id, activation_id, *sources))
        if cursor.rowcount and self._observer is not None:
            ended = activation_json(self.activation_row(activation_id, tx.conn))
            tx.after_commit.append(lambda: self._observer.activation_ended(ended))
        return cursor.rowcount

    def record_activation_context(self, activation_id, agent_id, context, now=None):
        """Store the model-context snapshot (docs/http-api.md); a later post replaces it."""
        if not isinstance(context, dict):
            raise BadRequest("context is required")
        messages = context.get("messages")
        if (context.get("version") != 1 or context.get("kind") != "model-context"
                or not isinstance(messages, list)):
            raise BadRequest("Invalid activation context")
        count = context.get("messageCount")
        count = count if isinstance(count, int) else len(messages)
        total = context.get("totalChars")
        if not isinstance(total, int):
            total = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        with self.write(now) as tx:
            row = self.owned_activation(tx.conn, agent_id, activation_id)
            tx.execute("UPDATE activations SET context_json = ? WHERE project = ? AND id = ?",
                       (dump_json(context), self.project_id, activation_id))
            self.add_event(tx, "activation.context_recorded", {"activationId": activation_id,
                                                            "agentId": row["agent_id"],
                                                            "messageCount": count, "totalChars": total})
        return {"status": "recorded", "activationId": activation_id}

    def activation(self, activation_id):
        """The full activation record; NotFound `Unknown activation: <id>`."""
        return activation_json(self.activation_row(activation_id))

    def activation_context(self, activation_id):
        """docs/http-api.md: public activation, prompt, and the snapshot or its fallback."""
        row = self.activation_row(activation_id)
        context = load_json(row["context_json"])
        if context is None:
            prompt = row["prompt"]
            context = {"version": 1, "kind": "model-context", "recordedAt": row["started_at"],
                       "messageCount": 1, "totalChars": len(prompt),
                       "messages": [{"role": "user", "content": prompt, "chars": len(prompt)}]}
        return {"activation": public_activation_json(row), "activationPrompt": row["prompt"],
                "context": context}

    def list_activations(self, limit=100):
        """docs/http-api.md: the newest `limit` activations, oldest first, as public activations."""
        rows = self._query("SELECT * FROM activations WHERE project = ? ORDER BY started_at DESC, rowid DESC "
                           "LIMIT ?", (self.project_id, int(limit)))
        return [public_activation_json(r) for r in reversed(rows)]

    def running_activations(self):
        """Every running activation of the project (full records), in start order."""
        rows = self._query("SELECT * FROM activations WHERE project = ? AND status = ? "
                           "ORDER BY started_at, rowid", (self.project_id, ACT_RUNNING))
        return [activation_json(r) for r in rows]

    def running_starts(self, conn=None):
        """The start times of the project's running activations (their timeouts)."""
        with self._reading(conn) as reader:
            return [row[0] for row in reader.execute("SELECT started_at FROM activations WHERE project = ? "
                                                     "AND status = ?", (self.project_id, ACT_RUNNING))]

    def agent_has_activations(self, agent_id):
        """Whether any activation row exists for the agent (first vs later prompt, docs/design/scheduler.md)."""
        return self._query_one("SELECT 1 FROM activations WHERE project = ? AND agent_id = ? LIMIT 1",
                               (self.project_id, agent_id)) is not None

    def latest_failed_activation(self, agent_id):
        """The agent's most recent failed activation by started_at, or None."""
        row = self._query_one("SELECT * FROM activations WHERE project = ? AND agent_id = ? AND status = ? "
                              "ORDER BY started_at DESC, rowid DESC LIMIT 1",
                              (self.project_id, agent_id, ACT_FAILED))
        return activation_json(row) if row else None

    def start_tool_call(self, agent_id, activation_id, tool, input=None, now=None, call_key=None,
                        model_call_id=None):
        """docs/design/store.md start: running row, tool.called event, tool_call history row. A `call_key` the
        activation already used answers that call again (`replayed: True`) and records nothing."""
        if not isinstance(tool, str) or not tool:
            raise BadRequest("tool is required")
        input_value = {} if input is None else input
        with self.write(now) as tx:
            row = self.owned_activation(tx.conn, agent_id, activation_id)
            require_running(row, "tool")
            call_id = tx.id("tool")
            input_json = dump_json(input_value)
            inserted = tx.execute("INSERT INTO tool_calls (id, project, activation_id, agent_id, tool, input_json, "
                                  "status, output, error, created_at, completed_at, call_key) "
                                  "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, NULL, ?) "
                                  "ON CONFLICT (activation_id, call_key) DO NOTHING",
                                  (call_id, self.project_id, activation_id, agent_id, tool, input_json, TOOL_RUNNING,
                                   tx.ts, call_key)).rowcount
            if not inserted:
                return self._replayed_start(tx, activation_id, call_key, tool, input_json)
            self.add_event(tx, "tool.called", {"id": call_id, "activationId": activation_id, "agentId": agent_id,
                                            "tool": tool, "status": TOOL_RUNNING,
                                            "inputPreview": preview(input_value)})
            content = f"# Tool Call\nTool: {tool}\n\n" + json.dumps(input_value, indent=2, ensure_ascii=False)
            self.add_history(tx, agent_id, activation_id, "tool_call", "tool_call", content,
                                 {"toolCallId": call_id, "tool": tool, "status": TOOL_RUNNING},
                                 [{"type": "tool_call", "toolCallId": call_id, "toolName": tool,
                                   "inputJson": input_json,
                                   # the id the model gave the call: a later activation's history names it so
                                   **({"metadata": {"modelCallId": model_call_id}}
                                      if isinstance(model_call_id, str) and model_call_id else {})}])
        return {"toolCallId": call_id}

    def _replayed_start(self, tx, activation_id, call_key, tool, input_json):
        prior = tx.one("SELECT id, tool, input_json FROM tool_calls WHERE activation_id = ? AND call_key = ?",
                       (activation_id, call_key))
        if (prior["tool"], prior["input_json"]) != (tool, input_json):
            raise Conflict(f"callKey {call_key} was already used for another tool call")
        return {"toolCallId": prior["id"], "replayed": True}

    def record_tool_result(self, tx, agent_id, activation_id, tool_call_id, status, output=None, error=None):
        """docs/design/store.md finish: the row, its tool.<status> event and the tool_result history row.
        Returns (the final status, the tool's name, replayed). The same finish asked again (status,
        output and error as recorded: a runner retrying after a lost answer) changes and records nothing
        and says `replayed`; a different one overwrites the result (docs/design/store.md#rows-and-their-transitions)."""
        sources, target = TOOL_CALL_TRANSITIONS["complete" if status == TOOL_COMPLETED else "fail"]
        owned = "project = ? AND id = ? AND agent_id = ? AND activation_id = ?"
        key = (self.project_id, tool_call_id, agent_id, activation_id)
        cursor = tx.execute(f"UPDATE tool_calls SET status = ?, output = ?, error = ?, completed_at = ? "
                            f"WHERE {owned} AND status IN ({','.join('?' * len(sources))}) "
                            f"AND NOT (status = ? AND output IS ? AND error IS ?)",
                            (target, output, error, tx.ts, *key, *sources, target, output, error))
        if cursor.rowcount == 0:
            same = tx.one(f"SELECT tool FROM tool_calls WHERE {owned} AND status = ? AND output IS ? AND error IS ?",
                          (*key, target, output, error))
            if same is None:
                raise NotFound(f"Unknown tool call for activation: {tool_call_id}")
            return target, same["tool"], True
        tool = tx.one("SELECT tool FROM tool_calls WHERE id = ?", (tool_call_id,))["tool"]
        self.add_event(tx, f"tool.{target}", omit_none({"id": tool_call_id, "output": output, "error": error}))
        lines = [f"# Tool Result\nTool: {tool}\nStatus: {target}"]
        if error:
            lines.append(f"\nError: {error}")
        if output:
            lines.append(f"\n\n{output}")
        self.add_history(tx, agent_id, activation_id, "tool_result",
                         "tool_result" if target == TOOL_COMPLETED else "tool_error", "".join(lines),
                         {"toolCallId": tool_call_id, "tool": tool, "status": target},
                         [omit_none({"type": "tool_result", "toolCallId": tool_call_id,
                                     "toolName": tool, "output": output, "error": error})])
        return target, tool, False

    def boundary_delivery(self, tx, activation_id, tool_call_id):
        """The P1 signals delivered after this tool call's result (its `tool_boundary_signals` history
        row) as (text, signal ids), or None."""
        row = tx.one("SELECT content, metadata_json FROM agent_history_messages WHERE project = ? "
                     "AND activation_id = ? AND kind = 'tool_boundary_signals' "
                     "AND json_extract(metadata_json, '$.toolCallId') = ? ORDER BY sequence DESC LIMIT 1",
                     (self.project_id, activation_id, tool_call_id))
        if row is None:
            return None
        return row["content"], load_json(row["metadata_json"], {}).get("signalIds") or []

    def tool_call(self, tool_call_id):
        row = self._query_one("SELECT * FROM tool_calls WHERE project = ? AND id = ?",
                              (self.project_id, tool_call_id))
        if row is None:
            raise NotFound(f"Unknown tool call: {tool_call_id}")
        return dict(row)

    def list_tool_calls(self, limit=100, tools=None):
        """docs/http-api.md raw rows, newest first; optionally only the named tools."""
        sql, params = "SELECT * FROM tool_calls WHERE project = ?", [self.project_id]
        if tools:
            sql += f" AND tool IN ({','.join('?' * len(tools))})"
            params += list(tools)
        rows = self._query(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?", params + [int(limit)])
        return [tool_call_row_json(r) for r in rows]

    def tool_call_stats(self):
        """Per-tool counts and the newest row of each tool (docs/http-api.md), keyed by tool name."""
        stats = {}
        with self.snapshot() as conn:
            for r in conn.execute("SELECT tool, status, COUNT(*) AS n FROM tool_calls WHERE project = ? "
                                  "GROUP BY tool, status", (self.project_id,)):
                entry = stats.setdefault(r["tool"], {"callCount": 0, "runningCount": 0, "completedCount": 0,
                                                     "failedCount": 0})
                entry["callCount"] += r["n"]
                entry[f"{r['status']}Count"] += r["n"]
            for tool, entry in stats.items():
                last = conn.execute("SELECT * FROM tool_calls WHERE project = ? AND tool = ? "
                                    "ORDER BY created_at DESC, rowid DESC LIMIT 1",
                                    (self.project_id, tool)).fetchone()
                entry.update(omit_none({"lastStatus": last["status"], "lastAgentId": last["agent_id"],
                                        "lastAt": last["completed_at"] or last["created_at"],
                                        "lastError": truncate(last["error"], 600) or None}))
        return stats
