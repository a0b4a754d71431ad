"""The SSE stream (http-api.md §10): replay, rowid polling without loss or duplicates, Last-Event-ID
resume, keep-alive comments, and many open streams beside ordinary requests."""
import itertools
import json
import threading
import time

import pytest
from api_fixtures import init_project, project_yaml, serving
from conftest import wait_until
from sse_fixtures import SseClient

import suzumio_api

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def service(tmp_path):
    with serving(tmp_path / "root", threads=16, keep_alive_seconds=1.0) as service:
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        demo.start()  # init + start: 2 events
        yield service


@pytest.fixture
def demo(service):
    return service.store("demo")


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


def test_a_stream_waits_the_burst_interval_after_a_burst_and_sends_a_lone_event_at_once(service, demo):
    """Issue 18: after a write that carried a burst a stream writes again no sooner than
    STREAM_BURST_SECONDS, whatever arrived meanwhile in one write; after a pause the next event goes
    out alone, without waiting. Frames keep their order."""
    feeds = suzumio_api.ProjectFeeds(service.root)
    stopping, writes, moments = threading.Event(), [], []
    client = suzumio_api.StreamClient(feeds.get(demo), service.root.changes, demo.latest_event_rowid(),
                                      stopping, lambda: False, 1.0, 30.0)

    def consume():
        for chunk in client.frames([]):
            moments.append(time.monotonic())
            writes.append(chunk)

    def burst_frames():
        return b"".join(writes).count(b"event: burst\n")

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        wait_until(lambda: writes, 2, message="the first (empty replay) write")
        groups = 4
        for group in range(groups):  # each commit of 10 events right after the previous one went out
            with demo.write() as tx:
                for index in range(10):
                    demo.add_event(tx, "burst", {"n": group * 10 + index})
            wait_until(lambda count=(group + 1) * 10: burst_frames() == count, 5, message=f"group {group}")
        assert [w.count(b"\n\n") for w in writes[1:]] == [10] * groups
        # A loaded machine only makes the gaps longer.
        gaps = [later - earlier for earlier, later in itertools.pairwise(moments[1:])]
        assert min(gaps) >= suzumio_api.STREAM_BURST_SECONDS * 0.95, gaps
        frames = b"".join(writes[1:]).split(b"\n\n")[:-1]
        assert [json.loads(json.loads(f.split(b"data: ", 1)[1])["data_json"])["n"] for f in frames] \
            == list(range(groups * 10))

        quiet = len(writes)
        time.sleep(2 * suzumio_api.STREAM_BURST_SECONDS)  # let the burst interval lapse
        demo.append_event("lone", {})
        wait_until(lambda: len(writes) > quiet, 2, message="the lone event")
        assert writes[quiet].count(b"\n\n") == 1 and b"event: lone\n" in writes[quiet]
    finally:
        stopping.set()
        reader.join(5)
