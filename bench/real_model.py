"""Suzumio and a peer framework on the same tasks with the same real model (docs/real-models.md): the lab's
Qwen2.5-Coder-1.5B on llama.cpp, temperature 0 and a fixed seed for both. Suzumio runs each task as a
one-agent project (`completion.submit` and `file.*`, the README's quick start) on `docker-chat`, through
`suzumio init|serve|start|send` as a user would; the peer is smolagents' ToolCallingAgent with one
`file_write` tool (the comparison the real-model issue was measured with), installed in the bench's own
environment. Per task and side: completion rate (finished, and the file passes the task's check), valid tool
calls, prompt tokens of the first request, cached share of prompt tokens, median wall time.

Needs the lab (`scripts/local-model up`); run it alone: the model takes both cores.
Usage: .venv/bin/python bench/real_model.py [--runs 5] [--tasks poem,code,list] [--peer-env DIR] [--json]"""
import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import yaml
from conftest import free_port

REPO = benchlib.REPO
SEED = 7
IMAGE = "suzumio-runner:dev"  # scripts/build-runner-image
PEER_PACKAGES = ["smolagents==1.26.0", "openai"]
SETTINGS = Path(os.environ.get("SUZUMIO_LOCAL_MODEL_DIR", Path.home() / ".cache" / "suzumio-local-model"),
                "settings.env")


def check_poem(text):
    return bool(text.strip())


def check_code(text):
    scope = {}
    try:
        exec(compile(text, "add.py", "exec"), scope)  # the model's file, in the bench's own process: a check
        return scope["add"](2, 3) == 5
    except Exception:  # noqa: BLE001 (whatever the model's code raises, it fails the check)
        return False


def check_list(text):
    return len([line for line in text.splitlines() if line.strip()]) >= 3


TASKS = {
    "poem": ("poem.md", check_poem, "Write a four-line poem about the sea to your artifact folder as poem.md, then "
                                    "submit the poem as your final report."),
    "code": ("add.py", check_code, "Write a Python function add(a, b) that returns a + b to your artifact folder "
                                   "as add.py, then submit a final report that names the file."),
    "list": ("tea.md", check_list, "Write three steps to make tea, one per line, to your artifact folder as "
                                   "tea.md, then submit a final report that names the file."),
}


def lab_settings():
    if not SETTINGS.is_file():
        sys.exit(f"real_model: no lab settings at {SETTINGS}: run scripts/local-model up first")
    return dict(line.split("=", 1) for line in SETTINGS.read_text().splitlines() if "=" in line)


def found(root, name):
    """The text of the first file called `name` under root, or None."""
    for path in sorted(Path(root).rglob(name)):
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")
    return None


# -- Suzumio

def suzumio(lab, task_id, folder, timeout):
    name, check, task = TASKS[task_id]
    config = {"name": "bench", "task": task,
              "agents": {"pm": {"tools": ["completion.submit", "file.*"]}},
              "backend": {"kind": "docker-chat", "image": IMAGE, "runner": {"model": "local", "models": {
                  "providers": {"lab": {"type": "openai-compatible", "baseURLEnv": "SUZUMIO_LOCAL_MODEL_BASE_URL",
                                        "apiKeyEnv": "SUZUMIO_LOCAL_MODEL_API_KEY"}},
                  "presets": {"local": {"provider": "lab", "model": lab["SUZUMIO_LOCAL_MODEL_NAME"], "temperature": 0,
                                        "providerOptions": {"openaiCompatible": {"seed": SEED}}}}}}}}
    (folder / "bench.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    root = folder / "root"
    env = dict(os.environ, SUZUMIO_ROOT=str(root), **{k: v for k, v in lab.items()
                                                     if k.startswith("SUZUMIO_LOCAL_MODEL_")})

    def cli(*argv):
        return subprocess.run([sys.executable, str(REPO / "suzumio.py"), *argv], env=env, capture_output=True,
                              text=True, timeout=120, check=True).stdout

    cli("init", str(folder / "bench.yaml"))
    serve = subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "serve", "--port", str(free_port())],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ((root / "run").exists() and any((root / "run").iterdir())):
            if time.monotonic() > deadline:
                raise RuntimeError("serve did not start")
            time.sleep(0.2)
        cli("start", "bench")
        started = time.monotonic()
        cli("send", "bench", "pm", "P3", "Please begin.")
        status = "running"
        while time.monotonic() - started < timeout:
            time.sleep(2)  # each look is a CLI process: polled fast, it would take a core from the model
            status = json.loads(cli("status", "bench", "--json"))[0]["status"]
            if status in ("submitted", "stopped", "failed"):
                break
        wall = time.monotonic() - started
    finally:
        serve.terminate()
        serve.wait(30)
    db = sqlite3.connect(root / "bench" / "suzumio.sqlite")
    usage = [json.loads(row[0]) for row in db.execute("SELECT usage_json FROM model_exchanges ORDER BY started_at")]
    calls = [row[0] for row in db.execute("SELECT status FROM tool_calls")]
    text = found(root / "bench" / "artifacts", name)
    return {"completed": status == "submitted" and text is not None and check(text),
            "calls": len(calls), "validCalls": calls.count("completed"),
            "usage": [{"input": u.get("input", 0), "cacheRead": u.get("cacheRead", 0)} for u in usage],
            "wall": wall}


# -- the peer

def peer_python(env_dir):
    python = env_dir / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    probe = subprocess.run([str(python), "-c", "import smolagents, openai"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        *PEER_PACKAGES], check=True)
    return python


def peer(python, lab, task_id, folder, timeout):
    name, check, task = TASKS[task_id]
    result = subprocess.run([str(python), str(REPO / "bench" / "peer_smolagents.py"),
                             "--base", lab["SUZUMIO_LOCAL_MODEL_BASE_URL"], "--model", lab["SUZUMIO_LOCAL_MODEL_NAME"],
                             "--root", str(folder), "--task", task, "--seed", str(SEED)],
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"peer failed: {result.stderr[-2000:]}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    text = found(folder, name)
    data["completed"] = data["answered"] and text is not None and check(text)
    return data


# -- the table

def summary(results):
    runs = len(results)
    first = [r["usage"][0]["input"] for r in results if r["usage"]]
    prompt = sum(u["input"] for r in results for u in r["usage"])
    cached = sum(u["cacheRead"] for r in results for u in r["usage"])
    calls = sum(r["calls"] for r in results)
    return {"completed": sum(r["completed"] for r in results), "runs": runs,
            "validCalls": sum(r["validCalls"] for r in results), "calls": calls,
            "firstPrompt": statistics.median(first) if first else None,
            "cachedShare": cached / prompt if prompt else 0.0,
            "wall": statistics.median(r["wall"] for r in results)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--peer-env", type=Path, default=Path.home() / ".cache" / "suzumio-bench-peer",
                        help="the peer's own environment (created, and smolagents installed, when missing)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    lab = lab_settings()
    python = peer_python(args.peer_env)
    rows = {}
    for task_id in args.tasks.split(","):
        ours, theirs = [], []
        for run in range(args.runs):
            # alternate who goes first, so neither side always meets a warm prompt cache
            order = [("suzumio", ours), ("peer", theirs)] if run % 2 == 0 else [("peer", theirs), ("suzumio", ours)]
            for side, results in order:
                with tempfile.TemporaryDirectory(prefix=f"bench-{side}-") as folder:
                    if side == "suzumio":
                        results.append(suzumio(lab, task_id, Path(folder), args.timeout))
                    else:
                        results.append(peer(python, lab, task_id, Path(folder), args.timeout))
                print(f"{task_id} run {run + 1} {side}: completed={results[-1]['completed']} "
                      f"wall={results[-1]['wall']:.1f}s", file=sys.stderr, flush=True)
        rows[task_id] = {"suzumio": summary(ours), "peer": summary(theirs)}
    print(f"{'task':6} {'side':8} {'completed':>10} {'valid calls':>12} {'first prompt':>13} {'cached':>7} {'wall':>8}")
    for task_id, sides in rows.items():
        for side, s in sides.items():
            print(f"{task_id:6} {side:8} {s['completed']:>4}/{s['runs']:<5} {s['validCalls']:>5}/{s['calls']:<6} "
                  f"{s['firstPrompt'] or 0:>13.0f} {s['cachedShare']:>7.0%} {s['wall']:>7.1f}s")
    if args.json:
        print(benchlib.JSON_PREFIX + json.dumps({"bench": "real_model", "rows": rows}))


if __name__ == "__main__":
    main()
