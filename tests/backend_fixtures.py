"""Fixtures for backend and scheduler tests: a real project store under tmp_path; for backend tests a
support directory holding the stand-in runner and a tiny real HTTP controller that accepts
/activation-output; for scheduler tests the real controller (runner routes, scheduler, toolpacks on
Waitress at port 0) with the real runner and the scripted provider (`served_project`), or the same
project on the in-memory FakeBackend (`fake_project`)."""
import contextlib
import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml
from fake_backend import FakeEngine
from store_fixtures import config_of

import suzumio_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_runtime
import suzumio_store

HERE = Path(__file__).resolve().parent
STAND_IN = HERE / "stand_in_runner.py"


def make_support_dir(path):
    """A support directory whose suzumio_runner.py is the stand-in runner."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(STAND_IN, path / suzumio_backend.RUNNER_FILE)
    (path / suzumio_backend.HOST_FILE).write_text("// stand-in Node host: never started by these tests\n")
    for name in suzumio_backend.RUNNER_FILES:
        if name.endswith(".py") and name != suzumio_backend.RUNNER_FILE:
            (path / name).write_text("# stand-in runner module: never imported by the stand-in runner\n")
    return path


class ControllerStub:
    """A real HTTP server on `host`:0 that completes activations posted to /activation-output; over TLS
    with `tls` (a suzumio_tls.RunnerTls), as a swarm project's runner listener."""

    def __init__(self, store, host="127.0.0.1", tls=None):
        self.store = store
        self.requests = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                stub.requests.append((self.path, body))
                status, answer = stub.handle(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                return None

        self.server = ThreadingHTTPServer((host, 0), Handler)
        if tls is not None:
            self.server.socket = tls.server_context().wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="controller-stub", daemon=True)
        self.thread.start()

    def handle(self, path, body):
        if path != "/activation-output":
            return 404, {"error": "not found"}
        agent = self.store.agent(body["agentId"], include_token=True)
        if agent["token"] != body["token"]:
            return 403, {"error": "Invalid agent token"}
        return 200, coordination.complete_activation(self.store, config_of(self.store), body["activationId"],
                                                     body["agentId"],
                                                     body["output"]["text"], body["output"].get("usage"))

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def project_config(name="demo", *, kind="local", controller_url="http://127.0.0.1:{port}", agents=None,
                   agent_env=None, timeout_ms=None, docker=None, scheduler=None, channels=("#project",),
                   image="suzumio-runner:dev", communication=None, toolpacks=None, providers=None,
                   task="Build the thing."):
    """A project configuration dict (the YAML a user would write)."""
    agents = agents or {"pm": {"tools": ["messages.send"]}, "worker": {"tools": ["messages.send"]}}
    if agent_env:
        for spec in agents.values():
            spec.setdefault("env", {}).update(agent_env)
    backend = {"kind": kind, "image": image, "controllerUrl": controller_url,
               "runner": {"mode": "ai", "model": "main", "models": {
                   "providers": {"replay": {"type": "scripted", "script": {"agents": {
                       next(iter(agents)): [{"steps": [{"say": "ok"}]}]}}}},
                   "presets": {"main": {"provider": "replay", "model": "team"}}}}}
    backend["runner"]["models"]["providers"].update(providers or {})
    if timeout_ms:
        backend["activationTimeoutMs"] = timeout_ms
    if docker:
        backend["docker"] = docker
    config = {"name": name, "task": task, "agents": agents, "channels": list(channels),
              "backend": backend}
    if scheduler:
        config["scheduler"] = scheduler
    if communication:
        config["communication"] = communication
    if toolpacks is not None:
        config["tools"] = {"toolpacks": toolpacks}
    return config


def init_project(root_path, config, config_dir, root=None):
    """Write the YAML, initialise the project under a real root (or `root`), set it running, return
    (root, store)."""
    config_dir.mkdir(parents=True, exist_ok=True)
    path = config_dir / "project.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    loaded = suzumio_config.load_project(path, env={})
    root = root or suzumio_store.Root(root_path)
    store = root.init_project(
        name=loaded.data["name"], task=loaded.data["task"], config=loaded.data, agents=loaded.agents,
        source_text=loaded.source_text, resolved_text=loaded.render(), config_path=loaded.path)
    store.start()
    return root, store


class Env:
    """One project, its backends and its stub controller. `implementations` and `controller_ca` go to
    every Backends it builds (a FakeBackend's table entry; a swarm project's runner listener CA); the stub
    listens on `controller_host`, over TLS with `controller_tls`."""

    def __init__(self, tmp_path, config, environ, support_dir, implementations=None, controller_ca=None,
                 controller_host="127.0.0.1", controller_tls=None):
        self.tmp_path = tmp_path
        self.support_dir = support_dir
        self.environ = environ
        self.implementations = implementations
        self.controller_ca = controller_ca
        self.controller = ControllerStub(store=None, host=controller_host, tls=controller_tls)
        url = config["backend"]["controllerUrl"].format(port=self.controller.port)
        config["backend"]["controllerUrl"] = url
        self.root, self.store = init_project(tmp_path / "root", config, tmp_path / "config")
        self.controller.store = self.store
        self.backends = self.new_backends()
        self._all_backends = [self.backends]

    def new_backends(self, docker_client=None):
        backends = suzumio_backend.Backends(support_dir=self.support_dir, docker_client=docker_client,
                                            environ=self.environ, implementations=self.implementations,
                                            controller_ca=self.controller_ca)
        if hasattr(self, "_all_backends"):
            self._all_backends.append(backends)
        return backends

    def close(self):
        for activation in self.store.running_activations():
            coordination.cancel_activation(self.store, activation["id"], "test over")
            self.backends.stop_runner(self.store, self.store.activation(activation["id"]))
        for backends in self._all_backends:
            backends.close()
        self.controller.close()
        self.root.close()


@contextlib.contextmanager
def local_project(tmp_path, *, environ=None, agent_env=None, kind="local", support_dir=None, implementations=None,
                  controller_ca=None, controller_host="127.0.0.1", controller_tls=None, edit=None, **options):
    """A running project on the given backend kind with the stand-in runner; `edit(config)` changes the
    configuration dict before the project is made."""
    environ = environ if environ is not None else {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    config = project_config(kind=kind, agent_env=agent_env, **options)
    if edit is not None:
        edit(config)
    env = Env(tmp_path, config, environ, support_dir or make_support_dir(tmp_path / "support"), implementations,
              controller_ca, controller_host, controller_tls)
    try:
        yield env
    finally:
        env.close()


def open_activation(env, agent_id, prompt="# New Signals\n\nDo it.", signals=()):
    """Create a running activation through the store, with no runner behind it."""
    return coordination.start_activation(env.store, agent_id, prompt, list(signals), None)


class ControllerDied(BaseException):
    """Raised where the controller is taken to die: no `except Exception` boundary catches it."""


@contextlib.contextmanager
def dies_before_recording(store, error=ControllerDied):
    """While active, recording a runner's name (`set_activation_container`) raises `error` instead:
    with ControllerDied, the controller dies between launching a runner and recording it."""
    def record(activation_id, name, now=None, node=None):
        raise error(f"recording {name} of {activation_id} failed")
    store.set_activation_container = record
    try:
        yield
    finally:
        del store.set_activation_container


def events_of(store, event_type):
    """Events of one type, oldest first, with `data` decoded."""
    return [dict(e, data=json.loads(e["data_json"])) for e in reversed(store.list_events(limit=10000))
            if e["type"] == event_type]


def agent_history_kinds(store, agent_id):
    return [h["kind"] for h in store.active_history(agent_id)]


def process_group_alive(pgid):
    """True while any process of the group exists (zombies of reaped children excluded)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


# ---------------------------------------------------------------- the real runner behind the real controller

SCRIPTS = {
    # one scripted turn that only answers: the activation completes with the text "done"
    "done": [{"steps": [{"say": "done"}]}],
    # a turn that reports to the user through a tool, then answers (test_warm)
    "report": [{"steps": [
        {"say": "Reporting.", "tools": [{"name": "messages.send",
                                         "input": {"recipient": "user", "body": "Part A is done."}}]},
        {"say": "done"}]}],
    # a turn that runs a five-minute shell command: the activation stays running until it is stopped
    "sleep": [{"steps": [{"tools": [{"name": "shell.exec",
                                     "input": {"command": "sleep 300", "timeoutMs": 300000}}]}]}],
}


class ServedEnv:
    """One running project on the real controller: the user app on Waitress at port 0 and the runner
    app on the root's runner socket, a Scheduler and ToolpackRuntime, and Backends that start the real
    suzumio_runner.py, which reaches the controller over that socket."""

    def __init__(self, tmp_path, config, warm_limit=0):
        self.tmp_path = tmp_path
        # serve's runtime without the scheduler thread and the reconciler: ticks run when a test asks.
        self.runtime = suzumio_runtime.build_runtime(suzumio_runtime.RuntimeOptions(
            root=tmp_path / "root", warm=warm_limit,
            listeners=suzumio_runtime.Listeners(threads=16, api_token=None, reconcile=False))).start()
        self.root = self.runtime.root
        self.backends = self.runtime.backends
        self.toolpacks = self.runtime.toolpacks
        self.scheduler = self.runtime.scheduler
        self.server = self.runtime.server
        self.runner_server = self.runtime.runner_server
        config["backend"].pop("controllerUrl", None)
        _, self.store = init_project(None, config, tmp_path / "config", root=self.root)

    def close(self):
        """Cancel what still runs and stop its runner first, so no runner outlives the test."""
        for activation in self.store.running_activations():
            coordination.cancel_activation(self.store, activation["id"], "test over")
            self.backends.stop_runner(self.store, self.store.activation(activation["id"]))
        self.runtime.close()


def served_config(agents, script, scheduler, options):
    """The configuration of served_project: every agent plays SCRIPTS[script] (a `sleep` agent gets
    shell.exec), the no-effect nudge off unless `scheduler` turns it on."""
    agents = json.loads(json.dumps(agents))
    if script == "sleep":
        for spec in agents.values():
            spec["tools"] = [*spec.get("tools", []), "shell.exec"]
    config = project_config(agents=agents, toolpacks=["core", "shell"],
                            scheduler={"noEffectNudge": {"enabled": False}, **(scheduler or {})}, **options)
    keys = [f"{agent_id}-*" if spec.get("count") else agent_id for agent_id, spec in agents.items()]
    config["backend"]["runner"]["models"]["providers"]["replay"]["script"] = {
        "agents": {key: SCRIPTS[script] for key in keys}}
    return config


@contextlib.contextmanager
def served_project(tmp_path, *, agents, script="done", scheduler=None, warm_limit=0, **options):
    """A running project whose activations run the real runner against the real controller; every
    agent plays SCRIPTS[script] through the scripted provider. The no-effect nudge is off unless
    `scheduler` turns it on, so completions start nothing a test did not ask for."""
    env = ServedEnv(tmp_path, served_config(agents, script, scheduler, options), warm_limit=warm_limit)
    try:
        yield env
    finally:
        env.close()


# ---------------------------------------------------------------- the FakeBackend behind a real store

class FakeEnv:
    """One running project whose `local` activations run on a FakeBackend (tests/fake_backend.py): a
    real root and store, Backends whose table puts the fake in place of `local`, and no process. The
    runners play `script` ("done" completes each activation with "done", "sleep" keeps it running until
    it is stopped); `engine.runner(activation_id)` is the runner a test drives by hand."""

    def __init__(self, tmp_path, config, script):
        self.tmp_path = tmp_path
        self.root = suzumio_store.Root(tmp_path / "root")
        self.engine = FakeEngine(FAKE_SCRIPTS[script])
        self.backends = suzumio_backend.Backends(implementations={suzumio_backend.KIND_LOCAL: self.engine.backend})
        _, self.store = init_project(None, config, tmp_path / "config", root=self.root)

    def close(self):
        for activation in self.store.running_activations():
            coordination.cancel_activation(self.store, activation["id"], "test over")
            self.backends.stop_runner(self.store, self.store.activation(activation["id"]))
        self.backends.close()
        self.root.close()


FAKE_SCRIPTS = {"done": "output", "sleep": "sleep"}  # SCRIPTS' names -> what a fake runner plays


@contextlib.contextmanager
def fake_project(tmp_path, *, agents, script="done", scheduler=None, **options):
    """served_project's project and configuration, with its runners on the FakeBackend."""
    env = FakeEnv(tmp_path, served_config(agents, script, scheduler, options), script)
    try:
        yield env
    finally:
        env.close()
