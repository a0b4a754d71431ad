"""The flight recorder end to end on both backends (docs/replay.md): the real controller, the real runner
and the FakeModel. Every model exchange the proxy forwarded is recorded in order per activation with
its answer as the runner got it, and each activation's artifact changes are recorded content-addressed."""
import json

import pytest
from e2e_fixtures import call, kind_params, running_team

import suzumio_recorder

pytestmark = pytest.mark.timeout(240)

KINDS = kind_params()
REPORT = "# Final report\n\nThe answer is 42.\n"


class UsageModel:
    """Enqueues on the FakeModel with a usage on every reply, as real servers report it."""

    def __init__(self, model):
        self.model = model

    def enqueue(self, **reply):
        self.model.enqueue(usage=(100, 10, 110), **reply)


def script_delegation(team):
    """pm asks worker-1 for a file, worker-1 writes it and reports, pm reads it and submits."""
    result = f"{team.artifacts('worker-1')}/result.txt"
    model = UsageModel(team.model)
    model.enqueue(tool_calls=[call("messages.send", recipient="worker-1",
                                   body=f"Write the answer to {result} and tell me.")], model="pm")
    model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Waiting for worker-1.")], model="pm")
    model.enqueue(tool_calls=[call("shell.exec", command=f"printf '42\\n' > {result}")], model="worker-1")
    model.enqueue(tool_calls=[call("messages.send", recipient="pm", body=f"The answer is in {result}.")],
                  model="worker-1")
    model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Reported.", notifyPm=False)],
                  model="worker-1")
    model.enqueue(tool_calls=[call("file.read", path=result)], model="pm")
    model.enqueue(tool_calls=[call("completion.submit", report=REPORT)], model="pm")


def run_delegation(team):
    script_delegation(team)
    team.send("pm", "Start.")
    team.wait_for(lambda: team.store.project()["status"] == "submitted", 120, "project submitted")
    team.wait_quiet()
    # the runner's exit may come after the output; both record the folder once
    team.wait_for(lambda: all(team.store.artifact_snapshot(a["id"]) for a in team.activations()), 30,
                  "every activation's artifacts recorded")


@pytest.mark.parametrize("kind", KINDS)
def test_every_model_exchange_and_artifact_change_is_recorded(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        run_delegation(team)
        store = team.store
        exchanges = store.exchanges()
        # one row per request the model server saw, in the same order, each with the answer it gave
        assert len(exchanges) == len(team.model.requests) == 7
        for exchange, request in zip(exchanges, team.model.requests, strict=True):
            assert exchange["request"]["messages"] == request.body["messages"]
            assert exchange["status"] == 200 and exchange["error"] is None and exchange["retries"] == 0
            assert json.loads(exchange["answer"])["choices"][0]["message"]["tool_calls"]
            assert exchange["usage"]["total"] == 110 and exchange["durationMs"] >= 0 and not exchange["replayed"]
        for activation in team.activations():
            indexes = [x["index"] for x in store.exchanges(activation["id"])]
            assert indexes == list(range(len(indexes))) and indexes
        # worker-1's one activation wrote result.txt: one version, its bytes stored by digest
        [worker] = team.activations("worker-1")
        [version] = store.artifact_versions(worker["id"])
        assert (version["agentId"], version["path"], version["size"]) == ("worker-1", "result.txt", 3)
        assert suzumio_recorder.read_blob(store, version["digest"]) == b"42\n"
        assert [v["activationId"] for v in store.artifact_versions()] == [worker["id"]]


@pytest.mark.parametrize("kind", [pytest.param("local", id="local")])
def test_recording_off_records_nothing(tmp_path, kind):
    with running_team(tmp_path, kind, extra={"recording": {"enabled": False}}) as team:
        team.model.enqueue(tool_calls=[call("file.write", path=f"{team.artifacts('pm')}/a.md", content="x")],
                               model="pm")
        team.model.enqueue(tool_calls=[call("completion.submit", report="done")], model="pm")
        team.send("pm", "Start.")
        team.wait_for(lambda: team.store.project()["status"] == "submitted", 60, "project submitted")
        team.wait_quiet()
        assert team.store.exchanges() == [] and team.store.artifact_versions() == []
        assert (team.store.artifacts_dir("pm") / "a.md").read_text() == "x"
        assert suzumio_recorder.recording_bytes(team.store) == 0
