// Pending approvals card: tool calls waiting for a person, on the overview (every agent)
// and in the agent's history view (that agent only). Loads GET …/approvals?status=pending whenever the
// `pulse` changes (approval events of the live stream, or the project-list poll) and decides with
// Allow / Deny (with a note) / Allow always. The call's input is shown as text, never as HTML.
import { useEffect, useRef, useState } from 'preact/hooks';
import { decideApproval, errorText, isTokenError, listPendingApprovals, type Approval, type ApprovalDecision } from './api';
import { ErrorBox, Panel } from './components';
import { prettyJson } from './format';

export function ApprovalsCard(props: { project: string; agentId?: string; pulse: number }) {
  const [rows, setRows] = useState<Approval[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const sequence = useRef(0);

  async function load() {
    const request = ++sequence.current;
    try {
      const list = await listPendingApprovals(props.project);
      if (request !== sequence.current) return;
      setRows(list);
      setError(null);
    } catch (caught) {
      if (request === sequence.current && !isTokenError(caught)) setError(errorText(caught));
    }
  }

  useEffect(() => {
    void load();
  }, [props.project, props.pulse]);

  const shown = (rows ?? []).filter((row) => !props.agentId || row.agentId === props.agentId);
  if (shown.length === 0 && error === null) return null;
  return (
    <Panel
      title="Pending approvals"
      subtitle={`${shown.length} tool ${shown.length === 1 ? 'call waits' : 'calls wait'} for a person`}
      className="approvals-panel"
      testId="approvals-card"
    >
      <ErrorBox message={error} testId="approvals-error" />
      <ul class="approval-list" role="list">
        {shown.map((row) => (
          <ApprovalItem key={row.id} project={props.project} row={row} onDecided={load} />
        ))}
      </ul>
    </Panel>
  );
}

function ApprovalItem(props: { project: string; row: Approval; onDecided: () => Promise<void> }) {
  const [note, setNote] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const row = props.row;

  async function decide(decision: ApprovalDecision) {
    if (busy) return;
    setBusy(true);
    setError(null);
    try {
      const trimmed = note.trim();
      await decideApproval(props.project, row.id, decision, decision === 'deny' && trimmed ? trimmed : undefined);
      await props.onDecided();
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  }

  return (
    <li class="approval-item" data-testid="approval-item" data-approval-id={row.id}>
      <div class="approval-head">
        <strong class="mono" data-testid="approval-tool">
          {row.tool}
        </strong>
        <span class="approval-agent" data-testid="approval-agent">
          {row.agentId}
        </span>
        <span class="approval-expiry mono">{`expires ${row.expiresAt}`}</span>
      </div>
      <pre class="approval-input mono" data-testid="approval-input">
        {prettyJson(row.input)}
      </pre>
      <div class="approval-actions">
        <input
          type="text"
          class="approval-note"
          placeholder="Note for the agent (sent with Deny)"
          aria-label="Note for the agent"
          value={note}
          maxLength={4000}
          onInput={(event) => setNote((event.target as HTMLInputElement).value)}
          data-testid="approval-note"
        />
        <button type="button" class="btn btn-primary btn-small" disabled={busy} onClick={() => decide('allow')}>
          Allow
        </button>
        <button type="button" class="btn btn-danger btn-small" disabled={busy} onClick={() => decide('deny')}>
          Deny
        </button>
        <button type="button" class="btn btn-secondary btn-small" disabled={busy} onClick={() => decide('allow-always')}>
          Allow always
        </button>
      </div>
      <ErrorBox message={error} testId="approval-error" />
    </li>
  );
}
