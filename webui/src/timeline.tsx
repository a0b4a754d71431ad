// Timeline view (docs/design/webui.md): the project's events, newest first, paged back through the API
// (`before`), filtered on the server by type (or a family such as `tool.`) and by agent, each event a
// readable line with its data folded beside it. Times are local; the UTC instant is in the title.
import { useEffect, useRef, useState } from 'preact/hooks';
import { EVENT_PAGE, errorText, isTokenError, listEventsPage, type EventRow } from './api';
import { Empty, ErrorBox, Panel } from './components';
import { eventSummary, localTime, prettyJson, utcTitle } from './format';

function eventTone(type: string): string {
  if (type.endsWith('.failed') || type.endsWith('_failed') || type.endsWith('.cancelled')) return 'red';
  if (type.endsWith('.completed') || type === 'project.submitted') return 'green';
  if (type.startsWith('message.') || type.startsWith('signal.')) return 'amber';
  return 'blue';
}

function eventData(dataJson: string): Record<string, unknown> | null {
  try {
    const data: unknown = JSON.parse(dataJson);
    return data && typeof data === 'object' && !Array.isArray(data) ? (data as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

function eventAgentId(dataJson: string): string | null {
  const data = eventData(dataJson);
  if (typeof data?.agentId === 'string') return data.agentId;
  return typeof data?.sender === 'string' ? data.sender : null;
}

function text(value: unknown): string {
  return typeof value === 'string' ? value : value === undefined || value === null ? '' : JSON.stringify(value);
}

/** One readable line for the event types people look for; the summary of its data otherwise. */
export function eventSentence(type: string, dataJson: string): string {
  const d = eventData(dataJson);
  if (!d) return eventSummary(dataJson);
  const agent = text(d.agentId);
  switch (type) {
    case 'message.created':
      return `${text(d.sender)} → ${text(d.recipient) || text(d.channel) || 'broadcast'} (${text(d.priority)}): ${text(d.body).split('\n')[0]}`;
    case 'signal.created':
      return `signal ${text(d.kind)} for ${text(d.targetAgent) || 'every agent'}`;
    case 'tool.called':
      return `${agent} called ${text(d.tool)}${d.inputPreview ? ` with ${text(d.inputPreview)}` : ''}`;
    case 'tool.completed':
      return `tool call ${text(d.id)} completed${d.output ? `: ${text(d.output).split('\n')[0]}` : ''}`;
    case 'tool.failed':
      return `tool call ${text(d.id)} failed${d.error ? `: ${text(d.error).split('\n')[0]}` : ''}`;
    case 'activation.started':
      return `${agent} started activation ${text(d.activationId ?? d.id)}`;
    case 'activation.completed':
    case 'activation.failed':
    case 'activation.cancelled':
      return `${agent}'s activation ${text(d.activationId ?? d.id)} ${type.split('.')[1]}${d.reason ? `: ${text(d.reason)}` : ''}`;
    case 'approval.requested':
      return `${agent} asks to run ${text(d.tool)}: call awaiting approval`;
    case 'approval.decided':
      return `call ${text(d.decision)}${d.decidedBy ? ` by ${text(d.decidedBy)}` : ''}`;
    case 'project.status':
      return `project ${text(d.status)}`;
    case 'project.submitted':
      return `${agent || 'the team'} submitted the report: report awaiting review`;
    case 'guard.tripped':
      return `${agent} paused by loop guard ${text(d.rule)}: ${text(d.reason)}`;
    case 'agent.status':
      return `${agent} is ${text(d.status)}`;
    default:
      return eventSummary(dataJson);
  }
}

export function TimelineView(props: { project: string; agents: string[]; events: EventRow[] | null; loading: boolean }) {
  const [type, setType] = useState('');
  const [agent, setAgent] = useState('');
  // Filtered first page (from the server), and the older pages the reader asked for.
  const [filtered, setFiltered] = useState<EventRow[] | null>(null);
  const [older, setOlder] = useState<EventRow[]>([]);
  const [more, setMore] = useState(true);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  // Every type and agent seen, so the filters keep their options while one is set.
  const seen = useRef({ types: new Set<string>(), agents: new Set<string>() });
  const seq = useRef(0);
  const isFiltered = type !== '' || agent !== '';

  useEffect(() => {
    setOlder([]);
    setMore(true);
    if (!isFiltered) {
      setFiltered(null);
      return;
    }
    const request = ++seq.current;
    setBusy(true);
    listEventsPage(props.project, { type, agent }).then(
      (rows) => {
        if (request !== seq.current) return;
        setFiltered(rows);
        setMore(rows.length === EVENT_PAGE);
        setError(null);
        setBusy(false);
      },
      (caught) => {
        if (request !== seq.current) return;
        if (!isTokenError(caught)) setError(errorText(caught));
        setBusy(false);
      },
    );
  }, [props.project, type, agent, isFiltered ? props.events : null]);

  const first = isFiltered ? filtered ?? [] : props.events ?? [];
  const firstIds = new Set(first.map((event) => event.id));
  const list = [...first, ...older.filter((event) => !firstIds.has(event.id))];
  for (const event of list) {
    seen.current.types.add(event.type);
    const id = eventAgentId(event.data_json);
    if (id) seen.current.agents.add(id);
  }
  const types = [...seen.current.types].sort();
  const families = [...new Set(types.map((t) => t.split('.')[0]))].filter((f) => types.some((t) => t.startsWith(`${f}.`)));
  const agents = [...new Set([...props.agents, 'user', ...seen.current.agents])].sort();
  const canPage = more && first.length >= EVENT_PAGE;

  async function loadOlder() {
    const last = list[list.length - 1];
    if (!last) return;
    const request = ++seq.current;
    setBusy(true);
    try {
      const rows = await listEventsPage(props.project, { before: last.id, type, agent });
      if (request !== seq.current) return;
      setOlder((old) => [...old, ...rows]);
      setMore(rows.length === EVENT_PAGE);
      setError(null);
    } catch (caught) {
      if (request === seq.current && !isTokenError(caught)) setError(errorText(caught));
    } finally {
      if (request === seq.current) setBusy(false);
    }
  }

  const loading = props.loading || busy;
  return (
    <Panel
      title="Project timeline"
      subtitle={
        loading && list.length === 0
          ? 'Loading...'
          : `${list.length} ${isFiltered ? 'matching' : 'recent'} events${canPage ? ' · older ones below' : ''}`
      }
      busy={loading}
      testId="timeline-panel"
      actions={
        <div class="timeline-filters">
          <label class="inline-field">
            <span>Type</span>
            <select value={type} data-testid="timeline-type" onChange={(e) => setType((e.target as HTMLSelectElement).value)}>
              <option value="">All types</option>
              {families.map((family) => (
                <option value={`${family}.`} key={`${family}.`}>
                  {`${family}.* (all)`}
                </option>
              ))}
              {types.map((value) => (
                <option value={value} key={value}>
                  {value}
                </option>
              ))}
            </select>
          </label>
          <label class="inline-field">
            <span>Agent</span>
            <select value={agent} data-testid="timeline-agent" onChange={(e) => setAgent((e.target as HTMLSelectElement).value)}>
              <option value="">All agents</option>
              {agents.map((value) => (
                <option value={value} key={value}>
                  {value}
                </option>
              ))}
            </select>
          </label>
        </div>
      }
    >
      <ErrorBox message={error} testId="timeline-error" />
      {list.length === 0 ? (
        <Empty>{loading ? 'Loading...' : isFiltered ? 'No events match' : 'No events yet'}</Empty>
      ) : (
        <ol class="timeline" role="list">
          {list.map((event) => (
            <li class={`timeline-item pin-${eventTone(event.type)}`} key={event.id} data-testid="timeline-item">
              <span class="timeline-pin" aria-hidden="true" />
              <div class="timeline-head">
                <strong class="timeline-type" data-testid="event-type">
                  {event.type}
                </strong>
                <time class="meta-time mono" dateTime={event.created_at} title={utcTitle(event.created_at)} data-testid="event-time">
                  {localTime(event.created_at)}
                </time>
              </div>
              <div class="timeline-sentence" data-testid="event-sentence">
                {eventSentence(event.type, event.data_json)}
              </div>
              <details class="timeline-data">
                <summary class="timeline-summary mono" data-testid="event-summary">
                  {eventSummary(event.data_json)}
                </summary>
                <pre class="code-block scroll-34">{prettyJson(eventData(event.data_json) ?? event.data_json)}</pre>
              </details>
            </li>
          ))}
        </ol>
      )}
      {canPage && (
        <button type="button" class="btn btn-secondary btn-block load-older" data-testid="timeline-older" disabled={loading} onClick={loadOlder}>
          {loading ? 'Loading' : 'Load older events'}
        </button>
      )}
    </Panel>
  );
}
