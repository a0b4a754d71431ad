"""Two runs compared (docs/replay.md): their messages, tool calls, activations per agent, artifacts,
report, tokens and cost, section by section, with ids, times, project names and paths not counted as
differences and a replayed model call counted at its recorded usage and cost."""
import hashlib

import suzumio_recorder
import suzumio_repository
from suzumio_replay import normalized

SECTIONS = ("messages", "toolCalls", "activations", "artifacts", "report", "tokens", "cost", "repository")
COST_DIGITS = 10


def _text(store, value):
    """`value` with the project's folder and name, store ids and times written the same for every run."""
    if not isinstance(value, str):
        return value
    value = value.replace(str(store.dir), "<project-dir>")
    return normalized(value.replace(store.project_id, "<project>"))


def _by(key, rows):
    """{key value: [rows in order]}, sorted by key. Agents of one team run at once, so how their
    messages and tool calls interleave is timing, not behaviour: a run is compared sender by sender and
    agent by agent, each in its own order."""
    out = {}
    for row in rows:
        out.setdefault(row.pop(key), []).append(row)
    return dict(sorted(out.items()))


def _messages(store):
    """{sender: [messages in the order sent]}."""
    return _by("sender", [{"sender": m["sender"], "recipient": m.get("recipient"), "channel": m.get("channel"),
                           "priority": m["priority"], "body": _text(store, m["body"])}
                          for m in store.list_messages(1000000, full_body=True)])


def _tool_calls(store):
    """{agent: [tool calls in audit order]}."""
    return _by("agent", [{"agent": r["agent_id"], "tool": r["tool"], "status": r["status"],
                          "input": _text(store, r["input_json"]), "output": _text(store, r.get("output")),
                          "error": _text(store, r.get("error"))}
                         for r in reversed(store.list_tool_calls(1000000))])


def _activations(store):
    """{agent: [status, ...]} in the order each agent's activations started."""
    by_agent = {agent_id: [] for agent_id in sorted(store.agent_ids())}
    for activation_id in store.activation_ids_in_order():
        row = store.activation(activation_id)
        by_agent.setdefault(row["agentId"], []).append(row["status"])
    return by_agent


def _artifacts(store):
    """{agent: {path: sha256}} of the artifact folders as they are now."""
    out = {}
    for agent_id in sorted(store.agent_ids()):
        files = suzumio_recorder.folder_files(store.artifacts_dir(agent_id))
        out[agent_id] = {path: hashlib.sha256(file.read_bytes()).hexdigest() for path, file in files.items()}
    return out


def _report(store):
    path = store.project()["submitted_report"]
    try:
        return _text(store, open(path, encoding="utf-8").read()) if path else None
    except OSError:
        return None


def _tokens(store):
    totals = {}
    for usage, _ in store.model_call_usages():
        for field, value in usage.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and field != "recordedCostUsd":
                totals[field] = totals.get(field, 0) + value
    return totals


def _cost(store):
    """USD of the run, a replayed call at what it cost when it was recorded; None when nothing was priced."""
    costs = [usage.get("recordedCostUsd") if usage.get("replayed") else cost
             for usage, cost in store.model_call_usages()]
    priced = [c for c in costs if isinstance(c, (int, float))]
    return round(sum(priced), COST_DIGITS) if priced else None


def _repository(store):
    """The integration branch, oldest commit first, as subject, author and tree (the content, whatever the
    commit ids and times); None without a repository."""
    return suzumio_repository.integration_history(store)


READERS = {"messages": _messages, "toolCalls": _tool_calls, "activations": _activations,
           "artifacts": _artifacts, "report": _report, "tokens": _tokens, "cost": _cost,
           "repository": _repository}


def _first_difference(section, a, b):
    """Where two values of a section first differ: {section, index?|key?, a, b}."""
    if isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            left = a[index] if index < len(a) else None
            right = b[index] if index < len(b) else None
            if left != right:
                return {"section": section, "index": index, "a": left, "b": right}
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                inner = _first_difference(section, a.get(key), b.get(key))
                return dict(inner, key=key) if "index" in inner else {"section": section, "key": key,
                                                                       "a": a.get(key), "b": b.get(key)}
    return {"section": section, "a": a, "b": b}


def diff_projects(a, b):
    """{a, b, identical, firstDifference, sections: {name: {identical, a, b}}} of two project stores."""
    sections, first = {}, None
    for name in SECTIONS:
        left, right = READERS[name](a), READERS[name](b)
        same = left == right
        sections[name] = {"identical": same, "a": left, "b": right}
        if not same and first is None:
            first = _first_difference(name, left, right)
    return {"a": a.project_id, "b": b.project_id, "identical": first is None, "firstDifference": first,
            "sections": sections}


def describe(result):
    """The CLI's text: one line when identical, else the first difference."""
    if result["identical"]:
        return f"{result['a']} and {result['b']} are identical"
    first = result["firstDifference"]
    where = first["section"] + "".join(f" {field} {first[field]}" for field in ("key", "index") if field in first)
    lines = [f"{result['a']} and {result['b']} differ: first in {where}", f"  {result['a']}: {first['a']}",
             f"  {result['b']}: {first['b']}"]
    differing = [name for name in SECTIONS if not result["sections"][name]["identical"]]
    lines.append("Differing sections: " + ", ".join(differing))
    return "\n".join(lines)
