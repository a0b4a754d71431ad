"""Hostile-input fixtures: a served app whose ticks can never start a runner (so every row change comes
from the request under test), the route table read from the app itself, a raw HTTP client that sends
paths byte for byte, the database snapshot and integrity checks, and the error-shape oracle of
docs/http-api.md Imported by tests/test_fuzz.py and tests/test_isolation.py."""
import contextlib
import http.client
import json
import logging
import os
import re
import urllib.parse

from api_fixtures import init_project, project_yaml, running_activation, serving
from store_fixtures import config_of

import suzumio_coordination as coordination
from suzumio_runner_models import UnixHTTPConnection

log = logging.getLogger(__name__)

RUNNER_PREFIXES = ("/runner/", "/toolpacks/", "/activation-")
PLACEHOLDER = re.compile(r"<(\w+)(?::\w+)?>")
JSON_TYPE = "application/json; charset=utf-8"
VALID_STATUSES = {200, 400, 401, 403, 404, 409, 500}
# The MCP endpoint (docs/mcp.md) also answers 202 (a notification) and 405 (GET: no stream).
MCP_STATUSES = {202, 405}
# The eval routes answer 503 in an app without the eval thread (docs/http-api.md#evals): the fuzzed app is one.
EVAL_PATHS = re.compile(r"^/api/evals(/[^/]+(/stream)?)?$")
EVAL_STATUSES = {503}
CONTEXT = {"version": 1, "kind": "model-context", "messages": []}

# Python internals that must never reach a client (a traceback, a repr, an exception class name).
LEAKS = re.compile(
    r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+|<[\w.]+ object at 0x[0-9a-f]+>"
    r"|\b(?:KeyError|TypeError|AttributeError|IndexError|NameError|RecursionError|OverflowError"
    r"|UnicodeEncodeError|UnicodeDecodeError|sqlite3\.\w+)\b|'(?:NoneType|dict|list|str|int|float|bool)' object"
    r"|object has no attribute|not subscriptable|unhashable type|positional argument")

# docs/http-api.md (and the store/tools texts it names): every 4xx message and the statuses it may carry.
ERROR_TEXTS = [
    (r"not found", {404}),
    (r"Invalid JSON body: .+", {400}),
    (r"Request body too large \(limit \d+ bytes\)", {400}),
    (r"\S+ is required", {400}),
    (r"output(\.text)? is required|context is required|Invalid activation context", {400}),
    (r"Invalid history role: .*|Invalid tool call status: .*|payload must be an object", {400}),
    (r"Expected boolean, got .*|Invalid priority: .*", {400}),
    (r"Message needs recipient or channel|Message cannot have both recipient and channel: drop .*", {400}),
    (r"Unknown channel: .*", {400}),
    (r"Targeted signals cannot be closed; omit the target or omit status|Invalid signal status: .*", {400}),
    (r"Unknown agent: .*", {400, 404}),
    (r"Invalid agent token|Activation \S+ does not belong to \S+|Tool not allowed for \S+: .*", {403}),
    (r"Host not allowed: .*|Cross-origin request rejected", {403}),
    (r"API token required|Invalid API token", {401}),
    (r"Unknown project: .*|Unknown activation: .*|Unknown tool call for activation: .*", {404}),
    (r"Unknown toolpack: .*|Tool .+ is not in toolpack .+|Unknown tool: .*|Unknown message: .*", {404}),
    (r"Unknown history compaction: .*|Unknown WebUI entry .+ in toolpack .+", {404}),
    (r"webui asset not found\. Run npm run build\.", {404}),
    (r"Activation \S+ is \w+; (no more (tool|model) calls are accepted|history updates are not accepted"
     r"|its files are no longer exchanged)", {409}),
    # files through the controller (backend.kind swarm; docs/http-api.md, runner routes)
    (r"path must be an absolute, normalized path|Not a regular file: .*|\S+ leads out of .*|\S+ is larger than .*",
     {400}),
    (r"No such file: .*|\S+ is not readable by this activation .*", {404}),
    (r"changes must be a non-empty array|changes holds more than \d+ entries|changes\.\d+.*|\S+: \S+ is not a folder"
     r"|\S+ is a folder in the (artifacts folder|workspace); .*", {400}),
    (r"artifact quota exceeded \(.*\)", {409}),
    (r"\S+ has no working copy of the repository \(repository\.agents\): its /workspace is its task's own", {403}),
    # /runner/model (suzumio_model_proxy; docs/spec-notes.md#model-requests-go-through-the-controller)
    (r"Model preset not found: .*", {404}),
    (r"Model preset \S+ is not selected for \S+", {403}),
    (r"Model preset \S+ is a model list; .*|Model preset \S+ uses provider \S+, not .*", {400}),
    (r"Provider \S+ is scripted: .*|Provider type \S+ is not supported by this version .*", {400}),
    (r"Method not allowed: POST JSON-RPC messages to /mcp", {405}),
    # approvals
    (r"Unknown approval: .*|Unknown approval for activation: .*", {404}),
    (r"decision must be one of .*|note must be a string|note is longer than \d+ characters", {400}),
    (r"Expected a JSON object with decision|Invalid approval status: .*|waitMs must be a non-negative number",
     {400}),
    (r"Approval \S+ is already \w+|Tool call \S+ needs an approval that was not given", {409}),
    # edits and answers (docs/http-api.md, approvals)
    (r"input is accepted only with decision allow|input must be a JSON object|input does not fit the input schema .+"
     r"|output is required with decision respond .*|output is accepted only with decision respond"
     r"|output is longer than \d+ characters", {400}),
    # loop guards (docs/http-api.md, loop guards and concurrency caps)
    (r"Agent \S+ is not paused", {409}),
    (r"Expected a JSON object", {400}),
    # tool-call keys (`callKey`, docs/http-api.md#runner-routes)
    (r"callKey must be 1 to \d+ letters, digits, '\.', '_', ':' or '-'", {400}),
    (r"callKey \S+ was already used for another tool call", {409}),
    # replays, forks and diffs (docs/replay.md)
    (r"tools must be one of live, recorded|onDiverge must be one of stop, live", {400}),
    (r"config must be a project file \(YAML text\)|config must have the source's agents .*|config: .*", {400}),
    (r"Invalid project name: .*", {400}),
    # the effect ledger (docs/http-api.md#effects)
    (r"Expected a JSON object with resolution|resolution must be one of .*|Invalid effect state: .*", {400}),
    (r"Unknown effect: .*", {404}),
    (r"Effect \S+ is \w+, not in doubt", {409}),
    # the team's repository and output (docs/http-api.md#the-teams-repository, #the-teams-output-report-and-artifacts)
    (r"Project \S+ has no repository \(repository: in its project file\)", {400, 404}),
    (r"\S+: not a revision: .*|Invalid artifact path: .*|\S+ must be a positive integer, got .*|\S+ is not text; .*",
     {400}),
    (r"\S+: unknown revision: .*|Unknown artifact: .*|No recorded versions of .*|Unknown version \d+ of .*"
     r"|Version \d+ of .+ is no longer stored", {404}),
    (r"start must be true or false|from is required \(a version number\)|Invalid project config: .*", {400}),
    # evals (docs/http-api.md#evals)
    (r"mode must be one of .*|--mode \S+ needs .*|runs must be a whole number of at least 1|--at .*"
     r"|team: must be an absolute path .*|variants must be a list of variant names"
     r"|failUnder must be a rate between 0 and 1|Invalid eval suite:.*", {400}),
    (r"Eval not found: .*|Eval \S+ has no run .*", {404}),
    (r"Evals run only in `suzumio serve` \(this app has no eval thread\)", {503}),
    (r"Project already initialized: .*|Project \S+ is \w+; replay a run that has ended", {409}),
    (r"Activation \S+ is running; fork at an activation that has ended|Activation \S+ has no recorded artifacts .*",
     {409}),
    (r"Replay \S+ diverged at request \d+ of activation \S+; the replay is stopped", {409}),
]
ERROR_PATTERNS = [(re.compile(pattern, re.DOTALL), statuses) for pattern, statuses in ERROR_TEXTS]
# Errors raised inside a tool support handler or a WebUI handler are 500 whatever their text.
HANDLER_ROUTES = (re.compile(r"^/api/projects/[^/]+/tool-ui/[^/]+/[^/]+$"), re.compile(r"^/toolpacks/[^/]+/support$"))


# ---------------------------------------------------------------- routes

def app_routes(service):
    """(method, rule) of every route the two served apps answer, read from the Bottle apps themselves."""
    return sorted({(route.method, route.rule) for server in (service.server, service.runner_server)
                   for route in server.app.routes})


def is_runner_rule(rule):
    return rule.startswith(RUNNER_PREFIXES)


def placeholders(rule):
    return PLACEHOLDER.findall(rule)


def fill(rule, values):
    """The rule with each placeholder replaced by the already-encoded text in `values`."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], rule)


def encode_segment(text):
    return urllib.parse.quote(text, safe="")


# ---------------------------------------------------------------- raw HTTP

class Reply:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def text(self):
        return self.body.decode("utf-8", errors="replace")

    def json(self):
        return json.loads(self.body.decode("utf-8"))


def raw_request(listener, method, target, body=None, headers=None, host=None):
    """Send the request target exactly as given (no dot-segment removal, no re-quoting) to a TCP port
    of 127.0.0.1 or, when `listener` is a path, to that Unix socket. A streaming 200 is answered with
    its headers only."""
    if isinstance(listener, int):
        connection = http.client.HTTPConnection("127.0.0.1", listener, timeout=30)
        default_host = f"127.0.0.1:{listener}"
    else:
        connection = UnixHTTPConnection(str(listener), timeout=30)
        default_host = "localhost"
    try:
        connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        sent = {"Host": host if host is not None else default_host, **(headers or {})}
        if body is not None:
            sent.setdefault("Content-Length", str(len(body)))
        for name, value in sent.items():
            if value is not None:
                connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        content_type = response.getheader("Content-Type", "")
        if response.status == 200 and content_type.startswith("text/event-stream"):
            return Reply(response.status, dict(response.getheaders()), b"")
        return Reply(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


# ---------------------------------------------------------------- oracles

class ExceptionLog(logging.Handler):
    """Collects every record logged with a traceback: an exception no boundary anticipated."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        if record.exc_info:
            self.records.append(record)

    def drain(self):
        records, self.records = self.records, []
        return [f"{r.getMessage()}: {r.exc_info[0].__name__}: {r.exc_info[1]}" for r in records]


@contextlib.contextmanager
def exception_log():
    handler = ExceptionLog()
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


def error_problems(reply, path):
    """What is wrong with a response under docs/http-api.md; [] when it is fine."""
    problems = []
    extra = MCP_STATUSES if path == "/mcp" else EVAL_STATUSES if EVAL_PATHS.match(path) else set()
    if reply.status not in VALID_STATUSES | extra:
        problems.append(f"status {reply.status} is outside the documented mapping")
    handler_route = any(pattern.match(path) for pattern in HANDLER_ROUTES)
    if reply.status == 500 and not handler_route:
        problems.append("500 on a route whose errors are all 4xx")
    if LEAKS.search(reply.text):
        problems.append("Python internals in the response")
    if reply.status < 400:
        return problems
    if reply.headers.get("Content-Type") != JSON_TYPE:
        problems.append(f"error content type {reply.headers.get('Content-Type')!r}")
    try:
        body = reply.json()
    except ValueError:
        return problems + ["error body is not JSON"]
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], str) or not body["error"]:
        return problems + ["error body is not {\"error\": <non-empty string>}"]
    if reply.status == 500:
        return problems
    message = body["error"]
    allowed = [statuses for pattern, statuses in ERROR_PATTERNS if pattern.fullmatch(message)]
    if not allowed:
        problems.append(f"error text {message!r} is not one of docs/http-api.md")
    elif not any(reply.status in statuses for statuses in allowed):
        problems.append(f"error text {message!r} with status {reply.status}")
    return problems


def table_counts(store):
    names = [row["name"] for row in store.db_all("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {name: store.db_get(f'SELECT COUNT(*) AS n FROM "{name}"')["n"] for name in names}


def files_under(path):
    """Every file and folder under `path` except the SQLite files themselves."""
    found = set()
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            if ".sqlite" not in name:
                found.add(os.path.relpath(os.path.join(folder, name), path))
    return found


class World:
    """The served app with `demo` (user routes; its agents are stopped, so a tick never starts a runner)
    and `side` (runner routes; never running, so a tick returns at once). Every row a request writes is
    therefore written by that request, before it answers."""

    def __init__(self, service, tmp_path):
        self.service = service
        self.tmp_path = tmp_path
        self.port = service.port
        self.root_path = service.root.path
        self.demo = service.store("demo")
        self.side = service.store("side")
        self.tokens = {(p, a): service.token(p, a) for p in ("demo", "side") for a in ("pm", "worker")}
        self.demo.start()
        done = running_activation(self.demo, "pm")
        self.demo.record_activation_context(done["id"], "pm", CONTEXT)
        coordination.complete_activation(self.demo, config_of(self.demo), done["id"], "pm", "done")
        self.demo_activation = done["id"]
        self.demo_message = coordination.send_message(self.demo, config_of(self.demo), "user", "hello",
                                                      recipient="pm")["id"]
        # Agent status `stopped` has no transition out of it: ticks skip these agents for good.
        self.demo.db_run("UPDATE agents SET status = 'stopped' WHERE project = ?", ["demo"])
        self.demo.set_status("stopped")
        finished = self.activation("worker")
        coordination.complete_activation(self.side, config_of(self.side), finished, "worker", "done")
        self.side_finished = finished

    def request(self, method, target, body=None, headers=None, host=None, listener=None, auth=True):
        """A raw request as its caller sends it: a runner path to the runner socket, anything else to
        the user port with the API token (unless `auth` is False or `headers` names an
        Authorization); `listener` ("user" or "runner") overrides the choice."""
        listener = listener or ("runner" if target.startswith(RUNNER_PREFIXES) else "user")
        if listener == "runner":
            return raw_request(self.service.runner_socket, method, target, body, headers, host)
        sent = {**(self.service.auth_headers if auth else {}), **(headers or {})}
        return raw_request(self.port, method, target, body, sent, host)

    def activation(self, agent_id):
        """A running activation of `side`'s agent, created when the last one ended."""
        agent = self.side.agent(agent_id)
        active = agent.get("activeActivationId")
        if active and self.side.activation(active)["status"] == "running":
            return active
        # `side` runs only while the activation is created, so no request's tick can start a runner.
        self.side.start()
        try:
            return running_activation(self.side, agent_id)["id"]
        finally:
            self.side.set_status("stopped")

    def identity(self, agent_id="worker"):
        return {"project": "side", "agentId": agent_id, "activationId": self.activation(agent_id),
                "token": self.tokens[("side", agent_id)]}

    def snapshot(self):
        return ({name: table_counts(self.service.store(name)) for name in ("demo", "side")},
                files_under(self.root_path), sorted(os.listdir(self.root_path.parent)))

    def integrity(self):
        return {name: self.service.store(name).db_get("PRAGMA integrity_check")["integrity_check"]
                for name in ("demo", "side")}

    def leaked_token(self, text):
        return any(token in text for token in self.tokens.values())


@contextlib.contextmanager
def world(tmp_path, **app_options):
    """A World on a fresh root under tmp_path, served by the real app on Waitress at port 0."""
    options = {"webui_dir": tmp_path / "no-build", "poll_seconds": 0.05, **app_options}
    with serving(tmp_path / "root", **options) as service:
        init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        init_project(service.root, tmp_path / "side", project_yaml("side", service.base_url))
        yield World(service, tmp_path)
