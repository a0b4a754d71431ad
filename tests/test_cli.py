"""docs/cli.md acceptance scenarios: the real CLI against a real runtime root. Most run `suzumio.main`
in-process for speed; the ones about processes (serve, stop of a running runner) run the CLI as a
subprocess from a fresh shell environment, as a person would."""
import contextlib
import datetime
import io
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import urllib.parse
from pathlib import Path

import pytest
import requests
from conftest import free_port, wait_until
from store_fixtures import config_of

import suzumio
import suzumio_cli_args
import suzumio_coordination as coordination
import suzumio_records
import suzumio_runtime
import suzumio_store

REPO = Path(__file__).resolve().parent.parent

BASE = """\
name: demo
task: T
backend:
  runner:
    model: main
    models:
      providers: {g: {type: openai-compatible, apiKeyEnv: K}}
      presets: {main: {provider: g, model: m}}
agents:
  pm: {tools: [messages.send]}
  worker: {count: 2, names: [Akari, Ren], model: main, tools: [messages.send]}
"""


class Result:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err


def run(*argv, cwd=None):
    """suzumio.main in-process, capturing stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd) if cwd else contextlib.nullcontext():
        code = suzumio.main(list(argv), out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())


def cli(*argv, env=None, cwd=None, timeout=60):
    """The CLI as a subprocess with a clean environment."""
    full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "suzumio.py"), *argv], capture_output=True,
                          text=True, env=full_env, cwd=cwd, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture
def project_file(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(BASE, encoding="utf-8")
    return path


@pytest.fixture
def R(tmp_path):
    return tmp_path / "R"


@pytest.fixture
def demo(project_file, R):
    assert run("init", str(project_file), "--root", str(R)).code == 0
    return R


def test_no_arguments_prints_usage_and_exits_1():
    result = run()
    assert result.code == 1 and result.out.startswith("Suzumio\n\nCommands:\n")
    assert result.out == suzumio_cli_args.USAGE
    assert result.err == "Error: a command is required\n"
    bogus = run("bogus")
    assert (bogus.code, bogus.out, bogus.err) == (1, suzumio_cli_args.USAGE, "Error: unknown command: bogus\n")


@pytest.mark.parametrize("words", [["help"], ["--help"], ["-h"]])
def test_global_help_prints_usage_and_exits_0(words):
    result = run(*words)
    assert (result.code, result.out, result.err) == (0, suzumio_cli_args.USAGE, "")


@pytest.mark.parametrize("command", sorted(suzumio_cli_args.COMMANDS_BY_NAME))
def test_every_command_has_its_own_help(command):
    entry = suzumio_cli_args.COMMANDS_BY_NAME[command]
    for words in ([command, "--help"], [command, "-h"], ["help", command], ["--help", command]):
        result = run(*words)
        assert (result.code, result.err) == (0, ""), words
        lines = result.out.splitlines()
        assert lines[0] == f"Usage: {entry.usage_line()}"
        options = lines[lines.index("Options:") + 1:]
        assert len(options) == len(entry.options) + 1  # one line per option, and -h/--help
        for option, line in zip(entry.options, options, strict=False):
            assert line.split()[0] == option.flag and option.help in line


def test_serve_help_lists_the_serve_options():
    out = run("serve", "--help").out
    assert out.startswith("Usage: suzumio serve [--host 127.0.0.1] [--port 39400] [--root dir]")
    for flag in ("--host", "--port", "--no-scheduler", "--threads", "--allow-host", "--api-token-env",
                 "--otlp-endpoint", "--root", "-h, --help"):
        assert re.search(rf"^  {re.escape(flag)}\b", out, re.M), flag


def test_version_is_the_one_version_string():
    import suzumio_resources

    result = run("--version")
    assert (result.code, result.out) == (0, f"suzumio {suzumio_resources.VERSION}\n")
    assert cli("--version").stdout == result.out


def test_usage_error_prints_one_error_line_and_the_commands_usage(demo):
    result = run("status", "demo", "--bogus", "--root", str(demo))
    assert result.code == 1
    assert result.err == "Error: unrecognized arguments: --bogus\n"
    assert result.out == suzumio_cli_args.COMMANDS_BY_NAME["status"].help_text()
    result = run("status", "--limit", "3", "--root", str(demo))
    assert (result.code, result.err) == (1, "Error: status does not take --limit\n")
    assert run("help", "nope").code == 1


def test_help_exits_0_from_a_fresh_shell():
    assert cli("--help").returncode == 0
    result = cli("serve", "--help")
    assert result.returncode == 0 and result.stdout.startswith("Usage: suzumio serve ")


def test_turns_is_an_alias_of_activations(demo):
    assert run("turns", "demo", "--root", str(demo)).out == ""
    store = suzumio_store.Root(demo).open_project("demo")
    store.start()
    coordination.send_message(store, config_of(store), "user", "go", recipient="pm")
    coordination.start_activation(store, "pm", "prompt", coordination.pending_signals(store, config_of(store), "pm"))
    assert run("turns", "demo", "--root", str(demo)).out == run("activations", "demo", "--root", str(demo)).out
    assert re.search(r"^act_\d+_[0-9a-f]{8} pm running ", run("turns", "demo", "--root", str(demo)).out, re.M)


def test_config_render_writes_yaml_and_touches_no_root(project_file, R):
    result = run("config", "render", str(project_file), "--root", str(R))
    assert result.code == 0 and "name: demo" in result.out
    assert not R.exists()


def test_config_usage_errors():
    assert run("config", "render").code == 1
    assert run("config", "render").out == suzumio_cli_args.COMMANDS_BY_NAME["config"].help_text()
    assert run("config", "show", "p.yaml").out == suzumio_cli_args.COMMANDS_BY_NAME["config"].help_text()


def test_init_creates_layout_and_prints_two_lines(project_file, R):
    result = run("init", str(project_file), "--root", str(R))
    assert result.code == 0
    assert result.out == f"Initialized demo\nRoot: {R / 'demo'}\n"
    project = R / "demo"
    for relative in ("suzumio.sqlite", "source.yaml", "resolved.yaml", "agents/pm/workspace",
                     "agents/worker-1/workspace", "agents/worker-2/workspace", "artifacts/pm",
                     "artifacts/worker-1", "artifacts/worker-2", "activations", "logs"):
        assert (project / relative).exists(), relative
    assert (project / "source.yaml").read_bytes() == project_file.read_bytes()
    events = run("events", "demo", "--root", str(R)).out.splitlines()
    assert len(events) == 1 and " project.initialized " in events[0]
    assert json.loads(events[0].split(" ", 2)[2]) == {"configPath": str(project / "resolved.yaml")}


def test_second_init_fails_and_changes_nothing(project_file, demo):
    source, resolved = demo / "demo" / "source.yaml", demo / "demo" / "resolved.yaml"
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in (source, resolved)]
    result = run("init", str(project_file), "--root", str(demo))
    assert result.code == 1 and result.err.startswith("Error: Project already initialized: demo")
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in (source, resolved)] == before


def test_status_of_empty_or_missing_root_prints_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "empty", tmp_path / "missing"):
        result = run("status", "--root", str(root))
        assert (result.code, result.out) == (0, "")
    assert not (tmp_path / "missing").exists()


def test_status_after_init(demo):
    result = run("status", "demo", "--root", str(demo))
    lines = result.out.splitlines()
    assert lines[0] == "demo  initialized"
    for line, agent in zip(lines[1:], ("pm", "worker-1", "worker-2"), strict=True):
        assert re.fullmatch(rf"  {agent} +quiet  -  (just now|\d+s ago)", line), line


def running_pm(demo):
    """Start the demo project and one activation of pm from a user message: (store, activation)."""
    store = suzumio_store.Root(demo).open_project("demo")
    store.start()
    coordination.send_message(store, config_of(store), "user", "go", recipient="pm")
    pending = coordination.pending_signals(store, config_of(store), "pm")
    return store, coordination.start_activation(store, "pm", "prompt", pending)


def test_status_columns_align_and_times_are_relative(demo):
    store, activation = running_pm(demo)
    later = suzumio_records.parse_ts(store.agent("pm")["updatedAt"]) + datetime.timedelta(minutes=5, seconds=3)
    out = suzumio.main(["status", "demo", "--root", str(demo)], out=(buffer := io.StringIO()), now=later)
    assert out == 0
    lines = buffer.getvalue().splitlines()
    assert lines[1] == f"  pm        running  {activation['id']}  5m ago"
    assert lines[2].startswith("  worker-1  quiet    -  ")
    assert all(line[10:12] == "  " and line[12] != " " for line in lines[1:])  # one status column


def test_read_commands_print_stable_json(demo):
    store = suzumio_store.Root(demo).open_project("demo")
    store.start()
    coordination.send_message(store, config_of(store), "user", "go", recipient="pm")
    coordination.start_activation(store, "pm", "prompt", coordination.pending_signals(store, config_of(store), "pm"))
    (demo / "demo" / "artifacts" / "pm" / "a.md").write_text("hello")
    status = json.loads(run("status", "--json", "--root", str(demo)).out)
    assert [(p["id"], p["status"]) for p in status] == [("demo", "running")]
    assert [a["id"] for a in status[0]["agents"]] == ["pm", "worker-1", "worker-2"]
    assert status[0]["agents"][0]["status"] == "running"
    messages = json.loads(run("messages", "demo", "--json", "--root", str(demo)).out)
    assert [(m["sender"], m["recipient"], m["body"]) for m in messages] == [("user", "pm", "go")]
    activations = json.loads(run("turns", "demo", "--json", "--root", str(demo)).out)
    assert [(a["agentId"], a["status"]) for a in activations] == [("pm", "running")]
    events = json.loads(run("events", "demo", "--json", "--limit", "2", "--root", str(demo)).out)
    assert len(events) == 2 and all(isinstance(e["data"], dict) for e in events)
    assert json.loads(run("artifacts", "demo", "--json", "--root", str(demo)).out) == [
        {"agent": "pm", "path": "a.md", "size": 5, "versions": 0}]
    first = run("messages", "demo", "--json", "--root", str(demo)).out
    assert first == run("messages", "demo", "--json", "--root", str(demo)).out
    assert first.startswith("[\n  {\n")  # indented, keys sorted


def test_json_is_not_a_flag_of_write_commands(demo):
    result = run("start", "demo", "--json", "--root", str(demo))
    assert (result.code, result.err) == (1, "Error: start does not take --json\n")


TYPO = BASE.replace("  pm: {tools: [messages.send]}", "  pm: {tolls: [messages.send], env: {ANY_NAME: x}}")


def test_unknown_keys_are_reported_one_line_each(tmp_path, R):
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO.replace("task: T\n", "task: T\nchanels: [a]\n"))
    path.write_text(path.read_text().replace("presets: {main: {provider: g, model: m}}",
                                             "presets: {main: {provider: g, model: m, temprature: 1}}"))
    expected = ["chanels: unknown key (did you mean channels?)",
                "backend.runner.models.presets.main.temprature: unknown key (did you mean temperature?)",
                "agents.pm.tolls: unknown key (did you mean tools?)"]
    render = run("config", "render", str(path))
    assert render.code == 0
    assert sorted(line for line in render.err.splitlines() if "unknown key" in line) == sorted(expected)
    init = run("init", str(path), "--root", str(R))
    assert init.code == 0 and sorted(init.err.splitlines()) == sorted(expected)
    start = run("start", "demo", "--root", str(R))
    assert start.code == 0 and sorted(start.err.splitlines()) == sorted(expected)
    assert "ANY_NAME" not in render.err  # agent env is a free-form map


def test_strict_mode_makes_unknown_keys_errors(tmp_path, R):
    path = tmp_path / "typo.yaml"
    path.write_text(TYPO)
    result = run("config", "render", "--strict", str(path))
    assert result.code == 1 and result.out == ""
    assert result.err.splitlines()[:2] == ["Error: Unknown keys in project config (strict):",
                                           "  - agents.pm.tolls: unknown key (did you mean tools?)"]
    path.write_text("strict: true\n" + TYPO)
    assert run("config", "render", str(path)).code == 1
    assert run("init", str(path), "--root", str(R)).code == 1 and not R.exists()
    path.write_text("strict: true\n" + BASE)
    clean = run("config", "render", str(path))
    assert clean.code == 0 and "unknown key" not in clean.err


def test_unknown_project_creates_nothing(R, demo):
    result = run("status", "nope", "--root", str(R))
    assert result.code == 1 and result.err.splitlines()[0] == "Error: Unknown project: nope"
    assert not (R / "nope").exists()
    (R / "nope").mkdir()
    assert run("status", "nope", "--root", str(R)).err.startswith("Error: Unknown project: nope")
    assert list((R / "nope").iterdir()) == []


def test_send_stores_message_without_activation(demo):
    result = run("send", "demo", "pm", "P1", "hello", "world", "--root", str(demo))
    assert result.code == 0 and re.fullmatch(
        r"Sent msg_[0-9]+_[0-9a-f]{8}\nProject demo is initialized: the message is kept and delivered when the "
        r"team runs again; start it to resume \(suzumio start demo, or a POST to /api/projects/demo/start\)\n",
        result.out)
    message_id = result.out.split()[1]
    lines = run("messages", "demo", "--root", str(demo)).out.splitlines()
    assert lines[0] == "" and re.fullmatch(rf"{message_id} \S+Z \((just now|\d+s ago)\) user -> pm \[P1\]", lines[1])
    assert lines[2] == "hello world"
    assert run("activations", "demo", "--root", str(demo)).out == ""


@pytest.mark.parametrize("argv, message", [
    (["pm", "p1", "hi"], "Invalid priority: p1"),
    (["ghost", "P9", "hi"], "Invalid priority: P9"),
    (["ghost", "P2", "hi"], "Unknown agent: ghost"),
    (["#project", "P2", "hi"], "Unknown agent: #project"),
])
def test_send_validation_order(demo, argv, message):
    result = run("send", "demo", *argv, "--root", str(demo))
    assert result.code == 1 and result.err.splitlines()[0] == f"Error: {message}"
    assert run("messages", "demo", "--root", str(demo)).out == ""


def test_send_without_body_is_usage(demo):
    result = run("send", "demo", "pm", "P2", "--root", str(demo))
    assert (result.code, result.out) == (1, suzumio_cli_args.COMMANDS_BY_NAME["send"].help_text())


def test_send_to_user_records_closed_untargeted_signal(demo):
    assert run("send", "demo", "user", "P3", "done", "--root", str(demo)).code == 0
    store = suzumio_store.Root(demo).open_project("demo")
    signals = store.list_signals()
    assert len(signals) == 1
    assert signals[0]["status"] == "closed" and "targetAgent" not in signals[0]


def test_stop_and_approve_without_running_activations(demo):
    assert run("stop", "demo", "--root", str(demo)).out == "demo: stopped\n"
    assert run("approve", "demo", "--root", str(demo)).out == "demo: completed\n"
    events = run("events", "demo", "--root", str(demo)).out.splitlines()
    assert events[-2].endswith('project.status {"status":"stopped"}')
    assert events[-1].endswith('project.status {"status":"completed"}')


def test_start_without_docker_and_without_signals(demo):
    result = run("start", "demo", "--root", str(demo))
    assert (result.code, result.out) == (0, "demo: running\n")


def test_messages_limit_rules(demo):
    for body in ("one", "two", "three"):
        run("send", "demo", "pm", "P3", body, "--root", str(demo))
    bodies = [line for line in run("messages", "demo", "--limit", "2", "--root", str(demo)).out.splitlines()
              if line in ("one", "two", "three")]
    assert bodies == ["two", "three"]
    for bad in ("0", "-3", "abc"):
        out = run("messages", "demo", "--limit", bad, "--root", str(demo)).out
        assert out.count("user -> pm") == 3
    assert run("messages", "demo", "--limit", "2.9", "--root", str(demo)).out.count("user -> pm") == 2


def test_events_limit_after_start_and_stop(demo):
    run("start", "demo", "--root", str(demo))
    run("stop", "demo", "--root", str(demo))
    lines = run("events", "demo", "--limit", "2", "--root", str(demo)).out.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(' project.status {"status":"running"}')
    assert lines[1].endswith(' project.status {"status":"stopped"}')


def test_tick_on_initialized_project_is_silent(demo):
    before = run("events", "demo", "--root", str(demo)).out
    result = run("tick", "demo", "--root", str(demo))
    assert (result.code, result.out, result.err) == (0, "", "")
    assert run("events", "demo", "--root", str(demo)).out == before


def test_tick_of_unknown_project_fails(demo):
    result = run("tick", "nope", "--root", str(demo))
    assert result.code == 1 and result.err.startswith("Error: Unknown project: nope")


def test_root_precedence(project_file, tmp_path, demo):
    assert cli("status", "demo", "--root", str(demo), env={"SUZUMIO_ROOT": str(tmp_path / "R1")}).returncode == 0
    result = cli("status", env={"SUZUMIO_ROOT": ""}, cwd=demo)
    assert result.stdout.splitlines()[0] == "demo  initialized"


def test_serve_rejects_bad_port():
    result = run("serve", "--port", "abc")
    assert result.code == 1 and result.err.splitlines()[0] == "Error: Invalid port: abc"


def test_duplicate_expanded_id_fails_before_anything_is_created(tmp_path, R):
    path = tmp_path / "dup.yaml"
    path.write_text(BASE.replace("  pm: {tools: [messages.send]}\n",
                                 "  pm: {tools: [messages.send]}\n  worker-1: {tools: []}\n"))
    result = run("init", str(path), "--root", str(R))
    assert result.code == 1
    assert result.err.splitlines()[0] == "Error: Duplicate agent id after count expansion: worker-1"
    assert not (R / "demo").exists()


def test_artifacts_lists_regular_files_only(demo):
    assert run("artifacts", "demo", "--root", str(demo)).out == ""
    artifacts = demo / "demo" / "artifacts"
    (artifacts / "worker-1" / "runs").mkdir()
    (artifacts / "worker-1" / "runs" / "out.txt").write_text("abc")
    (artifacts / "pm" / "a.md").write_text("hello")
    (artifacts / "pm" / "etc").symlink_to("/etc")
    (artifacts / "top.txt").write_text("not listed")
    assert run("artifacts", "demo", "--root", str(demo)).out == (
        "pm/a.md 5 bytes, 0 versions\nworker-1/runs/out.txt 3 bytes, 0 versions\n")


def test_flags_anywhere(project_file, R):
    assert run("init", "--root", str(R), str(project_file)).code == 0
    assert run("--root", str(R), "status", "demo").code == 0
    run("send", "demo", "pm", "P3", "a", "--root", str(R))
    run("send", "demo", "pm", "P3", "b", "--root", str(R))
    run("send", "demo", "pm", "P3", "c", "--root", str(R))
    assert (run("messages", "demo", "--limit=2", f"--root={R}").out
            == run("messages", "demo", "--limit", "2", "--root", str(R)).out)
    help_of = {name: command.help_text() for name, command in suzumio_cli_args.COMMANDS_BY_NAME.items()}
    assert run("status", "demo", "--bogus", "--root", str(R)).out == help_of["status"]
    assert run("serve", "--no-platforms").out == help_of["serve"]
    assert run("status", "--limit", "3", "--root", str(R)).out == help_of["status"]


def test_double_dash_protects_a_body_word(demo):
    assert run("send", "demo", "pm", "P3", "--root", str(demo), "--", "--force", "now").code == 0
    assert run("messages", "demo", "--root", str(demo)).out.splitlines()[-1] == "--force now"
    result = run("send", "demo", "pm", "P3", "use", "--force", "now", "--root", str(demo))
    assert (result.code, result.out) == (1, suzumio_cli_args.COMMANDS_BY_NAME["send"].help_text())
    assert run("messages", "demo", "--root", str(demo)).out.count("user -> pm") == 1


def test_stop_without_docker_records_stop_failed(demo):
    store, activation = running_pm(demo)
    store.set_activation_container(activation["id"], "suzumio-demo-pm-gone")
    result = cli("stop", "demo", "--root", str(demo), env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert (result.returncode, result.stdout) == (0, "demo: stopped\n")
    assert store.activation(activation["id"])["status"] == "cancelled"
    assert "activation.stop_failed" in run("events", "demo", "--root", str(demo)).out


def test_config_render_local_backend_warns_on_stderr(tmp_path):
    path = tmp_path / "local.yaml"
    path.write_text(BASE.replace("backend:\n", "backend:\n  kind: local\n"))
    result = cli("config", "render", str(path))
    assert result.returncode == 0
    assert result.stderr.splitlines()[-2:] == [
        "Warning: backend.kind local runs agent tools on this host without isolation",
        "Warning: backend.kind local sets the egress proxy variables, but they are advisory there: agent tools "
        "can connect directly, outside agents.<id>.egress and its audit"]
    assert "kind: local" in result.stdout


def test_threads_below_16_is_usage():
    result = run("serve", "--threads", "8")
    assert (result.code, result.out) == (1, suzumio_cli_args.COMMANDS_BY_NAME["serve"].help_text())


def test_api_token_variable_must_be_set():
    result = cli("serve", "--api-token-env", "SZ_TOKEN", "--port", "0")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == "Error: API token variable SZ_TOKEN is not set"


# ---------------------------------------------------------------- scenarios with a running server

class Served:
    """A running `suzumio serve`: its process, the three lines it printed, and an HTTP session that
    sends the API token of its Control room URL."""

    def __init__(self, process, url, control_room, runner):
        self.process = process
        self.url = url
        self.control_room = control_room
        self.runner = runner
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(control_room).query)
        self.token = query.get("token", [None])[0]
        self.http = requests.Session()
        if self.token:
            self.http.headers["Authorization"] = f"Bearer {self.token}"

    def get(self, path, **kwargs):
        return self.http.get(self.url + path, timeout=10, **kwargs)

    def post(self, path, body=None, **kwargs):
        return self.http.post(self.url + path, json=body, timeout=10, **kwargs)


@contextlib.contextmanager
def serving(*argv, env=None):
    """`suzumio serve …` as a subprocess; yields a Served; SIGTERM at the end."""
    full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), **(env or {})}
    process = subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "serve", *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                               stdin=subprocess.DEVNULL)
    try:
        line = process.stdout.readline()
        match = re.fullmatch(r"suzumio listening on (http://\S+)\n", line)
        assert match, (line, process.stderr.read() if process.poll() is not None else "")
        room = re.fullmatch(r"Control room: (http://\S+)\n", process.stdout.readline())
        runner = re.fullmatch(r"Runner listener: (\S+)\n", process.stdout.readline())
        assert room and runner
        served = Served(process, match.group(1), room.group(1), runner.group(1))
        yield served
        served.http.close()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def test_serve_health_config_and_not_found(demo):
    port = free_port()
    with serving("--root", str(demo), "--port", str(port), "--no-scheduler") as served:
        url = served.url
        assert url == f"http://127.0.0.1:{port}"
        health = requests.get(url + "/health", timeout=5)
        assert (health.status_code, health.json()) == (200, {"healthy": True})
        resolved = served.get("/api/projects/demo/config/resolved")
        assert resolved.text == (demo / "demo" / "resolved.yaml").read_text()
        missing = served.get("/nope")
        assert (missing.status_code, missing.json()) == (404, {"error": "not found"})
        posted = served.post("/api/projects/demo/messages", {"recipient": "pm", "body": "x"})
        assert posted.status_code == 200
        assert (posted.json()["sender"], posted.json()["priority"]) == ("user", "P3")
    store = suzumio_store.Root(demo).open_project("demo")
    assert store.list_activations() == []
    assert store.list_messages()[0]["sender"] == "user"


def test_serve_with_16_threads_and_allow_host(demo):
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--threads", "16",
                 "--allow-host", "suzumio.lan") as served:
        allowed = served.get("/api/projects", headers={"Host": "suzumio.lan"})
        assert allowed.status_code == 200
        refused = served.get("/api/projects", headers={"Host": "evil.example"})
        assert (refused.status_code, refused.json()) == (403, {"error": "Host not allowed: evil.example"})


def test_serve_prints_the_control_room_url_and_keeps_its_token_in_a_0600_file(demo):
    token_file = demo / "api-token"
    assert not token_file.exists()
    with serving("--root", str(demo), "--port", "0", "--no-scheduler") as served:
        assert served.control_room == f"{served.url}/?token={served.token}"
        assert len(served.token) >= 40
        assert token_file.read_text() == served.token + "\n"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        denied = requests.get(served.url + "/api/projects", timeout=5)
        assert (denied.status_code, denied.json()) == (401, {"error": "API token required"})
        wrong = requests.get(served.url + "/api/projects", headers={"Authorization": "Bearer nope"}, timeout=5)
        assert (wrong.status_code, wrong.json()) == (401, {"error": "Invalid API token"})
        assert served.get("/api/projects").status_code == 200
        assert requests.get(served.url + "/health", timeout=5).status_code == 200
        assert requests.get(served.url + "/", timeout=5).status_code == 200
        first = served.token
    assert served.token not in served.process.stderr.read()
    with serving("--root", str(demo), "--port", "0", "--no-scheduler") as again:
        assert again.token == first
        assert again.get("/api/projects").status_code == 200


def test_serve_serves_runner_routes_on_the_root_socket_only(demo):
    with serving("--root", str(demo), "--port", "0", "--no-scheduler") as served:
        socket_path = served.runner.removeprefix("unix://")
        assert socket_path == str(suzumio_runtime.runner_socket_path(demo))
        assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
        body = {"project": "demo", "agentId": "pm", "activationId": "act_x", "token": "nope", "kind": "x"}
        on_user = served.post("/runner/signals", body)
        assert (on_user.status_code, on_user.json()) == (404, {"error": "not found"})
        from api_fixtures import unix_call
        on_runner = unix_call(socket_path, "POST", "/runner/signals", json=body)
        assert (on_runner.status_code, on_runner.json()) == (403, {"error": "Invalid agent token"})
        user_there = unix_call(socket_path, "GET", "/api/projects", headers={"Authorization": f"Bearer {served.token}"})
        assert (user_there.status_code, user_there.json()) == (404, {"error": "not found"})
    assert not os.path.exists(socket_path)


def test_serve_runner_listen_serves_runner_routes_over_tls(demo):
    stale = suzumio_runtime.runner_socket_path(demo)  # as a killed serve leaves it
    stale.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as left_behind:
        left_behind.bind(str(stale))
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--runner-listen", "127.0.0.1:0") as served:
        assert re.fullmatch(r"https://127\.0\.0\.1:\d+", served.runner) and served.runner != served.url
        ca = str(demo / "tls" / "ca.pem")
        assert (demo / "tls" / "runner-ca.pem").read_text() == Path(ca).read_text()
        body = {"project": "demo", "agentId": "pm", "activationId": "act_x", "token": "nope", "kind": "x"}
        on_runner = requests.post(served.runner + "/runner/signals", json=body, timeout=5, verify=ca)
        assert (on_runner.status_code, on_runner.json()) == (403, {"error": "Invalid agent token"})
        tokenless = {key: value for key, value in body.items() if key != "token"}
        without_token = requests.post(served.runner + "/runner/signals", json=tokenless, timeout=5, verify=ca)
        assert (without_token.status_code, without_token.json()) == (400, {"error": "token is required"})
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.post("http://" + served.runner[len("https://"):] + "/runner/signals", json=body, timeout=5)
        with pytest.raises(requests.exceptions.SSLError):  # a certificate of another CA is refused
            requests.post(served.runner + "/runner/signals", json=body, timeout=5)
        assert requests.get(served.runner + "/api/projects", headers=served.http.headers, timeout=5,
                            verify=ca).status_code == 404
        assert served.post("/runner/signals", body).status_code == 404
        # Served as well, for docker-chat runners (which have no network); the stale one is replaced.
        assert served.process.stdout.readline() == f"Runner socket: unix://{stale}\n"
        assert stat.S_ISSOCK(os.lstat(stale).st_mode)
    assert "controllerUrl" not in served.process.stderr.read()
    issued = (demo / "tls" / "server.pem").read_bytes()
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--runner-listen", "127.0.0.1:0") as served:
        assert requests.get(served.runner + "/api/projects", timeout=5, verify=ca).status_code == 404
    assert (demo / "tls" / "server.pem").read_bytes() == issued  # made once, on first start


def test_serve_runner_listen_with_the_operators_certificate(demo, tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem"), "-days", "2",
                    "-subj", "/CN=controller", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--runner-listen", "127.0.0.1:0",
                 "--runner-cert", str(tmp_path / "cert.pem"), "--runner-key", str(tmp_path / "key.pem")) as served:
        answer = requests.get(served.runner + "/api/projects", timeout=5, verify=str(tmp_path / "cert.pem"))
        assert answer.status_code == 404
        assert (demo / "tls" / "runner-ca.pem").read_text() == (tmp_path / "cert.pem").read_text()
    assert not (demo / "tls" / "ca.pem").exists()


@pytest.mark.parametrize("argv, error", [
    (["--runner-cert", "c.pem", "--runner-key", "k.pem"], "--runner-cert, --runner-key and --runner-ca apply only "
                                                          "with --runner-listen"),
    (["--runner-listen", "127.0.0.1:0", "--runner-cert", "c.pem"], "--runner-cert and --runner-key go together"),
    (["--runner-listen", "127.0.0.1:0", "--runner-ca", "a.pem"], "--runner-ca needs --runner-cert and --runner-key"),
    (["--runner-listen", "127.0.0.1:0", "--runner-cert", "nope.pem", "--runner-key", "nope.pem"],
     "Runner listener certificate file not found: nope.pem"),
])
def test_serve_runner_tls_options_are_checked(demo, argv, error):
    result = cli("serve", "--root", str(demo), "--port", "0", *argv)
    assert (result.returncode, result.stderr.splitlines()[0]) == (1, f"Error: {error}")


def test_serve_runner_listen_must_be_host_and_port():
    result = cli("serve", "--runner-listen", "nowhere", "--port", "0")
    assert (result.returncode, result.stderr.splitlines()[0]) == (
        1, "Error: Invalid --runner-listen: nowhere (expected HOST:PORT)")


def test_serve_warns_that_a_configured_controller_url_is_unused(tmp_path, R):
    assert run("init", str(sleepy_project(tmp_path, 1234)), "--root", str(R)).code == 0
    with serving("--root", str(R), "--port", "0", "--no-scheduler") as served:
        assert served.get("/api/projects").status_code == 200
    assert ("Warning: demo: backend.controllerUrl (http://127.0.0.1:1234) is not used: runners reach this "
            "controller over its runner socket (it applies only with serve --runner-listen)"
            in served.process.stderr.read())


def test_serve_no_auth_warns_and_takes_no_token(demo):
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--no-auth") as served:
        assert served.token is None and served.control_room == served.url + "/"
        assert requests.get(served.url + "/api/projects", timeout=5).status_code == 200
    assert not (demo / "api-token").exists()
    assert ("Warning: --no-auth: the user API takes no token; any local process, agent tools on the local "
            "backend included, controls every project") in served.process.stderr.read()


def test_no_auth_and_api_token_env_exclude_each_other():
    result = run("serve", "--no-auth", "--api-token-env", "SZ_TOKEN")
    assert (result.code, result.out) == (1, suzumio_cli_args.COMMANDS_BY_NAME["serve"].help_text())
    assert result.err == "Error: --no-auth and --api-token-env exclude each other\n"


def test_serve_with_api_token(demo):
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--api-token-env", "SZ_TOKEN",
                 env={"SZ_TOKEN": "s3cret"}) as served:
        assert served.token == "s3cret"
        denied = requests.get(served.url + "/api/projects", timeout=5)
        assert (denied.status_code, denied.json()) == (401, {"error": "API token required"})
        assert served.get("/api/projects").status_code == 200
        assert requests.get(served.url + "/health", timeout=5).status_code == 200
    assert "s3cret" not in served.process.stderr.read()
    assert not (demo / "api-token").exists()


SLEEPY_SCRIPT = """\
agents:
  worker-*:
    - when: "sleep"
      steps:
        - tools:
            - name: shell.exec
              input: {command: "sleep 30"}
    - steps:
        - say: "Resumed after the stop."
"""


def sleepy_project(tmp_path, port):
    script = tmp_path / "script.yaml"
    script.write_text(SLEEPY_SCRIPT)
    path = tmp_path / "sleepy.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: demo
        task: T
        tools: {{toolpacks: [core, shell]}}
        backend:
          kind: local
          controllerUrl: http://127.0.0.1:{port}
          runner:
            model: offline
            models:
              providers: {{replay: {{type: scripted, script: {script}}}}}
              presets: {{offline: {{provider: replay, model: m}}}}
        agents:
          pm: {{tools: [messages.send]}}
          worker: {{count: 2, tools: [messages.send, shell.exec]}}
        """))
    return path


@pytest.mark.parametrize("command", ["stop", "approve"])
def test_stop_waits_for_a_running_local_runner(tmp_path, R, command):
    port = free_port()
    assert run("init", str(sleepy_project(tmp_path, port)), "--root", str(R)).code == 0
    store = suzumio_store.Root(R).open_project("demo")
    with serving("--root", str(R), "--port", str(port), "--no-scheduler"):
        assert cli("start", "demo", "--root", str(R)).returncode == 0
        assert cli("send", "demo", "worker-1", "P3", "please sleep", "--root", str(R)).returncode == 0
        wait_until(lambda: any(c["tool"] == "shell.exec" for c in store.list_tool_calls(10)), timeout=20,
                   message="worker-1 running shell.exec")
        activation = store.agent("worker-1")["activeActivationId"]
        pid = int(store.activation(activation)["containerName"].removeprefix("local-"))
        result = cli(command, "demo", "--root", str(R))
        expected = "demo: stopped\n" if command == "stop" else "demo: completed\n"
        assert (result.returncode, result.stdout) == (0, expected)
        assert not Path(f"/proc/{pid}").exists() or _is_zombie(pid)
        cancelled = store.activation(activation)
        reason = "Project stopped" if command == "stop" else "Project approved"
        assert (cancelled["status"], cancelled["error"]) == ("cancelled", reason)
        assert store.agent("worker-1")["status"] == "quiet"
        resume = store.list_signals(target_agent="worker-1", status="pending", kind="scheduler.resume_after_stop")
        events = run("events", "demo", "--root", str(R)).out
        assert "activation.cancelled" in events
        if command == "approve":
            assert resume == [] and store.project()["status"] == "completed"
            return
        assert len(resume) == 1 and resume[0]["priority"] == "P2"
        assert 'project.status {"status":"stopped"}' in events
        assert cli("start", "demo", "--root", str(R)).returncode == 0
        resumed = wait_until(lambda: [a for a in store.list_activations() if a["agentId"] == "worker-1"
                                      and a["id"] != activation], timeout=10, message="a new worker-1 activation")
        wait_until(lambda: store.signal(resume[0]["id"])["status"] == "delivered", timeout=10,
                   message="resume signal delivered")
        assert store.signal(resume[0]["id"])["deliveredActivationId"] == resumed[0]["id"]


def _is_zombie(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_serve_on_a_non_loopback_host_without_token_warns(demo):
    with serving("--root", str(demo), "--port", "0", "--no-scheduler", "--host", "0.0.0.0", "--no-auth") as served:
        port = served.url.rsplit(":", 1)[1]
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    assert ("Warning: --no-auth: the user API takes no token; anyone who can reach 0.0.0.0 controls every project"
            in served.process.stderr.read())


def test_serve_stops_on_sigterm_and_leaves_runners_alone(tmp_path, R):
    port = free_port()
    assert run("init", str(sleepy_project(tmp_path, port)), "--root", str(R)).code == 0
    store = suzumio_store.Root(R).open_project("demo")
    with serving("--root", str(R), "--port", str(port)) as served:
        process = served.process
        served.post("/api/projects/demo/start").raise_for_status()
        served.post("/api/projects/demo/messages", {"recipient": "worker-1", "body": "please sleep"}).raise_for_status()
        wait_until(lambda: any(c["tool"] == "shell.exec" for c in store.list_tool_calls(10)), timeout=20,
                   message="worker-1 running shell.exec")
        activation = store.activation(store.agent("worker-1")["activeActivationId"])
        pid = int(activation["containerName"].removeprefix("local-"))
    assert process.returncode == 0
    assert Path(f"/proc/{pid}").exists() and not _is_zombie(pid), "a runner must outlive the controller"
    os.killpg(pid, signal.SIGKILL)


def test_every_docker_free_command_works_without_a_docker_daemon(project_file, R, tmp_path):
    """docs/cli.md: the Docker client is created lazily, only to touch a container."""
    no_docker = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}
    for argv in (["init", str(project_file)], ["status"], ["send", "demo", "pm", "P3", "hello"],
                 ["stop", "demo"], ["approve", "demo"], ["messages", "demo"], ["events", "demo"],
                 ["artifacts", "demo"], ["tick", "demo"], ["tick"]):
        result = cli(*argv, "--root", str(R), env=no_docker)
        assert (result.returncode, result.stderr) == (0, ""), (argv, result.stderr)
    with serving("--root", str(R), "--port", "0", "--no-scheduler", env=no_docker) as served:
        assert served.get("/api/projects/demo").status_code == 200


def test_runner_socket_path_falls_back_to_tmp_when_the_root_path_is_too_long(tmp_path):
    short = tmp_path.parent / "r"
    assert suzumio_runtime.runner_socket_path(short) == short / "run" / "runner.sock"
    deep = Path("/srv/" + "x" * 120)
    fallback = suzumio_runtime.runner_socket_path(deep)
    assert fallback.parent.parent == Path("/tmp") and fallback.name == "runner.sock"
    assert re.fullmatch(r"suzumio-run-[0-9a-f]{16}", fallback.parent.name)
    other = suzumio_runtime.runner_socket_path(Path("/srv/" + "y" * 120))
    assert suzumio_runtime.runner_socket_path(deep) == fallback != other


def test_the_runner_socket_folder_must_hold_nothing_else(tmp_path):
    socket_path = tmp_path / "run" / "runner.sock"
    suzumio_runtime.prepare_runner_socket_dir(socket_path)
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755
    (tmp_path / "run" / "suzumio.sqlite").write_text("")
    with pytest.raises(suzumio.SuzumioError, match="holds other files"):
        suzumio_runtime.prepare_runner_socket_dir(socket_path)


def test_run_and_api_token_are_not_project_names(tmp_path, R):
    for name in ("run", "api-token"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(BASE.replace("name: demo", f"name: {name}"))
        result = cli("init", str(path), "--root", str(R))
        assert result.returncode == 1
        assert result.stderr.strip() == f"Error: Invalid project name: {name} (reserved in the runtime root)"


def test_a_reader_that_goes_away_ends_a_command_quietly_with_141(demo):
    store = suzumio_store.Root(demo).open_project("demo")
    for index in range(200):  # 400 kB of output: far more than a pipe holds, so the writer meets the close
        coordination.send_message(store, config_of(store), "user", f"{index} " + "x" * 2000, recipient="pm")
    process = subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "messages", "demo", "--limit", "500",
                                "--root", str(demo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)
    try:
        lines = [process.stdout.readline(), process.stdout.readline()]
        process.stdout.close()  # `| head -2`: the reader goes away
        errors = process.stderr.read()
        assert process.wait(timeout=30) == suzumio.READER_GONE == 141
    finally:
        if process.poll() is None:
            process.kill()
    assert lines[0] == b"\n" and lines[1].startswith(b"msg_")
    assert errors == b""


def test_status_piped_into_head_prints_its_line_and_nothing_else(demo):
    result = subprocess.run(["bash", "-c", 'set -o pipefail; "$0" suzumio.py status --root "$1" | head -1',
                             sys.executable, str(demo)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert (result.stdout, result.stderr) == ("demo  initialized\n", "")
    assert result.returncode in (0, 141)


OTHER_SCRIPT = """\
agents:
  worker-*:
    - steps:
        - say: "From the other folder."
"""


def test_replay_and_fork_read_a_config_files_relative_paths_from_its_folder(tmp_path, R):
    assert run("init", str(sleepy_project(tmp_path, 1234)), "--root", str(R)).code == 0
    store = suzumio_store.Root(R).open_project("demo")
    other = tmp_path / "other"
    other.mkdir()
    (other / "script.yaml").write_text(OTHER_SCRIPT)  # the same name as the first file's, another folder
    first = (tmp_path / "sleepy.yaml").read_text()
    assert str(tmp_path / "script.yaml") in first
    (other / "again.yaml").write_text(first.replace(str(tmp_path / "script.yaml"), "script.yaml"))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    with serving("--root", str(R), "--port", "0", "--no-scheduler") as served:
        served.post("/api/projects/demo/start").raise_for_status()
        served.post("/api/projects/demo/messages", {"recipient": "worker-1", "body": "hello"}).raise_for_status()
        [done] = wait_until(lambda: [a for a in store.list_activations() if a["status"] == "completed"], timeout=30,
                            message="worker-1's activation to complete")
        wait_until(lambda: store.artifact_snapshot(done["id"]), timeout=10, message="its artifacts recorded")
        assert cli("stop", "demo", "--root", str(R)).returncode == 0
        config = str(Path("..") / "other" / "again.yaml")  # relative to the working folder, too
        replayed = cli("replay", "demo", "--as", "again", "--config", config, "--root", str(R), cwd=elsewhere)
        assert (replayed.returncode, replayed.stderr) == (0, ""), replayed.stderr
        forked = cli("fork", "demo", "--at", done["id"], "--as", "forked", "--config", config, "--root", str(R),
                     cwd=elsewhere)
        assert (forked.returncode, forked.stderr) == (0, ""), forked.stderr
    root = suzumio_store.Root(R)
    for name in ("again", "forked"):
        script = root.open_project(name).config()["backend"]["runner"]["models"]["providers"]["replay"]["script"]
        assert script["agents"]["worker-*"][0]["steps"] == [{"say": "From the other folder."}], name


def test_examples_writes_every_example_and_never_overwrites_without_force(tmp_path, R):
    folder = tmp_path / "ex"
    result = run("examples", str(folder))
    shipped = sorted(p.relative_to(REPO / "examples") for p in (REPO / "examples").rglob("*") if p.is_file())
    assert sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file()) == shipped
    assert result.code == 0 and result.out == (
        f"Wrote {len(shipped)} files to {folder} (demo-script.yaml, demo.yaml, imports/, smoke.yaml, team.yaml)\n"
        f"Next: suzumio init {folder / 'demo.yaml'}\n")
    (folder / "demo.yaml").write_text("mine")
    refused = run("examples", str(folder))
    assert (refused.code, refused.out) == (1, "")
    assert refused.err == (f"Error: {folder / 'demo-script.yaml'} and {len(shipped) - 1} more already exist; "
                           "nothing written (--force overwrites)\n")
    assert (folder / "demo.yaml").read_text() == "mine"
    assert run("examples", str(folder), "--force").code == 0
    assert (folder / "demo.yaml").read_bytes() == (REPO / "examples" / "demo.yaml").read_bytes()
    assert run("init", str(folder / "demo.yaml"), "--root", str(R)).code == 0
    assert run("init", str(folder / "imports" / "project.yaml"), "--root", str(R)).code == 0
