"""User-facing HTTP surface (docs/http-api.md): request guards, projects, messages, history, control
actions, tool-ui, the SSE stream and the static WebUI. make_app() builds the user listener's Bottle app,
which never serves a runner route (those are suzumio_runner_support.make_runner_app, on the runner
listener); Server runs an app on Waitress, on TCP or a Unix socket. Nothing is built at import time."""
import hmac
import logging
import os
import re
import shutil
import threading
import urllib.parse
from pathlib import Path

import bottle
import waitress.server
import waitress.wasyncore

import suzumio_api_evals
import suzumio_approvals
import suzumio_coordination as coordination
import suzumio_diff
import suzumio_effects
import suzumio_guards
import suzumio_inbox
import suzumio_mcp_server
import suzumio_openapi
import suzumio_output
import suzumio_project_files
import suzumio_replay
import suzumio_repository
import suzumio_scheduler
import suzumio_sse
import suzumio_yaml
from suzumio_errors import BadRequest, Forbidden, NotFound, SuzumioError, Unauthorized
from suzumio_http import (
    JSON_TYPE,
    NOSNIFF,
    VERSION_HEADER,
    SharedAnswer,
    base_app,
    encode_json_item,
    error_response,
    floored,
    join_json_items,
    json_response,
    limit_param,
    optional_string,
    read_body,
    read_fields,
    run_tick,
    text_response,
    timestamp_param,
)
from suzumio_records import format_ts, utc_now
from suzumio_resources import VERSION, resource_path

log = logging.getLogger(__name__)

WEBUI_DIR = resource_path("webui_dist")  # beside the modules, or under <prefix>/share/suzumio
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
DECIDER_HEADER = "Suzumio-Client"  # `webui` when the control room decides an approval
MCP_PATH = "/mcp"  # Suzumio as an MCP server
STREAM_PATH = re.compile(r"^/api/projects/[^/]+/stream$")
ASSET_TYPES = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".json": JSON_TYPE,
}
ASSET_MISSING = "webui asset not found. Run npm run build."
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_KEEP_ALIVE_SECONDS = 15.0
LOOP_POLL_SECONDS = 0.5  # how long the HTTP loop waits per poll; bounds shutdown latency
# Open connections Waitress accepts before it pauses accepting: runners, stream clients and browsers.
CONNECTION_LIMIT = 1000
REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"authorization|api[-_]?key|token|secret|cookie|password", re.IGNORECASE)
SECRET_KEYS = ("apiKey", "appSecret")
URL_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*:)([^/@\s]*)(@)")


# ---------------------------------------------------------------- small readers (docs/http-api.md)

# Time-range paging of the team view (docs/http-api.md): its own, larger page cap.
TIMELINE_LIMIT_DEFAULT = 500
TIMELINE_LIMIT_MAX = 2000


def timeline_limit(raw):
    """Like limit_param but capped at 2000 (and floored before the positive check)."""
    value = floored(raw)
    if value is None or value <= 0:
        return TIMELINE_LIMIT_DEFAULT
    return min(TIMELINE_LIMIT_MAX, value)


# ---------------------------------------------------------------- request guards (docs/http-api.md)

def host_part(host_header):
    """The Host header without its port; an IPv6 literal keeps its brackets."""
    host = host_header.strip()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if ":" in host else host


def bracketed(host):
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class Guards:
    """The three checks, run before route matching on every path of the user listener: the
    Host and cross-origin checks answer 403, the API token 401."""

    def __init__(self, api_token, allowed_hosts, bound_host):
        self.api_token = api_token
        self.allowed = {h.lower() for h in (*LOOPBACK_HOSTS, bracketed(bound_host), *allowed_hosts)}

    def check(self, environ, path):
        host = environ.get("HTTP_HOST")
        if host is not None and host_part(host).lower() not in self.allowed:
            raise Forbidden(f"Host not allowed: {host_part(host)}")
        if not path.startswith("/api/") and path != MCP_PATH:
            return
        if environ.get("REQUEST_METHOD") == "POST" and self.cross_origin(environ, host):
            raise Forbidden("Cross-origin request rejected")
        if self.api_token is not None:
            self.check_token(environ, path)

    @staticmethod
    def cross_origin(environ, host):
        if environ.get("HTTP_SEC_FETCH_SITE", "").lower() == "cross-site":
            return True
        origin = environ.get("HTTP_ORIGIN")
        if origin is None:
            return False
        same = {f"http://{host}".lower(), f"https://{host}".lower()} if host else set()
        return origin.lower() not in same

    def check_token(self, environ, path):
        given = None
        scheme, _, credential = environ.get("HTTP_AUTHORIZATION", "").strip().partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            given = credential.strip()
        elif STREAM_PATH.match(path):
            given = urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).get("token", [None])[0]
        if given is None:
            raise Unauthorized("API token required")
        if not hmac.compare_digest(given.encode("utf-8"), self.api_token.encode("utf-8")):
            raise Unauthorized("Invalid API token")


# ---------------------------------------------------------------- config redaction

def redact_config(tree):
    """Secrets replaced by <redacted>; environment variable names stay visible."""
    return _redact(tree, ())


def _redact(value, path):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            here = (*path, key)
            if key in SECRET_KEYS or (_named_secret_map(path) and SECRET_NAME.search(key)):
                out[key] = REDACTED
            else:
                out[key] = _redact(item, here)
        return out
    if isinstance(value, list):
        return [_redact(item, path) for item in value]
    if isinstance(value, str):
        return URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), value)
    return value


def _named_secret_map(path):
    """headers / options.headers mappings and agents.<id>.env mappings."""
    if path and path[-1] == "headers":
        return True
    return len(path) == 3 and path[0] == "agents" and path[2] == "env"


# ---------------------------------------------------------------- the app

class ProjectListText:
    """The text of GET /api/projects, each project's part encoded once for as long as the root serves
    the same summary from its cache (with hundreds of projects, encoding is most of the answer's cost)."""

    def __init__(self):
        self._parts = {}  # project id -> (summary, text)
        self._lock = threading.Lock()

    def encode(self, summaries):
        texts = []
        with self._lock:
            parts = {}
            for summary in summaries:
                cached = self._parts.get(summary["id"])
                text = cached[1] if cached is not None and cached[0] is summary else encode_json_item(summary)
                parts[summary["id"]] = (summary, text)
                texts.append(text)
            self._parts = parts
        return join_json_items(texts)


def make_app(root, scheduler, backends, toolpacks, *, api_token=None, allowed_hosts=(),
             bound_host="127.0.0.1", webui_dir=WEBUI_DIR,
             poll_seconds=DEFAULT_POLL_SECONDS, keep_alive_seconds=DEFAULT_KEEP_ALIVE_SECONDS, liveness=None,
             evals=None):
    """The user listener's WSGI app: user routes, SSE, static WebUI, guards and the one error shape.
    Runner routes are not here (a 404): suzumio_runner_support.make_runner_app serves them.

    `scheduler` is a suzumio_scheduler.Scheduler (tick); `backends` (suzumio_backend.Backends) stops runners for stop
    and approve; `api_token` None turns the token check off (`serve --no-auth`); `poll_seconds` bounds how
    late the streams see events written by another process, `keep_alive_seconds` how long a stream stays
    silent; `liveness()` names the state of each long-lived loop of the process for /health (`up`, or why
    it is down); `evals` (a suzumio_store_evals.EvalStore) adds the evals routes. Open streams end with
    Server.close()."""
    app = base_app()
    guards = Guards(api_token, allowed_hosts, bound_host)

    @app.hook("before_request")
    def before_request():
        environ = bottle.request.environ
        try:
            guards.check(environ, environ["PATH_INFO"])
        except SuzumioError as exc:
            raise error_response(exc.status, exc.message) from None

    mount_user_routes(app, root, scheduler, backends, toolpacks, liveness)
    suzumio_api_evals.mount_eval_routes(app, evals)
    # Open streams are served by one hub thread; Server.close() ends them.
    hub = app.config["suzumio.streams"] = suzumio_sse.StreamHub(root, poll_seconds, keep_alive_seconds)
    mount_stream(app, root, hub)
    # Suzumio as an MCP server, behind the same guards and token as /api/.
    suzumio_mcp_server.mount_mcp(app, suzumio_mcp_server.SuzumioMcp(
        root, lambda project: run_tick(scheduler.tick, project), backends, toolpacks.configs, evals=evals))
    mount_static(app, Path(webui_dir))
    return app


DISK_LOW_BYTES = 1 << 20  # below this, writes of the root are failing or about to (/health says so)


def disk_state(path):
    """`up`, or why the disk of the runtime root is not: what /health names as its `disk`."""
    try:
        free = shutil.disk_usage(path).free
    except OSError as error:
        return f"unreadable ({error.strerror})"
    return "up" if free >= DISK_LOW_BYTES else f"full ({free} bytes free)"


def mount_user_routes(app, root, scheduler, backends, toolpacks, liveness=None):
    """The user routes: health, projects, messages, history, activations, tools and control."""
    project_list = ProjectListText()
    listing = SharedAnswer(lambda: project_list.encode(root.project_summaries()))

    def tick(store):
        run_tick(scheduler.trigger, store.project_id)

    def limit_query(default):
        return limit_param(bottle.request.query.get("limit"), default)

    @app.get("/health")
    def health():
        components = dict(liveness() if liveness is not None else {})
        disk = disk_state(root.path)
        if disk != "up":
            components["disk"] = disk
        down = {name: state for name, state in components.items() if state != "up"}
        if not down:
            return json_response({"healthy": True})
        return json_response({"healthy": False, "components": components}, status=503)

    @app.get("/api/version")
    def version():
        return json_response({"version": VERSION})

    @app.get("/api/openapi.json")
    def openapi():
        return json_response(suzumio_openapi.document())

    @app.get("/api/projects")
    def projects():
        return bottle.HTTPResponse(listing.get(), 200,
                                   {"Content-Type": JSON_TYPE, NOSNIFF[0]: NOSNIFF[1]})

    @app.get("/api/projects/<project>")
    def project(project):
        return json_response(root.open_project(project).project_summary(full=True))

    @app.get("/api/projects/<project>/task")
    def task(project):
        return text_response(root.open_project(project).project()["task"])

    @app.get("/api/projects/<project>/agents")
    def agents(project):
        return json_response(root.open_project(project).public_agents())

    @app.get("/api/projects/<project>/agents/<agent>/history")
    def history(project, agent):
        query = bottle.request.query
        page = root.open_project(project).history_page(
            agent, limit=limit_query(100), before=floored(query.get("before")),
            include_archived=query.get("includeArchived") != "0")
        return json_response(page)

    @app.get("/api/projects/<project>/agents/<agent>/history-archive/<compaction>")
    def history_archive(project, agent, compaction):
        return json_response(root.open_project(project).history_archive(agent, compaction))

    @app.get("/api/projects/<project>/messages")
    def messages(project):
        return json_response(root.open_project(project).list_messages(limit_query(100)))

    @app.get("/api/projects/<project>/messages/<message>")
    def message(project, message):
        return json_response(root.open_project(project).message(message))

    @app.get("/api/projects/<project>/events")
    def events(project):
        query = bottle.request.query
        return json_response(root.open_project(project).list_events(
            limit_query(200), shrink_data=True, before=query.get("before") or None,
            event_type=query.get("type") or None, agent=query.get("agent") or None))

    @app.get("/api/projects/<project>/activations")
    def activations(project):
        return json_response(root.open_project(project).list_activations(limit_query(100)))

    @app.get("/api/projects/<project>/costs")
    def costs(project):
        """Controller-observed tokens and USD per activation, per agent and for the project."""
        return json_response(root.open_project(project).model_costs())

    @app.get("/api/projects/<project>/timeline")
    def timeline(project):
        query = bottle.request.query
        limit = timeline_limit(query.get("limit"))
        return json_response(root.open_project(project).timeline_page(
            since=timestamp_param(query.get("since"), "since"),
            until=timestamp_param(query.get("until"), "until"), limit=limit))

    @app.get("/api/projects/<project>/activations/<activation>/context")
    def context(project, activation):
        return json_response(root.open_project(project).activation_context(activation))

    @app.get("/api/projects/<project>/tool-calls")
    def tool_calls(project):
        return json_response(root.open_project(project).list_tool_calls(limit_query(100)))

    @app.get("/api/projects/<project>/tool-status")
    def tool_status(project):
        return json_response(toolpacks.tool_status(root.open_project(project)))

    @app.get("/api/projects/<project>/tool-ui")
    def tool_ui(project):
        return json_response(toolpacks.webui_entries(root.open_project(project)))

    @app.post("/api/projects/<project>/tool-ui/<toolpack_id>/<entry_id>")
    def tool_ui_invoke(project, toolpack_id, entry_id):
        store = root.open_project(project)
        return json_response(toolpacks.invoke_webui(store, toolpack_id, entry_id, read_body()))

    @app.get("/api/projects/<project>/config/resolved")
    def config_resolved(project):
        path = root.open_project(project).resolved_yaml_path
        tree = suzumio_yaml.parse_yaml(path.read_text(encoding="utf-8"), str(path))
        return text_response(suzumio_yaml.dump_yaml(redact_config(tree)))

    @app.get("/api/projects/<project>/report")
    def report(project):
        answer = suzumio_output.report(root.open_project(project))
        if wants_json():
            return json_response(answer)
        return text_response(answer["report"] if answer["report"] is not None else "No report submitted.")

    @app.post("/api/projects/<project>/start")
    def start(project):
        store = root.open_project(project)
        store.start()
        tick(store)
        return json_response(store.project_summary(full=True))

    @app.post("/api/projects/<project>/stop")
    def stop(project):
        store = root.open_project(project)
        suzumio_scheduler.stop_project(store, backends)
        return json_response(store.project_summary(full=True))

    @app.post("/api/projects/<project>/approve")
    def approve(project):
        store = root.open_project(project)
        suzumio_scheduler.approve_project(store, backends)
        return json_response(store.project_summary(full=True))

    @app.post("/api/projects/<project>/request-changes")
    def request_changes(project):
        store = root.open_project(project)
        body = read_fields()
        coordination.request_changes(store, toolpacks.configs.get(store), body.get("body"),
                                     recipient=optional_string(body.get("recipient")))
        tick(store)
        return json_response(store.project_summary(full=True))

    # Approval requests; deciding is a user route only (never on the runner listener).
    @app.get("/api/projects/<project>/approvals")
    def approvals(project):
        store = root.open_project(project)
        status = bottle.request.query.get("status") or None
        return json_response(suzumio_approvals.list_approvals(store, status=status, limit=limit_query(200)))

    @app.get("/api/projects/<project>/approvals/<approval>")
    def approval_request(project, approval):
        return json_response(suzumio_approvals.approval(root.open_project(project), approval))

    @app.post("/api/projects/<project>/approvals/<approval>")
    def decide_approval(project, approval):
        store = root.open_project(project)
        decision = suzumio_approvals.check_decision(read_body())
        via = bottle.request.get_header(DECIDER_HEADER, "api").strip().lower()
        return json_response(suzumio_approvals.decide(store, approval, **decision, config=toolpacks.configs.get(store),
                                                      via=via if via in ("api", "webui") else "api"))

    # The effect ledger: external tool calls, and a person's word on one in doubt.
    @app.get("/api/projects/<project>/effects")
    def effects(project):
        state = bottle.request.query.get("state") or None
        return json_response(suzumio_effects.list_effects(root.open_project(project), state=state,
                                                          limit=limit_query(200)))

    @app.post("/api/projects/<project>/effects/<effect>/resolve")
    def resolve_effect(project, effect):
        store = root.open_project(project)
        body = read_body()
        if not isinstance(body, dict):
            raise BadRequest("Expected a JSON object with resolution")
        via = bottle.request.get_header(DECIDER_HEADER, "api").strip().lower()
        resolved = suzumio_effects.resolve(store, effect, body.get("resolution"), note=body.get("note"),
                                           via=via if via in ("api", "webui") else "api")
        tick(store)
        return json_response(resolved)

    @app.post("/api/projects/<project>/agents/<agent>/resume")
    def resume_agent(project, agent):
        store = root.open_project(project)
        suzumio_guards.check_resume(read_body())
        via = bottle.request.get_header(DECIDER_HEADER, "api").strip().lower()
        resumed = suzumio_guards.resume(store, agent, via=via if via in ("api", "webui") else "api")
        tick(store)
        return json_response(resumed)

    @app.get("/api/projects/<project>/concurrency")
    def concurrency(project):
        store = root.open_project(project)
        return json_response(suzumio_guards.concurrency(store, toolpacks.configs.get(store),
                                                        getattr(scheduler, "caps", None)))
    @app.get("/api/projects/<project>/diff/<other>")
    def diff(project, other):
        return json_response(suzumio_diff.diff_projects(root.open_project(project), root.open_project(other)))

    @app.post("/api/projects/<project>/fork")
    def fork(project):
        body = read_fields()
        store = suzumio_replay.create_fork(root, project, body.get("as"), body.get("at"),
                                           config_text=body.get("config"))
        tick(store)
        return json_response(store.project_summary(full=True), status=201)

    @app.post("/api/projects/<project>/replay")
    def replay(project):
        body = read_fields()
        store = suzumio_replay.create_replay(
            root, project, body.get("as"), tools=body.get("tools", "live"), on_diverge=body.get("onDiverge", "stop"),
            config_text=body.get("config"))
        tick(store)
        return json_response(store.project_summary(full=True), status=201)

    @app.post("/api/projects/<project>/messages")
    def send_message(project):
        store = root.open_project(project)
        body = read_fields()
        message = coordination.send_user_message(
            store, toolpacks.configs.get(store), sender=optional_string(body.get("sender")) or "user",
            body=body.get("body"),
            recipient=optional_string(body.get("recipient")), channel=optional_string(body.get("channel")),
            priority=body.get("priority"), grouped=True)
        tick(store)
        return json_response(message)

    mount_output_routes(app, root)
    mount_inbox_routes(app, root)
    mount_project_file_routes(app, root, scheduler)
    mount_repository_routes(app, root, toolpacks.configs)


def mount_inbox_routes(app, root):
    """What waits for a person (suzumio_inbox): across the root and per project."""

    @app.get("/api/inbox")
    def inbox():
        return json_response(suzumio_inbox.root_inbox(root))

    @app.get("/api/projects/<project>/inbox")
    def project_inbox(project):
        return json_response(suzumio_inbox.project_inbox(root.open_project(project)))


def mount_project_file_routes(app, root, scheduler):
    """Project files sent as text (suzumio_project_files): checked, and initialized (then started)."""

    @app.post("/api/config/validate")
    def config_validate():
        return json_response(suzumio_project_files.check(read_fields().get("config")))

    @app.post("/api/projects")
    def create_project():
        body = read_fields()
        start = body.get("start", False)
        if not isinstance(start, bool):
            raise BadRequest("start must be true or false")
        store = suzumio_project_files.init_from_text(root, body.get("config"))
        if start:
            store.start()
            run_tick(scheduler.trigger, store.project_id)
        return json_response(store.project_summary(full=True), status=201)


def mount_repository_routes(app, root, configs):
    """The team's repository as people read it (suzumio_repository): branches, log, queue, claims, diffs."""

    @app.get("/api/projects/<project>/repository")
    def repository_overview(project):
        store = root.open_project(project)
        return json_response(suzumio_repository.overview(store, configs.get(store), format_ts(utc_now())))

    @app.get("/api/projects/<project>/repository/diff")
    def repository_diff(project):
        store = root.open_project(project)
        query = bottle.request.query
        return json_response(suzumio_repository.diff(store, configs.get(store), query.get("from") or None,
                                                     query.get("to") or None))


def wants_json():
    """Whether the request's Accept header asks for JSON rather than text (`GET …/report`)."""
    return "application/json" in bottle.request.get_header("Accept", "")


def mount_output_routes(app, root):
    """The team's output (suzumio_output): the artifact files, one version's content, two versions compared."""

    def version_query(name):
        value = bottle.request.query.get(name)
        return None if value is None or value == "" else suzumio_output.version_number(value, name)

    @app.get("/api/projects/<project>/artifacts")
    def artifacts(project):
        return json_response(suzumio_output.artifact_files(root.open_project(project)))

    # Before the content route: `<agent>/<path>/diff` asks for a diff (a file named `diff` is read with
    # neither `from` nor `to`).
    @app.get("/api/projects/<project>/artifacts/<path:path>/diff")
    def artifact_diff(project, path):
        store = root.open_project(project)
        query = bottle.request.query
        if query.get("from") is None and query.get("to") is None:
            return artifact_content(project, f"{path}/diff")
        old = version_query("from")
        if old is None:
            raise BadRequest("from is required (a version number)")
        return json_response(suzumio_output.artifact_diff(store, path, old, version_query("to")))

    @app.get("/api/projects/<project>/artifacts/<path:path>")
    def artifact_content(project, path):
        found = suzumio_output.artifact(root.open_project(project), path, version_query("version"))
        if bottle.request.query.get("raw") not in (None, "", "0"):
            name = urllib.parse.quote(suzumio_output.download_name(found["path"]))
            return bottle.HTTPResponse(found["data"], 200, {
                "Content-Type": "application/octet-stream", NOSNIFF[0]: NOSNIFF[1],
                "Content-Disposition": f"attachment; filename*=UTF-8''{name}"})
        return json_response(suzumio_output.artifact_json(found))


# ---------------------------------------------------------------- SSE

def mount_stream(app, root, hub):
    """GET …/stream: checked and its replay read here, then the connection goes to `hub`
    (suzumio_sse.StreamHub), which sends every later event; the worker thread is free at once."""

    @app.get("/api/projects/<project>/stream")
    def stream(project):
        store = root.open_project(project)
        last_event_id = bottle.request.get_header("Last-Event-ID")
        cursor = store.event_rowid(last_event_id) if last_event_id else None
        if cursor is None:
            replay, cursor = store.event_replay(limit_param(bottle.request.query.get("limit"), 100))
        else:
            replay = []
        # No `Connection: keep-alive`: a stream ends only with its connection.
        headers = [("Cache-Control", "no-cache"), ("Content-Type", "text/event-stream; charset=utf-8"),
                   NOSNIFF, (VERSION_HEADER, VERSION)]
        environ = bottle.request.environ
        hand_off = environ.get(suzumio_sse.HAND_OFF)
        if hand_off is None or bottle.request.method == "HEAD":
            return bottle.HTTPResponse(b"", 200, dict(headers))
        sock = hand_off()
        if sock is not None:  # None: the client left before its stream began
            head, chunked = suzumio_sse.response_head(environ.get("SERVER_PROTOCOL"), headers)
            hub.open(sock, store.project_id, cursor, head,
                     b"".join(suzumio_sse.sse_frame(row) for _rowid, row in replay), chunked)
        return bottle.HTTPResponse(b"", 200)


# ---------------------------------------------------------------- static WebUI (docs/design/webui.md)

def mount_static(app, webui_dir):
    def send(path, content_type, extra=()):
        try:
            found = path.is_file()
        except OSError:  # a name the OS refuses (too long, for example) names no asset
            found = False
        if not found:
            raise NotFound(ASSET_MISSING)
        headers = {"Content-Type": content_type, NOSNIFF[0]: NOSNIFF[1], **dict(extra)}
        return bottle.HTTPResponse(path.read_bytes(), 200, headers)

    @app.get("/")
    def index():
        return send(webui_dir / "index.html", "text/html; charset=utf-8",
                    {"Content-Security-Policy": "default-src 'self'", "Cache-Control": "no-cache"})

    @app.get("/assets/<asset:path>")
    def asset(asset):
        assets = (webui_dir / "assets").resolve()
        if "\x00" in asset:
            raise NotFound("not found")
        target = (assets / asset).resolve()
        if target != assets and assets not in target.parents:
            raise NotFound("not found")
        return send(target, ASSET_TYPES.get(target.suffix.lower(), "application/octet-stream"))


# ---------------------------------------------------------------- Waitress

class Server:
    """An app on Waitress in a named thread, on host:port or, with `unix_socket`, on that socket path
    (mode 0666: the socket's directory and the agent token decide who gets in); close() ends streams,
    then stops Waitress."""

    def __init__(self, app, host="127.0.0.1", port=0, threads=32, connection_limit=CONNECTION_LIMIT,
                 on_fatal=None, unix_socket=None, name="suzumio-http"):
        self.app = app
        self.unix_socket = None if unix_socket is None else str(unix_socket)
        where = ({"unix_socket": self.unix_socket, "unix_socket_perms": "666"} if unix_socket is not None
                 else {"host": host, "port": port})
        # poll(), never select(): select() fails outright once any descriptor number passes 1024.
        self.server = waitress.server.create_server(
            app, threads=threads, send_bytes=1, channel_request_lookahead=1,
            clear_untrusted_proxy_headers=True, ident="suzumio", asyncore_use_poll=True,
            connection_limit=connection_limit, **where)
        # SSE streams leave the worker threads for the app's hub (suzumio_sse), which the loop's fatal
        # error handler also covers.
        suzumio_sse.install_hand_off(self.server)
        # A Bottle app of make_app has its SSE hub in its config, one with the runner routes its model loop;
        # any other WSGI callable has neither.
        config = getattr(app, "config", {})
        self.loops = [config[key] for key in ("suzumio.streams", "suzumio.model_loop") if config.get(key) is not None]
        if on_fatal is not None:
            for loop in self.loops:
                loop.on_fatal = lambda error: on_fatal("http", error)
        self.port = None if unix_socket is not None else int(self.server.effective_port)
        # The socket this server bound, so that close() removes it only while it is still this one
        # (a newer serve may already have replaced it).
        self._socket_inode = os.stat(self.unix_socket).st_ino if unix_socket is not None else None
        self.on_fatal = on_fatal  # called with the error if the loop itself dies
        self._closing = threading.Event()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _serve(self):
        # Waitress's own run(), one poll at a time, so that the loop thread itself notices close()
        # and closes every socket: the loop never polls a descriptor another thread closed, and
        # shutdown does not depend on the trigger pipe being intact.
        try:
            while not self._closing.is_set() and self.server._map:
                waitress.wasyncore.loop(timeout=LOOP_POLL_SECONDS, map=self.server._map, use_poll=True, count=1)
        except BaseException as error:  # the loop's one boundary: a deaf server must end the process
            log.critical("HTTP loop died", exc_info=True)
            if self.on_fatal is None:
                raise
            self.on_fatal("http", error)
        finally:
            self._close_sockets()

    def close(self):
        """End open streams and let the worker threads finish (they wake the loop as they finish, so the
        trigger must still be open), then have the loop thread close every socket. Idempotent."""
        for loop in self.loops:
            loop.close()
        self.server.task_dispatcher.shutdown()
        self._closing.set()
        if self.thread.is_alive():
            try:
                self.server.trigger.pull_trigger()  # wakes the loop now rather than at its next poll
            except OSError as exc:
                log.warning("waitress trigger unusable at shutdown (%s); the loop stops at its next poll", exc)
            self.thread.join(timeout=10)
        else:
            self._close_sockets()

    def _close_sockets(self):
        self.server.close()
        waitress.wasyncore.close_all(self.server._map)
        if self._socket_inode is not None:
            try:
                if os.stat(self.unix_socket).st_ino == self._socket_inode:
                    os.unlink(self.unix_socket)
            except FileNotFoundError:
                pass
            self._socket_inode = None
