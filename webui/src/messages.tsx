// Messages view (docs/design/webui.md): recent messages newest first, with full bodies fetched on demand.
// Expansion state and cached full bodies live here and reset when the view unmounts.
import { useState } from 'preact/hooks';
import { errorText, getMessage, isTokenError, type Message } from './api';
import { Empty, ErrorBox, Panel } from './components';
import { count, messageTarget, relativeTime, utcTitle } from './format';

interface Expansion {
  open: boolean;
  loading: boolean;
  full?: string;
}

function priorityTone(priority: string): string {
  if (priority === 'P0') return 'red';
  if (priority === 'P1') return 'amber';
  return 'blue';
}

export function MessagesView(props: {
  project: string;
  messages: Message[] | null;
  loading: boolean;
  now: number;
}) {
  const [expanded, setExpanded] = useState<Record<string, Expansion>>({});
  const [error, setError] = useState<string | null>(null);
  const list = props.messages ?? [];
  const newestFirst = [...list].reverse();
  const showLoading = props.loading && props.messages === null;

  async function toggle(message: Message) {
    const current = expanded[message.id];
    if (current?.open) {
      setExpanded((all) => ({ ...all, [message.id]: { ...current, open: false } }));
      return;
    }
    if (current?.full !== undefined) {
      setExpanded((all) => ({ ...all, [message.id]: { ...current, open: true } }));
      return;
    }
    setExpanded((all) => ({ ...all, [message.id]: { open: false, loading: true } }));
    setError(null);
    try {
      const full = await getMessage(props.project, message.id);
      setExpanded((all) => ({ ...all, [message.id]: { open: true, loading: false, full: full.body } }));
    } catch (caught) {
      setExpanded((all) => ({ ...all, [message.id]: { open: false, loading: false } }));
      if (!isTokenError(caught)) setError(errorText(caught));
    }
  }

  return (
    <Panel
      title="Messages"
      subtitle={props.loading ? 'Loading...' : `${list.length} recent conversation items`}
      busy={props.loading}
      testId="messages-panel"
    >
      <ErrorBox message={error} testId="messages-error" />
      {newestFirst.length === 0 ? (
        <Empty>{showLoading ? 'Loading...' : 'No messages yet'}</Empty>
      ) : (
        <ol class="message-list" role="list">
          {newestFirst.map((message) => {
            const state = expanded[message.id];
            const open = Boolean(state?.open);
            const body = open && state?.full !== undefined ? state.full : message.body;
            const tone = priorityTone(message.priority);
            return (
              <li
                key={message.id}
                class={`message-card border-${tone}${open ? ' is-open' : ''}`}
                data-testid="message-card"
                data-message-id={message.id}
              >
                <div class="message-route">
                  <span class="route-chip route-from">
                    <span class="route-label">From</span>
                    <span class="route-value" data-testid="message-sender">
                      {message.sender}
                    </span>
                  </span>
                  <span class="route-connector" aria-hidden="true">
                    <span class="route-line" />
                    <span class="route-to">to</span>
                    <span class="route-line" />
                  </span>
                  <span class="route-chip route-target">
                    <span class="route-label">{message.recipient !== undefined ? 'Recipient' : 'Channel'}</span>
                    <span class="route-value" data-testid="message-target">
                      {messageTarget(message)}
                    </span>
                  </span>
                  <span class="message-meta">
                    <span class="meta-time" title={utcTitle(message.createdAt)}>{relativeTime(message.createdAt, props.now)}</span>
                    <span class={`badge badge-${tone}`} data-testid="message-priority">
                      {message.priority}
                    </span>
                  </span>
                </div>
                <div class={`message-body prewrap${open ? ' body-open' : ' clamp-5'}`} data-testid="message-body">
                  {body}
                </div>
                <div class="message-foot mono">
                  <span class="foot-id">{message.id}</span>
                  <span data-testid="message-chars">{`${count(body.length)} chars`}</span>
                  <button
                    type="button"
                    class="btn btn-mini"
                    disabled={Boolean(state?.loading)}
                    onClick={() => toggle(message)}
                    aria-expanded={open ? 'true' : 'false'}
                  >
                    {state?.loading ? 'Loading...' : open ? 'Collapse' : 'Expand full'}
                  </button>
                </div>
              </li>
            );
          })}
        </ol>
      )}
    </Panel>
  );
}
