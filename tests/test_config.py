"""Tests of suzumio_config: the project file of docs/configuration.md, the load-time tool checks of
docs/design/tools.md, the YAML dialect, the broken-config corpus and the examples."""
import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import suzumio_config as config
import suzumio_config_schema as schema
import suzumio_registry as registry
import suzumio_yaml
from suzumio_config import ProjectConfig, load_project
from suzumio_config_models import PresetConfig, expand_model_list
from suzumio_errors import ConfigError, NotFound
from suzumio_yaml import parse_yaml

REPO = Path(__file__).resolve().parent.parent
BROKEN = REPO / "tests" / "configs" / "broken"

BASE = {
    "name": "t",
    "task": "T",
    "backend": {"runner": {"model": "main", "models": {
        "providers": {"g": {"type": "openai-compatible", "apiKeyEnv": "K"}},
        "presets": {"main": {"provider": "g", "model": "m"}}}}},
    "agents": {"pm": {"tools": ["messages.send"]}},
}
CORE_AND_WEB = ("messages.send, coordination.wait_for_signal, completion.submit, file.read, file.write, "
                "file.patch, web.fetch")


def base(**changes):
    """A deep copy of the base project with top-level keys replaced (None deletes a key)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def write(path, content):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not isinstance(content, str):
        content = suzumio_yaml.dump_yaml(content)
    path.write_text(content)
    return path


def load(tmp_path, content, env=None, name="p.yaml", **kwargs):
    return load_project(write(tmp_path / name, content), env={} if env is None else env, **kwargs)


def rendered(tmp_path, content, env=None, **kwargs):
    return parse_yaml(load(tmp_path, content, env, **kwargs).render())


def error(tmp_path, content, env=None, name="p.yaml", **kwargs):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, content, env, name, **kwargs)
    return caught.value.message


def models(**presets):
    """The base `backend` block with extra presets."""
    data = copy.deepcopy(BASE["backend"])
    data["runner"]["models"]["presets"].update(presets)
    return data


def make_toolpack(root, manifest, runner=True, controller=True):
    """A local toolpack directory with its manifest and (empty) modules."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "suzumio.toolpack.json").write_text(json.dumps(manifest))
    if runner:
        (root / "runner.mjs").write_text("export function createRunnerToolpack() { return {tools: {}}; }\n")
    if controller:
        (root / "controller.mjs").write_text("export function createControllerToolpack() { return {tools: {}}; }\n")
    return root


def tool(name, description="A tool.", schema=None):
    return {"name": name, "description": description, "inputSchema": schema or {"type": "object"}}


REVIEW_MANIFEST = {
    "id": "review-tools",
    "tools": [tool("review.summarize", "Record a review summary.",
                   {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"]})],
    "webui": [{"id": "review.stats", "title": "Review statistics", "kind": "panel"}],
}
SCHEDULER_MANIFEST = {
    "id": "scheduler", "runner": "runner.mjs", "controller": "controller.mjs",
    "tools": [tool(name) for name in ("schedule.once", "schedule.recurring", "schedule.list", "schedule.cancel")],
    "webui": [{"id": "schedule.jobs", "title": "Scheduled messages", "kind": "panel", "submitLabel": "Refresh jobs"},
              {"id": "schedule.once", "title": "Schedule one-time message", "kind": "action"},
              {"id": "schedule.recurring", "title": "Schedule recurring message", "kind": "action"},
              {"id": "schedule.cancel", "title": "Cancel scheduled message", "kind": "action"}],
}
PLAN_MANIFEST = {
    "id": "plan", "runner": "runner.mjs", "controller": "controller.mjs",
    "tools": [tool(name) for name in ("plan.create", "plan.status", "plan.update", "plan.set_item_status",
                                      "plan.close")],
    "webui": [{"id": "plan.board", "title": "Active plan", "kind": "panel"}],
}


@pytest.fixture
def packaged(tmp_path):
    """A stand-in for the shipped `toolpacks/` directory, with manifests shaped as docs/design/toolpacks.md."""
    root = tmp_path / "shipped-toolpacks"
    make_toolpack(root / "scheduler", SCHEDULER_MANIFEST)
    make_toolpack(root / "plan", PLAN_MANIFEST)
    return str(root)


# ---------------------------------------------------------------------------------------------------
# docs/configuration.md, scenarios 1–9: defaults and the model registry

def test_base_config_materializes_every_default(tmp_path):
    config_ = load(tmp_path, BASE)
    out = parse_yaml(config_.render())
    assert out["channels"] == ["#project", "#blocked"]
    assert out["tools"]["toolpacks"] == ["core", "web"]
    assert out["backend"]["image"] == "suzumio-runner:dev"
    assert out["backend"]["controllerUrl"] == "http://host.docker.internal:39400"
    assert out["backend"]["runner"]["mode"] == "ai"
    assert out["observability"]["http"]["port"] == 39400
    assert out["platforms"] == []
    assert out["scheduler"]["noEffectNudge"]["priority"] == "P3"
    assert out["scheduler"]["allQuietNudge"]["priority"] == "P3"
    assert out["scheduler"]["failedNudge"]["priority"] == "P2"
    assert "kind" not in out["scheduler"] and "maxSignalsPerActivation" not in out["scheduler"]
    assert out["agents"]["pm"]["prompt"] == ""
    assert out["backend"]["runner"]["models"]["presets"]["main"]["contextLimit"] == 260000
    assert out["backend"]["activationTimeoutMs"] == 3600000
    assert config_.warnings == []
    assert out["scheduler"]["failedNudge"]["message"] == schema.FAILED_NUDGE_MESSAGE
    assert out["scheduler"]["allQuietNudge"]["message"] == schema.ALL_QUIET_MESSAGE


def test_nudges_are_bounded_by_default_and_an_unbounded_one_is_a_render_warning(tmp_path):
    out = rendered(tmp_path, BASE)
    assert out["scheduler"]["noEffectNudge"]["maxConsecutive"] == 3
    assert out["scheduler"]["failedNudge"]["maxConsecutive"] == 3
    data = base(scheduler={"noEffectNudge": {"maxConsecutive": 0},
                           "failedNudge": {"enabled": True, "maxConsecutive": 0, "maxDelayMs": 60000}})
    text, warnings = config.render_file(write(tmp_path / "unbounded.yaml", data), env={})
    assert parse_yaml(text)["scheduler"]["noEffectNudge"]["maxConsecutive"] == 0
    assert warnings == [
        "Warning: scheduler.noEffectNudge.maxConsecutive 0: the nudge is unbounded, an agent that does nothing "
        "is woken again every maxDelayMs (300 s) until a person stops it",
        "Warning: scheduler.failedNudge.maxConsecutive 0: the nudge is unbounded, an agent that keeps failing "
        "is woken again every maxDelayMs (60 s) until a person stops it"]
    # a nudge that is off wakes nobody
    assert load(tmp_path, base(scheduler={"failedNudge": {"maxConsecutive": 0}})).warnings == []


def test_rendered_keys_follow_schema_declaration_order(tmp_path):
    out = rendered(tmp_path, BASE)
    assert list(out) == ["name", "task", "scheduler", "communication", "backend", "agents", "channels", "tools",
                         "platforms", "observability", "recording"]
    assert list(out["backend"]) == ["kind", "image", "controllerUrl", "activationTimeoutMs", "artifactQuota", "docker",
                                    "runner"]
    assert list(out["agents"]["pm"]) == ["prompt", "tools", "mounts", "env"]


def test_missing_name_and_task_are_reported_together(tmp_path):
    message = error(tmp_path, base(name=None, task=None))
    assert message == "Invalid project config:\n  - name: Required\n  - task: Required"


def test_empty_agents_fail(tmp_path):
    assert error(tmp_path, base(agents={})) == "Project config needs at least one agent"


def test_missing_backend_reports_the_model_registry(tmp_path):
    assert error(tmp_path, base(backend=None)) == "backend.runner.models is required"


def test_empty_providers_fail(tmp_path):
    data = base()
    data["backend"]["runner"]["models"]["providers"] = {}
    assert error(tmp_path, data) == "backend.runner.models.providers needs at least one provider"


def test_empty_presets_fail(tmp_path):
    data = base()
    data["backend"]["runner"]["models"]["presets"] = {}
    assert error(tmp_path, data) == "backend.runner.models.presets needs at least one preset"


def test_agent_without_any_model_fails_until_it_selects_one(tmp_path):
    data = base()
    del data["backend"]["runner"]["model"]
    assert error(tmp_path, data) == "Agent pm needs an explicit model, or set backend.runner.model"
    data["agents"]["pm"]["model"] = "main"
    assert load(tmp_path, data).agent("pm").selected_model == "main"


def test_agent_selecting_an_unknown_preset_fails(tmp_path):
    data = base()
    data["agents"]["pm"]["model"] = "nope"
    assert error(tmp_path, data) == "Agent pm selected unknown model preset: nope"


@pytest.mark.parametrize("preset, message", [
    ({"model-list": ["main"], "provider": "g"}, "modelList presets cannot also set provider/model/apiModel"),
    ({"model-list": []}, "model-list cannot be empty"),
    ({"provider": "g"}, "model presets need provider and model, or model-list"),
])
def test_preset_object_rules(tmp_path, preset, message):
    assert error(tmp_path, base(backend=models(bad=preset))) == (
        f"Invalid project config:\n  - backend.runner.models.presets.bad: {message}")


def test_model_list_is_rendered_with_a_dash_and_stored_as_model_list(tmp_path):
    config_ = load(tmp_path, base(backend=models(chain={"modelList": ["main"]})))
    preset = parse_yaml(config_.render())["backend"]["runner"]["models"]["presets"]["chain"]
    assert preset["model-list"] == ["main"] and "modelList" not in preset
    assert config_.data["backend"]["runner"]["models"]["presets"]["chain"]["modelList"] == ["main"]
    assert error(tmp_path, base(backend=models(chain={"modelList": ["main", "ghost"]}))) == (
        "backend.runner.models.presets.chain.model-list: unknown preset ghost")


def test_model_list_camel_case_wins_over_the_dashed_spelling(tmp_path):
    data = base(backend=models(other={"provider": "g", "model": "o"},
                               chain={"model-list": ["main"], "modelList": ["other"]}))
    assert load(tmp_path, data).runner.presets["chain"].model_list == ("other",)


# ---------------------------------------------------------------------------------------------------
# Scenarios 10–16 and 38: placeholders and imports

MODELS_YAML = """backend:
  runner:
    model: main
    models:
      providers: {g: {type: openai-compatible, apiKeyEnv: K}}
      presets: {main: {provider: g, model: m}}
"""
PM_YAML = "agents:\n  pm: {tools: [messages.send]}\n"


def project_text(head):
    return head + MODELS_YAML + PM_YAML


def test_placeholders_substitute_known_forms_and_leave_others(tmp_path):
    text = project_text('name: t\ntask: "${SZ_T1}-${env:SZ_T2}-$SZ_T1-${SZ_UNSET}-${SZ_T1:-x}-${ SZ_T1 }"\n')
    config_ = load(tmp_path, text, env={"SZ_T1": "a", "SZ_T2": "b"})
    assert config_.task == "a-b-$SZ_T1--${SZ_T1:-x}-${ SZ_T1 }"


def test_text_imports_are_verbatim(tmp_path):
    write(tmp_path / "t.md", "Hello ${HOME}\n")
    config_ = load(tmp_path, project_text("name: t\ntask: @import(t.md)\n"), env={"HOME": "/home/x"})
    assert config_.task == "Hello ${HOME}\n"


def test_nested_imports_resolve_against_the_importing_file(tmp_path, monkeypatch):
    write(tmp_path / "cfg" / "agents" / "pm.yaml", "prompt: @import(../prompts/pm.md)\ntools: [messages.send]\n")
    write(tmp_path / "cfg" / "prompts" / "pm.md", "P!")
    # Block style: leaves markers inside flow collections unquoted (scenario 12 writes it in flow form).
    write(tmp_path / "cfg" / "p.yaml", "name: t\ntask: T\n" + MODELS_YAML + "agents:\n  pm: @import(agents/pm.yaml)\n")
    monkeypatch.chdir(tmp_path)
    assert load_project("cfg/p.yaml", env={}).agent("pm").prompt == "P!"
    monkeypatch.chdir(tmp_path / "cfg" / "agents")
    assert load_project(tmp_path / "cfg" / "p.yaml", env={}).agent("pm").prompt == "P!"


def test_markers_are_trimmed_but_never_interpolated(tmp_path):
    write(tmp_path / "t.md", "imported")
    assert load(tmp_path, project_text('name: t\ntask: "  @import( t.md )  "\n')).task == "imported"
    assert load(tmp_path, project_text('name: t\ntask: "Read @import(t.md)"\n')).task == "Read @import(t.md)"


def test_marker_on_the_line_after_its_key_is_quoted(tmp_path):
    write(tmp_path / "t.md", "next line")
    assert load(tmp_path, project_text("name: t\ntask:\n  @import(t.md)  # comment\n")).task == "next line"


def test_literal_block_holding_only_a_marker_is_an_import(tmp_path):
    write(tmp_path / "t.md", "from block")
    assert load(tmp_path, project_text("name: t\ntask: |\n  @import(t.md)\n")).task == "from block"


def test_http_imports_are_disabled(tmp_path):
    assert error(tmp_path, project_text("name: t\ntask: @import(https://example.com/t.md)\n")) == (
        "HTTP(S) @import is disabled for reproducibility")
    assert error(tmp_path, project_text("name: t\ntask: @import(HTTP://example.com/t.md)\n")) == (
        "HTTP(S) @import is disabled for reproducibility")


def test_import_cycle_names_the_whole_chain(tmp_path):
    write(tmp_path / "a.yaml", "x: @import(b.yaml)\n")
    write(tmp_path / "b.yaml", "y: @import(a.yaml)\n")
    message = error(tmp_path, project_text("name: t\ntask: @import(a.yaml)\n"))
    p, a, b = tmp_path / "p.yaml", tmp_path / "a.yaml", tmp_path / "b.yaml"
    assert message == f"Circular @import detected: {p} -> {a} -> {b} -> {a}"


def test_importing_the_same_file_twice_is_not_a_cycle(tmp_path):
    write(tmp_path / "common.md", "shared")
    text = ("name: t\ntask: T\n" + MODELS_YAML +
            "agents:\n  pm:\n    prompt: @import(common.md)\n  qa:\n    prompt: @import(common.md)\n")
    config_ = load(tmp_path, text)
    assert [agent.prompt for agent in config_.agents] == ["shared", "shared"]


def test_missing_import_names_the_absolute_path(tmp_path):
    assert error(tmp_path, project_text("name: t\ntask: @import(missing.md)\n")) == (
        f"File not found: {tmp_path}/missing.md")


def test_missing_project_file_names_the_absolute_path(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_project(tmp_path / "nope.yaml", env={})
    assert caught.value.message == f"File not found: {tmp_path}/nope.yaml"


def test_import_depth_is_capped_at_32(tmp_path):
    def chain(depth):
        folder = tmp_path / f"d{depth}"
        for level in range(depth):
            write(folder / f"f{level}.yaml", f"v: @import(f{level + 1}.yaml)\n")
        write(folder / f"f{depth}.yaml", "v: end\n")
        write(folder / "p.yaml", project_text("name: t\ntask: T\nextra: @import(f1.yaml)\n"))
        return folder / "p.yaml"
    assert load_project(chain(32), env={}).name == "t"
    with pytest.raises(ConfigError) as caught:
        load_project(chain(33), env={})
    assert caught.value.message == "Maximum @import depth exceeded"


def test_whole_document_redirect_renders_like_the_target(tmp_path):
    write(tmp_path / "real.yaml", suzumio_yaml.dump_yaml(BASE))
    write(tmp_path / "redirect.yaml", "\n  @import(real.yaml)\n")
    assert load_project(tmp_path / "redirect.yaml", env={}).render() == (
        load_project(tmp_path / "real.yaml", env={}).render())


def test_json_imports_are_strict(tmp_path):
    write(tmp_path / "agent.json", '{"prompt": "from json", "prompt": "last wins", "tools": ["messages.send"]}')
    text = "name: t\ntask: T\n" + MODELS_YAML + "agents:\n  pm: @import(agent.json)\n"
    assert load(tmp_path, text).agent("pm").prompt == "last wins"
    write(tmp_path / "agent.json", '{"prompt": NaN}')
    assert error(tmp_path, text).startswith(f"Invalid JSON in {tmp_path}/agent.json: ")


def test_placeholder_value_holding_a_marker_becomes_an_import(tmp_path):
    write(tmp_path / "t.md", "via env")
    text = project_text("name: t\ntask: ${SZ_TASK}\n")
    assert load(tmp_path, text, env={"SZ_TASK": "@import(t.md)"}).task == "via env"


# ---------------------------------------------------------------------------------------------------
# Scenarios 17–20: extends

def test_extends_merges_mappings_deeply_and_replaces_lists(tmp_path):
    write(tmp_path / "base.yaml", 'channels: ["#a", "#b"]\nbackend: {image: img-a, docker: {network: host}}\n')
    text = ('extends: [@import(base.yaml)]\nname: t\ntask: T\nchannels: ["#c"]\n' +
            MODELS_YAML.replace("backend:\n", "backend:\n  image: img-b\n") + PM_YAML)
    out = rendered(tmp_path, text)
    assert out["channels"] == ["#c"]
    assert out["backend"]["image"] == "img-b"
    assert out["backend"]["docker"]["network"] == "host"
    assert "extends" not in out


def test_later_profiles_win_and_the_file_wins_over_all(tmp_path):
    write(tmp_path / "a.yaml", "backend: {image: A}\n")
    write(tmp_path / "b.yaml", "backend: {image: B}\n")
    head = "extends:\n  - @import(a.yaml)\n  - @import(b.yaml)\nname: t\ntask: T\n"
    assert load(tmp_path, project_text(head)).backend.image == "B"
    own = head + MODELS_YAML.replace("backend:\n", "backend:\n  image: L\n") + PM_YAML
    assert load(tmp_path, own).backend.image == "L"


def test_single_mapping_extends_counts_as_a_one_element_list(tmp_path):
    write(tmp_path / "base.yaml", "name: from-profile\n")
    single = load(tmp_path, "extends: @import(base.yaml)\ntask: T\n" + MODELS_YAML + PM_YAML, name="single.yaml")
    listed = load(tmp_path, "extends: [@import(base.yaml)]\ntask: T\n" + MODELS_YAML + PM_YAML, name="listed.yaml")
    assert single.name == "from-profile"
    assert single.render() == listed.render()


def test_extends_inside_an_agent(tmp_path):
    write(tmp_path / "agent-base.yaml", "role: r\ntools: [messages.send]\n")
    text = "name: t\ntask: T\n" + MODELS_YAML + "agents:\n  pm:\n    extends: [@import(agent-base.yaml)]\n"
    assert load(tmp_path, text).agent("pm").role == "r"


def test_extends_key_order_keeps_base_positions():
    merged = suzumio_yaml.apply_extends({"extends": [{"a": 1, "b": {"x": 1}}], "c": 3, "b": {"y": 2}})
    assert merged == {"a": 1, "b": {"x": 1, "y": 2}, "c": 3}
    assert list(merged) == ["a", "b", "c"]


def test_non_mapping_base_is_replaced_by_a_later_mapping():
    assert suzumio_yaml.apply_extends({"extends": [{"a": 1}, "text", {"b": 2}]}) == {"b": 2}
    assert suzumio_yaml.apply_extends({"extends": [{"a": 1}], "a": None}) == {"a": None}


# ---------------------------------------------------------------------------------------------------
# Scenarios 21–25: counted agents and mounts

def test_counted_agents_expand_with_names_and_roles(tmp_path):
    data = base()
    data["agents"]["worker"] = {"count": 3, "names": ["Akari", "Ren"], "model": "main", "role": "solver"}
    config_ = load(tmp_path, data)
    assert [(a.id, a.display_name, a.role) for a in config_.agents] == [
        ("pm", "pm", "pm"), ("worker-1", "Akari", "solver"), ("worker-2", "Ren", "solver"),
        ("worker-3", "worker-3", "solver")]
    assert parse_yaml(config_.render())["agents"]["worker"]["count"] == 3
    del data["agents"]["worker"]["role"]
    assert {a.role for a in load(tmp_path, data).agents if a.key == "worker"} == {"worker"}


def test_count_one_keeps_the_key_as_id(tmp_path):
    data = base()
    data["agents"]["worker"] = {"count": 1, "names": ["Solo"], "model": "main"}
    agent = load(tmp_path, data).agent("worker")
    assert (agent.id, agent.display_name) == ("worker", "Solo")


def test_display_name_falls_back_to_display_name_then_id(tmp_path):
    data = base()
    data["agents"]["worker"] = {"count": 2, "names": ["A"], "displayName": "Crew"}
    assert [a.display_name for a in load(tmp_path, data).agents][1:] == ["A", "Crew"]


def test_duplicate_expanded_ids_fail(tmp_path):
    data = base()
    data["agents"]["worker"] = {"count": 2, "model": "main"}
    data["agents"]["worker-1"] = {"model": "main"}
    assert error(tmp_path, data) == "Duplicate agent id after count expansion: worker-1"


def test_mount_in_a_fragment_is_relative_to_the_project_file(tmp_path):
    write(tmp_path / "frag" / "backend.yaml", "docker:\n  mounts:\n    - source: ./data\n      target: /mnt/data/\n")
    text = ("name: t\ntask: T\nbackend:\n  extends: [@import(frag/backend.yaml)]\n" +
            MODELS_YAML.replace("backend:\n", "") + PM_YAML)
    mount = rendered(tmp_path, text)["backend"]["docker"]["mounts"][0]
    assert mount == {"source": f"{tmp_path}/data", "target": "/mnt/data/", "readonly": True}


@pytest.mark.parametrize("target, message", [
    ("mnt/data", "Docker mount target must be absolute: mnt/data"),
    ("/workspace/x", "Docker mount target is reserved: /workspace/x"),
    ("/mnt/../artifacts", "Docker mount target is reserved: /mnt/../artifacts"),
    ("/toolpacks/x", "Docker mount target is reserved: /toolpacks/x"),
    ("/opt/suzumio", "Docker mount target is reserved: /opt/suzumio"),
    ("/activation/", "Docker mount target is reserved: /activation/"),
])
def test_mount_targets_must_be_absolute_and_not_reserved(tmp_path, target, message):
    data = base()
    data["agents"]["pm"]["mounts"] = [{"source": "./d", "target": target}]
    assert error(tmp_path, data) == message


@pytest.mark.parametrize("target, normalized", [
    ("/artifacts-old", "/artifacts-old"), ("/mnt//a/./b/", "/mnt/a/b/"), ("/../mnt/x", "/mnt/x"),
    ("//mnt/a", "/mnt/a"), ("/mnt/a/..", "/mnt"),
])
def test_mount_targets_are_normalized(tmp_path, target, normalized):
    data = base()
    data["backend"]["docker"] = {"mounts": [{"source": "/abs/src", "target": target, "readonly": False,
                                             "description": "input"}]}
    mount = load(tmp_path, data).backend.docker.mounts[0]
    assert mount == config.Mount("/abs/src", normalized, False, "input")


# ---------------------------------------------------------------------------------------------------
# Scenarios 26–27, 44–45: toolpacks and allowlists

def test_unknown_builtin_toolpack(tmp_path):
    assert error(tmp_path, base(tools={"toolpacks": ["core", "artifacts"]})) == (
        "Unknown built-in toolpack: artifacts (configure local toolpacks as { path: ... })")


def test_toolpack_path_entry_checks(tmp_path):
    def failure(entry):
        return error(tmp_path, base(tools={"toolpacks": ["core", entry]}))
    assert failure({"path": "HTTPS://x/y"}) == "Toolpack paths must be local directories, not HTTP(S) URLs: HTTPS://x/y"
    assert failure({"path": "./missing"}) == f"Local toolpack path not found: {tmp_path}/missing"
    write(tmp_path / "tp", "a file")
    assert failure({"path": "./tp"}) == f"Local toolpack path is not a directory: {tmp_path}/tp"
    (tmp_path / "empty").mkdir()
    assert failure({"path": "./empty"}) == f"Toolpack manifest not found: {tmp_path}/empty/suzumio.toolpack.json"


def test_valid_local_toolpack_renders_an_absolute_path(tmp_path):
    make_toolpack(tmp_path / "toolpacks" / "review", REVIEW_MANIFEST)
    data = base(tools={"toolpacks": ["core", {"path": "./toolpacks/review", "id": "review-tools"}]})
    data["agents"]["pm"]["tools"] = ["messages.send", "review.summarize"]
    config_ = load(tmp_path, data)
    entry = parse_yaml(config_.render())["tools"]["toolpacks"][1]
    assert entry == {"id": "review-tools", "path": f"{tmp_path}/toolpacks/review"}
    pack = config_.toolpack("review-tools")
    assert pack.kind == "local" and pack.path == f"{tmp_path}/toolpacks/review"
    assert pack.runner_module == f"{tmp_path}/toolpacks/review/runner.mjs"
    assert pack.controller_module == f"{tmp_path}/toolpacks/review/controller.mjs"
    assert pack.manifest["id"] == "review-tools"


def test_manifest_id_characters_are_checked(tmp_path):
    make_toolpack(tmp_path / "tp", dict(REVIEW_MANIFEST, id="bad id!"))
    assert error(tmp_path, base(tools={"toolpacks": [{"path": "tp"}]})) == (
        "Invalid toolpack id bad id!: use only letters, digits, '.', '_' and '-'")


def test_builtin_listed_twice_is_a_duplicate(tmp_path):
    assert error(tmp_path, base(tools={"toolpacks": ["core", "core"]})) == "Duplicate toolpack: core"


def test_allowlist_entries_must_name_registered_tools(tmp_path):
    def failure(tools):
        data = base()
        data["agents"]["pm"]["tools"] = tools
        return error(tmp_path, data)
    assert failure(["messages.send", "shell.run"]) == (
        f'agents.pm.tools.1: unknown tool "shell.run" (registered: {CORE_AND_WEB})')
    assert failure(["artifacts.publish"]) == (
        f'agents.pm.tools.0: unknown tool "artifacts.publish" (registered: {CORE_AND_WEB})')
    assert failure(["plan.*"]) == f'agents.pm.tools.0: unknown tool "plan.*" (registered: {CORE_AND_WEB})'
    assert failure(["file*"]).startswith('agents.pm.tools.0: unknown tool "file*"')
    assert failure(["coordination.no_valuable_work"]).startswith("agents.pm.tools.0: unknown tool")


@pytest.mark.parametrize("tools", [["*"], ["file.*"], []])
def test_star_and_matching_namespace_patterns_are_accepted(tmp_path, tools):
    data = base()
    data["agents"]["pm"]["tools"] = tools
    assert load(tmp_path, data).agent("pm").tools == tuple(tools)


def test_seed_reviewer_example_loads(tmp_path, packaged):
    make_toolpack(tmp_path / "toolpacks" / "review", REVIEW_MANIFEST)
    data = base(tools={"toolpacks": ["core", "shell", "web", {"packaged": "scheduler"}, {"packaged": "plan"},
                                     {"path": "./toolpacks/review", "id": "review-tools"}]})
    data["agents"]["reviewer"] = {"tools": ["messages.send", "coordination.wait_for_signal", "plan.*", "schedule.*",
                                            "review.summarize"]}
    config_ = load(tmp_path, data, packaged_dir=packaged)
    assert [p.id for p in config_.toolpacks] == ["core", "shell", "web", "scheduler", "plan", "review-tools"]
    allowed = [t.name for t in config_.allowed_tools("reviewer")]
    assert allowed == ["messages.send", "coordination.wait_for_signal", "schedule.once", "schedule.recurring",
                       "schedule.list", "schedule.cancel", "plan.create", "plan.status", "plan.update",
                       "plan.set_item_status", "plan.close", "review.summarize"]


def test_packaged_entries_resolve_beside_the_modules_and_stay_unresolved(tmp_path, packaged):
    data = base(tools={"toolpacks": ["core", {"packaged": "scheduler"}]})
    data["agents"]["pm"]["tools"] = ["messages.send", "schedule.*"]
    config_ = load(tmp_path, data, packaged_dir=packaged)
    assert parse_yaml(config_.render())["tools"]["toolpacks"][1] == {"packaged": "scheduler"}
    assert config_.data["tools"]["toolpacks"][1] == {"packaged": "scheduler"}
    pack = config_.toolpack("scheduler")
    assert (pack.kind, pack.path, pack.packaged) == ("local", f"{packaged}/scheduler", "scheduler")


def test_packaged_directory_is_the_toolpacks_folder_beside_the_config_module():
    assert registry.packaged_toolpacks_dir() == str(Path(registry.__file__).resolve().parent / "toolpacks")


def test_missing_packaged_copy_is_reported_with_its_path(tmp_path):
    data = base(tools={"toolpacks": ["core", {"packaged": "plan"}]})
    assert error(tmp_path, data, packaged_dir=str(tmp_path / "nowhere")) == (
        f"Local toolpack path not found: {tmp_path}/nowhere/plan")


def test_packaged_entry_shape_errors(tmp_path):
    assert error(tmp_path, base(tools={"toolpacks": ["core", {"packaged": "cron"}]})) == (
        "Invalid project config:\n  - tools.toolpacks.1.packaged: "
        "Invalid enum value. Expected 'scheduler' | 'plan', received 'cron'")
    assert error(tmp_path, base(tools={"toolpacks": ["core", {"packaged": "plan", "path": "./x"}]})) == (
        "Invalid project config:\n  - tools.toolpacks.1: Invalid input")
    assert error(tmp_path, base(tools={"toolpacks": [{"id": "x"}, "", 3]})) == (
        "Invalid project config:\n  - tools.toolpacks.0: Invalid input\n  - tools.toolpacks.1: Invalid input\n"
        "  - tools.toolpacks.2: Invalid input")


def test_same_packaged_toolpack_by_path_and_by_name_is_a_duplicate(tmp_path, packaged):
    data = base(tools={"toolpacks": ["core", {"path": f"{packaged}/scheduler", "id": "scheduler"},
                                     {"packaged": "scheduler"}]})
    assert error(tmp_path, data, packaged_dir=packaged) == "Duplicate toolpack: scheduler"


def test_explicit_empty_toolpack_list_registers_nothing(tmp_path):
    data = base(tools={"toolpacks": []})
    data["agents"]["pm"]["tools"] = ["messages.send"]
    assert error(tmp_path, data) == 'agents.pm.tools.0: unknown tool "messages.send" (registered: )'
    data["agents"]["pm"]["tools"] = []
    assert load(tmp_path, data).toolpacks == []


# ---------------------------------------------------------------------------------------------------
# Scenarios 28–37, 41, 46, 48: schema types, legacy keys, platforms, ids, backend

def test_unknown_and_legacy_keys_are_dropped(tmp_path):
    data = base(version=3, scheduler={"intervalMs": 2000})
    data["backend"]["runner"]["finalPrompt"] = "x"
    data["agents"]["pm"]["workspace"] = "x"
    out = rendered(tmp_path, data)
    assert "version" not in out and "intervalMs" not in out["scheduler"]
    assert "finalPrompt" not in out["backend"]["runner"] and "workspace" not in out["agents"]["pm"]


def test_max_prompt_messages_is_an_alias_and_mailbox_kind_is_kept(tmp_path):
    config_ = load(tmp_path, base(scheduler={"maxPromptMessages": 40, "kind": "nonpreemptive-mailbox"}))
    out = parse_yaml(config_.render())
    assert out["scheduler"]["maxSignalsPerActivation"] == 40 and "maxPromptMessages" not in out["scheduler"]
    assert out["scheduler"]["kind"] == "nonpreemptive-mailbox"
    assert config_.scheduler.max_signals_per_activation == 40


def test_internal_data_always_holds_scheduler_kind_and_signal_cap(tmp_path):
    data = load(tmp_path, BASE).data
    assert data["scheduler"]["kind"] == "nonpreemptive-signals"
    assert data["scheduler"]["maxSignalsPerActivation"] == 20


def test_null_where_a_list_is_expected(tmp_path):
    assert error(tmp_path, project_text("name: t\ntask: T\nchannels:\n")) == (
        "Invalid project config:\n  - channels: Expected array, received null")


def test_unset_placeholders_in_proxy_fields_mean_absent(tmp_path):
    text = project_text("name: t\ntask: T\n").replace(
        "backend:\n", "backend:\n  docker:\n    proxy:\n      http: ${SZ_UNSET}\n      https: \"\"\n")
    proxy = rendered(tmp_path, text)["backend"]["docker"]["proxy"]
    assert proxy == {"inheritEnv": True, "rewriteLocalhost": True}


def test_unset_placeholder_for_a_string_field_is_null(tmp_path):
    text = project_text("name: t\ntask: T\n").replace("backend:\n", "backend:\n  controllerUrl: ${SZ_UNSET}\n")
    assert error(tmp_path, text) == "Invalid project config:\n  - backend.controllerUrl: Expected string, received null"
    quoted = project_text("name: t\ntask: T\n").replace("backend:\n", "backend:\n  controllerUrl: \"${SZ_UNSET}\"\n")
    assert load(tmp_path, quoted).backend.controller_url == ""


def test_types_are_strict(tmp_path):
    assert error(tmp_path, base(observability={"http": {"port": "39400"}})) == (
        "Invalid project config:\n  - observability.http.port: Expected number, received string")
    text = project_text("name: t\ntask: T\nobservability: {webui: {enabled: yes}}\n")
    assert error(tmp_path, text) == (
        "Invalid project config:\n  - observability.webui.enabled: Expected boolean, received string")
    assert error(tmp_path, base(observability={"http": {"port": True}})).endswith(
        "observability.http.port: Expected number, received boolean")


def test_env_values_must_be_strings(tmp_path):
    data = base()
    data["agents"]["pm"]["env"] = {"MODE": 1}
    assert error(tmp_path, data) == "Invalid project config:\n  - agents.pm.env.MODE: Expected string, received number"


def test_count_validation(tmp_path):
    def with_count(count):
        data = base()
        data["agents"]["pm"]["count"] = count
        return data
    assert error(tmp_path, with_count(0)).endswith("agents.pm.count: Number must be greater than 0")
    assert error(tmp_path, with_count(1.5)).endswith("agents.pm.count: Expected integer, received float")
    config_ = load(tmp_path, with_count(2.0))
    assert config_.agent_ids == ["pm-1", "pm-2"]
    assert config_.data["agents"]["pm"]["count"] == 2 and isinstance(config_.data["agents"]["pm"]["count"], int)


def test_runner_mode_mock_is_rejected(tmp_path):
    data = base()
    data["backend"]["runner"]["mode"] = "mock"
    assert error(tmp_path, data) == (
        'Invalid project config:\n  - backend.runner.mode: Invalid literal value, expected "ai"')


def test_platforms_must_be_empty(tmp_path):
    assert error(tmp_path, base(platforms=[{"id": "fs", "kind": "feishu"}])) == (
        "platforms are not supported by this version")
    assert rendered(tmp_path, base(platforms=[]))["platforms"] == []
    assert error(tmp_path, base(platforms="fs")) == (
        "Invalid project config:\n  - platforms: Expected array, received string")


@pytest.mark.parametrize("name", ["../escape", "a/b", "a\\b", ".", ".."])
def test_project_name_must_be_one_path_segment(tmp_path, name):
    assert error(tmp_path, base(name=name)) == f"Project name must be a single path segment: {name}"


def test_agent_id_must_be_one_path_segment(tmp_path):
    assert error(tmp_path, base(agents={"..": {"tools": []}})) == "Agent id must be a single path segment: .."


def test_activation_timeout(tmp_path):
    def with_timeout(value):
        data = base()
        data["backend"]["activationTimeoutMs"] = value
        return data
    config_ = load(tmp_path, with_timeout(60000))
    assert list(parse_yaml(config_.render())["backend"])[2:4] == ["controllerUrl", "activationTimeoutMs"]
    assert config_.backend.activation_timeout_ms == 60000
    assert error(tmp_path, with_timeout(0)).endswith("backend.activationTimeoutMs: Number must be greater than 0")
    assert error(tmp_path, with_timeout(1.5)).endswith("backend.activationTimeoutMs: Expected integer, received float")


def test_local_backend_warns_and_unknown_kinds_fail(tmp_path):
    data = base()
    data["backend"]["kind"] = "local"
    config_ = load(tmp_path, data)
    assert parse_yaml(config_.render())["backend"]["kind"] == "local"
    assert config_.warnings == ["Warning: backend.kind local runs agent tools on this host without isolation",
                                config.LOCAL_EGRESS_WARNING]
    data["backend"]["docker"] = {"mounts": [{"source": "/x", "target": "/mnt/x"}]}
    assert load(tmp_path, data).warnings == [
        "Warning: backend.kind local runs agent tools on this host without isolation", config.LOCAL_EGRESS_WARNING,
        "Warning: backend.kind local ignores configured mounts"]
    data["backend"]["kind"] = "kubernetes"
    assert error(tmp_path, data) == ("Invalid project config:\n  - backend.kind: Invalid enum value. "
                                     "Expected 'docker-chat' | 'local' | 'swarm', received 'kubernetes'")


def test_agent_mounts_alone_also_draw_the_local_mount_warning(tmp_path):
    data = base()
    data["backend"]["kind"] = "local"
    data["agents"]["pm"]["mounts"] = [{"source": "/x", "target": "/mnt/x"}]
    assert config.LOCAL_MOUNTS_WARNING in load(tmp_path, data).warnings


def test_docker_limits_render_in_order_and_are_validated(tmp_path):
    def with_docker(docker):
        data = base()
        data["backend"]["docker"] = docker
        return data
    config_ = load(tmp_path, with_docker({"cpus": 1.5, "network": "host", "memory": "512m"}))
    assert list(parse_yaml(config_.render())["backend"]["docker"]) == [
        "network", "memory", "cpus", "pidsLimit", "capAdd", "grantNetwork", "keep", "mounts", "proxy"]
    assert (config_.backend.docker.cpus, config_.backend.docker.memory) == (1.5, "512m")
    assert config_.backend.docker.keep == 5
    assert load(tmp_path, with_docker({"keep": "all"})).backend.docker.keep == "all"
    assert load(tmp_path, with_docker({"keep": 0})).backend.docker.keep == 0
    assert error(tmp_path, with_docker({"keep": -1})).endswith(
        "backend.docker.keep: Number must be greater than or equal to 0")
    assert error(tmp_path, with_docker({"cpus": 0})).endswith("backend.docker.cpus: Number must be greater than 0")
    assert error(tmp_path, with_docker({"memory": 512})).endswith(
        "backend.docker.memory: Expected string, received number")


# ---------------------------------------------------------------------------------------------------
# Least privilege: container settings, network per agent, warnings (docs/configuration.md#network-and-privileges)

def docker_base(docker=None, **agents):
    data = base()
    data["agents"].update(agents)
    if docker is not None:
        data["backend"]["docker"] = docker
    return data


def test_limits_have_defaults_that_render_and_survive_a_stored_config_without_them(tmp_path):
    config_ = load(tmp_path, BASE)
    docker = parse_yaml(config_.render())["backend"]["docker"]
    assert (docker["memory"], docker["cpus"], docker["pidsLimit"]) == ("4g", 2, 1024)
    assert docker["capAdd"] == [] and docker["grantNetwork"] is False and "user" not in docker
    stored = config_.data
    for key in ("memory", "cpus", "pidsLimit", "capAdd", "grantNetwork"):
        del stored["backend"]["docker"][key]
    again = ProjectConfig.from_data(stored).sandbox("pm")
    assert (again.memory, again.cpus, again.pids_limit, again.user, again.cap_add) == ("4g", 2, 1024, None, ())


def test_false_turns_a_limit_off_and_other_values_are_checked(tmp_path):
    sandbox = load(tmp_path, docker_base({"memory": False, "cpus": False, "pidsLimit": False})).sandbox("pm")
    assert (sandbox.memory, sandbox.cpus, sandbox.pids_limit) == (False, False, False)
    message = error(tmp_path, docker_base({"pidsLimit": 0, "cpus": True, "user": "", "capAdd": "NET_ADMIN",
                                           "grantNetwork": "yes"}))
    assert message == ("Invalid project config:\n"
                       "  - backend.docker.cpus: Expected number, received boolean\n"
                       "  - backend.docker.pidsLimit: Number must be greater than 0\n"
                       "  - backend.docker.user: String must contain at least 1 character(s)\n"
                       "  - backend.docker.capAdd: Expected array, received string\n"
                       "  - backend.docker.grantNetwork: Expected boolean, received string")
    message = error(tmp_path, docker_base(worker={"tools": [], "network": "on", "docker": {"memory": 1}}))
    assert message == ("Invalid project config:\n"
                       "  - agents.worker.network: Expected boolean, received string\n"
                       "  - agents.worker.docker.memory: Expected string, received number")


def test_agent_docker_settings_replace_the_backend_ones_key_by_key(tmp_path):
    data = docker_base({"network": "host", "memory": "1g", "user": "1000:1000", "capAdd": ["CHOWN"]},
                       worker={"tools": ["web.fetch"], "docker": {"memory": "256m", "capAdd": [], "network": "bridge",
                                                                 "pidsLimit": 64}})
    config_ = load(tmp_path, data)
    pm, worker = config_.sandbox("pm"), config_.sandbox("worker")
    assert (pm.network, pm.memory, pm.cpus, pm.pids_limit, pm.user, pm.cap_add) == (
        "host", "1g", 2, 1024, "1000:1000", ("CHOWN",))
    assert (worker.network, worker.memory, worker.cpus, worker.pids_limit, worker.user, worker.cap_add) == (
        "bridge", "256m", 2, 64, "1000:1000", ())
    assert list(parse_yaml(config_.render())["agents"]["worker"]) == ["prompt", "tools", "mounts", "env", "docker"]


NO_NETWORK = "connections go through the controller's egress proxy"


@pytest.mark.parametrize("agent, backend_docker, expected", [
    ({"tools": ["messages.send"]}, {}, (False, NO_NETWORK)),
    ({"tools": ["web.fetch"]}, {}, (False, NO_NETWORK)),
    ({"tools": ["*"]}, {}, (False, NO_NETWORK)),
    ({"tools": [], "network": True}, {}, (True, "agents.pm.network: true")),
    ({"tools": ["web.fetch"], "network": False}, {"grantNetwork": True}, (False, "agents.pm.network: false")),
    ({"tools": []}, {"grantNetwork": True}, (True, "backend.docker.grantNetwork: true")),
])
def test_no_container_has_a_network_unless_an_escape_hatch_grants_it(tmp_path, agent, backend_docker, expected):
    data = docker_base(backend_docker)
    data["agents"]["pm"] = agent
    sandbox = load(tmp_path, data).sandbox("pm")
    assert (sandbox.has_network, sandbox.network_reason) == expected


@pytest.mark.parametrize("agent, toolpacks, expected", [
    ({"tools": ["messages.send"]}, None,
     ((), "its tools do not allow web.fetch and agents.pm.egress is not set")),
    ({"tools": ["web.fetch"]}, None, (("public",), "its tools allow web.fetch")),
    ({"tools": ["web.*"]}, None, (("public",), "its tools allow web.fetch")),
    ({"tools": ["*"]}, ["core"], ((), "its tools do not allow web.fetch and agents.pm.egress is not set")),
    ({"tools": ["web.fetch"], "egress": ["api.example.com:443"]}, None, (("api.example.com:443",), "agents.pm.egress")),
    ({"tools": [], "egress": []}, None, ((), "agents.pm.egress")),
])
def test_egress_defaults_to_nothing_and_to_public_with_web_fetch(tmp_path, agent, toolpacks, expected):
    data = docker_base({})
    data["agents"]["pm"] = agent
    if toolpacks is not None:
        data["tools"] = {"toolpacks": toolpacks}
    egress = load(tmp_path, data).egress("pm")
    assert (egress.entries, egress.reason) == expected


def test_egress_entries_and_limits_are_validated(tmp_path):
    data = docker_base({})
    data["agents"]["pm"] = {"tools": [], "egress": ["ok.example", "bad host", "0.0.0.0/0", "x:70000", 3],
                            "egressLimits": {"bytes": 0, "connections": "2"}}
    assert error(tmp_path, data) == (
        "Invalid project config:\n"
        "  - agents.pm.egress.1: invalid host name 'bad host' (expected host, host:port, *.domain, a CIDR or public)\n"
        "  - agents.pm.egress.2: 0.0.0.0/0 names every address; write public for the public ones (expected host, "
        "host:port, *.domain, a CIDR or public)\n"
        "  - agents.pm.egress.3: invalid port '70000' (1-65535) (expected host, host:port, *.domain, a CIDR or "
        "public)\n"
        "  - agents.pm.egress.4: Expected string, received number\n"
        "  - agents.pm.egressLimits.bytes: Number must be greater than 0\n"
        "  - agents.pm.egressLimits.connections: Expected number, received string")
    data["agents"]["pm"] = {"tools": [], "egress": ["*.example.com"], "egressLimits": {"bytes": 10, "connections": 2}}
    egress = load(tmp_path, data).egress("pm")
    assert (egress.max_bytes, egress.max_connections) == (10, 2)


def test_render_lists_each_agents_network_and_egress_with_reasons(tmp_path):
    data = docker_base({"network": "host"}, fetcher={"tools": ["web.fetch"]},
                       worker={"count": 2, "tools": [], "network": True, "docker": {"network": "bridge"},
                               "egress": ["*.example.com", "10.1.0.0/16"]})
    config_ = load(tmp_path, data)
    assert config_.network_report() == [
        f"Network: pm gets none ({NO_NETWORK})",
        "Egress: pm may reach nothing (its tools do not allow web.fetch and agents.pm.egress is not set)",
        f"Network: fetcher gets none ({NO_NETWORK})",
        "Egress: fetcher may reach public (its tools allow web.fetch)",
        "Network: worker-1 gets bridge (agents.worker.network: true)",
        "Egress: worker-1 may reach *.example.com, 10.1.0.0/16 (agents.worker.egress)",
        "Network: worker-2 gets bridge (agents.worker.network: true)",
        "Egress: worker-2 may reach *.example.com, 10.1.0.0/16 (agents.worker.egress)",
    ]
    assert config_.warnings[:1] == [
        f"Warning: agents.worker.network true gives worker-1, worker-2 {config.ESCAPE_HATCH}"]
    assert config_.warnings[-2:] == [
        "Warning: agents.worker.egress 10.1.0.0/16 lets worker-1 reach non-public addresses",
        "Warning: agents.worker.egress 10.1.0.0/16 lets worker-2 reach non-public addresses"]
    data["backend"]["kind"] = "local"
    assert load(tmp_path, data).network_report()[:2] == [
        "Egress: pm may reach nothing (its tools do not allow web.fetch and agents.pm.egress is not set)",
        "Egress: fetcher may reach public (its tools allow web.fetch)"]


def test_render_warns_about_every_setting_that_weakens_the_boundary(tmp_path):
    data = docker_base({"network": "host", "user": "root", "capAdd": ["NET_ADMIN", "SYS_PTRACE"], "memory": False,
                        "cpus": False, "pidsLimit": False, "grantNetwork": True},
                       worker={"tools": [], "docker": {"user": "0:0", "pidsLimit": False, "network": "host"}})
    assert load(tmp_path, data).warnings == [
        f"Warning: backend.docker.grantNetwork true gives every agent {config.ESCAPE_HATCH}",
        "Warning: backend.docker.user root runs activation containers as root",
        "Warning: backend.docker.capAdd gives activation containers capabilities: NET_ADMIN, SYS_PTRACE",
        "Warning: backend.docker.memory false: activation containers have no memory limit",
        "Warning: backend.docker.cpus false: activation containers have no CPU limit",
        "Warning: backend.docker.pidsLimit false: activation containers have no process limit",
        "Warning: backend.docker.network host gives pm the host's network, its 127.0.0.1 services included",
        "Warning: agents.worker.docker.user 0:0 runs activation containers as root",
        "Warning: agents.worker.docker.pidsLimit false: activation containers have no process limit",
        "Warning: agents.worker.docker.network host gives worker the host's network, its 127.0.0.1 services "
        "included",
    ]


def test_a_host_network_no_agent_gets_is_reported_as_unused(tmp_path):
    config_ = load(tmp_path, docker_base({"network": "host"}))
    assert config_.warnings == ["Warning: backend.docker.network host is only given to agents with network, and "
                                "no agent it applies to has network"]
    assert load(tmp_path, docker_base({"network": "bridge", "user": "1000"})).warnings == []


def test_the_local_backend_warns_only_that_it_is_no_sandbox(tmp_path):
    data = docker_base({"network": "host", "user": "root", "memory": False})
    data["backend"]["kind"] = "local"
    assert load(tmp_path, data).warnings == [config.LOCAL_WARNING, config.LOCAL_EGRESS_WARNING]


@pytest.mark.parametrize("user, root", [("root", True), ("0", True), ("0:1000", True), ("root:wheel", True),
                                        ("1000", False), ("1000:0", False), ("rootless", False), (None, False)])
def test_is_root_user(user, root):
    assert config.is_root_user(user) is root


def test_schema_issues_are_collected_across_the_tree(tmp_path):
    data = base(channels=[1], observability={"http": {"port": -1}})
    data["agents"]["pm"]["count"] = "2"
    data["backend"]["runner"]["models"]["providers"]["g"]["timeoutMs"] = True
    assert error(tmp_path, data) == (
        "Invalid project config:\n"
        "  - backend.runner.models.providers.g.timeoutMs: Expected number, received boolean\n"
        "  - agents.pm.count: Expected number, received string\n"
        "  - channels.0: Expected string, received number\n"
        "  - observability.http.port: Number must be greater than 0")


def test_root_that_is_not_a_mapping(tmp_path):
    assert error(tmp_path, "- a\n- b\n") == "Invalid project config:\n  - (root): Expected object, received array"


def test_provider_fields_and_timeout_union(tmp_path):
    data = base()
    data["backend"]["runner"]["models"]["providers"]["g"].update(
        {"timeoutMs": False, "chunkTimeoutMs": 5000, "baseURL": "http://x/v1", "headers": {"X-A": "1"},
         "options": {"queryParams": {"a": 1}}})
    provider = load(tmp_path, data).runner.providers["g"]
    assert (provider.timeout_ms, provider.chunk_timeout_ms, provider.base_url) == (False, 5000, "http://x/v1")
    assert dict(provider.headers) == {"X-A": "1"} and provider.options["queryParams"] == {"a": 1}
    data["backend"]["runner"]["models"]["providers"]["g"]["timeoutMs"] = 0
    assert error(tmp_path, data).endswith("providers.g.timeoutMs: Number must be greater than 0")


@pytest.mark.parametrize("provider_type", ["openai", "google"])
def test_provider_types_of_later_versions_are_rejected(tmp_path, provider_type):
    data = base()
    data["backend"]["runner"]["models"]["providers"]["g"]["type"] = provider_type
    assert error(tmp_path, data) == (
        f"backend.runner.models.providers.g.type: Provider type {provider_type} is not supported by this version "
        "(use openai-compatible, anthropic or scripted)")


# ---------------------------------------------------------------------------------------------------
# Scenarios 42–43: reserved id, cross references, presets

def test_agent_id_user_is_reserved(tmp_path):
    assert error(tmp_path, base(agents={"user": {"tools": []}})) == "Agent id is reserved: user"
    assert load(tmp_path, base(agents={"lead": {"tools": []}})).agent_ids == ["lead"]


@pytest.mark.parametrize("changes, message", [
    ({"communication": {"coordinatorAgent": "boss"}}, "communication.coordinatorAgent: unknown agent boss"),
    ({"scheduler": {"allQuietNudge": {"targetAgent": "ghost"}}},
     "scheduler.allQuietNudge.targetAgent: unknown agent ghost"),
    ({"scheduler": {"quietAgentMonitor": {"rules": [{"agent": "ghost"}]}}},
     "scheduler.quietAgentMonitor.rules.0.agent: unknown agent ghost"),
    ({"scheduler": {"quietAgentMonitor": {"rules": [{"agent": "pm", "recipient": "ghost"}]}}},
     "scheduler.quietAgentMonitor.rules.0.recipient: unknown agent ghost"),
    ({"scheduler": {"failedAgentMonitor": {"rules": [{"agent": "pm"}, {"agent": "nobody"}]}}},
     "scheduler.failedAgentMonitor.rules.1.agent: unknown agent nobody"),
])
def test_cross_references_name_expanded_agents(tmp_path, changes, message):
    assert error(tmp_path, base(**changes)) == message


def test_a_team_without_pm_renders_again(tmp_path):
    """resolved.yaml spells out the default coordinator `pm`; written back, it is still the default."""
    first = load(tmp_path, base(agents={"lead": {"tools": []}}))
    again = tmp_path / "again.yaml"
    again.write_text(first.render(), encoding="utf-8")
    second = load_project(again, env={})
    assert second.render() == first.render()
    assert second.communication.coordinator_agent == "pm"


def test_a_default_pm_is_checked_only_where_a_feature_sends_to_it(tmp_path):
    monitor = {"quietAgentMonitor": {"enabled": True, "rules": [{"agent": "lead"}]}}
    assert error(tmp_path, base(agents={"lead": {"tools": []}}, scheduler=monitor)) == (
        'scheduler.quietAgentMonitor.rules.0.recipient: agent "pm" is not in agents (lead); set '
        "scheduler.quietAgentMonitor.rules.0.recipient to one of them or user")
    nudge = {"allQuietNudge": {"enabled": True}}
    assert error(tmp_path, base(agents={"lead": {"tools": []}, "aide": {"tools": []}}, scheduler=nudge)) == (
        'scheduler.allQuietNudge.targetAgent: agent "pm" is not in agents (aide, lead); set '
        "scheduler.allQuietNudge.targetAgent to one of them")
    policy = {"restrictNonCoordinatorToCoordinator": True}
    assert error(tmp_path, base(agents={"lead": {"tools": []}}, communication=policy)) == (
        'communication.coordinatorAgent: agent "pm" is not in agents (lead); set '
        "communication.coordinatorAgent to one of them")
    # Off, the same defaults are no error; the team without its coordinator is warned about.
    monitor["quietAgentMonitor"]["enabled"] = False
    config_ = load(tmp_path, base(agents={"lead": {"tools": []}}, scheduler=monitor))
    assert config_.communication.coordinator_agent == "pm"
    rule = config_.scheduler.quiet_agent_monitor.rules[0]
    assert (rule.recipient, rule.sender, rule.priority, rule.key) == ("pm", "monitor", "P3", "0:lead:monitor->pm")
    assert config_.warnings[-1] == (
        'Warning: communication.coordinatorAgent: agent "pm" is not in agents (lead); request-changes then '
        'needs a "recipient" and wait notices go to no one; set communication.coordinatorAgent to one of them')
    led = load(tmp_path, base(agents={"lead": {"tools": []}}, communication={"coordinatorAgent": "lead"},
                              scheduler={"allQuietNudge": {"enabled": True, "targetAgent": "lead"}}))
    assert not any("coordinatorAgent" in line for line in led.warnings)


def test_monitor_recipient_may_be_the_user_and_counted_ids_are_references(tmp_path):
    data = base(scheduler={"quietAgentMonitor": {"rules": [{"agent": "pm", "recipient": "user", "id": "r1"}]}})
    data["agents"]["worker"] = {"count": 2, "model": "main"}
    config_ = load(tmp_path, data)
    assert config_.scheduler.quiet_agent_monitor.rules[0].key == "r1"
    data["communication"] = {"coordinatorAgent": "worker-2"}
    assert load(tmp_path, data).communication.coordinator_agent == "worker-2"
    data["communication"] = {"coordinatorAgent": "worker"}
    assert error(tmp_path, data) == "communication.coordinatorAgent: unknown agent worker"


def test_preset_references(tmp_path):
    data = base()
    data["backend"]["runner"]["models"]["presets"]["main"]["provider"] = "nope"
    assert error(tmp_path, data) == "backend.runner.models.presets.main.provider: unknown provider nope"
    looped = base(backend=models(a={"model-list": ["b"]}, b={"model-list": ["a"]}))
    assert error(tmp_path, looped) == "Circular model-list preset: a -> b -> a"


def test_a_preset_without_an_output_cap_gets_the_default_and_a_given_cap_is_kept(tmp_path):
    data = base(backend=models(capped={"provider": "g", "model": "m", "maxOutputTokens": 300}))
    presets = load(tmp_path, data).runner.presets
    assert presets["main"].max_output_tokens == schema.DEFAULT_MAX_OUTPUT_TOKENS == 8192
    assert presets["capped"].max_output_tokens == 300


def test_model_list_expansion_flattens_depth_first_with_duplicates(tmp_path):
    data = base(backend=models(alt={"provider": "g", "model": "alt"}, inner={"model-list": ["alt", "main"]},
                               outer={"model-list": ["main", "inner", "alt"]}))
    data["agents"]["pm"]["model"] = "outer"
    config_ = load(tmp_path, data)
    assert [p.id for p in config_.model_attempts("pm")] == ["main", "alt", "main", "alt"]
    assert [p.id for p in config_.runner.expand("main")] == ["main"]


def test_run_time_expansion_errors():
    presets = {
        "a": PresetConfig("a", model_list=("b",)), "b": PresetConfig("b", model_list=("a",)),
        "half": PresetConfig("half", provider="g"), "lost": PresetConfig("lost", provider="x", model="m"),
        "ghostly": PresetConfig("ghostly", model_list=("ghost",)),
    }
    providers = {"g": object()}
    def failure(selected):
        with pytest.raises(ConfigError) as caught:
            expand_model_list(presets, providers, selected)
        return caught.value.message
    assert failure("a") == "Circular model-list preset: a -> b -> a"
    assert failure("ghostly") == "Model preset not found: ghost"
    assert failure("half") == "Model preset needs provider and model: half"
    assert failure("lost") == "Provider not found: x"


# ---------------------------------------------------------------------------------------------------
# Scenario 47 and docs/configuration.md: scripts

SCRIPT = {"agents": {"pm": [{"steps": [{"say": "hi"}]}]}}


def scripted(script, **provider):
    data = base()
    models_ = data["backend"]["runner"]["models"]
    models_["providers"]["replay"] = dict({"type": "scripted", "script": script}, **provider)
    models_["presets"]["offline"] = {"provider": "replay", "model": "team"}
    data["agents"]["pm"]["model"] = "offline"
    data["agents"]["worker"] = {"count": 2, "model": "offline", "tools": []}
    return data


def test_script_file_is_loaded_and_stored_as_a_mapping(tmp_path):
    write(tmp_path / "s.yaml", suzumio_yaml.dump_yaml(SCRIPT))
    config_ = load(tmp_path, scripted("s.yaml"))
    assert parse_yaml(config_.render())["backend"]["runner"]["models"]["providers"]["replay"]["script"] == SCRIPT
    assert config_.data["backend"]["runner"]["models"]["providers"]["replay"]["script"] == SCRIPT
    assert config_.runner.providers["replay"].script == SCRIPT
    assert config_.runner.as_json()["models"]["providers"]["replay"]["script"] == SCRIPT


def test_script_import_resolves_against_the_declaring_fragment(tmp_path):
    write(tmp_path / "frag" / "scripts" / "s.yaml", suzumio_yaml.dump_yaml(SCRIPT))
    write(tmp_path / "frag" / "providers.yaml", "replay:\n  type: scripted\n  script: @import(scripts/s.yaml)\n")
    text = ("name: t\ntask: T\nbackend:\n  runner:\n    model: offline\n    models:\n"
            "      providers: @import(frag/providers.yaml)\n"
            "      presets: {offline: {provider: replay, model: team}}\n" + PM_YAML)
    assert load(tmp_path, text).runner.providers["replay"].script == SCRIPT


def test_script_requirements_per_provider_type(tmp_path):
    data = scripted(SCRIPT)
    del data["backend"]["runner"]["models"]["providers"]["replay"]["script"]
    assert error(tmp_path, data) == (
        "Invalid project config:\n  - backend.runner.models.providers.replay.script: Required")
    data = base()
    data["backend"]["runner"]["models"]["providers"]["g"]["script"] = "s.yaml"
    assert error(tmp_path, data) == (
        "Invalid project config:\n  - backend.runner.models.providers.g.script: Only allowed when type is scripted")


def test_script_file_must_hold_a_mapping(tmp_path):
    write(tmp_path / "s.yaml", "- a\n")
    assert error(tmp_path, scripted("s.yaml")) == (
        "backend.runner.models.providers.replay.script: Expected object, received array")
    write(tmp_path / "s.txt", "agents: {}")
    assert error(tmp_path, scripted("s.txt")) == (
        "backend.runner.models.providers.replay.script: Expected object, received string")
    assert error(tmp_path, scripted("gone.yaml")) == f"File not found: {tmp_path}/gone.yaml"


PREFIX = "backend.runner.models.providers.replay.script"


@pytest.mark.parametrize("script, where, message", [
    ({}, "agents", "Required"),
    ({"agents": []}, "agents", "Expected object, received array"),
    ({"agents": {"ghost": [{"steps": [{"say": "x"}]}]}}, "agents.ghost", "unknown agent ghost"),
    ({"agents": {"ghost-*": [{"steps": [{"say": "x"}]}]}}, "agents.ghost-*", "unknown agent ghost-*"),
    ({"agents": {"pm": {}}}, "agents.pm", "Expected array, received object"),
    ({"agents": {"pm": []}}, "agents.pm", "Array must contain at least 1 element(s)"),
    ({"agents": {"pm": ["x"]}}, "agents.pm.0", "Expected object, received string"),
    ({"agents": {"pm": [{"when": 3, "steps": [{"say": "x"}]}]}}, "agents.pm.0.when",
     "Expected string, received number"),
    ({"agents": {"pm": [{"when": "", "steps": [{"say": "x"}]}]}}, "agents.pm.0.when",
     "String must contain at least 1 character(s)"),
    ({"agents": {"pm": [{"when": "x"}]}}, "agents.pm.0.steps", "Required"),
    ({"agents": {"pm": [{"steps": "x"}]}}, "agents.pm.0.steps", "Expected array, received string"),
    ({"agents": {"pm": [{"steps": []}]}}, "agents.pm.0.steps", "Array must contain at least 1 element(s)"),
    ({"agents": {"pm": [{"steps": [1]}]}}, "agents.pm.0.steps.0", "Expected object, received number"),
    ({"agents": {"pm": [{"steps": [{}]}]}}, "agents.pm.0.steps.0", "A step needs say or tools"),
    ({"agents": {"pm": [{"steps": [{"say": None}]}]}}, "agents.pm.0.steps.0.say", "Expected string, received null"),
    ({"agents": {"pm": [{"steps": [{"tools": {}}]}]}}, "agents.pm.0.steps.0.tools", "Expected array, received object"),
    ({"agents": {"pm": [{"steps": [{"tools": ["x"]}]}]}}, "agents.pm.0.steps.0.tools.0",
     "Expected object, received string"),
    ({"agents": {"pm": [{"steps": [{"tools": [{}]}]}]}}, "agents.pm.0.steps.0.tools.0.name", "Required"),
    ({"agents": {"pm": [{"steps": [{"tools": [{"name": 1}]}]}]}}, "agents.pm.0.steps.0.tools.0.name",
     "Expected string, received number"),
    ({"agents": {"pm": [{"steps": [{"say": "a"}]}, {"steps": [{"tools": [{"name": "messages.sent"}]}]}]}},
     "agents.pm.1.steps.0.tools.0.name", f'unknown tool "messages.sent" (registered: {CORE_AND_WEB})'),
    ({"agents": {"pm": [{"steps": [{"tools": [{"name": "file.read", "input": "x"}]}]}]}},
     "agents.pm.0.steps.0.tools.0.input", "Expected object, received string"),
])
def test_script_validation_reports_the_dotted_path(tmp_path, script, where, message):
    assert error(tmp_path, scripted(script)) == f"{PREFIX}.{where}: {message}"


def test_script_accepts_prefix_keys_and_unlisted_tools_of_other_agents(tmp_path):
    script = {"ignored": 1, "agents": {"worker-*": [{"when": "go", "steps": [
        {"say": "a", "tools": [{"name": "web.fetch", "input": {"url": "http://x/"}}]}, {"say": "b"}]}]}}
    assert load(tmp_path, scripted(script)).runner.providers["replay"].script == script


SPEC_SCRIPT_YAML = """
agents:
  pm:
    - when: "Start"
      steps:
        - say: "Delegating to worker-1."
          tools:
            - name: messages.send
              input: {recipient: worker-1, body: "Write the result to {artifacts:worker-1}/result.txt"}
        - tools:
            - name: coordination.wait_for_signal
              input: {reason: "Waiting for worker-1."}
    - when: "result is ready"
      steps:
        - tools:
            - name: file.read
              input: {path: "{artifacts:worker-1}/result.txt"}
        - tools:
            - name: completion.submit
              input: {report: "# Report\\n\\nworker-1 wrote the result."}
  worker-*:
    - when: "Write the result"
      steps:
        - tools:
            - name: file.write
              input: {path: "{artifacts}/result.txt", content: "42\\n"}
        - tools:
            - name: messages.send
              input: {recipient: pm, body: "The result is ready in {artifacts}/result.txt."}
        - tools:
            - name: coordination.wait_for_signal
              input: {reason: "Reported to pm.", notifyPm: false}
"""


def test_the_script_example_of_the_spec_loads(tmp_path):
    write(tmp_path / "scripts" / "team.script.yaml", SPEC_SCRIPT_YAML)
    script = load(tmp_path, scripted("scripts/team.script.yaml")).runner.providers["replay"].script
    assert list(script["agents"]) == ["pm", "worker-*"]
    report = script["agents"]["pm"][1]["steps"][1]["tools"][0]["input"]["report"]
    assert report == "# Report\n\nworker-1 wrote the result."


def test_scripted_provider_ignores_endpoint_fields(tmp_path):
    config_ = load(tmp_path, scripted(SCRIPT, apiKeyEnv="NOPE", baseURL="http://unused"))
    assert config_.runner.providers["replay"].type == "scripted"


# ---------------------------------------------------------------------------------------------------
# Scenario 39: proxy variables

def proxy(**fields):
    defaults = {"inherit_env": True, "rewrite_localhost": True}
    return config.ProxyConfig(**dict(defaults, **fields))


def test_proxy_variables_inherit_and_rewrite_loopback_hosts():
    environ = {"HTTP_PROXY": "http://127.0.0.1:7890", "no_proxy": "localhost", "OTHER": "x"}
    variables = dict(config.proxy_environment(proxy(), None, environ))
    assert variables["HTTP_PROXY"] in ("http://host.docker.internal:7890", "http://host.docker.internal:7890/")
    assert variables == {"HTTP_PROXY": variables["HTTP_PROXY"], "no_proxy": "localhost"}
    assert config.proxy_environment(proxy(), "host", environ) == [
        ("HTTP_PROXY", "http://127.0.0.1:7890"), ("no_proxy", "localhost")]


def test_proxy_fields_override_and_drop_the_lower_case_name():
    variables = config.proxy_environment(proxy(inherit_env=False, https="http://localhost:3128"), None,
                                         {"HTTPS_PROXY": "http://ignored"})
    assert len(variables) == 1 and variables[0][0] == "HTTPS_PROXY"
    assert variables[0][1] in ("http://host.docker.internal:3128", "http://host.docker.internal:3128/")
    merged = config.proxy_environment(proxy(http="http://u:p@[::1]:8080/x?q=1"), None,
                                      {"http_proxy": "http://a", "HTTPS_PROXY": "socks5://127.0.0.1:1080"})
    assert merged == [("HTTPS_PROXY", "socks5://host.docker.internal:1080"),
                      ("HTTP_PROXY", "http://u:p@host.docker.internal:8080/x?q=1")]


def test_local_backend_proxy_variables_are_never_rewritten(tmp_path):
    data = base()
    data["backend"]["kind"] = "local"
    config_ = load(tmp_path, data)
    assert config_.proxy_environment({"HTTP_PROXY": "http://127.0.0.1:1"}) == [("HTTP_PROXY", "http://127.0.0.1:1")]


# ---------------------------------------------------------------------------------------------------
# Scenario 40: render, config_json, ProjectConfig

def test_render_is_idempotent(tmp_path):
    first = load(tmp_path, BASE)
    write(tmp_path / "r.yaml", first.render())
    second = load_project(tmp_path / "r.yaml", env={})
    assert parse_yaml(second.render()) == parse_yaml(first.render())
    assert second.data == first.data


def test_render_quotes_strings_the_dialect_would_read_as_other_types(tmp_path):
    tricky = ["#project", "true", "123", "0o17", "1e3", "1_000", "null", "~", "yes", ".inf", "2024-01-01",
              "- a", "a: b", "", " lead", "multi\nline\n", "ünïcode ✓", "x # y"]
    data = base(channels=tricky)
    data["agents"]["pm"]["env"] = {"A": "0x1F", "B": "-.5", "C": "false"}
    config_ = load(tmp_path, data)
    text = config_.render()
    assert parse_yaml(text) == config_.rendered_tree()
    assert "ünïcode ✓" in text and text.endswith("\n")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=30), max_size=5))
def test_rendered_strings_round_trip_through_the_dialect(values):
    tree = {"channels": values, "nested": {"k": values}}
    assert parse_yaml(suzumio_yaml.dump_yaml(tree)) == tree


def test_multiline_strings_render_as_literal_blocks(tmp_path):
    text = load(tmp_path, base(task="line one\nline two\n")).render()
    assert "task: |\n  line one\n  line two\n" in text


def test_project_config_exposes_source_text_path_and_immutable_data(tmp_path):
    path = write(tmp_path / "p.yaml", suzumio_yaml.dump_yaml(BASE))
    config_ = load_project(path, env={})
    assert config_.path == str(path) and config_.source_text == path.read_text()
    config_.data["name"] = "changed"
    assert config_.name == "t" and config_.data["name"] == "t"
    with pytest.raises(AttributeError):
        config_.name = "x"
    with pytest.raises(TypeError):
        config_.agent("pm").env["X"] = "1"
    assert json.loads(config_.config_json()) == config_.data


def test_specs_are_hashable_and_nested_values_cannot_be_mutated(tmp_path):
    data = base()
    data["backend"]["runner"]["models"]["providers"]["g"]["options"] = {"queryParams": {"a": "1"}}
    data["agents"]["pm"]["env"] = {"A": "1"}
    config_ = load(tmp_path, data)
    assert len({*config_.agents, *config_.toolpacks, config_.scheduler, config_.backend.docker}) == 5
    config_.runner.providers["g"].options["queryParams"]["a"] = "2"
    assert config_.runner.providers["g"].options["queryParams"] == {"a": "1"}
    assert ProjectConfig.from_data(config_.data).agent("pm") == config_.agent("pm")


def test_unknown_agent_lookup_is_not_found(tmp_path):
    with pytest.raises(NotFound):
        load(tmp_path, BASE).agent("ghost")


def test_counted_agents_share_the_entry_env_mounts_and_allowlist(tmp_path):
    data = base()
    data["agents"]["worker"] = {"count": 2, "env": {"A": "1"}, "tools": ["file.*"],
                                "mounts": [{"source": "/s", "target": "/mnt/s"}]}
    config_ = load(tmp_path, data)
    worker = config_.agent("worker-2")
    assert (worker.key, worker.env_dict(), worker.tools, worker.model, worker.selected_model) == (
        "worker", {"A": "1"}, ("file.*",), None, "main")
    assert [m.target for m in config_.mounts_for("worker-2")] == ["/mnt/s"]
    assert [t.name for t in config_.allowed_tools("worker-1")] == ["file.read", "file.write", "file.patch"]


def test_from_data_round_trip_gives_the_same_agents_toolpacks_and_render(tmp_path, packaged):
    make_toolpack(tmp_path / "tp", REVIEW_MANIFEST)
    write(tmp_path / "s.yaml", suzumio_yaml.dump_yaml(SCRIPT))
    data = scripted("s.yaml")
    data["tools"] = {"toolpacks": ["core", "shell", {"path": "tp"}, {"packaged": "plan"}]}
    data["agents"]["pm"]["tools"] = ["*"]
    loaded = load(tmp_path, data, packaged_dir=packaged)
    rebuilt = ProjectConfig.from_data(json.loads(loaded.config_json()), packaged_dir=packaged)
    assert rebuilt.agents == loaded.agents
    assert rebuilt.toolpacks == loaded.toolpacks
    assert rebuilt.render() == loaded.render()
    assert rebuilt.data == loaded.data
    assert ProjectConfig.from_data(loaded.config_json(), packaged_dir=packaged).render() == loaded.render()


def test_from_data_defaults_fields_added_after_init(tmp_path):
    stored = load(tmp_path, BASE).data
    for key in ("communication", "scheduler", "observability"):
        del stored[key]
    del stored["backend"]["activationTimeoutMs"]
    rebuilt = ProjectConfig.from_data(stored)
    assert rebuilt.communication.coordinator_agent == "pm"
    assert rebuilt.scheduler.no_effect_nudge.priority == "P3"
    assert rebuilt.backend.activation_timeout_ms == 3600000


def test_from_data_defers_toolpack_resolution_errors(tmp_path):
    make_toolpack(tmp_path / "tp", REVIEW_MANIFEST)
    stored = load(tmp_path, base(tools={"toolpacks": ["core", {"path": "tp"}]})).data
    (tmp_path / "tp" / "suzumio.toolpack.json").write_text("{not json")
    rebuilt = ProjectConfig.from_data(stored)
    assert rebuilt.agent("pm").tools == ("messages.send",)
    with pytest.raises(ConfigError) as caught:
        rebuilt.allowed_tools("pm")
    assert caught.value.message.startswith(f"Invalid toolpack manifest JSON in {tmp_path}/tp/suzumio.toolpack.json: ")


def test_resolve_toolpacks_rereads_manifests_from_disk(tmp_path):
    root = make_toolpack(tmp_path / "tp", REVIEW_MANIFEST)
    config_ = load(tmp_path, base(tools={"toolpacks": ["core", {"path": "tp"}]}))
    manifest = dict(REVIEW_MANIFEST, tools=REVIEW_MANIFEST["tools"] + [tool("review.extra")])
    (root / "suzumio.toolpack.json").write_text(json.dumps(manifest))
    assert config_.toolpack("review-tools").tool_names == ["review.summarize"]
    assert config_.resolve_toolpacks().toolpack("review-tools").tool_names == ["review.summarize", "review.extra"]


def test_typed_accessors_mirror_the_data(tmp_path):
    data = base(scheduler={"noEffectNudge": {"maxConsecutive": 1, "backoffFactor": 1.5},
                           "failedNudge": {"enabled": True}},
                communication={"restrictNonCoordinatorToCoordinator": True})
    data["backend"]["runner"].update({"maxIterations": 5, "maxToolCalls": 7})
    config_ = load(tmp_path, data)
    nudge = config_.scheduler.no_effect_nudge
    assert (nudge.enabled, nudge.max_consecutive, nudge.backoff_factor, nudge.initial_delay_ms) == (True, 1, 1.5, 30000)
    assert config_.scheduler.failed_nudge.message == schema.FAILED_NUDGE_MESSAGE
    assert config_.communication.restrict_non_coordinator_to_coordinator is True
    assert (config_.runner.max_iterations, config_.runner.max_tool_calls, config_.runner.mode) == (5, 7, "ai")
    assert config_.observability == config.ObservabilityConfig(True, "127.0.0.1", 39400, True)
    assert config_.channels == ("#project", "#blocked")
    assert config_.runner.as_json() == config_.data["backend"]["runner"]


# ---------------------------------------------------------------------------------------------------
# YAML dialect (docs/configuration.md)

@pytest.mark.parametrize("scalar, value", [
    ("true", True), ("True", True), ("FALSE", False), ("yes", "yes"), ("No", "No"), ("on", "on"), ("off", "off"),
    ("y", "y"), ("n", "n"), ("null", None), ("Null", None), ("~", None), ("", None), ("123", 123), ("-5", -5),
    ("+7", 7), ("0777", 777), ("0o17", 15), ("0x1F", 31), ("1_000", "1_000"), ("1:30", "1:30"), ("1e3", 1000.0),
    ("1.5", 1.5), (".5", 0.5), ("-2.0E-3", -0.002), ("2024-01-01", "2024-01-01"),
    ("2024-01-01T10:00:00Z", "2024-01-01T10:00:00Z"), ("=", "="),
])
def test_yaml_scalars_follow_the_1_2_core_schema(scalar, value):
    assert parse_yaml(f"k: {scalar}\n") == {"k": value}


def test_yaml_special_floats():
    parsed = parse_yaml("a: .inf\nb: -.Inf\nc: .NaN\n")
    assert parsed["a"] == float("inf") and parsed["b"] == float("-inf") and parsed["c"] != parsed["c"]


def test_yaml_merge_key_is_an_ordinary_key():
    assert parse_yaml("base: &b {x: 1}\nk:\n  <<: *b\n") == {"base": {"x": 1}, "k": {"<<": {"x": 1}}}


def test_yaml_non_string_keys_become_strings():
    assert parse_yaml("1: a\ntrue: b\n~: c\n1.5: d\n") == {"1": "a", "true": "b", "": "c", "1.5": "d"}


def test_yaml_duplicate_keys_and_multiple_documents_fail_with_the_path():
    with pytest.raises(ConfigError) as caught:
        parse_yaml("a: 1\na: 2\n", "/x/p.yaml")
    assert caught.value.message.startswith("Invalid YAML in /x/p.yaml: ")
    assert 'duplicate key "a"' in caught.value.message
    with pytest.raises(ConfigError) as caught:
        parse_yaml("a: 1\n---\nb: 2\n", "/x/p.yaml")
    assert caught.value.message.startswith("Invalid YAML in /x/p.yaml: ") and "\n" not in caught.value.message


@pytest.mark.parametrize("text", ["k: !!binary aGk=\n", "k: !!set {a: null}\n", "k: !!timestamp 2024-01-01\n",
                                  "k: !!omap [a: 1]\n"])
def test_yaml_values_outside_json_are_refused(text):
    with pytest.raises(ConfigError) as caught:
        parse_yaml(text, "/x/p.yaml")
    assert caught.value.message.startswith("Invalid YAML in /x/p.yaml: unsupported value of type")


def test_yaml_aliases_are_expanded_into_independent_copies():
    parsed = parse_yaml("a: &x [1, 2]\nb: *x\n")
    parsed["a"].append(3)
    assert parsed["b"] == [1, 2]


def test_yaml_alias_bombs_are_refused():
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    with pytest.raises(ConfigError) as caught:
        parse_yaml("\n".join(lines) + "\n", "bomb.yaml")
    assert "aliases" in caught.value.message


def test_empty_project_file_is_an_empty_mapping(tmp_path):
    assert error(tmp_path, "# only a comment\n") == "Invalid project config:\n  - name: Required\n  - task: Required"


def test_invalid_utf8_is_replaced_not_fatal(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_bytes(b'name: t\ntask: "caf\xc3"\n' + (MODELS_YAML + PM_YAML).encode())
    assert load_project(path, env={}).task == "caf\ufffd"


def test_marker_quoting_pre_pass():
    assert suzumio_yaml.quote_bare_markers("a: @import(x.md)  # c\n- @import(y.yaml)\n") == (
        'a: "@import(x.md)"  # c\n- "@import(y.yaml)"\n')
    assert suzumio_yaml.quote_bare_markers("  @import(z.yaml)\n") == '"@import(z.yaml)"'
    assert suzumio_yaml.quote_bare_markers("k: [@import(a), @import(b)]\n") == 'k: ["@import(a)", "@import(b)"]\n'
    assert suzumio_yaml.quote_bare_markers("k: {pm: @import(a)}\n") == 'k: {pm: "@import(a)"}\n'
    assert suzumio_yaml.quote_bare_markers('k: "see [@import(a)]"\n') == 'k: "see [@import(a)]"\n'
    assert suzumio_yaml.quote_bare_markers("k: [@import(a) x]\n") == "k: [@import(a) x]\n"


def test_flow_collection_markers_as_the_scenarios_write_them(tmp_path):
    write(tmp_path / "agents" / "pm.yaml", "prompt: flow\ntools: [messages.send]\n")
    text = "name: t\ntask: T\n" + MODELS_YAML + "agents: {pm: @import(agents/pm.yaml)}\n"
    assert load(tmp_path, text).agent("pm").prompt == "flow"


# ---------------------------------------------------------------------------------------------------
# docs/design/tools.md (load-time parts)

def review_project(tmp_path, **agents):
    make_toolpack(tmp_path / "toolpacks" / "review", REVIEW_MANIFEST)
    data = base(channels=["#project"],
                tools={"toolpacks": ["core", "shell", "web", {"path": "./toolpacks/review", "id": "review-tools"}]},
                agents={"pm": {"tools": ["messages.send", "coordination.wait_for_signal", "completion.submit",
                                         "file.*"]},
                        "worker": {"tools": ["*"]},
                        "reviewer": {"tools": ["messages.send", "review.summarize"]}})
    data["agents"].update(agents)
    return load(tmp_path, data)


def test_allowlist_matching_rules():
    assert registry.is_allowed("file.read", ["file.*"])
    assert not registry.is_allowed("filex.read", ["file.*"]) and not registry.is_allowed("file", ["file.*"])
    assert registry.is_allowed("file.x.y", ["file.*"])
    assert not registry.is_allowed("file.read", ["file*"]) and not registry.is_allowed("file.read", ["*.read"])
    assert registry.is_allowed("review.summarize", ["*"])
    assert not registry.is_allowed("messages.send", [])


def test_allowed_tools_per_agent_in_registration_order(tmp_path):
    config_ = review_project(tmp_path)
    assert [t.name for t in config_.allowed_tools("pm")] == [
        "messages.send", "coordination.wait_for_signal", "completion.submit", "file.read", "file.write", "file.patch"]
    assert [(t.toolpack_id, t.name) for t in config_.allowed_tools("reviewer")] == [
        ("core", "messages.send"), ("review-tools", "review.summarize")]
    names = [t.model_name for t in config_.allowed_tools("worker")]
    for expected in ("file_read", "shell_exec", "web_fetch", "review_summarize", "coordination_wait_for_signal"):
        assert expected in names


def test_local_toolpack_addressing_for_runner_input(tmp_path):
    pack = review_project(tmp_path).toolpack("review-tools")
    assert pack.container_runner_module == "/toolpacks/review-tools/runner.mjs"
    assert pack.support_path == "/toolpacks/review-tools/support"
    assert pack.runner_module_ref == f"{tmp_path}/toolpacks/review/runner.mjs"
    assert pack.has_scheduler_hook
    core = review_project(tmp_path).toolpack("core")
    assert (core.runner_module_ref, core.container_runner_module, core.has_scheduler_hook) == (
        "builtin:core", "builtin:core", False)
    assert registry.safe_toolpack_id("a b/c") == "a_b_c"


def test_builtin_tool_definitions_carry_the_spec_schemas(tmp_path):
    config_ = review_project(tmp_path)
    send = config_.tool("messages.send")
    assert send.input_schema["required"] == ["body"] and send.input_schema["additionalProperties"] is False
    assert send.input_schema["properties"]["priority"]["enum"] == ["P0", "P1", "P2", "P3"]
    assert send.support_backed and not config_.tool("file.read").support_backed
    assert "woken" in send.description
    assert "reaches no one until you report it" in config_.tool("shell.exec").description
    patch = config_.tool("file.patch").definition()
    assert patch["inputSchema"]["properties"]["operations"]["items"]["required"] == ["op", "path"]
    assert config_.tool("nope") is None


def test_webui_entries_in_config_order(tmp_path):
    entries = review_project(tmp_path).registry.webui_entries()
    assert [e.id for e in entries] == ["project.stats", "messages.conversation", "messages.send",
                                       "coordination.signals", "completion.report", "file.activity",
                                       "shell.activity", "web.activity", "review.stats"]
    assert entries[0].to_json()["toolpackKind"] == "builtin"
    assert entries[-1].to_json() == {"id": "review.stats", "title": "Review statistics", "kind": "panel",
                                     "toolpackId": "review-tools", "toolpackKind": "local"}
    assert entries[1].to_json()["submitLabel"] == "Load conversation"


def local_failure(tmp_path, manifest, runner=True, controller=True, entry=None):
    make_toolpack(tmp_path / "tp", manifest, runner, controller)
    return error(tmp_path, base(tools={"toolpacks": ["core", entry or {"path": "tp"}]}))


@pytest.mark.parametrize("manifest, message", [
    (dict(REVIEW_MANIFEST, tools=[tool("messages.send")]),
     "Tool messages.send is declared by both core and review-tools"),
    (dict(REVIEW_MANIFEST, tools=[tool("a.x"), tool("a.x")]),
     "Tool a.x is declared by both review-tools and review-tools"),
    (dict(REVIEW_MANIFEST, id="review tools"),
     "Invalid toolpack id review tools: use only letters, digits, '.', '_' and '-'"),
    ({"tools": []}, "Manifest field id is required"),
    (dict(REVIEW_MANIFEST, id="  "), "Manifest field id is required"),
    ({"id": "x"}, "Manifest field tools must be an array"),
    ({"id": "x", "tools": ["t"]}, "Each manifest tool must be an object"),
    ({"id": "x", "tools": [{"name": "t", "description": "d"}]}, "Manifest tool inputSchema must be an object"),
    ({"id": "x", "tools": [{"description": "d", "inputSchema": {}}]}, "Manifest field tool.name is required"),
    ({"id": "x", "tools": [{"name": "t", "inputSchema": {}}]}, "Manifest field tool.description is required"),
    ({"id": "x", "tools": [], "webui": {}}, "Manifest field webui must be an array"),
    ({"id": "x", "tools": [], "webui": [1]}, "Each manifest webui entry must be an object"),
    ({"id": "x", "tools": [], "webui": [{"title": "T"}]}, "Manifest field webui.id is required"),
    ({"id": "x", "tools": [], "webui": [{"id": "a b", "title": "T"}]},
     "Invalid WebUI entry id a b: use only letters, digits, '.', '_' and '-'"),
    ({"id": "x", "tools": [], "webui": [{"id": "a.b", "title": "T"}, {"id": "a.b", "title": "U"}]},
     "Duplicate WebUI entry id: a.b"),
    ({"id": "x", "tools": [], "webui": [{"id": "a", "title": "T", "inputSchema": []}]},
     "Manifest webui inputSchema must be an object"),
    ({"id": "x", "tools": [], "webui": [{"id": "a"}]}, "Manifest field webui.title is required"),
    ({"id": "x", "tools": [{"name": "t", "description": "d", "inputSchema": {"type": "objekt"}}]},
     "Manifest tool t: inputSchema is not a valid JSON Schema: 'objekt' is not valid under any of the given "
     "schemas (at type)"),
    ({"id": "x", "tools": [], "webui": [{"id": "a", "title": "T",
                                          "inputSchema": {"properties": {"n": {"minimum": "1"}}}}]},
     "Manifest webui entry a: inputSchema is not a valid JSON Schema: '1' is not of type 'number' "
     "(at properties/n/minimum)"),
    ({"id": "x", "tools": [], "webui": [{"id": "a", "title": "T", "kind": "form"}]}, "Invalid WebUI entry kind: form"),
    ({"id": "x", "tools": []}, "Toolpack x has neither tools nor WebUI entries"),
    ({"id": "x", "tools": [], "webui": []}, "Toolpack x has neither tools nor WebUI entries"),
])
def test_manifest_checks(tmp_path, manifest, message):
    assert local_failure(tmp_path, manifest) == message


def test_manifest_module_checks(tmp_path):
    root = tmp_path / "tp"
    assert local_failure(tmp_path, dict(REVIEW_MANIFEST, runner="../shared/runner.mjs")) == (
        f"Module path escapes the toolpack directory: {tmp_path}/shared/runner.mjs")
    assert local_failure(tmp_path, dict(REVIEW_MANIFEST, controller="controller.js")) == (
        f"The controller module must be a .mjs file: {root}/controller.js")
    assert local_failure(tmp_path, dict(REVIEW_MANIFEST, runner="runner.js")) == (
        f"The runner module must be a .mjs file: {root}/runner.js")
    (root / "runner.mjs").unlink()
    assert local_failure(tmp_path, REVIEW_MANIFEST, runner=False) == (
        f"Local toolpack runner module not found: {root}/runner.mjs")
    (root / "controller.mjs").unlink()
    assert local_failure(tmp_path, REVIEW_MANIFEST, runner=True, controller=False) == (
        f"Local toolpack controller module not found: {root}/controller.mjs")


def test_manifest_json_errors_and_id_mismatch(tmp_path):
    (tmp_path / "tp").mkdir()
    (tmp_path / "tp" / "suzumio.toolpack.json").write_text("{")
    assert error(tmp_path, base(tools={"toolpacks": [{"path": "tp"}]})).startswith(
        f"Invalid toolpack manifest JSON in {tmp_path}/tp/suzumio.toolpack.json: ")
    assert local_failure(tmp_path, REVIEW_MANIFEST, entry={"path": "tp", "id": "review"}) == (
        "Toolpack id mismatch: config says review, manifest says review-tools")


def test_webui_only_toolpack_needs_no_runner_module(tmp_path):
    manifest = {"id": "board", "tools": [], "webui": [{"id": "board.view", "title": "Board", "description": "d",
                                                         "inputSchema": {"type": "object"}, "submitLabel": "Go"}]}
    make_toolpack(tmp_path / "tp", manifest, runner=False)
    config_ = load(tmp_path, base(tools={"toolpacks": ["core", {"path": "tp"}]}))
    pack = config_.toolpack("board")
    assert (pack.runner_module, pack.tools) == (None, ())
    assert pack.webui[0].to_json() == {"id": "board.view", "title": "Board", "description": "d", "kind": "panel",
                                       "inputSchema": {"type": "object"}, "submitLabel": "Go",
                                       "toolpackId": "board", "toolpackKind": "local"}


def test_custom_module_paths_inside_the_root(tmp_path):
    manifest = dict(REVIEW_MANIFEST, runner="lib/r.mjs", controller="./lib/c.mjs")
    root = make_toolpack(tmp_path / "tp", manifest, runner=False, controller=False)
    (root / "lib").mkdir()
    (root / "lib" / "r.mjs").write_text("")
    (root / "lib" / "c.mjs").write_text("")
    pack = load(tmp_path, base(tools={"toolpacks": ["core", {"path": "tp"}]})).toolpack("review-tools")
    assert (pack.runner_module, pack.controller_module) == (f"{root}/lib/r.mjs", f"{root}/lib/c.mjs")
    assert pack.container_runner_module == "/toolpacks/review-tools/lib/r.mjs"


# ---------------------------------------------------------------------------------------------------
# The broken-config corpus and the examples

def corpus():
    cases = []
    for line in (BROKEN / "expected.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, message = line.split("\t", 1)
            message = message.replace("\\n", "\n").replace("\\\\", "\\").replace("{dir}", str(BROKEN))
            cases.append(pytest.param(name, message, id=name))
    return cases


def test_corpus_covers_every_broken_file_and_at_least_thirty():
    listed = {line.split("\t", 1)[0] for line in (BROKEN / "expected.txt").read_text().splitlines()
              if line and not line.startswith("#")}
    assert listed == {path.name for path in BROKEN.glob("*.yaml")}
    assert len(listed) >= 30


@pytest.mark.parametrize("name, message", corpus())
def test_broken_config_fails_with_its_exact_message(name, message):
    with pytest.raises(ConfigError) as caught:
        load_project(BROKEN / name, env={})
    assert caught.value.message == message


EXAMPLE_PROJECTS = ["smoke.yaml", "team.yaml", "demo.yaml", "imports/project.yaml"]


def test_every_example_file_is_a_project_a_fragment_or_the_demo_script():
    examples = REPO / "examples"
    files = {str(path.relative_to(examples)) for path in examples.rglob("*") if path.is_file()}
    fragments = {f for f in files if f.startswith("imports/") and f != "imports/project.yaml"}
    assert files - fragments == set(EXAMPLE_PROJECTS) | {"demo-script.yaml"}


@pytest.mark.parametrize("name", EXAMPLE_PROJECTS)
def test_examples_render_and_render_again_identically(name, tmp_path):
    config_ = load_project(REPO / "examples" / name, env={})
    write(tmp_path / "again.yaml", config_.render())
    assert parse_yaml(load_project(tmp_path / "again.yaml", env={}).render()) == parse_yaml(config_.render())
    expected_warnings = [config.LOCAL_WARNING, config.LOCAL_EGRESS_WARNING] if config_.backend.kind == "local" else []
    if name == "imports/project.yaml":  # its local-debug profile asks for the host network; no agent has network
        expected_warnings = ["Warning: backend.docker.network host is only given to agents with network, and no "
                             "agent it applies to has network"]
    assert config_.warnings == expected_warnings


def test_team_example_has_a_coordinator_two_workers_and_a_critic():
    config_ = load_project(REPO / "examples" / "team.yaml", env={})
    assert config_.agent_ids == ["pm", "worker-1", "worker-2", "critic"]
    assert [p.id for p in config_.runner.expand("main")] == ["strong", "fast"]


def test_imports_example_combines_profiles_fragments_and_text(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    config_ = load_project(REPO / "examples" / "imports" / "project.yaml", env={"USER": "ada"})
    assert config_.backend.image == "suzumio-runner:dev" and config_.backend.docker.network == "host"
    assert config_.channels == ("#project",)
    assert config_.task.startswith("Collect three facts")
    assert config_.agent("worker-2").role == "engineer" and config_.agent("worker-2").display_name == "Ren"
    assert config_.agent("worker-1").env_dict() == {"RUN_BY": "ada"}
    assert config_.agent("pm").prompt.startswith("You coordinate")


def test_demo_script_drives_every_agent_with_allowed_tools():
    config_ = load_project(REPO / "examples" / "demo.yaml", env={})
    assert config_.backend.kind == "local" and config_.scheduler.no_effect_nudge.max_consecutive == 1
    script = config_.runner.providers["replay"].script
    assert set(script["agents"]) == {"pm", "worker-1", "worker-2", "critic"}
    for agent_id, entries in script["agents"].items():
        allowed = {t.name for t in config_.allowed_tools(agent_id)}
        called = {call["name"] for entry in entries for step in entry["steps"] for call in step.get("tools", [])}
        assert called <= allowed, agent_id
    pm_calls = [call["name"] for entry in script["agents"]["pm"] for step in entry["steps"]
                for call in step.get("tools", [])]
    assert pm_calls[-1] == "completion.submit"
    worker_tools = {call["name"] for agent in ("worker-1", "worker-2") for entry in script["agents"][agent]
                    for step in entry["steps"] for call in step.get("tools", [])}
    assert {"file.write", "shell.exec", "messages.send"} <= worker_tools


def test_render_file_returns_the_yaml_and_the_warning_lines(tmp_path):
    data = base()
    data["backend"]["kind"] = "local"
    text, warnings = config.render_file(write(tmp_path / "p.yaml", data), env={})
    assert parse_yaml(text)["backend"]["kind"] == "local"
    assert warnings == [config.LOCAL_WARNING, config.LOCAL_EGRESS_WARNING]


# ------------------------------------------------ unknown keys (docs/spec-notes.md#unknown-keys-are-reported)

def test_unknown_keys_at_any_depth_are_listed_with_the_closest_known_key(tmp_path):
    data = base(agents={"pm": {"tolls": ["messages.send"], "promt": "x"}}, schedular={})
    data["backend"]["docker"] = {"proxy": {"inheritEnvv": True}, "zzz": 1}
    data["backend"]["runner"]["models"]["presets"]["main"]["temprature"] = 0.5
    loaded = load(tmp_path, data)
    assert sorted(loaded.unknown_keys) == sorted([
        "schedular: unknown key (did you mean scheduler?)",
        "backend.docker.zzz: unknown key",
        "backend.docker.proxy.inheritEnvv: unknown key (did you mean inheritEnv?)",
        "backend.runner.models.presets.main.temprature: unknown key (did you mean temperature?)",
        "agents.pm.tolls: unknown key (did you mean tools?)",
        "agents.pm.promt: unknown key (did you mean prompt?)"])
    assert "tolls" not in loaded.render() and loaded.agent("pm").tools == ()


def test_free_form_maps_and_legacy_spellings_are_not_unknown_keys(tmp_path):
    data = base(agents={"pm": {"tools": ["messages.send"], "env": {"ANYTHING": "x"}}})
    provider = data["backend"]["runner"]["models"]["providers"]["g"]
    provider.update(headers={"X-Custom": "v"}, options={"whatever": {"deep": 1}})
    data["backend"]["runner"]["models"]["presets"]["main"]["providerOptions"] = {"free": True}
    data["backend"]["runner"]["models"]["presets"]["list"] = {"model-list": ["main"]}
    data["scheduler"] = {"maxPromptMessages": 5}
    data["extends"] = []
    assert load(tmp_path, data).unknown_keys == ()
    assert schema.unknown_keys({**data, "platforms": [{"any": 1}]}) == []


def test_strict_makes_unknown_keys_one_error_and_clean_files_pass(tmp_path):
    typo = base(agents={"pm": {"tolls": ["messages.send"]}})
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, typo, strict=True)
    assert caught.value.message == ("Unknown keys in project config (strict):\n"
                                    "  - agents.pm.tolls: unknown key (did you mean tools?)")
    with pytest.raises(ConfigError):
        load(tmp_path, {"strict": True, **typo})
    assert load(tmp_path, {"strict": True, **BASE}).data["strict"] is True
    assert "strict" not in load(tmp_path, BASE).data
    assert schema.unknown_keys({"name": "x", "nmae": "y", "agents": {"pm": {"tolls": 1}}}) == [
        "nmae: unknown key (did you mean name?)", "agents.pm.tolls: unknown key (did you mean tools?)"]


def test_every_built_in_input_schema_passes_the_json_schema_check():
    project = config.ProjectConfig.from_data(
        {"name": "x", "task": "t", "agents": {"pm": {}}, "tools": {"toolpacks": ["core", "shell", "web"]}})
    checked = 0
    for pack in project.toolpacks:
        for tool in pack.tools:
            registry.check_json_schema(tool.input_schema, tool.name)
            checked += 1
        for entry in pack.webui:
            if entry.input_schema is not None:
                registry.check_json_schema(entry.input_schema, entry.id)
                checked += 1
    assert checked > 10


def test_artifact_quota_is_a_size_overridable_per_agent_and_false_warns(tmp_path):
    data = docker_base({}, worker={"tools": [], "artifactQuota": "500MB"})
    config_ = load(tmp_path, data)
    assert config_.artifact_quota("pm") == 2 * 2**30  # the default, per agent
    assert config_.artifact_quota("worker") == 500 * 10**6
    assert config_.warnings == []
    data["backend"]["artifactQuota"] = False
    data["agents"]["worker"]["artifactQuota"] = 1024
    config_ = load(tmp_path, data)
    assert (config_.artifact_quota("pm"), config_.artifact_quota("worker")) == (None, 1024)
    assert config_.warnings == ["Warning: backend.artifactQuota false lets an agent fill the host's disk"]
    for bad in ("lots", "0", -5, "2 parsecs", True):
        data["backend"]["artifactQuota"] = bad
        with pytest.raises(config.ConfigError, match=r"backend\.artifactQuota"):
            load(tmp_path, data)
