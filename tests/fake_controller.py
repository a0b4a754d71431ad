"""Test stand-in for the controller's runner routes (docs/design/runner.md, docs/http-api.md): a real HTTP
server for one project/agent/activation that records every call and answers with the documented shapes,
including P1 `signalText` on tool-call finish and `{"error": ...}` failures. `/runner/model` is forwarded
by the real suzumio_model_proxy with the controller-side models config and environment the test gives
(`use_runner`). Imported by tests only."""

import json
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler

from http_fixtures import LocalHTTPServer

import suzumio_backend
import suzumio_config
from suzumio_errors import SuzumioError
from suzumio_model_proxy import ModelProxy

IDENTITY = ("project", "agentId", "activationId", "token")
ROLES = ("user", "assistant", "tool_call", "tool_result", "compaction")
ENDING_TOOLS = ("coordination.wait_for_signal", "completion.submit")
TOOL_ROUTES = ("/runner/tool-calls/start", "/runner/tool-calls/refused", "/runner/signals")
HISTORY_ROUTES = ("/runner/history/messages", "/runner/history/compact")
SIGNAL_HEADING = "# New P1 Signals Delivered At Tool Boundary"

Call = namedtuple("Call", "path body")


class RouteError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def blank(value):
    return not isinstance(value, str) or not value.strip()


def p1_signal_text(body):
    """A tool-boundary delivery text shaped like the controller's (docs/design/runner.md)."""
    note = (
        "These signals arrived while this activation was running; they are new instructions that follow "
        "the tool result."
    )
    return "\n\n".join([SIGNAL_HEADING, note, "## Signal 1 (P1)\n\n" + body])


class FakeController:
    """Runner routes for agent `agent_id`; `history` is the agent's active history for compaction."""

    def __init__(
        self, project="demo", agent_id="worker", activation_id="act_1", token="tok-secret-4242", history=None
    ):
        self.project, self.agent_id, self.activation_id, self.token = project, agent_id, activation_id, token
        self.history = list(history or [])
        self.calls = []
        self.status = "running"
        self.pending_p1 = []
        self.fail = {}
        self.support = {}
        self.tool_calls = {}
        self.output = None
        self.context = None
        self.config = None
        self.environ = {}
        self.model_calls = []
        self._lock = threading.Lock()
        self._http = LocalHTTPServer(_Handler, "fake-controller", controller=self)

    @property
    def url(self):
        return self._http.url

    def paths(self):
        return [call.path for call in self.calls]

    def bodies(self, path):
        return [call.body for call in self.calls if call.path == path]

    def queue_p1(self, body):
        """A pending P1 signal, delivered with the next completed non-ending tool call."""
        self.pending_p1.append(body)

    def use_runner(self, runner, environ=None):
        """Hold `runner` (backend.runner, with keys and URLs) on the controller side, with `environ` as
        the controller's environment; returns the section input.json carries (keys stripped)."""
        self.config = suzumio_config.ProjectConfig.from_data(
            {"name": self.project, "task": "Runner test.", "agents": {self.agent_id: {}}, "backend": {"runner": runner}}
        )
        if environ is not None:
            self.environ = environ
        return suzumio_backend.runner_section(self.config)

    def fail_route(self, path, status, message, times=None):
        """Answer `path` with `status` and `{"error": message}` from now on, or only the next `times`
        requests (then the route answers as usual again)."""
        self.fail[path] = (status, message, times)

    def close(self):
        self._http.close()

    def handle(self, path, body):
        with self._lock:
            self.calls.append(Call(path, body))
            if path in self.fail:
                status, message, times = self.fail[path]
                if times is not None and times <= 1:
                    del self.fail[path]
                elif times is not None:
                    self.fail[path] = (status, message, times - 1)
                raise RouteError(status, message)
            if not isinstance(body, dict):
                raise RouteError(400, "Invalid JSON body: expected an object")
            for field in IDENTITY:
                if blank(body.get(field)):
                    raise RouteError(400, f"{field} is required")
            if path == "/activation-context":
                return self._context(body)
            if path == "/activation-output":
                return self._output(body)
            self._authorize(body)
            if path in TOOL_ROUTES or path.startswith("/toolpacks/"):
                self._require_running("no more tool calls are accepted")
            if path in HISTORY_ROUTES:
                self._require_running("history updates are not accepted")
            if path == "/runner/model":
                self._require_running("no more model calls are accepted")
        if path == "/runner/model":
            # forwarded outside the lock: a slow provider must not hold up the runner's other calls
            return self._model(body)
        with self._lock:
            if path == "/runner/tool-calls/start":
                if blank(body.get("tool")):
                    raise RouteError(400, "tool is required")
                tool_call_id = "tool_%s" % (len(self.tool_calls) + 1)
                self.tool_calls[tool_call_id] = body["tool"]
                return {"toolCallId": tool_call_id}
            if path == "/runner/tool-calls/finish":
                return self._finish(body)
            if path == "/runner/tool-calls/refused":
                if blank(body.get("tool")) or blank(body.get("error")):
                    raise RouteError(400, "tool and error are required")
                tool_call_id = "tool_%s" % (len(self.tool_calls) + 1)
                self.tool_calls[tool_call_id] = body["tool"]
                return {"toolCallId": tool_call_id, "status": "failed"}
            if path == "/runner/signals":
                return {"status": "recorded"}
            if path == "/runner/history/messages":
                if body.get("role") not in ROLES:
                    raise RouteError(400, "Invalid history role: {}".format(body.get("role")))
                row = {
                    "id": "hist_%s" % (len(self.history) + 1),
                    "role": body["role"],
                    "kind": body.get("kind"),
                    "content": body.get("content"),
                    "metadata": body.get("metadata") or {},
                    "sequence": len(self.history) + 1,
                }
                self.history.append(row)
                return {"status": "recorded", "message": row}
            if path == "/runner/history/compact":
                return self._compact(body)
            if path.startswith("/toolpacks/") and path.endswith("/support"):
                handler = self.support.get(body.get("tool"))
                if callable(handler):
                    return handler(body)
                if handler is not None:
                    return handler
                return {
                    "title": "toolpack support",
                    "output": "Controller handled {}.".format(body.get("tool")),
                }
            raise RouteError(404, "not found")

    def _model(self, body):
        for field in ("providerId", "presetId"):
            if blank(body.get(field)):
                raise RouteError(400, f"{field} is required")
        if not isinstance(body.get("body"), dict):
            raise RouteError(400, "body is required")
        if isinstance(body.get("scripted"), dict):  # a scripted provider's turn is its own answer
            with self._lock:
                self.model_calls.append(body["scripted"])
            return {"status": 200, "headers": {}, "body": json.dumps(body["scripted"])}
        if self.config is None:
            raise RouteError(500, "FakeController.use_runner was not called")
        try:
            answer = ModelProxy(self.environ).forward(
                self.config, self.agent_id, body["providerId"], body["presetId"], body["body"]
            )
        except SuzumioError as error:
            raise RouteError(error.status, error.message) from None
        with self._lock:
            self.model_calls.append(answer)
        return {"status": answer.status, "headers": answer.headers, "body": answer.body}

    def _authorize(self, body):
        if body["project"] != self.project:
            raise RouteError(404, "Unknown project: {}".format(body["project"]))
        if body["agentId"] != self.agent_id:
            raise RouteError(404, "Unknown agent: {}".format(body["agentId"]))
        if body["token"] != self.token:
            raise RouteError(403, "Invalid agent token")
        if body["activationId"] != self.activation_id:
            raise RouteError(404, "Unknown activation: {}".format(body["activationId"]))

    def _require_running(self, what):
        if self.status != "running":
            raise RouteError(409, f"Activation {self.activation_id} is {self.status}; {what}")

    def _finish(self, body):
        for field in ("toolCallId", "status"):
            if blank(body.get(field)):
                raise RouteError(400, f"{field} is required")
        if body["status"] not in ("completed", "failed"):
            raise RouteError(400, "Invalid tool call status: {}".format(body["status"]))
        tool = self.tool_calls.get(body["toolCallId"])
        if tool is None:
            raise RouteError(404, "Unknown tool call for activation: {}".format(body["toolCallId"]))
        answer = {"status": body["status"]}
        if (
            body["status"] == "completed"
            and self.status == "running"
            and tool not in ENDING_TOOLS
            and self.pending_p1
        ):
            answer["deliveredSignals"] = 1
            answer["signalText"] = p1_signal_text(self.pending_p1.pop(0))
        return answer

    def _compact(self, body):
        if blank(body.get("summary")):
            raise RouteError(400, "summary is required")
        try:
            keep = int(float(body.get("keepTail")))
        except (TypeError, ValueError):
            keep = 12
        keep = max(1, min(keep, 100))
        head, tail = self.history[: max(0, len(self.history) - keep)], self.history[-keep:]
        if not head:
            return {"status": "unchanged", "history": self.history}
        compaction = {"id": "cmp_1", "archivedMessageCount": len(head)}
        marker = {
            "id": "hist_cmp",
            "role": "compaction",
            "kind": "history_compaction",
            "content": body["summary"].strip(),
            "metadata": {"compactionId": "cmp_1"},
            "sequence": 0,
        }
        self.history = [marker] + tail
        return {"status": "compacted", "compaction": compaction, "history": self.history}

    def _context(self, body):
        context = body.get("context")
        if not isinstance(context, dict):
            raise RouteError(400, "context is required")
        if (
            context.get("version") != 1
            or context.get("kind") != "model-context"
            or not isinstance(context.get("messages"), list)
        ):
            raise RouteError(400, "Invalid activation context")
        self._authorize(body)
        self.context = context
        return {"status": "recorded", "activationId": self.activation_id}

    def _output(self, body):
        output = body.get("output")
        if not isinstance(output, dict):
            raise RouteError(400, "output is required")
        if blank(output.get("text")):
            raise RouteError(400, "output.text is required")
        self._authorize(body)
        if self.status != "running":
            return {"status": self.status, "activationId": self.activation_id}
        self.status = "completed"
        self.output = output
        return {"status": "completed", "activationId": self.activation_id}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
        try:
            status, answer = 200, self.server.controller.handle(self.path, body)
        except RouteError as error:
            status, answer = error.status, {"error": str(error)}
        payload = (json.dumps(answer) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
