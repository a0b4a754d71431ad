"""The `docker-chat` backend (suzumio_backend_contract's Backend): one container per activation through
the Docker SDK, its names and labels, how it is found and adopted after a controller restart, prepared
containers, and container retention (backend.docker.keep). Built by suzumio_backend's BACKENDS table."""
import hashlib
import logging
import os
import socket
import stat
import sys
import threading
from pathlib import Path

import suzumio_config
import suzumio_registry
import suzumio_warm
from suzumio_backend_contract import KIND_DOCKER, KIND_SWARM, Backend, Exit, redact
from suzumio_backend_local import LOG_TAIL_LINES, STOP_GRACE_SECONDS, digest, tail_lines
from suzumio_config import RESERVED_MOUNT_TARGETS
from suzumio_docker import container_user, docker_sdk, engine_errors, http_status, numeric_ids
from suzumio_errors import NotFound
from suzumio_records import ACT_RUNNING

log = logging.getLogger(__name__)

# Everything the runner needs is mounted read-only here (docs/design/runner.md).
CONTAINER_SUPPORT_DIR = "/opt/suzumio"
# docker-chat mounts the runner socket's directory (not the socket: a restarted controller's new
# socket must be seen by the containers it adopts) here, read-only.
CONTAINER_RUN_DIR = "/run/suzumio"
CONTAINER_HOME = "/tmp"

FINISHED_STATES = ("exited", "dead")  # engine states of containers whose runner has ended

ENGINE_UNREACHABLE_ERROR = "Docker engine unreachable"
ENGINE_POLL_SECONDS = 1.0  # how often a watcher that lost the engine asks for its container again
CONTAINER_PREFIX = "suzumio_"  # every docker-chat container's name starts so (container_name_for)

def safe_name(text):
    """Replace every run of characters outside [A-Za-z0-9_.-] with one underscore."""
    return suzumio_registry.safe_toolpack_id(text)


def container_name_for(project, agent_id, activation_id):
    return safe_name(f"{CONTAINER_PREFIX}{project}_{agent_id}_{activation_id}")


WARM_MARK = "warm-"  # a prepared container's name: suzumio_<project>_<agent>_warm-<slot> until claimed
INPUT_TARGET = "/activation/input.json"


def warm_container_name(project, agent_id, slot_id):
    return safe_name(f"{CONTAINER_PREFIX}{project}_{agent_id}_{WARM_MARK}{slot_id}")


def container_activation(name, labels, project, agent_id):
    """The activation a container ran: its label, or for a claimed prepared container (created before
    its activation existed, then renamed) the end of its name; '' for an unclaimed one."""
    if labels.get("suzumio.activation"):
        return labels["suzumio.activation"]
    prefix = safe_name(f"{CONTAINER_PREFIX}{project}_{agent_id}_")
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return "" if rest.startswith(WARM_MARK) else rest

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


def warm_owner(runner_socket):
    """The `suzumio.warm` label of one controller's prepared containers: its runner socket's path, hashed
    (one per root), so a reconciler removes only what it or an earlier serve of its root left."""
    return hashlib.sha256(os.fsencode(os.path.abspath(runner_socket))).hexdigest()[:16]


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


def run_check_in_container(config, agent_id, folder, command, timeout):
    """`docker-chat` and `swarm`: the check runs in a container like an activation's of the requesting agent:
    the same image, user, capabilities and limits, and no network at all; the scratch copy is its
    /workspace. On `swarm` the container runs on the controller's own Docker engine, not on a node. Used
    by suzumio_merge_queue (docs/teams-that-write-code.md#where-checks-run); stopped after `timeout` seconds."""
    sandbox = config.sandbox(agent_id)
    client = docker_sdk().from_env()
    user = container_user(sandbox.user, os.getuid(), os.getgid())
    ids = numeric_ids(user)
    if os.getuid() == 0 and ids is not None:
        _chown_tree(folder, *ids)
    options = {"user": user, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges:true"], "network_mode": "none"}
    if sandbox.cap_add:
        options["cap_add"] = list(sandbox.cap_add)
    memory, cpus = sandbox.memory, sandbox.cpus
    if config.backend.kind == KIND_SWARM:
        # `swarm` runs its checks here, on the controller's own engine (a swarm task could not see the
        # scratch copy: nothing is bind-mounted there), with the limits its activations' tasks get.
        placement = config.swarm_placement(agent_id)
        memory = placement.limit_memory if placement.limit_memory is not None else memory
        cpus = placement.limit_cpus if placement.limit_cpus is not None else cpus
    if memory:
        options["mem_limit"] = memory
    if cpus:
        options["nano_cpus"] = int(min(float(cpus), int(client.info()["NCPU"])) * 1e9)
    if sandbox.pids_limit:
        options["pids_limit"] = sandbox.pids_limit
    mount = docker_sdk().types.Mount("/workspace", str(folder), type="bind")
    container = client.containers.create(
        config.backend.image, ["bash", "-c", command], entrypoint=[], working_dir="/workspace", mounts=[mount],
        environment={"HOME": "/workspace", "LANG": "C.UTF-8"}, detach=True,
        labels={"suzumio.check": "true", "suzumio.project": config.name}, **options)
    try:
        container.start()
        try:
            code = container.wait(timeout=timeout)["StatusCode"]
            suffix = ""
        except Exception as error:  # noqa: BLE001 - the SDK's read timeout (requests) or an engine error: the check failed
            container.kill()
            code, suffix = 124, f"\ncheck stopped: {error}"
        output = container.logs(stdout=True, stderr=True).decode("utf-8", "replace") + suffix
    finally:
        try:
            container.remove(force=True)
        except engine_errors() as error:
            log.warning("check container %s not removed: %s", container.id[:12], error)
    return code, output


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


class DockerBackend(Backend):
    """One container per activation through the Docker SDK; the client is created lazily. Without a
    `host` (a test's or a CLI command's engine calls) only the engine-level methods serve."""

    kind = KIND_DOCKER
    prepares = True
    socket_dir = CONTAINER_RUN_DIR

    @staticmethod
    def local_toolpack(pack):
        return pack.container_runner_module, (pack.safe_id, str(pack.path))

    def __init__(self, host=None, client=None, host_ids=None):
        super().__init__(host)
        self._client = client if client is not None else getattr(host, "docker_client", None)
        self.retention = Retention(self)
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
            entrypoint=["python3", f"{CONTAINER_SUPPORT_DIR}/{launch.runner_files()[0].name}"],
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

    def start_container(self, name):
        self.client.api.start(name)

    def wait_container(self, name):
        """Block until the container exits (no client timeout); returns its exit code."""
        return self.client.api.wait(name, timeout=None)["StatusCode"]

    def container_log(self, name):
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
            return self.container_log(name)
        except engine_errors() as error:
            if not engine_unreachable(error):
                raise
            log.warning("no logs for container %s: %s", name, error)
            return f"(no log: {failure_text(error)})"

    def find_container(self, project, activation_id, agent_id=None):
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

    def stop_container(self, name):
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

    # -- the contract: one activation

    def start(self, store, launch, slot=None):
        if slot is not None and self.claim(store, launch, slot):
            return
        name = self.create(launch, launch.agent_ids)
        try:
            store.set_activation_container(launch.activation_id, name, node=socket.gethostname())
        except Exception:
            # Unrecorded and never started, nothing would ever settle or start it. (A controller that
            # dies right here leaves it to the reconciler, which finds it by its labels.)
            self.remove(name)
            raise
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            log.info("activation %s was cancelled before its container started", launch.activation_id)
            return
        self.start_container(name)
        self.host.follow(store, launch.activation_id, name, launch.secrets)

    def wait(self, store, activation_id, name, secrets, closed):
        """The container's exit code. When the engine drops the wait or cannot be reached (stopped,
        restarting), the container is asked for every ENGINE_POLL_SECONDS until the engine answers again
        and then waited for anew: a container the engine kept running (live restore) goes on, one it
        stopped on its way down gives its exit code and log; the activation's timeout still applies
        meanwhile (the reconciler's)."""
        while True:
            try:
                code = self.wait_container(name)
                return Exit(code, lambda: self.exit_log(name))
            except engine_errors() as error:
                if not engine_unreachable(error):
                    raise
                log.warning("activation %s: lost the Docker engine while waiting for %s (%s); asking again "
                            "until it answers", activation_id, name, error)
            while True:
                if closed.wait(ENGINE_POLL_SECONDS):
                    return None
                try:
                    state = self.state(name)
                except engine_errors() as error:
                    if not engine_unreachable(error):
                        raise
                    continue
                if state is None:
                    raise RuntimeError(f"Runner container {name} not found after the Docker engine came back")
                break

    def ended(self, store, activation_id, name, secrets):
        """Save the container's log tail and retire the agent's exited containers beyond backend.docker.keep."""
        if not self.host.closed.is_set():
            self.retention.retire_containers(store, store.activation(activation_id)["agentId"],
                                             self.host.configs.get(store).backend.docker.keep, secrets,
                                             exited=(activation_id, name))

    def stop(self, store, activation_id, name):
        self.stop_container(name)

    def log_tail(self, store, activation_id, name):
        return self.container_log(name)

    # -- the contract: after a controller restart

    def owns(self, name):
        return name.startswith(CONTAINER_PREFIX)

    def find(self, store, config, activation_id):
        return self.find_container(config.name, activation_id, store.activation(activation_id)["agentId"])

    def adopt(self, store, activation, name):
        """A container the controller created but never started is started now."""
        activation_id = activation["id"]
        state = self.state(name)
        started = state is not None and state[0] == "created"
        if started:
            # The controller died between creating the container and starting it.
            log.info("activation %s: starting its never started container %s", activation_id, name)
            self.start_container(name)
        if state is None:
            return Exit(error=f"Runner container {name} not found")
        current = store.activation(activation_id)
        if started and current["status"] != ACT_RUNNING:
            # Cancelled meanwhile, and its stop may have come before this start: stop it again.
            self.host.stop_runner(store, current)
            return Exit()
        status, code = state
        if status in ("created", "running", "restarting", "paused"):
            return None
        return Exit(code, lambda: self.container_log(name))

    def collect_garbage(self, store, config, runner_socket):
        """Per agent, the exited containers beyond backend.docker.keep (their log tails saved first),
        containers that were created but never started for an activation that is no longer running (a
        controller that crashed between create and start), and the prepared containers that a `serve` of
        this root (`runner_socket`, its socket's path) left and no longer runs."""
        removed = 0
        for name, state in self.warm_containers(owner=warm_owner(runner_socket), project=store.project_id):
            if state != "running":  # a live serve's prepared runners are running; a dead one's ended
                self.remove(name)
                removed += 1
        for agent in store.list_agents(include_tokens=True):
            secrets = self.host.secrets(config, agent)
            removed += self.retention.retire_containers(store, agent["id"], config.backend.docker.keep, secrets)
            for name, activation_id, state in self.agent_containers(store.project_id, agent["id"]):
                if state != "created" or self.host.watched(activation_id):
                    continue
                try:
                    running = store.activation(activation_id)["status"] == ACT_RUNNING
                except NotFound:
                    continue  # another root's activation (same project and agent names on this engine)
                if not running:
                    self.remove(name)
                    removed += 1
        return removed

    def sweep(self, runner_socket, pool):
        removed = []
        try:
            for name, _state in self.warm_containers(owner=warm_owner(runner_socket)):
                if pool is None or not pool.owns(name):
                    log.info("removing prepared container %s left by an earlier controller", name)
                    self.remove(name)
                    removed.append(name)
        except engine_errors() as error:
            log.warning("cannot look for prepared containers: %s", error)
        return removed

    # -- the contract: prepared runners

    def prepare(self, store, launch, slot, warm_socket):
        agent_ids = store.agent_ids()
        for other in agent_ids:
            store.artifacts_dir(other).mkdir(parents=True, exist_ok=True)
        name = warm_container_name(launch.project, launch.agent["id"], slot.id)
        slot.name = name  # before the create: a close meanwhile removes it
        self.create(launch, agent_ids, slot=slot, warm_socket=warm_socket)
        self.start_container(name)

    def claim(self, store, launch, slot):
        """Renamed to the activation's container name (what the reconciler and retention go by), given
        its environment and input, then recorded and followed."""
        name = container_name_for(launch.project, launch.agent["id"], launch.activation_id)
        try:
            self.rename(slot.name, name)
            slot.name = name
            if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
                log.info("activation %s was cancelled before its container started", launch.activation_id)
                self.remove(name)
                return True
            suzumio_warm.deliver(slot, {"input": launch.data, "env": launch.env})
        except (OSError, *engine_errors()) as error:
            log.info("prepared container of %s unusable (%s); starting cold", launch.activation_id, error)
            self.remove(slot.name)
            return False
        try:
            store.set_activation_container(launch.activation_id, name, node=socket.gethostname())
        except Exception:
            self.remove(name)  # it runs an activation nothing would settle
            raise
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            self.stop_container(name)
        self.host.follow(store, launch.activation_id, name, launch.secrets)
        return True

    def discard(self, slot):
        if slot.name is not None:
            self.remove(slot.name)

# ---------------------------------------------------------------- container retention

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
        text = redact(self.docker.container_log(name), secrets)
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
