"""Scheduler acceptance scenarios (docs/design/scheduler.md) on a real SQLite file. Scheduling runs on the
in-memory FakeBackend (tests/fake_backend.py): its runners complete their activations or keep running,
and no process starts. What needs a real runner (a P0, stop or approve stopping its process group, a
start that fails, a completion's next tick) runs the real runner (scripted provider) on the real `local`
backend against the real controller, whose /activation-output completes it and asks for the next tick.
Time is injected through `now`."""
import datetime
import json
import threading

from backend_fixtures import events_of, fake_project, open_activation, process_group_alive, served_project
from conftest import wait_until
from store_fixtures import CONFIGS, config_of

import suzumio_backend as backend
import suzumio_coordination as coordination
import suzumio_prompts
import suzumio_scheduler as scheduler
import suzumio_store
from suzumio_records import parse_ts, to_datetime

THREE = {"pm": {"tools": ["messages.send"]}, "worker": {"tools": ["messages.send"]},
         "verifier": {"tools": ["messages.send"]}}


class RecordingHooks:
    """A hooks collaborator that records each call and runs an optional action."""

    def __init__(self, action=None):
        self.calls = []
        self.action = action

    def run_hooks(self, store, config, now):
        self.calls.append({a["id"]: a["status"] for a in store.list_agents()})
        if self.action:
            self.action(store)


def project(tmp_path, agents=None, script="done", **options):
    """A running project on the FakeBackend; each agent's runner plays `script` ("done" completes,
    "sleep" keeps the activation running until it is stopped)."""
    return fake_project(tmp_path, agents=agents or json.loads(json.dumps(THREE)), script=script, **options)


def real_project(tmp_path, agents=None, script="done", **options):
    """The same project with the real runner on the real `local` backend: each agent's runner plays
    SCRIPTS[script] ("sleep" keeps the activation running in a shell command until it is stopped)."""
    return served_project(tmp_path, agents=agents or json.loads(json.dumps(THREE)), script=script, **options)


def tick(env, now=None, hooks=None):
    scheduler.tick(env.store, env.backends, hooks or scheduler.NoHooks(), to_datetime(now), CONFIGS)


def later(minutes=0, seconds=0, base=None):
    base = base or datetime.datetime.now(datetime.UTC)
    return base + datetime.timedelta(minutes=minutes, seconds=seconds)


def activations_of(env, agent_id):
    return [env.store.activation(a["id"]) for a in env.store.list_activations(1000) if a["agentId"] == agent_id]


def send(env, recipient, priority="P3", body="Do it", **kw):
    return coordination.send_message(env.store, config_of(env.store), "user", body, recipient=recipient,
                                     priority=priority, **kw)


def signal_of(env, message):
    return next(s for s in env.store.list_signals(limit=1000) if s["payload"].get("id") == message["id"])


def wait_settled(env, agent_id):
    wait_until(lambda: all(a["status"] != "running" for a in activations_of(env, agent_id)), 15,
               message=f"{agent_id} activations settled")


# ---------------------------------------------------------------- selection and delivery

def test_tick_does_nothing_unless_project_running(tmp_path):
    with project(tmp_path) as env:
        env.store.set_status("initialized")
        message = send(env, "pm")
        tick(env)
        assert env.store.list_activations() == []
        assert signal_of(env, message)["status"] == "pending"


def test_user_message_starts_one_activation_and_records_the_prompt(tmp_path):
    with project(tmp_path) as env:
        message = send(env, "pm")
        tick(env)
        [act] = activations_of(env, "pm")
        sig = signal_of(env, message)
        assert sig["status"] == "delivered" and sig["deliveredActivationId"] == act["id"]
        prompt_rows = [h for h in env.store.active_history("pm") if h["kind"] == "activation_prompt"]
        assert prompt_rows[-1]["metadata"]["signalIds"] == [sig["id"]]
        assert prompt_rows[-1]["metadata"]["priorities"] == ["P3"]
        wait_settled(env, "pm")
        assert env.store.activation(act["id"])["status"] == "completed"


def test_activation_prompt_is_the_new_signals_and_the_system_message_holds_the_rest(tmp_path):
    agents = {"pm": {"tools": ["messages.send"]}, "worker": {"count": 2, "tools": ["messages.send"]}}
    with project(tmp_path, agents=agents) as env:
        message = send(env, "worker-1")
        tick(env)
        [act] = activations_of(env, "worker-1")
        assert act["prompt"] == suzumio_prompts.user_prompt([signal_of(env, message)])
        for part in ("Project task:", "Team:", "Files:", "Your tools:"):
            assert part not in act["prompt"]
        wait_settled(env, "worker-1")
        # the runner was handed the system message, rendered for the tools the agent has
        data = json.loads((env.store.activation_dir(act["id"]) / "input.json").read_text())
        system = data["activation"]["system"]
        assert system.startswith("You are worker-1 (agent id worker-1, ")
        assert "Your tools: messages_send. Call them by exactly these names." in system
        assert f"your artifact folder is {env.store.dir.resolve() / 'artifacts'}/worker-1: put" in system


def test_second_activation_prompt_has_only_its_own_signals(tmp_path):
    with project(tmp_path) as env:
        send(env, "pm")
        tick(env)
        wait_settled(env, "pm")
        second_message = send(env, "pm", priority="P2", body="Next step")
        tick(env)
        second = activations_of(env, "pm")[-1]["prompt"]
        # pm leads the work: the task comes first in each of its activations, then only the new signals
        task = env.store.project()["task"]
        assert second == suzumio_prompts.user_prompt([signal_of(env, second_message)], task)
        assert second.startswith(f"Project task: {task.strip()}\n\n") and "Do it" not in second


def test_the_coordinator_hears_when_everyone_it_gave_work_to_has_answered(tmp_path):
    agents = {"pm": {"tools": ["messages.send", "completion.submit"]}, "worker": {"tools": ["messages.send"]},
              "verifier": {"tools": ["messages.send"]}}
    with project(tmp_path, agents=agents, task="pm plans. worker writes a.md; the verifier reads it.") as env:
        config = config_of(env.store)
        unreported = "Ended an activation without a report to you."
        coordination.send_message(env.store, config, "pm", "Write a.md", recipient="worker")
        tick(env)
        [work] = activations_of(env, "worker")
        assert work["prompt"] == "pm says: Write a.md"  # a worker reads its part of the task in its system message
        wait_settled(env, "worker")
        # its activation ended without a word to pm: pm is told, and that is the worker's answer
        [notice] = [m for m in env.store.list_messages(10) if m["sender"] == "worker"]
        assert (notice["recipient"], notice["body"]) == ("pm", unreported)
        # the worker has answered, but the verifier, whom the task names, has been given nothing yet: that is next
        tick(env)
        wait_settled(env, "pm")
        assert activations_of(env, "pm")[-1]["prompt"].endswith(
            f"worker says: {unreported}\n\nEveryone you gave work to has answered: worker. You have given verifier "
            'nothing yet; what the project task asks of verifier: "the verifier reads it". Send verifier that '
            "assignment with messages_send now.")
        coordination.send_message(env.store, config, "pm", "Read a.md", recipient="verifier")
        tick(env)
        wait_settled(env, "verifier")
        # the answer that completes the round is in the activation it wakes
        tick(env)
        last = activations_of(env, "pm")[-1]["prompt"]
        assert last.endswith(f"verifier says: {unreported}\n\nEveryone you gave work to has answered: verifier, "
                             "worker. Call completion_submit now with the final report, unless the task needs more "
                             "work.")
        # each round's contract reminder goes to the runner: its turn after a text answer offers that tool alone
        wait_settled(env, "pm")
        kept = [row["metadata"].get("reminder") for row in env.store.active_history("pm")
                if row["kind"] == "activation_prompt"]
        inputs = [json.loads((env.store.activation_dir(act["id"]) / "input.json").read_text())["activation"]
                  for act in activations_of(env, "pm")]
        opening = "Your answer had no tool call, and text alone reaches no one. Everyone you gave work to has answered"
        delegate = {"text": f"{opening}, and verifier has no work yet: call messages_send now with recipient verifier "
                            'and its assignment, what the project task asks of it: "the verifier reads it".',
                    "tool": "messages_send"}
        submit = {"text": f"{opening}: call completion_submit now with the final report (Markdown): what was made and "
                          "the exact paths of the files.", "tool": "completion_submit"}
        assert kept == [delegate, submit] and [a.get("reminder") for a in inputs] == [delegate, submit]


def test_signal_rendering_direct_channel_and_custom_kind(tmp_path):
    with project(tmp_path) as env:
        direct = send(env, "pm")
        tick(env)
        sig = signal_of(env, direct)
        prompt = activations_of(env, "pm")[0]["prompt"]
        assert sig["payload"]["id"] == direct["id"]
        assert prompt.endswith("\n\nThe user says: Do it")
        wait_settled(env, "pm")
        channel = coordination.send_message(env.store, config_of(env.store), "user", "Hello all", channel="#project",
                                            priority="P2")
        tick(env)
        assert "The user says in #project (P2): Hello all" in activations_of(env, "worker")[-1]["prompt"]
        [custom] = coordination.record_signal(env.store, config_of(env.store), "review.ready",
                                              target_agent="verifier", priority="P1",
                                              payload={"file": "a.md"})
        wait_settled(env, "verifier")
        tick(env)
        prompt = activations_of(env, "verifier")[-1]["prompt"]
        assert f'Signal {custom["id"]} of kind "review.ready" (P1), {custom["createdAt"]}: {{"file": "a.md"}}' in prompt
        assert channel


def test_oldest_p2_overtakes_p3_and_one_routine_signal_per_start(tmp_path):
    with project(tmp_path, script="sleep") as env:
        p3 = send(env, "worker", "P3")
        p2s = [send(env, "worker", "P2", body=f"p2-{i}") for i in range(3)]
        tick(env)
        [act] = activations_of(env, "worker")
        assert env.store.signals_delivered_to(act["id"]) == [signal_of(env, p2s[0]) | {}]
        assert signal_of(env, p3)["status"] == "pending"


def test_p1_batch_excludes_routine_work(tmp_path):
    with project(tmp_path, script="sleep") as env:
        send(env, "worker", "P3")
        p1s = [send(env, "worker", "P1", body=f"p1-{i}") for i in range(2)]
        tick(env)
        [act] = activations_of(env, "worker")
        assert [s["id"] for s in env.store.signals_delivered_to(act["id"])] == [
            signal_of(env, m)["id"] for m in p1s]


def test_running_agent_is_left_alone_without_p0(tmp_path):
    with project(tmp_path) as env:
        act = open_activation(env, "worker")
        send(env, "worker", "P2")
        send(env, "worker", "P1")
        tick(env)
        assert env.store.activation(act["id"])["status"] == "running"
        assert len(activations_of(env, "worker")) == 1


def test_failed_agent_with_ready_work_is_started(tmp_path):
    with project(tmp_path, script="sleep") as env:
        act = open_activation(env, "worker")
        coordination.fail_activation(env.store, act["id"], "boom")
        send(env, "worker")
        tick(env)
        assert env.store.agent("worker")["status"] == "running"
        assert len(activations_of(env, "worker")) == 2


# ---------------------------------------------------------------- P0, stop, approve, timeout

def test_p0_cancels_running_process_and_restarts_with_p0_then_p1(tmp_path):
    with real_project(tmp_path, script="sleep") as env:
        send(env, "worker")
        tick(env)
        [first] = activations_of(env, "worker")
        pid = backend.local_pid(env.store.activation(first["id"])["containerName"])
        p1 = send(env, "worker", "P1", body="unblock")
        p0 = send(env, "worker", "P0", body="stop now")
        tick(env)
        p0_sig, p1_sig = signal_of(env, p0), signal_of(env, p1)
        cancelled = env.store.activation(first["id"])
        assert cancelled["status"] == "cancelled"
        assert cancelled["error"] == f"Interrupted by P0 signal {p0_sig['id']}"
        wait_until(lambda: not process_group_alive(pid), 4, message="runner group terminated")
        second = activations_of(env, "worker")[-1]
        prompt_row = next(h for h in env.store.active_history("worker") if h["activationId"] == second["id"]
                          and h["kind"] == "activation_prompt")
        assert prompt_row["metadata"]["signalIds"] == [p0_sig["id"], p1_sig["id"]]
        assert prompt_row["metadata"]["priorities"] == ["P0", "P1"]
        kinds = [h["kind"] for h in env.store.active_history("worker")]
        assert kinds.index("activation_cancelled") < len(kinds) - 1 - kinds[::-1].index("activation_prompt")


def test_stop_cancels_stops_process_and_leaves_resume_signal(tmp_path):
    with real_project(tmp_path, script="sleep") as env:
        send(env, "worker", body="first job")
        tick(env)
        [act] = activations_of(env, "worker")
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        waiting = send(env, "worker", "P3", body="second job")
        scheduler.stop_project(env.store, env.backends)
        assert env.store.activation(act["id"])["error"] == "Project stopped"
        assert env.store.activation(act["id"])["status"] == "cancelled"
        assert not process_group_alive(pid)
        assert env.store.agent("worker")["status"] == "quiet"
        [resume] = env.store.list_signals(kind="scheduler.resume_after_stop")
        assert resume["priority"] == "P2" and resume["status"] == "pending"
        tick(env)
        assert len(activations_of(env, "worker")) == 1
        env.store.start()
        tick(env)
        prompt = activations_of(env, "worker")[-1]["prompt"]
        assert f"Reminder from the scheduler (P2): {resume['payload']['message']}" in prompt
        assert signal_of(env, waiting)["status"] == "pending"


def test_approve_cancels_without_resume_signal(tmp_path):
    with real_project(tmp_path, script="sleep") as env:
        send(env, "worker")
        tick(env)
        [act] = activations_of(env, "worker")
        pid = backend.local_pid(env.store.activation(act["id"])["containerName"])
        scheduler.approve_project(env.store, env.backends)
        assert env.store.activation(act["id"])["error"] == "Project approved"
        assert not process_group_alive(pid)
        assert env.store.project()["status"] == "completed"
        assert env.store.list_signals(kind="scheduler.resume_after_stop") == []


def test_timeout_fails_activation_and_starts_the_next_in_the_same_tick(tmp_path):
    with project(tmp_path, timeout_ms=1000) as env:
        act = open_activation(env, "worker")
        message = send(env, "worker")
        now = parse_ts(act["startedAt"]) + datetime.timedelta(seconds=2)
        tick(env, now)
        timed_out = env.store.activation(act["id"])
        assert timed_out["status"] == "failed" and timed_out["error"] == "activation timed out"
        assert any(e["data"]["activationId"] == act["id"] for e in events_of(env.store, "activation.failed"))
        assert "activation_failed" in [h["kind"] for h in env.store.active_history("worker")]
        newest = activations_of(env, "worker")[-1]
        assert newest["id"] != act["id"]
        assert signal_of(env, message)["deliveredActivationId"] == newest["id"]


def test_timeout_with_failed_nudge_and_nothing_pending_records_a_nudge(tmp_path):
    nudge = {"failedNudge": {"enabled": True}}
    with project(tmp_path, timeout_ms=1000, scheduler=nudge) as env:
        act = open_activation(env, "worker")
        now = parse_ts(act["startedAt"]) + datetime.timedelta(seconds=2)
        tick(env, now)
        assert env.store.activation(act["id"])["status"] == "failed"
        [sig] = env.store.list_signals(kind="scheduler.failed_nudge")
        assert sig["targetAgent"] == "worker" and sig["payload"]["previousActivationId"] == act["id"]
        assert len(activations_of(env, "worker")) == 1


def test_activation_younger_than_the_timeout_is_left_alone(tmp_path):
    with project(tmp_path, timeout_ms=1000) as env:
        act = open_activation(env, "worker")
        tick(env, parse_ts(act["startedAt"]) + datetime.timedelta(milliseconds=999))
        assert env.store.activation(act["id"])["status"] == "running"


def test_stale_binding_is_cleared_and_work_restarts(tmp_path):
    with project(tmp_path) as env:
        act = open_activation(env, "worker")
        # A completed activation whose agent row still names it (an interrupted writer left it bound).
        env.store.db_run("UPDATE activations SET status = 'completed' WHERE id = ?", [act["id"]])
        message = send(env, "worker")
        tick(env)
        assert signal_of(env, message)["status"] == "delivered"
        assert activations_of(env, "worker")[-1]["id"] != act["id"]

    with project(tmp_path / "b") as env:
        act = open_activation(env, "worker")
        env.store.db_run("UPDATE activations SET status = 'failed' WHERE id = ?", [act["id"]])
        tick(env)
        agent = env.store.agent("worker")
        assert agent["status"] == "failed" and not agent.get("activeActivationId")


def test_backend_start_failure_fails_activation_and_tick_continues(tmp_path):
    with real_project(tmp_path) as env:
        import shutil
        shutil.rmtree(env.store.workspace("pm"))
        send(env, "pm")
        send(env, "worker")
        tick(env)
        [pm_act] = activations_of(env, "pm")
        assert env.store.activation(pm_act["id"])["status"] == "failed"
        assert env.store.activation(pm_act["id"])["error"]
        assert env.store.agent("pm")["status"] == "failed"
        assert len(activations_of(env, "worker")) == 1


def test_guarded_creation_after_concurrent_stop_writes_nothing(tmp_path, monkeypatch):
    with project(tmp_path) as env:
        message = send(env, "worker")
        original = suzumio_prompts.user_prompt

        def stop_meanwhile(*args):
            coordination.stop(env.store)  # another process's stop commits while this tick renders the prompt
            return original(*args)

        monkeypatch.setattr(suzumio_prompts, "user_prompt", stop_meanwhile)
        tick(env)
        assert env.store.list_activations() == []
        assert signal_of(env, message)["status"] == "pending"
        assert all(h["kind"] != "activation_prompt" for h in env.store.active_history("worker"))


def test_two_concurrent_ticks_create_exactly_one_activation(tmp_path):
    with project(tmp_path, script="sleep") as env:
        send(env, "worker")
        sched = scheduler.Scheduler(env.root, env.backends, CONFIGS)
        threads = [threading.Thread(target=sched.tick, args=(env.store.project_id,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(activations_of(env, "worker")) == 1


# ---------------------------------------------------------------- nudges, monitors, hooks

def test_failed_nudge_backoff_chain_and_limit(tmp_path):
    rule = {"failedNudge": {"enabled": True, "maxConsecutive": 2, "initialDelayMs": 1000, "backoffFactor": 2,
                            "maxDelayMs": 5000}}
    with project(tmp_path, scheduler=rule) as env:
        first = open_activation(env, "worker")
        coordination.fail_activation(env.store, first["id"], "model timeout")
        now = later()
        tick(env, now)
        [nudge] = env.store.list_signals(kind="scheduler.failed_nudge")
        assert nudge["payload"]["attempt"] == 1 and nudge["payload"]["delayMs"] == 1000
        assert nudge["payload"]["error"] == "model timeout"
        assert parse_ts(nudge["notBefore"]) > now
        tick(env, now)
        assert len(env.store.list_signals(kind="scheduler.failed_nudge")) == 1
        second = coordination.start_activation(env.store, "worker", "p", [nudge], now + datetime.timedelta(seconds=2))
        coordination.fail_activation(env.store, second["id"], "again")
        tick(env, now + datetime.timedelta(seconds=3))
        newest = env.store.list_signals(kind="scheduler.failed_nudge")[0]
        assert newest["payload"]["attempt"] == 2 and newest["payload"]["delayMs"] == 2000
        third = coordination.start_activation(env.store, "worker", "p", [newest], now + datetime.timedelta(seconds=6))
        coordination.fail_activation(env.store, third["id"], "still")
        tick(env, now + datetime.timedelta(seconds=7))
        assert len(env.store.list_signals(kind="scheduler.failed_nudge")) == 2


def test_quiet_monitor_sends_and_repeats(tmp_path):
    rule = {"quietAgentMonitor": {"enabled": True, "rules": [{
        "agent": "worker", "recipient": "pm", "priority": "P2", "initialDelayMs": 1800000,
        "repeatDelayMs": 900000, "message": "{{agent}} has been quiet for {{quietMinutes}} minutes; "
                                            "attempt {{attempt}}."}]}}
    with project(tmp_path, scheduler=rule) as env:
        # pm and verifier are busy so only the rule under test fires
        open_activation(env, "pm")
        open_activation(env, "verifier")
        since = parse_ts(env.store.agent("worker")["updatedAt"])
        tick(env, since + datetime.timedelta(minutes=31))
        [message] = [m for m in env.store.list_messages() if m["sender"] == "monitor"]
        assert message["recipient"] == "pm" and message["priority"] == "P2"
        assert message["body"] == "worker has been quiet for 31 minutes; attempt 1."
        assert env.store.has_pending_signals_for_agent("pm", include_delayed=True)
        tick(env, since + datetime.timedelta(minutes=31))
        assert len([m for m in env.store.list_messages() if m["sender"] == "monitor"]) == 1
        event = events_of(env.store, "scheduler.quiet_agent_monitor.message_sent")[0]
        tick(env, parse_ts(event["created_at"]) + datetime.timedelta(minutes=16))
        bodies = [m["body"] for m in env.store.list_messages() if m["sender"] == "monitor"]
        assert bodies[-1].endswith("attempt 2.")


def test_failed_monitor_renders_error_and_activation(tmp_path):
    rule = {"failedAgentMonitor": {"enabled": True, "rules": [{
        "agent": "worker", "recipient": "pm", "message": "{{agent}} failed for {{failedMinutes}} minutes after "
                                                         "{{activationId}}; attempt {{attempt}}; error {{error}}."}]}}
    with project(tmp_path, scheduler=rule) as env:
        open_activation(env, "pm")
        act = open_activation(env, "worker")
        coordination.fail_activation(env.store, act["id"], "model timeout")
        failed_at = parse_ts(env.store.activation(act["id"])["completedAt"])
        tick(env, failed_at + datetime.timedelta(minutes=31))
        [message] = [m for m in env.store.list_messages() if m["sender"] == "monitor"]
        assert message["body"] == f"worker failed for 31 minutes after {act['id']}; attempt 1; error model timeout."
        event = events_of(env.store, "scheduler.failed_agent_monitor.message_sent")[0]
        tick(env, parse_ts(event["created_at"]) + datetime.timedelta(minutes=15))
        assert [m for m in env.store.list_messages() if m["sender"] == "monitor"][-1]["body"].endswith(
            "attempt 2; error model timeout.")


def test_all_quiet_nudge_and_cooldown(tmp_path):
    rule = {"allQuietNudge": {"enabled": True, "targetAgent": "pm", "priority": "P2", "message": "Wake up."}}
    with project(tmp_path, scheduler=rule) as env:
        now = later()
        tick(env, now)
        [sig] = env.store.list_signals(kind="scheduler.all_quiet_nudge")
        assert sig["targetAgent"] == "pm" and sig["priority"] == "P2" and sig["status"] == "pending"
        assert sig["payload"]["message"] == "Wake up."
        env.store.db_run("UPDATE signals SET status = 'delivered' WHERE id = ?", [sig["id"]])
        tick(env, now + datetime.timedelta(seconds=10))
        assert len(env.store.list_signals(kind="scheduler.all_quiet_nudge")) == 1

    with project(tmp_path / "b", scheduler=rule) as env:
        act = open_activation(env, "worker")
        coordination.fail_activation(env.store, act["id"], "x")
        tick(env)
        assert env.store.list_signals(kind="scheduler.all_quiet_nudge") == []


def test_hook_runs_after_delivery_and_its_signal_waits_for_the_next_tick(tmp_path):
    with project(tmp_path, script="sleep") as env:
        send(env, "worker")
        hooks = RecordingHooks(lambda store: coordination.record_signal(store, config_of(store), "review.ready",
                                                                        target_agent="verifier"))
        tick(env, hooks=hooks)
        assert hooks.calls[0]["worker"] == "running", "hooks observe post-delivery state"
        assert activations_of(env, "verifier") == []
        tick(env, hooks=RecordingHooks())
        assert len(activations_of(env, "verifier")) == 1


def test_failing_hooks_are_recorded_and_built_in_rules_still_run(tmp_path):
    def explode(store):
        raise RuntimeError("hook exploded")

    rule = {"allQuietNudge": {"enabled": True}}
    with project(tmp_path, scheduler=rule) as env:
        tick(env, hooks=RecordingHooks(explode))
        [event] = events_of(env.store, "scheduler.hook_failed")
        assert event["data"]["error"] == "hook exploded"
        assert len(env.store.list_signals(kind="scheduler.all_quiet_nudge")) == 1


# ---------------------------------------------------------------- the background thread

def test_background_thread_ticks_and_isolates_project_errors(tmp_path):
    with project(tmp_path / "a") as broken, project(tmp_path / "b") as env:
        env.root = env.root  # both roots differ; use a scheduler over b's root plus a broken project in it
        send(env, "pm")
        env.store.db_run("CREATE TABLE IF NOT EXISTS x (y)")
        sched = scheduler.Scheduler(env.root, env.backends, CONFIGS)
        names = ["aaa-missing", env.store.project_id]
        env.root.list_projects = lambda: names  # a project that cannot be opened sorts first
        sched.start()
        try:
            wait_until(lambda: activations_of(env, "pm"), 10, message="background tick started pm")
            assert sched._thread.name == "suzumio-scheduler"
        finally:
            sched.stop()
        assert sched._thread is None
        assert broken.store.list_activations() == []


def test_completion_without_effect_leaves_a_no_effect_nudge_that_the_completion_tick_delivers(tmp_path):
    rule = {"noEffectNudge": {"enabled": True, "maxConsecutive": 1}}
    with real_project(tmp_path, scheduler=rule) as env:
        send(env, "pm")
        tick(env)
        wait_until(lambda: len(activations_of(env, "pm")) == 2, 15, message="the nudge started pm again")
        wait_settled(env, "pm")
        first, second = activations_of(env, "pm")
        assert (first["status"], first["text"]) == ("completed", "done")
        [nudge] = env.store.list_signals(kind="scheduler.no_effect_nudge")
        assert nudge["targetAgent"] == "pm" and nudge["priority"] == "P3"
        assert nudge["payload"]["attempt"] == 1 and nudge["payload"]["delayMs"] == 0
        assert nudge["payload"]["previousActivationId"] == first["id"]
        assert nudge["deliveredActivationId"] == second["id"]
        assert "Reminder from the scheduler: " in second["prompt"]
        assert second["text"] == "No scripted turn for pm."


def test_an_agent_that_ignores_nudges_is_nudged_three_times_then_waits_until_a_person_writes(tmp_path):
    with real_project(tmp_path, scheduler={"noEffectNudge": {}}) as env:  # the defaults, as a project file has them
        send(env, "pm")
        tick(env)
        # the first nudge comes at once: the completion's own tick starts pm again with it
        wait_until(lambda: len(activations_of(env, "pm")) == 2, 15, message="the first nudge started pm")
        for count, wait in ((3, 31), (4, 61)):  # the second after 30 s, the third after 60 s
            wait_settled(env, "pm")
            tick(env, later(seconds=wait))
            assert len(activations_of(env, "pm")) == count
        wait_settled(env, "pm")
        attempts = [s["payload"]["attempt"] for s in env.store.list_signals(kind="scheduler.no_effect_nudge")]
        assert sorted(attempts) == [1, 2, 3]
        last = activations_of(env, "pm")[-1]  # by start time: the one the third nudge started
        [exhausted] = events_of(env.store, "scheduler.nudge_exhausted")
        assert exhausted["data"] == {"agentId": "pm", "rule": "noEffectNudge", "count": 3, "activationId": last["id"]}
        # nothing more however long it waits: a tick an hour later starts nothing and says nothing again
        for hours in (1, 24):
            tick(env, later(minutes=60 * hours))
        assert len(activations_of(env, "pm")) == 4
        assert not env.store.has_pending_signals_for_agent("pm", include_delayed=True)
        assert len(events_of(env.store, "scheduler.nudge_exhausted")) == 1
        # a person's message starts it again, and the count with it
        send(env, "pm", body="Any news?")
        tick(env)
        wait_until(lambda: len(activations_of(env, "pm")) == 6, 15, message="the message and a first nudge again")
        wait_settled(env, "pm")
        [answered] = [a for a in activations_of(env, "pm") if "Any news?" in a["prompt"]]
        [fresh] = [s for s in env.store.list_signals(kind="scheduler.no_effect_nudge")
                   if s["payload"]["previousActivationId"] == answered["id"]]
        assert fresh["payload"]["attempt"] == 1


# ---------------------------------------------------------------- one read of who has ready signals

def counting_ready_signals(env):
    calls = []
    real = env.store.ready_signals

    def counted(agent_id, *args, **kwargs):
        calls.append(agent_id)
        return real(agent_id, *args, **kwargs)

    env.store.ready_signals = counted
    return calls


def test_an_idle_tick_reads_who_has_ready_signals_once_and_selects_only_for_them(tmp_path):
    with project(tmp_path) as env:
        calls = counting_ready_signals(env)
        tick(env)
        assert calls == []  # nobody has a pending signal: no per-agent selection at all
        send(env, "worker")
        tick(env)
        assert set(calls) == {"worker"}
        [started] = activations_of(env, "worker")
        assert started["status"] in ("running", "completed")


def test_a_signal_committed_after_that_read_is_still_selected_in_the_same_tick(tmp_path):
    # The race a real part cannot be made to hit on demand: a route commits a message for "worker" just
    # after the tick read who had ready signals (nobody). The commit counter sends the tick back to reading.
    with project(tmp_path) as env:
        real = env.store.agents_with_ready_signals
        sent = []

        def read_then_commit(agent_ids, now=None, **reading):
            ready = real(agent_ids, now, **reading)
            sent.append(send(env, "worker"))
            return ready

        env.store.agents_with_ready_signals = read_then_commit
        tick(env, later(seconds=5))  # a tick whose clock is past the message's time
        [started] = activations_of(env, "worker")
        assert signal_of(env, sent[0])["deliveredActivationId"] == started["id"]


def test_an_idle_tick_sees_a_message_committed_by_another_process(tmp_path):
    # Another process writes on its own connection: this store's commit count does not move, and the
    # reads an idle tick reuses must still give way to the changed database.
    with project(tmp_path) as env:
        tick(env)
        tick(env)
        other = suzumio_store.Root(env.root.path)
        try:
            coordination.send_message(other.open_project(env.store.project_id), config_of(env.store), "user",
                                      "Do it", recipient="worker")
        finally:
            other.close()
        tick(env)
        assert len(activations_of(env, "worker")) == 1


def test_an_idle_tick_starts_a_delayed_signal_once_it_is_due(tmp_path):
    with project(tmp_path) as env:
        coordination.record_signal(env.store, config_of(env.store), "custom", target_agent="worker",
                                   payload={"message": "Later."}, not_before=later(minutes=5))
        tick(env)
        tick(env)
        assert activations_of(env, "worker") == []
        tick(env, later(minutes=6))
        assert len(activations_of(env, "worker")) == 1


# ---------------------------------------------------------------- route ticks shared by a burst

class CountingLock:
    """A project lock that counts the threads that came to take it, so a test can wait for them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.arrived = 0
        self._guard = threading.Lock()

    def __enter__(self):
        with self._guard:
            self.arrived += 1
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_routes_that_commit_during_a_tick_share_the_next_one_and_each_answers_after_it(tmp_path):
    release = threading.Event()
    seen = []  # the message count each tick's hooks step saw

    def hold_first_tick(store):
        seen.append(len(store.list_messages()))
        if len(seen) == 1:
            release.wait(10)

    with project(tmp_path) as env:
        name = env.store.project_id
        sched = scheduler.Scheduler(env.root, env.backends, CONFIGS, hooks=RecordingHooks(hold_first_tick))
        lock = sched._locks[name] = CountingLock()
        first = threading.Thread(target=sched.trigger, args=(name,))
        first.start()
        wait_until(lambda: seen, message="the first tick reached its hooks")
        answered = []
        routes = []
        for index in range(3):  # three routes commit while that tick runs, then ask for their tick
            send(env, "user", body=f"burst {index}")
            routes.append(threading.Thread(target=lambda: (sched.trigger(name), answered.append(list(seen)))))
            routes[-1].start()
        wait_until(lambda: lock.arrived == 4, message="the three routes waiting for the project lock")
        release.set()
        for thread in [first, *routes]:
            thread.join(10)
        assert seen == [0, 3]  # one tick for the burst, and it read all three messages
        assert answered == [[0, 3]] * 3  # every route answered after that tick
        sched.trigger(name)  # nothing ran since this call: it ticks on its own
        assert seen == [0, 3, 3]
