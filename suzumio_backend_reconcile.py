"""Reconciliation, for `serve`: the timeout check on every running activation, the adoption of the
runners no watcher of this process follows (a controller restarted while they ran), the prepared
runners an earlier controller left, and `suzumio gc`. Starting and watching runners is
suzumio_backend's Backends; a Reconciler drives one, and each kind's Backend, through their public methods."""
import datetime
import logging
import threading

import suzumio_effects
from suzumio_backend import (
    NEVER_STARTED_ERROR,
    NEVER_STARTED_GRACE_MS,
    NO_OUTPUT_ERROR,
    RECONCILE_INTERVAL_SECONDS,
    engine_errors,
    is_timed_out,
)
from suzumio_records import parse_ts, utc_now

log = logging.getLogger(__name__)
CLOSE_GRACE_SECONDS = 5.0


class Reconciler:
    """Reconciles the running activations of a root against the runners that are really there, through
    one Backends (its watchers, stop and expiry); its loop runs on one named thread until close()."""

    def __init__(self, backends):
        self.backends = backends
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
        kinds = set()
        for store in stores:
            try:
                kinds.add(store.config()["backend"]["kind"])
                self._reconcile_project(store, now or utc_now())
            except Exception as error:  # noqa: BLE001 - isolation: one project's error never stops the pass
                log.warning("reconciling project %s failed: %s", store.project_id, error)
        if kinds and self.backends.runner_socket is not None:
            self.sweep_prepared(kinds)

    def sweep_prepared(self, kinds=None):
        """Remove the prepared runners of this root that this process's pool does not hold (of the
        backends of `kinds`, else of all): those a killed or crashed serve left (their runners ended when
        its warm socket closed). Returns their names."""
        removed = []
        for kind in sorted(kinds) if kinds is not None else [None]:
            for backend in [self.backends.backend(kind)] if kind is not None else self.backends.backends():
                removed += backend.sweep(self.backends.runner_socket, self.backends.warm)
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
            backend = self.backends.backend(config.backend.kind)
            try:
                name = backend.find(store, config, activation_id)
            except engine_errors() as error:
                log.warning("cannot look for the runner of activation %s: %s", activation_id, error)
                return
            if name is None and not backend.may_start_later(store, activation_id):
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
        backend = self.backends.backend_of(name)
        try:
            ended = backend.adopt(store, activation, name)
        except engine_errors() as error:
            log.warning("cannot inspect runner %s of activation %s: %s", name, activation_id, error)
            return
        secrets = self.backends.secrets(config, store.agent(activation["agentId"], include_token=True))
        if ended is None:
            self.backends.follow(store, activation_id, name, secrets)
            return
        self.backends.settle(store, activation_id, ended, secrets)
        backend.ended(store, activation_id, name, secrets)

    def collect_garbage(self, store, config, runner_socket):
        """`suzumio gc` for one project, by its backend (docs/cli.md): what runners of ended activations
        left, and the prepared runners a `serve` of this root (`runner_socket`, its socket's path) left
        and no longer runs. Returns the count removed."""
        return self.backends.backend(config.backend.kind).collect_garbage(store, config, runner_socket)

    def close(self):
        """Stop the loop (idempotent); a pass in progress finishes first, within CLOSE_GRACE_SECONDS."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=CLOSE_GRACE_SECONDS)
