"""The team repository's rows (docs/teams-that-write-code.md): merge requests, path claims and each
activation's commit range. What they mean (who lands, who is told) is suzumio_repository's."""

from suzumio_records import dump_json, load_json, omit_none

MERGE_QUEUED = "queued"
MERGE_RUNNING = "running"
MERGE_MERGED = "merged"
MERGE_FAILED = "failed"
MERGE_WAITING = (MERGE_QUEUED, MERGE_RUNNING)
MERGE_STATUSES = (MERGE_QUEUED, MERGE_RUNNING, MERGE_MERGED, MERGE_FAILED)


def merge_request_json(row):
    """docs/http-api.md merge request."""
    return omit_none({
        "id": row["id"], "agent": row["agent_id"], "activationId": row["activation_id"], "message": row["message"],
        "head": row["head"], "status": row["status"], "commit": row["commit_id"], "reason": row["reason"],
        "paths": load_json(row["paths_json"]), "output": row["output"], "createdAt": row["created_at"],
        "finishedAt": row["finished_at"]})


def claim_json(row):
    return omit_none({"id": row["id"], "agent": row["agent_id"], "path": row["path"], "reason": row["reason"],
                      "createdAt": row["created_at"], "expiresAt": row["expires_at"]})


class RepositoryRows:
    """ProjectStore's RepositoryRows part: SQL over merge_requests, claims and the activations' commit
    columns, on the store's connections and write path."""

    # -- the activations' commit range

    def set_commit_start(self, activation_id, commit):
        with self.write() as tx:
            tx.execute("UPDATE activations SET commit_start = ? WHERE project = ? AND id = ?",
                       (commit, self.project_id, activation_id))

    def set_commit_end(self, tx, activation_id, commit):
        """Record an activation's end commit once; returns whether this call did."""
        return bool(tx.execute("UPDATE activations SET commit_end = ? WHERE project = ? AND id = ? "
                               "AND commit_end IS NULL", (commit, self.project_id, activation_id)).rowcount)

    def set_repository_refs(self, tx, activation_id, refs):
        """Every branch of the project's repository as an activation's end found them, once."""
        tx.execute("UPDATE activations SET repository_refs_json = ? WHERE project = ? AND id = ? "
                   "AND repository_refs_json IS NULL", (dump_json(refs), self.project_id, activation_id))

    def repository_refs(self, activation_id):
        row = self._query_one("SELECT repository_refs_json FROM activations WHERE project = ? AND id = ?",
                              (self.project_id, activation_id))
        return load_json(row["repository_refs_json"]) if row else None

    def commit_range(self, activation_id):
        """(commit_start, commit_end) of an activation, each None when not recorded."""
        row = self._query_one("SELECT commit_start, commit_end FROM activations WHERE project = ? AND id = ?",
                              (self.project_id, activation_id))
        return (row["commit_start"], row["commit_end"]) if row else (None, None)

    # -- merge requests

    def insert_merge_request(self, tx, agent_id, activation_id, message, head):
        request_id = tx.id("mr")
        tx.execute("INSERT INTO merge_requests (id, project, agent_id, activation_id, message, head, status, "
                   "created_at) VALUES (?, ?, ?, ?, ?, ?, 'queued', ?)",
                   (request_id, self.project_id, agent_id, activation_id, message, head, tx.ts))
        return request_id

    def merge_request(self, request_id):
        row = self._query_one("SELECT * FROM merge_requests WHERE project = ? AND id = ?",
                              (self.project_id, request_id))
        return merge_request_json(row) if row else None

    def merge_requests(self, limit=50, waiting_only=False):
        """Waiting requests in queue order, then (unless `waiting_only`) the newest finished ones."""
        with self.snapshot() as conn:
            waiting = conn.execute("SELECT * FROM merge_requests WHERE project = ? AND status IN ('queued', "
                                   "'running') ORDER BY created_at, rowid", (self.project_id,)).fetchall()
            done = [] if waiting_only else conn.execute(
                "SELECT * FROM merge_requests WHERE project = ? AND status IN ('merged', 'failed') "
                "ORDER BY finished_at DESC, rowid DESC LIMIT ?", (self.project_id, int(limit))).fetchall()
        return [merge_request_json(row) for row in waiting + done]

    def start_merge_request(self, request_id):
        """queued → running, once; a running one (a controller stopped while landing it) stays running."""
        with self.write() as tx:
            return bool(tx.execute("UPDATE merge_requests SET status = 'running' WHERE project = ? AND id = ? "
                                   "AND status IN ('queued', 'running')", (self.project_id, request_id)).rowcount)

    def set_merge_candidate(self, request_id, commit):
        """The commit a running request will move the integration branch to, written before it does."""
        with self.write() as tx:
            tx.execute("UPDATE merge_requests SET commit_id = ? WHERE project = ? AND id = ? AND status = 'running'",
                       (commit, self.project_id, request_id))

    def finish_merge_request(self, tx, request_id, status, commit=None, reason=None, paths=None, output=None):
        return bool(tx.execute(
            "UPDATE merge_requests SET status = ?, commit_id = ?, reason = ?, paths_json = ?, output = ?, "
            "finished_at = ? WHERE project = ? AND id = ? AND status = 'running'",
            (status, commit, reason, None if paths is None else dump_json(paths), output, tx.ts, self.project_id,
             request_id)).rowcount)

    def requeue_merge_request(self, request_id):
        with self.write() as tx:
            tx.execute("UPDATE merge_requests SET status = 'queued', commit_id = NULL WHERE project = ? AND id = ? "
                       "AND status = 'running'", (self.project_id, request_id))

    def last_landed_head(self, agent_id):
        """The branch head of the agent's newest merged request, or None."""
        row = self._query_one("SELECT head FROM merge_requests WHERE project = ? AND agent_id = ? AND "
                              "status = 'merged' ORDER BY finished_at DESC, rowid DESC LIMIT 1",
                              (self.project_id, agent_id))
        return row["head"] if row else None

    # -- claims

    def active_claims(self, now_text):
        rows = self._query("SELECT * FROM claims WHERE project = ? AND released_at IS NULL AND expires_at > ? "
                           "ORDER BY created_at, rowid", (self.project_id, now_text))
        return [claim_json(row) for row in rows]

    def insert_claim(self, tx, agent_id, path, reason, expires_at):
        claim_id = tx.id("clm")
        tx.execute("INSERT INTO claims (id, project, agent_id, path, reason, created_at, expires_at) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)", (claim_id, self.project_id, agent_id, path, reason, tx.ts,
                                                    expires_at))
        return claim_id

    def release_claims(self, tx, agent_id, paths=None):
        """End the agent's open claims (only those on `paths` when given); returns the paths released."""
        rows = tx.execute("SELECT id, path FROM claims WHERE project = ? AND agent_id = ? AND released_at IS NULL",
                          (self.project_id, agent_id)).fetchall()
        ended = [row for row in rows if paths is None or row["path"] in paths]
        for row in ended:
            tx.execute("UPDATE claims SET released_at = ? WHERE project = ? AND id = ?",
                       (tx.ts, self.project_id, row["id"]))
        return [row["path"] for row in ended]


# Every merge request a `repo.merge` queued and how it ended; the path claims of `repo.claim`; the commit
# an activation started from and the one its end recorded, and every branch of the project's repository
# as its end found them (what a fork at it starts from). A request's `commit_id` is written before the
# integration branch moves, so a controller stopped in between finds the landing done.
MIGRATION_REPOSITORY = [
    "ALTER TABLE activations ADD COLUMN commit_start TEXT",
    "ALTER TABLE activations ADD COLUMN commit_end TEXT",
    "ALTER TABLE activations ADD COLUMN repository_refs_json TEXT",
    """CREATE TABLE merge_requests (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT,
        message TEXT NOT NULL, head TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'merged', 'failed')),
        commit_id TEXT, reason TEXT CHECK (reason IN ('conflict', 'checks')), paths_json TEXT, output TEXT,
        created_at TEXT NOT NULL, finished_at TEXT)""",
    "CREATE INDEX idx_merge_requests_project_status ON merge_requests (project, status, created_at)",
    """CREATE TABLE claims (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, path TEXT NOT NULL,
        reason TEXT NOT NULL, created_at TEXT NOT NULL, expires_at TEXT NOT NULL, released_at TEXT)""",
    "CREATE INDEX idx_claims_project_open ON claims (project, released_at, expires_at)",
]
