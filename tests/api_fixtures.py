"""HTTP test fixtures: a real runtime root with projects initialized through the real config pipeline,
and the controller's two real listeners built as `serve` builds them (suzumio_runtime.build_runtime): the
user app on Waitress at an ephemeral port (send_bytes=1, ≥ 16 threads) with an API token, and the runner
app on the root's runner socket (or TCP at port 0), shut down with server.close() +
task_dispatcher.shutdown(). Imported by the test_api*, test_sse, test_runner_support and test_toolpacks
modules and by bench/api_throughput.py."""
import contextlib
import json as jsonlib
import textwrap
from pathlib import Path

import requests
from conftest import wait_until

import suzumio_config
import suzumio_coordination as coordination
import suzumio_egress
import suzumio_runtime
import suzumio_scheduler
import suzumio_tls
from suzumio_runner_models import UnixHTTPConnection

RUNNER_PREFIXES = ("/runner/", "/toolpacks/", "/activation-")
GENERATED = suzumio_runtime.GENERATED

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
    """A `demo`-shaped project file (docs/http-api.md setup): pm and worker, local backend, empty script."""
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


class UnixResponse:
    """The parts of a requests.Response the tests read, for an answer that came over a Unix socket."""

    def __init__(self, status, headers, content):
        self.status_code = status
        self.headers = requests.structures.CaseInsensitiveDict(headers)
        self.content = content

    @property
    def text(self):
        return self.content.decode("utf-8", "replace")

    def json(self):
        return jsonlib.loads(self.content)


def unix_call(socket_path, method, path, *, json=None, data=None, headers=None, timeout=10):
    """One HTTP request over a Unix socket, the way the runner sends it (suzumio_runner_loop)."""
    body = jsonlib.dumps(json).encode() if json is not None else data
    if isinstance(body, str):
        body = body.encode()
    sent = {"Host": "localhost", **({"Content-Type": "application/json"} if json is not None else {}),
            **(headers or {})}
    connection = UnixHTTPConnection(str(socket_path), timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return UnixResponse(response.status, response.getheaders(), response.read())
    finally:
        connection.close()


class Service:
    """The served apps and their collaborators. `call` sends a request as its caller would: a runner
    path (/runner/…, /toolpacks/…, /activation-…) to the runner listener, anything else to the user
    listener with a loopback Host header and the API token; `listener=` picks one explicitly and
    `auth=False` leaves the token out."""

    def __init__(self, root, scheduler, backends, toolpacks, server, runner_server, api_token):
        self.root = root
        self.scheduler = scheduler
        self.backends = backends
        self.toolpacks = toolpacks
        self.server = server
        self.runner_server = runner_server
        self.api_token = api_token
        self.port = server.port
        self.base_url = f"http://127.0.0.1:{server.port}"
        self.runner_socket = runner_server.unix_socket
        self.runner_url = (f"unix://{runner_server.unix_socket}" if runner_server.unix_socket
                           else f"https://127.0.0.1:{runner_server.port}")
        self.http = requests.Session()

    @property
    def auth_headers(self):
        return {"Authorization": f"Bearer {self.api_token}"} if self.api_token else {}

    def call(self, method, path, *, json=None, data=None, headers=None, timeout=10, listener=None, auth=True,
             **kwargs):
        listener = listener or ("runner" if path.startswith(RUNNER_PREFIXES) else "user")
        if listener == "runner":
            if self.runner_socket:
                return unix_call(self.runner_socket, method, path, json=json, data=data, headers=headers,
                                 timeout=timeout)
            # The TLS runner listener is verified against the CA the root made for it.
            kwargs.setdefault("verify", str(Path(self.root.path) / suzumio_tls.TLS_DIR / suzumio_tls.CA_FILE))
            return self.http.request(method, self.runner_url + path, json=json, data=data, headers=headers,
                                     timeout=timeout, **kwargs)
        merged = {"Host": f"127.0.0.1:{self.port}", **(self.auth_headers if auth else {}), **(headers or {})}
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

    def control_room(self, hash_=""):
        """The WebUI address `serve` prints: the token in the query, once."""
        query = f"?token={self.api_token}" if self.api_token else ""
        return f"{self.base_url}/{query}{hash_}"


@contextlib.contextmanager
def serving(root_path, *, threads=16, scheduler_interval=None, api_token=GENERATED, runner_listen=None,
            mcp=None, warm_limit=0, resolver=None, max_activations=None, model_proxy=None, tracer=None,
            egress_environ=None, egress_cafile=None,
            **app_options):
    """The runtime `serve` runs (suzumio_runtime.build_runtime), with a real root, local backend and
    scheduler: the user app at 127.0.0.1:0 guarded by `api_token` (unless given, the root's token file
    as serve makes it; None: no token), the runner app on the root's runner socket (and, with
    runner_listen=("127.0.0.1", 0), over TLS on TCP with the root's generated certificate, reached through
    backend.controllerUrl by local runners and swarm tasks: service.runner_server is then that listener).
    The scheduler thread runs only with `scheduler_interval`; otherwise ticks run synchronously from the
    routes that ask for them; the reconciler does not run. `mcp`: an McpHub for MCP toolpacks (test_mcp);
    `app_options` go to suzumio_api.make_app."""
    listeners = suzumio_runtime.Listeners(
        host="127.0.0.1", port=0, threads=threads, api_token=api_token, runner_listen=runner_listen,
        reconcile=False, resolver=resolver or suzumio_egress.resolve, app_options=app_options,
        egress_environ=egress_environ, egress_cafile=egress_cafile)
    runtime = suzumio_runtime.build_runtime(suzumio_runtime.RuntimeOptions(
        root=root_path, listeners=listeners, scheduler=scheduler_interval is not None,
        scheduler_interval=scheduler_interval or suzumio_scheduler.TICK_INTERVAL_SECONDS, warm=warm_limit,
        max_activations=max_activations, tracer=tracer, model_proxy=model_proxy, mcp=mcp))
    try:
        runtime.start()
        service = Service(runtime.root, runtime.scheduler, runtime.backends, runtime.toolpacks, runtime.server,
                          runtime.tls_server or runtime.runner_server, runtime.api_token)
        service.runtime = runtime
        service.egress = runtime.egress
        service.socket_path = runtime.runner_socket
        try:
            yield service
        finally:
            runtime.scheduler.stop()
            wait_for_runners(service)
            service.http.close()
    finally:
        runtime.close()


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
    return coordination.start_activation(store, agent_id, prompt, [])


def identity(service, store, agent_id, activation_id):
    """The identity fields a runner sends with every runner route, with the agent's real token."""
    return {"project": store.project_id, "agentId": agent_id, "activationId": activation_id,
            "token": service.token(store.project_id, agent_id)}
