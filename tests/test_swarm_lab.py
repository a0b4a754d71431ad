"""On a real multi-node Swarm lab (scripts/swarm-lab up; `make test-swarm` starts one): a task on a
worker node reaches the controller's TLS runner listener on the host side of the lab bridge, with the
CA and its agent's identity given as Swarm secrets, and the listener refuses plain HTTP and requests
without a token. SUZUMIO_SWARM_LAB names the lab's settings file; SUZUMIO_REQUIRE_SWARM=1 turns a
missing lab into a failure."""

import json
import os
import time
import uuid
from pathlib import Path

import pytest
from api_fixtures import init_project, project_yaml, running_activation, serving
from conftest import require, wait_until

import docker

pytestmark = pytest.mark.swarm

IMAGE = "suzumio-runner:dev"
LABEL = "suzumio.test"
JOB_TIMEOUT_S = 90

# Runs in the task: three requests to the runner listener, one JSON line of what each got.
PROBE = r"""
import http.client, json, socket, ssl
identity = json.load(open("/run/secrets/identity"))
host, port = identity.pop("host"), identity.pop("port")
context = ssl.create_default_context(cafile="/run/secrets/ca")
def post(body, tls=True):
    try:
        if tls:
            conn = http.client.HTTPSConnection(host, port, timeout=10, context=context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("POST", "/runner/signals", json.dumps(body), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return [answer.status, json.loads(answer.read() or b"null")]
    except (OSError, http.client.HTTPException) as error:
        return ["failed", type(error).__name__]
tokenless = {key: value for key, value in identity.items() if key != "token"}
print(json.dumps({"node": socket.gethostname(), "signed": post(identity), "tokenless": post(tokenless),
                  "plain": post(identity, tls=False)}), flush=True)
"""


def lab_settings():
    path = os.environ.get("SUZUMIO_SWARM_LAB")
    if not path or not Path(path).is_file():
        require("swarm")("no Swarm lab: run `make test-swarm` (or scripts/swarm-lab up and set SUZUMIO_SWARM_LAB)")
    settings = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


@pytest.fixture
def lab():
    settings = lab_settings()
    client = docker.DockerClient(base_url=settings["SUZUMIO_SWARM_ENGINE"])
    try:
        yield settings, client
    finally:
        for service in client.services.list(filters={"label": LABEL}):
            service.remove()
        for secret in client.secrets.list(filters={"label": LABEL}):
            secret.remove()
        client.close()


def job_outcome(client, service):
    """(state, node id) of the one task of a finished replicated-job, or None while it runs."""
    tasks = service.tasks()
    if not tasks:
        return None
    status = tasks[0]["Status"]
    if status["State"] in ("complete", "failed", "rejected"):
        return status["State"], tasks[0].get("NodeID")
    return None


def test_a_task_on_a_worker_reaches_the_tls_runner_listener_and_only_with_tls_and_a_token(tmp_path, lab):
    settings, client = lab
    host = settings["SUZUMIO_LAB_HOST_IP"]
    with serving(tmp_path / "root", runner_listen=(host, 0)) as service:
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.runner_url))
        demo.start()
        activation = running_activation(demo, "worker")
        identity = {"project": "demo", "agentId": "worker", "activationId": activation["id"],
                    "token": service.token("demo", "worker"), "kind": "lab.probe",
                    "host": host, "port": service.runner_server.port}
        run = uuid.uuid4().hex[:8]
        labels = {LABEL: run}
        ca = client.secrets.create(name=f"suzumio-test-ca-{run}", labels=labels,
                                   data=(Path(service.root.path) / "tls" / "ca.pem").read_bytes())
        who = client.secrets.create(name=f"suzumio-test-identity-{run}", labels=labels,
                                    data=json.dumps(identity).encode())
        job = client.services.create(
            IMAGE, ["python3", "-c", PROBE], name=f"suzumio-test-probe-{run}", labels=labels,
            mode=docker.types.ServiceMode("replicated-job"), networks=["host"],
            constraints=["node.role == worker"],
            restart_policy=docker.types.RestartPolicy(condition="none"),
            secrets=[docker.types.SecretReference(ca.id, ca.name, filename="ca"),
                     docker.types.SecretReference(who.id, who.name, filename="identity")],
        )
        started = time.monotonic()
        wait_until(lambda: job_outcome(client, job) is not None, JOB_TIMEOUT_S, message="the probe job to finish")
        state, node_id = job_outcome(client, job)
        logs = b"".join(job.logs(stdout=True, stderr=True)).decode("utf-8", "replace")
        assert state == "complete", logs
        report = json.loads(logs.strip().splitlines()[-1])
        workers = {settings[f"SUZUMIO_LAB_WORKER_{i}"] for i in range(1, int(settings["SUZUMIO_LAB_WORKERS"]) + 1)}
        assert client.nodes.get(node_id).attrs["Description"]["Hostname"] in workers
        assert report["signed"] == [200, {"status": "recorded"}]
        assert report["tokenless"] == [400, {"error": "token is required"}]
        assert report["plain"][0] == "failed", report  # no HTTP answer without TLS
        assert len(demo.list_signals(kind="lab.probe")) == 1
        assert time.monotonic() - started < JOB_TIMEOUT_S

