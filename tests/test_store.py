"""Store tests on a real SQLite file: docs/design/store.md acceptance scenarios plus transactions and threads."""
import json
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_until
from store_fixtures import (
    T0,
    at,
    config_of,
    count,
    expanded_agents,
    init_demo,
    make_config,
    rows,
    snapshot,
)

import suzumio_approvals
import suzumio_config
import suzumio_coordination as coordination
import suzumio_effects
import suzumio_records as rec
import suzumio_replay
import suzumio_store as st
import suzumio_store_repository
from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound, SuzumioError

ID_RE = re.compile(r"^(act|msg|sig|tool|evt|hist|hpart|cmp)_\d{13}_[0-9a-f]{8}$")
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def demo(tmp_path):
    root, store = init_demo(tmp_path / "root")
    yield store
    root.close()


# -- root, layout, init -------------------------------------------------------------------------

def test_resolve_root_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert st.resolve_root("x", {"SUZUMIO_ROOT": "/env"}) == tmp_path / "x"
    assert st.resolve_root(None, {"SUZUMIO_ROOT": "/env"}) == Path("/env")
    assert st.resolve_root(None, {"SUZUMIO_ROOT": ""}) == tmp_path
    assert st.resolve_root("", {}) == tmp_path
    assert st.resolve_root(None, {}) == Path.home() / ".suzumio"


def test_init_creates_layout_rows_tokens_and_event(tmp_path):
    root, store = init_demo(tmp_path / "root", start=False)
    project_dir = tmp_path / "root" / "demo"
    for rel in ("suzumio.sqlite", "source.yaml", "resolved.yaml", "agents", "artifacts", "activations",
                "logs", "agents/pm/workspace", "agents/worker/workspace", "artifacts/verifier"):
        assert (project_dir / rel).exists(), rel
    assert (project_dir / "activations").stat().st_mode & 0o777 == 0o700
    assert store.project()["status"] == "initialized"
    assert "config_json" not in store.project()
    agents = store.list_agents(include_tokens=True)
    assert [a["id"] for a in agents] == ["pm", "verifier", "worker"]
    assert {a["status"] for a in agents} == {"quiet"}
    tokens = [a["token"] for a in agents]
    assert len(set(tokens)) == 3
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{32}", t) for t in tokens)
    assert agents[0]["workspacePath"] == str(project_dir / "agents" / "pm" / "workspace")
    events = store.list_events()
    assert [e["type"] for e in events] == ["project.initialized"]
    assert json.loads(events[0]["data_json"]) == {"configPath": str(project_dir / "resolved.yaml")}
    with pytest.raises(Conflict, match=r"^Project already initialized: demo$"):
        root.init_project("demo", "t", make_config(), [], "a", "b")
    assert (project_dir / "source.yaml").read_text() == "name: demo\n"
    root.close()


def test_counted_agents_expand_with_names_and_list_by_id(tmp_path):
    config = make_config(agents={"pm": {}, "worker": {"count": 2, "names": ["Akari", "Ren"], "role": "dev"}})
    root, store = init_demo(tmp_path / "root", config)
    agents = store.list_agents()
    assert [(a["id"], a["displayName"], a["role"]) for a in agents] == [
        ("pm", "pm", "pm"), ("worker-1", "Akari", "dev"), ("worker-2", "Ren", "dev")]
    root.close()


def test_open_project_unknown_creates_nothing(tmp_path):
    root = st.Root(tmp_path / "root")
    with pytest.raises(NotFound, match=r"^Unknown project: ghost$"):
        root.open_project("ghost")
    with pytest.raises(NotFound, match=r"^Unknown project: \.\.$"):
        root.open_project("..")
    assert not (tmp_path / "root").exists()
    (tmp_path / "root" / "empty").mkdir(parents=True)
    with pytest.raises(NotFound):
        root.open_project("empty")
    assert list((tmp_path / "root" / "empty").iterdir()) == []
    assert root.list_projects() == []


def test_list_projects_sorted_and_open_returns_shared_store(tmp_path):
    root = st.Root(tmp_path / "root")
    for name in ("b", "a", "B"):
        root.init_project(name, "t", make_config(name=name), expanded_agents(make_config()), "", "")
    (tmp_path / "root" / "stray").mkdir()
    assert root.list_projects() == ["B", "a", "b"]
    assert root.open_project("a") is root.open_project("a")
    root.close()
    reopened = st.Root(tmp_path / "root").open_project("a")
    assert reopened.project()["id"] == "a"
    reopened.close()
    reopened.close()


def test_failed_init_leaves_no_files(tmp_path):
    seeds = expanded_agents(make_config())
    broken = seeds + [seeds[0]]  # duplicate agent id fails inside the database transaction
    root = st.Root(tmp_path / "root")
    with pytest.raises(sqlite3.IntegrityError):
        root.init_project("demo", "t", make_config(), broken, "src", "res")
    assert not (tmp_path / "root").exists()
    store = root.init_project("demo", "t", make_config(), seeds, "src", "res")
    assert store.project()["status"] == "initialized"
    root.close()


def test_fresh_database_records_migration_and_reopen_runs_nothing(tmp_path):
    store = st.ProjectStore("blank", tmp_path)
    migrations = rows(store, "SELECT id, name FROM _migrations")
    assert migrations == [{"id": 1, "name": "initial schema"}, {"id": 2, "name": "model calls"},
                          {"id": 3, "name": "approval requests"}, {"id": 4, "name": "model call cost"},
                          {"id": 5, "name": "tool call keys"}, {"id": 6, "name": "events by type"},
                          {"id": 7, "name": "approval edits, paused agents"},
                          {"id": 8, "name": "flight recorder"},
                          {"id": 9, "name": "message idempotency keys"},
                          {"id": 10, "name": "activation nodes"},
                          {"id": 11, "name": "cached prompt tokens"}, {"id": 12, "name": "effect ledger"},
                          {"id": 13, "name": "team repository"}]
    expected = {
        "projects": ["id", "name", "status", "task", "config_json", "submitted_report", "created_at",
                     "updated_at"],
        "agents": ["id", "project", "role", "display_name", "status", "prompt", "model", "tools_json",
                   "workspace_path", "token", "active_activation_id", "container_name", "created_at",
                   "updated_at", "paused_json", "guards_since"],
        "messages": ["id", "project", "sender", "recipient", "channel", "priority", "body", "created_at",
                     "idempotency_key"],
        "signals": ["id", "project", "kind", "source_agent", "source_activation", "target_agent",
                    "target_channel", "priority", "payload_json", "status", "useful_effect", "created_at",
                    "not_before", "delivered_at", "delivered_activation_id"],
        "activations": ["id", "project", "agent_id", "status", "prompt", "input_path", "output_path",
                        "container_name", "started_at", "completed_at", "text", "error", "emitted_messages",
                        "usage_json", "context_json", "node", "commit_start", "commit_end",
                        "repository_refs_json"],
        "tool_calls": ["id", "project", "activation_id", "agent_id", "tool", "input_json", "status", "output",
                       "error", "created_at", "completed_at", "call_key"],
        "events": ["id", "project", "type", "data_json", "created_at"],
        "agent_history_messages": ["id", "project", "agent_id", "activation_id", "role", "kind", "content",
                                   "sequence", "metadata_json", "compaction_id", "created_at"],
        "agent_history_parts": ["id", "project", "agent_id", "message_id", "activation_id", "part_index",
                                "type", "text", "tool_call_id", "tool_name", "input_json", "output", "error",
                                "metadata_json", "created_at"],
        "agent_history_compactions": ["id", "project", "agent_id", "activation_id", "summary_message_id",
                                      "archive_path", "start_sequence", "end_sequence",
                                      "archived_message_count", "raw_chars", "summary", "reason",
                                      "selected_model", "created_at"],
        "model_calls": ["id", "project", "activation_id", "agent_id", "provider_id", "preset_id", "status",
                        "tokens", "usage_json", "created_at", "cost_usd", "cached_tokens", "cache_write_tokens"],
        "approvals": ["id", "project", "agent_id", "activation_id", "tool_call_id", "tool", "input_json",
                      "rule_json", "rule_key", "status", "decision", "decided_by", "note", "on_expiry",
                      "expires_at", "created_at", "decided_at", "used_at", "edited_input_json", "output"],
        "model_exchanges": ["id", "project", "activation_id", "agent_id", "request_index", "provider_id",
                            "preset_id", "request_zlib", "status", "headers_json", "answer", "overflow",
                            "usage_json", "retries", "error", "replayed", "started_at", "duration_ms"],
        "artifact_versions": ["seq", "project", "activation_id", "agent_id", "path", "digest", "size",
                              "created_at"],
        "artifact_snapshots": ["activation_id", "project", "agent_id", "upto_seq", "changes", "bytes",
                               "created_at"],
    }
    for table, columns in expected.items():
        assert [c["name"] for c in rows(store, f"PRAGMA table_info({table})")] == columns, table
    indexes = {
        "idx_messages_project_created": ["project", "created_at"],
        "idx_signals_project_target": ["project", "target_agent", "status", "created_at"],
        "idx_signals_project_target_ready": ["project", "target_agent", "status", "not_before", "created_at"],
        "idx_signals_project_source": ["project", "source_activation", "useful_effect"],
        "idx_activations_project_started": ["project", "started_at"],
        "idx_events_project_created": ["project", "created_at"],
        "idx_agent_history_project_agent_sequence": ["project", "agent_id", "sequence"],
        "idx_agent_history_project_agent_active": ["project", "agent_id", "compaction_id", "sequence"],
        "idx_agent_history_parts_message": ["project", "message_id", "part_index"],
        "idx_agent_history_compactions_agent": ["project", "agent_id", "created_at"],
        "idx_model_calls_project_activation": ["project", "activation_id"],
        "idx_approvals_project_status": ["project", "status", "created_at"],
        "idx_approvals_project_activation": ["project", "activation_id", "status"],
        "idx_approvals_project_grant": ["project", "agent_id", "rule_key", "decision"],
        "idx_tool_calls_activation_call_key": ["activation_id", "call_key"],
        "idx_model_exchanges_activation_index": ["activation_id", "request_index"],
        "idx_artifact_versions_agent_path": ["project", "agent_id", "path", "seq"],
        "idx_artifact_versions_activation": ["activation_id"],
        "idx_messages_project_idempotency_key": ["project", "idempotency_key"],
        "idx_signals_project_delivered": ["project", "delivered_activation_id"],
    }
    for name, columns in indexes.items():
        assert [c["name"] for c in rows(store, f"PRAGMA index_info({name})")] == columns, name
    unique = {r["name"]: r["unique"] for r in rows(store, "PRAGMA index_list(agent_history_messages)")}
    assert unique["idx_agent_history_project_agent_sequence"] == 1
    assert {r["name"]: r["unique"] for r in rows(store, "PRAGMA index_list(tool_calls)")}[
        "idx_tool_calls_activation_call_key"] == 1
    assert {r["name"]: r["unique"] for r in rows(store, "PRAGMA index_list(messages)")}[
        "idx_messages_project_idempotency_key"] == 1
    assert store.db_get("PRAGMA journal_mode")["journal_mode"] == "wal"
    assert store.db_get("PRAGMA foreign_keys")["foreign_keys"] == 1
    schema = rows(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    store.close()
    again = st.ProjectStore("blank", tmp_path)
    assert rows(again, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert count(again, "_migrations") == 13
    again.close()


def test_a_database_of_the_second_schema_gains_the_approvals_table_on_open(tmp_path):
    store = st.ProjectStore("older", tmp_path)
    with store.write() as tx:
        tx.execute("DROP TABLE approvals")
        tx.execute("DELETE FROM _migrations WHERE id = 3")
    store.close()
    again = st.ProjectStore("older", tmp_path)
    assert [r["id"] for r in rows(again, "SELECT id FROM _migrations ORDER BY id")] == list(range(1, 14))
    assert count(again, "approvals") == 0
    again.close()


def test_a_database_of_the_first_schema_gains_the_model_calls_table_on_open(tmp_path):
    store = st.ProjectStore("older", tmp_path)
    with store.write() as tx:
        tx.execute("DROP TABLE model_calls")
        tx.execute("DELETE FROM _migrations WHERE id IN (2, 4, 11)")
    store.close()
    again = st.ProjectStore("older", tmp_path)
    assert [r["id"] for r in rows(again, "SELECT id FROM _migrations ORDER BY id")] == list(range(1, 14))
    assert count(again, "model_calls") == 0
    again.close()


EXPECTED_SCHEMA = Path(__file__).parent / "schema" / "expected.sql"


def schema_text(store):
    """The database's schema in the layout of tests/schema/expected.sql."""
    lines = [line for line in EXPECTED_SCHEMA.read_text(encoding="utf-8").splitlines()[:3]] + [""]
    for row in rows(store, "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                           "ORDER BY type, name"):
        lines += [f"-- {row['type']} {row['name']} on {row['tbl_name']}", row["sql"] + ";", ""]
    return "\n".join(lines)


def test_a_blank_database_has_the_checked_in_schema(tmp_path):
    store = st.ProjectStore("blank", tmp_path)
    assert schema_text(store) == EXPECTED_SCHEMA.read_text(encoding="utf-8")
    store.close()


def test_frozen_migration_1_then_the_later_migrations_give_the_same_schema(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "MIGRATIONS", st.MIGRATIONS[:1])  # a database made by the first release
    first = st.ProjectStore("old", tmp_path)
    assert [r["id"] for r in rows(first, "SELECT id FROM _migrations")] == [1]
    first.close()
    monkeypatch.undo()
    upgraded = st.ProjectStore("old", tmp_path)
    assert [r["id"] for r in rows(upgraded, "SELECT id FROM _migrations ORDER BY id")] == \
        [number for number, _, _ in st.MIGRATIONS]
    assert schema_text(upgraded) == EXPECTED_SCHEMA.read_text(encoding="utf-8")
    upgraded.close()


def test_migration_1_is_literal_sql_whose_checks_match_the_status_constants(tmp_path):
    # Frozen text: no statement is built from a live constant, so adding a status cannot rewrite it ...
    assert all(isinstance(statement, str) for statement in st.MIGRATIONS[0][2])
    source = Path(st.__file__).read_text(encoding="utf-8")
    frozen = source[source.index("_MIGRATION_1 = ["):source.index("_MIGRATION_2 = [")]
    assert "{" not in frozen.replace("'{}'", "") and 'f"""' not in frozen
    # ... and the constants the code writes are exactly what the schema accepts (a new status needs a
    # new migration, and this test says so).
    store = st.ProjectStore("blank", tmp_path)
    checks = {}
    for row in rows(store, "SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
        for column, values in re.findall(r"(\w+) TEXT NOT NULL CHECK \(\w+ IN \(([^)]*)\)\)", row["sql"]):
            checks[(row["name"], column)] = tuple(v.strip().strip("'") for v in values.split(","))
    store.close()
    assert checks == {
        ("projects", "status"): rec.PROJECT_STATUSES, ("agents", "status"): rec.AGENT_STATUSES,
        ("messages", "priority"): rec.PRIORITIES, ("signals", "priority"): rec.PRIORITIES,
        ("signals", "status"): rec.SIGNAL_STATUSES, ("activations", "status"): rec.ACTIVATION_STATUSES,
        ("tool_calls", "status"): rec.TOOL_CALL_STATUSES, ("agent_history_messages", "role"): rec.HISTORY_ROLES,
        ("approvals", "status"): suzumio_approvals.APPROVAL_STATUSES,
        ("effects", "state"): rec.EFFECT_STATES,
        ("effects", "executor"): (suzumio_effects.RUNNER, suzumio_effects.CONTROLLER),
        ("approvals", "on_expiry"): (suzumio_approvals.ALLOW, suzumio_approvals.DENY),
        ("project_origins", "kind"): (suzumio_replay.KIND_REPLAY, suzumio_replay.KIND_FORK),
        ("merge_requests", "status"): suzumio_store_repository.MERGE_STATUSES}


# -- ids, timestamps ----------------------------------------------------------------------------

def test_ids_and_timestamps_have_the_documented_format(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.send_message(demo, config_of(demo), "worker", "hi", recipient="pm", source_agent="worker",
                              source_activation=act["id"])
    call = demo.start_tool_call("worker", act["id"], "shell.exec", {"cmd": "ls"})
    for _ in range(15):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", "x")
    coordination.compact_history(demo, "worker", act["id"], "summary", keep_tail=2)
    ids = [r["id"] for t in ("activations", "messages", "signals", "tool_calls", "events",
                             "agent_history_messages", "agent_history_parts", "agent_history_compactions")
           for r in rows(demo, f"SELECT id FROM {t}")]
    assert {i.split("_")[0] for i in ids} == {"act", "msg", "sig", "tool", "evt", "hist", "hpart", "cmp"}
    assert all(ID_RE.match(i) for i in ids), [i for i in ids if not ID_RE.match(i)]
    stamps = [r["created_at"] for r in rows(demo, "SELECT created_at FROM events")]
    stamps += [r["started_at"] for r in rows(demo, "SELECT started_at FROM activations")]
    assert all(TS_RE.match(s) for s in stamps)
    assert call["toolCallId"].startswith("tool_")
    assert rec.format_ts(rec.parse_ts("2026-06-02T09:15:03.042Z")) == "2026-06-02T09:15:03.042Z"
    assert rec.new_id("msg", "2026-01-01T00:00:00.123Z").startswith("msg_1767225600123_")
    assert TS_RE.match(rec.now_ts())


def test_ids_of_one_millisecond_never_repeat_and_one_write_takes_thousands_of_events(demo):
    """A transaction stamps every row with one time: its ids differ only in their 32 random bits, which
    200,000 draws would repeat a few times over (about 4.7 expected pairs) if nothing stopped them."""
    ids = [rec.new_id("evt", "2026-01-01T00:00:00.123Z") for _ in range(200_000)]
    assert len(set(ids)) == len(ids) and all(ID_RE.match(i) for i in ids[:100])
    with demo.write() as tx:
        for index in range(5000):
            demo.add_event(tx, "bulk", {"n": index})
    assert rows(demo, "SELECT COUNT(*) AS n FROM events WHERE type = 'bulk'") == [{"n": 5000}]


# -- messages -----------------------------------------------------------------------------------


def test_list_messages_newest_window_oldest_first_and_truncated(demo):
    for i in range(5):
        coordination.send_message(demo, config_of(demo), "user", f"m{i}", recipient="pm", now=at(i))
    coordination.send_message(demo, config_of(demo), "user", "x" * 13000, recipient="pm", now=at(10))
    listed = demo.list_messages(3)
    assert [m["body"][:2] for m in listed] == ["m3", "m4", "xx"]
    assert listed[-1]["body"].endswith("[truncated 1000 chars]")
    assert len(demo.list_messages(3, full_body=True)[-1]["body"]) == 13000
    with pytest.raises(NotFound, match=r"^Unknown message: msg_x$"):
        demo.message("msg_x")


# -- signals ------------------------------------------------------------------------------------


# -- activations --------------------------------------------------------------------------------


def test_every_agent_status_change_appends_one_event_and_touches_updated_at(demo):
    def statuses():
        return [json.loads(e["data_json"]) for e in reversed(demo.list_events(1000))
                if e["type"] == "agent.status"]
    act = coordination.start_activation(demo, "worker", "p", [], now=at(1))
    assert demo.agent("worker")["updatedAt"] == at(1)
    demo.set_activation_container(act["id"], "local-123", now=at(2))
    assert demo.agent("worker")["containerName"] == "local-123"
    assert demo.activation(act["id"])["containerName"] == "local-123"
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "ok", now=at(3))
    assert demo.agent("worker")["updatedAt"] == at(3)
    act2 = coordination.start_activation(demo, "worker", "p", [], now=at(4))
    coordination.fail_activation(demo, act2["id"], "boom", now=at(5))
    assert statuses() == [
        {"agentId": "worker", "status": "running", "activeActivationId": act["id"]},
        {"agentId": "worker", "status": "running", "activeActivationId": act["id"]},
        {"agentId": "worker", "status": "quiet", "activeActivationId": None},
        {"agentId": "worker", "status": "running", "activeActivationId": act2["id"]},
        {"agentId": "worker", "status": "failed", "activeActivationId": None},
    ]
    assert demo.agent("worker")["updatedAt"] == at(5)


def test_stale_binding_is_cleared_to_quiet_or_failed(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    assert demo.clear_stale_binding("worker") is None
    # a completed activation still bound to a running agent (e.g. written by an older process)
    demo.db_run("UPDATE activations SET status = 'completed' WHERE id = ?", [act["id"]])
    assert demo.clear_stale_binding("worker") == "quiet"
    assert demo.agent("worker")["status"] == "quiet" and "activeActivationId" not in demo.agent("worker")
    act2 = coordination.start_activation(demo, "worker", "p", [])
    demo.db_run("UPDATE activations SET status = 'failed' WHERE id = ?", [act2["id"]])
    assert demo.clear_stale_binding("worker") == "failed"
    assert demo.clear_stale_binding("worker") is None


def test_idle_reset_only_from_ready(demo):
    with pytest.raises(Conflict):
        demo.set_agent_status("worker", "quiet")
    demo.db_run("UPDATE agents SET status = 'ready' WHERE id = 'worker'")
    assert demo.set_agent_status("worker", "quiet")["status"] == "quiet"
    with pytest.raises(BadRequest):
        demo.set_agent_status("worker", "running")


def test_activation_context_snapshot_and_fallback(demo):
    act = coordination.start_activation(demo, "worker", "PROMPT", [])
    fallback = demo.activation_context(act["id"])
    assert fallback["activationPrompt"] == "PROMPT"
    assert fallback["context"]["messages"] == [{"role": "user", "content": "PROMPT", "chars": 6}]
    with pytest.raises(BadRequest, match=r"^Invalid activation context$"):
        demo.record_activation_context(act["id"], "worker", {"version": 2, "kind": "model-context",
                                                             "messages": []})
    context = {"version": 1, "kind": "model-context", "messages": [{"role": "user", "content": "abc"}]}
    assert demo.record_activation_context(act["id"], "worker", context)["status"] == "recorded"
    assert demo.activation_context(act["id"])["context"] == context
    assert demo.latest_event("activation.context_recorded")["data"] == {
        "activationId": act["id"], "agentId": "worker", "messageCount": 1, "totalChars": 3}
    public = demo.list_activations(10)[0]
    assert public["hasContext"] is True and "prompt" not in public and "usageJson" not in public


# -- no-effect nudge (docs/design/scheduler.md) --------------------------------------------------------


# -- tool calls ---------------------------------------------------------------------------------


# -- core tool effects --------------------------------------------------------------------------


# -- stop / approve / start / request changes ---------------------------------------------------


# -- history ------------------------------------------------------------------------------------


# -- listings, stats, events, facade ------------------------------------------------------------

def test_tokens_are_redacted_from_listings(demo):
    tokens = [a["token"] for a in demo.list_agents(include_tokens=True)]
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    listings = json.dumps([demo.list_agents(), demo.public_agents(), demo.agent("pm"), demo.list_events(500),
                           demo.project_summary(), demo.project_summary(full=False)])
    assert not any(t in listings for t in tokens)
    public = demo.public_agents()[0]
    assert "prompt" not in public and public["promptChars"] == len("You coordinate.")
    assert demo.check_agent_token("pm", tokens[0])["id"] == "pm"
    with pytest.raises(Forbidden, match=r"^Invalid agent token$"):
        demo.check_agent_token("pm", tokens[1])
    with pytest.raises(NotFound, match=r"^Unknown agent: ghost$"):
        demo.check_agent_token("ghost", tokens[0])


def test_project_stats_and_summary_shapes(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.send_message(demo, config_of(demo), "user", "hello", recipient="pm")
    call = demo.start_tool_call("worker", act["id"], "shell.exec")
    coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "x")
    act2 = coordination.start_activation(demo, "pm", "p", [])
    coordination.fail_activation(demo, act2["id"], "boom")
    stats = demo.project_stats()
    assert list(stats) == ["messageCount", "activationCount", "failedActivationCount",
                           "runningActivationCount", "toolCallCount", "historyMessageCount",
                           "historyCompactionCount", "eventCount"]
    assert (stats["messageCount"], stats["activationCount"], stats["failedActivationCount"],
            stats["runningActivationCount"], stats["toolCallCount"]) == (1, 2, 1, 1, 1)
    assert stats["eventCount"] == count(demo, "events")
    summary = demo.project_summary()
    assert [a["id"] for a in summary["recentActivations"]] == [act["id"], act2["id"]]
    assert summary["recentMessages"][0]["body"] == "hello"
    light = demo.project_summary(full=False)
    assert light["recentActivations"] == [] and light["recentMessages"] == []


def test_events_after_cursor_and_replay(demo):
    replay, cursor = demo.event_replay(2)
    assert [row["type"] for _, row in replay] == ["project.initialized", "project.status"]
    coordination.send_message(demo, config_of(demo), "user", "a", recipient="pm")
    after = demo.events_after(cursor)
    assert [row["type"] for _, row in after] == ["message.created", "signal.created"]
    assert [rowid for rowid, _ in after] == sorted(rowid for rowid, _ in after)
    assert demo.event_rowid(after[0][1]["id"]) == after[0][0]
    assert demo.event_rowid("evt_missing") is None
    assert demo.events_after(after[-1][0]) == []
    assert set(after[0][1]) == {"id", "project", "type", "data_json", "created_at"}
    demo.append_event("custom.thing", {"body": "b" * 5000})
    shrunk = demo.list_events(1, shrink_data=True)[0]
    assert json.loads(shrunk["data_json"])["body"].endswith("[truncated 1000 chars]")


def test_db_facade_reads_and_writes(demo):
    assert demo.db_get("SELECT COUNT(*) AS n FROM agents")["n"] == 3
    assert demo.db_get("SELECT * FROM agents WHERE id = ?", ["ghost"]) is None
    result = demo.db_run("UPDATE agents SET prompt = ? WHERE id = ?", ["new", "pm"])
    assert result["changes"] == 1
    assert demo.db_all("SELECT prompt FROM agents WHERE id = 'pm'") == [{"prompt": "new"}]


def test_render_signal_kinds():
    message = {"id": "sig_1", "kind": "message.created", "priority": "P3", "createdAt": T0,
               "payload": {"id": "msg_1", "sender": "user", "recipient": "pm", "priority": "P3",
                           "createdAt": T0, "body": "  Hello  "}}
    assert rec.render_signal(message) == "The user says: Hello"
    channel = {**message, "targetChannel": "#project", "priority": "P2",
               "payload": {"id": "msg_2", "sender": "worker", "channel": "#project", "body": "x"}}
    assert rec.render_signal(channel) == "worker says in #project (P2): x"
    custom = {"id": "sig_3", "kind": "review.ready", "priority": "P2", "createdAt": T0, "payload": {"a": 1}}
    assert rec.render_signal(custom) == f'Signal sig_3 of kind "review.ready" (P2), {T0}: {{"a": 1}}'
    nudge = {"id": "sig_4", "kind": "scheduler.failed_nudge", "priority": "P2", "payload": {}}
    assert rec.render_signal(nudge) == ("Reminder from the scheduler (P2): Your previous activation failed. Retry "
                                        "from the existing history and workspace.")


# -- transactions and threads -------------------------------------------------------------------

def test_failure_in_the_middle_of_a_fan_out_leaves_database_unchanged(demo):
    demo.db_run("CREATE TRIGGER refuse_verifier BEFORE INSERT ON signals WHEN NEW.target_agent = 'verifier' "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END")
    before = snapshot(demo)
    with pytest.raises(sqlite3.IntegrityError, match="refused"):
        coordination.send_message(demo, config_of(demo), "user", "to all", channel="#project")
    assert snapshot(demo) == before
    act = coordination.start_activation(demo, "worker", "p", [])
    demo.db_run("CREATE TRIGGER refuse_resume BEFORE INSERT ON signals WHEN NEW.kind = "
                "'scheduler.resume_after_stop' BEGIN SELECT RAISE(ABORT, 'no resume'); END")
    before = snapshot(demo)
    with pytest.raises(sqlite3.IntegrityError, match="no resume"):
        coordination.stop(demo)
    assert snapshot(demo) == before
    assert demo.activation(act["id"])["status"] == "running"


def test_concurrent_writers_and_reader_lose_nothing(demo):
    per_thread, errors = 40, []
    stop_reading = threading.Event()

    def writer(n):
        try:
            for i in range(per_thread):
                coordination.send_message(demo, config_of(demo), "user", f"t{n}-{i}", recipient="pm")
        except (sqlite3.Error, SuzumioError) as exc:  # collected and asserted below
            errors.append(exc)

    def reader():
        try:
            while not stop_reading.is_set():
                demo.list_messages(50)
                demo.project_stats()
        except (sqlite3.Error, SuzumioError) as exc:
            errors.append(exc)

    watcher = threading.Thread(target=reader)
    watcher.start()
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=60)
    stop_reading.set()
    watcher.join(timeout=10)
    assert errors == []
    assert count(demo, "messages") == 8 * per_thread
    assert count(demo, "signals") == 8 * per_thread
    bodies = {r["body"] for r in rows(demo, "SELECT body FROM messages")}
    assert bodies == {f"t{n}-{i}" for n in range(8) for i in range(per_thread)}
    stamps = [r["created_at"] for r in rows(demo, "SELECT created_at FROM messages ORDER BY rowid")]
    assert stamps == sorted(stamps)


def test_grouped_sends_commit_together_and_a_failing_one_rolls_back_alone(demo):
    # The sends queue while this thread holds the write lock; the first to take it then writes all of
    # them in one transaction. The send to an unknown agent fails in its own caller only.
    outcomes, threads = {}, []

    def sender(name, recipient):
        try:
            outcomes[name] = coordination.send_message(demo, config_of(demo), "user", name, recipient=recipient,
                                                       grouped=True)
        except SuzumioError as error:
            outcomes[name] = error

    commits = demo.commits
    with demo.write():
        for name, recipient in (("first", "pm"), ("refused", "nobody"), ("third", "worker")):
            threads.append(threading.Thread(target=sender, args=(name, recipient)))
            threads[-1].start()
        wait_until(lambda: len(demo._grouped) == 3, message="three sends waiting for the write lock")
    for thread in threads:
        thread.join(timeout=30)
    assert outcomes["first"]["body"] == "first" and outcomes["third"]["recipient"] == "worker"
    assert isinstance(outcomes["refused"], BadRequest) and "Unknown agent: nobody" in str(outcomes["refused"])
    assert demo.commits == commits + 2  # the empty write above, then one for all three sends
    assert sorted(r["body"] for r in rows(demo, "SELECT body FROM messages")) == ["first", "third"]
    assert count(demo, "signals") == 2
    events = rows(demo, "SELECT data_json FROM events WHERE type = 'message.created'")
    assert sorted(json.loads(e["data_json"])["body"] for e in events) == ["first", "third"]
    assert demo.event_watermark == rows(demo, "SELECT MAX(rowid) AS m FROM events")[0]["m"]


def test_grouped_sends_from_many_threads_lose_nothing_and_keep_rowid_order(demo):
    per_thread, errors = 30, []

    def writer(n):
        try:
            for i in range(per_thread):
                coordination.send_message(demo, config_of(demo), "user", f"t{n}-{i}", recipient="pm", grouped=True)
        except (sqlite3.Error, SuzumioError) as exc:  # collected and asserted below
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=60)
    assert errors == []
    bodies = {r["body"] for r in rows(demo, "SELECT body FROM messages")}
    assert bodies == {f"t{n}-{i}" for n in range(8) for i in range(per_thread)}
    assert count(demo, "signals") == 8 * per_thread
    stamps = [r["created_at"] for r in rows(demo, "SELECT created_at FROM messages ORDER BY rowid")]
    assert stamps == sorted(stamps)


def test_a_grouped_send_inside_an_open_write_joins_it(demo):
    with pytest.raises(BadRequest), demo.write():
        coordination.send_message(demo, config_of(demo), "user", "joined", recipient="pm", grouped=True)
        raise BadRequest("roll it all back")
    assert count(demo, "messages") == 0


def test_two_stores_on_one_file_do_not_double_start(tmp_path):
    root, store = init_demo(tmp_path / "root")
    other = st.ProjectStore("demo", store.dir)  # a second process's view of the same database
    coordination.start_activation(store, "worker", "p", [])
    with pytest.raises(Conflict):
        coordination.start_activation(other, "worker", "p", [])
    assert len(other.running_activations()) == 1
    other.close()
    root.close()


def test_close_is_idempotent_and_blocks_further_use(tmp_path):
    root, store = init_demo(tmp_path / "root")
    store.close()
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        coordination.send_message(store, config_of(store), "user", "x", recipient="pm")
    root.close()
    root.close()


# -- scheduler-facing reads ---------------------------------------------------------------------

def test_the_typed_config_supplies_the_defaults_the_rules_read():
    bare = suzumio_config.ProjectConfig.from_data({"name": "x", "task": "t", "agents": {"pm": {}}})
    assert bare.communication.coordinator_agent == "pm" and bare.channels == ("#project", "#blocked")
    assert bare.scheduler.max_signals_per_activation == 20
    legacy = suzumio_config.ProjectConfig.from_data(
        {"name": "x", "task": "t", "agents": {"pm": {}}, "scheduler": {"maxPromptMessages": 7}})
    assert legacy.scheduler.max_signals_per_activation == 7


def test_reads_used_by_the_scheduler(demo):
    assert not demo.agent_has_activations("worker")
    (signal,) = coordination.record_signal(demo, config_of(demo), "scheduler.failed_nudge", target_agent="worker",
                                           priority="P2",
                                           payload={"attempt": 1}, now=at(1))
    act = coordination.start_activation(demo, "worker", "p", [signal], now=at(2))
    assert demo.agent_has_activations("worker")
    assert demo.model_alive_agents() == ["worker"]
    assert [s["id"] for s in demo.signals_delivered_to(act["id"], "scheduler.failed_nudge")] == [signal["id"]]
    coordination.fail_activation(demo, act["id"], "boom", now=at(3))
    assert demo.latest_failed_activation("worker")["id"] == act["id"]
    assert demo.latest_failed_activation("pm") is None
    assert demo.model_alive_agents() == []
    assert demo.latest_signal("scheduler.failed_nudge", "worker")["id"] == signal["id"]
    assert demo.latest_signal("scheduler.all_quiet_nudge", "pm") is None
    demo.append_event("scheduler.quiet_agent_monitor.message_sent",
                      {"ruleKey": "r", "agent": "pm", "attempt": 1})
    demo.append_event("scheduler.quiet_agent_monitor.message_sent", {"ruleKey": "r", "agent": "worker",
                                                                     "attempt": 2})
    found = demo.latest_event("scheduler.quiet_agent_monitor.message_sent", {"ruleKey": "r", "agent": "pm"})
    assert found["data"]["attempt"] == 1
    assert demo.latest_event("scheduler.quiet_agent_monitor.message_sent", {"agent": "verifier"}) is None
    assert {(c["status"], c["priority"]) for c in demo.signal_counts()} == {("delivered", "P2")}


def test_direct_message_listing_between_two_participants(demo):
    coordination.send_message(demo, config_of(demo), "user", "1", recipient="pm", now=at(1))
    coordination.send_message(demo, config_of(demo), "pm", "2", recipient="user", now=at(2))
    coordination.send_message(demo, config_of(demo), "pm", "3", recipient="worker", now=at(3))
    coordination.send_message(demo, config_of(demo), "user", "4", channel="#project", now=at(4))
    assert [m["body"] for m in demo.direct_messages("user", "pm")] == ["2", "1"]
    assert [m["body"] for m in demo.direct_messages()] == ["3", "2", "1"]


def test_runner_checks_for_activation_ownership_and_state(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    assert demo.require_activation("worker", act["id"], running_for="tool")["id"] == act["id"]
    with pytest.raises(Forbidden, match=f"^Activation {act['id']} does not belong to pm$"):
        demo.require_activation("pm", act["id"])
    with pytest.raises(NotFound, match=r"^Unknown activation: act_x$"):
        demo.require_activation("worker", "act_x")
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    assert demo.require_activation("worker", act["id"])["status"] == "completed"
    with pytest.raises(Conflict, match="history updates are not accepted"):
        demo.require_activation("worker", act["id"], running_for="history")


def test_core_tools_refused_after_activation_ended(demo):
    act = coordination.start_activation(demo, "pm", "p", [])
    coordination.complete_activation(demo, config_of(demo), act["id"], "pm", "done")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="no more tool calls are accepted"):
        coordination.submit_report(demo, "pm", act["id"], "late report")
    with pytest.raises(Conflict, match="no more tool calls are accepted"):
        coordination.declare_wait(demo, config_of(demo), "pm", act["id"])
    assert snapshot(demo) == before
    assert not (demo.dir / "final-report.md").exists()
    assert [p.name for p in demo.dir.iterdir() if p.name.startswith(".final-report")] == []


# ---------------------------------------------------------------- bounded connections

def test_readers_are_pooled_so_connections_never_grow_with_threads(tmp_path):
    root, _store = init_demo(tmp_path / "root")
    stores = [root.open_project("demo")]
    for index in range(5):
        config = make_config(name=f"p{index}")
        stores.append(root.init_project(config["name"], config["task"], config, expanded_agents(config),
                                        "x\n", "x\n", now=T0))
    root.max_open = 3
    errors = []

    def reader():
        try:
            for _ in range(20):
                for store in stores:
                    store.project_summary(full=False)
        except (sqlite3.Error, SuzumioError, RuntimeError) as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    # 16 threads x 6 projects kept 96+ connections open before; now the open-project cap bounds them.
    assert root.open_connections() <= root.max_open * (1 + st.IDLE_READERS)
    assert sum(store.open_connections() > 0 for store in stores) <= root.max_open
    root.close()


def test_a_released_store_reopens_its_connections_on_demand(demo):
    coordination.send_message(demo, config_of(demo), "user", "before", recipient="pm")
    assert demo.release_idle() is True
    assert demo.open_connections() == 0
    coordination.send_message(demo, config_of(demo), "user", "after", recipient="pm")
    assert sorted(m["body"] for m in demo.list_messages(10)) == ["after", "before"]


def test_read_connections_refuse_writes_so_a_read_path_changes_nothing(demo):
    before = count(demo, "events")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        demo.db_all("DELETE FROM events")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        demo.db_get("UPDATE projects SET status = 'failed'")
    assert count(demo, "events") == before
    assert demo.project()["status"] == "running"


def test_project_summaries_follow_writes_from_this_process_and_others(tmp_path):
    """The project list's summaries are cached per project and computed again after any commit: one made
    through the same root (its version) or through another root on the same files (another process)."""
    root, store = init_demo(tmp_path)
    other = st.Root(tmp_path)
    try:
        def message_count():
            return root.project_summaries()[0]["stats"]["messageCount"]

        assert message_count() == 0
        elsewhere = other.open_project("demo")
        coordination.send_message(elsewhere, config_of(elsewhere), "user", "from another process", recipient="pm")
        assert message_count() == 1  # the WAL just changed: not served from the cache
        root.clock_ns = lambda: time.time_ns() + 2_000_000_000  # the files settle: cached from now on
        first = root.project_summaries()[0]
        assert root.project_summaries()[0] is first and first["stats"]["messageCount"] == 1
        coordination.send_message(store, config_of(store), "user", "from this process", recipient="pm")
        assert message_count() == 2  # this root's version moved
        root.project_summaries()
        coordination.send_message(elsewhere, config_of(elsewhere), "user", "again", recipient="pm")
        assert message_count() == 3
        store.close()
        shutil.rmtree(tmp_path / "demo")
        assert root.project_summaries() == []
    finally:
        other.close()
        root.close()


def test_event_cursors_and_budget_reads_never_walk_every_event(demo):
    """Each project has its own file, so (project, created_at) matches every event: the rowid cursors walk
    the rowids, the budget's reads seek their types, and none of them sorts."""
    with demo.snapshot() as conn:
        statements = []
        conn.set_trace_callback(statements.append)
        try:
            demo.events_after(0, 500)
            demo.event_replay(100)
            demo.latest_event_rowid()
            demo.window_usage()
            demo.budget_warned()
        finally:
            conn.set_trace_callback(None)
        plans = {sql: " | ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
                 for sql in statements if " events" in sql}
    assert len(plans) >= 5, plans
    for sql, plan in plans.items():
        assert "TEMP B-TREE" not in plan and "idx_events_project_created" not in plan, (sql, plan)
        assert "INTEGER PRIMARY KEY" in plan or "idx_events_project_type" in plan or \
            ("ORDER BY rowid DESC LIMIT" in sql and plan.startswith("SCAN events")), (sql, plan)
