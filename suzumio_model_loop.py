"""The model proxy's event loop: `/runner/model` calls served without a worker thread each.

A runner's model call is checked on a Waitress worker thread like any route (its token, the preset, the
replay); then the route hands the connection over (suzumio_sse.HandOffTask) and gives this loop the
call's Forwarding (suzumio_model_proxy), which decides retries and resends exactly as the threaded path
does. One thread drives every upstream exchange over an epoll selector: a non-blocking connect (names
resolved on the pool), TLS, the request, an incremental HTTP/1.1 head, chunked or delimited body, and
the answer assembled event by event (suzumio_providers.AnswerReader), its deltas published as they come.
Retry delays, the provider's timeouts and a wait at the provider's gate (suzumio_model_gate: limits, a
pause, the queue) are timers of the same loop; a waiting call holds its runner's socket and no thread.
What writes the store (a retry's or a wait's event, the exchange and its usage, the trace span) runs on
a small pool, since a synced COMMIT on the loop would stall every stream; the answer then goes back to
the runner's socket from the loop, non-blocking. A hundred streams cost a hundred sockets, not a hundred
threads taking turns at the GIL.
Upstreams reached through an HTTP proxy stay on the threaded path."""
import collections
import concurrent.futures
import contextlib
import email.utils
import errno
import ipaddress
import logging
import math
import os
import selectors
import socket
import ssl
import threading
import time
import uuid
from urllib.parse import urlsplit

import suzumio_providers as providers
from suzumio_errors import InternalError, SuzumioError, Unavailable, storage_error
from suzumio_http import JSON_TYPE, NOSNIFF, VERSION_HEADER, encode_json
from suzumio_model_proxy import ModelAnswer
from suzumio_resources import VERSION
from suzumio_runner_models import READ_CHUNK, TransportError
from suzumio_selector_loop import SelectorLoop

log = logging.getLogger(__name__)

POOL_THREADS = 4  # name lookups and store writes: COMMITs of calls ending together share a group commit
MAX_HEAD_BYTES = 64 * 1024
REPLY_TIMEOUT_S = 30.0  # a runner that does not read its answer within this is dropped
READS_PER_WAKE = 16  # reads of one socket per readiness, so that one fast stream cannot starve the rest
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error", 502: "Bad Gateway",
           503: "Service Unavailable", 507: "Insufficient Storage"}


class ModelLoop(SelectorLoop):
    """The loop thread (started on first use) and its pool. start() and close() are called from other
    threads; everything else runs in the loop thread."""

    name = "suzumio-model-loop"

    def __init__(self, clock=time.monotonic, resolve=socket.getaddrinfo, tls_context=None):
        super().__init__()
        self.clock = clock
        self.resolve = resolve
        self._tls_context = tls_context  # verifies https upstreams (default: the system's CAs, as the threaded path)
        self.open_exchanges = 0
        self.peak_exchanges = 0  # the most upstream exchanges open at once (bench/model_stream.py)
        self._soon = collections.deque()  # (callable, its call's item) handed to the loop thread
        self._pool = None
        self._timed = set()  # exchanges and replies with a wake_at
        self.waiting = set()  # calls waiting at their provider's gate (no socket registered, maybe no timer)
        self._next_due = math.inf  # no timer is due before this (see _timers)

    # -- called from other threads

    def start(self, forwarding, publish, finish, reply_sock=None, on_done=None):
        """Drive `forwarding` to its end. `publish(delta)` is called on the loop thread with each
        delta of a streamed answer; `finish(answer or SuzumioError)` then runs on the pool and answers
        the JSON value for the runner (or raises). With `reply_sock` (a handed-over connection) that
        value, or the error it raised, is written there as the HTTP answer; `on_done(value or error)`,
        when given, gets it too."""
        call = Call(self, forwarding, publish, finish, reply_sock, on_done)
        with self._lock:
            if self._closing:
                raise Unavailable("The model loop is shut down")
            if self._thread is None:
                self._start()
            self._soon.append((call.begin, call))
            self._wake()

    def tls_context(self):
        if self._tls_context is None:
            self._tls_context = ssl.create_default_context()
        return self._tls_context

    def run(self, forwarding, publish=None):
        """Drive `forwarding` on the loop and wait for its ModelAnswer (raises its SuzumioError)."""
        done = threading.Event()
        outcome = []

        def on_done(value):
            outcome.append(value)
            done.set()

        self.start(forwarding, publish, lambda answer: answer, on_done=on_done)
        done.wait()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def call_soon(self, callback, item=None):
        """Run `callback()` on the loop; should it fail, `item.crashed()` fails its call."""
        with self._lock:
            if self._closing:
                return
            self._soon.append((callback, item))
            self._wake()

    def submit(self, work, then, item=None):
        """Run `work()` on the pool, then `then(result or the exception it raised)` on the loop; answers
        the pool's future."""
        def job():
            try:
                result = work()
            except Exception as error:  # noqa: BLE001 - handed to the loop, which answers it in the error shape
                result = error
            self.call_soon(lambda: then(result), item)
        return self._pool.submit(job)

    def close(self):
        """Stop the loop: open calls are dropped (their runners see the connection close). Idempotent."""
        super().close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _start(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="suzumio-model-io")
        super()._start()

    # -- the loop thread

    def _step(self):
        now = self.clock()
        wait = None if self._next_due == math.inf else max(0.0, self._next_due - now)
        for key, mask in self._selector.select(wait):
            if key.data is None:
                self._woken()
            else:
                self._contain(key.data.ready, mask, item=key.data)
        while True:
            with self._lock:
                if not self._soon:
                    break
                callback, item = self._soon.popleft()
            self._contain(callback, item=item)
        if self.clock() >= self._next_due:
            self._timers()

    def _timers(self):
        """Fire what is due and find the next due time (a scan, only when some timer may be due)."""
        now = self.clock()
        due = [item for item in self._timed if item.wake_at <= now]
        for item in due:
            item.wake_at = math.inf
            self._timed.discard(item)
            self._contain(item.expired, item=item)
        self._next_due = min((item.wake_at for item in self._timed), default=math.inf)

    def _contain(self, step, *args, item=None):
        """A failure of one call's step fails that call (a 500 for its runner), never the loop."""
        try:
            step(*args)
        except Exception as error:
            error_id = uuid.uuid4().hex[:12]
            log.error("model loop: a call failed (error id %s)", error_id, exc_info=error)
            if item is not None:
                item.crashed(InternalError(f"Internal error (id {error_id})"))

    def set_timer(self, item, when):
        """`item.expired()` runs at `when` (monotonic seconds) unless set again or cleared (inf)."""
        item.wake_at = when
        if when == math.inf:
            self._timed.discard(item)
            return
        self._timed.add(item)
        # A later time leaves _next_due early: the scan then finds nothing due and moves it on.
        self._next_due = min(self._next_due, when)

    def register(self, sock, events, item):
        try:
            self._selector.modify(sock, events, item)
        except KeyError:
            self._selector.register(sock, events, item)

    def unregister(self, sock):
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def opened(self, change):
        self.open_exchanges += change
        self.peak_exchanges = max(self.peak_exchanges, self.open_exchanges)

    def _shut_down(self):
        with self._lock:
            self._closing = True
            self._soon.clear()
        for item in list(self._timed) + list(self.waiting):
            item.drop()
        for key in list(self._selector.get_map().values()):
            if key.data is not None:
                key.data.drop()
        self._close_selector()


class Call:
    """One runner request: its exchanges, one after another as the Forwarding decides, each after its
    turn at the provider's gate, then its reply."""

    def __init__(self, loop, forwarding, publish, finish, reply_sock, on_done):
        self.loop = loop
        self.forwarding = forwarding
        self.publish = publish
        self.finish = finish
        self.reply_sock = reply_sock
        self.on_done = on_done
        self.wake_at = math.inf  # a retry's delay, or when the gate asked to be pumped
        self.exchange = None
        self.waiting = False  # at the provider's gate
        self.dropped = self.replied = self.over = False  # over: dropped, or failing inside the loop

    def begin(self):
        if self.forwarding.enter(self._admit, self._wake):
            self._go()
        else:
            self.waiting = True
            self.loop.waiting.add(self)

    def _admit(self):
        """The gate lets the next exchange start (called on any thread)."""
        self.loop.call_soon(self._admitted, self)

    def _admitted(self):
        if self.over or self.replied:
            self.forwarding.leave(None)
            return
        self.waiting = False
        self.loop.waiting.discard(self)
        self.loop.set_timer(self, math.inf)
        self.forwarding.admitted()
        self._go()

    def _wake(self, when):
        """The gate asks to be pumped at `when` (called on any thread)."""
        self.loop.call_soon(lambda: self.loop.set_timer(self, when) if self.waiting else None, self)

    def _go(self):
        request = self.forwarding.request()
        self.exchange = Exchange(self, request)
        self.exchange.begin()

    def outcome(self, request, result):
        """An exchange ended with `result` (see Forwarding.outcome): answer, resend, or wait and retry."""
        self.exchange = None
        self.forwarding.leave(result)
        try:
            step = self.forwarding.outcome(request, result)
        except SuzumioError as error:
            step = error
        if isinstance(step, (ModelAnswer, SuzumioError)):
            self.loop.submit(lambda: self.finish(step), self.reply)
        elif step:
            self.loop.set_timer(self, self.loop.clock() + step)
        else:
            self.begin()

    def expired(self):
        if self.waiting:
            self.forwarding.pump()
        else:
            self.begin()

    def crashed(self, error):
        self.over, self.waiting = True, False
        self.loop.waiting.discard(self)
        if self.exchange is not None:
            self.exchange.abandon()
        self.forwarding.leave(None)
        self.loop.set_timer(self, math.inf)
        self.loop.submit(lambda: self.finish(error), self.reply)

    def reply(self, value):
        """Runs on the loop with finish()'s JSON value or the exception it raised."""
        if self.replied:
            return
        self.replied = True
        if self.on_done is not None:
            self.on_done(value)
        if self.reply_sock is not None:
            Reply(self.loop, self.reply_sock, *http_answer(value)).send()

    def drop(self):
        if self.dropped or self.replied:
            return
        self.dropped = self.over = True
        self.waiting = False
        self.loop.waiting.discard(self)
        self.forwarding.leave(None)
        self.loop.set_timer(self, math.inf)
        if self.reply_sock is not None:
            self.reply_sock.close()
        if self.on_done is not None:
            self.on_done(Unavailable("The model loop is shut down"))


def http_answer(value):
    """(status, body) of the runner's answer: the JSON value, or the error shape of what was raised."""
    if not isinstance(value, BaseException):
        return 200, encode_json(value)
    if isinstance(value, SuzumioError):
        return value.status, encode_json({"error": value.message})
    full = storage_error(value)
    if full is not None:
        log.warning("POST /runner/model: %s", full.message)
        return full.status, encode_json({"error": full.message})
    error_id = uuid.uuid4().hex[:12]
    log.error("POST /runner/model failed (error id %s)", error_id, exc_info=value)
    return 500, encode_json({"error": f"Internal error (id {error_id})"})


class Reply:
    """The HTTP answer written to a handed-over runner connection, non-blocking, then closed."""

    def __init__(self, loop, sock, status, body):
        self.loop = loop
        self.sock = sock
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", "Connection: close",
                f"Content-Length: {len(body)}", f"Content-Type: {JSON_TYPE}",
                f"Date: {email.utils.formatdate(usegmt=True)}", "Server: suzumio", f"{VERSION_HEADER}: {VERSION}",
                f"{NOSNIFF[0]}: {NOSNIFF[1]}"]
        self.pending = memoryview(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        self.wake_at = math.inf
        self.closed = False

    def send(self):
        self.sock.setblocking(False)
        self.ready(selectors.EVENT_WRITE)

    def ready(self, _mask):
        if self.closed:  # an event of this descriptor from before it was closed
            return
        try:
            while self.pending:
                self.pending = self.pending[self.sock.send(self.pending):]
        except BlockingIOError:
            self.loop.register(self.sock, selectors.EVENT_WRITE, self)
            if self.wake_at == math.inf:
                self.loop.set_timer(self, self.loop.clock() + REPLY_TIMEOUT_S)
            return
        except OSError:
            pass  # the runner left; its activation's end is the runner's business
        self.drop()

    def expired(self):
        log.info("a runner did not read its model answer within %.0f s; dropped", REPLY_TIMEOUT_S)
        self.drop()

    def crashed(self, _error):
        self.drop()

    def drop(self):
        self.closed = True
        self.loop.set_timer(self, math.inf)
        self.loop.unregister(self.sock)
        self.sock.close()


class Exchange:
    """One upstream HTTP/1.1 exchange over a non-blocking socket, as providers.open_exchange makes it
    with a blocking one, and with the same errors: EarlyTransportError (retried) until any of the answer
    arrived or once a connect failed or timed out, TransportError for a wait that timed out after the
    connect (not retried), StreamCut when the body broke off."""

    def __init__(self, call, request):
        self.call = call
        self.loop = call.loop
        self.request = request
        upstream = call.forwarding.upstream
        self.connect_timeout, self.idle_timeout, _overall = upstream.timeouts
        self.first_byte_timeout = upstream.first_byte if upstream.first_byte is not None else self.idle_timeout
        parts = urlsplit(upstream.url)
        self.tls = parts.scheme.lower() == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
        host_header = self.host if ":" not in self.host else f"[{self.host}]"
        if parts.port is not None:
            host_header += f":{parts.port}"
        # The request http.client writes for the same call.
        given = {name.lower() for name in upstream.headers}
        fields = [f"POST {target} HTTP/1.1",
                  *([f"Host: {host_header}"] if "host" not in given else []),
                  *(["Accept-Encoding: identity"] if "accept-encoding" not in given else []),
                  *(f"{name}: {value}" for name, value in upstream.headers.items()),
                  f"Content-Length: {len(request.payload)}"]
        self.out = memoryview(("\r\n".join(fields) + "\r\n\r\n").encode("latin-1") + request.payload)
        self.sock = None
        self.addresses = []
        self.connected = False
        self.state = "resolve"
        self.inbuf = bytearray()
        self.reader = None
        self.framing = None  # "chunked", "length" or "close"
        self.left = 0  # bytes left: of the body ("length"), of the current chunk ("chunked")
        self.chunk_state = "size"
        self.body_begun = False
        self.wake_at = math.inf
        self.done = False

    # -- the states

    def begin(self):
        self.loop.opened(1)
        self._limit(self.connect_timeout)
        try:
            ipaddress.ip_address(self.host)
            literal = True
        except ValueError:
            literal = False
        if literal:
            try:
                self._resolved(self._lookup())
            except OSError as error:
                self._resolved(error)
        else:
            self.loop.submit(self._lookup, self._resolved, self)

    def _lookup(self):
        return self.loop.resolve(self.host, self.port, type=socket.SOCK_STREAM)

    def _resolved(self, result):
        if self.done:
            return
        if isinstance(result, BaseException):
            self._fail(providers.EarlyTransportError(_reason(result)))
            return
        self.addresses = list(result)
        self._connect_next(None)

    def _connect_next(self, error):
        if not self.addresses:
            self._fail(providers.EarlyTransportError(_reason(error or OSError("no address"))))
            return
        family, kind, proto, _name, address = self.addresses.pop(0)
        self._close_socket()
        self.state = "connect"
        try:
            self.sock = socket.socket(family, kind, proto)
            self.sock.setblocking(False)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = self.sock.connect_ex(address)
        except OSError as failure:
            self._connect_next(failure)
            return
        if code not in (0, errno.EINPROGRESS):
            self._connect_next(OSError(code, os.strerror(code)))
            return
        self.loop.register(self.sock, selectors.EVENT_WRITE, self)

    def ready(self, mask):
        if self.done:  # an event of this descriptor from before it was closed
            return
        try:
            if self.state == "connect":
                code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    self._connect_next(OSError(code, os.strerror(code)))
                    return
                if self.tls:
                    self.sock = self.loop.tls_context().wrap_socket(self.sock, server_hostname=self.host,
                                                                    do_handshake_on_connect=False)
                    self.state = "handshake"
                else:
                    self._connected()
            if self.state == "handshake":
                self.sock.do_handshake()
                self._connected()
            if self.state == "send":
                while self.out:
                    self.out = self.out[self.sock.send(self.out):]
                self.state = "head"
                self.loop.register(self.sock, selectors.EVENT_READ, self)
                return
            if self.state in ("head", "body"):
                self._read()
        except ssl.SSLWantReadError:
            self.loop.register(self.sock, selectors.EVENT_READ, self)
        except (ssl.SSLWantWriteError, BlockingIOError):
            self.loop.register(self.sock, selectors.EVENT_WRITE, self)
        except (OSError, ValueError) as error:
            self._broken(error)
        except TransportError as error:
            self._fail(error)

    def _connected(self):
        """Connected (TLS included): from now on a wait that times out is not retried."""
        self.connected = True
        self.state = "send"
        self._limit(self.first_byte_timeout)

    def _read(self):
        for _ in range(READS_PER_WAKE):
            try:
                data = self.sock.recv(READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError):
                return
            if not data:
                self._ended()
                return
            # Until the body's first byte (a stream's first event, a whole answer once it is done) the
            # first-byte timeout applies, between bytes after it the idle one.
            self._limit(self.idle_timeout if self.body_begun else self.first_byte_timeout)
            if self.state == "head":
                self.inbuf += data
                if not self._head():
                    continue
                if self.done:
                    return
                data, self.inbuf = bytes(self.inbuf), bytearray()
                if not data:
                    continue
            if not self.body_begun:
                self.body_begun = True
                self._limit(self.idle_timeout)
            if self._body(data):
                return
        if self.tls and self.sock.pending():  # decrypted bytes the selector cannot see
            self.loop.call_soon(lambda: None if self.done else self.ready(selectors.EVENT_READ), self)

    def _head(self):
        """The answer's head once it is all in (a 1xx head is skipped); False while more is needed."""
        while True:
            end = self.inbuf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.inbuf) > MAX_HEAD_BYTES:
                    raise providers.EarlyTransportError("got more than 65536 bytes when reading the head")
                return False
            lines = bytes(self.inbuf[:end]).decode("iso-8859-1").split("\r\n")
            del self.inbuf[:end + 4]
            version, _, rest = lines[0].partition(" ")
            code = rest.partition(" ")[0]
            if not version.startswith("HTTP/") or len(code) != 3 or not code.isdigit():
                raise providers.EarlyTransportError(f"BadStatusLine({lines[0]!r})")
            status = int(code)
            if 100 <= status < 200:
                continue
            headers = {}
            for line in lines[1:]:
                name, colon, value = line.partition(":")
                if colon:
                    headers[name.strip().lower()] = value.strip()
            self._answer_head(version, status, headers)
            return True

    def _answer_head(self, version, status, headers):
        self.state = "body"
        self.status, self.headers = status, headers
        publish = self.call.publish if self.request.stream else None
        self.reader = providers.AnswerReader(self.call.forwarding.upstream.kind, status, headers,
                                             providers.Deltas(publish, self.loop.clock))
        length = headers.get("content-length", "")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.framing = "chunked"
        elif length.isdigit():
            self.framing, self.left = "length", int(length)
        else:
            self.framing = "close"
        if status in (204, 304) or (self.framing == "length" and self.left == 0):
            self._complete()

    def _body(self, data):
        """Decode the body's framing and feed the reader; True once the exchange is over."""
        if self.framing == "chunked":
            self.inbuf += data
            return self._chunks()
        if self.framing == "length":
            data = data[:self.left]
            self.left -= len(data)
            if self.reader.feed(data) or self.left == 0:
                self._complete()
                return True
            return False
        if self.reader.feed(data):
            self._complete()
            return True
        return False

    def _chunks(self):
        buffer = self.inbuf
        while True:
            if self.chunk_state == "size":
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD_BYTES:
                        raise providers.StreamCut("chunk size line too long")
                    return False
                size = bytes(buffer[:end]).split(b";")[0].strip()
                del buffer[:end + 2]
                try:
                    self.left = int(size, 16)
                except ValueError:
                    raise providers.StreamCut(f"invalid chunk size {size[:20]!r}") from None
                if self.left == 0:
                    self._complete()
                    return True
                self.chunk_state = "data"
            elif self.chunk_state == "data":
                if not buffer:
                    return False
                piece = bytes(buffer[:self.left])
                del buffer[:len(piece)]
                self.left -= len(piece)
                if self.left == 0:
                    self.chunk_state = "crlf"
                if self.reader.feed(piece):
                    self._complete()
                    return True
            else:
                if len(buffer) < 2:
                    return False
                del buffer[:2]
                self.chunk_state = "size"

    def _ended(self):
        """The server closed the connection."""
        if self.state == "head":
            raise providers.EarlyTransportError("Remote end closed connection without response")
        if self.framing == "close":
            self._complete()
        elif self.framing == "length":
            raise providers.StreamCut(f"IncompleteRead({self.left} more expected)")
        else:
            raise providers.StreamCut("IncompleteRead(0 bytes read)")

    # -- the end

    def _complete(self):
        try:
            status, text, usage = self.reader.finish()
        except TransportError as error:
            self._fail(error)
            return
        self._end((status, self.headers, text, usage))

    def _broken(self, error):
        """A socket error: before the head it fails the connection, after some of the body it cuts it."""
        if self.state == "connect":
            self._connect_next(error)
        elif self.state == "body":
            self._fail(providers.StreamCut(_reason(error)))
        else:
            self._fail(providers.EarlyTransportError(_reason(error)))

    def _fail(self, error):
        self._end(error)

    def _end(self, result):
        if self.done:
            return
        self.done = True
        self.loop.opened(-1)
        self.loop.set_timer(self, math.inf)
        self._close_socket()
        self.call.outcome(self.request, result)

    def _close_socket(self):
        if self.sock is not None:
            self.loop.unregister(self.sock)
            self.sock.close()
            self.sock = None

    def _limit(self, seconds):
        """The next wait ends after `seconds` (None: none), and at the request's deadline at the latest."""
        now = self.loop.clock()
        when = math.inf if seconds is None else now + seconds
        if self.request.deadline is not None:
            when = min(when, self.request.deadline)
        self.loop.set_timer(self, when)

    def expired(self):
        # A wait after the connect is not retried (the server may be computing a long answer).
        error = TransportError("timed out") if self.connected else providers.EarlyTransportError("timed out")
        self._end(error)

    def crashed(self, error):
        self.abandon()
        self.call.crashed(error)

    def drop(self):
        self.abandon()
        self.call.drop()

    def abandon(self):
        """Close the exchange without an outcome."""
        if not self.done:
            self.done = True
            self.loop.opened(-1)
        self.loop.set_timer(self, math.inf)
        self._close_socket()


def _reason(error):
    return providers._reason(error) if isinstance(error, BaseException) else str(error)
