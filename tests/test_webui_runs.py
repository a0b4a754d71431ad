"""Replay, fork and compare from the page (docs/replay.md, docs/design/webui.md), in real Chromium against
the real app with a real scheduler thread, after a real run of the demo team: "Fork from here" on an ended
activation creates a running project and opens it, "Replay" on the ended project starts a replay, and the
compare overlay marks where two runs part when their first difference is not an activation.
Screenshots land in docs/images/."""
import json
from pathlib import Path

import pytest
from api_fixtures import serving
from conftest import wait_until
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
    path = tmp_path_factory.mktemp("webui-runs")
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


def first_pm_activation(service):
    activations = service.get("/api/projects/demo/activations?limit=500").json()
    return next(a for a in activations if a["agentId"] == "pm" and a["status"] == "completed")


def test_fork_from_here_creates_a_running_project_and_opens_it(page, team):
    at = first_pm_activation(team)["id"]
    page.goto(team.control_room("#/demo/activations"))
    item = page.locator(f'[data-testid="activation-item"][data-activation-id="{at}"]')
    item.get_by_test_id("fork-open").click()
    form = item.get_by_test_id("fork-form")
    form.get_by_label("New project name").fill("demo-fork")
    form.get_by_label("Changed project file (YAML, optional)").fill("name: [unclosed")
    form.get_by_role("button", name="Create fork").click()
    expect(form.get_by_test_id("fork-error")).to_be_visible()  # the server's config error, shown in place
    form.get_by_label("Changed project file (YAML, optional)").fill("")
    with page.expect_response(lambda r: r.url.endswith("/api/projects/demo/fork")) as answer:
        form.get_by_role("button", name="Create fork").click()
    assert answer.value.status == 201
    assert answer.value.json()["status"] == "running"
    expect(page).to_have_url(f"{team.base_url}/#/demo-fork/team")
    expect(page.get_by_test_id("project-origin")).to_have_text(f"Fork of demo after {at}")
    page.screenshot(path=str(IMAGES / "webui-fork.png"))
    fork = team.store("demo-fork")
    assert fork.project()["status"] in ("running", "submitted")
    wait_until(lambda: fork.project()["status"] == "submitted", 90, message="the fork to finish its run")


def test_the_overlay_marks_where_two_runs_part_when_they_first_differ_in_artifacts(page, team):
    fork = team.store("demo-fork")
    wait_until(lambda: fork.project()["status"] == "submitted" and not fork.running_activations(), 90,
               message="the fork to finish its run")
    (fork.artifacts_dir("critic") / "review.md").write_text("Verdict: rejected.\n", encoding="utf-8")
    diff = team.get("/api/projects/demo-fork/diff/demo").json()
    first = diff["firstDifference"]
    assert (first["section"], first["key"]) == ("artifacts", "critic"), diff["firstDifference"]
    page.goto(team.control_room("#/demo-fork/team"))
    expect(page.get_by_test_id("compare-select")).to_have_value("demo")
    expect(page.get_by_test_id("compare-summary")).to_have_text(
        "They part first in artifacts (critic); marked in red.")
    marked = page.eval_on_selector_all('[data-testid="compare-bar"][data-diverged="true"]',
                                       "(n) => n.map((x) => [x.dataset.run, x.dataset.activationId])")
    last = {}
    for run, name in (("a", "demo-fork"), ("b", "demo")):
        critic = [a for a in team.get(f"/api/projects/{name}/activations?limit=500").json() if a["agentId"] == "critic"]
        last[run] = sorted(critic, key=lambda a: a["startedAt"])[-1]["id"]
    assert sorted(map(tuple, marked)) == sorted(last.items())
    page.get_by_test_id("compare-chart").scroll_into_view_if_needed()
    page.screenshot(path=str(IMAGES / "webui-compare-artifacts.png"))


def test_replay_on_an_ended_project_starts_a_replay_and_opens_it(page, team):
    page.goto(team.control_room("#/demo/overview"))
    hero = page.get_by_test_id("project-hero")
    hero.get_by_test_id("replay-open").click()
    form = hero.get_by_test_id("replay-form")
    form.get_by_label("New project name").fill("demo-again")
    with page.expect_request(lambda r: r.url.endswith("/api/projects/demo/replay")) as request:
        form.get_by_role("button", name="Start replay").click()
    assert json.loads(request.value.post_data) == {"as": "demo-again", "tools": "recorded", "onDiverge": "stop"}
    expect(page).to_have_url(f"{team.base_url}/#/demo-again/team")
    expect(page.get_by_test_id("project-origin")).to_contain_text("Replay of demo (tools recorded)")
    replay = team.store("demo-again")
    assert replay.project()["status"] != "initialized"
    # Leave no runner behind: stop the replay and wait for its activations to end.
    assert team.post("/api/projects/demo-again/stop").status_code == 200
    wait_until(lambda: not replay.running_activations(), 60, message="the replay's activations to end")
