// Team view: an SVG swimlane chart of who worked when. One lane per agent (plus `user`),
// time on x; activations are bars coloured by outcome, waits, a report awaiting review and calls
// awaiting approval are drawn in the lane, messages are arrows from the sender's lane to the
// recipient's, and the signals that woke an activation link to its bar. Data comes in time-range pages (GET …/timeline), newest first, and the
// live stream triggers small catch-up pages; only what lies in the visible window is drawn.
import { Component } from 'preact';
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import {
  errorText,
  getActivationContext,
  getHistory,
  getLatestHistory,
  getMessage,
  getTimeline,
  isTokenError,
  listPendingApprovals,
  type ActivationContext,
  type Agent,
  type HistoryRow,
  type Message,
  type Project,
  type TimelineActivation,
  type TimelineSignal,
} from './api';
import { Chip, ErrorBox, Panel, StatusPill } from './components';
import { activationDuration, readUsage } from './format';
import { historyToolName } from './history';
import { ForkButton } from './runs';
import { Folded, stepTitle, toolStep, ToolStepBody } from './steps';
import { commitRangeHash } from './repository';

const LANE_H = 58;
const AXIS_H = 30;
const LABEL_W = 196;
const BAR_H = 24;
const MIN_SPAN_MS = 200;
const MIN_FIT_MS = 300;
const MAX_SPAN_MS = 14 * 86400_000;
const DEFAULT_SPAN_MS = 15 * 60_000;
const CATCH_UP_MS = 150;
/** Room right of the newest item (or now), as a share of the window, for labels and growing bars. */
const EDGE_PAD = 0.08;
/** Catch-up pages start this far before the newest timestamp seen, so a late commit is not missed. */
const CATCH_UP_OVERLAP_MS = 5000;
const BODY_PREVIEW = 320;
const FIRST_PAGE = 400;
/** Beyond these many drawn items the layer switches to summary paths (DenseLayer). */
const DENSE_BARS = 900;
const DENSE_ARROWS = 3000;
const LATER_PAGE = 2000;

/** A stream event the view reacts to (app.tsx forwards every one it receives). */
export interface TeamStreamEvent {
  type: string;
  data: Record<string, unknown>;
}

export type TeamSubscribe = (listener: (event: TeamStreamEvent) => void) => () => void;

interface Bar {
  act: TimelineActivation;
  start: number;
  end: number | null;
  outcome: Outcome;
}

interface Arrow {
  msg: Message;
  at: number;
}

type Outcome = 'completed' | 'failed' | 'running' | 'cancelled-p0' | 'cancelled-stop' | 'cancelled-approve' | 'cancelled';

const OUTCOME_LABEL: Record<Outcome, string> = {
  completed: 'completed',
  failed: 'failed',
  running: 'running',
  'cancelled-p0': 'cancelled by P0',
  'cancelled-stop': 'cancelled by stop',
  'cancelled-approve': 'cancelled by approve',
  cancelled: 'cancelled',
};

function outcomeOf(act: TimelineActivation): Outcome {
  if (act.status === 'completed' || act.status === 'failed' || act.status === 'running') return act.status;
  const reason = act.error ?? '';
  if (reason.startsWith('Interrupted by P0')) return 'cancelled-p0';
  if (reason === 'Project stopped') return 'cancelled-stop';
  if (reason === 'Project approved') return 'cancelled-approve';
  return 'cancelled';
}

// format.ts's clockTime/count build a new formatter per call; thousands of labels per frame need one.
const CLOCK = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
const NUMBER = new Intl.NumberFormat();

function clockTime(value: string | number | undefined): string {
  const t = typeof value === 'number' ? value : ms(value);
  return Number.isFinite(t) ? CLOCK.format(t) : '';
}

function count(value: number | undefined | null): string {
  return NUMBER.format(typeof value === 'number' && Number.isFinite(value) ? value : 0);
}

function ms(iso: string | undefined): number {
  const value = iso ? Date.parse(iso) : NaN;
  return Number.isNaN(value) ? 0 : value;
}

function duration(msValue: number): string {
  if (msValue < 1000) return `${Math.max(0, Math.round(msValue))} ms`;
  const seconds = msValue / 1000;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

function firstLine(text: string | undefined, max = 90): string {
  const line = (text ?? '').trim().split('\n').find((part) => part.trim() !== '') ?? '';
  return line.length > max ? `${line.slice(0, max - 1)}…` : line;
}

/** The first index whose value is >= target (values sorted ascending). */
function lowerBound(values: number[], target: number): number {
  let lo = 0;
  let hi = values.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (values[mid] < target) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

const TICK_STEPS = [0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].map(
  (s) => s * 1000,
);

function ticks(start: number, end: number, width: number): number[] {
  const wanted = Math.max(2, Math.floor(width / 110));
  const step = TICK_STEPS.find((s) => (end - start) / s <= wanted) ?? TICK_STEPS[TICK_STEPS.length - 1];
  const result: number[] = [];
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) result.push(t);
  return result;
}

/** Clock time, with milliseconds when the window is only a few seconds wide. */
function tickLabel(t: number, span: number): string {
  const clock = clockTime(t);
  if (span > 8000) return clock;
  return `${clock.replace(/ ?[AP]M$/, '')}.${String(new Date(t).getMilliseconds()).padStart(3, '0')}`;
}

// ---------------------------------------------------------------------------------------------
// The data set: every page merged by id; derived, sorted arrays rebuilt when it changes.

class TeamData {
  acts = new Map<string, TimelineActivation>();
  msgs = new Map<string, Message>();
  waits = new Map<string, TimelineSignal>();
  approvals = new Map<string, TimelineSignal>();
  newest = 0;

  merge(page: {
    activations: TimelineActivation[];
    messages: Message[];
    waits: TimelineSignal[];
    approvals: TimelineSignal[];
  }): void {
    for (const act of page.activations) {
      const known = this.acts.get(act.id);
      // A running copy from an older request never replaces a finished one.
      if (!known || known.status === 'running' || act.status !== 'running') this.acts.set(act.id, act);
      this.newest = Math.max(this.newest, ms(act.startedAt), ms(act.completedAt));
    }
    for (const msg of page.messages) {
      this.msgs.set(msg.id, msg);
      this.newest = Math.max(this.newest, ms(msg.createdAt));
    }
    for (const wait of page.waits) this.waits.set(wait.id, wait);
    for (const approval of page.approvals) this.approvals.set(approval.id, approval);
  }
}

interface Derived {
  bars: Bar[];
  barsByAgent: Map<string, Bar[]>;
  arrows: Arrow[];
  arrowTimes: number[];
  msgById: Map<string, Message>;
  waits: { wait: TimelineSignal; start: number; end: number | null }[];
  approvals: { approval: TimelineSignal; at: number }[];
  lanes: string[];
  first: number;
  last: number;
}

function derive(data: TeamData, agents: Agent[]): Derived {
  const bars: Bar[] = [...data.acts.values()]
    .map((act) => ({
      act,
      start: ms(act.startedAt),
      end: act.status === 'running' ? null : ms(act.completedAt ?? act.startedAt),
      outcome: outcomeOf(act),
    }))
    .sort((a, b) => a.start - b.start || a.act.id.localeCompare(b.act.id));
  const barsByAgent = new Map<string, Bar[]>();
  for (const bar of bars) {
    const list = barsByAgent.get(bar.act.agentId) ?? [];
    list.push(bar);
    barsByAgent.set(bar.act.agentId, list);
  }
  const arrows = [...data.msgs.values()]
    .map((msg) => ({ msg, at: ms(msg.createdAt) }))
    .sort((a, b) => a.at - b.at || a.msg.id.localeCompare(b.msg.id));
  const lanes = ['user', ...agents.map((agent) => agent.id)];
  const known = new Set(lanes);
  const extra = (id: string | undefined) => {
    if (id && !known.has(id)) {
      known.add(id);
      lanes.push(id);
    }
  };
  for (const bar of bars) extra(bar.act.agentId);
  for (const arrow of arrows) {
    extra(arrow.msg.sender);
    extra(arrow.msg.recipient);
  }
  // A wait lasts until the agent's next activation starts (or, with none yet, until now).
  const waits = [...data.waits.values()].map((wait) => {
    const start = ms(wait.createdAt);
    const agentBars = barsByAgent.get(wait.sourceAgent ?? '') ?? [];
    const next = agentBars.find((bar) => bar.start > start);
    return { wait, start, end: next ? next.start : null };
  });
  const approvals = [...data.approvals.values()].map((approval) => ({ approval, at: ms(approval.createdAt) }));
  const first = Math.min(bars[0]?.start ?? Infinity, arrows[0]?.at ?? Infinity);
  const last = data.newest;
  return {
    bars,
    barsByAgent,
    arrows,
    arrowTimes: arrows.map((arrow) => arrow.at),
    msgById: data.msgs,
    waits,
    approvals,
    lanes,
    first: Number.isFinite(first) ? first : last,
    last,
  };
}

// ---------------------------------------------------------------------------------------------

type Selection = { kind: 'activation'; id: string } | { kind: 'message'; id: string } | null;

/** `refresh` changes when the user asks for fresh data (Refresh, lifecycle actions): pages reload and merge. */
export function TeamView(props: { project: Project; subscribe: TeamSubscribe; refresh: number }) {
  const project = props.project.id;
  const agents = props.project.agents ?? [];
  const data = useRef(new TeamData());
  const [version, setVersion] = useState(0);
  const [loading, setLoading] = useState(true);
  const [error, setError] = useState<string | null>(null);
  const [complete, setComplete] = useState(false);
  const [view, setView] = useState<{ start: number; end: number } | null>(null);
  const [follow, setFollow] = useState(true);
  const [now, setNow] = useState(() => Date.now());
  const [width, setWidth] = useState(900);
  const [hover, setHover] = useState<{ text: string[]; x: number; y: number } | null>(null);
  const [selection, setSelection] = useState<Selection>(null);
  const [focusId, setFocusId] = useState<string | null>(null);
  const [streamText, setStreamText] = useState<Record<string, string>>({});
  const chartRef = useRef<HTMLDivElement>(null);
  const baseRef = useRef<{ start: number; span: number; width: number } | null>(null);
  const handlers = useRef<LayerHandlers | null>(null);
  const drag = useRef<{ x: number; start: number; end: number; captured: boolean } | null>(null);
  const catchUp = useRef<number | undefined>(undefined);
  const latestTimers = useRef(new Map<string, number>());
  const alive = useRef(true);
  // Tool calls waiting for a person's decision: `agentId\0createdAt\0tool\0id`, joined by \u0001.
  const [calls, setCalls] = useState('');
  const callsNonce = useRef(0);

  function loadCalls() {
    const request = ++callsNonce.current;
    listPendingApprovals(project).then(
      (rows) => {
        if (!alive.current || request !== callsNonce.current) return;
        const pending = rows.filter((row) => row.status === 'pending');
        setCalls(pending.map((row) => [row.agentId, row.createdAt, row.tool, row.id].join('\u0000')).join('\u0001'));
      },
      (caught) => {
        if (alive.current && !isTokenError(caught)) setError(errorText(caught));
      },
    );
  }
  useEffect(loadCalls, [project, props.refresh]);

  const derived = useMemo(() => derive(data.current, agents), [version, agents.map((a) => a.id).join(' ')]);
  const running = derived.bars.some((bar) => bar.end === null);

  // First page (the newest), then older pages in the background until the beginning.
  useEffect(() => {
    alive.current = true;
    let until: string | undefined;
    const load = async () => {
      try {
        for (;;) {
          // A small first page draws the newest work quickly; larger ones fill in the past.
          const page = await getTimeline(project, { until, limit: until === undefined ? FIRST_PAGE : LATER_PAGE });
          if (!alive.current) return;
          data.current.merge(page);
          setVersion((v) => v + 1);
          setLoading(false);
          setError(null);
          if (!page.more || !page.since) break;
          until = page.since;
        }
        setComplete(true);
      } catch (caught) {
        if (alive.current && !isTokenError(caught)) setError(errorText(caught));
        setLoading(false);
      }
    };
    void load();
    return () => {
      alive.current = false;
      window.clearTimeout(catchUp.current);
      for (const timer of latestTimers.current.values()) window.clearTimeout(timer);
      latestTimers.current.clear();
    };
  }, [project, props.refresh]);

  // Live: every stream event schedules one catch-up page from just before the newest item seen.
  useEffect(() => {
    const runCatchUp = async () => {
      catchUp.current = undefined;
      const newest = data.current.newest;
      const since = newest > 0 ? new Date(newest - CATCH_UP_OVERLAP_MS).toISOString() : undefined;
      try {
        const page = await getTimeline(project, { since });
        if (!alive.current) return;
        data.current.merge(page);
        setVersion((v) => v + 1);
      } catch (caught) {
        if (alive.current && !isTokenError(caught)) setError(errorText(caught));
      }
    };
    return props.subscribe((event) => {
      if (event.type.startsWith('approval.') || event.type === 'project.status') loadCalls();
      // A running agent's newest history row becomes its bar's text (events carry no content).
      if (event.type === 'agent_history.message' && event.data.role === 'assistant') {
        const agentId = typeof event.data.agentId === 'string' ? event.data.agentId : null;
        if (agentId && !latestTimers.current.has(agentId)) {
          latestTimers.current.set(
            agentId,
            window.setTimeout(() => {
              latestTimers.current.delete(agentId);
              getLatestHistory(project, agentId)
                .then((page) => {
                  const row = page.messages[0];
                  const activationId = row?.activationId;
                  if (alive.current && activationId && row.content) {
                    setStreamText((old) => ({ ...old, [activationId]: firstLine(row.content, 120) }));
                  }
                })
                .catch((caught) => {
                  if (alive.current && !isTokenError(caught)) setError(errorText(caught));
                });
            }, CATCH_UP_MS),
          );
        }
      }
      const relevant =
        event.type.startsWith('activation.') ||
        event.type === 'message.created' ||
        event.type === 'signal.created' ||
        event.type === 'project.submitted' ||
        event.type === 'project.status';
      if (relevant && catchUp.current === undefined) {
        catchUp.current = window.setTimeout(() => void runCatchUp(), CATCH_UP_MS);
      }
    });
  }, [project, props.subscribe]);

  // Width of the drawing area follows the panel.
  useEffect(() => {
    const element = chartRef.current;
    if (!element) return;
    const measure = () => setWidth(Math.max(320, element.clientWidth - LABEL_W));
    measure();
    const observer = new ResizeObserver(measure);
    observer.observe(element);
    return () => observer.disconnect();
  }, [loading]);

  // "Follow now": the window's right edge tracks the clock while something runs.
  // Running bars grow with the clock, followed or not.
  useEffect(() => {
    if (!follow && !running) return;
    const timer = window.setInterval(() => setNow(Date.now()), 1000);
    return () => window.clearInterval(timer);
  }, [follow, running]);

  // The whole run when it is shorter than the default span, else its newest part; padded both sides.
  const fitWindow = () => {
    const last = Math.max(derived.last, running ? Date.now() : 0);
    const span = Math.min(DEFAULT_SPAN_MS, Math.max(MIN_FIT_MS, (last - derived.first) * 1.16));
    return { start: last + span * EDGE_PAD - span, end: last + span * EDGE_PAD };
  };

  let shown = view ?? fitWindow();
  if (follow) {
    const span = shown.end - shown.start;
    const edge = Math.max(running ? now : 0, derived.last);
    shown = { start: edge + span * EDGE_PAD - span, end: edge + span * EDGE_PAD };
  }
  const { start, end } = shown;
  const span = end - start;
  const xOf = (t: number) => ((t - start) / span) * width;
  const tOf = (x: number) => start + (x / width) * span;
  const laneIndex = new Map(derived.lanes.map((id, index) => [id, index]));
  const height = AXIS_H + derived.lanes.length * LANE_H + 8;
  const nowMs = running ? now : Math.max(now, derived.last);

  function setWindow(next: { start: number; end: number }, keepFollow = false) {
    let s = next.end - next.start;
    s = Math.min(MAX_SPAN_MS, Math.max(MIN_SPAN_MS, s));
    const mid = (next.start + next.end) / 2;
    setView({ start: mid - s / 2, end: mid + s / 2 });
    if (!keepFollow) setFollow(false);
  }

  function zoom(factor: number, anchorX = width / 2) {
    const anchor = tOf(anchorX);
    const s = Math.min(MAX_SPAN_MS, Math.max(MIN_SPAN_MS, span * factor));
    const ratio = anchorX / width;
    // While following, the right edge stays on the present and only the span changes.
    if (follow) setView({ start: end - s, end });
    else setView({ start: anchor - s * ratio, end: anchor + s * (1 - ratio) });
  }

  function pan(deltaX: number) {
    const shift = (deltaX / width) * span;
    setWindow({ start: start + shift, end: end + shift });
  }

  function onWheel(event: WheelEvent) {
    event.preventDefault();
    if (event.shiftKey || Math.abs(event.deltaX) > Math.abs(event.deltaY)) {
      pan(event.deltaX || event.deltaY);
      return;
    }
    const rect = (event.currentTarget as SVGElement).getBoundingClientRect();
    zoom(Math.exp(event.deltaY * 0.0015), event.clientX - rect.left);
  }

  function onPointerDown(event: PointerEvent) {
    if (event.button !== 0) return;
    drag.current = { x: event.clientX, start, end, captured: false };
  }

  function onPointerMove(event: PointerEvent) {
    const held = drag.current;
    if (!held) return;
    const dx = event.clientX - held.x;
    if (Math.abs(dx) < 3 && !held.captured) return;
    // Capture only once it is a drag, so a plain click still reaches the bar or arrow under it.
    if (!held.captured) {
      held.captured = true;
      try {
        (event.currentTarget as Element).setPointerCapture(event.pointerId);
      } catch {
        // A synthetic or already-released pointer cannot be captured; the drag still works.
      }
    }
    const shift = (-dx / width) * (held.end - held.start);
    setFollow(false);
    setView({ start: held.start + shift, end: held.end + shift });
    setHover(null);
  }

  function onPointerUp() {
    drag.current = null;
  }

  // Drawing happens in a base frame: items are placed for `base` and the layer is shifted while
  // panning, so a pan frame changes one transform; the layer is redrawn (three windows wide) on zoom,
  // new data, or once the pan leaves the drawn range.
  let base = baseRef.current;
  if (!base || base.span !== span || base.width !== width || Math.abs(start - base.start) > span * 0.9) {
    base = { start, span, width };
    baseRef.current = base;
  }
  const shift = ((base.start - start) / span) * width;
  const selectedId = selection?.id ?? null;
  const woke = selection?.kind === 'activation'
    ? (data.current.acts.get(selection.id)?.signals ?? []).map((signal) => signal.messageId ?? '').join(' ')
    : '';
  handlers.current = {
    hover: (event, kind, id) => {
      if (kind === 'activation') {
        const bar = derived.bars.find((candidate) => candidate.act.id === id);
        if (bar) showHover(event, barText(bar));
        if (event.type === 'focus') setFocusId(id);
      } else {
        const arrow = derived.arrows.find((candidate) => candidate.msg.id === id);
        if (arrow) showHover(event, arrowText(arrow));
      }
    },
    leave: () => setHover(null),
    select: (kind, id) => setSelection({ kind, id }),
    key: (event, id) => {
      const bar = derived.bars.find((candidate) => candidate.act.id === id);
      if (bar) onBarKey(event, bar);
    },
  };

  function showHover(event: MouseEvent | FocusEvent, text: string[]) {
    const host = chartRef.current?.getBoundingClientRect();
    const target = (event.currentTarget as Element).getBoundingClientRect();
    if (!host) return;
    const x = 'clientX' in event ? event.clientX - host.left : target.left - host.left + target.width / 2;
    const y = 'clientY' in event ? event.clientY - host.top : target.top - host.top;
    setHover({ text, x, y });
  }

  function barText(bar: Bar): string[] {
    const { act } = bar;
    const usage = readUsage(act);
    const endAt = bar.end ?? nowMs;
    const lines = [
      `${act.agentId} · ${OUTCOME_LABEL[bar.outcome]} · ${act.id}`,
      `${clockTime(bar.start)} → ${bar.end === null ? 'now' : clockTime(bar.end)} (${duration(endAt - bar.start)})`,
    ];
    if (usage?.total) lines.push(`${count(usage.total)} tokens (in ${count(usage.input)}, out ${count(usage.output)})`);
    const woke = act.signals ?? [];
    if (woke.length) lines.push(`woken by ${woke.map((s) => `${s.priority} ${s.sourceAgent ?? 'user'}`).join(', ')}`);
    const summary = bar.end === null ? streamText[act.id] ?? act.text : act.error ?? act.text;
    if (summary) lines.push(firstLine(summary, 160));
    return lines;
  }

  function arrowText(arrow: Arrow): string[] {
    const { msg } = arrow;
    return [
      `${msg.sender} → ${msg.recipient ?? msg.channel ?? 'broadcast'} · ${msg.priority} · ${clockTime(arrow.at)}`,
      (msg.body.length > BODY_PREVIEW ? `${msg.body.slice(0, BODY_PREVIEW)}…` : msg.body).trim(),
    ];
  }

  // Keyboard: arrows move focus between bars (left/right in time, up/down between lanes).
  function onBarKey(event: KeyboardEvent, bar: Bar) {
    const lane = laneIndex.get(bar.act.agentId) ?? 0;
    let target: Bar | undefined;
    if (event.key === 'ArrowRight' || event.key === 'ArrowLeft') {
      const list = derived.barsByAgent.get(bar.act.agentId) ?? [];
      const index = list.indexOf(bar);
      target = list[index + (event.key === 'ArrowRight' ? 1 : -1)];
    } else if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
      const step = event.key === 'ArrowDown' ? 1 : -1;
      for (let next = lane + step; next >= 0 && next < derived.lanes.length && !target; next += step) {
        const list = derived.barsByAgent.get(derived.lanes[next]) ?? [];
        target = list.reduce<Bar | undefined>(
          (best, candidate) =>
            !best || Math.abs(candidate.start - bar.start) < Math.abs(best.start - bar.start) ? candidate : best,
          undefined,
        );
      }
    } else if (event.key === 'Enter' || event.key === ' ') {
      event.preventDefault();
      setSelection({ kind: 'activation', id: bar.act.id });
      return;
    } else if (event.key === '+' || event.key === '=') {
      zoom(0.5, xOf(bar.start));
      return;
    } else if (event.key === '-') {
      zoom(2, xOf(bar.start));
      return;
    }
    if (!target) return;
    event.preventDefault();
    const id = target.act.id;
    const targetEnd = target.end ?? nowMs;
    if (target.start > end || targetEnd < start) {
      const half = span / 2;
      setWindow({ start: target.start - half, end: target.start + half });
    }
    window.requestAnimationFrame(() =>
      chartRef.current?.querySelector<SVGElement>(`[data-activation-id="${CSS.escape(id)}"]`)?.focus(),
    );
  }

  const agentById = new Map(agents.map((agent) => [agent.id, agent]));
  const totalTokens = derived.bars.reduce((sum, bar) => sum + (readUsage(bar.act)?.total ?? 0), 0);
  const agentArrows = derived.arrows.filter(
    (a) => a.msg.recipient && a.msg.sender !== 'user' && a.msg.recipient !== 'user',
  ).length;

  return (
    <div class="stack">
      <Panel
        title="Team"
        className="team-panel"
        testId="team-panel"
        busy={loading}
        subtitle={
          loading
            ? 'Loading...'
            : `${count(derived.bars.length)} activations · ${count(derived.arrows.length)} messages (${count(
                agentArrows,
              )} between agents)${totalTokens ? ` · ${count(totalTokens)} tokens` : ''}${complete ? '' : ' · loading older'}`
        }
        actions={
          <div class="team-toolbar" role="toolbar" aria-label="Time axis">
            <button type="button" class="btn btn-secondary btn-small" onClick={() => zoom(0.5)} aria-label="Zoom in">
              +
            </button>
            <button type="button" class="btn btn-secondary btn-small" onClick={() => zoom(2)} aria-label="Zoom out">
              −
            </button>
            <button type="button" class="btn btn-secondary btn-small" onClick={() => pan(-width / 3)} aria-label="Earlier">
              ◀
            </button>
            <button type="button" class="btn btn-secondary btn-small" onClick={() => pan(width / 3)} aria-label="Later">
              ▶
            </button>
            <button
              type="button"
              class="btn btn-secondary btn-small"
              onClick={() => {
                const last = Math.max(derived.last, running ? Date.now() : 0);
                const s = Math.max(MIN_SPAN_MS, last - derived.first);
                setWindow({ start: derived.first - s * 0.03, end: last + s * 0.03 });
              }}
            >
              Fit all
            </button>
            <button
              type="button"
              class={`btn btn-small ${follow ? 'btn-primary' : 'btn-secondary'}`}
              aria-pressed={follow ? 'true' : 'false'}
              data-testid="team-follow"
              onClick={() => {
                if (!follow) setNow(Date.now());
                setFollow(!follow);
              }}
            >
              Follow now
            </button>
          </div>
        }
      >
        <Legend />
        <div
          class="team-chart"
          ref={chartRef}
          data-testid="team-chart"
          data-window-start={new Date(start).toISOString()}
          data-window-end={new Date(end).toISOString()}
          data-complete={complete ? 'true' : 'false'}
        >
          <div class="team-labels" style={{ height: `${height}px` }}>
            <div class="team-labels-head" style={{ height: `${AXIS_H}px` }}>
              Agent
            </div>
            {derived.lanes.map((id) => {
              const agent = agentById.get(id);
              return (
                <div
                  class={`team-lane-label${agent ? '' : ' is-user'}`}
                  key={id}
                  data-testid="team-lane"
                  data-agent={id}
                  style={{ height: `${LANE_H}px` }}
                >
                  <span class="team-lane-name">{agent ? agent.displayName || agent.id : id}</span>
                  <span class="team-lane-meta">
                    {agent ? (
                      <>
                        <span class="team-lane-role">{agent.role ? `${agent.role} · ${agent.id}` : agent.id}</span>
                        <StatusPill status={agent.status} compact />
                      </>
                    ) : (
                      <span class="team-lane-role">{id === 'user' ? 'you, via API or WebUI' : 'sender'}</span>
                    )}
                  </span>
                </div>
              );
            })}
          </div>
          <svg
            class="team-svg"
            width={width}
            height={height}
            viewBox={`0 0 ${width} ${height}`}
            role="group"
            aria-label={`Team swimlanes from ${clockTime(start)} to ${clockTime(end)}`}
            onWheel={onWheel}
            onPointerDown={onPointerDown}
            onPointerMove={onPointerMove}
            onPointerUp={onPointerUp}
            onPointerCancel={onPointerUp}
            onMouseLeave={() => setHover(null)}
          >
            <defs>
              {['P0', 'P1', 'P2', 'P3'].map((p) => (
                <marker
                  id={`team-head-${p}`}
                  key={p}
                  class={`team-head prio-${p}`}
                  viewBox="0 0 10 10"
                  refX="9"
                  refY="5"
                  markerWidth="7"
                  markerHeight="7"
                  orient="auto-start-reverse"
                >
                  <path d="M 0 0 L 10 5 L 0 10 z" />
                </marker>
              ))}
              <pattern id="team-hatch" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(-45)">
                <rect width="8" height="8" class="team-hatch-bg" />
                <rect width="3" height="8" class="team-hatch" />
              </pattern>
              <pattern id="team-stripes" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
                <rect width="4" height="8" class="team-stripe" />
              </pattern>
            </defs>
            {derived.lanes.map((id, index) => (
              <rect
                key={`lane-${id}`}
                class={`team-lane-bg${index % 2 ? ' is-odd' : ''}`}
                x={0}
                y={AXIS_H + index * LANE_H}
                width={width}
                height={LANE_H}
              />
            ))}
            <g class="team-layer" transform={`translate(${shift.toFixed(2)} 0)`}>
              <TeamLayer
                derived={derived}
                baseStart={base.start}
                span={span}
                width={width}
                height={height}
                nowMs={running ? now : Number.POSITIVE_INFINITY}
                submitted={props.project.status === 'submitted'}
                calls={calls}
                selectedId={selectedId}
                focusId={focusId}
                woke={woke}
                streamText={streamText}
                names={agents.map((agent) => `${agent.id}\u0000${agent.displayName ?? ''}`).join('\u0001')}
                handlers={handlers}
              />
            </g>
          </svg>
          {hover && (
            <div
              class="team-tooltip"
              role="tooltip"
              data-testid="team-tooltip"
              style={{
                left: `${Math.min(hover.x + 14, (chartRef.current?.clientWidth ?? 900) - 340)}px`,
                // Below the pointer in the upper half, above it in the lower half: the chart clips.
                ...(hover.y < height / 2 ? { top: `${hover.y + 16}px` } : { bottom: `${height - hover.y + 12}px` }),
              }}
            >
              {hover.text.map((line, index) => (
                <div class={index === 0 ? 'team-tooltip-head' : 'team-tooltip-line'} key={index}>
                  {line}
                </div>
              ))}
            </div>
          )}
        </div>
        {(derived.bars.filter((bar) => bar.start <= base.start + 2 * span && (bar.end ?? nowMs) >= base.start - span)
          .length > DENSE_BARS ||
          lowerBound(derived.arrowTimes, base.start + 2 * span + 1) - lowerBound(derived.arrowTimes, base.start - span) >
            DENSE_ARROWS) && (
          <p class="team-hint team-dense-hint" data-testid="team-dense-hint">
            Zoomed out: activations and messages are summarised. Zoom in to inspect them one by one.
          </p>
        )}
        <p class="team-hint">
          Scroll to zoom, drag or Shift+scroll to pan. Tab to a bar, then use the arrow keys to move between bars and
          Enter to open it.
        </p>
        <ErrorBox message={error} testId="team-error" />
      </Panel>
      {selection && (
        <TeamDetail
          key={`${selection.kind}-${selection.id}`}
          project={project}
          selection={selection}
          activation={selection.kind === 'activation' ? data.current.acts.get(selection.id) ?? null : null}
          message={selection.kind === 'message' ? data.current.msgs.get(selection.id) ?? null : null}
          messages={data.current.msgs}
          onSelect={setSelection}
          onClose={() => setSelection(null)}
        />
      )}
    </div>
  );
}

// ---------------------------------------------------------------------------------------------
// The drawn items, placed in the base frame and three windows wide. A class so that a pan frame,
// a hover or a tooltip move (new props equal to the old ones) skips the whole subtree.

type LayerHandlers = {
  hover: (event: MouseEvent | FocusEvent, kind: 'activation' | 'message', id: string) => void;
  leave: () => void;
  select: (kind: 'activation' | 'message', id: string) => void;
  key: (event: KeyboardEvent, id: string) => void;
};

interface LayerProps {
  derived: Derived;
  baseStart: number;
  span: number;
  width: number;
  height: number;
  /** The clock for running bars; +Infinity when nothing runs (open waits then reach the edge). */
  nowMs: number;
  submitted: boolean;
  /** Pending approval requests, encoded as TeamView keeps them. */
  calls: string;
  selectedId: string | null;
  focusId: string | null;
  woke: string;
  streamText: Record<string, string>;
  names: string;
  handlers: { current: LayerHandlers | null };
}

class TeamLayer extends Component<LayerProps> {
  shouldComponentUpdate(next: LayerProps): boolean {
    const old = this.props as unknown as Record<string, unknown>;
    const fresh = next as unknown as Record<string, unknown>;
    return Object.keys(fresh).some((key) => old[key] !== fresh[key]);
  }

  render() {
    const props = this.props;
    const { derived, span, width, height, nowMs, selectedId, streamText } = props;
    const h = () => props.handlers.current!;
    const start = props.baseStart - span;
    const end = props.baseStart + 2 * span;
    const xOf = (t: number) => ((t - props.baseStart) / span) * width;
    const laneIndex = new Map(derived.lanes.map((id, index) => [id, index]));
    const laneMid = (id: string) => AXIS_H + (laneIndex.get(id) ?? 0) * LANE_H + LANE_H / 2;
    const agentById = new Map(
      props.names.split('\u0001').filter(Boolean).map((entry) => {
        const [id, displayName] = entry.split('\u0000');
        return [id, { displayName: displayName || id }];
      }),
    );
    const woke = new Set(props.woke.split(' ').filter(Boolean));
    const visibleBars = derived.bars.filter((bar) => bar.start <= end && (bar.end ?? nowMs) >= start);
    const visibleArrows = derived.arrows.slice(
      lowerBound(derived.arrowTimes, start),
      lowerBound(derived.arrowTimes, end + 1),
    );
    const visibleWaits = derived.waits.filter((w) => w.start <= end && (w.end ?? nowMs) >= start);
    const visibleApprovals = derived.approvals.filter((a) => a.at >= start && a.at <= end);
    const waitingCalls = props.calls
      .split('\u0001')
      .filter(Boolean)
      .map((entry) => {
        const [agentId, createdAt, tool, id] = entry.split('\u0000');
        return { agentId, at: ms(createdAt), tool, id };
      })
      .filter((call) => call.at <= end);
    // One bar is in the Tab order (roving tabindex): the last focused one, else the newest one
    // that starts before the base window's right edge; arrow keys move between the others.
    const tabId = visibleBars.some((bar) => bar.act.id === props.focusId)
      ? props.focusId
      : [...visibleBars].reverse().find((bar) => bar.start <= props.baseStart + span)?.act.id ??
        visibleBars[0]?.act.id;
    if (visibleBars.length > DENSE_BARS || visibleArrows.length > DENSE_ARROWS) {
      return (
        <DenseLayer
          bars={visibleBars}
          arrows={visibleArrows}
          xOf={xOf}
          laneMid={laneMid}
          width={width}
          nowMs={nowMs}
          ticks={ticks(start, end, width * 3).map((t) => (
            <g key={t}>
              <line class="team-grid" x1={xOf(t)} x2={xOf(t)} y1={AXIS_H - 6} y2={height} />
              <text class="team-tick" x={xOf(t) + 4} y={AXIS_H - 11}>
                {tickLabel(t, span)}
              </text>
            </g>
          ))}
        />
      );
    }
    return (
      <g>
      <g class="team-axis" aria-hidden="true">
        {ticks(start, end, width * 3).map((t) => (
          <g key={t}>
            <line class="team-grid" x1={xOf(t)} x2={xOf(t)} y1={AXIS_H - 6} y2={height} />
            <text class="team-tick" x={xOf(t) + 4} y={AXIS_H - 11}>
              {tickLabel(t, span)}
            </text>
          </g>
        ))}
        {Number.isFinite(nowMs) && nowMs >= start && nowMs <= end && (
          <line class="team-now" x1={xOf(nowMs)} x2={xOf(nowMs)} y1={AXIS_H - 6} y2={height} />
        )}
      </g>
      <g class="team-waits">
        {visibleWaits.map(({ wait, start: s, end: e }) => {
          const lane = wait.sourceAgent ?? '';
          const x1 = Math.max(-width - 4, xOf(s));
          const x2 = Math.min(2 * width + 4, xOf(e ?? nowMs));
          const y = laneMid(lane);
          return (
            <g key={wait.id} class="team-wait" data-agent={lane} data-wait-id={wait.id}>
              <title>{`${lane} waiting for a signal from ${clockTime(s)}${wait.reason ? `: ${wait.reason}` : ''}`}</title>
              <line x1={x1} x2={x2} y1={y} y2={y} />
              {x2 - x1 > 70 && (
                <text x={x1 + 6} y={y - 6} class="team-wait-label">
                  waiting
                </text>
              )}
            </g>
          );
        })}
        {visibleApprovals.map(({ approval, at }) => {
          const lane = approval.sourceAgent ?? '';
          const x = xOf(at);
          const y = laneMid(lane);
          const pending = props.submitted;
          return (
            <g key={approval.id} class="team-approval" data-agent={lane}>
              <title>{`${lane} submitted the report at ${clockTime(at)}${pending ? '; report awaiting review' : ''}`}</title>
              {pending && <rect class="team-approval-span" x={x} y={y - 9} width={Math.max(0, Math.min(2 * width, xOf(nowMs)) - x)} height={18} />}
              <path class="team-approval-mark" d={`M ${x} ${y - 8} L ${x + 8} ${y} L ${x} ${y + 8} L ${x - 8} ${y} z`} />
              {pending && (
                <text
                  class="team-wait-label"
                  x={x > width - 120 ? x - 12 : x + 12}
                  y={y + 22}
                  text-anchor={x > width - 120 ? 'end' : 'start'}
                >
                  report awaiting review
                </text>
              )}
            </g>
          );
        })}
      </g>
      <g class="team-bars">
        {visibleBars.map((bar) => {
          const lane = bar.act.agentId;
          const x1 = xOf(bar.start);
          const x2 = xOf(bar.end ?? nowMs);
          const drawnX = Math.max(-width - 2, x1);
          const drawnW = Math.max(3, Math.min(2 * width + 2, x2) - drawnX);
          const y = laneMid(lane) - BAR_H / 2;
          const usage = readUsage(bar.act);
          const label = `${agentById.get(lane)?.displayName ?? lane}: activation ${OUTCOME_LABEL[bar.outcome]}, ${clockTime(
            bar.start,
          )} for ${duration((bar.end ?? nowMs) - bar.start)}${usage?.total ? `, ${count(usage.total)} tokens` : ''}`;
          const inner = bar.end === null ? streamText[bar.act.id] ?? 'running' : usage?.total ? `${count(usage.total)} tok` : '';
          return (
            <g
              key={bar.act.id}
              class={`team-bar outcome-${bar.outcome}${selectedId === bar.act.id ? ' is-selected' : ''}`}
              data-testid="team-bar"
              data-agent={lane}
              data-activation-id={bar.act.id}
              data-status={bar.act.status}
              data-outcome={bar.outcome}
              tabIndex={bar.act.id === tabId ? 0 : -1}
              role="button"
              aria-label={label}
              onMouseEnter={(event) => h().hover(event, 'activation', bar.act.id)}
              onMouseMove={(event) => h().hover(event, 'activation', bar.act.id)}
              onMouseLeave={() => h().leave()}
              onFocus={(event) => h().hover(event, 'activation', bar.act.id)}
              onBlur={() => h().leave()}
              onClick={() => h().select('activation', bar.act.id)}
              onKeyDown={(event) => h().key(event, bar.act.id)}
            >
              <title>{label}</title>
              <rect class="team-bar-rect" x={drawnX} y={y} width={drawnW} height={BAR_H} rx={5} />
              {bar.end === null && (
                <rect class="team-bar-stripes" x={drawnX} y={y} width={drawnW} height={BAR_H} rx={5} fill="url(#team-stripes)" />
              )}
              {drawnW > 56 && inner && (
                <text class="team-bar-text" x={drawnX + 7} y={y + BAR_H / 2 + 4}>
                  {inner.length > drawnW / 6.5 ? `${inner.slice(0, Math.max(1, Math.floor(drawnW / 6.5) - 1))}…` : inner}
                </text>
              )}
            </g>
          );
        })}
      </g>
      <g class="team-calls">
        {waitingCalls.map((call) => {
          const x1 = Math.max(-width - 4, xOf(call.at));
          const x2 = Math.min(2 * width + 4, Number.isFinite(nowMs) ? xOf(nowMs) : 2 * width + 4);
          const y = laneMid(call.agentId) - BAR_H / 2 - 2;
          const text = `${call.agentId}: ${call.tool} waiting for you since ${clockTime(call.at)} (call awaiting approval)`;
          return (
            <g key={call.id} class="team-call" data-testid="team-call-waiting" data-agent={call.agentId} data-approval-id={call.id}>
              <title>{text}</title>
              <rect class="team-call-rect" x={x1} y={y} width={Math.max(6, x2 - x1)} height={BAR_H + 4} rx={5} fill="url(#team-hatch)" />
              <text class="team-call-label" x={x1 + 6} y={y - 4}>
                {`waiting for you · ${call.tool}`}
              </text>
            </g>
          );
        })}
      </g>
      <g class="team-links" aria-hidden="true">
        {visibleBars.flatMap((bar) =>
          (bar.act.signals ?? [])
            .filter((signal) => signal.messageId && derived.msgById.has(signal.messageId))
            .map((signal) => {
              const msg = derived.msgById.get(signal.messageId!)!;
              const x1 = xOf(ms(msg.createdAt));
              const x2 = xOf(bar.start);
              const y = laneMid(bar.act.agentId) + BAR_H / 2 + 5;
              return (
                <path
                  key={`${bar.act.id}-${signal.id}`}
                  class={`team-link${selectedId === bar.act.id || selectedId === msg.id ? ' is-active' : ''}`}
                  data-activation-id={bar.act.id}
                  data-message-id={msg.id}
                  d={`M ${x1} ${y - 3} L ${x1} ${y} L ${Math.max(x1, x2)} ${y} L ${Math.max(x1, x2)} ${y - 3}`}
                />
              );
            }),
        )}
      </g>
      <g class="team-arrows">
        {visibleArrows.map((arrow) => {
          const { msg } = arrow;
          const target = msg.recipient;
          const x = xOf(arrow.at);
          const y1 = laneMid(msg.sender);
          const prio = ['P0', 'P1', 'P2', 'P3'].includes(msg.priority) ? msg.priority : 'P3';
          const label = `Message ${msg.priority} from ${msg.sender} to ${target ?? msg.channel ?? 'broadcast'} at ${clockTime(
            arrow.at,
          )}: ${firstLine(msg.body, 140)}`;
          const common = {
            'data-testid': 'team-arrow',
            'data-message-id': msg.id,
            'data-agent': msg.sender,
            'data-recipient': target ?? '',
            'data-priority': msg.priority,
            tabIndex: -1,
            'aria-label': label,
            onMouseEnter: (event: MouseEvent) => h().hover(event, 'message', msg.id),
            onMouseMove: (event: MouseEvent) => h().hover(event, 'message', msg.id),
            onMouseLeave: () => h().leave(),
            onClick: () => h().select('message', msg.id),
          };
          const cls = `team-arrow prio-${prio}${selectedId === msg.id || woke.has(msg.id) ? ' is-active' : ''}`;
          if (!target) {
            return (
              <g key={msg.id} class={cls} {...common}>
                <title>{label}</title>
                <circle cx={x} cy={y1} r={5} />
              </g>
            );
          }
          const y2 = laneMid(target);
          const toward = y2 >= y1 ? 1 : -1;
          const from = y1 + toward * 8;
          const to = y2 - toward * 9;
          const bend = Math.min(26, Math.abs(to - from) / 4);
          const d =
            target === msg.sender
              ? `M ${x} ${y1 - 8} c 18 -18 18 18 0 16`
              : `M ${x} ${from} C ${x + bend} ${from + (to - from) / 3} ${x + bend} ${from + (2 * (to - from)) / 3} ${x} ${to}`;
          return (
            <g key={msg.id} class={cls} {...common}>
              <title>{label}</title>
              <path class="team-arrow-hit" d={d} />
              <path class="team-arrow-line" d={d} marker-end={`url(#team-head-${prio})`} />
              <circle class="team-arrow-dot" cx={x} cy={from} r={2.5} />
            </g>
          );
        })}
      </g>
      </g>
    );
  }
}

/**
 * Zoomed far out, one element per item would cost seconds per redraw and raster: bars become one
 * path per outcome, messages a per-lane arrival histogram, and the chart says so (zoom in to
 * inspect items one by one).
 */
function DenseLayer(props: {
  bars: Bar[];
  arrows: Arrow[];
  xOf: (t: number) => number;
  laneMid: (id: string) => number;
  width: number;
  nowMs: number;
  ticks: preact.JSX.Element[];
}) {
  const { xOf, laneMid, width } = props;
  const bars: Record<string, string[]> = {};
  for (const bar of props.bars) {
    const x1 = Math.max(-width - 2, xOf(bar.start));
    const w = Math.max(1.5, Math.min(2 * width + 2, xOf(bar.end ?? props.nowMs)) - x1);
    const y = laneMid(bar.act.agentId) - BAR_H / 2;
    (bars[bar.outcome] ??= []).push(`M${x1.toFixed(1)} ${y}h${w.toFixed(1)}v${BAR_H}h${(-w).toFixed(1)}z`);
  }
  // Messages become an arrival histogram at the bottom of each recipient's lane (3 px buckets).
  const buckets = new Map<string, number>();
  for (const { msg, at } of props.arrows) {
    const lane = msg.recipient ?? msg.sender;
    const key = `${lane}\u0000${Math.floor(xOf(at) / 3)}`;
    buckets.set(key, (buckets.get(key) ?? 0) + 1);
  }
  const peak = Math.max(1, ...buckets.values());
  const histogram: string[] = [];
  for (const [key, n] of buckets) {
    const [lane, column] = key.split('\u0000');
    const h = Math.max(1.5, (n / peak) * (LANE_H / 2 - BAR_H / 2 - 3));
    const bottom = laneMid(lane) + LANE_H / 2 - 1;
    histogram.push(`M${Number(column) * 3} ${(bottom - h).toFixed(1)}h2.4v${h.toFixed(1)}h-2.4z`);
  }
  return (
    <g data-testid="team-dense" data-bars={props.bars.length} data-arrows={props.arrows.length}>
      <g class="team-axis" aria-hidden="true">
        {props.ticks}
      </g>
      <title>{`${props.bars.length} activations and ${props.arrows.length} messages in view; zoom in to inspect them one by one.`}</title>
      {Object.entries(bars).map(([outcome, parts]) => (
        <g class={`team-bar outcome-${outcome}`} key={outcome}>
          <path class="team-bar-rect" d={parts.join('')} />
        </g>
      ))}
      <path class="team-dense-histogram" d={histogram.join('')} />
    </g>
  );
}

function Legend() {
  const items: [string, string][] = [
    ['completed', 'completed'],
    ['running', 'running'],
    ['failed', 'failed'],
    ['cancelled-p0', 'cancelled by P0'],
    ['cancelled-stop', 'cancelled by stop / approve'],
  ];
  return (
    <div class="team-legend" aria-hidden="true">
      {items.map(([cls, label]) => (
        <span class="team-legend-item" key={cls}>
          <span class={`team-swatch outcome-${cls}`} />
          {label}
        </span>
      ))}
      <span class="team-legend-item">
        <span class="team-swatch-line is-wait" />
        waiting for a signal
      </span>
      <span class="team-legend-item">
        <span class="team-swatch is-call" />
        waiting for you (call awaiting approval)
      </span>
      {['P0', 'P1', 'P2', 'P3'].map((p) => (
        <span class="team-legend-item" key={p}>
          <span class={`team-swatch-line prio-${p}`} />
          {`${p} message`}
        </span>
      ))}
    </div>
  );
}

// ---------------------------------------------------------------------------------------------
// The details opened in place: an activation with its context and history, or a message.

function TeamDetail(props: {
  project: string;
  selection: NonNullable<Selection>;
  activation: TimelineActivation | null;
  message: Message | null;
  messages: Map<string, Message>;
  onSelect: (selection: Selection) => void;
  onClose: () => void;
}) {
  const [context, setContext] = useState<ActivationContext | null>(null);
  const [history, setHistory] = useState<HistoryRow[] | null>(null);
  const [fullBody, setFullBody] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const { activation, message } = props;

  useEffect(() => {
    let live = true;
    const fail = (caught: unknown) => {
      if (live && !isTokenError(caught)) setError(errorText(caught));
    };
    if (activation) {
      getActivationContext(props.project, activation.id)
        .then((result) => live && setContext(result))
        .catch(fail);
      getHistory(props.project, activation.agentId)
        .then((page) => live && setHistory(page.messages.filter((row) => row.activationId === activation.id).reverse()))
        .catch(fail);
    }
    if (message) {
      getMessage(props.project, message.id)
        .then((full) => live && setFullBody(full.body))
        .catch(fail);
    }
    return () => {
      live = false;
    };
  }, [props.project, props.selection.id]);

  const close = (
    <button type="button" class="btn btn-secondary btn-small" onClick={props.onClose}>
      Close
    </button>
  );

  if (message) {
    return (
      <Panel
        title={`Message ${message.priority}`}
        subtitle={`${message.sender} → ${message.recipient ?? message.channel ?? 'broadcast'} · ${clockTime(message.createdAt)}`}
        testId="team-detail"
        actions={close}
      >
        <div class="chip-row">
          <Chip tone="blue">{message.id}</Chip>
          <Chip>{`${count((fullBody ?? message.body).length)} chars`}</Chip>
        </div>
        <pre class="code-block scroll-58 prewrap" data-testid="team-detail-body">
          {fullBody ?? message.body}
        </pre>
        <ErrorBox message={error} />
      </Panel>
    );
  }
  if (!activation) return null;
  const usage = readUsage(activation);
  const outcome = outcomeOf(activation);
  return (
    <Panel
      title={`Activation of ${activation.agentId}`}
      subtitle={`${activation.id} · ${OUTCOME_LABEL[outcome]} · ${clockTime(activation.startedAt)}${
        activation.completedAt ? ` → ${clockTime(activation.completedAt)}` : ''
      } · ${activation.completedAt ? 'ran' : 'running for'} ${activationDuration(activation, Date.now())}`}
      testId="team-detail"
      actions={close}
    >
      <div class="chip-row">
        <StatusPill status={activation.status} />
        {usage?.total ? <Chip tone="blue">{`${count(usage.total)} tokens`}</Chip> : null}
        {usage?.model && <Chip>{usage.apiModel ?? usage.model}</Chip>}
        <Chip>{`${activation.emittedMessages ?? 0} emitted messages`}</Chip>
        {activation.commitStart && activation.commitEnd && (
          <a
            class="chip chip-blue"
            data-testid="team-detail-commits"
            href={commitRangeHash(props.project, activation.commitStart, activation.commitEnd)}
            title="What this activation changed in its working copy"
          >
            {`commits ${activation.commitStart.slice(0, 7)}..${activation.commitEnd.slice(0, 7)}`}
          </a>
        )}
      </div>
      {activation.completedAt && <ForkButton project={props.project} activation={activation.id} />}
      {(activation.signals ?? []).length > 0 && (
        <div class="team-detail-section">
          <h3>Woken by</h3>
          <ul class="team-signal-list">
            {(activation.signals ?? []).map((signal) => {
              const msg = signal.messageId ? props.messages.get(signal.messageId) : undefined;
              return (
                <li key={signal.id}>
                  <span class={`badge-prio prio-${signal.priority}`}>{signal.priority}</span>
                  {msg ? (
                    <button
                      type="button"
                      class="link-button"
                      onClick={() => props.onSelect({ kind: 'message', id: msg.id })}
                    >
                      {`${msg.sender}: ${firstLine(msg.body, 100)}`}
                    </button>
                  ) : (
                    <span>{`${signal.kind}${signal.sourceAgent ? ` from ${signal.sourceAgent}` : ''}`}</span>
                  )}
                </li>
              );
            })}
          </ul>
        </div>
      )}
      {(activation.error ?? activation.text) && (
        <div class="team-detail-section">
          <h3>{activation.error ? 'Error' : 'Result'}</h3>
          <div class={`activation-result prewrap${activation.error ? ' is-error' : ''}`}>
            {activation.error ?? activation.text}
          </div>
        </div>
      )}
      <div class="team-detail-section">
        <h3>History of this activation</h3>
        {history === null ? (
          <p class="panel-subtitle">Loading...</p>
        ) : history.length === 0 ? (
          <p class="panel-subtitle">No rows among the agent's newest history.</p>
        ) : (
          <ol class="team-history" data-testid="team-detail-history">
            {history.map((row) => {
              const step = toolStep(row);
              return (
                <li key={row.id} data-testid="team-step" data-role={row.role}>
                  <span class="mono team-history-kind">{`${row.sequence}. ${stepTitle(row, step?.tool ?? historyToolName(row))}`}</span>
                  {step ? <ToolStepBody step={step} role={row.role} /> : <Folded text={row.content ?? ''} label="Text" />}
                </li>
              );
            })}
          </ol>
        )}
      </div>
      <div class="team-detail-section">
        <h3>Model context</h3>
        {context === null ? (
          <p class="panel-subtitle">Loading...</p>
        ) : (
          <div class="context-blocks" data-testid="team-detail-context">
            {(context.context?.messages ?? []).map((entry, index) => (
              <details class={`context-block role-${entry.role}`} key={index} open={index === (context.context?.messages?.length ?? 0) - 1}>
                <summary>
                  <span>{`${index + 1}. ${entry.role}`}</span>
                  <span class="summary-right">{`${count(entry.chars ?? (entry.content ?? '').length)} chars`}</span>
                </summary>
                <pre class="code-block scroll-58">{entry.content ?? ''}</pre>
              </details>
            ))}
          </div>
        )}
      </div>
      <ErrorBox message={error} />
    </Panel>
  );
}
