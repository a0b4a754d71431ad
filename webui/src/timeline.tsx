// Timeline view (webui.md §5.6): recent project events, newest first as the API returns them.
import type { EventRow } from './api';
import { Empty, Panel } from './components';
import { clockTime, eventSummary } from './format';

function eventTone(type: string): string {
  if (type.endsWith('.failed') || type.endsWith('_failed') || type.endsWith('.cancelled')) return 'red';
  if (type.endsWith('.completed') || type === 'project.submitted') return 'green';
  if (type.startsWith('message.') || type.startsWith('signal.')) return 'amber';
  return 'blue';
}

export function TimelineView(props: { events: EventRow[] | null; loading: boolean }) {
  const list = props.events ?? [];
  return (
    <Panel
      title="Project timeline"
      subtitle={props.loading ? 'Loading...' : `${list.length} recent events`}
      busy={props.loading}
      testId="timeline-panel"
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
