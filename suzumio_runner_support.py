"""Runner-facing HTTP routes (docs/design/runner.md, docs/http-api.md): tool-call audit, support calls,
signals, history, model calls (forwarded by suzumio_model_proxy), activation context and output, all
authenticated by the per-agent token, served by their own app on the runner listener (make_runner_app).
The HTTP conventions both apps share are suzumio_http's."""
import concurrent.futures
import hmac
import json
import logging
import math
import os
import re
import threading
import time

import bottle

import suzumio_approvals
import suzumio_coordination as coordination
import suzumio_files
import suzumio_guards
import suzumio_model_loop
import suzumio_recorder
import suzumio_replay
import suzumio_repository
import suzumio_scheduler
import suzumio_sse
from suzumio_cost import call_cost
from suzumio_errors import BadGateway, BadRequest, Conflict, Forbidden, SuzumioError
from suzumio_http import (
    base_app,
    floored,
    json_response,
    optional_text,
    read_fields,
    required_string,
    run_tick,
)
from suzumio_live import DELTA_EVENT
from suzumio_model_proxy import Forwarding, ModelAnswer, ModelProxy
from suzumio_records import (
    ACT_RUNNING,
    HISTORY_CLOSED,
    HISTORY_ROLES,
    KIND_MODEL_RETRY,
    KIND_MODEL_WAITING,
    KIND_PROVIDER_PAUSED,
    TOOL_CALL_END_STATUSES,
    TOOL_CALLS_CLOSED,
    format_ts,
    utc_now,
)
from suzumio_runner_models import chat_completions_usage

log = logging.getLogger(__name__)

IDENTITY_FIELDS = ("project", "agentId", "activationId", "token")
MODEL_CALLS_CLOSED = "no more model calls are accepted"
FILES_CLOSED = "its files are no longer exchanged"
MAX_CALL_KEY_CHARS = 128
CALL_KEY = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_CALL_KEY_CHARS}}}")


# ---------------------------------------------------------------- authorization (docs/http-api.md)

def tokens_match(given, expected):
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class RunnerCall:
    """An authenticated runner request: the project store, the calling agent and its activation."""

    def __init__(self, store, agent, activation, body):
        self.store = store
        self.agent = agent
        self.activation = activation
        self.body = body

    @property
    def agent_id(self):
        return self.agent["id"]

    @property
    def activation_id(self):
        return self.activation["id"]


def authorize(root, body, fields=(), *, body_checks=None, running=None):
    """Checks A–G of docs/http-api.md in their order; `running` is the 409 wording or None."""
    for field in (*IDENTITY_FIELDS, *fields):
        required_string(body, field)
    if body_checks:
        body_checks(body)
    store = root.open_project(body["project"])
    agent = store.agent(body["agentId"], include_token=True)
    if not tokens_match(body["token"], agent["token"]):
        raise Forbidden("Invalid agent token")
    activation = store.activation(body["activationId"])
    if activation["agentId"] != agent["id"]:
        raise Forbidden(f"Activation {activation['id']} does not belong to {agent['id']}")
    if running and activation["status"] != ACT_RUNNING:
        raise Conflict(f"Activation {activation['id']} is {activation['status']}; {running}")
    return RunnerCall(store, agent, activation, body)


def check_context(body):
    context = body.get("context")
    if not isinstance(context, dict):
        raise BadRequest("context is required")
    if (context.get("version") != 1 or context.get("kind") != "model-context"
            or not isinstance(context.get("messages"), list)):
        raise BadRequest("Invalid activation context")


def check_model_request(body):
    if not isinstance(body.get("body"), dict):
        raise BadRequest("body is required")


def check_call_key(body):
    """`callKey` (docs/http-api.md#runner-routes), the runner's key for one model tool call, is optional (a
    runner without it gets no retry safety) and a short token when given."""
    key = body.get("callKey")
    if key is not None and (not isinstance(key, str) or CALL_KEY.fullmatch(key) is None):
        raise BadRequest(f"callKey must be 1 to {MAX_CALL_KEY_CHARS} letters, digits, '.', '_', ':' or '-'")


def check_output(body):
    output = body.get("output")
    if not isinstance(output, dict):
        raise BadRequest("output is required")
    text = output.get("text")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("output.text is required")


# ---------------------------------------------------------------- routes

def trace_model_call(tracer, call, config, provider_id, preset_id, started, answer, error):
    """The GenAI span of one forwarded model call (suzumio_telemetry), when tracing is on."""
    if tracer is None or not tracer.enabled:
        return
    preset = config.runner.presets.get(preset_id)
    provider = config.runner.providers.get(provider_id)
    response = {}
    if answer is not None:
        try:
            response = json.loads(answer.body)
        except ValueError:
            response = {}
    response = response if isinstance(response, dict) else {}
    choices = response.get("choices") if isinstance(response.get("choices"), list) else []
    usage = answer.usage if answer is not None else {}
    tracer.model_call(
        project=call.store.project_id, agent_id=call.agent_id, activation_id=call.activation_id,
        provider=provider.type if provider is not None else provider_id,
        model=(preset.api_model or preset.model) if preset is not None else preset_id,
        response_model=response.get("model"), start=started, end=utc_now(),
        input_tokens=usage.get("input"), output_tokens=usage.get("output"), total_tokens=usage.get("total"),
        cache_read_tokens=usage.get("cacheRead"),
        finish_reasons=[c["finish_reason"] for c in choices if isinstance(c, dict) and c.get("finish_reason")],
        error=error)


def make_runner_app(root, toolpacks, scheduler, model_proxy=None, tracer=None):
    """The runner listener's WSGI app: the runner routes only, no user route and no user guard (the
    agent token authenticates every call). Served on the runner socket or `serve --runner-listen`."""
    app = base_app()
    mount_runner_routes(app, root, toolpacks, scheduler, model_proxy, tracer)
    return app


def mount_runner_routes(app, root, toolpacks, scheduler, model_proxy=None, tracer=None):
    """Adds the routes of docs/http-api.md to `app`; a completed activation asks `scheduler` for a tick.
    `model_proxy` (a suzumio_model_proxy.ModelProxy, by default one over the controller's environment)
    forwards `/runner/model`; `tracer` (suzumio_telemetry) gets a span for every model and tool call."""
    model_proxy = model_proxy or ModelProxy()
    # Calls to upstreams reached directly leave the worker threads for one loop (suzumio_model_loop);
    # the listener closes it with the app.
    model_loop = app.config["suzumio.model_loop"] = suzumio_model_loop.ModelLoop()
    replays = suzumio_replay.Replays(root)
    long_polls = threading.BoundedSemaphore(suzumio_approvals.MAX_LONG_POLLS)

    @app.post("/runner/model")
    def runner_model():
        call = authorize(root, read_fields(), ("providerId", "presetId"), body_checks=check_model_request,
                         running=MODEL_CALLS_CLOSED)
        provider_id, preset_id = call.body["providerId"], call.body["presetId"]
        config = toolpacks.configs.get(call.store)
        started = utc_now()
        # Each retry is an event; streamed deltas go live on the project's SSE stream.
        live_base = {"type": DELTA_EVENT, "activationId": call.activation_id, "agentId": call.agent_id,
                     "presetId": preset_id, "callId": f"live_{os.urandom(6).hex()}"}

        def publish(delta):
            root.live.publish(call.store.project_id, dict(live_base, **delta), after=call.store.event_watermark)

        retries, deferred = [], []  # deferred: the pool's events, when the model loop has the call

        def event(kind, info):
            def write():
                call.store.append_event(kind, dict(info, activationId=call.activation_id, agentId=call.agent_id))
            if handed:
                deferred.append(model_loop.submit(write, lambda _result: None))
            else:
                write()

        def on_retry(info):
            retries.append(info)
            event(KIND_MODEL_RETRY, info)

        clock = time.monotonic()

        def record(answer, error=None, packed=None):
            if config.recording.enabled:
                call.store.record_exchange(
                    call.activation_id, call.agent_id, provider_id, preset_id, call.body["body"],
                    status=answer.status if answer else None, headers=answer.headers if answer else {},
                    answer=answer.body if answer else "", overflow=answer.overflow is not None if answer else False,
                    usage=answer.usage if answer else {}, retries=len(retries), error=error,
                    started_at=format_ts(started), duration_ms=(time.monotonic() - clock) * 1000,
                    packed=packed)

        def conclude(outcome):
            """The runner's answer to a forwarded call: `outcome` is its ModelAnswer or the SuzumioError it
            ended with (raised again once recorded)."""
            concurrent.futures.wait(deferred)  # its retry events come before its exchange
            if isinstance(outcome, SuzumioError):
                if isinstance(outcome, BadGateway):  # forwarded, and no answer came; a refused request is no exchange
                    record(None, outcome.message)
                trace_model_call(tracer, call, config, provider_id, preset_id, started, None, outcome.message)
                raise outcome
            answer = outcome
            packed = call.store.pack_request(call.body["body"]) if config.recording.enabled else None

            def answered(_tx):
                record(answer, packed=packed)
                # Recorded whatever the activation's status by now: the provider counted these tokens.
                call.store.record_model_call(call.activation_id, call.agent_id, provider_id, preset_id,
                                             answer.status, answer.usage,
                                             cost_usd=call_cost(config.runner.presets.get(preset_id), answer.usage))

            # One COMMIT for the exchange and its usage, shared with the other calls ending at the same time:
            # concurrent streams otherwise queue behind two synced COMMITs each at their end.
            call.store.write_grouped(answered)
            trace_model_call(tracer, call, config, provider_id, preset_id, started, answer,
                             None if 200 <= answer.status < 300 else f"HTTP {answer.status}")
            return {"status": answer.status, "headers": answer.headers, "body": answer.body,
                    "overflow": answer.overflow is not None}

        scripted = scripted_answer(config, provider_id, call.body.get("scripted"))
        replayed = replays.sources(call.store, call.activation_id).answer(call.agent_id, provider_id, preset_id,
                                                                          call.body["body"])
        if isinstance(replayed, suzumio_replay.Recorded):
            return answer_from_recording(call, config, provider_id, preset_id, replayed, started)
        if replayed is not None and replayed["onDiverge"] == "stop":
            suzumio_scheduler.stop_project(call.store, scheduler.backends)
            raise Conflict(f"Replay {call.store.project_id} diverged at request {replayed['requestIndex']} of "
                           f"activation {call.activation_id}; the replay is stopped")
        if scripted is not None:  # the script's turn is this provider's answer: recorded like any other
            return json_response(conclude(scripted))
        handed = False
        try:
            # Urgent calls go first at the provider's gate: those of an activation a P0 or P1 signal reached.
            forwarding = Forwarding(model_proxy, config, call.agent_id, provider_id, preset_id, call.body["body"],
                                    on_retry=on_retry, activation_id=call.activation_id,
                                    priority=call.store.activation_priority(call.activation_id),
                                    on_wait=lambda info: event(KIND_MODEL_WAITING, info),
                                    on_pause=lambda info: event(KIND_PROVIDER_PAUSED, info))
        except SuzumioError as error:
            return json_response(conclude(error))
        hand_off = bottle.request.environ.get(suzumio_sse.HAND_OFF)
        if hand_off is None or forwarding.upstream.proxy is not None:  # through an HTTP proxy: this thread
            try:
                outcome = model_proxy.drive(forwarding, publish)
            except SuzumioError as error:
                outcome = error
            return json_response(conclude(outcome))
        sock = hand_off()
        if sock is not None:  # None: the runner left before its call began
            handed = True
            try:
                model_loop.start(forwarding, publish, conclude, reply_sock=sock)
            except SuzumioError:  # shut down: no answer can follow on the taken connection
                sock.close()
                raise
        return bottle.HTTPResponse(b"", 200)

    @app.post("/runner/tool-calls/start")
    def tool_call_start():
        call = authorize(root, read_fields(), ("tool",), body_checks=check_call_key, running=TOOL_CALLS_CLOSED)
        tool = call.body["tool"]
        toolpacks.check_tool_call(call.store, call.agent, tool)
        config = toolpacks.configs.get(call.store)
        tripped = suzumio_guards.tripped_guard(call.store, config, call.agent_id, tool, call.body.get("input"))
        if tripped is not None:
            answer = suzumio_guards.trip(call.store, call.agent_id, call.activation_id, tool,
                                         call.body.get("input"), tripped, call_key=call.body.get("callKey"))
            stop_runner(scheduler, call.store, call.activation_id)
            return json_response(answer)
        # A call that an approval rule matches is recorded with a pending approval request; a
        # start asked again with its callKey answers what was recorded.
        started = suzumio_approvals.start_tool_call(
            call.store, config, call.agent_id, call.activation_id, tool,
            call.body.get("input"), call_key=call.body.get("callKey"), model_call_id=call.body.get("modelCallId"))
        # A replay with recorded tools hands the runner the source's result instead of running the tool.
        model_call_id = call.body.get("modelCallId")
        if not started.get("replayed") and not started.get("approval") and isinstance(model_call_id, str):
            recorded = replays.sources(call.store, call.activation_id).recorded_tool(tool, model_call_id)
            if recorded is not None:
                started = dict(started, recorded=recorded)
        return json_response(started)

    @app.post("/runner/tool-calls/refused")
    def tool_call_refused():
        """A call the runner answered without running it (an unknown tool, arguments that are not JSON or
        fail the schema): recorded as a failed call, so a person sees what the model tried."""
        call = authorize(root, read_fields(), ("tool", "error"), body_checks=check_call_key, running=TOOL_CALLS_CLOSED)
        return json_response(coordination.refuse_tool_call(
            call.store, call.agent_id, call.activation_id, call.body["tool"], call.body.get("input"),
            optional_text(call.body, "error"), call_key=call.body.get("callKey")))

    @app.post("/runner/approvals/wait")
    def approval_wait():
        """The runner waits for the decision on its request (long-poll, asked again)."""
        call = authorize(root, read_fields(), ("approvalId",))
        wait_ms = call.body.get("waitMs", suzumio_approvals.MAX_WAIT_S * 1000)
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or not math.isfinite(wait_ms) \
                or wait_ms < 0:
            raise BadRequest("waitMs must be a non-negative number")
        # A long-poll holds a worker thread: past MAX_LONG_POLLS at once, answer now and let it ask later.
        held = long_polls.acquire(blocking=False)
        try:
            answer = suzumio_approvals.wait_for_decision(
                call.store, root.changes, call.agent_id, call.activation_id, call.body["approvalId"],
                wait_ms / 1000 if held else 0, config=toolpacks.configs.get(call.store))
        finally:
            if held:
                long_polls.release()
        if not held and answer["status"] == suzumio_approvals.PENDING:
            answer["retryAfterMs"] = suzumio_approvals.RETRY_AFTER_MS
        return json_response(answer)

    @app.post("/runner/tool-calls/finish")
    def tool_call_finish():
        call = authorize(root, read_fields(), ("toolCallId", "status"))
        status = call.body["status"]
        if status not in TOOL_CALL_END_STATUSES:
            raise BadRequest(f"Invalid tool call status: {status}")
        result = coordination.finish_tool_call(
            call.store, call.agent_id, call.activation_id, call.body["toolCallId"], status,
            output=optional_text(call.body, "output"), error=optional_text(call.body, "error"))
        if tracer is not None and tracer.enabled:
            tracer.tool_call(call.store.tool_call(call.body["toolCallId"]), call.store.project_id)
        return json_response(result)

    @app.post("/runner/signals")
    def runner_signal():
        call = authorize(root, read_fields(), ("kind",), running=TOOL_CALLS_CLOSED)
        body = call.body  # every field is checked once, by the rule (suzumio_coordination.record_signal)
        coordination.record_signal(
            call.store, toolpacks.configs.get(call.store), body["kind"], source_agent=call.agent_id,
            source_activation=call.activation_id, target_agent=body.get("targetAgent"),
            target_channel=body.get("targetChannel"), priority=body.get("priority"), payload=body.get("payload"),
            status=body.get("status"), useful_effect=body.get("usefulEffect"))
        return json_response({"status": "recorded"})

    @app.post("/toolpacks/<toolpack_id>/support")
    def toolpack_support(toolpack_id):
        call = authorize(root, read_fields(), ("tool",), running=TOOL_CALLS_CLOSED)
        # A gated tool runs on the controller only after its approval (never by calling here).
        suzumio_approvals.claim_controller_call(call.store, toolpacks.configs.get(call.store), call.agent_id,
                                                call.activation_id, call.body["tool"], call.body.get("input", {}))
        result = toolpacks.support(call.store, call.agent, call.activation_id, toolpack_id,
                                   call.body["tool"], call.body.get("input", {}))
        return json_response(result)

    @app.post("/runner/history/messages")
    def history_message():
        call = authorize(root, read_fields(), ("role", "kind", "content"), running=HISTORY_CLOSED)
        body = call.body
        if body["role"] not in HISTORY_ROLES:
            raise BadRequest(f"Invalid history role: {body['role']}")
        metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
        message = call.store.append_history(call.agent_id, call.activation_id, body["role"], body["kind"],
                                            body["content"], metadata=metadata)
        return json_response({"status": "recorded", "message": message})

    @app.post("/runner/history/compact")
    def history_compact():
        call = authorize(root, read_fields(), ("summary",), running=HISTORY_CLOSED)
        body = call.body
        result = coordination.compact_history(
            call.store, call.agent_id, call.activation_id, body["summary"],
            keep_tail=floored(body.get("keepTail")),
            reason=optional_text(body, "reason"), selected_model=optional_text(body, "selectedModel"))
        return json_response(result)

    changesets = suzumio_files.Changesets()

    @app.post("/runner/files/list")
    def files_list():
        """What the activation may read, for a runner without bind mounts (backend.kind swarm)."""
        call = authorize(root, read_fields(), running=FILES_CLOSED)
        config = toolpacks.configs.get(call.store)
        answer = {"files": suzumio_files.listing(call.store, config, call.agent_id),
                  "own": f"{suzumio_files.ARTIFACTS}/{call.agent_id}"}
        if suzumio_files.work_tree(call.store, config, call.agent_id) is not None:
            answer["workspace"] = suzumio_files.WORKSPACE  # its changes go back as workspace changesets
        return json_response(answer)

    @app.post("/runner/files/read")
    def files_read():
        call = authorize(root, read_fields(), ("path",), running=FILES_CLOSED)
        return json_response(suzumio_files.read_file(call.store, toolpacks.configs.get(call.store), call.agent_id,
                                                     call.body["path"]))

    @app.post("/runner/files/changeset")
    def files_changeset():
        """The activation's own artifacts changed: applied inside its agent's folder only, all or nothing."""
        call = authorize(root, read_fields(), running=FILES_CLOSED)
        quota = toolpacks.configs.get(call.store).artifact_quota(call.agent_id)
        result = changesets.apply(call.store, call.agent_id, call.body.get("changes"), quota)
        return json_response(dict(result, status="applied"))

    @app.post("/runner/files/workspace-changeset")
    def files_workspace_changeset():
        """The activation's /workspace changed: applied to its agent's own work tree only, all or nothing;
        the controller commits it (repo.* tools, the activation's end) to that agent's branch alone."""
        call = authorize(root, read_fields(), running=FILES_CLOSED)
        result = changesets.apply_workspace(call.store, toolpacks.configs.get(call.store), call.agent_id,
                                            call.body.get("changes"))
        return json_response(dict(result, status="applied"))

    @app.post("/activation-context")
    def activation_context():
        call = authorize(root, read_fields(), body_checks=check_context)
        return json_response(call.store.record_activation_context(call.activation_id, call.agent_id,
                                                                  call.body["context"]))

    @app.post("/activation-output")
    def activation_output():
        call = authorize(root, read_fields(), body_checks=check_output)
        if call.activation["status"] != ACT_RUNNING:
            return json_response({"status": call.activation["status"], "activationId": call.activation_id})
        output = call.body["output"]
        usage = output.get("usage") if isinstance(output.get("usage"), dict) else None
        config = toolpacks.configs.get(call.store)
        replays.ended(call.store, call.activation_id, call.agent_id)
        # Recorded before the activation completes: the agent's next activation cannot start meanwhile.
        suzumio_recorder.record_ended(call.store, config, call.activation_id)
        suzumio_repository.activation_ended(call.store, config, call.activation_id)
        result = coordination.complete_activation(call.store, config, call.activation_id,
                                                  call.agent_id, output["text"], usage=usage)
        if result["status"] == "completed":
            run_tick(scheduler.tick, call.store.project_id)
        return json_response(result)


def stop_runner(scheduler, store, activation_id):
    """Stop the runner of an activation a rule just ended (its container or process), so a runner that
    ignores the answer cannot go on; a scheduler without backends (the runner contract tests) has none."""
    backends = getattr(scheduler, "backends", None)
    if backends is not None:
        backends.stop_runner(store, store.activation(activation_id))


def answer_from_recording(call, config, provider_id, preset_id, replayed, started):
    """Answer a replay's model request with its source's recorded answer: recorded as replayed (its
    usage kept, counting for no budget and costing nothing), no provider asked."""
    exchange = replayed.exchange

    def record(_tx):
        # One COMMIT for the exchange and its usage, as on the live path.
        call.store.record_exchange(
            call.activation_id, call.agent_id, provider_id, preset_id, call.body["body"], status=exchange["status"],
            headers=exchange["headers"], answer=replayed.answer, overflow=exchange["overflow"],
            usage=exchange["usage"], retries=0, error=exchange["error"], started_at=format_ts(started),
            duration_ms=0, replayed=True)
        if exchange["status"] is not None:
            call.store.record_replayed_model_call(
                call.activation_id, call.agent_id, provider_id, preset_id, exchange["status"], exchange["usage"],
                recorded_cost=call_cost(config.runner.presets.get(preset_id), exchange["usage"]))

    call.store.write_grouped(record)
    if exchange["status"] is None:
        raise BadGateway(exchange["error"] or "Request to the provider failed")
    return json_response({"status": exchange["status"], "headers": exchange["headers"], "body": replayed.answer,
                          "overflow": exchange["overflow"]})


def scripted_answer(config, provider_id, scripted):
    """The answer a runner sends with a scripted provider's request (the script's turn, played in the
    runner, as a Chat Completions answer), as the provider's ModelAnswer; None for other providers,
    which must send none (docs/configuration.md#the-scripted-provider)."""
    provider = config.runner.providers.get(provider_id)
    if provider is None or provider.type != "scripted":
        if scripted is not None:
            raise BadRequest("scripted is only sent for a scripted provider")
        return None
    if not isinstance(scripted, dict) or not isinstance(scripted.get("choices"), list):
        raise BadRequest(f"Provider {provider_id} is scripted: scripted (the script's turn) is required")
    return ModelAnswer(200, {"content-type": "application/json"}, json.dumps(scripted, ensure_ascii=False),
                       chat_completions_usage(scripted.get("usage")))

