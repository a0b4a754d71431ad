"""Egress proxy cost of a credentialed host: the median time of one HTTPS GET on a fresh connection (as a
sandboxed curl makes it: the runner's loopback forwarder, the egress Unix socket, the controller's egress
proxy) to a real HTTPS server on this machine's loopback, through a plain tunnel (TLS end to end, the
server's own certificate) and through a host whose egress entry carries a bearer credential (the proxy
ends the client's TLS with the project's CA, adds the header, opens its own TLS to the server verified
against the server's CA, relays the answer with echoes masked, audits the request). Both alternate in one
run, side by side. Usage: .venv/bin/python bench/egress_credentials.py [--runs 200] [--json]"""
import argparse
import http.server
import ipaddress
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import benchlib

import suzumio_config
import suzumio_coordination as coordination
import suzumio_egress
import suzumio_egress_tls
import suzumio_store
from suzumio_runner_egress import Forwarder, preamble

TOKEN = "bench-token-0123456789"
BODY = b"ok\n"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        status = 200 if self.path == "/plain" or self.headers.get("Authorization") == f"Bearer {TOKEN}" else 401
        self.send_response(status)
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def service_certificate(folder):
    """A CA of the bench's own and a certificate for bench.test and plain.test."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=bench CA", "-keyout", str(folder / "ca-key.pem"), "-out", str(folder / "ca.pem"),
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    (folder / "ext").write_text("subjectAltName=DNS:bench.test,DNS:plain.test\n", encoding="utf-8")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj",
            "/CN=bench.test", "-keyout", str(folder / "key.pem"), "-out", str(folder / "csr.pem"))
    openssl("x509", "-req", "-in", str(folder / "csr.pem"), "-CA", str(folder / "ca.pem"), "-CAkey",
            str(folder / "ca-key.pem"), "-CAcreateserial", "-days", "2", "-extfile", str(folder / "ext"),
            "-out", str(folder / "cert.pem"))


def https_get(forwarder_port, host, port, context, path):
    """One GET over a new CONNECT tunnel through the forwarder; returns (status, body length)."""
    with socket.create_connection(("127.0.0.1", forwarder_port), timeout=30) as sock:
        sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(1)
        if not reply.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"tunnel refused: {reply!r}")
        with context.wrap_socket(sock, server_hostname=host) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while True:
                chunk = tls.recv(65536)
                if not chunk:
                    break
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), len(body)


def timed(*args):
    started = time.perf_counter()
    status, length = https_get(*args)
    elapsed = time.perf_counter() - started
    if (status, length) != (200, len(BODY)):
        raise SystemExit(f"unexpected answer: {status}, {length} bytes")
    return elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = benchlib.Results("egress_credentials")
    with tempfile.TemporaryDirectory(prefix="suzumio-credentials-bench-") as tmp:
        folder = Path(tmp)
        service_certificate(folder)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_context.load_cert_chain(str(folder / "cert.pem"), str(folder / "key.pem"))
        server.socket = server_context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="bench-https", daemon=True).start()
        port = server.server_address[1]
        root = suzumio_store.Root(folder / "root")
        entry = ("[{host: bench.test, credentials: {header: Authorization, valueEnv: BENCH_TOKEN, scheme: Bearer}}, "
                 "plain.test, '127.0.0.1']")
        text = benchlib.project_text("bench", ["pm"]).replace(
            "  pm: {tools: [messages.send]}", f"  pm: {{tools: [messages.send], egress: {entry}}}")
        store = benchlib.init_project(root, folder / "config", text)
        activation = coordination.start_activation(store, "pm", "Measure.", [])
        token = store.agent("pm", include_token=True)["token"]
        proxy = suzumio_egress.EgressProxy(
            root, suzumio_config.ConfigCache(), environ={"BENCH_TOKEN": TOKEN}, upstream_cafile=str(folder / "ca.pem"),
            resolver=lambda host, port: [ipaddress.ip_address("127.0.0.1")])
        proxy.listen_unix(folder / suzumio_egress.EGRESS_SOCKET).start()
        forwarder = Forwarder(f"unix://{tmp}/{suzumio_egress.EGRESS_SOCKET}",
                              preamble("bench", activation["id"], token)).start()
        plain_context = ssl.create_default_context(cafile=str(folder / "ca.pem"))
        project_context = ssl.create_default_context(
            cadata=suzumio_egress_tls.project_ca_pem(root.path, "bench"))
        try:
            timed(forwarder.port, "bench.test", port, project_context, "/api")  # the host certificate, issued once
            plain, credentialed = [], []
            for _ in range(args.runs):
                plain.append(timed(forwarder.port, "plain.test", port, plain_context, "/plain"))
                credentialed.append(timed(forwarder.port, "bench.test", port, project_context, "/api"))
            base = benchlib.median(plain)
            results.add("HTTPS GET, plain tunnel through the egress proxy", base, "s")
            results.add("HTTPS GET, credential added by the egress proxy", benchlib.median(credentialed), "s", base)
            results.add("added per credentialed request", benchlib.median(credentialed) - base, "s")
            results.note(f"{args.runs} requests of each kind, alternating, each on a new connection")
        finally:
            forwarder.stop()
            proxy.close()
            root.close()
            server.shutdown()
    return results.emit(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
