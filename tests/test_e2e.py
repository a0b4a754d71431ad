"""End to end through the real controller, the real runner and a real model server (the FakeModel),
on both backends (`local` and `docker-chat`): the delegation loop from "Start." to a submitted report,
model fallback and context-overflow compaction, runner-route authorization, path confinement and
shell timeouts (docs/design/runner.md, docs/design/tools.md, docs/design/scheduler.md)."""
import json
import os

import pytest
from e2e_fixtures import API_KEY, PM_TOOLS, call, kind_params, process_alive, running_team

from suzumio_records import parse_ts, render_signal

pytestmark = pytest.mark.timeout(240)

KINDS = kind_params()


def tool_rows(team):
    return list(reversed(team.store.list_tool_calls(1000)))


def prompts_naming(team, signal):
    return [a["id"] for a in team.activations() if render_signal(signal) in a["prompt"]]


# ---------------------------------------------------------------- the whole loop

@pytest.mark.parametrize("kind", KINDS)
def test_start_message_runs_delegation_to_a_submitted_report(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        result = f"{team.artifacts('worker-1')}/result.txt"
        model = team.model
        model.enqueue(tool_calls=[call("messages.send", recipient="worker-1",
                                       body=f"Write the answer to {result} and tell me.")], model="pm")
        model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Waiting for worker-1.")],
                      model="pm")
        model.enqueue(tool_calls=[call("shell.exec", command=f"printf '42\\n' > {result}")], model="worker-1")
        model.enqueue(tool_calls=[call("messages.send", recipient="pm", body=f"The answer is in {result}.")],
                      model="worker-1")
        model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Reported.", notifyPm=False)],
                      model="worker-1")
        model.enqueue(tool_calls=[call("file.read", path=result)], model="pm")
        model.enqueue(tool_calls=[call("completion.submit", report="# Final report\n\nThe answer is 42.\n")],
                      model="pm")

        start = team.send("pm", "Start.")
        team.wait_for(lambda: team.store.project()["status"] == "submitted", 120, "project submitted")
        team.wait_quiet()

        assert [a["status"] for a in team.activations("pm")] == ["completed", "completed"]
        assert [a["status"] for a in team.activations("worker-1")] == ["completed"]
        assert team.store.report_path.read_text(encoding="utf-8") == "# Final report\n\nThe answer is 42.\n"
        assert (team.store.artifacts_dir("worker-1") / "result.txt").read_text() == "42\n"
        assert team.model.pending() == 0
        # pm read the artifact through file.read in its second activation
        assert team.tool_messages("pm")[-1] == "1: 42\n2: "
        # the key reached the model server, and the runner addressed the agents' own presets
        assert all(r.headers["authorization"] == f"Bearer {API_KEY}" for r in team.model.requests)
        assert {r.body["model"] for r in team.model.requests} == {"pm", "worker-1"}

        # every tool call is audited: a completed row with its tool.called and tool.completed events
        rows = tool_rows(team)
        assert [(r["agent_id"], r["tool"]) for r in rows] == [
            ("pm", "messages.send"), ("pm", "coordination.wait_for_signal"), ("worker-1", "shell.exec"),
            ("worker-1", "messages.send"), ("worker-1", "coordination.wait_for_signal"), ("pm", "file.read"),
            ("pm", "completion.submit")]
        assert {r["status"] for r in rows} == {"completed"}
        assert rows[-1]["output"].startswith("Submitted for user approval; report at ")
        called = [e["data"]["id"] for e in team.events("tool.called")]
        completed = [e["data"]["id"] for e in team.events("tool.completed")]
        assert called == completed == [r["id"] for r in rows]
        assert team.events("tool.failed") == []

        # every signal delivered exactly once, into exactly one activation prompt
        signals = team.store.list_signals(limit=1000)
        targeted = [s for s in signals if s.get("targetAgent")]
        assert targeted and all(s["status"] == "delivered" for s in targeted)
        activation_ids = {a["id"] for a in team.activations()}
        for signal in targeted:
            assert signal["deliveredActivationId"] in activation_ids
            assert prompts_naming(team, signal) == [signal["deliveredActivationId"]]
        [start_signal] = [s for s in targeted if s["payload"].get("id") == start["id"]]
        assert start_signal["deliveredActivationId"] == team.activations("pm")[0]["id"]


# ---------------------------------------------------------------- models

@pytest.mark.parametrize("kind", KINDS)
def test_model_http_500_falls_back_to_the_next_model_list_preset(tmp_path, kind):
    presets = {"chain": {"model-list": ["primary", "backup"]},
               "primary": {"provider": "fake", "model": "primary", "maxRetries": 0},  # No retries
               "backup": {"provider": "fake", "model": "backup"}}
    agents = {"pm": {"model": "chain", "tools": PM_TOOLS}}
    with running_team(tmp_path, kind, agents=agents, presets=presets, model="chain") as team:
        team.model.enqueue_error(500, "primary is down", model="primary")
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body="Done on backup.")],
                           model="backup")
        team.model.enqueue(content="Reported to the user.", model="backup")
        team.send("pm", "Start.")
        [activation] = team.wait_activations("pm", 1)

        assert activation["status"] == "completed", activation.get("error")
        assert activation["text"] == "Reported to the user."
        assert [r.body["model"] for r in team.model.requests] == ["primary", "backup", "backup"]
        usage = activation["usage"]
        assert (usage["selectedModel"], usage["model"], usage["apiModel"]) == ("chain", "backup", "backup")
        [user_message] = [m for m in team.store.list_messages() if m["recipient"] == "user"]
        assert user_message["body"] == "Done on backup."
        assert "Model attempt primary failed: Provider fake returned HTTP 500: primary is down" in \
            team.runner_log(activation["id"])


@pytest.mark.parametrize("kind", KINDS)
def test_context_overflow_compacts_history_and_retries(tmp_path, kind):
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}}
    with running_team(tmp_path, kind, agents=agents) as team:
        # Two rows of about 40,000 model-visible characters each push the oldest rows out of the retry tail.
        long_body = "Notes: " + "y" * 45000
        long_answer = "Summary of notes: " + "x" * 45000
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body=long_body)], model="pm")
        team.model.enqueue(content=long_answer, model="pm")
        team.send("pm", "Take notes.")
        [first] = team.wait_activations("pm", 1)

        team.model.enqueue_context_overflow(model="pm")
        team.model.enqueue(content="## Summary\nThe first activation sent long notes.", model="pm")
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body="Still on it.")], model="pm")
        team.model.enqueue(content="Continued after compaction.", model="pm")
        team.send("pm", "Continue.")
        _, second = team.wait_activations("pm", 2)

        assert second["status"] == "completed", second.get("error")
        assert second["text"] == "Continued after compaction."
        assert "context overflow from pm; compacting agent history" in team.runner_log(second["id"])
        history = team.service.get(f"/api/projects/{team.name}/agents/pm/history?limit=100").json()
        [marker] = [m for m in history["messages"] if m["kind"] == "history_compaction"]
        assert marker["content"] == "## Summary\nThe first activation sent long notes."
        assert marker["activationId"] == second["id"]
        assert marker["metadata"]["reason"] == "provider_context_overflow"
        assert marker["metadata"]["selectedModel"] == "pm"
        compaction_id = marker["metadata"]["compactionId"]
        archive = team.service.get(f"/api/projects/{team.name}/agents/pm/history-archive/{compaction_id}").json()
        archived = archive["archive"]["messages"]
        assert [(m["kind"], m["activationId"]) for m in archived] == [
            ("activation_prompt", first["id"]), ("tool_call", first["id"])]
        assert long_body in archived[1]["content"]
        assert archive["compaction"]["archivedMessageCount"] == 2
        active = team.store.active_history("pm")
        assert all(m["id"] not in {a["id"] for a in archived} for m in active)
        # requests of the second activation: overflow, summary (no tools), retry, final step
        overflowed, summary, retry, _ = team.model_requests("pm")[-4:]
        assert "tools" in overflowed.body and "tools" not in summary.body
        assert long_body[:1000] in summary.body["messages"][0]["content"]
        retry_text = json.dumps(retry.body["messages"])
        assert "The first activation sent long notes." in retry_text and long_body[:1000] not in retry_text


# ---------------------------------------------------------------- runner routes through the controller

@pytest.mark.parametrize("kind", KINDS)
def test_runner_routes_refuse_a_bad_token_and_another_agents_activation(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        team.model.enqueue(content="pm here.", model="pm")
        team.model.enqueue(content="worker here.", model="worker-1")
        team.send("pm", "Hello.")
        team.send("worker-1", "Hello.")
        [pm_act] = team.wait_activations("pm", 1)
        [worker_act] = team.wait_activations("worker-1", 1)
        token = team.service.token(team.name, "pm")
        base = {"project": team.name, "agentId": "pm", "activationId": pm_act["id"], "tool": "messages.send"}

        bad = team.service.post("/runner/tool-calls/start", dict(base, token="not-the-token"))
        assert (bad.status_code, bad.json()) == (403, {"error": "Invalid agent token"})
        worker_token = team.service.token(team.name, "worker-1")
        foreign_token = team.service.post("/toolpacks/core/support", dict(base, token=worker_token))
        assert (foreign_token.status_code, foreign_token.json()) == (403, {"error": "Invalid agent token"})
        foreign = team.service.post("/runner/tool-calls/start", dict(base, token=token,
                                                                     activationId=worker_act["id"]))
        assert foreign.status_code == 403
        assert foreign.json() == {"error": f"Activation {worker_act['id']} does not belong to pm"}
        output = team.service.post("/activation-output", dict(base, token=token, activationId=worker_act["id"],
                                                              output={"text": "hijack"}))
        assert output.status_code == 403
        assert team.store.activation(worker_act["id"])["text"] == "worker here."
        assert team.store.list_tool_calls(100) == []


# ---------------------------------------------------------------- runner-local tools

@pytest.mark.parametrize("kind", KINDS)
def test_path_escapes_are_rejected_with_the_spec_messages(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        workspace_host = team.store.workspace("worker-1")
        (workspace_host / "notes.txt").write_text("inside\n")
        os.symlink("/etc", workspace_host / "escape")
        workspace, artifacts = team.workspace_path("worker-1"), team.artifacts()
        read_roots = "/workspace, /artifacts, or /mnt" if kind == "docker-chat" else f"{workspace} or {artifacts}"
        write_roots = f"{workspace} or {artifacts}/worker-1"
        attempts = [
            (call("file.read", path="../../../../etc/passwd"), "Read", read_roots),
            (call("file.read", path=f"{workspace}/../../etc/passwd"), "Read", read_roots),
            (call("file.read", path="/etc/passwd"), "Read", read_roots),
            (call("file.read", path="escape/passwd"), "Read", read_roots),
            (call("file.write", path=f"{artifacts}/pm/forged.md", content="x"), "Write", write_roots),
            (call("file.write", path="escape/forged", content="x"), "Write", write_roots),
        ]
        team.model.enqueue(tool_calls=[attempt for attempt, _, _ in attempts], model="worker-1")
        team.model.enqueue(tool_calls=[call("file.read", path="notes.txt")], model="worker-1")
        team.model.enqueue(content="Checked the roots.", model="worker-1")
        team.send("worker-1", "Probe the roots.")
        [activation] = team.wait_activations("worker-1", 1)

        assert activation["status"] == "completed", activation.get("error")
        messages = team.tool_messages("worker-1")
        expected = [f"{verb} path must be under {roots}: {attempt['arguments']['path']}"
                    for attempt, verb, roots in attempts]
        assert messages[:len(attempts)] == expected
        assert messages[-1] == "1: inside\n2: "
        rows = tool_rows(team)
        assert [r["status"] for r in rows] == ["failed"] * len(attempts) + ["completed"]
        assert [r["error"] for r in rows[:len(attempts)]] == expected
        assert not (team.store.artifacts_dir("pm") / "forged.md").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_shell_timeout_kills_the_whole_process_group(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        command = "sleep 300 & echo $! > bg.pid; sleep 300"
        probe = ("test -s bg.pid || { echo no pid file; exit 1; }; pid=$(cat bg.pid); "
                 "state=$(awk '{print $3}' /proc/$pid/stat 2>/dev/null); "
                 "if [ -z \"$state\" ] || [ \"$state\" = Z ]; then echo gone; else echo alive $state; fi")
        team.model.enqueue(tool_calls=[call("shell.exec", command=command, timeoutMs=3000)], model="worker-1")
        team.model.enqueue(tool_calls=[call("shell.exec", command=probe)], model="worker-1")
        team.model.enqueue(content="Timed out as expected.", model="worker-1")
        team.send("worker-1", "Run the long job.")
        [activation] = team.wait_activations("worker-1", 1, timeout=60)

        assert activation["status"] == "completed", activation.get("error")
        timed_out, probed = team.tool_messages("worker-1")
        assert timed_out.endswith(("[timed out: stopped with SIGTERM]", "[timed out: stopped with SIGKILL]"))
        assert probed.endswith("[stdout]\ngone")
        first, _ = tool_rows(team)
        assert first["status"] == "completed"
        assert (parse_ts(first["completed_at"]) - parse_ts(first["created_at"])).total_seconds() < 8
        if kind == "local":
            pid = int((team.store.workspace("worker-1") / "bg.pid").read_text())
            assert not process_alive(pid)
