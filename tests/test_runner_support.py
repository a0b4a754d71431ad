"""Runner routes (docs/design/runner.md, docs/http-api.md): the authorization chain in its order, tool-call
audit, P1 delivery at the tool boundary, signals, history, context and the only completion path."""
import pytest
from api_fixtures import init_project, project_yaml, running_activation, serving
from conftest import wait_until
from store_fixtures import config_of

import suzumio_coordination as coordination

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def act(demo):
    """A: worker's running activation, no process behind it."""
    return running_activation(demo, "worker")


def ident(service, agent_id, activation, **fields):
    return {"project": "demo", "agentId": agent_id, "activationId": activation["id"],
            "token": service.token("demo", agent_id), **fields}


def counts(store):
    stats = store.project_stats()
    return (stats["toolCallCount"], stats["historyMessageCount"], stats["eventCount"],
            store.db_get("SELECT COUNT(*) AS n FROM signals")["n"])


def expect(response, status, body):
    assert response.status_code == status, response.text
    assert response.json() == body


def test_bad_token_is_refused_on_every_runner_route_without_side_effects(service, demo, act):
    bad = ident(service, "worker", act, token="wrong-token")
    before = counts(demo)
    requests = [
        ("/runner/tool-calls/start", {"tool": "shell.exec", "input": {}}),
        ("/runner/tool-calls/finish", {"toolCallId": "tool_x", "status": "completed"}),
        ("/runner/history/messages", {"role": "assistant", "kind": "assistant_output", "content": "hi"}),
        ("/runner/history/compact", {"summary": "s"}),
        ("/runner/signals", {"kind": "x.note"}),
        ("/toolpacks/core/support", {"tool": "messages.send", "input": {"recipient": "pm", "body": "x"}}),
        ("/activation-context", {"context": {"version": 1, "kind": "model-context", "messages": []}}),
        ("/activation-output", {"output": {"text": "done"}}),
    ]
    for path, fields in requests:
        expect(service.post(path, {**bad, **fields}), 403, {"error": "Invalid agent token"})
    assert counts(demo) == before
    assert demo.activation(act["id"])["status"] == "running"


def test_missing_fields_come_first_then_project_agent_and_activation(service, demo, act):
    body = ident(service, "worker", act, kind="x")
    expect(service.post("/runner/signals", {**body, "token": ""}), 400, {"error": "token is required"})
    expect(service.post("/runner/signals", {**body, "project": None}), 400, {"error": "project is required"})
    expect(service.post("/runner/signals", {**body, "kind": "  "}), 400, {"error": "kind is required"})
    expect(service.post("/runner/signals", {**body, "project": "ghost"}), 404, {"error": "Unknown project: ghost"})
    assert not (service.root.path / "ghost").exists()
    expect(service.post("/runner/signals", {**body, "agentId": "ghost"}), 404, {"error": "Unknown agent: ghost"})
    expect(service.post("/runner/signals", {**body, "activationId": "act_x"}), 404,
           {"error": "Unknown activation: act_x"})
    expect(service.post("/runner/signals", {**body, "activationId": "act_x", "token": "bad"}), 403,
           {"error": "Invalid agent token"})


def test_another_agents_activation_is_forbidden(service, demo, act):
    pm_act = running_activation(demo, "pm")
    body = ident(service, "worker", pm_act, kind="review.ready", targetAgent="pm")
    expect(service.post("/runner/signals", body), 403,
           {"error": f"Activation {pm_act['id']} does not belong to worker"})
    expect(service.post("/runner/tool-calls/start", {**body, "tool": "shell.exec"}), 403,
           {"error": f"Activation {pm_act['id']} does not belong to worker"})


def test_finished_activation_refuses_tool_signal_support_and_history_calls(service, demo, act):
    call = demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"})
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    coordination.record_signal(demo, config_of(demo), "urgent", target_agent="worker", priority="P1")
    before = counts(demo)
    tool_text = f"Activation {act['id']} is completed; no more tool calls are accepted"
    history_text = f"Activation {act['id']} is completed; history updates are not accepted"
    body = ident(service, "worker", act)
    expect(service.post("/runner/tool-calls/start", {**body, "tool": "shell.exec"}), 409, {"error": tool_text})
    expect(service.post("/runner/signals", {**body, "kind": "x"}), 409, {"error": tool_text})
    expect(service.post("/toolpacks/core/support", {**body, "tool": "messages.send", "input": {}}), 409,
           {"error": tool_text})
    expect(service.post("/runner/history/messages", {**body, "role": "assistant", "kind": "k", "content": "c"}),
           409, {"error": history_text})
    expect(service.post("/runner/history/compact", {**body, "summary": "s"}), 409, {"error": history_text})
    assert counts(demo) == before
    finish = service.post("/runner/tool-calls/finish",
                          {**body, "toolCallId": call["toolCallId"], "status": "completed", "output": "x"})
    expect(finish, 200, {"status": "completed"})
    assert demo.list_signals(target_agent="worker", kind="urgent")[0]["status"] == "pending"


def test_tool_call_start_and_finish_leave_the_audit_trail(service, demo, act):
    body = ident(service, "worker", act)
    started = service.post("/runner/tool-calls/start", {**body, "tool": "shell.exec", "input": {"command": "ls"}})
    assert started.status_code == 200 and started.json()["toolCallId"].startswith("tool_")
    tool_call_id = started.json()["toolCallId"]
    finished = service.post("/runner/tool-calls/finish",
                            {**body, "toolCallId": tool_call_id, "status": "completed", "output": "ok"})
    expect(finished, 200, {"status": "completed"})
    row = service.get("/api/projects/demo/tool-calls").json()[0]
    assert row["id"] == tool_call_id and row["status"] == "completed" and row["completed_at"]
    assert row["output"] == "ok" and row["input_json"] == '{"command":"ls"}'
    history = demo.history_page("worker", limit=2)["messages"]
    assert history[1]["kind"] == "tool_call" and history[1]["content"].startswith("# Tool Call\nTool: shell.exec")
    assert history[0]["kind"] == "tool_result" and "Status: completed" in history[0]["content"]
    types = [e["type"] for e in demo.list_events(4)]
    assert "tool.called" in types and "tool.completed" in types

    failing = service.post("/runner/tool-calls/start", {**body, "tool": "shell.exec"}).json()["toolCallId"]
    expect(service.post("/runner/tool-calls/finish",
                        {**body, "toolCallId": failing, "status": "failed", "error": "E"}), 200, {"status": "failed"})
    last = demo.history_page("worker", limit=1)["messages"][0]
    assert last["kind"] == "tool_error" and "Error: E" in last["content"]
    assert demo.tool_call(failing)["input_json"] == "{}"


def test_tool_call_start_checks_the_registry_and_the_allowlist(service, demo, act):
    body = ident(service, "worker", act)
    before = counts(demo)
    expect(service.post("/runner/tool-calls/start", body), 400, {"error": "tool is required"})
    expect(service.post("/runner/tool-calls/start", {**body, "tool": "nope"}), 404, {"error": "Unknown tool: nope"})
    expect(service.post("/runner/tool-calls/start", {**body, "tool": "nope.tool"}), 404,
           {"error": "Unknown tool: nope.tool"})
    pm_act = running_activation(demo, "pm")
    expect(service.post("/runner/tool-calls/start", ident(service, "pm", pm_act, tool="shell.exec")), 403,
           {"error": "Tool not allowed for pm: shell.exec"})
    assert counts(demo)[0] == before[0]


def test_tool_call_finish_checks_status_and_ownership(service, demo, act):
    other = running_activation(demo, "pm")
    foreign = demo.start_tool_call("pm", other["id"], "messages.send", {})["toolCallId"]
    body = ident(service, "worker", act)
    expect(service.post("/runner/tool-calls/finish", {**body, "toolCallId": foreign, "status": "completed"}), 404,
           {"error": f"Unknown tool call for activation: {foreign}"})
    own = demo.start_tool_call("worker", act["id"], "shell.exec", {})["toolCallId"]
    expect(service.post("/runner/tool-calls/finish", {**body, "toolCallId": own, "status": "done"}), 400,
           {"error": "Invalid tool call status: done"})
    expect(service.post("/runner/tool-calls/finish", {**body, "status": "completed"}), 400,
           {"error": "toolCallId is required"})


def test_p1_signals_reach_a_running_activation_at_the_next_completed_tool_call(service, demo, act):
    message = coordination.send_message(demo, config_of(demo), "pm", "Stop and check the proof.", recipient="worker",
                                        priority="P1")
    coordination.send_message(demo, config_of(demo), "pm", "Later work.", recipient="worker", priority="P2")
    body = ident(service, "worker", act)
    tool_call_id = service.post("/runner/tool-calls/start", {**body, "tool": "shell.exec"}).json()["toolCallId"]
    result = service.post("/runner/tool-calls/finish",
                          {**body, "toolCallId": tool_call_id, "status": "completed", "output": "x"}).json()
    assert result["status"] == "completed" and result["deliveredSignals"] == 1
    assert result["signalText"].startswith("# New P1 Signals Delivered At Tool Boundary")
    assert "Stop and check the proof." in result["signalText"]
    signals = {s["priority"]: s for s in demo.list_signals(target_agent="worker", kind="message.created")}
    assert signals["P1"]["status"] == "delivered" and signals["P1"]["deliveredActivationId"] == act["id"]
    assert signals["P2"]["status"] == "pending"
    assert demo.history_page("worker", limit=1)["messages"][0]["kind"] == "tool_boundary_signals"
    assert message["priority"] == "P1"


def test_a_finish_asked_again_answers_the_first_result_and_records_nothing(service, demo, act):
    coordination.send_message(demo, config_of(demo), "pm", "Stop and check the proof.", recipient="worker",
                              priority="P1")
    body = ident(service, "worker", act)
    started = service.post("/runner/tool-calls/start", {**body, "tool": "shell.exec", "callKey": "k1"}).json()
    finish = {**body, "toolCallId": started["toolCallId"], "status": "completed", "output": "x"}
    first = service.post("/runner/tool-calls/finish", finish)
    assert first.status_code == 200 and first.json()["deliveredSignals"] == 1
    before = counts(demo)
    again = service.post("/runner/tool-calls/finish", finish)  # the runner lost the first answer
    expect(again, 200, first.json())
    assert counts(demo) == before
    assert [e["type"] for e in demo.list_events(100)].count("tool.completed") == 1


def test_finishing_wait_for_signal_delivers_no_p1(service, demo, act):
    coordination.send_message(demo, config_of(demo), "pm", "Urgent.", recipient="worker", priority="P1")
    body = ident(service, "worker", act)
    tool_call_id = service.post("/runner/tool-calls/start",
                                {**body, "tool": "coordination.wait_for_signal"}).json()["toolCallId"]
    result = service.post("/runner/tool-calls/finish",
                          {**body, "toolCallId": tool_call_id, "status": "completed", "output": "Waiting"})
    expect(result, 200, {"status": "completed"})
    assert demo.list_signals(target_agent="worker", kind="message.created")[0]["status"] == "pending"


def test_runner_signals_record_with_the_caller_as_source(service, demo, act):
    body = ident(service, "worker", act)
    expect(service.post("/runner/signals", {**body, "kind": "review.ready", "targetAgent": "pm"}), 200,
           {"status": "recorded"})
    recorded = demo.list_signals(target_agent="pm", kind="review.ready")[0]
    assert (recorded["status"], recorded["priority"], recorded["sourceAgent"], recorded["sourceActivation"]) == \
        ("pending", "P3", "worker", act["id"])
    before = counts(demo)
    expect(service.post("/runner/signals", {**body, "kind": "x", "payload": [1]}), 400,
           {"error": "payload must be an object"})
    expect(service.post("/runner/signals", {**body, "kind": "x", "usefulEffect": "yes"}), 400,
           {"error": "Expected boolean, got yes"})
    expect(service.post("/runner/signals", {**body, "kind": "review.ready", "targetAgent": "pm", "status": "closed"}),
           400, {"error": "Targeted signals cannot be closed; omit the target or omit status"})
    expect(service.post("/runner/signals", {**body, "kind": "x", "status": "open"}), 400,
           {"error": "Invalid signal status: open"})
    expect(service.post("/runner/signals", {**body, "kind": "x", "targetAgent": "ghost"}), 400,
           {"error": "Unknown agent: ghost"})
    assert counts(demo) == before
    expect(service.post("/runner/signals", {**body, "kind": "x.note", "status": "pending"}), 200,
           {"status": "recorded"})
    assert demo.list_signals(kind="x.note")[0]["status"] == "closed"
    expect(service.post("/runner/signals", {**body, "kind": "x.useful", "usefulEffect": True}), 200,
           {"status": "recorded"})
    useful = demo.list_signals(kind="x.useful")[0]
    assert useful["status"] == "closed" and useful["usefulEffect"] is True


def test_history_messages_append_for_a_running_activation(service, demo, act):
    body = ident(service, "worker", act)
    expect(service.post("/runner/history/messages", {**body, "role": "system", "kind": "k", "content": "c"}), 400,
           {"error": "Invalid history role: system"})
    response = service.post("/runner/history/messages",
                            {**body, "role": "assistant", "kind": "assistant_output", "content": "hi",
                             "metadata": {"model": "m"}})
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "recorded"
    assert result["message"]["sequence"] == 2 and result["message"]["metadata"] == {"model": "m"}
    assert result["message"]["parts"][0]["type"] == "text"


def test_history_routes_require_an_activation_id_and_a_running_activation(service, demo, act):
    finished = running_activation(demo, "pm")
    coordination.complete_activation(demo, config_of(demo), finished["id"], "pm", "done")
    before = counts(demo)
    body = ident(service, "worker", act)
    del body["activationId"]
    for path, fields in (("/runner/history/messages", {"role": "user", "kind": "k", "content": "c"}),
                         ("/runner/history/compact", {"summary": "s"})):
        expect(service.post(path, {**body, **fields}), 400, {"error": "activationId is required"})
        expect(service.post(path, {**ident(service, "pm", finished), **fields}), 409,
               {"error": f"Activation {finished['id']} is completed; history updates are not accepted"})
    expect(service.post("/runner/history/compact", {**ident(service, "worker", act), "summary": "  "}), 400,
           {"error": "summary is required"})
    assert counts(demo) == before


def test_compaction_archives_the_head_and_is_unchanged_when_short(service, demo, act):
    body = ident(service, "worker", act)
    for index in range(4):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", f"row {index}")
    short = service.post("/runner/history/compact", {**body, "summary": "S", "keepTail": 12}).json()
    assert short["status"] == "unchanged" and len(short["history"]) == 5 and "compaction" not in short
    for index in range(15):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", f"more {index}")
    compacted = service.post("/runner/history/compact", {**body, "summary": "Summary.", "keepTail": "5.7"}).json()
    assert compacted["status"] == "compacted"
    assert compacted["compaction"]["archivedMessageCount"] == 15
    assert len(compacted["history"]) == 6 and compacted["history"][0]["role"] == "compaction"
    again = service.post("/runner/history/compact", {**body, "summary": "S", "keepTail": 100}).json()
    assert again["status"] == "unchanged"


def test_activation_context_validates_the_snapshot_before_authenticating(service, demo, act):
    body = ident(service, "worker", act)
    expect(service.post("/activation-context", body), 400, {"error": "context is required"})
    expect(service.post("/activation-context",
                        {**body, "token": "bad", "context": {"version": 2, "kind": "model-context", "messages": []}}),
           400, {"error": "Invalid activation context"})
    snapshot = {"version": 1, "kind": "model-context", "messages": [{"role": "user", "content": "abc"}]}
    expect(service.post("/activation-context", {**body, "context": snapshot}), 200,
           {"status": "recorded", "activationId": act["id"]})
    event = next(e for e in demo.list_events(5) if e["type"] == "activation.context_recorded")
    assert '"messageCount":1' in event["data_json"]


def test_activation_output_is_the_idempotent_completion_path(service, demo, act):
    body = ident(service, "worker", act)
    expect(service.post("/activation-output", {**body, "token": service.token("demo", "pm"),
                                               "output": {"text": "done"}}), 403, {"error": "Invalid agent token"})
    assert demo.activation(act["id"])["status"] == "running"
    expect(service.post("/activation-output", body), 400, {"error": "output is required"})
    expect(service.post("/activation-output", {**body, "output": {}}), 400, {"error": "output.text is required"})
    expect(service.post("/activation-output", {**body, "token": "bad", "output": {"text": "  "}}), 400,
           {"error": "output.text is required"})
    first = service.post("/activation-output", {**body, "output": {"text": "done", "usage": {"tokens": 1}}})
    expect(first, 200, {"status": "completed", "activationId": act["id"]})
    completed = demo.activation(act["id"])
    assert completed["text"] == "done" and completed["usage"] == {"tokens": 1}
    second = service.post("/activation-output", {**body, "output": {"text": "other"}})
    expect(second, 200, {"status": "completed", "activationId": act["id"]})
    again = demo.activation(act["id"])
    assert again["text"] == "done" and again["completedAt"] == completed["completedAt"]


def test_output_for_a_failed_activation_reports_failed_and_changes_nothing(service, demo, act):
    coordination.fail_activation(demo, act["id"], "activation timed out")
    body = ident(service, "worker", act, output={"text": "late"})
    expect(service.post("/activation-output", body), 200, {"status": "failed", "activationId": act["id"]})
    assert demo.activation(act["id"])["error"] == "activation timed out"


def test_completing_an_activation_triggers_a_scheduler_tick(tmp_path):
    # The scheduler thread runs with an hour-long interval, so only the route's trigger can tick.
    with serving(tmp_path / "root", scheduler_interval=3600) as service:
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        demo.start()
        act = running_activation(demo, "worker")
        coordination.send_message(demo, config_of(demo), "user", "Next task.", recipient="worker")
        body = {"project": "demo", "agentId": "worker", "activationId": act["id"],
                "token": service.token("demo", "worker"), "output": {"text": "done"}}
        assert service.post("/activation-output", body).status_code == 200
        wait_until(lambda: len(demo.list_activations()) >= 2, 10, message="a new worker activation")
        assert demo.list_activations()[1]["agentId"] == "worker"
