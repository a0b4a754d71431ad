"""The command line's grammar (docs/cli.md): the one table of commands and their options, from which the
parser, the usage text and each command's --help are built, and the parsing of argv into a command, its
positionals and its options."""
import argparse
import math

DEFAULT_LIMIT = 50


class Option:
    """One command-line flag: `--name VALUE`, or a switch when metavar is None. `shown` is the value the
    usage line writes (`[--host 127.0.0.1]`); `repeat` collects every value in order."""

    def __init__(self, flag, metavar, help, shown=None, repeat=False):
        self.flag, self.metavar, self.help, self.repeat = flag, metavar, help, repeat
        self.shown = shown or metavar
        self.dest = flag.lstrip("-").replace("-", "_")

    def usage(self):
        text = f"[{self.flag} {self.shown}]" if self.metavar else f"[{self.flag}]"
        return text + ("..." if self.repeat else "")

    def label(self):
        return f"{self.flag} {self.metavar}" if self.metavar else self.flag


class Command:
    def __init__(self, name, arguments, summary, options, aliases=()):
        self.name, self.arguments, self.summary, self.options, self.aliases = (
            name, arguments, summary, options, aliases)

    def usage_line(self):
        words = ["suzumio", "|".join((self.name, *self.aliases))]
        if self.arguments:
            words.append(self.arguments)
        words += [option.usage() for option in self.options]
        return " ".join(words)

    def help_text(self):
        """`suzumio <command> --help`: the usage line, what it does, one line per option."""
        rows = [(option.label(), option.help) for option in self.options]
        rows.append(("-h, --help", "show this help and exit"))
        width = max(len(label) for label, _ in rows) + 2
        lines = [f"Usage: {self.usage_line()}", "", self.summary, "", "Options:"]
        lines += [f"  {label.ljust(width)}{text}" for label, text in rows]
        return "\n".join(lines) + "\n"


ROOT = Option("--root", "dir", "runtime root (default: $SUZUMIO_ROOT if set, else ~/.suzumio)")
LIMIT = Option("--limit", "n", f"show at most n entries (default {DEFAULT_LIMIT})")
JSON = Option("--json", None, "print one JSON document instead of columns")
AS_NAME = Option("--as", "NAME", "the new project's name (required)")
CONFIG_FILE = Option("--config", "FILE", "a project file with the source's agents (its name is replaced); "
                     "default: the source's configuration")

# The one table of commands and their options: the parser, the usage text and each command's --help are
# built from it. A new flag is one Option line in its command's list.
COMMAND_TABLE = (
    Command("config", "render <file>", "Validate a project file and print its resolved configuration.",
            [Option("--strict", None, "unknown keys in the file are errors, not warnings"),
             Option("--check", None, "also start each MCP server once and check allowlists against its tools")]),
    Command("init", "<file>", "Create a project under the runtime root from a project file.", [ROOT]),
    Command("examples", "<dir>", "Write the example project files (and the scripts, imports and prompts they "
            "read) into a folder, to init or adapt.", [Option("--force", None, "overwrite files that exist")]),
    Command("serve", "", "Run the controller: HTTP API, control room, scheduler and runner supervision.", [
        Option("--host", "HOST", "address to listen on (default 127.0.0.1)", shown="127.0.0.1"),
        Option("--port", "PORT", "port to listen on, 0 for any free one (default 39400)", shown="39400"),
        ROOT,
        Option("--no-scheduler", None, "serve the API without running the scheduler"),
        Option("--threads", "N", "HTTP worker threads, at least 16 (default 32)", shown="32"),
        Option("--allow-host", "name", "also accept this Host header (repeatable)", repeat=True),
        Option("--api-token-env", "NAME", "take the user API token from this environment variable "
               "(default: <root>/api-token, made on first start)"),
        Option("--no-auth", None, "serve the user API without a token (warns; not with --api-token-env)"),
        Option("--runner-listen", "HOST:PORT", "serve the runner routes over TLS on TCP HOST:PORT instead "
               "of the root's runner socket (remote engines, clusters)"),
        Option("--runner-cert", "FILE", "the runner listener's certificate (PEM; default: one issued by a CA "
               "made in <root>/tls/ on first start)"),
        Option("--runner-key", "FILE", "the private key of --runner-cert (PEM)"),
        Option("--runner-ca", "FILE", "the CA runners verify --runner-cert against (default: --runner-cert)"),
        Option("--otlp-endpoint", "URL", "export traces over OTLP/HTTP to URL "
               "(default: $OTEL_EXPORTER_OTLP_ENDPOINT; off when neither is set)"),
        Option("--warm", "N", "prepared runners kept ready for likely next activations, all projects "
               "together; 0 for none (default 8)", shown="8"),
        Option("--max-activations", "N", "at most N activations running at once over every project of the "
               "root; further signals wait (default: no cap)"),
    ]),
    Command("start", "<project>", "Start (or resume) a project and run one scheduler pass.", [ROOT]),
    Command("stop", "<project>", "Stop a project: cancel its running activations and their runners.", [ROOT]),
    Command("approve", "<project>", "Approve a project's result: complete it and stop its runners.", [ROOT]),
    Command("send", "<project> <recipient> <P0|P1|P2|P3> <message...>",
            "Send a message from the user to an agent or #channel, then run one scheduler pass.", [ROOT]),
    Command("status", "[project]", "Show every project (or one) with its agents.", [ROOT, JSON]),
    Command("messages", "<project>", "Show a project's newest messages, oldest first.", [LIMIT, ROOT, JSON]),
    Command("activations", "<project>", "Show a project's newest activations, oldest first.",
            [LIMIT, ROOT, JSON], aliases=("turns",)),
    Command("artifacts", "<project> [path]", "List the files agents wrote to their artifact directories, with "
            "their size and recorded versions; with <agent>/<path>, print that file.",
            [Option("--version", "N", "print recorded version N of the file (1 the oldest kept) instead of the "
                    "file as it is now"), ROOT, JSON]),
    # The team's output
    Command("report", "<project>", "Print the project's final report.", [ROOT]),
    Command("request-changes", "<project> <text...>", "Send a submitted project back to work: the text goes to the "
            "coordinator as a P2 message, then one scheduler pass runs.", [ROOT]),
    Command("events", "<project>", "Show a project's newest events, oldest first.", [LIMIT, ROOT, JSON]),
    # Approval gates
    Command("approvals", "<project>", "Show a project's approval requests: pending ones first, then decided ones.",
            [LIMIT, ROOT, JSON]),
    Command("allow", "<project> <approval-id>", "Allow a pending tool call (with --always: the same rule for that "
            "agent from now on; with --input: run it with that input instead).",
            [Option("--always", None, "allow-always: no more requests for this agent and rule"),
             Option("--input", "JSON", "the edited input (a JSON object, checked against the tool's schema)"),
             ROOT, JSON]),
    Command("deny", "<project> <approval-id> [note...]", "Deny a pending tool call; the note tells the agent why.",
            [ROOT, JSON]),
    Command("respond", "<project> <approval-id> <text...>", "Answer a pending tool call yourself: nothing runs and "
            "the agent reads the text as the call's result.", [ROOT, JSON]),
    Command("resume", "<project> <agent>", "Resume an agent a loop guard paused; its guards count afresh.",
            [ROOT, JSON]),
    # The effect ledger (docs/operations.md#what-an-agent-can-do-to-the-outside-world)
    Command("effects", "<project>", "Show a project's external tool calls (the effect ledger), newest first: "
            "intended, done, failed or in doubt.",
            [Option("--state", "S", "only calls in state S", shown="intended|done|failed|in_doubt"), LIMIT, ROOT,
             JSON]),
    Command("resolve", "<project> <effect-id> <done|not_done> [note...]", "Say whether a call in doubt happened; "
            "its agent is told.", [ROOT, JSON]),
    Command("tick", "[project]", "Run one scheduler pass over one project or all of them.", [ROOT]),
    Command("toolpacks", "<project>", "List a project's toolpacks with their tools and state (MCP servers "
            "included).", [ROOT]),
    Command("mcp", "", "Serve Suzumio's MCP tools and resources over stdio, for desktop MCP clients.", [ROOT]),
    # The live model output of a running controller
    Command("watch", "<project>", "Follow a project live on a running controller: each activation's model "
            "text and tool calls as they stream, and its events.", [
                ROOT,
                Option("--url", "URL", "the controller's user API (default http://127.0.0.1:39400)",
                       shown="http://127.0.0.1:39400"),
                Option("--api-token-env", "NAME", "take the user API token from this environment variable "
                       "(default: <root>/api-token)"),
                Option("--once", None, "exit when the first activation seen ends"),
            ]),
    # The flight recorder (docs/replay.md)
    Command("replay", "<source>", "Replay a recorded run as a new project, started at once: the source's "
            "model answers, no provider call while the requests match.", [
                AS_NAME,
                Option("--tools", "MODE", "live: run every tool again; recorded: results from the source's "
                       "audit and files (default live)", shown="live|recorded"),
                Option("--on-diverge", "MODE", "at the first request the recording does not match: stop, or go "
                       "on live (default stop)", shown="stop|live"),
                CONFIG_FILE,
                Option("--wait", None, "wait until the replay ends, diverges or stops; exit 1 when it diverged"),
                ROOT,
            ]),
    Command("fork", "<source>", "Fork a run as a new project holding everything as it was when one activation "
            "ended, then run it live (optionally with another config).", [
                Option("--at", "ACTIVATION", "the activation after which the fork begins (required)"),
                AS_NAME, CONFIG_FILE, ROOT]),
    Command("diff", "<a> <b>", "Compare two runs: messages, tool calls, activations per agent, artifacts, report, "
            "tokens and cost (ids, times, names and paths are no difference); exit 1 when they differ.",
            [ROOT, JSON]),
    # Evals (docs/evals.md)
    Command("eval", "<suite>", "Run a suite of tasks N times on the root's running serve, grade every run, "
            "print the table per task and variant; exit 1 on a regression or a rate under --fail-under, 2 on a "
            "bad suite.", [
                Option("--runs", "N", "runs of each task and variant (default: the suite's runs)"),
                Option("--variant", "NAME", "run only this variant (repeatable)", repeat=True),
                Option("--baseline", "EVAL_ID", "compare with this eval; a significant drop is a regression"),
                Option("--fail-under", "RATE", "exit 1 when a task's pass rate is under RATE (0 to 1)"),
                Option("--mode", "MODE", "live: run the teams; replay: re-run --from's recorded runs with no model "
                       "call; fork: start every variant after --at in --from's runs (default live)",
                       shown="live|replay|fork"),
                Option("--from", "EVAL_ID", "the eval whose recorded runs replay and fork use"),
                Option("--at", "SELECTOR", "where a fork starts: an activation id, AGENT:N or N"),
                Option("--harbor", "DIR", "read the tasks from a Harbor-layout folder instead of a suite"),
                Option("--team", "FILE", "with --harbor: the team's project file (default DIR/team.yaml)"),
                Option("--junit", "FILE", "also write the results as JUnit XML to FILE"),
                JSON, ROOT]),
    Command("evals", "", "List the evals kept under the root.", [ROOT, JSON]),
    Command("gc", "[project]", "Remove the activation containers a project no longer needs (backend.docker.keep), "
            "keeping their log tails, and the scratch copies no merge uses.", [ROOT]),
    # The team's repository (docs/teams-that-write-code.md)
    Command("repo", "<project> [log|diff|queue|export]", "The team's repository: the integration branch's log "
            "with every agent branch ahead/behind (default), a diff, the merge queue, or an export.", [
                Option("--from", "REV", "diff: the older revision (default: the integration tip's parent)"),
                Option("--to", "REV", "diff: the newer revision (default: the integration tip)"),
                Option("--into", "DIR", "export: clone the repository into this new or empty folder"),
                Option("--bundle", "FILE", "export: write every branch into this git bundle file"),
                LIMIT, ROOT, JSON]),
)
COMMANDS_BY_NAME = {name: command for command in COMMAND_TABLE for name in (command.name, *command.aliases)}
ALL_OPTIONS = {option.dest: option for command in COMMAND_TABLE for option in command.options}
ALL_OPTIONS.setdefault("root", ROOT)

USAGE = ("Suzumio\n\nCommands:\n"
         + "".join(f"  {command.usage_line()}\n" for command in COMMAND_TABLE)
         + "  suzumio help [command]\n  suzumio --version\n"
         + "\nRun `suzumio <command> --help` for the options of one command.\n")

# (minimum, maximum) positionals after the command word; None = unbounded.
COMMAND_ARITY = {
    "init": (1, 1), "examples": (1, 1), "serve": (0, 0), "start": (1, 1), "stop": (1, 1), "approve": (1, 1),
    "send": (4, None), "status": (0, 1), "messages": (1, 1), "activations": (1, 1), "turns": (1, 1),
    "artifacts": (1, 2), "report": (1, 1), "request-changes": (2, None),
    "events": (1, 1), "approvals": (1, 1), "allow": (2, 2), "deny": (2, None),
    "respond": (3, None), "resume": (2, 2), "effects": (1, 1), "resolve": (3, None),
    "tick": (0, 1), "toolpacks": (1, 1), "mcp": (0, 0), "gc": (0, 1), "watch": (1, 1),
    "replay": (1, 1), "diff": (2, 2), "fork": (1, 1), "eval": (0, 1), "evals": (0, 0), "repo": (1, 2),
}


class UsageError(Exception):
    """The command line does not fit the usage text: print the error and the usage, exit 1. `command`
    names the command whose usage applies (None: the global usage)."""

    exit_code = 1

    def __init__(self, message, command=None):
        super().__init__(message)
        self.command = command

    def usage(self):
        return COMMANDS_BY_NAME[self.command].help_text() if self.command else USAGE


class HelpRequested(UsageError):
    """`--help`, `-h` or `help [command]`: print that usage and exit 0."""

    exit_code = 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser():
    parser = _Parser(prog="suzumio", add_help=False)
    parser.add_argument("words", nargs="*")
    for option in ALL_OPTIONS.values():
        if option.flag == "--version":
            continue  # below: alone it asks for Suzumio's version, `artifacts --version N` for a file's
        if option.metavar is None:
            parser.add_argument(option.flag, action="store_true", default=None)
        else:
            parser.add_argument(option.flag, action="append" if option.repeat else "store")
    parser.add_argument("-h", "--help", action="store_true", default=None)
    parser.add_argument("--version", nargs="?", const=True, default=None)
    return parser


def _command_word(argv):
    """The first word that names a command, for the usage of an error argparse raised."""
    return next((word for word in argv if word in COMMANDS_BY_NAME), None)


def parse_args(argv):
    """Parse argv into (command, positionals, options); raises UsageError (HelpRequested for help)."""
    try:
        args = build_parser().parse_intermixed_args(argv)
    except UsageError as error:
        raise UsageError(str(error), _command_word(argv)) from None
    if args.version and not args.words:
        return "--version", [], args
    if not args.words:
        if args.help:
            raise HelpRequested("help")
        raise UsageError("a command is required")
    command, *rest = args.words
    if command == "help":
        if not rest:
            raise HelpRequested("help")
        if len(rest) == 1 and rest[0] in COMMANDS_BY_NAME:
            raise HelpRequested("help", rest[0])
        raise UsageError(f"unknown command: {' '.join(rest)}")
    if command not in COMMANDS_BY_NAME:
        raise UsageError(f"unknown command: {command}")
    if args.help:
        raise HelpRequested("help", command)
    accepted = {option.dest for option in COMMANDS_BY_NAME[command].options} | {"root"}
    given = sorted(dest for dest in ALL_OPTIONS if getattr(args, dest) is not None and dest not in accepted)
    if given:
        raise UsageError(f"{command} does not take {ALL_OPTIONS[given[0]].flag}", command)
    if command == "config":
        if len(rest) != 2 or rest[0] != "render" or not rest[1]:
            raise UsageError("expected: config render <file>", command)
        rest = rest[1:]
    else:
        low, high = COMMAND_ARITY[command]
        if len(rest) < low or (high is not None and len(rest) > high):
            raise UsageError("wrong number of arguments", command)
    if command == "eval" and (len(rest) == 1) == (args.harbor is not None):
        raise UsageError("expected a suite file or --harbor DIR (one of them)", command)
    if command == "send" and not " ".join(rest[3:]).strip():
        raise UsageError("message body is required", command)
    if command == "request-changes" and not " ".join(rest[1:]).strip():
        raise UsageError("the text of the change request is required", command)
    if command == "artifacts" and args.version is not None and (args.version is True or len(rest) != 2):
        raise UsageError("--version N needs the <agent>/<path> of one file", command)
    if args.no_auth and args.api_token_env is not None:
        raise UsageError("--no-auth and --api-token-env exclude each other", command)
    threads = args.threads
    if command == "serve" and threads is not None and (not threads.isdigit() or int(threads) < 16):
        raise UsageError("--threads must be an integer >= 16", command)
    return command, rest, args


def parse_limit(value):
    """docs/cli.md: a finite positive decimal is floored; anything else means the default."""
    if value is None:
        return DEFAULT_LIMIT
    try:
        number = float(value.strip())
    except ValueError:
        return DEFAULT_LIMIT
    if not math.isfinite(number) or number <= 0:
        return DEFAULT_LIMIT
    return math.floor(number)
