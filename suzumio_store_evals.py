"""Rows of evals (docs/evals.md): one SQLite file under the runtime root, `<root>/evals.sqlite3`, holding
each eval (its suite, options and status) and each of its runs (the project it ran as, its grades, its
usage). The connection settings and migrations follow suzumio_store's; the rules (what a run is, when it
is graded) are suzumio_eval_runner's."""
import threading
from contextlib import contextmanager

import suzumio_store
from suzumio_errors import Conflict, NotFound
from suzumio_records import dump_json, format_ts, load_json, new_id, to_datetime

EVALS_DB = "evals.sqlite3"

EVAL_RUNNING = "running"
EVAL_DONE = "done"
EVAL_STATUSES = (EVAL_RUNNING, EVAL_DONE)

RUN_PENDING = "pending"
RUN_RUNNING = "running"
RUN_GRADED = "graded"
RUN_STATUSES = (RUN_PENDING, RUN_RUNNING, RUN_GRADED)
RUN_TRANSITIONS = {RUN_RUNNING: (RUN_PENDING,), RUN_GRADED: (RUN_RUNNING,)}

MIGRATIONS = [
    (1, "evals and their runs", [
        """CREATE TABLE evals (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, mode TEXT NOT NULL, suite_json TEXT NOT NULL,
            options_json TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('running', 'done')),
            created_at TEXT NOT NULL, finished_at TEXT)""",
        """CREATE TABLE eval_runs (
            id TEXT PRIMARY KEY, eval_id TEXT NOT NULL REFERENCES evals(id), task TEXT NOT NULL,
            variant TEXT NOT NULL, run_index INTEGER NOT NULL, project TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'graded')), passed INTEGER,
            grades_json TEXT NOT NULL DEFAULT '[]', usage_json TEXT NOT NULL DEFAULT '{}', divergence_json TEXT,
            error TEXT, started_at TEXT, graded_at TEXT)""",
        "CREATE UNIQUE INDEX idx_eval_runs_place ON eval_runs (eval_id, task, variant, run_index)",
        # A judge's exchange with its model, kept with the rubric, the verdict and its reasons.
        """CREATE TABLE eval_judgements (
            id TEXT PRIMARY KEY, run_id TEXT NOT NULL REFERENCES eval_runs(id), grader_index INTEGER NOT NULL,
            preset TEXT NOT NULL, rubric TEXT NOT NULL, request_json TEXT NOT NULL, answer TEXT,
            usage_json TEXT NOT NULL, score REAL, reasons TEXT, created_at TEXT NOT NULL)""",
    ]),
]


def eval_json(row):
    return {"id": row["id"], "name": row["name"], "mode": row["mode"], "suite": load_json(row["suite_json"], {}),
            "options": load_json(row["options_json"], {}), "status": row["status"],
            "createdAt": row["created_at"], "finishedAt": row["finished_at"]}


def run_json(row):
    usage = load_json(row["usage_json"], {})
    return {"id": row["id"], "evalId": row["eval_id"], "task": row["task"], "variant": row["variant"],
            "index": row["run_index"], "project": row["project"], "status": row["status"],
            "passed": None if row["passed"] is None else bool(row["passed"]),
            "grades": load_json(row["grades_json"], []), "tokens": usage.get("tokens"),
            "costUsd": usage.get("costUsd"), "activations": usage.get("activations"),
            "wallMs": usage.get("wallMs"), "agents": usage.get("agents", {}),
            "divergence": load_json(row["divergence_json"], None) if row["divergence_json"] else None,
            "error": row["error"], "startedAt": row["started_at"], "gradedAt": row["graded_at"]}


class EvalStore:
    """The evals database of one root: one writer connection behind a lock, reads on their own."""

    def __init__(self, root_path):
        self.path = root_path / EVALS_DB
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = suzumio_store._connect(self.path)
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._migrate()

    def close(self):
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _migrate(self):
        self._conn.execute("CREATE TABLE IF NOT EXISTS _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                           " applied_at TEXT NOT NULL)")
        for number, name, statements in MIGRATIONS:
            with self.write() as (conn, now):
                if conn.execute("SELECT 1 FROM _migrations WHERE id = ?", (number,)).fetchone():
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO _migrations (id, name, applied_at) VALUES (?, ?, ?)", (number, name, now))

    @contextmanager
    def write(self, now=None):
        """The one write path: lock, BEGIN IMMEDIATE, commit or roll back; yields (connection, timestamp)."""
        with self._lock:
            if self._conn is None:
                raise Conflict("The evals database is closed")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn, format_ts(to_datetime(now))
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _all(self, sql, params=()):
        with self._lock:
            if self._conn is None:
                raise Conflict("The evals database is closed")
            return self._conn.execute(sql, params).fetchall()

    # -- evals

    def create_eval(self, name, mode, suite, options, runs, now=None):
        """A new eval with its runs, all pending: `runs` is [(task, variant, index, project)]."""
        eval_id = new_id("eval", now)
        with self.write(now) as (conn, ts):
            conn.execute("INSERT INTO evals (id, name, mode, suite_json, options_json, status, created_at) "
                         "VALUES (?, ?, ?, ?, ?, 'running', ?)",
                         (eval_id, name, mode, dump_json(suite), dump_json(options), ts))
            for task, variant, index, project in runs:
                conn.execute("INSERT INTO eval_runs (id, eval_id, task, variant, run_index, project, status) "
                             "VALUES (?, ?, ?, ?, ?, ?, 'pending')",
                             (new_id("evrun", now), eval_id, task, variant, index, project.format(eval=eval_id)))
        return eval_id

    def get_eval(self, eval_id):
        rows = self._all("SELECT * FROM evals WHERE id = ?", (eval_id,))
        if not rows:
            raise NotFound(f"Eval not found: {eval_id}")
        return eval_json(rows[0])

    def list_evals(self):
        return [eval_json(row) for row in self._all("SELECT * FROM evals ORDER BY created_at, id")]

    def running_evals(self):
        return [eval_json(row) for row in self._all(
            "SELECT * FROM evals WHERE status = 'running' ORDER BY created_at, id")]

    def finish_eval(self, eval_id, now=None):
        with self.write(now) as (conn, ts):
            return conn.execute("UPDATE evals SET status = 'done', finished_at = ? WHERE id = ? AND status = 'running'",
                                (ts, eval_id)).rowcount == 1

    # -- runs

    def runs(self, eval_id):
        return [run_json(row) for row in self._all(
            "SELECT * FROM eval_runs WHERE eval_id = ? ORDER BY task, variant, run_index", (eval_id,))]

    def start_run(self, run_id, now=None):
        """pending → running; a Conflict when another tick took it."""
        with self.write(now) as (conn, ts):
            changed = conn.execute("UPDATE eval_runs SET status = 'running', started_at = ? "
                                   "WHERE id = ? AND status = 'pending'", (ts, run_id)).rowcount
        if changed != 1:
            raise Conflict(f"Eval run {run_id} is not pending")

    def grade_run(self, run_id, passed, grades, usage, divergence=None, error=None, now=None):
        """running → graded with its verdict, each grader's grade and the run's usage."""
        with self.write(now) as (conn, ts):
            changed = conn.execute(
                "UPDATE eval_runs SET status = 'graded', passed = ?, grades_json = ?, usage_json = ?, "
                "divergence_json = ?, error = ?, graded_at = ? WHERE id = ? AND status = 'running'",
                (int(bool(passed)), dump_json(grades), dump_json(usage),
                 None if divergence is None else dump_json(divergence), error, ts, run_id)).rowcount
        if changed != 1:
            raise Conflict(f"Eval run {run_id} is not running")

    # -- judgements

    def record_judgement(self, run_id, grader_index, preset, rubric, request, answer, usage, score, reasons,
                         now=None):
        with self.write(now) as (conn, ts):
            conn.execute("INSERT INTO eval_judgements (id, run_id, grader_index, preset, rubric, request_json, "
                         "answer, usage_json, score, reasons, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (new_id("judge", now), run_id, grader_index, preset, rubric, dump_json(request), answer,
                          dump_json(usage or {}), score, reasons, ts))

    def judgements(self, run_id):
        return [{"graderIndex": row["grader_index"], "preset": row["preset"], "rubric": row["rubric"],
                 "request": load_json(row["request_json"], {}), "answer": row["answer"],
                 "usage": load_json(row["usage_json"], {}), "score": row["score"], "reasons": row["reasons"]}
                for row in self._all("SELECT * FROM eval_judgements WHERE run_id = ? ORDER BY grader_index, "
                                     "created_at", (run_id,))]
