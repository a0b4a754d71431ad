// Timeline view (docs/design/webui.md): recent project events, newest first as the API returns them, with
// filters by event type and by agent (the raw list kept beside the Team view for debugging).
import { useState } from 'preact/hooks';
import type { EventRow } from './api';
import { Empty, Panel } from './components';
import { clockTime, eventSummary } from './format';

function eventTone(type: string): string {
  if (type.endsWith('.failed') || type.endsWith('_failed') || type.endsWith('.cancelled')) return 'red';
  if (type.endsWith('.completed') || type === 'project.submitted') return 'green';
  if (type.startsWith('message.') || type.startsWith('signal.')) return 'amber';
  return 'blue';
}

function eventAgentId(dataJson: string): string | null {
  try {
    const data = JSON.parse(dataJson) as { agentId?: unknown; sender?: unknown };
    if (typeof data?.agentId === 'string') return data.agentId;
    return typeof data?.sender === 'string' ? data.sender : null;
  } catch {
    return null;
  }
}

export function TimelineView(props: { events: EventRow[] | null; loading: boolean }) {
  const all = props.events ?? [];
  const [type, setType] = useState('');
  const [agent, setAgent] = useState('');
  const types = [...new Set(all.map((event) => event.type))].sort();
  const agents = [...new Set(all.map((event) => eventAgentId(event.data_json)).filter((a): a is string => !!a))].sort();
  const list = all.filter(
    (event) => (type === '' || event.type === type) && (agent === '' || eventAgentId(event.data_json) === agent),
  );
  const filtered = type !== '' || agent !== '';
  return (
    <Panel
      title="Project timeline"
      subtitle={
        props.loading ? 'Loading...' : filtered ? `${list.length} of ${all.length} recent events` : `${list.length} recent events`
      }
      busy={props.loading}
      testId="timeline-panel"
      actions={
        <div class="timeline-filters">
          <label class="inline-field">
            <span>Type</span>
            <select value={type} data-testid="timeline-type" onChange={(e) => setType((e.target as HTMLSelectElement).value)}>
              <option value="">All types</option>
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
      {list.length === 0 ? (
        <Empty>{props.loading ? 'Loading...' : 'No events yet'}</Empty>
      ) : (
        <ol class="timeline" role="list">
          {list.map((event) => {
            const summary = eventSummary(event.data_json);
            return (
              <li class={`timeline-item pin-${eventTone(event.type)}`} key={event.id} data-testid="timeline-item">
                <span class="timeline-pin" aria-hidden="true" />
                <div class="timeline-head">
                  <strong class="timeline-type" data-testid="event-type">
                    {event.type}
                  </strong>
                  <time class="meta-time mono" dateTime={event.created_at} data-testid="event-time">
                    {clockTime(event.created_at)}
                  </time>
                </div>
                <div class="timeline-summary mono" data-testid="event-summary" title={summary}>
                  {summary}
                </div>
              </li>
            );
          })}
        </ol>
      )}
    </Panel>
  );
}
