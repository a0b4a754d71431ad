-- The schema after every migration (suzumio_store.MIGRATIONS), as SQLite stores it: one statement per
-- object, ordered by type and name. tests/test_store.py builds a blank database and compares. A new
-- migration adds its objects here; a change to an existing statement means a shipped migration was edited.

-- index idx_activations_project_started on activations
CREATE INDEX idx_activations_project_started ON activations (project, started_at);

-- index idx_agent_history_compactions_agent on agent_history_compactions
CREATE INDEX idx_agent_history_compactions_agent ON agent_history_compactions (project, agent_id, created_at);

-- index idx_agent_history_parts_message on agent_history_parts
CREATE INDEX idx_agent_history_parts_message ON agent_history_parts (project, message_id, part_index);

-- index idx_agent_history_project_agent_active on agent_history_messages
CREATE INDEX idx_agent_history_project_agent_active ON agent_history_messages (project, agent_id, compaction_id, sequence);

-- index idx_agent_history_project_agent_sequence on agent_history_messages
CREATE UNIQUE INDEX idx_agent_history_project_agent_sequence ON agent_history_messages (project, agent_id, sequence);

-- index idx_approvals_project_activation on approvals
CREATE INDEX idx_approvals_project_activation ON approvals (project, activation_id, status);

-- index idx_approvals_project_grant on approvals
CREATE INDEX idx_approvals_project_grant ON approvals (project, agent_id, rule_key, decision);

-- index idx_approvals_project_status on approvals
CREATE INDEX idx_approvals_project_status ON approvals (project, status, created_at);

-- index idx_artifact_versions_activation on artifact_versions
CREATE INDEX idx_artifact_versions_activation ON artifact_versions (activation_id);

-- index idx_artifact_versions_agent_path on artifact_versions
CREATE INDEX idx_artifact_versions_agent_path ON artifact_versions (project, agent_id, path, seq);

-- index idx_claims_project_open on claims
CREATE INDEX idx_claims_project_open ON claims (project, released_at, expires_at);

-- index idx_effects_activation on effects
CREATE INDEX idx_effects_activation ON effects (project, activation_id, state);

-- index idx_effects_project_state on effects
CREATE INDEX idx_effects_project_state ON effects (project, state, started_at);

-- index idx_effects_tool_call on effects
CREATE UNIQUE INDEX idx_effects_tool_call ON effects (project, tool_call_id);

-- index idx_events_project_created on events
CREATE INDEX idx_events_project_created ON events (project, created_at);

-- index idx_events_project_type on events
CREATE INDEX idx_events_project_type ON events (project, type);

-- index idx_merge_requests_project_status on merge_requests
CREATE INDEX idx_merge_requests_project_status ON merge_requests (project, status, created_at);

-- index idx_messages_project_created on messages
CREATE INDEX idx_messages_project_created ON messages (project, created_at);

-- index idx_messages_project_idempotency_key on messages
CREATE UNIQUE INDEX idx_messages_project_idempotency_key ON messages (project, idempotency_key);

-- index idx_model_calls_project_activation on model_calls
CREATE INDEX idx_model_calls_project_activation ON model_calls (project, activation_id);

-- index idx_model_exchanges_activation_index on model_exchanges
CREATE UNIQUE INDEX idx_model_exchanges_activation_index ON model_exchanges (activation_id, request_index);

-- index idx_signals_project_delivered on signals
CREATE INDEX idx_signals_project_delivered ON signals (project, delivered_activation_id);

-- index idx_signals_project_source on signals
CREATE INDEX idx_signals_project_source ON signals (project, source_activation, useful_effect);

-- index idx_signals_project_target on signals
CREATE INDEX idx_signals_project_target ON signals (project, target_agent, status, created_at);

-- index idx_signals_project_target_ready on signals
CREATE INDEX idx_signals_project_target_ready ON signals (project, target_agent, status, not_before, created_at);

-- index idx_tool_calls_activation_call_key on tool_calls
CREATE UNIQUE INDEX idx_tool_calls_activation_call_key ON tool_calls (activation_id, call_key);

-- table _migrations on _migrations
CREATE TABLE _migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL);

-- table _staged_files on _staged_files
CREATE TABLE _staged_files (temp TEXT PRIMARY KEY, final TEXT NOT NULL);

-- table activations on activations
CREATE TABLE activations (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
        prompt TEXT NOT NULL, input_path TEXT NOT NULL, output_path TEXT NOT NULL, container_name TEXT,
        started_at TEXT NOT NULL, completed_at TEXT, text TEXT, error TEXT,
        emitted_messages INTEGER NOT NULL DEFAULT 0, usage_json TEXT, context_json TEXT, node TEXT, commit_start TEXT, commit_end TEXT, repository_refs_json TEXT);

-- table agent_history_compactions on agent_history_compactions
CREATE TABLE agent_history_compactions (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT,
        summary_message_id TEXT NOT NULL, archive_path TEXT NOT NULL, start_sequence INTEGER NOT NULL,
        end_sequence INTEGER NOT NULL, archived_message_count INTEGER NOT NULL, raw_chars INTEGER NOT NULL,
        summary TEXT NOT NULL, reason TEXT, selected_model TEXT, created_at TEXT NOT NULL);

-- table agent_history_messages on agent_history_messages
CREATE TABLE agent_history_messages (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool_call', 'tool_result', 'compaction')), kind TEXT NOT NULL, content TEXT NOT NULL,
        sequence INTEGER NOT NULL, metadata_json TEXT NOT NULL DEFAULT '{}', compaction_id TEXT,
        created_at TEXT NOT NULL);

-- table agent_history_parts on agent_history_parts
CREATE TABLE agent_history_parts (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, message_id TEXT NOT NULL,
        activation_id TEXT, part_index INTEGER NOT NULL, type TEXT NOT NULL, text TEXT, tool_call_id TEXT,
        tool_name TEXT, input_json TEXT, output TEXT, error TEXT,
        metadata_json TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL);

-- table agents on agents
CREATE TABLE agents (
        id TEXT NOT NULL, project TEXT NOT NULL, role TEXT NOT NULL, display_name TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('quiet', 'ready', 'running', 'failed', 'stopped')),
        prompt TEXT NOT NULL, model TEXT, tools_json TEXT NOT NULL, workspace_path TEXT NOT NULL,
        token TEXT NOT NULL, active_activation_id TEXT, container_name TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL, paused_json TEXT, guards_since TEXT, PRIMARY KEY (project, id));

-- table approvals on approvals
CREATE TABLE "approvals" (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL, tool TEXT NOT NULL, input_json TEXT NOT NULL,
        rule_json TEXT NOT NULL, rule_key TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'allowed', 'denied', 'expired', 'cancelled', 'responded')),
        decision TEXT CHECK (decision IN ('allow', 'deny', 'allow-always', 'respond')),
        decided_by TEXT, note TEXT, on_expiry TEXT NOT NULL CHECK (on_expiry IN ('allow', 'deny')),
        expires_at TEXT NOT NULL, created_at TEXT NOT NULL, decided_at TEXT, used_at TEXT,
        edited_input_json TEXT, output TEXT);

-- table artifact_snapshots on artifact_snapshots
CREATE TABLE artifact_snapshots (
        activation_id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL,
        upto_seq INTEGER NOT NULL, changes INTEGER NOT NULL, bytes INTEGER NOT NULL, created_at TEXT NOT NULL);

-- table artifact_versions on artifact_versions
CREATE TABLE artifact_versions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, project TEXT NOT NULL, activation_id TEXT NOT NULL,
        agent_id TEXT NOT NULL, path TEXT NOT NULL, digest TEXT, size INTEGER NOT NULL,
        created_at TEXT NOT NULL);

-- table claims on claims
CREATE TABLE claims (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, path TEXT NOT NULL,
        reason TEXT NOT NULL, created_at TEXT NOT NULL, expires_at TEXT NOT NULL, released_at TEXT);

-- table effects on effects
CREATE TABLE effects (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL, tool TEXT NOT NULL, input_json TEXT NOT NULL, call_key TEXT,
        executor TEXT NOT NULL CHECK (executor IN ('runner', 'controller')), process TEXT,
        state TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed', 'in_doubt')),
        started_at TEXT NOT NULL, finished_at TEXT, doubted_at TEXT, why TEXT,
        told_at TEXT, resolution TEXT CHECK (resolution IN ('done', 'not_done')), resolved_at TEXT,
        resolved_by TEXT, note TEXT);

-- table events on events
CREATE TABLE events (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, type TEXT NOT NULL, data_json TEXT NOT NULL,
        created_at TEXT NOT NULL);

-- table merge_requests on merge_requests
CREATE TABLE merge_requests (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, agent_id TEXT NOT NULL, activation_id TEXT,
        message TEXT NOT NULL, head TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'merged', 'failed')),
        commit_id TEXT, reason TEXT CHECK (reason IN ('conflict', 'checks')), paths_json TEXT, output TEXT,
        created_at TEXT NOT NULL, finished_at TEXT);

-- table messages on messages
CREATE TABLE messages (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, sender TEXT NOT NULL, recipient TEXT, channel TEXT,
        priority TEXT NOT NULL CHECK (priority IN ('P0', 'P1', 'P2', 'P3')), body TEXT NOT NULL,
        created_at TEXT NOT NULL, idempotency_key TEXT);

-- table model_calls on model_calls
CREATE TABLE model_calls (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, activation_id TEXT NOT NULL, agent_id TEXT NOT NULL,
        provider_id TEXT NOT NULL, preset_id TEXT NOT NULL, status INTEGER NOT NULL,
        tokens INTEGER NOT NULL, usage_json TEXT NOT NULL, created_at TEXT NOT NULL, cost_usd REAL, cached_tokens INTEGER NOT NULL DEFAULT 0, cache_write_tokens INTEGER NOT NULL DEFAULT 0);

-- table model_exchanges on model_exchanges
CREATE TABLE model_exchanges (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, activation_id TEXT NOT NULL, agent_id TEXT NOT NULL,
        request_index INTEGER NOT NULL, provider_id TEXT NOT NULL, preset_id TEXT NOT NULL,
        request_zlib BLOB NOT NULL, status INTEGER, headers_json TEXT NOT NULL, answer TEXT NOT NULL,
        overflow INTEGER NOT NULL DEFAULT 0, usage_json TEXT NOT NULL, retries INTEGER NOT NULL,
        error TEXT, replayed INTEGER NOT NULL DEFAULT 0, started_at TEXT NOT NULL,
        duration_ms INTEGER NOT NULL);

-- table project_origins on project_origins
CREATE TABLE project_origins (
        project TEXT PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('replay', 'fork')), source TEXT NOT NULL,
        at_activation TEXT, tools TEXT CHECK (tools IN ('live', 'recorded')),
        on_diverge TEXT CHECK (on_diverge IN ('stop', 'live')), diverged_json TEXT,
        injected_messages INTEGER NOT NULL DEFAULT 0, ended INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL);

-- table projects on projects
CREATE TABLE projects (
        id TEXT PRIMARY KEY, name TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('initialized', 'running', 'submitted', 'completed', 'stopped', 'failed')),
        task TEXT NOT NULL, config_json TEXT NOT NULL, submitted_report TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL);

-- table signals on signals
CREATE TABLE signals (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, kind TEXT NOT NULL, source_agent TEXT,
        source_activation TEXT, target_agent TEXT, target_channel TEXT,
        priority TEXT NOT NULL CHECK (priority IN ('P0', 'P1', 'P2', 'P3')), payload_json TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'closed')),
        useful_effect INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL, not_before TEXT,
        delivered_at TEXT, delivered_activation_id TEXT);

-- table tool_calls on tool_calls
CREATE TABLE tool_calls (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, activation_id TEXT NOT NULL, agent_id TEXT NOT NULL,
        tool TEXT NOT NULL, input_json TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
        output TEXT, error TEXT, created_at TEXT NOT NULL, completed_at TEXT, call_key TEXT);
