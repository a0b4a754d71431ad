"""Suites, their schema and the statistics of an eval (suzumio_evals), and the evals database
(suzumio_store_evals), with values computed by hand."""
import io
import json
import math

import pytest
import yaml

import suzumio
import suzumio_evals as evals
import suzumio_store_evals
from suzumio_errors import Conflict, NotFound

TEAM = {
    "name": "team", "task": "Placeholder.",
    "agents": {"pm": {"model": "pm", "tools": ["messages.send", "completion.submit"]}},
    "backend": {"kind": "local", "runner": {"model": "pm", "models": {
        "providers": {"fake": {"type": "openai-compatible", "baseURL": "http://127.0.0.1:9/v1"}},
        "presets": {"pm": {"provider": "fake", "model": "pm"}, "big": {"provider": "fake", "model": "big"}}}}},
}


def suite_tree(**overrides):
    tree = {"name": "smoke", "team": "team.yaml", "runs": 3,
            "variants": [{"name": "base"}, {"name": "big", "patch": {"agents": {"pm": {"model": "big"}}}}],
            "tasks": [{"id": "hello", "task": "Say hello.", "messages": [{"recipient": "pm", "body": "Go."}],
                       "graders": [{"kind": "status", "equals": "submitted"},
                                   {"kind": "report", "contains": "hello"}]}]}
    tree.update(overrides)
    return tree


def write_suite(tmp_path, tree):
    (tmp_path / "team.yaml").write_text(yaml.safe_dump(TEAM), encoding="utf-8")
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------- suites

def test_suite_gets_defaults_and_an_absolute_team_path(tmp_path):
    suite = evals.read_suite(write_suite(tmp_path, suite_tree()))
    assert suite["team"] == str(tmp_path / "team.yaml")
    assert suite["concurrency"] == evals.DEFAULT_CONCURRENCY and suite["baseline"] == "base"
    task = suite["tasks"][0]
    assert task["timeoutMs"] == evals.DEFAULT_TIMEOUT_MS and task["inputs"] == []
    assert suite["variants"][0]["patch"] == {}


def test_suite_errors_name_the_field_path_and_are_collected(tmp_path):
    tree = suite_tree(runs=0)
    tree["tasks"][0]["graders"].append({"kind": "trajectory", "agent": "pm", "tools": ["x"], "match": "sometimes"})
    tree["tasks"][0]["graders"].append({"kind": "report"})
    with pytest.raises(evals.SuiteError) as caught:
        evals.read_suite(write_suite(tmp_path, tree))
    message = caught.value.message
    assert caught.value.first == "runs: Number must be greater than 0"
    assert "tasks.0.graders.2.match: Invalid enum value" in message
    assert "tasks.0.graders.3: a report grader needs contains or matches" in message


def test_suite_baseline_must_name_a_variant_and_ids_are_unique(tmp_path):
    tree = suite_tree(baseline="nope")
    tree["tasks"].append(dict(tree["tasks"][0]))
    with pytest.raises(evals.SuiteError) as caught:
        evals.validate_suite(tree)
    assert caught.value.first == "tasks.1.id: Duplicate id 'hello'"
    assert "baseline: Unknown variant 'nope' (variants: base, big)" in caught.value.message


def test_variant_patch_is_merged_into_the_team(tmp_path):
    suite = evals.read_suite(write_suite(tmp_path, suite_tree()))
    configs = evals.variant_configs(suite)
    assert configs["base"].agent("pm").model == "pm" and configs["big"].agent("pm").model == "big"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["suite.yaml", "team.yaml"]  # nothing left behind


def test_a_patch_that_breaks_the_team_names_the_variant(tmp_path):
    tree = suite_tree(variants=[{"name": "base"}, {"name": "bad", "patch": {"agents": {"pm": {"model": 7}}}}])
    suite = evals.read_suite(write_suite(tmp_path, tree))
    with pytest.raises(evals.SuiteError) as caught:
        evals.variant_configs(suite)
    assert caught.value.first.startswith("variants.1.patch: agents.pm.model: Expected string")


def test_inline_team_mapping_is_loaded(tmp_path):
    suite = evals.validate_suite(suite_tree(team=TEAM))
    assert evals.variant_configs(suite, ["big"])["big"].agent("pm").model == "big"
    with pytest.raises(evals.SuiteError, match="unknown variant other"):
        evals.variant_configs(suite, ["other"])


# --------------------------------------------------------------------------------- statistics

def test_pass_at_k_and_pass_pow_k_match_hand_computed_values():
    # n=5, c=2: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@4 = 1 (only 3 failures)
    assert evals.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert evals.pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert evals.pass_at_k(5, 2, 4) == 1.0
    # pass^2 = C(2,2)/C(5,2) = 1/10; pass^3 = 0 (only two passes)
    assert evals.pass_pow_k(5, 2, 2) == pytest.approx(0.1)
    assert evals.pass_pow_k(5, 2, 3) == 0.0
    assert evals.pass_pow_k(3, 3, 3) == 1.0
    with pytest.raises(ValueError):
        evals.pass_at_k(3, 1, 4)


def test_wilson_interval_matches_hand_computed_values():
    # c=8, n=10, z=1.96: centre = (0.8 + 0.19208)/1.38416 = 0.71674; half = 1.96*sqrt(0.016+0.0009604)/1.38416
    low, high = evals.wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    low, high = evals.wilson_interval(0, 3)
    assert low == 0.0 and high == pytest.approx(0.5615, abs=1e-4)
    assert evals.wilson_interval(0, 0) == (0.0, 1.0)


def test_fisher_one_sided_matches_hand_computed_values():
    # 5/5 before, 0/5 after: only the table itself, 1/C(10,5) = 1/252
    assert evals.fisher_one_sided(5, 5, 0, 5) == pytest.approx(1 / 252)
    # 3/3 before, 0/3 after: 1/C(6,3) = 0.05, not below the 0.05 threshold
    assert evals.fisher_one_sided(3, 3, 0, 3) == pytest.approx(0.05)
    # 4/4 before, 1/4 after: 5 passes, 3 failures, 4 drawn: [C(5,1)C(3,3) + C(5,0)C(3,4)] / C(8,4) = 5/70
    assert evals.fisher_one_sided(4, 4, 1, 4) == pytest.approx(5 / 70)
    # 2/4 and 2/4: [C(4,0)C(4,4) + C(4,1)C(4,3) + C(4,2)C(4,2)] / 70 = 53/70
    assert evals.fisher_one_sided(2, 4, 2, 4) == pytest.approx(53 / 70)
    assert math.isclose(evals.fisher_one_sided(0, 4, 0, 4), 1.0)


def run(passed, tokens=100, project="p", grades=None):
    return {"passed": passed, "tokens": tokens, "costUsd": None, "activations": 2, "wallMs": 1000,
            "agents": {"pm": {"tokens": tokens, "messages": 1}}, "project": project,
            "grades": grades or [{"kind": "status", "passed": passed}], "divergence": None}


def test_summary_row_of_a_flaky_task():
    row = evals.summarize("hello", "base", [run(True, 100), run(False, 200), run(True, 300)])
    assert (row["runs"], row["passed"], row["flaky"]) == (3, 2, True)
    assert row["passRate"] == pytest.approx(2 / 3)
    assert row["passAtK"] == {"1": pytest.approx(2 / 3), "2": 1.0, "3": 1.0}
    assert row["passPowK"] == {"1": pytest.approx(2 / 3), "2": pytest.approx(1 / 3), "3": 0.0}
    assert (row["tokens"], row["sd"]["tokens"]) == (200, 100.0)
    assert (row["costUsd"], row["sd"]["costUsd"]) == (None, None)
    assert (row["activations"], row["sd"]["activations"], row["wallMs"]) == (2, 0.0, 1000)
    assert row["graders"] == [{"kind": "status", "passed": 2, "failed": 1}]
    assert row["agents"] == {"pm": {"tokens": 200, "messages": 1}}


def test_a_significant_drop_is_a_regression_and_a_small_one_is_not():
    before = [evals.summarize("a", "v", [run(True)] * 5), evals.summarize("b", "v", [run(True)] * 3)]
    after = [evals.summarize("a", "v", [run(False)] * 5), evals.summarize("b", "v", [run(False)] * 3)]
    found = evals.regressions(after, before)
    assert [(r["task"], r["variant"], r["from"], r["to"]) for r in found] == [("a", "v", 1.0, 0.0)]
    assert evals.regressions(before, after) == []


# ------------------------------------------------------------------------------------ the store

def test_eval_store_keeps_evals_and_runs(tmp_path):
    store = suzumio_store_evals.EvalStore(tmp_path)
    try:
        eval_id = store.create_eval("smoke", "live", {"name": "smoke"}, {"runs": 1},
                                    [("t", "v", 0, "{eval}-t-v-0")])
        assert store.get_eval(eval_id)["status"] == "running"
        [row] = store.runs(eval_id)
        assert row["project"] == f"{eval_id}-t-v-0" and row["status"] == "pending" and row["passed"] is None
        store.start_run(row["id"])
        with pytest.raises(Conflict):
            store.start_run(row["id"])
        store.grade_run(row["id"], True, [{"kind": "status", "passed": True}], {"tokens": 5})
        [row] = store.runs(eval_id)
        assert row["passed"] is True and row["tokens"] == 5 and row["status"] == "graded"
        assert store.finish_eval(eval_id) and not store.finish_eval(eval_id)
        assert [e["id"] for e in store.list_evals()] == [eval_id] and store.running_evals() == []
        with pytest.raises(NotFound):
            store.get_eval("eval_missing")
    finally:
        store.close()
    assert (tmp_path / "evals.sqlite3").is_file()


def test_the_repository_suite_for_the_local_model_loads():
    # the names the lab's settings.env holds (scripts/local-model)
    env = {"SUZUMIO_LOCAL_MODEL_NAME": "local-gguf", "SUZUMIO_LOCAL_MODEL_BASE_URL": "http://127.0.0.1:29480/v1",
           "SUZUMIO_LOCAL_MODEL_API_KEY": "lab"}
    suite = evals.read_suite(evals.Path(__file__).parent.parent / "evals" / "suite.yaml", env=env)
    configs = evals.variant_configs(suite, env=env)
    assert suite["runs"] >= 3 and [t["id"] for t in suite["tasks"]] == ["haiku", "sum-file", "word-count"]
    assert "one line" in configs["terse-worker"].agent("worker").prompt
    lab = configs["default"].data["backend"]["runner"]["models"]
    assert lab["presets"]["local"]["model"] == "local-gguf"
    assert lab["providers"]["lab"]["baseURLEnv"] == "SUZUMIO_LOCAL_MODEL_BASE_URL"


def test_eval_command_exits_two_naming_the_bad_field(tmp_path):
    tree = suite_tree()
    tree["tasks"][0]["graders"][0]["kind"] = "grep"
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(["eval", str(write_suite(tmp_path, tree)), "--root", str(tmp_path / "root")], out=out, err=err)
    assert code == 2
    assert err.getvalue() == ("Error: tasks.0.graders.0.kind: Invalid enum value. Expected 'status' | 'report' | "
                              "'check' | 'trajectory' | 'budget' | 'judge', received 'grep'\n")
    code = suzumio.main(["eval", str(tmp_path / "absent.yaml"), "--root", str(tmp_path / "root")], out=out, err=err)
    assert code == 2


def test_eval_command_needs_the_roots_serve(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(["eval", str(write_suite(tmp_path, suite_tree())), "--root", str(tmp_path / "root")],
                        out=out, err=err)
    assert code == 1 and err.getvalue().startswith("Error: No serve is running for the root")
    code = suzumio.main(["evals", "--root", str(tmp_path / "root"), "--json"], out=out, err=err)
    assert code == 0 and json.loads(out.getvalue()) == []


def test_variants_are_compared_with_the_baseline_variant_and_the_table_says_so():
    import suzumio_eval_cli

    rows = [evals.summarize("a", "base", [run(True)] * 5), evals.summarize("a", "new", [run(False)] * 5),
            evals.summarize("b", "base", [run(False)] * 2), evals.summarize("b", "new", [run(True)] * 2)]
    changes = evals.variant_changes(rows, "base")
    assert [(c["task"], c["from"], c["to"], c["worse"], c["better"]) for c in changes] == [
        ("a", 1.0, 0.0, True, False), ("b", 0.0, 1.0, False, False)]
    document = {"id": "eval_x", "mode": "live", "results": rows, "regressions": [], "under": [], "changes": changes,
                "failUnder": None}
    text = suzumio_eval_cli.table(document)
    assert "WORSE a new than base: 1.00 -> 0.00" in text and "BETTER" not in text
    header, first = text.splitlines()[:2]
    assert header.split()[:4] == ["task", "variant", "pass", "rate"]
    assert first.split()[:4] == ["a", "base", "5/5", "1.00"]
