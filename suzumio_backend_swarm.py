"""The `swarm` backend: one replicated-job service per activation on a Docker Swarm, through the Docker
SDK against a manager's engine (backend.swarm.engine). Its input (the agent token and the controller's CA
in it) is a Swarm secret, the runner's files are Swarm configs, and nothing is bind-mounted: files go
through the controller (suzumio_files). On the sealed network (the default) each task is alone on an
internal overlay of its own and reaches the runner listener only through its node's gateway, a global
service per listener (suzumio_runner_gateway). Implements suzumio_backend_contract's Backend; built by
suzumio_backend's BACKENDS table."""
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from urllib.parse import urlsplit

from suzumio_backend_contract import KIND_SWARM, Backend, Exit, redact
from suzumio_backend_local import LOG_TAIL_LINES, tail_lines
from suzumio_config import normalize_mount_target
from suzumio_docker import container_user, docker_sdk, engine_errors, http_status, numeric_ids
from suzumio_errors import NotFound
from suzumio_records import ACT_RUNNING

log = logging.getLogger(__name__)

SWARM_PREFIX = "swarm:"  # a recorded containerName `swarm:<service>` names a Swarm service
SERVICE_PREFIX = "suzumio-"
RUNNER_DIR = "/opt/suzumio"
INPUT_FILE = "input.json"
INPUT_PATH = f"/run/secrets/{INPUT_FILE}"
# The task's own folders: filled over the runner listener at start, never bind-mounted.
SCRATCH_TARGETS = ("/workspace", "/artifacts", "/mnt", "/toolpacks")
POLL_SECONDS = 1.0
PLACEMENT_POLL_SECONDS = 0.2  # until the task has a node: short activations must still record theirs
ENDED_STATES = ("complete", "failed", "rejected", "shutdown", "orphaned", "remove")
LOST_NODE_STATES = ("down", "unknown", "disconnected")
GATEWAY_PREFIX = "suzumio-gateway-"
GATEWAY_FILES = ("suzumio_runner_gateway.py", "suzumio_runner_egress.py")
GATEWAY_DIR = "/run/suzumio-gateway"  # in the gateway (read-write) and in every sealed task (read-only)
GATEWAY_SOCKET = f"{GATEWAY_DIR}/gateway.sock"  # input.json controllerVia
GATEWAY_USER = "65532:65532"
GATEWAY_PROBE_SECONDS = 3.0  # gc: how long a listener may take to accept before its gateway is removed
GATEWAY_READY_SECONDS = 60.0  # a new gateway's tasks start on every node before the first activation's
NETWORK_SUFFIX = "-net"
NODE_LOST_ERROR = "Swarm node {node} was lost while it ran this activation (task {task})"
SERVICE_GONE_ERROR = "Runner service {service} was removed while its activation ran"
SWARM_NEEDS_LISTENER = ("backend.kind swarm needs serve --runner-listen HOST:PORT (at an address the "
                        "Swarm nodes reach): its tasks cannot reach the controller's runner socket")


def service_name(activation_id):
    """A service name Swarm accepts (letters, digits and '-', at most 63): the activation id's."""
    return (SERVICE_PREFIX + re.sub(r"[^a-z0-9]+", "-", activation_id.lower())).strip("-")[:63]


def swarm_service(name):
    """The service of a recorded containerName, or None when it names no Swarm service."""
    return name[len(SWARM_PREFIX):] if isinstance(name, str) and name.startswith(SWARM_PREFIX) else None


def listener_address(controller_url):
    """(host, port) of the https runner listener a controllerUrl names."""
    parts = urlsplit(controller_url)
    return parts.hostname, parts.port or 443


def gateway_name(controller_url):
    """One gateway per runner listener, named by a digest of its address (a listener that moves gets
    a new one; projects of the same controller share it)."""
    host, port = listener_address(controller_url)
    return GATEWAY_PREFIX + hashlib.sha256(f"{host}:{port}".encode()).hexdigest()[:12]


def gateway_mount(name, read_only):
    """The node's gateway folder: a tmpfs volume of the node (created with the gateway's first task
    there, shared by the node's containers that mount it), owned by the gateway's user."""
    types = docker_sdk().types
    uid, gid = GATEWAY_USER.split(":")
    driver = types.DriverConfig("local", options={"type": "tmpfs", "device": "tmpfs",
                                                  "o": f"uid={uid},gid={gid},mode=0755"})
    return types.Mount(GATEWAY_DIR, name, type="volume", read_only=read_only, driver_config=driver,
                       labels={"suzumio.managed": "true", "suzumio.gateway": name})


def scratch_volume(controller_url, project, agent_id, owner, target):
    """The name of an agent's volume for one writable folder on a node, the same for every activation of
    the agent (one running at a time), so a node keeps one set per agent rather than one per activation:
    nothing removes a volume on a node. Named by a digest of the runner listener, the project, the agent,
    the owner and the folder, so that no other agent, user or running controller mounts it."""
    key = "\0".join([controller_url, project, agent_id, ":".join(owner) if owner else "", target])
    return "suzumio-scratch-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def scratch_mount(target, volume, owner, labels):
    """One of the task's writable folders: a tmpfs volume of its node, empty at each start (the node
    unmounts it when the task ends; a task of the agent still stopping there shares it until then),
    owned by the task's user (`owner`: its uid and gid, or None for a named user, when it is open to
    all). Not a tmpfs mount: runc gives a tmpfs mounted over a folder of the image that folder's mode
    (root's 0755 for /workspace and /mnt in the runner image), whatever mode it was asked for, and the
    user could not write there. Not anonymous either: the node then makes one more, never used, for each
    mount. `nocopy`, or the engine would copy the image folder's owner and mode onto it."""
    types = docker_sdk().types
    access = f"uid={owner[0]},gid={owner[1]},mode=0700" if owner else "mode=1777"
    driver = types.DriverConfig("local", options={"type": "tmpfs", "device": "tmpfs",
                                                  "o": f"{access},nosuid,nodev,noexec"})
    return types.Mount(target, volume, type="volume", no_copy=True, driver_config=driver,
                       labels={**labels, "suzumio.scratch": target})


def scratch_targets(mounts):
    """The task's writable folders: SCRATCH_TARGETS, and one for each configured mount outside them (its
    target, or a file's folder), where the runner puts the copy it fetches."""
    targets = list(SCRATCH_TARGETS)
    for mount in mounts:
        target = normalize_mount_target(mount.target).rstrip("/")
        folder = target if os.path.isdir(mount.source) else os.path.dirname(target)
        if folder not in ("", "/") and not any(folder == t or folder.startswith(t + "/") for t in targets):
            targets.append(folder)
    return targets


def types_mode_global():
    return docker_sdk().types.ServiceMode("global")


def nano_cpus(cpus):
    return None if cpus in (None, False) else int(float(cpus) * 1e9)


class SwarmTask:
    """The one task of an activation's service as the manager reports it."""

    def __init__(self, state, exit_code, node_id, node, node_state, error):
        self.state, self.exit_code, self.error = state, exit_code, error
        self.node_id, self.node, self.node_state = node_id, node, node_state

    @property
    def ended(self):
        return self.state in ENDED_STATES

    @property
    def node_lost(self):
        """Its node is down or gone: the task will never report again."""
        return bool(self.node_id) and not self.ended and self.node_state in LOST_NODE_STATES


class SwarmBackend(Backend):
    """Services, secrets and configs on one or more Swarm managers (one client per engine URL)."""

    kind = KIND_SWARM
    listener_required = SWARM_NEEDS_LISTENER

    @staticmethod
    def local_toolpack(pack):
        raise ValueError(f"backend.kind swarm cannot run the local toolpack {pack.id} yet (its files are "
                         "on the controller); allow none of its tools")

    @staticmethod
    def input_fields(config):
        # Nothing is mounted: the runner fetches its files from the controller and sends its own artifacts
        # back (suzumio_files), and forbids new privileges to itself and its tools.
        fields = {"files": "controller", "noNewPrivileges": True}
        if config.backend.swarm.sealed:
            # The task's one route: its node's gateway, which carries the bytes to the listener.
            fields["controllerVia"] = GATEWAY_SOCKET
        return fields

    def __init__(self, host):
        super().__init__(host)
        self.environ = host.environ
        self._clients = {}
        self._runner_configs = {}  # (engine, config name) -> config id; configs are immutable
        self._gateways = set()  # (engine, gateway name) known to run
        self._lock = threading.Lock()
        self._gateway_lock = threading.Lock()  # one creation at a time: activations start in parallel

    def client(self, engine):
        """The SDK client of `engine` (None: DOCKER_HOST of the controller's environment, else local)."""
        with self._lock:
            client = self._clients.get(engine)
            if client is None:
                docker = docker_sdk()
                client = (docker.DockerClient(base_url=engine) if engine
                          else docker.from_env(environment=self.environ))
                self._clients[engine] = client
            return client

    def close(self):
        """Close the engine clients (idempotent); services keep running."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    # -- creating

    def runner_configs(self, engine, paths, owner):
        """ConfigReferences of the runner's files under RUNNER_DIR: one Swarm config per file content
        (named by its digest, so every activation of the same runner shares it and an upgrade gets new
        ones), created on first use."""
        docker = docker_sdk()
        client = self.client(engine)
        references = []
        for path in paths:
            data = path.read_bytes()
            name = f"suzumio-runner-{hashlib.sha256(data).hexdigest()[:12]}-{path.name}"[:64]
            with self._lock:
                config_id = self._runner_configs.get((engine, name))
            if config_id is None:
                found = client.configs.list(filters={"name": name})
                found = [c for c in found if c.name == name]
                if found:
                    config_id = found[0].id
                else:
                    try:
                        config_id = client.configs.create(name=name, data=data, labels={
                            "suzumio.managed": "true", "suzumio.runner-file": path.name}).id
                    except docker.errors.APIError as error:
                        if http_status(error) != 409:
                            raise
                        config_id = next(c for c in client.configs.list(filters={"name": name}) if c.name == name).id
                with self._lock:
                    self._runner_configs[(engine, name)] = config_id
            references.append(docker.types.ConfigReference(config_id, name, filename=f"{RUNNER_DIR}/{path.name}",
                                                           uid=owner[0], gid=owner[1], mode=0o444))
        return references

    def ensure_gateway(self, engine, launch):
        """The gateway service of the launch's runner listener, created on first use (and its tasks
        waited for) or adopted when it exists; returns its name, which is also its volume's."""
        docker = docker_sdk()
        name = gateway_name(launch.data["controllerUrl"])
        with self._gateway_lock:
            if (engine, name) in self._gateways:
                return name
            client = self.client(engine)
            if not [s for s in client.services.list(filters={"name": name}) if s.name == name]:
                host, port = listener_address(launch.data["controllerUrl"])
                files = launch.runner_files(GATEWAY_FILES)
                labels = {"suzumio.managed": "true", "suzumio.gateway": name}
                try:
                    client.services.create(
                        launch.config.backend.image,
                        ["python3", f"{RUNNER_DIR}/{GATEWAY_FILES[0]}", GATEWAY_SOCKET, host, str(port)],
                        name=name, labels=labels, container_labels=labels, mode=types_mode_global(),
                        networks=["host"], user=GATEWAY_USER, cap_drop=["ALL"], privileges={"NoNewPrivileges": True},
                        mounts=[gateway_mount(name, read_only=False)],
                        configs=self.runner_configs(engine, files, GATEWAY_USER.split(":")))
                except docker.errors.APIError as error:
                    if http_status(error) != 409:  # another controller of this listener made it meanwhile
                        raise
                self._wait_for_gateway(client, name)
            self._gateways.add((engine, name))
        return name

    @staticmethod
    def _wait_for_gateway(client, name):
        """Until a task of the new gateway runs on every node that takes tasks: a task placed before
        its node's gateway runs would find no socket."""
        deadline = time.monotonic() + GATEWAY_READY_SECONDS
        while time.monotonic() < deadline:
            nodes = [n for n in client.api.nodes() if (n.get("Spec") or {}).get("Availability") == "active"
                     and (n.get("Status") or {}).get("State") == "ready"]
            running = {t.get("NodeID") for t in client.api.tasks(filters={"service": name, "desired-state": "running"})
                       if (t.get("Status") or {}).get("State") == "running"}
            if nodes and all(n["ID"] in running for n in nodes):
                return
            time.sleep(PLACEMENT_POLL_SECONDS)
        log.warning("gateway %s: not running on every node after %ss", name, GATEWAY_READY_SECONDS)

    def create_network(self, client, service, labels):
        """The task's own overlay: internal (no gateway, no route out) and joined by nothing else."""
        return client.networks.create(service + NETWORK_SUFFIX, driver="overlay", internal=True, labels=labels).id

    def create(self, launch, user, owner):
        """Create the activation's secret and service (the task starts as soon as a node takes it);
        returns the recorded name. `user`: the task's user; `owner`: (uid, gid) strings of its secret."""
        docker = docker_sdk()
        types = docker.types
        swarm = launch.config.backend.swarm
        client = self.client(swarm.engine)
        service = service_name(launch.activation_id)
        labels = {"suzumio.managed": "true", "suzumio.project": launch.project,
                  "suzumio.agent": launch.agent["id"], "suzumio.activation": launch.activation_id}
        image = launch.config.backend.image
        if swarm.resolve_image != "never":
            digest = client.api.inspect_distribution(image)["Descriptor"]["digest"]
            image = f"{image.split('@')[0]}@{digest}"
        owned = owner if numeric_ids(user) else None
        volume_labels = {key: value for key, value in labels.items() if key != "suzumio.activation"}
        mounts = [scratch_mount(target, scratch_volume(launch.data["controllerUrl"], launch.project,
                                                       launch.agent["id"], owned, target), owned, volume_labels)
                  for target in scratch_targets(launch.config.mounts_for(launch.agent["id"]))]
        networks = [swarm.network]
        if swarm.sealed:
            mounts.append(gateway_mount(self.ensure_gateway(swarm.engine, launch), read_only=True))
        secret = client.secrets.create(name=f"{service}-input", labels=labels,
                                       data=json.dumps(launch.data).encode("utf-8"))
        try:
            if swarm.sealed:
                networks = [self.create_network(client, service, labels)]
            configs = self.runner_configs(swarm.engine, launch.runner_files(), owner)
            placement = launch.config.swarm_placement(launch.agent["id"])
            sandbox = launch.config.sandbox(launch.agent["id"])
            resources = self.resources(placement, sandbox)
            environment = {key: value for key, value in launch.env.items() if key != "SUZUMIO_TOKEN"}
            if user.split(":", 1)[0] not in ("0", "root"):
                environment.setdefault("HOME", "/tmp")
            client.services.create(
                image, ["python3", f"{RUNNER_DIR}/{launch.runner_files()[0].name}"],
                args=["--input", INPUT_PATH], name=service, labels=labels, container_labels=labels,
                mode=types.ServiceMode("replicated-job"), networks=networks,
                restart_policy=types.RestartPolicy(condition="none"),
                constraints=list(placement.constraints),
                preferences=[("spread", label) for label in placement.preferences] or None,
                resources=resources, env=environment, user=user, workdir="/workspace",
                cap_drop=["ALL"], cap_add=list(sandbox.cap_add) or None,
                # An engine whose API lacks this field ignores it; the runner then sets no_new_privs on itself.
                privileges={"NoNewPrivileges": True}, mounts=mounts,
                secrets=[types.SecretReference(secret.id, secret.name, filename=INPUT_FILE, uid=owner[0],
                                               gid=owner[1], mode=0o400)],
                configs=configs)
        except BaseException:
            self._remove_held(client, launch.activation_id)
            raise
        return SWARM_PREFIX + service

    @staticmethod
    def resources(placement, sandbox):
        """Reservations and limits: backend.swarm / agents.<id>.swarm, the limits defaulting to the
        docker-chat ones (backend.docker and agents.<id>.docker memory, cpus and pidsLimit)."""
        docker = docker_sdk()
        memory = placement.limit_memory
        if memory is None and sandbox.memory:
            memory = docker.utils.parse_bytes(sandbox.memory)
        cpus = placement.limit_cpus if placement.limit_cpus is not None else sandbox.cpus
        resources = docker.types.Resources(cpu_limit=nano_cpus(cpus), mem_limit=memory or None,
                                           cpu_reservation=nano_cpus(placement.reserve_cpus),
                                           mem_reservation=placement.reserve_memory)
        if sandbox.pids_limit:
            resources.setdefault("Limits", {})["Pids"] = int(sandbox.pids_limit)
        return resources

    # -- following

    def task(self, engine, service):
        """The SwarmTask of a service; None while it has none yet; False when the service is gone."""
        docker = docker_sdk()
        client = self.client(engine)
        try:
            tasks = client.api.tasks(filters={"service": service})
        except docker.errors.NotFound:
            return False
        if not tasks:
            try:
                client.api.inspect_service(service)
            except docker.errors.NotFound:
                return False
            return None
        task = max(tasks, key=lambda t: t.get("CreatedAt", ""))
        status = task.get("Status") or {}
        container = status.get("ContainerStatus") or {}
        node_id = task.get("NodeID") or ""
        node = node_state = ""
        if node_id:
            try:
                attrs = client.api.inspect_node(node_id)
                node = (attrs.get("Description") or {}).get("Hostname") or node_id
                node_state = (attrs.get("Status") or {}).get("State", "")
            except docker.errors.NotFound:
                node, node_state = node_id, "unknown"
        return SwarmTask(status.get("State", ""), container.get("ExitCode"), node_id, node, node_state,
                         status.get("Err") or "")

    def service_log(self, engine, service):
        """The service's last log lines; '' when the manager no longer has them."""
        try:
            raw = self.client(engine).api.service_logs(service, stdout=True, stderr=True, tail=LOG_TAIL_LINES,
                                                       follow=False)
            text = b"".join(raw).decode("utf-8", "replace")
        except engine_errors() as error:
            log.warning("no logs for service %s: %s", service, error)
            return ""
        return tail_lines(text)

    def remove(self, engine, service, activation_id=None):
        """Remove a service (its task stops) and the secrets labelled with its activation; a missing one
        is success, another engine error is logged."""
        client = self.client(engine)
        try:
            client.api.remove_service(service)
        except engine_errors() as error:
            if http_status(error) != 404:
                log.warning("removing service %s failed: %s", service, error)
        if activation_id is not None:
            self._remove_held(client, activation_id)

    @staticmethod
    def _remove_held(client, activation_id):
        """Remove an activation's secret and network. Each is in use until the service's task is gone,
        when the manager lets it go: asked again for up to 10 s."""
        deadline = time.monotonic() + 10
        for kind, collection in (("secret", client.secrets), ("network", client.networks)):
            for item in collection.list(filters={"label": f"suzumio.activation={activation_id}"}):
                while True:
                    try:
                        item.remove()
                        break
                    except engine_errors() as error:
                        if http_status(error) == 404:
                            break
                        if time.monotonic() >= deadline:
                            log.warning("removing %s %s failed: %s", kind, item.name, error)
                            break
                        time.sleep(0.2)

    def services(self, engine, project, activation_id=None):
        """(recorded name, activation id) of a project's activation services (of one activation)."""
        labels = ["suzumio.managed=true", f"suzumio.project={project}"]
        if activation_id is not None:
            labels.append(f"suzumio.activation={activation_id}")
        found = []
        for service in self.client(engine).api.services(filters={"label": labels}):
            spec = service.get("Spec") or {}
            found.append((SWARM_PREFIX + spec.get("Name", ""), (spec.get("Labels") or {}).get("suzumio.activation")))
        return found


    # -- the contract: one activation

    def engine(self, store):
        """backend.swarm.engine of a project: where its services run."""
        return self.host.configs.get(store).backend.swarm.engine

    def start(self, store, launch, slot=None):
        """Create the activation's service, record it, and follow it."""
        user = container_user(launch.config.sandbox(launch.agent["id"]).user, os.getuid(), os.getgid())
        owner = tuple(str(i) for i in (numeric_ids(user) or (0, 0)))
        name = self.create(launch, user, owner)
        engine = launch.config.backend.swarm.engine
        try:
            store.set_activation_container(launch.activation_id, name)
        except Exception:
            # Unrecorded, nothing would ever settle it (a controller dying right here leaves it to the
            # reconciler, which finds it by its labels).
            self.remove(engine, swarm_service(name), launch.activation_id)
            raise
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            self.remove(engine, swarm_service(name), launch.activation_id)
            return
        self.host.follow(store, launch.activation_id, name, launch.secrets)

    def wait(self, store, activation_id, name, secrets, closed):
        """Follow the service until its task ends (its log tail kept as runner.log, redacted), recording
        the task's node once it has one. A lost node or a removed service is an `error`."""
        engine, service = self.engine(store), swarm_service(name)
        recorded_node = None
        while not closed.wait(POLL_SECONDS if recorded_node else PLACEMENT_POLL_SECONDS):
            try:
                task = self.task(engine, service)
            except engine_errors() as error:
                # A manager that does not answer now (a leader election, a restart) may answer the next
                # poll; the activation's timeout bounds the wait.
                log.warning("activation %s: cannot ask the manager about service %s: %s", activation_id, service,
                            error)
                continue
            if task is False:
                return Exit(error=SERVICE_GONE_ERROR.format(service=service))
            if task is None:
                continue
            if task.node and task.node != recorded_node:
                store.set_activation_node(activation_id, task.node)
                recorded_node = task.node
            if task.node_lost:
                log.warning("activation %s: node %s is %s", activation_id, task.node, task.node_state)
                return Exit(error=NODE_LOST_ERROR.format(node=task.node, task=task.state))
            if not task.ended:
                continue
            text = self.service_log(engine, service)
            if task.error and task.state != "complete":
                text = f"{text}\n{task.state}: {task.error}".strip()
            redacted = redact(text, secrets)
            save_log_tail(store, activation_id, redacted)
            code = task.exit_code if task.exit_code is not None else (0 if task.state == "complete" else 1)
            return Exit(code, lambda text=redacted: text)
        return None

    def ended(self, store, activation_id, name, secrets):
        """Remove the service and what it held (its secret, its network)."""
        self.remove(self.engine(store), swarm_service(name), activation_id)

    def stop(self, store, activation_id, name):
        # Its secret goes once the task is gone: the activation's watcher removes it then.
        self.remove(self.engine(store), swarm_service(name))

    def log_tail(self, store, activation_id, name):
        """The kept runner.log once the task ended, else what the manager has."""
        path = store.activation_dir(activation_id) / "runner.log"
        if path.exists():
            return tail_lines(path.read_text(encoding="utf-8", errors="replace"))
        return self.service_log(self.engine(store), swarm_service(name))

    # -- the contract: after a controller restart

    def owns(self, name):
        return swarm_service(name) is not None

    def find(self, store, config, activation_id):
        found = self.services(config.backend.swarm.engine, config.name, activation_id)
        return found[0][0] if found else None

    def adopt(self, store, activation, name):
        if self.task(self.engine(store), swarm_service(name)) is False:
            return Exit(error=f"Runner service {swarm_service(name)} not found")
        return None

    def collect_garbage(self, store, config, runner_socket):
        """Remove this project's services, and input secrets and task networks, whose activation is not
        running (a controller that died before it removed them), then the gateway of the project's
        listener when nothing answers there. Returns the count of services removed."""
        engine = config.backend.swarm.engine
        removed = 0
        client = self.client(engine)
        labels = ["suzumio.managed=true", f"suzumio.project={store.project_id}"]
        held = [*client.secrets.list(filters={"label": labels}), *client.networks.list(filters={"label": labels})]
        for thing in held:
            activation_id = (thing.attrs.get("Labels") or (thing.attrs.get("Spec") or {}).get("Labels") or {}).get(
                "suzumio.activation")
            try:
                ended = activation_id and store.activation(activation_id)["status"] != ACT_RUNNING
            except NotFound:
                continue  # another root's (the same project name on this Swarm)
            if ended and not self.host.watched(activation_id):
                try:
                    thing.remove()
                except engine_errors() as error:
                    log.info("%s not removed yet (%s): its task is still stopping", thing.name, error)
        for name, activation_id in self.services(engine, store.project_id):
            if not activation_id or self.host.watched(activation_id):
                continue
            try:
                running = store.activation(activation_id)["status"] == ACT_RUNNING
            except NotFound:
                continue  # another root's activation (the same project name on this Swarm)
            if not running:
                self.remove(engine, swarm_service(name), activation_id)
                removed += 1
        self.collect_gateway(engine, config.backend.controller_url)
        return removed

    def collect_gateway(self, engine, controller_url):
        """Remove the gateway of a runner listener when nothing answers at its address from here (its
        controller is gone; a controller started there later makes it anew). Returns whether it was
        removed."""
        name = gateway_name(controller_url)
        client = self.client(engine)
        if not [service for service in client.services.list(filters={"name": name}) if service.name == name]:
            return False
        try:
            socket.create_connection(listener_address(controller_url), timeout=GATEWAY_PROBE_SECONDS).close()
            return False
        except OSError:
            pass
        try:
            client.api.remove_service(name)
        except engine_errors() as error:
            if http_status(error) != 404:
                log.warning("removing gateway %s failed: %s", name, error)
                return False
        return True


def save_log_tail(store, activation_id, text):
    """Keep a service's log tail as activations/<id>/runner.log (0600, redacted by the caller)."""
    path = store.activation_dir(activation_id) / "runner.log"
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text + ("\n" if text else ""))
