"""Controller side of tools (docs/design/tools.md): core support handlers, the support authorization
steps, a real local toolpack run by the real Node host, WebUI entries and controls, scheduler hooks and
the store facade callbacks."""
import datetime
import json
import shutil
from pathlib import Path

import pytest
from api_fixtures import init_project, running_activation
from conftest import require, wait_until
from store_fixtures import config_of

import suzumio_coordination as coordination
import suzumio_node
import suzumio_toolpacks
from suzumio_errors import BadRequest, Conflict

pytestmark = pytest.mark.timeout(120)

MANIFEST = {
    "id": "review-tools",
    "tools": [{"name": "review.summarize", "description": "Record a review summary.",
               "inputSchema": {"type": "object", "properties": {"summary": {"type": "string"}}}}],
    "webui": [{"id": "review.stats", "title": "Review statistics", "kind": "panel"}],
}

CONTROLLER = """\
import fs from "node:fs";

function mode(context) {
  try { return fs.readFileSync(context.store.paths.root + "/hook-mode.txt", "utf8").trim(); }
  catch { return "none"; }
}

export function createControllerToolpack(context) {
  return {
    tools: {
      "review.summarize": (input) => {
        if (input.fail) throw new Error("no summary");
        if (input.loop) {
          for (let i = 0; i < 1000; i++) context.store.listAgents();
        }
        const message = context.store.sendMessage({sender: context.agent.id, recipient: "pm", body: input.summary});
        return {title: "summary", output: `saved ${message.id}`,
                metadata: {pendingForPm: context.hasPendingSignalsForAgent("pm"), activationId: context.activationId}};
      },
    },
  };
}

export function createWebuiToolpack(context) {
  return {webui: {"review.stats": (input) => ({output: `agents: ${context.store.listAgents().length}`,
                                                metadata: {input}})}};
}

export async function schedulerTick(context) {
  const current = mode(context);
  if (current === "ping") return {signals: [{kind: "x.ping", targetAgent: "pm"}]};
  if (current === "invalid") return [{kind: "x.ok", targetAgent: "pm"}, {targetAgent: "pm"}];
  if (current === "throw") throw new Error("hook broke");
  if (current === "hang") return new Promise(() => {});
  if (current === "callbacks") {
    const message = context.store.sendMessage({sender: "scheduler", recipient: "pm", body: "hi"});
    const row = context.store.db.prepare("select count(*) as n from messages").get();
    context.store.appendEvent("test.hook", {n: row.n, messageId: message.id, agents: context.agents,
                                            now: context.now, toolpackId: context.toolpackId});
    return [];
  }
  return null;
}
"""

RUNNER = """\
export function createRunnerToolpack(context) {
  return {tools: {"review.summarize": (input) => context.callSupport("review.summarize", input)}};
}
"""

TEAM_YAML = """\
name: demo
task: Review the proof.
channels: ["#project"]
agents:
  pm:
    tools: [messages.send, coordination.wait_for_signal, completion.submit, "file.*"]
  worker:
    tools: ["*"]
  reviewer:
    tools: [messages.send, review.summarize]
{communication}tools:
  toolpacks: [core, shell, web, {{path: ./toolpacks/review, id: review-tools}}]
backend:
  kind: local
  controllerUrl: "{url}"
  runner:
    model: offline
    models:
      providers:
        replay: {{type: scripted, script: {{agents: {{}}}}}}
      presets:
        offline: {{provider: replay, model: team}}
"""

POLICY = """\
communication:
  restrictNonCoordinatorToCoordinator: true
  nonCoordinatorMaxPriority: P2
"""


def write_toolpack(folder, manifest=MANIFEST, controller=CONTROLLER):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "suzumio.toolpack.json").write_text(json.dumps(manifest), encoding="utf-8")
    (folder / "controller.mjs").write_text(controller, encoding="utf-8")
    (folder / "runner.mjs").write_text(RUNNER, encoding="utf-8")


@pytest.fixture
def node():
    if shutil.which("node") is None:
        require("node")("Node.js is not installed")


def team(service, tmp_path, communication="", task="Review the proof."):
    project_dir = tmp_path / "team"
    write_toolpack(project_dir / "toolpacks" / "review")
    text = TEAM_YAML.format(url=service.base_url, communication=communication)
    store = init_project(service.root, project_dir, text.replace("task: Review the proof.", f"task: {task}"))
    store.start()
    return store


@pytest.fixture
def demo_project():
    """Every test here builds its own `demo`, a team project with a local toolpack."""
    return lambda service, tmp_path: None


@pytest.fixture
def demo(service, tmp_path):
    return team(service, tmp_path)


def support(service, agent_id, activation, tool, tool_input=None, toolpack="core", **overrides):
    body = {"project": "demo", "agentId": agent_id, "activationId": activation["id"],
            "token": service.token("demo", agent_id), "tool": tool, "input": tool_input or {}, **overrides}
    return service.post(f"/toolpacks/{toolpack}/support", body)


def error_of(response, status):
    assert response.status_code == status, response.text
    return response.json()["error"]


# ---------------------------------------------------------------- allowlists and the support chain

def test_allowlist_patterns_match_exactly_prefixes_or_everything():
    assert suzumio_toolpacks.is_allowed("file.read", ["file.*"])
    assert not suzumio_toolpacks.is_allowed("filex.read", ["file.*"])
    assert not suzumio_toolpacks.is_allowed("file", ["file.*"])
    assert not suzumio_toolpacks.is_allowed("file.read", ["file*"])
    assert suzumio_toolpacks.is_allowed("review.summarize", ["*"])
    assert not suzumio_toolpacks.is_allowed("messages.send", [])


def test_support_chain_rejects_in_the_specified_order(service, demo):
    reviewer = running_activation(demo, "reviewer")
    worker = running_activation(demo, "worker")
    pm = running_activation(demo, "pm")
    assert error_of(support(service, "reviewer", reviewer, "messages.send",
                            token=service.token("demo", "worker")), 403) == "Invalid agent token"
    assert error_of(support(service, "reviewer", worker, "messages.send"), 403) == \
        f"Activation {worker['id']} does not belong to reviewer"
    assert error_of(support(service, "reviewer", reviewer, "messages.send", toolpack="shell"), 404) == \
        "Tool messages.send is not in toolpack shell"
    assert error_of(support(service, "pm", pm, "review.summarize", toolpack="review-tools"), 403) == \
        "Tool not allowed for pm: review.summarize"
    assert error_of(support(service, "pm", pm, "x", toolpack="nope"), 404) == "Unknown toolpack: nope"
    assert error_of(support(service, "reviewer", reviewer, "x", toolpack="nope", token="bad"), 403) == \
        "Invalid agent token"
    coordination.complete_activation(demo, config_of(demo), pm["id"], "pm", "done")
    assert error_of(support(service, "pm", pm, "messages.send"), 409) == \
        f"Activation {pm['id']} is completed; no more tool calls are accepted"


def test_builtin_tool_without_controller_handler_answers_not_handled(service, demo):
    worker = running_activation(demo, "worker")
    response = support(service, "worker", worker, "file.read", {"path": "x"})
    assert response.status_code == 200
    assert response.json() == {"title": "toolpack support",
                               "output": "Controller side of core did not handle file.read.",
                               "metadata": {"toolpack": "core", "tool": "file.read"}}


def test_duplicate_toolpack_in_a_stored_config_fails_every_support_call(service, demo):
    config = demo.config()
    config["tools"]["toolpacks"] = ["core", "core"]
    demo.db_run("UPDATE projects SET config_json = ?", [json.dumps(config)])
    demo._config = None  # the store caches config_json, which never changes outside this test
    worker = running_activation(demo, "worker")
    assert error_of(support(service, "worker", worker, "messages.send", {"recipient": "pm", "body": "x"}), 500) == \
        "Duplicate toolpack: core"
    assert error_of(service.get("/api/projects/demo/tool-ui"), 500) == "Duplicate toolpack: core"


# ---------------------------------------------------------------- core tools (docs/design/tools.md)

def test_messages_send_defaults_to_p3_and_signals_the_recipient(service, demo):
    worker = running_activation(demo, "worker")
    result = support(service, "worker", worker, "messages.send", {"recipient": "pm", "body": "done"}).json()
    message_id = result["metadata"]["messageId"]
    assert result == {"title": "message sent", "output": f"Message sent and delivered: {message_id}",
                      "metadata": {"messageId": message_id}}
    assert demo.message(message_id)["priority"] == "P3"
    signal = demo.list_signals(target_agent="pm")[0]
    assert (signal["status"], signal["priority"], signal["sourceActivation"]) == ("pending", "P3", worker["id"])


def test_messages_send_errors_are_handler_errors(service, demo):
    worker = running_activation(demo, "worker")
    before = demo.project_stats()["messageCount"]
    cases = [({"recipient": "pm", "channel": "#project", "body": "x"},
              'Message cannot have both recipient and channel: drop "channel" to send to pm only, '
              'or drop "recipient" to post to #project'),
             ({"body": "x"}, "Message needs recipient or channel: give recipient (pm, reviewer, user) or "
                             "channel (#project)"),
             ({"recipient": "pm", "priority": "P4", "body": "x"}, "Invalid priority: P4"),
             ({"recipient": "pm"}, "body is required")]
    for tool_input, message in cases:
        assert error_of(support(service, "worker", worker, "messages.send", tool_input), 500) == message
    assert error_of(support(service, "worker", worker, "messages.send", [1]), 500) == "Tool input must be an object"
    assert demo.project_stats()["messageCount"] == before


def test_a_message_to_oneself_is_refused_with_what_to_do_instead(service, tmp_path):
    demo = team(service, tmp_path, POLICY)  # the self check comes before the policy's "message only pm"
    before = demo.project_stats()["messageCount"]
    pm, worker, reviewer = (running_activation(demo, agent) for agent in ("pm", "worker", "reviewer"))

    def send(agent, act, **fields):
        return error_of(support(service, agent, act, "messages.send", {"body": "note to self", **fields}), 500)

    assert send("pm", pm, recipient="pm") == (
        "You are pm: a message to yourself is not delivered. Do the work now with your tools, or end with "
        "coordination_wait_for_signal or completion_submit.")
    assert send("worker", worker, recipient="worker").endswith(
        "or end with coordination_wait_for_signal or completion_submit.")  # tools: ["*"]
    # only the ending tools the agent may call are named
    assert send("reviewer", reviewer, recipient="reviewer") == (
        "You are reviewer: a message to yourself is not delivered. Do the work now with your tools.")
    assert send("pm", pm, recipient="pm", channel="#project") == (
        'Message cannot have both recipient and channel: drop "recipient" to post to #project '
        "(you are pm: a message to yourself is not delivered)")
    assert demo.project_stats()["messageCount"] == before
    assert not any(demo.has_pending_signals_for_agent(agent) for agent in ("pm", "worker", "reviewer"))


def test_a_message_sent_back_as_it_came_is_refused_with_what_to_do_instead(service, demo):
    given = coordination.send_message(demo, config_of(demo), "user", "Please begin.", recipient="pm")
    [signal] = coordination.pending_signals(demo, config_of(demo), "pm")
    pm = coordination.start_activation(demo, "pm", "The user says: Please begin.", [signal])
    before = demo.project_stats()["messageCount"]

    def send(body, recipient="worker"):
        return support(service, "pm", pm, "messages.send", {"recipient": recipient, "body": body})

    # the same words, in another case or spacing, to anyone: nothing is sent and the model is told what to do
    for echo in ("Please begin.", "  please   BEGIN ", "Please begin!"):
        assert error_of(send(echo), 500) == (
            'Not sent: "' + echo.strip() + '" only repeats what the user sent you. Do what it asks yourself, now, '
            "with your tools; to hand work to another agent, write out its assignment: what to make and where to "
            "put it.")
    assert demo.project_stats()["messageCount"] == before and given["body"] == "Please begin."
    # an assignment that says more is sent; so is the same text from an agent that was never given it
    assert send("Please begin: write sea.md in your artifact folder.").status_code == 200
    other = running_activation(demo, "worker")
    sent = support(service, "worker", other, "messages.send", {"recipient": "pm", "body": "Please begin."})
    assert sent.status_code == 200
    # in a later activation, woken by something else, the words the agent was once given are still an echo;
    # a part of a message given to this activation is one too, but not a part of an earlier one's
    coordination.complete_activation(demo, config_of(demo), pm["id"], "pm", "Delegated.")
    coordination.send_message(demo, config_of(demo), "worker", "Waiting.\n\nReason: sea.md is written",
                              recipient="pm")
    later = coordination.start_activation(demo, "pm", "Work.", [demo.ready_signals("pm", ["P3"], 5)[-1]])
    for echo in ("Please begin.", "sea.md is written"):
        refused = error_of(support(service, "pm", later, "messages.send", {"recipient": "reviewer", "body": echo}),
                           500)
        assert refused.startswith(f'Not sent: "{echo}" only repeats what ')
    assert "only repeats what worker sent you" in refused
    for said in ("begin", "sea.md"):  # words of a sentence are not that sentence
        assert support(service, "pm", later, "messages.send", {"recipient": "reviewer", "body": said}
                       ).status_code == 200


def test_an_echo_to_an_agent_the_task_names_is_answered_with_what_the_task_asks_of_it(service, tmp_path):
    project_dir = tmp_path / "team"
    write_toolpack(project_dir / "toolpacks" / "review")
    task = ("Make a booklet. worker writes a haiku to its artifact folder as sea.md; reviewer checks it. "
            "When both are done, pm submits.")
    store = init_project(service.root, project_dir, TEAM_YAML.format(url=service.base_url, communication="")
                         .replace("task: Review the proof.", f"task: {task}"))
    store.start()
    coordination.send_message(store, config_of(store), "user", "Please begin.", recipient="pm")
    [signal] = coordination.pending_signals(store, config_of(store), "pm")
    pm = coordination.start_activation(store, "pm", "The user says: Please begin.", [signal])

    def send(recipient):
        return error_of(support(service, "pm", pm, "messages.send", {"recipient": recipient, "body": "Please begin."}),
                        500)

    assert send("worker") == ('Not sent: "Please begin." only repeats what the user sent you. What the project task '
                              'asks of worker: "worker writes a haiku to its artifact folder as sea.md". Send worker '
                              "that assignment in your own words.")
    assert "asks of reviewer: \"reviewer checks it\"" in send("reviewer")
    # a recipient the task does not name (the user) gets the general answer
    assert send("user").endswith("write out its assignment: what to make and where to put it.")
    assert store.project_stats()["messageCount"] == 1


def test_the_wait_notice_names_the_files_the_activation_wrote(service, demo):
    worker = running_activation(demo, "worker")
    for tool, data, status in (("file.write", {"path": "/artifacts/worker/a.md", "content": "x"}, "completed"),
                               ("file.patch", {"operations": [{"op": "add", "path": "b.md", "content": "y"},
                                                              {"op": "delete", "path": "old.md"},
                                                              {"op": "update", "path": "/artifacts/worker/a.md",
                                                               "search": "x", "replace": "z"}]}, "completed"),
                               ("file.write", {"path": "never.md", "content": "x"}, "failed"),
                               ("file.read", {"path": "read.md"}, "completed")):
        call = demo.start_tool_call("worker", worker["id"], tool, data)
        coordination.finish_tool_call(demo, "worker", worker["id"], call["toolCallId"], status, output="done")
    result = support(service, "worker", worker, "coordination.wait_for_signal", {"reason": "done"}).json()
    assert demo.message(result["metadata"]["messageId"])["body"] == (
        "Waiting for future signals.\n\nReason: done\n\nFiles written in this activation: /artifacts/worker/a.md, b.md")


def test_communication_policy_restricts_non_coordinators(service, tmp_path):
    demo = team(service, tmp_path, POLICY)
    worker = running_activation(demo, "worker")
    pm = running_activation(demo, "pm")

    def send(agent, act, **fields):
        return support(service, agent, act, "messages.send", {"body": "x", **fields})

    assert "message only pm" in error_of(send("worker", worker, recipient="reviewer"), 500)
    assert "message only pm" in error_of(send("worker", worker, recipient="user"), 500)
    assert "channels are not allowed" in error_of(send("worker", worker, channel="#project"), 500)
    assert "P2 or lower" in error_of(send("worker", worker, recipient="pm", priority="P1"), 500)
    assert send("worker", worker, recipient="pm", priority="P2").status_code == 200
    assert send("worker", worker, recipient="pm").status_code == 200
    assert send("pm", pm, channel="#project").status_code == 200


def test_wait_for_signal_notifies_the_coordinator_once(service, demo):
    worker = running_activation(demo, "worker")
    result = support(service, "worker", worker, "coordination.wait_for_signal", {"reason": "need review"}).json()
    message_id = result["metadata"]["messageId"]
    assert result["title"] == "waiting for signal"
    assert result["output"] == f"Waiting; notified pm with message {message_id}."
    assert result["metadata"] == {"reason": "need review", "notifiedAgent": "pm", "messageId": message_id}
    message = demo.message(message_id)
    assert (message["sender"], message["recipient"], message["priority"]) == ("worker", "pm", "P3")
    assert message["body"] == "Waiting for future signals.\n\nReason: need review"
    closed = demo.list_signals(kind="coordination.wait_for_signal")[0]
    assert closed["status"] == "closed" and closed["payload"] == result["metadata"]


def test_wait_for_signal_by_the_coordinator_sends_nothing(service, demo):
    coordination.send_message(demo, config_of(demo), "user", "Check the proof.", recipient="reviewer")
    pm = running_activation(demo, "pm")  # the reviewer has work pending: the team is not quiet
    result = support(service, "pm", pm, "coordination.wait_for_signal", {}).json()
    assert result["output"] == "Waiting; a future signal will start the next activation."
    assert result["metadata"] == {"reason": "Waiting for future signals."}
    assert demo.project_stats()["messageCount"] == 1
    assert error_of(support(service, "pm", pm, "coordination.wait_for_signal", {"notifyPm": "yes"}), 500) == \
        "Expected boolean, got yes"
    # not even when it names a worker as the one to notify: the notice would only wake that worker
    named = support(service, "pm", pm, "coordination.wait_for_signal", {"pm": "worker", "notifyPm": True}).json()
    assert named["output"] == "Waiting; a future signal will start the next activation."
    assert demo.project_stats()["messageCount"] == 1 and not demo.has_pending_signals_for_agent("worker")


def called(service, store, agent_id, activation, tool, tool_input=None):
    """One tool call as a runner makes it: audited, run through the support chain, finished; the response."""
    call = store.start_tool_call(agent_id, activation["id"], tool, tool_input or {})
    response = support(service, agent_id, activation, tool, tool_input)
    failed = response.status_code != 200
    coordination.finish_tool_call(store, agent_id, activation["id"], call["toolCallId"],
                                  "failed" if failed else "completed",
                                  output=None if failed else response.json()["output"],
                                  error=response.json()["error"] if failed else None)
    return response


WAIT = "coordination.wait_for_signal"


def test_a_coordinator_waits_for_the_first_part_of_a_pipeline_and_is_then_pointed_at_the_next(service, tmp_path):
    demo = team(service, tmp_path, task="pm plans. The worker writes notes.md; reviewer then checks it.")
    config = config_of(demo)
    coordination.send_message(demo, config, "user", "Please begin.", recipient="pm")
    pm = coordination.start_activation(demo, "pm", "Work.", coordination.pending_signals(demo, config, "pm"))
    assert called(service, demo, "pm", pm, "messages.send", {"recipient": "worker", "body": "Write notes.md"}
                  ).status_code == 200
    # the reviewer, whom the task names, has nothing yet: it comes after the worker, so the wait is right
    assert called(service, demo, "pm", pm, WAIT).json()["output"].startswith("Waiting;")
    assert [c["status"] for c in demo.tool_calls_of(pm["id"])] == ["completed", "completed"]
    coordination.complete_activation(demo, config, pm["id"], "pm", "Waiting.")
    # the worker has answered and nothing is outstanding: a wait now would leave the reviewer without work
    coordination.send_message(demo, config, "worker", "notes.md is written", recipient="pm")
    second = coordination.start_activation(demo, "pm", "Work.", coordination.pending_signals(demo, config, "pm"))
    refused = error_of(called(service, demo, "pm", second, WAIT), 500)
    assert refused == ("Not waiting yet. Everyone you gave work to has answered: worker. You have given reviewer "
                       'nothing yet; what the project task asks of reviewer: "reviewer then checks it". Send '
                       "reviewer that assignment with messages_send now. Nothing more is coming unless you act; to "
                       "wait anyway, call coordination_wait_for_signal again.")
    assert called(service, demo, "pm", second, WAIT).json()["output"].startswith("Waiting;")


def test_a_coordinator_that_waits_when_everyone_it_gave_work_to_has_answered_is_pointed_at_submitting_once(
        service, demo):
    config = config_of(demo)
    coordination.send_message(demo, config, "user", "Please begin.", recipient="pm")
    pm = coordination.start_activation(demo, "pm", "Work.", coordination.pending_signals(demo, config, "pm"))
    for agent in ("worker", "reviewer"):
        assert called(service, demo, "pm", pm, "messages.send", {"recipient": agent, "body": f"{agent}: go"}
                      ).status_code == 200
    assert called(service, demo, "pm", pm, WAIT).status_code == 200  # work is out: the wait is taken
    coordination.complete_activation(demo, config, pm["id"], "pm", "Waiting.")

    def woken_by(sender, body):
        coordination.send_message(demo, config, sender, body, recipient="pm")
        return coordination.start_activation(demo, "pm", "Work.", coordination.pending_signals(demo, config, "pm"))

    # one of two has answered: waiting for the other is right
    work = running_activation(demo, "worker")

    def wrote(path, now=None):
        write = demo.start_tool_call("worker", work["id"], "file.write", {"path": path, "content": "x"}, now=now)
        coordination.finish_tool_call(demo, "worker", work["id"], write["toolCallId"], "completed", output="Wrote")

    wrote("/artifacts/worker/notes.md")
    first = woken_by("worker", "notes.md is written")
    # after its answer: not among the files it answered with
    wrote("/artifacts/worker/later.md", now=datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=5))
    assert called(service, demo, "pm", first, WAIT).status_code == 200
    coordination.complete_activation(demo, config, first["id"], "pm", "Waiting.")
    # both have: the wait is refused once, with what to do instead
    second = woken_by("reviewer", "notes.md reviewed")
    refused = error_of(called(service, demo, "pm", second, WAIT, {"reason": "reports"}), 500)
    assert refused == ("Not waiting yet. Everyone you gave work to has answered: reviewer, worker. Files they wrote: "
                       "/artifacts/worker/notes.md. Call completion_submit now with the final report, naming these "
                       "files, unless the task needs more work. Nothing more is coming unless you act; to wait "
                       "anyway, call "
                       "coordination_wait_for_signal again.")
    assert called(service, demo, "pm", second, WAIT, {"reason": "reports"}).status_code == 200
    coordination.complete_activation(demo, config, second["id"], "pm", "Waiting.")
    # new work given after the answers: waiting for it is right again
    third = woken_by("user", "One more thing.")
    assert called(service, demo, "pm", third, "messages.send", {"recipient": "worker", "body": "Add a title."}
                  ).status_code == 200
    assert called(service, demo, "pm", third, WAIT).status_code == 200


def test_a_worker_that_waits_having_done_nothing_it_was_asked_is_told_what_once(service, tmp_path):
    demo = team(service, tmp_path, task="The worker writes notes.md to its artifact folder. pm submits it.")
    coordination.send_message(demo, config_of(demo), "pm", "Write the notes.", recipient="worker")
    worker = coordination.start_activation(demo, "worker", "Work.", demo.ready_signals("worker", ["P3"], 5))
    assert "recipient" in error_of(called(service, demo, "worker", worker, "messages.send", {"body": "hi"}), 500)
    refused = error_of(called(service, demo, "worker", worker, WAIT), 500)
    assert refused == ('Not waiting yet: you have done nothing of what pm asked: "Write the notes.". What the '
                       'project task asks of you: "The worker writes notes.md to its artifact folder". Do it now '
                       "with your tools, then report it; to wait anyway, call coordination_wait_for_signal again.")
    assert called(service, demo, "worker", worker, WAIT).status_code == 200
    coordination.complete_activation(demo, config_of(demo), worker["id"], "worker", "Waiting.")
    # an activation that did something waits at once
    coordination.send_message(demo, config_of(demo), "pm", "And the summary.", recipient="worker")
    second = coordination.start_activation(demo, "worker", "Work.", demo.ready_signals("worker", ["P3"], 5))
    assert called(service, demo, "worker", second, "messages.send", {"recipient": "pm", "body": "Done: notes.md"}
                  ).status_code == 200
    assert called(service, demo, "worker", second, WAIT, {"notifyPm": False}).status_code == 200


def test_completion_submit_writes_the_report_and_submits(service, demo):
    pm = running_activation(demo, "pm")
    result = support(service, "pm", pm, "completion.submit", {"report": "  # Done\n\n"}).json()
    path = demo.dir / "final-report.md"
    assert path.read_text(encoding="utf-8") == "# Done\n"
    assert result["output"] == f"Submitted for user approval; report at {path}"
    assert result["metadata"] == {"reportPath": str(path)} and result["title"] == "project submitted"
    assert demo.project()["status"] == "submitted"


# ---------------------------------------------------------------- local toolpack through the Node host

def test_local_controller_module_runs_with_store_callbacks(service, demo, node):
    reviewer = running_activation(demo, "reviewer")
    coordination.send_message(demo, config_of(demo), "user", "Look.", recipient="pm")
    response = support(service, "reviewer", reviewer, "review.summarize", {"summary": "LGTM"},
                       toolpack="review-tools")
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["output"].startswith("saved msg_")
    assert result["metadata"] == {"pendingForPm": True, "activationId": reviewer["id"]}
    assert demo.list_messages(5)[-1]["body"] == "LGTM"
    many = support(service, "reviewer", reviewer, "review.summarize", {"summary": "x", "loop": True},
                   toolpack="review-tools")
    assert many.status_code == 200


def test_a_keyed_send_through_the_store_facade_is_recorded_once_and_answered_again(demo):
    """docs/toolpacks.md `idempotencyKey`: the second send with the key writes no message, event or
    signal and answers the first message; the key with another message is a conflict."""
    send = suzumio_toolpacks.facade_callbacks(demo, config_of(demo))["store.sendMessage"]
    request = {"sender": "scheduler", "recipient": "pm", "body": "Daily summary.",
               "idempotencyKey": "scheduler:sch_1@2026-06-03T10:00:00.000Z"}

    def recorded():
        return (demo.db_all("SELECT id FROM messages WHERE body = ?", ["Daily summary."]),
                demo.db_all("SELECT id FROM events WHERE type = 'message.created'"),
                demo.db_all("SELECT id FROM signals WHERE kind = 'message.created' AND target_agent = 'pm'"))

    first = send(request)
    once = recorded()
    assert [len(rows) for rows in once] == [1, 1, 1]
    assert send(dict(request)) == first
    assert recorded() == once
    with pytest.raises(Conflict) as conflict:
        send({**request, "priority": "P1"})
    assert conflict.value.message == \
        "idempotencyKey scheduler:sch_1@2026-06-03T10:00:00.000Z was already used for another message"
    with pytest.raises(BadRequest) as refused:
        send({**request, "idempotencyKey": 7})
    assert refused.value.message == "idempotencyKey must be a non-empty string, got 7"
    assert send({**request, "idempotencyKey": "scheduler:sch_1@2026-06-03T12:00:00.000Z"})["id"] != first["id"]
    unkeyed = {key: value for key, value in request.items() if key != "idempotencyKey"}
    assert send(unkeyed)["id"] != send(unkeyed)["id"]
    assert recorded() != once and len(recorded()[0]) == 4


FIXTURES = Path(__file__).resolve().parent / "toolpack_fixtures"


@pytest.mark.parametrize("tool", ["probe.delete_through_all", "probe.delete_through_get"])
def test_a_local_toolpack_cannot_write_through_the_read_path(demo, node, tool):
    """store.db.all / store.db.get run on the store's query_only readers: a DELETE fails, nothing changes."""
    host = suzumio_node.NodeHost()
    module = str(FIXTURES / "controller_store_writes.mjs")
    context = {"project": demo.project_id, "paths": suzumio_toolpacks.store_paths(demo)}
    try:
        callbacks = suzumio_toolpacks.facade_callbacks(demo, config_of(demo))
        before = demo.db_all("SELECT * FROM events ORDER BY rowid")
        assert before
        with pytest.raises(suzumio_node.ToolpackError, match="readonly"):
            host.support(module, "probe", tool, {}, context, callbacks)
        assert demo.db_all("SELECT * FROM events ORDER BY rowid") == before
        counted = host.support(module, "probe", "probe.count", {}, context, callbacks)
        assert counted["output"] == f"events {len(before)}"
    finally:
        host.close()


def test_local_handler_error_is_a_500_with_its_message(service, demo, node):
    reviewer = running_activation(demo, "reviewer")
    response = support(service, "reviewer", reviewer, "review.summarize", {"fail": True}, toolpack="review-tools")
    assert response.status_code == 500 and response.json() == {"error": "no summary"}


def test_controller_module_without_factory_is_reported(service, tmp_path, node):
    project_dir = tmp_path / "team"
    write_toolpack(project_dir / "toolpacks" / "review", controller="export const nothing = 1;\n")
    demo = init_project(service.root, project_dir, TEAM_YAML.format(url=service.base_url, communication=""))
    demo.start()
    reviewer = running_activation(demo, "reviewer")
    response = support(service, "reviewer", reviewer, "review.summarize", {}, toolpack="review-tools")
    assert error_of(response, 500) == \
        "Controller module of review-tools exports neither createControllerToolpack nor a default factory"


def test_controller_module_without_the_tool_answers_not_handled(service, tmp_path, node):
    project_dir = tmp_path / "team"
    write_toolpack(project_dir / "toolpacks" / "review",
                   controller="export function createControllerToolpack() { return {tools: {}}; }\n")
    demo = init_project(service.root, project_dir, TEAM_YAML.format(url=service.base_url, communication=""))
    demo.start()
    reviewer = running_activation(demo, "reviewer")
    result = support(service, "reviewer", reviewer, "review.summarize", {}, toolpack="review-tools").json()
    assert result["output"] == "Controller side of review-tools did not handle review.summarize."


# ---------------------------------------------------------------- WebUI entries (docs/design/tools.md)

def test_tool_ui_lists_builtin_then_local_entries(service, demo):
    entries = service.get("/api/projects/demo/tool-ui").json()
    assert [e["id"] for e in entries] == ["project.stats", "messages.conversation", "messages.send",
                                          "coordination.signals", "completion.report", "file.activity",
                                          "shell.activity", "web.activity", "review.stats"]
    assert entries[-1] == {"id": "review.stats", "title": "Review statistics", "kind": "panel",
                           "toolpackId": "review-tools", "toolpackKind": "local"}


def test_local_webui_entry_runs_in_the_node_host(service, demo, node):
    response = service.post("/api/projects/demo/tool-ui/review-tools/review.stats", {"x": 1})
    assert response.status_code == 200
    assert response.json() == {"output": "agents: 3", "metadata": {"input": {"x": 1}}}


def test_webui_send_message_goes_to_the_coordinator_by_default(service, demo):
    response = service.post("/api/projects/demo/tool-ui/core/messages.send", {"body": "hi", "priority": ""})
    assert response.status_code == 200
    result = response.json()
    message = result["metadata"]["message"]
    assert (message["sender"], message["recipient"], message["priority"]) == ("user", "pm", "P3")
    assert result["output"] == f"Message sent: {message['id']}\nRoute: user -> pm\nPriority: P3\n\nhi"
    unknown = service.post("/api/projects/demo/tool-ui/core/messages.send", {"sender": "ghost", "body": "x"})
    assert error_of(unknown, 500) == "Unknown sender: ghost"
    channel = service.post("/api/projects/demo/tool-ui/core/messages.send",
                           {"sender": "worker", "channel": "#project", "body": "all"}).json()
    assert channel["output"].splitlines()[1] == "Route: worker -> #project"


def test_signal_panel_summarizes_and_filters(service, demo):
    coordination.send_message(demo, config_of(demo), "user", "Start.", recipient="pm")
    assert error_of(service.post("/api/projects/demo/tool-ui/core/coordination.signals", {"status": "open"}), 500) \
        == "Invalid signal status: open"
    result = service.post("/api/projects/demo/tool-ui/core/coordination.signals", {}).json()
    assert result["output"].startswith("Signal summary:\n- pending P3: 1\n\nRecent signals:\n- ")
    assert "message.created -> pm: message msg_" in result["output"]
    assert result["metadata"]["aggregates"] == [{"status": "pending", "priority": "P3", "count": 1}]
    filtered = service.post("/api/projects/demo/tool-ui/core/coordination.signals",
                            {"targetAgent": "worker", "status": "", "limit": 5}).json()
    assert filtered["output"].endswith("Recent signals:\n- none")
    assert filtered["metadata"]["metrics"][-1] == {"label": "Recent", "value": 0, "description": "target worker"}


def test_conversation_panel_shows_pairs_then_a_conversation(service, demo):
    coordination.send_message(demo, config_of(demo), "user", "Start.", recipient="pm")
    coordination.send_message(demo, config_of(demo), "pm", "Done.", recipient="user")
    overview = service.post("/api/projects/demo/tool-ui/core/messages.conversation", {}).json()
    assert overview["output"].startswith("Select two participants, then refresh.\n"
                                         "Known participants: user, pm, reviewer, worker\n\nRecent direct pairs:\n")
    assert [(p["sender"], p["recipient"], p["count"]) for p in overview["metadata"]["recentPairs"]] == \
        [("pm", "user", 1), ("user", "pm", 1)]
    talk = service.post("/api/projects/demo/tool-ui/core/messages.conversation",
                        {"agentA": "user", "agentB": "pm", "limit": 10}).json()
    assert [m["body"] for m in talk["metadata"]["messages"]] == ["Start.", "Done."]
    assert talk["output"].startswith("Conversation: user <-> pm\n\nKnown participants:")
    bad_limit = service.post("/api/projects/demo/tool-ui/core/messages.conversation", {"limit": 0})
    assert error_of(bad_limit, 500) == "Expected a positive number"


def test_report_panel_before_and_after_submission(service, demo):
    before = service.post("/api/projects/demo/tool-ui/core/completion.report", {}).json()
    assert before["output"] == "Project status: running\nNo report has been submitted with completion.submit yet."
    pm = running_activation(demo, "pm")
    path = coordination.submit_report(demo, "pm", pm["id"], "# Final")["reportPath"]
    after = service.post("/api/projects/demo/tool-ui/core/completion.report", {}).json()
    assert after["output"] == f"Project status: submitted\nReport path: {path}\n\n# Final\n"
    assert after["metadata"]["metrics"][1] == {"label": "Report chars", "value": 8}


def test_activity_panels_summarize_recorded_inputs(service, demo):
    worker = running_activation(demo, "worker")
    patch = demo.start_tool_call("worker", worker["id"], "file.patch",
                                 {"operations": [{"op": "add", "path": f"f{i}"} for i in range(7)]})
    coordination.finish_tool_call(demo, "worker", worker["id"], patch["toolCallId"], "failed", error="disk full")
    demo.start_tool_call("worker", worker["id"], "shell.exec", {"command": "ls   -la", "cwd": "/tmp"})
    files = service.post("/api/projects/demo/tool-ui/core/file.activity", {}).json()
    assert files["title"] == "File tool activity"
    assert files["output"].splitlines()[:4] == ["File tool activity:",
                                                "- file.read: 0 (0 running, 0 completed, 0 failed)",
                                                "- file.write: 0 (0 running, 0 completed, 0 failed)",
                                                "- file.patch: 1 (0 running, 0 completed, 1 failed)"]
    recent = files["metadata"]["recent"][0]
    assert recent["summary"] == "7 operations: f0, f1, f2, f3, f4, f5, ..." and recent["error"] == "disk full"
    assert "\n  error: disk full" in files["output"]
    shell = service.post("/api/projects/demo/tool-ui/shell/shell.activity", {"limit": 1}).json()
    assert shell["metadata"]["recent"][0]["summary"] == "/tmp: ls -la"


# ---------------------------------------------------------------- scheduler hooks (docs/design/tools.md)

def hook_mode(store, mode):
    (store.dir / "hook-mode.txt").write_text(mode, encoding="utf-8")


def hook_failures(store):
    return [json.loads(e["data_json"]) for e in store.list_events(50) if e["type"] == "scheduler.hook_failed"]


def test_hook_signal_requests_are_recorded_without_a_source(service, demo, node):
    hook_mode(demo, "ping")
    service.scheduler.tick("demo")
    pings = demo.list_signals(kind="x.ping")
    assert len(pings) == 1
    assert (pings[0]["targetAgent"], pings[0]["status"], pings[0]["priority"]) == ("pm", "pending", "P3")
    assert "sourceAgent" not in pings[0] and hook_failures(demo) == []


def test_an_invalid_hook_result_records_nothing_and_a_failure_event(service, demo, node):
    hook_mode(demo, "invalid")
    service.scheduler.tick("demo")
    assert demo.list_signals(kind="x.ok") == []
    assert hook_failures(demo) == [{"toolpackId": "review-tools", "error": "kind is required"}]
    hook_mode(demo, "throw")
    service.scheduler.tick("demo")
    assert hook_failures(demo)[0] == {"toolpackId": "review-tools", "error": "hook broke"}


def test_hook_callbacks_see_their_own_writes_and_the_agents(service, demo, node):
    running_activation(demo, "worker")
    hook_mode(demo, "callbacks")
    service.scheduler.tick("demo")
    event = next(e for e in demo.list_events(20) if e["type"] == "test.hook")
    data = json.loads(event["data_json"])
    assert data["n"] == 1 and demo.message(data["messageId"])["sender"] == "scheduler"
    assert data["toolpackId"] == "review-tools" and data["now"].endswith("Z")
    agents = {a["id"]: a for a in data["agents"]}
    assert agents["pm"]["activeActivationId"] is None and agents["pm"]["modelAlive"] is False
    assert agents["worker"]["modelAlive"] is True
    assert set(agents["pm"]) == {"id", "displayName", "role", "status", "activeActivationId", "modelAlive",
                                 "updatedAt"}


def test_hook_validation_rules():
    requests = suzumio_toolpacks.hook_requests({"signals": [{"kind": "a", "targetAgent": "pm", "priority": "P1",
                                                             "payload": [1], "notBefore": "2030-01-01T00:00:00.000Z"}]})
    assert requests == [{"kind": "a", "target_agent": "pm", "target_channel": None, "priority": "P1", "payload": {},
                         "status": None, "useful_effect": None, "not_before": "2030-01-01T00:00:00.000Z"}]
    assert suzumio_toolpacks.hook_requests(None) == [] and suzumio_toolpacks.hook_requests({"x": 1}) == []
    for item, message in (("x", "Tool input must be an object"), ({"kind": " "}, "kind is required"),
                          ({"kind": "a", "priority": "P7"}, "Invalid priority: P7"),
                          ({"kind": "a", "usefulEffect": 1}, "Expected boolean, got 1"),
                          ({"kind": "a", "status": "open"}, "Invalid signal status: open"),
                          ({"kind": "a", "targetAgent": "pm", "status": "closed"},
                           "Targeted signals cannot be closed; omit the target or omit status")):
        with pytest.raises(suzumio_toolpacks.BadRequest, match=message):
            suzumio_toolpacks.hook_requests([item])


@pytest.mark.slow
def test_a_hanging_hook_times_out_and_the_next_call_gets_a_fresh_host(service, demo, node):
    hook_mode(demo, "hang")
    service.scheduler.tick("demo")
    assert hook_failures(demo) == [{"toolpackId": "review-tools",
                                    "error": "Toolpack host failed: timed out after 10000 ms"}]
    assert service.toolpacks.node.pid is None
    hook_mode(demo, "none")
    reviewer = running_activation(demo, "reviewer")
    response = support(service, "reviewer", reviewer, "review.summarize", {"summary": "ok"}, toolpack="review-tools")
    assert response.status_code == 200
    wait_until(lambda: service.toolpacks.node.pid is not None, 2, message="a fresh host")


def test_webui_only_toolpack_needs_no_runner_module_and_still_runs_its_hook(service, tmp_path, node):
    project_dir = tmp_path / "team"
    folder = project_dir / "toolpacks" / "review"
    write_toolpack(folder, manifest={"id": "review-tools", "tools": [],
                                     "webui": [{"id": "review.stats", "title": "Review statistics"}]})
    (folder / "runner.mjs").unlink()
    yaml_text = TEAM_YAML.format(url=service.base_url, communication="").replace(
        "[messages.send, review.summarize]", "[messages.send]")
    demo = init_project(service.root, project_dir, yaml_text)
    demo.start()
    entries = service.get("/api/projects/demo/tool-ui").json()
    assert entries[-1] == {"id": "review.stats", "title": "Review statistics", "kind": "panel",
                           "toolpackId": "review-tools", "toolpackKind": "local"}
    hook_mode(demo, "ping")
    service.scheduler.tick("demo")
    assert len(demo.list_signals(kind="x.ping")) == 1
