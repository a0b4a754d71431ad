"""Scheduler tick cost: one pass of `Scheduler.tick_all` over 50 running projects of 10 agents each, idle
(every agent quiet, nothing pending) and busy (every agent running an activation, one P3 signal pending
for each), against a bare baseline: one plain SQLite read per project of the rows a tick looks at
(project, agents, pending signals, running activations), on connections kept open.
Then the scheduler as `serve` runs it (event-driven): its thread's CPU time over `--window`
seconds of an idle root (one full pass, the safety net, and whatever the thread does while waiting),
against the CPU time of the plain reads a poller would need over the same window (one bare pass every
2 s, the old tick interval). Target <= 2x.
The idle pass alternates with the bare pass (target <= 2x).
Usage: .venv/bin/python bench/scheduler_tick.py [--projects 50] [--agents 10] [--passes 15] [--window 30] [--json]"""
import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

import benchlib
from store_fixtures import config_of

import suzumio_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_scheduler
import suzumio_store
import suzumio_toolpacks

BARE_QUERIES = (
    "SELECT * FROM projects WHERE id = ?",
    "SELECT * FROM agents WHERE project = ? ORDER BY id",
    "SELECT * FROM signals WHERE project = ? AND status = 'pending' ORDER BY priority, created_at",
    "SELECT * FROM activations WHERE project = ? AND status = 'running'",
)


def bare_pass(connections):
    for name, conn in connections:
        for sql in BARE_QUERIES:
            conn.execute(sql, (name,)).fetchall()


POLL_SECONDS = 2.0  # the fixed tick interval of a scheduler that polls


def idle_thread_cpu(scheduler, window):
    """CPU seconds of the scheduler thread over `window` seconds from its start on an idle root."""
    scheduler.start()
    clock = time.pthread_getcpuclockid(scheduler._thread.ident)
    began = time.clock_gettime(clock)
    threading.Event().wait(window)
    spent = time.clock_gettime(clock) - began
    scheduler.stop()
    return spent


def thread_cpu_samples(function, repeat):
    """CPU seconds of this thread per call (CPU time, like idle_thread_cpu: on a shared machine wall
    time would count the waits for a core as cost)."""
    function()
    samples = []
    for _ in range(repeat):
        began = time.thread_time()
        function()
        samples.append(time.thread_time() - began)
    return samples


def make_busy(store):
    for agent_id in store.agent_ids():
        coordination.start_activation(store, agent_id, "Work.", [])
        coordination.send_message(store, config_of(store), "user", "Keep going.", recipient=agent_id)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projects", type=int, default=50)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--window", type=float, default=suzumio_scheduler.SAFETY_INTERVAL_SECONDS - 0.5)
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("scheduler_tick")
    agent_ids = [f"a{index}" for index in range(options.agents)]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        root = suzumio_store.Root(scratch / "root")
        names = [f"p{index:02d}" for index in range(options.projects)]
        for name in names:
            benchlib.init_project(root, scratch / "src" / name, benchlib.project_text(name, agent_ids))
        backends = suzumio_backend.Backends()
        toolpacks = suzumio_toolpacks.ToolpackRuntime(suzumio_config.ConfigCache())
        scheduler = suzumio_scheduler.Scheduler(root, backends, toolpacks.configs, hooks=toolpacks)
        connections = [(name, sqlite3.connect(root.path / name / suzumio_store.DB_FILE)) for name in names]
        try:
            label = f"{options.projects} projects x {options.agents} agents"
            idle, bare = benchlib.timed_pair(scheduler.tick_all, lambda: bare_pass(connections), options.passes)
            results.add(f"tick_all, idle ({label})", benchlib.median(idle), "s", benchlib.median(bare), target=2.0)
            # The same pass when every project's database changed since its last tick (a write by another
            # connection before each pass, untimed): the tick reads its rows again instead of reusing them.
            changed, bare = [], []
            for _ in range(options.passes):
                for name, conn in connections:
                    # A no-op update commits nothing: write a changed value.
                    conn.execute("UPDATE projects SET updated_at = strftime('%Y-%m-%dT%H:%M:%f', 'now') "
                                 "WHERE id = ?", (name,))
                    conn.commit()
                changed += benchlib.timed(scheduler.tick_all, 1, warmup=0)
                bare += benchlib.timed(lambda: bare_pass(connections), 1, warmup=0)
            results.add(f"tick_all, idle, every database changed ({label})", benchlib.median(changed), "s",
                        benchlib.median(bare))
            # Its own Scheduler (a stopped one's tick_all returns at once) with the same parsed configs, as
            # a long-running serve has them: the window holds one full pass (at start) and the waits.
            thread_scheduler = suzumio_scheduler.Scheduler(root, backends, hooks=toolpacks, configs=scheduler._configs)
            spent = idle_thread_cpu(thread_scheduler, options.window)
            bare_cpu = benchlib.median(thread_cpu_samples(lambda: bare_pass(connections), options.passes))
            results.add(f"scheduler thread CPU, idle {options.window:.0f} s (vs 2 s polls)", spent, "s",
                        bare_cpu * options.window / POLL_SECONDS, target=2.0)
            for name in names:
                make_busy(root.open_project(name))
            bare = benchlib.median(benchlib.timed(lambda: bare_pass(connections), options.passes))
            busy = benchlib.median(benchlib.timed(scheduler.tick_all, options.passes))
            results.add(f"tick_all, busy ({label})", busy, "s", bare)
            results.add("one project's tick, busy", busy / options.projects, "s", bare / options.projects)
            running = sum(len(root.open_project(name).running_activations()) for name in names)
            if running != options.projects * options.agents:
                raise SystemExit(f"the busy pass changed state: {running} activations still running")
        finally:
            for _name, conn in connections:
                conn.close()
            toolpacks.close()
            backends.close()
            root.close()
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
