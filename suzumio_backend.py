"""Activation backends: `docker-chat` (one container per activation, Docker SDK), `local` (the same
runner as a host subprocess in its own session) and, through suzumio_backend_swarm, `swarm`. Owns
input.json, launching, exit monitors, stopping runners (P0 restart, stop, approve, timeout) and
container retention; reconciling what runs with the store is suzumio_backend_reconcile's."""
import datetime
import hashlib
import json
import logging
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

import suzumio_backend_swarm as swarm_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_egress
import suzumio_recorder
import suzumio_registry
import suzumio_repository
import suzumio_warm
from suzumio_backend_local import (
    KIND_LOCAL,
    LOCAL_PREFIX,
    LOG_TAIL_LINES,
    STOP_GRACE_SECONDS,
    LocalBackend,
    digest,
    exit_status,
    local_pid,
    runner_marker,
    tail_lines,
)
from suzumio_config import KIND_SWARM, RESERVED_MOUNT_TARGETS
from suzumio_docker import docker_sdk, engine_errors, http_status
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
                HOST_FILE, "suzumio_runner_mcp.py", "suzumio_runner_egress.py", "suzumio_runner_files.py")
CONTAINER_SUPPORT_DIR = "/opt/suzumio"
# docker-chat mounts the runner socket's directory (not the socket: a restarted controller's new
# socket must be seen by the containers it adopts) here, read-only.
CONTAINER_RUN_DIR = "/run/suzumio"
CONTAINER_HOME = "/tmp"

SECRET_NAME = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|password")
REDACTED = "<redacted>"
ADOPT_POLL_SECONDS = 2.0
QUOTA_POLL_SECONDS = 1.0  # how often a running activation's artifacts folder is measured
NEVER_STARTED_GRACE_MS = 60_000
RECONCILE_INTERVAL_SECONDS = 60.0
CLOSE_GRACE_SECONDS = 5.0

FINISHED_STATES = ("exited", "dead")  # engine states of containers whose runner has ended
NO_OUTPUT_ERROR = "Runner exited without submitting activation output"
TIMEOUT_ERROR = "activation timed out"
NEVER_STARTED_ERROR = "Runner container was never started (controller restarted)"
ENGINE_UNREACHABLE_ERROR = "Docker engine unreachable"
ENGINE_POLL_SECONDS = 1.0  # how often a watcher that lost the engine asks for its container again

KIND_DOCKER = "docker-chat"
CONTAINER_KINDS = (KIND_DOCKER, KIND_SWARM)  # the runner sees the container layout (/workspace, /artifacts)
SWARM_NEEDS_LISTENER = ("backend.kind swarm needs serve --runner-listen HOST:PORT (at an address the "
                        "Swarm nodes reach): its tasks cannot reach the controller's runner socket")


# ---------------------------------------------------------------- small shared helpers

def safe_name(text):
    """Replace every run of characters outside [A-Za-z0-9_.-] with one underscore."""
    return suzumio_registry.safe_toolpack_id(text)


def container_name_for(project, agent_id, activation_id):
    return safe_name(f"suzumio_{project}_{agent_id}_{activation_id}")


WARM_MARK = "warm-"  # a prepared container's name: suzumio_<project>_<agent>_warm-<slot> until claimed
INPUT_TARGET = "/activation/input.json"


def warm_container_name(project, agent_id, slot_id):
    return safe_name(f"suzumio_{project}_{agent_id}_{WARM_MARK}{slot_id}")


def container_activation(name, labels, project, agent_id):
    """The activation a container ran: its label, or for a claimed prepared container (created before
    its activation existed, then renamed) the end of its name; '' for an unclaimed one."""
    if labels.get("suzumio.activation"):
        return labels["suzumio.activation"]
    prefix = safe_name(f"suzumio_{project}_{agent_id}_")
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return "" if rest.startswith(WARM_MARK) else rest


def is_timed_out(activation, timeout_ms, now):
    """True when a running activation has reached started_at + timeout."""
    started = parse_ts(activation["startedAt"])
    return started + datetime.timedelta(milliseconds=timeout_ms) <= now


def validate_mount(mount):
    """docs/design/runner.md for a config Mount: source exists, target absolute and not reserved."""
    os.stat(mount.source)
    if not mount.target.startswith("/"):
        raise ValueError(f"Docker mount target must be absolute: {mount.target}")
    target = suzumio_config.normalize_mount_target(mount.target)
    bare = target.rstrip("/") or "/"
    for reserved in RESERVED_MOUNT_TARGETS:
        if bare == reserved or bare.startswith(reserved + "/"):
            raise ValueError(f"Docker mount target is reserved: {mount.target}")
    return target


def runner_controller_url(kind, runner_socket, configured_url):
    """The `controllerUrl` of input.json: the runner socket when the controller serves one (inside a
    container under CONTAINER_RUN_DIR, for a host runner its real path), else `backend.controllerUrl`
    (serve --runner-listen), with host.docker.internal made 127.0.0.1 for host runners."""
    if runner_socket is not None:
        if kind == KIND_DOCKER:
            return f"unix://{CONTAINER_RUN_DIR}/{Path(runner_socket).name}"
        return f"unix://{os.path.abspath(runner_socket)}"
    return configured_url if kind in CONTAINER_KINDS else local_controller_url(configured_url)


def runner_egress_url(kind, runner_socket, controller_url):
    """Where the runner's forwarder reaches the egress proxy: its socket beside the runner socket, or
    (a TLS runner listener) `tls://` to the host and port of the runner's https controllerUrl, where
    the listener hands a connection offering the egress ALPN protocol to the proxy; None otherwise."""
    if runner_socket is not None:
        path = Path(runner_socket).parent / suzumio_egress.EGRESS_SOCKET
        return f"unix://{CONTAINER_RUN_DIR}/{path.name}" if kind == KIND_DOCKER else f"unix://{os.path.abspath(path)}"
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
RUNNER_PROVIDER_OPTIONS = ("maxRetries", "retryWindowMs")


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


def redact(text, secrets):
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text


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
        spec = {"id": pack.id, "tools": [tool.definition() for tool in allowed]}
        if pack.kind == "mcp":
            # The controller owns the session: every call goes to the support route.
            spec["runnerModule"] = MCP_SUPPORT_MODULE
            spec["supportPath"] = pack.support_path
            specs.append(spec)
            continue
        if pack.builtin:
            spec["runnerModule"] = pack.runner_module_ref
        elif kind == KIND_SWARM:
            raise ValueError(f"backend.kind swarm cannot run the local toolpack {pack.id} yet (its files are "
                             "on the controller); allow none of its tools")
        elif kind == KIND_DOCKER:
            spec["runnerModule"] = pack.container_runner_module
            mounts.append((pack.safe_id, str(pack.path)))
        else:
            spec["runnerModule"] = pack.runner_module
        if not pack.builtin:
            spec["declaredTools"] = pack.tool_names
        spec["supportPath"] = pack.support_path
        specs.append(spec)
    return specs, mounts


# ---------------------------------------------------------------- one launch request

def activation_paths(kind, project_dir, workspace):
    """(workspace, artifacts root) as the runner sees them (docs/design/runner.md)."""
    if kind in CONTAINER_KINDS:
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
        use_socket = self.kind == KIND_DOCKER or (self.kind != KIND_SWARM and controller_ca is None)
        self.runner_socket = runner_socket if use_socket else None
        # Only without any serve of the root (a CLI command's activation; serve always serves the
        # socket): the runner can then only try backend.controllerUrl, and no tool runs before the
        # controller answers it.
        self.controller_over_network = self.kind == KIND_DOCKER and runner_socket is None
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
        self.env = activation_env(config, agent, activation["id"], environ, rewrite_proxy=self.kind in CONTAINER_KINDS)

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

    def input_data(self):
        """The fields of docs/design/runner.md, in table order."""
        agent = self.agent
        specs, self.toolpack_mounts = runner_toolpack_specs(self.config, agent, self.kind)
        workspace, artifacts_root = activation_paths(self.kind, self.project_dir, self.workspace)
        controller_url = runner_controller_url(self.kind, self.runner_socket, self.config.backend.controller_url)
        if self.controller_ca is not None:
            controller_url = tls_url(controller_url)
        container = self.kind in CONTAINER_KINDS
        read_roots = ["/workspace", "/artifacts", "/mnt"] if container else [workspace, artifacts_root]
        agent_part = {"id": agent["id"], "displayName": agent["displayName"], "role": agent["role"],
                      "prompt": agent.get("prompt") or ""}
        if agent.get("model"):
            agent_part["model"] = agent["model"]
        data = {
            "project": self.project,
            "agent": agent_part,
            "activation": {"id": self.activation_id, "prompt": self.activation["prompt"]},
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
            "history": self.store.active_history(agent["id"]),
        }
        if self.controller_ca is not None:
            data["controllerCa"] = self.controller_ca
        if self.kind == KIND_SWARM:
            # Nothing is mounted: the runner fetches its files from the controller and sends its own
            # artifacts back (suzumio_files), and forbids new privileges to itself and its tools.
            data["files"] = "controller"
            data["noNewPrivileges"] = True
            if self.config.backend.swarm.sealed:
                # The task's one route: its node's gateway, which carries the bytes to the listener.
                data["controllerVia"] = swarm_backend.GATEWAY_SOCKET
        return data


# ---------------------------------------------------------------- the Docker backend

def engine_unreachable(error):
    """True when `error` says the engine could not be reached or dropped the connection (stopped or
    restarting; a killed engine ends a response midway), not that it answered with an error. The SDK is
    not imported for this: an error of a process that never loaded it cannot be one."""
    exceptions = sys.modules.get("requests.exceptions")
    return exceptions is not None and isinstance(error, (exceptions.ConnectionError,
                                                         exceptions.ChunkedEncodingError))


def failure_text(error):
    """The stored error of a start or watch that raised: an unreachable engine says so first."""
    text = str(error) or type(error).__name__
    return f"{ENGINE_UNREACHABLE_ERROR}: {text}" if engine_unreachable(error) else text


UNPRIVILEGED_IDS = (65532, 65532)


def warm_owner(runner_socket):
    """The `suzumio.warm` label of one controller's prepared containers: its runner socket's path, hashed
    (one per root), so a reconciler removes only what it or an earlier serve of its root left."""
    return hashlib.sha256(os.fsencode(os.path.abspath(runner_socket))).hexdigest()[:16]


def container_user(configured, host_uid, host_gid):
    """The `user` of an activation container: the configured one, else the controller's uid:gid, else
    (the controller is root) a fixed unprivileged uid:gid that then owns the agent's writable folders."""
    if configured:
        return configured
    if host_uid != 0:
        return f"{host_uid}:{host_gid}"
    return "{}:{}".format(*UNPRIVILEGED_IDS)


def numeric_ids(user):
    """(uid, gid) of a `uid` or `uid:gid` user, gid defaulting to uid; None for names (not resolvable
    on the host, so their folders cannot be handed over)."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return None
    return int(uid), int(gid or uid)


def network_mode(sandbox, controller_over_network):
    """The container's network mode: the agent's network when it has network (or when no runner socket
    is served, and the runner can only try backend.controllerUrl), else `none`. None means Docker's default."""
    if sandbox.has_network or controller_over_network:
        return sandbox.network
    return "none"


def _chown_tree(path, uid, gid):
    """Hand a folder and everything under it to uid:gid without following symbolic links; a file with
    several hard links is skipped, since its other name may lie outside this folder."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(path):
        for entry in dirs + files:
            full = os.path.join(parent, entry)
            info = os.lstat(full)
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                continue
            if (info.st_uid, info.st_gid) != (uid, gid):
                os.chown(full, uid, gid, follow_symlinks=False)


def own_writable_folders(launch, user):
    """With a root controller, give the container's uid its workspace, its own artifacts folder and its
    input.json (still mode 0600). A folder already owned by it is not walked again, so a big workspace
    costs one stat per start; root-owned files from before (older root containers) are handed over once."""
    ids = numeric_ids(user)
    if ids is None or ids[0] == 0:
        return
    uid, gid = ids
    if launch.input_path is not None:  # a prepared container has none
        os.chown(launch.input_path, uid, gid, follow_symlinks=False)
    for folder in (launch.workspace, launch.artifacts / launch.agent["id"]):
        info = os.lstat(folder)
        if (info.st_uid, info.st_gid) != (uid, gid):
            _chown_tree(folder, uid, gid)


class DockerBackend:
    """One container per activation through the Docker SDK; the client is created lazily."""

    kind = KIND_DOCKER

    def __init__(self, client=None, host_ids=None):
        self._client = client
        self._lock = threading.Lock()
        self._engine_cpus = None
        # The controller's own uid and gid: containers run as them, or as UNPRIVILEGED_IDS under root.
        self.host_ids = host_ids or (os.getuid(), os.getgid())

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                self._client = docker_sdk().from_env()
            return self._client

    def mounts(self, launch, agent_ids):
        """docs/design/runner.md rows 1-7 as (source, target, read_only), validated. A prepared
        container (no activation yet) gets no input.json: its input comes over the warm socket."""
        rows = [] if launch.input_path is None else [(str(launch.input_path), INPUT_TARGET, True)]
        rows.append((str(launch.workspace), "/workspace", False))
        for other in agent_ids:
            rows.append((str(launch.artifacts / other), f"/artifacts/{other}", other != launch.agent["id"]))
        for mount in launch.config.mounts_for(launch.agent["id"]):
            rows.append((mount.source, validate_mount(mount), mount.readonly is not False))
        for safe_id, root in launch.toolpack_mounts:
            rows.append((root, f"/toolpacks/{safe_id}", True))
        for path in launch.runner_files():
            rows.append((str(path), f"{CONTAINER_SUPPORT_DIR}/{path.name}", True))
        if launch.runner_socket is not None:
            rows.append((str(Path(launch.runner_socket).parent), CONTAINER_RUN_DIR, True))
        return rows

    def engine_cpus(self):
        """The engine's CPU count, asked once: Docker refuses a CPU limit above it."""
        with self._lock:
            cached = self._engine_cpus
        if cached is None:
            cached = int(self.client.info()["NCPU"])
            with self._lock:
                self._engine_cpus = cached
        return cached

    def sandbox_options(self, launch, sandbox):
        """User, capabilities, limits and network of one activation's container (docs/operations.md)."""
        options = {"user": container_user(sandbox.user, self.host_ids[0], self.host_ids[1]),
                   "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"]}
        if sandbox.cap_add:
            options["cap_add"] = list(sandbox.cap_add)
        if sandbox.memory:
            options["mem_limit"] = sandbox.memory
        if sandbox.cpus:
            # More CPUs than the engine has means all of them (Docker would refuse the container).
            options["nano_cpus"] = int(min(float(sandbox.cpus), self.engine_cpus()) * 1e9)
        if sandbox.pids_limit:
            options["pids_limit"] = sandbox.pids_limit
        network = network_mode(sandbox, launch.controller_over_network)
        if network:
            options["network_mode"] = network
        return options

    def fingerprint(self, launch, agent_ids):
        """Everything a container gets at creation but its activation's input and environment: a prepared
        container serves an activation only when this is the same for both."""
        rows = [row for row in self.mounts(launch, agent_ids) if row[1] != INPUT_TARGET]
        options = self.sandbox_options(launch, launch.config.sandbox(launch.agent["id"]))
        return digest([launch.config.backend.image, rows, options, launch.config_digest()])

    def create(self, launch, agent_ids, slot=None, warm_socket=None):
        """Build and create (not start) the container; returns its name. With a warm `slot`,
        the container of a future activation: the same image, mounts (but input.json), user,
        limits and network, waiting on the warm socket, and only the environment a runner needs to get
        there; the activation's environment and input come with the claim."""
        Mount = docker_sdk().types.Mount
        rows = self.mounts(launch, agent_ids)
        backend = launch.config.backend
        options = self.sandbox_options(launch, launch.config.sandbox(launch.agent["id"]))
        if self.host_ids[0] == 0:
            own_writable_folders(launch, options["user"])
        labels = {"suzumio.managed": "true", "suzumio.project": launch.project, "suzumio.agent": launch.agent["id"]}
        if slot is None:
            name = container_name_for(launch.project, launch.agent["id"], launch.activation_id)
            environment = dict(launch.env)
            command = ["--input", INPUT_TARGET]
            labels["suzumio.activation"] = launch.activation_id
        else:
            name = warm_container_name(launch.project, launch.agent["id"], slot.id)
            environment = {"PYTHONUNBUFFERED": "1", suzumio_warm.KEY_ENV: slot.key}
            command = ["--warm", f"{CONTAINER_RUN_DIR}/{Path(warm_socket).name}", suzumio_warm.SLOT_FLAG, slot.id]
            labels["suzumio.warm"] = warm_owner(launch.runner_socket)
        if not suzumio_config.is_root_user(options["user"]):
            # A uid without a passwd entry gets HOME=/, where it cannot write (caches, tool settings).
            environment.setdefault("HOME", CONTAINER_HOME)
        self.client.containers.create(
            backend.image,
            name=name,
            entrypoint=["python3", f"{CONTAINER_SUPPORT_DIR}/{RUNNER_FILE}"],
            command=command,
            working_dir="/workspace",
            environment=environment,
            labels=labels,
            mounts=[Mount(target, source, type="bind", read_only=ro) for source, target, ro in rows],
            extra_hosts={"host.docker.internal": "host-gateway"},
            auto_remove=False, tty=False, stdin_open=False, detach=True, **options)
        return name

    def rename(self, name, new_name):
        self.client.api.rename(name, new_name)

    def warm_containers(self, owner=None, project=None):
        """(name, state) of prepared containers not yet claimed (their name still has WARM_MARK), of one
        controller (`owner`, warm_owner of its runner socket) or of one project."""
        labels = ["suzumio.managed=true", "suzumio.warm" + ("" if owner is None else f"={owner}")]
        if project is not None:
            labels.append(f"suzumio.project={project}")
        found = []
        for container in self.client.api.containers(all=True, filters={"label": labels}):
            name = container["Names"][0].lstrip("/")
            container_labels = container.get("Labels") or {}
            if not container_activation(name, container_labels, container_labels.get("suzumio.project", ""),
                                        container_labels.get("suzumio.agent", "")):
                found.append((name, container.get("State", "")))
        return found

    def start(self, name):
        self.client.api.start(name)

    def wait(self, name):
        """Block until the container exits (no client timeout); returns its exit code."""
        return self.client.api.wait(name, timeout=None)["StatusCode"]

    def log_tail(self, name):
        """The last 200 log lines; '' when the engine no longer has them (container removed)."""
        docker = docker_sdk()
        try:
            raw = self.client.api.logs(name, stdout=True, stderr=True, tail=LOG_TAIL_LINES)
        except docker.errors.APIError as error:
            log.warning("no logs for container %s: %s", name, error)
            return ""
        return tail_lines(raw.decode("utf-8", "replace"))

    def exit_log(self, name):
        """log_tail for a failure text: an engine that stopped the container on its way down and is
        gone leaves a line saying so (the container and its log are kept for when it is back)."""
        try:
            return self.log_tail(name)
        except engine_errors() as error:
            if not engine_unreachable(error):
                raise
            log.warning("no logs for container %s: %s", name, error)
            return f"(no log: {failure_text(error)})"

    def find(self, project, activation_id, agent_id=None):
        """The name of the container labelled with this activation, or None. With `agent_id`, also a
        claimed prepared container, which has the activation only in its name."""
        labels = ["suzumio.managed=true", f"suzumio.project={project}", f"suzumio.activation={activation_id}"]
        for container in self.client.api.containers(all=True, filters={"label": labels}):
            return container["Names"][0].lstrip("/")
        if agent_id is not None:
            for name, found, _state in self.agent_containers(project, agent_id):
                if found == activation_id:
                    return name
        return None

    def agent_containers(self, project, agent_id):
        """(name, activation id, state) of an agent's activation containers, newest activation first (ids
        sort by time); prepared containers not yet claimed are not among them."""
        labels = ["suzumio.managed=true", f"suzumio.project={project}", f"suzumio.agent={agent_id}"]
        rows = []
        for container in self.client.api.containers(all=True, filters={"label": labels}):
            name = container["Names"][0].lstrip("/")
            activation_id = container_activation(name, container.get("Labels") or {}, project, agent_id)
            if activation_id or "suzumio.warm" not in (container.get("Labels") or {}):
                rows.append((name, activation_id, container.get("State", "")))
        return sorted(rows, key=lambda row: row[1], reverse=True)

    def remove(self, name):
        """Remove a container that never ran; a failure is logged (the container is then only kept)."""
        try:
            self.client.api.remove_container(name, force=True)
        except engine_errors() as error:
            if http_status(error) == 404:
                return
            log.warning("removing container %s failed: %s", name, error)

    def state(self, name):
        """(`running` | `exited` | ..., exit code), or None when the container does not exist."""
        docker = docker_sdk()
        try:
            attrs = self.client.api.inspect_container(name)
        except docker.errors.NotFound:
            return None
        return attrs["State"]["Status"], attrs["State"].get("ExitCode")

    def stop(self, name, activation_id):
        """Stop the container with 2 s grace; 304/404 are success; otherwise kill; else raise."""
        docker = docker_sdk()
        try:
            self.client.api.stop(name, timeout=int(STOP_GRACE_SECONDS))
            return
        except docker.errors.APIError as error:
            if http_status(error) in (304, 404):
                return
            log.warning("stopping container %s failed, killing it: %s", name, error)
        try:
            self.client.api.kill(name)
        except docker.errors.APIError as error:
            if http_status(error) in (304, 404):
                return
            raise


# ---------------------------------------------------------------- container retention

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


class Retention:
    """Which exited containers are kept (backend.docker.keep): each one's log tail is saved as its
    activation's runner.log before the container goes, so removing it loses nothing."""

    def __init__(self, docker):
        self.docker = docker

    def save_log_tail(self, store, activation_id, name, secrets):
        """Keep an exited container's log tail as activations/<id>/runner.log (0600, redacted), as the
        local backend keeps its runner's log, so removing the container loses nothing."""
        path = store.activation_dir(activation_id) / "runner.log"
        if path.exists():
            return
        text = redact(self.docker.log_tail(name), secrets)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text + ("\n" if text else ""))


    def retire_containers(self, store, agent_id, keep, secrets=(), exited=None):
        """Save the log tail of the container that just exited (`exited`: activation id, name), then
        remove the agent's exited containers beyond the newest `keep` after saving theirs. Returns the
        number removed; an engine error is logged and leaves the containers for the next time."""
        removed = 0
        try:
            if exited is not None:
                self.save_log_tail(store, *exited, secrets)
            if keep == "all":
                return 0
            # Only this root's: another root on the same engine may have a project and agent of the
            # same names, and its containers are not ours to remove (their activations are not here).
            finished = [(name, activation_id) for name, activation_id, state
                        in self.docker.agent_containers(store.project_id, agent_id)
                        if state in FINISHED_STATES and activation_id
                        and store.activation_dir(activation_id).is_dir()]
            for name, activation_id in finished[keep:]:
                self.save_log_tail(store, activation_id, name, secrets)
                self.docker.client.api.remove_container(name)
                removed += 1
        except (OSError, *engine_errors()) as error:
            log.warning("retiring the containers of %s/%s failed: %s", store.project_id, agent_id, error)
        return removed


# ---------------------------------------------------------------- the facade the scheduler uses

class Backends:
    """Starts, watches and stops activations' runners; picks `local`, `docker-chat` or `swarm` by
    `backend.kind` at start and by the recorded container name afterwards. Reconciling what runs against the store is
    suzumio_backend_reconcile's Reconciler, through this object's watch and stop methods."""

    def __init__(self, support_dir=SUPPORT_DIR, docker_client=None, environ=None, runner_socket=None,
                 warm_limit=0, configs=None, controller_ca=None):
        """`runner_socket`: the path of the controller's runner socket, which docker-chat runners always
        reach and local ones unless there is a TLS runner listener (`controller_ca`, its PEM CA, given to
        the runners that reach it through `backend.controllerUrl`: swarm tasks, and local runners);
        None when no serve of this root runs. `warm_limit`: how many prepared runners this process may
        hold (0, no runner socket, or a TLS listener: none, every activation starts cold); `configs`:
        the runtime's ConfigCache (serve shares its one; a CLI command's or a test's Backends keep their
        own)."""
        self.controller_ca = controller_ca
        self.configs = configs if configs is not None else suzumio_config.ConfigCache()
        self.support_dir = Path(support_dir)
        self.runner_socket = None if runner_socket is None else Path(runner_socket)
        self.environ = dict(os.environ if environ is None else environ)
        self.local = LocalBackend(self.environ)
        self.docker = DockerBackend(docker_client)
        self.swarm = swarm_backend.SwarmBackend(self.environ)
        self._lock = threading.Lock()
        self._watched = set()
        self._starting = set()
        self._threads = []
        self.closed = threading.Event()  # set by close(): the watchers and the reconciler end
        self.retention = Retention(self.docker)
        self.warm = None
        # Not with a TLS runner listener: a prepared local runner would be made for the runner socket.
        if warm_limit and self.runner_socket is not None and controller_ca is None:
            self.warm = suzumio_warm.WarmPool(self, self.runner_socket, warm_limit, self.configs).start()

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
        if not count or config.backend.kind == KIND_SWARM:
            return []
        if config.backend.kind == KIND_LOCAL and not Path("/proc/self").exists():
            return []  # a claimed local runner is known by its log file in /proc (local_runner_alive)
        agents = [a for a in store.list_agents(include_tokens=True) if a["status"] != AGENT_STOPPED]
        agents.sort(key=lambda a: (store.has_pending_signals_for_agent(a["id"], include_delayed=True),
                                   a.get("updatedAt") or ""), reverse=True)
        agent_ids = store.agent_ids()
        wanted = []
        for agent in agents[:count]:
            launch = Launch(store, config, None, agent, self.support_dir, self.environ, self.runner_socket)
            wanted.append((agent, launch.kind, self._fingerprint(launch, agent_ids), config))
        return wanted

    def _fingerprint(self, launch, agent_ids):
        if launch.kind == KIND_LOCAL:
            return self.local.fingerprint(launch)
        return self.docker.fingerprint(launch, agent_ids)

    def prepare(self, store, config, agent, slot):
        """For WarmPool: create and start the container, or spawn the process, of `slot`."""
        launch = Launch(store, config, None, agent, self.support_dir, self.environ, self.runner_socket)
        if launch.kind == KIND_LOCAL:
            self.local.prepare(launch, slot, self.warm.path)
            return
        agent_ids = store.agent_ids()
        for other in agent_ids:
            store.artifacts_dir(other).mkdir(parents=True, exist_ok=True)
        name = warm_container_name(launch.project, agent["id"], slot.id)
        slot.name = name  # before the create: a close meanwhile removes it
        self.docker.create(launch, agent_ids, slot=slot, warm_socket=self.warm.path)
        self.docker.start(name)

    def discard(self, slot):
        """For WarmPool: remove a prepared runner no activation will use."""
        if slot.kind == KIND_LOCAL:
            self.local.discard(slot)
        elif slot.name is not None:
            self.docker.remove(slot.name)

    def _claim(self, store, launch, agent_ids):
        """A prepared runner for this launch, taken from the pool, or None (start cold)."""
        if self.warm is None:
            return None
        fingerprint = self._fingerprint(launch, agent_ids)
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
        if config.backend.kind == KIND_SWARM and self.controller_ca is None:
            raise ValueError(SWARM_NEEDS_LISTENER)
        suzumio_repository.start_working_copy(store, config, activation)
        launch = Launch(store, config, activation, agent, self.support_dir, self.environ, self.runner_socket,
                        self.controller_ca)
        agent_ids = store.agent_ids()
        make_private_dir(store.activations_root)
        make_private_dir(launch.activation_dir)
        launch.data = launch.input_data()
        write_private_json(launch.input_path, launch.data)
        for other in agent_ids:
            store.artifacts_dir(other).mkdir(parents=True, exist_ok=True)
        if launch.kind == KIND_SWARM:
            user = container_user(config.sandbox(agent["id"]).user, *self.docker.host_ids)
            owner = tuple(str(i) for i in (numeric_ids(user) or (0, 0)))
            swarm_backend.start(self, store, launch, user, owner)
            return
        slot = self._claim(store, launch, agent_ids)
        if launch.kind == KIND_LOCAL:
            self._start_local(store, launch, slot)
        else:
            self._start_docker(store, launch, agent_ids, slot)

    def _start_local(self, store, launch, slot=None):
        process = self._start_prepared_local(store, launch, slot) if slot is not None else None
        if process is None:
            process = self.local.launch(launch)
        name = f"{LOCAL_PREFIX}{process.pid}"
        try:
            store.set_activation_container(launch.activation_id, name, node=socket.gethostname())
        finally:
            self.watch(self._watch_child, store, launch, process)
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            self.local.stop(name, runner_marker(store, launch.activation_id))

    def _start_prepared_local(self, store, launch, slot):
        """Hand a prepared process its activation: its slot is recorded first (runner.slot, what its
        command line names), then it gets its log file, environment and input; None when it is gone."""
        log_path = launch.activation_dir / "runner.log"
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        (launch.activation_dir / "runner.slot").write_text(slot.id + "\n", encoding="utf-8")
        try:
            suzumio_warm.deliver(slot, {"input": launch.data, "env": launch.env, "log": str(log_path)})
        except OSError as error:
            log.info("prepared runner of %s was gone (%s); starting cold", launch.activation_id, error)
            (launch.activation_dir / "runner.slot").unlink()
            self.local.discard(slot)
            return None
        return slot.process

    def _start_docker(self, store, launch, agent_ids, slot=None):
        if slot is not None and self._start_prepared_docker(store, launch, slot):
            return
        name = self.docker.create(launch, agent_ids)
        try:
            store.set_activation_container(launch.activation_id, name, node=socket.gethostname())
        except Exception:
            # Unrecorded and never started, nothing would ever settle or start it. (A controller that
            # dies right here leaves it to the reconciler, which finds it by its labels.)
            self.docker.remove(name)
            raise
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            log.info("activation %s was cancelled before its container started", launch.activation_id)
            return
        self.docker.start(name)
        self.watch(self.watch_container, store, launch.activation_id, name, launch.secrets,
                    launch.config.backend.docker.keep)

    def _start_prepared_docker(self, store, launch, slot):
        """Hand a prepared container its activation: renamed to the activation's container name (what
        the reconciler and retention go by), given its environment and input, then recorded. False when
        it was gone before it got its input (the caller starts cold)."""
        name = container_name_for(launch.project, launch.agent["id"], launch.activation_id)
        try:
            self.docker.rename(slot.name, name)
            slot.name = name
            if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
                log.info("activation %s was cancelled before its container started", launch.activation_id)
                self.docker.remove(name)
                return True
            suzumio_warm.deliver(slot, {"input": launch.data, "env": launch.env})
        except (OSError, *engine_errors()) as error:
            log.info("prepared container of %s unusable (%s); starting cold", launch.activation_id, error)
            self.docker.remove(slot.name)
            return False
        try:
            store.set_activation_container(launch.activation_id, name, node=socket.gethostname())
        except Exception:
            self.docker.remove(name)  # it runs an activation nothing would settle
            raise
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            self.docker.stop(name, launch.activation_id)
        self.watch(self.watch_container, store, launch.activation_id, name, launch.secrets,
                    launch.config.backend.docker.keep)
        return True

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

    def watch(self, target, store, *args):
        activation_id = args[0].activation_id if isinstance(args[0], Launch) else args[0]
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
            target(store, *args)
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

    def settle(self, store, activation_id, code, logs, secrets):
        """docs/design/runner.md, after the runner exited with `code`."""
        if self.closed.is_set():
            return
        self.record_artifacts(store, activation_id)
        if store.activation(activation_id)["status"] != ACT_RUNNING:
            return
        if code != 0:
            self.fail_if_running(store, activation_id, redact(exit_failure_text(code, logs()), secrets))
        else:
            self.fail_if_running(store, activation_id, NO_OUTPUT_ERROR)

    def _watch_child(self, store, launch, process):
        while True:
            try:
                returncode = process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if self.closed.is_set():
                    return
        self.settle(store, launch.activation_id, exit_status(returncode),
                     lambda: self.local.log_tail(launch.activation_dir), launch.secrets)

    def watch_container(self, store, activation_id, name, secrets, keep):
        code = self._container_exit(activation_id, name)
        if code is None:
            return
        self.settle(store, activation_id, code, lambda: self.docker.exit_log(name), secrets)
        if not self.closed.is_set():
            self.retention.retire_containers(store, store.activation(activation_id)["agentId"], keep, secrets,
                                   exited=(activation_id, name))

    def _container_exit(self, activation_id, name):
        """The exit code of an activation's container. When the engine drops the wait or cannot be
        reached (stopped, restarting), the watcher asks for the container every ENGINE_POLL_SECONDS
        until the engine answers again and then waits anew: a container the engine kept running (live
        restore) goes on, one it stopped on its way down gives its exit code and log; the activation's
        timeout still applies meanwhile (the reconciler's). None when the backend closes."""
        while True:
            try:
                return self.docker.wait(name)
            except engine_errors() as error:
                if not engine_unreachable(error):
                    raise
                log.warning("activation %s: lost the Docker engine while waiting for %s (%s); asking again "
                            "until it answers", activation_id, name, error)
            while True:
                if self.closed.wait(ENGINE_POLL_SECONDS):
                    return None
                try:
                    state = self.docker.state(name)
                except engine_errors() as error:
                    if not engine_unreachable(error):
                        raise
                    continue
                if state is None:
                    raise RuntimeError(f"Runner container {name} not found after the Docker engine came back")
                break

    # -- stopping

    def stop_runner(self, store, activation):
        """Stop an ended activation's container or process (docs/design/scheduler.md); a failure
        becomes an `activation.stop_failed` event and never propagates."""
        name = activation.get("containerName")
        if not name:
            return
        try:
            if swarm_backend.swarm_service(name) is not None:
                # Its secret goes once the task is gone: the activation's watcher removes it then.
                self.swarm.remove(self.configs.get(store).backend.swarm.engine, swarm_backend.swarm_service(name))
            elif local_pid(name) is not None:
                self.local.stop(name, runner_marker(store, activation["id"]))
            else:
                self.docker.stop(name, activation["id"])
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
        self.swarm.close()
        still = sum(thread.is_alive() for thread in threads)
        if still:
            log.info("%d watcher thread(s) still waiting at close; their runners keep going", still)
