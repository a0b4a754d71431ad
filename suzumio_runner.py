"""The activation runner: reads input.json, runs the model/tool loop with fallback and overflow
compaction, runs the runner-local tools (file.*, shell.exec, web.fetch) and local toolpacks through the
Node host, and reports to the controller (backend-runner.md §5, §7-§13). Standard library only, runs on
CPython >= 3.9, imports only suzumio_models (beside it); nothing imports this module but tests."""

import json
import logging
import math
import os
import posixpath
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from urllib.parse import urljoin, urlsplit, urlunsplit

try:
    from suzumio_models import (
        ModelError,
        TransportError,
        api_model,
        create_provider,
        expand_preset,
        http_request,
        is_context_overflow,
        provider_secrets,
        proxy_for,
        safe_tool_name,
    )
except ImportError as missing:  # the backend must deliver both files side by side
    sys.stderr.write(
        "Runner file not found: {} ({})\n".format(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "suzumio_models.py"), missing
        )
    )
    sys.exit(1)

log = logging.getLogger("suzumio_runner")

CONTROLLER_CONNECT_TIMEOUT_S = 60.0
CONTROLLER_READ_TIMEOUT_S = 300.0
ENDING_TOOLS = ("coordination.wait_for_signal", "completion.submit")
BUILTIN_TOOLS = {
    "core": (
        "messages.send",
        "coordination.wait_for_signal",
        "completion.submit",
        "file.read",
        "file.write",
        "file.patch",
    ),
    "shell": ("shell.exec",),
    "web": ("web.fetch",),
}
SUPPORT_TOOLS = ("messages.send", "coordination.wait_for_signal", "completion.submit")
ROW_PREFIXES = {
    "compaction": "# Compacted Agent History",
    "tool_call": "# Tool Call Record",
    "tool_result": "# Tool Result Record",
}
MODEL_ROW_LIMIT = 40000
MODEL_TOOL_RESULT_LIMIT = 12000
TAIL_MAX_ROWS = 12
TAIL_BUDGET = 80000
SUMMARY_ROW_LIMIT = 12000
SUMMARY_TOOL_RESULT_LIMIT = 3000
SUMMARY_INPUT_BUDGET = 80000
SUMMARY_MAX_CHARS = 20000
SUMMARY_MAX_TOKENS = 4000
CONTINUE_TEXT = "Continue the assigned Suzumio activation."
NO_SUMMARY_TEXT = "No durable session facts were recovered from the compacted history."
ENDED_OUTPUT = "This activation has already ended; the tool call was not run."
MAX_SAFE_INTEGER = 2**53 - 1
LINE_LIMIT = 2000
REDIRECT_LIMIT = 20
_ABSENT = object()


class RunnerError(Exception):
    """A failure that ends the run (or, inside an attempt, the attempt)."""


class ControllerError(RunnerError):
    """A controller call failed; `status` is the HTTP status when there was an answer."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class ToolError(Exception):
    """A tool call failed; the message is what the model sees."""


def now_iso():
    """The current UTC time as ISO-8601 with milliseconds and Z."""
    now = datetime.now(timezone.utc)  # noqa: UP017 (datetime.UTC needs 3.11)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def compact_json(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def trim_chars(text, limit):
    """Strip; if longer than limit keep the first limit chars plus a `[truncated <n> chars]` note."""
    stripped = (text or "").strip()
    if len(stripped) <= limit:
        return stripped
    return f"{stripped[:limit].rstrip()}\n\n[truncated {len(stripped) - limit} chars]"


def format_error(error):
    """The one-line text printed for an uncaught error: message, then `: <cause>` and ` [<code>]`."""
    message = str(error) or error.__class__.__name__
    cause = error.__cause__
    if cause is not None:
        message += f": {cause}"
        code = getattr(cause, "errno", None) or getattr(cause, "code", None)
        if code is not None:
            message += f" [{code}]"
    return message


class Redactor:
    """Replaces every known secret (agent token, provider keys, secret headers) by `<redacted>`."""

    def __init__(self):
        self.secrets = []

    def add(self, values):
        merged = set(self.secrets)
        merged.update(v for v in values if isinstance(v, str) and v.strip())
        self.secrets = sorted(merged, key=len, reverse=True)

    def __call__(self, text):
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text


class RedactingFormatter(logging.Formatter):
    def __init__(self, redactor):
        super().__init__("%(message)s")
        self.redactor = redactor

    def format(self, record):
        return self.redactor(super().format(record))


# ---------------------------------------------------------------------------------------------
# Controller client


class ControllerClient:
    """POSTs JSON to the controller's runner routes, never through a proxy (§7.7)."""

    def __init__(self, base_url, identity):
        self.base_url = base_url.rstrip("/")
        self.identity = identity

    def post(self, path, fields):
        body = dict(self.identity)
        body.update(fields)
        try:
            response = http_request(
                "POST",
                self.base_url + path,
                {"Content-Type": "application/json"},
                json.dumps(body).encode("utf-8"),
                None,
                CONTROLLER_CONNECT_TIMEOUT_S,
                CONTROLLER_READ_TIMEOUT_S,
            )
        except TransportError as error:
            raise ControllerError(
                f"Suzumio controller request failed: {error}. The Suzumio server must be running and "
                f"reachable at {self.base_url} (for containers: start it with --host 0.0.0.0 and use a "
                "container-reachable URL such as "
                "http://host.docker.internal:<port>)"
            ) from None
        text = response.body.decode("utf-8", "replace")
        if not 200 <= response.status < 300:
            raise ControllerError(error_message(text, response.status), response.status)
        if not text.strip():
            return {}
        try:
            return json.loads(text)
        except ValueError:
            raise ControllerError(f"Invalid JSON from the controller for {path}: {text[:200]}") from None


def error_message(text, status):
    """The `error` string of a JSON error body, else the raw body, else `Request failed: <status>`."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return parsed["error"]
    return text.strip() or f"Request failed: {status}"


# ---------------------------------------------------------------------------------------------
# History rendering, context snapshot and compaction helpers (§7.5, §7.6, §11)


def render_for_model(row):
    """One history row as model text, prefixed by role and trimmed (§7.5)."""
    role = row.get("role")
    content = str(row.get("content") or "")
    if role in ROW_PREFIXES:
        content = f"{ROW_PREFIXES[role]}\n\n{content}"
    return trim_chars(content, MODEL_TOOL_RESULT_LIMIT if role == "tool_result" else MODEL_ROW_LIMIT)


def history_to_messages(history):
    """The initial Chat Completions messages for a history (§7.5)."""
    messages = []
    for row in history:
        text = render_for_model(row)
        if text:
            role = "assistant" if row.get("role") in ("assistant", "tool_call") else "user"
            messages.append({"role": role, "content": text})
    return messages or [{"role": "user", "content": CONTINUE_TEXT}]


def retry_tail_count(history):
    """How many newest rows a compaction keeps verbatim (§11.1)."""
    if len(history) <= 1:
        return len(history)
    count = total = 0
    for row in reversed(history):
        if count >= TAIL_MAX_ROWS:
            break
        size = len(render_for_model(row))
        if count >= 1 and total + size > TAIL_BUDGET:
            break
        total += size
        count += 1
    return max(1, count)


def render_for_summary(row):
    lines = [
        "## {} {} {}".format(row.get("sequence"), row.get("role"), row.get("kind")),
        "Time: {}".format(row.get("createdAt")),
    ]
    if row.get("activationId"):
        lines.append("Activation: {}".format(row["activationId"]))
    if row.get("compactionId"):
        lines.append("Archived by: {}".format(row["compactionId"]))
    lines.append(str(row.get("content") or ""))
    limit = SUMMARY_TOOL_RESULT_LIMIT if row.get("role") == "tool_result" else SUMMARY_ROW_LIMIT
    return trim_chars("\n".join(lines), limit)


def summary_input(archived):
    """The archived rows rendered for the summary request, at most SUMMARY_INPUT_BUDGET chars."""
    parts = []
    used = 0
    for row in archived:
        piece = render_for_summary(row)
        remaining = SUMMARY_INPUT_BUDGET - used - (2 if parts else 0)
        if remaining <= 0:
            break
        if len(piece) > remaining:
            piece = trim_chars(piece, max(0, remaining - 40))[:remaining]
            parts.append(piece)
            break
        parts.append(piece)
        used += len(piece) + (2 if len(parts) > 1 else 0)
    return "\n\n".join(parts)


SUMMARY_INSTRUCTION = (
    "You are condensing the long session of an autonomous agent so that its work can resume later from "
    "this summary alone. Preserve every piece of concrete state: the goal, constraints, progress on proofs, "
    "lemmas and computations, file paths, commands, errors, artifacts, verification results, blockers and "
    "next steps. Drop chatter, pleasantries and duplicate attempts."
)
SUMMARY_TEMPLATE = """Reproduce exactly this Markdown template, with these headings in this order:

## Goal
## Constraints & Preferences
## Progress
### Done
### In Progress
### Blocked
## Key Decisions
## Next Steps
## Critical Context
## Relevant Files

Rules: keep every section and write (none) when a section is empty; use terse bullets; preserve exact
paths, commands, error strings and identifiers; do not mention that a summary or compaction happened."""


def summary_prompt(archived):
    return "\n\n".join(
        [SUMMARY_INSTRUCTION, SUMMARY_TEMPLATE, "# Agent History To Compact", summary_input(archived)]
    )


def _collapse(text, limit):
    text = re.sub(r"\s+", " ", str(text or "")).strip()
    return text[:limit]


def _first_line(text, limit=900):
    for line in str(text or "").split("\n"):
        if line.strip():
            return _collapse(line, limit)
    return ""


PATH_TOKEN = re.compile(r"(?<![\w/:.-])(?:/[\w.@+-]+(?:/[\w.@+-]*)*|[\w.-]+/[\w.@+-]+(?:/[\w.@+-]*)*)")


def path_tokens(texts, limit=12):
    found = []
    for text in texts:
        for token in PATH_TOKEN.findall(str(text or "")):
            token = token.rstrip("),.;:")
            if token and "//" not in token and len(token) <= 180 and token not in found:
                found.append(token)
                if len(found) >= limit:
                    return found
    return found


def fallback_summary(history, archived, keep_tail, agent_id, selected_model, overflow_error, summary_error):
    """The deterministic summary used when the summary request fails or nothing is archived (§11.3)."""
    prompts = [row for row in history if row.get("kind") == "activation_prompt"]
    goal_row = prompts[0] if prompts else (history[0] if history else {})
    goal = _first_line(goal_row.get("content")) or "(none recovered)"
    recent = archived[-10:]
    sequences = [row.get("sequence") for row in archived if isinstance(row.get("sequence"), int)]
    span = f"{min(sequences)}-{max(sequences)} ({len(archived)} messages)" if sequences else "(none)"
    recent_text = (
        "; ".join(
            "{} {}/{}: {}".format(
                row.get("sequence"), row.get("role"), row.get("kind"), _first_line(row.get("content"))
            )
            for row in recent
        )
        or "(none)"
    )
    files = path_tokens(row.get("content") for row in recent)
    file_lines = "\n".join(f"- {path}" for path in files) or "(none recovered from the archived messages)"
    text = "\n".join(
        [
            "## Goal",
            goal,
            "",
            "## Constraints & Preferences",
            "(none recovered; see the retained history)",
            "",
            "## Progress",
            "### Done",
            f"- {len(archived)} earlier history messages are preserved in the controller's raw archive.",
            "### In Progress",
            f"- Work continues from the latest {keep_tail} unarchived history messages.",
            "### Blocked",
            f"- Provider context overflow: {_collapse(overflow_error, 700)}",
            f"- Summary generation failed: {_collapse(summary_error, 700)}",
            "",
            "## Key Decisions",
            "(none recovered)",
            "",
            "## Next Steps",
            "- Re-read the latest activation prompt and continue from the retained history.",
            "",
            "## Critical Context",
            f"- Agent: {agent_id}",
            f"- Selected model: {selected_model}",
            f"- Archived sequence range: {span}",
            f"- Recent archived messages: {recent_text}",
            "",
            "## Relevant Files",
            file_lines,
        ]
    )
    return trim_chars(text, SUMMARY_MAX_CHARS)


# ---------------------------------------------------------------------------------------------
# Argument helpers and path confinement (§12.1, §12.2)


def describe_value(value):
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def require_object(args):
    if not isinstance(args, dict):
        raise ToolError("Tool input must be an object")
    return args


def required_string(args, key):
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{key} is required")
    return value


def text_value(args, key):
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolError(f"{key} must be a string")
    return value


def optional_string(args, key):
    value = args.get(key)
    return value if isinstance(value, str) and value.strip() else None


def optional_bool(args, key):
    value = args.get(key, _ABSENT)
    if value is _ABSENT or value is True or value is False:
        return None if value is _ABSENT else value
    raise ToolError(f"Expected boolean, got {describe_value(value)}")


def bounded(args, key, default, cap):
    value = args.get(key, _ABSENT)
    if value is _ABSENT:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or math.isnan(value)
        or value in (float("inf"), float("-inf"))
        or value <= 0
    ):
        raise ToolError("Expected a positive number")
    return max(1, min(int(value), cap))


def resolve_path(value, workspace):
    """Absolute paths normalised lexically; relative ones joined to the workspace first."""
    joined = value if value.startswith("/") else posixpath.join(workspace, value)
    return "/" + posixpath.normpath(joined).lstrip("/")


def is_under(path, root):
    root = root.rstrip("/") or "/"
    return root == "/" or path == root or path.startswith(root + "/")


def roots_text(roots):
    if len(roots) <= 1:
        return "".join(roots)
    if len(roots) == 2:
        return f"{roots[0]} or {roots[1]}"
    return "{}, or {}".format(", ".join(roots[:-1]), roots[-1])


def confine(value, workspace, roots, kind):
    """Resolve value and check it lexically and by real path against roots (§12.2); returns the
    resolved path (what results name) and the real path (what the tools open)."""
    resolved = resolve_path(value, workspace)
    lexical_roots = [resolve_path(root, "/") for root in roots]
    real = os.path.realpath(resolved)
    if not any(is_under(resolved, root) for root in lexical_roots) or not any(
        is_under(real, os.path.realpath(root)) for root in lexical_roots
    ):
        raise ToolError(f"{kind} path must be under {roots_text(list(roots))}: {value}")
    return resolved, real


def confined_path(value, workspace, roots, kind):
    return confine(value, workspace, roots, kind)[0]


def open_confined(path, real, flags):
    """Open the checked real path as a regular file and return the descriptor.

    O_NOFOLLOW: the real path has no link left in it, so a link found there now was put in after the
    check (or is a /proc magic link, whose text names no file). O_NONBLOCK: a FIFO must not hang the
    runner. A regular file with more than one name is refused: any of its other names (hard links
    carry no trace of which came first) may lie outside the roots, under `local` for certain, and
    reading or writing it would reach that file. Errors name `path`, as the model wrote it resolved."""
    try:
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"Not a regular file: {path}")
        if info.st_nlink > 1:
            raise ToolError(
                f"Refusing {path}: the file has {info.st_nlink} hard links, and another of its names may lie "
                "outside the allowed roots; copy it to a new file first"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------------------------------
# file.read, file.write, file.patch (§12.3, §12.4)


def cap_text(text, max_bytes):
    size = len(text.encode("utf-8"))
    if size <= max_bytes:
        return text
    return f"{text[:max_bytes].rstrip()}\n\n[truncated {size - max_bytes} bytes]"


def file_read(args, workspace, read_roots):
    """file.read: numbered lines of a file, or the entries of a directory."""
    require_object(args)
    path, real = confine(required_string(args, "path"), workspace, read_roots, "Read")
    offset = bounded(args, "offset", 1, MAX_SAFE_INTEGER)
    limit = bounded(args, "limit", 200, 2000)
    max_bytes = bounded(args, "maxBytes", 50000, 100000)
    if os.path.isdir(real):
        with os.scandir(real) as scan:
            entries = sorted(e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in scan)
        raw = "\n".join(entries[offset - 1 : offset - 1 + limit])
        body = cap_text(raw, max_bytes)
        return {
            "title": "file read",
            "output": body or "(empty directory range)",
            "metadata": {
                "path": path,
                "kind": "directory",
                "entries": len(entries),
                "offset": offset,
                "limit": limit,
                "truncated": body != raw,
            },
        }
    with os.fdopen(open_confined(path, real, os.O_RDONLY), "rb") as handle:
        lines = re.split(r"\r?\n", handle.read().decode("utf-8", "replace"))
    rendered = []
    for index, line in enumerate(lines[offset - 1 : offset - 1 + limit]):
        if len(line) > LINE_LIMIT:
            line = line[:LINE_LIMIT] + "... (line truncated)"
        rendered.append(f"{offset + index}: {line}")
    raw = "\n".join(rendered)
    body = cap_text(raw, max_bytes)
    return {
        "title": "file read",
        "output": body or "(empty file range)",
        "metadata": {
            "path": path,
            "kind": "file",
            "lines": len(lines),
            "offset": offset,
            "limit": limit,
            "truncated": body != raw,
        },
    }


def _write_text(path, real, content, create_dirs=None):
    if create_dirs:
        os.makedirs(os.path.dirname(real) or "/", exist_ok=True)
    fd = open_confined(path, real, os.O_WRONLY | os.O_CREAT)
    os.ftruncate(fd, 0)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
        handle.write(content)


def file_write(args, workspace, write_roots):
    """file.write: create or replace a file with the given text."""
    require_object(args)
    path, real = confine(required_string(args, "path"), workspace, write_roots, "Write")
    content = text_value(args, "content")
    _write_text(path, real, content, optional_bool(args, "createDirs"))
    return {
        "title": "file written",
        "output": f"Wrote {len(content)} chars to {path}",
        "metadata": {"path": path, "chars": len(content)},
    }


def file_patch(args, workspace, write_roots):
    """file.patch: add/update/delete operations applied in order, not atomically."""
    require_object(args)
    operations = args.get("operations")
    if not isinstance(operations, list):
        raise ToolError("operations must be an array")
    lines = []
    for operation in operations:
        require_object(operation)
        op = required_string(operation, "op")
        path, real = confine(required_string(operation, "path"), workspace, write_roots, "Write")
        if op == "add":
            content = text_value(operation, "content")
            _write_text(path, real, content, optional_bool(operation, "createDirs"))
            lines.append(f"add {path} ({len(content)} chars)")
        elif op == "delete":
            os.remove(path)
            lines.append(f"delete {path}")
        elif op == "update":
            search = required_string(operation, "search")
            replace = operation.get("replace") if isinstance(operation.get("replace"), str) else ""
            replace_all = optional_bool(operation, "replaceAll")
            fd = open_confined(path, real, os.O_RDONLY)
            with os.fdopen(fd, "r", encoding="utf-8", errors="replace", newline="") as handle:
                text = handle.read()
            count = text.count(search)
            if count == 0:
                raise ToolError(f"Patch search text not found in {path}")
            if count > 1 and not replace_all:
                raise ToolError(
                    f"Patch search text matched {count} times in {path}; set replaceAll:true or make search "
                    "text unique"
                )
            _write_text(path, real, text.replace(search, replace))
            lines.append("update {} ({} replacement{})".format(path, count, "" if count == 1 else "s"))
        else:
            raise ToolError(f"Unsupported patch op: {op}")
    return {"title": "file patch", "output": "\n".join(lines), "metadata": {"operations": len(lines)}}


# ---------------------------------------------------------------------------------------------
# Process groups, shell.exec (§12.5)


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid, signum):
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def reap_group(pgid):
    """Reap exited members of a group that are our children (the runner may be PID 1 in a container)."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class ProcessGroups:
    """The process groups of running shell commands and Node hosts; SIGTERM ends them all (§7.1).
    A plain set: the signal handler runs on the main thread and must not wait for a lock."""

    def __init__(self):
        self.pgids = set()

    def add(self, pgid):
        self.pgids.add(pgid)

    def discard(self, pgid):
        self.pgids.discard(pgid)

    def terminate_all(self, grace):
        pgids = list(self.pgids)
        for pgid in pgids:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pgids and time.monotonic() < deadline:
            for pgid in pgids:
                reap_group(pgid)
            pgids = [pgid for pgid in pgids if group_alive(pgid)]
            if pgids:
                time.sleep(0.05)
        for pgid in pgids:
            signal_group(pgid, signal.SIGKILL)


def _pump(stream, name, state):
    fd = stream.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        with state["lock"]:
            keep = chunk[: state["budget"]]
            state["budget"] -= len(keep)
            if len(keep) < len(chunk):
                state["truncated"] = True
            state[name] += keep
    stream.close()


def shell_exec(args, workspace, env, groups=None):
    """shell.exec: `bash -lc <command>` in its own process group with one output budget and a timeout."""
    require_object(args)
    command = required_string(args, "command")
    cwd_value = optional_string(args, "cwd")
    cwd = resolve_path(cwd_value, workspace) if cwd_value else workspace
    timeout_ms = bounded(args, "timeoutMs", 60000, 300000)
    max_output = bounded(args, "maxOutputBytes", 40000, 200000)
    try:
        process = subprocess.Popen(
            ["bash", "-lc", command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as error:
        raise ToolError(str(error)) from None
    if groups is not None:
        groups.add(process.pid)
    state = {
        "lock": threading.Lock(),
        "budget": max_output,
        "truncated": False,
        "stdout": bytearray(),
        "stderr": bytearray(),
    }
    pumps = [
        threading.Thread(target=_pump, args=(process.stdout, "stdout", state), daemon=True),
        threading.Thread(target=_pump, args=(process.stderr, "stderr", state), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    deadline = time.monotonic() + timeout_ms / 1000.0
    timed_out = False
    try:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        for pump in pumps:
            pump.join(max(0.0, deadline - time.monotonic()))
        if any(pump.is_alive() for pump in pumps):
            timed_out = True
        if timed_out:
            _stop_group(process)
            for pump in pumps:
                pump.join(2.0)
        process.wait()
    finally:
        if groups is not None:
            groups.discard(process.pid)
    stdout = bytes(state["stdout"]).decode("utf-8", "replace")
    stderr = bytes(state["stderr"]).decode("utf-8", "replace")
    output = f"$ {command}"
    if stdout.strip():
        output += "\n[stdout]\n" + stdout.rstrip()
    if stderr.strip():
        output += "\n[stderr]\n" + stderr.rstrip()
    if state["truncated"]:
        output += "\n[truncated]"
    code = process.returncode
    return {
        "title": "shell exec",
        "output": output,
        "metadata": {
            "exitCode": code if code >= 0 else None,
            "signal": signal.Signals(-code).name if code < 0 else None,
            "cwd": cwd,
            "timedOut": timed_out,
            "truncated": state["truncated"],
        },
    }


def _stop_group(process):
    """SIGTERM the command's group; SIGKILL it 2 s later if any member is still alive."""
    signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if process.poll() is not None:
            reap_group(process.pid)
            if not group_alive(process.pid):
                return
        time.sleep(0.05)
    signal_group(process.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# web.fetch (§12.6)


def clean_html(text):
    text = re.sub(r"<script\b[^>]*>.*?</script\s*>", " ", text, flags=re.IGNORECASE | re.DOTALL)
    text = re.sub(r"<style\b[^>]*>.*?</style\s*>", " ", text, flags=re.IGNORECASE | re.DOTALL)
    text = re.sub(r"<[^>]*>", " ", text)
    for entity, char in (
        ("&nbsp;", " "),
        ("&amp;", "&"),
        ("&lt;", "<"),
        ("&gt;", ">"),
        ("&quot;", '"'),
        ("&#39;", "'"),
    ):
        text = text.replace(entity, char)
    return re.sub(r"\s+", " ", text).strip()


def normalize_url(value):
    """Parse and check a web.fetch URL; returns the normalised URL text."""
    parts = urlsplit(value.strip())
    if not parts.scheme:
        raise ToolError(f"Invalid URL: {value}")
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ToolError(f"Unsupported URL protocol: {scheme}:")
    try:
        _ = parts.port
    except ValueError:
        raise ToolError(f"Invalid URL: {value}") from None
    if not parts.hostname:
        raise ToolError(f"Invalid URL: {value}")
    if parts.username is not None or parts.password is not None:
        raise ToolError("URL credentials are not allowed")
    netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def web_fetch(args, env):
    """web.fetch: GET a URL (redirects followed, proxies honoured) and return its text."""
    require_object(args)
    url = normalize_url(required_string(args, "url"))
    max_chars = bounded(args, "maxBytes", 20000, 100000)
    timeout_ms = bounded(args, "timeoutMs", 30000, 120000)
    fmt = args.get("format", _ABSENT)
    fmt = "text" if fmt is _ABSENT else fmt
    if fmt not in ("text", "raw"):
        raise ToolError(f"Invalid format: {describe_value(fmt)}")
    deadline = time.monotonic() + timeout_ms / 1000.0
    headers = {"User-Agent": "suzumio-runner", "Accept": "*/*"}
    current = url
    try:
        for _ in range(REDIRECT_LIMIT + 1):
            response = http_request(
                "GET", current, headers, None, proxy_for(current, env), None, None, deadline
            )
            location = response.headers.get("location")
            if response.status not in (301, 302, 303, 307, 308) or not location:
                break
            current = urljoin(current, location)
            if urlsplit(current).scheme.lower() not in ("http", "https"):
                raise TransportError(f"redirect to unsupported URL {current}")
        else:
            raise TransportError("too many redirects")
    except TransportError as error:
        raise ToolError(f"web.fetch failed for {url}: {error}") from None
    text = response.body.decode("utf-8", "replace")
    content_type = response.headers.get("content-type") or ""
    if fmt == "text" and "html" in content_type.lower():
        text = clean_html(text)
    truncated = len(text) > max_chars
    if truncated:
        text = text[:max_chars] + "\n\n[truncated]"
    metadata = {"url": url, "status": response.status}
    if content_type:
        metadata["contentType"] = content_type
    metadata.update({"format": fmt, "truncated": truncated})
    return {"title": "web fetch", "output": text, "metadata": metadata}


# ---------------------------------------------------------------------------------------------
# Node bridge for local toolpack runner modules (§9)


class NodeBridge:
    """One `node suzumio_toolpack_host.mjs --role runner` child speaking newline-delimited JSON."""

    def __init__(self, toolpack_id, host_path, groups, node="node"):
        self.toolpack_id = toolpack_id
        self.groups = groups
        self.last_id = 0
        try:
            self.process = subprocess.Popen(
                [node, host_path, "--role", "runner"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError:
            raise RunnerError("Node.js is required to run local toolpack runner modules") from None
        groups.add(self.process.pid)

    def request(self, message):
        self.last_id += 1
        message = dict(message, id=self.last_id)
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise ToolError(self._exited_text()) from None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise ToolError(self._exited_text())
            try:
                reply = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                log.warning("Toolpack host for %s wrote a non-JSON line: %s", self.toolpack_id, line[:200])
                continue
            if isinstance(reply, dict) and reply.get("id") == self.last_id:
                break
        if reply.get("ok") is True:
            return reply
        raise ToolError(str(reply.get("error") or "Toolpack host call failed"))

    def _exited_text(self):
        return f"Toolpack host for {self.toolpack_id} exited (status {self.process.poll()})"

    def init(self, module, context):
        """Load the runner module; returns the names of the tools it registered."""
        try:
            reply = self.request({"op": "init", "module": module, "context": context})
        except ToolError as error:
            raise RunnerError(str(error)) from None
        return [name for name in reply.get("tools") or [] if isinstance(name, str)]

    def call(self, tool, args):
        result = self.request({"op": "call", "tool": tool, "input": args}).get("result")
        if not isinstance(result, dict) or not isinstance(result.get("output"), str):
            raise ToolError(f"Runner tool {tool} returned an invalid result")
        return result

    def close(self):
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process.stdout.close()
        self.groups.discard(self.process.pid)


# ---------------------------------------------------------------------------------------------
# The activation


class RegisteredTool:
    __slots__ = ("description", "handler", "name", "safe", "schema")

    def __init__(self, name, safe, description, schema, handler):
        self.name, self.safe, self.description, self.schema, self.handler = (
            name,
            safe,
            description,
            schema,
            handler,
        )


class RequestState:
    """Per run_request counters of the step loop (§7.4)."""

    def __init__(self):
        self.ended = False
        self.end_output = None
        self.tool_calls = 0


def localize(value, workspace, artifacts_root):
    """Tool descriptions name the container roots; show the input's roots instead (the same text
    under docker-chat, the host paths under `local`)."""
    if isinstance(value, str):
        for name, actual in (("workspace", workspace), ("artifacts", artifacts_root)):
            if actual:
                value = re.sub(rf"(?<![\w/])/{name}(?![\w-])", lambda m, actual=actual: actual, value)
        return value
    if isinstance(value, dict):
        return {
            k: localize(v, workspace, artifacts_root) if k == "description" or isinstance(v, dict) else v
            for k, v in value.items()
        }
    return value


def sum_usage(total, usage):
    for field, value in usage.items():
        total[field] = total.get(field, 0) + value
    return total


class Runner:
    """One activation: attempts over the expanded presets, then /activation-output (§7.2)."""

    def __init__(self, activation, env, groups=None, sleep=time.sleep, node="node", host_path=None):
        self.input = activation
        self.env = env
        self.groups = groups if groups is not None else ProcessGroups()
        self.sleep = sleep
        self.node = node
        self.host_path = host_path or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "suzumio_toolpack_host.mjs"
        )
        for field in ("project", "token", "controllerUrl", "workspace"):
            if not isinstance(activation.get(field), str) or not activation[field]:
                raise RunnerError(f"input.json is missing {field}")
        self.agent_id = (activation.get("agent") or {}).get("id")
        self.activation_id = (activation.get("activation") or {}).get("id")
        if not self.agent_id or not self.activation_id:
            raise RunnerError("input.json is missing agent.id or activation.id")
        self.workspace = activation["workspace"]
        self.artifacts_root = activation.get("artifactsRoot") or ""
        self.read_roots = activation.get("readRoots") or [self.workspace]
        self.write_roots = activation.get("writeRoots") or [self.workspace]
        self.runner_config = activation.get("runner") or {}
        self.client = ControllerClient(
            activation["controllerUrl"],
            {
                "project": activation["project"],
                "agentId": self.agent_id,
                "activationId": self.activation_id,
                "token": activation["token"],
            },
        )

    def run(self):
        """Try every concrete preset in order, then post the first output. Raises RunnerError."""
        models = self.runner_config.get("models")
        if not isinstance(models, dict):
            raise RunnerError("runner.models is required in ai mode")
        selected = (self.input.get("agent") or {}).get("model") or self.runner_config.get("model")
        if not selected:
            raise RunnerError(
                "No model preset selected. Set backend.runner.model or agents.<id>.model explicitly."
            )
        try:
            attempts = expand_preset(models, selected)
        except ModelError as error:
            raise RunnerError(str(error)) from None
        failures = []
        for attempt in attempts:
            try:
                output = self.run_attempt(attempt, selected)
                break
            except Exception as error:  # noqa: BLE001 - attempt boundary: any failure tries the next preset
                log.warning("Model attempt %s failed: %s", attempt.preset_id, error)
                failures.append(f"{attempt.preset_id}: {error}")
        else:
            raise RunnerError("All model attempts failed:\n" + "\n".join(failures))
        self.client.post("/activation-output", {"output": output})
        return output

    def run_attempt(self, attempt, selected):
        provider = create_provider(attempt, self.env, self.input, sleep=self.sleep)
        history = list(self.input.get("history") or [])
        for overflow_retry in (0, 1):
            try:
                return self.run_request(attempt, provider, selected, history)
            except Exception as error:
                if overflow_retry == 1 or not is_context_overflow(error):
                    raise
                log.warning(
                    "context overflow from %s; compacting agent history and retrying activation %s",
                    attempt.preset_id,
                    self.activation_id,
                )
                history = self.compact_for_overflow(attempt, provider, selected, history, error)

    def run_request(self, attempt, provider, selected, history):
        """Register tools, record the context, then loop model steps and tool calls (§7.4)."""
        bridges = []
        try:
            tools = self.register_tools(bridges)
            by_safe = {tool.safe: tool for tool in tools}
            messages = history_to_messages(history)
            self.submit_context(attempt, selected, messages, history)
            tool_defs = [
                {"name": t.safe, "description": t.description, "parameters": t.schema} for t in tools
            ]
            tool_choice = attempt.preset.get("toolChoice") or ("auto" if tools else "none")
            max_iterations = self.runner_config.get("maxIterations") or 1000000
            state = RequestState()
            text = ""
            usage = {}
            steps = 0
            while True:
                turn = provider.complete(messages, tool_defs, tool_choice)
                steps += 1
                text += turn.text
                sum_usage(usage, turn.usage)
                if not turn.tool_calls:
                    break
                messages.append(
                    {
                        "role": "assistant",
                        "content": turn.text,
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments},
                            }
                            for call in turn.tool_calls
                        ],
                    }
                )
                for call in turn.tool_calls:
                    content = self.execute_tool_call(state, call, by_safe)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
                if state.ended or steps >= max_iterations:
                    break
        finally:
            for bridge in bridges:
                bridge.close()
        out_text = text.strip() or state.end_output or "(model returned no text)"
        info = {"selectedModel": selected, "model": attempt.preset_id, "apiModel": api_model(attempt.preset)}
        output_usage = dict(info)
        metadata = dict(info)
        if usage:
            output_usage["tokens"] = usage
            metadata["usage"] = usage
        if hasattr(provider, "history_metadata"):
            metadata.update(provider.history_metadata())
        try:
            self.client.post(
                "/runner/history/messages",
                {"role": "assistant", "kind": "assistant_output", "content": out_text, "metadata": metadata},
            )
        except ControllerError as error:
            log.warning("%s (assistant output not recorded in history)", error)
        return {"text": out_text, "usage": output_usage}

    def submit_context(self, attempt, selected, messages, history):
        entries = [{"role": m["role"], "content": m["content"], "chars": len(m["content"])} for m in messages]
        context = {
            "version": 1,
            "kind": "model-context",
            "recordedAt": now_iso(),
            "selectedModel": selected,
            "model": attempt.preset_id,
            "apiModel": api_model(attempt.preset),
            "firstPrompt": sum(1 for row in history if row.get("kind") == "activation_prompt") <= 1,
            "messageCount": len(entries),
            "totalChars": sum(e["chars"] for e in entries),
            "messages": entries,
        }
        try:
            self.client.post("/activation-context", {"context": context})
        except ControllerError as error:
            log.warning("%s (activation context not recorded)", error)

    # -- tools ---------------------------------------------------------------------------------

    def register_tools(self, bridges):
        """The model-facing tools of every toolpack spec; local ones start a Node host (§8.1)."""
        tools = []
        seen = {}
        by_safe = {}
        for spec in self.input.get("toolpacks") or []:
            toolpack_id = spec.get("id", "")
            module = spec.get("runnerModule") or ""
            definitions = spec.get("tools") or []
            names = [d.get("name") for d in definitions]
            if module.startswith("builtin:"):
                handlers = self.builtin_handlers(module[len("builtin:") :], spec)
            else:
                bridge = NodeBridge(toolpack_id, self.host_path, self.groups, self.node)
                bridges.append(bridge)
                registered = bridge.init(
                    module,
                    {
                        "project": self.input["project"],
                        "agentId": self.agent_id,
                        "activationId": self.activation_id,
                        "workspace": self.workspace,
                        "toolpackId": toolpack_id,
                        "controllerUrl": self.input["controllerUrl"],
                        "token": self.input["token"],
                        "supportPath": spec.get("supportPath"),
                    },
                )
                handlers = {name: self._bridge_handler(bridge, name) for name in registered}
                names = list(spec.get("declaredTools") or []) + [
                    n for n in names if n not in (spec.get("declaredTools") or [])
                ]
            for name in names:
                if name not in handlers:
                    raise RunnerError(f"Runner module for {toolpack_id} did not register {name}")
                if name in seen:
                    raise RunnerError(f"Duplicate runner tool: {name}")
                seen[name] = toolpack_id
            for definition in definitions:
                name = definition["name"]
                safe = safe_tool_name(name)
                if safe in by_safe:
                    raise RunnerError(f"Tool names {by_safe[safe]} and {name} both map to {safe}")
                by_safe[safe] = name
                description = definition.get("description") or ""
                schema = definition.get("inputSchema") or {"type": "object", "properties": {}}
                description = localize(description, self.workspace, self.artifacts_root)
                schema = localize(schema, self.workspace, self.artifacts_root)
                tools.append(RegisteredTool(name, safe, description, schema, handlers[name]))
        return tools

    @staticmethod
    def _bridge_handler(bridge, name):
        return lambda args: bridge.call(name, args)

    def builtin_handlers(self, pack, spec):
        if pack not in BUILTIN_TOOLS:
            raise RunnerError(f"Unknown built-in runner toolpack: {pack}")
        support_path = spec.get("supportPath") or f"/toolpacks/{pack}/support"
        local = {
            "file.read": lambda args: file_read(args, self.workspace, self.read_roots),
            "file.write": lambda args: file_write(args, self.workspace, self.write_roots),
            "file.patch": lambda args: file_patch(args, self.workspace, self.write_roots),
            "shell.exec": lambda args: shell_exec(args, self.workspace, self.env, self.groups),
            "web.fetch": lambda args: web_fetch(args, self.env),
        }
        handlers = {}
        for name in BUILTIN_TOOLS[pack]:
            handlers[name] = (
                self._support_handler(support_path, name) if name in SUPPORT_TOOLS else local[name]
            )
        return handlers

    def _support_handler(self, support_path, tool):
        def call(args):
            result = self.client.post(support_path, {"tool": tool, "input": args})
            if not isinstance(result, dict) or not isinstance(result.get("output"), str):
                raise ToolError(f"Runner tool {tool} returned an invalid result")
            return result

        return call

    def execute_tool_call(self, state, call, by_safe):
        """Run one model tool call with its audit posts; returns the tool message text (§8.2)."""
        tool = by_safe.get(call.name)
        if tool is None:
            return f"Model called unknown tool: {call.name}"
        try:
            args = json.loads(call.arguments) if call.arguments and call.arguments.strip() else {}
        except ValueError as error:
            return f"Invalid tool input for {call.name} (arguments are not valid JSON): {error}"
        if args is None:
            args = {}
        if state.ended:
            return compact_json({"title": "activation ended", "output": ENDED_OUTPUT})
        state.tool_calls += 1
        max_calls = self.runner_config.get("maxToolCalls")
        if max_calls and state.tool_calls > max_calls:
            return f"Exceeded maxToolCalls: {max_calls}"
        try:
            started = self.client.post("/runner/tool-calls/start", {"tool": tool.name, "input": args})
        except ControllerError as error:
            return str(error)
        tool_call_id = started.get("toolCallId") if isinstance(started, dict) else None
        try:
            result = tool.handler(args)
        except (ToolError, ControllerError, OSError, ValueError) as error:
            return self._fail_tool_call(tool_call_id, str(error) or error.__class__.__name__)
        except Exception as error:  # a handler bug still becomes a tool error, as for a throwing JS tool
            log.warning("Tool %s failed unexpectedly", tool.name, exc_info=True)
            return self._fail_tool_call(tool_call_id, str(error) or error.__class__.__name__)
        try:
            finished = self.client.post(
                "/runner/tool-calls/finish",
                {"toolCallId": tool_call_id, "status": "completed", "output": result["output"]},
            )
        except ControllerError as error:
            return str(error)
        signal_text = finished.get("signalText") if isinstance(finished, dict) else None
        if isinstance(signal_text, str) and signal_text:
            result = dict(result)
            result["output"] = (
                "{}\n\n{}".format(result["output"], signal_text) if result["output"] else signal_text
            )
        if tool.name in ENDING_TOOLS:
            state.ended = True
            state.end_output = result["output"]
        shown = {key: result[key] for key in ("title", "output", "metadata") if key in result}
        return compact_json(shown)

    def _fail_tool_call(self, tool_call_id, message):
        try:
            self.client.post(
                "/runner/tool-calls/finish",
                {"toolCallId": tool_call_id, "status": "failed", "error": message},
            )
        except ControllerError as error:
            log.warning("%s (failed tool call not recorded)", error)
        return message

    # -- compaction ----------------------------------------------------------------------------

    def compact_for_overflow(self, attempt, provider, selected, history, overflow_error):
        """Summarize the archived head, persist the compaction, return the history to retry with (§11)."""
        keep_tail = max(1, retry_tail_count(history))
        archived = history[: len(history) - keep_tail]
        summary = None
        if archived:
            cap = min(attempt.preset.get("maxOutputTokens") or SUMMARY_MAX_TOKENS, SUMMARY_MAX_TOKENS)
            try:
                turn = provider.complete(
                    [{"role": "user", "content": summary_prompt(archived)}], [], None, cap
                )
                summary = trim_chars(turn.text, SUMMARY_MAX_CHARS) or NO_SUMMARY_TEXT
            except Exception as error:  # noqa: BLE001 - any failure: use the deterministic summary
                log.warning("History summary request to %s failed: %s", attempt.preset_id, error)
                summary_error = str(error)
        else:
            summary_error = (
                "No pre-activation segment was available to summarize; the active controller "
                "history is compacted."
            )
        if summary is None:
            summary = fallback_summary(
                history, archived, keep_tail, self.agent_id, selected, str(overflow_error), summary_error
            )
        response = self.client.post(
            "/runner/history/compact",
            {
                "summary": summary,
                "keepTail": keep_tail,
                "reason": "provider_context_overflow",
                "selectedModel": selected,
            },
        )
        new_history = response.get("history") if isinstance(response, dict) else None
        return new_history if isinstance(new_history, list) and new_history else history


# ---------------------------------------------------------------------------------------------
# Entry point


def parse_args(argv):
    options = {}
    index = 0
    while index < len(argv):
        name = argv[index]
        if not name.startswith("--") or index + 1 >= len(argv):
            raise RunnerError(f"Arguments are --name value pairs; got {name}")
        options[name[2:]] = argv[index + 1]
        index += 2
    if not options.get("input"):
        raise RunnerError("--input is required")
    return options


def load_input(path):
    try:
        with open(path, "r", encoding="utf-8") as handle:
            activation = json.load(handle)
    except OSError as error:
        raise RunnerError(f"Cannot read input file {path}") from error
    except ValueError as error:
        raise RunnerError(f"Input file {path} is not valid JSON: {error}") from None
    if not isinstance(activation, dict):
        raise RunnerError(f"Input file {path} must hold a JSON object")
    return activation


def main(argv=None):
    """Run one activation; returns the exit status (0 only after the output was accepted)."""
    redactor = Redactor()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter(redactor))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    groups = ProcessGroups()

    def on_sigterm(signum, frame):
        # Acts at once instead of setting a flag: the main thread may sit in a 300 s model read.
        sys.stderr.write("Received SIGTERM; stopping tool processes and exiting without output\n")
        sys.stderr.flush()
        groups.terminate_all(grace=1.0)
        os._exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    env = dict(os.environ)
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        activation = load_input(options["input"])
        redactor.add([activation.get("token"), env.get("SUZUMIO_TOKEN")])
        models = (activation.get("runner") or {}).get("models")
        if isinstance(models, dict):
            redactor.add(provider_secrets(models, env))
        Runner(activation, env, groups).run()
    except Exception as error:  # noqa: BLE001 - the process boundary: one line on stderr, exit 1
        sys.stderr.write(redactor(format_error(error)) + "\n")
        sys.stderr.flush()
        return 1
    finally:
        groups.terminate_all(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
