"""A person steers and a runaway stops itself, end to end on both backends: the real controller, the real
runner in a local process or a container, a FakeModel. An allowed call runs with the input a person
edited (the original never runs), an answered call runs nothing and the model reads the answer, a model
repeating one call is stopped at the guard's count and paused while the rest of the team works, a pair
bouncing messages is stopped, and three agents under a cap of one never overlap."""
import itertools

import pytest
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, kind_params, running_team
from test_e2e_approvals import approvals, decide, marker, marker_command, wait_pending

pytestmark = pytest.mark.timeout(300)

KINDS = kind_params()
GATE = {"tool": "shell.exec", "match": {"command": "rm -rf"}}


def gated_team(rules=(GATE,)):
    return {"agents": {"pm": {"model": "pm", "tools": PM_TOOLS},
                       "worker-1": {"model": "worker", "tools": WORKER_TOOLS, "approve": list(rules)}}}


def paused(team, agent_id):
    return team.store.agent(agent_id).get("paused")


@pytest.mark.parametrize("kind", KINDS)
def test_an_edited_input_runs_instead_of_the_original_and_the_model_is_told(tmp_path, kind):
    with running_team(tmp_path, kind, **gated_team()) as team:
        original = marker_command(team, "prod")
        team.model.enqueue(tool_calls=[call("shell.exec", command=original)], model="worker-1")
        team.model.enqueue(content="Ran it on staging.", model="worker-1")
        team.send("worker-1", "Deploy.")
        [pending] = wait_pending(team)
        # the edit is checked against the tool's input schema before anything is decided
        bad = team.service.post(f"/api/projects/{team.name}/approvals/{pending['id']}",
                                {"decision": "allow", "input": {"command": 5}})
        assert bad.status_code == 400
        assert bad.json()["error"].startswith("input does not fit the input schema of shell.exec at command:")
        wrong = team.service.post(f"/api/projects/{team.name}/approvals/{pending['id']}",
                                  {"decision": "deny", "input": {"command": "true"}})
        assert (wrong.status_code, wrong.json()) == (400, {"error": "input is accepted only with decision allow"})
        edited = marker_command(team, "staging")
        reply = team.service.post(f"/api/projects/{team.name}/approvals/{pending['id']}",
                                  {"decision": "allow", "input": {"command": edited}, "note": "staging, not prod"})
        assert reply.status_code == 200, reply.text
        assert (reply.json()["status"], reply.json()["editedInput"]) == ("allowed", {"command": edited})

        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker(team) == "staging"  # the edited command ran, the original never did
        [result] = team.tool_messages("worker-1")
        assert "A person changed this call's input before it ran" in result and "staging" in result
        [row] = approvals(team)
        assert (row["input"], row["editedInput"], row["note"]) == (
            {"command": original}, {"command": edited}, "staging, not prod")
        [audit] = team.store.list_tool_calls(10)
        assert (audit["tool"], audit["status"]) == ("shell.exec", "completed")
        assert [e["data"].get("edited") for e in team.events("approval.decided")] == [True]


@pytest.mark.parametrize("kind", KINDS)
def test_an_answered_call_runs_nothing_and_the_model_reads_the_answer(tmp_path, kind):
    with running_team(tmp_path, kind, **gated_team()) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team))], model="worker-1")
        team.model.enqueue(content="Noted.", model="worker-1")
        team.send("worker-1", "Clean up.")
        [pending] = wait_pending(team)
        missing = decide(team, pending["id"], "respond")
        assert missing.status_code == 400
        assert missing.json()["error"].startswith("output is required with decision respond")
        answer = "The build folder was cleaned by hand; 3 files removed."
        reply = team.service.post(f"/api/projects/{team.name}/approvals/{pending['id']}",
                                  {"decision": "respond", "output": answer})
        assert reply.status_code == 200, reply.text
        assert (reply.json()["status"], reply.json()["decision"]) == ("responded", "respond")
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker(team) is None  # nothing ran
        assert team.tool_messages("worker-1") == [answer]
        [audit] = team.store.list_tool_calls(10)
        assert (audit["status"], audit["output"]) == ("completed", answer)
        [row] = approvals(team)
        assert (row["status"], row["output"]) == ("responded", answer)


@pytest.mark.parametrize("kind", KINDS)
def test_a_looping_model_is_stopped_at_the_fifth_call_and_paused_while_the_team_works(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        loop = f"printf x >> {team.artifacts('worker-1')}/loop.txt"
        for _ in range(5):
            team.model.enqueue(tool_calls=[call("shell.exec", command=loop)], model="worker-1")
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body="pm is here")], model="pm")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="pm")
        team.send("worker-1", "Append an x.")
        team.send("pm", "Say hello.")
        [looped] = team.wait_activations("worker-1", 1)
        assert looped["status"] == "cancelled"
        assert looped["error"].startswith("Loop guard repeatedToolCall tripped")
        calls = [r for r in reversed(team.store.list_tool_calls(100)) if r["agent_id"] == "worker-1"]
        assert [r["status"] for r in calls] == ["completed"] * 4 + ["failed"]
        assert (team.store.artifacts_dir("worker-1") / "loop.txt").read_text() == "xxxx"  # the fifth never ran
        [tripped] = team.events("guard.tripped")
        assert {k: tripped["data"][k] for k in ("rule", "agentId", "activationId", "limit", "tool")} == {
            "rule": "repeatedToolCall", "agentId": "worker-1", "activationId": looped["id"], "limit": 5,
            "tool": "shell.exec"}
        assert paused(team, "worker-1")["rule"] == "repeatedToolCall"
        assert len(team.model_requests("worker-1")) == 5  # no model call after the refused one

        # the rest of the team keeps working: pm's activation completes, and so does a later one
        [pm_first] = team.wait_activations("pm", 1)
        assert pm_first["status"] == "completed"
        # the whole team waits now (worker-1 paused): pm's first wait is answered with the hint to submit
        for _ in range(2):
            team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="pm")
        team.send("pm", "Anything else?")
        assert [a["status"] for a in team.wait_activations("pm", 2)] == ["completed", "completed"]

        # a paused agent's signals wait: the route's tick started nothing for it
        team.send("worker-1", "Are you there?")
        assert len(team.activations("worker-1")) == 1
        assert team.store.has_pending_signals_for_agent("worker-1")
        listed = team.service.get(f"/api/projects/{team.name}/concurrency").json()
        assert [p["agentId"] for p in listed["paused"]] == ["worker-1"]

        not_paused = team.service.post(f"/api/projects/{team.name}/agents/pm/resume", {})
        assert (not_paused.status_code, not_paused.json()) == (409, {"error": "Agent pm is not paused"})
        team.model.enqueue(tool_calls=[call("shell.exec", command=loop)], model="worker-1")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="worker-1")
        resumed = team.service.post(f"/api/projects/{team.name}/agents/worker-1/resume", {})
        assert resumed.status_code == 200, resumed.text
        assert "paused" not in resumed.json()
        _first, second = team.wait_activations("worker-1", 2)
        assert second["status"] == "completed"
        assert "Are you there?" in second["prompt"]
        # after the resume the guard counts afresh: the same call ran again
        assert (team.store.artifacts_dir("worker-1") / "loop.txt").read_text() == "xxxxx"
        assert [e["data"]["agentId"] for e in team.events("agent.resumed")] == ["worker-1"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_pair_bouncing_messages_without_artifact_changes_is_stopped(tmp_path, kind):
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}, "worker-1": {"model": "worker", "tools": WORKER_TOOLS}}
    with running_team(tmp_path, kind, agents=agents, extra={"guards": {"pingPong": 4}}) as team:
        for _ in range(2):
            team.model.enqueue(tool_calls=[call("messages.send", recipient="worker-1", body="ping")], model="pm")
            team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="pm")
        # a worker's wait tells pm by default, and that message would count for the pair too
        team.model.enqueue(tool_calls=[call("messages.send", recipient="pm", body="pong")], model="worker-1")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal", notifyPm=False)], model="worker-1")
        team.model.enqueue(tool_calls=[call("messages.send", recipient="pm", body="pong")], model="worker-1")
        team.send("pm", "Start the rally.")
        [tripped] = team.wait_for(lambda: team.events("guard.tripped"), message="guard.tripped")
        assert {k: tripped["data"][k] for k in ("rule", "agentId", "peer", "limit")} == {
            "rule": "pingPong", "agentId": "worker-1", "peer": "pm", "limit": 4}
        first, second = team.wait_activations("worker-1", 2)
        assert (first["status"], second["status"]) == ("completed", "cancelled")
        team.wait_quiet()
        bounced = [m["body"] for m in reversed(team.store.list_messages(50)) if m["sender"] != "user"]
        assert bounced == ["ping", "pong", "ping"]  # the fourth was refused
        assert paused(team, "worker-1")["rule"] == "pingPong"
        assert paused(team, "pm") is None
        assert team.model.pending() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_message_to_oneself_is_refused_audited_and_wakes_nobody(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        team.model.enqueue(tool_calls=[call("messages.send", recipient="pm", body="Remember to plan.")], model="pm")
        team.model.enqueue(tool_calls=[call("messages.send", channel="#project", body="Plan: split the work.")],
                           model="pm")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="pm")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal", notifyPm=False)], model="worker-1")
        team.send("pm", "Plan the work.")
        [first] = team.wait_activations("pm", 1)
        assert first["status"] == "completed"
        team.wait_activations("worker-1", 1)  # the channel post woke the worker
        team.wait_quiet()
        hint = ("You are pm: a message to yourself is not delivered. Do the work now with your tools, or end with "
                "coordination_wait_for_signal or completion_submit.")
        calls = [(r["tool"], r["status"], r.get("error")) for r in reversed(team.store.list_tool_calls(100))
                 if r["agent_id"] == "pm"]
        assert calls == [("messages.send", "failed", hint), ("messages.send", "completed", None),
                         ("coordination.wait_for_signal", "completed", None)]
        assert team.tool_messages("pm")[0] == hint  # the model read what to do instead
        # neither the refused message nor pm's own channel post woke pm
        assert len(team.activations("pm")) == 1
        assert not team.store.has_pending_signals_for_agent("pm", include_delayed=True)
        assert [m["body"] for m in team.store.list_messages(50) if m["sender"] == "pm"] == ["Plan: split the work."]
        assert team.model.pending() == 0


def no_overlap(activations):
    """Each activation started at or after the previous one ended (recorded times, ISO-8601 UTC)."""
    ordered = sorted(activations, key=lambda a: a["startedAt"])
    return all(later["startedAt"] >= earlier["completedAt"] for earlier, later in itertools.pairwise(ordered))


def three_agents(rules):
    return {name: {"model": name, "tools": WORKER_TOOLS, **({"approve": rules} if name == "a" else {})}
            for name in ("a", "b", "c")}


PRESETS = {name: {"provider": "fake", "model": name} for name in ("a", "b", "c")}


def hold_a_while_b_and_c_wait(team):
    """a waits on a person while it runs, so b and c, sent work then, are sure to find a cap of one full.
    Returns a's pending approval."""
    team.model.enqueue(tool_calls=[call("shell.exec", command="true  # rm -rf nothing")], model="a")
    team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="a")
    for name in ("b", "c"):
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model=name)
    team.send("a", "Work.")
    [pending] = wait_pending(team)
    team.send("b", "Work.")
    team.send("c", "Work.")
    assert [a["agentId"] for a in team.activations()] == ["a"]
    return pending


def release_a_and_check_none_overlapped(team, pending):
    assert decide(team, pending["id"], "allow").status_code == 200
    for name in ("a", "b", "c"):
        [done] = team.wait_activations(name, 1)
        assert done["status"] == "completed"
    assert no_overlap(team.activations())


@pytest.mark.parametrize("kind", KINDS)
def test_three_agents_never_overlap_under_a_project_cap_of_one(tmp_path, kind):
    with running_team(tmp_path, kind, agents=three_agents([GATE]), presets=PRESETS, model="a",
                      extra={"limits": {"maxConcurrentActivations": 1}}) as team:
        pending = hold_a_while_b_and_c_wait(team)
        shown = team.service.get(f"/api/projects/{team.name}/concurrency").json()
        assert (shown["maxConcurrentActivations"], shown["running"]) == (1, 1)
        assert [(w["agentId"], w["cap"], w["signals"]) for w in shown["waiting"]] == [
            ("b", "project", 1), ("c", "project", 1)]
        release_a_and_check_none_overlapped(team, pending)
        assert not team.store.has_pending_signals_for_agent("b")  # nothing was dropped
        assert not team.store.has_pending_signals_for_agent("c")
        assert team.service.get(f"/api/projects/{team.name}/concurrency").json()["waiting"] == []


def test_the_root_cap_holds_three_agents_to_one_at_a_time(tmp_path):
    with running_team(tmp_path, "local", agents=three_agents([GATE]), presets=PRESETS, model="a",
                      max_activations=1) as team:
        pending = hold_a_while_b_and_c_wait(team)
        shown = team.service.get(f"/api/projects/{team.name}/concurrency").json()
        assert (shown["rootMaxActivations"], shown["rootRunning"]) == (1, 1)
        assert [(w["agentId"], w["cap"]) for w in shown["waiting"]] == [("b", "root"), ("c", "root")]
        release_a_and_check_none_overlapped(team, pending)
        shown = team.service.get(f"/api/projects/{team.name}/concurrency").json()
        assert (shown["rootMaxActivations"], shown["rootRunning"], shown["waiting"]) == (1, 0, [])
