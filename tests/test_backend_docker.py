"""docker-chat backend against a real Docker engine (docs/design/runner.md scenarios 1-5, 9-16, 50-52):
containers are read back with the SDK. A client double is used only for generic stop/kill failures."""
import datetime
import json
import os
import uuid

import pytest
from backend_fixtures import ControllerDied, dies_before_recording, events_of, local_project, open_activation
from conftest import require, wait_until
from store_fixtures import CONFIGS, config_of

import suzumio_backend as backend
import suzumio_coordination as coordination
import suzumio_scheduler as scheduler
from suzumio_backend_reconcile import Reconciler
from suzumio_records import parse_ts, render_signal, utc_now

IMAGE = "suzumio-runner:dev"


def engine():
    try:
        import docker
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(IMAGE)
        return client
    except Exception as error:  # noqa: BLE001  any failure means: no usable engine here
        require("docker")(f"no Docker engine with {IMAGE}: {error}")


@pytest.fixture
def project():
    """A project name of this test alone, so its containers can be told from every other run's."""
    return f"demo-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(project):
    client = engine()
    yield client
    for container in client.containers.list(all=True, filters={"label": f"suzumio.project={project}"}):
        container.remove(force=True)


def docker_project(tmp_path, project, **options):
    docker_cfg = {"network": "host", **options.pop("docker", {})}
    return local_project(tmp_path, name=project, kind="docker-chat", docker=docker_cfg, **options)


def container_of(client, store, activation_id):
    name = store.activation(activation_id)["containerName"]
    return client.containers.get(name)


def test_container_spec_labels_env_and_mounts(tmp_path, client, project):
    source = tmp_path / "ref"
    source.mkdir()
    mounts = [{"source": str(source), "target": "/mnt/ref"},
              {"source": str(source), "target": "/mnt/rw", "readonly": False}]
    environ = {"GW_KEY": "gw-env-key-77", "PATH": os.environ["PATH"]}
    providers = {"gw": {"type": "openai-compatible", "apiKeyEnv": "GW_KEY", "baseURLEnv": "GW_URL",
                        "apiKey": "literal-secret"}}
    with docker_project(tmp_path, project, docker={"mounts": mounts, "memory": "512m", "cpus": 1.5},
                        environ=environ, providers=providers) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "completed", 60,
                   message="container posted its output")
        name = env.store.activation(act["id"])["containerName"]
        assert name == f"suzumio_{project}_worker_{act['id']}"
        assert env.store.agent("worker")["containerName"] == name
        attrs = client.containers.get(name).attrs
        config, host = attrs["Config"], attrs["HostConfig"]
        assert config["Image"] == IMAGE
        assert config["Entrypoint"] == ["python3", "/opt/suzumio/suzumio_runner.py"]
        assert config["Cmd"] == ["--input", "/activation/input.json"]
        assert config["WorkingDir"] == "/workspace"
        assert host["AutoRemove"] is False
        assert host["ExtraHosts"] == ["host.docker.internal:host-gateway"]
        assert host["NetworkMode"] == "host"
        assert host["Memory"] == 536870912
        assert host["NanoCpus"] == int(min(1.5, client.info()["NCPU"]) * 1e9)
        assert config["User"] == (f"{os.getuid()}:{os.getgid()}" if os.getuid() else "65532:65532")
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        assert host["SecurityOpt"] == ["no-new-privileges:true"]
        assert host["PidsLimit"] == 1024
        own_labels = {k: v for k, v in config["Labels"].items() if k.startswith("suzumio.")}
        assert own_labels == {"suzumio.managed": "true", "suzumio.project": project,
                                    "suzumio.agent": "worker", "suzumio.activation": act["id"]}
        container_env = dict(item.split("=", 1) for item in config["Env"])
        token = env.store.agent("worker", include_token=True)["token"]
        assert container_env["SUZUMIO_PROJECT"] == project and container_env["SUZUMIO_AGENT"] == "worker"
        assert container_env["SUZUMIO_ACTIVATION"] == act["id"] and container_env["SUZUMIO_TOKEN"] == token
        assert "GW_KEY" not in container_env and "GW_URL" not in container_env
        assert not [item for item in config["Env"] if "literal-secret" in item or "gw-env-key-77" in item]
        input_text = (env.store.activation_dir(act["id"]) / "input.json").read_text()
        assert "literal-secret" not in input_text and "GW_KEY" not in input_text
        assert "gw-env-key-77" not in input_text
        project_dir = env.store.dir
        expected = [
            (str(project_dir / "activations" / act["id"] / "input.json"), "/activation/input.json", True),
            (str(project_dir / "agents/worker/workspace"), "/workspace", False),
            (str(project_dir / "artifacts/pm"), "/artifacts/pm", True),
            (str(project_dir / "artifacts/worker"), "/artifacts/worker", False),
            (str(source), "/mnt/ref", True),
            (str(source), "/mnt/rw", False),
        ] + [(str(env.support_dir / name), f"/opt/suzumio/{name}", True) for name in backend.RUNNER_FILES]
        assert [(m["Source"], m["Target"], m.get("ReadOnly", False)) for m in host["Mounts"]] == expected
        assert all(m["Type"] == "bind" for m in host["Mounts"])
        assert (project_dir / "artifacts/pm").is_dir() and (project_dir / "artifacts/worker").is_dir()
        data = json.loads((project_dir / "activations" / act["id"] / "input.json").read_text())
        assert data["workspace"] == "/workspace" and data["artifactsRoot"] == "/artifacts"
        assert data["readRoots"] == ["/workspace", "/artifacts", "/mnt"]
        assert data["writeRoots"] == ["/workspace", "/artifacts/worker"]


def test_default_network_is_dockers_default_while_the_runner_reaches_the_controller_over_tcp(
        tmp_path, client, project):
    # No runner socket (no serve of the root runs): the runner can only try backend.controllerUrl.
    with local_project(tmp_path, name=project, kind="docker-chat",
                       agent_env={"STANDIN_MODE": "exit:0"}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "failed", 60)
        assert container_of(client, env.store, act["id"]).attrs["HostConfig"]["NetworkMode"] in ("default", "bridge")


def started_container(env, client, agent_id="worker"):
    """Start an activation of `agent_id` (stand-in runner), wait for it to end; the container's attrs."""
    act = open_activation(env, agent_id)
    env.backends.start(env.store, act["id"])
    wait_until(lambda: env.store.activation(act["id"])["status"] != "running", 60)
    return container_of(client, env.store, act["id"]).attrs


def serve_runner_socket(env, tmp_path):
    """Runners reach the controller over a runner socket, as under `serve`: no container needs a
    network for it, so agents without network get `none`, and the socket's folder is mounted."""
    folder = tmp_path / "run"
    folder.mkdir()
    env.backends.runner_socket = folder / "runner.sock"
    return folder


@pytest.mark.parametrize("agent, docker_cfg, expected", [
    ({"tools": ["messages.send"]}, {"network": "host"}, "none"),
    ({"tools": ["web.fetch"]}, {"network": "host"}, "none"),  # web.fetch goes through the egress proxy
    ({"tools": ["web.fetch"], "network": False}, {"network": "host"}, "none"),
    ({"tools": [], "network": True}, {"network": "host"}, "host"),
    ({"tools": []}, {"network": "host", "grantNetwork": True}, "host"),
    ({"tools": [], "network": True, "docker": {"network": "none"}}, {"network": "host"}, "none"),
])
def test_network_is_none_unless_the_agent_has_network(tmp_path, client, project, agent, docker_cfg, expected):
    agents = {"pm": {"tools": ["messages.send"]}, "worker": {**agent, "env": {"STANDIN_MODE": "exit:0"}}}
    with local_project(tmp_path, name=project, kind="docker-chat", agents=agents, docker=docker_cfg) as env:
        folder = serve_runner_socket(env, tmp_path)
        attrs = started_container(env, client)
        assert attrs["HostConfig"]["NetworkMode"] == expected
        mounts = [(m["Source"], m["RW"]) for m in attrs["Mounts"] if m["Destination"] == "/run/suzumio"]
        assert mounts == [(str(folder), False)]


def test_default_limits_and_overrides_per_agent(tmp_path, client, project):
    agents = {"pm": {"tools": ["messages.send"]},
              "worker": {"tools": [], "docker": {"memory": "256m", "pidsLimit": 64, "cpus": 0.5,
                                                 "capAdd": ["CHOWN"], "user": "1234:1234"}}}
    with docker_project(tmp_path, project, agents=agents, agent_env={"STANDIN_MODE": "exit:0"}) as env:
        pm = started_container(env, client, "pm")
        worker = started_container(env, client, "worker")
    host = pm["HostConfig"]
    assert (host["Memory"], host["PidsLimit"]) == (4 * 1024 ** 3, 1024)
    assert host["NanoCpus"] == int(min(2, client.info()["NCPU"]) * 1e9)
    host = worker["HostConfig"]
    assert (host["Memory"], host["PidsLimit"], host["NanoCpus"]) == (256 * 1024 ** 2, 64, 500000000)
    assert host["CapAdd"] == ["CHOWN"] and host["CapDrop"] == ["ALL"] and worker["Config"]["User"] == "1234:1234"


def test_false_turns_limits_off_and_a_cpu_limit_is_capped_at_the_engines(tmp_path, client, project):
    with docker_project(tmp_path, project, docker={"memory": False, "pidsLimit": False, "cpus": 512},
                        agent_env={"STANDIN_MODE": "exit:0"}) as env:
        host = started_container(env, client)["HostConfig"]
    assert host["Memory"] == 0 and host["PidsLimit"] in (None, 0, -1)
    assert host["NanoCpus"] == client.info()["NCPU"] * 10 ** 9


@pytest.mark.skipif(os.getuid() != 0, reason="only a root controller hands folders to another uid")
def test_a_root_controller_hands_the_writable_folders_to_the_container_uid(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "exit:0"}) as env:
        workspace = env.store.dir / "agents/worker/workspace"
        (workspace / "old").mkdir()
        (workspace / "old/notes.txt").write_text("from a root container")
        outside = tmp_path / "outside.txt"
        outside.write_text("host file")
        (workspace / "link").symlink_to(outside)
        os.link(outside, workspace / "hardlink")
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] != "running", 60)
        uid, gid = backend.UNPRIVILEGED_IDS
        input_json = env.store.activation_dir(act["id"]) / "input.json"
        for path in (workspace, workspace / "old", workspace / "old/notes.txt", workspace / "standin-seen.json",
                     env.store.artifacts_dir("worker"), input_json):
            assert (path.lstat().st_uid, path.lstat().st_gid) == (uid, gid), path
        assert input_json.stat().st_mode & 0o777 == 0o600
        assert (workspace / "link").lstat().st_uid == uid
        assert outside.stat().st_uid == 0, "neither a symbolic nor a hard link is followed out of the folder"
        assert env.store.artifacts_dir("pm").stat().st_uid == 0, "other agents' folders stay as they are"


@pytest.mark.parametrize("configured, ids, expected", [
    (None, (1000, 1000), "1000:1000"), (None, (0, 0), "65532:65532"), ("4242", (0, 0), "4242"),
    ("root", (1000, 1000), "root"),
])
def test_container_user(configured, ids, expected):
    assert backend.container_user(configured, *ids) == expected


@pytest.mark.parametrize("user, ids", [("1000", (1000, 1000)), ("1000:50", (1000, 50)), ("nobody", None),
                                       ("1000:staff", None)])
def test_numeric_ids(user, ids):
    assert backend.numeric_ids(user) == ids


@pytest.mark.parametrize("mode, expected", [
    ("exit:0", backend.NO_OUTPUT_ERROR),
    ("exit:3", "Runner exited with 3"),
])
def test_container_exit_without_output_fails_with_log_tail(tmp_path, client, project, mode, expected):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": mode}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "failed", 60)
        error = env.store.activation(act["id"])["error"]
        assert error.startswith(expected)
        if mode == "exit:3":
            assert "boom" in error
        assert env.store.agent("worker")["status"] == "failed"
        assert "activation_failed" in [h["kind"] for h in env.store.active_history("worker")]
        assert container_of(client, env.store, act["id"]).status == "exited", "containers are kept"


def test_missing_source_and_missing_image_fail_without_container(tmp_path, client, project):
    # A reserved target never gets this far: config loading rejects it (validate_mount is unit-tested).
    cases = [({"mounts": [{"source": str(tmp_path / "missing"), "target": "/mnt/x"}]}, {}, "No such file"),
             ({}, {"image": "suzumio-runner:does-not-exist"}, "does-not-exist")]
    for index, (docker_cfg, options, text) in enumerate(cases):
        with docker_project(tmp_path / str(index), project, docker=docker_cfg, **options) as env:
            act = open_activation(env, "worker")
            env.backends.start(env.store, act["id"])
            final = env.store.activation(act["id"])
            assert final["status"] == "failed" and text in final["error"], final["error"]
            assert env.store.agent("worker")["status"] == "failed"
            assert client.containers.list(all=True, filters={"label": f"suzumio.activation={act['id']}"}) == []


def test_p0_stops_the_container_and_restarts_with_the_signal(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "sleep"}) as env:
        coordination.send_message(env.store, config_of(env.store), "user", "work", recipient="worker")
        scheduler.tick(env.store, env.backends, scheduler.NoHooks(), utc_now(), CONFIGS)
        [first] = env.store.running_activations()
        wait_until(lambda: container_of(client, env.store, first["id"]).status == "running", 30)
        message = coordination.send_message(env.store, config_of(env.store), "user", "stop now", recipient="worker",
                                            priority="P0")
        scheduler.tick(env.store, env.backends, scheduler.NoHooks(), utc_now(), CONFIGS)
        p0 = next(s for s in env.store.list_signals(limit=100) if s["payload"].get("id") == message["id"])
        assert env.store.activation(first["id"])["error"] == f"Interrupted by P0 signal {p0['id']}"
        assert container_of(client, env.store, first["id"]).status == "exited"
        [second] = env.store.running_activations()
        assert render_signal(p0) in second["prompt"]
        assert events_of(env.store, "activation.stop_failed") == []


def test_removed_container_counts_as_stopped_on_stop(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "sleep"}) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        coordination.cancel_activation(env.store, act["id"], "Project stopped")
        container_of(client, env.store, act["id"]).remove(force=True)
        env.backends.stop_runner(env.store, env.store.activation(act["id"]))
        assert env.store.activation(act["id"])["status"] == "cancelled"
        assert events_of(env.store, "activation.stop_failed") == []


def test_timeout_fails_the_activation_and_stops_its_container(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "sleep"}, timeout_ms=1000) as env:
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(lambda: container_of(client, env.store, act["id"]).status == "running", 30)
        coordination.send_message(env.store, config_of(env.store), "user", "next", recipient="worker")
        now = parse_ts(act["startedAt"]) + datetime.timedelta(seconds=2)
        scheduler.tick(env.store, env.backends, scheduler.NoHooks(), now, CONFIGS)
        final = env.store.activation(act["id"])
        assert final["status"] == "failed" and final["error"] == "activation timed out"
        assert container_of(client, env.store, act["id"]).status == "exited"
        assert len(env.store.running_activations()) == 1, "the P3 message started a new activation"


def test_restarted_controller_settles_every_activation_it_left(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "sleep"}) as env:
        exited = open_activation(env, "pm")
        env.backends.start(env.store, exited["id"])
        running = open_activation(env, "worker")
        env.backends.start(env.store, running["id"])
        wait_until(lambda: container_of(client, env.store, running["id"]).status == "running", 30)
        env.backends.close()  # controller A goes away; its monitors stop settling
        container_of(client, env.store, exited["id"]).kill()
        wait_until(lambda: container_of(client, env.store, exited["id"]).status == "exited", 30)
        fresh = env.new_backends()
        Reconciler(fresh).reconcile([env.store])
        assert env.store.activation(exited["id"])["error"].startswith("Runner exited with 137")
        assert fresh.watched(running["id"])
        container_of(client, env.store, running["id"]).remove(force=True)
        wait_until(lambda: env.store.activation(running["id"])["status"] == "failed", 30)


def test_reconcile_fails_activation_whose_container_is_gone(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "exit:0"}) as env:
        act = open_activation(env, "worker")
        vanished = f"suzumio_{project}_worker_vanished"
        env.store.set_activation_container(act["id"], vanished)
        Reconciler(env.backends).reconcile([env.store])
        assert env.store.activation(act["id"])["error"] == f"Runner container {vanished} not found"


class FailingStopClient:
    """The one double the real-parts rule allows: an engine whose stop and kill fail with a generic error."""

    def __init__(self, real):
        self.real = real
        self.containers = real.containers
        self.api = self

    def __getattr__(self, name):
        return getattr(self.real.api, name)

    def stop(self, name, timeout=None):
        import docker.errors
        raise docker.errors.APIError("engine exploded on stop")

    def kill(self, name):
        import docker.errors
        raise docker.errors.APIError("engine exploded on kill")


def test_generic_stop_and_kill_errors_become_stop_failed_and_restart_proceeds(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "sleep"}) as env:
        env.backends = env.new_backends(docker_client=FailingStopClient(client))
        act = open_activation(env, "worker")
        name = backend.container_name_for(project, "worker", act["id"])
        env.store.set_activation_container(act["id"], name)
        coordination.send_message(env.store, config_of(env.store), "user", "urgent", recipient="worker", priority="P0")
        scheduler.tick(env.store, env.backends, scheduler.NoHooks(), utc_now(), CONFIGS)
        [event] = events_of(env.store, "activation.stop_failed")
        assert event["data"]["activationId"] == act["id"] and "engine exploded on kill" in event["data"]["error"]
        assert env.store.activation(act["id"])["status"] == "cancelled"
        [second] = env.store.running_activations()
        assert second["id"] != act["id"]
        wait_until(lambda: container_of(client, env.store, second["id"]).status == "running", 30)


class EngineLostClient:
    """A double for what a real engine does not do on demand: its first wait for a container ends
    midway (the engine was killed) and its first inspections cannot connect (it is still down); from
    then on the real engine answers."""

    def __init__(self, real, down_inspections=2):
        self.real = real
        self.containers = real.containers
        self.api = self
        self.wait_cut = False
        self.down_inspections = down_inspections

    def __getattr__(self, name):
        return getattr(self.real.api, name)

    def wait(self, name, timeout=None):
        import requests.exceptions
        if not self.wait_cut:
            self.wait_cut = True
            raise requests.exceptions.ChunkedEncodingError("Response ended prematurely")
        return self.real.api.wait(name, timeout=timeout)

    def inspect_container(self, name):
        import requests.exceptions
        if self.down_inspections:
            self.down_inspections -= 1
            raise requests.exceptions.ConnectionError("('Connection aborted.', ConnectionRefusedError(111))")
        return self.real.api.inspect_container(name)

    def engine_back(self):
        return self.wait_cut and not self.down_inspections


def test_a_watcher_that_lost_the_engine_watches_the_container_again_once_it_answers(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "sleep"}) as env:
        double = EngineLostClient(client)
        env.backends = env.new_backends(docker_client=double)
        act = open_activation(env, "worker")
        env.backends.start(env.store, act["id"])
        wait_until(double.engine_back, 30, message="the engine answering the watcher again")
        # The container outlived the engine's outage (live restore): still running and watched.
        assert env.store.activation(act["id"])["status"] == "running"
        assert env.backends.watched(act["id"])
        container_of(client, env.store, act["id"]).kill()
        wait_until(lambda: env.store.activation(act["id"])["status"] == "failed", 30, message="the failure")
        assert env.store.activation(act["id"])["error"].splitlines()[0] == "Runner exited with 137"


def test_a_start_while_the_engine_is_unreachable_fails_saying_so():
    import requests.exceptions
    error = requests.exceptions.ConnectionError("('Connection aborted.', FileNotFoundError(2))")
    assert backend.failure_text(error) == f"{backend.ENGINE_UNREACHABLE_ERROR}: {error}"
    assert backend.failure_text(RuntimeError("boom")) == "boom"


# ---------------------------------------------------------------- the controller died before recording a name

def containers_of(client, activation_id):
    return client.containers.list(all=True, filters={"label": f"suzumio.activation={activation_id}"})


def start_and_die_before_recording(env, client, activation_id):
    """Controller A creates the container, dies before recording its name; returns the container."""
    with dies_before_recording(env.store), pytest.raises(ControllerDied):
        env.backends.start(env.store, activation_id)
    env.backends.close()
    [container] = containers_of(client, activation_id)
    assert container.status == "created" and not env.store.activation(activation_id).get("containerName")
    return container


def test_restarted_controller_starts_a_created_container_it_never_recorded(tmp_path, client, project):
    with docker_project(tmp_path, project) as env:
        act = open_activation(env, "worker")
        container = start_and_die_before_recording(env, client, act["id"])
        fresh = env.new_backends()
        Reconciler(fresh).reconcile([env.store])
        assert env.store.activation(act["id"])["containerName"] == container.name
        assert env.store.agent("worker")["containerName"] == container.name
        wait_until(lambda: env.store.activation(act["id"])["status"] == "completed", 60,
                   message="the started container posted its output")


def test_restarted_controller_watches_a_running_container_it_never_recorded(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "delay-output:5"}) as env:
        act = open_activation(env, "worker")
        container = start_and_die_before_recording(env, client, act["id"])
        container.start()  # it was started, only its name is missing
        wait_until(lambda: (env.store.dir / "agents/worker/workspace/standin-seen.json").exists(), 30)
        fresh = env.new_backends()
        Reconciler(fresh).reconcile([env.store])
        assert env.store.activation(act["id"])["containerName"] == container.name
        assert fresh.watched(act["id"])
        wait_until(lambda: env.store.activation(act["id"])["status"] == "completed", 60)


def test_restarted_controller_settles_an_exited_container_it_never_recorded(tmp_path, client, project):
    with docker_project(tmp_path, project, agent_env={"STANDIN_MODE": "exit:3"}) as env:
        act = open_activation(env, "worker")
        container = start_and_die_before_recording(env, client, act["id"])
        container.start()
        wait_until(lambda: client.containers.get(container.name).status == "exited", 30)
        Reconciler(env.new_backends()).reconcile([env.store])
        final = env.store.activation(act["id"])
        assert final["status"] == "failed" and final["containerName"] == container.name
        assert final["error"].startswith("Runner exited with 3") and "boom" in final["error"]


def test_without_a_container_the_never_started_grace_rule_applies(tmp_path, client, project):
    with docker_project(tmp_path, project) as env:
        act = open_activation(env, "worker")
        start = parse_ts(act["startedAt"])
        Reconciler(env.backends).reconcile([env.store], now=start + datetime.timedelta(seconds=30))
        assert env.store.activation(act["id"])["status"] == "running"
        Reconciler(env.backends).reconcile([env.store], now=start + datetime.timedelta(seconds=61))
        assert env.store.activation(act["id"])["error"] == backend.NEVER_STARTED_ERROR


def test_a_container_whose_name_cannot_be_recorded_is_removed(tmp_path, client, project):
    with docker_project(tmp_path, project) as env:
        act = open_activation(env, "worker")
        with dies_before_recording(env.store, error=RuntimeError):
            env.backends.start(env.store, act["id"])
        final = env.store.activation(act["id"])
        assert final["status"] == "failed" and final["error"].startswith("recording suzumio_")
        assert containers_of(client, act["id"]) == []
