"""Project configuration (config.md §2.7–§3, §5): schema, defaults, issues, post-validation, the frozen
ProjectConfig with its typed blocks, render, each agent's container settings and network (with warnings
about weakened ones), and proxy variables. Any controller module may import it; it imports only
suzumio_yaml (files, YAML, imports), suzumio_registry (tools), suzumio_records and suzumio_errors."""
import copy
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from suzumio_errors import ConfigError, NotFound
from suzumio_records import DEFAULT_CHANNELS, DEFAULT_COORDINATOR, PRIORITIES
from suzumio_registry import (
    BUILTIN_TOOLPACKS,
    MANIFEST_NAME,
    PACKAGED_TOOLPACKS,
    ToolRegistry,
    check_toolpack_directory,
    frozen_json,
    is_allowed,
    packaged_toolpacks_dir,
    resolve_toolpacks,
    unknown_builtin_error,
)
from suzumio_yaml import HTTP_URL, apply_extends, dump_yaml, lexical_abspath, load_file, read_text

log = logging.getLogger(__name__)

RESERVED_AGENT_ID = "user"
# Used by runners only when `serve --runner-listen` moves the runner routes onto TCP.
DEFAULT_CONTROLLER_URL = "http://host.docker.internal:39400"
RESERVED_MOUNT_TARGETS = ("/activation", "/workspace", "/artifacts", "/toolpacks", "/opt/suzumio", "/run/suzumio")
UNSUPPORTED_PROVIDER_TYPES = ("openai", "google")  # issue 14: anthropic is supported
LOCAL_WARNING = "Warning: backend.kind local runs agent tools on this host without isolation"
LOCAL_MOUNTS_WARNING = "Warning: backend.kind local ignores configured mounts"
# Limits every activation container gets unless backend.docker or agents.<id>.docker say otherwise;
# `false` turns one off (docs/configuration.md; docs/spec-notes.md 4e).
DEFAULT_MEMORY = "4g"
DEFAULT_CPUS = 2
DEFAULT_PIDS_LIMIT = 1024
DEFAULT_WARM = 2  # prepared runners per running project (issue 18); false or 0 turns them off
DEFAULT_KEEP_RECORDED = 2000  # activations whose recordings are kept (recording.keepActivations)
DEFAULT_KEEP = 5  # exited activation containers kept per agent for inspection; "all" keeps every one
NETWORK_TOOL = "web.fetch"


# ---------------------------------------------------------------------------------------------------
# Schema: strict types, defaults, issue collection (config.md §2.7, §3)

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
    headersEnv?}}` (streamable HTTP): an MCP toolpack (issue 15; docs/spec-notes.md)."""
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
        ("maxConsecutive", _INT_GE0, 0),
        ("initialDelayMs", _INT_GE0, 30000),
        ("backoffFactor", _Num(ge=1), 2),
        ("maxDelayMs", _INT_GE0, 300000),
    ), _FULL),
    ("failedNudge", _Obj(
        ("enabled", _Bool(), False),
        ("priority", _PRIORITY, "P2"),
        ("maxConsecutive", _INT_GE0, 3),
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
    ("maxOutputTokens", _INT_GT0, _OMIT),
    ("contextLimit", _INT_GT0, 260000),
    ("toolChoice", _Enum("auto", "required", "none"), _OMIT),
    ("providerOptions", _Record(_Any()), {}),
    ("headers", _Record(_Str()), {}),
    # issue 14: retries of this preset (overrides the provider's options.maxRetries) and its prices
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


_BACKEND = _Obj(
    ("kind", _Enum("docker-chat", "local"), "docker-chat"),
    ("image", _Str(), "suzumio-runner:dev"),
    ("controllerUrl", _Str(), DEFAULT_CONTROLLER_URL),
    ("activationTimeoutMs", _INT_GT0, 3600000),
    ("warm", _OrFalse(_INT_GE0), _OMIT),  # issue 18: prepared runners per project (DEFAULT_WARM)
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
    """Issue 16: one approval rule; every `match` pattern must compile (Python `re`, searched)."""

    def rules(self, rule, path, issues):
        ok = True
        for field_name, pattern in rule.get("match", {}).items():
            try:
                re.compile(pattern)
            except re.error as exc:
                issues.add(path + ["match", field_name], f"invalid regular expression {pattern!r}: {exc}")
                ok = False
        return ok


# Issue 16: `agents.<id>.approve` and `tools.approve`; absent stays absent (rendered only when written).
DEFAULT_APPROVAL_TIMEOUT_MS = 1800000
_APPROVE = _List(_ApprovalRuleObj(
    ("tool", _TEXT, _REQUIRED),
    ("match", _Record(_Str()), _OMIT),
    ("timeoutMs", _INT_GT0, DEFAULT_APPROVAL_TIMEOUT_MS),
    ("onExpiry", _Enum("deny", "allow"), "deny"),
))

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
    ("approve", _APPROVE, _OMIT),  # issue 16
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
                   ("approve", _APPROVE, _OMIT)), _FULL),  # issue 16: approve
    ("platforms", _List(_Any()), []),
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
)


def validate_schema(tree, unknown=None):
    """Validate a merged tree and materialize defaults; all issues are reported together (§2.7). Keys the
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


# ---------------------------------------------------------------------------------------------------
# Typed, read-only views of the normalized config

class FrozenMapping(Mapping):
    """A read-only, hashable mapping; nested lists and mappings are handed out as copies."""

    __slots__ = ("_items",)

    def __init__(self, data=()):
        self._items = dict(copy.deepcopy(dict(data)))

    def __getitem__(self, key):
        value = self._items[key]
        return copy.deepcopy(value) if isinstance(value, (dict, list)) else value

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(json.dumps(self._items, sort_keys=True, default=repr))

    def __repr__(self):
        return f"FrozenMapping({self._items!r})"


def _ro(mapping):
    return FrozenMapping(mapping)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    readonly: bool = True
    description: str = None

    @classmethod
    def from_data(cls, data):
        return cls(data["source"], data["target"], data.get("readonly", True), data.get("description"))


@dataclass(frozen=True)
class AgentSpec:
    """One expanded agent (config.md §3.4; store.md §2.2). `model` is as written; `selected_model` effective."""

    id: str
    key: str
    role: str
    display_name: str
    prompt: str
    model: str
    selected_model: str
    tools: tuple
    mounts: tuple
    env: FrozenMapping
    index: int = 1
    count: int = 1
    network: bool = None  # agents.<id>.network as written; None: decided by backend.docker and the allowlist
    docker: FrozenMapping = None  # agents.<id>.docker: the container settings that replace backend.docker's

    def env_dict(self):
        return dict(self.env)


@dataclass(frozen=True)
class NudgeConfig:
    """`scheduler.noEffectNudge` / `failedNudge` (message None for the no-effect nudge)."""

    enabled: bool
    priority: str
    max_consecutive: int
    initial_delay_ms: int
    backoff_factor: float
    max_delay_ms: int
    message: str = None


@dataclass(frozen=True)
class AllQuietNudgeConfig:
    enabled: bool
    target_agent: str
    priority: str
    cooldown_ms: int
    message: str


@dataclass(frozen=True)
class MonitorRule:
    """One monitor rule; `key` is the dedupe key (`id`, else `<index>:<agent>:<sender>-><recipient>`)."""

    index: int
    id: str
    enabled: bool
    agent: str
    recipient: str
    sender: str
    priority: str
    initial_delay_ms: int
    repeat_delay_ms: int
    message: str

    @property
    def key(self):
        return self.id if self.id is not None else f"{self.index}:{self.agent}:{self.sender}->{self.recipient}"


@dataclass(frozen=True)
class MonitorConfig:
    enabled: bool
    rules: tuple


@dataclass(frozen=True)
class SchedulerConfig:
    kind: str
    max_signals_per_activation: int
    no_effect_nudge: NudgeConfig
    failed_nudge: NudgeConfig
    all_quiet_nudge: AllQuietNudgeConfig
    quiet_agent_monitor: MonitorConfig
    failed_agent_monitor: MonitorConfig


@dataclass(frozen=True)
class CommunicationConfig:
    coordinator_agent: str
    restrict_non_coordinator_to_coordinator: bool
    non_coordinator_max_priority: str
    pm_routine_verifier_priority: str


@dataclass(frozen=True)
class ProxyConfig:
    inherit_env: bool
    http: str = None
    https: str = None
    all: str = None
    no_proxy: str = None
    rewrite_localhost: bool = True


@dataclass(frozen=True)
class DockerConfig:
    """`backend.docker`. memory, cpus and pids_limit are False when the limit is turned off."""

    network: str
    memory: object
    cpus: object
    mounts: tuple
    proxy: ProxyConfig
    pids_limit: object = DEFAULT_PIDS_LIMIT
    user: str = None
    cap_add: tuple = ()
    grant_network: bool = False
    keep: object = DEFAULT_KEEP  # exited containers kept per agent (an int), or "all"


@dataclass(frozen=True)
class SandboxSettings:
    """What one agent's activation containers get: backend.docker with agents.<id>.docker on top.
    `network` is the network it gets when it has network (None: Docker's default); `user` None means
    the controller's uid:gid, or 65532:65532 when the controller is root (suzumio_backend)."""

    has_network: bool
    network_reason: str
    network: str
    memory: object
    cpus: object
    pids_limit: object
    user: str
    cap_add: tuple

    @property
    def network_label(self):
        if not self.has_network:
            return "none"
        return self.network or "Docker's default network"


@dataclass(frozen=True)
class ProviderConfig:
    """`backend.runner.models.providers.<id>`; `script` is the resolved mapping for scripted providers."""

    id: str
    type: str
    api_key: str = None
    api_key_env: str = None
    base_url: str = None
    base_url_env: str = None
    headers: FrozenMapping = None
    timeout_ms: object = None
    chunk_timeout_ms: int = None
    options: FrozenMapping = None
    _script_json: str = field(default=None, repr=False)

    @property
    def script(self):
        return None if self._script_json is None else json.loads(self._script_json)


@dataclass(frozen=True)
class PresetConfig:
    """`backend.runner.models.presets.<id>`; `model_list` is None for concrete presets."""

    id: str
    provider: str = None
    model: str = None
    model_list: tuple = None
    api_model: str = None
    reasoning_effort: str = None
    temperature: float = None
    top_p: float = None
    top_k: float = None
    max_output_tokens: int = None
    context_limit: int = 260000
    tool_choice: str = None
    provider_options: FrozenMapping = None
    headers: FrozenMapping = None
    max_retries: int = None  # issue 14
    pricing: FrozenMapping = None  # issue 14: USD per million tokens (suzumio_cost)

    @property
    def is_list(self):
        return self.model_list is not None


@dataclass(frozen=True)
class RunnerConfig:
    mode: str
    model: str
    max_iterations: int
    max_tool_calls: int
    budget_max_tokens: int  # backend.runner.budget.maxTokens; None means no token budget
    providers: FrozenMapping
    presets: FrozenMapping
    _json: str = field(repr=False)
    budget_max_cost_usd: float = None  # issue 14: backend.runner.budget.maxCostUsd

    def as_json(self):
        """`backend.runner` verbatim in internal spelling, as `input.json` carries it (backend-runner.md §5.1)."""
        return json.loads(self._json)

    def expand(self, selected):
        """The concrete presets tried for a selection, in order (config.md §3.14)."""
        return expand_model_list(self.presets, self.providers, selected)


@dataclass(frozen=True)
class BackendConfig:
    kind: str
    image: str
    controller_url: str
    activation_timeout_ms: int
    docker: DockerConfig
    runner: RunnerConfig
    warm: int = DEFAULT_WARM  # prepared runners per running project, 0 for none (issue 18)


@dataclass(frozen=True)
class RecordingConfig:
    enabled: bool = True
    keep_activations: int = DEFAULT_KEEP_RECORDED


@dataclass(frozen=True)
class ObservabilityConfig:
    http_enabled: bool
    http_host: str
    http_port: int
    webui_enabled: bool


def expand_model_list(presets, providers, selected):
    """Expand a preset selection depth-first into concrete PresetConfigs; run-time errors of §3.14."""
    out = []

    def visit(preset_id, trail):
        if preset_id in trail:
            raise ConfigError("Circular model-list preset: " + " -> ".join(trail + [preset_id]))
        preset = presets.get(preset_id)
        if preset is None:
            raise ConfigError(f"Model preset not found: {preset_id}")
        if preset.model_list is not None:
            for member in preset.model_list:
                visit(member, trail + [preset_id])
            return
        if not preset.provider or not preset.model:
            raise ConfigError(f"Model preset needs provider and model: {preset_id}")
        if preset.provider not in providers:
            raise ConfigError(f"Provider not found: {preset.provider}")
        out.append(preset)

    visit(selected, [])
    return out


def _nudge(data, with_message):
    return NudgeConfig(data["enabled"], data["priority"], data["maxConsecutive"], data["initialDelayMs"],
                       data["backoffFactor"], data["maxDelayMs"], data["message"] if with_message else None)


def _monitor(data):
    rules = tuple(MonitorRule(index, rule.get("id"), rule["enabled"], rule["agent"], rule["recipient"], rule["sender"],
                              rule["priority"], rule["initialDelayMs"], rule["repeatDelayMs"], rule["message"])
                  for index, rule in enumerate(data["rules"]))
    return MonitorConfig(data["enabled"], rules)


def _scheduler_config(data):
    return SchedulerConfig(
        data["kind"], data["maxSignalsPerActivation"], _nudge(data["noEffectNudge"], False),
        _nudge(data["failedNudge"], True),
        AllQuietNudgeConfig(data["allQuietNudge"]["enabled"], data["allQuietNudge"]["targetAgent"],
                            data["allQuietNudge"]["priority"], data["allQuietNudge"]["cooldownMs"],
                            data["allQuietNudge"]["message"]),
        _monitor(data["quietAgentMonitor"]), _monitor(data["failedAgentMonitor"]))


def _provider_config(provider_id, data):
    script = data.get("script")
    return ProviderConfig(
        provider_id, data["type"], data.get("apiKey"), data.get("apiKeyEnv"), data.get("baseURL"),
        data.get("baseURLEnv"), _ro(data.get("headers", {})), data.get("timeoutMs"), data.get("chunkTimeoutMs"),
        _ro(data.get("options", {})), None if script is None else frozen_json(script))


def _preset_config(preset_id, data):
    model_list = data.get("modelList")
    return PresetConfig(
        preset_id, data.get("provider"), data.get("model"), None if model_list is None else tuple(model_list),
        data.get("apiModel"), data.get("reasoningEffort"), data.get("temperature"), data.get("topP"),
        data.get("topK"), data.get("maxOutputTokens"), data.get("contextLimit", 260000), data.get("toolChoice"),
        _ro(data.get("providerOptions", {})), _ro(data.get("headers", {})), data.get("maxRetries"),
        None if data.get("pricing") is None else _ro(data["pricing"]))


def _backend_config(data):
    docker, runner = data["docker"], data["runner"]
    proxy = docker["proxy"]
    models = runner.get("models", {"providers": {}, "presets": {}})
    return BackendConfig(
        data["kind"], data["image"], data["controllerUrl"], data["activationTimeoutMs"],
        DockerConfig(docker.get("network"), docker["memory"], docker["cpus"],
                     tuple(Mount.from_data(m) for m in docker["mounts"]),
                     ProxyConfig(proxy["inheritEnv"], proxy.get("http"), proxy.get("https"), proxy.get("all"),
                                 proxy.get("noProxy"), proxy["rewriteLocalhost"]),
                     docker["pidsLimit"], docker.get("user"), tuple(docker["capAdd"]), docker["grantNetwork"],
                     docker["keep"]),
        RunnerConfig(runner["mode"], runner.get("model"), runner.get("maxIterations"), runner.get("maxToolCalls"),
                     runner.get("budget", {}).get("maxTokens"),
                     FrozenMapping({k: _provider_config(k, v) for k, v in models["providers"].items()}),
                     FrozenMapping({k: _preset_config(k, v) for k, v in models["presets"].items()}),
                     frozen_json(runner), runner.get("budget", {}).get("maxCostUsd")),
        warm=int(data.get("warm", DEFAULT_WARM) or 0))


def _trailing_index_stripped(agent_id):
    return re.sub(r"-\d+$", "", agent_id)


def expand_agents(data):
    """Expanded agents of a normalized config, in config order (config.md §3.4)."""
    agents = data["agents"]
    default_model = data["backend"]["runner"].get("model")
    out = []
    for key, entry in agents.items():
        count = entry.get("count", 1)
        names = entry.get("names", [])
        for index in range(1, count + 1):
            agent_id = key if count == 1 else f"{key}-{index}"
            display_name = names[index - 1] if index - 1 < len(names) else entry.get("displayName", agent_id)
            own = agents.get(agent_id) or agents.get(_trailing_index_stripped(agent_id)) or entry
            out.append(AgentSpec(
                agent_id, key, entry.get("role", key), display_name, entry.get("prompt", ""), entry.get("model"),
                entry.get("model", default_model), tuple(entry.get("tools", [])),
                tuple(Mount.from_data(m) for m in own.get("mounts", [])), _ro(own.get("env", {})), index, count,
                network=own.get("network"), docker=_ro(own.get("docker", {}))))
    return out


# ---------------------------------------------------------------------------------------------------
# Post-validation steps (config.md §2.8)

def _check_segment(value, message):
    if not value or value in (".", "..") or any(ch in value for ch in "/\\\0"):
        raise ConfigError(f"{message}: {value}")


def normalize_mount_target(target):
    """The reference's POSIX normalization: collapse `.`, `..`, empty segments; keep a trailing slash."""
    parts = []
    for segment in target.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts:
                parts.pop()
            continue
        parts.append(segment)
    result = "/" + "/".join(parts)
    if target.endswith("/") and result != "/":
        result += "/"
    return result


def _normalize_mount(mount, base_dir):
    target = mount["target"]
    if not target.startswith("/"):
        raise ConfigError(f"Docker mount target must be absolute: {target}")
    normalized = normalize_mount_target(target)
    bare = normalized.rstrip("/") or "/"
    for reserved in RESERVED_MOUNT_TARGETS:
        if bare == reserved or bare.startswith(reserved + "/"):
            raise ConfigError(f"Docker mount target is reserved: {target}")
    out = dict(mount)
    if not os.path.isabs(mount["source"]):
        out["source"] = lexical_abspath(mount["source"], base_dir)
    out["target"] = normalized
    return out


def _check_models(data):
    runner = data["backend"]["runner"]
    models = runner.get("models")
    if models is None:
        raise ConfigError("backend.runner.models is required")
    if not models["providers"]:
        raise ConfigError("backend.runner.models.providers needs at least one provider")
    if not models["presets"]:
        raise ConfigError("backend.runner.models.presets needs at least one preset")
    for provider_id, provider in models["providers"].items():
        if provider["type"] in UNSUPPORTED_PROVIDER_TYPES:
            raise ConfigError(f"backend.runner.models.providers.{provider_id}.type: Provider type {provider['type']} "
                              "is not supported by this version (use openai-compatible, anthropic or scripted)")
    for agent_id, agent in data["agents"].items():
        selected = agent.get("model", runner.get("model"))
        if selected is None:
            raise ConfigError(f"Agent {agent_id} needs an explicit model, or set backend.runner.model")
        if selected not in models["presets"]:
            raise ConfigError(f"Agent {agent_id} selected unknown model preset: {selected}")


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


def _check_references(data, merged, agent_ids):
    def known(value, path, allow_user=False):
        if value is not None and value not in agent_ids and not (allow_user and value == RESERVED_AGENT_ID):
            raise ConfigError(f"{path}: unknown agent {value}")
    # A written value equal to the default (`pm`) is not checked, like the default itself: a rendered
    # resolved.yaml spells every default out and must render again (config.md §2.9).
    coordinator = _written(merged, "communication", "coordinatorAgent")
    known(coordinator if coordinator != DEFAULT_COORDINATOR else None, "communication.coordinatorAgent")
    target = _written(merged, "scheduler", "allQuietNudge", "targetAgent")
    known(target if target != DEFAULT_COORDINATOR else None, "scheduler.allQuietNudge.targetAgent")
    for monitor in ("quietAgentMonitor", "failedAgentMonitor"):
        for index, rule in enumerate(data["scheduler"][monitor]["rules"]):
            known(rule["agent"], f"scheduler.{monitor}.rules.{index}.agent")
            if _written(merged, "scheduler", monitor, "rules", index, "recipient") is not None:
                known(rule["recipient"], f"scheduler.{monitor}.rules.{index}.recipient", allow_user=True)


def _check_presets(models):
    presets, providers = models["presets"], models["providers"]
    for preset_id, preset in presets.items():
        path = f"backend.runner.models.presets.{preset_id}"
        if "modelList" not in preset and preset["provider"] not in providers:
            raise ConfigError(f"{path}.provider: unknown provider {preset['provider']}")
        for member in preset.get("modelList", []):
            if member not in presets:
                raise ConfigError(f"{path}.model-list: unknown preset {member}")
        _check_cycles(presets, preset_id, [])


def _check_cycles(presets, preset_id, trail):
    if preset_id in trail:
        raise ConfigError("Circular model-list preset: " + " -> ".join(trail + [preset_id]))
    for member in presets.get(preset_id, {}).get("modelList", []):
        if member in presets:
            _check_cycles(presets, member, trail + [preset_id])


def _unknown_tool_message(entry, registry):
    # JSON quoting: the same text for a plain name, and a name with a line break stays on one line.
    return f'unknown tool {json.dumps(entry, ensure_ascii=False)} (registered: {", ".join(registry.tool_names)})'


def _check_allowlists(data, registry):
    for key, agent in data["agents"].items():
        unknown = registry.unknown_allowlist_entry(agent["tools"])
        if unknown is not None:
            index, entry = unknown
            raise ConfigError(f"agents.{key}.tools.{index}: {_unknown_tool_message(entry, registry)}")


def _check_approval_rules(data, registry):
    """Issue 16: every rule's `tool` is `*`, a registered tool or an `x.*` pattern, as in allowlists."""
    lists = [("tools.approve", data["tools"].get("approve", []))]
    lists += [(f"agents.{key}.approve", agent.get("approve", [])) for key, agent in data["agents"].items()]
    for path, rules in lists:
        for index, rule in enumerate(rules):
            if registry.unknown_allowlist_entry([rule["tool"]]) is not None:
                raise ConfigError(f"{path}.{index}.tool: {_unknown_tool_message(rule['tool'], registry)}")


@dataclass(frozen=True)
class ApprovalRule:
    """Issue 16: one approval rule of an agent (its own first, then the project's `tools.approve`).
    `key` names the rule for `allow-always`; `source` is `agent` or `project`."""

    tool: str
    match: FrozenMapping
    timeout_ms: int
    on_expiry: str
    source: str
    index: int

    @property
    def key(self):
        return json.dumps({"source": self.source, "index": self.index, "tool": self.tool,
                           "match": dict(self.match)}, sort_keys=True, separators=(",", ":"))

    def as_json(self):
        return {"tool": self.tool, "match": dict(self.match), "timeoutMs": self.timeout_ms,
                "onExpiry": self.on_expiry, "source": self.source, "index": self.index}


def _script_error(path, message):
    return ConfigError(f"{_format_path(path)}: {message}")


def validate_script(script, path, agent_ids, registry):
    """Check a scripted provider's script (scripted-provider.md, Validation); first failure wins."""
    if not isinstance(script, dict):
        raise _script_error(path, f"Expected object, received {_type_name(script)}")
    if "agents" not in script:
        raise _script_error(path + ["agents"], "Required")
    agents = script["agents"]
    if not isinstance(agents, dict):
        raise _script_error(path + ["agents"], f"Expected object, received {_type_name(agents)}")
    for key, entries in agents.items():
        entry_path = path + ["agents", key]
        prefix = key[:-1] if key.endswith("-*") else None
        if key not in agent_ids and not (prefix and any(agent.startswith(prefix) for agent in agent_ids)):
            raise _script_error(entry_path, f"unknown agent {key}")
        _check_script_entries(entries, entry_path, registry)


def _check_script_entries(entries, path, registry):
    if not isinstance(entries, list):
        raise _script_error(path, f"Expected array, received {_type_name(entries)}")
    if not entries:
        raise _script_error(path, "Array must contain at least 1 element(s)")
    for index, entry in enumerate(entries):
        entry_path = path + [index]
        if not isinstance(entry, dict):
            raise _script_error(entry_path, f"Expected object, received {_type_name(entry)}")
        if "when" in entry:
            when = entry["when"]
            if not isinstance(when, str):
                raise _script_error(entry_path + ["when"], f"Expected string, received {_type_name(when)}")
            if not when:
                raise _script_error(entry_path + ["when"], "String must contain at least 1 character(s)")
        if "steps" not in entry:
            raise _script_error(entry_path + ["steps"], "Required")
        steps = entry["steps"]
        if not isinstance(steps, list):
            raise _script_error(entry_path + ["steps"], f"Expected array, received {_type_name(steps)}")
        if not steps:
            raise _script_error(entry_path + ["steps"], "Array must contain at least 1 element(s)")
        for step_index, step in enumerate(steps):
            _check_script_step(step, entry_path + ["steps", step_index], registry)


def _check_script_step(step, path, registry):
    if not isinstance(step, dict):
        raise _script_error(path, f"Expected object, received {_type_name(step)}")
    if "say" not in step and "tools" not in step:
        raise _script_error(path, "A step needs say or tools")
    if "say" in step and not isinstance(step["say"], str):
        raise _script_error(path + ["say"], f"Expected string, received {_type_name(step['say'])}")
    if "tools" not in step:
        return
    calls = step["tools"]
    if not isinstance(calls, list):
        raise _script_error(path + ["tools"], f"Expected array, received {_type_name(calls)}")
    for index, call in enumerate(calls):
        call_path = path + ["tools", index]
        if not isinstance(call, dict):
            raise _script_error(call_path, f"Expected object, received {_type_name(call)}")
        if "name" not in call:
            raise _script_error(call_path + ["name"], "Required")
        if not isinstance(call["name"], str):
            raise _script_error(call_path + ["name"], f"Expected string, received {_type_name(call['name'])}")
        if registry.tool(call["name"]) is None:
            raise _script_error(call_path + ["name"], _unknown_tool_message(call["name"], registry))
        if "input" in call and not isinstance(call["input"], dict):
            raise _script_error(call_path + ["input"], f"Expected object, received {_type_name(call['input'])}")


def _post_validate(data, merged, base_dir, env, packaged_dir, mcp_tools=None):
    """Steps 0–5 of config.md §2.8 on the schema-validated tree; returns (data, registry)."""
    _check_segment(data["name"], "Project name must be a single path segment")
    for agent_id in data["agents"]:
        _check_segment(agent_id, "Agent id must be a single path segment")
    if data["platforms"]:
        raise ConfigError("platforms are not supported by this version")

    docker = data["backend"]["docker"]
    docker["mounts"] = [_normalize_mount(m, base_dir) for m in docker["mounts"]]
    for agent in data["agents"].values():
        agent["mounts"] = [_normalize_mount(m, base_dir) for m in agent["mounts"]]

    entries = []
    for entry in data["tools"]["toolpacks"]:
        if isinstance(entry, str):
            if entry not in BUILTIN_TOOLPACKS:
                raise unknown_builtin_error(entry)
        elif "mcp" in entry:
            # A sandbox-side server's cwd is a path inside the sandbox, kept as written.
            if "cwd" in entry["mcp"] and entry["mcp"].get("where") != "runner":
                entry = dict(entry, mcp=dict(entry["mcp"], cwd=lexical_abspath(entry["mcp"]["cwd"], base_dir)))
        elif "path" in entry:
            entry = dict(entry, path=check_toolpack_directory(entry["path"], base_dir))
        entries.append(entry)
    data["tools"]["toolpacks"] = entries

    _check_models(data)
    if not data["agents"]:
        raise ConfigError("Project config needs at least one agent")

    agent_ids = []
    for agent in expand_agents(data):
        if agent.id in agent_ids:
            raise ConfigError(f"Duplicate agent id after count expansion: {agent.id}")
        agent_ids.append(agent.id)
    registry = resolve_toolpacks(entries, base_dir, packaged_dir, mcp_tools)
    if RESERVED_AGENT_ID in agent_ids:
        raise ConfigError(f"Agent id is reserved: {RESERVED_AGENT_ID}")
    _check_references(data, merged, set(agent_ids))
    models = data["backend"]["runner"]["models"]
    _check_presets(models)
    _check_allowlists(data, registry)
    _check_approval_rules(data, registry)  # issue 16
    for provider_id, provider in models["providers"].items():
        if provider["type"] != "scripted":
            continue
        path = ["backend", "runner", "models", "providers", provider_id, "script"]
        if isinstance(provider["script"], str):
            provider["script"] = load_file(lexical_abspath(provider["script"], base_dir), env)
        validate_script(provider["script"], path, agent_ids, registry)
    return data, registry


# ---------------------------------------------------------------------------------------------------
# Rendering (config.md §2.9)

def externalize(data):
    """The rendered tree: `modelList` spelled `model-list` everywhere, default scheduler keys pruned."""
    def rename(value):
        if isinstance(value, dict):
            return {("model-list" if key == "modelList" else key): rename(item) for key, item in value.items()}
        if isinstance(value, list):
            return [rename(item) for item in value]
        return value
    out = rename(data)
    scheduler = out.get("scheduler")
    if isinstance(scheduler, dict):
        if scheduler.get("kind") == "nonpreemptive-signals":
            del scheduler["kind"]
        if scheduler.get("maxSignalsPerActivation") == 20:
            del scheduler["maxSignalsPerActivation"]
        if not scheduler:
            del out["scheduler"]
    return out


# ---------------------------------------------------------------------------------------------------
# The boundary of each agent's containers, and what config render says about it

def agent_sandbox(docker, builtin_toolpacks, agent):
    """The SandboxSettings of one expanded agent. Network: agents.<id>.network when written, else
    backend.docker.grantNetwork, else whether its allowlist holds web.fetch (with the web toolpack)."""
    over = agent.docker or {}

    if agent.network is not None:
        has_network = agent.network
        reason = f"agents.{agent.key}.network: {'true' if agent.network else 'false'}"
    elif docker.grant_network:
        has_network, reason = True, "backend.docker.grantNetwork: true"
    elif "web" in builtin_toolpacks and is_allowed(NETWORK_TOOL, agent.tools):
        has_network, reason = True, f"its tools allow {NETWORK_TOOL}"
    else:
        has_network, reason = False, f"its tools do not allow {NETWORK_TOOL} and nothing grants it network"
    return SandboxSettings(has_network, reason, over.get("network", docker.network),
                           over.get("memory", docker.memory), over.get("cpus", docker.cpus),
                           over.get("pidsLimit", docker.pids_limit), over.get("user", docker.user),
                           tuple(over.get("capAdd", docker.cap_add)))


def is_root_user(user):
    """True for a Docker `user` value that means uid 0 (`root`, `0`, `0:<gid>`, `root:<group>`)."""
    return user is not None and user.split(":", 1)[0] in ("0", "root")


_LIMIT_NAMES = (("memory", "memory"), ("cpus", "CPU"), ("pidsLimit", "process"))


def _container_warnings(settings, path, networked):
    """The warnings for one backend.docker or agents.<key>.docker block (as written, defaults applied)."""
    lines = []
    user = settings.get("user")
    if is_root_user(user):
        lines.append(f"Warning: {path}.user {user} runs activation containers as root")
    if settings.get("capAdd"):
        lines.append(f"Warning: {path}.capAdd gives activation containers capabilities: "
                     + ", ".join(settings["capAdd"]))
    for key, what in _LIMIT_NAMES:
        if settings.get(key) is False:
            lines.append(f"Warning: {path}.{key} false: activation containers have no {what} limit")
    if settings.get("network") == "host":
        if networked:
            lines.append(f"Warning: {path}.network host gives {', '.join(networked)} the host's network, "
                         "its 127.0.0.1 services included")
        else:
            lines.append(f"Warning: {path}.network host is only given to agents with network, and no agent "
                         "it applies to has network")
    return lines


def boundary_warnings(config):
    """The stderr lines of config render and init (config.md §2.9): the local backend, then each setting
    that weakens an activation container's boundary, backend-wide first, then per agent."""
    data = config.data
    if config.backend.kind == "local":
        lines = [LOCAL_WARNING]
        if data["backend"]["docker"]["mounts"] or any(agent["mounts"] for agent in data["agents"].values()):
            lines.append(LOCAL_MOUNTS_WARNING)
        return lines
    sandboxes = {agent.id: config.sandbox(agent.id) for agent in config.agents}
    lines = []
    if config.backend.docker.grant_network:
        lines.append("Warning: backend.docker.grantNetwork true gives every agent network")
    host = [agent.id for agent in config.agents
            if sandboxes[agent.id].has_network and "network" not in (agent.docker or {})]
    lines += _container_warnings(data["backend"]["docker"], "backend.docker", host)
    for key, entry in data["agents"].items():
        if "docker" not in entry:
            continue
        mine = [agent.id for agent in config.agents if agent.key == key and sandboxes[agent.id].has_network]
        lines += _container_warnings(entry["docker"], f"agents.{key}.docker", mine)
    return lines


# ---------------------------------------------------------------------------------------------------
# Proxy variables for activations (config.md §5)

_PROXY_FIELDS = (("http", "HTTP_PROXY", "http_proxy"), ("https", "HTTPS_PROXY", "https_proxy"),
                 ("all", "ALL_PROXY", "all_proxy"), ("no_proxy", "NO_PROXY", "no_proxy"))
_INHERITED_PROXY_NAMES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                          "http_proxy", "https_proxy", "all_proxy", "no_proxy")
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _rewrite_loopback(value):
    try:
        parts = urlsplit(value)
        host = parts.hostname
    except ValueError:
        return value
    if not parts.scheme or not parts.netloc or host not in _LOOPBACK_HOSTS:
        return value
    netloc = parts.netloc
    at = netloc.rfind("@")
    credentials, hostport = (netloc[:at + 1], netloc[at + 1:]) if at >= 0 else ("", netloc)
    # the port part (`:8080` or empty) after a bracketed IPv6 literal or a name
    port_at = hostport.index("]") + 1 if hostport.startswith("[") else len(hostport.split(":")[0])
    port = hostport[port_at:]
    return urlunsplit((parts.scheme, credentials + "host.docker.internal" + port, parts.path, parts.query,
                       parts.fragment))


def proxy_environment(proxy, network, environ, rewrite_hosts=True):
    """Proxy variables for an activation, in order (config.md §5); `rewrite_hosts=False` for `local`."""
    rewrite = rewrite_hosts and network != "host" and proxy.rewrite_localhost
    variables = {}
    if proxy.inherit_env:
        for name in _INHERITED_PROXY_NAMES:
            if environ.get(name):
                variables[name] = environ[name]
    for attribute, upper, lower in _PROXY_FIELDS:
        value = getattr(proxy, attribute)
        if value:
            variables[upper] = value
            variables.pop(lower, None)
    if rewrite:
        variables = {name: value if name.lower() == "no_proxy" else _rewrite_loopback(value)
                     for name, value in variables.items()}
    return list(variables.items())


# ---------------------------------------------------------------------------------------------------
# The frozen project configuration and the pipeline entry points

@dataclass(frozen=True)
class ProjectConfig:
    """A validated project configuration. `data` is the internal spelling stored as `config_json`."""

    path: str
    source_text: str
    _data_json: str = field(repr=False)
    _agents: tuple = field(repr=False)
    _registry: ToolRegistry = field(repr=False, compare=False)
    _registry_error: str = field(repr=False, compare=False)
    _packaged_dir: str = field(repr=False, compare=False)
    name: str = None
    task: str = None
    channels: tuple = ()
    scheduler: SchedulerConfig = None
    communication: CommunicationConfig = None
    backend: BackendConfig = None
    observability: ObservabilityConfig = None
    recording: RecordingConfig = RecordingConfig()
    unknown_keys: tuple = ()  # "<path>: unknown key (did you mean …?)" lines of load_project
    # Lists MCP servers' tools when toolpacks are resolved (suzumio_mcp.McpHub.listing); None: unlisted.
    _mcp_tools: object = field(default=None, repr=False, compare=False)

    @classmethod
    def _build(cls, data, path, source_text, registry, registry_error, packaged_dir, mcp_tools=None):
        observability = data["observability"]
        return cls(
            path, source_text, frozen_json(data), tuple(expand_agents(data)), registry,
            registry_error, packaged_dir, data["name"], data["task"], tuple(data["channels"]),
            _scheduler_config(data["scheduler"]), _communication_config(data["communication"]),
            _backend_config(data["backend"]),
            ObservabilityConfig(observability["http"]["enabled"], observability["http"]["host"],
                                observability["http"]["port"], observability["webui"]["enabled"]),
            RecordingConfig(data["recording"]["enabled"], data["recording"]["keepActivations"]),
            _mcp_tools=mcp_tools)

    @classmethod
    def from_data(cls, data, path=None, packaged_dir=None, mcp_tools=None):
        """Rebuild from a stored `config_json` (dict or JSON text): defaults for fields added later are
        materialized, nothing else is re-validated, and the toolpacks are resolved again from disk. A
        resolution error does not fail this call; it is raised by `toolpacks`, `tool` and `allowed_tools`."""
        if isinstance(data, str):
            data = json.loads(data)
        data = validate_schema(copy.deepcopy(data))
        packaged_dir = packaged_dir or packaged_toolpacks_dir()
        try:
            registry, error = resolve_toolpacks(data["tools"]["toolpacks"], None, packaged_dir, mcp_tools), None
        except ConfigError as exc:
            registry, error = None, exc.message
        return cls._build(data, path, None, registry, error, packaged_dir, mcp_tools)

    from_config_json = from_data

    @property
    def data(self):
        """The normalized config in internal spelling (a fresh copy; JSON-serialisable)."""
        return json.loads(self._data_json)

    def config_json(self):
        """Compact JSON of `data`, exactly what `projects.config_json` stores (config.md §2.10)."""
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))

    @property
    def warnings(self):
        """The stderr lines `config render` and `init` print after a successful load (config.md §2.9):
        the local backend and every setting that weakens the container boundary."""
        return boundary_warnings(self)

    def network_report(self):
        """What `config render` prints about network on docker-chat: one line per agent, with the reason."""
        if self.backend.kind == "local":
            return []
        lines = []
        for agent in self._agents:
            sandbox = self.sandbox(agent.id)
            lines.append(f"Network: {agent.id} gets {sandbox.network_label} ({sandbox.network_reason})")
        return lines

    def sandbox(self, agent_id):
        """The container settings of one agent's activations (docker-chat)."""
        builtin = [entry for entry in self.toolpack_entries if isinstance(entry, str)]
        return agent_sandbox(self.backend.docker, builtin, self.agent(agent_id))

    def rendered_tree(self):
        return externalize(self.data)

    def render(self):
        """The `resolved.yaml` text (config.md §2.9)."""
        return dump_yaml(self.rendered_tree())

    @property
    def agents(self):
        return list(self._agents)

    @property
    def agent_ids(self):
        return [agent.id for agent in self._agents]

    def agent(self, agent_id):
        for agent in self._agents:
            if agent.id == agent_id:
                return agent
        raise NotFound(f"Unknown agent: {agent_id}")

    @property
    def runner(self):
        return self.backend.runner

    @property
    def toolpack_entries(self):
        """`tools.toolpacks` as stored: built-in names, `{path, id?}` (absolute) and `{packaged, id?}`."""
        return self.data["tools"]["toolpacks"]

    @property
    def registry(self):
        if self._registry is None:
            raise ConfigError(self._registry_error)
        return self._registry

    @property
    def toolpacks(self):
        return list(self.registry.toolpacks)

    def toolpack(self, toolpack_id):
        return self.registry.toolpack(toolpack_id)

    def tool(self, name):
        return self.registry.tool(name)

    def approval_rules(self, agent_id):
        """Issue 16: the agent's approval rules in matching order (its own, then `tools.approve`)."""
        data = self.data
        own = data["agents"].get(self.agent(agent_id).key, {}).get("approve", [])
        return tuple(ApprovalRule(rule["tool"], _ro(rule.get("match", {})), rule["timeoutMs"], rule["onExpiry"],
                                  source, index)
                     for source, rules in (("agent", own), ("project", data["tools"].get("approve", [])))
                     for index, rule in enumerate(rules))

    def allowed_tools(self, agent_id):
        """The registered tools an agent may see, in registration order (tools.md §2.3, §2.4)."""
        return self.registry.allowed_tools(self.agent(agent_id).tools)

    def resolve_toolpacks(self):
        """Resolve the toolpacks afresh from disk (manifests may change after init); raises ConfigError."""
        return resolve_toolpacks(self.toolpack_entries, None, self._packaged_dir, self._mcp_tools)

    def selected_model(self, agent_id):
        return self.agent(agent_id).selected_model

    def model_attempts(self, agent_id):
        """The concrete presets an activation of this agent tries, in order (config.md §3.14)."""
        selected = self.selected_model(agent_id)
        if selected is None:
            raise ConfigError(f"Agent {agent_id} needs an explicit model, or set backend.runner.model")
        return self.runner.expand(selected)

    def mounts_for(self, agent_id):
        """Backend-wide mounts followed by the agent's own (docker-chat only)."""
        return list(self.backend.docker.mounts) + list(self.agent(agent_id).mounts)

    def proxy_environment(self, environ, rewrite_hosts=None):
        """Proxy variables for an activation container or local runner (config.md §5)."""
        if rewrite_hosts is None:
            rewrite_hosts = self.backend.kind != "local"
        return proxy_environment(self.backend.docker.proxy, self.backend.docker.network, environ, rewrite_hosts)


def _communication_config(data):
    return CommunicationConfig(data["coordinatorAgent"], data["restrictNonCoordinatorToCoordinator"],
                               data["nonCoordinatorMaxPriority"], data["pmRoutineVerifierPriority"])


def load_project(path, env=None, packaged_dir=None, strict=False, mcp_tools=None):
    """Run the whole pipeline (config.md §2, steps 1–6) on a project file; raises ConfigError. Unknown
    keys land in `config.unknown_keys`; with `strict` (or `strict: true` in the file) they are errors.
    With `mcp_tools` (`config render --check`) MCP servers are asked for their tools and allowlists
    checked against them."""
    env = os.environ if env is None else env
    absolute = lexical_abspath(os.fspath(path))
    source_text = read_text(absolute)
    merged = apply_extends(load_file(absolute, env))
    unknown = []
    data = validate_schema(merged, unknown)
    if unknown and (strict or data.get("strict")):
        raise ConfigError("Unknown keys in project config (strict):\n"
                          + "\n".join(f"  - {line}" for line in unknown))
    packaged_dir = packaged_dir or packaged_toolpacks_dir()
    data, registry = _post_validate(data, merged, os.path.dirname(absolute), env, packaged_dir, mcp_tools)
    config = ProjectConfig._build(data, absolute, source_text, registry, None, packaged_dir)
    config = dataclasses.replace(config, unknown_keys=tuple(unknown))
    log.debug("loaded project %s from %s", config.name, absolute)
    return config


def render_file(path, env=None):
    """Convenience for `suzumio config render`: (rendered YAML, warning lines)."""
    config = load_project(path, env)
    return config.render(), config.warnings


def manifest_stamps(config):
    """(path, mtime, size) of every local toolpack manifest, or None when they cannot be read."""
    stamps = []
    try:
        for pack in config.toolpacks:
            if pack.kind == "mcp":
                # A listed server's config is rebuilt when the server was started again (its tools may
                # have changed); one built while the server was down is rebuilt to retry it.
                stamp = getattr(config._mcp_tools, "stamp", None)
                if stamp is not None and pack.mcp_where == "controller":
                    stamps.append(("mcp", pack.id, stamp(pack.id, pack.mcp, pack.mcp_listed)))
                continue
            if not pack.builtin:
                path = os.path.join(pack.path, MANIFEST_NAME)
                stat = os.stat(path)
                stamps.append((path, stat.st_mtime_ns, stat.st_size))
    except (ConfigError, OSError):
        return None
    return tuple(stamps)


CONFIG_CACHE_SIZE = 64


class ConfigCache:
    """The ProjectConfig of each project, rebuilt only when its store hands out another config dict or a
    local toolpack manifest changed on disk. Rebuilding (schema defaults, toolpack resolution) was most
    of an idle tick's cost; the scheduler and the toolpack runtime share one."""

    def __init__(self, size=CONFIG_CACHE_SIZE, mcp_tools=None):
        self._entries = OrderedDict()  # least recently used first
        self._lock = threading.Lock()
        self.size = size
        self.mcp_tools = mcp_tools

    def get(self, store):
        data = store.config()
        with self._lock:
            cached = self._entries.get(store.project_id)
            if cached is not None:
                self._entries.move_to_end(store.project_id)
        if cached is not None and cached[0] is data and cached[2] is not None \
                and manifest_stamps(cached[1]) == cached[2]:
            return cached[1]
        config = ProjectConfig.from_data(data, mcp_tools=self.mcp_tools)
        with self._lock:
            self._entries[store.project_id] = (data, config, manifest_stamps(config))
            self._entries.move_to_end(store.project_id)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)  # a root of many projects keeps only the busy ones
        return config
