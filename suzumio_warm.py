"""Warm activations: a bounded pool of prepared runners, one per (project, agent) at most, each a created
and started container (docker-chat) or a spawned interpreter (local) that waits on the warm socket for
the input of the one activation that claims it. Owns the slots, the warm socket listener and the worker
thread that prepares and removes them."""
import hmac
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

WARM_SOCKET = "warm.sock"  # beside the runner socket, in the folder mounted into every container
DEFAULT_LIMIT = 8  # prepared runners of one controller, all projects together (serve --warm)
HELLO_LIMIT = 1024  # bytes of a hello line; a longer one is not a prepared runner
HELLO_TIMEOUT_SECONDS = 10.0  # an unknown connection that says nothing for this long is closed
PENDING_LIMIT = 64  # unauthenticated connections held at once; the oldest goes first
READY_WAIT_SECONDS = 5.0  # a claim waits this long for a just-started runner's hello, then starts cold
SWEEP_SECONDS = 5.0  # how often the worker looks at every project again without a hint
# After a failed prepare, a project's runners are not prepared again for this long: an engine that is
# down (restarting) would otherwise be asked, and fail, at every tick's hint.
FAILED_PREPARE_PAUSE_SECONDS = 5.0
KEY_ENV = "SUZUMIO_WARM_KEY"
SLOT_FLAG = "--warm-slot"


class Slot:
    """One prepared runner: for `agent_id` of `project`, matching `fingerprint` (everything a container
    or process gets at creation), reachable by `connection` once its runner said hello."""

    def __init__(self, project, agent_id, kind, fingerprint):
        self.id = secrets.token_hex(8)
        self.key = secrets.token_hex(24)
        self.project = project
        self.agent_id = agent_id
        self.kind = kind
        self.fingerprint = fingerprint
        self.name = None  # container name (docker-chat)
        self.process = None  # Popen (local)
        self.connection = None
        self.dead = False
        self.taken = False

    @property
    def ready(self):
        return self.connection is not None and not self.dead


def warm_socket_path(runner_socket):
    return Path(runner_socket).parent / WARM_SOCKET


def deliver(slot, payload):
    """Send a claimed slot's runner its activation (one JSON document, then end of stream)."""
    connection = slot.connection
    connection.setblocking(True)
    try:
        connection.sendall(json.dumps(payload, ensure_ascii=False).encode("utf-8"))
        connection.shutdown(socket.SHUT_WR)
    finally:
        connection.close()


class WarmPool:
    """Prepared runners of one controller. `hint(store)` (from the scheduler, after each tick) asks the
    worker to bring the project's slots in line with what it should have; `take` hands a ready slot to
    an activation start; slots of projects that are no longer running, of agents no longer likely next,
    or whose fingerprint no longer matches the config are removed. `preparer` (the Backends) knows how
    to rank agents, fingerprint, prepare and discard."""

    def __init__(self, preparer, runner_socket, limit=DEFAULT_LIMIT, configs=None):
        self.preparer = preparer
        self.limit = limit
        self.configs = configs
        self.path = warm_socket_path(runner_socket)
        self._lock = threading.Condition()
        self._slots = {}  # slot id -> Slot
        self._stores = {}  # project -> the store of its latest hint
        self._queue = []  # projects asking for a refresh, in order
        self._paused = {}  # project -> monotonic time before which none of its runners is prepared
        self._closed = threading.Event()
        self._selector = selectors.DefaultSelector()
        self._pending = {}  # connection -> (bytes so far, accepted at)
        self._listener = None
        self._threads = []
        self._waker = socket.socketpair()

    # -- lifecycle

    def start(self):
        """Listen on the warm socket and start the listener and worker threads."""
        try:
            os.unlink(self.path)  # a killed controller's socket
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        os.chmod(self.path, 0o666)  # containers run as another uid; the key is the authentication
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, "accept")
        self._waker[0].setblocking(False)
        self._selector.register(self._waker[0], selectors.EVENT_READ, "wake")
        for target, name in ((self._listen, "suzumio-warm-listener"), (self._work, "suzumio-warm")):
            thread = threading.Thread(target=self._guard(target), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _guard(self, target):
        def run():
            try:
                target()
            except Exception:
                log.exception("warm pool thread %s died; activations start cold", threading.current_thread().name)
        return run

    def close(self):
        """Stop both threads and remove every prepared runner that no activation claimed."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._lock.notify_all()
        self._waker[1].send(b"x")
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        for slot in slots:
            self._discard(slot)
        for connection in list(self._pending):
            connection.close()
        if self._listener is not None:
            self._listener.close()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._selector.close()
        for end in self._waker:
            end.close()

    # -- what the scheduler and the backends call

    def hint(self, store):
        """The scheduler ticked this project: bring its prepared runners up to date, soon and
        on the worker thread (a tick never waits for an engine call of the pool)."""
        if self._closed.is_set():
            return
        with self._lock:
            self._stores[store.project_id] = store
            if store.project_id not in self._queue:
                self._queue.append(store.project_id)
                self._lock.notify_all()

    def take(self, project, agent_id, kind, fingerprint):
        """The ready slot of this agent when its fingerprint matches (waiting up to READY_WAIT_SECONDS
        for one being prepared or just started), removed from the pool; None means: start cold. A stale
        slot (another config, a dead runner) is left to the worker, which replaces it."""
        deadline = time.monotonic() + READY_WAIT_SECONDS
        with self._lock:
            while True:
                slot = self._slot_of(project, agent_id)
                if slot is None:
                    return None
                if slot.dead or slot.kind != kind or slot.fingerprint != fingerprint:
                    if project not in self._queue:
                        self._queue.append(project)
                        self._lock.notify_all()
                    return None
                if slot.ready:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # Never said hello (its runner died first, or its hello was crowded out): replace it.
                    slot.dead = True
                    if project not in self._queue:
                        self._queue.append(project)
                    self._lock.notify_all()
                    return None
                self._lock.wait(remaining)
            del self._slots[slot.id]
            slot.taken = True
            self._lock.notify_all()
        self.detach(slot)
        return slot

    def owns(self, name):
        """True for the container name of one of this pool's unclaimed slots."""
        with self._lock:
            return any(slot.name == name for slot in self._slots.values())

    def slots(self, project=None):
        """(agent id, kind, ready) of the unclaimed slots, for tests and benches."""
        with self._lock:
            return sorted((slot.agent_id, slot.kind, slot.ready) for slot in self._slots.values()
                          if project is None or slot.project == project)

    def wait_ready(self, project, agent_id, timeout):
        """Wait until this agent has a ready slot; True when it has."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                slot = self._slot_of(project, agent_id)
                if slot is not None and slot.ready:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed.is_set():
                    return False
                self._lock.wait(min(remaining, 0.5))

    def _slot_of(self, project, agent_id):
        for slot in self._slots.values():
            if slot.project == project and slot.agent_id == agent_id:
                return slot
        return None

    # -- the worker: prepare and remove

    def _work(self):
        last_sweep = time.monotonic()
        while not self._closed.is_set():
            with self._lock:
                if not self._queue:
                    self._lock.wait(SWEEP_SECONDS)
                if self._closed.is_set():
                    return
                if not self._queue and time.monotonic() - last_sweep >= SWEEP_SECONDS:
                    self._queue = list(self._stores)
                    last_sweep = time.monotonic()
                project = self._queue.pop(0) if self._queue else None
                store = self._stores.get(project)
            if store is not None:
                try:
                    self._refresh(store)
                except Exception as error:  # noqa: BLE001 - one project's engine or config error spares the rest
                    log.warning("preparing runners of project %s failed: %s", project, error)

    def _refresh(self, store):
        """Bring one project's slots in line: the agents `preparer.wanted` names, one slot each, with the
        current fingerprint, within the global limit."""
        project = store.project_id
        wanted = self.preparer.wanted(store, self.configs)  # [(agent, kind, fingerprint, config)], best first
        keep = {(agent["id"], kind, fingerprint) for agent, kind, fingerprint, _config in wanted}
        with self._lock:
            stale = [slot for slot in self._slots.values() if slot.project == project
                     and (slot.dead or (slot.agent_id, slot.kind, slot.fingerprint) not in keep)]
            for slot in stale:
                del self._slots[slot.id]
            if not wanted:
                self._stores.pop(project, None)
        for slot in stale:
            self._discard(slot)
        for agent, kind, fingerprint, config in wanted:
            with self._lock:
                if self._closed.is_set() or len(self._slots) >= self.limit:
                    return
                if time.monotonic() < self._paused.get(project, 0.0):
                    return
                if self._slot_of(project, agent["id"]) is not None:
                    continue
                slot = Slot(project, agent["id"], kind, fingerprint)
                self._slots[slot.id] = slot
            try:
                self.preparer.prepare(store, config, agent, slot)
            except Exception as error:  # noqa: BLE001 - a slot that cannot be prepared leaves a cold start
                log.warning("preparing a runner for %s/%s failed: %s", project, agent["id"], error)
                slot.dead = True
                with self._lock:
                    self._paused[project] = time.monotonic() + FAILED_PREPARE_PAUSE_SECONDS
            with self._lock:
                gone = self._slots.get(slot.id) is not slot or slot.dead or self._closed.is_set()
                if gone and not slot.taken:
                    self._slots.pop(slot.id, None)
                self._lock.notify_all()
            if gone and not slot.taken:
                self._discard(slot)

    def _discard(self, slot):
        slot.dead = True
        if slot.connection is not None:
            self.detach(slot)
            try:
                slot.connection.close()
            except OSError:
                pass
        try:
            self.preparer.discard(slot)
        except Exception as error:  # noqa: BLE001 - the reconciler removes what is left
            log.warning("removing prepared runner %s failed: %s", slot.name or slot.id, error)

    # -- the listener: hellos and hang-ups

    def _listen(self):
        while not self._closed.is_set():
            events = self._selector.select(timeout=1.0)
            for key, _mask in events:
                if key.data == "wake":
                    return
                if key.data == "accept":
                    self._accept()
                elif key.data == "hello":
                    self._read_hello(key.fileobj)
                else:
                    self._hang_up(key.fileobj, key.data)
            self._expire_pending()

    def _accept(self):
        try:
            connection, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        connection.setblocking(False)
        if len(self._pending) >= PENDING_LIMIT:
            oldest = min(self._pending, key=lambda c: self._pending[c][1])
            self._drop(oldest)
        self._pending[connection] = (b"", time.monotonic())
        self._selector.register(connection, selectors.EVENT_READ, "hello")

    def _drop(self, connection):
        self._pending.pop(connection, None)
        try:
            self._selector.unregister(connection)
        except (KeyError, ValueError):
            pass
        connection.close()

    def _expire_pending(self):
        now = time.monotonic()
        for connection, (_data, since) in list(self._pending.items()):
            if now - since > HELLO_TIMEOUT_SECONDS:
                self._drop(connection)

    def _read_hello(self, connection):
        data, since = self._pending[connection]
        try:
            chunk = connection.recv(HELLO_LIMIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        data += chunk
        if not chunk or len(data) > HELLO_LIMIT:
            self._drop(connection)
            return
        if b"\n" not in data:
            self._pending[connection] = (data, since)
            return
        try:
            hello = json.loads(data.split(b"\n", 1)[0])
            slot_id, key = str(hello["slot"]), str(hello["key"])
        except (ValueError, KeyError, TypeError):
            self._drop(connection)
            return
        self._pending.pop(connection, None)
        self._selector.unregister(connection)
        with self._lock:
            slot = self._slots.get(slot_id)
            known = (slot is not None and slot.connection is None and not slot.dead
                     and hmac.compare_digest(slot.key.encode(), key.encode()))
        if not known:
            connection.close()
            return
        # Watched for its hang-up from now on (a runner that died while waiting is replaced); watched
        # before it is handed out, since a claim may take and close it at once.
        self._selector.register(connection, selectors.EVENT_READ, slot)
        with self._lock:
            if not (slot.dead or slot.taken):
                slot.connection = connection
                self._lock.notify_all()
                return
        self._selector.unregister(connection)
        connection.close()

    def _hang_up(self, connection, slot):
        """A prepared runner's connection became readable: it hung up (it never sends more)."""
        try:
            self._selector.unregister(connection)
        except (KeyError, ValueError):
            return
        with self._lock:
            if slot.taken:
                return  # claimed meanwhile: the claim owns the connection now
            slot.dead = True
            if self._slots.get(slot.id) is slot and slot.project not in self._queue:
                self._queue.append(slot.project)
            self._lock.notify_all()

    def detach(self, slot):
        """Stop watching a claimed slot's connection (the claim sends on it next)."""
        try:
            self._selector.unregister(slot.connection)
        except (KeyError, ValueError, OSError):
            pass
