"""The flight recorder (docs/replay.md): what the controller keeps so a run can be replayed, forked and
diffed. Each model exchange the proxy forwarded is a row (suzumio_store_recorder); after each activation
the agent's artifact folder is compared with its recorded state and what changed is recorded, the file
contents stored once per digest under `<project>/recordings/blobs/`."""
import hashlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

RECORDINGS_DIR = "recordings"
BLOBS_DIR = "blobs"


def blobs_root(store):
    return store.dir / RECORDINGS_DIR / BLOBS_DIR


def blob_path(store, digest):
    """Where the blob of `digest` (sha256 hex) lives: fanned out by its first two characters."""
    return blobs_root(store) / digest[:2] / digest


def digest_of(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def folder_files(folder):
    """{relative posix path: absolute Path} of the regular files under `folder`; symlinks are not followed
    (an agent's link could name any file of the host)."""
    files = {}
    if not folder.is_dir():
        return files
    for directory, subdirs, names in os.walk(folder, followlinks=False):
        subdirs.sort()
        for name in sorted(names):
            path = Path(directory) / name
            if path.is_symlink() or not path.is_file():
                continue
            files[path.relative_to(folder).as_posix()] = path
    return files


def store_blob(store, digest, data):
    """Write `data` into the blob store unless its digest is there; returns the bytes written."""
    target = blob_path(store, digest)
    if target.exists():
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{digest}.{os.getpid()}.tmp")
    temp.write_bytes(data)
    os.replace(temp, target)  # a blob is whole or absent
    return len(data)


def record_artifacts(store, activation_id, agent_id, keep_activations=None):
    """Record what changed in `agent_id`'s artifact folder since its last recorded state, as versions of
    `activation_id` (once per activation), then apply the retention bound. Returns the changes."""
    recorded = store.artifact_state(agent_id) or {}
    current = folder_files(store.artifacts_dir(agent_id))
    changes, stored = [], 0
    for relative, path in current.items():
        try:
            data = path.read_bytes()  # one read: the digest always names the bytes stored
        except OSError as error:  # removed between the walk and the read: it is not there
            log.info("artifact %s of %s vanished while recorded: %s", relative, activation_id, error)
            current[relative] = None
            continue
        digest = hashlib.sha256(data).hexdigest()
        if recorded.get(relative, (None,))[0] == digest:
            continue
        stored += store_blob(store, digest, data)
        changes.append((relative, digest, len(data)))
    changes += [(relative, None, 0) for relative in recorded if current.get(relative) is None]
    if not store.record_artifact_versions(activation_id, agent_id, changes, stored):
        return []
    if keep_activations is not None and store.prune_recordings(keep_activations):
        remove_unnamed_blobs(store)
    return changes


def record_ended(store, config, activation_id):
    """An activation ended (its output arrived, or its runner is gone): record its agent's artifacts when
    the project records (`config`: its ProjectConfig). A failure is logged, never raised: an activation's
    outcome does not depend on its recording."""
    if not config.recording.enabled:
        return
    try:
        record_artifacts(store, activation_id, store.activation(activation_id)["agentId"],
                         config.recording.keep_activations)
    except OSError as error:
        log.warning("artifacts of activation %s not recorded: %s", activation_id, error)


def remove_unnamed_blobs(store):
    """Delete the blobs no artifact version names any more (after retention pruned versions)."""
    named = store.recorded_digests()
    root = blobs_root(store)
    if not root.is_dir():
        return
    for fan in root.iterdir():
        for blob in fan.iterdir():
            if blob.name not in named and not blob.name.startswith("."):
                blob.unlink(missing_ok=True)


def read_blob(store, digest):
    return blob_path(store, digest).read_bytes()


def recording_bytes(store):
    """Bytes the recordings take: the blobs on disk (the rows live in the project database)."""
    root = blobs_root(store)
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0
