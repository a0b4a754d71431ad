"""backend.artifactQuota (docs/configuration.md): an agent that writes past its quota into its artifacts
folder has its activation stopped with `artifact quota exceeded (<used> of <quota>)` and an
`activation.artifact_quota_exceeded` event, on `local` and `docker-chat`; another agent's own quota
(agents.<id>.artifactQuota) lets the same write through. Real serve apps, real runners with the scripted
provider, a real Docker engine."""
import json
import re
import textwrap

import pytest
import yaml
from api_fixtures import init_project, serving
from conftest import wait_until
from crash_fixtures import remove_containers, stop_leftover_runners
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip
from store_fixtures import config_of

import suzumio_backend
import suzumio_backend_local
import suzumio_coordination as coordination

pytestmark = pytest.mark.timeout(240)

QUOTA_ERROR = re.compile(r"^artifact quota exceeded \((\d+\.\d [KMGT]iB) of 1\.0 MiB\)$")


def write_then_sleep():
    return {"steps": [{"tools": [{"name": "shell.exec", "input": {
        "command": "head -c 3000000 /dev/zero > {artifacts}/big.bin; sleep 60"}}]}]}


def project_text(kind):
    backend = {"kind": kind, "artifactQuota": "1MiB",
               "runner": {"model": "offline", "models": {
                   "providers": {"replay": {"type": "scripted", "script": "script.yaml"}},
                   "presets": {"offline": {"provider": "replay", "model": "quota"}}}}}
    if kind == suzumio_backend.KIND_DOCKER:
        backend.update(image=RUNNER_IMAGE, docker={"network": "none"})
    return yaml.safe_dump({
        "name": "quota", "task": "Fill the artifacts folder.", "backend": backend,
        "scheduler": {"failedNudge": {"enabled": False}},
        "tools": {"toolpacks": ["core", "shell"]},
        "agents": {"filler": {"tools": ["shell.exec"]},
                   "roomy": {"tools": ["shell.exec"], "artifactQuota": "10MiB"}}}, sort_keys=False)


def runner_alive(store, activation):
    name = activation["containerName"]
    pid = suzumio_backend.local_pid(name)
    if pid is not None:
        return suzumio_backend_local.local_runner_alive(pid, suzumio_backend.runner_marker(store, activation["id"]))
    state = suzumio_backend.DockerBackend().state(name)
    return state is not None and state[0] == "running"


def run_fillers(tmp_path, kind):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "script.yaml").write_text(yaml.safe_dump(
        {"agents": {"filler": [write_then_sleep()], "roomy": [write_then_sleep()]}}), encoding="utf-8")
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = init_project(service.root, folder, textwrap.dedent(project_text(kind)))
        try:
            for agent in ("filler", "roomy"):
                coordination.send_message(store, config_of(store), "user", "Fill it.", recipient=agent)
            assert service.post("/api/projects/quota/start").status_code == 200
            failed = wait_until(lambda: next((a for a in store.list_activations(limit=10)
                                              if a["agentId"] == "filler" and a["status"] == "failed"), None),
                                120, message="the filler's activation stopped")
            assert QUOTA_ERROR.match(failed["error"]), failed["error"]
            [event] = [json.loads(e["data_json"]) for e in store.list_events(limit=500)
                       if e["type"] == "activation.artifact_quota_exceeded"]
            assert (event["activationId"], event["agentId"], event["quotaBytes"]) == (failed["id"], "filler", 1 << 20)
            assert event["usedBytes"] > 1 << 20
            roomy = next(a for a in store.list_activations(limit=10) if a["agentId"] == "roomy")
            assert roomy["status"] == "running"  # its 3 MB are within its own 10 MiB
            wait_until(lambda: not runner_alive(store, failed), 30, message="the filler's runner stopped")
            assert service.post("/api/projects/quota/stop").status_code == 200
        finally:
            store_cleanup = stop_leftover_runners if kind == suzumio_backend.KIND_LOCAL else remove_containers
            store_cleanup(store)


def test_local_agent_past_its_artifact_quota_is_stopped_with_the_error_and_an_event(tmp_path):
    run_fillers(tmp_path, suzumio_backend.KIND_LOCAL)


def test_docker_agent_past_its_artifact_quota_is_stopped_with_the_error_and_an_event(tmp_path):
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    run_fillers(tmp_path, suzumio_backend.KIND_DOCKER)
