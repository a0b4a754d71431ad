"""The OpenAPI 3.1 description of the user routes of the HTTP API (docs/http-api.md), served at `GET
/api/openapi.json`. The runner routes are not part of it: only runners call them, with an agent token.
tests/test_openapi.py runs Schemathesis against the live server to keep it true."""
import copy

from suzumio_resources import VERSION


def _ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema, description):
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _text(description):
    return {"description": description, "content": {"text/plain; charset=utf-8": {"schema": {"type": "string"}}}}


def _array(name):
    return {"type": "array", "items": _ref(name)}


def _path_param(name, description):
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string"}}


LIMIT = {"name": "limit", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "How many entries (a positive decimal is floored; anything else means the default)."}
STRING = {"type": "string"}
NULLABLE_STRING = {"type": ["string", "null"]}
INTEGER = {"type": "integer"}

SCHEMAS = {
    "EvalSummary": {"type": "object", "required": ["id", "suite", "mode", "status", "runs", "passed"],
                    "properties": {"id": STRING, "suite": STRING, "mode": {"enum": ["live", "replay", "fork"]},
                                   "status": {"enum": ["running", "done"]}, "createdAt": STRING, "runs": INTEGER,
                                   "passed": INTEGER}},
    "EvalRequest": {"type": "object", "description": "The suite (docs/evals.md#suites), as the body or as `suite`, "
                    "with the options beside it",
                    "properties": {"suite": {"type": "object"}, "runs": INTEGER,
                                   "variant": {"type": ["string", "array"], "items": STRING},
                                   "mode": {"enum": ["live", "replay", "fork"]}, "from": STRING, "at": STRING,
                                   "baseline": STRING, "failUnder": {"type": "number"}}},
    "Eval": {"type": "object", "required": ["id", "suite", "mode", "status", "results", "regressions"],
             "properties": {"id": STRING, "suite": STRING, "mode": STRING, "status": {"enum": ["running", "done"]},
                            "progress": {"type": "object"}, "results": {"type": "array", "items": {"type": "object"}},
                            "regressions": {"type": "array", "items": {"type": "object"}},
                            "runs": {"type": "array", "items": {"type": "object"}}}},
    "Error": {"type": "object", "required": ["error"], "properties": {"error": STRING},
              "description": "The one error shape of every route (docs/http-api.md)."},
    "Health": {"type": "object", "required": ["healthy"],
               "properties": {"healthy": {"type": "boolean"},
                              "components": {"type": "object", "additionalProperties": STRING}}},
    "Version": {"type": "object", "required": ["version"], "properties": {"version": STRING}},
    "Stats": {"type": "object", "additionalProperties": INTEGER,
              "required": ["messageCount", "activationCount", "failedActivationCount", "runningActivationCount",
                           "toolCallCount", "historyMessageCount", "historyCompactionCount", "eventCount"]},
    "Agent": {"type": "object", "required": ["id", "project", "status"],
              "properties": {"id": STRING, "project": STRING, "role": STRING, "displayName": STRING,
                             "status": STRING, "model": STRING, "tools": {"type": "array", "items": STRING},
                             "activeActivationId": STRING, "containerName": STRING, "createdAt": STRING,
                             "updatedAt": STRING, "promptChars": INTEGER,
                             "paused": {"type": "object", "description": "Set while a loop guard keeps the agent "
                                        "paused: the guard.tripped data and `at` (docs/operations.md#runaways)"}}},
    "Message": {"type": "object", "required": ["id", "project", "sender", "priority", "body", "createdAt"],
                "properties": {"id": STRING, "project": STRING, "sender": STRING, "recipient": STRING,
                               "channel": STRING, "priority": {"enum": ["P0", "P1", "P2", "P3"]},
                               "body": STRING, "createdAt": STRING, "queued": {"type": "boolean"},
                               "note": STRING},
                "description": "`queued` and `note` only in the answer to a send to a project that is not "
                               "running: the message waits for the team's next run (docs/http-api.md)."},
    "Activation": {"type": "object", "required": ["id", "project", "agentId", "status", "startedAt"],
                   "properties": {"id": STRING, "project": STRING, "agentId": STRING, "status": STRING,
                                  "containerName": STRING, "node": STRING, "startedAt": STRING,
                                  "completedAt": STRING, "text": STRING, "error": STRING, "emittedMessages": INTEGER,
                                  "usageJson": STRING, "hasContext": {"type": "boolean"},
                                  "commitStart": {"type": "string", "description": "its branch's head at its start "
                                                  "(agents with a working copy of the repository)"},
                                  "commitEnd": {"type": "string", "description": "the commit of what it changed"}}},
    "Event": {"type": "object", "required": ["id", "project", "type", "data_json", "created_at"],
              "properties": {"id": STRING, "project": STRING, "type": STRING, "data_json": STRING,
                             "created_at": STRING}},
    "ToolCall": {"type": "object", "required": ["id", "project", "activation_id", "agent_id", "tool", "status",
                                                "created_at", "completed_at"],
                 "properties": {"id": STRING, "project": STRING, "activation_id": STRING, "agent_id": STRING,
                                "tool": STRING, "input_json": STRING, "status": STRING, "output": STRING,
                                "error": STRING, "created_at": STRING, "completed_at": NULLABLE_STRING}},
    "ToolStatus": {"type": "object", "required": ["tool", "enabledForAgents", "callCount"],
                   "properties": {"tool": STRING, "enabledForAgents": {"type": "array", "items": STRING},
                                  "callCount": INTEGER, "runningCount": INTEGER, "completedCount": INTEGER,
                                  "failedCount": INTEGER}},
    "Project": {"type": "object",
                "required": ["id", "name", "status", "task", "created_at", "updated_at", "stats", "agents",
                             "recentActivations", "recentMessages"],
                "properties": {"id": STRING, "name": STRING, "status": STRING, "task": STRING,
                               "submitted_report": NULLABLE_STRING, "created_at": STRING, "updated_at": STRING,
                               "stats": _ref("Stats"), "spend": _ref("Spend"),
                               "agentSpend": {"type": "object", "additionalProperties": _ref("Spend")},
                               "agentEgress": {"type": "object", "additionalProperties": _ref("EgressTotals")},
                               "agents": _array("Agent"),
                               "recentActivations": _array("Activation"), "recentMessages": _array("Message"),
                               "origin": {"oneOf": [_ref("Origin"), {"type": "null"}]}}},
    "EgressTotals": {"type": "object", "required": ["connections", "denied", "bytesIn", "bytesOut"],
                     "properties": {"connections": INTEGER, "denied": INTEGER, "bytesIn": INTEGER,
                                    "bytesOut": INTEGER},
                     "description": "One agent's egress.allowed (connections) and egress.denied events, with "
                                    "the bytes received and sent through the egress proxy."},
    "HistoryPage": {"type": "object", "required": ["agentId", "messages"],
                    "properties": {"agentId": STRING, "nextBefore": INTEGER,
                                   "messages": {"type": "array", "items": {"type": "object"}}}},
    "ActivationContext": {"type": "object", "required": ["activation", "activationPrompt"],
                          "properties": {"activation": _ref("Activation"), "activationPrompt": STRING,
                                         "context": {"type": "object"}}},
    "SendMessage": {"type": "object", "required": ["body"],
                    "properties": {"body": {"type": "string", "minLength": 1}, "recipient": STRING,
                                   "channel": STRING, "sender": STRING,
                                   "priority": {"enum": ["P0", "P1", "P2", "P3"]}},
                    "description": "Exactly one of recipient (an agent id) and channel (a #channel)."},

    "Approval": {"type": "object", "required": ["id", "agentId", "activationId", "toolCallId", "tool", "input",
                                                "status", "onExpiry", "expiresAt", "createdAt"],
                 "properties": {"id": STRING, "agentId": STRING, "activationId": STRING, "toolCallId": STRING,
                                "tool": STRING, "input": {}, "rule": {"type": "object"},
                                "status": {"enum": ["pending", "allowed", "denied", "expired", "cancelled",
                                                    "responded"]},
                                "decision": {"enum": ["allow", "deny", "allow-always", "respond"]},
                                "editedInput": {"type": "object", "description": "The input a person ran the "
                                                "call with instead of `input`"},
                                "output": {"type": "string", "description": "A person's answer (respond)"},
                                "preview": {"type": "object", "description": "A pending repo.merge: the change "
                                            "it would queue", "properties": {"diff": STRING}},
                                "decidedBy": {"enum": ["api", "cli", "webui", "mcp", "timeout", "system"]},
                                "note": STRING, "onExpiry": {"enum": ["allow", "deny"]}, "expiresAt": STRING,
                                "createdAt": STRING, "decidedAt": STRING, "usedAt": STRING}},
    "Effect": {"type": "object", "required": ["id", "agent", "activation", "tool", "input", "state", "startedAt"],
               "description": "One external tool call in the effect ledger "
                              "(docs/operations.md#what-an-agent-can-do-to-the-outside-world)",
               "properties": {"id": STRING, "agent": STRING, "activation": STRING, "tool": STRING, "input": {},
                              "state": {"enum": ["intended", "done", "failed", "in_doubt"]},
                              "callKey": STRING, "startedAt": STRING, "toolCallId": STRING,
                              "executor": {"enum": ["runner", "controller"]}, "finishedAt": STRING,
                              "doubtedAt": STRING, "why": STRING, "resolvedAt": STRING,
                              "resolution": {"enum": ["done", "not_done"]},
                              "resolvedBy": {"enum": ["api", "cli", "webui"]}, "note": STRING}},
    "EffectResolution": {"type": "object", "required": ["resolution"],
                         "properties": {"resolution": {"enum": ["done", "not_done"]}, "note": STRING}},
    "ApprovalDecision": {"type": "object", "required": ["decision"],
                         "description": "`input` only with allow (validated against the tool's input schema); "
                                        "`output` required with respond and accepted only there.",
                         "properties": {"decision": {"enum": ["allow", "deny", "allow-always", "respond"]},
                                        "note": {"type": "string", "maxLength": 4000},
                                        "input": {"type": "object"},
                                        "output": {"type": "string", "minLength": 1, "maxLength": 100000}}},
    "Concurrency": {"type": "object", "required": ["running", "waiting", "paused"],
                    "properties": {"maxConcurrentActivations": INTEGER, "running": INTEGER,
                                   "rootMaxActivations": INTEGER, "rootRunning": INTEGER,
                                   "waiting": {"type": "array", "items": {
                                       "type": "object", "required": ["agentId", "signals", "since", "cap"],
                                       "properties": {"agentId": STRING, "signals": INTEGER, "since": STRING,
                                                      "cap": {"enum": ["project", "root"]}}}},
                                   "paused": {"type": "array", "items": {"type": "object"}}}},
    # Controller-observed spend; costUsd is null when no call of the group had prices; tokens count the
    # cached prompt tokens too (cachedTokens read from a provider's cache, cacheWriteTokens written to it)
    "Spend": {"type": "object", "required": ["calls", "tokens", "cachedTokens", "costUsd"],
              "properties": {"calls": INTEGER, "tokens": INTEGER, "cachedTokens": INTEGER,
                             "cacheWriteTokens": INTEGER, "costUsd": {"type": ["number", "null"]}}},
    "Costs": {"type": "object", "required": ["project", "agents", "activations"],
              "properties": {"project": _ref("Spend"),
                             "agents": {"type": "object", "additionalProperties": _ref("Spend")},
                             "activations": {"type": "object", "additionalProperties": _ref("Spend")}}},
    "ActivationDelta": {
        "type": "object", "required": ["type", "activationId", "agentId", "presetId", "callId"],
        "description": "An ephemeral `activation.delta` SSE frame (no `id:` line, never stored or replayed): "
                       "model output of a running activation as the server streams it.",
        "properties": {"type": {"const": "activation.delta"}, "activationId": STRING, "agentId": STRING,
                       "presetId": STRING, "callId": STRING, "text": STRING, "reasoning": STRING,
                       "toolCalls": {"type": "array", "items": {
                           "type": "object", "properties": {"index": INTEGER, "id": NULLABLE_STRING,
                                                            "name": NULLABLE_STRING, "arguments": STRING}}},
                       "done": {"type": "boolean"}}},
    "RequestChanges": {"type": "object", "required": ["body"],
                       "properties": {"body": {"type": "string", "minLength": 1}, "recipient": STRING}},
    # The flight recorder (docs/replay.md)
    "Replay": {"type": "object", "required": ["as"],
               "properties": {"as": {"type": "string", "minLength": 1, "description": "the new project's name"},
                              "tools": {"enum": ["live", "recorded"], "default": "live"},
                              "onDiverge": {"enum": ["stop", "live"], "default": "stop"},
                              "config": {"type": "string", "description": "a project file (YAML) with the "
                                                                          "source's agents; its name is replaced"}}},
    "Diff": {"type": "object", "required": ["a", "b", "identical", "firstDifference", "sections"],
             "properties": {"a": STRING, "b": STRING, "identical": {"type": "boolean"},
                            "firstDifference": {"type": ["object", "null"], "required": ["section", "a", "b"],
                                                "properties": {"section": {"enum": ["messages", "toolCalls",
                                                               "activations", "artifacts", "report", "tokens",
                                                               "cost", "repository"]},
                                                               "index": INTEGER, "key": STRING}},
                            "sections": {"type": "object", "additionalProperties": {
                                "type": "object", "required": ["identical", "a", "b"],
                                "properties": {"identical": {"type": "boolean"}}}}}},
    "Fork": {"type": "object", "required": ["as", "at"],
             "properties": {"as": {"type": "string", "minLength": 1, "description": "the new project's name"},
                            "at": {"type": "string", "minLength": 1, "description": "an ended activation's id"},
                            "config": {"type": "string", "description": "a project file (YAML) with the "
                                                                        "source's agents; its name is replaced"}}},
    "Report": {"type": "object", "required": ["report", "status"],
               "properties": {"report": {"type": ["string", "null"], "description": "the last submitted report"},
                              "status": STRING}},
    "ArtifactFile": {"type": "object", "required": ["agent", "path", "size", "versions"],
                     "properties": {"agent": STRING, "path": {"type": "string", "description": "inside the "
                                                              "agent's artifacts folder"},
                                    "size": INTEGER, "versions": {"type": "integer", "description": "the versions "
                                                                  "the flight recorder holds"}}},
    "Artifact": {"type": "object", "required": ["agent", "path", "version", "versions", "size", "content", "binary"],
                 "properties": {"agent": STRING, "path": STRING, "version": {"type": ["integer", "null"]},
                                "versions": INTEGER, "size": INTEGER, "content": NULLABLE_STRING,
                                "binary": {"type": "boolean"}}},
    "ArtifactDiff": {"type": "object", "required": ["path", "from", "to", "diff"],
                     "properties": {"path": STRING, "from": INTEGER, "to": {"type": ["integer", "null"]},
                                    "diff": {"type": "string", "description": "unified diff"}}},
    "ProjectFile": {"type": "object", "required": ["config"],
                    "properties": {"config": {"type": "string", "description": "a project file (YAML text)"},
                                   "start": {"type": "boolean", "description": "start it once initialized"}}},
    "ConfigCheck": {"type": "object", "required": ["valid", "errors"],
                    "properties": {"valid": {"type": "boolean"},
                                   "errors": {"type": "array", "items": STRING,
                                              "description": "one per error, each naming its dotted path"},
                                   "name": STRING, "agents": {"type": "array", "items": STRING},
                                   "warnings": {"type": "array", "items": STRING},
                                   "unknownKeys": {"type": "array", "items": STRING}}},
    "InboxItem": {"type": "object", "required": ["kind", "project"],
                  "description": "One thing waiting for a person; more kinds may be added, so clients show unknown "
                                 "ones by kind",
                  "properties": {"kind": {"type": "string", "description": "approval (a call awaiting approval), "
                                          "report (a report awaiting review), paused (an agent a guard paused) or "
                                          "in_doubt (an external call that may or may not have happened)"},
                                 "project": STRING, "id": STRING, "agentId": STRING, "tool": STRING,
                                 "rule": NULLABLE_STRING, "reason": NULLABLE_STRING, "since": NULLABLE_STRING,
                                 "expiresAt": STRING}},
    "ProjectInbox": {"type": "object", "required": ["project", "count", "items"],
                     "properties": {"project": STRING, "count": INTEGER, "items": _array("InboxItem")}},
    "Inbox": {"type": "object", "required": ["count", "projects", "items"],
              "properties": {"count": INTEGER, "projects": {"type": "object", "additionalProperties": INTEGER,
                                                            "description": "per project that is not completed"},
                             "items": _array("InboxItem")}},
    "Repository": {"type": "object", "required": ["branch", "head", "log", "branches", "queue", "claims"],
                   "description": "The team's repository (docs/teams-that-write-code.md)",
                   "properties": {
                       "branch": STRING, "head": STRING, "source": STRING, "checks": {"type": "array", "items": STRING},
                       "claimsEnabled": {"type": "boolean"},
                       "log": {"type": "array", "items": {"type": "object", "required": ["commit", "subject", "author"],
                                                          "properties": {"commit": STRING, "subject": STRING,
                                                                         "author": STRING, "date": STRING}}},
                       "branches": {"type": "array", "items": {
                           "type": "object", "required": ["name", "agent", "head", "ahead", "behind"],
                           "properties": {"name": STRING, "agent": STRING, "head": STRING, "ahead": INTEGER,
                                          "behind": INTEGER}}},
                       "queue": {"type": "array", "items": {
                           "type": "object", "required": ["id", "agent", "message", "head", "status"],
                           "properties": {"id": STRING, "agent": STRING, "activationId": STRING, "message": STRING,
                                          "head": STRING, "status": {"enum": ["queued", "running", "merged", "failed"]},
                                          "commit": STRING, "reason": {"enum": ["conflict", "checks"]},
                                          "paths": {"type": "array", "items": STRING}, "output": STRING,
                                          "createdAt": STRING, "finishedAt": STRING}}},
                       "claims": {"type": "array", "items": {
                           "type": "object", "required": ["id", "agent", "path", "reason", "expiresAt"],
                           "properties": {"id": STRING, "agent": STRING, "path": STRING, "reason": STRING,
                                          "createdAt": STRING, "expiresAt": STRING}}}}},
    "RepositoryDiff": {"type": "object", "required": ["from", "to", "diff"],
                       "properties": {"from": STRING, "to": STRING, "diff": STRING,
                                      "truncated": {"type": "boolean"}}},
    "Origin": {"type": "object", "required": ["kind", "source"],
               "description": "Where a replay or fork came from, and how far a replay got",
               "properties": {"kind": {"enum": ["replay", "fork"]}, "source": STRING, "at": NULLABLE_STRING,
                              "tools": {"enum": ["live", "recorded", None]},
                              "onDiverge": {"enum": ["stop", "live", None]},
                              "diverged": {"type": ["object", "null"], "description": "the replay.diverged data"},
                              "injectedMessages": INTEGER, "ended": {"type": "boolean"}, "createdAt": STRING}},
}

ERRORS = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "403": {"$ref": "#/components/responses/Forbidden"},
    "404": {"$ref": "#/components/responses/NotFound"},
}
CONFLICT = {"409": {"$ref": "#/components/responses/Conflict"}}
PROJECT = _path_param("project", "Project name")
ARTIFACT_PATH = _path_param("path", "<agent>/<path inside its artifacts folder> (slashes may be percent-encoded)")
VERSION_QUERY = {"name": "version", "in": "query", "required": False, "schema": STRING,
                 "description": "a recorded version, 1 the oldest the recorder holds; default: the file now"}


def _get(summary, answer, parameters=(), errors=ERRORS):
    return {"get": {"summary": summary, "parameters": list(parameters), "responses": {"200": answer, **errors}}}


def _post(summary, answer, body=None, parameters=(PROJECT,), conflict=True):
    operation = {"summary": summary, "parameters": list(parameters),
                 "responses": {"200": answer, **ERRORS, **(CONFLICT if conflict else {})}}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return {"post": operation}


PROJECT_ANSWER = _json(_ref("Project"), "The project summary after the change")

PATHS = {
    "/health": {"get": {"summary": "Liveness of the controller's loops; never needs a token",
                        "security": [], "responses": {
                            "200": _json(_ref("Health"), "Every loop is up: exactly {\"healthy\": true}"),
                            "503": _json(_ref("Health"), "A loop is down or the disk is full; components names each "
                                         "loop's state and the disk's")}}},
    "/api/version": _get("The Suzumio version (also in the Suzumio-Version header of every answer)",
                         _json(_ref("Version"), "The version")),
    "/api/openapi.json": _get("This document", _json({"type": "object"}, "OpenAPI 3.1")),
    "/api/projects": {
        **_get("Every project, summarized", _json(_array("Project"), "Projects by name")),
        "post": {"summary": "Initialize a project from a project file's text, as suzumio init does (and start it)",
                 "parameters": [],
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ProjectFile")}}},
                 "responses": {"201": _json(_ref("Project"), "The new project"), **ERRORS, **CONFLICT}}},
    "/api/config/validate": _post(
        "Check a project file's text as suzumio config render does; the answer lists every error",
        _json(_ref("ConfigCheck"), "The check"), _ref("ProjectFile"), parameters=(), conflict=False),
    "/api/projects/{project}": _get("One project", _json(_ref("Project"), "The project"), [PROJECT]),
    "/api/projects/{project}/task": _get("The task text", _text("The task"), [PROJECT]),
    "/api/projects/{project}/agents": _get("The agents", _json(_array("Agent"), "Agents by id"), [PROJECT]),
    "/api/projects/{project}/agents/{agent}/history": _get(
        "A page of an agent's history, newest first", _json(_ref("HistoryPage"), "The page"),
        [PROJECT, _path_param("agent", "Agent id"), LIMIT,
         {"name": "before", "in": "query", "required": False, "schema": {"type": "string"}},
         {"name": "includeArchived", "in": "query", "required": False, "schema": {"type": "string"}}]),
    "/api/projects/{project}/agents/{agent}/history-archive/{compaction}": _get(
        "The archived messages of one compaction", _json({"type": "object"}, "The archive"),
        [PROJECT, _path_param("agent", "Agent id"), _path_param("compaction", "Compaction id")]),
    "/api/projects/{project}/messages": {
        **_get("The newest messages", _json(_array("Message"), "Messages, oldest first"), [PROJECT, LIMIT]),
        **_post("Send a message and run a scheduler pass", _json(_ref("Message"), "The stored message"),
                _ref("SendMessage"))},
    "/api/projects/{project}/messages/{message}": _get(
        "One message", _json(_ref("Message"), "The message"), [PROJECT, _path_param("message", "Message id")]),
    "/api/projects/{project}/events": _get(
        "The newest events, or a page of older ones", _json(_array("Event"), "Events, newest first"),
        [PROJECT, LIMIT, *({"name": name, "in": "query", "required": False, "schema": STRING, "description": text}
                           for name, text in (("before", "an event id: only events older than it"),
                                              ("type", "one event type, or a prefix ending in . (tool.)"),
                                              ("agent", "the events whose agentId or sender is this agent")))]),
    "/api/projects/{project}/activations": _get(
        "The newest activations", _json(_array("Activation"), "Activations, oldest first"), [PROJECT, LIMIT]),
    "/api/projects/{project}/costs": _get(
        "Tokens and USD per activation, agent and project, from the model calls the controller forwarded",
        _json(_ref("Costs"), "The spend"), [PROJECT]),
    "/api/projects/{project}/timeline": _get(
        "A time-range page of the Team view, newest first (docs/http-api.md)",
        _json({"type": "object", "required": ["activations", "messages", "waits", "approvals"], "properties": {
            "since": {"type": "string"}, "until": {"type": "string"}, "more": {"type": "boolean"},
            **{name: {"type": "array", "items": {"type": "object"}}
               for name in ("activations", "messages", "waits", "approvals")}}}, "The page"),
        [PROJECT, *({"name": name, "in": "query", "required": False, "schema": {"type": "string"},
                     "description": "ISO-8601 time; a page holds [since, until)"} for name in ("since", "until")),
         {"name": "limit", "in": "query", "required": False, "schema": {"type": "string"},
          "description": "items per page (default 500, at most 2000)"}]),
    "/api/projects/{project}/activations/{activation}/context": _get(
        "The model context of one activation", _json(_ref("ActivationContext"), "The context"),
        [PROJECT, _path_param("activation", "Activation id")]),
    "/api/projects/{project}/tool-calls": _get(
        "The newest tool calls", _json(_array("ToolCall"), "Tool calls, newest first"), [PROJECT, LIMIT]),
    "/api/projects/{project}/tool-status": _get(
        "Every tool with its call counts", _json(_array("ToolStatus"), "Tools by name"), [PROJECT]),
    "/api/projects/{project}/tool-ui": _get(
        "The WebUI entries of the project's toolpacks",
        _json({"type": "array", "items": {"type": "object"}}, "Entries"), [PROJECT]),
    "/api/projects/{project}/tool-ui/{toolpackId}/{entryId}": _post(
        "Invoke a toolpack's WebUI entry", _json({}, "What the entry's handler answered"),
        {"type": "object"}, [PROJECT, _path_param("toolpackId", "Toolpack id"), _path_param("entryId", "Entry id")]),
    "/api/projects/{project}/config/resolved": _get(
        "The resolved configuration as YAML, secrets redacted", _text("resolved.yaml, redacted"), [PROJECT]),
    "/api/projects/{project}/report": _get(
        "The submitted final report: text, or {report, status} with Accept: application/json",
        {"description": "The report", "content": {
            "text/plain; charset=utf-8": {"schema": STRING}, "application/json": {"schema": _ref("Report")}}},
        [PROJECT]),
    "/api/projects/{project}/artifacts": _get(
        "Every agent's artifact files with their size and recorded versions",
        _json(_array("ArtifactFile"), "Files by agent and path"), [PROJECT]),
    "/api/projects/{project}/artifacts/{path}": _get(
        "One artifact file as it is now, or a recorded version; ?raw=1 downloads its bytes",
        {"description": "The file", "content": {"application/json": {"schema": _ref("Artifact")},
                                                "application/octet-stream": {"schema": STRING}}},
        [PROJECT, ARTIFACT_PATH, VERSION_QUERY,
         {"name": "raw", "in": "query", "required": False, "schema": STRING,
          "description": "1: the bytes as a download instead of JSON"}]),
    "/api/projects/{project}/artifacts/{path}/diff": _get(
        "A unified diff of two recorded versions of an artifact file (to absent: the file as it is now)",
        _json(_ref("ArtifactDiff"), "The diff"),
        [PROJECT, ARTIFACT_PATH, *({"name": name, "in": "query", "required": False, "schema": STRING,
                                    "description": text} for name, text in (
                                        ("from", "the older version number (required)"),
                                        ("to", "the newer version number; default: the file now")))]),
    "/api/inbox": _get("What waits for a person across every project that is not completed",
                       _json(_ref("Inbox"), "The items and a count per project")),
    "/api/projects/{project}/inbox": _get("What waits for a person in one project",
                                          _json(_ref("ProjectInbox"), "The items"), [PROJECT]),
    "/api/projects/{project}/repository": _get(
        "The team's repository: integration branch, log, agent branches ahead/behind, merge queue, claims",
        _json(_ref("Repository"), "The repository"), [PROJECT]),
    "/api/projects/{project}/repository/diff": _get(
        "git diff between two revisions of the project's repository (defaults: the integration tip's parent, "
        "the tip)", _json(_ref("RepositoryDiff"), "The diff"),
        [PROJECT, *({"name": name, "in": "query", "required": False, "schema": STRING, "description": text}
                    for name, text in (("from", "the older revision"), ("to", "the newer revision")))]),
    "/api/projects/{project}/start": _post("Start or resume the project", PROJECT_ANSWER),
    "/api/projects/{project}/stop": _post("Stop the project", PROJECT_ANSWER),
    "/api/projects/{project}/approve": _post("Approve the result and complete the project", PROJECT_ANSWER),
    "/api/projects/{project}/request-changes": _post(
        "Send the coordinator a change request", PROJECT_ANSWER, _ref("RequestChanges")),
    "/api/projects/{project}/diff/{other}": _get(
        "Compare two runs section by section (docs/replay.md)", _json(_ref("Diff"), "The comparison"),
        [PROJECT, _path_param("other", "The project to compare with")]),
    "/api/projects/{project}/fork": {"post": {
        "summary": "Fork the project at an ended activation as a new project that runs live (docs/replay.md)",
        "parameters": [PROJECT],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Fork")}}},
        "responses": {"201": _json(_ref("Project"), "The new project, with its origin"), **ERRORS, **CONFLICT}}},
    "/api/projects/{project}/replay": {"post": {
        "summary": "Replay the project's recorded run as a new project, started at once (docs/replay.md)",
        "parameters": [PROJECT],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Replay")}}},
        "responses": {"201": _json(_ref("Project"), "The new project, with its origin"), **ERRORS, **CONFLICT}}},
    "/api/projects/{project}/approvals": _get(
        "Approval requests: pending ones oldest first, then decided ones newest first",
        _json(_array("Approval"), "Approval requests"),
        [PROJECT, LIMIT, {"name": "status", "in": "query", "required": False, "schema": STRING,
                          "description": "pending, allowed, denied, expired, cancelled or responded"}]),
    "/api/projects/{project}/approvals/{approval}": {
        **_get("One approval request", _json(_ref("Approval"), "The request"),
               [PROJECT, _path_param("approval", "Approval id")]),
        **_post("Decide a pending approval request, exactly once (409 when it is no longer pending): allow "
                "(optionally with an edited input), deny, allow-always, or respond with the call's result",
                _json(_ref("Approval"), "The decided request"), _ref("ApprovalDecision"),
                [PROJECT, _path_param("approval", "Approval id")])},
    "/api/projects/{project}/effects": _get(
        "The effect ledger: external tool calls, newest first", _json(_array("Effect"), "Effects"),
        [PROJECT, LIMIT, {"name": "state", "in": "query", "required": False, "schema": STRING,
                          "description": "intended, done, failed or in_doubt"}]),
    "/api/projects/{project}/effects/{effect}/resolve": _post(
        "Say whether a call in doubt happened (409 when it is not in doubt); its agent is told",
        _json(_ref("Effect"), "The resolved effect"), _ref("EffectResolution"),
        [PROJECT, _path_param("effect", "Effect id")]),
    "/api/projects/{project}/agents/{agent}/resume": _post(
        "Resume an agent a loop guard paused (409 when it is not paused); its guards count afresh",
        _json(_ref("Agent"), "The agent"), {"type": "object"}, [PROJECT, _path_param("agent", "Agent id")]),
    "/api/projects/{project}/concurrency": _get(
        "The concurrency caps, what runs, the agents waiting on a full cap and the paused agents",
        _json(_ref("Concurrency"), "The caps"), [PROJECT]),
    # Evals (docs/evals.md)
    "/api/evals": {
        **_get("Every kept eval", _json(_array("EvalSummary"), "Evals, oldest first")),
        "post": {"summary": "Start an eval of a suite: serve's eval thread runs and grades it (docs/evals.md)",
                 "parameters": [],
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("EvalRequest")}}},
                 "responses": {"201": _json({"type": "object", "required": ["id"], "properties": {"id": STRING}},
                                            "The new eval's id"), **ERRORS,
                               "503": {"$ref": "#/components/responses/Unavailable"}}}},
    "/api/evals/{eval_id}": {"get": {
        "summary": "An eval's result document, while it runs and when it is done",
        "parameters": [_path_param("eval_id", "Eval id")],
        "responses": {"200": _json(_ref("Eval"), "The eval"), **ERRORS,
                      "503": {"$ref": "#/components/responses/Unavailable"}}}},
    "/api/evals/{eval_id}/stream": {"get": {
        "summary": "An eval's progress as Server-Sent Events: `running` frames as it changes, `done` at the end",
        "parameters": [_path_param("eval_id", "Eval id")],
        "responses": {"200": {"description": "The progress stream (closes after 30 seconds; reconnect)",
                              "content": {"text/event-stream": {"schema": {"type": "string"}}}}, **ERRORS,
                      "503": {"$ref": "#/components/responses/Unavailable"}}}},
    "/api/projects/{project}/stream": {"get": {
        "summary": "Server-sent events: the newest events replayed, then each new one as it is stored",
        "description": "Each frame is `id: <rowid>`, `event: <type>`, `data: <event JSON>`; a comment "
                       "line keeps the connection alive. Send Last-Event-ID to resume. Browsers that cannot "
                       "set a header may pass the API token as the `token` query parameter. Running "
                       "activations also send ephemeral `activation.delta` frames without an `id:` line "
                       "(components.schemas.ActivationDelta): never stored, never replayed. Stored events "
                       "include `model.retry` (a retried model request and its reason), `model.waiting` "
                       "(a model call waits at its provider's limits or pause), `model.provider_paused` (a 429 "
                       "or 503 with Retry-After paused a provider for the team), "
                       "`project.budget_warning` and `project.budget_exceeded`.",
        "parameters": [PROJECT, LIMIT,
                       {"name": "Last-Event-ID", "in": "header", "required": False, "schema": STRING},
                       {"name": "token", "in": "query", "required": False, "schema": STRING}],
        "responses": {"200": {"description": "The event stream",
                              "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                      **ERRORS}}},
}


def _error_answer(description):
    return _json(_ref("Error"), description)


DOCUMENT = {
    "openapi": "3.1.0",
    "info": {"title": "Suzumio HTTP API (user routes)", "version": VERSION,
             "description": "The controller's user routes (docs/http-api.md). Every error is "
                            "{\"error\": \"<message>\"}. The runner routes are not described here."},
    "servers": [{"url": "/"}],
    "security": [{"bearerToken": []}],
    "paths": PATHS,
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {"bearerToken": {
            "type": "http", "scheme": "bearer",
            "description": "The API token (`Authorization: Bearer <token>`) when the controller requires one."}},
        "responses": {
            "BadRequest": _error_answer("The request is malformed"),
            "Unauthorized": _error_answer("No API token, or a wrong one"),
            "Forbidden": _error_answer("Refused by the Host, Origin or token checks"),
            "NotFound": _error_answer("No such project, agent, message, activation, route or entry"),
            "Conflict": _error_answer("The project or agent is not in a state that allows this"),
            "Unavailable": _error_answer("The part of the controller that would answer is not running"),
        },
    },
}


def document():
    """A fresh copy of the document (callers may change it)."""
    return copy.deepcopy(DOCUMENT)
