"""backend.kind swarm on a real multi-node Swarm lab (scripts/swarm-lab up; `make test-swarm` starts one):
a team whose activations run as replicated-job services on the workers, reach the TLS runner listener,
get their files from the controller and send their artifacts back; a worker node lost mid-activation
fails that activation and the failed-nudge retry finishes the work on the other node. The node test
removes a node, so it runs last. SUZUMIO_SWARM_LAB names the lab's settings file."""
import json
import socket
import subprocess

import pytest
import yaml
from api_fixtures import init_project, serving
from conftest import wait_until
from e2e_fixtures import Team, call, project_config
from fake_model import FakeModel
from test_egress import BODY, Upstream, curl, names_resolver
from test_swarm_lab import lab_settings

import docker
import suzumio_backend
import suzumio_backend_reconcile
import suzumio_coordination as coordination

pytestmark = pytest.mark.swarm

IMAGE = "suzumio-runner:dev"
RUN_TIMEOUT = 120.0
TOOLS = ["messages.send", "coordination.wait_for_signal", "completion.submit", "file.*", "shell.*"]


def workers(settings):
    return [settings[f"SUZUMIO_LAB_WORKER_{i}"] for i in range(1, int(settings["SUZUMIO_LAB_WORKERS"]) + 1)]


def swarm_team(tmp_path, settings, agents, scheduler=None, resolver=None, network=None, **options):
    """Serve on the lab bridge's host address and start project `e2e` on backend.kind swarm (on the
    default sealed network unless `network` names another); `options` go to e2e_fixtures.project_config."""
    host = settings["SUZUMIO_LAB_HOST_IP"]
    model = FakeModel()
    stack = serving(tmp_path / "root", runner_listen=(host, 0), scheduler_interval=0.5,  # ticks as serve does
                    resolver=resolver)
    service = stack.__enter__()
    controller_url = f"https://{host}:{service.runner_server.port}"
    presets = {agent: {"provider": "fake", "model": agent} for agent in agents}
    config = project_config("swarm", controller_url, model.base_url, agents=agents, presets=presets,
                            scheduler=scheduler, **options)
    config["backend"].update(image=IMAGE, swarm={"engine": settings["SUZUMIO_SWARM_ENGINE"],
                                                 "constraints": ["node.role == worker"],
                                                 **({"network": network} if network else {})})
    store = init_project(service.root, tmp_path / "config", yaml.safe_dump(config, sort_keys=False))
    store.start()
    return Team(service, store, model, "swarm"), stack, model


@pytest.fixture
def lab():
    settings = lab_settings()
    client = docker.DockerClient(base_url=settings["SUZUMIO_SWARM_ENGINE"])
    teams = []
    try:
        yield settings, client, teams
    finally:
        for team, stack, model in teams:
            team.stop_running()
            stack.__exit__(None, None, None)
            model.close()
        for service in client.services.list(filters={"label": "suzumio.gateway"}):
            service.remove()  # stopping a project leaves its listener's gateway running
        client.close()


def our_services(client, team):
    return client.services.list(filters={"label": f"suzumio.project={team.name}"})


def test_four_workers_on_two_nodes_write_through_the_controller_and_a_reader_reads_a_workers_file(tmp_path, lab):
    settings, client, teams = lab
    first, second = workers(settings)[:2]
    # worker-1 and worker-3 on the first node, worker-2 and worker-4 on the second
    placement = {f"worker-{n}": (first if n % 2 else second) for n in range(1, 5)}
    agents = {worker: {"model": worker, "tools": TOOLS, "swarm": {"constraints": [f"node.hostname=={node}"]}}
              for worker, node in placement.items()}
    agents["reader"] = {"model": "reader", "tools": TOOLS,
                        "mounts": [{"source": str(tmp_path / "inputs"), "target": "/data/inputs"}]}
    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "brief.txt").write_text("the mounted brief\n")
    team, stack, model = swarm_team(tmp_path, settings, agents)
    teams.append((team, stack, model))
    for worker in placement:
        folder = f"/artifacts/{worker}/out"
        # in its workspace (the shell's folder) first: a scratch folder the task's user writes
        command = f"touch scratch.txt && mkdir -p {folder} && echo from-$(hostname)-{worker} > {folder}/note.txt"
        model.enqueue(tool_calls=[call("shell.exec", command=command)], model=worker)
        model.enqueue(content="Written.", model=worker)
        team.send(worker, "Write your note.")
    for worker in placement:
        [activation] = team.wait_activations(worker, 1, RUN_TIMEOUT)
        assert activation["status"] == "completed", team.describe()
    notes = {worker: (team.store.artifacts_dir(worker) / "out" / "note.txt").read_text().strip()
             for worker in placement}
    assert all(notes[worker].endswith(f"-{worker}") for worker in placement)

    def nodes():
        rows = team.service.get(f"/api/projects/{team.name}/activations").json()
        return {row["agentId"]: row.get("node") for row in rows}
    team.wait_for(lambda: all(nodes().values()), 30, "every activation's node to be recorded")
    assert nodes() == placement
    rows = {row["agentId"]: row for row in team.service.get(f"/api/projects/{team.name}/activations").json()}
    assert rows["worker-1"]["containerName"].startswith("swarm:suzumio-act-")

    model.enqueue(tool_calls=[call("file.read", path="/artifacts/worker-2/out/note.txt"),
                              call("shell.exec", command="cat /data/inputs/brief.txt")], model="reader")
    model.enqueue(content="Read it.", model="reader")
    team.send("reader", "Read worker-2's note.")
    [read] = team.wait_activations("reader", 1, RUN_TIMEOUT)
    assert read["status"] == "completed", team.describe()
    assert notes["worker-2"] in team.tool_messages("reader")[0]
    assert "the mounted brief" in team.tool_messages("reader")[1]  # a mount, copied in read-only
    # Ended services and their secrets are gone; the log tail stays as runner.log.
    wait_until(lambda: not our_services(client, team), 30, message="the ended services to be removed")
    wait_until(lambda: not client.secrets.list(filters={"label": f"suzumio.project={team.name}"}), 30,
               message="the ended services' secrets to be removed")
    data = json.loads((team.store.activation_dir(read["id"]) / "input.json").read_text())
    assert data["files"] == "controller" and data["controllerCa"]
    assert (team.store.activation_dir(read["id"]) / "runner.log").exists()


def placed(team, agent_id):
    """The agent's running activation once the manager placed its task on a node."""
    return team.wait_for(lambda: next((a for a in team.activations(agent_id)
                                       if a.get("node") and a["status"] == "running"), None),
                         RUN_TIMEOUT, f"{agent_id}'s activation to be placed")


def test_stopping_the_project_removes_the_running_service_and_its_secret(tmp_path, lab):
    settings, client, teams = lab
    team, stack, model = swarm_team(tmp_path, settings, {"worker": {"model": "worker", "tools": TOOLS}})
    teams.append((team, stack, model))
    model.enqueue(tool_calls=[call("shell.exec", command="sleep 300", timeoutMs=300000)], model="worker")
    team.send("worker", "Work long.")
    running = placed(team, "worker")
    assert our_services(client, team)
    assert team.service.post(f"/api/projects/{team.name}/stop").status_code == 200
    assert team.store.activation(running["id"])["status"] == "cancelled"
    wait_until(lambda: not our_services(client, team), 30, message="the service to be removed")
    wait_until(lambda: not client.secrets.list(filters={"label": f"suzumio.activation={running['id']}"}), 30,
               message="its secret to be removed")


def test_a_restarted_controller_adopts_a_running_task_by_its_labels(tmp_path, lab):
    settings, client, teams = lab
    team, stack, model = swarm_team(tmp_path, settings, {"worker": {"model": "worker", "tools": TOOLS}})
    teams.append((team, stack, model))
    model.enqueue(tool_calls=[call("shell.exec", command="sleep 5 && echo adopted > /artifacts/worker/a.txt")],
                  model="worker")
    model.enqueue(content="Done.", model="worker")
    team.send("worker", "Work a little.")
    running = placed(team, "worker")
    # The controller's watchers stop, as when serve exits; the task goes on.
    old = team.service.backends
    old.closed.set()
    wait_until(lambda: not old.watched(running["id"]), 10, message="the old watcher to stop")
    restarted = suzumio_backend.Backends(controller_ca=old.controller_ca, configs=old.configs)
    try:
        engine = settings["SUZUMIO_SWARM_ENGINE"]
        assert restarted.swarm.services(engine, team.name, running["id"]) == [(running["containerName"], running["id"])]
        suzumio_backend_reconcile.Reconciler(restarted).reconcile([team.store])
        assert restarted.watched(running["id"])
        team.wait_for(lambda: team.store.activation(running["id"])["status"] == "completed", RUN_TIMEOUT,
                      "the adopted activation to complete")
        wait_until(lambda: not our_services(client, team), 30, message="the adopted service to be removed")
        assert (team.store.artifacts_dir("worker") / "a.txt").read_text().strip() == "adopted"
        assert (team.store.activation_dir(running["id"]) / "runner.log").exists()
    finally:
        restarted.close()


def test_gc_removes_the_service_and_secret_a_dead_controller_left(tmp_path, lab):
    settings, client, teams = lab
    team, stack, model = swarm_team(tmp_path, settings, {"worker": {"model": "worker", "tools": TOOLS}})
    teams.append((team, stack, model))
    model.enqueue(tool_calls=[call("shell.exec", command="sleep 300", timeoutMs=300000)], model="worker")
    team.send("worker", "Work long.")
    running = placed(team, "worker")
    # The controller dies (its watchers stop) and the activation ends without its runner being stopped.
    old = team.service.backends
    old.closed.set()
    wait_until(lambda: not old.watched(running["id"]), 10, message="the old watcher to stop")
    coordination.cancel_activation(team.store, running["id"], "ended while no controller ran")
    later = suzumio_backend.Backends(configs=old.configs)
    try:
        config = old.configs.get(team.store)
        reconciler = suzumio_backend_reconcile.Reconciler(later)
        assert reconciler.collect_garbage(team.store, config, tmp_path / "unused.sock") == 1
        wait_until(lambda: not our_services(client, team), 30, message="the service to be removed")

        def secrets_gone():
            reconciler.collect_garbage(team.store, config, tmp_path / "unused.sock")
            return not client.secrets.list(filters={"label": f"suzumio.activation={running['id']}"})
        wait_until(secrets_gone, 30, interval=1, message="its secret to be removed")
        # The listener still answers: its gateway stays. Once the controller is gone, gc removes it.
        url = json.loads((team.store.activation_dir(running["id"]) / "input.json").read_text())["controllerUrl"]
        engine = config.backend.swarm.engine
        assert not later.swarm.collect_gateway(engine, url)
        assert client.services.list(filters={"label": "suzumio.gateway"})
        teams.remove((team, stack, model))
        stack.__exit__(None, None, None)
        model.close()
        assert later.swarm.collect_gateway(engine, url)
        assert not client.services.list(filters={"label": "suzumio.gateway"})
    finally:
        later.close()


class HostListener:
    """A TCP listener on the lab host's bridge address: something a task must not reach directly."""

    def __init__(self, host):
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]

    def close(self):
        self.sock.close()


PROBE = ("python3 -c \"import socket\n"
         "for target in {targets!r}:\n"
         "    try:\n"
         "        socket.create_connection(target, 3).close(); print('reached', *target)\n"
         "    except OSError as error: print('no', *target)\"")


def test_a_sealed_task_has_one_route_to_the_controller_and_goes_out_through_its_egress_proxy(tmp_path, lab):
    settings, client, teams = lab
    host = settings["SUZUMIO_LAB_HOST_IP"]
    upstream = Upstream()  # on the controller's loopback, which no node reaches but through the proxy
    listener = HostListener(host)
    try:
        agents = {"fetcher": {"model": "fetcher", "tools": TOOLS, "egress": [f"127.0.0.1:{upstream.port}"]}}
        team, stack, model = swarm_team(tmp_path, settings, agents,
                                        resolver=names_resolver({"upstream.test": ["127.0.0.1"]}))
        teams.append((team, stack, model))
        manager = host.rsplit(".", 1)[0] + ".10"  # scripts/swarm-lab: node i at .10+i
        targets = [(host, team.service.port), (host, listener.port), (host, team.service.runner_server.port),
                   (manager, 2377), ("1.1.1.1", 443)]
        commands = ["ls /sys/class/net | tr '\\n' ' '; echo",
                    "awk 'NR > 1 && $2 == \"00000000\"' /proc/net/route | wc -l",
                    PROBE.format(targets=targets),
                    curl(f"http://upstream.test:{upstream.port}/")]
        model.enqueue(tool_calls=[call("shell.exec", command="; ".join(commands))], model="fetcher")
        model.enqueue(content="Fetched.", model="fetcher")
        team.send("fetcher", "Fetch it.")
        # Created before its service and removed with it: caught while the task runs.
        [network] = wait_until(lambda: client.networks.list(filters={"label": f"suzumio.project={team.name}"}),
                               RUN_TIMEOUT, message="the task's network")
        [gateway] = client.services.list(filters={"label": "suzumio.gateway"})
        [activation] = team.wait_activations("fetcher", 1, RUN_TIMEOUT)
        assert activation["status"] == "completed", team.describe()
        assert network.attrs["Labels"]["suzumio.activation"] == activation["id"]
        output = team.tool_messages("fetcher")[0]
        lines = output.split("[stdout]\n", 1)[1].split("\n[stderr]", 1)[0].splitlines()
        data = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())
        allowed = [event["data"] for event in team.events("egress.allowed")]
        wait_until(lambda: not client.networks.list(filters={"label": f"suzumio.activation={activation['id']}"}),
                   30, message="the task's network to be removed with its service")
    finally:
        upstream.close()
        listener.close()
    assert lines[0].split() == ["eth0", "lo"] and lines[1] == "0", lines  # its overlay's interface, no default route
    assert lines[2:7] == [f"no {host} {port}" for host, port in targets], lines  # the controller itself included
    assert lines[7:] == [f"200 000 {len(BODY)}", BODY.decode().strip()], lines
    assert [(event["host"], event["port"]) for event in allowed] == [("upstream.test", upstream.port)]
    assert network.attrs["Internal"] and network.attrs["Driver"] == "overlay"
    spec = gateway.attrs["Spec"]
    assert "Global" in spec["Mode"] and spec["TaskTemplate"]["ContainerSpec"]["User"] == "65532:65532"
    assert spec["TaskTemplate"]["ContainerSpec"]["CapabilityDrop"] == ["ALL"]
    assert data["egress"] == f"tls://{host}:{team.service.runner_server.port}"
    assert data["controllerVia"] == "/run/suzumio-gateway/gateway.sock"


def test_a_task_on_the_host_network_reaches_the_egress_proxy_over_tls_too(tmp_path, lab):
    settings, _client, teams = lab
    upstream = Upstream()
    try:
        agents = {"fetcher": {"model": "fetcher", "tools": TOOLS, "egress": [f"127.0.0.1:{upstream.port}"]}}
        team, stack, model = swarm_team(tmp_path, settings, agents, network="host",
                                        resolver=names_resolver({"upstream.test": ["127.0.0.1"]}))
        teams.append((team, stack, model))
        model.enqueue(tool_calls=[call("shell.exec", command=curl(f"http://upstream.test:{upstream.port}/"))],
                      model="fetcher")
        model.enqueue(content="Fetched.", model="fetcher")
        team.send("fetcher", "Fetch it.")
        [activation] = team.wait_activations("fetcher", 1, RUN_TIMEOUT)
        assert activation["status"] == "completed", team.describe()
        output = team.tool_messages("fetcher")[0]
        assert f"200 000 {len(BODY)}" in output and BODY.decode().strip() in output, output
        data = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())
        assert data["egress"] == f"tls://{settings['SUZUMIO_LAB_HOST_IP']}:{team.service.runner_server.port}"
        assert "controllerVia" not in data
    finally:
        upstream.close()


def test_a_lost_worker_node_fails_its_activation_and_the_retry_finishes_on_the_other_node(tmp_path, lab):
    settings, _client, teams = lab
    agents = {"pm": {"model": "pm", "tools": TOOLS}, "worker": {"model": "worker", "tools": TOOLS}}
    scheduler = {"noEffectNudge": {"enabled": False},
                 "failedNudge": {"enabled": True, "initialDelayMs": 0, "priority": "P1"}}
    team, stack, model = swarm_team(tmp_path, settings, agents, scheduler)
    teams.append((team, stack, model))
    model.enqueue(tool_calls=[call("shell.exec", command="sleep 300", timeoutMs=300000)], model="worker")
    team.send("worker", "Write the result and tell pm.")
    running = placed(team, "worker")
    wait_until(lambda: len(model.requests) >= 1, RUN_TIMEOUT, message="the worker to run its shell command")
    lost = running["node"]
    model.enqueue(tool_calls=[call("shell.exec", command="echo survived > /artifacts/worker/result.txt"),
                              call("messages.send", recipient="pm", body="result.txt is written")], model="worker")
    model.enqueue(content="Done.", model="worker")
    model.enqueue(tool_calls=[call("completion.submit", report="The worker survived a lost node.")], model="pm")
    subprocess.run(["docker", "rm", "-f", lost], check=True, capture_output=True, timeout=60)

    failed = team.wait_for(lambda: team.store.activation(running["id"])["status"] == "failed", RUN_TIMEOUT,
                           "the activation on the lost node to fail")
    assert failed
    assert f"Swarm node {lost} was lost" in team.store.activation(running["id"])["error"]
    team.wait_for(lambda: team.store.project()["status"] == "submitted", RUN_TIMEOUT, "the team to submit")
    retried = [a for a in team.activations("worker") if a["id"] != running["id"]]
    assert retried and retried[0]["status"] == "completed" and retried[0]["node"] != lost, team.describe()
    assert (team.store.artifacts_dir("worker") / "result.txt").read_text().strip() == "survived"
