"""Tool calls as real models make them (docs/real-models.md): a tool named with dots or underscores, calls
written into the answer's text instead of the tool-call field, and the one short answer a call gets
when it cannot run (no such tool, arguments that are not JSON or do not fit the tool's schema), naming
what the model can do instead. Standard library only, like every runner file."""
import json
import os
import re

from suzumio_runner_models import ToolCall, safe_tool_name

TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
FENCED = re.compile(r"```[A-Za-z_]*[ \t]*\n(.*?)\n?```", re.S)
PREFIXES = ("functions.", "functions_", "tools.", "tool.")
TYPES = {
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "integer": (int,),
    "number": (int, float),
}
REPORTING_TOOLS = ("messages_send", "coordination_wait_for_signal", "completion_submit")


def resolve_tool(name, by_safe):
    """The registered tool a model meant by `name`: its exact model-facing name, the dotted name the docs
    use, either in another case, or with a `functions.` prefix some models add; None when none fits."""
    if not isinstance(name, str):
        return None
    if name in by_safe:
        return by_safe[name]
    plain = name.strip()
    for prefix in PREFIXES:
        if plain.startswith(prefix) and len(plain) > len(prefix):
            plain = plain[len(prefix):]
    safe = safe_tool_name(plain)
    if safe in by_safe:
        return by_safe[safe]
    folded = {key.lower(): tool for key, tool in by_safe.items()}
    return folded.get(safe.lower())


def calls_in_text(text, tools=()):
    """The tool calls a model wrote into its answer's text: `<tool_call>` tags (the form llama.cpp passes
    through when its parser misses a call), a fenced JSON block, or an answer that is one JSON object,
    each {"name", "arguments"} (or "parameters"). Objects without a string name are not calls; failing
    any, an answer that is only the arguments of one of `tools` ([(name, schema)]) is (arguments_in_text)."""
    if not text or "{" not in text:
        return []
    return _named_calls(text) or arguments_in_text(text, tools)


def _named_calls(text):
    if "<tool_call>" in text:
        chunks = TAGGED.findall(text)
    else:
        chunks = FENCED.findall(text) or ([text.strip()] if text.strip().startswith("{") else [])
    calls = []
    for chunk in chunks:
        for value in _json_values(chunk):
            for item in value if isinstance(value, list) else [value]:
                call = _as_call(item)
                if call is not None:
                    calls.append(call)
    return calls


def arguments_in_text(text, tools):
    """The call of an answer that is only a tool's arguments, one JSON object without the tool's name, as the
    lab's model wrote `{"reason": ..., "notifyPm": true}` for coordination_wait_for_signal: the tool is the
    one of `tools` ([(name, schema)]) whose fields the object fits; none when no tool or more than one fits."""
    if not text or not text.strip().startswith("{"):
        return []
    found = [value for value in _json_values(text.strip()) if isinstance(value, dict) and value]
    if len(found) != 1:
        return []
    args = found[0]
    fits = [name for name, schema in tools if isinstance(schema, dict) and isinstance(schema.get("properties"), dict)
            and set(args) <= set(schema["properties"]) and input_problem(schema, args) is None]
    if len(fits) != 1:
        return []
    return [ToolCall(f"call_{os.urandom(12).hex()}", fits[0], json.dumps(args, ensure_ascii=False))]


def _json_values(chunk):
    decoder = json.JSONDecoder()
    values, at = [], 0
    while True:
        start = min((i for i in (chunk.find("{", at), chunk.find("[", at)) if i >= 0), default=-1)
        if start < 0:
            return values
        try:
            value, end = decoder.raw_decode(chunk, start)
        except ValueError:
            at = start + 1
            continue
        values.append(value)
        at = end


def _as_call(item):
    if not isinstance(item, dict):
        return None
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        function = item.get("function")
        if isinstance(function, dict):
            return _as_call(function)
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if not isinstance(arguments, (dict, str)):
        return None
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{os.urandom(12).hex()}", name.strip(), text)


def unknown_tool_answer(name, names):
    """The answer to a call of a tool the agent does not have."""
    shown = json.dumps(name if isinstance(name, str) else "", ensure_ascii=False)[:120]
    listed = ", ".join(names) if names else "none"
    return f"There is no tool named {shown}. Your tools are: {listed}. Call one of them by its exact name."


def bad_json_answer(name, error):
    return (f"The arguments of {name} are not valid JSON ({error}). Call {name} again with its arguments as "
            "one JSON object.")


def input_problem(schema, args):
    """The first way `args` misses what models most often get wrong about a tool's schema, as a short
    phrase: not an object, a required field missing, a field the tool does not have, a value of the wrong
    type. None when it fits."""
    if not isinstance(args, dict):
        return "the arguments must be one JSON object"
    if not isinstance(schema, dict):
        return None
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    for field in schema.get("required") or []:
        if field not in args:
            return f'the required field "{field}" is missing'
    if schema.get("additionalProperties") is False:
        for field in args:
            if field not in properties:
                return f'"{field}" is not a field of this tool'
    for field, value in args.items():
        spec = properties.get(field)
        wanted = spec.get("type") if isinstance(spec, dict) else None
        names = wanted if isinstance(wanted, list) else [wanted]
        kinds = [TYPES[n] for n in names if n in TYPES]
        if value is None and "null" in names:
            continue
        if kinds and not any(_is(value, kind) for kind in kinds):
            return f'"{field}" must be {" or ".join(n for n in names if n)}, not {_json_type(value)}'
        enum = spec.get("enum") if isinstance(spec, dict) else None
        if isinstance(enum, list) and value not in enum:
            return f'"{field}" must be one of {", ".join(json.dumps(v) for v in enum)}'
    return None


def _is(value, kinds):
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _json_type(value):
    for name in ("boolean", "string", "array", "object"):
        if isinstance(value, TYPES[name]):
            return name
    return "null" if value is None else "a number"


def schema_answer(name, schema, problem):
    """The answer to a call whose arguments do not fit the schema: what is wrong and the tool's fields."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    fields = []
    for field, spec in (properties or {}).items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        kind = "/".join(kind) if isinstance(kind, list) else kind
        fields.append(f"{field} ({kind or 'any'}{', required' if field in required else ''})")
    listed = f" Its fields: {', '.join(fields)}." if fields else ""
    return f"Invalid arguments for {name}: {problem}.{listed} Call {name} again with corrected arguments."


NO_CALL = "Your answer had no tool call, and text alone reaches no one"  # how every contract reminder opens


def contract_reminder(names):
    """What a model that answered with text and no tool call is told once in the same activation: text
    reaches no one; the reporting tools it has, by their names. None when it has none of them."""
    have = set(names)
    if not have & set(REPORTING_TOOLS):
        return None
    lines = [f"{NO_CALL}: this activation would end without effect."]
    if "completion_submit" in have:
        lines.append("If you lead the work and it is done, call completion_submit with the final report.")
    if "messages_send" in have:
        lines.append("To report results or a blocker, or to hand out work, call messages_send.")
    if "coordination_wait_for_signal" in have:
        lines.append("Once you have reported, end with coordination_wait_for_signal.")
    return " ".join(lines) + " Call a tool now."


# -- what goes back to the model

NO_RESULT_TEXT = "No result: the activation ended before this call reported back."


def tool_message(result, note=None):
    """What the model reads back from a tool: its output as plain text (a person's edit of the input first).
    Measured with a 1.5B model: given the result as a JSON object it answered "Please continue." instead of
    calling its next tool; given the plain text it went on."""
    output = result.get("output")
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False) if output is not None else ""
    text = text if text.strip() else str(result.get("title") or "Done.")
    return f"{note}\n\n{text}" if note else text


def _part(row, kind):
    parts = [p for p in row.get("parts") or [] if isinstance(p, dict) and p.get("type") == kind]
    return parts[0] if len(parts) == 1 else None


def native_call(row):
    """A tool_call history row as (a Chat Completions tool call, the recorded call id), or None when its part
    does not say enough. The call keeps the id the model gave it when there is one, so a later activation's
    history reads as the activation did."""
    part = _part(row, "tool_call")
    if part is None or not isinstance(part.get("toolCallId"), str) or not isinstance(part.get("toolName"), str):
        return None
    arguments = part.get("inputJson")
    named = (part.get("metadata") or {}).get("modelCallId")
    call = {"id": named if isinstance(named, str) and named else part["toolCallId"], "type": "function",
            "function": {"name": safe_tool_name(part["toolName"]),
                         "arguments": arguments if isinstance(arguments, str) else "{}"}}
    return call, part["toolCallId"]


def recorded_results(rows):
    """The tool_result rows of a history by recorded call id: {id: (row, part)}."""
    results = {}
    for row in rows:
        part = _part(row, "tool_result") if row.get("role") == "tool_result" else None
        if part is not None and isinstance(part.get("toolCallId"), str):
            results.setdefault(part["toolCallId"], (row, part))
    return results


def result_text(part):
    """A recorded result as the model reads it: the output, or the error."""
    text = part.get("output") if part.get("error") is None else f"Error: {part.get('error')}"
    return str(text or "Done.")
