"""Store-level message ingest: messages/s through `suzumio_coordination.send_message` for a direct message (one
message, one signal, two events) and a channel message fanned out to 10 agents (one message, 10
signals, 11 events), each against bare SQLite inserts of the same rows (same tables, same settings: WAL,
synchronous=FULL, one transaction per message) made on a plain connection in the same run.
Usage: .venv/bin/python bench/message_ingest.py [--messages 1500] [--agents 10] [--json]"""
import argparse
import json
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

import benchlib
from store_fixtures import config_of

import suzumio_coordination as coordination
import suzumio_store

TS = "2026-01-01T00:00:00.000Z"


def store_rate(store, count, **target):
    started = time.perf_counter()
    for index in range(count):
        coordination.send_message(store, config_of(store), "user", f"ingest {index}", **target)
    return count / (time.perf_counter() - started)


def bare_rate(db_path, project, count, targets, channel):
    """The rows send_message writes, inserted as plainly as SQLite allows, one transaction each."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("PRAGMA synchronous = FULL")
    started = time.perf_counter()
    for index in range(count):
        message_id = f"msg_bare_{uuid.uuid4().hex}"
        message = {"id": message_id, "project": project, "sender": "user", "body": f"bare {index}",
                   "priority": "P3", "createdAt": TS}
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO messages (id, project, sender, recipient, channel, priority, body, created_at) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                     (message_id, project, "user", None if channel else targets[0], channel, "P3",
                      message["body"], TS))
        conn.execute("INSERT INTO events (id, project, type, data_json, created_at) VALUES (?, ?, ?, ?, ?)",
                     (f"evt_{uuid.uuid4().hex}", project, "message.created", json.dumps(message), TS))
        for target in targets:
            conn.execute("INSERT INTO signals (id, project, kind, source_agent, source_activation, target_agent, "
                         "target_channel, priority, payload_json, status, useful_effect, created_at, not_before) "
                         "VALUES (?, ?, 'message', NULL, NULL, ?, ?, 'P3', ?, 'pending', 1, ?, ?)",
                         (f"sig_{uuid.uuid4().hex}", project, target, channel, json.dumps(message), TS, TS))
            conn.execute("INSERT INTO events (id, project, type, data_json, created_at) VALUES (?, ?, ?, ?, ?)",
                         (f"evt_{uuid.uuid4().hex}", project, "signal.created", json.dumps(message), TS))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return count / elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternating store/bare rounds; medians reported")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("message_ingest")
    agent_ids = [f"a{index}" for index in range(options.agents)]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        root = suzumio_store.Root(scratch / "root")
        try:
            store = benchlib.init_project(root, scratch / "src", benchlib.project_text("ingest", agent_ids))
            cases = [("direct message (1 signal)", {"recipient": agent_ids[0]}, [agent_ids[0]], None),
                     (f"channel message ({options.agents} signals)", {"channel": "#project"}, agent_ids, "#project")]
            for label, target, targets, channel in cases:
                through_store, bare = [], []
                for _ in range(options.rounds):
                    through_store.append(store_rate(store, options.messages, **target))
                    bare.append(bare_rate(store.db_path, "ingest", options.messages, targets, channel))
                results.add(f"send_message, {label}", benchlib.median(through_store), "/s",
                            benchlib.median(bare), higher_is_better=True)
        finally:
            root.close()
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
