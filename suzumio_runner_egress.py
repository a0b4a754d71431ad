"""The runner's egress forwarder (docs/operations.md#egress): a listener on the sandbox's loopback that
the proxy variables of shell.exec, MCP servers and web.fetch name, tunnelling each connection to the
controller's egress proxy with the activation's identity in front; and the Relay that copies bytes
both ways in one thread, which the controller's proxy reuses. Standard library only, CPython >= 3.9."""

import selectors
import socket
import threading
import time
from urllib.parse import urlsplit

PREAMBLE = "SUZUMIO-EGRESS/1"
MAX_CONNECTIONS = 64  # open tunnels per activation; one more is closed at once
HIGH_WATER = 1 << 20  # bytes buffered for a slow reader before its writer is no longer read
CHUNK = 1 << 18
CONNECT_TIMEOUT_SECONDS = 10.0
PROXY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
NO_PROXY = "localhost,127.0.0.1,::1"


def preamble(project, activation_id, token):
    """The line the controller reads before the client's bytes: who is connecting."""
    return f"{PREAMBLE} {project} {activation_id} {token}\n".encode()


def open_endpoint(url, timeout=CONNECT_TIMEOUT_SECONDS):
    """A connected socket to `unix:///path` or `tcp://host:port` (the egress proxy's address for this
    runner, whatever carries the runner's other calls)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target = parts.path
    elif parts.scheme == "tcp" and parts.hostname and parts.port:
        return socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    else:
        raise ValueError(f"Unsupported egress address: {url}")
    sock.settimeout(timeout)
    try:
        sock.connect(target)
    except OSError:
        sock.close()
        raise
    return sock


def proxy_environment(proxy_url):
    """The proxy variables (both spellings) that send a sandbox's clients to the forwarder."""
    env = {}
    for name in PROXY_NAMES:
        env[name] = env[name.lower()] = proxy_url
    env["NO_PROXY"] = env["no_proxy"] = NO_PROXY
    return env


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


def _shutdown_write(sock):
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the peer is gone already; the read side reports it


class Forwarder:
    """The loopback listener of one activation: every connection is tunnelled to `endpoint` behind the
    activation's preamble, in one thread ("suzumio-egress-forwarder")."""

    def __init__(self, endpoint, identity, warn=None):
        self.endpoint = endpoint
        self.identity = identity
        self.warn = warn
        self.relay = Relay()
        self.stopped = threading.Event()
        self.thread = None
        self.port = None

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
        if len(self.relay.pairs) >= MAX_CONNECTIONS:
            client.close()
            return
        try:
            upstream = open_endpoint(self.endpoint)
            upstream.sendall(self.identity)
        except (OSError, ValueError) as error:
            if self.warn is not None:
                self.warn("Cannot reach the egress proxy at %s: %s", self.endpoint, error)
            client.close()
            return
        self.relay.add(client, upstream)

    def _run(self):
        while not self.stopped.is_set():
            self.relay.step(0.5)

    def stop(self):
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=2.0)
        if self.thread is None or not self.thread.is_alive():
            self.relay.close()
