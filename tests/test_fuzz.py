"""Hostile input, bounded: every route of the served app (read from the app, so a new route is fuzzed
without editing this file) gets random JSON, wrong types, raw bytes, oversized bodies, path-like ids and
random query strings; the config loader gets random trees and mutated texts. Oracles: no unexpected
exception, the one error shape with the docs/http-api.md mapping, an intact database, and no row or file
written by a rejected request. SUZUMIO_FUZZ_EXAMPLES raises the example count (make soak)."""
import contextlib
import datetime
import json
import os
import re
import string

import pytest
import yaml
from api_fixtures import project_yaml
from fuzz_fixtures import (
    CONTEXT,
    JSON_TYPE,
    app_routes,
    encode_segment,
    error_problems,
    exception_log,
    fill,
    is_runner_rule,
    placeholders,
    world,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import suzumio_config
from suzumio_errors import ConfigError
from suzumio_http import MAX_BODY_BYTES

pytestmark = pytest.mark.timeout(300)

SOAK_EXAMPLES = int(os.environ.get("SUZUMIO_FUZZ_EXAMPLES") or 0)
TRIED = {}
STATUSES = {}


def fuzz_settings(examples):
    """`examples` per test in `make test` (deterministic); SUZUMIO_FUZZ_EXAMPLES each, randomized, in soak."""
    return settings(max_examples=SOAK_EXAMPLES or examples, derandomize=not SOAK_EXAMPLES, database=None,
                    deadline=datetime.timedelta(seconds=5),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def tried(kind):
    TRIED[kind] = TRIED.get(kind, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def report_inputs(request):
    yield
    line = ("fuzz inputs tried: " + ", ".join(f"{kind} {n}" for kind, n in sorted(TRIED.items()))
            + "; HTTP statuses: " + ", ".join(f"{status}×{n}" for status, n in sorted(STATUSES.items())))
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n" + line)


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    with world(tmp_path_factory.mktemp("fuzz")) as w:
        yield w


@pytest.fixture(scope="module")
def routes(fuzz):
    return app_routes(fuzz.service)


# ---------------------------------------------------------------- strategies

HOSTILE_SEGMENTS = [
    "..", ".", "%2e%2e", "%2E%2E", "%2e", "a%2Fb", "%2F", "%2e%2e%2fdemo", "..%2fdemo", "%00", "demo%00",
    "%5C", "demo%5C..", "%ff", "%fe%ff", "%", "%zz", "%%", "%252e%252e", "~", "$HOME", "%20", "%0a",
    "CON", "a" * 300, "b" * 5000, "%E3%83%87%E3%83%A2", "%F0%9F%92%A9", "%ED%A0%80", "..%00", "%C0%AE%C0%AE",
]
FIELDS = [
    "project", "agentId", "activationId", "token", "tool", "input", "toolCallId", "status", "output", "error",
    "kind", "targetAgent", "targetChannel", "priority", "payload", "usefulEffect", "role", "content", "metadata",
    "summary", "keepTail", "reason", "selectedModel", "context", "sender", "recipient", "channel", "body",
    "limit", "agentA", "agentB", "report", "notBefore", "pm", "notifyPm", "text", "usage",
]
GOOD_VALUES = [
    "pm", "worker", "user", "ghost", "#project", "#nope", "P0", "P1", "P2", "P3", "P9", "completed", "failed",
    "pending", "closed", "open", "running", "assistant", "system", "tool_result", "shell.exec", "messages.send",
    "completion.submit", "coordination.wait_for_signal", "file.read", "nope", "x.note", "review.ready", "demo",
    "side", "../demo", "", "  ", "\u0000", "\ud800", "\U0001f4a9", "tool_x", "act_x", "msg_x",
    {"text": "done"}, {"text": ""}, {"text": "x", "usage": {"inputTokens": "NaN"}}, CONTEXT,
    {**CONTEXT, "version": 2}, {"recipient": "pm", "body": "x"}, {"command": "ls"}, [1], {}, [], True, False,
    0, -1, 1.5, 10 ** 30, float("inf"), float("nan"), None,
]

json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(GOOD_VALUES),
)
json_values = st.recursive(
    json_leaves,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=8)), children,
                                               max_size=4)),
    max_leaves=12,
)


ROUTE_FIELDS = {
    "/runner/tool-calls/start": {"tool": ["shell.exec", "messages.send", "nope", "file.read"],
                                 "input": [{"command": "ls"}, {}, [1]],
                                 "callKey": ["k-1", "k-1", None, "", "x" * 129, "a b", 7]},
    "/runner/tool-calls/refused": {"tool": ["nope", "shell.exec", ""], "error": ["Unknown tool: nope", "", 5],
                                   "input": [{"command": "ls"}, "not json", [1]],
                                   "callKey": ["k-2", None, "", "x" * 129, 7]},
    "/runner/tool-calls/finish": {"toolCallId": ["tool_x"], "status": ["completed", "failed", "done"],
                                  "output": ["x"], "error": ["E"]},
    "/runner/signals": {"kind": ["x.note", "review.ready"], "targetAgent": ["pm", "user", "ghost"],
                        "targetChannel": ["#project", "#nope"], "priority": ["P1", "P3", "P9"],
                        "status": ["pending", "closed", "open"], "payload": [{"a": 1}, [1]],
                        "usefulEffect": [True, "yes"]},
    "/runner/history/messages": {"role": ["assistant", "user", "system"], "kind": ["assistant_output"],
                                 "content": ["hi"], "metadata": [{"a": 1}, [1]]},
    "/runner/history/compact": {"summary": ["s"], "keepTail": [1, "2", "x", -5, 1e300], "reason": ["r"]},
    "/runner/model": {"providerId": ["replay", "ghost"], "presetId": ["offline", "ghost"],
                      "body": [{"messages": []}, [], "x"]},
    "/runner/files/list": {},
    "/runner/files/read": {"path": ["/artifacts/pm/x.md", "/etc/passwd", "relative", "/artifacts/../x", "/mnt"]},
    "/runner/files/changeset": {"changes": [[{"path": "a.md", "data": "eA=="}], [{"path": "../x", "data": "eA=="}],
                                            [{"path": "l", "link": "../../x"}], [{"path": "a.md", "delete": True}],
                                            [], "x", [5]]},
    "/runner/files/workspace-changeset": {"changes": [[{"path": "a.md", "data": "eA=="}],
                                                      [{"path": ".git/config", "data": "eA=="}],
                                                      [{"path": "../x", "data": "eA=="}], [], "x"]},
    "/toolpacks/<toolpack_id>/support": {"tool": ["messages.send", "coordination.wait_for_signal", "shell.exec"],
                                         "input": [{"recipient": "pm", "body": "x"}, {"body": "x"}, [], {}]},
    "/activation-context": {"context": [CONTEXT, {**CONTEXT, "messages": {}}, []]},
    "/activation-output": {"output": [{"text": "done"}, {"text": " "}, {}, "done"]},
    "/api/projects/<project>/replay": {"as": ["demo-again", "demo", "", 5, "../x", "run"],
                                       "tools": ["live", "recorded", "all", 1], "onDiverge": ["stop", "live", "x"],
                                       "config": ["name: x", 5, ":\n  - [", "agents: {}"]},
    "/api/projects/<project>/fork": {"as": ["demo-fork", "demo", "", 5], "at": ["act_x", "", 7],
                                     "config": ["name: x", 5]},
}


@st.composite
def field_objects(draw, identity=None, route_fields=None):
    """An object whose keys are mostly real field names, holding good, wrong-typed or random values."""
    body = {}
    for key, good in (route_fields or {}).items():
        choice = draw(st.integers(0, 9))
        if choice < 7:
            body[key] = draw(st.sampled_from(good))
        elif choice < 9:
            body[key] = draw(json_values)
    if identity is not None:
        for key, value in identity.items():
            choice = draw(st.integers(0, 29))
            if choice < 27:
                body[key] = value
            elif choice < 9:
                body[key] = draw(json_values)
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=8, unique=True)):
        body[key] = draw(json_values)
    return body


def encode_body(draw, value):
    kind = draw(st.integers(0, 14))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:
        text = json.dumps(value)
        cut = draw(st.integers(0, max(0, len(text) - 1)))
        return text[:cut].encode() + draw(st.sampled_from([b"", b"{", b"\xff", b"]", b" \x00"]))
    if kind == 2:
        return draw(st.sampled_from([b"", b"   ", b"null", b"[]", b'"x"', b"1e999", b"NaN", b"-Infinity",
                                     b'{"a":1,"a":2}', b"[" * 5000 + b"]" * 5000, b'{"body":"\\ud800"}']))
    return json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", errors="surrogatepass")


@st.composite
def segments(draw, name, fuzz):
    valid = {
        "project": ["demo"], "agent": ["pm", "worker", "ghost"], "message": [fuzz.demo_message, "msg_x"],
        "activation": [fuzz.demo_activation, "act_x"], "compaction": ["cmp_x"],
        "approval": ["apr_x", "apr_1_deadbeef"], "other": ["demo", "nope", "%2e%2e"],
        "toolpack_id": ["core", "shell", "web", "nope", "core%2F..", "co%72e"],
        "entry_id": ["project.stats", "messages.send", "messages.conversation", "coordination.signals",
                     "completion.report", "file.activity", "shell.activity", "nope"],
        "asset": ["index.js", "%2e%2e/secret", "../../etc/passwd", "a/b/c.css", "%00.js"],
        "path": ["pm/x.md", "x.md", "%2e%2e/secret", "../../etc/passwd", "a/b/c", "%00.md"],
        "eval_id": ["eval_x", "eval_1_deadbeef", "%2e%2e"], "effect": ["eff_x", "%2e%2e"],
    }
    if name not in valid:
        raise AssertionError(f"route placeholder <{name}> has no fuzz values: add it to segments()")
    choice = draw(st.integers(0, 9))
    if choice < 5:
        return draw(st.sampled_from(valid[name]))
    if choice < 8:
        return draw(st.sampled_from(HOSTILE_SEGMENTS))
    return encode_segment(draw(st.text(min_size=1, max_size=60)))


QUERY_KEYS = ["limit", "before", "includeArchived", "token", "x", "", "limit[]"]
QUERY_VALUES = ["0", "-3", "abc", "", "2.9", "9999", "1e999", "nan", "-inf", "0x10", "false", "0", "%ff", "%00"]


@st.composite
def query_strings(draw):
    if draw(st.integers(0, 3)) == 0:
        return ""
    pairs = draw(st.lists(st.tuples(st.sampled_from(QUERY_KEYS),
                                    st.one_of(st.sampled_from(QUERY_VALUES), st.text(max_size=20))), max_size=4))
    query = "&".join(f"{encode_segment(k)}={v if v in QUERY_VALUES else encode_segment(v)}" for k, v in pairs)
    return "?" + query + draw(st.sampled_from(["", "&", "&&=", "&limit", "#frag", "&%zz=1"]))


HEADER_SETS = [{}, {"Content-Type": "application/json"}, {"Content-Type": "text/plain"},
               {"Content-Type": "multipart/form-data; boundary=x"},
               {"Content-Type": "application/x-www-form-urlencoded"},
               {"Last-Event-ID": "evt_nope"}, {"Origin": "http://127.0.0.1"}]


# ---------------------------------------------------------------- the oracle

def exchange(fuzz, method, target, body=None, headers=None):
    """One request with every oracle applied: shape, mapping, integrity, no side effect on a 4xx."""
    before = fuzz.snapshot()
    with exception_log() as crashes:
        reply = fuzz.request(method, target, body, headers)
        unexpected = crashes.drain()
    path = target.split("?", 1)[0]
    STATUSES[reply.status] = STATUSES.get(reply.status, 0) + 1
    problems = error_problems(reply, path)
    if unexpected:
        problems.append(f"unexpected exception logged: {unexpected}")
    if not is_runner_rule(path) and fuzz.leaked_token(reply.text):
        problems.append("an agent token in a user-facing response")
    integrity = fuzz.integrity()
    if set(integrity.values()) != {"ok"}:
        problems.append(f"integrity_check: {integrity}")
    if 400 <= reply.status < 500 and fuzz.snapshot() != before:
        problems.append("a rejected request changed rows or files")
    shown = (body or b"")[:300]
    assert not problems, f"{method} {target[:300]} body={shown!r} → {reply.status} {reply.text[:500]!r}: {problems}"
    return reply


@st.composite
def requests_for(draw, fuzz, route):
    method, rule = route
    values = {name: draw(segments(name, fuzz)) for name in placeholders(rule)}
    target = fill(rule, values) + draw(query_strings())
    identity = None
    if is_runner_rule(rule):
        identity = fuzz.identity(draw(st.sampled_from(["worker", "pm"])))
        swap = draw(st.integers(0, 9))
        if swap == 0:
            identity["activationId"] = fuzz.side_finished
        elif swap == 1:
            identity["token"] = fuzz.tokens[("side", "pm" if identity["agentId"] == "worker" else "worker")]
    body = None
    if method == "POST" or draw(st.integers(0, 4)) == 0:
        objects = field_objects(identity, ROUTE_FIELDS.get(rule))
        value = draw(objects if draw(st.integers(0, 4)) else json_values)
        body = encode_body(draw, value)
    return method, target, body, draw(st.sampled_from(HEADER_SETS))


# ---------------------------------------------------------------- HTTP tests

def test_every_route_is_fuzzed_and_matches_the_spec_table(fuzz, routes):
    rules = {rule for _method, rule in routes}
    # Every route of docs/http-api.md: the projects, messages, events, activations, tools, control actions
    # and runner routes, the Team view's timeline, /runner/model, /api/version and /api/openapi.json, GET
    # and POST /mcp, the approvals list, one approval, its decision and /runner/approvals/wait, …/costs, an
    # agent's resume and …/concurrency, replay, fork and diff, the four /runner/files/* routes and
    # /runner/tool-calls/refused, the evals (list, submit, one, its stream), the inbox (all projects, one),
    # /api/config/validate, POST /api/projects, the team's repository and its diff, the effects and a
    # resolution, the artifacts (list, one, its diff) and the report
    assert len(routes) == 70, routes
    assert {m for m, _r in routes} == {"GET", "POST"}
    runner_rules = {r for r in rules if is_runner_rule(r)}
    assert len(runner_rules) == 15
    for _method, rule in routes:
        for name in placeholders(rule):
            segments(name, fuzz)  # raises for a placeholder the fuzzer cannot fill


def run_route_fuzz(fuzz, routes, data, count_kind):
    route = data.draw(st.sampled_from(routes))
    method, target, body, headers = data.draw(requests_for(fuzz, route))
    tried(count_kind)
    exchange(fuzz, method, target, body, headers)


def test_user_routes_survive_hostile_requests(fuzz, routes):
    user_routes = [r for r in routes if not is_runner_rule(r[1])]

    @fuzz_settings(400)
    @given(data=st.data())
    def check(data):
        run_route_fuzz(fuzz, user_routes, data, "user requests")
    check()


def test_runner_routes_survive_hostile_bodies(fuzz, routes):
    runner_routes = [r for r in routes if is_runner_rule(r[1])]

    @fuzz_settings(400)
    @given(data=st.data())
    def check(data):
        run_route_fuzz(fuzz, runner_routes, data, "runner requests")
    check()


def rule_pattern(rule):
    parts = re.split(r"(<\w+(?::\w+)?>)", rule)
    return re.compile("".join(("(.+)" if ":path>" in part else "[^/]+") if part.startswith("<") else re.escape(part)
                              for part in parts) + "$")


def test_wrong_methods_and_unmatched_paths_are_plain_404s(fuzz, routes):
    matchers = [(m, rule_pattern(r)) for m, r in routes]
    for method, rule in routes:
        path = fill(rule, {name: "x" for name in placeholders(rule)})
        for other, target in ((("POST" if method == "GET" else "GET"), path), ("PUT", path), ("DELETE", path),
                              ("PATCH", path), (method, path + "/"), (method, path + "/extra"), (method, "/" + path)):
            if any(m == other and pattern.match(target) for m, pattern in matchers):
                continue
            tried("wrong methods")
            reply = exchange(fuzz, other, target, b"{}" if other != "GET" else None)
            assert (reply.status, reply.json()) == (404, {"error": "not found"}), (other, target)
            assert "Allow" not in reply.headers


@pytest.mark.parametrize("segment", HOSTILE_SEGMENTS)
def test_path_like_project_ids_never_open_a_path_outside_the_root(fuzz, routes, segment):
    outside = sorted(os.listdir(fuzz.root_path.parent))
    for method, rule in routes:
        if "<project>" not in rule:
            continue
        values = {name: "x" for name in placeholders(rule)}
        values["project"] = segment
        tried("hostile project segments")
        reply = exchange(fuzz, method, fill(rule, values), b"{}" if method == "POST" else None)
        assert reply.status == 404, (rule, segment, reply.text)
        assert reply.json()["error"] == "not found" or reply.json()["error"].startswith("Unknown project: ")
    assert sorted(os.listdir(fuzz.root_path.parent)) == outside


def test_path_like_project_fields_of_runner_routes_are_unknown_projects(fuzz, routes):
    outside = sorted(os.listdir(fuzz.root_path.parent))
    for path in [r for m, r in routes if is_runner_rule(r)]:
        for project in ("..", "../demo", "a/b", "demo\u0000", "\\", "." * 3, "x" * 5000, "side/..", "/"):
            body = {**fuzz.identity(), "project": project, "tool": "shell.exec", "toolCallId": "t", "status": "failed",
                    "kind": "x.note", "role": "user", "content": "c", "summary": "s", "context": CONTEXT,
                    "output": {"text": "done"}, "providerId": "replay", "presetId": "offline", "body": {},
                    "approvalId": "apr_x", "path": "/artifacts/pm/x.md", "error": "E"}
            tried("hostile project fields")
            reply = exchange(fuzz, "POST", fill(path, {"toolpack_id": "core"}), json.dumps(body).encode())
            assert (reply.status, reply.json()) == (404, {"error": f"Unknown project: {project}"}), path
    assert sorted(os.listdir(fuzz.root_path.parent)) == outside


def test_oversized_bodies_are_refused_before_they_are_parsed(fuzz, routes):
    huge = b'{"body": "' + b"x" * MAX_BODY_BYTES + b'"}'
    ignored = {"/api/projects/<project>/start", "/api/projects/<project>/stop", "/api/projects/<project>/approve"}
    for method, rule in routes:
        if method != "POST" or rule in ignored:
            continue
        target = fill(rule, {"project": "demo", "toolpack_id": "core", "entry_id": "messages.send",
                             "approval": "apr_x", "agent": "worker", "effect": "eff_x"})
        tried("oversized bodies")
        reply = exchange(fuzz, "POST", target, huge, {"Content-Type": JSON_TYPE})
        too_large = f"Request body too large (limit {MAX_BODY_BYTES} bytes)"
        assert (reply.status, reply.json()) == (400, {"error": too_large})


def test_deeply_nested_and_unencodable_bodies_are_client_errors(fuzz):
    identity = fuzz.identity()
    cases = [
        ("/api/projects/demo/messages", b"[" * 100000 + b"]" * 100000),
        ("/api/projects/demo/messages", json.dumps({"recipient": "pm", "body": "\ud800"}).encode()),
        ("/api/projects/demo/messages", json.dumps({"recipient": "pm", "body": "x", "sender": "\udfff"}).encode()),
        ("/api/projects/demo/request-changes", json.dumps({"body": "\ud800"}).encode()),
        ("/runner/signals", json.dumps({**identity, "kind": "\ud800"}).encode()),
        ("/runner/history/messages",
         json.dumps({**identity, "role": "user", "kind": "k", "content": "\ud800"}).encode()),
        ("/api/projects/demo/tool-ui/core/messages.send", json.dumps({"body": "\ud800"}).encode()),
    ]
    for path, body in cases:
        tried("hostile bodies")
        reply = exchange(fuzz, "POST", path, body)
        assert reply.status in (400, 500), reply.text


# ---------------------------------------------------------------- the config loader

CONFIG_KEYS = ["name", "task", "agents", "channels", "tools", "toolpacks", "backend", "kind", "runner", "models",
               "providers", "presets", "model", "type", "script", "communication", "scheduler", "extends", "env",
               "prompt", "role", "mounts", "source", "target", "docker", "image", "proxy", "observability",
               "platforms", "nudges", "noEffectNudge", "enabled", "maxSignalsPerActivation", "controllerUrl",
               "activationTimeoutMs", "apiKey", "apiKeyEnv", "baseURL", "headers", "count", "model-list", "path",
               "packaged", "id", "coordinatorAgent", "budget", "maxTokens", "pm", "worker", "replay", "offline"]
config_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 40), max_value=2 ** 40),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.sampled_from(["pm", "worker", "local", "docker-chat", "scripted", "openai-compatible", "core", "shell",
                     "#project", "@import(./nope.yaml)", "${HOME}", "./x", "../..", "/etc/passwd", "*", "x.*",
                     "P0", "P9", "ai", "", "replay", "offline"]),
)
config_trees = st.recursive(
    config_leaves,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.one_of(st.sampled_from(CONFIG_KEYS), st.text(max_size=6)),
                                               children, max_size=5)),
    max_leaves=25,
)


def valid_config_text():
    return project_yaml("fuzzed", "http://127.0.0.1:9")


def load_outcome(path):
    """None on success, else the ConfigError; any other exception fails the test."""
    try:
        suzumio_config.load_project(path, env={"HOME": "/home/x"})
    except ConfigError as exc:
        message = exc.message
        assert message.strip(), "empty ConfigError"
        if "\n" in message:
            lines = message.split("\n")
            assert lines[0].endswith(":") and all(line.startswith("  - ") for line in lines[1:]), message
        assert not (set(message) & set("\x00")), message
        return exc
    return None


def test_config_loader_on_random_trees_raises_only_config_errors(tmp_path):
    @fuzz_settings(300)
    @given(tree=st.one_of(config_trees, st.fixed_dictionaries({"name": config_leaves, "task": config_leaves,
                                                               "agents": config_trees, "backend": config_trees,
                                                               "tools": config_trees})),
           as_json=st.booleans())
    def check(tree, as_json):
        tried("config trees")
        path = tmp_path / ("p.json" if as_json else "p.yaml")
        text = json.dumps(tree) if as_json else yaml.safe_dump(tree, allow_unicode=True)
        path.write_text(text, encoding="utf-8")
        load_outcome(path)
    check()


MUTATION_PIECES = ["", ":", "- ", "  ", "\t", "{", "}", "[", "]", "&a ", "*a", "!!binary ", "!!python/name:os.system ",
                   "? ", "<<: ", "'", '"', "\\", "#", "\x00", "\ud800", "${X}", "@import(./missing.yaml)", "\n",
                   "9" * 5000, "1e999", ".nan", "0x", "~", "null", "---\n", "...\n", "%YAML 1.1\n", "\ufeff"]


def test_config_loader_on_mutated_valid_configs_raises_only_config_errors(tmp_path):
    original = valid_config_text()
    path = tmp_path / "project.yaml"
    path.write_text(original, encoding="utf-8")
    assert load_outcome(path) is None

    @fuzz_settings(400)
    @given(edits=st.lists(st.tuples(st.integers(0, len(original)), st.integers(0, 12),
                                    st.one_of(st.sampled_from(MUTATION_PIECES), st.text(string.printable, max_size=6))),
                          min_size=1, max_size=5))
    def check(edits):
        tried("config mutations")
        text = original
        for position, cut, piece in edits:
            position = min(position, len(text))
            text = text[:position] + piece + text[position + cut:]
        path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
        load_outcome(path)
    check()


@pytest.mark.parametrize("text", [
    "name: x\ntask: " + "[" * 5000 + "]" * 5000 + "\n",
    "name: x\ntask: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "name: x\ntask: t\nbackend: {activationTimeoutMs: " + "9" * 5000 + "}\n",
    "name: x\ntask: t\nagents: {pm: {}}\nbackend: {activationTimeoutMs: 0x" + "f" * 5000 + "}\n",
    "- " * 3000 + "x\n",
], ids=["deep-flow-list", "deep-flow-map", "huge-decimal", "huge-hex", "deep-block-list"])
def test_config_loader_refuses_pathological_yaml_with_a_config_error(tmp_path, text):
    path = tmp_path / "project.yaml"
    path.write_text(text, encoding="utf-8")
    assert isinstance(load_outcome(path), ConfigError)


@pytest.mark.parametrize("text", [
    '{"name": "x", "task": ' + "[" * 100000 + "]" * 100000 + "}",
    '{"name": "x", "task": ' + "9" * 5000 + "}",
], ids=["deep-json", "huge-json-int"])
def test_config_loader_refuses_pathological_json_with_a_config_error(tmp_path, text):
    path = tmp_path / "project.json"
    path.write_text(text, encoding="utf-8")
    assert isinstance(load_outcome(path), ConfigError)


def test_runner_signal_targets_of_the_wrong_type_are_unknown_targets(fuzz):
    identity = fuzz.identity()
    for field, value, message in (("targetAgent", [], "Unknown agent: []"), ("targetAgent", 7, "Unknown agent: 7"),
                                  ("targetChannel", {"a": 1}, 'Unknown channel: {"a": 1}')):
        tried("hostile bodies")
        reply = exchange(fuzz, "POST", "/runner/signals", json.dumps({**identity, "kind": "x", field: value}).encode())
        assert (reply.status, reply.json()) == (400, {"error": message})


def test_schema_report_quotes_keys_with_line_breaks(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "x", "task": "t", "agents": {"a\nb": 5}}), encoding="utf-8")
    error = load_outcome(path)
    assert '  - agents."a\\nb": Expected object, received number' in error.message.split("\n")


def test_unknown_tool_names_with_line_breaks_stay_on_one_line(tmp_path):
    path = tmp_path / "project.yaml"
    path.write_text(valid_config_text().replace("tools: [messages.send,", 'tools: ["m\\nessages.send",', 1))
    error = load_outcome(path)
    assert error.message.startswith('agents.pm.tools.0: unknown tool "m\\nessages.send" (registered: ')


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@fuzz_settings(200)
@given(st.lists(JSON_VALUES, max_size=6))
def test_a_list_joined_from_cached_items_is_the_list_encoded_at_once(values):
    # GET /api/projects joins the cached text of each project's summary.
    from suzumio_http import encode_json, encode_json_item, join_json_items
    tried("cached list items")
    joined = join_json_items([encode_json_item(value) for value in values])
    assert joined == encode_json(values) == (json.dumps(values, indent=2, ensure_ascii=False) + "\n").encode()
