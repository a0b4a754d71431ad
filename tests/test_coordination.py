"""The coordination rules on a real SQLite file: message routing and the policy, signal fan-out and
selection, activation start, completion and failure, the P1 tool boundary, stop and approve, wait and
submit, compaction and the nudges."""
import json
import re
import sqlite3

import pytest
from store_fixtures import T0, at, config_of, count, event_types, init_demo, make_config, rows, snapshot

import suzumio_approvals
import suzumio_config
import suzumio_coordination as coordination
import suzumio_records as rec
from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound


@pytest.fixture
def demo(tmp_path):
    root, store = init_demo(tmp_path / "root")
    yield store
    root.close()


def test_direct_message_defaults_to_p3_with_one_pending_signal(demo):
    message = coordination.send_message(demo, config_of(demo), "user", "Start", recipient="pm")
    assert message["priority"] == "P3"
    assert set(message) == {"id", "project", "sender", "recipient", "priority", "body", "createdAt"}
    signals = demo.list_signals(target_agent="pm")
    assert len(signals) == 1
    assert signals[0]["status"] == "pending" and signals[0]["priority"] == "P3"
    assert signals[0]["payload"] == message and signals[0]["usefulEffect"] is True
    assert event_types(demo)[-2:] == ["message.created", "signal.created"]
    assert demo.message(message["id"]) == message


@pytest.mark.parametrize("kwargs, error", [
    ({"recipient": "pm", "channel": "#project"}, 'Message cannot have both recipient and channel: drop "channel" '
                                                 'to send to pm only, or drop "recipient" to post to #project'),
    ({}, "Message needs recipient or channel"),
    ({"recipient": "ghost"}, "Unknown agent: ghost"),
    ({"channel": "#nope"}, "Unknown channel: #nope"),
])
def test_invalid_message_routing_writes_nothing(demo, kwargs, error):
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=f"^{re.escape(error)}$"):
        coordination.send_message(demo, config_of(demo), "user", "x", **kwargs)
    assert snapshot(demo) == before


def test_message_validation_order_body_priority_then_recipient(demo):
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^body is required$"):
        coordination.send_message(demo, config_of(demo), "user", None, recipient="ghost", priority="P9")
    with pytest.raises(BadRequest, match=r"^Invalid priority: P9$"):
        coordination.send_message(demo, config_of(demo), "user", "x", recipient="ghost", priority="P9")
    with pytest.raises(BadRequest, match=r"^Unknown agent: ghost$"):
        coordination.send_message(demo, config_of(demo), "user", "x", recipient="ghost", priority="P2")
    assert snapshot(demo) == before


def test_message_to_user_is_one_closed_useful_signal(demo):
    coordination.send_message(demo, config_of(demo), "pm", "Done", recipient="user", source_agent="pm")
    signals = demo.list_signals()
    assert len(signals) == 1
    assert signals[0]["status"] == "closed" and "targetAgent" not in signals[0]
    assert signals[0]["usefulEffect"] is True
    assert not demo.has_pending_signals()


def test_channel_fan_out_excludes_source_agent(demo):
    coordination.send_message(demo, config_of(demo), "worker", "note", channel="#project", source_agent="worker")
    pending = demo.list_signals(status="pending")
    assert sorted(s["targetAgent"] for s in pending) == ["pm", "verifier"]
    assert {s["targetChannel"] for s in pending} == {"#project"}
    coordination.send_message(demo, config_of(demo), "user", "all", channel="#project")
    assert len(demo.list_signals(status="pending")) == 5


def test_a_channel_post_never_wakes_its_sender_even_without_a_source_agent(demo):
    # a toolpack sending on an agent's behalf (a scheduled post) names the sender but no source agent
    coordination.send_message(demo, config_of(demo), "worker", "standup", channel="#project")
    assert sorted(s["targetAgent"] for s in demo.list_signals(status="pending")) == ["pm", "verifier"]


def test_channel_with_no_remaining_agent_records_one_closed_signal(tmp_path):
    root, store = init_demo(tmp_path / "root", make_config(agents={"solo": {}}))
    coordination.send_message(store, config_of(store), "solo", "me", channel="#project", source_agent="solo")
    signals = store.list_signals()
    assert len(signals) == 1 and signals[0]["status"] == "closed"
    assert signals[0]["targetChannel"] == "#project" and "targetAgent" not in signals[0]
    root.close()


def test_record_signal_status_rules(demo):
    before = snapshot(demo)
    with pytest.raises(BadRequest, match="Targeted signals cannot be closed"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="pm", status="closed")
    with pytest.raises(BadRequest, match=r"^Invalid signal status: open$"):
        coordination.record_signal(demo, config_of(demo), "x", status="open")
    with pytest.raises(BadRequest, match=r"^Unknown agent: ghost$"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="ghost")
    with pytest.raises(BadRequest, match=r"^payload must be an object$"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="ghost", payload=[1])
    with pytest.raises(BadRequest, match=r"^Expected boolean, got yes$"):
        coordination.record_signal(demo, config_of(demo), "x", useful_effect="yes")
    with pytest.raises(BadRequest, match=r"^Invalid priority: P7$"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="pm", priority="P7")
    assert snapshot(demo) == before
    (closed,) = coordination.record_signal(demo, config_of(demo), "x", status="pending")
    assert closed["status"] == "closed" and closed["usefulEffect"] is False
    (to_user,) = coordination.record_signal(demo, config_of(demo), "x", target_agent="user")
    assert to_user["status"] == "closed"


@pytest.mark.parametrize("kind, target, explicit, expected", [
    ("scheduler.no_effect_nudge", "pm", None, False),
    ("scheduler.failed_nudge", "pm", None, False),
    ("custom.work", "pm", None, True),
    ("message.created", None, None, True),
    ("completion.submitted", None, None, True),
    ("coordination.wait_for_signal", None, None, True),
    ("custom.audit", None, None, False),
    ("custom.audit", None, True, True),
    ("custom.work", "pm", False, False),
])
def test_useful_effect_defaults(demo, kind, target, explicit, expected):
    (signal,) = coordination.record_signal(demo, config_of(demo), kind, target_agent=target, useful_effect=explicit)
    assert signal["usefulEffect"] is expected
    stored = demo.db_get("SELECT useful_effect FROM signals WHERE id = ?", [signal["id"]])
    assert stored["useful_effect"] == int(expected)


def test_pending_signals_selection_p1_batch_else_one_routine(demo):
    coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P3", now=at(1))
    p2 = [coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P2",
                                     now=at(2 + i))[0] for i in range(3)]
    assert [s["id"] for s in coordination.pending_signals(demo, config_of(demo), "worker", now=at(60))] == [p2[0]["id"]]
    p1 = [coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P1",
                                     now=at(10 + i))[0] for i in range(2)]
    assert [s["id"] for s in coordination.pending_signals(demo, config_of(demo), "worker",
                                                          now=at(60))] == [s["id"] for s in p1]
    p0 = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P0", now=at(20))[0]
    two = suzumio_config.ProjectConfig.from_data(dict(demo.config(), scheduler={"maxSignalsPerActivation": 2}))
    assert [s["id"] for s in coordination.pending_signals(demo, two, "worker", now=at(60))] == [p0["id"], p1[0]["id"]]


def test_delayed_signal_is_invisible_until_not_before(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", not_before=at(3600),
                                           now=T0)
    assert signal["notBefore"] == at(3600)
    assert coordination.pending_signals(demo, config_of(demo), "worker", now=at(10)) == []
    assert not demo.has_pending_signals(now=at(10))
    assert not demo.has_pending_signals_for_agent("worker", now=at(10))
    assert demo.has_pending_signals_for_agent("worker", include_delayed=True, now=at(10))
    assert [s["id"] for s in coordination.pending_signals(demo, config_of(demo), "worker",
                                                          now=at(3600))] == [signal["id"]]
    (plain,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="pm", now=T0)
    assert "notBefore" not in plain


def test_mark_delivered_is_conditional_on_pending(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker")
    act = coordination.start_activation(demo, "worker", "p", [signal])
    assert demo.mark_signals_delivered("worker", [signal["id"]], "act_other") == []
    stored = demo.signal(signal["id"])
    assert stored["status"] == "delivered" and stored["deliveredActivationId"] == act["id"]


def test_start_activation_binds_agent_delivers_and_writes_prompt_row(demo):
    message = coordination.send_message(demo, config_of(demo), "user", "Start", recipient="worker")
    signals = coordination.pending_signals(demo, config_of(demo), "worker")
    act = coordination.start_activation(demo, "worker", "PROMPT", signals, now=at(5))
    assert act["status"] == "running" and act["startedAt"] == at(5)
    assert act["inputPath"] == str(demo.activation_dir(act["id"]) / "input.json")
    assert act["outputPath"].endswith("/result.json")
    worker = demo.agent("worker")
    assert worker["status"] == "running" and worker["activeActivationId"] == act["id"]
    signal = demo.signal(signals[0]["id"])
    assert signal["status"] == "delivered" and signal["deliveredActivationId"] == act["id"]
    (row,) = demo.active_history("worker")
    assert (row["role"], row["kind"], row["content"]) == ("user", "activation_prompt", "PROMPT")
    assert row["metadata"] == {"delivery": "activation_start", "signalIds": [signals[0]["id"]],
                               "priorities": ["P3"]}
    assert signals[0]["payload"]["id"] == message["id"]
    assert demo.running_activations()[0]["id"] == act["id"]


def test_second_activation_for_running_agent_fails_and_writes_nothing(demo):
    coordination.start_activation(demo, "worker", "p", [])
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="already has a running activation"):
        coordination.start_activation(demo, "worker", "p2", [signal])
    assert snapshot(demo) == before


@pytest.mark.parametrize("halt", ["stop", "approve"])
def test_activation_refused_while_project_not_running(demo, halt):
    getattr(coordination, halt)(demo)
    before = snapshot(demo)
    with pytest.raises(Conflict, match="no activation can start"):
        coordination.start_activation(demo, "worker", "p", [])
    assert snapshot(demo) == before
    demo.start()
    assert coordination.start_activation(demo, "worker", "p", [])["status"] == "running"


def test_start_activation_rolls_back_when_a_signal_is_no_longer_pending(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="pm")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="no longer pending"):
        coordination.start_activation(demo, "worker", "p", [signal])
    assert snapshot(demo) == before


def test_completion_counts_messages_and_effects_without_nudge(demo):
    act = coordination.start_activation(demo, "worker", "p", [], now=at(1))
    coordination.send_message(demo, config_of(demo), "worker", "result", recipient="pm", source_agent="worker",
                              source_activation=act["id"],
                              now=at(2))
    result = coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done", {"totalTokens": 5},
                                              now=at(3))
    assert result == {"status": "completed", "activationId": act["id"]}
    done = demo.activation(act["id"])
    assert done["emittedMessages"] == 1 and done["text"] == "done" and done["usage"] == {"totalTokens": 5}
    assert done["completedAt"] == at(3)
    event = demo.latest_event("activation.completed")
    assert event["data"] == {"activationId": act["id"], "agentId": "worker", "emittedMessages": 1,
                             "usefulEffects": 1}
    assert demo.agent("worker")["status"] == "quiet" and "activeActivationId" not in demo.agent("worker")
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


def test_an_activation_the_coordinator_asked_that_ends_without_a_word_back_tells_it_so(demo):
    config = config_of(demo)

    def asked(sender, then=None):
        coordination.send_message(demo, config, sender, "Write a.md", recipient="worker", source_agent=sender)
        act = coordination.start_activation(demo, "worker", "p", coordination.pending_signals(demo, config, "worker"))
        if then:
            then(act)
        coordination.complete_activation(demo, config, act["id"], "worker", "done")
        return act

    def wrote(act):
        call = demo.start_tool_call("worker", act["id"], "file.write", {"path": "/artifacts/worker/a.md"})
        coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", output="Wrote")

    def told_pm():
        return [m["body"] for m in demo.list_messages(50) if (m["sender"], m["recipient"]) == ("worker", "pm")]

    silent = asked("pm", wrote)
    assert told_pm() == ["Ended an activation without a report to you.\n\nFiles written in this activation: "
                         "/artifacts/worker/a.md"]
    # that notice is the activation's effect: no no-effect nudge follows
    assert demo.latest_event("activation.completed")["data"]["usefulEffects"] == 1
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []
    assert demo.signals_delivered_to(silent["id"])[0]["payload"]["sender"] == "pm"
    # a report, a wait, or work the coordinator did not ask for sends nothing more
    asked("pm", lambda act: coordination.send_message(demo, config, "worker", "a.md done", recipient="pm",
                                                      source_agent="worker", source_activation=act["id"]))
    asked("pm", lambda act: coordination.declare_wait(demo, config, "worker", act["id"], notify_pm=False))
    asked("user")
    assert len(told_pm()) == 2 and told_pm()[-1] == "a.md done"


def test_completion_of_non_running_activation_changes_nothing(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.cancel_activation(demo, act["id"], "Interrupted")
    before = snapshot(demo)
    assert coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "late",
                                            {}) == {"status": "cancelled",
                                                                         "activationId": act["id"]}
    assert snapshot(demo) == before
    with pytest.raises(Forbidden, match=f"^Activation {act['id']} does not belong to pm$"):
        coordination.complete_activation(demo, config_of(demo), act["id"], "pm", "x")
    with pytest.raises(NotFound, match=r"^Unknown activation: act_x$"):
        coordination.complete_activation(demo, config_of(demo), "act_x", "pm", "x")


def test_failure_marks_agent_failed_and_keeps_delivered_signals(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker")
    act = coordination.start_activation(demo, "worker", "p", [signal])
    failed = coordination.fail_activation(demo, act["id"], "provider timeout")
    assert failed["status"] == "failed" and failed["error"] == "provider timeout"
    assert demo.agent("worker")["status"] == "failed"
    last = demo.active_history("worker")[-1]
    assert (last["role"], last["kind"]) == ("assistant", "activation_failed")
    assert last["content"] == f"Activation {act['id']} failed.\n\nprovider timeout"
    assert last["metadata"] == {"error": "provider timeout"}
    assert demo.signal(signal["id"])["status"] == "delivered"
    assert coordination.fail_activation(demo, act["id"], "again") is None
    assert demo.latest_event("activation.failed")["data"]["error"] == "provider timeout"


def test_timeout_failure_records_no_nudge(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.fail_activation(demo, act["id"], "activation timed out")
    assert demo.activation(act["id"])["error"] == "activation timed out"
    assert demo.agent("worker")["status"] == "failed"
    assert demo.active_history("worker")[-1]["kind"] == "activation_failed"
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


def test_cancel_sets_quiet_with_history_row(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    cancelled = coordination.cancel_activation(demo, act["id"], "Interrupted by P0 signal sig_1")
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "Interrupted by P0 signal sig_1"
    assert demo.agent("worker")["status"] == "quiet"
    last = demo.active_history("worker")[-1]
    assert last["kind"] == "activation_cancelled" and "Interrupted by P0 signal sig_1" in last["content"]
    assert last["metadata"] == {"reason": "Interrupted by P0 signal sig_1"}
    assert coordination.cancel_activation(demo, act["id"], "again") is None
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


def test_no_effect_completion_records_first_nudge_immediately(demo):
    act = coordination.start_activation(demo, "worker", "p", [], now=at(1))
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "nothing", now=at(2))
    (nudge,) = demo.list_signals(kind="scheduler.no_effect_nudge")
    assert nudge["targetAgent"] == "worker" and nudge["priority"] == "P3" and nudge["status"] == "pending"
    assert nudge["usefulEffect"] is False
    payload = nudge["payload"]
    assert payload["attempt"] == 1 and payload["delayMs"] == 0 and payload["maxConsecutive"] == 3
    assert payload["previousActivationId"] == act["id"] and "notBefore" not in payload
    assert "messages_send" in payload["message"]


def test_the_no_effect_nudge_names_only_the_tools_the_agent_has():
    alone = rec.no_effect_message(lambda tool: tool in ("completion.submit", "file.write"))
    assert "completion_submit" in alone
    assert "messages_send" not in alone and "coordination_wait_for_signal" not in alone
    worker = rec.no_effect_message(lambda tool: tool in ("messages.send", "coordination.wait_for_signal"))
    assert "messages_send" in worker and "only after you have reported" in worker
    assert "completion_submit" not in worker
    assert rec.no_effect_message(lambda tool: False) == (
        "Your previous activation ended with nothing anyone can see. Do the work you were given with your tools.")


def _run_no_effect_chain(store, rounds, start=0):
    attempts, now = [], start
    for _ in range(rounds):
        now += 1000
        signals = coordination.pending_signals(store, config_of(store), "worker", now=at(now))
        act = coordination.start_activation(store, "worker", "p", signals, now=at(now))
        coordination.complete_activation(store, config_of(store), act["id"], "worker", "nothing", now=at(now + 1))
        nudge = store.latest_signal("scheduler.no_effect_nudge", "worker")
        fresh = nudge is not None and nudge["payload"]["previousActivationId"] == act["id"]
        attempts.append(nudge["payload"] if fresh else None)
    return attempts


def test_no_effect_nudge_respects_max_consecutive(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"maxConsecutive": 2, "initialDelayMs": 0,
                                                      "priority": "P2"}})
    root, store = init_demo(tmp_path / "root", config)
    payloads = _run_no_effect_chain(store, 3)
    assert [p and p["attempt"] for p in payloads] == [1, 2, None]
    assert {s["priority"] for s in store.list_signals(kind="scheduler.no_effect_nudge")} == {"P2"}
    root.close()


def test_no_effect_nudge_backoff_delays(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"initialDelayMs": 1000, "backoffFactor": 2,
                                                      "maxDelayMs": 5000, "maxConsecutive": 0}})
    root, store = init_demo(tmp_path / "root", config)
    payloads = _run_no_effect_chain(store, 5)
    assert [p["delayMs"] for p in payloads] == [0, 1000, 2000, 4000, 5000]
    second = store.list_signals(kind="scheduler.no_effect_nudge")[-2]
    assert second["payload"]["attempt"] == 2 and second["notBefore"] == second["payload"]["notBefore"]
    root.close()


def nudge_exhausted(store):
    return [json.loads(e["data_json"]) for e in reversed(store.list_events(1000))
            if e["type"] == "scheduler.nudge_exhausted"]


def test_no_effect_nudges_stop_after_three_by_default_with_one_event_and_a_message_starts_again(tmp_path):
    root, store = init_demo(tmp_path / "root", make_config(scheduler={"noEffectNudge": {"initialDelayMs": 0}}))
    payloads = _run_no_effect_chain(store, 4)
    assert [p and p["attempt"] for p in payloads] == [1, 2, 3, None]
    assert payloads[0]["maxConsecutive"] == 3
    last = max(store.list_activations(10), key=lambda a: a["startedAt"])
    assert nudge_exhausted(store) == [{"agentId": "worker", "rule": "noEffectNudge", "count": 3,
                                       "activationId": last["id"]}]
    # nothing is pending: the agent waits for a person or a new signal
    assert not store.has_pending_signals_for_agent("worker", include_delayed=True)
    coordination.send_message(store, config_of(store), "user", "Anything new?", recipient="worker", now=at(4500))
    payloads = _run_no_effect_chain(store, 1, start=4500)
    assert [p["attempt"] for p in payloads] == [1]
    assert len(nudge_exhausted(store)) == 1
    root.close()


def test_a_message_delivered_with_a_nudge_starts_the_count_again(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"initialDelayMs": 0, "maxConsecutive": 2}})
    root, store = init_demo(tmp_path / "root", config)
    assert [p["attempt"] for p in _run_no_effect_chain(store, 2)] == [1, 2]
    nudge = store.latest_signal("scheduler.no_effect_nudge", "worker")
    message = coordination.send_message(store, config_of(store), "user", "Here is more.", recipient="worker",
                                        now=at(3000))
    [signal] = [s for s in store.list_signals(status="pending") if s["payload"].get("id") == message["id"]]
    act = coordination.start_activation(store, "worker", "p", [nudge, signal], now=at(3001))
    coordination.complete_activation(store, config_of(store), act["id"], "worker", "nothing", now=at(3002))
    assert store.latest_signal("scheduler.no_effect_nudge", "worker")["payload"]["attempt"] == 1
    assert nudge_exhausted(store) == []
    root.close()


def test_failed_nudges_stop_at_max_consecutive_with_one_event_across_ticks(tmp_path):
    config = make_config(scheduler={"failedNudge": {"enabled": True, "maxConsecutive": 2, "initialDelayMs": 0}})
    root, store = init_demo(tmp_path / "root", config)
    signals, failed = [], []
    for step in range(3):
        act = coordination.start_activation(store, "worker", "p", signals, now=at(10 * step))
        coordination.fail_activation(store, act["id"], "model timeout", now=at(10 * step + 1))
        failed.append(act["id"])
        for tick in range(3):  # every tick looks again; one nudge, or one event, is all it writes
            coordination.nudge_and_monitor(store, config_of(store), rec.parse_ts(at(10 * step + 2 + tick)))
        signals = coordination.pending_signals(store, config_of(store), "worker", now=rec.parse_ts(at(10 * step + 5)))
    assert [s["payload"]["attempt"] for s in reversed(store.list_signals(kind="scheduler.failed_nudge"))] == [1, 2]
    assert signals == []
    assert nudge_exhausted(store) == [{"agentId": "worker", "rule": "failedNudge", "count": 2,
                                       "activationId": failed[-1]}]
    # a person's message starts the count again
    coordination.send_message(store, config_of(store), "user", "Try this instead.", recipient="worker", now=at(40))
    act = coordination.start_activation(store, "worker", "p",
                                        coordination.pending_signals(store, config_of(store), "worker", at(41)),
                                        now=at(41))
    coordination.fail_activation(store, act["id"], "still failing", now=at(42))
    coordination.nudge_and_monitor(store, config_of(store), rec.parse_ts(at(43)))
    assert store.latest_signal("scheduler.failed_nudge", "worker")["payload"]["attempt"] == 1
    assert len(nudge_exhausted(store)) == 1
    root.close()


def test_delayed_nudge_not_returned_before_not_before(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"initialDelayMs": 1000}})
    root, store = init_demo(tmp_path / "root", config)
    act = coordination.start_activation(store, "worker", "p", [], now=at(1))
    coordination.complete_activation(store, config_of(store), act["id"], "worker", "x", now=at(2))
    first = coordination.pending_signals(store, config_of(store), "worker", now=at(2))
    act2 = coordination.start_activation(store, "worker", "p", first, now=at(3))
    coordination.complete_activation(store, config_of(store), act2["id"], "worker", "x", now=at(4))
    assert coordination.pending_signals(store, config_of(store), "worker", now=at(4.5)) == []
    assert coordination.pending_signals(store, config_of(store), "worker", now=at(5))[0]["payload"]["attempt"] == 2
    root.close()


def test_no_effect_nudge_disabled(tmp_path):
    root, store = init_demo(tmp_path / "root", make_config(scheduler={"noEffectNudge": {"enabled": False}}))
    act = coordination.start_activation(store, "worker", "p", [])
    coordination.complete_activation(store, config_of(store), act["id"], "worker", "x")
    assert store.list_signals(kind="scheduler.no_effect_nudge") == []
    root.close()


@pytest.mark.parametrize("effect", ["submit", "wait", "useful_custom"])
def test_completion_after_useful_tools_records_no_nudge(demo, effect):
    agent = "pm" if effect == "submit" else "worker"
    act = coordination.start_activation(demo, agent, "p", [])
    if effect == "submit":
        coordination.submit_report(demo, agent, act["id"], "report")
    elif effect == "wait":
        coordination.declare_wait(demo, config_of(demo), agent, act["id"], notify_pm=False)
    else:
        coordination.record_signal(demo, config_of(demo), "x", source_agent=agent, source_activation=act["id"],
                                   useful_effect=True)
    coordination.complete_activation(demo, config_of(demo), act["id"], agent, "done")
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


def test_tool_call_on_ended_activation_and_foreign_call_are_rejected(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    call = demo.start_tool_call("worker", act["id"], "shell.exec", {})
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    before = snapshot(demo)
    ended = f"^Activation {act['id']} is completed; no more tool calls are accepted$"
    with pytest.raises(Conflict, match=ended):
        demo.start_tool_call("worker", act["id"], "shell.exec", {})
    assert snapshot(demo) == before
    other = coordination.start_activation(demo, "pm", "p", [])
    with pytest.raises(NotFound, match=f"^Unknown tool call for activation: {call['toolCallId']}$"):
        coordination.finish_tool_call(demo, "pm", other["id"], call["toolCallId"], "completed", "x")
    with pytest.raises(BadRequest, match=r"^Invalid tool call status: done$"):
        coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "done")
    with pytest.raises(Forbidden):
        demo.start_tool_call("worker", other["id"], "shell.exec", {})
    # finishing after the activation ended is accepted (the runner reports a late result)
    assert coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "late") == {
        "status": "completed"}


def test_tool_call_start_and_finish_write_row_and_history(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    call = demo.start_tool_call("worker", act["id"], "shell.exec", {"cmd": "ls"}, now=at(1))
    result = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "out", now=at(2))
    assert result == {"status": "completed"}
    row = demo.tool_call(call["toolCallId"])
    assert row["status"] == "completed" and row["completed_at"] == at(2) and row["output"] == "out"
    history = demo.active_history("worker")
    call_row, result_row = history[-2], history[-1]
    assert result_row["sequence"] == call_row["sequence"] + 1
    assert call_row["role"] == "tool_call" and call_row["content"] == (
        '# Tool Call\nTool: shell.exec\n\n{\n  "cmd": "ls"\n}')
    assert [p["type"] for p in call_row["parts"]] == ["tool_call"]
    assert call_row["parts"][0]["inputJson"] == '{"cmd":"ls"}'
    assert result_row["kind"] == "tool_result"
    assert result_row["content"] == "# Tool Result\nTool: shell.exec\nStatus: completed\n\nout"
    assert [p["type"] for p in result_row["parts"]] == ["tool_result"]
    assert demo.latest_event("tool.completed")["data"] == {"id": call["toolCallId"], "output": "out"}
    call2 = demo.start_tool_call("worker", act["id"], "shell.exec")
    coordination.finish_tool_call(demo, "worker", act["id"], call2["toolCallId"], "failed", error="bad")
    last = demo.active_history("worker")[-1]
    assert last["kind"] == "tool_error" and last["content"].endswith("Status: failed\nError: bad")
    listed = demo.list_tool_calls(10)
    assert listed[0]["id"] == call2["toolCallId"] and "output" not in listed[0]
    assert listed[1]["completed_at"] == at(2)
    stats = demo.tool_call_stats()["shell.exec"]
    assert (stats["callCount"], stats["completedCount"], stats["failedCount"]) == (2, 1, 1)
    assert stats["lastStatus"] == "failed" and stats["lastError"] == "bad"


def test_p1_delivered_at_tool_boundary_after_tool_result(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    message = coordination.send_message(demo, config_of(demo), "pm", "Urgent fix", recipient="worker", priority="P1",
                                        source_agent="pm")
    coordination.record_signal(demo, config_of(demo), "later", target_agent="worker", priority="P1",
                               not_before=at(3600, rec.now_ts()))
    coordination.record_signal(demo, config_of(demo), "routine", target_agent="worker", priority="P2")
    failed = demo.start_tool_call("worker", act["id"], "shell.exec")
    assert coordination.finish_tool_call(demo, "worker", act["id"], failed["toolCallId"], "failed", error="x") == {
        "status": "failed"}
    call = demo.start_tool_call("worker", act["id"], "shell.exec")
    result = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok")
    assert result["deliveredSignals"] == 1
    assert result["signalText"].startswith("# New P1 Signals Delivered At Tool Boundary")
    assert result["signalText"].endswith("\n\npm says (P1): Urgent fix") and message["priority"] == "P1"
    (delivered,) = demo.list_signals(status="delivered")
    assert delivered["payload"]["id"] == message["id"] and delivered["deliveredActivationId"] == act["id"]
    history = demo.active_history("worker")
    assert [h["kind"] for h in history[-2:]] == ["tool_result", "tool_boundary_signals"]
    assert history[-1]["metadata"] == {"delivery": "tool_boundary", "signalIds": [delivered["id"]],
                                       "toolCallId": call["toolCallId"]}
    assert history[-1]["content"] == result["signalText"]


def test_a_start_asked_again_with_its_call_key_answers_the_recorded_call_and_records_nothing(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    first = demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"}, call_key="k-1")
    before = snapshot(demo)
    again = demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"}, call_key="k-1")
    assert again == {"toolCallId": first["toolCallId"], "replayed": True}
    assert snapshot(demo) == before
    with pytest.raises(Conflict, match=r"^callKey k-1 was already used for another tool call$"):
        demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "rm -rf /"}, call_key="k-1")
    assert snapshot(demo) == before
    # without a key every start is a new call (runners before 16k); a key is scoped to its activation
    plain = [demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"}) for _ in range(2)]
    other = coordination.start_activation(demo, "pm", "p", [])
    elsewhere = demo.start_tool_call("pm", other["id"], "shell.exec", {"command": "ls"}, call_key="k-1")
    ids = {first["toolCallId"], elsewhere["toolCallId"], *(c["toolCallId"] for c in plain)}
    assert len(ids) == 4 and count(demo, "tool_calls") == 4


def test_the_same_finish_asked_again_answers_the_first_result_and_records_nothing(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.send_message(demo, config_of(demo), "pm", "Urgent fix", recipient="worker", priority="P1",
                              source_agent="pm")
    call = demo.start_tool_call("worker", act["id"], "shell.exec")
    first = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok")
    assert first["deliveredSignals"] == 1
    coordination.send_message(demo, config_of(demo), "pm", "Another", recipient="worker", priority="P1",
                              source_agent="pm")
    before = snapshot(demo)
    again = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok")
    assert again == first  # the signal text of the first answer, not the signal that came since
    assert snapshot(demo) == before
    failed = demo.start_tool_call("worker", act["id"], "shell.exec")
    assert coordination.finish_tool_call(demo, "worker", act["id"], failed["toolCallId"], "failed",
                                         error="E") == {"status": "failed"}
    before = snapshot(demo)
    assert coordination.finish_tool_call(demo, "worker", act["id"], failed["toolCallId"], "failed",
                                         error="E") == {"status": "failed"}
    assert snapshot(demo) == before
    # a different result still overwrites the first and appends its row (docs/design/tools.md)
    coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "changed")
    assert demo.tool_call(call["toolCallId"])["output"] == "changed"
    assert [h["kind"] for h in demo.active_history("worker")].count("tool_result") == 2


@pytest.mark.parametrize("tool", ["coordination.wait_for_signal", "completion.submit"])
def test_ending_tools_never_deliver_p1(demo, tool):
    act = coordination.start_activation(demo, "worker", "p", [])
    (p1,) = coordination.record_signal(demo, config_of(demo), "urgent", target_agent="worker", priority="P1")
    call = demo.start_tool_call("worker", act["id"], tool)
    assert coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok") == {
        "status": "completed"}
    assert demo.signal(p1["id"])["status"] == "pending"


def test_submit_report_writes_file_and_closed_useful_signal(demo):
    act = coordination.start_activation(demo, "pm", "p", [])
    result = coordination.submit_report(demo, "pm", act["id"], "  # Report\n\nAll done.  ")
    path = demo.dir / "final-report.md"
    assert path.read_text() == "# Report\n\nAll done.\n"
    project = demo.project()
    assert project["status"] == "submitted" and project["submitted_report"] == str(path)
    signal = result["signal"]
    assert signal["kind"] == "completion.submitted" and signal["status"] == "closed"
    assert signal["usefulEffect"] is True and signal["sourceActivation"] == act["id"]
    assert signal["payload"] == {"reportPath": str(path)}
    assert demo.latest_event("project.submitted")["data"] == {"agentId": "pm", "reportPath": str(path)}


def files_under(directory):
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


def test_a_submission_that_rolls_back_leaves_the_old_report_and_no_file(demo):
    act = coordination.start_activation(demo, "pm", "p", [])
    coordination.submit_report(demo, "pm", act["id"], "# First")
    # A real failure late in the transaction: SQLite refuses the closed completion signal.
    demo.db_run("CREATE TRIGGER refuse_submit BEFORE INSERT ON signals WHEN NEW.kind = 'completion.submitted' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    before, files = snapshot(demo), files_under(demo.dir)
    with pytest.raises(sqlite3.DatabaseError, match="refused by the test"):
        coordination.submit_report(demo, "pm", act["id"], "# Second")
    assert (demo.dir / "final-report.md").read_text() == "# First\n"
    assert files_under(demo.dir) == files and snapshot(demo) == before


def test_a_compaction_that_rolls_back_writes_no_archive(demo):
    act = _fill_history(demo, "worker", 20)
    demo.db_run("CREATE TRIGGER refuse_compaction BEFORE INSERT ON agent_history_compactions "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    before, files = snapshot(demo), files_under(demo.dir)
    with pytest.raises(sqlite3.DatabaseError, match="refused by the test"):
        coordination.compact_history(demo, "worker", act["id"], "summary", keep_tail=4)
    assert files_under(demo.dir) == files and snapshot(demo) == before
    demo.db_run("DROP TRIGGER refuse_compaction")
    done = coordination.compact_history(demo, "worker", act["id"], "summary", keep_tail=4)
    assert files_under(demo.dir) == sorted(files + [f"history/worker/{done['compaction']['id']}.json"])


def test_a_file_staged_in_a_rolled_back_write_never_appears(demo):
    target = demo.dir / "staged.txt"
    with pytest.raises(RuntimeError, match="late failure"), demo.write() as tx:
        tx.write_file(target, "text")
        assert files_under(demo.dir) != [] and not target.exists()  # only the temp file, beside it
        raise RuntimeError("late failure")
    assert not target.exists() and not [p for p in demo.dir.iterdir() if p.name.startswith(".staged.txt")]
    with demo.write() as tx:
        tx.write_file(target, "text")
        assert not target.exists()  # appears only after COMMIT
    assert target.read_text() == "text"


def test_wait_declaration_notifies_pm_only_from_others(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    result = coordination.declare_wait(demo, config_of(demo), "worker", act["id"], reason="Blocked on review")
    message = result["message"]
    assert message["recipient"] == "pm" and message["priority"] == "P3" and message["sender"] == "worker"
    assert message["body"] == "Waiting for future signals.\n\nReason: Blocked on review"
    signal = result["signal"]
    assert signal["kind"] == "coordination.wait_for_signal" and signal["status"] == "closed"
    assert signal["usefulEffect"] is True
    assert signal["payload"] == {"reason": "Blocked on review", "notifiedAgent": "pm",
                                 "messageId": message["id"]}
    pm_act = coordination.start_activation(demo, "pm", "p", [])
    messages_before = count(demo, "messages")
    pm_result = coordination.declare_wait(demo, config_of(demo), "pm", pm_act["id"])
    assert "message" not in pm_result and count(demo, "messages") == messages_before
    assert pm_result["signal"]["payload"] == {"reason": "Waiting for future signals."}


def test_stop_cancels_running_work_and_records_resume_signal(demo):
    (first,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P1")
    act = coordination.start_activation(demo, "worker", "p", [first], now=at(1))
    coordination.send_message(demo, config_of(demo), "user", "later work", recipient="worker", now=at(2))
    cancelled = coordination.stop(demo, now=at(3))
    assert [a["id"] for a in cancelled] == [act["id"]]
    assert demo.activation(act["id"])["status"] == "cancelled"
    assert demo.activation(act["id"])["error"] == "Project stopped"
    assert demo.agent("worker")["status"] == "quiet"
    assert demo.project()["status"] == "stopped"
    (resume,) = demo.list_signals(kind="scheduler.resume_after_stop")
    assert resume["priority"] == "P2" and resume["status"] == "pending" and resume["usefulEffect"] is False
    assert "sourceAgent" not in resume and "sourceActivation" not in resume
    assert resume["payload"] == {"cancelledActivationId": act["id"], "interruptedSignalIds": [first["id"]],
                                 "message": rec.RESUME_AFTER_STOP_MESSAGE}
    with pytest.raises(Conflict):
        coordination.start_activation(demo, "worker", "p", [])
    demo.start(now=at(4))
    chosen = coordination.pending_signals(demo, config_of(demo), "worker", now=at(5))
    assert [s["kind"] for s in chosen] == ["scheduler.resume_after_stop"]
    act2 = coordination.start_activation(demo, "worker", "p", chosen, now=at(5))
    assert demo.signal(resume["id"])["deliveredActivationId"] == act2["id"]
    assert coordination.pending_signals(demo, config_of(demo), "worker",
                                        now=at(6))[0]["payload"]["body"] == "later work"
    assert rec.render_signal(resume).startswith("Reminder from the scheduler (P2): ")


def test_approve_cancels_without_resume_signal(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    cancelled = coordination.approve(demo)
    assert [a["error"] for a in cancelled] == ["Project approved"]
    assert demo.activation(act["id"])["status"] == "cancelled"
    assert demo.agent("worker")["status"] == "quiet"
    assert demo.project()["status"] == "completed"
    assert demo.list_signals(kind="scheduler.resume_after_stop") == []
    status_events = [json.loads(e["data_json"]) for e in demo.list_events() if e["type"] == "project.status"]
    assert status_events[0] == {"status": "completed"}


def test_request_changes_validates_then_sends_p2_to_coordinator(demo):
    coordination.stop(demo)
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^body is required$"):
        coordination.request_changes(demo, config_of(demo), "  ")
    with pytest.raises(BadRequest, match=r"^Unknown agent: ghost$"):
        coordination.request_changes(demo, config_of(demo), "x", recipient="ghost")
    assert snapshot(demo) == before
    message = coordination.request_changes(demo, config_of(demo), "Please fix")
    assert (message["sender"], message["recipient"], message["priority"]) == ("user", "pm", "P2")
    assert demo.project()["status"] == "running"


def test_history_sequences_continue_across_activations_and_compaction(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    for i in range(4):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", f"a{i}")
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    act2 = coordination.start_activation(demo, "worker", "p", [])
    coordination.compact_history(demo, "worker", act2["id"], "summary", keep_tail=1)
    row = demo.append_history("worker", act2["id"], "assistant", "assistant_output", "after")
    sequences = [r["sequence"] for r in rows(demo, "SELECT sequence FROM agent_history_messages "
                                                   "WHERE agent_id = 'worker' ORDER BY sequence")]
    assert sequences == list(range(1, len(sequences) + 1))
    assert row["sequence"] == sequences[-1]


def test_append_history_checks_role_and_running_activation(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^Invalid history role: system$"):
        demo.append_history("worker", act["id"], "system", "k", "c")
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="history updates are not accepted"):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", "late")
    with pytest.raises(NotFound, match=r"^Unknown agent: ghost$"):
        demo.append_history("ghost", None, "assistant", "k", "c")
    assert snapshot(demo) == before
    row = demo.append_history("worker", None, "assistant", "note", "text", metadata={"model": "m"})
    assert row["parts"][0]["type"] == "text" and row["parts"][0]["text"] == "text"
    assert row["metadata"] == {"model": "m"} and "activationId" not in row
    assert demo.latest_event("agent_history.message")["data"] == {
        "id": row["id"], "agentId": "worker", "role": "assistant", "kind": "note", "chars": 4}


def _fill_history(store, agent, count_rows):
    act = coordination.start_activation(store, agent, "prompt", [])  # row 1: activation_prompt
    for i in range(count_rows - 1):
        store.append_history(agent, act["id"], "assistant", "assistant_output", f"row {i + 2}")
    return act


def test_compaction_archives_head_and_keeps_tail(demo):
    act = _fill_history(demo, "worker", 20)
    result = coordination.compact_history(demo, "worker", act["id"], "  The summary.  ", keep_tail=12,
                                          reason="provider_context_overflow", selected_model="main")
    assert result["status"] == "compacted"
    compaction = result["compaction"]
    assert compaction["archivedMessageCount"] == 8
    assert (compaction["startSequence"], compaction["endSequence"]) == (1, 8)
    archived = rows(demo, "SELECT DISTINCT compaction_id FROM agent_history_messages "
                          "WHERE compaction_id IS NOT NULL")
    assert archived == [{"compaction_id": compaction["id"]}]
    assert count(demo, "agent_history_messages", "compaction_id IS NOT NULL") == 8
    path = demo.history_archive_path("worker", compaction["id"])
    text = path.read_text()
    archive = json.loads(text)
    assert archive["version"] == 1 and len(archive["messages"]) == 8 and text.endswith("}\n")
    assert archive["reason"] == "provider_context_overflow" and archive["selectedModel"] == "main"
    assert compaction["rawChars"] == len(text) and compaction["archivePath"] == str(path)
    history = demo.active_history("worker")
    assert len(history) == 13 and history == result["history"]
    marker = history[0]
    assert (marker["role"], marker["kind"], marker["content"]) == ("compaction", "history_compaction",
                                                                    "The summary.")
    assert marker["metadata"]["startSequence"] == 1 and marker["metadata"]["endSequence"] == 8
    assert marker["metadata"]["compactionId"] == compaction["id"]
    assert marker["parts"][0]["type"] == "compaction"
    assert marker["parts"][0]["metadata"] == {"compactionId": compaction["id"], "archivePath": str(path)}
    assert [h["sequence"] for h in history[1:]] == list(range(9, 21))
    assert demo.history_archive("worker", compaction["id"]) == {"compaction": compaction, "archive": archive}
    assert demo.latest_event("agent_history.compacted")["data"]["archivedMessageCount"] == 8
    with pytest.raises(NotFound, match=r"^Unknown history compaction: cmp_x$"):
        demo.history_archive("worker", "cmp_x")
    # a later compaction archives the earlier marker too
    second = coordination.compact_history(demo, "worker", act["id"], "Second.", keep_tail=2)
    assert second["history"][0]["content"] == "Second."
    assert demo.db_get("SELECT compaction_id FROM agent_history_messages WHERE id = ?",
                       [marker["id"]])["compaction_id"] == second["compaction"]["id"]


def test_compaction_unchanged_when_history_fits_tail(demo):
    act = _fill_history(demo, "worker", 5)
    before = snapshot(demo)
    result = coordination.compact_history(demo, "worker", act["id"], "s", keep_tail=5)
    assert result["status"] == "unchanged" and len(result["history"]) == 5
    assert snapshot(demo) == before
    assert not (demo.dir / "history").exists()


def test_compaction_keep_tail_is_clamped(demo):
    act = _fill_history(demo, "worker", 120)
    assert len(coordination.compact_history(demo, "worker", act["id"], "s", keep_tail=500)["history"]) == 101
    act2 = _fill_history(demo, "pm", 3)
    assert len(coordination.compact_history(demo, "pm", act2["id"], "s", keep_tail=0)["history"]) == 2


def test_blank_summary_rejected_before_anything_is_written(demo):
    act = _fill_history(demo, "worker", 20)
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^summary is required$"):
        coordination.compact_history(demo, "worker", act["id"], "   ")
    assert snapshot(demo) == before
    assert not (demo.dir / "history").exists()


def test_history_paging_newest_first_with_next_before(demo):
    act = _fill_history(demo, "worker", 25)
    coordination.compact_history(demo, "worker", act["id"], "s", keep_tail=20)
    page = demo.history_page("worker", limit=10)
    assert list(page) == ["agentId", "nextBefore", "messages"]
    assert [m["sequence"] for m in page["messages"]] == list(range(26, 16, -1))
    assert page["nextBefore"] == 17
    rest = demo.history_page("worker", limit=100, before=page["nextBefore"])
    assert [m["sequence"] for m in rest["messages"]] == list(range(16, 0, -1)) and "nextBefore" not in rest
    assert rest["messages"][-1]["archived"] is True and "compactionId" in rest["messages"][-1]
    active_only = demo.history_page("worker", limit=100, include_archived=False)
    assert len(active_only["messages"]) == 21
    assert all(not m["archived"] for m in active_only["messages"])
    assert len(demo.history_page("worker", limit=0)["messages"]) == 1
    big = demo.append_history("worker", act["id"], "assistant", "assistant_output", "y" * 50000)
    top = demo.history_page("worker", limit=1)["messages"][0]
    assert top["id"] == big["id"] and top["content"].endswith("[truncated 10000 chars]")
    assert top["parts"][0]["text"].endswith("[truncated 30000 chars]")
    with pytest.raises(NotFound, match=r"^Unknown agent: ghost$"):
        demo.history_page("ghost")


@pytest.mark.parametrize("ending, status", [("fail", "failed"), ("cancel", "cancelled"), ("complete", "completed")])
def test_an_activation_that_ends_takes_its_pending_approval_requests_with_it(tmp_path, ending, status):
    config = make_config(agents={"pm": {"tools": ["*"]},
                                 "worker": {"tools": ["*"], "approve": [{"tool": "file.write"}]}})
    root, store = init_demo(tmp_path / "gated", config)
    try:
        act = coordination.start_activation(store, "worker", "p", [])
        started = suzumio_approvals.start_tool_call(store, config_of(store), "worker", act["id"], "file.write",
                                                    {"path": "a.txt", "content": "x"})
        if ending == "fail":
            coordination.fail_activation(store, act["id"], "boom")
        elif ending == "cancel":
            coordination.cancel_activation(store, act["id"], "Interrupted")
        else:
            coordination.complete_activation(store, config_of(store), act["id"], "worker", "done")
        request = suzumio_approvals.approval(store, started["approval"]["id"])
        assert (request["status"], request["decidedBy"], request["note"]) == (
            "cancelled", "system", f"Activation {act['id']} is {status}")
        assert store.latest_event("approval.cancelled")["data"]["id"] == request["id"]
        assert suzumio_approvals.pending_count(store) == 0
    finally:
        root.close()


def test_request_changes_in_a_team_without_its_coordinator_names_the_setting(tmp_path):
    root, store = init_demo(tmp_path / "root", make_config(agents={"solo": {}}))
    store.set_status("submitted")
    with pytest.raises(BadRequest) as refused:
        coordination.request_changes(store, config_of(store), "Again.")
    assert refused.value.message == (
        'request-changes needs a recipient: communication.coordinatorAgent is "pm", which is not in agents '
        "(solo); send a recipient, or set communication.coordinatorAgent to one of them")
    assert store.project()["status"] == "submitted"
    message = coordination.request_changes(store, config_of(store), "Again.", recipient="solo")
    assert (message["recipient"], store.project()["status"]) == ("solo", "running")
    root.close()
