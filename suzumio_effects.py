"""The effect ledger's rules (docs/operations.md#what-an-agent-can-do-to-the-outside-world): what a tool call
may do outside, its record (intended before it runs, done or failed after), in doubt when its runner, the
controller or the node was lost in between, what the agent is told, and a person's resolution. The rows are
suzumio_store_effects'. Imported by approvals, coordination, the reconciler and the surfaces; a rule that
writes opens one store.write() (joining its caller's transaction when there is one)."""
import logging
import os

from suzumio_errors import BadRequest, Conflict, NotFound
from suzumio_records import (
    EFFECT_RESOLUTIONS,
    EFFECT_STATES,
    KIND_EFFECT_IN_DOUBT,
    KIND_EFFECT_RESOLVED,
    RESOLVED_DONE,
    SIGNAL_PENDING,
    TOOL_COMPLETED,
    effect_notice,
)
from suzumio_store_effects import effect_json

log = logging.getLogger(__name__)

EFFECT_NONE = "none"
EFFECT_LOCAL = "local"
EFFECT_IDEMPOTENT = "idempotent"
EFFECT_EXTERNAL = "external"
RUNNER = "runner"
CONTROLLER = "controller"
EVENT_IN_DOUBT = "effect.in_doubt"
EVENT_RESOLVED = "effect.resolved"
IN_DOUBT_PRIORITY = "P1"  # rides on the next tool result of a running activation, else starts the next one
RESOLVED_PRIORITY = "P2"
RESOLVERS = ("api", "cli", "webui")

# Built-in tools by their nature: the controller's own tools are keyed and answered again, never redone.
_BUILTIN_EFFECTS = {
    "file.read": EFFECT_NONE, "file.write": EFFECT_LOCAL, "file.patch": EFFECT_LOCAL,
    "shell.exec": EFFECT_EXTERNAL, "messages.send": EFFECT_NONE, "coordination.wait_for_signal": EFFECT_NONE,
    "completion.submit": EFFECT_NONE,
}
# This controller process: a call the controller runs itself is stamped with it, so that another process
# (the next `serve` after a crash) knows the call was not its own and is in doubt.
PROCESS = os.urandom(8).hex()
WHY_RUNNER_LOST = "its activation ended ({status}) before the call reported back"
WHY_CONTROLLER_LOST = "the controller that ran it stopped before the call reported back"


def effect_of(config, tool, tool_input):
    """What one call may do outside: none, local (the sandbox's files), idempotent or external."""
    if tool == "web.fetch":
        sends = isinstance(tool_input, dict) and (tool_input.get("body") is not None
                                                  or str(tool_input.get("method") or "GET").upper() != "GET")
        return EFFECT_EXTERNAL if sends else EFFECT_NONE
    if tool in _BUILTIN_EFFECTS:
        return _BUILTIN_EFFECTS[tool]
    spec = config.tool(tool) if config is not None else None
    if spec is not None and spec.effect is not None:
        return spec.effect
    return EFFECT_EXTERNAL  # an MCP or toolpack tool that says nothing, or one only the sandbox knows


def executor_of(config, tool):
    """Where a call runs: on the controller (an MCP session it owns) or in the runner."""
    spec = config.tool(tool) if config is not None else None
    pack = config.registry.toolpack(spec.toolpack_id) if spec is not None else None
    return CONTROLLER if pack is not None and pack.mcp_where == CONTROLLER else RUNNER


def intend(store, config, agent_id, activation_id, tool_call_id, tool, tool_input, call_key, now=None):
    """Before an external call runs: its intended row (nothing for a call that does nothing outside, or one
    asked again; the tool call's own events are its audit). Returns the effect id or None."""
    if effect_of(config, tool, tool_input) != EFFECT_EXTERNAL:
        return None
    executor = executor_of(config, tool)
    with store.write(now) as tx:
        return store.insert_effect(tx, agent_id, activation_id, tool_call_id, tool, tool_input, call_key, executor,
                                   PROCESS if executor == CONTROLLER else None)


def finished(store, tx, tool_call_id, status):
    """Inside the finish of a tool call: its intended effect is done or failed. One in doubt stays in doubt
    (a person decides), and a finish asked again changes nothing. A call that an earlier controller process
    ran itself is in doubt whatever the runner reports: that process stopped before it answered."""
    row = store.effect_of_call(tx, tool_call_id)
    if row is None:
        return
    if row["executor"] == CONTROLLER and row["process"] != PROCESS:
        doubt_open(store, tx, activation_id=row["activation_id"], executor=CONTROLLER, why=WHY_CONTROLLER_LOST,
                   not_process=PROCESS)
        return
    store.move_effect(tx, row["id"], "done" if status == TOOL_COMPLETED else "failed", ", finished_at = ?", (tx.ts,))


def doubt_open(store, tx, activation_id=None, executor=None, why="", not_process=None, tell=True):
    """Every intended effect of an activation (or of an executor, run by another process than
    `not_process`) -> in doubt, each with its event and, with `tell`, a signal that tells its agent, with
    the call's input. Returns the payloads of the notices (one per effect now in doubt)."""
    doubted = []
    for row in store.open_effects(tx, activation_id, executor, not_process):
        if not store.move_effect(tx, row["id"], "doubt", ", doubted_at = ?, why = ?", (tx.ts, why)):
            continue
        store.add_event(tx, EVENT_IN_DOUBT, {"effect": row["id"], "agent": row["agent_id"], "tool": row["tool"],
                                             "activationId": row["activation_id"], "why": why})
        notice = notice_payload(row, why=why)
        if tell:
            _tell(store, tx, row, KIND_EFFECT_IN_DOUBT, IN_DOUBT_PRIORITY, notice)
            store.mark_told(tx, [row["id"]])
        log.warning("effect %s of %s/%s (%s) is in doubt: %s", row["id"], store.project_id, row["agent_id"],
                    row["tool"], why)
        doubted.append(notice)
    return doubted


def notice_payload(row, **extra):
    """What a notice about one effect says (suzumio_records.effect_notice renders it)."""
    return {"effect": row["id"], "toolCallId": row["tool_call_id"], "tool": row["tool"],
            "activationId": row["activation_id"], "callKey": row["call_key"], "startedAt": row["started_at"],
            "input": effect_json(row)["input"], **extra}


def _tell(store, tx, row, kind, priority, payload):
    """A signal to the effect's agent about its own call: from the agent itself, so it is nothing new to the
    runaway guards (docs/operations.md#runaways)."""
    store.insert_signal(tx, kind, target_agent=row["agent_id"], status=SIGNAL_PENDING, useful_effect=False,
                        source_agent=row["agent_id"], source_activation=row["activation_id"], priority=priority,
                        payload=payload)


def doubt_ended_activation(store, tx, activation_id, status, tell=True):
    """Inside the end of an activation (failed, cancelled, or completed without a call's result): its calls
    still intended are in doubt. `tell=False`: the agent is told later, with what wakes it next (a stop's
    resume signal, the failed nudge: tell_untold)."""
    return doubt_open(store, tx, activation_id=activation_id, why=WHY_RUNNER_LOST.format(status=status), tell=tell)


def untold_notices(store, activation_id):
    """The notices of a failed activation's calls in doubt that its agent has not heard of (a resolved one
    is not in doubt any more, so it is not among them)."""
    return [notice_payload(row, why=row["why"]) for row in store.untold_effects(activation_id)]


def tell_untold(store, activation_id, now=None):
    """The agent of a failed activation is told of its calls in doubt in their own P1 signals, when no
    failed nudge will carry them (failedNudge off, or exhausted)."""
    rows = store.untold_effects(activation_id)
    if not rows:
        return 0
    with store.write(now) as tx:
        for row in rows:
            _tell(store, tx, row, KIND_EFFECT_IN_DOUBT, IN_DOUBT_PRIORITY, notice_payload(row, why=row["why"]))
        store.mark_told(tx, [row["id"] for row in rows])
    return len(rows)


def mark_told(store, tx, notices):
    """The notices' effects were told to their agent inside another signal (a nudge, a resume)."""
    store.mark_told(tx, [notice["effect"] for notice in notices])


def notices_text(notices):
    """The notices as the agent reads them inside another signal's text."""
    return "\n\n".join(effect_notice(KIND_EFFECT_IN_DOUBT, notice) for notice in notices)


def doubt_after_restart(store, now=None):
    """The calls an earlier controller process ran itself and that never finished: that process is gone, so
    they are in doubt. A read first: most passes write nothing."""
    if not store.has_open_effects(CONTROLLER, PROCESS):
        return []
    with store.write(now) as tx:
        doubted = doubt_open(store, tx, executor=CONTROLLER, why=WHY_CONTROLLER_LOST, not_process=PROCESS)
    return [notice["effect"] for notice in doubted]


def resolve(store, effect_id, resolution, note=None, via="api", now=None):
    """A person says whether an in-doubt call happened: done -> done, not_done -> failed, once (a second
    answer is a Conflict). The agent is told. Returns the resolved effect."""
    if resolution not in EFFECT_RESOLUTIONS:
        raise BadRequest(f"resolution must be one of {', '.join(EFFECT_RESOLUTIONS)}")
    if note is not None and not isinstance(note, str):
        raise BadRequest("note must be a string")
    if via not in RESOLVERS:
        raise BadRequest(f"Unknown resolver: {via}")
    note = (note or "").strip() or None
    with store.write(now) as tx:
        row = store.effect_row(effect_id, tx.conn)
        if row is None:
            raise NotFound(f"Unknown effect: {effect_id}")
        trigger = "resolve_done" if resolution == RESOLVED_DONE else "resolve_not_done"
        if not store.move_effect(tx, effect_id, trigger, ", resolution = ?, resolved_at = ?, resolved_by = ?, note = ?",
                                 (resolution, tx.ts, via, note)):
            raise Conflict(f"Effect {effect_id} is {row['state']}, not in doubt")
        store.add_event(tx, EVENT_RESOLVED, {"effect": effect_id, "agent": row["agent_id"], "tool": row["tool"],
                                             "resolution": resolution, "resolvedBy": via, "note": note})
        _tell(store, tx, row, KIND_EFFECT_RESOLVED, RESOLVED_PRIORITY,
              notice_payload(row, resolution=resolution, note=note))
        resolved = store.effect_row(effect_id, tx.conn)
    log.info("effect %s of %s resolved %s via %s", effect_id, store.project_id, resolution, via)
    return effect_json(resolved)


def list_effects(store, state=None, limit=200):
    """The ledger, newest first; only `state` (intended, done, failed, in_doubt) when given."""
    if state is not None and state not in EFFECT_STATES:
        raise BadRequest(f"Invalid effect state: {state} (expected one of {', '.join(EFFECT_STATES)})")
    return [effect_json(row) for row in store.effect_rows(state, limit)]


def in_doubt_count(store):
    return store.in_doubt_count()

