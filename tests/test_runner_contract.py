"""The runner's copies of controller facts (it imports no controller module, docs/design/runner.md): the
built-in tool names, ending and support-backed tools, and preset expansion must equal the controller's.
Also: every runner file shares the `suzumio_runner` prefix and is what the backend mounts."""
from pathlib import Path

import pytest

import suzumio_backend
import suzumio_backend_swarm
import suzumio_config
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
