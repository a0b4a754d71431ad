"""A team's output (suzumio_output): the report, the artifact files with their recorded versions, one
version's content and two versions compared, through the user routes of the real app on Waitress and
through the CLI (`report`, `request-changes`, `artifacts`) over the same root."""
import contextlib
import http.client
import io
import json

import pytest
from conftest import wait_until
from store_fixtures import config_of

import suzumio
import suzumio_coordination as coordination
import suzumio_recorder

pytestmark = pytest.mark.timeout(120)

BINARY = bytes(range(256))


def record(store, agent, files):
    """One activation of `agent` after which its artifacts folder holds `files` ({path: bytes, or None to
    delete}), recorded by the flight recorder as it records every ended activation."""
    activation = coordination.start_activation(store, agent, "Work.", [])["id"]
    folder = store.artifacts_dir(agent)
    for path, data in files.items():
        target = folder / path
        if data is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    coordination.complete_activation(store, config_of(store), activation, agent, "done")
    suzumio_recorder.record_artifacts(store, activation, agent)
    return activation


@pytest.fixture
def team(demo):
    """pm's notes.txt in two recorded versions (and a third written after the last recording), worker's
    out.bin recorded once, a file that was recorded and deleted, and a symbolic link out of the folder."""
    record(demo, "pm", {"notes.txt": b"# Notes\nold line\n", "gone.txt": b"bye\n"})
    record(demo, "worker", {"runs/out.bin": BINARY})
    record(demo, "pm", {"notes.txt": b"# Notes\nnew line\n", "gone.txt": None})
    (demo.artifacts_dir("pm") / "notes.txt").write_bytes(b"# Notes\nnew line\nunrecorded line\n")
    (demo.artifacts_dir("pm") / "passwd").symlink_to("/etc/passwd")
    return demo


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- the API

def test_artifacts_lists_every_agents_files_with_their_recorded_versions(service, team):
    response = service.get("/api/projects/demo/artifacts")
    assert response.status_code == 200
    assert response.json() == [
        {"agent": "pm", "path": "notes.txt", "size": 33, "versions": 2},
        {"agent": "worker", "path": "runs/out.bin", "size": 256, "versions": 1}]


def test_an_artifact_reads_as_it_is_now_or_as_a_recorded_version(service, team):
    now = service.get("/api/projects/demo/artifacts/pm/notes.txt").json()
    assert now == {"agent": "pm", "path": "pm/notes.txt", "version": None, "versions": 2, "size": 33,
                   "content": "# Notes\nnew line\nunrecorded line\n", "binary": False}
    first = service.get("/api/projects/demo/artifacts/pm/notes.txt?version=1").json()
    assert (first["version"], first["content"]) == (1, "# Notes\nold line\n")
    assert service.get("/api/projects/demo/artifacts/pm/notes.txt?version=2").json()["content"] == "# Notes\nnew line\n"
    encoded = service.get("/api/projects/demo/artifacts/pm%2Fnotes.txt?version=2").json()
    assert encoded["version"] == 2
    binary = service.get("/api/projects/demo/artifacts/worker/runs/out.bin").json()
    assert (binary["version"], binary["content"], binary["binary"], binary["size"]) == (1, None, True, 256)
    raw = service.get("/api/projects/demo/artifacts/worker/runs/out.bin?raw=1")
    assert raw.status_code == 200 and raw.content == BINARY
    assert raw.headers["Content-Type"] == "application/octet-stream"
    assert raw.headers["Content-Disposition"] == "attachment; filename*=UTF-8''out.bin"


@pytest.mark.parametrize("path, status, error", [
    ("pm/notes.txt?version=3", 404, "Unknown version 3 of pm/notes.txt (it has 2)"),
    ("pm/gone.txt", 404, "Unknown artifact: pm/gone.txt"),
    ("pm/gone.txt?version=1", 200, None),
    ("pm/passwd", 404, "Unknown artifact: pm/passwd"),
    ("pm/passwd?version=1", 404, "No recorded versions of pm/passwd"),
    ("ghost/notes.txt", 404, "Unknown agent: ghost"),
    ("pm/notes.txt?version=0", 400, "version must be a positive integer, got '0'"),
    ("pm/notes.txt?version=two", 400, "version must be a positive integer, got 'two'"),
    ("pm", 400, "Invalid artifact path: 'pm' (expected <agent>/<path inside its folder>)"),
    ("pm/%2E%2E/%2E%2E/suzumio.sqlite", 400,
     "Invalid artifact path: 'pm/../../suzumio.sqlite' (expected <agent>/<path inside its folder>)"),
    ("%2Fetc%2Fpasswd", 400, "Invalid artifact path: '/etc/passwd' (expected <agent>/<path inside its folder>)"),
    ("pm//notes.txt", 400, "Invalid artifact path: 'pm//notes.txt' (expected <agent>/<path inside its folder>)"),
])
def test_artifact_paths_and_versions_are_checked(service, team, path, status, error):
    response = service.get(f"/api/projects/demo/artifacts/{path}")
    assert response.status_code == status, response.text
    if error is not None:
        assert response.json() == {"error": error}


def test_a_path_with_dot_segments_sent_as_is_is_refused(service, team):
    """A client that does not normalize `..` (http.client sends the target as written)."""
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        connection.request("GET", "/api/projects/demo/artifacts/pm/../../../../etc/passwd?raw=1",
                           headers=service.auth_headers)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    assert response.status == 400
    assert json.loads(body)["error"].startswith("Invalid artifact path: 'pm/../../../../etc/passwd'")


def test_two_versions_compare_as_a_unified_diff(service, team):
    answer = service.get("/api/projects/demo/artifacts/pm/notes.txt/diff?from=1&to=2").json()
    assert answer == {"path": "pm/notes.txt", "from": 1, "to": 2, "diff": (
        "--- a/pm/notes.txt@1\n+++ b/pm/notes.txt@2\n@@ -1,2 +1,2 @@\n # Notes\n-old line\n+new line\n")}
    against_now = service.get("/api/projects/demo/artifacts/pm/notes.txt/diff?from=2").json()
    assert against_now["to"] is None and against_now["diff"].endswith(" new line\n+unrecorded line\n")
    assert service.get("/api/projects/demo/artifacts/pm/notes.txt/diff?to=2").json() == {
        "error": "from is required (a version number)"}
    assert service.get("/api/projects/demo/artifacts/pm/notes.txt/diff?from=1&to=9").status_code == 404
    binary = service.get("/api/projects/demo/artifacts/worker/runs/out.bin/diff?from=1")
    assert binary.status_code == 400 and "not text" in binary.json()["error"]


def test_a_file_named_diff_reads_like_any_other(service, team):
    record(team, "pm", {"diff": b"not a diff\n"})
    answer = service.get("/api/projects/demo/artifacts/pm/diff").json()
    assert (answer["path"], answer["content"], answer["version"]) == ("pm/diff", "not a diff\n", 1)


def test_the_report_is_text_or_json_as_asked(service, demo):
    assert service.get("/api/projects/demo/report").text == "No report submitted.\n"
    as_json = {"Accept": "application/json"}
    assert service.get("/api/projects/demo/report", headers=as_json).json() == {"report": None, "status": "running"}
    coordination.submit_report(demo, "pm", None, "# Card\n\nDone.")
    assert service.get("/api/projects/demo/report").text == "# Card\n\nDone.\n"
    assert service.get("/api/projects/demo/report", headers=as_json).json() == {
        "report": "# Card\n\nDone.\n", "status": "submitted"}


# ---------------------------------------------------------------- the CLI

def test_report_prints_the_report_or_one_line_error(service, demo):
    root = str(service.root.path)
    assert cli("report", "demo", "--root", root) == (1, "", "Error: No report submitted for demo yet (it is running)\n")
    coordination.submit_report(demo, "pm", None, "# Card\n\nDone.")
    assert cli("report", "demo", "--root", root) == (0, "# Card\n\nDone.\n", "")
    assert cli("report", "ghost", "--root", root) == (1, "", "Error: Unknown project: ghost\n")


def test_request_changes_sends_a_submitted_project_back_to_work(service, demo):
    root = str(service.root.path)
    code, out, err = cli("request-changes", "demo", "Warmer", "wishes.", "--root", root)
    assert (code, out) == (1, "")
    assert err == "Error: Project demo is running, not submitted: there is no report to request changes on\n"
    assert demo.list_messages(10) == []
    coordination.submit_report(demo, "pm", None, "# Card")
    code, out, err = cli("request-changes", "demo", "Warmer", "wishes.", "--root", root)
    [message] = demo.list_messages(10)
    assert (code, out, err) == (0, f"demo: running; sent {message['id']} to pm\n", "")
    assert (message["sender"], message["recipient"], message["priority"], message["body"]) == (
        "user", "pm", "P2", "Warmer wishes.")
    assert demo.project()["status"] == "running"
    # the pass it ran woke pm, whose local runner reaches this server
    wait_until(lambda: demo.list_activations(10) and not demo.running_activations(), 60, message="pm's activation")
    assert cli("request-changes", "demo", "--root", root)[0] == 1  # no text: the usage


def test_artifacts_lists_prints_a_file_and_an_older_version(service, team):
    root = str(service.root.path)
    assert cli("artifacts", "demo", "--root", root) == (0, (
        "pm/notes.txt 33 bytes, 2 versions\nworker/runs/out.bin 256 bytes, 1 version\n"), "")
    code, out, _ = cli("artifacts", "demo", "--json", "--root", root)
    assert json.loads(out)[0] == {"agent": "pm", "path": "notes.txt", "size": 33, "versions": 2}
    assert cli("artifacts", "demo", "pm/notes.txt", "--root", root) == (
        0, "# Notes\nnew line\nunrecorded line\n", "")
    assert cli("artifacts", "demo", "pm/notes.txt", "--version", "1", "--root", root) == (0, "# Notes\nold line\n", "")
    code, out, _ = cli("artifacts", "demo", "pm/notes.txt", "--version", "2", "--json", "--root", root)
    assert json.loads(out)["content"] == "# Notes\nnew line\n"
    assert cli("artifacts", "demo", "pm/notes.txt", "--version", "7", "--root", root) == (
        1, "", "Error: Unknown version 7 of pm/notes.txt (it has 2)\n")
    assert cli("artifacts", "demo", "pm/../x", "--root", root)[2].startswith("Error: Invalid artifact path:")
    assert cli("artifacts", "demo", "worker/runs/out.bin", "--root", root)[2] == (
        "Error: worker/runs/out.bin is binary (256 bytes); print it to a terminal or file\n")
    code, out, err = cli("artifacts", "demo", "--version", "1", "--root", root)
    assert code == 1 and err == "Error: --version N needs the <agent>/<path> of one file\n"


def test_a_binary_artifact_goes_to_standard_output_as_bytes(service, team):
    buffer = io.BytesIO()
    out = io.TextIOWrapper(buffer, encoding="utf-8")
    with contextlib.redirect_stderr(io.StringIO()):
        code = suzumio.main(["artifacts", "demo", "worker/runs/out.bin", "--root", str(service.root.path)], out=out)
    out.flush()
    assert code == 0 and buffer.getvalue() == BINARY
