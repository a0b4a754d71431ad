"""Store tests on a real SQLite file: store.md §9 acceptance scenarios plus transactions and threads."""
import json
import re
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from store_fixtures import T0, at, config_of, expanded_agents, init_demo, make_config

import suzumio_approvals
import suzumio_config
import suzumio_coordination as coordination
import suzumio_records as rec
import suzumio_replay
import suzumio_store as st
from suzumio_errors import BadRequest, Conflict, Forbidden, NotFound, SuzumioError

ID_RE = re.compile(r"^(act|msg|sig|tool|evt|hist|hpart|cmp)_\d{13}_[0-9a-f]{8}$")
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def demo(tmp_path):
    root, store = init_demo(tmp_path / "root")
    yield store
    root.close()


def rows(store, sql, params=()):
    return store.db_all(sql, params)


def count(store, table, where="1=1", params=()):
    return store.db_get(f"SELECT COUNT(*) AS n FROM {table} WHERE {where}", params)["n"]


def snapshot(store):
    """Every row of every table, to compare before/after a rejected operation."""
    tables = [r["name"] for r in rows(store, "SELECT name FROM sqlite_master WHERE type='table'")]
    return {t: rows(store, f"SELECT * FROM {t} ORDER BY rowid") for t in tables}


def event_types(store):
    return [e["type"] for e in reversed(store.list_events(1000))]


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
                          {"id": 7, "name": "flight recorder"}]
    expected = {
        "projects": ["id", "name", "status", "task", "config_json", "submitted_report", "created_at",
                     "updated_at"],
        "agents": ["id", "project", "role", "display_name", "status", "prompt", "model", "tools_json",
                   "workspace_path", "token", "active_activation_id", "container_name", "created_at",
                   "updated_at"],
        "messages": ["id", "project", "sender", "recipient", "channel", "priority", "body", "created_at"],
        "signals": ["id", "project", "kind", "source_agent", "source_activation", "target_agent",
                    "target_channel", "priority", "payload_json", "status", "useful_effect", "created_at",
                    "not_before", "delivered_at", "delivered_activation_id"],
        "activations": ["id", "project", "agent_id", "status", "prompt", "input_path", "output_path",
                        "container_name", "started_at", "completed_at", "text", "error", "emitted_messages",
                        "usage_json", "context_json"],
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
                        "tokens", "usage_json", "created_at", "cost_usd"],
        "approvals": ["id", "project", "agent_id", "activation_id", "tool_call_id", "tool", "input_json",
                      "rule_json", "rule_key", "status", "decision", "decided_by", "note", "on_expiry",
                      "expires_at", "created_at", "decided_at", "used_at"],
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
    }
    for name, columns in indexes.items():
        assert [c["name"] for c in rows(store, f"PRAGMA index_info({name})")] == columns, name
    unique = {r["name"]: r["unique"] for r in rows(store, "PRAGMA index_list(agent_history_messages)")}
    assert unique["idx_agent_history_project_agent_sequence"] == 1
    assert {r["name"]: r["unique"] for r in rows(store, "PRAGMA index_list(tool_calls)")}[
        "idx_tool_calls_activation_call_key"] == 1
    assert store.db_get("PRAGMA journal_mode")["journal_mode"] == "wal"
    assert store.db_get("PRAGMA foreign_keys")["foreign_keys"] == 1
    schema = rows(store, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    store.close()
    again = st.ProjectStore("blank", tmp_path)
    assert rows(again, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert count(again, "_migrations") == 7
    again.close()


def test_a_database_of_the_second_schema_gains_the_approvals_table_on_open(tmp_path):
    store = st.ProjectStore("older", tmp_path)
    with store.write() as tx:
        tx.execute("DROP TABLE approvals")
        tx.execute("DELETE FROM _migrations WHERE id = 3")
    store.close()
    again = st.ProjectStore("older", tmp_path)
    assert [r["id"] for r in rows(again, "SELECT id FROM _migrations ORDER BY id")] == [1, 2, 3, 4, 5, 6, 7]
    assert count(again, "approvals") == 0
    again.close()


def test_a_database_of_the_first_schema_gains_the_model_calls_table_on_open(tmp_path):
    store = st.ProjectStore("older", tmp_path)
    with store.write() as tx:
        tx.execute("DROP TABLE model_calls")
        tx.execute("DELETE FROM _migrations WHERE id IN (2, 4)")
    store.close()
    again = st.ProjectStore("older", tmp_path)
    assert [r["id"] for r in rows(again, "SELECT id FROM _migrations ORDER BY id")] == [1, 2, 3, 4, 5, 6, 7]
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
        ("approvals", "on_expiry"): (suzumio_approvals.ALLOW, suzumio_approvals.DENY),
        ("project_origins", "kind"): (suzumio_replay.KIND_REPLAY, suzumio_replay.KIND_FORK)}


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


# -- messages -----------------------------------------------------------------------------------

def test_direct_message_defaults_to_p3_with_one_pending_signal(demo):
    message = coordination.send_message(demo, config_of(demo), "user", "Start", recipient="pm")
    assert message["priority"] == "P3"
    assert set(message) == {"id", "project", "sender", "recipient", "priority", "body", "createdAt"}
    signals = demo.list_signals(target_agent="pm")
    assert len(signals) == 1
    assert signals[0]["status"] == "pending" and signals[0]["priority"] == "P3"
    assert signals[0]["payload"] == message and signals[0]["usefulEffect"] is True
    assert event_types(demo)[-2:] == ["message.created", "signal.created"]
    assert demo.message(message["id"]) == message


@pytest.mark.parametrize("kwargs, error", [
    ({"recipient": "pm", "channel": "#project"}, "Message cannot have both recipient and channel"),
    ({}, "Message needs recipient or channel"),
    ({"recipient": "ghost"}, "Unknown agent: ghost"),
    ({"channel": "#nope"}, "Unknown channel: #nope"),
])
def test_invalid_message_routing_writes_nothing(demo, kwargs, error):
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=f"^{re.escape(error)}$"):
        coordination.send_message(demo, config_of(demo), "user", "x", **kwargs)
    assert snapshot(demo) == before


def test_message_validation_order_body_priority_then_recipient(demo):
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^body is required$"):
        coordination.send_message(demo, config_of(demo), "user", None, recipient="ghost", priority="P9")
    with pytest.raises(BadRequest, match=r"^Invalid priority: P9$"):
        coordination.send_message(demo, config_of(demo), "user", "x", recipient="ghost", priority="P9")
    with pytest.raises(BadRequest, match=r"^Unknown agent: ghost$"):
        coordination.send_message(demo, config_of(demo), "user", "x", recipient="ghost", priority="P2")
    assert snapshot(demo) == before


def test_message_to_user_is_one_closed_useful_signal(demo):
    coordination.send_message(demo, config_of(demo), "pm", "Done", recipient="user", source_agent="pm")
    signals = demo.list_signals()
    assert len(signals) == 1
    assert signals[0]["status"] == "closed" and "targetAgent" not in signals[0]
    assert signals[0]["usefulEffect"] is True
    assert not demo.has_pending_signals()


def test_channel_fan_out_excludes_source_agent(demo):
    coordination.send_message(demo, config_of(demo), "worker", "note", channel="#project", source_agent="worker")
    pending = demo.list_signals(status="pending")
    assert sorted(s["targetAgent"] for s in pending) == ["pm", "verifier"]
    assert {s["targetChannel"] for s in pending} == {"#project"}
    coordination.send_message(demo, config_of(demo), "user", "all", channel="#project")
    assert len(demo.list_signals(status="pending")) == 5


def test_channel_with_no_remaining_agent_records_one_closed_signal(tmp_path):
    root, store = init_demo(tmp_path / "root", make_config(agents={"solo": {}}))
    coordination.send_message(store, config_of(store), "solo", "me", channel="#project", source_agent="solo")
    signals = store.list_signals()
    assert len(signals) == 1 and signals[0]["status"] == "closed"
    assert signals[0]["targetChannel"] == "#project" and "targetAgent" not in signals[0]
    root.close()


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

def test_record_signal_status_rules(demo):
    before = snapshot(demo)
    with pytest.raises(BadRequest, match="Targeted signals cannot be closed"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="pm", status="closed")
    with pytest.raises(BadRequest, match=r"^Invalid signal status: open$"):
        coordination.record_signal(demo, config_of(demo), "x", status="open")
    with pytest.raises(BadRequest, match=r"^Unknown agent: ghost$"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="ghost")
    with pytest.raises(BadRequest, match=r"^payload must be an object$"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="ghost", payload=[1])
    with pytest.raises(BadRequest, match=r"^Expected boolean, got yes$"):
        coordination.record_signal(demo, config_of(demo), "x", useful_effect="yes")
    with pytest.raises(BadRequest, match=r"^Invalid priority: P7$"):
        coordination.record_signal(demo, config_of(demo), "x", target_agent="pm", priority="P7")
    assert snapshot(demo) == before
    (closed,) = coordination.record_signal(demo, config_of(demo), "x", status="pending")
    assert closed["status"] == "closed" and closed["usefulEffect"] is False
    (to_user,) = coordination.record_signal(demo, config_of(demo), "x", target_agent="user")
    assert to_user["status"] == "closed"


@pytest.mark.parametrize("kind, target, explicit, expected", [
    ("scheduler.no_effect_nudge", "pm", None, False),
    ("scheduler.failed_nudge", "pm", None, False),
    ("custom.work", "pm", None, True),
    ("message.created", None, None, True),
    ("completion.submitted", None, None, True),
    ("coordination.wait_for_signal", None, None, True),
    ("custom.audit", None, None, False),
    ("custom.audit", None, True, True),
    ("custom.work", "pm", False, False),
])
def test_useful_effect_defaults(demo, kind, target, explicit, expected):
    (signal,) = coordination.record_signal(demo, config_of(demo), kind, target_agent=target, useful_effect=explicit)
    assert signal["usefulEffect"] is expected
    stored = demo.db_get("SELECT useful_effect FROM signals WHERE id = ?", [signal["id"]])
    assert stored["useful_effect"] == int(expected)


def test_pending_signals_selection_p1_batch_else_one_routine(demo):
    coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P3", now=at(1))
    p2 = [coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P2",
                                     now=at(2 + i))[0] for i in range(3)]
    assert [s["id"] for s in coordination.pending_signals(demo, config_of(demo), "worker", now=at(60))] == [p2[0]["id"]]
    p1 = [coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P1",
                                     now=at(10 + i))[0] for i in range(2)]
    assert [s["id"] for s in coordination.pending_signals(demo, config_of(demo), "worker",
                                                          now=at(60))] == [s["id"] for s in p1]
    p0 = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P0", now=at(20))[0]
    two = suzumio_config.ProjectConfig.from_data(dict(demo.config(), scheduler={"maxSignalsPerActivation": 2}))
    assert [s["id"] for s in coordination.pending_signals(demo, two, "worker", now=at(60))] == [p0["id"], p1[0]["id"]]


def test_delayed_signal_is_invisible_until_not_before(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", not_before=at(3600),
                                           now=T0)
    assert signal["notBefore"] == at(3600)
    assert coordination.pending_signals(demo, config_of(demo), "worker", now=at(10)) == []
    assert not demo.has_pending_signals(now=at(10))
    assert not demo.has_pending_signals_for_agent("worker", now=at(10))
    assert demo.has_pending_signals_for_agent("worker", include_delayed=True, now=at(10))
    assert [s["id"] for s in coordination.pending_signals(demo, config_of(demo), "worker",
                                                          now=at(3600))] == [signal["id"]]
    (plain,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="pm", now=T0)
    assert "notBefore" not in plain


def test_mark_delivered_is_conditional_on_pending(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker")
    act = coordination.start_activation(demo, "worker", "p", [signal])
    assert demo.mark_signals_delivered("worker", [signal["id"]], "act_other") == []
    stored = demo.signal(signal["id"])
    assert stored["status"] == "delivered" and stored["deliveredActivationId"] == act["id"]


# -- activations --------------------------------------------------------------------------------

def test_start_activation_binds_agent_delivers_and_writes_prompt_row(demo):
    message = coordination.send_message(demo, config_of(demo), "user", "Start", recipient="worker")
    signals = coordination.pending_signals(demo, config_of(demo), "worker")
    act = coordination.start_activation(demo, "worker", "PROMPT", signals, now=at(5))
    assert act["status"] == "running" and act["startedAt"] == at(5)
    assert act["inputPath"] == str(demo.activation_dir(act["id"]) / "input.json")
    assert act["outputPath"].endswith("/result.json")
    worker = demo.agent("worker")
    assert worker["status"] == "running" and worker["activeActivationId"] == act["id"]
    signal = demo.signal(signals[0]["id"])
    assert signal["status"] == "delivered" and signal["deliveredActivationId"] == act["id"]
    (row,) = demo.active_history("worker")
    assert (row["role"], row["kind"], row["content"]) == ("user", "activation_prompt", "PROMPT")
    assert row["metadata"] == {"delivery": "activation_start", "signalIds": [signals[0]["id"]],
                               "priorities": ["P3"]}
    assert signals[0]["payload"]["id"] == message["id"]
    assert demo.running_activations()[0]["id"] == act["id"]


def test_second_activation_for_running_agent_fails_and_writes_nothing(demo):
    coordination.start_activation(demo, "worker", "p", [])
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="already has a running activation"):
        coordination.start_activation(demo, "worker", "p2", [signal])
    assert snapshot(demo) == before


@pytest.mark.parametrize("halt", ["stop", "approve"])
def test_activation_refused_while_project_not_running(demo, halt):
    getattr(coordination, halt)(demo)
    before = snapshot(demo)
    with pytest.raises(Conflict, match="no activation can start"):
        coordination.start_activation(demo, "worker", "p", [])
    assert snapshot(demo) == before
    demo.start()
    assert coordination.start_activation(demo, "worker", "p", [])["status"] == "running"


def test_start_activation_rolls_back_when_a_signal_is_no_longer_pending(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="pm")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="no longer pending"):
        coordination.start_activation(demo, "worker", "p", [signal])
    assert snapshot(demo) == before


def test_completion_counts_messages_and_effects_without_nudge(demo):
    act = coordination.start_activation(demo, "worker", "p", [], now=at(1))
    coordination.send_message(demo, config_of(demo), "worker", "result", recipient="pm", source_agent="worker",
                              source_activation=act["id"],
                              now=at(2))
    result = coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done", {"totalTokens": 5},
                                              now=at(3))
    assert result == {"status": "completed", "activationId": act["id"]}
    done = demo.activation(act["id"])
    assert done["emittedMessages"] == 1 and done["text"] == "done" and done["usage"] == {"totalTokens": 5}
    assert done["completedAt"] == at(3)
    event = demo.latest_event("activation.completed")
    assert event["data"] == {"activationId": act["id"], "agentId": "worker", "emittedMessages": 1,
                             "usefulEffects": 1}
    assert demo.agent("worker")["status"] == "quiet" and "activeActivationId" not in demo.agent("worker")
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


def test_completion_of_non_running_activation_changes_nothing(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    demo.cancel_activation(act["id"], "Interrupted")
    before = snapshot(demo)
    assert coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "late",
                                            {}) == {"status": "cancelled",
                                                                         "activationId": act["id"]}
    assert snapshot(demo) == before
    with pytest.raises(Forbidden, match=f"^Activation {act['id']} does not belong to pm$"):
        coordination.complete_activation(demo, config_of(demo), act["id"], "pm", "x")
    with pytest.raises(NotFound, match=r"^Unknown activation: act_x$"):
        coordination.complete_activation(demo, config_of(demo), "act_x", "pm", "x")


def test_failure_marks_agent_failed_and_keeps_delivered_signals(demo):
    (signal,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker")
    act = coordination.start_activation(demo, "worker", "p", [signal])
    failed = demo.fail_activation(act["id"], "provider timeout")
    assert failed["status"] == "failed" and failed["error"] == "provider timeout"
    assert demo.agent("worker")["status"] == "failed"
    last = demo.active_history("worker")[-1]
    assert (last["role"], last["kind"]) == ("assistant", "activation_failed")
    assert last["content"] == f"Activation {act['id']} failed.\n\nprovider timeout"
    assert last["metadata"] == {"error": "provider timeout"}
    assert demo.signal(signal["id"])["status"] == "delivered"
    assert demo.fail_activation(act["id"], "again") is None
    assert demo.latest_event("activation.failed")["data"]["error"] == "provider timeout"


def test_timeout_failure_records_no_nudge(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    demo.fail_activation(act["id"], "activation timed out")
    assert demo.activation(act["id"])["error"] == "activation timed out"
    assert demo.agent("worker")["status"] == "failed"
    assert demo.active_history("worker")[-1]["kind"] == "activation_failed"
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


def test_cancel_sets_quiet_with_history_row(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    cancelled = demo.cancel_activation(act["id"], "Interrupted by P0 signal sig_1")
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "Interrupted by P0 signal sig_1"
    assert demo.agent("worker")["status"] == "quiet"
    last = demo.active_history("worker")[-1]
    assert last["kind"] == "activation_cancelled" and "Interrupted by P0 signal sig_1" in last["content"]
    assert last["metadata"] == {"reason": "Interrupted by P0 signal sig_1"}
    assert demo.cancel_activation(act["id"], "again") is None
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


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
    demo.fail_activation(act2["id"], "boom", now=at(5))
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


# -- no-effect nudge (scheduler.md §7.1) --------------------------------------------------------

def test_no_effect_completion_records_first_nudge_immediately(demo):
    act = coordination.start_activation(demo, "worker", "p", [], now=at(1))
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "nothing", now=at(2))
    (nudge,) = demo.list_signals(kind="scheduler.no_effect_nudge")
    assert nudge["targetAgent"] == "worker" and nudge["priority"] == "P3" and nudge["status"] == "pending"
    assert nudge["usefulEffect"] is False
    payload = nudge["payload"]
    assert payload["attempt"] == 1 and payload["delayMs"] == 0 and payload["maxConsecutive"] == 0
    assert payload["previousActivationId"] == act["id"] and "notBefore" not in payload
    assert "messages.send" in payload["message"]


def _run_no_effect_chain(store, rounds):
    attempts, now = [], 0
    for _ in range(rounds):
        now += 1000
        signals = coordination.pending_signals(store, config_of(store), "worker", now=at(now))
        act = coordination.start_activation(store, "worker", "p", signals, now=at(now))
        coordination.complete_activation(store, config_of(store), act["id"], "worker", "nothing", now=at(now + 1))
        nudge = store.latest_signal("scheduler.no_effect_nudge", "worker")
        fresh = nudge is not None and nudge["payload"]["previousActivationId"] == act["id"]
        attempts.append(nudge["payload"] if fresh else None)
    return attempts


def test_no_effect_nudge_respects_max_consecutive(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"maxConsecutive": 2, "initialDelayMs": 0,
                                                      "priority": "P2"}})
    root, store = init_demo(tmp_path / "root", config)
    payloads = _run_no_effect_chain(store, 3)
    assert [p and p["attempt"] for p in payloads] == [1, 2, None]
    assert {s["priority"] for s in store.list_signals(kind="scheduler.no_effect_nudge")} == {"P2"}
    root.close()


def test_no_effect_nudge_backoff_delays(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"initialDelayMs": 1000, "backoffFactor": 2,
                                                      "maxDelayMs": 5000}})
    root, store = init_demo(tmp_path / "root", config)
    payloads = _run_no_effect_chain(store, 5)
    assert [p["delayMs"] for p in payloads] == [0, 1000, 2000, 4000, 5000]
    second = store.list_signals(kind="scheduler.no_effect_nudge")[-2]
    assert second["payload"]["attempt"] == 2 and second["notBefore"] == second["payload"]["notBefore"]
    root.close()


def test_delayed_nudge_not_returned_before_not_before(tmp_path):
    config = make_config(scheduler={"noEffectNudge": {"initialDelayMs": 1000}})
    root, store = init_demo(tmp_path / "root", config)
    act = coordination.start_activation(store, "worker", "p", [], now=at(1))
    coordination.complete_activation(store, config_of(store), act["id"], "worker", "x", now=at(2))
    first = coordination.pending_signals(store, config_of(store), "worker", now=at(2))
    act2 = coordination.start_activation(store, "worker", "p", first, now=at(3))
    coordination.complete_activation(store, config_of(store), act2["id"], "worker", "x", now=at(4))
    assert coordination.pending_signals(store, config_of(store), "worker", now=at(4.5)) == []
    assert coordination.pending_signals(store, config_of(store), "worker", now=at(5))[0]["payload"]["attempt"] == 2
    root.close()


def test_no_effect_nudge_disabled(tmp_path):
    root, store = init_demo(tmp_path / "root", make_config(scheduler={"noEffectNudge": {"enabled": False}}))
    act = coordination.start_activation(store, "worker", "p", [])
    coordination.complete_activation(store, config_of(store), act["id"], "worker", "x")
    assert store.list_signals(kind="scheduler.no_effect_nudge") == []
    root.close()


@pytest.mark.parametrize("effect", ["submit", "wait", "useful_custom"])
def test_completion_after_useful_tools_records_no_nudge(demo, effect):
    agent = "pm" if effect == "submit" else "worker"
    act = coordination.start_activation(demo, agent, "p", [])
    if effect == "submit":
        coordination.submit_report(demo, agent, act["id"], "report")
    elif effect == "wait":
        coordination.declare_wait(demo, config_of(demo), agent, act["id"], notify_pm=False)
    else:
        coordination.record_signal(demo, config_of(demo), "x", source_agent=agent, source_activation=act["id"],
                                   useful_effect=True)
    coordination.complete_activation(demo, config_of(demo), act["id"], agent, "done")
    assert demo.list_signals(kind="scheduler.no_effect_nudge") == []


# -- tool calls ---------------------------------------------------------------------------------

def test_tool_call_on_ended_activation_and_foreign_call_are_rejected(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    call = demo.start_tool_call("worker", act["id"], "shell.exec", {})
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    before = snapshot(demo)
    ended = f"^Activation {act['id']} is completed; no more tool calls are accepted$"
    with pytest.raises(Conflict, match=ended):
        demo.start_tool_call("worker", act["id"], "shell.exec", {})
    assert snapshot(demo) == before
    other = coordination.start_activation(demo, "pm", "p", [])
    with pytest.raises(NotFound, match=f"^Unknown tool call for activation: {call['toolCallId']}$"):
        coordination.finish_tool_call(demo, "pm", other["id"], call["toolCallId"], "completed", "x")
    with pytest.raises(BadRequest, match=r"^Invalid tool call status: done$"):
        coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "done")
    with pytest.raises(Forbidden):
        demo.start_tool_call("worker", other["id"], "shell.exec", {})
    # finishing after the activation ended is accepted (the runner reports a late result)
    assert coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "late") == {
        "status": "completed"}


def test_tool_call_start_and_finish_write_row_and_history(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    call = demo.start_tool_call("worker", act["id"], "shell.exec", {"cmd": "ls"}, now=at(1))
    result = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "out", now=at(2))
    assert result == {"status": "completed"}
    row = demo.tool_call(call["toolCallId"])
    assert row["status"] == "completed" and row["completed_at"] == at(2) and row["output"] == "out"
    history = demo.active_history("worker")
    call_row, result_row = history[-2], history[-1]
    assert result_row["sequence"] == call_row["sequence"] + 1
    assert call_row["role"] == "tool_call" and call_row["content"] == (
        '# Tool Call\nTool: shell.exec\n\n{\n  "cmd": "ls"\n}')
    assert [p["type"] for p in call_row["parts"]] == ["tool_call"]
    assert call_row["parts"][0]["inputJson"] == '{"cmd":"ls"}'
    assert result_row["kind"] == "tool_result"
    assert result_row["content"] == "# Tool Result\nTool: shell.exec\nStatus: completed\n\nout"
    assert [p["type"] for p in result_row["parts"]] == ["tool_result"]
    assert demo.latest_event("tool.completed")["data"] == {"id": call["toolCallId"], "output": "out"}
    call2 = demo.start_tool_call("worker", act["id"], "shell.exec")
    coordination.finish_tool_call(demo, "worker", act["id"], call2["toolCallId"], "failed", error="bad")
    last = demo.active_history("worker")[-1]
    assert last["kind"] == "tool_error" and last["content"].endswith("Status: failed\nError: bad")
    listed = demo.list_tool_calls(10)
    assert listed[0]["id"] == call2["toolCallId"] and "output" not in listed[0]
    assert listed[1]["completed_at"] == at(2)
    stats = demo.tool_call_stats()["shell.exec"]
    assert (stats["callCount"], stats["completedCount"], stats["failedCount"]) == (2, 1, 1)
    assert stats["lastStatus"] == "failed" and stats["lastError"] == "bad"


def test_p1_delivered_at_tool_boundary_after_tool_result(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    message = coordination.send_message(demo, config_of(demo), "pm", "Urgent fix", recipient="worker", priority="P1",
                                        source_agent="pm")
    coordination.record_signal(demo, config_of(demo), "later", target_agent="worker", priority="P1",
                               not_before=at(3600, rec.now_ts()))
    coordination.record_signal(demo, config_of(demo), "routine", target_agent="worker", priority="P2")
    failed = demo.start_tool_call("worker", act["id"], "shell.exec")
    assert coordination.finish_tool_call(demo, "worker", act["id"], failed["toolCallId"], "failed", error="x") == {
        "status": "failed"}
    call = demo.start_tool_call("worker", act["id"], "shell.exec")
    result = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok")
    assert result["deliveredSignals"] == 1
    assert result["signalText"].startswith("# New P1 Signals Delivered At Tool Boundary")
    assert f"Message: {message['id']}" in result["signalText"] and "Urgent fix" in result["signalText"]
    (delivered,) = demo.list_signals(status="delivered")
    assert delivered["payload"]["id"] == message["id"] and delivered["deliveredActivationId"] == act["id"]
    history = demo.active_history("worker")
    assert [h["kind"] for h in history[-2:]] == ["tool_result", "tool_boundary_signals"]
    assert history[-1]["metadata"] == {"delivery": "tool_boundary", "signalIds": [delivered["id"]],
                                       "toolCallId": call["toolCallId"]}
    assert history[-1]["content"] == result["signalText"]


def test_a_start_asked_again_with_its_call_key_answers_the_recorded_call_and_records_nothing(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    first = demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"}, call_key="k-1")
    before = snapshot(demo)
    again = demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"}, call_key="k-1")
    assert again == {"toolCallId": first["toolCallId"], "replayed": True}
    assert snapshot(demo) == before
    with pytest.raises(Conflict, match=r"^callKey k-1 was already used for another tool call$"):
        demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "rm -rf /"}, call_key="k-1")
    assert snapshot(demo) == before
    # without a key every start is a new call (runners before 16k); a key is scoped to its activation
    plain = [demo.start_tool_call("worker", act["id"], "shell.exec", {"command": "ls"}) for _ in range(2)]
    other = coordination.start_activation(demo, "pm", "p", [])
    elsewhere = demo.start_tool_call("pm", other["id"], "shell.exec", {"command": "ls"}, call_key="k-1")
    ids = {first["toolCallId"], elsewhere["toolCallId"], *(c["toolCallId"] for c in plain)}
    assert len(ids) == 4 and count(demo, "tool_calls") == 4


def test_the_same_finish_asked_again_answers_the_first_result_and_records_nothing(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    coordination.send_message(demo, config_of(demo), "pm", "Urgent fix", recipient="worker", priority="P1",
                              source_agent="pm")
    call = demo.start_tool_call("worker", act["id"], "shell.exec")
    first = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok")
    assert first["deliveredSignals"] == 1
    coordination.send_message(demo, config_of(demo), "pm", "Another", recipient="worker", priority="P1",
                              source_agent="pm")
    before = snapshot(demo)
    again = coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok")
    assert again == first  # the signal text of the first answer, not the signal that came since
    assert snapshot(demo) == before
    failed = demo.start_tool_call("worker", act["id"], "shell.exec")
    assert coordination.finish_tool_call(demo, "worker", act["id"], failed["toolCallId"], "failed",
                                         error="E") == {"status": "failed"}
    before = snapshot(demo)
    assert coordination.finish_tool_call(demo, "worker", act["id"], failed["toolCallId"], "failed",
                                         error="E") == {"status": "failed"}
    assert snapshot(demo) == before
    # a different result still overwrites the first and appends its row (tools.md §13)
    coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "changed")
    assert demo.tool_call(call["toolCallId"])["output"] == "changed"
    assert [h["kind"] for h in demo.active_history("worker")].count("tool_result") == 2


@pytest.mark.parametrize("tool", ["coordination.wait_for_signal", "completion.submit"])
def test_ending_tools_never_deliver_p1(demo, tool):
    act = coordination.start_activation(demo, "worker", "p", [])
    (p1,) = coordination.record_signal(demo, config_of(demo), "urgent", target_agent="worker", priority="P1")
    call = demo.start_tool_call("worker", act["id"], tool)
    assert coordination.finish_tool_call(demo, "worker", act["id"], call["toolCallId"], "completed", "ok") == {
        "status": "completed"}
    assert demo.signal(p1["id"])["status"] == "pending"


# -- core tool effects --------------------------------------------------------------------------

def test_submit_report_writes_file_and_closed_useful_signal(demo):
    act = coordination.start_activation(demo, "pm", "p", [])
    result = coordination.submit_report(demo, "pm", act["id"], "  # Report\n\nAll done.  ")
    path = demo.dir / "final-report.md"
    assert path.read_text() == "# Report\n\nAll done.\n"
    project = demo.project()
    assert project["status"] == "submitted" and project["submitted_report"] == str(path)
    signal = result["signal"]
    assert signal["kind"] == "completion.submitted" and signal["status"] == "closed"
    assert signal["usefulEffect"] is True and signal["sourceActivation"] == act["id"]
    assert signal["payload"] == {"reportPath": str(path)}
    assert demo.latest_event("project.submitted")["data"] == {"agentId": "pm", "reportPath": str(path)}


def files_under(directory):
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.is_file())


def test_a_submission_that_rolls_back_leaves_the_old_report_and_no_file(demo):
    act = coordination.start_activation(demo, "pm", "p", [])
    coordination.submit_report(demo, "pm", act["id"], "# First")
    # A real failure late in the transaction: SQLite refuses the closed completion signal.
    demo.db_run("CREATE TRIGGER refuse_submit BEFORE INSERT ON signals WHEN NEW.kind = 'completion.submitted' "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    before, files = snapshot(demo), files_under(demo.dir)
    with pytest.raises(sqlite3.DatabaseError, match="refused by the test"):
        coordination.submit_report(demo, "pm", act["id"], "# Second")
    assert (demo.dir / "final-report.md").read_text() == "# First\n"
    assert files_under(demo.dir) == files and snapshot(demo) == before


def test_a_compaction_that_rolls_back_writes_no_archive(demo):
    act = _fill_history(demo, "worker", 20)
    demo.db_run("CREATE TRIGGER refuse_compaction BEFORE INSERT ON agent_history_compactions "
                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    before, files = snapshot(demo), files_under(demo.dir)
    with pytest.raises(sqlite3.DatabaseError, match="refused by the test"):
        coordination.compact_history(demo, "worker", act["id"], "summary", keep_tail=4)
    assert files_under(demo.dir) == files and snapshot(demo) == before
    demo.db_run("DROP TRIGGER refuse_compaction")
    done = coordination.compact_history(demo, "worker", act["id"], "summary", keep_tail=4)
    assert files_under(demo.dir) == sorted(files + [f"history/worker/{done['compaction']['id']}.json"])


def test_a_file_staged_in_a_rolled_back_write_never_appears(demo):
    target = demo.dir / "staged.txt"
    with pytest.raises(RuntimeError, match="late failure"), demo.write() as tx:
        tx.write_file(target, "text")
        assert files_under(demo.dir) != [] and not target.exists()  # only the temp file, beside it
        raise RuntimeError("late failure")
    assert not target.exists() and not [p for p in demo.dir.iterdir() if p.name.startswith(".staged.txt")]
    with demo.write() as tx:
        tx.write_file(target, "text")
        assert not target.exists()  # appears only after COMMIT
    assert target.read_text() == "text"


def test_wait_declaration_notifies_pm_only_from_others(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    result = coordination.declare_wait(demo, config_of(demo), "worker", act["id"], reason="Blocked on review")
    message = result["message"]
    assert message["recipient"] == "pm" and message["priority"] == "P3" and message["sender"] == "worker"
    assert message["body"] == "Waiting for future signals.\n\nReason: Blocked on review"
    signal = result["signal"]
    assert signal["kind"] == "coordination.wait_for_signal" and signal["status"] == "closed"
    assert signal["usefulEffect"] is True
    assert signal["payload"] == {"reason": "Blocked on review", "notifiedAgent": "pm",
                                 "messageId": message["id"]}
    pm_act = coordination.start_activation(demo, "pm", "p", [])
    messages_before = count(demo, "messages")
    pm_result = coordination.declare_wait(demo, config_of(demo), "pm", pm_act["id"])
    assert "message" not in pm_result and count(demo, "messages") == messages_before
    assert pm_result["signal"]["payload"] == {"reason": "Waiting for future signals."}


# -- stop / approve / start / request changes ---------------------------------------------------

def test_stop_cancels_running_work_and_records_resume_signal(demo):
    (first,) = coordination.record_signal(demo, config_of(demo), "w", target_agent="worker", priority="P1")
    act = coordination.start_activation(demo, "worker", "p", [first], now=at(1))
    coordination.send_message(demo, config_of(demo), "user", "later work", recipient="worker", now=at(2))
    cancelled = coordination.stop(demo, now=at(3))
    assert [a["id"] for a in cancelled] == [act["id"]]
    assert demo.activation(act["id"])["status"] == "cancelled"
    assert demo.activation(act["id"])["error"] == "Project stopped"
    assert demo.agent("worker")["status"] == "quiet"
    assert demo.project()["status"] == "stopped"
    (resume,) = demo.list_signals(kind="scheduler.resume_after_stop")
    assert resume["priority"] == "P2" and resume["status"] == "pending" and resume["usefulEffect"] is False
    assert "sourceAgent" not in resume and "sourceActivation" not in resume
    assert resume["payload"] == {"cancelledActivationId": act["id"], "interruptedSignalIds": [first["id"]],
                                 "message": rec.RESUME_AFTER_STOP_MESSAGE}
    with pytest.raises(Conflict):
        coordination.start_activation(demo, "worker", "p", [])
    demo.start(now=at(4))
    chosen = coordination.pending_signals(demo, config_of(demo), "worker", now=at(5))
    assert [s["kind"] for s in chosen] == ["scheduler.resume_after_stop"]
    act2 = coordination.start_activation(demo, "worker", "p", chosen, now=at(5))
    assert demo.signal(resume["id"])["deliveredActivationId"] == act2["id"]
    assert coordination.pending_signals(demo, config_of(demo), "worker",
                                        now=at(6))[0]["payload"]["body"] == "later work"
    assert "## " + resume["id"] + " scheduler.resume_after_stop" in rec.render_signal(resume)


def test_approve_cancels_without_resume_signal(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    cancelled = coordination.approve(demo)
    assert [a["error"] for a in cancelled] == ["Project approved"]
    assert demo.activation(act["id"])["status"] == "cancelled"
    assert demo.agent("worker")["status"] == "quiet"
    assert demo.project()["status"] == "completed"
    assert demo.list_signals(kind="scheduler.resume_after_stop") == []
    status_events = [json.loads(e["data_json"]) for e in demo.list_events() if e["type"] == "project.status"]
    assert status_events[0] == {"status": "completed"}


def test_request_changes_validates_then_sends_p2_to_coordinator(demo):
    coordination.stop(demo)
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^body is required$"):
        coordination.request_changes(demo, config_of(demo), "  ")
    with pytest.raises(BadRequest, match=r"^Unknown agent: ghost$"):
        coordination.request_changes(demo, config_of(demo), "x", recipient="ghost")
    assert snapshot(demo) == before
    message = coordination.request_changes(demo, config_of(demo), "Please fix")
    assert (message["sender"], message["recipient"], message["priority"]) == ("user", "pm", "P2")
    assert demo.project()["status"] == "running"


# -- history ------------------------------------------------------------------------------------

def test_history_sequences_continue_across_activations_and_compaction(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    for i in range(4):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", f"a{i}")
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    act2 = coordination.start_activation(demo, "worker", "p", [])
    coordination.compact_history(demo, "worker", act2["id"], "summary", keep_tail=1)
    row = demo.append_history("worker", act2["id"], "assistant", "assistant_output", "after")
    sequences = [r["sequence"] for r in rows(demo, "SELECT sequence FROM agent_history_messages "
                                                   "WHERE agent_id = 'worker' ORDER BY sequence")]
    assert sequences == list(range(1, len(sequences) + 1))
    assert row["sequence"] == sequences[-1]


def test_append_history_checks_role_and_running_activation(demo):
    act = coordination.start_activation(demo, "worker", "p", [])
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^Invalid history role: system$"):
        demo.append_history("worker", act["id"], "system", "k", "c")
    coordination.complete_activation(demo, config_of(demo), act["id"], "worker", "done")
    before = snapshot(demo)
    with pytest.raises(Conflict, match="history updates are not accepted"):
        demo.append_history("worker", act["id"], "assistant", "assistant_output", "late")
    with pytest.raises(NotFound, match=r"^Unknown agent: ghost$"):
        demo.append_history("ghost", None, "assistant", "k", "c")
    assert snapshot(demo) == before
    row = demo.append_history("worker", None, "assistant", "note", "text", metadata={"model": "m"})
    assert row["parts"][0]["type"] == "text" and row["parts"][0]["text"] == "text"
    assert row["metadata"] == {"model": "m"} and "activationId" not in row
    assert demo.latest_event("agent_history.message")["data"] == {
        "id": row["id"], "agentId": "worker", "role": "assistant", "kind": "note", "chars": 4}


def _fill_history(store, agent, count_rows):
    act = coordination.start_activation(store, agent, "prompt", [])  # row 1: activation_prompt
    for i in range(count_rows - 1):
        store.append_history(agent, act["id"], "assistant", "assistant_output", f"row {i + 2}")
    return act


def test_compaction_archives_head_and_keeps_tail(demo):
    act = _fill_history(demo, "worker", 20)
    result = coordination.compact_history(demo, "worker", act["id"], "  The summary.  ", keep_tail=12,
                                          reason="provider_context_overflow", selected_model="main")
    assert result["status"] == "compacted"
    compaction = result["compaction"]
    assert compaction["archivedMessageCount"] == 8
    assert (compaction["startSequence"], compaction["endSequence"]) == (1, 8)
    archived = rows(demo, "SELECT DISTINCT compaction_id FROM agent_history_messages "
                          "WHERE compaction_id IS NOT NULL")
    assert archived == [{"compaction_id": compaction["id"]}]
    assert count(demo, "agent_history_messages", "compaction_id IS NOT NULL") == 8
    path = demo.history_archive_path("worker", compaction["id"])
    text = path.read_text()
    archive = json.loads(text)
    assert archive["version"] == 1 and len(archive["messages"]) == 8 and text.endswith("}\n")
    assert archive["reason"] == "provider_context_overflow" and archive["selectedModel"] == "main"
    assert compaction["rawChars"] == len(text) and compaction["archivePath"] == str(path)
    history = demo.active_history("worker")
    assert len(history) == 13 and history == result["history"]
    marker = history[0]
    assert (marker["role"], marker["kind"], marker["content"]) == ("compaction", "history_compaction",
                                                                    "The summary.")
    assert marker["metadata"]["startSequence"] == 1 and marker["metadata"]["endSequence"] == 8
    assert marker["metadata"]["compactionId"] == compaction["id"]
    assert marker["parts"][0]["type"] == "compaction"
    assert marker["parts"][0]["metadata"] == {"compactionId": compaction["id"], "archivePath": str(path)}
    assert [h["sequence"] for h in history[1:]] == list(range(9, 21))
    assert demo.history_archive("worker", compaction["id"]) == {"compaction": compaction, "archive": archive}
    assert demo.latest_event("agent_history.compacted")["data"]["archivedMessageCount"] == 8
    with pytest.raises(NotFound, match=r"^Unknown history compaction: cmp_x$"):
        demo.history_archive("worker", "cmp_x")
    # a later compaction archives the earlier marker too
    second = coordination.compact_history(demo, "worker", act["id"], "Second.", keep_tail=2)
    assert second["history"][0]["content"] == "Second."
    assert demo.db_get("SELECT compaction_id FROM agent_history_messages WHERE id = ?",
                       [marker["id"]])["compaction_id"] == second["compaction"]["id"]


def test_compaction_unchanged_when_history_fits_tail(demo):
    act = _fill_history(demo, "worker", 5)
    before = snapshot(demo)
    result = coordination.compact_history(demo, "worker", act["id"], "s", keep_tail=5)
    assert result["status"] == "unchanged" and len(result["history"]) == 5
    assert snapshot(demo) == before
    assert not (demo.dir / "history").exists()


def test_compaction_keep_tail_is_clamped(demo):
    act = _fill_history(demo, "worker", 120)
    assert len(coordination.compact_history(demo, "worker", act["id"], "s", keep_tail=500)["history"]) == 101
    act2 = _fill_history(demo, "pm", 3)
    assert len(coordination.compact_history(demo, "pm", act2["id"], "s", keep_tail=0)["history"]) == 2


def test_blank_summary_rejected_before_anything_is_written(demo):
    act = _fill_history(demo, "worker", 20)
    before = snapshot(demo)
    with pytest.raises(BadRequest, match=r"^summary is required$"):
        coordination.compact_history(demo, "worker", act["id"], "   ")
    assert snapshot(demo) == before
    assert not (demo.dir / "history").exists()


def test_history_paging_newest_first_with_next_before(demo):
    act = _fill_history(demo, "worker", 25)
    coordination.compact_history(demo, "worker", act["id"], "s", keep_tail=20)
    page = demo.history_page("worker", limit=10)
    assert list(page) == ["agentId", "nextBefore", "messages"]
    assert [m["sequence"] for m in page["messages"]] == list(range(26, 16, -1))
    assert page["nextBefore"] == 17
    rest = demo.history_page("worker", limit=100, before=page["nextBefore"])
    assert [m["sequence"] for m in rest["messages"]] == list(range(16, 0, -1)) and "nextBefore" not in rest
    assert rest["messages"][-1]["archived"] is True and "compactionId" in rest["messages"][-1]
    active_only = demo.history_page("worker", limit=100, include_archived=False)
    assert len(active_only["messages"]) == 21
    assert all(not m["archived"] for m in active_only["messages"])
    assert len(demo.history_page("worker", limit=0)["messages"]) == 1
    big = demo.append_history("worker", act["id"], "assistant", "assistant_output", "y" * 50000)
    top = demo.history_page("worker", limit=1)["messages"][0]
    assert top["id"] == big["id"] and top["content"].endswith("[truncated 10000 chars]")
    assert top["parts"][0]["text"].endswith("[truncated 30000 chars]")
    with pytest.raises(NotFound, match=r"^Unknown agent: ghost$"):
        demo.history_page("ghost")


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
    demo.fail_activation(act2["id"], "boom")
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
    assert rec.render_signal(message) == (f"## sig_1 message.created\nMessage: msg_1\nFrom: user\nTo: pm\n"
                                         f"Priority: P3\nTime: {T0}\n\nHello")
    channel = {**message, "targetChannel": "#project",
               "payload": {"id": "msg_2", "sender": "worker", "channel": "#project", "body": "x"}}
    assert "Channel: #project" in rec.render_signal(channel)
    custom = {"id": "sig_3", "kind": "review.ready", "priority": "P2", "createdAt": T0, "payload": {"a": 1}}
    assert rec.render_signal(custom) == f'## sig_3 review.ready\nPriority: P2\nTime: {T0}\n\n{{\n  "a": 1\n}}'
    nudge = {"id": "sig_4", "kind": "scheduler.failed_nudge", "priority": "P2", "payload": {}}
    assert rec.render_signal(nudge).startswith("## sig_4 scheduler.failed_nudge\nPriority: P2\n\n")


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
    demo.fail_activation(act["id"], "boom", now=at(3))
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


# ---------------------------------------------------------------- bounded connections (issue 20)

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
    the rowids, the budget's reads seek their types, and none of them sorts (issue 18, issue 20)."""
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
