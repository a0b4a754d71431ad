"""Controller side of tools (tools.md §2–4, §10–15): support dispatch for the core tools and local
controller modules, the support-call authorization steps after the activation checks, WebUI entries
and the built-in WebUI controls, tool status, scheduler hooks and the store facade that Node-host
callbacks use. The tool registry itself comes from suzumio_registry. Imported by suzumio_scheduler,
suzumio_runner_support, suzumio_api and suzumio.py."""
import json
import logging
import math
import threading
from pathlib import Path

import suzumio_mcp
import suzumio_node
from suzumio_config import ConfigCache
from suzumio_errors import BadRequest, ConfigError, Forbidden, NotFound, SuzumioError
from suzumio_records import (
    ACT_RUNNING,
    AGENT_RUNNING,
    DEFAULT_PRIORITY,
    EVENT_HOOK_FAILED,
    PRIORITIES,
    RECORDABLE_SIGNAL_STATUSES,
    SIGNAL_CLOSED,
    SIGNAL_DELIVERED,
    SIGNAL_PENDING,
    SIGNAL_STATUSES,
    WAIT_PREFIX,
    coordinator_of,
    format_ts,
    to_datetime,
    truncate,
)
from suzumio_registry import is_allowed

log = logging.getLogger(__name__)

MESSAGE_PREVIEW_CHARS = 12000


class ToolpackError(suzumio_node.ToolpackError):
    """A toolpack failed on the controller (resolution, handler or host): HTTP 500."""


# ---------------------------------------------------------------- text and argument helpers

def one_line(text, limit):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit].rstrip() + "..."


def describe(value):
    """tools.md §1.1 `<value>`: strings as-is, anything else as JSON text (2, not 2.0)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, ensure_ascii=False)


def object_input(value):
    if not isinstance(value, dict):
        raise BadRequest("Tool input must be an object")
    return value


def required_string(data, key):
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{key} is required")
    return value


def optional_string(value):
    return value if isinstance(value, str) and value.strip() else None


def optional_boolean(data, key):
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, bool):
        raise BadRequest(f"Expected boolean, got {describe(value)}")
    return value


def bounded_input(data, key, default, cap):
    """tools.md §1.1 positive number: absent → default; finite > 0 → min(floor, cap), at least 1."""
    if key not in data:
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadRequest("Expected a positive number")
    return max(1, min(math.floor(value), cap))


def check_priority(value):
    """Absent, null or "" → P3; otherwise one of P0–P3."""
    if value is None or value == "":
        return DEFAULT_PRIORITY
    if value not in PRIORITIES:
        raise BadRequest(f"Invalid priority: {describe(value)}")
    return value


def no_handler(toolpack_id, tool):
    return {"title": "toolpack support", "output": f"Controller side of {toolpack_id} did not handle {tool}.",
            "metadata": {"toolpack": toolpack_id, "tool": tool}}


def no_webui_handler(toolpack_id, entry_id):
    return {"title": "toolpack webui", "output": f"WebUI side of {toolpack_id} did not handle {entry_id}.",
            "metadata": {"toolpack": toolpack_id, "entryId": entry_id}}


# ---------------------------------------------------------------- signal requests

def signal_request(item):
    """tools.md §10.3 step 4: validate one signal request; returns record_signal keyword args."""
    object_input(item)
    kind = required_string(item, "kind")
    target_agent = optional_string(item.get("targetAgent"))
    target_channel = optional_string(item.get("targetChannel"))
    priority = check_priority(item["priority"]) if item.get("priority") is not None else None
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
    """tools.md §10.3 step 3: an array, or an object's array `signals`; anything else → none."""
    if isinstance(value, list):
        items = value
    elif isinstance(value, dict) and isinstance(value.get("signals"), list):
        items = value["signals"]
    else:
        return []
    return [signal_request(item) for item in items]


# ---------------------------------------------------------------- the store facade (tools.md §15.3)

def store_paths(store):
    project_dir = store.dir
    return {"root": str(project_dir), "db": str(project_dir / "suzumio.sqlite"),
            "artifacts": str(project_dir / "artifacts"), "agents": str(project_dir / "agents")}


def facade_send_message(store, data):
    data = object_input(data)
    body = required_string(data, "body")
    return store.send_message(
        sender=optional_string(data.get("sender")) or "user", recipient=optional_string(data.get("recipient")),
        channel=optional_string(data.get("channel")), priority=check_priority(data.get("priority")), body=body,
        source_agent=optional_string(data.get("sourceAgent")),
        source_activation=optional_string(data.get("sourceActivation")))


def facade_record_signal(store, data, source_agent=None, source_activation=None):
    request = signal_request(data)
    return store.record_signal(request.pop("kind"), source_agent=source_agent,
                               source_activation=source_activation, **request)


def facade_callbacks(store, source_agent=None, source_activation=None):
    """Host callback name → callable (tools.md §15.3), bound to one project and caller."""
    def run(sql, *params):
        return store.db_run(sql, list(params))

    def has_pending_for(agent_id, include_delayed=False):
        return store.has_pending_signals_for_agent(agent_id, include_delayed=bool(include_delayed))

    def record(data):
        return facade_record_signal(store, data, source_agent, source_activation)

    return {
        "store.config": store.config,
        "store.projectRow": store.project,
        "store.projectStats": store.project_stats,
        "store.listAgents": lambda: store.list_agents(include_tokens=True),
        "store.requireAgent": lambda agent_id: store.agent(agent_id, include_token=True),
        "store.sendMessage": lambda data: facade_send_message(store, data),
        "store.recordSignal": lambda data: facade_record_signal(store, data),
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


# ---------------------------------------------------------------- core tools (tools.md §4)

def communication(config):
    settings = config.get("communication") or {}
    return (coordinator_of(config), bool(settings.get("restrictNonCoordinatorToCoordinator")),
            settings.get("nonCoordinatorMaxPriority") or "P2")


def check_policy(config, caller, recipient, channel, priority):
    """store.md §4.3 for the messages.send tool."""
    coordinator, restricted, max_priority = communication(config)
    if not restricted or caller == coordinator:
        return
    if channel is not None:
        raise BadRequest("Communication policy: channels are not allowed for non-coordinator agents; "
                         f"send a direct message to {coordinator}.")
    if recipient != coordinator:
        raise BadRequest(f"Communication policy: non-coordinator agents may message only {coordinator}.")
    if PRIORITIES.index(priority) < PRIORITIES.index(max_priority):
        raise BadRequest(f"Communication policy: non-coordinator agents may use {max_priority} or lower; "
                         f"{priority} is not allowed.")


def send_message_tool(store, agent, activation_id, data):
    data = object_input(data)
    body = required_string(data, "body")
    priority = check_priority(data.get("priority"))
    recipient = optional_string(data.get("recipient"))
    channel = optional_string(data.get("channel"))
    check_policy(store.config(), agent["id"], recipient, channel, priority)
    message = store.send_message(sender=agent["id"], recipient=recipient, channel=channel, priority=priority,
                                 body=body, source_agent=agent["id"], source_activation=activation_id)
    return {"title": "message sent", "output": f"Message sent and delivered: {message['id']}",
            "metadata": {"messageId": message["id"]}}


def wait_for_signal_tool(store, agent, activation_id, data):
    data = object_input(data)
    coordinator = communication(store.config())[0]
    reason = optional_string(data.get("reason")) or WAIT_PREFIX
    pm = optional_string(data.get("pm")) or coordinator
    notify_pm = optional_boolean(data, "notifyPm")
    if notify_pm is None:
        notify_pm = agent["id"] != pm
    waited = store.declare_wait(agent["id"], activation_id, reason=reason, pm=pm, notify_pm=notify_pm)
    metadata = {"reason": waited["reason"]}
    if waited.get("message"):
        metadata.update(notifiedAgent=waited["notifiedAgent"], messageId=waited["message"]["id"])
        output = f"Waiting; notified {metadata['notifiedAgent']} with message {metadata['messageId']}."
    else:
        output = "Waiting; a future signal will start the next activation."
    return {"title": "waiting for signal", "output": output, "metadata": metadata}


def submit_tool(store, agent, activation_id, data):
    report = required_string(object_input(data), "report")
    report_path = store.submit_report(agent["id"], activation_id, report)["reportPath"]
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

    def __init__(self, node_host=None, configs=None, mcp=None):
        self._node_host = node_host
        self.configs = configs or ConfigCache()
        self._node_lock = threading.Lock()
        self.mcp = mcp  # suzumio_mcp.McpHub: controller-side MCP sessions (issue 15), or None

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

    # -- registry

    def registry(self, store):
        """The project's toolpacks (tools.md §2.2), re-resolved whenever a local manifest changes on disk;
        a failure is a 500."""
        try:
            return self.configs.get(store).registry
        except ConfigError as exc:
            raise ToolpackError(exc.message) from exc

    def check_tool_call(self, store, agent, tool):
        """The registry checks of `/runner/tool-calls/start` (tools.md §12)."""
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

    # -- support (tools.md §12 steps 8–12)

    def support(self, store, agent, activation_id, toolpack_id, tool, tool_input):
        """Steps 8–12 of the support chain; the caller has run steps 1–7."""
        pack = self._toolpack(store, toolpack_id)
        if tool not in pack.tool_names:
            raise NotFound(f"Tool {tool} is not in toolpack {toolpack_id}")
        if not is_allowed(tool, agent["tools"]):
            raise Forbidden(f"Tool not allowed for {agent['id']}: {tool}")
        if pack.builtin:
            handler = CORE_HANDLERS.get(tool) if pack.id == "core" else None
            if handler is None:
                return no_handler(pack.id, tool)
            return handler_result(handler, store, agent, activation_id, tool_input)
        if pack.kind == "mcp":
            return self.mcp_call(pack, tool, tool_input)
        context = {"project": store.project_id, "paths": store_paths(store), "agent": agent,
                   "activationId": activation_id}
        return self.node.support(pack.controller_module, pack.id, tool, tool_input, context,
                                 facade_callbacks(store, agent["id"], activation_id))

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

    # -- WebUI (tools.md §11)

    def webui_entries(self, store):
        return [entry.to_json() for entry in self.registry(store).webui_entries()]

    def invoke_webui(self, store, toolpack_id, entry_id, data):
        pack = self._toolpack(store, toolpack_id)
        if pack.webui_entry(entry_id) is None:
            raise NotFound(f"Unknown WebUI entry {entry_id} in toolpack {toolpack_id}")
        if pack.builtin:
            handler = BUILTIN_WEBUI.get((pack.id, entry_id))
            if handler is None:
                return no_webui_handler(pack.id, entry_id)
            return handler_result(handler, store, data)
        context = {"project": store.project_id, "paths": store_paths(store)}
        return self.node.webui(pack.controller_module, pack.id, entry_id, data, context, facade_callbacks(store))

    # -- tool status (http-api.md §6.8)

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

    # -- scheduler hooks (tools.md §10.3, scheduler.md §6)

    def run_hooks(self, store, config, now):
        """Run every local toolpack's hook once (`config` is the tick's ProjectConfig); a failing hook
        records scheduler.hook_failed and the others still run."""
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
                                                 facade_callbacks(store))
                for request in hook_requests(value):
                    store.record_signal(request.pop("kind"), **request)
            except SuzumioError as exc:
                log.warning("scheduler hook of %s in %s failed: %s", pack.id, store.project_id, exc.message)
                store.append_event(EVENT_HOOK_FAILED, {"toolpackId": pack.id, "error": exc.message})


def sandbox_mcp_tool(registry, tool):
    """True for `<id>.<name>` of a `where: runner` MCP toolpack: only the runner knows those names."""
    return any(pack.kind == "mcp" and pack.mcp_where == "runner" and tool.startswith(pack.id + ".")
               and len(tool) > len(pack.id) + 1 for pack in registry.toolpacks)


def handler_result(handler, *args):
    """Run a built-in handler: whatever it raises is a handler error, HTTP 500 (http-api.md §2.3)."""
    try:
        return handler(*args)
    except SuzumioError as exc:
        raise ToolpackError(exc.message) from exc


def hook_agents(store):
    """tools.md §10.3 context `agents`, with activeActivationId always present and modelAlive."""
    agents = []
    for agent in store.list_agents():
        active = agent.get("activeActivationId")
        alive = (agent["status"] == AGENT_RUNNING and active is not None
                 and store.activation(active)["status"] == ACT_RUNNING)
        agents.append({"id": agent["id"], "displayName": agent["displayName"], "role": agent["role"],
                       "status": agent["status"], "activeActivationId": active, "modelAlive": alive,
                       "updatedAt": agent["updatedAt"]})
    return agents


# ---------------------------------------------------------------- built-in WebUI controls (tools.md §14)

def metric(label, value, description=None):
    entry = {"label": label, "value": value}
    if description is not None:
        entry["description"] = description
    return entry


def project_stats_panel(store, data):
    project = store.project()
    stats = store.project_stats()
    statuses = {}
    for agent in store.list_agents():
        statuses[agent["status"]] = statuses.get(agent["status"], 0) + 1
    agent_count = sum(statuses.values())
    status_text = ", ".join(f"{n} {status}" for status, n in statuses.items()) or "none"
    activations_text = (f"{stats['runningActivationCount']} running, "
                        f"{stats['failedActivationCount']} failed")
    history_text = f"{stats['historyCompactionCount']} compactions"
    lines = [
        f"Status: {project['status']}",
        f"Agents: {agent_count} ({status_text})",
        f"Messages: {stats['messageCount']}",
        f"Activations: {stats['activationCount']} ({activations_text})",
        f"Tool calls: {stats['toolCallCount']}",
        f"History: {stats['historyMessageCount']} ({history_text})",
        f"Events: {stats['eventCount']}",
    ]
    metrics = [
        metric("Status", project["status"]),
        metric("Agents", agent_count, status_text),
        metric("Messages", stats["messageCount"]),
        metric("Activations", stats["activationCount"], activations_text),
        metric("Tool calls", stats["toolCallCount"]),
        metric("History", stats["historyMessageCount"], history_text),
        metric("Events", stats["eventCount"]),
    ]
    return {"title": "Project statistics", "output": "\n".join(lines),
            "metadata": {"metrics": metrics, "stats": stats, "agentStatuses": statuses,
                         "projectStatus": project["status"]}}


def conversation_panel(store, data):
    data = object_input(data)
    agent_a = optional_string(data.get("agentA"))
    agent_b = optional_string(data.get("agentB"))
    limit = bounded_input(data, "limit", 40, 200)
    roster = ", ".join(["user", *(agent["id"] for agent in store.list_agents())])
    if agent_a is None or agent_b is None:
        pairs = direct_pairs(store)
        lines = ["Select two participants, then refresh.", f"Known participants: {roster}", "",
                 "Recent direct pairs:"]
        lines += [f"- {p['sender']} -> {p['recipient']}: {p['count']} messages, last {p['lastAt']}" for p in pairs]
        if not pairs:
            lines.append("- none")
        return {"title": "Agent conversation", "output": "\n".join(lines),
                "metadata": {"participants": roster, "recentPairs": pairs}}
    messages = list(reversed(store.direct_messages(agent_a, agent_b, limit)))
    blocks = [f"Conversation: {agent_a} <-> {agent_b}", f"Known participants: {roster}"]
    blocks += [f"## {m['createdAt']} {m['priority']} {m['sender']} -> {m['recipient']}\nid: {m['id']}\n\n"
               + truncate(m["body"], MESSAGE_PREVIEW_CHARS) for m in messages]
    if not messages:
        blocks.append("No direct messages between these participants.")
    return {"title": "Agent conversation", "output": "\n\n".join(blocks),
            "metadata": {"metrics": [metric("Messages", len(messages), f"{agent_a} <-> {agent_b}"),
                                     metric("Participants", 2, f"{agent_a}, {agent_b}")],
                         "messages": messages}}


def direct_pairs(store):
    """The 12 most recently active (sender, recipient) pairs of direct messages."""
    return store.db_all(
        "SELECT sender, recipient, COUNT(*) AS count, MAX(created_at) AS lastAt FROM messages "
        "WHERE project = ? AND channel IS NULL AND recipient IS NOT NULL GROUP BY sender, recipient "
        "ORDER BY MAX(created_at) DESC, MAX(rowid) DESC LIMIT 12", [store.project_id])


def send_message_action(store, data):
    data = object_input(data)
    body = required_string(data, "body")
    priority = check_priority(data.get("priority"))
    sender = optional_string(data.get("sender")) or "user"
    agents = store.list_agents()
    if sender != "user" and sender not in {agent["id"] for agent in agents}:
        raise BadRequest(f"Unknown sender: {sender}")
    channel = optional_string(data.get("channel"))
    recipient = optional_string(data.get("recipient"))
    if channel is None and recipient is None:
        coordinator = communication(store.config())[0]
        ids = [agent["id"] for agent in agents]
        recipient = coordinator if coordinator in ids else (ids[0] if ids else None)
    message = store.send_message(sender=sender, recipient=recipient, channel=channel, priority=priority, body=body)
    route = message.get("recipient") or message.get("channel")
    output = "\n".join([f"Message sent: {message['id']}", f"Route: {sender} -> {route}",
                        f"Priority: {priority}", "", body])
    return {"title": "message sent", "output": output,
            "metadata": {"metrics": [metric("Priority", priority), metric("Body chars", len(body))],
                         "messageId": message["id"], "message": message}}


def payload_summary(payload):
    if not isinstance(payload, dict) or not payload:
        return "no payload"
    if isinstance(payload.get("id"), str) and isinstance(payload.get("body"), str):
        return f"message {payload['id']}, {len(payload['body'])} chars"
    for key in ("reason", "message"):
        if isinstance(payload.get(key), str):
            return one_line(payload[key], 180)
    return "keys: " + ", ".join(list(payload)[:8])


def signals_panel(store, data):
    data = object_input(data)
    target = optional_string(data.get("targetAgent"))
    status = data.get("status")
    if status is None or status == "":
        status = None
    elif status not in SIGNAL_STATUSES:
        raise BadRequest(f"Invalid signal status: {describe(status)}")
    limit = bounded_input(data, "limit", 25, 100)
    aggregates = store.signal_counts()
    recent = []
    for sig in store.list_signals(target_agent=target, status=status, limit=limit):
        item = {"id": sig["id"], "kind": sig["kind"]}
        for key in ("sourceAgent", "targetAgent", "targetChannel"):
            if sig.get(key):
                item[key] = sig[key]
        item.update({"priority": sig["priority"], "status": sig["status"], "createdAt": sig["createdAt"],
                     "payloadSummary": payload_summary(sig.get("payload"))})
        recent.append(item)
    lines = ["Signal summary:"]
    lines += [f"- {a['status']} {a['priority']}: {a['count']}" for a in aggregates]
    lines += ["", "Recent signals:"]
    for item in recent:
        source = f" from {item['sourceAgent']}" if item.get("sourceAgent") else ""
        goal = item.get("targetAgent") or item.get("targetChannel") or "no target"
        lines.append(f"- {item['createdAt']} [{item['priority']}/{item['status']}] {item['kind']}{source} -> "
                     f"{goal}: {item['payloadSummary']}")
    if not recent:
        lines.append("- none")
    totals = {name: sum(a["count"] for a in aggregates if a["status"] == name) for name in SIGNAL_STATUSES}
    metrics = [metric("Pending", totals[SIGNAL_PENDING]), metric("Delivered", totals[SIGNAL_DELIVERED]),
               metric("Closed", totals[SIGNAL_CLOSED]),
               metric("Recent", len(recent), f"target {target}" if target else "all targets")]
    return {"title": "Signal queue", "output": "\n".join(lines),
            "metadata": {"metrics": metrics, "aggregates": aggregates, "recent": recent}}


def report_panel(store, data):
    project = store.project()
    status = project["status"]
    path = project.get("submitted_report")
    if not path:
        return {"title": "Completion report",
                "output": f"Project status: {status}\nNo report has been submitted with completion.submit yet.",
                "metadata": {"metrics": [metric("Submit status", "not submitted", status)],
                             "projectStatus": status}}
    try:
        report = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        return {"title": "Completion report",
                "output": f"Project status: {status}\nReport path: {path}\nRead error: {exc}",
                "metadata": {"metrics": [metric("Submit status", "submitted", status),
                                         metric("Report chars", 0)],
                             "reportPath": path, "projectStatus": status, "readError": str(exc)}}
    return {"title": "Completion report",
            "output": f"Project status: {status}\nReport path: {path}\n\n" + truncate(report, 20000),
            "metadata": {"metrics": [metric("Submit status", "submitted", status),
                                     metric("Report chars", len(report))],
                         "reportPath": path, "projectStatus": status}}


def input_summary(tool, input_json):
    try:
        data = json.loads(input_json or "{}")
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if tool == "file.patch":
        operations = data.get("operations") if isinstance(data.get("operations"), list) else []
        paths = [op["path"] for op in operations if isinstance(op, dict) and isinstance(op.get("path"), str)]
        text = f"{len(operations)} operations"
        if paths:
            text += ": " + ", ".join(paths[:6]) + (", ..." if len(paths) > 6 else "")
        return text
    if tool.startswith("file."):
        return data["path"] if isinstance(data.get("path"), str) else "path not recorded"
    if tool == "shell.exec":
        if not isinstance(data.get("command"), str):
            return "command not recorded"
        prefix = f"{data['cwd']}: " if isinstance(data.get("cwd"), str) else ""
        return prefix + one_line(data["command"], 220)
    if not isinstance(data.get("url"), str):
        return "url not recorded"
    suffix = f" ({data['format']})" if isinstance(data.get("format"), str) else ""
    return one_line(data["url"], 220) + suffix


def activity_panel(title, tools):
    def handler(store, data):
        data = object_input(data)
        limit = bounded_input(data, "limit", 20, 100)
        counts = store.tool_call_stats()
        metrics = []
        for tool in tools:
            row = counts.get(tool, {})
            metrics.append(metric(tool, row.get("callCount", 0),
                                  f"{row.get('runningCount', 0)} running, {row.get('completedCount', 0)} completed, "
                                  f"{row.get('failedCount', 0)} failed"))
        recent = []
        for row in store.list_tool_calls(limit, tools=tools):
            item = {"id": row["id"], "tool": row["tool"], "agentId": row["agent_id"], "status": row["status"],
                    "createdAt": row["created_at"]}
            if row.get("completed_at"):
                item["completedAt"] = row["completed_at"]
            item["summary"] = input_summary(row["tool"], row.get("input_json"))
            if row.get("error"):
                item["error"] = truncate(row["error"], 600)
            recent.append(item)
        lines = [f"{title}:"] + [f"- {m['label']}: {m['value']} ({m['description']})" for m in metrics]
        lines += ["", "Recent activity:"]
        for item in recent:
            line = f"- {item['createdAt']} [{item['status']}] {item['agentId']} {item['tool']}: {item['summary']}"
            if item.get("completedAt"):
                line += f", closed {item['completedAt']}"
            if item.get("error"):
                line += "\n  error: " + one_line(item["error"], 220)
            lines.append(line)
        if not recent:
            lines.append("- none")
        return {"title": title, "output": "\n".join(lines), "metadata": {"metrics": metrics, "recent": recent}}
    return handler


BUILTIN_WEBUI = {
    ("core", "project.stats"): project_stats_panel,
    ("core", "messages.conversation"): conversation_panel,
    ("core", "messages.send"): send_message_action,
    ("core", "coordination.signals"): signals_panel,
    ("core", "completion.report"): report_panel,
    ("core", "file.activity"): activity_panel("File tool activity", ("file.read", "file.write", "file.patch")),
    ("shell", "shell.activity"): activity_panel("Shell activity", ("shell.exec",)),
    ("web", "web.activity"): activity_panel("Web fetch activity", ("web.fetch",)),
}
