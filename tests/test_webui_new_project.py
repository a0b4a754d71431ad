"""Start from the page (docs/design/webui.md), in real Chromium against the real app: a pasted project file
shows the errors `config render` would print, each with its dotted path; a fixed one is initialized and
started, and opens. Screenshot in docs/images/."""
from pathlib import Path

import pytest
from playwright.sync_api import expect
from test_webui import browser, fresh, tabs  # noqa: F401  (fixtures)
from webui_fixtures import DEMO_AGENTS, project_text

pytestmark = [pytest.mark.timeout(180), pytest.mark.browser]

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def test_a_pasted_file_shows_its_errors_then_starts_as_a_running_project(tabs, fresh):  # noqa: F811
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    page.get_by_test_id("new-project-open").click()
    panel = page.get_by_test_id("new-project")
    good = project_text("pasted", "", task="Plan the survey.", agents=DEMO_AGENTS, toolpacks="[core, shell]")
    broken = good.replace("tools: [messages.send, coordination.wait_for_signal, \"file.*\"]",
                          "tools: [messages.send, 3]").replace("kind: local", "kind: weird")
    assert broken != good
    panel.get_by_label("Project file (YAML)").fill(broken)
    panel.get_by_test_id("new-project-check").click()
    errors = panel.get_by_test_id("config-error")
    expect(errors).to_have_text([
        "backend.kind: Invalid enum value. Expected 'docker-chat' | 'local' | 'swarm', received 'weird'",
        "agents.researcher.tools.1: Expected string, received number"])
    page.screenshot(path=str(IMAGES / "webui-new-project-errors.png"))
    panel.get_by_role("button", name="Initialize and start").click()
    expect(errors).to_have_count(2)  # still refused; nothing was created
    assert tab.api("POST", "/api/projects") == []
    panel.get_by_label("Project file (YAML)").fill(good)
    panel.get_by_test_id("new-project-check").click()
    expect(panel.get_by_test_id("config-ok")).to_contain_text("Valid: pasted with 2 agents (pm, researcher)")
    panel.get_by_role("button", name="Initialize and start").click()
    expect(page).to_have_url(f"{fresh.base_url}/#/pasted/team")
    expect(page.get_by_test_id("project-hero").get_by_test_id("project-status")).to_have_text("running")
    assert fresh.store("pasted").project()["status"] == "running"
    page.screenshot(path=str(IMAGES / "webui-new-project-started.png"))
