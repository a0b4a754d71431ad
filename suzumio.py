"""Suzumio command line and composition root.

Parses the CLI (docs/cli.md), builds the runtime from arguments — store root, backends, scheduler,
toolpack runtime and the WSGI app — and runs Waitress for `serve`. Nothing is built at import time."""
import ctypes
import dataclasses
import json
import logging
import os
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

import suzumio_config
import suzumio_config_schema
import suzumio_resources
import suzumio_runtime
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
def open_root(options, observer=None):
    return suzumio_store.Root(suzumio_store.resolve_root(options.root, os.environ), observer=observer)


def cli_runtime(options):
    """A CLI command's runtime (suzumio_runtime): no listener; runners reach a live serve's socket."""
    return suzumio_runtime.build_runtime(
        suzumio_runtime.RuntimeOptions(root=suzumio_store.resolve_root(options.root, os.environ)))


def parse_listen(value):
    """`HOST:PORT` (an IPv6 host in brackets) → (host, port); raises SuzumioError."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise SuzumioError(f"Invalid --runner-listen: {value} (expected HOST:PORT)")
    return host, int(port)


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


def cmd_examples(rest, options, out, err, now):
    """Copy the packaged examples into a folder (docs/cli.md); a file already there only with --force."""
    source = suzumio_resources.resource_path("examples")
    if not source.is_dir():
        raise SuzumioError(f"No examples in this installation (looked for {source})")
    target = Path(rest[0])
    names = sorted(path.relative_to(source) for path in source.rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts)
    there = [str(target / name) for name in names if (target / name).exists()]
    if there and not options.force:
        more = f" and {len(there) - 1} more" if len(there) > 1 else ""
        raise SuzumioError(f"{there[0]}{more} already exist; nothing written (--force overwrites)")
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target / name)
    tops = sorted({name.parts[0] + ("/" if len(name.parts) > 1 else "") for name in names})
    print(f"Wrote {len(names)} files to {target} ({', '.join(tops)})", file=out)
    print(f"Next: suzumio init {target / 'demo.yaml'}", file=out)
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
        message = suzumio_coordination.send_user_message(store, config, "user", " ".join(rest[3:]),
                                                         recipient=recipient, priority=priority)
        print(f"Sent {message['id']}", file=out)
        if message.get("note"):
            print(message["note"], file=out)
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

    runtime = cli_runtime(options)
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


def cmd_effects(rest, options, out, err, now):
    import suzumio_effects

    with project_store(options, rest[0]) as store:
        rows = suzumio_effects.list_effects(store, state=options.state, limit=parse_limit(options.limit))
    if options.json:
        print_json(rows, out)
        return 0
    if not rows:
        print("No external tool calls." if options.state is None else f"No external tool calls {options.state}.",
              file=out)
    for row in rows:
        resolved = f"  resolved {row['resolution']} {relative_time(row['resolvedAt'], now)}" \
            if row.get("resolution") else ""
        given = json.dumps(row["input"], ensure_ascii=False)[:120]
        print(f"{row['id']}  {row['state']:<8}  {row['agent']}  {row['tool']}  {row['callKey'] or '-'}  "
              f"{relative_time(row['startedAt'], now)}{resolved}  {given}", file=out)
    return 0


def cmd_resolve(rest, options, out, err, now):
    import suzumio_effects

    with project_store(options, rest[0]) as store:
        effect = suzumio_effects.resolve(store, rest[1], rest[2], note=" ".join(rest[3:]).strip() or None, via="cli")
    if options.json:
        print_json(effect, out)
    else:
        print(f"{effect['id']} resolved: {effect['resolution']} ({effect['tool']} of {effect['agent']})", file=out)
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
            if not suzumio_backend.backend_class(config.backend.kind).collects_garbage and not rest:
                continue
            try:
                removed = reconciler.collect_garbage(store, config, suzumio_runtime.runner_socket_path(root.path))
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
        if answer["truncated"]:
            print(f"repo diff: the diff is longer than this; shown up to {len(answer['diff'])} characters "
                  "(`repo export` gives the whole repository)", file=err)
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
    runtime = cli_runtime(options)
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
    if options.no_auth:
        api_token = None
    elif options.api_token_env is not None:
        api_token = os.environ.get(options.api_token_env)
        if not api_token:
            raise SuzumioError(f"API token variable {options.api_token_env} is not set")
    else:
        api_token = suzumio_runtime.GENERATED
    warm_text = options.warm if options.warm is not None else str(suzumio_warm.DEFAULT_LIMIT)
    if not warm_text.isdigit():
        raise SuzumioError(f"Invalid --warm: {warm_text} (expected a whole number)")
    cap_text = options.max_activations
    if cap_text is not None and (not cap_text.isdigit() or int(cap_text) < 1):
        raise SuzumioError(f"Invalid --max-activations: {cap_text} (expected a whole number of at least 1)")
    # The operator's certificate, else the root's own, made under the root's lock (suzumio_runtime).
    runner_tls = suzumio_tls.operator_tls(*runner_tls_files) if options.runner_cert is not None else None
    listeners = suzumio_runtime.Listeners(
        host=options.host or "127.0.0.1", port=int(port_text), threads=int(options.threads or 32),
        api_token=api_token, allowed_hosts=tuple(options.allow_host or ()), runner_listen=runner_listen,
        runner_tls=runner_tls)
    return serve(suzumio_runtime.RuntimeOptions(
        root=suzumio_store.resolve_root(options.root, os.environ), listeners=listeners,
        scheduler=not options.no_scheduler, evals=not options.no_scheduler, warm=int(warm_text),
        max_activations=None if cap_text is None else int(cap_text), tracer=tracer), out, err)


def serve(options, out, err):
    """Run the controller of `options` (a suzumio_runtime.RuntimeOptions with listeners) until SIGINT or
    SIGTERM (docs/cli.md). Returns 1 when one of its loops died (Liveness), else 0."""
    import suzumio_api

    # Half the descriptors for connections (of both listeners), the rest for databases, runner logs,
    # pipes and engine calls.
    descriptors = raise_descriptor_limit(err)
    tune_malloc()
    listeners = dataclasses.replace(options.listeners,
                                    connection_limit=min(suzumio_api.CONNECTION_LIMIT, descriptors // 4))
    runtime = suzumio_runtime.build_runtime(dataclasses.replace(options, listeners=listeners))
    received = []
    previous = {}
    try:
        if listeners.api_token is None:
            who = ("any local process, agent tools on the local backend included," if listeners.host in LOOPBACK
                   else f"anyone who can reach {listeners.host}")
            print(f"Warning: --no-auth: the user API takes no token; {who} controls every project", file=err)
        if listeners.runner_listen is None:
            warn_unused_controller_urls(runtime.root, err)
        # The handlers only record the signal: appending to a list takes no lock, so a signal can never
        # deadlock on one the main thread holds (Event.set would). The main thread shuts down in order.
        previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        runtime.start()
        tracer = options.tracer
        if tracer is not None and tracer.enabled:
            print(f"suzumio exporting traces to {tracer.endpoint}", file=err, flush=True)
        print(f"suzumio listening on {runtime.address}", file=out)
        print(f"Control room: {runtime.address}/" + (f"?token={runtime.api_token}" if runtime.api_token else ""),
              file=out)
        if runtime.tls_server is None:
            print(f"Runner listener: unix://{runtime.runner_socket}", file=out, flush=True)
        else:
            host = suzumio_runtime.url_host(listeners.runner_listen[0])
            print(f"Runner listener: https://{host}:{runtime.tls_server.port}", file=out)
            print(f"Runner socket: unix://{runtime.runner_socket}", file=out, flush=True)
        trimmed = time.monotonic()
        while not received and not runtime.liveness.dead.wait(SIGNAL_POLL_SECONDS):
            if time.monotonic() - trimmed >= TRIM_INTERVAL_SECONDS:
                release_free_memory()
                trimmed = time.monotonic()
        if received:
            log.info("signal %s: shutting down", received[0])
    finally:
        runtime.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if runtime.liveness.dead.is_set():
        print(f"Error: serve stopped because a loop died: {runtime.liveness.down()}", file=err)
        return 1
    return 0


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


def warn_unused_controller_urls(root, err):
    """backend.controllerUrl is read only with --runner-listen: say so for every project that sets one,
    and that a swarm project's activations cannot start without it."""
    import suzumio_backend
    for name in root.list_projects():
        try:
            backend = suzumio_config.ProjectConfig.from_data(root.open_project(name).config()).backend
        except SuzumioError:
            continue
        url = backend.controller_url
        needs_listener = suzumio_backend.backend_class(backend.kind).listener_required
        if needs_listener:
            print(f"Error: {name}: every activation will fail: {needs_listener}", file=err)
        elif url != suzumio_config_schema.DEFAULT_CONTROLLER_URL:
            print(f"Warning: {name}: backend.controllerUrl ({url}) is not used: runners reach this controller "
                  "over its runner socket (it applies only with serve --runner-listen)", file=err)


def cmd_toolpacks(rest, options, out, err, now):
    """Every toolpack of a project with its kind, state and tools (MCP servers are started to list)."""
    runtime = cli_runtime(options)
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

    runtime = cli_runtime(options)
    return suzumio_mcp_server.serve_stdio(runtime.root, runtime, sys.stdin, out)


def cmd_watch(rest, options, out, err, now):
    """Print the project's live stream (suzumio_watch) until the controller closes it."""
    import suzumio_watch
    root_path = suzumio_store.resolve_root(options.root, os.environ)
    if options.api_token_env:
        token = os.environ.get(options.api_token_env)
        if not token:
            raise SuzumioError(f"--api-token-env {options.api_token_env}: the variable is not set")
    else:
        token = suzumio_runtime.read_api_token(root_path)
    try:
        return suzumio_watch.watch(options.url or "http://127.0.0.1:39400", rest[0], token, out,
                                   once=bool(options.once))
    except KeyboardInterrupt:
        return 0


def config_option(options):
    """The path of --config FILE, checked readable (its relative paths are read from its folder), or None."""
    if options.config is None:
        return None
    try:
        Path(options.config).read_bytes()
    except OSError as error:
        raise SuzumioError(f"Cannot read {options.config}: {error.strerror}") from None
    return Path(options.config)


def cmd_replay(rest, options, out, err, now):
    import suzumio_replay

    name = getattr(options, "as")
    if not name:
        raise SuzumioError("--as NAME is required")
    root = open_root(options)
    try:
        store = suzumio_replay.create_replay(root, rest[0], name, tools=options.tools or "live",
                                             on_diverge=options.on_diverge or "stop",
                                             config_file=config_option(options))
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
        store = suzumio_replay.create_fork(root, rest[0], name, options.at, config_file=config_option(options))
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


def cmd_eval(rest, options, out, err, now):
    import suzumio_eval_cli

    root_path = suzumio_store.resolve_root(options.root, os.environ)
    return suzumio_eval_cli.cmd_eval(rest, options, out, err, root_path,
                                     lambda: suzumio_runtime.live_runner_socket(root_path) is not None, print_json)


def cmd_evals(rest, options, out, err, now):
    import suzumio_eval_cli

    return suzumio_eval_cli.cmd_evals(rest, options, out, err, suzumio_store.resolve_root(options.root, os.environ),
                                      print_json)


COMMANDS = {
    "config": cmd_config_render, "init": cmd_init, "examples": cmd_examples, "serve": cmd_serve, "start": cmd_start,
    "stop": cmd_stop, "approve": cmd_approve, "send": cmd_send, "status": cmd_status,
    "messages": cmd_messages, "activations": cmd_activations, "turns": cmd_activations,
    "artifacts": cmd_artifacts, "events": cmd_events, "tick": cmd_tick,
    "toolpacks": cmd_toolpacks, "mcp": cmd_mcp, "approvals": cmd_approvals,
    "allow": lambda *a: cmd_decide(*a, decision="allow"), "deny": lambda *a: cmd_decide(*a, decision="deny"),
    "respond": lambda *a: cmd_decide(*a, decision="respond"), "resume": cmd_resume,
    "effects": cmd_effects, "resolve": cmd_resolve,
    "gc": cmd_gc, "watch": cmd_watch, "replay": cmd_replay, "diff": cmd_diff, "fork": cmd_fork,
    "repo": cmd_repo, "report": cmd_report, "request-changes": cmd_request_changes,
    "eval": cmd_eval, "evals": cmd_evals,
}


def main(argv=None, out=None, err=None, now=None):
    """Run one CLI command; returns the exit code (0 or 1, READER_GONE when the reader of its output went
    away). `now` is the clock of relative times."""
    out = out or sys.stdout
    err = err or sys.stderr
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("SUZUMIO_LOG_LEVEL", "WARNING").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=err)
    try:
        code = run_command(argv, out, err, now)
        out.flush()  # what is still buffered meets a reader that went away here, not at exit
        return code
    except BrokenPipeError:
        return reader_gone()


def run_command(argv, out, err, now):
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
    except BrokenPipeError:
        raise
    except OSError as error:
        print(f"Error: {error}", file=err)
        return 1


READER_GONE = 141  # 128 + SIGPIPE: what a Unix tool that a closed pipe ends reports (docs/cli.md)


def reader_gone():
    """The reader of our output went away (`suzumio status | head -1`): point stdout at /dev/null so the
    interpreter's last flush finds no broken pipe either, and end quietly with READER_GONE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a descriptor (tests capture it in memory)
        pass
    return READER_GONE


if __name__ == "__main__":
    sys.exit(main())
