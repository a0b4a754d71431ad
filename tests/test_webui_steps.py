"""Steps readable in place (docs/design/webui.md), in real Chromium against the real app with the seeded
`demo`: a history row shows the tool's name, its input and its output, long text folded; activations show
how long they ran; the timeline pages back through the API and filters on the server; times are local
with the UTC instant in the title."""
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect
from store_fixtures import config_of
from test_webui import browser, fresh, tabs  # noqa: F401  (fixtures)

import suzumio_coordination as coordination

pytestmark = [pytest.mark.timeout(180), pytest.mark.browser]

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
UTC = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$")


def test_history_rows_show_the_tool_its_input_and_its_output_with_long_text_folded(tabs, fresh):  # noqa: F811
    store = fresh.store()
    long_output = "".join(f"line {n}\n" for n in range(1, 41))
    store.append_history("pm", None, "tool_result", "tool_result", "# Tool Result\nTool: shell.exec",
                         {"tool": "shell.exec", "status": "completed"},
                         [{"type": "tool_result", "toolName": "shell.exec", "output": long_output}])
    tab = tabs(fresh)
    page = tab.open("#/demo/history")
    page.get_by_role("button", name="Load older history").click()
    call = page.locator('[data-testid="history-row"][data-sequence="2"]')
    expect(call.get_by_test_id("history-title")).to_have_text("2. tool call · shell.exec")
    expect(call.get_by_test_id("step-input")).to_contain_text('"command": "ls /workspace"')
    result = page.locator('[data-testid="history-row"][data-sequence="3"]')
    expect(result.get_by_test_id("history-title")).to_have_text("3. tool result · shell.exec · completed")
    expect(result.get_by_test_id("step-output")).to_have_text(re.compile(r"\$ ls /workspace\s+ok"))
    assert UTC.match(result.locator(".meta-time").get_attribute("title"))
    folded = page.get_by_test_id("history-row").first.get_by_test_id("step-output")
    expect(folded).not_to_have_attribute("open", "")
    expect(folded.locator("summary")).to_contain_text("40 lines")
    folded.locator("summary").click()
    expect(folded.locator("pre").last).to_contain_text("line 40")
    result.scroll_into_view_if_needed()
    page.screenshot(path=str(IMAGES / "webui-history-steps.png"))


def test_activations_show_how_long_they_ran(tabs, fresh):  # noqa: F811
    page = tabs(fresh).open("#/demo/activations")
    lines = page.get_by_test_id("activation-line")
    expect(lines).to_have_count(2)
    for line in lines.all():
        expect(line).to_contain_text(re.compile(r" - ran \d+(\.\d)? m?s - "))
        assert UTC.match(line.get_attribute("title").removeprefix("started "))


def test_the_timeline_pages_back_and_filters_on_the_server(tabs, fresh):  # noqa: F811
    store = fresh.store()
    for index in range(130):
        coordination.send_message(store, config_of(store), "user", f"Note {index}", recipient="researcher")
    tab = tabs(fresh)
    page = tab.open("#/demo/events")
    items = page.get_by_test_id("timeline-item")
    expect(items).to_have_count(120)
    newest = items.filter(has=page.get_by_test_id("event-type").get_by_text("message.created", exact=True)).first
    expect(newest.get_by_test_id("event-sentence")).to_have_text("user → researcher (P3): Note 129")
    expect(items.first.get_by_test_id("event-sentence")).to_have_text("signal message.created for researcher")
    assert UTC.match(items.first.get_by_test_id("event-time").get_attribute("title"))
    total = len(fresh.service.get("/api/projects/demo/events?limit=500").json())
    page.get_by_test_id("timeline-older").click()
    expect(items).to_have_count(min(240, total))
    [older] = [r for r in tab.api("GET") if "before=" in r.url]
    assert "limit=120" in older.url
    page.get_by_test_id("timeline-type").select_option("message.created")
    expect(items).to_have_count(120)
    assert set(items.get_by_test_id("event-type").all_inner_texts()) == {"message.created"}
    assert tab.api("GET", "/api/projects/demo/events?limit=120&type=message.created")
    page.get_by_test_id("timeline-agent").select_option("pm")
    expect(items).to_have_count(1)
    expect(items.get_by_test_id("event-sentence")).to_have_text("pm → user (P3): Survey plan drafted; details follow.")
    page.screenshot(path=str(IMAGES / "webui-timeline.png"))
