"""Isolation: each runner route authenticates exactly its caller (docs/http-api.md), the runner's file
tools never reach outside their roots (docs/design/runner.md: `..`, absolute paths, symlinks, hard
links, /proc magic links, FIFOs), toolpack modules load only from inside their folder (docs/design/tools.md),
and the request guards of docs/http-api.md cover every route they should — routes read from the app."""
import json
import os
from pathlib import Path

import pytest
from fuzz_fixtures import CONTEXT, app_routes, fill, is_runner_rule, placeholders, world
from store_fixtures import config_of

import suzumio_api
import suzumio_coordination as coordination
import suzumio_registry
import suzumio_runner_tools as runner
from suzumio_errors import ConfigError
from suzumio_runner_tools import ToolError

pytestmark = pytest.mark.timeout(120)

RUNNING_REQUIRED = {
    "/runner/tool-calls/start": "no more tool calls are accepted",
    "/runner/tool-calls/refused": "no more tool calls are accepted",
    "/runner/signals": "no more tool calls are accepted",
    "/toolpacks/<toolpack_id>/support": "no more tool calls are accepted",
    "/runner/history/messages": "history updates are not accepted",
    "/runner/history/compact": "history updates are not accepted",
    "/runner/model": "no more model calls are accepted",
    "/runner/files/list": "its files are no longer exchanged",
    "/runner/files/read": "its files are no longer exchanged",
    "/runner/files/changeset": "its files are no longer exchanged",
    "/runner/files/workspace-changeset": "its files are no longer exchanged",
}
ROUTE_FIELDS = {
    "/runner/tool-calls/start": {"tool": "shell.exec", "input": {"command": "ls"}},
    "/runner/tool-calls/refused": {"tool": "nope", "error": "Unknown tool: nope", "input": {}},
    "/runner/tool-calls/finish": {"toolCallId": "tool_x", "status": "completed", "output": "x"},
    "/runner/signals": {"kind": "review.ready", "targetAgent": "pm"},
    "/toolpacks/<toolpack_id>/support": {"tool": "messages.send", "input": {"recipient": "pm", "body": "x"}},
    "/runner/history/messages": {"role": "assistant", "kind": "assistant_output", "content": "hi"},
    "/runner/history/compact": {"summary": "s"},
    "/runner/model": {"providerId": "replay", "presetId": "offline", "body": {"messages": []}},
    "/runner/approvals/wait": {"approvalId": "apr_x", "waitMs": 0},
    "/runner/files/list": {},
    "/runner/files/read": {"path": "/artifacts/pm/x.md"},
    "/runner/files/changeset": {"changes": [{"path": "a.md", "data": "eA=="}]},
    "/runner/files/workspace-changeset": {"changes": [{"path": "a.md", "data": "eA=="}]},
    "/activation-context": {"context": CONTEXT},
    "/activation-output": {"output": {"text": "done"}},
}


@pytest.fixture(scope="module")
def iso(tmp_path_factory):
    with world(tmp_path_factory.mktemp("iso"), webui_dir=suzumio_api.WEBUI_DIR) as w:
        yield w


@pytest.fixture(scope="module")
def routes(iso):
    return app_routes(iso.service)


def runner_paths(routes):
    paths = sorted(rule for _m, rule in routes if is_runner_rule(rule))
    assert paths == sorted(ROUTE_FIELDS), "a new runner route needs its fields in ROUTE_FIELDS"
    return paths


def post(iso, rule, body, headers=None, host=None):
    target = fill(rule, {"toolpack_id": "core"})
    return iso.request("POST", target, json.dumps(body).encode(), headers, host)


def expect(reply, status, message):
    assert (reply.status, reply.json()) == (status, {"error": message}), reply.text


# ---------------------------------------------------------------- runner routes

def test_every_runner_route_refuses_a_wrong_token_and_another_agents_token(iso, routes):
    identity = iso.identity("worker")
    before = iso.snapshot()
    for rule in runner_paths(routes):
        for token in ("wrong-token", iso.tokens[("side", "pm")], iso.tokens[("demo", "worker")], "",
                      identity["token"][:-1], identity["token"] + "x"):
            reply = post(iso, rule, {**identity, **ROUTE_FIELDS[rule], "token": token})
            if token == "":
                expect(reply, 400, "token is required")
            else:
                expect(reply, 403, "Invalid agent token")
    assert iso.snapshot() == before


def test_every_runner_route_refuses_another_agents_activation(iso, routes):
    worker = iso.identity("worker")
    pm_activation = iso.activation("pm")
    before = iso.snapshot()
    for rule in runner_paths(routes):
        reply = post(iso, rule, {**worker, **ROUTE_FIELDS[rule], "activationId": pm_activation})
        expect(reply, 403, f"Activation {pm_activation} does not belong to worker")
        # An activation id of another project is unknown here, whoever owns it there.
        reply = post(iso, rule, {**worker, **ROUTE_FIELDS[rule], "activationId": iso.demo_activation})
        expect(reply, 404, f"Unknown activation: {iso.demo_activation}")
        # Another project's token for the same agent id authorizes nothing.
        reply = post(iso, rule, {**worker, **ROUTE_FIELDS[rule], "project": "demo",
                                 "token": iso.tokens[("side", "worker")]})
        expect(reply, 403, "Invalid agent token")
    assert iso.snapshot() == before


@pytest.mark.parametrize("ending", ["completed", "failed", "cancelled"])
def test_a_finished_activation_is_refused_where_a_running_one_is_required(iso, routes, ending):
    activation = iso.activation("worker")
    if ending == "completed":
        coordination.complete_activation(iso.side, config_of(iso.side), activation, "worker", "done")
    elif ending == "failed":
        coordination.fail_activation(iso.side, activation, "boom")
    else:
        coordination.cancel_activation(iso.side, activation, "Project stopped")
    identity = {**iso.identity("worker"), "activationId": activation}
    before = iso.snapshot()
    for rule in runner_paths(routes):
        if rule not in RUNNING_REQUIRED:
            continue
        reply = post(iso, rule, {**identity, **ROUTE_FIELDS[rule]})
        expect(reply, 409, f"Activation {activation} is {ending}; {RUNNING_REQUIRED[rule]}")
    assert iso.snapshot() == before
    reply = post(iso, "/activation-output", {**identity, **ROUTE_FIELDS["/activation-output"]})
    assert (reply.status, reply.json()) == (200, {"status": ending, "activationId": activation})
    assert iso.side.activation(activation)["status"] == ending


def test_runner_routes_skip_the_user_guards_and_never_take_the_api_token(tmp_path):
    with world(tmp_path, api_token="s3cret") as iso:
        identity = iso.identity("worker")
        foreign = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site",
                   "Authorization": "Bearer s3cret"}
        reply = post(iso, "/runner/signals", {**identity, "kind": "x.note"}, foreign, host="host.docker.internal:1")
        assert (reply.status, reply.json()) == (200, {"status": "recorded"})
        reply = post(iso, "/runner/signals", {**identity, "kind": "x.note", "token": "s3cret"}, foreign)
        expect(reply, 403, "Invalid agent token")


def test_no_route_is_served_on_both_listeners_and_each_refuses_the_others(iso, routes):
    """Runner routes live only on the runner listener, user routes only on the user listener."""
    user_rules = {(route.method, route.rule) for route in iso.service.server.app.routes}
    runner_rules = {(route.method, route.rule) for route in iso.service.runner_server.app.routes}
    assert user_rules and runner_rules and not user_rules & runner_rules
    assert all(is_runner_rule(rule) for _m, rule in runner_rules)
    assert not any(is_runner_rule(rule) for _m, rule in user_rules)
    identity = iso.identity("worker")
    before = iso.snapshot()
    for rule in runner_paths(routes):
        reply = iso.request("POST", fill(rule, {"toolpack_id": "core"}),
                            json.dumps({**identity, **ROUTE_FIELDS[rule]}).encode(), listener="user")
        expect(reply, 404, "not found")
    for method, target in user_requests(routes):
        reply = iso.request(method, target, b"{}" if method == "POST" else None,
                            {"Authorization": f"Bearer {iso.service.api_token}"}, listener="runner")
        expect(reply, 404, "not found")
    assert iso.snapshot() == before


# ---------------------------------------------------------------- user guards

def user_requests(routes):
    """(method, target) of every non-runner route, filled with values that exist."""
    values = {"project": "demo", "agent": "pm", "message": "msg_x", "activation": "act_x", "compaction": "cmp_x",
              "toolpack_id": "core", "entry_id": "project.stats", "asset": "missing.js", "approval": "apr_x",
              "other": "demo", "eval_id": "eval_x", "effect": "eff_x", "path": "pm/x.md"}
    return [(method, fill(rule, {name: values[name] for name in placeholders(rule)}))
            for method, rule in routes if not is_runner_rule(rule)]


def test_api_token_guards_every_api_route_and_nothing_else(tmp_path):
    with world(tmp_path, api_token="s3cret", webui_dir=suzumio_api.WEBUI_DIR) as iso:
        routes = app_routes(iso.service)
        api = [(m, t) for m, t in user_requests(routes) if t.startswith("/api/")]
        # docs/http-api.md: among them the timeline, /api/version and /api/openapi.json, the approvals
        # list, one approval and its decision, …/costs, an agent's resume and …/concurrency, replay, fork
        # and diff, the evals (list, submit, one, its stream), both inboxes, /api/config/validate, POST
        # /api/projects, the repository and its diff, the effects and a resolution, and the artifacts routes
        assert len(api) == 50
        before = iso.snapshot()
        for method, target in api:
            body = b"{}" if method == "POST" else None
            for headers, message in (({}, "API token required"),
                                     ({"Authorization": "Basic czNjcmV0"}, "API token required"),
                                     ({"Authorization": "Bearer"}, "API token required"),
                                     ({"Authorization": "Bearer nope"}, "Invalid API token"),
                                     ({"Authorization": "Bearer s3cret2"}, "Invalid API token"),
                                     ({"Authorization": "Bearer S3CRET"}, "Invalid API token")):
                expect(iso.request(method, target, body, headers, auth=False), 401, message)
            if not target.endswith("/stream"):
                expect(iso.request(method, target + "?token=s3cret", body, auth=False), 401, "API token required")
        assert iso.snapshot() == before
        allowed = iso.request("GET", "/api/projects", headers={"Authorization": "bearer s3cret"}, auth=False)
        assert allowed.status == 200
        assert iso.request("GET", "/api/projects/demo/stream?token=s3cret", auth=False).status == 200
        for target in ("/health", "/", "/assets/" + first_asset()):
            assert iso.request("GET", target, auth=False).status == 200, target


def first_asset():
    return min(p.name for p in (suzumio_api.WEBUI_DIR / "assets").iterdir())


def test_every_post_route_refuses_foreign_origins_and_hosts_without_side_effects(iso, routes):
    posts = [(m, t) for m, t in user_requests(routes) if m == "POST"]
    # docs/http-api.md, POST /mcp (docs/mcp.md), the approval decision, an agent's resume, replay and fork,
    # /api/config/validate, POST /api/evals, POST /api/projects and an effect's resolution
    assert len(posts) == 15
    before = iso.snapshot()
    for method, target in posts:
        body = json.dumps({"recipient": "pm", "body": "x"}).encode()
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Origin": f"http://127.0.0.1:{iso.port}.evil.example"},
                        {"Origin": f"http://127.0.0.1:{int(iso.port) + 1}"}, {"Sec-Fetch-Site": "cross-site"},
                        {"Sec-Fetch-Site": "Cross-Site", "Origin": f"http://127.0.0.1:{iso.port}"}):
            expect(iso.request(method, target, body, {"Content-Type": "text/plain", **headers}), 403,
                   "Cross-origin request rejected")
        for host, part in (("evil.example", "evil.example"), (f"evil.example:{iso.port}", "evil.example"),
                           ("127.0.0.1.evil.example", "127.0.0.1.evil.example"), ("[::2]:1", "[::2]"),
                           ("localhost.", "localhost."), ("0.0.0.0", "0.0.0.0")):
            expect(iso.request(method, target, body, host=host), 403, f"Host not allowed: {part}")
    assert iso.snapshot() == before


def test_every_non_runner_route_checks_the_host(iso, routes):
    for method, target in user_requests(routes):
        expect(iso.request(method, target, b"{}" if method == "POST" else None, host="evil.example"), 403,
               "Host not allowed: evil.example")
    for target in ("/nope", "/runner", "/runner/nope", "/runner/signals", "/toolpacks/core",
                   "/toolpacks/core/support", "/toolpacks/core/support/x", "/activation-outputs", "/activation-output"):
        expect(iso.request("GET", target, host="evil.example", listener="user"), 403, "Host not allowed: evil.example")
    assert iso.request("GET", "/api/projects", host=f"LOCALHOST:{iso.port}").status == 200
    assert iso.request("GET", "/api/projects", host=f"[::1]:{iso.port}").status == 200


def test_same_origin_posts_and_cross_site_gets_pass(iso):
    same = iso.request("POST", "/api/projects/demo/tool-ui/core/project.stats", b"",
                       {"Origin": f"http://127.0.0.1:{iso.port}", "Sec-Fetch-Site": "same-origin"})
    assert same.status == 200
    assert iso.request("GET", "/api/projects/demo", headers={"Origin": "http://evil.example",
                                                            "Sec-Fetch-Site": "cross-site"}).status == 200


# ---------------------------------------------------------------- file tools (docs/design/runner.md)

@pytest.fixture
def roots(tmp_path):
    base = Path(os.path.realpath(tmp_path))
    paths = {"W": base / "ws", "A": base / "artifacts", "O": base / "outside"}
    for folder in (paths["W"], paths["A"] / "worker", paths["A"] / "pm", paths["O"] / "dir"):
        folder.mkdir(parents=True)
    (paths["O"] / "secret.txt").write_text("secret\n")
    (paths["O"] / "dir" / "inner.txt").write_text("inner\n")
    paths["read"] = [str(paths["W"]), str(paths["A"])]
    paths["write"] = [str(paths["W"]), str(paths["A"] / "worker")]
    return paths


def attempts(roots, path):
    """Every file tool operation on `path`: read, write, patch add/update/delete."""
    w, read, write = str(roots["W"]), roots["read"], roots["write"]
    return [
        lambda: runner.file_read({"path": path}, w, read),
        lambda: runner.file_write({"path": path, "content": "pwned"}, w, write),
        lambda: runner.file_patch({"operations": [{"op": "add", "path": path, "content": "pwned"}]}, w, write),
        lambda: runner.file_patch({"operations": [{"op": "update", "path": path, "search": "secret",
                                                   "replace": "pwned"}]}, w, write),
        lambda: runner.file_patch({"operations": [{"op": "delete", "path": path}]}, w, write),
    ]


def refused(call):
    with pytest.raises((ToolError, OSError)) as caught:
        call()
    return str(caught.value)


def outside_untouched(roots):
    assert (roots["O"] / "secret.txt").read_text() == "secret\n"
    assert (roots["O"] / "dir" / "inner.txt").read_text() == "inner\n"
    assert sorted(p.name for p in roots["O"].rglob("*")) == ["dir", "inner.txt", "secret.txt"]


@pytest.mark.parametrize("path", [
    "../outside/secret.txt", "a/../../outside/secret.txt", "./../outside/secret.txt", "..", "../",
    "{O}/secret.txt", "{W}/../outside/secret.txt", "{W}/../../etc/passwd", "/etc/passwd", "/", "/proc/self/environ",
    "/proc/self/root{O}/secret.txt", "/proc/self/cwd/x", "{W}x/secret.txt", "{A}x", "//etc/passwd",
])
def test_file_tools_refuse_lexical_escapes(roots, path):
    path = path.format(O=roots["O"], W=roots["W"], A=roots["A"])
    for call in attempts(roots, path):
        assert refused(call).startswith(("Read path must be under", "Write path must be under")), path
    outside_untouched(roots)


def test_file_tools_refuse_symlinks_to_files_dirs_and_chains_leading_outside(roots):
    w = roots["W"]
    (w / "file-link").symlink_to(roots["O"] / "secret.txt")
    (w / "dir-link").symlink_to(roots["O"] / "dir")
    (w / "hop1").symlink_to(w / "hop2")
    (w / "hop2").symlink_to(w / "dir-link")
    (w / "relative").symlink_to("../outside/secret.txt")
    (w / "root-link").symlink_to("/proc/self/root")
    (w / "sub").mkdir()
    (w / "sub" / "up").symlink_to("..")
    (w / "sub" / "upup").symlink_to("../..")
    (w / "dangling").symlink_to(roots["O"] / "new.txt")
    for path in ("file-link", "dir-link/inner.txt", "dir-link", "hop1/inner.txt", "relative",
                 f"root-link{roots['O']}/secret.txt", "sub/up/sub/upup/outside/secret.txt", "dangling",
                 "dir-link/new.txt"):
        for call in attempts(roots, path):
            message = refused(call)
            assert message.startswith(("Read path must be under", "Write path must be under")), (path, message)
    outside_untouched(roots)


def test_proc_magic_links_inside_the_workspace_never_reach_their_target(roots):
    w = roots["W"]
    with open(w / "doomed.txt", "w") as handle:
        os.remove(w / "doomed.txt")
        (w / "fd-link").symlink_to(f"/proc/self/fd/{handle.fileno()}")
        (w / "stdin-link").symlink_to("/proc/self/fd/0")
        (w / "self-link").symlink_to("/proc/self/cwd")
        # The real path of an fd of a deleted file is "<path> (deleted)": no such file, so nothing is read,
        # and a write creates that (inside) name instead of writing into the open, deleted file.
        assert "No such file" in refused(attempts(roots, "fd-link")[0])
        runner.file_write({"path": "fd-link", "content": "pwned"}, str(w), roots["write"])
        assert os.fstat(handle.fileno()).st_size == 0
        assert (w / "doomed.txt (deleted)").read_text() == "pwned"
        for path in ("stdin-link", "self-link/x"):
            for call in attempts(roots, path)[:4]:
                message = refused(call)
                assert "must be under" in message or "No such file" in message, (path, message)


def test_hard_links_are_refused_for_read_write_and_patch(roots):
    os.link(roots["O"] / "secret.txt", roots["W"] / "hard.txt")
    expected = f"Refusing {roots['W'] / 'hard.txt'}: the file has 2 hard links"
    for call in attempts(roots, "hard.txt")[:4]:
        assert refused(call).startswith(expected)
    outside_untouched(roots)
    # Deleting a name never changes the other name's content; the outside file survives.
    runner.file_patch({"operations": [{"op": "delete", "path": "hard.txt"}]}, str(roots["W"]), roots["write"])
    outside_untouched(roots)
    # With one name left, the same file is an ordinary file again.
    (roots["W"] / "own.txt").write_text("mine\n")
    assert runner.file_read({"path": "own.txt"}, str(roots["W"]), roots["read"])["output"] == "1: mine\n2: "


def test_fifos_and_devices_are_refused_without_blocking(roots):
    os.mkfifo(roots["W"] / "pipe")
    calls = attempts(roots, "pipe")
    assert refused(calls[0]) == f"Not a regular file: {roots['W'] / 'pipe'}"
    for call in calls[1:4]:  # opened for writing with no reader, a FIFO fails at once (ENXIO)
        message = refused(call)
        assert message == f"Not a regular file: {roots['W'] / 'pipe'}" or "No such device" in message
    if os.path.exists("/dev/zero"):
        os.symlink("/dev/zero", roots["W"] / "zero")
        assert refused(attempts(roots, "zero")[0]).startswith("Read path must be under")


def test_symlinks_that_stay_inside_the_roots_still_work(roots):
    w = roots["W"]
    (w / "real.txt").write_text("secret here\n")
    (w / "alias").symlink_to(w / "real.txt")
    (w / "mine").symlink_to(roots["A"] / "worker")
    assert runner.file_read({"path": "alias"}, str(w), roots["read"])["output"] == "1: secret here\n2: "
    runner.file_patch({"operations": [{"op": "update", "path": "alias", "search": "secret", "replace": "x"}]},
                      str(w), roots["write"])
    assert (w / "real.txt").read_text() == "x here\n"
    runner.file_write({"path": "mine/out.md", "content": "o"}, str(w), roots["write"])
    assert (roots["A"] / "worker" / "out.md").read_text() == "o"


# ---------------------------------------------------------------- toolpack folders (docs/design/tools.md)

def toolpack(tmp_path, manifest, files=("runner.mjs", "controller.mjs")):
    root = tmp_path / "pack"
    root.mkdir()
    for name in files:
        (root / name).write_text("export default () => ({});\n")
    (root / "suzumio.toolpack.json").write_text(json.dumps(
        {"id": "review-tools", "tools": [{"name": "review.x", "description": "d", "inputSchema": {}}], **manifest}))
    return root


@pytest.mark.parametrize("manifest", [
    {"runner": "../x.mjs"}, {"controller": "../x.mjs"}, {"runner": "/etc/x.mjs"}, {"controller": "a/../../x.mjs"},
    {"runner": "%2e%2e/x.mjs"},
])
def test_manifest_module_paths_outside_the_folder_are_refused(tmp_path, manifest):
    (tmp_path / "x.mjs").write_text("export default () => ({});\n")
    root = toolpack(tmp_path, manifest)
    with pytest.raises(ConfigError) as caught:
        suzumio_registry.load_local_toolpack(str(root))
    message = caught.value.message
    if "%2e" in json.dumps(manifest):
        assert message.startswith("Local toolpack runner module not found: ")
    else:
        assert message.startswith("Module path escapes the toolpack directory: ")


@pytest.mark.parametrize("which", ["runner", "controller"])
def test_symlinked_module_files_and_folders_pointing_outside_are_refused(tmp_path, which):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "evil.mjs").write_text("export default () => ({});\n")
    files = ("controller.mjs",) if which == "runner" else ("runner.mjs",)
    root = toolpack(tmp_path, {}, files)
    (root / f"{which}.mjs").symlink_to(outside / "evil.mjs")
    with pytest.raises(ConfigError) as caught:
        suzumio_registry.load_local_toolpack(str(root))
    assert caught.value.message == f"Module path escapes the toolpack directory: {root / (which + '.mjs')}"
    (root / f"{which}.mjs").unlink()
    (root / "lib").symlink_to(outside)
    (root / "suzumio.toolpack.json").write_text(json.dumps(
        {"id": "review-tools", which: "lib/evil.mjs",
         "tools": [{"name": "review.x", "description": "d", "inputSchema": {}}]}))
    (root / f"{which}.mjs").write_text("export default () => ({});\n")
    with pytest.raises(ConfigError) as caught:
        suzumio_registry.load_local_toolpack(str(root))
    assert caught.value.message == f"Module path escapes the toolpack directory: {root / 'lib' / 'evil.mjs'}"


def test_symlinks_inside_the_toolpack_folder_and_a_linked_folder_itself_are_accepted(tmp_path):
    root = toolpack(tmp_path, {"runner": "lib/runner.mjs"}, ("controller.mjs",))
    (root / "src").mkdir()
    (root / "src" / "runner.mjs").write_text("export default () => ({});\n")
    (root / "lib").symlink_to(root / "src")
    pack = suzumio_registry.load_local_toolpack(str(root))
    assert pack.runner_module == str(root / "lib" / "runner.mjs")
    (tmp_path / "linked").symlink_to(root)
    linked = suzumio_registry.load_local_toolpack(str(tmp_path / "linked"))
    assert linked.controller_module == str(tmp_path / "linked" / "controller.mjs")
