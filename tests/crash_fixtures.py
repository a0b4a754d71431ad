"""Crash-safety harness: a busy scripted team on the `local` backend, a real `suzumio serve` subprocess
that is killed with SIGKILL at seeded random moments and restarted on the same root and port, and the
checks a settled project must pass afterwards (no acknowledged message lost, no signal delivered twice,
no activation left running without a runner, the project submitted). Imported by tests/test_crash.py
and bench/soak_crash.py; it imports conftest (wait_until), the store and the backend's liveness test."""
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
import yaml
from conftest import restart_port, wait_until

import suzumio
import suzumio_backend
import suzumio_backend_local
import suzumio_runtime
import suzumio_store

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
PROJECT = "crash"
KICKOFF = "Start the crash drill: split the card between the workers and submit it."
WORKER_SLEEP_S = 1.2
PM_SLEEP_S = 0.3
SCRIBE_SLEEP_S = 0.2
SCRIBE_ENTRIES = 40


# ---------------------------------------------------------------- the team

def crash_script(worker_sleep=WORKER_SLEEP_S, pm_sleep=PM_SLEEP_S, scribe_entries=SCRIBE_ENTRIES):
    """The scripted turns of the crash team. No entry has a `when`: a failed activation does not consume
    its entry (docs/configuration.md#the-scripted-provider), so the failed nudge replays the interrupted entry, and
    every completed activation plays the next one."""
    def shell(command):
        return {"name": "shell.exec", "input": {"command": command}}

    def wait(reason):
        return {"name": "coordination.wait_for_signal", "input": {"reason": reason, "notifyPm": False}}

    def send(recipient, body):
        return {"name": "messages.send", "input": {"recipient": recipient, "body": body}}

    pm = [
        {"steps": [
            {"say": "Splitting the card.", "tools": [
                send("worker-1", "Write part A of the card and tell pm."),
                send("worker-2", "Write part B of the card and tell pm.")]},
            {"tools": [shell(f"sleep {pm_sleep}")]},
            {"tools": [wait("Waiting for both parts.")]}]},
        {"steps": [{"tools": [shell(f"sleep {pm_sleep}")]}, {"tools": [wait("One part is in.")]}]},
        {"steps": [
            {"tools": [shell(f"sleep {pm_sleep}; cat {{artifacts:worker-1}}/part.md "
                             f"{{artifacts:worker-2}}/part.md || true")]},
            {"say": "Submitting.", "tools": [{"name": "completion.submit", "input": {
                "report": "# Crash drill card\n\nParts by worker-1 and worker-2.\n"}}]}]},
    ]
    worker = [{"steps": [
        {"tools": [shell(f"sleep {worker_sleep}; printf 'part by {{agent}}\\n' > {{artifacts}}/part.md")]},
        {"tools": [send("pm", "The part of {agent} is ready at {artifacts}/part.md.")]},
        {"tools": [wait("Reported to pm.")]}]}]
    scribe = [{"steps": [
        {"tools": [shell(f"sleep {scribe_sleep}; echo note-{index} >> {{artifacts}}/notes.txt")]},
        {"tools": [wait("Noted.")]}]}
        for index, scribe_sleep in enumerate([SCRIBE_SLEEP_S] * scribe_entries)]
    return {"agents": {"pm": pm, "worker-*": worker, "scribe": scribe}}


def crash_config(port, *, kind="local", image=None, failed_nudge=True, failed_nudge_delay_ms=200):
    """The crash team's project file as a mapping: pm, two workers and a scribe for user notes. Failed
    agents retry quickly (failedNudge) and a stalled team wakes pm (allQuietNudge)."""
    backend = {
        "kind": kind,
        "activationTimeoutMs": 300000,
        "runner": {"model": "offline", "models": {
            "providers": {"replay": {"type": "scripted", "script": "crash-script.yaml"}},
            "presets": {"offline": {"provider": "replay", "model": "crash-team"}}}},
    }
    if kind == suzumio_backend.KIND_DOCKER:
        # Scripted and reaching the controller over the mounted runner socket: no network at all.
        backend["image"] = image
        backend["docker"] = {"network": "none"}
    return {
        "name": PROJECT,
        "task": "Make a two-part card while the controller is being killed.",
        "scheduler": {
            "noEffectNudge": {"maxConsecutive": 1},
            "failedNudge": {"enabled": failed_nudge, "maxConsecutive": 0, "initialDelayMs": failed_nudge_delay_ms,
                            "backoffFactor": 1, "maxDelayMs": failed_nudge_delay_ms},
            "allQuietNudge": {"enabled": True, "targetAgent": "pm", "cooldownMs": 3000},
        },
        "backend": backend,
        "tools": {"toolpacks": ["core", "shell"]},
        "agents": {
            "pm": {"prompt": "Coordinate the card and submit it.",
                   "tools": ["messages.send", "coordination.wait_for_signal", "completion.submit", "shell.exec"]},
            "worker": {"count": 2, "prompt": "Write your part and tell pm.",
                       "tools": ["messages.send", "coordination.wait_for_signal", "shell.exec"]},
            "scribe": {"prompt": "Note every message you get.",
                       "tools": ["coordination.wait_for_signal", "shell.exec"]},
        },
    }


def write_project(folder, config, script):
    """Write the project file and its script into `folder`; returns the project file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "crash-script.yaml").write_text(yaml.safe_dump(script, sort_keys=False), encoding="utf-8")
    path = folder / "crash.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def init_root(root, project_file):
    """`suzumio init <file> --root <root>` through the CLI entry point."""
    out, err = _Sink(), _Sink()
    code = suzumio.main(["init", str(project_file), "--root", str(root)], out=out, err=err)
    if code != 0:
        raise RuntimeError(f"suzumio init failed: {err.text}")


class _Sink:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        return None


# ---------------------------------------------------------------- the controller process

class Controller:
    """`suzumio serve --root <root> --port <port>` as a subprocess that can be killed and restarted;
    its runners reach it over the root's runner socket, and `post` sends the API token that serve
    keeps in <root>/api-token (the same after every restart)."""

    def __init__(self, root, port, log_path):
        self.root = Path(root)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = Path(log_path)
        self.process = None
        self.starts = 0

    def start(self, timeout=30.0, launcher=None):
        """Start serve and wait until /health answers. `launcher`: a script run instead of suzumio.py
        with its arguments (a fault-injecting serve such as tests/serve_killed_after_start.py)."""
        env = dict(os.environ, SUZUMIO_LOG_LEVEL="INFO")
        with open(self.log_path, "a", encoding="utf-8") as log_file:
            log_file.write(f"---- serve start {self.starts + 1}\n")
            log_file.flush()
            self.process = subprocess.Popen(
                [sys.executable, str(launcher or REPO / "suzumio.py"), "serve", "--root", str(self.root),
                 "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env, cwd=str(REPO))
        self.starts += 1
        wait_until(self._healthy, timeout, interval=0.05, message=f"suzumio serve on port {self.port}")

    def _healthy(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"suzumio serve exited with {self.process.returncode}; see {self.log_path}")
        try:
            return requests.get(self.url + "/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def exited(self):
        """Whether the serve process has ended (and was reaped)."""
        return self.process is not None and self.process.poll() is not None

    def kill(self):
        """SIGKILL the controller (its runners live on in their own sessions) and reap it."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self):
        """Orderly shutdown (SIGTERM), killing it if it does not exit in time."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.kill()

    def post(self, path, body=None, timeout=10):
        token = suzumio_runtime.read_api_token(self.root)
        return requests.post(self.url + path, json=body or {}, timeout=timeout,
                             headers={"Authorization": f"Bearer {token}"})


# ---------------------------------------------------------------- reading the settled store

def all_history(store, agent_id):
    """Every history row of an agent, oldest first."""
    rows, before = [], None
    while True:
        page = store.history_page(agent_id, limit=500, before=before)
        rows += page["messages"]
        before = page.get("nextBefore")
        if before is None:
            return list(reversed(rows))


def all_signals(store):
    return store.list_signals(limit=1_000_000)


def runner_alive(activation):
    """The backend's own liveness test for a `local-<pid>` runner (docs/design/runner.md); for a
    docker-chat container, whether the engine reports it running."""
    name = activation.get("containerName")
    if not name:
        return False
    pid = suzumio_backend.local_pid(name)
    if pid is not None:
        return suzumio_backend_local.local_runner_alive(pid, activation["id"])
    state = suzumio_backend.DockerBackend().state(name)
    return state is not None and state[0] == "running"


def runner_log(store, activation):
    """What the activation's runner wrote to stderr so far: its runner.log (local), its container's log
    (docker-chat)."""
    name = activation.get("containerName") or ""
    if suzumio_backend.local_pid(name) is not None:
        path = store.activation_dir(activation["id"]) / "runner.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return suzumio_backend.DockerBackend().container_log(name)


def unsettled(store):
    """Running activations whose runner is gone (none must remain once the project settles)."""
    return [a for a in store.running_activations() if not runner_alive(a)]


def check_settled(store, acked):
    """Every invariant of a settled crash trial; returns a list of violations (empty when all hold).
    `acked` maps message ids the HTTP API answered 200 for to their bodies."""
    problems = []
    messages = {m["id"]: m for m in store.list_messages(limit=1_000_000, full_body=True)}
    for message_id, body in acked.items():
        if message_id not in messages:
            problems.append(f"acknowledged message {message_id} is missing")
        elif messages[message_id]["body"] != body:
            problems.append(f"acknowledged message {message_id} has another body")

    signals = {s["id"]: s for s in all_signals(store)}
    per_message = {}
    for sig in signals.values():
        if sig["kind"] == "message.created" and sig.get("targetAgent"):
            key = (sig["payload"].get("id"), sig["targetAgent"])
            per_message[key] = per_message.get(key, 0) + 1
    problems += [f"message {m} has {n} signals for {agent}" for (m, agent), n in per_message.items() if n > 1]

    activations = {a["id"]: store.activation(a["id"]) for a in store.list_activations(limit=1_000_000)}
    prompted = {}
    for agent in store.list_agents():
        for row in all_history(store, agent["id"]):
            if row["kind"] != "activation_prompt":
                continue
            ids = row["metadata"].get("signalIds") or []
            if len(set(ids)) != len(ids):
                problems.append(f"activation {row['activationId']} lists a signal twice: {ids}")
            for signal_id in ids:
                if signal_id in prompted:
                    problems.append(f"signal {signal_id} was delivered to {prompted[signal_id]} and again "
                                    f"to {row['activationId']}")
                prompted[signal_id] = row["activationId"]
    for sig in signals.values():
        delivered_to = sig.get("deliveredActivationId")
        if sig["status"] == "delivered" and delivered_to is None:
            problems.append(f"signal {sig['id']} is delivered without an activation")
        if delivered_to is None:
            continue
        if delivered_to not in activations:
            problems.append(f"signal {sig['id']} was delivered to unknown activation {delivered_to}")
        elif activations[delivered_to]["agentId"] != sig.get("targetAgent"):
            problems.append(f"signal {sig['id']} for {sig.get('targetAgent')} went to another agent")
        if prompted.get(sig["id"]) != delivered_to:
            problems.append(f"signal {sig['id']} is delivered to {delivered_to} but prompted to "
                            f"{prompted.get(sig['id'])}")
    for signal_id, activation_id in prompted.items():
        if signal_id not in signals:
            problems.append(f"activation {activation_id} was prompted with unknown signal {signal_id}")

    for activation in activations.values():
        if activation["status"] == "running" and not runner_alive(activation):
            problems.append(f"activation {activation['id']} is running without a runner")
    for agent in store.list_agents():
        active = agent.get("activeActivationId")
        if agent["status"] == "running" and (active is None or activations[active]["status"] != "running"):
            problems.append(f"agent {agent['id']} is running without a running activation")
    status = store.project()["status"]
    if status != "submitted":
        problems.append(f"project is {status}, not submitted")
    return problems


def stop_leftover_runners(store):
    """Kill the process group of every runner still alive (never the runners of other projects)."""
    for activation in store.list_activations(limit=1_000_000):
        pid = suzumio_backend.local_pid(activation.get("containerName"))
        if pid is not None and suzumio_backend_local.local_runner_alive(pid, activation["id"]):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


def remove_containers(store):
    """Remove the docker-chat containers of the project's activations (Suzumio never removes them)."""
    import docker

    client = docker.from_env()
    for activation in store.list_activations(limit=1_000_000):
        name = activation.get("containerName")
        if name and suzumio_backend.local_pid(name) is None:
            try:
                client.api.remove_container(name, force=True)
            except docker.errors.NotFound:
                continue


def failure_kinds(store):
    """Failed activations counted by the first line of their error."""
    counts = {}
    for activation in store.list_activations(limit=1_000_000):
        if activation["status"] == "failed":
            first = (activation.get("error") or "").splitlines()[0] if activation.get("error") else ""
            counts[first] = counts.get(first, 0) + 1
    return counts


def busy_runner(store, agent_id, tool="shell.exec"):
    """The agent's running activation while its runner is inside a running call of `tool`, else None."""
    for call in store.list_tool_calls(limit=50, tools=[tool]):
        if call["agent_id"] != agent_id or call["status"] != "running":
            continue
        activation = store.activation(call["activation_id"])
        if activation["status"] == "running" and activation.get("containerName"):
            return activation
    return None


# ---------------------------------------------------------------- the team under a killable serve

class CrashTeam:
    """The crash team in its own root, served by a `suzumio serve` subprocess on a fixed port."""

    def __init__(self, base_dir, *, worker_sleep=WORKER_SLEEP_S, failed_nudge_delay_ms=200, kind="local",
                 image=None):
        self.dir = Path(base_dir)
        self.root = self.dir / "root"
        self.port = restart_port()
        self.controller = Controller(self.root, self.port, self.dir / "serve.log")
        self.kind = kind
        config = crash_config(self.port, kind=kind, image=image, failed_nudge_delay_ms=failed_nudge_delay_ms)
        init_root(self.root, write_project(self.dir / "project", config, crash_script(worker_sleep=worker_sleep)))
        self.acked = {}
        self.refused = 0
        self._lock = threading.Lock()
        self._opened = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def kickoff(self, launcher=None):
        """Serve (`launcher`: as Controller.start), send the kick-off to pm while the project is not
        running yet, then start it (so the all-quiet nudge cannot beat the kick-off)."""
        self.controller.start(launcher=launcher)
        if self.post_message("pm", KICKOFF) is None:
            raise RuntimeError("the kick-off message was refused")
        self.controller.post(f"/api/projects/{PROJECT}/start").raise_for_status()

    @contextlib.contextmanager
    def store(self):
        """The project's store, opened once beside the serving controller (WAL: reads never block it)."""
        with self._lock:
            if self._opened is None:
                self._opened = suzumio_store.Root(self.root)
        yield self._opened.open_project(PROJECT)

    def read(self, function):
        with self.store() as store:
            return function(store)

    def post_message(self, recipient, body):
        """POST a user message; it counts as acknowledged only when the API answered 200."""
        try:
            response = self.controller.post(f"/api/projects/{PROJECT}/messages",
                                            {"recipient": recipient, "body": body})
        except requests.RequestException:
            response = None
        with self._lock:
            if response is None or response.status_code != 200:
                self.refused += 1
                return None
            message = response.json()
            self.acked[message["id"]] = body
            return message

    def submitted(self):
        return self.read(lambda store: store.project()["status"] == "submitted")

    def settled(self):
        return self.read(lambda store: not store.running_activations())

    def wait_done(self, timeout):
        """Wait for the submission, then for every activation to end."""
        wait_until(self.submitted, timeout, interval=0.1, message=f"submission (see {self.controller.log_path})")
        wait_until(self.settled, timeout, interval=0.1, message=f"settled activations ({self.controller.log_path})")

    def check(self):
        """check_settled on the current store with the messages acknowledged so far."""
        with self._lock:
            acked = dict(self.acked)
        return self.read(lambda store: check_settled(store, acked))

    def close(self):
        self.controller.stop()
        if (self.root / PROJECT).exists():
            self.read(stop_leftover_runners if self.kind == suzumio_backend.KIND_LOCAL else remove_containers)
        if self._opened is not None:
            self._opened.close()


# ---------------------------------------------------------------- one chaos trial

@dataclasses.dataclass
class TrialResult:
    seed: int
    kills: list
    acked: int
    refused: int
    activations: int
    failures: dict
    outlived: int
    problems: list
    seconds: float
    log_path: str

    @property
    def ok(self):
        return not self.problems

    def line(self):
        verdict = "ok" if self.ok else "FAILED"
        kills = ", ".join(f"{k:.2f}s" for k in self.kills)
        return (f"seed {self.seed}: {verdict} in {self.seconds:.1f}s, kills after [{kills}], "
                f"{self.acked} messages acked ({self.refused} refused), {self.activations} activations, "
                f"{self.outlived} runners alive right after a kill, "
                f"failed activations {json.dumps(self.failures)}"
                + "".join(f"\n  - {p}" for p in self.problems))


class ChaosTrial:
    """One trial: the crash team is kicked off, then serve is SIGKILLed 1..max_kills times after seeded
    random delays (and restarted after a seeded random pause) while a thread posts user notes to the
    scribe; afterwards the project must submit, every activation settle and check_settled pass.
    A report delivered to an activation whose runner then died stays delivered (docs/design/store.md) and
    reaches the retry only through history, which the scripted pm does not read; the all-quiet nudge
    then gives pm its next turn."""

    def __init__(self, base_dir, seed, *, max_kills=2, window_s=(0.2, 3.5), down_s=(0.0, 1.0),
                 settle_timeout=150.0, kind="local", image=None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.base_dir = Path(base_dir) / f"trial-{seed}"
        self.max_kills = max_kills
        self.window_s = window_s
        self.down_s = down_s
        self.settle_timeout = settle_timeout
        self.team_options = {"kind": kind, "image": image}
        self._done = threading.Event()

    def run(self):
        """Run the trial; returns its TrialResult (a trial that never settles fails via wait_until)."""
        started = time.monotonic()
        kills, outlived = [], 0
        with CrashTeam(self.base_dir, **self.team_options) as team:
            team.kickoff()
            sender = threading.Thread(target=self._send_notes, args=(team,), name=f"crash-notes-{self.seed}",
                                      daemon=True)
            sender.start()
            try:
                for _ in range(self.rng.randint(1, self.max_kills)):
                    delay = self.rng.uniform(*self.window_s)
                    self._done.wait(delay)
                    team.controller.kill()
                    kills.append(delay)
                    outlived += team.read(lambda store: sum(map(runner_alive, store.running_activations())))
                    if team.post_message("scribe", "Sent while the controller is down.") is not None:
                        raise AssertionError("a killed controller acknowledged a message")
                    self._done.wait(self.rng.uniform(*self.down_s))
                    team.controller.start()
            finally:
                # Notes stop with the chaos: a scribe kept busy forever would block the all-quiet nudge
                # that wakes pm when a report died with a killed runner.
                self._done.set()
                sender.join(timeout=15)
            wait_until(team.submitted, self.settle_timeout, interval=0.1,
                       message=f"trial {self.seed}: submission (see {team.controller.log_path})")
            wait_until(team.settled, self.settle_timeout, interval=0.1,
                       message=f"trial {self.seed}: every activation settled (see {team.controller.log_path})")
            problems = team.check()
            failures = team.read(failure_kinds)
            activations = team.read(lambda store: len(store.list_activations(limit=1_000_000)))
            return TrialResult(self.seed, kills, len(team.acked), team.refused, activations, failures, outlived,
                               problems, time.monotonic() - started, str(team.controller.log_path))

    def _send_notes(self, team):
        rng = random.Random(self.seed * 7919 + 1)
        index = 0
        while not self._done.wait(rng.uniform(0.1, 0.5)):
            index += 1
            team.post_message("scribe", f"Note {index} of trial {self.seed}.")


# ---------------------------------------------------------------- a local toolpack for Node host kills

TOOLPACK_MANIFEST = {
    "id": "crash-tools",
    "tools": [
        {"name": "crash.block", "description": "Never answers (until its host is killed).",
         "inputSchema": {"type": "object"}},
        {"name": "crash.ping", "description": "Answers with the host's pid.", "inputSchema": {"type": "object"}},
    ],
}

TOOLPACK_CONTROLLER = """\
import fs from "node:fs";

function hookMode(context) {
  try { return fs.readFileSync(context.store.paths.root + "/hook-mode.txt", "utf8").trim(); }
  catch { return "none"; }
}

// Writes the host's pid where the test looks for it, then never settles.
function blockUntilKilled(context, name) {
  fs.writeFileSync(context.store.paths.root + "/" + name, String(process.pid));
  return new Promise(() => {});
}

export function createControllerToolpack(context) {
  return {
    tools: {
      "crash.block": () => blockUntilKilled(context, "support-host.pid"),
      "crash.ping": () => ({ output: `pong from ${process.pid}` }),
    },
  };
}

export function schedulerTick(context) {
  const mode = hookMode(context);
  if (mode === "block") return blockUntilKilled(context, "hook-host.pid");
  if (mode === "ping") return [{ kind: "x.crash_ping", targetAgent: "pm", payload: { pid: process.pid } }];
  return null;
}
"""

TOOLPACK_RUNNER = """\
export function createRunnerToolpack(context) {
  return { tools: { "crash.ping": (input) => context.callSupport("crash.ping", input) } };
}
"""

TOOLPACK_PROJECT = """\
name: crash-tools
task: Call a controller tool whose host gets killed.
agents:
  pm:
    tools: [messages.send, crash.block, crash.ping]
tools:
  toolpacks: [core, {{path: ./toolpacks/crash, id: crash-tools}}]
backend:
  kind: local
  controllerUrl: "{url}"
  runner:
    model: offline
    models:
      providers:
        replay: {{type: scripted, script: {{agents: {{}}}}}}
      presets:
        offline: {{provider: replay, model: team}}
"""


def write_crash_toolpack(folder):
    """The crash-tools local toolpack (manifest, controller and runner modules) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suzumio.toolpack.json").write_text(json.dumps(TOOLPACK_MANIFEST), encoding="utf-8")
    (folder / "controller.mjs").write_text(TOOLPACK_CONTROLLER, encoding="utf-8")
    (folder / "runner.mjs").write_text(TOOLPACK_RUNNER, encoding="utf-8")


def child_pids(parent_pid, needle):
    """Live (non-zombie) children of `parent_pid` whose command line contains `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if int(fields[1]) == parent_pid and fields[0] != "Z" and needle in cmdline:
            found.append(int(entry.name))
    return found


def process_gone(pid):
    """True when the pid no longer exists or is a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"
