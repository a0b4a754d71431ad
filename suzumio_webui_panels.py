"""The built-in WebUI panels and actions of the core, shell and web toolpacks (docs/design/tools.md):
project statistics, conversations, the send form, the signal queue, the completion report and tool
activity. Each handler takes (store, config, data) and answers {title, output, metadata}."""
import json
from pathlib import Path

import suzumio_coordination as coordination
from suzumio_errors import BadRequest
from suzumio_http import bounded_input, object_input, optional_string, required_string
from suzumio_records import (
    SIGNAL_CLOSED,
    SIGNAL_DELIVERED,
    SIGNAL_PENDING,
    SIGNAL_STATUSES,
    checked_priority,
    describe,
    truncate,
)

MESSAGE_PREVIEW_CHARS = 12000


def one_line(text, limit):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit].rstrip() + "..."


def metric(label, value, description=None):
    entry = {"label": label, "value": value}
    if description is not None:
        entry["description"] = description
    return entry


def project_stats_panel(store, config, data):
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


def conversation_panel(store, config, data):
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
    return store.direct_pairs(12)


def send_message_action(store, config, data):
    data = object_input(data)
    body = required_string(data, "body")
    priority = checked_priority(data.get("priority"))
    sender = optional_string(data.get("sender")) or "user"
    agents = store.list_agents()
    if sender != "user" and sender not in {agent["id"] for agent in agents}:
        raise BadRequest(f"Unknown sender: {sender}")
    channel = optional_string(data.get("channel"))
    recipient = optional_string(data.get("recipient"))
    if channel is None and recipient is None:
        coordinator = config.communication.coordinator_agent
        ids = [agent["id"] for agent in agents]
        recipient = coordinator if coordinator in ids else (ids[0] if ids else None)
    message = coordination.send_message(store, config, sender=sender, recipient=recipient, channel=channel,
                                        priority=priority, body=body)
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


def signals_panel(store, config, data):
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


def report_panel(store, config, data):
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
    def handler(store, config, data):
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
