"""Two runs laid over each other in the control room (docs/replay.md), in real Chromium driven by
Playwright against the real app: a recorded run of the `local` team with the FakeModel, and a replay of
it with worker-1's prompt changed, which diverges there and stops. The replay shows its origin; the
Team view's comparison draws both runs' activations lane by lane and marks where they part."""
import json
from pathlib import Path

import pytest
import yaml
from e2e_fixtures import running_team
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser
from test_e2e_replay import run_delegation

pytestmark = pytest.mark.timeout(240)

IMAGE = Path(__file__).resolve().parent.parent / "docs" / "images" / "team-overlay.png"


def test_a_replay_shows_its_origin_and_the_team_view_overlays_it_on_its_source(tmp_path):
    with running_team(tmp_path, "local") as team, chromium_browser() as browser:
        run_delegation(team)
        config = team.store.config()
        config["agents"]["worker-1"]["prompt"] = "Be terse."
        response = team.service.post("/api/projects/e2e/replay",
                                     {"as": "e2e-changed", "config": yaml.safe_dump(config)})
        assert response.status_code == 201, response.text
        copy = team.service.root.open_project("e2e-changed")
        team.wait_for(lambda: copy.project()["status"] == "stopped" and not copy.running_activations(), 60,
                      "the replay stopped at its divergence")
        [diverged] = [json.loads(e["data_json"]) for e in copy.list_events(1000) if e["type"] == "replay.diverged"]

        context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(team.service.control_room("#/e2e-changed/team"))
        expect(page.get_by_test_id("project-origin")).to_have_text(
            "Replay of e2e (tools live) · diverged at worker-1, request 0")
        # the source is overlaid by default; its lanes are the agents, each with both runs
        expect(page.get_by_test_id("compare-select")).to_have_value("e2e")
        expect(page.get_by_test_id("compare-chart")).to_be_visible()
        lanes = page.eval_on_selector_all('[data-testid="compare-lane"]', "(n) => n.map((x) => x.dataset.agent)")
        assert lanes == ["pm", "worker-1"]
        bars = page.eval_on_selector_all('[data-testid="compare-bar"]',
                                         "(n) => n.map((x) => [x.dataset.run, x.dataset.activationId, "
                                         "x.dataset.diverged])")
        mine = {a["id"] for a in copy.list_activations(100)}
        theirs = {a["id"] for a in team.store.list_activations(100)}
        assert {b[1] for b in bars if b[0] == "a"} == mine and {b[1] for b in bars if b[0] == "b"} == theirs
        assert sorted(b[1] for b in bars if b[2] == "true") == sorted(
            [diverged["activationId"], diverged["sourceActivationId"]])
        # What a person sees: the runs told apart by colour (solid and outlined) and the divergence red.
        fills = page.eval_on_selector_all(
            '[data-testid="compare-bar"]',
            "(n) => n.map((x) => [x.dataset.run, x.dataset.diverged, x.getAttribute('class'),"
            " getComputedStyle(x).fill])")
        seen = {}
        for run, is_diverged, classes, fill in fills:
            if is_diverged == "true":
                seen.setdefault("diverged", set()).add(fill)
            elif "status-failed" not in classes and "status-cancelled" not in classes:
                seen.setdefault(run, set()).add(fill)
        assert seen == {"diverged": {"rgb(214, 69, 69)"}, "a": {"rgb(61, 111, 214)"}, "b": {"rgb(255, 255, 255)"}}
        expect(page.get_by_test_id("compare-summary")).to_have_attribute("data-identical", "false")
        page.get_by_test_id("compare-panel").scroll_into_view_if_needed()
        page.get_by_test_id("compare-panel").screenshot(path=str(IMAGE))
        # another run chosen: the view follows, and an ordinary project offers no origin line
        page.get_by_test_id("compare-select").select_option("")
        expect(page.get_by_test_id("compare-chart")).to_have_count(0)
        page.goto(team.service.control_room("#/e2e/team"))
        expect(page.get_by_test_id("project-hero")).to_be_visible()
        expect(page.get_by_test_id("project-origin")).to_have_count(0)
        context.close()
        assert errors == []
