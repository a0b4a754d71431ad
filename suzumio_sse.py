"""The SSE streams of the user listener (docs/http-api.md), served off Waitress's worker threads.

A stream request is checked and its replay read by a worker thread like any route; then the route hands
the connection over (`hand_off`, a Waitress task that can give up its socket) and the worker thread is
free again. One hub thread holds every open stream: for each project with clients it reads each new
event once, encodes it once, frames the batch once and sends that same bytes object to every client
whose cursor is there, with non-blocking writes over an epoll selector. A stream costs a socket, not a
thread, so no number of open control rooms can starve the routes of workers, and a burst costs one wake-
up and one send per client per round instead of one thread switch, Waitress write and copy per client
per batch.

Rounds: the hub is woken by the project's commits in this process (`Changes.listen`); the first commit
after a pause goes out at once; while commits keep coming a project's next round waits STREAM_COALESCE
seconds and at least STREAM_DUTY times the CPU its last round's sending took, so the fan-out takes no
more than about 1/(1 + STREAM_DUTY) of the controller while appends keep it busy, however many clients
listen; once STREAM_QUIET passes without a commit the burst is over and what waits goes out at once.
(Each send gives up the GIL and takes it back from the writer: fewer, larger rounds are what keeps 30
clients as fast as one.) Writes by other processes (a CLI command beside `serve`) are found by a read at
most every `poll_seconds`. A client that stops reading is dropped once MAX_PENDING_BYTES wait for it;
its EventSource reconnects with Last-Event-ID and resumes from the store."""
import bisect
import collections
import contextlib
import email.utils
import json
import logging
import math
import selectors
import time

import waitress.channel
import waitress.task

from suzumio_selector_loop import SelectorLoop

log = logging.getLogger(__name__)

HAND_OFF = "suzumio.hand_off"  # environ key: the task's hand_off (absent outside suzumio_api.Server)
SSE_BATCH = 500  # events read from a store at once
FEED_BUFFER = 2000  # encoded frames each project's feed keeps for clients a little behind it
KEEP_ALIVE = b": keep-alive\n\n"
STREAM_COALESCE = 0.003  # seconds: the shortest gap between two rounds of one project
STREAM_DUTY = 19  # a round waits at least this many times its own CPU time before the next one
STREAM_QUIET = 0.005  # seconds without a commit that end a burst: its rest goes out without waiting
MAX_PENDING_BYTES = 16 * 1024 * 1024  # unsent bytes a client may have before it is dropped
BEHIND_PENDING_BYTES = 1024 * 1024  # a client behind the feed gets its next store batch below this
HAND_OFF_WAIT = 10.0  # seconds a hand-off waits for an earlier answer on the connection to be sent
LAST_CHUNK = b"0\r\n\r\n"


def sse_frame(row):
    data = json.dumps(row, separators=(",", ":"), ensure_ascii=False)
    return f"id: {row['id']}\nevent: {row['type']}\ndata: {data}\n\n".encode()


def in_order(events, live):
    """The frames of new events ((rowid, frame), by rowid) and of live deltas ((rowid of the newest event
    committed before it was published, frame), as published) joined in the order they happened."""
    out, taken = [], 0
    for after, frame in live:
        while taken < len(events) and events[taken][0] <= after:
            out.append(events[taken][1])
            taken += 1
        out.append(frame)
    out += [frame for _rowid, frame in events[taken:]]
    return b"".join(out)


def chunk(data):
    """`data` as one chunk of a chunked HTTP/1.1 body."""
    return b"%X\r\n%s\r\n" % (len(data), data)


# ---------------------------------------------------------------- the hand-off from Waitress

class HandOffTask(waitress.task.WSGITask):
    """A Waitress task whose app may take the connection: environ[HAND_OFF]() returns a socket (a
    duplicate of the connection's) that the caller then owns. Waitress writes nothing more for this
    request and closes its own copy once the app returns; the connection lives on in the duplicate."""

    def get_environment(self):
        environ = super().get_environment()
        environ[HAND_OFF] = self.hand_off
        return environ

    def hand_off(self):
        """The connection's socket, once an earlier answer on it has been sent; None when the client is
        gone (or that answer could not be sent within HAND_OFF_WAIT)."""
        channel = self.channel
        deadline = time.monotonic() + HAND_OFF_WAIT
        with channel.outbuf_lock:
            while channel.connected and channel.total_outbufs_len and time.monotonic() < deadline:
                channel.server.pull_trigger()  # the loop flushes and notifies below the watermark
                channel.outbuf_lock.wait(0.05)
            if not channel.connected or channel.total_outbufs_len:
                return None
            sock = channel.socket.dup()
        self.wrote_header = True  # Waitress must not write this answer's head (finish() skips it)
        self.close_on_finish = True  # and closes its copy of the socket when the app returns
        return sock


class HandOffChannel(waitress.channel.HTTPChannel):
    task_class = HandOffTask


def install_hand_off(server):
    """Make a Waitress server (one listener) create HandOffChannels for the connections it accepts."""
    server.channel_class = HandOffChannel


def response_head(protocol, headers):
    """The head of a stream's answer as Waitress would write it: HTTP/1.1 chunked, HTTP/1.0 delimited by
    the connection's close; `Connection: close` either way (a stream ends only with its connection)."""
    chunked = protocol != "HTTP/1.0"
    fields = [*headers, ("Connection", "close"), ("Date", email.utils.formatdate(usegmt=True)),
              ("Server", "suzumio")]
    if chunked:
        fields.append(("Transfer-Encoding", "chunked"))
    lines = [f"{'HTTP/1.1' if chunked else 'HTTP/1.0'} 200 OK"] + [f"{name}: {value}" for name, value in sorted(fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), chunked


# ---------------------------------------------------------------- the hub

class Client:
    """One open stream: its socket, framing, event cursor, unsent bytes and last write."""

    def __init__(self, sock, project_id, cursor, chunked):
        self.sock = sock
        self.project_id = project_id
        self.cursor = cursor  # rowid of the last event sent
        self.chunked = chunked
        self.pending = collections.deque()  # memoryviews not yet sent, oldest first
        self.pending_bytes = 0
        self.last_write = time.monotonic()
        self.open = True

    def frame(self, data):
        return chunk(data) if self.chunked else data


class ProjectFeed:
    """One project's events for the hub thread: the newest FEED_BUFFER (at least) encoded frames after
    `base`, read from the store once for every client, its clients, and when its next round is due."""

    def __init__(self, store, live_cursor):
        self.base = self.cursor = store.latest_event_rowid()
        self.rowids = []
        self.frames = []
        self.clients = []
        self.live_cursor = live_cursor
        self.read_at = time.monotonic()
        self.next_round = 0.0  # monotonic time before which no round runs (coalescing)
        self.quiet_at = None  # when to look again whether commits still come (see StreamHub._due)
        self.seen_commits = 0

    def read(self, store):
        """Read and encode the events after the cursor; the new (rowid, frame) pairs."""
        fresh = []
        while True:
            rows = store.events_after(self.cursor, SSE_BATCH)
            fresh += [(rowid, sse_frame(row)) for rowid, row in rows]
            if rows:
                self.cursor = rows[-1][0]
            if len(rows) < SSE_BATCH:
                break
        self.rowids += [rowid for rowid, _frame in fresh]
        self.frames += [frame for _rowid, frame in fresh]
        if len(self.frames) > 2 * FEED_BUFFER:
            cut = len(self.frames) - FEED_BUFFER
            self.base = self.rowids[cut - 1]
            del self.rowids[:cut], self.frames[:cut]
        self.read_at = time.monotonic()
        return fresh

    def after(self, cursor):
        """The (rowid, frame) pairs after `cursor`, when the buffer still holds them all; None otherwise."""
        if cursor < self.base:
            return None
        start = bisect.bisect_right(self.rowids, cursor)
        return list(zip(self.rowids[start:], self.frames[start:], strict=True))


class StreamHub(SelectorLoop):
    """Every open stream of one listener, served by one thread (see the module's text). open() is called
    by the worker thread that handed a connection over; everything else runs in the hub thread."""

    name = "suzumio-sse"

    def __init__(self, root, poll_seconds, keep_alive_seconds):
        super().__init__()
        self.root = root
        self.poll_seconds = poll_seconds
        self.keep_alive_seconds = keep_alive_seconds
        self.steps = 0  # passes of the hub's loop (an idle one makes about one a second, for keep-alives)
        self._arrivals = []  # (client, head and replay) handed over, not yet taken by the hub thread
        self._dirty = set()  # projects with news (a commit, a client to bring up) since their last round
        self._watched = set()  # projects with clients
        self._feeds = {}
        self._clients = set()
        self._next_keep_alive = 0.0
        self._wait = None  # seconds the next select may sleep (None: until woken)
        self._safety_at = math.inf  # no feed's read for other processes' writes is due before this
        self._commits = {}  # project -> commits seen by changed(), for the quiet check

    # -- called from other threads

    def open(self, sock, project_id, cursor, head, replay, chunked):
        """Take a handed-over connection of `project_id` whose client has the events up to `cursor`:
        send it `head` (the answer's head) and `replay` (frames), then every event after the cursor."""
        sock.setblocking(False)
        client = Client(sock, project_id, cursor, chunked)
        with self._lock:
            if self._closing:
                sock.close()
                return
            if self._thread is None:
                self._start()
            self._arrivals.append((client, head + client.frame(replay or KEEP_ALIVE)))
            self._wake()

    def changed(self, project_id):
        """Changes.listen callback: a commit of `project_id` in this process (any thread)."""
        with self._lock:
            if project_id not in self._watched:
                return
            self._commits[project_id] = self._commits.get(project_id, 0) + 1
            if project_id in self._dirty:
                return
            self._dirty.add(project_id)
            self._wake()

    def stream_count(self):
        with self._lock:
            return len(self._clients) + len(self._arrivals)

    def _start(self):
        self.root.changes.listen(self.changed)
        super()._start()

    # -- the hub thread (close(), which ends every stream with its last chunk, stops it)

    def _step(self):
        self.steps += 1
        for key, mask in self._selector.select(self._wait):
            if key.data is None:
                self._woken()
                continue
            client = key.data
            if mask & selectors.EVENT_READ:
                self._read(client)
            if client.open and mask & selectors.EVENT_WRITE:
                self._flush(client)
        if self._closing:
            return
        self._admit()
        now = time.monotonic()
        if now >= self._next_keep_alive:
            self._keep_alive(now)
        wake = self._next_keep_alive if self._clients else math.inf
        # The projects with news, and every project when one's read for other processes' writes is due.
        everyone = now >= self._safety_at
        with self._lock:
            candidates = set(self._feeds) if everyone else set(self._dirty)
        for project_id in candidates:
            feed = self._feeds.get(project_id)
            if feed is None:
                continue
            if self._due(project_id, feed, now) <= now:
                try:
                    self._round(project_id, feed)
                except Exception:  # one project's store failing ends its streams only
                    log.exception("SSE round of %s failed; its streams end (clients reconnect)", project_id)
                    for client in list(feed.clients):
                        self._drop(client)
                    continue
            wake = min(wake, self._due(project_id, feed, time.monotonic()))
        if everyone:
            reads = [feed.read_at for feed in self._feeds.values()]
            self._safety_at = min(reads) + self.poll_seconds if reads else math.inf
        wake = min(wake, self._safety_at)
        self._wait = None if wake == math.inf else max(0.0, wake - time.monotonic())

    def _due(self, project_id, feed, now):
        """When the project's next round runs: at once for news after a pause; while commits keep coming,
        at `next_round`, or earlier once STREAM_QUIET passed without a commit (the burst is over: what
        waits goes out instead of sitting out the interval); at the latest after `poll_seconds` (writes
        by other processes)."""
        with self._lock:
            dirty = project_id in self._dirty
            commits = self._commits.get(project_id, 0)
        due = feed.read_at + self.poll_seconds
        if not dirty:
            return due
        if now >= feed.next_round:
            return now
        if feed.quiet_at is not None and now >= feed.quiet_at and commits == feed.seen_commits:
            return now
        if feed.quiet_at is None or now >= feed.quiet_at:
            feed.seen_commits, feed.quiet_at = commits, now + STREAM_QUIET
        return min(due, feed.next_round, feed.quiet_at)

    def _admit(self):
        with self._lock:
            arrivals, self._arrivals = self._arrivals, []
        for client, first in arrivals:
            feed = self._feeds.get(client.project_id)
            if feed is None:
                store = self.root.open_project(client.project_id)
                feed = self._feeds[client.project_id] = ProjectFeed(store, self.root.live.cursor(client.project_id))
                self._safety_at = min(self._safety_at, feed.read_at + self.poll_seconds)
                with self._lock:
                    self._watched.add(client.project_id)
            feed.clients.append(client)
            self._clients.add(client)
            self._selector.register(client.sock, selectors.EVENT_READ, client)
            self._send(client, first)
            if client.open and client.cursor != feed.cursor:
                self._mark(client.project_id)  # its next round brings it to the feed's cursor

    def _round(self, project_id, feed):
        """Send every client of the project what it lacks: the new events (read and encoded once, framed
        once for every client at the feed's cursor) and the live deltas; a client behind the buffer gets
        its next batch from the store instead."""
        with self._lock:
            self._dirty.discard(project_id)  # a commit from now on makes the project due again
        feed.quiet_at = None
        store = self.root.open_project(project_id)
        previous = feed.cursor
        fresh = feed.read(store)
        live, feed.live_cursor = self.root.live.after(project_id, feed.live_cursor)
        began = time.thread_time()  # the fan-out's own cost, which grows with the clients
        shared = {}  # chunked or not -> the framed batch of the clients that were at `previous`
        for client in list(feed.clients):
            if client.cursor == previous:
                if not fresh and not live:
                    continue
                framed = shared.get(client.chunked)
                if framed is None:
                    framed = shared[client.chunked] = client.frame(in_order(fresh, live))
            else:
                batch = feed.after(client.cursor)
                if batch is None:
                    self._catch_up(store, feed, client)
                    continue
                framed = client.frame(in_order(batch, live)) if batch or live else None
            client.cursor = feed.cursor
            if framed:
                self._send(client, framed)
        if fresh or live:
            spent = time.thread_time() - began
            feed.next_round = time.monotonic() + max(STREAM_COALESCE, STREAM_DUTY * spent)

    def _catch_up(self, store, feed, client):
        """A client behind the feed's buffer (Last-Event-ID far back): its next SSE_BATCH events from the
        store once it has read most of what it was sent. While it is still behind, the next round comes
        as soon as it may (the project stays marked), or once it has read enough (_flush marks it)."""
        if client.pending_bytes < BEHIND_PENDING_BYTES:
            rows = store.events_after(client.cursor, SSE_BATCH)
            if rows:
                client.cursor = rows[-1][0]
                self._send(client, client.frame(b"".join(sse_frame(row) for _rowid, row in rows)))
        if client.open and client.cursor != feed.cursor and client.pending_bytes < BEHIND_PENDING_BYTES:
            self._mark(client.project_id)

    def _mark(self, project_id):
        """The project's next step runs a round as soon as its interval allows (from the hub thread)."""
        with self._lock:
            self._dirty.add(project_id)

    def _keep_alive(self, now):
        for client in list(self._clients):
            if now - client.last_write >= self.keep_alive_seconds:
                self._send(client, client.frame(KEEP_ALIVE))
        self._next_keep_alive = now + min(1.0, max(0.05, self.keep_alive_seconds / 4))

    def _send(self, client, data):
        if not client.open:
            return
        client.last_write = time.monotonic()
        view = memoryview(data)
        if not client.pending:
            try:
                sent = client.sock.send(view)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._drop(client)
                return
            view = view[sent:]
            if not view:
                return
            self._selector.modify(client.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, client)
        client.pending.append(view)
        client.pending_bytes += len(view)
        if client.pending_bytes > MAX_PENDING_BYTES:
            log.info("SSE client of %s dropped: %d bytes unread", client.project_id, client.pending_bytes)
            self._drop(client)

    def _flush(self, client):
        while client.pending:
            view = client.pending[0]
            try:
                sent = client.sock.send(view)
            except BlockingIOError:
                return
            except OSError:
                self._drop(client)
                return
            client.pending_bytes -= sent
            if sent < len(view):
                client.pending[0] = view[sent:]
                return
            client.pending.popleft()
        self._selector.modify(client.sock, selectors.EVENT_READ, client)
        feed = self._feeds.get(client.project_id)
        if feed is not None and client.cursor != feed.cursor:  # a client catching up has room for more
            self._mark(client.project_id)

    def _read(self, client):
        """A stream's client sends nothing after its request: end of file (or an error) means it left."""
        try:
            data = client.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)

    def _drop(self, client):
        if not client.open:
            return
        client.open = False
        self._clients.discard(client)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(client.sock)
        client.sock.close()
        feed = self._feeds.get(client.project_id)
        if feed is not None:
            feed.clients.remove(client)
            if not feed.clients:
                del self._feeds[client.project_id]
                with self._lock:
                    self._watched.discard(client.project_id)
                    self._dirty.discard(client.project_id)
                    self._commits.pop(client.project_id, None)

    def _shut_down(self):
        with self._lock:
            self._closing = True
            arrivals, self._arrivals = self._arrivals, []
        for client, _first in arrivals:
            client.sock.close()
        for client in list(self._clients):
            if client.chunked and not client.pending:
                with contextlib.suppress(OSError):
                    client.sock.send(LAST_CHUNK)
            self._drop(client)
        self.root.changes.unlisten(self.changed)
        self._close_selector()
