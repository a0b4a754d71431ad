"""WebUI overview load at scale: a project with 5,000 messages and an agent with 20,000 history rows,
seeded through the store and served by the real app, opened in Chromium several times (a fresh browser
context each run, so nothing is cached). Prints the page's own navigation timing, the time until the
roster and metrics are rendered (medians; target under 1 s), and the bytes of every request the page
makes; exits non-zero when a response carries message bodies or history rows the overview never shows.
Usage: .venv/bin/python bench/webui_overview.py [--messages 5000] [--history 20000] [--runs 7]"""
import argparse
import http.client
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

from api_fixtures import serving
from provisioning_fixtures import chromium_browser
from webui_fixtures import HISTORY_MARKER, MESSAGE_MARKER, seed_large

TARGET_MS = 1000
PROJECT = "large"

# Records, in the page's own clock, when the roster and the four metric tiles first hold data.
RENDER_PROBE = """
(() => {
  window.__rendered = null;
  const done = () => {
    const cards = document.querySelectorAll('[data-testid="agent-card"]').length;
    const value = document.querySelector('[data-testid="metric-messages"] [data-testid="metric-value"]');
    const tiles = document.querySelectorAll('[data-testid="metric-strip"] .metric').length;
    return cards > 0 && tiles === 4 && value !== null && value.textContent !== '0';
  };
  new MutationObserver((_, observer) => {
    if (window.__rendered === null && done()) {
      window.__rendered = performance.now();
      observer.disconnect();
    }
  }).observe(document, { childList: true, subtree: true, characterData: true });
})();
"""

NAVIGATION_FIELDS = ("responseStart", "responseEnd", "domInteractive", "domContentLoadedEventEnd",
                     "loadEventEnd")


def one_run(browser, base_url):
    """Open the overview in a fresh context; return timings and every finite response's size and body."""
    context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 900})
    context.add_init_script(RENDER_PROBE)
    page = context.new_page()
    responses = []
    page.on("response", lambda response: responses.append(response))
    page.goto(f"{base_url}/#/{PROJECT}/overview", wait_until="load")
    page.wait_for_function("() => window.__rendered !== null", timeout=30000)
    # Let the stream connect and any follow-up requests finish before reading the entries.
    page.wait_for_selector('[data-testid="stream-state"][data-state="live"]', timeout=10000)
    page.wait_for_timeout(1500)  # past the UI's 0.4 s event debounce, so follow-up requests are counted
    navigation = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
    resources = page.evaluate(
        "performance.getEntriesByType('resource').map((e) => ({name: e.name, transferSize: e.transferSize,"
        " encodedBodySize: e.encodedBodySize, decodedBodySize: e.decodedBodySize, startTime: e.startTime,"
        " duration: e.duration}))")
    rendered = page.evaluate("window.__rendered")
    bodies = {}
    for response in responses:
        path = urllib.parse.urlsplit(response.url).path
        if path.endswith("/stream"):
            continue  # never ends; measured separately by first_stream_chunk()
        bodies[response.url] = response.body()
    context.close()
    timings = {field: navigation[field] for field in NAVIGATION_FIELDS}
    timings["rosterAndMetrics"] = rendered
    entries = [{"name": navigation["name"], "transferSize": navigation["transferSize"],
                "decodedBodySize": navigation["decodedBodySize"], "startTime": 0.0,
                "duration": navigation["responseEnd"]}] + resources
    return timings, entries, bodies, [r.url for r in responses]


def first_stream_chunk(port):
    """The bytes the page's stream request (`?limit=1`) receives when it connects."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", f"/api/projects/{PROJECT}/stream?limit=1",
                           headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        return response.fp.read1(65536) if hasattr(response.fp, "read1") else response.read(65536)
    finally:
        connection.close()


def carries_hidden_data(body):
    return MESSAGE_MARKER.encode() in body or HISTORY_MARKER.encode() in body


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--history", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    with (tempfile.TemporaryDirectory(prefix="suzumio-webui-bench-") as tmp,
          serving(Path(tmp) / "root", api_token=None) as service):
        started = time.perf_counter()
        store = seed_large(service.root, Path(tmp) / "configs", service.base_url,
                           messages=args.messages, history=args.history)
        stats = store.project_stats()
        print(f"seeded {stats['messageCount']} messages, {stats['historyMessageCount']} history rows, "
              f"{stats['eventCount']} events in {time.perf_counter() - started:.1f}s")

        runs = []
        with chromium_browser() as browser:
            one_run(browser, service.base_url)  # warm-up: first Chromium start, server caches
            for _ in range(args.runs):
                runs.append(one_run(browser, service.base_url))
        chunk = first_stream_chunk(service.port)

    print(f"\nnavigation timing, median of {args.runs} cold loads (ms since navigation start):")
    for field in (*NAVIGATION_FIELDS, "rosterAndMetrics"):
        values = [timings[field] for timings, *_ in runs]
        print(f"  {field:<26} {statistics.median(values):8.1f}   (min {min(values):.1f}, max {max(values):.1f})")
    rendered = statistics.median(timings["rosterAndMetrics"] for timings, *_ in runs)
    verdict = "met" if rendered < TARGET_MS else "NOT met"
    print(f"  target: roster and metrics under {TARGET_MS} ms -> {verdict} ({rendered:.0f} ms)")

    _, entries, _, urls = runs[-1]
    total = sum(entry["transferSize"] for entry in entries)
    print(f"\nrequests of one load ({len(urls)} responses; the stream's connect chunk is {len(chunk)} bytes):")
    for entry in sorted(entries, key=lambda e: -e["transferSize"]):
        path = urllib.parse.urlsplit(entry["name"]).path or "/"
        print(f"  {entry['transferSize']:9,d} B transferred  {entry['decodedBodySize']:9,d} B body  "
              f"{entry['startTime']:7.1f} + {entry['duration']:6.1f} ms  {path}")
    print(f"  {total + len(chunk):9,d} B in total (transferSize of every entry plus the stream chunk)")

    leaks = [url for _, _, bodies, _ in runs for url, body in bodies.items() if carries_hidden_data(body)]
    if carries_hidden_data(chunk):
        leaks.append("stream connect chunk")
    if leaks:
        raise SystemExit(f"responses carry message bodies or history the overview does not show: {leaks}")
    print("\nno response carries message bodies or history rows")


if __name__ == "__main__":
    main()
