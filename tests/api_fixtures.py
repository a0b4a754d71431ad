"""HTTP test fixtures: a real runtime root with projects initialized through the real config pipeline,
and the real app served by Waitress on an ephemeral port (send_bytes=1, ≥ 16 threads), shut down with
server.close() + task_dispatcher.shutdown(). Imported by the test_api*, test_sse, test_runner_support
and test_toolpacks modules and by bench/api_throughput.py."""
import contextlib
import textwrap

import requests
from conftest import wait_until

import suzumio_api
import suzumio_backend
import suzumio_config
import suzumio_scheduler
import suzumio_store
import suzumio_toolpacks

DEMO_YAML = """\
name: {name}
task: {task}
channels: ["#project"]
agents:
  pm:
    tools: [messages.send, coordination.wait_for_signal, completion.submit, "file.*"]
  worker:
    tools: [messages.send, coordination.wait_for_signal, completion.submit, "file.*", "shell.*"]
tools:
  toolpacks: {toolpacks}
{extra}backend:
  kind: local
  controllerUrl: "{controller_url}"
  runner:
    model: offline
    models:
      providers:
        replay:
          type: scripted
          script: {script}
      presets:
        offline: {{provider: replay, model: team}}
"""


def project_yaml(name, controller_url, *, task="Prove the theorem.", toolpacks="[core, shell, web]", extra="",
                 script="{agents: {}}"):
    """A `demo`-shaped project file (http-api.md §11 setup): pm and worker, local backend, empty script."""
    return DEMO_YAML.format(name=name, task=task, toolpacks=toolpacks, extra=extra, script=script,
                            controller_url=controller_url)


def init_project(root, directory, text):
    """Write `text` as a project file under `directory` and initialize it like `suzumio init`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "project.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    config = suzumio_config.load_project(path, env={})
    return root.init_project(
        name=config.data["name"], task=config.data["task"], config=config.data, agents=config.agents,
        source_text=config.source_text, resolved_text=config.render(), config_path=config.path)


class Service:
    """The served app and its collaborators; `call` sends a request with a loopback Host header."""

    def __init__(self, root, scheduler, backend, toolpacks, server):
        self.root = root
        self.scheduler = scheduler
        self.backend = backend
        self.toolpacks = toolpacks
        self.server = server
        self.port = server.port
        self.base_url = f"http://127.0.0.1:{server.port}"
        self.http = requests.Session()

    def call(self, method, path, *, json=None, data=None, headers=None, timeout=10, **kwargs):
        merged = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        return self.http.request(method, self.base_url + path, json=json, data=data, headers=merged,
                                 timeout=timeout, **kwargs)

    def get(self, path, **kwargs):
        return self.call("GET", path, **kwargs)

    def post(self, path, body=None, **kwargs):
        return self.call("POST", path, json=body, **kwargs)

    def store(self, name):
        return self.root.open_project(name)

    def token(self, project, agent_id):
        return self.store(project).agent(agent_id, include_token=True)["token"]


@contextlib.contextmanager
def serving(root_path, *, threads=16, scheduler_interval=None, mcp=None, **app_options):
    """The real app on Waitress at 127.0.0.1:0 with a real root, local backend and scheduler. The
    scheduler thread runs only with `scheduler_interval`; otherwise ticks run synchronously from the
    routes that ask for them."""
    root = suzumio_store.Root(root_path)
    backend = suzumio_backend.Backends()
    # With an McpHub (test_mcp), scheduler and routes share one config cache that lists MCP tools.
    configs = suzumio_config.ConfigCache(mcp_tools=mcp.listing) if mcp is not None else None
    toolpacks = suzumio_toolpacks.ToolpackRuntime(configs=configs, mcp=mcp)
    scheduler = suzumio_scheduler.Scheduler(root, backend, hooks=toolpacks, configs=toolpacks.configs,
                                            interval=scheduler_interval or suzumio_scheduler.TICK_INTERVAL_SECONDS)
    if scheduler_interval is not None:
        scheduler.start()
    app = suzumio_api.make_app(root, scheduler, backend, toolpacks, **app_options)
    server = suzumio_api.Server(app, "127.0.0.1", 0, threads=threads).start()
    service = Service(root, scheduler, backend, toolpacks, server)
    try:
        yield service
    finally:
        scheduler.stop()
        wait_for_runners(service)
        service.http.close()
        server.close()
        backend.close()
        toolpacks.close()
        root.close()


def wait_for_runners(service, timeout=20.0):
    """Let real local runners that a tick started finish before the server goes away."""
    for name in service.root.list_projects():
        store = service.root.open_project(name)
        started = [a["id"] for a in store.running_activations() if a.get("containerName")]
        wait_until(all_ended(store, started), timeout, message=f"local runners of {name} to finish")


def all_ended(store, activation_ids):
    return lambda: all(store.activation(i)["status"] != "running" for i in activation_ids)


def running_activation(store, agent_id, prompt="Work."):
    """A running activation created through the store, with no process behind it."""
    return store.start_activation(agent_id, prompt, [])
