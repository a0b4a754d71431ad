"""The model_calls table and the read models over it: the budget window, costs and spend (with the cached
prompt tokens apart: `cachedTokens` read from a provider's prompt cache, `cacheWriteTokens` written to it)."""

from suzumio_records import (
    KIND_BUDGET_WARNING,
    PROJECT_RUNNING,
    dump_json,
    load_json,
    usage_tokens,
)


class UsageRows:
    """ProjectStore's UsageRows part: SQL over its tables, on the store's connections and write path."""

    def window_usage(self, conn=None):
        """(tokens, USD) the controller saw providers report for activations that completed, failed or were
        cancelled since the project was last set running (or since init): the budget's window. Event
        rowids order the window exactly; what a runner reports about itself is not counted."""
        with self._reading(conn) as conn:
            tokens, cost = conn.execute(
                "SELECT COALESCE(SUM(m.tokens), 0), COALESCE(SUM(m.cost_usd), 0) FROM events e "
                "JOIN model_calls m ON m.project = e.project "
                "AND m.activation_id = json_extract(e.data_json, '$.activationId') "
                "WHERE e.project = ? AND e.rowid > ? "
                "AND e.type IN ('activation.completed', 'activation.failed', 'activation.cancelled')",
                (self.project_id, self._window_start(conn))).fetchone()
            return tokens, cost

    def window_tokens(self, conn=None):
        """The tokens of the budget's window (window_usage)."""
        return self.window_usage(conn)[0]

    def record_model_call(self, activation_id, agent_id, provider_id, preset_id, status, usage, now=None,
                          cost_usd=None):
        """One forwarded model request, the usage the provider reported in its answer and its cost."""
        usage = usage if isinstance(usage, dict) else {}
        with self.write(now) as tx:
            self.owned_activation(tx.conn, agent_id, activation_id)
            tx.execute("INSERT INTO model_calls (id, project, activation_id, agent_id, provider_id, preset_id, "
                       "status, tokens, usage_json, created_at, cost_usd, cached_tokens, cache_write_tokens) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (tx.id("mcall"), self.project_id, activation_id, agent_id, provider_id, preset_id,
                        int(status), usage_tokens({"tokens": usage}), dump_json(usage), tx.ts, cost_usd,
                        _count(usage.get("cacheRead")), _count(usage.get("cacheWrite"))))

    def model_usage(self, activation_id):
        """The controller-observed usage of one activation: its model calls, their summed tokens and cost
        (`costUsd`, present when a preset has prices)."""
        rows = self._query("SELECT usage_json, cost_usd FROM model_calls WHERE project = ? AND activation_id = ? "
                           "ORDER BY rowid", (self.project_id, activation_id))
        tokens = {}
        for row in rows:
            for field, value in load_json(row["usage_json"], {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    tokens[field] = tokens.get(field, 0) + value
        usage = {"calls": len(rows), "tokens": tokens}
        costs = [row["cost_usd"] for row in rows if row["cost_usd"] is not None]
        if costs:
            usage["costUsd"] = round(sum(costs), 10)
        return usage

    def model_costs(self):
        """Controller-observed tokens and cost per activation, per agent and for the project:
        {"project": {...}, "agents": {id: {...}}, "activations": {id: {...}}}, each {"calls", "tokens",
        "cachedTokens", "cacheWriteTokens", "costUsd"} (costUsd null when no call was priced; `tokens`
        counts the cached ones too)."""
        rows = self._query("SELECT activation_id, agent_id, COUNT(*) AS calls, SUM(tokens) AS tokens, "
                           "SUM(cached_tokens) AS cached, SUM(cache_write_tokens) AS written, "
                           "SUM(cost_usd) AS cost FROM model_calls WHERE project = ? "
                           "GROUP BY activation_id, agent_id", (self.project_id,))
        out = {"project": _spend(), "agents": {}, "activations": {}}

        def add(total, row):
            total["calls"] += row["calls"]
            total["tokens"] += row["tokens"] or 0
            total["cachedTokens"] += row["cached"] or 0
            total["cacheWriteTokens"] += row["written"] or 0
            if row["cost"] is not None:
                total["costUsd"] = round((total["costUsd"] or 0) + row["cost"], 10)

        for row in rows:
            add(out["project"], row)
            add(out["agents"].setdefault(row["agent_id"], _spend()), row)
            add(out["activations"].setdefault(row["activation_id"], _spend()), row)
        return out

    def egress_totals(self):
        """Per agent id: {"connections", "denied", "bytesIn", "bytesOut"} over the project's
        egress.allowed and egress.denied events (docs/operations.md#egress)."""
        rows = self._query("SELECT json_extract(data_json, '$.agent') AS agent, type, COUNT(*) AS n, "
                           "COALESCE(SUM(json_extract(data_json, '$.bytesIn')), 0) AS bytes_in, "
                           "COALESCE(SUM(json_extract(data_json, '$.bytesOut')), 0) AS bytes_out FROM events "
                           "WHERE project = ? AND type IN ('egress.allowed', 'egress.denied') GROUP BY agent, type",
                           (self.project_id,))
        out = {}
        for row in rows:
            total = out.setdefault(row["agent"], {"connections": 0, "denied": 0, "bytesIn": 0, "bytesOut": 0})
            total["connections" if row["type"] == "egress.allowed" else "denied"] += row["n"]
            total["bytesIn"] += row["bytes_in"]
            total["bytesOut"] += row["bytes_out"]
        return out

    def project_spend(self):
        """({"calls", "tokens", "cachedTokens", "costUsd"} over every model call of the project, the same
        per agent id) for the project summaries the control room lists; costUsd None when none was priced."""
        rows = self._query("SELECT agent_id, COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens, "
                           "COALESCE(SUM(cached_tokens), 0) AS cached, SUM(cost_usd) AS cost FROM model_calls "
                           "WHERE project = ? GROUP BY agent_id ORDER BY agent_id", (self.project_id,))
        agents = {row["agent_id"]: {"calls": row["calls"], "tokens": row["tokens"], "cachedTokens": row["cached"],
                                    "costUsd": None if row["cost"] is None else round(row["cost"], 10)}
                  for row in rows}
        costs = [spend["costUsd"] for spend in agents.values() if spend["costUsd"] is not None]
        total = {"calls": sum(spend["calls"] for spend in agents.values()),
                 "tokens": sum(spend["tokens"] for spend in agents.values()),
                 "cachedTokens": sum(spend["cachedTokens"] for spend in agents.values()),
                 "costUsd": round(sum(costs), 10) if costs else None}
        return total, agents

    def budget_warned(self, conn=None):
        """Whether this budget window already has its `project.budget_warning` event."""
        with self._reading(conn) as conn:
            return conn.execute("SELECT 1 FROM events WHERE project = ? AND type = ? AND rowid > ?",
                                (self.project_id, KIND_BUDGET_WARNING, self._window_start(conn))).fetchone() is not None

    def _window_start(self, conn):
        row = conn.execute(
            "SELECT rowid FROM events WHERE project = ? AND type = 'project.status' "
            "AND json_extract(data_json, '$.status') = ? ORDER BY rowid DESC LIMIT 1",
            (self.project_id, PROJECT_RUNNING)).fetchone()
        return row[0] if row else 0


def _spend():
    return {"calls": 0, "tokens": 0, "cachedTokens": 0, "cacheWriteTokens": 0, "costUsd": None}


def _count(value):
    """A token count of a usage field as stored: a non-negative whole number, 0 when absent."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    return max(0, int(value)) if ok else 0
