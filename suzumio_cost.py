"""Money: the cost of one model call from its preset's `pricing` (USD per million tokens), the budget
thresholds over tokens and cost, and the texts of the budget messages."""

import math

WARN_FRACTION = 0.8
PER_TOKEN = 1_000_000.0


def call_cost(preset, usage):
    """USD of one call, or None when the preset has no prices. Cached prompt tokens are billed at
    `cacheReadPerMTok` (else the input price), cache writes at `cacheWritePerMTok` (else input)."""
    pricing = getattr(preset, "pricing", None) if preset is not None else None
    if not pricing or not isinstance(usage, dict):
        return None

    def count(name):
        value = usage.get(name)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return max(0, value) if ok else 0

    input_price = pricing.get("inputPerMTok", 0)
    read, write = count("cacheRead"), count("cacheWrite")
    fresh = max(0, count("input") - read - write)
    cost = (fresh * input_price + read * pricing.get("cacheReadPerMTok", input_price)
            + write * pricing.get("cacheWritePerMTok", input_price)
            + count("output") * pricing.get("outputPerMTok", 0)) / PER_TOKEN
    return round(cost, 10)


def budget_state(max_tokens, max_cost, used_tokens, used_cost):
    """"exceeded" when either limit is used up, "warning" past 80% of either, else None."""
    fractions = []
    if max_tokens is not None:
        fractions.append(used_tokens / max_tokens)
    if max_cost is not None:
        fractions.append(used_cost / max_cost)
    if any(f >= 1 for f in fractions):
        return "exceeded"
    if any(f >= WARN_FRACTION for f in fractions):
        return "warning"
    return None


def budget_warning_message(project, data):
    """The P2 message to the user when 80% of a budget is used."""
    parts = []
    if data.get("maxTokens") is not None:
        parts.append(f"{data['usedTokens']} of {data['maxTokens']} tokens")
    if data.get("maxCostUsd") is not None:
        parts.append(f"${data['usedCostUsd']:.4f} of ${data['maxCostUsd']:.4f}")
    return (f"Budget warning for project {project}: {' and '.join(parts)} used since it was last started "
            f"(80% of backend.runner.budget). The project pauses when a limit is reached.")


def cost_exceeded_message(project, max_cost, used_cost):
    """The P2 message to the user when the money budget is used up."""
    return (f"Cost budget reached for project {project}: ${used_cost:.4f} spent since it was last started "
            f"(backend.runner.budget.maxCostUsd: {max_cost}). The project is paused: running activations "
            f"finish, no new ones start. Run `suzumio start {project}` to resume with a fresh budget.")
