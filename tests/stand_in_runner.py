"""A minimal stand-in for suzumio_runner.py, used by backend and scheduler tests only: it reads the
activation input like the real runner and then does what STANDIN_MODE (from the agent's env) says.
Standard library only, because the Docker tests run it inside the runner image."""
import json
import os
import signal
import ssl
import sys
import time
import urllib.request


def post_output(data, text):
    body = json.dumps({"project": data["project"], "agentId": data["agent"]["id"],
                       "activationId": data["activation"]["id"], "token": data["token"],
                       "output": {"text": text}}).encode()
    request = urllib.request.Request(data["controllerUrl"].rstrip("/") + "/activation-output", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
    # A swarm runner reaches the controller's runner listener over TLS, verified against the CA it is given.
    context = ssl.create_default_context(cadata=data["controllerCa"]) if data.get("controllerCa") else None
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        response.read()


def record_seen(data):
    """Leave what the runner saw in its workspace, where the test can read it."""
    seen = {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid(),
            "pgid": os.getpgid(0), "sid": os.getsid(0)}
    with open(os.path.join(data["workspace"], "standin-seen.json"), "w", encoding="utf-8") as handle:
        json.dump(seen, handle)


def main():
    path = sys.argv[sys.argv.index("--input") + 1]
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    record_seen(data)
    mode = os.environ.get("STANDIN_MODE", "output")
    if mode == "output":
        post_output(data, os.environ.get("STANDIN_TEXT", "done"))
        return 0
    if mode.startswith("exit:"):
        print(os.environ.get("STANDIN_TEXT", "boom"), flush=True)
        return int(mode.split(":", 1)[1])
    if mode == "print-secrets":
        print("token", data["token"], "key", os.environ.get("STANDIN_KEY_ENV") and
              os.environ.get(os.environ["STANDIN_KEY_ENV"]), flush=True)
        return 2
    if mode == "sleep":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        while True:
            time.sleep(1)
    if mode.startswith("delay-output:"):
        time.sleep(float(mode.split(":", 1)[1]))
        post_output(data, os.environ.get("STANDIN_TEXT", "done"))
        return 0
    print(f"unknown STANDIN_MODE {mode}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
