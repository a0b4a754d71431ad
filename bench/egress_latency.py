"""Egress proxy overhead: the median time of one HTTP GET on a fresh connection (as a shell command's
curl makes it) to a real upstream server on this machine's loopback, made directly and made the way an
activation makes it: to the runner's loopback forwarder, over the egress Unix socket to the
controller's egress proxy (preamble and token check, allowlist, resolution, one audit event per
connection in the project's SQLite file), then to the upstream. Both kinds of request alternate in one
run, side by side; plain HTTP (absolute URI) and CONNECT tunnels are measured, for a small body and for
1 MB. Usage: .venv/bin/python bench/egress_latency.py [--runs 300] [--json]"""
import argparse
import http.client
import http.server
import tempfile
import threading
import time
from pathlib import Path

import benchlib
from conftest import wait_until

import suzumio_config
import suzumio_coordination as coordination
import suzumio_egress
import suzumio_store
from suzumio_runner_egress import Forwarder, preamble

SMALL = b"ok\n"
LARGE = b"x" * 1_000_000


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = LARGE if self.path == "/large" else SMALL
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def get(host, port, target, tunnel=None):
    """One GET on a new connection; returns the body length (checked by the caller)."""
    connection = http.client.HTTPConnection(host, port, timeout=30)
    if tunnel is not None:
        connection.set_tunnel(*tunnel)
    try:
        connection.request("GET", target)
        return len(connection.getresponse().read())
    finally:
        connection.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = benchlib.Results("egress_latency")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=upstream.serve_forever, name="bench-upstream", daemon=True).start()
    port = upstream.server_address[1]
    with tempfile.TemporaryDirectory(prefix="suzumio-egress-bench-") as tmp:
        root = suzumio_store.Root(Path(tmp) / "root")
        text = benchlib.project_text("bench", ["pm"]).replace(
            "  pm: {tools: [messages.send]}", "  pm: {tools: [messages.send], egress: ['127.0.0.1']}")
        store = benchlib.init_project(root, Path(tmp) / "config", text)
        activation = coordination.start_activation(store, "pm", "Measure.", [])
        token = store.agent("pm", include_token=True)["token"]
        proxy = suzumio_egress.EgressProxy(root, suzumio_config.ConfigCache())
        proxy.listen_unix(Path(tmp) / suzumio_egress.EGRESS_SOCKET).start()
        forwarder = Forwarder(f"unix://{tmp}/{suzumio_egress.EGRESS_SOCKET}",
                              preamble("bench", activation["id"], token)).start()
        try:
            for label, path, size, runs in (("small body", "/small", len(SMALL), args.runs),
                                            ("1 MB body", "/large", len(LARGE), max(20, args.runs // 10))):
                direct, plain, tunnel = [], [], []
                url = f"http://127.0.0.1:{port}{path}"
                for _ in range(runs):
                    direct.append(timed_get(size, "127.0.0.1", port, path))
                    plain.append(timed_get(size, "127.0.0.1", forwarder.port, url))
                    tunnel.append(timed_get(size, "127.0.0.1", forwarder.port, path, ("127.0.0.1", port)))
                base = benchlib.median(direct)
                results.add(f"GET {label}, direct", base, "s")
                results.add(f"GET {label}, through the egress proxy (plain HTTP)", benchlib.median(plain), "s", base)
                results.add(f"GET {label}, through the egress proxy (CONNECT)", benchlib.median(tunnel), "s", base)
                results.add(f"GET {label}, added per request (plain HTTP)", benchlib.median(plain) - base, "s")
            # Each connection's audit event is written after it closes: wait for the last ones.
            expected = 2 * (args.runs + max(20, args.runs // 10))  # the proxied ones
            wait_until(lambda: store.egress_totals().get("pm", {}).get("connections", 0) >= expected, 30,
                       message="the audit events")
            results.note(f"{expected} connections, {expected} egress.allowed events")
        finally:
            forwarder.stop()
            proxy.close()
            root.close()
            upstream.shutdown()
    return results.emit(args.json)


def timed_get(expected, *where):
    """Seconds of one `get(*where)`, whose body must be `expected` bytes long."""
    started = time.perf_counter()
    length = get(*where)
    elapsed = time.perf_counter() - started
    if length != expected:
        raise SystemExit(f"short body: {length} of {expected} bytes")
    return elapsed


if __name__ == "__main__":
    raise SystemExit(main())
