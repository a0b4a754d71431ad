"""Suzumio as an MCP server: tools to list projects, read status, agents, messages and the report, send a
message, start, stop, approve and request changes, list and decide approval requests, and resources for
reports and artifacts. One JSON-RPC dispatcher serves `POST /mcp` on `serve` (streamable HTTP, JSON
responses, behind the user API token) and `suzumio mcp` over stdio, without the MCP SDK."""
import base64
import json
import logging
import mimetypes
import os
from pathlib import Path
from urllib.parse import quote, unquote

import suzumio_approvals
import suzumio_coordination as coordination
import suzumio_diff
import suzumio_guards
import suzumio_replay
import suzumio_repository
import suzumio_scheduler
from suzumio_errors import BadRequest, SuzumioError
from suzumio_http import optional_string
from suzumio_records import PRIORITIES, format_ts, utc_now

log = logging.getLogger(__name__)

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
DEFAULT_PROTOCOL_VERSION = "2025-06-18"
SERVER_INFO = {"name": "suzumio", "version": "0.1.0"}
RESOURCE_PREFIX = "suzumio://projects/"
MAX_RESOURCE_BYTES = 4 * 1024 * 1024

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603


def _object(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_PROJECT = {"project": {"type": "string", "description": "Project name (see list_projects)"}}
_LIMIT = {"limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many, newest first"}}

TOOLS = (
    ("list_projects", "List every Suzumio project with its status.", _object({})),
    ("project_status", "A project's status, task, agents and counts.", _object(_PROJECT, ["project"])),
    ("list_agents", "A project's agents with their status and current activation.", _object(_PROJECT, ["project"])),
    ("list_messages", "A project's messages, newest first.", _object({**_PROJECT, **_LIMIT}, ["project"])),
    ("read_report", "The final report a project's coordinator submitted (completion.submit).",
     _object(_PROJECT, ["project"])),
    ("send_message", "Send a message as the user to an agent (or a channel); it wakes the recipient.",
     _object({**_PROJECT, "recipient": {"type": "string", "description": "Agent id"},
              "channel": {"type": "string", "description": "Channel, e.g. #project (instead of recipient)"},
              "body": {"type": "string"},
              "priority": {"type": "string", "enum": list(PRIORITIES), "description": "P0 interrupts; default P2"}},
             ["project", "body"])),
    ("start_project", "Start (or resume) a project.", _object(_PROJECT, ["project"])),
    ("stop_project", "Stop a project; running activations are cancelled.", _object(_PROJECT, ["project"])),
    ("approve_project", "Approve a project's submitted report: the project completes.", _object(_PROJECT, ["project"])),
    ("request_changes", "Reject the submitted report with feedback; the coordinator (or recipient) is woken.",
     _object({**_PROJECT, "body": {"type": "string"}, "recipient": {"type": "string"}}, ["project", "body"])),
    # Approval gates
    ("list_approvals", "A project's approval requests: tool calls waiting for a person (pending first), then "
     "decided ones.",
     _object({**_PROJECT, "status": {"type": "string", "enum": list(suzumio_approvals.APPROVAL_STATUSES)}},
             ["project"])),
    ("decide_approval", "Allow (optionally with an edited input), deny (with a note the agent reads), "
     "allow-always, or respond (nothing runs; the agent reads your output as the call's result) one pending "
     "tool call.",
     _object({**_PROJECT, "approvalId": {"type": "string"},
              "decision": {"type": "string", "enum": list(suzumio_approvals.DECISIONS)},
              "note": {"type": "string", "description": "Why; the agent's model reads it when denied"},
              "input": {"type": "object", "description": "With allow: run the tool with this input instead "
                        "(checked against the tool's input schema)"},
              "output": {"type": "string", "description": "With respond: the call's result the agent reads"}},
             ["project", "approvalId", "decision"])),
    ("resume_agent", "Resume an agent a loop guard paused (it works again; its guards count afresh).",
     _object({**_PROJECT, "agent": {"type": "string", "description": "Agent id"}}, ["project", "agent"])),
    # the flight recorder (docs/replay.md)
    ("replay_project", "Replay an ended project's recorded run as a new project, started at once: model answers "
     "come from the recording while the requests match.",
     _object({**_PROJECT, "as": {"type": "string", "description": "The new project's name"},
              "tools": {"type": "string", "enum": ["live", "recorded"], "description": "default live"},
              "onDiverge": {"type": "string", "enum": ["stop", "live"], "description": "default stop"},
              "config": {"type": "string", "description": "A project file (YAML) with the same agents"}},
             ["project", "as"])),
    ("fork_project", "Fork a project as it was when one activation ended into a new project that runs live.",
     _object({**_PROJECT, "as": {"type": "string", "description": "The new project's name"},
              "at": {"type": "string", "description": "An ended activation's id"},
              "config": {"type": "string", "description": "A project file (YAML) with the same agents"}},
             ["project", "as", "at"])),
    ("diff_projects", "Compare two runs: messages, tool calls, activations, artifacts, report, tokens and cost.",
     _object({**_PROJECT, "other": {"type": "string", "description": "The project to compare with"}},
             ["project", "other"])),
    # Evals (docs/evals.md)
    ("start_eval", "Start an eval: run a suite's tasks × variants × N as projects on serve, grade each run. "
     "The suite's team is an absolute path or the project file inline.",
     _object({"suite": {"type": "object", "description": "The suite (name, team, runs, variants, tasks)"},
              "runs": {"type": "integer", "minimum": 1},
              "variants": {"type": "array", "items": {"type": "string"}, "description": "Run only these variants"},
              "mode": {"type": "string", "enum": ["live", "replay", "fork"]}, "from": {"type": "string"},
              "at": {"type": "string"}, "baseline": {"type": "string", "description": "An eval id to compare with"},
              "failUnder": {"type": "number"}}, ["suite"])),
    ("get_eval", "An eval's results: pass rates, pass@k, pass^k, intervals, cost, flaky tasks, regressions.",
     _object({"id": {"type": "string", "description": "Eval id"}}, ["id"])),
    ("list_evals", "Every eval kept under the root.", _object({})),
    ("repository", "A project's repository (docs/teams-that-write-code.md): the integration branch's log, each "
     "agent branch ahead/behind, the merge queue and claims.", _object(_PROJECT, ["project"])),
    ("repository_diff", "git diff between two revisions of a project's repository (branch names such as main or "
     "agents/w1, commit ids); defaults: the integration tip's parent and the tip.",
     _object({**_PROJECT, "from": {"type": "string"}, "to": {"type": "string"}}, ["project"])),
)


class McpRequestError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _text(value):
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


class SuzumioMcp:
    """The tools and resources over a store root. `tick(project)` runs a scheduler pass after changes
    (the route's scheduler on `serve`, an in-process one for `suzumio mcp`); `backends` stops runners."""

    def __init__(self, root, tick, backends, configs, evals=None):
        self.root = root
        self.evals = evals  # the root's suzumio_store_evals.EvalStore, or None
        self.tick = tick
        self.backends = backends
        self.configs = configs  # the runtime's ConfigCache

    # -- tools

    def _store(self, args):
        project = args.get("project")
        if not isinstance(project, str) or not project:
            raise BadRequest("project is required")
        return self.root.open_project(project)

    def call_tool(self, name, args):
        if not isinstance(name, str) or name not in {tool[0] for tool in TOOLS}:
            raise McpRequestError(INVALID_PARAMS, f"Unknown tool: {name}")
        try:
            value = getattr(self, "tool_" + name)(args)
        except SuzumioError as exc:
            return {"content": [{"type": "text", "text": exc.message}], "isError": True}
        result = {"content": [{"type": "text", "text": _text(value)}]}
        if isinstance(value, dict):
            result["structuredContent"] = value
        return result

    def tool_list_projects(self, args):
        return {"projects": self.root.project_summaries()}

    def tool_project_status(self, args):
        return self._store(args).project_summary(full=True)

    def tool_list_agents(self, args):
        return {"agents": self._store(args).public_agents()}

    def tool_list_messages(self, args):
        limit = args.get("limit", 50)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise BadRequest("limit must be an integer from 1 to 1000")
        return {"messages": self._store(args).list_messages(limit)}

    def tool_read_report(self, args):
        path = self._store(args).project()["submitted_report"]
        if not path:
            return "No report submitted."
        return Path(path).read_text(encoding="utf-8")

    def tool_send_message(self, args):
        store = self._store(args)
        priority = args.get("priority")
        message = coordination.send_message(store, self.configs.get(store), sender="user", body=args.get("body"),
                                            recipient=optional_string(args.get("recipient")),
                                            channel=optional_string(args.get("channel")), priority=priority)
        self.tick(store.project_id)
        return message

    def tool_start_project(self, args):
        store = self._store(args)
        store.start()
        self.tick(store.project_id)
        return store.project_summary(full=True)

    def tool_stop_project(self, args):
        store = self._store(args)
        suzumio_scheduler.stop_project(store, self.backends)
        return store.project_summary(full=True)

    def tool_approve_project(self, args):
        store = self._store(args)
        suzumio_scheduler.approve_project(store, self.backends)
        return store.project_summary(full=True)

    def tool_request_changes(self, args):
        store = self._store(args)
        coordination.request_changes(store, self.configs.get(store), args.get("body"),
                                     recipient=optional_string(args.get("recipient")))
        self.tick(store.project_id)
        return store.project_summary(full=True)

    def tool_list_approvals(self, args):
        return {"approvals": suzumio_approvals.list_approvals(self._store(args), status=args.get("status"))}

    def tool_decide_approval(self, args):
        store = self._store(args)
        approval_id = args.get("approvalId")
        if not isinstance(approval_id, str) or not approval_id:
            raise BadRequest("approvalId is required")
        decision = suzumio_approvals.check_decision(
            {key: value for key, value in args.items() if key in ("decision", "note", "input", "output")})
        return suzumio_approvals.decide(store, approval_id, **decision, config=self.configs.get(store), via="mcp")

    def tool_resume_agent(self, args):
        store = self._store(args)
        agent = args.get("agent")
        if not isinstance(agent, str) or not agent:
            raise BadRequest("agent is required")
        resumed = suzumio_guards.resume(store, agent, via="mcp")
        self.tick(store.project_id)
        return resumed

    def tool_replay_project(self, args):
        source = self._store(args)
        store = suzumio_replay.create_replay(self.root, source.project_id, args.get("as"),
                                             tools=args.get("tools", "live"), on_diverge=args.get("onDiverge", "stop"),
                                             config_text=args.get("config"))
        self.tick(store.project_id)
        return store.project_summary(full=True)

    def tool_fork_project(self, args):
        source = self._store(args)
        store = suzumio_replay.create_fork(self.root, source.project_id, args.get("as"), args.get("at"),
                                           config_text=args.get("config"))
        self.tick(store.project_id)
        return store.project_summary(full=True)

    def tool_diff_projects(self, args):
        other = args.get("other")
        if not isinstance(other, str) or not other:
            raise BadRequest("other is required")
        return suzumio_diff.diff_projects(self._store(args), self.root.open_project(other))

    def _evals(self):
        if self.evals is None:
            raise BadRequest("Evals run only in `suzumio serve`")
        return self.evals

    def tool_start_eval(self, args):
        import suzumio_api_evals
        return {"id": suzumio_api_evals.submit_body(self._evals(), args)}

    def tool_get_eval(self, args):
        import suzumio_eval_runner
        return suzumio_eval_runner.document(self._evals(), str(args.get("id")))

    def tool_list_evals(self, args):
        import suzumio_eval_runner
        return {"evals": suzumio_eval_runner.listing(self._evals())}

    def tool_repository(self, args):
        store = self._store(args)
        return suzumio_repository.overview(store, self.configs.get(store), format_ts(utc_now()))

    def tool_repository_diff(self, args):
        store = self._store(args)
        return suzumio_repository.diff(store, self.configs.get(store), args.get("from") or None, args.get("to") or None)

    # -- resources: suzumio://projects/<p>/report and suzumio://projects/<p>/artifacts/<agent>/<path>

    def list_resources(self):
        resources = []
        for name in self.root.list_projects():
            store = self.root.open_project(name)
            base = RESOURCE_PREFIX + quote(name, safe="")
            if store.project()["submitted_report"]:
                resources.append({"uri": base + "/report", "name": f"{name} report", "mimeType": "text/markdown"})
            for agent in store.list_agents():
                folder = store.artifacts_dir(agent["id"])
                for relative in _files(folder):
                    uri = f"{base}/artifacts/{quote(agent['id'], safe='')}/{quote(relative)}"
                    resources.append({"uri": uri, "name": f"{name}: {agent['id']}/{relative}",
                                      "mimeType": mimetypes.guess_type(relative)[0] or "application/octet-stream"})
        return {"resources": resources}

    def read_resource(self, uri):
        if not isinstance(uri, str) or not uri.startswith(RESOURCE_PREFIX):
            raise McpRequestError(INVALID_PARAMS, f"Unknown resource: {uri}")
        parts = uri[len(RESOURCE_PREFIX):].split("/")
        store = self.root.open_project(unquote(parts[0]))
        if parts[1:] == ["report"]:
            path = store.project()["submitted_report"]
            if not path:
                raise McpRequestError(INVALID_PARAMS, "No report submitted.")
            return _contents(uri, Path(path), "text/markdown")
        if len(parts) >= 4 and parts[1] == "artifacts":
            folder = Path(os.path.realpath(store.artifacts_dir(unquote(parts[2]))))
            path = Path(os.path.realpath(folder / unquote("/".join(parts[3:]))))
            if folder not in path.parents or not path.is_file():
                raise McpRequestError(INVALID_PARAMS, f"Unknown resource: {uri}")
            return _contents(uri, path, mimetypes.guess_type(path.name)[0])
        raise McpRequestError(INVALID_PARAMS, f"Unknown resource: {uri}")

    # -- JSON-RPC

    def handle(self, message):
        """One JSON-RPC message → its response object, or None for a notification or a response."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(None, INVALID_REQUEST, "Invalid JSON-RPC message")
        if "method" not in message:
            return None  # a response to a request we never send
        request_id = message.get("id")
        is_notification = "id" not in message
        method, params = message["method"], message.get("params")
        if params is None:
            params = {}
        if not isinstance(method, str) or not isinstance(params, dict):
            return None if is_notification else _error(request_id, INVALID_REQUEST, "method must be a string "
                                                       "and params an object")
        try:
            result = self._dispatch(method, params)
        except McpRequestError as exc:
            return None if is_notification else _error(request_id, exc.code, str(exc))
        except SuzumioError as exc:
            return None if is_notification else _error(request_id, INVALID_PARAMS, exc.message)
        except Exception:  # the one boundary of an MCP request: logged, answered -32603
            log.exception("MCP request %s failed", message.get("method"))
            return None if is_notification else _error(request_id, INTERNAL_ERROR, "internal error")
        if is_notification:
            return None
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    def _dispatch(self, method, params):
        if method == "initialize":
            requested = params.get("protocolVersion")
            version = requested if requested in PROTOCOL_VERSIONS else DEFAULT_PROTOCOL_VERSION
            return {"protocolVersion": version, "serverInfo": SERVER_INFO,
                    "capabilities": {"tools": {"listChanged": False}, "resources": {}},
                    "instructions": "Drive Suzumio teams: list projects, read status and reports, send messages."}
        if method == "ping" or method.startswith("notifications/"):
            return {}
        if method == "tools/list":
            return {"tools": [{"name": name, "description": description, "inputSchema": schema}
                              for name, description, schema in TOOLS]}
        if method == "tools/call":
            arguments = params.get("arguments") or {}
            if not isinstance(arguments, dict):
                raise McpRequestError(INVALID_PARAMS, "arguments must be an object")
            return self.call_tool(params.get("name"), arguments)
        if method == "resources/list":
            return self.list_resources()
        if method == "resources/templates/list":
            return {"resourceTemplates": []}
        if method == "resources/read":
            return self.read_resource(params.get("uri"))
        raise McpRequestError(METHOD_NOT_FOUND, f"Method not found: {method}")

    def handle_text(self, text):
        """A JSON text (one message or a batch) → the response text, or None when nothing answers."""
        try:
            value = json.loads(text)
        except ValueError:
            return json.dumps(_error(None, PARSE_ERROR, "Parse error"))
        if isinstance(value, list):
            answers = [answer for answer in (self.handle(item) for item in value) if answer is not None]
            return json.dumps(answers, ensure_ascii=False) if answers else None
        answer = self.handle(value)
        return None if answer is None else json.dumps(answer, ensure_ascii=False)


def _error(request_id, code, message):
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _files(folder):
    if folder.is_symlink() or not folder.is_dir():
        return
    for directory, subdirs, files in os.walk(folder):
        subdirs[:] = sorted(d for d in subdirs if not os.path.islink(os.path.join(directory, d)))
        for name in sorted(files):
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                yield os.path.relpath(path, folder)


def _contents(uri, path, mime):
    data = path.read_bytes()[:MAX_RESOURCE_BYTES]
    try:
        return {"contents": [{"uri": uri, "mimeType": mime or "text/plain", "text": data.decode("utf-8")}]}
    except UnicodeDecodeError:
        return {"contents": [{"uri": uri, "mimeType": mime or "application/octet-stream",
                              "blob": base64.b64encode(data).decode("ascii")}]}


# ---------------------------------------------------------------------------------------------------
# Transports

def mount_mcp(app, server):
    """`/mcp` on the user listener (streamable HTTP without SSE: every POST is answered with JSON)."""
    import bottle

    from suzumio_http import JSON_TYPE, MAX_BODY_BYTES

    @app.post("/mcp")
    def mcp_post():
        raw = bottle.request.body.read(MAX_BODY_BYTES + 1)
        if len(raw) > MAX_BODY_BYTES:
            raise BadRequest(f"Request body too large (limit {MAX_BODY_BYTES} bytes)")
        answer = server.handle_text(raw.decode("utf-8", errors="replace"))
        if answer is None:
            return bottle.HTTPResponse(b"", 202)
        return bottle.HTTPResponse(answer.encode("utf-8"), 200, {"Content-Type": JSON_TYPE})

    @app.get("/mcp")
    def mcp_stream():
        # No server-initiated stream: 405 tells MCP clients so (streamable HTTP). Without a session id
        # clients never send DELETE.
        body = json.dumps({"error": "Method not allowed: POST JSON-RPC messages to /mcp"}).encode("utf-8")
        return bottle.HTTPResponse(body, 405, {"Allow": "POST", "Content-Type": JSON_TYPE})


def serve_stdio(root, runtime, stdin, stdout):
    """`suzumio mcp`: newline-delimited JSON-RPC on stdin/stdout until stdin closes, then the runtime
    (a suzumio_runtime.Runtime) is closed. Changes run a scheduler pass in this process, as `suzumio send`
    does."""
    import suzumio_store_evals

    evals = suzumio_store_evals.EvalStore(root.path)  # evals started here run on the root's serve
    try:
        def tick(project):
            try:
                runtime.scheduler.tick(project)
            except SuzumioError as exc:
                log.warning("tick of %s failed: %s", project, exc.message)

        server = SuzumioMcp(root, tick, runtime.backends, runtime.configs, evals=evals)
        for line in stdin:
            if not line.strip():
                continue
            answer = server.handle_text(line)
            if answer is not None:
                stdout.write(answer + "\n")
                stdout.flush()
    finally:
        evals.close()
        runtime.close()
    return 0

