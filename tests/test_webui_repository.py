"""The Repository view of the control room (docs/teams-that-write-code.md), in real Chromium driven by
Playwright against the real app, after the scripted team of three ran on `local`: the integration log,
the agent branches ahead/behind, the merge queue with its refusals, the diff viewer, and an activation's
commit range opened from its link."""
from pathlib import Path

import pytest
from e2e_fixtures import running_team
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser
from test_e2e_repository import run_team_of_three, team_options

pytestmark = pytest.mark.timeout(240)

IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images" / "repository-view.png"


def test_the_repository_view_shows_log_branches_queue_and_diffs(tmp_path):
    with running_team(tmp_path, "local", scheduler_interval=1.0, **team_options(tmp_path)) as team, \
            chromium_browser() as browser:
        run_team_of_three(team)
        context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 1300})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(team.service.control_room("#/e2e/repository"))
        expect(page.get_by_test_id("repository-log")).to_contain_text("w3: shared, resolved")
        expect(page.get_by_test_id("repository-log")).to_contain_text("w1: a and shared")
        expect(page.get_by_test_id("repository-branch")).to_have_count(3)
        requests = page.get_by_test_id("repository-request")
        expect(requests).to_have_count(5)
        expect(page.get_by_test_id("repository-queue")).to_contain_text("failed: checks")
        expect(page.get_by_test_id("repository-queue")).to_contain_text("failed: conflict")
        # the newest landing's diff is shown by default
        expect(page.get_by_test_id("repository-diff")).to_contain_text("+shared line one by w1 and w3")
        page.get_by_test_id("repository-view").screenshot(path=str(IMAGE))
        # an activation's commit range (the Team view's link) opens its diff, in a new page or in this one
        [w1] = [a for a in team.activations("w1") if a["commitEnd"] != a["commitStart"]][:1]
        linked = context.new_page()
        linked.on("pageerror", lambda error: errors.append(str(error)))
        linked.goto(team.service.control_room(f"#/e2e/repository/{w1['commitStart']}..{w1['commitEnd']}"))
        expect(linked.get_by_test_id("repository-diff")).to_contain_text("+a by w1")
        page.evaluate(f"window.location.hash = '#/e2e/repository/{w1['commitStart']}..{w1['commitEnd']}'")
        expect(page.get_by_test_id("repository-diff")).to_contain_text("+a by w1")
        assert errors == []
