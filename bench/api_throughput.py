"""HTTP API throughput: messages/s posted by 8 concurrent HTTP clients through `POST …/messages` (each
request answers after a tick that saw its message) against the same inserts made directly through the
store in one process, and against a bare app on the same Waitress settings and threads that inserts one
row per POST into a WAL SQLite file with the store's synchronous setting (ratio, target >= 0.6; medians
of alternating rounds); and the median and p99 latency of
`GET /api/projects` while 40 SSE clients are connected, against the same with no stream open.
Usage: .venv/bin/python bench/api_throughput.py [--messages 2000] [--clients 8] [--streams 40] [--json]"""
import argparse
import concurrent.futures
import http.client
import json
import multiprocessing
import socket
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import benchlib
from api_fixtures import init_project, project_yaml, serving
from store_fixtures import config_of

import suzumio_api
import suzumio_coordination as coordination


def post_messages(port, count):
    """One keep-alive client posting `count` messages; returns the number answered 200."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ok = 0
    headers = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json"}
    for index in range(count):
        connection.request("POST", "/api/projects/bench/messages",
                           body=f'{{"recipient": "worker", "body": "bench {index}"}}', headers=headers)
        response = connection.getresponse()
        response.read()
        ok += response.status == 200
    connection.close()
    return ok


def client_process(port, per_client, clients):
    """All HTTP clients as threads of one separate process, so they never hold the server's GIL."""
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        started = time.perf_counter()
        answered = sum(pool.map(lambda _: post_messages(port, per_client), range(clients)))
        return answered, time.perf_counter() - started


def http_rate(port, total, clients):
    per_client = total // clients
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        answered, elapsed = pool.submit(client_process, port, per_client, clients).result()
    if answered != per_client * clients:
        raise SystemExit(f"only {answered} of {per_client * clients} posts answered 200")
    return answered / elapsed


def direct_rate(store, total):
    started = time.perf_counter()
    for index in range(total):
        coordination.send_message(store, config_of(store), "user", f"direct {index}", recipient="worker")
    return total / (time.perf_counter() - started)


class BareInsertApp:
    """The stack Suzumio is built on with nothing of Suzumio: parse the JSON body, insert one row in one
    transaction on the thread's own connection (WAL, `synchronous` as the store sets it), answer JSON."""

    def __init__(self, db_path, synchronous):
        self.db_path = db_path
        self.synchronous = synchronous
        self.local = threading.local()
        conn = self.connection()
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, recipient TEXT, body TEXT)")

    def connection(self):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = sqlite3.connect(self.db_path, isolation_level=None, timeout=30,
                                                     check_same_thread=False)
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        return conn

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        fields = json.loads(environ["wsgi.input"].read(length))
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        row_id = conn.execute("INSERT INTO messages (recipient, body) VALUES (?, ?)",
                              (fields["recipient"], fields["body"])).lastrowid
        conn.execute("COMMIT")
        body = json.dumps({"id": row_id, "recipient": fields["recipient"], "body": fields["body"]}).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def store_synchronous(store):
    """The store's own `PRAGMA synchronous` (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA), read from its connection."""
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    with store.snapshot() as conn:
        return names[conn.execute("PRAGMA synchronous").fetchone()[0]]


def open_stream(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"GET /api/projects/bench/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    first = sock.recv(4096)
    if not first.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"stream refused: {first[:80]!r}")
    threading.Thread(target=drain, args=(sock,), daemon=True).start()
    return sock


def drain(sock):
    """Keep reading so the server's writes never block on a full socket buffer; ends when closed."""
    try:
        while sock.recv(65536):
            pass
    except OSError:
        return


def listing_p99(port, requests):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        connection.request("GET", "/api/projects", headers={"Host": f"127.0.0.1:{port}"})
        response = connection.getresponse()
        response.read()
        samples.append(time.perf_counter() - started)
        if response.status != 200:
            raise SystemExit(f"GET /api/projects answered {response.status}")
    connection.close()
    samples.sort()
    return samples[int(len(samples) * 0.99) - 1], statistics.median(samples)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="alternating HTTP/direct rounds; medians reported")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("api_throughput")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        with serving(scratch / "root", threads=max(32, options.streams + 16), api_token=None) as service:
            store = init_project(service.root, scratch / "bench", project_yaml("bench", service.base_url))
            direct_store = init_project(service.root, scratch / "direct", project_yaml("direct", service.base_url))
            threads = service.server.server.adj.threads
            bare = suzumio_api.Server(BareInsertApp(str(scratch / "bare.db"), store_synchronous(store)),
                                      threads=threads, name="bench-bare").start()
            over_http, direct, over_bare = [], [], []
            commits_before = store.commits
            try:
                for _ in range(options.rounds):
                    over_http.append(http_rate(service.port, options.messages, options.clients))
                    over_bare.append(http_rate(bare.port, options.messages, options.clients))
                    direct.append(direct_rate(direct_store, options.messages))
            finally:
                bare.close()
            results.add(f"POST …/messages, {options.clients} HTTP clients (vs bare Waitress + SQLite insert)",
                        benchlib.median(over_http), "/s", benchlib.median(over_bare), target=0.6,
                        higher_is_better=True)
            results.add(f"POST …/messages, {options.clients} HTTP clients (vs store, 1 thread)",
                        benchlib.median(over_http), "/s", benchlib.median(direct), target=0.3,
                        higher_is_better=True)
            posted = options.rounds * (options.messages // options.clients * options.clients)
            # The route's own commits (its message, and its tick's writes: none on this stopped project).
            results.add("POST …/messages: commits per message", (store.commits - commits_before) / posted, "count")
            streams = []
            try:
                quiet_p99, quiet_median = listing_p99(service.port, options.requests)
                streams = [open_stream(service.port) for _ in range(options.streams)]
                p99, median = listing_p99(service.port, options.requests)
                results.add(f"GET /api/projects median, {options.streams} SSE clients (vs none)", median, "s",
                            quiet_median)
                results.add(f"GET /api/projects p99, {options.streams} SSE clients (vs none)", p99, "s",
                            quiet_p99)
            finally:
                for sock in streams:
                    sock.shutdown(socket.SHUT_RDWR)
                    sock.close()
            expected = options.rounds * (options.messages // options.clients * options.clients)
            if store.project_stats()["messageCount"] != expected:
                raise SystemExit(f"{store.project_stats()['messageCount']} messages stored, {expected} expected")
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
