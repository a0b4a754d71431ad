"""Coordination rules over the store's rows (docs/design/store.md, docs/design/scheduler.md): message
routing and the communication policy, signal validation and channel fan-out, signal selection,
activation start and completion, P1 tool-boundary delivery, stop/approve, the token-budget pause, wait
and submit, history compaction, and every nudge and monitor with their one backoff. Each rule is one
function that opens one `store.write(now)`, so its rows, events and files commit together or not at all."""
import json
import logging
import math
import re
from datetime import timedelta

import suzumio_config_schema
import suzumio_effects
import suzumio_prompts
from suzumio_cost import budget_state, budget_warning_message, cost_exceeded_message
from suzumio_errors import BadRequest, Conflict
from suzumio_records import (
    ACT_CANCELLED,
    ACT_COMPLETED,
    ACT_FAILED,
    ACT_RUNNING,
    AGENT_FAILED,
    AGENT_QUIET,
    APPROVE_REASON,
    BOUNDARY_LIMIT,
    BUDGET_SENDER,
    ENDING_TOOLS,
    KIND_ALL_QUIET_NUDGE,
    KIND_BUDGET_EXCEEDED,
    KIND_BUDGET_WARNING,
    KIND_FAILED_NUDGE,
    KIND_MESSAGE,
    KIND_NO_EFFECT_NUDGE,
    KIND_RESUME_AFTER_STOP,
    KIND_SUBMITTED,
    KIND_WAIT,
    PRIORITIES,
    PROJECT_COMPLETED,
    PROJECT_RUNNING,
    PROJECT_SUBMITTED,
    RECORDABLE_SIGNAL_STATUSES,
    RESUME_AFTER_STOP_MESSAGE,
    SIGNAL_CLOSED,
    SIGNAL_PENDING,
    STOP_REASON,
    TOOL_CALL_END_STATUSES,
    TOOL_COMPLETED,
    TOOL_FAILED,
    WAIT_PREFIX,
    budget_message,
    checked_priority,
    default_useful_effect,
    describe,
    format_ts,
    is_news,
    no_effect_message,
    nudge_attempt,
    omit_none,
    parse_ts,
    render_boundary_text,
    require_running,
    to_datetime,
    waking_signal,
)
from suzumio_registry import is_allowed

log = logging.getLogger(__name__)

QUIET_MONITOR_EVENT = "scheduler.quiet_agent_monitor.message_sent"
FAILED_MONITOR_EVENT = "scheduler.failed_agent_monitor.message_sent"
NUDGE_EXHAUSTED = "scheduler.nudge_exhausted"
NO_EFFECT_RULE, FAILED_RULE = "noEffectNudge", "failedNudge"  # the events name a rule by its config key
URGENT = ("P0", "P1")  # delivered together, up to the per-activation limit (docs/design/store.md)
ROUTINE = ("P2", "P3")  # delivered one at a time, when nothing urgent is ready
DEFAULT_KEEP_TAIL = 12


# ---------------------------------------------------------------- messages (docs/design/store.md)

def check_policy(config, caller, recipient, channel, priority):
    """docs/design/store.md for the messages.send tool: what a non-coordinator agent may send."""
    communication = config.communication
    coordinator = communication.coordinator_agent
    if not communication.restrict_non_coordinator_to_coordinator or caller == coordinator:
        return
    max_priority = communication.non_coordinator_max_priority
    if channel is not None:
        raise BadRequest("Communication policy: channels are not allowed for non-coordinator agents; "
                         f"send a direct message to {coordinator}.")
    if recipient != coordinator:
        raise BadRequest(f"Communication policy: non-coordinator agents may message only {coordinator}.")
    if PRIORITIES.index(priority) < PRIORITIES.index(max_priority):
        raise BadRequest(f"Communication policy: non-coordinator agents may use {max_priority} or lower; "
                         f"{priority} is not allowed.")


def send_message(store, config, sender, body, recipient=None, channel=None, priority=None, source_agent=None,
                 source_activation=None, now=None, idempotency_key=None, grouped=False):
    """docs/design/store.md: validate and route, then the message row, its event and its signal(s), in one
    transaction. Returns the Message JSON. A send with an `idempotency_key` the project already recorded
    writes nothing and returns that message (docs/toolpacks.md). `grouped`: the transaction may hold the
    sends of other callers waiting at the same time (store.write_grouped); it returns after that COMMIT."""
    def send(tx):
        return _send(store, config, tx, sender, body, recipient, channel, priority, source_agent,
                     source_activation, idempotency_key)

    if grouped:
        return store.write_grouped(send, now)
    with store.write(now) as tx:
        return send(tx)


def send_user_message(store, config, sender, body, recipient=None, channel=None, priority=None, now=None,
                      grouped=False):
    """A message from a person or a script (the HTTP API, the CLI). A project that is not running keeps it
    (its signals stay pending until the team runs again): the Message JSON then carries `queued: true` and
    a `note` naming the status and how to resume (waiting_note). A completed project takes none (Conflict
    with the same kind of note)."""
    def send(tx):
        message = _send(store, config, tx, sender, body, recipient, channel, priority)  # its checks first
        status = store.project()["status"]  # no other writer can change it while this write is open
        if status == PROJECT_COMPLETED:
            raise Conflict(waiting_note(store.project_id, status))  # rolls the message back
        note = waiting_note(store.project_id, status) if recipient != "user" else None
        return message if note is None else {**message, "queued": True, "note": note}

    if grouped:
        return store.write_grouped(send, now)
    with store.write(now) as tx:
        return send(tx)


def waiting_note(project_id, status):
    """What a message to a project in `status` waits for, or None while it runs (docs/http-api.md)."""
    if status == PROJECT_RUNNING:
        return None
    if status == PROJECT_COMPLETED:
        return (f"Project {project_id} is completed and takes no more messages; start it to run the team "
                f"again (suzumio start {project_id}, or a POST to /api/projects/{project_id}/start)")
    if status == PROJECT_SUBMITTED:
        resume = f"request changes to resume (a POST to /api/projects/{project_id}/request-changes)"
    else:
        resume = f"start it to resume (suzumio start {project_id}, or a POST to /api/projects/{project_id}/start)"
    return (f"Project {project_id} is {status}: the message is kept and delivered when the team runs again; "
            f"{resume}")


def _send(store, config, tx, sender, body, recipient=None, channel=None, priority=None, source_agent=None,
          source_activation=None, idempotency_key=None):
    """`config` is read only to route a channel message."""
    if not isinstance(body, str) or not body.strip():
        raise BadRequest("body is required")
    priority = checked_priority(priority)
    if not isinstance(sender, str) or not sender:
        raise BadRequest("sender is required")
    recipient = recipient or None
    channel = channel or None
    if recipient is None and channel is None:
        raise BadRequest("Message needs recipient or channel")
    if recipient is not None and channel is not None:
        raise BadRequest(f'Message cannot have both recipient and channel: drop "channel" to send to {recipient} '
                         f'only, or drop "recipient" to post to {channel}')
    # An unknown recipient agent is refused by _fan_out, which reads the agent anyway; the message row
    # written before it is rolled back with the transaction.
    if channel is not None and channel not in config.channels:
        raise BadRequest(f"Unknown channel: {channel}")
    if idempotency_key is not None:
        prior = store.keyed_message(tx, idempotency_key)
        if prior is not None:
            sent = (prior["sender"], prior.get("recipient"), prior.get("channel"), prior["priority"], prior["body"])
            if sent != (sender, recipient, channel, priority, body):
                raise Conflict(f"idempotencyKey {idempotency_key} was already used for another message")
            return prior
    message = store.insert_message(tx, sender, body, recipient, channel, priority, idempotency_key)
    _fan_out(store, config, tx, KIND_MESSAGE, source_agent=source_agent, source_activation=source_activation,
             target_agent=recipient, target_channel=channel, priority=priority, payload=message, sender=sender)
    return message


# ---------------------------------------------------------------- signals (docs/design/store.md)

def record_signal(store, config, kind, *, source_agent=None, source_activation=None, target_agent=None,
                  target_channel=None, priority=None, payload=None, status=None, useful_effect=None,
                  not_before=None, now=None):
    """docs/design/store.md: one row and one signal.created event per target (a channel fans out to every agent
    but the source); returns the Signal JSON list."""
    with store.write(now) as tx:
        return _fan_out(store, config, tx, kind, source_agent=source_agent, source_activation=source_activation,
                        target_agent=target_agent, target_channel=target_channel, priority=priority,
                        payload=payload, status=status, useful_effect=useful_effect, not_before=not_before)


def _fan_out(store, config, tx, kind, *, source_agent=None, source_activation=None, target_agent=None,
             target_channel=None, priority=None, payload=None, status=None, useful_effect=None, not_before=None,
             sender=None):
    """`sender`: a message's sender, who like its source agent never gets its own channel post (a message a
    toolpack sends on an agent's behalf may carry no source agent)."""
    if not isinstance(kind, str) or not kind.strip():
        raise BadRequest("kind is required")
    # payload and usefulEffect are checked first, as POST /runner/signals does (docs/http-api.md)
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise BadRequest("payload must be an object")
    if useful_effect is not None and not isinstance(useful_effect, bool):
        raise BadRequest(f"Expected boolean, got {describe(useful_effect)}")
    for value, names in ((target_agent, "agent"), (target_channel, "channel")):
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"Unknown {names}: {describe(value)}")
    if target_agent == "user" or target_agent == "":
        target_agent = None
    target_channel = target_channel or None
    if target_agent is not None:
        if store.agent_row(target_agent) is None:
            raise BadRequest(f"Unknown agent: {target_agent}")
        targets = [target_agent]
    elif target_channel is not None:
        if target_channel not in config.channels:
            raise BadRequest(f"Unknown channel: {target_channel}")
        targets = [agent_id for agent_id in store.agent_ids() if agent_id not in (source_agent, sender)]
    else:
        targets = []
    if status is not None and status not in RECORDABLE_SIGNAL_STATUSES:
        raise BadRequest(f"Invalid signal status: {describe(status)}")
    if status == SIGNAL_CLOSED and targets:
        raise BadRequest("Targeted signals cannot be closed; omit the target or omit status")
    priority = checked_priority(priority)
    not_before = format_ts(to_datetime(not_before)) if not_before is not None else None
    rows = [(t, SIGNAL_PENDING) for t in targets] or [(None, SIGNAL_CLOSED)]
    return [store.insert_signal(tx, kind, target_agent=target, status=row_status,
                                useful_effect=default_useful_effect(kind, row_status) if useful_effect is None
                                else useful_effect,
                                source_agent=source_agent, source_activation=source_activation,
                                target_channel=target_channel, priority=priority, payload=payload,
                                not_before=not_before)
            for target, row_status in rows]


def _emit(store, tx, kind, target_agent=None, priority="P3", payload=None, useful_effect=None, not_before=None,
          source_agent=None, source_activation=None):
    """A signal the rules themselves raise: pending for `target_agent` (an agent that exists), or one
    closed record without a target."""
    status = SIGNAL_PENDING if target_agent is not None else SIGNAL_CLOSED
    useful = default_useful_effect(kind, status) if useful_effect is None else useful_effect
    return store.insert_signal(tx, kind, target_agent=target_agent, status=status, useful_effect=useful,
                               source_agent=source_agent, source_activation=source_activation,
                               priority=priority, payload=payload or {}, not_before=not_before)


def pending_signals(store, config, agent_id, now=None):
    """docs/design/store.md: every ready P0/P1 signal up to scheduler.maxSignalsPerActivation, else the single
    oldest ready P2, else P3."""
    with store.snapshot():
        urgent = store.ready_signals(agent_id, URGENT, config.scheduler.max_signals_per_activation, now)
        return urgent or store.ready_signals(agent_id, ROUTINE, 1, now)


# ---------------------------------------------------------------- activations (docs/design/store.md)

def start_activation(store, agent_id, prompt, signals, now=None, reminder=None):
    """createActivation (one running activation per agent, only in a running project), the selected
    signals delivered to it, and the activation_prompt history row; Conflict when it cannot start.
    `reminder` (prompts.team_round's: the contract reminder of a leading agent whose work has come back) is
    kept in that row for the runner."""
    signals = list(signals or [])
    with store.write(now) as tx:
        agent = store.require_agent(agent_id)
        act_id = tx.id("act")
        if not store.claim_agent(tx, agent_id, act_id):
            project = store.project()
            if project["status"] != PROJECT_RUNNING:
                raise Conflict(f"Project {store.project_id} is {project['status']}; no activation can start")
            if agent["active_activation_id"]:
                raise Conflict(f"Agent {agent_id} already has a running activation "
                               f"{agent['active_activation_id']}")
            raise Conflict(f"Agent {agent_id} is {agent['status']}; no activation can start")
        store.insert_activation(tx, act_id, agent_id, prompt)
        ids = [s["id"] if isinstance(s, dict) else s for s in signals]
        delivered = store.deliver_signals(tx, agent_id, ids, act_id)
        if len(delivered) != len(ids):
            missing = [i for i in ids if i not in delivered]
            raise Conflict(f"Signals are no longer pending for {agent_id}: {', '.join(missing)}")
        woke = [store.signal(i) for i in ids]
        priorities = [signal["priority"] for signal in woke]
        store.add_event(tx, "activation.started", {"activationId": act_id, "agentId": agent_id,
                                                   "signals": [waking_signal(signal) for signal in woke]})
        meta = {"delivery": "activation_start", "signalIds": ids, "priorities": priorities}
        if reminder is not None:
            meta["reminder"] = reminder
        store.add_history(tx, agent_id, act_id, "user", "activation_prompt", prompt, meta)
        return store.activation(act_id)


def complete_activation(store, config, activation_id, agent_id, text, usage=None, now=None):
    """docs/design/store.md with the no-effect nudge (docs/design/scheduler.md); a non-running activation is returned
    unchanged."""
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("output.text is required")
    usage = usage if isinstance(usage, dict) else {}
    with store.write(now) as tx:
        row = store.owned_activation(tx.conn, agent_id, activation_id)
        agent_id = row["agent_id"]
        if not store.mark_completed(tx, activation_id, agent_id, text, usage):
            return {"status": row["status"], "activationId": activation_id}
        _cancel_approvals(store, tx, activation_id, ACT_COMPLETED)
        suzumio_effects.doubt_ended_activation(store, tx, activation_id, ACT_COMPLETED)
        done = store.activation(activation_id)
        # the notice is written in this transaction, which the count (another connection's read) cannot see
        useful = store.useful_effects(activation_id) + _unreported(store, config, tx, agent_id, activation_id)
        store.add_event(tx, "activation.completed", {"activationId": activation_id, "agentId": agent_id,
                                                     "emittedMessages": done["emittedMessages"],
                                                     "usefulEffects": useful})
        if useful == 0:
            _no_effect_nudge(store, config, tx, agent_id, activation_id)
        return {"status": ACT_COMPLETED, "activationId": activation_id}


def _unreported(store, config, tx, agent_id, activation_id):
    """Tell the coordinator when an activation it sent a message to ends without a message or a wait back:
    the lab's model, as a poet, wrote its poem and reported to the user instead, and the coordinator waited
    for it for ever. The notice names the files the activation wrote. True when it was sent."""
    pm = config.communication.coordinator_agent
    if agent_id == pm or store.agent_row(pm) is None:
        return False
    asked = any((s.get("payload") or {}).get("sender") == pm
                for s in store.signals_delivered_to(activation_id, KIND_MESSAGE))
    if not asked or store.answered_from(tx, activation_id, pm):
        return False
    notice = "Ended an activation without a report to you."
    written = suzumio_prompts.written_paths(store.tool_calls_of(activation_id))
    if written:
        notice += "\n\nFiles written in this activation: " + ", ".join(written)
    _send(store, config, tx, agent_id, notice, recipient=pm, priority="P3", source_agent=agent_id,
          source_activation=activation_id)
    return True


def refuse_tool_call(store, agent_id, activation_id, tool, tool_input, error, call_key=None, now=None):
    """A call the runner refused before running it: a tool call row that failed with `error`, its events
    and history rows as for any failed call. The same refusal asked again (same `call_key`) records nothing."""
    if not isinstance(tool, str) or not tool.strip():
        tool = "(no name)"
    started = store.start_tool_call(agent_id, activation_id, tool[:200], tool_input, now=now, call_key=call_key)
    if started.pop("replayed", False):
        return started
    with store.write(now) as tx:
        store.record_tool_result(tx, agent_id, activation_id, started["toolCallId"], TOOL_FAILED, None,
                                 error or "Refused")
    return dict(started, status=TOOL_FAILED)


def finish_tool_call(store, agent_id, activation_id, tool_call_id, status, output=None, error=None, now=None,
                     boundary=False):
    """docs/design/store.md finish plus P1 tool-boundary delivery (docs/design/scheduler.md): after a completed call of
    a running activation (not one that ends it), ready P1 signals ride on the tool result. `boundary`:
    deliver them although the call failed (a denied approval is a tool boundary). The same
    finish asked again (a runner retrying after a lost answer) answers the first one's result, signal
    text included, and records nothing (docs/spec-notes.md#repeats-are-answered-not-redone)."""
    if status not in TOOL_CALL_END_STATUSES:
        raise BadRequest(f"Invalid tool call status: {status}")
    output = None if output is None else str(output)
    error = None if error in (None, "") else str(error)
    with store.write(now) as tx:
        store.owned_activation(tx.conn, agent_id, activation_id)
        target, tool, replayed = store.record_tool_result(tx, agent_id, activation_id, tool_call_id, status,
                                                          output, error)
        result = {"status": target}
        if not replayed:
            suzumio_effects.finished(store, tx, tool_call_id, target)
        if replayed:
            delivered = store.boundary_delivery(tx, activation_id, tool_call_id)
            if delivered is not None:
                result.update(deliveredSignals=len(delivered[1]), signalText=delivered[0])
            return result
        if ((target != TOOL_COMPLETED and not boundary) or store.activation(activation_id)["status"] != ACT_RUNNING
                or tool in ENDING_TOOLS):
            return result
        signals = store.ready_signals(agent_id, ("P1",), BOUNDARY_LIMIT, tx.now)
        if not signals:
            return result
        text = render_boundary_text(signals)
        ids = store.deliver_signals(tx, agent_id, [s["id"] for s in signals], activation_id)
        store.add_history(tx, agent_id, activation_id, "user", "tool_boundary_signals", text,
                          {"delivery": "tool_boundary", "signalIds": ids, "toolCallId": tool_call_id})
        result.update(deliveredSignals=len(ids), signalText=text)
        return result


# How a running activation ends other than by its output: trigger -> (status, history kind and agent
# trigger, event, the field that carries the why).
_ENDINGS = {"fail": (ACT_FAILED, "activation_failed", "activation.failed", "error"),
            "cancel": (ACT_CANCELLED, "activation_cancelled", "activation.cancelled", "reason")}


def fail_activation(store, activation_id, error, now=None):
    """A running activation -> failed with its error, the agent -> failed, a history row and the
    activation.failed event. Returns the failed activation, or None when it had already ended."""
    error = str(error)
    with store.write(now) as tx:
        return _end_running(store, tx, activation_id, "fail", error, f"Activation {activation_id} failed.\n\n{error}")


def cancel_activation(store, activation_id, reason, now=None):
    """A running activation -> cancelled (a P0 restart, stop, approve). Returns the cancelled
    activation, or None when it had already ended."""
    with store.write(now) as tx:
        return cancel_in(store, tx, activation_id, str(reason))


def cancel_in(store, tx, activation_id, reason):
    return _end_running(store, tx, activation_id, "cancel", reason,
                        f"Activation {activation_id} was interrupted and cancelled.\n\nReason: {reason}")


def _end_running(store, tx, activation_id, trigger, why, text):
    """End a running activation by `trigger` inside `tx`: its row, its pending approval requests, the
    agent, a history row and the event; None when it had already ended."""
    status, kind, event, field = _ENDINGS[trigger]
    row = store.activation_row(activation_id, tx.conn)
    if not store.end_activation(tx, activation_id, trigger, ", error = ?", (why,)):
        return None
    _cancel_approvals(store, tx, activation_id, status)
    # A failed activation's calls in doubt are told with the failed nudge (or on their own: _failed_nudges).
    suzumio_effects.doubt_ended_activation(store, tx, activation_id, status, tell=trigger != "fail")
    agent_id = row["agent_id"]
    store.move_agent(tx, agent_id, kind, bound_to=activation_id)
    store.add_history(tx, agent_id, activation_id, "assistant", kind, text, {field: why})
    store.add_event(tx, event, {"activationId": activation_id, "agentId": agent_id, field: why})
    return store.activation(activation_id)


def _cancel_approvals(store, tx, activation_id, status):
    """An activation that ends takes its pending approval requests with it."""
    reason = f"Activation {activation_id} is {status}"
    for row in store.cancel_pending_approvals(tx, activation_id, reason):
        store.add_event(tx, "approval.cancelled", {"id": row["id"], "agentId": row["agent_id"],
                                                   "activationId": activation_id, "tool": row["tool"],
                                                   "reason": reason})


# ---------------------------------------------------------------- project control (docs/design/store.md)

def stop(store, now=None, tx=None):
    """docs/design/store.md: stopped, cancel running activations, a P2 resume signal for each, in `tx` when
    given. Returns the cancelled activations (the caller stops their runners)."""
    return _halt(store, "stop", STOP_REASON, True, now, tx)


def approve(store, now=None, tx=None):
    """Like stop with status completed, reason `Project approved`, and no resume signals."""
    return _halt(store, "approve", APPROVE_REASON, False, now, tx)


def _halt(store, trigger, reason, resume, now, tx):
    if tx is None:
        with store.write(now) as tx:
            return _halt(store, trigger, reason, resume, now, tx)
    cancelled = []
    store.set_project_status(tx, trigger)
    for running in store.running_activations():
        # Its calls left running are in doubt; the resume signal tells the agent, with the resume itself.
        doubted = suzumio_effects.doubt_ended_activation(store, tx, running["id"], ACT_CANCELLED, tell=False)
        act = cancel_in(store, tx, running["id"], reason)
        if act is None:
            continue
        cancelled.append(act)
        if resume:
            interrupted = [s["id"] for s in store.signals_delivered_to(act["id"])]
            message = "\n\n".join([RESUME_AFTER_STOP_MESSAGE] + (
                [suzumio_effects.notices_text(doubted)] if doubted else []))
            _emit(store, tx, KIND_RESUME_AFTER_STOP, act["agentId"], "P2", useful_effect=False,
                  payload=omit_none({"cancelledActivationId": act["id"], "interruptedSignalIds": interrupted,
                                     "message": message,
                                     "inDoubt": [notice["effect"] for notice in doubted] or None}))
            suzumio_effects.mark_told(store, tx, doubted)
    return cancelled


def _budget_use(store, max_tokens, max_cost_usd):
    """(tokens, USD, state) of the budget window: state "ok", "warning" (80%) or "exceeded"."""
    used, cost = store.window_usage()
    return used, cost, budget_state(max_tokens, max_cost_usd, used, cost)


def warn_for_budget(store, max_tokens, max_cost_usd=None, now=None):
    """Once per budget window, when 80% of a limit is used by a running project, the
    `project.budget_warning` event and a P2 message to the user. Returns the event data or None."""
    with store.snapshot():
        if (store.project()["status"] != PROJECT_RUNNING
                or _budget_use(store, max_tokens, max_cost_usd)[2] != "warning"):
            return None
    with store.write(now) as tx:
        if store.project()["status"] != PROJECT_RUNNING:
            return None
        used, cost, state = _budget_use(store, max_tokens, max_cost_usd)
        if state != "warning" or store.budget_warned():
            return None
        data = omit_none({"maxTokens": max_tokens, "usedTokens": used if max_tokens is not None else None,
                          "maxCostUsd": max_cost_usd,
                          "usedCostUsd": round(cost, 6) if max_cost_usd is not None else None})
        store.add_event(tx, KIND_BUDGET_WARNING, data)
        _send(store, None, tx, BUDGET_SENDER, budget_warning_message(store.project_id, data),
              recipient="user", priority="P2")
        return data


def pause_for_budget(store, max_tokens, now=None, max_cost_usd=None):
    """Stop a running project whose window used max_tokens or more (or max_cost_usd or more):
    status, `project.budget_exceeded` and the P2 message to the user in one transaction. Running
    activations are left to finish. Returns the event data, or None when the project was not running
    or is within budget."""
    with store.snapshot():
        if (store.project()["status"] != PROJECT_RUNNING
                or _budget_use(store, max_tokens, max_cost_usd)[2] != "exceeded"):
            return None
    with store.write(now) as tx:
        # re-checked under the write lock: a concurrent tick or `start` may have moved the window
        if store.project()["status"] != PROJECT_RUNNING:
            return None
        used, cost, state = _budget_use(store, max_tokens, max_cost_usd)
        if state != "exceeded":
            return None
        store.set_project_status(tx, "budget_exceeded")
        if max_tokens is not None and used >= max_tokens:
            data = {"maxTokens": max_tokens, "usedTokens": used}
            text = budget_message(store.project_id, max_tokens, used)
        else:
            data = {"maxCostUsd": max_cost_usd, "usedCostUsd": round(cost, 6)}
            text = cost_exceeded_message(store.project_id, max_cost_usd, cost)
        store.add_event(tx, KIND_BUDGET_EXCEEDED, data)
        _send(store, None, tx, BUDGET_SENDER, text, recipient="user", priority="P2")
        return data


def request_changes(store, config, body, recipient=None, now=None, submitted_only=False):
    """docs/http-api.md: running again, and a P2 user message (to the coordinator by default). With
    `submitted_only` (the CLI), a project that is not submitted is a Conflict."""
    if not isinstance(body, str) or not body.strip():
        raise BadRequest("body is required")
    if not recipient and store.agent_row(config.communication.coordinator_agent) is None:
        coordinator = config.communication.coordinator_agent
        raise BadRequest(f'request-changes needs a recipient: communication.coordinatorAgent is "{coordinator}", '
                         f"which is not in agents ({', '.join(store.agent_ids())}); send a recipient, or set "
                         "communication.coordinatorAgent to one of them")
    recipient = recipient or config.communication.coordinator_agent
    if recipient != "user" and store.agent_row(recipient) is None:
        raise BadRequest(f"Unknown agent: {recipient}")
    with store.write(now) as tx:
        status = store.project_row(tx.conn)["status"] if submitted_only else PROJECT_SUBMITTED
        if status != PROJECT_SUBMITTED:
            raise Conflict(f"Project {store.project_id} is {status}, not submitted: there is no report to "
                           "request changes on")
        store.set_project_status(tx, "request_changes")
        return _send(store, config, tx, "user", body, recipient=recipient, priority="P2")


# ---------------------------------------------------------------- core tool effects (docs/design/store.md)

def submit_report(store, agent_id, activation_id, report, now=None):
    """docs/design/store.md: final-report.md, project submitted, closed completion.submitted signal. The report
    file is replaced only when the transaction commits."""
    if not isinstance(report, str) or not report.strip():
        raise BadRequest("report is required")
    path = store.report_path
    with store.write(now) as tx:
        store.require_agent(agent_id)
        if activation_id is not None:
            require_running(store.owned_activation(tx.conn, agent_id, activation_id), "tool")
        tx.write_file(path, report.strip() + "\n")
        store.set_project_status(tx, "submit", {"submitted_report": str(path)})
        store.add_event(tx, "project.submitted", {"agentId": agent_id, "reportPath": str(path)})
        signal = _emit(store, tx, KIND_SUBMITTED, source_agent=agent_id, source_activation=activation_id,
                       payload={"reportPath": str(path)}, useful_effect=True)
    return {"reportPath": str(path), "signal": signal}


def declare_wait(store, config, agent_id, activation_id, reason=None, pm=None, notify_pm=None, now=None,
                 written=()):
    """docs/design/store.md: an optional P3 notice to the coordinator plus a closed wait signal. The notice
    names the files the activation wrote (`written`): a coordinator learns what a worker made even when the
    worker waited without reporting it."""
    reason = reason.strip() if isinstance(reason, str) and reason.strip() else WAIT_PREFIX
    pm = pm or config.communication.coordinator_agent
    notify = (agent_id != pm) if notify_pm is None else bool(notify_pm)
    with store.write(now) as tx:
        store.require_agent(agent_id)
        if activation_id is not None:
            require_running(store.owned_activation(tx.conn, agent_id, activation_id), "tool")
        message = None
        if notify and agent_id != pm and store.agent_row(pm) is not None:
            notice = f"{WAIT_PREFIX}\n\nReason: {reason}"
            if written:
                notice += "\n\nFiles written in this activation: " + ", ".join(written)
            message = _send(store, config, tx, agent_id, notice, recipient=pm,
                            priority="P3", source_agent=agent_id, source_activation=activation_id)
        payload = omit_none({"reason": reason, "notifiedAgent": pm if message else None,
                             "messageId": message["id"] if message else None})
        signal = _emit(store, tx, KIND_WAIT, source_agent=agent_id, source_activation=activation_id,
                       payload=payload, useful_effect=True)
    return omit_none({"reason": reason, "notifiedAgent": payload.get("notifiedAgent"),
                      "message": message, "signal": signal})


# ---------------------------------------------------------------- history compaction (docs/design/store.md)

def compact_history(store, agent_id, activation_id, summary, keep_tail=None, reason=None, selected_model=None,
                    now=None):
    """Archive the head of active history behind one compaction marker, keeping the last `keep_tail`
    rows (1–100, default 12). The archive file appears only when the transaction commits."""
    if not isinstance(summary, str) or not summary.strip():
        raise BadRequest("summary is required")
    summary = summary.strip()
    keep = DEFAULT_KEEP_TAIL if keep_tail is None else min(100, max(1, math.floor(keep_tail)))
    with store.write(now) as tx:
        store.require_agent(agent_id)
        if activation_id is not None:
            require_running(store.owned_activation(tx.conn, agent_id, activation_id), "history")
        active = store.active_history_rows(tx.conn, agent_id)
        head = active[:-keep] if len(active) > keep else []
        if not head:
            return {"status": "unchanged", "history": active}
        cmp_id = tx.id("cmp")
        path = store.history_archive_path(agent_id, cmp_id)
        archive = omit_none({"version": 1, "compactionId": cmp_id, "project": store.project_id,
                             "agentId": agent_id, "activationId": activation_id, "reason": reason,
                             "selectedModel": selected_model, "createdAt": tx.ts, "messages": head})
        text = json.dumps(archive, indent=2, ensure_ascii=False) + "\n"
        tx.write_file(path, text)
        sequences = [m["sequence"] for m in head]
        marker = store.add_history(
            tx, agent_id, activation_id, "compaction", "history_compaction", summary,
            omit_none({"compactionId": cmp_id, "archivePath": str(path), "archivedMessageCount": len(head),
                       "startSequence": min(sequences), "endSequence": max(sequences), "reason": reason,
                       "selectedModel": selected_model}),
            [{"type": "compaction", "text": summary, "metadata": {"compactionId": cmp_id, "archivePath": str(path)}}])
        compaction = store.archive_history(tx, cmp_id, agent_id, activation_id, marker["id"], path, head,
                                           len(text), summary, reason, selected_model)
        history = store.active_history_rows(tx.conn, agent_id)
    return {"status": "compacted", "compaction": compaction, "history": history}


# ---------------------------------------------------------------- nudges and monitors (docs/design/scheduler.md)

def backoff_ms(rule, step):
    """The one backoff of every nudge: initialDelayMs × backoffFactor^step, capped at maxDelayMs."""
    return int(min(rule.max_delay_ms, math.floor(rule.initial_delay_ms * rule.backoff_factor ** step)))


def _nudge_payload(rule, previous_activation, attempt, delay, now):
    not_before = format_ts(now + timedelta(milliseconds=delay)) if delay > 0 else None
    payload = {"previousActivationId": previous_activation, "attempt": attempt,
               "maxConsecutive": rule.max_consecutive, "delayMs": delay}
    if not_before is not None:
        payload["notBefore"] = not_before
    return payload, not_before


def _nudge_streak(store, agent_id, activation_id, kind):
    """How many nudges of `kind` in a row led to this activation: the attempt of the one delivered to it, 0
    when none was or when something new (a message, another agent's signal) came with it."""
    delivered = store.signals_delivered_to(activation_id)
    if any(is_news(signal, agent_id) for signal in delivered):
        return 0
    return max((nudge_attempt(s["payload"]) for s in delivered if s["kind"] == kind), default=0)


def _exhausted(store, tx, agent_id, rule_name, count, activation_id):
    """The one event that says an agent is nudged no more: it waits for a person or a new signal."""
    store.add_event(tx, NUDGE_EXHAUSTED, {"agentId": agent_id, "rule": rule_name, "count": count,
                                          "activationId": activation_id})
    log.info("%s of %s/%s stopped after %d nudges", rule_name, store.project_id, agent_id, count)


def _no_effect_nudge(store, config, tx, agent_id, activation_id):
    """docs/design/scheduler.md, inside completion: the first nudge at once, later ones backing off, none
    past maxConsecutive (the activation that reaches it records `scheduler.nudge_exhausted` once)."""
    rule = config.scheduler.no_effect_nudge
    if not rule.enabled:
        return None
    previous = _nudge_streak(store, agent_id, activation_id, KIND_NO_EFFECT_NUDGE)
    if rule.max_consecutive and previous >= rule.max_consecutive:
        _exhausted(store, tx, agent_id, NO_EFFECT_RULE, previous, activation_id)
        return None
    attempt = previous + 1
    delay = backoff_ms(rule, attempt - 2) if attempt > 1 else 0
    payload, not_before = _nudge_payload(rule, activation_id, attempt, delay, tx.now)
    tools = store.agent(agent_id)["tools"]
    payload["message"] = no_effect_message(lambda tool: is_allowed(tool, tools))
    return _emit(store, tx, KIND_NO_EFFECT_NUDGE, agent_id, rule.priority, payload, useful_effect=False,
                 not_before=not_before)


def nudge_and_monitor(store, config, now, agents=None):
    """Steps 6–9 of a tick (docs/design/scheduler.md): failed nudges, the failed- and quiet-agent monitors, the
    all-quiet nudge. Returns the times at which a waiting monitor or nudge becomes due. `agents`: the
    agent list as it stands now, when the caller has it."""
    agents = store.list_agents() if agents is None else agents
    _failed_nudges(store, config, agents, now)
    dues = []
    _monitor_rules(store, config, agents, now, failed=True, dues=dues)
    _monitor_rules(store, config, agents, now, failed=False, dues=dues)
    _all_quiet_nudge(store, config, now, dues)
    return dues


def _failed_nudges(store, config, agents, now):
    """docs/design/scheduler.md (step 6). The failed activation's calls in doubt ride on its nudge, or, with
    no nudge to come, go in signals of their own (docs/operations.md#what-an-agent-can-do-to-the-outside-world)."""
    rule = config.scheduler.failed_nudge
    for agent in agents:
        if agent["status"] != AGENT_FAILED:
            continue
        if store.has_pending_signals_for_agent(agent["id"], include_delayed=True, now=now):
            continue
        latest = store.latest_failed_activation(agent["id"])
        if latest is None:
            continue
        if not rule.enabled:
            suzumio_effects.tell_untold(store, latest["id"], now)
            continue
        previous = _nudge_streak(store, agent["id"], latest["id"], KIND_FAILED_NUDGE)
        if rule.max_consecutive and previous >= rule.max_consecutive:
            _failed_nudges_exhausted(store, agent["id"], previous, latest["id"], now)
            suzumio_effects.tell_untold(store, latest["id"], now)
            continue
        attempt = previous + 1
        payload, not_before = _nudge_payload(rule, latest["id"], attempt, backoff_ms(rule, attempt - 1), now)
        payload["error"] = latest.get("error") or ""
        payload["message"] = rule.message or suzumio_config_schema.FAILED_NUDGE_MESSAGE
        doubted = suzumio_effects.untold_notices(store, latest["id"])
        if doubted:
            payload.update(message=f"{payload['message']}\n\n{suzumio_effects.notices_text(doubted)}",
                           inDoubt=[notice["effect"] for notice in doubted])
        with store.write(now) as tx:
            _emit(store, tx, KIND_FAILED_NUDGE, agent["id"], rule.priority, payload, useful_effect=False,
                  not_before=not_before)
            suzumio_effects.mark_told(store, tx, doubted)


def _failed_nudges_exhausted(store, agent_id, count, activation_id, now):
    """Every tick sees an exhausted failed agent again: the event is written for its failed activation once."""
    match = {"agentId": agent_id, "rule": FAILED_RULE, "activationId": activation_id}
    if store.latest_event(NUDGE_EXHAUSTED, match) is not None:
        return
    with store.write(now) as tx:
        if store.latest_event(NUDGE_EXHAUSTED, match) is None:  # again under the write lock
            _exhausted(store, tx, agent_id, FAILED_RULE, count, activation_id)


def ms_between(earlier_text, now):
    """Milliseconds from a stored timestamp to `now`."""
    return int((now - parse_ts(earlier_text)).total_seconds() * 1000)


def render_template(template, values):
    """Replace `{{ name }}` placeholders; unknown names stay verbatim."""
    def replace(match):
        name = match.group(1)
        return str(values[name]) if name in values else match.group(0)
    return re.sub(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}", replace, template)


def _short_error(text):
    text = " ".join((text or "").split())
    return text[:697] + "..." if len(text) > 700 else text


def _due(dues, since, delay_ms):
    if dues is not None:
        dues.append(since + timedelta(milliseconds=delay_ms))


def _monitor_rules(store, config, agents, now, *, failed, dues=None):
    """The failed-agent (failed=True, step 7) and quiet-agent (failed=False, step 8) monitors of a tick
    (docs/design/scheduler.md)."""
    monitor = config.scheduler.failed_agent_monitor if failed else config.scheduler.quiet_agent_monitor
    if not monitor.enabled:
        return
    event_type = FAILED_MONITOR_EVENT if failed else QUIET_MONITOR_EVENT
    by_id = {a["id"]: a for a in agents}
    for rule in monitor.rules:
        if rule.enabled is False:
            continue
        agent = by_id.get(rule.agent)
        if agent is None or agent["status"] != (AGENT_FAILED if failed else AGENT_QUIET):
            continue
        if rule.recipient != "user" and rule.recipient not in by_id:
            continue
        latest = store.latest_failed_activation(agent["id"]) if failed else None
        if failed and latest is None:
            continue
        since = (latest.get("completedAt") if failed else None) or agent["updatedAt"]
        try:
            elapsed = ms_between(since, now)
        except (TypeError, ValueError):
            continue
        if elapsed < 0:
            continue
        match = {"ruleKey": rule.key, "agent": agent["id"]}
        match.update({"failedActivationId": latest["id"]} if failed else {"quietSince": since})
        last = store.latest_event(event_type, match)
        if last is None and elapsed < rule.initial_delay_ms:
            _due(dues, parse_ts(since), rule.initial_delay_ms)
            continue
        if last is not None and ms_between(last["created_at"], now) < rule.repeat_delay_ms:
            _due(dues, parse_ts(last["created_at"]), rule.repeat_delay_ms)
            continue
        attempt = int(last["data"].get("attempt") or 0) + 1 if last else 1
        values = {"project": store.project_id, "agent": agent["id"], "agentId": agent["id"],
                  "recipient": rule.recipient, "sender": rule.sender, "now": format_ts(now),
                  "initialDelayMs": rule.initial_delay_ms, "repeatDelayMs": rule.repeat_delay_ms,
                  "attempt": attempt, "ruleId": rule.id or rule.key}
        if failed:
            values.update(failedMs=elapsed, failedMinutes=elapsed // 60000, failedSince=since,
                          activationId=latest["id"], error=_short_error(latest.get("error")))
        else:
            values.update(quietMs=elapsed, quietMinutes=elapsed // 60000, quietSince=since)
        data = {"ruleKey": rule.key}
        if rule.id is not None:
            data["ruleId"] = rule.id
        data["agent"] = agent["id"]
        if failed:
            data["failedActivationId"] = latest["id"]
        data.update(recipient=rule.recipient, sender=rule.sender, priority=rule.priority)
        if failed:
            data.update(failedSince=since, failedMs=elapsed)
        else:
            data.update(quietSince=since, quietMs=elapsed)
        data.update(initialDelayMs=rule.initial_delay_ms, repeatDelayMs=rule.repeat_delay_ms, attempt=attempt)
        with store.write(now) as tx:  # the message and the event that dedupes it commit together
            message = _send(store, config, tx, rule.sender, render_template(rule.message, values),
                            recipient=rule.recipient, priority=rule.priority)
            store.add_event(tx, event_type, {**data, "messageId": message["id"]})
        _due(dues, now, rule.repeat_delay_ms)


def _all_quiet_nudge(store, config, now, dues=None):
    """docs/design/scheduler.md (step 9), on a freshly loaded agent list."""
    rule = config.scheduler.all_quiet_nudge
    if not rule.enabled:
        return
    agents = store.list_agents()
    if not agents or rule.target_agent not in {a["id"] for a in agents}:
        return
    if any(a["status"] != AGENT_QUIET for a in agents):
        return
    if store.has_pending_signals(now=now):
        return
    previous = store.latest_signal(KIND_ALL_QUIET_NUDGE, target_agent=rule.target_agent)
    if previous and ms_between(previous["createdAt"], now) < rule.cooldown_ms:
        _due(dues, parse_ts(previous["createdAt"]), rule.cooldown_ms)
        return
    with store.write(now) as tx:
        _emit(store, tx, KIND_ALL_QUIET_NUDGE, rule.target_agent, rule.priority, useful_effect=True, payload={
            "message": rule.message or suzumio_config_schema.ALL_QUIET_MESSAGE,
            "reason": "all agents quiet and no pending signals",
            "agentStatuses": [{"id": a["id"], "status": a["status"]} for a in agents]})
