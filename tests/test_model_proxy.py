"""The controller's model proxy (suzumio_model_proxy) and its runner route `POST /runner/model`: the key
and secret headers come from the controller's environment and config, proxies and timeouts are the
controller's, upstream answers reach the runner unchanged, the usual authorization chain applies, the
controller records usage and the budget counts it; and the hole tests: from `shell.exec` inside a real
activation the key is found nowhere, on docker-chat and on local. Real parts throughout: the FakeModel
and RecordingProxy are real HTTP servers, the app runs on Waitress, the runner image on Docker."""
import contextlib
import json
import socket

import pytest
from api_fixtures import init_project, running_activation, serving
from conftest import free_port
from e2e_fixtures import call, running_team
from fake_model import OVERFLOW_MESSAGE, RecordingProxy

import suzumio_config
import suzumio_coordination as coordination
from suzumio_errors import BadGateway, BadRequest, Forbidden, NotFound
from suzumio_model_proxy import ModelProxy

pytestmark = pytest.mark.timeout(300)

KEY = "sk-proxy-key-8c41d2"
HEADER_SECRET = "hdr-secret-66aa19"
BODY = {"model": "whatever-the-runner-says", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


def models_config(base_url, provider=None, presets=None, proxy=None, agents=None):
    """A ProjectConfig whose provider `gw` reads its key from KEY_VAR in the controller environment."""
    gw = {"type": "openai-compatible", "baseURL": base_url, "apiKeyEnv": "KEY_VAR"}
    gw.update(provider or {})
    gw = {key: value for key, value in gw.items() if value is not None}
    data = {
        "name": "demo",
        "task": "Proxy test.",
        "agents": agents or {"pm": {}, "worker": {"model": "list"}},
        "backend": {"runner": {"model": "main", "models": {
            "providers": {"gw": gw, "replay": {"type": "scripted", "script": {"agents": {}}}},
            "presets": presets or {
                "main": {"provider": "gw", "model": "m-main", "apiModel": "remote-main"},
                "other": {"provider": "gw", "model": "m-other"},
                "list": {"modelList": ["main", "other"]},
                "offline": {"provider": "replay", "model": "team"}}}}},
    }
    if proxy is not None:
        data["backend"]["docker"] = {"proxy": proxy}
    return suzumio_config.ProjectConfig.from_data(data)


def closed_port():
    """A port nothing listens on."""
    return free_port()


# ---------------------------------------------------------------- forwarding

def test_forwards_with_the_key_from_the_controller_environment_and_reads_the_usage(model):
    config = models_config(model.base_url)
    model.enqueue(content="Hello", usage=(7, 3, 10))
    answer = ModelProxy({"KEY_VAR": KEY}).forward(config, "pm", "gw", "main", BODY)
    assert answer.status == 200 and json.loads(answer.body)["choices"][0]["message"]["content"] == "Hello"
    assert answer.usage == {"input": 7, "output": 3, "total": 10}
    [request] = model.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    # the preset decides the model; the proxy streams (asking for the usage chunk) and answers whole
    assert (request.body["model"], request.body["stream"]) == ("remote-main", True)
    assert request.body["stream_options"] == {"include_usage": True}
    assert request.body["messages"] == BODY["messages"]


def test_provider_option_and_preset_headers_and_query_parameters_are_added_later_wins(model):
    config = models_config(
        None,
        provider={"baseURL": None, "baseURLEnv": "URL_VAR", "headers": {"X-Provider": "1", "X-Both": "provider"},
                  "options": {"headers": {"X-Option": "o", "X-Both": "option"}, "queryParams": {"api-version": "2"},
                              "maxRetries": 1}},
        presets={"main": {"provider": "gw", "model": "m", "headers": {"X-Preset": "p", "X-Api-Key": HEADER_SECRET}}})
    model.enqueue(content="ok")
    environ = {"KEY_VAR": KEY, "URL_VAR": model.base_url + "/"}
    assert ModelProxy(environ).forward(config, "pm", "gw", "main", BODY).status == 200
    [request] = model.requests
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert (request.headers["x-provider"], request.headers["x-option"], request.headers["x-preset"]) == ("1", "o", "p")
    assert request.headers["x-both"] == "option" and request.headers["x-api-key"] == HEADER_SECRET
    assert request.path == "/v1/chat/completions"
    assert len(model.requests) == 1


def test_an_inline_option_key_wins_and_no_key_sends_no_authorization(model):
    config = models_config(model.base_url, provider={"apiKey": "inline-key", "options": {"apiKey": "option-key"}})
    model.enqueue(content="a")
    ModelProxy({"KEY_VAR": KEY}).forward(config, "pm", "gw", "main", BODY)
    keyless = models_config(model.base_url, provider={"apiKeyEnv": "UNSET_VAR"})
    model.enqueue(content="b")
    ModelProxy({}).forward(keyless, "pm", "gw", "main", BODY)
    assert model.requests[0].headers["authorization"] == "Bearer option-key"
    assert "authorization" not in model.requests[1].headers


def test_rate_limits_and_overflow_answers_reach_the_runner_unchanged(model):
    config = models_config(model.base_url, provider={"options": {"maxRetries": 0}})
    proxy = ModelProxy({"KEY_VAR": KEY})
    model.enqueue_error(429, "slow down", headers={"Retry-After": "3", "Retry-After-Ms": "3000", "X-Other": "x"})
    limited = proxy.forward(config, "pm", "gw", "main", BODY)
    assert limited.status == 429 and json.loads(limited.body)["error"]["message"] == "slow down"
    assert limited.headers == {"retry-after": "3", "retry-after-ms": "3000"}
    assert limited.usage == {}
    model.enqueue_context_overflow()
    overflow = proxy.forward(config, "pm", "gw", "main", BODY)
    assert overflow.status == 400 and OVERFLOW_MESSAGE in overflow.body
    assert json.loads(overflow.body)["error"]["code"] == "context_length_exceeded"
    assert (limited.overflow, overflow.overflow) == (None, "openai")


def test_an_echoed_key_or_secret_header_is_redacted_from_the_answer(model):
    config = models_config(model.base_url, provider={"headers": {"X-Api-Key": HEADER_SECRET, "X-Plain": "plain"}})
    model.enqueue_error(401, f"key {KEY} with {HEADER_SECRET} and plain is invalid")
    answer = ModelProxy({"KEY_VAR": KEY}).forward(config, "pm", "gw", "main", BODY)
    assert answer.status == 401
    assert "key <redacted> with <redacted> and plain is invalid" in answer.body
    assert KEY not in answer.body and HEADER_SECRET not in answer.body


def test_a_base_url_on_host_docker_internal_is_reached_at_loopback_unless_the_name_resolves(model):
    config = models_config(model.base_url.replace("127.0.0.1", "host.docker.internal"))
    looked_up = []

    def unknown(host, port):
        looked_up.append(host)
        raise socket.gaierror("Name or service not known")

    proxy = ModelProxy({}, resolve=unknown)
    for _ in range(2):
        model.enqueue(content="via loopback")
        assert proxy.forward(config, "pm", "gw", "main", BODY).status == 200
    assert looked_up == ["host.docker.internal"], "looked up once per proxy"
    assert len(model.requests) == 2
    resolving = ModelProxy({}, resolve=lambda host, port: [])
    assert resolving.controller_base_url("http://host.docker.internal:8000/v1") == "http://host.docker.internal:8000/v1"
    assert proxy.controller_base_url("http://u:p@host.docker.internal:8000/v1") == "http://u:p@127.0.0.1:8000/v1"
    assert proxy.controller_base_url("https://api.example/v1") == "https://api.example/v1"


def test_placeholder_keys_are_not_redacted_and_ignored_options_are_logged_once(model, caplog):
    config = models_config(model.base_url, provider={"apiKey": "EMPTY", "options": {"bogus": 1}})
    proxy = ModelProxy({})
    with caplog.at_level("WARNING", logger="suzumio_model_proxy"):
        for _ in range(2):
            model.enqueue(content="The list is EMPTY.")
            answer = proxy.forward(config, "pm", "gw", "main", BODY)
            assert "The list is EMPTY." in answer.body
    assert model.requests[0].headers["authorization"] == "Bearer EMPTY"
    assert [r.getMessage() for r in caplog.records] == ["project demo provider gw: option bogus is ignored"]


def test_transport_failures_are_a_clear_502():
    config = models_config(f"http://127.0.0.1:{closed_port()}/v1")
    with pytest.raises(BadGateway) as caught:
        ModelProxy({"KEY_VAR": KEY}).forward(config, "pm", "gw", "main", BODY)
    assert caught.value.status == 502
    assert str(caught.value).startswith("Request to provider gw failed: ")
    assert KEY not in str(caught.value)


def test_the_provider_timeout_is_the_controllers(model):
    config = models_config(model.base_url, provider={"timeoutMs": 300})
    model.enqueue(content="late", delay=3.0)
    with pytest.raises(BadGateway, match="Request to provider gw failed: timed out"):
        ModelProxy({"KEY_VAR": KEY}).forward(config, "pm", "gw", "main", BODY)


def test_the_controllers_proxy_variables_and_the_configured_proxy_are_honoured(model):
    recording = RecordingProxy()
    try:
        config = models_config(model.base_url)
        model.enqueue(content="via env")
        ModelProxy({"KEY_VAR": KEY, "HTTP_PROXY": recording.url}).forward(config, "pm", "gw", "main", BODY)
        model.enqueue(content="bypassed")
        ModelProxy({"HTTP_PROXY": recording.url, "NO_PROXY": "127.0.0.1"}).forward(config, "pm", "gw", "main", BODY)
        explicit = models_config(model.base_url, proxy={"inheritEnv": False, "http": recording.url})
        model.enqueue(content="via config")
        ModelProxy({"HTTP_PROXY": "http://127.0.0.1:9"}).forward(explicit, "pm", "gw", "main", BODY)
        url = model.base_url + "/chat/completions"
        assert recording.seen == [("POST", url), ("POST", url)]
        assert model.requests[0].headers["authorization"] == f"Bearer {KEY}"
        assert len(model.requests) == 3
    finally:
        recording.close()
    with pytest.raises(BadGateway, match=r"Request to provider gw failed: Proxy protocol socks5: \(from ALL_PROXY\)"):
        ModelProxy({"ALL_PROXY": "socks5://127.0.0.1:1080"}).forward(config, "pm", "gw", "main", BODY)


@pytest.mark.parametrize("agent, provider, preset, error, message", [
    ("pm", "gw", "ghost", NotFound, "Model preset not found: ghost"),
    ("pm", "gw", "other", Forbidden, "Model preset other is not selected for pm"),
    ("worker", "replay", "main", BadRequest, "Model preset main uses provider gw, not replay"),
    ("worker", "gw", "list", BadRequest, "Model preset list is a model list; name one of its concrete presets"),
])
def test_only_the_agents_own_concrete_presets_are_forwarded(model, agent, provider, preset, error, message):
    config = models_config(model.base_url)
    with pytest.raises(error) as caught:
        ModelProxy({"KEY_VAR": KEY}).forward(config, agent, provider, preset, BODY)
    assert str(caught.value) == message
    assert model.requests == []


def test_scripted_presets_missing_base_urls_and_bodies_are_refused(model):
    scripted = models_config(model.base_url, agents={"pm": {"model": "offline"}})
    with pytest.raises(BadRequest, match="Provider replay is scripted"):
        ModelProxy({}).forward(scripted, "pm", "replay", "offline", BODY)
    with pytest.raises(BadGateway, match="Provider gw has no baseURL"):
        ModelProxy({}).forward(models_config(None), "pm", "gw", "main", BODY)
    with pytest.raises(BadRequest, match="body must be an object"):
        ModelProxy({}).forward(models_config(model.base_url), "pm", "gw", "main", ["not", "an", "object"])
    assert model.requests == []


# ---------------------------------------------------------------- the route on the real app

ROUTE_YAML = """\
name: demo
task: Proxy route.
agents:
  pm:
    tools: [messages.send]
  worker:
    tools: [messages.send]
scheduler:
  noEffectNudge: {{enabled: false}}
backend:
  kind: local
  controllerUrl: "{controller_url}"
  runner:
    model: main
    budget: {{maxTokens: 1000}}
    models:
      providers:
        gw: {{type: openai-compatible, baseURL: "{model_url}", apiKeyEnv: KEY_VAR,
              headers: {{X-Api-Key: "{header}"}}}}
      presets:
        main: {{provider: gw, model: fake-model}}
"""


@contextlib.contextmanager
def route_service(tmp_path, model_url, environ=None):
    """The served apps with the started project `demo` of ROUTE_YAML whose provider is at `model_url`:
    (service, store); the model proxy reads `environ` (the key by default)."""
    with serving(tmp_path / "root", model_proxy=ModelProxy(environ or {"KEY_VAR": KEY})) as service:
        text = ROUTE_YAML.format(controller_url=service.base_url, model_url=model_url, header=HEADER_SECRET)
        store = init_project(service.root, tmp_path / "demo", text)
        store.start()
        yield service, store


@pytest.fixture
def route(tmp_path, model):
    with route_service(tmp_path, model.base_url) as pair:
        yield pair


def identity(service, store, agent_id, activation_id, **fields):
    body = {"project": "demo", "agentId": agent_id, "activationId": activation_id,
            "token": service.token("demo", agent_id), "providerId": "gw", "presetId": "main", "body": BODY}
    body.update(fields)
    return body


def test_the_route_answers_status_headers_and_body_and_records_the_usage(route, model):
    service, store = route
    act = running_activation(store, "pm")
    model.enqueue(content="Routed", usage=(40, 2, 42))
    model.enqueue_error(400, "later")
    first = service.post("/runner/model", identity(service, store, "pm", act["id"]))
    assert first.status_code == 200, first.text
    answer = first.json()
    assert (answer["status"], answer["headers"]) == (200, {})
    assert json.loads(answer["body"])["choices"][0]["message"]["content"] == "Routed"
    second = service.post("/runner/model", identity(service, store, "pm", act["id"])).json()
    assert (second["status"], second["headers"], second["overflow"]) == (400, {}, False)
    assert json.loads(second["body"])["error"]["message"] == "later"
    assert [r.headers["authorization"] for r in model.requests] == [f"Bearer {KEY}"] * 2
    assert model.requests[0].headers["x-api-key"] == HEADER_SECRET
    assert store.model_usage(act["id"]) == {"calls": 2, "tokens": {"input": 40, "output": 2, "total": 42}}
    calls = store.db_all("SELECT agent_id, provider_id, preset_id, status, tokens FROM model_calls ORDER BY rowid")
    assert [tuple(c.values()) for c in calls] == [("pm", "gw", "main", 200, 42), ("pm", "gw", "main", 400, 0)]


def test_a_calls_exchange_and_usage_are_one_commit(route, model):
    service, store = route
    act = running_activation(store, "pm")
    model.enqueue(content="Once", usage=(4, 2, 6))
    commits = store.commits
    assert service.post("/runner/model", identity(service, store, "pm", act["id"])).json()["status"] == 200
    assert store.commits == commits + 1
    [exchange] = store.exchanges(act["id"])
    assert (exchange["status"], store.model_usage(act["id"])["calls"]) == (200, 1)


def test_the_route_refuses_like_every_runner_route(route, model):
    service, store = route
    act = running_activation(store, "pm")
    mine = identity(service, store, "pm", act["id"])
    cases = [
        (dict(mine, token="wrong"), 403, "Invalid agent token"),
        (identity(service, store, "worker", act["id"]), 403, f"Activation {act['id']} does not belong to worker"),
        (dict(mine, activationId="act_0_00000000"), 404, "Unknown activation: act_0_00000000"),
        (dict(mine, agentId="ghost"), 404, "Unknown agent: ghost"),
        (dict(mine, project="nope"), 404, "Unknown project: nope"),
        ({k: v for k, v in mine.items() if k != "presetId"}, 400, "presetId is required"),
        (dict(mine, body="text"), 400, "body is required"),
    ]
    for body, status, message in cases:
        response = service.post("/runner/model", body)
        assert (response.status_code, response.json()) == (status, {"error": message}), body
    coordination.cancel_activation(store, act["id"], "test")
    response = service.post("/runner/model", mine)
    assert response.status_code == 409
    assert response.json() == {"error": f"Activation {act['id']} is cancelled; no more model calls are accepted"}
    assert model.requests == [] and store.model_usage(act["id"])["calls"] == 0


def test_the_route_answers_a_transport_failure_with_a_json_502(tmp_path):
    with route_service(tmp_path, f"http://127.0.0.1:{closed_port()}/v1") as (service, store):
        act = running_activation(store, "pm")
        response = service.post("/runner/model", identity(service, store, "pm", act["id"]))
        failure = "Request to provider gw failed: [Errno 111] Connection refused"
        assert (response.status_code, response.json()) == (502, {"error": failure})
        assert store.model_usage(act["id"])["calls"] == 0
        [exchange] = store.exchanges(act["id"])  # forwarded, and no answer came
        assert (exchange["status"], exchange["error"]) == (None, failure)


def test_the_budget_pauses_on_what_the_controller_saw_even_when_the_runner_reports_zero(route, model):
    service, store = route
    act = running_activation(store, "pm")
    model.enqueue(content="Expensive", usage=(1100, 100, 1200))
    assert service.post("/runner/model", identity(service, store, "pm", act["id"])).json()["status"] == 200
    output = {"text": "done", "usage": {"selectedModel": "main", "model": "main", "apiModel": "fake-model",
                                        "tokens": {"input": 0, "output": 0, "total": 0}}}
    posted = service.post("/activation-output", {"project": "demo", "agentId": "pm", "activationId": act["id"],
                                                 "token": service.token("demo", "pm"), "output": output})
    assert posted.json()["status"] == "completed"
    assert store.activation(act["id"])["usage"]["tokens"]["total"] == 0, "the runner's report is kept as is"
    assert store.window_tokens() == 1200
    # the output route's tick paused the project
    assert store.project()["status"] == "stopped"
    [event] = [e for e in store.list_events(limit=100) if e["type"] == "project.budget_exceeded"]
    assert json.loads(event["data_json"]) == {"maxTokens": 1000, "usedTokens": 1200}


# ---------------------------------------------------------------- the hole tests

HOLE_KEY = "sk-hole-5f1c0e9a77d24b3e"
HOLE_HEADER = "hdr-hole-0b8e42c7d913"

# Searches for the key, the secret header and (as the control that the search works) the agent's own
# token. Neither secret is written literally: the halves join only inside the shell, so no argv or file
# the search reads holds them. Each found value is printed as its label.
SEARCH = r"""
K="$(printf %s '{key_a}')$(printf %s '{key_b}')"
H="$(printf %s '{header_a}')$(printf %s '{header_b}')"
T="$SUZUMIO_TOKEN"
label() {{ sed -e "s/$K/KEY/g" -e "s/$H/HEADER/g" -e "s/$T/TOKEN/g"; }}
find_in() {{ grep -a -o -F -e "$K" -e "$H" -e "$T" "$@" 2>/dev/null | label | sort -u; }}
echo "ENV-BEGIN"; env | find_in; echo "ENV-END"
echo "PROC-BEGIN"
for f in /proc/[0-9]*/environ; do {{ tr '\0' '\n' < "$f"; }} 2>/dev/null | find_in | sed "s|^|$f:|"; done
echo "PROC-END"
{paths}
"""
DOCKER_PATHS = r"""
echo "TREES-BEGIN"; find_in -r /activation /opt/suzumio; echo "TREES-END"
mkdir -p /tmp/suzumio-hole/a/b && printf '%s\n' "$T" > /tmp/suzumio-hole/a/b/control
echo "ROOT-BEGIN"
timeout 200 grep -r -a -o -F -s -D skip --exclude-dir=proc --exclude-dir=sys -e "$K" -e "$H" -e "$T" / \
  | label | sort -u
echo "ROOT-EXIT:${PIPESTATUS[0]}"
echo "ROOT-END"
"""
LOCAL_PATHS = r"""
INPUT="$(tr '\0' '\n' < /proc/$PPID/cmdline | tail -n 1)"
echo "RUNNER-BEGIN"; tr '\0' '\n' < /proc/$PPID/environ | find_in; echo "RUNNER-END"
echo "INPUT-BEGIN"; find_in "$INPUT" | sed "s|^|input.json:|"; echo "INPUT-END"
"""


def search_command(paths):
    return SEARCH.format(key_a=HOLE_KEY[:9], key_b=HOLE_KEY[9:], header_a=HOLE_HEADER[:8],
                         header_b=HOLE_HEADER[8:], paths=paths)


def section(output, name):
    """The lines the search printed between NAME-BEGIN and NAME-END (the tool output starts with the
    command itself, which names the markers too)."""
    lines = output.split("\n[stdout]\n", 1)[1].splitlines()
    return lines[lines.index(f"{name}-BEGIN") + 1:lines.index(f"{name}-END")]


def hole_team(tmp_path, kind, monkeypatch):
    """A team whose provider takes its key from HOLE_KEY_VAR in the controller's environment and sends
    a secret header, as the README configures it."""
    monkeypatch.setenv("HOLE_KEY_VAR", HOLE_KEY)
    fake = {"apiKey": None, "apiKeyEnv": "HOLE_KEY_VAR", "headers": {"X-Api-Key": HOLE_HEADER}}
    return running_team(tmp_path, kind, fake_provider=fake)


def run_search(team, paths, timeout_ms):
    """worker-1 runs the search through shell.exec; returns the tool output (the model got the same)."""
    team.model.enqueue(tool_calls=[call("shell.exec", command=search_command(paths), timeoutMs=timeout_ms)],
                       model="worker-1")
    team.model.enqueue(content="Searched.", model="worker-1")
    team.send("worker-1", "Search the container.")
    [activation] = team.wait_activations("worker-1", 1, timeout=timeout_ms / 1000 + 60)
    assert activation["status"] == "completed", team.describe()
    [row] = [r for r in team.store.list_tool_calls(100) if r["tool"] == "shell.exec"]
    assert row["status"] == "completed", row
    return row["output"]


def assert_model_call_worked(team):
    requests = team.model_requests("worker-1")
    assert len(requests) == 2, "the tool result went back to the model through the proxy"
    for request in requests:
        assert request.headers["authorization"] == f"Bearer {HOLE_KEY}"
        assert request.headers["x-api-key"] == HOLE_HEADER


@pytest.mark.docker
def test_the_key_is_nowhere_inside_a_docker_activation(tmp_path, monkeypatch):
    with hole_team(tmp_path, "docker-chat", monkeypatch) as team:
        output = run_search(team, DOCKER_PATHS, 280000)
        assert section(output, "ENV") == ["TOKEN"]
        proc = section(output, "PROC")
        assert "/proc/1/environ:TOKEN" in proc, "the search reads the runner's environment"
        assert not [line for line in proc if "KEY" in line or "HEADER" in line], proc
        assert section(output, "TREES") == ["/activation/input.json:TOKEN"]
        root = section(output, "ROOT")
        exit_line = [line for line in root if line.startswith("ROOT-EXIT:")]
        assert exit_line and exit_line[0] != "ROOT-EXIT:124", "the filesystem search finished in time"
        assert "/activation/input.json:TOKEN" in root, "the filesystem search reaches the input file"
        assert "/tmp/suzumio-hole/a/b/control:TOKEN" in root, "the filesystem search walks the image's tree"
        assert not [line for line in root if "KEY" in line or "HEADER" in line], root
        assert_model_call_worked(team)


def test_the_key_is_not_in_a_local_runners_environment_or_input(tmp_path, monkeypatch):
    with hole_team(tmp_path, "local", monkeypatch) as team:
        output = run_search(team, LOCAL_PATHS, 60000)
        assert section(output, "ENV") == ["TOKEN"], output
        assert section(output, "RUNNER") == ["TOKEN"]
        assert section(output, "INPUT") == ["input.json:TOKEN"]
        [activation] = team.activations("worker-1")
        input_text = (team.store.activation_dir(activation["id"]) / "input.json").read_text()
        assert HOLE_KEY not in input_text and HOLE_HEADER not in input_text and "HOLE_KEY_VAR" not in input_text
        assert_model_call_worked(team)
