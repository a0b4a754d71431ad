"""Durable store: the runtime root layout and one ProjectStore per project SQLite file (store.md).
The only module that imports sqlite3 or writes SQL. It keeps rows and transactions: connections, the one
`write()` path, migrations, and reads and conditional writes of rows with their events; the rules that
decide what those writes mean (routing, delivery, nudges, stop, submit) are suzumio_coordination's, each
inside one `write()`. Imported by the CLI, coordination, scheduler, backend, toolpacks and the HTTP
routes; imports suzumio_errors and suzumio_records (status constants, row shapes, timestamps), and takes
the resolved config as a plain dict and the config's expanded agents at init."""
import hmac
import json
import logging
import os
import secrets
import shutil
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound
from suzumio_live import LiveEvents  # issue 14: the ephemeral model deltas of the SSE stream
from suzumio_records import (
    ACT_FAILED,
    ACT_RUNNING,
    ACTIVATION_TRANSITIONS,
    AGENT_FAILED,
    AGENT_QUIET,
    AGENT_RUNNING,
    AGENT_TRANSITIONS,
    HISTORY_CLOSED,
    HISTORY_ROLES,
    KIND_BUDGET_WARNING,
    KIND_MESSAGE,
    KIND_SUBMITTED,
    KIND_WAIT,
    PROJECT_INITIALIZED,
    PROJECT_RUNNING,
    PROJECT_STATUSES,
    PROJECT_TRANSITIONS,
    SIGNAL_PENDING,
    SIGNAL_STATUSES,
    SIGNAL_TRANSITIONS,
    TOOL_CALL_TRANSITIONS,
    TOOL_CALLS_CLOSED,
    TOOL_COMPLETED,
    TOOL_RUNNING,
    activation_json,
    agent_json,
    compaction_json,
    dump_json,
    event_row_json,
    format_ts,
    history_json,
    history_part_type,
    load_json,
    message_json,
    new_id,
    omit_none,
    project_row_json,
    public_activation_json,
    public_agent_json,
    shrink,
    signal_json,
    to_datetime,
    tool_call_row_json,
    truncate,
    usage_tokens,
    valid_project_name,
)
from suzumio_store_recorder import MIGRATION_RECORDER, RecorderRows

log = logging.getLogger(__name__)

DB_FILE = "suzumio.sqlite"
# Beside the projects in the root: the runner socket's directory (mounted into every container, so it
# holds nothing else) and the user API token (mode 0600, never mounted). No project may take these names.
RUN_DIR = "run"
API_TOKEN_FILE = "api-token"
BUSY_TIMEOUT_S = 5
# Descriptor bounds (each connection holds the database and its WAL; a project adds its -shm once).
# The rowid cursors of the events table walk its rowids: `+project` keeps SQLite off the (project,
# created_at) index, which every event of a project file matches, so a read of the newest events costs
# the events read, not a scan and a sort of all of them (issue 18: an SSE refresh grew with the project).
BY_ROWID = "+project = ?"
IDLE_READERS = 2  # pooled reader connections kept per project; a burst beyond it closes its extras
MAX_OPEN_PROJECTS = 64  # projects whose connections stay open; the least recently used are released

# ---------------------------------------------------------------------------------------------
# Runtime root.

def resolve_root(explicit=None, env=None):
    """--root, else SUZUMIO_ROOT (even empty), else ~/.suzumio; made absolute (cli.md §1.2)."""
    env = os.environ if env is None else env
    if explicit is not None:
        value = explicit
    elif "SUZUMIO_ROOT" in env:
        value = env["SUZUMIO_ROOT"]
    else:
        value = str(Path.home() / ".suzumio")
    return Path(os.path.abspath(value or os.curdir))



def _connect(path, must_exist=False):
    """Open a connection with every setting the store relies on (STYLE.md, SQLite)."""
    target = f"file:{path}?mode=rw" if must_exist else str(path)
    conn = sqlite3.connect(target, uri=must_exist, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                           check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")
    conn.execute("PRAGMA synchronous = NORMAL")
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
        self.changes = Changes()
        self._summaries = {}  # project name -> (key, summary) for project_summaries()
        self._summaries_lock = threading.Lock()
        self._computing = {}  # project name -> the lock held while its summary is computed
        self.clock_ns = time.time_ns  # the summary cache's clock (a test moves it on)
        self.live = LiveEvents(self.changes)  # issue 14

    def _used(self, store):
        with self._recent_lock:
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

    def open_connections(self):
        """Connections held open by this root's stores (writers and pooled readers)."""
        with self._lock:
            stores = list(self._stores.values())
        return sum(store.open_connections() for store in stores)

    def list_projects(self):
        """Names of directories directly under the root holding suzumio.sqlite, sorted."""
        if not self.path.is_dir():
            return []
        return sorted(entry.name for entry in self.path.iterdir()
                      if entry.is_dir() and (entry / DB_FILE).is_file())

    def project_summaries(self):
        """The short summary of every project (http-api.md §5.1), each computed again only when the
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
        """What identifies a project's state for the summary cache, read before the summary is: its
        in-process version and the size and change time of its database and WAL files. None (not
        cacheable) while a file changed within the last second, where a coarse file clock could give a
        later write from another process the same time."""
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
        """Create the layout of cli.md §2 and the database; on failure leave no file behind. `agents` are
        the config's expanded agents (ProjectConfig.agents: id, role, display_name, prompt, model, tools)."""
        if not valid_project_name(name):
            raise BadRequest(f"Invalid project name: {name}")
        if name in (RUN_DIR, API_TOKEN_FILE):
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
# Schema (store.md §2). Shipped migrations are frozen literal SQL and never edited: a new status, column or
# table is a new entry appended to MIGRATIONS (tests/test_store.py checks the result against SCHEMA_FINGERPRINT).

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

# Issue 16: approval requests (suzumio_approvals owns the rules and the decisions). One row per gated tool
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

# Issue 14: the cost in USD of each model call from its preset's pricing (NULL without prices).
_MIGRATION_4 = ["ALTER TABLE model_calls ADD COLUMN cost_usd REAL"]

# Issue 16 (spec-notes 16k): the runner's key for one model tool call. A start asked again with a key its
# activation already used answers the call recorded then; rows of runners without keys keep NULL, which
# the unique index allows any number of times.
_MIGRATION_5 = ["ALTER TABLE tool_calls ADD COLUMN call_key TEXT",
                "CREATE UNIQUE INDEX idx_tool_calls_activation_call_key ON tool_calls (activation_id, call_key)"]

# The budget's reads find their few events by type (the latest `project.status` running, the budget
# warning, the ended activations since): without this index each was a walk over every event of the
# project on every tick of a project with a budget (31 ms at 100,000 events).
_MIGRATION_6 = ["CREATE INDEX idx_events_project_type ON events (project, type)"]

MIGRATIONS = [(1, "initial schema", _MIGRATION_1), (2, "model calls", _MIGRATION_2),
              (3, "approval requests", _MIGRATION_3), (4, "model call cost", _MIGRATION_4),
              (5, "tool call keys", _MIGRATION_5), (6, "events by type", _MIGRATION_6),
              (7, "flight recorder", MIGRATION_RECORDER)]


class _Tx:
    """One open write transaction: its connection and the operation's clock."""

    def __init__(self, conn, now, after_commit=None, files=None):
        self.conn = conn
        self.now = now
        self.ts = format_ts(now)
        self.after_commit = [] if after_commit is None else after_commit  # callables run after COMMIT
        self.files = [] if files is None else files  # (temp, final): renamed after COMMIT, else removed

    def write_file(self, path, text):
        """Write `text` to `path` when this transaction commits: a temp file beside it now, renamed over
        it after COMMIT, so a rollback leaves no file behind and never touches the old one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        temp.write_text(text, encoding="utf-8")
        self.files.append((temp, path))

    def execute(self, sql, params=()):
        return self.conn.execute(sql, params)

    def one(self, sql, params=()):
        return self.conn.execute(sql, params).fetchone()

    def all(self, sql, params=()):
        return self.conn.execute(sql, params).fetchall()

    def id(self, prefix):
        return new_id(prefix, self.now)



# ---------------------------------------------------------------------------------------------

class ProjectStore(RecorderRows):
    """One project's SQLite database and directory; safe to share between threads.

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
        self._writer = _connect(self.db_path)
        try:
            self._writer.execute("PRAGMA journal_mode = WAL")  # persistent: stored in the file
            self._migrate()
        except BaseException:
            self._writer.close()
            raise

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
            yield outer if now is None else _Tx(outer.conn, to_datetime(now), outer.after_commit, outer.files)
            return
        self._used()
        with self._lock:
            if self.closed:
                raise RuntimeError(f"store for {self.project_id} is closed")
            if self._writer is None:
                self._writer = _connect(self.db_path)
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            # the clock is read only after the write lock is held, so created_at follows rowid order
            tx = _Tx(conn, to_datetime(now))
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
            for temp, final in tx.files:
                os.replace(temp, final)  # same directory: atomic, and the rows naming it are committed
            self.commits += 1
            if self._on_commit is not None:
                self._on_commit(self.project_id)
            for callback in tx.after_commit:  # observers only queue work; they never fail the write
                callback()

    def _migrate(self):
        with self._lock:
            conn = self._writer
            conn.execute("CREATE TABLE IF NOT EXISTS _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                         " applied_at TEXT NOT NULL)")
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

    @property
    def logs_dir(self):
        return self.dir / "logs"

    def toolpack_state_dir(self, toolpack_id):
        return self.dir / "toolpack-state" / toolpack_id

    # -- events ----------------------------------------------------------------------------------

    def add_event(self, tx, type_, data):
        cursor = tx.execute("INSERT INTO events (id, project, type, data_json, created_at) VALUES (?, ?, ?, ?, ?)",
                            (tx.id("evt"), self.project_id, type_, dump_json(data if data is not None else {}),
                             tx.ts))
        self._uncommitted_event = cursor.lastrowid  # under the write lock; becomes event_watermark at COMMIT

    def append_event(self, type_, data=None, now=None):
        """Append one event row (store.md §6)."""
        if not isinstance(type_, str) or not type_:
            raise BadRequest("type is required")
        with self.write(now) as tx:
            self.add_event(tx, type_, data)

    def list_events(self, limit=200, shrink_data=False):
        """Newest events first as raw rows; shrink_data applies http-api.md §6.4."""
        rows = self._query("SELECT * FROM events WHERE project = ? ORDER BY created_at DESC, rowid DESC "
                           "LIMIT ?", (self.project_id, int(limit)))
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
        """SSE start (http-api.md §10): the newest `limit` events oldest first, and the cursor."""
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

    # -- project ---------------------------------------------------------------------------------

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
                       "status, tokens, usage_json, created_at, cost_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (tx.id("mcall"), self.project_id, activation_id, agent_id, provider_id, preset_id,
                        int(status), usage_tokens({"tokens": usage}), dump_json(usage), tx.ts, cost_usd))

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
        """Issue 14: controller-observed tokens and cost per activation, per agent and for the project:
        {"project": {...}, "agents": {id: {...}}, "activations": {id: {...}}}, each {"calls", "tokens",
        "costUsd"} (costUsd null when no call was priced)."""
        rows = self._query("SELECT activation_id, agent_id, COUNT(*) AS calls, SUM(tokens) AS tokens, "
                           "SUM(cost_usd) AS cost FROM model_calls WHERE project = ? "
                           "GROUP BY activation_id, agent_id", (self.project_id,))
        out = {"project": {"calls": 0, "tokens": 0, "costUsd": None}, "agents": {}, "activations": {}}

        def add(total, row):
            total["calls"] += row["calls"]
            total["tokens"] += row["tokens"] or 0
            if row["cost"] is not None:
                total["costUsd"] = round((total["costUsd"] or 0) + row["cost"], 10)

        for row in rows:
            add(out["project"], row)
            add(out["agents"].setdefault(row["agent_id"], {"calls": 0, "tokens": 0, "costUsd": None}), row)
            add(out["activations"].setdefault(row["activation_id"], {"calls": 0, "tokens": 0, "costUsd": None}), row)
        return out

    def project_spend(self):
        """Issue 14: ({"calls", "tokens", "costUsd"} over every model call of the project, the same per
        agent id) for the project summaries the control room lists; costUsd None when none was priced."""
        rows = self._query("SELECT agent_id, COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens, "
                           "SUM(cost_usd) AS cost FROM model_calls WHERE project = ? GROUP BY agent_id ORDER BY "
                           "agent_id", (self.project_id,))
        agents = {row["agent_id"]: {"calls": row["calls"], "tokens": row["tokens"],
                                    "costUsd": None if row["cost"] is None else round(row["cost"], 10)}
                  for row in rows}
        costs = [spend["costUsd"] for spend in agents.values() if spend["costUsd"] is not None]
        total = {"calls": sum(spend["calls"] for spend in agents.values()),
                 "tokens": sum(spend["tokens"] for spend in agents.values()),
                 "costUsd": round(sum(costs), 10) if costs else None}
        return total, agents

    def budget_warned(self, conn=None):
        """Issue 14: whether this budget window already has its `project.budget_warning` event."""
        with self._reading(conn) as conn:
            return conn.execute("SELECT 1 FROM events WHERE project = ? AND type = ? AND rowid > ?",
                                (self.project_id, KIND_BUDGET_WARNING, self._window_start(conn))).fetchone() is not None

    def _window_start(self, conn):
        row = conn.execute(
            "SELECT rowid FROM events WHERE project = ? AND type = 'project.status' "
            "AND json_extract(data_json, '$.status') = ? ORDER BY rowid DESC LIMIT 1",
            (self.project_id, PROJECT_RUNNING)).fetchone()
        return row[0] if row else 0

    def project_stats(self):
        """http-api.md §6.2 stats object."""
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
        """http-api.md §5.1 (full=False) / §5.2 (full=True) project summary."""
        with self.snapshot():
            data = self.project()
            if not full:
                data["task"] = truncate(data["task"], 1000)
            data["stats"] = self.project_stats()
            data["spend"], data["agentSpend"] = self.project_spend()  # issue 14
            data["agents"] = self.public_agents()
            data["recentActivations"] = self.list_activations(10) if full else []
            data["recentMessages"] = self.list_messages(10) if full else []
            data["origin"] = self.origin()  # a replay's or fork's source (docs/replay.md), else None
        return data

    # -- agents ----------------------------------------------------------------------------------

    def agent_row(self, agent_id, conn=None):
        with self._reading(conn) as reader:
            return reader.execute("SELECT * FROM agents WHERE project = ? AND id = ?",
                                  (self.project_id, agent_id)).fetchone()

    def require_agent(self, agent_id, conn=None):
        row = self.agent_row(agent_id, conn)
        if row is None:
            raise NotFound(f"Unknown agent: {agent_id}")
        return row

    def list_agents(self, include_tokens=False):
        """Agent records ordered by id; tokens only when asked for (never for user listings)."""
        rows = self._query("SELECT * FROM agents WHERE project = ? ORDER BY id", (self.project_id,))
        return [agent_json(r, include_tokens) for r in rows]

    def public_agents(self):
        """http-api.md §6.2 public agents ordered by id."""
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
        """Ids of agents that are running with a running bound activation (store.md §3.2)."""
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
        """Idle reset (scheduler.md §5 d): a ready agent with no work becomes quiet."""
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
        """scheduler.md §5 b.2: unbind an agent whose bound activation is not running.

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

    # -- messages and signals --------------------------------------------------------------------

    def insert_message(self, tx, sender, body, recipient, channel, priority):
        """One message row and its message.created event; the caller has routed and checked it."""
        message_id = tx.id("msg")
        tx.execute("INSERT INTO messages (id, project, sender, recipient, channel, priority, body, "
                   "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (message_id, self.project_id, sender, recipient, channel, priority, body, tx.ts))
        message = omit_none({"id": message_id, "project": self.project_id, "sender": sender,
                             "recipient": recipient, "channel": channel, "priority": priority,
                             "body": body, "createdAt": tx.ts})
        self.add_event(tx, "message.created", message)
        return message

    def list_messages(self, limit=100, full_body=False):
        """The newest `limit` messages, oldest first; bodies truncated to 12000 unless full_body."""
        rows = self._query("SELECT * FROM messages WHERE project = ? ORDER BY created_at DESC, rowid DESC "
                           "LIMIT ?", (self.project_id, int(limit)))
        result = [message_json(r) for r in reversed(rows)]
        if not full_body:
            for item in result:
                item["body"] = truncate(item["body"], 12000)
        return result

    def message(self, message_id):
        """Full message JSON; NotFound `Unknown message: <id>`."""
        row = self._query_one("SELECT * FROM messages WHERE project = ? AND id = ?",
                              (self.project_id, message_id))
        if row is None:
            raise NotFound(f"Unknown message: {message_id}")
        return message_json(row)

    def direct_messages(self, a=None, b=None, limit=40):
        """Direct messages (no channel); between a and b when both are given. Newest first."""
        sql = "SELECT * FROM messages WHERE project = ? AND channel IS NULL AND recipient IS NOT NULL"
        params = [self.project_id]
        if a is not None and b is not None:
            sql += " AND ((sender = ? AND recipient = ?) OR (sender = ? AND recipient = ?))"
            params += [a, b, b, a]
        rows = self._query(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?", params + [int(limit)])
        return [message_json(r) for r in rows]

    def insert_signal(self, tx, kind, *, target_agent, status, useful_effect, source_agent=None,
                      source_activation=None, target_channel=None, priority, payload, not_before=None):
        """One signal row and its signal.created event (store.md §4.4); returns the Signal JSON."""
        signal_id = tx.id("sig")
        tx.execute("INSERT INTO signals (id, project, kind, source_agent, source_activation, "
                   "target_agent, target_channel, priority, payload_json, status, useful_effect, "
                   "created_at, not_before, delivered_at, delivered_activation_id) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                   (signal_id, self.project_id, kind, source_agent, source_activation, target_agent,
                    target_channel, priority, dump_json(payload), status, int(useful_effect), tx.ts,
                    not_before or tx.ts))
        signal = signal_json(tx.one("SELECT * FROM signals WHERE id = ?", (signal_id,)))
        self.add_event(tx, "signal.created", signal)
        return signal

    def ready_signals(self, agent_id, priorities, limit, now=None):
        """The agent's pending signals of the given priorities whose not_before has come, oldest first
        by priority then creation, at most `limit`."""
        ts = format_ts(to_datetime(now))
        rows = self._query(f"SELECT * FROM signals WHERE project = ? AND target_agent = ? AND status = ? "
                           f"AND not_before <= ? AND priority IN ({','.join('?' * len(priorities))}) "
                           f"ORDER BY priority, created_at, rowid LIMIT ?",
                           (self.project_id, agent_id, SIGNAL_PENDING, ts, *priorities, int(limit)))
        return [signal_json(r) for r in rows]

    def agents_with_ready_signals(self, agent_ids, now=None):
        """The ids among `agent_ids` that have a pending signal whose not_before has come: one statement
        for a tick's agents, so that an idle agent costs no ready_signals query (issue 18)."""
        if not agent_ids:
            return set()
        rows = self._query(f"SELECT DISTINCT target_agent FROM signals WHERE project = ? "
                           f"AND target_agent IN ({','.join('?' * len(agent_ids))}) AND status = ? "
                           f"AND not_before <= ?",
                           (self.project_id, *agent_ids, SIGNAL_PENDING, format_ts(to_datetime(now))))
        return {row[0] for row in rows}

    def latest_delivered(self, activation_id, kind):
        """The newest signal of a kind delivered to one activation, or None."""
        row = self._query_one("SELECT * FROM signals WHERE project = ? AND delivered_activation_id = ? "
                              "AND kind = ? ORDER BY created_at DESC, rowid DESC LIMIT 1",
                              (self.project_id, activation_id, kind))
        return signal_json(row) if row else None

    def useful_effects(self, activation_id):
        """How many signals an activation emitted that count as a useful effect."""
        return self._query_one("SELECT COUNT(*) FROM signals WHERE project = ? AND source_activation = ? "
                               "AND useful_effect = 1", (self.project_id, activation_id))[0]

    def signal(self, signal_id):
        row = self._query_one("SELECT * FROM signals WHERE project = ? AND id = ?",
                              (self.project_id, signal_id))
        if row is None:
            raise NotFound(f"Unknown signal: {signal_id}")
        return signal_json(row)

    def earliest_delayed_signal(self, now=None):
        """The earliest `not_before` after `now` of the project's pending signals, or None."""
        row = self._query_one("SELECT MIN(not_before) FROM signals WHERE project = ? AND status = ? "
                              "AND not_before > ?", (self.project_id, SIGNAL_PENDING, format_ts(to_datetime(now))))
        return row[0]

    def has_pending_signals(self, now=None):
        """Any ready signal in the project."""
        return self._query_one("SELECT 1 FROM signals WHERE project = ? AND status = 'pending' "
                               "AND target_agent IS NOT NULL AND not_before <= ? LIMIT 1",
                               (self.project_id, format_ts(to_datetime(now)))) is not None

    def has_pending_signals_for_agent(self, agent_id, include_delayed=False, now=None):
        """Any ready pending signal for the agent; delayed ones count with include_delayed."""
        sql = "SELECT 1 FROM signals WHERE project = ? AND target_agent = ? AND status = 'pending'"
        params = [self.project_id, agent_id]
        if not include_delayed:
            sql += " AND not_before <= ?"
            params.append(format_ts(to_datetime(now)))
        return self._query_one(sql + " LIMIT 1", params) is not None

    def list_signals(self, target_agent=None, status=None, limit=25, kind=None):
        """Newest-first Signal JSON, optionally filtered (coordination.signals panel)."""
        if status is not None and status not in SIGNAL_STATUSES:
            raise BadRequest(f"Invalid signal status: {status}")
        sql, params = "SELECT * FROM signals WHERE project = ?", [self.project_id]
        for column, value in (("target_agent", target_agent), ("status", status), ("kind", kind)):
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        rows = self._query(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?", params + [int(limit)])
        return [signal_json(r) for r in rows]

    def signal_counts(self):
        """Signal counts grouped by (status, priority), ordered by status then priority."""
        rows = self._query("SELECT status, priority, COUNT(*) AS n FROM signals WHERE project = ? "
                           "GROUP BY status, priority ORDER BY status, priority", (self.project_id,))
        return [{"status": r["status"], "priority": r["priority"], "count": r["n"]} for r in rows]

    def signals_delivered_to(self, activation_id, kind=None):
        """Signals delivered to one activation, in delivery order."""
        sql = "SELECT * FROM signals WHERE project = ? AND delivered_activation_id = ?"
        params = [self.project_id, activation_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        return [signal_json(r) for r in self._query(sql + " ORDER BY delivered_at, rowid", params)]

    def latest_signal(self, kind, target_agent=None):
        """Newest signal of a kind (for one target when given), any status, or None."""
        sql, params = "SELECT * FROM signals WHERE project = ? AND kind = ?", [self.project_id, kind]
        if target_agent is not None:
            sql += " AND target_agent = ?"
            params.append(target_agent)
        row = self._query_one(sql + " ORDER BY created_at DESC, rowid DESC LIMIT 1", params)
        return signal_json(row) if row else None

    def deliver_signals(self, tx, agent_id, signal_ids, activation_id):
        """pending -> delivered, only for rows still pending and targeted at the agent."""
        sources, target = SIGNAL_TRANSITIONS["deliver"]
        delivered = []
        for signal_id in signal_ids:
            cursor = tx.execute(f"UPDATE signals SET status = ?, delivered_at = ?, "
                                f"delivered_activation_id = ? WHERE project = ? AND id = ? "
                                f"AND target_agent = ? AND status IN ({','.join('?' * len(sources))})",
                                (target, tx.ts, activation_id, self.project_id, signal_id, agent_id,
                                 *sources))
            if cursor.rowcount:
                delivered.append(signal_id)
        return delivered

    def mark_signals_delivered(self, agent_id, signals, activation_id, now=None):
        """Mark signals (ids or Signal JSON) delivered; returns the ids that changed."""
        ids = [s["id"] if isinstance(s, dict) else s for s in signals]
        with self.write(now) as tx:
            return self.deliver_signals(tx, agent_id, ids, activation_id)

    # -- activations -----------------------------------------------------------------------------

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
        """Checks E–F of http-api.md §9.1, plus G when running_for is "tool" or "history"."""
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
        """The running activation row and its activation.started event."""
        directory = self.activation_dir(activation_id)
        tx.execute("INSERT INTO activations (id, project, agent_id, status, prompt, input_path, "
                   "output_path, container_name, started_at, completed_at, text, error, "
                   "emitted_messages, usage_json, context_json) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, NULL, NULL, NULL, 0, NULL, NULL)",
                   (activation_id, self.project_id, agent_id, ACT_RUNNING, prompt,
                    str(directory / "input.json"), str(directory / "result.json"), tx.ts))
        self.add_event(tx, "activation.started", {"activationId": activation_id, "agentId": agent_id})

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

    def set_activation_container(self, activation_id, name, now=None):
        """Record the container (or local-<pid>) name on the activation and its agent; re-read it."""
        with self.write(now) as tx:
            row = self.activation_row(activation_id, tx.conn)
            tx.execute("UPDATE activations SET container_name = ? WHERE project = ? AND id = ?",
                       (name, self.project_id, activation_id))
            self.move_agent(tx, row["agent_id"], "container_attached", active=activation_id,
                             bound_to=activation_id, container_name=name)
            return activation_json(self.activation_row(activation_id, tx.conn))

    def end_activation(self, tx, activation_id, trigger, extra_sets, extra_params):
        sources, target = ACTIVATION_TRANSITIONS[trigger]
        cursor = tx.execute(f"UPDATE activations SET status = ?, completed_at = ?{extra_sets} "
                            f"WHERE project = ? AND id = ? AND status IN ({','.join('?' * len(sources))})",
                            (target, tx.ts, *extra_params, self.project_id, activation_id, *sources))
        if cursor.rowcount and self._observer is not None:
            ended = activation_json(self.activation_row(activation_id, tx.conn))
            tx.after_commit.append(lambda: self._observer.activation_ended(ended))
        if cursor.rowcount:
            self._cancel_approvals(tx, activation_id, f"Activation {activation_id} is {target}")  # issue 16
        return cursor.rowcount

    def _cancel_approvals(self, tx, activation_id, reason):
        """Issue 16: an activation that ends takes its pending approval requests with it."""
        rows = tx.all("SELECT id, agent_id, tool FROM approvals WHERE project = ? AND activation_id = ? "
                      "AND status = 'pending'", (self.project_id, activation_id))
        if not rows:
            return
        tx.execute("UPDATE approvals SET status = 'cancelled', decided_by = 'system', note = ?, decided_at = ? "
                   "WHERE project = ? AND activation_id = ? AND status = 'pending'",
                   (reason, tx.ts, self.project_id, activation_id))
        for row in rows:
            self.add_event(tx, "approval.cancelled", {"id": row["id"], "agentId": row["agent_id"],
                                                      "activationId": activation_id, "tool": row["tool"],
                                                      "reason": reason})

    def fail_activation(self, activation_id, error, now=None):
        """store.md §5.4. Returns the failed activation, or None when it was already terminal."""
        error = str(error)
        with self.write(now) as tx:
            row = self.activation_row(activation_id, tx.conn)
            if not self.end_activation(tx, activation_id, "fail", ", error = ?", (error,)):
                return None
            agent_id = row["agent_id"]
            self.move_agent(tx, agent_id, "activation_failed", bound_to=activation_id)
            self.add_history(tx, agent_id, activation_id, "assistant", "activation_failed",
                                 f"Activation {activation_id} failed.\n\n{error}", {"error": error})
            self.add_event(tx, "activation.failed", {"activationId": activation_id, "agentId": agent_id,
                                                  "error": error})
            return activation_json(self.activation_row(activation_id, tx.conn))

    def cancel_activation(self, activation_id, reason, now=None):
        """store.md §5.5. Returns the cancelled activation, or None when it was already terminal."""
        with self.write(now) as tx:
            return self.cancel_in(tx, activation_id, str(reason))

    def cancel_in(self, tx, activation_id, reason):
        row = self.activation_row(activation_id, tx.conn)
        if not self.end_activation(tx, activation_id, "cancel", ", error = ?", (reason,)):
            return None
        agent_id = row["agent_id"]
        self.move_agent(tx, agent_id, "activation_cancelled", bound_to=activation_id)
        self.add_history(tx, agent_id, activation_id, "assistant", "activation_cancelled",
                             f"Activation {activation_id} was interrupted and cancelled.\n\nReason: {reason}",
                             {"reason": reason})
        self.add_event(tx, "activation.cancelled", {"activationId": activation_id, "agentId": agent_id,
                                                 "reason": reason})
        return activation_json(self.activation_row(activation_id, tx.conn))

    def record_activation_context(self, activation_id, agent_id, context, now=None):
        """Store the model-context snapshot (http-api.md §9.8); a later post replaces it."""
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
        """http-api.md §6.6: public activation, prompt, and the snapshot or its fallback."""
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
        """http-api.md §6.5: the newest `limit` activations, oldest first, as public activations."""
        rows = self._query("SELECT * FROM activations WHERE project = ? ORDER BY started_at DESC, rowid DESC "
                           "LIMIT ?", (self.project_id, int(limit)))
        return [public_activation_json(r) for r in reversed(rows)]

    def running_activations(self):
        """Every running activation of the project (full records), in start order."""
        rows = self._query("SELECT * FROM activations WHERE project = ? AND status = ? "
                           "ORDER BY started_at, rowid", (self.project_id, ACT_RUNNING))
        return [activation_json(r) for r in rows]

    def agent_has_activations(self, agent_id):
        """Whether any activation row exists for the agent (first vs later prompt, scheduler.md §4.1)."""
        return self._query_one("SELECT 1 FROM activations WHERE project = ? AND agent_id = ? LIMIT 1",
                               (self.project_id, agent_id)) is not None

    def latest_failed_activation(self, agent_id):
        """The agent's most recent failed activation by started_at, or None."""
        row = self._query_one("SELECT * FROM activations WHERE project = ? AND agent_id = ? AND status = ? "
                              "ORDER BY started_at DESC, rowid DESC LIMIT 1",
                              (self.project_id, agent_id, ACT_FAILED))
        return activation_json(row) if row else None

    # -- tool calls ------------------------------------------------------------------------------

    def start_tool_call(self, agent_id, activation_id, tool, input=None, now=None, call_key=None):
        """store.md §5.6 start: running row, tool.called event, tool_call history row. A `call_key` the
        activation already used answers that call again (`replayed: True`) and records nothing (16k)."""
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
                                            "tool": tool, "status": TOOL_RUNNING})
            content = f"# Tool Call\nTool: {tool}\n\n" + json.dumps(input_value, indent=2, ensure_ascii=False)
            self.add_history(tx, agent_id, activation_id, "tool_call", "tool_call", content,
                                 {"toolCallId": call_id, "tool": tool, "status": TOOL_RUNNING},
                                 [{"type": "tool_call", "toolCallId": call_id, "toolName": tool,
                                   "inputJson": input_json}])
        return {"toolCallId": call_id}

    def _replayed_start(self, tx, activation_id, call_key, tool, input_json):
        prior = tx.one("SELECT id, tool, input_json FROM tool_calls WHERE activation_id = ? AND call_key = ?",
                       (activation_id, call_key))
        if (prior["tool"], prior["input_json"]) != (tool, input_json):
            raise Conflict(f"callKey {call_key} was already used for another tool call")
        return {"toolCallId": prior["id"], "replayed": True}

    def record_tool_result(self, tx, agent_id, activation_id, tool_call_id, status, output=None, error=None):
        """store.md §5.6 finish: the row, its tool.<status> event and the tool_result history row.
        Returns (the final status, the tool's name, replayed). The same finish asked again (status,
        output and error as recorded: a runner retrying after a lost answer) changes and records nothing
        and says `replayed`; a different one overwrites the result (tools.md §13, spec-notes 16l)."""
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
        """http-api.md §6.7 raw rows, newest first; optionally only the named tools."""
        sql, params = "SELECT * FROM tool_calls WHERE project = ?", [self.project_id]
        if tools:
            sql += f" AND tool IN ({','.join('?' * len(tools))})"
            params += list(tools)
        rows = self._query(sql + " ORDER BY created_at DESC, rowid DESC LIMIT ?", params + [int(limit)])
        return [tool_call_row_json(r) for r in rows]

    def tool_call_stats(self):
        """Per-tool counts and the newest row of each tool (http-api.md §6.8), keyed by tool name."""
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

    # -- history ---------------------------------------------------------------------------------

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
        """store.md §7.1 via the runner route; a given activation must be the agent's and running."""
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
        """store.md §7.3: unarchived rows, compaction markers first, then by sequence; with parts."""
        with self.snapshot() as conn:
            self.require_agent(agent_id, conn)
            return self.active_history_rows(conn, agent_id)

    def active_history_rows(self, conn, agent_id):
        return self._history_rows(conn, "agent_id = ? AND compaction_id IS NULL", (agent_id,),
                                  order="(role = 'compaction') DESC, sequence")

    def history_page(self, agent_id, limit=100, before=None, include_archived=True):
        """http-api.md §7.1 page: newest first, with nextBefore when the page is full."""
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
        compaction record (store.md §7.4)."""
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
        """http-api.md §7.2: {compaction, archive}; the agent segment is not matched (reference)."""
        row = self._query_one("SELECT * FROM agent_history_compactions WHERE project = ? AND id = ?",
                              (self.project_id, compaction_id))
        if row is None:
            raise NotFound(f"Unknown history compaction: {compaction_id}")
        archive = json.loads(Path(row["archive_path"]).read_text(encoding="utf-8"))
        return {"compaction": compaction_json(row), "archive": archive}

    # -- Node toolpack facade (tools.md §15.3 store.db.*) ---------------------------------------

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


    # -- timeline pages (WebUI team view; http-api.md §6.11) -----------------------------------

    def timeline_page(self, since=None, until=None, limit=500):
        """One time-range page of the team view: activations and messages in [since, until),
        newest first by start/creation until `limit` items, widened to keep equal timestamps together.
        The page's lower bound comes back as `since`; `more` says older items exist (next: until=since).
        Activations that ended inside the window, and (on the newest page) all running ones, are
        included too, so a bar that began on an older page is current; clients merge by id."""
        def newest_times(conn, table, col):
            sql, params = f"SELECT {col} AS ts FROM {table} WHERE project = ?", [self.project_id]
            if since is not None:
                sql += f" AND {col} >= ?"
                params.append(since)
            if until is not None:
                sql += f" AND {col} < ?"
                params.append(until)
            return [r["ts"] for r in conn.execute(sql + f" ORDER BY {col} DESC LIMIT ?", params + [int(limit) + 1])]

        with self.snapshot() as conn:
            # Each side walks its (project, time) index; the page's bound is the limit-th newest of both.
            newest = sorted(newest_times(conn, "activations", "started_at")
                            + newest_times(conn, "messages", "created_at"), reverse=True)[:int(limit) + 1]
            more = len(newest) > limit
            low = newest[limit - 1] if more else since
            window, window_params = "", []
            if low is not None:
                window += " AND {col} >= ?"
                window_params.append(low)
            if until is not None:
                window += " AND {col} < ?"
                window_params.append(until)

            def rows(sql, col, extra=()):
                return conn.execute(sql + window.format(col=col) + f" ORDER BY {col}, rowid",
                                    [self.project_id, *extra, *window_params])

            messages = [message_json(r) for r in rows("SELECT * FROM messages WHERE project = ?", "created_at")]
            acts = {r["id"]: r for r in rows("SELECT * FROM activations WHERE project = ?", "started_at")}
            for r in rows("SELECT * FROM activations WHERE project = ? AND completed_at IS NOT NULL",
                          "completed_at"):
                acts.setdefault(r["id"], r)
            if until is None:
                for r in conn.execute("SELECT * FROM activations WHERE project = ? AND status = ?",
                                      (self.project_id, ACT_RUNNING)):
                    acts.setdefault(r["id"], r)
            woke = {}
            ids = list(acts)
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                for r in conn.execute(
                        "SELECT * FROM signals WHERE project = ? AND delivered_activation_id IN "
                        f"({','.join('?' * len(chunk))}) ORDER BY created_at, rowid", [self.project_id, *chunk]):
                    woke.setdefault(r["delivered_activation_id"], []).append(timeline_signal(r))
            marks = [timeline_signal(r) for r in rows(
                "SELECT * FROM signals WHERE project = ? AND kind IN (?, ?)", "created_at",
                (KIND_WAIT, KIND_SUBMITTED))]
        activations = []
        for row in sorted(acts.values(), key=lambda r: (r["started_at"], r["id"])):
            item = public_activation_json(row)
            for key in ("text", "error"):
                if key in item:
                    item[key] = truncate(item[key], TIMELINE_TEXT_LIMIT)
            item["signals"] = woke.get(row["id"], [])
            activations.append(item)
        for item in messages:
            item["body"] = truncate(item["body"], TIMELINE_TEXT_LIMIT)
        return omit_none({
            "since": low, "until": until, "more": more, "activations": activations, "messages": messages,
            "waits": [m for m in marks if m["kind"] == KIND_WAIT],
            "approvals": [m for m in marks if m["kind"] == KIND_SUBMITTED]})


TIMELINE_TEXT_LIMIT = 2000


def timeline_signal(row):
    """A signal as the team view draws it: what woke an activation, a wait, or a submission."""
    payload = load_json(row["payload_json"], {})
    return omit_none({
        "id": row["id"], "kind": row["kind"], "priority": row["priority"], "sourceAgent": row["source_agent"],
        "sourceActivation": row["source_activation"], "targetAgent": row["target_agent"],
        "messageId": payload.get("id") if row["kind"] == KIND_MESSAGE else payload.get("messageId"),
        "reason": payload.get("reason"), "createdAt": row["created_at"],
        "deliveredActivationId": row["delivered_activation_id"]})


def require_running(row, purpose):
    if row["status"] != ACT_RUNNING:
        why = HISTORY_CLOSED if purpose == "history" else TOOL_CALLS_CLOSED
        raise Conflict(f"Activation {row['id']} is {row['status']}; {why}")
