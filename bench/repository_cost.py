"""The team repository's costs (docs/teams-that-write-code.md), on a real store and the real `git`:
- the end-of-activation commit of a working copy of a 10,000-file repository: nothing changed, and ten
  files changed (what `activation_ended` runs, the publish to the project's repository included);
- merge-queue throughput: agents each land a change to their own file with one check that takes one
  second (`sleep 1`), on the `local` check runner; merges per minute over the whole queue.
Usage: .venv/bin/python bench/repository_cost.py [--files 10000] [--merges 8] [--repeat 5] [--json]"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

import suzumio_config
import suzumio_merge_queue as merge_queue
import suzumio_repository as repository
import suzumio_store


def make_source(folder, files):
    """A repository of `files` small files in 100 folders, one commit."""
    folder.mkdir(parents=True)
    for index in range(files):
        path = folder / f"pkg{index % 100:02d}" / f"module{index:05d}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"VALUE = {index}\n", encoding="utf-8")
    for args in (["init", "--quiet", "--initial-branch=main"], ["add", "-A"],
                 ["-c", "user.name=Bench", "-c", "user.email=bench@example.com", "commit", "--quiet", "-m", "seed"]):
        subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)
    return folder


def project(root, directory, source, agents, checks):
    text = benchlib.project_text("repo", agents, tools='["repo.*"]') + (
        f"repository:\n  source: {source}\n  checks: {checks!r}\n")
    store = benchlib.init_project(root, directory, text, start=False)
    return store, suzumio_config.ProjectConfig.from_data(store.config())


def commit_cost(results, base, files, repeat):
    source = make_source(base / "big", files)
    root = suzumio_store.Root(base / "root-big")
    store, config = project(root, base / "cfg-big", source, ["w1"], [])
    started = time.perf_counter()
    copy = repository.working_copy(store, config, "w1")
    results.add(f"first checkout of a working copy ({files} files)", time.perf_counter() - started, "s")
    unchanged = benchlib.timed(lambda: copy.commit("nothing changed"), repeat)
    counter = iter(range(10**6))

    def ten_files():
        step = next(counter)
        for index in range(10):
            path = store.workspace("w1") / f"pkg{index:02d}" / f"module{index:05d}.py"
            path.write_text(f"VALUE = {step}\n", encoding="utf-8")
        copy.commit(f"step {step}")

    changed = benchlib.timed(ten_files, repeat)
    results.add(f"end-of-activation commit, nothing changed ({files} files)", benchlib.median(unchanged), "s")
    results.add(f"end-of-activation commit, 10 files changed ({files} files)", benchlib.median(changed), "s")
    root.close()


def throughput(results, base, merges):
    source = make_source(base / "small", 50)
    agents = [f"w{index}" for index in range(merges)]
    root = suzumio_store.Root(base / "root-queue")
    store, config = project(root, base / "cfg-queue", source, agents, ["sleep 1"])
    for agent_id in agents:
        repository.working_copy(store, config, agent_id)
        (store.workspace(agent_id) / f"{agent_id}.txt").write_text(f"{agent_id}\n", encoding="utf-8")
        merge_queue.merge_tool(_Queue(), store, config, {"id": agent_id}, f"act-{agent_id}",
                               {"message": f"{agent_id} lands"})
    started = time.perf_counter()
    for request in store.merge_requests(waiting_only=True):
        merge_queue.land(store, config, request, merge_queue.run_check_locally)
    elapsed = time.perf_counter() - started
    landed = sum(1 for request in store.merge_requests() if request["status"] == "merged")
    results.add(f"merge queue, {landed} merges with a 1 s check (local)", landed / elapsed * 60, "/min",
                higher_is_better=True)
    results.add("merge queue overhead per merge beyond the check", elapsed / landed - 1.0, "s")
    root.close()


class _Queue:
    def wake(self, store):
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--merges", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = benchlib.Results("repository_cost")
    with tempfile.TemporaryDirectory() as temp:
        base = Path(temp)
        commit_cost(results, base, args.files, args.repeat)
        throughput(results, base, args.merges)
    return results.emit(args.json)


if __name__ == "__main__":
    sys.exit(main())
