"""`make demo` as a user runs it: scripts/demo.py from a fresh shell, on the `local` backend and on the
offline runner image with a real Docker engine, ending with a submitted project and its report."""
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from api_fixtures import serving
from provisioning_fixtures import docker_client_or_skip, runner_image_or_skip

import suzumio
import suzumio_runtime
import suzumio_store

REPO = Path(__file__).resolve().parent.parent


def run_demo(tmp_path, backend):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    root = tmp_path / "demo-root"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--exit-when-done", "--backend", backend,
         "--root", str(root), "--port", "0", "--timeout", "90"],
        capture_output=True, text=True, env=env, timeout=180, stdin=subprocess.DEVNULL, check=False)
    return result, root


def assert_team_finished(result, root, backend):
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"Suzumio demo: {backend} backend" in out
    for agent in ("pm", "worker-1", "worker-2", "critic"):
        assert f"▶ {agent} wakes up" in out
    assert "worker-1 → file.write" in out or "worker-1 → shell.exec" in out
    assert "✓ pm submitted the final report" in out
    assert "--- final report" in out and "# Greeting card" in out
    assert re.search(r"Submitted in \d+\.\d s\.", out)
    store = suzumio_store.Root(root).open_project("demo")
    assert store.project()["status"] == "submitted"
    assert (root / "demo" / "final-report.md").read_text().startswith("# Greeting card")
    assert all(a["status"] != "failed" for a in store.list_activations())


def test_demo_runs_offline_on_the_local_backend(tmp_path):
    result, root = run_demo(tmp_path, "local")
    assert_team_finished(result, root, "local")


@pytest.mark.docker
def test_demo_runs_on_the_offline_runner_image(tmp_path):
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    result, root = run_demo(tmp_path, "docker")
    assert_team_finished(result, root, "docker")
    names = {a["containerName"] for a in suzumio_store.Root(root).open_project("demo").list_activations()}
    containers = [client.containers.get(name) for name in names]
    try:
        assert {c.labels.get("suzumio.agent") for c in containers} == {"pm", "worker-1", "worker-2", "critic"}
        assert {c.labels.get("suzumio.project") for c in containers} == {"demo"}
    finally:
        for container in containers:
            container.remove(force=True)


OTHER = """\
name: other
task: T
backend:
  kind: local
  runner:
    model: offline
    models:
      providers: {replay: {type: scripted, script: {agents: {}}}}
      presets: {offline: {provider: replay, model: m}}
agents:
  pm: {tools: [messages.send]}
"""


def init_other(tmp_path, root):
    path = tmp_path / "other.yaml"
    path.write_text(OTHER)
    result = subprocess.run([sys.executable, str(REPO / "suzumio.py"), "init", str(path), "--root", str(root)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_a_second_demo_replaces_only_its_own_project(tmp_path):
    root = tmp_path / "demo-root"
    init_other(tmp_path, root)
    (root / "demo").mkdir()  # what an earlier demo left, as far as this one is concerned
    (root / "demo" / "stale.txt").write_text("from before")
    result, root = run_demo(tmp_path, "local")
    assert_team_finished(result, root, "local")
    assert not (root / "demo" / "stale.txt").exists()
    assert suzumio_store.Root(root).open_project("other").project()["status"] == "initialized"


def test_the_demo_leaves_a_root_a_running_serve_holds_alone(tmp_path):
    root = tmp_path / "demo-root"
    init_other(tmp_path, root)
    serve = subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "serve", "--root", str(root), "--port", "0",
                              "--no-scheduler"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             stdin=subprocess.DEVNULL)
    try:
        address = re.fullmatch(r"suzumio listening on (\S+)\n", serve.stdout.readline()).group(1)
        result, _ = run_demo(tmp_path, "local")
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr == (
            f"A suzumio serve (process {serve.pid}, {address}) is running on {root}; the demo leaves it alone. "
            f'Stop it (kill {serve.pid}), or run the demo on another root: make demo DEMO_ARGS="--root other-root"\n')
        assert serve.poll() is None
        assert suzumio_store.Root(root).list_projects() == ["other"]
        assert (root / "serve.lock").exists() and suzumio_runtime.live_runner_socket(root) is not None
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)


def test_the_offline_demo_replays_from_its_recording_and_a_changed_prompt_diverges(tmp_path):
    """The scripted provider's turns are recorded like any provider's: a replay of the demo plays the
    script not once, and a replay with pm's prompt changed parts from the recording at pm's first request."""
    result, root = run_demo(tmp_path, "local")
    assert_team_finished(result, root, "local")
    with serving(root):
        out, err = io.StringIO(), io.StringIO()
        code = suzumio.main(["replay", "demo", "--as", "demo-again", "--wait", "--root", str(root)], out=out, err=err)
        assert (code, err.getvalue()) == (0, ""), out.getvalue()
        assert out.getvalue() == "Replaying demo as demo-again\ndemo-again: submitted\n"
        source, copy = (suzumio_store.Root(root).open_project(name) for name in ("demo", "demo-again"))
        assert len(source.exchanges()) >= 8  # every step of the script the demo played
        assert len(copy.exchanges()) == len(source.exchanges())
        assert {exchange["replayed"] for exchange in copy.exchanges()} == {True}  # the script was never played
        # the same report, naming the replay's own folders
        assert copy.report_path.read_text().replace(str(copy.dir), str(source.dir)) == source.report_path.read_text()

        config = yaml.safe_load((root / "demo.yaml").read_text())
        config["agents"]["pm"]["prompt"] = "Lead the team in haiku."
        changed = root / "demo-changed.yaml"  # beside demo.yaml: its script path resolves from there
        changed.write_text(yaml.safe_dump(config))
        out = io.StringIO()
        code = suzumio.main(["replay", "demo", "--as", "demo-changed", "--config", str(changed), "--wait",
                             "--root", str(root)], out=out, err=io.StringIO())
        assert code == 1, out.getvalue()
        assert out.getvalue().startswith("Replaying demo as demo-changed\ndemo-changed: diverged at pm ")
        assert "Lead the team in haiku." in out.getvalue()
        assert out.getvalue().endswith("demo-changed: stopped\n")
