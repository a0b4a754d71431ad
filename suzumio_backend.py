"""The backends' facade: Backends starts, follows and stops activations' runners through the Backend
(suzumio_backend_contract) of each kind, which BACKENDS, the one table of kinds, maps to its class; the
launch request and input.json every backend gets; the watcher threads, settling an ended runner's
activation, the artifact quota, timeouts. Each backend lives in its own module (suzumio_backend_local,
suzumio_backend_docker, suzumio_backend_swarm); reconciling what runs with the store is
suzumio_backend_reconcile's."""
import copy
import datetime
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

import suzumio_config
import suzumio_coordination as coordination
import suzumio_egress
import suzumio_egress_tls
import suzumio_prompts
import suzumio_recorder
import suzumio_registry
import suzumio_repository
import suzumio_warm
from suzumio_backend_contract import KIND_DOCKER, KIND_LOCAL, KIND_SWARM, redact
from suzumio_backend_docker import (  # noqa: F401 - names tests and benches read here
    CONTAINER_RUN_DIR,
    ENGINE_UNREACHABLE_ERROR,
    WARM_MARK,
    DockerBackend,
    container_activation,
    container_name_for,
    failure_text,
    safe_name,
    validate_mount,
    warm_owner,
)
from suzumio_backend_local import LOCAL_PREFIX, LocalBackend, digest, local_pid, runner_marker  # noqa: F401
from suzumio_backend_swarm import SWARM_NEEDS_LISTENER, SwarmBackend  # noqa: F401 - the message, for tests
from suzumio_docker import UNPRIVILEGED_IDS, container_user, engine_errors, numeric_ids  # noqa: F401
from suzumio_records import ACT_RUNNING, AGENT_STOPPED, PROJECT_RUNNING, parse_ts
from suzumio_resources import resource_path

log = logging.getLogger(__name__)

SUPPORT_DIR = Path(__file__).resolve().parent
RUNNER_FILE = "suzumio_runner.py"
HOST_FILE = "suzumio_toolpack_host.mjs"
# Everything the runner needs, mounted read-only under /opt/suzumio (docs/design/runner.md). The entry
# script stays small and imports the rest from modules beside it, which get a bytecode cache where
# the directory is writable (docs/spec-notes.md#several-standard-library-files-started-with--s).
RUNNER_FILES = (RUNNER_FILE, "suzumio_runner_loop.py", "suzumio_runner_tools.py", "suzumio_runner_models.py",
                HOST_FILE, "suzumio_runner_mcp.py", "suzumio_runner_egress.py", "suzumio_runner_files.py",
                "suzumio_runner_calls.py")

SECRET_NAME = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|password")
QUOTA_POLL_SECONDS = 1.0  # how often a running activation's artifacts folder is measured
NEVER_STARTED_GRACE_MS = 60_000
RECONCILE_INTERVAL_SECONDS = 60.0
CLOSE_GRACE_SECONDS = 5.0

NO_OUTPUT_ERROR = "Runner exited without submitting activation output"
TIMEOUT_ERROR = "activation timed out"
NEVER_STARTED_ERROR = "Runner container was never started (controller restarted)"


# ---------------------------------------------------------------- small shared helpers

def is_timed_out(activation, timeout_ms, now):
    """True when a running activation has reached started_at + timeout."""
    started = parse_ts(activation["startedAt"])
    return started + datetime.timedelta(milliseconds=timeout_ms) <= now


def runner_controller_url(kind, runner_socket, configured_url):
    """The `controllerUrl` of input.json: the runner socket when the controller serves one (inside a
    container under CONTAINER_RUN_DIR, for a host runner its real path), else `backend.controllerUrl`
    (serve --runner-listen), with host.docker.internal made 127.0.0.1 for host runners."""
    backend = backend_class(kind)
    if runner_socket is not None:
        if backend.socket_dir is not None:
            return f"unix://{backend.socket_dir}/{Path(runner_socket).name}"
        return f"unix://{os.path.abspath(runner_socket)}"
    return configured_url if backend.container else local_controller_url(configured_url)


def runner_egress_url(kind, runner_socket, controller_url):
    """Where the runner's forwarder reaches the egress proxy: its socket beside the runner socket, or
    (a TLS runner listener) `tls://` to the host and port of the runner's https controllerUrl, where
    the listener hands a connection offering the egress ALPN protocol to the proxy; None otherwise."""
    if runner_socket is not None:
        path = Path(runner_socket).parent / suzumio_egress.EGRESS_SOCKET
        socket_dir = backend_class(kind).socket_dir
        return f"unix://{socket_dir}/{path.name}" if socket_dir is not None else f"unix://{os.path.abspath(path)}"
    parts = urllib.parse.urlsplit(controller_url)
    if parts.scheme != "https" or not parts.hostname:
        return None
    return f"tls://{parts.netloc.rpartition('@')[2]}" if parts.port else f"tls://{parts.netloc}:443"


def tls_url(url):
    """The TCP runner listener speaks only TLS: an `http://` controllerUrl names it as `https://`."""
    return "https://" + url[len("http://"):] if url.startswith("http://") else url


def local_controller_url(url):
    """The controller URL for a host runner: host.docker.internal becomes 127.0.0.1."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname != "host.docker.internal":
        return url
    netloc = parts.netloc.replace("host.docker.internal", "127.0.0.1")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def activation_env(config, agent, activation_id, environ, rewrite_proxy):
    """The activation's environment (docs/design/runner.md#what-the-runner-is-given), in order; a later
    name replaces an earlier one. No provider variable: model requests go through the controller, which
    reads the keys from its own environment (docs/spec-notes.md#model-requests-go-through-the-controller)."""
    env = {
        "SUZUMIO_PROJECT": config.name,
        "SUZUMIO_AGENT": agent["id"],
        "SUZUMIO_ACTIVATION": activation_id,
        "SUZUMIO_TOKEN": agent["token"],
    }
    env.update(config.proxy_environment(environ, rewrite_hosts=rewrite_proxy))
    env["PYTHONUNBUFFERED"] = "1"
    env.update({str(k): str(v) for k, v in config.agent(agent["id"]).env.items()})
    return env


def secret_values(config, agent, environ):
    """Values replaced by <redacted> in stored failure text (docs/design/runner.md), longest first.
    `environ` is the controller's environment, where the `apiKeyEnv` keys live."""
    found = [agent.get("token")]

    def secret_headers(headers, options):
        merged = dict(headers or {})
        merged.update(((options or {}).get("headers")) or {})
        return [v for k, v in merged.items() if SECRET_NAME.search(str(k))]

    for provider in config.runner.providers.values():
        found += [provider.api_key, (provider.options or {}).get("apiKey")]
        if provider.api_key_env:
            found.append(environ.get(provider.api_key_env))
        found += secret_headers(provider.headers, provider.options)
    for preset in config.runner.presets.values():
        found += secret_headers(preset.headers, preset.provider_options)
    found += [v for k, v in config.agent(agent["id"]).env.items() if SECRET_NAME.search(k)]
    return sorted({v for v in found if isinstance(v, str) and v}, key=len, reverse=True)


# What input.json keeps of a provider: the runner builds request bodies, replays scripts and retries,
# but the controller resolves base URLs, keys, headers and query parameters when it forwards.
RUNNER_PROVIDER_FIELDS = ("type", "timeoutMs", "chunkTimeoutMs", "script")
RUNNER_PROVIDER_OPTIONS = ("maxRetries",)


def runner_section(config):
    """`backend.runner` as input.json carries it (docs/design/runner.md) without any credential: no
    `apiKey`, `apiKeyEnv`, `baseURL`, `baseURLEnv` or headers, and of the provider options only those
    the runner applies itself."""
    runner = config.runner.as_json()
    models = runner.get("models")
    if not isinstance(models, dict):
        return runner
    providers = {}
    for provider_id, provider in (models.get("providers") or {}).items():
        kept = {key: provider[key] for key in RUNNER_PROVIDER_FIELDS if key in provider}
        options = {key: value for key, value in (provider.get("options") or {}).items()
                   if key in RUNNER_PROVIDER_OPTIONS}
        if options:
            kept["options"] = options
        providers[provider_id] = kept
    models["providers"] = providers
    models["presets"] = {preset_id: {key: value for key, value in preset.items() if key != "headers"}
                         for preset_id, preset in (models.get("presets") or {}).items()}
    return runner


def exit_failure_text(code, logs):
    return f"Runner exited with {code}\n{logs}".strip()


def write_private_json(path, data):
    """Write JSON (2-space indent + newline) to a file that is mode 0600 from its creation."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def make_private_dir(path):
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


# ---------------------------------------------------------------- runner toolpack specs

MCP_SUPPORT_MODULE = "support:"  # runner-input marker: every tool of the toolpack spec is a support-route call
MCP_SANDBOX_MODULE = "mcp-stdio:"  # runner-input marker: the runner starts this MCP server itself

def _definition(tool, config, agent):
    """The tool's runner-input definition; messages.send without its `channel` field for an agent that does
    not lead the work, to which the system message describes no channels (suzumio_prompts)."""
    definition = tool.definition()
    team = [{"id": agent_id} for agent_id in config.agent_ids]
    if tool.name == suzumio_prompts.SEND and not suzumio_prompts.leads(agent["id"], team, config):
        schema = copy.deepcopy(definition["inputSchema"])
        schema.get("properties", {}).pop("channel", None)
        definition = dict(definition, inputSchema=schema)
    return definition


def runner_toolpack_specs(config, agent, kind):
    """Toolpacks with >=1 tool allowed for the agent, only the allowed tools (docs/design/runner.md).
    Returns (specs, [(safe id, host root)] of the local toolpacks to mount on docker-chat)."""
    patterns = agent.get("tools") or []
    specs, mounts = [], []
    for pack in config.resolve_toolpacks().toolpacks:
        if pack.kind == "mcp" and pack.mcp_where == "runner":
            # The runner starts the server in the sandbox and lists its tools there.
            allow = [p for p in patterns if suzumio_registry.reaches_toolpack(p, pack.id)]
            if allow:
                mcp = {key: value for key, value in pack.mcp.items() if key in ("command", "env", "cwd")}
                specs.append({"id": pack.id, "tools": [], "runnerModule": MCP_SANDBOX_MODULE, "mcp": mcp,
                              "allow": allow, "supportPath": pack.support_path})
            continue
        allowed = [tool for tool in pack.tools if suzumio_registry.is_allowed(tool.name, patterns)]
        if not allowed:
            continue
        spec = {"id": pack.id, "tools": [_definition(tool, config, agent) for tool in allowed]}
        if pack.kind == "mcp":
            # The controller owns the session: every call goes to the support route.
            spec["runnerModule"] = MCP_SUPPORT_MODULE
            spec["supportPath"] = pack.support_path
            specs.append(spec)
            continue
        if pack.builtin:
            spec["runnerModule"] = pack.runner_module_ref
        else:
            spec["runnerModule"], mount = backend_class(kind).local_toolpack(pack)
            mounts += [mount] if mount else []
        if not pack.builtin:
            spec["declaredTools"] = pack.tool_names
        spec["supportPath"] = pack.support_path
        specs.append(spec)
    return specs, mounts


# ---------------------------------------------------------------- one launch request

def activation_paths(kind, project_dir, workspace):
    """(workspace, artifacts root) as the runner sees them (docs/design/runner.md)."""
    if backend_class(kind).container:
        return "/workspace", "/artifacts"
    return os.path.realpath(workspace), os.path.realpath(Path(project_dir) / "artifacts")


class Launch:
    """Everything one backend needs to start one activation, prepared by Backends.start."""

    def __init__(self, store, config, activation, agent, support_dir, environ, runner_socket=None,
                 controller_ca=None):
        self.store = store
        self.kind = config.backend.kind
        # A docker-chat runner reaches the controller over the bind-mounted runner socket, so its
        # container gets `none` (DockerBackend.network_mode) and goes out through the egress proxy. A
        # swarm task cannot mount it, and a local runner keeps the TLS runner listener when there is
        # one (`controller_ca`, PEM, that runners verify it against).
        backend = backend_class(self.kind)
        use_socket = backend.socket_dir is not None or (backend.listener_required is None and controller_ca is None)
        self.runner_socket = runner_socket if use_socket else None
        # Only without any serve of the root (a CLI command's activation; serve always serves the
        # socket): the runner can then only try backend.controllerUrl, and no tool runs before the
        # controller answers it.
        self.controller_over_network = backend.socket_dir is not None and runner_socket is None
        self.controller_ca = None if self.runner_socket is not None else controller_ca
        self.config = config
        self.activation = activation
        self.agent = agent
        self.support_dir = Path(support_dir)
        self.project = config.name
        self.project_dir = Path(store.dir)
        self.workspace = Path(agent["workspacePath"])
        self.artifacts = store.artifacts_root
        self.secrets = secret_values(config, agent, environ)
        self.toolpack_mounts = []
        self.data = None  # input.json as written
        if activation is None:  # a prepared runner: the activation comes with its claim
            self.activation_dir = self.input_path = None
            self.env = {}
            self.toolpack_mounts = runner_toolpack_specs(config, agent, self.kind)[1]
            return
        self.activation_dir = store.activation_dir(activation["id"])
        self.input_path = self.activation_dir / "input.json"
        self.env = activation_env(config, agent, activation["id"], environ,
                                  rewrite_proxy=backend_class(self.kind).container)

    @property
    def activation_id(self):
        return self.activation["id"]

    def config_digest(self):
        """What identifies the configuration a prepared runner was made for: the stored config and the
        local toolpack manifests (any change makes prepared runners stale)."""
        return digest([self.store.config(), suzumio_config.manifest_stamps(self.config)])

    def runner_files(self, names=RUNNER_FILES):
        """The runner's files (or those of `names`), or `Runner file not found: <path>`."""
        paths = [self.support_dir / name for name in names]
        if self.support_dir == SUPPORT_DIR:  # a wheel installs the Node host under <prefix>/share/suzumio
            paths = [path if path.is_file() else resource_path(path.name) for path in paths]
        for path in paths:
            if not path.is_file():
                raise FileNotFoundError(f"Runner file not found: {path}")
        return paths

    def system_prompt(self, specs, workspace, artifacts_root):
        """The system message of this agent's activations (suzumio_prompts)."""
        mounts = [(mount.target, mount.readonly is False, mount.description)
                  for mount in self.config.mounts_for(self.agent["id"])] if backend_class(self.kind).container else []
        return suzumio_prompts.system_prompt(
            task=self.store.project()["task"], agent=self.agent, agents=self.store.list_agents(),
            config=self.config, tools=[tool["name"] for spec in specs for tool in spec["tools"]],
            workspace=workspace, artifacts_root=artifacts_root, mounts=mounts)

    def input_data(self):
        """The fields of docs/design/runner.md, in table order."""
        agent = self.agent
        specs, self.toolpack_mounts = runner_toolpack_specs(self.config, agent, self.kind)
        workspace, artifacts_root = activation_paths(self.kind, self.project_dir, self.workspace)
        controller_url = runner_controller_url(self.kind, self.runner_socket, self.config.backend.controller_url)
        if self.controller_ca is not None:
            controller_url = tls_url(controller_url)
        container = backend_class(self.kind).container
        read_roots = ["/workspace", "/artifacts", "/mnt"] if container else [workspace, artifacts_root]
        agent_part = {"id": agent["id"], "displayName": agent["displayName"], "role": agent["role"],
                      "prompt": agent.get("prompt") or ""}
        if agent.get("model"):
            agent_part["model"] = agent["model"]
        history = self.store.active_history(agent["id"])
        activation = {"id": self.activation_id, "prompt": self.activation["prompt"],
                      "system": self.system_prompt(specs, workspace, artifacts_root)}
        for row in history:
            if row["activationId"] == self.activation_id and row["kind"] == "activation_prompt" \
                    and row["metadata"].get("reminder"):
                activation["reminder"] = row["metadata"]["reminder"]
        data = {
            "project": self.project,
            "agent": agent_part,
            "activation": activation,
            "workspace": workspace,
            "artifactsRoot": artifacts_root,
            "readRoots": read_roots,
            "writeRoots": [workspace, f"{artifacts_root}/{agent['id']}"],
            "controllerUrl": controller_url,
            "egress": runner_egress_url(self.kind, self.runner_socket, controller_url),
            "token": agent["token"],
            "runner": runner_section(self.config),
            "tools": [tool for spec in specs for tool in spec["tools"]],
            "toolpacks": specs,
            "history": history,
        }
        if self.controller_ca is not None:
            data["controllerCa"] = self.controller_ca
        if any(rule.intercepted for rule in self.config.egress(agent["id"]).hosts):
            # The CA the egress proxy ends the agent's TLS with, for the sandbox's trust store only.
            data["egressCa"] = suzumio_egress_tls.project_ca_pem(self.project_dir.parent, self.project)
        data.update(backend_class(self.kind).input_fields(self.config))
        return data


# ---------------------------------------------------------------- the artifact quota

def folder_bytes(folder):
    """Bytes of the files under `folder` (links not followed; files vanishing meanwhile skipped)."""
    total = 0
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                continue
    return total


def format_size(size):
    """2147483648 -> "2.0 GiB"; under 1 KiB, bytes."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


# ---------------------------------------------------------------- the facade the scheduler uses

class Backends:
    """Starts, follows and stops activations' runners through the Backend of each kind (BACKENDS): by
    `backend.kind` at start, and afterwards by the backend that owns the recorded name. Reconciling what
    runs against the store is suzumio_backend_reconcile's Reconciler, through this object's methods."""

    def __init__(self, support_dir=SUPPORT_DIR, docker_client=None, environ=None, runner_socket=None,
                 warm_limit=0, configs=None, controller_ca=None, implementations=None):
        """`runner_socket`: the path of the controller's runner socket, which docker-chat runners always
        reach and local ones unless there is a TLS runner listener (`controller_ca`, its PEM CA, given to
        the runners that reach it through `backend.controllerUrl`: swarm tasks, and local runners);
        None when no serve of this root runs. `warm_limit`: how many prepared runners this process may
        hold (0, no runner socket, or a TLS listener: none, every activation starts cold); `configs`:
        the runtime's ConfigCache (serve shares its one; a CLI command's or a test's Backends keep their
        own). `implementations`: {kind: callable(host) -> Backend} over BACKENDS (a test's FakeBackend)."""
        self.controller_ca = controller_ca
        self.configs = configs if configs is not None else suzumio_config.ConfigCache()
        self.support_dir = Path(support_dir)
        self.runner_socket = None if runner_socket is None else Path(runner_socket)
        self.environ = dict(os.environ if environ is None else environ)
        self.docker_client = docker_client
        self._backends = {kind: make(self) for kind, make in {**BACKENDS, **(implementations or {})}.items()}
        self.local, self.docker, self.swarm = map(self._backends.get, (KIND_LOCAL, KIND_DOCKER, KIND_SWARM))
        self._lock = threading.Lock()
        self._watched = set()
        self._starting = set()
        self._threads = []
        self.closed = threading.Event()  # set by close(): the watchers and the reconciler end
        self.warm = None
        # Not with a TLS runner listener: a prepared local runner would be made for the runner socket.
        if warm_limit and self.runner_socket is not None and controller_ca is None:
            self.warm = suzumio_warm.WarmPool(self, self.runner_socket, warm_limit, self.configs).start()

    def backend(self, kind):
        """The Backend that runs `kind`'s activations."""
        return self._backends[kind]

    def backend_of(self, name):
        """The Backend whose runner a recorded name names."""
        for backend in self._backends.values():
            if backend.owns(name):
                return backend
        raise ValueError(f"no backend runs {name}")

    def backends(self):
        return list(self._backends.values())

    def secrets(self, config, agent):
        """The values a kept log or a stored failure text of the agent's runners must not show."""
        return secret_values(config, agent, self.environ)

    # -- warm activations

    def prepare_next(self, store):
        """The scheduler ticked this project: prepare the runners of its likely next activations (or
        remove them when it no longer runs); a no-op without a warm pool."""
        if self.warm is not None:
            self.warm.hint(store)

    def wanted(self, store, configs=None):
        """For WarmPool: [(agent, kind, fingerprint, config)] of the agents whose next activation should
        have a prepared runner, best first: agents with pending signals, then the most recently active,
        up to backend.warm of them; [] for a project that is not running or has warm runners off."""
        if store.project()["status"] != PROJECT_RUNNING:
            return []
        config = (configs or self.configs).get(store)
        count = config.backend.warm
        backend = self.backend(config.backend.kind)
        if not count or not backend.prepares:
            return []
        agents = [a for a in store.list_agents(include_tokens=True) if a["status"] != AGENT_STOPPED]
        agents.sort(key=lambda a: (store.has_pending_signals_for_agent(a["id"], include_delayed=True),
                                   a.get("updatedAt") or ""), reverse=True)
        agent_ids = store.agent_ids()
        wanted = []
        for agent in agents[:count]:
            launch = Launch(store, config, None, agent, self.support_dir, self.environ, self.runner_socket)
            fingerprint = backend.fingerprint(launch, agent_ids)
            if fingerprint is None:
                return []
            wanted.append((agent, launch.kind, fingerprint, config))
        return wanted

    def prepare(self, store, config, agent, slot):
        """For WarmPool: create and start the container, or spawn the process, of `slot`."""
        launch = Launch(store, config, None, agent, self.support_dir, self.environ, self.runner_socket)
        self.backend(launch.kind).prepare(store, launch, slot, self.warm.path)

    def discard(self, slot):
        """For WarmPool: remove a prepared runner no activation will use."""
        self.backend(slot.kind).discard(slot)

    def _take(self, store, launch, backend):
        """A prepared runner for this launch, taken from the pool, or None (start cold)."""
        if self.warm is None or not backend.prepares:
            return None
        fingerprint = backend.fingerprint(launch, launch.agent_ids)
        if fingerprint is None:
            return None
        return self.warm.take(store.project_id, launch.agent["id"], launch.kind, fingerprint)

    # -- start

    def start(self, store, activation_id, config=None):
        """Start one activation created by the scheduler (`config`: the tick's ProjectConfig, else rebuilt
        from the store); any failure fails the activation."""
        with self._mark(self._starting, activation_id):
            try:
                self._start(store, activation_id, config)
            except Exception as error:  # noqa: BLE001 - the start boundary: every failure fails the activation
                log.warning("activation %s failed to start: %s", activation_id, error)
                coordination.fail_activation(store, activation_id, failure_text(error))

    def _start(self, store, activation_id, config):
        activation = store.activation(activation_id)
        agent = store.agent(activation["agentId"], include_token=True)
        config = config or self.configs.get(store)
        backend = self.backend(config.backend.kind)
        if backend.listener_required and self.controller_ca is None:
            raise ValueError(backend.listener_required)
        suzumio_repository.start_working_copy(store, config, activation)
        launch = Launch(store, config, activation, agent, self.support_dir, self.environ, self.runner_socket,
                        self.controller_ca)
        launch.agent_ids = store.agent_ids()
        make_private_dir(store.activations_root)
        make_private_dir(launch.activation_dir)
        launch.data = launch.input_data()
        write_private_json(launch.input_path, launch.data)
        for other in launch.agent_ids:
            store.artifacts_dir(other).mkdir(parents=True, exist_ok=True)
        backend.start(store, launch, self._take(store, launch, backend))

    # -- monitors

    @contextmanager
    def _mark(self, group, activation_id):
        with self._lock:
            group.add(activation_id)
        try:
            yield
        finally:
            with self._lock:
                group.discard(activation_id)

    def follow(self, store, activation_id, name, secrets):
        """Wait for the runner `name` of an activation on a watcher thread, then settle the activation
        and let its backend release what the runner held."""
        self.watch(self._follow, store, activation_id, name, secrets)

    def _follow(self, store, activation_id, name, secrets):
        backend = self.backend_of(name)
        ended = backend.wait(store, activation_id, name, secrets, self.closed)
        if ended is None:
            return
        self.settle(store, activation_id, ended, secrets)
        backend.ended(store, activation_id, name, secrets)

    def watch(self, target, store, activation_id, *args):
        """Run `target(store, activation_id, *args)` on a named monitor thread (and watch the activation's
        artifact quota); a raised error fails the activation."""
        with self._lock:
            self._watched.add(activation_id)
        thread = threading.Thread(target=self._run_monitor, args=(target, store, activation_id) + args,
                                  name=f"suzumio-monitor-{activation_id}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        self._watch_quota(store, activation_id)

    def _watch_quota(self, store, activation_id):
        """Watch the activation's agent's artifacts folder (backend.artifactQuota) on its own thread:
        the same host folder whether the runner is a process or a container."""
        agent_id = store.activation(activation_id)["agentId"]
        quota = self.configs.get(store).artifact_quota(agent_id)
        if quota is None:
            return
        def run():
            try:
                self._enforce_quota(store, activation_id, agent_id, quota)
            except Exception as error:  # noqa: BLE001 - the thread's boundary; the activation's own monitor goes on
                log.warning("artifact quota watch of activation %s failed: %s", activation_id, error)

        thread = threading.Thread(target=run, name=f"suzumio-quota-{activation_id}", daemon=True)
        with self._lock:  # joined by close() with the monitors
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _enforce_quota(self, store, activation_id, agent_id, quota):
        """Past its quota, the activation fails with `artifact quota exceeded (<used> of <quota>)`, an
        `activation.artifact_quota_exceeded` event says so, and its runner is stopped."""
        folder = store.artifacts_dir(agent_id)
        while not self.closed.wait(QUOTA_POLL_SECONDS):
            if store.activation(activation_id)["status"] != ACT_RUNNING:
                return
            used = folder_bytes(folder)
            if used <= quota:
                continue
            error = f"artifact quota exceeded ({format_size(used)} of {format_size(quota)})"
            log.warning("activation %s: %s", activation_id, error)
            store.append_event("activation.artifact_quota_exceeded", {
                "activationId": activation_id, "agentId": agent_id, "usedBytes": used, "quotaBytes": quota})
            self.fail_if_running(store, activation_id, error)
            self.stop_runner(store, store.activation(activation_id))
            return

    def _run_monitor(self, target, store, activation_id, *args):
        try:
            target(store, activation_id, *args)
        except Exception as error:  # noqa: BLE001 - one boundary per thread: a monitoring exception fails the activation
            if not self.closed.is_set():
                log.warning("monitor of activation %s failed: %s", activation_id, error)
                self.fail_if_running(store, activation_id, failure_text(error))
        finally:
            with self._lock:
                self._watched.discard(activation_id)

    def watched(self, activation_id):
        with self._lock:
            return activation_id in self._watched or activation_id in self._starting

    def fail_if_running(self, store, activation_id, error):
        if store.activation(activation_id)["status"] == ACT_RUNNING:
            coordination.fail_activation(store, activation_id, error)

    def record_artifacts(self, store, activation_id):
        """The runner of `activation_id` is gone: record what it changed in its agent's artifact folder,
        unless its output did already (suzumio_recorder records an activation once)."""
        try:
            config = self.configs.get(store)
        except suzumio_config.ConfigError as error:
            log.warning("artifacts of activation %s not recorded: %s", activation_id, error)
            return
        suzumio_recorder.record_ended(store, config, activation_id)
        suzumio_repository.activation_ended(store, config, activation_id)

    def settle(self, store, activation_id, ended, secrets):
        """docs/design/runner.md, after the runner ended as `ended` (an Exit)."""
        if self.closed.is_set():
            return
        self.record_artifacts(store, activation_id)
        if store.activation(activation_id)["status"] != ACT_RUNNING:
            return
        if ended.error is not None:
            self.fail_if_running(store, activation_id, ended.error)
        elif ended.code not in (0, None):
            self.fail_if_running(store, activation_id, redact(exit_failure_text(ended.code, ended.log()), secrets))
        else:
            self.fail_if_running(store, activation_id, NO_OUTPUT_ERROR)

    # -- stopping

    def stop_runner(self, store, activation):
        """Stop an ended activation's container or process (docs/design/scheduler.md); a failure
        becomes an `activation.stop_failed` event and never propagates."""
        name = activation.get("containerName")
        if not name:
            return
        try:
            self.backend_of(name).stop(store, activation["id"], name)
        except Exception as error:  # noqa: BLE001 - any engine or OS error is recorded; the store change stands
            log.warning("stopping runner %s of activation %s failed: %s", name, activation["id"], error)
            store.append_event("activation.stop_failed", {
                "activationId": activation["id"], "agentId": activation["agentId"],
                "error": str(error) or type(error).__name__})

    def expire(self, store, activation):
        """Fail a running activation with `activation timed out`, then stop its runner."""
        coordination.fail_activation(store, activation["id"], TIMEOUT_ERROR)
        self.stop_runner(store, store.activation(activation["id"]))

    def close(self):
        """Remove the prepared runners no activation claimed, then stop the watchers and the reconciler;
        runners keep going and the next serve adopts them."""
        if self.warm is not None:
            self.warm.close()
        self.closed.set()
        # One deadline for all: Docker watchers block in wait() by design and end with the process.
        deadline = time.monotonic() + CLOSE_GRACE_SECONDS
        threads = [t for t in list(self._threads) if t is not threading.current_thread()]
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for backend in self._backends.values():
            backend.close()
        still = sum(thread.is_alive() for thread in threads)
        if still:
            log.info("%d watcher thread(s) still waiting at close; their runners keep going", still)


# The one table of backend kinds: backend.kind -> the class that runs it (each built with its Backends).
BACKENDS = {KIND_DOCKER: DockerBackend, KIND_LOCAL: LocalBackend, KIND_SWARM: SwarmBackend}


def backend_class(kind):
    """The class that runs backend.kind `kind`, for what it says of itself before any runs."""
    return BACKENDS[kind]
