"""Backend tests that need no Docker engine: environment, proxies, redaction, mounts validation, and
the whole `local` backend (docs/design/runner.md scenarios 53-57, 59, 60) with a stand-in runner."""
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from backend_fixtures import (
    ControllerDied,
    agent_history_kinds,
    dies_before_recording,
    events_of,
    local_project,
    open_activation,
    process_group_alive,
    project_config,
)
from conftest import wait_until

import suzumio_backend as backend
import suzumio_backend_local
import suzumio_config
import suzumio_coordination as coordination
from suzumio_backend_reconcile import Reconciler
from suzumio_records import parse_ts

GW = {"gw": {"type": "openai-compatible", "apiKeyEnv": "GW_KEY", "baseURL": "http://127.0.0.1:9/v1"}}


def typed(**options):
    """A ProjectConfig built from the fixture's project YAML, with overrides applied."""
    return suzumio_config.ProjectConfig.from_data(project_config(**options))


def with_provider(config, **provider):
    config["backend"]["runner"]["models"]["providers"]["gw"] = {"type": "openai-compatible", **provider}
    return config


# ---------------------------------------------------------------- pure helpers

def test_safe_name_collapses_runs_of_other_characters():
    assert backend.safe_name("suzumio_my proj_worker/1_act_1") == "suzumio_my_proj_worker_1_act_1"
    assert backend.safe_name("a!!b") == "a_b"


def test_env_order_no_provider_variables_and_agent_override():
    data = with_provider(project_config(kind="docker-chat"), apiKeyEnv="GW_KEY", baseURLEnv="GW_URL",
                         apiKey="literal-key", baseURL="http://x")
    data["agents"]["worker"]["env"] = {"SUZUMIO_AGENT": "x"}
    config = suzumio_config.ProjectConfig.from_data(data)
    env = backend.activation_env(config, {"id": "worker", "token": "T"}, "act_1", {"GW_KEY": "k1"}, True)
    assert list(env)[:4] == ["SUZUMIO_PROJECT", "SUZUMIO_AGENT", "SUZUMIO_ACTIVATION", "SUZUMIO_TOKEN"]
    assert env["SUZUMIO_PROJECT"] == "demo" and env["SUZUMIO_TOKEN"] == "T"
    assert env["SUZUMIO_AGENT"] == "x"
    # model requests go through the controller: no provider key or URL variable reaches the runner
    assert "GW_KEY" not in env and "GW_URL" not in env
    assert "literal-key" not in env.values() and "k1" not in env.values()
    assert env["PYTHONUNBUFFERED"] == "1"


def test_counted_agents_use_the_base_entry_env():
    data = project_config(kind="docker-chat", agents={"worker": {"count": 2, "env": {"E": "1"}}})
    env = backend.activation_env(suzumio_config.ProjectConfig.from_data(data),
                                 {"id": "worker-2", "token": "T"}, "act_1", {}, True)
    assert env["E"] == "1"


@pytest.mark.parametrize("network, proxy, expected", [
    (None, {}, "http://host.docker.internal:7890"),
    ("none", {}, "http://host.docker.internal:7890"),
    ("host", {}, "http://127.0.0.1:7890"),
    (None, {"rewriteLocalhost": False}, "http://127.0.0.1:7890"),
])
def test_proxy_rewrite_of_loopback_hosts(network, proxy, expected):
    docker_cfg = {"proxy": proxy}
    if network:
        docker_cfg["network"] = network
    config = typed(kind="docker-chat", docker=docker_cfg)
    environ = {"HTTPS_PROXY": "http://127.0.0.1:7890", "NO_PROXY": "localhost"}
    env = backend.activation_env(config, {"id": "worker", "token": "T"}, "act_1", environ, True)
    assert env["HTTPS_PROXY"].rstrip("/") == expected
    assert env["NO_PROXY"] == "localhost"


def test_proxy_explicit_values_replace_inherited_and_drop_lower_case():
    agent = {"id": "worker", "token": "T"}
    config = typed(kind="docker-chat", docker={"proxy": {"inheritEnv": False, "https": "http://p:1"}})
    env = backend.activation_env(config, agent, "a", {"HTTP_PROXY": "http://a:1"}, True)
    assert {k: v for k, v in env.items() if "PROXY" in k.upper()} == {"HTTPS_PROXY": "http://p:1"}
    config = typed(kind="docker-chat", docker={"proxy": {"https": "b"}})
    env = backend.activation_env(config, agent, "a", {"https_proxy": "a"}, True)
    assert env["HTTPS_PROXY"] == "b" and "https_proxy" not in env


def test_local_never_rewrites_proxies():
    env = backend.activation_env(typed(), {"id": "worker", "token": "T"}, "a",
                                 {"HTTPS_PROXY": "http://127.0.0.1:7890"}, False)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:7890"


def test_secret_values_cover_token_keys_headers_and_agent_env():
    data = with_provider(project_config(), apiKey="inline", apiKeyEnv="GW_KEY", baseURL="http://x",
                         headers={"Authorization": "Bearer h", "X-Plain": "visible"},
                         options={"apiKey": "opt-key"})
    data["backend"]["runner"]["models"]["presets"]["main"]["headers"] = {"x-api-key": "preset-key"}
    data["agents"]["worker"]["env"] = {"MY_TOKEN": "agent-secret", "COLOR": "blue"}
    config = suzumio_config.ProjectConfig.from_data(data)
    secrets = backend.secret_values(config, {"id": "worker", "token": "TOKEN"}, {"GW_KEY": "envkey"})
    assert set(secrets) == {"TOKEN", "inline", "envkey", "Bearer h", "opt-key", "preset-key", "agent-secret"}
    assert backend.redact("TOKEN envkey visible blue", secrets) == "<redacted> <redacted> visible blue"


def test_input_runner_section_keeps_what_the_runner_needs_and_no_credential():
    data = with_provider(project_config(), apiKey="inline", apiKeyEnv="GW_KEY", baseURL="http://user:pw@x/v1",
                         baseURLEnv="GW_URL", headers={"Authorization": "Bearer h", "X-Plain": "visible"},
                         timeoutMs=5000, chunkTimeoutMs=100,
                         options={"apiKey": "opt-key", "maxRetries": 2, "queryParams": {"k": "q"},
                                  "headers": {"X-Opt": "o"}})
    data["backend"]["runner"]["models"]["presets"]["main"] = {
        "provider": "gw", "model": "m", "headers": {"x-api-key": "preset-key"}, "temperature": 0.5,
        "providerOptions": {"gw": {"seed": 1}}}
    section = backend.runner_section(suzumio_config.ProjectConfig.from_data(data))
    assert section["models"]["providers"]["gw"] == {"type": "openai-compatible", "timeoutMs": 5000,
                                                    "chunkTimeoutMs": 100, "options": {"maxRetries": 2}}
    scripted = section["models"]["providers"]["replay"]
    assert scripted["type"] == "scripted" and scripted["script"]["agents"]
    main = section["models"]["presets"]["main"]
    assert "headers" not in main and main["temperature"] == 0.5 and main["providerOptions"] == {"gw": {"seed": 1}}
    assert (section["mode"], section["model"]) == ("ai", "main")
    text = json.dumps(section)
    for value in ("inline", "GW_KEY", "GW_URL", "user:pw", "Bearer h", "visible", "opt-key", "preset-key", "q"):
        assert value not in text, value


def test_controller_url_for_local_runner():
    assert backend.local_controller_url("http://host.docker.internal:39400/x") == "http://127.0.0.1:39400/x"
    assert backend.local_controller_url("http://10.0.0.1:1") == "http://10.0.0.1:1"


@pytest.mark.parametrize("target", ["/workspace/ref", "/artifacts", "/activation/x", "/opt/suzumio/x",
                                    "/toolpacks", "//workspace/../workspace/a"])
def test_reserved_mount_targets_are_rejected(tmp_path, target):
    with pytest.raises(ValueError, match="Docker mount target is reserved"):
        backend.validate_mount(suzumio_config.Mount(str(tmp_path), target))


def test_mount_source_must_exist_and_target_be_absolute(tmp_path):
    with pytest.raises(FileNotFoundError):
        backend.validate_mount(suzumio_config.Mount(str(tmp_path / "nope"), "/mnt/x"))
    with pytest.raises(ValueError, match="must be absolute"):
        backend.validate_mount(suzumio_config.Mount(str(tmp_path), "mnt/x"))
    assert backend.validate_mount(suzumio_config.Mount(str(tmp_path), "/mnt//a/./b")) == "/mnt/a/b"


def test_timeout_is_reached_at_exactly_the_limit():
    import datetime
    act = {"startedAt": "2026-01-01T00:00:00.000Z"}
    start = parse_ts(act["startedAt"])
    assert backend.is_timed_out(act, 1000, start + datetime.timedelta(milliseconds=1000))
    assert not backend.is_timed_out(act, 1000, start + datetime.timedelta(milliseconds=999))


def test_liveness_requires_the_activation_id_in_the_command_line():
    # The test process itself is alive but its command line names no activation.
    assert not suzumio_backend_local.local_runner_alive(os.getpid(), "act_0_deadbeef")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "act_1_cafebabe"])
    try:
        assert suzumio_backend_local.local_runner_alive(child.pid, "act_1_cafebabe")
    finally:
        child.kill()
        child.wait()
    assert not suzumio_backend_local.local_runner_alive(child.pid, "act_1_cafebabe")


# ---------------------------------------------------------------- the local backend, end to end

def test_local_start_writes_private_input_with_host_paths(tmp_path):
    with local_project(tmp_path, controller_url="http://host.docker.internal:{port}") as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        done = wait_until(lambda: env.store.activation(act["id"])["status"] == "completed", 15,
                          message="local activation completed")
        assert done
        project_dir = env.store.dir
        activations = project_dir / "activations"
        assert stat.S_IMODE(os.stat(activations).st_mode) == 0o700
        input_path = activations / act["id"] / "input.json"
        assert stat.S_IMODE(os.stat(input_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(activations / act["id"] / "runner.log").st_mode) == 0o600
        data = json.loads(input_path.read_text())
        assert list(data) == ["project", "agent", "activation", "workspace", "artifactsRoot", "readRoots",
                              "writeRoots", "controllerUrl", "egress", "token", "runner", "tools", "toolpacks",
                              "history"]
        workspace = os.path.realpath(project_dir / "agents" / "worker" / "workspace")
        artifacts = os.path.realpath(project_dir / "artifacts")
        assert data["workspace"] == workspace and data["artifactsRoot"] == artifacts
        assert data["readRoots"] == [workspace, artifacts]
        assert data["writeRoots"] == [workspace, artifacts + "/worker"]
        assert data["controllerUrl"] == f"http://127.0.0.1:{env.controller.port}"
        assert data["activation"]["prompt"] == act["prompt"]
        assert data["history"][-1]["kind"] == "activation_prompt"
        assert (project_dir / "artifacts" / "pm").is_dir()
        final = env.store.activation(act["id"])
        assert final["containerName"].startswith("local-")
        seen = json.loads((project_dir / "agents" / "worker" / "workspace" / "standin-seen.json").read_text())
        assert seen["cwd"] == workspace
        assert seen["sid"] == seen["pid"], "the runner leads its own session"


def test_local_environment_is_scrubbed(tmp_path, monkeypatch):
    environ = {"PATH": os.environ["PATH"], "HOME": "/home/x", "GW_KEY": "k1", "UNRELATED_SECRET": "s",
               "HTTPS_PROXY": "http://127.0.0.1:7890", "NO_PROXY": "127.0.0.1,localhost"}
    with local_project(tmp_path, environ=environ, agent_env={"EXTRA_VAR": "e"}, providers=GW) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "completed", 15)
        seen = json.loads((env.store.dir / "agents/worker/workspace/standin-seen.json").read_text())
        child_env = seen["env"]
        assert child_env["SUZUMIO_PROJECT"] == env.store.project_id
        assert child_env["SUZUMIO_AGENT"] == "worker"
        assert child_env["SUZUMIO_TOKEN"]
        assert "GW_KEY" not in child_env and "k1" not in child_env.values()
        assert child_env["HTTPS_PROXY"] == "http://127.0.0.1:7890"
        assert child_env["PYTHONUNBUFFERED"] == "1"
        assert child_env["PATH"] == environ["PATH"] and child_env["HOME"] == "/home/x"
        assert child_env["EXTRA_VAR"] == "e"
        assert "UNRELATED_SECRET" not in child_env


@pytest.mark.parametrize("mode, expected_start, expected_text", [
    ("exit:3", "Runner exited with 3", "boom"),
    ("exit:0", backend.NO_OUTPUT_ERROR, None),
])
def test_local_exit_without_output_fails_the_activation(tmp_path, mode, expected_start, expected_text):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": mode}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "failed", 15)
        error = env.store.activation(act["id"])["error"]
        assert error.startswith(expected_start)
        if expected_text:
            assert expected_text in error
        assert env.store.agent("worker")["status"] == "failed"
        assert "activation_failed" in agent_history_kinds(env.store, "worker")
        assert any(e["data"]["activationId"] == act["id"] for e in events_of(env.store, "activation.failed"))


def test_local_runner_killed_by_sigkill_reports_137(tmp_path):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": "sleep"}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        wait_until(lambda: (env.store.dir / "agents/worker/workspace/standin-seen.json").exists(), 10)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: env.store.activation(act["id"])["status"] == "failed", 15)
        assert env.store.activation(act["id"])["error"].startswith("Runner exited with 137")


def test_secrets_are_redacted_from_stored_failure_text(tmp_path):
    environ = {"PATH": os.environ["PATH"], "GW_KEY": "provider-key-123"}
    # the key is no longer in a runner's environment; the agent's env smuggles it in under another name
    with local_project(tmp_path, environ=environ, providers=GW,
                       agent_env={"STANDIN_MODE": "print-secrets", "STANDIN_KEY_ENV": "STANDIN_ECHO",
                                  "STANDIN_ECHO": "provider-key-123"}) as env:
        act = open_activation(env, "worker")
        token = env.store.agent("worker", include_token=True)["token"]
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "failed", 15)
        stored = [env.store.activation(act["id"])["error"],
                  json.dumps(events_of(env.store, "activation.failed")),
                  json.dumps([h for h in env.store.active_history("worker")
                              if h["kind"] == "activation_failed"])]
        for text in stored:
            assert "<redacted>" in text
            assert token not in text and "provider-key-123" not in text


def test_missing_runner_file_fails_the_start_and_launches_nothing(tmp_path):
    with local_project(tmp_path) as env:
        (env.support_dir / backend.HOST_FILE).unlink()
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        final = env.store.activation(act["id"])
        assert final["status"] == "failed"
        assert final["error"] == f"Runner file not found: {env.support_dir / backend.HOST_FILE}"
        assert not final.get("containerName")
        assert not (env.store.dir / "agents/worker/workspace/standin-seen.json").exists()


def test_local_cancel_terminates_the_process_group(tmp_path):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": "sleep"}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        wait_until(lambda: (env.store.dir / "agents/worker/workspace/standin-seen.json").exists(), 10)
        coordination.cancel_activation(env.store, act["id"], "Interrupted by P0 signal sig_x")
        env.backends.stop_runner(env.store, env.store.activation(act["id"]))
        wait_until(lambda: not process_group_alive(pid), 4, message="process group gone")
        assert env.store.activation(act["id"])["status"] == "cancelled"
        assert events_of(env.store, "activation.stop_failed") == []


def test_a_local_runner_runs_ten_steps_nicer_than_the_controller(tmp_path):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": "sleep"}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        assert os.getpriority(os.PRIO_PROCESS, pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        coordination.cancel_activation(env.store, act["id"], "test over")
        env.backends.stop_runner(env.store, env.store.activation(act["id"]))


def test_stopping_a_dead_or_foreign_local_runner_does_nothing(tmp_path):
    with local_project(tmp_path) as env:
        act = open_activation(env, "worker")
        # The test process's own pid: alive, but its command line lacks the activation id.
        env.store.set_activation_container(act["id"], f"local-{os.getpid()}")
        coordination.cancel_activation(env.store, act["id"], "Project stopped")
        env.backends.stop_runner(env.store, env.store.activation(act["id"]))
        assert events_of(env.store, "activation.stop_failed") == []


def test_local_timeout_via_reconcile_fails_and_kills(tmp_path):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": "sleep"}, timeout_ms=1000) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        later = parse_ts(act["startedAt"]) + __import__("datetime").timedelta(seconds=2)
        Reconciler(env.backends).reconcile([env.store], now=later)
        final = env.store.activation(act["id"])
        assert final["status"] == "failed" and final["error"] == "activation timed out"
        wait_until(lambda: not process_group_alive(pid), 4, message="timed-out runner gone")


def test_adoption_after_restart_watches_live_runner_and_fails_dead_one(tmp_path):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": "delay-output:3"}) as env:
        first = open_activation(env, "worker")
        env.backends.start(env.store, first["id"])
        env.backends.close()  # controller A shuts down; the runner keeps going
        second_backends = env.new_backends()
        Reconciler(second_backends).reconcile([env.store])
        assert second_backends.watched(first["id"])
        wait_until(lambda: env.store.activation(first["id"])["status"] == "completed", 15)
        second_backends.close()

    with local_project(tmp_path / "b", agent_env={"STANDIN_MODE": "sleep"}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        env.backends.close()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not suzumio_backend_local.local_runner_alive(pid, act["id"]), 5)
        fresh = env.new_backends()
        Reconciler(fresh).reconcile([env.store])
        assert env.store.activation(act["id"])["error"] == backend.NO_OUTPUT_ERROR
        fresh.close()


def test_reconcile_fails_activation_that_never_got_a_runner(tmp_path):
    import datetime
    with local_project(tmp_path) as env:
        act = open_activation(env, "worker")
        start = parse_ts(act["startedAt"])
        Reconciler(env.backends).reconcile([env.store], now=start + datetime.timedelta(seconds=30))
        assert env.store.activation(act["id"])["status"] == "running"
        Reconciler(env.backends).reconcile([env.store], now=start + datetime.timedelta(seconds=61))
        assert env.store.activation(act["id"])["error"] == backend.NEVER_STARTED_ERROR


class NoEngine:
    """A Docker client that must never be touched: the local backend works without Docker."""

    def __getattr__(self, name):
        raise AssertionError(f"the Docker client was used ({name})")


def test_restarted_controller_adopts_a_local_runner_whose_pid_was_never_recorded(tmp_path):
    with local_project(tmp_path, agent_env={"STANDIN_MODE": "delay-output:3"}) as env:
        act = open_activation(env, "worker")
        with dies_before_recording(env.store), pytest.raises(ControllerDied):
            env.backends.start(env.store, act["id"])
        env.backends.close()  # controller A died between spawning the runner and recording its pid
        seen_path = env.store.dir / "agents/worker/workspace/standin-seen.json"
        pid = wait_until(lambda: seen_path.exists() and json.loads(seen_path.read_text())["pid"], 10)
        assert not env.store.activation(act["id"]).get("containerName")
        fresh = env.new_backends(docker_client=NoEngine())
        Reconciler(fresh).reconcile([env.store])
        assert env.store.activation(act["id"])["containerName"] == f"local-{pid}"
        assert env.store.agent("worker")["containerName"] == f"local-{pid}"
        assert fresh.watched(act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "completed", 15,
                   message="adopted runner posted its output")


def test_processes_that_only_resemble_the_runner_are_not_adopted_and_the_grace_rule_applies(tmp_path):
    import datetime
    with local_project(tmp_path) as env:
        act = open_activation(env, "worker")
        input_path = env.store.activation_dir(act["id"]) / "input.json"
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)", "--input"]
        decoys = [
            # the runner's exact arguments, but it does not lead its own session
            subprocess.Popen([*sleeper, str(input_path.resolve())]),
            # leads its session and names the activation, but another input file
            subprocess.Popen([*sleeper, str(tmp_path / act["id"] / "input.json")], start_new_session=True),
        ]
        try:
            assert all(suzumio_backend_local.local_runner_alive(d.pid, act["id"]) for d in decoys)
            fresh = env.new_backends(docker_client=NoEngine())
            start = parse_ts(act["startedAt"])
            Reconciler(fresh).reconcile([env.store], now=start + datetime.timedelta(seconds=30))
            current = env.store.activation(act["id"])
            assert current["status"] == "running" and not current.get("containerName")
            Reconciler(fresh).reconcile([env.store], now=start + datetime.timedelta(seconds=61))
            assert env.store.activation(act["id"])["error"] == backend.NEVER_STARTED_ERROR
        finally:
            for decoy in decoys:
                decoy.kill()
                decoy.wait()


def test_input_controller_url_names_the_runner_socket_when_the_controller_serves_one():
    socket_path = Path("/srv/root/run/runner.sock")
    assert backend.runner_controller_url("docker-chat", socket_path, "http://x:1") == "unix:///run/suzumio/runner.sock"
    assert backend.runner_controller_url("local", socket_path, "http://x:1") == "unix:///srv/root/run/runner.sock"
    # serve --runner-listen: backend.controllerUrl
    url = "http://host.docker.internal:39401"
    assert backend.runner_controller_url("docker-chat", None, url) == url
    assert backend.runner_controller_url("local", None, url) == "http://127.0.0.1:39401"


def test_local_runner_gets_the_socket_path_in_input_json(tmp_path):
    with local_project(tmp_path) as env:
        socket_path = tmp_path / "sock" / "runner.sock"
        env.backends = env.new_backends()
        env.backends.runner_socket = socket_path
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        data = json.loads((env.store.activation_dir(act["id"]) / "input.json").read_text())
        assert data["controllerUrl"] == f"unix://{socket_path}"
