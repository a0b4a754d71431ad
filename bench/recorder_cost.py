"""The flight recorder's cost (docs/replay.md): activation time with recording on and off, measured side by
side in one run on the real controller (both listeners on Waitress, the runner socket), the real runner
on the `local` backend and the FakeModel, and the bytes each recorded activation adds. Two projects
differ only in `recording.enabled`; their activations alternate. Each activation makes two model calls
(a `file.write` of a 2 KiB note into its artifact folder, which already holds 40 files of 4 KiB, then
`coordination.wait_for_signal`); its time is from its start to its completion as the store records them.
The recorder's own calls (recording the exchanges and the folder) are also timed in the
process. Target: recording on <= 1.05x of off.
Usage: .venv/bin/python bench/recorder_cost.py [--runs 15] [--json]"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import yaml
from api_fixtures import init_project, serving
from conftest import wait_until
from e2e_fixtures import call, project_config
from fake_model import FakeModel

import suzumio_recorder
import suzumio_runner_support as runner_support
import suzumio_store
from suzumio_records import parse_ts

SEED_FILES = 40
FILE_BYTES = 4096
SPENT = {}  # seconds spent in the recorder's own calls, per activation id


def timing(function, activation_of):
    """Wrap a recorder call so the seconds it takes are added to its activation's total."""
    def wrapped(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            key = activation_of(*args)
            SPENT[key] = SPENT.get(key, 0.0) + time.perf_counter() - started
    return wrapped


def measure_recorder_calls():
    suzumio_recorder.record_ended = timing(suzumio_recorder.record_ended, lambda store, config, act: act)
    runner_support.suzumio_recorder = suzumio_recorder
    store_class = suzumio_store.ProjectStore
    store_class.record_exchange = timing(store_class.record_exchange, lambda self, act, *rest: act)


def make_project(service, model, name, tmp, enabled):
    config = project_config("local", None, model.base_url,
                            agents={"worker": {"model": "worker", "tools": ["file.*", "coordination.wait_for_signal"]}},
                            presets={"worker": {"provider": "fake", "model": name}}, model="worker",
                            extra={"name": name, "recording": {"enabled": enabled}})
    store = init_project(service.root, tmp / name, yaml.safe_dump(config, sort_keys=False))
    folder = store.artifacts_dir("worker")
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(SEED_FILES):
        (folder / f"seed-{number:02d}.txt").write_bytes(bytes([65 + number % 26]) * FILE_BYTES)
    store.start()
    return store


def one_activation(service, model, store, number):
    """Run one activation of `worker`; its duration in seconds (started to completed)."""
    name = store.project_id
    path = store.artifacts_dir("worker") / f"note-{number:03d}.md"
    model.enqueue(tool_calls=[call("file.write", path=str(path), content=f"{number} " * (FILE_BYTES // 4))],
                  model=name, usage=(100, 10, 110))
    model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Done.")], model=name,
                  usage=(100, 10, 110))
    response = service.post(f"/api/projects/{name}/messages", {"recipient": "worker", "body": f"Note {number}."})
    assert response.status_code == 200, response.text

    def ended():
        rows = [store.activation(a["id"]) for a in store.list_activations(1000)]
        return rows if len(rows) > number and all(a["status"] != "running" for a in rows) else None

    rows = wait_until(ended, 60, message=f"activation {number} of {name}")
    latest = max(rows, key=lambda a: a["startedAt"])
    assert latest["status"] == "completed", latest
    return (parse_ts(latest["completedAt"]) - parse_ts(latest["startedAt"])).total_seconds(), latest["id"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = benchlib.Results("recorder_cost")
    measure_recorder_calls()
    model = FakeModel()
    with tempfile.TemporaryDirectory() as tmp, serving(Path(tmp) / "root") as service:
        on = make_project(service, model, "rec-on", Path(tmp), True)
        off = make_project(service, model, "rec-off", Path(tmp), False)
        times = {"rec-on": [], "rec-off": []}
        recorded = []
        for number in range(args.runs + 1):  # the first pair warms both up and is not counted
            for store in (on, off) if number % 2 else (off, on):
                seconds, activation_id = one_activation(service, model, store, number)
                if number:
                    times[store.project_id].append(seconds)
                if store is on:
                    recorded.append(activation_id)
        wait_until(lambda: all(on.artifact_snapshot(a) for a in recorded), 30, message="recorded snapshots")
        exchange_bytes = [on.exchange_bytes(a) for a in recorded]
        blob_bytes = suzumio_recorder.recording_bytes(on)
        snapshot_bytes = [on.artifact_snapshot(a)["bytes"] for a in recorded]
        results.add("local: activation, recording on (vs off)", benchlib.median(times["rec-on"]), "s",
                    benchlib.median(times["rec-off"]), target=1.05)
        own = [SPENT.get(activation_id, 0.0) for activation_id in recorded[1:]]
        results.add("local: of which the recorder's own calls", benchlib.median(own), "s")
        results.add("recorded model exchanges per activation (stored)", benchlib.median(exchange_bytes) / 1024, "KiB")
        results.add("new blob bytes per activation (its one new note)", benchlib.median(snapshot_bytes[1:]) / 1024,
                    "KiB")
        results.add(f"blobs after {len(recorded)} activations (+{SEED_FILES} seed files once)", blob_bytes / 1024,
                    "KiB")
    model.close()
    return results.emit(args.json)


if __name__ == "__main__":
    sys.exit(main())
