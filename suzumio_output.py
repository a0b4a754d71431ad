"""A team's output as people read it (docs/cli.md, docs/http-api.md): the final report, every agent's
artifact files with the versions the flight recorder holds of each, one version's bytes and two versions
compared. The user API (suzumio_api) and the CLI (suzumio.py) both answer from here."""
import difflib
import hashlib
import os
from pathlib import Path

import suzumio_recorder
from suzumio_errors import BadRequest, NotFound

DIFF_CONTEXT = 3


def report(store):
    """{"report": the last submitted report's text or None, "status": the project's status}."""
    project = store.project()
    path = project["submitted_report"]
    # A report file gone from a submitted project is damage to the root, not "no report": it raises.
    text = Path(path).read_text(encoding="utf-8") if path else None
    return {"report": text, "status": project["status"]}


def split_path(store, path):
    """(agent, path inside its artifacts folder) of `<agent>/<path>`; BadRequest for anything that could
    leave the folder (absolute, `.` or `..` parts, empty parts, NUL), NotFound for an unknown agent."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\x00" in path:
        raise BadRequest(f"Invalid artifact path: {path!r} (expected <agent>/<path inside its folder>)")
    parts = path.split("/")
    if len(parts) < 2 or any(part in ("", ".", "..") for part in parts):
        raise BadRequest(f"Invalid artifact path: {path!r} (expected <agent>/<path inside its folder>)")
    agent = parts[0]
    store.require_agent(agent)
    return agent, "/".join(parts[1:])


def recorded_versions(store, agent, relative):
    """The versions the flight recorder holds of one file, oldest first: [{version (1, 2, …), digest,
    size, activationId, createdAt}]; a recorded deletion is no version."""
    rows = [row for row in store.artifact_versions() if row["agentId"] == agent and row["path"] == relative
            and row["digest"] is not None]
    return [{"version": index, "digest": row["digest"], "size": row["size"], "activationId": row["activationId"],
             "createdAt": row["createdAt"]} for index, row in enumerate(rows, 1)]


def current_file(store, agent, relative):
    """The regular file of an agent's artifacts folder now, or None: symbolic links on the way are never
    followed (an agent's link could name any file of the host)."""
    folder = store.artifacts_dir(agent)
    if folder.is_symlink():
        return None
    path = folder
    for part in relative.split("/"):
        path = path / part
        if path.is_symlink():
            return None
    return path if path.is_file() else None


def artifact_files(store):
    """Every agent's artifact files now: [{agent, path, size, versions}], sorted; `versions` counts the
    recorded versions of that path."""
    counts = {}
    for row in store.artifact_versions():
        if row["digest"] is not None:
            key = (row["agentId"], row["path"])
            counts[key] = counts.get(key, 0) + 1
    files = []
    for agent in store.list_agents():
        folder = store.artifacts_dir(agent["id"])
        if folder.is_symlink():
            continue
        for relative, path in suzumio_recorder.folder_files(folder).items():
            try:
                size = path.stat(follow_symlinks=False).st_size
            except OSError:  # removed while listed
                continue
            files.append({"agent": agent["id"], "path": relative, "size": size,
                          "versions": counts.get((agent["id"], relative), 0)})
    return sorted(files, key=lambda item: (item["agent"], item["path"]))


def version_number(value, name="version"):
    """A version query value: a positive integer, else BadRequest."""
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise BadRequest(f"{name} must be a positive integer, got {value!r}")
    return int(text)


def artifact(store, path, version=None):
    """One artifact file: {agent, path, version, versions, size, data (bytes)}. Without `version`, the
    file as it is now (`version` then names the recorded version with the same bytes, or None);
    NotFound for a file that is not there or a version the recorder does not hold."""
    agent, relative = split_path(store, path)
    versions = recorded_versions(store, agent, relative)
    if version is None:
        current = current_file(store, agent, relative)
        if current is None:
            raise NotFound(f"Unknown artifact: {path}")
        data = current.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        number = next((v["version"] for v in reversed(versions) if v["digest"] == digest), None)
    else:
        if not versions:
            raise NotFound(f"No recorded versions of {path}")
        if version > len(versions):
            raise NotFound(f"Unknown version {version} of {path} (it has {len(versions)})")
        number = version
        try:
            data = suzumio_recorder.read_blob(store, versions[version - 1]["digest"])
        except FileNotFoundError:
            raise NotFound(f"Version {version} of {path} is no longer stored") from None
    return {"agent": agent, "path": path, "version": number, "versions": len(versions), "size": len(data),
            "data": data}


def as_text(data):
    """The bytes as UTF-8 text, or None when they are not text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\x00" in text else text


def artifact_json(found):
    """An artifact() answer as JSON: `content` the text, or None with `binary: true`."""
    text = as_text(found["data"])
    answer = {key: found[key] for key in ("agent", "path", "version", "versions", "size")}
    answer.update(content=text, binary=text is None)
    return answer


def artifact_diff(store, path, old, new=None):
    """A unified diff of version `old` against version `new` (None: the file as it is now):
    {path, from, to, diff}; BadRequest when either side is not text."""
    before = artifact(store, path, old)
    after = artifact(store, path, new)
    texts = [as_text(side["data"]) for side in (before, after)]
    if None in texts:
        raise BadRequest(f"{path} is not text; compare its versions with ?raw=1 downloads")
    label_new = f"b/{path}@{new}" if new is not None else f"b/{path}"
    lines = difflib.unified_diff(texts[0].splitlines(keepends=True), texts[1].splitlines(keepends=True),
                                 f"a/{path}@{old}", label_new, n=DIFF_CONTEXT)
    diff = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return {"path": path, "from": old, "to": new, "diff": diff}


def download_name(path):
    """The file name a raw download is saved under."""
    return os.path.basename(path) or "artifact"
