"""The rows the loop guards and the concurrency caps read and write (docs/operations.md#runaways): an
agent's recent tool calls and the messages of a pair of agents since a time, when something new last
reached an agent, the `paused_json` and `guards_since` columns of an agent, and the agents that have a
ready signal but no activation. Only SQL: the rules are suzumio_guards'."""
from suzumio_records import NUDGE_KINDS, SIGNAL_DELIVERED, dump_json, load_json


def recent_tool_calls(store, agent_id, since, limit):
    """The agent's newest `limit` tool calls (newest first) created after `since` (all when None), as
    (tool, input) pairs."""
    where, params = "project = ? AND agent_id = ?", [store.project_id, agent_id]
    if since is not None:
        where += " AND created_at > ?"
        params.append(since)
    rows = store.db_all(f"SELECT tool, input_json FROM tool_calls WHERE {where} ORDER BY rowid DESC LIMIT ?",
                        [*params, int(limit)])
    return [(row["tool"], load_json(row["input_json"], {})) for row in rows]


def pair_message_time(store, a, b, since, nth):
    """When the `nth` newest direct message between agents `a` and `b` (either way) created after `since`
    (all when None) was created, or None when there are fewer."""
    where = "project = ? AND ((sender = ? AND recipient = ?) OR (sender = ? AND recipient = ?))"
    params = [store.project_id, a, b, b, a]
    if since is not None:
        where += " AND created_at > ?"
        params.append(since)
    row = store.db_get(f"SELECT created_at FROM messages WHERE {where} ORDER BY created_at DESC, rowid DESC "
                       "LIMIT 1 OFFSET ?", [*params, int(nth) - 1])
    return row["created_at"] if row else None


def news_delivered_at(store, agent_id):
    """When the newest signal that brought the agent something new (suzumio_records.is_news: not a nudge, not
    its own) was delivered to it, or None."""
    kinds = ", ".join("?" * len(NUDGE_KINDS))
    row = store.db_get(f"SELECT MAX(delivered_at) AS at FROM signals WHERE project = ? AND target_agent = ? "
                       f"AND status = ? AND kind NOT IN ({kinds}) AND (source_agent IS NULL OR source_agent <> ?)",
                       [store.project_id, agent_id, SIGNAL_DELIVERED, *NUDGE_KINDS, agent_id])
    return row["at"] if row else None


def guards_since(store, agent_id):
    row = store.db_get("SELECT guards_since FROM agents WHERE project = ? AND id = ?", (store.project_id, agent_id))
    return row["guards_since"] if row else None


def set_paused(tx, store, agent_id, paused):
    """Record the guard that paused the agent; False when it was already paused."""
    return tx.execute("UPDATE agents SET paused_json = ?, updated_at = ? WHERE project = ? AND id = ? "
                      "AND paused_json IS NULL",
                      (dump_json(paused), tx.ts, store.project_id, agent_id)).rowcount == 1


def clear_paused(tx, store, agent_id):
    """Resume: no pause, and the guards count afresh from now. Returns the pause record it cleared, or None
    when the agent was not paused."""
    row = tx.one("SELECT paused_json FROM agents WHERE project = ? AND id = ?", (store.project_id, agent_id))
    if row is None or row["paused_json"] is None:
        return None
    tx.execute("UPDATE agents SET paused_json = NULL, guards_since = ?, updated_at = ? WHERE project = ? "
               "AND id = ? AND paused_json IS NOT NULL", (tx.ts, tx.ts, store.project_id, agent_id))
    return load_json(row["paused_json"], {})


def paused_agents(store):
    """{agent id: pause record} of the agents a guard paused."""
    rows = store.db_all("SELECT id, paused_json FROM agents WHERE project = ? AND paused_json IS NOT NULL",
                        (store.project_id,))
    return {row["id"]: load_json(row["paused_json"], {}) for row in rows}


def ready_without_activation(store, now_ts):
    """Agents with a ready pending signal and no running activation: (agent id, signal count, the oldest
    signal's created_at), oldest first."""
    rows = store.db_all(
        "SELECT s.target_agent AS agent_id, COUNT(*) AS n, MIN(s.created_at) AS since FROM signals s "
        "JOIN agents a ON a.project = s.project AND a.id = s.target_agent "
        "WHERE s.project = ? AND s.status = 'pending' AND (s.not_before IS NULL OR s.not_before <= ?) "
        "AND a.active_activation_id IS NULL AND a.status <> 'stopped' GROUP BY s.target_agent ORDER BY since",
        (store.project_id, now_ts))
    return [(row["agent_id"], row["n"], row["since"]) for row in rows]
