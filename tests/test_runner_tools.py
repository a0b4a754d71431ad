"""Runner-local tools (docs/design/runner.md, docs/design/tools.md): argument rules, file.read/write/patch
with lexical and real-path confinement, shell.exec process groups and limits, web.fetch against local
HTTP servers and a recording proxy."""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conftest import wait_until
from fake_model import RecordingProxy

import suzumio_runner_models as models
import suzumio_runner_tools as tools
from suzumio_runner_tools import ToolError

DOCKER_READ = ["/workspace", "/artifacts", "/mnt"]
DOCKER_WRITE = ["/workspace", "/artifacts/worker"]


@pytest.fixture
def roots(tmp_path):
    """Temp roots W (workspace), A (artifacts root, with A/worker and A/pm) and M (a mount)."""
    base = Path(os.path.realpath(tmp_path))
    paths = {"W": base / "ws", "A": base / "artifacts", "M": base / "mnt"}
    for folder in (paths["W"], paths["A"] / "worker", paths["A"] / "pm", paths["M"] / "ref"):
        folder.mkdir(parents=True)
    paths["read"] = [str(paths["W"]), str(paths["A"]), str(paths["M"])]
    paths["write"] = [str(paths["W"]), str(paths["A"] / "worker")]
    return paths


def read(args, roots):
    return tools.file_read(args, str(roots["W"]), roots["read"])


def write(args, roots):
    return tools.file_write(args, str(roots["W"]), roots["write"])


def patch(operations, roots):
    return tools.file_patch({"operations": operations}, str(roots["W"]), roots["write"])


def error_of(call, *args):
    with pytest.raises(ToolError) as caught:
        call(*args)
    return str(caught.value)


# -- argument rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, "5", True, None, float("nan")])
def test_bounded_rejects_non_positive_and_non_numbers(value):
    assert error_of(tools.bounded, {"limit": value}, "limit", 200, 2000) == "Expected a positive number"


def test_bounded_defaults_floors_caps_and_raises_fractions_to_one():
    assert tools.bounded({}, "limit", 200, 2000) == 200
    assert tools.bounded({"limit": 5000}, "limit", 200, 2000) == 2000
    assert tools.bounded({"limit": 7.9}, "limit", 200, 2000) == 7
    assert tools.bounded({"limit": 0.5}, "limit", 200, 2000) == 1


def test_optional_boolean_rejects_other_values_with_json_text():
    assert error_of(tools.optional_bool, {"x": "true"}, "x") == "Expected boolean, got true"
    assert error_of(tools.optional_bool, {"x": 1}, "x") == "Expected boolean, got 1"
    assert error_of(tools.optional_bool, {"x": None}, "x") == "Expected boolean, got null"
    assert error_of(tools.optional_bool, {"x": 2.0}, "x") == "Expected boolean, got 2"
    assert tools.optional_bool({"x": False}, "x") is False
    assert tools.optional_bool({}, "x") is None


def test_non_object_input_and_blank_required_strings_are_rejected(roots):
    assert error_of(read, ["a"], roots) == "Tool input must be an object"
    assert error_of(read, {"path": "   "}, roots) == "path is required"
    assert error_of(write, {"path": "a.txt", "content": 3}, roots) == "content must be a string"


# -- confinement ------------------------------------------------------------------------------


def test_docker_roots_reject_escapes_with_exact_messages():
    def read_docker(path):
        return error_of(tools.confined_path, path, "/workspace", DOCKER_READ, "Read")

    def write_docker(path):
        return error_of(tools.confined_path, path, "/workspace", DOCKER_WRITE, "Write")

    assert (
        read_docker("/workspace/../etc/passwd")
        == "Read path must be under /workspace, /artifacts, or /mnt: /workspace/../etc/passwd"
    )
    assert (
        read_docker("/etc/passwd") == "Read path must be under /workspace, /artifacts, or /mnt: /etc/passwd"
    )
    assert (
        read_docker("a/../../etc") == "Read path must be under /workspace, /artifacts, or /mnt: a/../../etc"
    )
    assert (
        write_docker("/artifacts/pm/x")
        == "Write path must be under /workspace or /artifacts/worker: /artifacts/pm/x"
    )
    assert write_docker("/mnt/ref/x").startswith("Write path must be under")
    assert write_docker("/artifacts/worker-2/x").startswith("Write path must be under")
    assert write_docker("//etc/x").startswith("Write path must be under")


def test_the_path_a_write_beside_the_own_artifact_folder_meant():
    def meant(path):
        return tools.meant_path(path, "/workspace", DOCKER_WRITE)

    # the forms a small model wrote for /artifacts/worker/sea.md
    for path in ("/artifacts/sea.md", "/artifacts/worker:sea.md", "/artifacts/worker_sea.md", "../artifacts/sea.md"):
        assert meant(path) == "/artifacts/worker/sea.md", path
    assert meant("/artifacts/workers.md") == "/artifacts/worker/workers.md"
    # under a root already, in another agent's folder, elsewhere, the artifact root itself: nothing meant
    for path in ("/artifacts/worker/sea.md", "sea.md", "/artifacts/pm/sea.md", "/etc/sea.md", "/artifacts", "/"):
        assert meant(path) is None, path
    assert tools.meant_path("/artifacts/sea.md", "/workspace", ["/workspace"]) is None  # no artifact folder


def test_single_root_message_names_the_root(roots):
    message = error_of(tools.confined_path, "/etc/hosts", str(roots["W"]), [str(roots["W"])], "Read")
    assert message == "Read path must be under {}: /etc/hosts".format(roots["W"])


def test_temp_roots_resolve_relative_paths_and_confine(roots):
    assert tools.confined_path("notes.txt", str(roots["W"]), roots["write"], "Write") == str(
        roots["W"] / "notes.txt"
    )
    assert write({"path": str(roots["A"] / "worker" / "r.md"), "content": "r"}, roots)[
        "output"
    ] == "Wrote 1 chars to %s" % (roots["A"] / "worker" / "r.md")
    assert error_of(
        read, {"path": "/etc/hostname"}, roots
    ) == "Read path must be under {}, {}, or {}: /etc/hostname".format(roots["W"], roots["A"], roots["M"])
    assert error_of(
        write, {"path": str(roots["A"] / "pm" / "x"), "content": ""}, roots
    ) == "Write path must be under {} or {}: {}".format(
        roots["W"], roots["A"] / "worker", roots["A"] / "pm" / "x"
    )
    assert error_of(write, {"path": "../artifacts/pm/x", "content": ""}, roots).startswith(
        "Write path must be under"
    )


def test_symlink_out_of_the_workspace_cannot_be_read_or_written(roots):
    (roots["W"] / "link").symlink_to("/etc")
    assert error_of(read, {"path": "link/hostname"}, roots).startswith("Read path must be under")
    assert error_of(write, {"path": str(roots["W"] / "link" / "x"), "content": "x"}, roots).startswith(
        "Write path must be under"
    )
    assert error_of(patch, [{"op": "add", "path": "link/x", "content": "x"}], roots).startswith("Write path")


def test_symlinked_file_pointing_outside_is_rejected(roots, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    (roots["W"] / "innocent.txt").symlink_to(secret)
    assert error_of(read, {"path": "innocent.txt"}, roots).startswith("Read path must be under")
    assert error_of(write, {"path": "innocent.txt", "content": "x"}, roots).startswith(
        "Write path must be under"
    )
    assert secret.read_text() == "s"


def test_link_into_another_agents_artifacts_is_readable_but_not_writable(roots):
    (roots["A"] / "pm" / "plan.md").write_text("plan\n")
    (roots["W"] / "pm-art").symlink_to(roots["A"] / "pm")
    assert read({"path": "pm-art/plan.md"}, roots)["output"] == "1: plan\n2: "
    assert error_of(write, {"path": "pm-art/plan.md", "content": "x"}, roots).startswith(
        "Write path must be under"
    )
    assert (roots["A"] / "pm" / "plan.md").read_text() == "plan\n"


def test_link_into_a_read_only_mount_can_be_read_but_not_written(roots):
    (roots["M"] / "ref" / "doc.txt").write_text("doc")
    (roots["W"] / "ref").symlink_to(roots["M"] / "ref")
    assert read({"path": "ref/doc.txt"}, roots)["output"] == "1: doc"
    assert error_of(write, {"path": "ref/doc.txt", "content": "x"}, roots).startswith(
        "Write path must be under"
    )


def test_roots_reached_through_a_symlink_still_accept_their_files(tmp_path):
    real = tmp_path / "real"
    (real / "ws").mkdir(parents=True)
    (tmp_path / "L").symlink_to(real)
    workspace = str(tmp_path / "L" / "ws")
    tools.file_write({"path": "notes.txt", "content": "n"}, workspace, [workspace])
    assert tools.file_read({"path": "notes.txt"}, workspace, [workspace])["output"] == "1: n"
    assert (real / "ws" / "notes.txt").read_text() == "n"


def test_hard_links_to_files_outside_the_roots_are_refused(roots, tmp_path):
    """A file with more than one name is refused (tests/test_isolation.py covers write and patch too)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("o")
    os.link(outside, roots["W"] / "hard.txt")
    assert error_of(read, {"path": "hard.txt"}, roots).startswith(
        f"Refusing {roots['W'] / 'hard.txt'}: the file has 2"
    )


# -- file.read --------------------------------------------------------------------------------


def test_file_read_numbers_lines_and_reports_metadata(roots):
    (roots["W"] / "n.txt").write_text("a\nb\nc\n")
    result = read({"path": "n.txt", "offset": 2, "limit": 1}, roots)
    assert result["title"] == "file read"
    assert result["output"] == "2: b"
    assert result["metadata"] == {
        "path": str(roots["W"] / "n.txt"),
        "kind": "file",
        "lines": 4,
        "offset": 2,
        "limit": 1,
        "truncated": False,
    }
    assert read({"path": "n.txt", "offset": 10}, roots)["output"] == "(empty file range)"
    assert read({"path": "n.txt", "limit": 5000}, roots)["metadata"]["limit"] == 2000


def test_file_read_handles_crlf_and_invalid_utf8(roots):
    (roots["W"] / "c.txt").write_bytes(b"x\r\ny\xff\n")
    assert read({"path": "c.txt"}, roots)["output"] == "1: x\n2: y\ufffd\n3: "


def test_file_read_cuts_long_lines_and_caps_bytes(roots):
    (roots["W"] / "long.txt").write_text("x" * 3000)
    assert read({"path": "long.txt"}, roots)["output"] == "1: " + "x" * 2000 + "... (line truncated)"
    (roots["W"] / "line.txt").write_text("y" * 300)
    result = read({"path": "line.txt", "maxBytes": 100}, roots)
    assert result["output"] == ("1: " + "y" * 97) + "\n\n[truncated 203 bytes]"
    assert result["metadata"]["truncated"] is True


def test_file_read_of_a_directory_lists_sorted_entries(roots):
    folder = roots["W"] / "d"
    (folder / "src").mkdir(parents=True)
    (folder / "b.txt").write_text("")
    (folder / "A.md").write_text("")
    (folder / "lnk").symlink_to(folder / "src")
    result = read({"path": "d"}, roots)
    assert result["output"] == "A.md\nb.txt\nlnk\nsrc/"
    assert result["metadata"]["kind"] == "directory"
    assert result["metadata"]["entries"] == 4
    assert read({"path": "d", "offset": 9}, roots)["output"] == "(empty directory range)"


def test_file_read_of_missing_file_is_the_os_error(roots):
    with pytest.raises(FileNotFoundError):
        read({"path": "missing.txt"}, roots)


# -- file.write and file.patch ----------------------------------------------------------------


def test_file_write_needs_parents_unless_create_dirs(roots):
    target = roots["A"] / "worker" / "new" / "x.md"
    with pytest.raises(FileNotFoundError):
        write({"path": str(target), "content": ""}, roots)
    result = write({"path": str(target), "content": "", "createDirs": True}, roots)
    assert result == {
        "title": "file written",
        "output": f"Wrote 0 chars to {target}",
        "metadata": {"path": str(target), "chars": 0},
    }
    assert target.exists()


def test_file_patch_update_rules_and_literal_replacement(roots):
    path = roots["W"] / "p.txt"
    path.write_text("one two two")
    assert (
        error_of(patch, [{"op": "update", "path": "p.txt", "search": "zzz"}], roots)
        == f"Patch search text not found in {path}"
    )
    assert (
        error_of(patch, [{"op": "update", "path": "p.txt", "search": "two"}], roots)
        == f"Patch search text matched 2 times in {path}; set replaceAll:true or make search text unique"
    )
    result = patch(
        [{"op": "update", "path": "p.txt", "search": "two", "replace": "2", "replaceAll": True}], roots
    )
    assert result["output"] == f"update {path} (2 replacements)"
    patch([{"op": "update", "path": "p.txt", "search": "one", "replace": "$&x"}], roots)
    assert path.read_text() == "$&x 2 2"
    assert error_of(patch, [{"op": "update", "path": "p.txt", "search": "  "}], roots) == "search is required"


def test_file_patch_is_not_atomic_and_rejects_unknown_ops(roots):
    with pytest.raises(FileNotFoundError):
        patch(
            [
                {"op": "add", "path": "a.txt", "content": "1"},
                {"op": "update", "path": "missing.txt", "search": "x"},
            ],
            roots,
        )
    assert (roots["W"] / "a.txt").read_text() == "1"
    assert error_of(patch, [{"op": "rename", "path": "a.txt"}], roots) == "Unsupported patch op: rename"
    assert error_of(patch, [{"op": "rename", "path": "/etc/x"}], roots).startswith("Write path must be under")
    assert (
        error_of(tools.file_patch, {"operations": {}}, str(roots["W"]), roots["write"])
        == "operations must be an array"
    )
    result = patch(
        [{"op": "add", "path": "b.txt", "content": "xy"}, {"op": "delete", "path": "a.txt"}], roots
    )
    assert result == {
        "title": "file patch",
        "metadata": {"operations": 2},
        "output": "add {} (2 chars)\ndelete {}".format(roots["W"] / "b.txt", roots["W"] / "a.txt"),
    }
    assert patch([], roots)["output"] == ""


# -- shell.exec -------------------------------------------------------------------------------


class RecordingGroups(tools.ProcessGroups):
    def __init__(self):
        super().__init__()
        self.seen = []

    def add(self, pgid):
        self.seen.append(pgid)
        super().add(pgid)


def quiet_env(roots, **extra):
    """A login shell reads $HOME's profile: point HOME at an empty folder so output is only the command's."""
    env = {"PATH": os.environ["PATH"], "HOME": str(roots["W"].parent)}
    env.update(extra)
    return env


def shell(args, roots, groups=None):
    return tools.shell_exec(args, str(roots["W"]), quiet_env(roots), groups)


def test_shell_exec_reports_streams_and_exit_code(roots):
    result = shell({"command": "echo hi; echo err >&2; exit 3"}, roots)
    assert result["output"] == "$ echo hi; echo err >&2; exit 3\n[stdout]\nhi\n[stderr]\nerr\n[exit code 3]"
    assert result["metadata"] == {
        "exitCode": 3,
        "signal": None,
        "cwd": str(roots["W"]),
        "timedOut": False,
        "truncated": False,
    }


def test_shell_exec_cwd_is_resolved_but_not_confined(roots):
    (roots["W"] / "sub").mkdir()
    assert shell({"command": "pwd", "cwd": "sub"}, roots)["output"].endswith("\n" + str(roots["W"] / "sub"))
    assert shell({"command": "pwd", "cwd": "/"}, roots)["metadata"]["cwd"] == "/"
    with pytest.raises(ToolError):
        shell({"command": "pwd", "cwd": "nope"}, roots)


def test_shell_exec_stdin_is_dev_null(roots):
    result = shell({"command": "cat; echo done", "timeoutMs": 5000}, roots)
    assert result["output"] == "$ cat; echo done\n[stdout]\ndone"


def test_shell_exec_timeout_kills_the_whole_process_group(roots):
    groups = RecordingGroups()
    started = time.monotonic()
    result = shell({"command": "sleep 30 & sleep 30", "timeoutMs": 500}, roots, groups)
    assert time.monotonic() - started < 4
    assert result["metadata"]["timedOut"] is True
    assert result["metadata"]["exitCode"] is None
    assert result["metadata"]["signal"] in ("SIGTERM", "SIGKILL")
    [pgid] = groups.seen
    wait_until(lambda: not tools.group_alive(pgid), timeout=4, message="process group gone")
    assert groups.pgids == set()


def test_shell_exec_timeout_escalates_to_sigkill_for_ignored_sigterm(roots):
    groups = RecordingGroups()
    result = shell(
        {"command": "trap '' TERM; sleep 30 & trap '' TERM; sleep 30", "timeoutMs": 300}, roots, groups
    )
    assert result["metadata"]["timedOut"] is True
    wait_until(lambda: not tools.group_alive(groups.seen[0]), timeout=4, message="group killed")


def test_shell_exec_truncates_to_the_combined_budget(roots):
    result = shell({"command": "yes | head -c 100000", "maxOutputBytes": 100}, roots)
    stdout = result["output"].split("\n[stdout]\n", 1)[1]
    assert stdout.endswith("\n[truncated]")
    assert len(stdout[: -len("\n[truncated]")].encode()) <= 100
    assert result["metadata"]["truncated"] is True
    result = shell({"command": "printf 1234567890", "maxOutputBytes": 4}, roots)
    assert result["output"].endswith("[stdout]\n1234\n[truncated]")


def test_shell_exec_caps_timeout_and_validates_numbers(roots):
    assert tools.bounded({"timeoutMs": 999999}, "timeoutMs", 60000, 300000) == 300000
    with pytest.raises(ToolError, match="Expected a positive number"):
        shell({"command": "true", "timeoutMs": "5"}, roots)


def test_shell_exec_uses_the_given_environment(roots):
    result = tools.shell_exec(
        {"command": "echo $ONLY_HERE"}, str(roots["W"]), quiet_env(roots, ONLY_HERE="v1")
    )
    assert result["output"].endswith("[stdout]\nv1")


# -- web.fetch --------------------------------------------------------------------------------


class _Site(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    pages = {  # noqa: RUF012 - read-only table
        "/html": (
            200,
            "text/html; charset=utf-8",
            "<html><script>x()</script><style>p{}</style><p>A&amp;B&nbsp;&lt;c&gt;</p></html>",
        ),
        "/plain": (200, "text/plain", "<p>not html</p>"),
        "/missing": (404, "text/html", "<h1>Not here</h1>"),
        "/thirty": (200, "text/plain", "x" * 30),
        "/bare": (200, None, "no type"),
    }

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        self.server.paths.append(self.path)
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/plain")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/slow":
            self.server.stop.wait(5)
            status, kind, body = 200, "text/plain", "late"
        else:
            status, kind, body = self.pages.get(self.path, (404, "text/plain", "no"))
        payload = body.encode()
        self.send_response(status)
        if kind:
            self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    server.daemon_threads = True
    server.paths = []
    server.stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    server.stop.set()
    server.shutdown()
    server.server_close()


def fetch(args, env=None):
    return tools.web_fetch(args, env or {})


def test_web_fetch_extracts_text_from_html(site):
    url, _ = site
    result = fetch({"url": url + "/html"})
    assert result["output"] == "A&B <c>"
    assert result["metadata"] == {
        "url": url + "/html",
        "status": 200,
        "contentType": "text/html; charset=utf-8",
        "format": "text",
        "truncated": False,
    }


def test_web_fetch_raw_and_non_html_bodies_are_unchanged(site):
    url, _ = site
    assert fetch({"url": url + "/html", "format": "raw"})["output"].startswith("<html><script>x()</script>")
    assert fetch({"url": url + "/plain"})["output"] == "<p>not html</p>"
    assert "contentType" not in fetch({"url": url + "/bare"})["metadata"]


def test_web_fetch_returns_error_pages_with_their_status(site):
    url, _ = site
    result = fetch({"url": url + "/missing"})
    assert result["metadata"]["status"] == 404
    assert result["output"] == "[HTTP 404]\nNot here"  # what the model reads says it is an error page


def test_web_fetch_truncates_characters_and_follows_redirects(site):
    url, server = site
    result = fetch({"url": url + "/thirty", "maxBytes": 10})
    assert result["output"] == "x" * 10 + "\n\n[truncated]"
    assert result["metadata"]["truncated"] is True
    redirected = fetch({"url": url + "/redirect"})
    assert redirected["output"] == "<p>not html</p>"
    assert redirected["metadata"]["url"] == url + "/redirect"
    assert server.paths[-2:] == ["/redirect", "/plain"]


def test_web_fetch_rejects_bad_urls_and_formats():
    assert error_of(fetch, {"url": "ftp://x/y"}) == "Unsupported URL protocol: ftp:"
    assert error_of(fetch, {"url": "https://u:p@example.com/"}) == "URL credentials are not allowed"
    assert error_of(fetch, {"url": "http://h/", "format": "md"}) == "Invalid format: md"
    assert error_of(fetch, {"url": "not a url"}) == "Invalid URL: not a url"
    assert error_of(fetch, {"url": "http://h:99999/"}) == "Invalid URL: http://h:99999/"


def test_web_fetch_slow_server_fails_with_timeout(site):
    url, _ = site
    started = time.monotonic()
    message = error_of(fetch, {"url": url + "/slow", "timeoutMs": 200})
    assert message.startswith(f"web.fetch failed for {url}/slow: ")
    assert "timed out" in message
    assert time.monotonic() - started < 3


def test_web_fetch_goes_through_http_proxy_unless_no_proxy_matches(site):
    url, _ = site
    proxy = RecordingProxy()
    try:
        assert fetch({"url": url + "/plain"}, {"HTTP_PROXY": proxy.url})["output"] == "<p>not html</p>"
        assert proxy.seen == [("GET", url + "/plain")]
        fetch({"url": url + "/plain"}, {"HTTP_PROXY": proxy.url, "NO_PROXY": "localhost,127.0.0.1:8080"})
        assert len(proxy.seen) == 1
    finally:
        proxy.close()


def test_web_fetch_with_an_egress_forwarder_always_goes_there_and_reports_a_refusal(site):
    url, _ = site
    proxy = RecordingProxy()
    try:
        env = {"NO_PROXY": "*", "HTTP_PROXY": "http://127.0.0.1:9"}
        page = tools.web_fetch({"url": url + "/plain"}, env, egress_proxy=proxy.url)
        assert page["output"] == "<p>not html</p>" and proxy.seen == [("GET", url + "/plain")]
    finally:
        proxy.close()

    refusal = "egress to 127.0.0.1:1 is not allowed for pm; add it to agents.pm.egress"

    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (refusal + "\n").encode()
            self.send_response(403, refusal)
            self.send_header("X-Suzumio-Egress", "denied")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ToolError) as raised:
            tools.web_fetch({"url": "http://127.0.0.1:1/"}, {}, egress_proxy=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        server.server_close()
    assert str(raised.value) == refusal


def test_web_fetch_refuses_socks_proxies_with_a_hint(site):
    url, _ = site
    message = error_of(fetch, {"url": url + "/plain"}, {"ALL_PROXY": "socks5://127.0.0.1:1080"})
    assert "not supported" in message and "HTTP_PROXY" in message and "curl" in message


@pytest.mark.parametrize(
    "host,no_proxy,direct",
    [
        ("example.com", "*", True),
        ("api.example.com", ".example.com", True),
        ("example.com", "example.com:443", True),
        ("badexample.com", "example.com", False),
        ("EXAMPLE.com", " Example.COM ", True),
        ("other.org", "", False),
    ],
)
def test_proxy_for_honours_no_proxy_rules(host, no_proxy, direct):
    proxy = models.proxy_for(f"https://{host}/x", {"HTTPS_PROXY": "http://p:1", "NO_PROXY": no_proxy})
    assert (proxy is None) is direct


def test_proxy_for_picks_the_first_variable_per_scheme():
    env = {"http_proxy": "http://lower:1", "ALL_PROXY": "http://all:1", "HTTPS_PROXY": ""}
    assert models.proxy_for("http://h/", env) == "http://lower:1"
    assert models.proxy_for("https://h/", env) == "http://all:1"
    assert models.proxy_for("https://h/", {}) is None


def test_clean_html_is_case_insensitive_and_spans_lines():
    assert tools.clean_html("<SCRIPT type=x>\nbad()\n</Script><b>ok</b>\n\n&quot;q&#39;") == "ok \"q'"


def test_results_serialise_as_json(roots):
    (roots["W"] / "j.txt").write_text("j")
    json.dumps(read({"path": "j.txt"}, roots))
