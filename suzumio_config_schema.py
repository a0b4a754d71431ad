"""The shape of a project file (docs/configuration.md): a small schema language (strict types,
defaults, every issue collected with its dotted path and a hint) and the project schema written in it.
validate_schema() turns a merged tree into a normalized one with every default; suzumio_config does
what comes after (post-validation, the typed ProjectConfig). Why a schema language of its own rather
than JSON Schema: docs/design/config.md."""
import copy
import difflib
import json
import math
import re

import suzumio_egress_policy
from suzumio_backend_contract import BACKEND_KINDS
from suzumio_errors import ConfigError
from suzumio_records import DEFAULT_CHANNELS, DEFAULT_COORDINATOR, PRIORITIES
from suzumio_registry import PACKAGED_TOOLPACKS
from suzumio_yaml import HTTP_URL

# Used by runners only when `serve --runner-listen` moves the runner routes onto TCP.
DEFAULT_CONTROLLER_URL = "http://host.docker.internal:39400"

# Limits every activation container gets unless backend.docker or agents.<id>.docker say otherwise;
# `false` turns one off (docs/configuration.md#network-and-privileges; docs/spec-notes.md#least-privilege-by-default).
DEFAULT_MEMORY = "4g"
DEFAULT_CPUS = 2
DEFAULT_PIDS_LIMIT = 1024
DEFAULT_WARM = 2  # prepared runners per running project; false or 0 turns them off
DEFAULT_ARTIFACT_QUOTA = "2GiB"  # what one agent's artifacts folder may hold; a normal host has room for many
DEFAULT_KEEP_RECORDED = 2000  # activations whose recordings are kept (recording.keepActivations)
DEFAULT_KEEP = 5  # exited activation containers kept per agent for inspection; "all" keeps every one
# Nudges in a row (no-effect and failed alike) before an agent is left to wait for a person or a new
# signal: a model that ignored three reminders (the no-effect ones come at once, after 30 s, after 60 s)
# is not helped by a fourth (docs/operations.md#runaways).
DEFAULT_NUDGES_IN_A_ROW = 3
# A preset's maxOutputTokens when not given: what the Anthropic adapter always sent, now for every provider.
DEFAULT_MAX_OUTPUT_TOKENS = 8192


# ---------------------------------------------------------------------------------------------------
# Schema: strict types, defaults, issue collection (docs/configuration.md)

_INVALID = object()   # a node's check failed; the issue is already recorded
_REQUIRED = object()  # field default: the key must be present
_OMIT = object()      # field default: absent stays absent
_FULL = object()      # field default: the object schema applied to {}


def _type_name(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "nan" if isinstance(value, float) and math.isnan(value) else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _format_path(path):
    # A key with a line break or other control character is quoted, so each issue stays one line.
    return ".".join(_path_part(part) for part in path) if path else "(root)"


def _path_part(part):
    text = str(part)
    return text if text.isprintable() else json.dumps(text)


class _Issues:
    def __init__(self):
        self.items = []
        self.unknown = []  # "<path>: unknown key (did you mean <key>?)" lines, in document order

    def unknown_key(self, path, key, known):
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        self.unknown.append(f"{_format_path(list(path) + [key])}: unknown key{hint}")

    def add(self, path, message):
        self.items.append((tuple(path), message))

    def raise_if_any(self):
        if self.items:
            lines = [f"  - {_format_path(path)}: {message}" for path, message in self.items]
            raise ConfigError("Invalid project config:\n" + "\n".join(lines))


class _Str:
    def __init__(self, nonempty=False):
        self.nonempty = nonempty

    def check(self, value, path, issues):
        if not isinstance(value, str):
            issues.add(path, f"Expected string, received {_type_name(value)}")
            return _INVALID
        if self.nonempty and not value:
            issues.add(path, "String must contain at least 1 character(s)")
            return _INVALID
        return value


class _EgressEntry(_Str):
    """One `agents.<id>.egress` entry, in the grammar of suzumio_egress_policy.parse_entry, or a mapping
    `{host, port?, credentials?, idempotencyKey?}` (suzumio_egress_policy.parse_host_rule)."""

    def check(self, value, path, issues):
        if isinstance(value, dict):
            try:
                suzumio_egress_policy.parse_host_rule(value)
            except ValueError as error:
                where, _, message = str(error).partition(": ")
                issues.add((*path, *where.split(".")) if message else path, message or str(error))
                return _INVALID
            return value
        value = super().check(value, path, issues)
        if value is _INVALID:
            return value
        try:
            suzumio_egress_policy.parse_entry(value)
        except ValueError as error:
            issues.add(path, f"{error} (expected host, host:port, *.domain, a CIDR or public)")
            return _INVALID
        return value


class _Num:
    """A finite number; integer=True also requires no fractional part (20.0 is accepted as 20)."""

    def __init__(self, integer=False, gt=None, ge=None):
        self.integer, self.gt, self.ge = integer, gt, ge

    def check(self, value, path, issues):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            issues.add(path, f"Expected number, received {_type_name(value)}")
            return _INVALID
        if isinstance(value, float) and math.isnan(value):
            issues.add(path, "Expected number, received nan")
            return _INVALID
        ok = True
        if isinstance(value, float) and math.isinf(value):
            issues.add(path, "Expected integer, received float" if self.integer else "Number must be finite")
            return _INVALID
        if self.integer and isinstance(value, float) and not value.is_integer():
            issues.add(path, "Expected integer, received float")
            ok = False
        if self.gt is not None and not value > self.gt:
            issues.add(path, f"Number must be greater than {self.gt}")
            ok = False
        if self.ge is not None and not value >= self.ge:
            issues.add(path, f"Number must be greater than or equal to {self.ge}")
            ok = False
        if not ok:
            return _INVALID
        return int(value) if isinstance(value, float) and value.is_integer() else value


class _Bool:
    def check(self, value, path, issues):
        if not isinstance(value, bool):
            issues.add(path, f"Expected boolean, received {_type_name(value)}")
            return _INVALID
        return value


class _Enum:
    def __init__(self, *values):
        self.values = values

    def check(self, value, path, issues):
        expected = " | ".join(f"'{v}'" for v in self.values)
        if not isinstance(value, str):
            issues.add(path, f"Expected {expected}, received {_type_name(value)}")
            return _INVALID
        if value not in self.values:
            issues.add(path, f"Invalid enum value. Expected {expected}, received '{value}'")
            return _INVALID
        return value


class _Literal:
    def __init__(self, value):
        self.value = value

    def check(self, value, path, issues):
        if value != self.value or not isinstance(value, type(self.value)):
            issues.add(path, f"Invalid literal value, expected {json.dumps(self.value)}")
            return _INVALID
        return value


class _Any:
    def check(self, value, path, issues):
        return copy.deepcopy(value)


class _List:
    def __init__(self, item, nonempty=False):
        self.item, self.nonempty = item, nonempty

    def check(self, value, path, issues):
        if not isinstance(value, list):
            issues.add(path, f"Expected array, received {_type_name(value)}")
            return _INVALID
        out = [self.item.check(item, path + [index], issues) for index, item in enumerate(value)]
        if self.nonempty and not value:
            issues.add(path, "Array must contain at least 1 element(s)")
            return _INVALID
        return _INVALID if any(item is _INVALID for item in out) else out


class _Record:
    def __init__(self, item):
        self.item = item

    def check(self, value, path, issues):
        if not isinstance(value, dict):
            issues.add(path, f"Expected object, received {_type_name(value)}")
            return _INVALID
        out = {key: self.item.check(item, path + [key], issues) for key, item in value.items()}
        return _INVALID if any(item is _INVALID for item in out.values()) else out


class _EnvOptionalStr(_Str):
    """A string where null and "" both mean absent (backend.docker.proxy.*)."""


class _Obj:
    """A schema object: fields in render order, unknown keys dropped, defaults for absent keys."""

    def __init__(self, *fields):
        self.fields = fields  # (key, node, default)

    def preprocess(self, value):
        return value, {}

    def rules(self, value, path, issues):
        return True

    def check(self, value, path, issues):
        if not isinstance(value, dict):
            issues.add(path, f"Expected object, received {_type_name(value)}")
            return _INVALID
        value, spelled = self.preprocess(value)
        known = [key for key, _node, _default in self.fields]
        for key in value:
            if key not in known and key not in spelled.values():
                issues.unknown_key(path, key, known)
        out, ok = {}, True
        for key, node, default in self.fields:
            present = key in value
            if present and isinstance(node, _EnvOptionalStr) and value[key] in (None, ""):
                present = False
            if not present:
                if default is _REQUIRED:
                    issues.add(path + [spelled.get(key, key)], "Required")
                    ok = False
                elif default is _FULL:
                    out[key] = node.check({}, path + [key], issues)
                elif default is not _OMIT:
                    out[key] = copy.deepcopy(default)
                continue
            checked = node.check(value[key], path + [spelled.get(key, key)], issues)
            if checked is _INVALID:
                ok = False
            else:
                out[key] = checked
        if not ok:
            return _INVALID
        return out if self.rules(out, path, issues) else _INVALID


class _SchedulerObj(_Obj):
    def preprocess(self, value):
        value = dict(value)
        legacy = value.pop("maxPromptMessages", None)
        if "maxSignalsPerActivation" not in value and legacy is not None:
            value["maxSignalsPerActivation"] = legacy
        return value, {}


class _PresetObj(_Obj):
    def preprocess(self, value):
        value = dict(value)
        if "modelList" in value:
            value.pop("model-list", None)
            return value, {}
        if "model-list" in value:
            value["modelList"] = value.pop("model-list")
            return value, {"modelList": "model-list"}
        return value, {}

    def rules(self, preset, path, issues):
        ok = True
        if "modelList" in preset and any(preset.get(k) is not None for k in ("provider", "model", "apiModel")):
            issues.add(path, "modelList presets cannot also set provider/model/apiModel")
            ok = False
        if "modelList" not in preset and not (preset.get("provider") and preset.get("model")):
            issues.add(path, "model presets need provider and model, or model-list")
            ok = False
        if "modelList" in preset and not preset["modelList"]:
            issues.add(path, "model-list cannot be empty")
            ok = False
        return ok


class _BudgetObj(_Obj):
    def rules(self, budget, path, issues):
        if "maxTokens" not in budget and "maxCostUsd" not in budget:
            issues.add(path, "budget needs maxTokens or maxCostUsd")
            return False
        return True


class _ProviderObj(_Obj):
    def rules(self, provider, path, issues):
        if provider["type"] == "scripted" and "script" not in provider:
            issues.add(path + ["script"], "Required")
            return False
        if provider["type"] != "scripted" and "script" in provider:
            issues.add(path + ["script"], "Only allowed when type is scripted")
            return False
        return True


class _OrFalse:
    """`false` (the limit is off), or a value that `node` accepts."""

    def __init__(self, node):
        self.node = node

    def check(self, value, path, issues):
        if value is False:
            return False
        return self.node.check(value, path, issues)


SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
SIZE_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(value):
    """Bytes of a size as written: a whole number of bytes, or a number with B, KB, MB, GB, TB (powers
    of 1000) or KiB, MiB, GiB, TiB (powers of 1024), case-insensitive. None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    match = SIZE_TEXT.match(value) if isinstance(value, str) else None
    if match is None or match.group(2).upper() not in SIZE_UNITS:
        return None
    size = int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])
    return size if size > 0 else None


class _Size:
    """A size > 0 (parse_size), kept as written."""

    def check(self, value, path, issues):
        if parse_size(value) is None:
            issues.add(path, "Expected a size such as 2GiB, 500MB or a number of bytes")
            return _INVALID
        return value


class _Keep:
    """A whole number >= 0, or "all"."""

    def check(self, value, path, issues):
        if value == "all":
            return value
        return _Num(integer=True, ge=0).check(value, path, issues)


class _TimeoutMs:
    """A positive integer, or false."""

    def check(self, value, path, issues):
        if value is False:
            return False
        return _Num(integer=True, gt=0).check(value, path, issues)


class _Script:
    """An inline script mapping, or the path of a script file (loaded by load-time step 5.6)."""

    def check(self, value, path, issues):
        if isinstance(value, (dict, str)):
            return copy.deepcopy(value)
        issues.add(path, f"Expected object, received {_type_name(value)}")
        return _INVALID


class _ToolpackEntry:
    """`core` etc., or a mapping with exactly one of a non-empty string `path` and a `packaged` value."""

    _packaged = _Enum(*PACKAGED_TOOLPACKS)
    _id = _Str(nonempty=True)

    def check(self, value, path, issues):
        if isinstance(value, str) and value:
            return value
        if not isinstance(value, dict):
            issues.add(path, "Invalid input")
            return _INVALID
        if "mcp" in value:
            return _check_mcp_entry(value, path, issues)
        has_path = isinstance(value.get("path"), str) and value["path"] != ""
        if has_path == ("packaged" in value) or ("path" in value and not has_path):
            issues.add(path, "Invalid input")
            return _INVALID
        out = {}
        if "id" in value:
            checked = self._id.check(value["id"], path + ["id"], issues)
            if checked is _INVALID:
                return _INVALID
            out["id"] = checked
        if has_path:
            out["path"] = value["path"]
        else:
            checked = self._packaged.check(value["packaged"], path + ["packaged"], issues)
            if checked is _INVALID:
                return _INVALID
            out["packaged"] = checked
        return out


MCP_STDIO_KEYS = ("command", "env", "envFrom", "cwd", "where")
MCP_HTTP_KEYS = ("url", "headers", "headersEnv")
MCP_WHERE = ("controller", "runner")


def _check_string_map(value, path, issues):
    if not isinstance(value, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                              for k, v in value.items()):
        issues.add(path, "Expected a mapping of strings to strings")
        return False
    return True


def _check_mcp_entry(value, path, issues):
    """`{id, mcp: {command: [...], env?, envFrom?, cwd?, where?}}` (stdio) or `{id, mcp: {url, headers?,
    headersEnv?}}` (streamable HTTP): an MCP toolpack (docs/mcp.md)."""
    extra = sorted(set(value) - {"id", "mcp"})
    if extra:
        issues.add(path + [extra[0]], "Not allowed in an MCP toolpack entry (use id and mcp)")
    if not isinstance(value.get("id"), str) or not value.get("id"):
        issues.add(path + ["id"], "Required: an MCP toolpack entry names its id (tools become <id>.<tool>)")
    mcp, mpath = value["mcp"], path + ["mcp"]
    if not isinstance(mcp, dict):
        issues.add(mpath, f"Expected object, received {_type_name(mcp)}")
        return _INVALID
    if ("command" in mcp) == ("url" in mcp):
        issues.add(mpath, "Needs exactly one of command (stdio) and url (streamable HTTP)")
        return _INVALID
    allowed = MCP_STDIO_KEYS if "command" in mcp else MCP_HTTP_KEYS
    for key in mcp:
        if key not in allowed:
            issues.add(mpath + [key], f"Not allowed here (allowed: {', '.join(allowed)})")
    ok = True
    if "command" in mcp:
        command = mcp["command"]
        if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
            issues.add(mpath + ["command"], "Expected a non-empty list of non-empty strings")
            ok = False
        if "cwd" in mcp and (not isinstance(mcp["cwd"], str) or not mcp["cwd"]):
            issues.add(mpath + ["cwd"], "Expected a non-empty string")
            ok = False
        if mcp.get("where", "controller") not in MCP_WHERE:
            issues.add(mpath + ["where"], f"Expected one of {', '.join(MCP_WHERE)}")
            ok = False
        for key in ("env", "envFrom"):
            if key in mcp:
                ok = _check_string_map(mcp[key], mpath + [key], issues) and ok
        if mcp.get("where") == "runner" and "envFrom" in mcp:
            issues.add(mpath + ["envFrom"], "Not allowed with where: runner (controller variables never "
                                            "reach a container)")
            ok = False
    else:
        url = mcp["url"]
        if not isinstance(url, str) or not HTTP_URL.match(url):
            issues.add(mpath + ["url"], "Expected an http:// or https:// URL")
            ok = False
        for key in ("headers", "headersEnv"):
            if key in mcp:
                ok = _check_string_map(mcp[key], mpath + [key], issues) and ok
    if not ok or extra or not isinstance(value.get("id"), str) or not value.get("id"):
        return _INVALID
    return {"id": value["id"], "mcp": copy.deepcopy(mcp)}


_PRIORITY = _Enum(*PRIORITIES)
_INT_GE0 = _Num(integer=True, ge=0)
_INT_GT0 = _Num(integer=True, gt=0)
_TEXT = _Str(nonempty=True)

ALL_QUIET_MESSAGE = (
    "All agents are quiet and there are no pending work signals for this running project.\n\n"
    "Treat this as a coordination stall: ask workers for current progress, tell them to continue, or resend "
    "any missing work/review messages. Use targeted messages rather than waiting silently.")
FAILED_NUDGE_MESSAGE = (
    "Your previous activation failed before submitting output.\n\n"
    "Retry from the existing history and workspace. If the failure repeats or appears persistent, report the "
    "exact blocker to the coordinator instead of ending silently.")
QUIET_MONITOR_MESSAGE = (
    "Agent `{{agent}}` has been quiet for {{quietMinutes}} minutes.\n\n"
    "If this is unexpected, send it a follow-up assignment or ask for status. If it is intentionally waiting, "
    "no action is needed.")
FAILED_MONITOR_MESSAGE = (
    "Agent `{{agent}}` has been failed for {{failedMinutes}} minutes after activation `{{activationId}}`.\n\n"
    "Last error: {{error}}\n\n"
    "PM: send a concrete retry/follow-up or reassign the lane. If failedNudge is enabled, check whether an "
    "automatic retry is already pending before intervening.")


def runaway_warnings(scheduler):
    """The `config render` and `init` lines for a nudge that may wake an agent forever (a typed
    SchedulerConfig): `maxConsecutive: 0` on an enabled no-effect or failed nudge."""
    lines = []
    for name, rule, what in (("noEffectNudge", scheduler.no_effect_nudge, "an agent that does nothing"),
                             ("failedNudge", scheduler.failed_nudge, "an agent that keeps failing")):
        if rule.enabled and rule.max_consecutive == 0:
            lines.append(f"Warning: scheduler.{name}.maxConsecutive 0: the nudge is unbounded, {what} is "
                         f"woken again every maxDelayMs ({rule.max_delay_ms // 1000} s) until a person stops it")
    return lines


def _monitor_schema(priority, initial_delay_ms, message):
    rule = _Obj(
        ("id", _TEXT, _OMIT),
        ("enabled", _Bool(), True),
        ("agent", _TEXT, _REQUIRED),
        ("recipient", _TEXT, DEFAULT_COORDINATOR),
        ("sender", _TEXT, "monitor"),
        ("priority", _PRIORITY, priority),
        ("initialDelayMs", _INT_GE0, initial_delay_ms),
        ("repeatDelayMs", _INT_GT0, 900000),
        ("message", _TEXT, message),
    )
    return _Obj(("enabled", _Bool(), False), ("rules", _List(rule), []))


_SCHEDULER = _SchedulerObj(
    ("kind", _Enum("nonpreemptive-mailbox", "nonpreemptive-signals"), "nonpreemptive-signals"),
    ("maxSignalsPerActivation", _INT_GT0, 20),
    ("noEffectNudge", _Obj(
        ("enabled", _Bool(), True),
        ("priority", _PRIORITY, "P3"),
        ("maxConsecutive", _INT_GE0, DEFAULT_NUDGES_IN_A_ROW),
        ("initialDelayMs", _INT_GE0, 30000),
        ("backoffFactor", _Num(ge=1), 2),
        ("maxDelayMs", _INT_GE0, 300000),
    ), _FULL),
    ("failedNudge", _Obj(
        ("enabled", _Bool(), False),
        ("priority", _PRIORITY, "P2"),
        ("maxConsecutive", _INT_GE0, DEFAULT_NUDGES_IN_A_ROW),
        ("initialDelayMs", _INT_GE0, 60000),
        ("backoffFactor", _Num(ge=1), 2),
        ("maxDelayMs", _INT_GE0, 900000),
        ("message", _TEXT, FAILED_NUDGE_MESSAGE),
    ), _FULL),
    ("allQuietNudge", _Obj(
        ("enabled", _Bool(), False),
        ("targetAgent", _TEXT, DEFAULT_COORDINATOR),
        ("priority", _PRIORITY, "P3"),
        ("cooldownMs", _INT_GT0, 300000),
        ("message", _TEXT, ALL_QUIET_MESSAGE),
    ), _FULL),
    ("quietAgentMonitor", _monitor_schema("P3", 1800000, QUIET_MONITOR_MESSAGE), _FULL),
    ("failedAgentMonitor", _monitor_schema("P2", 300000, FAILED_MONITOR_MESSAGE), _FULL),
)

_COMMUNICATION = _Obj(
    ("coordinatorAgent", _TEXT, DEFAULT_COORDINATOR),
    ("restrictNonCoordinatorToCoordinator", _Bool(), False),
    ("nonCoordinatorMaxPriority", _PRIORITY, "P2"),
    ("pmRoutineVerifierPriority", _PRIORITY, "P3"),
)

_MOUNT = _Obj(
    ("source", _TEXT, _REQUIRED),
    ("target", _TEXT, _REQUIRED),
    ("readonly", _Bool(), True),
    ("description", _Str(), _OMIT),
)

_PROVIDER = _ProviderObj(
    ("type", _Enum("openai", "anthropic", "google", "openai-compatible", "scripted"), _REQUIRED),
    ("apiKey", _Str(), _OMIT),
    ("apiKeyEnv", _Str(), _OMIT),
    ("baseURL", _Str(), _OMIT),
    ("baseURLEnv", _Str(), _OMIT),
    ("headers", _Record(_Str()), {}),
    ("timeoutMs", _TimeoutMs(), _OMIT),
    ("chunkTimeoutMs", _INT_GT0, _OMIT),
    ("firstByteTimeoutMs", _INT_GT0, _OMIT),
    # What the controller lets the whole team send to this provider (suzumio_model_gate)
    ("limits", _Obj(
        ("concurrency", _INT_GT0, _OMIT),
        ("requestsPerMinute", _INT_GT0, _OMIT),
        ("tokensPerMinute", _INT_GT0, _OMIT),
    ), _OMIT),
    ("options", _Record(_Any()), {}),
    ("script", _Script(), _OMIT),
)

_PRESET = _PresetObj(
    ("provider", _Str(), _OMIT),
    ("model", _Str(), _OMIT),
    ("modelList", _List(_Str()), _OMIT),
    ("apiModel", _Str(), _OMIT),
    ("reasoningEffort", _Str(), _OMIT),
    ("temperature", _Num(), _OMIT),
    ("topP", _Num(), _OMIT),
    ("topK", _Num(), _OMIT),
    # A request without a cap lets a model that repeats itself generate until its context is full, holding
    # the provider (a local server's one slot) for minutes: measured with a 1.5B model on llama.cpp.
    ("maxOutputTokens", _INT_GT0, DEFAULT_MAX_OUTPUT_TOKENS),
    ("contextLimit", _INT_GT0, 260000),
    ("toolChoice", _Enum("auto", "required", "none"), _OMIT),
    ("providerOptions", _Record(_Any()), {}),
    ("headers", _Record(_Str()), {}),
    # Retries of this preset (overrides the provider's options.maxRetries) and its prices
    ("maxRetries", _INT_GE0, _OMIT),
    ("pricing", _Obj(
        ("inputPerMTok", _Num(ge=0), _REQUIRED),
        ("outputPerMTok", _Num(ge=0), _REQUIRED),
        ("cacheReadPerMTok", _Num(ge=0), _OMIT),
        ("cacheWritePerMTok", _Num(ge=0), _OMIT),
    ), _OMIT),
)

def _container_fields(network, memory, cpus, pids_limit, cap_add):
    """The container settings of backend.docker and of agents.<id>.docker (which inherits what it omits)."""
    return (
        ("network", _Str(), network),
        ("memory", _OrFalse(_TEXT), memory),
        ("cpus", _OrFalse(_Num(gt=0)), cpus),
        ("pidsLimit", _OrFalse(_INT_GT0), pids_limit),
        ("user", _TEXT, _OMIT),
        ("capAdd", _List(_TEXT), cap_add),
    )


def _swarm_placement_fields():
    """Where an activation's task may run and what it reserves (backend.swarm, agents.<id>.swarm)."""
    resources = _Obj(("cpus", _Num(gt=0), _OMIT), ("memory", _Size(), _OMIT))
    return (
        ("constraints", _List(_TEXT), _OMIT),
        ("preferences", _List(_TEXT), _OMIT),  # spread over these node labels, in order
        ("reservations", resources, _OMIT),
        ("limits", resources, _OMIT),
    )


_BACKEND = _Obj(
    ("kind", _Enum(*BACKEND_KINDS), BACKEND_KINDS[0]),
    ("image", _Str(), "suzumio-runner:dev"),
    ("controllerUrl", _Str(), DEFAULT_CONTROLLER_URL),
    ("activationTimeoutMs", _INT_GT0, 3600000),
    ("warm", _OrFalse(_INT_GE0), _OMIT),  # Prepared runners per project (DEFAULT_WARM)
    ("artifactQuota", _OrFalse(_Size()), DEFAULT_ARTIFACT_QUOTA),  # per agent; agents.<id>.artifactQuota overrides
    ("docker", _Obj(
        *_container_fields(network=_OMIT, memory=DEFAULT_MEMORY, cpus=DEFAULT_CPUS, pids_limit=DEFAULT_PIDS_LIMIT,
                           cap_add=[]),
        ("grantNetwork", _Bool(), False),
        ("keep", _Keep(), DEFAULT_KEEP),
        ("mounts", _List(_MOUNT), []),
        ("proxy", _Obj(
            ("inheritEnv", _Bool(), True),
            ("http", _EnvOptionalStr(), _OMIT),
            ("https", _EnvOptionalStr(), _OMIT),
            ("all", _EnvOptionalStr(), _OMIT),
            ("noProxy", _EnvOptionalStr(), _OMIT),
            ("rewriteLocalhost", _Bool(), True),
        ), _FULL),
    ), _FULL),
    # One replicated-job service per activation on a Swarm (docs/operations.md#beyond-one-machine-swarm-and-kubernetes).
    ("swarm", _Obj(
        ("engine", _TEXT, _OMIT),  # a manager's engine URL; default DOCKER_HOST, else the local engine
        ("network", _TEXT, "sealed"),  # sealed: a task's own internal overlay; or `host`, or an overlay to join
        ("resolveImage", _Enum("never", "always", "changed"), "never"),  # never: images pre-loaded on the nodes
        *_swarm_placement_fields(),
    ), _OMIT),
    ("runner", _Obj(
        ("mode", _Literal("ai"), "ai"),
        ("model", _Str(), _OMIT),
        ("maxIterations", _INT_GT0, _OMIT),
        ("maxToolCalls", _INT_GT0, _OMIT),
        ("budget", _BudgetObj(("maxTokens", _INT_GT0, _OMIT), ("maxCostUsd", _Num(gt=0), _OMIT)), _OMIT),
        ("models", _Obj(
            ("providers", _Record(_PROVIDER), {}),
            ("presets", _Record(_PRESET), {}),
        ), _OMIT),
    ), _FULL),
)

class _ApprovalRuleObj(_Obj):
    """One approval rule; every `match` pattern must compile (Python `re`, searched)."""

    def rules(self, rule, path, issues):
        ok = True
        for field_name, pattern in rule.get("match", {}).items():
            try:
                re.compile(pattern)
            except re.error as exc:
                issues.add(path + ["match", field_name], f"invalid regular expression {pattern!r}: {exc}")
                ok = False
        return ok


# `agents.<id>.approve` and `tools.approve`; absent stays absent (rendered only when written).
DEFAULT_APPROVAL_TIMEOUT_MS = 1800000
_APPROVE = _List(_ApprovalRuleObj(
    ("tool", _TEXT, _REQUIRED),
    ("match", _Record(_Str()), _OMIT),
    ("timeoutMs", _INT_GT0, DEFAULT_APPROVAL_TIMEOUT_MS),
    ("onExpiry", _Enum("deny", "allow"), "deny"),
))

# Loop guards (docs/operations.md#runaways): each rule is a count, or false for off; absent stays absent
# (ProjectConfig.guards applies the agent's own, then the project's, then these defaults).
DEFAULT_GUARDS = {"repeatedToolCall": 5, "pingPong": 10}
_GUARDS = _Obj(("repeatedToolCall", _OrFalse(_Num(integer=True, ge=2)), _OMIT),
               ("pingPong", _OrFalse(_Num(integer=True, ge=2)), _OMIT))

_AGENT = _Obj(
    ("role", _Str(), _OMIT),
    ("displayName", _Str(), _OMIT),
    ("names", _List(_Str()), _OMIT),
    ("count", _INT_GT0, _OMIT),
    ("prompt", _Str(), ""),
    ("model", _Str(), _OMIT),
    ("tools", _List(_Str()), []),
    ("mounts", _List(_MOUNT), []),
    ("env", _Record(_Str()), {}),
    ("network", _Bool(), _OMIT),
    ("docker", _Obj(*_container_fields(_OMIT, _OMIT, _OMIT, _OMIT, _OMIT)), _OMIT),
    ("swarm", _Obj(*_swarm_placement_fields()), _OMIT),
    ("approve", _APPROVE, _OMIT),
    ("artifactQuota", _OrFalse(_Size()), _OMIT),
    ("egress", _List(_EgressEntry()), _OMIT),
    ("egressLimits", _Obj(("bytes", _INT_GT0, _OMIT), ("connections", _INT_GT0, _OMIT)), _OMIT),
    ("guards", _GUARDS, _OMIT),
)

_PROJECT = _Obj(
    ("strict", _Bool(), _OMIT),
    ("name", _TEXT, _REQUIRED),
    ("task", _TEXT, _REQUIRED),
    ("scheduler", _SCHEDULER, _FULL),
    ("communication", _COMMUNICATION, _FULL),
    ("backend", _BACKEND, _FULL),
    ("agents", _Record(_AGENT), {}),
    ("channels", _List(_Str()), list(DEFAULT_CHANNELS)),
    ("tools", _Obj(("toolpacks", _List(_ToolpackEntry()), ["core", "web"]),
                   ("approve", _APPROVE, _OMIT)), _FULL),  # Approve
    ("platforms", _List(_Any()), []),
    ("guards", _GUARDS, _OMIT),
    ("limits", _Obj(("maxConcurrentActivations", _INT_GT0, _OMIT)), _OMIT),
    ("observability", _Obj(
        ("http", _Obj(
            ("enabled", _Bool(), True),
            ("host", _Str(), "127.0.0.1"),
            ("port", _INT_GT0, 39400),
        ), _FULL),
        ("webui", _Obj(("enabled", _Bool(), True)), _FULL),
    ), _FULL),
    # The flight recorder (docs/replay.md): model exchanges and artifact versions of the newest
    # `keepActivations` activations are kept, so a run can be replayed, forked and diffed.
    ("recording", _Obj(
        ("enabled", _Bool(), True),
        ("keepActivations", _INT_GT0, DEFAULT_KEEP_RECORDED),
    ), _FULL),
    # The team's repository (docs/teams-that-write-code.md): absent, the project has none.
    ("repository", _Obj(
        ("source", _TEXT, _REQUIRED),
        ("branch", _TEXT, _OMIT),
        ("checks", _List(_TEXT), []),
        ("agents", _List(_TEXT), _OMIT),
        ("claims", _Bool(), False),
    ), _OMIT),
)


def validate_schema(tree, unknown=None):
    """Validate a merged tree and materialize defaults; all issues are reported together. Keys the
    schema does not know are dropped; their lines are appended to `unknown` when it is a list. Free-form
    maps (agent env, headers, options, scripts, toolpack config, platforms) are not checked."""
    issues = _Issues()
    result = _PROJECT.check(tree, [], issues)
    issues.raise_if_any()
    if unknown is not None:
        unknown.extend(issues.unknown)
    return result


def unknown_keys(tree):
    """The unknown-key lines of a project tree (as read, `extends` applied), whatever else is wrong in it."""
    issues = _Issues()
    if isinstance(tree, dict):
        tree = {key: value for key, value in tree.items() if key != "extends"}
    _PROJECT.check(tree, [], issues)
    return list(issues.unknown)


# ---------------------------------------------------------------- cross references

RESERVED_AGENT_ID = "user"


def _written(tree, *path):
    """The value at path in the merged tree before defaults, or None when not written there."""
    for key in path:
        if isinstance(key, int):
            if not isinstance(tree, list) or key >= len(tree):
                return None
        elif not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def check_references(data, merged, agent_ids):
    """Every agent a setting names is in the team. A default `pm` only where a feature that is on sends to
    it: the coordinator with restrictNonCoordinatorToCoordinator, the all-quiet nudge's target, an
    enabled monitor rule's recipient (coordinator_warning covers the rest)."""
    def check(path, allow_user=False, needed=True):
        value, written = _value(data, path), _written(merged, *path)
        if value in agent_ids or (allow_user and value == RESERVED_AGENT_ID):
            return
        name, also = ".".join(map(str, path)), f" or {RESERVED_AGENT_ID}" if allow_user else ""
        if written is not None and written != DEFAULT_COORDINATOR:
            raise ConfigError(f"{name}: unknown agent {value}")
        if needed:
            raise ConfigError(f'{name}: agent "{value}" is not in agents ({", ".join(sorted(agent_ids))}); '
                              f"set {name} to one of them{also}")
    check(("communication", "coordinatorAgent"), needed=data["communication"]["restrictNonCoordinatorToCoordinator"])
    check(("scheduler", "allQuietNudge", "targetAgent"), needed=data["scheduler"]["allQuietNudge"]["enabled"])
    for monitor in ("quietAgentMonitor", "failedAgentMonitor"):
        for index, rule in enumerate(data["scheduler"][monitor]["rules"]):
            if rule["agent"] not in agent_ids:
                raise ConfigError(f"scheduler.{monitor}.rules.{index}.agent: unknown agent {rule['agent']}")
            check(("scheduler", monitor, "rules", index, "recipient"), allow_user=True,
                  needed=data["scheduler"][monitor]["enabled"] and rule["enabled"])


def coordinator_warning(data, agent_ids):
    """The warning of a team without its coordinator: request-changes must then name a recipient."""
    coordinator = data["communication"]["coordinatorAgent"]
    if coordinator in agent_ids:
        return None
    return (f'Warning: communication.coordinatorAgent: agent "{coordinator}" is not in agents '
            f'({", ".join(sorted(agent_ids))}); request-changes then needs a "recipient" and wait notices go to '
            "no one; set communication.coordinatorAgent to one of them")


def _value(tree, path):
    for key in path:
        tree = tree[key]
    return tree
