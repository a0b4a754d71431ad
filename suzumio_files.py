"""Files through the controller, for runners that get no bind mount (backend.kind swarm): what an
activation may read (every agent's artifacts folder, its agent's mounts, and the work tree of its agent's
working copy as /workspace), listed and read by the path the task sees, and the changesets it sends back,
applied only inside its own agent's artifacts folder or its own agent's work tree. Imported by
suzumio_runner_support; the runner's side is suzumio_runner_files."""
import base64
import hashlib
import os
import posixpath
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from suzumio_backend import folder_bytes, format_size
from suzumio_config import normalize_mount_target
from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound

MAX_FILE_BYTES = 64 * 2**20  # one file in one answer: bigger ones belong in a mount, not an artifact
MAX_CHANGES = 10_000
ARTIFACTS = "/artifacts"
WORKSPACE = "/workspace"  # where a task finds its agent's working copy (docs/teams-that-write-code.md)
# Never listed, read or written in a work tree: its git folder lies beside it, and a `.git` an agent makes
# there is not followed by the controller (the runner skips it too: suzumio_runner_files.GIT_FOLDER).
GIT_FOLDER = ".git"
ARTIFACTS_NAME = "artifacts folder"
WORKSPACE_NAME = "workspace"


def work_tree(store, config, agent_id):
    """The work tree of the agent's working copy (the controller made it at the activation's start), or
    None when the agent has none: then its /workspace stays the task's own."""
    repository = config.repository
    if repository is None or not repository.has_agent(agent_id):
        return None
    return Path(store.workspace(agent_id))


def readable_roots(store, config, agent_id):
    """[(task path, host path, read-only)] of what an activation of `agent_id` may read: every agent's
    artifacts folder (only its own writable), then the agent's mounts."""
    roots = [(f"{ARTIFACTS}/{other}", Path(store.artifacts_dir(other)), other != agent_id)
             for other in store.agent_ids()]
    tree = work_tree(store, config, agent_id)
    if tree is not None:
        roots.append((WORKSPACE, tree, False))
    for mount in config.mounts_for(agent_id):
        roots.append((normalize_mount_target(mount.target).rstrip("/") or "/", Path(mount.source), True))
    return roots


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(task_path, host):
    info = os.lstat(host)
    return {"path": task_path, "size": info.st_size, "mode": stat.S_IMODE(info.st_mode), "sha256": file_digest(host)}


def listing(store, config, agent_id):
    """The regular files under every readable root, by task path, with size, mode and SHA-256. Symbolic
    links are not followed: one could lead anywhere on the controller's machine."""
    files = []
    for task_root, host_root, _ in readable_roots(store, config, agent_id):
        if host_root.is_symlink() or not host_root.exists():
            continue
        if host_root.is_file():
            files.append(_entry(task_root, host_root))
            continue
        for parent, dirs, names in os.walk(host_root):
            dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(parent, d))
                             and not (task_root == WORKSPACE and d == GIT_FOLDER))
            relative = os.path.relpath(parent, host_root)
            for name in sorted(names):
                host = os.path.join(parent, name)
                if (task_root == WORKSPACE and name == GIT_FOLDER) or not stat.S_ISREG(os.lstat(host).st_mode):
                    continue
                task = posixpath.join(task_root, name) if relative == "." else posixpath.join(
                    task_root, relative.replace(os.sep, "/"), name)
                files.append(_entry(task, host))
    return files


def read_file(store, config, agent_id, task_path):
    """{path, mode, sha256, data (base64)} of one readable file as it is now."""
    if not isinstance(task_path, str) or not task_path.startswith("/") or posixpath.normpath(task_path) != task_path:
        raise BadRequest("path must be an absolute, normalized path")
    for task_root, host_root, _ in readable_roots(store, config, agent_id):
        if task_path != task_root and not task_path.startswith(task_root.rstrip("/") + "/"):
            continue
        relative = task_path[len(task_root):].lstrip("/")
        if task_root == WORKSPACE and GIT_FOLDER in relative.split("/"):
            raise NotFound(f"No such file: {task_path} (a {GIT_FOLDER} folder is not read)")
        host = host_root / relative if relative else host_root
        real_root = os.path.realpath(host_root)
        real = os.path.realpath(host)
        if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
            raise BadRequest(f"{task_path} leads out of {task_root}")
        try:
            info = os.stat(real)
        except FileNotFoundError:
            raise NotFound(f"No such file: {task_path}") from None
        if not stat.S_ISREG(info.st_mode):
            raise BadRequest(f"Not a regular file: {task_path}")
        if info.st_size > MAX_FILE_BYTES:
            raise BadRequest(f"{task_path} is larger than {format_size(MAX_FILE_BYTES)}")
        data = Path(real).read_bytes()
        return {"path": task_path, "mode": stat.S_IMODE(info.st_mode), "sha256": hashlib.sha256(data).hexdigest(),
                "data": base64.b64encode(data).decode("ascii")}
    raise NotFound(f"{task_path} is not readable by this activation (readable: {ARTIFACTS}/<agent>, the "
                   f"agent's mounts and, with a working copy, {WORKSPACE})")


# ---------------------------------------------------------------- changesets

def checked_path(value, where, name=ARTIFACTS_NAME):
    """A changeset path: relative, '/'-separated, no empty, '.' or '..' part, no NUL (in a workspace, no
    `.git` part either); its parts."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}.path must be a non-empty string")
    if value.startswith("/") or "\\" in value or "\0" in value:
        raise BadRequest(f"{where}.path must be relative to the agent's {name}: {value}")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise BadRequest(f"{where}.path must not contain empty, '.' or '..' parts: {value}")
    if name == WORKSPACE_NAME and GIT_FOLDER in parts:
        raise BadRequest(f"{where}.path must not contain a {GIT_FOLDER} part: {value} (the working copy's "
                         "git folder is the controller's)")
    return parts


def checked_changes(changes, name=ARTIFACTS_NAME):
    """[(parts, kind, payload)] of a changeset body: kind `file` (bytes, mode), `link` (target) or
    `delete`. Every entry is checked before anything is written; `name` says which folder it is for."""
    if not isinstance(changes, list) or not changes:
        raise BadRequest("changes must be a non-empty array")
    if len(changes) > MAX_CHANGES:
        raise BadRequest(f"changes holds more than {MAX_CHANGES} entries")
    checked, seen = [], set()
    for index, change in enumerate(changes):
        where = f"changes.{index}"
        if not isinstance(change, dict):
            raise BadRequest(f"{where} must be an object")
        parts = checked_path(change.get("path"), where, name)
        if change["path"] in seen:
            raise BadRequest(f"{where}.path appears twice: {change['path']}")
        seen.add(change["path"])
        if change.get("delete") is True:
            checked.append((parts, "delete", None))
        elif "link" in change:
            target = change["link"]
            if not isinstance(target, str) or not target or target.startswith("/") or "\0" in target:
                raise BadRequest(f"{where}: symbolic link {change['path']} must have a relative target")
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(change["path"]), target))
            if resolved == ".." or resolved.startswith("../"):
                raise BadRequest(f"{where}: symbolic link {change['path']} -> {target} leads out of the {name}")
            checked.append((parts, "link", target))
        elif isinstance(change.get("data"), str):
            try:
                data = base64.b64decode(change["data"], validate=True)
            except ValueError:
                raise BadRequest(f"{where}.data must be base64") from None
            if "sha256" in change and change["sha256"] != hashlib.sha256(data).hexdigest():
                raise BadRequest(f"{where}.sha256 does not match its data")
            mode = change.get("mode", 0o644)
            if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
                raise BadRequest(f"{where}.mode must be a file mode")
            checked.append((parts, "file", (data, 0o755 if mode & 0o111 else 0o644)))
        else:
            raise BadRequest(f"{where} needs data (base64), link or delete: true")
    return checked


def _inside(folder, parts, name):
    """The host path of `parts` under `folder`, refusing any existing parent that is not a real folder
    (a symbolic link there would lead out of it)."""
    current = folder
    for index, part in enumerate(parts[:-1]):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode):
            raise BadRequest(f"{'/'.join(parts)} leads out of the {name} through the symbolic link "
                             f"{'/'.join(parts[:index + 1])}")
        if not stat.S_ISDIR(info.st_mode):
            raise BadRequest(f"{'/'.join(parts)}: {'/'.join(parts[:index + 1])} is not a folder")
    return current / parts[-1]


def _size(path, name):
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return 0
    if stat.S_ISDIR(info.st_mode):
        raise BadRequest(f"{path.name} is a folder in the {name}; a change cannot replace it")
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


class Changesets:
    """Applies changesets to agents' artifacts folders and work trees, one at a time per folder."""

    def __init__(self):
        self._locks = {}
        self._guard = threading.Lock()

    def _lock(self, folder):
        with self._guard:
            return self._locks.setdefault(str(folder), threading.Lock())

    def apply(self, store, agent_id, changes, quota):
        """Check every change, then write them: each file staged beside the project's folders and renamed
        into place, deletions last. Nothing is written when a check fails, the quota (bytes, or None)
        included. Returns {written, deleted, usedBytes}."""
        return self._apply(store, Path(store.artifacts_dir(agent_id)), changes, quota, ARTIFACTS_NAME)

    def apply_workspace(self, store, config, agent_id, changes):
        """A changeset of the agent's /workspace, applied as apply does to the work tree of its own working
        copy only (never its git folder, never another agent's): the controller commits it to the agent's
        branch alone. Forbidden for an agent without a working copy. Returns {written, deleted}."""
        folder = work_tree(store, config, agent_id)
        if folder is None:
            raise Forbidden(f"{agent_id} has no working copy of the repository (repository.agents): its "
                            f"{WORKSPACE} is its task's own")
        result = self._apply(store, folder, changes, None, WORKSPACE_NAME)
        return {"written": result["written"], "deleted": result["deleted"]}

    def _apply(self, store, folder, changes, quota, name):
        checked = checked_changes(changes, name)
        folder.mkdir(parents=True, exist_ok=True)
        with self._lock(folder):
            targets = [(_inside(folder, parts, name), kind, payload) for parts, kind, payload in checked]
            # Only a quota needs the folder's size: a work tree of thousands of files is not walked for none.
            used = folder_bytes(folder) if quota is not None else 0
            after = used + sum((len(payload[0]) if kind == "file" else 0) - _size(path, name)
                               for path, kind, payload in targets)
            if quota is not None and after > quota:
                raise Conflict(f"artifact quota exceeded ({format_size(after)} of {format_size(quota)})")
            staging = Path(tempfile.mkdtemp(prefix=".changeset-", dir=store.dir))
            try:
                staged = []
                for index, (path, kind, payload) in enumerate(targets):
                    temp = staging / str(index)
                    if kind == "file":
                        temp.write_bytes(payload[0])
                        os.chmod(temp, payload[1])
                    elif kind == "link":
                        os.symlink(payload, temp)
                    staged.append((path, kind, temp))
                for path, kind, temp in staged:
                    if kind == "delete":
                        continue
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(temp, path)
                deleted = 0
                for path, kind, _ in staged:
                    if kind == "delete" and (path.is_symlink() or path.exists()):
                        path.unlink()
                        deleted += 1
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return {"written": sum(kind != "delete" for _, kind, _ in targets), "deleted": deleted,
                    "usedBytes": after}
