"""Model server dialects for the controller's model proxy: retries with backoff, the table of context-
overflow error bodies per server, streamed requests assembled into one Chat Completions answer (with
live deltas), and the Anthropic Messages translation."""

import email.utils
import http.client
import json
import random
import re
import socket
import time
from collections import namedtuple

from suzumio_config_schema import DEFAULT_MAX_OUTPUT_TOKENS
from suzumio_runner_models import (
    DEFAULT_MODEL_TIMEOUT_S,
    READ_CHUNK,
    TransportError,
    _connection,
    chat_completions_usage,
)

DEFAULT_MAX_RETRIES = 3
DEFAULT_RETRY_WINDOW_S = 60.0
BASE_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"
# Live deltas are coalesced: a fast stream publishes at most this often (each publish wakes SSE readers).
LIVE_INTERVAL_S = 0.1
MAX_ERROR_TEXT = 4000

RetryPolicy = namedtuple("RetryPolicy", "max_retries window_s")
Exchange = namedtuple("Exchange", "status headers body usage")


class EarlyTransportError(TransportError):
    """The exchange failed before any byte of the answer arrived: safe to send again."""


class StreamCut(TransportError):
    """An answer that broke off after some of it arrived (a reset, a close before its end), not by a
    wait running out: asked again whole, as an early failure is."""


# ---------------------------------------------------------------------------------------------
# Retries


def retry_policy(provider_options, preset_max_retries=None):
    """The retry bounds of one preset: the preset's `maxRetries`, else the provider's `options.maxRetries`,
    else 3; `options.retryWindowMs` bounds the total time spent waiting (60 s)."""
    options = provider_options or {}
    retries = preset_max_retries if preset_max_retries is not None else options.get("maxRetries")
    if not _non_negative(retries):
        retries = DEFAULT_MAX_RETRIES
    window = options.get("retryWindowMs")
    window_s = window / 1000.0 if _non_negative(window) else DEFAULT_RETRY_WINDOW_S
    return RetryPolicy(int(retries), window_s)


def _non_negative(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def retry_after_given(headers):
    """Whether an answer says when to ask again (`retry-after` or `retry-after-ms`)."""
    headers = headers or {}
    return bool(str(headers.get("retry-after", "")).strip() or str(headers.get("retry-after-ms", "")).strip())


def first_byte_timeout(timeout_ms, first_byte_ms):
    """Seconds from a request sent to the first byte of its answer's body: `firstByteTimeoutMs`, else
    `timeoutMs`, else 300 s; None when `timeoutMs` is false and no first-byte timeout is set. A stream's
    first event comes once the model read the prompt, a whole answer's body once it is done, so this is
    the long wait; `chunkTimeoutMs` bounds the waits between bytes after it."""
    for value in (first_byte_ms, timeout_ms):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return value / 1000.0
    return None if timeout_ms is False else DEFAULT_MODEL_TIMEOUT_S


def retriable_status(status):
    """429 and every 5xx (Anthropic's 529 overloaded among them) are retried."""
    return status == 429 or status >= 500


def retry_delay(headers, retry, rng=random.random, now=time.time):
    """Seconds before retry number `retry` (0-based): `retry-after-ms`, else `retry-after` (seconds or an
    HTTP date), else exponential backoff from 0.5 s capped at 8 s with full jitter in its upper half."""
    headers = headers or {}
    try:
        return max(0.0, float(str(headers.get("retry-after-ms", "")).strip()) / 1000.0)
    except ValueError:
        pass
    value = str(headers.get("retry-after", "")).strip()
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                return max(0.0, when.timestamp() - now())
            except (TypeError, ValueError):
                pass
    backoff = min(MAX_BACKOFF_S, BASE_BACKOFF_S * (2 ** retry))
    return backoff * (0.5 + rng() / 2)


# ---------------------------------------------------------------------------------------------
# Context overflow: one row per server, matched on the status and the lowercased error body

OVERFLOW_TABLE = (
    # OpenAI's code and text, also answered by Azure OpenAI, Groq, DeepSeek and vLLM
    ("openai", re.compile(r"context_length_exceeded|maximum context length is \d+")),
    ("llama.cpp", re.compile(r"exceed_context_size_error|exceeds the available context size")),
    ("ollama", re.compile(r"exceeded max context length|input length exceeds (the )?(maximum )?context length")),
    ("lm-studio", re.compile(r"when context the overflows|loaded with context length of only")),
    ("litellm", re.compile(r"contextwindowexceedederror")),
    ("anthropic", re.compile(r"prompt is too long|\"request_too_large\"")),
    ("gemini", re.compile(r"input token count.{0,40} exceeds the maximum number of tokens")),
    ("mistral", re.compile(r"too large for model with \d+ maximum context length")),
)
OVERFLOW_STATUSES = (400, 413, 422, 500)


def overflow_server(status, text):
    """The table row's server when an error answer says the request exceeded the context, else None.
    Rate limits phrased like a size ("Request too large … tokens per minute") are not overflow."""
    if status not in OVERFLOW_STATUSES or not text:
        return None
    lowered = text.lower()
    if "rate_limit" in lowered or "tokens per minute" in lowered:
        return None
    for server, pattern in OVERFLOW_TABLE:
        if pattern.search(lowered):
            return server
    return None


# ---------------------------------------------------------------------------------------------
# HTTP with a streamed body


def open_exchange(url, headers, body, proxy, connect_timeout, idle_timeout, deadline, clock=time.monotonic,
                  first_byte_timeout=None):
    """POST `body` and return (status, lowercased headers, chunk iterator); the first-byte timeout
    (default: the idle one) bounds the wait for the answer's head and the first byte of its body (a
    stream's first event), the idle timeout every read after it, so between the chunks of a stream.
    Raises EarlyTransportError when nothing of the answer arrived, TransportError when it broke off
    later."""

    def limit(seconds):
        if deadline is None:
            return seconds
        remaining = deadline - clock()
        if remaining <= 0:
            raise TimeoutError("timed out")
        return remaining if seconds is None else min(seconds, remaining)

    conn, connected = None, False
    try:
        conn, target, extra = _connection(url, proxy, limit(connect_timeout))
        conn.connect()
        connected = True
        sock = conn.sock  # http.client drops conn.sock once a `Connection: close` answer owns it
        sock.settimeout(limit(first_byte_timeout if first_byte_timeout is not None else idle_timeout))
        conn.request("POST", target, body=body, headers={**headers, **extra})
        response = conn.getresponse()
    except (OSError, http.client.HTTPException) as error:
        if conn is not None:
            conn.close()
        # Waiting for an answer the server may be computing is not retried (it would double long waits);
        # a refused or reset connection, or a connect that timed out, is.
        if connected and isinstance(error, socket.timeout):
            raise TransportError(_reason(error)) from None
        raise EarlyTransportError(_reason(error)) from None
    response_headers = {key.lower(): value for key, value in response.getheaders()}

    def chunks():
        wait = first_byte_timeout if first_byte_timeout is not None else idle_timeout
        try:
            while True:
                sock.settimeout(limit(wait))
                data = response.read1(READ_CHUNK)
                if not data:
                    return
                wait = idle_timeout
                yield data
        except TimeoutError as error:
            raise TransportError(_reason(error)) from None  # waiting longer is not retried (see above)
        except (OSError, http.client.HTTPException) as error:
            raise StreamCut(_reason(error)) from None
        finally:
            response.close()
            conn.close()

    return response.status, response_headers, chunks()


def _reason(error):
    reason = str(error) or error.__class__.__name__
    return f"timed out ({reason})" if "timed out" in reason.lower() and reason != "timed out" else reason


class SseParser:
    """Server-Sent Events from a byte stream fed in pieces: feed() answers the events each piece
    completes, (event name or None, data text); finish() the last one when the stream ends mid-event."""

    def __init__(self):
        self.buffer = b""
        self.event, self.data = None, []

    def feed(self, chunk):
        self.buffer += chunk
        events = []
        while True:
            cut = self.buffer.find(b"\n")
            if cut < 0:
                return events
            line, self.buffer = self.buffer[:cut].rstrip(b"\r").decode("utf-8", "replace"), self.buffer[cut + 1:]
            if not line:
                if self.data:
                    events.append((self.event, "\n".join(self.data)))
                self.event, self.data = None, []
            elif line.startswith(":"):
                continue
            elif line.startswith("event:"):
                self.event = line[6:].strip()
            elif line.startswith("data:"):
                self.data.append(line[5:][1:] if line[5:].startswith(" ") else line[5:])

    def finish(self):
        return [(self.event, "\n".join(self.data))] if self.data else []


class Deltas:
    """Collects the deltas of one streamed answer and hands them to `publish` (a callable taking a dict
    of `text`, `reasoning` and `toolCalls`), at most every LIVE_INTERVAL_S and once at the end."""

    def __init__(self, publish, clock=time.monotonic):
        self.publish = publish
        self.clock = clock
        self.last = None
        self.pending = {}

    def add(self, kind, value):
        if self.publish is None or not value:
            return
        if kind == "toolCalls":
            self.pending.setdefault("toolCalls", []).append(value)
        else:
            self.pending[kind] = self.pending.get(kind, "") + value
        if self.last is None or self.clock() - self.last >= LIVE_INTERVAL_S:
            self.flush()

    def flush(self, done=False):
        if self.publish is None or (not self.pending and not done):
            return
        payload, self.pending = self.pending, {}
        if done:
            payload["done"] = True
        self.last = self.clock()
        self.publish(payload)


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible Chat Completions


def openai_payload(body, model, stream, include_usage, completion_tokens):
    """The upstream body: the preset's model, stream flags, `max_completion_tokens` for models that refuse
    `max_tokens`, and no `reasoning_content` replayed (servers such as DeepSeek reject it in input)."""
    payload = dict(body, model=model, stream=bool(stream))
    payload.pop("stream_options", None)
    if stream and include_usage:
        payload["stream_options"] = {"include_usage": True}
    if completion_tokens and "max_tokens" in payload:
        payload["max_completion_tokens"] = payload.pop("max_tokens")
    messages = payload.get("messages")
    if isinstance(messages, list):
        payload["messages"] = [
            {k: v for k, v in m.items() if k not in ("reasoning_content", "reasoning")} if isinstance(m, dict) else m
            for m in messages]
    return payload


def refused_feature(status, text):
    """Which request feature a 400 refuses, when the fix is to resend without it: `max_tokens` (use
    max_completion_tokens), `stream_options`, or `stream`; None otherwise."""
    if status not in (400, 422) or not text:
        return None
    lowered = text.lower()
    if "max_completion_tokens" in lowered and "max_tokens" in lowered:
        return "max_tokens"
    if "stream_options" in lowered or "include_usage" in lowered:
        return "stream_options"
    if re.search(r"stream(ing)? (is )?(not supported|unsupported)|does not support stream|"
                 r"'stream' is not supported|stream.{0,20}not allowed", lowered):
        return "stream"
    return None


class OpenAIStream:
    """One Chat Completions answer assembled from its streamed chunks, as the server would have answered
    without streaming. Tool calls are keyed by `index` (Ollama sends them whole). feed() takes each event
    and says whether the answer is complete; finish() answers (answer, None) or (None, error text)."""

    def __init__(self, deltas):
        self.deltas = deltas
        self.first, self.content, self.reasoning, self.calls = None, [], [], {}
        self.finish_reason, self.usage, self.ended, self.error = None, None, False, None
        self.timings = None  # llama.cpp's, on its last chunk

    def feed(self, _name, data):
        if data.strip() == "[DONE]":
            self.ended = True
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            return False
        if not isinstance(chunk, dict):
            return False
        if isinstance(chunk.get("error"), (dict, str)):
            self.error = json.dumps(chunk)
            return True
        self.first = self.first or chunk
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            self.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)
        return False

    def _choice(self, choice):
        deltas = self.deltas
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
            deltas.add("text", delta["content"])
        think = delta.get("reasoning_content", delta.get("reasoning"))
        if isinstance(think, str):
            self.reasoning.append(think)
            deltas.add("reasoning", think)
        for position, call in enumerate(delta.get("tool_calls") or []):
            index = call.get("index", position) if isinstance(call, dict) else position
            slot = self.calls.setdefault(index, {"id": None, "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            function = call.get("function") or {}
            slot["id"] = slot["id"] or call.get("id")
            if function.get("name"):
                slot["function"]["name"] += function["name"]
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            if arguments:
                slot["function"]["arguments"] += arguments
            deltas.add("toolCalls", {"index": index, "id": call.get("id"), "name": function.get("name"),
                                     "arguments": arguments or ""})
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def finish(self):
        if self.error is not None:
            return None, self.error
        if self.first is not None and not self.ended and self.finish_reason is None:
            # Closed after some chunks without [DONE] or a finish_reason: a cut, not an answer.
            self.deltas.flush()
            raise StreamCut("stream ended before the answer was complete")
        self.deltas.flush(done=True)
        if self.first is None:
            return None, "stream ended without a chunk"
        calls, first = self.calls, self.first
        message = {"role": "assistant", "content": "".join(self.content) if self.content or not calls else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        answer = {"id": first.get("id"), "object": "chat.completion", "created": first.get("created"),
                  "model": first.get("model"),
                  "choices": [{"index": 0, "message": message, "logprobs": None,
                               "finish_reason": self.finish_reason or ("tool_calls" if calls else "stop")}]}
        if self.usage is not None:
            answer["usage"] = self.usage
        if self.timings is not None:
            answer["timings"] = self.timings
        return answer, None


def openai_usage(answer):
    """Suzumio usage of a Chat Completions answer. Cached prompt tokens come from
    `usage.prompt_tokens_details.cached_tokens` (OpenAI, recent llama.cpp), else from llama.cpp's
    `timings.cache_n`; `input` counts them, as `prompt_tokens` does."""
    if not isinstance(answer, dict):
        return {}
    usage = chat_completions_usage(answer.get("usage"))
    timings = answer.get("timings")
    cached = timings.get("cache_n") if isinstance(timings, dict) else None
    if usage and "cacheRead" not in usage and isinstance(cached, int) and not isinstance(cached, bool) and cached > 0:
        usage["cacheRead"] = cached
    return usage


# ---------------------------------------------------------------------------------------------
# Anthropic Messages


def _text(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def anthropic_payload(body, model, stream):
    """A Chat Completions request body as an Anthropic Messages request: system prompt apart, tool calls
    as `tool_use` blocks, tool answers as `tool_result` blocks in a user turn, consecutive turns of one
    role merged, and cache breakpoints on the system prompt, the tools and the last turn (prompt caching)."""
    system, turns = [], []

    def push(role, blocks):
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": list(blocks)})

    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            text = _text(message.get("content"))
            if text:
                system.append({"type": "text", "text": text})
        elif role == "tool":
            push("user", [{"type": "tool_result", "tool_use_id": message.get("tool_call_id") or "",
                           "content": _text(message.get("content")) or "(empty)"}])
        elif role == "assistant":
            blocks = []
            text = _text(message.get("content"))
            if text:
                blocks.append({"type": "text", "text": text})
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                blocks.append({"type": "tool_use", "id": call.get("id") or "", "name": function.get("name") or "",
                               "input": arguments if isinstance(arguments, dict) else {"value": arguments}})
            push("assistant", blocks or [{"type": "text", "text": "(no text)"}])
        else:
            push("user", [{"type": "text", "text": _text(message.get("content")) or "(empty)"}])
    if turns and turns[-1]["content"]:
        turns[-1]["content"][-1] = dict(turns[-1]["content"][-1], cache_control={"type": "ephemeral"})
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_OUTPUT_TOKENS
    payload = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system:
        system[-1] = dict(system[-1], cache_control={"type": "ephemeral"})
        payload["system"] = system
    for name in ("temperature", "top_p", "top_k", "stop_sequences", "metadata", "thinking"):
        if body.get(name) is not None:
            payload[name] = body[name]
    tools = [t.get("function") or {} for t in body.get("tools") or [] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    if tools and choice != "none":
        payload["tools"] = [{"name": t.get("name", ""), "description": t.get("description", ""),
                             "input_schema": t.get("parameters") or {"type": "object"}} for t in tools]
        payload["tools"][-1]["cache_control"] = {"type": "ephemeral"}
        payload["tool_choice"] = {"type": "any"} if choice == "required" else {"type": "auto"}
    if stream:
        payload["stream"] = True
    return payload


def anthropic_headers(headers, key):
    """The Messages API's auth: `x-api-key` instead of a bearer token, and the API version."""
    out = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    if key:
        out["x-api-key"] = key
    out.setdefault("anthropic-version", ANTHROPIC_VERSION)
    return out


STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
                "pause_turn": "stop", "refusal": "content_filter"}


def anthropic_usage(raw):
    """Suzumio usage of an Anthropic `usage` object; `input` counts cached prompt tokens too, as the
    Chat Completions `prompt_tokens` does."""
    raw = raw if isinstance(raw, dict) else {}

    def count(name):
        value = raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    read, write = count("cache_read_input_tokens"), count("cache_creation_input_tokens")
    prompt = count("input_tokens") + read + write
    usage = {"input": prompt, "output": count("output_tokens"), "total": prompt + count("output_tokens")}
    if read:
        usage["cacheRead"] = read
    if write:
        usage["cacheWrite"] = write
    return usage


def anthropic_to_chat(message):
    """An Anthropic message (whole) as a Chat Completions answer; thinking becomes `reasoning_content`."""
    texts, thinking, calls = [], [], []
    for block in message.get("content") or []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "thinking":
            thinking.append(block.get("thinking") or "")
        elif kind == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name") or "",
                                       "arguments": json.dumps(block.get("input") or {})}})
    chat_message = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if thinking:
        chat_message["reasoning_content"] = "".join(thinking)
    if calls:
        chat_message["tool_calls"] = calls
    usage = anthropic_usage(message.get("usage"))
    details = {"cached_tokens": usage.get("cacheRead", 0)}
    return {"id": message.get("id"), "object": "chat.completion", "created": int(time.time()),
            "model": message.get("model"),
            "choices": [{"index": 0, "message": chat_message, "logprobs": None,
                         "finish_reason": STOP_REASONS.get(message.get("stop_reason"), "stop")}],
            "usage": {"prompt_tokens": usage["input"], "completion_tokens": usage["output"],
                      "total_tokens": usage["total"], "prompt_tokens_details": details},
            "stop_reason": message.get("stop_reason")}, usage


class AnthropicStream:
    """The whole Anthropic message rebuilt from its stream events, fed one at a time (feed() says
    whether it is complete); an `error` event (such as `overloaded_error` mid-stream) makes finish()
    answer the error body instead: (message, None) or (None, error text)."""

    def __init__(self, deltas):
        self.deltas = deltas
        self.message, self.blocks, self.partial, self.error = None, {}, {}, None

    def feed(self, name, data):
        try:
            event = json.loads(data)
        except ValueError:
            return False
        kind = event.get("type") if isinstance(event, dict) else name
        if kind == "error":
            self.error = json.dumps(event)
            return True
        blocks, partial, deltas = self.blocks, self.partial, self.deltas
        if kind == "message_start":
            self.message = dict(event.get("message") or {}, content=[])
        elif kind == "content_block_start":
            index = event.get("index", len(blocks))
            blocks[index] = dict(event.get("content_block") or {})
            if blocks[index].get("type") == "tool_use":
                partial[index] = ""
                deltas.add("toolCalls", {"index": index, "id": blocks[index].get("id"),
                                         "name": blocks[index].get("name"), "arguments": ""})
        elif kind == "content_block_delta":
            index, delta = event.get("index", 0), event.get("delta") or {}
            block = blocks.setdefault(index, {"type": "text", "text": ""})
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta.get("text", "")
                deltas.add("text", delta.get("text", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
                deltas.add("reasoning", delta.get("thinking", ""))
            elif delta.get("type") == "input_json_delta":
                partial[index] = partial.get(index, "") + delta.get("partial_json", "")
                deltas.add("toolCalls", {"index": index, "arguments": delta.get("partial_json", "")})
        elif kind == "content_block_stop":
            index = event.get("index", 0)
            if index in partial and index in blocks:
                try:
                    blocks[index]["input"] = json.loads(partial[index] or "{}")
                except ValueError:
                    blocks[index]["input"] = {}
        elif kind == "message_delta" and self.message is not None:
            message = self.message
            message.update({k: v for k, v in (event.get("delta") or {}).items() if v is not None})
            usage = dict(message.get("usage") or {})
            usage.update(event.get("usage") or {})
            message["usage"] = usage
        elif kind == "message_stop":
            return True
        return False

    def finish(self):
        if self.error is not None:
            return None, self.error
        self.deltas.flush(done=True)
        if self.message is None:
            return None, "stream ended without message_start"
        self.message["content"] = [self.blocks[i] for i in sorted(self.blocks)]
        return self.message, None


# ---------------------------------------------------------------------------------------------
# One exchange in a dialect


class AnswerReader:
    """An upstream answer in Chat Completions terms, read from its body fed in pieces: streamed answers
    are assembled event by event (feed() says when the rest need not be read), error bodies pass
    through unchanged (Anthropic stream errors become 529 or 500 answers). finish() answers (status,
    body text, usage). The threaded proxy and the model loop both read answers with it."""

    def __init__(self, kind, status, headers, deltas):
        self.kind, self.status = kind, status
        self.streamed = 200 <= status < 300 and "text/event-stream" in headers.get("content-type", "")
        self.raw = []
        self.events = SseParser() if self.streamed else None
        self.stream = (AnthropicStream if kind == "anthropic" else OpenAIStream)(deltas) if self.streamed else None
        self.complete = False

    def feed(self, data):
        if not self.streamed:
            self.raw.append(data)
            return False
        for name, text in self.events.feed(data):
            if self.stream.feed(name, text):
                self.complete = True
                return True
        return False

    def finish(self):
        status = self.status
        if not self.streamed:
            raw = b"".join(self.raw).decode("utf-8", "replace")
            if not 200 <= status < 300:
                return status, raw, {}
            try:
                data = json.loads(raw)
            except ValueError:
                return status, raw, {}
            if self.kind == "anthropic" and isinstance(data, dict) and data.get("type") == "message":
                answer, usage = anthropic_to_chat(data)
                return status, json.dumps(answer), usage
            return status, raw, openai_usage(data)
        if not self.complete:
            for name, text in self.events.finish():
                if self.stream.feed(name, text):
                    break
        answer, error = self.stream.finish()
        if answer is None:
            return stream_error_status(error), error, {}
        if self.kind == "anthropic":
            answer, usage = anthropic_to_chat(answer)
            return status, json.dumps(answer), usage
        return status, json.dumps(answer), openai_usage(answer)


def answer_of(kind, status, headers, chunks, deltas):
    """AnswerReader over a chunk iterator (open_exchange's), closed once the answer is complete."""
    reader = AnswerReader(kind, status, headers, deltas)
    try:
        for data in chunks:
            if reader.feed(data):
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return reader.finish()


def stream_error_status(text):
    """An error inside a 200 stream as the status a whole answer would have had: overloaded is 529,
    an overflow 400, anything else 500 (both retriable or compacting as their plain counterparts)."""
    lowered = (text or "").lower()
    if "overloaded" in lowered:
        return 529
    if overflow_server(400, text):
        return 400
    if "rate_limit" in lowered:
        return 429
    return 500
