"""Node host tests against the real node binary: the controller role through suzumio_node.NodeHost
(docs/design/tools.md) and the runner role spoken directly (docs/design/runner.md) against a real HTTP
server standing in for the controller's runner routes."""
import http.server
import inspect
import json
import os
import selectors
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_until

import suzumio_node
from suzumio_errors import BadRequest
from suzumio_node import NODE_MISSING, NodeHost, NodeHostError, ToolpackError

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "toolpack_fixtures"
HOST_SCRIPT = REPO / "suzumio_toolpack_host.mjs"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def fixture(name):
    return str(FIXTURES / name)


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it is gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Callbacks(dict):
    """A minimal callback mapping: agents pm and worker, messages kept in a list."""

    def __init__(self):
        super().__init__()
        self.messages = []
        self.signals = []
        self.calls = []
        self.update({
            "store.listAgents": self.list_agents,
            "store.sendMessage": self.send_message,
            "store.db.get": self.db_get,
            "context.recordSignal": self.record_signal,
            "context.hasPendingSignals": lambda: True,
            "context.hasPendingSignalsForAgent": self.has_pending_for_agent,
        })

    def list_agents(self):
        return [{"id": "pm"}, {"id": "worker"}]

    def send_message(self, message):
        if message.get("recipient") not in ("pm", "worker", "user"):
            raise BadRequest(f"Unknown agent: {message.get('recipient')}")
        record = {"id": f"msg_{len(self.messages) + 1}", **message}
        self.messages.append(record)
        return record

    def db_get(self, sql, *params):
        if "where 0" in sql:
            return None
        if params:
            return {"n": sum(1 for message in self.messages if message["id"] == params[0])}
        return {"n": len(self.messages)}

    def record_signal(self, request):
        self.signals.append(request)
        return [{"id": "sig_1", **request}]

    def has_pending_for_agent(self, agent_id, include_delayed=False):
        self.calls.append(("hasPendingSignalsForAgent", agent_id, include_delayed))
        return include_delayed


SUPPORT_CONTEXT = {
    "project": "demo",
    "paths": {"root": "/srv/demo", "db": "/srv/demo/suzumio.sqlite", "artifacts": "/srv/demo/artifacts",
              "agents": "/srv/demo/agents"},
    "agent": {"id": "pm", "project": "demo"},
    "activationId": "act_1_abc",
}


@pytest.fixture
def host():
    node_host = NodeHost()
    yield node_host
    node_host.close()


@pytest.fixture
def callbacks():
    return Callbacks()


def support(host, callbacks, tool, input=None, module="controller_named.mjs", **kwargs):
    return host.support(fixture(module), "rt", tool, {} if input is None else input, SUPPORT_CONTEXT,
                        callbacks, **kwargs)


# --- controller role: dispatch and export variants (docs/design/tools.md) ---------------


def test_support_named_factory_gets_input_and_support_context(host, callbacks):
    result = support(host, callbacks, "t.echo", {"summary": "ok", "n": [1, 2]})
    assert json.loads(result["output"]) == {"summary": "ok", "n": [1, 2]}
    assert result["metadata"] == {
        "project": "demo", "toolpackId": "rt", "agent": "pm", "activationId": "act_1_abc",
        "storeProject": "demo", "paths": SUPPORT_CONTEXT["paths"], "now": None,
    }


def test_support_context_carries_optional_now(host, callbacks):
    context = {**SUPPORT_CONTEXT, "now": "2026-06-03T10:00:00.000Z"}
    result = host.support(fixture("controller_named.mjs"), "rt", "t.echo", {}, context, callbacks)
    assert result["metadata"]["now"] == "2026-06-03T10:00:00.000Z"


def test_support_default_factory_result_is_the_handler_map(host, callbacks):
    result = support(host, callbacks, "d.tool", {"x": 7}, module="controller_default.mjs")
    assert result == {"output": "default pm 7"}


def test_support_method_takes_precedence_over_handler_map(host, callbacks):
    result = support(host, callbacks, "s.tool", {"a": 1}, module="controller_support_method.mjs")
    assert result == {"output": 'support s.tool {"a":1}'}


def test_module_without_factory_fails_with_spec_text(host, callbacks):
    with pytest.raises(ToolpackError) as error:
        support(host, callbacks, "x.tool", module="controller_no_factory.mjs")
    assert str(error.value) == (
        "Controller module of rt exports neither createControllerToolpack nor a default factory")
    assert error.value.status == 500


def test_unhandled_tool_returns_not_handled_result(host, callbacks):
    result = support(host, callbacks, "review.summarize", module="controller_empty_tools.mjs")
    assert result == {
        "title": "toolpack support",
        "output": "Controller side of rt did not handle review.summarize.",
        "metadata": {"toolpack": "rt", "tool": "review.summarize"},
    }


def test_handler_error_message_is_the_invocation_error(host, callbacks):
    with pytest.raises(ToolpackError) as error:
        support(host, callbacks, "t.throw")
    assert str(error.value) == "no summary"
    assert not isinstance(error.value, NodeHostError)
    with pytest.raises(ToolpackError, match=r"^plain string$"):
        support(host, callbacks, "t.throwString")


def test_undefined_result_is_null_and_unserializable_result_is_an_error(host, callbacks):
    assert support(host, callbacks, "t.undefined") is None
    with pytest.raises(ToolpackError, match="BigInt"):
        support(host, callbacks, "t.bigint")
    assert support(host, callbacks, "t.echo", {"still": "works"})["output"] == '{"still":"works"}'


def test_import_failure_is_reported(host, callbacks, tmp_path):
    broken = tmp_path / "broken.mjs"
    broken.write_text("export const = ;\n")
    with pytest.raises(ToolpackError):
        host.support(str(broken), "rt", "x", {}, SUPPORT_CONTEXT, callbacks)
    with pytest.raises(ToolpackError, match=r"Cannot find module|ERR_MODULE_NOT_FOUND|not find"):
        host.support(str(tmp_path / "missing.mjs"), "rt", "x", {}, SUPPORT_CONTEXT, callbacks)


def test_webui_factory_handlers_get_webui_context(host, callbacks):
    result = host.webui(fixture("controller_named.mjs"), "rt", "w.panel", {"q": 1},
                        {"project": "demo", "paths": {}}, callbacks)
    assert result == {"output": 'panel {"q":1}',
                      "metadata": {"project": "demo", "toolpackId": "rt", "hasAgent": False}}


def test_webui_export_map_and_export_function(host, callbacks):
    context = {"project": "demo", "paths": {}}
    assert host.webui(fixture("webui_export_map.mjs"), "rt", "m.entry", {"n": 3}, context,
                      callbacks) == {"output": "map 3"}
    assert host.webui(fixture("webui_export_function.mjs"), "rt", "any.entry", {"n": 4}, context,
                      callbacks) == {"output": 'function any.entry {"n":4}'}


def test_webui_unhandled_entry_returns_not_handled_result(host, callbacks):
    result = host.webui(fixture("controller_named.mjs"), "rt", "w.nope", {}, {"project": "demo"}, callbacks)
    assert result == {
        "title": "toolpack webui",
        "output": "WebUI side of rt did not handle w.nope.",
        "metadata": {"toolpack": "rt", "entryId": "w.nope"},
    }


def test_scheduler_tick_named_export_sees_now_and_agents(host, callbacks):
    context = {"project": "demo", "paths": {}, "now": "2026-06-03T10:00:00.000Z",
               "agents": [{"id": "pm", "activeActivationId": None}, {"id": "worker", "activeActivationId": "act_9"}]}
    value = host.scheduler_tick(fixture("hook_named.mjs"), "hooks", context, callbacks)
    assert value == [{"kind": "x.ping", "targetAgent": "pm", "payload": {
        "now": "2026-06-03T10:00:00.000Z", "agents": [["pm", None], ["worker", "act_9"]],
        "project": "demo", "toolpackId": "hooks"}}]


def test_scheduler_tick_factory_variants_and_missing_hook(host, callbacks):
    context = {"project": "demo", "paths": {}, "now": "2026-06-03T10:00:00.000Z", "agents": []}
    assert host.scheduler_tick(fixture("hook_factory_function.mjs"), "f", context, callbacks) == {
        "signals": [{"kind": "factory.function", "payload": {"now": "2026-06-03T10:00:00.000Z"}}]}
    assert host.scheduler_tick(fixture("hook_factory_tick.mjs"), "ft", context, callbacks) == [
        {"kind": "factory.tick.ft"}]
    assert host.scheduler_tick(fixture("controller_named.mjs"), "rt", context, callbacks) is None


def test_helper_timeouts_follow_the_spec():
    def default(function, name):
        return inspect.signature(function).parameters[name].default
    assert default(NodeHost.support, "timeout_ms") == 60000
    assert default(NodeHost.webui, "timeout_ms") == 60000
    assert default(NodeHost.scheduler_tick, "timeout_ms") == 10000


# --- controller role: synchronous callbacks (docs/design/tools.md) --------------------------------


def test_callbacks_return_values_synchronously(host, callbacks):
    result = support(host, callbacks, "t.send")
    assert result == {"output": "msg_1 1"}
    assert callbacks.messages == [{"id": "msg_1", "sender": "scheduler", "recipient": "pm", "body": "hi"}]


def test_hook_sees_the_message_it_sent_without_deadlock(host, callbacks):
    started = time.monotonic()
    value = host.scheduler_tick(fixture("hook_send.mjs"), "hooks",
                                {"project": "demo", "now": "2026-06-03T10:00:00.000Z", "agents": []},
                                callbacks)
    assert value == {"signals": [{"kind": "x.count", "targetAgent": "pm", "payload": {"n": 1}}]}
    assert time.monotonic() - started < 5


def test_thousand_callbacks_in_one_invocation(host, callbacks):
    assert support(host, callbacks, "t.many") == {"output": "2000"}


def test_failed_callback_is_thrown_into_module_as_error(host, callbacks):
    assert support(host, callbacks, "t.callbackError") == {"output": "true Unknown agent: ghost"}


def test_callback_missing_from_mapping_is_unsupported_store_method(host, callbacks):
    with pytest.raises(ToolpackError, match=r"^Unsupported store method: store.projectStats$"):
        support(host, callbacks, "t.unsupported")


def test_callback_exceptions_and_non_json_values_become_errors(host, callbacks):
    callbacks["store.projectStats"] = lambda: 1 / 0
    with pytest.raises(ToolpackError, match=r"^division by zero$"):
        support(host, callbacks, "t.unsupported")
    callbacks["store.projectStats"] = lambda: {"value": object()}
    with pytest.raises(ToolpackError, match=r"^Callback store.projectStats returned a value that is not JSON"):
        support(host, callbacks, "t.unsupported")
    callbacks["store.projectStats"] = lambda: {"messageCount": 2}
    assert support(host, callbacks, "t.unsupported") == {"messageCount": 2}


def test_db_get_without_row_is_undefined(host, callbacks):
    assert support(host, callbacks, "t.missingRow") == {"output": "undefined"}


def test_context_callbacks_pass_their_arguments(host, callbacks):
    assert support(host, callbacks, "t.pending") == {"output": "true false true"}
    assert callbacks.calls == [("hasPendingSignalsForAgent", "pm", False),
                               ("hasPendingSignalsForAgent", "pm", True)]
    result = support(host, callbacks, "t.recordSignal", {"kind": "review.note"})
    assert json.loads(result["output"]) == [{"id": "sig_1", "kind": "review.note"}]


def test_event_loop_runs_during_an_invocation(host, callbacks):
    assert support(host, callbacks, "t.await") == {"output": "pm,worker"}


# --- controller role: process lifetime (docs/design/tools.md) -----------------------------------------


def test_console_output_goes_to_the_log_and_never_corrupts_the_protocol(host, callbacks, caplog):
    caplog.set_level("INFO", logger="suzumio_node")
    assert support(host, callbacks, "t.noisy") == {"output": "quiet"}
    wait_until(lambda: "stdout write" in caplog.text, 5, message="stderr forwarded")
    for line in ("log line", "info line", "warn line", "error line", "debug line"):
        assert line in caplog.text
    assert support(host, callbacks, "t.count")["output"] == "1"


def test_module_is_cached_and_crashed_host_restarts_fresh(host, callbacks):
    assert support(host, callbacks, "t.count") == {"output": "1"}
    assert support(host, callbacks, "t.count") == {"output": "2"}
    first_pid = host.pid
    with pytest.raises(NodeHostError, match=r"^Toolpack host failed: host exited with code 3"):
        support(host, callbacks, "t.crash")
    assert not process_exists(first_pid)
    assert support(host, callbacks, "t.count") == {"output": "1"}
    assert host.pid != first_pid


def test_garbage_line_on_stdout_fails_invocation_and_restarts(host, callbacks):
    support(host, callbacks, "t.count")
    first_pid = host.pid
    with pytest.raises(NodeHostError) as error:
        support(host, callbacks, "t.garbage")
    assert str(error.value).startswith("Toolpack host failed: ")
    assert "this is not protocol json" in str(error.value)
    assert not process_exists(first_pid)
    assert support(host, callbacks, "t.count") == {"output": "1"}


def test_timeout_kills_host_and_next_invocation_gets_a_fresh_one(host, callbacks):
    support(host, callbacks, "t.count")
    stuck_pid = host.pid
    started = time.monotonic()
    with pytest.raises(NodeHostError, match=r"^Toolpack host failed: timed out after 400 ms$"):
        support(host, callbacks, "t.hang", timeout_ms=400)
    assert 0.35 < time.monotonic() - started < 5
    assert not process_exists(stuck_pid)
    assert support(host, callbacks, "t.count") == {"output": "1"}
    assert host.pid != stuck_pid


def test_hook_timeout_error_text(host, callbacks):
    context = {"project": "demo", "now": "2026-06-03T10:00:00.000Z", "agents": []}
    with pytest.raises(NodeHostError, match=r"^Toolpack host failed: timed out after 300 ms$"):
        host.scheduler_tick(fixture("hook_hang.mjs"), "hooks", context, callbacks, timeout_ms=300)


def test_waiting_caller_runs_after_the_stuck_invocation_times_out(host, callbacks):
    support(host, callbacks, "t.count")
    outcome = {}

    def stuck():
        try:
            support(host, callbacks, "t.hang", timeout_ms=1500)
        except NodeHostError as exc:
            outcome["stuck"] = str(exc)

    thread = threading.Thread(target=stuck, name="stuck-invocation")
    thread.start()
    wait_until(lambda: host._busy, 5, message="stuck invocation in flight")
    started = time.monotonic()
    assert support(host, callbacks, "t.count") == {"output": "1"}
    waited = time.monotonic() - started
    thread.join(10)
    assert outcome["stuck"] == "Toolpack host failed: timed out after 1500 ms"
    assert waited < 1.5 + 3


def test_close_waits_for_the_in_flight_invocation_then_stops(host, callbacks):
    support(host, callbacks, "t.count")
    pid = host.pid
    outcome = {}

    def stuck():
        try:
            support(host, callbacks, "t.hang", timeout_ms=800)
        except NodeHostError as exc:
            outcome["stuck"] = str(exc)

    thread = threading.Thread(target=stuck, name="stuck-invocation")
    thread.start()
    wait_until(lambda: host._busy, 5, message="stuck invocation in flight")
    host.close()
    thread.join(10)
    assert outcome["stuck"] == "Toolpack host failed: timed out after 800 ms"
    assert host.pid is None
    assert not process_exists(pid)


def test_missing_node_is_a_clear_error(callbacks, tmp_path):
    for node in (str(tmp_path / "no-node-here"), "suzumio-no-such-node-binary"):
        missing = NodeHost(node=node)
        with pytest.raises(NodeHostError, match=f"^{NODE_MISSING}$"):
            missing.support(fixture("controller_named.mjs"), "rt", "t.count", {}, SUPPORT_CONTEXT, callbacks)
        missing.close()


def test_missing_host_script_is_a_host_failure(callbacks, tmp_path):
    missing = NodeHost(script_path=tmp_path / "nope.mjs")
    with pytest.raises(NodeHostError, match=r"^Toolpack host failed: host script not found"):
        missing.support(fixture("controller_named.mjs"), "rt", "t.count", {}, SUPPORT_CONTEXT, callbacks)


def test_close_stops_the_process_and_is_idempotent(host, callbacks):
    support(host, callbacks, "t.count")
    pid = host.pid
    host.close()
    host.close()
    assert host.pid is None
    assert not process_exists(pid)
    assert support(host, callbacks, "t.count") == {"output": "1"}


def test_default_script_is_beside_the_module():
    assert suzumio_node.default_script_path() == HOST_SCRIPT
    assert HOST_SCRIPT.is_file()


# --- runner role (docs/design/runner.md) ----------------------------------------------------------


class ControllerStub(http.server.ThreadingHTTPServer):
    """A real HTTP server for the runner routes: records requests, answers from `responses`."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), ControllerStubHandler)
        self.requests = []
        self.responses = {}

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class ControllerStubHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        self.server.requests.append({"path": self.path, "body": body,
                                     "contentType": self.headers.get("Content-Type")})
        status, reply = self.server.responses.get(self.path, (200, json.dumps({"output": "ok"}).encode()))
        self.send_response(status)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format, *args):
        pass


@pytest.fixture
def controller():
    server = ControllerStub()
    thread = threading.Thread(target=server.serve_forever, name="controller-stub", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


class RunnerBridge:
    """The runner side of the Node host's line protocol (suzumio_toolpack_host.mjs), spoken from the test."""

    def __init__(self, env=None):
        self.proc = subprocess.Popen(["node", str(HOST_SCRIPT), "--role", "runner"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.buffer = b""
        self.next_id = 0

    def request(self, message, timeout=10):
        self.next_id += 1
        self.proc.stdin.write((json.dumps({"id": self.next_id, **message}) + "\n").encode())
        self.proc.stdin.flush()
        reply = self.read_line(timeout)
        assert reply["id"] == self.next_id
        return reply

    def read_line(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "runner bridge did not answer"
            if self.selector.select(remaining):
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                assert chunk, f"runner bridge exited: {self.proc.stderr.read().decode()}"
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def init(self, module, controller_url, toolpack_id="rt"):
        context = {"project": "demo", "agentId": "reviewer", "activationId": "act_1_abc",
                   "workspace": "/workspace", "toolpackId": toolpack_id, "controllerUrl": controller_url,
                   "token": "secret-token", "supportPath": f"/toolpacks/{toolpack_id}/support"}
        return self.request({"op": "init", "module": fixture(module), "context": context})

    def call(self, tool, input=None):
        message = {"op": "call", "tool": tool}
        if input is not None:
            message["input"] = input
        return self.request(message)

    def close(self):
        self.proc.stdin.close()
        code = self.proc.wait(5)
        self.stderr_text = self.proc.stderr.read().decode()
        self.selector.close()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


@pytest.fixture
def bridge():
    runner = RunnerBridge()
    yield runner
    if runner.proc.poll() is None:
        runner.close()


IDENTITY = {"project": "demo", "agentId": "reviewer", "activationId": "act_1_abc", "token": "secret-token"}


def test_runner_init_lists_function_handlers_and_builds_the_context(bridge, controller):
    reply = bridge.init("runner_named.mjs", controller.url)
    assert reply["ok"] is True
    assert sorted(reply["tools"]) == ["r.context", "r.invalid", "r.noisy", "r.signal", "r.support",
                                      "r.supportNoInput", "r.throw"]
    result = bridge.call("r.context", {})["result"]
    assert json.loads(result["output"]) == {
        "keys": ["activationId", "agentId", "callSupport", "project", "recordSignal", "toolpackId", "workspace"],
        "project": "demo", "agentId": "reviewer", "activationId": "act_1_abc", "workspace": "/workspace",
        "toolpackId": "rt"}


def test_runner_default_factory_result_is_the_handler_map(bridge, controller):
    assert bridge.init("runner_default.mjs", controller.url) == {"id": 1, "ok": True, "tools": ["d.run"]}
    assert bridge.call("d.run", {"x": 5}) == {"id": 2, "ok": True, "result": {"output": "default rt 5"}}


def test_runner_module_without_factory_fails_init(bridge, controller):
    reply = bridge.init("runner_none.mjs", controller.url)
    assert reply == {"id": 1, "ok": False, "error": "Runner module for rt must export createRunnerToolpack"}


def test_runner_call_support_posts_identity_and_input(bridge, controller):
    bridge.init("runner_named.mjs", controller.url)
    controller.responses["/toolpacks/rt/support"] = (200, b'{"title":"done","output":"summary stored"}')
    assert bridge.call("r.support", {"summary": "s"})["result"] == {"title": "done", "output": "summary stored"}
    assert bridge.call("r.supportNoInput", {})["ok"] is True
    assert controller.requests == [
        {"path": "/toolpacks/rt/support", "body": {**IDENTITY, "tool": "r.support", "input": {"summary": "s"}},
         "contentType": "application/json"},
        {"path": "/toolpacks/rt/support", "body": {**IDENTITY, "tool": "r.support", "input": {}},
         "contentType": "application/json"},
    ]


@pytest.mark.parametrize("status, body, message", [
    (500, b'{"error":"no summary"}', "no summary"),
    (502, b"bad gateway\n", "bad gateway"),
    (503, b"", "Request failed: 503"),
    (400, b'{"detail":"x"}', '{"detail":"x"}'),
])
def test_runner_call_support_rejects_with_the_controller_error_text(bridge, controller, status, body, message):
    bridge.init("runner_named.mjs", controller.url)
    controller.responses["/toolpacks/rt/support"] = (status, body)
    assert bridge.call("r.support", {}) == {"id": 2, "ok": False, "error": message}


def test_runner_record_signal_posts_to_runner_signals(bridge, controller):
    bridge.init("runner_named.mjs", controller.url)
    controller.responses["/runner/signals"] = (200, b'{"signals":[{"id":"sig_1"}]}')
    reply = bridge.call("r.signal", {"kind": "review.note", "status": "pending"})
    assert json.loads(reply["result"]["output"]) == {"signals": [{"id": "sig_1"}]}
    assert controller.requests[-1]["path"] == "/runner/signals"
    assert controller.requests[-1]["body"] == {**IDENTITY, "kind": "review.note", "status": "pending"}
    controller.responses["/runner/signals"] = (
        400, b'{"error":"Targeted signals cannot be closed; omit the target or omit status"}')
    reply = bridge.call("r.signal", {"kind": "review.ready", "targetAgent": "pm", "status": "closed"})
    assert reply["error"] == "Targeted signals cannot be closed; omit the target or omit status"


def test_runner_controller_requests_bypass_proxy_variables(controller):
    env = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
           "ALL_PROXY": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""}
    runner = RunnerBridge(env=env)
    try:
        runner.init("runner_named.mjs", controller.url)
        assert runner.call("r.support", {"a": 1})["result"] == {"output": "ok"}
    finally:
        runner.close()


def test_runner_unreachable_controller_names_the_failure(bridge):
    bridge.init("runner_named.mjs", "http://127.0.0.1:9")
    reply = bridge.call("r.support", {})
    assert reply["ok"] is False
    assert reply["error"].startswith("Suzumio controller request failed: ")


def test_runner_handler_errors_invalid_results_and_unknown_tools(bridge, controller):
    bridge.init("runner_named.mjs", controller.url)
    assert bridge.call("r.throw", {})["error"] == "runner side failed"
    assert bridge.call("r.invalid", {})["error"] == "Runner tool r.invalid returned an invalid result"
    assert bridge.call("r.nope", {})["error"] == "Runner module for rt did not register r.nope"


def test_runner_console_output_never_corrupts_the_protocol(bridge, controller):
    bridge.init("runner_named.mjs", controller.url)
    reply = bridge.call("r.noisy", {})
    assert reply == {"id": 2, "ok": True, "result": {"output": "quiet", "title": "t", "metadata": {"a": 1}}}
    assert bridge.call("r.context", {})["ok"] is True
    assert bridge.close() == 0
    assert "runner log line" in bridge.stderr_text
    assert "runner stdout write" in bridge.stderr_text


def test_runner_exits_when_stdin_closes(bridge, controller):
    bridge.init("runner_default.mjs", controller.url)
    assert bridge.close() == 0


def test_controller_role_tolerates_a_non_blocking_stdin():
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    proc = subprocess.Popen(["node", str(HOST_SCRIPT), "--role", "controller"], stdin=read_end,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    os.close(read_end)
    try:
        output = proc.stdout

        def send(message):
            os.write(write_end, (json.dumps(message) + "\n").encode())

        send({"type": "invoke", "id": 1, "op": "support", "module": fixture("controller_named.mjs"),
              "toolpackId": "rt", "tool": "t.send", "input": {}, "context": SUPPORT_CONTEXT})
        call = json.loads(output.readline())
        assert call == {"type": "call", "id": 1, "callId": 1, "name": "store.sendMessage",
                        "args": [{"sender": "scheduler", "recipient": "pm", "body": "hi"}]}
        send({"type": "reply", "callId": 1, "ok": True, "value": {"id": "msg_7"}})
        call = json.loads(output.readline())
        assert call["name"] == "store.db.get"
        assert call["args"] == ["select count(*) as n from messages where id = ?", "msg_7"]
        send({"type": "reply", "callId": 2, "ok": True, "value": {"n": 1}})
        assert json.loads(output.readline()) == {"type": "result", "id": 1, "ok": True,
                                                 "value": {"output": "msg_7 1"}}
    finally:
        os.close(write_end)
        assert proc.wait(5) == 0
        proc.stdout.close()


def test_runner_module_reaches_the_controller_over_the_runner_socket(bridge, tmp_path):
    """A `unix://<path>` controllerUrl: callSupport and recordSignal speak HTTP over the socket."""
    import suzumio_api
    import suzumio_runner_support
    import suzumio_store

    root = suzumio_store.Root(tmp_path / "root")
    socket_path = tmp_path / "runner.sock"
    server = suzumio_api.Server(suzumio_runner_support.make_runner_app(root, None, None), threads=16,
                                unix_socket=socket_path).start()
    try:
        bridge.init("runner_named.mjs", f"unix://{socket_path}")
        assert bridge.call("r.support", {"summary": "s"}) == {"id": 2, "ok": False, "error": "Unknown project: demo"}
        reply = bridge.call("r.signal", {"kind": "review.note"})
        assert (reply["ok"], reply["error"]) == (False, "Unknown project: demo")
    finally:
        server.close()
        root.close()
