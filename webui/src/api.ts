// Typed fetch helpers for the Suzumio HTTP API (docs/http-api.md), one function per route the WebUI uses.
// Owns the request helper, the error-text rule of docs/http-api.md and the session API token
// (docs/design/webui.md). Only same-origin relative URLs are built; every path segment is escaped.

// ---------------------------------------------------------------------------------------------
// Data shapes (docs/design/webui.md, docs/http-api.md). Optional fields are omitted by the server.

export type ProjectStatus = 'initialized' | 'running' | 'submitted' | 'completed' | 'stopped' | 'failed';
export type AgentStatus = 'quiet' | 'ready' | 'running' | 'failed' | 'stopped';
export type Priority = 'P0' | 'P1' | 'P2' | 'P3';

export interface ProjectStats {
  messageCount?: number;
  activationCount?: number;
  failedActivationCount?: number;
  runningActivationCount?: number;
  toolCallCount?: number;
  historyMessageCount?: number;
  historyCompactionCount?: number;
  eventCount?: number;
}

export interface Agent {
  id: string;
  displayName?: string;
  role?: string;
  status: AgentStatus | string;
  activeActivationId?: string;
  updatedAt?: string;
  /** Set while a loop guard keeps the agent paused (docs/operations.md#runaways). */
  paused?: AgentPause;
}

export interface AgentPause {
  rule: string;
  reason?: string;
  limit?: number;
  tool?: string;
  peer?: string;
  at?: string;
}

export interface Project {
  id: string;
  name: string;
  status: ProjectStatus | string;
  task?: string;
  submitted_report?: string | null;
  created_at?: string;
  updated_at?: string;
  stats?: ProjectStats;
  /** Tokens and USD of the project's model calls. */
  spend?: Spend;
  /** The same per agent id, for the agents that made a model call. */
  agentSpend?: Record<string, Spend>;
  /** Per agent id: its connections through the controller's egress proxy. */
  agentEgress?: Record<string, EgressTotals>;
  agents?: Agent[];
  /** Where a replay or fork came from (docs/replay.md); null for an ordinary project. */
  origin?: Origin | null;
}

export interface Divergence {
  agentId: string;
  activationId: string;
  sourceActivationId?: string | null;
  requestIndex: number;
  diff: string;
}

export interface Origin {
  kind: 'replay' | 'fork' | string;
  source: string;
  at?: string | null;
  tools?: string | null;
  onDiverge?: string | null;
  diverged?: Divergence | null;
  ended?: boolean;
}

export interface DiffResult {
  a: string;
  b: string;
  identical: boolean;
  firstDifference: { section: string; index?: number; key?: string } | null;
  sections: Record<string, { identical: boolean }>;
}

export interface Message {
  id: string;
  sender: string;
  recipient?: string;
  channel?: string;
  priority: Priority | string;
  body: string;
  createdAt: string;
}

export interface Activation {
  id: string;
  agentId: string;
  status: string;
  startedAt: string;
  completedAt?: string;
  text?: string;
  error?: string;
  emittedMessages?: number;
  hasContext?: boolean;
  /** docs/http-api.md: JSON text of the runner's usage object, truncated at 4000 chars. */
  usageJson?: string;
  /** Accepted too, in case the server exposes the parsed object. */
  usage?: unknown;
  /** With a working copy of the team's repository: its branch's head at the start, and its end commit. */
  commitStart?: string;
  commitEnd?: string;
}

export interface ContextMessage {
  role: string;
  content: string;
  chars?: number;
}

export interface ModelContext {
  version?: number;
  kind?: string;
  recordedAt?: string;
  selectedModel?: string;
  model?: string;
  apiModel?: string;
  firstPrompt?: boolean;
  messageCount?: number;
  totalChars?: number;
  messages?: ContextMessage[];
}

export interface ActivationContext {
  activation: Activation;
  activationPrompt?: string;
  context: ModelContext;
}

export interface HistoryPart {
  type?: string;
  toolName?: string;
  [key: string]: unknown;
}

export interface HistoryRow {
  id: string;
  agentId?: string;
  activationId?: string;
  role: string;
  kind?: string;
  content: string;
  sequence: number;
  compactionId?: string;
  archived?: boolean;
  metadata?: Record<string, unknown>;
  parts?: HistoryPart[];
  createdAt?: string;
}

export interface HistoryPage {
  agentId: string;
  messages: HistoryRow[];
  nextBefore?: number;
}

export interface HistoryArchive {
  compaction: {
    id?: string;
    archivedMessageCount?: number;
    rawChars?: number;
    [key: string]: unknown;
  };
  archive: unknown;
}

export interface EventRow {
  id: string;
  project?: string;
  type: string;
  data_json: string;
  created_at: string;
}

export interface ToolStatus {
  tool: string;
  toolpackId?: string;
  toolpackKind?: string;
  description?: string;
  enabledForAgents?: string[];
  callCount?: number;
  runningCount?: number;
  completedCount?: number;
  failedCount?: number;
  lastStatus?: string;
  lastAgentId?: string;
  lastAt?: string;
  lastError?: string;
  submittedReportPath?: string;
}

export interface JsonSchema {
  type?: unknown;
  title?: unknown;
  description?: unknown;
  default?: unknown;
  enum?: unknown;
  properties?: unknown;
  required?: unknown;
  [key: string]: unknown;
}

export interface ToolUiEntry {
  toolpackId: string;
  toolpackKind?: string;
  id: string;
  title: string;
  description?: string;
  kind: 'panel' | 'action' | string;
  inputSchema?: JsonSchema;
  submitLabel?: string;
}

export interface ToolMetric {
  label?: unknown;
  value?: unknown;
  description?: unknown;
}

export interface ToolUiResult {
  title?: string;
  output?: string;
  metadata?: { metrics?: unknown; [key: string]: unknown };
}

// ---------------------------------------------------------------------------------------------
// API token (docs/design/webui.md): sessionStorage only, never localStorage or cookies. `serve` prints the
// Control room URL `/?token=…`; adoptUrlToken() keeps that token and removes it from the address bar.

const TOKEN_KEY = 'suzumio.apiToken';
export const TOKEN_REQUIRED = 'API token required';
export const TOKEN_INVALID = 'Invalid API token';

export function readToken(): string | null {
  try {
    return window.sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function storeToken(token: string): void {
  try {
    window.sessionStorage.setItem(TOKEN_KEY, token);
  } catch {
    // Storage can be disabled; the token then lives only as long as this page.
  }
  memoryToken = token;
}

export function forgetToken(): void {
  try {
    window.sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Nothing stored when storage is disabled.
  }
  memoryToken = null;
}

let memoryToken: string | null = null;

/**
 * Reads `?token=` once at start-up: stores it for this tab's session and replaces the address
 * (history.replaceState, so no history entry is added) with the same path and hash without the
 * token, so it is neither bookmarked, shared nor kept in the history.
 */
export function adoptUrlToken(): void {
  const params = new URLSearchParams(window.location.search);
  const token = params.get('token');
  if (token === null) return;
  if (token !== '') storeToken(token);
  params.delete('token');
  const query = params.toString();
  const address = `${window.location.pathname}${query ? `?${query}` : ''}${window.location.hash}`;
  window.history.replaceState(window.history.state, '', address);
}

function currentToken(): string | null {
  return readToken() ?? memoryToken;
}

type TokenListener = (message: string) => void;
let tokenListener: TokenListener | null = null;

/** Registers the one callback told when the server refuses the API token (401). */
export function onTokenRefused(listener: TokenListener | null): void {
  tokenListener = listener;
}

// ---------------------------------------------------------------------------------------------
// Request helper (docs/design/webui.md).

export class ApiError extends Error {
  readonly status: number;

  constructor(message: string, status: number) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
  }
}

export function isTokenError(error: unknown): boolean {
  return (
    error instanceof ApiError &&
    error.status === 401 &&
    (error.message === TOKEN_REQUIRED || error.message === TOKEN_INVALID)
  );
}

/** The text shown to the user for any thrown value. */
export function errorText(error: unknown): string {
  if (error instanceof Error) return error.message || String(error);
  return String(error);
}

/** docs/http-api.md: `.error` of a JSON object, else the raw body, else `Request failed: <status>`. */
export function errorMessageFromBody(text: string, status: number): string {
  if (text.trim() !== '') {
    try {
      const parsed: unknown = JSON.parse(text);
      if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) {
        const message = (parsed as { error?: unknown }).error;
        if (typeof message === 'string') return message;
      }
    } catch {
      // Not JSON: the raw text is the message.
    }
    return text;
  }
  return `Request failed: ${status}`;
}

async function send(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  const token = currentToken();
  if (token && path.startsWith('/api/')) headers.set('authorization', `Bearer ${token}`);
  const response = await fetch(path, { ...init, headers });
  if (!response.ok) {
    const text = await response.text();
    const error = new ApiError(errorMessageFromBody(text, response.status), response.status);
    if (isTokenError(error)) {
      forgetToken();
      tokenListener?.(error.message);
    }
    throw error;
  }
  return response;
}

async function getJson<T>(path: string): Promise<T> {
  const response = await send(path);
  return (await response.json()) as T;
}

async function getText(path: string): Promise<string> {
  const response = await send(path);
  return response.text();
}

async function postJson<T>(path: string, body?: unknown, extraHeaders?: Record<string, string>): Promise<T> {
  const init: RequestInit = { method: 'POST' };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'content-type': 'application/json', ...(extraHeaders ?? {}) };
  }
  const response = await send(path, init);
  const text = await response.text();
  return (text.trim() === '' ? {} : JSON.parse(text)) as T;
}

const enc = encodeURIComponent;

function projectPath(project: string): string {
  return `/api/projects/${enc(project)}`;
}

// ---------------------------------------------------------------------------------------------
// Routes.

export const listProjects = () => getJson<Project[]>('/api/projects');

/** Tokens and USD the controller saw; costUsd is null when no call had prices; cachedTokens (prompt
 * tokens read from the provider's cache) are among tokens. */
export interface Spend {
  calls: number;
  tokens: number;
  cachedTokens?: number;
  cacheWriteTokens?: number;
  costUsd: number | null;
}

/** egress.allowed (connections) and egress.denied events of one agent, and their bytes. */
export interface EgressTotals {
  connections: number;
  denied: number;
  bytesIn: number;
  bytesOut: number;
}

export interface Costs {
  project: Spend;
  agents: Record<string, Spend>;
  activations: Record<string, Spend>;
}

export const getDiff = (project: string, other: string) =>
  getJson<DiffResult>(`${projectPath(project)}/diff/${enc(other)}`);

export const getCosts = (project: string) => getJson<Costs>(`${projectPath(project)}/costs`);

/** `$0.0123`, or '' when nothing was priced. */
export function formatCost(cost: number | null | undefined): string {
  return typeof cost === 'number' ? `$${cost.toFixed(4)}` : '';
}

/** The full task; the server ends every text body with one `\n` when missing (docs/http-api.md); it is not task text. */
export async function getTask(project: string): Promise<string> {
  const text = await getText(`${projectPath(project)}/task`);
  return text.endsWith('\n') ? text.slice(0, -1) : text;
}

export type LifecycleAction = 'start' | 'stop' | 'approve';

export const runLifecycle = (project: string, action: LifecycleAction) =>
  postJson<unknown>(`${projectPath(project)}/${action}`);

export interface SendMessageBody {
  recipient: string;
  priority: string;
  body: string;
}

export const sendMessage = (project: string, body: SendMessageBody) =>
  postJson<Message>(`${projectPath(project)}/messages`, body);

// Approval requests.
export type ApprovalDecision = 'allow' | 'deny' | 'allow-always' | 'respond';

export interface Approval {
  id: string;
  agentId: string;
  activationId: string;
  toolCallId: string;
  tool: string;
  input: unknown;
  status: string;
  decision?: ApprovalDecision;
  decidedBy?: string;
  note?: string;
  expiresAt: string;
  createdAt: string;
  decidedAt?: string;
  /** A pending `repo.merge`: the change it would queue, the agent's workspace against the integration branch. */
  preview?: { diff: string };
}

export const listPendingApprovals = (project: string) =>
  getJson<Approval[]>(`${projectPath(project)}/approvals?status=pending`);

/** With allow: `input` runs the call with an edited input; with respond: `output` is the call's result. */
export interface DecisionExtras {
  note?: string;
  input?: Record<string, unknown>;
  output?: string;
}

/** The decision is recorded as made in the control room (`Suzumio-Client: webui`). */
export const decideApproval = (project: string, id: string, decision: ApprovalDecision, extras: DecisionExtras = {}) =>
  postJson<Approval>(
    `${projectPath(project)}/approvals/${enc(id)}`,
    { decision, ...extras },
    { 'suzumio-client': 'webui' },
  );

// The effect ledger (docs/operations.md#what-an-agent-can-do-to-the-outside-world).
export type EffectResolution = 'done' | 'not_done';

export interface Effect {
  id: string;
  agent: string;
  activation: string;
  tool: string;
  input: unknown;
  state: 'intended' | 'done' | 'failed' | 'in_doubt';
  callKey?: string;
  startedAt: string;
  why?: string;
  resolvedAt?: string;
  resolution?: EffectResolution;
  note?: string;
}

export const listEffectsInDoubt = (project: string) =>
  getJson<Effect[]>(`${projectPath(project)}/effects?state=in_doubt`);

/** The resolution is recorded as made in the control room (`Suzumio-Client: webui`). */
export const resolveEffect = (project: string, id: string, resolution: EffectResolution, note?: string) =>
  postJson<Effect>(
    `${projectPath(project)}/effects/${enc(id)}/resolve`,
    note ? { resolution, note } : { resolution },
    { 'suzumio-client': 'webui' },
  );

// Loop guards and concurrency caps (docs/operations.md#runaways).
export interface CapWait {
  agentId: string;
  signals: number;
  since: string;
  cap: 'project' | 'root';
}

export interface Concurrency {
  maxConcurrentActivations?: number;
  running: number;
  rootMaxActivations?: number;
  rootRunning?: number;
  waiting: CapWait[];
  paused: (AgentPause & { agentId: string })[];
}

export const getConcurrency = (project: string) => getJson<Concurrency>(`${projectPath(project)}/concurrency`);

/** Resumed as from the control room (`Suzumio-Client: webui`). */
export const resumeAgent = (project: string, agentId: string) =>
  postJson<Agent>(`${projectPath(project)}/agents/${enc(agentId)}/resume`, {}, { 'suzumio-client': 'webui' });

export const listMessages = (project: string) =>
  getJson<Message[]>(`${projectPath(project)}/messages?limit=100`);

export const getMessage = (project: string, id: string) =>
  getJson<Message>(`${projectPath(project)}/messages/${enc(id)}`);

export function getHistory(project: string, agent: string, before?: number): Promise<HistoryPage> {
  const query = before === undefined ? 'limit=80' : `limit=80&before=${enc(String(before))}`;
  return getJson<HistoryPage>(`${projectPath(project)}/agents/${enc(agent)}/history?${query}`);
}

export const getHistoryArchive = (project: string, agent: string, compactionId: string) =>
  getJson<HistoryArchive>(
    `${projectPath(project)}/agents/${enc(agent)}/history-archive/${enc(compactionId)}`,
  );

export const listActivations = (project: string) =>
  getJson<Activation[]>(`${projectPath(project)}/activations?limit=100`);

export const getActivationContext = (project: string, id: string) =>
  getJson<ActivationContext>(`${projectPath(project)}/activations/${enc(id)}/context`);

export const getToolStatus = (project: string) =>
  getJson<ToolStatus[]>(`${projectPath(project)}/tool-status`);

export const getToolUi = (project: string) => getJson<ToolUiEntry[]>(`${projectPath(project)}/tool-ui`);

export const invokeToolUi = (project: string, toolpackId: string, entryId: string, body: object) =>
  postJson<ToolUiResult>(`${projectPath(project)}/tool-ui/${enc(toolpackId)}/${enc(entryId)}`, body);

export const EVENT_PAGE = 120;

export const listEvents = (project: string) =>
  getJson<EventRow[]>(`${projectPath(project)}/events?limit=${EVENT_PAGE}`);

/** A page of events older than `before` (an event id), of one type (or a `prefix.`) and of one agent. */
export function listEventsPage(project: string, filter: { before?: string; type?: string; agent?: string }) {
  const query = new URLSearchParams({ limit: String(EVENT_PAGE) });
  if (filter.before) query.set('before', filter.before);
  if (filter.type) query.set('type', filter.type);
  if (filter.agent) query.set('agent', filter.agent);
  return getJson<EventRow[]>(`${projectPath(project)}/events?${query.toString()}`);
}

/**
 * URL of the SSE stream (docs/http-api.md). `EventSource` cannot set headers, so a stored token
 * travels as `?token=`, which the stream route alone accepts. `limit=1` keeps the initial replay
 * small: the page has just loaded everything it shows.
 */
export function streamUrl(project: string): string {
  const token = currentToken();
  const tokenQuery = token ? `&token=${enc(token)}` : '';
  return `${projectPath(project)}/stream?limit=1${tokenQuery}`;
}

// ---------------------------------------------------------------------------------------------
// Team view (docs/http-api.md): time-range pages of activations, messages, waits and submissions.

export interface TimelineSignal {
  id: string;
  kind: string;
  priority: Priority | string;
  sourceAgent?: string;
  sourceActivation?: string;
  targetAgent?: string;
  messageId?: string;
  reason?: string;
  createdAt: string;
  deliveredActivationId?: string;
}

export interface TimelineActivation extends Activation {
  /** The signals delivered to this activation when it started (what woke it). */
  signals?: TimelineSignal[];
}

export interface TimelinePage {
  /** Lower bound of this page (inclusive); absent when the page reaches the project's beginning. */
  since?: string;
  until?: string;
  /** Older items exist: ask again with `until` = this page's `since`. */
  more: boolean;
  activations: TimelineActivation[];
  messages: Message[];
  waits: TimelineSignal[];
  approvals: TimelineSignal[];
}

export function getTimeline(
  project: string,
  range: { since?: string; until?: string; limit?: number } = {},
): Promise<TimelinePage> {
  const query = new URLSearchParams();
  if (range.since) query.set('since', range.since);
  if (range.until) query.set('until', range.until);
  query.set('limit', String(range.limit ?? 2000));
  return getJson<TimelinePage>(`${projectPath(project)}/timeline?${query.toString()}`);
}

/** The newest history row of one agent (the running bar's latest text). */
export const getLatestHistory = (project: string, agent: string) =>
  getJson<HistoryPage>(`${projectPath(project)}/agents/${enc(agent)}/history?limit=1`);

// ---------------------------------------------------------------------------------------------
// Evals (docs/evals.md).

export interface EvalSummary {
  id: string;
  suite: string;
  mode: 'live' | 'replay' | 'fork';
  status: 'running' | 'done';
  createdAt: string;
  runs: number;
  passed: number;
}

export interface EvalGrade {
  kind: string;
  passed: boolean;
  score: number;
  evidence: string;
}

export interface EvalRun {
  task: string;
  variant: string;
  index: number;
  project: string;
  status: 'pending' | 'running' | 'graded';
  passed: boolean | null;
  grades: EvalGrade[];
  tokens: number | null;
  error: string | null;
}

export interface EvalResult {
  task: string;
  variant: string;
  runs: number;
  passed: number;
  passRate: number | null;
  passAtK: Record<string, number>;
  passPowK: Record<string, number>;
  interval: [number, number];
  flaky: boolean;
  tokens: number | null;
}

export interface EvalDocument {
  id: string;
  suite: string;
  mode: string;
  status: 'running' | 'done';
  progress: { runs: number; done: number; passed: number; tokens: number; costUsd: number };
  results: EvalResult[];
  regressions: { task: string; variant: string; from: number; to: number }[];
  runs: EvalRun[];
}

export const listEvals = () => getJson<EvalSummary[]>('/api/evals');
export const getEval = (id: string) => getJson<EvalDocument>(`/api/evals/${enc(id)}`);

// The team's output (docs/http-api.md): the final report, the artifact files and their recorded versions.

export interface Report {
  report: string | null;
  status: string;
}

export interface ArtifactFile {
  agent: string;
  path: string;
  size: number;
  versions: number;
}

export interface ArtifactContent {
  agent: string;
  /** `<agent>/<path inside its folder>` */
  path: string;
  /** The recorded version these bytes are, or null (the file now, not recorded). */
  version: number | null;
  versions: number;
  size: number;
  content: string | null;
  binary: boolean;
}

export interface ArtifactDiff {
  path: string;
  from: number;
  to: number | null;
  diff: string;
}

export async function getReport(project: string): Promise<Report> {
  const response = await send(`${projectPath(project)}/report`, { headers: { accept: 'application/json' } });
  return (await response.json()) as Report;
}

export const listArtifacts = (project: string) => getJson<ArtifactFile[]>(`${projectPath(project)}/artifacts`);

function artifactPath(project: string, path: string): string {
  return `${projectPath(project)}/artifacts/${path.split('/').map(enc).join('/')}`;
}

export function getArtifact(project: string, path: string, version?: number | null): Promise<ArtifactContent> {
  const query = typeof version === 'number' ? `?version=${version}` : '';
  return getJson<ArtifactContent>(`${artifactPath(project, path)}${query}`);
}

export function getArtifactDiff(project: string, path: string, from: number, to: number | null): Promise<ArtifactDiff> {
  const toQuery = to === null ? '' : `&to=${to}`;
  return getJson<ArtifactDiff>(`${artifactPath(project, path)}/diff?from=${from}${toQuery}`);
}

/** The raw bytes (`?raw=1`), fetched with the token header, as a Blob the page offers as a download. */
export async function getArtifactBlob(project: string, path: string, version?: number | null): Promise<Blob> {
  const query = typeof version === 'number' ? `&version=${version}` : '';
  const response = await send(`${artifactPath(project, path)}?raw=1${query}`);
  return response.blob();
}

/** Sends a submitted project back to work: a P2 message to the coordinator (or `recipient`). */
export const requestChanges = (project: string, body: string) =>
  postJson<Project>(`${projectPath(project)}/request-changes`, { body });

// ---------------------------------------------------------------------------------------------
// What waits for a person (docs/http-api.md#inbox). Kinds may be added: show an unknown one by its kind.

export interface InboxItem {
  kind: 'approval' | 'report' | 'paused' | string;
  project: string;
  id?: string;
  agentId?: string;
  tool?: string;
  rule?: string | null;
  reason?: string | null;
  since?: string | null;
  expiresAt?: string;
}

export interface Inbox {
  count: number;
  projects: Record<string, number>;
  items: InboxItem[];
}

export const getInbox = () => getJson<Inbox>('/api/inbox');

// ---------------------------------------------------------------------------------------------
// Replays and forks (docs/replay.md): each answers 201 with the new project's full summary.

export interface ForkBody {
  as: string;
  at: string;
  config?: string;
}

export interface ReplayBody {
  as: string;
  tools?: 'live' | 'recorded';
  onDiverge?: 'stop' | 'live';
  config?: string;
}

export const forkProject = (project: string, body: ForkBody) => postJson<Project>(`${projectPath(project)}/fork`, body);

export const replayProject = (project: string, body: ReplayBody) =>
  postJson<Project>(`${projectPath(project)}/replay`, body);

export interface ToolCallRow {
  id: string;
  agent_id: string;
  activation_id: string;
  tool: string;
  created_at: string;
}

export const listToolCalls = (project: string) =>
  getJson<ToolCallRow[]>(`${projectPath(project)}/tool-calls?limit=100000`);

// ---------------------------------------------------------------------------------------------
// Project files sent as text (docs/http-api.md#projects-from-a-file).

export interface ConfigCheck {
  valid: boolean;
  errors: string[];
  name?: string;
  agents?: string[];
  warnings?: string[];
  unknownKeys?: string[];
}

export const checkConfig = (config: string) => postJson<ConfigCheck>('/api/config/validate', { config });

export const createProject = (config: string, start: boolean) =>
  postJson<Project>('/api/projects', { config, start });

// The team's repository (docs/teams-that-write-code.md).
export interface RepositoryCommit {
  commit: string;
  subject: string;
  author: string;
  date?: string;
}

export interface RepositoryBranch {
  name: string;
  agent: string;
  head: string;
  ahead: number;
  behind: number;
}

export interface MergeRequest {
  id: string;
  agent: string;
  message: string;
  head: string;
  status: 'queued' | 'running' | 'merged' | 'failed';
  commit?: string;
  reason?: 'conflict' | 'checks';
  paths?: string[];
  output?: string;
  createdAt?: string;
  finishedAt?: string;
}

export interface RepositoryClaim {
  id: string;
  agent: string;
  path: string;
  reason: string;
  expiresAt: string;
}

export interface Repository {
  branch: string;
  head: string;
  log: RepositoryCommit[];
  branches: RepositoryBranch[];
  queue: MergeRequest[];
  claims: RepositoryClaim[];
}

export const getRepository = (project: string) => getJson<Repository>(`${projectPath(project)}/repository`);
export const getRepositoryDiff = (project: string, from: string, to: string) =>
  getJson<{ from: string; to: string; diff: string; truncated?: boolean }>(
    `${projectPath(project)}/repository/diff?from=${enc(from)}&to=${enc(to)}`,
  );
