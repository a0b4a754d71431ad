"""The `local` backend (suzumio_backend_contract's Backend): the runner as a host process in its own
process group (no isolation; `config render` says so), and how a local runner is found again: by its pid
and the command line that names its activation, or by the input file it was started with. Built by
suzumio_backend's BACKENDS table."""
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import suzumio_warm
from suzumio_backend_contract import KIND_LOCAL, Backend, Exit
from suzumio_records import ACT_RUNNING

log = logging.getLogger(__name__)

# The local runner's interpreter flags. -S (no `site`): the runner is standard library only and imports
# its own modules from beside the script, so site-packages (an installed or editable suzumio, .pth
# hooks) stay out of its sys.path, and their start-up cost out of every activation.
LOCAL_RUNNER_FLAGS = ("-S",)
LOCAL_BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")  # the controller's variables a local runner keeps
LOCAL_PREFIX = "local-"  # a local runner's recorded name: local-<pid>
STOP_GRACE_SECONDS = 2.0
# Local runners, and every tool they start, yield the CPU to the controller: on a host where many agents
# compute at once, the process that schedules them and answers the control room stays responsive.
RUNNER_NICE = 10
LOG_TAIL_LINES = 200
ADOPT_POLL_SECONDS = 2.0  # how often an adopted runner (not this process's child) is looked for


def digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:32]


def tail_lines(text, count=LOG_TAIL_LINES):
    return "\n".join(text.splitlines()[-count:])


def lower_priority(pid):
    """Give a just-started runner RUNNER_NICE more niceness than the controller. It is still starting its
    interpreter then, so the tools it runs later inherit the value. A process gone already is left alone."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + RUNNER_NICE))
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- the local backend

def read_cmdline(pid):
    """The command line of a process, or '' when it is gone or a zombie. A process caught in the middle
    of exec briefly shows an empty command line, so an empty read is retried for up to 0.5 s."""
    if not Path("/proc/self").exists():
        result = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, text=True,
                                check=False)
        return result.stdout.strip()
    deadline = time.monotonic() + 0.5
    while True:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[-1].split()[0]
            if state == b"Z":
                return ""
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                text = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return ""
        if text or time.monotonic() > deadline:
            return text
        time.sleep(0.01)


def runner_marker(store, activation_id):
    """What a local runner's command line holds for this activation: the activation id, or for a
    prepared runner (spawned before its activation existed) its `--warm-slot <slot>`, as
    recorded in activations/<id>/runner.slot when it was claimed."""
    try:
        slot = (store.activation_dir(activation_id) / "runner.slot").read_text(encoding="utf-8").strip()
    except OSError:
        return activation_id
    return f"{suzumio_warm.SLOT_FLAG} {slot}" if slot else activation_id


def local_runner_alive(pid, activation_id):
    """docs/design/runner.md: the pid exists and its command line names the activation (or the
    `runner_marker` of a prepared runner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    cmdline = read_cmdline(pid)
    if activation_id in cmdline:
        return True
    # A claimed prepared runner writes to its activation's runner.log from then on.
    return f" {suzumio_warm.SLOT_FLAG} " in cmdline and activation_id in runner_log_target(pid)


def runner_log_target(pid):
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return ""


def local_pid(container_name):
    if container_name and container_name.startswith(LOCAL_PREFIX):
        suffix = container_name[len(LOCAL_PREFIX):]
        if suffix.isdigit():
            return int(suffix)
    return None


def command_lines():
    """(pid, command line) of every process in sight: /proc on Linux, `ps` elsewhere."""
    if not Path("/proc/self").exists():
        result = subprocess.run(["ps", "-A", "-o", "pid=,args="], capture_output=True, text=True, check=False)
        for line in result.stdout.splitlines():
            pid, _, args = line.strip().partition(" ")
            if pid.isdigit():
                yield int(pid), args.strip()
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        yield int(entry), raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def find_local_runner(store, activation_id):
    """The pid of a live runner of this activation that leads its own session, or None: the runner of
    an activation whose pid was never recorded. A cold runner was launched with `--input
    <activation dir>/input.json` (its last arguments); a claimed prepared runner with the `--warm-slot`
    its activation's runner.slot records, written before it got its input."""
    marker = runner_marker(store, activation_id)
    if marker == activation_id:
        marker = f"--input {(store.activation_dir(activation_id) / 'input.json').resolve()}"
    for pid, text in command_lines():
        if not text.endswith(f" {marker}"):
            continue
        try:
            leads_session = os.getsid(pid) == pid
        except OSError:
            continue
        if leads_session and local_runner_alive(pid, marker):
            return pid
    return None


class LocalBackend(Backend):
    """Runs the runner as a host subprocess in its own session with a scrubbed environment."""

    kind = KIND_LOCAL
    container = False
    collects_garbage = False
    prepares = True

    def __init__(self, host):
        super().__init__(host)
        self._children = {}  # recorded name -> Popen of the runners this process started

    @property
    def environ(self):
        return self.host.environ

    # -- one activation

    def start(self, store, launch, slot=None):
        process = slot.process if slot is not None and self.claim(store, launch, slot) else None
        if process is None:
            process = self.spawn(launch)
        name = f"{LOCAL_PREFIX}{process.pid}"
        self._children[name] = process
        try:
            store.set_activation_container(launch.activation_id, name, node=socket.gethostname())
        finally:
            # Followed even when recording failed: the child is then reaped and its activation settled.
            self.host.follow(store, launch.activation_id, name, launch.secrets)
        if store.activation(launch.activation_id)["status"] != ACT_RUNNING:
            self.stop(store, launch.activation_id, name)

    def spawn(self, launch):
        """Spawn the runner process; returns the Popen."""
        runner_path = launch.runner_files()[0]
        env = self.base_env()
        env.update(launch.env)
        log_path = launch.activation_dir / "runner.log"
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = subprocess.Popen(
                [sys.executable, *LOCAL_RUNNER_FLAGS, str(runner_path), "--input",
                 str(launch.input_path.resolve())],
                cwd=os.path.realpath(launch.workspace), stdin=subprocess.DEVNULL, stdout=fd,
                stderr=subprocess.STDOUT, env=env, close_fds=True, start_new_session=True)
        finally:
            os.close(fd)
        lower_priority(process.pid)
        return process

    def wait(self, store, activation_id, name, secrets, closed):
        """This process's child: its exit status. An adopted runner: polled every ADOPT_POLL_SECONDS
        until it is gone (its exit status is its parent's, so unknown here)."""
        process = self._children.get(name)
        if process is None:
            pid, marker = local_pid(name), runner_marker(store, activation_id)
            while not closed.wait(ADOPT_POLL_SECONDS):
                if not local_runner_alive(pid, marker):
                    return Exit()
            return None
        while True:
            try:
                returncode = process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if closed.is_set():
                    return None
        self._children.pop(name, None)
        return Exit(exit_status(returncode), lambda: self.log_tail(store, activation_id, name))

    def log_tail(self, store, activation_id, name):
        try:
            text = (store.activation_dir(activation_id) / "runner.log").read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return tail_lines(text)

    def stop(self, store, activation_id, name):
        """SIGTERM to the runner's group, SIGKILL after STOP_GRACE_SECONDS; a vanished process counts as
        stopped. The pid is signalled only while its command line names the activation (runner_marker)."""
        pid, marker = local_pid(name), runner_marker(store, activation_id)
        if pid is None or not local_runner_alive(pid, marker):
            return
        try:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while time.monotonic() < deadline:
                if not local_runner_alive(pid, marker):
                    return
                time.sleep(0.05)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return

    # -- after a controller restart

    def owns(self, name):
        return local_pid(name) is not None

    def find(self, store, config, activation_id):
        pid = find_local_runner(store, activation_id)
        return None if pid is None else f"{LOCAL_PREFIX}{pid}"

    def may_start_later(self, store, activation_id):
        # A claimed prepared runner (runner.slot comes first) that is gone cannot start later.
        return runner_marker(store, activation_id) == activation_id

    def adopt(self, store, activation, name):
        return None if local_runner_alive(local_pid(name), runner_marker(store, activation["id"])) else Exit()

    # -- prepared runners

    def base_env(self):
        return {name: self.environ[name] for name in LOCAL_BASE_ENV if self.environ.get(name)}

    def fingerprint(self, launch, agent_ids):
        if not Path("/proc/self").exists():
            return None  # a claimed local runner is known by its log file in /proc (local_runner_alive)
        return digest([sys.executable, str(launch.runner_files()[0]), os.path.realpath(launch.workspace),
                       self.base_env(), launch.config_digest()])

    def prepare(self, store, launch, slot, warm_socket):
        """Spawn the runner of a future activation: the same interpreter, flags, workspace, session and
        base environment as `launch`, waiting on the warm socket. Its log and the rest of its
        environment come with the claim."""
        runner_path = launch.runner_files()[0]
        env = self.base_env()
        env.update({"PYTHONUNBUFFERED": "1", suzumio_warm.KEY_ENV: slot.key})
        slot.process = subprocess.Popen(
            [sys.executable, *LOCAL_RUNNER_FLAGS, str(runner_path), "--warm", str(warm_socket),
             suzumio_warm.SLOT_FLAG, slot.id],
            cwd=os.path.realpath(launch.workspace), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env, close_fds=True, start_new_session=True)
        lower_priority(slot.process.pid)

    def claim(self, store, launch, slot):
        """Its slot is recorded first (runner.slot, what its command line names), then it gets its log
        file, environment and input."""
        log_path = launch.activation_dir / "runner.log"
        os.close(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        (launch.activation_dir / "runner.slot").write_text(slot.id + "\n", encoding="utf-8")
        try:
            suzumio_warm.deliver(slot, {"input": launch.data, "env": launch.env, "log": str(log_path)})
        except OSError as error:
            log.info("prepared runner of %s was gone (%s); starting cold", launch.activation_id, error)
            (launch.activation_dir / "runner.slot").unlink()
            self.discard(slot)
            return False
        return True

    def discard(self, slot):
        if slot.process is None:
            return
        try:
            os.killpg(slot.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        slot.process.wait(timeout=10)

def exit_status(returncode):
    """A runner ended by signal N reports 128 + N, as Docker does."""
    return 128 - returncode if returncode < 0 else returncode
