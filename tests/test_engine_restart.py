"""The Docker engine restarted under a running docker-chat team: a private `dockerd` of the test's own
(its own socket, data, exec root and containerd), never the machine's shared engine, is stopped with
SIGTERM while the workers are inside a long shell.exec and started again with the same arguments;
`suzumio serve` stays up, and the team still submits."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests
from conftest import require, wait_until
from crash_fixtures import CrashTeam, busy_runner, child_pids
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip

import suzumio_backend

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]

WORKERS = ("worker-1", "worker-2")
FAILED_NUDGE = "scheduler.failed_nudge"
ENGINE_START_TIMEOUT = 60.0
# dockerd stops each running container with its 10 s grace before it exits.
ENGINE_STOP_TIMEOUT = 60.0


class PrivateEngine:
    """A `dockerd` that only this test uses: everything it keeps lives under `folder` (short, for the
    socket paths), and it starts a containerd of its own under its exec root, since it looks for a
    shared one only at the system path (where none listens: the shared engine's is under its own exec
    root too)."""

    def __init__(self, folder, log_path):
        self.folder = Path(folder)
        self.socket = self.folder / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.exec_root = self.folder / "exec"
        self.log_path = Path(log_path)  # outside `folder`, which goes with the engine
        self.args = ["dockerd", "-H", self.host, "--data-root", str(self.folder / "data"),
                     "--exec-root", str(self.exec_root), "--pidfile", str(self.folder / "docker.pid"),
                     "--bridge=none", "--iptables=false"]
        self.process = None

    def start(self):
        """Start dockerd and wait until it answers ping."""
        with open(self.log_path, "a", encoding="utf-8") as log_file:
            self.process = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                            start_new_session=True)
        wait_until(self._answers, ENGINE_START_TIMEOUT, interval=0.1, message=f"private dockerd ({self.log_path})")

    def _answers(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"private dockerd exited with {self.process.returncode}; see {self.log_path}")
        return subprocess.run(["docker", "-H", self.host, "version"], capture_output=True, timeout=30).returncode == 0

    def stop(self):
        """SIGTERM dockerd (it stops its containers and its containerd on its way down) and reap it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=ENGINE_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def load(self, tag):
        """Copy image `tag` from the shared engine into this one."""
        save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
        try:
            subprocess.run(["docker", "-H", self.host, "load", "-q"], stdin=save.stdout, check=True,
                           capture_output=True, timeout=300)
        finally:
            save.stdout.close()
            save.wait(timeout=60)
        if save.returncode != 0:
            raise RuntimeError(f"docker save {tag} failed with {save.returncode}")

    def remove(self):
        """Stop the engine; end what a dockerd that had to be killed left (its containerd, the shims of
        its containers and their processes: all name this engine's exec root); unmount and delete its
        folder."""
        self.stop()
        left = [pid for pid, command in command_lines() if str(self.exec_root) in command]
        for pid in [child for parent in left for child in descendants(parent)] + left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        prefix = str(self.folder) + "/"
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def command_lines():
    """(pid, command line) of every process."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except OSError:
                continue
    return found


def descendants(pid):
    """Every live process below `pid`, children first."""
    below = []
    for child in child_pids(pid, ""):
        below += [child, *descendants(child)]
    return below


@pytest.fixture
def private_engine(tmp_path, monkeypatch):
    """A private Docker engine holding the runner image; DOCKER_HOST names it to this process and to
    every `suzumio serve` it starts (CrashTeam's serve inherits the environment)."""
    runner_image_or_skip(docker_client_or_skip())
    if shutil.which("dockerd") is None:
        require("docker")("dockerd is not installed: the test starts an engine of its own")
    if os.geteuid() != 0:
        require("root")("starting a private dockerd needs root")
    engine = PrivateEngine(tempfile.mkdtemp(prefix="sz-engine-", dir="/tmp"), tmp_path / "dockerd.log")
    try:
        engine.start()
        engine.load(RUNNER_IMAGE)
        monkeypatch.setenv("DOCKER_HOST", engine.host)
        yield engine
    finally:
        engine.remove()


def healthy(team):
    return requests.get(team.controller.url + "/health", timeout=5).status_code == 200


def retry_of(store, failed):
    """The activation that the failed nudge for `failed` woke."""
    for sig in store.list_signals(target_agent=failed["agentId"], kind=FAILED_NUDGE, limit=1000):
        if sig["payload"]["previousActivationId"] == failed["id"] and sig.get("deliveredActivationId"):
            return store.activation(sig["deliveredActivationId"])
    raise AssertionError(f"no failed nudge woke {failed['agentId']} after {failed['id']}")


def last_retry(store, failed):
    """The end of the failed nudges' chain from `failed`: a retry started while the engine was down
    failed too, and its own failed nudge retried it."""
    retry = retry_of(store, failed)
    while retry["status"] == "failed":
        retry = retry_of(store, retry)
    return retry


def first_line(activation):
    return (activation.get("error") or "").splitlines()[0]


def both_workers_busy(store):
    """The workers' running activations while both are inside their shell.exec, else None."""
    busy = [busy_runner(store, worker) for worker in WORKERS]
    return busy if all(busy) else None


def test_engine_restarted_mid_run_fails_the_running_activations_clearly_and_the_team_still_submits(
        tmp_path, private_engine):
    with CrashTeam(tmp_path, kind=suzumio_backend.KIND_DOCKER, image=RUNNER_IMAGE, worker_sleep=6.0) as team:
        team.kickoff()
        busy = wait_until(lambda: team.read(both_workers_busy), 120, message="both workers inside shell.exec")
        private_engine.stop()  # SIGTERM: dockerd stops the workers' containers on its way down
        assert not team.controller.exited()
        assert healthy(team)
        private_engine.start()
        team.wait_done(240)
        assert not team.controller.exited() and team.controller.starts == 1
        assert healthy(team)
        with team.store() as store:
            for victim in busy:
                ended = store.activation(victim["id"])
                assert ended["status"] == "failed", ended
                assert re.fullmatch(r"Runner exited with \d+", first_line(ended)), ended["error"]
                assert last_retry(store, ended)["status"] == "completed"
            # Every failure says what happened: the exit of a container the engine stopped, or (a start
            # while it was down) that the engine could not be reached, never a bare connection error.
            for activation in store.list_activations(limit=1_000_000):
                if activation["status"] == "failed":
                    assert (re.fullmatch(r"Runner exited with \d+", first_line(activation))
                            or first_line(activation).startswith(suzumio_backend.ENGINE_UNREACHABLE_ERROR + ": ")
                            ), activation["error"]
        assert team.check() == []
