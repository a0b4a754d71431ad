"""Suzumio as an MCP server: the official MCP Python client connects to `/mcp` on the served
controller (with the API token) and to `suzumio mcp` over stdio, lists the tools, sends a message that
wakes an agent (the real local runner and the FakeModel) and reads the submitted report."""
import asyncio
import json
import sys
from pathlib import Path

import httpx2
import pytest
import yaml
from api_fixtures import init_project, serving
from conftest import wait_until
from e2e_fixtures import call, project_config
from fake_model import FakeModel
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

pytestmark = pytest.mark.timeout(180)

TOKEN = "mcp-test-token-5150"
REPO = Path(__file__).resolve().parent.parent
REPORT = "# Final report\n\nThe answer is 42.\n"
EXPECTED_TOOLS = {"list_projects", "project_status", "list_agents", "list_messages", "read_report", "send_message",
                  "start_project", "stop_project", "approve_project", "request_changes", "list_approvals",
                  "decide_approval", "resume_agent", "replay_project", "fork_project", "diff_projects",
                  "start_eval", "get_eval", "list_evals",
                  "repository", "repository_diff"}


def text_of(result):
    return "\n".join(block.text for block in result.content if getattr(block, "type", None) == "text")


async def drive(session, store, root):
    """List tools, send pm a message, wait for its report, read it as a tool and as a resource."""
    await session.initialize()
    listed = await session.list_tools()
    assert {tool.name for tool in listed.tools} == EXPECTED_TOOLS
    projects = json.loads(text_of(await session.call_tool("list_projects", {})))
    assert [p["id"] for p in projects["projects"]] == ["e2e"]

    sent = await session.call_tool("send_message", {"project": "e2e", "recipient": "pm", "body": "Report please.",
                                                    "priority": "P1"})
    assert not sent.is_error, text_of(sent)
    assert json.loads(text_of(sent))["priority"] == "P1"
    await asyncio.to_thread(wait_until, lambda: store.project()["submitted_report"], 60, 0.05, "the report")

    assert text_of(await session.call_tool("read_report", {"project": "e2e"})) == REPORT
    resources = await session.list_resources()
    uris = [str(resource.uri) for resource in resources.resources]
    assert "suzumio://projects/e2e/report" in uris
    read = await session.read_resource("suzumio://projects/e2e/report")
    assert read.contents[0].text == REPORT
    missing = await session.call_tool("project_status", {"project": "nope"})
    assert missing.is_error and "nope" in text_of(missing)
    await replay_fork_and_diff(session, store, root)


async def replay_fork_and_diff(session, store, root):
    """The flight recorder's tools: a replay asks no model and diffs identical; a fork keeps the run."""
    await asyncio.to_thread(wait_until, lambda: not store.running_activations(), 30, 0.05, "pm to finish")
    replayed = await session.call_tool("replay_project", {"project": "e2e", "as": "e2e-mcp", "tools": "recorded"})
    assert not replayed.is_error, text_of(replayed)
    assert json.loads(text_of(replayed))["origin"]["source"] == "e2e"

    def submitted():
        copy = root.open_project("e2e-mcp")
        return copy.project()["status"] == "submitted" and not copy.running_activations()

    await asyncio.to_thread(wait_until, submitted, 60, 0.05, "the replay submitted")
    same = json.loads(text_of(await session.call_tool("diff_projects", {"project": "e2e", "other": "e2e-mcp"})))
    assert (same["identical"], same["firstDifference"]) == (True, None)
    first = store.activation_ids_in_order()[0]
    forked = await session.call_tool("fork_project", {"project": "e2e", "as": "e2e-fork", "at": first})
    assert not forked.is_error, text_of(forked)
    assert json.loads(text_of(forked))["origin"] == dict(json.loads(text_of(forked))["origin"], kind="fork", at=first)
    bad = await session.call_tool("diff_projects", {"project": "e2e"})
    assert bad.is_error and text_of(bad) == "other is required"


def team(tmp_path, service, model):
    config = project_config("local", None, model.base_url,
                            agents={"pm": {"model": "pm", "tools": ["messages.send", "completion.submit"]}},
                            presets={"pm": {"provider": "fake", "model": "pm"}})
    store = init_project(service.root, tmp_path / "config", yaml.safe_dump(config, sort_keys=False))
    store.start()
    model.enqueue(tool_calls=[call("completion.submit", report=REPORT)], model="pm")
    model.enqueue(content="Submitted.", model="pm")
    return store


def test_official_client_drives_a_team_over_http_with_the_token(tmp_path):
    model = FakeModel()
    try:
        with serving(tmp_path / "root", api_token=TOKEN) as service:
            store = team(tmp_path, service, model)
            url = service.base_url + "/mcp"
            assert httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}).status_code == 401

            async def run():
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with httpx2.AsyncClient(headers=headers, timeout=30) as client, \
                        streamable_http_client(url, http_client=client) as streams, \
                        ClientSession(streams[0], streams[1]) as session:
                    await drive(session, store, service.root)

            asyncio.run(run())
            wait_until(lambda: not store.running_activations(), 30, message="pm to finish")
    finally:
        model.close()


def test_official_client_drives_a_team_over_stdio(tmp_path):
    model = FakeModel()
    try:
        with serving(tmp_path / "root") as service:
            store = team(tmp_path, service, model)
            parameters = StdioServerParameters(
                command=sys.executable, args=["-m", "suzumio", "mcp", "--root", str(service.root.path)],
                cwd=str(REPO))

            async def run():
                async with stdio_client(parameters) as streams, ClientSession(streams[0], streams[1]) as session:
                    await drive(session, store, service.root)

            asyncio.run(run())
            wait_until(lambda: not store.running_activations(), 30, message="pm to finish")
    finally:
        model.close()


def test_streamable_http_toolpack_reads_its_header_from_the_controller_environment(tmp_path):
    """An `mcp: {url, headersEnv}` toolpack session (suzumio_mcp over the SDK's HTTP client) against
    Suzumio's own /mcp: the token comes from the hub's environment; without it the one line says why."""
    import suzumio_mcp

    with serving(tmp_path / "root", api_token=TOKEN) as service:
        url = service.base_url + "/mcp"
        hub = suzumio_mcp.McpHub(environ={"SUZ_AUTH": f"Bearer {TOKEN}"}, start_timeout=20)
        try:
            mcp = {"url": url, "headersEnv": {"Authorization": "SUZ_AUTH"}}
            assert {tool["name"] for tool in hub.tools("suz", mcp)} == EXPECTED_TOOLS
            assert json.loads(hub.call("suz", mcp, "list_projects", {})["output"]) == {"projects": []}
            missing = hub.check("nokey", {"url": url, "headersEnv": {"Authorization": "UNSET_VARIABLE"}})
            assert missing == (f"MCP server nokey ({url}) failed: environment variable UNSET_VARIABLE is not set "
                               "(headersEnv.Authorization)")
            refused = hub.check("anon", {"url": url})
            assert refused.startswith(f"MCP server anon ({url}) failed: ") and "\n" not in refused
        finally:
            hub.close()
