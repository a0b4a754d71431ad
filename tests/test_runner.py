"""The runner end to end (a subprocess against the fake model and fake controller): loop order, tool
round trips, P1 delivery, fallback, retries, compaction, limits, proxies, scripted replay, local toolpacks
through the Node host, exit codes, SIGTERM and secrets; plus unit tests of its pure helpers
(docs/design/runner.md scenarios 25-40; docs/configuration.md)."""

import ast
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conftest import require, wait_until
from fake_controller import SIGNAL_HEADING, FakeController
from fake_model import REMINDER, FakeModel, RecordingProxy
from runner_fixtures import (
    API_KEY,
    REPO,
    TOKEN,
    builtin_toolpacks,
    history_row,
    make_input,
    provider_config,
    run_runner,
    runner_env,
    start_runner,
    tool_def,
    write_input,
)

import suzumio_backend
import suzumio_backend_local
import suzumio_runner as runner
import suzumio_runner_calls as runner_calls
import suzumio_runner_loop as loop
import suzumio_runner_models as models
import suzumio_runner_tools as tools

CHAT = "/v1/chat/completions"


@pytest.fixture
def model():
    fake = FakeModel()
    yield fake
    fake.close()


@pytest.fixture
def controllers():
    created = []

    def make(history=None, **extra):
        controller = FakeController(history=history, **extra)
        created.append(controller)
        return controller

    yield make
    for controller in created:
        controller.close()


@pytest.fixture
def setup(tmp_path, model, controllers):
    """(controller, activation) for worker with the built-in toolpacks and the given history/runner."""

    def build(history=None, runner_config=None, toolpacks=None, environ=None):
        """The controller holds the models config and the key (`environ`, by default GW_KEY); the
        activation's input.json carries the runner section the backend writes, without them."""
        history = history if history is not None else [history_row(1, content="Start")]
        controller = controllers(history=history)
        activation = make_input(
            tmp_path,
            controller.url,
            model.base_url,
            toolpacks=toolpacks,
            history=history,
            runner=runner_config,
        )
        activation["runner"] = controller.use_runner(
            activation["runner"], {"GW_KEY": API_KEY} if environ is None else environ
        )
        return controller, activation

    return build


def two_presets(base_url, first="a", second="b", **provider_extra):
    return {
        "mode": "ai",
        "model": "list",
        "models": {
            "providers": {"gw": provider_config(base_url, **provider_extra)},
            "presets": {
                "list": {"model-list": [first, second]},
                first: {"provider": "gw", "model": first},
                second: {"provider": "gw", "model": second},
            },
        },
    }


def output_rows(controller):
    return [b for b in controller.bodies("/runner/history/messages") if b["kind"] == "assistant_output"]


def tool_messages(request):
    return [m for m in request.body["messages"] if m["role"] == "tool"]


def assert_clean(result):
    for secret in (TOKEN, API_KEY):
        assert secret not in result.stdout + result.stderr


# -- the loop ---------------------------------------------------------------------------------


def test_plain_answer_posts_context_then_history_then_output(tmp_path, model, setup):
    controller, activation = setup()
    model.enqueue(content="Hello", usage=(10, 2, 12))
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    # an answer without a tool call is told once that text reaches no one, and the reminder is kept
    assert controller.paths() == [
        "/activation-context",
        "/runner/model",
        "/runner/history/messages",
        "/runner/model",
        "/runner/history/messages",
        "/activation-output",
    ]
    reminder, output = controller.bodies("/runner/history/messages")
    assert reminder["kind"] == "contract_reminder"
    assert reminder["content"] == model.reminders[0].body["messages"][-1]["content"]
    assert output["kind"] == "assistant_output"
    context = controller.context
    assert (context["messageCount"], context["totalChars"], context["firstPrompt"]) == (1, 5, True)
    assert context["messages"] == [{"role": "user", "content": "Start", "chars": 5}]
    assert (context["selectedModel"], context["model"], context["apiModel"]) == ("main", "main", "m1")
    tokens = {"input": 10, "output": 2, "total": 12}
    history = output
    assert (history["role"], history["kind"], history["content"]) == (
        "assistant",
        "assistant_output",
        "Hello",
    )
    assert history["metadata"] == {
        "selectedModel": "main",
        "model": "main",
        "apiModel": "m1",
        "usage": tokens,
    }
    assert controller.output == {
        "text": "Hello",
        "usage": {"selectedModel": "main", "model": "main", "apiModel": "m1", "tokens": tokens},
    }
    [request] = model.requests
    assert request.path == CHAT
    # the controller added the key the runner never had, and read the usage from the answer
    assert request.headers["authorization"] == "Bearer " + API_KEY
    assert "GW_KEY" not in runner_env() and API_KEY not in json.dumps(activation)
    assert [(c.status, c.usage) for c in controller.model_calls] == [(200, tokens), (200, {})]  # and the reminder
    forwarded = controller.bodies("/runner/model")[0]
    assert (forwarded["providerId"], forwarded["presetId"]) == ("gw", "main")
    body = request.body
    # the controller streams upstream and hands the runner the whole answer
    assert (body["model"], body["tool_choice"], body["stream"]) == ("m1", "auto", True)
    names = [tool["function"]["name"] for tool in body["tools"]]
    assert names[:4] == ["messages_send", "coordination_wait_for_signal", "completion_submit", "file_read"]
    assert "shell_exec" in names and "web_fetch" in names
    assert body["messages"] == [{"role": "user", "content": "Start"}]
    assert_clean(result)


@pytest.mark.parametrize("due", [True, False])
def test_a_leader_whose_work_has_come_back_is_offered_its_next_step_alone_after_text(tmp_path, model, setup, due):
    controller, activation = setup()
    text = "Your answer had no tool call, and text alone reaches no one. Everyone you gave work to has answered: call"
    if due:  # the controller's reminder for the activation whose prompt says everyone has answered
        activation["activation"]["reminder"] = {"text": text + " completion_submit now.", "tool": "completion_submit"}
    model.enqueue(content="")
    model.enqueue(model=REMINDER, tool_calls=[("completion_submit", {"report": "sea.md and mountains.md"})])
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    [first] = model.requests
    [reminder] = model.reminders
    assert len(first.body["tools"]) > 1 and first.body["tool_choice"] == "auto"
    offered = [tool["function"]["name"] for tool in reminder.body["tools"]]
    [row] = [b for b in controller.bodies("/runner/history/messages") if b["kind"] == "contract_reminder"]
    assert row["content"] == reminder.body["messages"][-1]["content"]
    if due:
        assert (offered, reminder.body["tool_choice"]) == (["completion_submit"], "required")
        assert row["content"] == text + " completion_submit now."
    else:
        assert offered == [tool["function"]["name"] for tool in first.body["tools"]]
        assert reminder.body["tool_choice"] == "auto" and "Everyone" not in row["content"]
    [submit] = controller.bodies("/toolpacks/core/support")
    assert (submit["tool"], submit["input"]) == ("completion.submit", {"report": "sea.md and mountains.md"})


def test_a_file_written_beside_the_own_artifact_folder_goes_into_it_and_the_model_is_told(tmp_path, model, setup):
    controller, activation = setup()
    artifacts = activation["artifactsRoot"]
    Path(artifacts, "worker").mkdir(parents=True, exist_ok=True)
    model.enqueue(tool_calls=[("file_write", {"path": f"{artifacts}/worker:sea.md", "content": "Sea"})])
    model.enqueue(content="Done")
    assert run_runner(tmp_path, activation).returncode == 0
    assert Path(artifacts, "worker", "sea.md").read_text() == "Sea" and not Path(artifacts, "worker:sea.md").exists()
    # the audit records the write that ran; the model reads where its file went
    [start] = controller.bodies("/runner/tool-calls/start")
    assert start["input"] == {"path": f"{artifacts}/worker/sea.md", "content": "Sea"}
    told = f"Wrote 3 chars to {artifacts}/worker/sea.md (your artifact folder: {artifacts}/worker:sea.md is outside " \
           "your folders)."
    assert tool_messages(model.requests[1]) == [{"role": "tool", "tool_call_id": tool_messages(model.requests[1])[0][
        "tool_call_id"], "content": told}]
    [finish] = controller.bodies("/runner/tool-calls/finish")
    assert finish["output"] == told


def test_history_rows_are_replayed_with_roles_prefixes_and_trimming(tmp_path, model, setup):
    history = [
        history_row(1, "compaction", "history_compaction", "earlier summary"),
        history_row(2, "user", "activation_prompt", "Do it"),
        history_row(3, "assistant", "assistant_output", "ok"),
        history_row(4, "tool_call", "tool_call", "# Tool Call\nTool: file.read"),
        history_row(5, "tool_result", "tool_result", "d" * 200000),
        history_row(6, "user", "tool_boundary_signals", "   "),
    ]
    controller, activation = setup(history=history)
    model.enqueue(content="fine")
    assert run_runner(tmp_path, activation).returncode == 0
    messages = model.requests[0].body["messages"]
    # an activation's closing text ("ok") is for people: the model reads its calls, not its last words
    assert [m["role"] for m in messages] == ["user", "user", "assistant", "user"]
    assert messages[0]["content"] == "# Compacted Agent History\n\nearlier summary"
    assert messages[2]["content"].startswith("# Tool Call Record\n\n# Tool Call")
    long = messages[3]["content"]
    assert long.startswith("# Tool Result Record\n\nddd")
    assert long.endswith("d\n\n[truncated 188022 chars]")
    assert len(long) == 12000 + len("\n\n[truncated 188022 chars]")
    assert controller.context["messageCount"] == 4
    assert controller.context["firstPrompt"] is True


def test_recorded_tool_calls_go_back_as_the_providers_own_tool_messages(tmp_path, model, setup):
    def call(sequence, call_id, tool, arguments, **metadata):
        return history_row(sequence, "tool_call", "tool_call", f"# Tool Call\nTool: {tool}", parts=[
            {"type": "tool_call", "toolCallId": call_id, "toolName": tool, "inputJson": arguments,
             "metadata": metadata}])

    def result(sequence, call_id, tool, **fields):
        return history_row(sequence, "tool_result", "tool_result", f"# Tool Result\nTool: {tool}", parts=[
            dict({"type": "tool_result", "toolCallId": call_id, "toolName": tool}, **fields)])

    history = [
        history_row(1, "user", "activation_prompt", "The user says: Please begin."),
        call(2, "tool_1", "file.write", '{"path":"poem.md","content":"Sea"}'),
        history_row(3, "user", "tool_boundary_signals", "pm says (P1): stop"),
        result(4, "tool_1", "file.write", output="Wrote 3 chars to poem.md"),
        call(5, "tool_2", "file.read", '{"path":"x"}', modelCallId="call_from_the_model"),
        result(6, "tool_2", "file.read", error="No such file: x"),
        call(7, "tool_3", "messages.send", '{"body":"hi"}'),  # never reported back
        history_row(8, "assistant", "assistant_output", "Done"),
    ]
    _, activation = setup(history=history)
    model.enqueue(content="fine")
    assert run_runner(tmp_path, activation).returncode == 0
    messages = model.requests[0].body["messages"]
    assert messages[0] == {"role": "user", "content": "The user says: Please begin."}
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": [{
        "id": "tool_1", "type": "function",
        "function": {"name": "file_write", "arguments": '{"path":"poem.md","content":"Sea"}'}}]}
    # a result follows its call even when another row came between them
    assert messages[2] == {"role": "tool", "tool_call_id": "tool_1", "content": "Wrote 3 chars to poem.md"}
    assert messages[3] == {"role": "user", "content": "pm says (P1): stop"}
    # named as the model named it, when the call was started with that id
    assert messages[4]["tool_calls"][0]["function"]["name"] == "file_read"
    assert messages[4]["tool_calls"][0]["id"] == "call_from_the_model"
    assert messages[5] == {"role": "tool", "tool_call_id": "call_from_the_model", "content": "Error: No such file: x"}
    assert messages[6]["tool_calls"][0]["function"]["name"] == "messages_send"
    assert messages[7] == {"role": "tool", "tool_call_id": "tool_3", "content": runner_calls.NO_RESULT_TEXT}
    # the closing text "Done" reached no one and is not read back
    assert len(messages) == 8 and "Record" not in json.dumps(messages) and "Done" not in json.dumps(messages)


def test_tool_round_trip_writes_the_file_and_feeds_the_result_back(tmp_path, model, setup):
    controller, activation = setup()
    model.enqueue(
        tool_calls=[("file_write", {"path": "notes/a.md", "content": "x", "createDirs": True})],
        usage={
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "total_tokens": 12,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    )
    model.enqueue(content="Done", usage=(5, 1, 6))
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert Path(activation["workspace"], "notes", "a.md").read_text() == "x"
    assert controller.paths() == [
        "/activation-context",
        "/runner/model",
        "/runner/tool-calls/start",
        "/runner/tool-calls/finish",
        "/runner/model",
        "/runner/history/messages",  # no reporting tool ran: the contract reminder
        "/runner/model",
        "/runner/history/messages",
        "/activation-output",
    ]
    [start] = controller.bodies("/runner/tool-calls/start")
    assert (start["tool"], start["input"]) == (
        "file.write",
        {"path": "notes/a.md", "content": "x", "createDirs": True},
    )
    [finish] = controller.bodies("/runner/tool-calls/finish")
    assert finish["status"] == "completed" and finish["output"].startswith("Wrote 1 chars to ")
    second = model.requests[1].body["messages"]
    assert second[1]["role"] == "assistant" and second[1]["content"] == ""
    assert second[1]["tool_calls"][0]["function"]["name"] == "file_write"
    assert second[2]["role"] == "tool" and second[2]["tool_call_id"] == second[1]["tool_calls"][0]["id"]
    # the tool's output as plain text: no envelope a small model mistakes for something to answer
    assert second[2]["content"] == finish["output"]
    assert controller.output["text"] == "Done"
    assert controller.output["usage"]["tokens"] == {"input": 15, "output": 3, "total": 18, "cacheRead": 4}


def test_p1_signal_text_reaches_the_model_after_the_tool_output(tmp_path, model, setup):
    controller, activation = setup()
    controller.queue_p1("Stop and review PR 7.")
    Path(activation["workspace"], "a.txt").write_text("A")
    model.enqueue(tool_calls=[("file_read", {"path": "a.txt"})])
    model.enqueue(content="ok")
    assert run_runner(tmp_path, activation).returncode == 0
    [message] = tool_messages(model.requests[1])
    output = message["content"]
    assert output.startswith("1: A\n\n" + SIGNAL_HEADING)
    assert output.endswith("Stop and review PR 7.")


def test_ending_tool_stops_the_loop_and_ignores_later_calls(tmp_path, model, setup):
    controller, activation = setup()
    controller.support["coordination.wait_for_signal"] = {
        "title": "wait",
        "output": "Waiting; a future signal will start the next activation.",
    }
    model.enqueue(tool_calls=[("coordination_wait_for_signal", {}), ("file_read", {"path": "x"})])
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert len(model.requests) == 1
    assert [b["tool"] for b in controller.bodies("/runner/tool-calls/start")] == [
        "coordination.wait_for_signal"
    ]
    [support] = controller.bodies("/toolpacks/core/support")
    assert (support["tool"], support["input"], support["token"]) == (
        "coordination.wait_for_signal",
        {},
        TOKEN,
    )
    assert controller.output["text"] == "Waiting; a future signal will start the next activation."


def test_an_answer_that_is_only_a_tools_arguments_runs_that_tool(tmp_path, model, setup):
    packs = builtin_toolpacks(["coordination.wait_for_signal", "file.read"])
    for tool in packs[0]["tools"]:
        if tool["name"] == "coordination.wait_for_signal":
            tool["inputSchema"] = {"type": "object", "additionalProperties": False,
                                   "properties": {"reason": {"type": "string"}, "notifyPm": {"type": "boolean"}}}
    controller, activation = setup(toolpacks=packs)
    controller.support["coordination.wait_for_signal"] = {"title": "wait", "output": "Waiting."}
    # no tool name, as the lab's model answered: only the wait tool has the fields `reason` and `notifyPm`
    model.enqueue(content='{\n"reason": "worker-2 has the mountains",\n"notifyPm": false\n}')
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert len(model.requests) == 1
    [start] = controller.bodies("/runner/tool-calls/start")
    assert (start["tool"], start["input"]) == ("coordination.wait_for_signal",
                                               {"reason": "worker-2 has the mountains", "notifyPm": False})
    assert controller.output["text"] == "Waiting."


def test_ended_activation_answers_later_calls_without_posting(tmp_path):
    state = loop.RequestState()
    state.ended = True
    tool = loop.RegisteredTool("file.read", "file_read", "", {}, lambda args: 1 / 0)
    activation = make_input(tmp_path, "http://127.0.0.1:9")
    content = loop.Runner(activation, {}).execute_tool_call(
        state, models.ToolCall("c1", "file_read", "{}"), {"file_read": tool}
    )
    assert content == loop.ENDED_OUTPUT
    assert state.tool_calls == 0


def test_unknown_tool_and_invalid_arguments_go_back_to_the_model(tmp_path, model, setup):
    controller, activation = setup()
    model.enqueue(tool_calls=[("nope_tool", {}), {"name": "file_read", "arguments": "{bad"},
                              ("file_read", {"path": 3}), {"name": "file_read", "arguments": "[1]"}])
    model.enqueue(content="ok")
    assert run_runner(tmp_path, activation).returncode == 0
    answers = [m["content"] for m in tool_messages(model.requests[1])]
    assert answers == [
        'There is no tool named "nope_tool". Your tools are: messages_send, coordination_wait_for_signal, '
        "completion_submit, file_read, file_write, file_patch, shell_exec, web_fetch. Call one of them by its "
        "exact name.",
        "The arguments of file_read are not valid JSON (Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)). Call file_read again with its arguments as one JSON object.",
        'Invalid arguments for file_read: "path" must be string, not a number. Its fields: path (string). Call '
        "file_read again with corrected arguments.",
        "Invalid arguments for file_read: the arguments must be one JSON object. Its fields: path (string). Call "
        "file_read again with corrected arguments.",
    ]
    # none ran, and each is recorded as a refused call with the answer the model read
    assert "/runner/tool-calls/start" not in controller.paths()
    refused = controller.bodies("/runner/tool-calls/refused")
    names = ["nope_tool"] + ["file.read"] * 3
    assert [(r["tool"], r["error"]) for r in refused] == list(zip(names, answers, strict=True))


def test_tool_error_is_recorded_as_failed_and_the_activation_continues(tmp_path, model, setup):
    controller, activation = setup()
    model.enqueue(tool_calls=[("file_read", {"path": "missing.txt"})])
    model.enqueue(content="recovered")
    assert run_runner(tmp_path, activation).returncode == 0
    [finish] = controller.bodies("/runner/tool-calls/finish")
    assert finish["status"] == "failed" and "No such file or directory" in finish["error"]
    [message] = tool_messages(model.requests[1])
    assert message["content"] == finish["error"]
    assert controller.output["text"] == "recovered"


def test_rejected_tool_start_is_a_tool_error_and_the_handler_does_not_run(tmp_path, model, setup):
    controller, activation = setup()
    controller.fail_route("/runner/tool-calls/start", 403, "Tool not allowed for worker: file.write")
    model.enqueue(tool_calls=[("file_write", {"path": "x.txt", "content": "x"})])
    model.enqueue(content="ok")
    assert run_runner(tmp_path, activation).returncode == 0
    [message] = tool_messages(model.requests[1])
    assert message["content"] == "Tool not allowed for worker: file.write"
    assert not Path(activation["workspace"], "x.txt").exists()


def test_a_start_and_a_finish_that_got_a_5xx_are_asked_again_with_the_same_call_key(tmp_path, model, setup):
    controller, activation = setup()
    controller.fail_route("/runner/tool-calls/start", 503, "Service Unavailable", times=2)
    controller.fail_route("/runner/tool-calls/finish", 502, "Bad Gateway", times=1)
    model.enqueue(tool_calls=[("shell_exec", {"command": "echo ran >> runs.txt; echo done"})])
    model.enqueue(tool_calls=[("file_read", {"path": "runs.txt"})])
    model.enqueue(content="ok")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    starts = controller.bodies("/runner/tool-calls/start")
    assert [b["tool"] for b in starts] == ["shell.exec"] * 3 + ["file.read"]
    keys = [b["callKey"] for b in starts]
    assert len(set(keys[:3])) == 1 and keys[3] != keys[0] and all(len(k) == 32 for k in keys)
    assert Path(activation["workspace"], "runs.txt").read_text() == "ran\n"  # the tool ran once
    finishes = controller.bodies("/runner/tool-calls/finish")
    assert finishes[0] == finishes[1] and len(finishes) == 3
    shell_message = tool_messages(model.requests[1])[0]
    assert "done" in shell_message["content"] and "503" not in shell_message["content"]  # the real output
    assert result.stderr.count("/runner/tool-calls/start: Service Unavailable (asking again)") == 2
    assert "/runner/tool-calls/finish: Bad Gateway (asking again)" in result.stderr


def test_a_start_the_controller_never_answers_fails_the_call_after_the_restart_window(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "RESTART_WINDOW_S", 0.2)
    pauses, ran = [], []
    tool = loop.RegisteredTool("shell.exec", "shell_exec", "", {}, ran.append)
    runner = loop.Runner(make_input(tmp_path, "http://127.0.0.1:9"), {}, sleep=pauses.append,
                         warn=lambda *args: None)
    content = runner.execute_tool_call(loop.RequestState(), models.ToolCall("c1", "shell_exec", "{}"),
                                       {"shell_exec": tool})
    assert content.startswith("Suzumio controller request failed:")
    assert ran == [] and pauses and set(pauses) == {loop.CONTROLLER_RETRY_S}


def test_max_iterations_bounds_the_number_of_model_requests(tmp_path, model, setup):
    controller, activation = setup(
        runner_config={
            "mode": "ai",
            "model": "main",
            "maxIterations": 2,
            "models": {
                "providers": {"gw": provider_config(model.base_url)},
                "presets": {"main": {"provider": "gw", "model": "m1"}},
            },
        }
    )
    Path(activation["workspace"], "a.txt").write_text("A")
    for _ in range(3):
        model.enqueue(content="a", tool_calls=[("file_read", {"path": "a.txt"})])
    assert run_runner(tmp_path, activation).returncode == 0
    assert len(model.requests) == 2
    assert controller.output["text"] == "aa"


def test_max_tool_calls_rejects_extra_calls_and_the_loop_continues(tmp_path, model, setup):
    controller, activation = setup(
        runner_config={
            "mode": "ai",
            "model": "main",
            "maxToolCalls": 1,
            "models": {
                "providers": {"gw": provider_config(model.base_url)},
                "presets": {"main": {"provider": "gw", "model": "m1"}},
            },
        }
    )
    Path(activation["workspace"], "a.txt").write_text("A")
    model.enqueue(tool_calls=[("file_read", {"path": "a.txt"}), ("file_read", {"path": "a.txt"})])
    model.enqueue(content="fine")
    assert run_runner(tmp_path, activation).returncode == 0
    assert len(controller.bodies("/runner/tool-calls/start")) == 1
    assert len(controller.bodies("/runner/tool-calls/finish")) == 1
    assert tool_messages(model.requests[1])[1]["content"] == "Exceeded maxToolCalls: 1"
    assert controller.output["text"] == "fine"


def test_no_tools_means_no_tools_field_and_no_tool_choice(tmp_path, model, setup):
    controller, activation = setup(toolpacks=[])
    model.enqueue(content="")
    assert run_runner(tmp_path, activation).returncode == 0
    assert "tools" not in model.requests[0].body and "tool_choice" not in model.requests[0].body
    assert controller.output["text"] == "(model returned no text)"


def test_a_later_activation_reads_no_closing_text_of_earlier_ones_nor_the_placeholder_of_none(tmp_path, model,
                                                                                               setup):
    controller, activation = setup(toolpacks=[])
    model.enqueue(content="")
    assert run_runner(tmp_path, activation).returncode == 0
    [row] = [body for body in controller.bodies("/runner/history/messages") if body["kind"] == "assistant_output"]
    assert row["content"] == "(model returned no text)" and row["metadata"]["noText"] is True
    # the next activation's history holds that row; its model reads the prompts around it, not the placeholder
    # an activation's closing text reached no one; read back, a small model gave it again (doubled)
    history = [history_row(1, content="Start"),
               history_row(2, role="assistant", kind="assistant_output", content=row["content"],
                           metadata=row["metadata"]),
               history_row(3, content="Go on"),
               history_row(4, role="assistant", kind="assistant_output", content="I wrote sea.md."),
               history_row(5, content="And now?")]
    controller, activation = setup(history=history, toolpacks=[])
    model.enqueue(content="done")
    assert run_runner(tmp_path, activation).returncode == 0
    messages = model.requests[-1].body["messages"]
    assert "(model returned no text)" not in json.dumps(messages) and "I wrote sea.md." not in json.dumps(messages)
    assert [m["content"] for m in messages if m["role"] == "user"][-3:] == ["Start", "Go on", "And now?"]


def test_failed_context_post_only_warns(tmp_path, model, setup):
    controller, activation = setup()
    controller.fail_route("/activation-context", 400, "Invalid activation context")
    model.enqueue(content="still fine")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0
    assert "Invalid activation context (activation context not recorded)" in result.stderr


# -- providers, fallback, retries -------------------------------------------------------------


def test_model_http_500_fails_the_run_without_output(tmp_path, model, setup):
    controller, activation = setup()
    for _ in range(4):  # the first try and the controller's three retries
        model.enqueue_error(500, "upstream exploded")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1 and len(model.requests) == 4
    assert "All model attempts failed" in result.stderr
    assert "main: Provider gw returned HTTP 500: upstream exploded" in result.stderr
    assert "/activation-output" not in controller.paths()
    assert_clean(result)


def test_model_list_falls_back_to_the_next_preset(tmp_path, model, setup):
    controller, activation = setup(runner_config=two_presets(model.base_url))
    for _ in range(4):  # three 503s after the first: the controller's retries are used up, then the fallback
        model.enqueue_error(503, "overloaded", model="a", headers={"Retry-After": "0"})
    model.enqueue(content="OK", model="b")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert [r.body["model"] for r in model.requests] == ["a", "a", "a", "a", "b"]
    assert controller.output["text"] == "OK"
    assert (controller.output["usage"]["selectedModel"], controller.output["usage"]["model"]) == ("list", "b")
    contexts = controller.bodies("/activation-context")
    assert [c["context"]["model"] for c in contexts] == ["a", "b"]
    assert "Model attempt a failed" in result.stderr


def test_http_429_and_5xx_are_retried_by_the_controller_within_max_retries(tmp_path, model, setup):
    controller, activation = setup(
        runner_config={
            "mode": "ai",
            "model": "main",
            "models": {
                "providers": {"gw": provider_config(model.base_url, options={"maxRetries": 2})},
                "presets": {"main": {"provider": "gw", "model": "m1"}},
            },
        }
    )
    model.enqueue_error(429, "rate limited", headers={"Retry-After": "0"})
    model.enqueue_error(502, "bad gateway", headers={"Retry-After": "0"})
    model.enqueue(content="third time")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert len(model.requests) == 3
    assert controller.output["text"] == "third time"
    assert "Model attempt main failed" not in result.stderr


def attempt_for(base_url, preset=None, **provider_extra):
    provider = provider_config(base_url, **provider_extra)
    return models.Attempt("main", preset or {"provider": "gw", "model": "m1"}, "gw", provider)


def straight_to(model, sent=None):
    """A provider transport without the controller hop, for the provider's own logic (body, retries,
    parsing); `sent` collects (provider id, preset id, timeout). test_model_proxy covers the hop."""

    def transport(provider_id, preset_id, body, timeout):
        if sent is not None:
            sent.append((provider_id, preset_id, timeout))
        return models.http_request(
            "POST",
            model.base_url + "/chat/completions",
            {"Content-Type": "application/json"},
            json.dumps(body).encode("utf-8"),
            None,
            10.0,
            10.0,
        )

    return transport


def test_the_runner_itself_never_retries_the_controller_has(model):
    provider = models.OpenAICompatibleProvider(
        attempt_for(model.base_url, options={"maxRetries": 3}), straight_to(model), sleep=pytest.fail
    )
    model.enqueue_error(429, "slow")
    with pytest.raises(models.ModelError, match="HTTP 429"):
        provider.complete([{"role": "user", "content": "x"}], [], None)
    model.enqueue_error(400, "bad request")
    with pytest.raises(models.ModelError, match="HTTP 400"):
        provider.complete([{"role": "user", "content": "x"}], [], None)
    assert len(model.requests) == 2


def test_provider_timeout_fails_the_attempt_and_the_next_preset_runs(tmp_path, model, setup):
    controller, activation = setup(runner_config=two_presets(model.base_url, timeoutMs=500))
    model.enqueue(content="too late", delay=2.0, model="a")
    model.enqueue(content="B answered", model="b")
    started = time.monotonic()
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 10
    assert "Model attempt a failed: Request to provider gw failed: timed out" in result.stderr
    assert controller.output["text"] == "B answered"


def test_request_body_maps_preset_and_provider_options(model):
    preset = {
        "provider": "gw",
        "model": "local",
        "apiModel": "remote",
        "maxOutputTokens": 99,
        "temperature": 0.2,
        "topP": 0.9,
        "topK": 5,
        "reasoningEffort": "high",
        "headers": {"X-Preset": "p"},
        "providerOptions": {
            "openaiCompatible": {"seed": 1, "user": "u"},
            "gw": {"parallel_tool_calls": False},
        },
    }
    sent = []
    provider = models.OpenAICompatibleProvider(
        attempt_for(None, preset, baseURL=None, timeoutMs=2000), straight_to(model, sent)
    )
    model.enqueue(
        content="ok",
        usage={
            "prompt_tokens": 3,
            "completion_tokens": 4,
            "total_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 2},
            "prompt_tokens_details": {"cached_tokens": 1},
        },
    )
    tools = [{"name": "file_read", "description": "d", "parameters": {"type": "object"}}]
    turn = provider.complete([{"role": "user", "content": "x"}], tools, "required")
    assert turn.usage == {"input": 3, "output": 4, "total": 7, "reasoning": 2, "cacheRead": 1}
    [request] = model.requests
    body = request.body
    assert body["model"] == "remote" and body["max_tokens"] == 99 and body["temperature"] == 0.2
    assert body["top_p"] == 0.9 and "top_k" not in body and "topK" not in body
    assert body["seed"] == 1 and "user" not in body and body["parallel_tool_calls"] is False
    assert body["reasoning_effort"] == "high" and body["tool_choice"] == "required"
    assert body["tools"] == [
        {
            "type": "function",
            "function": {"name": "file_read", "description": "d", "parameters": {"type": "object"}},
        }
    ]
    # the runner names provider and preset; the controller bounds the call, which may wait there its turn
    assert sent == [("gw", "main", None)]


def test_the_runner_waits_without_limit_since_the_controller_bounds_the_call_and_queues_it():
    assert models.model_call_timeout({}) is None
    assert models.model_call_timeout({"timeoutMs": False, "chunkTimeoutMs": 100}) is None
    # a provider's deadline bounds each exchange in the controller, not the wait for a turn before it
    assert models.model_call_timeout({"timeoutMs": 500}) is None
    assert models.model_call_timeout({"timeoutMs": 500, "options": {"maxRetries": 0}}) is None


def test_later_provider_types_fail_the_attempt():
    attempt = models.Attempt("main", {}, "gg", {"type": "google"})
    with pytest.raises(models.ModelError, match="Provider type google is not supported by this version"):
        models.create_provider(attempt, {}, None)


def test_tool_calls_without_ids_get_generated_ids(model):
    model.enqueue(
        body={
            "choices": [
                {
                    "message": {
                        "content": None,
                        "tool_calls": [
                            {
                                "type": "function",
                                "function": {"name": "file_read", "arguments": {"path": "a"}},
                            }
                        ],
                    }
                }
            ]
        }
    )
    turn = models.OpenAICompatibleProvider(attempt_for(model.base_url), straight_to(model)).complete([], [], None)
    [call] = turn.tool_calls
    assert call.id.startswith("call_") and json.loads(call.arguments) == {"path": "a"}
    assert turn.text == "" and turn.usage == {}


def test_expand_preset_flattens_lists_and_reports_errors():
    providers = {"gw": {"type": "openai-compatible"}}
    presets = {
        "a": {"provider": "gw", "model": "a"},
        "b": {"provider": "gw", "model": "b"},
        "l1": {"model-list": ["a", "l2", "a"]},
        "l2": {"modelList": ["b"]},
        "loop": {"model-list": ["x"]},
        "x": {"model-list": ["loop"]},
        "bare": {"provider": "gw"},
        "lost": {"provider": "nope", "model": "m"},
    }
    cfg = {"providers": providers, "presets": presets}
    assert [a.preset_id for a in models.expand_preset(cfg, "l1")] == ["a", "b", "a"]
    for preset, message in (
        ("loop", "Circular model-list preset: loop -> x -> loop"),
        ("ghost", "Model preset not found: ghost"),
        ("bare", "Model preset needs provider and model: bare"),
        ("lost", "Provider not found: nope"),
    ):
        with pytest.raises(models.ModelError) as caught:
            models.expand_preset(cfg, preset)
        assert str(caught.value) == message


# -- proxies ----------------------------------------------------------------------------------


def test_controller_calls_bypass_the_proxy_while_the_controller_sends_model_calls_through_its_own(
    tmp_path, model, setup
):
    proxy = RecordingProxy()
    try:
        controller, activation = setup(environ={"GW_KEY": API_KEY, "HTTP_PROXY": proxy.url})
        model.enqueue(content="via proxy")
        result = run_runner(tmp_path, activation, env=runner_env(HTTP_PROXY=proxy.url, http_proxy=proxy.url))
        assert result.returncode == 0, result.stderr
        # the model requests (the answer and the contract reminder) went through the controller's
        # HTTP_PROXY; no runner call went there
        assert proxy.seen == [("POST", model.base_url + "/chat/completions")] * 2
        assert model.requests[0].headers["authorization"] == "Bearer " + API_KEY
        assert controller.output["text"] == "via proxy"
    finally:
        proxy.close()


def test_socks_only_proxy_of_the_controller_fails_the_attempt_and_fallback_applies(tmp_path, model, setup):
    runner_config = two_presets(model.base_url)
    runner_config["models"]["providers"]["direct"] = provider_config(model.base_url)
    runner_config["models"]["presets"]["b"]["provider"] = "direct"
    _, activation = setup(runner_config=runner_config, environ={"ALL_PROXY": "socks5://127.0.0.1:1080"})
    model.enqueue(content="never", model="a")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert "a: Request to provider gw failed: Proxy protocol socks5: (from ALL_PROXY) is not supported" in (
        result.stderr
    )
    assert "b: Request to provider direct failed: Proxy protocol socks5" in result.stderr
    assert model.requests == []


# -- compaction -------------------------------------------------------------------------------


def twenty_rows():
    rows = [history_row(1, content="# Agent Identity\nGoal: prove lemma 4 in /workspace/proof/main.lean")]
    rows += [
        history_row(
            i,
            "assistant" if i % 2 else "user",
            "assistant_output" if i % 2 else "activation_prompt",
            f"row {i} touched src/mod{i}.py",
        )
        for i in range(2, 21)
    ]
    return rows


def test_context_overflow_compacts_history_and_retries(tmp_path, model, setup):
    controller, activation = setup(history=twenty_rows())
    model.enqueue_context_overflow()
    model.enqueue(content="S")
    model.enqueue(content="final answer")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert (
        "context overflow from main; compacting agent history and retrying activation act_1" in result.stderr
    )
    summary_request = model.requests[1].body
    assert "tools" not in summary_request and summary_request["max_tokens"] <= 4000
    [message] = summary_request["messages"]
    assert (
        "# Agent History To Compact" in message["content"]
        and "## 1 user activation_prompt" in message["content"]
    )
    [compact] = controller.bodies("/runner/history/compact")
    assert compact["summary"] == "S" and compact["reason"] == "provider_context_overflow"
    assert compact["keepTail"] == 12 and compact["selectedModel"] == "main"
    retry = model.requests[2].body
    assert retry["messages"][0] == {"role": "user", "content": "# Compacted Agent History\n\nS"}
    # the twelve rows kept: six prompts read back, six closing texts that are not
    assert len(retry["messages"]) == 7 and "tools" in retry
    assert len(controller.bodies("/activation-context")) == 2
    assert controller.context["messageCount"] == 7
    assert controller.output["text"] == "final answer"


def test_overflow_with_nothing_to_archive_posts_the_fallback_without_a_summary_request(
    tmp_path, model, setup
):
    controller, activation = setup()
    model.enqueue_context_overflow()
    model.enqueue(content="answer")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    assert len(model.requests) == 2
    [compact] = controller.bodies("/runner/history/compact")
    assert compact["keepTail"] == 1
    assert "No pre-activation segment was available" in compact["summary"]
    assert "Archived sequence range: (none)" in compact["summary"]
    assert model.requests[1].body["messages"] == [{"role": "user", "content": "Start"}]


def test_second_overflow_fails_the_attempt(tmp_path, model, setup):
    controller, activation = setup(history=twenty_rows())
    model.enqueue_context_overflow()
    model.enqueue(content="S")
    model.enqueue_context_overflow()
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert "maximum context length" in result.stderr
    assert len(controller.bodies("/runner/history/compact")) == 1
    assert "/activation-output" not in controller.paths()


def test_summary_failure_posts_the_deterministic_fallback_and_retries(tmp_path, model, setup):
    controller, activation = setup(history=twenty_rows())
    model.enqueue_context_overflow()
    model.enqueue_error(400, "summary broke")
    model.enqueue(content="after fallback")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    [compact] = controller.bodies("/runner/history/compact")
    summary = compact["summary"]
    assert summary.startswith("## Goal\n# Agent Identity")
    assert "maximum context length" in summary and "summary broke" in summary
    assert "Archived sequence range: 1-8 (8 messages)" in summary
    assert "- src/mod8.py" in summary
    assert model.requests[2].body["messages"][0]["content"].startswith("# Compacted Agent History\n\n## Goal")
    assert controller.output["text"] == "after fallback"


def test_failed_compaction_route_fails_the_attempt(tmp_path, model, setup):
    controller, activation = setup(history=twenty_rows())
    controller.fail_route(
        "/runner/history/compact", 409, "Activation act_1 is cancelled; history updates are not accepted"
    )
    model.enqueue_context_overflow()
    model.enqueue(content="S")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert "main: Activation act_1 is cancelled; history updates are not accepted" in result.stderr


def test_retry_tail_count_keeps_at_most_twelve_rows_within_the_budget():
    assert loop.retry_tail_count([]) == 0
    assert loop.retry_tail_count([history_row(1)]) == 1
    assert loop.retry_tail_count([history_row(i) for i in range(1, 30)]) == 12
    big = [history_row(i, "assistant", "assistant_output", "x" * 30000) for i in range(1, 10)]
    assert loop.retry_tail_count(big) == 2
    capped = [history_row(i, "assistant", "assistant_output", "y" * 200000) for i in range(1, 5)]
    assert loop.retry_tail_count(capped) == 1


def test_summary_input_respects_per_row_caps_and_the_total_budget():
    rows = [
        history_row(1, "tool_result", "tool_result", "t" * 200000),
        history_row(
            2, "tool_result", "tool_result", "u" * 200000, activationId="act_0", compactionId="cmp_0"
        ),
    ]
    text = loop.summary_input(rows)
    assert text.count("[truncated") == 2 and len(text) < 7000
    assert "Activation: act_0\nArchived by: cmp_0" in text
    many = [history_row(i, "assistant", "assistant_output", "z" * 20000) for i in range(1, 20)]
    assert len(loop.summary_input(many)) <= 80000


def test_fallback_summary_is_capped_and_recovers_paths():
    archived = [
        history_row(i, "tool_result", "tool_result", f"see /workspace/out/r{i}.txt, and more")
        for i in range(1, 40)
    ]
    text = loop.fallback_summary(archived, archived, 3, "worker", "main", "E" * 5000, "no summary")
    assert len(text) <= 20000
    for heading in (
        "## Goal",
        "## Constraints & Preferences",
        "## Progress",
        "### Done",
        "### In Progress",
        "### Blocked",
        "## Key Decisions",
        "## Next Steps",
        "## Critical Context",
        "## Relevant Files",
    ):
        assert heading in text
    files = text.split("## Relevant Files\n", 1)[1].split("\n")
    assert len(files) == 10 and files[0] == "- /workspace/out/r30.txt" and files[-1].endswith("r39.txt")
    assert "E" * 701 not in text and "no summary" in text
    assert "Archived sequence range: 1-39 (39 messages)" in text


def test_overflow_detection_reads_text_not_status():
    assert models.is_context_overflow(models.ModelError("HTTP 500: Prompt is too long", 500))
    assert not models.is_context_overflow(models.ModelError("HTTP 400: bad request", 400))
    try:
        try:
            raise ValueError("input exceeds the limit")
        except ValueError as cause:
            raise RuntimeError("wrapper") from cause
    except RuntimeError as wrapped:
        assert models.is_context_overflow(wrapped)


# -- scripted provider ------------------------------------------------------------------------


SCRIPT = {
    "agents": {
        "pm": [{"steps": [{"say": "pm only"}]}],
        "worker-*": [
            {"when": "Agent Identity", "steps": [{"say": "never"}]},
            {
                "when": "Write the result",
                "steps": [
                    {
                        "say": "Writing.",
                        "tools": [
                            {
                                "name": "file.write",
                                "input": {
                                    "path": "{artifacts}/result.txt",
                                    "content": "42 by {agent} in {project} {keep}",
                                },
                            }
                        ],
                    },
                    {
                        "tools": [
                            {
                                "name": "messages.send",
                                "input": {
                                    "recipient": "pm",
                                    "body": "Ready in {artifacts:worker-1}/result.txt; ws {workspace}",
                                },
                            }
                        ]
                    },
                    {"say": " Done."},
                ],
            },
            {"steps": [{"say": "fallback entry"}]},
        ],
    }
}


def scripted_runner():
    return {
        "mode": "ai",
        "model": "offline",
        "models": {
            "providers": {"replay": {"type": "scripted", "script": SCRIPT}},
            "presets": {"offline": {"provider": "replay", "model": "team"}},
        },
    }


def scripted_prompt(body):
    return (
        f"# Agent Identity\nYou are worker-1.\n\n# New Signals\n\n## Message from pm\n{body}\n\n"
        "# Tool And Reporting Contract\nUse tools."
    )


def scripted_setup(tmp_path, controllers, prompt, history=None):
    history = history or [history_row(1, content=prompt)]
    controller = controllers(history=history, agent_id="worker-1")
    activation = make_input(
        tmp_path, controller.url, runner=scripted_runner(), prompt=prompt, history=history
    )
    activation["agent"]["id"] = "worker-1"
    Path(activation["artifactsRoot"], "worker-1").mkdir()
    activation["writeRoots"][1] = activation["artifactsRoot"] + "/worker-1"
    return controller, activation


def test_scripted_provider_replays_the_matching_entry_with_placeholders(tmp_path, controllers):
    prompt = scripted_prompt("Write the result to the file.")
    controller, activation = scripted_setup(tmp_path, controllers, prompt)
    result = run_runner(tmp_path, activation, env=runner_env(GW_KEY=""))
    assert result.returncode == 0, result.stderr
    artifacts = activation["artifactsRoot"]
    assert Path(artifacts, "worker-1", "result.txt").read_text() == "42 by worker-1 in demo {keep}"
    [send] = controller.bodies("/toolpacks/core/support")
    assert send["input"] == {
        "recipient": "pm",
        "body": "Ready in {}/worker-1/result.txt; ws {}".format(artifacts, activation["workspace"]),
    }
    assert [b["tool"] for b in controller.bodies("/runner/tool-calls/start")] == [
        "file.write",
        "messages.send",
    ]
    # each step went to the controller with the request it answers, as a provider's answer
    steps = controller.bodies("/runner/model")
    assert [[c["function"]["name"] for c in b["scripted"]["choices"][0]["message"].get("tool_calls", [])]
            for b in steps] == [["file_write"], ["messages_send"], []]
    assert steps[0]["body"]["model"] == "team" and steps[0]["body"]["messages"][-1]["content"] == prompt
    [history] = controller.bodies("/runner/history/messages")
    assert history["metadata"]["scriptedEntry"] == 1
    assert history["metadata"]["usage"] == {"input": 0, "output": 0, "total": 0}
    assert controller.output["text"] == "Writing. Done."
    assert controller.output["usage"]["apiModel"] == "team"


def test_scripted_provider_skips_played_entries_and_matches_only_the_signals_block(tmp_path, controllers):
    prompt = scripted_prompt("Anything else")
    played = history_row(2, "assistant", "assistant_output", "x", metadata={"scriptedEntry": 1})
    controller, activation = scripted_setup(
        tmp_path, controllers, prompt, [history_row(1, content=prompt), played]
    )
    assert run_runner(tmp_path, activation).returncode == 0
    assert controller.output["text"] == "fallback entry"
    assert output_rows(controller)[0]["metadata"]["scriptedEntry"] == 2


def test_scripted_provider_without_entry_answers_no_scripted_turn(tmp_path, controllers):
    prompt = scripted_prompt("x")
    played = [history_row(2, "assistant", "assistant_output", "x", metadata={"scriptedEntry": 2})]
    controller, activation = scripted_setup(
        tmp_path, controllers, prompt, [history_row(1, content=prompt)] + played
    )
    activation["runner"]["models"]["providers"]["replay"]["script"] = {
        "agents": {"worker-*": [{"when": "never matches", "steps": [{"say": "no"}]}]}
    }
    assert run_runner(tmp_path, activation).returncode == 0
    assert controller.output["text"] == "No scripted turn for worker-1."
    assert "scriptedEntry" not in output_rows(controller)[0]["metadata"]


def test_new_signals_block_ends_at_the_last_contract_heading():
    prompt = (
        "# Agent Identity\nA\n# New Signals\nbody\n# Tool And Reporting Contract\ninside body\n"
        "# Tool And Reporting Contract\nboilerplate"
    )
    block = models.new_signals_block(prompt)
    assert "inside body" in block and "boilerplate" not in block and "Agent Identity" not in block
    # the user message of an activation is its signals and nothing else
    assert models.new_signals_block("The user says: Start") == "The user says: Start"


# -- local toolpacks through the Node host ----------------------------------------------------


RUNNER_MODULE = """
export async function createRunnerToolpack(context) {
  return {
    tools: {
      "review.summarize": async (input) => ({
        title: "review", output: "summary of " + input.text + " in " + context.workspace,
        metadata: {toolpack: context.toolpackId},
      }),
      "review.ask": async (input) => context.callSupport("review.ask", input),
      "review.bad": async () => ({nothing: true}),
    },
  };
}
"""


def review_toolpack(tmp_path, declared=("review.summarize", "review.ask", "review.bad")):
    root = tmp_path / "review"
    root.mkdir(exist_ok=True)
    (root / "runner.mjs").write_text(RUNNER_MODULE)
    tools = [tool_def("review.summarize"), tool_def("review.ask"), tool_def("review.bad")]
    return {
        "id": "review-tools",
        "tools": tools,
        "runnerModule": str(root / "runner.mjs"),
        "declaredTools": list(declared),
        "supportPath": "/toolpacks/review-tools/support",
    }


@pytest.fixture
def node():
    if shutil.which("node") is None or not (REPO / "suzumio_toolpack_host.mjs").exists():
        require("node")("node or suzumio_toolpack_host.mjs is not available")


def test_local_toolpack_tools_run_in_the_node_host(tmp_path, model, setup, node):
    controller, activation = setup(toolpacks=builtin_toolpacks({"file.read"}) + [review_toolpack(tmp_path)])
    controller.support["review.ask"] = {"output": "controller says hi"}
    model.enqueue(
        tool_calls=[("review_summarize", {"text": "PR 7"}), ("review_ask", {"q": 1}), ("review_bad", {})]
    )
    model.enqueue(content="reviewed")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 0, result.stderr
    names = [tool["function"]["name"] for tool in model.requests[0].body["tools"]]
    assert names == ["file_read", "review_summarize", "review_ask", "review_bad"]
    summarize, ask, bad = tool_messages(model.requests[1])
    assert summarize["content"] == "summary of PR 7 in {}".format(activation["workspace"])
    assert ask["content"] == "controller says hi"
    assert bad["content"] == "Runner tool review.bad returned an invalid result"
    [support] = controller.bodies("/toolpacks/review-tools/support")
    assert (support["tool"], support["input"], support["token"]) == ("review.ask", {"q": 1}, TOKEN)
    assert [b["tool"] for b in controller.bodies("/runner/tool-calls/start")] == [
        "review.summarize",
        "review.ask",
        "review.bad",
    ]


def test_undeclared_handler_fails_registration_for_every_agent(tmp_path, model, setup, node):
    pack = review_toolpack(tmp_path, declared=("review.summarize", "review.other"))
    pack["tools"] = pack["tools"][:1]
    _, activation = setup(toolpacks=[pack])
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert "main: Runner module for review-tools did not register review.other" in result.stderr
    assert model.requests == []


def test_missing_node_is_a_clear_registration_error(tmp_path):
    activation = make_input(tmp_path, "http://127.0.0.1:9", toolpacks=[review_toolpack(tmp_path)])
    instance = loop.Runner(activation, {}, node=str(tmp_path / "no-node-here"))
    with pytest.raises(loop.RunnerError, match=r"Node.js is required to run local toolpack runner modules"):
        instance.register_tools([])


@pytest.mark.parametrize(
    "toolpacks,message",
    [
        ([{"id": "x", "runnerModule": "builtin:x", "tools": []}], "Unknown built-in runner toolpack: x"),
        (
            [{"id": "core", "runnerModule": "builtin:core", "tools": [tool_def("file.reed")]}],
            "Runner module for core did not register file.reed",
        ),
        (builtin_toolpacks({"file.read"}) * 2, "Duplicate runner tool: file.read"),
    ],
)
def test_tool_registration_errors(tmp_path, toolpacks, message):
    activation = make_input(tmp_path, "http://127.0.0.1:9", toolpacks=toolpacks)
    with pytest.raises(loop.RunnerError) as caught:
        loop.Runner(activation, {}).register_tools([])
    assert str(caught.value) == message


def test_colliding_safe_names_are_rejected(tmp_path, node):
    pack = review_toolpack(tmp_path, declared=("review.summarize",))
    pack["tools"] = [tool_def("review.summarize")]
    clash = {"id": "core", "runnerModule": "builtin:core", "tools": [tool_def("file.read")]}
    pack_two = dict(
        pack, id="other", tools=[tool_def("review_summarize")], declaredTools=["review_summarize"]
    )
    (tmp_path / "review" / "runner.mjs").write_text(
        "export default () => ({'review.summarize': async () => ({output: ''}), "
        "'review_summarize': async () => ({output: ''})});"
    )
    activation = make_input(tmp_path, "http://127.0.0.1:9", toolpacks=[clash, pack, pack_two])
    bridges = []
    try:
        with pytest.raises(loop.RunnerError) as caught:
            loop.Runner(activation, {}).register_tools(bridges)
    finally:
        for bridge in bridges:
            bridge.close()
    assert (
        str(caught.value) == "Tool names review.summarize and review_summarize both map to review_summarize"
    )


def test_local_roots_replace_container_paths_in_descriptions(tmp_path):
    activation = make_input(tmp_path, "http://127.0.0.1:9", toolpacks=builtin_toolpacks({"file.read"}))
    [tool] = loop.Runner(activation, {}).register_tools([])
    assert "/workspace" not in tool.description and activation["workspace"] in tool.description
    assert activation["artifactsRoot"] in tool.description
    assert tool.schema["properties"]["path"]["description"] == "Path under {}.".format(
        activation["workspace"]
    )


# -- exit codes, errors, signals and secrets --------------------------------------------------


def test_missing_input_argument_exits_1(tmp_path):
    result = subprocess.run(
        [sys.executable, str(runner.__file__)], capture_output=True, text=True, timeout=30, check=False
    )
    assert (result.returncode, result.stderr.strip()) == (1, "--input is required")
    result = subprocess.run(
        [sys.executable, str(runner.__file__), "--input", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Cannot read input file %s: [Errno 2]" % (tmp_path / "none.json"))
    assert result.stderr.strip().endswith("[2]")


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: a["runner"].pop("models"), "runner.models is required in ai mode"),
        (
            lambda a: a["runner"].pop("model"),
            "No model preset selected. Set backend.runner.model or agents.<id>.model explicitly.",
        ),
        (lambda a: a["agent"].update(model="ghost"), "Model preset not found: ghost"),
        (
            lambda a: a["runner"]["models"]["providers"]["gw"].update(type="google"),
            (
                "All model attempts failed:\nmain: Provider type google is not supported by this version "
                "(use openai-compatible, anthropic or scripted)"
            ),
        ),
    ],
)
def test_configuration_errors_exit_1_with_the_message(tmp_path, model, setup, change, message):
    controller, activation = setup()
    change(activation)
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(message)
    assert "/activation-output" not in controller.paths()


def test_rejected_output_exits_1_with_the_controller_error(tmp_path, model, setup):
    controller, activation = setup()
    controller.fail_route("/activation-output", 403, "Invalid agent token")
    model.enqueue(content="Hello")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert result.stderr.strip() == "Invalid agent token"


def test_unreachable_controller_exits_1_with_a_hint(tmp_path, model):
    activation = make_input(tmp_path, "http://127.0.0.1:9", model.base_url)
    model.enqueue(content="Hello")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert result.stderr.startswith("Suzumio controller request failed:")
    assert "http://127.0.0.1:9" in result.stderr and "--runner-listen" in result.stderr
    assert_clean(result)


def test_unreachable_runner_socket_exits_1_naming_the_socket(tmp_path, model):
    socket_path = tmp_path / "run" / "runner.sock"
    activation = make_input(tmp_path, f"unix://{socket_path}", model.base_url)
    model.enqueue(content="Hello")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert result.stderr.startswith("Suzumio controller request failed:")
    assert f"runner socket {socket_path}" in result.stderr
    assert_clean(result)


def test_controller_client_speaks_http_over_the_runner_socket(tmp_path):
    import suzumio_api
    import suzumio_runner_support
    import suzumio_store
    from suzumio_runner_loop import ControllerClient, ControllerError

    root = suzumio_store.Root(tmp_path / "root")
    socket_path = tmp_path / "s.sock"
    server = suzumio_api.Server(suzumio_runner_support.make_runner_app(root, None, None), threads=16,
                                unix_socket=socket_path).start()
    try:
        client = ControllerClient(f"unix://{socket_path}", {"project": "ghost", "agentId": "pm",
                                                             "activationId": "act_1", "token": "t"})
        with pytest.raises(ControllerError) as caught:
            client.post("/runner/signals", {"kind": "x.note"})
        assert (str(caught.value), caught.value.status) == ("Unknown project: ghost", 404)
        with pytest.raises(ControllerError) as caught:
            client.post("/api/projects", {})
        assert (str(caught.value), caught.value.status) == ("not found", 404)
    finally:
        server.close()
        root.close()
    assert not socket_path.exists()  # a closed server removes its own socket


def test_secrets_in_provider_errors_are_redacted(tmp_path, model, setup):
    runner_config = {
        "mode": "ai",
        "model": "main",
        "models": {
            "providers": {
                "gw": provider_config(
                    model.base_url, apiKey="inline-key-123", headers={"X-Api-Key": "hk-77-header-secret"}
                )
            },
            "presets": {"main": {"provider": "gw", "model": "m1"}},
        },
    }
    _, activation = setup(runner_config=runner_config)
    assert "inline-key-123" not in json.dumps(activation) and "hk-77-header-secret" not in json.dumps(activation)
    # the controller redacts the key and the secret header from the answer, the runner its own token
    model.enqueue_error(401, f"bad key inline-key-123 for token {TOKEN} and hk-77-header-secret")
    result = run_runner(tmp_path, activation)
    assert result.returncode == 1
    assert "bad key <redacted> for token <redacted> and <redacted>" in result.stderr
    for secret in ("inline-key-123", TOKEN, "hk-77-header-secret"):
        assert secret not in result.stderr
    assert model.requests[0].headers["authorization"] == "Bearer inline-key-123"


def test_sigterm_stops_shell_commands_and_exits_143_without_output(tmp_path, model, setup):
    controller, activation = setup()
    pid_file = Path(activation["workspace"], "pid")
    model.enqueue(tool_calls=[("shell_exec", {"command": "echo $$ > pid; exec sleep 300"})])
    process = start_runner(tmp_path, activation, env=runner_env(HOME=str(tmp_path)))
    try:
        wait_until(
            lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=20, message="shell started"
        )
        pgid = int(pid_file.read_text())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 143
        assert "Received SIGTERM" in process.stderr.read()
        wait_until(lambda: not tools.group_alive(pgid), timeout=4, message="shell group gone")
        assert "/activation-output" not in controller.paths()
    finally:
        if process.poll() is None:
            process.kill()
        process.stdout.close()
        process.stderr.close()


def test_format_error_appends_cause_and_code():
    error = loop.RunnerError("Cannot read input file x")
    error.__cause__ = FileNotFoundError(2, "No such file or directory")
    assert runner.format_error(error) == "Cannot read input file x: [Errno 2] No such file or directory [2]"
    assert runner.format_error(loop.RunnerError("plain")) == "plain"


# -- delivery constraints ---------------------------------------------------------------------


RUNNER_MODULES = (
    "suzumio_runner.py",
    "suzumio_runner_loop.py",
    "suzumio_runner_tools.py",
    "suzumio_runner_models.py",
    "suzumio_runner_egress.py",
    "suzumio_runner_files.py",
    "suzumio_runner_calls.py",
)
# Imported only by an activation whose agent has a sandbox-side MCP server.
ALL_RUNNER_MODULES = (*RUNNER_MODULES, "suzumio_runner_mcp.py")


@pytest.mark.parametrize("name", ALL_RUNNER_MODULES)
def test_runner_files_parse_as_python_39_and_import_only_the_standard_library(name):
    source = (REPO / name).read_text()
    tree = ast.parse(source, feature_version=(3, 9))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
        # No annotations at all: `X | None` in one would fail at import on 3.9.
        assert not isinstance(node, ast.AnnAssign)
        if isinstance(node, ast.FunctionDef):
            assert node.returns is None and all(a.annotation is None for a in node.args.args)
    assert imported - set(sys.stdlib_module_names) <= {Path(other).stem for other in ALL_RUNNER_MODULES}
    assert "/mnt" not in source and "/opt/suzumio" not in source


def test_backend_delivers_every_runner_module():
    assert set(ALL_RUNNER_MODULES) <= set(suzumio_backend.RUNNER_FILES)
    # The Swarm node gateway runs in its own service (with suzumio_runner_egress), not in an activation.
    delivered = {path.name for path in REPO.glob("suzumio_runner*.py")} - {"suzumio_runner_support.py",
                                                                           "suzumio_runner_gateway.py"}
    assert delivered <= set(ALL_RUNNER_MODULES)


@pytest.mark.parametrize("missing", RUNNER_MODULES[1:])
def test_runner_names_a_missing_runner_file(tmp_path, setup, missing):
    _, activation = setup()
    copy = tmp_path / "opt"
    copy.mkdir()
    for name in RUNNER_MODULES:
        if name != missing:
            shutil.copy(REPO / name, copy)
    # Started as the local backend starts it: without `site`, so an installed suzumio cannot stand in.
    result = subprocess.run(
        [
            sys.executable,
            *suzumio_backend_local.LOCAL_RUNNER_FLAGS,
            str(copy / "suzumio_runner.py"),
            "--input",
            str(write_input(tmp_path, activation)),
        ],
        cwd=activation["workspace"],
        env=runner_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Runner file not found: %s" % (copy / missing))


def test_runner_runs_from_a_copy_outside_the_repository(tmp_path, model, setup):
    _, activation = setup()
    copy = tmp_path / "opt"
    copy.mkdir()
    for name in RUNNER_MODULES:
        shutil.copy(REPO / name, copy)
    model.enqueue(content="Hi")
    result = run_runner(tmp_path, activation, runner_path=copy / "suzumio_runner.py")
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in (copy / "__pycache__").iterdir()) == sorted(
        f"{Path(name).stem}.{sys.implementation.cache_tag}.pyc" for name in RUNNER_MODULES[1:]
    )
