"""The runtime of one Suzumio process, built in one place: build_runtime() makes the root's collaborators
(MCP hub, config cache, toolpacks, backends, reconciler, model proxy, scheduler) and, for `serve`, takes the
root's serve lock and binds its listeners (the user app with its SSE hub, the runner socket, the TLS runner
listener, the egress proxy); Runtime.start() starts them and Runtime.close() stops them in order.
Imported by suzumio.py and by the test fixtures; the heavy modules (Docker, Bottle) load only when built."""
import fcntl
import hashlib
import logging
import os
import secrets
import stat
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

import suzumio_config
import suzumio_egress
import suzumio_store
import suzumio_tls
import suzumio_warm
from suzumio_errors import Conflict, SuzumioError

log = logging.getLogger(__name__)

RUNNER_SOCKET = "runner.sock"
# sun_path holds 108 bytes on Linux and 104 on macOS, both with the terminating NUL.
UNIX_PATH_LIMIT = 103
GENERATED = object()  # Listeners.api_token: the root's token file, made on first use


def runner_socket_path(root_path):
    """Where `serve` listens for runners: <root>/run/runner.sock, or, when that path is too long for
    AF_UNIX, /tmp/suzumio-run-<sha256(root)[:16]>/runner.sock."""
    root_path = Path(os.path.abspath(root_path))
    path = root_path / suzumio_store.RUN_DIR / RUNNER_SOCKET
    if len(os.fsencode(path)) <= UNIX_PATH_LIMIT:
        return path
    digest = hashlib.sha256(os.fsencode(root_path)).hexdigest()[:16]
    return Path("/tmp") / f"suzumio-run-{digest}" / RUNNER_SOCKET


def prepare_runner_socket_dir(socket_path):
    """Create the socket's directory (mode 0755) and check it: it is bind-mounted into every container,
    so it must be ours, a real directory, and hold nothing but the socket."""
    directory = socket_path.parent
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SuzumioError(f"Runner socket directory {directory} is not a directory")
    if info.st_uid != os.getuid():
        raise SuzumioError(f"Runner socket directory {directory} belongs to another user")
    os.chmod(directory, 0o755)
    # The warm and egress sockets live beside the runner socket: runners reach them there.
    others = sorted(name for name in os.listdir(directory)
                    if name not in (socket_path.name, suzumio_warm.WARM_SOCKET, suzumio_egress.EGRESS_SOCKET))
    if others:
        raise SuzumioError(f"Runner socket directory {directory} holds other files ({', '.join(others[:3])}); "
                           "it is mounted into every container, so it may hold only the socket")
    if socket_path.exists() and not stat.S_ISSOCK(os.lstat(socket_path).st_mode):
        raise SuzumioError(f"Runner socket path {socket_path} exists and is not a socket")


def live_runner_socket(root_path):
    """The root's runner socket when one exists (a `serve` listens there), else None: activations that
    a CLI command starts then reach the controller through backend.controllerUrl."""
    path = runner_socket_path(root_path)
    try:
        return path if stat.S_ISSOCK(os.lstat(path).st_mode) else None
    except OSError:
        return None


def api_token_path(root_path):
    return Path(root_path) / suzumio_store.API_TOKEN_FILE


def read_api_token(root_path):
    """The token `serve` keeps in <root>/api-token (for HTTP clients on this machine), or None."""
    try:
        return api_token_path(root_path).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def root_api_token(root_path):
    """The token in <root>/api-token (kept mode 0600), or a new one written there."""
    path = api_token_path(root_path)
    token = read_api_token(root_path)
    if token:
        os.chmod(path, 0o600)
        return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(token + "\n")
    return token


class ServeLock:
    """One `serve` per root: an exclusive flock on <root>/serve.lock, held for the process's lifetime (the
    kernel drops it when the process ends, however it ends, so a killed serve never blocks the next).
    The file names the holder's process id and, once it listens, its address; it is never removed, so a
    second serve never takes a lock file from under the first."""

    def __init__(self, fd, path):
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, root_path):
        """The root's lock, or Conflict naming the serve that holds it."""
        path = Path(root_path) / suzumio_store.SERVE_LOCK_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        # Close-on-exec: a local runner that outlives this serve must not keep the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").split()
            os.close(fd)
            pid = holder[0] if holder else "unknown"
            address = holder[1] if len(holder) > 1 else "not listening yet"
            raise Conflict(f"another suzumio serve (process {pid}, {address}) holds the root "
                           f"{Path(root_path)}; stop it first or use another --root") from None
        lock = cls(fd, path)
        lock.record()
        return lock

    def record(self, address=None):
        """Write `<pid> [<address>]` into the lock file."""
        if self._fd is None:
            return
        text = f"{os.getpid()}" + (f" {address}" if address else "") + "\n"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode("utf-8"), 0)

    def release(self):
        """Let go of the lock (idempotent); the file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file releases the flock


def serve_holder(root_path):
    """(pid, address or None) of the live `serve` holding the root's lock, else None."""
    path = Path(root_path) / suzumio_store.SERVE_LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").split()
            return (holder[0] if holder else "unknown", holder[1] if len(holder) > 1 else None)
        return None
    finally:
        os.close(fd)


class Liveness:
    """The long-lived loops of `serve` (HTTP, scheduler, reconciler). A loop that dies reports here;
    the first death ends the process with exit code 1, so a supervisor restarts it and the restarted
    controller adopts the runners. /health names the state of each loop meanwhile."""

    def __init__(self, components):
        self._states = dict.fromkeys(components, "up")
        self.dead = threading.Event()

    def died(self, component, error):
        self._states[component] = f"down: {type(error).__name__}: {error}"
        self.dead.set()

    def states(self):
        return dict(self._states)

    def down(self):
        """`name state, …` of the loops that died."""
        return ", ".join(f"{name} {state}" for name, state in self._states.items() if state != "up")


@dataclass(frozen=True)
class Listeners:
    """What `serve` listens on (docs/cli.md): the user listener on host:port, the runner socket always,
    and with `runner_listen` (host, port) a TLS runner listener, its certificate `runner_tls` (a
    suzumio_tls.RunnerTls; None: the root's generated one). `api_token`: GENERATED (the root's token
    file), None (`--no-auth`) or the token. `reconcile`: run the reconciler (test fixtures leave it off);
    `app_options` go to suzumio_api.make_app (tests shorten its polls); `resolver` is the egress proxy's
    name resolution."""

    host: str = "127.0.0.1"
    port: int = 0
    threads: int = 32
    api_token: object = GENERATED
    allowed_hosts: tuple = ()
    runner_listen: tuple | None = None
    runner_tls: object = None
    connection_limit: int | None = None
    reconcile: bool = True
    resolver: object = suzumio_egress.resolve
    app_options: dict = field(default_factory=dict)
    # Where the egress proxy reads credentials (None: the controller's environment, at request time) and
    # the authorities it verifies credentialed hosts against (None: the system's); tests set both.
    egress_environ: object = None
    egress_cafile: str | None = None


@dataclass(frozen=True)
class RuntimeOptions:
    """How to build a runtime. Without `listeners` it is a CLI command's: no lock, no listener, runners
    reach a live `serve`'s socket if there is one, and start() starts nothing; with them it is `serve`'s.
    `scheduler`: start() starts the scheduler thread (every `scheduler_interval` seconds, else its
    default); `warm`: prepared runners; `tracer`: the root's observer and the runner routes' spans;
    `model_proxy` and `mcp` replace the defaults (one over the controller's environment, a new McpHub)."""

    root: object
    listeners: Listeners | None = None
    scheduler: bool = False
    scheduler_interval: float | None = None
    warm: int = 0
    max_activations: int | None = None
    tracer: object = None
    model_proxy: object = None
    mcp: object = None
    # serve's eval thread (docs/evals.md): runs the root's evals as ordinary projects, after the scheduler.
    evals: bool = False


class Runtime:
    """The collaborators of one process (see build_runtime). Attributes: root, mcp, configs, toolpacks,
    backends, reconciler, model_proxy, scheduler, liveness; for `serve` also lock, api_token, runner_socket,
    app, runner_app, server, runner_server, tls_server (or None) and egress."""

    def __init__(self, options):
        self.options = options
        self.lock = None
        self.server = self.runner_server = self.tls_server = self.egress = None
        self.app = self.runner_app = None
        self.evals = None
        self.api_token = None
        self.runner_socket = None
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def servers(self):
        """The HTTP listeners, user listener first."""
        return [server for server in (self.server, self.tls_server, self.runner_server) if server is not None]

    def start(self):
        """Start the listeners, the runner side before the user side (an activation a user starts finds its
        runner listener open), the egress proxy, the tracer, the reconciler and the scheduler. Returns self."""
        listeners = self.options.listeners
        for server in (self.runner_server, self.tls_server):
            if server is not None:
                server.start()
        if self.egress is not None:
            self.egress.start()
        tracer = self.options.tracer
        if tracer is not None and tracer.enabled:
            tracer.start()
        if self.server is not None:
            self.server.start()
            self.lock.record(self.address)
        if listeners is not None and listeners.reconcile:
            self.reconciler.start_reconciling(lambda: open_stores(self.root), on_fatal=self.liveness.died)
        if self.options.scheduler:
            self.scheduler.start()
        if self.evals is not None:
            self.evals.start()
        return self

    @property
    def address(self):
        """The user listener's base URL."""
        return f"http://{url_host(self.options.listeners.host)}:{self.server.port}"

    def close(self):
        """Stop in the order of docs/design/README.md (idempotent): HTTP listeners and the egress proxy,
        the scheduler, the backend watchers, the Node host and MCP sessions, the stores, the tracer (after
        the runtime: the last activation spans are exported), and last the root's serve lock. Runners
        keep going: the next serve adopts them."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for server in self.servers:
            server.close()
        if self.egress is not None:
            self.egress.close()
        if self.evals is not None:
            self.evals.close()
        self.scheduler.stop()
        self.reconciler.close()
        self.backends.close()
        self.toolpacks.close()
        self.root.close()
        if self.options.tracer is not None:
            self.options.tracer.close()
        if self.lock is not None:
            self.lock.release()


def url_host(host):
    return f"[{host}]" if ":" in host else host


def open_stores(root):
    """The stores of every project in the root, skipping one removed between listing and opening."""
    stores = []
    for name in root.list_projects():
        try:
            stores.append(root.open_project(name))
        except SuzumioError as error:
            log.warning("project %s skipped: %s", name, error)
    return stores


def build_runtime(options):
    """The runtime of `options` (a RuntimeOptions; `options.root` a path), built but not started. For
    `serve` the root's lock comes first: nothing of a serve that already holds the root (its socket, its
    certificate, its published CA) is touched when the lock is refused (Conflict)."""
    listeners = options.listeners
    path = Path(os.path.abspath(options.root))
    lock = ServeLock.acquire(path) if listeners is not None else None
    try:
        return _build(options, path, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build(options, path, lock):
    import suzumio_backend
    import suzumio_backend_reconcile
    import suzumio_mcp
    import suzumio_model_proxy
    import suzumio_scheduler
    import suzumio_toolpacks

    listeners = options.listeners
    runtime = Runtime(options)
    runtime.lock = lock
    runtime.root = suzumio_store.Root(path, observer=options.tracer)
    controller_ca = None
    if listeners is None:
        # A CLI command's runners reach a live serve's socket, or its TLS listener with the CA it published.
        runtime.runner_socket = live_runner_socket(path)
        controller_ca = suzumio_tls.published_ca(path)
    else:
        runtime.runner_socket = runner_socket_path(path)
        # Served with --runner-listen too: docker-chat runners reach the controller only there.
        prepare_runner_socket_dir(runtime.runner_socket)
        runtime.api_token = root_api_token(path) if listeners.api_token == GENERATED else listeners.api_token
        if listeners.runner_listen is not None:
            tls = listeners.runner_tls or suzumio_tls.generated_tls(path, listeners.runner_listen[0])
            listeners = replace(listeners, runner_tls=tls)
            suzumio_tls.publish_ca(path, tls.ca_pem)
            controller_ca = tls.ca_pem
        else:
            # CLI commands' runners would take it for a TLS listener that no longer runs.
            suzumio_tls.unpublish_ca(path)
    components = (["http", "runner-http", "reconciler"] + (["scheduler"] if options.scheduler else [])
                  + (["evals"] if options.evals else []))
    runtime.liveness = Liveness(components)
    on_fatal = runtime.liveness.died if listeners is not None else None
    runtime.mcp = options.mcp if options.mcp is not None else suzumio_mcp.McpHub()
    # The one ConfigCache of the process: ticks, routes and toolpacks read the same ProjectConfig.
    runtime.configs = suzumio_config.ConfigCache(mcp_tools=runtime.mcp.listing)
    runtime.toolpacks = suzumio_toolpacks.ToolpackRuntime(runtime.configs, mcp=runtime.mcp)
    # Prepared runners only in serve: a CLI command's process ends before one is claimed.
    runtime.backends = suzumio_backend.Backends(runner_socket=runtime.runner_socket,
                                                warm_limit=options.warm if listeners is not None else 0,
                                                configs=runtime.configs, controller_ca=controller_ca)
    runtime.reconciler = suzumio_backend_reconcile.Reconciler(runtime.backends)
    # The model keys stay in this process.
    runtime.model_proxy = options.model_proxy or suzumio_model_proxy.ModelProxy(os.environ)
    interval = {} if options.scheduler_interval is None else {"interval": options.scheduler_interval}
    runtime.scheduler = suzumio_scheduler.Scheduler(runtime.root, runtime.backends, runtime.configs,
                                                    hooks=runtime.toolpacks, on_fatal=on_fatal,
                                                    max_activations=options.max_activations, **interval)
    if options.evals:
        import suzumio_eval_runner

        runtime.evals = suzumio_eval_runner.EvalRunner(runtime.root, runtime.scheduler, runtime.model_proxy,
                                                       on_fatal=on_fatal)
    if listeners is not None:
        try:
            _bind_listeners(runtime, listeners)
        except BaseException:
            runtime.close()
            raise
    return runtime


def _bind_listeners(runtime, listeners):
    """The user app (with its SSE hub) and the runner app, bound to their sockets, and the egress proxy on
    the socket beside the runner socket; nothing is started."""
    import suzumio_api
    import suzumio_runner_support

    liveness = runtime.liveness
    app_options = {"api_token": runtime.api_token, "allowed_hosts": listeners.allowed_hosts,
                   "bound_host": listeners.host, "liveness": liveness.states,
                   "evals": runtime.evals.store if runtime.evals is not None else None, **listeners.app_options}
    runtime.app = suzumio_api.make_app(runtime.root, runtime.scheduler, runtime.backends, runtime.toolpacks,
                                       **app_options)
    runtime.runner_app = suzumio_runner_support.make_runner_app(runtime.root, runtime.toolpacks, runtime.scheduler,
                                                                runtime.model_proxy, runtime.options.tracer)

    def runner_died(_component, error):
        liveness.died("runner-http", error)

    common = {"threads": listeners.threads,
              "connection_limit": listeners.connection_limit or suzumio_api.CONNECTION_LIMIT}
    runtime.runner_server = suzumio_api.Server(runtime.runner_app, on_fatal=runner_died,
                                               unix_socket=runtime.runner_socket, name="suzumio-runner-http",
                                               **common)
    egress_socket = runtime.runner_socket.parent / suzumio_egress.EGRESS_SOCKET
    if listeners.runner_listen is not None:
        # Its egress tunnels (ALPN) go to the same proxy socket as the runner socket's neighbours.
        host, port = listeners.runner_listen
        runtime.tls_server = suzumio_tls.TlsRunnerListener(runtime.runner_app, host, port, listeners.runner_tls,
                                                           egress_socket=egress_socket, on_fatal=runner_died,
                                                           name="suzumio-runner-tls-http", **common)
    runtime.server = suzumio_api.Server(runtime.app, listeners.host, listeners.port, on_fatal=liveness.died,
                                        **common)
    # The controller's own listeners are never a destination, whatever an allowlist says.
    own = [(listeners.host, runtime.server.port)]
    if runtime.tls_server is not None:
        own.append((listeners.runner_listen[0], runtime.tls_server.port))
    runtime.egress = suzumio_egress.EgressProxy(runtime.root, runtime.configs, resolver=listeners.resolver,
                                                own_listeners=lambda: own, environ=listeners.egress_environ,
                                                upstream_cafile=listeners.egress_cafile)
    runtime.egress.listen_unix(egress_socket)
