"""Controller side of tools (docs/design/tools.md): support dispatch for the core tools and local
controller modules, the support-call authorization steps after the activation checks, WebUI entries (the
built-in panels are suzumio_webui_panels'), tool status, scheduler hooks and the store facade that Node-
host callbacks use. The tool registry itself comes from suzumio_registry; the rules the core tools apply
are suzumio_coordination's."""
import logging
import threading

import suzumio_coordination as coordination
import suzumio_mcp
import suzumio_merge_queue
import suzumio_node
import suzumio_webui_panels
from suzumio_errors import BadRequest, ConfigError, Forbidden, NotFound, SuzumioError
from suzumio_http import object_input, optional_boolean, optional_string, required_string
from suzumio_prompts import SEND, SUBMIT, WAIT, answered, clauses, leads, task_part, team_round, written_paths
from suzumio_records import (
    ACT_RUNNING,
    AGENT_RUNNING,
    ENDING_TOOLS,
    EVENT_HOOK_FAILED,
    KIND_MESSAGE,
    RECORDABLE_SIGNAL_STATUSES,
    SIGNAL_CLOSED,
    WAIT_PREFIX,
    checked_priority,
    describe,
    format_ts,
    to_datetime,
)
from suzumio_registry import CONTROLLER_TOOLPACKS, is_allowed, model_tool_name

log = logging.getLogger(__name__)

class ToolpackError(suzumio_node.ToolpackError):
    """A toolpack failed on the controller (resolution, handler or host): HTTP 500."""


# ---------------------------------------------------------------- handler answers

def no_handler(toolpack_id, tool):
    return {"title": "toolpack support", "output": f"Controller side of {toolpack_id} did not handle {tool}.",
            "metadata": {"toolpack": toolpack_id, "tool": tool}}


def no_webui_handler(toolpack_id, entry_id):
    return {"title": "toolpack webui", "output": f"WebUI side of {toolpack_id} did not handle {entry_id}.",
            "metadata": {"toolpack": toolpack_id, "entryId": entry_id}}


# ---------------------------------------------------------------- signal requests

def signal_request(item):
    """docs/design/tools.md: validate one signal request; returns record_signal keyword args."""
    object_input(item)
    kind = required_string(item, "kind")
    target_agent = optional_string(item.get("targetAgent"))
    target_channel = optional_string(item.get("targetChannel"))
    priority = checked_priority(item["priority"]) if item.get("priority") is not None else None
    useful_effect = optional_boolean(item, "usefulEffect")
    status = item.get("status")
    if status is not None and status not in RECORDABLE_SIGNAL_STATUSES:
        raise BadRequest(f"Invalid signal status: {describe(status)}")
    targeted = (target_agent is not None and target_agent != "user") or target_channel is not None
    if targeted and status == SIGNAL_CLOSED:
        raise BadRequest("Targeted signals cannot be closed; omit the target or omit status")
    payload = item.get("payload") if isinstance(item.get("payload"), dict) else {}
    return {"kind": kind, "target_agent": target_agent, "target_channel": target_channel, "priority": priority,
            "payload": payload, "status": status, "useful_effect": useful_effect,
            "not_before": optional_string(item.get("notBefore"))}


def hook_requests(value):
    """docs/design/tools.md: an array, or an object's array `signals`; anything else → none."""
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict) and isinstance(value.get("signals"), list):
        items = value["signals"]
    else:
        return []
    return [signal_request(item) for item in items]


# ---------------------------------------------------------------- the store facade (docs/design/tools.md)

def store_paths(store):
    project_dir = store.dir
    return {"root": str(project_dir), "db": str(project_dir / "suzumio.sqlite"),
            "artifacts": str(project_dir / "artifacts"), "agents": str(project_dir / "agents")}


def facade_send_message(store, config, data):
    data = object_input(data)
    body = required_string(data, "body")
    key = data.get("idempotencyKey")
    if key is not None and optional_string(key) is None:
        raise BadRequest(f"idempotencyKey must be a non-empty string, got {describe(key)}")
    return coordination.send_message(
        store, config, sender=optional_string(data.get("sender")) or "user",
        recipient=optional_string(data.get("recipient")), channel=optional_string(data.get("channel")),
        priority=data.get("priority"), body=body, source_agent=optional_string(data.get("sourceAgent")),
        source_activation=optional_string(data.get("sourceActivation")), idempotency_key=key)


def facade_record_signal(store, config, data, source_agent=None, source_activation=None):
    request = signal_request(data)
    return coordination.record_signal(store, config, request.pop("kind"), source_agent=source_agent,
                                      source_activation=source_activation, **request)


def facade_callbacks(store, config, source_agent=None, source_activation=None):
    """Host callback name → callable (docs/design/tools.md), bound to one project and caller. Reads run on
    the store's read-only connections (`store.db.all` and `store.db.get` cannot change a row)."""
    def run(sql, *params):
        return store.db_run(sql, list(params))

    def has_pending_for(agent_id, include_delayed=False):
        return store.has_pending_signals_for_agent(agent_id, include_delayed=bool(include_delayed))

    def record(data):
        return facade_record_signal(store, config, data, source_agent, source_activation)

    return {
        "store.config": store.config,
        "store.projectRow": store.project,
        "store.projectStats": store.project_stats,
        "store.listAgents": lambda: store.list_agents(include_tokens=True),
        "store.requireAgent": lambda agent_id: store.agent(agent_id, include_token=True),
        "store.sendMessage": lambda data: facade_send_message(store, config, data),
        "store.recordSignal": lambda data: facade_record_signal(store, config, data),
        "store.listMessages": lambda limit=100: store.list_messages(limit, full_body=True),
        "store.message": store.message,
        "store.listEvents": lambda limit=100: store.list_events(limit),
        "store.appendEvent": lambda event_type, data=None: store.append_event(event_type, data or {}),
        "store.hasPendingSignals": store.has_pending_signals,
        "store.hasPendingSignalsForAgent": has_pending_for,
        "store.db.all": lambda sql, *params: store.db_all(sql, list(params)),
        "store.db.get": lambda sql, *params: store.db_get(sql, list(params)),
        "store.db.run": run,
        "context.recordSignal": record,
        "context.hasPendingSignals": store.has_pending_signals,
        "context.hasPendingSignalsForAgent": has_pending_for,
    }


# ---------------------------------------------------------------- core tools (docs/design/tools.md)

def self_message_refusal(agent):
    """What an agent that messages itself is told: delivered, the message would only wake it again with nothing
    new (docs/operations.md#runaways). It names only the ending tools this agent may call."""
    endings = [tool for tool in ENDING_TOOLS if is_allowed(tool, agent["tools"])]
    text = f"You are {agent['id']}: a message to yourself is not delivered. Do the work now with your tools"
    return text + (f", or end with {' or '.join(model_tool_name(t) for t in endings)}." if endings else ".")


def _said(text):
    return " ".join(text.split()).casefold().rstrip(".!?")


def _pieces(body):
    """A message's words as said whole and in its lines, sentences and clauses (split after . ; : ! ?):
    "Say hello." is one piece, so "hello" is not an echo of it."""
    return {_said(part) for part in [body, *clauses(body, colon=True)] if part.strip()}


def echo_refusal(store, config, agent_id, activation_id, body, recipient=None):
    """What an agent that sends back a message it was given is told, or None. Measured with a 1.5B model: told
    "Please begin.", it sent "Please begin." on to the next agent, which did the same, and no one worked. Told
    what the project's task says of the recipient, the same model wrote that agent's assignment. An echo is
    the body of a message the agent received, in any activation (the coordinator, woken by a poet's notice,
    sent the user's "Please begin." on again), or a part of one delivered to this activation (it passed a
    worker's wait notice, "Reason: Please specify a recipient or channel.", on as the other's assignment)."""
    said = _said(body)
    if not said or activation_id is None:
        return None
    now = [s.get("payload") or {} for s in store.signals_delivered_to(activation_id, KIND_MESSAGE)]
    earlier = store.messages_received(agent_id, limit=50)
    for payload in [p for p in now if said in _pieces(str(p.get("body") or ""))] + \
            [p for p in earlier if said == _said(str(p.get("body") or ""))]:
        sender = "the user" if payload.get("sender") == "user" else payload.get("sender")
        text = f'Not sent: "{body.strip()}" only repeats what {sender} sent you.'
        task = store.project()["task"]
        part = task_part(task, recipient) if recipient else None
        if part:
            return (f'{text} What the project task asks of {recipient}: "{part}". Send {recipient} that '
                    "assignment in your own words.")
        own = None if leads(agent_id, store.list_agents(), config) else task_part(task, agent_id)
        if own:
            return f'{text} What the project task asks of you: "{own}". Do it now, with your tools.'
        return (f"{text} Do what it asks yourself, now, with your tools; to hand work to another agent, write "
                "out its assignment: what to make and where to put it.")
    return None


def send_message_tool(store, config, agent, activation_id, data):
    data = object_input(data)
    body = required_string(data, "body")
    priority = checked_priority(data.get("priority"))
    recipient = optional_string(data.get("recipient"))
    channel = optional_string(data.get("channel"))
    if recipient is None and channel is None:
        raise BadRequest(missing_recipient(store, config, agent))
    if recipient == agent["id"]:
        if channel is not None:
            raise BadRequest(f'Message cannot have both recipient and channel: drop "recipient" to post to {channel} '
                             f"(you are {agent['id']}: a message to yourself is not delivered)")
        raise BadRequest(self_message_refusal(agent))
    echo = echo_refusal(store, config, agent["id"], activation_id, body, recipient)
    if echo is not None:
        raise BadRequest(echo)
    coordination.check_policy(config, agent["id"], recipient, channel, priority)
    message = coordination.send_message(store, config, sender=agent["id"], recipient=recipient, channel=channel,
                                        priority=priority, body=body, source_agent=agent["id"],
                                        source_activation=activation_id)
    return {"title": "message sent", "output": f"Message sent and delivered: {message['id']}",
            "metadata": {"messageId": message["id"]}}


def missing_recipient(store, config, agent):
    """The refusal of a message with neither recipient nor channel, naming what the agent may give."""
    others = [a for a in store.agent_ids() if a != agent["id"]] + ["user"]
    text = "Message needs recipient or channel: give recipient (" + ", ".join(others) + ")"
    return text + (" or channel (" + ", ".join(config.channels) + ")" if config.channels else "")


def files_written(store, activation_id):
    """The paths this activation's completed file.write and file.patch calls wrote, in order, once each."""
    return written_paths(store.tool_calls_of(activation_id)) if activation_id else []


def leader_round(store, agent, agents, task, delivering=()):
    """team_round's (paragraph, reminder) for the leading `agent` once everyone it gave work to has answered
    it, else None; the files are those each wrote before its answer, so a replay reads the same."""
    sent, received = store.last_exchanges(agent["id"], delivering)
    found = answered(agent["id"], agents, task, sent, received)
    if found is None:
        return None
    given, idle = found
    files = [path for other in given for path in written_paths(store.write_calls_of(other, received[other]))]
    return team_round(given, idle, files, task, is_allowed(SEND, agent["tools"]), is_allowed(SUBMIT, agent["tools"]))


def wait_refusal(store, config, agent, activation_id):
    """Why a wait would leave the work undone, or None: refused once per activation, so a second wait is
    always taken (docs/real-models.md#waits-that-leave-the-work-undone). Measured with a 1.5B model in a
    team of three: a worker waited having written nothing, and the coordinator waited when both poems were
    written instead of submitting them. A coordinator is refused only when everyone it gave work to has
    answered (nothing is outstanding): one that waits while a part is still being made, before giving every
    agent the task names its work, is not, since in a pipeline (parts first, then the review) that is the
    right wait."""
    calls = store.tool_calls_of(activation_id) if activation_id else []
    if any(call["tool"] == WAIT and call["status"] == "failed" for call in calls):
        return None
    agents = store.list_agents()
    others = [a["id"] for a in agents if a["id"] != agent["id"]]
    if not others:
        return None
    task = store.project()["task"]
    wait = model_tool_name(WAIT)
    if leads(agent["id"], agents, config):
        found = leader_round(store, agent, agents, task)
        if found is not None and found[1] is not None:  # nothing outstanding, and a next step it can take
            return (f"Not waiting yet. {found[0]} Nothing more is coming unless you act; to wait anyway, call "
                    f"{wait} again.")
        return None
    if any(call["status"] == "completed" for call in calls):
        return None
    asked = [s["payload"] for s in store.signals_delivered_to(activation_id, KIND_MESSAGE)
             if isinstance(s.get("payload"), dict) and s["payload"].get("sender") != agent["id"]]
    if not asked:
        return None
    sender = asked[-1].get("sender")
    text = f'Not waiting yet: you have done nothing of what {sender} asked: "{str(asked[-1].get("body")).strip()}".'
    part = task_part(task, agent["id"])
    if part:
        text += f' What the project task asks of you: "{part}".'
    return text + f" Do it now with your tools, then report it; to wait anyway, call {wait} again."


def wait_for_signal_tool(store, config, agent, activation_id, data):
    data = object_input(data)
    refusal = wait_refusal(store, config, agent, activation_id)
    if refusal is not None:
        raise BadRequest(refusal)
    reason = optional_string(data.get("reason")) or WAIT_PREFIX
    pm = optional_string(data.get("pm")) or config.communication.coordinator_agent
    notify_pm = optional_boolean(data, "notifyPm")
    if notify_pm is None:
        notify_pm = agent["id"] != pm
    if agent["id"] == config.communication.coordinator_agent:
        # The coordinator reports by submitting, not by waiting. The lab's model, coordinating, waited with
        # `pm` set to a worker; each notice woke that worker, whose own notice woke it again, without end.
        notify_pm = False
    waited = coordination.declare_wait(store, config, agent["id"], activation_id, reason=reason, pm=pm,
                                       notify_pm=notify_pm, written=files_written(store, activation_id))
    metadata = {"reason": waited["reason"]}
    if waited.get("message"):
        metadata.update(notifiedAgent=waited["notifiedAgent"], messageId=waited["message"]["id"])
        output = f"Waiting; notified {metadata['notifiedAgent']} with message {metadata['messageId']}."
    else:
        output = "Waiting; a future signal will start the next activation."
    return {"title": "waiting for signal", "output": output, "metadata": metadata}


def submit_tool(store, config, agent, activation_id, data):
    report = required_string(object_input(data), "report")
    report_path = coordination.submit_report(store, agent["id"], activation_id, report)["reportPath"]
    return {"title": "project submitted", "output": f"Submitted for user approval; report at {report_path}",
            "metadata": {"reportPath": report_path}}


CORE_HANDLERS = {
    "messages.send": send_message_tool,
    "coordination.wait_for_signal": wait_for_signal_tool,
    "completion.submit": submit_tool,
}


# ---------------------------------------------------------------- the runtime

class ToolpackRuntime:
    """Controller-side tool operations for every project; owns the (lazy) Node host."""

    def __init__(self, configs, node_host=None, mcp=None):
        self._node_host = node_host
        self.configs = configs  # the runtime's one ConfigCache (suzumio_config), shared with the scheduler
        self._node_lock = threading.Lock()
        self.mcp = mcp  # suzumio_mcp.McpHub: controller-side MCP sessions, or None
        # The one merge queue of the runtime (docs/teams-that-write-code.md); its thread starts with its first request.
        self.merge_queue = suzumio_merge_queue.MergeQueue(configs, suzumio_merge_queue.run_check)

    @property
    def node(self):
        with self._node_lock:
            if self._node_host is None:
                self._node_host = suzumio_node.NodeHost()
            return self._node_host

    def close(self):
        with self._node_lock:
            host, self._node_host = self._node_host, None
        if host is not None:
            host.close()
        if self.mcp is not None:
            self.mcp.close()
        self.merge_queue.close()

    # -- registry

    def registry(self, store):
        """The project's toolpacks (docs/design/tools.md), re-resolved whenever a local manifest changes on disk;
        a failure is a 500."""
        try:
            return self.configs.get(store).registry
        except ConfigError as exc:
            raise ToolpackError(exc.message) from exc

    def check_tool_call(self, store, agent, tool):
        """The registry checks of `/runner/tool-calls/start` (docs/design/tools.md)."""
        registry = self.registry(store)
        if registry.tool(tool) is None and not sandbox_mcp_tool(registry, tool):
            raise NotFound(f"Unknown tool: {tool}")
        if not is_allowed(tool, agent["tools"]):
            raise Forbidden(f"Tool not allowed for {agent['id']}: {tool}")

    def _toolpack(self, store, toolpack_id):
        pack = self.registry(store).toolpack(toolpack_id)
        if pack is None:
            raise NotFound(f"Unknown toolpack: {toolpack_id}")
        return pack

    # -- support (docs/design/tools.md)

    def support(self, store, agent, activation_id, toolpack_id, tool, tool_input):
        """Steps 8–12 of the support chain; the caller has run steps 1–7."""
        pack = self._toolpack(store, toolpack_id)
        if tool not in pack.tool_names:
            raise NotFound(f"Tool {tool} is not in toolpack {toolpack_id}")
        if not is_allowed(tool, agent["tools"]):
            raise Forbidden(f"Tool not allowed for {agent['id']}: {tool}")
        if pack.builtin and pack.id in CONTROLLER_TOOLPACKS:
            return handler_result(suzumio_merge_queue.run_repo_tool, self.merge_queue, store, self.configs.get(store),
                                  agent, activation_id, tool, tool_input)
        if pack.builtin:
            handler = CORE_HANDLERS.get(tool) if pack.id == "core" else None
            if handler is None:
                return no_handler(pack.id, tool)
            return handler_result(handler, store, self.configs.get(store), agent, activation_id, tool_input)
        if pack.kind == "mcp":
            return self.mcp_call(pack, tool, tool_input)
        context = {"project": store.project_id, "paths": store_paths(store), "agent": agent,
                   "activationId": activation_id}
        return self.node.support(pack.controller_module, pack.id, tool, tool_input, context,
                                 facade_callbacks(store, self.configs.get(store), agent["id"], activation_id))

    def mcp_call(self, pack, tool, tool_input):
        """One tools/call on the controller's session of an MCP toolpack; a failure is one line (500)."""
        if self.mcp is None:
            raise ToolpackError(f"MCP toolpack {pack.id} needs the controller's MCP sessions")
        try:
            return self.mcp.call(pack.id, pack.mcp, tool[len(pack.id) + 1:], tool_input)
        except suzumio_mcp.McpError as exc:
            raise ToolpackError(str(exc)) from exc

    def toolpack_listing(self, store):
        """Every toolpack of a project with kind, state and tool names (`suzumio toolpacks`)."""
        rows = []
        for pack in self.registry(store).toolpacks:
            state = "ok"
            if pack.kind == "mcp" and pack.mcp_where == "runner":
                state = "in the sandbox (tools listed by the runner)"
            elif pack.kind == "mcp":
                state = suzumio_mcp.STATE_UP if pack.mcp_listed else "down: " + (pack.mcp_error or "not listed")
                if pack.mcp_listed and self.mcp is not None:
                    state = self.mcp.state(pack.id, pack.mcp)
            rows.append({"id": pack.id, "kind": pack.kind, "state": state, "tools": pack.tool_names})
        return rows

    # -- WebUI (docs/design/tools.md)

    def webui_entries(self, store):
        return [entry.to_json() for entry in self.registry(store).webui_entries()]

    def invoke_webui(self, store, toolpack_id, entry_id, data):
        pack = self._toolpack(store, toolpack_id)
        if pack.webui_entry(entry_id) is None:
            raise NotFound(f"Unknown WebUI entry {entry_id} in toolpack {toolpack_id}")
        if pack.builtin:
            handler = suzumio_webui_panels.BUILTIN_WEBUI.get((pack.id, entry_id))
            if handler is None:
                return no_webui_handler(pack.id, entry_id)
            return handler_result(handler, store, self.configs.get(store), data)
        context = {"project": store.project_id, "paths": store_paths(store)}
        return self.node.webui(pack.controller_module, pack.id, entry_id, data, context,
                               facade_callbacks(store, self.configs.get(store)))

    # -- tool status (docs/http-api.md)

    def tool_status(self, store):
        registry = self.registry(store)
        agents = store.list_agents()
        entries = {}
        for tool in registry.tools:
            entries[tool.name] = {
                "tool": tool.name, "toolpackId": tool.toolpack_id,
                "toolpackKind": registry.toolpack(tool.toolpack_id).kind, "description": tool.description,
                "enabledForAgents": [a["id"] for a in agents if is_allowed(tool.name, a["tools"])]}
        stats = store.tool_call_stats()
        for name, counts in stats.items():
            entries.setdefault(name, {"tool": name, "enabledForAgents": []}).update(counts)
        report_path = store.project().get("submitted_report")
        if report_path:
            entries.setdefault("completion.submit", {"tool": "completion.submit", "enabledForAgents": []})
        for name, entry in entries.items():
            for key in ("callCount", "runningCount", "completedCount", "failedCount"):
                entry.setdefault(key, 0)
            if name == "completion.submit" and report_path:
                entry["submittedReportPath"] = report_path
        return [entries[name] for name in sorted(entries)]

    # -- scheduler hooks (docs/design/tools.md, docs/design/scheduler.md)

    def run_hooks(self, store, config, now):
        """Run every local toolpack's hook once (`config` is the tick's ProjectConfig); a failing hook
        records scheduler.hook_failed and the others still run. Merge requests a stopped controller left
        waiting are handed to the merge queue."""
        if config.repository is not None and store.merge_requests(waiting_only=True):
            self.merge_queue.wake(store)
        try:
            packs = [pack for pack in config.toolpacks if pack.has_scheduler_hook]
        except ConfigError as exc:
            store.append_event(EVENT_HOOK_FAILED, {"toolpackId": "", "error": exc.message})
            return
        if not packs:
            return
        agents = hook_agents(store)
        for pack in packs:
            context = {"project": store.project_id, "paths": store_paths(store), "toolpackId": pack.id,
                       "now": format_ts(to_datetime(now)), "agents": agents}
            try:
                value = self.node.scheduler_tick(pack.controller_module, pack.id, context,
                                                 facade_callbacks(store, config))
                for request in hook_requests(value):
                    coordination.record_signal(store, config, request.pop("kind"), **request)
            except SuzumioError as exc:
                log.warning("scheduler hook of %s in %s failed: %s", pack.id, store.project_id, exc.message)
                store.append_event(EVENT_HOOK_FAILED, {"toolpackId": pack.id, "error": exc.message})


def sandbox_mcp_tool(registry, tool):
    """True for `<id>.<name>` of a `where: runner` MCP toolpack: only the runner knows those names."""
    return any(pack.kind == "mcp" and pack.mcp_where == "runner" and tool.startswith(pack.id + ".")
               and len(tool) > len(pack.id) + 1 for pack in registry.toolpacks)


def handler_result(handler, *args):
    """Run a built-in handler: whatever it raises is a handler error, HTTP 500 (docs/http-api.md)."""
    try:
        return handler(*args)
    except SuzumioError as exc:
        raise ToolpackError(exc.message) from exc


def hook_agents(store):
    """docs/design/tools.md context `agents`, with activeActivationId always present and modelAlive."""
    agents = []
    for agent in store.list_agents():
        active = agent.get("activeActivationId")
        alive = (agent["status"] == AGENT_RUNNING and active is not None
                 and store.activation(active)["status"] == ACT_RUNNING)
        agents.append({"id": agent["id"], "displayName": agent["displayName"], "role": agent["role"],
                       "status": agent["status"], "activeActivationId": active, "modelAlive": alive,
                       "updatedAt": agent["updatedAt"]})
    return agents
