"""The runner's files when nothing is bind-mounted (input.json `files: "controller"`, backend.kind swarm):
at start it fetches what it may read over the runner listener, after every tool call that may write and
at the end it sends its own artifacts folder's changes as one changeset, and before reading another
agent's file it fetches the current version. Standard library only, CPython >= 3.9; used by
suzumio_runner_loop."""

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


def scan(folder):
    """{relative path: state} of a folder's files and links, links not followed; a file's state is
    (size, mtime_ns, inode), a link's its target."""
    found = {}
    for parent, dirs, names in os.walk(folder):
        for name in list(dirs) + names:
            full = os.path.join(parent, name)
            info = os.lstat(full)
            relative = os.path.relpath(full, folder).replace(os.sep, "/")
            if stat.S_ISLNK(info.st_mode):
                found[relative] = ("link", os.readlink(full))
            elif stat.S_ISREG(info.st_mode):
                found[relative] = ("file", info.st_size, info.st_mtime_ns, info.st_ino)
    return found


class FileSync:
    """One activation's files exchanged with the controller (`client`: its ControllerClient)."""

    def __init__(self, client, artifacts_root, agent_id, controller_error):
        self.client = client
        self.controller_error = controller_error  # what client.post raises
        self.own = artifacts_root.rstrip("/") + "/" + agent_id
        self.artifacts_root = artifacts_root.rstrip("/")
        self.fetched = {}  # task path -> sha256 of what was fetched, for other agents' files
        self.known = {}

    def pull(self):
        """Fetch every readable file, then remember the own folder's state to diff against later."""
        os.makedirs(self.own, exist_ok=True)
        answer = self.client.post("/runner/files/list", {})
        for entry in answer.get("files") or []:
            self.fetch(entry["path"])
        self.known = scan(self.own)

    def local(self, path):
        """Where a file the controller names lives here (the artifacts root may sit elsewhere)."""
        if path == TASK_ARTIFACTS or path.startswith(TASK_ARTIFACTS + "/"):
            return self.artifacts_root + path[len(TASK_ARTIFACTS):]
        return path

    def remote(self, path):
        if path == self.artifacts_root or path.startswith(self.artifacts_root + "/"):
            return TASK_ARTIFACTS + path[len(self.artifacts_root):]
        return path

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
        """Send what changed in the own artifacts folder since the last push as one changeset; the
        state is remembered only once the controller applied it, so a refused one is sent again."""
        now = scan(self.own)
        changes = []
        for relative, state in sorted(now.items()):
            if self.known.get(relative) == state:
                continue
            full = os.path.join(self.own, relative)
            if state[0] == "link":
                changes.append({"path": relative, "link": state[1]})
            else:
                with open(full, "rb") as handle:
                    data = handle.read()
                changes.append({"path": relative, "data": base64.b64encode(data).decode("ascii"),
                                "mode": stat.S_IMODE(os.lstat(full).st_mode),
                                "sha256": hashlib.sha256(data).hexdigest()})
        changes += [{"path": relative, "delete": True} for relative in sorted(set(self.known) - set(now))]
        if changes:
            self.client.post("/runner/files/changeset", {"changes": changes})
        self.known = now
        return len(changes)
