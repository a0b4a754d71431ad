"""Models in a project's configuration (docs/configuration.md#models-providers-presets-model-list): the
typed views of
`backend.runner` (its providers and presets), how they are built from the validated tree, the checks
after the schema that concern them, and model-list expansion. Imported by suzumio_config and by the
model proxy's callers through ProjectConfig."""
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from suzumio_errors import ConfigError
from suzumio_registry import frozen_json

UNSUPPORTED_PROVIDER_TYPES = ("openai", "google")  # Anthropic is supported


class FrozenMapping(Mapping):
    """A read-only, hashable mapping; nested lists and mappings are handed out as copies."""

    __slots__ = ("_items",)

    def __init__(self, data=()):
        self._items = dict(copy.deepcopy(dict(data)))

    def __getitem__(self, key):
        value = self._items[key]
        return copy.deepcopy(value) if isinstance(value, (dict, list)) else value

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(json.dumps(self._items, sort_keys=True, default=repr))

    def __repr__(self):
        return f"FrozenMapping({self._items!r})"


def _ro(mapping):
    return FrozenMapping(mapping)


@dataclass(frozen=True)
class ProviderLimits:
    """`providers.<id>.limits`: what the controller lets the team send to this provider (None: no limit);
    suzumio_model_gate enforces them."""

    concurrency: int = None
    requests_per_minute: int = None
    tokens_per_minute: int = None


NO_LIMITS = ProviderLimits()


@dataclass(frozen=True)
class ProviderConfig:
    """`backend.runner.models.providers.<id>`; `script` is the resolved mapping for scripted providers."""

    id: str
    type: str
    api_key: str = None
    api_key_env: str = None
    base_url: str = None
    base_url_env: str = None
    headers: FrozenMapping = None
    timeout_ms: object = None
    chunk_timeout_ms: int = None
    options: FrozenMapping = None
    _script_json: str = field(default=None, repr=False)
    first_byte_timeout_ms: int = None
    limits: "ProviderLimits" = None

    @property
    def script(self):
        return None if self._script_json is None else json.loads(self._script_json)


@dataclass(frozen=True)
class PresetConfig:
    """`backend.runner.models.presets.<id>`; `model_list` is None for concrete presets."""

    id: str
    provider: str = None
    model: str = None
    model_list: tuple = None
    api_model: str = None
    reasoning_effort: str = None
    temperature: float = None
    top_p: float = None
    top_k: float = None
    max_output_tokens: int = None
    context_limit: int = 260000
    tool_choice: str = None
    provider_options: FrozenMapping = None
    headers: FrozenMapping = None
    max_retries: int = None
    pricing: FrozenMapping = None  # USD per million tokens (suzumio_cost)

    @property
    def is_list(self):
        return self.model_list is not None


@dataclass(frozen=True)
class RunnerConfig:
    mode: str
    model: str
    max_iterations: int
    max_tool_calls: int
    budget_max_tokens: int  # backend.runner.budget.maxTokens; None means no token budget
    providers: FrozenMapping
    presets: FrozenMapping
    _json: str = field(repr=False)
    budget_max_cost_usd: float = None  # Backend.runner.budget.maxCostUsd

    def as_json(self):
        """`backend.runner` verbatim in internal spelling, as `input.json` carries it (docs/design/runner.md)."""
        return json.loads(self._json)

    def expand(self, selected):
        """The concrete presets tried for a selection, in order (docs/configuration.md)."""
        return expand_model_list(self.presets, self.providers, selected)


def expand_model_list(presets, providers, selected):
    """Expand a preset selection depth-first into concrete PresetConfigs; run-time errors."""
    out = []

    def visit(preset_id, trail):
        if preset_id in trail:
            raise ConfigError("Circular model-list preset: " + " -> ".join(trail + [preset_id]))
        preset = presets.get(preset_id)
        if preset is None:
            raise ConfigError(f"Model preset not found: {preset_id}")
        if preset.model_list is not None:
            for member in preset.model_list:
                visit(member, trail + [preset_id])
            return
        if not preset.provider or not preset.model:
            raise ConfigError(f"Model preset needs provider and model: {preset_id}")
        if preset.provider not in providers:
            raise ConfigError(f"Provider not found: {preset.provider}")
        out.append(preset)

    visit(selected, [])
    return out


def runner_config(runner):
    """The typed `backend.runner` of a validated tree."""
    models = runner.get("models", {"providers": {}, "presets": {}})
    return RunnerConfig(runner["mode"], runner.get("model"), runner.get("maxIterations"), runner.get("maxToolCalls"),
                        runner.get("budget", {}).get("maxTokens"),
                        FrozenMapping({k: _provider_config(k, v) for k, v in models["providers"].items()}),
                        FrozenMapping({k: _preset_config(k, v) for k, v in models["presets"].items()}),
                        frozen_json(runner), runner.get("budget", {}).get("maxCostUsd"))


def _provider_config(provider_id, data):
    script = data.get("script")
    return ProviderConfig(
        provider_id, data["type"], data.get("apiKey"), data.get("apiKeyEnv"), data.get("baseURL"),
        data.get("baseURLEnv"), _ro(data.get("headers", {})), data.get("timeoutMs"), data.get("chunkTimeoutMs"),
        _ro(data.get("options", {})), None if script is None else frozen_json(script),
        data.get("firstByteTimeoutMs"), _provider_limits(data.get("limits")))


def _provider_limits(data):
    if not data:
        return NO_LIMITS
    return ProviderLimits(data.get("concurrency"), data.get("requestsPerMinute"), data.get("tokensPerMinute"))


def _preset_config(preset_id, data):
    model_list = data.get("modelList")
    return PresetConfig(
        preset_id, data.get("provider"), data.get("model"), None if model_list is None else tuple(model_list),
        data.get("apiModel"), data.get("reasoningEffort"), data.get("temperature"), data.get("topP"),
        data.get("topK"), data.get("maxOutputTokens"), data.get("contextLimit", 260000), data.get("toolChoice"),
        _ro(data.get("providerOptions", {})), _ro(data.get("headers", {})), data.get("maxRetries"),
        None if data.get("pricing") is None else _ro(data["pricing"]))


def check_models(data):
    """The models block exists, has providers and presets, each agent selects a known preset."""
    runner = data["backend"]["runner"]
    models = runner.get("models")
    if models is None:
        raise ConfigError("backend.runner.models is required")
    if not models["providers"]:
        raise ConfigError("backend.runner.models.providers needs at least one provider")
    if not models["presets"]:
        raise ConfigError("backend.runner.models.presets needs at least one preset")
    for provider_id, provider in models["providers"].items():
        if provider["type"] in UNSUPPORTED_PROVIDER_TYPES:
            raise ConfigError(f"backend.runner.models.providers.{provider_id}.type: Provider type {provider['type']} "
                              "is not supported by this version (use openai-compatible, anthropic or scripted)")
    for agent_id, agent in data["agents"].items():
        selected = agent.get("model", runner.get("model"))
        if selected is None:
            raise ConfigError(f"Agent {agent_id} needs an explicit model, or set backend.runner.model")
        if selected not in models["presets"]:
            raise ConfigError(f"Agent {agent_id} selected unknown model preset: {selected}")


def check_presets(models):
    """Presets name known providers and members, and no model list contains itself."""
    presets, providers = models["presets"], models["providers"]
    for preset_id, preset in presets.items():
        path = f"backend.runner.models.presets.{preset_id}"
        if "modelList" not in preset and preset["provider"] not in providers:
            raise ConfigError(f"{path}.provider: unknown provider {preset['provider']}")
        for member in preset.get("modelList", []):
            if member not in presets:
                raise ConfigError(f"{path}.model-list: unknown preset {member}")
        _check_cycles(presets, preset_id, [])


def _check_cycles(presets, preset_id, trail):
    if preset_id in trail:
        raise ConfigError("Circular model-list preset: " + " -> ".join(trail + [preset_id]))
    for member in presets.get(preset_id, {}).get("modelList", []):
        if member in presets:
            _check_cycles(presets, member, trail + [preset_id])
