"""Soak (issue 20): one `suzumio serve` runs rounds of demo teams (examples/demo.yaml, local backend,
scripted provider) for a while, a few teams at once, while clients browse the project list. Prints the
controller's descriptors, threads and resident memory after a warm-up that fills the open-project cap
and at the end, and
fails when any activation failed, a team did not submit, or the figures grew past the allowance.
Usage: .venv/bin/python bench/soak_teams.py [--minutes 20] [--teams 4] [--json]"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import benchlib
from load_fixtures import ServeProcess, browse, init_demo_teams, kick_off

from suzumio_store import MAX_OPEN_PROJECTS

ROUND_TIMEOUT_S = 300.0


def figures(serve):
    return {"descriptors": serve.descriptors(), "threads": serve.threads(), "rss_kib": serve.rss_kib()}


def run_round(serve, root, names):
    init_demo_teams(root, names, serve.port)
    for name in names:
        kick_off(serve, name)
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    pending = set(names)
    while pending and time.monotonic() < deadline:
        browse(serve, 2, 2)
        for name in list(pending):
            _status, body = serve.request("GET", f"/api/projects/{name}")
            project = json.loads(body)
            if project["status"] == "submitted":
                pending.discard(name)
                if project["stats"]["failedActivationCount"]:
                    raise SystemExit(f"{name}: {project['stats']['failedActivationCount']} failed activations")
        time.sleep(0.2)
    if pending:
        raise SystemExit(f"teams did not submit within {ROUND_TIMEOUT_S:.0f} s: {sorted(pending)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--teams", type=int, default=4, help="teams per round, run at once")
    parser.add_argument("--warmup-projects", type=int, default=2 * MAX_OPEN_PROJECTS,
                        help="projects run before the first figures are taken")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = benchlib.Results("soak_teams")
    with tempfile.TemporaryDirectory(prefix="suzumio-soak-") as folder:
        root = Path(folder) / "root"
        root.mkdir()
        serve = ServeProcess(root, Path(folder) / "serve.log").start()
        try:
            # Warm-up: until the open-project cap is full, more projects rightly hold more connections and
            # page caches; from then on every figure must stay flat however many projects follow.
            rounds = 0
            while rounds * args.teams < args.warmup_projects:
                run_round(serve, root, [f"r{rounds:03d}-{i}" for i in range(args.teams)])
                rounds += 1
            first = figures(serve)
            warm_rounds = rounds
            ends = time.monotonic() + args.minutes * 60
            while time.monotonic() < ends:
                run_round(serve, root, [f"r{rounds:03d}-{i}" for i in range(args.teams)])
                rounds += 1
                if rounds % 25 == 0:
                    now = figures(serve)
                    results.note(f"after round {rounds} ({rounds * args.teams} projects): {now['descriptors']} "
                                 f"descriptors, {now['threads']} threads, {now['rss_kib'] / 1024:.1f} MiB")
            last = figures(serve)
        finally:
            serve.stop()
    results.note(f"{rounds} rounds of {args.teams} teams ({rounds * args.teams} teams, all submitted, "
                 f"no failed activation); {rounds - warm_rounds} rounds in the {args.minutes:g} min after the "
                 f"warm-up of {warm_rounds * args.teams} projects")
    results.add("descriptors: end against after warm-up", last["descriptors"], "count", first["descriptors"])
    results.add("threads: end against after warm-up", last["threads"], "count", first["threads"])
    results.add("resident memory: end against after warm-up", last["rss_kib"] / 1024, "MiB", first["rss_kib"] / 1024)
    code = results.emit(args.json)
    # Flat: descriptors bounded by the open-project cap, threads back to the pool, memory within 1.25x.
    grew = (last["descriptors"] > max(first["descriptors"] * 2, 600) or last["threads"] > first["threads"] + 8
            or last["rss_kib"] > first["rss_kib"] * 1.25)
    return 1 if grew else code


if __name__ == "__main__":
    sys.exit(main())
