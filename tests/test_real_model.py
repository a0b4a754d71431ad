"""Suzumio with a real model (docs/real-models.md): the offline lab's Qwen2.5-Coder-1.5B on llama.cpp's server,
at temperature 0 with a fixed seed. The README's quick start, verbatim but for the provider's address and the
pinned sampling, reaches `submitted` with its poem on docker-chat; a coordinator and two workers finish a small
task on `local`; and the pieces of the protocol hold against the real server. SUZUMIO_LOCAL_MODEL_SETTINGS names
the lab's settings.env (`make test-real-model`); SUZUMIO_REQUIRE_REAL_MODEL=1 turns a missing lab into a failure.
They take the machine's cores: run them one at a time, never beside the stress target."""
import json
import os
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import free_port, require, wait_until
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip

import suzumio_model_proxy
import suzumio_runner_calls as calls

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[1]
SEED = 7
# Generous: on two loaded cores the model writes a few tokens a second; a finished run takes a minute or two.
RUN_TIMEOUT = 900
# Each look at the status is a CLI process: polled fast, it takes a core from the model.
POLL = 3


@pytest.fixture(scope="module")
def lab():
    path = os.environ.get("SUZUMIO_LOCAL_MODEL_SETTINGS")
    if not path or not Path(path).is_file():
        require("real_model")("no local-model lab: run `make test-real-model` (or scripts/local-model up and set "
                              "SUZUMIO_LOCAL_MODEL_SETTINGS)")
    settings = dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)
    base = settings["SUZUMIO_LOCAL_MODEL_BASE_URL"]
    with urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=10) as answer:
        assert json.loads(answer.read())["status"] == "ok"
    return settings


def pinned(preset):
    """A preset at temperature 0 with the fixed seed: what a real-model test asserts must not hang on luck."""
    return dict(preset, temperature=0, providerOptions={"openaiCompatible": {"seed": SEED}})


def readme_quick_start():
    """hello.yaml and the shell commands of the README's "Quick start with a real model", as printed there."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quick start with a real model"):]
    section = section[:section.index("\n## ", 1)]
    config = yaml.safe_load(textwrap.dedent(re.search(r"```yaml\n(.*?)```", section, re.S).group(1)))
    commands = [line.strip().split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)
                for line in block.splitlines() if line.strip().startswith("suzumio ")]
    return config, commands


def cli(root, env, *argv, check=True):
    result = subprocess.run([sys.executable, str(REPO / "suzumio.py"), *argv], capture_output=True, text=True,
                            env=dict(env, SUZUMIO_ROOT=str(root)), timeout=120)
    if check:
        assert result.returncode == 0, f"suzumio {' '.join(argv)}: {result.stderr}"
    return result


def status(root, env, project):
    [found] = json.loads(cli(root, env, "status", project, "--json").stdout)
    return found


@pytest.mark.docker
def test_the_readme_quick_start_submits_the_poem_on_docker_chat(tmp_path, lab):
    runner_image_or_skip(docker_client_or_skip())
    config, commands = readme_quick_start()
    assert commands[:3] == ["suzumio config render hello.yaml", "suzumio init hello.yaml", "suzumio serve"]
    assert commands[3:5] == ["suzumio start hello", 'suzumio send hello pm P3 "Please begin."']
    presets = config["backend"]["runner"]["models"]["presets"]
    presets["main"] = pinned(presets["main"])
    config["backend"]["image"] = RUNNER_IMAGE
    (tmp_path / "hello.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    root = tmp_path / "root"
    env = dict(os.environ, SUZUMIO_GATEWAY_BASE_URL=lab["SUZUMIO_LOCAL_MODEL_BASE_URL"],
               SUZUMIO_GATEWAY_API_KEY=lab["SUZUMIO_LOCAL_MODEL_API_KEY"])
    os.chdir(tmp_path)
    cli(root, env, "config", "render", "hello.yaml")
    cli(root, env, "init", "hello.yaml")
    serve = subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "serve", "--port", str(free_port())],
                             env=dict(env, SUZUMIO_ROOT=str(root)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (root / "run").exists() and any((root / "run").iterdir()), 60, message="serve listening")
        cli(root, env, "start", "hello")
        cli(root, env, "send", "hello", "pm", "P3", "Please begin.")
        wait_until(lambda: status(root, env, "hello")["status"] in ("submitted", "stopped", "failed"),
                   RUN_TIMEOUT, interval=POLL, message="the team submitted")
        assert status(root, env, "hello")["status"] == "submitted"
        poem = root / "hello" / "artifacts" / "pm" / "poem.md"
        assert poem.is_file() and poem.read_text().strip()
        assert (root / "hello" / "final-report.md").read_text().strip()
    finally:
        serve.terminate()
        serve.wait(30)


TEAM = {
    "name": "haiku",
    "task": ("Make a two-poem booklet. worker-1 writes a haiku about the sea to its artifact folder as sea.md; "
             "worker-2 writes a haiku about the mountains to its artifact folder as mountains.md. When both "
             "have reported, pm submits a final report that names both files."),
    "agents": {
        "pm": {"role": "coordinator", "prompt": "Delegate one poem to each worker, then wait for both reports.",
               "tools": ["messages.send", "coordination.wait_for_signal", "completion.submit", "file.read"]},
        "worker-1": {"role": "poet", "tools": ["messages.send", "coordination.wait_for_signal", "file.*"]},
        "worker-2": {"role": "poet", "tools": ["messages.send", "coordination.wait_for_signal", "file.*"]},
    },
}


def test_a_coordinator_and_two_workers_finish_a_small_task_on_local(tmp_path, lab):
    config = dict(TEAM, backend={"kind": "local", "runner": {"model": "local", "models": {
        "providers": {"lab": {"type": "openai-compatible", "baseURLEnv": "SUZUMIO_LOCAL_MODEL_BASE_URL",
                              "apiKeyEnv": "SUZUMIO_LOCAL_MODEL_API_KEY"}},
        "presets": {"local": pinned({"provider": "lab", "model": lab["SUZUMIO_LOCAL_MODEL_NAME"]})}}}})
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    root = tmp_path / "root"
    env = dict(os.environ, **{k: v for k, v in lab.items() if k.startswith("SUZUMIO_LOCAL_MODEL_")})
    cli(root, env, "init", str(tmp_path / "team.yaml"))
    serve = subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "serve", "--port", str(free_port())],
                             env=dict(env, SUZUMIO_ROOT=str(root)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (root / "run").exists() and any((root / "run").iterdir()), 60, message="serve listening")
        cli(root, env, "start", "haiku")
        cli(root, env, "send", "haiku", "pm", "P3", "Please begin.")
        wait_until(lambda: status(root, env, "haiku")["status"] in ("submitted", "stopped", "failed"),
                   RUN_TIMEOUT, interval=POLL, message="the team submitted")
        assert status(root, env, "haiku")["status"] == "submitted"
        artifacts = root / "haiku" / "artifacts"
        assert (artifacts / "worker-1" / "sea.md").read_text().strip()
        assert (artifacts / "worker-2" / "mountains.md").read_text().strip()
        report = (root / "haiku" / "final-report.md").read_text()
        assert "sea.md" in report and "mountains.md" in report
    finally:
        serve.terminate()
        serve.wait(30)


# ---------------------------------------------------------------- the protocol against the real server

WRITE = {"type": "function", "function": {"name": "file_write", "description": "Write a whole file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}}}


def forward(lab, body):
    """One request through the controller's model proxy (it streams upstream and hands back the whole answer)."""
    from suzumio_config import ProjectConfig

    config = ProjectConfig.from_data({"name": "p", "task": "t", "agents": {"pm": {}}, "backend": {"runner": {
        "model": "local", "models": {"providers": {"lab": {"type": "openai-compatible", "baseURLEnv": "LAB_URL"}},
                                     "presets": {"local": {"provider": "lab", "model": "m"}}}}}})
    answer = suzumio_model_proxy.ModelProxy({"LAB_URL": lab["SUZUMIO_LOCAL_MODEL_BASE_URL"]}).forward(
        config, "pm", "lab", "local", dict(body, model=lab["SUZUMIO_LOCAL_MODEL_NAME"], temperature=0, seed=SEED))
    assert answer.status == 200, answer.body
    return json.loads(answer.body)


def test_a_streamed_tool_call_comes_back_whole_through_the_model_proxy(lab):
    data = forward(lab, {"messages": [
        {"role": "system", "content": "You act only by calling tools."},
        {"role": "user", "content": "Write the word hello to the file /workspace/a.txt."}], "tools": [WRITE]})
    [call] = data["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "file_write"
    assert json.loads(call["function"]["arguments"])["path"] == "/workspace/a.txt"
    assert data["usage"]["prompt_tokens"] > 0


def test_a_history_with_string_arguments_is_not_encoded_twice(lab):
    # The lab's template writes arguments the history holds as a JSON string as they are: the next call the
    # model makes has plain JSON arguments, not a string inside a string.
    first = {"id": "c1", "type": "function", "function": {"name": "file_write",
                                                           "arguments": '{"path": "a.txt", "content": "one"}'}}
    data = forward(lab, {"messages": [
        {"role": "system", "content": "You act only by calling tools."},
        {"role": "user", "content": "Write one to a.txt, then two to b.txt."},
        {"role": "assistant", "content": "", "tool_calls": [first]},
        {"role": "tool", "tool_call_id": "c1", "content": "Wrote a.txt"}], "tools": [WRITE]})
    [call] = data["choices"][0]["message"]["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments, dict) and arguments["path"].endswith("b.txt")


def test_a_call_the_model_writes_as_text_is_read_as_a_call(lab):
    data = forward(lab, {"messages": [
        {"role": "system", "content": 'Answer with one JSON object {"name": ..., "arguments": {...}} and nothing '
                                      "else. The only function is file_write(path, content)."},
        {"role": "user", "content": "Write the word hello to /workspace/a.txt."}]})
    text = data["choices"][0]["message"]["content"]
    [call] = calls.calls_in_text(text)
    assert calls.resolve_tool(call.name, {"file_write": "W"}) == "W"
    assert json.loads(call.arguments)["path"] == "/workspace/a.txt"
