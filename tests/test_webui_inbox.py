"""One inbox for what needs a person, in real Chromium against a real team (local backend, FakeModel):
while a tool call waits for approval, the header counts it on the Team view, the project list counts it
per project, the Team view draws the wait as waiting on a person (not as work), and the inbox item opens
the Overview where the call is decided. Screenshot in docs/images/."""
from pathlib import Path

import pytest
from conftest import wait_until
from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, running_team
from playwright.sync_api import expect
from test_webui import LIVE_UPDATE_MS, browser, tabs  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.timeout(180), pytest.mark.browser]

SHOWN_MS = LIVE_UPDATE_MS + 5000
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
