"""suzumio_telemetry against a real OTLP/HTTP receiver: a small HTTP server in the test that accepts
`POST /v1/traces` and decodes the protobuf payload with the official opentelemetry-proto messages.
The tracer directly (model-call, tool-call and activation spans), the endpoint rules, and `suzumio serve`
with OTEL_EXPORTER_OTLP_ENDPOINT running a scripted activation on the local backend."""
import contextlib
import http.server
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import requests
from api_fixtures import init_project, running_activation, serving
from conftest import free_port, wait_until
from fake_model import FakeModel
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

import suzumio_resources
import suzumio_telemetry
from suzumio_model_proxy import ModelProxy
from suzumio_telemetry import Tracer, endpoint_from, span_id_of, trace_id_of

REPO = Path(__file__).resolve().parent.parent


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(item) for item in any_value.array_value.values]
    return getattr(any_value, kind)


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1:0; `spans` holds (resource attributes, span) pairs."""

    def __init__(self):
        self.spans, self.requests = [], []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.lock:
                    receiver.requests.append((self.path, self.headers))
                    for resource_spans in request.resource_spans:
                        resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
                        for scope_spans in resource_spans.scope_spans:
                            for span in scope_spans.spans:
                                receiver.spans.append((resource, scope_spans.scope, span))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)

    def named(self, name):
        with self.lock:
            return [span for _, _, span in self.spans if span.name == name]


@pytest.fixture
def receiver():
    receiver = Receiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


def attributes(span):
    return {kv.key: value_of(kv.value) for kv in span.attributes}


def test_model_call_span_follows_the_genai_conventions(receiver):
    tracer = Tracer(endpoint_from(receiver.url, {}), headers={"x-team": "ops"}).start()
    tracer.model_call(project="demo", agent_id="pm", activation_id="act_1_aaaaaaaa", provider="openai-compatible",
                      model="gpt-x", response_model="gpt-x-2025", start="2026-01-01T00:00:00.000Z",
                      end="2026-01-01T00:00:01.500Z", input_tokens=120, output_tokens=30, total_tokens=150,
                      cache_read_tokens=100, finish_reasons="stop")
    tracer.model_call(project="demo", agent_id="pm", activation_id="act_1_aaaaaaaa", provider="scripted",
                      model="m", start=10, end=20, error="HTTP 429: rate limited")
    tracer.close()
    for path, headers in receiver.requests:
        assert path == "/v1/traces" and headers["Content-Type"] == "application/x-protobuf"
        assert headers["x-team"] == "ops"
    resource, scope, span = receiver.spans[0]
    assert resource == {"service.name": "suzumio", "service.version": suzumio_resources.VERSION}
    assert (scope.name, scope.version) == ("suzumio", suzumio_resources.VERSION)
    assert span.name == "chat gpt-x" and span.kind == span.SPAN_KIND_CLIENT
    assert span.trace_id == trace_id_of("act_1_aaaaaaaa") and span.parent_span_id == span_id_of("act_1_aaaaaaaa")
    assert span.end_time_unix_nano - span.start_time_unix_nano == 1_500_000_000
    assert attributes(span) == {
        "suzumio.project": "demo", "suzumio.agent": "pm", "suzumio.activation.id": "act_1_aaaaaaaa",
        "gen_ai.operation.name": "chat", "gen_ai.system": "openai-compatible",
        "gen_ai.provider.name": "openai-compatible", "gen_ai.request.model": "gpt-x",
        "gen_ai.response.model": "gpt-x-2025", "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30, "suzumio.usage.total_tokens": 150,
        "gen_ai.usage.cache_read.input_tokens": 100, "gen_ai.response.finish_reasons": ["stop"]}
    assert span.status.code == span.status.STATUS_CODE_OK
    failed = receiver.spans[1][2]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    assert failed.status.message == "HTTP 429: rate limited"
    assert attributes(failed)["error.type"] == "model_error"


def test_tool_and_activation_spans_share_the_activation_trace(receiver):
    tracer = Tracer(receiver.url + "/v1/traces").start()
    tracer.tool_call({"id": "tool_1_bbbbbbbb", "project": "demo", "activation_id": "act_1_aaaaaaaa",
                      "agent_id": "pm", "tool": "shell.exec", "status": "failed", "error": "exit 2",
                      "created_at": "2026-01-01T00:00:00.000Z", "completed_at": "2026-01-01T00:00:00.250Z"})
    tracer.activation_ended({"id": "act_1_aaaaaaaa", "project": "demo", "agentId": "pm", "status": "completed",
                             "startedAt": "2026-01-01T00:00:00.000Z", "completedAt": "2026-01-01T00:00:02.000Z",
                             "usage": {"tokens": {"input": 5, "output": 6, "total": 11}}})
    tracer.close()
    tool, = receiver.named("execute_tool shell.exec")
    activation, = receiver.named("invoke_agent pm")
    assert tool.trace_id == activation.trace_id == trace_id_of("act_1_aaaaaaaa")
    assert tool.parent_span_id == activation.span_id and activation.parent_span_id == b""
    assert attributes(tool) == {
        "suzumio.project": "demo", "suzumio.agent": "pm", "suzumio.activation.id": "act_1_aaaaaaaa",
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "shell.exec",
        "gen_ai.tool.call.id": "tool_1_bbbbbbbb", "suzumio.tool.status": "failed",
        "suzumio.tool.duration_ms": 250, "error.type": "failed"}
    assert tool.status.code == tool.status.STATUS_CODE_ERROR and tool.status.message == "exit 2"
    assert attributes(activation)["gen_ai.usage.input_tokens"] == 5
    assert attributes(activation)["suzumio.activation.status"] == "completed"


def test_tracing_is_off_unless_an_endpoint_is_given():
    assert endpoint_from(None, {}) is None
    assert endpoint_from(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == "http://c:4318/v1/traces"
    assert endpoint_from(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/x"}) == "http://c:4318/x"
    assert endpoint_from("http://flag:4318/", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}) == \
        "http://flag:4318/v1/traces"
    assert endpoint_from(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "true"}) is None
    disabled = suzumio_telemetry.DISABLED
    disabled.model_call(project="p", agent_id="a", activation_id="act", provider="x", model="m", start=1, end=2)
    assert not disabled.enabled and disabled.flush() == 0
    assert suzumio_telemetry.headers_from({"OTEL_EXPORTER_OTLP_HEADERS": "a=1, b=x%20y,bad"}) == {"a": "1", "b": "x y"}


def test_an_unreachable_collector_never_fails_the_caller():
    with socket_port() as port:
        tracer = Tracer(f"http://127.0.0.1:{port}/v1/traces", timeout=1)
    tracer.model_call(project="p", agent_id="a", activation_id="act", provider="x", model="m", start=1, end=2)
    assert tracer.flush() == 1  # posted, refused, logged, dropped


@contextlib.contextmanager
def socket_port():
    yield free_port()


PROJECT = """\
name: traced
task: Trace one activation.
backend:
  kind: local
  controllerUrl: http://127.0.0.1:{port}
  runner:
    model: offline
    models:
      providers:
        replay:
          type: scripted
          script:
            agents:
              pm:
                - steps:
                    - tools:
                        - name: completion.submit
                          input: {{report: "Traced."}}
      presets:
        offline: {{provider: replay, model: team}}
tools:
  toolpacks: [core]
agents:
  pm:
    tools: [completion.submit]
"""


def test_serve_exports_one_trace_per_activation_from_the_environment(tmp_path, receiver):
    port, root = free_port(), tmp_path / "root"
    project = tmp_path / "traced.yaml"
    project.write_text(textwrap.dedent(PROJECT.format(port=port)))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    suzumio = [sys.executable, str(REPO / "suzumio.py")]
    subprocess.run([*suzumio, "init", str(project), "--root", str(root)], check=True, env=env, timeout=60,
                   capture_output=True)
    with subprocess.Popen([*suzumio, "serve", "--root", str(root), "--port", str(port)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as serve:
        try:
            assert serve.stdout.readline() == f"suzumio listening on http://127.0.0.1:{port}\n"
            url = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {(root / 'api-token').read_text().strip()}"}
            assert requests.post(f"{url}/api/projects/traced/start", headers=auth, timeout=10).status_code == 200
            sent = requests.post(f"{url}/api/projects/traced/messages", headers=auth,
                                 json={"recipient": "pm", "body": "Go.", "priority": "P3"}, timeout=10)
            assert sent.status_code == 200
            activation = wait_until(lambda: receiver.named("invoke_agent pm"), timeout=60,
                                    message="the activation span")[0]
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=60)
    activations = [a for a in requests_json_after(root) if a["agentId"] == "pm"]
    assert activation.trace_id == trace_id_of(activations[0]["id"])
    tool, = receiver.named("execute_tool completion.submit")
    assert tool.trace_id == activation.trace_id and tool.parent_span_id == activation.span_id
    assert attributes(tool)["suzumio.tool.status"] == "completed"
    assert {attributes(s)["suzumio.project"] for s in (tool, activation)} == {"traced"}
    assert attributes(activation)["suzumio.agent"] == "pm"


def requests_json_after(root):
    import suzumio_store

    store_root = suzumio_store.Root(root)
    try:
        return store_root.open_project("traced").list_activations(10)
    finally:
        store_root.close()


def test_serve_otlp_endpoint_flag_wins_over_the_environment(tmp_path, receiver):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    with subprocess.Popen([sys.executable, str(REPO / "suzumio.py"), "serve", "--root", str(tmp_path / "root"),
                           "--port", "0", "--otlp-endpoint", receiver.url], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as serve:
        try:
            assert serve.stdout.readline().startswith("suzumio listening on http://127.0.0.1:")
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=60)
        assert f"suzumio exporting traces to {receiver.url}/v1/traces\n" in serve.stderr.read()


MODEL_PROJECT = """\
name: demo
task: T
agents:
  pm: {{tools: [messages.send]}}
backend:
  kind: local
  runner:
    model: main
    models:
      providers:
        gw: {{type: openai-compatible, baseURL: "{model_url}", apiKeyEnv: KEY_VAR}}
      presets:
        main: {{provider: gw, model: fake-model}}
"""


def test_a_forwarded_model_call_is_a_genai_span_of_its_activation(tmp_path, receiver):
    model = FakeModel()
    tracer = Tracer(endpoint_from(receiver.url, {})).start()
    try:
        with serving(tmp_path / "root", model_proxy=ModelProxy({"KEY_VAR": "sk-telemetry"}),
                     tracer=tracer) as service:
            store = init_project(service.root, tmp_path / "demo", MODEL_PROJECT.format(model_url=model.base_url))
            store.start()
            act = running_activation(store, "pm")
            model.enqueue(content="Hello", usage=(40, 2, 42))
            answer = service.post("/runner/model", {
                "project": "demo", "agentId": "pm", "activationId": act["id"], "token": service.token("demo", "pm"),
                "providerId": "gw", "presetId": "main", "body": {"messages": [{"role": "user", "content": "Hi"}]}})
            assert answer.status_code == 200, answer.text
            span = wait_until(lambda: receiver.named("chat fake-model"), timeout=10, message="the model span")[0]
    finally:
        tracer.close()
        model.close()
    assert span.trace_id == trace_id_of(act["id"]) and span.parent_span_id == span_id_of(act["id"])
    fields = attributes(span)
    assert fields["gen_ai.request.model"] == "fake-model" and fields["gen_ai.system"] == "openai-compatible"
    assert (fields["gen_ai.usage.input_tokens"], fields["gen_ai.usage.output_tokens"]) == (40, 2)
    assert fields["gen_ai.response.finish_reasons"] == ["stop"]
    assert fields["suzumio.activation.id"] == act["id"] and fields["suzumio.agent"] == "pm"
