"""The one error shape (docs/http-api.md) across user and runner routes, strict
paths, project-segment checks and rejected requests without side effects."""
import logging
import re

import pytest
from api_fixtures import running_activation
from store_fixtures import config_of

import suzumio_coordination as coordination
import suzumio_store
from suzumio_http import MAX_BODY_BYTES

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def service_options(tmp_path):
    return {"webui_dir": tmp_path / "no-build"}


@pytest.fixture
def identity(service, demo):
    activation = running_activation(demo, "worker")
    return {"project": "demo", "agentId": "worker", "activationId": activation["id"],
            "token": service.token("demo", "worker")}


def assert_error(response, status, message):
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.json() == {"error": message}
    assert response.text == '{\n  "error": ' + response.text.split(": ", 1)[1]
    assert response.text.endswith("}\n")


def test_error_shape_is_the_same_on_every_route(service, demo, identity):
    completed = running_activation(demo, "pm")
    coordination.complete_activation(demo, config_of(demo), completed["id"], "pm", "done")
    pm = {**identity, "agentId": "pm", "activationId": completed["id"], "token": service.token("demo", "pm")}
    cases = [
        (service.get("/nope"), 404, "not found"),
        (service.get("/runner/signals"), 404, "not found"),
        (service.post("/health"), 404, "not found"),
        (service.get("/api/projects/demo/"), 404, "not found"),
        (service.get("/api/projects/demo/events/x"), 404, "not found"),
        (service.call("DELETE", "/api/projects/demo"), 404, "not found"),
        (service.get("/api/projects/ghost/messages"), 404, "Unknown project: ghost"),
        (service.get("/api/projects/demo/agents/ghost/history"), 404, "Unknown agent: ghost"),
        (service.get("/api/projects/demo/activations/act_x/context"), 404, "Unknown activation: act_x"),
        (service.get("/"), 404, "webui asset not found. Run npm run build."),
        (service.call("POST", "/api/projects/demo/messages", data=b"{bad"), 400, None),
        (service.post("/api/projects/demo/messages", [1]), 400, "body is required"),
        (service.post("/api/projects/demo/tool-ui/nope/x", {}), 404, "Unknown toolpack: nope"),
        (service.post("/api/projects/demo/tool-ui/core/nope", {}), 404,
         "Unknown WebUI entry nope in toolpack core"),
        (service.post("/api/projects/demo/tool-ui/core/messages.send", {}), 500, "body is required"),
        (service.post("/api/projects/demo/tool-ui/core/messages.send", {"sender": "ghost", "body": "x"}), 500,
         "Unknown sender: ghost"),
        (service.post("/api/projects/demo/tool-ui/core/coordination.signals", {"status": "open"}), 500,
         "Invalid signal status: open"),
        (service.post("/runner/tool-calls/start", {**identity, "token": "nope", "tool": "shell.exec"}), 403,
         "Invalid agent token"),
        (service.post("/runner/tool-calls/start", {**identity}), 400, "tool is required"),
        (service.post("/runner/tool-calls/start", {**identity, "tool": "nope"}), 404, "Unknown tool: nope"),
        (service.post("/runner/signals", {**pm, "kind": "x"}), 409,
         f"Activation {completed['id']} is completed; no more tool calls are accepted"),
        (service.post("/toolpacks/nope/support", {**identity, "tool": "x", "input": {}}), 404,
         "Unknown toolpack: nope"),
        (service.post("/activation-output", {**identity, "output": {}}), 400, "output.text is required"),
    ]
    for response, status, message in cases:
        if message is None:
            assert response.status_code == status
            assert response.json()["error"].startswith("Invalid JSON body: ")
        else:
            assert_error(response, status, message)
    assert len(cases) >= 15


def test_unknown_project_is_404_and_creates_nothing(service):
    response = service.get("/api/projects/ghost")
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert response.content == b'{\n  "error": "Unknown project: ghost"\n}\n'
    assert not (service.root.path / "ghost").exists()
    stream = service.get("/api/projects/ghost/stream")
    assert_error(stream, 404, "Unknown project: ghost")
    assert not (service.root.path / "ghost").exists()


def test_project_segment_is_checked_before_any_file_is_opened(service, identity):
    assert_error(service.get("/api/projects/%2E%2E/events"), 404, "Unknown project: ..")
    assert_error(service.get("/api/projects/a%2Fb"), 404, "Unknown project: a/b")
    assert_error(service.get("/api/projects/%FF"), 404, "Unknown project: \ufffd")
    signal = service.post("/runner/signals", {**identity, "project": "../demo", "kind": "x"})
    assert_error(signal, 404, "Unknown project: ../demo")
    assert not (service.root.path.parent / "suzumio.sqlite").exists()
    # The runner socket's folder, the API token file and the serve's lock: none of them is a project.
    beside = {suzumio_store.RUN_DIR, suzumio_store.API_TOKEN_FILE, suzumio_store.SERVE_LOCK_FILE}
    assert sorted(p.name for p in service.root.path.iterdir() if p.name not in beside) == ["demo"]


def test_percent_encoded_segments_are_decoded(service, identity):
    response = service.post("/toolpacks/co%72e/support", {**identity, "tool": "file.read", "input": {}})
    assert response.status_code == 200 and response.json()["metadata"] == {"toolpack": "core", "tool": "file.read"}


def test_rejected_messages_write_nothing(service, demo):
    before = demo.project_stats()
    path = "/api/projects/demo/messages"
    assert_error(service.post(path, {"recipient": "pm", "priority": "P9", "body": "x"}), 400, "Invalid priority: P9")
    assert_error(service.post(path, {}), 400, "body is required")
    assert_error(service.post(path, {"recipient": "ghost", "priority": "P9"}), 400, "body is required")
    assert_error(service.post(path, {"body": "x"}), 400, "Message needs recipient or channel")
    assert_error(service.post(path, {"recipient": "pm", "channel": "#project", "body": "x"}), 400,
                 'Message cannot have both recipient and channel: drop "channel" to send to pm only, '
                 'or drop "recipient" to post to #project')
    assert_error(service.post(path, {"channel": "#nope", "body": "x"}), 400, "Unknown channel: #nope")
    assert_error(service.post(path, {"recipient": "ghost", "body": "x"}), 400, "Unknown agent: ghost")
    assert demo.project_stats() == before


def test_malformed_json_is_a_400_whatever_the_content_type(service, demo):
    for content_type in ("application/json", "text/plain"):
        response = service.call("POST", "/api/projects/demo/messages", data=b"{bad json",
                                headers={"Content-Type": content_type})
        assert response.status_code == 400
        assert response.json()["error"].startswith("Invalid JSON body: ")
    assert demo.project_stats()["messageCount"] == 0


def test_blank_body_counts_as_an_empty_object(service):
    response = service.call("POST", "/api/projects/demo/messages", data=b"  \n ")
    assert_error(response, 400, "body is required")


def test_oversized_body_is_refused(service, demo):
    payload = b'{"recipient": "pm", "body": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}'
    response = service.call("POST", "/api/projects/demo/messages", data=payload, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"].startswith("Request body too large")
    assert demo.project_stats()["messageCount"] == 0


def test_unexpected_exception_is_a_500_naming_an_id_the_log_explains(service, demo, caplog):
    (demo.dir / "resolved.yaml").unlink()
    with caplog.at_level(logging.ERROR, logger="suzumio_http"):
        response = service.get("/api/projects/demo/config/resolved")
    assert response.status_code == 500
    error = response.json()["error"]
    match = re.fullmatch(r"Internal error \(id ([0-9a-f]{12})\)", error)
    assert match, error
    assert "resolved.yaml" not in response.text and "Traceback" not in response.text
    (record,) = [r for r in caplog.records if match.group(1) in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is FileNotFoundError
    assert "resolved.yaml" in str(record.exc_info[1])
