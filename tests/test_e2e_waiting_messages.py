"""A message to a project that is not running, end to end on the real controller with the real runner and
the scripted provider: it is kept (its signal stays pending), the answer says so and how to resume, and
the team gets it at the next start or request-changes; a completed project refuses messages (409)."""
import pytest
import requests
from backend_fixtures import served_project
from conftest import wait_until

import suzumio_coordination as coordination

pytestmark = pytest.mark.timeout(240)

TEAM = {"pm": {"tools": ["messages.send"]}, "worker": {"tools": ["messages.send"]}}


def post(env, path, body=None):
    return requests.post(f"http://127.0.0.1:{env.server.port}/api/projects/demo{path}", json=body or {},
                         headers={"Host": f"127.0.0.1:{env.server.port}"}, timeout=30)


def delivered_to(env, signal_id):
    """The activation the signal was delivered to once it ended, else None."""
    signal = env.store.signal(signal_id)
    activation = signal.get("deliveredActivationId")
    if signal["status"] != "delivered" or activation is None:
        return None
    return activation if env.store.activation(activation)["status"] == "completed" else None


def message_signal(env, message_id):
    [signal] = [s for s in env.store.list_signals(target_agent="worker", limit=500)
                if (s.get("payload") or {}).get("id") == message_id]
    return signal


def test_a_message_waits_while_the_project_is_stopped_or_submitted_and_arrives_when_it_runs_again(tmp_path):
    with served_project(tmp_path, agents=TEAM) as env:
        assert post(env, "/stop").status_code == 200
        sent = post(env, "/messages", {"recipient": "worker", "body": "Do it when you are back."})
        assert sent.status_code == 200
        assert sent.json()["queued"] is True
        assert sent.json()["note"] == (
            "Project demo is stopped: the message is kept and delivered when the team runs again; start it to "
            "resume (suzumio start demo, or a POST to /api/projects/demo/start)")
        signal = message_signal(env, sent.json()["id"])
        assert signal["status"] == "pending" and env.store.list_activations() == []
        assert post(env, "/start").status_code == 200
        first = wait_until(lambda: delivered_to(env, signal["id"]), 60, message="the kept message delivered")
        assert env.store.activation(first)["agentId"] == "worker"

        coordination.submit_report(env.store, "pm", None, "# Report\n")
        before = len(env.store.list_activations(1000))
        later = post(env, "/messages", {"recipient": "worker", "body": "One more thing."})
        assert later.json()["queued"] is True and later.json()["note"] == (
            "Project demo is submitted: the message is kept and delivered when the team runs again; request "
            "changes to resume (a POST to /api/projects/demo/request-changes)")
        waiting = message_signal(env, later.json()["id"])
        assert env.store.signal(waiting["id"])["status"] == "pending"
        assert len(env.store.list_activations(1000)) == before  # the route's tick started nothing
        assert post(env, "/request-changes", {"body": "Add the wishes."}).status_code == 200
        second = wait_until(lambda: delivered_to(env, waiting["id"]), 60, message="the message kept while submitted")
        assert env.store.activation(second)["agentId"] == "worker"
        wait_until(lambda: not env.store.running_activations(), 60, message="the team quiet")

        assert post(env, "/approve").status_code == 200
        refused = post(env, "/messages", {"recipient": "worker", "body": "Too late."})
        assert (refused.status_code, refused.json()) == (409, {"error": (
            "Project demo is completed and takes no more messages; start it to run the team again "
            "(suzumio start demo, or a POST to /api/projects/demo/start)")})
        assert [m["body"] for m in env.store.list_messages(100) if m["body"] == "Too late."] == []


def test_a_message_to_a_running_project_carries_no_note(tmp_path):
    with served_project(tmp_path, agents=TEAM) as env:
        sent = post(env, "/messages", {"recipient": "worker", "body": "Now."})
        assert sent.status_code == 200
        assert "queued" not in sent.json() and "note" not in sent.json()
        wait_until(lambda: not env.store.running_activations(), 60, message="the team quiet")
