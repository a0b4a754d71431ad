"""Model side of the runner: proxy-aware HTTP with connect/idle/deadline timeouts (also used by web.fetch,
the controller client and the controller's model proxy), model-list expansion, the `openai-compatible`
Chat Completions provider (its requests go through the controller, which holds the keys) and the offline
`scripted` provider. Standard library only, CPython >= 3.9, importing nothing of the controller."""

import base64
import http.client
import json
import os
import re
import socket
import ssl
import sys
import time
from collections import namedtuple
from urllib.parse import unquote, urlsplit

from suzumio_runner_egress import connect_via

DEFAULT_MODEL_TIMEOUT_S = 300.0
READ_CHUNK = 65536
MAX_ERROR_BODY = 4000
PROXY_NAMES = {
    "https": ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"),
    "http": ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"),
}
OVERFLOW_NEEDLES = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "max context",
    "too many tokens",
    "input exceeds",
    "exceeds the context",
    "exceeded the context",
    "prompt is too long",
    "request too large",
)
LATER_PROVIDER_TYPES = ("openai", "google")
# Provider types whose requests the runner writes as Chat Completions bodies: the controller's model proxy
# translates them for the server's dialect (anthropic Messages) and answers Chat Completions.
PROXIED_PROVIDER_TYPES = ("openai-compatible", "anthropic")
SKIPPED_PROVIDER_OPTIONS = ("reasoningEffort", "user", "textVerbosity")

HttpResponse = namedtuple("HttpResponse", "status reason headers body")
# The controller's answer to one model request (`overflow` is its verdict on an error).
ProxyAnswer = namedtuple("ProxyAnswer", "status reason headers body overflow")
ToolCall = namedtuple("ToolCall", "id name arguments")
Attempt = namedtuple("Attempt", "preset_id preset provider_id provider")


def stderr_warning(message, *args):
    """Write one %-style warning line to stderr (runner.log, or the container's log). The runner's
    parts take such a `warn` callable instead of using `logging`: importing `logging` costs about 6 ms
    of every activation start (BENCHMARKS.md); suzumio_runner.main passes one that redacts secrets."""
    try:
        sys.stderr.write((message % args if args else message) + "\n")
    except OSError:
        pass  # a log line lost to a full disk must not end the activation


class TransportError(Exception):
    """The HTTP exchange itself failed (connect, TLS, timeout, proxy); the message is the reason."""


class ModelError(Exception):
    """A model attempt failed; `status` is the provider's HTTP status when there was one; `overflow` is
    the controller's verdict (its table of context-overflow errors), None when it gave none."""

    def __init__(self, message, status=None, overflow=None):
        super().__init__(message)
        self.status = status
        self.overflow = overflow


class ModelTurn:
    """One provider response: the step text, its tool calls and its token usage."""

    __slots__ = ("text", "tool_calls", "usage")

    def __init__(self, text="", tool_calls=None, usage=None):
        self.text = text or ""
        self.tool_calls = list(tool_calls or [])
        self.usage = dict(usage or {})


def safe_tool_name(name):
    """The provider-facing name of a dotted tool name (`file.read` -> `file_read`)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


def is_context_overflow(error):
    """True when the error text (with any wrapped cause) says the request exceeded the context."""
    texts = []
    while error is not None and len(texts) < 5:
        if getattr(error, "overflow", None) is not None:
            return bool(error.overflow)  # the controller recognised the server's overflow error, or not
        texts.append(str(error))
        error = error.__cause__ or error.__context__
    lowered = "\n".join(texts).lower()
    return any(needle in lowered for needle in OVERFLOW_NEEDLES)


# ---------------------------------------------------------------------------------------------
# HTTP


def _no_proxy_matches(host, no_proxy):
    host = (host or "").lower().strip("[]")
    for entry in no_proxy.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry = entry.lstrip(".")
        if entry.startswith("[") and "]" in entry:
            entry = entry[1 : entry.index("]")]
        elif entry.count(":") == 1:
            entry = entry.split(":", 1)[0]
        if host == entry or host.endswith("." + entry):
            return True
    return False


def proxy_for(url, env):
    """The proxy URL for `url` under the environment `env`, or None for a direct connection."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    if no_proxy and _no_proxy_matches(parts.hostname, no_proxy):
        return None
    for name in PROXY_NAMES.get(scheme, ()):
        value = env.get(name)
        if value:
            proxy_scheme = urlsplit(value).scheme.lower()
            if proxy_scheme not in ("http", "https"):
                raise TransportError(
                    "Proxy protocol {}: (from {}) is not supported by the built-in model/web fetch; use an "
                    "HTTP proxy in HTTP_PROXY/HTTPS_PROXY, or shell.exec with curl for SOCKS proxies".format(
                        proxy_scheme or "(none)", name
                    )
                )
            return value
    return None


def _tls_context():
    return ssl.create_default_context()


class TlsSessions:
    """The newest TLS session with one server, so that the next connection resumes it instead of a
    full handshake (a runner opens one connection per controller request)."""

    def __init__(self):
        self.session = None
        self.resumed = False  # whether the last connection resumed the session before it


class _ResumingHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPSConnection (never through a proxy) that offers the session kept in `sessions`; with
    `via`, its TCP connection is a Unix socket that carries the bytes to host:port (a Swarm node's
    gateway), TLS on top as ever."""

    def __init__(self, host, port, timeout, context, sessions, via=None):
        super().__init__(host, port, timeout=timeout, context=context)
        self._sessions = sessions
        self._via = via

    def connect(self):
        if self._via is None:
            http.client.HTTPConnection.connect(self)
        else:
            self.sock = connect_via(self._via, self.timeout)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.host, session=self._sessions.session)


def _connection(url, proxy, timeout, tls_context=None, tls_sessions=None, via=None):
    """An unconnected HTTP(S)Connection for url (through proxy when given) and the request target;
    `tls_context` verifies an https URL's server (default: the system's CAs); `tls_sessions`, a
    TlsSessions, resumes the session of the previous connection to the same server, reached through
    the Unix socket `via` when given."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"Unsupported URL: {url}")
    port = parts.port or (443 if scheme == "https" else 80)
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    extra = {}
    if proxy is None:
        if scheme == "https" and tls_sessions is not None:
            conn = _ResumingHTTPSConnection(parts.hostname, port, timeout, tls_context or _tls_context(),
                                            tls_sessions, via)
        elif scheme == "https":
            conn = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout,
                                               context=tls_context or _tls_context())
        else:
            conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
        return conn, target, extra
    proxy_parts = urlsplit(proxy)
    proxy_port = proxy_parts.port or (443 if proxy_parts.scheme.lower() == "https" else 80)
    if proxy_parts.username is not None:
        pair = "{}:{}".format(unquote(proxy_parts.username), unquote(proxy_parts.password or ""))
        extra["Proxy-Authorization"] = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
    if scheme == "https":
        # Like urllib, an https:// proxy URL is reached with a plain CONNECT tunnel.
        conn = http.client.HTTPSConnection(
            proxy_parts.hostname, proxy_port, timeout=timeout, context=tls_context or _tls_context()
        )
        conn.set_tunnel(parts.hostname, port, headers=extra)
        return conn, target, {}
    conn = http.client.HTTPConnection(proxy_parts.hostname, proxy_port, timeout=timeout)
    absolute = "http://{}{}".format(parts.netloc.rsplit("@", 1)[-1], target)
    return conn, absolute, extra


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 to a server listening on a Unix socket (the controller's runner socket)."""

    def __init__(self, socket_path, timeout=None):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def unix_request(socket_path, method, path, headers, body, connect_timeout, idle_timeout):
    """One HTTP exchange over a Unix socket: (status, body bytes). Raises TransportError."""
    conn = UnixHTTPConnection(socket_path, timeout=connect_timeout)
    try:
        conn.connect()
        conn.sock.settimeout(idle_timeout)
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    except socket.timeout:  # noqa: UP041 (on 3.9 socket.timeout is not TimeoutError)
        raise TransportError("timed out") from None
    except (OSError, http.client.HTTPException) as error:
        raise TransportError(str(error) or error.__class__.__name__) from None
    finally:
        conn.close()


def http_request(
    method, url, headers=None, body=None, proxy=None, connect_timeout=None, idle_timeout=None, deadline=None,
    tls_context=None, tls_sessions=None, via=None,
):
    """One HTTP exchange without redirects. Timeouts are seconds (None: no limit); `deadline` is a
    time.monotonic() instant bounding the whole exchange; `tls_context`, `tls_sessions` and `via` as
    for _connection. Raises TransportError."""

    def limit(seconds):
        if deadline is None:
            return seconds
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransportError("timed out")
        return remaining if seconds is None else min(seconds, remaining)

    conn = None
    try:
        conn, target, extra = _connection(url, proxy, limit(connect_timeout), tls_context, tls_sessions, via)
        conn.connect()
        sock = conn.sock
        sock.settimeout(limit(idle_timeout))
        all_headers = dict(headers or {})
        all_headers.update(extra)
        conn.request(method, target, body=body, headers=all_headers)
        response = conn.getresponse()
        chunks = []
        while True:
            sock.settimeout(limit(idle_timeout))
            data = response.read1(READ_CHUNK)
            if not data:
                break
            chunks.append(data)
        response_headers = {key.lower(): value for key, value in response.getheaders()}
        if tls_sessions is not None and isinstance(sock, ssl.SSLSocket):
            tls_sessions.session = sock.session  # with TLS 1.3 known only once the answer was read
            tls_sessions.resumed = sock.session_reused
        return HttpResponse(response.status, response.reason, response_headers, b"".join(chunks))
    except socket.timeout:  # noqa: UP041 (on 3.9 socket.timeout is not TimeoutError)
        raise TransportError("timed out") from None
    except (OSError, http.client.HTTPException) as error:
        reason = str(error) or error.__class__.__name__
        if "timed out" in reason.lower():
            reason = f"timed out ({reason})"
        raise TransportError(reason) from None
    finally:
        if conn is not None:
            conn.close()


def model_timeouts(provider):
    """(connect, idle, overall) seconds for a provider's `timeoutMs`/`chunkTimeoutMs`."""
    timeout_ms = provider.get("timeoutMs")
    chunk_ms = provider.get("chunkTimeoutMs")
    chunk = chunk_ms / 1000.0 if _positive_number(chunk_ms) else None
    if timeout_ms is False:
        return None, chunk, None
    if _positive_number(timeout_ms):
        seconds = timeout_ms / 1000.0
        return seconds, chunk if chunk is not None else seconds, seconds
    return DEFAULT_MODEL_TIMEOUT_S, chunk if chunk is not None else DEFAULT_MODEL_TIMEOUT_S, None


def _positive_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# ---------------------------------------------------------------------------------------------
# Presets


def expand_preset(models, preset_id):
    """The ordered concrete attempts of a preset id, model lists flattened depth-first."""
    presets = models.get("presets") or {}
    providers = models.get("providers") or {}
    attempts = []

    def visit(current, path):
        if current in path:
            raise ModelError("Circular model-list preset: {}".format(" -> ".join(path + [current])))
        preset = presets.get(current)
        if not isinstance(preset, dict):
            raise ModelError(f"Model preset not found: {current}")
        members = preset.get("modelList", preset.get("model-list"))
        if members is not None:
            for member in members:
                visit(member, path + [current])
            return
        if not preset.get("provider") or not preset.get("model"):
            raise ModelError(f"Model preset needs provider and model: {current}")
        provider = providers.get(preset["provider"])
        if not isinstance(provider, dict):
            raise ModelError("Provider not found: {}".format(preset["provider"]))
        attempts.append(Attempt(current, preset, preset["provider"], provider))

    visit(preset_id, [])
    return attempts


def api_model(preset):
    """The provider-facing model id of a concrete preset."""
    return preset.get("apiModel") or preset.get("model")


def provider_secrets(models, env):
    """Every provider key and secret-looking header value the runner could send, for redaction."""
    secret_name = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|password")
    values = []
    for provider in (models.get("providers") or {}).values():
        if not isinstance(provider, dict):
            continue
        options = provider.get("options") if isinstance(provider.get("options"), dict) else {}
        values.extend([provider.get("apiKey"), options.get("apiKey")])
        if provider.get("apiKeyEnv"):
            values.append(env.get(provider["apiKeyEnv"]))
        for headers in (provider.get("headers"), options.get("headers")):
            if isinstance(headers, dict):
                values.extend(v for k, v in headers.items() if secret_name.search(str(k)))
    for preset in (models.get("presets") or {}).values():
        if isinstance(preset, dict) and isinstance(preset.get("headers"), dict):
            values.extend(v for k, v in preset["headers"].items() if secret_name.search(str(k)))
    return [v for v in values if isinstance(v, str) and v.strip()]


def create_provider(attempt, activation, transport, sleep=time.sleep, warn=stderr_warning):
    """The provider client for one concrete attempt; `activation` is the parsed input.json and
    `transport(provider_id, preset_id, body, timeout)` sends a request body through the controller."""
    kind = attempt.provider.get("type")
    if kind in PROXIED_PROVIDER_TYPES:
        return OpenAICompatibleProvider(attempt, transport, sleep=sleep, warn=warn)
    if kind == "scripted":
        return ScriptedProvider(attempt, activation, transport)
    if kind in LATER_PROVIDER_TYPES:
        raise ModelError(
            f"Provider type {kind} is not supported by this version (use openai-compatible, anthropic or scripted)"
        )
    raise ModelError(f"Unknown provider type for {attempt.provider_id}: {kind}")


# ---------------------------------------------------------------------------------------------
# openai-compatible


def _error_text(body):
    text = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text.strip()[:MAX_ERROR_BODY]
    message = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            message = error["message"]
        elif isinstance(error, str):
            message = error
    raw = text.strip()[:MAX_ERROR_BODY]
    return f"{message}\n{raw}" if message else raw


def model_call_timeout(_provider):
    """How long the runner waits for the controller's answer to one model request: without a limit of
    its own. The controller bounds each exchange (connect, first byte, between bytes, overall) and its
    retries, but a call may also wait there for its turn at the provider (the team's limits, a pause
    after a Retry-After) for as long as the team needs; the activation's timeout bounds the whole."""
    return None


class OpenAICompatibleProvider:
    """Chat Completions: the runner builds the request body and the controller's model proxy
    adds the key and headers and forwards it (`transport`), answering the provider's status and body.
    Retries (429, 5xx, failed connections) and the dialect of the server (Anthropic Messages, streaming)
    are the controller's; its answer says whether an error was a context overflow."""

    def __init__(self, attempt, transport, sleep=time.sleep, warn=stderr_warning):
        self.attempt = attempt
        self.transport = transport
        self.sleep = sleep
        self.warn = warn
        self.timeout = model_call_timeout(attempt.provider)

    def request_body(self, messages, tools, tool_choice, max_output_tokens=None):
        return chat_request_body(self.attempt, messages, tools, tool_choice, max_output_tokens)

    def complete(self, messages, tools, tool_choice, max_output_tokens=None):
        """One request through the controller; raises ModelError on any failure."""
        body = self.request_body(messages, tools, tool_choice, max_output_tokens)
        response = self.transport(self.attempt.provider_id, self.attempt.preset_id, body, self.timeout)
        if 200 <= response.status < 300:
            return self._parse(response)
        raise ModelError(
            f"Provider {self.attempt.provider_id} returned HTTP {response.status}: {_error_text(response.body)}",
            response.status, getattr(response, "overflow", None))

    def _parse(self, response):
        return parse_chat_answer(self.attempt.provider_id, response)


def chat_request_body(attempt, messages, tools, tool_choice, max_output_tokens=None):
    """The Chat Completions request body of one model step, as a provider of `attempt` is sent it."""
    preset = attempt.preset
    body = {"model": api_model(preset), "messages": messages}
    max_tokens = max_output_tokens if max_output_tokens is not None else preset.get("maxOutputTokens")
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if preset.get("temperature") is not None:
        body["temperature"] = preset["temperature"]
    if preset.get("topP") is not None:
        body["top_p"] = preset["topP"]
    options = preset.get("providerOptions") if isinstance(preset.get("providerOptions"), dict) else {}
    effort = preset.get("reasoningEffort")
    for key in ("openaiCompatible", attempt.provider_id):
        section = options.get(key)
        if not isinstance(section, dict):
            continue
        for name, value in section.items():
            if name == "reasoningEffort":
                effort = effort or value
            elif name not in SKIPPED_PROVIDER_OPTIONS:
                body[name] = value
    if effort:
        body["reasoning_effort"] = effort
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool["description"],
                    "parameters": tool["parameters"],
                },
            }
            for tool in tools
        ]
        body["tool_choice"] = tool_choice
    body["stream"] = False
    return body


def parse_chat_answer(provider_id, response):
    """The ModelTurn of a Chat Completions answer (a ProxyAnswer); raises ModelError when it is none."""
    try:
        data = json.loads(response.body.decode("utf-8", "replace"))
    except ValueError:
        raise ModelError(
            "Provider {} returned invalid JSON: {}".format(
                provider_id, response.body[:MAX_ERROR_BODY].decode("utf-8", "replace")
            )
        ) from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise ModelError(
            f"Provider {provider_id} returned no choices: "
            f"{json.dumps(data)[:MAX_ERROR_BODY]}"
        )
    message = choices[0].get("message") or {}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(
            ToolCall(
                call.get("id") or f"call_{os.urandom(12).hex()}", function.get("name") or "", arguments
            )
        )
    content = message.get("content")
    return ModelTurn(content if isinstance(content, str) else "", calls, chat_completions_usage(data.get("usage")))


def chat_completions_usage(raw):
    """Token usage of a Chat Completions answer's `usage` object in Suzumio's field names."""
    if not isinstance(raw, dict):
        return {}
    usage = {}
    for field, value in (
        ("input", raw.get("prompt_tokens")),
        ("output", raw.get("completion_tokens")),
        ("total", raw.get("total_tokens")),
        ("reasoning", (raw.get("completion_tokens_details") or {}).get("reasoning_tokens")),
        ("cacheRead", (raw.get("prompt_tokens_details") or {}).get("cached_tokens")),
    ):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            usage[field] = value
    return usage


# ---------------------------------------------------------------------------------------------
# scripted


SIGNALS_HEADING = "# New Signals"
CONTRACT_HEADING = "# Tool And Reporting Contract"
PLACEHOLDER = re.compile(r"\{(agent|project|workspace|artifacts)\}|\{artifacts:([A-Za-z0-9_.-]+)\}")


def new_signals_block(prompt):
    """The part of an activation prompt that `when` is matched against (docs/configuration.md#the-scripted-provider)."""
    lines = (prompt or "").split("\n")
    starts = [i for i, line in enumerate(lines) if line.strip() == SIGNALS_HEADING]
    if not starts:
        # The user message of an activation holds only its signals (suzumio_prompts.user_prompt); older
        # prompts kept them under a heading, between the identity and the contract.
        return prompt or ""
    start = starts[0]
    ends = [i for i, line in enumerate(lines) if i > start and line.strip() == CONTRACT_HEADING]
    end = ends[-1] if ends else len(lines)
    return "\n".join(lines[start:end])


class ScriptedProvider:
    """Plays the script's turn for this agent: one step per request, then empty responses. Each step
    goes to the controller with the request it answers, like any provider's answer, so it is recorded
    and a replay answers from the recording (docs/configuration.md#the-scripted-provider)."""

    def __init__(self, attempt, activation, transport):
        self.attempt = attempt
        self.transport = transport
        self.timeout = model_call_timeout(attempt.provider)
        agent_id = activation["agent"]["id"]
        self.agent_id = agent_id
        self.values = {
            "agent": agent_id,
            "project": activation.get("project", ""),
            "workspace": activation.get("workspace", ""),
            "artifacts": "{}/{}".format(activation.get("artifactsRoot", ""), agent_id),
        }
        self.artifacts_root = activation.get("artifactsRoot", "")
        self.entry_index = None
        self.steps = []
        self.played_steps = 0
        entries = self._entries((attempt.provider.get("script") or {}).get("agents") or {})
        played = set()
        for row in activation.get("history") or []:
            metadata = row.get("metadata") if isinstance(row, dict) else None
            if isinstance(metadata, dict) and isinstance(metadata.get("scriptedEntry"), int):
                played.add(metadata["scriptedEntry"])
        block = new_signals_block((activation.get("activation") or {}).get("prompt", ""))
        for index, entry in enumerate(entries):
            when = entry.get("when") if isinstance(entry, dict) else None
            if index in played or not isinstance(entry, dict):
                continue
            if when is None or when in block:
                self.entry_index = index
                self.steps = list(entry.get("steps") or [])
                break

    def _entries(self, agents):
        if isinstance(agents.get(self.agent_id), list):
            return agents[self.agent_id]
        for key, entries in agents.items():
            if key.endswith("-*") and self.agent_id.startswith(key[:-1]) and isinstance(entries, list):
                return entries
        return []

    def history_metadata(self):
        """Extra metadata for the assistant_output row: the entry that was played, if any."""
        return {} if self.entry_index is None else {"scriptedEntry": self.entry_index}

    def fill(self, value):
        """Replace the placeholders of docs/configuration.md#the-scripted-provider in every string of value."""
        if isinstance(value, str):

            def replace(match):
                if match.group(2):
                    return f"{self.artifacts_root}/{match.group(2)}"
                return self.values[match.group(1)]

            return PLACEHOLDER.sub(replace, value)
        if isinstance(value, dict):
            return {key: self.fill(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.fill(item) for item in value]
        return value

    def complete(self, messages, tools, tool_choice, max_output_tokens=None):
        body = chat_request_body(self.attempt, messages, tools, tool_choice, max_output_tokens)
        answer = chat_answer(self.play(), body["model"])
        response = self.transport(self.attempt.provider_id, self.attempt.preset_id, body, self.timeout,
                                  scripted=answer)
        if 200 <= response.status < 300:
            return parse_chat_answer(self.attempt.provider_id, response)
        raise ModelError(f"Provider {self.attempt.provider_id} returned HTTP {response.status}: "
                         f"{_error_text(response.body)}", response.status, getattr(response, "overflow", None))

    def play(self):
        """The script's next step as a ModelTurn."""
        usage = {"input": 0, "output": 0, "total": 0}
        if self.entry_index is None:
            if self.played_steps:
                return ModelTurn("", [], usage)
            self.played_steps += 1
            return ModelTurn(f"No scripted turn for {self.agent_id}.", [], usage)
        if self.played_steps >= len(self.steps):
            return ModelTurn("", [], usage)
        step = self.steps[self.played_steps]
        self.played_steps += 1
        calls = []
        for number, tool in enumerate(step.get("tools") or []):
            arguments = self.fill(tool.get("input") if isinstance(tool.get("input"), dict) else {})
            calls.append(
                ToolCall(
                    f"call_{self.played_steps}_{number + 1}",
                    safe_tool_name(tool.get("name", "")),
                    json.dumps(arguments),
                )
            )
        return ModelTurn(step.get("say") or "", calls, usage)


def chat_answer(turn, model):
    """A ModelTurn as the Chat Completions answer a provider would have sent."""
    message = {"role": "assistant", "content": turn.text}
    if turn.tool_calls:
        message["tool_calls"] = [{"id": call.id, "type": "function",
                                  "function": {"name": call.name, "arguments": call.arguments}}
                                 for call in turn.tool_calls]
    usage = turn.usage
    return {"object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if turn.tool_calls else "stop"}],
            "usage": {"prompt_tokens": usage.get("input", 0), "completion_tokens": usage.get("output", 0),
                      "total_tokens": usage.get("total", 0)}}
