"""The control room steers and shows runaways, in real Chromium against a real team (local backend,
FakeModel): the approvals card edits a call's input as JSON or answers it, and the overview shows an
agent a loop guard paused (with Resume) and the agents waiting on a full concurrency cap."""
import pytest
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, running_team
from playwright.sync_api import expect
from test_webui import LIVE_UPDATE_MS, browser, post_json, tabs  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.timeout(180), pytest.mark.browser]

SHOWN_MS = LIVE_UPDATE_MS + 5000


def gated(tools=WORKER_TOOLS):
    return {"tools": tools, "approve": [{"tool": "shell.exec", "match": {"command": "deploy"}}]}


def open_card(tabs, team):  # noqa: F811
    tab = tabs(team.service)
    page = tab.open(f"#/{team.name}/overview")
    tab.wait_live()
    return tab, page


def test_the_card_runs_an_edited_input_and_refuses_json_that_is_not_an_object(tabs, tmp_path):  # noqa: F811
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}, "worker-1": {"model": "worker", **gated()}}
    with running_team(tmp_path, "local", agents=agents) as team:
        marker = team.store.artifacts_dir("worker-1") / "target.txt"
        team.model.enqueue(tool_calls=[call("shell.exec", command=f"printf prod > {marker}  # deploy")],
                           model="worker-1")
        team.model.enqueue(content="Deployed to staging.", model="worker-1")
        tab, page = open_card(tabs, team)
        team.send("worker-1", "Deploy.")
        item = page.get_by_test_id("approval-item")
        expect(item).to_have_count(1, timeout=SHOWN_MS)
        item.get_by_test_id("approval-edit-open").click()
        editor = item.get_by_test_id("approval-edit")
        expect(editor).to_have_value(f'{{\n  "command": "printf prod > {marker}  # deploy"\n}}')
        editor.fill("[1, 2]")
        item.get_by_test_id("approval-allow-edited").click()
        expect(item.get_by_test_id("approval-error")).to_have_text("The input must be a JSON object")
        assert tab.api("POST") == []  # nothing was sent
        edited = f"printf staging > {marker}  # deploy"
        editor.fill(f'{{"command": "{edited}"}}')
        tab.screenshot("approval-edit", full_page=False)
        with page.expect_request(lambda r: r.method == "POST" and "/approvals/" in r.url) as request:
            item.get_by_test_id("approval-allow-edited").click()
        assert post_json(request.value) == {"decision": "allow", "input": {"command": edited}}
        expect(page.get_by_test_id("approvals-card")).to_have_count(0, timeout=SHOWN_MS)
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker.read_text() == "staging"
        [row] = team.service.get(f"/api/projects/{team.name}/approvals").json()
        assert (row["decidedBy"], row["editedInput"]) == ("webui", {"command": edited})


def test_the_card_answers_a_call_and_nothing_runs(tabs, tmp_path):  # noqa: F811
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}, "worker-1": {"model": "worker", **gated()}}
    with running_team(tmp_path, "local", agents=agents) as team:
        marker = team.store.artifacts_dir("worker-1") / "ran.txt"
        team.model.enqueue(tool_calls=[call("shell.exec", command=f"touch {marker}  # deploy")], model="worker-1")
        team.model.enqueue(content="Understood.", model="worker-1")
        tab, page = open_card(tabs, team)
        team.send("worker-1", "Deploy.")
        item = page.get_by_test_id("approval-item")
        expect(item).to_have_count(1, timeout=SHOWN_MS)
        item.get_by_test_id("approval-respond-open").click()
        send = item.get_by_test_id("approval-send-answer")
        expect(send).to_be_disabled()
        answer = "Deployments are frozen today; report instead."
        item.get_by_test_id("approval-answer").fill(answer)
        item.scroll_into_view_if_needed()
        tab.screenshot("approval-respond", full_page=False)
        with page.expect_request(lambda r: r.method == "POST" and "/approvals/" in r.url) as request:
            send.click()
        assert post_json(request.value) == {"decision": "respond", "output": answer}
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert not marker.exists()
        assert team.tool_messages("worker-1") == [answer]


def test_the_overview_shows_a_paused_agent_and_who_waits_on_the_cap_and_resumes(tabs, tmp_path):  # noqa: F811
    agents = {"pm": {"model": "pm", **gated(PM_TOOLS + ["shell.*"])},
              "worker-1": {"model": "worker", "tools": WORKER_TOOLS},
              "critic": {"model": "critic", "tools": WORKER_TOOLS}}
    presets = {"pm": {"provider": "fake", "model": "pm"}, "worker": {"provider": "fake", "model": "worker-1"},
               "critic": {"provider": "fake", "model": "critic"}}
    extra = {"guards": {"repeatedToolCall": 2}, "limits": {"maxConcurrentActivations": 1}}
    with running_team(tmp_path, "local", agents=agents, presets=presets, extra=extra) as team:
        for _ in range(2):
            team.model.enqueue(tool_calls=[call("file.read", path="notes.md")], model="worker-1")
        tab, page = open_card(tabs, team)
        team.send("worker-1", "Read the notes.")
        [looped] = team.wait_activations("worker-1", 1)
        assert looped["status"] == "cancelled"
        mark = page.get_by_test_id("agent-paused")
        expect(mark).to_have_count(1, timeout=SHOWN_MS)
        expect(mark).to_contain_text("paused (repeatedToolCall)")
        card = page.get_by_test_id("concurrency-card")
        expect(card.get_by_test_id("concurrency-paused")).to_contain_text("worker-1")

        # pm holds the only place while it waits on a person; critic's signal waits on the cap
        team.model.enqueue(tool_calls=[call("shell.exec", command="true  # deploy")], model="pm")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="pm")
        # the critic waits without acting on what it was sent: told so once, it waits again
        for _ in range(2):
            team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="critic")
        team.send("pm", "Deploy.")
        expect(page.get_by_test_id("approval-item")).to_have_count(1, timeout=SHOWN_MS)
        team.send("critic", "Review.")
        expect(card.get_by_test_id("concurrency-waiting")).to_contain_text("critic", timeout=SHOWN_MS)
        expect(card.get_by_test_id("concurrency-running")).to_have_text("1 of 1")
        tab.screenshot("concurrency-card", full_page=True)

        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/agents/worker-1/resume")) as req:
            card.get_by_test_id("resume-agent").click()
        assert req.value.headers.get("suzumio-client") == "webui"
        expect(page.get_by_test_id("agent-paused")).to_have_count(0, timeout=SHOWN_MS)
        expect(card.get_by_test_id("concurrency-paused")).to_have_count(0)
        assert team.store.agent("worker-1").get("paused") is None

        page.get_by_test_id("approvals-card").get_by_role("button", name="Allow", exact=True).click()
        [critic] = team.wait_activations("critic", 1)
        assert critic["status"] == "completed"
        expect(card.get_by_test_id("concurrency-waiting")).to_have_count(0, timeout=SHOWN_MS)
