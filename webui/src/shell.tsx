// Shell components of the control room (docs/design/webui.md): sidebar project picker, top bar, error
// banner, empty state, API-token prompt, project hero with lifecycle actions, and the view tabs.
import type { ComponentChildren } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { errorText, getTask, isTokenError, type LifecycleAction, type Project } from './api';
import { ErrorBox, StatusPill } from './components';
import { ReplayForm } from './runs';
import { clockTime, isTruncated, relativeTime, utcTitle } from './format';

export const VIEWS = [
  { id: 'overview', label: 'Overview' },
  { id: 'team', label: 'Team' },
  { id: 'output', label: 'Report + artifacts' },
  { id: 'history', label: 'Agent history' },
  { id: 'messages', label: 'Messages' },
  { id: 'activations', label: 'Activations + context' },
  { id: 'tools', label: 'Tool status' },
  { id: 'events', label: 'Timeline' },
  { id: 'repository', label: 'Repository' },
] as const;

export type ViewId = (typeof VIEWS)[number]['id'];

export function isViewId(value: string): value is ViewId {
  return VIEWS.some((view) => view.id === value);
}

/** live: stream open; polling: no stream wanted; fallback: the stream failed, so the 5 s poll runs. */
export type LiveMode = 'connecting' | 'live' | 'polling' | 'fallback' | 'paused';

function dotTone(status: string): string {
  if (status === 'running') return 'blue';
  if (status === 'completed' || status === 'submitted') return 'green';
  if (status === 'failed' || status === 'stopped') return 'red';
  return 'slate';
}

export function Sidebar(props: {
  projects: Project[];
  selected: string | null;
  live: LiveMode;
  /** What waits for a person, per project (GET /api/inbox). */
  inbox?: Record<string, number>;
  onSelect: (id: string) => void;
  evalsOpen?: boolean;
  onEvals?: () => void;
  onNew?: () => void;
}) {
  return (
    <aside class="sidebar">
      <div class="brand">
        <span class="brand-mark" aria-hidden="true">
          S
        </span>
        <span class="brand-text">
          <span class="brand-name">Suzumio</span>
          <span class="brand-tag">Agent observatory</span>
        </span>
      </div>
      {props.onEvals && (
        <button
          type="button"
          class={`btn btn-secondary sidebar-evals${props.evalsOpen ? ' is-active' : ''}`}
          aria-current={props.evalsOpen ? 'page' : undefined}
          data-testid="nav-evals"
          onClick={props.onEvals}
        >
          Evals
        </button>
      )}
      <div class="sidebar-label">
        <span>Projects</span>
        <span class="sidebar-count" data-testid="project-count">
          {String(props.projects.length)}
        </span>
      </div>
      {props.onNew && (
        <button type="button" class="btn btn-secondary btn-small sidebar-new" data-testid="new-project-open" onClick={props.onNew}>
          New project
        </button>
      )}
      <nav class="project-list" aria-label="Projects">
        {props.projects.map((project) => {
          const active = project.id === props.selected;
          return (
            <button
              type="button"
              key={project.id}
              class={`project-item${active ? ' is-active' : ''}`}
              aria-current={active ? 'true' : undefined}
              data-testid="project-item"
              data-project-id={project.id}
              onClick={() => props.onSelect(project.id)}
            >
              <span class={`status-dot dot-${dotTone(project.status)}`} aria-hidden="true" />
              <span class="project-text">
                <span class="project-name">{project.name}</span>
                <span class="project-id mono">{project.id}</span>
              </span>
              {(props.inbox?.[project.id] ?? 0) > 0 && (
                <span class="project-inbox" data-testid="project-inbox" title="Waiting for you">
                  {String(props.inbox?.[project.id])}
                </span>
              )}
              <StatusPill status={project.status} compact />
            </button>
          );
        })}
      </nav>
      <footer
        class="sidebar-foot"
        data-testid="stream-state"
        data-state={props.live}
        title={props.live === 'fallback' ? 'The live event stream is unavailable; polling instead.' : undefined}
      >
        <span class={`pulse-dot pulse-${props.live}`} aria-hidden="true" />
        <span>{liveText(props.live)}</span>
      </footer>
    </aside>
  );
}

/** Footer text: the live stream when it is open, else the 5-second summary poll. */
function liveText(mode: LiveMode): string {
  switch (mode) {
    case 'live':
      return 'Live event stream';
    case 'paused':
      return 'Updates paused';
    default:
      return 'Summary refresh every 5s';
  }
}

export function TopBar(props: {
  lastUpdated: Date | null;
  busy: boolean;
  onRefresh: () => void;
  children?: ComponentChildren;
}) {
  return (
    <header class="topbar">
      <div>
        <div class="eyebrow">CONTROL ROOM</div>
        <h1 class="topbar-title">Project telemetry</h1>
      </div>
      <div class="topbar-right">
        {props.children}
        <span class="topbar-status" data-testid="last-updated">
          {props.lastUpdated ? `Updated ${clockTime(props.lastUpdated)}` : 'Connecting...'}
        </span>
        <button type="button" class="btn btn-secondary" disabled={props.busy} onClick={props.onRefresh}>
          {props.busy ? 'Refreshing' : 'Refresh'}
        </button>
      </div>
    </header>
  );
}

export function ErrorBanner(props: { message: string | null }) {
  if (!props.message) return null;
  return (
    <div class="error-banner" role="alert" data-testid="error-banner">
      {props.message}
    </div>
  );
}

export function EmptyState(props: { connecting: boolean }) {
  return (
    <section class="empty-state" data-testid="empty-state">
      <div class="empty-graphic" aria-hidden="true">
        <span />
      </div>
      <h2>{props.connecting ? 'Connecting to Suzumio...' : 'No projects initialized'}</h2>
      <p>Create a project from its YAML configuration, then refresh this page.</p>
      <code class="code-chip">suzumio init path/to/project.yaml</code>
    </section>
  );
}

export function TokenPrompt(props: { invalid: boolean; onSubmit: (token: string) => void }) {
  const [value, setValue] = useState('');
  return (
    <section class="empty-state token-prompt" data-testid="token-prompt">
      <h2>API token required</h2>
      <p>
        This server was started with <code>--api-token-env</code> and asks for its API token before it answers
        any request.
      </p>
      <form
        class="token-form"
        onSubmit={(event) => {
          event.preventDefault();
          if (value.trim() !== '') props.onSubmit(value.trim());
        }}
      >
        <div class="field">
          <label for="api-token">API token</label>
          <input
            id="api-token"
            type="password"
            autoComplete="off"
            spellcheck={false}
            value={value}
            onInput={(event) => setValue((event.target as HTMLInputElement).value)}
          />
        </div>
        <ErrorBox message={props.invalid ? 'Invalid API token' : null} testId="token-error" />
        <button type="submit" class="btn btn-primary" disabled={value.trim() === ''}>
          Use token
        </button>
      </form>
    </section>
  );
}

const ACTIONS: Record<string, { label: string; action: LifecycleAction; style: string } | undefined> = {
  initialized: { label: 'Start project', action: 'start', style: 'btn-primary' },
  stopped: { label: 'Start project', action: 'start', style: 'btn-primary' },
  failed: { label: 'Start project', action: 'start', style: 'btn-primary' },
  running: { label: 'Stop', action: 'stop', style: 'btn-danger' },
};

/** A submitted report's two decisions, each confirmed in place: approve it, or send the team back with a text. */
function ReviewActions(props: {
  busy: boolean;
  onApprove: () => void;
  onRequestChanges: (body: string) => void;
}) {
  const [asking, setAsking] = useState<'approve' | 'changes' | null>(null);
  const [body, setBody] = useState('');
  if (asking === 'approve') {
    return (
      <div class="hero-confirm" data-testid="confirm-approve">
        <span>Approve the report and end the project?</span>
        <button type="button" class="btn btn-primary" disabled={props.busy} onClick={() => { setAsking(null); props.onApprove(); }}>
          Confirm approve
        </button>
        <button type="button" class="btn btn-secondary" onClick={() => setAsking(null)}>
          Cancel
        </button>
      </div>
    );
  }
  if (asking === 'changes') {
    return (
      <form
        class="hero-confirm hero-changes"
        data-testid="confirm-changes"
        onSubmit={(event) => {
          event.preventDefault();
          if (body.trim() === '') return;
          setAsking(null);
          props.onRequestChanges(body.trim());
          setBody('');
        }}
      >
        <label for="changes-body">What should the team change?</label>
        <textarea id="changes-body" rows={3} value={body} onInput={(e) => setBody((e.target as HTMLTextAreaElement).value)} />
        <div class="hero-confirm-buttons">
          <button type="submit" class="btn btn-primary" disabled={props.busy || body.trim() === ''}>
            Send back to work
          </button>
          <button type="button" class="btn btn-secondary" onClick={() => setAsking(null)}>
            Cancel
          </button>
        </div>
      </form>
    );
  }
  return (
    <>
      <button type="button" class="btn btn-primary" disabled={props.busy} onClick={() => setAsking('approve')}>
        Approve report
      </button>
      <button type="button" class="btn btn-secondary" disabled={props.busy} onClick={() => setAsking('changes')}>
        Request changes
      </button>
    </>
  );
}

export function Hero(props: {
  project: Project;
  busy: boolean;
  now: number;
  onAction: (action: LifecycleAction) => void;
  onRequestChanges: (body: string) => void;
}) {
  const { project } = props;
  const task = project.task ?? '';
  const [expanded, setExpanded] = useState(false);
  const [fullTask, setFullTask] = useState<string | null>(null);
  const [taskLoading, setTaskLoading] = useState(false);
  const [taskError, setTaskError] = useState<string | null>(null);

  useEffect(() => {
    setExpanded(false);
    setFullTask(null);
    setTaskError(null);
  }, [project.id, task]);

  const [replaying, setReplaying] = useState(false);
  const togglable = task.length > 420 || isTruncated(task);
  const replayable = !['initialized', 'running'].includes(project.status);
  const action = ACTIONS[project.status];

  async function toggleTask() {
    if (expanded) {
      setExpanded(false);
      return;
    }
    if (isTruncated(task) && fullTask === null) {
      setTaskLoading(true);
      setTaskError(null);
      try {
        setFullTask(await getTask(project.id));
        setExpanded(true);
      } catch (caught) {
        if (!isTokenError(caught)) setTaskError(errorText(caught));
      } finally {
        setTaskLoading(false);
      }
      return;
    }
    setExpanded(true);
  }

  const shownTask = expanded && fullTask !== null ? fullTask : task;
  return (
    <section class="hero" data-testid="project-hero">
      <div class="hero-main">
        <div class="hero-meta">
          <StatusPill status={project.status} testId="project-status" />
          <span class="meta-time" title={utcTitle(project.updated_at)}>{`Updated ${relativeTime(project.updated_at, props.now)}`}</span>
        </div>
        <h2 class="hero-title">{project.name}</h2>
        {project.origin && (
          <p class="hero-origin" data-testid="project-origin" data-kind={project.origin.kind}>
            {project.origin.kind === 'fork'
              ? `Fork of ${project.origin.source} after ${project.origin.at ?? ''}`
              : `Replay of ${project.origin.source} (tools ${project.origin.tools ?? 'live'})`}
            {project.origin.diverged &&
              ` · diverged at ${project.origin.diverged.agentId}, request ${project.origin.diverged.requestIndex}`}
          </p>
        )}
        {task !== '' && (
          <div class={`hero-task prewrap${expanded ? ' is-expanded' : ' clamp-4'}`} data-testid="project-task">
            {shownTask}
          </div>
        )}
        {togglable && (
          <button
            type="button"
            class="link-button"
            disabled={taskLoading}
            aria-expanded={expanded ? 'true' : 'false'}
            onClick={toggleTask}
          >
            {taskLoading ? 'Loading full task...' : expanded ? 'Collapse task' : 'Expand full task'}
          </button>
        )}
        <ErrorBox message={taskError} testId="task-error" />
      </div>
      {(project.status === 'submitted' || action || replayable) && (
        <div class="hero-actions">
          {project.status === 'submitted' && (
            <ReviewActions busy={props.busy} onApprove={() => props.onAction('approve')} onRequestChanges={props.onRequestChanges} />
          )}
          {action && (
            <button
              type="button"
              class={`btn ${action.style}`}
              disabled={props.busy}
              onClick={() => props.onAction(action.action)}
            >
              {action.label}
            </button>
          )}
          {replayable &&
            (replaying ? (
              <ReplayForm project={project.id} onCancel={() => setReplaying(false)} />
            ) : (
              <button type="button" class="btn btn-secondary" data-testid="replay-open" onClick={() => setReplaying(true)}>
                Replay
              </button>
            ))}
        </div>
      )}
    </section>
  );
}

export function Tabs(props: { view: ViewId; onSelect: (view: ViewId) => void }) {
  function onKeyDown(event: KeyboardEvent) {
    const index = VIEWS.findIndex((view) => view.id === props.view);
    let next = -1;
    if (event.key === 'ArrowRight') next = (index + 1) % VIEWS.length;
    else if (event.key === 'ArrowLeft') next = (index - 1 + VIEWS.length) % VIEWS.length;
    else if (event.key === 'Home') next = 0;
    else if (event.key === 'End') next = VIEWS.length - 1;
    if (next < 0) return;
    event.preventDefault();
    props.onSelect(VIEWS[next].id);
    const buttons = (event.currentTarget as HTMLElement).querySelectorAll<HTMLButtonElement>('[role="tab"]');
    buttons[next]?.focus();
  }
  return (
    <div class="tabs" role="tablist" aria-label="Project views" onKeyDown={onKeyDown}>
      {VIEWS.map((view) => {
        const active = view.id === props.view;
        return (
          <button
            type="button"
            role="tab"
            key={view.id}
            id={`tab-${view.id}`}
            class={`tab${active ? ' is-active' : ''}`}
            aria-selected={active ? 'true' : 'false'}
            aria-controls="view-panel"
            tabIndex={active ? 0 : -1}
            onClick={() => props.onSelect(view.id)}
          >
            {view.label}
          </button>
        );
      })}
    </div>
  );
}
