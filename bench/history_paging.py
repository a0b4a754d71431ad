"""History paging at 100,000 rows: one agent's history (60% archived behind compactions, one part per
row), paged 100 at a time through `ProjectStore.history_page` and through
`GET /api/projects/<p>/agents/<a>/history` — first page, a deep page via `before`, and
`includeArchived=0` — each against the bare indexed SQLite queries that fetch the same rows and parts,
and the GET of the first and the deep page against the store call alternating with it (target <= 3x).
Then the project summary (`GET /api/projects/<p>` and `project_summary`) against its own SQL statements
(recorded with a trace callback) run on a plain connection, alternating (target <= 3x).
Usage: .venv/bin/python bench/history_paging.py [--rows 100000] [--repeat 40] [--json]"""
import argparse
import http.client
import json
import sqlite3
import sys
import tempfile
from pathlib import Path

import benchlib
from api_fixtures import serving

PAGE = 100
TS = "2026-01-01T00:00:00.000Z"
BARE_ROWS = ("SELECT * FROM agent_history_messages WHERE project = ? AND agent_id = ?{extra} "
             "ORDER BY sequence DESC LIMIT ?")
BARE_PARTS = ("SELECT * FROM agent_history_parts WHERE project = ? AND message_id IN ({marks}) "
              "ORDER BY part_index")


def seed(db_path, project, agent_id, rows, archived_fraction=0.6):
    """Rows in the store's own shape, written in one transaction (the store would take minutes)."""
    archived_until = int(rows * archived_fraction)
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    for sequence in range(1, rows + 1):
        message_id = f"hist_{sequence:08d}"
        role = ("user", "assistant", "tool_result")[sequence % 3]
        content = f"row {sequence}: " + "lorem ipsum " * 20
        compaction = "cmp_bench" if sequence <= archived_until else None
        conn.execute("INSERT INTO agent_history_messages (id, project, agent_id, activation_id, role, kind, "
                     "content, sequence, metadata_json, compaction_id, created_at) "
                     "VALUES (?, ?, ?, NULL, ?, 'bench', ?, ?, '{}', ?, ?)",
                     (message_id, project, agent_id, role, content, sequence, compaction, TS))
        conn.execute("INSERT INTO agent_history_parts (id, project, agent_id, message_id, activation_id, "
                     "part_index, type, text, metadata_json, created_at) VALUES (?, ?, ?, ?, NULL, 0, 'text', ?, "
                     "'{}', ?)", (f"hpart_{sequence:08d}", project, agent_id, message_id, content, TS))
    conn.execute("COMMIT")
    conn.close()


def bare_page(conn, project, agent_id, before=None, include_archived=True):
    extra, params = "", [project, agent_id]
    if before is not None:
        extra += " AND sequence < ?"
        params.append(before)
    if not include_archived:
        extra += " AND compaction_id IS NULL"
    rows = conn.execute(BARE_ROWS.format(extra=extra), params + [PAGE]).fetchall()
    ids = [row[0] for row in rows]
    parts = conn.execute(BARE_PARTS.format(marks=",".join("?" * len(ids))), [project, *ids]).fetchall()
    return rows, parts


def http_get(connection, port, path):
    """The answer's body, read whole: the client's own JSON parsing is not the server's cost."""
    connection.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"GET {path} answered {response.status}: {body[:200]!r}")
    return body


def summary_statements(store):
    """The SQL statements project_summary(full=True) runs, with their values inlined."""
    statements = []
    with store.snapshot() as conn:
        conn.set_trace_callback(statements.append)
        try:
            store.project_summary(full=True)
        finally:
            conn.set_trace_callback(None)
    return statements


def bare_statements(conn, statements):
    for sql in statements:
        conn.execute(sql).fetchall()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("history_paging")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        with serving(scratch / "root", api_token=None) as service:
            store = benchlib.init_project(service.root, scratch / "src", benchlib.project_text("hist", ["worker"]),
                                          start=False)
            seed(store.db_path, "hist", "worker", options.rows)
            deep = options.rows // 2
            cases = [("first page", {}, ""),
                     (f"deep page (before={deep})", {"before": deep}, f"&before={deep}"),
                     ("includeArchived=0", {"include_archived": False}, "&includeArchived=0")]
            bare_conn = sqlite3.connect(store.db_path)
            http_conn = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
            try:
                for label, kwargs, query in cases:
                    path = f"/api/projects/hist/agents/worker/history?limit={PAGE}{query}"
                    page = json.loads(http_get(http_conn, service.port, path))
                    rows, parts = bare_page(bare_conn, "hist", "worker", **kwargs)
                    if [m["sequence"] for m in page["messages"]] != [r[7] for r in rows] or len(parts) != len(rows):
                        raise SystemExit(f"{label}: the store and the bare query disagree")
                    bare = benchlib.median(benchlib.timed(
                        lambda kwargs=kwargs: bare_page(bare_conn, "hist", "worker", **kwargs), options.repeat))
                    through_store = benchlib.median(benchlib.timed(
                        lambda kwargs=kwargs: store.history_page("worker", limit=PAGE, **kwargs), options.repeat))
                    over_http = benchlib.median(benchlib.timed(
                        lambda path=path: http_get(http_conn, service.port, path), options.repeat))
                    results.add(f"history_page, {label} ({options.rows:,} rows)", through_store, "s", bare)
                    results.add(f"GET …/history, {label}", over_http, "s", bare)
                    if "includeArchived" not in query:
                        over_http, through_store = benchlib.timed_pair(
                            lambda path=path: http_get(http_conn, service.port, path),
                            lambda kwargs=kwargs: store.history_page("worker", limit=PAGE, **kwargs), options.repeat)
                        results.add(f"GET …/history, {label} (vs history_page)", benchlib.median(over_http), "s",
                                    benchlib.median(through_store), target=3.0)
                statements = summary_statements(store)
                summary_path = "/api/projects/hist"
                over_http, bare = benchlib.timed_pair(lambda: http_get(http_conn, service.port, summary_path),
                                                      lambda: bare_statements(bare_conn, statements), options.repeat)
                results.add(f"GET /api/projects/<p> (vs its {len(statements)} statements)", benchlib.median(over_http),
                            "s", benchlib.median(bare), target=3.0)
                through_store, bare = benchlib.timed_pair(lambda: store.project_summary(full=True),
                                                          lambda: bare_statements(bare_conn, statements),
                                                          options.repeat)
                results.add("project_summary (vs its statements)", benchlib.median(through_store), "s",
                            benchlib.median(bare))
            finally:
                http_conn.close()
                bare_conn.close()
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
