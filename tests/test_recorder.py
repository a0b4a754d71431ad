"""The flight recorder's artifact versions on a real store (suzumio_recorder, suzumio_store_recorder):
what changed after each activation, contents stored once per digest, deletions, once per activation, and
the retention bound that keeps the folder state at its cut whole."""
import hashlib

from store_fixtures import at, init_demo

import suzumio_coordination as coordination
import suzumio_recorder as recorder


def activation(store, agent_id, seconds):
    act = coordination.start_activation(store, agent_id, "Work.", [], now=at(seconds))
    return act["id"]


def blobs(store):
    root = recorder.blobs_root(store)
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()


def test_versions_record_what_changed_and_store_each_content_once(tmp_path):
    _, store = init_demo(tmp_path / "root")
    folder = store.artifacts_dir("worker")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "a.md").write_text("same")
    (folder / "sub").mkdir()
    (folder / "sub" / "b.md").write_text("same")  # another path, the same bytes: one blob
    first = activation(store, "worker", 1)
    changes = recorder.record_artifacts(store, first, "worker")
    assert sorted(changes) == [("a.md", digest("same"), 4), ("sub/b.md", digest("same"), 4)]
    assert blobs(store) == [digest("same")]
    assert store.artifact_snapshot(first)["bytes"] == 4
    coordination.fail_activation(store, first, "ended", now=at(2))

    (folder / "a.md").write_text("changed")
    (folder / "sub" / "b.md").unlink()
    second = activation(store, "worker", 3)
    assert sorted(recorder.record_artifacts(store, second, "worker")) == [
        ("a.md", digest("changed"), 7), ("sub/b.md", None, 0)]
    # once per activation: its output and its runner's exit both ask
    assert recorder.record_artifacts(store, second, "worker") == []
    coordination.fail_activation(store, second, "ended", now=at(4))

    third = activation(store, "worker", 5)
    assert recorder.record_artifacts(store, third, "worker") == []  # nothing changed: no version
    assert store.artifact_snapshot(third) == {"changes": 0, "bytes": 0, "createdAt": store.artifact_snapshot(
        third)["createdAt"]}
    assert store.artifact_state("worker", first) == {"a.md": (digest("same"), 4), "sub/b.md": (digest("same"), 4)}
    assert store.artifact_state("worker", second) == {"a.md": (digest("changed"), 7)}
    assert store.artifact_state("worker") == {"a.md": (digest("changed"), 7)}
    assert store.artifact_state("worker", "act_never_recorded") is None
    assert recorder.read_blob(store, digest("same")) == b"same"


def test_a_symlink_in_the_folder_is_not_followed(tmp_path):
    _, store = init_demo(tmp_path / "root")
    secret = tmp_path / "host-secret"
    secret.write_text("do not copy")
    folder = store.artifacts_dir("worker")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "link").symlink_to(secret)
    (folder / "real.md").write_text("kept")
    act = activation(store, "worker", 1)
    assert [c[0] for c in recorder.record_artifacts(store, act, "worker")] == ["real.md"]
    assert blobs(store) == [digest("kept")]


def test_retention_keeps_the_newest_activations_and_the_state_at_the_cut(tmp_path):
    _, store = init_demo(tmp_path / "root")
    folder = store.artifacts_dir("worker")
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for number in range(4):
        (folder / "notes.md").write_text(f"version {number}")
        if number == 1:
            (folder / "gone.md").write_text("short-lived")
        if number == 2:
            (folder / "gone.md").unlink()
        act = activation(store, "worker", 10 * number)
        store.record_exchange(act, "worker", "fake", "main", {"n": number}, status=200, headers={},
                              answer="{}", overflow=False, usage={}, retries=0, error=None,
                              started_at=at(10 * number), duration_ms=1)
        recorder.record_artifacts(store, act, "worker", keep_activations=2)
        coordination.fail_activation(store, act, "ended", now=at(10 * number + 1))
        ids.append(act)
    # the two newest keep everything; the state after the older ones is folded into the cut
    assert [x["request"] for x in store.exchanges()] == [{"n": 2}, {"n": 3}]
    assert {v["activationId"] for v in store.artifact_versions()} <= set(ids)
    assert store.artifact_state("worker", ids[3]) == {"notes.md": (digest("version 3"), 9)}
    assert store.artifact_state("worker", ids[2]) == {"notes.md": (digest("version 2"), 9)}
    assert store.artifact_state("worker", ids[0]) is None  # pruned: no longer restorable
    assert blobs(store) == sorted([digest("version 2"), digest("version 3")])


def test_exchanges_are_indexed_in_order_per_activation(tmp_path):
    _, store = init_demo(tmp_path / "root")
    act = activation(store, "worker", 1)
    other = activation(store, "pm", 1)
    for number, target in enumerate([act, other, act]):
        store.record_exchange(target, "worker" if target == act else "pm", "fake", "main", {"n": number},
                              status=200, headers={"retry-after": "1"}, answer='{"ok": true}', overflow=False,
                              usage={"input": 3}, retries=number, error=None, started_at=at(1), duration_ms=5)
    rows = store.exchanges(act)
    assert [(r["index"], r["request"], r["retries"]) for r in rows] == [(0, {"n": 0}, 0), (1, {"n": 2}, 2)]
    assert rows[0]["headers"] == {"retry-after": "1"} and rows[0]["usage"] == {"input": 3}
    assert [r["index"] for r in store.exchanges(other)] == [0]
