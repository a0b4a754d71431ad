"""The team's repository when the controller is killed (docs/teams-that-write-code.md#durability): a real
`suzumio serve` lands a merge request of a project whose repository is a real bare git repository, and is
SIGKILLed while the request's check runs, and (a test-only serve, tests/serve_killed_in_landing.py) just
before and just after the integration branch moves and just after the landing is recorded. After each
kill the repository passes `git fsck`, every branch names a commit, the integration branch is the old tip
or the landed commit and nothing else, and the request's record agrees with it; the next serve takes the
request again and lands it once, and `gc` leaves no scratch copy."""
import signal

import pytest
import requests
from conftest import restart_port, wait_until
from crash_fixtures import REPO, Controller, stop_leftover_runners
from repository_fixtures import (
    CHECK,
    NoWake,
    branch_heads,
    cli,
    fsck,
    git,
    init_repository_project,
    make_fixture_repository,
)

import suzumio_merge_queue as queue
import suzumio_repository as repository
from suzumio_store_repository import MERGE_FAILED, MERGE_MERGED, MERGE_RUNNING

pytestmark = pytest.mark.timeout(180)

PROJECT = "code"
KILLED_IN_LANDING = REPO / "tests" / "serve_killed_in_landing.py"
CHECK_BOUND_SECONDS = 120  # a check left running by a killed serve ends by itself after this


class Landing:
    """A project with one merge request of w1 queued (a.txt changed) and a serve that can be killed and
    started again on its root; what the landed commit must be is known up front."""

    def __init__(self, tmp_path, checks):
        source = make_fixture_repository(tmp_path / "source")
        self.store, config, self.root = init_repository_project(tmp_path, source, checks, name=PROJECT)
        self.root_path = tmp_path / "root"
        self.git_dir = self.store.dir / repository.REPOSITORY_DIR
        self.scratch = self.store.dir / repository.SCRATCH_DIR
        repository.working_copy(self.store, config, "w1")
        (self.store.workspace("w1") / "a.txt").write_text("a by w1\n", encoding="utf-8")
        answer = queue.merge_tool(NoWake(), self.store, config, {"id": "w1"}, "act-w1", {"message": "w1 changes a"})
        self.request_id, head = answer["metadata"]["requestId"], answer["metadata"]["head"]
        self.old_tip = git(self.git_dir, "rev-parse", "main")
        self.tree, conflicts = repository.merge_trees(self.git_dir, self.old_tip, head)
        assert conflicts == []
        self.controller = Controller(self.root_path, restart_port(), tmp_path / "serve.log")

    def serve(self, launcher=None):
        """Serve, and start the project on the first serve (its status outlives a kill): the scheduler's
        first pass hands the waiting request to the merge queue."""
        self.controller.start(launcher=launcher)
        if self.controller.starts > 1:
            return
        try:
            self.controller.post(f"/api/projects/{PROJECT}/start").raise_for_status()
        except requests.ConnectionError:  # a test-only serve may land, and die, before its answer is written
            if launcher is None:
                raise
        assert self.store.project()["status"] == "running"

    def request(self):
        return self.store.merge_request(self.request_id)

    def consistent(self):
        """The promise after any kill; returns the integration tip and the request's record."""
        fsck(self.git_dir)
        heads = branch_heads(self.git_dir)
        assert set(heads) == {"refs/heads/main", "refs/heads/agents/w1"}
        assert {git(self.git_dir, "cat-file", "-t", commit) for commit in heads.values()} == {"commit"}
        assert not list(self.git_dir.glob("**/*.lock")), "a lock file left behind"
        tip, request = heads["refs/heads/main"], self.request()
        if tip == self.old_tip:
            assert request["status"] != MERGE_MERGED, request
        else:  # the landed commit: the request's change on the old tip, nothing else
            assert git(self.git_dir, "rev-parse", f"{tip}^@") == self.old_tip
            assert git(self.git_dir, "rev-parse", f"{tip}^{{tree}}") == self.tree
            assert request.get("commit") == tip and request["status"] in (MERGE_RUNNING, MERGE_MERGED), request
        return tip, request

    def scratch_copies(self):
        """The scratch copies there are now, each `<request>.<pid of the serve that made it>`."""
        return sorted(path.name for path in self.scratch.iterdir()) if self.scratch.is_dir() else []

    def copy_of(self, controller):
        return f"{self.request_id}.{controller.process.pid}"

    def landed_once(self, left_by_the_kill):
        """The request lands (the next serve took it again), once; the scratch copy a killed serve left is
        there until `gc`, which leaves none."""
        wait_until(lambda: self.request()["status"] in (MERGE_MERGED, MERGE_FAILED), 60,
                   message=f"{self.request_id} taken again and finished")
        tip, request = self.consistent()
        assert request["status"] == MERGE_MERGED and tip != self.old_tip, request
        assert git(self.git_dir, "log", "--format=%s", "main").splitlines().count("w1 changes a") == 1
        events = [e["type"] for e in self.store.list_events(1000)]
        assert events.count("repo.merged") == 1 and "repo.merge_failed" not in events
        assert self.scratch_copies() == left_by_the_kill
        code, out, err = cli("gc", PROJECT, "--root", str(self.root_path))
        assert code == 0, err
        assert f"removed {len(left_by_the_kill)} scratch cop" in out and self.scratch_copies() == []

    def close(self):
        self.controller.stop()
        stop_leftover_runners(self.store)
        self.root.close()


def test_a_controller_killed_while_the_check_runs_leaves_the_branch_and_lands_the_request_on_resume(tmp_path):
    # The check says it started, then waits for the test's word (bounded, so the copy of it that the killed
    # serve leaves behind ends by itself).
    marks = tmp_path / "marks"
    marks.mkdir()
    started, release = marks / "started", marks / "release"
    check = (f"touch {started}; n=0; while [ ! -e {release} ]; do sleep 0.05; n=$((n+1)); "
             f"[ $n -lt {CHECK_BOUND_SECONDS * 20} ] || exit 1; done")
    landing = Landing(tmp_path, [check])
    try:
        landing.serve()
        wait_until(started.exists, 60, message="the check running")
        assert landing.request()["status"] == MERGE_RUNNING
        first = landing.copy_of(landing.controller)
        assert (landing.scratch / first / "a.txt").read_text() == "a by w1\n"
        landing.controller.kill()
        tip, request = landing.consistent()
        assert tip == landing.old_tip and request["status"] == MERGE_RUNNING and "commit" not in request
        started.unlink()
        landing.serve()
        wait_until(started.exists, 60, message="the check running again under the next serve")
        # The killed serve's check still runs in its own copy; the new one checks a copy of its own.
        assert landing.scratch_copies() == sorted([first, landing.copy_of(landing.controller)])
        release.touch()
        landing.landed_once(left_by_the_kill=[first])
    finally:
        release.touch()
        landing.close()


@pytest.mark.parametrize("kill_at", ["before-move", "after-move", "after-record"])
def test_a_controller_killed_around_the_move_of_the_branch_leaves_it_consistent_and_lands_once(
        tmp_path, monkeypatch, kill_at):
    monkeypatch.setenv("SUZUMIO_TEST_KILL_AT", kill_at)
    landing = Landing(tmp_path, [CHECK])
    try:
        landing.serve(launcher=KILLED_IN_LANDING)
        wait_until(landing.controller.exited, 60, message=f"serve killing itself {kill_at}")
        assert landing.controller.process.returncode == -signal.SIGKILL
        left = [landing.copy_of(landing.controller)]  # the killed serve's, never removed by it
        assert landing.scratch_copies() == left
        tip, request = landing.consistent()
        if kill_at == "before-move":  # the candidate recorded, the branch where it was
            assert tip == landing.old_tip and request["status"] == MERGE_RUNNING and request["commit"]
        elif kill_at == "after-move":  # moved, recorded as the candidate only
            assert tip != landing.old_tip and request["status"] == MERGE_RUNNING
        else:  # recorded, before its scratch copy was removed
            assert request["status"] == MERGE_MERGED
        monkeypatch.delenv("SUZUMIO_TEST_KILL_AT")
        landing.serve()
        landing.landed_once(left_by_the_kill=left)
    finally:
        landing.close()
