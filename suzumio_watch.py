"""`suzumio watch <project>`: a terminal client of a running controller's SSE stream that prints each
running activation's text, reasoning and tool calls as the model produces them, and the stored events
that frame them."""

import http.client
import json
from urllib.parse import quote, urlsplit

from suzumio_errors import SuzumioError

END_EVENTS = ("activation.completed", "activation.failed", "activation.cancelled")


class WatchError(SuzumioError):
    status = 502


def sse_stream(url, project, token, timeout=None, on_open=None):
    """(event, data dict) of each frame of GET /api/projects/<project>/stream, `on_open()` called once
    the controller accepted it; raises WatchError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WatchError(f"--url must be an http(s) URL, got {url}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), timeout=timeout)
    headers = {"Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", f"{parts.path.rstrip('/')}/api/projects/{quote(project, safe='')}/stream?limit=1",
                     headers=headers)
        response = conn.getresponse()
    except OSError as error:
        raise WatchError(f"cannot reach the controller at {url}: {error} (is `suzumio serve` running?)") from None
    if response.status != 200:
        text = response.read().decode("utf-8", "replace")
        try:
            text = json.loads(text).get("error") or text
        except (ValueError, AttributeError):
            pass
        raise WatchError(f"GET stream answered {response.status}: {text}")
    if on_open is not None:
        on_open()
    event, data = None, []
    try:
        while True:
            line = response.readline()
            if not line:
                return
            line = line.decode("utf-8", "replace").rstrip("\r\n")
            if not line:
                if event and data:
                    try:
                        yield event, json.loads("\n".join(data))
                    except ValueError:
                        pass
                event, data = None, []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
    except OSError as error:
        raise WatchError(f"the stream broke off: {error}") from None
    finally:
        conn.close()


class Printer:
    """Renders deltas and events as lines: one header per model call, text as it comes, tool calls as
    `-> name(arguments)` once their name is known."""

    def __init__(self, out):
        self.out = out
        self.call = None
        self.tool_names = {}
        self.open_line = False

    def _newline(self):
        if self.open_line:
            self.out.write("\n")
            self.open_line = False

    def delta(self, data):
        if data.get("callId") != self.call:
            self._newline()
            self.call = data.get("callId")
            self.tool_names = {}
            self.out.write(f"[{data.get('agentId')} {data.get('activationId')} {data.get('presetId')}]\n")
        if data.get("reasoning"):
            self.out.write(data["reasoning"])
            self.open_line = True
        if data.get("text"):
            self.out.write(data["text"])
            self.open_line = True
        for call in data.get("toolCalls") or []:
            index = call.get("index", 0)
            if call.get("name") and index not in self.tool_names:
                self._newline()
                self.tool_names[index] = call["name"]
                self.out.write(f"-> {call['name']}(")
                self.open_line = True
            if call.get("arguments"):
                self.out.write(call["arguments"])
                self.open_line = True
        if data.get("done"):
            if self.tool_names:
                self.out.write(")")
            self._newline()
        self.out.flush()

    def event(self, kind, data):
        if kind.startswith("activation.") or kind in ("model.retry", "model.waiting", "model.provider_paused",
                                                      "project.budget_warning", "project.budget_exceeded",
                                                      "message.created"):
            self._newline()
            try:  # the stored event row carries its data as JSON text
                inner = json.loads(data.get("data_json") or "{}")
            except ValueError:
                inner = {}
            inner = inner if isinstance(inner, dict) else {}
            detail = inner.get("activationId") or inner.get("id") or data.get("id") or ""
            extra = inner.get("reason") or inner.get("error") or ""
            self.out.write(f"* {kind} {detail} {extra}".rstrip() + "\n")
            self.out.flush()


def watch(url, project, token, out, once=False):
    """Print the project's live stream until it ends (or, with `once`, an activation ends)."""
    printer = Printer(out)

    def opened():
        out.write(f"watching {project} at {url} (Ctrl-C to stop)\n")
        out.flush()

    for kind, data in sse_stream(url, project, token, on_open=opened):
        if kind == "activation.delta":
            printer.delta(data)
            continue
        printer.event(kind, data)
        if once and kind in END_EVENTS:
            return 0
    return 0
