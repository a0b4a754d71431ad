"""MCP toolpacks end to end: the reference servers from the npm registry
(@modelcontextprotocol/server-everything and server-filesystem, installed into tests/.mcp-servers by
tests/mcp_fixtures.py), the real controller with its McpHub, the real runner on local and docker-chat and the
FakeModel; plus `config render --check`, `start` and `suzumio toolpacks` on a server that cannot start."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from api_fixtures import init_project
from conftest import wait_until
from e2e_fixtures import call, kind_params, running_team
from mcp_fixtures import SERVERS_DIR, install_mcp_servers

import suzumio
import suzumio_config
import suzumio_mcp
import suzumio_store
from suzumio_errors import Forbidden

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def mcp_servers():
    return install_mcp_servers()


@pytest.fixture
def hub():
    hub = suzumio_mcp.McpHub(call_timeout=60)
    try:
        yield hub
    finally:
        hub.close()


def mcp_toolpacks(servers, data_dir, marker):
    """`ev` (server-everything, tagged with `marker` in its environment) and `files` (on data_dir)."""
    return ["core",
            {"id": "ev", "mcp": {"command": [servers["everything"]], "env": {"SUZUMIO_TEST_MARKER": marker}}},
            {"id": "files", "mcp": {"command": [servers["filesystem"], str(data_dir)]}}]


def server_pids(marker):
    """Processes whose environment holds SUZUMIO_TEST_MARKER=<marker> (the ev server, never another test's)."""
    wanted = f"SUZUMIO_TEST_MARKER={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if wanted in handle.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def team_for(tmp_path, kind, hub, servers, tools):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("the answer is 42\n", encoding="utf-8")
    marker = f"{tmp_path.name}-{os.getpid()}"
    agents = {"pm": {"model": "pm", "tools": tools}}
    presets = {"pm": {"provider": "fake", "model": "pm"}}
    team = running_team(tmp_path, kind, mcp=hub, agents=agents, presets=presets,
                        toolpacks=mcp_toolpacks(servers, data, marker))
    return team, data, marker


@pytest.mark.parametrize("kind", kind_params())
def test_agent_calls_mcp_server_tools_and_the_results_reach_the_model(tmp_path, kind, hub, mcp_servers):
    context, data, _ = team_for(tmp_path, kind, hub, mcp_servers, ["messages.send", "ev.*", "files.read_text_file"])
    with context as team:
        team.model.enqueue(tool_calls=[call("ev.echo", message="hello from suzumio")], model="pm")
        team.model.enqueue(tool_calls=[call("files.read_text_file", path=str(data / "notes.txt"))], model="pm")
        team.model.enqueue(tool_calls=[call("ev.get-sum", a=2, b=40)], model="pm")
        team.model.enqueue(tool_calls=[call("ev.get-tiny-image")], model="pm")
        team.model.enqueue(content="Done.", model="pm")
        team.send("pm", "Use the MCP tools.")
        [activation] = team.wait_activations("pm", 1)

        assert activation["status"] == "completed", team.describe()
        echoed, read, summed, image = team.tool_messages("pm")
        assert echoed == "Echo: hello from suzumio"
        assert read == "the answer is 42\n"
        assert "42" in summed
        assert "[image image/png" in image
        rows = sorted((row["tool"], row["status"]) for row in team.store.list_tool_calls(10))
        assert rows == [("ev.echo", "completed"), ("ev.get-sum", "completed"), ("ev.get-tiny-image", "completed"),
                        ("files.read_text_file", "completed")]
        # The model saw only the allowed tools, with the server's descriptions and schemas.
        offered = {tool["function"]["name"]: tool["function"] for tool in team.model_requests("pm")[0].body["tools"]}
        assert "files_read_text_file" in offered and "files_write_file" not in offered
        assert offered["ev_echo"]["parameters"]["properties"]["message"]["type"] == "string"


def test_allowlist_refuses_mcp_tools_the_agent_was_not_given(tmp_path, hub, mcp_servers):
    context, _, _ = team_for(tmp_path, "local", hub, mcp_servers, ["messages.send", "ev.echo"])
    with context as team:
        team.model.enqueue(tool_calls=[call("ev.get-sum", a=1, b=2)], model="pm")
        team.model.enqueue(content="Done.", model="pm")
        team.send("pm", "Add.")
        [activation] = team.wait_activations("pm", 1)
        assert team.tool_messages("pm") == ['There is no tool named "ev_get-sum". Your tools are: messages_send, '
                                            'ev_echo. Call one of them by its exact name.']
        agent = team.store.agent("pm")
        with pytest.raises(Forbidden, match=r"Tool not allowed for pm: ev\.get-sum"):
            team.service.toolpacks.support(team.store, agent, activation["id"], "ev", "ev.get-sum", {"a": 1, "b": 2})
        assert team.service.toolpacks.support(team.store, agent, activation["id"], "ev", "ev.echo",
                                              {"message": "x"}) == {"output": "Echo: x"}


def test_server_killed_mid_call_gives_a_tool_error_and_the_next_call_works(tmp_path, hub, mcp_servers):
    context, _, marker = team_for(tmp_path, "local", hub, mcp_servers, ["messages.send", "ev.*"])
    with context as team:
        team.model.enqueue(tool_calls=[call("ev.trigger-long-running-operation", duration=60, steps=6)], model="pm")
        team.model.enqueue(tool_calls=[call("ev.echo", message="again")], model="pm")
        team.model.enqueue(content="Done.", model="pm")
        team.send("pm", "Run long.")
        team.wait_for(lambda: [r for r in team.store.list_tool_calls(10) if r["status"] == "running"],
                      message="the long call to be running")
        pids = team.wait_for(lambda: server_pids(marker), message="the ev server process")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        team.wait_activations("pm", 1)

        failed, echoed = team.tool_messages("pm")
        assert "MCP server ev failed during tools/call trigger-long-running-operation" in failed
        assert "\n" not in failed
        assert echoed == "Echo: again"
        statuses = {row["tool"]: row["status"] for row in team.store.list_tool_calls(10)}
        assert statuses == {"ev.trigger-long-running-operation": "failed", "ev.echo": "completed"}


def write_project(tmp_path, toolpacks, tools):
    config = {"name": "broken", "task": "t", "agents": {"pm": {"tools": tools}},
              "tools": {"toolpacks": toolpacks},
              "backend": {"kind": "local", "runner": {"model": "m", "models": {
                  "providers": {"p": {"type": "scripted", "script": {"agents": {"pm": [{"steps": [{"say": "ok"}]}]}}}},
                  "presets": {"m": {"provider": "p", "model": "x"}}}}}}
    path = tmp_path / "project.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run_cli(*argv, root=None):
    command = [sys.executable, "-m", "suzumio", *argv] + (["--root", str(root)] if root else [])
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=HERE.parent)


def test_a_server_that_cannot_start_gives_one_line_at_render_check_start_and_listing(tmp_path, mcp_servers):
    broken = {"id": "gone", "mcp": {"command": ["node", "-e", "console.error('no such database'); process.exit(2)"]}}
    path = write_project(tmp_path, ["core", broken], ["messages.send", "gone.*"])

    plain = run_cli("config", "render", str(path))
    assert plain.returncode == 0, plain.stderr
    assert "gone.*" in plain.stdout

    checked = run_cli("config", "render", str(path), "--check")
    assert checked.returncode == 1
    assert checked.stderr.strip().splitlines() == [
        "Error: tools.toolpacks: MCP server gone (node -e console.error('no such database'); process.exit(2)) "
        "failed: Connection closed (stderr: no such database)"]

    root = tmp_path / "root"
    assert run_cli("init", str(path), root=root).returncode == 0
    started = run_cli("start", "broken", root=root)
    assert started.returncode == 1
    [line] = started.stderr.strip().splitlines()
    assert line.startswith("Error: MCP server gone (") and "no such database" in line

    listed = run_cli("toolpacks", "broken", root=root)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "core  builtin  ok"
    assert any(row.startswith("gone  mcp  down: MCP server gone (") for row in lines)


def test_render_check_validates_allowlists_against_the_listed_tools(tmp_path, mcp_servers):
    packs = ["core", {"id": "ev", "mcp": {"command": [mcp_servers["everything"]]}}]
    good = write_project(tmp_path, packs, ["ev.echo", "ev.*"])
    with open(os.devnull, "w") as out:
        assert suzumio.main(["config", "render", str(good), "--check"], out=out) == 0
    bad = write_project(tmp_path, packs, ["ev.no-such-tool"])
    checked = run_cli("config", "render", str(bad), "--check")
    assert checked.returncode == 1
    assert checked.stderr.startswith('Error: agents.pm.tools.0: unknown tool "ev.no-such-tool" (registered: ')
    assert run_cli("config", "render", str(bad)).returncode == 0  # plain render: <id>.<name> is syntactic

    root = tmp_path / "root"
    assert run_cli("init", str(good), root=root).returncode == 0
    listed = run_cli("toolpacks", "broken", root=root)
    assert listed.returncode == 0, listed.stderr
    assert "ev  mcp  up" in listed.stdout and "  ev.echo" in listed.stdout


FILESYSTEM_JS = Path("node_modules") / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"


@pytest.mark.parametrize("kind", kind_params())
def test_sandbox_side_server_runs_next_to_the_agents_workspace(tmp_path, kind, mcp_servers):
    """`where: runner`: the runner starts server-filesystem on its own workspace (in the container on
    docker-chat, from the read-only mounted install) and the model reads a file written there."""
    if kind == "docker-chat":
        script, mounts = f"/mnt/mcp-servers/{FILESYSTEM_JS.as_posix()}", [
            {"source": str(SERVERS_DIR), "target": "/mnt/mcp-servers", "readonly": True}]
    else:
        script, mounts = str(SERVERS_DIR / FILESYSTEM_JS), []
    toolpacks = ["core", {"id": "ws", "mcp": {"where": "runner", "command": ["node", script, "{workspace}"]}}]
    agents = {"pm": {"model": "pm", "tools": ["messages.send", "file.write", "ws.read_text_file",
                                              "ws.list_directory"], "mounts": mounts}}
    with running_team(tmp_path, kind, agents=agents, presets={"pm": {"provider": "fake", "model": "pm"}},
                      toolpacks=toolpacks) as team:
        workspace = team.workspace_path("pm")
        team.model.enqueue(tool_calls=[call("file.write", path=f"{workspace}/plan.md", content="step one\n")],
                           model="pm")
        team.model.enqueue(tool_calls=[call("ws.read_text_file", path=f"{workspace}/plan.md")], model="pm")
        team.model.enqueue(tool_calls=[call("ws.write_file", path=f"{workspace}/x", content="no")], model="pm")
        team.model.enqueue(content="Done.", model="pm")
        team.send("pm", "Read your plan.")
        [activation] = team.wait_activations("pm", 1)

        assert activation["status"] == "completed", team.describe()
        _, read, refused = team.tool_messages("pm")
        assert read == "step one\n", team.describe()
        assert refused == ('There is no tool named "ws_write_file". Your tools are: messages_send, file_write, '
                           'ws_read_text_file, ws_list_directory. Call one of them by its exact name.')
        offered = {tool["function"]["name"] for tool in team.model_requests("pm")[0].body["tools"]}
        assert {"ws_read_text_file", "ws_list_directory"} <= offered and "ws_write_file" not in offered
        statuses = [(row["tool"], row["status"]) for row in reversed(team.store.list_tool_calls(10))]
        # the refused call is recorded as failed, under the name the model used (POST /runner/tool-calls/refused)
        assert statuses == [("file.write", "completed"), ("ws.read_text_file", "completed"),
                            ("ws_write_file", "failed")]


def test_a_server_down_at_first_resolution_is_retried_and_its_tools_appear(tmp_path, mcp_servers):
    script = tmp_path / "late-server.sh"
    path = write_project(tmp_path, ["core", {"id": "late", "mcp": {"command": ["sh", str(script)]}}],
                         ["messages.send", "late.*"])
    root = suzumio_store.Root(tmp_path / "root")
    hub = suzumio_mcp.McpHub(retry_seconds=0.2, start_timeout=20)
    try:
        store = init_project(root, tmp_path / "config", path.read_text())
        cache = suzumio_config.ConfigCache(mcp_tools=hub.listing)
        down = cache.get(store).registry.toolpack("late")
        assert not down.mcp_listed and down.tools == ()
        assert down.mcp_error.startswith(f"MCP server late (sh {script}) failed: ")
        script.write_text(f'exec "{mcp_servers["everything"]}"\n')
        wait_until(lambda: cache.get(store).registry.toolpack("late").mcp_listed, 30, message="late tools")
        assert "late.echo" in cache.get(store).registry.tool_names
    finally:
        hub.close()
        root.close()


def test_call_results_become_tool_results_with_references_for_binary_content():
    result = suzumio_mcp.tool_result({"content": [
        {"type": "text", "text": "two parts"},
        {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
        {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt"},
        {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "bee"}},
        {"type": "resource", "resource": {"uri": "file:///c.bin", "blob": "AA==", "mimeType": "application/zip"}},
    ], "structuredContent": {"n": 2}, "isError": True})
    assert result == {"output": "two parts\n[image image/png, 5 bytes]\n[resource a.txt: file:///a.txt]\n"
                                "[resource file:///b.txt]\nbee\n[resource file:///c.bin application/zip]",
                      "structuredContent": {"n": 2}, "isError": True}
    assert suzumio_mcp.tool_result({"content": [], "structuredContent": {"ok": True}}) == {
        "output": '{"ok": true}', "structuredContent": {"ok": True}}
