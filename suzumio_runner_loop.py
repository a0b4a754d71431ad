"""One activation (docs/design/runner.md): the model/tool loop over the expanded presets with fallback and
overflow compaction, the controller client, history rendering, and local toolpacks through the Node
host. Standard library only, CPython >= 3.9."""

import json
import os
import re
import signal
import ssl
import sys
import time
from datetime import datetime, timezone

from suzumio_runner_calls import (
    NO_RESULT_TEXT,
    REPORTING_TOOLS,
    bad_json_answer,
    calls_in_text,
    contract_reminder,
    input_problem,
    native_call,
    recorded_results,
    resolve_tool,
    result_text,
    schema_answer,
    tool_message,
    unknown_tool_answer,
)
from suzumio_runner_egress import Forwarder, preamble, proxy_environment, trust_environment
from suzumio_runner_files import FileSync, forbid_new_privileges
from suzumio_runner_models import (
    ModelError,
    ProxyAnswer,
    TlsSessions,
    TransportError,
    api_model,
    create_provider,
    expand_preset,
    http_request,
    is_context_overflow,
    safe_tool_name,
    stderr_warning,
    unix_request,
)
from suzumio_runner_tools import (
    ProcessGroups,
    ToolError,
    file_patch,
    file_read,
    file_write,
    meant_path,
    shell_exec,
    signal_group,
    web_fetch,
)

CONTROLLER_CONNECT_TIMEOUT_S = 60.0
CONTROLLER_READ_TIMEOUT_S = 300.0
APPROVAL_WAIT_MS = 20000  # One long-poll for a decision; the controller holds it at most 25 s
CONTROLLER_RETRY_S = 1.0  # pause before asking again a controller that did not answer
# How long a tool call's start or finish keeps asking a controller that is
# down or answers 5xx (`serve` restarting) before the call counts as failed; both are safe to repeat.
RESTART_WINDOW_S = 120.0
# A controller whose disk is full (507) is asked again for as long as that lasts, this often: the work
# goes on by itself once space returns, and the activation's timeout bounds the wait.
INSUFFICIENT_STORAGE = 507
DISK_FULL_RETRY_S = 5.0
CALL_KEY_BYTES = 16
ENDING_TOOLS = ("coordination.wait_for_signal", "completion.submit")
BUILTIN_TOOLS = {
    "core": (
        "messages.send",
        "coordination.wait_for_signal",
        "completion.submit",
        "file.read",
        "file.write",
        "file.patch",
    ),
    "shell": ("shell.exec",),
    "web": ("web.fetch",),
}
SUPPORT_TOOLS = ("messages.send", "coordination.wait_for_signal", "completion.submit")
ROW_PREFIXES = {
    "compaction": "# Compacted Agent History",
    "tool_call": "# Tool Call Record",
    "tool_result": "# Tool Result Record",
}
MODEL_ROW_LIMIT = 40000
ASSISTANT_OUTPUT = "assistant_output"  # the history kind of an activation's closing text
MODEL_TOOL_RESULT_LIMIT = 12000
TAIL_MAX_ROWS = 12
TAIL_BUDGET = 80000
SUMMARY_ROW_LIMIT = 12000
SUMMARY_TOOL_RESULT_LIMIT = 3000
SUMMARY_INPUT_BUDGET = 80000
SUMMARY_MAX_CHARS = 20000
SUMMARY_MAX_TOKENS = 4000
CONTINUE_TEXT = "Continue the assigned Suzumio activation."
NO_SUMMARY_TEXT = "No durable session facts were recovered from the compacted history."
ENDED_OUTPUT = "This activation has already ended; the tool call was not run."


class RunnerError(Exception):
    """A failure that ends the run (or, inside an attempt, the attempt)."""


class ControllerError(RunnerError):
    """A controller call failed; `status` is the HTTP status when there was an answer."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def now_iso():
    """The current UTC time as ISO-8601 with milliseconds and Z."""
    now = datetime.now(timezone.utc)  # noqa: UP017 (datetime.UTC needs 3.11)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def compact_json(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def trim_chars(text, limit):
    """Strip; if longer than limit keep the first limit chars plus a `[truncated <n> chars]` note."""
    stripped = (text or "").strip()
    if len(stripped) <= limit:
        return stripped
    return f"{stripped[:limit].rstrip()}\n\n[truncated {len(stripped) - limit} chars]"


# ---------------------------------------------------------------------------------------------
# Controller client


UNIX_SCHEME = "unix://"


class ControllerClient:
    """POSTs JSON to the controller's runner routes, never through a proxy: over the runner
    socket for a `unix://<path>` controllerUrl, else over HTTP(S) to the URL; an https URL's server
    must present a certificate of `ca` (PEM text, the controllerCa of input.json) when one is given."""

    def __init__(self, base_url, identity, ca=None, via=None):
        self.base_url = base_url.rstrip("/")
        self.via = via  # a Unix socket standing for the TCP route to an https controllerUrl
        self.socket_path = base_url[len(UNIX_SCHEME):] if base_url.startswith(UNIX_SCHEME) else None
        self.identity = identity
        self.tls_context = ssl.create_default_context(cadata=ca) if ca else None
        self.tls_sessions = TlsSessions()

    def post(self, path, fields, read_timeout=CONTROLLER_READ_TIMEOUT_S):
        """The JSON answer of POST <path> with the identity fields added; raises ControllerError.
        `read_timeout`: seconds, None for none (a model request the controller bounds)."""
        body = dict(self.identity)
        body.update(fields)
        payload = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        try:
            if self.socket_path is not None:
                status, raw = unix_request(self.socket_path, "POST", path, headers, payload,
                                           CONTROLLER_CONNECT_TIMEOUT_S, read_timeout)
            else:
                response = http_request("POST", self.base_url + path, headers, payload, None,
                                        CONTROLLER_CONNECT_TIMEOUT_S, read_timeout, tls_context=self.tls_context,
                                        tls_sessions=self.tls_sessions, via=self.via)
                status, raw = response.status, response.body
        except TransportError as error:
            raise ControllerError(f"Suzumio controller request failed: {error}. {self.reach_hint()}") from None
        text = raw.decode("utf-8", "replace")
        if not 200 <= status < 300:
            raise ControllerError(error_message(text, status), status)
        if not text.strip():
            return {}
        try:
            return json.loads(text)
        except ValueError:
            raise ControllerError(f"Invalid JSON from the controller for {path}: {text[:200]}") from None

    def reach_hint(self):
        if self.socket_path is not None:
            return (f"The Suzumio server must be running and serving its runner socket {self.socket_path} "
                    "(`suzumio serve` on this runtime root)")
        return (f"The Suzumio server must be running and reachable at {self.base_url} (runners use "
                "backend.controllerUrl only with `suzumio serve --runner-listen HOST:PORT`; it must name "
                "that listener at an address runners can reach)")


def new_call_key():
    """The key of one model tool call (`callKey`, docs/http-api.md#runner-routes): 32 random hex digits."""
    return os.urandom(CALL_KEY_BYTES).hex()


def error_message(text, status):
    """The `error` string of a JSON error body, else the raw body, else `Request failed: <status>`."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return parsed["error"]
    return text.strip() or f"Request failed: {status}"


# ---------------------------------------------------------------------------------------------
# History rendering, context snapshot and compaction helpers


def render_for_model(row):
    """One history row as model text, prefixed by role and trimmed."""
    role = row.get("role")
    content = str(row.get("content") or "")
    if role in ROW_PREFIXES:
        content = f"{ROW_PREFIXES[role]}\n\n{content}"
    return trim_chars(content, MODEL_TOOL_RESULT_LIMIT if role == "tool_result" else MODEL_ROW_LIMIT)


def history_to_messages(history):
    """The initial Chat Completions messages for a history. Tool calls and their results go back as the
    provider's own tool messages, as they were within the activation: written as text records, they were
    imitated by small models, which then wrote records instead of calling tools."""
    rows = list(history)
    results = recorded_results(rows)
    messages, used = [], set()
    for row in rows:
        if id(row) in used:
            continue
        native = native_call(row) if row.get("role") == "tool_call" else None
        if native is not None:
            call, recorded = native
            found = results.get(recorded)
            if found is not None:
                used.add(id(found[0]))
            content = result_text(found[1]) if found is not None else NO_RESULT_TEXT
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": call["id"],
                          "content": trim_chars(content, MODEL_TOOL_RESULT_LIMIT)}]
            continue
        # A closing text reached no one; read back, the lab's model gave it again as its answer, doubled at
        # each activation (and the placeholder of an answer without text). People read it; models, the calls.
        if row.get("kind") == ASSISTANT_OUTPUT:
            continue
        text = render_for_model(row)
        if text:
            role = "assistant" if row.get("role") in ("assistant", "tool_call") else "user"
            messages.append({"role": role, "content": text})
    return messages or [{"role": "user", "content": CONTINUE_TEXT}]


def retry_tail_count(history):
    """How many newest rows a compaction keeps verbatim."""
    if len(history) <= 1:
        return len(history)
    count = total = 0
    for row in reversed(history):
        if count >= TAIL_MAX_ROWS:
            break
        size = len(render_for_model(row))
        if count >= 1 and total + size > TAIL_BUDGET:
            break
        total += size
        count += 1
    return max(1, count)


def render_for_summary(row):
    lines = [
        "## {} {} {}".format(row.get("sequence"), row.get("role"), row.get("kind")),
        "Time: {}".format(row.get("createdAt")),
    ]
    if row.get("activationId"):
        lines.append("Activation: {}".format(row["activationId"]))
    if row.get("compactionId"):
        lines.append("Archived by: {}".format(row["compactionId"]))
    lines.append(str(row.get("content") or ""))
    limit = SUMMARY_TOOL_RESULT_LIMIT if row.get("role") == "tool_result" else SUMMARY_ROW_LIMIT
    return trim_chars("\n".join(lines), limit)


def summary_input(archived):
    """The archived rows rendered for the summary request, at most SUMMARY_INPUT_BUDGET chars."""
    parts = []
    used = 0
    for row in archived:
        piece = render_for_summary(row)
        remaining = SUMMARY_INPUT_BUDGET - used - (2 if parts else 0)
        if remaining <= 0:
            break
        if len(piece) > remaining:
            piece = trim_chars(piece, max(0, remaining - 40))[:remaining]
            parts.append(piece)
            break
        parts.append(piece)
        used += len(piece) + (2 if len(parts) > 1 else 0)
    return "\n\n".join(parts)


SUMMARY_INSTRUCTION = (
    "You are condensing the long session of an autonomous agent so that its work can resume later from "
    "this summary alone. Preserve every piece of concrete state: the goal, constraints, progress on proofs, "
    "lemmas and computations, file paths, commands, errors, artifacts, verification results, blockers and "
    "next steps. Drop chatter, pleasantries and duplicate attempts."
)
SUMMARY_TEMPLATE = """Reproduce exactly this Markdown template, with these headings in this order:

## Goal
## Constraints & Preferences
## Progress
### Done
### In Progress
### Blocked
## Key Decisions
## Next Steps
## Critical Context
## Relevant Files

Rules: keep every section and write (none) when a section is empty; use terse bullets; preserve exact
paths, commands, error strings and identifiers; do not mention that a summary or compaction happened."""


def summary_prompt(archived):
    return "\n\n".join(
        [SUMMARY_INSTRUCTION, SUMMARY_TEMPLATE, "# Agent History To Compact", summary_input(archived)]
    )


def _collapse(text, limit):
    text = re.sub(r"\s+", " ", str(text or "")).strip()
    return text[:limit]


def _first_line(text, limit=900):
    for line in str(text or "").split("\n"):
        if line.strip():
            return _collapse(line, limit)
    return ""


PATH_TOKEN = re.compile(r"(?<![\w/:.-])(?:/[\w.@+-]+(?:/[\w.@+-]*)*|[\w.-]+/[\w.@+-]+(?:/[\w.@+-]*)*)")


def path_tokens(texts, limit=12):
    found = []
    for text in texts:
        for token in PATH_TOKEN.findall(str(text or "")):
            token = token.rstrip("),.;:")
            if token and "//" not in token and len(token) <= 180 and token not in found:
                found.append(token)
                if len(found) >= limit:
                    return found
    return found


def fallback_summary(history, archived, keep_tail, agent_id, selected_model, overflow_error, summary_error):
    """The deterministic summary used when the summary request fails or nothing is archived."""
    prompts = [row for row in history if row.get("kind") == "activation_prompt"]
    goal_row = prompts[0] if prompts else (history[0] if history else {})
    goal = _first_line(goal_row.get("content")) or "(none recovered)"
    recent = archived[-10:]
    sequences = [row.get("sequence") for row in archived if isinstance(row.get("sequence"), int)]
    span = f"{min(sequences)}-{max(sequences)} ({len(archived)} messages)" if sequences else "(none)"
    recent_text = (
        "; ".join(
            "{} {}/{}: {}".format(
                row.get("sequence"), row.get("role"), row.get("kind"), _first_line(row.get("content"))
            )
            for row in recent
        )
        or "(none)"
    )
    files = path_tokens(row.get("content") for row in recent)
    file_lines = "\n".join(f"- {path}" for path in files) or "(none recovered from the archived messages)"
    text = "\n".join(
        [
            "## Goal",
            goal,
            "",
            "## Constraints & Preferences",
            "(none recovered; see the retained history)",
            "",
            "## Progress",
            "### Done",
            f"- {len(archived)} earlier history messages are preserved in the controller's raw archive.",
            "### In Progress",
            f"- Work continues from the latest {keep_tail} unarchived history messages.",
            "### Blocked",
            f"- Provider context overflow: {_collapse(overflow_error, 700)}",
            f"- Summary generation failed: {_collapse(summary_error, 700)}",
            "",
            "## Key Decisions",
            "(none recovered)",
            "",
            "## Next Steps",
            "- Re-read the latest activation prompt and continue from the retained history.",
            "",
            "## Critical Context",
            f"- Agent: {agent_id}",
            f"- Selected model: {selected_model}",
            f"- Archived sequence range: {span}",
            f"- Recent archived messages: {recent_text}",
            "",
            "## Relevant Files",
            file_lines,
        ]
    )
    return trim_chars(text, SUMMARY_MAX_CHARS)


# ---------------------------------------------------------------------------------------------
# Node bridge for local toolpack runner modules


HOST_SCRIPT = "suzumio_toolpack_host.mjs"


def default_host_path():
    """The Node host beside this file (checkout, pex, the mounted support folder in a container), else where a wheel
    installs it: <prefix>/share/suzumio (suzumio_resources.py; the runner imports no controller module)."""
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), HOST_SCRIPT)
    installed = os.path.join(sys.prefix, "share", "suzumio", HOST_SCRIPT)
    return beside if os.path.isfile(beside) or not os.path.isfile(installed) else installed


class NodeBridge:
    """One `node suzumio_toolpack_host.mjs --role runner` child speaking newline-delimited JSON."""

    def __init__(self, toolpack_id, host_path, groups, node="node", warn=stderr_warning):
        import subprocess  # on first use: most activations start no Node host

        self.toolpack_id = toolpack_id
        self.groups = groups
        self.warn = warn
        self.last_id = 0
        try:
            self.process = subprocess.Popen(
                [node, host_path, "--role", "runner"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError:
            raise RunnerError("Node.js is required to run local toolpack runner modules") from None
        groups.add(self.process.pid)

    def request(self, message):
        self.last_id += 1
        message = dict(message, id=self.last_id)
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise ToolError(self._exited_text()) from None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise ToolError(self._exited_text())
            try:
                reply = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                self.warn("Toolpack host for %s wrote a non-JSON line: %s", self.toolpack_id, line[:200])
                continue
            if isinstance(reply, dict) and reply.get("id") == self.last_id:
                break
        if reply.get("ok") is True:
            return reply
        raise ToolError(str(reply.get("error") or "Toolpack host call failed"))

    def _exited_text(self):
        return f"Toolpack host for {self.toolpack_id} exited (status {self.process.poll()})"

    def init(self, module, context):
        """Load the runner module; returns the names of the tools it registered."""
        try:
            reply = self.request({"op": "init", "module": module, "context": context})
        except ToolError as error:
            raise RunnerError(str(error)) from None
        return [name for name in reply.get("tools") or [] if isinstance(name, str)]

    def call(self, tool, args):
        result = self.request({"op": "call", "tool": tool, "input": args}).get("result")
        if not isinstance(result, dict) or not isinstance(result.get("output"), str):
            raise ToolError(f"Runner tool {tool} returned an invalid result")
        return result

    def close(self):
        try:
            self.process.stdin.close()
        except OSError:
            pass
        import subprocess

        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process.stdout.close()
        self.groups.discard(self.process.pid)


# ---------------------------------------------------------------------------------------------
# The activation


class RegisteredTool:
    __slots__ = ("description", "handler", "name", "safe", "schema")

    def __init__(self, name, safe, description, schema, handler):
        self.name, self.safe, self.description, self.schema, self.handler = (
            name,
            safe,
            description,
            schema,
            handler,
        )


class RequestState:
    """Per run_request counters of the step loop."""

    def __init__(self):
        self.ended = False
        self.end_output = None
        self.tool_calls = 0
        self.reported = False  # a reporting tool (a message, a wait, a submission) ran in this activation


def localize(value, workspace, artifacts_root):
    """Tool descriptions name the container roots; show the input's roots instead (the same text
    under docker-chat, the host paths under `local`)."""
    if isinstance(value, str):
        for name, actual in (("workspace", workspace), ("artifacts", artifacts_root)):
            if actual:
                value = re.sub(rf"(?<![\w/])/{name}(?![\w-])", lambda m, actual=actual: actual, value)
        return value
    if isinstance(value, dict):
        return {
            k: localize(v, workspace, artifacts_root) if k == "description" or isinstance(v, dict) else v
            for k, v in value.items()
        }
    return value


def teach_names(value, names):
    """Tool descriptions name other tools as the docs do (`file.patch`); the model sees the names it can
    call (`file_patch`)."""
    if isinstance(value, str):
        for dotted in sorted(names, key=len, reverse=True):
            value = re.sub(rf"(?<![\w.]){re.escape(dotted)}(?![\w])", names[dotted], value)
        return value
    if isinstance(value, dict):
        return {k: teach_names(v, names) if k == "description" or isinstance(v, dict) else v for k, v in value.items()}
    return value


def activation_files(activation):
    """Where the activation's files are: `controller` (fetched and sent back over the runner
    listener), else bind-mounted or on this host (None)."""
    return activation.get("files")


def sum_usage(total, usage):
    for field, value in usage.items():
        total[field] = total.get(field, 0) + value
    return total


class Runner:
    """One activation: attempts over the expanded presets, then /activation-output."""

    def __init__(
        self, activation, env, groups=None, sleep=time.sleep, node="node", host_path=None, warn=stderr_warning
    ):
        self.input = activation
        self.env = env
        self.groups = groups if groups is not None else ProcessGroups()
        self.sleep = sleep
        self.warn = warn
        self.node = node
        self.host_path = host_path or default_host_path()
        for field in ("project", "token", "controllerUrl", "workspace"):
            if not isinstance(activation.get(field), str) or not activation[field]:
                raise RunnerError(f"input.json is missing {field}")
        self.agent_id = (activation.get("agent") or {}).get("id")
        self.activation_id = (activation.get("activation") or {}).get("id")
        if not self.agent_id or not self.activation_id:
            raise RunnerError("input.json is missing agent.id or activation.id")
        self.workspace = activation["workspace"]
        self.artifacts_root = activation.get("artifactsRoot") or ""
        self.read_roots = activation.get("readRoots") or [self.workspace]
        self.write_roots = activation.get("writeRoots") or [self.workspace]
        self.runner_config = activation.get("runner") or {}
        self.egress = activation.get("egress")
        self.egress_proxy = None  # the forwarder's URL once it listens
        self.call_key = None  # the key of the tool call running now: shell.exec sees it as SUZUMIO_CALL_KEY
        self.files = None  # FileSync when the controller holds the files (nothing bind-mounted)
        self.client = ControllerClient(
            activation["controllerUrl"],
            {
                "project": activation["project"],
                "agentId": self.agent_id,
                "activationId": self.activation_id,
                "token": activation["token"],
            },
            ca=activation.get("controllerCa"),
            via=activation.get("controllerVia"),
        )

    def run(self):
        """Try every concrete preset in order, then post the first output. Raises RunnerError."""
        models = self.runner_config.get("models")
        if not isinstance(models, dict):
            raise RunnerError("runner.models is required in ai mode")
        selected = (self.input.get("agent") or {}).get("model") or self.runner_config.get("model")
        if not selected:
            raise RunnerError(
                "No model preset selected. Set backend.runner.model or agents.<id>.model explicitly."
            )
        try:
            attempts = expand_preset(models, selected)
        except ModelError as error:
            raise RunnerError(str(error)) from None
        if activation_files(self.input) == "controller":
            if self.input.get("noNewPrivileges") and not forbid_new_privileges():
                self.warn("Cannot set no_new_privs on the runner; tools may gain privileges through set-uid files")
            self.files = FileSync(self.client, self.artifacts_root, self.agent_id, ControllerError, self.workspace)
            self.files.pull()
        forwarder = self.start_egress()
        try:
            return self.run_attempts(attempts, selected)
        finally:
            if forwarder is not None:
                forwarder.stop()

    def start_egress(self):
        """Listen on loopback for this activation's connections out and point the proxy variables of
        its tools there (docs/operations.md#egress); None when the controller offers no egress proxy."""
        if not isinstance(self.egress, str) or not self.egress:
            return None
        identity = preamble(self.input["project"], self.activation_id, self.input["token"])
        forwarder = Forwarder(self.egress, identity, warn=self.warn, ca=self.input.get("controllerCa"),
                              via=self.input.get("controllerVia")).start()
        self.egress_proxy = forwarder.url
        self.env = dict(self.env, **proxy_environment(forwarder.url))
        if self.input.get("egressCa"):  # hosts whose TLS the proxy ends with the project's CA
            self.env.update(trust_environment(self.input["egressCa"]))
        return forwarder

    def run_attempts(self, attempts, selected):
        failures = []
        for attempt in attempts:
            try:
                output = self.run_attempt(attempt, selected)
                break
            except Exception as error:  # noqa: BLE001 - attempt boundary: any failure tries the next preset
                self.warn("Model attempt %s failed: %s", attempt.preset_id, error)
                failures.append(f"{attempt.preset_id}: {error}")
        else:
            raise RunnerError("All model attempts failed:\n" + "\n".join(failures))
        if self.files is not None:
            self.files.push()  # before the output: the next activation must find every file in place
        # Safe to repeat: an activation that is no longer running answers its status.
        self.post_through_restarts("/activation-output", {"output": output})
        return output

    def model_request(self, provider_id, preset_id, body, timeout, scripted=None):
        """One Chat Completions request through the controller's model proxy (`/runner/model`), which
        holds the key: the provider's status, retry headers and body, as if the runner had sent it.
        `scripted`: a scripted provider's answer, which the controller records as the provider's."""
        request = {"providerId": provider_id, "presetId": preset_id, "body": body}
        try:
            if scripted is None:
                answer = self.client.post("/runner/model", request, read_timeout=timeout)
            else:  # the script's turn costs nothing and is the same when asked again: through restarts
                answer = self.post_through_restarts("/runner/model", dict(request, scripted=scripted))
        except ControllerError as error:
            raise ModelError(str(error), error.status) from None
        answer = answer if isinstance(answer, dict) else {}
        status, text = answer.get("status"), answer.get("body")
        headers = answer.get("headers") if isinstance(answer.get("headers"), dict) else {}
        if not isinstance(status, int) or isinstance(status, bool) or not isinstance(text, str):
            raise ModelError(f"Invalid model answer from the controller for provider {provider_id}")
        headers = {str(k).lower(): str(v) for k, v in headers.items()}
        overflow = answer.get("overflow") if isinstance(answer.get("overflow"), bool) else None
        return ProxyAnswer(status, "", headers, text.encode("utf-8"), overflow)

    def run_attempt(self, attempt, selected):
        provider = create_provider(attempt, self.input, self.model_request, sleep=self.sleep, warn=self.warn)
        history = list(self.input.get("history") or [])
        for overflow_retry in (0, 1):
            try:
                return self.run_request(attempt, provider, selected, history)
            except Exception as error:
                if overflow_retry == 1 or not is_context_overflow(error):
                    raise
                self.warn(
                    "context overflow from %s; compacting agent history and retrying activation %s",
                    attempt.preset_id,
                    self.activation_id,
                )
                history = self.compact_for_overflow(attempt, provider, selected, history, error)

    def run_request(self, attempt, provider, selected, history):
        """Register tools, record the context, then loop model steps and tool calls."""
        bridges = []
        try:
            tools = self.register_tools(bridges)
            by_safe = {tool.safe: tool for tool in tools}
            messages = history_to_messages(history)
            system = (self.input.get("activation") or {}).get("system")
            if isinstance(system, str) and system:
                messages.insert(0, {"role": "system", "content": system})
            self.submit_context(attempt, selected, messages, history)
            tool_defs = [
                {"name": t.safe, "description": t.description, "parameters": t.schema} for t in tools
            ]
            shapes = [(t.safe, t.schema) for t in tools]  # what a call written in the text is read against
            tool_choice = attempt.preset.get("toolChoice") or ("auto" if tools else "none")
            max_iterations = self.runner_config.get("maxIterations") or 1000000
            state = RequestState()
            reminder = contract_reminder(list(by_safe))
            # The controller's reminder for a leading agent whose work has all come back names the one next step
            # (docs/real-models.md): after a text answer, that turn offers its tool alone and requires a call.
            planned = (self.input.get("activation") or {}).get("reminder")
            next_tool = planned.get("tool") if isinstance(planned, dict) and isinstance(planned.get("text"), str) \
                and tool_choice != "none" and planned.get("tool") in by_safe else None
            forced = False
            text = ""
            usage = {}
            steps = 0
            while True:
                if forced:
                    forced = False
                    turn = provider.complete(messages, [d for d in tool_defs if d["name"] == next_tool], "required")
                else:
                    turn = provider.complete(messages, tool_defs, tool_choice)
                steps += 1
                sum_usage(usage, turn.usage)
                calls = turn.tool_calls or calls_in_text(turn.text, shapes)
                # A call written into the text is acted on like any call; the text around it is not output.
                text += turn.text if not calls or turn.tool_calls else ""
                if not calls:
                    if reminder is None or state.reported or steps >= max_iterations:
                        break
                    # Text alone reaches no one: the model is told so once, in this activation.
                    if next_tool is not None:
                        reminder, forced = planned["text"], True
                    messages += [{"role": "assistant", "content": turn.text}, {"role": "user", "content": reminder}]
                    self.record_reminder(reminder)
                    reminder = None
                    continue
                messages.append(
                    {
                        "role": "assistant",
                        "content": turn.text if turn.tool_calls else "",
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments},
                            }
                            for call in calls
                        ],
                    }
                )
                for call in calls:
                    content = self.execute_tool_call(state, call, by_safe)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
                if state.ended or steps >= max_iterations:
                    break
        finally:
            for bridge in bridges:
                bridge.close()
        said = text.strip() or state.end_output
        out_text = said or "(model returned no text)"
        info = {"selectedModel": selected, "model": attempt.preset_id, "apiModel": api_model(attempt.preset)}
        output_usage = dict(info)
        metadata = dict(info)
        if not said:
            metadata["noText"] = True  # the output is a placeholder, not the model's words
        if usage:
            output_usage["tokens"] = usage
            metadata["usage"] = usage
        if hasattr(provider, "history_metadata"):
            metadata.update(provider.history_metadata())
        try:
            self.client.post(
                "/runner/history/messages",
                {"role": "assistant", "kind": ASSISTANT_OUTPUT, "content": out_text, "metadata": metadata},
            )
        except ControllerError as error:
            self.warn("%s (assistant output not recorded in history)", error)
        return {"text": out_text, "usage": output_usage}

    def submit_context(self, attempt, selected, messages, history):
        entries = [{"role": m["role"], "content": m["content"], "chars": len(m["content"])} for m in messages]
        context = {
            "version": 1,
            "kind": "model-context",
            "recordedAt": now_iso(),
            "selectedModel": selected,
            "model": attempt.preset_id,
            "apiModel": api_model(attempt.preset),
            "firstPrompt": sum(1 for row in history if row.get("kind") == "activation_prompt") <= 1,
            "messageCount": len(entries),
            "totalChars": sum(e["chars"] for e in entries),
            "messages": entries,
        }
        try:
            self.client.post("/activation-context", {"context": context})
        except ControllerError as error:
            self.warn("%s (activation context not recorded)", error)

    # -- tools ---------------------------------------------------------------------------------

    def register_tools(self, bridges):
        """The model-facing tools of every toolpack spec; local ones start a Node host."""
        tools = []
        seen = {}
        by_safe = {}
        for spec in self.input.get("toolpacks") or []:
            toolpack_id = spec.get("id", "")
            module = spec.get("runnerModule") or ""
            definitions = spec.get("tools") or []
            names = [d.get("name") for d in definitions]
            if module.startswith("builtin:"):
                handlers = self.builtin_handlers(module[len("builtin:") :], spec)
            elif module == "support:":
                # An MCP toolpack whose session the controller owns.
                support_path = spec.get("supportPath") or f"/toolpacks/{toolpack_id}/support"
                handlers = {name: self._mcp_support_handler(support_path, name) for name in names}
            elif module == "mcp-stdio:":
                # A sandbox-side MCP server: started here, next to the agent's files.
                definitions, handlers = self.sandbox_mcp_tools(toolpack_id, spec, bridges)
                names = [d["name"] for d in definitions]
            else:
                bridge = NodeBridge(toolpack_id, self.host_path, self.groups, self.node, self.warn)
                bridges.append(bridge)
                registered = bridge.init(
                    module,
                    {
                        "project": self.input["project"],
                        "agentId": self.agent_id,
                        "activationId": self.activation_id,
                        "workspace": self.workspace,
                        "toolpackId": toolpack_id,
                        "controllerUrl": self.input["controllerUrl"],
                        "controllerCa": self.input.get("controllerCa"),
                        "token": self.input["token"],
                        "supportPath": spec.get("supportPath"),
                    },
                )
                handlers = {name: self._bridge_handler(bridge, name) for name in registered}
                names = list(spec.get("declaredTools") or []) + [
                    n for n in names if n not in (spec.get("declaredTools") or [])
                ]
            for name in names:
                if name not in handlers:
                    raise RunnerError(f"Runner module for {toolpack_id} did not register {name}")
                if name in seen:
                    raise RunnerError(f"Duplicate runner tool: {name}")
                seen[name] = toolpack_id
            for definition in definitions:
                name = definition["name"]
                safe = safe_tool_name(name)
                if safe in by_safe:
                    raise RunnerError(f"Tool names {by_safe[safe]} and {name} both map to {safe}")
                by_safe[safe] = name
                description = definition.get("description") or ""
                schema = definition.get("inputSchema") or {"type": "object", "properties": {}}
                description = localize(description, self.workspace, self.artifacts_root)
                schema = localize(schema, self.workspace, self.artifacts_root)
                tools.append(RegisteredTool(name, safe, description, schema, handlers[name]))
        names = {tool.name: tool.safe for tool in tools if tool.name != tool.safe}
        for tool in tools:
            tool.description, tool.schema = teach_names(tool.description, names), teach_names(tool.schema, names)
        return tools

    @staticmethod
    def _bridge_handler(bridge, name):
        return lambda args: bridge.call(name, args)

    def builtin_handlers(self, pack, spec):
        if pack not in BUILTIN_TOOLS:
            raise RunnerError(f"Unknown built-in runner toolpack: {pack}")
        support_path = spec.get("supportPath") or f"/toolpacks/{pack}/support"
        local = {
            "file.read": lambda args: file_read(args, self.workspace, self.read_roots),
            "file.write": lambda args: file_write(args, self.workspace, self.write_roots),
            "file.patch": lambda args: file_patch(args, self.workspace, self.write_roots),
            "shell.exec": lambda args: shell_exec(
                args, self.workspace, dict(self.env, SUZUMIO_CALL_KEY=self.call_key or ""), self.groups
            ),
            "web.fetch": lambda args: web_fetch(args, self.env, self.egress_proxy),
        }
        handlers = {}
        for name in BUILTIN_TOOLS[pack]:
            handlers[name] = (
                self._support_handler(support_path, name) if name in SUPPORT_TOOLS else local[name]
            )
        return handlers

    def _support_handler(self, support_path, tool):
        def call(args):
            result = self.client.post(support_path, {"tool": tool, "input": args})
            if not isinstance(result, dict) or not isinstance(result.get("output"), str):
                raise ToolError(f"Runner tool {tool} returned an invalid result")
            return result

        return call

    def sandbox_mcp_tools(self, toolpack_id, spec, bridges):
        """Start the server of a `where: runner` MCP toolpack and list its allowed tools as `<id>.<tool>`;
        a server that cannot start is one warning line and contributes no tools."""
        import suzumio_runner_mcp as runner_mcp  # on first use: most activations start no MCP server

        mcp = spec.get("mcp") or {}
        command = [arg.replace("{workspace}", self.workspace) for arg in mcp.get("command") or []]
        env = runner_mcp.server_environment(self.env, mcp.get("env"))
        client = runner_mcp.StdioMcpClient(
            toolpack_id, command, env, mcp.get("cwd") or self.workspace, self.groups, self.workspace
        )
        bridges.append(client)
        try:
            listed = client.start()
        except runner_mcp.McpServerError as error:
            self.warn("%s", error)
            return [], {}
        definitions, handlers = [], {}
        for tool in listed:
            name = f"{toolpack_id}.{tool['name']}"
            if runner_mcp.is_allowed(name, spec.get("allow") or []):
                definitions.append(dict(tool, name=name))
                handlers[name] = self._sandbox_mcp_handler(client, tool["name"], runner_mcp.McpServerError)
        return definitions, handlers

    @staticmethod
    def _sandbox_mcp_handler(client, tool, failure):
        def call(args):
            try:
                result = client.call(tool, args)
            except failure as error:
                raise ToolError(str(error)) from None
            if result.get("isError"):
                raise ToolError(result["output"] or f"{tool} failed")
            return result

        return call

    def _mcp_support_handler(self, support_path, tool):
        forward = self._support_handler(support_path, tool)

        def call(args):
            result = forward(args)
            if result.get("isError"):
                raise ToolError(result["output"] or f"{tool} failed")
            return result

        return call

    def execute_tool_call(self, state, call, by_safe):
        """Run one model tool call with its audit posts; returns the tool message text."""
        tool = resolve_tool(call.name, by_safe)
        if tool is None:
            return self.refuse(call, call.arguments, unknown_tool_answer(call.name, list(by_safe)))
        try:
            args = json.loads(call.arguments) if call.arguments and call.arguments.strip() else {}
        except ValueError as error:
            return self.refuse(call, call.arguments, bad_json_answer(tool.safe, error), tool.name)
        if args is None:
            args = {}
        problem = input_problem(tool.schema, args)
        if problem is not None:
            return self.refuse(call, args, schema_answer(tool.safe, tool.schema, problem), tool.name)
        if state.ended:
            return ENDED_OUTPUT
        beside = None
        if tool.name == "file.write":
            # A file written beside the agent's own artifact folder goes into it, and the result says so.
            # Refused with the path to use, the lab's poet wrote there, then to the refused path again, in
            # turn, 44 times in one activation; told where its file went, it reported.
            meant = meant_path(args["path"], self.workspace, self.write_roots)
            if meant is not None:
                beside, args = args["path"], dict(args, path=meant)
        state.tool_calls += 1
        max_calls = self.runner_config.get("maxToolCalls")
        if max_calls and state.tool_calls > max_calls:
            return f"Exceeded maxToolCalls: {max_calls}"
        # One key per model tool call: a start asked again after a lost answer gets the call recorded then.
        fields = {"tool": tool.name, "input": args, "callKey": new_call_key(), "modelCallId": call.id}
        try:
            started = self.post_through_restarts("/runner/tool-calls/start", fields)
        except ControllerError as error:
            return str(error)
        tool_call_id = started.get("toolCallId") if isinstance(started, dict) else None
        if isinstance(started, dict) and started.get("end"):
            # A loop guard refused the call and ended the activation (docs/operations.md#runaways).
            state.ended = True
            state.end_output = started.get("output") or "A loop guard ended this activation."
            return state.end_output
        pending = started.get("approval") if isinstance(started, dict) else None
        edited_note = None
        if isinstance(pending, dict) and isinstance(pending.get("id"), str):
            # A person decides first; a call that does not run was finished by the controller.
            decision = self.wait_for_approval(pending["id"])
            if not decision.get("run"):
                text = decision.get("output") or "Tool call did not run: {}".format(decision.get("status"))
                signal_text = decision.get("signalText")
                return f"{text}\n\n{signal_text}" if signal_text else text
            if isinstance(decision.get("input"), dict):
                # The person edited the input: the tool runs with theirs, and the model is told so.
                args, beside = decision["input"], None
                edited_note = decision.get("inputNote") or "A person changed this call's input before it ran."
        recorded = started.get("recorded") if isinstance(started, dict) else None
        if isinstance(recorded, dict):
            return self._finish_recorded(tool_call_id, recorded)
        self.call_key = fields["callKey"]
        try:
            self.fetch_before(tool.name, args)
            result = tool.handler(args)
        except (ToolError, ControllerError, OSError, ValueError) as error:
            return self._fail_tool_call(tool_call_id,
                                        self.sent_files(tool.name, str(error) or error.__class__.__name__))
        except Exception as error:  # noqa: BLE001 - a handler bug is a tool error (as a throwing JS tool)
            import traceback  # only on this path: a handler bug

            self.warn("Tool %s failed unexpectedly\n%s", tool.name, traceback.format_exc().rstrip())
            return self._fail_tool_call(tool_call_id,
                                        self.sent_files(tool.name, str(error) or error.__class__.__name__))
        if beside is not None:
            result = dict(result, output=f"{result['output']} (your artifact folder: {beside} is outside your "
                                         "folders).")
        unsent = self.sent_files(tool.name, None)
        if unsent is not None:
            result = dict(result, output=f"{result.get('output') or ''}\n\n{unsent}".strip())
        try:
            finished = self.post_through_restarts(
                "/runner/tool-calls/finish",
                {"toolCallId": tool_call_id, "status": "completed", "output": result["output"]},
            )
        except ControllerError as error:
            return str(error)
        signal_text = finished.get("signalText") if isinstance(finished, dict) else None
        if isinstance(signal_text, str) and signal_text:
            result = dict(result)
            result["output"] = (
                "{}\n\n{}".format(result["output"], signal_text) if result["output"] else signal_text
            )
        if tool.safe in REPORTING_TOOLS:
            state.reported = True
        if tool.name in ENDING_TOOLS:
            state.ended = True
            state.end_output = result["output"]
        return tool_message(result, edited_note)

    def refuse(self, call, tool_input, answer, tool=None):
        """Answer a call that cannot run, and record it as a failed call: a person sees what the model tried."""
        fields = {"tool": tool or call.name, "input": tool_input, "error": answer, "callKey": new_call_key()}
        try:
            self.post_through_restarts("/runner/tool-calls/refused", fields)
        except ControllerError as error:
            self.warn("%s (refused call of %s not recorded)", error, call.name)
        return answer

    def record_reminder(self, text):
        try:
            self.client.post("/runner/history/messages", {"role": "user", "kind": "contract_reminder", "content": text})
        except ControllerError as error:
            self.warn("%s (contract reminder not recorded in history)", error)

    def fetch_before(self, tool, args):
        """The files a tool reads are current (FileSync.before); a failure fails the tool."""
        if self.files is not None:
            self.files.before(tool, args)

    def sent_files(self, tool, error):
        """After a tool: FileSync.after (what it may have written sent back). Returns the tool's error text,
        with a refused changeset's reason added (the changes are sent again after the next call)."""
        if self.files is None:
            return error
        try:
            self.files.after(tool)
        except (ControllerError, OSError) as sync_error:
            note = f"Files not saved to the controller: {sync_error}"
            return f"{error}\n{note}" if error else note
        return error

    def wait_for_approval(self, approval_id):
        """Ask the controller for the decision until there is one. The agent keeps running; a
        controller that is down (restarting) is asked again, so a restarted `serve` delivers it."""
        self.warn("waiting for approval %s", approval_id)
        while True:
            try:
                answer = self.client.post(
                    "/runner/approvals/wait",
                    {"approvalId": approval_id, "waitMs": APPROVAL_WAIT_MS},
                    read_timeout=APPROVAL_WAIT_MS / 1000 + 30,
                )
            except ControllerError as error:
                if error.status is not None and error.status < 500:
                    return {"run": False, "status": "error", "output": str(error)}
                self.warn("waiting for approval %s: %s (asking again)", approval_id, error)
                self.sleep(CONTROLLER_RETRY_S)
                continue
            if isinstance(answer, dict) and answer.get("status") != "pending":
                return answer
            retry_ms = answer.get("retryAfterMs") if isinstance(answer, dict) else None
            if isinstance(retry_ms, (int, float)) and not isinstance(retry_ms, bool) and retry_ms > 0:
                self.sleep(min(retry_ms / 1000, 5.0))  # the controller holds too many waits already

    def post_through_restarts(self, path, fields):
        """POST a call that is safe to repeat (a keyed tool-call start, a finish, the output): a controller
        that did not answer or answered 5xx (down, restarting, killed after its commit) is asked again
        every CONTROLLER_RETRY_S for up to RESTART_WINDOW_S; one whose disk is full, every
        DISK_FULL_RETRY_S until it has space again. Then, or on a 4xx, the error is raised."""
        deadline = time.monotonic() + RESTART_WINDOW_S
        while True:
            try:
                return self.client.post(path, fields)
            except ControllerError as error:
                disk_full = error.status == INSUFFICIENT_STORAGE
                if (error.status is not None and error.status < 500) or (
                        not disk_full and time.monotonic() >= deadline):
                    raise
                self.warn("%s: %s (asking again)", path, error)
            self.sleep(DISK_FULL_RETRY_S if disk_full else CONTROLLER_RETRY_S)

    def _finish_recorded(self, tool_call_id, recorded):
        """A replay with recorded tools: the source's result is audited and shown, the tool never runs."""
        status = "completed" if recorded.get("status") == "completed" else "failed"
        fields = {"toolCallId": tool_call_id, "status": status}
        fields.update({"output": recorded.get("output") or ""} if status == "completed"
                      else {"error": recorded.get("error") or ""})
        try:
            self.post_through_restarts("/runner/tool-calls/finish", fields)
        except ControllerError as error:
            return str(error)
        text = recorded.get("text")
        return text if isinstance(text, str) else tool_message({"output": recorded.get("output")})

    def _fail_tool_call(self, tool_call_id, message):
        try:
            self.post_through_restarts(
                "/runner/tool-calls/finish",
                {"toolCallId": tool_call_id, "status": "failed", "error": message},
            )
        except ControllerError as error:
            self.warn("%s (failed tool call not recorded)", error)
        return message

    # -- compaction ----------------------------------------------------------------------------

    def compact_for_overflow(self, attempt, provider, selected, history, overflow_error):
        """Summarize the archived head, persist the compaction, return the history to retry with."""
        keep_tail = max(1, retry_tail_count(history))
        archived = history[: len(history) - keep_tail]
        summary = None
        if archived:
            cap = min(attempt.preset.get("maxOutputTokens") or SUMMARY_MAX_TOKENS, SUMMARY_MAX_TOKENS)
            try:
                turn = provider.complete(
                    [{"role": "user", "content": summary_prompt(archived)}], [], None, cap
                )
                summary = trim_chars(turn.text, SUMMARY_MAX_CHARS) or NO_SUMMARY_TEXT
            except Exception as error:  # noqa: BLE001 - any failure: use the deterministic summary
                self.warn("History summary request to %s failed: %s", attempt.preset_id, error)
                summary_error = str(error)
        else:
            summary_error = (
                "No pre-activation segment was available to summarize; the active controller "
                "history is compacted."
            )
        if summary is None:
            summary = fallback_summary(
                history, archived, keep_tail, self.agent_id, selected, str(overflow_error), summary_error
            )
        response = self.client.post(
            "/runner/history/compact",
            {
                "summary": summary,
                "keepTail": keep_tail,
                "reason": "provider_context_overflow",
                "selectedModel": selected,
            },
        )
        new_history = response.get("history") if isinstance(response, dict) else None
        return new_history if isinstance(new_history, list) and new_history else history
