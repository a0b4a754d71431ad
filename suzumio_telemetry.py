"""OpenTelemetry traces of activations, model calls and tool calls, exported over OTLP/HTTP (protobuf).

Off unless `serve` builds a Tracer with an endpoint (`serve --otlp-endpoint URL`, else
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces); a disabled Tracer
does nothing and nothing ever phones home. Standard library only: a small protobuf encoder of the OTLP
trace messages and one named exporter thread that posts batches (why not the SDK:
docs/spec-notes.md#traces-a-standard-library-otlp-encoder).

One trace per activation: its trace id and its span id are derived from the activation id, so the
activation span (exported when the activation ends), the tool-call spans and the model-call spans find
their parent without shared state, across controller restarts too. Span names and attributes follow the
GenAI semantic conventions (`invoke_agent`, `execute_tool`, `chat`; gen_ai.*), plus suzumio.project,
suzumio.agent and suzumio.activation.id on every span."""
import hashlib
import logging
import os
import queue
import struct
import threading
import urllib.error
import urllib.parse
import urllib.request

from suzumio_records import parse_ts
from suzumio_resources import VERSION

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
BATCH_SIZE = 256
QUEUE_SIZE = 4096
FLUSH_SECONDS = 1.0
EXPORT_TIMEOUT_SECONDS = 5.0
SCOPE_NAME = "suzumio"

SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT = 1, 3
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2


def endpoint_from(flag, environ):
    """The traces URL from `--otlp-endpoint` (wins) or the standard OTEL_* variables; None = off.
    A flag or OTEL_EXPORTER_OTLP_ENDPOINT is a base URL (`/v1/traces` is appended unless it is already
    there); OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as written, as the OTLP exporter spec says."""
    if flag:
        return _traces_url(flag)
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return _traces_url(environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    return None


def _traces_url(base):
    base = base.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def headers_from(environ):
    """OTEL_EXPORTER_OTLP_HEADERS / _TRACES_HEADERS: `name=value,name2=value2`, values URL-encoded."""
    text = environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or environ.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    headers = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if sep and name.strip():
            headers[name.strip()] = urllib.parse.unquote(value.strip())
    return headers


def trace_id_of(activation_id):
    return hashlib.sha256(b"suzumio-trace:" + activation_id.encode()).digest()[:16]


def span_id_of(item_id):
    return hashlib.sha256(b"suzumio-span:" + item_id.encode()).digest()[:8]


def unix_nanos(timestamp):
    """A stored timestamp (or aware datetime, or nanoseconds) as Unix nanoseconds."""
    if timestamp is None:
        return 0
    if isinstance(timestamp, int):
        return timestamp
    moment = parse_ts(timestamp) if isinstance(timestamp, str) else timestamp
    return round(moment.timestamp() * 1000) * 1_000_000


class Span:
    """One finished span, ready to encode."""

    __slots__ = ("attributes", "end", "kind", "name", "parent_id", "span_id", "start", "status", "status_message",
                 "trace_id")

    def __init__(self, trace_id, span_id, parent_id, name, kind, start, end, attributes, status=STATUS_UNSET,
                 status_message=""):
        self.trace_id, self.span_id, self.parent_id = trace_id, span_id, parent_id
        self.name, self.kind, self.start, self.end = name, kind, start, max(start, end)
        self.attributes, self.status, self.status_message = attributes, status, status_message


class Tracer:
    """Builds spans and hands them to the exporter thread. `Tracer(None)` is the disabled tracer."""

    def __init__(self, endpoint, *, headers=None, service_name="suzumio", flush_seconds=FLUSH_SECONDS,
                 timeout=EXPORT_TIMEOUT_SECONDS):
        self.endpoint = endpoint
        self.headers = dict(headers or {})
        self.resource = {"service.name": service_name, "service.version": VERSION}
        self.flush_seconds = flush_seconds
        self.timeout = timeout
        self.dropped = 0
        self._queue = queue.Queue(QUEUE_SIZE)
        self._stop = threading.Event()
        self._thread = None

    @property
    def enabled(self):
        return self.endpoint is not None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self):
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="suzumio-otlp-exporter", daemon=True)
            self._thread.start()
        return self

    def close(self):
        """Export what is queued, then stop the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout * 2 + 1)
            self._thread = None

    def _run(self):
        while not self._stop.is_set():
            self.flush(wait=self.flush_seconds)
        self.flush()

    def flush(self, wait=0.0):
        """Export every span queued now (after waiting up to `wait` seconds for the first); one tick of the
        exporter loop. Errors are logged and the batch is dropped: tracing never blocks the controller."""
        spans = []
        try:
            spans.append(self._queue.get(timeout=wait) if wait else self._queue.get_nowait())
            while True:
                spans.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        for offset in range(0, len(spans), BATCH_SIZE):
            self._post(encode_request(self.resource, spans[offset:offset + BATCH_SIZE]))
        return len(spans)

    def _post(self, body):
        request = urllib.request.Request(self.endpoint, data=body, method="POST",
                                         headers={**self.headers, "Content-Type": "application/x-protobuf"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                answer.read()
        except (OSError, ValueError, urllib.error.URLError) as error:
            log.warning("OTLP export to %s failed: %s", self.endpoint, error)

    def _emit(self, span):
        try:
            self._queue.put_nowait(span)
        except queue.Full:
            self.dropped += 1

    # -- the spans ------------------------------------------------------------------------------

    def activation_ended(self, activation):
        """The activation's span, the root of its trace: from `startedAt` to `completedAt` (an activation
        record as the store returns it: id, project, agentId, status, startedAt, completedAt, error)."""
        if not self.enabled:
            return
        activation_id = activation["id"]
        failed = activation.get("status") in ("failed", "cancelled")
        attributes = {**_links(activation.get("project"), activation.get("agentId"), activation_id),
                      "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.id": activation.get("agentId"),
                      "gen_ai.agent.name": activation.get("agentId"),
                      "suzumio.activation.status": activation.get("status")}
        usage = activation.get("usage") if isinstance(activation.get("usage"), dict) else {}
        tokens = usage.get("tokens") if isinstance(usage.get("tokens"), dict) else {}
        for key, name in (("input", "gen_ai.usage.input_tokens"), ("output", "gen_ai.usage.output_tokens"),
                          ("total", "suzumio.usage.total_tokens")):
            if isinstance(tokens.get(key), int):
                attributes[name] = tokens[key]
        if failed and activation.get("error"):
            attributes["error.type"] = activation.get("status")
        self._emit(Span(trace_id_of(activation_id), span_id_of(activation_id), b"",
                        f"invoke_agent {activation.get('agentId')}", SPAN_KIND_INTERNAL,
                        unix_nanos(activation.get("startedAt")), unix_nanos(activation.get("completedAt")),
                        attributes, STATUS_ERROR if failed else STATUS_OK,
                        (activation.get("error") or "")[:1000] if failed else ""))

    def tool_call(self, row, project=None):
        """A finished tool call (a `tool_calls` row: id, project, activation_id, agent_id, tool, status,
        error, created_at, completed_at) as a child span of its activation."""
        if not self.enabled:
            return
        start, end = unix_nanos(row.get("created_at")), unix_nanos(row.get("completed_at"))
        failed = row.get("status") != "completed"
        attributes = {**_links(project or row.get("project"), row.get("agent_id"), row["activation_id"]),
                      "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": row.get("tool"),
                      "gen_ai.tool.call.id": row["id"], "suzumio.tool.status": row.get("status"),
                      "suzumio.tool.duration_ms": max(0, end - start) // 1_000_000}
        if failed:
            attributes["error.type"] = row.get("status")
        self._emit(Span(trace_id_of(row["activation_id"]), span_id_of(row["id"]), span_id_of(row["activation_id"]),
                        f"execute_tool {row.get('tool')}", SPAN_KIND_INTERNAL, start, end, attributes,
                        STATUS_ERROR if failed else STATUS_OK, (row.get("error") or "")[:1000] if failed else ""))

    def model_call(self, *, project, agent_id, activation_id, provider, model, start, end, response_model=None,
                   input_tokens=None, output_tokens=None, total_tokens=None, cache_read_tokens=None,
                   cache_write_tokens=None, finish_reasons=(), error=None, operation="chat"):
        """One call to a model provider as a CLIENT child span of the activation. `start`/`end`: stored
        timestamps, aware datetimes or Unix nanoseconds; `finish_reasons`: a string or a list of them;
        `error`: None, or the error text (the span is then marked as an error)."""
        if not self.enabled:
            return
        if isinstance(finish_reasons, str):
            finish_reasons = [finish_reasons]
        attributes = {**_links(project, agent_id, activation_id), "gen_ai.operation.name": operation,
                      "gen_ai.system": provider, "gen_ai.provider.name": provider, "gen_ai.request.model": model,
                      "gen_ai.response.model": response_model, "gen_ai.usage.input_tokens": input_tokens,
                      "gen_ai.usage.output_tokens": output_tokens, "suzumio.usage.total_tokens": total_tokens,
                      "gen_ai.usage.cache_read.input_tokens": cache_read_tokens,
                      "gen_ai.usage.cache_creation.input_tokens": cache_write_tokens,
                      "gen_ai.response.finish_reasons": [str(r) for r in finish_reasons or ()] or None,
                      "error.type": "model_error" if error else None}
        self._emit(Span(trace_id_of(activation_id), os.urandom(8), span_id_of(activation_id),
                        f"{operation} {model}", SPAN_KIND_CLIENT, unix_nanos(start), unix_nanos(end),
                        attributes, STATUS_ERROR if error else STATUS_OK, str(error or "")[:1000]))


def _links(project, agent_id, activation_id):
    return {"suzumio.project": project, "suzumio.agent": agent_id, "suzumio.activation.id": activation_id}


DISABLED = Tracer(None)


# ---------------------------------------------------------------- protobuf (opentelemetry-proto trace/v1)

def _varint(value):
    value &= (1 << 64) - 1  # int64 negatives as ten bytes, as protobuf writes them
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(field, wire_type):
    return _varint(field << 3 | wire_type)


def _bytes_field(field, data):
    return _key(field, 2) + _varint(len(data)) + data


def _string_field(field, text):
    return _bytes_field(field, text.encode("utf-8"))


def _any_value(value):
    if isinstance(value, bool):
        return _key(2, 0) + _varint(int(value))
    if isinstance(value, int):
        return _key(3, 0) + _varint(value)
    if isinstance(value, float):
        return _key(4, 1) + struct.pack("<d", value)
    if isinstance(value, (list, tuple)):
        return _bytes_field(5, b"".join(_bytes_field(1, _any_value(item)) for item in value))
    return _string_field(1, str(value))


def _attributes(field, attributes):
    return b"".join(_bytes_field(field, _string_field(1, key) + _bytes_field(2, _any_value(value)))
                    for key, value in attributes.items() if value is not None)


def _span(span):
    body = (_bytes_field(1, span.trace_id) + _bytes_field(2, span.span_id)
            + (_bytes_field(4, span.parent_id) if span.parent_id else b"")
            + _string_field(5, span.name) + _key(6, 0) + _varint(span.kind)
            + _key(7, 1) + struct.pack("<Q", span.start) + _key(8, 1) + struct.pack("<Q", span.end)
            + _attributes(9, span.attributes))
    status = (_string_field(2, span.status_message) if span.status_message else b"") \
        + (_key(3, 0) + _varint(span.status) if span.status else b"")
    return body + _bytes_field(15, status)


def encode_request(resource, spans):
    """An ExportTraceServiceRequest holding `spans` under one resource and the `suzumio` scope."""
    scope = _string_field(1, SCOPE_NAME) + _string_field(2, VERSION)
    scope_spans = _bytes_field(1, scope) + b"".join(_bytes_field(2, _span(span)) for span in spans)
    resource_spans = _bytes_field(1, _attributes(1, resource)) + _bytes_field(2, scope_spans)
    return _bytes_field(1, resource_spans)
