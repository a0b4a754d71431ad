"""The price of durable commits: messages/s through `suzumio_coordination.send_message` (one transaction
each) with the store's `synchronous = FULL` (every COMMIT syncs the WAL: a committed message survives a
power cut) against the same store switched to `synchronous = NORMAL` (survives a crash of the process
only), and report submissions/s (a staged file fsynced with its directory, then the rename synced)
against the same transaction writing its file without any fsync. Alternating rounds in one run, on the
machine's own disk (a temporary folder: set TMPDIR to measure another).
Usage: .venv/bin/python bench/durable_commits.py [--messages 500] [--reports 100] [--rounds 3] [--json]"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from store_fixtures import config_of

import suzumio_coordination as coordination
import suzumio_store


def message_rate(store, count, synchronous):
    store._writer.execute(f"PRAGMA synchronous = {synchronous}")
    started = time.perf_counter()
    for index in range(count):
        coordination.send_message(store, config_of(store), "user", f"durable {index}", recipient="a0")
    return count / (time.perf_counter() - started)


def report_rate(store, count, synced):
    """Submissions of the final report; unsynced: the staged file and its rename without fsync."""
    store._writer.execute("PRAGMA synchronous = FULL")
    saved = suzumio_store.fsync_dir, os.fsync
    if not synced:
        suzumio_store.fsync_dir = lambda path: None
        suzumio_store.os.fsync = lambda fd: None
    try:
        started = time.perf_counter()
        for index in range(count):
            coordination.submit_report(store, "a0", None, f"# Report {index}\n")
        return count / (time.perf_counter() - started)
    finally:
        suzumio_store.fsync_dir, suzumio_store.os.fsync = saved


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=500)
    parser.add_argument("--reports", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians reported")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("durable_commits")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        root = suzumio_store.Root(scratch / "root")
        try:
            store = benchlib.init_project(root, scratch / "src", benchlib.project_text("durable", ["a0", "a1"]))
            full, normal, synced, unsynced = [], [], [], []
            for _ in range(options.rounds):
                full.append(message_rate(store, options.messages, "FULL"))
                normal.append(message_rate(store, options.messages, "NORMAL"))
                synced.append(report_rate(store, options.reports, True))
                unsynced.append(report_rate(store, options.reports, False))
            results.add("send_message, synchronous FULL vs NORMAL", benchlib.median(full), "/s",
                        benchlib.median(normal), higher_is_better=True)
            results.add("submit_report, staged file synced vs not", benchlib.median(synced), "/s",
                        benchlib.median(unsynced), higher_is_better=True)
        finally:
            root.close()
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
