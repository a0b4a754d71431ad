"""suzumio_project_files through the user routes on Waitress (a real root and SQLite files): a project file
sent as text is checked as `config render` does, every error with its dotted path, and initialized as
`init` does, started when asked; it never reads the controller's environment or files."""
import pytest
from api_fixtures import serving
from webui_fixtures import DEMO_AGENTS, project_text

pytestmark = pytest.mark.timeout(120)

BAD = """\
name: broken
task: Fail.
agents:
  pm:
    tools: [messages.send, 3]
  w: 5
backend: {kind: weird}
"""


@pytest.fixture()
def service(tmp_path):
    with serving(tmp_path / "root") as service:
        yield service


def good(name="pasted", task="Plan the survey."):
    return project_text(name, "", task=task, agents=DEMO_AGENTS, toolpacks="[core, shell]")


def test_a_valid_file_is_reported_with_its_name_agents_and_warnings(service):
    answer = service.post("/api/config/validate", {"config": good()})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["valid"], body["errors"], body["name"], body["agents"]) == (True, [], "pasted", ["pm", "researcher"])
    assert any("backend.kind local" in line for line in body["warnings"])
    assert service.get("/api/projects").json() == []  # checking creates nothing


def test_every_schema_error_is_listed_with_its_dotted_path(service):
    body = service.post("/api/config/validate", {"config": BAD}).json()
    assert body["valid"] is False
    assert body["errors"] == [
        "backend.kind: Invalid enum value. Expected 'docker-chat' | 'local' | 'swarm', received 'weird'",
        "agents.pm.tools.1: Expected string, received number",
        "agents.w: Expected object, received number"]


def test_placeholders_see_no_environment_and_imports_no_host_file(service, monkeypatch):
    monkeypatch.setenv("SUZUMIO_TEST_SECRET", "hunter2")
    answer = service.post("/api/config/validate", {"config": good(task="${SUZUMIO_TEST_SECRET}")})
    assert answer.json() == {"valid": False, "errors": ["task: String must contain at least 1 character(s)"]}
    assert "hunter2" not in answer.text
    body = service.post("/api/config/validate", {"config": "name: x\n@import: /etc/passwd\n"}).json()
    assert body["valid"] is False


def test_a_file_is_initialized_and_started_and_its_name_is_taken_after(service):
    created = service.post("/api/projects", {"config": good(), "start": True})
    assert created.status_code == 201, created.text
    assert (created.json()["id"], created.json()["status"]) == ("pasted", "running")
    assert service.store("pasted").source_yaml_path.read_text(encoding="utf-8") == good()
    again = service.post("/api/projects", {"config": good()})
    assert again.status_code == 409 and again.json() == {"error": "Project already initialized: pasted"}
    quiet = service.post("/api/projects", {"config": good(name="later")})
    assert quiet.status_code == 201 and quiet.json()["status"] == "initialized"


@pytest.mark.parametrize(("body", "message"), [
    ({"config": BAD}, "Invalid project config: backend.kind: "),
    ({"config": ""}, "config must be a project file (YAML text)"),
    ({}, "config must be a project file (YAML text)"),
    ({"config": "name: x\n", "start": "yes"}, "start must be true or false"),
])
def test_a_bad_request_names_what_is_wrong(service, body, message):
    answer = service.post("/api/projects", body)
    assert answer.status_code == 400 and answer.json()["error"].startswith(message), answer.text
    assert service.get("/api/projects").json() == []
