"""The control room's Evals page (docs/evals.md) in real Chromium driven by Playwright against the real app
and its eval thread: two evals of a suite run by local teams with the FakeModel, the second worse; the page
shows the newest as a runs × tasks matrix coloured by verdict, compares it with the first (marking the
regression), and a cell opens its run's project in the Team view. The screenshot is docs/images/evals-page.png."""
import re
from pathlib import Path

import pytest
import yaml
from conftest import wait_until
from eval_fixtures import eval_service
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser

pytestmark = pytest.mark.timeout(300)

IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images" / "evals-page.png"

SUITE = {
    "name": "greetings", "runs": 4, "concurrency": 2,
    "variants": [{"name": "default"}, {"name": "terse", "patch": {"agents": {"pm": {"prompt": "Be terse."}}}}],
    "tasks": [{"id": "hello", "task": "Greet the world.", "messages": [{"recipient": "pm", "body": "Say hello."}],
               "graders": [{"kind": "status", "equals": "submitted"}, {"kind": "report", "contains": "hello"}]},
              {"id": "report", "task": "Write a report.", "messages": [{"recipient": "pm", "body": "Report."}],
               "graders": [{"kind": "report", "matches": "^# Report"}]}],
}


def run_eval(service, suite):
    created = service.post("/api/evals", suite)
    assert created.status_code == 201, created.text
    eval_id = created.json()["id"]
    wait_until(lambda: service.get(f"/api/evals/{eval_id}").json()["status"] == "done", 240,
               message=f"eval {eval_id} to finish")
    return eval_id


def test_the_evals_page_shows_the_matrix_compares_two_evals_and_opens_a_run(tmp_path):
    with eval_service(tmp_path) as (service, _model, answers, _runner), chromium_browser() as browser:
        suite = dict(SUITE, team=yaml.safe_load((tmp_path / "team.yaml").read_text()))
        first = run_eval(service, suite)
        answers.outcomes = ["goodbye"] * 8 + ["hello"] * 8  # the hello task fails every run
        second = run_eval(service, suite)
        document = service.get(f"/api/evals/{second}").json()
        verdicts = {(run["task"], run["variant"], run["index"]): run["passed"] for run in document["runs"]}

        context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 900})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(service.control_room("#/evals"))
        expect(page.get_by_test_id("evals-page")).to_be_visible()
        cells = page.get_by_test_id("eval-cell")
        expect(cells).to_have_count(16)
        shown = page.eval_on_selector_all('[data-testid="eval-cell"]', "(n) => n.map((x) => x.dataset.verdict)")
        assert sorted(shown) == sorted("pass" if passed else "fail" for passed in verdicts.values())
        assert "fail" in shown and "pass" in shown
        colours = set(page.eval_on_selector_all('[data-testid="eval-cell"]',
                                                "(n) => n.map((x) => getComputedStyle(x).backgroundColor)"))
        assert len(colours) == 2  # a pass and a fail look different
        # compare with the first eval: the hello task regressed
        page.locator(".eval-pick select").nth(1).select_option(first)
        changes = page.get_by_test_id("eval-change")
        expect(changes.first).to_have_text(re.compile(r"^regression \(p=0\.\d{3}\)$"))
        IMAGE.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(IMAGE), full_page=True)
        # a cell opens its run's project in the Team view
        failed = page.locator('[data-testid="eval-cell"][data-verdict="fail"]').first
        project = failed.get_attribute("title").split(":", 1)[0]
        failed.click()
        expect(page).to_have_url(re.compile(re.escape(f"#/{project}/team") + "$"))
        expect(page.get_by_test_id("evals-page")).to_have_count(0)
        assert errors == []
        context.close()
