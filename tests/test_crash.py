"""Crash safety (reliability, part 1): SIGKILL of the controller (`suzumio serve`) at random points of a
running team, of one activation's runner (a `local` process group, a `docker-chat` container) and of
the controller's Node host during a support call and a hook. Real serve subprocesses, real runners with
the scripted provider, a real Docker engine and real node. `make soak` runs many more controller trials
(bench/soak_crash.py); SUZUMIO_CRASH_TRIALS sets how many run here."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests
import yaml
from api_fixtures import init_project, running_activation, serving
from conftest import require, wait_until
from crash_fixtures import (
    KICKOFF,
    PROJECT,
    REPO,
    TOOLPACK_PROJECT,
    ChaosTrial,
    Controller,
    CrashTeam,
    all_history,
    busy_runner,
    check_settled,
    child_pids,
    crash_config,
    crash_script,
    failure_kinds,
    init_root,
    process_gone,
    remove_containers,
    restart_port,
    runner_alive,
    runner_log,
    stop_leftover_runners,
    write_crash_toolpack,
    write_project,
)
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip
from store_fixtures import config_of

import suzumio
import suzumio_approvals
import suzumio_backend
import suzumio_backend_local
import suzumio_coordination as coordination
import suzumio_runtime
import suzumio_store
import suzumio_warm

pytestmark = pytest.mark.timeout(300)

TRIALS = int(os.environ.get("SUZUMIO_CRASH_TRIALS", "3"))
WORKERS = ("worker-1", "worker-2")
FAILED_NUDGE = "scheduler.failed_nudge"


# ---------------------------------------------------------------- the controller is killed

@pytest.mark.parametrize("seed", range(1, TRIALS + 1))
def test_killed_controller_loses_no_acked_message_delivers_no_signal_twice_and_the_team_submits(tmp_path, seed):
    result = ChaosTrial(tmp_path, seed).run()
    print(result.line())
    assert result.kills
    assert result.ok, result.line()


def workers_busy_after_pm_waits(store):
    """Both workers' runners inside their shell.exec while pm's first activation is over."""
    if any(a["agentId"] == "pm" for a in store.running_activations()):
        return None
    busy = [busy_runner(store, worker) for worker in WORKERS]
    return busy if all(busy) else None


def test_restarted_controller_adopts_live_runners_and_their_activations_complete(tmp_path):
    with CrashTeam(tmp_path, worker_sleep=3.0) as team:
        team.kickoff()
        busy = wait_until(lambda: team.read(workers_busy_after_pm_waits), 30, message="both workers busy")
        team.controller.kill()
        assert all(runner_alive(activation) for activation in busy)
        team.controller.start()
        team.wait_done(60)
        with team.store() as store:
            assert [store.activation(a["id"])["status"] for a in busy] == ["completed", "completed"]
            assert failure_kinds(store) == {}
        assert team.check() == []


def prepared_containers(root):
    """(name, state) of the crash project's prepared containers of this root's controller not yet
    claimed (other roots on the same engine may run a project of the same name)."""
    owner = suzumio_backend.warm_owner(suzumio_runtime.runner_socket_path(root))
    return suzumio_backend.DockerBackend().warm_containers(owner=owner, project=PROJECT)


def prepared_containers_of_busy_agents(team):
    """{name: the agent's running activation} of running prepared containers of agents inside a
    shell.exec call: none of them can be claimed (renamed to an activation) while that activation runs."""
    def look(store):
        busy = {agent: activation["id"] for agent in ("pm", *WORKERS)
                if (activation := busy_runner(store, agent))}
        return {name: activation_id for name, state in prepared_containers(team.root) if state == "running"
                for agent, activation_id in busy.items() if f"_{agent}_{suzumio_backend.WARM_MARK}" in name}
    return team.read(look)


def test_prepared_containers_of_a_killed_controller_are_removed_and_the_team_still_submits(tmp_path):
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    with CrashTeam(tmp_path, kind=suzumio_backend.KIND_DOCKER, image=RUNNER_IMAGE, worker_sleep=3.0) as team:
        team.kickoff()
        seen = wait_until(lambda: prepared_containers_of_busy_agents(team), 90,
                          message="prepared containers of busy agents")
        team.controller.kill()
        # The store is still from the kill on (runners write through the controller). An agent whose
        # activation seen in the look still runs cannot have claimed its prepared container since: that
        # container is certainly one the killed controller left. (An agent whose call ended in between may
        # have claimed it, or the pool replaced it; neither is the kill's doing.)
        certain = team.read(lambda store: {name for name, activation_id in seen.items()
                                           if store.activation(activation_id)["status"] == "running"})
        assert certain, f"every busy agent of the look {seen} ended its activation before the kill"
        left = {name for name, _state in prepared_containers(team.root)}
        assert left >= certain  # SIGKILL removes nothing
        team.controller.start()
        wait_until(lambda: not left & {name for name, _state in prepared_containers(team.root)}, 90,
                   message="the killed controller's prepared containers removed")
        team.wait_done(180)
        assert team.check() == []
        team.controller.stop()  # SIGTERM: the shutdown removes what the new controller prepared
        assert prepared_containers(team.root) == []


def prepared_processes(root):
    """Pids of live prepared local runners waiting on this root's warm socket: started with `--warm`
    and not yet claimed. A claimed runner keeps its command line, so its slot id (recorded in its
    activation's runner.slot before it gets its input) tells it apart: it runs an activation that
    outlives a killed controller on purpose, to be adopted by the next one."""
    marker = f"--warm {suzumio_warm.warm_socket_path(suzumio_runtime.runner_socket_path(root))} "
    claimed = {path.read_text(encoding="utf-8").strip() for path in Path(root).glob("*/activations/*/runner.slot")}
    return {pid for pid, text in suzumio_backend_local.command_lines()
            if marker in text and warm_slot(text) not in claimed and not process_gone(pid)}


def warm_slot(command_line):
    words = command_line.split()
    return words[words.index(suzumio_warm.SLOT_FLAG) + 1] if suzumio_warm.SLOT_FLAG in words[:-1] else None


def prepared_agent(pid):
    """The agent a prepared local runner was spawned for: it runs in that agent's workspace."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).parent.name
    except OSError:
        return None


def prepared_for_busy_agents(team):
    """Unclaimed prepared runners of agents inside a shell.exec call: none of them can be claimed before
    that call, its activation and a scheduler tick are over."""
    def look(store):
        busy = {agent for agent in ("pm", *WORKERS) if busy_runner(store, agent)}
        return {pid for pid in prepared_processes(team.root) if prepared_agent(pid) in busy}
    return team.read(look)


def test_prepared_local_runners_of_a_killed_controller_end_and_the_team_still_submits(tmp_path):
    with CrashTeam(tmp_path, worker_sleep=3.0) as team:
        team.kickoff()
        certain = wait_until(lambda: prepared_for_busy_agents(team), 60, message="prepared runners of busy agents")
        team.controller.kill()
        # Read after the kill as well: a runner claimed since the look above runs its activation on (the
        # next controller adopts it) and drops out of prepared_processes; one the pool removed meanwhile
        # has ended already; every other one, unclaimed when the controller died, must end.
        left = certain | prepared_processes(team.root)
        # Their warm socket closed with the controller: they end instead of waiting for ever.
        wait_until(lambda: not left & prepared_processes(team.root), 30, message="prepared runners ended")
        team.controller.start()
        team.wait_done(120)
        assert team.check() == []
        team.controller.stop()
        assert prepared_processes(team.root) == set()


KILLED_AT_WARM_CLAIM = REPO / "tests" / "serve_killed_at_warm_claim.py"


def claimed_activation(store):
    """The activation a prepared runner was claimed for (its runner.slot written)."""
    for activation in store.list_activations(limit=100):
        if (store.activation_dir(activation["id"]) / "runner.slot").exists():
            return activation
    return None


@pytest.mark.parametrize("kill_at", ["before", "after"])
def test_controller_killed_at_a_warm_claim_leaves_no_activation_waiting(tmp_path, monkeypatch, kill_at):
    """A test-only serve kills itself at the first claim of a prepared runner, before the runner got its
    input or after it (before its pid was recorded). The next serve finds the claimed runner by the slot
    its runner.slot records: adopted, the activation completes; gone, the activation fails at once as a
    runner that gave no output (not after the grace of a runner that was never started), and the agent
    works again."""
    monkeypatch.setenv("SUZUMIO_TEST_KILL_AT", kill_at)
    with CrashTeam(tmp_path) as team:
        try:
            team.kickoff(launcher=KILLED_AT_WARM_CLAIM)
        except requests.ConnectionError:
            pass  # serve died before it answered the project start
        wait_until(team.controller.exited, 90, message=f"serve killed at a warm claim ({team.controller.log_path})")
        assert team.controller.process.returncode == -signal.SIGKILL
        claimed = team.read(claimed_activation)
        assert claimed is not None and not claimed.get("containerName")
        team.controller.start()
        team.wait_done(120)
        with team.store() as store:
            settled = store.activation(claimed["id"])
            if kill_at == "after":
                assert settled["status"] == "completed"
                assert settled["containerName"].startswith(suzumio_backend.LOCAL_PREFIX)
            else:
                assert (settled["status"], settled["error"]) == ("failed", suzumio_backend.NO_OUTPUT_ERROR)
                # Retried by its failed nudge, or by a signal that reached the agent first.
                assert any(a["agentId"] == settled["agentId"] and a["id"] > settled["id"] and a["status"] == "completed"
                           for a in store.list_activations(limit=100))
        assert team.check() == []


def test_runner_dying_after_a_controller_restart_fails_and_the_failed_nudge_retries_it(tmp_path):
    with CrashTeam(tmp_path, worker_sleep=3.0) as team:
        team.kickoff()
        busy = wait_until(lambda: team.read(workers_busy_after_pm_waits), 30, message="both workers busy")
        victim = busy[0]
        team.controller.kill()
        team.controller.start()
        assert runner_alive(victim)
        os.killpg(suzumio_backend.local_pid(victim["containerName"]), signal.SIGKILL)
        team.wait_done(60)
        with team.store() as store:
            failed = store.activation(victim["id"])
            assert (failed["status"], failed["error"]) == ("failed", suzumio_backend.NO_OUTPUT_ERROR)
            retry = retry_of(store, failed)
            assert retry["status"] == "completed"
        assert team.check() == []


def retry_of(store, failed):
    """The activation that the failed nudge for `failed` woke."""
    for sig in store.list_signals(target_agent=failed["agentId"], kind=FAILED_NUDGE, limit=100):
        if sig["payload"]["previousActivationId"] == failed["id"] and sig.get("deliveredActivationId"):
            return store.activation(sig["deliveredActivationId"])
    raise AssertionError(f"no failed nudge woke {failed['agentId']} after {failed['id']}")


# ---------------------------------------------------------------- a runner is killed

def served_team(service, folder, **config_options):
    """The crash team on the in-process controller, kicked off."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "crash-script.yaml").write_text(yaml.safe_dump(crash_script(), sort_keys=False), encoding="utf-8")
    config = crash_config(service.port, **config_options)
    store = init_project(service.root, folder, yaml.safe_dump(config, sort_keys=False))
    coordination.send_message(store, config_of(store), "user", KICKOFF, recipient="pm")
    assert service.post(f"/api/projects/{PROJECT}/start").status_code == 200
    return store


def submitted(store):
    return store.project()["status"] == "submitted"


def failed_activation(store, activation_id):
    activation = store.activation(activation_id)
    return activation if activation["status"] == "failed" else None


def test_killed_local_runner_fails_with_its_exit_text_and_the_failed_nudge_recovers(tmp_path):
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = served_team(service, tmp_path / "team")
        victim = wait_until(lambda: busy_runner(store, "worker-1"), 30, message="worker-1 in shell.exec")
        os.killpg(suzumio_backend.local_pid(victim["containerName"]), signal.SIGKILL)
        failed = wait_until(lambda: failed_activation(store, victim["id"]), 15, message="the failure")
        assert failed["error"].splitlines()[0] == "Runner exited with 137"
        wait_until(lambda: submitted(store), 60, message="submission")
        retry = retry_of(store, failed)
        assert retry["status"] == "completed"
        assert (store.artifacts_dir("worker-1") / "part.md").read_text() == "part by worker-1\n"
        wait_until(lambda: not store.running_activations(), 30, message="settled activations")
        assert check_settled(store, {}) == []


def test_killed_local_runner_without_failed_nudge_recovers_on_the_next_signal(tmp_path):
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = served_team(service, tmp_path / "team", failed_nudge=False)
        victim = wait_until(lambda: busy_runner(store, "worker-1"), 30, message="worker-1 in shell.exec")
        os.killpg(suzumio_backend.local_pid(victim["containerName"]), signal.SIGKILL)
        failed = wait_until(lambda: failed_activation(store, victim["id"]), 15, message="the failure")
        assert failed["error"].splitlines()[0] == "Runner exited with 137"
        # Its shell.exec was cut short: the call is in doubt and the agent is told so once. That notice
        # is the first signal to wake it again, whenever the scheduler's next pass comes.
        notice = wait_until(lambda: next(iter(store.list_signals(target_agent="worker-1", kind="effect.in_doubt")),
                                         None), 15, message="the in-doubt notice")
        assert notice["payload"]["activationId"] == victim["id"]
        retry = service.post(f"/api/projects/{PROJECT}/messages",
                             {"recipient": "worker-1", "body": "Please write part A again."}).json()
        wait_until(lambda: submitted(store), 60, message="submission")
        signal_row = next(s for s in store.list_signals(target_agent="worker-1", kind="message.created")
                          if s["payload"]["id"] == retry["id"])
        woke = store.activation(signal_row["deliveredActivationId"])
        assert woke["status"] == "completed"
        assert store.list_signals(kind=FAILED_NUDGE) == []
        woken = store.activation(store.signal(notice["id"])["deliveredActivationId"])
        assert woken["agentId"] == "worker-1" and woken["id"] > victim["id"]
        wait_until(lambda: not store.running_activations(), 30, message="settled activations")
        assert check_settled(store, {retry["id"]: "Please write part A again."}) == []


def test_killed_docker_container_fails_with_its_exit_text_and_the_failed_nudge_recovers(tmp_path):
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    with serving(tmp_path / "root", scheduler_interval=0.2) as service:
        store = served_team(service, tmp_path / "team", kind=suzumio_backend.KIND_DOCKER, image=RUNNER_IMAGE)
        try:
            victim = wait_until(lambda: busy_runner(store, "worker-1"), 60, message="worker-1 in shell.exec")
            client.api.kill(victim["containerName"])
            failed = wait_until(lambda: failed_activation(store, victim["id"]), 30, message="the failure")
            assert failed["error"].splitlines()[0] == "Runner exited with 137"
            wait_until(lambda: submitted(store), 90, message="submission")
            assert retry_of(store, failed)["status"] == "completed"
            wait_until(lambda: not store.running_activations(), 60, message="settled activations")
            assert check_settled(store, {}) == []
        finally:
            remove_containers(store)


# ---------------------------------------------------------------- the controller's Node host is killed

@pytest.fixture
def node():
    if shutil.which("node") is None:
        require("node")("Node.js is not installed")


@pytest.fixture
def tools_service(tmp_path, node):
    with serving(tmp_path / "root") as service:
        folder = tmp_path / "tools"
        write_crash_toolpack(folder / "toolpacks" / "crash")
        store = init_project(service.root, folder, TOOLPACK_PROJECT.format(url=service.base_url))
        store.start()
        yield service, store


def support(service, store, activation, tool):
    body = {"project": store.project_id, "agentId": "pm", "activationId": activation["id"],
            "token": service.token(store.project_id, "pm"), "tool": tool, "input": {}}
    return service.post("/toolpacks/crash-tools/support", body, timeout=90)


def kill_host_when_blocked(pid_file):
    """SIGKILL the Node host once the blocking handler wrote its pid; returns that pid."""
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), 30, message="the blocked host"))
    os.kill(pid, signal.SIGKILL)
    return pid


def test_killed_node_host_fails_the_support_call_in_flight_and_the_next_call_gets_a_fresh_host(tools_service):
    service, store = tools_service
    activation = running_activation(store, "pm")
    answers = []
    call = threading.Thread(target=lambda: answers.append(support(service, store, activation, "crash.block")))
    call.start()
    killed = kill_host_when_blocked(store.dir / "support-host.pid")
    call.join(timeout=90)
    assert answers[0].status_code == 500
    assert answers[0].json()["error"].startswith("Toolpack host failed: host exited with code -9")
    answer = support(service, store, activation, "crash.ping")
    assert answer.status_code == 200
    fresh = service.toolpacks.node.pid
    assert answer.json() == {"output": f"pong from {fresh}"}
    assert fresh != killed


def test_killed_node_host_fails_the_hook_in_flight_and_the_next_tick_gets_a_fresh_host(tools_service):
    service, store = tools_service
    (store.dir / "hook-mode.txt").write_text("block")
    tick = threading.Thread(target=service.scheduler.tick, args=(store.project_id,))
    tick.start()
    killed = kill_host_when_blocked(store.dir / "hook-host.pid")
    tick.join(timeout=30)
    failures = [json.loads(e["data_json"]) for e in store.list_events(limit=100)
                if e["type"] == "scheduler.hook_failed"]
    assert len(failures) == 1
    assert failures[0]["toolpackId"] == "crash-tools"
    assert failures[0]["error"].startswith("Toolpack host failed: host exited with code -9")
    (store.dir / "hook-mode.txt").write_text("ping")
    service.scheduler.tick(store.project_id)
    pings = store.list_signals(kind="x.crash_ping")
    assert len(pings) == 1
    assert pings[0]["payload"]["pid"] == service.toolpacks.node.pid != killed


@pytest.mark.parametrize("hook", ["none", "block"])
def test_node_host_exits_when_its_controller_is_killed(tmp_path, node, hook):
    port = restart_port()
    folder = tmp_path / "tools"
    write_crash_toolpack(folder / "toolpacks" / "crash")
    (folder / "project.yaml").write_text(TOOLPACK_PROJECT.format(url=f"http://127.0.0.1:{port}"))
    init_root(tmp_path / "root", folder / "project.yaml")
    project_dir = tmp_path / "root" / "crash-tools"
    controller = Controller(tmp_path / "root", port, tmp_path / "serve.log")
    controller.start()
    hosts = []
    try:
        controller.post("/api/projects/crash-tools/start").raise_for_status()
        hosts = wait_until(lambda: child_pids(controller.process.pid, "suzumio_toolpack_host.mjs"), 15,
                           message="the controller's Node host")
        if hook == "block":
            (project_dir / "hook-mode.txt").write_text("block")
            wait_until((project_dir / "hook-host.pid").exists, 15, message="a blocked hook")
        controller.kill()
        wait_until(lambda: all(map(process_gone, hosts)), 3, message="the orphaned Node host to exit")
    finally:
        controller.stop()
        for pid in hosts:
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)


def start_until_killed(controller, window):
    """Start the project on a test-only serve that kills itself in `window` once the project runs (the
    start's own answer may be lost with it), and wait for that SIGKILL."""
    try:
        started = controller.post(f"/api/projects/{PROJECT}/start").status_code
    except requests.ConnectionError:
        started = None  # serve died before it wrote this answer
    assert started in (200, None)
    wait_until(controller.exited, 90, message=f"serve killed {window} ({controller.log_path})")
    assert controller.process.returncode == -signal.SIGKILL


KILLED_AFTER_SEND = REPO / "tests" / "serve_killed_after_scheduled_send.py"
JOB_BODY = "The daily summary is due."


def scheduler_job(project_dir):
    """The one job of the project's scheduler toolpack state."""
    [job] = json.loads((project_dir / "toolpack-state" / "scheduler" / "jobs.json").read_text())["jobs"]
    return job


def test_controller_killed_between_a_scheduler_toolpack_send_and_its_state_save_sends_the_job_once(
        tmp_path, node):
    """serve dies after the scheduler toolpack's hook sent a due job (the message committed) and before
    the hook saved the job as sent (a test-only serve kills itself there). The next serve's hook sends the
    job again with the same key, gets the message already recorded and saves the job: one message."""
    port = restart_port()
    config = crash_config(port)  # the crash team, left quiet: the job's message goes to the user
    config["scheduler"]["allQuietNudge"]["enabled"] = False
    config["tools"]["toolpacks"].append({"packaged": "scheduler"})
    root_path = tmp_path / "root"
    init_root(root_path, write_project(tmp_path / "project", config, crash_script()))
    project_dir = root_path / PROJECT
    controller = Controller(root_path, port, tmp_path / "serve.log")
    root = suzumio_store.Root(root_path)
    store = root.open_project(PROJECT)

    def sent():
        return [m for m in store.list_messages(100, full_body=True) if m["body"] == JOB_BODY]

    try:
        controller.start(launcher=KILLED_AFTER_SEND)
        created = controller.post(f"/api/projects/{PROJECT}/tool-ui/scheduler/schedule.once",
                                  {"recipient": "user", "afterMs": 1, "body": JOB_BODY})
        assert created.status_code == 200, created.text
        job_id = created.json()["metadata"]["job"]["id"]
        start_until_killed(controller, "after the scheduled send")
        [message] = sent()  # committed before the kill ...
        assert scheduler_job(project_dir)["sentCount"] == 0  # ... the job's state not yet saved
        controller.start()
        wait_until(lambda: scheduler_job(project_dir)["status"] == "done", 30,
                   message=f"the job saved as sent ({controller.log_path})")
        job = scheduler_job(project_dir)
        assert (job["id"], job["sentCount"], job["lastMessageId"]) == (job_id, 1, message["id"])
        assert sent() == [message]
        created_events = [e for e in store.list_events(1000) if e["type"] == "message.created"
                          and json.loads(e["data_json"])["body"] == JOB_BODY]
        assert len(created_events) == 1
        assert not [e for e in store.list_events(1000) if e["type"] == "scheduler.hook_failed"]
    finally:
        controller.stop()
        stop_leftover_runners(store)
        root.close()


# ---------------------------------------------------------------- the Docker SDK is loaded from two threads

# Right after a restart the reconciler inspects containers while the scheduler creates new ones; both
# may be the process's first use of the Docker SDK. A fresh interpreter replays that moment.
FIRST_SDK_USE = """
import sys, threading
import suzumio_backend
barrier = threading.Barrier(2)
failures, others = [], []
def call(function):
    barrier.wait()
    try:
        function()
    except ImportError as error:
        failures.append(f"ImportError: {error}")
    except Exception as error:  # no engine, no launch: only the import matters; other errors are expected
        others.append(type(error).__name__)
threads = [threading.Thread(target=call, args=(lambda: suzumio_backend.DockerBackend().create(None, []),)),
           threading.Thread(target=call, args=(lambda: suzumio_backend.DockerBackend().state("suzumio-none"),))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("\\n".join(failures) or "ok")
"""


def test_first_docker_sdk_use_from_two_threads_at_once_imports_cleanly():
    pytest.importorskip("docker")
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", FIRST_SDK_USE], cwd=REPO, capture_output=True, text=True,
                                check=False, timeout=120)
        assert result.stdout.strip() == "ok", result.stdout + result.stderr


# ---------------------------------------------------------------- a pending approval survives the controller

def approval_config(kind, image, command="printf 'ran\\n' >> {artifacts}/deploy.log  # deploy"):
    config = crash_config(0, kind=kind, image=image, failed_nudge=False)
    config["scheduler"] = {"noEffectNudge": {"enabled": False}}
    config["agents"] = {"worker": {"prompt": "Deploy when asked.", "tools": ["shell.exec"],
                                   "approve": [{"tool": "shell.exec", "match": {"command": "deploy"}}]}}
    script = {"agents": {"worker": [{"steps": [{"tools": [{"name": "shell.exec", "input": {"command": command}}]},
                                               {"say": "Deployed."}]}]}}
    return config, script


@pytest.mark.parametrize("kind", [pytest.param("local"), pytest.param("docker-chat", marks=pytest.mark.docker)])
def test_killed_controller_keeps_a_pending_approval_and_the_allowed_tool_runs_exactly_once(tmp_path, kind):
    image = None
    if kind == "docker-chat":
        runner_image_or_skip(docker_client_or_skip())
        image = RUNNER_IMAGE
    config, script = approval_config(kind, image)
    root_path = tmp_path / "root"
    init_root(root_path, write_project(tmp_path / "project", config, script))
    controller = Controller(root_path, restart_port(), tmp_path / "serve.log")
    root = suzumio_store.Root(root_path)
    store = root.open_project(PROJECT)
    token = {}
    try:
        controller.start()
        token["Authorization"] = f"Bearer {suzumio_runtime.read_api_token(root_path)}"
        assert controller.post(f"/api/projects/{PROJECT}/start").status_code == 200
        assert controller.post(f"/api/projects/{PROJECT}/messages",
                               {"recipient": "worker", "body": "Deploy."}).status_code == 200

        def pending():
            answer = requests.get(f"{controller.url}/api/projects/{PROJECT}/approvals?status=pending",
                                  headers=token, timeout=5)
            return answer.json() if answer.status_code == 200 and answer.json() else None

        [request] = wait_until(pending, 90, message="a pending approval request")
        activation = store.activation(request["activationId"])
        # A runner already waiting for its decision; the kill between the request's commit and the
        # runner's receipt of that answer is the next test.
        wait_until(lambda: f"waiting for approval {request['id']}" in runner_log(store, activation), 30,
                   message="the runner waiting for its decision")
        controller.kill()
        assert runner_alive(activation)  # the runner keeps waiting (asking again) while serve is down
        controller.start()
        [still] = pending()
        assert still["id"] == request["id"]
        assert store.activation(activation["id"])["status"] == "running"  # adopted, not restarted
        decided = controller.post(f"/api/projects/{PROJECT}/approvals/{request['id']}", {"decision": "allow"})
        assert decided.status_code == 200, decided.text
        wait_until(lambda: store.activation(activation["id"])["status"] != "running", 90, message="completion")
        assert store.activation(activation["id"])["status"] == "completed"
        assert (store.artifacts_dir("worker") / "deploy.log").read_text() == "ran\n"  # exactly once
        assert [a["id"] for a in store.list_activations(100)] == [activation["id"]]
        assert [(c["tool"], c["status"]) for c in store.list_tool_calls(10)] == [("shell.exec", "completed")]
        again = controller.post(f"/api/projects/{PROJECT}/approvals/{request['id']}", {"decision": "allow"})
        assert again.status_code == 409
    finally:
        controller.stop()
        stop_leftover_runners(store)
        if kind == "docker-chat":
            remove_containers(store)
        root.close()


KILLED_AFTER_START = REPO / "tests" / "serve_killed_after_start.py"


def test_controller_killed_between_the_start_commit_and_its_answer_runs_the_allowed_tool_once(tmp_path):
    """Spec-notes 16k: serve dies after /runner/tool-calls/start committed the call and its request but
    before the runner read the answer (a test-only serve kills itself there). The runner asks again with
    its call key until the next serve answers the same call and request; allowed by the CLI, the tool
    runs once and its real output is the call's result."""
    config, script = approval_config("local", None, "printf 'ran\\n' >> {artifacts}/deploy.log; echo deployed")
    root_path = tmp_path / "root"
    init_root(root_path, write_project(tmp_path / "project", config, script))
    controller = Controller(root_path, restart_port(), tmp_path / "serve.log")
    root = suzumio_store.Root(root_path)
    store = root.open_project(PROJECT)
    try:
        controller.start(launcher=KILLED_AFTER_START)
        # The message first: once the project runs, the worker's tool call may kill serve before the
        # answer to any request in flight (the project start's included) is written.
        assert controller.post(f"/api/projects/{PROJECT}/messages",
                               {"recipient": "worker", "body": "Deploy."}).status_code == 200
        start_until_killed(controller, "after the start commit")
        assert store.project()["status"] == "running"
        # Committed before the kill: the running call and its pending request. The runner has no answer.
        [call] = store.list_tool_calls(10)
        [request] = suzumio_approvals.list_approvals(store, status="pending")
        assert (call["status"], request["toolCallId"]) == ("running", call["id"])
        activation = store.activation(request["activationId"])
        wait_until(lambda: "/runner/tool-calls/start: Suzumio controller request failed" in
                   runner_log(store, activation), 30, message="the runner asking again for its start")
        assert runner_alive(activation)
        assert f"waiting for approval {request['id']}" not in runner_log(store, activation)
        controller.start()
        wait_until(lambda: f"waiting for approval {request['id']}" in runner_log(store, activation), 60,
                   message="the runner waiting for the request its repeated start was answered")
        out, err = io.StringIO(), io.StringIO()
        assert suzumio.main(["allow", PROJECT, request["id"], "--root", str(root_path)], out=out, err=err) == 0, \
            err.getvalue()
        wait_until(lambda: store.activation(activation["id"])["status"] != "running", 90, message="completion")
        assert store.activation(activation["id"])["status"] == "completed"
        assert (store.artifacts_dir("worker") / "deploy.log").read_text() == "ran\n"  # exactly once
        [finished] = store.list_tool_calls(10)
        assert (finished["id"], finished["status"]) == (call["id"], "completed")
        assert finished["output"].endswith("[stdout]\ndeployed")  # what the runner returned to the model
        assert [a["id"] for a in suzumio_approvals.list_approvals(store)] == [request["id"]]
        events = [e["type"] for e in store.list_events(1000)]
        assert (events.count("tool.called"), events.count("approval.requested"), events.count("approval.decided"),
                events.count("tool.completed"), events.count("tool.failed")) == (1, 1, 1, 1, 0)
        results = [h for h in all_history(store, "worker") if h["role"] == "tool_result"]
        assert [(h["kind"], h["metadata"]["toolCallId"]) for h in results] == [("tool_result", call["id"])]
        assert results[0]["content"].endswith("[stdout]\ndeployed")
    finally:
        controller.stop()
        stop_leftover_runners(store)
        root.close()
