"""One inbox for what needs a person, in real Chromium against a real team (local backend, FakeModel):
while a tool call waits for approval, the header counts it on the Team view, the project list counts it
per project, the Team view draws the wait as waiting on a person (not as work), and the inbox item opens
the Overview where the call is decided; a call waiting in another project than the one streamed live is
counted within the inbox's own poll. Screenshot in docs/images/."""
from pathlib import Path

import pytest
from api_fixtures import init_project, serving
from conftest import wait_until
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, running_team
from playwright.sync_api import expect
from test_approvals import PROJECT_YAML, start_gated
from test_webui import LIVE_UPDATE_MS, browser, tabs  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.timeout(180), pytest.mark.browser]

SHOWN_MS = LIVE_UPDATE_MS + 5000
INBOX_POLL_MS = 5000  # webui/src/inbox.tsx
# One inbox poll and its request, with room for a busy machine; far below the 30 s of the list's live poll.
COUNTED_MS = INBOX_POLL_MS + 3000
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def test_a_call_waiting_for_approval_is_counted_on_the_team_view_and_drawn_as_waiting_for_you(tabs, tmp_path):  # noqa: F811
    gate = {"approve": [{"tool": "shell.exec", "match": {"command": "deploy"}}]}
    agents = {"pm": {"model": "pm", "tools": PM_TOOLS}, "worker-1": {"model": "worker", "tools": WORKER_TOOLS, **gate}}
    with running_team(tmp_path, "local", agents=agents) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command="true  # deploy")], model="worker-1")
        team.model.enqueue(content="Deployed.", model="worker-1")
        tab = tabs(team.service)
        page = tab.open(f"#/{team.name}/team")
        tab.wait_live()
        expect(page.get_by_test_id("inbox-count")).to_have_text("0")
        team.send("worker-1", "Deploy.")
        expect(page.get_by_test_id("inbox-count")).to_have_text("1", timeout=SHOWN_MS)
        item = page.locator(f'[data-testid="project-item"][data-project-id="{team.name}"]')
        expect(item.get_by_test_id("project-inbox")).to_have_text("1")
        waiting = page.get_by_test_id("team-call-waiting")
        expect(waiting).to_have_count(1, timeout=SHOWN_MS)
        assert waiting.get_attribute("data-agent") == "worker-1"
        expect(waiting.locator("text")).to_have_text("waiting for you · shell.exec")
        # Distinct from work: the amber hatching, not a bar's fill.
        assert waiting.locator("rect").get_attribute("fill") == "url(#team-hatch)"
        # The wait grows with the clock while no one decides.
        wait_until(lambda: float(waiting.locator("rect").get_attribute("width")) > 40, 15,
                   message="the waiting segment to grow")
        page.get_by_test_id("inbox-button").click()
        entry = page.get_by_test_id("inbox-item")
        expect(entry).to_have_count(1)
        expect(entry).to_contain_text("Call awaiting approval: worker-1 wants to run shell.exec")
        page.screenshot(path=str(IMAGES / "webui-inbox-team.png"))
        entry.click()
        expect(page).to_have_url(f"{team.service.base_url}/#/{team.name}/overview")
        card = page.get_by_test_id("approvals-card")
        expect(card.get_by_test_id("approval-item")).to_have_count(1)
        card.get_by_role("button", name="Allow", exact=True).click()
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        expect(page.get_by_test_id("inbox-count")).to_have_text("0", timeout=SHOWN_MS)
        expect(item.get_by_test_id("project-inbox")).to_have_count(0)


def test_a_call_waiting_in_another_project_is_counted_within_the_inbox_poll_while_one_streams_live(tabs, tmp_path):  # noqa: F811
    with serving(tmp_path / "root") as service:
        stores = {name: init_project(service.root, tmp_path / name, PROJECT_YAML.replace("name: demo", f"name: {name}"))
                  for name in ("demo", "other")}
        for store in stores.values():
            store.start()
        tab = tabs(service)
        page = tab.open("#/demo/overview")
        tab.wait_live()
        other = page.locator('[data-testid="project-item"][data-project-id="other"]')
        expect(page.get_by_test_id("inbox-count")).to_have_text("0")
        expect(other.get_by_test_id("project-inbox")).to_have_count(0)
        start_gated(service, stores["other"])
        # No event of `other` reaches demo's stream, and the project list polls every 30 s while a stream
        # is live: only the inbox's own poll can bring the count this soon.
        expect(page.get_by_test_id("inbox-count")).to_have_text("1", timeout=COUNTED_MS)
        expect(other.get_by_test_id("project-inbox")).to_have_text("1")
        expect(page.locator('[data-testid="project-item"][data-project-id="demo"]').get_by_test_id(
            "project-inbox")).to_have_count(0)
        expect(page.get_by_test_id("stream-state")).to_have_attribute("data-state", "live")
        assert tab.open_streams() == [service.base_url + tab.stream_path("demo")]
