"""The team's repository on a full disk (docs/teams-that-write-code.md#durability): the project root on
a small tmpfs of its own (conftest's small_disk: needs root, SUZUMIO_REQUIRE_ROOT turns the skip into a
failure) is filled, then an activation's end commit and a landing are tried with the real git (the landing
refused by git, or by the project's database before git runs). Each fails saying the disk is full,
every branch stays where it was, `git fsck` passes, the queue's worker keeps the request waiting, and
once space returns the end commit is made, the same request lands, and `gc` removes the temporary
object files the failed writes left."""
import logging
import os
import sqlite3
import time

import pytest
from conftest import fill, wait_until
from repository_fixtures import (
    CHECK,
    NoWake,
    branch_heads,
    cli,
    fsck,
    init_repository_project,
    make_fixture_repository,
)

import suzumio_merge_queue as queue
import suzumio_repository as repository
from suzumio_errors import InsufficientStorage
from suzumio_store_repository import MERGE_MERGED, MERGE_WAITING

pytestmark = pytest.mark.timeout(120)


class OneConfig:
    """The merge queue's view of the project files: this one project's."""

    def __init__(self, config):
        self.config = config

    def get(self, store):
        return self.config


def worker_failures(caplog):
    """How many times the merge queue's worker was refused and put its project off."""
    return sum(r.getMessage() == "merge queue of code failed" for r in caplog.records)


def start_activation(store, config, activation_id, agent_id):
    """An activation row of `agent_id` with its start commit, as a backend's start records it."""
    with store.write() as tx:
        store.insert_activation(tx, activation_id, agent_id, "Write code.")
    repository.start_working_copy(store, config, store.activation(activation_id))


@pytest.mark.parametrize("refused_by", ["git", "database"])
def test_a_full_disk_fails_an_end_commit_and_a_landing_and_both_succeed_once_space_returns(
        small_disk, caplog, monkeypatch, refused_by):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(queue, "RETRY_SECONDS", 0.2)  # the worker's pause before trying again
    source = make_fixture_repository(small_disk / "source")
    store, config, root = init_repository_project(small_disk, source, checks=[CHECK])
    worker = queue.MergeQueue(OneConfig(config), queue.run_check_locally)
    try:
        git_dir = store.dir / repository.REPOSITORY_DIR
        # w1 asked to land a change; w2's activation wrote a file its end must commit. Random bytes, so
        # that git cannot store them in the few bytes a full disk may still hold.
        repository.working_copy(store, config, "w1")
        (store.workspace("w1") / "a.txt").write_text("a by w1\n", encoding="utf-8")
        answer = queue.merge_tool(NoWake(), store, config, {"id": "w1"}, "act-w1", {"message": "w1 changes a"})
        request_id = answer["metadata"]["requestId"]
        start_activation(store, config, "act-w2", "w2")
        (store.workspace("w2") / "data.bin").write_bytes(os.urandom(256 * 1024))
        w2_copy = repository.WorkingCopy(store, "w2").git_dir
        before = branch_heads(git_dir), branch_heads(w2_copy)

        # `git`: the database's log starts over in the file it already has, so that the store's few writes
        # of a landing still fit and git is refused first. `database`: the log is emptied, so that the
        # landing's first write to the store is refused before git runs.
        store._query_one(f"PRAGMA wal_checkpoint({'RESTART' if refused_by == 'git' else 'TRUNCATE'})")
        filler = fill(small_disk / "filler.bin")
        assert repository.activation_ended(store, config, "act-w2") is None
        [warning] = [r.getMessage() for r in caplog.records if "not committed" in r.getMessage()]
        assert "no space left on the disk" in warning, warning
        if refused_by == "git":
            with pytest.raises(InsufficientStorage, match="no space left on the disk") as refused:
                queue.land(store, config, store.merge_request(request_id), queue.run_check_locally)
            assert isinstance(refused.value, repository.GitError)
        else:
            with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
                queue.land(store, config, store.merge_request(request_id), queue.run_check_locally)
        assert store.merge_request(request_id)["status"] in MERGE_WAITING  # waiting, not failed
        assert (branch_heads(git_dir), branch_heads(w2_copy)) == before
        fsck(git_dir)
        fsck(w2_copy)
        assert store.commit_range("act-w2") == (before[1]["refs/heads/agents/w2"], None)

        # The queue's worker meets the same full disk and keeps the request waiting, trying again.
        worker.wake(store)
        wait_until(lambda: worker_failures(caplog) >= 2, 30, message="the worker refused for space twice")
        assert store.merge_request(request_id)["status"] in MERGE_WAITING
        assert (branch_heads(git_dir), branch_heads(w2_copy)) == before

        filler.unlink()  # space returns: the worker lands the same request, the next end commits
        wait_until(lambda: store.merge_request(request_id)["status"] == MERGE_MERGED, 30, message="the landing")
        head = repository.activation_ended(store, config, "act-w2")
        assert head is not None and head != before[1]["refs/heads/agents/w2"]
        assert store.commit_range("act-w2")[1] == head == branch_heads(git_dir)["refs/heads/agents/w2"]
        landed = store.merge_request(request_id)
        assert landed["commit"] == branch_heads(git_dir)["refs/heads/main"] != before[0]["refs/heads/main"]
        fsck(git_dir)
        fsck(w2_copy)

        # The failed writes left git's temporary object files (a partly written one can hold most of a
        # large file). `gc` removes those old enough that no git command can still be writing them: the
        # test ages them rather than wait an hour, and one made now stays.
        left = temporary_objects(store.dir)
        writers = {"repository.git", "workcopy.git"} if refused_by == "git" else {"workcopy.git"}
        assert {path.parts[-4] for path in left} == writers, left
        for path in left:
            os.utime(path, (time.time() - 2 * repository.TEMP_OBJECT_AGE_SECONDS,) * 2)
        fresh = git_dir / "objects" / "tmp_obj_being_written"
        fresh.write_bytes(b"")
        code, _, err = cli("gc", "code", "--root", str(small_disk / "root"))
        assert code == 0, err
        assert temporary_objects(store.dir) == [fresh]
        fsck(git_dir)
        fsck(w2_copy)
    finally:
        worker.close()
        root.close()


def temporary_objects(project_dir):
    return sorted(project_dir.glob("**/objects/**/tmp_*"))
