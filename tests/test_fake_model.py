"""The fake model speaks Chat Completions well enough for the official `openai` client to parse every
kind of reply it serves: text, tool calls, usage, HTTP errors and slow answers."""

import json

import openai
import pytest
from fake_model import OVERFLOW_MESSAGE, OVERFLOW_REPLY, FakeModel, answer


@pytest.fixture
def fake():
    server = FakeModel()
    yield server
    server.close()


def client_for(fake, base_url=None, timeout=10.0):
    return openai.OpenAI(
        base_url=base_url or fake.base_url, api_key="sk-test", max_retries=0, timeout=timeout
    )


def ask(client, **extra):
    return client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "hi"}], **extra)


def test_text_reply_with_usage_is_parsed_by_openai_client(fake):
    fake.enqueue(content="Hello", usage=(10, 2, 12))
    completion = ask(client_for(fake))
    assert completion.choices[0].message.content == "Hello"
    assert completion.choices[0].finish_reason == "stop"
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (10, 2, 12)
    assert completion.model == "m1"


def test_tool_call_reply_is_parsed_with_arguments_json(fake):
    fake.enqueue(
        tool_calls=[
            ("file_read", {"path": "a.txt"}),
            {"name": "shell_exec", "arguments": '{"command":"ls"}', "id": "call_x"},
        ]
    )
    message = (
        ask(
            client_for(fake),
            tools=[{"type": "function", "function": {"name": "file_read", "parameters": {"type": "object"}}}],
        )
        .choices[0]
        .message
    )
    assert message.content is None
    assert [call.function.name for call in message.tool_calls] == ["file_read", "shell_exec"]
    assert json.loads(message.tool_calls[0].function.arguments) == {"path": "a.txt"}
    assert message.tool_calls[1].id == "call_x"
    assert message.tool_calls[0].type == "function"


def test_requests_are_recorded_with_headers_and_body(fake):
    fake.enqueue(content="ok")
    ask(client_for(fake), temperature=0.5)
    [request] = fake.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body["temperature"] == 0.5
    assert request.body["messages"] == [{"role": "user", "content": "hi"}]


def test_path_without_v1_prefix_is_served(fake):
    fake.enqueue(content="plain")
    client = client_for(fake, base_url=f"http://127.0.0.1:{fake.port}")
    assert ask(client).choices[0].message.content == "plain"
    assert fake.requests[0].path == "/chat/completions"


def test_server_error_raises_internal_server_error_with_message(fake):
    fake.enqueue_error(500, "boom")
    with pytest.raises(openai.InternalServerError) as caught:
        ask(client_for(fake))
    assert caught.value.status_code == 500
    assert "boom" in str(caught.value)


def test_rate_limit_raises_rate_limit_error_and_carries_retry_after(fake):
    fake.enqueue_error(429, "slow down", headers={"Retry-After": "0"})
    with pytest.raises(openai.RateLimitError) as caught:
        ask(client_for(fake))
    assert caught.value.response.headers["retry-after"] == "0"


def test_context_overflow_raises_bad_request_with_provider_text(fake):
    fake.enqueue_context_overflow()
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client_for(fake))
    assert caught.value.code == "context_length_exceeded"
    assert OVERFLOW_MESSAGE in str(caught.value)


def test_delayed_reply_times_out_the_client(fake):
    fake.enqueue(content="late", delay=5.0)
    with pytest.raises(openai.APITimeoutError):
        ask(client_for(fake, timeout=0.3))


def test_replies_routed_by_model_and_empty_queue_answers_500(fake):
    fake.enqueue(content="for b", model="b")
    fake.enqueue(content="shared")
    client = client_for(fake)
    assert (
        client.chat.completions.create(model="b", messages=[{"role": "user", "content": "x"}])
        .choices[0]
        .message.content
        == "for b"
    )
    assert ask(client).choices[0].message.content == "shared"
    with pytest.raises(openai.InternalServerError) as caught:
        ask(client)
    assert "no reply queued" in str(caught.value)


def test_a_responder_answers_what_no_queue_holds_and_keeps_no_request_when_asked():
    def respond(request):
        said = request["messages"][-1]["content"]
        return answer(tool_calls=[("echo", {"text": said})]) if said == "call" else OVERFLOW_REPLY

    server = FakeModel(responder=respond, record=False)
    try:
        client = client_for(server)
        server.enqueue(content="queued first")
        assert ask(client).choices[0].message.content == "queued first"
        called = client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "call"}])
        [tool_call] = called.choices[0].message.tool_calls
        assert (tool_call.function.name, json.loads(tool_call.function.arguments)) == ("echo", {"text": "call"})
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            ask(client)
        assert server.requests == []
    finally:
        server.close()
