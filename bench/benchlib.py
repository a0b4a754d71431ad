"""Shared parts of the benches under bench/: projects initialized through the real config pipeline,
repeated timing reduced to medians, and the result rows each bench prints (and, with --json, emits as
one `BENCH-JSON` line that bench/run_all.py collects). Imported only by the bench scripts."""
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for entry in (str(REPO), str(REPO / "tests")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import suzumio_config

JSON_PREFIX = "BENCH-JSON "

PROJECT_YAML = """\
name: {name}
task: Measure.
channels: ["#project"]
agents:
{agents}
scheduler:
  allQuietNudge: {{enabled: false}}
  failedNudge: {{enabled: false}}
backend:
  kind: {kind}
  image: {image}
  controllerUrl: "{controller_url}"
  docker: {{network: host}}
  runner:
    model: main
    models:
      providers:
        replay: {{type: scripted, script: {{agents: {{}}}}}}
      presets:
        main: {{provider: replay, model: m}}
"""


def project_text(name, agent_ids, *, kind="local", image="suzumio-runner:dev",
                 controller_url="http://127.0.0.1:9", tools="[messages.send]"):
    """A project with the given agents, the scripted provider and the nudges that create work off."""
    agents = "\n".join(f"  {agent_id}: {{tools: {tools}}}" for agent_id in agent_ids)
    return PROJECT_YAML.format(name=name, agents=agents, kind=kind, image=image, controller_url=controller_url)


def init_project(root, directory, text, start=True):
    """Write `text` under `directory`, initialize it as `suzumio init` does and (by default) start it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "project.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    loaded = suzumio_config.load_project(path, env={})
    store = root.init_project(
        name=loaded.data["name"], task=loaded.data["task"], config=loaded.data, agents=loaded.agents,
        source_text=loaded.source_text, resolved_text=loaded.render(), config_path=loaded.path)
    if start:
        store.start()
    return store


def timed(function, repeat, warmup=1):
    """Seconds per call of `function()`, one sample per call, after `warmup` untimed calls."""
    for _ in range(warmup):
        function()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        samples.append(time.perf_counter() - started)
    return samples


def timed_pair(figure, baseline, repeat, warmup=1):
    """Seconds per call of `figure()` and of `baseline()`, their calls alternating, so that both suffer
    the same load on a shared machine; two lists of samples."""
    for _ in range(warmup):
        figure()
        baseline()
    figures, baselines = [], []
    for _ in range(repeat):
        for function, samples in ((figure, figures), (baseline, baselines)):
            started = time.perf_counter()
            function()
            samples.append(time.perf_counter() - started)
    return figures, baselines


def median(samples):
    return statistics.median(samples)


def percentile(samples, fraction):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


class Results:
    """Rows of (measure, value, unit, baseline, ratio, target) printed as they come."""

    def __init__(self, bench):
        self.bench = bench
        self.rows = []

    def add(self, measure, value, unit, baseline=None, *, target=None, higher_is_better=False):
        """One figure; with a baseline also the ratio value/baseline and, with a target, a verdict."""
        ratio = value / baseline if baseline else None
        verdict = None
        if ratio is not None and target is not None:
            verdict = "ok" if (ratio >= target if higher_is_better else ratio <= target) else "MISSED"
        row = {"bench": self.bench, "measure": measure, "value": value, "unit": unit, "baseline": baseline,
               "ratio": ratio, "target": target, "higherIsBetter": higher_is_better, "verdict": verdict}
        self.rows.append(row)
        line = f"{measure:58s} {format_value(value, unit):>14s}"
        if baseline is not None:
            line += f"   baseline {format_value(baseline, unit):>12s}   ratio {ratio:6.2f}x"
        if target is not None:
            line += f"  (target {'>=' if higher_is_better else '<='} {target}x: {verdict})"
        print(line, flush=True)
        return row

    def note(self, text):
        print(text, flush=True)

    def emit(self, as_json):
        if as_json:
            print(JSON_PREFIX + json.dumps(self.rows), flush=True)
        missed = [row for row in self.rows if row["verdict"] == "MISSED"]
        return 1 if missed else 0


def format_value(value, unit):
    if unit == "s":
        return f"{value * 1000:.2f} ms"
    if unit == "/s":
        return f"{value:,.0f}/s"
    return f"{value:.2f} {unit}"
