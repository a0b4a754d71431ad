"""The tool registry (docs/design/tools.md): built-in toolpacks and their tool and WebUI definitions, local
toolpack manifests (loading and validation), allowlist matching, and ToolRegistry/ToolpackSpec/ToolSpec/
WebuiEntry. Config validation resolves it at load time so errors come in spec order; suzumio_toolpacks
and the backend build dispatch, runner input and mounts on it."""
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from suzumio_errors import ConfigError
from suzumio_records import DEFAULT_PRIORITY, PRIORITIES, SIGNAL_STATUSES
from suzumio_resources import resource_path
from suzumio_yaml import HTTP_URL, lexical_abspath, strict_json_loads

PACKAGED_TOOLPACKS = ("scheduler", "plan")
BUILTIN_TOOLPACKS = ("core", "shell", "web", "repo")
CONTROLLER_TOOLPACKS = ("repo",)  # built-ins whose every tool runs on the controller (a support call)
# What a tool may declare about its calls (docs/toolpacks.md#effects): nothing outside, only the sandbox's
# files, something outside that is safe to repeat, or something outside (the default).
DECLARED_EFFECTS = ("none", "local", "idempotent", "external")
MANIFEST_NAME = "suzumio.toolpack.json"


def check_json_schema(schema, where):
    """A manifest's inputSchema must be a JSON Schema its draft's meta-schema accepts (jsonschema)."""
    import jsonschema  # imported only when a local manifest is read: `config render` of the rest stays light

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        at = "/".join(str(part) for part in exc.path)
        raise ConfigError(f"{where}: inputSchema is not a valid JSON Schema: {exc.message}"
                          + (f" (at {at})" if at else "")) from None


def packaged_toolpacks_dir():
    """The directory holding the packaged toolpacks: `toolpacks/` beside the controller modules, else
    the one a wheel installed under <prefix>/share/suzumio (suzumio_resources)."""
    return str(resource_path("toolpacks"))


# ---------------------------------------------------------------------------------------------------
# Built-in toolpacks (docs/design/tools.md)

def _schema(properties, required=None):
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


_PRIORITY_PROPERTY = {"type": "string", "enum": list(PRIORITIES), "default": DEFAULT_PRIORITY}

# Descriptions are short and exact: they cost prompt tokens in every request of every activation, and a
# small model follows a short one better. Other tools are named as the docs do (`file.patch`); the runner
# shows each model the names it can call.
_BUILTIN_TOOLS = {
    "core": [
        ("messages.send",
         ("Send a message to an agent, to user, or to a channel; the recipient is woken by it. Say what you did "
          "(exact file paths), what you want next, or what blocks you. No acknowledgements."),
         _schema({
             "recipient": {"type": "string", "description": "Who gets it: an agent id, or user. Give it unless you "
                                                           "give channel."},
             "channel": {"type": "string", "description": "A channel such as #project, instead of recipient."},
             "priority": dict(_PRIORITY_PROPERTY, description=(
                 "P3 routine; P2 continuation; P1 only to unblock active work; P0 only for emergencies.")),
             "body": {"type": "string", "description": "The message (Markdown)."},
         }, ["body"])),
        ("coordination.wait_for_signal",
         ("End this activation until a new signal arrives. Call it after you have reported, never instead of "
          "reporting."),
         _schema({
             "reason": {"type": "string", "description": "What you wait for."},
             "pm": {"type": "string", "description": "The coordinator to notify (default: the configured one)."},
             "notifyPm": {"type": "boolean", "description": "Tell the coordinator you wait (default: true, except "
                          "for the coordinator). Use false if you already reported to it."},
         })),
        ("completion.submit",
         "Submit the project's final report for the user's approval, once the work is done.",
         _schema({"report": {"type": "string", "description": "The final report (Markdown)."}}, ["report"])),
        ("file.read",
         "Read a file (numbered lines) or list a folder under /workspace, /artifacts or /mnt.",
         _schema({
             "path": {"type": "string", "description": "An absolute path, or one relative to /workspace."},
             "offset": {"type": "number", "description": "First line, from 1 (default 1)."},
             "limit": {"type": "number", "description": "Lines or entries (default 200, at most 2000)."},
             "maxBytes": {"type": "number", "description": "Output size (default 50000, at most 100000)."},
         }, ["path"])),
        ("file.write",
         "Write a whole file under /workspace or your own /artifacts/<agent-id>, creating or replacing it.",
         _schema({
             "path": {"type": "string", "description": "An absolute path, or one relative to /workspace."},
             "content": {"type": "string", "description": "The file's complete content."},
             "createDirs": {"type": "boolean", "default": False, "description": "Create missing folders."},
         }, ["path", "content"])),
        ("file.patch",
         ("Edit files under /workspace or your own /artifacts/<agent-id>, in order: add creates or replaces a "
          "file, update replaces exact text, delete removes a file."),
         _schema({
             "operations": {
                 "type": "array",
                 "description": "The edits, applied in order (not atomically).",
                 "items": _schema({
                     "op": {"type": "string", "enum": ["add", "update", "delete"]},
                     "path": {"type": "string"},
                     "content": {"type": "string", "description": "For add: the file's content."},
                     "search": {"type": "string", "description": "For update: the exact text to replace."},
                     "replace": {"type": "string", "description": "For update: the new text."},
                     "replaceAll": {"type": "boolean", "default": False, "description": "Replace every occurrence."},
                     "createDirs": {"type": "boolean", "default": False, "description": "For add: create folders."},
                 }, ["op", "path"]),
             },
         }, ["operations"])),
    ],
    "shell": [
        ("shell.exec",
         "Run a bash command (in /workspace by default). Its output reaches no one until you report it.",
         _schema({
             "command": {"type": "string", "description": "The bash command."},
             "cwd": {"type": "string", "description": "Working folder (default /workspace)."},
             "timeoutMs": {"type": "number", "description": "Timeout (default 60000, at most 300000)."},
             "maxOutputBytes": {"type": "number", "description": "Output kept (default 40000, at most 200000)."},
         }, ["command"])),
    ],
    "web": [
        ("web.fetch",
         "GET an http(s) URL and return its text (HTML reduced to text unless format is raw); errors are returned.",
         _schema({
             "url": {"type": "string"},
             "maxBytes": {"type": "number", "description": "Characters returned (default 20000, at most 100000)."},
             "timeoutMs": {"type": "number", "description": "Timeout (default 30000, at most 120000)."},
             "format": {"type": "string", "enum": ["text", "raw"], "default": "text"},
         }, ["url"])),
    ],
    # The team's repository (docs/teams-that-write-code.md): every call runs on the controller, on the
    # calling agent's own working copy and branch.
    "repo": [
        ("repo.merge",
         ("Ask to land your branch on the integration branch: your workspace is committed, then the merge queue "
          "rebases it onto the latest integration tip and runs the project's checks. It lands only if both succeed; "
          "if not, you get a P1 signal with the conflicting paths or the failing check's output."),
         _schema({"message": {"type": "string", "description": "What the change does: the landed commit's message."}},
                 ["message"])),
        ("repo.sync",
         ("Bring the latest integration branch into your branch (your work is committed first). Conflicting files "
          "keep conflict markers for you to resolve by editing them; then call repo.merge."), _schema({})),
        ("repo.status",
         ("Your branch against the integration branch: commits ahead and behind, the files you changed, waiting "
          "merge requests and unresolved conflicts."), _schema({})),
        ("repo.diff", "The diff of your workspace against the integration branch (what repo.merge would land).",
         _schema({})),
        ("repo.claim",
         ("Claim paths (globs) you are about to change, so other agents know; a path another agent holds is "
          "refused with who holds it and why. A claim ends when your change lands, with repo.release, or after "
          "an hour."),
         _schema({"paths": {"type": "array", "items": {"type": "string"}, "description": "Path globs relative to "
                            "the repository root, e.g. src/parser/*"},
                  "reason": {"type": "string", "description": "Why: what you are changing there."}},
                 ["paths", "reason"])),
        ("repo.release", "Release your claims: those on `paths`, or all of them.",
         _schema({"paths": {"type": "array", "items": {"type": "string"}}})),
    ],
}

_LIMIT_SCHEMA = {"type": "object", "properties": {"limit": {"type": "number", "default": 20}},
                 "additionalProperties": False}

_BUILTIN_WEBUI = {
    "core": [
        {"id": "project.stats", "title": "Project statistics", "kind": "panel",
         "description": "Live counts of agents, messages, activations, tool calls, history and events."},
        {"id": "messages.conversation", "title": "Agent conversation", "kind": "panel",
         "description": "Direct messages between two participants.",
         "inputSchema": {"type": "object", "properties": {
             "agentA": {"type": "string", "default": "user", "description": "First participant (user for the human)."},
             "agentB": {"type": "string", "default": "pm", "description": "Second participant."},
             "limit": {"type": "number", "default": 40, "description": "Maximum direct messages shown."}},
             "additionalProperties": False},
         "submitLabel": "Load conversation"},
        {"id": "messages.send", "title": "Send agent message", "kind": "action",
         "description": "Send a message as the user (or on behalf of an agent) to an agent or a channel.",
         "inputSchema": {"type": "object", "properties": {
             "sender": {"type": "string", "default": "user", "description": "Sender id; user for the human."},
             "recipient": {"type": "string", "description": "Agent id or user. Empty means the coordinator, or the "
                           "first agent."},
             "channel": {"type": "string", "description": "Optional channel such as #project; leave recipient empty "
                         "when used."},
             "priority": _PRIORITY_PROPERTY,
             "body": {"type": "string", "description": "Markdown body."}},
             "required": ["body"], "additionalProperties": False},
         "submitLabel": "Send message"},
        {"id": "coordination.signals", "title": "Signal queue", "kind": "panel",
         "description": "Pending, delivered and closed signals by priority, with the most recent ones.",
         "inputSchema": {"type": "object", "properties": {
             "targetAgent": {"type": "string"},
             "status": {"type": "string", "enum": list(SIGNAL_STATUSES)},
             "limit": {"type": "number", "default": 25}},
             "additionalProperties": False},
         "submitLabel": "Refresh signals"},
        {"id": "completion.report", "title": "Completion report", "kind": "panel",
         "description": "The report submitted with completion.submit, if any."},
        {"id": "file.activity", "title": "File tool activity", "kind": "panel",
         "description": "Calls of file.read, file.write and file.patch.",
         "inputSchema": _LIMIT_SCHEMA, "submitLabel": "Refresh file stats"},
    ],
    "shell": [
        {"id": "shell.activity", "title": "Shell activity", "kind": "panel",
         "description": "Calls of shell.exec.", "inputSchema": _LIMIT_SCHEMA, "submitLabel": "Refresh shell stats"},
    ],
    "repo": [],
    "web": [
        {"id": "web.activity", "title": "Web fetch activity", "kind": "panel",
         "description": "Calls of web.fetch.", "inputSchema": _LIMIT_SCHEMA, "submitLabel": "Refresh web stats"},
    ],
}

SUPPORT_BACKED_BUILTIN_TOOLS = ("messages.send", "coordination.wait_for_signal", "completion.submit")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.-]+$")


# ---------------------------------------------------------------------------------------------------
# Names and allowlist matching (docs/design/tools.md)

def safe_toolpack_id(toolpack_id):
    """The id with every run of characters outside [A-Za-z0-9_.-] replaced by `_` (mount directory name)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", toolpack_id)


def model_tool_name(name):
    """The name offered to models: every run outside [A-Za-z0-9_-] becomes `_` (`file.read` → `file_read`)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


def is_allowed(tool_name, patterns):
    """Allowlist match (docs/design/tools.md): exact name, `*`, or `x.*` prefix; no other wildcards."""
    for pattern in patterns:
        if pattern == tool_name or pattern == "*":
            return True
        if pattern.endswith(".*") and tool_name.startswith(pattern[:-1]):
            return True
    return False


def reaches_toolpack(pattern, toolpack_id):
    """True when an allowlist entry can allow some tool `<toolpack_id>.<name>` (`*`, `org.*` for `org.gh`)."""
    prefix = toolpack_id + "."
    if pattern == "*" or pattern.startswith(prefix):
        return True
    return pattern.endswith(".*") and prefix.startswith(pattern[:-1])


def frozen_json(value):
    """JSON text of a value, so frozen dataclasses can hold it and hand out fresh copies."""
    return json.dumps(value, ensure_ascii=False, sort_keys=False)


# ---------------------------------------------------------------------------------------------------
# Resolved toolpacks and the registry

@dataclass(frozen=True)
class ToolSpec:
    """One model-facing tool: its definition and the toolpack that declares it."""

    name: str
    description: str
    toolpack_id: str
    builtin: bool
    _input_schema_json: str = field(repr=False)
    # What a call may do outside, as the tool declares it (a manifest's `effect`, an MCP server's
    # readOnlyHint/idempotentHint); None: not declared (suzumio_effects decides).
    effect: str = None

    @property
    def input_schema(self):
        return json.loads(self._input_schema_json)

    @property
    def model_name(self):
        return model_tool_name(self.name)

    @property
    def support_backed(self):
        """True for built-in tools the runner forwards to the controller; local tools decide for themselves."""
        return self.builtin and self.name in SUPPORT_BACKED_BUILTIN_TOOLS

    def definition(self):
        """The runner-input ToolDefinition `{name, description, inputSchema}`."""
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}


@dataclass(frozen=True)
class WebuiEntry:
    """A user-facing WebUI control of a toolpack (docs/design/tools.md)."""

    id: str
    title: str
    kind: str
    toolpack_id: str
    builtin: bool
    description: str = None
    submit_label: str = None
    _input_schema_json: str = field(default=None, repr=False)

    @property
    def input_schema(self):
        return None if self._input_schema_json is None else json.loads(self._input_schema_json)

    def to_json(self):
        """The `GET …/tool-ui` shape: absent optional fields omitted, plus toolpackId and toolpackKind."""
        out = {"id": self.id, "title": self.title}
        if self.description is not None:
            out["description"] = self.description
        out["kind"] = self.kind
        if self._input_schema_json is not None:
            out["inputSchema"] = self.input_schema
        if self.submit_label is not None:
            out["submitLabel"] = self.submit_label
        out["toolpackId"] = self.toolpack_id
        out["toolpackKind"] = "builtin" if self.builtin else "local"
        return out


@dataclass(frozen=True)
class ToolpackSpec:
    """One resolved toolpack (docs/design/tools.md). Local toolpacks carry their root and module paths."""

    id: str
    builtin: bool
    tools: tuple
    webui: tuple
    path: str = None
    runner_module: str = None
    controller_module: str = None
    packaged: str = None
    _manifest_json: str = field(default=None, repr=False)
    # MCP toolpacks: the `mcp` block, whether the server's tools are known (listed), and
    # the one-line reason when they are not.
    _mcp_json: str = field(default=None, repr=False)
    mcp_listed: bool = False
    mcp_error: str = None

    @property
    def kind(self):
        if self._mcp_json is not None:
            return "mcp"
        return "builtin" if self.builtin else "local"

    @property
    def mcp(self):
        """The entry's `mcp` block for MCP toolpacks, else None."""
        return None if self._mcp_json is None else json.loads(self._mcp_json)

    @property
    def mcp_where(self):
        """`controller` (the controller owns the session) or `runner` (started inside the sandbox)."""
        return None if self._mcp_json is None else (self.mcp.get("where") or "controller")

    @property
    def manifest(self):
        return None if self._manifest_json is None else json.loads(self._manifest_json)

    @property
    def safe_id(self):
        return safe_toolpack_id(self.id)

    @property
    def support_path(self):
        return "/toolpacks/" + quote(self.id, safe="") + "/support"

    @property
    def runner_module_ref(self):
        """`builtin:<id>` for built-ins, else the absolute host path of the runner module (None if WebUI-only)."""
        if self.builtin and self.id in CONTROLLER_TOOLPACKS:
            return "support:"  # every call goes to the support route
        return f"builtin:{self.id}" if self.builtin else self.runner_module

    @property
    def runner_module_relative(self):
        """The runner module path relative to the toolpack root, POSIX separators (container addressing)."""
        if self.builtin or self.runner_module is None:
            return None
        return Path(os.path.relpath(self.runner_module, self.path)).as_posix()

    @property
    def container_runner_module(self):
        """`/toolpacks/<safe id>/<relative runner path>` for docker-chat; `builtin:<id>` for built-ins."""
        if self.builtin:
            return f"builtin:{self.id}"
        if self.runner_module is None:
            return None
        return f"/toolpacks/{self.safe_id}/{self.runner_module_relative}"

    @property
    def has_scheduler_hook(self):
        """Local toolpacks (WebUI-only ones included) are asked for a scheduler hook every tick; built-ins
        and MCP toolpacks never."""
        return not self.builtin and self._mcp_json is None

    @property
    def tool_names(self):
        return [tool.name for tool in self.tools]

    def webui_entry(self, entry_id):
        return next((entry for entry in self.webui if entry.id == entry_id), None)


@dataclass(frozen=True)
class ToolRegistry:
    """The resolved toolpacks of a project in registration order, with name lookups and allowlist filters."""

    toolpacks: tuple

    def toolpack(self, toolpack_id):
        return next((pack for pack in self.toolpacks if pack.id == toolpack_id), None)

    def tool(self, name):
        for pack in self.toolpacks:
            for tool in pack.tools:
                if tool.name == name:
                    return tool
        return None

    @property
    def tools(self):
        return [tool for pack in self.toolpacks for tool in pack.tools]

    @property
    def tool_names(self):
        return [tool.name for tool in self.tools]

    def allowed_tools(self, patterns):
        """Registered tools an allowlist allows, in registration order (unmatched patterns are ignored)."""
        return [tool for tool in self.tools if is_allowed(tool.name, patterns)]

    def webui_entries(self):
        """Every WebUI entry of every toolpack: toolpacks in config order, entries in declaration order."""
        return [entry for pack in self.toolpacks for entry in pack.webui]

    def unknown_allowlist_entry(self, patterns):
        """(index, entry) of the first allowlist entry naming no registered tool (load-time rule), or None."""
        names = self.tool_names
        # An MCP toolpack whose server was not asked (plain render) accepts `<id>.*` and `<id>.<name>`.
        unlisted = [pack.id + "." for pack in self.toolpacks if pack.kind == "mcp" and not pack.mcp_listed]
        for index, pattern in enumerate(patterns):
            if pattern == "*" or pattern in names:
                continue
            if pattern.endswith(".*") and any(name.startswith(pattern[:-1]) for name in names):
                continue
            if any(pattern.startswith(prefix) and len(pattern) > len(prefix) for prefix in unlisted):
                continue
            return index, pattern
        return None


# ---------------------------------------------------------------------------------------------------
# Resolution: built-ins and local manifests (docs/design/tools.md)

def _builtin_toolpack(toolpack_id):
    tools = tuple(ToolSpec(name, description, toolpack_id, True, frozen_json(schema))
                  for name, description, schema in _BUILTIN_TOOLS[toolpack_id])
    webui = tuple(WebuiEntry(entry["id"], entry["title"], entry["kind"], toolpack_id, True,
                             entry.get("description"), entry.get("submitLabel"),
                             frozen_json(entry["inputSchema"]) if "inputSchema" in entry else None)
                  for entry in _BUILTIN_WEBUI[toolpack_id])
    return ToolpackSpec(toolpack_id, True, tools, webui)


def unknown_builtin_error(entry):
    """The error for a bare toolpack name that is not a built-in."""
    return ConfigError(f"Unknown built-in toolpack: {entry} (configure local toolpacks as {{ path: ... }})")


def check_toolpack_directory(path, base_dir=None):
    """Entry checks of docs/design/tools.md for a path entry; returns the absolute directory."""
    if HTTP_URL.match(path):
        raise ConfigError(f"Toolpack paths must be local directories, not HTTP(S) URLs: {path}")
    root = lexical_abspath(path, base_dir)
    if not os.path.exists(root):
        raise ConfigError(f"Local toolpack path not found: {root}")
    if not os.path.isdir(root):
        raise ConfigError(f"Local toolpack path is not a directory: {root}")
    manifest = os.path.join(root, MANIFEST_NAME)
    if not os.path.isfile(manifest):
        raise ConfigError(f"Toolpack manifest not found: {manifest}")
    return root


def _blank(value):
    return not isinstance(value, str) or not value.strip()


def _module_path(root, value, default):
    relative = default if _blank(value) else value
    resolved = os.path.normpath(os.path.join(root, relative))
    # The real path too: a symlinked module (or folder) inside the toolpack must not load code from outside.
    if not _inside(resolved, root) or not _inside(os.path.realpath(resolved), os.path.realpath(root)):
        raise ConfigError(f"Module path escapes the toolpack directory: {resolved}")
    return resolved


def _inside(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def load_local_toolpack(root, config_id=None, packaged=None):
    """Read and validate `<root>/suzumio.toolpack.json` (docs/design/tools.md, first failure wins)."""
    manifest_path = os.path.join(root, MANIFEST_NAME)
    try:
        with open(manifest_path, "rb") as handle:
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ConfigError(f"Toolpack manifest not found: {manifest_path}") from None
    except OSError as exc:
        raise ConfigError(f"{exc.strerror or exc}: {manifest_path}") from None
    try:
        manifest = strict_json_loads(text)
    except ValueError as exc:
        raise ConfigError(f"Invalid toolpack manifest JSON in {manifest_path}: {exc}") from None
    if not isinstance(manifest, dict):
        manifest = {}
    toolpack_id = manifest.get("id")
    if _blank(toolpack_id):
        raise ConfigError("Manifest field id is required")
    if not _ID_PATTERN.match(toolpack_id):
        raise ConfigError(f"Invalid toolpack id {toolpack_id}: use only letters, digits, '.', '_' and '-'")
    if config_id is not None and config_id != toolpack_id:
        raise ConfigError(f"Toolpack id mismatch: config says {config_id}, manifest says {toolpack_id}")
    declared = manifest.get("tools")
    if not isinstance(declared, list):
        raise ConfigError("Manifest field tools must be an array")
    tools = []
    for tool in declared:
        if not isinstance(tool, dict):
            raise ConfigError("Each manifest tool must be an object")
        if not isinstance(tool.get("inputSchema"), dict):
            raise ConfigError("Manifest tool inputSchema must be an object")
        if _blank(tool.get("name")):
            raise ConfigError("Manifest field tool.name is required")
        if _blank(tool.get("description")):
            raise ConfigError("Manifest field tool.description is required")
        check_json_schema(tool["inputSchema"], f"Manifest tool {tool['name']}")
        effect = tool.get("effect")
        if effect is not None and effect not in DECLARED_EFFECTS:
            raise ConfigError(f"Manifest tool {tool['name']}: effect must be one of {', '.join(DECLARED_EFFECTS)}")
        tools.append(ToolSpec(tool["name"], tool["description"], toolpack_id, False, frozen_json(tool["inputSchema"]),
                              effect))
    entries = manifest.get("webui")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise ConfigError("Manifest field webui must be an array")
    webui, seen = [], set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise ConfigError("Each manifest webui entry must be an object")
        entry_id = entry.get("id")
        if _blank(entry_id):
            raise ConfigError("Manifest field webui.id is required")
        if not _ID_PATTERN.match(entry_id):
            raise ConfigError(f"Invalid WebUI entry id {entry_id}: use only letters, digits, '.', '_' and '-'")
        if entry_id in seen:
            raise ConfigError(f"Duplicate WebUI entry id: {entry_id}")
        seen.add(entry_id)
        schema = entry.get("inputSchema")
        if schema is not None and not isinstance(schema, dict):
            raise ConfigError("Manifest webui inputSchema must be an object")
        if schema is not None:
            check_json_schema(schema, f"Manifest webui entry {entry_id}")
        if _blank(entry.get("title")):
            raise ConfigError("Manifest field webui.title is required")
        kind = entry.get("kind")
        if kind is None:
            kind = "panel"
        if kind not in ("panel", "action"):
            raise ConfigError(f"Invalid WebUI entry kind: {kind}")
        description = entry.get("description") if isinstance(entry.get("description"), str) else None
        submit_label = entry.get("submitLabel") if isinstance(entry.get("submitLabel"), str) else None
        webui.append(WebuiEntry(entry_id, entry["title"], kind, toolpack_id, False, description, submit_label,
                                None if schema is None else frozen_json(schema)))
    if not tools and not webui:
        raise ConfigError(f"Toolpack {toolpack_id} has neither tools nor WebUI entries")
    runner = _module_path(root, manifest.get("runner"), "runner.mjs") if tools else None
    controller = _module_path(root, manifest.get("controller"), "controller.mjs")
    if runner is not None and not runner.endswith(".mjs"):
        raise ConfigError(f"The runner module must be a .mjs file: {runner}")
    if not controller.endswith(".mjs"):
        raise ConfigError(f"The controller module must be a .mjs file: {controller}")
    if runner is not None and not os.path.isfile(runner):
        raise ConfigError(f"Local toolpack runner module not found: {runner}")
    if not os.path.isfile(controller):
        raise ConfigError(f"Local toolpack controller module not found: {controller}")
    return ToolpackSpec(toolpack_id, False, tuple(tools), tuple(webui), root, runner, controller, packaged,
                        frozen_json(manifest))


def mcp_toolpack(entry, mcp_tools=None):
    """An MCP toolpack. `mcp_tools(id, mcp)` → (tool definitions or None, error line) asks the
    server; without it (plain render, runner-side servers) the tools stay unknown and unlisted.
    Each server tool `t` becomes `<id>.t` with the server's description and input schema."""
    toolpack_id, mcp = entry["id"], entry["mcp"]
    if not _ID_PATTERN.match(toolpack_id):
        raise ConfigError(f"Invalid toolpack id {toolpack_id}: use only letters, digits, '.', '_' and '-'")
    listed, error, tools = None, None, ()
    if mcp_tools is not None and (mcp.get("where") or "controller") == "controller":
        listed, error = mcp_tools(toolpack_id, mcp)
    if listed is not None:
        tools = tuple(ToolSpec(f"{toolpack_id}.{tool['name']}", tool["description"], toolpack_id, False,
                               frozen_json(tool["inputSchema"]), tool.get("effect")) for tool in listed)
    return ToolpackSpec(toolpack_id, False, tools, (), _mcp_json=frozen_json(mcp), mcp_listed=listed is not None,
                        mcp_error=error)


def resolve_toolpacks(entries, base_dir=None, packaged_dir=None, mcp_tools=None):
    """Resolve `tools.toolpacks` afresh from disk into a ToolRegistry (docs/design/tools.md); raises ConfigError.
    `mcp_tools` lists MCP servers' tools (see mcp_toolpack)."""
    packaged_dir = packaged_dir or packaged_toolpacks_dir()
    toolpacks, seen = [], set()
    for entry in entries:
        if isinstance(entry, dict) and "mcp" in entry:
            pack = mcp_toolpack(entry, mcp_tools)
        elif isinstance(entry, str):
            if entry not in BUILTIN_TOOLPACKS:
                raise unknown_builtin_error(entry)
            pack = _builtin_toolpack(entry)
        else:
            if entry.get("packaged") is not None:
                root = check_toolpack_directory(os.path.join(packaged_dir, entry["packaged"]))
            else:
                root = check_toolpack_directory(entry["path"], base_dir)
            pack = load_local_toolpack(root, entry.get("id"), entry.get("packaged"))
        if pack.id in seen:
            raise ConfigError(f"Duplicate toolpack: {pack.id}")
        seen.add(pack.id)
        toolpacks.append(pack)
    owners = {}
    for pack in toolpacks:
        for tool in pack.tools:
            if tool.name in owners:
                raise ConfigError(f"Tool {tool.name} is declared by both {owners[tool.name]} and {pack.id}")
            owners[tool.name] = pack.id
    return ToolRegistry(tuple(toolpacks))
