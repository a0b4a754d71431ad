"""Durable store, core: the runtime root layout, and one ProjectStore per project SQLite file with its
connections, the one `write()` path and the migrations (docs/design/store.md). The store layer is this
file and the suzumio_store_<part>.py files whose row gateways ProjectStore is composed of; every SQL
statement lives in them. The rules that decide what the writes mean are suzumio_coordination's."""
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from suzumio_errors import BadRequest, Conflict, NotFound
from suzumio_live import LiveEvents  # The ephemeral model deltas of the SSE stream
from suzumio_records import format_ts, new_id, require_running, to_datetime, valid_project_name
from suzumio_store_activations import ActivationRows
from suzumio_store_agents import AgentRows
from suzumio_store_approvals import ApprovalRows
from suzumio_store_effects import MIGRATION_EFFECTS, EffectRows
from suzumio_store_history import HistoryRows
from suzumio_store_project import ProjectRows
from suzumio_store_recorder import MIGRATION_RECORDER, RecorderRows
from suzumio_store_repository import MIGRATION_REPOSITORY, RepositoryRows
from suzumio_store_signals import SignalRows
from suzumio_store_timeline import TimelineReads
from suzumio_store_usage import UsageRows

__all__ = ["ProjectStore", "Root", "require_running", "resolve_root"]

log = logging.getLogger(__name__)

DB_FILE = "suzumio.sqlite"
# Beside the projects in the root: the runner socket's directory (mounted into every container, so it
# holds nothing else) and the user API token (mode 0600, never mounted). No project may take these names.
RUN_DIR = "run"
API_TOKEN_FILE = "api-token"
SERVE_LOCK_FILE = "serve.lock"  # one serve per root (suzumio_runtime.ServeLock)
BUSY_TIMEOUT_S = 5
# Descriptor bounds (each connection holds the database and its WAL; a project adds its -shm once).
IDLE_READERS = 2  # pooled reader connections kept per project; a burst beyond it closes its extras
MAX_OPEN_PROJECTS = 64  # projects whose connections stay open; the least recently used are released

# ---------------------------------------------------------------------------------------------
# Runtime root.

def resolve_root(explicit=None, env=None):
    """--root, else SUZUMIO_ROOT (even empty), else ~/.suzumio; made absolute (docs/cli.md)."""
    env = os.environ if env is None else env
    if explicit is not None:
        value = explicit
    elif "SUZUMIO_ROOT" in env:
        value = env["SUZUMIO_ROOT"]
    else:
        value = str(Path.home() / ".suzumio")
    return Path(os.path.abspath(value or os.curdir))



def _connect(path, must_exist=False):
    """Open a connection with every setting the store relies on (docs/design/README.md, SQLite)."""
    target = f"file:{path}?mode=rw" if must_exist else str(path)
    conn = sqlite3.connect(target, uri=must_exist, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                           check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
    # FULL: in WAL mode every COMMIT syncs the log, so a committed write survives a power cut too
    # (NORMAL keeps it only across a crash of the process). Its cost: BENCHMARKS.md#durable-commits.
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def _is_file(path):
    """Path.is_file, except that a name the OS refuses (too long, for example) is no file either."""
    try:
        return path.is_file()
    except OSError:
        return False


def _has_project_row(db_path, name):
    """Whether an existing database file holds the project row; never creates a file."""
    if not _is_file(db_path):
        return False
    conn = _connect(db_path, must_exist=True)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='projects'").fetchone():
            return False
        return conn.execute("SELECT 1 FROM projects WHERE id = ?", (name,)).fetchone() is not None
    finally:
        conn.close()


class Changes:
    """Which projects committed writes in this process: a version per project that each commit bumps,
    so SSE streams and the scheduler can wait for a change instead of polling the database. Writes by
    other processes (a CLI command beside `serve`) are not seen here; readers keep a slow safety poll.

    Commits made inside `quiet()` (the scheduler thread's own ticks) bump the version but not the
    `foreign` count the scheduler waits on: otherwise every tick that writes would ask for another."""

    def __init__(self):
        self._cond = threading.Condition()
        self._versions = {}
        self._foreign = {}
        self._foreign_total = 0
        self._local = threading.local()
        self._listeners = ()

    def committed(self, project_id):
        with self._cond:
            self._versions[project_id] = self._versions.get(project_id, 0) + 1
            if not getattr(self._local, "quiet", False):
                self._foreign[project_id] = self._foreign.get(project_id, 0) + 1
                self._foreign_total += 1
            self._cond.notify_all()
            listeners = self._listeners
        for listener in listeners:
            listener(project_id)

    def listen(self, callback):
        """Call `callback(project_id)` after every commit (quiet ones too), in the committing thread: it
        must be quick and must not write (the SSE hub marks the project and wakes its thread)."""
        with self._cond:
            self._listeners = (*self._listeners, callback)

    def unlisten(self, callback):
        with self._cond:
            self._listeners = tuple(listener for listener in self._listeners if listener != callback)

    @contextmanager
    def quiet(self):
        self._local.quiet = True
        try:
            yield
        finally:
            self._local.quiet = False

    def version(self, project_id):
        with self._cond:
            return self._versions.get(project_id, 0)

    def foreign(self, project_id):
        """How many commits of the project were made outside quiet()."""
        with self._cond:
            return self._foreign.get(project_id, 0)

    def wait(self, project_id, seen, timeout):
        """Wait until the project's version differs from `seen` or `timeout` seconds pass; the version."""
        with self._cond:
            self._cond.wait_for(lambda: self._versions.get(project_id, 0) != seen, timeout)
            return self._versions.get(project_id, 0)

    def wait_foreign(self, seen_total, timeout, stop=None):
        """Wait until any project has a commit made outside quiet() after `seen_total` of them, `stop`
        (an Event, with wake()) is set, or `timeout` seconds pass; returns the total."""
        with self._cond:
            self._cond.wait_for(lambda: self._foreign_total != seen_total or (stop is not None and stop.is_set()),
                                timeout)
            return self._foreign_total

    def wake(self):
        """Wake every waiter to look at its stop event."""
        with self._cond:
            self._cond.notify_all()

    def foreign_total(self):
        with self._cond:
            return self._foreign_total


class Root:
    """A Suzumio runtime root: lists, opens and initializes projects; owns the open stores. At most
    `max_open` projects hold connections at once: using one more releases the least recently used."""

    def __init__(self, path, max_open=MAX_OPEN_PROJECTS, observer=None):
        self.path = Path(os.path.abspath(path))
        # Told of every activation that ends (observer.activation_ended(activation), after the commit):
        # the tracer of suzumio_telemetry in `serve`; None elsewhere.
        self.observer = observer
        self._stores = {}
        self._lock = threading.Lock()
        self.max_open = max_open
        self._recent = OrderedDict()  # project name -> store, least recently used first
        self._recent_lock = threading.Lock()
        self._last_used = None  # the store _used() moved to the end of _recent last
        self.changes = Changes()
        self._summaries = {}  # project name -> (key, summary) for project_summaries()
        self._summaries_lock = threading.Lock()
        self._computing = {}  # project name -> the lock held while its summary is computed
        self.clock_ns = time.time_ns  # the summary cache's clock (a test moves it on)
        self.live = LiveEvents(self.changes)

    def _used(self, store):
        # Every read tells the root; most come from the store used last, already at the end of the order.
        if self._last_used is store:
            return
        with self._recent_lock:
            self._last_used = store
            self._recent[store.project_id] = store
            self._recent.move_to_end(store.project_id)
            excess = len(self._recent) - self.max_open
            victims = []
            for name in list(self._recent)[:max(0, excess)]:
                victims.append(self._recent.pop(name))
        # Released outside the lock: release_idle takes store locks, never blocking on them.
        for victim in victims:
            if not victim.release_idle():
                with self._recent_lock:  # busy writing: it stays counted, and goes at a later turn
                    self._recent.setdefault(victim.project_id, victim)
                    self._last_used = None

    def open_connections(self):
        """Connections held open by this root's stores (writers and pooled readers)."""
        with self._lock:
            stores = list(self._stores.values())
        return sum(store.open_connections() for store in stores)

    def list_projects(self):
        """Names of directories directly under the root holding suzumio.sqlite, sorted."""
        if not self.path.is_dir():
            return []
        # scandir's entries know their type without a stat: the scheduler lists the root on every pass.
        with os.scandir(self.path) as entries:
            return sorted(entry.name for entry in entries
                          if entry.is_dir() and os.path.isfile(os.path.join(entry.path, DB_FILE)))

    def project_summaries(self):
        """The short summary of every project (docs/http-api.md), each computed again only when the
        project changed since: a commit in this process bumps its version, one from another process (a
        CLI command beside `serve`) changes its database files. The project list is what every control
        room polls; with hundreds of idle projects it costs a few stat() calls each instead of opening
        every database and counting its rows."""
        names = self.list_projects()
        summaries = []
        for name in names:
            summary = self._cached_summary(name)
            if summary is None:
                # One request computes a changed project's summary; those arriving meanwhile wait for it
                # (a control room's clients all come at once, after a restart, with a cold cache).
                with self._summaries_lock:
                    computing = self._computing.setdefault(name, threading.Lock())
                with computing:
                    summary = self._cached_summary(name) or self._computed_summary(name)
            if summary is not None:
                summaries.append(summary)
        with self._summaries_lock:
            for gone in set(self._summaries) - set(names):
                del self._summaries[gone]
                self._computing.pop(gone, None)
        return summaries

    def _cached_summary(self, name):
        key = self._summary_key(name)
        with self._summaries_lock:
            cached = self._summaries.get(name)
        return cached[1] if key is not None and cached is not None and cached[0] == key else None

    def _computed_summary(self, name):
        key = self._summary_key(name)
        try:
            summary = self.open_project(name).project_summary(full=False)
        except NotFound:
            return None  # removed between the listing and the read
        if key is not None:
            with self._summaries_lock:
                self._summaries[name] = (key, summary)
        return summary

    def _summary_key(self, name):
        """What identifies a project's state for the summary cache, read before the summary is. For a
        project whose writer is open, its database_version(): exact, a busy project's summary is computed
        once per change, not once per request. Otherwise its in-process version and the size and change
        time of its database and WAL files; None (not cacheable) while a file changed within the last
        second, where a coarse file clock could give a later write from another process the same time."""
        with self._lock:
            store = self._stores.get(name)
        if store is not None:
            try:
                version = store.database_version(reopen=False, wait=False)
            except (RuntimeError, sqlite3.Error):  # closed meanwhile: the files tell
                version = None
            if version is not None:
                return ("open", *version)
        key = [self.changes.version(name)]
        now = self.clock_ns()
        for path in (self.path / name / DB_FILE, self.path / name / (DB_FILE + "-wal")):
            try:
                info = os.stat(path)
            except FileNotFoundError:
                key.append(None)
                continue
            if now - info.st_mtime_ns < 1_000_000_000:
                return None
            key.append((info.st_size, info.st_mtime_ns, info.st_ino))
        return tuple(key)

    def project_dir(self, name):
        if not valid_project_name(name):
            raise NotFound(f"Unknown project: {name}")
        return self.path / name

    def exists(self, name):
        return valid_project_name(name) and _is_file(self.path / name / DB_FILE)

    def open_project(self, name):
        """The project's store (shared, owned by this Root); creates nothing when missing."""
        with self._lock:  # an open store's name was checked when it was opened
            store = self._stores.get(name)
            if store is not None and not store.closed:
                return store
        directory = self.project_dir(name)
        with self._lock:
            store = self._stores.get(name)
            if store is not None and not store.closed:
                return store
            if not _has_project_row(directory / DB_FILE, name):
                raise NotFound(f"Unknown project: {name}")
            store = ProjectStore(name, directory, on_use=self._used, on_commit=self.changes.committed,
                                 observer=self.observer)
            self._stores[name] = store
            return store

    def init_project(self, name, task, config, agents, source_text, resolved_text, config_path=None,
                     now=None):
        """Create the layout of docs/cli.md and the database; on failure leave no file behind. `agents` are
        the config's expanded agents (ProjectConfig.agents: id, role, display_name, prompt, model, tools)."""
        if not valid_project_name(name):
            raise BadRequest(f"Invalid project name: {name}")
        if name in (RUN_DIR, API_TOKEN_FILE, SERVE_LOCK_FILE):
            raise BadRequest(f"Invalid project name: {name} (reserved in the runtime root)")
        directory = self.path / name
        db_path = directory / DB_FILE
        if _has_project_row(db_path, name):
            raise Conflict(f"Project already initialized: {name}")
        undo = _Undo()
        try:
            wanted = [directory / "agents", directory / "artifacts", directory / "activations",
                      directory / "logs"]
            for seed in agents:
                wanted += [directory / "agents" / seed.id / "workspace", directory / "artifacts" / seed.id]
            for path in wanted:
                undo.mkdir(path)
            os.chmod(directory / "activations", 0o700)
            undo.write(directory / "source.yaml", source_text)
            undo.write(directory / "resolved.yaml", resolved_text)
            undo.new_file(db_path)
            store = ProjectStore(name, directory, on_use=self._used, on_commit=self.changes.committed,
                                 observer=self.observer)
            try:
                store._create(task, config, agents, config_path or str(directory / "resolved.yaml"), now)
            except BaseException:
                store.close()
                raise
        except BaseException:
            undo.rollback()
            raise
        with self._lock:
            self._stores[name] = store
        return store

    def close(self):
        """Close every store this Root opened (idempotent)."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        with self._recent_lock:
            self._recent.clear()
            self._last_used = None
        for store in stores:
            store.close()


class _Undo:
    """Records what init creates so a failure can remove exactly that."""

    def __init__(self):
        self._dirs = []
        self._files = []
        self._restore = []

    def mkdir(self, path):
        missing = []
        probe = path
        while not probe.exists():
            missing.append(probe)
            probe = probe.parent
        path.mkdir(parents=True, exist_ok=True)
        self._dirs.extend(reversed(missing))

    def write(self, path, text):
        if path.exists():
            self._restore.append((path, path.read_bytes()))
        else:
            self._files.append(path)
        path.write_text(text, encoding="utf-8")

    def new_file(self, path):
        if not path.exists():
            self._files += [path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")]

    def rollback(self):
        for path in self._files:
            if path.exists():
                path.unlink()
        for path, data in self._restore:
            path.write_bytes(data)
        for path in reversed(self._dirs):
            if path.exists():
                shutil.rmtree(path)


# ---------------------------------------------------------------------------------------------
# Schema (docs/design/store.md). Shipped migrations are frozen literal SQL and never edited: a new status, column or
# table is a new entry appended to MIGRATIONS (tests/test_store.py checks the result against tests/schema/expected.sql).

_MIGRATION_1 = [
    """CREATE TABLE projects (
        id TEXT PRIMARY KEY, name TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('initialized', 'running', 'submitted', 'completed', 'stopped', 'failed')),
        task TEXT NOT NULL, config_json TEXT NOT NULL, submitted_report TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",  # noqa: E501  (frozen text)
    """CREATE TABLE agents (
        id TEXT NOT NULL, project TEXT NOT NULL, role TEXT NOT NULL, display_name TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('quiet', 'ready', 'running', 'failed', 'stopped')),
        prompt TEXT NOT NULL, model TEXT, tools_json TEXT NOT NULL, workspace_path TEXT NOT NULL,
        token TEXT NOT NULL, active_activation_id TEXT, container_name TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (project, id))""",
    """CREATE TABLE messages (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, sender TEXT NOT NULL, recipient TEXT, channel TEXT,
        priority TEXT NOT NULL CHECK (priority IN ('P0', 'P1', 'P2', 'P3')), body TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    "CREATE INDEX idx_messages_project_created ON messages (project, created_at)",
    """CREATE TABLE signals (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, kind TEXT NOT NULL, source_agent TEXT,
        source_activation TEXT, target_agent TEXT, target_channel TEXT,
        priority TEXT NOT NULL CHECK (priority IN ('P0', 'P1', 'P2', 'P3')), payload_json TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'closed')),
        useful_effect INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL, not_before TEXT,
        delivered_at TEXT, delivered_activation_id TEXT)""",
    "CREATE INDEX idx_signals_project_target ON signals (project, target_agent, status, created_at)",
    ("CREATE INDEX idx_signals_project_target_ready "
     "ON signals (project, target_agent, status, not_before, created_at)"),
    "CREATE INDEX idx_signals_project_source ON signals (project, source_activation, useful_effect)",
    """CREATE TABLE activations (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
        prompt TEXT NOT NULL, input_path TEXT NOT NULL, output_path TEXT NOT NULL, container_name TEXT,
        started_at TEXT NOT NULL, completed_at TEXT, text TEXT, error TEXT,
        emitted_messages INTEGER NOT NULL DEFAULT 0, usage_json TEXT, context_json TEXT)""",
    "CREATE INDEX idx_activations_project_started ON activations (project, started_at)",
    """CREATE TABLE tool_calls (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, activation_id TEXT NOT NULL, agent_id TEXT NOT NULL,
        tool TEXT NOT NULL, input_json TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
        output TEXT, error TEXT, created_at TEXT NOT NULL, completed_at TEXT)""",
    """CREATE TABLE events (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, type TEXT NOT NULL, data_json TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    "CREATE INDEX idx_events_project_created ON events (project, created_at)",
    """CREATE TABLE agent_history_messages (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool_call', 'tool_result', 'compaction')), kind TEXT NOT NULL, content TEXT NOT NULL,
        sequence INTEGER NOT NULL, metadata_json TEXT NOT NULL DEFAULT '{}', compaction_id TEXT,
        created_at TEXT NOT NULL)""",  # noqa: E501  (frozen text)
    ("CREATE UNIQUE INDEX idx_agent_history_project_agent_sequence "
     "ON agent_history_messages (project, agent_id, sequence)"),
    ("CREATE INDEX idx_agent_history_project_agent_active "
     "ON agent_history_messages (project, agent_id, compaction_id, sequence)"),
    """CREATE TABLE agent_history_parts (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, message_id TEXT NOT NULL,
        activation_id TEXT, part_index INTEGER NOT NULL, type TEXT NOT NULL, text TEXT, tool_call_id TEXT,
        tool_name TEXT, input_json TEXT, output TEXT, error TEXT,
        metadata_json TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL)""",
    "CREATE INDEX idx_agent_history_parts_message ON agent_history_parts (project, message_id, part_index)",
    """CREATE TABLE agent_history_compactions (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT,
        summary_message_id TEXT NOT NULL, archive_path TEXT NOT NULL, start_sequence INTEGER NOT NULL,
        end_sequence INTEGER NOT NULL, archived_message_count INTEGER NOT NULL, raw_chars INTEGER NOT NULL,
        summary TEXT NOT NULL, reason TEXT, selected_model TEXT, created_at TEXT NOT NULL)""",
    ("CREATE INDEX idx_agent_history_compactions_agent "
     "ON agent_history_compactions (project, agent_id, created_at)"),
]

# Every model request the controller forwarded (suzumio_model_proxy) with the provider's status and the
# usage read from its answer; `tokens` is that usage as the budget counts it (usage_tokens).
_MIGRATION_2 = [
    """CREATE TABLE model_calls (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, activation_id TEXT NOT NULL, agent_id TEXT NOT NULL,
        provider_id TEXT NOT NULL, preset_id TEXT NOT NULL, status INTEGER NOT NULL,
        tokens INTEGER NOT NULL, usage_json TEXT NOT NULL, created_at TEXT NOT NULL)""",
    "CREATE INDEX idx_model_calls_project_activation ON model_calls (project, activation_id)",
]

# Approval requests (suzumio_approvals owns the rules and the decisions). One row per gated tool
# call: pending until a person decides, it expires or its activation ends; `rule_key` names the rule an
# `allow-always` decision keeps allowing for that agent; `used_at` marks the controller-side run it allowed.
_MIGRATION_3 = [
    """CREATE TABLE approvals (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL, tool TEXT NOT NULL, input_json TEXT NOT NULL,
        rule_json TEXT NOT NULL, rule_key TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'allowed', 'denied', 'expired', 'cancelled')),
        decision TEXT CHECK (decision IN ('allow', 'deny', 'allow-always')),
        decided_by TEXT, note TEXT, on_expiry TEXT NOT NULL CHECK (on_expiry IN ('allow', 'deny')),
        expires_at TEXT NOT NULL, created_at TEXT NOT NULL, decided_at TEXT, used_at TEXT)""",
    "CREATE INDEX idx_approvals_project_status ON approvals (project, status, created_at)",
    "CREATE INDEX idx_approvals_project_activation ON approvals (project, activation_id, status)",
    "CREATE INDEX idx_approvals_project_grant ON approvals (project, agent_id, rule_key, decision)",
]

# The cost in USD of each model call from its preset's pricing (NULL without prices).
_MIGRATION_4 = ["ALTER TABLE model_calls ADD COLUMN cost_usd REAL"]

# The runner's key for one model tool call. A start asked again with a key its
# activation already used answers the call recorded then; rows of runners without keys keep NULL, which
# the unique index allows any number of times.
_MIGRATION_5 = ["ALTER TABLE tool_calls ADD COLUMN call_key TEXT",
                "CREATE UNIQUE INDEX idx_tool_calls_activation_call_key ON tool_calls (activation_id, call_key)"]

# The budget's reads find their few events by type (the latest `project.status` running, the budget
# warning, the ended activations since): without this index each was a walk over every event of the
# project on every tick of a project with a budget (31 ms at 100,000 events).
_MIGRATION_6 = ["CREATE INDEX idx_events_project_type ON events (project, type)"]

# A person may edit a gated call's input (`edited_input_json`, the original stays in `input_json`) or answer
# it (status `responded`, decision `respond`, the answer in `output`); SQLite cannot change a CHECK, so the
# table is rebuilt. An agent a loop guard paused keeps the guard's record in `paused_json` until a person
# resumes it; `guards_since` is when its guards last started counting afresh (NULL: from the beginning).
_MIGRATION_7 = [
    """CREATE TABLE approvals_new (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL, tool TEXT NOT NULL, input_json TEXT NOT NULL,
        rule_json TEXT NOT NULL, rule_key TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'allowed', 'denied', 'expired', 'cancelled', 'responded')),
        decision TEXT CHECK (decision IN ('allow', 'deny', 'allow-always', 'respond')),
        decided_by TEXT, note TEXT, on_expiry TEXT NOT NULL CHECK (on_expiry IN ('allow', 'deny')),
        expires_at TEXT NOT NULL, created_at TEXT NOT NULL, decided_at TEXT, used_at TEXT,
        edited_input_json TEXT, output TEXT)""",
    "INSERT INTO approvals_new SELECT *, NULL, NULL FROM approvals",
    "DROP TABLE approvals",
    "ALTER TABLE approvals_new RENAME TO approvals",
    "CREATE INDEX idx_approvals_project_status ON approvals (project, status, created_at)",
    "CREATE INDEX idx_approvals_project_activation ON approvals (project, activation_id, status)",
    "CREATE INDEX idx_approvals_project_grant ON approvals (project, agent_id, rule_key, decision)",
    "ALTER TABLE agents ADD COLUMN paused_json TEXT",
    "ALTER TABLE agents ADD COLUMN guards_since TEXT",
]

# The sender's key for one message (a toolpack's job run). A send with a key the project already holds
# answers the message recorded then; messages without keys keep NULL, which the unique index allows any
# number of times.
_MIGRATION_9 = ["ALTER TABLE messages ADD COLUMN idempotency_key TEXT",
                "CREATE UNIQUE INDEX idx_messages_project_idempotency_key ON messages (project, idempotency_key)"]

# The machine an activation ran on: a Swarm node's host name, else the controller's.
_MIGRATION_10 = ["ALTER TABLE activations ADD COLUMN node TEXT"]

# Cached prompt tokens of each model call apart (read from the cache, written to it; `tokens` still counts
# them), so that usage and cost answers need not parse usage_json; and the signals delivered to an
# activation found by index (a model call's priority at its provider's gate).
_MIGRATION_11 = ["ALTER TABLE model_calls ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0",
                 "ALTER TABLE model_calls ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0",
                 "CREATE INDEX IF NOT EXISTS idx_signals_project_delivered "
                 "ON signals (project, delivered_activation_id)"]

MIGRATIONS = [(1, "initial schema", _MIGRATION_1), (2, "model calls", _MIGRATION_2),
              (3, "approval requests", _MIGRATION_3), (4, "model call cost", _MIGRATION_4),
              (5, "tool call keys", _MIGRATION_5), (6, "events by type", _MIGRATION_6),
              (7, "approval edits, paused agents", _MIGRATION_7), (8, "flight recorder", MIGRATION_RECORDER),
              (9, "message idempotency keys", _MIGRATION_9), (10, "activation nodes", _MIGRATION_10),
              (11, "cached prompt tokens", _MIGRATION_11), (12, "effect ledger", MIGRATION_EFFECTS),
              (13, "team repository", MIGRATION_REPOSITORY)]


STAGED_NAME = re.compile(r"^\..+\.[0-9a-f]{8}\.tmp$")  # what _Tx.write_file stages
# Staged files of committed transactions not yet renamed into place: bookkeeping like _migrations,
# kept outside the numbered migrations.
_STAGED_TABLE = "CREATE TABLE IF NOT EXISTS _staged_files (temp TEXT PRIMARY KEY, final TEXT NOT NULL)"


def fsync_dir(path):
    """Make the entries of directory `path` (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path, text):
    """Write `text` to `path` and fsync the file and its directory."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(path.parent)


class _GroupedWork:
    """One caller's work in ProjectStore.write_grouped and its outcome."""

    __slots__ = ("done", "error", "now", "result", "work")

    def __init__(self, work, now):
        self.work, self.now = work, now
        self.result = self.error = None
        self.done = False


class _Tx:
    """One open write transaction: its connection and the operation's clock."""

    def __init__(self, conn, now, after_commit=None, files=None, base=None):
        self.conn = conn
        self.now = now
        self.ts = format_ts(now)
        self.after_commit = [] if after_commit is None else after_commit  # callables run after COMMIT
        self.files = [] if files is None else files  # (temp, final): renamed after COMMIT, else removed
        self.base = base  # the project directory the staged paths are recorded relative to

    def write_file(self, path, text):
        """Write `text` to `path` when this transaction commits: a temp file beside it now (synced, and
        recorded in _staged_files by this transaction), renamed over it after COMMIT, so a rollback
        leaves no file behind and never touches the old one, and a crash after the COMMIT leaves the
        rename to the recovery of the next open (ProjectStore.recover_staged_files)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self.files.append((temp, path))  # first: a write that fails (a full disk) is removed on rollback
        write_durably(temp, text)
        self.conn.execute("INSERT INTO _staged_files (temp, final) VALUES (?, ?)",
                          (os.path.relpath(temp, self.base), os.path.relpath(path, self.base)))

    def execute(self, sql, params=()):
        return self.conn.execute(sql, params)

    def one(self, sql, params=()):
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql, params=()):
        return self.conn.execute(sql, params).fetchall()

    def id(self, prefix):
        return new_id(prefix, self.now)



# ---------------------------------------------------------------------------------------------

class ProjectStore(ProjectRows, AgentRows, SignalRows, ActivationRows, HistoryRows, UsageRows, ApprovalRows,
                   TimelineReads, RecorderRows, EffectRows, RepositoryRows):
    """One project's SQLite database and directory; safe to share between threads. This class holds the
    connections, transactions and paths; each base class is the gateway of some tables (its file says
    which) and reaches the database only through `_reading()`, `_query*()`, `snapshot()` and `write()`.


    Connections are bounded by design: one writer (behind the write lock) and a small pool of read-only
    readers that a read borrows for one statement or one snapshot, so descriptors never grow with the
    number of threads. Both are opened on demand; release_idle() closes what nobody is using, and the
    Root calls it for the projects used least recently."""

    def __init__(self, project_id, directory, on_use=None, on_commit=None, observer=None):
        self.project_id = project_id
        self._observer = observer
        self.dir = Path(os.path.abspath(directory))
        self.db_path = self.dir / DB_FILE
        self.closed = False
        self._lock = threading.RLock()  # the write lock; also guards the writer connection
        self._grouped = []  # _GroupedWork waiting for the write lock (write_grouped)
        self._grouped_guard = threading.Lock()
        self._local = threading.local()  # .tx: this thread's open write; .snap: its open snapshot
        self._idle = []  # pooled reader connections nobody is using
        self._pool_lock = threading.Lock()
        self._on_use = on_use
        self._on_commit = on_commit  # told the project id after every committed write transaction
        self.commits = 0  # write transactions this store committed (a tick sees whether it wrote meanwhile)
        # The rowid of the newest event this store committed (0: none yet): a live delta published now
        # follows every event up to it on the SSE stream (suzumio_live, suzumio_sse).
        self.event_watermark = 0
        self._uncommitted_event = None  # the newest event of the open write transaction
        self._config = None
        self._tick_agent_cache = {}  # agent row values -> their record (ProjectRows.tick_reads)
        self._tick_cache = None  # (database_version(), its clock, TickReads) of the last tick_reads
        self._writer = _connect(self.db_path)
        try:
            self._writer.execute("PRAGMA journal_mode = WAL")  # persistent: stored in the file
            self._migrate()
        except BaseException:
            self._writer.close()
            raise
        try:
            self.recover_staged_files()
        except (OSError, sqlite3.Error) as error:  # a full or read-only disk: the next open tries again
            log.warning("store %s: recovering staged files failed: %s", self.project_id, error)

    # -- connections and transactions ----------------------------------------------------------

    def close(self):
        """Close every connection (idempotent); borrowed readers close when they come back."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def release_idle(self):
        """Close the connections nobody is using now; the next operation reopens what it needs.
        Returns False when the writer was busy (it is then left open)."""
        released = False
        # Never blocks: a write in progress (on another thread, or on this one further up the stack)
        # keeps the writer, and the Root simply tries again later.
        if self._lock.acquire(blocking=False):
            try:
                if getattr(self._local, "tx", None) is None and self._writer is not None:
                    self._writer.close()
                    self._writer = None
                released = self._writer is None
            finally:
                self._lock.release()
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._config = None  # parsed again on next use: an idle project keeps no copy in memory
        self._tick_cache, self._tick_agent_cache = None, {}
        return released

    def open_connections(self):
        """How many connections this store holds open now (writer and pooled readers)."""
        with self._pool_lock:
            return len(self._idle) + (self._writer is not None)

    def _used(self):
        if self._on_use is not None:
            self._on_use(self)

    def _borrow(self):
        if self.closed:
            raise RuntimeError(f"store for {self.project_id} is closed")
        self._used()
        with self._pool_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = _connect(self.db_path)
            conn.execute("PRAGMA query_only = ON")  # a read path can never change a row
        return conn

    def _give_back(self, conn):
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        with self._pool_lock:
            pooled = not self.closed and len(self._idle) < IDLE_READERS
            if pooled:
                self._idle.append(conn)
        if pooled:
            self._used()  # counted again, in case the Root released this store while it was out
        else:
            conn.close()

    def _current(self):
        """The connection this thread is already inside: its write transaction's or its snapshot's."""
        tx = getattr(self._local, "tx", None)
        return tx.conn if tx is not None else getattr(self._local, "snap", None)

    @contextmanager
    def _reading(self, conn=None):
        """The connection for a read: `conn` when given, else the thread's open write or snapshot,
        else a pooled reader borrowed for the block."""
        conn = conn or self._current()
        if conn is not None:
            yield conn
            return
        conn = self._borrow()
        try:
            yield conn
        finally:
            self._give_back(conn)

    @contextmanager
    def snapshot(self):
        """A read transaction so several SELECTs see one consistent state."""
        current = self._current()
        if current is not None:
            yield current
            return
        conn = self._borrow()
        self._local.snap = conn
        try:
            conn.execute("BEGIN")
            yield conn
        finally:
            self._local.snap = None
            self._give_back(conn)  # ends the read transaction

    @contextmanager
    def write(self, now=None):
        """The one write path: lock, BEGIN IMMEDIATE, commit or roll back. Nested calls join."""
        outer = getattr(self._local, "tx", None)
        if outer is not None:
            yield outer if now is None else _Tx(outer.conn, to_datetime(now), outer.after_commit, outer.files,
                                                outer.base)
            return
        self._used()
        with self._lock:
            conn = self._begin()
            # the clock is read only after the write lock is held, so created_at follows rowid order
            tx = _Tx(conn, to_datetime(now), base=self.dir)
            self._local.tx = tx
            try:
                yield tx
                conn.execute("COMMIT")
                if self._uncommitted_event is not None:
                    self.event_watermark = self._uncommitted_event
            except BaseException:
                # SQLite may already have rolled back (e.g. disk full); only roll back what is open
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                for temp, _ in tx.files:
                    temp.unlink(missing_ok=True)
                raise
            finally:
                self._local.tx = None
                self._uncommitted_event = None
            if tx.files:
                self._place_staged(tx.files)
            self.commits += 1
            if self._on_commit is not None:
                self._on_commit(self.project_id)
            for callback in tx.after_commit:  # observers only queue work; they never fail the write
                callback()

    def database_version(self, reopen=True, wait=True):
        """A value that changes whenever the database may have: this store's commit count, the writer
        connection, and its PRAGMA data_version, which moves with every commit made on any other
        connection (another process's, such as a CLI command beside `serve`). With reopen False, None
        when the writer is closed (release_idle) instead of opening it again; with wait False, None while
        another thread writes, instead of waiting for its COMMIT (the caller then reads the rows)."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if self.closed:
                raise RuntimeError(f"store for {self.project_id} is closed")
            if self._writer is None:
                if not reopen:
                    return None
                self._writer = _connect(self.db_path)
            if reopen:
                self._used()
            return self.commits, id(self._writer), self._writer.execute("PRAGMA data_version").fetchone()[0]
        finally:
            self._lock.release()

    def _begin(self):
        """The writer connection (opened on first use) with a transaction begun; the caller holds the
        write lock."""
        if self.closed:
            raise RuntimeError(f"store for {self.project_id} is closed")
        if self._writer is None:
            self._writer = _connect(self.db_path)
        self._writer.execute("BEGIN IMMEDIATE")
        return self._writer

    def write_grouped(self, work, now=None):
        """`work(tx)` in a write transaction shared with the other write_grouped calls waiting for the write
        lock; returns what `work` returned, or raises what it raised. Whoever takes the lock writes every
        waiting work, each in its own SAVEPOINT (one that fails is rolled back alone and raises in its own
        caller), and commits once: each caller returns after the COMMIT that holds its rows, so an answer
        still means committed, but a burst of requests costs one lock hold and one synced COMMIT instead of
        one each. Inside an open write it simply joins it."""
        if getattr(self._local, "tx", None) is not None:
            with self.write(now) as tx:
                return work(tx)
        request = _GroupedWork(work, now)
        with self._grouped_guard:
            self._grouped.append(request)
        self._used()
        with self._lock:
            if not request.done:  # else an earlier holder of the lock wrote it
                with self._grouped_guard:
                    batch, self._grouped = self._grouped, []
                self._write_batch(batch)
        if request.error is not None:
            raise request.error
        return request.result

    def _write_batch(self, batch):
        """One transaction for the works of `batch`; the caller holds the write lock. Each work gets its
        outcome; after an error that ended the whole transaction (BEGIN's or COMMIT's, or one SQLite
        answered by rolling everything back) every work without an error of its own gets that one."""
        shared = _Tx(None, to_datetime(None), base=self.dir)
        alone = len(batch) == 1  # no SAVEPOINT needed: its failure rolls back the transaction
        committed, conn = False, None
        try:
            conn = self._begin()
            for request in batch:
                # Each work reads the clock when its turn comes, under the lock: created_at follows rowids.
                tx = _Tx(conn, to_datetime(request.now), shared.after_commit, shared.files, self.dir)
                self._local.tx = tx
                if alone:
                    request.result = request.work(tx)
                    continue
                marks = (len(shared.files), len(shared.after_commit), self._uncommitted_event)
                conn.execute("SAVEPOINT grouped_work")
                try:
                    request.result = request.work(tx)
                    conn.execute("RELEASE grouped_work")
                except Exception as error:
                    if not conn.in_transaction:
                        raise  # SQLite rolled the whole transaction back: no work of the batch is kept
                    conn.execute("ROLLBACK TO grouped_work")
                    conn.execute("RELEASE grouped_work")
                    for temp, _ in shared.files[marks[0]:]:
                        temp.unlink(missing_ok=True)
                    del shared.files[marks[0]:], shared.after_commit[marks[1]:]
                    self._uncommitted_event = marks[2]
                    request.error, request.result = error, None
            conn.execute("COMMIT")
            committed = True
            if self._uncommitted_event is not None:
                self.event_watermark = self._uncommitted_event
        except Exception as error:  # noqa: BLE001  each caller raises it: the one boundary is theirs
            for request in batch:
                if request.error is None:
                    request.error, request.result = error, None
        finally:
            self._local.tx = None
            self._uncommitted_event = None
            if not committed:
                # Also on an interrupt of this thread: nothing of the batch stays, and no caller waits on.
                if conn is not None and conn.in_transaction:
                    conn.execute("ROLLBACK")
                for temp, _ in shared.files:
                    temp.unlink(missing_ok=True)
                for request in batch:
                    if request.error is None:
                        request.error, request.result = RuntimeError("write interrupted"), None
            for request in batch:
                request.done = True
        if not committed:
            return
        if shared.files:
            self._place_staged(shared.files)
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(self.project_id)
        for callback in shared.after_commit:
            callback()

    def _place_staged(self, files):
        """After COMMIT: rename each staged file into place (same directory: atomic), sync its
        directory, then forget it. A file gone already was placed by another process's recovery."""
        for temp, final in files:
            try:
                os.replace(temp, final)
            except FileNotFoundError:
                continue
            fsync_dir(final.parent)
        try:
            with self.write() as tx:
                tx.conn.executemany("DELETE FROM _staged_files WHERE temp = ?",
                                    [(os.path.relpath(temp, self.dir),) for temp, _final in files])
        except sqlite3.Error as error:  # the rows only repeat a rename already done; the next open drops them
            log.warning("store %s: staged files placed, their records stay: %s", self.project_id, error)

    def recover_staged_files(self):
        """Finish what a process killed around a COMMIT left: a staged file its committed transaction
        recorded is renamed into place; any other staged file (its transaction rolled back or never
        committed) is removed. Runs under the write lock, so no transaction of another process is open
        (a transaction stages its files after it took the lock). Returns (placed, removed)."""
        placed, removed = [], []
        with self.write() as tx:
            for temp, final in tx.all("SELECT temp, final FROM _staged_files"):
                if (self.dir / temp).exists():
                    os.replace(self.dir / temp, self.dir / final)
                    fsync_dir((self.dir / final).parent)
                    placed.append(final)
            tx.execute("DELETE FROM _staged_files")
            for folder in (self.dir, self.dir / "history"):
                candidates = folder.glob("*") if folder == self.dir else folder.glob("*/*")
                for path in candidates:
                    if STAGED_NAME.match(path.name) and path.is_file():
                        path.unlink()
                        removed.append(os.path.relpath(path, self.dir))
        for final in placed:
            log.warning("store %s: placed %s, staged by a transaction committed before a crash", self.project_id, final)
        for temp in removed:
            log.info("store %s: removed %s, staged by a transaction that never committed", self.project_id, temp)
        return placed, removed

    def _migrate(self):
        with self._lock:
            conn = self._writer
            conn.execute("CREATE TABLE IF NOT EXISTS _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                         " applied_at TEXT NOT NULL)")
            conn.execute(_STAGED_TABLE)
            for number, name, statements in MIGRATIONS:
                with self.write() as tx:
                    if tx.one("SELECT 1 FROM _migrations WHERE id = ?", (number,)):
                        continue
                    for statement in statements:
                        tx.execute(statement)
                    tx.execute("INSERT INTO _migrations (id, name, applied_at) VALUES (?, ?, ?)",
                               (number, name, tx.ts))
                    log.info("store %s: applied migration %s (%s)", self.project_id, number, name)

    def _query(self, sql, params=()):
        with self._reading() as conn:
            return conn.execute(sql, params).fetchall()

    def _query_one(self, sql, params=()):
        with self._reading() as conn:
            return conn.execute(sql, params).fetchone()

    # -- paths -----------------------------------------------------------------------------------

    def workspace(self, agent_id):
        return self.dir / "agents" / agent_id / "workspace"

    @property
    def artifacts_root(self):
        return self.dir / "artifacts"

    def artifacts_dir(self, agent_id):
        return self.dir / "artifacts" / agent_id

    @property
    def activations_root(self):
        return self.dir / "activations"

    def activation_dir(self, activation_id):
        return self.dir / "activations" / activation_id

    def history_archive_path(self, agent_id, compaction_id):
        return self.dir / "history" / agent_id / f"{compaction_id}.json"

    @property
    def report_path(self):
        return self.dir / "final-report.md"

    @property
    def resolved_yaml_path(self):
        return self.dir / "resolved.yaml"

    @property
    def source_yaml_path(self):
        return self.dir / "source.yaml"

    def toolpack_state_dir(self, toolpack_id):
        return self.dir / "toolpack-state" / toolpack_id

    # -- Node toolpack facade (docs/design/tools.md store.db.*) ---------------------------------------

    def db_all(self, sql, params=()):
        """All rows of a query as dicts keyed by column name."""
        return [dict(r) for r in self._query(sql, list(params or ()))]

    def db_get(self, sql, params=()):
        """The first row of a query as a dict, or None."""
        row = self._query_one(sql, list(params or ()))
        return dict(row) if row is not None else None

    def db_run(self, sql, params=()):
        """Run one statement in its own write transaction: {changes, lastInsertRowid}."""
        with self.write() as tx:
            cursor = tx.execute(sql, list(params or ()))
            return {"changes": max(cursor.rowcount, 0),
                    "lastInsertRowid": cursor.lastrowid or 0}
