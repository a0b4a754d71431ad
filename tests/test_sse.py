"""The SSE stream (docs/http-api.md): replay, rowid polling without loss or duplicates, Last-Event-ID
resume, keep-alive comments, and many open streams beside ordinary requests."""
import contextlib
import itertools
import json
import socket
import threading
import time

import pytest
from api_fixtures import init_project, project_yaml, serving
from conftest import wait_until
from sse_fixtures import SseClient

import suzumio_api
import suzumio_sse
import suzumio_store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def service_options():
    return {"threads": 16, "keep_alive_seconds": 1.0}  # the demo project holds 2 events: init + start


def add_events(store, count, prefix="test.event"):
    for index in range(count):
        store.append_event(prefix, {"n": index})


def stored_ids(store):
    return [row["id"] for row in reversed(store.list_events(1000))]


def test_replay_sends_the_newest_events_oldest_first_then_new_ones(service, demo):
    add_events(demo, 3)  # 5 events in all
    newest = stored_ids(demo)[-3:]
    client = SseClient(service, "/api/projects/demo/stream?limit=3")
    try:
        assert client.response.status == 200
        assert client.response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
        assert client.response.getheader("Cache-Control") == "no-cache"
        assert client.response.getheader("X-Content-Type-Options") == "nosniff"
        wait_until(lambda: len(client.snapshot()) >= 3, 1, message="the replay")
        replay = client.snapshot()
        assert [e["id"] for e in replay] == newest
        row = {r["id"]: r for r in demo.list_events(10)}[newest[-1]]
        assert replay[-1]["lines"] == [f"id: {row['id']}", f"event: {row['type']}",
                                       "data: " + json.dumps(row, separators=(",", ":"), ensure_ascii=False)]

        posted = service.post("/api/projects/demo/messages", {"recipient": "worker", "body": "héllo"})
        assert posted.status_code == 200
        wait_until(lambda: {"message.created", "signal.created"} <= {e["event"] for e in client.snapshot()[3:]},
                   3, message="the message events")
        live = client.snapshot()[3:]
        assert all(e["id"].startswith("evt_") for e in live)
        assert "héllo" in next(e for e in live if e["event"] == "message.created")["data"]["data_json"]
    finally:
        client.close()


def test_keep_alive_comment_is_sent_when_nothing_happens(service):
    client = SseClient(service, "/api/projects/demo/stream")
    try:
        wait_until(lambda: len(client.snapshot()) == 2, 2, message="the replay")
        wait_until(lambda: ": keep-alive" in client.comments, 4, message="a keep-alive comment")
    finally:
        client.close()


def test_default_keep_alive_interval_is_fifteen_seconds():
    assert suzumio_api.DEFAULT_KEEP_ALIVE_SECONDS == 15.0
    assert suzumio_api.DEFAULT_POLL_SECONDS <= 1.0


def test_a_burst_larger_than_the_replay_limit_arrives_whole_and_in_order(service, demo):
    client = SseClient(service, "/api/projects/demo/stream?limit=100")
    try:
        wait_until(lambda: len(client.snapshot()) == 2, 2, message="the replay")
        with demo.write() as tx:
            for index in range(250):
                demo.add_event(tx, "burst", {"n": index})  # one transaction: all share one millisecond
        wait_until(lambda: len(client.snapshot()) >= 252, 5, message="the burst")
        burst = [e for e in client.snapshot() if e["event"] == "burst"]
        assert [json.loads(e["data"]["data_json"])["n"] for e in burst] == list(range(250))
        assert len({e["id"] for e in client.snapshot()}) == len(client.snapshot()) == 252
    finally:
        client.close()


def test_last_event_id_resumes_after_that_event_without_loss_or_duplicates(service, demo):
    add_events(demo, 3)
    ids = stored_ids(demo)  # e1..e5
    client = SseClient(service, "/api/projects/demo/stream?limit=100", {"Last-Event-ID": ids[1]})
    try:
        wait_until(lambda: len(client.snapshot()) >= 3, 2, message="the missed events")
        add_events(demo, 2, prefix="after")
        wait_until(lambda: len(client.snapshot()) >= 5, 3, message="the new events")
        assert [e["id"] for e in client.snapshot()] == stored_ids(demo)[2:]
    finally:
        client.close()
    unknown = SseClient(service, "/api/projects/demo/stream?limit=100", {"Last-Event-ID": "evt_nope"})
    try:
        wait_until(lambda: len(unknown.snapshot()) >= 7, 2, message="the normal replay")
        assert [e["id"] for e in unknown.snapshot()] == stored_ids(demo)
    finally:
        unknown.close()


def test_health_answers_within_a_second_with_eight_streams_open(service):
    clients = [SseClient(service, "/api/projects/demo/stream") for _ in range(8)]
    try:
        wait_until(lambda: all(len(c.snapshot()) == 2 for c in clients), 5, message="eight streams")
        started = time.monotonic()
        assert service.get("/health", timeout=1).status_code == 200
        assert time.monotonic() - started < 1
    finally:
        for client in clients:
            client.close()


def test_disconnected_clients_free_their_threads(service):
    clients = [SseClient(service, "/api/projects/demo/stream") for _ in range(16)]
    wait_until(lambda: all(len(c.snapshot()) == 2 for c in clients), 5, message="sixteen streams")
    for client in clients:
        client.close()
    assert service.get("/health", timeout=5).status_code == 200
    others = [SseClient(service, "/api/projects/demo/stream") for _ in range(15)]
    try:
        wait_until(lambda: all(len(c.snapshot()) == 2 for c in others), 5, message="fifteen new streams")
        assert service.get("/health", timeout=5).status_code == 200
    finally:
        for client in others:
            client.close()


def test_forty_streams_do_not_block_posting_messages(tmp_path):
    with serving(tmp_path / "root", threads=64) as service:
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        clients = [SseClient(service, "/api/projects/demo/stream") for _ in range(40)]
        try:
            wait_until(lambda: all(len(c.snapshot()) == 1 for c in clients), 10, message="forty streams")
            started = time.monotonic()
            posted = service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "hi"}, timeout=5)
            assert posted.status_code == 200 and time.monotonic() - started < 2
            wait_until(lambda: all(any(e["event"] == "message.created" for e in c.snapshot()) for c in clients),
                       5, message="every stream to see the message")
            assert demo.project_stats()["messageCount"] == 1
        finally:
            for client in clients:
                client.close()


def test_closing_the_server_ends_open_streams(tmp_path):
    with serving(tmp_path / "root") as service:
        init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        client = SseClient(service, "/api/projects/demo/stream")
        wait_until(lambda: len(client.snapshot()) == 1, 2, message="the replay")
        started = time.monotonic()
    assert time.monotonic() - started < 8
    client.thread.join(5)
    assert not client.thread.is_alive()


class RecordingSocket:
    """One end of a real socket pair handed to a StreamHub, noting when each send() went out and what it
    sent (the server side's own timing, which a reader's clock cannot give under load)."""

    def __init__(self, sock):
        self.sock = sock
        self.sends = []  # (time.monotonic(), bytes sent)

    def send(self, data):
        sent = self.sock.send(data)
        self.sends.append((time.monotonic(), bytes(data[:sent])))
        return sent

    def __getattr__(self, name):
        return getattr(self.sock, name)


@contextlib.contextmanager
def hub_client(root, store, cursor, poll_seconds=1.0):
    """A StreamHub of `root` with one chunked client of `store` at `cursor`, whose peer end a thread
    drains: the client's RecordingSocket."""
    hub = suzumio_sse.StreamHub(root, poll_seconds=poll_seconds, keep_alive_seconds=30.0)
    ours, peer = socket.socketpair()
    recording = RecordingSocket(ours)
    drain = threading.Thread(target=lambda: all(iter(lambda: peer.recv(1 << 20), b"")), daemon=True)
    drain.start()
    try:
        hub.open(recording, store.project_id, cursor, b"HEAD\r\n\r\n", b"", True)
        yield recording
    finally:
        hub.close()
        drain.join(5)
        peer.close()


def chunk_frames(data):
    """The SSE frames of one chunk of a chunked body (its size line stripped)."""
    size, _, rest = data.partition(b"\r\n")
    assert int(size, 16) == len(rest) - 2 and rest.endswith(b"\r\n"), data[:80]
    return rest[:-2].split(b"\n\n")[:-1]


def test_a_burst_is_sent_in_rounds_at_least_the_coalescing_interval_apart(service, demo):
    """While commits keep coming, a client's writes are at least STREAM_COALESCE apart and each
    carries everything that arrived meanwhile, in order; after a pause, the next event goes out at once
    in its own write."""
    with hub_client(service.root, demo, demo.latest_event_rowid()) as sock:
        wait_until(lambda: sock.sends, 2, message="the head and the empty replay's keep-alive")
        assert sock.sends[0][1] == b"HEAD\r\n\r\n" + suzumio_sse.chunk(suzumio_sse.KEEP_ALIVE)
        for index in range(300):  # 300 commits as fast as this thread makes them
            demo.append_event("burst", {"n": index})
        wait_until(lambda: b"".join(data for _, data in sock.sends).count(b"event: burst\n") == 300, 5,
                   message="the burst")
        rounds = sock.sends[1:]
        assert len(rounds) < 300  # commits that arrived while the hub waited went out together
        gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(rounds)]
        assert min(gaps) >= suzumio_sse.STREAM_COALESCE * 0.95, gaps  # a loaded machine only widens them
        frames = [frame for _, data in rounds for frame in chunk_frames(data)]
        assert [json.loads(json.loads(f.split(b"data: ", 1)[1])["data_json"])["n"] for f in frames] \
            == list(range(300))

        quiet = len(sock.sends)
        time.sleep(0.3)  # the pause: far beyond any round's interval
        demo.append_event("lone", {})
        wait_until(lambda: len(sock.sends) > quiet, 2, message="the lone event")
        assert len(sock.sends) == quiet + 1
        (lone,) = chunk_frames(sock.sends[quiet][1])
        assert b"event: lone\n" in lone


def test_commits_that_keep_coming_wait_for_the_interval_and_a_pause_sends_them(service, demo, monkeypatch):
    """Within a round's interval (made 1,000 s here, and the safety read as rare) commits less than
    STREAM_QUIET apart are held back;
    once the writer pauses for STREAM_QUIET, everything that waits goes out in one write, long before the
    interval ends."""
    monkeypatch.setattr(suzumio_sse, "STREAM_DUTY", 1e9)
    monkeypatch.setattr(suzumio_sse, "STREAM_COALESCE", 1000.0)
    monkeypatch.setattr(suzumio_sse, "STREAM_QUIET", 0.3)  # wide: a slow machine's hiccup is not a pause
    with hub_client(service.root, demo, demo.latest_event_rowid(), poll_seconds=1000.0) as sock:
        wait_until(lambda: sock.sends, 2, message="the head")
        demo.append_event("first", {})
        wait_until(lambda: len(sock.sends) == 2, 2, message="the first event, at once")
        for index in range(10):  # 10 ms apart: the burst goes on
            demo.append_event("held", {"n": index})
            time.sleep(0.01)
        assert len(sock.sends) == 2  # nothing went out while commits kept coming
        wait_until(lambda: len(sock.sends) == 3, 5, message="the held events after the pause")
        assert len(chunk_frames(sock.sends[2][1])) == 10


def frame_types(frames):
    return [frame.split(b"event: ", 1)[1].split(b"\n", 1)[0].decode() for frame in frames]


def test_live_deltas_keep_their_place_among_the_events_of_one_round(service, demo, monkeypatch):
    """One round carrying stored events and live deltas sends each delta after the events committed
    before it was published and before later ones (`suzumio watch --once` stops at activation.completed:
    a delta sent behind it was never printed)."""
    monkeypatch.setattr(suzumio_sse, "STREAM_DUTY", 1e9)
    monkeypatch.setattr(suzumio_sse, "STREAM_COALESCE", 1000.0)
    monkeypatch.setattr(suzumio_sse, "STREAM_QUIET", 0.3)
    with hub_client(service.root, demo, demo.latest_event_rowid(), poll_seconds=1000.0) as sock:
        wait_until(lambda: sock.sends, 2, message="the head")
        demo.append_event("opening", {})  # goes out at once; the next round waits for the pause
        wait_until(lambda: len(sock.sends) == 2, 2, message="the opening event")
        demo.append_event("before", {})
        service.root.live.publish("demo", {"type": "activation.delta", "text": "mid"},
                                  after=demo.event_watermark)
        demo.append_event("after", {})
        wait_until(lambda: len(sock.sends) == 3, 5, message="the round after the pause")
        assert frame_types(chunk_frames(sock.sends[2][1])) == ["before", "activation.delta", "after"]


def test_the_event_watermark_is_the_newest_committed_event(demo):
    newest = demo.latest_event_rowid()
    assert demo.event_watermark == newest  # init and start: events this store committed
    demo.append_event("one", {})
    assert demo.event_watermark == demo.latest_event_rowid() > newest
    committed = demo.event_watermark
    with pytest.raises(RuntimeError), demo.write() as tx:
        demo.add_event(tx, "rolled.back", {})
        raise RuntimeError("abort")
    assert demo.event_watermark == committed
    with demo.write() as tx:
        demo.add_event(tx, "first", {})
        demo.add_event(tx, "second", {})
    assert demo.event_watermark == demo.latest_event_rowid() == committed + 2


def test_a_client_at_the_feed_gets_the_same_bytes_as_every_other(service, demo):
    """One framed batch per round for every client at the feed's cursor: the hub sends the same bytes
    object to all of them (no copy, no join per client)."""
    hub = suzumio_sse.StreamHub(service.root, poll_seconds=1.0, keep_alive_seconds=30.0)
    pairs = [socket.socketpair() for _ in range(3)]
    recordings = [RecordingSocket(ours) for ours, _ in pairs]
    sent_objects = []
    for recording in recordings:
        original = recording.send

        def send(data, original=original):
            sent_objects.append(data.obj if isinstance(data, memoryview) else data)
            return original(data)
        recording.send = send
    try:
        cursor = demo.latest_event_rowid()
        for recording in recordings:
            hub.open(recording, demo.project_id, cursor, b"", b"", True)
        wait_until(lambda: len(sent_objects) == 3, 2, message="the three keep-alives")
        demo.append_event("shared", {})
        wait_until(lambda: len(sent_objects) == 6, 2, message="the event to all three")
        assert sent_objects[3] is sent_objects[4] is sent_objects[5]
        for _, peer in pairs:
            peer.settimeout(5)
            read_until(peer, b"event: shared\n")
    finally:
        hub.close()
        for ours, peer in pairs:
            ours.close()
            peer.close()


def test_more_streams_than_worker_threads_leave_the_api_answering(tmp_path):
    """A stream holds a socket, not a worker thread: with the fewest threads serve allows (16), 50 open
    streams still leave every route answering, and all 50 get the event."""
    with serving(tmp_path / "root", threads=16) as service:
        init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        clients = [SseClient(service, "/api/projects/demo/stream") for _ in range(50)]
        try:
            wait_until(lambda: all(len(c.snapshot()) == 1 for c in clients), 10, message="fifty streams")
            assert service.get("/api/projects", timeout=5).status_code == 200
            posted = service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "hi"}, timeout=5)
            assert posted.status_code == 200
            wait_until(lambda: all(c.of("message.created") for c in clients), 5,
                       message="every stream to see the message")
            assert service.server.app.config["suzumio.streams"].stream_count() == 50
        finally:
            for client in clients:
                client.close()
        wait_until(lambda: service.server.app.config["suzumio.streams"].stream_count() == 0, 5,
                   message="the hub to let the closed streams go")


def raw_stream(service, request):
    """A socket that sent `request` (bytes, the Host and token headers added before the blank line)."""
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    extra = "".join(f"{name}: {value}\r\n" for name, value in service.auth_headers.items())
    head, _, body = request.partition(b"\r\n\r\n")
    sock.sendall(head + f"\r\nHost: 127.0.0.1:{service.port}\r\n{extra}\r\n".encode() + body)
    return sock


def read_until(sock, needle, limit=5.0):
    data, deadline = b"", time.monotonic() + limit
    while needle not in data:
        assert time.monotonic() < deadline, data[-300:]
        more = sock.recv(1 << 16)
        assert more, data[-300:]
        data += more
    return data


def test_an_http_10_stream_is_not_chunked_and_ends_with_its_connection(service, demo):
    sock = raw_stream(service, b"GET /api/projects/demo/stream?limit=1 HTTP/1.0\r\n\r\n")
    try:
        head = read_until(sock, b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK\r\n")
        assert b"Transfer-Encoding" not in head and b"Connection: close\r\n" in head
        demo.append_event("plain", {})
        data = head + read_until(sock, b"event: plain\n")
        body = data.split(b"\r\n\r\n", 1)[1]
        assert body.startswith(b"id: evt_")  # the replayed event, unframed
    finally:
        sock.close()


def test_a_stream_after_another_answer_on_the_same_connection(service, demo):
    """Keep-alive: the stream's connection first carried another request; its answer is sent whole
    before the hub takes the connection."""
    sock = raw_stream(service, b"GET /api/version HTTP/1.1\r\n\r\n")
    try:
        first = read_until(sock, b"}\n")
        assert first.startswith(b"HTTP/1.1 200 OK")
        extra = "".join(f"{name}: {value}\r\n" for name, value in service.auth_headers.items())
        sock.sendall(f"GET /api/projects/demo/stream?limit=1 HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n"
                     f"{extra}\r\n".encode())
        second = read_until(sock, b"\r\n\r\n")
        assert second.startswith(b"HTTP/1.1 200 OK\r\n") and b"Transfer-Encoding: chunked\r\n" in second
        demo.append_event("after", {})
        read_until(sock, b"event: after\n")
    finally:
        sock.close()


def test_a_head_request_gets_the_stream_headers_and_no_body(service):
    answer = service.call("HEAD", "/api/projects/demo/stream", timeout=5)
    assert answer.status_code == 200
    assert answer.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert service.server.app.config["suzumio.streams"].stream_count() == 0


def test_a_client_behind_the_feed_buffer_catches_up_from_the_store_in_order(service, demo):
    """Last-Event-ID further back than the feed keeps: the missed events come from the store, a batch at
    a time, then the client follows the feed like every other."""
    first = stored_ids(demo)[-1]
    count = suzumio_sse.FEED_BUFFER * 2 + 700
    with demo.write() as tx:
        for index in range(count):
            demo.add_event(tx, "old", {"n": index})
    watcher = SseClient(service, "/api/projects/demo/stream?limit=1")  # keeps the feed at the newest event
    client = SseClient(service, "/api/projects/demo/stream", {"Last-Event-ID": first})
    try:
        wait_until(lambda: len(client.of("old")) == count, 20, message="the missed events")
        demo.append_event("new", {})
        wait_until(lambda: client.of("new") and watcher.of("new"), 5, message="the new event")
        events = client.snapshot()
        assert [json.loads(e["data"]["data_json"])["n"] for e in events if e["event"] == "old"] \
            == list(range(count))
        assert [e["id"] for e in events] == stored_ids_all(demo)[stored_ids_all(demo).index(first) + 1:]
    finally:
        client.close()
        watcher.close()


def test_a_client_catching_up_that_stops_reading_costs_the_hub_nothing_until_it_reads(service, demo,
                                                                                       monkeypatch):
    """A client behind the feed's buffer whose unread bytes reached the catch-up limit gets no more
    store batches, and the hub does not spin while it waits: the next batch comes when the client has
    read what it was sent."""
    monkeypatch.setattr(suzumio_sse, "BEHIND_PENDING_BYTES", 64 * 1024)
    first = stored_ids(demo)[-1]
    count = suzumio_sse.FEED_BUFFER * 2 + 700
    with demo.write() as tx:
        for index in range(count):
            demo.add_event(tx, "old", {"n": index, "pad": "x" * 500})
    watcher = SseClient(service, "/api/projects/demo/stream?limit=1")  # keeps the feed at the newest event
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", service.port))
    extra = "".join(f"{name}: {value}\r\n" for name, value in service.auth_headers.items())
    slow.sendall(f"GET /api/projects/demo/stream HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n{extra}"
                 f"Last-Event-ID: {first}\r\n\r\n".encode())
    hub = service.server.app.config["suzumio.streams"]
    try:
        wait_until(lambda: any(client.pending_bytes >= suzumio_sse.BEHIND_PENDING_BYTES
                               for client in list(hub._clients)), 10, message="the slow client to fall behind")
        steps = hub.steps
        time.sleep(1.0)  # the window in which the hub's passes are counted
        assert hub.steps - steps < 50  # a spinning loop makes tens of thousands
        slow.settimeout(10)
        data = read_until(slow, b'\\"n\\":%d,' % (count - 1), limit=20)
        frames = [json.loads(json.loads(line[6:])["data_json"])["n"]
                  for line in data.split(b"\n") if line.startswith(b"data: ")]
        assert frames == list(range(count))
    finally:
        slow.close()
        watcher.close()


def test_an_event_written_by_another_process_reaches_the_stream_by_the_safety_read(service, tmp_path):
    """A commit through another Root on the same files (a CLI command beside serve) wakes nothing in this
    process; the hub's read every poll_seconds (1 s here) still sends it."""
    client = SseClient(service, "/api/projects/demo/stream?limit=1")
    try:
        wait_until(lambda: client.snapshot(), 2, message="the replay")
        elsewhere = suzumio_store.Root(service.root.path)
        elsewhere.open_project("demo").append_event("from.elsewhere", {})
        wait_until(lambda: client.of("from.elsewhere"), 5, message="the other process's event")
    finally:
        client.close()


def stored_ids_all(store):
    return [row["id"] for _rowid, row in store.events_after(0)]


def test_a_client_that_stops_reading_is_dropped_and_the_others_go_on(service, demo, monkeypatch):
    monkeypatch.setattr(suzumio_sse, "MAX_PENDING_BYTES", 256 * 1024)
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's bytes wait
    stuck.connect(("127.0.0.1", service.port))
    extra = "".join(f"{name}: {value}\r\n" for name, value in service.auth_headers.items())
    stuck.sendall(f"GET /api/projects/demo/stream HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n{extra}\r\n"
                  .encode())
    reader = SseClient(service, "/api/projects/demo/stream?limit=1")
    hub = service.server.app.config["suzumio.streams"]
    try:
        wait_until(lambda: hub.stream_count() == 2, 5, message="both streams")
        payload = "x" * 2000
        for _ in range(20):
            with demo.write() as tx:
                for index in range(100):
                    demo.add_event(tx, "bulk", {"n": index, "pad": payload})
            if hub.stream_count() < 2:
                break
        wait_until(lambda: hub.stream_count() == 1, 10, message="the stuck client to be dropped")
        demo.append_event("still", {})
        wait_until(lambda: reader.of("still"), 5, message="the reading client to go on")
    finally:
        stuck.close()
        reader.close()


def test_a_failing_hub_reports_the_listener_down(tmp_path, monkeypatch):
    """The hub's loop has one boundary: an error there (a bug; injected) reaches serve's liveness as the
    user listener's failure, instead of streams going silent."""
    failures = []

    def broken_admit(self):
        raise RuntimeError("injected")
    monkeypatch.setattr(suzumio_sse.StreamHub, "_admit", broken_admit)
    with serving(tmp_path / "root") as service:
        init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        app = service.server.app
        # The listener's fatal-error handler, as serve gives it (liveness.died).
        extra = suzumio_api.Server(app, "127.0.0.1", 0, on_fatal=lambda *failure: failures.append(failure))
        extra.server.close()
        sock = raw_stream(service, b"GET /api/projects/demo/stream HTTP/1.1\r\n\r\n")
        try:
            wait_until(lambda: failures, 5, message="the hub's failure")
            component, error = failures[0]
            assert component == "http" and isinstance(error, RuntimeError)
        finally:
            sock.close()


def test_a_project_whose_store_fails_ends_its_streams_and_the_hub_goes_on(service, demo, monkeypatch):
    """A round that cannot read its project (an injected store error) ends that project's streams, whose
    clients reconnect; the hub serves the next stream."""
    client = SseClient(service, "/api/projects/demo/stream")
    wait_until(lambda: len(client.snapshot()) == 2, 2, message="the replay")

    def failing_read(self, store):
        raise OSError("injected: disk I/O error")
    with monkeypatch.context() as patch:
        patch.setattr(suzumio_sse.ProjectFeed, "read", failing_read)
        demo.append_event("lost", {})
        client.thread.join(5)
        assert not client.thread.is_alive()  # its stream ended
    client.close()
    again = SseClient(service, "/api/projects/demo/stream?limit=1")
    try:
        wait_until(lambda: again.of("lost"), 2, message="the replay after the reconnect")
        demo.append_event("later", {})
        wait_until(lambda: again.of("later"), 2, message="the next event")
    finally:
        again.close()
