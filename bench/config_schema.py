"""The config schema language against jsonschema, side by side in one run: the hand-written checks of
suzumio_config_schema (validate_schema: checks, defaults, unknown-key hints) and jsonschema's
Draft 2020-12 validator on a JSON Schema translated mechanically from the same tree (checks only: it
fills no defaults and drops no keys), each timed as the median of seven runs. It prints the size of
each, the time per validation of the example projects and of broken trees, and the messages each
gives for the same broken trees, which is what docs/design/config.md decides on.
Usage: .venv/bin/python bench/config_schema.py [--rounds 300] [--json]"""
import argparse
import copy
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import benchlib  # noqa: F401  puts the repository on sys.path
import jsonschema

import suzumio_config_schema as schema
from suzumio_yaml import apply_extends, load_file

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = ("demo.yaml", "team.yaml", "smoke.yaml")

# Broken trees of the kinds a user writes, each applied to a copy of examples/demo.yaml.
BROKEN = {
    "wrong type deep": lambda t: t["agents"]["pm"].__setitem__("tools", "messages.send"),
    "negative count": lambda t: t["agents"]["worker"].__setitem__("count", 0),
    "unknown enum": lambda t: t["backend"].__setitem__("kind", "dockr"),
    "fraction timeout": lambda t: t["backend"].__setitem__("activationTimeoutMs", 1.5),
    "missing task": lambda t: t.pop("task"),
    "toolpack entry": lambda t: t.setdefault("tools", {}).__setitem__("toolpacks", ["core", {"path": ""}]),
    "typo key": lambda t: t["backend"].__setitem__("dockr", {"image": "x"}),
    "two at once": lambda t: (t["agents"]["pm"].__setitem__("network", "yes"),
                              t["scheduler"].__setitem__("maxSignalsPerActivation", -1)),
}


def to_json_schema(node):
    """The JSON Schema of one node of the hand-written tree; custom nodes become what JSON Schema can
    say of them (the rest of their rule is lost, which is counted in `lost`)."""
    lost = to_json_schema.lost
    if isinstance(node, schema._Obj):
        if type(node).rules is not schema._Obj.rules or type(node).preprocess is not schema._Obj.preprocess:
            lost.add(type(node).__name__)
        properties, required = {}, []
        for key, child, default in node.fields:
            properties[key] = to_json_schema(child)
            if default is schema._REQUIRED:
                required.append(key)
        out = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            out["required"] = required
        return out
    if isinstance(node, schema._Str):
        return {"type": "string", "minLength": 1} if node.nonempty else {"type": "string"}
    if isinstance(node, schema._Num):
        out = {"type": "integer" if node.integer else "number"}
        if node.gt is not None:
            out["exclusiveMinimum"] = node.gt
        if node.ge is not None:
            out["minimum"] = node.ge
        return out
    if isinstance(node, schema._Bool):
        return {"type": "boolean"}
    if isinstance(node, schema._Enum):
        return {"enum": list(node.values)}
    if isinstance(node, schema._Literal):
        return {"const": node.value}
    if isinstance(node, schema._Any):
        return {}
    if isinstance(node, schema._List):
        out = {"type": "array", "items": to_json_schema(node.item)}
        if node.nonempty:
            out["minItems"] = 1
        return out
    if isinstance(node, schema._Record):
        return {"type": "object", "additionalProperties": to_json_schema(node.item)}
    if isinstance(node, schema._OrFalse):
        return {"anyOf": [{"const": False}, to_json_schema(node.node)]}
    if isinstance(node, schema._Keep):
        return {"anyOf": [{"const": "all"}, {"type": "integer", "minimum": 0}]}
    if isinstance(node, schema._TimeoutMs):
        return {"anyOf": [{"const": False}, {"type": "integer", "exclusiveMinimum": 0}]}
    if isinstance(node, schema._Script):
        return {"type": ["object", "string"]}
    if isinstance(node, schema._ToolpackEntry):
        lost.add("_ToolpackEntry (mcp entries)")
        return {"anyOf": [{"type": "string", "minLength": 1},
                          {"type": "object", "required": ["path"], "properties": {"path": {"type": "string",
                                                                                          "minLength": 1}}},
                          {"type": "object", "required": ["packaged"],
                           "properties": {"packaged": {"enum": list(schema.PACKAGED_TOOLPACKS)}}}]}
    lost.add(type(node).__name__)
    return {}


to_json_schema.lost = set()


def trees():
    out = {}
    for name in EXAMPLES:
        tree = apply_extends(load_file(REPO / "examples" / name, env={}))
        out[name] = tree
    return out


def hand_written(tree):
    try:
        schema.validate_schema(copy.deepcopy(tree))
        return []
    except schema.ConfigError as error:
        return [line.strip() for line in str(error).splitlines()[1:]]


def json_schema_errors(validator, tree):
    return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(tree), key=lambda e: list(map(str, e.absolute_path)))]


def timed(fn, items, rounds, repeats=7):
    """Seconds per call: the median of `repeats` runs of `rounds` passes over `items`."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            for item in items:
                fn(item)
        samples.append((time.perf_counter() - start) / (rounds * len(items)))
    return statistics.median(samples)


def schema_language_lines():
    """Lines of the hand-written language itself: its node classes and the helpers they use."""
    names = ("_type_name", "_format_path", "_path_part", "_Issues", "_Str", "_Num", "_Bool", "_Enum",
             "_Literal", "_Any", "_List", "_Record", "_EnvOptionalStr", "_Obj", "_OrFalse", "_Keep",
             "_TimeoutMs", "_Script")
    return sum(len(inspect.getsource(getattr(schema, name)).splitlines()) for name in names)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    document = to_json_schema(schema._PROJECT)
    validator = jsonschema.Draft202012Validator(document)
    good = trees()
    broken = {}
    for label, breaker in BROKEN.items():
        tree = copy.deepcopy(good["demo.yaml"])
        breaker(tree)
        broken[label] = tree
    result = {
        "hand_written_language_lines": schema_language_lines(),
        "schema_module_lines": len(inspect.getsource(schema).splitlines()),
        "json_schema_document_lines": len(json.dumps(document, indent=1).splitlines()),
        "json_schema_lost_rules": sorted(to_json_schema.lost),
        "good_us": {"hand_written": timed(hand_written, list(good.values()), args.rounds) * 1e6,
                    "jsonschema": timed(validator.is_valid, list(good.values()), args.rounds) * 1e6},
        "broken_us": {"hand_written": timed(hand_written, list(broken.values()), args.rounds) * 1e6,
                      "jsonschema": timed(lambda t: list(validator.iter_errors(t)), list(broken.values()),
                                          args.rounds) * 1e6},
        "messages": {label: {"hand_written": hand_written(tree) + schema.unknown_keys(tree),
                             "jsonschema": json_schema_errors(validator, tree)}
                     for label, tree in broken.items()},
    }
    for kind in ("good_us", "broken_us"):
        result[kind]["ratio_jsonschema_to_hand_written"] = result[kind]["jsonschema"] / result[kind]["hand_written"]
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return
    print(f"hand-written schema language: {result['hand_written_language_lines']} lines "
          f"(the whole schema module, tree included: {result['schema_module_lines']})")
    print(f"JSON Schema translated from the tree: {result['json_schema_document_lines']} lines of JSON; "
          f"rules it cannot say: {', '.join(result['json_schema_lost_rules'])}")
    for kind, what in (("good_us", "valid example projects"), ("broken_us", "broken trees")):
        row = result[kind]
        print(f"{what}: hand-written {row['hand_written']:.0f} µs (checks and defaults), jsonschema "
              f"{row['jsonschema']:.0f} µs (checks only): ratio {row['ratio_jsonschema_to_hand_written']:.2f}")
    for label, messages in result["messages"].items():
        print(f"\n[{label}]")
        for line in messages["hand_written"]:
            print(f"  hand-written  {line}")
        for line in messages["jsonschema"]:
            print(f"  jsonschema    {line}")


if __name__ == "__main__":
    main()
