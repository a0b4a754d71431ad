"""Sandbox-side MCP servers (`mcp: {where: runner, command: [...]}`): a minimal stdio JSON-RPC client that
the runner uses to start a server next to the agent's files, list its tools and call them. Standard
library only (CPython >= 3.9), like every runner file."""
import base64
import binascii
import json
import signal
import subprocess
import threading

PROTOCOL_VERSION = "2025-06-18"
START_TIMEOUT_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 300.0
CLIENT_INFO = {"name": "suzumio-runner", "version": "0.1.0"}


class McpServerError(Exception):
    """The server could not be started, listed or called; the message is one line."""


def one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def content_text(block):
    """The text a model sees for one content block (as the controller's suzumio_mcp.content_text)."""
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    if kind in ("image", "audio"):
        data = block.get("data") or ""
        try:
            size = len(base64.b64decode(data))
        except (binascii.Error, ValueError):
            size = len(data)
        return "[{} {}, {} bytes]".format(kind, block.get("mimeType", "application/octet-stream"), size)
    if kind == "resource_link":
        return "[resource {}: {}]".format(block.get("name") or block.get("uri"), block.get("uri"))
    if kind == "resource":
        resource = block.get("resource") or {}
        if isinstance(resource.get("text"), str):
            return "[resource {}]\n{}".format(resource.get("uri"), resource["text"])
        return "[resource {} {}]".format(resource.get("uri"), resource.get("mimeType", "application/octet-stream"))
    return f"[{kind} content]"


def tool_result(result):
    """A CallToolResult → {output, isError?, structuredContent?} (as the controller's suzumio_mcp.tool_result)."""
    texts = [content_text(block) for block in result.get("content") or [] if isinstance(block, dict)]
    structured = result.get("structuredContent")
    output = "\n".join(texts)
    if not output and structured is not None:
        output = json.dumps(structured, ensure_ascii=False)
    out = {"output": output}
    if structured is not None:
        out["structuredContent"] = structured
    if result.get("isError"):
        out["isError"] = True
    return out


def tool_definition(tool):
    """A listed tool → {name, description, inputSchema} (as the controller's suzumio_mcp.tool_definition)."""
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict):
        schema = {"type": "object", "properties": {}}
    return {"name": tool["name"], "description": tool.get("description") or tool.get("title") or tool["name"],
            "inputSchema": schema}


class StdioMcpClient:
    """One server process speaking newline-delimited JSON-RPC; a reader thread matches answers to ids."""

    def __init__(self, toolpack_id, command, env, cwd, groups, workspace):
        self.toolpack_id = toolpack_id
        self.command = command
        self.env = env
        self.cwd = cwd
        self.groups = groups
        self.workspace = workspace
        self.process = None
        self.last_id = 0
        self.replies = {}
        self.closed = False
        self.stderr_tail = []
        self.condition = threading.Condition()
        self.write_lock = threading.Lock()

    def label(self):
        return " ".join(self.command)

    def start(self):
        """Start, initialize and list the tools; returns [{name, description, inputSchema}]."""
        try:
            self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, env=self.env, cwd=self.cwd,
                                            start_new_session=True)
        except OSError as error:
            raise McpServerError(self._failure(error.strerror or str(error))) from None
        self.groups.add(self.process.pid)
        threading.Thread(target=self._read, name="mcp-" + self.toolpack_id, daemon=True).start()
        threading.Thread(target=self._read_stderr, name="mcp-err-" + self.toolpack_id, daemon=True).start()
        self.request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {"roots": {}},
                                    "clientInfo": CLIENT_INFO}, START_TIMEOUT_SECONDS)
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools, cursor = [], None
        while True:
            page = self.request("tools/list", {"cursor": cursor} if cursor else {}, START_TIMEOUT_SECONDS)
            tools.extend(tool_definition(tool) for tool in page.get("tools") or []
                         if isinstance(tool, dict) and isinstance(tool.get("name"), str))
            cursor = page.get("nextCursor")
            if not cursor:
                return tools

    def call(self, tool, args):
        """tools/call → {output, isError?, structuredContent?}; raises McpServerError."""
        return tool_result(self.request("tools/call", {"name": tool, "arguments": args}, CALL_TIMEOUT_SECONDS))

    def request(self, method, params, timeout):
        with self.condition:
            self.last_id += 1
            request_id = self.last_id
        self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        with self.condition:
            answered = self.condition.wait_for(lambda: request_id in self.replies or self.closed, timeout)
            reply = self.replies.pop(request_id, None)
        if reply is None:
            if not answered:
                raise McpServerError(self._failure(f"no answer to {method} within {timeout:g} s"))
            raise McpServerError(self._failure(f"exited during {method} (status {self.process.poll()})"))
        if "error" in reply:
            error = reply["error"] if isinstance(reply["error"], dict) else {}
            raise McpServerError(self._failure(f"{method}: {error.get('message') or 'error'}"))
        result = reply.get("result")
        return result if isinstance(result, dict) else {}

    def _failure(self, reason):
        tail = f" (stderr: {one_line(self.stderr_tail[-1], 200)})" if self.stderr_tail else ""
        return one_line(f"MCP server {self.toolpack_id} ({self.label()}) failed: {reason}{tail}")

    def _send(self, message):
        data = (json.dumps(message) + "\n").encode("utf-8")
        with self.write_lock:
            try:
                self.process.stdin.write(data)
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                with self.condition:
                    self.closed = True
                    self.condition.notify_all()

    def _read(self):
        for line in self.process.stdout:
            try:
                message = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "method" in message and "id" in message:
                self._answer(message)
            elif "id" in message:
                with self.condition:
                    self.replies[message["id"]] = message
                    self.condition.notify_all()
        with self.condition:
            self.closed = True
            self.condition.notify_all()

    def _read_stderr(self):
        for line in self.process.stderr:
            text = line.decode("utf-8", "replace").strip()
            if text:
                self.stderr_tail = (self.stderr_tail + [text])[-5:]

    def _answer(self, request):
        """Requests from the server: ping, and roots/list (the workspace); anything else is refused."""
        method = request.get("method")
        if method == "ping":
            self._send({"jsonrpc": "2.0", "id": request["id"], "result": {}})
        elif method == "roots/list":
            roots = [{"uri": "file://" + self.workspace, "name": "workspace"}] if self.workspace else []
            self._send({"jsonrpc": "2.0", "id": request["id"], "result": {"roots": roots}})
        else:
            self._send({"jsonrpc": "2.0", "id": request["id"],
                        "error": {"code": -32601, "message": f"Method not supported: {method}"}})

    def close(self):
        if self.process is None:
            return
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            try:
                import os

                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
        self.groups.discard(self.process.pid)


def is_allowed(tool_name, patterns):
    """Allowlist match as the controller's suzumio_registry.is_allowed: exact name, `*`, or an `x.*` prefix."""
    for pattern in patterns:
        if pattern == tool_name or pattern == "*":
            return True
        if pattern.endswith(".*") and tool_name.startswith(pattern[:-1]):
            return True
    return False


def server_environment(base, extra):
    env = dict(base)
    env.update(extra or {})
    return env
