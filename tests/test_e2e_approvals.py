"""Approval gates end to end, on both backends: the real controller, the real runner in a local
process or a container, a FakeModel. A gated shell.exec waits for a person: deny (with a note) reaches the
model as that call's result and the command never ran, allow runs it once, expiry denies, allow-always
lets the next match through without a request, P0 cancels a pending request, P1 arrives with the
decision, and the runner cannot reach a gated controller-side tool by calling support itself."""
import pytest
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, kind_params, running_team

pytestmark = pytest.mark.timeout(240)

KINDS = kind_params()
GATE = {"tool": "shell.exec", "match": {"command": "rm -rf"}}
BOUNDARY_HEADING = "# New P1 Signals Delivered At Tool Boundary"


def gated_agents(rules, project_rules=None):
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS},
              "worker-1": {"model": "worker", "tools": WORKER_TOOLS, "approve": rules}}
    extra = {}
    if project_rules is not None:
        extra = {"tools": {"toolpacks": ["core", "shell", "web"], "approve": project_rules}}
    return {"agents": agents, "extra": extra}


def approvals(team, status=None):
    query = f"?status={status}" if status else ""
    response = team.service.get(f"/api/projects/{team.name}/approvals{query}")
    assert response.status_code == 200, response.text
    return response.json()


def wait_pending(team, count=1):
    return team.wait_for(lambda: (lambda rows: rows if len(rows) >= count else None)(approvals(team, "pending")),
                         message=f"{count} pending approval(s)")


def decide(team, approval_id, decision, note=None, headers=None):
    body = {"decision": decision, **({"note": note} if note is not None else {})}
    return team.service.post(f"/api/projects/{team.name}/approvals/{approval_id}", body, headers=headers)


def marker_command(team, text="x"):
    """A command the gate matches (`rm -rf` in a comment) that appends `text` to a marker file."""
    return f"printf {text} >> {team.artifacts('worker-1')}/marker.txt  # rm -rf nothing"


def marker(team):
    path = team.store.artifacts_dir("worker-1") / "marker.txt"
    return path.read_text() if path.exists() else None


@pytest.mark.parametrize("kind", KINDS)
def test_deny_with_a_note_reaches_the_model_and_the_tool_never_runs(tmp_path, kind):
    with running_team(tmp_path, kind, **gated_agents([GATE])) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team))], model="worker-1")
        team.model.enqueue(content="Understood, I will not delete anything.", model="worker-1")
        team.send("worker-1", "Clean up.")
        [pending] = wait_pending(team)
        assert (pending["agentId"], pending["tool"], pending["status"]) == ("worker-1", "shell.exec", "pending")
        assert pending["input"] == {"command": marker_command(team)}
        assert pending["activationId"] == team.activations("worker-1")[0]["id"]
        # the agent stays running while it waits: one activation, no second one
        assert [a["status"] for a in team.activations("worker-1")] == ["running"]
        # a P1 sent while it waits arrives with the decision, at this tool boundary
        team.send("worker-1", "Also: keep the logs.", priority="P1")
        reply = decide(team, pending["id"], "deny", "Never delete the build folder.")
        assert reply.status_code == 200, reply.text
        assert (reply.json()["status"], reply.json()["decidedBy"]) == ("denied", "api")
        again = decide(team, pending["id"], "allow")
        assert again.status_code == 409
        assert again.json() == {"error": f"Approval {pending['id']} is already denied"}

        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker(team) is None  # the command never ran
        [result] = team.tool_messages("worker-1")
        assert "denied by a person (via api)" in result
        assert "Reason: Never delete the build folder." in result
        assert BOUNDARY_HEADING in result and "Also: keep the logs." in result
        [row] = team.store.list_tool_calls(10)
        assert (row["tool"], row["status"]) == ("shell.exec", "failed")
        assert "Never delete the build folder." in row["error"]
        [decided] = approvals(team)
        assert (decided["status"], decided["decision"], decided["note"]) == (
            "denied", "deny", "Never delete the build folder.")
        assert decided["decidedAt"] and decided["usedAt"]
        assert [e["data"]["id"] for e in team.events("approval.requested")] == [pending["id"]]
        assert [(e["data"]["decision"], e["data"]["decidedBy"]) for e in team.events("approval.decided")] == [
            ("deny", "api")]


@pytest.mark.parametrize("kind", KINDS)
def test_allow_runs_the_tool_once_and_ungated_calls_never_wait(tmp_path, kind):
    with running_team(tmp_path, kind, **gated_agents([GATE])) as team:
        safe = f"printf safe > {team.artifacts('worker-1')}/safe.txt"
        team.model.enqueue(tool_calls=[call("shell.exec", command=safe)], model="worker-1")
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team))], model="worker-1")
        team.model.enqueue(content="Done.", model="worker-1")
        team.send("worker-1", "Work.")
        [pending] = wait_pending(team)
        assert (team.store.artifacts_dir("worker-1") / "safe.txt").read_text() == "safe"  # no request for it
        assert marker(team) is None  # not before the decision
        reply = decide(team, pending["id"], "allow", headers={"Suzumio-Client": "webui"})
        assert reply.status_code == 200, reply.text
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker(team) == "x"
        assert [(r["tool"], r["status"]) for r in reversed(team.store.list_tool_calls(10))] == [
            ("shell.exec", "completed"), ("shell.exec", "completed")]
        [decided] = approvals(team)
        assert (decided["status"], decided["decidedBy"]) == ("allowed", "webui")


@pytest.mark.parametrize("kind", KINDS)
def test_an_unanswered_request_expires_and_denies(tmp_path, kind):
    with running_team(tmp_path, kind, **gated_agents([{**GATE, "timeoutMs": 1500}])) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team))], model="worker-1")
        team.model.enqueue(content="It expired.", model="worker-1")
        team.send("worker-1", "Clean up.")
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker(team) is None
        [row] = approvals(team)
        assert (row["status"], row["decision"], row["decidedBy"]) == ("expired", "deny", "timeout")
        [result] = team.tool_messages("worker-1")
        assert "expired" in result and "did not run" in result
        assert [e["data"]["id"] for e in team.events("approval.expired")] == [row["id"]]
        assert decide(team, row["id"], "allow").status_code == 409


@pytest.mark.parametrize("kind", KINDS)
def test_allow_always_lets_the_next_match_through_without_a_request(tmp_path, kind):
    # the project's default rules apply to every agent; the agent's own list is empty
    with running_team(tmp_path, kind, **gated_agents([], project_rules=[GATE])) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team, "a"))], model="worker-1")
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team, "b"))], model="worker-1")
        team.model.enqueue(content="Done.", model="worker-1")
        team.send("worker-1", "Work.")
        [pending] = wait_pending(team)
        assert pending["rule"]["source"] == "project"
        assert decide(team, pending["id"], "allow-always").status_code == 200
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker(team) == "ab"
        assert len(approvals(team)) == 1  # the second call made no request
        [auto] = team.events("approval.auto_allowed")
        assert auto["data"]["grantId"] == pending["id"]


@pytest.mark.parametrize("kind", KINDS)
def test_p0_during_a_pending_request_cancels_it(tmp_path, kind):
    with running_team(tmp_path, kind, **gated_agents([GATE])) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command=marker_command(team))], model="worker-1")
        team.model.enqueue(content="Stopped as asked.", model="worker-1")
        team.send("worker-1", "Clean up.")
        [pending] = wait_pending(team)
        team.send("worker-1", "Stop, do not delete anything.", priority="P0")
        first, second = team.wait_activations("worker-1", 2)
        assert (first["status"], second["status"]) == ("cancelled", "completed")
        assert "Stop, do not delete anything." in second["prompt"]
        row = next(r for r in approvals(team) if r["id"] == pending["id"])
        assert (row["status"], row["decidedBy"]) == ("cancelled", "system")
        assert marker(team) is None
        assert [e["data"]["id"] for e in team.events("approval.cancelled")] == [pending["id"]]
        late = decide(team, pending["id"], "allow")
        assert (late.status_code, late.json()) == (409, {"error": f"Approval {pending['id']} is already cancelled"})


def test_the_runner_cannot_run_a_gated_controller_tool_through_support(tmp_path):
    """The activation is hostile: with its own token it calls support for a gated core tool directly,
    and it has no route to decide its own request."""
    rules = [{"tool": "messages.send", "match": {"recipient": "^pm$"}}]
    with running_team(tmp_path, "local", **gated_agents(rules)) as team:
        team.model.enqueue(tool_calls=[call("messages.send", recipient="pm", body="hello")], model="worker-1")
        team.model.enqueue(content="Sent.", model="worker-1")
        team.send("worker-1", "Say hello.")
        [pending] = wait_pending(team)
        identity = {"project": team.name, "agentId": "worker-1", "activationId": pending["activationId"],
                    "token": team.service.token(team.name, "worker-1")}
        direct = team.service.post("/toolpacks/core/support",
                                   {**identity, "tool": "messages.send", "input": {"recipient": "pm", "body": "x"}})
        assert (direct.status_code, direct.json()) == (
            409, {"error": "Tool call messages.send needs an approval that was not given"})
        # deciding is a user route: the runner listener has none
        own = team.service.call("POST", f"/api/projects/{team.name}/approvals/{pending['id']}",
                                json={**identity, "decision": "allow"}, listener="runner")
        assert own.status_code == 404
        assert approvals(team, "pending")[0]["id"] == pending["id"]
        assert [m["body"] for m in team.store.list_messages(50) if m["sender"] == "worker-1"] == []
        assert decide(team, pending["id"], "allow").status_code == 200
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert [m["body"] for m in team.store.list_messages(50) if m["sender"] == "worker-1"] == ["hello"]
        [row] = approvals(team)
        assert row["usedAt"]
        assert row["input"] == {"recipient": "pm", "body": "hello"}
