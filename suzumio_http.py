"""HTTP plumbing shared by the user listener (suzumio_api) and the runner listener
(suzumio_runner_support): JSON encoding and bodies, the one error shape and its boundary, the base
Bottle app, and the argument readers that validate a request's fields once, where they arrive
(docs/http-api.md)."""
import json
import logging
import math
import re
import threading
import urllib.parse
import uuid
from json.encoder import encode_basestring as _quote_json

import bottle

from suzumio_errors import BadRequest, SuzumioError, storage_error
from suzumio_records import describe, format_ts, parse_ts
from suzumio_resources import VERSION

log = logging.getLogger(__name__)
VERSION_HEADER = "Suzumio-Version"  # on every answer: the one version string (suzumio_resources)

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_JSON_DEPTH = 200
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
NOSNIFF = ("X-Content-Type-Options", "nosniff")

# ---------------------------------------------------------------- HTTP conventions (docs/http-api.md)

def encode_json(value):
    """docs/http-api.md: 2-space indentation, UTF-8 text, one trailing newline. The same text as
    json.dumps(value, indent=2, ensure_ascii=False), about twice as fast on a history page: with an
    indent, json falls back to pure-Python generators."""
    out = []
    _write_json(value, out, "\n")
    out.append("\n")
    return "".join(out).encode("utf-8")


_JSON_LITERALS = {True: "true", False: "false", None: "null"}


def encode_json_item(value):
    """The text of `value` as one item of a top-level list laid out as encode_json lays it out, so a
    list of cached items can be joined (join_json_items) instead of encoded again."""
    out = []
    _write_json(value, out, "\n  ")
    return "".join(out)


def join_json_items(texts):
    """encode_json(items) from the items' encode_json_item texts."""
    if not texts:
        return b"[]\n"
    return ("[\n  " + ",\n  ".join(texts) + "\n]\n").encode("utf-8")


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


_KEYS = {}  # a str key -> its quoted text and the colon after it; keys repeat across rows and pages
_MAX_KEYS = 4096


def _key_text(key):
    text = _KEYS.get(key)
    if text is None:
        text = _quote_json(_json_key(key)) + ": "
        if type(key) is str and len(_KEYS) < _MAX_KEYS:
            _KEYS[key] = text
    return text


def _write_json(value, out, pad):
    # Scalars inside a container are written in place, not by a call each: they are most of a page's
    # values, and a call per value was most of the encoding's cost.
    kind = type(value)
    if kind is str:
        out.append(_quote_json(value))
    elif value is None or value is True or value is False:
        out.append(_JSON_LITERALS[value])
    elif kind is int:
        out.append(int.__repr__(value))
    elif kind is dict or kind is list or isinstance(value, (dict, list, tuple)):
        if not value:
            out.append("{}" if isinstance(value, dict) else "[]")
            return
        inner = pad + "  "
        is_dict = isinstance(value, dict)
        separator = ("{" if is_dict else "[") + inner
        following = "," + inner
        append = out.append
        for item in value.items() if is_dict else value:
            if is_dict:
                key, item = item
                append(separator + (_KEYS.get(key) or _key_text(key)))
            else:
                append(separator)
            separator = following
            kind = type(item)
            if kind is str:
                append(_quote_json(item))
            elif item is None or item is True or item is False:
                append(_JSON_LITERALS[item])
            elif kind is int:
                append(int.__repr__(item))
            else:
                _write_json(item, out, inner)
        append(pad + ("}" if is_dict else "]"))
    elif isinstance(value, str):
        out.append(_quote_json(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(json.dumps(value))
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
    """The request body parsed as JSON whatever its Content-Type; empty or blank → {}."""
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
    """The body as an object; any other JSON value counts as an object without fields."""
    body = read_body()
    return body if isinstance(body, dict) else {}


def raw_path(environ):
    """The request path still percent-encoded, so `a%2Fb` stays one segment."""
    uri = environ.get("REQUEST_URI")
    if uri:
        # An origin-form target is a path: urlsplit would read `//x/y` as host `x` and path `/y`.
        if uri.startswith("/"):
            return uri.split("?", 1)[0].split("#", 1)[0]
        return urllib.parse.urlsplit(uri).path or "/"
    return urllib.parse.quote(environ.get("PATH_INFO", "/").encode("latin1"), safe="/:@!$&'()*+,;=")


def base_app():
    """A Bottle app with what both listeners share: no JSON plugin, the error boundary, the raw path,
    nosniff on every answer, and JSON errors for unmatched paths (a wrong method is a 404, never a
    405)."""
    app = bottle.Bottle(catchall=True)
    app.uninstall(bottle.JSONPlugin)
    app.install(ErrorBoundary())

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
                full = storage_error(exc)
                if full is not None:  # the transaction rolled back; the client may ask again later
                    log.warning("%s %s: %s", bottle.request.method, bottle.request.path, full.message)
                    return error_response(full.status, full.message)
                # The answer names an id, never the exception: its text may carry paths or secrets.
                error_id = uuid.uuid4().hex[:12]
                log.exception("%s %s failed (error id %s)", bottle.request.method, bottle.request.path, error_id)
                return error_response(500, f"Internal error (id {error_id})")
        return boundary


class SharedAnswer:
    """One computation for many concurrent askers of the same answer, none of them served stale: an
    asker takes the result of a computation that started after it asked. Arriving while one is under
    way, it waits for that one to end, then takes the next one's result (one asker among the waiting
    starts it). 32 control rooms asking for a 500-project list at once cost two computations, not 32
. An error is every waiting asker's error."""

    def __init__(self, compute):
        self._compute = compute
        self._changed = threading.Condition()
        self._started = 0  # computations started so far
        self._finished = 0  # the number of the computation whose outcome is `_outcome`
        self._running = False
        self._outcome = (None, None)  # (value, error) of the newest finished computation

    def get(self):
        with self._changed:
            wanted = self._started + 1  # the first computation to start after this call
            while self._finished < wanted:
                if not self._running:
                    self._running = True
                    self._started += 1
                    number = self._started
                    break
                self._changed.wait()
            else:
                return self._result(self._outcome)
        try:
            outcome = (self._compute(), None)
        except BaseException as error:  # noqa: BLE001 - handed to every asker, raised again below
            outcome = (None, error)
        with self._changed:
            self._running = False
            self._finished, self._outcome = number, outcome
            self._changed.notify_all()
        return self._result(outcome)

    @staticmethod
    def _result(outcome):
        value, error = outcome
        if error is not None:
            raise error
        return value


# ---------------------------------------------------------------- argument readers (docs/design/tools.md)

def finite_number(value, strings=True):
    """The one numeric parser: a finite int or float (never a boolean), or with `strings` a numeric
    string, as a float; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and strings:
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def floored(value):
    """A number or numeric string, floored; None when it is neither."""
    number = finite_number(value)
    return None if number is None else math.floor(number)


def limit_param(raw, default, cap=500):
    """A `limit` query value: finite and > 0 → min(cap, floor(value)); anything else → default."""
    number = finite_number(raw)
    if number is None or number <= 0:
        return default
    return min(cap, math.floor(number))


def timestamp_param(raw, name):
    """An ISO-8601 query value as a stored timestamp (UTC, milliseconds, Z); absent → None."""
    if raw is None or raw == "":
        return None
    try:
        return format_ts(parse_ts(raw))
    except ValueError:
        raise BadRequest(f"{name} must be an ISO-8601 timestamp") from None


def object_input(value):
    if not isinstance(value, dict):
        raise BadRequest("Tool input must be an object")
    return value


def required_string(data, key):
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{key} is required")
    return value


def optional_string(value):
    return value if isinstance(value, str) and value.strip() else None


def optional_text(body, field):
    value = body.get(field)
    return value if isinstance(value, str) else None


def optional_boolean(data, key):
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, bool):
        raise BadRequest(f"Expected boolean, got {describe(value)}")
    return value


def bounded_input(data, key, default, cap):
    """docs/design/tools.md positive number: absent → default; finite > 0 → min(floor, cap), at least 1."""
    if key not in data:
        return default
    number = finite_number(data[key], strings=False)
    if number is None or number <= 0:
        raise BadRequest("Expected a positive number")
    return max(1, min(math.floor(number), cap))


def run_tick(tick, project):
    """Tick `project` after a route changed it; a failing tick is logged and never changes the answer of
    the route that asked for it."""
    try:
        tick(project)
    except Exception:
        log.exception("tick of %s after a route failed", project)
