"""Runaways (docs/operations.md#runaways): the loop guards checked at every tool-call start (the same call
repeated, a pair of agents bouncing messages without an artifact change), what a trip does (the call
refused, `guard.tripped`, the activation cancelled and the agent paused), resuming a paused agent, and the
concurrency caps of a project and of the whole root."""
import contextlib
import logging
import os
import threading

import suzumio_coordination as coordination
import suzumio_store_guards as rows
from suzumio_errors import BadRequest, Conflict
from suzumio_records import ENDING_TOOLS, format_ts, parse_ts, public_agent_json, to_datetime

log = logging.getLogger(__name__)

REPEATED_TOOL_CALL, PING_PONG = "repeatedToolCall", "pingPong"
GUARD_TRIPPED, AGENT_RESUMED = "guard.tripped", "agent.resumed"
MESSAGE_TOOL = "messages.send"
PROJECT_CAP, ROOT_CAP = "project", "root"
CAP_RECHECK_SECONDS = 1.0  # a project held by the root cap is ticked again this soon: another project's end frees it


# ---------------------------------------------------------------- the guards

def _artifacts_changed_since(store, stamp):
    """Whether a file or folder under the project's artifacts (a folder's mtime moves when an entry is
    added, removed or renamed) was modified after the stored timestamp `stamp`. Stops at the first one."""
    after = parse_ts(stamp).timestamp()
    for folder, _dirs, files in os.walk(store.artifacts_root):
        for path in [folder, *(os.path.join(folder, name) for name in files)]:
            try:
                if os.stat(path).st_mtime > after:
                    return True
            except OSError:  # removed while walking: its folder's mtime records that
                continue
    return False


def _later(*stamps):
    present = [stamp for stamp in stamps if stamp is not None]
    return max(present) if present else None


def _repeated_call(store, agent_id, tool, tool_input, limit):
    if tool in ENDING_TOOLS:  # waiting or submitting again is how an agent ends, not a loop
        return None
    # The same answer to each of several messages is not a loop: only calls since the newest one count.
    since = _later(rows.guards_since(store, agent_id), rows.news_delivered_at(store, agent_id))
    calls = [(tool, tool_input), *rows.recent_tool_calls(store, agent_id, since, 2 * limit - 1)]
    if len(calls) >= limit and all(call == calls[0] for call in calls[:limit]):
        return {"rule": REPEATED_TOOL_CALL, "limit": limit, "tool": tool,
                "reason": f"{tool} was called {limit} times in a row with the same input"}
    # Two calls in turn are the same loop: the lab's model wrote a file to a path it was refused, then to the
    # path the refusal gave, then to the refused one again, without end.
    pair = calls[:2 * limit]
    if len(pair) == 2 * limit and calls[0] != calls[1] and all(call == pair[i % 2] for i, call in enumerate(pair)):
        return {"rule": REPEATED_TOOL_CALL, "limit": limit, "tool": tool,
                "reason": f"{tool} and {calls[1][0]} were called {limit} times each, in turn, with the same inputs"}
    return None


def _ping_pong(store, agent_id, tool, tool_input, limit):
    recipient = tool_input.get("recipient") if isinstance(tool_input, dict) else None
    if (tool != MESSAGE_TOOL or not isinstance(recipient, str) or recipient in ("user", agent_id)
            or store.agent_row(recipient) is None):
        return None
    since = _later(rows.guards_since(store, agent_id), rows.guards_since(store, recipient))
    oldest = rows.pair_message_time(store, agent_id, recipient, since, limit - 1)
    if oldest is None:
        return None  # the common case: too few messages to look at the artifacts at all
    if _artifacts_changed_since(store, oldest):
        return None
    return {"rule": PING_PONG, "limit": limit, "tool": tool, "peer": recipient,
            "reason": f"{agent_id} and {recipient} exchanged {limit} messages without any artifact change"}


def tripped_guard(store, config, agent_id, tool, tool_input):
    """The guard this tool call would trip (the rule, its limit, a reason), or None. The call that reaches
    a limit is the one refused: `repeatedToolCall` N counts N identical calls in a row of one agent (or two
    calls in turn, N times each) since it was last resumed or last heard something new (a message, another
    agent's signal; never a nudge); `pingPong` M counts the direct messages of a pair, either way, since the
    newest artifact change (or either agent's resume)."""
    limits = config.guards(agent_id)
    for rule, check in ((REPEATED_TOOL_CALL, _repeated_call), (PING_PONG, _ping_pong)):
        if limits[rule] is not None:
            tripped = check(store, agent_id, tool, {} if tool_input is None else tool_input, limits[rule])
            if tripped is not None:
                return tripped
    return None


def refusal_text(tripped):
    return (f"Loop guard {tripped['rule']} tripped: {tripped['reason']}. The tool did not run; this activation "
            "ends and you are paused until a person resumes you.")


def trip(store, agent_id, activation_id, tool, tool_input, tripped, call_key=None, now=None):
    """In one transaction: the refused call recorded as failed, `guard.tripped`, the agent paused and its
    activation cancelled. Returns the tool-call start answer that tells the runner to end."""
    text = refusal_text(tripped)
    with store.write(now) as tx:
        started = store.start_tool_call(agent_id, activation_id, tool, tool_input, call_key=call_key)
        store.record_tool_result(tx, agent_id, activation_id, started["toolCallId"], "failed", None, text)
        data = {"rule": tripped["rule"], "agentId": agent_id, "activationId": activation_id,
                "toolCallId": started["toolCallId"], "limit": tripped["limit"], "tool": tool,
                "reason": tripped["reason"], **({"peer": tripped["peer"]} if "peer" in tripped else {})}
        rows.set_paused(tx, store, agent_id, {**data, "at": tx.ts})
        store.add_event(tx, GUARD_TRIPPED, data)
        coordination.cancel_in(store, tx, activation_id, f"Loop guard {tripped['rule']} tripped: {tripped['reason']}")
    log.warning("loop guard %s tripped for %s/%s: %s", tripped["rule"], store.project_id, agent_id,
                tripped["reason"])
    return {"toolCallId": started["toolCallId"], "guard": data, "end": True, "output": text}


def resume(store, agent_id, via="api", now=None):
    """Let a paused agent work again; its guards count afresh. Conflict when it is not paused."""
    store.require_agent(agent_id)
    with store.write(now) as tx:
        cleared = rows.clear_paused(tx, store, agent_id)
        if cleared is None:
            raise Conflict(f"Agent {agent_id} is not paused")
        store.add_event(tx, AGENT_RESUMED, {"agentId": agent_id, "rule": cleared.get("rule"), "resumedBy": via})
    log.info("agent %s of %s resumed via %s", agent_id, store.project_id, via)
    return public_agent_json(store.agent_row(agent_id))


def check_resume(body):
    """An optional JSON object body; nothing in it is read."""
    if body is not None and not isinstance(body, dict):
        raise BadRequest("Expected a JSON object")


# ---------------------------------------------------------------- the caps

class Caps:
    """The concurrency caps: a project's `limits.maxConcurrentActivations` and the root's
    `serve --max-activations`. A project's ticks are serial already; the root cap's check and the start it
    allows are kept together across the projects' ticks, which run on different threads, by one lock."""

    def __init__(self, root, max_activations=None):
        if max_activations is not None and (isinstance(max_activations, bool) or int(max_activations) < 1):
            raise BadRequest("max activations must be a whole number of at least 1")
        self.root = root
        self.max_activations = None if max_activations is None else int(max_activations)
        self._lock = threading.Lock()

    def starting(self):
        """The lock a start holds while it checks the caps and records its activation; none without a root
        cap, so the starts of different projects never wait on each other for nothing."""
        return self._lock if self.max_activations is not None else contextlib.nullcontext()

    def root_running(self):
        return sum(len(self.root.open_project(name).running_activations()) for name in self.root.list_projects())

    def holding(self, store, config):
        """Which cap (PROJECT_CAP, ROOT_CAP) keeps a new activation of this project from starting, or None."""
        cap = config.max_concurrent_activations
        if cap is not None and len(store.running_activations()) >= cap:
            return PROJECT_CAP
        if self.max_activations is not None and self.root_running() >= self.max_activations:
            return ROOT_CAP
        return None


def concurrency(store, config, caps=None, now=None):
    """What the control room shows: each cap, what runs, and the agents whose ready signals wait for a free
    place (not paused, no running activation) while a cap is full."""
    running = store.running_activations()
    project_cap = config.max_concurrent_activations
    root_cap = caps.max_activations if caps is not None else None
    root_running = caps.root_running() if caps is not None and root_cap is not None else None
    holding = None
    if project_cap is not None and len(running) >= project_cap:
        holding = PROJECT_CAP
    elif root_cap is not None and root_running >= root_cap:
        holding = ROOT_CAP
    paused = rows.paused_agents(store)
    waiting = []
    if holding is not None:
        waiting = [{"agentId": agent_id, "signals": count, "since": since, "cap": holding}
                   for agent_id, count, since in rows.ready_without_activation(store, format_ts(to_datetime(now)))
                   if agent_id not in paused]
    answer = {"maxConcurrentActivations": project_cap, "running": len(running),
              "rootMaxActivations": root_cap, "rootRunning": root_running, "waiting": waiting,
              "paused": [{"agentId": agent_id, **record} for agent_id, record in sorted(paused.items())]}
    return {key: value for key, value in answer.items() if value is not None}
