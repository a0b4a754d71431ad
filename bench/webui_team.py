"""Team view at scale: a project of 6 agents with 2,000 activations and 10,000 messages over about
five hours (tests/webui_fixtures.py seed_team_scale, through the store), served by the real app and opened
in Chromium on `#/team/team`, a fresh browser context per run. Measures the time to first render (the
first bar drawn, in the page's clock since navigation start) against the page's own first timeline
request (the data alone), the time until every page is loaded, and the frame time while panning: the
default 15-minute window and the whole project zoomed out (drawn as summary paths), against idle
frames of the same page.
Usage: .venv/bin/python bench/webui_team.py [--activations 2000] [--messages 10000] [--runs 5] [--json]"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from api_fixtures import serving
from provisioning_fixtures import chromium_browser
from webui_fixtures import seed_team_scale

PROJECT = "team"
FRAMES = 90

# Records, in the page's clock, when the first bar is drawn and when the timeline request first ends.
RENDER_PROBE = """
(() => {
  window.__firstBar = null;
  new MutationObserver((_, observer) => {
    if (window.__firstBar === null && document.querySelector('[data-testid="team-bar"]')) {
      window.__firstBar = performance.now();
      observer.disconnect();
    }
  }).observe(document, { childList: true, subtree: true });
})();
"""

# Pans with one Shift+wheel event per animation frame and records every frame's duration; `idle`
# records the same number of frames with no input, the page's own frame rate.
PAN = """
async ([frames, mode]) => {
  const svg = document.querySelector('.team-svg');
  const times = [];
  // Ten frames settle whatever the previous step left pending; they are not counted.
  for (let i = 0; i < 10; i += 1) await new Promise((resolve) => requestAnimationFrame(resolve));
  await new Promise((resolve) => {
    let last = null;
    const step = (t) => {
      if (last !== null) times.push(t - last);
      last = t;
      // wiggle: back and forth by 8 px, over the same data; sweep: 40 px a frame towards the past,
      // about three windows in 90 frames, so the layer is redrawn as the pan leaves the drawn range.
      const deltaX = mode === 'sweep' ? -40 : times.length % 20 < 10 ? -8 : 8;
      const wheel = { deltaX, shiftKey: true, bubbles: true, cancelable: true };
      if (mode !== 'idle') svg.dispatchEvent(new WheelEvent('wheel', wheel));
      if (times.length < frames) requestAnimationFrame(step);
      else resolve();
    };
    requestAnimationFrame(step);
  });
  const dense = document.querySelector('[data-testid="team-dense"]');
  return {
    times,
    dense: dense !== null,
    bars: dense ? Number(dense.dataset.bars) : document.querySelectorAll('[data-testid="team-bar"]').length,
    arrows: dense ? Number(dense.dataset.arrows) : document.querySelectorAll('[data-testid="team-arrow"]').length,
  };
}
"""


# Clicks "Fit all" and returns the ms until the second frame after it: the redraw of the whole project.
FIT_ALL = """
async () => {
  const button = [...document.querySelectorAll('button')].find((b) => b.textContent === 'Fit all');
  const started = performance.now();
  button.click();
  await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
  return performance.now() - started;
}
"""


def one_run(browser, base_url):
    context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 900})
    context.add_init_script(RENDER_PROBE)
    page = context.new_page()
    page.goto(f"{base_url}/#/{PROJECT}/team", wait_until="load")
    page.wait_for_function("() => window.__firstBar !== null", timeout=60000)
    page.wait_for_selector('[data-testid="team-chart"][data-complete="true"]', timeout=120000)
    first_bar = page.evaluate("window.__firstBar")
    entries = page.evaluate(
        "performance.getEntriesByType('resource').filter((e) => e.name.includes('/timeline'))"
        ".map((e) => ({start: e.startTime, end: e.responseEnd, size: e.decodedBodySize}))")
    complete = page.evaluate("performance.now()")
    context.close()
    first = min(entries, key=lambda e: e["start"])
    return {"firstBar": first_bar, "firstPageEnd": first["end"], "allPages": max(e["end"] for e in entries),
            "pages": len(entries), "firstPageBytes": first["size"], "complete": complete}


def pan_frames(browser, base_url):
    """Frame durations (ms) while panning the default window and the whole project, and idle."""
    context = browser.new_context(locale="en-US", viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.goto(f"{base_url}/#/{PROJECT}/team", wait_until="load")
    page.wait_for_selector('[data-testid="team-chart"][data-complete="true"]', timeout=120000)
    idle = page.evaluate(PAN, [FRAMES, "idle"])
    window = page.evaluate(PAN, [FRAMES, "wiggle"])
    sweep = page.evaluate(PAN, [FRAMES, "sweep"])
    redraw = page.evaluate(FIT_ALL)
    everything = page.evaluate(PAN, [FRAMES, "wiggle"])
    context.close()
    return idle, window, sweep, redraw, everything


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activations", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("webui_team")
    with (tempfile.TemporaryDirectory(prefix="suzumio-team-bench-") as tmp,
          serving(Path(tmp) / "root", api_token=None) as service):
        started = time.perf_counter()
        store = seed_team_scale(service.root, Path(tmp) / "configs", service.base_url,
                                activations=options.activations, messages=options.messages)
        stats = store.project_stats()
        results.note(f"seeded {stats['activationCount']:,} activations and {stats['messageCount']:,} messages "
                     f"in {time.perf_counter() - started:.1f} s")
        with chromium_browser() as browser:
            one_run(browser, service.base_url)  # warm-up: Chromium start, server caches
            runs = [one_run(browser, service.base_url) for _ in range(options.runs)]
            idle, window, sweep, redraw, everything = pan_frames(browser, service.base_url)

    def med(key):
        return benchlib.median([run[key] for run in runs]) / 1000

    results.note(f"{runs[0]['pages']} timeline pages per load; the first carries "
                 f"{runs[0]['firstPageBytes']:,} bytes")
    results.add("first bar drawn (vs first timeline page received)", med("firstBar"), "s", med("firstPageEnd"))
    results.add("every timeline page received", med("allPages"), "s")
    idle_median = benchlib.median(idle["times"]) / 1000
    results.note("drawn = the items of the three windows the layer draws around the visible one; "
                 f"whole project summarised (dense layer): {everything['dense']}")
    whole = f"{everything['bars']:,} bars, {everything['arrows']:,} messages"
    results.add(f"redraw on 'Fit all' ({whole})", redraw / 1000, "s", idle_median)
    for label, sample in ((f"pan, default window ({window['bars']} bars, {window['arrows']} arrows drawn)", window),
                          ("sweep 3 windows into the past (redraws on the way)", sweep),
                          (f"pan, whole project ({whole})", everything)):
        results.add(f"frame median, {label}", benchlib.median(sample["times"]) / 1000, "s", idle_median)
        results.add(f"frame p95, {label}", benchlib.percentile(sample["times"], 0.95) / 1000, "s", idle_median)
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
