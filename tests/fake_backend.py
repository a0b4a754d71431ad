"""An in-memory backend (suzumio_backend_contract's Backend) for tests that exercise scheduling, not
runners: a FakeRunner per activation and no process. The test makes a runner submit output or exit
(`complete`, `exit`), or lets it play what the agent's STANDIN_MODE says (as tests/stand_in_runner.py
reads it: `output`, `exit:<code>`, `sleep`), else the engine's `script`. Runners live in a FakeEngine,
which every Backends a test builds over it shares, so a restarted controller finds and adopts them."""
import itertools
import threading

import suzumio_config
import suzumio_coordination as coordination
from suzumio_backend_contract import Backend, Exit
from suzumio_backend_local import tail_lines
from suzumio_records import ACT_RUNNING

FAKE_PREFIX = "fake-"
STOPPED_CODE = 143  # what a runner ended by SIGTERM reports (128 + 15)
POLL_SECONDS = 0.02


class FakeRunner:
    """One activation's runner: running until it is made to complete, exit or stop."""

    def __init__(self, name, store, launch, mode):
        self.name, self.store, self.mode = name, store, mode
        self.project = launch.project
        self.agent_id, self.activation_id = launch.agent["id"], launch.activation_id
        self.env = dict(launch.env)
        self.text = self.env.get("STANDIN_TEXT")
        self.lines = []
        self.code = None
        self.stopped = False
        self.released = False  # its backend's `ended` ran
        self._ended = threading.Event()
        self._played = threading.Lock()

    @property
    def running(self):
        return not self._ended.is_set()

    def complete(self, text="done", usage=None):
        """Submit the activation's output, as the real runner does through the runner routes, then exit 0."""
        config = suzumio_config.ProjectConfig.from_data(self.store.config())
        coordination.complete_activation(self.store, config, self.activation_id, self.agent_id, text, usage)
        self.exit(0)

    def exit(self, code, text=""):
        """End with exit `code`, `text` its last log line."""
        if text:
            self.lines.append(text)
        if self.running:
            self.code = code
            self._ended.set()

    def play(self):
        """Do once what `mode` says; `sleep` (and None) leaves it running."""
        if not self._played.acquire(blocking=False):
            return
        if self.mode == "output":
            self.complete(self.text or "done")
        elif self.mode and self.mode.startswith("exit:"):
            self.exit(int(self.mode.split(":", 1)[1]), self.text or "boom")

    def wait(self, closed):
        while not self._ended.wait(POLL_SECONDS):
            if closed.is_set():
                return False
        return True


class FakeEngine:
    """Where fake runners live across controller restarts. `script`: the mode of a runner whose agent
    sets no STANDIN_MODE ("output" completes it with "done", "sleep" or None keeps it running)."""

    def __init__(self, script=None):
        self.script = script
        self.runners = {}  # name -> FakeRunner
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def backend(self, host):
        """The table entry: a FakeBackend over this engine for one Backends."""
        return FakeBackend(host, self)

    def spawn(self, store, launch):
        with self._lock:
            name = f"{FAKE_PREFIX}{next(self._ids)}"
            runner = self.runners[name] = FakeRunner(name, store, launch,
                                                     launch.env.get("STANDIN_MODE", self.script))
        return runner

    def runner(self, activation_id):
        """The runner of an activation (its newest)."""
        with self._lock:
            found = [r for r in self.runners.values() if r.activation_id == activation_id]
        return found[-1] if found else None

    def running(self):
        with self._lock:
            return [r for r in self.runners.values() if r.running]


class FakeBackend(Backend):
    """The contract over a FakeEngine: starts FakeRunners and reports their ends."""

    kind = "fake"
    container = False

    def __init__(self, host, engine):
        super().__init__(host)
        self.engine = engine

    def start(self, store, launch, slot=None):
        runner = self.engine.spawn(store, launch)
        try:
            store.set_activation_container(launch.activation_id, runner.name)
        finally:
            self.host.follow(store, launch.activation_id, runner.name, launch.secrets)
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            self.stop(store, launch.activation_id, runner.name)

    def wait(self, store, activation_id, name, secrets, closed):
        runner = self.engine.runners[name]
        runner.play()
        if not runner.wait(closed):
            return None
        return Exit(runner.code, lambda: self.log_tail(store, activation_id, name))

    def ended(self, store, activation_id, name, secrets):
        self.engine.runners[name].released = True

    def stop(self, store, activation_id, name):
        runner = self.engine.runners.get(name)
        if runner is not None and runner.running:
            runner.stopped = True
            runner.exit(STOPPED_CODE, "terminated")

    def log_tail(self, store, activation_id, name):
        runner = self.engine.runners.get(name)
        return tail_lines("\n".join(runner.lines)) if runner is not None else ""

    def owns(self, name):
        return name.startswith(FAKE_PREFIX)

    def find(self, store, config, activation_id):
        runner = self.engine.runner(activation_id)
        return runner.name if runner is not None and runner.running else None

    def adopt(self, store, activation, name):
        runner = self.engine.runners.get(name)
        if runner is None:
            return Exit(error=f"Runner {name} not found")
        if runner.running:
            return None
        return Exit(runner.code, lambda: self.log_tail(store, activation["id"], name))

    def collect_garbage(self, store, config, runner_socket):
        """Forget the ended runners of this project's activations that no longer run."""
        removed = 0
        for runner in list(self.engine.runners.values()):
            ours = runner.project == store.project_id and not self.host.watched(runner.activation_id)
            if ours and not runner.running and store.activation(runner.activation_id)["status"] != ACT_RUNNING:
                del self.engine.runners[runner.name]
                removed += 1
        return removed
