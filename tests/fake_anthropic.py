"""FakeAnthropic: a real HTTP server speaking the Anthropic Messages API (`POST /v1/messages`) from a
queue of scripted replies, whole or streamed as the API's Server-Sent Events (message_start,
content_block_*, message_delta, message_stop), recording every request. Imported by tests only."""

import json
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from fake_model import WORDS, RecordedRequest
from http_fixtures import LocalHTTPServer

OVERFLOW_BODY = {"type": "error", "error": {"type": "invalid_request_error",
                                            "message": "prompt is too long: 210000 tokens > 200000 maximum"}}
OVERLOADED_BODY = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

AnthropicReply = namedtuple("AnthropicReply", "status headers body chunk_delay")


def message_body(number, model, text, tool_uses, usage, stop_reason, thinking=None):
    content = []
    if thinking:
        content.append({"type": "thinking", "thinking": thinking, "signature": "sig"})
    if text:
        content.append({"type": "text", "text": text})
    for index, (name, arguments) in enumerate(tool_uses or []):
        content.append({"type": "tool_use", "id": f"toolu_{number}_{index + 1}", "name": name, "input": arguments})
    inp, out, read, write = (tuple(usage) + (0, 0))[:4] if usage else (10, 5, 0, 0)
    return {"id": f"msg_fake_{number}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": inp, "output_tokens": out, "cache_read_input_tokens": read,
                      "cache_creation_input_tokens": write}}


def stream_events(message):
    """The Messages API's stream for a whole message: text and thinking in word deltas, tool input as
    `input_json_delta` pieces, output tokens on message_delta."""
    usage = dict(message["usage"])
    output = usage.pop("output_tokens")
    yield "message_start", {"type": "message_start", "message": dict(message, content=[], stop_reason=None,
                                                                       usage=dict(usage, output_tokens=1))}
    yield "ping", {"type": "ping"}
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "text", "text": ""}}
            for word in WORDS.findall(block["text"]):
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "text_delta", "text": word}}
        elif block["type"] == "thinking":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
            for word in WORDS.findall(block["thinking"]):
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "thinking_delta", "thinking": word}}
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "signature_delta", "signature": block["signature"]}}
        else:
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "tool_use", "id": block["id"],
                                                            "name": block["name"], "input": {}}}
            text = json.dumps(block["input"])
            for start in range(0, len(text), 5):
                delta = {"type": "input_json_delta", "partial_json": text[start:start + 5]}
                yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {"type": "message_delta",
                            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                            "usage": {"output_tokens": output}}
    yield "message_stop", {"type": "message_stop"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_POST(self):
        fake = self.server.fake
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
        path = urlsplit(self.path).path
        fake._record(RecordedRequest(path, {k.lower(): v for k, v in self.headers.items()}, body))
        if path != "/v1/messages":
            return self._send(404, {}, {"type": "error", "error": {"type": "not_found_error", "message": path}})
        reply = fake._next()
        payload = reply.body(body) if callable(reply.body) else reply.body
        if reply.status == 200 and isinstance(body, dict) and body.get("stream"):
            return self._stream(payload, reply.chunk_delay, fake)
        self._send(reply.status, reply.headers, payload)

    def _send(self, status, headers, body):
        payload = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _stream(self, message, chunk_delay, fake):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        events = stream_events(message) if message.get("type") == "message" else [("error", message)]
        try:
            for name, data in events:
                if chunk_delay and fake._closing.wait(chunk_delay):
                    return
                self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class FakeAnthropic:
    """An Anthropic Messages server on 127.0.0.1:<port>; `base_url` is what a Suzumio provider names
    (`…/v1`), `root_url` what the official client takes. An empty queue answers 500."""

    def __init__(self):
        self.requests = []
        self._queue = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._count = 0
        self._http = LocalHTTPServer(_Handler, "fake-anthropic", fake=self)

    @property
    def root_url(self):
        return f"http://127.0.0.1:{self._http.port}"

    @property
    def base_url(self):
        return self.root_url + "/v1"

    def enqueue(self, text=None, tool_uses=None, usage=None, stop_reason=None, thinking=None, status=200,
                body=None, headers=None, chunk_delay=0.0):
        """One reply: `text` and/or `tool_uses` [(name, input)], `usage` (input, output, cache read,
        cache write); or an error `status` with its `body`; a 200 `body` that is an error object is sent
        as a stream `error` event (Anthropic's mid-stream overloaded error)."""
        with self._lock:
            self._count += 1
            number = self._count
        if status == 200 and body is None:
            def body(request, number=number):
                return message_body(number, (request or {}).get("model"), text, tool_uses, usage, stop_reason,
                                    thinking)
        with self._lock:
            self._queue.append(AnthropicReply(status, headers or {}, body, chunk_delay))

    def pending(self):
        with self._lock:
            return len(self._queue)

    def _next(self):
        with self._lock:
            if self._queue:
                return self._queue.pop(0)
        return AnthropicReply(500, {}, {"type": "error", "error": {"type": "api_error",
                                                                   "message": "fake: no reply queued"}}, 0)

    def _record(self, request):
        with self._lock:
            self.requests.append(request)

    def close(self):
        self._closing.set()
        self._http.close()
