"""suzumio_guards and the edited and answered approvals through their real surfaces: the config
pipeline, the runner routes on the runner socket and the user routes on Waitress (a real root and
SQLite file, no runner process: the runner's side is posted by hand, as a hostile activation could),
the CLI and the MCP server."""
import json
import os
import time

import pytest
from api_fixtures import identity, init_project, running_activation, serving
from conftest import wait_until
from test_approvals import PROJECT_YAML, load, mcp_call, run_cli, start_gated

import suzumio_coordination as coordination
import suzumio_guards

pytestmark = pytest.mark.timeout(120)

GUARDED_YAML = PROJECT_YAML.replace("""    approve:
      - {tool: shell.exec, match: {command: "git push|rm -rf"}, timeoutMs: 60000}
""", """    approve:
      - {tool: shell.exec, match: {command: "git push|rm -rf"}, timeoutMs: 60000}
    guards: {pingPong: 3}
guards: {repeatedToolCall: 3}
""")


# The worker's runner (a real one, started by a tick) asks for a gated call first and waits for the
# decision, so its activation runs on, calling nothing else, while a test calls tools in it.
HELD_YAML = GUARDED_YAML.replace("replay: {type: scripted, script: {agents: {}}}", """replay:
          type: scripted
          script:
            agents:
              worker:
                - steps: [{tools: [{name: shell.exec, input: {command: "git push origin main"}}]}]""")


def serve_project(tmp_path, text):
    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config", text)
        store.start()
        yield service, store


@pytest.fixture()
def served(tmp_path):
    yield from serve_project(tmp_path, GUARDED_YAML)


@pytest.fixture()
def held(tmp_path):
    yield from serve_project(tmp_path, HELD_YAML)


def start(service, who, tool, tool_input):
    return service.post("/runner/tool-calls/start", {**who, "tool": tool, "input": tool_input})


# ---------------------------------------------------------------- config

def test_guards_default_to_five_and_ten_and_an_agent_overrides_rule_by_rule(tmp_path):
    plain = load(tmp_path, PROJECT_YAML)
    assert plain.guards("worker") == {"repeatedToolCall": 5, "pingPong": 10}
    assert plain.max_concurrent_activations is None
    assert "guards" not in plain.render() and "limits" not in plain.render()
    text = PROJECT_YAML.replace("    approve:\n      - {tool: shell.exec",
                                "    guards: {repeatedToolCall: false}\n    approve:\n      - {tool: shell.exec")
    text += "guards: {repeatedToolCall: 7, pingPong: 4}\nlimits: {maxConcurrentActivations: 2}\n"
    config = load(tmp_path, text)
    assert config.guards("worker") == {"repeatedToolCall": None, "pingPong": 4}
    assert config.guards("pm") == {"repeatedToolCall": 7, "pingPong": 4}
    assert config.max_concurrent_activations == 2
    assert "maxConcurrentActivations: 2" in config.render()


@pytest.mark.parametrize(("extra", "message"), [
    ("guards: {pingPong: 1}\n", "guards.pingPong: Number must be greater than or equal to 2"),
    ("guards: {repeatedToolCall: true}\n", "guards.repeatedToolCall: "),
    ("limits: {maxConcurrentActivations: 0}\n", "limits.maxConcurrentActivations: "),
])
def test_bad_guards_and_limits_are_config_errors_naming_the_path(tmp_path, extra, message):
    from suzumio_errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load(tmp_path, PROJECT_YAML + extra)


# ---------------------------------------------------------------- repeatedToolCall

def test_the_third_identical_call_trips_pauses_the_agent_and_ends_its_activation(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    assert set(start(service, who, "file.read", {"path": "a"}).json()) == {"toolCallId"}
    assert set(start(service, who, "file.read", {"path": "b"}).json()) == {"toolCallId"}  # another input
    assert set(start(service, who, "file.read", {"path": "b"}).json()) == {"toolCallId"}
    tripped = start(service, who, "file.read", {"path": "b"})
    assert tripped.status_code == 200, tripped.text
    answer = tripped.json()
    assert answer["end"] is True
    assert answer["output"].startswith("Loop guard repeatedToolCall tripped: file.read was called 3 times")
    assert (answer["guard"]["rule"], answer["guard"]["limit"]) == ("repeatedToolCall", 3)
    assert store.activation(activation)["status"] == "cancelled"
    assert store.tool_call(answer["toolCallId"])["status"] == "failed"
    agent = service.get("/api/projects/demo/agents").json()
    assert [a["paused"]["rule"] for a in agent if a["id"] == "worker"] == ["repeatedToolCall"]
    assert [a.get("paused") for a in agent if a["id"] == "pm"] == [None]
    # the cancelled activation gets nothing more
    refused = start(service, who, "file.read", {"path": "c"})
    assert refused.status_code == 409
    # a paused agent starts nothing: its message waits
    service.post("/api/projects/demo/messages", {"recipient": "worker", "body": "more"})
    assert [a["status"] for a in store.list_activations(10) if a["agentId"] == "worker"] == ["cancelled"]
    assert store.has_pending_signals_for_agent("worker")


def test_two_calls_in_turn_trip_when_each_reaches_the_limit(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    refused, meant = {"path": "/artifacts/worker:a.md", "content": "x"}, {"path": "/artifacts/worker/a.md",
                                                                           "content": "x"}
    for tool_input in (refused, meant, refused, meant, refused):  # each of the two below the limit of 3
        assert set(start(service, who, "file.write", tool_input).json()) == {"toolCallId"}
    answer = start(service, who, "file.write", meant).json()
    assert answer["end"] is True and answer["output"].startswith(
        "Loop guard repeatedToolCall tripped: file.write and file.write were called 3 times each, in turn, "
        "with the same inputs.")
    assert store.activation(activation)["status"] == "cancelled"
    # three calls in turn are not this loop, nor is a pair broken by another call
    second = running_activation(store, "pm")["id"]
    who = identity(service, store, "pm", second)
    for path in ("a", "b", "c", "a", "b", "c", "a", "b", "x", "a", "b", "a", "b"):
        assert set(start(service, who, "file.read", {"path": path}).json()) == {"toolCallId"}, path


def test_resume_lets_the_agent_start_with_what_waited_and_counts_afresh(held):
    service, store = held
    activation = running_activation(store, "worker")["id"]
    who = identity(service, store, "worker", activation)
    for _ in range(3):
        start(service, who, "file.read", {"path": "x"})
    service.post("/api/projects/demo/messages", {"recipient": "worker", "body": "after the pause"})
    unknown = service.post("/api/projects/demo/agents/nobody/resume", {})
    assert (unknown.status_code, unknown.json()) == (404, {"error": "Unknown agent: nobody"})
    bad = service.post("/api/projects/demo/agents/worker/resume", [1])
    assert (bad.status_code, bad.json()) == (400, {"error": "Expected a JSON object"})
    resumed = service.post("/api/projects/demo/agents/worker/resume", headers={"Suzumio-Client": "webui"})
    assert resumed.status_code == 200, resumed.text
    assert "paused" not in resumed.json()
    again = service.post("/api/projects/demo/agents/worker/resume", {})
    assert (again.status_code, again.json()) == (409, {"error": "Agent worker is not paused"})
    [event] = [e for e in store.list_events(1000) if e["type"] == "agent.resumed"]
    assert json.loads(event["data_json"]) == {"agentId": "worker", "rule": "repeatedToolCall", "resumedBy": "webui"}
    # the route's tick started the waiting message
    [second] = [a for a in store.list_activations(10) if a["agentId"] == "worker" and a["status"] == "running"]
    assert "after the pause" in store.activation(second["id"])["prompt"]
    # its runner waits on its gated call, so the activation stays running and its calls stay the test's
    wait_until(lambda: [a for a in service.get("/api/projects/demo/approvals").json()
                        if a["status"] == "pending" and a["activationId"] == second["id"]],
               30, message="the resumed worker's runner waiting on its gated call")
    fresh = identity(service, store, "worker", second["id"])
    for _ in range(2):  # the calls before the resume no longer count
        assert set(start(service, fresh, "file.read", {"path": "x"}).json()) == {"toolCallId"}
    assert start(service, fresh, "file.read", {"path": "x"}).json()["end"] is True


def call_through(service, who, tool, tool_input):
    """A tool call as a runner makes it: start (where the guards look), run on the controller, finish."""
    started = start(service, who, tool, tool_input).json()
    if started.get("end"):
        return started
    ran = service.post("/toolpacks/core/support", {**who, "tool": tool, "input": tool_input})
    assert ran.status_code == 200, ran.text
    finished = service.post("/runner/tool-calls/finish", {**who, "toolCallId": started["toolCallId"],
                                                          "status": "completed", "output": ran.json()["output"]})
    assert finished.status_code == 200, finished.text
    return started


def test_the_same_reply_to_each_of_five_messages_is_not_a_loop(served):
    service, store = served
    config = service.toolpacks.configs.get(store)
    reply = {"recipient": "user", "body": "Done, see artifacts/worker/answer.md."}
    for number in range(5):  # three identical calls in a row would trip here: each message starts the count
        coordination.send_message(store, config, "user", f"Question {number}?", recipient="worker")
        activation = coordination.start_activation(store, "worker", "p",
                                                   coordination.pending_signals(store, config, "worker"))
        assert "end" not in call_through(service, identity(service, store, "worker", activation["id"]),
                                         "messages.send", reply)
        coordination.complete_activation(store, config, activation["id"], "worker", "Answered.")
    assert store.agent("worker").get("paused") is None
    assert [m["body"] for m in store.list_messages(20) if m["sender"] == "worker"] == [reply["body"]] * 5
    assert events_of(store, "guard.tripped") == []


def test_identical_calls_across_activations_woken_only_by_nudges_still_trip(served):
    service, store = served
    config = service.toolpacks.configs.get(store)
    coordination.send_message(store, config, "user", "Read the notes.", recipient="worker")
    signals = coordination.pending_signals(store, config, "worker")
    for _ in range(2):  # each reads and reports nothing, so the no-effect nudge wakes it again
        activation = coordination.start_activation(store, "worker", "p", signals)
        who = identity(service, store, "worker", activation["id"])
        assert "end" not in start(service, who, "file.read", {"path": "notes.md"}).json()
        coordination.complete_activation(store, config, activation["id"], "worker", "Nothing to say.")
        signals = [store.latest_signal("scheduler.no_effect_nudge", "worker")]  # delayed: started by hand
    activation = coordination.start_activation(store, "worker", "p", signals)
    tripped = start(service, identity(service, store, "worker", activation["id"]), "file.read", {"path": "notes.md"})
    assert tripped.json()["end"] is True
    assert tripped.json()["output"].startswith("Loop guard repeatedToolCall tripped: file.read was called 3 times")
    assert store.agent("worker")["paused"]["rule"] == "repeatedToolCall"


def events_of(store, event_type):
    return [json.loads(e["data_json"]) for e in store.list_events(1000) if e["type"] == event_type]


def test_waiting_again_never_trips_the_repeated_call_guard(served):
    service, store = served
    who = identity(service, store, "worker", running_activation(store, "worker")["id"])
    for _ in range(4):
        assert "end" not in start(service, who, "coordination.wait_for_signal", {}).json()


# ---------------------------------------------------------------- pingPong

def test_a_pair_trips_ping_pong_unless_an_artifact_changed(served):
    service, store = served
    config = service.toolpacks.configs.get(store)
    for sender, recipient in (("pm", "worker"), ("worker", "pm")):
        coordination.send_message(store, config, sender, "bounce", recipient=recipient)
    # an artifact written after those messages starts the count afresh
    # (file system times are coarser than the clock: both times are set, to a minute away)
    path = store.artifacts_dir("worker") / "notes.md"
    path.write_text("progress", encoding="utf-8")

    def modified(when):
        for changed in (path, path.parent):  # the folder's mtime moved when the file was added
            os.utime(changed, (when, when))

    modified(time.time() + 60)
    who = identity(service, store, "worker", running_activation(store, "worker")["id"])
    send = {"recipient": "pm", "body": "bounce"}
    assert "end" not in start(service, who, "messages.send", send).json()
    modified(time.time() - 60)  # the change is older than the messages again
    tripped = start(service, who, "messages.send", send).json()
    assert tripped["end"] is True
    assert (tripped["guard"]["rule"], tripped["guard"]["peer"], tripped["guard"]["limit"]) == ("pingPong", "pm", 3)
    assert "worker and pm exchanged 3 messages without any artifact change" in tripped["output"]
    # the sender's own setting applies: pm has the default of 10 and is not paused
    assert store.agent("pm").get("paused") is None


def test_messages_to_the_user_or_a_channel_never_count(served):
    service, store = served
    config = service.toolpacks.configs.get(store)
    for _ in range(4):
        coordination.send_message(store, config, "worker", "status", recipient="user")
    who = identity(service, store, "worker", running_activation(store, "worker")["id"])
    assert "end" not in start(service, who, "messages.send", {"recipient": "user", "body": "status"}).json()


# ---------------------------------------------------------------- caps

def test_the_concurrency_route_shows_the_cap_and_who_waits(tmp_path):
    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config",
                             PROJECT_YAML + "limits: {maxConcurrentActivations: 1}\n")
        store.start()
        running_activation(store, "pm")
        service.post("/api/projects/demo/messages", {"recipient": "worker", "body": "when you can"})
        shown = service.get("/api/projects/demo/concurrency").json()
        assert shown["maxConcurrentActivations"] == 1 and shown["running"] == 1
        assert [(w["agentId"], w["cap"], w["signals"]) for w in shown["waiting"]] == [("worker", "project", 1)]
        assert "rootMaxActivations" not in shown and shown["paused"] == []
        assert [a["agentId"] for a in store.list_activations(10)] == ["pm"]


def test_a_root_cap_must_be_at_least_one():
    from suzumio_errors import BadRequest

    with pytest.raises(BadRequest):
        suzumio_guards.Caps(None, 0)


# ---------------------------------------------------------------- CLI and MCP

def test_cli_allows_with_an_edited_input_responds_and_resumes(served, tmp_path):
    service, store = served
    root = str(tmp_path / "root")
    who, first = start_gated(service, store)
    _who, second = start_gated(service, store, "rm -rf build", activation=who["activationId"])
    _who, third = start_gated(service, store, "git push --force", activation=who["activationId"])
    code, _out, err = run_cli("allow", "demo", first["approval"]["id"], "--input", '{"command": 5}', "--root", root)
    assert (code, err) == (1, "Error: input does not fit the input schema of shell.exec at command: "
                              "5 is not of type 'string'\n")
    code, _out, err = run_cli("allow", "demo", first["approval"]["id"], "--input", "{nope", "--root", root)
    assert code == 1 and err.startswith("Error: Invalid --input: not JSON")
    code, _out, err = run_cli("allow", "demo", first["approval"]["id"], "--input", "{}", "--always", "--root", root)
    assert code == 1 and "--input cannot be combined with --always" in err
    code, out, _ = run_cli("allow", "demo", first["approval"]["id"], "--input",
                           '{"command": "git push origin staging"}', "--root", root, "--json")
    assert code == 0, out
    row = json.loads(out)
    assert (row["input"], row["editedInput"], row["decidedBy"]) == (
        {"command": "git push origin main"}, {"command": "git push origin staging"}, "cli")
    waited = service.post("/runner/approvals/wait", {**who, "approvalId": row["id"], "waitMs": 0}).json()
    assert (waited["run"], waited["input"]) == (True, {"command": "git push origin staging"})
    assert waited["inputNote"].startswith("A person changed this call's input before it ran")
    code, out, _ = run_cli("respond", "demo", second["approval"]["id"], "Already", "clean.", "--root", root)
    assert (code, out) == (0, f"{second['approval']['id']}: responded (respond)\n")
    waited = service.post("/runner/approvals/wait", {**who, "approvalId": second["approval"]["id"]}).json()
    assert (waited["run"], waited["output"]) == (False, "Already clean.")
    assert store.tool_call(second["toolCallId"])["status"] == "completed"
    # MCP: respond, and the schema check of an edit
    result = mcp_call(service, "decide_approval", {"project": "demo", "approvalId": third["approval"]["id"],
                                                   "decision": "allow", "input": {"command": []}})
    assert result["isError"] is True
    result = mcp_call(service, "decide_approval", {"project": "demo", "approvalId": third["approval"]["id"],
                                                   "decision": "respond", "output": "Not today."})
    assert not result.get("isError")
    assert json.loads(result["content"][0]["text"])["decidedBy"] == "mcp"

    code, _out, err = run_cli("resume", "demo", "worker", "--root", root)
    assert (code, err) == (1, "Error: Agent worker is not paused\n")
    fresh = identity(service, store, "pm", running_activation(store, "pm")["id"])
    for _ in range(3):
        start(service, fresh, "file.read", {"path": "same"})
    code, out, _ = run_cli("status", "demo", "--root", root)
    assert "paused (repeatedToolCall)" in out
    result = mcp_call(service, "resume_agent", {"project": "demo", "agent": "pm"})
    assert not result.get("isError")
    assert run_cli("resume", "demo", "pm", "--root", root)[2] == "Error: Agent pm is not paused\n"


def test_serve_refuses_a_max_activations_below_one(tmp_path):
    code, _out, err = run_cli("serve", "--max-activations", "0", "--root", str(tmp_path / "root"), "--port", "0")
    assert (code, err) == (1, "Error: Invalid --max-activations: 0 (expected a whole number of at least 1)\n")
