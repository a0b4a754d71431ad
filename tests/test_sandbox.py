"""The activation container as a boundary, seen from inside (least privilege): the real
controller, the real runner in the real runner image, and shell.exec commands scripted through the
FakeModel report the uid, capabilities, no-new-privileges, limits, file ownership and what the network
lets through; `config render` names each agent's network and every weakening setting."""
import contextlib
import os
import socket
import threading
from pathlib import Path

import pytest
import yaml
from e2e_fixtures import call, project_config, served_team

import suzumio
import suzumio_backend as backend

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
# The uid:gid activation containers run as by default, and so own what they write.
EXPECTED_IDS = (os.getuid(), os.getgid()) if os.getuid() else backend.UNPRIVILEGED_IDS

# cgroup v2 first, then v1
PIDS_MAX = "{ cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max; }"
MEMORY_MAX = "{ cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; }"

PROBE = """
import socket, sys
for host, port in [(sys.argv[1], int(sys.argv[2])), (sys.argv[3], int(sys.argv[4]))]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        print(host, "answered")
    except OSError as error:
        print(host, "failed", type(error).__name__)
"""


def agent(*tools, **settings):
    return {"model": "worker", "tools": ["messages.send", "shell.exec", *tools], **settings}


@contextlib.contextmanager
def sandbox_team(tmp_path, agents, docker=None, resolver=None, kind="docker-chat", runner_listen=None):
    """A served project on docker-chat with `agents` (each plays the FakeModel's `worker` queue in turn)
    and `backend.docker` set to `docker`; its containers are removed afterwards. Runners reach the
    controller over the mounted runner socket and the model through the controller, so an agent without
    network needs none. `resolver`: the egress proxy's name resolution (suzumio_egress.resolve);
    `runner_listen` (host, port): the runner routes and the egress proxy on TCP instead."""

    def make_config(service, model):
        controller_url = service.runner_url if runner_listen else service.base_url
        config = project_config(kind, controller_url, model.base_url, agents=agents,
                                presets={"worker": {"provider": "fake", "model": "worker"}}, model="worker")
        config["backend"]["docker"] = dict(docker or {})
        return config

    with served_team(tmp_path, kind, make_config, resolver=resolver, runner_listen=runner_listen) as team:
        yield team


def run_shell(team, agent_id, command):
    """One activation of `agent_id` that runs `command` through shell.exec; returns its stdout, after
    checking that the activation completed."""
    team.model.enqueue(tool_calls=[call("shell.exec", command=command)], model="worker")
    team.model.enqueue(content="Checked.", model="worker")
    before = len(team.activations(agent_id))
    team.send(agent_id, "Run the check.")
    activation = team.wait_activations(agent_id, before + 1)[-1]
    assert activation["status"] == "completed", team.describe()
    result = team.tool_messages("worker")[-1]
    assert "\n[exit code " not in result and "\n[killed by " not in result, result  # it exited 0
    return result.split("[stdout]\n", 1)[1].split("\n[stderr]", 1)[0]


def container_attrs(team, agent_id):
    name = team.activations(agent_id)[-1]["containerName"]
    return team.docker.containers.get(name).attrs


def status_fields(text):
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


# ---------------------------------------------------------------- user, capabilities, limits, files

def test_activation_runs_unprivileged_with_limits_and_owns_what_it_writes(tmp_path):
    command = ("id -u; id -g; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; "
               f"{PIDS_MAX}; {MEMORY_MAX}; "
               "echo w > /workspace/written.txt && echo a > /artifacts/worker/made.txt && touch ~/.home-writable && "
               "{ echo x 2>/dev/null > /artifacts/pm/forged.txt && echo forged || echo refused; }")
    with sandbox_team(tmp_path, {"pm": agent(), "worker": agent()}, docker={"network": "host"}) as team:
        lines = run_shell(team, "worker", command).splitlines()
        host = container_attrs(team, "worker")["HostConfig"]
    uid, gid = EXPECTED_IDS
    assert lines[:2] == [str(uid), str(gid)] and uid != 0
    fields = status_fields("\n".join(lines))
    assert {fields[name] for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}
    assert fields["NoNewPrivs"] == "1"
    assert "1024" in lines and str(4 * 1024 ** 3) in lines, "the cgroup limits seen from inside"
    assert lines[-1] == "refused", "another agent's artifacts stay read-only"
    assert (host["PidsLimit"], host["Memory"], host["CapDrop"]) == (1024, 4 * 1024 ** 3, ["ALL"])
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    store = team.store
    for path in (store.workspace("worker") / "written.txt", store.artifacts_dir("worker") / "made.txt"):
        assert (path.stat().st_uid, path.stat().st_gid) == EXPECTED_IDS, path
    assert not (store.artifacts_dir("pm") / "forged.txt").exists()


def test_settings_per_agent_and_backend_wide_reach_the_container(tmp_path):
    docker = {"network": "host", "pidsLimit": 300, "memory": "768m"}
    agents = {"pm": agent(), "worker": agent(docker={"user": "4242:4343", "pidsLimit": 77, "capAdd": ["CHOWN"]})}
    command = f"id -u; id -g; grep -E '^CapBnd:' /proc/self/status; {PIDS_MAX}; echo w > /workspace/mine.txt"
    with sandbox_team(tmp_path, agents, docker=docker) as team:
        worker = run_shell(team, "worker", command).splitlines()
        pm = run_shell(team, "pm", f"id -u; {PIDS_MAX}")
        worker_host, pm_host = container_attrs(team, "worker")["HostConfig"], container_attrs(team, "pm")["HostConfig"]
        written = team.store.workspace("worker") / "mine.txt"
    assert worker[:2] == ["4242", "4343"] and worker[2] == "CapBnd:\t0000000000000001" and worker[3] == "77"
    assert (written.stat().st_uid, written.stat().st_gid) == (4242, 4343)
    assert (worker_host["PidsLimit"], worker_host["Memory"], worker_host["CapAdd"]) == (77, 768 * 1024 ** 2, ["CHOWN"])
    assert pm.splitlines() == [str(EXPECTED_IDS[0]), "300"]
    assert (pm_host["PidsLimit"], pm_host["Memory"], pm_host["CapAdd"]) == (300, 768 * 1024 ** 2, None)


# ---------------------------------------------------------------- network: none unless the agent has network

class Listener:
    """A TCP listener on the host's 127.0.0.1 that accepts and closes: what an agent must not reach."""

    def __init__(self):
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True, name="probe-listener").start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            connection.close()

    def close(self):
        self.socket.close()


def test_without_network_no_outside_address_answers_while_the_activation_completes(tmp_path):
    # The runner reaches the controller over the mounted runner socket, and the model through it.
    listener = Listener()
    # web.fetch no longer brings a network; only the explicit escape hatch (`network: true`) does.
    agents = {"pm": agent(), "worker": agent(), "fetcher": agent("web.fetch"), "hatch": agent(network=True)}
    # 192.0.2.1 (TEST-NET-1) stands for any address off the container's own loopback.
    probe = f"python3 -c '{PROBE}' 127.0.0.1 {listener.port} 192.0.2.1 80"
    try:
        with sandbox_team(tmp_path, agents, docker={"network": "host"}) as team:
            isolated = run_shell(team, "worker", probe)
            fetching = run_shell(team, "fetcher", probe)
            networked = run_shell(team, "hatch", probe)
            modes = [container_attrs(team, name)["HostConfig"]["NetworkMode"]
                     for name in ("worker", "fetcher", "hatch")]
    finally:
        listener.close()
    assert modes == ["none", "none", "host"]
    assert isolated.splitlines() == ["127.0.0.1 failed ConnectionRefusedError", "192.0.2.1 failed OSError"]
    assert fetching.splitlines() == isolated.splitlines()
    assert networked.splitlines()[0] == "127.0.0.1 answered", "the probe reaches the listener given a network"


# ---------------------------------------------------------------- config render

def test_config_render_names_each_agents_network_and_every_weakening_setting(tmp_path):
    config = project_config("docker-chat", "http://127.0.0.1:1", "http://127.0.0.1:2/v1",
                            agents={"pm": agent(), "fetcher": agent("web.fetch"), "tool": agent(network=True),
                                    "lan": agent(egress=["10.0.0.7:8080"])},
                            presets={"worker": {"provider": "fake", "model": "worker"}}, model="worker")
    config["backend"]["docker"] = {"network": "host", "user": "root", "capAdd": ["SYS_ADMIN"], "pidsLimit": False}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out, err = _render(path)
    assert yaml.safe_load(out)["backend"]["docker"]["user"] == "root"
    proxied = "connections go through the controller's egress proxy"
    assert err.splitlines() == [
        f"Network: pm gets none ({proxied})",
        "Egress: pm may reach nothing (its tools do not allow web.fetch and agents.pm.egress is not set)",
        f"Network: fetcher gets none ({proxied})",
        "Egress: fetcher may reach public (its tools allow web.fetch)",
        "Network: tool gets host (agents.tool.network: true)",
        "Egress: tool may reach nothing (its tools do not allow web.fetch and agents.tool.egress is not set)",
        f"Network: lan gets none ({proxied})",
        "Egress: lan may reach 10.0.0.7:8080 (agents.lan.egress)",
        "Warning: agents.tool.network true gives tool a network of its own, outside the egress allowlist and its "
        "audit",
        "Warning: backend.docker.user root runs activation containers as root",
        "Warning: backend.docker.capAdd gives activation containers capabilities: SYS_ADMIN",
        "Warning: backend.docker.pidsLimit false: activation containers have no process limit",
        "Warning: backend.docker.network host gives tool the host's network, its 127.0.0.1 services included",
        "Warning: agents.lan.egress 10.0.0.7:8080 lets lan reach a non-public address",
    ]
    config["backend"]["kind"] = "local"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert _render(path)[1].splitlines()[-3:] == [
        "Warning: backend.kind local runs agent tools on this host without isolation",
        "Warning: backend.kind local sets the egress proxy variables, but they are advisory there: agent tools "
        "can connect directly, outside agents.<id>.egress and its audit",
        "Warning: agents.lan.egress 10.0.0.7:8080 lets lan reach a non-public address"]


def _render(path):
    import io
    out, err = io.StringIO(), io.StringIO()
    assert suzumio.main(["config", "render", str(path)], out=out, err=err) == 0
    return out.getvalue(), err.getvalue()
