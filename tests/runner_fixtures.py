"""Builders for runner tests: activation input files shaped like the backend writes them
(docs/design/runner.md), built-in toolpack specs, and running suzumio_runner.py as a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "suzumio_runner.py"
TOKEN = "tok-secret-4242"
API_KEY = "sk-live-key-9f8e7d"

TOOL_DEFS = {
    "messages.send": "Send a message to another agent or a channel.",
    "coordination.wait_for_signal": "End this activation and wait for a future signal.",
    "completion.submit": "Submit the final report for user approval.",
    "file.read": "Read a file under /workspace, /artifacts or /mnt, or a path relative to /workspace.",
    "file.write": "Write a file under /workspace or your own /artifacts/<agent-id>.",
    "file.patch": "Apply add/update/delete operations.",
    "shell.exec": "Run a bash command; it notifies nobody, report important results with messages.send.",
    "web.fetch": "Fetch a URL.",
}
PACKS = (
    (
        "core",
        (
            "messages.send",
            "coordination.wait_for_signal",
            "completion.submit",
            "file.read",
            "file.write",
            "file.patch",
        ),
    ),
    ("shell", ("shell.exec",)),
    ("web", ("web.fetch",)),
)


def tool_def(name):
    return {
        "name": name,
        "description": TOOL_DEFS.get(name, name),
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Path under /workspace."}},
        },
    }


def builtin_toolpacks(allowed=None):
    """RunnerToolpackSpecs for core, shell and web, keeping only `allowed` tool names when given."""
    specs = []
    for pack, names in PACKS:
        tools = [tool_def(name) for name in names if allowed is None or name in allowed]
        if tools:
            specs.append(
                {
                    "id": pack,
                    "tools": tools,
                    "runnerModule": f"builtin:{pack}",
                    "supportPath": f"/toolpacks/{pack}/support",
                }
            )
    return specs


def history_row(sequence, role="user", kind="activation_prompt", content="Start", **extra):
    row = {
        "id": f"hist_{sequence}",
        "project": "demo",
        "agentId": "worker",
        "role": role,
        "kind": kind,
        "content": content,
        "sequence": sequence,
        "archived": False,
        "metadata": {},
        "parts": [],
        "createdAt": f"2026-06-02T00:00:{sequence % 60:02d}.000Z",
    }
    row.update(extra)
    return row


def provider_config(base_url, **extra):
    provider = {"type": "openai-compatible", "baseURL": base_url, "apiKeyEnv": "GW_KEY"}
    provider.update(extra)
    return provider


def make_input(
    tmp_path,
    controller_url,
    base_url="http://127.0.0.1:9/v1",
    toolpacks=None,
    history=None,
    runner=None,
    prompt="Start",
):
    """An input.json dict with temp workspace and artifact roots (local-backend layout)."""
    workspace = tmp_path / "ws"
    artifacts = tmp_path / "artifacts"
    for folder in (workspace, artifacts / "worker", artifacts / "pm"):
        folder.mkdir(parents=True, exist_ok=True)
    workspace, artifacts = os.path.realpath(workspace), os.path.realpath(artifacts)
    if history is None:
        history = [history_row(1, content=prompt)]
    if runner is None:
        runner = {
            "mode": "ai",
            "model": "main",
            "models": {
                "providers": {"gw": provider_config(base_url)},
                "presets": {"main": {"provider": "gw", "model": "m1"}},
            },
        }
    toolpacks = builtin_toolpacks() if toolpacks is None else toolpacks
    return {
        "project": "demo",
        "agent": {"id": "worker", "displayName": "Worker", "role": "worker", "prompt": "Do the work."},
        "activation": {"id": "act_1", "prompt": prompt},
        "workspace": workspace,
        "artifactsRoot": artifacts,
        "readRoots": [workspace, artifacts],
        "writeRoots": [workspace, artifacts + "/worker"],
        "controllerUrl": controller_url,
        "token": TOKEN,
        "runner": runner,
        "tools": [tool for spec in toolpacks for tool in spec["tools"]],
        "toolpacks": toolpacks,
        "history": history,
        "someFutureKey": {"ignored": True},
    }


def write_input(tmp_path, activation):
    path = tmp_path / "input.json"
    path.write_text(json.dumps(activation, indent=2) + "\n")
    path.chmod(0o600)
    return path


def runner_env(**extra):
    """The runner's environment as a backend builds it: no provider key (the controller holds it)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "SUZUMIO_TOKEN": TOKEN,
    }
    env.update(extra)
    return env


def run_runner(tmp_path, activation, env=None, timeout=60, runner_path=RUNNER):
    """Run the runner as the backends do; returns the CompletedProcess (text mode)."""
    path = write_input(tmp_path, activation)
    return subprocess.run(
        [sys.executable, str(runner_path), "--input", str(path)],
        cwd=activation["workspace"],
        env=env if env is not None else runner_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_runner(tmp_path, activation, env=None, runner_path=RUNNER):
    """Start the runner without waiting (for signal tests)."""
    path = write_input(tmp_path, activation)
    return subprocess.Popen(
        [sys.executable, str(runner_path), "--input", str(path)],
        cwd=activation["workspace"],
        env=env if env is not None else runner_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
