"""The effect ledger under crashes (docs/operations.md#what-an-agent-can-do-to-the-outside-world): a runner
SIGKILLed inside an external shell.exec (a `local` process group, a `docker-chat` container; gated by an
approval or not) and a controller (`suzumio serve`) SIGKILLed while an MCP tool it runs is writing. Each
call ends in doubt, runs once, and the agent's next prompt names it; a resolved one is told once and not
reported again. Real serve, real runners with the scripted provider, a real Docker engine, a real MCP
server on the `mcp` SDK."""
import os
import signal
import sys

import pytest
import requests
import yaml
from api_fixtures import init_project, serving
from conftest import restart_port, wait_until
from crash_fixtures import Controller, busy_runner, remove_containers, stop_leftover_runners
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip
from store_fixtures import config_of

import suzumio_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_mcp
import suzumio_runtime
import suzumio_store

pytestmark = pytest.mark.timeout(300)

PROJECT = "effects"
CHARGE = "printf 'charged\\n' >> {artifacts}/charges.log; sleep 120"


def shell(command):
    return {"name": "shell.exec", "input": {"command": command}}


def wait(reason):
    return {"name": "coordination.wait_for_signal", "input": {"reason": reason, "notifyPm": False}}


def worker_script(first_call):
    """The worker's turns: the call that will be interrupted; after an in-doubt notice, a look at what
    happened (never the call again); after a person's resolution, a note that it was told."""
    return {"agents": {"worker": [
        {"when": "resolved by a person", "steps": [{"tools": [shell("printf 'told\\n' >> {artifacts}/told.log")]},
                                                   {"tools": [wait("Told.")]}]},
        {"when": "is in doubt", "steps": [{"tools": [shell("cat {artifacts}/charges.log")]},
                                          {"tools": [wait("Checked.")]}]},
        {"steps": [{"tools": [first_call]}, {"tools": [wait("Charged.")]}]},
    ]}}


def effects_config(kind, first_call, *, tools=("core", "shell"), worker_tools=(), approve=None, image=None):
    backend = {"kind": kind, "activationTimeoutMs": 300000, "runner": {"model": "offline", "models": {
        "providers": {"replay": {"type": "scripted", "script": worker_script(first_call)}},
        "presets": {"offline": {"provider": "replay", "model": "effects-team"}}}}}
    if kind == suzumio_backend.KIND_DOCKER:
        backend.update(image=image, docker={"network": "none"})
    worker = {"prompt": "Charge the card once.",
              "tools": ["messages.send", "coordination.wait_for_signal", "shell.exec", *worker_tools]}
    if approve:
        worker["approve"] = approve
    return {"name": PROJECT, "task": "Charge the card exactly once.", "backend": backend,
            "scheduler": {"noEffectNudge": {"enabled": False},
                          "failedNudge": {"enabled": True, "initialDelayMs": 200, "maxDelayMs": 200}},
            "tools": {"toolpacks": list(tools)},
            "agents": {"pm": {"prompt": "Coordinate.", "tools": ["messages.send", "coordination.wait_for_signal"]},
                       "worker": worker}}


def worker_activations(store):
    return [a for a in store.list_activations(100) if a["agentId"] == "worker"]


def prompt_of(store, activation_id):
    return store.activation(activation_id)["prompt"]


def lines(path):
    return path.read_text().splitlines() if path.exists() else []


def settled_after(store, count):
    """The worker's activations once there are `count` and none runs."""
    found = worker_activations(store)
    return found if len(found) >= count and all(a["status"] != "running" for a in found) else None


@pytest.mark.parametrize("kind, gated", [
    pytest.param("local", False, id="local"),
    pytest.param("local", True, id="local-approved"),
    pytest.param("docker-chat", False, id="docker-chat", marks=pytest.mark.docker),
    pytest.param("docker-chat", True, id="docker-chat-approved", marks=pytest.mark.docker)])
def test_a_runner_killed_inside_an_external_call_leaves_it_in_doubt_once_and_its_agent_is_told(
        tmp_path, kind, gated):
    client, image = None, None
    if kind == suzumio_backend.KIND_DOCKER:
        client = docker_client_or_skip()
        runner_image_or_skip(client)
        image = RUNNER_IMAGE
    approve = [{"tool": "shell.exec", "match": {"command": "charged"}, "timeoutMs": 60000}] if gated else None
    config = effects_config(kind, shell(CHARGE), approve=approve, image=image)
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = init_project(service.root, tmp_path / "project", yaml.safe_dump(config, sort_keys=False))
        charges = store.artifacts_dir("worker") / "charges.log"
        try:
            coordination.send_message(store, config_of(store), "user", "Charge the card.", recipient="worker")
            assert service.post(f"/api/projects/{PROJECT}/start").status_code == 200
            if gated:
                pending = wait_until(lambda: service.get(f"/api/projects/{PROJECT}/approvals?status=pending").json(),
                                     60, message="the approval request")
                decided = service.post(f"/api/projects/{PROJECT}/approvals/{pending[0]['id']}", {"decision": "allow"})
                assert decided.status_code == 200, decided.text
            victim = wait_until(lambda: lines(charges) and busy_runner(store, "worker"), 60,
                                message="the charge running")
            if kind == suzumio_backend.KIND_DOCKER:
                client.api.kill(victim["containerName"])
            else:
                os.killpg(suzumio_backend.local_pid(victim["containerName"]), signal.SIGKILL)
            [effect] = wait_until(lambda: service.get(f"/api/projects/{PROJECT}/effects?state=in_doubt").json(), 60,
                                  message="the call in doubt")
            assert (effect["tool"], effect["activation"]) == ("shell.exec", victim["id"])
            assert store.activation(victim["id"])["status"] == "failed"
            # The retry is the activation the in-doubt notice woke: it names the call and does not run it again.
            first, retry = wait_until(lambda: settled_after(store, 2), 90, message="the retry")
            assert first["id"] == victim["id"] and retry["status"] == "completed"
            told = prompt_of(store, retry["id"])
            assert "is in doubt" in told and effect["id"] in told and effect["callKey"] in told
            assert "charges.log" in told  # the call's input
            assert lines(charges) == ["charged"]
            if gated:  # the one request was used by the call that ran; nothing asked again
                assert len(service.get(f"/api/projects/{PROJECT}/approvals").json()) == 1
            resolved = service.post(f"/api/projects/{PROJECT}/effects/{effect['id']}/resolve",
                                    {"resolution": "done", "note": "the card was charged once"})
            assert resolved.status_code == 200, resolved.text
            *_, after = wait_until(lambda: settled_after(store, 3), 90, message="the activation the resolution woke")
            text = prompt_of(store, after["id"])
            assert "resolved by a person: it did happen" in text and "is in doubt" not in text
            assert lines(store.artifacts_dir("worker") / "told.log") == ["told"]
            assert lines(charges) == ["charged"]
            assert service.get(f"/api/projects/{PROJECT}/effects?state=in_doubt").json() == []
            charging = [c for c in store.list_tool_calls(50) if "charged" in c["input_json"]]
            assert len(charging) == 1
        finally:
            if client is not None:
                remove_containers(store)


BANK_SERVER = '''\
import sys, time
from mcp.server.mcpserver import MCPServer

server = MCPServer("bank")


@server.tool()
def pay(amount: int) -> str:
    """Pay an amount to the merchant."""
    with open(sys.argv[1], "a") as ledger:
        ledger.write(f"paid {amount}\\n")
    time.sleep(float(sys.argv[2]))
    return f"paid {amount}"


server.run()
'''


def test_a_controller_killed_while_its_mcp_tool_writes_leaves_the_call_in_doubt_and_never_runs_it_again(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "bank.py").write_text(BANK_SERVER, encoding="utf-8")
    paid = tmp_path / "paid.log"
    bank = {"id": "bank", "mcp": {"command": [sys.executable, str(folder / "bank.py"), str(paid), "60"]}}
    config = effects_config("local", {"name": "bank.pay", "input": {"amount": 5}},
                            tools=("core", "shell", bank), worker_tools=("bank.pay",))
    path = folder / "effects.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    root_path = tmp_path / "root"
    root = suzumio_store.Root(root_path)
    # As `init` would, with the server asked for its tools (the script names bank.pay).
    hub = suzumio_mcp.McpHub()
    try:
        loaded = suzumio_config.load_project(path, env={}, mcp_tools=lambda pack, mcp: suzumio_mcp.checking(
            pack, mcp, hub))
    finally:
        hub.close()
    store = root.init_project(name=PROJECT, task=loaded.data["task"], config=loaded.data, agents=loaded.agents,
                              source_text=loaded.source_text, resolved_text=loaded.render(), config_path=loaded.path)
    controller = Controller(root_path, restart_port(), tmp_path / "serve.log")
    token = {}

    def effects(state=""):
        answer = requests.get(f"{controller.url}/api/projects/{PROJECT}/effects{state}", headers=token, timeout=5)
        return answer.json() if answer.status_code == 200 else None

    try:
        controller.start()
        token["Authorization"] = f"Bearer {suzumio_runtime.read_api_token(root_path)}"
        assert controller.post(f"/api/projects/{PROJECT}/start").status_code == 200
        assert controller.post(f"/api/projects/{PROJECT}/messages",
                               {"recipient": "worker", "body": "Pay the merchant."}).status_code == 200
        wait_until(lambda: lines(paid), 90, message="the MCP tool writing")
        [intended] = effects()
        assert (intended["tool"], intended["state"], intended["executor"]) == ("bank.pay", "intended", "controller")
        controller.kill()
        controller.start()
        [effect] = wait_until(lambda: effects("?state=in_doubt"), 60, message="the call in doubt")
        assert effect["id"] == intended["id"] and "controller" in effect["why"]
        first, retry = wait_until(lambda: settled_after(store, 2), 120, message="the activation the notice woke")
        assert first["id"] == intended["activation"]
        told = prompt_of(store, retry["id"])
        assert "is in doubt" in told and effect["id"] in told and '"amount": 5' in told
        assert lines(paid) == ["paid 5"]
        calls = [c for c in store.list_tool_calls(50) if c["tool"] == "bank.pay"]
        assert len(calls) == 1
        resolved = controller.post(f"/api/projects/{PROJECT}/effects/{effect['id']}/resolve",
                                   {"resolution": "not_done"})
        assert resolved.status_code == 200, resolved.text
        *_, after = wait_until(lambda: settled_after(store, 3), 90, message="the activation the resolution woke")
        text = prompt_of(store, after["id"])
        assert "resolved by a person: it did not happen" in text and "is in doubt" not in text
        assert effects("?state=in_doubt") == [] and lines(paid) == ["paid 5"]
    finally:
        controller.stop()
        stop_leftover_runners(store)
        root.close()


