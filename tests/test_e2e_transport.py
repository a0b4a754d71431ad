"""The controller's two doors, end to end: runners reach the controller over
its runner socket (docker-chat: the socket's folder mounted at /run/suzumio; local: the host path), or
over TCP with `--runner-listen` and backend.controllerUrl; and a process inside a docker-chat
activation, even with `network: host`, gets 401 (or nothing) from every user route and finds the user
API token nowhere it can look. Real controller, real runner, real engine with the runner image."""
import json
import os
import stat
import textwrap
from pathlib import Path

import pytest
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, kind_params, running_team
from fuzz_fixtures import app_routes, fill, is_runner_rule

import suzumio_runtime

pytestmark = pytest.mark.timeout(240)

KINDS = kind_params()
FILLERS = {"project": "e2e", "agent": "pm", "compaction": "cmp_x", "message": "msg_x", "activation": "act_x",
           "toolpack_id": "core", "entry_id": "messages.send", "approval": "apr_x",
           "other": "e2e", "eval_id": "eval_x", "effect": "eff_x", "path": "pm/x.md"}

# Runs inside the activation (python3 of the image, standard library only). It calls every user route
# it is given on the host's loopback, asks the runner socket for a user route, and dumps what a process
# there can read: its environment, every /proc/*/environ and cmdline, and every file under the mounts.
PROBE = textwrap.dedent('''\
    import http.client, json, os, socket, sys, urllib.error, urllib.request
    spec = json.load(open(sys.argv[1]))
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    results = []
    for method, path in spec["routes"]:
        data = b"{}" if method == "POST" else None
        request = urllib.request.Request("http://127.0.0.1:%d%s" % (spec["port"], path), data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with direct.open(request, timeout=5) as answer:
                results.append([method, path, answer.status, answer.read(300).decode("utf-8", "replace")])
        except urllib.error.HTTPError as error:
            results.append([method, path, error.code, error.read(300).decode("utf-8", "replace")])
        except OSError as error:
            results.append([method, path, None, str(error)])

    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect("/run/suzumio/runner.sock")

    over_socket = Unix("localhost", timeout=5)
    over_socket.request("GET", "/api/projects")
    socket_status = over_socket.getresponse().status

    chunks = [repr(dict(os.environ)).encode()]
    for pid in os.listdir("/proc"):
        for name in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (pid, name), "rb") as handle:
                    chunks.append(handle.read())
            except OSError:
                pass
    files = 0
    for top in spec["mounts"]:
        for folder, _dirs, names in os.walk(top):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if not os.path.isfile(path) or os.path.islink(path):
                        continue
                    with open(path, "rb") as handle:
                        chunks.append(handle.read(8 * 1024 * 1024))
                    files += 1
                except OSError:
                    pass
    out = spec["out"]
    with open(out + "/dump.bin", "wb") as handle:
        handle.write(b"\\n".join(chunks))
    with open(out + "/probe.json", "w") as handle:
        json.dump({"routes": results, "socketStatus": socket_status, "files": files, "uid": os.getuid()}, handle)
    print("probed %d routes, %d files" % (len(results), files))
''')
MOUNTS = ["/activation", "/opt/suzumio", "/workspace", "/artifacts", "/run/suzumio", "/toolpacks", "/mnt"]


def user_api_routes(service):
    """Every /api route of the user app, with its placeholders filled."""
    routes = [(method, fill(rule, FILLERS)) for method, rule in app_routes(service)
              if not is_runner_rule(rule) and rule.startswith("/api/")]
    assert len(routes) >= 23  # docs/http-api.md: 23 /api routes
    return routes


def test_docker_activation_with_host_network_gets_401_from_every_user_route_and_never_sees_the_token(tmp_path):
    # worker-1 is granted the host network, as a user might (`network: host` in the README before the
    # runner socket), so the user port on 127.0.0.1 is in reach: it must still answer 401.
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS},
              "worker-1": {"model": "worker", "tools": WORKER_TOOLS, "network": True}}
    with running_team(tmp_path, "docker-chat", agents=agents) as team:
        service = team.service
        token = service.api_token
        assert token and token == (service.root.path / "api-token").read_text().strip()
        assert stat.S_IMODE(os.stat(service.root.path / "api-token").st_mode) == 0o600
        routes = user_api_routes(service)
        workspace = team.store.workspace("worker-1")
        (workspace / "probe.py").write_text(PROBE, encoding="utf-8")
        (workspace / "probe-spec.json").write_text(json.dumps(
            {"port": service.port, "routes": routes, "mounts": MOUNTS, "out": team.artifacts("worker-1")}))
        probe_command = "python3 /workspace/probe.py /workspace/probe-spec.json"
        team.model.enqueue(tool_calls=[call("shell.exec", command=probe_command, timeoutMs=120000)], model="worker-1")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Probed.", notifyPm=False)],
                           model="worker-1")
        team.send("worker-1", "Probe the controller.")
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed", team.describe()

        # it ran in a container on the host's network, reaching the controller through the socket folder
        attrs = team.docker.containers.get(activation["containerName"]).attrs
        assert attrs["HostConfig"]["NetworkMode"] == "host"
        run_mounts = [(m["Source"], m["RW"]) for m in attrs["Mounts"] if m["Destination"] == "/run/suzumio"]
        assert run_mounts == [(str(suzumio_runtime.runner_socket_path(service.root.path).parent), False)]
        data = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())
        assert data["controllerUrl"] == "unix:///run/suzumio/runner.sock"

        artifacts = team.store.artifacts_dir("worker-1")
        [probed] = [c for c in team.store.list_tool_calls(100) if c["tool"] == "shell.exec"]
        assert (artifacts / "probe.json").exists(), probed.get("output") or probed.get("error")
        probe = json.loads((artifacts / "probe.json").read_text())
        assert probe["socketStatus"] == 404  # the runner socket serves no user route
        answered = {(method, path): (status, body) for method, path, status, body in probe["routes"]}
        assert len(answered) == len(routes)
        for (method, path), (status, body) in answered.items():
            assert status in (401, None), (method, path, status, body)
            if status == 401:
                assert json.loads(body) == {"error": "API token required"}, (method, path)
        assert any(status == 401 for status, _ in answered.values())  # the port was reachable: a real refusal
        # approve, stop and messages were all refused: the project runs on, with only the user's message
        assert team.store.project()["status"] == "running"
        assert [m["body"] for m in team.store.list_messages(100)] == ["Probe the controller."]

        dump = (artifacts / "dump.bin").read_bytes()
        agent_token = team.store.agent("worker-1", include_token=True)["token"]
        assert agent_token.encode() in dump  # the dump did read the environment and input.json
        assert probe["files"] >= 5
        assert token.encode() not in dump
        assert token not in team.runner_log(activation["id"])


@pytest.mark.parametrize("kind", KINDS)
def test_runners_reach_the_controller_over_its_socket(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body="Over the socket.")], model="pm")
        team.model.enqueue(content="Done.", model="pm")
        team.send("pm", "Say hello.")
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "completed", team.describe()
        assert "Over the socket." in [m["body"] for m in team.store.list_messages(100)]
        socket_path = suzumio_runtime.runner_socket_path(team.service.root.path)
        data = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())
        expected = "unix:///run/suzumio/runner.sock" if kind == "docker-chat" else f"unix://{socket_path}"
        assert data["controllerUrl"] == expected


def test_runner_listen_on_tcp_with_controller_url_runs_a_local_team(tmp_path):
    with running_team(tmp_path, "local", runner_listen=("127.0.0.1", 0)) as team:
        runner_url = team.service.runner_url
        assert runner_url.startswith("https://127.0.0.1:") and runner_url != team.service.base_url
        team.model.enqueue(tool_calls=[call("messages.send", recipient="user", body="Over TCP.")], model="pm")
        team.model.enqueue(content="Done.", model="pm")
        team.send("pm", "Say hello.")
        [activation] = team.wait_activations("pm", 1)
        assert activation["status"] == "completed", team.describe()
        assert "Over TCP." in [m["body"] for m in team.store.list_messages(100)]
        data = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())
        assert data["controllerUrl"] == runner_url
        ca_file = Path(team.service.root.path) / "tls" / "ca.pem"
        assert data["controllerCa"] == ca_file.read_text()
        assert data["egress"] == "tls://" + runner_url[len("https://"):]  # not the runner socket served beside
