"""Tool calls as real models make them (suzumio_runner_calls): names with dots or underscores, calls written in
the text, and the answers to calls that cannot run."""
import json

import pytest

import suzumio_runner_calls as calls

TOOLS = {"file_write": "W", "messages_send": "S", "completion_submit": "C"}


@pytest.mark.parametrize("name, meant", [
    ("file_write", "W"), ("file.write", "W"), ("File_Write", "W"), ("functions.file_write", "W"),
    ("messages.send", "S"), ("message.created", None), ("write", None), ("", None), (None, None),
])
def test_a_tool_is_found_by_its_model_name_its_dotted_name_or_another_case(name, meant):
    assert calls.resolve_tool(name, TOOLS) == meant


def test_calls_in_tool_call_tags_are_read_and_their_arguments_kept():
    text = ('I will write it.\n<tool_call>\n{"name": "file_write", "arguments": {"path": "a.md", "content": "x"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "completion_submit", "arguments": "{\\"report\\": \\"done\\"}"}')
    found = calls.calls_in_text(text)
    assert [(c.name, json.loads(c.arguments)) for c in found] == [
        ("file_write", {"path": "a.md", "content": "x"}), ("completion_submit", {"report": "done"})]
    assert len({c.id for c in found}) == 2


@pytest.mark.parametrize("text, names", [
    ('```json\n{"name": "messages.send", "arguments": {"recipient": "pm", "body": "hi"}}\n```', ["messages.send"]),
    ('{"name": "file_write", "parameters": {"path": "p", "content": "c"}}', ["file_write"]),
    ('```\n[{"name": "a", "arguments": {}}, {"function": {"name": "b", "arguments": {}}}]\n```', ["a", "b"]),
    ("Here is the poem:\n\nThe sea {is} wide.", []),
    ('```json\n{"path": "a.md"}\n```', []),
    ('{"name": 3, "arguments": {}}', []),
    ("", []),
])
def test_a_json_answer_or_block_naming_a_tool_is_a_call_and_other_text_is_not(text, names):
    assert [c.name for c in calls.calls_in_text(text)] == names


def test_an_answer_that_is_only_one_tools_arguments_is_that_tools_call():
    wait = {"type": "object", "properties": {"reason": {"type": "string"}, "notifyPm": {"type": "boolean"}},
            "additionalProperties": False}
    send = {"type": "object", "properties": {"recipient": {"type": "string"}, "body": {"type": "string"}},
            "required": ["body"]}
    tools = [("coordination_wait_for_signal", wait), ("messages_send", send)]
    # as the lab's model wrote it, braces doubled; the fields fit the wait tool only
    [call] = calls.arguments_in_text('{{\n"notifyPm": true,\n"reason": "waiting for worker-2"\n}}', tools)
    assert call.name == "coordination_wait_for_signal"
    assert json.loads(call.arguments) == {"notifyPm": True, "reason": "waiting for worker-2"}
    assert [c.name for c in calls.arguments_in_text('{"body": "hi", "recipient": "pm"}', tools)] == ["messages_send"]
    # no tool fits, more than one does, a wrong type, two objects, or prose: no call
    for text in ('{"path": "a.md"}', '{"x": 1}', '{"reason": 3}', '{"reason": "a"} {"reason": "b"}',
                 "The sea {is} wide.", ""):
        assert calls.arguments_in_text(text, tools) == [], text
    either = [("a", wait), ("b", wait)]
    assert calls.arguments_in_text('{"reason": "x"}', either) == []


SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "limit": {"type": "number"},
                                           "mode": {"type": "string", "enum": ["a", "b"]},
                                           "dirs": {"type": "boolean"}},
          "required": ["path"], "additionalProperties": False}


@pytest.mark.parametrize("args, problem", [
    ({"path": "x"}, None),
    ({"path": "x", "limit": 2, "mode": "a", "dirs": True}, None),
    ([], "the arguments must be one JSON object"),
    ({}, 'the required field "path" is missing'),
    ({"path": "x", "file": "y"}, '"file" is not a field of this tool'),
    ({"path": 1}, '"path" must be string, not a number'),
    ({"path": "x", "limit": True}, '"limit" must be number, not boolean'),
    ({"path": "x", "dirs": "yes"}, '"dirs" must be boolean, not string'),
    ({"path": "x", "mode": "c"}, '"mode" must be one of "a", "b"'),
])
def test_arguments_are_checked_for_what_models_get_wrong(args, problem):
    assert calls.input_problem(SCHEMA, args) == problem


def test_the_answers_name_what_the_model_can_do_instead():
    assert calls.unknown_tool_answer("message.created", ["file_write", "messages_send"]) == (
        'There is no tool named "message.created". Your tools are: file_write, messages_send. Call one of them by '
        "its exact name.")
    assert calls.schema_answer("file_read", SCHEMA, 'the required field "path" is missing') == (
        'Invalid arguments for file_read: the required field "path" is missing. Its fields: path (string, required), '
        "limit (number), mode (string), dirs (boolean). Call file_read again with corrected arguments.")
    reminder = calls.contract_reminder(["file_write", "messages_send", "coordination_wait_for_signal"])
    assert "call messages_send" in reminder and "coordination_wait_for_signal" in reminder
    assert "completion_submit" not in reminder
    assert calls.contract_reminder(["file_write"]) is None  # nothing to report with: no reminder
