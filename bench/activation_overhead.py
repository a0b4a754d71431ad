"""Activation start overhead: the median time from a pending signal (one scheduler tick) to the runner
process starting, for the `local` and `docker-chat` backends, each as a ratio to the bare cost measured
in the same run (`python3 -c pass` spawned as a process; `docker run --rm <image> true`). Target <= 1.5x.
Usage: .venv/bin/python bench/activation_overhead.py [--runs 7] [--skip-docker]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

import suzumio_backend
import suzumio_config
import suzumio_scheduler
import suzumio_store

IMAGE = "suzumio-runner:dev"
# The bench runner records the moment its first statement runs, then exits.
BENCH_RUNNER = """import time
started = time.time()
import json, sys
data = json.load(open(sys.argv[sys.argv.index("--input") + 1]))
open(data["workspace"] + "/started-" + data["activation"]["id"], "w").write(repr(started))
"""


def make_support_dir(path):
    path.mkdir(parents=True)
    (path / suzumio_backend.RUNNER_FILE).write_text(BENCH_RUNNER)
    (path / suzumio_backend.HOST_FILE).write_text("// unused by the bench\n")
    return path


def make_project(base, kind):
    config = {"name": "bench", "task": "Measure.", "channels": ["#project"],
              "agents": {"worker": {"tools": []}},
              "backend": {"kind": kind, "image": IMAGE, "controllerUrl": "http://127.0.0.1:9",
                          "docker": {"network": "host"},
                          "runner": {"mode": "ai", "model": "main", "models": {
                              "providers": {"replay": {"type": "scripted", "script": {"agents": {
                                  "worker": [{"steps": [{"say": "ok"}]}]}}}},
                              "presets": {"main": {"provider": "replay", "model": "m"}}}}}}
    path = base / "project.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    loaded = suzumio_config.load_project(path, env={})
    root = suzumio_store.Root(base / "root")
    store = root.init_project(
        name="bench", task=loaded.data["task"], config=loaded.data,
        agents=[suzumio_store.AgentSeed(id=a.id, role=a.role, display_name=a.display_name, prompt=a.prompt,
                                        model=a.model, tools=list(a.tools)) for a in loaded.agents],
        source_text=loaded.source_text, resolved_text=loaded.render(), config_path=loaded.path)
    store.start()
    return root, store


def wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"runner never started: {path}")
        time.sleep(0.002)
    return float(path.read_text())


def activation_latencies(kind, runs):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root, store = make_project(base, kind)
        backends = suzumio_backend.Backends(support_dir=make_support_dir(base / "support"))
        samples = []
        try:
            for index in range(runs):
                store.send_message("user", f"job {index}", recipient="worker")
                began = time.time()
                suzumio_scheduler.tick(store, backends, suzumio_scheduler.NoHooks(), suzumio_scheduler.utc_now())
                act = store.activation(store.agent("worker")["activeActivationId"])
                samples.append(wait_for(store.workspace("worker") / f"started-{act['id']}") - began)
                while store.activation(act["id"])["status"] == "running":
                    time.sleep(0.01)
        finally:
            backends.close()
            root.close()
        return samples


def bare_local(runs):
    samples = []
    for _ in range(runs):
        began = time.time()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        samples.append(time.time() - began)
    return samples


def bare_docker(runs):
    import docker
    client = docker.from_env()
    samples = []
    for _ in range(runs):
        began = time.time()
        client.containers.run(IMAGE, "true", remove=True, network_mode="host")
        samples.append(time.time() - began)
    return samples


def report(name, activation, bare):
    median_act, median_bare = statistics.median(activation), statistics.median(bare)
    ratio = median_act / median_bare
    verdict = "ok" if ratio <= 1.5 else "above target"
    print(f"{name:12s} activation {median_act * 1000:8.1f} ms   bare {median_bare * 1000:8.1f} ms   "
          f"ratio {ratio:5.2f}x  ({verdict}, target <= 1.5x)")
    return {"backend": name, "activationMs": median_act * 1000, "bareMs": median_bare * 1000, "ratio": ratio}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--skip-docker", action="store_true")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args()
    results = [report("local", activation_latencies("local", args.runs), bare_local(args.runs))]
    if not args.skip_docker:
        results.append(report("docker-chat", activation_latencies("docker-chat", args.runs),
                              bare_docker(args.runs)))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
