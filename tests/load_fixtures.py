"""A `suzumio serve` process under load: demo teams and idle projects initialized in a root, the
controller as a subprocess whose descriptors, threads and memory can be read from /proc, and clients
that browse the project list. Shared by tests/test_load.py and the load benches under bench/."""
import concurrent.futures
import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from conftest import free_port, wait_until

import suzumio_config
import suzumio_runtime
import suzumio_store

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
IDLE_YAML = """\
name: {name}
task: Stay idle.
agents:
  pm: {{tools: [messages.send]}}
  worker: {{tools: [messages.send]}}
backend:
  kind: local
  runner:
    model: main
    models:
      providers:
        replay: {{type: scripted, script: {{agents: {{}}}}}}
      presets:
        main: {{provider: replay, model: m}}
"""


def init_from_text(root, folder, text):
    """Initialize the project file `text` (written under `folder`) as `suzumio init` does."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "project.yaml"
    path.write_text(text, encoding="utf-8")
    loaded = suzumio_config.load_project(path, env={})
    root.init_project(name=loaded.data["name"], task=loaded.data["task"], config=loaded.data,
                      agents=loaded.agents, source_text=loaded.source_text, resolved_text=loaded.render(),
                      config_path=loaded.path)


def init_idle_projects(root_path, count, prefix="idle"):
    """`count` two-agent projects that are initialized and never started."""
    root = suzumio_store.Root(root_path)
    try:
        for index in range(count):
            name = f"{prefix}-{index:03d}"
            init_from_text(root, Path(root_path) / "_sources" / name, IDLE_YAML.format(name=name))
    finally:
        root.close()


def init_demo_teams(root_path, names, port=None):
    """The demo team of examples/demo.yaml (local backend, scripted provider) under each name; its
    runners reach serve over the root's runner socket (`port` is not needed any more)."""
    config = yaml.safe_load((EXAMPLES / "demo.yaml").read_text(encoding="utf-8"))
    root = suzumio_store.Root(root_path)
    try:
        for name in names:
            folder = Path(root_path) / "_sources" / name
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copy(EXAMPLES / "demo-script.yaml", folder / "demo-script.yaml")
            init_from_text(root, folder, yaml.safe_dump(dict(config, name=name), sort_keys=False))
    finally:
        root.close()


class ServeProcess:
    """`suzumio serve` on a free port as a subprocess, with readers of its /proc figures."""

    def __init__(self, root, log_path, *extra_args, port=None, python_code=None):
        self.root = Path(root)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.args = ["serve", "--root", str(self.root), "--port", str(self.port), *extra_args]
        self.python_code = python_code  # run instead of suzumio.py: a fault-injecting wrapper
        self.process = None

    def start(self, timeout=30.0, wait_healthy=True):
        if self.python_code is not None:
            command = [sys.executable, "-c", self.python_code, *self.args]
        else:
            command = [sys.executable, str(REPO / "suzumio.py"), *self.args]
        with open(self.log_path, "a", encoding="utf-8") as log_file:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                                            env=dict(os.environ, SUZUMIO_LOG_LEVEL="INFO"), cwd=str(REPO))
        if wait_healthy:
            wait_until(self.healthy, timeout, interval=0.05, message=f"suzumio serve on port {self.port}")
        return self

    def healthy(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"suzumio serve exited with {self.process.returncode}: {self.log()[-2000:]}")
        try:
            return self.request("GET", "/health", timeout=2)[0] == 200
        except OSError:
            return False

    def log(self):
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def auth_headers(self):
        """The API token serve keeps in <root>/api-token, once it has written it."""
        token = suzumio_runtime.read_api_token(self.root)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def request(self, method, path, body=None, timeout=30):
        """(status, body bytes) of one request on a new connection, with the API token."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            headers.update(self.auth_headers())
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def descriptors(self):
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def descriptor_targets(self):
        """What each open descriptor refers to (a path, or `socket:[inode]`, `pipe:[inode]`...)."""
        folder = f"/proc/{self.process.pid}/fd"
        targets = []
        for name in os.listdir(folder):
            try:
                targets.append(os.readlink(f"{folder}/{name}"))
            except FileNotFoundError:  # closed between the listing and the read
                pass
        return targets

    def status_field(self, name):
        with open(f"/proc/{self.process.pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
        raise KeyError(name)

    def threads(self):
        return self.status_field("Threads")

    def rss_kib(self):
        return self.status_field("VmRSS")

    def stop(self, timeout=20):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


class Sampler:
    """Peaks of a ServeProcess's descriptors and threads, sampled by the caller as work goes on."""

    def __init__(self, serve):
        self.serve = serve
        self.peak_descriptors = 0
        self.peak_threads = 0

    def sample(self):
        self.peak_descriptors = max(self.peak_descriptors, self.serve.descriptors())
        self.peak_threads = max(self.peak_threads, self.serve.threads())


def browse(serve, clients, requests_each, path="/api/projects", sampler=None):
    """`clients` concurrent keep-alive clients each GETting `path` `requests_each` times. Returns
    (statuses, latencies in seconds); the sampler, if given, is sampled after every request."""
    headers = serve.auth_headers()

    def client(_index):
        connection = http.client.HTTPConnection("127.0.0.1", serve.port, timeout=60)
        statuses, latencies = [], []
        try:
            for _ in range(requests_each):
                started = time.perf_counter()
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                response.read()
                latencies.append(time.perf_counter() - started)
                statuses.append(response.status)
                if sampler is not None:
                    sampler.sample()
        finally:
            connection.close()
        return statuses, latencies

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    return [s for r in results for s in r[0]], [t for r in results for t in r[1]]


def kick_off(serve, name):
    """Start the demo team `name` and send pm the kick-off message, as `make demo` does."""
    for path, body in ((f"/api/projects/{name}/start", b"{}"),
                       (f"/api/projects/{name}/messages",
                        b'{"recipient": "pm", "body": "Start. Make the greeting card with your team."}')):
        status, answer = serve.request("POST", path, body)
        if status != 200:
            raise AssertionError(f"POST {path}: {status} {answer[:300]!r}")


def project_status(serve, name):
    import json

    status, body = serve.request("GET", f"/api/projects/{name}")
    if status != 200:
        raise AssertionError(f"GET project {name}: {status}")
    return json.loads(body)
