"""Evals end to end (docs/evals.md): the real controller with its eval thread, teams of real local runners
talking to a FakeModel whose answers vary by run, every grader kind, `suzumio eval` against the running
controller with its exit codes, replay at no model cost, fork after a recorded prefix, a Harbor task."""
import io
import json
import xml.etree.ElementTree as ElementTree

import pytest
import yaml
from conftest import wait_until
from eval_fixtures import Answers, eval_service, write_team
from fake_model import FakeModel

import suzumio

pytestmark = pytest.mark.timeout(300)

HELLO_GRADERS = [
    {"kind": "status", "equals": "submitted"},
    {"kind": "report", "contains": "hello"},
    {"kind": "report", "matches": "^# Report"},
    {"kind": "check", "run": "grep -q hello report.md && test -f artifacts/pm/input.txt"},
    {"kind": "trajectory", "agent": "pm", "tools": ["completion.submit"], "match": "exact"},
    {"kind": "budget", "maxActivations": 3, "maxTokens": 100000},
    {"kind": "judge", "preset": "judge", "rubric": "The report says hello.", "threshold": 0.5},
]
STRICT_GRADERS = [
    {"kind": "status", "equals": "completed"},
    {"kind": "trajectory", "agent": "pm", "messages": [{"to": "#project"}], "match": "in-order"},
    {"kind": "budget", "maxActivations": 0},
]


def write_suite(tmp_path, name="suite.yaml", **overrides):
    suite = {"name": "greetings", "team": "team.yaml", "runs": 3, "concurrency": 1,
             "tasks": [{"id": "hello", "task": "Greet the world.",
                        "messages": [{"recipient": "pm", "body": "Say hello."}],
                        "inputs": [{"agent": "pm", "path": "input.txt", "content": "hi\n"}],
                        "graders": HELLO_GRADERS}]}
    suite.update(overrides)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(suite), encoding="utf-8")
    return path


def run_cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_every_grader_kind_passes_and_fails_for_its_reason(tmp_path):
    with eval_service(tmp_path, outcomes=["hello", "goodbye", "hello", "hello", "hello", "hello"]) as (
            service, _model, _answers, runner):
        tasks = [{"id": "hello", "task": "Greet the world.", "messages": [{"recipient": "pm", "body": "Say hello."}],
                  "inputs": [{"agent": "pm", "path": "input.txt", "content": "hi\n"}], "graders": HELLO_GRADERS},
                 {"id": "strict", "task": "Greet strictly.", "messages": [{"recipient": "pm", "body": "Say hello."}],
                  "graders": STRICT_GRADERS}]
        suite = yaml.safe_load(write_suite(tmp_path, tasks=tasks).read_text())
        suite["team"] = str(tmp_path / "team.yaml")
        created = service.post("/api/evals", suite)
        assert created.status_code == 201, created.text
        eval_id = created.json()["id"]
        document = wait_until(lambda: (d := service.get(f"/api/evals/{eval_id}").json())["status"] == "done" and d,
                              240, message="the eval to finish")
        hello, strict = document["results"]
        assert (hello["task"], hello["runs"], hello["passed"], hello["flaky"]) == ("hello", 3, 2, True)
        assert hello["passAtK"] == {"1": pytest.approx(2 / 3), "2": 1.0, "3": 1.0}
        assert hello["passPowK"] == {"1": pytest.approx(2 / 3), "2": pytest.approx(1 / 3), "3": 0.0}
        assert hello["interval"] == [pytest.approx(0.2077, abs=1e-3), pytest.approx(0.9385, abs=1e-3)]
        assert [(g["kind"], g["passed"], g["failed"]) for g in hello["graders"]] == [
            ("status", 3, 0), ("report", 2, 1), ("report", 3, 0), ("check", 2, 1), ("trajectory", 3, 0),
            ("budget", 3, 0), ("judge", 2, 1)]
        assert hello["activations"] == 1 and set(hello["agents"]) == {"pm", "worker-1"}
        assert len(hello["projects"]) == 3 and all(p.startswith(eval_id + ".hello.default.") for p in hello["projects"])
        # the failed run: the report lacks hello, the check exits 1, the judge scored it 0.1
        failed = next(r for r in document["runs"] if r["task"] == "hello" and not r["passed"])
        evidence = {g["kind"] + str(i): g["evidence"] for i, g in enumerate(failed["grades"]) if not g["passed"]}
        assert evidence["report1"] == "report lacks 'hello'"
        assert evidence["check3"].startswith("exit 1 in a scratch folder")
        assert evidence["judge6"].startswith("score 0.10 (threshold 0.5): no hello")
        # the strict task fails on each of its graders, each saying why
        assert (strict["passed"], strict["flaky"]) == (0, False)
        grades = document["runs"][-1]["grades"]
        assert [g["passed"] for g in grades] == [False, False, False]
        assert grades[0]["evidence"] == "status submitted (expected completed)"
        assert grades[1]["evidence"] == "pm: nothing (in-order)"
        assert "over: activations" in grades[2]["evidence"]
        # the judge's exchanges were kept with rubric, verdict and reasons
        judged = runner.store.judgements(next(r["id"] for r in runner.store.runs(eval_id)
                                              if r["task"] == "hello" and r["passed"] is False))
        assert judged[0]["rubric"] == "The report says hello." and judged[0]["score"] == pytest.approx(0.1)
        assert [e["id"] for e in service.get("/api/evals").json()] == [eval_id]
        # each run is an ordinary project of the root
        assert set(hello["projects"]) <= set(service.root.list_projects())
        # MCP clients read the same document
        answer = service.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                       "params": {"name": "get_eval", "arguments": {"id": eval_id}}}).json()
        assert answer["result"]["structuredContent"]["results"][0]["passed"] == 2
        # the progress stream of a finished eval: one `done` frame
        stream = service.get(f"/api/evals/{eval_id}/stream")
        assert stream.text.startswith("event: done\ndata: ") and stream.text.count("event:") == 1
        assert json.loads(stream.text.split("data: ", 1)[1])["progress"]["passed"] == 2
        assert service.get("/api/evals/eval_nope").status_code == 404
        bad = service.post("/api/evals", dict(suite, tasks=[{"id": "x", "task": "y"}]))
        assert bad.status_code == 400 and "tasks.0.graders: Required" in bad.json()["error"]


def test_a_regression_against_the_baseline_exits_one_and_replay_costs_nothing(tmp_path):
    with eval_service(tmp_path) as (service, model, answers, _runner):
        root = str(service.root.path)
        suite = write_suite(tmp_path, runs=4)
        code, out, err = run_cli("eval", str(suite), "--root", root, "--json")
        assert code == 0, err
        good = json.loads(out)
        assert good["results"][0]["passRate"] == 1.0 and good["regressions"] == []
        assert "4/4 runs done, 4 passing" in err
        # the same suite, now failing every run: a significant drop against the baseline
        answers.outcomes = ["goodbye"] * 4
        junit = tmp_path / "results.xml"
        code, out, err = run_cli("eval", str(suite), "--root", root, "--baseline", good["id"], "--junit", str(junit))
        assert code == 1, err
        assert "REGRESSION hello default: 1.00 -> 0.00" in out
        cases = ElementTree.parse(junit).getroot().findall(".//testcase")
        assert len(cases) == 4 and all(case.find("failure") is not None for case in cases)
        # replay the good eval: every run re-graded from its recording, not one model request
        before = len(model.requests)
        code, out, err = run_cli("eval", str(suite), "--root", root, "--mode", "replay", "--from", good["id"],
                                 "--json", "--fail-under", "0.9")
        assert code == 0, err
        replayed = json.loads(out)
        assert replayed["mode"] == "replay" and replayed["results"][0]["passed"] == 4
        assert replayed["results"][0]["divergences"] == []
        assert len(model.requests) == before
        # a team changed since: each replayed run stops where its first request differs, and says so
        changed = write_suite(tmp_path, "changed.yaml", runs=4,
                              variants=[{"name": "default", "patch": {"agents": {"pm": {"prompt": "Changed."}}}}])
        code, out, err = run_cli("eval", str(changed), "--root", root, "--mode", "replay", "--from", good["id"])
        assert code == 0, err
        assert out.count("diverged at request 0") == 4 and "0/4" in out
        assert len(model.requests) == before
        # --fail-under gates on the rate
        answers.outcomes = ["goodbye", "hello"]
        code, out, err = run_cli("eval", str(suite), "--root", root, "--runs", "2", "--fail-under", "0.9")
        assert code == 1 and "UNDER hello default: 0.50 < 0.9" in out
        code, out, err = run_cli("evals", "--root", root, "--json")
        assert [row["mode"] for row in json.loads(out)] == ["live", "live", "replay", "replay", "live"]


def test_fork_asks_the_model_only_after_the_fork_point(tmp_path):
    with eval_service(tmp_path) as (service, model, _answers, _runner):
        root = str(service.root.path)
        tasks = [{"id": "delegate", "task": "Delegate a greeting.",
                  "messages": [{"recipient": "pm", "body": "Delegate."}],
                  "graders": [{"kind": "report", "contains": "hello"},
                              {"kind": "trajectory", "agent": "pm",
                               "messages": [{"to": "worker-1", "atLeast": 1, "atMost": 1}]}]}]
        suite = write_suite(tmp_path, runs=1, tasks=tasks,
                            variants=[{"name": "base"},
                                      {"name": "terse", "patch": {"agents": {"worker-1": {"prompt": "Be terse."}}}}])
        code, out, err = run_cli("eval", str(suite), "--root", root, "--variant", "base", "--json")
        assert code == 0, err
        source = json.loads(out)
        [project] = source["results"][0]["projects"]
        recorded = len(model.requests)
        pm_first = sum(1 for r in model.requests[:recorded] if r.body.get("model") == "pm"
                       and "Worker says hello" not in json.dumps(r.body["messages"]))
        assert pm_first == 2  # send, then wait: the prefix the fork shares
        code, out, err = run_cli("eval", str(suite), "--root", root, "--mode", "fork", "--from", source["id"],
                                 "--at", "pm:1", "--json")
        assert code == 0, err
        forked = json.loads(out)
        assert [row["passed"] for row in forked["results"]] == [1, 1]
        asked = model.requests[recorded:]
        # both variants re-ran only the worker and the pm's last activation: nothing of the prefix
        assert asked and all("Delegate." not in json.dumps(r.body["messages"]) or r.body.get("model") != "pm"
                             or "Worker says hello" in json.dumps(r.body["messages"]) for r in asked)
        assert sum(1 for r in asked if r.body.get("model") == "worker-1") == 4
        worker_prompts = [r.body["messages"][0]["content"] for r in asked if r.body.get("model") == "worker-1"]
        assert any("Be terse." in text for text in worker_prompts)
        assert project in service.root.list_projects()


def test_a_harbor_task_is_graded_by_its_tests(tmp_path):
    with eval_service(tmp_path, outcomes=["hello", "hello", "hello"]) as (service, model, _answers, runner):
        harbor = tmp_path / "harbor"
        for name, word, extra in (("greets", "hello", ""), ("shouts", "HELLO", ""),
                                  ("boxed", "hello", '[environment]\ndocker_image = "suzumio-no-such-image:1"\n')):
            task = harbor / name
            (task / "tests").mkdir(parents=True)
            (task / "environment").mkdir()
            (task / "task.toml").write_text(f'version = "1.0"\n[agent]\ntimeout_sec = 120.0\n{extra}',
                                            encoding="utf-8")
            (task / "instruction.md").write_text(f"Say {word}.\n", encoding="utf-8")
            (task / "tests" / "test.sh").write_text(
                f"if grep -q {word} report.md; then echo 1; else echo 0; fi > logs/verifier/reward.txt\n",
                encoding="utf-8")
        (harbor / "team.yaml").write_text((tmp_path / "team.yaml").read_text(), encoding="utf-8")
        code, out, err = run_cli("eval", "--harbor", str(harbor), "--root", str(service.root.path), "--runs", "1",
                                 "--json")
        assert code == 0, err
        assert "boxed: needs the image suzumio-no-such-image:1" in err
        rows = {row["task"]: row for row in json.loads(out)["results"]}
        assert (rows["greets"]["passed"], rows["shouts"]["passed"], rows["boxed"]["passed"]) == (1, 0, 0)
        runs = {run["task"]: run for run in runner.store.runs(json.loads(out)["id"])}
        [grade] = runs["shouts"]["grades"]
        assert grade["evidence"].startswith("exit 0, reward 0 in a scratch folder")
        [grade] = runs["boxed"]["grades"]
        assert "suzumio-no-such-image:1" in grade["evidence"]
        # the instruction was the coordinator's kick-off
        assert any("Say HELLO." in json.dumps(r.body["messages"]) for r in model.requests)


def test_suzumio_eval_runs_on_the_roots_serve_process(tmp_path):
    """The real `suzumio serve` process owns the eval thread: `suzumio eval` only writes the eval and
    follows it; the check runs in the runner image when an engine answers, else in a scratch folder."""
    from test_cli import serving as serve_process

    model = FakeModel(responder=Answers())
    try:
        write_team(tmp_path, model)
        graders = [{"kind": "status", "equals": "submitted"},
                   {"kind": "check", "run": "grep -q hello /report.md 2>/dev/null || grep -q hello report.md"}]
        suite = write_suite(tmp_path, runs=2, tasks=[{"id": "hello", "task": "Greet.", "graders": graders,
                                                      "messages": [{"recipient": "pm", "body": "Say hello."}]}])
        root = tmp_path / "served-root"
        with serve_process("--root", str(root), "--port", "0") as served:
            code, out, err = run_cli("eval", str(suite), "--root", str(root), "--json")
            assert code == 0, err
            document = json.loads(out)
            assert document["results"][0]["passed"] == 2
            answer = served.get(f"/api/evals/{document['id']}").json()
            assert answer["status"] == "done" and answer["results"] == document["results"]
            assert [row["id"] for row in served.get("/api/evals").json()] == [document["id"]]
    finally:
        model.close()


@pytest.mark.docker
def test_a_check_runs_in_the_runner_image_without_network(tmp_path):
    from api_fixtures import init_project, project_yaml
    from provisioning_fixtures import docker_client_or_skip, runner_image_or_skip

    import suzumio_config
    import suzumio_eval_graders
    import suzumio_store

    client = docker_client_or_skip()
    runner_image_or_skip(client)
    root = suzumio_store.Root(tmp_path / "root")
    try:
        store = init_project(root, tmp_path / "config", project_yaml("checked", "http://127.0.0.1:9"))
        (store.artifacts_dir("pm") / "answer.txt").write_text("42\n", encoding="utf-8")
        view = suzumio_eval_graders.RunView(store, suzumio_config.ProjectConfig.from_data(store.config()),
                                            {"task": "t"}, "submitted", 0)
        sandbox = suzumio_eval_graders.CheckSandbox(client)
        command = ('test "$(pwd)" = /workspace && grep -qx 42 /artifacts/pm/answer.txt && test -f /report.md '
                   '&& test "$(ls /sys/class/net)" = lo && ! touch /artifacts/pm/x 2>/dev/null')
        passed = suzumio_eval_graders.grade_check(view, {"kind": "check", "run": command}, sandbox=sandbox)
        assert passed["passed"], passed["evidence"]
        assert passed["evidence"].startswith("exit 0 in suzumio-runner:dev")
        failed = suzumio_eval_graders.grade_check(view, {"kind": "check", "run": "exit 3"}, sandbox=sandbox)
        assert not failed["passed"] and failed["evidence"].startswith("exit 3 in ")
        missing = suzumio_eval_graders.grade_check(view, {"kind": "check", "run": "true",
                                                          "image": "suzumio-no-such-image:1"}, sandbox=sandbox)
        assert not missing["passed"] and "is not on this machine" in missing["evidence"]
    finally:
        root.close()
