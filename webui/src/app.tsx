// The Suzumio control room (docs/design/webui.md): top-level state, URL-hash routing, the project-list
// poll, the live SSE stream of the selected project, the API-token prompt and the
// layout that mounts one view at a time. Views live in their own modules beside this one.
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import {
  errorText,
  getToolStatus,
  getToolUi,
  isTokenError,
  listActivations,
  listEvents,
  listMessages,
  listProjects,
  onTokenRefused,
  requestChanges,
  runLifecycle,
  storeToken,
  streamUrl,
  TOKEN_INVALID,
  type Activation,
  type EventRow,
  type LifecycleAction,
  type Message,
  type Project,
  type ToolStatus,
  type ToolUiEntry,
} from './api';
import { ActivationsView } from './activations';
import { HistoryView } from './history';
import { applyDelta, endActivation, LivePanel, type ActivationDelta, type LiveOutput } from './live';
import { MessagesView } from './messages';
import { InboxButton, itemView, useInbox } from './inbox';
import { NewProject } from './newproject';
import { OutputView } from './output';
import { onRunCreated } from './runs';
import { Overview } from './overview';
import {
  EmptyState,
  ErrorBanner,
  Hero,
  isViewId,
  Sidebar,
  Tabs,
  TokenPrompt,
  TopBar,
  type LiveMode,
  type ViewId,
} from './shell';
import { TeamView, type TeamStreamEvent } from './team';
import { CompareRuns } from './compare';
import { RepositoryView } from './repository';
import { TimelineView } from './timeline';
import { EvalsPage } from './evals';
import { ToolWorkspace } from './tools';

const POLL_MS = 5000;
/** While the stream is open, events drive refreshes; a slow poll keeps other projects current. */
const LIVE_POLL_MS = 30000;
const STREAM_RETRY_MS = 30000;
const EVENT_DEBOUNCE_MS = 400;

/** Event types of docs/design/store.md and docs/design/scheduler.md; `EventSource` only delivers types it listens for. */
const STREAM_EVENT_TYPES = [
  'project.initialized',
  'project.status',
  'project.submitted',
  'agent.status',
  'message.created',
  'signal.created',
  'activation.started',
  'activation.context_recorded',
  'activation.completed',
  'activation.failed',
  'activation.cancelled',
  'activation.stop_failed',
  'tool.called',
  'tool.completed',
  'tool.failed',
  'agent_history.message',
  'agent_history.compacted',
  'scheduler.quiet_agent_monitor.message_sent',
  'scheduler.failed_agent_monitor.message_sent',
  'scheduler.hook_failed',
  'approval.requested',
  'approval.decided',
  'approval.expired',
  'approval.cancelled',
  'approval.auto_allowed',
  'guard.tripped',
  'agent.resumed',
  'message',
];

// ---------------------------------------------------------------------------------------------
// URL hash (`#/<project>/<view>`, docs/design/webui.md).

interface HashState {
  project: string | null;
  view: ViewId;
  toolKey: string | null;
}

function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}

export function parseHash(hash: string): HashState {
  let text = hash.startsWith('#') ? hash.slice(1) : hash;
  if (text.startsWith('/')) text = text.slice(1);
  const segments = text
    .split('/')
    .filter((segment) => segment !== '')
    .map(decodeSegment);
  if (segments.length === 0) return { project: null, view: 'overview', toolKey: null };
  if (isViewId(segments[0])) return { project: null, view: segments[0], toolKey: null };
  const view = segments[1] !== undefined && isViewId(segments[1]) ? segments[1] : 'overview';
  const toolKey = view === 'tools' && segments[2] !== undefined ? segments[2] : null;
  return { project: segments[0], view, toolKey };
}

function hashNamesView(hash: string): boolean {
  const parsed = parseHash(hash);
  const text = hash.replace(/^#?\/?/, '');
  const segments = text.split('/').filter((segment) => segment !== '').map(decodeSegment);
  return parsed.project === null ? segments.length > 0 : segments.length > 1 && isViewId(segments[1]);
}

export function buildHash(project: string, view: ViewId, toolKey: string | null): string {
  const base = `#/${encodeURIComponent(project)}/${view}`;
  return view === 'tools' && toolKey ? `${base}/${encodeURIComponent(toolKey)}` : base;
}

/** `#/evals`: the Evals page instead of a project (docs/evals.md). */
const EVALS_HASH = '#/evals';

function isEvalsHash(hash: string): boolean {
  return hash === EVALS_HASH || hash.startsWith(`${EVALS_HASH}/`);
}

function pushHash(hash: string): void {
  if (window.location.hash !== hash) window.location.hash = hash;
}

function replaceHash(hash: string): void {
  if (window.location.hash !== hash) window.history.replaceState(window.history.state, '', hash);
}

// ---------------------------------------------------------------------------------------------
// View data caches: replaced on each load, and only shown for the project they belong to.

interface ViewData {
  project: string | null;
  messages: Message[] | null;
  activations: Activation[] | null;
  events: EventRow[] | null;
  toolStatus: ToolStatus[] | null;
  toolUi: ToolUiEntry[] | null;
}

function emptyData(project: string | null): ViewData {
  return { project, messages: null, activations: null, events: null, toolStatus: null, toolUi: null };
}

type StreamTarget = 'projects' | 'messages' | 'activations' | 'events' | 'tools';

function streamTargets(type: string): StreamTarget[] {
  const targets: StreamTarget[] = ['projects', 'events'];
  if (type === 'message.created') targets.push('messages');
  if (type.startsWith('activation.')) targets.push('activations');
  if (type.startsWith('tool.') || type === 'project.submitted') targets.push('tools');
  return targets;
}

function eventAgent(row: { data_json?: unknown }): string | null {
  if (typeof row.data_json !== 'string') return null;
  try {
    const data = JSON.parse(row.data_json) as { agentId?: unknown };
    return typeof data?.agentId === 'string' ? data.agentId : null;
  } catch {
    return null;
  }
}

function eventData(row: { data_json?: unknown }): Record<string, unknown> {
  if (typeof row.data_json !== 'string') return {};
  try {
    const data: unknown = JSON.parse(row.data_json);
    return data && typeof data === 'object' && !Array.isArray(data) ? (data as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

export function App() {
  const initial = useMemo(() => parseHash(window.location.hash), []);
  const [projects, setProjects] = useState<Project[] | null>(null);
  const [selected, setSelected] = useState<string | null>(null);
  const [view, setView] = useState<ViewId>(initial.view);
  const [toolKey, setToolKey] = useState<string | null>(initial.toolKey);
  const [loading, setLoading] = useState(true);
  const [panelLoading, setPanelLoading] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [lastUpdated, setLastUpdated] = useState<Date | null>(null);
  const [tokenPrompt, setTokenPrompt] = useState<{ invalid: boolean } | null>(null);
  const [data, setData] = useState<ViewData>(() => emptyData(null));
  const [viewNonce, setViewNonce] = useState(0);
  const [live, setLive] = useState<LiveMode>('connecting');
  const [now, setNow] = useState(() => Date.now());
  const [historyPulse, setHistoryPulse] = useState<{ agentId: string; n: number } | null>(null);
  // Bumped by approval events and by each project-list load; the approvals cards reload on it.
  const [approvalPulse, setApprovalPulse] = useState(0);
  const [evalsOpen, setEvalsOpen] = useState(() => isEvalsHash(window.location.hash));
  const liveRef = useRef<LiveMode>('connecting');
  useEffect(() => {
    // A stream that (re)opens may have missed approval events: the cards reload once.
    if (live === 'live' && liveRef.current !== 'live') setApprovalPulse((n) => n + 1);
    liveRef.current = live;
  }, [live]);

  // Event handlers (hashchange, timers, the stream) read current values through this ref.
  const current = useRef({
    projects: null as Project[] | null,
    selected: null as string | null,
    preferred: initial.project,
    view: initial.view,
    toolKey: initial.toolKey,
    tokenBlocked: false,
    evalsOpen: isEvalsHash(window.location.hash),
    // A hash without a view lets the first list response pick it: Team for a running project.
    viewOpen: !hashNamesView(window.location.hash),
  });
  const projectSeq = useRef(0);
  const loadSeqs = useRef<Record<string, number>>({});
  const panelSeq = useRef(0);
  const pollInFlight = useRef(false);

  function hashFor(project: string): string {
    return buildHash(project, current.current.view, current.current.toolKey);
  }

  function selectProjectState(id: string | null) {
    if (current.current.selected === id) return;
    current.current.selected = id;
    setSelected(id);
    setData(emptyData(id));
  }

  async function loadProjects(): Promise<boolean> {
    const request = ++projectSeq.current;
    try {
      const list = await listProjects();
      if (request !== projectSeq.current) return true;
      current.current.projects = list;
      setProjects(list);
      // While the stream is live, approval events drive the cards; otherwise each poll does.
      if (liveRef.current !== 'live') setApprovalPulse((n) => n + 1);
      setLastUpdated(new Date());
      setError(null);
      const wanted = current.current.selected ?? current.current.preferred;
      const next = list.find((project) => project.id === wanted)?.id ?? list[0]?.id ?? null;
      current.current.preferred = null;
      if (current.current.viewOpen) {
        current.current.viewOpen = false;
        if (list.find((project) => project.id === next)?.status === 'running') {
          current.current.view = 'team';
          setView('team');
        }
      }
      selectProjectState(next);
      if (next !== null && !current.current.evalsOpen) replaceHash(hashFor(next));
      return true;
    } catch (caught) {
      if (request === projectSeq.current && !isTokenError(caught)) setError(errorText(caught));
      return false;
    }
  }

  async function loadView(project: string, which: ViewId, quiet = false, only?: 'toolStatus') {
    if (which === 'overview' || which === 'history' || which === 'team' || which === 'output' || which === 'repository') {
      if (!quiet) {
        panelSeq.current += 1;
        setPanelLoading(false);
      }
      return;
    }
    // One sequence per data set, so a quiet stream refresh never discards another view's load.
    const key = only ?? which;
    const request = (loadSeqs.current[key] = (loadSeqs.current[key] ?? 0) + 1);
    const panelRequest = quiet ? null : ++panelSeq.current;
    const isLatest = () => request === loadSeqs.current[key];
    const apply = (patch: Partial<ViewData>) => {
      if (!isLatest() || current.current.selected !== project) return;
      setData((old) => ({ ...(old.project === project ? old : emptyData(project)), ...patch }));
    };
    if (!quiet) setPanelLoading(true);
    try {
      if (which === 'messages') apply({ messages: await listMessages(project) });
      else if (which === 'activations') apply({ activations: await listActivations(project) });
      else if (which === 'events') apply({ events: await listEvents(project) });
      else if (only === 'toolStatus') apply({ toolStatus: await getToolStatus(project) });
      else {
        const [toolStatus, toolUi] = await Promise.all([getToolStatus(project), getToolUi(project)]);
        apply({ toolStatus, toolUi });
      }
      if (isLatest()) setError(null);
    } catch (caught) {
      if (isLatest() && !isTokenError(caught)) setError(errorText(caught));
    } finally {
      if (panelRequest !== null && panelRequest === panelSeq.current) setPanelLoading(false);
    }
  }

  async function reloadAll() {
    setLoading(true);
    await loadProjects();
    setViewNonce((n) => n + 1);
    setLoading(false);
  }

  const [creating, setCreating] = useState(false);
  // A fork, replay or new project made on the page opens in the Team view once the list holds it.
  async function openCreated(id: string) {
    setCreating(false);
    await loadProjects();
    current.current.view = 'team';
    setView('team');
    chooseProject(id);
  }

  // Start-up: first list request, token-refusal listener, hashchange.
  useEffect(() => {
    onRunCreated((id) => void openCreated(id));
    onTokenRefused((message) => {
      current.current.tokenBlocked = true;
      setTokenPrompt({ invalid: message === TOKEN_INVALID });
    });
    void loadProjects().then(() => setLoading(false));
    const onHashChange = () => {
      const evals = isEvalsHash(window.location.hash);
      current.current.evalsOpen = evals;
      setEvalsOpen(evals);
      if (!evals) followHash(parseHash(window.location.hash));
    };
    window.addEventListener('hashchange', onHashChange);
    const clock = window.setInterval(() => setNow(Date.now()), 5000);
    return () => {
      onTokenRefused(null);
      window.removeEventListener('hashchange', onHashChange);
      window.clearInterval(clock);
    };
  }, []);

  function followHash(next: HashState) {
    const state = current.current;
    if (next.view !== state.view) {
      state.view = next.view;
      setView(next.view);
    }
    if (next.view === 'tools' && next.toolKey !== state.toolKey) {
      state.toolKey = next.toolKey;
      setToolKey(next.toolKey);
    }
    const list = state.projects;
    if (list === null) {
      state.preferred = next.project;
      return;
    }
    if (next.project !== null && next.project === state.selected) return;
    if (next.project !== null && list.some((p) => p.id === next.project)) {
      selectProjectState(next.project);
      setLoading(true);
      void loadProjects().then(() => setLoading(false));
      return;
    }
    // An unknown project falls back to the first one; a bare view keeps the current project.
    const keep = next.project === null && list.some((p) => p.id === state.selected);
    const fallback = keep ? state.selected : list[0]?.id ?? null;
    selectProjectState(fallback);
    if (fallback !== null) replaceHash(hashFor(fallback));
  }

  // View data: on view activation, project change, Refresh, actions and sends.
  useEffect(() => {
    if (selected !== null && !tokenPrompt) void loadView(selected, view);
  }, [selected, view, viewNonce]);

  // Project-list poll: every 5 s, or slowly while the live stream drives refreshes.
  useEffect(() => {
    if (tokenPrompt) return;
    const interval = live === 'live' ? LIVE_POLL_MS : POLL_MS;
    const timer = window.setInterval(() => {
      if (pollInFlight.current) return;
      pollInFlight.current = true;
      void loadProjects().finally(() => {
        pollInFlight.current = false;
      });
    }, interval);
    return () => window.clearInterval(timer);
  }, [tokenPrompt, live]);

  // Live stream of the selected project (docs/http-api.md): one EventSource per tab.
  const pendingTargets = useRef(new Set<StreamTarget>());
  // The Team view listens to every stream event itself (it pages its own data by time range).
  const teamListeners = useRef(new Set<(event: TeamStreamEvent) => void>());
  const subscribeTeam = useMemo(
    () => (listener: (event: TeamStreamEvent) => void) => {
      teamListeners.current.add(listener);
      return () => {
        teamListeners.current.delete(listener);
      };
    },
    [],
  );
  const flushTimer = useRef<number | undefined>(undefined);
  // Streamed model output of the selected project's running activations.
  const [liveOutput, setLiveOutput] = useState<LiveOutput>({});

  function flushStreamTargets() {
    flushTimer.current = undefined;
    const targets = pendingTargets.current;
    pendingTargets.current = new Set();
    const project = current.current.selected;
    if (project === null || current.current.tokenBlocked) return;
    if (targets.has('projects') && !pollInFlight.current) {
      pollInFlight.current = true;
      void loadProjects().finally(() => {
        pollInFlight.current = false;
      });
    }
    const shown = current.current.view;
    if (shown === 'messages' && targets.has('messages')) void loadView(project, 'messages', true);
    if (shown === 'activations' && targets.has('activations')) void loadView(project, 'activations', true);
    if (shown === 'events' && targets.has('events')) void loadView(project, 'events', true);
    if (shown === 'tools' && targets.has('tools')) void loadView(project, 'tools', true, 'toolStatus');
  }

  useEffect(() => {
    if (selected === null || tokenPrompt) {
      setLive(tokenPrompt ? 'paused' : 'polling');
      return;
    }
    if (typeof EventSource === 'undefined') {
      setLive('polling');
      return;
    }
    let source: EventSource | null = null;
    let retry: number | undefined;
    // A new stream replays the newest event (`limit=1`), which predates the loads this tab just made;
    // on the first connection it is skipped, after a failed stream it refreshes what was missed.
    let firstConnection = true;
    let skipReplay = false;
    const onEvent = (event: MessageEvent) => {
      if (skipReplay) {
        skipReplay = false;
        return;
      }
      let row: { type?: unknown; data_json?: unknown } = {};
      try {
        row = JSON.parse(String(event.data));
      } catch {
        row = {};
      }
      const type = typeof row.type === 'string' ? row.type : event.type;
      if (type === 'activation.completed' || type === 'activation.failed' || type === 'activation.cancelled') {
        const ended = eventData(row).activationId;
        setLiveOutput((live) => endActivation(live, typeof ended === 'string' ? ended : undefined));
      }
      if (teamListeners.current.size > 0) {
        const teamEvent = { type, data: eventData(row) };
        for (const listener of teamListeners.current) listener(teamEvent);
      }
      for (const target of streamTargets(type)) pendingTargets.current.add(target);
      if (type.startsWith('approval.')) setApprovalPulse((n) => n + 1);
      if (type.startsWith('agent_history.')) {
        const agentId = eventAgent(row);
        if (agentId) setHistoryPulse((pulse) => ({ agentId, n: (pulse?.n ?? 0) + 1 }));
      }
      if (flushTimer.current === undefined) {
        flushTimer.current = window.setTimeout(flushStreamTargets, EVENT_DEBOUNCE_MS);
      }
    };
    const connect = () => {
      setLive('connecting');
      skipReplay = firstConnection;
      firstConnection = false;
      const stream = new EventSource(streamUrl(selected));
      source = stream;
      let opened = false;
      stream.onopen = () => {
        opened = true;
        setLive('live');
      };
      stream.onerror = () => {
        setLive('fallback');
        // A stream that was open just dropped: check the server now rather than at the next poll.
        if (opened) {
          opened = false;
          if (!pollInFlight.current) {
            pollInFlight.current = true;
            void loadProjects().finally(() => {
              pollInFlight.current = false;
            });
          }
        }
        if (stream.readyState === EventSource.CLOSED) {
          stream.close();
          retry = window.setTimeout(connect, STREAM_RETRY_MS);
        }
      };
      for (const type of STREAM_EVENT_TYPES) stream.addEventListener(type, onEvent as EventListener);
      // Ephemeral frames (no id, never replayed): folded into the live panel, never a refresh.
      stream.addEventListener('activation.delta', ((event: MessageEvent) => {
        try {
          const delta = JSON.parse(String(event.data)) as ActivationDelta;
          if (typeof delta.activationId === 'string') setLiveOutput((live) => applyDelta(live, delta));
        } catch {
          // a frame that is not JSON shows nothing
        }
      }) as EventListener);
    };
    setLiveOutput({});
    connect();
    return () => {
      window.clearTimeout(retry);
      window.clearTimeout(flushTimer.current);
      flushTimer.current = undefined;
      pendingTargets.current.clear();
      source?.close();
    };
  }, [selected, tokenPrompt]);

  // User navigation: pushes a history entry.
  function chooseProject(id: string) {
    setCreating(false);
    selectProjectState(id);
    pushHash(hashFor(id));
    setViewNonce((n) => n + 1);
    setLoading(true);
    void loadProjects().then(() => setLoading(false));
  }

  function chooseView(next: ViewId) {
    current.current.viewOpen = false;
    current.current.view = next;
    setView(next);
    if (selected !== null) pushHash(hashFor(selected));
    setViewNonce((n) => n + 1);
  }

  function chooseToolPage(key: string, mode: 'push' | 'replace') {
    current.current.toolKey = key;
    setToolKey(key);
    if (selected === null) return;
    if (mode === 'push') pushHash(hashFor(selected));
    else replaceHash(hashFor(selected));
  }

  async function runAction(action: LifecycleAction | { changes: string }) {
    if (selected === null) return;
    setLoading(true);
    let failure: string | null = null;
    try {
      if (typeof action === 'string') await runLifecycle(selected, action);
      else await requestChanges(selected, action.changes);
    } catch (caught) {
      if (!isTokenError(caught)) failure = errorText(caught);
    }
    await loadProjects();
    if (failure !== null) setError(failure);
    else setViewNonce((n) => n + 1);
    setLoading(false);
  }

  function submitToken(token: string) {
    storeToken(token);
    current.current.tokenBlocked = false;
    setTokenPrompt(null);
    setError(null);
    setLoading(true);
    void loadProjects().then(() => {
      setViewNonce((n) => n + 1);
      setLoading(false);
    });
  }

  const inbox = useInbox(`${approvalPulse} ${lastUpdated?.getTime() ?? 0}`, tokenPrompt !== null);
  const list = projects ?? [];
  const project = list.find((item) => item.id === selected) ?? null;
  const viewData = data.project === selected ? data : emptyData(selected);

  return (
    <div class="app-shell">
      <Sidebar
        projects={list}
        selected={selected}
        live={live}
        inbox={inbox?.projects}
        onSelect={chooseProject}
        onNew={() => setCreating(true)}
        evalsOpen={evalsOpen}
        onEvals={() => pushHash(EVALS_HASH)}
      />
      <main class="workspace">
        <TopBar lastUpdated={lastUpdated} busy={loading || panelLoading} onRefresh={reloadAll}>
          <InboxButton inbox={inbox} onOpen={(item) => pushHash(buildHash(item.project, itemView(item), null))} />
        </TopBar>
        {!tokenPrompt && <ErrorBanner message={error} />}
        {tokenPrompt ? (
          <TokenPrompt invalid={tokenPrompt.invalid} onSubmit={submitToken} />
        ) : creating ? (
          <NewProject onCreated={(id) => void openCreated(id)} onClose={() => setCreating(false)} />
        ) : evalsOpen ? (
          <EvalsPage onOpen={(id) => pushHash(`#/${encodeURIComponent(id)}/team`)} />
        ) : project === null ? (
          <EmptyState connecting={projects === null && loading && error === null} />
        ) : (
          <>
            <Hero project={project} busy={loading} now={now} onAction={runAction} onRequestChanges={(changes) => void runAction({ changes })} />
            <Tabs view={view} onSelect={chooseView} />
            <LivePanel live={liveOutput} />
            <div class="view" id="view-panel" role="tabpanel">
              {view === 'overview' && (
                <Overview
                  key={project.id}
                  project={project}
                  approvalPulse={approvalPulse}
                  onSent={() => void loadProjects()}
                />
              )}
              {view === 'output' && <OutputView key={project.id} project={project} />}
              {view === 'team' && <TeamView key={project.id} project={project} subscribe={subscribeTeam} refresh={viewNonce} />}
              {view === 'team' && <CompareRuns project={project} projects={list} />}
              {view === 'messages' && (
                <MessagesView
                  key={project.id}
                  project={project.id}
                  messages={viewData.messages}
                  loading={panelLoading}
                  now={now}
                />
              )}
              {view === 'history' && (
                <HistoryView
                  key={project.id}
                  project={project.id}
                  agents={project.agents ?? []}
                  now={now}
                  pulse={historyPulse}
                  approvalPulse={approvalPulse}
                />
              )}
              {view === 'activations' && (
                <ActivationsView
                  key={project.id}
                  project={project.id}
                  activations={viewData.activations}
                  loading={panelLoading}
                  now={now}
                />
              )}
              {view === 'tools' && (
                <ToolWorkspace
                  key={project.id}
                  project={project.id}
                  statuses={viewData.toolStatus}
                  entries={viewData.toolUi}
                  loading={panelLoading}
                  agents={project.agents ?? []}
                  toolKey={toolKey}
                  now={now}
                  onSelect={(key) => chooseToolPage(key, 'push')}
                  onNormalize={(key) => chooseToolPage(key, 'replace')}
                />
              )}
              {view === 'events' && (
                <TimelineView
                  key={project.id}
                  project={project.id}
                  agents={(project.agents ?? []).map((agent) => agent.id)}
                  events={viewData.events}
                  loading={panelLoading}
                />
              )}
              {view === 'repository' && <RepositoryView key={project.id} project={project.id} refresh={viewNonce} />}
            </div>
          </>
        )}
      </main>
    </div>
  );
}
