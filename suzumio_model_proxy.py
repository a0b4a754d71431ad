"""The controller's model proxy: a runner sends the Chat Completions body it built to `POST /runner/model`;
this module resolves the provider and preset from the project's ProjectConfig, adds the key and the
secret headers from the controller's own environment, forwards through the controller's proxies with the
provider's timeouts, and reads the token usage from the provider's answer. Imported by
suzumio_runner_support and the composition root; takes the ProjectConfig it is given and imports only
errors and the runner's standard-library HTTP client (suzumio_runner_models, importing nothing of the
controller)."""
import json
import logging
import os
import re
import socket
import threading
import time
from collections import namedtuple
from collections.abc import Mapping
from urllib.parse import urlencode, urlsplit, urlunsplit

from suzumio_errors import BadGateway, BadRequest, Forbidden, NotFound
from suzumio_runner_models import TransportError, chat_completions_usage, http_request, model_timeouts, proxy_for

log = logging.getLogger(__name__)

REDACTED = "<redacted>"
HOST_GATEWAY = "host.docker.internal"
# Placeholder keys of local servers ("EMPTY", "none") are no secret, and replacing them would rewrite
# the model's text; real keys are far longer.
MIN_REDACTED_LENGTH = 8
# Provider options the proxy applies; `maxRetries` is the runner's (it retries through the proxy).
FORWARD_OPTIONS = ("apiKey", "baseURL", "headers", "queryParams")
RUNNER_OPTIONS = ("maxRetries",)
# Answer headers the runner's retry logic reads; nothing else of the upstream headers reaches it.
RETRY_HEADERS = ("retry-after", "retry-after-ms")
SECRET_HEADER = re.compile(r"(?i)authorization|api[-_]?key|token|secret|cookie|password")

ModelAnswer = namedtuple("ModelAnswer", "status headers body usage")
Upstream = namedtuple("Upstream", "url headers proxy timeouts api_model secrets")


def is_secret_header(name):
    """Header names whose values are credentials (kept out of runners, redacted from answers)."""
    return SECRET_HEADER.search(name) is not None


class ModelProxy:
    """Forwards runner model requests to their provider; `environ` is the controller's environment
    (read at each call, as the backends read it at each activation start)."""

    def __init__(self, environ=None, clock=time.monotonic, resolve=socket.getaddrinfo):
        self._environ = os.environ if environ is None else environ
        self._clock = clock
        self._resolve = resolve
        self._lock = threading.Lock()
        self._gateway_resolves = None
        self._warned = set()

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
        if provider.type != "openai-compatible":
            raise BadRequest(f"Provider type {provider.type} is not supported by this version "
                             "(use openai-compatible or scripted)")
        options = dict(provider.options or {})
        self._warn_ignored(config.name, provider_id, options)
        environ = self._environ
        key = (options.get("apiKey") or provider.api_key
               or (environ.get(provider.api_key_env) if provider.api_key_env else None) or None)
        base_url = (options.get("baseURL") or provider.base_url
                    or (environ.get(provider.base_url_env) if provider.base_url_env else None) or None)
        if not base_url:
            raise BadGateway(f"Provider {provider_id} has no baseURL")
        url = self.controller_base_url(base_url).rstrip("/") + "/chat/completions"
        query = options.get("queryParams")
        if isinstance(query, dict) and query:
            url += "?" + urlencode({str(k): str(v) for k, v in query.items()})
        # Later wins: the type's auth header, provider headers, option headers, preset headers (§10.1).
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        for extra in (provider.headers, options.get("headers"), preset.headers):
            if isinstance(extra, Mapping):
                headers.update((str(k), str(v)) for k, v in extra.items())
        secrets = [key] + [v for k, v in headers.items() if is_secret_header(k)]
        proxy_env = dict(config.proxy_environment(environ, rewrite_hosts=False))
        try:
            proxy = proxy_for(url, proxy_env)
        except TransportError as error:
            raise BadGateway(f"Request to provider {provider_id} failed: {error}") from None
        timeouts = model_timeouts({"timeoutMs": provider.timeout_ms, "chunkTimeoutMs": provider.chunk_timeout_ms})
        secrets = sorted({s for s in secrets if isinstance(s, str) and len(s) >= MIN_REDACTED_LENGTH},
                         key=len, reverse=True)
        return Upstream(url, headers, proxy, timeouts, preset.api_model or preset.model, secrets)

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

    def forward(self, config, agent_id, provider_id, preset_id, body):
        """Send one Chat Completions request; any upstream status is an answer, a transport failure a 502."""
        if not isinstance(body, dict):
            raise BadRequest("body must be an object")
        upstream = self.upstream(config, agent_id, provider_id, preset_id)
        # The preset decides the model and the proxy reads whole answers: a runner cannot pick another
        # model under this preset's name, nor ask for a stream the proxy would not parse.
        payload = dict(body, model=upstream.api_model, stream=False)
        connect, idle, overall = upstream.timeouts
        deadline = self._clock() + overall if overall is not None else None
        try:
            response = http_request("POST", upstream.url, upstream.headers, json.dumps(payload).encode("utf-8"),
                                    upstream.proxy, connect, idle, deadline)
        except TransportError as error:
            raise BadGateway(f"Request to provider {provider_id} failed: {error}") from None
        text = response.body.decode("utf-8", "replace")
        usage = answer_usage(text) if 200 <= response.status < 300 else {}
        headers = {name: response.headers[name] for name in RETRY_HEADERS if name in response.headers}
        return ModelAnswer(response.status, redact(headers, upstream.secrets), redact(text, upstream.secrets),
                           usage)


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
