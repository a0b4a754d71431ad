"""The packaged `scheduler` and `plan` toolpacks (docs/design/toolpacks.md) driven through the real Node
host (suzumio_node.NodeHost). The callbacks go to ProjectFacade, a small in-test stand-in for the store
facade of docs/design/tools.md with real SQLite tables for messages and signals; `tick()` plays the part of
the scheduler's hook step (docs/design/tools.md). End-to-end runs on the real store and scheduler belong to
the integration tests."""
import json
import re
import secrets
import shutil
import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import test_node_host  # the runner-role bridge and the HTTP controller stub

from suzumio_errors import BadRequest, NotFound
from suzumio_node import NodeHost, ToolpackError

REPO = Path(__file__).resolve().parent.parent
TOOLPACKS = REPO / "toolpacks"
NOW = "2026-06-03T10:00:00.000Z"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def iso(moment):
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse(text):
    return datetime.fromisoformat(text)


def shifted(text, **delta):
    return iso(parse(text) + timedelta(**delta))


SCHEMA = """
CREATE TABLE messages (id TEXT PRIMARY KEY, project TEXT NOT NULL, sender TEXT NOT NULL, recipient TEXT,
  channel TEXT, priority TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE signals (id TEXT PRIMARY KEY, project TEXT NOT NULL, kind TEXT NOT NULL, source_agent TEXT,
  source_activation TEXT, target_agent TEXT, target_channel TEXT, priority TEXT NOT NULL,
  payload_json TEXT NOT NULL, status TEXT NOT NULL, useful_effect INTEGER NOT NULL DEFAULT 0,
  created_at TEXT NOT NULL, not_before TEXT, delivered_at TEXT, delivered_activation_id TEXT);
"""
PRIORITIES = ("P0", "P1", "P2", "P3")


class ProjectFacade:
    """Project `demo` with agents, channels and a coordinator; messages and signals in real SQLite."""

    def __init__(self, root, agents=("pm", "worker"), channels=("#project",), coordinator="pm"):
        self.project = "demo"
        self.root = root
        self.channels = list(channels)
        self.coordinator = coordinator
        self.agents = {agent: {"id": agent, "status": "quiet", "activeActivationId": None} for agent in agents}
        self.events = []
        self.keys = []  # the idempotencyKey of every send, in order
        self.db_path = root / "suzumio.sqlite"
        self.lock = threading.Lock()
        self.db = sqlite3.connect(self.db_path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.executescript(SCHEMA)

    def new_id(self, prefix):
        return f"{prefix}_{int(time.time() * 1000)}_{secrets.token_hex(4)}"

    def paths(self):
        return {"root": str(self.root), "db": str(self.db_path), "artifacts": str(self.root / "artifacts"),
                "agents": str(self.root / "agents")}

    def config(self):
        return {"channels": self.channels, "communication": {"coordinatorAgent": self.coordinator}}

    def list_agents(self):
        return [dict(self.agents[agent], project=self.project, token="t") for agent in sorted(self.agents)]

    def set_model_alive(self, agent, alive):
        self.agents[agent].update(status="running" if alive else "quiet",
                                  activeActivationId="act_live" if alive else None)

    def hook_agents(self):
        return [{"id": agent["id"], "displayName": agent["id"], "role": "agent", "status": agent["status"],
                 "activeActivationId": agent["activeActivationId"],
                 "modelAlive": agent["activeActivationId"] is not None, "updatedAt": NOW}
                for agent in self.list_agents()]

    def send_message(self, request):
        self.keys.append(request.get("idempotencyKey"))
        body = request.get("body")
        if not isinstance(body, str) or not body.strip():
            raise BadRequest("body is required")
        priority = request.get("priority") or "P3"
        if priority not in PRIORITIES:
            raise BadRequest(f"Invalid priority: {priority}")
        recipient, channel = request.get("recipient"), request.get("channel")
        if not recipient and not channel:
            raise BadRequest("Message needs recipient or channel")
        if recipient and channel:
            raise BadRequest("Message cannot have both recipient and channel")
        if recipient and recipient != "user" and recipient not in self.agents:
            raise NotFound(f"Unknown agent: {recipient}")
        if channel and channel not in self.channels:
            raise BadRequest(f"Unknown channel: {channel}")
        message = {"id": self.new_id("msg"), "project": self.project, "sender": request["sender"]}
        message.update({"recipient": recipient} if recipient else {"channel": channel})
        message.update(priority=priority, body=body, createdAt=iso(datetime.now(UTC)))
        with self.lock:
            self.db.execute("INSERT INTO messages VALUES (?,?,?,?,?,?,?,?)",
                            (message["id"], self.project, message["sender"], recipient, channel, priority, body,
                             message["createdAt"]))
        self.record_signal({"kind": "message.created", "targetAgent": recipient, "targetChannel": channel,
                            "priority": priority, "payload": message,
                            "usefulEffect": recipient == "user" or None}, request.get("sourceAgent"))
        return message

    def record_signal(self, request, source_agent=None, source_activation=None):
        target = request.get("targetAgent")
        target = None if target == "user" else target
        channel = request.get("targetChannel")
        if target and target not in self.agents:
            raise NotFound(f"Unknown agent: {target}")
        if target:
            targets = [target]
        elif channel:
            targets = [agent for agent in sorted(self.agents) if agent != source_agent] or [None]
        else:
            targets = [None]
        priority = request.get("priority") or "P3"
        if priority not in PRIORITIES:
            raise BadRequest(f"Invalid priority: {priority}")
        created = iso(datetime.now(UTC))
        rows = []
        for agent in targets:
            status = "pending" if agent else "closed"
            if request.get("status") == "closed" and agent:
                raise BadRequest("Targeted signals cannot be closed; omit the target or omit status")
            row = {"id": self.new_id("sig"), "kind": request["kind"], "targetAgent": agent,
                   "targetChannel": channel, "priority": priority, "payload": request.get("payload") or {},
                   "status": status, "usefulEffect": bool(request.get("usefulEffect"))}
            with self.lock:
                self.db.execute(
                    "INSERT INTO signals (id, project, kind, source_agent, source_activation, target_agent,"
                    " target_channel, priority, payload_json, status, useful_effect, created_at, not_before)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (row["id"], self.project, row["kind"], source_agent, source_activation, agent, channel,
                     priority, json.dumps(row["payload"]), status, int(row["usefulEffect"]), created,
                     request.get("notBefore") or created))
            rows.append(row)
        return rows

    def deliver(self, agent):
        with self.lock:
            self.db.execute("UPDATE signals SET status = 'delivered' WHERE target_agent = ? AND status = 'pending'",
                            (agent,))

    def rows(self, sql, *params):
        return [dict(row) for row in self.db.execute(sql, params)]

    def messages(self):
        return self.rows("SELECT * FROM messages ORDER BY rowid")

    def signals(self, kind=None):
        if kind:
            return self.rows("SELECT * FROM signals WHERE kind = ? ORDER BY rowid", kind)
        return self.rows("SELECT * FROM signals ORDER BY rowid")

    def db_run(self, sql, *params):
        with self.lock:
            cursor = self.db.execute(sql, params)
        return {"changes": cursor.rowcount, "lastInsertRowid": cursor.lastrowid}

    def callbacks(self, source_agent=None, source_activation=None):
        def first_row(sql, *params):
            rows = self.rows(sql, *params)
            return rows[0] if rows else None

        def pending_for_agent(agent, include_delayed=False):
            return bool(self.rows("SELECT 1 FROM signals WHERE target_agent = ? AND status = 'pending'", agent))

        return {
            "store.config": self.config,
            "store.listAgents": self.list_agents,
            "store.requireAgent": lambda agent: next(a for a in self.list_agents() if a["id"] == agent),
            "store.sendMessage": self.send_message,
            "store.recordSignal": self.record_signal,
            "store.db.all": self.rows,
            "store.db.get": first_row,
            "store.db.run": self.db_run,
            "store.hasPendingSignals": lambda: bool(self.rows("SELECT 1 FROM signals WHERE status='pending'")),
            "store.hasPendingSignalsForAgent": pending_for_agent,
            "context.recordSignal": lambda request: self.record_signal(request, source_agent, source_activation),
            "context.hasPendingSignals": lambda: bool(self.rows("SELECT 1 FROM signals WHERE status='pending'")),
            "context.hasPendingSignalsForAgent": pending_for_agent,
        }


class Toolpacks:
    """Support calls, WebUI calls and the scheduler hook step for both packaged toolpacks."""

    ORDER = ("scheduler", "plan")

    def __init__(self, host, facade):
        self.host = host
        self.facade = facade

    def module(self, toolpack):
        return TOOLPACKS / toolpack / "controller.mjs"

    def call(self, toolpack, tool, input=None, now=NOW, agent="pm"):
        context = {"project": "demo", "paths": self.facade.paths(), "agent": self.facade.agents[agent],
                   "activationId": "act_1_abc", "now": now}
        return self.host.support(self.module(toolpack), toolpack, tool, input, context,
                                 self.facade.callbacks(agent, "act_1_abc"))

    def error(self, toolpack, tool, input=None, now=NOW):
        with pytest.raises(ToolpackError) as raised:
            self.call(toolpack, tool, input, now)
        return str(raised.value)

    def webui(self, toolpack, entry, input=None, now=NOW):
        context = {"project": "demo", "paths": self.facade.paths(), "now": now}
        return self.host.webui(self.module(toolpack), toolpack, entry, {} if input is None else input, context,
                               self.facade.callbacks())

    def tick(self, now):
        """One hook step: each toolpack's hook, requests recorded without a source, failures as events."""
        recorded = []
        for toolpack in self.ORDER:
            context = {"project": "demo", "paths": self.facade.paths(), "now": now,
                       "agents": self.facade.hook_agents()}
            try:
                value = self.host.scheduler_tick(self.module(toolpack), toolpack, context, self.facade.callbacks())
            except ToolpackError as exc:
                self.facade.events.append(("scheduler.hook_failed", {"toolpackId": toolpack, "error": str(exc)}))
                continue
            requests = value if isinstance(value, list) else (value or {}).get("signals", [])
            for request in requests:
                recorded.extend(self.facade.record_signal(request))
        return recorded


@pytest.fixture(scope="module")
def host():
    node_host = NodeHost()
    yield node_host
    node_host.close()


@pytest.fixture
def facade(tmp_path):
    project_dir = tmp_path / "demo"
    project_dir.mkdir()
    return ProjectFacade(project_dir)


@pytest.fixture
def packs(host, facade):
    return Toolpacks(host, facade)


def jobs_file(facade):
    return facade.root / "toolpack-state" / "scheduler" / "jobs.json"


def plan_file(facade):
    return facade.root / "toolpack-state" / "plan" / "state.json"


def read_json(path):
    return json.loads(path.read_text())


def write_json(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def jobs(facade):
    return read_json(jobs_file(facade))["jobs"]


def active_plan(facade):
    return read_json(plan_file(facade))["activePlan"]


# --- manifests and runner modules -----------------------------------------------------------------


def manifest(toolpack):
    return read_json(TOOLPACKS / toolpack / "suzumio.toolpack.json")


def test_scheduler_manifest_declares_four_tools_and_four_webui_entries():
    data = manifest("scheduler")
    assert (data["id"], data["runner"], data["controller"]) == ("scheduler", "runner.mjs", "controller.mjs")
    assert [tool["name"] for tool in data["tools"]] == [
        "schedule.once", "schedule.recurring", "schedule.list", "schedule.cancel"]
    assert [(e["id"], e["kind"], e["title"], e["submitLabel"]) for e in data["webui"]] == [
        ("schedule.jobs", "panel", "Scheduled messages", "Refresh jobs"),
        ("schedule.once", "action", "Schedule one-time message", "Schedule once"),
        ("schedule.recurring", "action", "Schedule recurring message", "Schedule recurring"),
        ("schedule.cancel", "action", "Cancel scheduled message", "Cancel job"),
    ]
    once = data["tools"][0]["inputSchema"]
    assert list(once["properties"]) == ["at", "afterMs", "afterSeconds", "afterMinutes", "afterHours", "afterDays",
                                        "sender", "recipient", "channel", "priority", "waitForQuiet", "body"]
    assert once["properties"]["priority"]["default"] == "P3"
    assert (once["required"], once["additionalProperties"]) == (["body"], False)
    recurring = data["tools"][1]["inputSchema"]
    assert "everySeconds" not in recurring["properties"]
    assert recurring["properties"]["weekday"]["enum"] == ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
    form_once = data["webui"][1]["inputSchema"]
    assert list(form_once["properties"]) == ["at", "afterMinutes", "afterHours", "sender", "recipient", "channel",
                                             "priority", "waitForQuiet", "body"]
    assert form_once["properties"]["afterMinutes"]["default"] == 60
    assert list(data["webui"][2]["inputSchema"]["properties"]) == [
        "everyHours", "everyDays", "weekday", "time", "sender", "recipient", "channel", "priority", "waitForQuiet",
        "body"]
    assert data["webui"][3]["inputSchema"]["required"] == ["id"]
    for tool in data["tools"]:
        assert tool["description"].strip()


def test_plan_manifest_declares_five_tools_and_five_webui_entries():
    data = manifest("plan")
    assert (data["id"], data["runner"], data["controller"]) == ("plan", "runner.mjs", "controller.mjs")
    tools = {tool["name"]: tool["inputSchema"] for tool in data["tools"]}
    assert list(tools) == ["plan.create", "plan.status", "plan.update", "plan.set_item_status", "plan.close"]
    assert [(e["id"], e["kind"], e["title"], e["submitLabel"]) for e in data["webui"]] == [
        ("plan.board", "panel", "Active plan", "Refresh plan"),
        ("plan.create", "action", "Create plan", "Create plan"),
        ("plan.update", "action", "Update plan", "Update plan"),
        ("plan.set_item_status", "action", "Set plan item status", "Set status"),
        ("plan.close", "action", "Close plan", "Close plan"),
    ]
    assert tools["plan.create"]["required"] == ["title", "itemsText"]
    assert tools["plan.create"]["properties"]["nudgeCooldownMs"]["default"] == 60000
    assert tools["plan.update"]["properties"]["itemMode"] == {
        **tools["plan.update"]["properties"]["itemMode"], "enum": ["append", "replace"], "default": "append"}
    assert tools["plan.set_item_status"]["required"] == ["status"]
    assert tools["plan.close"]["properties"]["status"]["enum"] == ["done", "abandoned"]
    forms = {entry["id"]: entry["inputSchema"] for entry in data["webui"]}
    assert forms["plan.create"] == tools["plan.create"]
    assert forms["plan.update"] == tools["plan.update"]
    assert forms["plan.set_item_status"] == tools["plan.set_item_status"]
    assert forms["plan.close"] == tools["plan.close"]
    assert forms["plan.board"] == tools["plan.status"]


@pytest.mark.parametrize("toolpack", ["scheduler", "plan"])
def test_runner_module_forwards_every_declared_tool_to_support(toolpack):
    server = test_node_host.ControllerStub()
    thread = threading.Thread(target=server.serve_forever, name="support-stub", daemon=True)
    thread.start()
    bridge = test_node_host.RunnerBridge()
    try:
        context = {"project": "demo", "agentId": "pm", "activationId": "act_1", "workspace": "/workspace",
                   "toolpackId": toolpack, "controllerUrl": server.url, "token": "tok",
                   "supportPath": f"/toolpacks/{toolpack}/support"}
        module = str(TOOLPACKS / toolpack / "runner.mjs")
        reply = bridge.request({"op": "init", "module": module, "context": context})
        declared = [tool["name"] for tool in manifest(toolpack)["tools"]]
        assert reply == {"id": 1, "ok": True, "tools": declared}
        server.responses[f"/toolpacks/{toolpack}/support"] = (200, b'{"title":"t","output":"from controller"}')
        for name in declared:
            assert bridge.request({"op": "call", "tool": name, "input": {"k": name}})["result"] == {
                "title": "t", "output": "from controller"}
        assert [request["body"]["tool"] for request in server.requests] == declared
        assert [request["body"]["input"] for request in server.requests] == [{"k": name} for name in declared]
    finally:
        bridge.close()
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- scheduler: creating jobs (scenarios 3-6, 10-12) -----------------------------------------------


def test_schedule_once_writes_job_with_defaults(packs, facade):
    result = packs.call("scheduler", "schedule.once", {"afterMinutes": 10, "body": "ping"})
    [job] = jobs(facade)
    assert job == {
        "id": job["id"], "type": "once", "status": "active", "createdAt": NOW,
        "nextAt": "2026-06-03T10:10:00.000Z", "sentCount": 0, "sender": "scheduler", "recipient": "pm",
        "priority": "P3", "waitForQuiet": False, "body": "ping", "schedule": {"afterMs": 600000},
    }
    assert list(job) == ["id", "type", "status", "createdAt", "nextAt", "sentCount", "sender", "recipient",
                         "priority", "waitForQuiet", "body", "schedule"]
    assert re.fullmatch(r"sch_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", job["id"])
    assert result["title"] == "scheduled message created"
    assert result["output"] == (f"Scheduled {job['id']}.\nNext: 2026-06-03T10:10:00.000Z\n"
                                "Route: scheduler -> pm\nPriority: P3")
    assert result["metadata"] == {"job": job}


def test_state_file_is_indented_json_with_trailing_newline_and_no_temp_files(packs, facade):
    packs.call("scheduler", "schedule.once", {"afterMinutes": 10, "body": "ping"})
    text = jobs_file(facade).read_text()
    assert text.endswith("}\n")
    assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n"
    assert [path.name for path in jobs_file(facade).parent.iterdir()] == ["jobs.json"]


def test_schedule_once_at_and_mixed_fields(packs, facade):
    packs.call("scheduler", "schedule.once", {
        "at": " 2026-06-04T09:00:00+02:00 ", "afterSeconds": 1.5, "sender": "  cron ", "priority": "",
        "waitForQuiet": "yes", "body": "  keep spaces  "})
    [job] = jobs(facade)
    assert job["nextAt"] == "2026-06-04T07:00:00.000Z"
    assert job["schedule"] == {"at": "2026-06-04T09:00:00+02:00", "afterMs": 1500}
    assert (job["sender"], job["priority"], job["waitForQuiet"], job["body"]) == (
        "cron", "P3", False, "  keep spaces  ")


@pytest.mark.parametrize("at, expected", [
    ("2026-06-04", "2026-06-04T00:00:00.000Z"),
    ("2026-06-04T08:30", "2026-06-04T08:30:00.000Z"),
    ("2026-06-04T08:30:15.5Z", "2026-06-04T08:30:15.500Z"),
    ("2026-06-01T00:00:00-01:30", "2026-06-01T01:30:00.000Z"),
])
def test_schedule_once_timestamp_forms(packs, facade, at, expected):
    packs.call("scheduler", "schedule.once", {"at": at, "body": "x"})
    assert jobs(facade)[0]["nextAt"] == expected


@pytest.mark.parametrize("input, message", [
    ({"body": "x"}, "schedule.once needs at or a positive after* delay"),
    ({"afterMinutes": -5, "body": "x"}, "schedule.once needs at or a positive after* delay"),
    ({"afterMinutes": "5", "body": "x"}, "Expected a finite number, got 5"),
    ({"at": "2026-06-04", "afterHours": True, "body": "x"}, "Expected a finite number, got true"),
    ({"at": "tomorrow", "body": "x"}, "Invalid at timestamp: tomorrow"),
    ({"at": "2026-02-30", "body": "x"}, "Invalid at timestamp: 2026-02-30"),
    ({"afterMinutes": 1}, "body is required"),
    ({"afterMinutes": 1, "body": "   "}, "body is required"),
    ({"afterMinutes": 1, "priority": "P4", "body": "x"}, "Invalid priority: P4"),
    ({"recipient": "pm", "channel": "#project", "afterMinutes": 1, "body": "x"},
     "Give either recipient or channel, not both"),
    ({"channel": "#nope", "afterMinutes": 1, "body": "x"}, "Unknown channel: #nope"),
    ({"recipient": "ghost", "afterMinutes": 1, "body": "x"}, "Unknown recipient: ghost"),
    ([], "Tool input must be an object"),
])
def test_schedule_once_validation_writes_nothing(packs, facade, input, message):
    assert packs.error("scheduler", "schedule.once", input) == message
    assert not jobs_file(facade).exists()


def test_schedule_once_to_user_and_channel_is_accepted(packs, facade):
    packs.call("scheduler", "schedule.once", {"recipient": "user", "afterMinutes": 1, "body": "x"})
    packs.call("scheduler", "schedule.once", {"channel": "#project", "afterMinutes": 1, "body": "y"})
    first, second = jobs(facade)
    assert first["recipient"] == "user"
    assert second["channel"] == "#project" and "recipient" not in second


def test_default_recipient_falls_back_to_first_agent_then_user(host, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    no_coordinator = Toolpacks(host, ProjectFacade(tmp_path / "a", agents=("zed", "alpha")))
    job = no_coordinator.call("scheduler", "schedule.once", {"afterMinutes": 1, "body": "x"}, agent="zed")
    assert job["metadata"]["job"]["recipient"] == "alpha"
    no_agents = Toolpacks(host, ProjectFacade(tmp_path / "b", agents=()))
    job = no_agents.webui("scheduler", "schedule.once", {"afterMinutes": 1, "body": "x"})
    assert job["metadata"]["job"]["recipient"] == "user"


def test_schedule_recurring_interval(packs, facade):
    result = packs.call("scheduler", "schedule.recurring", {"everyHours": 2, "body": "status?"})
    job = result["metadata"]["job"]
    assert (job["type"], job["schedule"], job["nextAt"]) == (
        "recurring", {"mode": "interval", "everyMs": 7200000}, "2026-06-03T12:00:00.000Z")


@pytest.mark.parametrize("input, next_at, schedule", [
    ({"weekday": "wed", "time": "09:30"}, "2026-06-10T09:30:00.000Z",
     {"mode": "weekly", "weekday": "wed", "hour": 9, "minute": 30, "timezone": "UTC"}),
    ({"weekday": "wed", "time": "10:30"}, "2026-06-03T10:30:00.000Z", None),
    ({"weekday": "wed", "time": "10:00"}, "2026-06-10T10:00:00.000Z", None),
    ({"weekday": "mon", "time": "9:00"}, "2026-06-08T09:00:00.000Z",
     {"mode": "weekly", "weekday": "mon", "hour": 9, "minute": 0, "timezone": "UTC"}),
    ({"weekday": "wed", "time": "09:30", "startAt": "2026-06-20T00:00:00Z"}, "2026-06-24T09:30:00.000Z",
     {"mode": "weekly", "weekday": "wed", "hour": 9, "minute": 30, "timezone": "UTC",
      "startAt": "2026-06-20T00:00:00Z"}),
    ({"everyHours": 2}, "2026-06-03T12:00:00.000Z", None),
    ({"everyMinutes": 30, "startAt": "2026-06-05T00:00:00Z"}, "2026-06-05T00:00:00.000Z",
     {"mode": "interval", "everyMs": 1800000, "startAt": "2026-06-05T00:00:00Z"}),
    ({"everyHours": 1, "startAt": "2026-06-01T00:00:00Z"}, "2026-06-03T11:00:00.000Z", None),
])
def test_schedule_recurring_next_firing_examples(packs, facade, input, next_at, schedule):
    job = packs.call("scheduler", "schedule.recurring", {**input, "body": "x"})["metadata"]["job"]
    assert job["nextAt"] == next_at
    if schedule is not None:
        assert job["schedule"] == schedule


@pytest.mark.parametrize("input, message", [
    ({"everyHours": 1, "weekday": "mon", "time": "09:00"},
     "Give either an every* interval or weekday plus time, not both"),
    ({"weekday": "monday", "time": "09:00"}, "Invalid weekday: monday"),
    ({"weekday": "mon", "time": "24:00"}, "Invalid time (expected HH:MM): 24:00"),
    ({"weekday": "mon", "time": "9:5"}, "Invalid time (expected HH:MM): 9:5"),
    ({"weekday": "mon"}, "schedule.recurring needs a positive every* interval, or weekday plus time"),
    ({"everySeconds": 30}, "schedule.recurring needs a positive every* interval, or weekday plus time"),
    ({"everyDays": 1, "startAt": "soon"}, "Invalid startAt timestamp: soon"),
])
def test_schedule_recurring_validation(packs, facade, input, message):
    assert packs.error("scheduler", "schedule.recurring", {**input, "body": "x"}) == message
    assert not jobs_file(facade).exists()


# --- scheduler: due jobs (scenarios 7-10, 13, 18) --------------------------------------------------


def due_job(facade, **fields):
    job = {"id": f"sch_{secrets.token_hex(4)}", "type": "once", "status": "active", "createdAt": NOW,
           "nextAt": shifted(NOW, minutes=-1), "sentCount": 0, "sender": "scheduler", "recipient": "pm",
           "priority": "P2", "waitForQuiet": False, "body": "due body", "schedule": {"afterMs": 60000}}
    job.update(fields)
    for key in [key for key, value in job.items() if value is None]:
        del job[key]
    return job


def test_due_once_job_is_sent_exactly_once(packs, facade):
    write_json(jobs_file(facade), {"version": 1, "jobs": [due_job(facade)]})
    assert packs.tick(NOW) == []
    [message] = facade.messages()
    assert (message["sender"], message["recipient"], message["priority"], message["body"]) == (
        "scheduler", "pm", "P2", "due body")
    [signal] = facade.signals("message.created")
    assert (signal["target_agent"], signal["status"], signal["priority"]) == ("pm", "pending", "P2")
    [job] = jobs(facade)
    assert (job["status"], job["sentCount"], job["lastSentAt"], job["lastMessageId"], job["completedAt"]) == (
        "done", 1, NOW, message["id"], NOW)
    assert list(job)[-3:] == ["lastSentAt", "lastMessageId", "completedAt"]
    packs.tick(shifted(NOW, seconds=2))
    packs.tick(shifted(NOW, days=1))
    assert len(facade.messages()) == 1
    assert facade.events == []


def test_job_not_yet_due_is_not_sent(packs, facade):
    packs.call("scheduler", "schedule.once", {"afterMinutes": 10, "body": "later"})
    packs.tick(shifted(NOW, minutes=9, seconds=59))
    assert facade.messages() == []
    packs.tick(shifted(NOW, minutes=10))
    assert [message["body"] for message in facade.messages()] == ["later"]


def test_wait_for_quiet_holds_job_while_recipient_is_model_alive(packs, facade):
    write_json(jobs_file(facade), {"version": 1, "jobs": [due_job(facade, waitForQuiet=True)]})
    facade.set_model_alive("pm", True)
    packs.tick(NOW)
    packs.tick(shifted(NOW, seconds=2))
    assert facade.messages() == []
    assert jobs(facade)[0]["status"] == "active"
    facade.set_model_alive("pm", False)
    packs.tick(shifted(NOW, seconds=4))
    assert len(facade.messages()) == 1
    assert jobs(facade)[0]["status"] == "done"


def test_wait_for_quiet_never_holds_channel_or_user_jobs(packs, facade):
    write_json(jobs_file(facade), {"version": 1, "jobs": [
        due_job(facade, recipient=None, channel="#project", waitForQuiet=True),
        due_job(facade, recipient="user", waitForQuiet=True)]})
    facade.set_model_alive("pm", True)
    packs.tick(NOW)
    assert [(m["channel"], m["recipient"]) for m in facade.messages()] == [("#project", None), (None, "user")]
    channel_signals = [s for s in facade.signals("message.created") if s["target_channel"] == "#project"]
    assert sorted(s["target_agent"] for s in channel_signals) == ["pm", "worker"]
    assert all(s["status"] == "pending" for s in channel_signals)


def test_recurring_job_fires_and_moves_next_at_from_tick_time(packs, facade):
    packs.call("scheduler", "schedule.recurring", {"everyHours": 2, "body": "status?"})
    fire_at = "2026-06-03T12:00:01.250Z"
    packs.tick(fire_at)
    [job] = jobs(facade)
    assert (job["nextAt"], job["sentCount"], job["status"], job["lastSentAt"]) == (
        "2026-06-03T14:00:01.250Z", 1, "active", fire_at)
    packs.tick("2026-06-04T03:00:00.000Z")
    [job] = jobs(facade)
    assert (job["nextAt"], job["sentCount"]) == ("2026-06-04T05:00:00.000Z", 2)
    assert len(facade.messages()) == 2
    # each run is sent with its own key, the job's id and that run's due time (docs/toolpacks.md)
    assert facade.keys == [f"scheduler:{job['id']}@2026-06-03T12:00:00.000Z",
                           f"scheduler:{job['id']}@2026-06-03T14:00:01.250Z"]


def test_weekly_job_after_firing_moves_to_next_week(packs, facade):
    packs.call("scheduler", "schedule.recurring", {"weekday": "wed", "time": "10:30", "body": "weekly"})
    packs.tick("2026-06-03T10:30:00.500Z")
    assert jobs(facade)[0]["nextAt"] == "2026-06-10T10:30:00.000Z"


def test_failed_send_keeps_earlier_jobs_saved_and_never_resends_them(packs, facade):
    first = due_job(facade, body="first")
    broken = due_job(facade, recipient="ghost", body="second")
    third = due_job(facade, body="third")
    write_json(jobs_file(facade), {"version": 1, "jobs": [first, broken, third]})
    packs.tick(NOW)
    assert facade.events == [("scheduler.hook_failed", {"toolpackId": "scheduler", "error": "Unknown agent: ghost"})]
    saved = jobs(facade)
    assert (saved[0]["status"], saved[0]["sentCount"]) == ("done", 1)
    assert saved[1] == broken and saved[2] == third
    packs.tick(shifted(NOW, seconds=2))
    assert [message["body"] for message in facade.messages()] == ["first"]


def test_unparsable_next_at_fails_the_hook(packs, facade):
    write_json(jobs_file(facade), {"version": 1, "jobs": [due_job(facade, nextAt="someday")]})
    packs.tick(NOW)
    assert facade.events == [("scheduler.hook_failed",
                              {"toolpackId": "scheduler", "error": "Invalid nextAt timestamp: someday"})]


def test_corrupt_jobs_file_fails_every_operation_and_is_left_alone(packs, facade):
    path = jobs_file(facade)
    path.parent.mkdir(parents=True)
    path.write_text("{")
    message = packs.error("scheduler", "schedule.list", {})
    assert message.startswith(f"Invalid state file {path}: ")
    assert packs.error("scheduler", "schedule.once", {"afterMinutes": 1, "body": "x"}).startswith(
        f"Invalid state file {path}: ")
    packs.tick(NOW)
    [(kind, data)] = facade.events
    assert kind == "scheduler.hook_failed" and data["toolpackId"] == "scheduler"
    assert data["error"].startswith(f"Invalid state file {path}: ")
    assert path.read_text() == "{"


def test_non_array_jobs_loads_as_empty(packs, facade):
    write_json(jobs_file(facade), {"version": 1, "jobs": {"not": "a list"}})
    assert packs.call("scheduler", "schedule.list", None)["output"] == "Scheduled messages:\n- none"


# --- scheduler: list and cancel (scenarios 14-17) --------------------------------------------------


def test_schedule_list_shows_active_jobs_and_counts_all(packs, facade):
    long_body = "word " * 60
    active = packs.call("scheduler", "schedule.once", {"afterMinutes": 10, "body": long_body.strip(),
                                                       "waitForQuiet": True})["metadata"]["job"]
    other = packs.call("scheduler", "schedule.once", {"channel": "#project", "afterMinutes": 5, "body": "x"})
    packs.call("scheduler", "schedule.cancel", {"id": other["metadata"]["job"]["id"]})
    result = packs.call("scheduler", "schedule.list", {})
    shown = ("word " * 28 + "wo")[:137] + "..."
    assert result["title"] == "scheduled messages"
    assert result["output"] == (
        f"Scheduled messages:\n- {active['id']} [active/once] next 2026-06-03T10:10:00.000Z, P3 scheduler -> pm, "
        f"sent 0, waits for quiet: {shown}")
    assert result["metadata"]["metrics"] == [{"label": "Active", "value": 1}, {"label": "Done", "value": 0},
                                             {"label": "Cancelled", "value": 1}]
    assert [job["id"] for job in result["metadata"]["jobs"]] == [active["id"]]
    everything = packs.call("scheduler", "schedule.list", {"includeInactive": True})
    assert len(everything["output"].splitlines()) == 3
    assert "[cancelled/once]" in everything["output"] and "-> #project, sent 0: x" in everything["output"]


def test_schedule_cancel(packs, facade):
    job = packs.call("scheduler", "schedule.once", {"afterMinutes": 10, "body": "x"})["metadata"]["job"]
    result = packs.call("scheduler", "schedule.cancel", {"id": job["id"]}, now=shifted(NOW, minutes=1))
    assert result["title"] == "scheduled message cancelled"
    assert result["output"] == f"Cancelled {job['id']}."
    cancelled = jobs(facade)[0]
    assert (cancelled["status"], cancelled["cancelledAt"]) == ("cancelled", "2026-06-03T10:01:00.000Z")
    assert result["metadata"] == {"job": cancelled}
    again = packs.call("scheduler", "schedule.cancel", {"id": job["id"]}, now=shifted(NOW, minutes=5))
    assert again["output"] == f"Cancelled {job['id']}."
    assert jobs(facade)[0] == cancelled
    packs.tick(shifted(NOW, hours=1))
    assert facade.messages() == []
    assert packs.error("scheduler", "schedule.cancel", {"id": "sch_nope"}) == "Unknown scheduled job: sch_nope"
    assert packs.error("scheduler", "schedule.cancel", {}) == "id is required"


def test_webui_schedule_once_applies_no_form_default(packs, facade):
    with pytest.raises(ToolpackError, match=r"^schedule.once needs at or a positive after\* delay$"):
        packs.webui("scheduler", "schedule.once", {"body": "x"})
    result = packs.webui("scheduler", "schedule.once", {"afterMinutes": 60, "body": "x"})
    assert result["metadata"]["job"]["recipient"] == "pm"
    assert jobs(facade)[0]["nextAt"] == "2026-06-03T11:00:00.000Z"


def test_webui_jobs_panel_with_empty_input_lists_jobs(packs, facade):
    packs.webui("scheduler", "schedule.recurring", {"everyDays": 1, "body": "daily"})
    result = packs.webui("scheduler", "schedule.jobs", {})
    assert result["title"] == "scheduled messages"
    assert "[active/recurring] next 2026-06-04T10:00:00.000Z" in result["output"]
    job_id = result["metadata"]["jobs"][0]["id"]
    assert packs.webui("scheduler", "schedule.cancel", {"id": job_id})["output"] == f"Cancelled {job_id}."


# --- plan: tools (scenarios 20-29) ----------------------------------------------------------------


def create_plan(packs, **fields):
    return packs.call("plan", "plan.create", {"title": "Ship", "itemsText": "- Write spec\n2) Build\n\n* Test",
                                              **fields})


def test_plan_create_writes_state_and_reports(packs, facade):
    result = create_plan(packs)
    state = read_json(plan_file(facade))
    plan = state["activePlan"]
    assert state["archivedPlans"] == []
    assert re.fullmatch(r"pln_[0-9a-f-]{36}", plan["id"])
    assert [(item["id"], item["text"], item["status"]) for item in plan["items"]] == [
        ("item_1", "Write spec", "tbd"), ("item_2", "Build", "tbd"), ("item_3", "Test", "tbd")]
    assert (plan["status"], plan["targetAgent"], plan["nudgeCooldownMs"], plan["maxNudges"], plan["nudgeCount"],
            plan["nextItemNumber"], plan["createdAt"], plan["updatedAt"]) == (
        "active", "pm", 60000, 0, 0, 4, NOW, NOW)
    assert "instructions" not in plan
    assert result["title"] == "plan created"
    assert result["output"] == "\n".join([
        f"Plan {plan['id']}: Ship", "Status: active", "Target: pm", "Items: 3 tbd, 0 done, 0 wont_do",
        "Nudges: 0", "Items:", "1. item_1 [tbd] Write spec", "2. item_2 [tbd] Build", "3. item_3 [tbd] Test"])
    assert result["metadata"] == {"metrics": [
        {"label": "Status", "value": "active"}, {"label": "TBD", "value": 3}, {"label": "Done", "value": 0},
        {"label": "Won't do", "value": 0}, {"label": "Nudges", "value": 0}], "activePlan": plan}


def test_item_markers_are_stripped_once(packs, facade):
    packs.call("plan", "plan.create", {"title": "M", "itemsText": "1. a\n3.b\n-c\n  * d\r\n- - e"})
    assert [item["text"] for item in active_plan(facade)["items"]] == ["a", "b", "-c", "d", "- e"]


def test_second_create_needs_replace_active(packs, facade):
    first = create_plan(packs)["metadata"]["activePlan"]
    assert packs.error("plan", "plan.create", {"title": "Again", "itemsText": "x"}) == (
        f"Active plan already exists: {first['id']}; use plan.update or pass replaceActive: true")
    packs.call("plan", "plan.create", {"title": "Again", "itemsText": "x", "replaceActive": True},
               now=shifted(NOW, minutes=1))
    state = read_json(plan_file(facade))
    archived = state["archivedPlans"][0]
    assert (archived["id"], archived["status"], archived["closeReason"], archived["closedAt"]) == (
        first["id"], "replaced", "replaced by new plan", "2026-06-03T10:01:00.000Z")
    assert state["activePlan"]["title"] == "Again"


def test_create_over_a_finished_plan_archives_it_as_done(packs, facade):
    packs.call("plan", "plan.create", {"title": "Small", "itemsText": "only"})
    packs.call("plan", "plan.set_item_status", {"itemIndex": 1, "status": "done"})
    packs.call("plan", "plan.create", {"title": "Next", "itemsText": "x"})
    archived = read_json(plan_file(facade))["archivedPlans"][0]
    assert (archived["title"], archived["status"], archived["closeReason"]) == ("Small", "done", "replaced by new plan")


@pytest.mark.parametrize("input, message", [
    ({"title": "X", "itemsText": "\n  \n"}, "plan.create needs at least one item in itemsText"),
    ({"title": " ", "itemsText": "a"}, "title is required"),
    ({"title": "X", "itemsText": "a", "targetAgent": "ghost"}, "Unknown targetAgent: ghost"),
    ({"title": "X", "itemsText": "a", "targetAgent": "user"}, "Unknown targetAgent: user"),
    ({"title": "X", "itemsText": "a", "maxNudges": "2"}, "Expected a finite number, got 2"),
    (None, "Tool input must be an object"),
])
def test_plan_create_validation_leaves_state_untouched(packs, facade, input, message):
    assert packs.error("plan", "plan.create", input) == message
    assert not plan_file(facade).exists()


def test_set_item_status_with_note(packs, facade):
    create_plan(packs)
    result = packs.call("plan", "plan.set_item_status", {"itemIndex": 1, "status": "done", "note": "merged"},
                        now=shifted(NOW, minutes=3))
    assert result["title"] == "plan item updated"
    assert "1. item_1 [done] Write spec \u2014 merged" in result["output"].splitlines()
    item = active_plan(facade)["items"][0]
    assert (item["status"], item["note"], item["updatedAt"]) == ("done", "merged", "2026-06-03T10:03:00.000Z")
    packs.call("plan", "plan.set_item_status", {"itemId": "item_1", "status": "tbd", "note": " ", "text": " New "})
    item = active_plan(facade)["items"][0]
    assert (item["status"], item["text"], "note" in item) == ("tbd", "New", False)


@pytest.mark.parametrize("input, message", [
    ({"itemIndex": 0, "status": "done"}, "Unknown plan item index: 0"),
    ({"itemIndex": 9, "status": "done"}, "Unknown plan item index: 9"),
    ({"itemId": "item_9", "status": "done"}, "Unknown plan item: item_9"),
    ({"status": "done"}, "plan.set_item_status needs itemId or itemIndex"),
    ({"itemId": "item_1", "status": "finished"}, "Invalid item status: finished"),
    ({"itemId": "item_1", "status": "done", "text": ""}, "text is required"),
])
def test_set_item_status_errors(packs, facade, input, message):
    create_plan(packs)
    before = plan_file(facade).read_text()
    assert packs.error("plan", "plan.set_item_status", input) == message
    assert plan_file(facade).read_text() == before


def test_finishing_the_last_item_finalizes_the_plan_and_no_nudge_follows(packs, facade):
    create_plan(packs)
    for index in (1, 2):
        packs.call("plan", "plan.set_item_status", {"itemIndex": index, "status": "done"})
    packs.call("plan", "plan.set_item_status", {"itemIndex": 3, "status": "wont_do"}, now=shifted(NOW, minutes=5))
    plan = active_plan(facade)
    assert (plan["status"], plan["completedAt"]) == ("done", "2026-06-03T10:05:00.000Z")
    status = packs.call("plan", "plan.status", {})
    assert "Status: done" in status["output"].splitlines()
    assert status["title"] == "plan status"
    packs.tick(shifted(NOW, hours=1))
    assert facade.signals("plan.continuation_nudge") == []


def test_plan_update_appends_reopens_replaces_and_validates(packs, facade):
    create_plan(packs)
    for index in (1, 2, 3):
        packs.call("plan", "plan.set_item_status", {"itemIndex": index, "status": "done"})
    result = packs.call("plan", "plan.update", {"itemsText": "Extra step"})
    plan = active_plan(facade)
    assert result["title"] == "plan updated"
    assert (plan["items"][-1]["id"], plan["items"][-1]["text"], plan["items"][-1]["status"]) == (
        "item_4", "Extra step", "tbd")
    assert plan["status"] == "active" and "completedAt" not in plan
    packs.call("plan", "plan.update", {"itemsText": "A\nB", "itemMode": "replace"})
    assert [(item["id"], item["text"]) for item in active_plan(facade)["items"]] == [("item_1", "A"), ("item_2", "B")]
    assert packs.error("plan", "plan.update", {"itemsText": "A", "itemMode": "merge"}) == "Invalid itemMode: merge"


def test_plan_update_metadata_fields(packs, facade):
    create_plan(packs, instructions="Keep notes", maxNudges=3)
    packs.call("plan", "plan.update", {"title": " Ship it ", "targetAgent": "worker", "nudgeCooldownMs": 5000.9,
                                       "maxNudges": None})
    plan = active_plan(facade)
    assert (plan["title"], plan["targetAgent"], plan["nudgeCooldownMs"], plan["maxNudges"],
            plan["instructions"]) == ("Ship it", "worker", 5000, 3, "Keep notes")
    packs.call("plan", "plan.update", {"targetAgent": "", "instructions": "  ", "nudgeCooldownMs": -4})
    plan = active_plan(facade)
    assert (plan["targetAgent"], "instructions" in plan, plan["nudgeCooldownMs"]) == ("pm", False, 0)
    assert packs.error("plan", "plan.update", {"targetAgent": "ghost"}) == "Unknown targetAgent: ghost"


def test_plan_close(packs, facade):
    plan = create_plan(packs)["metadata"]["activePlan"]
    assert packs.error("plan", "plan.close", {}) == (
        "Cannot close the plan as done while tbd items remain; mark them done or wont_do, or close it as abandoned")
    assert packs.error("plan", "plan.close", {"status": "paused"}) == "Invalid close status: paused"
    result = packs.call("plan", "plan.close", {"status": "abandoned", "reason": "descoped"},
                        now=shifted(NOW, hours=1))
    state = read_json(plan_file(facade))
    assert state["activePlan"] is None
    archived = state["archivedPlans"][0]
    assert (archived["id"], archived["status"], archived["closeReason"], archived["closedAt"]) == (
        plan["id"], "abandoned", "descoped", "2026-06-03T11:00:00.000Z")
    assert result["title"] == "plan closed"
    assert result["output"] == (
        f"No active plan.\n\nArchived plans:\n- {plan['id']} [abandoned] Ship (2026-06-03T11:00:00.000Z)")
    assert result["metadata"]["archivedPlans"] == state["archivedPlans"]


def test_plan_close_done_after_finishing(packs, facade):
    packs.call("plan", "plan.create", {"title": "T", "itemsText": "a"})
    packs.call("plan", "plan.set_item_status", {"itemIndex": 1, "status": "done"}, now=shifted(NOW, minutes=1))
    packs.call("plan", "plan.close", None, now=shifted(NOW, minutes=2))
    archived = read_json(plan_file(facade))["archivedPlans"][0]
    assert (archived["status"], archived["completedAt"], "closeReason" in archived) == (
        "done", "2026-06-03T10:01:00.000Z", False)


def test_no_active_plan(packs, facade):
    result = packs.call("plan", "plan.status", None)
    assert result["output"] == "No active plan."
    assert result["metadata"] == {"metrics": [{"label": "Active plan", "value": "none"}], "activePlan": None}
    archived = packs.call("plan", "plan.status", {"includeArchived": True})
    assert archived["output"] == "No active plan.\n\nArchived plans:\n- none"
    assert archived["metadata"]["archivedPlans"] == []
    message = "No active plan; create one with plan.create"
    assert packs.error("plan", "plan.update", {"title": "x"}) == message
    assert packs.error("plan", "plan.set_item_status", {"itemIndex": 1, "status": "done"}) == message
    assert packs.error("plan", "plan.close", {}) == message
    assert not plan_file(facade).exists()


def test_archive_keeps_the_twenty_most_recent_newest_first(packs, facade):
    for number in range(21):
        moment = shifted(NOW, minutes=number)
        packs.call("plan", "plan.create", {"title": f"P{number}", "itemsText": "a"}, now=moment)
        packs.call("plan", "plan.close", {"status": "abandoned"}, now=moment)
    archived = read_json(plan_file(facade))["archivedPlans"]
    assert [plan["title"] for plan in archived] == [f"P{number}" for number in range(20, 0, -1)]


def test_plan_output_shows_instructions_nudges_and_archive_line(packs, facade):
    create_plan(packs, instructions="Keep the verifier in the loop.")
    packs.tick(NOW)
    result = packs.call("plan", "plan.status", {"includeArchived": True})
    lines = result["output"].splitlines()
    assert lines[4:6] == [f"Nudges: 1, last {NOW}", "Instructions: Keep the verifier in the loop."]
    assert result["metadata"]["metrics"][-1] == {"label": "Nudges", "value": 1, "description": f"last {NOW}"}
    assert lines[-2:] == ["Archived plans:", "- none"]


def test_corrupt_plan_state_fails_every_operation(packs, facade):
    path = plan_file(facade)
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    for tool, input in [("plan.status", {}), ("plan.create", {"title": "x", "itemsText": "a"}),
                        ("plan.close", {})]:
        assert packs.error("plan", tool, input).startswith(f"Invalid state file {path}: ")
    packs.tick(NOW)
    assert facade.events[0][1]["toolpackId"] == "plan"
    assert path.read_text() == "not json"


# --- plan: continuation nudges (scenarios 30-36) ----------------------------------------------------


def nudges(facade):
    return facade.signals("plan.continuation_nudge")


def test_tick_requests_one_p2_nudge(packs, facade):
    plan = create_plan(packs, instructions="Be brief")["metadata"]["activePlan"]
    packs.call("plan", "plan.set_item_status", {"itemIndex": 1, "status": "done"})
    packs.tick(NOW)
    [signal] = nudges(facade)
    assert (signal["target_agent"], signal["priority"], signal["status"], signal["useful_effect"],
            signal["source_agent"]) == ("pm", "P2", "pending", 0, None)
    payload = json.loads(signal["payload_json"])
    assert payload["planId"] == plan["id"]
    assert payload["title"] == "Ship"
    assert payload["nudgeCount"] == 1
    assert payload["remainingItems"] == [{"id": "item_2", "text": "Build"}, {"id": "item_3", "text": "Test"}]
    assert payload["message"] == "\n".join([
        "Continue the active plan ahead of routine queued work.", "Plan: Ship", f"Plan id: {plan['id']}",
        "Target agent: pm", "Instructions: Be brief", "Remaining TBD items:", "- item_2: Build", "- item_3: Test",
        ("After meaningful progress, mark items done or wont_do with plan.set_item_status; use plan.status to "
         "see the current plan.")])
    state_plan = active_plan(facade)
    assert (state_plan["nudgeCount"], state_plan["lastNudgeAt"], state_plan["updatedAt"]) == (1, NOW, NOW)


def test_pending_nudge_dedupes_later_ticks(packs, facade):
    create_plan(packs, nudgeCooldownMs=0)
    packs.tick(NOW)
    packs.tick(shifted(NOW, minutes=5))
    packs.tick(shifted(NOW, hours=5))
    assert len(nudges(facade)) == 1
    assert active_plan(facade)["nudgeCount"] == 1


def test_unparsable_pending_nudge_payload_counts_as_a_match(packs, facade):
    create_plan(packs)
    facade.record_signal({"kind": "plan.continuation_nudge", "targetAgent": "pm", "priority": "P2"})
    facade.db.execute("UPDATE signals SET payload_json = '{' WHERE kind = 'plan.continuation_nudge'")
    packs.tick(NOW)
    assert len(nudges(facade)) == 1


def test_pending_nudge_of_another_plan_does_not_block(packs, facade):
    create_plan(packs)
    facade.record_signal({"kind": "plan.continuation_nudge", "targetAgent": "pm", "priority": "P2",
                          "payload": {"planId": "pln_old"}})
    packs.tick(NOW)
    assert len(nudges(facade)) == 2


def test_no_nudge_while_target_is_model_alive(packs, facade):
    create_plan(packs)
    facade.set_model_alive("pm", True)
    packs.tick(NOW)
    assert nudges(facade) == []
    assert "lastNudgeAt" not in active_plan(facade)


def test_cooldown_is_measured_from_the_previous_request(packs, facade):
    create_plan(packs)
    packs.tick(NOW)
    facade.deliver("pm")
    packs.tick(shifted(NOW, seconds=10))
    assert len(nudges(facade)) == 1
    packs.tick(shifted(NOW, seconds=61))
    assert len(nudges(facade)) == 2
    assert json.loads(nudges(facade)[1]["payload_json"])["nudgeCount"] == 2


def test_zero_cooldown_and_max_nudges(packs, facade):
    create_plan(packs, nudgeCooldownMs=0, maxNudges=2)
    for second in range(5):
        packs.tick(shifted(NOW, seconds=second))
        facade.deliver("pm")
    assert len(nudges(facade)) == 2
    assert active_plan(facade)["nudgeCount"] == 2


def test_nudges_follow_the_plan_target(packs, facade):
    create_plan(packs, targetAgent="worker")
    packs.tick(NOW)
    assert [signal["target_agent"] for signal in nudges(facade)] == ["worker"]


def test_webui_plan_create_defaults_to_coordinator(packs, facade):
    result = packs.webui("plan", "plan.create", {"title": "T", "itemsText": "a"})
    assert result["title"] == "plan created"
    assert active_plan(facade)["targetAgent"] == "pm"
    board = packs.webui("plan", "plan.board", {})
    assert board["title"] == "plan status" and board["output"].startswith("Plan pln_")
    packs.webui("plan", "plan.set_item_status", {"itemIndex": 1, "status": "done"})
    packs.webui("plan", "plan.update", {"title": "T2"})
    closed = packs.webui("plan", "plan.close", {"status": "done"})
    assert closed["title"] == "plan closed" and "[done] T2" in closed["output"]


def test_tick_finalizes_a_plan_completed_by_direct_edit(packs, facade):
    create_plan(packs)
    state = read_json(plan_file(facade))
    for item in state["activePlan"]["items"]:
        item["status"] = "done"
    write_json(plan_file(facade), state)
    packs.tick(shifted(NOW, minutes=1))
    plan = active_plan(facade)
    assert (plan["status"], plan["completedAt"]) == ("done", "2026-06-03T10:01:00.000Z")
    assert nudges(facade) == []


def test_unknown_target_agent_gets_no_nudge(packs, facade):
    create_plan(packs)
    state = read_json(plan_file(facade))
    state["activePlan"]["targetAgent"] = "gone"
    write_json(plan_file(facade), state)
    packs.tick(NOW)
    assert nudges(facade) == []
