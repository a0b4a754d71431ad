"""Controller-side MCP client sessions: the only module that imports the `mcp` SDK. One asyncio event-loop
thread owns every session; the synchronous rest of Suzumio calls `McpHub.tools`, `call`, `check` and
`close`, which wait on that loop with a timeout and never hang."""
import asyncio
import base64
import binascii
import json
import logging
import os
import shutil
import tempfile
import threading
import time

log = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 30.0
CALL_TIMEOUT_SECONDS = 300.0
CLOSE_TIMEOUT_SECONDS = 10.0
RETRY_SECONDS = 10.0  # a server that failed to start is not started again by resolution before this
MAX_RETRY_SECONDS = 300.0
STATE_UP = "up"
STATE_NOT_STARTED = "not started"


# The pex leaves out cryptography (~4.5 MB per platform; scripts/build-pex). `import mcp` imports the SDK's
# server package, whose request-state encryption imports four cryptography names at import time; Suzumio
# only uses the client transports, which never touch them. When cryptography is absent those names are
# stand-ins that refuse to be used, so the import succeeds and nothing can silently run without it.
_CRYPTOGRAPHY_NAMES = {
    "cryptography.exceptions": ("InvalidTag",),
    "cryptography.hazmat.primitives.ciphers.aead": ("AESGCM",),
    "cryptography.hazmat.primitives.hashes": ("SHA256",),
    "cryptography.hazmat.primitives.kdf.hkdf": ("HKDF",),
}


class _NotBundled(Exception):
    """A cryptography name used where the pex does not bundle cryptography."""

    def __init__(self, *args, **kwargs):
        super().__init__("cryptography is not bundled with this Suzumio (MCP server-side request state)")


def _standin_cryptography():
    """Register stand-ins for the names above when cryptography is not installed (the pex); else nothing."""
    import sys
    import types

    try:
        import cryptography  # noqa: F401 - only whether it is there
        return
    except ImportError:
        pass
    for module_name, names in _CRYPTOGRAPHY_NAMES.items():
        parts = module_name.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name not in sys.modules:
                module = types.ModuleType(name, "stand-in: cryptography is not bundled (suzumio_mcp)")
                module.__path__ = []
                sys.modules[name] = module
                if depth > 1:
                    setattr(sys.modules[".".join(parts[: depth - 1])], parts[depth - 1], module)
        for attribute in names:
            setattr(sys.modules[module_name], attribute, type(attribute, (_NotBundled,), {}))


def _import_sdk():
    """Import the SDK (once per process; the first import costs about a second)."""
    _standin_cryptography()
    import mcp.client.session

    return mcp


class McpError(Exception):
    """An MCP server could not be started, listed or called; the message is one line."""


def one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_failure(error):
    """One line for an exception raised by the SDK or a transport (exception groups unwrapped)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error) or type(error).__name__
    return one_line(text)


def server_label(mcp):
    """How a server is named in messages: its command line or its URL."""
    if mcp.get("url"):
        return mcp["url"]
    return " ".join(mcp.get("command") or [])


def session_key(toolpack_id, mcp):
    """Sessions are shared by toolpacks with the same id and the same `mcp` block (across projects)."""
    return toolpack_id + "\0" + json.dumps(mcp, sort_keys=True)


# ---------------------------------------------------------------------------------------------------
# Results: MCP CallToolResult → Suzumio tool result {output, isError?, structuredContent?}

def content_text(block):
    """The text a model sees for one content block: text as is, binary content as a reference."""
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    if kind in ("image", "audio"):
        data = block.get("data") or ""
        try:
            size = len(base64.b64decode(data, validate=False))
        except (binascii.Error, ValueError):
            size = len(data)
        return f"[{kind} {block.get('mimeType', 'application/octet-stream')}, {size} bytes]"
    if kind == "resource_link":
        name = block.get("name") or block.get("uri")
        return f"[resource {name}: {block.get('uri')}]"
    if kind == "resource":
        resource = block.get("resource") or {}
        if isinstance(resource.get("text"), str):
            return f"[resource {resource.get('uri')}]\n{resource['text']}"
        return f"[resource {resource.get('uri')} {resource.get('mimeType', 'application/octet-stream')}]"
    return f"[{kind} content]"


def tool_result(result):
    """A CallToolResult in wire spelling → the support result of docs/design/tools.md (`output` is a string)."""
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
    """A listed MCP tool in wire spelling → {name, description, inputSchema} (names without the prefix)."""
    description = tool.get("description") or tool.get("title") or tool["name"]
    schema = tool.get("inputSchema")
    if not isinstance(schema, dict):
        schema = {"type": "object", "properties": {}}
    definition = {"name": tool["name"], "description": description, "inputSchema": schema}
    # The server's hints say what a call may do outside (suzumio_effects): read-only, or safe to repeat.
    hints = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else {}
    if hints.get("readOnlyHint") is True:
        definition["effect"] = "none"
    elif hints.get("idempotentHint") is True:
        definition["effect"] = "idempotent"
    return definition


# ---------------------------------------------------------------------------------------------------
# One session

class _Session:
    """One connected server. Its whole life runs in one task (anyio scopes must exit where they entered)."""

    def __init__(self, toolpack_id, mcp, environ):
        self.toolpack_id = toolpack_id
        self.mcp = mcp
        self.environ = environ
        self.session = None
        self.tools = None
        self.error = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.task = None

    @property
    def alive(self):
        return self.task is not None and not self.task.done() and self.session is not None

    def _stdio_parameters(self):
        _import_sdk()
        from mcp.client.stdio import StdioServerParameters, get_default_environment

        command = list(self.mcp["command"])
        env = get_default_environment()
        env.update(self.mcp.get("env") or {})
        for name, variable in (self.mcp.get("envFrom") or {}).items():
            value = self.environ.get(variable)
            if value is None:
                raise McpError(f"environment variable {variable} is not set (envFrom.{name})")
            env[name] = value
        executable = shutil.which(command[0], path=env.get("PATH")) or command[0]
        return StdioServerParameters(command=executable, args=command[1:], env=env, cwd=self.mcp.get("cwd"))

    def _headers(self):
        headers = dict(self.mcp.get("headers") or {})
        for name, variable in (self.mcp.get("headersEnv") or {}).items():
            value = self.environ.get(variable)
            if value is None:
                raise McpError(f"environment variable {variable} is not set (headersEnv.{name})")
            headers[name] = value
        return headers

    async def run(self):
        # The server's stderr goes to a scratch file, so a failure can quote its last line.
        with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errlog:
            try:
                await self._serve(errlog)
            except (Exception, asyncio.CancelledError) as error:  # noqa: BLE001 - any transport failure ends the session
                if not isinstance(error, asyncio.CancelledError):
                    self.error = self._failure_line(error, errlog)
                    log.info("MCP toolpack %s: %s", self.toolpack_id, self.error)
            finally:
                self.session = None
                self.ready.set()

    async def _serve(self, errlog):
        _import_sdk()
        from mcp.client.session import ClientSession

        async with self._transport(errlog) as streams, ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            listed, cursor = [], None
            while True:
                page = await self._list_page(session, cursor)
                listed.extend(tool_definition(tool.model_dump(by_alias=True, exclude_none=True)) for tool in page.tools)
                cursor = getattr(page, "next_cursor", None) or getattr(page, "nextCursor", None)
                if not cursor:
                    break
            self.tools, self.session = listed, session
            self.ready.set()
            await self.stop.wait()

    @staticmethod
    async def _list_page(session, cursor):
        if cursor is None:
            return await session.list_tools()
        import mcp.types

        return await session.list_tools(params=mcp.types.PaginatedRequestParams(cursor=cursor))

    def _transport(self, errlog):
        if self.mcp.get("url"):
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            return _http_transport(streamable_http_client, create_mcp_http_client(headers=self._headers()),
                                   self.mcp["url"])
        from mcp.client.stdio import stdio_client

        return stdio_client(self._stdio_parameters(), errlog=errlog)

    def _failure_line(self, error, errlog):
        reason = describe_failure(error)
        try:
            errlog.seek(0)
            lines = [line.strip() for line in errlog.read().splitlines() if line.strip()]
        except (OSError, ValueError):
            lines = []
        if lines:
            reason = f"{reason} (stderr: {one_line(lines[-1], 200)})"
        return one_line(f"MCP server {self.toolpack_id} ({server_label(self.mcp)}) failed: {reason}")


class _http_transport:
    """The streamable-HTTP client with its httpx client closed after it (async context manager)."""

    def __init__(self, factory, client, url):
        self.factory, self.client, self.url = factory, client, url
        self.inner = None

    async def __aenter__(self):
        await self.client.__aenter__()
        self.inner = self.factory(self.url, http_client=self.client)
        return await self.inner.__aenter__()

    async def __aexit__(self, *exc):
        try:
            return await self.inner.__aexit__(*exc)
        finally:
            await self.client.__aexit__(None, None, None)


# ---------------------------------------------------------------------------------------------------
# The hub

class McpHub:
    """Every MCP session of one controller process, on one event-loop thread started on first use.
    A dead session (crash, closed connection) is started again by the next `tools` or `call`."""

    def __init__(self, environ=None, start_timeout=START_TIMEOUT_SECONDS, call_timeout=CALL_TIMEOUT_SECONDS,
                 retry_seconds=RETRY_SECONDS):
        self.environ = dict(os.environ if environ is None else environ)
        self.retry_seconds = retry_seconds
        self.start_timeout = start_timeout
        self.call_timeout = call_timeout
        self._sessions = {}  # session_key → _Session; touched only on the loop thread
        self._loop = None
        self._thread = None
        self._lock = threading.Lock()
        self._closed = False
        self._generations = {}  # session_key → count of successful starts (ConfigCache stamps)
        # session_key → (monotonic time, error line, failures in a row) of the last failed start
        self._failures = {}
        self.listing = _Listing(self)

    def _run(self, coroutine, timeout):
        with self._lock:
            if self._closed:
                coroutine.close()
                raise McpError("the controller is shutting down")
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="suzumio-mcp", daemon=True)
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise McpError(f"no answer within {timeout:g} s") from None

    async def _ensure(self, toolpack_id, mcp):
        key = session_key(toolpack_id, mcp)
        current = self._sessions.get(key)
        if current is not None and (current.alive or not current.ready.is_set()):
            await current.ready.wait()
            if current.alive:
                return current
        if current is not None and current.task is not None and not current.task.done():
            current.stop.set()
        fresh = _Session(toolpack_id, mcp, self.environ)
        self._sessions[key] = fresh
        fresh.task = asyncio.ensure_future(fresh.run())
        try:
            await asyncio.wait_for(fresh.ready.wait(), self.start_timeout)
        except TimeoutError:
            fresh.task.cancel()
            fresh.error = one_line(f"MCP server {toolpack_id} ({server_label(mcp)}) did not answer "
                                   f"initialize and tools/list within {self.start_timeout:g} s")
            self._record_failure(key, fresh.error)
            raise McpError(fresh.error) from None
        if not fresh.alive:
            fresh.error = fresh.error or f"MCP server {toolpack_id} ({server_label(mcp)}) closed at start"
            self._record_failure(key, fresh.error)
            raise McpError(fresh.error)
        self._failures.pop(key, None)
        self._generations[key] = self._generations.get(key, 0) + 1
        return fresh

    async def _tools(self, toolpack_id, mcp):
        session = await self._ensure(toolpack_id, mcp)
        return [dict(tool) for tool in session.tools]

    async def _call(self, toolpack_id, mcp, tool, arguments):
        session = await self._ensure(toolpack_id, mcp)
        try:
            result = await asyncio.wait_for(session.session.call_tool(tool, arguments), self.call_timeout)
        except TimeoutError:
            raise McpError(f"MCP server {toolpack_id}: tools/call {tool} got no answer within "
                           f"{self.call_timeout:g} s") from None
        except (Exception, asyncio.CancelledError) as error:  # noqa: BLE001 - the SDK raises many kinds
            session.session = None  # a broken session is started afresh by the next call
            session.stop.set()
            raise McpError(one_line(f"MCP server {toolpack_id} failed during tools/call {tool}: "
                                    f"{describe_failure(error)}; it is restarted on the next call")) from None
        return tool_result(result.model_dump(by_alias=True, exclude_none=True))

    async def _state(self, toolpack_id, mcp):
        session = self._sessions.get(session_key(toolpack_id, mcp))
        if session is None:
            return STATE_NOT_STARTED
        if session.alive:
            return STATE_UP
        if not session.ready.is_set():
            return "starting"
        return "down: " + (session.error or "closed")

    async def _close_all(self):
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.stop.set()
        tasks = [session.task for session in sessions if session.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_SECONDS)

    # -- the synchronous API

    def tools(self, toolpack_id, mcp):
        """The server's tools as [{name, description, inputSchema}] (starting it if needed); raises McpError."""
        return self._run(self._tools(toolpack_id, mcp), self.start_timeout + 5)

    def call(self, toolpack_id, mcp, tool, arguments):
        """Call one tool (names without the toolpack prefix); raises McpError with one line."""
        return self._run(self._call(toolpack_id, mcp, tool, arguments), self.start_timeout + self.call_timeout + 5)

    def _record_failure(self, key, error):
        previous = self._failures.get(key)
        self._failures[key] = (time.monotonic(), error, 1 if previous is None else previous[2] + 1)

    def generation(self, toolpack_id, mcp):
        """How many times this server has started and listed its tools (0: never)."""
        return self._generations.get(session_key(toolpack_id, mcp), 0)

    def recent_failure(self, toolpack_id, mcp):
        """The error line of a start that failed less than the back-off ago, else None. The back-off doubles
        with each failure in a row (retry_seconds, 2×, 4×, … at most MAX_RETRY_SECONDS), so a server that
        hangs at start does not hold a project's scheduler passes most of the time."""
        failure = self._failures.get(session_key(toolpack_id, mcp))
        if failure is None:
            return None
        backoff = min(self.retry_seconds * 2 ** (failure[2] - 1), MAX_RETRY_SECONDS)
        return failure[1] if time.monotonic() - failure[0] < backoff else None

    def state(self, toolpack_id, mcp):
        """`up`, `not started`, `starting` or `down: <reason>`."""
        with self._lock:
            if self._loop is None:
                return STATE_NOT_STARTED
        return self._run(self._state(toolpack_id, mcp), 5)

    def check(self, toolpack_id, mcp):
        """None when the server starts and lists its tools, else the one-line reason."""
        try:
            self.tools(toolpack_id, mcp)
        except McpError as error:
            return str(error)
        return None

    def close(self):
        """Close every session and stop the loop thread; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(CLOSE_TIMEOUT_SECONDS + 5)
        except TimeoutError:
            log.warning("MCP sessions did not close within %s s", CLOSE_TIMEOUT_SECONDS)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_TIMEOUT_SECONDS)
        if not thread.is_alive():
            loop.close()


class _Listing:
    """The `mcp_tools` callable of toolpack resolution (suzumio_registry.mcp_toolpack): (tools, None) or
    (None, error line). A server that failed a moment ago is not started again on every resolution."""

    def __init__(self, hub):
        self.hub = hub

    def __call__(self, toolpack_id, mcp):
        recent = self.hub.recent_failure(toolpack_id, mcp)
        if recent is not None:
            return None, recent
        try:
            return self.hub.tools(toolpack_id, mcp), None
        except McpError as error:
            return None, str(error)

    def stamp(self, toolpack_id, mcp, listed):
        """ConfigCache's stamp: the start count of a listed server; a retry period for one that was not."""
        if listed:
            return self.hub.generation(toolpack_id, mcp)
        return ("retry", int(time.monotonic() // self.hub.retry_seconds))


def checking(toolpack_id, mcp, hub):
    """The `mcp_tools` of `config render --check`: a server that cannot be listed fails the load."""
    from suzumio_errors import ConfigError

    try:
        return hub.tools(toolpack_id, mcp), None
    except McpError as error:
        raise ConfigError(f"tools.toolpacks: {error}") from None
