"""The merge queue and the `repo` toolpack (docs/teams-that-write-code.md): `repo.merge` queues a request;
one worker lands requests one at a time (the branch's changes rebased onto the integration tip, the
checks run on the result in a sandbox, the integration branch moved only when they pass) and tells the
coordinator or the requesting agent; `repo.sync`, `repo.status`, `repo.diff`, and path claims. Imported by
suzumio_toolpacks, which dispatches the tools and owns the one queue."""
import fnmatch
import logging
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import suzumio_backend
import suzumio_coordination as coordination
import suzumio_repository as repository
from suzumio_backend_docker import run_check_in_container
from suzumio_errors import BadRequest, Conflict, InsufficientStorage, storage_error
from suzumio_http import object_input, required_string
from suzumio_records import format_ts, to_datetime
from suzumio_repository import EVENT_FAILED, EVENT_MERGED
from suzumio_store_repository import MERGE_FAILED, MERGE_MERGED, MERGE_RUNNING

log = logging.getLogger(__name__)

EVENT_REQUESTED = "repo.merge_requested"
EVENT_CLAIMED = "repo.claimed"
EVENT_RELEASED = "repo.released"
REASON_CONFLICT = "conflict"
REASON_CHECKS = "checks"
CHECK_TIMEOUT_SECONDS = 900
OUTPUT_TAIL = 4000  # characters of a failing check's output the agent is sent
CLAIM_TTL = timedelta(hours=1)
RETRY_SECONDS = 5.0
# A lock file of the integration branch older than this process and than this many seconds is no live git's
# (a move holds it for milliseconds): a host crash during a move leaves one, and git refuses every move after.
STALE_LOCK_SECONDS = 60.0
STARTED = time.time()
CLOSE_WAIT_SECONDS = 10.0  # a landing that failed for want of disk or git is tried again after this


def tail(text, limit=OUTPUT_TAIL):
    return text if len(text) <= limit else "…" + text[-limit:]


# -------------------------------------------------- checks (docs/teams-that-write-code.md#where-checks-run)

def run_check_locally(config, agent_id, folder, command):
    """`local`: the check runs as a process of the controller's user in the scratch copy, like a local
    activation: no isolation. Returns (exit code, output)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "LANG": "C.UTF-8",
           "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    try:
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=CHECK_TIMEOUT_SECONDS,
                              check=False)
    except subprocess.TimeoutExpired as expired:
        return 124, (expired.stdout or b"").decode("utf-8", "replace") + f"\ntimed out after {CHECK_TIMEOUT_SECONDS} s"
    return done.returncode, done.stdout.decode("utf-8", "replace")


def run_check(config, agent_id, folder, command):
    """One check command in the sandbox of the project's backend: (exit code, output). A backend whose
    runners see the container layout runs it in a container like its activations' (suzumio_backend_docker)."""
    if suzumio_backend.backend_class(config.backend.kind).container:
        return run_check_in_container(config, agent_id, folder, command, CHECK_TIMEOUT_SECONDS)
    return run_check_locally(config, agent_id, folder, command)


# ---------------------------------------------------------------- the queue

class MergeQueue:
    """One worker thread lands the waiting requests of every project, one at a time, oldest first. Woken
    by `repo.merge` and, for requests a stopped controller left, by the scheduler's tick."""

    def __init__(self, configs, run_check):
        self.configs = configs
        self.run_check = run_check  # (config, agent id, folder, command) -> (exit code, output)
        self._lock = threading.Lock()
        self._waiting = {}  # project id -> its store, while it may have waiting requests
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def wake(self, store):
        with self._lock:
            self._waiting[store.project_id] = store
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="suzumio-merge-queue", daemon=True)
                self._thread.start()
        self._wake.set()

    def close(self):
        self._stop.set()
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            # A check may run for minutes: shutdown does not wait for it. Its request stays running and the
            # next serve lands it again (docs/teams-that-write-code.md#durability).
            thread.join(timeout=CLOSE_WAIT_SECONDS)
            if thread.is_alive():
                log.warning("merge queue still busy at shutdown; its request resumes with the next serve")

    def _run(self):
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                stores = list(self._waiting.values())
            for store in stores:
                if self._stop.is_set():
                    return
                try:
                    busy = self.tick(store)
                except Exception:
                    log.exception("merge queue of %s failed", store.project_id)
                    self._stop.wait(RETRY_SECONDS)
                    busy = True
                if busy:
                    self._wake.set()
                else:
                    with self._lock:
                        if self._waiting.get(store.project_id) is store:
                            del self._waiting[store.project_id]

    def tick(self, store):
        """Land the oldest waiting request of one project; False when none waits."""
        waiting = store.merge_requests(waiting_only=True)
        if not waiting or store.closed:
            return False
        land(store, self.configs.get(store), waiting[0], self.run_check)
        return True


def land(store, config, request, run_check):
    """docs/teams-that-write-code.md#the-merge-queue, for one request. Wanting disk space, it waits (the
    error is raised, so the worker pauses before trying again); any other git failure fails it, telling
    the agent: nothing stays running for ever."""
    git_dir = repository.ensure_repository(store, config)
    if not store.start_merge_request(request["id"]):
        return
    # One scratch copy per serve process: a check a killed controller left running goes on in its own
    # copy (nothing adopts it), never in the one this landing checks; `gc` removes it once it is done.
    scratch = Path(store.dir) / repository.SCRATCH_DIR / f"{request['id']}.{os.getpid()}"
    try:
        _land(store, config, request, run_check, git_dir, scratch)
    except (repository.GitError, OSError) as error:
        if not isinstance(error, repository.GitDiskFull) and storage_error(error) is None:
            _failed(store, config, request, REASON_CHECKS, output=tail(f"the merge queue could not land it: {error}"))
            return
        log.warning("merge %s of %s not landed now: %s", request["id"], store.project_id, error)
        _requeue(store, request["id"])
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # its index went once it was checked out


def _land(store, config, request, run_check, git_dir, scratch):
    branch = repository.integration_branch(git_dir)
    tip = repository.integration_tip(git_dir)
    candidate = request.get("commit")
    if candidate and request["status"] == MERGE_RUNNING and repository.is_ancestor(git_dir, candidate, tip):
        _merged(store, config, request, candidate, branch)  # moved before a stop, not yet recorded
        return
    tree, conflicts = repository.merge_trees(git_dir, tip, request["head"])
    if conflicts:
        _failed(store, config, request, REASON_CONFLICT, paths=conflicts,
                output=f"{', '.join(conflicts)}: changed on {branch} too; call repo.sync, resolve, then repo.merge")
        return
    if tree == repository.out("rev-parse", f"{tip}^{{tree}}", git_dir=git_dir):
        _failed(store, config, request, REASON_CONFLICT, paths=[],
                output=f"nothing left to merge: {branch} already holds these changes")
        return
    message = f"{request['message']}\n\nLanded from {repository.agent_branch(request['agent'])} by {request['id']}."
    commit = repository.out("commit-tree", tree, "-p", tip, "-m", message, git_dir=git_dir, author=request["agent"])
    _check_out(git_dir, commit, scratch)
    for command in config.repository.checks:
        code, output = run_check(config, request["agent"], scratch, command)
        if code != 0:
            _failed(store, config, request, REASON_CHECKS, output=tail(f"$ {command}\n{output}\n(exit code {code})"))
            return
    store.set_merge_candidate(request["id"], commit)
    _clear_stale_lock(store, git_dir, branch)
    # The one move of the integration branch: only from the tip the checks ran on (git's own lock file,
    # renamed into place, so a stop leaves the old tip or the new one).
    moved = repository.git("update-ref", "-m", f"merge {request['id']}", f"refs/heads/{branch}", commit, tip,
                           git_dir=git_dir, check=False)
    if moved.returncode != 0:
        if repository.integration_tip(git_dir) == tip:  # nobody moved it: the move itself failed
            raise repository.failure(["update-ref"], moved)
        log.info("integration branch of %s moved during %s; trying again", store.project_id, request["id"])
        store.requeue_merge_request(request["id"])
        return
    _merged(store, config, request, commit, branch)


def _clear_stale_lock(store, git_dir, branch):
    """Remove the integration branch's lock file when no live git can hold it (STALE_LOCK_SECONDS): only this
    process's queue moves that branch, one serve per root."""
    lock = Path(git_dir) / "refs" / "heads" / f"{branch}.lock"
    try:
        made = lock.stat().st_mtime
    except FileNotFoundError:
        return
    if made < min(STARTED, time.time() - STALE_LOCK_SECONDS):
        lock.unlink(missing_ok=True)
        log.warning("removed %s of %s, left by a git process that ended before this one started", lock.name,
                    store.project_id)


def _requeue(store, request_id):
    """Put a request back in the queue after a landing failed for want of room. The database may have no
    room either: the request then stays running, which the next landing treats the same way."""
    try:
        store.requeue_merge_request(request_id)
    except (sqlite3.Error, OSError, InsufficientStorage) as error:
        log.warning("merge %s stays running until it is tried again: %s", request_id, error)


def _check_out(git_dir, commit, scratch):
    """The tree of `commit` as plain files in the scratch folder (its own index, none in the repository)."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    index = Path(f"{scratch}.index")
    try:
        repository.git("read-tree", commit, git_dir=git_dir, index=index)
        repository.git("checkout-index", "--all", "--force", git_dir=git_dir, work_tree=scratch, index=index)
    finally:  # needed only to check out: a controller killed during the checks leaves the copy alone
        index.unlink(missing_ok=True)


def _merged(store, config, request, commit, branch):
    coordinator = config.communication.coordinator_agent
    payload = {"agent": request["agent"], "commit": commit, "branch": branch, "requestId": request["id"],
               "message": request["message"]}
    with store.write() as tx:
        if not store.finish_merge_request(tx, request["id"], MERGE_MERGED, commit=commit):
            return
        store.add_event(tx, EVENT_MERGED, payload)
        store.release_claims(tx, request["agent"])
        if coordinator != request["agent"] and store.agent_row(coordinator) is not None:
            coordination.record_signal(store, config, EVENT_MERGED, target_agent=coordinator, priority="P3",
                                       payload=dict(payload, text=f"{request['agent']}'s change landed on {branch} "
                                                                  f"as {commit[:12]}: {request['message']}"))
    log.info("merge %s of %s landed as %s", request["id"], store.project_id, commit)


def _failed(store, config, request, reason, paths=None, output=None):
    payload = {"agent": request["agent"], "reason": reason, "requestId": request["id"]}
    if paths is not None:
        payload["paths"] = paths
    if output is not None:
        payload["output"] = output
    with store.write() as tx:
        if not store.finish_merge_request(tx, request["id"], MERGE_FAILED, reason=reason, paths=paths, output=output):
            return
        store.add_event(tx, EVENT_FAILED, payload)
        coordination.record_signal(store, config, EVENT_FAILED, target_agent=request["agent"], priority="P1",
                                   payload=payload)
    log.info("merge %s of %s failed: %s", request["id"], store.project_id, reason)


# ---------------------------------------------------------------- the repo tools

def _result(title, output, **metadata):
    return {"title": title, "output": output, "metadata": metadata}


def merge_tool(queue, store, config, agent, activation_id, data):
    message = required_string(object_input(data), "message")
    copy = repository.working_copy(store, config, agent["id"])
    unresolved = copy.unresolved()
    if unresolved:
        raise BadRequest(f"Resolve the conflict markers first in: {', '.join(unresolved)}")
    head = copy.commit(f"{message} (activation {activation_id})")
    git_dir = copy.repository
    tip = repository.integration_tip(git_dir)
    tree, conflicts = repository.merge_trees(git_dir, tip, head)
    if not conflicts and tree == repository.out("rev-parse", f"{tip}^{{tree}}", git_dir=git_dir):
        raise BadRequest(f"Nothing to merge: {copy.branch} adds nothing to {repository.integration_branch(git_dir)}")
    with store.write() as tx:
        request_id = store.insert_merge_request(tx, agent["id"], activation_id, message, head)
        store.add_event(tx, EVENT_REQUESTED, {"agent": agent["id"], "requestId": request_id, "head": head,
                                              "activationId": activation_id})
    ahead = len(store.merge_requests(waiting_only=True)) - 1
    queue.wake(store)
    return _result("merge queued", f"Merge request {request_id} queued for {head[:12]} ({ahead} ahead of it). "
                   "The checks run on it; if it cannot land you get a P1 signal saying why.",
                   requestId=request_id, head=head)


def sync_tool(queue, store, config, agent, activation_id, data):
    object_input(data)
    copy = repository.working_copy(store, config, agent["id"])
    paths = copy.sync(f"Work of activation {activation_id} before a sync")
    branch = repository.integration_branch(copy.repository)
    if paths:
        return _result("sync: conflicts", f"Merged {branch} into {copy.branch} with conflicts in: {', '.join(paths)}. "
                       "Edit those files to keep what both sides need and remove every conflict marker "
                       "(<<<<<<<, =======, >>>>>>>); then call repo.merge.", conflicts=paths)
    return _result("synced", f"{copy.branch} now holds {branch} at {copy.head()[:12]}.", conflicts=[])


def status_tool(queue, store, config, agent, activation_id, data):
    object_input(data)
    copy = repository.working_copy(store, config, agent["id"])
    changes = copy.against_integration(name_status=True).strip()
    branch = repository.integration_branch(copy.repository)
    tip = repository.integration_tip(copy.repository)
    behind, ahead = repository.out("rev-list", "--left-right", "--count", f"{tip}...HEAD",
                                   git_dir=copy.git_dir).split()
    waiting = [r["id"] for r in store.merge_requests(waiting_only=True) if r["agent"] == agent["id"]]
    lines = [f"Branch {copy.branch} at {copy.head()[:12]}: {ahead} commit(s) ahead of {branch}, {behind} behind "
             f"(its tip {tip[:12]}).",
             "Changes against it (uncommitted work included):", changes or "(none)"]
    unresolved = copy.unresolved()
    if unresolved:
        lines.append(f"Unresolved conflicts from a sync: {', '.join(unresolved)}")
    if waiting:
        lines.append(f"Merge requests waiting: {', '.join(waiting)}")
    return _result("repository status", "\n".join(lines), ahead=int(ahead), behind=int(behind),
                   unresolved=unresolved, waiting=waiting)


def diff_tool(queue, store, config, agent, activation_id, data):
    object_input(data)
    copy = repository.working_copy(store, config, agent["id"])
    text = copy.against_integration(name_status=False)
    return _result("repository diff", tail(text, repository.DIFF_LIMIT) if text else "(no changes)")


def _overlaps(first, second):
    """Whether two path globs can name the same file (a folder claims what is under it)."""
    first, second = first.rstrip("/"), second.rstrip("/")
    return (first == second or fnmatch.fnmatchcase(first, second) or fnmatch.fnmatchcase(second, first)
            or first.startswith(second + "/") or second.startswith(first + "/"))


def _paths(data, required):
    paths = data.get("paths")
    if paths is None and not required:
        return None
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p.strip() for p in paths):
        raise BadRequest("paths: expected a list of path globs, e.g. [\"src/parser/*\"]")
    return [p.strip().lstrip("./") or "." for p in paths]


def claim_tool(queue, store, config, agent, activation_id, data, now=None):
    data = object_input(data)
    if not config.repository.claims:
        raise BadRequest("Claims are off in this project (repository.claims)")
    paths = _paths(data, required=True)
    reason = required_string(data, "reason")
    now = to_datetime(now)
    held = [c for c in store.active_claims(format_ts(now)) if c["agent"] != agent["id"]]
    taken = [f"{c['path']} is claimed by {c['agent']} until {c['expiresAt']} ({c['reason']})"
             for c in held for path in paths if _overlaps(path, c["path"])]
    if taken:
        raise Conflict("Not claimed: " + "; ".join(dict.fromkeys(taken)))
    expires = format_ts(now + CLAIM_TTL)
    with store.write(now) as tx:
        store.release_claims(tx, agent["id"], paths)
        ids = [store.insert_claim(tx, agent["id"], path, reason, expires) for path in paths]
        store.add_event(tx, EVENT_CLAIMED, {"agent": agent["id"], "paths": paths, "reason": reason,
                                            "expiresAt": expires})
    return _result("claimed", f"Claimed {', '.join(paths)} until {expires}; the claim ends when your change lands, "
                   "with repo.release, or then.", claims=ids, expiresAt=expires)


def release_tool(queue, store, config, agent, activation_id, data):
    paths = _paths(object_input(data), required=False)
    with store.write() as tx:
        released = store.release_claims(tx, agent["id"], paths)
        if released:
            store.add_event(tx, EVENT_RELEASED, {"agent": agent["id"], "paths": released})
    return _result("released", f"Released: {', '.join(released)}" if released else "You held no such claim.",
                   paths=released)


REPO_HANDLERS = {
    "repo.merge": merge_tool,
    "repo.sync": sync_tool,
    "repo.status": status_tool,
    "repo.diff": diff_tool,
    "repo.claim": claim_tool,
    "repo.release": release_tool,
}


def run_repo_tool(queue, store, config, agent, activation_id, tool, data):
    """One `repo.*` call of an agent, on its own working copy and branch only."""
    return REPO_HANDLERS[tool](queue, store, config, agent, activation_id, data)
