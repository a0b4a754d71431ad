"""Activation start on backend.kind swarm against a bare `docker service create` of the same job, on the
same Swarm lab (scripts/swarm-lab up; SUZUMIO_SWARM_LAB names its settings file): the time from the
start to the first request the task makes to the controller's TLS runner listener. Suzumio's start
writes input.json, creates its secret and the service (the runner's configs exist after the first run)
and the runner fetches its files first (`POST /runner/files/list`); the baseline creates two secrets (the
CA and an identity) and a replicated-job service of the same image whose `python3 -c` script posts one
signal. Runs alternate. Target: <= 1.5x. Usage:
SUZUMIO_SWARM_LAB=/run/suzumio-lab/<name>/settings.env .venv/bin/python bench/swarm_start.py [--runs 5] [--json]"""
import argparse
import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

import benchlib
from conftest import wait_until

import docker
import suzumio_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_runner_support
import suzumio_scheduler
import suzumio_store
import suzumio_tls
import suzumio_toolpacks

IMAGE = "suzumio-runner:dev"
LABEL = "suzumio.bench"
PROBE = r"""
import http.client, json, ssl
identity = json.load(open("/run/secrets/identity"))
host, port = identity.pop("host"), identity.pop("port")
conn = http.client.HTTPSConnection(host, port, timeout=30,
                                   context=ssl.create_default_context(cafile="/run/secrets/ca"))
conn.request("POST", "/runner/signals", json.dumps(identity), {"Content-Type": "application/json"})
print(conn.getresponse().status)
"""


class Arrivals:
    """WSGI middleware: when the first request for one of the watched paths came."""

    def __init__(self, app):
        self.app = app
        self.path = None
        self.arrived = threading.Event()
        self.at = None

    def expect(self, path):
        self.path, self.at = path, None
        self.arrived.clear()

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == self.path and not self.arrived.is_set():
            self.at = time.perf_counter()
            self.arrived.set()
        return self.app(environ, start_response)


def lab_settings():
    path = os.environ.get("SUZUMIO_SWARM_LAB")
    if not path or not Path(path).is_file():
        raise SystemExit("swarm_start needs a lab: scripts/swarm-lab up, then SUZUMIO_SWARM_LAB=<its settings.env>")
    return dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if line and line[0] != "#")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    settings = lab_settings()
    host, engine = settings["SUZUMIO_LAB_HOST_IP"], settings["SUZUMIO_SWARM_ENGINE"]
    client = docker.DockerClient(base_url=engine)
    results = benchlib.Results("swarm_start")
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "root").mkdir()
        root = suzumio_store.Root(Path(tmp) / "root")
        tls = suzumio_tls.generated_tls(root.path, host)
        backends = suzumio_backend.Backends(controller_ca=tls.ca_pem)
        configs = suzumio_config.ConfigCache()
        toolpacks = suzumio_toolpacks.ToolpackRuntime(configs)
        scheduler = suzumio_scheduler.Scheduler(root, backends, configs, hooks=toolpacks)
        arrivals = Arrivals(suzumio_runner_support.make_runner_app(root, toolpacks, scheduler))
        listener = suzumio_tls.TlsRunnerListener(arrivals, host, 0, tls).start()
        url = f"https://{host}:{listener.port}"
        text = benchlib.project_text("bench", ["worker"], kind="swarm", image=IMAGE, controller_url=url).replace(
            "  docker: {network: host}\n",
            f"  docker: {{network: host}}\n  swarm: {{engine: \"{engine}\", constraints: [node.role == worker]}}\n")
        store = benchlib.init_project(root, Path(tmp) / "config", text)
        token = store.agent("worker", include_token=True)["token"]
        ours, bare = [], []
        try:
            for _ in range(options.runs + 1):  # the first of each warms the nodes and creates the configs
                activation = coordination.start_activation(store, "worker", "Measure.", [])
                arrivals.expect("/runner/files/list")
                started = time.perf_counter()
                backends.start(store, activation["id"], configs.get(store))
                if not arrivals.arrived.wait(120):
                    raise SystemExit(f"no request from the swarm activation: {store.activation(activation['id'])}")
                ours.append(arrivals.at - started)
                coordination.cancel_activation(store, activation["id"], "measured")
                backends.stop_runner(store, store.activation(activation["id"]))

                run = uuid.uuid4().hex[:8]
                labels = {LABEL: run}
                identity = {"project": "bench", "agentId": "worker", "activationId": activation["id"],
                            "token": token, "kind": "bench.start", "host": host, "port": listener.port}
                arrivals.expect("/runner/signals")
                started = time.perf_counter()
                ca = client.secrets.create(name=f"bench-ca-{run}", labels=labels, data=tls.ca_pem.encode())
                who = client.secrets.create(name=f"bench-id-{run}", labels=labels, data=json.dumps(identity).encode())
                job = client.services.create(
                    IMAGE, ["python3", "-c", PROBE], name=f"bench-probe-{run}", labels=labels,
                    mode=docker.types.ServiceMode("replicated-job"), networks=["host"],
                    constraints=["node.role == worker"], restart_policy=docker.types.RestartPolicy(condition="none"),
                    secrets=[docker.types.SecretReference(ca.id, ca.name, filename="ca"),
                             docker.types.SecretReference(who.id, who.name, filename="identity")])
                if not arrivals.arrived.wait(120):
                    raise SystemExit("no request from the bare service")
                bare.append(arrivals.at - started)
                job.remove()
                wait_until(lambda: not client.services.list(filters={"label": LABEL}), 60, message="bare job gone")
                for secret in (ca, who):
                    wait_until(lambda secret=secret: _removed(secret), 30, message="its secret removed")
            ours, bare = ours[1:], bare[1:]
            results.add("start → first request, backend.kind swarm vs bare docker service create",
                        benchlib.median(ours), "s", benchlib.median(bare), target=1.5)
        finally:
            for service in client.services.list(filters={"label": LABEL}):
                service.remove()
            listener.close()
            backends.close()
            toolpacks.close()
            root.close()
            client.close()
    return results.emit(options.json)


def _removed(secret):
    try:
        secret.remove()
    except docker.errors.NotFound:
        return True
    except docker.errors.APIError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
