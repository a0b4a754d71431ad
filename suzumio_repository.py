"""The team's repository (docs/teams-that-write-code.md): the project's bare `repository.git` made from
`repository.source`, each agent's working copy on `agents/<id>` (its files in the agent's workspace, its
git folder beside it, out of the agent's reach), the commit at each activation's end, and what people read
(log, branches, diffs, export). Only the `git` command line is used. Imported by the backends, the runner
routes, the merge queue (suzumio_merge_queue), the API and the CLI."""
import functools
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from suzumio_config_repository import is_remote
from suzumio_errors import BadRequest, ConfigError, Conflict, InsufficientStorage, InternalError, NotFound

log = logging.getLogger(__name__)

GIT_MINIMUM = (2, 38)  # `git merge-tree --write-tree`
REPOSITORY_DIR = "repository.git"
SCRATCH_DIR = "repository-scratch"  # <project>/repository-scratch/<request>.<pid>: a merge's checked-out tree
WORKCOPY_GITDIR = "workcopy.git"  # <project>/agents/<id>/workcopy.git: the git folder of the agent's workspace
BRANCH_PREFIX = "agents/"
INTEGRATION_REF = "refs/remotes/integration"  # the integration tip as a working copy last fetched it
REPLAYED_REFS = "refs/replayed/"  # a replay's copy of its source's branches (restore_replayed)
COMMITTER = ("Suzumio", "suzumio@localhost")
EVENT_COMMITTED = "repo.committed"
# The merge queue's events, and the kinds of the signals it raises with them (suzumio_merge_queue).
EVENT_MERGED = "repo.merged"
EVENT_FAILED = "repo.merge_failed"
LOG_LIMIT = 50
DIFF_LIMIT = 400_000  # characters of a diff an answer carries
REV_TEXT = re.compile(r"^[A-Za-z0-9_./@^~{}-]+$")
# How git says a write found no room (its own wording, and strerror of ENOSPC and EDQUOT under LC_ALL=C).
DISK_FULL_TEXT = ("No space left on device", "Out of diskspace", "Disk quota exceeded")
_VIEW_LOCKS = {}  # git folder -> the lock of against_integration's views of that working copy
TEMP_OBJECT_AGE_SECONDS = 3600  # `gc` removes a temporary object file of a failed write once it is this old


class GitError(InternalError):
    """A git command failed in a way the caller did not expect (its stderr is the message)."""


class GitDiskFull(GitError, InsufficientStorage):
    """A git command could not write for want of disk space: waiting mends it, so the caller may try
    again. Still a GitError (callers that log git failures log this one too), answered as 507."""

    status = InsufficientStorage.status


def failure(args, done):
    """The error for a git command that exited non-zero: GitDiskFull when git says the disk is full."""
    text = done.stderr.strip() or done.stdout.strip()
    if any(words in text for words in DISK_FULL_TEXT):
        return GitDiskFull(f"Insufficient storage: git {args[0]} could not write, no space left on the disk "
                           f"of the runtime root ({text})")
    return GitError(f"git {args[0]} failed: {text}")


# ---------------------------------------------------------------- the git command line

def _environment(author=None):
    """What every git command gets: no system or user configuration (no hooks, signing or aliases of the
    controller's user), no prompt, and the author and committer of a commit."""
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C",
           "GIT_COMMITTER_NAME": COMMITTER[0], "GIT_COMMITTER_EMAIL": COMMITTER[1],
           "GIT_AUTHOR_NAME": COMMITTER[0], "GIT_AUTHOR_EMAIL": COMMITTER[1]}
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        if name in os.environ:  # a remote source is fetched by the controller, through its own proxy
            env[name] = os.environ[name]
    if author is not None:
        env["GIT_AUTHOR_NAME"], env["GIT_AUTHOR_EMAIL"] = author, f"{author}@agents.suzumio"
    return env


def git(*args, git_dir=None, work_tree=None, index=None, author=None, check=True, data=None, cwd=None):
    """Run one git command; returns the CompletedProcess (stdout and stderr as text). With `check`, a
    non-zero exit raises GitError with git's own message. Hooks never run: no configuration can name any."""
    command = ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=" + os.devnull, "-c", "commit.gpgSign=false",
               "-c", "core.autocrlf=false", "-c", "core.quotePath=false"]
    if git_dir is not None:
        command += ["--git-dir", str(git_dir)]
    if work_tree is not None:
        command += ["--work-tree", str(work_tree)]
    env = _environment(author)
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    try:
        done = subprocess.run(command + [str(arg) for arg in args], env=env, input=data, capture_output=True,
                              cwd=cwd, check=False)
    except FileNotFoundError:
        raise ConfigError("repository: needs the git command line (git 2.38 or newer), and git was not found") \
            from None
    done.stdout = done.stdout.decode("utf-8", "replace") if isinstance(done.stdout, bytes) else done.stdout
    done.stderr = done.stderr.decode("utf-8", "replace")
    if check and done.returncode != 0:
        raise failure(args, done)
    return done


@functools.lru_cache(maxsize=1)
def git_version():
    """(major, minor) of the git command line, or a ConfigError when it is missing or too old."""
    text = git("--version").stdout
    match = re.search(r"(\d+)\.(\d+)", text)
    version = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if version < GIT_MINIMUM:
        raise ConfigError(f"repository: needs git {GIT_MINIMUM[0]}.{GIT_MINIMUM[1]} or newer (found: {text.strip()})")
    return version


def out(*args, **options):
    return git(*args, **options).stdout.strip()


def rev(git_dir, name):
    """The commit `name` names in `git_dir`, or None."""
    done = git("rev-parse", "--verify", "--quiet", f"{name}^{{commit}}", git_dir=git_dir, check=False)
    return done.stdout.strip() or None


def is_ancestor(git_dir, older, newer):
    return git("merge-base", "--is-ancestor", older, newer, git_dir=git_dir, check=False).returncode == 0


def merge_trees(git_dir, ours, theirs):
    """Three-way merge of two commits without a working tree: (tree, conflicting paths)."""
    done = git("merge-tree", "--write-tree", "--name-only", "--no-messages", ours, theirs, git_dir=git_dir,
               check=False)
    if done.returncode not in (0, 1):
        raise failure(["merge-tree"], done)
    lines = done.stdout.splitlines()
    return lines[0], [line for line in lines[1:] if line]


# ---------------------------------------------------------------- the project's repository

def repository_dir(store):
    return Path(store.dir) / REPOSITORY_DIR


def has_repository(store):
    return (repository_dir(store) / "HEAD").is_file()


def check_source(settings):
    """Before `init`: git is there and new enough, and the source answers (a remote one is asked by the
    controller itself)."""
    git_version()
    if not is_remote(settings.source) and not Path(settings.source).exists():
        raise ConfigError(f"repository.source: {settings.source} does not exist")
    done = git("ls-remote", settings.source, "HEAD", check=False)
    if done.returncode != 0:
        why = next((line for line in done.stderr.splitlines() if line.startswith("fatal:")), done.stderr.strip())
        raise ConfigError(f"repository.source: {settings.source} is not a git repository ({why})")


def create_repository(project_dir, settings):
    """Make `<project>/repository.git` from the source (never modified): a bare copy whose HEAD is the
    integration branch, without the source as a remote. Written beside and renamed into place, so a
    stopped controller leaves it whole or absent. Nothing when it exists."""
    target = Path(project_dir) / REPOSITORY_DIR
    if (target / "HEAD").is_file():
        return target
    git_version()
    temp = target.with_name(f".{REPOSITORY_DIR}.{os.getpid()}.tmp")
    shutil.rmtree(temp, ignore_errors=True)
    try:
        git("clone", "--bare", "--quiet", "--no-hardlinks", settings.source, temp)
        branch = settings.branch
        if branch is None:
            head = git("symbolic-ref", "--quiet", "HEAD", git_dir=temp, check=False).stdout.strip()
            branch = head[len("refs/heads/"):] if head.startswith("refs/heads/") else None
        if branch is None or rev(temp, f"refs/heads/{branch}") is None:
            where = f"repository.branch: {branch}" if settings.branch else "repository.source: its HEAD"
            raise ConfigError(f"{where} is not a branch with commits in {settings.source}")
        git("symbolic-ref", "HEAD", f"refs/heads/{branch}", git_dir=temp)
        git("remote", "remove", "origin", git_dir=temp, check=False)
        git("config", "core.logAllRefUpdates", "always", git_dir=temp)
        git("config", "gc.auto", "0", git_dir=temp)  # `suzumio gc` prunes, never a command in passing
        os.replace(temp, target)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    log.info("repository of %s made from %s", Path(project_dir).name, settings.source)
    return target


def ensure_repository(store, config):
    """The project's repository, made from the source when it is not there yet (a project initialized by
    a caller that did not make it)."""
    if config.repository is None:
        raise NotFound(f"Project {store.project_id} has no repository (repository: in its project file)")
    return create_repository(store.dir, config.repository)


def integration_branch(git_dir):
    return out("symbolic-ref", "--short", "HEAD", git_dir=git_dir)


def integration_tip(git_dir):
    return rev(git_dir, "refs/heads/" + integration_branch(git_dir))


def agent_branch(agent_id):
    return BRANCH_PREFIX + agent_id


# ---------------------------------------------------------------- working copies

class WorkingCopy:
    """One agent's working copy: its files are the agent's workspace, its git folder lies beside it (never
    mounted into an activation), its branch `agents/<id>`. The controller alone runs git in it."""

    def __init__(self, store, agent_id):
        self.store = store
        self.agent_id = agent_id
        self.repository = repository_dir(store)
        self.git_dir = Path(store.dir) / "agents" / agent_id / WORKCOPY_GITDIR
        self.work_tree = Path(store.workspace(agent_id))
        self.branch = agent_branch(agent_id)

    def git(self, *args, **options):
        return git(*args, git_dir=self.git_dir, work_tree=self.work_tree, **options)

    @property
    def exists(self):
        return (self.git_dir / "HEAD").is_file()

    def head(self):
        return rev(self.git_dir, "HEAD")

    def create(self):
        """Made at the agent's first activation: its branch as the repository holds it, else a new one
        from the integration tip; the files are checked out over whatever the workspace holds."""
        temp = self.git_dir.with_name(f".{WORKCOPY_GITDIR}.{os.getpid()}.tmp")
        shutil.rmtree(temp, ignore_errors=True)
        self.work_tree.mkdir(parents=True, exist_ok=True)
        known = rev(self.repository, "refs/heads/" + self.branch)
        start = known or integration_tip(self.repository)
        try:
            git("init", "--quiet", "--bare", temp)
            git("config", "core.bare", "false", git_dir=temp)
            git("fetch", "--quiet", "--no-tags", self.repository,
                f"+refs/heads/{integration_branch(self.repository)}:{INTEGRATION_REF}", git_dir=temp)
            if known:
                git("fetch", "--quiet", "--no-tags", self.repository,
                    f"+refs/heads/{self.branch}:refs/heads/{self.branch}", git_dir=temp)
            else:
                git("update-ref", f"refs/heads/{self.branch}", start, git_dir=temp)
            git("symbolic-ref", "HEAD", f"refs/heads/{self.branch}", git_dir=temp)
            git("reset", "--quiet", "--hard", "HEAD", git_dir=temp, work_tree=self.work_tree)
            os.replace(temp, self.git_dir)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
        if not known:
            self.publish()
        hand_to_workspace_owner(self.work_tree)
        return self.head()

    def publish(self):
        """Copy the branch into the project's repository: only `agents/<id>`, whatever the working copy holds."""
        git("push", "--quiet", "--force", self.repository, f"HEAD:refs/heads/{self.branch}", git_dir=self.git_dir)

    def fetch_integration(self):
        git("fetch", "--quiet", "--no-tags", self.repository,
            f"+refs/heads/{integration_branch(self.repository)}:{INTEGRATION_REF}", git_dir=self.git_dir)
        return rev(self.git_dir, INTEGRATION_REF)

    def merging(self):
        return (self.git_dir / "MERGE_HEAD").is_file()

    def commit(self, message):
        """Commit whatever changed in the workspace (a sync's pending merge too) as the agent, publish the
        branch, and return its head."""
        self.git("add", "--all", "--", ".")
        changed = self.git("diff", "--cached", "--quiet", "HEAD", check=False).returncode != 0
        if changed or self.merging():
            self.git("commit", "--quiet", "--no-verify", "--allow-empty", "-m", message, author=self.agent_id)
        self.publish()
        return self.head()

    def unresolved(self):
        """Paths a sync left in conflict that still hold conflict markers."""
        if not self.merging():
            return []
        names = self.git("diff", "--name-only", "--diff-filter=U", check=False).stdout.split("\n")
        paths = []
        for name in filter(None, names):
            path = self.work_tree / name
            try:
                if path.is_file() and b"\n<<<<<<< " in b"\n" + path.read_bytes():
                    paths.append(name)
            except OSError:
                continue
        return paths

    def _staged(self, index):
        """A throwaway index of the workspace as it is now (the working copy's own index untouched)."""
        own = self.git_dir / "index"
        if own.is_file():
            shutil.copyfile(own, index)
        git("add", "--all", "--", ".", git_dir=self.git_dir, work_tree=self.work_tree, index=index)

    def against_integration(self, name_status):
        """The workspace as it is now against where it left the integration branch (its merge base):
        `git diff` text or name-status lines, untracked files included."""
        # One view of a working copy at a time in this process: the control room asks for the same approval's
        # preview from two cards at once, and two views shared the throwaway index and raced to update the
        # fetched integration ref, so one of them failed and the card showed no change.
        with _VIEW_LOCKS.setdefault(str(self.git_dir), threading.Lock()):
            tip = self.fetch_integration()
            base = out("merge-base", "HEAD", tip, git_dir=self.git_dir) if tip else "HEAD"
            index = self.git_dir / f"suzumio-view.{os.getpid()}.{threading.get_ident()}.index"
            try:
                self._staged(index)
                mode = ["--name-status"] if name_status else ["--stat", "--patch"]
                return git("diff", "--cached", *mode, base, git_dir=self.git_dir, work_tree=self.work_tree,
                           index=index).stdout
            finally:
                index.unlink(missing_ok=True)

    def sync(self, message):
        """Bring the integration tip into the branch (the agent's changes committed first): the paths in
        conflict, [] when it merged cleanly. Conflicts stay in the files as markers, the merge pending until
        the agent's next commit."""
        if self.merging():
            raise BadRequest("A sync is already waiting for its conflicts to be resolved: edit the files "
                             "(remove the conflict markers), then call repo.merge or end the activation")
        self.commit(message)
        tip = self.fetch_integration()
        done = self.git("merge", "--quiet", "--no-edit", "--no-ff", "--no-verify", "-m",
                        f"Sync {self.branch} with {integration_branch(self.repository)}", tip, check=False,
                        author=self.agent_id)
        hand_to_workspace_owner(self.work_tree)
        if done.returncode == 0:
            self.publish()
            return []
        paths = [p for p in self.git("diff", "--name-only", "--diff-filter=U", check=False).stdout.split("\n") if p]
        if not paths:
            raise failure(["merge"], done)
        return paths


def pending_change(store, agent_id):
    """What a `repo.merge` of the agent would land now (its workspace against the integration branch), for
    a person deciding it; None without a working copy or when git cannot say."""
    copy = WorkingCopy(store, agent_id)
    if not has_repository(store) or not copy.exists:
        return None
    try:
        return copy.against_integration(name_status=False)[:DIFF_LIMIT]
    except (OSError, GitError) as error:
        log.info("no preview of %s's change: %s", agent_id, error)
        return None


def hand_to_workspace_owner(folder):
    """A root controller writes files an unprivileged activation must edit: hand whatever it wrote to the
    workspace folder's owner."""
    if os.getuid() != 0:
        return
    owner = os.stat(folder)
    if (owner.st_uid, owner.st_gid) == (0, 0):
        return
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            if (info.st_uid, info.st_gid) != (owner.st_uid, owner.st_gid):
                os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


def working_copy(store, config, agent_id):
    """The agent's working copy, or BadRequest when the repository is not its (repository.agents)."""
    if config.repository is None:
        raise BadRequest(f"Project {store.project_id} has no repository (repository: in its project file)")
    if not config.repository.has_agent(agent_id):
        raise BadRequest(f"{agent_id} has no working copy of the repository (repository.agents)")
    ensure_repository(store, config)
    copy = WorkingCopy(store, agent_id)
    if not copy.exists:
        copy.create()
    return copy


def start_working_copy(store, config, activation):
    """At an activation's start: its agent's working copy made or kept, the start commit recorded. Nothing
    for an agent without one."""
    agent_id = activation["agentId"]
    if config.repository is None or not config.repository.has_agent(agent_id):
        return None
    head = working_copy(store, config, agent_id).head()
    store.set_commit_start(activation["id"], head)
    return head


def activation_ended(store, config, activation_id):
    """An activation ended (its output arrived, or its runner is gone): what changed in its working copy is
    committed to its branch, once, and recorded as its end commit, with every branch of the repository as
    they are now (a fork at this activation starts from them). A failure is logged, never raised: the
    commit is made at the agent's next end instead."""
    if config.repository is None or not has_repository(store):
        return None
    start, end = store.commit_range(activation_id)
    agent_id = store.activation(activation_id)["agentId"]
    head = branch = None
    try:
        if start is not None and end is None:
            copy = working_copy(store, config, agent_id)
            head, branch = copy.commit(f"Activation {activation_id} of {agent_id}"), copy.branch
        refs = branch_heads(repository_dir(store))
    except (OSError, GitError) as error:
        log.warning("working copy of activation %s not committed: %s", activation_id, error)
        return None
    with store.write() as tx:
        if head is not None and store.set_commit_end(tx, activation_id, head):
            store.add_event(tx, EVENT_COMMITTED, {"activationId": activation_id, "agentId": agent_id,
                                                  "branch": branch, "commitStart": start, "commit": head,
                                                  "changed": head != start})
        store.set_repository_refs(tx, activation_id, refs)
    return head


def branch_heads(git_dir):
    """{"HEAD": the integration branch's ref, "refs/heads/<name>": commit, …}: every branch as it is now."""
    refs = {"HEAD": out("symbolic-ref", "HEAD", git_dir=git_dir)}
    for line in filter(None, out("for-each-ref", "--format=%(refname) %(objectname)", "refs/heads",
                                 git_dir=git_dir).split("\n")):
        name, commit = line.split(" ")
        refs[name] = commit
    return refs


def fork_repository(source, store, activation_id):
    """A fork's repository: the source's as it was when `activation_id` ended, every branch (the objects
    copied whole, then each branch set to its recorded commit). Nothing when the source has none."""
    if not has_repository(source):
        return None
    refs = source.repository_refs(activation_id)
    if refs is None:
        raise Conflict(f"Activation {activation_id} has no recorded repository state (it ended before the "
                       "repository was made, or its end was not recorded)")
    target = repository_dir(store)
    temp = target.with_name(f".{REPOSITORY_DIR}.{os.getpid()}.tmp")
    shutil.rmtree(temp, ignore_errors=True)
    try:
        shutil.copytree(repository_dir(source), temp, symlinks=True)
        for name in branch_heads(temp):
            if name != "HEAD" and name not in refs:
                git("update-ref", "-d", name, git_dir=temp)
        for name, commit in refs.items():
            if name != "HEAD":
                git("update-ref", name, commit, git_dir=temp)
        git("symbolic-ref", "HEAD", refs["HEAD"], git_dir=temp)
        os.replace(temp, target)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return target


def restore_replayed(source, store, agent_id, activation_id):
    """A replay with recorded tools, at the end of the activation that re-ran the source's `activation_id`:
    the code as the source had it then. The agent's working copy holds the files of that activation's end
    commit (committed to the agent's own branch by the end of the activation, as any change is) and the
    integration branch is where the source's was. Nothing when either project has no repository."""
    if not (has_repository(source) and has_repository(store)):
        return
    refs = source.repository_refs(activation_id) or {}
    _, end = source.commit_range(activation_id)
    target = repository_dir(store)
    # The source's commits under a namespace of their own: a fetch names branches, not commit ids.
    git("fetch", "--quiet", "--no-tags", repository_dir(source), f"+refs/heads/*:{REPLAYED_REFS}*", git_dir=target)
    branch = refs.get("HEAD")
    if branch and refs.get(branch):
        git("update-ref", branch, refs[branch], git_dir=target)
    copy = WorkingCopy(store, agent_id)
    if end is None or not copy.exists:
        return
    git("fetch", "--quiet", "--no-tags", target, f"+{REPLAYED_REFS}*:{REPLAYED_REFS}*", git_dir=copy.git_dir)
    copy.git("add", "--all", "--", ".")  # tracked, so the reset below removes what the end commit lacks
    copy.git("read-tree", "--reset", "-u", end)
    hand_to_workspace_owner(copy.work_tree)


# ---------------------------------------------------------------- what people read

def check_rev(text, name):
    if not isinstance(text, str) or not REV_TEXT.match(text) or text.startswith("-"):
        raise BadRequest(f"{name}: not a revision: {text!r}")
    return text


def log_entries(git_dir, ref, limit=LOG_LIMIT):
    lines = out("log", f"--max-count={int(limit)}", "--format=%H%x1f%s%x1f%an%x1f%cI", ref, git_dir=git_dir)
    entries = []
    for line in filter(None, lines.split("\n")):
        commit, subject, author, date = line.split("\x1f")
        entries.append({"commit": commit, "subject": subject, "author": author, "date": date})
    return entries


def branches(git_dir, branch):
    """Every `agents/<id>` branch with its head and how far it is ahead of and behind the integration branch."""
    rows = []
    names = out("for-each-ref", "--format=%(refname:short) %(objectname)", f"refs/heads/{BRANCH_PREFIX}",
                git_dir=git_dir)
    for line in filter(None, names.split("\n")):
        name, head = line.split(" ")
        behind, ahead = out("rev-list", "--left-right", "--count", f"{branch}...{name}", git_dir=git_dir).split()
        rows.append({"name": name, "agent": name[len(BRANCH_PREFIX):], "head": head, "ahead": int(ahead),
                     "behind": int(behind)})
    return rows


def integration_history(store):
    """[{subject, author, tree}] of the integration branch, oldest first; None without a repository."""
    if not has_repository(store):
        return None
    git_dir = repository_dir(store)
    lines = out("log", "--reverse", "--format=%s%x1f%an%x1f%T", integration_branch(git_dir), git_dir=git_dir)
    return [dict(zip(("subject", "author", "tree"), line.split("\x1f"), strict=True))
            for line in filter(None, lines.split("\n"))]


def overview(store, config, now_text):
    """`GET /api/projects/:p/repository` (docs/http-api.md)."""
    git_dir = ensure_repository(store, config)
    branch = integration_branch(git_dir)
    return {"branch": branch, "head": integration_tip(git_dir), "source": config.repository.source,
            "checks": list(config.repository.checks), "claimsEnabled": config.repository.claims,
            "log": log_entries(git_dir, branch), "branches": branches(git_dir, branch),
            "queue": store.merge_requests(), "claims": store.active_claims(now_text)}


def diff(store, config, base=None, target=None):
    """`git diff base target` in the project's repository (defaults: the integration tip's parent, the tip)."""
    git_dir = ensure_repository(store, config)
    target = check_rev(target, "to") if target else integration_branch(git_dir)
    base = check_rev(base, "from") if base else f"{target}~1"
    for name, value in (("from", base), ("to", target)):
        if rev(git_dir, value) is None:
            raise NotFound(f"{name}: unknown revision: {value}")
    # Not stripped: the stat's first line starts with a space, as every line of it does.
    text = git("diff", "--stat", "--patch", rev(git_dir, base), rev(git_dir, target), git_dir=git_dir).stdout
    return {"from": rev(git_dir, base), "to": rev(git_dir, target), "diff": text[:DIFF_LIMIT],
            "truncated": len(text) > DIFF_LIMIT}


def export(store, config, into=None, bundle=None):
    """A copy of the repository for people: a clone into a new folder, or a bundle file of every branch."""
    git_dir = ensure_repository(store, config)
    if bundle is not None:
        git("bundle", "create", "--quiet", Path(bundle).resolve(), "--all", git_dir=git_dir)
        return str(Path(bundle).resolve())
    target = Path(into).resolve()
    if target.exists() and any(target.iterdir()):
        raise BadRequest(f"--into: {target} is not empty")
    git("clone", "--quiet", "--no-hardlinks", git_dir, target)
    return str(target)


def remove_scratch(store):
    """`gc`: scratch copies no merge is using (a controller stopped during a merge's checks leaves one),
    and the temporary object files failed git writes left. Returns how many scratch copies went."""
    root = Path(store.dir) / SCRATCH_DIR
    waiting = {request["id"] for request in store.merge_requests(waiting_only=True)}
    removed = 0
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.split(".")[0] not in waiting:  # <request>.<pid>, or its index beside it
                removed += entry.is_dir()
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
    if has_repository(store):
        git("worktree", "prune", git_dir=repository_dir(store), check=False)
    copies = (Path(store.dir) / "agents").glob(f"*/{WORKCOPY_GITDIR}")
    stale = remove_temporary_objects([repository_dir(store), *copies])
    if stale:
        log.info("gc of %s: removed %d temporary object file(s) of failed git writes", store.project_id, stale)
    return removed


def remove_temporary_objects(git_dirs, now=None):
    """The temporary files a git write that failed (a full disk, a kill) leaves in a git folder's objects
    (tmp_obj_*, tmp_pack_*, tmp_idx_*, incoming-* quarantines): no ref names them, and a partly written
    one can hold most of a large file. Only old ones, since a git command running now writes the same
    names. `git prune` would do this too, but would also prune commits only a recorded fork point names."""
    limit = (time.time() if now is None else now) - TEMP_OBJECT_AGE_SECONDS
    removed = 0
    for git_dir in git_dirs:
        objects = Path(git_dir) / "objects"
        candidates = [*objects.glob("tmp_*"), *objects.glob("??/tmp_*"), *objects.glob("pack/tmp_*"),
                      *objects.glob("incoming-*")]
        for path in candidates:
            try:
                if path.lstat().st_mtime >= limit:
                    continue
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed += 1
            except OSError as error:
                log.info("temporary object %s not removed: %s", path, error)
    return removed
