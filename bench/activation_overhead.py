"""Activation start overhead: the median time from a pending signal (one scheduler tick starts here) to
the real runner's first request reaching the controller (`POST /activation-context`, the runner's first
act once its interpreter, imports and input are ready) and to its first model request (`POST
/runner/model`), for the `local` and `docker-chat` backends, started cold and warm (a prepared runner
waiting on the warm socket; the pool is given time to prepare it between activations, as an
idle agent's runner is prepared before its next signal). The
bare cost, measured in the same run, is the same first request made by a minimal stdlib Python script
(`http.client` + `json`) spawned the same way: a subprocess of this interpreter with the local runner's
flags, or `docker run` of the runner image. Both go over the default transport, the runner socket (a
Unix socket; `docker run --network none` with its folder mounted at /run/suzumio, as activations get
it); `--tcp` measures `serve --runner-listen` instead (TCP to 127.0.0.1, containers on the host
network). Targets: cold first request <= 1.5x; warm first model request <= 0.5x of a bare `docker run`
and <= 1.0x of a bare spawn. The tick's own share is printed separately. `--tcp` has no warm runs
(prepared runners wait on the warm socket beside the runner socket).
Usage: .venv/bin/python bench/activation_overhead.py [--runs 9] [--skip-docker] [--tcp] [--json]"""
import argparse
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib
from store_fixtures import CONFIGS, config_of

import suzumio_backend
import suzumio_backend_local
import suzumio_coordination as coordination
import suzumio_scheduler
import suzumio_store
from suzumio_records import utc_now

IMAGE = "suzumio-runner:dev"
# The least a Python runner must do to reach the controller: import the HTTP client, post one JSON body.
BARE_POST = """import http.client, json, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sys.argv[1])
where = sys.argv[1]
connection = Unix("localhost") if where.startswith("/") else http.client.HTTPConnection("127.0.0.1", int(where))
connection.request("POST", "/activation-context", json.dumps({"activationId": sys.argv[2]}),
                   {"Content-Type": "application/json"})
connection.getresponse().read()
"""
SOCKET_NAME = "runner.sock"
MODEL_PATH = "/runner/model"
# The runner's model requests go to the controller
# (docs/spec-notes.md#model-requests-go-through-the-controller), so the stand-in sees the first one;
# it answers `{}`, the runner fails the activation, and the next run begins.
PROVIDER = 'replay: {type: openai-compatible, baseURL: "http://127.0.0.1:9/v1"}'


class Arrivals:
    """A stand-in controller: answers every POST with `{}` and records when each activation's first
    `/activation-context` arrived (time.time(), comparable across processes and containers)."""

    def __init__(self):
        self.first = {}
        self.changed = threading.Condition()

    def record(self, activation_id, moment, path="/activation-context"):
        with self.changed:
            self.first.setdefault((path, activation_id), moment)
            self.changed.notify_all()

    def wait_for(self, activation_id, timeout=60.0, path="/activation-context"):
        with self.changed:
            if not self.changed.wait_for(lambda: (path, activation_id) in self.first, timeout):
                raise TimeoutError(f"no {path} request from activation {activation_id}")
            return self.first[(path, activation_id)]


class TcpArrivals(Arrivals, http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        Arrivals.__init__(self)
        http.server.ThreadingHTTPServer.__init__(self, ("127.0.0.1", 0), ArrivalHandler)
        self.where = str(self.server_port)  # what the bare script connects to
        self.url = f"http://127.0.0.1:{self.server_port}"
        self.runner_socket = None


class SocketArrivals(Arrivals, socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, folder):
        Arrivals.__init__(self)
        self.folder = Path(folder)
        self.runner_socket = self.folder / SOCKET_NAME
        socketserver.ThreadingUnixStreamServer.__init__(self, str(self.runner_socket), ArrivalHandler)
        os.chmod(self.runner_socket, 0o666)
        self.where = str(self.runner_socket)
        self.url = "http://127.0.0.1:9"  # unused: runners take the socket


class ArrivalHandler(http.server.BaseHTTPRequestHandler):
    def address_string(self):
        return "runner"

    def do_POST(self):
        arrived = time.time()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path in ("/activation-context", MODEL_PATH):
            self.server.record(json.loads(body).get("activationId"), arrived, self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        return


def activation_latencies(kind, runs, controller, warm=False):
    """(start-to-first-request samples, start-to-first-model-request samples, tick-duration samples)
    over `runs` activations of one agent, cold or from prepared runners (`warm`)."""
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        root = suzumio_store.Root(scratch / "root")
        text = benchlib.project_text("bench", ["worker"], kind=kind, image=IMAGE, controller_url=controller.url)
        text = text.replace("replay: {type: scripted, script: {agents: {}}}", PROVIDER)
        store = benchlib.init_project(root, scratch / "src", text)
        backends = suzumio_backend.Backends(runner_socket=controller.runner_socket, warm_limit=4 if warm else 0)
        hooks = suzumio_scheduler.NoHooks()
        started, modelled, ticks = [], [], []
        try:
            for index in range(runs + 1):
                if warm:  # what Scheduler.tick asks after every tick; an idle agent's runner is ready
                    backends.prepare_next(store)
                    if not backends.warm.wait_ready("bench", "worker", 60):
                        raise SystemExit("no prepared runner became ready")
                coordination.send_message(store, config_of(store), "user", f"job {index}", recipient="worker")
                began = time.time()
                tick_began = time.perf_counter()
                suzumio_scheduler.tick(store, backends, hooks, utc_now(), CONFIGS)
                tick_took = time.perf_counter() - tick_began
                activation_id = store.agent("worker").get("activeActivationId")
                if activation_id is None:
                    raise SystemExit(f"no activation started: {store.list_activations(1)}")
                arrived = controller.wait_for(activation_id)
                asked = controller.wait_for(activation_id, path=MODEL_PATH)
                if index:  # the first run warms the page cache and the interpreter's bytecode cache
                    started.append(arrived - began)
                    modelled.append(asked - began)
                    ticks.append(tick_took)
                wait_until_ended(store, activation_id)
        finally:
            backends.close()
            if kind == "docker-chat":
                remove_containers(store)
            root.close()
        return started, modelled, ticks


def remove_containers(store):
    """The bench's own containers only (kept by the backend for inspection, docs/design/runner.md)."""
    import docker

    client = docker.from_env()
    for activation in store.list_activations(1000):
        if activation.get("containerName"):
            try:
                client.containers.get(activation["containerName"]).remove(force=True)
            except docker.errors.NotFound:
                pass


def wait_until_ended(store, activation_id, timeout=60.0):
    deadline = time.monotonic() + timeout
    while store.activation(activation_id)["status"] == "running":
        if time.monotonic() > deadline:
            raise TimeoutError(f"activation {activation_id} never ended")
        time.sleep(0.01)


def bare_local(runs, controller):
    samples = []
    env = {name: os.environ[name] for name in suzumio_backend_local.LOCAL_BASE_ENV if os.environ.get(name)}
    for index in range(runs):
        began = time.time()
        process = subprocess.Popen([sys.executable, *suzumio_backend_local.LOCAL_RUNNER_FLAGS, "-c", BARE_POST,
                                    controller.where, f"bare-{index}"],
                                   env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        samples.append(controller.wait_for(f"bare-{index}") - began)
        process.wait()
    return samples


def bare_docker(runs, controller):
    import docker
    client = docker.from_env()
    samples = []
    for index in range(runs + 1):
        began = time.time()
        if controller.runner_socket is None:
            where, options = controller.where, {"network_mode": "host"}
        else:  # as activations get it: no network, the socket's folder mounted read-only
            where = f"/run/suzumio/{SOCKET_NAME}"
            options = {"network_mode": "none", "user": "65532:65532",
                       "volumes": {str(controller.folder): {"bind": "/run/suzumio", "mode": "ro"}}}
        container = client.containers.run(IMAGE, ["python3", "-c", BARE_POST, where, f"docker-{index}"],
                                          detach=True, **options)
        arrived = controller.wait_for(f"docker-{index}")
        container.wait()
        container.remove()
        if index:
            samples.append(arrived - began)
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--skip-docker", action="store_true")
    parser.add_argument("--tcp", action="store_true", help="the runner routes over TCP (serve --runner-listen)")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("activation_overhead")
    folder = tempfile.mkdtemp(prefix="sz-bench-")  # AF_UNIX paths are short
    os.chmod(folder, 0o755)
    controller = TcpArrivals() if options.tcp else SocketArrivals(folder)
    threading.Thread(target=controller.serve_forever, name="bench-controller", daemon=True).start()
    results.note(f"transport: {'TCP (serve --runner-listen)' if options.tcp else 'the runner socket'}")
    try:
        kinds = [("local", bare_local, 1.0)] + ([] if options.skip_docker else [("docker-chat", bare_docker, 0.5)])
        for kind, bare, warm_target in kinds:
            activation, modelled, ticks = activation_latencies(kind, options.runs, controller)
            warm = None if options.tcp else activation_latencies(kind, options.runs, controller, warm=True)
            baseline = benchlib.median(bare(options.runs, controller))
            results.add(f"{kind}: signal -> runner's first request", benchlib.median(activation), "s", baseline,
                        target=1.5)
            results.add(f"{kind}: signal -> first model request (cold)", benchlib.median(modelled), "s", baseline)
            results.add(f"{kind}: of which the tick (start included)", benchlib.median(ticks), "s")
            if warm is not None:
                results.add(f"{kind}: signal -> first model request (warm)", benchlib.median(warm[1]), "s",
                            baseline, target=warm_target)
                results.add(f"{kind}: warm tick (claim included)", benchlib.median(warm[2]), "s")
    finally:
        controller.shutdown()
        controller.server_close()
        shutil.rmtree(folder, ignore_errors=True)
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
