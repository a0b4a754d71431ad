"""Local and packaged toolpacks end to end: the real controller (store, scheduler ticks, Node host), the
real runner with its Node host (in a container on docker-chat, on the host on local) and the FakeModel.
Covers the scenarios that need the real store and scheduler: docs/design/toolpacks.md 1, 2, 7, 8, 16,
19, 30–35, 37, 38, 39 and docs/design/tools.md 2, 3, 41, 54–56, plus the review-tools round trip."""
import datetime
import json
import shutil
import time
from pathlib import Path

import pytest
from api_fixtures import serving
from conftest import wait_until
from e2e_fixtures import PROJECT, call, kind_params, project_config, running_team

import suzumio_config
import suzumio_coordination as coordination
import suzumio_registry
from suzumio_errors import ConfigError
from suzumio_records import format_ts, parse_ts, utc_now

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")]

HERE = Path(__file__).resolve().parent
REVIEW_TOOLS = HERE / "toolpack_fixtures" / "review-tools"
PACKAGED = Path(suzumio_registry.packaged_toolpacks_dir())
REPO = HERE.parent

AGENTS = {
    "pm": {"model": "pm", "tools": ["messages.send", "coordination.wait_for_signal", "schedule.*", "plan.*",
                                    "shell.exec"]},
    "worker": {"model": "worker", "tools": ["messages.send"]},
    "reviewer": {"model": "reviewer", "tools": ["messages.send", "review.summarize"]},
}
PRESETS = {agent: {"provider": "fake", "model": agent} for agent in AGENTS}
TOOLPACKS = ["core", "shell", {"packaged": "scheduler"}, {"packaged": "plan"},
             {"path": str(REVIEW_TOOLS), "id": "review-tools"}]


def toolpack_team(tmp_path, kind="local", **options):
    options.setdefault("agents", json.loads(json.dumps(AGENTS)))
    return running_team(tmp_path, kind, presets=PRESETS, toolpacks=TOOLPACKS, **options)


def ui(team, toolpack, entry, body=None):
    return team.service.post(f"/api/projects/{team.name}/tool-ui/{toolpack}/{entry}", body or {})


def ok(response):
    assert response.status_code == 200, response.text
    return response.json()


def jobs(team):
    path = team.store.toolpack_state_dir("scheduler") / "jobs.json"
    return json.loads(path.read_text())["jobs"] if path.exists() else []


def plan_state(team):
    return json.loads((team.store.toolpack_state_dir("plan") / "state.json").read_text())


def messages_from(team, sender):
    return [m for m in team.store.list_messages(1000, full_body=True) if m["sender"] == sender]


def nudges(team):
    return team.store.list_signals(kind="plan.continuation_nudge", limit=100)


def input_of(team, activation):
    return json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())


def mounts_of(team, activation):
    container = team.docker.containers.get(activation["containerName"])
    return {m["Destination"]: (m["Source"], m["RW"]) for m in container.attrs["Mounts"]}


def hook_failures(team):
    return [e["data"] for e in team.events("scheduler.hook_failed")]


# ---------------------------------------------------------------- review-tools from the runner

@pytest.mark.parametrize("kind", kind_params())
def test_reviewer_calls_a_local_toolpack_from_its_runner_and_pm_wakes(tmp_path, kind):
    with toolpack_team(tmp_path, kind) as team:
        team.model.enqueue(tool_calls=[call("review.summarize", summary="LGTM: the proof holds.")],
                           model="reviewer")
        team.model.enqueue(content="Reviewed.", model="reviewer")
        team.model.enqueue(content="Read the review.", model="pm")
        team.send("reviewer", "Review the proof.")
        [reviewed] = team.wait_activations("reviewer", 1)
        [woken] = team.wait_activations("pm", 1)

        assert reviewed["status"] == "completed", reviewed.get("error")
        assert woken["status"] == "completed", woken.get("error")
        [row] = team.store.list_tool_calls(10)
        assert (row["agent_id"], row["tool"], row["status"]) == ("reviewer", "review.summarize", "completed")
        [summarized] = team.store.list_signals(kind="review.summarized")
        assert team.tool_messages("reviewer")[0] == f"Summary recorded for pm: {summarized['id']}"
        assert summarized["sourceAgent"] == "reviewer" and summarized["sourceActivation"] == reviewed["id"]
        assert summarized["status"] == "delivered" and summarized["deliveredActivationId"] == woken["id"]
        assert f'Signal {summarized["id"]} of kind "review.summarized"' in woken["prompt"]
        assert "LGTM: the proof holds." in woken["prompt"]
        assert ok(ui(team, "review-tools", "review.stats"))["output"] == "Summaries: 1"

        # docs/design/tools.md 2–3: only allowed toolpacks reach the runner input (and the container)
        reviewer_packs = {p["id"]: p for p in input_of(team, reviewed)["toolpacks"]}
        assert list(reviewer_packs) == ["core", "review-tools"]
        assert [t["name"] for t in reviewer_packs["core"]["tools"]] == ["messages.send"]
        assert [t["name"] for t in reviewer_packs["review-tools"]["tools"]] == ["review.summarize"]
        assert reviewer_packs["review-tools"]["supportPath"] == "/toolpacks/review-tools/support"
        pm_packs = [p["id"] for p in input_of(team, woken)["toolpacks"]]
        assert pm_packs == ["core", "shell", "scheduler", "plan"]
        if kind == "docker-chat":
            assert reviewer_packs["review-tools"]["runnerModule"] == "/toolpacks/review-tools/runner.mjs"
            assert mounts_of(team, reviewed)["/toolpacks/review-tools"] == (str(REVIEW_TOOLS), False)
            assert "/toolpacks/review-tools" not in mounts_of(team, woken)
        else:
            assert reviewer_packs["review-tools"]["runnerModule"] == str(REVIEW_TOOLS / "runner.mjs")


# ---------------------------------------------------------------- packaged toolpacks from the runner

@pytest.mark.parametrize("kind", kind_params())
def test_packaged_toolpacks_resolve_mount_for_pm_only_and_run_from_its_runner(tmp_path, kind):
    """docs/design/toolpacks.md 2 and 38 (scenarios 3 and 20 through the model)."""
    with toolpack_team(tmp_path, kind) as team:
        assert not (tmp_path / "config" / "toolpacks").exists()
        resolved = team.store.resolved_yaml_path.read_text()
        assert "packaged: scheduler" in resolved and "packaged: plan" in resolved
        assert str(PACKAGED) not in resolved
        stored = team.store.config()["tools"]["toolpacks"]
        assert {"packaged": "scheduler"} in stored and {"packaged": "plan"} in stored

        team.model.enqueue(tool_calls=[call("schedule.once", afterMinutes=10, body="ping")], model="pm")
        team.model.enqueue(tool_calls=[call("plan.create", title="Ship", itemsText="- Write spec\n2) Build\n\n* Test")],
                           model="pm")
        team.model.enqueue(content="Scheduled and planned.", model="pm")
        team.model.enqueue(content="Nothing to do.", model="worker")
        before = utc_now()
        team.send("pm", "Plan the work.")
        team.send("worker", "Stand by.")
        # The plan's continuation nudge may wake pm again as soon as its first activation ends (the
        # completion's tick runs the plan hook): the first activation is the one under test.
        pm_act = min(team.wait_activations("pm", 1), key=lambda a: a["id"])
        [worker_act] = team.wait_activations("worker", 1)

        assert pm_act["status"] == "completed", pm_act.get("error")
        once, created = team.tool_messages("pm")[:2]
        assert once.startswith("Scheduled sch_")
        assert "Route: scheduler -> pm" in once and "Priority: P3" in once
        [job] = jobs(team)
        assert (job["type"], job["status"], job["recipient"], job["priority"], job["sender"]) == (
            "once", "active", "pm", "P3", "scheduler")
        assert job["waitForQuiet"] is False and job["schedule"] == {"afterMs": 600000}
        delay = (parse_ts(job["nextAt"]) - before).total_seconds()
        assert 600 <= delay < 660
        plan = plan_state(team)["activePlan"]
        assert created.startswith(f"Plan {plan['id']}: ")
        assert [(i["id"], i["text"], i["status"]) for i in plan["items"]] == [
            ("item_1", "Write spec", "tbd"), ("item_2", "Build", "tbd"), ("item_3", "Test", "tbd")]
        assert plan["targetAgent"] == "pm" and plan["nextItemNumber"] == 4

        pm_input, worker_input = input_of(team, pm_act), input_of(team, worker_act)
        pm_packs = {p["id"]: p for p in pm_input["toolpacks"]}
        assert [t["name"] for t in pm_packs["scheduler"]["tools"]] == [
            "schedule.once", "schedule.recurring", "schedule.list", "schedule.cancel"]
        assert "plan" in pm_packs
        worker_tools = [t["name"] for t in worker_input["tools"]]
        assert worker_tools == ["messages.send"]
        assert [p["id"] for p in worker_input["toolpacks"]] == ["core"]
        if kind == "docker-chat":
            pm_mounts, worker_mounts = mounts_of(team, pm_act), mounts_of(team, worker_act)
            assert pm_mounts["/toolpacks/scheduler"] == (str(PACKAGED / "scheduler"), False)
            assert pm_mounts["/toolpacks/plan"] == (str(PACKAGED / "plan"), False)
            assert not [target for target in worker_mounts if target.startswith("/toolpacks/")]
        else:
            assert pm_packs["scheduler"]["runnerModule"] == str(PACKAGED / "scheduler" / "runner.mjs")


def write_project(directory, toolpacks, extra_files=()):
    directory.mkdir(parents=True, exist_ok=True)
    for source, target in extra_files:
        shutil.copytree(source, directory / target)
    config = project_config("local", "http://127.0.0.1:9", "http://127.0.0.1:9/v1",
                            agents={"pm": {"model": "pm", "tools": ["messages.send", "schedule.*"]}},
                            toolpacks=toolpacks)
    path = directory / "project.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_registration_forms_and_their_config_errors(tmp_path):
    """docs/design/toolpacks.md 1 and 39."""
    with pytest.raises(ConfigError) as builtin:
        suzumio_config.load_project(write_project(tmp_path / "a", ["core", "scheduler"]), env={})
    assert "Unknown built-in toolpack: scheduler (configure local toolpacks as { path: ... })" in str(builtin.value)

    by_path = suzumio_config.load_project(write_project(
        tmp_path / "b", ["core", {"path": "./toolpacks/scheduler", "id": "scheduler"}],
        [(REPO / "toolpacks" / "scheduler", "toolpacks/scheduler")]), env={})
    packaged = suzumio_config.load_project(write_project(tmp_path / "c", ["core", {"packaged": "scheduler"}]), env={})
    forms = []
    for config in (by_path, packaged):
        pack = config.resolve_toolpacks().toolpack("scheduler")
        forms.append(([t.name for t in pack.tools], [e.id for e in pack.webui], pack.builtin))
    assert forms[0] == forms[1] == (["schedule.once", "schedule.recurring", "schedule.list", "schedule.cancel"],
                                    ["schedule.jobs", "schedule.once", "schedule.recurring", "schedule.cancel"],
                                    False)
    assert Path(packaged.resolve_toolpacks().toolpack("scheduler").path) == PACKAGED / "scheduler"

    with pytest.raises(ConfigError) as duplicate:
        suzumio_config.load_project(write_project(
            tmp_path / "d", ["core", {"path": "./toolpacks/scheduler", "id": "scheduler"}, {"packaged": "scheduler"}],
            [(REPO / "toolpacks" / "scheduler", "toolpacks/scheduler")]), env={})
    assert "Duplicate toolpack: scheduler" in str(duplicate.value)
    with pytest.raises(ConfigError) as enum:
        suzumio_config.load_project(write_project(tmp_path / "e", ["core", {"packaged": "schedule"}]), env={})
    assert ("- tools.toolpacks.1.packaged: Invalid enum value. Expected 'scheduler' | 'plan', received 'schedule'"
            in str(enum.value))


# ---------------------------------------------------------------- WebUI entries

def test_tool_ui_lists_review_scheduler_and_plan_entries_and_invokes_them(tmp_path):
    """docs/design/tools.md 41 with local toolpacks; docs/design/toolpacks.md 16 and 35."""
    with toolpack_team(tmp_path) as team:
        entries = ok(team.service.get(f"/api/projects/{team.name}/tool-ui"))
        listed = [(e["toolpackId"], e["id"], e["toolpackKind"]) for e in entries]
        local = [(pack, entry) for pack, entry, kind in listed if kind == "local"]
        assert local == [("scheduler", "schedule.jobs"), ("scheduler", "schedule.once"),
                         ("scheduler", "schedule.recurring"), ("scheduler", "schedule.cancel"),
                         ("plan", "plan.board"), ("plan", "plan.create"), ("plan", "plan.update"),
                         ("plan", "plan.set_item_status"), ("plan", "plan.close"),
                         ("review-tools", "review.stats")]
        assert [kind for _, _, kind in listed] == sorted(kind for _, _, kind in listed)  # built-ins first
        review = entries[-1]
        assert (review["title"], review["kind"], review["submitLabel"]) == (
            "Review statistics", "panel", "Refresh reviews")

        assert ok(ui(team, "review-tools", "review.stats"))["output"] == "Summaries: 0"
        no_delay = ui(team, "scheduler", "schedule.once", {"body": "x"})
        assert (no_delay.status_code, no_delay.json()) == (
            500, {"error": "schedule.once needs at or a positive after* delay"})
        assert jobs(team) == []
        created = ok(ui(team, "scheduler", "schedule.once", {"afterMinutes": 60, "body": "x"}))
        assert created["title"] == "scheduled message created"
        assert [j["recipient"] for j in jobs(team)] == ["pm"]
        listing = ok(ui(team, "scheduler", "schedule.jobs"))
        assert listing["output"].startswith("Scheduled messages:\n- sch_")

        plan = ok(ui(team, "plan", "plan.create", {"title": "T", "itemsText": "a"}))
        assert plan["metadata"]["activePlan"]["targetAgent"] == "pm"
        assert ok(ui(team, "plan", "plan.board"))["output"].startswith(
            f"Plan {plan['metadata']['activePlan']['id']}: T")


# ---------------------------------------------------------------- scheduler toolpack through real ticks

def test_due_job_is_sent_once_and_never_again_after_a_controller_restart(tmp_path):
    """docs/design/toolpacks.md 7, across a restart: new Root, Scheduler and ToolpackRuntime."""
    future = utc_now() + datetime.timedelta(hours=1)
    with toolpack_team(tmp_path) as team:
        past = ok(ui(team, "scheduler", "schedule.once", {"at": "2020-01-01T00:00:00Z", "recipient": "user",
                                                          "priority": "P2", "body": "From the past."}))
        later = ok(ui(team, "scheduler", "schedule.once", {"at": format_ts(future), "recipient": "user",
                                                           "body": "From the future."}))
        team.service.scheduler.tick(PROJECT)
        [sent] = messages_from(team, "scheduler")
        assert (sent["recipient"], sent["priority"], sent["body"]) == ("user", "P2", "From the past.")
        team.service.scheduler.tick(PROJECT)
        assert len(messages_from(team, "scheduler")) == 1
        first = {j["id"]: j for j in jobs(team)}[past["metadata"]["job"]["id"]]
        assert (first["status"], first["sentCount"], first["lastMessageId"]) == ("done", 1, sent["id"])
        assert first["completedAt"] == first["lastSentAt"]

    with serving(tmp_path / "root") as restarted:
        store = restarted.store(PROJECT)
        restarted.scheduler.tick(PROJECT)
        assert [m["body"] for m in store.list_messages(100) if m["sender"] == "scheduler"] == ["From the past."]
        restarted.scheduler.tick(PROJECT, now=future + datetime.timedelta(seconds=1))
        restarted.scheduler.tick(PROJECT, now=future + datetime.timedelta(seconds=5))
        bodies = [m["body"] for m in store.list_messages(100) if m["sender"] == "scheduler"]
        assert bodies == ["From the past.", "From the future."]
        state = json.loads((store.toolpack_state_dir("scheduler") / "jobs.json").read_text())
        assert [(j["status"], j["sentCount"]) for j in state["jobs"]] == [("done", 1), ("done", 1)]
        assert state["jobs"][1]["id"] == later["metadata"]["job"]["id"]


def test_wait_for_quiet_job_waits_while_its_recipient_runs(tmp_path):
    """docs/design/toolpacks.md 8 with a real runner keeping pm model-alive."""
    with toolpack_team(tmp_path) as team:
        gate = "while [ ! -e release ]; do sleep 0.05; done; echo released"
        team.model.enqueue(tool_calls=[call("shell.exec", command=gate, timeoutMs=120000)], model="pm")
        team.model.enqueue(content="Released.", model="pm")
        team.send("pm", "Hold on.")
        team.wait_for(lambda: team.store.list_tool_calls(10, tools=["shell.exec"]), message="pm in shell.exec")
        [running] = team.activations("pm")
        ok(ui(team, "scheduler", "schedule.once", {"at": "2020-01-01T00:00:00Z", "waitForQuiet": True,
                                                   "body": "When you are free."}))

        team.service.scheduler.tick(PROJECT)
        team.service.scheduler.tick(PROJECT)
        assert messages_from(team, "scheduler") == []
        assert [(j["status"], j["sentCount"]) for j in jobs(team)] == [("active", 0)]
        assert team.store.activation(running["id"])["status"] == "running"

        (team.store.workspace("pm") / "release").write_text("go")
        [done] = team.wait_activations("pm", 1)
        assert done["status"] == "completed", done.get("error")
        # the tick that pm's completion triggered finds pm quiet and sends the job
        [sent] = team.wait_for(lambda: messages_from(team, "scheduler"), message="the held job")
        assert (sent["recipient"], sent["body"]) == ("pm", "When you are free.")
        assert parse_ts(sent["createdAt"]) >= parse_ts(done["completedAt"])
        # the hook saves jobs.json right after the message commits: wait for that write, not a race
        team.wait_for(lambda: jobs(team)[0]["status"] == "done", message="the job marked done")
        assert [(j["status"], j["sentCount"]) for j in jobs(team)] == [("done", 1)]


def test_stopped_project_sends_nothing_until_started_then_once(tmp_path):
    """docs/design/toolpacks.md 19."""
    with toolpack_team(tmp_path) as team:
        ok(ui(team, "scheduler", "schedule.once", {"at": "2020-01-01T00:00:00Z", "body": "Due while stopped."}))
        ok(team.service.post(f"/api/projects/{team.name}/stop"))
        team.service.scheduler.tick(PROJECT)
        assert messages_from(team, "scheduler") == []
        assert jobs(team)[0]["status"] == "active"

        team.model.enqueue(content="Got the reminder.", model="pm")
        ok(team.service.post(f"/api/projects/{team.name}/start"))  # start runs a tick
        [sent] = messages_from(team, "scheduler")
        assert sent["body"] == "Due while stopped."
        team.service.scheduler.tick(PROJECT)
        [activation] = team.wait_activations("pm", 1)
        assert "Due while stopped." in activation["prompt"]
        team.service.scheduler.tick(PROJECT)
        assert len(messages_from(team, "scheduler")) == 1
        assert [(j["status"], j["sentCount"]) for j in jobs(team)] == [("done", 1)]


# ---------------------------------------------------------------- plan toolpack through real ticks

def create_plan(team, **fields):
    body = {"title": "Ship", "itemsText": "Write spec\nBuild", **fields}
    return ok(ui(team, "plan", "plan.create", body))["metadata"]["activePlan"]


def test_plan_nudges_its_idle_target_once_per_cooldown_up_to_max_nudges(tmp_path):
    """docs/design/toolpacks.md 30, 32, 33 and 34 (maxNudges) with real ticks and a real pm runner."""
    with toolpack_team(tmp_path) as team:
        plan = create_plan(team, maxNudges=2)
        base = utc_now()
        tick = team.service.scheduler.tick

        tick(PROJECT, now=base)
        [first] = nudges(team)
        assert (first["targetAgent"], first["priority"], first["status"]) == ("pm", "P2", "pending")
        assert first["usefulEffect"] is False and "sourceAgent" not in first
        payload = first["payload"]
        assert (payload["planId"], payload["nudgeCount"]) == (plan["id"], 1)
        assert payload["remainingItems"] == [{"id": "item_1", "text": "Write spec"}, {"id": "item_2", "text": "Build"}]
        assert payload["message"].startswith("Continue the active plan ahead of routine queued work.\n")
        assert "Remaining TBD items:\n- item_1: Write spec\n- item_2: Build" in payload["message"]
        assert plan_state(team)["activePlan"]["lastNudgeAt"] == format_ts(base)

        team.model.enqueue(content="Working on the plan.", model="pm")
        tick(PROJECT, now=base + datetime.timedelta(seconds=5))  # delivers the nudge: pm runs
        [woken] = team.wait_activations("pm", 1)
        assert woken["status"] == "completed", woken.get("error")
        assert f'Signal {first["id"]} of kind "plan.continuation_nudge"' in woken["prompt"]
        assert len(nudges(team)) == 1, "no nudge while pm ran, none within the cooldown after"

        tick(PROJECT, now=base + datetime.timedelta(seconds=10))
        tick(PROJECT, now=base + datetime.timedelta(seconds=59))
        assert len(nudges(team)) == 1
        tick(PROJECT, now=base + datetime.timedelta(seconds=61))
        second = nudges(team)[0]
        assert second["id"] != first["id"] and second["payload"]["nudgeCount"] == 2

        team.model.enqueue(content="Still working.", model="pm")
        tick(PROJECT, now=base + datetime.timedelta(seconds=62))
        team.wait_activations("pm", 2)
        for seconds in (200, 400, 800):
            tick(PROJECT, now=base + datetime.timedelta(seconds=seconds))
        assert len(nudges(team)) == 2
        assert plan_state(team)["activePlan"]["nudgeCount"] == 2
        assert team.model.pending() == 0


def test_plan_never_nudges_while_a_nudge_is_pending(tmp_path):
    """docs/design/toolpacks.md 31: ticks whose clock is before the nudge's delivery time keep it
    pending (it is not yet ready), and the dedupe rule holds back every further nudge."""
    with toolpack_team(tmp_path) as team:
        create_plan(team, nudgeCooldownMs=0)
        base = utc_now() - datetime.timedelta(hours=1)
        for minutes in (0, 1, 2, 5, 30):
            team.service.scheduler.tick(PROJECT, now=base + datetime.timedelta(minutes=minutes))
        [pending] = nudges(team)
        assert pending["status"] == "pending"
        assert team.activations("pm") == []
        assert plan_state(team)["activePlan"]["nudgeCount"] == 1


def test_plan_nudges_follow_the_target_and_stop_with_the_project(tmp_path):
    """docs/design/toolpacks.md 35 (targetAgent worker) and 37 (stopped project)."""
    with toolpack_team(tmp_path) as team:
        create_plan(team, targetAgent="worker")
        ok(team.service.post(f"/api/projects/{team.name}/stop"))
        for seconds in (0, 120):
            team.service.scheduler.tick(PROJECT, now=utc_now() + datetime.timedelta(seconds=seconds))
        assert nudges(team) == []
        assert plan_state(team)["activePlan"]["nudgeCount"] == 0

        team.store.start()
        team.service.scheduler.tick(PROJECT, now=utc_now())
        [nudge] = nudges(team)
        assert nudge["targetAgent"] == "worker"


# ---------------------------------------------------------------- the controller Node host (docs/design/tools.md 54–56)

def hook_mode(team, mode):
    (team.store.dir / "review-hook.txt").write_text(mode, encoding="utf-8")


def test_hook_callbacks_write_and_read_back_and_see_every_agent(tmp_path):
    """docs/design/tools.md 55 (hook side) and 56 (agents carry activeActivationId)."""
    with toolpack_team(tmp_path) as team:
        hook_mode(team, "send")
        now = utc_now()
        started = time.monotonic()
        team.service.scheduler.tick(PROJECT, now=now)
        assert time.monotonic() - started < 5, "hook callbacks must not deadlock against the store"
        seen = json.loads((team.store.dir / "review-hook-seen.json").read_text())
        assert seen["seenRows"] == 1 and seen["now"] == format_ts(now)
        assert team.store.message(seen["messageId"])["body"] == "hi from the hook"
        assert [(a["id"], a["activeActivationId"], a["modelAlive"]) for a in seen["agents"]] == [
            ("pm", None, False), ("reviewer", None, False), ("worker", None, False)]
        assert hook_failures(team) == []


def test_support_handler_makes_a_thousand_callbacks_and_sees_pending_signals(tmp_path):
    """docs/design/tools.md 55 (support side) and 56 (hasPendingSignalsForAgent) from a real runner."""
    agents = json.loads(json.dumps(AGENTS))
    agents["reviewer"]["tools"].append("review.probe")
    with toolpack_team(tmp_path, agents=agents) as team:
        gate = "while [ ! -e release ]; do sleep 0.05; done"
        team.model.enqueue(tool_calls=[call("shell.exec", command=gate, timeoutMs=120000)], model="pm")
        team.model.enqueue(content="Released.", model="pm")
        team.send("pm", "Hold on.")
        team.wait_for(lambda: team.store.list_tool_calls(10, tools=["shell.exec"]), message="pm in shell.exec")
        team.send("pm", "Queued while you run.")  # stays pending: pm is running
        team.model.enqueue(tool_calls=[call("review.probe")], model="reviewer")
        team.model.enqueue(content="Probed.", model="reviewer")
        team.send("reviewer", "Probe the store.")
        [probed] = team.wait_activations("reviewer", 1)
        assert probed["status"] == "completed", probed.get("error")
        assert team.tool_messages("reviewer")[0] == "callbacks 1000, agents 3000, pm pending true"
        team.model.enqueue(content="Read the queued message.", model="pm")
        (team.store.workspace("pm") / "release").write_text("go")
        team.wait_activations("pm", 2)


def test_hanging_hook_times_out_and_the_tick_and_host_recover(tmp_path):
    """docs/design/tools.md 54 (hook side): the 10 s host timeout, the built-in rules of the same tick, and a
    fresh host for the next support call."""
    nudge = {"noEffectNudge": {"enabled": False}, "allQuietNudge": {"enabled": True, "targetAgent": "pm"}}
    with toolpack_team(tmp_path, scheduler=nudge) as team:
        ok(ui(team, "review-tools", "review.stats"))
        old_pid = team.service.toolpacks.node.pid
        assert old_pid is not None
        hook_mode(team, "hang")
        started = time.monotonic()
        team.service.scheduler.tick(PROJECT)
        elapsed = time.monotonic() - started
        assert 9 <= elapsed < 20
        failures = hook_failures(team)
        assert {"toolpackId": "review-tools", "error": "Toolpack host failed: timed out after 10000 ms"} in failures
        assert len(team.store.list_signals(kind="scheduler.all_quiet_nudge")) == 1, "built-in rules still ran"
        wait_until(lambda: not Path(f"/proc/{old_pid}").exists() or _zombie(old_pid), 5, message="old host gone")

        hook_mode(team, "idle")
        assert ok(ui(team, "review-tools", "review.stats"))["output"] == "Summaries: 0"
        assert team.service.toolpacks.node.pid not in (None, old_pid)


@pytest.mark.slow
def test_hanging_support_handler_times_out_after_sixty_seconds(tmp_path):
    """docs/design/tools.md 54 (support side), through the runner route with a running activation."""
    agents = json.loads(json.dumps(AGENTS))
    agents["reviewer"]["tools"].append("review.hang")
    with toolpack_team(tmp_path, agents=agents) as team:
        activation = coordination.start_activation(team.store, "reviewer", "Hang.", [])
        body = {"project": team.name, "agentId": "reviewer", "activationId": activation["id"],
                "token": team.service.token(team.name, "reviewer"), "tool": "review.hang", "input": {}}
        started = time.monotonic()
        hung = team.service.post("/toolpacks/review-tools/support", body, timeout=120)
        assert 59 <= time.monotonic() - started < 90
        assert (hung.status_code, hung.json()) == (500, {"error": "Toolpack host failed: timed out after 60000 ms"})
        assert ok(ui(team, "review-tools", "review.stats"))["output"] == "Summaries: 0"


def _zombie(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True
