"""Real model servers, tested against real HTTP servers: retries by default (429 with
Retry-After, 5xx, dropped connections) before the model-list fallback; the table of context-overflow
error bodies per server (tests/model_errors) driving compaction; streamed upstream requests assembled
into the answer the server would have given whole, their deltas live on the project's SSE stream;
the Anthropic Messages dialect; and cost from preset prices with the maxCostUsd budget. The fake servers
are checked by the official `openai` and `anthropic` clients parsing the same bytes."""
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import anthropic
import openai
import pytest
from e2e_fixtures import PM_TOOLS, call, kind_params, running_team
from fake_anthropic import OVERFLOW_BODY, OVERLOADED_BODY, FakeAnthropic
from fake_model import FakeModel, Reply, answer
from sse_fixtures import SseClient

import suzumio_config
import suzumio_config_schema
import suzumio_cost
import suzumio_model_loop
import suzumio_providers as providers
from suzumio_errors import BadGateway
from suzumio_model_proxy import Forwarding, ModelProxy

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((Path(__file__).parent / "model_errors").glob("*.json"))
KEY = "sk-provider-key-31337"
BODY = {"model": "ignored", "messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hi"}], "max_tokens": 50}
TOOLS = [{"type": "function", "function": {"name": "file_read", "description": "Read a file",
                                           "parameters": {"type": "object",
                                                          "properties": {"path": {"type": "string"}}}}}]


def fixture(path):
    return json.loads(path.read_text())


def models_config(base_url, type_="openai-compatible", options=None, preset=None, budget=None, provider=None):
    """A ProjectConfig with provider `gw` and preset `main`, schema-validated as `config render` loads it."""
    runner = {"model": "main", "models": {
        "providers": {"gw": {"type": type_, "baseURL": base_url, "apiKeyEnv": "KEY_VAR",
                             "options": options or {}, **(provider or {})}},
        "presets": {"main": {"provider": "gw", "model": "m", "apiModel": "remote", **(preset or {})}}}}
    if budget:
        runner["budget"] = budget
    data = {"name": "demo", "task": "T", "agents": {"pm": {}}, "backend": {"kind": "local", "runner": runner}}
    data = suzumio_config_schema.validate_schema(data)
    return suzumio_config.ProjectConfig.from_data(data)


@pytest.fixture
def claude():
    server = FakeAnthropic()
    yield server
    server.close()


def no_sleep(seconds):
    no_sleep.delays.append(seconds)


# ---------------------------------------------------------------- retries

def test_retry_delay_honours_retry_after_ms_then_retry_after_then_backs_off_with_jitter():
    assert providers.retry_delay({"retry-after-ms": "250", "retry-after": "9"}, 0) == 0.25
    assert providers.retry_delay({"retry-after": "7"}, 0) == 7.0
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert providers.retry_delay({"retry-after": date}, 0, now=lambda: 1445412470.0) == 10.0
    assert [providers.retry_delay({}, n, rng=lambda: 0.0) for n in range(6)] == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0]
    assert [providers.retry_delay({}, n, rng=lambda: 1.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_429_5xx_and_a_dropped_connection_are_retried_and_each_retry_is_reported(model):
    delays, retries = [], []
    proxy = ModelProxy({"KEY_VAR": KEY}, sleep=delays.append)
    model.enqueue_error(429, "slow down", headers={"Retry-After": "2"})
    model.enqueue_drop()
    model.enqueue_error(503, "busy", headers={"retry-after-ms": "10"})
    model.enqueue(content="fine", usage=(5, 1, 6))
    answer = proxy.forward(models_config(model.base_url), "pm", "gw", "main", BODY, on_retry=retries.append)
    assert answer.status == 200 and json.loads(answer.body)["choices"][0]["message"]["content"] == "fine"
    # A 429 or 503 with Retry-After pauses the provider (a wait at its gate, not this call's sleep)
    assert len(model.requests) == 4 and len(delays) == 1
    assert [r["delayMs"] for r in retries][::2] == [2000, 10]
    assert retries[0]["reason"] == "HTTP 429"
    assert retries[1]["reason"].startswith("connection failed: ") and retries[1]["status"] is None
    assert [(r["retry"], r["status"], r["maxRetries"]) for r in retries] == [(1, 429, 3), (2, None, 3), (3, 503, 3)]


def test_retries_are_bounded_by_count_and_window_and_max_retries_0_turns_them_off(model):
    delays = []
    for _ in range(5):
        model.enqueue_error(500, "down")
    proxy = ModelProxy({"KEY_VAR": KEY}, sleep=delays.append)
    assert proxy.forward(models_config(model.base_url), "pm", "gw", "main", BODY).status == 500
    assert len(model.requests) == 4, "three retries by default"
    off = models_config(model.base_url, options={"maxRetries": 3}, preset={"maxRetries": 0})
    assert proxy.forward(off, "pm", "gw", "main", BODY).status == 500
    assert len(model.requests) == 5, "the preset's maxRetries: 0 wins over the provider's"
    model.enqueue_error(429, "far later", headers={"Retry-After": "120"})
    assert proxy.forward(models_config(model.base_url), "pm", "gw", "main", BODY).status == 429
    assert len(model.requests) == 6, "a Retry-After past the 60 s window is not waited for"
    model.enqueue_error(400, "bad")
    assert proxy.forward(models_config(model.base_url), "pm", "gw", "main", BODY).status == 400
    assert len(model.requests) == 7, "a 400 is never retried"
    assert len(delays) == 3


@pytest.mark.parametrize("kind", kind_params())
def test_a_429_with_retry_after_then_success_completes_the_activation_with_nothing_failed(tmp_path, kind):
    with running_team(tmp_path, kind, agents={"pm": {"model": "pm", "tools": PM_TOOLS}}) as team:
        team.model.enqueue_error(429, "Rate limit reached", headers={"Retry-After": "1"}, model="pm")
        team.model.enqueue(content="Done after the wait.", model="pm")
        team.send("pm", "Start.")
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "completed", activation.get("error")
        assert activation["text"] == "Done after the wait."
        [retry] = team.events("model.retry")
        assert retry["data"]["reason"] == "HTTP 429" and retry["data"]["delayMs"] == 1000
        assert retry["data"]["activationId"] == activation["id"] and retry["data"]["agentId"] == "pm"
        assert team.events("activation.failed") == []
        first, second = team.model_requests("pm")
        assert first.body["messages"] == second.body["messages"]


@pytest.mark.parametrize("kind", kind_params())
def test_three_503s_then_the_fallback_preset(tmp_path, kind):
    presets = {"chain": {"model-list": ["primary", "backup"]},
               "primary": {"provider": "fake", "model": "primary"},
               "backup": {"provider": "fake", "model": "backup"}}
    agents = {"pm": {"model": "chain", "tools": PM_TOOLS}}
    with running_team(tmp_path, kind, agents=agents, presets=presets, model="chain") as team:
        for _ in range(4):
            team.model.enqueue_error(503, "Service Unavailable", headers={"Retry-After": "0"}, model="primary")
        team.model.enqueue(content="Backup answered.", model="backup")
        team.send("pm", "Start.")
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "completed", activation.get("error")
        assert [r.body["model"] for r in team.model.requests] == ["primary"] * 4 + ["backup"]
        assert [e["data"]["reason"] for e in team.events("model.retry")] == ["HTTP 503"] * 3
        assert activation["usage"]["model"] == "backup"


class DownServer:
    """A FakeModel responder: while `down`, every request for a model in `models` is a dropped connection
    (a server being restarted, or a dead balancer in front of it); otherwise it answers `content`.
    Counts the requests per model."""

    def __init__(self, models, content="Back again."):
        self.models = set(models)
        self.content = content
        self.down = True
        self.requests = Counter()

    def __call__(self, request):
        model = request.get("model")
        self.requests[model] += 1
        if self.down and model in self.models:
            return Reply(0, {}, None, 0)
        return answer(content=self.content)


def test_a_model_server_down_for_long_fails_each_activation_once_after_backoff_and_the_team_resumes(tmp_path):
    """Down for longer than the retry window: each activation retries with growing delays within the
    window, then fails with one clear error; failedNudge tries again after its own backoff, at most
    maxConsecutive times, and after that nothing more is sent. Once the server is back, a message runs."""
    down = DownServer({"pm"})
    scheduler = {"noEffectNudge": {"enabled": False},
                 "failedNudge": {"enabled": True, "maxConsecutive": 2, "initialDelayMs": 500, "backoffFactor": 2}}
    with running_team(tmp_path, "local", agents={"pm": {"model": "pm", "tools": PM_TOOLS}}, scheduler=scheduler,
                      fake_provider={"options": {"maxRetries": 50, "retryWindowMs": 1500}},
                      scheduler_interval=0.2) as team:
        team.model.responder = down
        team.send("pm", "Start.")
        failed = team.wait_activations("pm", 3)
        assert [a["status"] for a in failed] == ["failed"] * 3
        for activation in failed:
            assert activation["error"].endswith("All model attempts failed:\npm: Request to provider fake failed: "
                                                "Remote end closed connection without response"), activation["error"]
        retries = [r["data"] for r in team.events("model.retry")]
        for activation in failed:
            delays = [r["delayMs"] for r in retries if r["activationId"] == activation["id"]]
            # Exponential backoff from 250 ms (jitter only adds), never past the 1.5 s window in total,
            # so maxRetries: 50 is never reached.
            assert delays and all(delay >= 250 * 2 ** n for n, delay in enumerate(delays)), delays
            assert sum(delays) <= 1500, delays
        assert down.requests["pm"] == len(retries) + 3, "one request per attempt, nothing in between"
        nudges = team.store.list_signals("pm", kind="scheduler.failed_nudge")
        assert sorted(n["payload"]["delayMs"] for n in nudges) == [500, 1000]
        # Exhausted: another tick finds the agent failed and schedules nothing more for it.
        team.service.scheduler.trigger(team.name)
        assert len(team.store.list_signals("pm", kind="scheduler.failed_nudge")) == 2
        assert team.store.list_signals("pm", status="pending") == []
        assert down.requests["pm"] == len(retries) + 3
        down.down = False
        team.send("pm", "The server is back; go on.")
        resumed = team.wait_activations("pm", 4)[-1]
        assert resumed["status"] == "completed", resumed.get("error")
        assert resumed["text"] == "Back again."


def test_a_primary_down_for_long_falls_back_to_the_next_preset_once_its_window_is_spent(tmp_path):
    presets = {"chain": {"model-list": ["primary", "backup"]},
               "primary": {"provider": "fake", "model": "primary"},
               "backup": {"provider": "fake", "model": "backup"}}
    down = DownServer({"primary"}, content="Backup answered.")
    with running_team(tmp_path, "local", agents={"pm": {"model": "chain", "tools": PM_TOOLS}}, presets=presets,
                      model="chain", fake_provider={"options": {"maxRetries": 50, "retryWindowMs": 1000}}) as team:
        team.model.responder = down
        team.send("pm", "Start.")
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "completed", activation.get("error")
        assert activation["usage"]["model"] == "backup" and activation["text"] == "Backup answered."
        retries = [r["data"]["delayMs"] for r in team.events("model.retry")]
        assert retries and sum(retries) <= 1000 and down.requests["primary"] == len(retries) + 1
        assert down.requests["backup"] == 1


# ---------------------------------------------------------------- context overflow

@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_the_overflow_table_knows_each_servers_error_body_and_no_other_400(path, model):
    case = fixture(path)
    text = json.dumps(case["body"])
    assert (providers.overflow_server(case["status"], text) is not None) == case["overflow"]
    model.enqueue(status=case["status"], body=case["body"])
    answer = ModelProxy({"KEY_VAR": KEY}).forward(models_config(model.base_url), "pm", "gw", "main", BODY)
    assert answer.status == case["status"] and json.loads(answer.body) == case["body"]
    assert (answer.overflow is not None) == case["overflow"]
    assert len(model.requests) == 1, "neither overflow nor other 4xx answers are retried"


OVERFLOWS = [p for p in FIXTURES if fixture(p)["overflow"]]


@pytest.mark.parametrize("path", OVERFLOWS, ids=[p.stem for p in OVERFLOWS])
def test_each_overflow_fixture_compacts_the_history_and_retries(tmp_path, path):
    case = fixture(path)
    with running_team(tmp_path, "local", agents={"pm": {"model": "pm", "tools": PM_TOOLS}}) as team:
        # rows of ~45,000 characters push the first activation out of the retry tail (as in test_e2e)
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body="Notes: " + "y" * 45000)],
                           model="pm")
        team.model.enqueue(content="First answer: " + "x" * 45000, model="pm")
        team.send("pm", "Start.")
        team.wait_activations("pm", 1)
        team.model.enqueue(status=case["status"], body=case["body"], model="pm")
        team.model.enqueue(content="Summary of the first activation.", model="pm")
        team.model.enqueue(content="Answer after compaction.", model="pm")
        team.send("pm", "Again.")
        _first, activation = team.wait_activations("pm", 2)
        assert activation["status"] == "completed", activation.get("error")
        assert activation["text"] == "Answer after compaction."
        [compaction] = team.store.db_all("SELECT reason, summary FROM agent_history_compactions")
        assert compaction["reason"] == "provider_context_overflow"
        assert compaction["summary"] == "Summary of the first activation."
        overflowed, summary, retried = team.model_requests("pm")[2:]
        assert overflowed.body["messages"] != retried.body["messages"]
        assert "tools" not in summary.body and "tools" in retried.body
        # the system message stays first; the compacted history follows it
        assert retried.body["messages"][0]["role"] == "system"
        assert retried.body["messages"][1]["content"].startswith("# Compacted Agent History")


def test_a_400_that_is_not_overflow_fails_the_attempt_without_compaction(tmp_path):
    case = fixture(Path(__file__).parent / "model_errors" / "not-vllm-tool-choice.json")
    with running_team(tmp_path, "local", agents={"pm": {"model": "pm", "tools": PM_TOOLS}}) as team:
        team.model.enqueue(status=case["status"], body=case["body"], model="pm")
        team.send("pm", "Start.")
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "failed"
        assert team.store.db_all("SELECT id FROM agent_history_compactions") == []


# ---------------------------------------------------------------- streaming

REPLY = {"content": "The answer is 42, as computed.", "usage": (12, 7, 19),
         "tool_calls": [("file_read", {"path": "notes/a.txt"}), ("file_read", {"path": "b.txt"})]}


def whole(answer_text):
    data = json.loads(answer_text)
    message = data["choices"][0]["message"]
    return (message.get("content"), [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                                     for c in message.get("tool_calls") or []],
            data["choices"][0]["finish_reason"], data.get("usage"))


@pytest.mark.parametrize("flavor", ["openai", "vllm", "llamacpp", "ollama"])
def test_each_flavors_stream_parses_in_the_openai_client_and_assembles_to_the_whole_answer(flavor):
    server = FakeModel(flavor)
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=10)
        for _ in range(3):
            server.enqueue(reasoning="Think first." if flavor in ("vllm", "ollama") else None, **REPLY)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                stream=True, stream_options={"include_usage": True})
        text, arguments, usage = "", {}, None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call_delta in choice.delta.tool_calls or []:
                    arguments[call_delta.index] = arguments.get(call_delta.index, "") + (
                        call_delta.function.arguments or "")
        assert text == REPLY["content"] and json.loads(arguments[0]) == {"path": "notes/a.txt"}
        assert (usage.prompt_tokens, usage.completion_tokens) == (12, 7)

        plain = ModelProxy({"KEY_VAR": KEY}).forward(
            models_config(server.base_url, options={"stream": False}), "pm", "gw", "main", BODY)
        deltas = []
        streamed = ModelProxy({"KEY_VAR": KEY}).forward(
            models_config(server.base_url), "pm", "gw", "main", BODY, publish=deltas.append)
        assert [r.body["stream"] for r in server.requests[1:]] == [False, True]
        def shape(answer):  # ids differ by reply number
            content, calls, finish, usage = whole(answer.body)
            return content, [c[1:] for c in calls], finish, usage
        assert shape(streamed) == shape(plain) and shape(streamed)[0] == REPLY["content"]
        assert streamed.usage == plain.usage == {"input": 12, "output": 7, "total": 19}
        assert "".join(d.get("text", "") for d in deltas) == REPLY["content"] and deltas[-1]["done"]
        if flavor in ("vllm", "ollama"):
            assert "".join(d.get("reasoning", "") for d in deltas) == "Think first."
            assert json.loads(streamed.body)["choices"][0]["message"]["reasoning_content"] == "Think first."
        assert {c["name"] for d in deltas for c in d.get("toolCalls", []) if c.get("name")} == {"file_read"}
    finally:
        server.close()


@pytest.mark.parametrize("flavor, refused", [("nostream", "stream"), ("nostreamoptions", "stream_options"),
                                             ("completiontokens", "max_tokens")])
@pytest.mark.parametrize("path", ["threaded", "loop"])
def test_a_server_refusing_a_request_feature_is_asked_again_without_it_and_remembered(flavor, refused, path):
    server = FakeModel(flavor)
    loop = suzumio_model_loop.ModelLoop()
    try:
        proxy = ModelProxy({"KEY_VAR": KEY})
        drive = proxy.drive if path == "threaded" else loop.run
        server.enqueue(content="one")
        server.enqueue(content="two")
        config = models_config(server.base_url)
        for expected in ("one", "two"):
            assert whole(drive(Forwarding(proxy, config, "pm", "gw", "main", BODY)).body)[0] == expected
        first, second, third = (r.body for r in server.requests)
        sent = {"stream": lambda b: b["stream"], "stream_options": lambda b: "stream_options" in b,
                "max_tokens": lambda b: "max_tokens" in b}[refused]
        assert (sent(first), sent(second), sent(third)) == (True, False, False)
        if refused == "max_tokens":
            assert second["max_completion_tokens"] == 50
    finally:
        loop.close()
        server.close()


def test_reasoning_content_is_never_replayed_to_the_server(model):
    body = dict(BODY, messages=BODY["messages"] + [
        {"role": "assistant", "content": "x", "reasoning_content": "secret chain"}, {"role": "user", "content": "y"}])
    model.enqueue(content="ok")
    ModelProxy({"KEY_VAR": KEY}).forward(models_config(model.base_url), "pm", "gw", "main", body)
    assert all("reasoning_content" not in m for m in model.requests[0].body["messages"])


def test_the_idle_timeout_applies_between_chunks_not_to_the_whole_stream(model):
    slow = models_config(model.base_url, options={"maxRetries": 0}, provider={"chunkTimeoutMs": 800})
    model.enqueue(content=" ".join(["word"] * 12), chunk_delay=0.3)  # 4 s in all, 0.3 s between chunks
    answer = ModelProxy({"KEY_VAR": KEY}).forward(slow, "pm", "gw", "main", BODY)
    assert whole(answer.body)[0] == " ".join(["word"] * 12)
    model.enqueue(content="late words", chunk_delay=1.5)
    with pytest.raises(BadGateway, match="timed out"):
        ModelProxy({"KEY_VAR": KEY}).forward(slow, "pm", "gw", "main", BODY)


def history_rows(team):
    rows = team.store.history_page("pm", 100)["messages"]
    # prompts name the project's own paths and signal ids; everything the model produced must be equal
    return [(r["role"], r["kind"]) if r["kind"] == "activation_prompt" else
            (r["role"], r["kind"], r["content"], r.get("metadata")) for r in reversed(rows)]


def test_a_5_s_streamed_generation_shows_its_first_delta_within_1_s_and_stores_the_same_history(tmp_path):
    words = " ".join(f"w{i}" for i in range(50))
    histories = []
    for stream in (False, True):
        agents = {"pm": {"model": "pm", "tools": PM_TOOLS}}
        with running_team(tmp_path / str(stream), "local", agents=agents,
                          fake_provider={"options": {"stream": stream}}) as team:
            reader = SseClient(team.service, f"/api/projects/{team.name}/stream")
            team.model.enqueue(content=words, usage=(30, 50, 80), chunk_delay=0.1, model="pm")  # 5 s
            team.send("pm", "Start.")
            [activation] = team.wait_activations("pm", 1)
            assert activation["status"] == "completed", activation.get("error")
            histories.append(history_rows(team))
            deltas = reader.of("activation.delta")
            if stream:
                team.wait_for(lambda reader=reader: reader.of("activation.completed"), 10, "the completion event")
                first_token = team.model.token_times[0]
                arrived = reader.of("activation.delta")[0]["at"]
                # the first delta reaches the SSE client well within a second of the server writing the
                # first token (publishing coalesces at most LIVE_INTERVAL_S = 0.1 s)
                assert arrived - first_token < 1.0, arrived - first_token
                print(f"first delta on the SSE stream {1000 * (arrived - first_token):.0f} ms after the first token")
                assert team.model.token_times[-1] - first_token > 4.0, "the generation really took ~5 s"
                assert all(delta["id"] is None for delta in deltas), "deltas carry no id"
                data = [delta["data"] for delta in deltas]
                assert "".join(d.get("text", "") for d in data) == words
                assert {(d["activationId"], d["agentId"]) for d in data} == {(activation["id"], "pm")}
                assert data[-1]["done"] is True and len(data) > 10
                # a client resuming by Last-Event-ID gets stored events only: deltas are not replayed
                stored = [e for e in reader.snapshot() if e["id"] is not None]
                resumed = SseClient(team.service, f"/api/projects/{team.name}/stream",
                                    headers={"Last-Event-ID": stored[0]["id"]})
                team.wait_for(lambda resumed=resumed: resumed.of("activation.completed"), 10, "the replayed events")
                assert resumed.of("activation.delta") == []
                resumed.close()
                assert team.store.db_all("SELECT id FROM events WHERE type = 'activation.delta'") == []
            else:
                assert deltas == []
            reader.close()
    assert histories[0] == histories[1]


# ---------------------------------------------------------------- Anthropic

def test_the_fake_anthropic_server_parses_in_the_official_client_whole_and_streamed(claude):
    client = anthropic.Anthropic(base_url=claude.root_url, api_key="sk-ant-test", max_retries=0, timeout=10)
    claude.enqueue(text="Reading it.", tool_uses=[("file_read", {"path": "a.txt"})], usage=(20, 9, 100, 30))
    message = client.messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "x"}])
    assert message.stop_reason == "tool_use" and message.content[0].text == "Reading it."
    assert (message.content[1].name, message.content[1].input) == ("file_read", {"path": "a.txt"})
    assert (message.usage.cache_read_input_tokens, message.usage.cache_creation_input_tokens) == (100, 30)
    claude.enqueue(text="All done here.", thinking="Let me think.", usage=(5, 4))
    with client.messages.stream(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[1].text == "All done here."
    assert (final.stop_reason, final.usage.output_tokens) == ("end_turn", 4)
    claude.enqueue(status=529, body=OVERLOADED_BODY)
    with pytest.raises(anthropic.InternalServerError):
        client.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "x"}])


def test_chat_completions_requests_become_messages_requests_and_answers_come_back(claude):
    claude.enqueue(text="Reading it.", tool_uses=[("file_read", {"path": "a.txt"})], usage=(20, 9, 100, 30))
    claude.enqueue(text="Whole.", usage=(3, 2))
    body = dict(BODY, tools=TOOLS, tool_choice="required", messages=BODY["messages"] + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "toolu_0", "type": "function", "function": {"name": "file_read", "arguments": '{"path": "x"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_0", "content": "contents of x"}])
    deltas = []
    config = models_config(claude.base_url, type_="anthropic")
    answer = ModelProxy({"KEY_VAR": KEY}).forward(config, "pm", "gw", "main", body, publish=deltas.append)
    request = claude.requests[0]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY and "authorization" not in request.headers
    assert request.headers["anthropic-version"] == providers.ANTHROPIC_VERSION
    sent = request.body
    assert (sent["model"], sent["max_tokens"], sent["stream"]) == ("remote", 50, True)
    assert sent["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert sent["tools"][0]["input_schema"] == TOOLS[0]["function"]["parameters"]
    assert sent["tools"][-1]["cache_control"] == {"type": "ephemeral"} and sent["tool_choice"] == {"type": "any"}
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][1]["content"] == [{"type": "tool_use", "id": "toolu_0", "name": "file_read",
                                               "input": {"path": "x"}}]
    assert sent["messages"][2]["content"][0]["type"] == "tool_result"
    assert sent["messages"][2]["content"][0]["tool_use_id"] == "toolu_0"
    content, calls, finish, _usage = whole(answer.body)
    assert (content, finish) == ("Reading it.", "tool_calls")
    assert calls == [("toolu_1_1", "file_read", {"path": "a.txt"})]
    assert answer.usage == {"input": 150, "output": 9, "total": 159, "cacheRead": 100, "cacheWrite": 30}
    assert json.loads(answer.body)["stop_reason"] == "tool_use"
    assert "".join(d.get("text", "") for d in deltas) == "Reading it."
    plain = models_config(claude.base_url, type_="anthropic", options={"stream": False})
    assert whole(ModelProxy({"KEY_VAR": KEY}).forward(plain, "pm", "gw", "main", BODY).body)[0] == "Whole."
    assert "stream" not in claude.requests[1].body


def test_anthropic_overloaded_is_retried_whole_or_mid_stream_and_its_overflow_is_recognised(claude):
    delays = []
    proxy = ModelProxy({"KEY_VAR": KEY}, sleep=delays.append)
    claude.enqueue(status=529, body=OVERLOADED_BODY)
    claude.enqueue(body=OVERLOADED_BODY)  # a 200 stream whose first event is an overloaded error
    claude.enqueue(text="Finally.")
    answer = proxy.forward(models_config(claude.base_url, type_="anthropic"), "pm", "gw", "main", BODY)
    assert whole(answer.body)[0] == "Finally." and len(delays) == 2
    claude.enqueue(status=400, body=OVERFLOW_BODY)
    overflow = proxy.forward(models_config(claude.base_url, type_="anthropic"), "pm", "gw", "main", BODY)
    assert (overflow.status, overflow.overflow) == (400, "anthropic")


@pytest.mark.parametrize("kind", kind_params())
def test_an_anthropic_tool_loop_runs_end_to_end(tmp_path, kind):
    claude = FakeAnthropic()
    try:
        providers_config = {"claude": {"type": "anthropic", "baseURL": claude.base_url, "apiKey": KEY}}
        presets = {"pm": {"provider": "claude", "model": "sonnet", "apiModel": "claude-sonnet-4-5",
                          "maxOutputTokens": 1000}}
        agents = {"pm": {"model": "pm", "tools": PM_TOOLS}}
        with running_team(tmp_path, kind, agents=agents, presets=presets, providers=providers_config) as team:
            (team.store.workspace("pm") / "notes.txt").write_text("forty-two\n")
            claude.enqueue(text="Reading the notes.", tool_uses=[("file_read", {"path": "notes.txt"})],
                           usage=(100, 20, 0, 80))
            claude.enqueue(tool_uses=[("messages_send", {"recipient": "user", "body": "The notes say forty-two."})],
                           usage=(150, 25, 80, 0))
            claude.enqueue(text="Reported.", usage=(200, 5, 80, 0))
            team.send("pm", "Read notes.txt and tell me what it says.")
            [activation] = team.wait_activations("pm", 1)
            assert activation["status"] == "completed", activation.get("error")
            assert activation["text"] == "Reading the notes.Reported."
            second = claude.requests[1].body
            assert second["model"] == "claude-sonnet-4-5" and second["max_tokens"] == 1000
            assert "system" not in second or all(b["type"] == "text" for b in second["system"])
            results = [b for m in second["messages"] for b in m["content"]
                       if isinstance(b, dict) and b.get("type") == "tool_result"]
            assert len(results) == 1 and "forty-two" in results[0]["content"]
            assert results[0]["tool_use_id"] == "toolu_1_1"
            assert [m["body"] for m in team.store.list_messages() if m["recipient"] == "user"] == [
                "The notes say forty-two."]
            usage = team.store.model_usage(activation["id"])
            assert usage["calls"] == 3 and usage["tokens"]["cacheRead"] == 160 and usage["tokens"]["cacheWrite"] == 80
    finally:
        claude.close()


# ---------------------------------------------------------------- cost

def test_a_price_table_gives_the_expected_cost():
    preset = models_config("http://x/v1", preset={"pricing": {"inputPerMTok": 3.0, "outputPerMTok": 15.0,
                                                              "cacheReadPerMTok": 0.3}}).runner.presets["main"]
    usage = {"input": 1_200_000, "output": 100_000, "total": 1_300_000, "cacheRead": 200_000}
    # 1.0 M fresh input at $3 + 0.2 M cached at $0.30 + 0.1 M output at $15
    assert suzumio_cost.call_cost(preset, usage) == pytest.approx(3.0 + 0.06 + 1.5)
    assert suzumio_cost.call_cost(models_config("http://x/v1").runner.presets["main"], usage) is None
    written = {"input": 1_000_000, "output": 0, "cacheWrite": 1_000_000}
    assert suzumio_cost.call_cost(preset, written) == pytest.approx(3.0), "cache writes at the input price"


@pytest.mark.parametrize("pricing, issue", [
    ({"inputPerMTok": 1}, "backend.runner.models.presets.main.pricing.outputPerMTok: Required"),
    ({"inputPerMTok": -1, "outputPerMTok": 1},
     "backend.runner.models.presets.main.pricing.inputPerMTok: Number must be greater than or equal to 0"),
    ({"inputPerMTok": "1", "outputPerMTok": 1},
     "backend.runner.models.presets.main.pricing.inputPerMTok: Expected number, received string"),
])
def test_invalid_pricing_is_a_config_error_naming_the_field(pricing, issue):
    with pytest.raises(suzumio_config.ConfigError) as caught:
        models_config("http://x/v1", preset={"pricing": pricing})
    assert issue in str(caught.value)


def test_a_budget_needs_max_tokens_or_max_cost_usd():
    with pytest.raises(suzumio_config.ConfigError, match="budget needs maxTokens or maxCostUsd"):
        models_config("http://x/v1", budget={"unknown": 1})
    assert models_config("http://x/v1", budget={"maxCostUsd": 0.5}).runner.budget_max_cost_usd == 0.5


def test_cost_per_activation_agent_and_project_and_max_cost_usd_warns_then_pauses(tmp_path):
    presets = {"pm": {"provider": "fake", "model": "pm",
                      "pricing": {"inputPerMTok": 2.0, "outputPerMTok": 10.0, "cacheReadPerMTok": 0.5}}}
    extra_budget = {"maxCostUsd": 0.01}
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}}
    with running_team(tmp_path, "local", agents=agents, presets=presets) as team:
        runner_section = team.store.config()["backend"]["runner"]
        assert "budget" not in runner_section
        # 1000 input ($0.002) + 100 output ($0.001) = $0.003 the first time
        team.model.enqueue(content="one", usage={"prompt_tokens": 1000, "completion_tokens": 100,
                                                 "total_tokens": 1100}, model="pm")
        team.send("pm", "First.")
        [first] = team.wait_activations("pm", 1)
        assert first["status"] == "completed", first.get("error")
        costs = team.service.get(f"/api/projects/{team.name}/costs").json()
        assert costs["activations"][first["id"]]["costUsd"] == pytest.approx(0.003)
        assert costs["agents"]["pm"]["costUsd"] == pytest.approx(0.003)
        # the second call is the contract reminder, answered with no usage
        assert costs["project"] == {"calls": 2, "tokens": 1100, "cachedTokens": 0, "cacheWriteTokens": 0,
                                    "costUsd": pytest.approx(0.003)}
        assert team.store.model_usage(first["id"])["costUsd"] == pytest.approx(0.003)

    # the same prices under a $0.01 budget: $0.009 warns (80%), then $0.012 pauses
    with running_team(tmp_path / "budget", "local", agents=agents, presets=presets,
                      runner={"budget": extra_budget}) as team:
        config = suzumio_config.ProjectConfig.from_data(team.store.config())
        assert config.backend.runner.budget_max_cost_usd == 0.01
        team.model.enqueue(content="big", usage={"prompt_tokens": 3000, "completion_tokens": 300,
                                                 "total_tokens": 3300}, model="pm")
        team.send("pm", "First.")
        team.wait_activations("pm", 1)
        team.wait_for(lambda: team.events("project.budget_warning"), 10, "the budget warning")
        [warning] = team.events("project.budget_warning")
        assert warning["data"]["maxCostUsd"] == 0.01 and warning["data"]["usedCostUsd"] == pytest.approx(0.009)
        assert team.store.project()["status"] == "running"
        team.model.enqueue(content="more", usage={"prompt_tokens": 1000, "completion_tokens": 100,
                                                  "total_tokens": 1100}, model="pm")
        team.send("pm", "Second.")
        team.wait_activations("pm", 2)
        team.wait_for(lambda: team.store.project()["status"] == "stopped", 10, "the pause")
        [paused] = team.events("project.budget_exceeded")
        assert paused["data"]["usedCostUsd"] == pytest.approx(0.012)
        to_user = [m["body"] for m in team.store.list_messages(full_body=True) if m["recipient"] == "user"]
        assert any(b.startswith("Budget warning for project e2e") for b in to_user)
        assert any(b.startswith("Cost budget reached for project e2e") for b in to_user)
        assert len(team.events("project.budget_warning")) == 1, "warned once per window"


# ---------------------------------------------------------------- suzumio watch and status

def test_watch_prints_the_streamed_text_and_tool_calls_of_a_running_activation(tmp_path):
    presets = {"pm": {"provider": "fake", "model": "pm",
                      "pricing": {"inputPerMTok": 1.0, "outputPerMTok": 2.0}}}
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}}
    with running_team(tmp_path, "local", agents=agents, presets=presets) as team:
        token = team.service.auth_headers["Authorization"].split(" ", 1)[1]
        environ = {**os.environ, "WATCH_TOKEN": token}
        watcher = subprocess.Popen(
            [sys.executable, str(ROOT / "suzumio.py"), "watch", team.name, "--url", team.service.base_url,
             "--api-token-env", "WATCH_TOKEN", "--once"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=environ)
        try:
            assert watcher.stdout.readline().startswith(f"watching {team.name} at ")
            team.model.enqueue(content="Let me tell the user.", chunk_delay=0.05, model="pm",
                               tool_calls=[call("messages.send", recipient="user", body="Hello there")],
                               usage=(1000, 500, 1500))
            team.model.enqueue(content="Told them.", model="pm", usage=(1000, 0, 1000))
            team.send("pm", "Start.")
            out, err = watcher.communicate(timeout=60)
        finally:
            watcher.kill()
        assert watcher.returncode == 0, err
        assert "[pm act_" in out and "Let me tell the user." in out and "Told them." in out
        assert '-> messages_send({"recipient": "user", "body": "Hello there"})' in out
        assert "▶ pm wakes up (act_" in out and "■ pm done" in out
        status = subprocess.run([sys.executable, str(ROOT / "suzumio.py"), "status", team.name, "--root",
                                 str(team.service.root.path), "--json"], capture_output=True, text=True, check=True)
        [project] = json.loads(status.stdout)
        # 2000 input at $1/M + 500 output at $2/M
        assert project["tokens"] == 2500 and project["costUsd"] == pytest.approx(0.003)
        assert project["agents"][0]["costUsd"] == pytest.approx(0.003)
        text = subprocess.run([sys.executable, str(ROOT / "suzumio.py"), "status", team.name, "--root",
                               str(team.service.root.path)], capture_output=True, text=True, check=True).stdout
        assert text.splitlines()[0].endswith("2500 tokens  $0.0030")


# ---------------------------------------------------------------- WebUI

def test_the_webui_shows_a_running_activations_text_and_tool_calls_as_they_stream_and_the_cost(tmp_path):
    from playwright.sync_api import expect
    from provisioning_fixtures import chromium_browser

    presets = {"pm": {"provider": "fake", "model": "pm", "pricing": {"inputPerMTok": 1.0, "outputPerMTok": 2.0}}}
    words = " ".join(f"word{i}" for i in range(30))
    with running_team(tmp_path, "local", agents={"pm": {"model": "pm", "tools": PM_TOOLS}}, presets=presets) as team, \
            chromium_browser() as browser:
        token = team.service.auth_headers["Authorization"].split(" ", 1)[1]
        page = browser.new_page()
        page.goto(f"{team.service.base_url}/?token={token}#/{team.name}/overview")
        expect(page.get_by_test_id("last-updated")).to_contain_text("Updated")
        team.model.enqueue(content=words, chunk_delay=0.15, model="pm", usage=(1000, 500, 1500),
                           tool_calls=[call("messages.send", recipient="user", body="Streamed hello")])
        team.model.enqueue(content="Done.", model="pm", usage=(1000, 0, 1000))
        team.send("pm", "Start.")
        live = page.get_by_test_id("live-text")
        expect(live).to_contain_text("word3", timeout=10000)
        assert team.store.running_activations(), "the text showed while the activation still ran"
        assert "word29" not in live.inner_text(), "shown as it came, not at the end"
        expect(page.get_by_test_id("live-tool")).to_contain_text('→ messages_send({"recipient": "user"',
                                                                  timeout=10000)
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "completed", activation.get("error")
        expect(page.get_by_test_id("live-output")).to_have_count(0, timeout=10000)
        # 2000 input at $1/M + 500 output at $2/M
        expect(page.get_by_test_id("metric-cost")).to_contain_text("$0.0030", timeout=10000)
        # ... and on pm's roster card: its own spend
        expect(page.get_by_test_id("agent-cost")).to_have_text("$0.0030 in 2 model calls", timeout=10000)
        # ... and on the activation's line in the Activations view
        page.goto(f"{team.service.base_url}/#/{team.name}/activations")
        expect(page.get_by_test_id("activation-line")).to_contain_text(" - $0.0030", timeout=10000)


def test_a_stream_cut_after_bytes_arrived_is_asked_again_and_only_the_whole_answer_counts(model):
    delays, retries, deltas = [], [], []
    proxy = ModelProxy({"KEY_VAR": KEY}, sleep=delays.append)
    model.enqueue(content=" ".join(["partial"] * 12), usage=(50, 40, 90), cut_after=3)
    model.enqueue(content="whole", usage=(5, 1, 6))
    answer = proxy.forward(models_config(model.base_url), "pm", "gw", "main", BODY, publish=deltas.append,
                           on_retry=retries.append)
    assert answer.status == 200 and whole(answer.body)[0] == "whole"
    assert answer.usage["input"] == 5 and answer.usage["output"] == 1  # the cut answer's usage never counts
    assert len(model.requests) == 2 and len(delays) == 1
    assert [(r["retry"], r["status"]) for r in retries] == [(1, None)]
    assert retries[0]["reason"].startswith("stream cut: ")
    assert any("partial" in str(delta) for delta in deltas)  # bytes had arrived before the cut
