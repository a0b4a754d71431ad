"""Reconciliation, for `serve`: the timeout check on every running activation, the adoption of the
runners no watcher of this process follows (a controller restarted while they ran), the prepared
containers an earlier controller left, and `suzumio gc`. Starting and watching runners is
suzumio_backend's Backends; a Reconciler drives one through its public methods."""
import datetime
import logging
import threading

import suzumio_backend_swarm as swarm_backend
import suzumio_effects
from suzumio_backend import (
    ADOPT_POLL_SECONDS,
    KIND_DOCKER,
    NEVER_STARTED_ERROR,
    NEVER_STARTED_GRACE_MS,
    NO_OUTPUT_ERROR,
    RECONCILE_INTERVAL_SECONDS,
    engine_errors,
    is_timed_out,
    secret_values,
    warm_owner,
)
from suzumio_backend_local import (
    KIND_LOCAL,
    LOCAL_PREFIX,
    find_local_runner,
    local_pid,
    local_runner_alive,
    runner_marker,
)
from suzumio_config import KIND_SWARM
from suzumio_errors import NotFound
from suzumio_records import ACT_RUNNING, parse_ts, utc_now

log = logging.getLogger(__name__)
CLOSE_GRACE_SECONDS = 5.0


class Reconciler:
    """Reconciles the running activations of a root against the runners that are really there, through
    one Backends (its watchers, stop and expiry); its loop runs on one named thread until close()."""

    def __init__(self, backends):
        self.backends = backends
        self.docker = backends.docker
        self.retention = backends.retention
        self._stop = threading.Event()
        self._thread = None

    def start_reconciling(self, list_stores, interval=RECONCILE_INTERVAL_SECONDS, on_fatal=None):
        """Run `reconcile` now and then every `interval` seconds on a named thread until close();
        `on_fatal(component, error)` hears of an error that ends the loop."""
        def loop():
            try:
                while True:
                    self.reconcile(list_stores())
                    if self._stop.wait(interval):
                        return
            except BaseException as error:  # the thread's one boundary: a dead reconciler must be noticed
                log.critical("reconciler thread died", exc_info=True)
                if on_fatal is None:
                    raise
                on_fatal("reconciler", error)
        self._thread = threading.Thread(target=loop, name="suzumio-reconciler", daemon=True)
        self._thread.start()

    def reconcile(self, stores, now=None):
        """One pass: the timeout check on every running activation, then adoption of unwatched ones."""
        docker_used = False
        for store in stores:
            try:
                docker_used = docker_used or store.config()["backend"]["kind"] == KIND_DOCKER
                self._reconcile_project(store, now or utc_now())
            except Exception as error:  # noqa: BLE001 - isolation: one project's error never stops the pass
                log.warning("reconciling project %s failed: %s", store.project_id, error)
        if docker_used and self.backends.runner_socket is not None:
            self.sweep_prepared()

    def sweep_prepared(self):
        """Remove the prepared containers of this root that this process's pool does not hold: those a
        killed or crashed serve left (their runners ended when its warm socket closed). Returns them."""
        removed = []
        try:
            for name, _state in self.docker.warm_containers(owner=warm_owner(self.backends.runner_socket)):
                if self.backends.warm is None or not self.backends.warm.owns(name):
                    log.info("removing prepared container %s left by an earlier controller", name)
                    self.docker.remove(name)
                    removed.append(name)
        except engine_errors() as error:
            log.warning("cannot look for prepared containers: %s", error)
        return removed

    def _reconcile_project(self, store, now):
        suzumio_effects.doubt_after_restart(store)  # the calls a dead controller ran itself
        config = self.backends.configs.get(store)
        timeout_ms = config.backend.activation_timeout_ms
        for activation in store.running_activations():
            if is_timed_out(activation, timeout_ms, now):
                self.backends.expire(store, activation)
                continue
            if self.backends.watched(activation["id"]):
                continue
            self._adopt(store, config, activation, now)

    def _adopt(self, store, config, activation, now):
        activation_id, name = activation["id"], activation.get("containerName")
        if not name:
            try:
                name = self._find_runner(store, config, activation_id)
            except engine_errors() as error:
                log.warning("cannot look for the container of activation %s: %s", activation_id, error)
                return
            claimed = runner_marker(store, activation_id) != activation_id
            if name is None and config.backend.kind == KIND_LOCAL and claimed:
                # Its prepared runner was claimed (runner.slot comes first) and has ended since: it
                # cannot start later, so there is no grace to wait for.
                self.backends.fail_if_running(store, activation_id, NO_OUTPUT_ERROR)
                return
            if name is None:
                age = now - parse_ts(activation["startedAt"])
                if age > datetime.timedelta(milliseconds=NEVER_STARTED_GRACE_MS):
                    self.backends.fail_if_running(store, activation_id, NEVER_STARTED_ERROR)
                return
            if self.backends.watched(activation_id):
                return  # this process has just started it
            log.info("activation %s: adopting its unrecorded runner %s", activation_id, name)
            store.set_activation_container(activation_id, name)
        if swarm_backend.swarm_service(name) is not None:
            agent = store.agent(activation["agentId"], include_token=True)
            swarm_backend.adopt(self.backends, store, activation, name,
                                secret_values(config, agent, self.backends.environ), config.backend.swarm.engine)
            return
        pid = local_pid(name)
        if pid is not None:
            if local_runner_alive(pid, runner_marker(store, activation_id)):
                self.backends.watch(self._watch_adopted_process, store, activation_id, pid)
            else:
                self.backends.fail_if_running(store, activation_id, NO_OUTPUT_ERROR)
            return
        self._adopt_container(store, config, activation, name)

    def _find_runner(self, store, config, activation_id):
        """The runner of an activation whose name was never recorded (the controller died between
        launching and recording it), looked for where the current backend.kind runs them: a live local
        runner of the activation's input.json, or a container labelled with the activation; or None."""
        if config.backend.kind == KIND_LOCAL:
            pid = find_local_runner(store, activation_id)
            return None if pid is None else f"{LOCAL_PREFIX}{pid}"
        if config.backend.kind == KIND_SWARM:
            found = self.backends.swarm.services(config.backend.swarm.engine, config.name, activation_id)
            return found[0][0] if found else None
        return self.docker.find(config.name, activation_id, store.activation(activation_id)["agentId"])

    def _adopt_container(self, store, config, activation, name):
        activation_id = activation["id"]
        try:
            state = self.docker.state(name)
            started = state is not None and state[0] == "created"
            if started:
                # The controller died between creating the container and starting it.
                log.info("activation %s: starting its never started container %s", activation_id, name)
                self.docker.start(name)
        except engine_errors() as error:
            log.warning("cannot inspect container %s of activation %s: %s", name, activation_id, error)
            return
        if state is None:
            self.backends.fail_if_running(store, activation_id, f"Runner container {name} not found")
            return
        current = store.activation(activation_id)
        if started and current["status"] != ACT_RUNNING:
            # Cancelled meanwhile, and its stop may have come before this start: stop it again.
            self.backends.stop_runner(store, current)
            return
        agent = store.agent(activation["agentId"], include_token=True)
        secrets = secret_values(config, agent, self.backends.environ)
        status, code = state
        if status in ("created", "running", "restarting", "paused"):
            self.backends.watch(self.backends.watch_container, store, activation_id, name, secrets,
                                config.backend.docker.keep)
        else:
            self.backends.settle(store, activation_id, code, lambda: self.docker.log_tail(name), secrets)
            self.retention.retire_containers(store, activation["agentId"], config.backend.docker.keep, secrets,
                                             exited=(activation_id, name))

    def _watch_adopted_process(self, store, activation_id, pid):
        marker = runner_marker(store, activation_id)
        while not self.backends.closed.wait(ADOPT_POLL_SECONDS):
            if not local_runner_alive(pid, marker):
                self.backends.record_artifacts(store, activation_id)
                self.backends.fail_if_running(store, activation_id, NO_OUTPUT_ERROR)
                return

    def collect_garbage(self, store, config, runner_socket):
        """`suzumio gc`: per agent, the exited containers beyond backend.docker.keep (their log tails
        saved first), containers that were created but never started for an activation that is no
        longer running (a controller that crashed between create and start), and the prepared containers
        that a `serve` of this root (`runner_socket`, its socket's path) left and no longer runs. Returns
        the count removed."""
        if config.backend.kind == KIND_SWARM:
            removed = swarm_backend.collect_garbage(self.backends, store, config.backend.swarm.engine)
            swarm_backend.collect_gateway(self.backends, config.backend.swarm.engine, config.backend.controller_url)
            return removed
        removed = 0
        owner = warm_owner(runner_socket)
        for name, state in self.docker.warm_containers(owner=owner, project=store.project_id):
            if state != "running":  # a live serve's prepared runners are running; a dead one's ended
                self.docker.remove(name)
                removed += 1
        secrets_by_agent = {}
        for agent in store.list_agents(include_tokens=True):
            secrets_by_agent[agent["id"]] = secret_values(config, agent, self.backends.environ)
            removed += self.retention.retire_containers(store, agent["id"], config.backend.docker.keep,
                                                        secrets_by_agent[agent["id"]])
            for name, activation_id, state in self.docker.agent_containers(store.project_id, agent["id"]):
                if state != "created" or self.backends.watched(activation_id):
                    continue
                try:
                    running = store.activation(activation_id)["status"] == ACT_RUNNING
                except NotFound:
                    continue  # another root's activation (same project and agent names on this engine)
                if not running:
                    self.docker.remove(name)
                    removed += 1
        return removed

    def close(self):
        """Stop the loop (idempotent); a pass in progress finishes first, within CLOSE_GRACE_SECONDS."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=CLOSE_GRACE_SECONDS)
