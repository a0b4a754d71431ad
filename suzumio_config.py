"""Project configuration (docs/configuration.md): schema, defaults, issues, post-validation, the frozen
ProjectConfig with its typed blocks, render, each agent's container settings and network (with warnings
about weakened ones), and proxy variables."""
import copy
import dataclasses
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import suzumio_egress_policy
from suzumio_backend_contract import KIND_LOCAL, KIND_SWARM
from suzumio_config_models import FrozenMapping, RunnerConfig, check_models, check_presets, runner_config
from suzumio_config_repository import RepositoryConfig, check_repository, repository_config
from suzumio_config_schema import (
    DEFAULT_ARTIFACT_QUOTA,
    DEFAULT_GUARDS,
    DEFAULT_KEEP,
    DEFAULT_KEEP_RECORDED,
    DEFAULT_PIDS_LIMIT,
    DEFAULT_WARM,
    RESERVED_AGENT_ID,
    _format_path,
    _type_name,
    check_references,
    coordinator_warning,
    parse_size,
    runaway_warnings,
    validate_schema,
)
from suzumio_config_swarm import SwarmConfig, swarm_config, swarm_network_warning, swarm_placement
from suzumio_errors import ConfigError, NotFound
from suzumio_registry import (
    BUILTIN_TOOLPACKS,
    MANIFEST_NAME,
    ToolRegistry,
    check_toolpack_directory,
    frozen_json,
    is_allowed,
    packaged_toolpacks_dir,
    resolve_toolpacks,
    unknown_builtin_error,
)
from suzumio_yaml import apply_extends, dump_yaml, lexical_abspath, load_file, read_text

log = logging.getLogger(__name__)

RESERVED_MOUNT_TARGETS = ("/activation", "/workspace", "/artifacts", "/toolpacks", "/opt/suzumio", "/run/suzumio")
LOCAL_WARNING = "Warning: backend.kind local runs agent tools on this host without isolation"
LOCAL_MOUNTS_WARNING = "Warning: backend.kind local ignores configured mounts"
LOCAL_EGRESS_WARNING = ("Warning: backend.kind local sets the egress proxy variables, but they are advisory there: "
                        "agent tools can connect directly, outside agents.<id>.egress and its audit")
ESCAPE_HATCH = "a network of its own, outside the egress allowlist and its audit"
NETWORK_TOOL = "web.fetch"


# ---------------------------------------------------------------------------------------------------
# Typed, read-only views of the normalized config

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
    """One expanded agent (docs/configuration.md). `model` is as written; `selected_model` effective."""

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
    artifact_quota: object = None  # agents.<id>.artifactQuota as written (a size or false); None: the backend's
    egress: tuple = None  # agents.<id>.egress as written; None: the default (public with web.fetch)
    egress_limits: FrozenMapping = None
    swarm: FrozenMapping = None  # agents.<id>.swarm: placement fields that replace backend.swarm's

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
class BackendConfig:
    kind: str
    image: str
    controller_url: str
    activation_timeout_ms: int
    docker: DockerConfig
    runner: RunnerConfig
    warm: int = DEFAULT_WARM  # prepared runners per running project, 0 for none
    artifact_quota: object = DEFAULT_ARTIFACT_QUOTA  # backend.artifactQuota as written (a size or false)
    swarm: SwarmConfig = SwarmConfig()  # noqa: RUF009 - frozen, so one shared default is safe


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


def _backend_config(data):
    docker, runner = data["docker"], data["runner"]
    proxy = docker["proxy"]
    return BackendConfig(
        data["kind"], data["image"], data["controllerUrl"], data["activationTimeoutMs"],
        DockerConfig(docker.get("network"), docker["memory"], docker["cpus"],
                     tuple(Mount.from_data(m) for m in docker["mounts"]),
                     ProxyConfig(proxy["inheritEnv"], proxy.get("http"), proxy.get("https"), proxy.get("all"),
                                 proxy.get("noProxy"), proxy["rewriteLocalhost"]),
                     docker["pidsLimit"], docker.get("user"), tuple(docker["capAdd"]), docker["grantNetwork"],
                     docker["keep"]),
        runner_config(runner),
        warm=int(data.get("warm", DEFAULT_WARM) or 0),
        artifact_quota=data.get("artifactQuota", DEFAULT_ARTIFACT_QUOTA),
        swarm=swarm_config(data.get("swarm", {})))


def _trailing_index_stripped(agent_id):
    return re.sub(r"-\d+$", "", agent_id)


def expand_agents(data):
    """Expanded agents of a normalized config, in config order (docs/configuration.md)."""
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
                network=own.get("network"), docker=_ro(own.get("docker", {})),
                artifact_quota=own.get("artifactQuota"),
                egress=tuple(own["egress"]) if "egress" in own else None,
                egress_limits=_ro(own.get("egressLimits", {})), swarm=_ro(own.get("swarm", {}))))
    return out


# ---------------------------------------------------------------------------------------------------
# Post-validation steps (docs/configuration.md)

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
    """Every rule's `tool` is `*`, a registered tool or an `x.*` pattern, as in allowlists."""
    lists = [("tools.approve", data["tools"].get("approve", []))]
    lists += [(f"agents.{key}.approve", agent.get("approve", [])) for key, agent in data["agents"].items()]
    for path, rules in lists:
        for index, rule in enumerate(rules):
            if registry.unknown_allowlist_entry([rule["tool"]]) is not None:
                raise ConfigError(f"{path}.{index}.tool: {_unknown_tool_message(rule['tool'], registry)}")


@dataclass(frozen=True)
class ApprovalRule:
    """One approval rule of an agent (its own first, then the project's `tools.approve`).
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
    """Check a scripted provider's script (docs/configuration.md, Validation); first failure wins."""
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
    """Steps 0–5 of docs/configuration.md on the schema-validated tree; returns (data, registry)."""
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

    check_models(data)
    if not data["agents"]:
        raise ConfigError("Project config needs at least one agent")

    agent_ids = []
    for agent in expand_agents(data):
        if agent.id in agent_ids:
            raise ConfigError(f"Duplicate agent id after count expansion: {agent.id}")
        agent_ids.append(agent.id)
    check_repository(data, base_dir, agent_ids, entries)
    registry = resolve_toolpacks(entries, base_dir, packaged_dir, mcp_tools)
    if RESERVED_AGENT_ID in agent_ids:
        raise ConfigError(f"Agent id is reserved: {RESERVED_AGENT_ID}")
    check_references(data, merged, set(agent_ids))
    models = data["backend"]["runner"]["models"]
    check_presets(models)
    _check_allowlists(data, registry)
    _check_approval_rules(data, registry)
    for provider_id, provider in models["providers"].items():
        if provider["type"] != "scripted":
            continue
        path = ["backend", "runner", "models", "providers", provider_id, "script"]
        if isinstance(provider["script"], str):
            provider["script"] = load_file(lexical_abspath(provider["script"], base_dir), env)
        validate_script(provider["script"], path, agent_ids, registry)
    return data, registry


# ---------------------------------------------------------------------------------------------------
# Rendering (docs/configuration.md)

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

def agent_sandbox(docker, agent):
    """The SandboxSettings of one expanded agent. No container has a network of its own: every
    connection goes through the controller's egress proxy (agent_egress). `agents.<id>.network: true`
    and `backend.docker.grantNetwork` are the escape hatches that still give one, with a warning."""
    over = agent.docker or {}

    if agent.network is not None:
        has_network = agent.network
        reason = f"agents.{agent.key}.network: {'true' if agent.network else 'false'}"
    elif docker.grant_network:
        has_network, reason = True, "backend.docker.grantNetwork: true"
    else:
        has_network, reason = False, "connections go through the controller's egress proxy"
    return SandboxSettings(has_network, reason, over.get("network", docker.network),
                           over.get("memory", docker.memory), over.get("cpus", docker.cpus),
                           over.get("pidsLimit", docker.pids_limit), over.get("user", docker.user),
                           tuple(over.get("capAdd", docker.cap_add)))


def agent_egress(builtin_toolpacks, agent):
    """agents.<id>.egress when written; else `public` for an agent allowed web.fetch (with the web
    toolpack); else nothing."""
    if agent.egress is not None:
        entries, reason = agent.egress, f"agents.{agent.key}.egress"
    elif "web" in builtin_toolpacks and is_allowed(NETWORK_TOOL, agent.tools):
        entries, reason = (suzumio_egress_policy.PUBLIC,), f"its tools allow {NETWORK_TOOL}"
    else:
        entries, reason = (), f"its tools do not allow {NETWORK_TOOL} and agents.{agent.key}.egress is not set"
    limits = agent.egress_limits or {}
    return suzumio_egress_policy.egress_of(tuple(entries), reason, limits.get("bytes"),
                                           limits.get("connections"))


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
    """The stderr lines of config render and init (docs/configuration.md): the local backend, then each setting
    that weakens an activation container's boundary, backend-wide first, then per agent."""
    data = config.data
    egress = [line for agent in config.agents
              for line in suzumio_egress_policy.egress_warnings(agent, config.egress(agent.id))]
    if config.backend.kind == KIND_LOCAL:
        lines = [LOCAL_WARNING, LOCAL_EGRESS_WARNING]
        if data["backend"]["docker"]["mounts"] or any(agent["mounts"] for agent in data["agents"].values()):
            lines.append(LOCAL_MOUNTS_WARNING)
        return lines + egress + _quota_warnings(data)
    sandboxes = {agent.id: config.sandbox(agent.id) for agent in config.agents}
    lines = [w for w in [swarm_network_warning(config.backend.swarm)] if w] if config.backend.kind == KIND_SWARM else []
    if config.backend.docker.grant_network:
        lines.append(f"Warning: backend.docker.grantNetwork true gives every agent {ESCAPE_HATCH}")
    for key, entry in data["agents"].items():
        if entry.get("network") is True:
            ids = ", ".join(agent.id for agent in config.agents if agent.key == key)
            lines.append(f"Warning: agents.{key}.network true gives {ids} {ESCAPE_HATCH}")
    host = [agent.id for agent in config.agents
            if sandboxes[agent.id].has_network and "network" not in (agent.docker or {})]
    lines += _container_warnings(data["backend"]["docker"], "backend.docker", host)
    for key, entry in data["agents"].items():
        if "docker" not in entry:
            continue
        mine = [agent.id for agent in config.agents if agent.key == key and sandboxes[agent.id].has_network]
        lines += _container_warnings(entry["docker"], f"agents.{key}.docker", mine)
    return lines + egress + _quota_warnings(data)


def _quota_warnings(data):
    """An artifact quota turned off lets an agent fill the disk of the host."""
    lines = []
    if data["backend"].get("artifactQuota") is False:
        lines.append("Warning: backend.artifactQuota false lets an agent fill the host's disk")
    for key, entry in data["agents"].items():
        if entry.get("artifactQuota") is False:
            lines.append(f"Warning: agents.{key}.artifactQuota false lets {key} fill the host's disk")
    return lines


# ---------------------------------------------------------------------------------------------------
# Proxy variables for activations (docs/configuration.md)

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
    """Proxy variables for an activation, in order (docs/configuration.md); `rewrite_hosts=False` for `local`."""
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
    repository: RepositoryConfig = None  # docs/teams-that-write-code.md; None: the project has none
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
            repository_config(data), _mcp_tools=mcp_tools)

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

    @property
    def data(self):
        """The normalized config in internal spelling (a fresh copy; JSON-serialisable)."""
        return json.loads(self._data_json)

    def config_json(self):
        """Compact JSON of `data`, exactly what `projects.config_json` stores (docs/configuration.md)."""
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))

    @property
    def warnings(self):
        """The stderr lines `config render` and `init` print after a successful load (docs/configuration.md):
        the local backend, every setting that weakens the container boundary, a team without its coordinator,
        unbounded nudges."""
        return (boundary_warnings(self) + [line for line in [coordinator_warning(self.data, self.agent_ids)] if line]
                + runaway_warnings(self.scheduler))

    def network_report(self):
        """What `config render` prints about each agent's way out: its container's network on
        docker-chat, and where its egress may go, each with the reason."""
        lines = []
        for agent in self._agents:
            egress = self.egress(agent.id)
            if self.backend.kind == KIND_SWARM:
                lines.append(f"Network: {agent.id} gets {self.backend.swarm.network} (backend.swarm.network: " + (
                    "its own internal network, no route but its node's gateway to the runner listener)"
                    if self.backend.swarm.sealed else "its task reaches the runner listener over it)"))
            elif self.backend.kind != KIND_LOCAL:
                sandbox = self.sandbox(agent.id)
                lines.append(f"Network: {agent.id} gets {sandbox.network_label} ({sandbox.network_reason})")
            lines.append(f"Egress: {agent.id} may reach {egress.label} ({egress.reason})")
        return lines

    def sandbox(self, agent_id):
        """The container settings of one agent's activations (docker-chat)."""
        return agent_sandbox(self.backend.docker, self.agent(agent_id))

    def swarm_placement(self, agent_id):
        """Where one agent's activation tasks may run on backend.kind swarm (a SwarmPlacement)."""
        return swarm_placement(self.backend.swarm, self.agent(agent_id))

    def egress(self, agent_id):
        """Where one agent's connections may go through the egress proxy (AgentEgress)."""
        builtin = [entry for entry in self.toolpack_entries if isinstance(entry, str)]
        return agent_egress(builtin, self.agent(agent_id))

    def rendered_tree(self):
        return externalize(self.data)

    def render(self):
        """The `resolved.yaml` text (docs/configuration.md)."""
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

    def artifact_quota(self, agent_id):
        """Bytes the agent's artifacts folder may hold (agents.<id>.artifactQuota, else
        backend.artifactQuota), or None when the quota is off."""
        own = self.agent(agent_id).artifact_quota
        written = self.backend.artifact_quota if own is None else own
        return None if written is False else parse_size(written)

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
        """The agent's approval rules in matching order (its own, then `tools.approve`)."""
        data = self.data
        own = data["agents"].get(self.agent(agent_id).key, {}).get("approve", [])
        return tuple(ApprovalRule(rule["tool"], _ro(rule.get("match", {})), rule["timeoutMs"], rule["onExpiry"],
                                  source, index)
                     for source, rules in (("agent", own), ("project", data["tools"].get("approve", [])))
                     for index, rule in enumerate(rules))

    def guards(self, agent_id):
        """The loop guards of one agent: {rule: count or None (off)}, its own setting first, then the
        project's, then DEFAULT_GUARDS."""
        data = self.data
        own = data["agents"].get(self.agent(agent_id).key, {}).get("guards", {})
        project = data.get("guards", {})
        merged = {rule: own.get(rule, project.get(rule, default)) for rule, default in DEFAULT_GUARDS.items()}
        return {rule: (None if value is False else value) for rule, value in merged.items()}

    @property
    def max_concurrent_activations(self):
        """`limits.maxConcurrentActivations`, or None (no project cap)."""
        return self.data.get("limits", {}).get("maxConcurrentActivations")

    def allowed_tools(self, agent_id):
        """The registered tools an agent may see, in registration order (docs/design/tools.md)."""
        return self.registry.allowed_tools(self.agent(agent_id).tools)

    def resolve_toolpacks(self):
        """Resolve the toolpacks afresh from disk (manifests may change after init); raises ConfigError."""
        return resolve_toolpacks(self.toolpack_entries, None, self._packaged_dir, self._mcp_tools)

    def selected_model(self, agent_id):
        return self.agent(agent_id).selected_model

    def model_attempts(self, agent_id):
        """The concrete presets an activation of this agent tries, in order (docs/configuration.md)."""
        selected = self.selected_model(agent_id)
        if selected is None:
            raise ConfigError(f"Agent {agent_id} needs an explicit model, or set backend.runner.model")
        return self.runner.expand(selected)

    def mounts_for(self, agent_id):
        """Backend-wide mounts followed by the agent's own (docker-chat only)."""
        return list(self.backend.docker.mounts) + list(self.agent(agent_id).mounts)

    def proxy_environment(self, environ, rewrite_hosts=None):
        """Proxy variables for an activation container or local runner (docs/configuration.md)."""
        rewrite = self.backend.kind != KIND_LOCAL if rewrite_hosts is None else rewrite_hosts
        return proxy_environment(self.backend.docker.proxy, self.backend.docker.network, environ, rewrite)


def _communication_config(data):
    return CommunicationConfig(data["coordinatorAgent"], data["restrictNonCoordinatorToCoordinator"],
                               data["nonCoordinatorMaxPriority"], data["pmRoutineVerifierPriority"])


def load_project(path, env=None, packaged_dir=None, strict=False, mcp_tools=None):
    """Run the whole pipeline (docs/configuration.md, steps 1–6) on a project file; raises ConfigError. Unknown
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
