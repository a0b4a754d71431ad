"""The runner's files when nothing is bind-mounted (input.json `files: "controller"`, backend.kind swarm):
at start it fetches what it may read over the runner listener, after every tool call that may write and
at the end it sends its own artifacts folder's changes as one changeset, and before reading another
agent's file it fetches the current version. An agent with a working copy of the team's repository finds
its work tree in /workspace the same way; the workspace's changes go back as workspace changesets (also
before every repo.* call, so the controller commits the current files), and after repo.sync, which
changes the work tree on the controller, /workspace is fetched again. Standard library only, CPython >=
3.9; used by suzumio_runner_loop."""

import base64
import ctypes
import hashlib
import os
import stat

# Tools that never write a file: no changeset after them.
READ_ONLY_TOOLS = ("file.read", "web.fetch")
READ_ONLY_PREFIXES = ("messages.", "coordination.", "completion.")
PR_SET_NO_NEW_PRIVS = 38
TASK_ARTIFACTS = "/artifacts"  # how the controller names the artifacts root (the container layout)
TASK_WORKSPACE = "/workspace"  # how it names the working copy's files (suzumio_files.WORKSPACE)
# Never sent from the workspace: the controller refuses a `.git` path there (suzumio_files.GIT_FOLDER).
GIT_FOLDER = ".git"
REPO_PREFIX = "repo."  # the controller's tools on the agent's working copy: they read the current files
SYNC_TOOL = "repo.sync"  # changes the work tree on the controller
CHANGESET_ROUTE = "/runner/files/changeset"
WORKSPACE_CHANGESET_ROUTE = "/runner/files/workspace-changeset"


def forbid_new_privileges():
    """Set no_new_privs on this process (inherited by every tool it starts), where the container engine
    could not; False when the kernel call is unavailable."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def may_write(tool):
    return tool not in READ_ONLY_TOOLS and not tool.startswith(READ_ONLY_PREFIXES)


def scan(folder, skip=None):
    """{relative path: state} of a folder's files and links, links not followed, anything named `skip`
    left out; a file's state is (size, mtime_ns, inode), a link's its target."""
    found = {}
    for parent, dirs, names in os.walk(folder):
        dirs[:] = [name for name in dirs if name != skip]
        for name in list(dirs) + [name for name in names if name != skip]:
            full = os.path.join(parent, name)
            info = os.lstat(full)
            relative = os.path.relpath(full, folder).replace(os.sep, "/")
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("link", os.readlink(full))
            elif stat.S_ISREG(info.st_mode):
                found[relative] = ("file", info.st_size, info.st_mtime_ns, info.st_ino)
    return found


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class FileSync:
    """One activation's files exchanged with the controller (`client`: its ControllerClient)."""

    def __init__(self, client, artifacts_root, agent_id, controller_error, workspace=TASK_WORKSPACE):
        self.client = client
        self.controller_error = controller_error  # what client.post raises
        self.own = artifacts_root.rstrip("/") + "/" + agent_id
        self.artifacts_root = artifacts_root.rstrip("/")
        self.workspace = workspace.rstrip("/")
        self.working_copy = False  # the controller holds the agent's working copy: /workspace travels
        self.fetched = {}  # task path -> sha256 of what was fetched, for other agents' files
        self.known = {}
        self.workspace_known = {}

    def pull(self):
        """Fetch every readable file, then remember the own folder's (and a working copy's) state to diff
        against later."""
        os.makedirs(self.own, exist_ok=True)
        answer = self.client.post("/runner/files/list", {})
        self.working_copy = answer.get("workspace") == TASK_WORKSPACE
        entries = answer.get("files") or []
        for entry in entries:
            if not self.in_workspace(entry["path"]):
                self.fetch(entry["path"])
        self.known = scan(self.own)
        if self.working_copy:
            self.mirror_workspace(entries)

    def in_workspace(self, remote):
        return remote.startswith(TASK_WORKSPACE + "/")

    def mirror_workspace(self, entries):
        """Make /workspace what the controller's work tree is: fetch what differs, remove what it does not
        hold (a task of the agent still stopping may have left files here), then remember its state."""
        wanted = {entry["path"][len(TASK_WORKSPACE) + 1:]: entry.get("sha256")
                  for entry in entries if self.in_workspace(entry["path"])}
        os.makedirs(self.workspace, exist_ok=True)
        here = scan(self.workspace, skip=GIT_FOLDER)
        for relative in sorted(set(here) - set(wanted)):
            os.unlink(os.path.join(self.workspace, relative))
        for relative, digest in sorted(wanted.items()):
            if here.get(relative, ("link",))[0] != "file" or file_sha256(
                    os.path.join(self.workspace, relative)) != digest:
                self.fetch(TASK_WORKSPACE + "/" + relative)
        self.workspace_known = scan(self.workspace, skip=GIT_FOLDER)

    def local(self, path):
        """Where a file the controller names lives here (the artifacts root and the workspace may sit
        elsewhere)."""
        if path == TASK_ARTIFACTS or path.startswith(TASK_ARTIFACTS + "/"):
            return self.artifacts_root + path[len(TASK_ARTIFACTS):]
        if path == TASK_WORKSPACE or path.startswith(TASK_WORKSPACE + "/"):
            return self.workspace + path[len(TASK_WORKSPACE):]
        return path

    def remote(self, path):
        if path == self.artifacts_root or path.startswith(self.artifacts_root + "/"):
            return TASK_ARTIFACTS + path[len(self.artifacts_root):]
        return path

    def before(self, tool, args):
        """Before a tool runs: reading another agent's file reads its current version, a shell command
        sees the others' files as they are now, and a repo.* call finds the controller's work tree holding
        the current files (it commits them)."""
        if tool == "file.read" and isinstance(args, dict) and isinstance(args.get("path"), str):
            path = args["path"]
            self.refresh(path if path.startswith("/") else os.path.join(self.workspace, path))
        elif tool == "shell.exec":
            self.refresh_others()
        elif tool.startswith(REPO_PREFIX) and self.working_copy:
            self.push()

    def after(self, tool):
        """After a tool: send what it may have written. repo.sync changed the work tree on the controller
        (the current files were sent before it ran): fetch it first, or the next push would send the old
        files back over the merge."""
        if tool == SYNC_TOOL and self.working_copy:
            answer = self.client.post("/runner/files/list", {})
            self.mirror_workspace(answer.get("files") or [])
        if may_write(tool):
            self.push()

    def fetch(self, remote):
        """Write the controller's current version of one file where it lives here; False when it has none."""
        path = self.local(remote)
        try:
            answer = self.client.post("/runner/files/read", {"path": remote})
        except self.controller_error as error:
            if error.status == 404:
                return False
            raise
        data = base64.b64decode(answer["data"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = path + ".suzumio-fetch"
        with open(temp, "wb") as handle:
            handle.write(data)
        os.chmod(temp, 0o755 if answer.get("mode", 0) & 0o111 else 0o644)
        os.replace(temp, path)
        self.fetched[remote] = answer.get("sha256")
        return True

    def refresh(self, path):
        """Before another agent's file is read: fetch its current version (a path outside the other
        agents' folders is left alone)."""
        if not isinstance(path, str) or not path.startswith(self.artifacts_root + "/"):
            return
        path = os.path.normpath(path)
        if path == self.own or path.startswith(self.own + "/"):
            return
        if os.path.isdir(path):
            self.refresh_others()
        elif not self.fetch(self.remote(path)) and os.path.lexists(path):
            os.unlink(path)  # gone on the controller

    def refresh_others(self):
        """Fetch the other agents' files that changed since they were fetched."""
        answer = self.client.post("/runner/files/list", {})
        for entry in answer.get("files") or []:
            path = entry["path"]
            local = self.local(path)
            other = local.startswith(self.artifacts_root + "/") and not local.startswith(self.own + "/")
            if other and self.fetched.get(path) != entry.get("sha256"):
                self.fetch(path)

    def push(self):
        """Send what changed in the own artifacts folder since the last push as one changeset, and what
        changed in a working copy's /workspace as another; each state is remembered only once the
        controller applied it, so a refused one is sent again. Both are tried before a refusal is raised.
        Returns the count of changes sent."""
        sent, refused = 0, None
        try:
            self.known, count = self.send(self.own, self.known, CHANGESET_ROUTE)
            sent += count
        except self.controller_error as error:
            refused = error
        if self.working_copy:
            self.workspace_known, count = self.send(self.workspace, self.workspace_known, WORKSPACE_CHANGESET_ROUTE,
                                                    GIT_FOLDER)
            sent += count
        if refused is not None:
            raise refused
        return sent

    def send(self, folder, known, route, skip=None):
        """(the folder's state now, count of changes) once its changes since `known` were applied."""
        now = scan(folder, skip)
        changes = []
        for relative, state in sorted(now.items()):
            if known.get(relative) == state:
                continue
            full = os.path.join(folder, relative)
            if state[0] == "link":
                changes.append({"path": relative, "link": state[1]})
            else:
                with open(full, "rb") as handle:
                    data = handle.read()
                changes.append({"path": relative, "data": base64.b64encode(data).decode("ascii"),
                                "mode": stat.S_IMODE(os.lstat(full).st_mode),
                                "sha256": hashlib.sha256(data).hexdigest()})
        changes += [{"path": relative, "delete": True} for relative in sorted(set(known) - set(now))]
        if changes:
            self.client.post(route, {"changes": changes})
        return now, len(changes)
