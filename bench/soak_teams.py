"""Soak (issue 20): one `suzumio serve` keeps a fixed set of projects at work for a while. Each round
starts every project again and sends its pm "Round N": pm delegates to worker, worker reports back, pm
submits (the scripted provider on the `local` backend, a script with one turn per round), while
clients browse the project list. Prints the controller's descriptors, threads and resident memory after
the first round, after a warm-up and at the end, and fails when an activation failed, a round did not
finish, or a figure grew after the warm-up (descriptors and threads beyond a small margin, memory beyond
1.25x). The warm-up is time, not rounds: the SQLite page caches (up to 2 MiB a connection), malloc's and
pymalloc's high-water marks and the parsed configs fill over the first minutes (measured: resident size
climbs for about 4 minutes, then stays level).
Usage: .venv/bin/python bench/soak_teams.py [--minutes 20] [--warmup-minutes 5] [--projects 4] [--json]"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import benchlib
from load_fixtures import ServeProcess, browse, init_from_text

import suzumio_store

ROUND_TIMEOUT_S = 300.0
PROJECT_YAML = """\
name: {name}
task: Answer each round.
scheduler:
  noEffectNudge: {{maxConsecutive: 1}}
agents:
  pm: {{tools: [messages.send, coordination.wait_for_signal, completion.submit]}}
  worker: {{tools: [messages.send, coordination.wait_for_signal, file.write]}}
backend:
  kind: local
  runner:
    model: main
    models:
      providers:
        replay: {{type: scripted, script: script.json}}
      presets:
        main: {{provider: replay, model: soak}}
"""


def script(rounds):
    """One pm turn to delegate, one worker turn and one pm turn to submit, for every round."""
    pm, worker = [], []
    for number in range(rounds):
        tag = f"R{number:04d}"
        pm.append({"when": f"Round {tag}.", "steps": [
            {"tools": [{"name": "messages.send", "input": {"recipient": "worker", "body": f"Task {tag}."}}]},
            {"tools": [{"name": "coordination.wait_for_signal", "input": {"reason": "Waiting."}}]}]})
        pm.append({"when": f"Done {tag}.", "steps": [
            {"tools": [{"name": "completion.submit", "input": {"report": f"# Round {tag}\n\nDone.\n"}}]}]})
        worker.append({"when": f"Task {tag}.", "steps": [
            {"tools": [{"name": "file.write", "input": {"path": "{artifacts}/round.txt", "content": tag}}]},
            {"tools": [{"name": "messages.send", "input": {"recipient": "pm", "body": f"Done {tag}."}}]},
            {"tools": [{"name": "coordination.wait_for_signal",
                        "input": {"reason": "Reported.", "notifyPm": False}}]}]})
    return {"agents": {"pm": pm, "worker": worker}}


def init_projects(root_path, names, rounds):
    root = suzumio_store.Root(root_path)
    try:
        for name in names:
            folder = Path(root_path) / "_sources" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "script.json").write_text(json.dumps(script(rounds)), encoding="utf-8")
            init_from_text(root, folder, PROJECT_YAML.format(name=name))
    finally:
        root.close()


def figures(serve):
    return {"descriptors": serve.descriptors(), "threads": serve.threads(), "rss_kib": serve.rss_kib()}


def run_round(serve, names, number):
    tag = f"R{number:04d}"
    for name in names:
        for path, body in ((f"/api/projects/{name}/start", b"{}"),
                           (f"/api/projects/{name}/messages",
                            json.dumps({"recipient": "pm", "body": f"Round {tag}."}).encode())):
            status, answer = serve.request("POST", path, body)
            if status != 200:
                raise SystemExit(f"POST {path}: {status} {answer[:200]!r}")
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    pending = set(names)
    while pending and time.monotonic() < deadline:
        browse(serve, 2, 2)
        for name in list(pending):
            _status, body = serve.request("GET", f"/api/projects/{name}/report")
            if f"# Round {tag}" in body.decode("utf-8", "replace"):
                pending.discard(name)
        time.sleep(0.05)
    if pending:
        raise SystemExit(f"round {tag} did not finish within {ROUND_TIMEOUT_S:.0f} s: {sorted(pending)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--projects", type=int, default=4, help="projects at work at once, every round")
    parser.add_argument("--warmup-minutes", type=float, default=5.0,
                        help="rounds run before the figures the end is compared with")
    parser.add_argument("--rounds", type=int, default=2000, help="turns the script holds (an upper bound)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = benchlib.Results("soak_teams")
    names = [f"soak-{index}" for index in range(args.projects)]
    with tempfile.TemporaryDirectory(prefix="suzumio-soak-") as folder:
        root = Path(folder) / "root"
        root.mkdir()
        init_projects(root, names, args.rounds)
        serve = ServeProcess(root, Path(folder) / "serve.log").start()
        try:
            run_round(serve, names, 0)
            start = figures(serve)
            number = 0
            warm = time.monotonic() + args.warmup_minutes * 60
            while time.monotonic() < warm and number + 1 < args.rounds:
                number += 1
                run_round(serve, names, number)
            warmup_rounds = number + 1
            first = figures(serve)
            ends = time.monotonic() + args.minutes * 60
            while time.monotonic() < ends and number + 1 < args.rounds:
                number += 1
                run_round(serve, names, number)
                if number % 25 == 0:
                    now = figures(serve)
                    results.note(f"after round {number}: {now['descriptors']} descriptors, {now['threads']} "
                                 f"threads, {now['rss_kib'] / 1024:.1f} MiB")
            last = figures(serve)
            _status, body = serve.request("GET", "/api/projects")
            failed = sum(project["stats"]["failedActivationCount"] for project in json.loads(body))
            activations = sum(project["stats"]["activationCount"] for project in json.loads(body))
        finally:
            serve.stop()
    rounds = number + 1 - warmup_rounds
    results.note(f"{rounds} rounds in {args.minutes:g} min after {warmup_rounds} warm-up rounds in "
                 f"{args.warmup_minutes:g} min, {args.projects} projects each ({activations} activations in "
                 f"all, {failed} failed)")
    results.note(f"after the first round: {start['descriptors']} descriptors, {start['threads']} threads, "
                 f"{start['rss_kib'] / 1024:.1f} MiB")
    results.add("descriptors: end against after warm-up", last["descriptors"], "count", first["descriptors"])
    results.add("threads: end against after warm-up", last["threads"], "count", first["threads"])
    results.add("resident memory: end against after warm-up", last["rss_kib"] / 1024, "MiB", first["rss_kib"] / 1024)
    code = results.emit(args.json)
    grew = (last["descriptors"] > first["descriptors"] + 16 or last["threads"] > first["threads"] + 4
            or last["rss_kib"] > first["rss_kib"] * 1.25)
    return 1 if grew or failed else code


if __name__ == "__main__":
    sys.exit(main())
