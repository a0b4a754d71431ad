"""Approval gates: which tool calls wait for a person (the `approve` rules of the config), the durable
request and decision rows of the `approvals` table, expiry, `allow-always` grants, what a waiting runner
is told, and the check that a controller-side call was allowed."""
import json
import logging
import re
import time
from datetime import timedelta

import suzumio_coordination as coordination
import suzumio_effects
import suzumio_repository
from suzumio_errors import BadRequest, Conflict, NotFound
from suzumio_records import dump_json, format_ts, load_json, omit_none, to_datetime, utc_now

log = logging.getLogger(__name__)

PENDING, ALLOWED, DENIED, EXPIRED, CANCELLED = "pending", "allowed", "denied", "expired", "cancelled"
RESPONDED = "responded"
APPROVAL_STATUSES = (PENDING, ALLOWED, DENIED, EXPIRED, CANCELLED, RESPONDED)
ALLOW, DENY, ALLOW_ALWAYS, RESPOND = "allow", "deny", "allow-always", "respond"
DECISIONS = (ALLOW, DENY, ALLOW_ALWAYS, RESPOND)
# The one transition table: a request leaves `pending` exactly once, by a decision, expiry or the end of
# its activation (suzumio_coordination.cancel_activation, fail_activation); the status a decision leads to.
DECISION_STATUS = {ALLOW: ALLOWED, ALLOW_ALWAYS: ALLOWED, DENY: DENIED, RESPOND: RESPONDED}
# Who decided: the surface of a person, `timeout` for expiry, `system` for an activation that ended.
DECIDERS = ("api", "cli", "webui", "mcp")
MAX_NOTE_CHARS = 4000
MAX_OUTPUT_CHARS = 100000  # a person's answer to a call: what a tool result may hold
EDITED_NOTE = "A person changed this call's input before it ran; it ran with: {input}"
MAX_WAIT_S = 25.0  # longest one runner long-poll is held open; the runner asks again
MAX_LONG_POLLS = 8  # runner long-polls held at once per runner listener; more are answered at once
RETRY_AFTER_MS = 1000  # how long a runner answered at once waits before it asks again
POLL_S = 0.5  # a decision made by another process (the CLI beside `serve`) is seen within this
LIST_LIMIT = 200


# ---------------------------------------------------------------- rules

def _field_text(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def rule_matches(rule, tool, tool_input):
    """A rule matches a call when its tool pattern does (`*`, exact, `x.*`) and every `match` pattern is
    found (re.search) in the input field of that name; a missing field never matches."""
    if not (rule.tool == "*" or rule.tool == tool or (rule.tool.endswith(".*") and tool.startswith(rule.tool[:-1]))):
        return False
    fields = tool_input if isinstance(tool_input, dict) else {}
    for name, pattern in rule.match.items():
        if name not in fields or fields[name] is None:
            return False
        if re.search(pattern, _field_text(fields[name])) is None:
            return False
    return True


def matching_rule(config, agent_id, tool, tool_input):
    """The first of the agent's rules (its own, then the project's) that matches the call, or None."""
    for rule in config.approval_rules(agent_id):
        if rule_matches(rule, tool, tool_input):
            return rule
    return None


# ---------------------------------------------------------------- rows

def approval_json(row):
    """The public shape of one approval request (http-api, CLI --json, WebUI, MCP)."""
    return omit_none({
        "id": row["id"], "agentId": row["agent_id"], "activationId": row["activation_id"],
        "toolCallId": row["tool_call_id"], "tool": row["tool"], "input": load_json(row["input_json"], {}),
        "rule": load_json(row["rule_json"], {}), "status": row["status"], "decision": row["decision"],
        "decidedBy": row["decided_by"], "note": row["note"], "onExpiry": row["on_expiry"],
        "expiresAt": row["expires_at"], "createdAt": row["created_at"], "decidedAt": row["decided_at"],
        "usedAt": row["used_at"], "editedInput": load_json(row["edited_input_json"]), "output": row["output"]})


def _row(store, approval_id):
    row = store.approval_row(approval_id)
    if row is None:
        raise NotFound(f"Unknown approval: {approval_id}")
    return row


def with_preview(store, item):
    """A pending `repo.merge` request shows the change it would queue (docs/teams-that-write-code.md)."""
    if item["tool"] == "repo.merge" and item["status"] == "pending":
        diff = suzumio_repository.pending_change(store, item["agentId"])
        if diff is not None:
            item["preview"] = {"diff": diff}
    return item


def approval(store, approval_id):
    return with_preview(store, approval_json(_row(store, approval_id)))


def list_approvals(store, status=None, limit=LIST_LIMIT, now=None):
    """Pending requests first (oldest first), then decided ones (newest first); expiry applied first."""
    expire_due(store, now)
    if status is not None and status not in APPROVAL_STATUSES:
        raise BadRequest(f"Invalid approval status: {status} (expected one of {', '.join(APPROVAL_STATUSES)})")
    return [with_preview(store, approval_json(r)) for r in store.approval_rows(status, limit)]


def has_grant(store, agent_id, rule_key):
    """The id of an `allow-always` decision for this agent and rule, or None."""
    return store.approval_grant(agent_id, rule_key)


# ---------------------------------------------------------------- the runner's side

def start_tool_call(store, config, agent_id, activation_id, tool, tool_input, now=None, call_key=None,
                    model_call_id=None):
    """`/runner/tool-calls/start` with the gate: the running tool call row and, when a rule matches and
    no `allow-always` covers it, a pending approval request, in one transaction. The answer carries
    `approval` (id, status, expiresAt) when the runner must wait for a decision. Asked again with the
    same `call_key` (the runner lost the answer), it answers the call and request recorded then, in
    their current status, and records nothing (docs/spec-notes.md#repeats-are-answered-not-redone)."""
    rule = matching_rule(config, agent_id, tool, tool_input)
    with store.write(now) as tx:
        started = store.start_tool_call(agent_id, activation_id, tool, tool_input, call_key=call_key,
                                        model_call_id=model_call_id)
        if started.pop("replayed", False):
            return _replayed_start(store, tx, started)
        grant = has_grant(store, agent_id, rule.key) if rule is not None else None
        if rule is None or grant is not None:
            # It runs now: an external one is intended in the same transaction (a gated one once allowed).
            suzumio_effects.intend(store, config, agent_id, activation_id, started["toolCallId"], tool, tool_input,
                                   call_key)
        if rule is None:
            return started
        if grant is not None:
            store.append_event("approval.auto_allowed", {"toolCallId": started["toolCallId"], "agentId": agent_id,
                                                          "activationId": activation_id, "tool": tool,
                                                          "grantId": grant})
            return started
        expires = format_ts(tx.now + timedelta(milliseconds=rule.timeout_ms))
        approval_id = store.insert_approval(tx, agent_id, activation_id, started["toolCallId"], tool, tool_input,
                                            rule, rule.on_expiry, expires)
        store.append_event("approval.requested", {"id": approval_id, "agentId": agent_id,
                                                  "activationId": activation_id, "toolCallId": started["toolCallId"],
                                                  "tool": tool, "expiresAt": expires})
    log.info("approval %s requested: %s/%s %s", approval_id, store.project_id, agent_id, tool)
    return {**started, "approval": {"id": approval_id, "status": PENDING, "expiresAt": expires}}


def _replayed_start(store, tx, started):
    row = store.approval_of_call(tx, started["toolCallId"])
    if row is None:  # the call was not gated, or an allow-always grant covered it
        return started
    return {**started, "approval": {"id": row["id"], "status": row["status"], "expiresAt": row["expires_at"]}}


def outcome_text(row):
    """The tool result a model sees for a call that did not run."""
    tool = row["tool"]
    if row["status"] == DENIED:
        who = f" (via {row['decided_by']})" if row["decided_by"] else ""
        reason = f" Reason: {row['note']}" if row["note"] else " No reason was given."
        return f"Tool call {tool} was denied by a person{who}; the tool did not run.{reason}"
    if row["status"] == EXPIRED:
        return (f"Tool call {tool} was not approved before its approval request {row['id']} expired "
                f"({row['expires_at']}); it was denied and the tool did not run.")
    return f"Tool call {tool} did not run: its approval request {row['id']} was cancelled ({row['note'] or ''})."


def runs(row):
    """Whether the decision lets the call run."""
    return row["status"] in (ALLOWED, EXPIRED) and row["decision"] in (ALLOW, ALLOW_ALWAYS)


def _settle_for_runner(store, row, config=None, now=None):
    """The wait answer for a decided request: with `input` (and the note the model reads) when a person
    edited it. A call that runs is intended in the effect ledger before the runner hears so (once: the
    answer asked again records nothing), with the input it runs with. A call that does not run is finished
    here, once: failed with the decision's text, or, when a person answered it, completed with their answer
    (P1 signals are delivered at this boundary)."""
    answer = omit_none({"approvalId": row["id"], "status": row["status"], "decision": row["decision"],
                        "note": row["note"], "decidedBy": row["decided_by"], "run": runs(row)})
    if answer["run"]:
        edited = load_json(row["edited_input_json"])
        if edited is not None:
            answer.update(input=edited, inputNote=EDITED_NOTE.format(input=dump_json(edited)))
        call = store.tool_call(row["tool_call_id"])
        suzumio_effects.intend(store, config, row["agent_id"], row["activation_id"], row["tool_call_id"], row["tool"],
                               load_json(row["input_json"], {}) if edited is None else edited, call["call_key"],
                               now)
        return answer
    if row["status"] == CANCELLED:
        return answer
    responded = row["status"] == RESPONDED
    text = row["output"] if responded else outcome_text(row)
    answer["output"] = text
    with store.write(now) as tx:
        if store.use_approval(tx, row["id"]):
            finished = coordination.finish_tool_call(
                store, row["agent_id"], row["activation_id"], row["tool_call_id"],
                "completed" if responded else "failed", output=text if responded else None,
                error=None if responded else text, boundary=True)
            if finished.get("signalText"):
                answer["signalText"] = finished["signalText"]
    return answer


def wait_for_decision(store, changes, agent_id, activation_id, approval_id, wait_s, clock=utc_now, config=None):
    """The runner's long-poll: the decision as soon as there is one (or expiry applies), else after
    `wait_s` seconds (at most MAX_WAIT_S) `{"status": "pending"}`. Wakes on this process's commits and
    polls every POLL_S for other processes' (the CLI)."""
    deadline = time.monotonic() + max(0.0, min(float(wait_s), MAX_WAIT_S))
    while True:
        expire_due(store, clock())
        row = _row(store, approval_id)
        if row["agent_id"] != agent_id or row["activation_id"] != activation_id:
            raise NotFound(f"Unknown approval for activation: {approval_id}")
        if row["status"] != PENDING:
            return _settle_for_runner(store, row, config)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return {"approvalId": approval_id, "status": PENDING, "expiresAt": row["expires_at"]}
        seen = changes.version(store.project_id) if changes is not None else 0
        until_expiry = (to_datetime(row["expires_at"]) - clock()).total_seconds()
        pause = max(0.01, min(POLL_S, remaining, until_expiry + 0.01))
        if changes is not None:
            changes.wait(store.project_id, seen, pause)
        else:
            time.sleep(pause)


def claim_controller_call(store, config, agent_id, activation_id, tool, tool_input, now=None):
    """Before a controller-side run (`/toolpacks/:id/support`): a gated call needs an allowed request of
    this activation for the tool that no run has used yet (it is used now), or an `allow-always` grant.
    The activation cannot skip the gate by calling support directly. Raises Conflict otherwise."""
    rule = matching_rule(config, agent_id, tool, tool_input)
    if rule is None or has_grant(store, agent_id, rule.key) is not None:
        return
    with store.write(now) as tx:
        row = store.unused_allowed_approval(tx, agent_id, activation_id, tool)
        if row is None:
            raise Conflict(f"Tool call {tool} needs an approval that was not given")
        store.use_approval(tx, row["id"])


# ---------------------------------------------------------------- a person's side

def check_decision(body):
    """The validated decision of a body, as keyword arguments of decide(): decision and note, `input` (an
    object) only with allow, `output` (a non-empty string) only and always with respond."""
    if not isinstance(body, dict):
        raise BadRequest("Expected a JSON object with decision")
    decision = body.get("decision")
    if not isinstance(decision, str) or decision not in DECISIONS:
        raise BadRequest(f"decision must be one of {', '.join(DECISIONS)}")
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise BadRequest("note must be a string")
    if note is not None and len(note) > MAX_NOTE_CHARS:
        raise BadRequest(f"note is longer than {MAX_NOTE_CHARS} characters")
    edited = body.get("input")
    if edited is not None and decision != ALLOW:
        raise BadRequest("input is accepted only with decision allow")
    if edited is not None and not isinstance(edited, dict):
        raise BadRequest("input must be a JSON object")
    output = body.get("output")
    if decision == RESPOND and (not isinstance(output, str) or not output.strip()):
        raise BadRequest("output is required with decision respond (the text the agent reads as the result)")
    if output is not None and decision != RESPOND:
        raise BadRequest("output is accepted only with decision respond")
    if output is not None and len(output) > MAX_OUTPUT_CHARS:
        raise BadRequest(f"output is longer than {MAX_OUTPUT_CHARS} characters")
    return {"decision": decision, "note": (note.strip() or None) if note is not None else None,
            "input": edited, "output": output}


def check_edited_input(config, tool, edited):
    """An edited input must be valid for the tool's input schema (a sandbox MCP tool's is not known here)."""
    import jsonschema  # only on this path: the schema check of an edit

    spec = config.tool(tool) if config is not None else None
    if spec is None:
        return
    try:
        jsonschema.validators.validator_for(spec.input_schema)(spec.input_schema).validate(edited)
    except jsonschema.exceptions.ValidationError as exc:
        where = "/".join(str(part) for part in exc.absolute_path)
        raise BadRequest(f"input does not fit the input schema of {tool}"
                         f"{f' at {where}' if where else ''}: {exc.message}") from None


def decide(store, approval_id, decision, note=None, via="api", now=None, input=None, output=None, config=None):
    """Apply a person's decision to a pending request, exactly once (one conditional UPDATE); a request
    that is no longer pending is a Conflict naming its status. `allow-always` also allows the agent's
    other pending requests under the same rule. `input` (allow) is the edited input, checked against the
    tool's schema in `config`; `output` (respond) is the answer the model reads. Returns the decided
    request."""
    if decision not in DECISIONS:
        raise BadRequest(f"decision must be one of {', '.join(DECISIONS)}")
    if via not in DECIDERS:
        raise BadRequest(f"Unknown decider: {via}")
    if input is not None:
        check_edited_input(config, _row(store, approval_id)["tool"], input)
    expire_due(store, now)
    with store.write(now) as tx:
        changed = store.decide_approval(tx, approval_id, DECISION_STATUS[decision], decision, note, via,
                                        edited_input=input, output=output)
        row = _row(store, approval_id)
        if not changed:
            raise Conflict(f"Approval {approval_id} is already {row['status']}")
        decided = [row]
        if decision == ALLOW_ALWAYS:
            for other in store.pending_approvals_of_rule(tx, row["agent_id"], row["rule_key"]):
                store.decide_approval(tx, other, ALLOWED, ALLOW, f"allowed always by {approval_id}", via)
                decided.append(_row(store, other))
        for item in decided:
            store.append_event("approval.decided", omit_none({
                "id": item["id"], "agentId": item["agent_id"], "activationId": item["activation_id"],
                "tool": item["tool"], "decision": item["decision"], "decidedBy": via, "note": item["note"],
                "edited": True if item["edited_input_json"] is not None else None}))
    log.info("approval %s of %s: %s via %s", approval_id, store.project_id, decision, via)
    return approval_json(row)


def expire_due(store, now=None):
    """Requests past `expires_at` take their rule's decision on expiry (default deny); returns how many."""
    ts = format_ts(to_datetime(now))
    if not store.has_due_approvals(ts):
        return 0  # the common case stays a read: no write lock for an idle list or wait
    with store.write(now) as tx:
        rows = store.expire_approvals(tx)
        for row in rows:
            store.append_event("approval.expired", {"id": row["id"], "agentId": row["agent_id"],
                                                    "activationId": row["activation_id"], "tool": row["tool"],
                                                    "decision": row["on_expiry"]})
    return len(rows)


def pending_count(store):
    return store.pending_approval_count()

