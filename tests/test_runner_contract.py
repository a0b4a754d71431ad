"""The runner's copies of controller facts (it imports no controller module, docs/design/runner.md): the
built-in tool names, ending and support-backed tools, and preset expansion must equal the controller's.
Also: every runner file shares the `suzumio_runner` prefix and is what the backend mounts."""
import json
from pathlib import Path

import pytest

import suzumio_backend
import suzumio_backend_swarm
import suzumio_config
import suzumio_config_models
import suzumio_records
import suzumio_registry
import suzumio_runner_loop as loop
import suzumio_runner_models as models
import suzumio_runner_support
from suzumio_errors import ConfigError

REPO = Path(__file__).resolve().parent.parent

PROVIDERS = {"gw": {"type": "openai-compatible", "baseUrl": "http://127.0.0.1:9/v1"},
             "other": {"type": "openai-compatible", "baseUrl": "http://127.0.0.1:9/v1"}}
PRESETS = {
    "a": {"provider": "gw", "model": "a"},
    "b": {"provider": "other", "model": "b", "apiModel": "b-2"},
    "l1": {"modelList": ["a", "l2", "a"]},
    "l2": {"modelList": ["b", "l3"]},
    "l3": {"modelList": ["a"]},
    "loop": {"modelList": ["x"]},
    "x": {"modelList": ["loop"]},
    "lost": {"modelList": ["ghost"]},
    "nowhere": {"provider": "nope", "model": "m"},
}


def project_config(toolpacks=("core", "shell", "web")):
    return suzumio_config.ProjectConfig.from_data({
        "name": "contract", "task": "t", "agents": {"pm": {}}, "tools": {"toolpacks": list(toolpacks)},
        "backend": {"runner": {"models": {"providers": PROVIDERS, "presets": PRESETS}}}})


def test_the_runner_knows_the_built_in_tools_the_controller_registers():
    registry = project_config().registry
    controller = {pack.id: tuple(pack.tool_names) for pack in registry.toolpacks if pack.builtin}
    assert controller == loop.BUILTIN_TOOLS
    assert loop.ENDING_TOOLS == suzumio_records.ENDING_TOOLS
    assert loop.SUPPORT_TOOLS == suzumio_registry.SUPPORT_BACKED_BUILTIN_TOOLS


@pytest.mark.parametrize("selected", sorted(PRESETS) + ["ghost"])
def test_the_runner_expands_presets_as_the_controller_does(selected):
    config = project_config()
    runner_models = config.runner.as_json()["models"]  # what input.json carries to the runner
    try:
        expected = [(p.id, p.provider, p.model) for p in config.runner.expand(selected)]
    except ConfigError as error:
        with pytest.raises(models.ModelError) as caught:
            models.expand_preset(runner_models, selected)
        assert str(caught.value) == error.message
        return
    attempts = models.expand_preset(runner_models, selected)
    assert [(a.preset_id, a.provider_id, a.preset["model"]) for a in attempts] == expected


def test_the_runners_call_keys_are_ones_the_controller_accepts():
    keys = {loop.new_call_key() for _ in range(200)}
    assert len(keys) == 200  # one per model tool call, never reused
    assert all(suzumio_runner_support.CALL_KEY.fullmatch(key) for key in keys)


def test_every_runner_file_has_the_runner_prefix_and_is_mounted():
    mounted = {name for name in suzumio_backend.RUNNER_FILES if name.endswith(".py")}
    assert all(name.startswith("suzumio_runner") for name in mounted)
    # suzumio_runner_support.py keeps its design-card name: the controller's runner-facing routes. The
    # Swarm node gateway is runner code of its own service, shipped with the egress relay it uses.
    prefixed = {path.name for path in REPO.glob("suzumio_runner*.py")} - {"suzumio_runner_support.py",
                                                                         "suzumio_runner_gateway.py"}
    assert prefixed == mounted
    assert set(suzumio_backend_swarm.GATEWAY_FILES) <= mounted | {"suzumio_runner_gateway.py"}


# ---------------------------------------------------------------- copies of controller rules in the runner
# The runner imports no controller module, so it keeps copies of a few rules. Each is held to the
# controller's on a table of inputs here.

ALLOWLISTS = [[], ["*"], ["file.*"], ["file.read"], ["file"], ["fil*"], ["file.*.x"], ["gh.*", "shell.exec"],
              ["org.*"], ["org.gh.*"], ["org.gh.search"], ["org.ghx.*"], ["o*"], [".*"]]
TOOL_NAMES = ["file.read", "file.write", "file", "files.read", "shell.exec", "gh.search", "org.gh.search",
              "org.gh.sub.list", "org.ghx.search", "org.other", "x"]


@pytest.mark.parametrize("patterns", ALLOWLISTS, ids=lambda p: ",".join(p) or "none")
def test_the_runners_allowlist_match_is_the_controllers(patterns):
    import suzumio_runner_mcp as runner_mcp

    for name in TOOL_NAMES:
        assert runner_mcp.is_allowed(name, patterns) == suzumio_registry.is_allowed(name, patterns), name


@pytest.mark.parametrize("toolpack_id", ["gh", "org.gh", "org"])
@pytest.mark.parametrize("patterns", ALLOWLISTS, ids=lambda p: ",".join(p) or "none")
def test_a_sandbox_mcp_toolpack_gets_every_allowlist_entry_that_reaches_its_tools(toolpack_id, patterns):
    # The backend hands the runner only the entries that can match `<id>.…`; the runner then allows
    # exactly the listed tools the controller's /runner/tool-calls/start accepts.
    import suzumio_runner_mcp as runner_mcp

    handed = [p for p in patterns if suzumio_registry.reaches_toolpack(p, toolpack_id)]
    for tool in ("search", "sub.list", "x"):
        name = f"{toolpack_id}.{tool}"
        assert runner_mcp.is_allowed(name, handed) == suzumio_registry.is_allowed(name, patterns), name


@pytest.mark.parametrize("name", ["file.read", "shell.exec", "gh.search-issues", "a b/c", "ünï.x", "x..y", "_"])
def test_the_runner_names_tools_for_models_as_the_controller_does(name):
    assert models.safe_tool_name(name) == suzumio_registry.model_tool_name(name)


CONTENT_BLOCKS = [
    {"type": "text", "text": "hello"},
    {"type": "text"},
    {"type": "image", "mimeType": "image/png", "data": "aGVsbG8="},
    {"type": "image", "data": "not base64!"},
    {"type": "audio", "mimeType": "audio/wav", "data": "aGk"},
    {"type": "resource_link", "uri": "file:///a.txt", "name": "a"},
    {"type": "resource_link", "uri": "file:///b.txt"},
    {"type": "resource", "resource": {"uri": "file:///c.txt", "text": "contents"}},
    {"type": "resource", "resource": {"uri": "file:///d.bin", "mimeType": "application/zip"}},
    {"type": "resource"},
    {"type": "hologram"},
]


@pytest.mark.parametrize("block", CONTENT_BLOCKS, ids=lambda b: b.get("type") + ("+" if len(b) > 1 else ""))
def test_the_runner_renders_mcp_content_as_the_controller_does(block):
    import suzumio_mcp
    import suzumio_runner_mcp as runner_mcp

    assert runner_mcp.content_text(block) == suzumio_mcp.content_text(block)


TOOL_RESULTS = [
    {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"content": [], "structuredContent": {"n": 1, "é": "ü"}},
    {"content": [{"type": "text", "text": "shown"}], "structuredContent": {"n": 1}},
    {"content": [{"type": "text", "text": "boom"}], "isError": True},
    {"isError": False},
    {},
    {"content": [{"type": "image", "data": "aGk="}, "not a block", None]},
]


@pytest.mark.parametrize("result", TOOL_RESULTS)
def test_the_runner_shapes_mcp_tool_results_as_the_controller_does(result):
    import suzumio_mcp
    import suzumio_runner_mcp as runner_mcp

    assert runner_mcp.tool_result(result) == suzumio_mcp.tool_result(result)


@pytest.mark.parametrize("tool", [
    {"name": "search", "description": "Find things", "inputSchema": {"type": "object", "required": ["q"]}},
    {"name": "search", "title": "Search"},
    {"name": "search", "description": "", "inputSchema": "not a schema"},
])
def test_the_runner_lists_mcp_tools_as_the_controller_does(tool):
    import suzumio_mcp
    import suzumio_runner_mcp as runner_mcp

    assert runner_mcp.tool_definition(tool) == suzumio_mcp.tool_definition(tool)


def test_the_runners_mcp_timeouts_are_the_controllers():
    import suzumio_mcp
    import suzumio_runner_mcp as runner_mcp

    assert (runner_mcp.START_TIMEOUT_SECONDS, runner_mcp.CALL_TIMEOUT_SECONDS) == (
        suzumio_mcp.START_TIMEOUT_SECONDS, suzumio_mcp.CALL_TIMEOUT_SECONDS)


@pytest.mark.parametrize("provider_type", ["openai", "google"])
def test_the_runner_refuses_the_provider_types_the_controller_refuses_in_its_words(tmp_path, provider_type):
    providers = {"g": {"type": provider_type, "baseURL": "http://127.0.0.1:9/v1"}}
    project = tmp_path / "p.yaml"
    project.write_text(json.dumps({
        "name": "contract", "task": "t", "agents": {"pm": {}},
        "backend": {"runner": {"model": "p", "models": {"providers": providers,
                                                        "presets": {"p": {"provider": "g", "model": "m"}}}}}}))
    with pytest.raises(ConfigError) as refused:
        suzumio_config.load_project(project, env={})
    assert provider_type in models.LATER_PROVIDER_TYPES
    attempt = models.Attempt("p", {"provider": "g", "model": "m"}, "g", providers["g"])
    with pytest.raises(models.ModelError) as caught:
        models.create_provider(attempt, {}, transport=None)
    assert refused.value.message == f"backend.runner.models.providers.g.type: {caught.value}"


def test_the_runner_handles_every_provider_type_the_schema_accepts():
    import suzumio_config_schema

    accepted = set(next(node for key, node, _ in suzumio_config_schema._PROVIDER.fields if key == "type").values)
    assert accepted == set(models.PROXIED_PROVIDER_TYPES) | {"scripted"} | set(models.LATER_PROVIDER_TYPES)
    assert set(models.LATER_PROVIDER_TYPES) == set(suzumio_config_models.UNSUPPORTED_PROVIDER_TYPES)


def test_the_runner_moves_a_working_copy_as_the_controller_serves_it():
    """A swarm runner's /workspace (suzumio_runner_files) against the controller's files routes
    (suzumio_files): the task path, the git folder neither side moves, the routes, and the tools that
    work on the working copy."""
    import suzumio_files
    import suzumio_runner_files as files

    assert files.TASK_WORKSPACE == suzumio_files.WORKSPACE
    assert files.TASK_ARTIFACTS == suzumio_files.ARTIFACTS
    assert files.GIT_FOLDER == suzumio_files.GIT_FOLDER
    repo_tools = {name for pack in project_config(("core", "repo")).registry.toolpacks if pack.id == "repo"
                  for name in pack.tool_names}
    assert files.SYNC_TOOL in repo_tools
    assert all(name.startswith(files.REPO_PREFIX) for name in repo_tools)
    source = (REPO / "suzumio_runner_support.py").read_text()
    for route in (files.CHANGESET_ROUTE, files.WORKSPACE_CHANGESET_ROUTE):
        assert f'@app.post("{route}")' in source
