"""The governor of each provider (suzumio_model_gate) and what the model proxy does with it: limits on
concurrency, requests and tokens per minute, urgent calls first, the pause after a 429 or 503 with
Retry-After for every agent, the waits as events and not as the calls' timeouts; and the cached prompt
tokens of each dialect reaching the usage rows and the cost. The gate's rules run on an injected clock;
the flows run through the real runner route, the model loop and the fake model servers."""
import contextlib
import json
import threading

import pytest
from api_fixtures import init_project, serving
from conftest import wait_until
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, running_team
from fake_anthropic import FakeAnthropic
from fake_model import FakeModel

import suzumio_config
import suzumio_coordination as coordination
import suzumio_model_gate as gate
import suzumio_model_loop
from suzumio_config_models import NO_LIMITS
from suzumio_errors import ConfigError, SuzumioError
from suzumio_model_proxy import Forwarding, ModelProxy

pytestmark = pytest.mark.timeout(120)

KEY = "sk-gate-key-5be1c0"
KEY_ENV = {"KEY_VAR": KEY}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Turns:
    """Tickets' admissions and wake-ups, in order."""

    def __init__(self, governor, key=("demo", "gw")):
        self.governor, self.key = governor, key
        self.admitted, self.wakes = [], []

    def ticket(self, name, priority=None):
        return self.governor.ticket(self.key, priority, lambda: self.admitted.append(name),
                                    lambda when: self.wakes.append((name, when)))


# ---------------------------------------------------------------- the gate's rules

def test_one_slot_runs_one_call_and_an_urgent_call_overtakes_older_routine_ones():
    governor = gate.Governor(Clock())
    turns = Turns(governor)
    limits = gate.Limits(concurrency=1)
    first = turns.ticket("first")
    assert governor.enter(first, limits, 10) is None
    routine = [turns.ticket(f"p3-{n}", "P3") for n in (1, 2)]
    assert [governor.enter(t, limits, 10) for t in routine] == [("concurrency", 1), ("concurrency", 2)]
    urgent = turns.ticket("p1", "P1")
    assert governor.enter(urgent, limits, 10) == ("concurrency", 1)
    for ticket in (first, urgent, routine[0], routine[1]):
        governor.leave(ticket, 10)
    assert turns.admitted == ["p1", "p3-1", "p3-2"]
    assert governor.running(turns.key) == 0 and governor.waiting(turns.key) == 0


def test_requests_per_minute_wait_for_the_oldest_start_to_leave_the_window():
    clock = Clock()
    governor = gate.Governor(clock)
    turns = Turns(governor)
    limits = gate.Limits(requests_per_minute=2)
    a, b, c = (turns.ticket(name) for name in "abc")
    assert governor.enter(a, limits, 1) is None
    clock.now += 10
    assert governor.enter(b, limits, 1) is None
    governor.leave(a, 1)
    governor.leave(b, 1)
    assert governor.enter(c, limits, 1) == ("rpm", 1)
    assert turns.wakes[-1] == ("c", 1060.0), "woken when the first start is a minute old"
    clock.now = 1059.9
    governor.pump(turns.key)
    assert turns.admitted == []
    clock.now = 1060.0
    governor.pump(turns.key)
    assert turns.admitted == ["c"]


def test_tokens_per_minute_count_finished_calls_and_running_estimates_and_let_a_lone_big_call_through():
    clock = Clock()
    governor = gate.Governor(clock)
    turns = Turns(governor)
    limits = gate.Limits(tokens_per_minute=1000)
    big = turns.ticket("big")
    assert governor.enter(big, limits, 5000) is None, "alone, a call larger than the limit still starts"
    small = turns.ticket("small")
    assert governor.enter(small, limits, 10) == ("tpm", 1)
    governor.leave(big, 4000)
    assert turns.admitted == [] and turns.wakes[-1] == ("small", 1060.0)
    clock.now += 60
    governor.pump(turns.key)
    assert turns.admitted == ["small"]
    # under the limit, calls share the minute: the running one's estimate counts until its usage is known
    other = turns.ticket("other")
    assert governor.enter(other, limits, 995) == ("tpm", 1)
    governor.leave(small, 4)
    assert turns.admitted == ["small", "other"]


def test_a_pause_holds_every_call_until_it_ends_and_only_a_new_or_later_pause_is_announced():
    clock = Clock()
    governor = gate.Governor(clock)
    turns = Turns(governor)
    key = turns.key
    assert governor.pause(key, 5.0) is True
    assert governor.pause(key, 4.5) is False, "a shorter pause changes nothing"
    assert governor.pause(key, 5.5) is False, "a little later: the same pause"
    waiting = turns.ticket("w")
    assert governor.enter(waiting, gate.NO_LIMITS, 1) == ("paused", 1)
    assert turns.wakes[-1] == ("w", 1005.5)
    assert governor.pause(key, 7.0) is True, "moved a second or more later: announced again"
    clock.now = 1007.0
    governor.pump(key)
    assert turns.admitted == ["w"] and governor.paused_for(key) == 0.0
    clock.now = 1100.0
    assert governor.pause(key, 1.0) is True, "after it ended, a new pause"


def test_a_call_that_gives_up_while_waiting_leaves_its_place():
    governor = gate.Governor(Clock())
    turns = Turns(governor)
    limits = gate.Limits(concurrency=1)
    running, leaving, next_one = (turns.ticket(name) for name in ("running", "leaving", "next"))
    governor.enter(running, limits, 1)
    governor.enter(leaving, limits, 1)
    governor.enter(next_one, limits, 1)
    governor.leave(leaving)
    governor.leave(running, 1)
    assert turns.admitted == ["next"]


@pytest.mark.parametrize("limits, issue", [
    ({"concurrency": 0}, "limits.concurrency: Number must be greater than 0"),
    ({"requestsPerMinute": 1.5}, "limits.requestsPerMinute: Expected integer, received float"),
    ({"tokensPerMinute": "lots"}, "limits.tokensPerMinute: Expected number, received string"),
])
def test_invalid_limits_are_config_errors_naming_the_field(limits, issue):
    with pytest.raises(ConfigError) as caught:
        config_with(gw={"limits": limits})
    assert f"backend.runner.models.providers.gw.{issue}" in str(caught.value)


def test_limits_and_the_first_byte_timeout_are_typed_and_rendered():
    config = config_with(gw={"limits": {"concurrency": 2, "tokensPerMinute": 30000}, "firstByteTimeoutMs": 90000})
    provider = config.runner.providers["gw"]
    assert (provider.limits.concurrency, provider.limits.requests_per_minute, provider.limits.tokens_per_minute) \
        == (2, None, 30000)
    assert provider.first_byte_timeout_ms == 90000
    rendered = config.render()
    assert "limits:" in rendered and "concurrency: 2" in rendered and "tokensPerMinute: 30000" in rendered
    assert config_with().runner.providers["gw"].limits == NO_LIMITS


def config_with(gw=None, presets=None):
    provider = {"type": "openai-compatible", "baseURL": "http://127.0.0.1:9/v1", "apiKeyEnv": "KEY_VAR"}
    provider.update(gw or {})
    return suzumio_config.ProjectConfig.from_data({
        "name": "demo", "task": "Gate test.", "agents": {"pm": {}},
        "backend": {"runner": {"model": "main", "models": {
            "providers": {"gw": provider},
            "presets": presets or {"main": {"provider": "gw", "model": "m"}}}}}})


# ---------------------------------------------------------------- through the runner route

AGENTS = ("a", "b", "c", "d")
GW = ("demo", "gw")


@contextlib.contextmanager
def gate_service(tmp_path, base_url, provider=None, preset=None, kind="openai-compatible"):
    """(service, store, its model proxy): the served apps with the started project `demo` of four agents
    whose provider `gw` is at `base_url`."""
    proxy = ModelProxy(KEY_ENV)
    with serving(tmp_path / "root", model_proxy=proxy) as service:
        gw = {"type": kind, "baseURL": base_url, "apiKeyEnv": "KEY_VAR", **(provider or {})}
        data = {"name": "demo", "task": "Gate route.",
                "agents": {name: {"tools": ["messages.send"]} for name in AGENTS},
                "scheduler": {"noEffectNudge": {"enabled": False}},
                "backend": {"kind": "local", "controllerUrl": service.base_url, "runner": {
                    "model": "main", "models": {
                        "providers": {"gw": gw},
                        "presets": {"main": {"provider": "gw", "model": "fake-model", **(preset or {})}}}}}}
        store = init_project(service.root, tmp_path / "demo", json.dumps(data))
        store.start()
        yield service, store, proxy


def woken(store, agent, priority):
    """A running activation of `agent` woken by a user message of `priority`."""
    config = suzumio_config.ProjectConfig.from_data(store.config())
    coordination.send_message(store, config, "user", f"Work, {agent}.", recipient=agent, priority=priority)
    signals = store.list_signals(target_agent=agent, status="pending")
    return coordination.start_activation(store, agent, "Work.", signals)["id"]


def model_call(service, store, agent, activation_id, body):
    return service.post("/runner/model", {
        "project": "demo", "agentId": agent, "activationId": activation_id, "token": service.token("demo", agent),
        "providerId": "gw", "presetId": "main", "body": body})


def said(text):
    return {"model": "whatever", "messages": [{"role": "user", "content": text}]}


def events(store, kind):
    return [json.loads(row["data_json"]) for _rowid, row in store.events_after(0, 10000) if row["type"] == kind]


def calls_in_threads(service, store, acts, answers):
    def run(agent):
        answers[agent] = model_call(service, store, agent, acts[agent], said(f"from {agent}"))
    return {agent: threading.Thread(target=run, args=(agent,), daemon=True) for agent in acts}


def test_one_slot_answers_four_agents_one_at_a_time_and_a_p1_woken_call_overtakes_older_p3_ones(tmp_path):
    model = FakeModel()
    try:
        with gate_service(tmp_path, model.base_url, {"limits": {"concurrency": 1}}) as (service, store, proxy):
            acts = {agent: woken(store, agent, "P1" if agent == "d" else "P3") for agent in AGENTS}
            holds = [threading.Event() for _ in AGENTS]
            for number, hold in enumerate(holds):
                model.enqueue(content=f"answer {number + 1}", usage=(10, 2, 12), hold=hold)
            answers = {}
            threads = calls_in_threads(service, store, acts, answers)
            gov = proxy.governor
            threads["a"].start()
            wait_until(lambda: len(model.requests) == 1, 10, message="a's call to reach the model")
            for count, agent in enumerate("bcd", start=1):
                threads[agent].start()
                wait_until(lambda count=count: gov.waiting(GW) == count, 10, message=f"{agent} to wait")
            assert len(model.requests) == 1, "one slot: the others wait in the controller"
            for number, hold in enumerate(holds[:-1], start=1):
                hold.set()
                wait_until(lambda number=number: len(model.requests) == number + 1, 10, message="the next call")
                assert gov.running(GW) == 1 and gov.waiting(GW) == len(AGENTS) - number - 1
            holds[-1].set()
            for thread in threads.values():
                thread.join(30)
            order = [request.body["messages"][0]["content"] for request in model.requests]
            assert order == ["from a", "from d", "from b", "from c"]
            assert all(answers[agent].json()["status"] == 200 for agent in AGENTS)
            waits = events(store, "model.waiting")
            assert [(w["agentId"], w["reason"], w["position"]) for w in waits] == [
                ("b", "concurrency", 1), ("c", "concurrency", 2), ("d", "concurrency", 1)]
            assert all(w["providerId"] == "gw" and w["activationId"] == acts[w["agentId"]] for w in waits)
            assert store.db_get("SELECT COUNT(*) AS n FROM model_calls WHERE status = 200")["n"] == 4
    finally:
        model.close()


def test_a_429_storm_with_retry_after_pauses_the_provider_once_and_every_call_is_answered_after_it(tmp_path):
    model = FakeModel()
    try:
        # the pause (3 s) is longer than one exchange may take (timeoutMs 2 s): it is no exchange's time
        with gate_service(tmp_path, model.base_url, {"timeoutMs": 2000}) as (service, store, proxy):
            acts = {agent: woken(store, agent, "P3") for agent in AGENTS}
            storm = threading.Event()
            for _ in AGENTS:
                model.enqueue_error(429, "Rate limit reached", headers={"Retry-After": "3"}, hold=storm)
            for _ in AGENTS:
                model.enqueue(content="after the pause", usage=(10, 2, 12))
            answers = {}
            threads = calls_in_threads(service, store, acts, answers)
            for thread in threads.values():
                thread.start()
            wait_until(lambda: len(model.requests) == 4, 10, message="four calls to reach the model")
            storm.set()
            wait_until(lambda: proxy.governor.paused_for(GW) > 0, 10, message="the pause")
            for thread in threads.values():
                thread.join(30)
            for agent in AGENTS:
                answer = answers[agent].json()
                assert answer["status"] == 200, answer
                assert json.loads(answer["body"])["choices"][0]["message"]["content"] == "after the pause"
            assert len(model.requests) == 8, "each call asked again once, after the pause"
            [paused] = events(store, "model.provider_paused")
            assert (paused["providerId"], paused["status"], paused["pauseMs"]) == ("gw", 429, 3000)
            assert paused["agentId"] in AGENTS and paused["untilMs"] > 0
            waits = events(store, "model.waiting")
            assert sorted(w["agentId"] for w in waits) == list(AGENTS)
            assert {w["reason"] for w in waits} == {"paused"}
            assert [r["status"] for r in events(store, "model.retry")] == [429] * 4
            assert store.db_get("SELECT COUNT(*) AS n FROM model_calls WHERE status = 200")["n"] == 4
    finally:
        model.close()


def test_the_model_loop_holds_a_waiting_call_without_a_thread_and_ends_it_when_it_closes(model):
    model_loop = suzumio_model_loop.ModelLoop()
    proxy = ModelProxy(KEY_ENV)
    config = config_with(gw={"baseURL": model.base_url, "limits": {"concurrency": 1}})
    hold = threading.Event()
    model.enqueue(content="held", hold=hold)
    outcomes = []

    def run(text):
        try:
            outcomes.append(model_loop.run(Forwarding(proxy, config, "pm", "gw", "main", said(text))))
        except SuzumioError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=run, args=(text,), daemon=True) for text in ("first", "second")]
    try:
        threads[0].start()
        wait_until(lambda: len(model.requests) == 1, 10, message="the first call at the model")
        threads[1].start()
        wait_until(lambda: len(model_loop.waiting) == 1, 10, message="the second call to wait in the loop")
        assert proxy.governor.waiting(GW) == 1 and model_loop.open_exchanges == 1
        model_loop.close()
        for thread in threads:
            thread.join(10)
        assert [str(o) for o in outcomes] == ["The model loop is shut down"] * 2, "in flight and waiting alike"
        assert proxy.governor.waiting(GW) == 0 and proxy.governor.running(GW) == 0
    finally:
        hold.set()
        model_loop.close()
        threads[0].join(10)


def test_requests_per_minute_hold_a_call_until_the_injected_clock_moves_a_minute_on(model):
    clock = Clock()
    proxy = ModelProxy(KEY_ENV, clock=clock)
    config = config_with(gw={"baseURL": model.base_url, "limits": {"requestsPerMinute": 1}})
    model.enqueue(content="first")
    model.enqueue(content="second")
    waits, outcome = [], []
    assert proxy.forward(config, "pm", "gw", "main", said("one"), on_wait=waits.append).status == 200
    second = threading.Thread(target=lambda: outcome.append(
        proxy.forward(config, "pm", "gw", "main", said("two"), on_wait=waits.append)), daemon=True)
    second.start()
    wait_until(lambda: proxy.governor.waiting(GW) == 1, 10, message="the second call to wait")
    assert waits == [{"providerId": "gw", "presetId": "main", "reason": "rpm", "position": 1}]
    assert len(model.requests) == 1
    clock.now += 59
    proxy.governor.pump(GW)
    assert proxy.governor.waiting(GW) == 1
    clock.now += 1
    proxy.governor.pump(GW)
    second.join(10)
    assert outcome[0].status == 200 and len(model.requests) == 2


def test_a_retry_after_longer_than_the_retry_window_is_answered_and_pauses_nobody(model):
    proxy = ModelProxy(KEY_ENV)
    config = config_with(gw={"baseURL": model.base_url})
    pauses = []
    model.enqueue_error(429, "come back tomorrow", headers={"Retry-After": "86400"})
    assert proxy.forward(config, "pm", "gw", "main", said("x"), on_pause=pauses.append).status == 429
    assert pauses == [] and proxy.governor.paused_for(GW) == 0.0


@pytest.mark.parametrize("way", ["threaded", "loop"])
def test_the_first_byte_timeout_is_apart_from_the_wait_between_bytes(model, way):
    model_loop = suzumio_model_loop.ModelLoop()

    def forward(config):
        forwarding = Forwarding(ModelProxy(KEY_ENV), config, "pm", "gw", "main", said("x"))
        return forwarding.proxy.drive(forwarding) if way == "threaded" else model_loop.run(forwarding)

    try:
        patient = config_with(gw={"baseURL": model.base_url, "chunkTimeoutMs": 300, "firstByteTimeoutMs": 5000})
        model.enqueue(content="slow to start", delay=0.6)  # past chunkTimeoutMs, within the first byte's
        assert forward(patient).status == 200
        model.enqueue(content="slow first token", first_delay=0.6)  # the head at once, its first event later
        assert forward(patient).status == 200
        hasty = config_with(gw={"baseURL": model.base_url, "chunkTimeoutMs": 5000, "firstByteTimeoutMs": 200,
                                "options": {"maxRetries": 0}})
        model.enqueue(content="too slow", delay=0.6)
        with pytest.raises(SuzumioError, match="timed out"):
            forward(hasty)
    finally:
        model_loop.close()


@pytest.fixture
def model():
    server = FakeModel()
    yield server
    server.close()


# ---------------------------------------------------------------- cached prompt tokens, each dialect

PRICING = {"inputPerMTok": 2.0, "outputPerMTok": 10.0, "cacheReadPerMTok": 0.5, "cacheWritePerMTok": 2.5}
SYSTEM_AND_TOOLS = {"model": "whatever",
                    "messages": [{"role": "system", "content": "You are a."}, {"role": "user", "content": "Go."}],
                    "tools": [{"type": "function", "function": {"name": f"tool_{n}", "description": "d",
                                                                "parameters": {"type": "object"}}}
                              for n in (1, 2)],
                    "tool_choice": "auto"}
FRESH, CACHED, WRITTEN, OUTPUT = 100, 600, 300, 50


def _cached_server(dialect):
    """(server, provider type, its reply queued): prompt FRESH + CACHED (+ WRITTEN for Anthropic)."""
    if dialect == "anthropic":
        server = FakeAnthropic()
        server.enqueue(text="cached", usage=(FRESH, OUTPUT, CACHED, WRITTEN))
        return server, "anthropic"
    prompt = FRESH + CACHED
    usage = {"prompt_tokens": prompt, "completion_tokens": OUTPUT, "total_tokens": prompt + OUTPUT}
    if dialect == "openai":
        server = FakeModel()
        usage["prompt_tokens_details"] = {"cached_tokens": CACHED}
    elif dialect == "llamacpp-timings":
        server = FakeModel("llamacpp")
        usage["cache_n"] = CACHED
    else:  # a recent llama.cpp reports both; usage is preferred
        server = FakeModel("llamacpp")
        usage.update(prompt_tokens_details={"cached_tokens": CACHED}, cache_n=CACHED - 1)
    server.enqueue(content="cached", usage=usage)
    return server, "openai-compatible"


@pytest.mark.parametrize("dialect", ["openai", "llamacpp-timings", "llamacpp-usage", "anthropic"])
def test_cached_prompt_tokens_of_each_dialect_reach_the_usage_rows_and_the_cost(tmp_path, dialect):
    server, kind = _cached_server(dialect)
    written = WRITTEN if dialect == "anthropic" else 0
    try:
        with gate_service(tmp_path, server.base_url, kind=kind, preset={"pricing": PRICING}) as (service, store, _):
            act = woken(store, "a", "P3")
            answer = model_call(service, store, "a", act, SYSTEM_AND_TOOLS).json()
            assert answer["status"] == 200, answer
            row = store.db_get("SELECT tokens, cached_tokens, cache_write_tokens, cost_usd FROM model_calls")
            prompt = FRESH + CACHED + written
            assert (row["tokens"], row["cached_tokens"], row["cache_write_tokens"]) == \
                (prompt + OUTPUT, CACHED, written)
            # fresh input at $2, cache reads at $0.50, cache writes at $2.50, output at $10 per million
            cost = (FRESH * 2.0 + CACHED * 0.5 + written * 2.5 + OUTPUT * 10.0) / 1e6
            assert row["cost_usd"] == pytest.approx(cost)
            costs = service.get("/api/projects/demo/costs").json()
            for spend in (costs["project"], costs["agents"]["a"], costs["activations"][act]):
                assert (spend["cachedTokens"], spend["cacheWriteTokens"]) == (CACHED, written)
                assert spend["costUsd"] == pytest.approx(cost)
            summary = service.get("/api/projects/demo").json()
            assert summary["spend"]["cachedTokens"] == CACHED
            assert summary["agentSpend"]["a"]["cachedTokens"] == CACHED
            if dialect == "anthropic":
                # the stable prefix carries cache breakpoints: the system prompt and the last tool
                sent = server.requests[0].body
                assert sent["system"][-1]["cache_control"] == {"type": "ephemeral"}
                assert sent["tools"][-1]["cache_control"] == {"type": "ephemeral"}
                assert "cache_control" not in sent["tools"][0]
    finally:
        server.close()


def test_real_runners_on_one_slot_take_turns_and_both_activations_complete(tmp_path):
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}, "worker-1": {"model": "worker", "tools": WORKER_TOOLS}}
    # the worker's call waits in the controller; its runner only waits for the answer
    with running_team(tmp_path, "local", agents=agents,
                      fake_provider={"limits": {"concurrency": 1}, "timeoutMs": 5000}) as team:
        hold = threading.Event()
        team.model.enqueue(content="The pm is done.", model="pm", hold=hold)
        team.model.enqueue(content="The worker is done.", model="worker-1")
        team.send("pm", "Start.")
        team.wait_for(lambda: team.model.in_flight == 1, 60, "the pm's call at the model")
        team.send("worker-1", "Start too.")
        team.wait_for(lambda: team.events("model.waiting"), 60, "the worker's call to wait")
        [waiting] = team.events("model.waiting")
        assert (waiting["data"]["agentId"], waiting["data"]["reason"]) == ("worker-1", "concurrency")
        assert team.model.in_flight == 1 and len(team.model.requests) == 1
        hold.set()
        [pm] = team.wait_activations("pm", 1)
        [worker] = team.wait_activations("worker-1", 1)
        assert (pm["status"], worker["status"]) == ("completed", "completed"), (pm.get("error"), worker.get("error"))
