"""suzumio_approvals through its real surfaces: the approve rules of the config pipeline, the
runner routes on the runner socket and the user routes on Waitress (a real root and SQLite file, no
runner process: the runner's side is posted by hand, as a hostile activation could), and the CLI."""
import io
import json
import threading
from datetime import timedelta

import pytest
from api_fixtures import identity, init_project, running_activation, serving
from conftest import wait_until
from store_fixtures import config_of

import suzumio
import suzumio_approvals
import suzumio_config
import suzumio_coordination as coordination
from suzumio_errors import ConfigError
from suzumio_records import parse_ts

pytestmark = pytest.mark.timeout(120)

PROJECT_YAML = """\
name: demo
task: Ship it.
agents:
  pm:
    tools: [messages.send, "file.*"]
  worker:
    tools: [messages.send, "file.*", "shell.*", web.fetch]
    approve:
      - {tool: shell.exec, match: {command: "git push|rm -rf"}, timeoutMs: 60000}
tools:
  toolpacks: [core, shell, web]
  approve:
    - {tool: "web.*", onExpiry: allow, timeoutMs: 5000}
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


def load(tmp_path, text):
    path = tmp_path / "project.yaml"
    path.write_text(text, encoding="utf-8")
    return suzumio_config.load_project(path, env={})


# ---------------------------------------------------------------- rules in the config

def test_rules_load_in_matching_order_and_render_as_written(tmp_path):
    config = load(tmp_path, PROJECT_YAML)
    worker = config.approval_rules("worker")
    assert [(r.source, r.tool, dict(r.match), r.timeout_ms, r.on_expiry) for r in worker] == [
        ("agent", "shell.exec", {"command": "git push|rm -rf"}, 60000, "deny"),
        ("project", "web.*", {}, 5000, "allow")]
    assert [r.tool for r in config.approval_rules("pm")] == ["web.*"]
    rendered = config.render()
    assert "approve:" in rendered and "git push|rm -rf" in rendered and "onExpiry: allow" in rendered
    assert suzumio_approvals.matching_rule(config, "worker", "shell.exec", {"command": "git push origin"}) == worker[0]
    assert suzumio_approvals.matching_rule(config, "worker", "shell.exec", {"command": "ls"}) is None
    assert suzumio_approvals.matching_rule(config, "worker", "shell.exec", {}) is None
    assert suzumio_approvals.matching_rule(config, "worker", "web.fetch", {"url": "x"}) == worker[1]
    assert suzumio_approvals.matching_rule(config, "pm", "messages.send", {}) is None


def test_a_file_without_rules_renders_no_approve_key(tmp_path):
    text = PROJECT_YAML.replace("    approve:\n      - {tool: shell.exec, match: {command: \"git push|rm -rf\"}, "
                                "timeoutMs: 60000}\n", "")
    text = text.replace("  approve:\n    - {tool: \"web.*\", onExpiry: allow, timeoutMs: 5000}\n", "")
    config = load(tmp_path, text)
    assert "approve" not in config.render()
    assert config.approval_rules("worker") == ()


@pytest.mark.parametrize(("rule", "message"), [
    ('{tool: shell.run}', 'agents.worker.approve.0.tool: unknown tool "shell.run" (registered: '),
    ('{tool: "nope.*"}', 'agents.worker.approve.0.tool: unknown tool "nope.*"'),
    ('{tool: shell.exec, match: {command: "(unclosed"}}', "agents.worker.approve.0.match.command: invalid regular "
                                                          "expression '(unclosed'"),
    ('{tool: shell.exec, onExpiry: maybe}', "agents.worker.approve.0.onExpiry"),
    ('{tool: shell.exec, timeoutMs: 0}', "agents.worker.approve.0.timeoutMs"),
    ('{match: {command: x}}', "agents.worker.approve.0.tool: Required"),
])
def test_bad_rules_are_config_errors_naming_the_path(tmp_path, rule, message):
    text = PROJECT_YAML.replace('{tool: shell.exec, match: {command: "git push|rm -rf"}, timeoutMs: 60000}', rule)
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert message in caught.value.message


# ---------------------------------------------------------------- routes

@pytest.fixture()
def served(tmp_path):
    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config", PROJECT_YAML)
        store.start()
        yield service, store


def start_gated(service, store, command="git push origin main", activation=None):
    activation = activation or running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    reply = service.post("/runner/tool-calls/start", {**who, "tool": "shell.exec", "input": {"command": command}})
    assert reply.status_code == 200, reply.text
    return who, reply.json()


def test_a_matching_call_gets_a_pending_request_and_others_do_not(served):
    service, store = served
    who, started = start_gated(service, store)
    assert started["approval"]["status"] == "pending"
    assert set(started) == {"toolCallId", "approval"}
    plain = service.post("/runner/tool-calls/start", {**who, "tool": "shell.exec", "input": {"command": "ls"}})
    assert set(plain.json()) == {"toolCallId"}
    [row] = service.get("/api/projects/demo/approvals").json()
    assert (row["id"], row["toolCallId"], row["input"]) == (
        started["approval"]["id"], started["toolCallId"], {"command": "git push origin main"})
    assert service.get(f"/api/projects/demo/approvals/{row['id']}").json() == row
    waited = service.post("/runner/approvals/wait", {**who, "approvalId": row["id"], "waitMs": 0}).json()
    assert waited == {"approvalId": row["id"], "status": "pending", "expiresAt": row["expiresAt"]}
    assert parse_ts(row["expiresAt"]) - parse_ts(row["createdAt"]) == timedelta(milliseconds=60000)


def written(store):
    return {table: store.db_get(f"SELECT COUNT(*) AS n FROM {table}")["n"]
            for table in ("tool_calls", "approvals", "events", "agent_history_messages", "signals")}


def events_of(store, kind):
    return [e for e in store.list_events(1000) if e["type"] == kind]


def test_a_start_asked_again_with_its_call_key_answers_the_same_call_and_request(served):
    service, store = served
    who = identity(service, store, "worker", running_activation(store, "worker")["id"])
    call = {**who, "tool": "shell.exec", "input": {"command": "git push origin main"}, "callKey": "c0ffee-1"}
    first = service.post("/runner/tool-calls/start", call)
    assert first.status_code == 200 and first.json()["approval"]["status"] == "pending"
    before = written(store)
    again = service.post("/runner/tool-calls/start", call)  # the runner lost the first answer
    assert (again.status_code, again.json()) == (200, first.json())
    assert written(store) == before
    assert before["tool_calls"] == before["approvals"] == len(events_of(store, "approval.requested")) == 1
    # decided meanwhile: the same request, in its current status; the runner's wait then answers at once
    approval_id = first.json()["approval"]["id"]
    assert service.post(f"/api/projects/demo/approvals/{approval_id}", {"decision": "allow-always"}).status_code == 200
    decided = service.post("/runner/tool-calls/start", call).json()
    assert decided == {"toolCallId": first.json()["toolCallId"],
                       "approval": {"id": approval_id, "status": "allowed",
                                    "expiresAt": first.json()["approval"]["expiresAt"]}}
    waited = service.post("/runner/approvals/wait", {**who, "approvalId": approval_id, "waitMs": 0}).json()
    assert (waited["status"], waited["run"]) == ("allowed", True)
    # a call the grant covers, asked twice: one row, one approval.auto_allowed event, no request
    covered = {**call, "input": {"command": "git push origin next"}, "callKey": "c0ffee-2"}
    answers = [service.post("/runner/tool-calls/start", covered).json() for _ in range(2)]
    assert answers[0] == answers[1] and set(answers[0]) == {"toolCallId"}
    assert len(events_of(store, "approval.auto_allowed")) == 1
    # the key names one call: another input under it is refused, and writes nothing
    before = written(store)
    reused = service.post("/runner/tool-calls/start", {**call, "input": {"command": "rm -rf /"}})
    assert (reused.status_code, reused.json()) == (409, {"error": "callKey c0ffee-1 was already used for another "
                                                                  "tool call"})
    assert written(store) == before
    assert [c["tool"] for c in store.list_tool_calls(10)] == ["shell.exec", "shell.exec"]


def test_a_bad_call_key_is_refused_with_the_one_error_shape_and_nothing_is_written(served):
    service, store = served
    who = identity(service, store, "worker", running_activation(store, "worker")["id"])
    before = written(store)
    for key in ("", 7, True, ["k"], {"k": 1}, "x" * 129, "has space", "k\n", "ключ"):
        reply = service.post("/runner/tool-calls/start", {**who, "tool": "shell.exec",
                                                           "input": {"command": "git push"}, "callKey": key})
        assert (reply.status_code, reply.json()) == (
            400, {"error": "callKey must be 1 to 128 letters, digits, '.', '_', ':' or '-'"}), key
    assert written(store) == before
    # null is no key (an older runner): today's behaviour
    for _ in range(2):
        reply = service.post("/runner/tool-calls/start", {**who, "tool": "shell.exec", "input": {"command": "ls"},
                                                           "callKey": None})
        assert reply.status_code == 200
    longest = service.post("/runner/tool-calls/start", {**who, "tool": "shell.exec", "input": {"command": "ls"},
                                                         "callKey": "A-z_0.9:" * 16})
    assert longest.status_code == 200
    assert written(store)["tool_calls"] == 3


def test_concurrent_decisions_apply_exactly_once(served):
    service, store = served
    _who, started = start_gated(service, store)
    approval_id = started["approval"]["id"]
    answers = []

    def decide(decision):
        answers.append(service.post(f"/api/projects/demo/approvals/{approval_id}", {"decision": decision}))

    threads = [threading.Thread(target=decide, args=("allow" if i % 2 else "deny",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [200] + [409] * 7
    winner = next(a.json() for a in answers if a.status_code == 200)
    conflict = next(a.json() for a in answers if a.status_code == 409)
    assert conflict == {"error": f"Approval {approval_id} is already {winner['status']}"}
    decided = [e for e in store.list_events(1000) if e["type"] == "approval.decided"]
    assert len(decided) == 1


def test_allow_tells_the_waiting_runner_to_run(served):
    service, store = served
    who, started = start_gated(service, store)
    approval_id = started["approval"]["id"]
    answer = {}

    def wait():
        answer.update(service.post("/runner/approvals/wait", {**who, "approvalId": approval_id, "waitMs": 10000},
                                   timeout=30).json())

    waiter = threading.Thread(target=wait)
    waiter.start()
    reply = service.post(f"/api/projects/demo/approvals/{approval_id}", {"decision": "allow", "note": "ok"})
    waiter.join(20)
    assert reply.status_code == 200
    assert answer == {"approvalId": approval_id, "status": "allowed", "decision": "allow", "note": "ok",
                      "decidedBy": "api", "run": True}
    assert store.tool_call(started["toolCallId"])["status"] == "running"  # the runner finishes it


def test_deny_finishes_the_call_once_with_the_note_and_delivers_p1(served):
    service, store = served
    who, started = start_gated(service, store)
    approval_id = started["approval"]["id"]
    coordination.send_message(store, config_of(store), "user", "Urgent: also update the changelog.",
                              recipient="worker", priority="P1")
    service.post(f"/api/projects/demo/approvals/{approval_id}",
                 {"decision": "deny", "note": "Open a pull request instead."}, headers={"Suzumio-Client": "webui"})
    first = service.post("/runner/approvals/wait", {**who, "approvalId": approval_id}).json()
    assert first["run"] is False and first["status"] == "denied" and first["decidedBy"] == "webui"
    assert "Open a pull request instead." in first["output"] and "via webui" in first["output"]
    assert "Urgent: also update the changelog." in first["signalText"]
    row = store.tool_call(started["toolCallId"])
    assert (row["status"], row["error"]) == ("failed", first["output"])
    # asked again (an answer lost on the way): the same text, the call is not finished twice
    again = service.post("/runner/approvals/wait", {**who, "approvalId": approval_id}).json()
    assert again["output"] == first["output"] and "signalText" not in again
    assert len([e for e in store.list_events(1000) if e["type"] == "tool.failed"]) == 1


def test_decision_bodies_are_validated_with_the_one_error_shape(served):
    service, store = served
    _who, started = start_gated(service, store)
    path = f"/api/projects/demo/approvals/{started['approval']['id']}"
    for body, message in (({}, "decision must be one of allow, deny, allow-always, respond"),
                          ({"decision": "yes"}, "decision must be one of allow, deny, allow-always, respond"),
                          ({"decision": "deny", "note": 3}, "note must be a string"),
                          ({"decision": "deny", "note": "x" * 4001}, "note is longer than 4000 characters"),
                          ([1], "Expected a JSON object with decision")):
        reply = service.post(path, body)
        assert (reply.status_code, reply.json()) == (400, {"error": message})
    assert service.get("/api/projects/demo/approvals?status=pending").json()[0]["status"] == "pending"
    unknown = service.post("/api/projects/demo/approvals/apr_nope", {"decision": "allow"})
    assert (unknown.status_code, unknown.json()) == (404, {"error": "Unknown approval: apr_nope"})
    bad = service.get("/api/projects/demo/approvals?status=weird")
    assert bad.status_code == 400
    no_token = service.post(path, {"decision": "allow"}, auth=False)
    assert no_token.status_code == 401


def test_another_agent_cannot_wait_on_or_use_a_request(served):
    service, store = served
    _who, started = start_gated(service, store)
    other = running_activation(store, "pm")["id"]
    reply = service.post("/runner/approvals/wait", {**identity(service, store, "pm", other),
                                                    "approvalId": started["approval"]["id"], "waitMs": 0})
    assert (reply.status_code, reply.json()) == (
        404, {"error": f"Unknown approval for activation: {started['approval']['id']}"})


def test_an_ended_activation_cancels_its_pending_requests(served):
    service, store = served
    who, _started = start_gated(service, store)
    coordination.cancel_activation(store, who["activationId"], "Interrupted by P0 signal sig_x")
    [row] = service.get("/api/projects/demo/approvals").json()
    assert (row["status"], row["decidedBy"]) == ("cancelled", "system")
    waited = service.post("/runner/approvals/wait", {**who, "approvalId": row["id"]}).json()
    assert (waited["status"], waited["run"]) == ("cancelled", False)


def test_expiry_applies_the_rules_decision_once(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    started = service.post("/runner/tool-calls/start", {**who, "tool": "web.fetch", "input": {"url": "http://x"}})
    approval_id = started.json()["approval"]["id"]
    later = parse_ts(started.json()["approval"]["expiresAt"]) + timedelta(seconds=1)
    assert suzumio_approvals.expire_due(store, later) == 1
    assert suzumio_approvals.expire_due(store, later) == 0
    row = suzumio_approvals.approval(store, approval_id)
    assert (row["status"], row["decision"], row["decidedBy"]) == ("expired", "allow", "timeout")  # onExpiry: allow
    waited = service.post("/runner/approvals/wait", {**who, "approvalId": approval_id}).json()
    assert waited["run"] is True


def test_support_refuses_a_gated_controller_tool_without_an_allowed_request(tmp_path):
    text = PROJECT_YAML.replace('{tool: shell.exec, match: {command: "git push|rm -rf"}, timeoutMs: 60000}',
                                '{tool: messages.send, match: {recipient: "^pm$"}}')
    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config", text)
        store.start()
        activation = running_activation(store, "worker")["id"]
        who = identity(service, store, "worker", activation)
        call = {**who, "tool": "messages.send", "input": {"recipient": "pm", "body": "hi"}}
        refused = service.post("/toolpacks/core/support", call)
        assert (refused.status_code, refused.json()) == (
            409, {"error": "Tool call messages.send needs an approval that was not given"})
        approval_id = service.post("/runner/tool-calls/start", call).json()["approval"]["id"]
        assert service.post("/toolpacks/core/support", call).status_code == 409  # still pending
        service.post(f"/api/projects/demo/approvals/{approval_id}", {"decision": "allow"})
        assert service.post("/toolpacks/core/support", call).status_code == 200
        assert service.post("/toolpacks/core/support", call).status_code == 409  # used by that run
        assert [m["body"] for m in store.list_messages(10)] == ["hi"]
        # a recipient the rule does not match needs no approval
        other = {**call, "input": {"recipient": "user", "body": "a note for the person"}}
        assert service.post("/toolpacks/core/support", other).status_code == 200


# ---------------------------------------------------------------- CLI

def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_lists_allows_and_denies(served, tmp_path):
    service, store = served
    root = str(tmp_path / "root")
    who, first = start_gated(service, store)
    _who, second = start_gated(service, store, "rm -rf build", activation=who["activationId"])
    code, out, _ = run_cli("approvals", "demo", "--root", root)
    assert code == 0
    assert out.count(" pending worker shell.exec ") == 2
    assert '  input: {"command": "git push origin main"}' in out
    code, out, _ = run_cli("deny", "demo", second["approval"]["id"], "Keep", "the", "build.", "--root", root)
    assert (code, out) == (0, f"{second['approval']['id']}: denied (deny)\n")
    code, out, _ = run_cli("allow", "demo", first["approval"]["id"], "--always", "--root", root, "--json")
    assert code == 0 and json.loads(out)["decision"] == "allow-always" and json.loads(out)["decidedBy"] == "cli"
    code, _out, err = run_cli("allow", "demo", first["approval"]["id"], "--root", root)
    assert (code, err) == (1, f"Error: Approval {first['approval']['id']} is already allowed\n")
    code, out, _ = run_cli("approvals", "demo", "--root", root, "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert rows[second["approval"]["id"]]["note"] == "Keep the build."
    assert rows[second["approval"]["id"]]["decidedBy"] == "cli"
    code, out, _ = run_cli("approvals", "demo", "--root", root)
    assert "  note: Keep the build." in out


# ---------------------------------------------------------------- MCP server

def mcp_call(service, name, arguments):
    reply = service.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                  "params": {"name": name, "arguments": arguments}},
                         headers={"Accept": "application/json, text/event-stream"})
    assert reply.status_code == 200, reply.text
    return reply.json()["result"]


def test_the_mcp_server_lists_and_decides_approvals(served):
    service, store = served
    _who, started = start_gated(service, store)
    approval_id = started["approval"]["id"]
    listed = mcp_call(service, "list_approvals", {"project": "demo", "status": "pending"})
    assert [r["id"] for r in listed["structuredContent"]["approvals"]] == [approval_id]
    bad = mcp_call(service, "decide_approval", {"project": "demo", "approvalId": approval_id, "decision": "maybe"})
    assert bad["isError"] is True and "decision must be one of" in bad["content"][0]["text"]
    decided = mcp_call(service, "decide_approval", {"project": "demo", "approvalId": approval_id,
                                                    "decision": "deny", "note": "Not today."})
    assert (decided["structuredContent"]["status"], decided["structuredContent"]["decidedBy"]) == ("denied", "mcp")
    twice = mcp_call(service, "decide_approval", {"project": "demo", "approvalId": approval_id, "decision": "allow"})
    assert twice["isError"] is True
    assert twice["content"][0]["text"] == f"Approval {approval_id} is already denied"


def test_past_the_long_poll_limit_a_wait_is_answered_at_once_with_a_retry_hint(served):
    service, store = served
    who, started = start_gated(service, store)
    approval_id = started["approval"]["id"]
    done = threading.Event()

    def hold():
        # As a runner does: a wait answered at once (a quick poll held a place for a moment) is asked
        # again, so the holders come to hold every place even when one of them arrives during a poll.
        while not done.is_set():
            service.post("/runner/approvals/wait", {**who, "approvalId": approval_id, "waitMs": 4000}, timeout=30)

    holders = [threading.Thread(target=hold) for _ in range(suzumio_approvals.MAX_LONG_POLLS)]
    for holder in holders:
        holder.start()
    try:
        def quick_answer():
            reply = service.post("/runner/approvals/wait", {**who, "approvalId": approval_id, "waitMs": 0}).json()
            return reply if "retryAfterMs" in reply else None
        answer = wait_until(quick_answer, 10, message="an answer with retryAfterMs")
        assert answer["status"] == "pending" and answer["retryAfterMs"] == suzumio_approvals.RETRY_AFTER_MS
    finally:
        done.set()
        # The decision answers every held wait at once.
        service.post(f"/api/projects/demo/approvals/{approval_id}", {"decision": "deny"})
        for holder in holders:
            holder.join(30)
    assert not any(holder.is_alive() for holder in holders)
