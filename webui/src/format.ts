// Formatting rules of docs/design/webui.md (relative time, clock time, counts, initials, event summaries)
// and the reading of per-activation token usage. Pure functions; imported by every view.

export function relativeTime(iso: string | undefined, now: number = Date.now()): string {
  if (!iso) return 'unknown time';
  const then = Date.parse(iso);
  if (Number.isNaN(then)) return 'unknown time';
  const seconds = Math.max(0, Math.floor((now - then) / 1000));
  if (seconds < 60) return `${seconds}s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ago`;
  return `${Math.floor(seconds / 86400)}d ago`;
}

export function clockTime(value: string | number | Date | undefined): string {
  if (value === undefined) return '';
  const date = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

export function count(value: number | undefined | null): string {
  return (typeof value === 'number' && Number.isFinite(value) ? value : 0).toLocaleString();
}

/** `512 B`, `12.5 kB`, `3.1 MB` (decimal units, as `suzumio status` prints them). */
export function formatBytes(size: number): string {
  if (size < 1000) return `${size} B`;
  if (size < 1e6) return `${(size / 1000).toFixed(1)} kB`;
  return `${(size / 1e6).toFixed(1)} MB`;
}

export function initials(name: string): string {
  const parts = name.split(/[\s_-]+/).filter((part) => part !== '');
  return parts
    .slice(0, 2)
    .map((part) => part.charAt(0))
    .join('')
    .toUpperCase();
}

export function isTruncated(text: string | undefined): boolean {
  return typeof text === 'string' && text.includes('[truncated');
}

export function messageTarget(message: { recipient?: string; channel?: string }): string {
  return message.recipient ?? message.channel ?? 'broadcast';
}

function plainValue(value: unknown): string {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/** Timeline summary: first 4 `key: value` pairs, `No payload`, or the raw text. */
export function eventSummary(dataJson: string): string {
  let parsed: unknown;
  try {
    parsed = JSON.parse(dataJson);
  } catch {
    return dataJson;
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) return dataJson;
  const entries = Object.entries(parsed as Record<string, unknown>);
  if (entries.length === 0) return 'No payload';
  return entries
    .slice(0, 4)
    .map(([key, value]) => `${key}: ${plainValue(value)}`)
    .join(' - ');
}

export function prettyJson(value: unknown): string {
  const text = JSON.stringify(value, null, 2);
  return text === undefined ? String(value) : text;
}

/** A metric tile value: strings, numbers and booleans as-is, anything else as JSON. */
export function metricValue(value: unknown): string {
  if (typeof value === 'string') return value;
  if (typeof value === 'number') return value.toLocaleString();
  if (typeof value === 'boolean') return String(value);
  return plainValue(value) ?? '';
}

// ---------------------------------------------------------------------------------------------
// Token usage (docs/design/runner.md): `{selectedModel, model, apiModel, tokens?}`
// where tokens = `{input, output, total, reasoning, cacheRead, cacheWrite}`, each optional.

export interface TokenUsage {
  selectedModel?: string;
  model?: string;
  apiModel?: string;
  input?: number;
  output?: number;
  total?: number;
  reasoning?: number;
  cacheRead?: number;
  cacheWrite?: number;
}

const TOKEN_FIELDS = ['input', 'output', 'total', 'reasoning', 'cacheRead', 'cacheWrite'] as const;

function asRecord(value: unknown): Record<string, unknown> | null {
  return value && typeof value === 'object' && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : null;
}

/** Reads the activation's usage (object, or the `usageJson` text); null when no tokens were reported. */
export function readUsage(activation: { usage?: unknown; usageJson?: string }): TokenUsage | null {
  let usage = asRecord(activation.usage);
  if (!usage && typeof activation.usageJson === 'string') {
    try {
      usage = asRecord(JSON.parse(activation.usageJson));
    } catch {
      usage = null;
    }
  }
  if (!usage) return null;
  const tokens = asRecord(usage.tokens) ?? usage;
  const result: TokenUsage = {};
  let reported = false;
  for (const field of TOKEN_FIELDS) {
    const value = tokens[field];
    if (typeof value === 'number' && Number.isFinite(value)) {
      result[field] = value;
      reported = true;
    }
  }
  if (!reported) return null;
  if (typeof result.total !== 'number' && (result.input !== undefined || result.output !== undefined)) {
    result.total = (result.input ?? 0) + (result.output ?? 0);
  }
  for (const field of ['selectedModel', 'model', 'apiModel'] as const) {
    const value = usage[field];
    if (typeof value === 'string' && value !== '') result[field] = value;
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// One time zone throughout (docs/design/webui.md): times are shown in local time; the title (hover)
// gives the same instant in UTC.

/** Local date and time, `Dec 6, 14:35:02`; the date is left out for today. */
export function localTime(value: string | number | Date | undefined): string {
  if (value === undefined) return '';
  const date = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  const today = new Date().toDateString() === date.toDateString();
  const time = clockTime(date);
  return today ? time : `${date.toLocaleDateString(undefined, { month: 'short', day: 'numeric' })}, ${time}`;
}

/** The hover text of a shown time: the instant in UTC. */
export function utcTitle(value: string | number | Date | undefined): string | undefined {
  if (value === undefined) return undefined;
  const date = value instanceof Date ? value : new Date(value);
  if (Number.isNaN(date.getTime())) return undefined;
  return `${date.toISOString().replace('T', ' ').replace(/\.\d+Z$/, '')} UTC`;
}

/** A duration: `850 ms`, `12.4 s`, `3 min 05 s`, `2 h 04 min`. */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return '';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const seconds = Math.round(ms / 1000);
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, '0')} s`;
  return `${Math.floor(seconds / 3600)} h ${String(Math.floor((seconds % 3600) / 60)).padStart(2, '0')} min`;
}

/** How long an activation ran (or has run so far). */
export function activationDuration(activation: { startedAt: string; completedAt?: string }, now: number): string {
  const start = Date.parse(activation.startedAt);
  const end = activation.completedAt ? Date.parse(activation.completedAt) : now;
  if (Number.isNaN(start) || Number.isNaN(end)) return '';
  return formatDuration(end - start);
}
