"""`suzumio watch` (suzumio_watch): the narration of a real scripted team followed over the live stream
of the real app, and the Narrator's lines for the events a scripted team does not produce."""
import io
import json
import threading

import pytest
from api_fixtures import init_project, serving
from conftest import wait_until
from store_fixtures import config_of
from webui_fixtures import KICKOFF, init_demo_team

import suzumio
import suzumio_approvals
import suzumio_coordination as coordination
import suzumio_guards
import suzumio_store
import suzumio_watch

pytestmark = pytest.mark.timeout(180)


def in_order(lines, expected):
    """The lines of `expected` (each a prefix) found in `lines` in that order; the first one missing."""
    position = 0
    for wanted in expected:
        found = next((i for i in range(position, len(lines)) if lines[i].startswith(wanted)), None)
        if found is None:
            return wanted
        position = found + 1
    return None


def test_watch_narrates_the_demo_team_in_order_per_agent(tmp_path):
    out = io.StringIO()
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = init_demo_team(service, tmp_path / "configs")
        argv = ["watch", "demo", "--root", str(service.root.path), "--url", service.base_url]
        codes = []
        watcher = threading.Thread(target=lambda: codes.append(suzumio.main(argv, out=out, err=out)),
                                   name="watch", daemon=True)
        watcher.start()
        wait_until(lambda: out.getvalue().startswith("watching demo at "), 10, message="the stream to open")
        assert service.post("/api/projects/demo/start").status_code == 200
        assert service.post("/api/projects/demo/messages", {"recipient": "pm", "body": KICKOFF}).status_code == 200
        wait_until(lambda: store.project()["status"] == "submitted", 90, message="the demo team to submit")
        wait_until(lambda: not store.running_activations(), 30, message="the last activations to end")
        wait_until(lambda: out.getvalue().count("■ pm done") >= 4, 10, message="pm's last activation narrated")
    watcher.join(10)  # closing the server ends the stream, and with it the command
    assert not watcher.is_alive() and codes == [0], out.getvalue()
    lines = [line.strip() for line in out.getvalue().splitlines()]
    artifacts = store.artifacts_root

    def key(path):  # a long path is cut to the key input's width
        return suzumio_watch.one_line(f"{artifacts}/{path}", suzumio_watch.KEY_CHARS)

    per_agent = {
        "user": ["· project running", f"✉ user → pm: {KICKOFF}"],
        "pm": ["▶ pm wakes up (act_", "pm → messages.send worker-1", "✉ pm → worker-1: Write part A of the card",
               "pm → messages.send worker-2", "pm → coordination.wait_for_signal",
               "⏸ pm waits: Waiting for part A and part B.", "■ pm done",
               "▶ pm wakes up (act_", "⏸ pm waits: One part is in; waiting for the other one.", "■ pm done",
               "▶ pm wakes up (act_", "✉ pm → critic: Please review the card", "■ pm done",
               "▶ pm wakes up (act_", f"pm → file.read {key('critic/review.md')}", "pm → completion.submit",
               "✓ pm submitted the final report", "# Greeting card",
               "- Salutation by worker-1: ", "■ pm done"],
        "worker-1": ["▶ worker-1 wakes up (act_", f"worker-1 → file.write {key('worker-1/part-a.md')}",
                     "worker-1 → messages.send pm", "✉ worker-1 → pm: Part A is ready at ",
                     "⏸ worker-1 waits: Reported part A to pm.", "■ worker-1 done"],
        "worker-2": ["▶ worker-2 wakes up (act_", "worker-2 → shell.exec $ printf 'Warm wishes",
                     "✉ worker-2 → pm: Part B is ready at ", "■ worker-2 done"],
        "critic": ["▶ critic wakes up (act_", "critic → file.read", "critic → file.write",
                   "✉ critic → pm: Verdict: approved.", "■ critic done"],
    }
    for agent, expected in per_agent.items():
        assert in_order(lines, expected) is None, f"{agent}: missing {in_order(lines, expected)!r}\n{out.getvalue()}"
    # who woke each agent, and why: the signal's kind, its sender and its priority
    wakes = [line for line in lines if line.startswith("▶ ")]
    assert wakes[0].endswith(": message from user (P3)")
    assert any(line.startswith("▶ worker-1 wakes up") and line.endswith(": message from pm (P3)") for line in wakes)
    assert any(line.startswith("▶ pm wakes up") and line.endswith(": message from critic (P3)") for line in wakes)
    assert not any(line.startswith("* ") for line in lines), "raw event lines are gone"


GATED_YAML = """\
name: gated
task: Ship it.
agents:
  pm:
    tools: [messages.send]
  worker:
    tools: [messages.send, "shell.*"]
    approve:
      - {tool: shell.exec, match: {command: "git push"}}
tools:
  toolpacks: [core, shell]
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


def narrate(store):
    """Every stored event of the project, oldest first, through one Narrator."""
    narrator = suzumio_watch.Narrator()
    return [line for event in reversed(store.list_events(limit=1000))
            for line in narrator.lines(event["type"], json.loads(event["data_json"]))]


def test_approvals_and_a_guard_trip_written_by_the_controller_are_narrated(tmp_path):
    root = suzumio_store.Root(tmp_path / "root")
    try:
        store = init_project(root, tmp_path / "gated", GATED_YAML)
        store.start()
        config = config_of(store)
        coordination.send_message(store, config, "user", "Push the branch.", recipient="worker", priority="P2")
        activation = coordination.start_activation(store, "worker", "Work.",
                                                   coordination.pending_signals(store, config, "worker"))["id"]
        started = suzumio_approvals.start_tool_call(store, config, "worker", activation, "shell.exec",
                                                    {"command": "git push origin main"})
        approval = started["approval"]["id"]
        suzumio_approvals.decide(store, approval, "deny", note="Open a pull request\ninstead.", via="cli")
        suzumio_guards.trip(store, "worker", activation, "shell.exec", {"command": "ls"},
                            {"rule": "repeatedToolCall", "limit": 5, "reason": "the same call 5 times"})
        lines = narrate(store)
    finally:
        root.close()
    expected = [
        "  ✉ user → worker: Push the branch.",
        f"▶ worker wakes up ({activation}): message from user (P2)",
        "  worker → shell.exec $ git push origin main",
        f"  ? worker asks to run shell.exec: approval {approval} pending",
        f"  ! approval {approval} of worker (shell.exec): deny by cli: Open a pull request instead.",
        "  worker → shell.exec $ ls",
        "  ✗ worker shell.exec failed: Loop guard repeatedToolCall tripped: the same call 5 times. The tool did "
        "not run; this activation ends and you are paused until a person resumes you.",
        "⛔ worker paused: loop guard repeatedToolCall tripped: the same call 5 times",
        "■ worker cancelled: Loop guard repeatedToolCall tripped: the same call 5 times",
    ]
    assert in_order(lines, expected) is None, "\n".join(lines)


# Event data as the controller writes it (suzumio_approvals, suzumio_guards, suzumio_coordination,
# suzumio_runner_support), and the narration of each.
EVENTS = [
    ("tool.called", {"id": "tool_1", "agentId": "worker-1", "activationId": "act_1", "tool": "shell.exec",
                     "status": "running", "inputPreview": {"command": "git push origin main"}},
     ["  worker-1 → shell.exec $ git push origin main"]),
    ("approval.requested", {"id": "apr_1", "agentId": "worker-1", "activationId": "act_1", "toolCallId": "tool_1",
                            "tool": "shell.exec", "expiresAt": "2026-12-06T15:00:00.000Z"},
     ["  ? worker-1 asks to run shell.exec: approval apr_1 pending"]),
    ("approval.decided", {"id": "apr_1", "agentId": "worker-1", "activationId": "act_1", "tool": "shell.exec",
                          "decision": "deny", "decidedBy": "cli", "note": "Open a pull request\ninstead."},
     ["  ! approval apr_1 of worker-1 (shell.exec): deny by cli: Open a pull request instead."]),
    ("tool.failed", {"id": "tool_1", "error": "Denied by cli: Open a pull request instead."},
     ["  ✗ worker-1 shell.exec failed: Denied by cli: Open a pull request instead."]),
    ("guard.tripped", {"rule": "repeatedToolCall", "agentId": "worker-1", "activationId": "act_1",
                       "toolCallId": "tool_2", "limit": 5, "tool": "shell.exec",
                       "reason": "shell.exec called 5 times with the same input"},
     ["⛔ worker-1 paused: loop guard repeatedToolCall tripped: shell.exec called 5 times with the same input"]),
    ("signal.created", {"id": "sig_1", "kind": "scheduler.no_effect_nudge", "targetAgent": "pm", "priority": "P2",
                        "payload": {"attempt": 2}},
     ["  ↻ pm nudged: the last activation had no useful effect (attempt 2)"]),
    ("activation.started", {"activationId": "act_2", "agentId": "pm",
                            "signals": [{"id": "sig_1", "kind": "scheduler.no_effect_nudge", "priority": "P2"}]},
     ["▶ pm wakes up (act_2): nudged: the last activation had no useful effect (P2)"]),
    ("model.retry", {"activationId": "act_2", "agentId": "pm", "providerId": "fake", "presetId": "main",
                     "retry": 1, "maxRetries": 3, "reason": "429 Too Many Requests", "status": 429, "delayMs": 1500},
     ["  … pm model main retry 1/3, waiting 1.5 s: 429 Too Many Requests"]),
    ("activation.failed", {"activationId": "act_2", "agentId": "pm", "error": "Model request failed:\n  timeout"},
     ["✗ pm failed: Model request failed: timeout"]),
    ("tool.completed", {"id": "tool_3", "output": "ok"}, []),
    ("agent_history.message", {"id": "hist_1", "agentId": "pm", "role": "assistant", "chars": 4}, []),
]


def test_narrator_tells_approvals_guards_nudges_retries_and_failures():
    narrator = suzumio_watch.Narrator()
    for kind, data, expected in EVENTS:
        assert narrator.lines(kind, data) == expected, kind


def test_a_message_and_a_long_input_are_told_on_one_trimmed_line():
    narrator = suzumio_watch.Narrator()
    [line] = narrator.lines("message.created", {"sender": "pm", "channel": "#project",
                                                "body": "First line\n\n" + "word " * 100})
    assert line.startswith("  ✉ pm → #project: First line word word") and line.endswith("…")
    assert len(line) == len("  ✉ pm → #project: ") + suzumio_watch.LINE_CHARS
    [patch] = narrator.lines("tool.called", {"id": "t", "agentId": "w", "tool": "file.patch", "inputPreview": {
        "operations": [{"op": "add", "path": "a.md"}, {"op": "delete", "path": "b.md"}]}})
    assert patch == "  w → file.patch add a.md, delete b.md"
