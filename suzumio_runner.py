"""The runner's entry script, `python3 suzumio_runner.py --input <input.json>` (docs/design/runner.md):
arguments, input.json, redacted warnings, SIGTERM, the exit status. The activation itself lives in the
modules beside it (suzumio_runner_loop, suzumio_runner_tools, suzumio_runner_models): a script run
directly is compiled on every start, imported modules get a bytecode cache, so this file stays small.
Standard library only, CPython >= 3.9."""

import json
import os
import signal
import socket
import sys

RUNNER_MODULES = ("suzumio_runner_models", "suzumio_runner_tools", "suzumio_runner_loop", "suzumio_runner_egress",
                  "suzumio_runner_files", "suzumio_runner_calls")

try:
    from suzumio_runner_loop import Runner, RunnerError
    from suzumio_runner_models import provider_secrets
    from suzumio_runner_tools import ProcessGroups
except ModuleNotFoundError as missing:  # the backend must deliver the runner files side by side
    if missing.name not in RUNNER_MODULES:
        raise
    sys.stderr.write(
        "Runner file not found: {} ({})\n".format(
            os.path.join(os.path.dirname(os.path.abspath(__file__)), missing.name + ".py"), missing
        )
    )
    sys.exit(1)


def format_error(error):
    """The one-line text printed for an uncaught error: message, then `: <cause>` and ` [<code>]`."""
    message = str(error) or error.__class__.__name__
    cause = error.__cause__
    if cause is not None:
        message += f": {cause}"
        code = getattr(cause, "errno", None) or getattr(cause, "code", None)
        if code is not None:
            message += f" [{code}]"
    return message


class Redactor:
    """Replaces every known secret (agent token, provider keys, secret headers) by `<redacted>`."""

    def __init__(self):
        self.secrets = []

    def add(self, values):
        merged = set(self.secrets)
        merged.update(v for v in values if isinstance(v, str) and v.strip())
        self.secrets = sorted(merged, key=len, reverse=True)

    def __call__(self, text):
        for secret in self.secrets:
            text = text.replace(secret, "<redacted>")
        return text


# ---------------------------------------------------------------------------------------------
# Entry point


def parse_args(argv):
    options = {}
    index = 0
    while index < len(argv):
        name = argv[index]
        if not name.startswith("--") or index + 1 >= len(argv):
            raise RunnerError(f"Arguments are --name value pairs; got {name}")
        options[name[2:]] = argv[index + 1]
        index += 2
    if not options.get("input") and not (options.get("warm") and options.get("warm-slot")):
        raise RunnerError("--input is required")
    return options


WARM_KEY_ENV = "SUZUMIO_WARM_KEY"
RELEASED = "Prepared runner released before it received an activation"


def receive_input(socket_path, slot):
    """A prepared runner (`--warm <socket> --warm-slot <slot>`): imports done, it says which
    slot it is on the controller's warm socket and waits for its activation: the input, the rest of its
    environment and, on the local backend, its log file. The controller ends the stream after it, or
    without one when it releases the runner."""
    key = os.environ.pop(WARM_KEY_ENV, "")
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
        connection.sendall(json.dumps({"slot": slot, "key": key}).encode("utf-8") + b"\n")
        chunks = []
        while True:
            chunk = connection.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as error:
        raise RunnerError(f"Cannot reach the warm socket {socket_path}") from error
    finally:
        connection.close()
    if not chunks:
        raise RunnerError(RELEASED)
    claim = json.loads(b"".join(chunks).decode("utf-8"))
    if claim.get("log"):
        fd = os.open(claim["log"], os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    os.environ.update({str(k): str(v) for k, v in (claim.get("env") or {}).items()})
    return claim["input"]


def load_input(path):
    try:
        with open(path, encoding="utf-8") as handle:
            activation = json.load(handle)
    except OSError as error:
        raise RunnerError(f"Cannot read input file {path}") from error
    except ValueError as error:
        raise RunnerError(f"Input file {path} is not valid JSON: {error}") from None
    if not isinstance(activation, dict):
        raise RunnerError(f"Input file {path} must hold a JSON object")
    return activation


def main(argv=None):
    """Run one activation; returns the exit status (0 only after the output was accepted)."""
    redactor = Redactor()
    groups = ProcessGroups()

    def warn(message, *args):
        try:
            sys.stderr.write(redactor(message % args if args else message) + "\n")
        except OSError:
            pass  # a log line lost to a full disk must not end the activation

    def on_sigterm(signum, frame):
        # Acts at once instead of setting a flag: the main thread may sit in a 300 s model read.
        sys.stderr.write("Received SIGTERM; stopping tool processes and exiting without output\n")
        sys.stderr.flush()
        groups.terminate_all(grace=1.0)
        os._exit(143)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        options = parse_args(sys.argv[1:] if argv is None else argv)
        if options.get("input"):
            activation = load_input(options["input"])
        else:
            activation = receive_input(options["warm"], options["warm-slot"])
        env = dict(os.environ)
        redactor.add([activation.get("token"), env.get("SUZUMIO_TOKEN")])
        models = (activation.get("runner") or {}).get("models")
        if isinstance(models, dict):
            redactor.add(provider_secrets(models, env))
        Runner(activation, env, groups, warn=warn).run()
    except Exception as error:  # noqa: BLE001 - the process boundary: one line on stderr, exit 1
        sys.stderr.write(redactor(format_error(error)) + "\n")
        sys.stderr.flush()
        return 1
    finally:
        groups.terminate_all(grace=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
