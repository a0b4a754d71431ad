"""The team's repository without runners (suzumio_repository, suzumio_merge_queue, suzumio_config_repository):
`repository:` validation, the project's copy made at `init` with the source untouched, working copies and
their end commits, the merge queue's landing, refusals and resumption, claims, the CLI and `gc`, with a
real git and a real project store (docs/teams-that-write-code.md)."""
import io
import json
import os
import subprocess
import textwrap
import threading
import time

import pytest
from repository_fixtures import CHECK, git, log_subjects, make_fixture_repository

import suzumio
import suzumio_approvals
import suzumio_merge_queue as queue
import suzumio_repository as repository
import suzumio_store
from suzumio_config import ProjectConfig, load_project
from suzumio_errors import BadRequest, ConfigError, Conflict


def project_text(source, extra=""):
    return textwrap.dedent(f"""\
        name: code
        task: Write code.
        backend:
          kind: local
          runner:
            model: fake
            models:
              providers: {{fake: {{type: openai-compatible, baseURL: "http://127.0.0.1:9/v1"}}}}
              presets: {{fake: {{provider: fake, model: fake}}}}
        agents:
          pm: {{tools: [messages.send]}}
          w1: {{tools: ["repo.*", "file.*"]}}
          w2: {{tools: ["repo.*", "file.*"]}}
        repository:
          source: {source}
          checks: ["{CHECK}"]
          agents: ["w*"]
        """) + extra


def write_project(tmp_path, source, extra=""):
    path = tmp_path / "project.yaml"
    path.write_text(project_text(source, extra), encoding="utf-8")
    return path


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = suzumio.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def project(tmp_path):
    """A project initialized by `suzumio init` from a fixture repository: (store, config, source, root)."""
    source = make_fixture_repository(tmp_path)
    path = write_project(tmp_path, source, "  claims: true\n")
    code, out, err = cli("init", str(path), "--root", str(tmp_path / "root"))
    assert code == 0, err
    assert "Repository: " in out and "(integration branch main)" in out
    root = suzumio_store.Root(tmp_path / "root")
    store = root.open_project("code")
    yield store, ProjectConfig.from_data(store.config()), source, root
    root.close()


class Queue:
    """A MergeQueue whose requests are landed when the test says so (tick), with the local check runner."""

    def __init__(self, config):
        self.config = config
        self.woken = []

    def wake(self, store):
        self.woken.append(store.project_id)

    def land_all(self, store):
        for request in store.merge_requests(waiting_only=True):
            queue.land(store, self.config, request, queue.run_check_locally)


def agent(agent_id):
    return {"id": agent_id, "tools": ["repo.*"]}


def merge(q, store, config, agent_id, message):
    return queue.merge_tool(q, store, config, agent(agent_id), f"act-{agent_id}", {"message": message})


# ---------------------------------------------------------------- configuration

def test_repository_section_is_typed_with_defaults(tmp_path):
    source = make_fixture_repository(tmp_path)
    config = load_project(write_project(tmp_path, source), env={})
    assert config.repository.source == str(source) and config.repository.branch is None
    assert config.repository.checks == (CHECK,) and config.repository.claims is False
    assert config.repository.has_agent("w2") and not config.repository.has_agent("pm")
    assert "repo" in config.data["tools"]["toolpacks"]  # joined by itself
    assert config.tool("repo.merge") is not None


def test_repository_agents_that_name_no_agent_are_refused(tmp_path):
    source = make_fixture_repository(tmp_path)
    path = tmp_path / "bad.yaml"
    path.write_text(project_text(source).replace('agents: ["w*"]', 'agents: ["w*", "x*"]'), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"repository.agents.1: x\* names no agent"):
        load_project(path, env={})
    path.write_text(project_text(source).replace("repository:\n  source", "repository:\n  sourc"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"repository\.source"):
        load_project(path, env={})


def test_a_swarm_project_has_a_repository_and_render_warns_of_nothing_for_it(tmp_path):
    source = make_fixture_repository(tmp_path)
    swarm = project_text(source).replace("kind: local\n", "kind: swarm\n  controllerUrl: https://10.0.0.1:8443\n"
                                                        "  image: suzumio-runner:dev\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text(swarm.split("repository:")[0].replace('"repo.*", ', ""), encoding="utf-8")
    path = tmp_path / "swarm.yaml"
    path.write_text(swarm, encoding="utf-8")
    assert load_project(path, env={}).repository.has_agent("w1")
    # The working copies travel through the runner listener: nothing weakens isolation, so nothing more
    # is warned of than for the same project without a repository.
    code, _, err = cli("config", "render", str(path))
    plain_code, _, plain_err = cli("config", "render", str(plain))
    assert (code, plain_code) == (0, 0), err + plain_err
    assert [line for line in err.splitlines() if line.startswith("Warning")] == \
        [line for line in plain_err.splitlines() if line.startswith("Warning")]


@pytest.mark.docker
def test_a_swarm_projects_check_runs_on_the_controllers_engine_with_its_tasks_limits_and_no_network(tmp_path):
    from provisioning_fixtures import docker_client_or_skip, runner_image_or_skip
    runner_image_or_skip(docker_client_or_skip())
    source = make_fixture_repository(tmp_path)
    swarm = project_text(source).replace("kind: local\n", "kind: swarm\n  controllerUrl: https://10.0.0.1:8443\n"
                                                        "  image: suzumio-runner:dev\n"
                                                        "  docker: {memory: 256m, pidsLimit: 64}\n"
                                                        "  swarm: {limits: {memory: 96MiB}}\n")
    path = tmp_path / "swarm.yaml"
    path.write_text(swarm, encoding="utf-8")
    config = load_project(path, env={})
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "shared.txt").write_text("shared\n")
    # The check sees the scratch copy as /workspace, the task's memory limit (backend.swarm.limits over
    # backend.docker), the pids limit, no capability and no network but loopback.
    cgroup = "/sys/fs/cgroup"  # v2, else v1's controllers
    command = (f"cat shared.txt; cat {cgroup}/memory.max 2>/dev/null || cat {cgroup}/memory/memory.limit_in_bytes; "
               f"cat {cgroup}/pids.max 2>/dev/null || cat {cgroup}/pids/pids.max; "
               "grep CapEff /proc/self/status; ls /sys/class/net; id -u")
    code, output = queue.run_check(config, "w1", scratch, command)
    assert code == 0, output
    lines = output.split()
    assert lines[:3] == ["shared", str(96 * 2**20), "64"], output
    assert lines[3:5] == ["CapEff:", "0000000000000000"], output
    assert lines[5:-1] == ["lo"] and lines[-1] != "0", output  # no interface but loopback; not root


def test_init_refuses_a_source_that_is_not_a_repository(tmp_path):
    (tmp_path / "plain").mkdir()
    code, _, err = cli("init", str(write_project(tmp_path, tmp_path / "plain")), "--root", str(tmp_path / "root"))
    assert code != 0 and "repository.source:" in err and "not a git repository" in err
    assert len([line for line in err.splitlines() if not line.startswith("Warning:")]) == 1
    code, _, err = cli("init", str(write_project(tmp_path, tmp_path / "missing")), "--root", str(tmp_path / "r2"))
    assert code != 0 and "does not exist" in err


# ---------------------------------------------------------------- the project's repository, working copies

def test_init_copies_the_source_into_a_bare_repository_and_leaves_it_untouched(project):
    store, config, source, _ = project
    before = git(source, "for-each-ref")
    git_dir = store.dir / "repository.git"
    assert git(git_dir, "rev-parse", "--is-bare-repository") == "true"
    assert log_subjects(git_dir) == ["Add the files", "Initial commit"]
    assert git(git_dir, "remote") == ""  # nothing can push back to the source
    copy = repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "a.txt").write_text("changed\n", encoding="utf-8")
    copy.commit("work")
    assert git(source, "for-each-ref") == before and git(source, "status", "--porcelain") == ""


def test_working_copy_commits_each_end_as_the_agent_on_its_own_branch(project):
    store, config, _, _ = project
    copy = repository.working_copy(store, config, "w1")
    workspace = store.workspace("w1")
    assert (workspace / "a.txt").read_text() == "a\n" and not (workspace / ".git").exists()
    start = copy.head()
    (workspace / "new.txt").write_text("new\n", encoding="utf-8")
    (workspace / "b.txt").unlink()
    head = copy.commit("Activation act-1 of w1")
    git_dir = store.dir / "repository.git"
    assert git(git_dir, "rev-parse", "agents/w1") == head != start
    assert git(git_dir, "log", "-1", "--format=%an %s", "agents/w1") == "w1 Activation act-1 of w1"
    assert git(git_dir, "show", "--name-status", "--format=", head).split("\n") == ["D\tb.txt", "A\tnew.txt"]
    assert copy.commit("nothing new") == head  # no empty commits
    assert git(git_dir, "rev-parse", "main") == start  # the integration branch never moves by an end commit


def test_views_of_one_working_copy_asked_at_once_all_see_the_change(project):
    """The control room asks for a pending merge's preview from two cards at once: each view answers the same
    change (they once shared a throwaway index and the fetched ref, and one came back with none)."""
    store, config, _, _ = project
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "new.txt").write_text("new\n", encoding="utf-8")
    results = []
    views = [threading.Thread(target=lambda: results.append(repository.pending_change(store, "w1")))
             for _ in range(8)]
    for view in views:
        view.start()
    for view in views:
        view.join(60)
    assert len(results) == 8 and all(result is not None and "new.txt" in result for result in results), results
    assert len(set(results)) == 1
    assert not list((store.dir / "agents" / "w1").rglob("suzumio-view.*"))  # every throwaway index removed


def test_repo_tools_refuse_an_agent_without_a_working_copy(project):
    store, config, _, _ = project
    with pytest.raises(BadRequest, match=r"pm has no working copy"):
        queue.status_tool(None, store, config, agent("pm"), "act", {})


# ---------------------------------------------------------------- the merge queue

def test_merge_lands_a_change_rebased_onto_the_tip_after_its_checks(project):
    store, config, _, _ = project
    q = Queue(config)
    git_dir = store.dir / "repository.git"
    for agent_id, name in (("w1", "a.txt"), ("w2", "b.txt")):
        repository.working_copy(store, config, agent_id)
        (store.workspace(agent_id) / name).write_text(f"{name} by {agent_id}\n", encoding="utf-8")
    merge(q, store, config, "w1", "w1 changes a")
    answer = merge(q, store, config, "w2", "w2 changes b")
    assert "1 ahead of it" in answer["output"] and q.woken == ["code", "code"]
    q.land_all(store)
    assert log_subjects(git_dir)[:2] == ["w2 changes b", "w1 changes a"]
    assert git(git_dir, "show", "main:a.txt") == "a.txt by w1" and git(git_dir, "show", "main:b.txt") == "b.txt by w2"
    assert git(git_dir, "log", "-1", "--format=%an", "main") == "w2"
    merged = [e for e in store.list_events(100) if e["type"] == "repo.merged"]
    assert [json.loads(e["data_json"])["agent"] for e in reversed(merged)] == ["w1", "w2"]
    signals = [s for s in store.list_signals(limit=100) if s["kind"] == "repo.merged"]
    assert {(s["targetAgent"], s["priority"]) for s in signals} == {("pm", "P3")}
    assert all(s["payload"]["commit"] in git(git_dir, "log", "--format=%H", "main") for s in signals)


def test_a_conflict_or_a_failing_check_lands_nothing_and_tells_the_agent(project):
    store, config, _, _ = project
    q = Queue(config)
    git_dir = store.dir / "repository.git"
    for agent_id in ("w1", "w2"):
        repository.working_copy(store, config, agent_id)
        (store.workspace(agent_id) / "shared.txt").write_text(f"shared by {agent_id}\n", encoding="utf-8")
    merge(q, store, config, "w1", "w1 shared")
    merge(q, store, config, "w2", "w2 shared")
    q.land_all(store)
    tip = git(git_dir, "rev-parse", "main")
    (store.workspace("w1") / "BROKEN").write_text("x\n", encoding="utf-8")
    merge(q, store, config, "w1", "w1 broken")
    q.land_all(store)
    assert git(git_dir, "rev-parse", "main") == tip
    failed = [r for r in store.merge_requests() if r["status"] == "failed"]
    assert {(r["agent"], r["reason"]) for r in failed} == {("w2", "conflict"), ("w1", "checks")}
    [conflict] = [r for r in failed if r["agent"] == "w2"]
    assert conflict["paths"] == ["shared.txt"]
    [checks] = [r for r in failed if r["agent"] == "w1"]
    assert CHECK in checks["output"] and "exit code 1" in checks["output"]
    signals = [s for s in store.list_signals(limit=100) if s["kind"] == "repo.merge_failed"]
    assert {(s["targetAgent"], s["priority"], s["payload"]["reason"]) for s in signals} == {
        ("w2", "P1", "conflict"), ("w1", "P1", "checks")}
    # w2 syncs: the conflict stays in the file for it to resolve; merge waits until the markers are gone.
    answer = queue.sync_tool(q, store, config, agent("w2"), "act-w2", {})
    assert answer["metadata"]["conflicts"] == ["shared.txt"]
    assert "<<<<<<< " in (store.workspace("w2") / "shared.txt").read_text()
    with pytest.raises(BadRequest, match=r"Resolve the conflict markers first in: shared\.txt"):
        merge(q, store, config, "w2", "w2 again")
    (store.workspace("w2") / "shared.txt").write_text("shared by w1 and w2\n", encoding="utf-8")
    merge(q, store, config, "w2", "w2 resolved")
    q.land_all(store)
    assert git(git_dir, "show", "main:shared.txt") == "shared by w1 and w2"
    assert log_subjects(git_dir)[:2] == ["w2 resolved", "w1 shared"]


def test_nothing_to_merge_is_refused_at_once(project):
    store, config, _, _ = project
    repository.working_copy(store, config, "w1")
    with pytest.raises(BadRequest, match="Nothing to merge"):
        merge(Queue(config), store, config, "w1", "empty")


def test_a_landing_interrupted_after_the_branch_moved_is_recorded_on_resume(project):
    store, config, _, _ = project
    q = Queue(config)
    git_dir = store.dir / "repository.git"
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "a.txt").write_text("resumed\n", encoding="utf-8")
    request_id = merge(q, store, config, "w1", "w1 a")["metadata"]["requestId"]
    # A controller stopped between moving the branch and recording the landing:
    store.start_merge_request(request_id)
    request = store.merge_request(request_id)
    tip = git(git_dir, "rev-parse", "main")
    tree, _ = repository.merge_trees(git_dir, tip, request["head"])
    commit = git(git_dir, "commit-tree", tree, "-p", tip, "-m", "w1 a")
    store.set_merge_candidate(request_id, commit)
    git(git_dir, "update-ref", "refs/heads/main", commit, tip)
    q.land_all(store)
    assert store.merge_request(request_id)["status"] == "merged"
    assert store.merge_request(request_id)["commit"] == commit == git(git_dir, "rev-parse", "main")


def locked_merge(project):
    """(store, its repository, the tip, a waiting merge request of w1, the integration branch's lock file, made)."""
    store, config, _, _ = project
    git_dir = store.dir / "repository.git"
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "a.txt").write_text("locked out\n", encoding="utf-8")
    request_id = merge(Queue(config), store, config, "w1", "w1 a")["metadata"]["requestId"]
    tip = git(git_dir, "rev-parse", "main")
    lock = git_dir / "refs" / "heads" / "main.lock"
    lock.write_text(f"{tip}\n", encoding="utf-8")
    return store, git_dir, tip, request_id, lock


def test_a_branch_git_refuses_to_move_fails_the_request_instead_of_queueing_it_for_ever(project):
    # A lock file of the integration branch that a live git may hold (made now): the move is refused while
    # the tip stays put. Only a tip that really moved means "try again".
    store, git_dir, tip, request_id, _ = locked_merge(project)
    Queue(project[1]).land_all(store)
    request = store.merge_request(request_id)
    assert (request["status"], request["reason"]) == ("failed", "checks")
    assert "could not land it: git update-ref failed" in request["output"] and "main.lock" in request["output"]
    assert git(git_dir, "rev-parse", "main") == tip


def test_a_lock_file_left_before_this_process_started_is_removed_and_the_request_lands(project):
    # The same lock file, but older than the controller and than any move takes (what a host crash during a
    # move leaves): its git is gone.
    store, git_dir, _, request_id, lock = locked_merge(project)
    left = min(queue.STARTED, time.time()) - queue.STALE_LOCK_SECONDS - 1
    os.utime(lock, (left, left))
    Queue(project[1]).land_all(store)
    request = store.merge_request(request_id)
    assert request["status"] == "merged" and git(git_dir, "rev-parse", "main") == request["commit"]
    assert not lock.exists()


def test_a_scratch_copy_that_cannot_be_made_for_a_reason_other_than_space_fails_the_request(project):
    # Only a full disk is worth waiting for: any other error of the file system is told to the agent.
    store, config, _, _ = project
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "a.txt").write_text("no room to check\n", encoding="utf-8")
    request_id = merge(Queue(config), store, config, "w1", "w1 a")["metadata"]["requestId"]
    (store.dir / repository.SCRATCH_DIR).write_text("a file where the scratch folder goes\n", encoding="utf-8")
    Queue(config).land_all(store)
    request = store.merge_request(request_id)
    assert (request["status"], request["reason"]) == ("failed", "checks")
    assert "could not land it: [Errno 20] Not a directory" in request["output"], request["output"]


def test_the_queue_thread_lands_what_it_is_woken_for(project):
    store, config, _, _ = project

    class Configs:
        def get(self, _store):
            return config

    worker = queue.MergeQueue(Configs(), queue.run_check)
    try:
        repository.working_copy(store, config, "w1")
        (store.workspace("w1") / "a.txt").write_text("by the thread\n", encoding="utf-8")
        merge(worker, store, config, "w1", "threaded")
        from conftest import wait_until

        wait_until(lambda: store.merge_requests()[0]["status"] == "merged", 30, message="landed")
    finally:
        worker.close()
    assert log_subjects(store.dir / "repository.git")[0] == "threaded"
    assert not any((store.dir / repository.SCRATCH_DIR).glob("*"))


# ---------------------------------------------------------------- claims

def test_claims_name_the_holder_and_end_with_release_or_landing(project):
    store, config, _, _ = project
    answer = queue.claim_tool(None, store, config, agent("w1"), "a1", {"paths": ["src/*"], "reason": "parser"})
    assert answer["title"] == "claimed"
    with pytest.raises(Conflict, match=r"src/\* is claimed by w1 until .* \(parser\)"):
        queue.claim_tool(None, store, config, agent("w2"), "a2", {"paths": ["src/lexer.py"], "reason": "lexer"})
    queue.claim_tool(None, store, config, agent("w2"), "a2", {"paths": ["docs/*"], "reason": "docs"})
    assert queue.release_tool(None, store, config, agent("w1"), "a1", {})["metadata"]["paths"] == ["src/*"]
    queue.claim_tool(None, store, config, agent("w2"), "a2", {"paths": ["src/lexer.py"], "reason": "lexer"})
    assert {c["path"] for c in store.active_claims("9999")} == set()  # every lease has ended by then
    assert [e["type"] for e in store.list_events(100)].count("repo.claimed") == 3


# ---------------------------------------------------------------- people: CLI, gc

def test_cli_shows_log_queue_diff_and_exports(project, tmp_path):
    store, config, _, _ = project
    q = Queue(config)
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "a.txt").write_text("cli\n", encoding="utf-8")
    merge(q, store, config, "w1", "w1 via cli")
    q.land_all(store)
    root = str(tmp_path / "root")
    code, out, _ = cli("repo", "code", "--root", root)
    assert code == 0 and out.startswith("main at ") and "w1 via cli" in out and "agents/w1 at" in out
    code, out, _ = cli("repo", "code", "queue", "--root", root)
    assert "merged" in out and "w1 via cli" in out
    code, out, _ = cli("repo", "code", "diff", "--root", root)
    assert "-a\n+cli" in out
    code, out, _ = cli("repo", "code", "--json", "--root", root)
    assert json.loads(out)["branches"][0]["name"] == "agents/w1"
    code, out, _ = cli("repo", "code", "export", "--into", str(tmp_path / "copy"), "--root", root)
    assert code == 0 and (tmp_path / "copy" / "a.txt").read_text() == "cli\n"
    code, out, _ = cli("repo", "code", "export", "--bundle", str(tmp_path / "all.bundle"), "--root", root)
    listed = subprocess.run(["git", "bundle", "list-heads", str(tmp_path / "all.bundle")], capture_output=True,
                            text=True, check=True).stdout
    assert "refs/heads/main" in listed and "refs/heads/agents/w1" in listed
    code, _, err = cli("repo", "code", "export", "--root", root)
    assert code != 0 and "--into DIR or --bundle FILE" in err


def test_a_diff_longer_than_an_answer_holds_says_it_was_cut(project, tmp_path):
    store, config, _, _ = project
    q = Queue(config)
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "big.txt").write_text("line of a long file\n" * 25_000, encoding="utf-8")
    merge(q, store, config, "w1", "w1: a long file")
    q.land_all(store)
    answer = repository.diff(store, config)
    assert answer["truncated"] is True and len(answer["diff"]) == repository.DIFF_LIMIT
    code, out, err = cli("repo", "code", "diff", "--root", str(tmp_path / "root"))
    assert code == 0 and out == answer["diff"] + "\n"
    assert err.strip() == (f"repo diff: the diff is longer than this; shown up to {repository.DIFF_LIMIT} "
                           "characters (`repo export` gives the whole repository)")
    assert repository.diff(store, config, "main~1", "main~1")["truncated"] is False


def test_gc_removes_scratch_copies_no_merge_uses(project, tmp_path):
    store, _, _, _ = project
    leftover = store.dir / repository.SCRATCH_DIR / "mr_gone"
    leftover.mkdir(parents=True)
    code, out, _ = cli("gc", "code", "--root", str(tmp_path / "root"))
    assert code == 0 and "removed 1 scratch copy" in out and not leftover.exists()


def test_a_pending_merge_approval_shows_the_change_it_would_land(project):
    store, config, _, _ = project
    repository.working_copy(store, config, "w1")
    (store.workspace("w1") / "a.txt").write_text("to be approved\n", encoding="utf-8")
    (store.workspace("w1") / "new.txt").write_text("untracked too\n", encoding="utf-8")
    item = suzumio_approvals.with_preview(store, {"tool": "repo.merge", "status": "pending", "agentId": "w1"})
    assert "+to be approved" in item["preview"]["diff"] and "+untracked too" in item["preview"]["diff"]
    decided = suzumio_approvals.with_preview(store, {"tool": "repo.merge", "status": "allowed", "agentId": "w1"})
    assert "preview" not in decided
    assert "preview" not in suzumio_approvals.with_preview(store, {"tool": "repo.merge", "status": "pending",
                                                                   "agentId": "w2"})  # no working copy yet
