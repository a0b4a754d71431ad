"""WebUI acceptance scenarios (docs/design/webui.md) in real Chromium driven by Playwright, against the real app
on Waitress with projects seeded through the real store (tests/webui_fixtures.py). Integrator decisions
applied: one EventSource per tab on the selected project's stream with the 5 s poll as fallback
(scenarios 2 and 28 rewritten), and per-activation token usage where the model reported it.
Screenshots land in tests/screenshots/ (git-ignored)."""
import http.client
import itertools
import json
import re
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest
from api_fixtures import serving
from conftest import wait_until
from playwright.sync_api import expect
from provisioning_fixtures import chromium_browser
from store_fixtures import config_of
from webui_fixtures import DEMO_TASK, LONG_BODY, XSS_BODY, XSS_NAME, seed_harness, seed_xss

import suzumio_coordination as coordination

pytestmark = pytest.mark.timeout(180)

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
CLOCK = re.compile(r"^\d{2}:\d{2}:\d{2}( [AP]M)?$")
STREAM_LIVE_TIMEOUT_MS = 5000
# One SSE poll (1 s) + the UI's event debounce (0.4 s) + one list request, with room for a busy machine.
LIVE_UPDATE_MS = 3000

# Wraps EventSource so tests can count the streams a tab opens and see the events it receives; records
# the session-history length at load (to tell push from replace) and every CSP violation.
INIT_SCRIPT = """
(() => {
  const Native = window.EventSource;
  window.__streams = [];
  window.__streamEvents = [];
  window.EventSource = class extends Native {
    constructor(url, init) {
      super(url, init);
      window.__streams.push(this);
      for (const type of ['project.status', 'message.created']) {
        this.addEventListener(type, () => window.__streamEvents.push({ type, at: performance.now() }));
      }
    }
  };
  window.__historyAtLoad = history.length;
  window.__csp = [];
  document.addEventListener('securitypolicyviolation',
    (event) => window.__csp.push(`${event.violatedDirective} ${event.blockedURI}`));
})();
"""


# ---------------------------------------------------------------------------------------------
# Fixtures: one browser per module, one server for the read-only scenarios, fresh ones for the rest.

@dataclass
class Site:
    service: object
    seed: object

    @property
    def base_url(self):
        return self.service.base_url

    def store(self, name="demo"):
        return self.service.store(name)


@pytest.fixture(scope="module")
def browser():
    with chromium_browser() as browser:
        yield browser


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """demo + beta for scenarios that change nothing on the server."""
    path = tmp_path_factory.mktemp("webui-shared")
    with serving(path / "root") as service:
        yield Site(service, seed_harness(service.root, path / "configs", service.base_url))


@pytest.fixture
def fresh(tmp_path):
    """demo + beta on their own server, for scenarios that change projects."""
    with serving(tmp_path / "root") as service:
        yield Site(service, seed_harness(service.root, tmp_path / "configs", service.base_url))


class Tab:
    """One page in its own browser context, recording every request it makes and every page error;
    `open` goes to the Control room URL (`/?token=…` when the server takes a token)."""

    def __init__(self, context, base_url, token=None):
        self.context = context
        self.base_url = base_url
        self.token = token
        self.page = context.new_page()
        self.requests = []
        self.errors = []
        self.console = []
        self.page.on("request", lambda request: self.requests.append(request))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("console", lambda message: self.console.append(message.text))

    def open(self, hash_=""):
        query = f"?token={urllib.parse.quote(self.token)}" if self.token else ""
        self.page.goto(self.base_url + "/" + query + hash_)
        expect(self.page.get_by_test_id("last-updated")).to_have_text(re.compile(r"^Updated "))
        return self.page

    def api(self, method=None, path=None, since=0):
        """Requests to /api/… (path and query, e.g. `/api/projects/demo/messages?limit=100`)."""
        found = []
        for request in self.requests[since:]:
            url = urllib.parse.urlsplit(request.url)
            target = url.path + (f"?{url.query}" if url.query else "")
            if not url.path.startswith("/api/"):
                continue
            if method is not None and request.method != method:
                continue
            if path is not None and target != path:
                continue
            found.append(request)
        return found

    def next_request(self, method, path, timeout_ms=5000):
        """Wait (pumping the browser's events) for the next request to `path` (path and query)."""
        def matches(request):
            url = urllib.parse.urlsplit(request.url)
            return request.method == method and url.path + (f"?{url.query}" if url.query else "") == path
        with self.page.expect_request(matches, timeout=timeout_ms) as request:
            pass
        return request.value

    def stream_path(self, project):
        """The stream URL path the WebUI opens: EventSource cannot send headers, so the token rides along."""
        token = f"&token={urllib.parse.quote(self.token, safe='')}" if self.token else ""
        return f"/api/projects/{project}/stream?limit=1{token}"

    def hash(self):
        return self.page.evaluate("location.hash")

    def history_length(self):
        """Entries added to the session history since this document loaded."""
        return self.page.evaluate("history.length - window.__historyAtLoad")

    def open_streams(self):
        return self.page.evaluate("window.__streams.filter((s) => s.readyState !== 2).map((s) => s.url)")

    def wait_live(self):
        expect(self.page.get_by_test_id("stream-state")).to_have_attribute(
            "data-state", "live", timeout=STREAM_LIVE_TIMEOUT_MS)

    def screenshot(self, name, full_page=True):
        SCREENSHOTS.mkdir(exist_ok=True)
        self.page.screenshot(path=str(SCREENSHOTS / f"webui-{name}.png"), full_page=full_page)


@pytest.fixture
def tabs(browser):
    """Opens Tabs (locale en-US, 1440×900 unless asked) and closes them; fails on any page error."""
    opened = []

    def open_tab(site_or_url, **options):
        """A Tab on a Site, a Service (both: with their API token) or a bare URL (no token)."""
        service = getattr(site_or_url, "service", site_or_url)
        base_url = site_or_url if isinstance(site_or_url, str) else site_or_url.base_url
        token = None if isinstance(site_or_url, str) else service.api_token
        context = browser.new_context(locale="en-US", viewport=options.pop("viewport", {"width": 1440, "height": 900}),
                                      **options)
        context.add_init_script(INIT_SCRIPT)
        tab = Tab(context, base_url, token)
        opened.append(tab)
        return tab

    yield open_tab
    for tab in opened:
        tab.context.close()
    assert [error for tab in opened for error in tab.errors] == []


@pytest.fixture
def tab(tabs, shared):
    return tabs(shared)


def is_project_list(url):
    return urllib.parse.urlsplit(url).path == "/api/projects"


def post_json(request):
    return json.loads(request.post_data) if request.post_data else None


def metric(page, label):
    return page.get_by_test_id(f"metric-{label}").get_by_test_id("metric-value")


def raw_get(service, path):
    """GET with the path sent exactly as written (no client-side normalisation of `%2e%2e`)."""
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        connection.request("GET", path, headers={"Host": f"127.0.0.1:{service.port}"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


# ---------------------------------------------------------------------------------------------
# Shell, routing and the live updates (scenarios 1, 2, 26, 27, 28, 29, 30).

def test_root_without_hash_selects_first_project_and_replaces_the_hash(tab):
    page = tab.open()
    items = page.get_by_test_id("project-item")
    expect(items).to_have_count(2)
    assert [item.get_attribute("data-project-id") for item in items.all()] == ["beta", "demo"]
    expect(page.get_by_test_id("project-count")).to_have_text("2")
    expect(items.nth(0)).to_have_attribute("aria-current", "true")
    wait_until(lambda: tab.hash() == "#/beta/overview", 5, message="hash #/beta/overview")
    assert tab.history_length() == 0


def test_tab_keeps_one_stream_and_shows_new_messages_live_without_reload(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    tab.wait_live()
    page.evaluate("window.__marker = 'loaded once'")
    assert tab.open_streams() == [fresh.base_url + tab.stream_path("demo")]
    expect(page.get_by_test_id("last-updated")).to_have_text(re.compile(r"^Updated \d{2}:\d{2}:\d{2}( [AP]M)?$"))
    paths = {urllib.parse.urlsplit(r.url).path for r in tab.api()}
    # the overview's pending-approvals and calls-in-doubt cards load once; approval events drive them
    # after that; the concurrency card loads with the project element
    assert paths == {"/api/projects", "/api/projects/demo/stream", "/api/projects/demo/approvals",
                     "/api/projects/demo/effects", "/api/projects/demo/concurrency", "/api/inbox"}

    before = len(tab.requests)
    coordination.send_message(fresh.store(), config_of(fresh.store()), "user",
                              "A message written after the page loaded.", recipient="researcher")
    started = time.monotonic()
    expect(metric(page, "messages")).to_have_text("4", timeout=LIVE_UPDATE_MS)
    print(f"overview live update after {time.monotonic() - started:.2f}s")

    page.get_by_role("tab", name="Messages").click()
    expect(page.get_by_test_id("message-card")).to_have_count(4)
    coordination.send_message(fresh.store(), config_of(fresh.store()), "pm", "Another one, shown live.",
                              recipient="user")
    started = time.monotonic()
    expect(page.get_by_test_id("message-card").first.get_by_test_id("message-body")).to_have_text(
        "Another one, shown live.", timeout=LIVE_UPDATE_MS)
    print(f"messages live update after {time.monotonic() - started:.2f}s")
    assert page.evaluate("window.__marker") == "loaded once"
    assert len(tab.api("GET", tab.stream_path("demo"), since=before)) == 0
    assert len(page.evaluate("window.__streams")) == 1

    page.get_by_test_id("project-item").filter(has_text="beta").click()
    tab.wait_live()
    assert tab.open_streams() == [fresh.base_url + tab.stream_path("beta")]


def test_roster_and_activations_follow_a_running_activation_live(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    tab.wait_live()
    store = fresh.store()
    store.start()
    activation = coordination.start_activation(store, "researcher", "Work on the survey.", [])["id"]
    card = page.get_by_test_id("agent-card").filter(has_text="Akari")
    expect(card.get_by_test_id("agent-status")).to_have_text("running", timeout=LIVE_UPDATE_MS)
    expect(card.get_by_test_id("agent-id")).to_have_text(f"researcher - {activation}")
    expect(page.get_by_test_id("metric-agents")).to_contain_text("1 running now")
    expect(page.get_by_test_id("metric-activations")).to_contain_text("1 running, 0 failed")

    page.get_by_role("tab", name="Activations + context").click()
    expect(page.get_by_test_id("activation-item")).to_have_count(3)
    coordination.complete_activation(store, config_of(store), activation, "researcher", "Survey done.",
                                     usage={"tokens": {"input": 10, "output": 5}})
    newest = page.get_by_test_id("activation-item").first
    expect(newest.get_by_test_id("activation-result")).to_have_text("Survey done.", timeout=LIVE_UPDATE_MS)
    expect(newest.get_by_test_id("activation-usage")).to_contain_text("15 tokens")
    expect(page.get_by_test_id("project-hero").get_by_test_id("project-status")).to_have_text("running")


def test_stream_connection_does_not_refetch_what_the_page_just_loaded(tab):
    page = tab.open("#/demo/events")
    tab.wait_live()
    # The stream replays the newest event (the seed's last project.status) when it connects.
    replay = wait_until(lambda: page.evaluate("window.__streamEvents[0]"), 5, message="the replayed event")
    assert replay["type"] == "project.status"
    wait_until(lambda: page.evaluate("performance.now()") > replay["at"] + 1000, 5,
               message="the UI's event debounce (0.4 s) and any refresh it starts to pass")
    assert len(tab.api("GET", "/api/projects")) == 1
    assert len(tab.api("GET", "/api/projects/demo/events?limit=120")) == 1


def test_unknown_project_in_hash_falls_back_to_first_project_keeping_the_view(tab):
    page = tab.open("#/nope/messages")
    wait_until(lambda: tab.hash() == "#/beta/messages", 5, message="hash #/beta/messages")
    expect(page.get_by_role("tab", name="Messages")).to_have_attribute("aria-selected", "true")
    assert tab.history_length() == 0


def test_back_button_returns_to_previous_tab(tab):
    page = tab.open("#/demo/overview")
    page.get_by_role("tab", name="Messages").click()
    page.get_by_role("tab", name="Agent history").click()
    wait_until(lambda: tab.hash() == "#/demo/history", 5, message="hash #/demo/history")
    page.go_back()
    wait_until(lambda: tab.hash() == "#/demo/messages", 5, message="hash #/demo/messages")
    expect(page.get_by_role("tab", name="Messages")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_test_id("messages-panel")).to_be_visible()


def test_failing_project_list_shows_banner_until_next_poll_while_stream_is_unavailable(tabs, shared):
    tab = tabs(shared)
    tab.context.route(lambda url: urllib.parse.urlsplit(url).path.endswith("/stream"),
                      lambda route: route.abort())
    page = tab.open("#/demo/overview")
    expect(page.get_by_test_id("stream-state")).to_have_attribute("data-state", "fallback")
    expect(page.get_by_test_id("stream-state")).to_have_text("Summary refresh every 5s")

    page.route(is_project_list, lambda route: route.abort())
    mark = len(tab.requests)
    tab.next_request("GET", "/api/projects", timeout_ms=6500)
    failed_at = time.monotonic()
    expect(page.get_by_test_id("error-banner")).to_be_visible()
    expect(page.get_by_test_id("error-banner")).to_have_attribute("role", "alert")
    expect(page.get_by_test_id("error-banner")).to_have_text(re.compile(r"\S"))
    page.unroute(is_project_list)
    tab.next_request("GET", "/api/projects", timeout_ms=6500)
    recovered_at = time.monotonic()
    expect(page.get_by_test_id("error-banner")).to_be_hidden()
    # The fallback polls the list about every 5 s, and nothing else runs periodically.
    assert 4.0 <= recovered_at - failed_at <= 6.5, recovered_at - failed_at
    others = {urllib.parse.urlsplit(r.url).path for r in tab.api(since=mark)} - {"/api/projects"}
    # without a stream the pending-approvals, calls-in-doubt and concurrency cards follow the list poll
    assert others <= {"/api/projects/demo/stream", "/api/projects/demo/approvals",
                      "/api/projects/demo/effects", "/api/projects/demo/concurrency", "/api/inbox"}


def test_failing_project_list_shows_banner_on_next_live_refresh_and_clears_after_it(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    tab.wait_live()
    page.route(is_project_list, lambda route: route.abort())
    coordination.send_message(fresh.store(), config_of(fresh.store()), "user", "Wake the list refresh.",
                              recipient="researcher")
    expect(page.get_by_test_id("error-banner")).to_be_visible(timeout=LIVE_UPDATE_MS)
    page.unroute(is_project_list)
    coordination.send_message(fresh.store(), config_of(fresh.store()), "user", "And again.", recipient="researcher")
    expect(page.get_by_test_id("error-banner")).to_be_hidden(timeout=LIVE_UPDATE_MS)
    expect(metric(page, "messages")).to_have_text("5")


def test_empty_root_shows_init_hint_and_no_tabs(tabs, tmp_path):
    with serving(tmp_path / "empty") as service:
        tab = tabs(service)
        page = tab.open()
        empty = page.get_by_test_id("empty-state")
        expect(empty.get_by_role("heading")).to_have_text("No projects initialized")
        expect(empty.locator("code")).to_have_text("suzumio init path/to/project.yaml")
        expect(page.get_by_role("tablist")).to_have_count(0)
        expect(page.get_by_test_id("project-count")).to_have_text("0")
        assert tab.hash() == ""
        tab.screenshot("empty", full_page=False)


def test_narrow_viewport_turns_sidebar_into_top_strip_and_stacks_metrics(tabs, shared):
    tab = tabs(shared, viewport={"width": 700, "height": 900})
    page = tab.open("#/demo/overview")
    first, second = page.get_by_test_id("project-item").all()
    a, b = first.bounding_box(), second.bounding_box()
    assert abs(a["y"] - b["y"]) < 1 and b["x"] > a["x"] + a["width"] - 1
    sidebar = page.locator(".sidebar").bounding_box()
    workspace = page.locator(".workspace").bounding_box()
    assert sidebar["y"] == 0 and workspace["y"] >= sidebar["y"] + sidebar["height"] - 1
    expect(page.locator(".sidebar-label")).to_be_hidden()
    expect(page.get_by_test_id("stream-state")).to_be_hidden()
    expect(page.get_by_test_id("last-updated")).to_be_hidden()
    boxes = [page.get_by_test_id(f"metric-{label}").bounding_box()
             for label in ("agents", "messages", "activations", "tools")]
    assert len({round(box["x"]) for box in boxes}) == 1
    assert all(lower["y"] > upper["y"] + upper["height"] - 1 for upper, lower in itertools.pairwise(boxes))
    tab.screenshot("overview-narrow")


# ---------------------------------------------------------------------------------------------
# Overview: metrics, roster, task, lifecycle, composer (scenarios 3–10).

def test_overview_metrics_and_hero_come_from_the_project_list(tab):
    page = tab.open("#/demo/overview")
    expect(metric(page, "agents")).to_have_text("2")
    expect(page.get_by_test_id("metric-agents")).to_contain_text("0 running now")
    expect(metric(page, "messages")).to_have_text("3")
    expect(metric(page, "activations")).to_have_text("2")
    expect(metric(page, "tools")).to_have_text("2")
    hero = page.get_by_test_id("project-hero")
    expect(hero.get_by_test_id("project-status")).to_have_text("initialized")
    expect(hero.get_by_role("heading")).to_have_text("demo")
    expect(hero.get_by_role("button", name="Start project")).to_be_visible()
    assert {urllib.parse.urlsplit(r.url).path for r in tab.api()} <= {
        "/api/projects", "/api/projects/demo/stream", "/api/projects/demo/approvals",  # the cards
        "/api/projects/demo/effects", "/api/projects/demo/concurrency", "/api/inbox"}
    tab.screenshot("overview")


def test_roster_shows_agent_cards_with_initials_role_id_and_status(tab):
    page = tab.open("#/demo/overview")
    cards = page.get_by_test_id("agent-card")
    expect(cards).to_have_count(2)
    for card, (name, avatar, role, agent_id) in zip(cards.all(), [
            ("Yuki", "Y", "project-manager", "pm"), ("Akari", "A", "researcher", "researcher")], strict=True):
        expect(card.get_by_test_id("agent-name")).to_have_text(name)
        expect(card.get_by_test_id("agent-avatar")).to_have_text(avatar)
        expect(card.get_by_test_id("agent-role")).to_have_text(role)
        expect(card.get_by_test_id("agent-id")).to_have_text(agent_id)
        expect(card.get_by_test_id("agent-status")).to_have_text("quiet")


def test_expand_full_task_fetches_the_whole_task_once(tab):
    page = tab.open("#/demo/overview")
    task = page.get_by_test_id("project-task")
    expect(task).to_contain_text("[truncated 500 chars]")
    page.get_by_role("button", name="Expand full task").click()
    expect(page.get_by_role("button", name="Collapse task")).to_be_visible()
    assert task.text_content() == DEMO_TASK and len(DEMO_TASK) == 1500
    assert len(tab.api("GET", "/api/projects/demo/task")) == 1


def test_start_and_stop_buttons_follow_project_status(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    hero = page.get_by_test_id("project-hero")
    hero.get_by_role("button", name="Start project").click()
    expect(hero.get_by_test_id("project-status")).to_have_text("running")
    expect(hero.locator(".hero-actions button")).to_have_text(["Stop"])
    assert [post_json(r) for r in tab.api("POST", "/api/projects/demo/start")] == [None]
    hero.get_by_role("button", name="Stop").click()
    expect(hero.get_by_test_id("project-status")).to_have_text("stopped")
    expect(hero.locator(".hero-actions button")).to_have_text(["Start project", "Replay"])
    assert len(tab.api("POST", "/api/projects/demo/stop")) == 1
    assert fresh.store().project()["status"] == "stopped"


def test_sidebar_click_pushes_hash_and_approve_completes_submitted_project(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    length = tab.history_length()
    page.get_by_test_id("project-item").filter(has_text="beta").click()
    wait_until(lambda: tab.hash() == "#/beta/overview", 5, message="hash #/beta/overview")
    assert tab.history_length() == length + 1
    hero = page.get_by_test_id("project-hero")
    expect(hero.get_by_test_id("project-status")).to_have_text("submitted")
    hero.get_by_role("button", name="Approve report").click()
    assert tab.api("POST", "/api/projects/beta/approve") == []  # asked first, in place
    hero.get_by_role("button", name="Confirm approve").click()
    expect(hero.get_by_test_id("project-status")).to_have_text("completed")
    expect(hero.locator(".hero-actions button")).to_have_text(["Replay"])  # an ended run can be replayed
    assert len(tab.api("POST", "/api/projects/beta/approve")) == 1


def test_composer_lists_roster_and_priorities_and_needs_text(tab):
    page = tab.open("#/demo/overview")
    recipient, priority = page.get_by_label("Recipient"), page.get_by_label("Priority")
    expect(recipient.locator("option")).to_have_text(["Yuki / pm", "Akari / researcher"])
    expect(recipient).to_have_value("pm")
    expect(priority.locator("option")).to_have_text(["P0", "P1", "P2", "P3"])
    expect(priority).to_have_value("P3")
    send = page.get_by_role("button", name="Send message")
    expect(send).to_be_disabled()
    page.get_by_label("Message").fill("   \n  ")
    expect(send).to_be_disabled()
    page.get_by_label("Message").fill("x")
    expect(send).to_be_enabled()


def test_composer_sends_trimmed_body_and_the_messages_tile_grows(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/overview")
    page.get_by_label("Recipient").select_option("researcher")
    page.get_by_label("Priority").select_option("P2")
    page.get_by_label("Message").fill("  hello  ")
    page.get_by_role("button", name="Send message").click()
    expect(page.get_by_label("Message")).to_have_value("")
    expect(metric(page, "messages")).to_have_text("4")
    [request] = tab.api("POST", "/api/projects/demo/messages")
    assert request.post_data == '{"recipient":"researcher","priority":"P2","body":"hello"}'
    assert request.all_headers()["content-type"] == "application/json"
    assert fresh.store().list_messages()[-1]["body"] == "hello"


@pytest.mark.parametrize("status_body, shown", [
    ('{"error":"boom"}', "boom"), ("boom", "boom"), ("", "Request failed: 500")])
def test_composer_failure_shows_error_text_inline_and_keeps_the_draft(tab, status_body, shown):
    page = tab.open("#/demo/overview")
    page.route(lambda url: urllib.parse.urlsplit(url).path == "/api/projects/demo/messages",
               lambda route: route.fulfill(status=500, body=status_body) if route.request.method == "POST"
               else route.fallback())
    page.get_by_label("Message").fill("keep me")
    page.get_by_role("button", name="Send message").click()
    expect(page.get_by_test_id("composer-error")).to_have_text(shown)
    expect(page.get_by_test_id("composer-error")).to_have_attribute("role", "alert")
    expect(page.get_by_label("Message")).to_have_value("keep me")


def fail_with(message):
    return lambda route: route.fulfill(status=404, content_type="application/json; charset=utf-8",
                                       body=json.dumps({"error": message}))


def open_failing(page, tab, view, action):
    tab.open(f"#/demo/{view}")
    if action == "task":
        page.get_by_role("button", name="Expand full task").click()
    elif action == "message":
        page.get_by_test_id("message-card").first.get_by_role("button", name="Expand full").click()
    elif action == "context":
        page.get_by_test_id("activation-item").first.get_by_role("button", name="View context").click()


@pytest.mark.parametrize("view, failing, action, box", [
    ("overview", r"^/api/projects/demo/task$", "task", "task-error"),
    ("messages", r"^/api/projects/demo/messages/msg_", "message", "messages-error"),
    ("activations", r"^/api/projects/demo/activations/act_[^/]+/context$", "context", "activations-error"),
    ("history", r"^/api/projects/demo/agents/pm/history$", None, "history-error"),
    ("events", r"^/api/projects/demo/events$", None, "error-banner"),
])
def test_failed_loads_show_the_error_text_where_the_spec_puts_it(tab, view, failing, action, box):
    page = tab.page
    page.route(lambda url: re.search(failing, urllib.parse.urlsplit(url).path) is not None,
               fail_with("Unknown thing: x"))
    open_failing(page, tab, view, action)
    expect(page.get_by_test_id(box)).to_have_text("Unknown thing: x")
    expect(page.get_by_test_id(box)).to_have_attribute("role", "alert")


def test_refresh_reloads_the_list_and_the_current_view(tab):
    page = tab.open("#/demo/messages")
    expect(page.get_by_test_id("message-card")).to_have_count(3)
    with page.expect_response(lambda r: r.url.endswith("/api/projects/demo/messages?limit=100")):
        page.get_by_role("button", name="Refresh").click()
    expect(page.get_by_role("button", name="Refresh")).to_be_enabled()
    assert len(tab.api("GET", "/api/projects")) == 2
    assert len(tab.api("GET", "/api/projects/demo/messages?limit=100")) == 2


# ---------------------------------------------------------------------------------------------
# Messages (scenarios 11–13).

def test_messages_tab_lists_newest_first_with_truncated_long_body(tab):
    page = tab.open("#/demo/overview")
    page.get_by_role("tab", name="Messages").click()
    wait_until(lambda: tab.hash() == "#/demo/messages", 5, message="hash #/demo/messages")
    panel = page.get_by_test_id("messages-panel")
    expect(panel.locator(".panel-subtitle")).to_have_text("3 recent conversation items")
    cards = page.get_by_test_id("message-card")
    expect(cards).to_have_count(3)
    first = cards.first
    expect(first.get_by_test_id("message-sender")).to_have_text("user")
    expect(first.locator(".route-target .route-label")).to_have_text("Recipient")
    expect(first.get_by_test_id("message-target")).to_have_text("pm")
    expect(first.get_by_test_id("message-priority")).to_have_text("P1")
    expect(first.get_by_test_id("message-body")).to_contain_text("[truncated")
    assert len(tab.api("GET", "/api/projects/demo/messages?limit=100")) == 1


def test_expand_full_message_fetches_body_once_and_reuses_it(tab, shared):
    page = tab.open("#/demo/messages")
    card = page.get_by_test_id("message-card").first
    expect(card).to_have_attribute("data-message-id", shared.seed.newest_message_id)
    card.get_by_role("button", name="Expand full").click()
    expect(card.get_by_test_id("message-chars")).to_have_text("15,000 chars")
    expect(card.get_by_role("button", name="Collapse")).to_be_visible()
    assert card.get_by_test_id("message-body").text_content() == LONG_BODY
    tab.screenshot("messages")
    card.get_by_role("button", name="Collapse").click()
    expect(card.get_by_test_id("message-body")).to_contain_text("[truncated")
    card.get_by_role("button", name="Expand full").click()
    expect(card.get_by_test_id("message-chars")).to_have_text("15,000 chars")
    assert len(tab.api("GET", f"/api/projects/demo/messages/{shared.seed.newest_message_id}")) == 1


def test_reload_restores_the_messages_view(tab):
    page = tab.open("#/demo/messages")
    expect(page.get_by_test_id("message-card")).to_have_count(3)
    page.reload()
    expect(page.get_by_role("tab", name="Messages")).to_have_attribute("aria-selected", "true")
    expect(page.get_by_test_id("message-card")).to_have_count(3)
    assert tab.hash() == "#/demo/messages"


# ---------------------------------------------------------------------------------------------
# Agent history (scenarios 14–16).

def test_history_pages_eighty_rows_then_loads_older_before_oldest_sequence(tab):
    page = tab.open("#/demo/overview")
    page.get_by_role("tab", name="Agent history").click()
    rows = page.get_by_test_id("history-row")
    expect(rows).to_have_count(80)
    assert len(tab.api("GET", "/api/projects/demo/agents/pm/history?limit=80")) == 1
    expect(rows.first.get_by_test_id("history-title")).to_have_text(re.compile(r"^100\. "))
    older = page.get_by_role("button", name="Load older history")
    older.click()
    expect(rows).to_have_count(100)
    expect(older).to_have_count(0)
    assert len(tab.api("GET", "/api/projects/demo/agents/pm/history?limit=80&before=21")) == 1
    assert [int(r.get_attribute("data-sequence")) for r in rows.all()] == list(range(100, 0, -1))


def test_archived_rows_are_dimmed_and_compaction_opens_its_raw_archive(tab, shared):
    page = tab.open("#/demo/history")
    rows = page.get_by_test_id("history-row")
    expect(rows).to_have_count(80)
    page.get_by_role("button", name="Load older history").click()
    expect(rows).to_have_count(100)
    for sequence in (1, 20):
        row = page.locator(f'[data-testid="history-row"][data-sequence="{sequence}"]')
        expect(row.locator(".chip")).to_contain_text(["archived"])
        assert float(row.evaluate("(el) => getComputedStyle(el).opacity")) == pytest.approx(0.74, abs=0.02)
    active = page.locator('[data-testid="history-row"][data-sequence="21"]')
    expect(active.locator(".chip", has_text="archived")).to_have_count(0)
    marker = page.locator('[data-testid="history-row"][data-sequence="22"]')
    expect(marker.get_by_test_id("history-title")).to_have_text("22. compaction / history_compaction")
    # short text is shown in place, not behind a fold
    expect(marker.locator(".history-content")).to_contain_text("Summary of the first twenty rows: plan drafted.")
    marker.scroll_into_view_if_needed()
    tab.screenshot("history", full_page=False)
    marker.get_by_role("button", name="View raw archive").click()
    panel = page.get_by_test_id("archive-panel")
    expect(panel.get_by_role("heading", name="Compaction archive")).to_be_visible()
    chips = panel.locator(".chip")
    expect(chips).to_have_text([shared.seed.compaction_id, "20 messages", re.compile(r"^[\d,]+ chars$")])
    text = panel.get_by_test_id("archive-json").text_content()
    archive = json.loads(text)
    assert text == json.dumps(archive, indent=2, ensure_ascii=False)
    assert [m["sequence"] for m in archive["messages"]] == list(range(1, 21))
    path = f"/api/projects/demo/agents/pm/history-archive/{shared.seed.compaction_id}"
    assert len(tab.api("GET", path)) == 1
    panel.scroll_into_view_if_needed()
    tab.screenshot("history-archive", full_page=False)
    panel.get_by_role("button", name="Close").click()
    expect(panel).to_have_count(0)


def test_agent_without_history_shows_placeholder_and_no_pager(tab):
    page = tab.open("#/demo/history")
    expect(page.get_by_test_id("history-row")).to_have_count(80)
    page.get_by_label("Agent").select_option("researcher")
    expect(page.get_by_test_id("history-panel")).to_contain_text("No history for this agent yet")
    expect(page.get_by_role("button", name="Load older history")).to_have_count(0)
    assert len(tab.api("GET", "/api/projects/demo/agents/researcher/history?limit=80")) == 1


# ---------------------------------------------------------------------------------------------
# Activations, timeline (scenarios 17, 18) and token usage (integrator decision b).

def test_activation_context_opens_model_context_window(tab, shared):
    page = tab.open("#/demo/overview")
    page.get_by_role("tab", name="Activations + context").click()
    wait_until(lambda: tab.hash() == "#/demo/activations", 5, message="hash #/demo/activations")
    items = page.get_by_test_id("activation-item")
    expect(items).to_have_count(2)
    expect(items.locator(".activation-agent")).to_have_text(["pm", "pm"])
    with_context = items.filter(has_text="context recorded")
    expect(with_context).to_have_count(1)
    expect(with_context).to_have_attribute("data-activation-id", shared.seed.activation_with_context)
    with_context.get_by_role("button", name="View context").click()
    panel = page.get_by_test_id("context-panel")
    expect(panel.get_by_role("heading", name="Model context window")).to_be_visible()
    expect(panel.locator(".panel-subtitle")).to_have_text(f"pm / {shared.seed.activation_with_context}")
    # The UI adds the API model as a fifth chip when it differs from the preset name.
    expect(panel.locator(".chip")).to_contain_text(
        ["2 messages", re.compile(r"^[\d,]+ chars$"), "offline", re.compile(r"^recorded \d+[smhd] ago$")])
    blocks = panel.get_by_test_id("context-block")
    expect(blocks).to_have_count(2)
    for block in blocks.all():
        expect(block).to_have_attribute("open", "")
    expect(blocks.locator("summary")).to_have_text([re.compile(r"^1\. system"), re.compile(r"^2\. user")])
    path = f"/api/projects/demo/activations/{shared.seed.activation_with_context}/context"
    assert len(tab.api("GET", path)) == 1
    tab.screenshot("activation-context")
    panel.get_by_role("button", name="Close").click()
    expect(panel).to_have_count(0)


def test_activation_shows_token_usage_only_where_the_model_reported_it(tab, shared):
    page = tab.open("#/demo/activations")
    reported = page.locator(f'[data-activation-id="{shared.seed.activation_with_context}"]')
    expect(reported.get_by_test_id("activation-usage")).to_contain_text("1,540 tokens")
    expect(reported.get_by_test_id("activation-usage")).to_contain_text("in 1,200")
    expect(reported.get_by_test_id("activation-usage")).to_contain_text("out 340")
    silent = page.locator(f'[data-activation-id="{shared.seed.activation_without_context}"]')
    expect(silent.get_by_test_id("activation-result")).to_have_text("Briefing read.")
    expect(silent.get_by_test_id("activation-usage")).to_have_count(0)
    expect(page.get_by_test_id("activations-token-total")).to_have_text("1,540 tokens reported")


def test_timeline_lists_events_newest_first_with_clock_and_summary(tab, shared):
    page = tab.open("#/demo/overview")
    page.get_by_role("tab", name="Timeline").click()
    wait_until(lambda: tab.hash() == "#/demo/events", 5, message="hash #/demo/events")
    items = page.get_by_test_id("timeline-item")
    expected = shared.service.get("/api/projects/demo/events?limit=120").json()
    expect(items).to_have_count(len(expected))
    assert items.get_by_test_id("event-type").all_inner_texts() == [e["type"] for e in expected]
    assert [e["created_at"] for e in expected] == sorted((e["created_at"] for e in expected), reverse=True)
    assert all(CLOCK.match(t) for t in items.get_by_test_id("event-time").all_inner_texts())
    summaries = items.get_by_test_id("event-summary").all_inner_texts()
    assert summaries[0] == "status: initialized"
    assert all(re.match(r"^\w+: ", s) or s == "No payload" for s in summaries)
    tab.screenshot("timeline", full_page=False)


# ---------------------------------------------------------------------------------------------
# Tool workspace (scenarios 19–25).

def test_tool_status_loads_in_parallel_and_runs_the_first_control_page(tab):
    page = tab.open("#/demo/overview")
    events = []
    page.on("request", lambda r: events.append(("request", urllib.parse.urlsplit(r.url).path)))
    page.on("response", lambda r: events.append(("response", urllib.parse.urlsplit(r.url).path)))
    page.get_by_role("tab", name="Tool status").click()
    length = tab.history_length()
    wait_until(lambda: tab.hash() == "#/demo/tools/control%3Acore%3Aproject.stats", 5,
               message="hash of the project.stats page")
    assert tab.history_length() == length
    expect(page.get_by_test_id("tool-page-count")).to_have_text("8 pages")
    expect(page.get_by_test_id("tool-index-item").locator(".tool-index-title")).to_have_text([
        "Project statistics", "completion.submit", "coordination.wait_for_signal", "file.patch", "file.read",
        "file.write", "messages.send", "shell.exec"])
    metrics = page.get_by_test_id("control-result").get_by_test_id("result-metric")
    expect(metrics.locator(".result-metric-label")).to_contain_text(["Status", "Agents"])
    [run] = tab.api("POST", "/api/projects/demo/tool-ui/core/project.stats")
    assert run.post_data == "{}"
    lists = ("/api/projects/demo/tool-status", "/api/projects/demo/tool-ui")
    starts = [events.index(("request", path)) for path in lists]
    ends = [events.index(("response", path)) for path in lists]
    assert max(starts) < min(ends), events


def test_tool_page_shows_summary_and_auto_loads_only_panels(tab):
    page = tab.open("#/demo/tools")
    expect(page.get_by_test_id("tool-page-count")).to_have_text("8 pages")
    page.get_by_test_id("tool-index-item").filter(has_text="messages.send").click()
    wait_until(lambda: tab.hash() == "#/demo/tools/tool%3Amessages.send", 5, message="messages.send hash")
    tool = page.get_by_test_id("tool-page")
    expect(tool.get_by_test_id("tool-kicker")).to_have_text("builtin / core")
    expect(tool.get_by_test_id("tool-summary-cell").locator(".summary-label")).to_contain_text(
        ["Total calls", "Enabled agents"])
    expect(tool.get_by_role("heading", name="Controls")).to_be_visible()
    expect(tool.get_by_test_id("tool-controls-count")).to_have_text("2 WebUI controls")
    conversation = page.locator('[data-entry="core/messages.conversation"]')
    expect(conversation.get_by_test_id("control-result")).to_be_visible()
    [load] = tab.api("POST", "/api/projects/demo/tool-ui/core/messages.conversation")
    assert list(post_json(load).items()) == [("agentA", "user"), ("agentB", "pm"), ("limit", 40)]
    assert tab.api("POST", "/api/projects/demo/tool-ui/core/messages.send") == []
    tab.screenshot("tool-workspace")


def test_send_agent_message_form_uses_roster_dropdowns_and_defaults(tab):
    page = tab.open("#/demo/tools/tool%3Amessages.send")
    card = page.locator('[data-entry="core/messages.send"]')
    sender = card.get_by_label("sender", exact=True)
    expect(sender.locator("option")).to_have_text(["(empty)", "User", "Yuki / pm", "Akari / researcher"])
    expect(sender).to_have_value("user")
    expect(card.get_by_label("recipient", exact=True).locator("option")).to_have_text(
        ["Auto / no direct recipient", "User", "Yuki / pm", "Akari / researcher"])
    priority = card.get_by_label("priority", exact=True)
    expect(priority.locator("option")).to_have_text(["(empty)", "P0", "P1", "P2", "P3"])
    expect(priority).to_have_value("P3")
    expect(card.get_by_label("body *", exact=True)).to_be_visible()


def test_send_agent_message_action_posts_form_and_keeps_result_after_server_error(tabs, fresh):
    tab = tabs(fresh)
    page = tab.open("#/demo/tools/tool%3Amessages.send")
    card = page.locator('[data-entry="core/messages.send"]')
    card.get_by_label("body *", exact=True).fill("ping")
    card.get_by_label("recipient", exact=True).select_option("researcher")
    card.get_by_role("button", name="Send message").click()
    expect(card.get_by_test_id("control-result-title")).to_have_text("message sent")
    expect(card.get_by_test_id("control-output")).to_have_text(re.compile(r"^Message sent: msg_"))
    [sent] = tab.api("POST", "/api/projects/demo/tool-ui/core/messages.send")
    assert post_json(sent) == {"sender": "user", "recipient": "researcher", "priority": "P3", "body": "ping"}

    card.get_by_label("body *", exact=True).fill("")
    card.get_by_role("button", name="Send message").click()
    expect(card.get_by_test_id("control-error")).to_have_text("body is required")
    expect(card.get_by_test_id("control-result-title")).to_have_text("message sent")
    assert fresh.store().list_messages()[-1]["body"] == "ping"


def test_tool_page_survives_reload_and_unknown_key_falls_back_to_first_page(tab):
    page = tab.open("#/demo/tools/tool%3Amessages.send")
    expect(page.get_by_test_id("tool-page")).to_have_attribute("data-key", "tool:messages.send")
    page.reload()
    expect(page.get_by_test_id("tool-page")).to_have_attribute("data-key", "tool:messages.send")
    expect(page.get_by_test_id("tool-index-item").filter(has_text="messages.send")).to_have_attribute(
        "aria-current", "page")
    page.evaluate("location.hash = '#/demo/tools/tool%3Anope'")
    expect(page.get_by_test_id("tool-page")).to_have_attribute("data-key", "control:core:project.stats")
    wait_until(lambda: tab.hash() == "#/demo/tools/control%3Acore%3Aproject.stats", 5,
               message="hash replaced with the project.stats key")
    page.go_back()
    wait_until(lambda: tab.hash() == "#/demo/tools/tool%3Amessages.send", 5, message="back to messages.send")


def test_signal_queue_panel_defaults_and_cleared_limit_is_omitted(tab):
    page = tab.open("#/demo/tools/tool%3Acoordination.wait_for_signal")
    card = page.locator('[data-entry="core/coordination.signals"]')
    expect(card.get_by_test_id("control-result")).to_be_visible()
    target = card.get_by_label("targetAgent", exact=True)
    expect(target.locator("option")).to_have_text(["All agents", "Yuki / pm", "Akari / researcher"])
    expect(target).to_have_value("")
    status = card.get_by_label("status", exact=True)
    expect(status).to_have_value("")
    expect(status.locator("option").first).to_have_text("(empty)")
    limit = card.get_by_label("limit", exact=True)
    expect(limit).to_have_value("25")
    [first] = tab.api("POST", "/api/projects/demo/tool-ui/core/coordination.signals")
    assert post_json(first)["limit"] == 25
    limit.fill("")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/coordination.signals")) as sent:
        card.get_by_role("button", name="Refresh signals").click()
    second = sent.value
    assert "limit" not in post_json(second)


# ---------------------------------------------------------------------------------------------
# Static serving, text-only rendering, CSP and the API token (scenarios 31–34).

def test_index_and_assets_are_served_with_types_and_traversal_is_refused(shared):
    status, headers, body = raw_get(shared.service, "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    html = body.decode()
    assert '<div id="app">' in html and "<title>Suzumio Observatory</title>" in html
    scripts = re.findall(r'src="(/assets/[^"]+\.js)"', html)
    assert scripts
    for path in scripts:
        status, headers, _ = raw_get(shared.service, path)
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    status, _, body = raw_get(shared.service, "/assets/%2e%2e/%2e%2e/README.md")
    assert status == 404 and json.loads(body) == {"error": "not found"}


def test_server_strings_render_as_text(tabs, tmp_path):
    with serving(tmp_path / "root") as service:
        seed_xss(service.root, tmp_path / "configs", service.base_url)
        tab = tabs(service)
        page = tab.open("#/xss/overview")
        expect(page.get_by_test_id("agent-name")).to_have_text(XSS_NAME)
        expect(page.get_by_label("Recipient").locator("option")).to_have_text([f"{XSS_NAME} / pm"])
        page.get_by_role("tab", name="Messages").click()
        expect(page.get_by_test_id("message-body")).to_have_text(XSS_BODY)
        page.get_by_role("tab", name="Tool status").click()
        page.get_by_test_id("tool-index-item").filter(has_text="messages.send").click()
        card = page.locator('[data-entry="core/messages.send"]')
        card.get_by_label("body *", exact=True).fill("<script>window.__xss = 2</script>")
        card.get_by_role("button", name="Send message").click()
        expect(card.get_by_test_id("control-output")).to_contain_text("<script>window.__xss = 2</script>")
        assert page.locator("#app img, #app b, #app i, #app script").count() == 0
        assert page.evaluate("typeof window.__xss") == "undefined"


def test_csp_headers_and_no_violation_in_any_view(tabs, shared):
    status, headers, _ = raw_get(shared.service, "/")
    assert status == 200
    assert headers["Content-Security-Policy"] == "default-src 'self'"
    assert headers["X-Content-Type-Options"] == "nosniff"
    tab = tabs(shared)
    page = tab.open("#/demo/overview")
    for name in ("Agent history", "Messages", "Activations + context", "Tool status", "Timeline", "Overview"):
        page.get_by_role("tab", name=name).click()
        expect(page.get_by_role("tab", name=name)).to_have_attribute("aria-selected", "true")
        if name == "Tool status":
            expect(page.get_by_test_id("control-result")).to_be_visible()
        if name == "Agent history":
            expect(page.get_by_test_id("history-row")).to_have_count(80)
    assert page.evaluate("window.__csp") == []
    assert [line for line in tab.console if "Content Security Policy" in line] == []


def test_api_token_prompt_stores_token_for_the_tab_only(tabs, tmp_path):
    with serving(tmp_path / "root", api_token="t0ken") as service:
        seed_harness(service.root, tmp_path / "configs", service.base_url)
        tab = tabs(service.base_url)
        page = tab.page
        page.goto(service.base_url + "/")
        prompt = page.get_by_test_id("token-prompt")
        expect(prompt.get_by_role("heading")).to_have_text("API token required")
        expect(page.get_by_label("API token")).to_have_attribute("type", "password")
        expect(page.get_by_role("button", name="Use token")).to_be_disabled()
        expect(page.get_by_role("tablist")).to_have_count(0)

        page.get_by_label("API token").fill("nope")
        page.get_by_role("button", name="Use token").click()
        expect(prompt.get_by_role("alert")).to_have_text("Invalid API token")
        tab.screenshot("token-prompt", full_page=False)

        page.get_by_label("API token").fill("t0ken")
        mark = len(tab.requests)
        page.get_by_role("button", name="Use token").click()
        expect(page.get_by_test_id("project-item")).to_have_count(2)
        expect(page.get_by_role("tablist")).to_be_visible()
        tab.wait_live()
        page.get_by_role("tab", name="Messages").click()
        expect(page.get_by_test_id("messages-panel").locator(".panel-subtitle")).to_have_text(
            "0 recent conversation items")  # beta, the first project, has no messages
        assert "t0ken" not in page.url
        assert "t0ken" not in json.dumps(page.evaluate("Object.entries(localStorage)"))
        assert page.evaluate("sessionStorage.getItem('suzumio.apiToken')") == "t0ken"

        reloaded = len(tab.requests)
        page.reload()
        expect(page.get_by_test_id("project-item")).to_have_count(2)
        expect(page.get_by_test_id("token-prompt")).to_have_count(0)
        tab.wait_live()
        after_token = tab.requests[mark:]
        api = [r for r in after_token if urllib.parse.urlsplit(r.url).path.startswith("/api/")]
        assert len([r for r in tab.requests[reloaded:] if r in api]) >= 2
        for request in api:
            url = urllib.parse.urlsplit(request.url)
            if url.path.endswith("/stream"):
                # EventSource cannot send headers: the stream route alone takes ?token= (docs/http-api.md).
                assert urllib.parse.parse_qs(url.query)["token"] == ["t0ken"]
            else:
                assert request.all_headers().get("authorization") == "Bearer t0ken", request.url
        static = [r for r in tab.requests if not urllib.parse.urlsplit(r.url).path.startswith("/api/")]
        assert any("/assets/" in r.url for r in tab.requests[reloaded:])
        for request in static:
            assert "authorization" not in request.all_headers(), request.url

        other = tabs(service.base_url).page
        other.goto(service.base_url + "/")
        expect(other.get_by_test_id("token-prompt")).to_be_visible()


def test_control_room_url_token_is_kept_for_the_session_and_dropped_from_the_address_bar(tabs, tmp_path):
    with serving(tmp_path / "root", api_token="r00m-t0ken") as service:
        seed_harness(service.root, tmp_path / "configs", service.base_url)
        tab = tabs(service)
        page = tab.open("#/demo/messages")
        expect(page.get_by_test_id("message-card")).to_have_count(3)
        expect(page.get_by_test_id("token-prompt")).to_have_count(0)
        assert page.url == service.base_url + "/#/demo/messages"
        assert "r00m-t0ken" not in page.url and tab.history_length() == 0
        assert page.evaluate("sessionStorage.getItem('suzumio.apiToken')") == "r00m-t0ken"
        assert "r00m-t0ken" not in json.dumps(page.evaluate("Object.entries(localStorage)"))
        tab.wait_live()
        api = tab.api()
        assert api
        for request in api:
            url = urllib.parse.urlsplit(request.url)
            if url.path.endswith("/stream"):
                assert urllib.parse.parse_qs(url.query)["token"] == ["r00m-t0ken"]
            else:
                assert request.all_headers().get("authorization") == "Bearer r00m-t0ken", request.url
        page.reload()
        expect(page.get_by_test_id("message-card")).to_have_count(3)
        assert page.url == service.base_url + "/#/demo/messages"

        wrong = tabs(service.base_url).page
        wrong.goto(service.base_url + "/?token=nope#/demo/overview")
        prompt = wrong.get_by_test_id("token-prompt")
        expect(prompt.get_by_role("alert")).to_have_text("Invalid API token")
        assert "nope" not in wrong.url


# ---------------------------------------------------------------------------------------------
# The pending-approvals card, live from the stream, in real Chromium against a real team.

def test_pending_approval_card_appears_live_and_allow_runs_the_tool(tabs, tmp_path):
    from e2e_fixtures import PM_TOOLS, WORKER_TOOLS, call, running_team

    agents = {"pm": {"model": "pm", "tools": PM_TOOLS},
              "worker-1": {"model": "worker", "tools": WORKER_TOOLS,
                           "approve": [{"tool": "shell.exec", "match": {"command": "deploy"}}]}}
    with running_team(tmp_path, "local", agents=agents) as team:
        marker = team.store.artifacts_dir("worker-1") / "deployed.txt"
        command = f"printf '<b>x</b>' > {marker}  # deploy <img src=x onerror=alert(1)>"
        team.model.enqueue(tool_calls=[call("shell.exec", command=command)], model="worker-1")
        team.model.enqueue(content="Deployed.", model="worker-1")
        tab = tabs(team.service)
        page = tab.open(f"#/{team.name}/overview")
        tab.wait_live()
        expect(page.get_by_test_id("approvals-card")).to_have_count(0)
        team.send("worker-1", "Deploy.")
        card = page.get_by_test_id("approvals-card")
        expect(card).to_be_visible(timeout=LIVE_UPDATE_MS + 5000)
        item = card.get_by_test_id("approval-item")
        expect(item).to_have_count(1)
        expect(item.get_by_test_id("approval-tool")).to_have_text("shell.exec")
        expect(item.get_by_test_id("approval-agent")).to_have_text("worker-1")
        # the input is text: the markup in it is shown, never parsed
        expect(item.get_by_test_id("approval-input")).to_contain_text("<img src=x onerror=alert(1)>")
        assert item.locator("img, b").count() == 0
        tab.screenshot("approvals-card", full_page=False)  # docs/images/approvals-card.png is a copy
        assert not marker.exists()

        # the agent's own view shows the same request
        page.get_by_role("tab", name="History").click()
        page.locator("#history-agent").select_option("worker-1")
        expect(page.get_by_test_id("approvals-card").get_by_test_id("approval-item")).to_have_count(1)
        page.locator("#history-agent").select_option("pm")
        expect(page.get_by_test_id("approvals-card")).to_have_count(0)
        page.locator("#history-agent").select_option("worker-1")

        decide = tab.page.expect_request(lambda r: r.method == "POST" and "/approvals/" in r.url)
        with decide as request:
            page.get_by_test_id("approvals-card").get_by_role("button", name="Allow", exact=True).click()
        assert post_json(request.value) == {"decision": "allow"}
        assert request.value.headers.get("suzumio-client") == "webui"
        expect(page.get_by_test_id("approvals-card")).to_have_count(0, timeout=LIVE_UPDATE_MS + 5000)
        [activation] = team.wait_activations("worker-1", 1)
        assert activation["status"] == "completed"
        assert marker.read_text() == "<b>x</b>"
        [row] = team.service.get(f"/api/projects/{team.name}/approvals").json()
        assert (row["status"], row["decidedBy"]) == ("allowed", "webui")



# ---------------------------------------------------------------------------------------------
# The calls-in-doubt card: an external call its runner never finished, resolved from the overview.

def test_a_call_in_doubt_is_listed_on_the_overview_and_resolved_there(tabs, tmp_path):
    from api_fixtures import init_project, running_activation
    from test_effects import PROJECT_YAML

    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "config", PROJECT_YAML)
        store.start()
        activation = running_activation(store, "worker")["id"]
        who = {"project": "demo", "agentId": "worker", "activationId": activation,
               "token": service.token("demo", "worker")}
        command = "./pay.sh 5 <img src=x onerror=alert(1)>"
        assert service.post("/runner/tool-calls/start", {**who, "tool": "shell.exec", "input": {"command": command},
                                                         "callKey": "k-ui"}).status_code == 200
        coordination.fail_activation(store, activation, "Runner exited with 137")
        tab = tabs(service)
        page = tab.open("#/demo/overview")
        card = page.get_by_test_id("effects-card")
        expect(card).to_be_visible()
        item = card.get_by_test_id("effect-item")
        expect(item).to_have_count(1)
        expect(item.get_by_test_id("effect-input")).to_contain_text("<img src=x onerror=alert(1)>")
        assert item.locator("img").count() == 0
        expect(item).to_contain_text("k-ui")
        item.get_by_role("textbox").fill("no payment in the bank")
        resolve = tab.page.expect_request(lambda r: r.method == "POST" and "/resolve" in r.url)
        with resolve as request:
            item.get_by_role("button", name="It did not happen").click()
        assert post_json(request.value) == {"resolution": "not_done", "note": "no payment in the bank"}
        expect(page.get_by_test_id("effects-card")).to_have_count(0)
        [effect] = service.get("/api/projects/demo/effects").json()
        assert (effect["state"], effect["resolution"], effect["resolvedBy"]) == ("failed", "not_done", "webui")
