"""Suzumio command line and composition root.

Parses the CLI (docs/cli.md), builds the runtime from arguments — store root, backends, scheduler,
toolpack runtime and the WSGI app — and runs Waitress for `serve`. Nothing is built at import time."""
import ctypes
import hashlib
import json
import logging
import os
import resource
import secrets
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import suzumio_config
import suzumio_config_schema
import suzumio_egress
import suzumio_resources
import suzumio_store
import suzumio_tls
import suzumio_warm
from suzumio_cli_args import UsageError, parse_args, parse_limit
from suzumio_errors import SuzumioError
from suzumio_records import format_ts, parse_ts, to_datetime, utc_now

log = logging.getLogger(__name__)

SIGNAL_POLL_SECONDS = 0.2
LOW_DESCRIPTOR_LIMIT = 4096
M_ARENA_MAX = -8  # glibc's mallopt parameter numbers
M_MMAP_THRESHOLD = -3
MALLOC_ARENAS = 2
MMAP_THRESHOLD_BYTES = 128 * 1024
TRIM_INTERVAL_SECONDS = 60.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")
RUNNER_SOCKET = "runner.sock"
# sun_path holds 108 bytes on Linux and 104 on macOS, both with the terminating NUL.
UNIX_PATH_LIMIT = 103


def open_root(options, observer=None):
    return suzumio_store.Root(suzumio_store.resolve_root(options.root, os.environ), observer=observer)


def runner_socket_path(root_path):
    """Where `serve` listens for runners: <root>/run/runner.sock, or, when that path is too long for
    AF_UNIX, /tmp/suzumio-run-<sha256(root)[:16]>/runner.sock."""
    root_path = Path(os.path.abspath(root_path))
    path = root_path / suzumio_store.RUN_DIR / RUNNER_SOCKET
    if len(os.fsencode(path)) <= UNIX_PATH_LIMIT:
        return path
    digest = hashlib.sha256(os.fsencode(root_path)).hexdigest()[:16]
    return Path("/tmp") / f"suzumio-run-{digest}" / RUNNER_SOCKET


def prepare_runner_socket_dir(socket_path):
    """Create the socket's directory (mode 0755) and check it: it is bind-mounted into every container,
    so it must be ours, a real directory, and hold nothing but the socket."""
    directory = socket_path.parent
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SuzumioError(f"Runner socket directory {directory} is not a directory")
    if info.st_uid != os.getuid():
        raise SuzumioError(f"Runner socket directory {directory} belongs to another user")
    os.chmod(directory, 0o755)
    # The warm and egress sockets live beside the runner socket: runners reach them there.
    others = sorted(name for name in os.listdir(directory)
                    if name not in (socket_path.name, suzumio_warm.WARM_SOCKET, suzumio_egress.EGRESS_SOCKET))
    if others:
        raise SuzumioError(f"Runner socket directory {directory} holds other files ({', '.join(others[:3])}); "
                           "it is mounted into every container, so it may hold only the socket")
    if socket_path.exists() and not stat.S_ISSOCK(os.lstat(socket_path).st_mode):
        raise SuzumioError(f"Runner socket path {socket_path} exists and is not a socket")


def live_runner_socket(root_path):
    """The root's runner socket when one exists (a `serve` listens there), else None: activations that
    a CLI command starts then reach the controller through backend.controllerUrl."""
    path = runner_socket_path(root_path)
    try:
        return path if stat.S_ISSOCK(os.lstat(path).st_mode) else None
    except OSError:
        return None


def api_token_path(root_path):
    return Path(root_path) / suzumio_store.API_TOKEN_FILE


def read_api_token(root_path):
    """The token `serve` keeps in <root>/api-token (for HTTP clients on this machine), or None."""
    try:
        return api_token_path(root_path).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def root_api_token(root_path):
    """The token in <root>/api-token (kept mode 0600), or a new one written there."""
    path = api_token_path(root_path)
    token = read_api_token(root_path)
    if token:
        os.chmod(path, 0o600)
        return token
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(token + "\n")
    return token


def parse_listen(value):
    """`HOST:PORT` (an IPv6 host in brackets) → (host, port); raises SuzumioError."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise SuzumioError(f"Invalid --runner-listen: {value} (expected HOST:PORT)")
    return host, int(port)


class Runtime:
    """The collaborators of one process, built from the root: backends, toolpack runtime, scheduler.
    Imported lazily so that `config render`, `status` and friends never load Docker or Bottle.
    `runner_socket`: where runners reach the controller (None: backend.controllerUrl); `controller_ca`:
    the PEM CA runners verify a TLS runner listener against."""

    def __init__(self, root, runner_socket=None, on_fatal=None, warm_limit=0, max_activations=None,
                 controller_ca=None):
        import suzumio_backend
        import suzumio_backend_reconcile
        import suzumio_mcp
        import suzumio_model_proxy
        import suzumio_scheduler
        import suzumio_toolpacks

        self.root = root
        self.mcp = suzumio_mcp.McpHub()  # MCP sessions: none start until a project needs one
        # the one ConfigCache of the process: ticks, routes and toolpacks read the same ProjectConfig
        self.configs = suzumio_config.ConfigCache(mcp_tools=self.mcp.listing)
        self.toolpacks = suzumio_toolpacks.ToolpackRuntime(self.configs, mcp=self.mcp)
        # Prepared runners only in serve: a CLI command's process ends before one is claimed.
        if controller_ca is None:
            # A CLI command's swarm (and local) runners reach a TLS runner listener with the CA that
            # serve published.
            controller_ca = suzumio_tls.published_ca(root.path)
        self.backends = suzumio_backend.Backends(runner_socket=runner_socket, warm_limit=warm_limit,
                                                 configs=self.configs, controller_ca=controller_ca)
        self.reconciler = suzumio_backend_reconcile.Reconciler(self.backends)
        self.model_proxy = suzumio_model_proxy.ModelProxy(os.environ)  # the keys stay in this process
        self.scheduler = suzumio_scheduler.Scheduler(root, self.backends, self.configs, hooks=self.toolpacks,
                                                     on_fatal=on_fatal, max_activations=max_activations)

    def close(self):
        """Shutdown order of docs/design/README.md after HTTP: scheduler, backend watchers, Node host, stores."""
        self.scheduler.stop()
        self.reconciler.close()
        self.backends.close()
        self.toolpacks.close()
        self.root.close()


# ----------------------------------------------------------------------------------------------
# Commands: each returns the exit code and raises SuzumioError on failure. Stores come from the
# Root, which owns and closes them.


def print_json(value, out):
    """`--json`: one stable document (sorted keys, two-space indent, UTF-8 as is), then a newline."""
    out.write(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def relative_time(timestamp, now):
    """`12s ago`, `5m ago`, `3h ago`, `2d ago` (a timestamp in the future reads `just now`)."""
    if not timestamp:
        return "-"
    seconds = int((to_datetime(now) - parse_ts(timestamp)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago" if seconds > 0 else "just now"


def columns(rows, indent=""):
    """Rows of cells as aligned text columns (the last cell is never padded)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["".join([indent] + [cell.ljust(width + 2) for cell, width in zip(row, widths, strict=False)]
                    + [row[-1]]).rstrip() for row in rows]


def report_unknown_keys(lines, err):
    for line in lines:
        print(line, file=err)


def cmd_config_render(rest, options, out, err, now):
    if options.check:
        import suzumio_mcp

        hub = suzumio_mcp.McpHub()
        try:
            config = suzumio_config.load_project(
                rest[0], strict=bool(options.strict),
                mcp_tools=lambda toolpack_id, mcp: suzumio_mcp.checking(toolpack_id, mcp, hub))
        finally:
            hub.close()
    else:
        config = suzumio_config.load_project(rest[0], strict=bool(options.strict))
    report_unknown_keys(config.unknown_keys, err)
    for line in config.network_report() + config.warnings:
        print(line, file=err)
    out.write(config.render())
    return 0


def cmd_init(rest, options, out, err, now):
    import suzumio_repository

    config = suzumio_config.load_project(rest[0])
    report_unknown_keys(config.unknown_keys, err)
    for line in config.warnings:
        print(line, file=err)
    if config.repository is not None:
        suzumio_repository.check_source(config.repository)
    root = open_root(options)
    try:
        store = root.init_project(
            name=config.data["name"], task=config.data["task"], config=config.data, agents=config.agents,
            source_text=config.source_text, resolved_text=config.render())
        print(f"Initialized {store.project_id}", file=out)
        print(f"Root: {store.dir}", file=out)
        if config.repository is not None:
            git_dir = suzumio_repository.create_repository(store.dir, config.repository)
            print(f"Repository: {git_dir} (integration branch {suzumio_repository.integration_branch(git_dir)})",
                  file=out)
    finally:
        root.close()
    return 0


def cmd_status(rest, options, out, err, now):
    root = open_root(options)
    try:
        projects = []
        for name in rest or root.list_projects():
            store = root.open_project(name)
            projects.append((store.project(), store.list_agents(), store.model_costs(), store.egress_totals()))
    finally:
        root.close()
    if options.json:
        # Tokens and USD the controller saw, per project and agent (costUsd null without prices)
        print_json([{"id": project["id"], "status": project["status"], "updatedAt": project["updated_at"],
                     "tokens": costs["project"]["tokens"], "costUsd": costs["project"]["costUsd"],
                     "agents": [{**{key: agent.get(key) for key in STATUS_AGENT_FIELDS},
                                 **({"paused": agent["paused"]} if agent.get("paused") else {}),
                                 "costUsd": costs["agents"].get(agent["id"], {}).get("costUsd"),
                                 "egress": egress.get(agent["id"], dict(NO_EGRESS))}
                                for agent in agents]}
                    for project, agents, costs, egress in projects], out)
        return 0
    for project, agents, costs, egress in projects:
        spent = costs["project"]
        usage = f"  {spent['tokens']} tokens{money(spent['costUsd'], '  ')}" if spent["calls"] else ""
        print(f"{project['id']}  {project['status']}{usage}", file=out)
        if agents:
            priced = spent["costUsd"] is not None  # the cost column only once some call had prices
            rows = [(agent["id"], agent_status_text(agent), agent.get("activeActivationId") or "-",
                     relative_time(agent.get("updatedAt"), now))
                    + ((money(costs["agents"].get(agent["id"], {}).get("costUsd")) or "-",) if priced else ())
                    + ((egress_summary(egress.get(agent["id"], NO_EGRESS)),) if egress else ())
                    for agent in agents]
            for line in columns(rows, indent="  "):
                print(line, file=out)
    return 0


STATUS_AGENT_FIELDS = ("id", "status", "role", "activeActivationId", "updatedAt")
NO_EGRESS = {"connections": 0, "denied": 0, "bytesIn": 0, "bytesOut": 0}


def egress_summary(totals):
    """`egress 3 out, 1 denied, 12.5 kB`: an agent's connections through the egress proxy."""
    size = totals["bytesIn"] + totals["bytesOut"]
    amount = f"{size} B" if size < 1000 else f"{size / 1000:.1f} kB" if size < 10**6 else f"{size / 10**6:.1f} MB"
    return f"egress {totals['connections']} out, {totals['denied']} denied, {amount}"


def agent_status_text(agent):
    """An agent's status in `status` text; a loop guard's pause names its rule."""
    paused = agent.get("paused")
    return f"{agent['status']} paused ({paused.get('rule')})" if paused else agent["status"]


def money(cost, prefix=""):
    """`$0.0123` for a cost in USD, "" when nothing was priced."""
    return "" if cost is None else f"{prefix}${cost:.4f}"


def cmd_messages(rest, options, out, err, now):
    with project_store(options, rest[0]) as store:
        messages = store.list_messages(parse_limit(options.limit), full_body=True)
    if options.json:
        print_json(messages, out)
        return 0
    for message in messages:
        target = message.get("recipient") or message.get("channel")
        print(file=out)
        print(f"{message['id']} {message['createdAt']} ({relative_time(message['createdAt'], now)}) "
              f"{message['sender']} -> {target} [{message['priority']}]", file=out)
        print(message["body"], file=out)
    return 0


def cmd_activations(rest, options, out, err, now):
    with project_store(options, rest[0]) as store:
        activations = store.list_activations(parse_limit(options.limit))
    if options.json:
        print_json(activations, out)
        return 0
    for activation in activations:
        print(file=out)
        print(f"{activation['id']} {activation['agentId']} {activation['status']} "
              f"{activation['startedAt']} ({relative_time(activation['startedAt'], now)})", file=out)
        if activation.get("text"):
            print(activation["text"], file=out)
        if activation.get("error"):
            print(activation["error"], file=out)
    return 0


def cmd_events(rest, options, out, err, now):
    with project_store(options, rest[0]) as store:
        events = list(reversed(store.list_events(parse_limit(options.limit))))
    if options.json:
        print_json([{"id": event["id"], "type": event["type"], "createdAt": event["created_at"],
                     "data": json.loads(event["data_json"])} for event in events], out)
        return 0
    for event in events:
        print(f"{event['created_at']} {event['type']} {event['data_json']}", file=out)
    return 0


def cmd_artifacts(rest, options, out, err, now):
    """Without a path, every agent's artifact files; with `<agent>/<path>`, that file (or --version N)."""
    import suzumio_output

    with project_store(options, rest[0]) as store:
        if len(rest) == 1:
            files = suzumio_output.artifact_files(store)
        else:
            version = None if options.version is None else suzumio_output.version_number(options.version)
            found = suzumio_output.artifact(store, rest[1], version)
    if options.json:
        print_json(files if len(rest) == 1 else suzumio_output.artifact_json(found), out)
        return 0
    if len(rest) == 1:
        for item in files:
            versions = f"{item['versions']} version{'' if item['versions'] == 1 else 's'}"
            print(f"{item['agent']}/{item['path']} {item['size']} bytes, {versions}", file=out)
        return 0
    text = suzumio_output.as_text(found["data"])
    if text is None:
        if not hasattr(out, "buffer"):
            raise SuzumioError(f"{rest[1]} is binary ({found['size']} bytes); print it to a terminal or file")
        out.flush()
        out.buffer.write(found["data"])
    else:
        out.write(text)
    return 0


def cmd_report(rest, options, out, err, now):
    import suzumio_output

    with project_store(options, rest[0]) as store:
        answer = suzumio_output.report(store)
    if answer["report"] is None:
        raise SuzumioError(f"No report submitted for {rest[0]} yet (it is {answer['status']})")
    out.write(answer["report"] if answer["report"].endswith("\n") else answer["report"] + "\n")
    return 0


def cmd_request_changes(rest, options, out, err, now):
    import suzumio_coordination

    with project_store(options, rest[0]) as store:
        config = suzumio_config.ProjectConfig.from_data(store.config())
        message = suzumio_coordination.request_changes(store, config, " ".join(rest[1:]), submitted_only=True)
        print(f"{store.project_id}: running; sent {message['id']} to {message['recipient']}", file=out)
    return tick_projects(options, [rest[0]], err)


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


def cmd_send(rest, options, out, err, now):
    project, recipient, priority = rest[0], rest[1], rest[2]
    root = open_root(options)
    try:
        store = root.open_project(project)
        import suzumio_coordination

        config = suzumio_config.ProjectConfig.from_data(store.config())
        message = suzumio_coordination.send_message(store, config, "user", " ".join(rest[3:]), recipient=recipient,
                                                    priority=priority)
        print(f"Sent {message['id']}", file=out)
    finally:
        root.close()
    return tick_projects(options, [project], err)


def check_mcp_servers(store):
    """Start a project's controller-side MCP servers once and list their tools; raises one line per failure."""
    import suzumio_mcp

    config = suzumio_config.ProjectConfig.from_data(store.config())
    entries = [entry for entry in config.toolpack_entries if isinstance(entry, dict)
               and "mcp" in entry and entry["mcp"].get("where", "controller") == "controller"]
    if not entries:
        return
    hub = suzumio_mcp.McpHub()
    try:
        failures = [hub.check(entry["id"], entry["mcp"]) for entry in entries]
    finally:
        hub.close()
    failures = [line for line in failures if line]
    if failures:
        raise SuzumioError("; ".join(failures))


def cmd_start(rest, options, out, err, now):
    root = open_root(options)
    try:
        store = root.open_project(rest[0])
        report_unknown_keys(stored_unknown_keys(store), err)
        check_mcp_servers(store)
        store.start()
        print(f"{store.project_id}: running", file=out)
    finally:
        root.close()
    return tick_projects(options, rest, err)


def stored_unknown_keys(store):
    """The unknown keys of the project file as read at init (`source.yaml`; imports are not followed)."""
    import suzumio_yaml

    try:
        tree = suzumio_yaml.apply_extends(suzumio_yaml.parse_yaml(
            (store.dir / "source.yaml").read_text(encoding="utf-8"), "source.yaml"))
    except (OSError, SuzumioError):
        return []
    return suzumio_config_schema.unknown_keys(tree)


def cmd_stop(rest, options, out, err, now, *, approve=False):
    import suzumio_scheduler

    root = open_root(options)
    runtime = Runtime(root, live_runner_socket(root.path))
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


def cmd_approve(rest, options, out, err, now):
    return cmd_stop(rest, options, out, err, now, approve=True)


def approval_line(row, now):
    """One approval request in `approvals` text: id, status, agent, tool, time, then the input as JSON."""
    decided = f" {row['decision']} via {row['decidedBy']}" if row.get("decidedBy") else ""
    when = row.get("decidedAt") or row["createdAt"]
    head = (f"{row['id']} {row['status']}{decided} {row['agentId']} {row['tool']} "
            f"({relative_time(when, now)})")
    lines = [head, "  input: " + json.dumps(row["input"], ensure_ascii=False, sort_keys=True)]
    if row["status"] == "pending":
        lines.append(f"  expires: {row['expiresAt']}")
    if row.get("note"):
        lines.append(f"  note: {row['note']}")
    return "\n".join(lines)


def cmd_approvals(rest, options, out, err, now):
    import suzumio_approvals

    with project_store(options, rest[0]) as store:
        rows = suzumio_approvals.list_approvals(store, limit=parse_limit(options.limit))
    if options.json:
        print_json(rows, out)
        return 0
    if not rows:
        print("No approval requests.", file=out)
    for row in rows:
        print(approval_line(row, now), file=out)
    return 0


def cmd_decide(rest, options, out, err, now, *, decision):
    import suzumio_approvals

    text = " ".join(rest[2:]).strip() or None
    body = {"decision": decision, "note": text if decision == "deny" else None,
            "output": text if decision == "respond" else None}
    if decision == "allow" and options.always:
        if options.input is not None:
            raise SuzumioError("--input cannot be combined with --always")
        body["decision"] = "allow-always"
    if options.input is not None:
        try:
            body["input"] = json.loads(options.input)
        except ValueError as error:
            raise SuzumioError(f"Invalid --input: not JSON ({error})") from None
    with project_store(options, rest[0]) as store:
        decided = suzumio_approvals.check_decision(body)
        config = suzumio_config.ProjectConfig.from_data(store.config()) if decided["input"] is not None else None
        row = suzumio_approvals.decide(store, rest[1], **decided, config=config, via="cli")
    if options.json:
        print_json(row, out)
    else:
        print(f"{row['id']}: {row['status']} ({row['decision']})", file=out)
    return 0


def cmd_resume(rest, options, out, err, now):
    import suzumio_guards

    with project_store(options, rest[0]) as store:
        agent = suzumio_guards.resume(store, rest[1], via="cli")
    if options.json:
        print_json(agent, out)
    else:
        print(f"{agent['id']}: resumed", file=out)
    return 0


def cmd_tick(rest, options, out, err, now):
    return tick_projects(options, rest, err, every=not rest)


def cmd_gc(rest, options, out, err, now):
    """Remove the activation containers a project no longer needs (backend.docker.keep), or those of
    every project; their log tails are kept in the activation folders."""
    import suzumio_backend
    import suzumio_backend_reconcile
    import suzumio_repository

    root = open_root(options)
    backends = suzumio_backend.Backends()
    reconciler = suzumio_backend_reconcile.Reconciler(backends)
    try:
        names = rest or root.list_projects()
        stores = [root.open_project(name) for name in names]
        for store in stores:
            config = suzumio_config.ProjectConfig.from_data(store.config())
            if config.repository is not None:
                scratch = suzumio_repository.remove_scratch(store)
                print(f"{store.project_id}: removed {scratch} scratch cop{'y' if scratch == 1 else 'ies'}", file=out)
            if config.backend.kind not in suzumio_backend.CONTAINER_KINDS and not rest:
                continue
            try:
                removed = reconciler.collect_garbage(store, config, runner_socket_path(root.path))
            except suzumio_backend.engine_errors() as error:
                raise SuzumioError(f"Docker engine unavailable: {error}") from None
            print(f"{store.project_id}: removed {removed} container{'' if removed == 1 else 's'}", file=out)
    finally:
        backends.close()
        root.close()
    return 0


REPO_VIEWS = ("log", "diff", "queue", "export")


def cmd_repo(rest, options, out, err, now):
    """docs/cli.md `repo`: the team's repository as people read it."""
    import suzumio_repository

    view = rest[1] if len(rest) > 1 else "log"
    if view not in REPO_VIEWS:
        raise SuzumioError(f"repo: unknown view {view} (one of {', '.join(REPO_VIEWS)})")
    root = open_root(options)
    try:
        store = root.open_project(rest[0])
        config = suzumio_config.ProjectConfig.from_data(store.config())
        if view == "export":
            if bool(options.into) == bool(options.bundle):
                raise SuzumioError("repo export: give --into DIR or --bundle FILE")
            answer = {"path": suzumio_repository.export(store, config, into=options.into, bundle=options.bundle)}
        elif view == "diff":
            answer = suzumio_repository.diff(store, config, getattr(options, "from"), options.to)
        else:
            answer = suzumio_repository.overview(store, config, format_ts(to_datetime(now)))
    finally:
        root.close()
    if options.json:
        print_json(answer["queue"] if view == "queue" else answer, out)
    elif view == "export":
        print(f"Exported to {answer['path']}", file=out)
    elif view == "diff":
        out.write(answer["diff"] + "\n")
    elif view == "queue":
        for request in answer["queue"]:
            landed = request.get("commit", "")[:12] if request["status"] == "merged" else request.get("reason", "")
            print(f"{request['id']}  {request['agent']:<12} {request['status']:<8} {landed:<12} {request['message']}",
                  file=out)
    else:
        print(f"{answer['branch']} at {answer['head'][:12]}", file=out)
        for entry in answer["log"][:parse_limit(options.limit)]:
            print(f"  {entry['commit'][:12]}  {entry['author']:<12} {entry['subject']}", file=out)
        for branch in answer["branches"]:
            print(f"{branch['name']} at {branch['head'][:12]}: {branch['ahead']} ahead, {branch['behind']} behind",
                  file=out)
    return 0


def tick_projects(options, names, err, every=False):
    """One scheduler pass per project (docs/cli.md). Over every project an error is reported per
    project and the rest go on; for a named project it is the command's error."""
    root = open_root(options)
    runtime = Runtime(root, live_runner_socket(root.path))
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


def cmd_serve(rest, options, out, err, now):
    port_text = options.port if options.port is not None else "39400"
    if not port_text.isdigit() or int(port_text) > 65535:
        raise SuzumioError(f"Invalid port: {port_text}")
    runner_listen = parse_listen(options.runner_listen) if options.runner_listen is not None else None
    runner_tls_files = (options.runner_cert, options.runner_key, options.runner_ca)
    if runner_listen is None and any(runner_tls_files):
        raise SuzumioError("--runner-cert, --runner-key and --runner-ca apply only with --runner-listen")
    if (options.runner_cert is None) != (options.runner_key is None):
        raise SuzumioError("--runner-cert and --runner-key go together")
    if options.runner_ca is not None and options.runner_cert is None:
        raise SuzumioError("--runner-ca needs --runner-cert and --runner-key")
    import suzumio_telemetry

    # The only place the OTEL_* variables are read: once, here
    # (docs/spec-notes.md#traces-a-standard-library-otlp-encoder).
    endpoint = suzumio_telemetry.endpoint_from(options.otlp_endpoint, os.environ)
    tracer = suzumio_telemetry.Tracer(endpoint, headers=suzumio_telemetry.headers_from(os.environ))
    root = open_root(options, observer=tracer)
    if options.no_auth:
        api_token = None
    elif options.api_token_env is not None:
        api_token = os.environ.get(options.api_token_env)
        if not api_token:
            raise SuzumioError(f"API token variable {options.api_token_env} is not set")
    else:
        api_token = root_api_token(root.path)
    host = options.host or "127.0.0.1"
    warm_text = options.warm if options.warm is not None else str(suzumio_warm.DEFAULT_LIMIT)
    if not warm_text.isdigit():
        raise SuzumioError(f"Invalid --warm: {warm_text} (expected a whole number)")
    cap_text = options.max_activations
    if cap_text is not None and (not cap_text.isdigit() or int(cap_text) < 1):
        raise SuzumioError(f"Invalid --max-activations: {cap_text} (expected a whole number of at least 1)")
    runner_tls = None
    if runner_listen is not None:
        if options.runner_cert is not None:
            runner_tls = suzumio_tls.operator_tls(*runner_tls_files)
        else:
            runner_tls = suzumio_tls.generated_tls(root.path, runner_listen[0])
    return serve(root, host=host, port=int(port_text), threads=int(options.threads or 32),
                 scheduler_enabled=not options.no_scheduler, allowed_hosts=tuple(options.allow_host or ()),
                 api_token=api_token, runner_listen=runner_listen, out=out, err=err, tracer=tracer,
                 warm=int(warm_text), max_activations=None if cap_text is None else int(cap_text),
                 runner_tls=runner_tls)


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


def glibc():
    """The C library when it is glibc (mallopt and malloc_trim exist), else None (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def tune_malloc(arenas=MALLOC_ARENAS, mmap_threshold=MMAP_THRESHOLD_BYTES):
    """Make glibc's malloc give freed memory back, before the worker threads start. With one arena per
    busy thread (up to 8 per core) and a mmap threshold that rises with every large buffer freed, the
    HTTP workers' short-lived large buffers (runner bodies, activation histories) end up spread over
    dozens of arenas and the resident size climbs for hours although the live heap is flat
    (bench/soak_teams.py: 174 -> 305 MiB in 6 minutes). Two arenas and a fixed threshold (larger buffers
    are mapped and unmapped on their own) keep it level; release_free_memory() returns the rest."""
    libc = glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas)) and bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold))


def release_free_memory():
    """Give the free pages inside malloc's arenas back to the system (serve calls it every minute)."""
    libc = glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def open_stores(root):
    """The stores of every project in the root, skipping one removed between listing and opening."""
    stores = []
    for name in root.list_projects():
        try:
            stores.append(root.open_project(name))
        except SuzumioError as error:
            log.warning("project %s skipped: %s", name, error)
    return stores


def url_host(host):
    return f"[{host}]" if ":" in host else host


def warn_unused_controller_urls(root, err):
    """backend.controllerUrl is read only with --runner-listen: say so for every project that sets one,
    and that a swarm project's activations cannot start without it."""
    for name in root.list_projects():
        try:
            backend = suzumio_config.ProjectConfig.from_data(root.open_project(name).config()).backend
        except SuzumioError:
            continue
        url = backend.controller_url
        if backend.kind == suzumio_config.KIND_SWARM:
            import suzumio_backend
            print(f"Error: {name}: every activation will fail: {suzumio_backend.SWARM_NEEDS_LISTENER}", file=err)
        elif url != suzumio_config_schema.DEFAULT_CONTROLLER_URL:
            print(f"Warning: {name}: backend.controllerUrl ({url}) is not used: runners reach this controller "
                  "over its runner socket (it applies only with serve --runner-listen)", file=err)


def serve(root, *, host, port, threads, scheduler_enabled, allowed_hosts, api_token, out, err,
          runner_listen=None, tracer=None, warm=0, max_activations=None, runner_tls=None):
    """Run the controller until SIGINT/SIGTERM: the user listener (host:port), the runner listener (the
    root's runner socket, or TLS on `runner_listen` (host, port) with `runner_tls`, a suzumio_tls.RunnerTls),
    scheduler, reconciliation (docs/cli.md). Returns 1 when one of its loops died (Liveness), else 0."""
    import suzumio_api
    import suzumio_runner_support
    if api_token is None:
        who = ("any local process, agent tools on the local backend included," if host in LOOPBACK
               else f"anyone who can reach {host}")
        print(f"Warning: --no-auth: the user API takes no token; {who} controls every project", file=err)
    # The runner socket is served with --runner-listen too: docker-chat runners reach the controller
    # only there, without a network.
    socket_path = runner_socket_path(root.path)
    prepare_runner_socket_dir(socket_path)
    descriptors = raise_descriptor_limit(err)
    tune_malloc()
    liveness = Liveness(["http", "runner-http", "reconciler"] + (["scheduler"] if scheduler_enabled else []))
    if runner_listen is not None:
        if runner_tls is None:
            raise SuzumioError("serve --runner-listen needs the listener's TLS certificate")
        suzumio_tls.publish_ca(root.path, runner_tls.ca_pem)
    else:
        # CLI commands' runners would take it for a TLS listener that no longer runs.
        suzumio_tls.unpublish_ca(root.path)
    runtime = Runtime(root, socket_path, on_fatal=liveness.died, warm_limit=warm, max_activations=max_activations,
                      controller_ca=None if runner_tls is None else runner_tls.ca_pem)
    servers = []
    egress = None
    received = []
    previous = {}
    try:
        if runner_listen is None:
            warn_unused_controller_urls(root, err)
        app = suzumio_api.make_app(root, runtime.scheduler, runtime.backends, runtime.toolpacks,
                                   api_token=api_token, allowed_hosts=allowed_hosts, bound_host=host,
                                   liveness=liveness.states)
        runner_app = suzumio_runner_support.make_runner_app(root, runtime.toolpacks, runtime.scheduler,
                                                              runtime.model_proxy, tracer)
        # Half the descriptors for connections (of both listeners), the rest for databases, runner logs,
        # pipes and engine calls.
        limit = min(suzumio_api.CONNECTION_LIMIT, descriptors // 4)
        server = suzumio_api.Server(app, host, port, threads=threads, connection_limit=limit,
                                    on_fatal=liveness.died)
        servers.append(server)

        def runner_died(_component, error):
            liveness.died("runner-http", error)

        runner_server = suzumio_api.Server(runner_app, threads=threads, connection_limit=limit,
                                           on_fatal=runner_died, unix_socket=socket_path, name="suzumio-runner-http")
        servers.append(runner_server)
        egress_socket = socket_path.parent / suzumio_egress.EGRESS_SOCKET
        tls_server = None
        if runner_listen is not None:
            # Its egress tunnels (ALPN) go to the same proxy socket as the runner socket's neighbours.
            tls_server = suzumio_tls.TlsRunnerListener(runner_app, runner_listen[0], runner_listen[1], runner_tls,
                                                       egress_socket=egress_socket, threads=threads,
                                                       connection_limit=limit, on_fatal=runner_died,
                                                       name="suzumio-runner-tls-http")
            servers.append(tls_server)
        # The controller's own listeners are never a destination, whatever an allowlist says.
        own = [(host, server.port)] + ([(runner_listen[0], tls_server.port)] if tls_server else [])
        egress = suzumio_egress.EgressProxy(root, runtime.configs, own_listeners=lambda: own)
        egress.listen_unix(egress_socket)
        # The handlers only record the signal: appending to a list takes no lock, so a signal can never
        # deadlock on one the main thread holds (Event.set would). The main thread shuts down in order.
        previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        for runner in (runner_server, tls_server):
            if runner is not None:
                runner.start()
        egress.start()
        if tracer is not None and tracer.enabled:
            tracer.start()
            print(f"suzumio exporting traces to {tracer.endpoint}", file=err, flush=True)
        server.start()
        base = f"http://{host}:{server.port}"
        print(f"suzumio listening on {base}", file=out)
        print(f"Control room: {base}/" + (f"?token={api_token}" if api_token else ""), file=out)
        if tls_server is None:
            print(f"Runner listener: unix://{socket_path}", file=out, flush=True)
        else:
            print(f"Runner listener: https://{url_host(runner_listen[0])}:{tls_server.port}", file=out)
            print(f"Runner socket: unix://{socket_path}", file=out, flush=True)
        runtime.reconciler.start_reconciling(lambda: open_stores(root), on_fatal=liveness.died)
        if scheduler_enabled:
            runtime.scheduler.start()
        trimmed = time.monotonic()
        while not received and not liveness.dead.wait(SIGNAL_POLL_SECONDS):
            if time.monotonic() - trimmed >= TRIM_INTERVAL_SECONDS:
                release_free_memory()
                trimmed = time.monotonic()
        if received:
            log.info("signal %s: shutting down", received[0])
    finally:
        for server in servers:
            server.close()
        if egress is not None:
            egress.close()
        runtime.close()
        if tracer is not None:
            tracer.close()  # after the runtime: the last activation spans are exported
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if liveness.dead.is_set():
        down = ", ".join(f"{name} {state}" for name, state in liveness.states().items() if state != "up")
        print(f"Error: serve stopped because a loop died: {down}", file=err)
        return 1
    return 0


def cmd_toolpacks(rest, options, out, err, now):
    """Every toolpack of a project with its kind, state and tools (MCP servers are started to list)."""
    root = open_root(options)
    runtime = Runtime(root, live_runner_socket(root.path))
    try:
        store = runtime.root.open_project(rest[0])
        for row in runtime.toolpacks.toolpack_listing(store):
            print(f"{row['id']}  {row['kind']}  {row['state']}", file=out)
            for name in row["tools"]:
                print(f"  {name}", file=out)
    finally:
        runtime.close()
    return 0


def cmd_mcp(rest, options, out, err, now):
    """Serve Suzumio's MCP tools over stdio (for desktop MCP clients)."""
    import suzumio_mcp_server

    root = open_root(options)
    return suzumio_mcp_server.serve_stdio(root, Runtime(root, live_runner_socket(root.path)), sys.stdin, out)


def cmd_watch(rest, options, out, err, now):
    """Print the project's live stream (suzumio_watch) until the controller closes it."""
    import suzumio_watch
    root_path = suzumio_store.resolve_root(options.root, os.environ)
    if options.api_token_env:
        token = os.environ.get(options.api_token_env)
        if not token:
            raise SuzumioError(f"--api-token-env {options.api_token_env}: the variable is not set")
    else:
        token = read_api_token(root_path)
    try:
        return suzumio_watch.watch(options.url or "http://127.0.0.1:39400", rest[0], token, out,
                                   once=bool(options.once))
    except KeyboardInterrupt:
        return 0


def read_config_option(options):
    """The text of --config FILE, or None."""
    if options.config is None:
        return None
    try:
        return Path(options.config).read_text(encoding="utf-8")
    except OSError as error:
        raise SuzumioError(f"Cannot read {options.config}: {error.strerror}") from None


def cmd_replay(rest, options, out, err, now):
    import suzumio_replay

    name = getattr(options, "as")
    if not name:
        raise SuzumioError("--as NAME is required")
    root = open_root(options)
    try:
        store = suzumio_replay.create_replay(root, rest[0], name, tools=options.tools or "live",
                                             on_diverge=options.on_diverge or "stop",
                                             config_text=read_config_option(options))
        print(f"Replaying {rest[0]} as {store.project_id}", file=out)
    finally:
        root.close()
    code = tick_projects(options, [name], err)
    return wait_for_replay(options, name, out) if options.wait and code == 0 else code


def wait_for_replay(options, name, out):
    """--wait: poll the replay (its runners and `serve` write it from other processes) until it is no
    longer running or diverged and none of its activations still runs (a submission comes before its
    activation's output: a diff right after must see the whole run); 1 when it diverged."""
    root = open_root(options)
    try:
        store = root.open_project(name)
        while True:
            origin, status = store.origin(), store.project()["status"]
            ended = origin["diverged"] is not None or status != "running"
            if ended and not store.running_activations():
                break
            time.sleep(SIGNAL_POLL_SECONDS)
        diverged = origin["diverged"]
        if diverged is not None:
            print(f"{name}: diverged at {diverged['agentId']} {diverged['activationId']} request "
                  f"{diverged['requestIndex']}\n{diverged['diff']}", file=out)
        print(f"{name}: {status}", file=out)
        return 1 if diverged is not None else 0
    finally:
        root.close()


def cmd_fork(rest, options, out, err, now):
    import suzumio_replay

    name = getattr(options, "as")
    if not name:
        raise SuzumioError("--as NAME is required")
    if not options.at:
        raise SuzumioError("--at ACTIVATION is required")
    root = open_root(options)
    try:
        store = suzumio_replay.create_fork(root, rest[0], name, options.at, config_text=read_config_option(options))
        print(f"Forked {rest[0]} at {options.at} as {store.project_id}", file=out)
    finally:
        root.close()
    return tick_projects(options, [name], err)


def cmd_diff(rest, options, out, err, now):
    import suzumio_diff

    root = open_root(options)
    try:
        result = suzumio_diff.diff_projects(root.open_project(rest[0]), root.open_project(rest[1]))
    finally:
        root.close()
    if options.json:
        print(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False), file=out)
    else:
        print(suzumio_diff.describe(result), file=out)
    return 0 if result["identical"] else 1


COMMANDS = {
    "config": cmd_config_render, "init": cmd_init, "serve": cmd_serve, "start": cmd_start,
    "stop": cmd_stop, "approve": cmd_approve, "send": cmd_send, "status": cmd_status,
    "messages": cmd_messages, "activations": cmd_activations, "turns": cmd_activations,
    "artifacts": cmd_artifacts, "events": cmd_events, "tick": cmd_tick,
    "toolpacks": cmd_toolpacks, "mcp": cmd_mcp, "approvals": cmd_approvals,
    "allow": lambda *a: cmd_decide(*a, decision="allow"), "deny": lambda *a: cmd_decide(*a, decision="deny"),
    "respond": lambda *a: cmd_decide(*a, decision="respond"), "resume": cmd_resume,
    "gc": cmd_gc, "repo": cmd_repo, "watch": cmd_watch, "replay": cmd_replay, "diff": cmd_diff, "fork": cmd_fork,
    "report": cmd_report, "request-changes": cmd_request_changes,
}


def main(argv=None, out=None, err=None, now=None):
    """Run one CLI command; returns the exit code (0 or 1). `now` is the clock of relative times."""
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("SUZUMIO_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=err)
    try:
        command, rest, options = parse_args(argv)
    except UsageError as error:
        if error.exit_code:
            print(f"Error: {error}", file=err)
        out.write(error.usage())
        return error.exit_code
    if command == "--version":
        print(f"suzumio {suzumio_resources.VERSION}", file=out)
        return 0
    try:
        return COMMANDS[command](rest, options, out, err, now or utc_now())
    except SuzumioError as error:
        print(f"Error: {error}", file=err)
        return 1
    except OSError as error:
        print(f"Error: {error}", file=err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
