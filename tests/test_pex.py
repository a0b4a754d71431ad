"""suzumio.pex as a user ships it: scripts/build-pex builds it once for this module; each scenario copies
it alone into an empty folder and runs `python3 suzumio.pex …` there with a clean environment whose
HOME is a fresh folder, so the pex unpacks into its own PEX_ROOT and nothing of the source tree is
reachable. Covers the CLI, a full team run on the `local` backend, packaged toolpacks and the Docker
backend mounting the runner files from inside the unpacked pex."""
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest
import requests
import yaml
from conftest import free_port, wait_until
from mcp_fixtures import install_mcp_servers
from provisioning_fixtures import RUNNER_IMAGE, docker_client_or_skip, runner_image_or_skip

import suzumio_backend
import suzumio_runtime

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
# The interpreter behind the test venv, reached as `python3` on the clean PATH.
HOST_PYTHON = Path(sys._base_executable).resolve()
RUNNER_FILES = suzumio_backend.RUNNER_FILES
TEAM = ("pm", "worker-1", "worker-2", "critic")
TEAM_TIMEOUT = 150
# The first test also waits for the build (about half a minute, much longer on a loaded machine).
pytestmark = pytest.mark.timeout(900)


def build_inputs_hash():
    """sha256 over everything scripts/build-pex reads: the script, pyproject, the runtime files and the
    versions installed in the venv its pins come from."""
    digest = hashlib.sha256()
    files = [REPO / "scripts" / "build-pex", REPO / "pyproject.toml", REPO / "suzumio_toolpack_host.mjs",
             *REPO.glob("suzumio*.py"), *(REPO / "webui_dist").rglob("*"), *(REPO / "toolpacks").rglob("*")]
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    pins = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    digest.update("\n".join(pins).encode())
    return digest.hexdigest()[:24]


@pytest.fixture(scope="module")
def pex_file(tmp_path_factory):
    """scripts/build-pex run on the working tree, once per session; reused from the temp directory while
    none of its inputs changed (a build takes about half a minute)."""
    build_dir = tmp_path_factory.mktemp("build")
    output = build_dir / "suzumio.pex"
    inputs = build_inputs_hash()
    cached = Path(tempfile.gettempdir()) / "suzumio-pex-cache" / f"suzumio-{inputs}.pex"
    with contextlib.suppress(FileNotFoundError):
        # A private copy: another session may prune the cache while this module runs.
        shutil.copy2(cached, output)
        return output
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "build-pex"), "-o", str(output)],
                            check=False, capture_output=True, text=True, timeout=900,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    size = output.stat().st_size
    assert f"suzumio.pex: {size / 1e6:.1f} MB ({size} bytes)" in result.stdout
    if build_inputs_hash() == inputs:  # nothing changed while it was building
        cached.parent.mkdir(exist_ok=True)
        for stale in cached.parent.glob("suzumio-*.pex"):
            stale.unlink(missing_ok=True)
        partial = cached.with_name(f"{cached.name}.{os.getpid()}.partial")
        shutil.copy2(output, partial)
        partial.replace(cached)
    return output


class Host:
    """An empty folder holding only suzumio.pex, and the clean environment a user's shell would have."""

    def __init__(self, base, pex_file):
        self.workdir = base / "host"
        self.workdir.mkdir()
        self.pex = self.workdir / "suzumio.pex"
        shutil.copy2(pex_file, self.pex)
        self.home = base / "home"
        self.home.mkdir()
        path = [str(HOST_PYTHON.parent), "/usr/local/bin", "/usr/bin", "/bin"]
        node = shutil.which("node")
        if node:
            path.insert(1, str(Path(node).parent))
        self.env = {"PATH": os.pathsep.join(path), "HOME": str(self.home), "LANG": "C.UTF-8"}
        if os.environ.get("DOCKER_HOST"):
            self.env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]

    def argv(self, *args):
        return ["python3", "suzumio.pex", *map(str, args)]

    def run(self, *args, timeout=120):
        return subprocess.run(self.argv(*args), check=False, cwd=self.workdir, env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def ok(self, *args):
        result = self.run(*args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    @contextlib.contextmanager
    def serving(self, root, port):
        """`suzumio.pex serve` in the background; yields its base URL; SIGTERM at the end."""
        log_path = root.parent / f"serve-{port}.log"
        with open(log_path, "w") as log_file:
            process = subprocess.Popen(self.argv("serve", "--root", root, "--port", port), cwd=self.workdir,
                                       env=self.env, stdout=subprocess.PIPE, stderr=log_file, text=True,
                                       stdin=subprocess.DEVNULL)
            try:
                line = process.stdout.readline()
                assert line == f"suzumio listening on http://127.0.0.1:{port}\n", (line, log_path.read_text())
                token = (root / "api-token").read_text().strip()
                assert process.stdout.readline() == f"Control room: http://127.0.0.1:{port}/?token={token}\n"
                yield f"http://127.0.0.1:{port}"
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
                process.stdout.close()

    def extracted_dir(self):
        """The site-packages of the venv the pex unpacked itself into under this HOME."""
        modules = list((self.home / ".cache" / "pex" / "venvs").rglob("site-packages/suzumio_backend.py"))
        assert len(modules) == 1, modules
        return modules[0].parent.resolve()


@pytest.fixture(scope="module")
def host(pex_file, tmp_path_factory):
    return Host(tmp_path_factory.mktemp("pex-host"), pex_file)


def copy_demo(folder, name="demo", packaged=(), **backend):
    """examples/demo.yaml and its script copied into folder (runners reach serve over its socket)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(EXAMPLES / "demo-script.yaml", folder / "demo-script.yaml")
    data = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    data["name"] = name
    data["backend"].update(backend)
    for pack in packaged:
        data["tools"]["toolpacks"].append({"packaged": pack})
        data["agents"]["pm"]["tools"].append(f"{'schedule' if pack == 'scheduler' else pack}.*")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def api_session(root):
    """An HTTP session that sends the API token `serve` keeps in <root>/api-token."""
    session = requests.Session()
    session.headers["Authorization"] = "Bearer " + (Path(root) / "api-token").read_text().strip()
    return session


def project_status(http, url, name):
    return http.get(f"{url}/api/projects/{name}", timeout=10).json()["status"]


def run_team(host, url, root, name):
    """start, send the kick-off message and wait until pm has submitted; returns the project store path."""
    http = api_session(root)
    host.ok("start", name, "--root", root)
    host.ok("send", name, "pm", "P3", "Start.", "--root", root)
    wait_until(lambda: project_status(http, url, name) == "submitted", timeout=TEAM_TIMEOUT,
               interval=0.5, message=f"{name} to be submitted")
    activations = http.get(f"{url}/api/projects/{name}/activations", timeout=10).json()
    assert {a["agentId"] for a in activations} == set(TEAM)
    assert [a for a in activations if a["status"] == "failed"] == []
    report = http.get(f"{url}/api/projects/{name}/report", timeout=10).text
    assert report.startswith("# Greeting card"), report


# ---------------------------------------------------------------- the file itself

def test_pex_holds_every_runtime_file_beside_the_modules_for_four_platforms(pex_file):
    with open(REPO / "pyproject.toml", "rb") as handle:
        modules = tomllib.load(handle)["tool"]["setuptools"]["py-modules"]
    assert {p.stem for p in REPO.glob("suzumio*.py")} == set(modules)
    with zipfile.ZipFile(pex_file) as archive:
        names = set(archive.namelist())
        info = json.loads(archive.read("PEX-INFO"))
        index = archive.read("webui_dist/index.html").decode()
    expected = {f"{m}.py" for m in modules} | {"suzumio_toolpack_host.mjs"}
    for folder in ("toolpacks", "examples"):
        expected |= {str(p.relative_to(REPO)) for p in (REPO / folder).rglob("*") if p.is_file()}
    assets = {f"webui_dist{ref}" for ref in re.findall(r'(?:src|href)="(/assets/[^"]+)"', index)}
    assert any(asset.endswith(".js") for asset in assets), index
    assert expected | assets <= names
    assert not [n for n in names if n.startswith(("tests/", "webui/", "node_modules/"))]
    assert (info["entry_point"], info["venv"]) == ("suzumio:main", True)
    wheels = info["distributions"]
    for project in ("pyyaml", "rpds_py"):
        for tag in ("cp311-cp311", "cp312-cp312"):
            for arch in ("x86_64", "aarch64"):
                assert [w for w in wheels if w.startswith(project + "-") and tag in w and arch in w], \
                    (project, tag, arch)
    assert pex_file.read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_pex_stays_under_30_mb_and_its_mcp_client_lists_a_real_server(pex_file, host, tmp_path):
    """The MCP SDK is inside (without cryptography, which Suzumio never imports), the file
    stays under 30 MB, and `config render --check` from the copied pex lists server-everything's tools."""
    assert pex_file.stat().st_size < 30_000_000
    with zipfile.ZipFile(pex_file) as archive:
        wheels = json.loads(archive.read("PEX-INFO"))["distributions"]
    assert [w for w in wheels if w.startswith("mcp-")]
    assert not [w for w in wheels if w.startswith("cryptography-")]
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    servers = install_mcp_servers()
    data = yaml.safe_load((EXAMPLES / "smoke.yaml").read_text())
    data.setdefault("tools", {}).setdefault("toolpacks", ["core", "web"])
    data["tools"]["toolpacks"].append({"id": "ev", "mcp": {"command": [servers["everything"]]}})
    first = next(iter(data["agents"]))
    data["agents"][first]["tools"] = list(data["agents"][first].get("tools") or []) + ["ev.echo"]
    path = tmp_path / "mcp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert "ev.echo" in host.ok("config", "render", path, "--check").stdout
    data["agents"][first]["tools"].append("ev.nothing")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    result = host.run("config", "render", path, "--check")
    assert result.returncode == 1 and 'unknown tool "ev.nothing"' in result.stderr, result.stderr


# ---------------------------------------------------------------- CLI from a copied pex

def test_copied_pex_prints_usage_and_exits_0(host):
    result = host.run("--help")
    assert result.returncode == 0, result.stderr
    usage = result.stdout + result.stderr
    assert "suzumio serve [--host 127.0.0.1]" in usage
    assert "suzumio send <project> <recipient> <P0|P1|P2|P3>" in usage
    assert "Traceback" not in usage
    assert sorted(p.name for p in host.workdir.iterdir()) == ["suzumio.pex"]


def test_copied_pex_renders_a_copied_example(host, tmp_path):
    config = copy_demo(tmp_path / "cfg")
    result = host.ok("config", "render", config)
    rendered = yaml.safe_load(result.stdout)
    assert rendered["name"] == "demo"
    assert list(rendered["agents"]) == ["pm", "worker", "critic"]
    assert rendered["communication"]["coordinatorAgent"] == "pm"
    assert rendered["backend"]["image"] == "suzumio-runner:dev"
    assert "runs agent tools on this host without isolation" in result.stderr


def test_copied_pex_writes_its_examples_and_inits_the_demo_as_the_readme_says(host, tmp_path):
    folder = tmp_path / "here"
    folder.mkdir()
    written = subprocess.run([str(host.pex), "examples", "."], capture_output=True, text=True, cwd=folder,
                             env=host.env, timeout=120, stdin=subprocess.DEVNULL)
    assert written.returncode == 0, written.stderr
    assert (folder / "demo.yaml").read_bytes() == (EXAMPLES / "demo.yaml").read_bytes()
    assert (folder / "imports" / "prompts" / "pm.md").is_file()
    init = subprocess.run([str(host.pex), "init", "demo.yaml", "--root", str(tmp_path / "root")],
                          capture_output=True, text=True, cwd=folder, env=host.env, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert init.returncode == 0, init.stderr
    assert init.stdout.startswith("Initialized demo\n")


def cpython_3_11_and_3_12():
    """Every distinct CPython 3.11 or 3.12 on this machine: {realpath: "3.x"}, the host's one included."""
    candidates = [HOST_PYTHON, Path("/usr/bin/python3.11"), Path("/usr/bin/python3.12")]
    candidates += [Path(found) for name in ("python3.11", "python3.12") if (found := shutil.which(name))]
    candidates += sorted(Path.home().glob(".pyenv/versions/3.1[12]*/bin/python3"))
    probe_code = "import os, sys; print('%d.%d' % sys.version_info[:2], os.path.realpath(sys.executable))"
    found = {}
    for path in candidates:
        if not path.is_file():
            continue
        probe = subprocess.run([str(path), "-c", probe_code], check=False, capture_output=True, text=True,
                               timeout=30)
        version, _, real = probe.stdout.strip().partition(" ")
        if probe.returncode == 0 and version in ("3.11", "3.12"):
            found[Path(real)] = version
    return found


def test_copied_pex_runs_on_each_cpython_3_11_and_3_12_found_here(host, tmp_path):
    config = copy_demo(tmp_path / "cfg")
    interpreters = cpython_3_11_and_3_12()
    assert HOST_PYTHON in interpreters
    for index, (python, version) in enumerate(sorted(interpreters.items())):
        home = tmp_path / f"home-{index}"
        home.mkdir()
        # Only this interpreter is reachable, so the pex cannot re-exec itself into another one.
        env = {**host.env, "HOME": str(home), "PATH": os.pathsep.join([str(python.parent), "/bin"])}
        result = subprocess.run([str(python), "suzumio.pex", "config", "render", str(config)], check=False,
                                cwd=host.workdir, env=env, capture_output=True, text=True, timeout=120,
                                stdin=subprocess.DEVNULL)
        assert result.returncode == 0, (python, result.stderr)
        assert yaml.safe_load(result.stdout)["name"] == "demo"
        venv_libs = {p.name for p in (home / ".cache" / "pex" / "venvs").rglob("lib/python3.*")}
        assert venv_libs == {f"python{version}"}, (python, venv_libs)


# ---------------------------------------------------------------- a served root (local backend)

@pytest.fixture(scope="module")
def served(host, tmp_path_factory):
    """demo (examples/demo.yaml as shipped) and packs (demo plus `{packaged: scheduler}` and
    `{packaged: plan}`) initialised by the pex, then `serve` from the pex; yields (root, url)."""
    base = tmp_path_factory.mktemp("served")
    root, port = base / "root", free_port()
    host.ok("init", copy_demo(base / "cfg"), "--root", root)
    host.ok("init", copy_demo(base / "cfg", name="packs", packaged=("scheduler", "plan")), "--root", root)
    with host.serving(root, port) as url:
        yield root, url


def test_served_pex_answers_health_and_serves_its_own_webui(served, pex_file):
    _, url = served
    assert requests.get(url + "/health", timeout=10).json() == {"healthy": True}
    index = requests.get(url + "/", timeout=10)
    assert index.status_code == 200
    asset = re.search(r'src="(/assets/[^"]+\.js)"', index.text)
    assert asset, index.text
    script = requests.get(url + asset.group(1), timeout=10)
    assert script.status_code == 200
    with zipfile.ZipFile(pex_file) as archive:
        assert script.content == archive.read("webui_dist" + asset.group(1))


def test_team_runs_to_submitted_through_the_pex_on_the_local_backend(host, served):
    root, url = served
    run_team(host, url, root, "demo")
    status = host.ok("status", "demo", "--root", root).stdout
    # the scripted provider's turns are model calls through the controller, at no tokens
    assert status.splitlines()[0] == "demo  submitted  0 tokens"


def test_packaged_toolpacks_resolve_to_the_copies_inside_the_pex(host, served):
    root, url = served
    http = api_session(root)
    entries = http.get(url + "/api/projects/packs/tool-ui", timeout=10).json()
    assert {"scheduler", "plan"} <= {e["toolpackId"] for e in entries}
    # Each call runs the toolpack's controller.mjs in the Node host, both read from the unpacked pex.
    scheduled = http.post(url + "/api/projects/packs/tool-ui/scheduler/schedule.once",
                              json={"body": "Check the card.", "recipient": "pm", "afterMinutes": 60},
                              timeout=90)
    assert scheduled.status_code == 200, scheduled.text
    jobs = http.post(url + "/api/projects/packs/tool-ui/scheduler/schedule.jobs", json={}, timeout=90)
    assert jobs.status_code == 200, jobs.text
    assert jobs.json()["output"].startswith("Scheduled messages:\n- ")
    assert "pm, sent 0: Check the card." in jobs.json()["output"]
    state = json.loads((root / "packs" / "toolpack-state" / "scheduler" / "jobs.json").read_text())
    assert [job["body"] for job in state["jobs"]] == ["Check the card."]
    extracted = host.extracted_dir()
    for name in ("scheduler", "plan"):
        manifest = extracted / "toolpacks" / name / "suzumio.toolpack.json"
        assert manifest.read_bytes() == (REPO / "toolpacks" / name / "suzumio.toolpack.json").read_bytes()


# ---------------------------------------------------------------- Docker backend

@pytest.mark.docker
def test_docker_backend_mounts_the_runner_files_from_the_unpacked_pex(host, pex_file, tmp_path):
    client = docker_client_or_skip()
    runner_image_or_skip(client)
    name = "pexdocker"
    root, port = tmp_path / "root", free_port()
    # The scripted team needs no network: the runners reach serve through the mounted socket folder.
    config = copy_demo(tmp_path / "cfg", name=name, kind="docker-chat", image=RUNNER_IMAGE,
                       docker={"network": "none"})
    host.ok("init", config, "--root", root)
    try:
        with host.serving(root, port) as url:
            run_team(host, url, root, name)
        containers = client.containers.list(all=True, filters={"label": f"suzumio.project={name}"})
        assert {c.labels["suzumio.agent"] for c in containers} == set(TEAM)
        extracted = host.extracted_dir()
        with zipfile.ZipFile(pex_file) as archive:
            shipped = {file_name: archive.read(file_name) for file_name in RUNNER_FILES}
        for container in containers:
            mounts = {m["Destination"]: m["Source"] for m in container.attrs["Mounts"]}
            assert mounts["/run/suzumio"] == str(suzumio_runtime.runner_socket_path(root).parent)
            for file_name in RUNNER_FILES:
                source = Path(mounts[f"/opt/suzumio/{file_name}"])
                assert source == extracted / file_name
                assert source.read_bytes() == shipped[file_name]
            assert not [s for s in mounts.values() if s.endswith(".pex")]
        assert extracted.is_relative_to(host.home)
    finally:
        for container in client.containers.list(all=True, filters={"label": f"suzumio.project={name}"}):
            container.remove(force=True)
