"""The controller's egress proxy (docs/operations.md#egress): the one way out of an activation. It reads
the activation's identity that the runner's forwarder puts in front of each connection, parses the
plain-HTTP or CONNECT request, resolves the name itself, checks the agent's allowlist
(agents.<id>.egress), connects to the address it checked and relays, and records each connection as
one egress.allowed or egress.denied event. The allowlist itself is suzumio_egress_policy's."""

import hmac
import logging
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import suzumio_egress_tls
from suzumio_egress_policy import allowlist, ip_or_none, is_public, refusal, split_port
from suzumio_errors import SuzumioError
from suzumio_records import ACT_RUNNING
from suzumio_runner_egress import PREAMBLE, Relay

log = logging.getLogger(__name__)

EGRESS_SOCKET = "egress.sock"
EVENT_ALLOWED = "egress.allowed"
EVENT_DENIED = "egress.denied"
WORKERS = 64  # connections served at once across all projects; one more is answered 503
HEAD_LIMIT = 1 << 16
HEAD_TIMEOUT_SECONDS = 10.0
CONNECT_TIMEOUT_SECONDS = 10.0
IDLE_SECONDS = 300.0
USAGE_KEPT = 4096  # activations whose connection and byte counts are remembered for the limits


def resolve(host, port):
    """The addresses of a name, as the controller's resolver gives them, in order, once each."""
    found = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ip_or_none(sockaddr[0].split("%", 1)[0])
        if address is not None and address not in found:
            found.append(address)
    return found


# ---------------------------------------------------------------- one connection

class Refused(SuzumioError):
    """A connection the proxy answers itself: `status` and the reason phrase, audited as denied."""

    status = 403

    def __init__(self, message, status=403, reason=None, address=None):
        super().__init__(message)
        self.status = status
        self.reason = reason or message
        self.address = address  # what the name resolved to, when that is why it was refused


@dataclass
class Request:
    method: str
    host: str
    port: int
    head: bytes  # what goes upstream first (CONNECT: nothing)


def read_head(sock):
    """The preamble line and the HTTP request head up to the blank line, and any bytes after it."""
    data = bytearray()
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(data[:end + 4]), bytes(data[end + 4:])
        if len(data) > HEAD_LIMIT:
            raise Refused("request head too large", 431)
        chunk = sock.recv(1 << 14)
        if not chunk:
            raise Refused("connection closed before a request", 400)
        data += chunk


def parse_identity(line):
    """(project, activation id, token) from the forwarder's preamble line."""
    parts = line.decode("utf-8", "replace").split()
    if len(parts) != 4 or parts[0] != PREAMBLE:
        raise Refused("not an egress tunnel", 400)
    return parts[1], parts[2], parts[3]


def parse_request(lines):
    """A Request from the request line and header lines of a proxy request."""
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise Refused("malformed request line", 400) from None
    if method == "CONNECT":
        try:
            host, port = split_port(target.lower())
        except ValueError as error:
            raise Refused(f"bad CONNECT target: {error}", 400) from None
        if port is None:
            raise Refused("CONNECT needs host:port", 400)
        return Request(method, host, port, b"")
    parts = urlsplit(target)
    if parts.scheme.lower() != "http" or not parts.hostname:
        raise Refused("only http:// URLs and CONNECT go through the egress proxy", 400)
    try:
        port = parts.port or 80
    except ValueError:
        raise Refused("bad port", 400) from None
    path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    headers = [line for line in lines[1:] if line and not line.lower().startswith((b"proxy-", b"connection:"))]
    head = b"\r\n".join([f"{method} {path} {version}".encode("latin-1"), *headers, b"Connection: close"])
    return Request(method, parts.hostname.lower(), port, head + b"\r\n\r\n")


def answer(status, reason, body=""):
    body = (body or reason) + "\n"
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body.encode('utf-8'))}\r\nConnection: close\r\n"
            f"X-Suzumio-Egress: denied\r\n\r\n{body}").encode()


class _Usage:
    """Connections and bytes of each activation so far (for agents.<id>.egressLimits)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows = OrderedDict()

    def connect(self, activation_id, limit):
        with self._lock:
            row = self._rows.setdefault(activation_id, [0, 0])
            self._rows.move_to_end(activation_id)
            while len(self._rows) > USAGE_KEPT:
                self._rows.popitem(last=False)
            if limit is not None and row[0] >= limit:
                return False
            row[0] += 1
            return True

    def spend(self, activation_id, nbytes, limit):
        with self._lock:
            row = self._rows.setdefault(activation_id, [0, 0])
            row[1] += nbytes
            return limit is None or row[1] <= limit


# ---------------------------------------------------------------- the proxy

class EgressProxy:
    """Listeners (a Unix socket beside the runner socket, which the TLS runner listener also hands
    the tunnels that come to it with the egress ALPN protocol), one acceptor
    thread and a bounded pool of named workers, each serving one connection from request to close.
    `resolve(host, port)` gives a name's addresses (tests inject one); `own_listeners()` gives the
    (host, port) of the controller's listeners, never reachable through the proxy."""

    def __init__(self, root, configs, *, resolver=resolve, own_listeners=None, workers=WORKERS, environ=None,
                 upstream_cafile=None):
        self.root = root
        self.configs = configs
        # Where credentials are read at request time (the controller's environment), the projects' CAs,
        # and the proxy's own TLS to credentialed hosts (the system's authorities unless `upstream_cafile`).
        self.environ = os.environ if environ is None else environ
        self.authorities = suzumio_egress_tls.Authorities(root.path)
        self.upstream_context = suzumio_egress_tls.upstream_context(upstream_cafile)
        self.resolve = resolver
        self.own_listeners = own_listeners or (lambda: [])
        self.workers = workers
        self.usage = _Usage()
        self._listeners = []
        self._selector = selectors.DefaultSelector()
        self._stopped = threading.Event()
        self._active = 0
        self._lock = threading.Lock()
        self._pool = None
        self._thread = None

    def listen_unix(self, path):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if path.exists():
            path.unlink()  # a socket a killed serve left; prepare_runner_socket_dir checked the folder
        sock.bind(str(path))
        path.chmod(0o666)  # containers run as other uids; the preamble's token is the authentication
        self._add_listener(sock)
        return self

    def _add_listener(self, sock):
        sock.listen(128)
        sock.setblocking(False)
        self._listeners.append(sock)
        self._selector.register(sock, selectors.EVENT_READ)

    def start(self):
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="suzumio-egress")
        self._thread = threading.Thread(target=self._accept_loop, name="suzumio-egress-accept", daemon=True)
        self._thread.start()
        return self

    def close(self):
        """Stop accepting, end open tunnels (each worker sees the flag within half a second), join."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for sock in self._listeners:
            sock.close()
        self._selector.close()

    def _accept_loop(self):
        while not self._stopped.is_set():
            for key, _ in self._selector.select(0.5):
                try:
                    client, _ = key.fileobj.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                client.setblocking(True)
                with self._lock:
                    full = self._active >= self.workers
                    if not full:
                        self._active += 1
                if full:
                    # One short write on a fresh socket: it fits the send buffer, so it never blocks.
                    client.setblocking(False)
                    try:
                        client.send(answer(503, "egress proxy busy"))
                    except OSError:
                        pass
                    client.close()
                    continue
                self._pool.submit(self._serve, client)

    def _serve(self, client):
        try:
            self.serve(client)
        except Exception:  # the thread boundary: one connection's failure never ends the pool
            log.exception("egress connection failed")
            client.close()
        finally:
            with self._lock:
                self._active -= 1

    # -- one connection, from request to close

    def serve(self, client):
        started = time.monotonic()
        client.settimeout(HEAD_TIMEOUT_SECONDS)
        try:
            head, rest = read_head(client)
        except (Refused, OSError) as error:
            log.warning("egress: %s", error)
            client.close()
            return
        first, _, request_head = head.partition(b"\n")
        try:
            who = self.identify(*parse_identity(first))
        except SuzumioError as error:
            log.warning("egress: refused a tunnel: %s", error)
            _send_and_close(client, answer(403, "egress tunnel not authorized", str(error)))
            return
        store, config, agent_id, activation_id = who
        audit = {"agent": agent_id, "activation": activation_id, "host": None, "port": None, "address": None,
                 "method": None}
        try:
            request = parse_request(request_head.split(b"\r\n")[:-2] if request_head else [b""])
            audit.update(host=request.host, port=request.port, method=request.method)
            address = self.check(config, agent_id, activation_id, request)
        except Refused as error:
            audit["address"] = None if error.address is None else str(error.address)
            # Recorded before the answer: whoever reads the refusal finds its event.
            self.record(store, EVENT_DENIED, audit, started, 0, 0, reason=str(error))
            _send_and_close(client, answer(error.status, error.reason, str(error)))
            return
        audit["address"] = str(address)
        try:
            upstream = socket.create_connection((str(address), request.port), timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError as error:
            reason = f"cannot connect to {request.host}:{request.port}: {error.strerror or error}"
            self.record(store, EVENT_ALLOWED, audit, started, 0, 0, error=reason)
            _send_and_close(client, answer(502, "egress connect failed", reason))
            return
        rule = config.egress(agent_id).host_rule(request.host, request.port)
        if rule is not None:
            self.intercept(store, audit, started, client, upstream, request, rest, rule)
            return
        self.relay(store, config, audit, started, client, upstream, request, rest)

    def identify(self, project, activation_id, token):
        """(store, config, agent id, activation id) of a running activation whose agent's token this is."""
        store = self.root.open_project(project)
        activation = store.activation(activation_id)
        agent = store.agent(activation["agentId"], include_token=True)
        if not hmac.compare_digest(token.encode("utf-8"), agent["token"].encode("utf-8")):
            raise Refused("Invalid agent token")
        if activation["status"] != ACT_RUNNING:
            raise Refused(f"Activation {activation_id} is {activation['status']}")
        return store, self.configs.get(store), agent["id"], activation_id

    def check(self, config, agent_id, activation_id, request):
        """The address to connect to, or Refused: the allowlist, the controller's own listeners, the
        per-activation connection limit. The name is resolved here, once; the connection goes to the
        address that was checked, so a name cannot change its answer in between."""
        egress = config.egress(agent_id)
        rules = allowlist(egress.entries)
        message = refusal(request.host, request.port, agent_id)
        literal = ip_or_none(request.host)
        named = rules.names_host(request.host, request.port)
        if literal is None:
            if not named and not rules.has_addresses:
                raise Refused(message)
            try:
                addresses = self.resolve(request.host, request.port)
            except OSError as error:
                if not named:
                    raise Refused(message) from None
                raise Refused(f"cannot resolve {request.host}: {error.strerror or error}", 502,
                              "egress name not resolved") from None
        else:
            addresses = [literal]
        chosen = None
        for address in addresses:
            if self.is_own(address, request.port):
                raise Refused(message, address=address)
            if chosen is None and (rules.names_address(address, request.port) or (is_public(address) and named)):
                chosen = address
        if chosen is None:
            raise Refused(message, address=addresses[0] if addresses else None)
        if not self.usage.connect(activation_id, egress.max_connections):
            raise Refused(f"egress connection limit ({egress.max_connections}) reached for {agent_id}; "
                          f"raise agents.{agent_id}.egressLimits.connections", 429, "egress connection limit")
        return chosen

    def is_own(self, address, port):
        listeners = list(self.own_listeners())
        for host, own_port in listeners:
            if port != own_port:
                continue
            bound = ip_or_none(host)
            if bound is None or bound.is_unspecified or address.is_loopback or address == bound:
                return True
        return False

    def relay(self, store, config, audit, started, client, upstream, request, rest):
        egress = config.egress(audit["agent"])
        sent = 0
        try:
            if request.method == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(request.head)
                sent += len(request.head)
            if rest:
                upstream.sendall(rest)
                sent += len(rest)
        except OSError as error:
            client.close()
            upstream.close()
            self.record(store, EVENT_ALLOWED, audit, started, sent, 0, error=str(error))
            return
        activation_id = audit["activation"]
        self.usage.spend(activation_id, sent, None)
        relay = Relay(idle_seconds=IDLE_SECONDS)
        outcome = {}

        def closed(pair, error):
            outcome.update(out=pair.up.count, into=pair.down.count, error=error)

        relay.add(client, upstream, closed,
                  lambda nbytes: self.usage.spend(activation_id, nbytes, egress.max_bytes))
        try:
            while relay.pairs and not self._stopped.is_set():
                relay.step(0.5)
        finally:
            relay.close()
        error = outcome.get("error")
        self.record(store, EVENT_ALLOWED, audit, started, sent + outcome.get("out", 0), outcome.get("into", 0),
                    **({"error": error} if error else {}))

    def intercept(self, store, audit, started, client, upstream, request, rest, rule):
        """A host whose entry carries a credential or asks for idempotency keys: one request, read (TLS
        ended with the project's CA), changed (suzumio_egress_tls.additions), sent on the proxy's own
        verified TLS, its answer relayed with any echo of the credential masked; audited with the
        credential's name and the call key, never the value."""
        extra = {"intercepted": True}
        credential, value = rule.credential, None
        if credential is not None:
            extra["credential"] = credential.value_env
            value = self.environ.get(credential.value_env)
            if not value:
                reason = f"the credential for {request.host} (${credential.value_env}) is not set on the controller"
                upstream.close()
                self.record(store, EVENT_ALLOWED, audit, started, 0, 0, error=reason, **extra)
                _send_and_close(client, answer(502, "egress credential missing", reason))
                return
        call_key = store.running_call_key(audit["activation"]) if rule.idempotency_key else None
        if call_key:
            extra["idempotencyKey"] = call_key
        added = suzumio_egress_tls.additions(credential, value, call_key)
        outcome, error, opened = suzumio_egress_tls.Outcome(), None, False
        try:
            if request.method == "CONNECT":
                # The host's real certificate is checked before the agent hears the tunnel is open.
                upstream = self.upstream_context.wrap_socket(upstream, server_hostname=request.host)
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                opened = True
                client.settimeout(IDLE_SECONDS)
                context = self.authorities.of(store.project_id).server_context(request.host)
                client = context.wrap_socket(client, server_side=True)
                upstream.settimeout(IDLE_SECONDS)
                outcome = suzumio_egress_tls.exchange(client, upstream, added, rest)
            else:
                client.settimeout(IDLE_SECONDS)
                outcome = suzumio_egress_tls.exchange(client, upstream, added, request.head + rest)
        except (OSError, SuzumioError, ValueError) as failure:
            error = str(failure) or failure.__class__.__name__
            if request.method == "CONNECT" and not opened:
                _send_and_close(client, answer(502, "egress TLS to the host failed", error))
        finally:
            client.close()
            upstream.close()
        self.usage.spend(audit["activation"], outcome.bytes_out + outcome.bytes_in, None)
        details = {"request": outcome.request, "status": outcome.status, "masked": outcome.masked or None,
                   "error": error}
        self.record(store, EVENT_ALLOWED, audit, started, outcome.bytes_out, outcome.bytes_in, **extra,
                    **{key: item for key, item in details.items() if item is not None})

    def record(self, store, event_type, audit, started, bytes_out, bytes_in, **extra):
        data = dict(audit, bytesOut=bytes_out, bytesIn=bytes_in,
                    durationMs=int((time.monotonic() - started) * 1000), **extra)
        store.append_event(event_type, data)


def _send_and_close(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass  # the client went away; the audit event still records the refusal
    finally:
        sock.close()
