"""Pure records of the durable store (docs/design/store.md): status constants and their allowed
transitions, signal kinds, timestamps and ids, the JSON shapes of stored rows, signal rendering,
useful-effect defaults and nudge texts, priority checks, the running-activation check, token-budget and
truncation helpers. No I/O and no sqlite3."""
import collections
import json
import math
import os
import threading
from datetime import UTC, datetime

from suzumio_errors import BadRequest, Conflict

# ---------------------------------------------------------------------------------------------
# Status constants and the transitions the system performs (docs/design/store.md).

PROJECT_INITIALIZED = "initialized"
PROJECT_RUNNING = "running"
PROJECT_SUBMITTED = "submitted"
PROJECT_COMPLETED = "completed"
PROJECT_STOPPED = "stopped"
PROJECT_FAILED = "failed"
PROJECT_STATUSES = (PROJECT_INITIALIZED, PROJECT_RUNNING, PROJECT_SUBMITTED, PROJECT_COMPLETED,
                    PROJECT_STOPPED, PROJECT_FAILED)

AGENT_QUIET = "quiet"
AGENT_READY = "ready"
AGENT_RUNNING = "running"
AGENT_FAILED = "failed"
AGENT_STOPPED = "stopped"
AGENT_STATUSES = (AGENT_QUIET, AGENT_READY, AGENT_RUNNING, AGENT_FAILED, AGENT_STOPPED)

ACT_RUNNING = "running"
ACT_COMPLETED = "completed"
ACT_FAILED = "failed"
ACT_CANCELLED = "cancelled"
ACTIVATION_STATUSES = (ACT_RUNNING, ACT_COMPLETED, ACT_FAILED, ACT_CANCELLED)

SIGNAL_PENDING = "pending"
SIGNAL_DELIVERED = "delivered"
SIGNAL_CLOSED = "closed"
SIGNAL_STATUSES = (SIGNAL_PENDING, SIGNAL_DELIVERED, SIGNAL_CLOSED)
RECORDABLE_SIGNAL_STATUSES = (SIGNAL_PENDING, SIGNAL_CLOSED)  # the statuses a new signal may be given

TOOL_RUNNING = "running"
TOOL_COMPLETED = "completed"
TOOL_FAILED = "failed"
TOOL_CALL_STATUSES = (TOOL_RUNNING, TOOL_COMPLETED, TOOL_FAILED)
TOOL_CALL_END_STATUSES = (TOOL_COMPLETED, TOOL_FAILED)
# why a call on an activation that is no longer running is refused: `Activation <id> is <status>; <why>`
TOOL_CALLS_CLOSED = "no more tool calls are accepted"

# The effect ledger (suzumio_effects): an external tool call is intended before it runs, done or failed
# after; a call its runner, the controller or the node lost in between is in doubt until a person says.
EFFECT_INTENDED = "intended"
EFFECT_DONE = "done"
EFFECT_FAILED = "failed"
EFFECT_IN_DOUBT = "in_doubt"
EFFECT_STATES = (EFFECT_INTENDED, EFFECT_DONE, EFFECT_FAILED, EFFECT_IN_DOUBT)
RESOLVED_DONE = "done"
RESOLVED_NOT_DONE = "not_done"
EFFECT_RESOLUTIONS = (RESOLVED_DONE, RESOLVED_NOT_DONE)
HISTORY_CLOSED = "history updates are not accepted"

PRIORITIES = ("P0", "P1", "P2", "P3")
DEFAULT_PRIORITY = "P3"
HISTORY_ROLES = ("user", "assistant", "tool_call", "tool_result", "compaction")

# Project status writes: operation -> (statuses it may start from, resulting status). Start, stop and
# approve work from any status (docs/design/store.md); the store does not refuse other writes either.
PROJECT_TRANSITIONS = {
    "start": (PROJECT_STATUSES, PROJECT_RUNNING),
    "stop": (PROJECT_STATUSES, PROJECT_STOPPED),
    "approve": (PROJECT_STATUSES, PROJECT_COMPLETED),
    "submit": (PROJECT_STATUSES, PROJECT_SUBMITTED),
    "request_changes": (PROJECT_STATUSES, PROJECT_RUNNING),
    "budget_exceeded": ((PROJECT_RUNNING,), PROJECT_STOPPED),
}

# Agent status writes: trigger -> (statuses it may start from, resulting status) (docs/design/store.md).
AGENT_TRANSITIONS = {
    "activation_created": ((AGENT_QUIET, AGENT_FAILED, AGENT_READY), AGENT_RUNNING),
    "container_attached": ((AGENT_RUNNING,), AGENT_RUNNING),
    "activation_completed": ((AGENT_RUNNING,), AGENT_QUIET),
    "activation_cancelled": ((AGENT_RUNNING,), AGENT_QUIET),
    "activation_failed": ((AGENT_RUNNING,), AGENT_FAILED),
    # stale binding resolves to quiet, or failed when the bound activation failed (docs/design/scheduler.md)
    "stale_binding": ((AGENT_QUIET, AGENT_READY, AGENT_RUNNING, AGENT_FAILED), None),
    "idle_reset": ((AGENT_READY, AGENT_RUNNING), AGENT_QUIET),
}

# Activation status writes: trigger -> (statuses it may start from, resulting status).
ACTIVATION_TRANSITIONS = {
    "complete": ((ACT_RUNNING,), ACT_COMPLETED),
    "fail": ((ACT_RUNNING,), ACT_FAILED),
    "cancel": ((ACT_RUNNING,), ACT_CANCELLED),
}

# Effect state writes: trigger -> (states it may start from, resulting state).
EFFECT_TRANSITIONS = {
    "done": ((EFFECT_INTENDED,), EFFECT_DONE),
    "failed": ((EFFECT_INTENDED,), EFFECT_FAILED),
    "doubt": ((EFFECT_INTENDED,), EFFECT_IN_DOUBT),
    "resolve_done": ((EFFECT_IN_DOUBT,), EFFECT_DONE),
    "resolve_not_done": ((EFFECT_IN_DOUBT,), EFFECT_FAILED),
}

# Signals only ever move pending -> delivered; tool calls may be finished again (docs/design/tools.md).
SIGNAL_TRANSITIONS = {"deliver": ((SIGNAL_PENDING,), SIGNAL_DELIVERED)}
TOOL_CALL_TRANSITIONS = {
    "complete": (TOOL_CALL_STATUSES, TOOL_COMPLETED),
    "fail": (TOOL_CALL_STATUSES, TOOL_FAILED),
}

KIND_MESSAGE = "message.created"
KIND_NO_EFFECT_NUDGE = "scheduler.no_effect_nudge"
KIND_FAILED_NUDGE = "scheduler.failed_nudge"
KIND_ALL_QUIET_NUDGE = "scheduler.all_quiet_nudge"
KIND_RESUME_AFTER_STOP = "scheduler.resume_after_stop"
KIND_SUBMITTED = "completion.submitted"
KIND_WAIT = "coordination.wait_for_signal"
KIND_BUDGET_EXCEEDED = "project.budget_exceeded"
KIND_BUDGET_WARNING = "project.budget_warning"  # 80% of maxTokens or maxCostUsd used
KIND_MODEL_RETRY = "model.retry"  # The model proxy retried a request (429, 5xx, connection)
KIND_MODEL_WAITING = "model.waiting"  # A model call waits at its provider's gate (limits, a pause)
KIND_PROVIDER_PAUSED = "model.provider_paused"  # A 429 or 503 with Retry-After paused a provider
KIND_EFFECT_IN_DOUBT = "effect.in_doubt"  # an external call of the agent may or may not have happened
KIND_EFFECT_RESOLVED = "effect.resolved"  # a person said whether it happened
EVENT_HOOK_FAILED = "scheduler.hook_failed"
BUDGET_SENDER = "scheduler"
TOOL_WAIT = "coordination.wait_for_signal"
TOOL_SUBMIT = "completion.submit"
ENDING_TOOLS = (TOOL_WAIT, TOOL_SUBMIT)
_USEFUL_WHEN_CLOSED = (KIND_MESSAGE, KIND_SUBMITTED, KIND_WAIT)
_NEVER_USEFUL = (KIND_NO_EFFECT_NUDGE, KIND_FAILED_NUDGE)
# The scheduler's own wake-ups: an agent woken only by these has heard nothing new (docs/operations.md#runaways).
NUDGE_KINDS = (KIND_NO_EFFECT_NUDGE, KIND_FAILED_NUDGE, KIND_ALL_QUIET_NUDGE)

STOP_REASON = "Project stopped"
APPROVE_REASON = "Project approved"
BOUNDARY_LIMIT = 20
WAIT_PREFIX = "Waiting for future signals."
RESUME_AFTER_STOP_MESSAGE = ("Your previous activation was cancelled because the project was stopped. "
                             "Resume the interrupted work from your history.")
BOUNDARY_HEADING = "# New P1 Signals Delivered At Tool Boundary"
BOUNDARY_INTRO = ("These P1 signals arrived while you were working. They are new instructions that "
                  "follow the tool result above; take them into account before you continue.")
_NUDGE_FALLBACKS = {
    KIND_NO_EFFECT_NUDGE: "Your previous activation ended without an externally visible effect. "
                          "Report results or a blocker with messages_send before ending.",
    KIND_FAILED_NUDGE: "Your previous activation failed. Retry from the existing history and workspace.",
    KIND_ALL_QUIET_NUDGE: "All agents are quiet and there are no pending work signals. "
                          "Rehydrate the work with targeted messages.",
    KIND_RESUME_AFTER_STOP: RESUME_AFTER_STOP_MESSAGE,
}
DEFAULT_CHANNELS = ("#project", "#blocked")
DEFAULT_COORDINATOR = "pm"


# ---------------------------------------------------------------------------------------------
# Timestamps and ids: the one set of clock helpers every controller module uses.

def utc_now():
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


def format_ts(dt):
    """UTC ISO-8601 with exactly three fractional digits and Z (docs/design/store.md)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_ts(text):
    """Parse a stored timestamp (or any ISO-8601 text) into an aware UTC datetime."""
    dt = datetime.fromisoformat(str(text))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def now_ts():
    """The current time as a stored timestamp."""
    return format_ts(utc_now())


def to_datetime(now=None):
    """An injected clock value (None, datetime or ISO text) as an aware UTC datetime."""
    if now is None:
        return utc_now()
    if isinstance(now, datetime):
        return now if now.tzinfo else now.replace(tzinfo=UTC)
    return parse_ts(now)


# The random parts this process gave out in its latest milliseconds. One transaction stamps all its rows
# with one time, so 32 random bits alone would collide: 4,700 events in one write about once in 400.
_ISSUED = collections.OrderedDict()  # epoch millis -> random parts given out in it
_ISSUED_MILLIS = 64
_ISSUED_LOCK = threading.Lock()


def new_id(prefix, now=None):
    """`<prefix>_<epochMillis>_<hex8>` (docs/design/store.md); never the same twice in one process."""
    millis = int(to_datetime(now).timestamp() * 1000)
    with _ISSUED_LOCK:
        issued = _ISSUED.get(millis)
        if issued is None:
            issued = _ISSUED[millis] = set()
            if len(_ISSUED) > _ISSUED_MILLIS:
                _ISSUED.popitem(last=False)
        part = os.urandom(4).hex()
        while part in issued:
            part = os.urandom(4).hex()
        issued.add(part)
    return f"{prefix}_{millis}_{part}"


# ---------------------------------------------------------------------------------------------
# JSON columns, truncation, token usage.

def dump_json(value):
    """Compact JSON as stored in *_json columns (docs/cli.md)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def load_json(text, default=None):
    """A *_json column's value; `default` when it is NULL or not JSON."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def usage_tokens(usage):
    """Tokens of one activation's stored usage: `tokens.total`, else input + output (docs/design/runner.md)."""
    tokens = usage.get("tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, dict):
        return 0

    def count(value):
        valid = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return int(value) if valid and value >= 0 else None

    total = count(tokens.get("total"))
    if total is not None:
        return total
    return (count(tokens.get("input")) or 0) + (count(tokens.get("output")) or 0)


def budget_message(project, max_tokens, used_tokens):
    """The P2 message to the user when a project's token budget is used up."""
    return (f"Token budget reached for project {project}: {used_tokens} tokens used since it was last started "
            f"(backend.runner.budget.maxTokens: {max_tokens}). The project is paused: running activations "
            f"finish, no new ones start. Run `suzumio start {project}` to resume with a fresh budget.")


def omit_none(mapping):
    """The mapping without its None values (optional fields are omitted, not null)."""
    return {k: v for k, v in mapping.items() if v is not None}


def truncate(text, limit):
    """docs/http-api.md: the text, or its first `limit` chars plus a truncation note."""
    if text is None or len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n\n[truncated {len(text) - limit} chars]"


def shrink(value, limit):
    """docs/http-api.md size reduction of event payloads."""
    if isinstance(value, str):
        return truncate(value, limit)
    if isinstance(value, list):
        return [shrink(item, limit) for item in value[:20]]
    if isinstance(value, dict):
        return {k: shrink(v, 4000 if k in ("output", "body", "error") else 1000)
                for k, v in list(value.items())[:40]}
    return value


PREVIEW_CHARS = 200
PREVIEW_ITEMS = 10


def preview(value, depth=0):
    """A small copy of a tool input for its `tool.called` event (what `suzumio watch` narrates): strings
    cut at PREVIEW_CHARS characters (ending `…`), lists and objects at PREVIEW_ITEMS entries, three levels."""
    if isinstance(value, str):
        return value if len(value) <= PREVIEW_CHARS else value[:PREVIEW_CHARS - 1] + "…"
    if depth >= 3 and isinstance(value, (list, dict)):
        return "…"
    if isinstance(value, list):
        return [preview(item, depth + 1) for item in value[:PREVIEW_ITEMS]]
    if isinstance(value, dict):
        return {key: preview(item, depth + 1) for key, item in list(value.items())[:PREVIEW_ITEMS]}
    return value


def waking_signal(signal):
    """What an `activation.started` event says of one signal that woke it: id, kind, priority, the
    source agent, and for a message its sender and id."""
    payload = signal.get("payload") if isinstance(signal.get("payload"), dict) else {}
    message = signal["kind"] == KIND_MESSAGE
    return omit_none({"id": signal["id"], "kind": signal["kind"], "priority": signal["priority"],
                      "sourceAgent": signal.get("sourceAgent"), "sender": payload.get("sender") if message else None,
                      "messageId": payload.get("id") if message else None})


# ---------------------------------------------------------------------------------------------
# Priorities and project names.

def describe(value):
    """docs/design/tools.md `<value>`: strings as-is, anything else as JSON text (2, not 2.0)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, ensure_ascii=False)


def is_valid_priority(value):
    """Whether value is one of P0–P3."""
    return isinstance(value, str) and value in PRIORITIES


def checked_priority(value):
    """The priority, P3 when absent; BadRequest `Invalid priority: <value>` otherwise."""
    if value is None or value == "":
        return DEFAULT_PRIORITY
    if not is_valid_priority(value):
        raise BadRequest(f"Invalid priority: {describe(value)}")
    return value


def valid_project_name(name):
    """The path-segment rule of docs/configuration.md."""
    return (isinstance(name, str) and name not in ("", ".", "..")
            and not any(c in name for c in ("/", "\\", "\0")))


# ---------------------------------------------------------------------------------------------
# Row -> JSON shapes (camelCase, optional fields omitted).

def message_json(row):
    """Message JSON (docs/design/store.md)."""
    return omit_none({"id": row["id"], "project": row["project"], "sender": row["sender"],
                      "recipient": row["recipient"], "channel": row["channel"],
                      "priority": row["priority"], "body": row["body"], "createdAt": row["created_at"]})


def signal_json(row):
    """Signal JSON (docs/design/store.md); notBefore only when it differs from createdAt."""
    data = {"id": row["id"], "project": row["project"], "kind": row["kind"],
            "sourceAgent": row["source_agent"], "sourceActivation": row["source_activation"],
            "targetAgent": row["target_agent"], "targetChannel": row["target_channel"],
            "priority": row["priority"], "payload": load_json(row["payload_json"], {}),
            "status": row["status"], "usefulEffect": bool(row["useful_effect"]),
            "createdAt": row["created_at"],
            "notBefore": row["not_before"] if row["not_before"] != row["created_at"] else None,
            "deliveredAt": row["delivered_at"], "deliveredActivationId": row["delivered_activation_id"]}
    return omit_none(data)


def agent_json(row, include_token=False):
    """The full agent record; the token only when asked for."""
    data = {"id": row["id"], "project": row["project"], "role": row["role"],
            "displayName": row["display_name"], "status": row["status"], "prompt": row["prompt"],
            "model": row["model"], "tools": load_json(row["tools_json"], []),
            "workspacePath": row["workspace_path"], "activeActivationId": row["active_activation_id"],
            "containerName": row["container_name"], "createdAt": row["created_at"],
            "updatedAt": row["updated_at"], "promptChars": len(row["prompt"] or ""),
            "paused": load_json(row["paused_json"])}
    if include_token:
        data["token"] = row["token"]
    return omit_none(data)


def public_agent_json(row):
    """docs/http-api.md public agent: no token, no prompt, plus promptChars."""
    data = agent_json(row)
    data.pop("prompt", None)
    return data


def activation_json(row):
    """The full activation record (prompt, paths, usage) for the controller's own use."""
    return omit_none({
        "id": row["id"], "project": row["project"], "agentId": row["agent_id"], "status": row["status"],
        "prompt": row["prompt"], "inputPath": row["input_path"], "outputPath": row["output_path"],
        "containerName": row["container_name"], "node": row["node"], "startedAt": row["started_at"],
        "completedAt": row["completed_at"], "text": row["text"], "error": row["error"],
        "emittedMessages": row["emitted_messages"], "usage": load_json(row["usage_json"]),
        "hasContext": row["context_json"] is not None, "commitStart": row["commit_start"],
        "commitEnd": row["commit_end"]})


def public_activation_json(row):
    """docs/http-api.md public activation."""
    return omit_none({
        "id": row["id"], "project": row["project"], "agentId": row["agent_id"], "status": row["status"],
        "containerName": row["container_name"], "node": row["node"], "startedAt": row["started_at"],
        "completedAt": row["completed_at"], "text": truncate(row["text"], 8000),
        "error": truncate(row["error"], 8000), "emittedMessages": row["emitted_messages"],
        "usageJson": truncate(row["usage_json"], 4000), "hasContext": row["context_json"] is not None,
        "commitStart": row["commit_start"], "commitEnd": row["commit_end"]})


def tool_call_row_json(row):
    """docs/http-api.md raw tool-call row."""
    data = {"id": row["id"], "project": row["project"], "activation_id": row["activation_id"],
            "agent_id": row["agent_id"], "tool": row["tool"], "input_json": truncate(row["input_json"], 8000),
            "status": row["status"], "output": truncate(row["output"], 8000),
            "error": truncate(row["error"], 8000), "created_at": row["created_at"]}
    data = omit_none(data)
    data["completed_at"] = row["completed_at"]
    return data


def event_row_json(row):
    """An event row as stored (snake_case, data still JSON text)."""
    return {"id": row["id"], "project": row["project"], "type": row["type"],
            "data_json": row["data_json"], "created_at": row["created_at"]}


def part_json(row, limit=None):
    """One history part; its text, output and error truncated to `limit` when given."""
    cut = (lambda v: truncate(v, limit)) if limit else (lambda v: v)
    return omit_none({
        "id": row["id"], "project": row["project"], "agentId": row["agent_id"],
        "messageId": row["message_id"], "activationId": row["activation_id"],
        "partIndex": row["part_index"], "type": row["type"], "text": cut(row["text"]),
        "toolCallId": row["tool_call_id"], "toolName": row["tool_name"], "inputJson": row["input_json"],
        "output": cut(row["output"]), "error": cut(row["error"]),
        "metadata": load_json(row["metadata_json"], {}), "createdAt": row["created_at"]})


def history_json(row, parts, content_limit=None, part_limit=None):
    """One history message with its parts (docs/design/store.md)."""
    return omit_none({
        "id": row["id"], "project": row["project"], "agentId": row["agent_id"],
        "activationId": row["activation_id"], "role": row["role"], "kind": row["kind"],
        "content": truncate(row["content"], content_limit) if content_limit else row["content"],
        "sequence": row["sequence"], "compactionId": row["compaction_id"],
        "archived": row["compaction_id"] is not None, "metadata": load_json(row["metadata_json"], {}),
        "createdAt": row["created_at"], "parts": [part_json(p, part_limit) for p in parts]})


def compaction_json(row):
    """One history compaction record (docs/design/store.md)."""
    return omit_none({
        "id": row["id"], "project": row["project"], "agentId": row["agent_id"],
        "activationId": row["activation_id"], "summaryMessageId": row["summary_message_id"],
        "archivePath": row["archive_path"], "startSequence": row["start_sequence"],
        "endSequence": row["end_sequence"], "archivedMessageCount": row["archived_message_count"],
        "rawChars": row["raw_chars"], "summary": row["summary"], "reason": row["reason"],
        "selectedModel": row["selected_model"], "createdAt": row["created_at"]})


def project_row_json(row):
    """The project row without config_json (docs/design/store.md)."""
    return {"id": row["id"], "name": row["name"], "status": row["status"], "task": row["task"],
            "submitted_report": row["submitted_report"], "created_at": row["created_at"],
            "updated_at": row["updated_at"]}


# ---------------------------------------------------------------------------------------------
# Signal rendering (docs/design/scheduler.md), shared by activation prompts and tool-boundary delivery.

def render_signal(signal):
    """Render one Signal JSON as the paragraph the model reads. Plain words: a model took a dotted signal kind
    for a tool to call, and copied Markdown headings and id lines into what it wrote."""
    kind = signal.get("kind", "")
    payload = signal.get("payload") if isinstance(signal.get("payload"), dict) else {}
    priority = payload.get("priority") or signal.get("priority")
    urgency = f" ({priority})" if priority and priority != "P3" else ""
    if kind == KIND_MESSAGE:
        sender = payload.get("sender") or "unknown"
        channel = payload.get("channel") or signal.get("targetChannel")
        who = "The user" if sender == "user" else sender
        where = f" in {channel}" if channel and not payload.get("recipient") else ""
        return f"{who} says{where}{urgency}: {str(payload.get('body') or '').strip()}"
    if kind in (KIND_EFFECT_IN_DOUBT, KIND_EFFECT_RESOLVED):
        title = "A call that may have happened" if kind == KIND_EFFECT_IN_DOUBT else "A call in doubt, resolved"
        return f"{title} ({signal.get('id')}){urgency}: {effect_notice(kind, payload)}"
    if kind in _NUDGE_FALLBACKS:
        message = payload.get("message")
        text = message if isinstance(message, str) and message.strip() else _NUDGE_FALLBACKS[kind]
        return f"Reminder from the scheduler{urgency}: {text}"
    return (f'Signal {signal.get("id")} of kind "{kind}"{urgency}, {signal.get("createdAt")}: '
            + json.dumps(payload, ensure_ascii=False))


def effect_notice(kind, payload):
    """What the agent reads about one of its external calls that is in doubt, or that a person resolved."""
    call = (f"Tool call {payload.get('toolCallId')} ({payload.get('tool')}, effect {payload.get('effect')}, "
            f"call key {payload.get('callKey')}, started {payload.get('startedAt')}, activation "
            f"{payload.get('activationId')})")
    given = json.dumps(payload.get("input"), indent=2, ensure_ascii=False)
    if kind == KIND_EFFECT_IN_DOUBT:
        return (f"{call} is in doubt: it started and never reported back ({payload.get('why')}). It may or may "
                "not have had its effect outside, and Suzumio will not run it again. Before you act again, check "
                "whether it happened (the call key is its Idempotency-Key and its SUZUMIO_CALL_KEY). "
                f"Its input was:\n\n{given}")
    said = "it did happen" if payload.get("resolution") == RESOLVED_DONE else "it did not happen"
    note = f" Note: {payload['note']}" if payload.get("note") else ""
    return f"{call}, which was in doubt, was resolved by a person: {said}.{note} Its input was:\n\n{given}"


def render_boundary_text(signals):
    """docs/design/scheduler.md: the text appended to a tool result for P1 signals."""
    return "\n\n".join([BOUNDARY_HEADING, BOUNDARY_INTRO] + [render_signal(s) for s in signals])


def default_useful_effect(kind, status):
    """docs/design/store.md defaults when usefulEffect is not given."""
    if kind in _NEVER_USEFUL:
        return False
    if status == SIGNAL_PENDING:
        return True
    return kind in _USEFUL_WHEN_CLOSED


def no_effect_message(has_tool):
    """The no-effect nudge text (docs/design/scheduler.md), naming only the tools the agent has:
    `has_tool(name)` says whether its allowlist holds a tool. A small model told of a tool it lacks
    calls it, and is refused, again and again."""
    ways = []
    if has_tool("messages.send"):
        ways.append("send what you made (its result, or the path of its file) or what blocks you with messages_send")
    if has_tool("completion.submit"):
        ways.append("submit the final report with completion_submit")
    text = "Your previous activation ended with nothing anyone can see. Do the work you were given with your tools"
    if ways:
        text += ", then " + ", or ".join(ways)
    if has_tool("coordination.wait_for_signal") and has_tool("messages.send"):
        text += ". Call coordination_wait_for_signal only after you have reported"
    return text + "."


def is_news(signal, agent_id):
    """Whether a signal delivered to `agent_id` brings something new: anything but the scheduler's nudges and
    the agent's own signals (docs/operations.md#runaways)."""
    return signal["kind"] not in NUDGE_KINDS and signal.get("sourceAgent") != agent_id


def nudge_attempt(payload):
    """The attempt number a nudge signal's payload carries; 1 when it is missing or not a positive integer."""
    attempt = (payload or {}).get("attempt")
    return attempt if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0 else 1


def history_part_type(role):
    """The part type a history row of this role gets when no parts are given."""
    return role if role in ("tool_call", "tool_result", "compaction") else "text"


def require_running(row, purpose):
    """Conflict unless the activation row is running; `purpose` ("tool" or "history") names what its end
    closed."""
    if row["status"] != ACT_RUNNING:
        why = HISTORY_CLOSED if purpose == "history" else TOOL_CALLS_CLOSED
        raise Conflict(f"Activation {row['id']} is {row['status']}; {why}")
