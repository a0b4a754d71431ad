"""End-to-end fixtures: the real controller (api_fixtures.serving: both listeners on Waitress, the
runner one on the root's Unix socket, Backends, Scheduler, ToolpackRuntime) with one project whose
agents run the real runner on the `local` or `docker-chat` backend, reach the controller over that
socket, and talk to the FakeModel, an openai-compatible Chat Completions server; every agent names
its own preset, so replies queued per model reach the intended agent.
Imported by test_e2e and test_e2e_toolpacks only."""
import contextlib
import json
import logging

import pytest
import yaml
from api_fixtures import init_project, serving
from conftest import wait_until
from fake_model import FakeModel
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip

import suzumio_backend
import suzumio_coordination as coordination

log = logging.getLogger(__name__)

PROJECT = "e2e"
API_KEY = "sk-e2e-key-5150"
# A real runner in a fresh container needs a few seconds; on the local backend far less.
RUN_TIMEOUT = 90.0

PM_TOOLS = ["messages.send", "coordination.wait_for_signal", "completion.submit", "file.*"]
WORKER_TOOLS = ["messages.send", "coordination.wait_for_signal", "file.*", "shell.*"]


def kind_params():
    """pytest params for both backends; docker-chat carries the docker marker."""
    return [pytest.param("local", id="local"),
            pytest.param("docker-chat", id="docker-chat", marks=pytest.mark.docker)]


def call(tool, **arguments):
    """A model tool call for the FakeModel: the provider-facing name (`file.read` -> `file_read`)."""
    return {"name": tool.replace(".", "_"), "arguments": arguments}


def project_config(kind, controller_url, model_url, *, agents=None, presets=None, model="pm",
                   toolpacks=("core", "shell", "web"), scheduler=None, providers=None, extra=None,
                   fake_provider=None, docker=None, runner=None):
    """A project file as a user would write it; every agent names its own preset, so the FakeModel's
    per-model queues route replies to agents. `fake_provider` updates the FakeModel's provider entry
    (a None value removes the field, e.g. the inline `apiKey`)."""
    agents = agents or {"pm": {"model": "pm", "tools": PM_TOOLS},
                        "worker-1": {"model": "worker", "tools": WORKER_TOOLS}}
    presets = presets or {"pm": {"provider": "fake", "model": "pm"},
                          "worker": {"provider": "fake", "model": "worker-1"}}
    fake = {"type": "openai-compatible", "baseURL": model_url, "apiKey": API_KEY, **(fake_provider or {})}
    fake = {key: value for key, value in fake.items() if value is not None}
    backend = {"kind": kind, "runner": {
        "model": model,
        "models": {"providers": {"fake": fake, **(providers or {})},
                   "presets": presets}, **(runner or {})}}
    if controller_url:
        backend["controllerUrl"] = controller_url
    if kind == "docker-chat":
        backend["image"] = RUNNER_IMAGE
        # Agents allowed web.fetch get the host network (to reach test servers on its loopback); the
        # others get none: the runner socket is mounted and the controller makes the model calls.
        backend["docker"] = {"network": "host", **(docker or {})}
    config = {"name": PROJECT, "task": "Compute the answer and report it.", "channels": ["#project"],
              "agents": agents, "tools": {"toolpacks": list(toolpacks)}, "backend": backend,
              "scheduler": scheduler or {"noEffectNudge": {"enabled": False}}}
    config.update(extra or {})
    return config


class Team:
    """One running project on the served controller, with its FakeModel."""

    def __init__(self, service, store, model, kind, docker_client=None):
        self.docker = docker_client
        self.service = service
        self.store = store
        self.model = model
        self.kind = kind
        self.name = store.project_id

    def artifacts(self, agent_id=None):
        """The artifact root (or an agent's folder) as the runner sees it on this backend."""
        _, root = suzumio_backend.activation_paths(self.kind, self.store.dir, self.store.workspace("pm"))
        return f"{root}/{agent_id}" if agent_id else root

    def workspace_path(self, agent_id):
        """An agent's workspace as the runner sees it on this backend."""
        workspace, _ = suzumio_backend.activation_paths(self.kind, self.store.dir, self.store.workspace(agent_id))
        return workspace

    def send(self, recipient, body, priority=None):
        """POST /api/projects/<p>/messages as the user; the route runs a tick."""
        payload = {"recipient": recipient, "body": body}
        if priority:
            payload["priority"] = priority
        response = self.service.post(f"/api/projects/{self.name}/messages", payload)
        assert response.status_code == 200, response.text
        return response.json()

    def activations(self, agent_id=None):
        rows = [self.store.activation(a["id"]) for a in self.store.list_activations(1000)]
        return [a for a in rows if agent_id is None or a["agentId"] == agent_id]

    def wait_for(self, predicate, timeout=RUN_TIMEOUT, message="condition"):
        """wait_until, failing with a description of the project's activations and runner logs."""
        try:
            return wait_until(predicate, timeout, message=message)
        except pytest.fail.Exception:
            pytest.fail(f"timed out after {timeout}s waiting for {message}\n{self.describe()}")

    def wait_activations(self, agent_id, count, timeout=RUN_TIMEOUT):
        """Wait until `agent_id` has `count` activations that all ended; returns them oldest first."""
        def ended():
            rows = self.activations(agent_id)
            return rows if len(rows) >= count and all(a["status"] != "running" for a in rows) else None
        return self.wait_for(ended, timeout, f"{count} ended activations of {agent_id}")

    def wait_quiet(self, timeout=RUN_TIMEOUT):
        self.wait_for(lambda: not self.store.running_activations(), timeout, "no running activations")

    def describe(self):
        """Project status, each activation with its error and runner log tail, and the model queue."""
        status = self.store.project()["status"]
        lines = [f"project {status}; {self.model.pending()} replies queued; {len(self.model.requests)} requests"]
        for activation in self.activations():
            lines.append(f"- {activation['id']} {activation['agentId']} {activation['status']} "
                         f"{activation.get('error') or ''}")
            lines += ["    " + line for line in self.runner_log(activation["id"]).splitlines()[-15:]]
        return "\n".join(lines)

    def model_requests(self, model):
        return [r for r in self.model.requests if isinstance(r.body, dict) and r.body.get("model") == model]

    def tool_messages(self, model):
        """The tool-result texts the runner sent to the model `model`, once each, in order (a request
        repeats the results of the same activation that came before)."""
        seen = {}
        for request in self.model_requests(model):
            for message in request.body["messages"]:
                if message.get("role") == "tool":
                    seen.setdefault(message["tool_call_id"], message["content"])
        return list(seen.values())

    def events(self, event_type):
        return [dict(e, data=json.loads(e["data_json"])) for e in reversed(self.store.list_events(limit=100000))
                if e["type"] == event_type]

    def runner_log(self, activation_id):
        """What the runner wrote to stderr/stdout: runner.log (local) or the container log."""
        path = self.store.activation_dir(activation_id) / "runner.log"
        if self.docker is not None and not path.exists():  # saved there once the container has exited
            name = self.store.activation(activation_id).get("containerName")
            return self.docker.containers.get(name).logs().decode("utf-8", "replace") if name else ""
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def stop_running(self):
        """Cancel what still runs (a failed test) and stop its runner, so teardown never waits."""
        for activation in self.store.running_activations():
            coordination.cancel_activation(self.store, activation["id"], "test over")
            self.service.backends.stop_runner(self.store, self.store.activation(activation["id"]))


def require_engine(kind):
    """The Docker SDK client for docker-chat (skips or fails like provisioning_fixtures), else None."""
    if kind != "docker-chat":
        return None
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    return client


def remove_containers(client, store):
    """Remove the containers this project's activations ran in (never another test's)."""
    import docker.errors
    for activation in store.list_activations(1000):
        name = store.activation(activation["id"]).get("containerName")
        if not name or name.startswith(suzumio_backend.LOCAL_PREFIX):
            continue
        try:
            client.containers.get(name).remove(force=True)
        except docker.errors.NotFound:
            continue


@contextlib.contextmanager
def served_team(tmp_path, kind, make_config, *, flavor="openai", **serving_options):
    """Serve the controller with `serving_options` (api_fixtures.serving), initialize project `e2e`
    from `make_config(service, model)` and start it; yields a Team whose containers are removed after.
    `flavor`: the FakeModel's server flavor (fake_model.FLAVORS)."""
    client = require_engine(kind)
    model = FakeModel(flavor)
    try:
        with serving(tmp_path / "root", **serving_options) as service:
            config = make_config(service, model)
            store = init_project(service.root, tmp_path / "config", yaml.safe_dump(config, sort_keys=False))
            store.start()
            team = Team(service, store, model, kind, client)
            try:
                yield team
            finally:
                team.stop_running()
                if client is not None:
                    remove_containers(client, store)
    finally:
        model.close()


@contextlib.contextmanager
def running_team(tmp_path, kind, *, runner_listen=None, mcp=None, warm_limit=0, flavor="openai", max_activations=None,
                 scheduler_interval=None, **options):
    """Serve the controller, initialize project `e2e` for `kind` (project_config with `options`), start
    it, and yield a Team. The runners reach the controller over its runner socket, or, with
    `runner_listen` (host, port), over TCP at the URL written as backend.controllerUrl. `mcp`: an McpHub
    for MCP toolpacks (test_mcp); `scheduler_interval`: run the scheduler thread as serve does (needed by
    delayed signals such as nudges), else ticks come only from routes."""

    def make_config(service, model):
        controller_url = service.runner_url if runner_listen else None
        return project_config(kind, controller_url, model.base_url, **options)

    with served_team(tmp_path, kind, make_config, flavor=flavor, runner_listen=runner_listen, mcp=mcp,
                     warm_limit=warm_limit, max_activations=max_activations,
                     scheduler_interval=scheduler_interval) as team:
        yield team


def process_alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False
