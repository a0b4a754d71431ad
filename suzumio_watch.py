"""`suzumio watch <project>`: a terminal client of a running controller's SSE stream that narrates the
team from its stored events (the Narrator, which scripts/demo.py prints too) and prints each running
activation's text, reasoning and tool calls as the model produces them."""

import http.client
import json
from urllib.parse import quote, urlsplit

from suzumio_errors import SuzumioError
from suzumio_records import (
    KIND_ALL_QUIET_NUDGE,
    KIND_FAILED_NUDGE,
    KIND_MESSAGE,
    KIND_NO_EFFECT_NUDGE,
    KIND_RESUME_AFTER_STOP,
    KIND_SUBMITTED,
    KIND_WAIT,
    TOOL_SUBMIT,
    TOOL_WAIT,
)

DELTA_EVENT = "activation.delta"
END_EVENTS = ("activation.completed", "activation.failed", "activation.cancelled")


class WatchError(SuzumioError):
    status = 502


def sse_stream(url, project, token, timeout=None, on_open=None, limit=1):
    """(event, data dict) of each frame of GET /api/projects/<project>/stream, starting with the newest
    `limit` stored events, `on_open()` called once the controller accepted it; raises WatchError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WatchError(f"--url must be an http(s) URL, got {url}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), timeout=timeout)
    headers = {"Accept": "text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        path = f"{parts.path.rstrip('/')}/api/projects/{quote(project, safe='')}/stream?limit={int(limit)}"
        conn.request("GET", path, headers=headers)
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


# What a person reads of a signal that woke an agent, by its kind (a message names its sender).
WAKE_REASONS = {
    KIND_NO_EFFECT_NUDGE: "nudged: the last activation had no useful effect",
    KIND_FAILED_NUDGE: "nudged: the last activation failed",
    KIND_ALL_QUIET_NUDGE: "nudged: the whole team is quiet",
    KIND_RESUME_AFTER_STOP: "resuming after a stop",
    KIND_SUBMITTED: "a report was submitted",
    KIND_WAIT: "a wait notice",
}
NUDGE_KINDS = (KIND_NO_EFFECT_NUDGE, KIND_FAILED_NUDGE, KIND_ALL_QUIET_NUDGE)
LINE_CHARS = 120
KEY_CHARS = 100  # of a tool call's key input
REPORT_LINES = 3


def one_line(text, limit=LINE_CHARS):
    """`text` on one line, whitespace collapsed, cut at `limit` characters (ending `…`)."""
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def key_input(tool, tool_input):
    """The part of a tool call's input that says what it does: a path, a command, a recipient."""
    if not isinstance(tool_input, dict) or tool in (TOOL_WAIT, TOOL_SUBMIT):
        return ""  # their own lines follow: the wait with its reason, the submission with the report
    if tool_input.get("command"):
        return "$ " + one_line(tool_input["command"], KEY_CHARS)
    if tool_input.get("recipient") or tool_input.get("channel"):
        return str(tool_input.get("recipient") or tool_input.get("channel"))
    if isinstance(tool_input.get("operations"), list):
        edits = [f"{op.get('op', '?')} {op.get('path', '?')}" for op in tool_input["operations"]
                 if isinstance(op, dict)]
        return one_line(", ".join(edits), KEY_CHARS)
    for key in ("path", "url", "query"):
        if isinstance(tool_input.get(key), str) and tool_input[key].strip():
            return one_line(tool_input[key], KEY_CHARS)
    for key, value in tool_input.items():
        if isinstance(value, str) and value.strip():
            return f"{key}={one_line(value, 80)}"
    return ""


def wake_reason(signal):
    """One signal that woke an activation, as `message from pm (P3)`."""
    kind, priority = signal.get("kind"), signal.get("priority", "")
    if kind == KIND_MESSAGE:
        return f"message from {signal.get('sender') or signal.get('sourceAgent') or '?'} ({priority})"
    text = WAKE_REASONS.get(kind, kind)
    source = signal.get("sourceAgent")
    return f"{text}{f' from {source}' if source else ''} ({priority})"


class Narrator:
    """Turns a project's stored events, in order, into the lines a person follows a team by: who woke
    and why, each tool call with its key input, messages, waits, approvals, guard trips, nudges,
    submissions with the report's first lines, failures and model retries. `suzumio watch` and
    scripts/demo.py print its lines; it remembers what later events refer to (tool calls by id, the
    report each agent submitted)."""

    def __init__(self):
        self.calls = {}  # tool call id -> (agent, tool)
        self.reports = {}  # agent -> the report text of its last completion.submit call

    def lines(self, kind, data):
        """The lines for one stored event (`data`: its data, parsed); [] for events not narrated."""
        data = data if isinstance(data, dict) else {}
        agent = data.get("agentId") or "?"
        method = getattr(self, "_" + kind.replace(".", "_"), None)
        return method(data, agent) if method is not None else []

    def _activation_started(self, data, agent):
        reasons = [wake_reason(signal) for signal in data.get("signals") or [] if isinstance(signal, dict)]
        why = f": {', '.join(reasons)}" if reasons else ""
        return [f"▶ {agent} wakes up ({data.get('activationId')}){why}"]

    def _activation_completed(self, data, agent):
        quiet = " (no useful effect)" if data.get("usefulEffects") == 0 else ""
        return [f"■ {agent} done{quiet}"]

    def _activation_failed(self, data, agent):
        return [f"✗ {agent} failed: {one_line(data.get('error'), 200)}"]

    def _activation_cancelled(self, data, agent):
        return [f"■ {agent} cancelled: {one_line(data.get('reason'), 200)}"]

    def _tool_called(self, data, agent):
        tool = data.get("tool") or "?"
        self.calls[data.get("id")] = (agent, tool)
        tool_input = data.get("inputPreview")
        if tool == TOOL_SUBMIT and isinstance(tool_input, dict):
            self.reports[agent] = tool_input.get("report")
        detail = key_input(tool, tool_input)
        return [f"  {agent} → {tool}{' ' + detail if detail else ''}"]

    def _tool_failed(self, data, _agent):
        agent, tool = self.calls.get(data.get("id"), ("?", "a tool"))
        return [f"  ✗ {agent} {tool} failed: {one_line(data.get('error'), 200)}"]

    def _message_created(self, data, _agent):
        target = data.get("recipient") or data.get("channel")
        return [f"  ✉ {data.get('sender')} → {target}: {one_line(data.get('body'))}"]

    def _signal_created(self, data, _agent):
        kind, payload = data.get("kind"), data.get("payload") or {}
        if kind == KIND_WAIT:
            return [f"  ⏸ {data.get('sourceAgent')} waits: {one_line(payload.get('reason'))}"]
        if kind in NUDGE_KINDS:
            attempt = f" (attempt {payload['attempt']})" if payload.get("attempt") else ""
            return [f"  ↻ {data.get('targetAgent')} {WAKE_REASONS[kind]}{attempt}"]
        return []

    def _project_submitted(self, _data, agent):
        lines = [f"✓ {agent} submitted the final report"]
        report = [line for line in str(self.reports.pop(agent, "") or "").splitlines() if line.strip()]
        return lines + [f"    {one_line(line)}" for line in report[:REPORT_LINES]]

    def _project_status(self, data, _agent):
        status = data.get("status")
        return [] if status == "submitted" else [f"· project {status}"]

    def _approval_requested(self, data, agent):
        return [f"  ? {agent} asks to run {data.get('tool')}: approval {data.get('id')} pending"]

    def _approval_decided(self, data, agent):
        note = f": {one_line(data.get('note'))}" if data.get("note") else ""
        return [f"  ! approval {data.get('id')} of {agent} ({data.get('tool')}): {data.get('decision')} "
                f"by {data.get('decidedBy')}{note}"]

    def _approval_expired(self, data, agent):
        return [f"  ! approval {data.get('id')} of {agent} ({data.get('tool')}) expired: {data.get('decision')}"]

    def _approval_cancelled(self, data, agent):
        return [f"  ! approval {data.get('id')} of {agent} ({data.get('tool')}) cancelled"]

    def _approval_auto_allowed(self, data, agent):
        return [f"  ! {agent} {data.get('tool')} allowed by an allow-always grant"]

    def _guard_tripped(self, data, agent):
        return [f"⛔ {agent} paused: loop guard {data.get('rule')} tripped: {one_line(data.get('reason'), 200)}"]

    def _agent_resumed(self, data, agent):
        return [f"· {agent} resumed by {data.get('resumedBy')}"]

    def _model_retry(self, data, agent):
        delay = data.get("delayMs")
        wait = f", waiting {delay / 1000:.1f} s" if isinstance(delay, (int, float)) else ""
        return [f"  … {agent} model {data.get('presetId')} retry {data.get('retry')}/{data.get('maxRetries')}"
                f"{wait}: {one_line(data.get('reason'))}"]

    def _model_waiting(self, data, agent):
        reasons = {"concurrency": "all of its slots are busy", "rpm": "its requests per minute are used",
                   "tpm": "its tokens per minute are used", "paused": "it is paused"}
        why = reasons.get(data.get("reason"), data.get("reason"))
        return [f"  … {agent} waits for provider {data.get('providerId')}: {why} (position {data.get('position')})"]

    def _model_provider_paused(self, data, _agent):
        pause = data.get("pauseMs")
        length = f" for {pause / 1000:.1f} s" if isinstance(pause, (int, float)) else ""
        return [f"! provider {data.get('providerId')} answered {data.get('status')}: paused for every agent{length}"]

    def _project_budget_warning(self, data, _agent):
        return ["! budget warning: 80% of the project's budget is used"]

    def _project_budget_exceeded(self, data, _agent):
        return ["! budget reached: the project is stopped"]

    def _egress_denied(self, data, _agent):
        return [f"  ⛔ {data.get('agent')} egress refused: {one_line(data.get('reason'))}"]

    def _scheduler_hook_failed(self, data, _agent):
        return [f"! a toolpack hook failed: {one_line(data.get('error'))}"]

    def _replay_diverged(self, data, agent):
        return [f"! replay diverged at {agent} {data.get('activationId')}"]

    def _replay_ended(self, data, _agent):
        return [f"· replay ended: {data.get('status')}"]


class Printer:
    """Renders deltas and narrated events as lines: one header per model call, text as it comes, tool
    calls as `-> name(arguments)` once their name is known, and the Narrator's lines between them."""

    def __init__(self, out):
        self.out = out
        self.call = None
        self.tool_names = {}
        self.open_line = False
        self.narrator = Narrator()

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

    def event(self, kind, row):
        """One stored event (the raw row of the stream, its data as JSON text)."""
        lines = self.narrator.lines(kind, event_data(row))
        if lines:
            self._newline()
            self.call = None  # a model call's text after these lines gets its header again
            self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()


def event_data(row):
    """The data of a stored event row as the stream carries it (`data_json` is JSON text)."""
    try:
        data = json.loads(row.get("data_json") or "{}")
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


def follow(url, project, token, out, *, stop=None, limit=1, timeout=None, on_open=None):
    """Print the project's stream, narrated, from its newest `limit` stored events on; returns the type of
    the first event `stop(type)` is true for, or None when the stream ended. `timeout`: seconds a read may
    wait (WatchError after)."""
    printer = Printer(out)
    for kind, data in sse_stream(url, project, token, timeout=timeout, on_open=on_open, limit=limit):
        if kind == DELTA_EVENT:
            printer.delta(data)
            continue
        printer.event(kind, data)
        if stop is not None and stop(kind):
            return kind
    return None


def watch(url, project, token, out, once=False):
    """Print the project's live stream until it ends (or, with `once`, an activation ends)."""

    def opened():
        out.write(f"watching {project} at {url} (Ctrl-C to stop)\n")
        out.flush()

    follow(url, project, token, out, stop=(lambda kind: kind in END_EVENTS) if once else None, on_open=opened)
    return 0
