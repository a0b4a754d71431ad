"""The approvals table: approval requests, their decisions, expiry and grants, as rows. What a request
means and who may decide it is suzumio_approvals'."""

from suzumio_records import dump_json


class ApprovalRows:
    """ProjectStore's ApprovalRows part: SQL over the approvals table, on the store's connections and
    write path."""

    def approval_row(self, approval_id, conn=None):
        """One approval request row, or None."""
        with self._reading(conn) as reader:
            return reader.execute("SELECT * FROM approvals WHERE project = ? AND id = ?",
                                  (self.project_id, approval_id)).fetchone()

    def approval_rows(self, status=None, limit=200):
        """Pending requests (oldest first), then decided ones (newest first, at most `limit`); only those
        of `status` when given."""
        where, params = "project = ?", [self.project_id]
        if status is not None:
            where += " AND status = ?"
            params.append(status)
        with self.snapshot() as conn:
            pending = conn.execute(f"SELECT * FROM approvals WHERE {where} AND status = 'pending' "
                                   "ORDER BY created_at, rowid", params).fetchall()
            decided = conn.execute(f"SELECT * FROM approvals WHERE {where} AND status <> 'pending' "
                                   "ORDER BY decided_at DESC, rowid DESC LIMIT ?", [*params, int(limit)]).fetchall()
        return pending + decided

    def approval_grant(self, agent_id, rule_key):
        """The id of the first `allow-always` decision for this agent and rule, or None."""
        row = self._query_one("SELECT id FROM approvals WHERE project = ? AND agent_id = ? AND rule_key = ? "
                              "AND decision = 'allow-always' ORDER BY decided_at LIMIT 1",
                              (self.project_id, agent_id, rule_key))
        return row["id"] if row else None

    def insert_approval(self, tx, agent_id, activation_id, tool_call_id, tool, tool_input, rule, on_expiry,
                        expires_at):
        """One pending request for a gated tool call; returns its id. `rule` has `as_json()` and `key`."""
        approval_id = tx.id("apr")
        tx.execute("INSERT INTO approvals (id, project, agent_id, activation_id, tool_call_id, tool, input_json, "
                   "rule_json, rule_key, status, decision, decided_by, note, on_expiry, expires_at, created_at, "
                   "decided_at, used_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, NULL, NULL, ?, ?, ?, "
                   "NULL, NULL)",
                   (approval_id, self.project_id, agent_id, activation_id, tool_call_id, tool,
                    dump_json({} if tool_input is None else tool_input), dump_json(rule.as_json()), rule.key,
                    on_expiry, expires_at, tx.ts))
        return approval_id

    def approval_of_call(self, tx, tool_call_id):
        """(id, status, expires_at) of the request of one tool call, or None."""
        return tx.one("SELECT id, status, expires_at FROM approvals WHERE project = ? AND tool_call_id = ?",
                      (self.project_id, tool_call_id))

    def use_approval(self, tx, approval_id):
        """Mark a decided request used, once; returns whether this call did."""
        return bool(tx.execute("UPDATE approvals SET used_at = ? WHERE project = ? AND id = ? AND used_at IS NULL",
                               (tx.ts, self.project_id, approval_id)).rowcount)

    def unused_allowed_approval(self, tx, agent_id, activation_id, tool):
        """The oldest allowed request of this activation for the tool that no run has used yet, or None."""
        return tx.one("SELECT id FROM approvals WHERE project = ? AND activation_id = ? AND agent_id = ? AND tool = ? "
                      "AND status IN ('allowed', 'expired') AND decision IN ('allow', 'allow-always') "
                      "AND used_at IS NULL ORDER BY created_at, rowid LIMIT 1",
                      (self.project_id, activation_id, agent_id, tool))

    def decide_approval(self, tx, approval_id, status, decision, note, decided_by, edited_input=None, output=None):
        """pending -> `status` with the decision (and an edited input or an answer); returns whether the
        request was still pending."""
        return bool(tx.execute("UPDATE approvals SET status = ?, decision = ?, note = ?, decided_by = ?, "
                               "decided_at = ?, edited_input_json = ?, output = ? "
                               "WHERE project = ? AND id = ? AND status = 'pending'",
                               (status, decision, note, decided_by, tx.ts,
                                None if edited_input is None else dump_json(edited_input), output,
                                self.project_id, approval_id)).rowcount)

    def pending_approvals_of_rule(self, tx, agent_id, rule_key):
        """Ids of the agent's pending requests under one rule."""
        return [row["id"] for row in tx.all("SELECT id FROM approvals WHERE project = ? AND agent_id = ? "
                                            "AND rule_key = ? AND status = 'pending'",
                                            (self.project_id, agent_id, rule_key))]

    def has_due_approvals(self, ts):
        """Whether a pending request expired at or before `ts` (a read, no write lock)."""
        return self._query_one("SELECT 1 FROM approvals WHERE project = ? AND status = 'pending' "
                               "AND expires_at <= ? LIMIT 1", (self.project_id, ts)) is not None

    def expire_approvals(self, tx):
        """Every pending request past `expires_at` takes its decision on expiry; returns their rows."""
        rows = tx.all("SELECT * FROM approvals WHERE project = ? AND status = 'pending' AND expires_at <= ?",
                      (self.project_id, tx.ts))
        for row in rows:
            tx.execute("UPDATE approvals SET status = 'expired', decision = on_expiry, decided_by = 'timeout', "
                       "decided_at = ? WHERE project = ? AND id = ? AND status = 'pending'",
                       (tx.ts, self.project_id, row["id"]))
        return rows

    def cancel_pending_approvals(self, tx, activation_id, reason):
        """The activation's pending requests -> cancelled by `system`; returns (id, agent_id, tool) rows."""
        rows = tx.all("SELECT id, agent_id, tool FROM approvals WHERE project = ? AND activation_id = ? "
                      "AND status = 'pending'", (self.project_id, activation_id))
        if rows:
            tx.execute("UPDATE approvals SET status = 'cancelled', decided_by = 'system', note = ?, decided_at = ? "
                       "WHERE project = ? AND activation_id = ? AND status = 'pending'",
                       (reason, tx.ts, self.project_id, activation_id))
        return rows

    def pending_approval_count(self):
        return self._query_one("SELECT COUNT(*) FROM approvals WHERE project = ? AND status = 'pending'",
                               (self.project_id,))[0]
