// Calls awaiting approval: tool calls waiting for a person, on the overview (every agent)
// and in the agent's history view (that agent only). Loads GET …/approvals?status=pending whenever the
// `pulse` changes (approval events of the live stream, or the project-list poll) and decides with
// Allow / Deny (with a note) / Allow always, Edit input (allow with the input edited as JSON) or Respond
// (nothing runs; the text is the call's result). The call's input is shown as text, never as HTML; a
// `repo.merge` call shows the change it would land (its `preview` diff), folded when long.
import { useEffect, useRef, useState } from 'preact/hooks';
import {
  decideApproval,
  errorText,
  isTokenError,
  listPendingApprovals,
  type Approval,
  type ApprovalDecision,
  type DecisionExtras,
} from './api';
import { DiffText, Empty, ErrorBox, Panel } from './components';
import { localTime, prettyJson, utcTitle } from './format';

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
      title="Calls awaiting approval"
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

type Mode = 'decide' | 'edit' | 'respond';

/** Lines of a merge's diff shown before the rest is folded: the stat and the first hunks. */
const DIFF_FOLD_LINES = 24;

/** The edited input as an object, or the reason it cannot be sent. */
function parseEdited(text: string): { input?: Record<string, unknown>; problem?: string } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (caught) {
    return { problem: `The input is not valid JSON: ${caught instanceof Error ? caught.message : String(caught)}` };
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return { problem: 'The input must be a JSON object' };
  }
  return { input: value as Record<string, unknown> };
}

function ApprovalItem(props: { project: string; row: Approval; onDecided: () => Promise<void> }) {
  const [note, setNote] = useState('');
  const [mode, setMode] = useState<Mode>('decide');
  const [edited, setEdited] = useState(() => prettyJson(props.row.input));
  const [answer, setAnswer] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const row = props.row;

  async function decide(decision: ApprovalDecision, extras: DecisionExtras = {}) {
    if (busy) return;
    setBusy(true);
    setError(null);
    try {
      const trimmed = note.trim();
      if (trimmed && (decision === 'deny' || extras.input !== undefined)) extras = { ...extras, note: trimmed };
      await decideApproval(props.project, row.id, decision, extras);
      await props.onDecided();
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  }

  const noteInput = (
    <input
      type="text"
      class="approval-note"
      placeholder={mode === 'edit' ? 'Note for the record (why you changed it)' : 'Note for the agent (sent with Deny)'}
      aria-label="Note for the agent"
      value={note}
      maxLength={4000}
      onInput={(event) => setNote((event.target as HTMLInputElement).value)}
      data-testid="approval-note"
    />
  );

  return (
    <li class="approval-item" data-testid="approval-item" data-approval-id={row.id}>
      <div class="approval-head">
        <strong class="mono" data-testid="approval-tool">
          {row.tool}
        </strong>
        <span class="approval-agent" data-testid="approval-agent">
          {row.agentId}
        </span>
        <span class="approval-expiry mono" title={utcTitle(row.expiresAt)}>{`expires ${localTime(row.expiresAt)}`}</span>
      </div>
      {mode === 'edit' ? (
        <textarea
          class="approval-edit mono"
          rows={Math.min(14, Math.max(4, edited.split('\n').length + 1))}
          aria-label="Edited input (JSON)"
          value={edited}
          spellcheck={false}
          onInput={(event) => setEdited((event.target as HTMLTextAreaElement).value)}
          data-testid="approval-edit"
        />
      ) : (
        <pre class="approval-input mono" data-testid="approval-input">
          {prettyJson(row.input)}
        </pre>
      )}
      {row.preview && (
        <div class="approval-preview" data-testid="approval-preview">
          <span class="approval-preview-label">What this merge would land</span>
          {row.preview.diff === '' ? (
            <Empty>No change: the workspace matches the integration branch</Empty>
          ) : (
            <DiffText diff={row.preview.diff} foldAt={DIFF_FOLD_LINES} testId="approval-diff" />
          )}
        </div>
      )}
      {mode === 'respond' && (
        <textarea
          class="approval-answer"
          rows={4}
          aria-label="Your answer (the call's result)"
          placeholder="The agent reads this as the result of the call; nothing runs."
          value={answer}
          maxLength={100000}
          onInput={(event) => setAnswer((event.target as HTMLTextAreaElement).value)}
          data-testid="approval-answer"
        />
      )}
      {mode === 'edit' && (
        <div class="approval-actions">
          {noteInput}
          <button
            type="button"
            class="btn btn-primary btn-small"
            disabled={busy}
            data-testid="approval-allow-edited"
            onClick={() => {
              const parsed = parseEdited(edited);
              if (parsed.problem) setError(parsed.problem);
              else void decide('allow', { input: parsed.input });
            }}
          >
            Allow edited
          </button>
          <button type="button" class="btn btn-secondary btn-small" disabled={busy} onClick={() => setMode('decide')}>
            Cancel
          </button>
        </div>
      )}
      {mode === 'respond' && (
        <div class="approval-actions">
          <button
            type="button"
            class="btn btn-primary btn-small"
            disabled={busy || answer.trim() === ''}
            data-testid="approval-send-answer"
            onClick={() => decide('respond', { output: answer })}
          >
            Send answer
          </button>
          <button type="button" class="btn btn-secondary btn-small" disabled={busy} onClick={() => setMode('decide')}>
            Cancel
          </button>
        </div>
      )}
      {mode === 'decide' && (
        <div class="approval-actions">
          {noteInput}
          <button type="button" class="btn btn-primary btn-small" disabled={busy} onClick={() => decide('allow')}>
            Allow
          </button>
          <button type="button" class="btn btn-danger btn-small" disabled={busy} onClick={() => decide('deny')}>
            Deny
          </button>
          <button type="button" class="btn btn-secondary btn-small" disabled={busy} onClick={() => decide('allow-always')}>
            Allow always
          </button>
          <button
            type="button"
            class="btn btn-secondary btn-small"
            disabled={busy}
            data-testid="approval-edit-open"
            onClick={() => {
              setError(null);
              setMode('edit');
            }}
          >
            Edit input
          </button>
          <button
            type="button"
            class="btn btn-secondary btn-small"
            disabled={busy}
            data-testid="approval-respond-open"
            onClick={() => {
              setError(null);
              setMode('respond');
            }}
          >
            Respond
          </button>
        </div>
      )}
      <ErrorBox message={error} testId="approval-error" />
    </li>
  );
}
