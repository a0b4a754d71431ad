"""The controller's model proxy: a runner sends the Chat Completions body it built to `POST /runner/model`;
this module resolves the provider and preset from the project's ProjectConfig, adds the key and the
secret headers from the controller's own environment, and forwards through the controller's proxies with
the provider's timeouts, retrying and streaming as suzumio_providers describes (also the Anthropic
Messages dialect); it answers the final status, a Chat Completions body, the usage and its overflow
verdict. Each exchange first passes its provider's gate (suzumio_model_gate): the limits, the pause after
a 429 or 503 with Retry-After, the queue in priority order."""
import json
import logging
import math
import os
import re
import socket
import threading
import time
from collections import namedtuple
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit, urlunsplit

import suzumio_providers as providers
from suzumio_errors import BadGateway, BadRequest, Forbidden, NotFound
from suzumio_model_gate import NO_LIMITS, Governor, estimate_tokens
from suzumio_runner_models import TransportError, chat_completions_usage, model_timeouts, proxy_for

log = logging.getLogger(__name__)

REDACTED = "<redacted>"
HOST_GATEWAY = "host.docker.internal"
# Placeholder keys of local servers ("EMPTY", "none") are no secret, and replacing them would rewrite
# the model's text; real keys are far longer.
MIN_REDACTED_LENGTH = 8
# Provider options the proxy applies (retries, streaming and its usage chunk are the proxy's).
FORWARD_OPTIONS = ("apiKey", "baseURL", "headers", "queryParams", "maxRetries", "retryWindowMs", "stream",
                   "streamOptions")
RUNNER_OPTIONS = ()
SUPPORTED_TYPES = ("openai-compatible", "anthropic")
# Answer headers the runner's retry logic reads; nothing else of the upstream headers reaches it.
RETRY_HEADERS = ("retry-after", "retry-after-ms")
SECRET_HEADER = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|password")

ModelAnswer = namedtuple("ModelAnswer", "status headers body usage overflow", defaults=(None,))
Upstream = namedtuple("Upstream", "url headers proxy timeouts api_model secrets kind retry stream include_usage "
                      "first_byte limits",
                      defaults=("openai-compatible", providers.RetryPolicy(0, 0.0), False, False, None, None))
# Statuses whose Retry-After pauses the provider for every agent, instead of each call retrying on its own.
PAUSE_STATUSES = (429, 503)


def is_secret_header(name):
    """Header names whose values are credentials (kept out of runners, redacted from answers)."""
    return SECRET_HEADER.search(name) is not None


class ModelProxy:
    """Forwards runner model requests to their provider; `environ` is the controller's environment
    (read at each call, as the backends read it at each activation start)."""

    def __init__(self, environ=None, clock=time.monotonic, resolve=socket.getaddrinfo, sleep=time.sleep):
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._sleep = sleep
        # (provider, model, feature) a server refused with a 400 (max_tokens, stream_options, stream):
        # later requests go without it at once.
        self._refused = set()
        self._resolve = resolve
        self._lock = threading.Lock()
        self._gateway_resolves = None
        self._warned = set()
        self.governor = Governor(clock)

    def controller_base_url(self, base_url):
        """Base URLs written for runners in containers name `host.docker.internal`; the controller on the
        Docker host reaches that host at 127.0.0.1 unless the name resolves where it runs."""
        parts = urlsplit(base_url)
        if parts.hostname != HOST_GATEWAY:
            return base_url
        with self._lock:
            if self._gateway_resolves is None:
                try:
                    self._resolve(HOST_GATEWAY, None)
                    self._gateway_resolves = True
                except OSError:
                    self._gateway_resolves = False
            if self._gateway_resolves:
                return base_url
        return urlunsplit(parts._replace(netloc=parts.netloc.replace(HOST_GATEWAY, "127.0.0.1")))

    def upstream(self, config, agent_id, provider_id, preset_id):
        """Where and how to send a request of `agent_id` for one concrete preset; raises SuzumioError."""
        preset = config.runner.presets.get(preset_id)
        if preset is None:
            raise NotFound(f"Model preset not found: {preset_id}")
        if preset.is_list:
            raise BadRequest(f"Model preset {preset_id} is a model list; name one of its concrete presets")
        if preset_id not in [p.id for p in config.model_attempts(agent_id)]:
            raise Forbidden(f"Model preset {preset_id} is not selected for {agent_id}")
        if provider_id != preset.provider:
            raise BadRequest(f"Model preset {preset_id} uses provider {preset.provider}, not {provider_id}")
        provider = config.runner.providers[provider_id]
        if provider.type == "scripted":
            raise BadRequest(f"Provider {provider_id} is scripted: the runner replays it without a model call")
        if provider.type not in SUPPORTED_TYPES:
            raise BadRequest(f"Provider type {provider.type} is not supported by this version "
                             "(use openai-compatible, anthropic or scripted)")
        options = dict(provider.options or {})
        self._warn_ignored(config.name, provider_id, options)
        environ = self._environ
        key = (options.get("apiKey") or provider.api_key
               or (environ.get(provider.api_key_env) if provider.api_key_env else None) or None)
        base_url = (options.get("baseURL") or provider.base_url
                    or (environ.get(provider.base_url_env) if provider.base_url_env else None) or None)
        if not base_url and provider.type == "anthropic":
            base_url = providers.ANTHROPIC_BASE_URL
        if not base_url:
            raise BadGateway(f"Provider {provider_id} has no baseURL")
        path = "/messages" if provider.type == "anthropic" else "/chat/completions"
        url = self.controller_base_url(base_url).rstrip("/") + path
        query = options.get("queryParams")
        if isinstance(query, dict) and query:
            url += "?" + urlencode({str(k): str(v) for k, v in query.items()})
        # Later wins: the type's auth header, provider headers, option headers, preset headers.
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        for extra in (provider.headers, options.get("headers"), preset.headers):
            if isinstance(extra, Mapping):
                headers.update((str(k), str(v)) for k, v in extra.items())
        if provider.type == "anthropic":
            headers = providers.anthropic_headers(headers, key)
        secrets = [key] + [v for k, v in headers.items() if is_secret_header(k)]
        proxy_env = dict(config.proxy_environment(environ, rewrite_hosts=False))
        try:
            proxy = proxy_for(url, proxy_env)
        except TransportError as error:
            raise BadGateway(f"Request to provider {provider_id} failed: {error}") from None
        timeouts = model_timeouts({"timeoutMs": provider.timeout_ms, "chunkTimeoutMs": provider.chunk_timeout_ms})
        first_byte = providers.first_byte_timeout(provider.timeout_ms, provider.first_byte_timeout_ms)
        secrets = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_REDACTED_LENGTH},
                         key=len, reverse=True)
        retry = providers.retry_policy(options, getattr(preset, "max_retries", None))
        return Upstream(url, headers, proxy, timeouts, preset.api_model or preset.model, secrets, provider.type,
                        retry, options.get("stream") is not False, options.get("streamOptions") is not False,
                        first_byte, provider.limits)

    def _warn_ignored(self, project, provider_id, options):
        """Once per project, provider and option: an option the proxy does not apply."""
        for name in options:
            if name in FORWARD_OPTIONS + RUNNER_OPTIONS:
                continue
            with self._lock:
                if (project, provider_id, name) in self._warned:
                    continue
                self._warned.add((project, provider_id, name))
            log.warning("project %s provider %s: option %s is ignored", project, provider_id, name)

    def forward(self, config, agent_id, provider_id, preset_id, body, publish=None, on_retry=None, **gate):
        """Send one model request, retrying 429, 5xx, connections that failed before any byte and streams
        cut after some within the preset's retry policy (each retry told to `on_retry(info)`); streamed
        where the server accepts it, the deltas handed to `publish(delta)`. Answers the final status and a
        Chat Completions body whatever the provider's dialect; a transport failure left after the retries
        is a 502. The exchanges block this thread (suzumio_model_loop drives the same Forwarding without);
        `gate` are Forwarding's arguments for the provider's gate."""
        return self.drive(Forwarding(self, config, agent_id, provider_id, preset_id, body, on_retry, **gate), publish)

    def drive(self, forwarding, publish=None):
        """forward() of a Forwarding made already: its exchanges on this thread, one after another, each
        after its turn at the provider's gate."""
        while True:
            self._wait_turn(forwarding)
            try:
                request = forwarding.request()
                result = self._exchange(forwarding.upstream, request, publish)
            except TransportError as error:
                result = error
            except BaseException:
                forwarding.leave(None)
                raise
            forwarding.leave(result)
            step = forwarding.outcome(request, result)
            if isinstance(step, ModelAnswer):
                return step
            if step:
                self._sleep(step)

    def _wait_turn(self, forwarding):
        """Block this thread until the gate lets the forwarding's next exchange start."""
        changed = threading.Event()
        turn = {"admitted": False, "due": math.inf}

        def admit():
            turn["admitted"] = True
            changed.set()

        def wake(when):
            turn["due"] = when
            changed.set()

        if forwarding.enter(admit, wake):
            return
        try:
            while True:
                timeout = None if turn["due"] == math.inf else max(0.0, turn["due"] - self._clock())
                changed.wait(timeout)
                changed.clear()
                if turn["admitted"]:
                    break
                if self._clock() >= turn["due"]:
                    turn["due"] = math.inf
                    forwarding.pump()
        except BaseException:
            forwarding.leave(None)
            raise
        forwarding.admitted()

    def _exchange(self, upstream, request, publish):
        """One blocking upstream exchange: (status, headers, Chat Completions text, usage)."""
        connect, idle, _overall = upstream.timeouts
        status, headers, chunks = providers.open_exchange(upstream.url, upstream.headers, request.payload,
                                                          upstream.proxy, connect, idle, request.deadline,
                                                          self._clock, upstream.first_byte)
        deltas = providers.Deltas(publish if request.stream else None, self._clock)
        status, text, usage = providers.answer_of(upstream.kind, status, headers, chunks, deltas)
        return status, headers, text, usage

    def refused(self, provider_id, model):
        with self._lock:
            return {f for p, m, f in self._refused if (p, m) == (provider_id, model)}

    def refuse(self, provider_id, model, feature):
        with self._lock:
            self._refused.add((provider_id, model, feature))


Request = namedtuple("Request", "payload stream sent deadline")


class Forwarding:
    """One runner request on its way to its provider: its turn at the provider's gate before each
    exchange, what the exchange sends, and after each one whether to answer, resend at once, retry after
    a delay or give up. Both the threaded path (ModelProxy.forward) and the model loop drive it, so both
    decide alike. A 400 refusing `max_tokens`, `stream_options` or `stream` is resent at once without it.
    `priority` is the highest of the signals the calling activation got (urgent ones go first at the
    gate); `on_wait(info)` hears each wait at the gate, `on_pause(info)` each pause this call announces."""

    def __init__(self, proxy, config, agent_id, provider_id, preset_id, body, on_retry=None, *,
                 activation_id=None, priority=None, on_wait=None, on_pause=None):
        if not isinstance(body, dict):
            raise BadRequest("body must be an object")
        self.proxy = proxy
        self.project, self.agent_id, self.provider_id, self.preset_id = config.name, agent_id, provider_id, preset_id
        self.activation_id, self.priority = activation_id, priority
        self.body = body
        self.on_retry, self.on_wait, self.on_pause = on_retry, on_wait, on_pause
        self.upstream = proxy.upstream(config, agent_id, provider_id, preset_id)
        self.started = proxy._clock()
        self.retry = 0
        self.ticket = None
        self.waited = 0.0  # seconds at the gate: not counted against the retry window
        self._wait_began = None
        self._estimate = None

    # -- the gate

    @property
    def gate_key(self):
        return (self.project, self.provider_id)

    def enter(self, admit, wake):
        """Ask the provider's gate for the next exchange: True when it may start now; else the call waits
        (on_wait is told) and `admit()` comes when it may, from any thread; `wake(when)` asks for pump()
        at monotonic `when`."""
        governor = self.proxy.governor
        if self.ticket is None:
            self.ticket = governor.ticket(self.gate_key, self.priority, admit, wake)
        else:
            self.ticket.admit, self.ticket.wake = admit, wake
        limits = self.upstream.limits or NO_LIMITS
        if self._estimate is None:
            # Only tokensPerMinute needs it, and a long context takes a while to serialise.
            self._estimate = 0 if limits.tokens_per_minute is None else \
                estimate_tokens(json.dumps(self.body.get("messages"), ensure_ascii=False))
        waiting = governor.enter(self.ticket, limits, self._estimate)
        if waiting is None:
            return True
        self._wait_began = self.proxy._clock()
        reason, position = waiting
        log.info("project %s agent %s activation %s provider %s: the call waits (%s, position %d)",
                 self.project, self.agent_id, self.activation_id, self.provider_id, reason, position)
        if self.on_wait is not None:
            self.on_wait({"providerId": self.provider_id, "presetId": self.preset_id, "reason": reason,
                          "position": position})
        return False

    def admitted(self):
        """The waiter's admit() came: the wait ends."""
        if self._wait_began is not None:
            self.waited += self.proxy._clock() - self._wait_began
            self._wait_began = None

    def pump(self):
        self.proxy.governor.pump(self.gate_key)

    def leave(self, result):
        """The exchange ended with `result` (None: abandoned, or the call gave up while waiting)."""
        if self.ticket is None:
            return
        tokens = 0
        if isinstance(result, tuple):
            status, _headers, _text, usage = result
            tokens = usage.get("total") or (usage.get("input", 0) + usage.get("output", 0))
            if not tokens and 200 <= status < 300:
                tokens = self._estimate  # an answer without usage still spent tokens
        self.proxy.governor.leave(self.ticket, tokens)

    def _pause(self, status, delay):
        """A 429 or 503 with Retry-After: the provider pauses for every agent; the retry waits at the gate."""
        if not self.proxy.governor.pause(self.gate_key, delay):
            return
        log.warning("project %s provider %s: HTTP %d with Retry-After; paused for %.1f s", self.project,
                    self.provider_id, status, delay)
        if self.on_pause is not None:
            self.on_pause({"providerId": self.provider_id, "status": status, "pauseMs": int(delay * 1000),
                           "untilMs": int((time.time() + delay) * 1000)})

    def request(self):
        """The next exchange's Request: its body, whether it streams, the features it sent, its deadline."""
        upstream = self.upstream
        refused = self.proxy.refused(self.provider_id, upstream.api_model)
        stream = upstream.stream and "stream" not in refused
        if upstream.kind == "anthropic":
            payload = providers.anthropic_payload(self.body, upstream.api_model, stream)
        else:
            payload = providers.openai_payload(self.body, upstream.api_model, stream,
                                               upstream.include_usage and "stream_options" not in refused,
                                               "max_tokens" in refused)
        overall = upstream.timeouts[2]
        deadline = self.proxy._clock() + overall if overall is not None else None
        sent = {"max_tokens": "max_tokens" in payload, "stream_options": "stream_options" in payload,
                "stream": stream}
        return Request(json.dumps(payload).encode("utf-8"), stream, sent, deadline)

    def outcome(self, request, result):
        """`result`: the exchange's (status, headers, text, usage), or the TransportError it raised.
        Answers the ModelAnswer, or the seconds to wait before the next request (0: at once); raises
        BadGateway when no answer came within the retry policy."""
        upstream, provider_id = self.upstream, self.provider_id
        if isinstance(result, providers.EarlyTransportError):
            status, headers, text, usage, reason = None, {}, str(result), {}, f"connection failed: {result}"
        elif isinstance(result, providers.StreamCut):
            # Cut after bytes arrived: the partial answer is dropped (never returned, its usage never
            # counted) and the whole request asked again within the same budget.
            status, headers, text, usage, reason = None, {}, str(result), {}, f"stream cut: {result}"
        elif isinstance(result, TransportError):
            raise BadGateway(f"Request to provider {provider_id} failed: {result}") from None
        else:
            status, headers, text, usage = result
            feature = providers.refused_feature(status, text) if upstream.kind != "anthropic" else None
            if feature is not None and request.sent.get(feature):
                log.warning("provider %s model %s refuses %s; resending without it", provider_id,
                            upstream.api_model, feature)
                self.proxy.refuse(provider_id, upstream.api_model, feature)
                return 0.0
            reason = f"HTTP {status}"
        overflow = providers.overflow_server(status, text) if status is not None else None
        done = status is not None and (200 <= status < 300 or overflow or not providers.retriable_status(status))
        if not done:
            delay = providers.retry_delay(headers, self.retry)
            # A Retry-After longer than the retry window is not waited for, by this call or the others.
            paused = (status in PAUSE_STATUSES and providers.retry_after_given(headers)
                      and delay <= upstream.retry.window_s)
            if paused:
                self._pause(status, delay)
            # Time spent waiting at the gate is not the call's own.
            spent = self.proxy._clock() - self.started - self.waited
            within = spent + delay <= upstream.retry.window_s
            if self.retry < upstream.retry.max_retries and within:
                return self._again(reason, status, delay, 0.0 if paused else delay)
            if status is None:
                raise BadGateway(f"Request to provider {provider_id} failed: {text}") from None
        headers = {name: headers[name] for name in RETRY_HEADERS if name in headers}
        return ModelAnswer(status, redact(headers, upstream.secrets), redact(text, upstream.secrets), usage,
                           overflow)

    def _again(self, reason, status, delay, wait):
        """Count a retry and answer the seconds to wait before it (`wait`; the gate holds a paused one)."""
        self.retry += 1
        upstream = self.upstream
        log.warning("project %s agent %s provider %s: %s; retry %d/%d in %.1f s", self.project, self.agent_id,
                    self.provider_id, reason, self.retry, upstream.retry.max_retries, delay)
        if self.on_retry is not None:
            self.on_retry({"providerId": self.provider_id, "presetId": self.preset_id, "retry": self.retry,
                           "maxRetries": upstream.retry.max_retries, "reason": redact(reason, upstream.secrets),
                           "status": status, "delayMs": int(delay * 1000)})
        return wait


def answer_usage(text):
    """The usage of a successful Chat Completions answer; {} when it reports none or is not JSON."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return chat_completions_usage(data.get("usage")) if isinstance(data, dict) else {}


def redact(value, secrets):
    """A provider that echoes a credential must not hand it to the runner."""
    if isinstance(value, dict):
        return {key: redact(item, secrets) for key, item in value.items()}
    for secret in secrets:
        value = value.replace(secret, REDACTED)
    return value
