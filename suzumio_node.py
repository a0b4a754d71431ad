"""Controller-side client of the Node host (docs/design/tools.md): one lazily started, serialized `node
suzumio_toolpack_host.mjs --role controller` process, invocation timeouts, and synchronous callbacks
answered from a caller-provided mapping {callback name: callable}. It never touches the store;
suzumio_toolpacks and suzumio_scheduler build the callback facade."""
import collections
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from pathlib import Path

from suzumio_errors import SuzumioError
from suzumio_resources import resource_path

log = logging.getLogger(__name__)

SUPPORT_TIMEOUT_MS = 60_000
WEBUI_TIMEOUT_MS = 60_000
SCHEDULER_TICK_TIMEOUT_MS = 10_000
NODE_MISSING = "Node.js is required to run local toolpack controller modules"
HOST_SCRIPT_NAME = "suzumio_toolpack_host.mjs"

# Extra time a waiter allows beyond the in-flight deadline for the kill and the restart bookkeeping.
_WAIT_GRACE_SECONDS = 2.0
_STDERR_TAIL_LINES = 20


class ToolpackError(SuzumioError):
    """A controller module failed; the message is the module's own error text."""

    status = 500


class NodeHostError(ToolpackError):
    """The host itself failed: it could not start, timed out, exited or broke the protocol."""


def default_script_path():
    """The host script shipped beside this module (also inside the unpacked pex)."""
    return resource_path(HOST_SCRIPT_NAME)


def _host_failed(detail):
    return NodeHostError(f"Toolpack host failed: {detail}")


def _encode(message):
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n").encode()


class _HostProcess:
    """One running host: its pipes, a deadline-aware line reader on stdout, stderr forwarded to the log."""

    def __init__(self, argv):
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        except OSError as exc:
            log.warning("cannot start the Node host %s: %s", argv[0], exc)
            raise NodeHostError(NODE_MISSING) from exc
        self.pid = self.proc.pid
        self._buffer = b""
        self._eof = False
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.stderr_tail = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._stderr_thread = threading.Thread(
            target=self._forward_stderr, name=f"node-host-stderr-{self.pid}", daemon=True
        )
        self._stderr_thread.start()
        log.info("started Node host pid %s", self.pid)

    def _forward_stderr(self):
        try:
            for raw in iter(self.proc.stderr.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.stderr_tail.append(line)
                log.info("node host %s: %s", self.pid, line)
        except (OSError, ValueError):
            # The pipe was closed by stop() while a module's child process still held its write end.
            return

    def write(self, data):
        """Write encoded protocol lines; a dead host is reported with its exit detail."""
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise _host_failed(self._exit_detail()) from exc

    def read_message(self, deadline, timeout_ms):
        """The next protocol message; NodeHostError on timeout, exit or a line that is not protocol JSON."""
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = self._buffer[:newline]
                self._buffer = self._buffer[newline + 1:]
                if line.strip():
                    return self._parse(line)
                continue
            if self._eof:
                raise _host_failed(self._exit_detail())
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _host_failed(f"timed out after {timeout_ms} ms")
            try:
                if not self._selector.select(remaining):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
            except (OSError, ValueError) as exc:
                # close() stopped the process under us.
                raise _host_failed("host was stopped") from exc
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True

    def _parse(self, line):
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict) or message.get("type") not in ("call", "result"):
            text = line.decode("utf-8", "replace")
            raise _host_failed(f"invalid protocol line: {text[:200]}")
        return message

    def _exit_detail(self):
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "host closed its output"
        self._stderr_thread.join(timeout=1)
        detail = f"host exited with code {code}"
        tail = [line for line in self.stderr_tail if line.strip()]
        return f"{detail}: {tail[-1]}" if tail else detail

    def alive(self):
        return self.proc.poll() is None and not self._eof

    def stop(self, graceful):
        """End the process (closing stdin first when graceful) and release its pipes and thread."""
        if graceful and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                log.info("Node host pid %s did not exit on end of input; killing it", self.pid)
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=5)
        self._selector.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self._stderr_thread.join(timeout=2)
        self.proc.stderr.close()
        log.info("stopped Node host pid %s", self.pid)


class NodeHost:
    """One serialized controller-role host per controller; every invocation holds its lock."""

    def __init__(self, script_path=None, node="node"):
        self.script_path = Path(script_path) if script_path else default_script_path()
        self.node = node
        self._process = None
        self._next_id = 0
        self._condition = threading.Condition()
        self._busy = False
        self._busy_until = 0.0

    @property
    def pid(self):
        """Process id of the running host, or None when none is running."""
        process = self._process
        return process.pid if process is not None and process.alive() else None

    def support(self, module, toolpack_id, tool, input, context, callbacks, timeout_ms=SUPPORT_TIMEOUT_MS):
        """Run a support call through the module's controller toolpack (docs/design/tools.md)."""
        payload = {"module": str(module), "toolpackId": toolpack_id, "tool": tool, "input": input,
                   "context": context}
        return self.invoke("support", payload, callbacks, timeout_ms)

    def webui(self, module, toolpack_id, entry_id, input, context, callbacks, timeout_ms=WEBUI_TIMEOUT_MS):
        """Run a WebUI entry of the module (docs/design/tools.md)."""
        payload = {"module": str(module), "toolpackId": toolpack_id, "entryId": entry_id, "input": input,
                   "context": context}
        return self.invoke("webui", payload, callbacks, timeout_ms)

    def scheduler_tick(self, module, toolpack_id, context, callbacks, timeout_ms=SCHEDULER_TICK_TIMEOUT_MS):
        """Run the module's scheduler hook and return its raw resolved value (docs/design/tools.md)."""
        payload = {"module": str(module), "toolpackId": toolpack_id, "context": context}
        return self.invoke("schedulerTick", payload, callbacks, timeout_ms)

    def invoke(self, op, payload, callbacks, timeout_ms):
        """Send one invocation, answer its callbacks, and return its value or raise ToolpackError."""
        self._acquire(timeout_ms)
        try:
            process = self._ensure_started()
            self._next_id += 1
            invocation_id = self._next_id
            try:
                return self._exchange(process, invocation_id, op, payload, callbacks, timeout_ms)
            except NodeHostError:
                # Module caches go with the process; the next invocation starts a fresh host.
                self._discard(graceful=False)
                raise
        finally:
            self._release()

    def close(self):
        """Stop the host process if one runs; a later invocation starts a fresh one. Idempotent."""
        try:
            self._acquire(0)
        except NodeHostError:
            log.warning("Node host still busy at close; killing it")
            self._discard(graceful=False)
            return
        try:
            self._discard(graceful=True)
        finally:
            self._release()

    def _acquire(self, timeout_ms):
        # A waiter waits at most for the in-flight invocation's own deadline (plus the kill grace):
        # a stuck handler is killed by then, so nothing queues behind it for longer.
        with self._condition:
            if self._busy:
                give_up = self._busy_until + _WAIT_GRACE_SECONDS
                while self._busy:
                    remaining = give_up - time.monotonic()
                    if remaining <= 0:
                        raise _host_failed("timed out waiting for the previous invocation to finish")
                    self._condition.wait(remaining)
            self._busy = True
            self._busy_until = time.monotonic() + timeout_ms / 1000

    def _release(self):
        with self._condition:
            self._busy = False
            self._condition.notify()

    def _ensure_started(self):
        if self._process is not None and self._process.alive():
            return self._process
        self._discard(graceful=False)
        if not self.script_path.is_file():
            raise _host_failed(f"host script not found: {self.script_path}")
        self._process = _HostProcess([self.node, str(self.script_path), "--role", "controller"])
        return self._process

    def _discard(self, graceful):
        process, self._process = self._process, None
        if process is not None:
            process.stop(graceful)

    def _exchange(self, process, invocation_id, op, payload, callbacks, timeout_ms):
        message = {"type": "invoke", "id": invocation_id, "op": op, **payload}
        try:
            encoded = _encode(message)
        except (TypeError, ValueError) as exc:
            raise ToolpackError(f"Invocation payload is not JSON: {exc}") from exc
        deadline = time.monotonic() + timeout_ms / 1000
        process.stderr_tail.clear()
        process.write(encoded)
        while True:
            reply = process.read_message(deadline, timeout_ms)
            if reply.get("id") != invocation_id:
                raise _host_failed(f"reply for invocation {reply.get('id')!r} while waiting for {invocation_id}"
                                   + (f": {reply['error']}" if reply.get("error") else ""))
            if reply["type"] == "call":
                process.write(self._answer_call(reply, callbacks))
                continue
            if reply.get("ok"):
                return reply.get("value")
            raise ToolpackError(str(reply.get("error", "")))

    def _answer_call(self, call, callbacks):
        """The encoded reply line to one callback request."""
        call_id = call.get("callId")
        name = call.get("name")
        args = call.get("args")
        function = callbacks.get(name) if isinstance(name, str) else None

        def failed(error):
            return _encode({"type": "reply", "callId": call_id, "ok": False, "error": error})

        if function is None:
            return failed(f"Unsupported store method: {name}")
        if not isinstance(args, list):
            return failed(f"Invalid arguments for {name}")
        try:
            value = function(*args)
        except SuzumioError as exc:
            return failed(exc.message)
        except Exception as exc:  # callback boundary: every failure is thrown into the module as an Error
            log.warning("toolpack host callback %s failed", name, exc_info=True)
            return failed(str(exc) or type(exc).__name__)
        try:
            return _encode({"type": "reply", "callId": call_id, "ok": True, "value": value})
        except (TypeError, ValueError) as exc:
            return failed(f"Callback {name} returned a value that is not JSON: {exc}")
