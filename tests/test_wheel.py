"""The regular (non-editable) wheel as `pip install` gives it to a user: built with `pip wheel . --no-deps`,
installed into a fresh venv (its dependencies from the package index this machine is configured for),
then run from an empty folder: init, serve, start, send of a scripted one-agent project on the `local`
backend until the activation completed, the control room at `/`, the packaged toolpacks, the runner
files and the Node host found where the wheel put them (<prefix>/share/suzumio)."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import requests
from conftest import free_port, wait_until

import suzumio_resources

REPO = Path(__file__).resolve().parent.parent
SHARE = ("share", "suzumio")

pytestmark = pytest.mark.slow

PROJECT = """\
name: wheeled
task: Run one activation from an installed wheel.
backend:
  kind: local
  controllerUrl: http://127.0.0.1:{port}
  runner:
    model: offline
    models:
      providers:
        replay:
          type: scripted
          script:
            agents:
              pm:
                - steps:
                    - tools:
                        - name: completion.submit
                          input: {{report: "Installed."}}
      presets:
        offline: {{provider: replay, model: team}}
tools:
  toolpacks: [core, {{packaged: plan}}, {{packaged: scheduler}}]
agents:
  pm:
    tools: [completion.submit]
"""


def test_data_files_list_every_runtime_file():
    with open(REPO / "pyproject.toml", "rb") as handle:
        data_files = tomllib.load(handle)["tool"]["setuptools"]["data-files"]
    listed = {}
    for target, patterns in data_files.items():
        for pattern in patterns:
            for path in glob.glob(str(REPO / pattern)):
                if Path(path).is_file():
                    listed[Path(path).relative_to(REPO)] = target
    wanted = {Path("suzumio_toolpack_host.mjs")}
    for directory in ("webui_dist", "toolpacks", "examples"):
        wanted |= {p.relative_to(REPO) for p in (REPO / directory).rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts}
    assert set(listed) == wanted
    for path, target in listed.items():  # each lands where resource_path looks: share/suzumio/<path>
        assert Path(target) == Path(*SHARE, path.parent), (path, target)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the wheel installed; yields (venv, clean environment, empty working folder)."""
    base = tmp_path_factory.mktemp("wheel")
    wheels = base / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(wheels),
                            "--quiet"], capture_output=True, text=True, timeout=600, cwd=base)
    assert build.returncode == 0, build.stderr
    wheel, = wheels.glob("suzumio-*.whl")
    assert wheel.name.startswith(f"suzumio-{suzumio_resources.VERSION}-")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr
    work = base / "work"
    work.mkdir()
    path = [str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    if shutil.which("node"):
        path.insert(1, str(Path(shutil.which("node")).parent))
    env = {"PATH": os.pathsep.join(path), "HOME": str(base), "LANG": "C.UTF-8"}
    return venv, env, work


def run(installed, *args, timeout=120):
    venv, env, work = installed
    return subprocess.run([str(venv / "bin" / "suzumio"), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=work, timeout=timeout, stdin=subprocess.DEVNULL)


def test_the_wheel_puts_the_runtime_files_under_share_and_nothing_beside_the_modules(installed):
    venv, env, work = installed
    share = venv.joinpath(*SHARE)
    for relative in ("suzumio_toolpack_host.mjs", "webui_dist/index.html", "toolpacks/plan/suzumio.toolpack.json",
                     "toolpacks/scheduler/suzumio.toolpack.json"):
        assert (share / relative).is_file(), relative
    probe = ("import suzumio_api, suzumio_backend, suzumio_node, suzumio_registry, suzumio_runner_loop\n"
             "print(suzumio_api.WEBUI_DIR); print(suzumio_registry.packaged_toolpacks_dir())\n"
             "print(suzumio_node.default_script_path()); print(suzumio_runner_loop.default_host_path())\n"
             "print(suzumio_backend.SUPPORT_DIR)\n")
    result = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env,
                            cwd=work, timeout=60, check=True)
    webui, toolpacks, host, runner_host, support = result.stdout.splitlines()
    assert Path(webui) == share / "webui_dist" and Path(toolpacks) == share / "toolpacks"
    assert Path(host) == Path(runner_host) == share / "suzumio_toolpack_host.mjs"
    assert not (Path(support) / "webui_dist").exists()  # the modules' folder is site-packages
    assert (Path(support) / "suzumio_runner.py").is_file()


def test_the_installed_cli_writes_the_examples_and_inits_one(installed, tmp_path):
    work = installed[2]
    folder = work / "examples-here"
    written = run(installed, "examples", folder)
    assert written.returncode == 0, written.stderr
    assert sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file()) == sorted(
        p.relative_to(REPO / "examples") for p in (REPO / "examples").rglob("*") if p.is_file())
    init = run(installed, "init", folder / "demo.yaml", "--root", tmp_path / "root")
    assert init.returncode == 0, init.stderr


def test_the_installed_cli_prints_its_help_and_version(installed):
    assert run(installed, "--version").stdout == f"suzumio {suzumio_resources.VERSION}\n"
    result = run(installed, "serve", "--help")
    assert result.returncode == 0 and result.stdout.startswith("Usage: suzumio serve ")


def test_the_installed_wheel_runs_an_activation_and_serves_the_control_room(installed, tmp_path):
    venv, env, work = installed
    port, root = free_port(), tmp_path / "root"
    project = work / "wheeled.yaml"
    project.write_text(textwrap.dedent(PROJECT.format(port=port)))
    rendered = run(installed, "config", "render", project)
    assert rendered.returncode == 0, rendered.stderr
    assert "packaged: plan" in rendered.stdout  # resolved: a missing toolpack fails the render
    init = run(installed, "init", project, "--root", root)
    assert init.returncode == 0, init.stderr
    serve = subprocess.Popen([str(venv / "bin" / "suzumio"), "serve", "--root", str(root), "--port", str(port)],
                             env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout.readline() == f"suzumio listening on http://127.0.0.1:{port}\n"
        url = f"http://127.0.0.1:{port}"
        index = requests.get(url + "/", timeout=10)
        assert index.status_code == 200 and "<html" in index.text.lower()
        assert index.headers["Suzumio-Version"] == suzumio_resources.VERSION
        auth = {"Authorization": f"Bearer {(root / 'api-token').read_text().strip()}"}
        assert requests.get(url + "/api/version", headers=auth, timeout=10).json() == {
            "version": suzumio_resources.VERSION}
        started = run(installed, "start", "wheeled", "--root", root)
        assert started.returncode == 0, started.stderr
        sent = run(installed, "send", "wheeled", "pm", "P3", "Go.", "--root", root)
        assert sent.returncode == 0, sent.stderr

        def completed():
            answer = requests.get(f"{url}/api/projects/wheeled/activations", headers=auth, timeout=10).json()
            return [a for a in answer if a["status"] in ("completed", "failed")]

        activation, = wait_until(completed, timeout=120, interval=0.2, message="the activation to end")
        assert activation["status"] == "completed", activation
        tool_status = requests.get(f"{url}/api/projects/wheeled/tool-status", headers=auth, timeout=10).json()
        assert {"plan", "scheduler"} <= {t.get("toolpackId") for t in tool_status}
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        serve.stdout.close()
        serve.stderr.close()
