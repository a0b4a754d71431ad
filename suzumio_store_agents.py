"""The agents table: records, tokens, and each conditional status write with its event."""
import hmac

from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound
from suzumio_records import (
    ACT_FAILED,
    ACT_RUNNING,
    AGENT_FAILED,
    AGENT_QUIET,
    AGENT_RUNNING,
    AGENT_TRANSITIONS,
    agent_json,
    public_agent_json,
)


class AgentRows:
    """ProjectStore's AgentRows part: SQL over its tables, on the store's connections and write path."""

    def agent_row(self, agent_id, conn=None):
        with self._reading(conn) as reader:
            return reader.execute("SELECT * FROM agents WHERE project = ? AND id = ?",
                                  (self.project_id, agent_id)).fetchone()

    def require_agent(self, agent_id, conn=None):
        row = self.agent_row(agent_id, conn)
        if row is None:
            raise NotFound(f"Unknown agent: {agent_id}")
        return row

    def list_agents(self, include_tokens=False, conn=None):
        """Agent records ordered by id; tokens only when asked for (never for user listings)."""
        with self._reading(conn) as reader:
            rows = reader.execute("SELECT * FROM agents WHERE project = ? ORDER BY id", (self.project_id,)).fetchall()
        return [agent_json(r, include_tokens) for r in rows]

    def public_agents(self):
        """docs/http-api.md public agents ordered by id."""
        rows = self._query("SELECT * FROM agents WHERE project = ? ORDER BY id", (self.project_id,))
        return [public_agent_json(r) for r in rows]

    def agent(self, agent_id, include_token=False):
        """One agent record; NotFound `Unknown agent: <id>`."""
        return agent_json(self.require_agent(agent_id), include_token)

    def agent_ids(self):
        return [r["id"] for r in self._query("SELECT id FROM agents WHERE project = ? ORDER BY id",
                                             (self.project_id,))]

    def check_agent_token(self, agent_id, token):
        """Authenticate a runner call: the agent record, or NotFound / Forbidden."""
        row = self.require_agent(agent_id)
        if not isinstance(token, str) or not hmac.compare_digest(row["token"].encode(), token.encode()):
            raise Forbidden("Invalid agent token")
        return agent_json(row)

    def model_alive_agents(self):
        """Ids of agents that are running with a running bound activation (docs/design/store.md)."""
        rows = self._query("SELECT g.id FROM agents g JOIN activations a ON a.id = g.active_activation_id "
                           "WHERE g.project = ? AND g.status = ? AND a.status = ? ORDER BY g.id",
                           (self.project_id, AGENT_RUNNING, ACT_RUNNING))
        return [r["id"] for r in rows]

    def move_agent(self, tx, agent_id, trigger, *, active=None, bound_to=None, extra_where="",
                    extra_params=(), to=None, container_name=None):
        """One conditional agent status write plus its agent.status event; returns rowcount."""
        sources, target = AGENT_TRANSITIONS[trigger]
        target = to or target
        sets = "status = ?, active_activation_id = ?, updated_at = ?"
        params = [target, active, tx.ts]
        if container_name is not None:
            sets += ", container_name = ?"
            params.append(container_name)
        where = f"project = ? AND id = ? AND status IN ({','.join('?' * len(sources))})"
        params += [self.project_id, agent_id, *sources]
        if bound_to is not None:
            where += " AND active_activation_id = ?"
            params.append(bound_to)
        cursor = tx.execute(f"UPDATE agents SET {sets} WHERE {where}{extra_where}",
                            params + list(extra_params))
        if cursor.rowcount:
            self.add_event(tx, "agent.status", {"agentId": agent_id, "status": target,
                                             "activeActivationId": active})
        return cursor.rowcount

    def set_agent_status(self, agent_id, status, now=None):
        """Idle reset (docs/design/scheduler.md): a ready agent with no work becomes quiet."""
        _, target = AGENT_TRANSITIONS["idle_reset"]
        if status != target:
            raise BadRequest(f"Invalid agent status change: {status}")
        with self.write(now) as tx:
            row = self.require_agent(agent_id, tx.conn)
            if not self.move_agent(tx, agent_id, "idle_reset",
                                    extra_where=" AND active_activation_id IS NULL"):
                raise Conflict(f"Agent {agent_id} is {row['status']}; cannot become {status}")
        return self.agent(agent_id)

    def clear_stale_binding(self, agent_id, now=None):
        """A tick's first check (docs/design/scheduler.md): unbind an agent whose bound activation is not running.

        Returns the agent's new status, or None when the binding is live (nothing changes)."""
        with self.write(now) as tx:
            row = self.require_agent(agent_id, tx.conn)
            if row["status"] != AGENT_RUNNING and row["active_activation_id"] is None:
                return None
            act = None
            if row["active_activation_id"]:
                act = tx.one("SELECT status FROM activations WHERE project = ? AND id = ?",
                             (self.project_id, row["active_activation_id"]))
            if act is not None and act["status"] == ACT_RUNNING:
                return None
            target = AGENT_FAILED if act is not None and act["status"] == ACT_FAILED else AGENT_QUIET
            changed = self.move_agent(
                tx, agent_id, "stale_binding", to=target,
                extra_where=" AND active_activation_id IS ?", extra_params=(row["active_activation_id"],))
            return target if changed else None
