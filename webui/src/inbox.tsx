// One inbox for what needs a person (docs/design/webui.md): calls awaiting approval, reports awaiting
// review and agents a loop guard paused, across every project (GET /api/inbox). The header shows the
// count on every view; its list opens each item in the view where it is decided.
import { useEffect, useRef, useState } from 'preact/hooks';
import { getInbox, type Inbox, type InboxItem } from './api';
import { clockTime, utcTitle } from './format';

/** How often the inbox is read on its own: the project list polls slowly while the selected project's
 * stream is live, and that stream carries no other project's events. */
const INBOX_POLL_MS = 5000;

/** The inbox, read every INBOX_POLL_MS (a tick is skipped while a read is in flight) and at once whenever
 * `pulse` changes (each project-list load and each approval event); not read while `paused`. */
export function useInbox(pulse: unknown, paused = false): Inbox | null {
  const [inbox, setInbox] = useState<Inbox | null>(null);
  const seq = useRef(0);
  const inFlight = useRef(0);

  function load() {
    const request = ++seq.current;
    inFlight.current += 1;
    // A failed inbox read keeps the last answer; the project list shows the server's errors.
    getInbox()
      .then(
        (answer) => request === seq.current && setInbox(answer),
        () => undefined,
      )
      .finally(() => {
        inFlight.current -= 1;
      });
  }

  useEffect(() => {
    if (!paused) load();
  }, [pulse, paused]);

  useEffect(() => {
    if (paused) return;
    const timer = window.setInterval(() => {
      if (inFlight.current === 0) load();
    }, INBOX_POLL_MS);
    return () => window.clearInterval(timer);
  }, [paused]);
  return inbox;
}

/** Where an item is decided: the approvals card and Resume are on the Overview, the report on its own view. */
export function itemView(item: InboxItem): 'overview' | 'output' {
  return item.kind === 'report' ? 'output' : 'overview';
}

export function itemText(item: InboxItem): string {
  switch (item.kind) {
    case 'approval':
      return `Call awaiting approval: ${item.agentId ?? ''} wants to run ${item.tool ?? 'a tool'}`;
    case 'report':
      return 'Report awaiting review';
    case 'paused':
      return `Agent paused by a loop guard: ${item.agentId ?? ''}${item.rule ? ` (${item.rule})` : ''}`;
    case 'in_doubt':
      return `Call in doubt: did ${item.tool ?? 'a call'} of ${item.agentId ?? ''} happen?`;
    default:
      return `${item.kind}${item.agentId ? `: ${item.agentId}` : ''}`;
  }
}

export function InboxButton(props: { inbox: Inbox | null; onOpen: (item: InboxItem) => void }) {
  const [open, setOpen] = useState(false);
  const count = props.inbox?.count ?? 0;
  const items = props.inbox?.items ?? [];
  return (
    <div class="inbox">
      <button
        type="button"
        class={`btn btn-secondary inbox-button${count > 0 ? ' has-items' : ''}`}
        aria-expanded={open ? 'true' : 'false'}
        data-testid="inbox-button"
        onClick={() => setOpen(!open)}
      >
        Needs you
        <span class="inbox-count" data-testid="inbox-count">
          {String(count)}
        </span>
      </button>
      {open && (
        <div class="inbox-list" role="dialog" aria-label="Needs you" data-testid="inbox-list">
          {items.length === 0 ? (
            <div class="inbox-empty">Nothing waits for you.</div>
          ) : (
            items.map((item, index) => (
              <button
                type="button"
                key={`${item.project}-${item.kind}-${item.id ?? item.agentId ?? index}`}
                class={`inbox-item inbox-${item.kind}`}
                data-testid="inbox-item"
                data-kind={item.kind}
                data-project={item.project}
                onClick={() => {
                  setOpen(false);
                  props.onOpen(item);
                }}
              >
                <span class="inbox-item-text">{itemText(item)}</span>
                <span class="inbox-item-meta">
                  <span class="mono">{item.project}</span>
                  {item.since && <span title={utcTitle(item.since)}>{` · since ${clockTime(item.since)}`}</span>}
                </span>
              </button>
            ))
          )}
        </div>
      )}
    </div>
  );
}
