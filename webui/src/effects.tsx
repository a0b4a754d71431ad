// Calls in doubt card: external tool calls that started and never reported back (docs/operations.md,
// "What an agent can do to the outside world"), on the overview. Loads GET …/effects?state=in_doubt
// whenever the `pulse` changes and resolves one with It happened / It did not happen (an optional note
// goes to the agent). The call's input is shown as text, never as HTML.
import { useEffect, useRef, useState } from 'preact/hooks';
import { errorText, isTokenError, listEffectsInDoubt, resolveEffect, type Effect, type EffectResolution } from './api';
import { ErrorBox, Panel } from './components';
import { prettyJson } from './format';

export function EffectsCard(props: { project: string; pulse: number }) {
  const [rows, setRows] = useState<Effect[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const sequence = useRef(0);

  async function load() {
    const request = ++sequence.current;
    try {
      const list = await listEffectsInDoubt(props.project);
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

  const shown = rows ?? [];
  if (shown.length === 0 && error === null) return null;
  return (
    <Panel
      title="Calls in doubt"
      subtitle={`${shown.length} external ${shown.length === 1 ? 'call' : 'calls'} may or may not have happened`}
      className="approvals-panel"
      testId="effects-card"
    >
      <ErrorBox message={error} testId="effects-error" />
      <ul class="approval-list" role="list">
        {shown.map((row) => (
          <EffectItem key={row.id} project={props.project} row={row} onResolved={load} />
        ))}
      </ul>
    </Panel>
  );
}

function EffectItem(props: { project: string; row: Effect; onResolved: () => Promise<void> }) {
  const [note, setNote] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const row = props.row;

  async function resolve(resolution: EffectResolution) {
    if (busy) return;
    setBusy(true);
    setError(null);
    try {
      await resolveEffect(props.project, row.id, resolution, note.trim() || undefined);
      await props.onResolved();
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  }

  return (
    <li class="approval-item" data-testid="effect-item" data-effect-id={row.id}>
      <div class="approval-head">
        <strong class="mono">{row.tool}</strong>
        <span class="approval-agent">{row.agent}</span>
        <span class="approval-expiry mono">{`started ${row.startedAt}`}</span>
      </div>
      <pre class="approval-input mono" data-testid="effect-input">
        {prettyJson(row.input)}
      </pre>
      <div class="approval-expiry mono">{`call key ${row.callKey ?? '-'}; ${row.why ?? ''}`}</div>
      <div class="approval-actions">
        <input
          type="text"
          class="approval-note"
          placeholder="Note for the agent (what you found)"
          aria-label="Note for the agent"
          value={note}
          maxLength={4000}
          onInput={(event) => setNote((event.target as HTMLInputElement).value)}
        />
        <button type="button" class="btn btn-primary btn-small" disabled={busy} onClick={() => resolve('done')}>
          It happened
        </button>
        <button type="button" class="btn btn-secondary btn-small" disabled={busy} onClick={() => resolve('not_done')}>
          It did not happen
        </button>
      </div>
      <ErrorBox message={error} testId="effect-error" />
    </li>
  );
}
