"""Runaway protection: the per-project token budget `backend.runner.budget.maxTokens` (config, the
window, the one-transaction pause, the user message, `start` as the resume), and the activation
timeout on both backends. Real SQLite files, the real `local` backend and the real app throughout."""
import copy
import datetime
import json
import os
import sqlite3
import threading

import pytest
from api_fixtures import init_project, serving
from backend_fixtures import (
    Env,
    events_of,
    make_support_dir,
    open_activation,
    process_group_alive,
    project_config,
)
from conftest import require, wait_until
from fake_model import FakeModel
from store_fixtures import CONFIGS, config_of

import suzumio_backend as backend
import suzumio_config as config
import suzumio_coordination as coordination
import suzumio_scheduler as scheduler
import suzumio_yaml
from suzumio_backend_reconcile import Reconciler
from suzumio_errors import ConfigError
from suzumio_records import parse_ts, to_datetime, usage_tokens

pytestmark = pytest.mark.timeout(120)

BASE = {
    "name": "t",
    "task": "T",
    "backend": {"runner": {"model": "main", "models": {
        "providers": {"g": {"type": "openai-compatible", "apiKeyEnv": "K"}},
        "presets": {"main": {"provider": "g", "model": "m"}}}}},
    "agents": {"pm": {"tools": ["messages.send"]}},
}


def with_budget(budget):
    data = copy.deepcopy(BASE)
    data["backend"]["runner"]["budget"] = budget
    return data


def load(tmp_path, data):
    path = tmp_path / "p.yaml"
    path.write_text(suzumio_yaml.dump_yaml(data))
    return config.load_project(path, env={})


def config_error(tmp_path, data):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, data)
    return str(caught.value)


# ---------------------------------------------------------------- config

def test_budget_renders_after_the_runner_limits_and_round_trips(tmp_path):
    data = with_budget({"maxTokens": 5000, "unknown": 1})
    data["backend"]["runner"]["maxToolCalls"] = 3
    loaded = load(tmp_path, data)
    assert loaded.backend.runner.budget_max_tokens == 5000
    runner = suzumio_yaml.parse_yaml(loaded.render())["backend"]["runner"]
    assert list(runner) == ["mode", "model", "maxToolCalls", "budget", "models"]
    assert runner["budget"] == {"maxTokens": 5000}
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "p.yaml").write_text(loaded.render())
    again = config.load_project(tmp_path / "again" / "p.yaml", env={})
    assert suzumio_yaml.parse_yaml(again.render()) == suzumio_yaml.parse_yaml(loaded.render())
    assert again.backend.runner.budget_max_tokens == 5000


def test_absent_budget_means_no_limit_and_is_not_rendered(tmp_path):
    loaded = load(tmp_path, copy.deepcopy(BASE))
    assert loaded.backend.runner.budget_max_tokens is None
    assert "budget" not in suzumio_yaml.parse_yaml(loaded.render())["backend"]["runner"]


@pytest.mark.parametrize("budget, issue", [
    ({}, "backend.runner.budget: budget needs maxTokens or maxCostUsd"),
    ({"maxTokens": 0}, "backend.runner.budget.maxTokens: Number must be greater than 0"),
    ({"maxTokens": -5}, "backend.runner.budget.maxTokens: Number must be greater than 0"),
    ({"maxTokens": 1.5}, "backend.runner.budget.maxTokens: Expected integer, received float"),
    ({"maxTokens": "5000"}, "backend.runner.budget.maxTokens: Expected number, received string"),
    ({"maxTokens": True}, "backend.runner.budget.maxTokens: Expected number, received boolean"),
    (5000, "backend.runner.budget: Expected object, received number"),
    (None, "backend.runner.budget: Expected object, received null"),
])
def test_invalid_budget_is_a_config_error_naming_the_field(tmp_path, budget, issue):
    assert config_error(tmp_path, with_budget(budget)) == f"Invalid project config:\n  - {issue}"


# ---------------------------------------------------------------- usage accounting

@pytest.mark.parametrize("usage, tokens", [
    ({"model": "main", "tokens": {"input": 70, "output": 30, "total": 120}}, 120),
    ({"tokens": {"input": 70, "output": 30}}, 100),
    ({"tokens": {"input": 70}}, 70),
    ({"tokens": {"total": None, "input": 5, "output": 6}}, 11),
    ({"tokens": {"total": True, "input": 5}}, 5),
    ({"tokens": {"total": "12"}}, 0),
    ({"model": "main"}, 0),
    ({}, 0),
    (None, 0),
])
def test_usage_tokens_take_the_total_else_input_plus_output(usage, tokens):
    assert usage_tokens(usage) == tokens


# ---------------------------------------------------------------- the pause (store + tick)

def budget_env(tmp_path, max_tokens, **options):
    """A running local project (stand-in runner) whose config carries the given token budget."""
    cfg = project_config(**options)
    if max_tokens is not None:
        cfg["backend"]["runner"]["budget"] = {"maxTokens": max_tokens}
    cfg.setdefault("scheduler", {})["noEffectNudge"] = {"enabled": False}
    environ = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    return Env(tmp_path, cfg, environ, make_support_dir(tmp_path / "support"))


def tick(env, now=None):
    scheduler.tick(env.store, env.backends, scheduler.NoHooks(), to_datetime(now), CONFIGS)


def provider_used(env, act, total):
    """What the controller's model proxy records when a provider answers with `total` tokens."""
    env.store.record_model_call(act["id"], act["agentId"], "g", "main", 200,
                                {"input": total - 1, "output": 1, "total": total})


def finish(env, agent_id, total, now=None):
    """Run one activation of the agent to completion: the provider reported `total` tokens to the
    controller, and the runner reports the same (the budget counts only the former)."""
    act = open_activation(env, agent_id)
    provider_used(env, act, total)
    usage = {"selectedModel": "main", "model": "main", "apiModel": "team",
             "tokens": {"input": total - 1, "output": 1, "total": total}}
    coordination.complete_activation(env.store, config_of(env.store), act["id"], agent_id, "done", usage=usage, now=now)
    return act


def budget_messages(env):
    """The pause notices to the user (the 80% warnings are counted apart)."""
    return [m for m in env.store.list_messages(1000, full_body=True)
            if m["sender"] == "scheduler" and not m["body"].startswith("Budget warning")]


def test_budget_reached_stops_the_project_once_and_lets_the_running_activation_finish(tmp_path):
    env = budget_env(tmp_path, 1000)
    try:
        running = open_activation(env, "worker")
        finish(env, "pm", 1200)
        coordination.send_message(env.store, config_of(env.store), "user", "More work", recipient="pm")
        tick(env)
        assert env.store.project()["status"] == "stopped"
        [event] = events_of(env.store, "project.budget_exceeded")
        assert event["data"] == {"maxTokens": 1000, "usedTokens": 1200}
        [message] = budget_messages(env)
        assert message["recipient"] == "user" and message["priority"] == "P2"
        assert "1200 tokens used" in message["body"] and "maxTokens: 1000" in message["body"]
        assert "`suzumio start demo` to resume with a fresh budget" in message["body"]
        assert [e["data"]["status"] for e in events_of(env.store, "project.status")][-1] == "stopped"
        assert env.store.activation(running["id"])["status"] == "running", "no cancellation"
        assert env.store.list_signals(kind="scheduler.resume_after_stop") == []

        provider_used(env, running, 50)
        coordination.complete_activation(env.store, config_of(env.store), running["id"], "worker", "finished",
                                         usage={"tokens": {"total": 50}})
        tick(env)
        assert env.store.activation(running["id"])["status"] == "completed"
        assert env.store.agent("worker")["status"] == "quiet"
        assert len(env.store.list_activations(100)) == 2, "no activation started after the pause"
        assert [s["status"] for s in coordination.pending_signals(env.store, config_of(env.store), "pm")] == ["pending"]
        assert len(events_of(env.store, "project.budget_exceeded")) == 1
        assert len(budget_messages(env)) == 1
    finally:
        env.close()


def test_usage_below_the_budget_keeps_scheduling(tmp_path):
    env = budget_env(tmp_path, 1000)
    try:
        finish(env, "pm", 999)
        coordination.send_message(env.store, config_of(env.store), "user", "More work", recipient="pm")
        tick(env)
        assert env.store.project()["status"] == "running"
        assert env.store.agent("pm")["status"] == "running"
        assert events_of(env.store, "project.budget_exceeded") == []
    finally:
        env.close()


def test_usage_adds_up_across_agents_and_activations(tmp_path):
    env = budget_env(tmp_path, 1000)
    try:
        finish(env, "pm", 400)
        finish(env, "worker", 400)
        tick(env)
        assert env.store.project()["status"] == "running"
        finish(env, "pm", 200)
        assert env.store.window_tokens() == 1000
        tick(env)
        assert env.store.project()["status"] == "stopped"
        assert events_of(env.store, "project.budget_exceeded")[0]["data"]["usedTokens"] == 1000
    finally:
        env.close()


def test_the_runners_own_report_is_not_counted_and_every_forwarded_call_is(tmp_path):
    env = budget_env(tmp_path, 1000)
    try:
        act = open_activation(env, "pm")
        coordination.complete_activation(env.store, config_of(env.store), act["id"], "pm", "done",
                                         usage={"tokens": {"total": 1_000_000}})
        tick(env)
        assert env.store.project()["status"] == "running", "a runner's report proves nothing"
        assert env.store.window_tokens() == 0

        act = open_activation(env, "worker")
        for total in (300, 400):
            provider_used(env, act, total)
        env.store.record_model_call(act["id"], "worker", "g", "main", 429, {})
        assert env.store.window_tokens() == 0, "a running activation counts once it ends"
        coordination.complete_activation(env.store, config_of(env.store), act["id"], "worker", "done",
                                         usage={"tokens": {"total": 0}})
        assert env.store.window_tokens() == 700
        assert env.store.model_usage(act["id"]) == {
            "calls": 3, "tokens": {"input": 698, "output": 2, "total": 700}}

        # cancelled and failed activations spent their tokens too
        cancelled = open_activation(env, "pm")
        provider_used(env, cancelled, 200)
        coordination.cancel_activation(env.store, cancelled["id"], "restarted")
        failed = open_activation(env, "pm")
        provider_used(env, failed, 100)
        coordination.fail_activation(env.store, failed["id"], "Runner exited with 1")
        assert env.store.window_tokens() == 1000
        tick(env)
        assert env.store.project()["status"] == "stopped"
    finally:
        env.close()


def test_absent_budget_never_pauses(tmp_path):
    env = budget_env(tmp_path, None)
    try:
        finish(env, "pm", 10_000_000)
        coordination.send_message(env.store, config_of(env.store), "user", "More work", recipient="pm")
        tick(env)
        assert env.store.project()["status"] == "running"
        assert env.store.agent("pm")["status"] == "running"
        assert events_of(env.store, "project.budget_exceeded") == []
    finally:
        env.close()


def test_start_grants_a_fresh_window_and_a_later_overrun_pauses_again(tmp_path):
    env = budget_env(tmp_path, 1000)
    try:
        running = open_activation(env, "worker")
        finish(env, "pm", 1500)
        tick(env)
        assert env.store.project()["status"] == "stopped"
        coordination.send_message(env.store, config_of(env.store), "user", "Carry on", recipient="pm")

        env.store.start()
        assert env.store.window_tokens() == 0
        tick(env)
        assert env.store.project()["status"] == "running"
        [resumed] = env.store.running_activations()[1:]
        assert resumed["agentId"] == "pm", "the pending message started pm in the new window"

        # an activation that was running across the restart counts in the new window
        provider_used(env, running, 600)
        provider_used(env, resumed, 300)
        coordination.complete_activation(env.store, config_of(env.store), running["id"], "worker", "done",
                                         usage={"tokens": {"total": 600}})
        coordination.complete_activation(env.store, config_of(env.store), resumed["id"], "pm", "done",
                                         usage={"tokens": {"total": 300}})
        tick(env)
        assert env.store.project()["status"] == "running" and env.store.window_tokens() == 900
        finish(env, "pm", 100)
        tick(env)
        assert env.store.project()["status"] == "stopped"
        assert [e["data"]["usedTokens"] for e in events_of(env.store, "project.budget_exceeded")] == [1500, 1000]
        assert len(budget_messages(env)) == 2
    finally:
        env.close()


def test_pause_for_budget_changes_nothing_unless_running_and_over_budget(tmp_path):
    env = budget_env(tmp_path, None)
    try:
        finish(env, "pm", 500)
        assert coordination.pause_for_budget(env.store, 501) is None
        assert env.store.project()["status"] == "running"
        env.store.set_status("submitted")
        assert coordination.pause_for_budget(env.store, 100) is None
        assert env.store.project()["status"] == "submitted"
        assert events_of(env.store, "project.budget_exceeded") == []
        assert budget_messages(env) == []
    finally:
        env.close()


def test_concurrent_pauses_record_one_event_and_one_message(tmp_path):
    env = budget_env(tmp_path, None)
    try:
        finish(env, "pm", 500)
        results, barrier = [], threading.Barrier(4)

        def pause():
            barrier.wait()
            results.append(coordination.pause_for_budget(env.store, 100))

        threads = [threading.Thread(target=pause) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(results, key=lambda r: r is None) == [{"maxTokens": 100, "usedTokens": 500}] + [None] * 3
        assert len(events_of(env.store, "project.budget_exceeded")) == 1
        assert len(budget_messages(env)) == 1
    finally:
        env.close()


def test_pause_is_one_transaction(tmp_path):
    env = budget_env(tmp_path, None)
    try:
        finish(env, "pm", 500)
        # the message insert fails after the status update and the event: nothing of the pause remains
        with env.store.write() as tx:
            tx.execute("CREATE TRIGGER refuse_budget_message BEFORE INSERT ON messages "
                       "WHEN NEW.sender = 'scheduler' BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            coordination.pause_for_budget(env.store, 100)
        assert env.store.project()["status"] == "running"
        assert events_of(env.store, "project.budget_exceeded") == []
        assert [e["data"]["status"] for e in events_of(env.store, "project.status")] == ["running"]
    finally:
        env.close()


# ---------------------------------------------------------------- end to end: real app, runner, model

E2E_YAML = """\
name: demo
task: Count to three.
channels: ["#project"]
agents:
  pm:
    tools: [messages.send]
scheduler:
  noEffectNudge: {{enabled: false}}
tools:
  toolpacks: [core]
backend:
  kind: local
  controllerUrl: "{controller_url}"
  runner:
    model: main
    budget: {{maxTokens: 100}}
    models:
      providers:
        fake: {{type: openai-compatible, baseURL: "{model_url}", apiKey: test-key}}
      presets:
        main: {{provider: fake, model: fake-model}}
"""


def test_real_runner_usage_pauses_the_project_and_start_resumes_it(tmp_path):
    model = FakeModel()
    try:
        # the scheduler thread never ticks on its own here: every tick comes from a route
        with serving(tmp_path / "root", scheduler_interval=3600) as service:
            text = E2E_YAML.format(controller_url=service.base_url, model_url=model.base_url)
            init_project(service.root, tmp_path / "demo", text).start()
            demo = service.store("demo")
            model.enqueue(content="One.", usage=(60, 20, 80))
            model.enqueue(content="Two.", usage=(50, 20, 70))

            posted = service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "Say one."})
            assert posted.status_code == 200, posted.text
            wait_until(lambda: [a["status"] for a in demo.list_activations()] == ["completed"], 30,
                       message="first activation completed")
            assert demo.project()["status"] == "running", "80 of 100 tokens used"
            assert demo.window_tokens() == 80

            service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "Say two."})
            wait_until(lambda: demo.project()["status"] == "stopped", 30, message="project paused")
            activations = demo.list_activations()
            assert [a["status"] for a in activations] == ["completed", "completed"]
            usage = demo.activation(activations[1]["id"])["usage"]
            assert usage["tokens"] == {"input": 50, "output": 20, "total": 70}
            assert service.get("/api/projects/demo").json()["status"] == "stopped"
            events = service.get("/api/projects/demo/events").json()
            [exceeded] = [e for e in events if e["type"] == "project.budget_exceeded"]
            assert json.loads(exceeded["data_json"]) == {"maxTokens": 100, "usedTokens": 150}
            messages = service.get("/api/projects/demo/messages").json()
            warning, notice = [m for m in messages if m["sender"] == "scheduler"]
            assert warning["body"].startswith("Budget warning for project demo: 80 of 100 tokens")
            assert notice["recipient"] == "user" and notice["priority"] == "P2"
            assert "`suzumio start demo`" in notice["body"]

            service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "Say three."})
            assert len(demo.list_activations()) == 2, "no activation starts while paused"

            model.enqueue(content="Three.", usage=(10, 5, 15))
            assert service.post("/api/projects/demo/start").status_code == 200
            wait_until(lambda: [a["status"] for a in demo.list_activations()][2:] == ["completed"], 30,
                       message="the resumed activation completed")
            assert demo.project()["status"] == "running"
            assert demo.window_tokens() == 15
            assert len([m for m in demo.list_messages(100) if m["sender"] == "scheduler"]) == 2, "warning, pause"
            assert len(model.requests) == 3
    finally:
        model.close()


# ---------------------------------------------------------------- the activation timeout, both backends

def test_local_timeout_in_a_tick_fails_the_activation_and_kills_its_runner(tmp_path):
    env = budget_env(tmp_path, None, agent_env={"STANDIN_MODE": "sleep"}, timeout_ms=1000)
    try:
        coordination.send_message(env.store, config_of(env.store), "user", "Work", recipient="worker")
        tick(env)
        [act] = env.store.running_activations()
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        wait_until(lambda: (env.store.dir / "agents/worker/workspace/standin-seen.json").exists(), 10,
                   message="the stand-in runner started")
        tick(env, parse_ts(act["startedAt"]) + datetime.timedelta(milliseconds=999))
        assert env.store.activation(act["id"])["status"] == "running"
        tick(env, parse_ts(act["startedAt"]) + datetime.timedelta(milliseconds=1000))
        final = env.store.activation(act["id"])
        assert final["status"] == "failed" and final["error"] == "activation timed out"
        assert env.store.agent("worker")["status"] == "failed"
        wait_until(lambda: not process_group_alive(pid), 5, message="the timed-out runner is gone")
    finally:
        env.close()


def docker_engine():
    import requests

    import docker
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get("suzumio-runner:dev")
        return client
    except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
        require("docker")(f"no Docker engine with suzumio-runner:dev: {error}")


def test_docker_timeout_in_reconcile_fails_the_activation_and_stops_its_container(tmp_path):
    client = docker_engine()
    env = budget_env(tmp_path, None, kind="docker-chat", docker={"network": "host"},
                     agent_env={"STANDIN_MODE": "sleep"}, timeout_ms=1000)
    name = None
    try:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        name = env.store.activation(act["id"])["containerName"]
        wait_until(lambda: client.containers.get(name).status == "running", 30, message="container running")
        env.store.set_status("submitted")  # reconcile applies the timeout whatever the project status
        Reconciler(env.backends).reconcile([env.store], now=parse_ts(act["startedAt"]) + datetime.timedelta(seconds=2))
        final = env.store.activation(act["id"])
        assert final["status"] == "failed" and final["error"] == "activation timed out"
        assert client.containers.get(name).status == "exited"
    finally:
        env.close()
        if name:
            client.containers.get(name).remove(force=True)
