"""The flight recorder end to end on both backends (docs/replay.md): the real controller, the real runner
and the FakeModel. Every model exchange the proxy forwarded is recorded in order per activation with
its answer as the runner got it, and each activation's artifact changes are recorded content-addressed."""
import io
import json

import pytest
import yaml
from e2e_fixtures import call, kind_params, running_team

import suzumio
import suzumio_backend
import suzumio_recorder
from suzumio_replay import normalized

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
    model.enqueue(tool_calls=[call("shell.exec", command=f"printf '42\\n' > {result} && date > ran.txt")],
                  model="worker-1")
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


# ---------------------------------------------------------------- replay

def replay(team, name, **options):
    response = team.service.post(f"/api/projects/{team.name}/replay", {"as": name, **options})
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["origin"]["kind"] == "replay" and body["origin"]["source"] == team.name
    return team.service.root.open_project(name)


def wait_status(team, store, status, timeout=120):
    team.wait_for(lambda: store.project()["status"] == status and not store.running_activations(), timeout,
                  f"{store.project_id} {status}")


def messages(store, source):
    """(sender, recipient, body) of every message, the replay's folder written as the source's."""
    return [(m["sender"], m["recipient"], m["body"].replace(str(store.dir), str(source.dir)))
            for m in store.list_messages(1000, full_body=True)]


def activations_by_agent(store):
    return [(a["agentId"], a["status"]) for a in sorted(store.list_activations(1000), key=lambda a: a["startedAt"])]


def audited(store):
    return [(r["agent_id"], r["tool"], r["status"], normalized((r["output"] or "").replace(str(store.dir), "<dir>")))
            for r in reversed(store.list_tool_calls(1000))]


@pytest.mark.parametrize("tools", ["live", "recorded"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_replay_calls_no_model_and_gives_the_same_report_messages_and_files(tmp_path, kind, tools):
    with running_team(tmp_path, kind) as team:
        run_delegation(team)
        asked = len(team.model.requests)
        copy = replay(team, "e2e-again", tools=tools)
        wait_status(team, copy, "submitted")
        assert len(team.model.requests) == asked  # not one provider call
        source = team.store
        assert copy.report_path.read_text() == source.report_path.read_text() == REPORT
        assert messages(copy, source) == messages(source, source)
        assert activations_by_agent(copy) == activations_by_agent(source)
        assert (copy.artifacts_dir("worker-1") / "result.txt").read_bytes() == b"42\n"
        assert audited(copy) == audited(source)
        assert [e["type"] for e in copy.list_events(1000) if e["type"] == "replay.diverged"] == []
        # every answer came from the recording, and says so; it counts for no budget
        assert {x["replayed"] for x in copy.exchanges()} == {True}
        assert len(copy.exchanges()) == len(source.exchanges())
        assert copy.window_tokens() == 0
        assert copy.model_usage(copy.list_activations(1)[0]["id"])["calls"] >= 1
        # the shell command ran again only with live tools (its workspace file is recorded nowhere); with
        # recorded tools the audit's result and the recorded artifact stand in for it
        assert (source.workspace("worker-1") / "ran.txt").exists()
        assert (copy.workspace("worker-1") / "ran.txt").exists() == (tools == "live")
        # and the two runs diff as identical: replayed usage counts as recorded
        answer = team.service.get(f"/api/projects/{team.name}/diff/{copy.project_id}")
        assert answer.status_code == 200, answer.text
        assert (answer.json()["identical"], answer.json()["firstDifference"]) == (True, None)
        assert answer.json()["sections"]["tokens"]["a"]["total"] == 770


def test_a_replay_maps_the_projects_folders_not_their_names(tmp_path):
    """On `local` requests name the project's folder: a replay maps the folders only, so a root whose
    path holds the replay's name (`team-runs/` holding a replay named `team`) replays faithfully."""
    runs = tmp_path / "team-runs"
    runs.mkdir()
    with running_team(runs, "local") as team:
        assert "team" in str(team.service.root.path)
        run_delegation(team)
        asked = len(team.model.requests)
        copy = replay(team, "team")
        wait_status(team, copy, "submitted")
        assert len(team.model.requests) == asked
        assert [e["type"] for e in copy.list_events(1000) if e["type"] == "replay.diverged"] == []
        assert {x["replayed"] for x in copy.exchanges()} == {True}


@pytest.mark.parametrize("kind", KINDS)
def test_a_changed_prompt_diverges_at_that_agent_and_stops_the_replay(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        run_delegation(team)
        asked = len(team.model.requests)
        config = team.store.config()
        config["agents"]["worker-1"]["prompt"] = "Be terse."
        copy = replay(team, "e2e-changed", config=yaml.safe_dump(config), onDiverge="stop")
        wait_status(team, copy, "stopped")
        [event] = [json.loads(e["data_json"]) for e in copy.list_events(1000) if e["type"] == "replay.diverged"]
        assert event["agentId"] == "worker-1" and event["requestIndex"] == 0
        assert event["activationId"] == next(
            a["id"] for a in copy.list_activations(100) if a["agentId"] == "worker-1")
        assert "Be terse." in event["diff"] and event["diff"].startswith("--- recorded")
        assert len(team.model.requests) == asked  # pm's requests matched; worker-1's was never sent
        assert copy.origin()["diverged"]["agentId"] == "worker-1"
        # the diff says where the runs part: worker-1's one activation was cancelled by the stop
        result = team.service.get(f"/api/projects/{team.name}/diff/{copy.project_id}").json()
        assert result["identical"] is False
        assert result["firstDifference"]["section"] == "messages"
        assert [name for name, section in result["sections"].items() if not section["identical"]] == [
            "messages", "toolCalls", "activations", "artifacts", "report", "tokens"]


@pytest.mark.parametrize("kind", [pytest.param("local", id="local")])
def test_a_divergence_with_on_diverge_live_asks_the_model_from_there_on(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        run_delegation(team)
        asked = len(team.model.requests)
        config = team.store.config()
        config["agents"]["worker-1"]["prompt"] = "Be terse."
        script_delegation(team)  # the live part takes what it needs from the queue
        copy = replay(team, "e2e-live", config=yaml.safe_dump(config), onDiverge="live")
        team.wait_for(lambda: any(e["type"] == "replay.diverged" for e in copy.list_events(1000)), 60,
                      "the divergence")
        team.wait_for(lambda: len(team.model.requests) > asked, 60, "a live model request")
        worker_requests = [r for r in team.model.requests[asked:] if r.body["model"] == "worker-1"]
        assert worker_requests and "Be terse." in json.dumps(worker_requests[0].body)
        # pm's first activation was answered from the recording: its first live request is later
        assert all(r.body["model"] != "pm" for r in team.model.requests[asked:asked + 1])


def test_replay_input_is_checked(tmp_path):
    with running_team(tmp_path, "local") as team:
        post = team.service.post
        assert post("/api/projects/e2e/replay", {"as": "x"}).json() == {
            "error": "Project e2e is running; replay a run that has ended"}
        team.service.post("/api/projects/e2e/stop", {})
        for body, error in [({}, "as is required"),
                            ({"as": "e2e"}, "Project already initialized: e2e"),
                            ({"as": "x", "tools": "some"}, "tools must be one of live, recorded"),
                            ({"as": "x", "onDiverge": "later"}, "onDiverge must be one of stop, live"),
                            ({"as": "x", "config": 5}, "config must be a project file (YAML text)")]:
            response = post("/api/projects/e2e/replay", body)
            assert response.status_code == 400 or response.status_code == 409, response.text
            assert response.json() == {"error": error}
        assert post("/api/projects/nope/replay", {"as": "x"}).status_code == 404
        other = dict(team.store.config(), agents={"solo": {"model": "pm"}})
        other = yaml.safe_dump(other)
        assert post("/api/projects/e2e/replay", {"as": "x", "config": other}).json() == {
            "error": "config must have the source's agents (pm, worker-1), not solo"}


def test_the_cli_replays_and_waits_for_the_end(tmp_path):
    with running_team(tmp_path, "local") as team:
        run_delegation(team)
        asked = len(team.model.requests)
        out, err = io.StringIO(), io.StringIO()
        code = suzumio.main(["replay", "e2e", "--as", "e2e-cli", "--tools", "recorded", "--wait",
                             "--root", str(team.service.root.path)], out=out, err=err)
        assert (code, err.getvalue()) == (0, "")
        assert out.getvalue() == "Replaying e2e as e2e-cli\ne2e-cli: submitted\n"
        assert len(team.model.requests) == asked
        assert team.service.root.open_project("e2e-cli").origin()["tools"] == "recorded"
        out = io.StringIO()
        code = suzumio.main(["diff", "e2e", "e2e-cli", "--root", str(team.service.root.path)], out=out)
        assert code == 0, out.getvalue()
        assert out.getvalue() == "e2e and e2e-cli are identical\n"
        for argv, message in [(["replay", "e2e"], "Error: --as NAME is required\n"),
                              (["replay", "e2e", "--as", "e2e-cli"], "Error: Project already initialized: e2e-cli\n"),
                              (["fork", "e2e", "--as", "y"], "Error: --at ACTIVATION is required\n"),
                              (["fork", "e2e", "--at", "act_1", "--as", "y"], "Error: Unknown activation: act_1\n"),
                              (["diff", "e2e", "nope"], "Error: Unknown project: nope\n"),
                              (["replay", "e2e", "--as", "y", "--config", str(tmp_path / "none.yaml")],
                               f"Error: Cannot read {tmp_path / 'none.yaml'}: No such file or directory\n")]:
            err = io.StringIO()
            assert suzumio.main([*argv, "--root", str(team.service.root.path)], out=io.StringIO(), err=err) == 1
            assert err.getvalue() == message


# ---------------------------------------------------------------- fork

@pytest.mark.parametrize("kind", KINDS)
def test_a_fork_after_a_workers_activation_keeps_its_files_and_asks_only_for_what_follows(tmp_path, kind):
    with running_team(tmp_path, kind) as team:
        run_delegation(team)
        source = team.store
        [pm_first, pm_second] = team.activations("pm")
        [worker] = team.activations("worker-1")
        # the fork point: worker-1's activation ended after pm's first one and before pm's second began
        assert pm_first["completedAt"] <= worker["completedAt"] <= pm_second["startedAt"]
        asked = len(team.model.requests)
        _, fork_artifacts = suzumio_backend.activation_paths(kind, source.dir.parent / "e2e-fork",
                                                             source.workspace("pm"))
        model = UsageModel(team.model)
        model.enqueue(tool_calls=[call("file.read", path=f"{fork_artifacts}/worker-1/result.txt")], model="pm")
        model.enqueue(tool_calls=[call("completion.submit", report="# Forked\n\n42\n")], model="pm")
        response = team.service.post("/api/projects/e2e/fork", {"as": "e2e-fork", "at": worker["id"]})
        assert response.status_code == 201, response.text
        assert response.json()["origin"] == dict(response.json()["origin"], kind="fork", source="e2e",
                                                  at=worker["id"])
        fork = team.service.root.open_project("e2e-fork")
        wait_status(team, fork, "submitted")
        # only pm's activation after the fork point asked the model: twice, with pm's history before it
        later = team.model.requests[asked:]
        assert [r.body["model"] for r in later] == ["pm", "pm"]
        assert "Write the answer to" in json.dumps(later[0].body)
        assert (fork.artifacts_dir("worker-1") / "result.txt").read_bytes() == b"42\n"
        assert team.tool_messages("pm")[-2] == "1: 42\n2: "
        assert fork.report_path.read_text() == "# Forked\n\n42\n"
        # the activations up to the fork point are the source's, the one after it the fork's own
        assert [a["id"] for a in sorted(fork.list_activations(100), key=lambda a: a["startedAt"])][:2] == [
            pm_first["id"], worker["id"]]
        assert len(fork.list_activations(100)) == 3
        # the user's message, pm's to worker-1 and its answer: all before the fork point, kept as they were
        assert messages(fork, source) == messages(source, source)[:3]


def test_fork_input_is_checked(tmp_path):
    with running_team(tmp_path, "local") as team:
        post = team.service.post
        for body, status, error in [({"as": "x"}, 400, "at is required"),
                                    ({"at": "act_1"}, 400, "as is required"),
                                    ({"as": "e2e", "at": "act_1"}, 409, "Project already initialized: e2e"),
                                    ({"as": "x", "at": "act_1"}, 404, "Unknown activation: act_1")]:
            response = post("/api/projects/e2e/fork", body)
            assert (response.status_code, response.json()) == (status, {"error": error})
