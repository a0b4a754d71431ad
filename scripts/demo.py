#!/usr/bin/env python3
"""`make demo`: an offline team of agents on the embedded default, end to end.

Initialises examples/demo.yaml (a PM, two workers and a critic replaying a script with the `scripted`
provider) as project `demo` of its root (replacing only that project's folder: other projects of the root,
such as replays, stay), serves it with `suzumio serve`, sends the kick-off message, follows the
project's SSE stream narrated as `suzumio watch` narrates it, prints the final report, and leaves the
server running with the WebUI address until Ctrl-C. It uses Docker when an engine and the runner
image are present, else the `local` backend. A root that a running `suzumio serve` holds is left alone:
the demo says so and stops.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import suzumio_runtime  # noqa: E402  (the repository's modules, after the path above)
import suzumio_watch  # noqa: E402  the narration of `suzumio watch`, from this checkout

EXAMPLES = REPO / "examples"
PROJECT = "demo"  # examples/demo.yaml's name: the one project of the root the demo replaces
DEFAULT_PORT = 39400
RUNNER_IMAGE = os.environ.get("SUZUMIO_RUNNER_IMAGE", "suzumio-runner:dev")


def free_port(preferred):
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise SystemExit("no free port")


def docker_ready():
    """True when a Docker engine answers and the runner image exists."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.images.get(RUNNER_IMAGE)
        return True
    except Exception:  # noqa: BLE001  any failure means: no usable engine, fall back to local
        return False


def write_project(root, backend):
    """The demo config for this backend, written into the root's folder. Runners reach the controller
    over its runner socket and the scripted provider is offline, so containers get no network."""
    config = yaml.safe_load((EXAMPLES / "demo.yaml").read_text())
    if backend == "docker":
        config["backend"]["kind"] = "docker-chat"
        config["backend"]["image"] = RUNNER_IMAGE
        config["backend"]["docker"] = {"network": "none"}
    shutil.copy(EXAMPLES / "demo-script.yaml", root / "demo-script.yaml")
    path = root / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


def suzumio(*args, **kwargs):
    return [sys.executable, str(REPO / "suzumio.py"), *args]


def read_token(root):
    """The API token `suzumio serve` keeps in <root>/api-token."""
    return (root / "api-token").read_text(encoding="utf-8").strip()


def open_api(url, token, body=None, timeout=30):
    """GET (or POST `body` as JSON) with the API token."""
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET", headers=headers)
    return urllib.request.urlopen(request, timeout=timeout)


def post(url, token, body):
    with open_api(url, token, body) as response:
        return json.loads(response.read())


def wait_for_health(url, process, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("suzumio serve exited early")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("suzumio serve did not answer /health")


def follow(url, token, timeout):
    """Print the team's story as `suzumio watch` narrates it until the project is submitted; False when
    the stream stays silent for `timeout` seconds or breaks off."""
    try:
        ended = suzumio_watch.follow(url, "demo", token, sys.stdout, stop=lambda kind: kind == "project.submitted",
                                     limit=100, timeout=timeout)
    except suzumio_watch.WatchError:
        return False
    return ended is not None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(REPO / "demo-root"),
                        help="runtime root (its demo project is replaced; refused while a serve runs on it)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--backend", choices=["auto", "local", "docker"], default="auto")
    parser.add_argument("--exit-when-done", action="store_true", help="stop the server after the report")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()

    started = time.monotonic()
    root = Path(args.root).resolve()
    holder = suzumio_runtime.serve_holder(root)
    if holder is not None:
        pid, address = holder
        print(f"A suzumio serve (process {pid}, {address or 'starting'}) is running on {root}; the demo leaves "
              f"it alone. Stop it (kill {pid}), or run the demo on another root: make demo "
              f'DEMO_ARGS="--root other-root"', file=sys.stderr)
        return 1
    # Only the demo's own project is replaced: other projects of the root (replays, forks) stay.
    shutil.rmtree(root / PROJECT, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    backend = args.backend if args.backend != "auto" else ("docker" if docker_ready() else "local")
    port = free_port(args.port)
    url = f"http://127.0.0.1:{port}"
    project_file = write_project(root, backend)
    print(f"Suzumio demo: {backend} backend, root {root}", flush=True)
    subprocess.run(suzumio("init", str(project_file), "--root", str(root)), check=True)

    with open(root / "serve.log", "w") as serve_log:  # the server keeps its own copy of the descriptor
        server = subprocess.Popen(suzumio("serve", "--root", str(root), "--port", str(port)),
                                  stdout=subprocess.DEVNULL, stderr=serve_log)
    try:
        wait_for_health(url, server)
        token = read_token(root)
        post(url + "/api/projects/demo/start", token, {})
        post(url + "/api/projects/demo/messages", token,
             {"recipient": "pm", "body": "Start. Make the greeting card with your team."})
        if not follow(url, token, args.timeout):
            print(f"The demo did not finish within {args.timeout:.0f} s; see {root / 'serve.log'}")
            return 1
        with open_api(url + "/api/projects/demo/report", token, timeout=10) as response:
            report = response.read().decode("utf-8")
        print("\n--- final report " + "-" * 50)
        print(report.rstrip("\n"))
        print("-" * 67)
        print(f"Submitted in {time.monotonic() - started:.1f} s.")
        if args.exit_when_done:
            return 0
        print(f"WebUI: {url}/?token={token}#/demo/overview   (Ctrl-C stops the server)", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: server.terminate())
        server.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
