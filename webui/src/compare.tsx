// Two runs laid over each other (docs/replay.md): under the Team view, this project's activations and
// another run's (a replay's source by default), one pair of lanes per agent, each run on its own clock
// from its first activation, the first divergence marked. Reads the timeline and diff routes only.
import { useEffect, useMemo, useState } from 'preact/hooks';
import {
  errorText,
  getDiff,
  getTimeline,
  isTokenError,
  listToolCalls,
  type DiffResult,
  type Message,
  type Project,
  type TimelineActivation,
  type TimelineSignal,
  type ToolCallRow,
} from './api';
import { ErrorBox, Panel } from './components';

const LANE_H = 22;
const PAIR_GAP = 10;
const LABEL_W = 150;
const WIDTH = 1100;
const PLOT_W = WIDTH - LABEL_W - 20;

interface Run {
  name: string;
  activations: TimelineActivation[];
  messages: Message[];
  /** Report submissions (their sourceActivation is the activation that submitted). */
  submissions: TimelineSignal[];
  /** Loaded only when the runs first differ in their tool calls. */
  toolCalls: ToolCallRow[] | null;
}

function ms(iso: string | undefined): number {
  return iso ? Date.parse(iso) : Date.now();
}

/** The activations of a run oldest first, and the time its first one started. */
function ordered(run: Run): { list: TimelineActivation[]; start: number; span: number } {
  const list = [...run.activations].sort((a, b) => ms(a.startedAt) - ms(b.startedAt));
  const start = list.length ? ms(list[0].startedAt) : 0;
  const end = list.reduce((latest, act) => Math.max(latest, ms(act.completedAt ?? act.startedAt)), start);
  return { list, start, span: Math.max(1, end - start) };
}

/** The activation of `agent` running at `at` in a run, else the first one that started after it. */
function activationAt(run: Run, agent: string, at: number): TimelineActivation | undefined {
  const mine = ordered(run).list.filter((act) => act.agentId === agent);
  return (
    mine.find((act) => ms(act.startedAt) <= at && at <= ms(act.completedAt)) ?? mine.find((act) => ms(act.startedAt) >= at)
  );
}

/** Where one run is at the first difference the diff names, as an activation of that run. */
function partingIn(run: Run, first: NonNullable<DiffResult['firstDifference']>): TimelineActivation | undefined {
  const { key, index } = first;
  const byAgent = (agent: string) => ordered(run).list.filter((act) => act.agentId === agent);
  switch (first.section) {
    case 'activations':
      return key !== undefined && index !== undefined ? byAgent(key)[index] : undefined;
    case 'messages': {
      // {sender: [messages in order]}: the sender's message; a user's message marks the recipient's next activation
      if (key === undefined) return undefined;
      const sent = run.messages
        .filter((msg) => msg.sender === key)
        .sort((x, y) => ms(x.createdAt) - ms(y.createdAt));
      const msg = sent[index ?? 0] ?? sent[sent.length - 1];
      if (!msg) return undefined;
      const agent = key === 'user' ? msg.recipient ?? '' : key;
      return activationAt(run, agent, ms(msg.createdAt));
    }
    case 'toolCalls': {
      if (key === undefined || !run.toolCalls) return undefined;
      const calls = run.toolCalls.filter((call) => call.agent_id === key).reverse();
      const call = calls[index ?? 0] ?? calls[calls.length - 1];
      return call ? run.activations.find((act) => act.id === call.activation_id) : undefined;
    }
    case 'artifacts': {
      // {agent: {path: digest}}: the folder as it ended differs; its last activation left it so
      const mine = key !== undefined ? byAgent(key) : [];
      return mine[mine.length - 1];
    }
    case 'report': {
      const submitted = [...run.submissions].sort((x, y) => ms(x.createdAt) - ms(y.createdAt)).pop();
      const id = submitted?.sourceActivation;
      return id ? run.activations.find((act) => act.id === id) : undefined;
    }
    default:
      return undefined;
  }
}

/** The activation ids marked as where the runs part: a replay's divergence, else where each run is at
 * the diff's first difference, whatever its section (docs/replay.md). */
function divergence(project: Project, other: string, a: Run, b: Run, diff: DiffResult | null): Set<string> {
  const marked = new Set<string>();
  const diverged = project.origin?.diverged;
  if (diverged && project.origin?.source === other) {
    marked.add(diverged.activationId);
    if (diverged.sourceActivationId) marked.add(diverged.sourceActivationId);
    return marked;
  }
  const first = diff?.firstDifference;
  if (!first) return marked;
  for (const run of [a, b]) {
    const found = partingIn(run, first);
    if (found) marked.add(found.id);
  }
  return marked;
}

export function CompareRuns(props: { project: Project; projects: Project[] }) {
  const { project } = props;
  const choices = props.projects.filter((item) => item.id !== project.id).map((item) => item.id);
  const [other, setOther] = useState<string>('');
  const [runs, setRuns] = useState<{ a: Run; b: Run; diff: DiffResult } | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    setOther(project.origin?.source ?? '');
    setRuns(null);
  }, [project.id]);

  useEffect(() => {
    if (!other) {
      setRuns(null);
      return;
    }
    let stale = false;
    setError(null);
    const load = async () => {
      const [mine, theirs, diff] = await Promise.all([getTimeline(project.id), getTimeline(other), getDiff(project.id, other)]);
      const calls =
        diff.firstDifference?.section === 'toolCalls'
          ? await Promise.all([listToolCalls(project.id), listToolCalls(other)])
          : [null, null];
      const run = (name: string, page: typeof mine, toolCalls: ToolCallRow[] | null): Run => ({
        name,
        activations: page.activations,
        messages: page.messages,
        submissions: page.approvals,
        toolCalls,
      });
      if (!stale) setRuns({ a: run(project.id, mine, calls[0]), b: run(other, theirs, calls[1]), diff });
    };
    void load()
      .catch((caught) => {
        if (!stale && !isTokenError(caught)) setError(errorText(caught));
      });
    return () => {
      stale = true;
    };
  }, [project.id, other, project.status]);

  const drawing = useMemo(() => {
    if (!runs) return null;
    const a = ordered(runs.a);
    const b = ordered(runs.b);
    const span = Math.max(a.span, b.span);
    const agents = [...new Set([...(project.agents ?? []).map((agent) => agent.id), ...a.list.map((x) => x.agentId),
      ...b.list.map((x) => x.agentId)])].sort();
    const marked = divergence(project, runs.b.name, runs.a, runs.b, runs.diff);
    return { a, b, span, agents, marked };
  }, [runs, project]);

  const summary = runs
    ? runs.diff.identical
      ? 'The two runs are identical.'
      : `They part first in ${runs.diff.firstDifference?.section ?? '?'}` +
        (runs.diff.firstDifference?.key ? ` (${runs.diff.firstDifference.key}` : '') +
        (runs.diff.firstDifference?.index !== undefined ? ` #${runs.diff.firstDifference.index + 1}` : '') +
        (runs.diff.firstDifference?.key ? ')' : '') +
        (drawing && drawing.marked.size === 0 ? '; no single activation holds it' : '; marked in red') +
        '.'
    : '';

  return (
    <Panel
      title="Compare two runs"
      subtitle="This project's activations (solid) over another run's (outlined), aligned by agent"
      testId="compare-panel"
      actions={
        <label class="compare-pick">
          <span>Overlay</span>
          <select
            data-testid="compare-select"
            value={other}
            onChange={(event) => setOther((event.target as HTMLSelectElement).value)}
          >
            <option value="">none</option>
            {choices.map((name) => (
              <option value={name}>{name}</option>
            ))}
          </select>
        </label>
      }
    >
      <ErrorBox message={error} testId="compare-error" />
      {drawing && runs && (
        <>
          <p class="compare-summary" data-testid="compare-summary" data-identical={runs.diff.identical ? 'true' : 'false'}>
            {summary}
          </p>
          <svg
            class="compare-chart"
            data-testid="compare-chart"
            width={WIDTH}
            height={drawing.agents.length * (2 * LANE_H + PAIR_GAP) + 10}
            role="img"
            aria-label={`${runs.a.name} over ${runs.b.name}`}
          >
            {drawing.agents.map((agent, row) => {
              const top = 5 + row * (2 * LANE_H + PAIR_GAP);
              return (
                <g data-testid="compare-lane" data-agent={agent}>
                  <text class="compare-agent" x={8} y={top + LANE_H + 4}>
                    {agent}
                  </text>
                  {(
                    [
                      ['a', drawing.a, top],
                      ['b', drawing.b, top + LANE_H],
                    ] as const
                  ).map(([which, run, y]) => (
                    <g data-run={which}>
                      <line class="compare-track" x1={LABEL_W} x2={LABEL_W + PLOT_W} y1={y + LANE_H / 2} y2={y + LANE_H / 2} />
                      {run.list
                        .filter((act) => act.agentId === agent)
                        .map((act) => {
                          const x = LABEL_W + ((ms(act.startedAt) - run.start) / drawing.span) * PLOT_W;
                          const end = LABEL_W + ((ms(act.completedAt) - run.start) / drawing.span) * PLOT_W;
                          const diverged = drawing.marked.has(act.id);
                          return (
                            <rect
                              class={`compare-bar run-${which} status-${act.status}${diverged ? ' is-diverged' : ''}`}
                              data-testid="compare-bar"
                              data-run={which}
                              data-activation-id={act.id}
                              data-diverged={diverged ? 'true' : 'false'}
                              x={x}
                              y={y + 3}
                              width={Math.max(4, end - x)}
                              height={LANE_H - 6}
                              rx={3}
                            >
                              <title>{`${which === 'a' ? runs.a.name : runs.b.name} · ${agent} · ${act.status}${diverged ? ' · diverged here' : ''}`}</title>
                            </rect>
                          );
                        })}
                    </g>
                  ))}
                </g>
              );
            })}
          </svg>
          <p class="compare-legend">
            <span class="swatch run-a" /> {runs.a.name} <span class="swatch run-b" /> {runs.b.name}{' '}
            <span class="swatch is-diverged" /> where they part
          </p>
        </>
      )}
    </Panel>
  );
}
