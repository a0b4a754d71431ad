"""Runner-local tools (docs/design/runner.md): argument rules, path confinement, file.read, file.write,
file.patch, shell.exec in its own process group, web.fetch. Standard library only, CPython >= 3.9."""

import json
import math
import os
import posixpath
import re
import signal
import ssl
import stat
import time
from urllib.parse import urljoin, urlsplit, urlunsplit

from suzumio_runner_models import TransportError, http_request, proxy_for

MAX_SAFE_INTEGER = 2**53 - 1
LINE_LIMIT = 2000
REDIRECT_LIMIT = 20
_ABSENT = object()


class ToolError(Exception):
    """A tool call failed; the message is what the model sees."""


# ---------------------------------------------------------------------------------------------
# Argument helpers and path confinement


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
    """Resolve value and check it lexically and by real path against roots; returns the
    resolved path (what results name) and the real path (what the tools open)."""
    resolved = resolve_path(value, workspace)
    lexical_roots = [resolve_path(root, "/") for root in roots]
    real = os.path.realpath(resolved)
    if not any(is_under(resolved, root) for root in lexical_roots) or not any(
        is_under(real, os.path.realpath(root)) for root in lexical_roots
    ):
        raise ToolError(f"{kind} path must be under {roots_text(list(roots))}: {value}")
    return resolved, real


def meant_path(value, workspace, roots):
    """The path in the agent's own artifact folder (its last write root) that a write beside that folder
    meant, or None (a path under a root, or elsewhere). A 1.5B model, as a poet, wrote its poem to the
    artifacts root, or to a name that glued its folder's name to the file's with a colon."""
    resolved = resolve_path(value, workspace)
    if len(roots) < 2 or any(is_under(resolved, resolve_path(root, "/")) for root in roots):
        return None
    own = resolve_path(roots[-1], "/")
    parent, name = posixpath.split(resolved)
    if parent != posixpath.dirname(own) or not name or own == "/":
        return None
    folder = posixpath.basename(own)
    if name.startswith(folder) and len(name) > len(folder) + 1 and not name[len(folder)].isalnum():
        name = name[len(folder) + 1:]
    return f"{own}/{name}" if name != folder else None


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
# file.read, file.write, file.patch


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
# Process groups, shell.exec


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
    """The process groups of running shell commands and Node hosts; SIGTERM ends them all.
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
    # Imported on first use: an activation that runs no command does not pay for them at start.
    import subprocess
    import threading

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
    # The model reads the output as text, not the metadata: how the command ended is said there too.
    if timed_out:
        output += f"\n[timed out: stopped with {signal.Signals(-code).name if code < 0 else 'exit ' + str(code)}]"
    elif code != 0:
        output += f"\n[exit code {code}]" if code > 0 else f"\n[killed by {signal.Signals(-code).name}]"
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
# web.fetch


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


def web_fetch(args, env, egress_proxy=None):
    """web.fetch: GET a URL (redirects followed) and return its text. With an `egress_proxy` (the
    forwarder to the controller's egress proxy) every request goes there, whatever NO_PROXY says;
    without one, the proxy variables are honoured."""
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
    # The sandbox's trust store (suzumio_runner_egress.trust_environment), which names the project's CA.
    trusted = ssl.create_default_context(cafile=env["SSL_CERT_FILE"]) if env.get("SSL_CERT_FILE") else None
    try:
        for _ in range(REDIRECT_LIMIT + 1):
            response = http_request(
                "GET", current, headers, None, egress_proxy or proxy_for(current, env), None, None, deadline,
                tls_context=trusted,
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
    if egress_proxy and response.headers.get("x-suzumio-egress") == "denied":
        raise ToolError(text.strip())
    content_type = response.headers.get("content-type") or ""
    if fmt == "text" and "html" in content_type.lower():
        text = clean_html(text)
    truncated = len(text) > max_chars
    if truncated:
        text = text[:max_chars] + "\n\n[truncated]"
    if not 200 <= response.status < 300:
        # The model reads the output, not the metadata: an error page must not read like the content.
        text = f"[HTTP {response.status}]\n{text}"
    metadata = {"url": url, "status": response.status}
    if content_type:
        metadata["contentType"] = content_type
    metadata.update({"format": fmt, "truncated": truncated})
    return {"title": "web fetch", "output": text, "metadata": metadata}
