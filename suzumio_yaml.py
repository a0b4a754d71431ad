"""The YAML dialect and file pipeline of project configs (docs/configuration.md): the YAML 1.2 core loader
on top of PyYAML, strict JSON, `${NAME}` placeholders, bare `@import(...)` marker quoting, imports with
cycle and depth checks, `extends` merging, and the block YAML dumper render uses. Knows nothing of the
schema."""
import json
import math
import os
import re

import yaml
import yaml.composer
import yaml.constructor
import yaml.resolver

from suzumio_errors import ConfigError

MAX_IMPORT_DEPTH = 32
MAX_ALIAS_EXPANSION = 200_000


# ---------------------------------------------------------------------------------------------------
# YAML 1.2 core dialect on top of PyYAML (docs/configuration.md)

class _Yaml12Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, no merge keys, no timestamps and no duplicate keys."""


_Yaml12Loader.yaml_implicit_resolvers = {}
_YAML12_RESOLVERS = [
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    ("tag:yaml.org,2002:float",
     (r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
      r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), "-+.0123456789"),
]
for _tag, _pattern, _first in _YAML12_RESOLVERS:
    _Yaml12Loader.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def _construct_int(loader, node):
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text, 8)
    if text.startswith("0x"):
        return int(text, 16)
    return int(text, 10)


def _construct_float(loader, node):
    text = loader.construct_scalar(node).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _key_text(key):
    """Mapping keys that are not strings become strings, as JavaScript's String() would spell them."""
    if isinstance(key, str):
        return key
    if key is None:
        return ""
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, float) and key.is_integer():
        return str(int(key))
    return str(key)


def _construct_mapping(loader, node, deep=False):
    if not isinstance(node, yaml.MappingNode):
        raise yaml.constructor.ConstructorError(None, None, "expected a mapping node", node.start_mark)
    mapping = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (list, dict)):
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, "found unhashable key", key_node.start_mark)
        key = _key_text(key)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f'found duplicate key "{key}"',
                key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


def _construct_yaml_map(loader, node):
    data = {}
    yield data
    data.update(_construct_mapping(loader, node))


_Yaml12Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Yaml12Loader.add_constructor("tag:yaml.org,2002:map", _construct_yaml_map)
_Yaml12Loader.construct_mapping = _construct_mapping


def _expanded_size(value, memo, budget):
    """Node count of the tree with aliases expanded; memoized so shared sub-trees cost nothing to count."""
    key = id(value)
    if key in memo:
        return memo[key]
    size = 1
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        children = ()
    for child in children:
        size += _expanded_size(child, memo, budget)
        if size > budget:
            break
    if isinstance(value, (dict, list)):
        memo[key] = size
    return size


def _unshare(value, source):
    """A copy of the tree in which no container is shared (YAML aliases become independent copies)."""
    if isinstance(value, dict):
        return {k: _unshare(v, source) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshare(v, source) for v in value]
    if value is not None and not isinstance(value, (str, bool, int, float)):
        raise ConfigError(f"Invalid YAML in {source}: unsupported value of type {type(value).__name__} "
                          "(only mappings, lists, strings, numbers, booleans and null)")
    return value


def parse_yaml(text, source="<string>"):
    """Parse one YAML document with the loader's YAML 1.2 core dialect (docs/configuration.md)."""
    try:
        value = yaml.load(text, Loader=_Yaml12Loader)
    except yaml.MarkedYAMLError as exc:
        raise ConfigError(f"Invalid YAML in {source}: {_yaml_error_text(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Invalid YAML in {source}: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"Invalid YAML in {source}: nested too deeply") from None
    except ValueError as exc:  # an integer past Python's digit limit
        raise ConfigError(f"Invalid YAML in {source}: {exc}") from None
    if _expanded_size(value, {}, MAX_ALIAS_EXPANSION) > MAX_ALIAS_EXPANSION:
        raise ConfigError(f"Invalid YAML in {source}: document expands to more than "
                          f"{MAX_ALIAS_EXPANSION} nodes through aliases")
    return _unshare(value, source)


def _yaml_error_text(exc):
    parts = []
    if exc.context:
        parts.append(exc.context)
    if exc.problem:
        parts.append(exc.problem)
    text = " ".join(" ".join(parts).split()) or "parse error"
    mark = exc.problem_mark or exc.context_mark
    if mark is not None:
        text += f" (line {mark.line + 1}, column {mark.column + 1})"
    return text


def _reject_json_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def strict_json_loads(text):
    """json.loads that rejects NaN and Infinity (RFC 8259); raises ValueError."""
    return json.loads(text, parse_constant=_reject_json_constant)


def parse_json(text, source="<string>"):
    """Strict RFC 8259 JSON: NaN and Infinity are rejected, duplicate keys keep the last value."""
    try:
        return strict_json_loads(text)
    except ValueError as exc:
        raise ConfigError(f"Invalid JSON in {source}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"Invalid JSON in {source}: nested too deeply") from None


# ---------------------------------------------------------------------------------------------------
# File loader, placeholders, bare-marker quoting, imports (docs/configuration.md)

_PLACEHOLDER = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}")
_WHOLE_DOCUMENT_MARKER = re.compile(r"^@import\(([^)]+)\)$")
_MAPPING_VALUE_MARKER = re.compile(r"^(\s*[^#\n][^:\n]*:\s*)@import\(([^)\n]+)\)(\s*(?:#.*)?)$", re.MULTILINE)
_SEQUENCE_ITEM_MARKER = re.compile(r"^(\s*-\s*)@import\(([^)\n]+)\)(\s*(?:#.*)?)$", re.MULTILINE)
_FLOW_ITEM_MARKER = re.compile(r"([\[,]\s*|[\[{,][^:\n\[\]{},\"']*:\s+)@import\(([^)\n]+)\)(?=\s*[,\]}])")
_MARKER = re.compile(r"^@import\(([^)]+)\)$")
HTTP_URL = re.compile(r"^https?://", re.IGNORECASE)  # refused as @import and toolpack paths


def substitute_placeholders(text, env):
    """Replace `${NAME}` and `${env:NAME}` by the variable's value (unset: empty string), one pass."""
    return _PLACEHOLDER.sub(lambda m: env.get(m.group(1), ""), text)


def quote_bare_markers(text):
    """Wrap bare `@import(...)` markers in double quotes so YAML can parse them (docs/configuration.md).

    Beyond the reference, a marker that is a whole item of a flow collection (`extends: [@import(a.yaml)]`,
    `agents: {pm: @import(pm.yaml)}`) is quoted too, because acceptance scenarios 12, 17, 19 and 20 of
    docs/configuration.md write it that way; the reference left it bare, which is a YAML syntax error."""
    trimmed = text.strip()
    if _WHOLE_DOCUMENT_MARKER.match(trimmed):
        return json.dumps(trimmed, ensure_ascii=False)
    def quoted(match):
        return f'{match.group(1)}"@import({match.group(2)})"{match.group(3)}'
    text = _MAPPING_VALUE_MARKER.sub(quoted, text)
    text = _SEQUENCE_ITEM_MARKER.sub(quoted, text)
    return "\n".join(_quote_flow_markers(line) for line in text.split("\n"))


def _quote_flow_markers(line):
    if "@import(" not in line:
        return line
    out, position = [], 0
    for match in _FLOW_ITEM_MARKER.finditer(line):
        before = line[:match.start()]
        if before.count('"') % 2 or before.count("'") % 2 or "#" in before:
            continue
        out.append(line[position:match.start()])
        out.append(f'{match.group(1)}"@import({match.group(2)})"')
        position = match.end()
    out.append(line[position:])
    return "".join(out)


def import_marker_path(value):
    """The import path of a whole-field marker string, or None when value is not a marker."""
    if not isinstance(value, str):
        return None
    match = _MARKER.match(value.strip())
    return match.group(1).strip() if match else None


def lexical_abspath(path, base=None):
    """The absolute, normalized path, without resolving symlinks (import cycles compare these)."""
    joined = os.path.join(base if base is not None else os.getcwd(), path)
    return os.path.normpath(joined)


def _extension(path):
    name = os.path.basename(path)
    dot = name.rfind(".")
    if dot <= 0:
        return ""
    return name[dot:].lower()


def read_text(path):
    """A file's text (UTF-8, undecodable bytes replaced); ConfigError when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"File not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"{exc.strerror or exc}: {path}") from None
    return raw.decode("utf-8", errors="replace")


def _load_file(path, chain, env):
    """Load one file of the project (YAML, JSON or text) with its imports resolved (docs/configuration.md)."""
    absolute = lexical_abspath(path)
    if absolute in chain:
        raise ConfigError("Circular @import detected: " + " -> ".join(chain + [absolute]))
    if len(chain) > MAX_IMPORT_DEPTH:
        raise ConfigError("Maximum @import depth exceeded")
    text = read_text(absolute)
    extension = _extension(absolute)
    if extension in (".yaml", ".yml"):
        value = parse_yaml(quote_bare_markers(substitute_placeholders(text, env)), absolute)
        if value is None:
            value = {}
    elif extension == ".json":
        value = parse_json(substitute_placeholders(text, env), absolute)
    else:
        return text
    return _resolve_imports(value, os.path.dirname(absolute), chain + [absolute], env)


def load_file(path, env):
    """Load a project file (YAML, JSON or text) with its imports resolved; raises ConfigError."""
    return _load_file(path, [], env)


def _resolve_imports(value, base_dir, chain, env):
    marker = import_marker_path(value)
    if marker is not None:
        if HTTP_URL.match(marker):
            raise ConfigError("HTTP(S) @import is disabled for reproducibility")
        return _load_file(lexical_abspath(marker, base_dir), chain, env)
    if isinstance(value, list):
        return [_resolve_imports(item, base_dir, chain, env) for item in value]
    if isinstance(value, dict):
        return {key: _resolve_imports(item, base_dir, chain, env) for key, item in value.items()}
    return value


def apply_extends(value):
    """Merge `extends` profiles into every mapping reachable through mappings (docs/configuration.md)."""
    if not isinstance(value, dict):
        return value
    if "extends" not in value:
        bases = []
    elif isinstance(value["extends"], list):
        bases = value["extends"]
    else:
        bases = [value["extends"]]
    merged = {}
    for base in bases:
        merged = _merge(merged, apply_extends(base))
    own = {key: apply_extends(item) for key, item in value.items() if key != "extends"}
    return _merge(merged, own)


def _merge(base, over):
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, item in over.items():
            if key in out and isinstance(out[key], dict) and isinstance(item, dict):
                out[key] = _merge(out[key], item)
            else:
                out[key] = item
        return out
    return over


# ---------------------------------------------------------------------------------------------------
# Block YAML that the dialect above reads back exactly (render, docs/configuration.md)

class _RenderDumper(yaml.SafeDumper):
    """Block style with indented sequences; strings the loader would read as another type are quoted."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


for _tag, _pattern, _first in _YAML12_RESOLVERS:
    _RenderDumper.add_implicit_resolver(_tag, re.compile(_pattern), list(_first))


def _represent_str(dumper, value):
    style = "|" if "\n" in value else None
    if any(ch in value for ch in "\x85\u2028\u2029"):
        style = '"'  # PyYAML would write these raw, and its reader folds them as line breaks
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RenderDumper.add_representer(str, _represent_str)


def dump_yaml(tree):
    """Serialize a tree as block YAML that the loader's dialect reads back exactly."""
    return yaml.dump(tree, Dumper=_RenderDumper, default_flow_style=False, sort_keys=False, allow_unicode=True,
                     width=120, indent=2)
