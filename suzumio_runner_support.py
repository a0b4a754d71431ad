"""Runner-facing HTTP routes (backend-runner.md §6, http-api.md §9): tool-call audit, support calls,
signals, history, model calls (forwarded by suzumio_model_proxy), activation context and output, all
authenticated by the per-agent token, served by their own app on the runner listener (make_runner_app).
Also holds the HTTP conventions both apps share (base_app, JSON bodies and responses, the one error
shape). Imported by suzumio_api, suzumio.py and tests."""
import hmac
import json
import logging
import math
import os
import re
import threading
import urllib.parse
from json.encoder import encode_basestring as _quote_json

import bottle

from suzumio_cost import call_cost  # issue 14
from suzumio_errors import BadRequest, Conflict, Forbidden, SuzumioError
from suzumio_live import DELTA_EVENT  # issue 14
from suzumio_model_proxy import ModelProxy
from suzumio_records import (
    ACT_RUNNING,
    HISTORY_CLOSED,
    HISTORY_ROLES,
    KIND_MODEL_RETRY,
    TOOL_CALL_END_STATUSES,
    TOOL_CALLS_CLOSED,
    utc_now,
)
from suzumio_resources import VERSION
from suzumio_toolpacks import describe, optional_boolean, required_string

log = logging.getLogger(__name__)
VERSION_HEADER = "Suzumio-Version"  # on every answer: the one version string (suzumio_resources)

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 200
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
NOSNIFF = ("X-Content-Type-Options", "nosniff")

IDENTITY_FIELDS = ("project", "agentId", "activationId", "token")
MODEL_CALLS_CLOSED = "no more model calls are accepted"


# ---------------------------------------------------------------- HTTP conventions (http-api.md §2)

def encode_json(value):
    """http-api.md §2.2: 2-space indentation, UTF-8 text, one trailing newline. The same text as
    json.dumps(value, indent=2, ensure_ascii=False), about twice as fast on a history page: with an
    indent, json falls back to pure-Python generators."""
    out = []
    _write_json(value, out, "\n")
    out.append("\n")
    return "".join(out).encode("utf-8")


_JSON_LITERALS = {True: "true", False: "false", None: "null"}


def _json_key(key):
    """Dict keys as json.dumps converts them."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return json.dumps(key)
    if key is True or key is False or key is None:
        return _JSON_LITERALS[key]
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _write_json(value, out, pad):
    if isinstance(value, str):
        out.append(_quote_json(value))
    elif value is None or value is True or value is False:
        out.append(_JSON_LITERALS[value])
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(json.dumps(value))
    elif isinstance(value, (dict, list, tuple)):
        if not value:
            out.append("{}" if isinstance(value, dict) else "[]")
            return
        inner = pad + "  "
        is_dict = isinstance(value, dict)
        separator = ("{" if is_dict else "[") + inner
        for item in value.items() if is_dict else value:
            out.append(separator)
            if is_dict:
                key, item = item
                out.append(_quote_json(_json_key(key)))
                out.append(": ")
            _write_json(item, out, inner)
            separator = "," + inner
        out.append(pad + ("}" if is_dict else "]"))
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def json_response(value, status=200):
    return bottle.HTTPResponse(encode_json(value), status, {"Content-Type": JSON_TYPE, NOSNIFF[0]: NOSNIFF[1]})


def text_response(text):
    if not text.endswith("\n"):
        text += "\n"
    return bottle.HTTPResponse(text.encode("utf-8"), 200, {"Content-Type": TEXT_TYPE, NOSNIFF[0]: NOSNIFF[1]})


def error_response(status, message):
    return json_response({"error": message}, status)


def read_body():
    """The request body parsed as JSON whatever its Content-Type; empty or blank → {} (§2.1)."""
    length = bottle.request.content_length
    if length > MAX_BODY_BYTES:
        raise BadRequest(f"Request body too large (limit {MAX_BODY_BYTES} bytes)")
    raw = bottle.request.body.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise BadRequest(f"Request body too large (limit {MAX_BODY_BYTES} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadRequest(f"Invalid JSON body: {exc}") from None
    except RecursionError:
        raise BadRequest(f"Invalid JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    problem = unusable_json(value)
    if problem:
        raise BadRequest(f"Invalid JSON body: {problem}")
    return value


def unusable_json(value):
    """Why a parsed body cannot be stored or answered: nesting deeper than MAX_JSON_DEPTH (it could
    exhaust the stack later) or a lone surrogate escape such as \\ud800 (it has no UTF-8 form).
    Checked without recursion; None when the value is fine."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                return "lone surrogate escapes are not valid text"
        elif isinstance(item, (list, dict)):
            if depth > MAX_JSON_DEPTH:
                return f"nested deeper than {MAX_JSON_DEPTH} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return None


def read_fields():
    """The body as an object; any other JSON value counts as an object without fields (§2.1)."""
    body = read_body()
    return body if isinstance(body, dict) else {}


def raw_path(environ):
    """The request path still percent-encoded, so `a%2Fb` stays one segment (§2.4)."""
    uri = environ.get("REQUEST_URI")
    if uri:
        # An origin-form target is a path: urlsplit would read `//x/y` as host `x` and path `/y`.
        if uri.startswith("/"):
            return uri.split("?", 1)[0].split("#", 1)[0]
        return urllib.parse.urlsplit(uri).path or "/"
    return urllib.parse.quote(environ.get("PATH_INFO", "/").encode("latin1"), safe="/:@!$&'()*+,;=")


def base_app(stopping=None):
    """A Bottle app with what both listeners share: no JSON plugin, the error boundary, the raw path,
    nosniff on every answer, and JSON errors for unmatched paths (a wrong method is a 404, never a
    405). `stopping` (a threading.Event, set by Server.close) ends long answers such as SSE."""
    app = bottle.Bottle(catchall=True)
    app.uninstall(bottle.JSONPlugin)
    app.install(ErrorBoundary())
    app.config["suzumio.stopping"] = stopping or threading.Event()

    @app.hook("before_request")
    def keep_raw_path():
        environ = bottle.request.environ
        environ["PATH_INFO"] = raw_path(environ)

    @app.hook("after_request")
    def after_request():
        bottle.response.set_header(*NOSNIFF)
        bottle.response.set_header(VERSION_HEADER, VERSION)

    # Bottle calls these for unmatched routes and for exceptions that escape the route boundary
    # (hooks); they must encode the JSON themselves.
    def error_page(message):
        def handler(error):
            bottle.response.content_type = JSON_TYPE
            bottle.response.set_header(*NOSNIFF)
            bottle.response.set_header(VERSION_HEADER, VERSION)
            return encode_json({"error": message})
        return handler

    not_found = error_page("not found")

    def wrong_method(error):
        bottle.response.status = 404
        del bottle.response.headers["Allow"]
        return not_found(error)

    app.error_handler[404] = not_found
    app.error_handler[405] = wrong_method
    app.error_handler[500] = error_page("internal error")
    return app


class ErrorBoundary:
    """Bottle plugin: percent-decodes path arguments and turns every failure into {"error": …}."""

    name = "suzumio-error-boundary"
    api = 2

    def apply(self, callback, route):
        def boundary(**args):
            decoded = {key: urllib.parse.unquote(value, errors="replace") for key, value in args.items()}
            try:
                return callback(**decoded)
            except bottle.HTTPResponse:
                raise
            except SuzumioError as exc:
                return error_response(exc.status, exc.message)
            except Exception as exc:
                log.exception("%s %s failed", bottle.request.method, bottle.request.path)
                return error_response(500, str(exc) or type(exc).__name__)
        return boundary


# ---------------------------------------------------------------- authorization (http-api.md §9.1)

def tokens_match(given, expected):
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class RunnerCall:
    """An authenticated runner request: the project store, the calling agent and its activation."""

    def __init__(self, store, agent, activation, body):
        self.store = store
        self.agent = agent
        self.activation = activation
        self.body = body

    @property
    def agent_id(self):
        return self.agent["id"]

    @property
    def activation_id(self):
        return self.activation["id"]


def authorize(root, body, fields=(), *, body_checks=None, running=None):
    """Checks A–G of http-api.md §9.1 in their order; `running` is the 409 wording or None."""
    for field in (*IDENTITY_FIELDS, *fields):
        required_string(body, field)
    if body_checks:
        body_checks(body)
    store = root.open_project(body["project"])
    agent = store.agent(body["agentId"], include_token=True)
    if not tokens_match(body["token"], agent["token"]):
        raise Forbidden("Invalid agent token")
    activation = store.activation(body["activationId"])
    if activation["agentId"] != agent["id"]:
        raise Forbidden(f"Activation {activation['id']} does not belong to {agent['id']}")
    if running and activation["status"] != ACT_RUNNING:
        raise Conflict(f"Activation {activation['id']} is {activation['status']}; {running}")
    return RunnerCall(store, agent, activation, body)


def parse_keep_tail(value):
    """A number or numeric string, floored; anything unparsable counts as absent (§9.6)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return math.floor(value)
    return None


def check_context(body):
    context = body.get("context")
    if not isinstance(context, dict):
        raise BadRequest("context is required")
    if (context.get("version") != 1 or context.get("kind") != "model-context"
            or not isinstance(context.get("messages"), list)):
        raise BadRequest("Invalid activation context")


def check_model_request(body):
    if not isinstance(body.get("body"), dict):
        raise BadRequest("body is required")


def check_output(body):
    output = body.get("output")
    if not isinstance(output, dict):
        raise BadRequest("output is required")
    text = output.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("output.text is required")


# ---------------------------------------------------------------- routes

def trace_model_call(tracer, call, config, provider_id, preset_id, started, answer, error):
    """The GenAI span of one forwarded model call (suzumio_telemetry), when tracing is on."""
    if tracer is None or not tracer.enabled:
        return
    preset = config.runner.presets.get(preset_id)
    provider = config.runner.providers.get(provider_id)
    response = {}
    if answer is not None:
        try:
            response = json.loads(answer.body)
        except ValueError:
            response = {}
    response = response if isinstance(response, dict) else {}
    choices = response.get("choices") if isinstance(response.get("choices"), list) else []
    usage = answer.usage if answer is not None else {}
    tracer.model_call(
        project=call.store.project_id, agent_id=call.agent_id, activation_id=call.activation_id,
        provider=provider.type if provider is not None else provider_id,
        model=(preset.api_model or preset.model) if preset is not None else preset_id,
        response_model=response.get("model"), start=started, end=utc_now(),
        input_tokens=usage.get("input"), output_tokens=usage.get("output"), total_tokens=usage.get("total"),
        cache_read_tokens=usage.get("cacheRead"),
        finish_reasons=[c["finish_reason"] for c in choices if isinstance(c, dict) and c.get("finish_reason")],
        error=error)


def make_runner_app(root, toolpacks, scheduler, model_proxy=None, tracer=None):
    """The runner listener's WSGI app: the runner routes only, no user route and no user guard (the
    agent token authenticates every call). Served on the runner socket or `serve --runner-listen`."""
    app = base_app()
    mount_runner_routes(app, root, toolpacks, scheduler, model_proxy, tracer)
    return app


def mount_runner_routes(app, root, toolpacks, scheduler, model_proxy=None, tracer=None):
    """Adds the routes of http-api.md §9 to `app`; a completed activation asks `scheduler` for a tick.
    `model_proxy` (a suzumio_model_proxy.ModelProxy, by default one over the controller's environment)
    forwards `/runner/model`; `tracer` (suzumio_telemetry) gets a span for every model and tool call."""
    model_proxy = model_proxy or ModelProxy()

    @app.post("/runner/model")
    def runner_model():
        call = authorize(root, read_fields(), ("providerId", "presetId"), body_checks=check_model_request,
                         running=MODEL_CALLS_CLOSED)
        provider_id, preset_id = call.body["providerId"], call.body["presetId"]
        config = toolpacks.configs.get(call.store)
        started = utc_now()
        # Issue 14: each retry is an event; streamed deltas go live on the project's SSE stream.
        live_base = {"type": DELTA_EVENT, "activationId": call.activation_id, "agentId": call.agent_id,
                     "presetId": preset_id, "callId": f"live_{os.urandom(6).hex()}"}

        def publish(delta):
            root.live.publish(call.store.project_id, dict(live_base, **delta))

        def on_retry(info):
            call.store.append_event(KIND_MODEL_RETRY, dict(info, activationId=call.activation_id,
                                                           agentId=call.agent_id))

        try:
            answer = model_proxy.forward(config, call.agent_id, provider_id, preset_id, call.body["body"],
                                         publish=publish, on_retry=on_retry)
        except SuzumioError as error:
            trace_model_call(tracer, call, config, provider_id, preset_id, started, None, error.message)
            raise
        # Recorded whatever the activation's status by now: the provider counted these tokens.
        call.store.record_model_call(call.activation_id, call.agent_id, provider_id, preset_id,
                                     answer.status, answer.usage,
                                     cost_usd=call_cost(config.runner.presets.get(preset_id), answer.usage))
        trace_model_call(tracer, call, config, provider_id, preset_id, started, answer,
                         None if 200 <= answer.status < 300 else f"HTTP {answer.status}")
        return json_response({"status": answer.status, "headers": answer.headers, "body": answer.body,
                              "overflow": answer.overflow is not None})

    @app.post("/runner/tool-calls/start")
    def tool_call_start():
        call = authorize(root, read_fields(), ("tool",), running=TOOL_CALLS_CLOSED)
        tool = call.body["tool"]
        toolpacks.check_tool_call(call.store, call.agent, tool)
        return json_response(call.store.start_tool_call(call.agent_id, call.activation_id, tool,
                                                        call.body.get("input")))

    @app.post("/runner/tool-calls/finish")
    def tool_call_finish():
        call = authorize(root, read_fields(), ("toolCallId", "status"))
        status = call.body["status"]
        if status not in TOOL_CALL_END_STATUSES:
            raise BadRequest(f"Invalid tool call status: {status}")
        result = call.store.finish_tool_call(
            call.agent_id, call.activation_id, call.body["toolCallId"], status,
            output=optional_text(call.body, "output"), error=optional_text(call.body, "error"))
        if tracer is not None and tracer.enabled:
            tracer.tool_call(call.store.tool_call(call.body["toolCallId"]), call.store.project_id)
        return json_response(result)

    @app.post("/runner/signals")
    def runner_signal():
        call = authorize(root, read_fields(), ("kind",), running=TOOL_CALLS_CLOSED)
        body = call.body
        if "payload" in body and not isinstance(body["payload"], dict):
            raise BadRequest("payload must be an object")
        useful_effect = optional_boolean(body, "usefulEffect")
        for field, names in (("targetAgent", "agent"), ("targetChannel", "channel")):
            if body.get(field) is not None and not isinstance(body[field], str):
                raise BadRequest(f"Unknown {names}: {describe(body[field])}")
        call.store.record_signal(
            body["kind"], source_agent=call.agent_id, source_activation=call.activation_id,
            target_agent=body.get("targetAgent"), target_channel=body.get("targetChannel"),
            priority=body.get("priority"), payload=body.get("payload"), status=body.get("status"),
            useful_effect=useful_effect)
        return json_response({"status": "recorded"})

    @app.post("/toolpacks/<toolpack_id>/support")
    def toolpack_support(toolpack_id):
        call = authorize(root, read_fields(), ("tool",), running=TOOL_CALLS_CLOSED)
        result = toolpacks.support(call.store, call.agent, call.activation_id, toolpack_id,
                                   call.body["tool"], call.body.get("input", {}))
        return json_response(result)

    @app.post("/runner/history/messages")
    def history_message():
        call = authorize(root, read_fields(), ("role", "kind", "content"), running=HISTORY_CLOSED)
        body = call.body
        if body["role"] not in HISTORY_ROLES:
            raise BadRequest(f"Invalid history role: {body['role']}")
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
        message = call.store.append_history(call.agent_id, call.activation_id, body["role"], body["kind"],
                                            body["content"], metadata=metadata)
        return json_response({"status": "recorded", "message": message})

    @app.post("/runner/history/compact")
    def history_compact():
        call = authorize(root, read_fields(), ("summary",), running=HISTORY_CLOSED)
        body = call.body
        result = call.store.compact_history(
            call.agent_id, call.activation_id, body["summary"],
            keep_tail=parse_keep_tail(body.get("keepTail")),
            reason=optional_text(body, "reason"), selected_model=optional_text(body, "selectedModel"))
        return json_response(result)

    @app.post("/activation-context")
    def activation_context():
        call = authorize(root, read_fields(), body_checks=check_context)
        return json_response(call.store.record_activation_context(call.activation_id, call.agent_id,
                                                                  call.body["context"]))

    @app.post("/activation-output")
    def activation_output():
        call = authorize(root, read_fields(), body_checks=check_output)
        if call.activation["status"] != ACT_RUNNING:
            return json_response({"status": call.activation["status"], "activationId": call.activation_id})
        output = call.body["output"]
        usage = output.get("usage") if isinstance(output.get("usage"), dict) else None
        result = call.store.complete_activation(call.activation_id, call.agent_id, output["text"], usage=usage)
        if result["status"] == "completed":
            run_tick(scheduler.trigger, call.store.project_id)
        return json_response(result)


def optional_text(body, field):
    value = body.get(field)
    return value if isinstance(value, str) else None


def run_tick(trigger_tick, project):
    """A failing tick is logged and never changes the answer of the route that asked for it."""
    try:
        trigger_tick(project)
    except Exception:
        log.exception("tick of %s after a route failed", project)
