"""The Repository view of the control room (docs/teams-that-write-code.md), in real Chromium driven by
Playwright against the real app, after the scripted team of three ran on `local`: the integration log,
the agent branches ahead/behind, the merge queue with its refusals, the diff viewer, and an activation's
commit range opened from its link; and the approvals card of a pending `repo.merge`, showing the change the
merge would land."""
from pathlib import Path

import pytest
from e2e_fixtures import call, running_team
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser
from test_e2e_repository import run_team_of_three, team_options, waits

import suzumio_repository as repository
from suzumio_config import ProjectConfig

pytestmark = pytest.mark.timeout(240)

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
IMAGE = IMAGES / "repository-view.png"
NOTES = "".join(f"note {index:02d}\n" for index in range(1, 61))


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
        expect(page.get_by_test_id("repository-diff-cut")).to_have_count(0)
        # a change longer than an answer holds (a commit no branch points at) says that it was cut
        git_dir = repository.ensure_repository(team.store, ProjectConfig.from_data(team.store.config()))
        blob = repository.out("hash-object", "-w", "--stdin", git_dir=git_dir, data=b"a long line\n" * 40_000)
        tree = repository.out("mktree", git_dir=git_dir, data=f"100644 blob {blob}\tlong.txt\n".encode())
        tip = repository.out("rev-parse", "main", git_dir=git_dir)
        long = repository.out("commit-tree", tree, "-p", tip, "-m", "long", git_dir=git_dir)
        page.evaluate(f"window.location.hash = '#/e2e/repository/{tip}..{long}'")
        expect(page.get_by_test_id("repository-diff")).to_contain_text("+a long line")
        expect(page.get_by_test_id("repository-diff-cut")).to_contain_text(
            f"The diff is longer than this: shown up to {repository.DIFF_LIMIT:,} characters.")
        assert errors == []


def test_a_pending_merge_approval_shows_the_change_it_would_land_on_its_card(tmp_path):
    options = team_options(tmp_path)
    options["agents"]["w1"]["approve"] = [{"tool": "repo.merge"}]
    with running_team(tmp_path, "local", **options) as team, chromium_browser() as browser:
        team.model.responder = waits
        team.model.enqueue(tool_calls=[call("file.write", path="a.txt", content="a by w1\n"),
                                       call("file.write", path="notes.txt", content=NOTES)], model="w1")
        team.model.enqueue(tool_calls=[call("repo.merge", message="w1: a and notes")], model="w1")
        team.model.enqueue(content="Merged.", model="w1")
        context = browser.new_context(locale="en-US", viewport={"width": 820, "height": 1000})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(team.service.control_room("#/e2e/overview"))
        team.send("w1", "Change a.txt, write notes.txt, then merge.")
        item = page.get_by_test_id("approvals-card").get_by_test_id("approval-item")
        expect(item).to_have_count(1, timeout=30000)
        expect(item.get_by_test_id("approval-tool")).to_have_text("repo.merge")
        diff = item.get_by_test_id("approval-diff")
        # folded: the stat and the first hunks, not the 60 lines of notes.txt
        expect(diff).to_contain_text("notes.txt | 60 ++++")
        expect(diff.locator(".diff-del")).to_contain_text(["-a"])
        expect(diff.locator(".diff-add")).to_contain_text(["+a by w1", "+note 01"])
        expect(diff).not_to_contain_text("+note 60")
        unfold = item.get_by_test_id("diff-unfold")
        expect(unfold).to_have_text("Show all 77 lines (53 more)")
        assert page.evaluate("document.documentElement.scrollWidth") <= 820
        item.screenshot(path=str(IMAGES / "approval-merge-diff.png"))
        unfold.click()
        expect(diff).to_contain_text("+note 60")
        expect(unfold).to_have_count(0)
        assert page.evaluate("document.documentElement.scrollWidth") <= 820
        item.get_by_role("button", name="Allow", exact=True).click()
        [activation] = team.wait_activations("w1", 1)
        assert activation["status"] == "completed"
        expect(item).to_have_count(0)
        context.close()
        assert errors == []
