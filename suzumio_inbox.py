"""What waits for a person (docs/http-api.md#inbox): tool calls waiting for approval, a submitted report
waiting for review, agents a loop guard paused, calls in doubt (the effect ledger). One list per project and
one across the root, so the control room can show a count on every view and every project without asking
each route itself.

Each item kind is one source function from a project's store to its items; a new kind is one more
function in SOURCES and one more name in KINDS."""
import suzumio_approvals
import suzumio_effects
import suzumio_store_guards
from suzumio_records import PROJECT_COMPLETED, PROJECT_SUBMITTED

KIND_APPROVAL = "approval"
KIND_REPORT = "report"
KIND_PAUSED = "paused"
KIND_IN_DOUBT = "in_doubt"
KINDS = (KIND_APPROVAL, KIND_REPORT, KIND_PAUSED, KIND_IN_DOUBT)


def calls_awaiting_approval(store, now=None):
    """Pending approval requests, oldest first (expiry applied first)."""
    return [{"kind": KIND_APPROVAL, "project": store.project_id, "id": request["id"], "agentId": request["agentId"],
             "tool": request["tool"], "since": request["createdAt"], "expiresAt": request["expiresAt"]}
            for request in suzumio_approvals.list_approvals(store, status="pending", now=now)
            if request["status"] == "pending"]


def report_awaiting_review(store, now=None):
    """The submitted report, while the project is `submitted`."""
    project = store.project()
    if project["status"] != PROJECT_SUBMITTED:
        return []
    return [{"kind": KIND_REPORT, "project": store.project_id, "since": project["updated_at"]}]


def paused_agents(store, now=None):
    """Agents a loop guard paused, until a person resumes them."""
    return [{"kind": KIND_PAUSED, "project": store.project_id, "agentId": agent_id, "rule": pause.get("rule"),
             "reason": pause.get("reason"), "since": pause.get("at")}
            for agent_id, pause in sorted(suzumio_store_guards.paused_agents(store).items())]


def calls_in_doubt(store, now=None):
    """External calls that may or may not have happened, until a person says which (oldest first)."""
    return [{"kind": KIND_IN_DOUBT, "project": store.project_id, "id": effect["id"], "agentId": effect["agent"],
             "tool": effect["tool"], "since": effect.get("doubtedAt") or effect["startedAt"]}
            for effect in reversed(suzumio_effects.list_effects(store, "in_doubt"))]


SOURCES = (calls_awaiting_approval, report_awaiting_review, paused_agents, calls_in_doubt)


def project_inbox(store, now=None):
    """{"project", "count", "items"} of one project; items in SOURCES order, each oldest first."""
    items = [item for source in SOURCES for item in source(store, now)]
    return {"project": store.project_id, "count": len(items), "items": items}


def root_inbox(root, now=None):
    """{"count", "projects": {name: count}, "items"} across the root. A completed project waits for no one
    and is not opened; `projects` names every other project, with 0 when nothing waits."""
    counts, items = {}, []
    for summary in root.project_summaries():
        if summary["status"] == PROJECT_COMPLETED:
            continue
        found = project_inbox(root.open_project(summary["id"]), now)
        counts[summary["id"]] = found["count"]
        items.extend(found["items"])
    return {"count": len(items), "projects": counts, "items": items}
