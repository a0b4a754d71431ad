"""suzumio_inbox through the user routes on Waitress (a real root and SQLite files, no runner process):
a call awaiting approval, an agent a loop guard paused and a report awaiting review each appear once,
per project and across the root, and leave when a person decides them."""
import pytest
from api_fixtures import init_project, running_activation, serving
from test_approvals import PROJECT_YAML, start_gated

import suzumio_coordination as coordination
import suzumio_guards

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def served(tmp_path):
    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config", PROJECT_YAML)
        store.start()
        yield service, store


def kinds(answer):
    return [item["kind"] for item in answer["items"]]


def test_an_empty_project_waits_for_no_one(served):
    service, _ = served
    assert service.get("/api/projects/demo/inbox").json() == {"project": "demo", "count": 0, "items": []}
    assert service.get("/api/inbox").json() == {"count": 0, "projects": {"demo": 0}, "items": []}


def test_a_call_awaiting_approval_is_listed_until_it_is_decided(served):
    service, store = served
    _, started = start_gated(service, store)
    answer = service.get("/api/projects/demo/inbox").json()
    [item] = answer["items"]
    assert answer["count"] == 1
    assert item == {"kind": "approval", "project": "demo", "id": started["approval"]["id"], "agentId": "worker",
                    "tool": "shell.exec", "since": item["since"], "expiresAt": started["approval"]["expiresAt"]}
    assert service.get("/api/inbox").json() == {"count": 1, "projects": {"demo": 1}, "items": [item]}
    decided = service.post(f"/api/projects/demo/approvals/{item['id']}", {"decision": "deny"})
    assert decided.status_code == 200, decided.text
    assert service.get("/api/projects/demo/inbox").json()["count"] == 0


def test_a_paused_agent_is_listed_until_it_is_resumed(served):
    service, store = served
    activation = running_activation(store, "worker")["id"]
    suzumio_guards.trip(store, "worker", activation, "file.read", {"path": "a"},
                        {"rule": "repeatedToolCall", "limit": 3, "reason": "file.read was called 3 times"})
    [item] = service.get("/api/projects/demo/inbox").json()["items"]
    assert (item["kind"], item["agentId"], item["rule"], item["reason"]) == (
        "paused", "worker", "repeatedToolCall", "file.read was called 3 times")
    assert service.post("/api/projects/demo/agents/worker/resume").status_code == 200
    assert kinds(service.get("/api/projects/demo/inbox").json()) == []


def test_a_submitted_report_awaits_review_and_an_approved_project_is_not_opened(served, tmp_path):
    service, store = served
    coordination.submit_report(store, "pm", None, "# Done")
    assert kinds(service.get("/api/projects/demo/inbox").json()) == ["report"]
    other = init_project(service.root, tmp_path / "other", PROJECT_YAML.replace("name: demo", "name: other"))
    other.start()
    start_gated(service, other)
    answer = service.get("/api/inbox").json()
    assert answer["projects"] == {"demo": 1, "other": 1}
    assert [(i["project"], i["kind"]) for i in answer["items"]] == [("demo", "report"), ("other", "approval")]
    assert service.post("/api/projects/demo/approve").status_code == 200
    assert service.get("/api/inbox").json()["projects"] == {"other": 1}


def test_an_unknown_project_is_a_404_in_the_one_error_shape(served):
    service, _ = served
    answer = service.get("/api/projects/nope/inbox")
    assert answer.status_code == 404 and set(answer.json()) == {"error"}


def test_a_call_in_doubt_is_listed_until_a_person_says_whether_it_happened(served):
    from api_fixtures import identity
    from test_effects import DEPLOY, start_call

    service, store = served
    activation = running_activation(store, "worker")["id"]
    call = start_call(service, identity(service, store, "worker", activation), "shell.exec", DEPLOY, "k-inbox")
    coordination.fail_activation(store, activation, "Runner exited with 137")
    [item] = service.get("/api/projects/demo/inbox").json()["items"]
    [effect] = service.get("/api/projects/demo/effects?state=in_doubt").json()
    assert effect["toolCallId"] == call["toolCallId"]
    assert item == {"kind": "in_doubt", "project": "demo", "id": effect["id"], "agentId": "worker",
                    "tool": "shell.exec", "since": item["since"]}
    assert service.get("/api/inbox").json()["projects"] == {"demo": 1}
    resolved = service.post(f"/api/projects/demo/effects/{effect['id']}/resolve", {"resolution": "not_done"})
    assert resolved.status_code == 200, resolved.text
    assert kinds(service.get("/api/projects/demo/inbox").json()) == []
