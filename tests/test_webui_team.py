"""The Team view in real Chromium driven by Playwright, against the real app on Waitress with a
real scheduler thread, after a real run of the demo team (examples/demo.yaml: pm, two workers and a
critic on the `local` backend replaying the scripted provider). Checks the swimlanes against the API's
own counts, a message drawn live, a P0 restart, the time-range API the view pages with, keyboard focus
and the in-place details. Screenshots land in tests/screenshots/ (git-ignored)."""
import time
from pathlib import Path

import pytest
from api_fixtures import serving
from conftest import wait_until
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser
from store_fixtures import config_of
from webui_fixtures import run_demo_team

import suzumio_coordination as coordination

pytestmark = pytest.mark.timeout(240)

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
LIVE_ARROW_MS = 2000
DEMO_AGENTS = {"pm", "worker-1", "worker-2", "critic"}
LATE_NOTE = 'Late note: <b>lovely</b> card. <img src=x onerror="window.__xss=1">'



@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as browser:
        yield browser


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """One served root (scheduler thread on) holding the demo project after its whole team run."""
    path = tmp_path_factory.mktemp("webui-team")
    with serving(path / "root", scheduler_interval=0.2) as service:
        run_demo_team(service, path / "configs")
        yield service


@pytest.fixture
def page(browser, team):
    context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == []


def open_team(page, service, hash_="#/demo/team"):
    page.goto(service.control_room(hash_))  # /?token=…, as serve prints it
    expect(page.get_by_test_id("stream-state")).to_have_attribute("data-state", "live", timeout=5000)
    if hash_.endswith("/team"):
        expect(page.get_by_test_id("team-chart")).to_have_attribute("data-complete", "true")
    return page


def api_counts(service):
    activations = service.get("/api/projects/demo/activations?limit=500").json()
    messages = service.get("/api/projects/demo/messages?limit=500").json()
    between_agents = [m for m in messages if m.get("recipient") and "user" not in (m["sender"], m["recipient"])]
    return activations, messages, between_agents


def drawn(page, selector, attribute):
    return page.eval_on_selector_all(selector, f"(nodes) => nodes.map((n) => n.getAttribute('{attribute}'))")


def test_team_view_draws_a_lane_per_agent_a_bar_per_activation_and_an_arrow_per_message(page, team):
    open_team(page, team)
    activations, messages, between_agents = api_counts(team)
    assert len(activations) >= 6 and len(between_agents) >= 5  # a real run, not an empty project
    lanes = drawn(page, '[data-testid="team-lane"]', "data-agent")
    assert set(lanes) == DEMO_AGENTS | {"user"} and len(lanes) == len(set(lanes))
    expect(page.get_by_test_id("team-bar")).to_have_count(len(activations))
    assert sorted(drawn(page, '[data-testid="team-bar"]', "data-activation-id")) == sorted(a["id"] for a in activations)
    for activation in activations:
        bar = page.locator(f'[data-testid="team-bar"][data-activation-id="{activation["id"]}"]')
        expect(bar).to_have_attribute("data-agent", activation["agentId"])
        expect(bar).to_have_attribute("data-status", activation["status"])
    agent_arrows = page.locator('[data-testid="team-arrow"]:not([data-agent="user"]):not([data-recipient="user"])')
    expect(agent_arrows).to_have_count(len(between_agents))
    assert sorted(drawn(page, '[data-testid="team-arrow"]', "data-message-id")) == sorted(m["id"] for m in messages)
    # The kickoff (user → pm) woke pm's first activation: the link joins that message to that bar.
    kickoff = messages[0]
    first_pm = next(a for a in activations if a["agentId"] == "pm")
    expect(page.locator(f'.team-link[data-message-id="{kickoff["id"]}"][data-activation-id="{first_pm["id"]}"]')
           ).to_have_count(1)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "webui-team.png"))


def test_time_range_pages_cover_the_project_once_without_gaps(team):
    activations, messages, _ = api_counts(team)
    seen_messages, seen_activations, until, pages = [], set(), None, 0
    while True:
        query = "limit=3" + (f"&until={until}" if until else "")
        page = team.get(f"/api/projects/demo/timeline?{query}").json()
        pages += 1
        seen_messages += [m["id"] for m in page["messages"]]
        seen_activations |= {a["id"] for a in page["activations"]}
        if not page["more"]:
            break
        until = page["since"]
    assert pages > 3
    assert sorted(seen_messages) == sorted(m["id"] for m in messages)  # each message on exactly one page
    assert seen_activations == {a["id"] for a in activations}
    woken = {s["messageId"] for a in team.get("/api/projects/demo/timeline").json()["activations"]
             for s in a["signals"] if s.get("messageId")}
    assert messages[0]["id"] in woken
    assert team.get("/api/projects/demo/timeline?since=yesterday").json() == {
        "error": "since must be an ISO-8601 timestamp"}


def test_hover_focus_keys_and_click_show_details_in_place(page, team):
    open_team(page, team)
    activations, messages, _ = api_counts(team)
    pm_bars = [a["id"] for a in activations if a["agentId"] == "pm"]
    first = page.locator(f'[data-activation-id="{pm_bars[0]}"][data-testid="team-bar"]')
    first.focus()
    expect(page.get_by_test_id("team-tooltip")).to_contain_text(f"pm · completed · {pm_bars[0]}")
    page.keyboard.press("ArrowRight")
    expect(page.locator(f'[data-activation-id="{pm_bars[1]}"][data-testid="team-bar"]')).to_be_focused()
    page.keyboard.press("Enter")
    detail = page.get_by_test_id("team-detail")
    expect(detail).to_contain_text("Activation of pm")
    expect(detail.get_by_test_id("team-detail-context")).to_be_visible()
    expect(detail.get_by_test_id("team-detail-history")).to_be_visible()
    arrow = page.locator(f'[data-testid="team-arrow"][data-message-id="{messages[1]["id"]}"] .team-arrow-dot')
    arrow.hover()
    expect(page.get_by_test_id("team-tooltip")).to_contain_text(messages[1]["body"].strip()[:40])
    arrow.click()
    expect(detail.get_by_test_id("team-detail-body")).to_have_text(
        team.get(f"/api/projects/demo/messages/{messages[1]['id']}").json()["body"])


def test_message_posted_while_the_page_is_open_appears_as_an_arrow_within_2_s(page, team):
    open_team(page, team)
    started = time.monotonic()
    sent = team.post("/api/projects/demo/messages",
                     {"sender": "critic", "recipient": "worker-2", "priority": "P1", "body": LATE_NOTE})
    assert sent.status_code == 200
    arrow = page.locator(f'[data-testid="team-arrow"][data-message-id="{sent.json()["id"]}"]')
    expect(arrow).to_have_count(1, timeout=LIVE_ARROW_MS)
    assert time.monotonic() - started < LIVE_ARROW_MS / 1000
    expect(arrow).to_have_attribute("data-agent", "critic")
    expect(arrow).to_have_attribute("data-recipient", "worker-2")
    expect(arrow).to_have_attribute("data-priority", "P1")
    # Server strings are text: the HTML in the body shows literally and creates no element.
    arrow.locator(".team-arrow-dot").click()
    expect(page.get_by_test_id("team-detail-body")).to_have_text(LATE_NOTE)
    assert page.locator("[data-testid=team-panel] b, [data-testid=team-detail] b").count() == 0
    assert page.evaluate("window.__xss") is None


def test_raw_event_list_filters_by_type_and_agent(page, team):
    open_team(page, team, "#/demo/events")
    page.get_by_test_id("timeline-type").select_option("activation.started")
    page.get_by_test_id("timeline-agent").select_option("critic")
    items = page.get_by_test_id("timeline-item")
    expect(items.first).to_be_visible()
    assert set(items.get_by_test_id("event-type").all_inner_texts()) == {"activation.started"}
    # each event reads as a sentence naming its agent (the folded data's first keys vary by writer)
    assert all(text.startswith("critic started activation ")
               for text in items.get_by_test_id("event-sentence").all_inner_texts())


def settle(store):
    """Start the project and wait until the work an earlier test left queued (a message sent while it was
    submitted is delivered when it runs again) has ended, so this test's own activation is alone."""
    store.start()
    wait_until(lambda: not store.running_activations()
               and not any(store.has_pending_signals_for_agent(agent) for agent in DEMO_AGENTS), 60,
               message="the demo team to settle")


def test_running_bar_grows_shows_the_latest_text_and_turns_completed(page, team):
    store = team.store("demo")
    settle(store)
    running = coordination.start_activation(store, "critic", "Look again.", [])["id"]  # no process behind it
    open_team(page, team)
    bar = page.locator(f'[data-testid="team-bar"][data-activation-id="{running}"]')
    expect(bar).to_have_attribute("data-outcome", "running")
    width = bar.locator(".team-bar-rect").evaluate("(rect) => rect.getBBox().width")
    page.wait_for_function(
        "([id, w]) => document.querySelector(`[data-activation-id='${id}'] .team-bar-rect`).getBBox().width > w",
        arg=[running, width], timeout=5000)
    store.append_history("critic", running, "assistant", "assistant_text", "Reading part B again.\nThen part A.")
    expect(bar).to_contain_text("Reading part B again.", timeout=3000)
    coordination.complete_activation(store, config_of(store), running, "critic", "Still approved.")
    expect(bar).to_have_attribute("data-outcome", "completed", timeout=3000)
    store.set_status("submitted")


def test_p0_restart_is_drawn_as_a_cancelled_bar_followed_by_a_new_one(page, team):
    store = team.store("demo")
    settle(store)
    # A running activation with no process behind it, then a P0: the scheduler cancels and restarts.
    running = coordination.start_activation(store, "worker-1", "Polish part A.", [])["id"]
    page.goto(team.control_room())
    wait_until(lambda: page.evaluate("location.hash") == "#/demo/team", 10, message="Team as the default view")
    running_bar = page.locator(f'[data-testid="team-bar"][data-activation-id="{running}"]')
    expect(running_bar).to_have_attribute("data-outcome", "running")
    p0 = team.post("/api/projects/demo/messages", {"recipient": "worker-1", "priority": "P0", "body": "Stop: redo."})
    assert p0.status_code == 200
    wait_until(lambda: store.activation(running)["status"] == "cancelled", 10, message="the P0 cancellation")
    began = store.activation(running)["startedAt"]
    restarted = wait_until(lambda: [a for a in store.list_activations(500) if a["agentId"] == "worker-1"
                                    and a["startedAt"] >= began and a["id"] != running], 10, message="the restart")[0]
    expect(running_bar).to_have_attribute("data-outcome", "cancelled-p0", timeout=3000)
    new_bar = page.locator(f'[data-testid="team-bar"][data-activation-id="{restarted["id"]}"]')
    expect(new_bar).to_have_count(1, timeout=3000)
    lane_bars = drawn(page, '[data-testid="team-bar"][data-agent="worker-1"]', "data-activation-id")
    assert lane_bars.index(restarted["id"]) == lane_bars.index(running) + 1
    # The P0 message is drawn, and linked to the bar it started.
    expect(page.locator(f'[data-testid="team-arrow"][data-message-id="{p0.json()["id"]}"]')).to_have_attribute(
        "data-priority", "P0")
    expect(page.locator(f'.team-link[data-message-id="{p0.json()["id"]}"][data-activation-id="{restarted["id"]}"]')
           ).to_have_count(1, timeout=3000)
    wait_until(lambda: not store.running_activations(), 30, message="the restarted activation to end")
    store.set_status("submitted")
