"""suzumio_tls: the root's CA and server certificate (real openssl), and the relay in front of the
runner app (real TLS sockets, a real Unix socket server behind it)."""

import contextlib
import http.client
import http.server
import os
import selectors
import socket
import socketserver
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import wait_until

import suzumio_runner_egress as egress_mod
import suzumio_runner_models as models_mod
import suzumio_tls
from suzumio_runner_loop import ControllerClient, ControllerError


def client_context(ca_pem):
    return ssl.create_default_context(cadata=ca_pem)


def tls_connect(port, ca_pem, name="localhost"):
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return client_context(ca_pem).wrap_socket(raw, server_hostname=name)


class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


@contextlib.contextmanager
def unix_server(path, handler):
    """A threading Unix socket server at `path` with `handler`, for the relay to reach; yields the path."""
    server = socketserver.ThreadingUnixStreamServer(str(path), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def echo_socket(tmp_path):
    with unix_server(tmp_path / "echo.sock", Echo) as path:
        yield path


@pytest.fixture
def front(tmp_path, echo_socket):
    made = []

    (tmp_path / "root").mkdir()

    def start(**options):
        tls = suzumio_tls.generated_tls(tmp_path / "root", "127.0.0.1")
        relay = suzumio_tls.TlsFront(tls.server_context(), "127.0.0.1", 0, echo_socket, **options).start()
        made.append(relay)
        return relay, tls

    yield start
    for relay in made:
        relay.close()


def test_the_root_gets_a_ca_and_a_server_certificate_once(tmp_path):
    (tmp_path / "root").mkdir()
    first = suzumio_tls.generated_tls(tmp_path / "root", "127.0.0.1")
    folder = tmp_path / "root" / "tls"
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    for key in ("ca-key.pem", "server-key.pem"):
        assert stat.S_IMODE(os.stat(folder / key).st_mode) == 0o600
    issued = (folder / "server.pem").read_bytes()
    again = suzumio_tls.generated_tls(tmp_path / "root", "localhost")  # a name it already has
    assert (folder / "server.pem").read_bytes() == issued and again.ca_pem == first.ca_pem
    moved = suzumio_tls.generated_tls(tmp_path / "root", "10.213.7.1")
    assert (folder / "server.pem").read_bytes() != issued and moved.ca_pem == first.ca_pem
    assert "10.213.7.1" in (folder / "server.names").read_text().split()


class Reverse(http.server.BaseHTTPRequestHandler):
    """Answers a POST with its body reversed: as large as the request."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[::-1])

    def log_message(self, *args):
        pass


def test_the_relay_carries_a_large_request_and_answer_and_checks_the_name(tmp_path):
    (tmp_path / "root").mkdir()
    tls = suzumio_tls.generated_tls(tmp_path / "root", "127.0.0.1")
    with unix_server(tmp_path / "http.sock", Reverse) as backend:
        relay = suzumio_tls.TlsFront(tls.server_context(), "127.0.0.1", 0, backend).start()
        try:
            payload = os.urandom(3 * 1024 * 1024)
            for name in ("127.0.0.1", "localhost"):
                conn = http.client.HTTPSConnection(name, relay.port, timeout=10,
                                                   context=client_context(tls.ca_pem))
                conn.request("POST", "/", body=payload)
                answer = conn.getresponse()
                assert (answer.status, answer.read() == payload[::-1]) == (200, True)
                conn.close()
            with pytest.raises(ssl.SSLCertVerificationError):
                tls_connect(relay.port, tls.ca_pem, "example.org")
        finally:
            relay.close()


def test_the_relay_does_not_stall_when_both_directions_flow_at_once(front):
    relay, tls = front()
    payload = os.urandom(4 * 1024 * 1024)
    with tls_connect(relay.port, tls.ca_pem) as conn:
        conn.setblocking(False)
        sent, received = 0, bytearray()
        with selectors.DefaultSelector() as selector:
            selector.register(conn, selectors.EVENT_READ | selectors.EVENT_WRITE)
            while len(received) < len(payload):
                events = selector.select(timeout=0 if conn.pending() else 10)
                assert events or conn.pending(), f"stalled after {sent} sent and {len(received)} echoed"
                mask = events[0][1] if events else 0
                if mask & selectors.EVENT_READ or conn.pending():
                    try:
                        chunk = conn.recv(65536)
                        assert chunk, "the relay closed early"
                        received += chunk
                    except ssl.SSLWantReadError:
                        pass
                if mask & selectors.EVENT_WRITE and sent < len(payload):
                    try:
                        sent += conn.send(payload[sent:sent + 16384])
                    except ssl.SSLWantWriteError:
                        pass
                if sent >= len(payload):
                    selector.modify(conn, selectors.EVENT_READ)
    assert bytes(received) == payload


def test_a_certificate_of_another_ca_is_refused(front, tmp_path):
    relay, _tls = front()
    (tmp_path / "elsewhere").mkdir()
    stranger = suzumio_tls.generated_tls(tmp_path / "elsewhere", "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_connect(relay.port, stranger.ca_pem)


def test_plain_http_gets_no_answer(front):
    relay, _tls = front()
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as plain:
        plain.sendall(b"POST /runner/signals HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        try:
            answer = plain.recv(4096)
        except ConnectionResetError:
            answer = b""
    assert b"HTTP/" not in answer


def test_a_client_that_never_shakes_hands_is_dropped(front):
    relay, tls = front(handshake_timeout=0.3)
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as silent:
        try:
            assert silent.recv(1) == b""  # closed by the relay, not by this test's timeout
        except ConnectionResetError:
            pass
    with tls_connect(relay.port, tls.ca_pem) as conn:  # the listener still serves
        conn.sendall(b"ping")
        assert conn.recv(4) == b"ping"


def test_connections_beyond_the_limit_are_closed_at_once(front):
    relay, tls = front(limit=1)
    with tls_connect(relay.port, tls.ca_pem) as first:
        first.sendall(b"one")
        assert first.recv(3) == b"one"
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            tls_connect(relay.port, tls.ca_pem)
    # The slot frees once the first connection's relay has seen it close (on its own thread).
    wait_until(lambda: _slot_free(relay, tls), 5, message="a connection to be relayed again")


def _slot_free(relay, tls):
    try:
        with tls_connect(relay.port, tls.ca_pem) as conn:
            conn.sendall(b"x")
            return conn.recv(1) == b"x"
    except (ssl.SSLError, OSError):
        return False


def test_a_missing_openssl_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no openssl there
    with pytest.raises(suzumio_tls.SuzumioError, match="needs the openssl command"):
        suzumio_tls.generated_tls(tmp_path, "127.0.0.1")


def test_operator_files_are_checked(tmp_path):
    (tmp_path / "cert.pem").write_text("not a certificate")
    (tmp_path / "key.pem").write_text("x")
    with pytest.raises(suzumio_tls.SuzumioError, match="No PEM certificate in"):
        suzumio_tls.operator_tls(tmp_path / "cert.pem", tmp_path / "key.pem")
    with pytest.raises(suzumio_tls.SuzumioError, match="certificate file not found"):
        suzumio_tls.operator_tls(tmp_path / "nope.pem", tmp_path / "key.pem")


def answer_ok(environ, start_response):
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", "2")])
    return [b"{}"]


def test_the_runners_client_verifies_the_listener_and_resumes_its_session(tmp_path):
    (tmp_path / "root").mkdir()
    tls = suzumio_tls.generated_tls(tmp_path / "root", "127.0.0.1")
    listener = suzumio_tls.TlsRunnerListener(answer_ok, "127.0.0.1", 0, tls, threads=2).start()
    try:
        url = f"https://127.0.0.1:{listener.port}"
        client = ControllerClient(url, {"project": "p"}, ca=tls.ca_pem)
        assert client.post("/runner/signals", {}) == {}
        assert client.tls_sessions.resumed is False
        assert client.post("/runner/signals", {}) == {}
        assert client.tls_sessions.resumed is True  # no full handshake for the second request
        (tmp_path / "other").mkdir()
        stranger = ControllerClient(url, {"project": "p"}, ca=suzumio_tls.generated_tls(tmp_path / "other",
                                                                                         "127.0.0.1").ca_pem)
        with pytest.raises(ControllerError, match="CERTIFICATE_VERIFY_FAILED"):
            stranger.post("/runner/signals", {})
        with pytest.raises(ControllerError, match="Suzumio controller request failed"):
            ControllerClient("http" + url[len("https"):], {"project": "p"}).post("/runner/signals", {})
    finally:
        listener.close()
    assert not listener.relay_dir.exists()


class Tagged(socketserver.StreamRequestHandler):
    """Answers its first line with `egress <line>`, then echoes: stands for the egress proxy's socket."""

    def handle(self):
        line = self.rfile.readline()
        self.wfile.write(b"egress " + line)
        while True:
            data = self.rfile.read1(65536)
            if not data:
                return
            self.wfile.write(data)


@pytest.fixture
def egress_socket(tmp_path):
    with unix_server(tmp_path / "egress.sock", Tagged) as path:
        yield path


def test_the_egress_alpn_protocol_reaches_its_own_socket_and_everything_else_the_runner_routes(front, egress_socket):
    relay, tls = front(alpn_sockets={egress_mod.ALPN_EGRESS: egress_socket})
    with egress_mod.open_endpoint(f"tls://127.0.0.1:{relay.port}", ca=tls.ca_pem) as tunnel:
        tunnel.sendall(b"who\nafter")
        assert tunnel.makefile("rb").read(len(b"egress who\nafter")) == b"egress who\nafter"
    for offered in (None, ["h2"], ["http/1.1"]):
        context = client_context(tls.ca_pem)
        if offered:
            context.set_alpn_protocols(offered)
        with context.wrap_socket(socket.create_connection(("127.0.0.1", relay.port), timeout=5),
                                 server_hostname="localhost") as conn:
            conn.sendall(b"who\n")
            assert conn.recv(100) == b"who\n", offered  # the echo: the runner routes' socket
    with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as plain:
        plain.sendall(b"SUZUMIO-EGRESS/1 p act_x token\n")
        try:
            answer = plain.makefile("rb").read()
        except ConnectionResetError:
            answer = b""
        assert not answer.startswith(b"egress")  # no handshake: dropped unread


def test_a_tunnel_refuses_a_listener_without_the_egress_protocol_or_of_another_ca(front, tmp_path):
    relay, tls = front()  # no ALPN: a tunnel would land on the runner routes
    with pytest.raises(OSError, match="did not accept the egress protocol"):
        egress_mod.open_endpoint(f"tls://127.0.0.1:{relay.port}", ca=tls.ca_pem)
    (tmp_path / "other").mkdir()
    other = suzumio_tls.generated_tls(tmp_path / "other", "127.0.0.1")
    with pytest.raises(ssl.SSLCertVerificationError):
        egress_mod.open_endpoint(f"tls://127.0.0.1:{relay.port}", ca=other.ca_pem)


def test_the_forwarder_carries_large_bodies_both_ways_over_a_tls_tunnel(front, egress_socket):
    relay, tls = front(alpn_sockets={egress_mod.ALPN_EGRESS: egress_socket})
    forwarder = egress_mod.Forwarder(f"tls://127.0.0.1:{relay.port}", b"who\n", ca=tls.ca_pem).start()
    try:
        payload = os.urandom(3 * 1024 * 1024)
        with socket.create_connection(("127.0.0.1", forwarder.port), timeout=10) as client:
            sender = threading.Thread(target=client.sendall, args=(payload,))
            sender.start()
            with client.makefile("rb") as reader:
                assert reader.read(len(b"egress who\n")) == b"egress who\n"
                assert reader.read(len(payload)) == payload
            sender.join()
        wait_until(lambda: not forwarder._tls_open, 10, message="the tunnel's thread to end")
        idle = socket.create_connection(("127.0.0.1", forwarder.port), timeout=10)
        with idle, idle.makefile("rb") as reader:
            assert reader.read(len(b"egress who\n")) == b"egress who\n"
            forwarder.stop()  # ends the open tunnel too
            assert reader.read() == b""
    finally:
        forwarder.stop()


def test_through_a_node_gateway_the_runner_routes_and_the_egress_tunnel_keep_their_tls(front, egress_socket, tmp_path):
    relay, tls = front(alpn_sockets={egress_mod.ALPN_EGRESS: egress_socket})
    gateway_socket = tmp_path / "gateway.sock"
    script = Path(suzumio_tls.__file__).with_name("suzumio_runner_gateway.py")
    gateway = subprocess.Popen([sys.executable, str(script), str(gateway_socket), "127.0.0.1", str(relay.port)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert gateway.stdout.readline().startswith("suzumio gateway: ")  # listening
        # The name checked is the listener's, whatever carries the bytes.
        via = str(gateway_socket)
        with egress_mod.open_endpoint(f"tls://localhost:{relay.port}", ca=tls.ca_pem, via=via) as tunnel:
            tunnel.sendall(b"who\n")
            assert tunnel.makefile("rb").read(len(b"egress who\n")) == b"egress who\n"
        with pytest.raises(ssl.SSLCertVerificationError):
            egress_mod.open_endpoint(f"tls://example.org:{relay.port}", ca=tls.ca_pem, via=via)
        conn = models_mod._ResumingHTTPSConnection("localhost", relay.port, 5, client_context(tls.ca_pem),
                                                   models_mod.TlsSessions(), via=via)
        conn.connect()
        with conn.sock:
            conn.sock.sendall(b"plain http bytes\n")
            assert conn.sock.recv(100) == b"plain http bytes\n"  # the echo: the runner routes' socket
    finally:
        gateway.kill()
        gateway.wait()
