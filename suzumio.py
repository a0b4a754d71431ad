"""Suzumio command line and composition root.

Parses the CLI (cli.md), builds the runtime from arguments — store root, backends, scheduler, toolpack
runtime and the WSGI app — and runs Waitress for `serve`. Nothing is built at import time. This is the
only module that may import every other Suzumio module.
"""
import argparse
import logging
import math
import os
import resource
import signal
import sys
import threading
from pathlib import Path

import suzumio_config
import suzumio_store
from suzumio_errors import SuzumioError
from suzumio_records import PRIORITIES

log = logging.getLogger(__name__)

USAGE = """Suzumio

Commands:
  suzumio config render <file>
  suzumio init <file> [--root dir]
  suzumio serve [--host 127.0.0.1] [--port 39400] [--root dir] [--no-scheduler] [--threads 32] \
[--allow-host name]... [--api-token-env NAME]
  suzumio start <project> [--root dir]
  suzumio stop <project> [--root dir]
  suzumio approve <project> [--root dir]
  suzumio send <project> <recipient> <P0|P1|P2|P3> <message...> [--root dir]
  suzumio status [project] [--root dir]
  suzumio messages <project> [--limit n] [--root dir]
  suzumio activations|turns <project> [--limit n] [--root dir]
  suzumio artifacts <project> [--root dir]
  suzumio events <project> [--limit n] [--root dir]
  suzumio tick [project] [--root dir]
  suzumio gc [project] [--root dir]
"""

DEFAULT_LIMIT = 50
SIGNAL_POLL_SECONDS = 0.2
LOW_DESCRIPTOR_LIMIT = 4096

# Which flags each command accepts (dest names); --root is accepted everywhere, cli.md §1.1.
SERVE_FLAGS = {"host", "port", "no_scheduler", "threads", "allow_host", "api_token_env"}
COMMAND_FLAGS = {
    "config": set(), "init": set(), "serve": SERVE_FLAGS, "start": set(), "stop": set(),
    "approve": set(), "send": set(), "status": set(), "messages": {"limit"},
    "activations": {"limit"}, "turns": {"limit"}, "artifacts": set(), "events": {"limit"},
    "tick": set(), "gc": set(),
}
# (minimum, maximum) positionals after the command word; None = unbounded.
COMMAND_ARITY = {
    "init": (1, 1), "serve": (0, 0), "start": (1, 1), "stop": (1, 1), "approve": (1, 1),
    "send": (4, None), "status": (0, 1), "messages": (1, 1), "activations": (1, 1), "turns": (1, 1),
    "artifacts": (1, 1), "events": (1, 1), "tick": (0, 1), "gc": (0, 1),
}


class UsageError(Exception):
    """The command line does not fit the usage text: print it and exit 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser():
    parser = _Parser(prog="suzumio", add_help=False)
    parser.add_argument("words", nargs="*")
    parser.add_argument("--root")
    parser.add_argument("--limit")
    parser.add_argument("--host")
    parser.add_argument("--port")
    parser.add_argument("--no-scheduler", action="store_true", default=None)
    parser.add_argument("--threads")
    parser.add_argument("--allow-host", action="append")
    parser.add_argument("--api-token-env")
    parser.add_argument("-h", "--help", action="store_true", default=None)
    return parser


def parse_args(argv):
    """Parse argv into (command, positionals, options); raises UsageError."""
    args = build_parser().parse_intermixed_args(argv)
    if args.help or not args.words:
        raise UsageError("help")
    command, *rest = args.words
    if command not in COMMAND_FLAGS:
        raise UsageError(f"unknown command {command}")
    given = {name for name in ("limit", *SERVE_FLAGS) if getattr(args, name) is not None}
    if given - COMMAND_FLAGS[command]:
        raise UsageError("flag not accepted by this command")
    if command == "config":
        if len(rest) != 2 or rest[0] != "render" or not rest[1]:
            raise UsageError("config render <file>")
        rest = rest[1:]
    else:
        low, high = COMMAND_ARITY[command]
        if len(rest) < low or (high is not None and len(rest) > high):
            raise UsageError("wrong number of arguments")
    if command == "send" and not " ".join(rest[3:]).strip():
        raise UsageError("message body is required")
    threads = args.threads
    if command == "serve" and threads is not None and (not threads.isdigit() or int(threads) < 16):
        raise UsageError("--threads must be an integer >= 16")
    return command, rest, args


def parse_limit(value):
    """cli.md §1.1: a finite positive decimal is floored; anything else means the default."""
    if value is None:
        return DEFAULT_LIMIT
    try:
        number = float(value.strip())
    except ValueError:
        return DEFAULT_LIMIT
    if not math.isfinite(number) or number <= 0:
        return DEFAULT_LIMIT
    return math.floor(number)


def open_root(options):
    return suzumio_store.Root(suzumio_store.resolve_root(options.root, os.environ))


class Runtime:
    """The collaborators of one process, built from the root: backends, toolpack runtime, scheduler.
    Imported lazily so that `config render`, `status` and friends never load Docker or Bottle."""

    def __init__(self, root, on_fatal=None):
        import suzumio_backend
        import suzumio_scheduler
        import suzumio_toolpacks

        self.root = root
        configs = suzumio_config.ConfigCache()  # one parsed config per project, for ticks and routes
        self.toolpacks = suzumio_toolpacks.ToolpackRuntime(configs=configs)
        self.backends = suzumio_backend.Backends()
        self.scheduler = suzumio_scheduler.Scheduler(root, self.backends, hooks=self.toolpacks, configs=configs,
                                                     on_fatal=on_fatal)

    def close(self):
        """Shutdown order of STYLE.md after HTTP: scheduler, backend watchers, Node host, stores."""
        self.scheduler.stop()
        self.backends.close()
        self.toolpacks.close()
        self.root.close()


# ----------------------------------------------------------------------------------------------
# Commands: each returns the exit code and raises SuzumioError on failure. Stores come from the
# Root, which owns and closes them.


def cmd_config_render(rest, options, out, err):
    config = suzumio_config.load_project(rest[0])
    for line in config.network_report() + config.warnings:
        print(line, file=err)
    out.write(config.render())
    return 0


def cmd_init(rest, options, out, err):
    config = suzumio_config.load_project(rest[0])
    for line in config.warnings:
        print(line, file=err)
    root = open_root(options)
    try:
        store = root.init_project(
            name=config.data["name"], task=config.data["task"], config=config.data, agents=config.agents,
            source_text=config.source_text, resolved_text=config.render())
        print(f"Initialized {store.project_id}", file=out)
        print(f"Root: {store.dir}", file=out)
    finally:
        root.close()
    return 0


def cmd_status(rest, options, out, err):
    root = open_root(options)
    try:
        for name in rest or root.list_projects():
            store = root.open_project(name)
            project = store.project()
            print(f"{project['id']}  {project['status']}", file=out)
            for agent in store.list_agents():
                line = f"  {agent['id'].ljust(16)} {agent['status']}"
                if agent.get("activeActivationId"):
                    line += f" {agent['activeActivationId']}"
                print(line, file=out)
    finally:
        root.close()
    return 0


def cmd_messages(rest, options, out, err):
    with project_store(options, rest[0]) as store:
        for message in store.list_messages(parse_limit(options.limit), full_body=True):
            target = message.get("recipient") or message.get("channel")
            print(file=out)
            print(f"{message['id']} {message['createdAt']} {message['sender']} -> {target} "
                  f"[{message['priority']}]", file=out)
            print(message["body"], file=out)
    return 0


def cmd_activations(rest, options, out, err):
    with project_store(options, rest[0]) as store:
        for activation in store.list_activations(parse_limit(options.limit)):
            print(file=out)
            print(f"{activation['id']} {activation['agentId']} {activation['status']} "
                  f"{activation['startedAt']}", file=out)
            if activation.get("text"):
                print(activation["text"], file=out)
            if activation.get("error"):
                print(activation["error"], file=out)
    return 0


def cmd_events(rest, options, out, err):
    with project_store(options, rest[0]) as store:
        for event in reversed(store.list_events(parse_limit(options.limit))):
            print(f"{event['created_at']} {event['type']} {event['data_json']}", file=out)
    return 0


def cmd_artifacts(rest, options, out, err):
    with project_store(options, rest[0]) as store:
        lines = []
        for agent in store.list_agents():
            for path, size in walk_files(store.artifacts_dir(agent["id"])):
                lines.append((agent["id"], path, size))
        for agent_id, path, size in sorted(lines):
            print(f"{agent_id}/{path} {size}", file=out)
    return 0


def walk_files(folder):
    """(relative path, size) of the regular files under folder; symbolic links are never followed
    nor listed (cli.md §3.15)."""
    if folder.is_symlink() or not folder.is_dir():
        return
    stack = [(folder, "")]
    while stack:
        directory, prefix = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_symlink():
                    continue
                relative = f"{prefix}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), relative + "/"))
                elif entry.is_file(follow_symlinks=False):
                    yield relative, entry.stat(follow_symlinks=False).st_size


class project_store:
    """`with project_store(options, name) as store`: open one project, close the root afterwards."""

    def __init__(self, options, name):
        self.root = open_root(options)
        self.name = name

    def __enter__(self):
        try:
            return self.root.open_project(self.name)
        except BaseException:
            self.root.close()
            raise

    def __exit__(self, *exc):
        self.root.close()


def cmd_send(rest, options, out, err):
    project, recipient, priority = rest[0], rest[1], rest[2]
    root = open_root(options)
    try:
        store = root.open_project(project)
        if priority not in PRIORITIES:
            raise SuzumioError(f"Invalid priority: {priority}")
        message = store.send_message("user", " ".join(rest[3:]), recipient=recipient, priority=priority)
        print(f"Sent {message['id']}", file=out)
    finally:
        root.close()
    return tick_projects(options, [project], err)


def cmd_start(rest, options, out, err):
    root = open_root(options)
    try:
        store = root.open_project(rest[0])
        store.start()
        print(f"{store.project_id}: running", file=out)
    finally:
        root.close()
    return tick_projects(options, rest, err)


def cmd_stop(rest, options, out, err, *, approve=False):
    import suzumio_scheduler

    runtime = Runtime(open_root(options))
    try:
        store = runtime.root.open_project(rest[0])
        if approve:
            suzumio_scheduler.approve_project(store, runtime.backends)
            print(f"{store.project_id}: completed", file=out)
        else:
            suzumio_scheduler.stop_project(store, runtime.backends)
            print(f"{store.project_id}: stopped", file=out)
    finally:
        runtime.close()
    return 0


def cmd_approve(rest, options, out, err):
    return cmd_stop(rest, options, out, err, approve=True)


def cmd_tick(rest, options, out, err):
    return tick_projects(options, rest, err, every=not rest)


def cmd_gc(rest, options, out, err):
    """Remove the activation containers a project no longer needs (backend.docker.keep), or those of
    every project; their log tails are kept in the activation folders."""
    import suzumio_backend

    root = open_root(options)
    backends = suzumio_backend.Backends()
    try:
        names = rest or root.list_projects()
        stores = [root.open_project(name) for name in names]
        for store in stores:
            config = suzumio_config.ProjectConfig.from_data(store.config())
            if config.backend.kind != suzumio_backend.KIND_DOCKER and not rest:
                continue
            try:
                removed = backends.collect_garbage(store, config)
            except suzumio_backend.engine_errors() as error:
                raise SuzumioError(f"Docker engine unavailable: {error}") from None
            print(f"{store.project_id}: removed {removed} container{'' if removed == 1 else 's'}", file=out)
    finally:
        backends.close()
        root.close()
    return 0


def tick_projects(options, names, err, every=False):
    """One scheduler pass per project (cli.md §3.12). Over every project an error is reported per
    project and the rest go on; for a named project it is the command's error."""
    runtime = Runtime(open_root(options))
    failed = False
    try:
        if every:
            names = runtime.root.list_projects()
        else:
            runtime.root.open_project(names[0])  # Unknown project: <name>, before any pass
        for name in names:
            try:
                runtime.scheduler.tick(name)
            except SuzumioError as error:
                if not every:
                    raise
                print(f"Error: {name}: {error}", file=err)
                failed = True
    finally:
        runtime.close()
    return 1 if failed else 0


def cmd_serve(rest, options, out, err):
    port_text = options.port if options.port is not None else "39400"
    if not port_text.isdigit() or int(port_text) > 65535:
        raise SuzumioError(f"Invalid port: {port_text}")
    api_token = None
    if options.api_token_env is not None:
        api_token = os.environ.get(options.api_token_env)
        if not api_token:
            raise SuzumioError(f"API token variable {options.api_token_env} is not set")
    host = options.host or "127.0.0.1"
    return serve(open_root(options), host=host, port=int(port_text), threads=int(options.threads or 32),
                 scheduler_enabled=not options.no_scheduler, allowed_hosts=tuple(options.allow_host or ()),
                 api_token=api_token, out=out, err=err)


class Liveness:
    """The long-lived loops of `serve` (HTTP, scheduler, reconciler). A loop that dies reports here;
    the first death ends the process with exit code 1, so a supervisor restarts it and the restarted
    controller adopts the runners. /health names the state of each loop meanwhile."""

    def __init__(self, components):
        self._states = dict.fromkeys(components, "up")
        self.dead = threading.Event()

    def died(self, component, error):
        self._states[component] = f"down: {type(error).__name__}: {error}"
        self.dead.set()

    def states(self):
        return dict(self._states)


def raise_descriptor_limit(err):
    """Raise the soft RLIMIT_NOFILE to the hard limit; warn when it stays low. Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as error:
            log.warning("cannot raise the descriptor limit from %s to %s: %s", soft, wanted, error)
    if soft < LOW_DESCRIPTOR_LIMIT:
        print(f"Warning: the open-file limit is {soft} (hard {hard}); with many projects and runners "
              f"serve may run out of descriptors (raise it with ulimit -n)", file=err)
    return soft


def open_stores(root):
    """The stores of every project in the root, skipping one removed between listing and opening."""
    stores = []
    for name in root.list_projects():
        try:
            stores.append(root.open_project(name))
        except SuzumioError as error:
            log.warning("project %s skipped: %s", name, error)
    return stores


def serve(root, *, host, port, threads, scheduler_enabled, allowed_hosts, api_token, out, err):
    """Run the controller until SIGINT/SIGTERM: HTTP, scheduler, reconciliation (cli.md §3.3, §4).
    Returns 1 when one of its loops died (Liveness), else 0."""
    import suzumio_api

    if host not in ("127.0.0.1", "localhost", "::1") and not api_token:
        print(f"Warning: serving on {host} without --api-token-env: anyone who can reach it controls "
              "every project", file=err)
    descriptors = raise_descriptor_limit(err)
    liveness = Liveness(["http", "reconciler"] + (["scheduler"] if scheduler_enabled else []))
    runtime = Runtime(root, on_fatal=liveness.died)
    app = suzumio_api.make_app(root, runtime.scheduler, runtime.backends, runtime.toolpacks,
                               api_token=api_token, allowed_hosts=allowed_hosts, bound_host=host,
                               liveness=liveness.states)
    # Half the descriptors for connections, the rest for databases, runner logs, pipes and engine calls.
    limit = min(suzumio_api.CONNECTION_LIMIT, descriptors // 2)
    server = suzumio_api.Server(app, host, port, threads=threads, connection_limit=limit, on_fatal=liveness.died)
    # The handlers only record the signal: appending to a list takes no lock, so a signal can never
    # deadlock on one the main thread holds (Event.set would). The main thread shuts down in order.
    received = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.start()
        print(f"suzumio listening on http://{host}:{server.port}", file=out, flush=True)
        runtime.backends.start_reconciling(lambda: open_stores(root), on_fatal=liveness.died)
        if scheduler_enabled:
            runtime.scheduler.start()
        while not received and not liveness.dead.wait(SIGNAL_POLL_SECONDS):
            pass
        if received:
            log.info("signal %s: shutting down", received[0])
    finally:
        server.close()
        runtime.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if liveness.dead.is_set():
        down = ", ".join(f"{name} {state}" for name, state in liveness.states().items() if state != "up")
        print(f"Error: serve stopped because a loop died: {down}", file=err)
        return 1
    return 0


COMMANDS = {
    "config": cmd_config_render, "init": cmd_init, "serve": cmd_serve, "start": cmd_start,
    "stop": cmd_stop, "approve": cmd_approve, "send": cmd_send, "status": cmd_status,
    "messages": cmd_messages, "activations": cmd_activations, "turns": cmd_activations,
    "artifacts": cmd_artifacts, "events": cmd_events, "tick": cmd_tick, "gc": cmd_gc,
}


def main(argv=None, out=None, err=None):
    """Run one CLI command; returns the exit code (0 or 1)."""
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("SUZUMIO_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=err)
    try:
        command, rest, options = parse_args(argv)
    except UsageError:
        out.write(USAGE)
        return 1
    try:
        return COMMANDS[command](rest, options, out, err)
    except SuzumioError as error:
        print(f"Error: {error}", file=err)
        return 1
    except OSError as error:
        print(f"Error: {error}", file=err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
