"""User routes of docs/http-api.md against the real app on Waitress with real projects."""
import json
import re

import pytest
from api_fixtures import init_project, project_yaml, running_activation, serving
from conftest import wait_until
from store_fixtures import config_of

import suzumio_coordination as coordination

pytestmark = pytest.mark.timeout(120)

LONG_TASK = "t" * 1500


@pytest.fixture
def webui_dir(tmp_path):
    folder = tmp_path / "webui_dist"
    (folder / "assets").mkdir(parents=True)
    (folder / "index.html").write_text("<!doctype html><title>Suzumio</title>", encoding="utf-8")
    (folder / "assets" / "app.js").write_text("console.log('x');", encoding="utf-8")
    (folder / "assets" / "app.css").write_text("body{}", encoding="utf-8")
    (tmp_path / "secret").write_text("top secret", encoding="utf-8")
    return folder


@pytest.fixture
def service_options(webui_dir):
    return {"webui_dir": webui_dir}


@pytest.fixture
def service(service, tmp_path):
    """The shared service with a second, never started project `alpha` beside `demo`."""
    init_project(service.root, tmp_path / "alpha", project_yaml("alpha", service.base_url, task=LONG_TASK))
    return service


@pytest.fixture
def activation_a(demo):
    """A: a running activation of worker created through the store, with no process behind it."""
    return running_activation(demo, "worker")


def signals_for(store, agent_id, kind=None):
    return [s for s in store.list_signals(target_agent=agent_id, limit=500, kind=kind)]


def test_health_answers_exact_json_body(service):
    response = service.get("/health")
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert response.content == b'{\n  "healthy": true\n}\n'


def test_health_names_the_loop_that_is_down(tmp_path):
    import suzumio_runtime

    liveness = suzumio_runtime.Liveness(["http", "scheduler", "reconciler"])
    with serving(tmp_path / "root", liveness=liveness.states) as down_service:
        assert down_service.get("/health").json() == {"healthy": True}
        liveness.died("scheduler", OSError(24, "Too many open files"))
        response = down_service.get("/health")
    assert response.status_code == 503
    assert response.json() == {"healthy": False, "components": {
        "http": "up", "scheduler": "down: OSError: [Errno 24] Too many open files", "reconciler": "up"}}


def test_project_list_gives_light_summaries_without_secrets(service):
    response = service.get("/api/projects")
    assert response.status_code == 200
    projects = response.json()
    assert [p["id"] for p in projects] == ["alpha", "demo"]
    for project in projects:
        assert "config_json" not in project
        assert project["recentActivations"] == [] and project["recentMessages"] == []
        for agent in project["agents"]:
            assert "token" not in agent and "prompt" not in agent and "promptChars" in agent
    assert projects[0]["task"] == "t" * 1000 + "\n\n[truncated 500 chars]"


def test_project_detail_has_stats_and_recent_messages_oldest_first(service, demo):
    ids = [coordination.send_message(demo, config_of(demo), "user", f"m{i}" + "b" * 13000,
                                     recipient="worker")["id"] for i in range(12)]
    detail = service.get("/api/projects/demo").json()
    assert set(detail["stats"]) == {"messageCount", "activationCount", "failedActivationCount",
                                    "runningActivationCount", "toolCallCount", "historyMessageCount",
                                    "historyCompactionCount", "eventCount"}
    assert "config_json" not in detail
    assert [m["id"] for m in detail["recentMessages"]] == ids[-10:]
    assert detail["recentMessages"][0]["body"].endswith("\n\n[truncated 1002 chars]")


def test_message_list_limit_returns_newest_oldest_first(service, demo):
    ids = [coordination.send_message(demo, config_of(demo), "user", f"m{i}",
                                     recipient="worker")["id"] for i in range(1, 4)]
    assert [m["id"] for m in service.get("/api/projects/demo/messages?limit=2").json()] == ids[1:]
    assert len(service.get("/api/projects/demo/messages?limit=0").json()) == 3
    assert len(service.get("/api/projects/demo/messages?limit=abc").json()) == 3
    for _ in range(510):
        coordination.send_message(demo, config_of(demo), "user", "x", recipient="worker")
    assert len(service.get("/api/projects/demo/messages?limit=9999").json()) == 500
    assert len(service.get("/api/projects/demo/messages").json()) == 100


def test_long_message_is_truncated_in_list_but_whole_by_id(service, demo):
    message = coordination.send_message(demo, config_of(demo), "user", "y" * 20000, recipient="worker")
    listed = service.get("/api/projects/demo/messages").json()[-1]
    assert listed["body"] == "y" * 12000 + "\n\n[truncated 8000 chars]"
    whole = service.get(f"/api/projects/demo/messages/{message['id']}").json()
    assert whole["body"] == "y" * 20000
    missing = service.get("/api/projects/demo/messages/msg_x")
    assert missing.status_code == 404 and missing.json() == {"error": "Unknown message: msg_x"}


def test_events_are_newest_first_with_shrunk_data(service, demo):
    coordination.send_message(demo, config_of(demo), "user", "z" * 5000, recipient="worker")
    events = service.get("/api/projects/demo/events").json()
    created = [e["created_at"] for e in events]
    assert created == sorted(created, reverse=True)
    message_event = next(e for e in events if e["type"] == "message.created")
    assert json.loads(message_event["data_json"])["body"] == "z" * 4000 + "\n\n[truncated 1000 chars]"


def test_events_page_back_from_an_event_and_filter_by_type_and_agent(service, demo, activation_a):
    for index in range(5):
        coordination.send_message(demo, config_of(demo), "worker", f"note {index}", recipient="pm",
                                  source_agent="worker", source_activation=activation_a["id"])
    demo.start_tool_call("worker", activation_a["id"], "shell.exec", {"command": "ls"})
    everything = service.get("/api/projects/demo/events?limit=500").json()
    first = service.get("/api/projects/demo/events?limit=3").json()
    second = service.get(f"/api/projects/demo/events?limit=3&before={first[-1]['id']}").json()
    assert [e["id"] for e in first + second] == [e["id"] for e in everything[:6]]
    created = service.get("/api/projects/demo/events?type=message.created").json()
    assert {e["type"] for e in created} == {"message.created"} and len(created) >= 5
    tools = service.get("/api/projects/demo/events?type=tool.").json()
    assert [e["type"] for e in tools] == ["tool.called"]
    mine = service.get("/api/projects/demo/events?agent=worker&type=message.created").json()
    assert [json.loads(e["data_json"])["body"] for e in mine] == [f"note {i}" for i in range(4, -1, -1)]
    missing = service.get("/api/projects/demo/events?before=evt_nope")
    assert missing.status_code == 404 and missing.json() == {"error": "Unknown event: evt_nope"}


def test_running_tool_call_row_has_null_completed_at_and_no_output(service, demo, activation_a):
    demo.start_tool_call("worker", activation_a["id"], "shell.exec", {"command": "ls"})
    row = service.get("/api/projects/demo/tool-calls").json()[0]
    assert row["status"] == "running" and row["completed_at"] is None
    assert "output" not in row and "error" not in row


def test_posting_a_message_defaults_to_p3_and_signals_the_recipient(service, demo, activation_a):
    response = service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "Start."})
    assert response.status_code == 200
    message = response.json()
    assert message["sender"] == "user" and message["priority"] == "P3" and message["body"] == "Start."
    signals = signals_for(demo, "pm", "message.created")
    assert len(signals) == 1 and signals[0]["priority"] == "P3"
    assert signals[0]["status"] in ("pending", "delivered")


def test_channel_message_from_any_sender_fans_out_to_every_agent(service, demo, activation_a):
    response = service.post("/api/projects/demo/messages",
                            {"sender": "ops", "channel": "#project", "body": "hello"})
    assert response.status_code == 200 and response.json()["sender"] == "ops"
    assert len(signals_for(demo, "pm", "message.created")) == 1
    worker_signals = signals_for(demo, "worker", "message.created")
    assert [s["status"] for s in worker_signals] == ["pending"]


def test_request_changes_restarts_a_submitted_project_with_a_p2_message(service, demo):
    demo.set_status("submitted")
    bad = service.post("/api/projects/demo/request-changes", {"recipient": "ghost", "body": "x"})
    assert bad.status_code == 400 and bad.json() == {"error": "Unknown agent: ghost"}
    assert demo.project()["status"] == "submitted"
    response = service.post("/api/projects/demo/request-changes", {"body": "Please fix the proof."})
    assert response.status_code == 200
    summary = response.json()
    assert summary["status"] == "running" and "stats" in summary and "recentMessages" in summary
    message = demo.list_messages(10)[-1]
    assert (message["sender"], message["recipient"], message["priority"]) == ("user", "pm", "P2")


def test_stop_cancels_running_work_and_start_resumes_it(service, demo, activation_a):
    stopped = service.post("/api/projects/demo/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    cancelled = demo.activation(activation_a["id"])
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "Project stopped"
    assert demo.agent("worker")["status"] == "quiet"
    resume = signals_for(demo, "worker", "scheduler.resume_after_stop")
    assert len(resume) == 1 and resume[0]["status"] == "pending" and resume[0]["priority"] == "P2"
    assert resume[0]["payload"]["cancelledActivationId"] == activation_a["id"]
    assert len(demo.list_activations()) == 1

    started = service.post("/api/projects/demo/start")
    assert started.status_code == 200 and started.json()["status"] == "running"
    delivered = demo.signal(resume[0]["id"])
    assert delivered["status"] == "delivered"
    assert demo.activation(delivered["deliveredActivationId"])["agentId"] == "worker"


def test_approve_cancels_running_work_without_resume_signal(service, demo):
    b = running_activation(demo, "pm")
    response = service.post("/api/projects/demo/approve")
    assert response.status_code == 200 and response.json()["status"] == "completed"
    cancelled = demo.activation(b["id"])
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "Project approved"
    assert signals_for(demo, "pm", "scheduler.resume_after_stop") == []


def test_report_is_plain_text_before_and_after_submission(service, demo, activation_a):
    before = service.get("/api/projects/demo/report")
    assert before.status_code == 200 and before.text == "No report submitted.\n"
    assert before.headers["Content-Type"] == "text/plain; charset=utf-8"
    coordination.submit_report(demo, "worker", activation_a["id"], "  # Done\n\nAll good.\n\n")
    assert service.get("/api/projects/demo/report").text == "# Done\n\nAll good.\n"


def test_missing_report_file_answers_500_with_an_error_id(service, demo, activation_a):
    path = coordination.submit_report(demo, "worker", activation_a["id"], "# Done")["reportPath"]
    (demo.dir / "final-report.md").unlink()
    response = service.get("/api/projects/demo/report")
    assert response.status_code == 500
    assert re.fullmatch(r"Internal error \(id [0-9a-f]{12}\)", response.json()["error"]) and path not in response.text


def history_rows(store, agent_id, activation_id, count):
    for index in range(count):
        store.append_history(agent_id, activation_id, "assistant", "assistant_output", f"row {index + 1}")


def test_history_pages_newest_first_with_next_before(service, demo, activation_a):
    history_rows(demo, "worker", activation_a["id"], 4)  # the activation prompt row is sequence 1
    first = service.get("/api/projects/demo/agents/worker/history?limit=2").json()
    assert [m["sequence"] for m in first["messages"]] == [5, 4] and first["nextBefore"] == 4
    second = service.get("/api/projects/demo/agents/worker/history?limit=2&before=4").json()
    assert [m["sequence"] for m in second["messages"]] == [3, 2] and second["nextBefore"] == 2
    last = service.get("/api/projects/demo/agents/worker/history?limit=2&before=2").json()
    assert [m["sequence"] for m in last["messages"]] == [1] and "nextBefore" not in last
    assert last["agentId"] == "worker"


def test_history_archives_are_hidden_only_by_include_archived_zero(service, demo, activation_a):
    history_rows(demo, "worker", activation_a["id"], 4)
    compaction = coordination.compact_history(demo, "worker", activation_a["id"], "Summary.", keep_tail=2)["compaction"]
    hidden = service.get("/api/projects/demo/agents/worker/history?includeArchived=0").json()["messages"]
    assert {1, 2, 3} & {m["sequence"] for m in hidden} == set()
    shown = service.get("/api/projects/demo/agents/worker/history?includeArchived=false").json()["messages"]
    archived = [m for m in shown if m["sequence"] in (1, 2, 3)]
    assert len(archived) == 3 and all(m["archived"] and m["compactionId"] == compaction["id"] for m in archived)

    archive = service.get(f"/api/projects/demo/agents/worker/history-archive/{compaction['id']}").json()
    assert archive["compaction"]["id"] == compaction["id"] and archive["archive"]["version"] == 1
    missing = service.get("/api/projects/demo/agents/worker/history-archive/cmp_x")
    assert missing.status_code == 404 and missing.json() == {"error": "Unknown history compaction: cmp_x"}
    ghost = service.get("/api/projects/demo/agents/ghost/history")
    assert ghost.status_code == 404 and ghost.json() == {"error": "Unknown agent: ghost"}


def test_activation_context_falls_back_to_the_prompt_then_shows_the_snapshot(service, demo, activation_a):
    path = f"/api/projects/demo/activations/{activation_a['id']}/context"
    fallback = service.get(path).json()
    assert fallback["activationPrompt"] == "Work."
    assert fallback["context"]["messages"] == [{"role": "user", "content": "Work.", "chars": 5}]
    snapshot = {"version": 1, "kind": "model-context", "messageCount": 1, "totalChars": 2,
                "messages": [{"role": "user", "content": "hi", "chars": 2}]}
    posted = service.post("/activation-context", {
        "project": "demo", "agentId": "worker", "activationId": activation_a["id"],
        "token": service.token("demo", "worker"), "context": snapshot})
    assert posted.json() == {"status": "recorded", "activationId": activation_a["id"]}
    recorded = service.get(path).json()
    assert recorded["context"] == snapshot and recorded["activation"]["hasContext"] is True
    missing = service.get("/api/projects/demo/activations/act_x/context")
    assert missing.status_code == 404 and missing.json() == {"error": "Unknown activation: act_x"}


def test_tool_status_aggregates_registered_and_retired_tools(service, demo, activation_a):
    call = demo.start_tool_call("worker", activation_a["id"], "shell.exec", {"command": "ls"})
    coordination.finish_tool_call(demo, "worker", activation_a["id"], call["toolCallId"], "failed", error="boom")
    demo.start_tool_call("worker", activation_a["id"], "retired.tool", {})
    status = service.get("/api/projects/demo/tool-status").json()
    names = [entry["tool"] for entry in status]
    assert names == sorted(names)
    shell = next(e for e in status if e["tool"] == "shell.exec")
    assert shell["enabledForAgents"] == ["worker"] and shell["toolpackId"] == "shell"
    assert (shell["callCount"], shell["failedCount"]) == (1, 1)
    assert (shell["lastStatus"], shell["lastError"]) == ("failed", "boom")
    retired = next(e for e in status if e["tool"] == "retired.tool")
    assert retired["enabledForAgents"] == [] and retired["callCount"] == 1 and "toolpackId" not in retired
    messages_send = next(e for e in status if e["tool"] == "messages.send")
    assert messages_send["callCount"] == 0 and "lastStatus" not in messages_send

    report = coordination.submit_report(demo, "worker", activation_a["id"], "# Done")["reportPath"]
    submit = next(e for e in service.get("/api/projects/demo/tool-status").json() if e["tool"] == "completion.submit")
    assert submit["submittedReportPath"] == report


def test_tool_ui_lists_entries_and_runs_project_stats_without_token(service, demo, activation_a):
    entries = service.get("/api/projects/demo/tool-ui").json()
    assert [(e["toolpackId"], e["id"]) for e in entries] == [
        ("core", "project.stats"), ("core", "messages.conversation"), ("core", "messages.send"),
        ("core", "coordination.signals"), ("core", "completion.report"), ("core", "file.activity"),
        ("shell", "shell.activity"), ("web", "web.activity")]
    assert all(e["toolpackKind"] == "builtin" for e in entries)
    response = service.call("POST", "/api/projects/demo/tool-ui/core/project.stats", data=b"")
    assert response.status_code == 200
    result = response.json()
    assert result["title"] == "Project statistics"
    assert result["output"].startswith("Status: running\nAgents: 2 (1 quiet, 1 running)\n")
    assert set(result["metadata"]) == {"metrics", "stats", "agentStatuses", "projectStatus"}


def test_static_webui_is_served_with_security_headers(service):
    index = service.get("/")
    assert index.status_code == 200
    assert index.headers["Content-Type"] == "text/html; charset=utf-8"
    assert index.headers["Content-Security-Policy"] == "default-src 'self'"
    assert index.headers["X-Content-Type-Options"] == "nosniff"
    script = service.get("/assets/app.js")
    assert script.status_code == 200 and script.text == "console.log('x');"
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert script.headers["X-Content-Type-Options"] == "nosniff"
    assert service.get("/assets/app.css").headers["Content-Type"] == "text/css; charset=utf-8"
    escape = service.get("/assets/%2e%2e/%2e%2e/secret")
    assert escape.status_code == 404 and escape.json() == {"error": "not found"}
    missing = service.get("/assets/missing.js")
    assert missing.status_code == 404
    assert missing.json() == {"error": "webui asset not found. Run npm run build."}


def test_missing_webui_build_answers_json_404(tmp_path):
    with serving(tmp_path / "root", webui_dir=tmp_path / "absent") as service:
        response = service.get("/")
        assert response.status_code == 404
        assert response.json() == {"error": "webui asset not found. Run npm run build."}


def test_every_kind_of_response_carries_nosniff(service):
    for path in ("/health", "/api/projects/demo/task", "/api/projects/ghost", "/assets/app.js", "/nope"):
        assert service.get(path).headers["X-Content-Type-Options"] == "nosniff", path
    assert service.get("/api/projects/demo/task").text == "Prove the theorem.\n"


def test_cross_origin_posts_are_refused_without_side_effects(service, demo):
    before = demo.project_stats()
    body = b'{"recipient":"pm","body":"x"}'
    path = "/api/projects/demo/messages"
    foreign = service.call("POST", path, data=body, headers={"Content-Type": "text/plain",
                                                             "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json() == {"error": "Cross-origin request rejected"}
    cross_site = service.call("POST", path, data=body, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross_site.status_code == 403 and cross_site.json() == {"error": "Cross-origin request rejected"}
    null_origin = service.call("POST", path, data=body, headers={"Origin": "null"})
    assert null_origin.status_code == 403
    assert demo.project_stats() == before
    same = service.call("POST", path, data=body, headers={"Origin": f"http://127.0.0.1:{service.port}"})
    assert same.status_code == 200
    assert service.get("/api/projects", headers={"Origin": "http://evil.example"}).status_code == 200


def test_host_check_refuses_foreign_hosts_on_the_user_listener_only(service, demo, activation_a):
    evil = {"Host": f"evil.example:{service.port}"}
    for path in ("/api/projects", "/", "/health", "/nope", "/runner/signals"):
        response = service.get(path, headers=evil, listener="user")
        assert response.status_code == 403, path
        assert response.json() == {"error": "Host not allowed: evil.example"}
    assert service.get("/api/projects", headers={"Host": f"localhost:{service.port}"}).status_code == 200
    assert service.get("/health", headers={"Host": f"[::1]:{service.port}"}).status_code == 200
    signal = service.post("/runner/signals", {
        "project": "demo", "agentId": "worker", "activationId": activation_a["id"],
        "token": service.token("demo", "worker"), "kind": "x.note"},
        headers={"Host": "host.docker.internal"})
    assert signal.status_code == 200 and signal.json() == {"status": "recorded"}


def test_allow_host_admits_a_named_host(tmp_path, webui_dir):
    with serving(tmp_path / "root", webui_dir=webui_dir, allowed_hosts=("evil.example",)) as service:
        headers = {"Host": f"evil.example:{service.port}"}
        assert service.get("/api/projects", headers=headers).status_code == 200
        assert service.get("/", headers=headers).status_code == 200


def test_api_token_guards_every_api_route_with_401_but_not_health_or_static(tmp_path, webui_dir):
    with serving(tmp_path / "root", webui_dir=webui_dir, api_token="s3cret") as service:
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        demo.start()
        activation = running_activation(demo, "worker")
        before = demo.project_stats()
        missing = service.get("/api/projects", auth=False)
        assert missing.status_code == 401 and missing.json() == {"error": "API token required"}
        assert missing.headers["Content-Type"] == "application/json; charset=utf-8"
        basic = service.get("/api/projects", headers={"Authorization": "Basic czNjcmV0"})
        assert (basic.status_code, basic.json()) == (401, {"error": "API token required"})
        wrong = service.get("/api/projects", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json() == {"error": "Invalid API token"}
        posted = service.post("/api/projects/demo/messages", {"recipient": "pm", "body": "x"}, auth=False)
        assert (posted.status_code, posted.json()) == (401, {"error": "API token required"})
        assert demo.project_stats() == before
        assert service.get("/api/projects", headers={"Authorization": "bearer s3cret"}).status_code == 200
        assert service.get("/api/projects?token=s3cret", auth=False).status_code == 401
        stream = service.get("/api/projects/demo/stream?token=s3cret", stream=True, auth=False)
        assert stream.status_code == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
        assert next(stream.iter_lines(decode_unicode=True)).startswith(("id: ", ":"))
        stream.close()
        assert service.get("/api/projects/demo/stream", auth=False).status_code == 401
        assert service.get("/api/projects/demo/stream?token=nope", auth=False).status_code == 401
        assert service.get("/health", auth=False).status_code == 200
        assert service.get("/", auth=False).status_code == 200
        assert service.get("/assets/app.js", auth=False).status_code == 200
        signal = service.post("/runner/signals", {
            "project": "demo", "agentId": "worker", "activationId": activation["id"],
            "token": service.token("demo", "worker"), "kind": "x.note"})
        assert signal.status_code == 200


RUNNER_PATHS = ("/runner/tool-calls/start", "/runner/tool-calls/finish", "/runner/signals",
                "/runner/history/messages", "/runner/history/compact", "/toolpacks/core/support",
                "/activation-context", "/activation-output")


def test_runner_routes_are_404_on_the_user_listener_and_user_routes_404_on_the_runner_listener(
        service, demo, activation_a):
    identity = {"project": "demo", "agentId": "worker", "activationId": activation_a["id"],
                "token": service.token("demo", "worker"), "kind": "x.note"}
    before = demo.project_stats()
    for path in RUNNER_PATHS:
        response = service.post(path, identity, listener="user")
        assert (response.status_code, response.json()) == (404, {"error": "not found"}), path
    assert demo.project_stats() == before
    for method, path in (("GET", "/health"), ("GET", "/"), ("GET", "/assets/app.js"), ("GET", "/api/projects"),
                         ("GET", "/api/projects/demo"), ("POST", "/api/projects/demo/approve"),
                         ("POST", "/api/projects/demo/messages"), ("GET", "/api/projects/demo/stream")):
        response = service.call(method, path, json={"recipient": "pm", "body": "x"}, listener="runner",
                                headers=service.auth_headers)
        assert (response.status_code, response.json()) == (404, {"error": "not found"}), path
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert demo.project()["status"] == "running" and demo.project_stats() == before
    assert service.post("/runner/signals", identity).json() == {"status": "recorded"}


def test_runner_socket_lives_alone_in_its_own_directory_beside_the_egress_socket(service):
    import os
    import stat

    socket_path = service.runner_socket
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o666
    directory = os.path.dirname(socket_path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    assert sorted(os.listdir(directory)) == ["egress.sock", "runner.sock"]
    assert stat.S_IMODE(os.stat(os.path.join(directory, "egress.sock")).st_mode) == 0o666


def test_runner_listener_on_tcp_serves_only_runner_routes(tmp_path, webui_dir):
    with serving(tmp_path / "root", webui_dir=webui_dir, runner_listen=("127.0.0.1", 0)) as service:
        assert service.runner_socket is None and service.runner_url.startswith("https://127.0.0.1:")
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        demo.start()
        activation = running_activation(demo, "worker")
        identity = {"project": "demo", "agentId": "worker", "activationId": activation["id"],
                    "token": service.token("demo", "worker"), "kind": "x.note"}
        assert service.post("/runner/signals", identity).json() == {"status": "recorded"}
        assert service.post("/runner/signals", identity, listener="user").status_code == 404
        assert service.get("/api/projects", listener="runner", headers=service.auth_headers).status_code == 404


def test_resolved_config_redacts_secrets_and_keeps_the_file(tmp_path):
    extra = """\
observability: {}
"""
    with serving(tmp_path / "root") as service:
        text = project_yaml("secrets", service.base_url, extra=extra).replace(
            "        replay:\n", """        gw:
          type: openai-compatible
          apiKey: sk-live-123
          apiKeyEnv: GW_KEY
          baseURL: http://127.0.0.1:9/v1
          headers: {Authorization: Bearer abc, X-Trace: visible}
        replay:
""").replace("  worker:\n", "  worker:\n    env: {GITHUB_TOKEN: ghp_x, PLAIN: fine}\n").replace(
            "  docker:\n", "").replace("backend:\n  kind: local\n", """backend:
  kind: local
  docker:
    proxy: {http: "http://bob:pw@proxy:3128"}
""")
        init_project(service.root, tmp_path / "secrets", text)
        on_disk = (service.root.path / "secrets" / "resolved.yaml").read_text(encoding="utf-8")
        response = service.get("/api/projects/secrets/config/resolved")
        assert response.status_code == 200 and response.headers["Content-Type"] == "text/plain; charset=utf-8"
        body = response.text
        for secret in ("sk-live-123", "abc", "ghp_x", "pw@"):
            assert secret not in body
        assert "http://bob:<redacted>@proxy:3128" in body
        assert "apiKeyEnv: GW_KEY" in body and "X-Trace: visible" in body and "PLAIN: fine" in body
        assert body.count("<redacted>") == 4
        assert (service.root.path / "secrets" / "resolved.yaml").read_text(encoding="utf-8") == on_disk
        assert "sk-live-123" in on_disk


def test_stop_ends_a_real_local_activation(tmp_path):
    script = '{agents: {worker: [{steps: [{tools: [{name: shell.exec, input: {command: "sleep 60"}}]}]}]}}'
    with serving(tmp_path / "root") as service:
        demo = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url, script=script))
        demo.start()
        coordination.send_message(demo, config_of(demo), "user", "Sleep.", recipient="worker")
        service.scheduler.tick("demo")
        w = demo.list_activations()[-1]
        wait_until(lambda: demo.list_tool_calls(5), 20, message="worker to start shell.exec")
        pid = int(demo.activation(w["id"])["containerName"].removeprefix("local-"))
        stopped = service.post("/api/projects/demo/stop", timeout=5)
        assert stopped.status_code == 200
        activation = demo.activation(w["id"])
        assert activation["status"] == "cancelled" and activation["error"] == "Project stopped"
        wait_until(lambda: not process_group_alive(pid), 5, message="the runner's process group to end")
        late = service.post("/activation-output", {
            "project": "demo", "agentId": "worker", "activationId": w["id"],
            "token": service.token("demo", "worker"), "output": {"text": "late"}})
        assert late.json() == {"status": "cancelled", "activationId": w["id"]}
        assert demo.activation(w["id"])["status"] == "cancelled"


def process_group_alive(pgid):
    import os
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
