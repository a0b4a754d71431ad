"""The model loop (suzumio_model_loop): runner model calls driven without a worker thread each. The same
Forwarding through the loop and through the threaded path must answer alike, against the fake model
servers of test_providers and against scripted raw HTTP servers (framings, a 1xx head, cuts, TLS); the
route hands direct calls to the loop and keeps calls through an HTTP proxy on its thread; a hundred
streams at once take the loop's one thread and its small pool."""
import contextlib
import json
import socket
import ssl
import threading
import time

import pytest
from api_fixtures import running_activation
from conftest import wait_until
from fake_anthropic import OVERLOADED_BODY, FakeAnthropic
from fake_model import FakeModel, RecordingProxy
from test_model_proxy import closed_port, identity, route_service
from test_providers import BODY, KEY, REPLY, models_config, whole

import suzumio_model_loop
import suzumio_tls
from suzumio_errors import BadGateway, SuzumioError
from suzumio_model_proxy import Forwarding, ModelProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def loop():
    model_loop = suzumio_model_loop.ModelLoop()
    yield model_loop
    model_loop.close()


def both(model_loop, config, body=BODY, environ=None):
    """The same request forwarded by the threaded path, then by the loop: [(answer, deltas, retries)]."""
    results = []
    for way in ("threaded", "loop"):
        proxy = ModelProxy(environ or {"KEY_VAR": KEY})
        deltas, retries = [], []
        forwarding = Forwarding(proxy, config, "pm", "gw", "main", body, on_retry=retries.append)
        if way == "threaded":
            answer = proxy.drive(forwarding, deltas.append)
        else:
            answer = model_loop.run(forwarding, deltas.append)
        results.append((answer, deltas, retries))
    return results


def shape(answer):
    """An answer without what differs by reply number (ids)."""
    content, calls, finish, usage = whole(answer.body)
    return answer.status, answer.headers, content, [c[1:] for c in calls], finish, usage, answer.usage


# ---------------------------------------------------------------- the same answers as the threaded path

@pytest.mark.parametrize("flavor", ["openai", "vllm", "llamacpp", "ollama"])
@pytest.mark.parametrize("stream", [True, False])
def test_every_flavor_answers_alike_streamed_or_whole(loop, flavor, stream):
    server = FakeModel(flavor)
    try:
        for _ in range(2):
            server.enqueue(reasoning="Think first." if flavor in ("vllm", "ollama") else None, **REPLY)
        config = models_config(server.base_url, options={} if stream else {"stream": False})
        (threaded, threaded_deltas, _), (looped, looped_deltas, _) = both(loop, config)
        assert shape(looped) == shape(threaded) and shape(looped)[2] == REPLY["content"]
        assert [r.body for r in server.requests[:1]] == [r.body for r in server.requests[1:]]
        assert [r.body["stream"] for r in server.requests] == [stream, stream]
        text = "".join(d.get("text", "") for d in looped_deltas)
        assert text == "".join(d.get("text", "") for d in threaded_deltas) == (REPLY["content"] if stream else "")
        if stream:
            assert looped_deltas[-1]["done"]
    finally:
        server.close()


def test_error_answers_overflow_and_an_echoed_key_pass_as_on_the_threaded_path(loop, model):
    model.enqueue_error(400, "This model's maximum context length is 8192 tokens. However, your messages "
                             "resulted in 9000 tokens.")
    model.enqueue_error(400, "This model's maximum context length is 8192 tokens. However, your messages "
                             "resulted in 9000 tokens.")
    model.enqueue_error(403, f"bad key {KEY}")
    model.enqueue_error(403, f"bad key {KEY}")
    config = models_config(model.base_url, options={"maxRetries": 0})
    (threaded, _, _), (looped, _, _) = both(loop, config)
    assert looped == threaded and (looped.status, looped.overflow) == (400, "openai")
    (threaded, _, _), (looped, _, _) = both(loop, config)
    assert looped == threaded
    assert (looped.status, KEY in looped.body, "<redacted>" in looped.body) == (403, False, True)


def test_anthropic_whole_streamed_and_overloaded_mid_stream_answer_alike(loop):
    claude = FakeAnthropic()
    try:
        config = models_config(claude.base_url, type_="anthropic")
        for _ in range(2):
            claude.enqueue(text="Hello from Claude.", tool_uses=[("file_read", {"path": "a.txt"})],
                           usage=(30, 8), thinking="Hmm.")
        (threaded, threaded_deltas, _), (looped, looped_deltas, _) = both(loop, config)
        assert shape(looped) == shape(threaded) and shape(looped)[2] == "Hello from Claude."
        assert "".join(d.get("reasoning", "") for d in looped_deltas) == "Hmm."
        assert "".join(d.get("text", "") for d in threaded_deltas) == "Hello from Claude."
        for _ in range(2):
            claude.enqueue(body=OVERLOADED_BODY)  # a 200 stream whose first event is an overloaded error
            claude.enqueue(text="After the storm.")
        (threaded, _, threaded_retries), (looped, _, looped_retries) = both(loop, config)
        assert shape(looped) == shape(threaded) and shape(looped)[2] == "After the storm."
        assert [(r["retry"], r["status"]) for r in looped_retries] == [(1, 529)]
        assert [(r["retry"], r["status"]) for r in threaded_retries] == [(1, 529)]
    finally:
        claude.close()


def test_429_5xx_a_dropped_connection_and_a_cut_stream_are_retried_after_their_delays(loop, model):
    model.enqueue_error(429, "slow down", headers={"retry-after-ms": "200"})
    model.enqueue_error(503, "busy")
    model.enqueue_drop()
    model.enqueue(content=" ".join(["partial"] * 12), usage=(50, 40, 90), cut_after=3)
    model.enqueue(content="whole", usage=(5, 1, 6))
    retries, deltas = [], []
    forwarding = Forwarding(ModelProxy({"KEY_VAR": KEY}), models_config(model.base_url, options={"maxRetries": 4}),
                            "pm", "gw", "main", BODY, on_retry=retries.append)
    began = time.monotonic()
    answer = loop.run(forwarding, deltas.append)
    waited = time.monotonic() - began
    assert answer.status == 200 and whole(answer.body)[0] == "whole" and answer.usage["total"] == 6
    assert [(r["retry"], r["status"]) for r in retries] == [(1, 429), (2, 503), (3, None), (4, None)]
    assert [r["reason"].split(":")[0] for r in retries] == ["HTTP 429", "HTTP 503", "connection failed", "stream cut"]
    assert retries[0]["delayMs"] == 200
    assert waited >= sum(r["delayMs"] for r in retries) / 1000  # each retry waited for its timer
    assert any("partial" in str(delta) for delta in deltas) and len(model.requests) == 5


# ---------------------------------------------------------------- timeouts and failures

def test_the_idle_timeout_applies_between_chunks_and_is_not_retried(loop, model):
    slow = models_config(model.base_url, options={"maxRetries": 2}, provider={"chunkTimeoutMs": 800})
    model.enqueue(content=" ".join(["word"] * 8), chunk_delay=0.3)
    answer = loop.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), slow, "pm", "gw", "main", BODY))
    assert whole(answer.body)[0] == " ".join(["word"] * 8)
    model.enqueue(content="late words", chunk_delay=1.5)
    with pytest.raises(BadGateway, match=r"^Request to provider gw failed: timed out$"):
        loop.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), slow, "pm", "gw", "main", BODY))
    assert len(model.requests) == 2  # a wait after the connect is not asked again


def test_the_overall_timeout_ends_a_stream_that_keeps_trickling(loop, model):
    config = models_config(model.base_url, options={"maxRetries": 0},
                           provider={"timeoutMs": 1000, "chunkTimeoutMs": 800})
    model.enqueue(content=" ".join(["drip"] * 20), chunk_delay=0.3)
    with pytest.raises(BadGateway, match="timed out"):
        loop.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY))


def test_a_refused_connection_and_an_unknown_name_are_a_clear_502(loop):
    refused = models_config(f"http://127.0.0.1:{closed_port()}/v1", options={"maxRetries": 0})
    with pytest.raises(BadGateway, match=r"^Request to provider gw failed: \[Errno 111\] Connection refused$"):
        loop.run(Forwarding(ModelProxy({}), refused, "pm", "gw", "main", BODY))
    unknown = models_config("http://no-such-host.invalid/v1", options={"maxRetries": 0})
    with pytest.raises(BadGateway, match=r"^Request to provider gw failed: "):
        loop.run(Forwarding(ModelProxy({}), unknown, "pm", "gw", "main", BODY))


# ---------------------------------------------------------------- HTTP framings, scripted byte by byte

class ScriptedServer:
    """A raw HTTP server on 127.0.0.1 (TLS with `tls`, a ssl.SSLContext): each connection reads one
    request, then plays the next script, a list of byte strings written with `gap` seconds between them
    (the connection closes after the last)."""

    def __init__(self, scripts, gap=0.002, tls=None):
        self.scripts = list(scripts)
        self.gap = gap
        self.tls = tls
        self.requests = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def base_url(self):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/v1"

    def _serve(self):
        while self.scripts:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            script = self.scripts.pop(0)
            # A client may close once its answer is complete (before the last chunk) or refuse the TLS.
            with conn, contextlib.suppress(OSError):
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                self.requests.append(self._request(conn))
                for piece in script:
                    conn.sendall(piece)
                    time.sleep(self.gap)  # the server's pace: the loop reads the answer in pieces

    @staticmethod
    def _request(conn):
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length")))
        while len(body) < length:
            body += conn.recv(65536)
        return head.decode("latin-1"), json.loads(body)

    def close(self):
        self.listener.close()
        self.thread.join(timeout=5)


def sse(*chunks):
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


CHUNKS = [{"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
          {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "lo."}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}]
WHOLE = json.dumps({"id": "w1", "model": "m", "choices": [{"index": 0, "finish_reason": "stop", "message": {
    "role": "assistant", "content": "Whole."}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                                           "total_tokens": 4}}).encode()


def bytewise(data):
    return [data[i:i + 1] for i in range(len(data))]


def chunked(body, size=7):
    pieces = [b"%x;ext=1\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
SCRIPTS = {
    "chunked, a byte at a time": bytewise(STREAM_HEAD + chunked(sse(*CHUNKS))),
    "after a 100 Continue": [b"HTTP/1.1 100 Continue\r\n\r\n", STREAM_HEAD + chunked(sse(*CHUNKS))],
    "delimited by the close": [b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n", *bytewise(sse(*CHUNKS))],
    "with a length": [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                      % len(sse(*CHUNKS)), sse(*CHUNKS)],
}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_each_framing_of_a_streamed_answer_is_read_as_the_threaded_path_reads_it(loop, script):
    server = ScriptedServer([SCRIPTS[script], SCRIPTS[script]])
    try:
        (threaded, threaded_deltas, _), (looped, looped_deltas, _) = both(loop, models_config(server.base_url))
        # Deltas are grouped by time (LIVE_INTERVAL_S), so only their text is the same.
        assert "".join(d.get("text", "") for d in threaded_deltas) == "Hello."
        assert shape(looped) == shape(threaded) == (200, {}, "Hello.", [], "stop",
                                                    {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                                                    {"input": 3, "output": 2, "total": 5})
        assert "".join(d.get("text", "") for d in looped_deltas) == "Hello."
        head, body = server.requests[1]
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
        assert f"Authorization: Bearer {KEY}" in head and body == server.requests[0][1]
    finally:
        server.close()


def test_a_body_cut_mid_chunk_is_a_stream_cut_and_a_bad_status_line_a_failed_connection(loop):
    cut = STREAM_HEAD + chunked(sse(*CHUNKS))[:40]
    whole_answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(WHOLE), WHOLE)
    server = ScriptedServer([[cut], [b"SPDY/9 nonsense\r\n\r\n"], [whole_answer]])
    try:
        retries = []
        config = models_config(server.base_url, options={"maxRetries": 2, "retryWindowMs": 60000})
        forwarding = Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY,
                                on_retry=retries.append)
        answer = loop.run(forwarding)
        assert whole(answer.body)[0] == "Whole." and answer.usage == {"input": 3, "output": 1, "total": 4}
        assert [r["reason"].split(":")[0] for r in retries] == ["stream cut", "connection failed"]
    finally:
        server.close()


def test_an_https_upstream_is_verified_and_streamed(loop, tmp_path):
    tls = suzumio_tls.generated_tls(tmp_path, "127.0.0.1")
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(tls.cert_file, tls.key_file)
    server = ScriptedServer([[STREAM_HEAD + chunked(sse(*CHUNKS))], [STREAM_HEAD]], tls=server_side)
    try:
        trusting = suzumio_model_loop.ModelLoop(tls_context=ssl.create_default_context(cadata=tls.ca_pem))
        try:
            deltas = []
            config = models_config(server.base_url, options={"maxRetries": 0})
            answer = trusting.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY),
                                  deltas.append)
            assert whole(answer.body)[0] == "Hello." and "".join(d.get("text", "") for d in deltas) == "Hello."
        finally:
            trusting.close()
        # The system's CAs do not know the root's own CA: the handshake fails, nothing is sent.
        with pytest.raises(BadGateway, match="CERTIFICATE_VERIFY_FAILED"):
            loop.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY))
    finally:
        server.close()


# ---------------------------------------------------------------- many at once, and the end

def test_a_hundred_streams_at_once_take_the_loop_and_its_pool_not_a_thread_each(loop):
    server = FakeModel(record=False)
    try:
        for _ in range(100):
            server.enqueue(content=" ".join(["token"] * 10), chunk_delay=0.02, delay=0.2)
        config = models_config(server.base_url)
        done, answers = threading.Event(), []
        lock = threading.Lock()

        def on_done(value):
            with lock:
                answers.append(value)
                if len(answers) == 100:
                    done.set()

        for _ in range(100):
            loop.start(Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY), None,
                       lambda answer: answer, on_done=on_done)
        assert done.wait(60)
        assert all(a.status == 200 and whole(a.body)[0] == " ".join(["token"] * 10) for a in answers)
        assert loop.peak_exchanges == 100  # all of them open at once
        ours = [t.name for t in threading.enumerate() if t.name.startswith("suzumio-model")]
        assert len(ours) <= 1 + suzumio_model_loop.POOL_THREADS, ours
    finally:
        server.close()


def test_a_call_that_fails_inside_the_loop_answers_a_500_and_the_loop_goes_on(loop, model):
    model.enqueue(content="streamed")
    model.enqueue(content="next")
    config = models_config(model.base_url)

    def broken_publish(_delta):
        raise RuntimeError("the live feed broke")

    with pytest.raises(SuzumioError, match=r"^Internal error \(id [0-9a-f]{12}\)$") as failed:
        loop.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY), broken_publish)
    assert failed.value.status == 500
    answer = loop.run(Forwarding(ModelProxy({"KEY_VAR": KEY}), config, "pm", "gw", "main", BODY))
    assert whole(answer.body)[0] == "next" and loop.open_exchanges == 0


def test_closing_the_loop_ends_the_calls_in_flight(model):
    model_loop = suzumio_model_loop.ModelLoop()
    model.enqueue(content="never read", delay=30)
    outcome = []
    forwarding = Forwarding(ModelProxy({"KEY_VAR": KEY}), models_config(model.base_url), "pm", "gw", "main", BODY)
    thread = threading.Thread(target=lambda: outcome.append(_outcome(model_loop, forwarding)))
    thread.start()
    wait_until(lambda: model_loop.open_exchanges == 1, 10, message="the call to reach the model")
    model_loop.close()
    thread.join(10)
    assert [str(o) for o in outcome] == ["The model loop is shut down"]
    with pytest.raises(SuzumioError, match="shut down"):
        model_loop.run(forwarding)


def _outcome(model_loop, forwarding):
    try:
        return model_loop.run(forwarding)
    except SuzumioError as error:
        return error


# ---------------------------------------------------------------- the route

@pytest.fixture
def route(tmp_path, model):
    with route_service(tmp_path, model.base_url) as pair:
        yield pair


def runner_loop(service):
    return service.runner_server.app.config["suzumio.model_loop"]


def test_the_route_hands_a_direct_call_to_the_loop_and_answers_from_it(route, model):
    service, store = route
    act = running_activation(store, "pm")
    model.enqueue_error(503, "busy", headers={"retry-after-ms": "10"})
    model.enqueue(content="Looped", usage=(7, 2, 9))
    response = service.post("/runner/model", identity(service, store, "pm", act["id"]))
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert json.loads(response.json()["body"])["choices"][0]["message"]["content"] == "Looped"
    assert runner_loop(service).peak_exchanges == 1
    assert store.model_usage(act["id"]) == {"calls": 1, "tokens": {"input": 7, "output": 2, "total": 9}}
    [retry] = [row for _rowid, row in store.events_after(0, 1000) if row["type"] == "model.retry"]
    retry = json.loads(retry["data_json"])
    [exchange] = store.exchanges(act["id"])
    assert (retry["status"], exchange["retries"]) == (503, 1)


def test_a_call_through_an_http_proxy_stays_on_its_worker_thread(tmp_path, model):
    proxy = RecordingProxy()
    try:
        with route_service(tmp_path, model.base_url, {"KEY_VAR": KEY, "HTTP_PROXY": proxy.url}) as (service, store):
            act = running_activation(store, "pm")
            model.enqueue(content="Proxied")
            response = service.post("/runner/model", identity(service, store, "pm", act["id"]))
            assert json.loads(response.json()["body"])["choices"][0]["message"]["content"] == "Proxied"
            assert runner_loop(service).peak_exchanges == 0 and len(proxy.seen) == 1
    finally:
        proxy.close()


def test_a_runner_that_leaves_mid_call_loses_its_answer_and_nothing_else(route, model):
    service, store = route
    act = running_activation(store, "pm")
    model.enqueue(content="Unread", usage=(3, 1, 4), delay=0.5)
    model.enqueue(content="Read", usage=(3, 1, 4))
    body = json.dumps(identity(service, store, "pm", act["id"])).encode()
    with socket.socket(socket.AF_UNIX) as leaving:
        leaving.connect(str(service.socket_path))
        leaving.sendall(b"POST /runner/model HTTP/1.1\r\nHost: runner\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: runner_loop(service).open_exchanges == 1, 10, message="the call to reach the model")
    wait_until(lambda: store.model_usage(act["id"])["calls"] == 1, 10, message="the unread call to be recorded")
    response = service.post("/runner/model", identity(service, store, "pm", act["id"]))
    assert json.loads(response.json()["body"])["choices"][0]["message"]["content"] == "Read"
    assert store.model_usage(act["id"])["calls"] == 2
