"""The team's output in the control room (docs/design/webui.md), in real Chromium driven by Playwright
against the real app with a real scheduler thread, after a real run of the demo team: the final report
rendered, an artifact opened, two versions compared, and "Request changes" sending the team back to
work. Screenshots land in docs/images/."""
import re
from pathlib import Path

import pytest
from api_fixtures import serving
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser
from webui_fixtures import run_demo_team

pytestmark = pytest.mark.timeout(240)

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as browser:
        yield browser


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """One served root (scheduler thread on) holding the demo project after its whole team run (submitted)."""
    path = tmp_path_factory.mktemp("webui-output")
    with serving(path / "root", scheduler_interval=0.2) as service:
        run_demo_team(service, path / "configs")
        yield service


@pytest.fixture
def page(browser):
    context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == []


def test_the_report_renders_as_markdown_and_an_artifact_opens_in_place(page, team):
    page.goto(team.control_room("#/demo/output"))
    report = page.get_by_test_id("report-body")
    expect(report.locator("h2")).to_have_text("Greeting card")
    expect(report.locator("li")).to_have_count(3)
    expect(report.locator("li").first).to_contain_text("Salutation by worker-1")
    files = page.get_by_test_id("artifact-file")
    paths = files.evaluate_all("(nodes) => nodes.map((n) => n.dataset.path)")
    assert {"worker-1/part-a.md", "worker-2/part-b.md", "critic/review.md"} <= set(paths)
    assert [f["agent"] + "/" + f["path"] for f in team.get("/api/projects/demo/artifacts").json()] == paths
    page.locator('[data-path="critic/review.md"]').first.click()
    viewer = page.get_by_test_id("artifact-viewer")
    expect(viewer.get_by_test_id("artifact-content")).to_contain_text("Verdict: approved.")
    expect(viewer).to_contain_text("version 1 of 1")
    page.screenshot(path=str(IMAGES / "webui-output.png"), full_page=True)


def test_report_markup_is_shown_as_text_never_interpreted(page, team):
    store = team.store("demo")
    report_path = Path(store.project()["submitted_report"])
    original = report_path.read_text(encoding="utf-8")
    try:
        report_path.write_text('# Card\n\n<img src=x onerror="window.__xss=1"> [x](javascript:alert(1)) **b**\n',
                               encoding="utf-8")
        page.goto(team.control_room("#/demo/output"))
        body = page.get_by_test_id("report-body")
        expect(body.locator("p")).to_contain_text('<img src=x onerror="window.__xss=1">')
        expect(body.locator("strong")).to_have_text("b")
        assert body.locator("img").count() == 0 and body.locator("a").count() == 0
        assert page.evaluate("window.__xss") is None
    finally:
        report_path.write_text(original, encoding="utf-8")


def test_two_versions_of_an_artifact_are_compared_as_a_diff(page, team):
    store = team.store("demo")
    (store.artifacts_dir("worker-1") / "part-a.md").write_text("Dear friend,\nWith love.\n", encoding="utf-8")
    page.goto(team.control_room("#/demo/output"))
    page.locator('[data-path="worker-1/part-a.md"]').first.click()
    viewer = page.get_by_test_id("artifact-viewer")
    expect(viewer).to_contain_text("not recorded yet")
    viewer.get_by_test_id("artifact-version").select_option("1")
    expect(viewer.get_by_test_id("artifact-content")).to_have_text("Dear friend,")
    viewer.get_by_test_id("diff-to").select_option("now")
    viewer.get_by_test_id("diff-run").click()
    diff = viewer.get_by_test_id("diff-text")
    expect(diff.locator(".diff-add")).to_have_text(["+With love."])
    expect(diff.locator(".diff-file")).to_have_text(["--- a/worker-1/part-a.md@1", "+++ b/worker-1/part-a.md"])
    expect(diff.locator(".diff-del")).to_have_count(0)
    viewer.screenshot(path=str(IMAGES / "webui-artifact-diff.png"))


def test_the_team_view_details_show_each_tool_call_with_its_input_and_output(page, team):
    page.goto(team.control_room("#/demo/team"))
    expect(page.get_by_test_id("team-chart")).to_have_attribute("data-complete", "true")
    page.locator('[data-testid="team-bar"][data-agent="worker-1"]').first.click()
    detail = page.get_by_test_id("team-detail")
    expect(detail).to_contain_text(re.compile(r"· ran \d"))
    steps = detail.get_by_test_id("team-step")
    call = steps.filter(has_text="tool call · file.write").first
    expect(call.get_by_test_id("step-input")).to_contain_text('"content": "Dear friend,\\n"')
    result = steps.filter(has_text="tool result · file.write · completed").first
    expect(result.get_by_test_id("step-output")).to_be_visible()
    detail.scroll_into_view_if_needed()
    page.screenshot(path=str(IMAGES / "webui-team-steps.png"))


def test_request_changes_is_confirmed_and_sends_the_team_back_to_work(page, team):
    page.goto(team.control_room("#/demo/output"))
    hero = page.get_by_test_id("project-hero")
    expect(hero.get_by_test_id("project-status")).to_have_text("submitted")
    expect(hero.locator(".hero-actions button")).to_have_text(["Approve report", "Request changes", "Replay"])
    hero.get_by_role("button", name="Approve report").click()
    expect(hero.get_by_test_id("confirm-approve")).to_contain_text("Approve the report and end the project?")
    hero.get_by_role("button", name="Cancel").click()
    hero.get_by_role("button", name="Request changes").click()
    send = hero.get_by_role("button", name="Send back to work")
    expect(send).to_be_disabled()
    hero.get_by_label("What should the team change?").fill("Make the wishes warmer.")
    page.screenshot(path=str(IMAGES / "webui-request-changes.png"))
    send.click()
    expect(hero.get_by_test_id("project-status")).not_to_have_text("submitted")
    store = team.store("demo")
    assert store.project()["status"] != "submitted"
    bodies = [m["body"] for m in team.get("/api/projects/demo/messages?limit=500").json() if m["recipient"] == "pm"]
    assert any("Make the wishes warmer." in body for body in bodies)


def overflow(page, selector):
    """How far the element's content reaches past its box, in pixels (0: nothing overflows)."""
    return page.eval_on_selector(selector, "(n) => n.scrollWidth - n.clientWidth")


@pytest.mark.parametrize("view", ["output", "team", "history", "events"])
def test_the_page_at_820_px_has_no_sideways_overflow_and_every_tab_in_view(browser, team, view):
    context = browser.new_context(locale="en-US", viewport={"width": 820, "height": 1000})
    page = context.new_page()
    try:
        page.goto(team.control_room(f"#/demo/{view}"))
        tabs = page.get_by_role("tab")
        expect(tabs.first).to_be_visible()
        assert overflow(page, ".tabs") <= 0
        assert page.evaluate("document.documentElement.scrollWidth") <= 820
        box = page.locator(".tabs").bounding_box()
        for tab in tabs.all():
            tab_box = tab.bounding_box()
            assert box["x"] <= tab_box["x"] and tab_box["x"] + tab_box["width"] <= box["x"] + box["width"] + 0.5
        if view == "output":
            page.locator('[data-path="critic/review.md"]').first.click()
            expect(page.get_by_test_id("artifact-content")).to_contain_text("Verdict")
            assert page.evaluate("document.documentElement.scrollWidth") <= 820
            page.screenshot(path=str(IMAGES / "webui-820.png"), full_page=False)
    finally:
        context.close()
