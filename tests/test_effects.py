"""suzumio_effects through its real surfaces: the runner routes on the runner socket posted by hand (as a
runner would, or as one killed halfway leaves them), the user routes on Waitress, the CLI, and the rules
that end activations and restart controllers (a real root and SQLite file; no runner process)."""
import dataclasses
import io
import json

import pytest
from api_fixtures import identity, init_project, running_activation, serving
from store_fixtures import config_of

import suzumio
import suzumio_approvals
import suzumio_coordination as coordination
import suzumio_effects
import suzumio_registry
from suzumio_errors import ConfigError
from suzumio_records import KIND_EFFECT_IN_DOUBT, KIND_EFFECT_RESOLVED, is_news, render_signal, utc_now

pytestmark = pytest.mark.timeout(120)

PROJECT_YAML = """\
name: demo
task: Ship it.
agents:
  pm:
    tools: [messages.send]
  worker:
    tools: [messages.send, "file.*", "shell.*", web.fetch]
    approve:
      - {tool: shell.exec, match: {command: "deploy"}, timeoutMs: 60000}
tools:
  toolpacks: [core, shell, web]
backend:
  kind: local
  runner:
    model: offline
    models:
      providers:
        replay: {type: scripted, script: {agents: {}}}
      presets:
        offline: {provider: replay, model: team}
"""
DEPLOY = {"command": "curl -X POST https://pay.example/charge -d amount=5"}


@pytest.fixture
def served(tmp_path):
    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config", PROJECT_YAML)
        store.start()
        yield service, store


def start_call(service, who, tool, tool_input, key):
    reply = service.post("/runner/tool-calls/start", {**who, "tool": tool, "input": tool_input, "callKey": key})
    assert reply.status_code == 200, reply.text
    return reply.json()


def effects(service, state=None):
    reply = service.get("/api/projects/demo/effects" + (f"?state={state}" if state else ""))
    assert reply.status_code == 200, reply.text
    return reply.json()


def worker_signals(store, kind):
    return [s for s in store.list_signals(target_agent="worker", limit=100) if s["kind"] == kind]


# ---------------------------------------------------------------- what a call may do outside

def test_built_in_tools_are_classified_by_their_nature():
    assert suzumio_effects.effect_of(None, "file.read", {"path": "a"}) == "none"
    assert suzumio_effects.effect_of(None, "file.write", {"path": "a"}) == "local"
    assert suzumio_effects.effect_of(None, "file.patch", {"path": "a"}) == "local"
    assert suzumio_effects.effect_of(None, "shell.exec", {"command": "ls"}) == "external"
    assert suzumio_effects.effect_of(None, "web.fetch", {"url": "https://a.example"}) == "none"
    assert suzumio_effects.effect_of(None, "web.fetch", {"url": "https://a.example", "body": "x"}) == "external"
    assert suzumio_effects.effect_of(None, "messages.send", {"body": "x"}) == "none"
    assert suzumio_effects.effect_of(None, "notes.add", {}) == "external"  # unknown: the careful answer


def test_mcp_hints_and_a_manifest_field_declare_what_a_tool_does(tmp_path):
    import suzumio_mcp

    listed = [suzumio_mcp.tool_definition({"name": n, "annotations": a}) for n, a in (
        ("read", {"readOnlyHint": True}), ("put", {"idempotentHint": True}), ("pay", {}))]
    assert [d.get("effect") for d in listed] == ["none", "idempotent", None]
    pack = suzumio_registry.mcp_toolpack({"id": "bank", "mcp": {"command": ["x"]}}, lambda *_: (listed, None))
    assert [(t.name, t.effect) for t in pack.tools] == [("bank.read", "none"), ("bank.put", "idempotent"),
                                                       ("bank.pay", None)]
    root = tmp_path / "notes"
    root.mkdir()
    (root / "runner.mjs").write_text("export default {}\n", encoding="utf-8")
    (root / "controller.mjs").write_text("export default {}\n", encoding="utf-8")
    manifest = {"id": "notes", "tools": [{"name": "notes.add", "description": "Add", "effect": "local",
                                          "inputSchema": {"type": "object"}}]}
    (root / suzumio_registry.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    assert suzumio_registry.load_local_toolpack(str(root)).tools[0].effect == "local"
    manifest["tools"][0]["effect"] = "sometimes"
    (root / suzumio_registry.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ConfigError, match="effect must be one of none, local, idempotent, external"):
        suzumio_registry.load_local_toolpack(str(root))


# ---------------------------------------------------------------- the ledger

def test_an_external_call_is_intended_before_it_runs_and_done_after_and_reads_are_not_recorded(served):
    service, store = served
    who = identity(service, store, "worker", running_activation(store, "worker")["id"])
    read = start_call(service, who, "file.read", {"path": "notes.md"}, "k-read")
    shell = start_call(service, who, "shell.exec", {"command": "git push"}, "k-push")
    [effect] = effects(service)
    assert (effect["tool"], effect["state"], effect["callKey"], effect["input"], effect["agent"]) == (
        "shell.exec", "intended", "k-push", {"command": "git push"}, "worker")
    assert effect["toolCallId"] == shell["toolCallId"] and effect["activation"] == who["activationId"]
    # The runner asks its start again (a lost answer): the same call, nothing new in the ledger.
    assert start_call(service, who, "shell.exec", {"command": "git push"}, "k-push")["toolCallId"] == \
        shell["toolCallId"]
    assert len(effects(service)) == 1
    for call, status in ((read, "completed"), (shell, "completed")):
        service.post("/runner/tool-calls/finish", {**who, "toolCallId": call["toolCallId"], "status": status,
                                                   "output": "ok"})
    [done] = effects(service)
    assert (done["state"], done["finishedAt"] is not None) == ("done", True)
    failing = start_call(service, who, "shell.exec", {"command": "false"}, "k-false")
    service.post("/runner/tool-calls/finish", {**who, "toolCallId": failing["toolCallId"], "status": "failed",
                                               "error": "exit 1"})
    assert [e["state"] for e in effects(service)] == ["failed", "done"]
    assert effects(service, "in_doubt") == []
    assert service.get("/api/projects/demo/effects?state=maybe").status_code == 400


def test_a_call_left_running_when_its_runner_dies_is_in_doubt_and_its_agent_is_told(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    call = start_call(service, who, "shell.exec", DEPLOY, "k-charge")
    coordination.fail_activation(store, activation, "Runner exited with 137")
    [effect] = effects(service, "in_doubt")
    assert (effect["toolCallId"], effect["callKey"]) == (call["toolCallId"], "k-charge")
    assert "failed" in effect["why"]
    [event] = [e for e in store.list_events(100) if e["type"] == "effect.in_doubt"]
    data = json.loads(event["data_json"])
    assert (data["effect"], data["agent"], data["tool"]) == (effect["id"], "worker", "shell.exec")
    # With no failed nudge to carry it (failedNudge is off), the next scheduler pass tells the agent.
    assert worker_signals(store, KIND_EFFECT_IN_DOUBT) == []
    coordination.nudge_and_monitor(store, config_of(store), utc_now())
    coordination.nudge_and_monitor(store, config_of(store), utc_now())  # told once
    [signal] = worker_signals(store, KIND_EFFECT_IN_DOUBT)
    assert (signal["status"], signal["priority"]) == ("pending", "P1")
    assert not is_news(signal, "worker")  # its own doing: no reason for the runaway guards to count afresh
    text = render_signal(signal)
    assert "is in doubt" in text and "will not run it again" in text and "k-charge" in text
    assert "pay.example/charge" in text and call["toolCallId"] in text
    # A finish that arrives after all (a runner that outlived its activation) leaves it to a person.
    service.post("/runner/tool-calls/finish", {**who, "toolCallId": call["toolCallId"], "status": "failed",
                                               "error": "lost"})
    assert [e["state"] for e in effects(service)] == ["in_doubt"]


def test_a_stop_leaves_the_running_call_in_doubt_and_the_resume_signal_says_so(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    start_call(service, identity(service, store, "worker", activation), "shell.exec", DEPLOY, "k-stop")
    coordination.stop(store)
    [effect] = effects(service)
    assert effect["state"] == "in_doubt"
    # One signal says both: resume, and check the call first.
    assert worker_signals(store, KIND_EFFECT_IN_DOUBT) == []
    [resume] = worker_signals(store, "scheduler.resume_after_stop")
    assert resume["payload"]["inDoubt"] == [effect["id"]]
    text = render_signal(resume)
    assert "Resume the interrupted work" in text and "is in doubt" in text and "k-stop" in text


def test_resolving_an_effect_tells_the_agent_once_and_a_second_answer_conflicts(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    start_call(service, identity(service, store, "worker", activation), "shell.exec", DEPLOY, "k-1")
    coordination.fail_activation(store, activation, "lost")
    coordination.nudge_and_monitor(store, config_of(store), utc_now())
    [effect] = effects(service, "in_doubt")
    bad = service.post(f"/api/projects/demo/effects/{effect['id']}/resolve", {"resolution": "maybe"})
    assert (bad.status_code, bad.json()) == (400, {"error": "resolution must be one of done, not_done"})
    assert service.post("/api/projects/demo/effects/eff_nope/resolve", {"resolution": "done"}).status_code == 404
    reply = service.post(f"/api/projects/demo/effects/{effect['id']}/resolve",
                         {"resolution": "not_done", "note": "no charge in the dashboard"})
    assert reply.status_code == 200, reply.text
    resolved = reply.json()
    assert (resolved["state"], resolved["resolution"], resolved["resolvedBy"], resolved["note"]) == (
        "failed", "not_done", "api", "no charge in the dashboard")
    assert resolved["resolvedAt"]
    assert effects(service, "in_doubt") == []
    again = service.post(f"/api/projects/demo/effects/{effect['id']}/resolve", {"resolution": "done"})
    assert (again.status_code, again.json()) == (409, {"error": f"Effect {effect['id']} is failed, not in doubt"})
    [told] = worker_signals(store, KIND_EFFECT_RESOLVED)
    text = render_signal(told)
    assert "resolved by a person: it did not happen" in text and "no charge in the dashboard" in text
    assert [e["type"] for e in store.list_events(100)].count("effect.resolved") == 1


def test_the_cli_lists_and_resolves_effects(served, tmp_path):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    start_call(service, identity(service, store, "worker", activation), "shell.exec", DEPLOY, "k-cli")
    coordination.fail_activation(store, activation, "lost")
    root = ["--root", str(service.root.path)]
    out, err = io.StringIO(), io.StringIO()
    assert suzumio.main(["effects", "demo", "--state", "in_doubt", *root], out=out, err=err) == 0, err.getvalue()
    [line] = out.getvalue().splitlines()
    effect_id = line.split()[0]
    assert "in_doubt" in line and "shell.exec" in line and "k-cli" in line and "pay.example" in line
    out = io.StringIO()
    assert suzumio.main(["effects", "demo", "--json", *root], out=out, err=err) == 0
    assert [e["id"] for e in json.loads(out.getvalue())] == [effect_id]
    out = io.StringIO()
    assert suzumio.main(["resolve", "demo", effect_id, "done", "charged", "once", *root], out=out, err=err) == 0
    assert out.getvalue() == f"{effect_id} resolved: done (shell.exec of worker)\n"
    assert store.effect_row(effect_id)["note"] == "charged once"
    out, err = io.StringIO(), io.StringIO()
    assert suzumio.main(["resolve", "demo", effect_id, "done", *root], out=out, err=err) == 1
    assert err.getvalue().strip() == f"Error: Effect {effect_id} is done, not in doubt"
    out = io.StringIO()
    assert suzumio.main(["effects", "demo", "--state", "in_doubt", *root], out=out, err=err) == 0
    assert out.getvalue() == "No external tool calls in_doubt.\n"


def test_the_failed_nudge_carries_the_notice_of_the_failed_activations_calls_in_doubt(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    start_call(service, identity(service, store, "worker", activation), "shell.exec", DEPLOY, "k-nudge")
    coordination.fail_activation(store, activation, "Runner exited with 137")
    [effect] = effects(service, "in_doubt")
    config = config_of(store)
    nudging = dataclasses.replace(config.scheduler, failed_nudge=dataclasses.replace(
        config.scheduler.failed_nudge, enabled=True, initial_delay_ms=0))
    coordination.nudge_and_monitor(store, dataclasses.replace(config, scheduler=nudging), utc_now())
    [nudge] = worker_signals(store, "scheduler.failed_nudge")
    assert nudge["payload"]["inDoubt"] == [effect["id"]] and worker_signals(store, KIND_EFFECT_IN_DOUBT) == []
    text = render_signal(nudge)
    assert "Your previous activation failed" in text and "is in doubt" in text and "k-nudge" in text


# ---------------------------------------------------------------- approvals bind to one effect

def test_an_allowed_call_is_intended_when_its_runner_hears_so_and_in_doubt_when_that_runner_dies(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    started = start_call(service, who, "shell.exec", {"command": "deploy prod"}, "k-deploy")
    approval_id = started["approval"]["id"]
    assert effects(service) == []  # nothing runs before a person allows it
    assert service.post(f"/api/projects/demo/approvals/{approval_id}", {"decision": "allow"}).status_code == 200
    for _ in range(2):  # the runner asks again after a lost answer: one intended effect
        waited = service.post("/runner/approvals/wait", {**who, "approvalId": approval_id, "waitMs": 0}).json()
        assert waited["run"] is True
    [effect] = effects(service)
    assert (effect["state"], effect["callKey"]) == ("intended", "k-deploy")
    coordination.fail_activation(store, activation, "Runner exited with 137")
    assert [e["state"] for e in effects(service)] == ["in_doubt"]
    # The agent's next activation that wants to deploy again needs a new decision.
    retry = identity(service, store, "worker", running_activation(store, "worker")["id"])
    again = start_call(service, retry, "shell.exec", {"command": "deploy prod"}, "k-deploy-2")
    assert again["approval"]["status"] == "pending" and again["approval"]["id"] != approval_id
    assert [a["status"] for a in suzumio_approvals.list_approvals(store)] == ["pending", "allowed"]


# ---------------------------------------------------------------- a controller that stopped

def test_a_call_an_earlier_controller_ran_itself_is_in_doubt_and_its_late_finish_changes_nothing(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    calls = [start_call(service, who, "file.read", {"path": f"{n}.md"}, f"k-{n}")["toolCallId"] for n in range(3)]
    with store.write() as tx:  # an MCP call that a killed controller ran, one of this process, one in the sandbox
        dead = store.insert_effect(tx, "worker", activation, calls[0], "bank.pay", {"amount": 5}, "k-0",
                                   suzumio_effects.CONTROLLER, "a-dead-process")
        mine = store.insert_effect(tx, "worker", activation, calls[1], "bank.pay", {"amount": 6}, "k-1",
                                   suzumio_effects.CONTROLLER, suzumio_effects.PROCESS)
        sandbox = store.insert_effect(tx, "worker", activation, calls[2], "shell.exec", {}, "k-2",
                                      suzumio_effects.RUNNER)
    assert suzumio_effects.doubt_after_restart(store) == [dead]
    assert suzumio_effects.doubt_after_restart(store) == []
    states = {e["id"]: e["state"] for e in effects(service)}
    assert (states[dead], states[mine], states[sandbox]) == ("in_doubt", "intended", "intended")
    assert "controller" in store.effect_row(dead)["why"]
    assert store.activation(activation)["status"] == "running"  # the runner lives on; its call is in doubt
    # The runner's report after the restart (its support call failed when the controller died) changes nothing.
    service.post("/runner/tool-calls/finish", {**who, "toolCallId": calls[0], "status": "failed", "error": "lost"})
    assert store.effect_row(dead)["state"] == "in_doubt"
