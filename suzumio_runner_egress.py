"""The runner's egress forwarder (docs/operations.md#egress): a listener on the sandbox's loopback that
the proxy variables of shell.exec, MCP servers and web.fetch name, tunnelling each connection to the
controller's egress proxy with the activation's identity in front (over the runner socket's folder, or
over TLS to the runner listener, told apart from the runner routes by ALPN); the Relay that copies bytes
both ways in one thread, which the controller's proxy reuses; and the TLS relay the runner listener
shares. Standard library only, CPython >= 3.9."""

import os
import selectors
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

PREAMBLE = "SUZUMIO-EGRESS/1"
MAX_CONNECTIONS = 64  # open tunnels per activation; one more is closed at once
HIGH_WATER = 1 << 20  # bytes buffered for a slow reader before its writer is no longer read
CHUNK = 1 << 18
CONNECT_TIMEOUT_SECONDS = 10.0
TLS_CHUNK = 16384  # one TLS record
TLS_IDLE_TIMEOUT_S = 3600  # a model stream through the controller may be quiet for long
ALPN_EGRESS = "suzumio-egress/1"  # what a TLS tunnel offers, so the runner listener relays it to the proxy
PROXY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
NO_PROXY = "localhost,127.0.0.1,::1"


def preamble(project, activation_id, token):
    """The line the controller reads before the client's bytes: who is connecting."""
    return f"{PREAMBLE} {project} {activation_id} {token}\n".encode()


def open_endpoint(url, timeout=CONNECT_TIMEOUT_SECONDS, ca=None, via=None):
    """A connected socket to the egress proxy: `unix:///path` (beside the runner socket), or
    `tls://host:port` (the runner listener: TLS verified against `ca`, the controllerCa, offering
    ALPN_EGRESS; a listener that does not select it would hand the tunnel to the runner routes),
    reached through the Unix socket `via` (a Swarm node's gateway) when given."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(parts.path)
        except OSError:
            sock.close()
            raise
        return sock
    if parts.scheme == "tls" and parts.hostname and parts.port:
        if via:
            return open_tls(connect_via(via, timeout), parts.hostname, ca)
        return open_tls(socket.create_connection((parts.hostname, parts.port), timeout=timeout), parts.hostname, ca)
    raise ValueError(f"Unsupported egress address: {url}")


VIA_WAIT_SECONDS = 5.0


def connect_via(path, timeout):
    """A connected Unix socket to `path`, which stands for a TCP connection. A socket not there yet,
    or not accepting, is tried again for VIA_WAIT_SECONDS: a node's gateway that has just started (or
    restarted) binds it a moment after its task runs."""
    deadline = time.monotonic() + VIA_WAIT_SECONDS
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
        except OSError:
            sock.close()
            raise


def tls_context(ca):
    context = ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context()
    context.set_alpn_protocols([ALPN_EGRESS])
    return context


def open_tls(sock, server_hostname, ca):
    """The TLS tunnel over a connected socket (closed on failure)."""
    try:
        tls = tls_context(ca).wrap_socket(sock, server_hostname=server_hostname)
    except (OSError, ssl.SSLError):
        sock.close()
        raise
    if tls.selected_alpn_protocol() != ALPN_EGRESS:
        tls.close()
        raise OSError(f"the runner listener did not accept the egress protocol ({ALPN_EGRESS})")
    return tls


def proxy_environment(proxy_url):
    """The proxy variables (both spellings) that send a sandbox's clients to the forwarder."""
    env = {}
    for name in PROXY_NAMES:
        env[name] = env[name.lower()] = proxy_url
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    return env


# Where images keep the system's authorities (Debian and Alpine, Fedora, macOS and the BSDs).
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


def trust_environment(ca_pem, folder=None):
    """Files a sandbox's TLS clients trust the project's egress CA through, and the variables that point
    them there: a bundle of the system's authorities plus that CA (OpenSSL, curl, Python requests, git)
    and the CA alone (Node adds it to its own). The CA is a certificate, public; its key is the controller's."""
    import tempfile

    folder = folder or tempfile.mkdtemp(prefix="suzumio-trust-")
    system = ""
    for path in SYSTEM_BUNDLES:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                system = handle.read()
            break
    only = os.path.join(folder, "egress-ca.pem")
    bundle = os.path.join(folder, "ca-bundle.pem")
    for path, text in ((only, ca_pem), (bundle, system.rstrip("\n") + "\n" + ca_pem)):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(path, 0o644)
    os.chmod(folder, 0o755)
    return {"SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle, "CURL_CA_BUNDLE": bundle,
            "GIT_SSL_CAINFO": bundle, "NODE_EXTRA_CA_CERTS": only}


class _Direction:
    """Bytes read from `source`, waiting to be written to `target`."""

    def __init__(self, source, target):
        self.source = source
        self.target = target
        self.buffer = bytearray()
        self.eof = False
        self.count = 0


class Pair:
    """Two connected sockets relayed both ways; `on_close(pair, error)` runs once when both are done."""

    def __init__(self, a, b, on_close=None, allow=None):
        self.up = _Direction(a, b)  # a -> b
        self.down = _Direction(b, a)
        self.on_close = on_close
        self.allow = allow  # allow(nbytes) -> False ends the pair (a byte limit)
        self.started = self.active = time.monotonic()
        self.closed = False

    def directions(self):
        return (self.up, self.down)

    def reading(self, sock):
        return self.up if sock is self.up.source else self.down

    def writing(self, sock):
        return self.up if sock is self.up.target else self.down

    def done(self):
        return all(d.eof and not d.buffer for d in self.directions())


class Relay:
    """Copies bytes both ways between pairs of non-blocking sockets with one selector, in the thread
    that calls `step`; sockets registered with `listen` hand their new connections to `on_accept`."""

    def __init__(self, idle_seconds=None):
        self.selector = selectors.DefaultSelector()
        self.pairs = set()
        self.idle_seconds = idle_seconds
        self._listeners = {}

    def listen(self, sock, on_accept):
        sock.setblocking(False)
        self._listeners[sock] = on_accept
        self.selector.register(sock, selectors.EVENT_READ, None)

    def add(self, a, b, on_close=None, allow=None):
        pair = Pair(a, b, on_close, allow)
        for sock in (a, b):
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, pair)
        self.pairs.add(pair)
        return pair

    def step(self, timeout):
        """Wait up to `timeout` seconds for readiness and move what can be moved."""
        for key, mask in self.selector.select(timeout):
            if key.data is None:
                self._accept(key.fileobj)
                continue
            pair = key.data
            if pair.closed:
                continue
            try:
                if mask & selectors.EVENT_READ:
                    self._read(pair, key.fileobj)
                if mask & selectors.EVENT_WRITE and not pair.closed:
                    self._write(pair, key.fileobj)
            except OSError as error:
                self.finish(pair, str(error) or error.__class__.__name__)
                continue
            if not pair.closed:
                if pair.done():
                    self.finish(pair, None)
                else:
                    self._update(pair)
        if self.idle_seconds is not None:
            now = time.monotonic()
            for pair in [p for p in self.pairs if now - p.active > self.idle_seconds]:
                self.finish(pair, "idle timeout")

    def _accept(self, listener):
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._listeners[listener](sock)

    def _read(self, pair, sock):
        direction = pair.reading(sock)
        try:
            data = sock.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        pair.active = time.monotonic()
        if not data:
            direction.eof = True
            if not direction.buffer:
                _shutdown_write(direction.target)
            return
        if pair.allow is not None and not pair.allow(len(data)):
            self.finish(pair, "byte limit reached")
            return
        direction.count += len(data)
        direction.buffer += data
        self._write(pair, direction.target)

    def _write(self, pair, sock):
        direction = pair.writing(sock)
        if not direction.buffer:
            return
        try:
            sent = sock.send(direction.buffer)
        except (BlockingIOError, InterruptedError):
            return
        del direction.buffer[:sent]
        if not direction.buffer and direction.eof:
            _shutdown_write(sock)

    def _update(self, pair):
        for sock in (pair.up.source, pair.down.source):
            outgoing, incoming = pair.reading(sock), pair.writing(sock)
            mask = 0
            if not outgoing.eof and len(outgoing.buffer) < HIGH_WATER:
                mask |= selectors.EVENT_READ
            if incoming.buffer:
                mask |= selectors.EVENT_WRITE
            registered = self.selector.get_map().get(sock)
            if mask and registered is None:
                self.selector.register(sock, mask, pair)
            elif mask and registered.events != mask:
                self.selector.modify(sock, mask, pair)
            elif not mask and registered is not None:
                self.selector.unregister(sock)

    def finish(self, pair, error):
        """Close both sockets of a pair and report it once."""
        if pair.closed:
            return
        pair.closed = True
        self.pairs.discard(pair)
        for sock in (pair.up.source, pair.down.source):
            if self.selector.get_map().get(sock) is not None:
                self.selector.unregister(sock)
            sock.close()
        if pair.on_close is not None:
            pair.on_close(pair, error)

    def close(self):
        for pair in list(self.pairs):
            self.finish(pair, "shutting down")
        for sock in self._listeners:
            self.selector.unregister(sock)
            sock.close()
        self._listeners.clear()
        self.selector.close()


def relay_tls(tls, upstream, idle_timeout=TLS_IDLE_TIMEOUT_S):
    """Copy bytes both ways, non-blocking with a bounded buffer per direction, so neither side can
    stall the other (a body still arriving while the answer already flows back). Ends when `upstream`
    closes and everything it sent has reached the TLS peer, when the TLS peer closes, or after
    `idle_timeout` seconds of silence. One thread owns the TLS socket, so it is never used concurrently
    (the Relay's selector cannot serve TLS: a record read may need a write, and decrypted bytes can
    wait in `pending()` with the socket silent)."""
    tls.setblocking(False)
    upstream.setblocking(False)
    to_upstream, to_client = bytearray(), bytearray()
    client_open = upstream_open = True
    with selectors.DefaultSelector() as selector:
        registered = {}

        def want(sock, events):
            if events == registered.get(sock, 0):
                return
            if not events:
                selector.unregister(sock)
            elif registered.get(sock):
                selector.modify(sock, events)
            else:
                selector.register(sock, events)
            registered[sock] = events

        while True:
            if not client_open and not to_upstream:
                return  # the client is gone: nothing more can reach it
            if not upstream_open and not to_client:
                return  # the answer is complete
            want(tls, (selectors.EVENT_READ if client_open and len(to_upstream) < HIGH_WATER else 0)
                 | (selectors.EVENT_WRITE if to_client else 0))
            want(upstream, (selectors.EVENT_READ if upstream_open and len(to_client) < HIGH_WATER else 0)
                 | (selectors.EVENT_WRITE if to_upstream else 0))
            pending = client_open and tls.pending() > 0 and len(to_upstream) < HIGH_WATER
            events = {key.fileobj: mask for key, mask in selector.select(0 if pending else idle_timeout)}
            if not events and not pending:
                return
            if pending or events.get(tls, 0) & selectors.EVENT_READ:
                try:
                    data = tls.recv(TLS_CHUNK)
                    if data:
                        to_upstream += data
                    else:
                        client_open = False
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            if to_client and events.get(tls, 0) & selectors.EVENT_WRITE:
                try:
                    # Retried with the same bytes after a want-write, as OpenSSL requires.
                    del to_client[:tls.send(to_client[:TLS_CHUNK])]
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
            if events.get(upstream, 0) & selectors.EVENT_READ:
                data = upstream.recv(TLS_CHUNK)
                if data:
                    to_client += data
                else:
                    upstream_open = False
            if to_upstream and events.get(upstream, 0) & selectors.EVENT_WRITE:
                del to_upstream[:upstream.send(to_upstream)]


def _shutdown_write(sock):
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the peer is gone already; the read side reports it


class Forwarder:
    """The loopback listener of one activation: every connection is tunnelled to `endpoint` behind the
    activation's preamble, in one thread ("suzumio-egress-forwarder")."""

    def __init__(self, endpoint, identity, warn=None, ca=None, via=None):
        self.endpoint = endpoint
        self.identity = identity
        self.warn = warn
        self.ca = ca  # PEM: the CA a tls:// endpoint is verified against
        self.via = via  # a Unix socket standing for the TCP route to a tls:// endpoint
        self.relay = Relay()
        self.stopped = threading.Event()
        self.thread = None
        self.port = None
        self._tls_open = {}  # client socket -> its TLS tunnel (None while it opens), one thread each
        self._tls_lock = threading.Lock()

    def start(self):
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(MAX_CONNECTIONS)
        self.port = listener.getsockname()[1]
        self.relay.listen(listener, self._accepted)
        self.thread = threading.Thread(target=self._run, name="suzumio-egress-forwarder", daemon=True)
        self.thread.start()
        return self

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def _accepted(self, client):
        with self._tls_lock:
            full = len(self.relay.pairs) + len(self._tls_open) >= MAX_CONNECTIONS
            if not full and self.endpoint.startswith("tls:"):
                self._tls_open[client] = None
        if full:
            client.close()
            return
        if self.endpoint.startswith("tls:"):
            # The handshake blocks, and the Relay cannot carry TLS: one thread per tunnel, at most
            # MAX_CONNECTIONS of them.
            threading.Thread(target=self._tunnel_tls, args=(client,), name="suzumio-egress-tls", daemon=True).start()
            return
        upstream = self._open(client)
        if upstream is not None:
            self.relay.add(client, upstream)

    def _open(self, client):
        """The tunnel to the proxy with the preamble sent, or None (`client` closed, a warning given)."""
        try:
            upstream = open_endpoint(self.endpoint, ca=self.ca, via=self.via)
            upstream.sendall(self.identity)
        except (OSError, ValueError) as error:
            if self.warn is not None:
                self.warn("Cannot reach the egress proxy at %s: %s", self.endpoint, error)
            client.close()
            return None
        return upstream

    def _tunnel_tls(self, client):
        upstream = None
        try:
            client.setblocking(True)
            upstream = self._open(client)
            if upstream is not None:
                with self._tls_lock:
                    self._tls_open[client] = upstream
                relay_tls(upstream, client)
        except (OSError, ssl.SSLError):
            pass  # either side went away: the client sees its connection end
        finally:
            with self._tls_lock:
                self._tls_open.pop(client, None)
            client.close()
            if upstream is not None:
                upstream.close()

    def _run(self):
        while not self.stopped.is_set():
            self.relay.step(0.5)

    def stop(self):
        self.stopped.set()
        with self._tls_lock:
            tunnels = [sock for pair in self._tls_open.items() for sock in pair if sock is not None]
        for sock in tunnels:
            try:
                # The plain socket's shutdown: SSLSocket's would drop its TLS state under the relaying thread.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass
        if self.thread is not None:
            self.thread.join(timeout=2.0)
        if self.thread is None or not self.thread.is_alive():
            self.relay.close()
