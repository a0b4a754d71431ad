"""The controller under load, two parts measured in one run:
1. N demo teams (examples/demo.yaml: local backend, scripted provider) kicked off at once on one
   `suzumio serve`: wall time per team against one team alone, failed activations (target 0),
   `GET /api/projects` median/p95 while loaded (target p95 < 300 ms), peak descriptors and threads.
2. A root of M idle projects browsed by C clients: answers, latency, peak descriptors (target < 600).
Usage: .venv/bin/python bench/controller_load.py [--teams 50] [--idle 500] [--clients 32] [--json]"""
import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import benchlib
from load_fixtures import Sampler, ServeProcess, browse, init_demo_teams, init_idle_projects, kick_off


def run_teams(folder, names, timeout, browse_clients=4):
    """Kick off every team at once; returns (seconds per team, failed activations, project-list
    latencies while loaded, sampler)."""
    root = Path(folder) / "root"
    root.mkdir(parents=True)
    serve = ServeProcess(root, Path(folder) / "serve.log")
    init_demo_teams(root, names, serve.port)
    serve.start()
    sampler = Sampler(serve)
    try:
        started = {}
        for name in names:
            started[name] = time.perf_counter()
            kick_off(serve, name)
        finished, latencies = {}, []
        done = threading.Event()

        def browser():  # a control room open during the run
            while not done.is_set():
                latencies.extend(browse(serve, browse_clients, 5, sampler=sampler)[1])

        thread = threading.Thread(target=browser)
        thread.start()
        deadline = time.monotonic() + timeout
        try:
            while len(finished) < len(names) and time.monotonic() < deadline:
                _status, body = serve.request("GET", "/api/projects")
                for project in json.loads(body):
                    if project["status"] == "submitted" and project["id"] not in finished:
                        finished[project["id"]] = time.perf_counter() - started[project["id"]]
                sampler.sample()
                time.sleep(0.1)
        finally:
            done.set()
            thread.join()
        if len(finished) < len(names):
            raise SystemExit(f"only {len(finished)} of {len(names)} teams submitted within {timeout:.0f} s; "
                             f"see {serve.log_path}")
        _status, body = serve.request("GET", "/api/projects")
        failed = sum(project["stats"]["failedActivationCount"] for project in json.loads(body))
        return finished, failed, latencies, sampler
    finally:
        serve.stop()


def run_idle(folder, count, clients, requests_each):
    root = Path(folder) / "root"
    root.mkdir(parents=True)
    init_idle_projects(root, count)
    serve = ServeProcess(root, Path(folder) / "serve.log").start(timeout=120)
    try:
        idle = serve.descriptors()
        sampler = Sampler(serve)
        # One client first: the cold list (every summary computed), then the same list from the cache.
        _statuses, cold = browse(serve, 1, 1)
        _statuses, alone = browse(serve, 1, 5)
        statuses, latencies = browse(serve, clients, requests_each, sampler=sampler)
        healthy = serve.healthy()
        return idle, statuses, latencies, sampler, healthy, cold[0], benchlib.median(alone)
    finally:
        serve.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=10, help="project-list requests per idle-root client")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = benchlib.Results("controller_load")

    with tempfile.TemporaryDirectory(prefix="suzumio-load-") as folder:
        one, failed_one, _lat, _s = run_teams(Path(folder) / "one", ["team-000"], args.timeout)
    alone = one["team-000"]
    results.add("one demo team alone: kick-off to submitted", alone, "s")

    names = [f"team-{index:03d}" for index in range(args.teams)]
    with tempfile.TemporaryDirectory(prefix="suzumio-load-") as folder:
        per_team, failed, latencies, sampler = run_teams(Path(folder) / "many", names, args.timeout)
    times = sorted(per_team.values())
    results.add(f"{args.teams} teams at once: median time per team", benchlib.median(times), "s", alone)
    results.add(f"{args.teams} teams at once: slowest team", times[-1], "s", alone)
    results.add(f"{args.teams} teams: failed activations (target 0)", failed + failed_one, "count")
    results.add("GET /api/projects while loaded: median", benchlib.median(latencies), "s")
    p95 = benchlib.percentile(latencies, 0.95)
    results.add("GET /api/projects while loaded: p95 (target < 300 ms)", p95, "s", 0.3, target=1.0)
    results.add("peak descriptors while loaded", sampler.peak_descriptors, "count")
    results.add("peak threads while loaded", sampler.peak_threads, "count")

    with tempfile.TemporaryDirectory(prefix="suzumio-load-") as folder:
        idle, statuses, latencies, sampler, healthy, cold, alone = run_idle(Path(folder), args.idle, args.clients,
                                                                            args.requests)
    ok = sum(status == 200 for status in statuses)
    results.add(f"{args.idle} idle projects: answered 200 of {len(statuses)}", ok, "count")
    results.add(f"{args.idle} idle projects: first list after start (cold), one client", cold, "s")
    results.add(f"{args.idle} idle projects: list, one client", alone, "s")
    results.add(f"{args.idle} idle projects, {args.clients} clients: list median", benchlib.median(latencies), "s",
                alone)
    results.add(f"{args.idle} idle projects, {args.clients} clients: list p95",
                benchlib.percentile(latencies, 0.95), "s")
    results.add("descriptors at start (idle root)", idle, "count")
    results.add("peak descriptors while browsed (target < 600)", sampler.peak_descriptors, "count", 600, target=1.0)
    results.add("peak threads while browsed", sampler.peak_threads, "count")
    results.note(f"health after browsing: {'ok' if healthy else 'NOT ANSWERING'}")
    code = results.emit(args.json)
    if failed or ok != len(statuses) or not healthy:
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
