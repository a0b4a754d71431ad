"""Test stand-ins for the network around the runner: FakeModel, a real HTTP server speaking Chat
Completions from a queue of scripted replies and recording every request, and RecordingProxy, a real
HTTP forward proxy that records what passed through it. Imported by tests only."""

import http.client
import itertools
import json
import re
import threading
import time
from collections import namedtuple
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from http_fixtures import LocalHTTPServer

from suzumio_runner_calls import contract_reminder

REMINDER_START = contract_reminder(["messages_send"]).split(":")[0]

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
OVERFLOW_MESSAGE = (
    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens."
)

OVERFLOW_BODY = {"error": {"message": OVERFLOW_MESSAGE, "type": "invalid_request_error",
                           "code": "context_length_exceeded"}}

RecordedRequest = namedtuple("RecordedRequest", "path headers body")
Reply = namedtuple("Reply", "status headers body delay chunk_delay cut_after hold first_delay",
                   defaults=(0.0, None, None, 0.0))
HOLD_LIMIT_S = 30.0  # a held reply goes out after this even when its event was never set
FLAVORS = ("openai", "vllm", "llamacpp", "ollama", "nostream", "nostreamoptions", "completiontokens")
WORDS = re.compile(r"\S+\s*|\s+")


def _chat_body(model, number, content, tool_calls, usage, finish_reason, reasoning=None, flavor="openai"):
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning" if flavor == "ollama" else "reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = []
        for index, call in enumerate(tool_calls):
            if isinstance(call, dict):
                name, arguments, call_id = call["name"], call.get("arguments", {}), call.get("id")
            else:
                name, arguments, call_id = call[0], call[1], None
            message["tool_calls"].append(
                {
                    "id": call_id or f"call_{number}_{index + 1}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                    },
                }
            )
    body = {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model or "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
    }
    if isinstance(usage, (tuple, list)):
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[2]}
    elif isinstance(usage, dict):
        body["usage"] = usage
    return body


class _ModelHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_POST(self):
        fake = self.server.fake
        fake._began()
        try:
            self._post(fake)
        finally:
            fake._ended()

    def _post(self, fake):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
        path = urlsplit(self.path).path
        fake._record(RecordedRequest(path, {k.lower(): v for k, v in self.headers.items()}, body),
                     reminder=is_reminder(body))
        if path not in CHAT_PATHS:
            return self._send(Reply(404, {}, {"error": {"message": f"no route {path}"}}, 0))
        refusal = fake._refusal(body)
        if refusal is not None:
            return self._send(Reply(400, {}, {"error": {"message": refusal, "type": "invalid_request_error",
                                                        "code": None}}, 0))
        reply = fake._next(body)
        if reply.hold is not None:
            reply.hold.wait(HOLD_LIMIT_S)
        if reply.delay and fake._closing.wait(reply.delay):
            return
        if reply.status == 0:  # enqueue_drop: the connection closes before any byte of an answer
            self.close_connection = True
            return
        if callable(reply.body):
            reply = reply._replace(body=reply.body(body))
        if reply.status == 200 and isinstance(reply.body, dict) and isinstance(body, dict) and body.get("stream"):
            return self._stream(reply, body)
        self._send(reply)

    def _stream(self, reply, request):
        """The reply as Chat Completions chunks in the fake's flavor, `chunk_delay` seconds apart."""
        fake = self.server.fake
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            if reply.first_delay and fake._closing.wait(reply.first_delay):
                return
            for index, chunk in enumerate(stream_chunks(reply.body, request, fake.flavor)):
                if reply.chunk_delay and fake._closing.wait(reply.chunk_delay):
                    return
                if reply.cut_after is not None and index >= reply.cut_after:
                    return  # the connection closes mid-stream
                self.wfile.write(b"data: " + json.dumps(chunk).encode("utf-8") + b"\n\n")
                self.wfile.flush()
                if "content" in chunk["choices"][0]["delta"] if chunk.get("choices") else False:
                    fake._token_written(chunk["choices"][0]["delta"]["content"])
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, reply):
        payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode("utf-8")
        try:
            self.send_response(reply.status)
            headers = {"Content-Type": "application/json"}
            headers.update(reply.headers or {})
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass


def stream_chunks(answer, request, flavor):
    """The chunks a server of `flavor` streams for a whole Chat Completions `answer`: vLLM and OpenAI send a
    role chunk first and usage only when asked (`stream_options.include_usage`); llama.cpp always puts
    usage (with `timings`) on its last chunk; Ollama sends each tool call whole and its reasoning as
    `reasoning`."""
    base = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}
    choice = answer["choices"][0]
    message = choice["message"]

    def chunk(delta, finish=None):
        return dict(base, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])

    if flavor != "ollama":
        yield chunk({"role": "assistant", "content": ""})
    for field in ("reasoning_content", "reasoning"):
        for word in WORDS.findall(message.get(field) or ""):
            yield chunk({field: word})
    for word in WORDS.findall(message.get("content") or ""):
        yield chunk({"content": word} if flavor != "ollama" else {"role": "assistant", "content": word})
    for index, call in enumerate(message.get("tool_calls") or []):
        if flavor == "ollama":
            yield chunk({"tool_calls": [dict(call, index=index)]})
            continue
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), 7):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[start:start + 7]}}]})
    last = chunk({}, choice["finish_reason"])
    usage = answer.get("usage")
    if flavor == "llamacpp":
        # `cache_n` in a reply's usage stands for the prompt tokens llama.cpp found in its cache: reported
        # in `timings` only, as builds before `prompt_tokens_details` do
        usage = dict(usage or {})
        cached = usage.pop("cache_n", 0)
        if usage:
            last["usage"] = usage
        last["timings"] = {"prompt_n": usage.get("prompt_tokens", 0) - cached, "cache_n": cached,
                           "predicted_ms": 1.0}
        yield last
        return
    yield last
    if usage and ((request.get("stream_options") or {}).get("include_usage")):
        yield dict(base, choices=[], usage=usage)


def answer(content=None, tool_calls=None):
    """A reply for a responder (FakeModel(responder=...)): assistant `content` and/or `tool_calls`
    [(name, args)], with call ids unique over the server's life."""
    number = next(_ANSWERS)
    return Reply(200, {}, lambda request: _chat_body((request or {}).get("model"), number, content, tool_calls,
                                                     None, None), 0.0)


_ANSWERS = itertools.count(1)
REMINDER = "reminder"  # the queue of replies to the runner's contract reminder (enqueue(model=REMINDER))


def is_reminder(body):
    """Whether a request is the runner's contract reminder: its last message is the reminder's text."""
    messages = body.get("messages") if isinstance(body, dict) else None
    last = messages[-1] if isinstance(messages, list) and messages and isinstance(messages[-1], dict) else {}
    return last.get("role") == "user" and str(last.get("content") or "").startswith(REMINDER_START)
OVERFLOW_REPLY = Reply(400, {}, OVERFLOW_BODY, 0)


class FakeModel:
    """A Chat Completions server on 127.0.0.1:<port>. Replies are taken from the queue of the requested
    model when one was enqueued for it, else from the shared queue; an empty queue asks `responder`
    (request body -> Reply, e.g. answer(...)) when there is one, else answers 500. A request
    with `stream: true` is answered as Server-Sent Events in the server `flavor` (FLAVORS): `nostream`
    refuses streaming, `nostreamoptions` refuses `stream_options`, `completiontokens` refuses `max_tokens`
    (as OpenAI's reasoning models do). The runner's contract reminder (an answer without a tool call is
    told once that text reaches no one) takes its reply from the REMINDER queue, else gets an empty
    answer, as from a model that ignores it; it is recorded in `reminders`, not `requests`, so a test
    of anything else sees the requests and replies it scripted."""

    def __init__(self, flavor="openai", responder=None, record=True):
        assert flavor in FLAVORS
        self.flavor = flavor
        self.responder = responder
        self.record = record  # False: keep no request (a soak's hours of them)
        self.requests = []
        self.reminders = []
        self.token_times = []  # time.monotonic() of every streamed content chunk written
        self.in_flight = 0  # requests being answered now
        self._queues = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._count = 0
        self._http = LocalHTTPServer(_ModelHandler, "fake-model", fake=self)

    @property
    def port(self):
        return self._http.port

    @property
    def base_url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def enqueue(
        self,
        content=None,
        tool_calls=None,
        usage=None,
        status=200,
        body=None,
        headers=None,
        delay=0.0,
        model=None,
        finish_reason=None,
        reasoning=None,
        chunk_delay=0.0,
        cut_after=None,
        hold=None,
        first_delay=0.0,
    ):
        """Queue one reply (`cut_after`: a streamed reply's connection closes after that many chunks, without
        the rest or [DONE]): assistant `content` and/or `tool_calls` [(name, args) or {name, arguments, id}],
        `usage` (prompt, completion, total) or a raw dict; or an error `status` with a JSON `body`
        (bytes are sent as is); `delay` seconds before answering; `hold`, a threading.Event, keeps the answer
        until it is set; `first_delay` seconds between a stream's head and its first chunk; `model` routes it
        to that model."""
        with self._lock:
            self._count += 1
            number = self._count
        if status == 200 and body is None:

            def body(request, number=number):
                return _chat_body(
                    (request or {}).get("model"), number, content, tool_calls, usage, finish_reason, reasoning,
                    self.flavor,
                )

        reply = Reply(status, headers or {}, body, delay, chunk_delay, cut_after, hold, first_delay)
        with self._lock:
            self._queues.setdefault(model, []).append(reply)

    def enqueue_error(self, status, message, headers=None, model=None, delay=0.0, hold=None):
        """Queue an OpenAI-style error body `{"error": {"message": ...}}` with the given status."""
        self.enqueue(
            status=status,
            body={"error": {"message": message, "type": "fake_error", "code": None}},
            headers=headers,
            model=model,
            delay=delay,
            hold=hold,
        )

    def enqueue_context_overflow(self, model=None):
        """Queue the 400 a provider answers when the prompt exceeds the context window."""
        self.enqueue(status=400, model=model, body=OVERFLOW_BODY)

    def enqueue_drop(self, model=None):
        """Queue a connection that closes without an answer (a retriable transport failure)."""
        with self._lock:
            self._queues.setdefault(model, []).append(Reply(0, {}, None, 0))

    def _token_written(self, text):
        if text:
            with self._lock:
                self.token_times.append(time.monotonic())

    def _refusal(self, request):
        """The 400 message this flavor answers a request it refuses, or None."""
        request = request if isinstance(request, dict) else {}
        if self.flavor == "nostream" and request.get("stream"):
            return "Streaming is not supported by this server"
        if self.flavor == "nostreamoptions" and "stream_options" in request:
            return "Unrecognized request argument supplied: stream_options"
        if self.flavor == "completiontokens" and "max_tokens" in request:
            return ("Unsupported parameter: 'max_tokens' is not supported with this model. "
                    "Use 'max_completion_tokens' instead.")
        return None

    def _began(self):
        with self._lock:
            self.in_flight += 1

    def _ended(self):
        with self._lock:
            self.in_flight -= 1

    def pending(self):
        with self._lock:
            return sum(len(queue) for queue in self._queues.values())

    def _next(self, request):
        model = (request or {}).get("model") if isinstance(request, dict) else None
        if is_reminder(request):
            with self._lock:
                if self._queues.get(REMINDER):
                    return self._queues[REMINDER].pop(0)
            return Reply(200, {}, lambda body: _chat_body((body or {}).get("model"), 0, "", None, None, None, None,
                                                          self.flavor), 0)
        with self._lock:
            for key in (model, None):
                if self._queues.get(key):
                    return self._queues[key].pop(0)
        if self.responder is not None:
            return self.responder(request if isinstance(request, dict) else {})
        return Reply(500, {}, {"error": {"message": "fake model: no reply queued"}}, 0)

    def _record(self, request, reminder=False):
        if not self.record:
            return
        with self._lock:
            (self.reminders if reminder else self.requests).append(request)

    def close(self):
        self._closing.set()
        self._http.close()


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def _forward(self):
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        with proxy.lock:
            proxy.seen.append((self.command, self.path))
        target = urlsplit(self.path)
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("proxy-connection", "proxy-authorization", "connection")
        }
        conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=30)
        try:
            conn.request(
                self.command,
                (target.path or "/") + ("?" + target.query if target.query else ""),
                body=body,
                headers=headers,
            )
            response = conn.getresponse()
            payload = response.read()
            self.send_response(response.status)
            for name, value in response.getheaders():
                if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        finally:
            conn.close()

    do_GET = _forward
    do_POST = _forward


class RecordingProxy:
    """An HTTP forward proxy on 127.0.0.1:<port>; `seen` lists (method, absolute URL) it forwarded."""

    def __init__(self):
        self.seen = []
        self.lock = threading.Lock()
        self._http = LocalHTTPServer(_ProxyHandler, "recording-proxy", proxy=self)

    @property
    def url(self):
        return self._http.url

    def close(self):
        self._http.close()
