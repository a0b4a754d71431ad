"""Warm activations: prepared runners (a started container waiting on the warm socket, or a
spawned interpreter) serve exactly one activation each, give the same history and results as a cold
start, stay within their bounds, and are removed on stop, approve, a config change and shutdown. Real
controller (user app, runner socket, scheduler), real runner, real engine for docker-chat."""
import json
import os
import re
import socket

import pytest
from backend_fixtures import served_project
from conftest import wait_until
from provisioning_fixtures import docker_client_or_skip, runner_image_or_skip
from store_fixtures import config_of

import suzumio_backend
import suzumio_backend_local
import suzumio_coordination as coordination
import suzumio_scheduler
import suzumio_warm

pytestmark = pytest.mark.timeout(240)

KINDS = ["local", pytest.param("docker-chat", marks=pytest.mark.docker)]
TEAM = {"pm": {"tools": ["messages.send"]}}


def engine_for(kind):
    if kind != "docker-chat":
        return None
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    return client


def prepared(env):
    """The names (containers) or pids (processes) of the prepared runners the engine or host holds for
    this project, asked of the engine and /proc rather than of the pool."""
    if env.store.config()["backend"]["kind"] == "docker-chat":
        return sorted(name for name, _state in env.backends.docker.warm_containers(project=env.store.project_id))
    marker = f"--warm {suzumio_warm.warm_socket_path(env.backends.runner_socket)} "
    return sorted(pid for pid, text in suzumio_backend_local.command_lines()
                  if marker in text and suzumio_backend_local.read_cmdline(pid))


def run_one(env, body="Write part A."):
    before = len(env.store.list_activations(1000))
    coordination.send_message(env.store, config_of(env.store), "user", body, recipient="pm")
    env.scheduler.tick("demo")
    activations = env.store.list_activations(1000)
    assert len(activations) == before + 1
    activation_id = max(a["id"] for a in activations)
    wait_until(lambda: env.store.activation(activation_id)["status"] != "running", 60, message="activation ended")
    return env.store.activation(activation_id)


IDS = re.compile(r"\b[a-z]+_[0-9]{10,}_[0-9a-f]{6,}\b")
TIMES = re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+Z")
VOLATILE = re.compile(r"(^id$|Id$|At$|^sequence$|^containerName$|^durationMs$|^token$)")


def normal(value, folder):
    """Rows without their ids, times, container names and test folder, so two projects' runs compare."""
    if isinstance(value, dict):
        return {k: normal(v, folder) for k, v in value.items() if not VOLATILE.search(k)}
    if isinstance(value, list):
        return [normal(v, folder) for v in value]
    if isinstance(value, str):
        return TIMES.sub("<time>", IDS.sub("<id>", value.replace(folder, "<folder>")))
    return value


def outcome(env, activation):
    store = env.store
    return normal({"activation": activation, "history": store.active_history("pm"),
                   "messages": store.list_messages(limit=50), "toolCalls": store.list_tool_calls(limit=50),
                   "input": json.loads((store.activation_dir(activation["id"]) / "input.json").read_text())},
                  str(env.tmp_path))


@pytest.mark.parametrize("kind", KINDS)
def test_a_warm_activation_has_the_history_and_results_of_a_cold_one(tmp_path, kind):
    engine_for(kind)
    results = []
    for warm_limit in (0, 4):
        with served_project(tmp_path / f"warm-{warm_limit}", agents=TEAM, kind=kind, warm_limit=warm_limit,
                            script="report") as env:
            if warm_limit:
                env.scheduler.tick("demo")
                assert env.backends.warm.wait_ready("demo", "pm", 60)
            activation = run_one(env)
            slot_file = env.store.activation_dir(activation["id"]) / "runner.slot"
            if kind == "local":
                assert slot_file.exists() == bool(warm_limit)  # the warm one really ran in a prepared process
            elif warm_limit:
                assert not env.backends.warm.owns(activation["containerName"])
                assert activation["containerName"] == suzumio_backend.container_name_for(
                    "demo", "pm", activation["id"])
            results.append(outcome(env, activation))
            if kind == "docker-chat":
                env.backends.docker.remove(activation["containerName"])
    cold, warm = results
    assert cold["activation"]["status"] == "completed"
    assert warm == cold


@pytest.mark.parametrize("kind", KINDS)
def test_each_prepared_runner_serves_one_activation_and_the_next_one_is_prepared_again(tmp_path, kind):
    engine_for(kind)
    with served_project(tmp_path, agents=TEAM, kind=kind, warm_limit=4) as env:
        env.scheduler.tick("demo")
        names = []
        for index in range(3):
            assert env.backends.warm.wait_ready("demo", "pm", 60)
            # One prepared runner (the one that served the previous job may still be exiting).
            wait_until(lambda: len(prepared(env)) == 1, timeout=30, message="one prepared runner")
            activation = run_one(env, f"Job {index}.")
            assert activation["status"] == "completed", activation
            names.append(activation["containerName"])
            if kind == "local":
                assert (env.store.activation_dir(activation["id"]) / "runner.slot").exists()
        assert len(set(names)) == 3  # a fresh container or process each time
        if kind == "docker-chat":
            for name in names:
                env.backends.docker.remove(name)


@pytest.mark.parametrize("kind", KINDS)
def test_prepared_runners_are_removed_on_stop_approve_and_shutdown(tmp_path, kind):
    engine_for(kind)
    with served_project(tmp_path, agents={"pm": {"tools": ["messages.send"]}, "worker": {"tools": ["messages.send"]}},
                        kind=kind, warm_limit=4) as env:
        store, backends = env.store, env.backends
        for halt in (suzumio_scheduler.stop_project, suzumio_scheduler.approve_project):
            store.start()
            env.scheduler.tick("demo")
            assert backends.warm.wait_ready("demo", "pm", 60) and backends.warm.wait_ready("demo", "worker", 60)
            assert len(prepared(env)) == 2
            halt(store, backends)
            env.scheduler.tick("demo")  # as the stop and approve routes do
            wait_until(lambda: prepared(env) == [], 30, message=f"prepared runners gone after {halt.__name__}")
            assert backends.warm.slots("demo") == []
        store.start()
        env.scheduler.tick("demo")
        assert backends.warm.wait_ready("demo", "pm", 60)
        backends.warm.close()  # what Backends.close (serve's shutdown) does first
        assert prepared(env) == []


def change_config(store, change):
    """Write a changed stored config, as a new config would (and drop the store's cached copy)."""
    config = json.loads(json.dumps(store.config()))
    change(config)
    with store.write() as tx:
        tx.execute("UPDATE projects SET config_json = ? WHERE id = ?", (json.dumps(config), store.project_id))
    store._config = None


def ready_count(env):
    return len([slot for slot in env.backends.warm.slots() if slot[2]])


def test_prepared_runners_stay_within_the_project_and_the_global_bound(tmp_path):
    agents = {name: {"tools": ["messages.send"]} for name in ("pm", "a", "b")}
    with served_project(tmp_path / "default", agents=agents, warm_limit=8) as env:
        env.scheduler.tick("demo")
        wait_until(lambda: ready_count(env) == 2, 60, message="two ready")  # backend.warm defaults to 2
        assert len(prepared(env)) == 2
        nicer = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)  # as the runners of cold starts
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in prepared(env)] == [nicer, nicer]
        change_config(env.store, lambda config: config["backend"].update(warm=3))
        env.scheduler.tick("demo")
        wait_until(lambda: ready_count(env) == 3 and len(prepared(env)) == 3, 60, message="three ready")
        change_config(env.store, lambda config: config["backend"].update(warm=False))
        env.scheduler.tick("demo")
        wait_until(lambda: prepared(env) == [], 30, message="warm off")
    with served_project(tmp_path / "global", agents=agents, warm_limit=1) as env:
        env.scheduler.tick("demo")
        wait_until(lambda: ready_count(env) == 1, 60, message="one ready")
        env.scheduler.tick("demo")
        assert len(prepared(env)) == 1


def test_a_config_change_replaces_the_prepared_runner(tmp_path):
    with served_project(tmp_path, agents=TEAM, warm_limit=4) as env:
        env.scheduler.tick("demo")
        assert env.backends.warm.wait_ready("demo", "pm", 60)
        before = prepared(env)
        assert len(before) == 1
        change_config(env.store, lambda config: config["backend"].update(activationTimeoutMs=123456))
        env.scheduler.tick("demo")
        wait_until(lambda: len(prepared(env)) == 1 and prepared(env) != before, 60, message="a new prepared runner")
        # Started is not ready: a claim waits READY_WAIT_SECONDS for its hello, then starts cold.
        assert env.backends.warm.wait_ready("demo", "pm", 60)
        activation = run_one(env)
        assert activation["status"] == "completed"
        assert (env.store.activation_dir(activation["id"]) / "runner.slot").exists()


def test_the_warm_socket_hands_nothing_to_a_connection_without_the_slot_key(tmp_path):
    with served_project(tmp_path, agents=TEAM, warm_limit=4) as env:
        env.scheduler.tick("demo")
        assert env.backends.warm.wait_ready("demo", "pm", 60)
        slot_id = next(iter(env.backends.warm._slots))
        intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        intruder.settimeout(30)
        intruder.connect(str(env.backends.warm.path))
        intruder.sendall(json.dumps({"slot": slot_id, "key": "guessed"}).encode() + b"\n")
        assert intruder.recv(100) == b""  # closed without a word
        intruder.close()
        activation = run_one(env)
        assert activation["status"] == "completed"
        assert (env.store.activation_dir(activation["id"]) / "runner.slot").read_text().strip() == slot_id


class UnreachableEngine:
    """A preparer whose engine is down: every prepare fails as a stopped engine's socket does. Not a
    client double: the pool is driven directly, and what it asked the engine for is its state."""

    def __init__(self):
        self.prepared = []

    def wanted(self, store, configs=None):
        return [({"id": "pm"}, "docker-chat", "fingerprint", None)]

    def prepare(self, store, config, agent, slot):
        self.prepared.append(slot.id)
        raise ConnectionError("('Connection aborted.', FileNotFoundError(2, 'No such file or directory'))")

    def discard(self, slot):
        return None


class ProjectOnly:
    project_id = "demo"


def test_a_failed_prepare_pauses_the_projects_prepares_instead_of_asking_the_engine_at_every_hint(tmp_path):
    engine = UnreachableEngine()
    pool = suzumio_warm.WarmPool(engine, tmp_path / "runner.sock")
    pool._refresh(ProjectOnly())
    pool._refresh(ProjectOnly())  # a tick's hint right after the failure
    assert len(engine.prepared) == 1 and pool.slots("demo") == []
    pool._paused.clear()  # the pause is over
    pool._refresh(ProjectOnly())
    assert len(engine.prepared) == 2
