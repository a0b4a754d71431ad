// New runs from the page (docs/replay.md): "Fork from here" on an ended activation and "Replay" on an
// ended project, each with an optional changed project file (YAML). The app is told of the new project
// (onRunCreated) and opens it.
import { useState } from 'preact/hooks';
import { errorText, forkProject, isTokenError, replayProject, type Project } from './api';
import { ErrorBox } from './components';

type CreatedListener = (project: string) => void;
let createdListener: CreatedListener | null = null;

/** Registers the one callback told when a fork or replay was created (the app opens it). */
export function onRunCreated(listener: CreatedListener | null): void {
  createdListener = listener;
}

function suggestedName(source: string, kind: string): string {
  const stamp = new Date().toISOString().slice(11, 19).replace(/:/g, '');
  return `${source}-${kind}-${stamp}`;
}

function ConfigField(props: { id: string; value: string; onInput: (value: string) => void }) {
  return (
    <div class="field">
      <label for={props.id}>Changed project file (YAML, optional)</label>
      <textarea
        id={props.id}
        class="mono run-config"
        rows={5}
        spellcheck={false}
        placeholder="Leave empty to keep the source's configuration."
        value={props.value}
        onInput={(e) => props.onInput((e.target as HTMLTextAreaElement).value)}
      />
    </div>
  );
}

async function create(run: () => Promise<Project>, setBusy: (b: boolean) => void, setError: (e: string | null) => void) {
  setBusy(true);
  setError(null);
  try {
    const created = await run();
    createdListener?.(created.id);
  } catch (caught) {
    if (!isTokenError(caught)) setError(errorText(caught));
  } finally {
    setBusy(false);
  }
}

/** "Fork from here": a new project holding this one as it was when `activation` ended, run live. */
export function ForkButton(props: { project: string; activation: string }) {
  const [open, setOpen] = useState(false);
  const [name, setName] = useState('');
  const [config, setConfig] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  if (!open) {
    return (
      <button
        type="button"
        class="btn btn-mini"
        data-testid="fork-open"
        onClick={() => {
          setName(suggestedName(props.project, 'fork'));
          setOpen(true);
        }}
      >
        Fork from here
      </button>
    );
  }
  const id = `fork-${props.activation}`;
  return (
    <form
      class="run-form"
      data-testid="fork-form"
      onSubmit={(event) => {
        event.preventDefault();
        const body = { as: name.trim(), at: props.activation, ...(config.trim() ? { config } : {}) };
        void create(() => forkProject(props.project, body), setBusy, setError);
      }}
    >
      <p class="run-form-note">
        A new project holding this one as it was when this activation ended; it starts at once, live.
      </p>
      <div class="field">
        <label for={`${id}-name`}>New project name</label>
        <input id={`${id}-name`} value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
      </div>
      <ConfigField id={`${id}-config`} value={config} onInput={setConfig} />
      <ErrorBox message={error} testId="fork-error" />
      <div class="run-form-buttons">
        <button type="submit" class="btn btn-primary btn-small" disabled={busy || name.trim() === ''}>
          {busy ? 'Forking...' : 'Create fork'}
        </button>
        <button type="button" class="btn btn-secondary btn-small" onClick={() => setOpen(false)}>
          Cancel
        </button>
      </div>
    </form>
  );
}

/** "Replay": a new project replaying this one's recorded run, started at once. */
export function ReplayForm(props: { project: string; onCancel: () => void }) {
  const [name, setName] = useState(() => suggestedName(props.project, 'replay'));
  const [tools, setTools] = useState<'live' | 'recorded'>('recorded');
  const [onDiverge, setOnDiverge] = useState<'stop' | 'live'>('stop');
  const [config, setConfig] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  return (
    <form
      class="hero-confirm run-form"
      data-testid="replay-form"
      onSubmit={(event) => {
        event.preventDefault();
        const body = { as: name.trim(), tools, onDiverge, ...(config.trim() ? { config } : {}) };
        void create(() => replayProject(props.project, body), setBusy, setError);
      }}
    >
      <div class="field">
        <label for="replay-name">New project name</label>
        <input id="replay-name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
      </div>
      <div class="run-form-row">
        <label class="inline-field">
          <span>Tools</span>
          <select value={tools} onChange={(e) => setTools((e.target as HTMLSelectElement).value as 'live' | 'recorded')}>
            <option value="recorded">recorded results</option>
            <option value="live">run live</option>
          </select>
        </label>
        <label class="inline-field">
          <span>On divergence</span>
          <select value={onDiverge} onChange={(e) => setOnDiverge((e.target as HTMLSelectElement).value as 'stop' | 'live')}>
            <option value="stop">stop</option>
            <option value="live">continue live</option>
          </select>
        </label>
      </div>
      <ConfigField id="replay-config" value={config} onInput={setConfig} />
      <ErrorBox message={error} testId="replay-error" />
      <div class="run-form-buttons">
        <button type="submit" class="btn btn-primary btn-small" disabled={busy || name.trim() === ''}>
          {busy ? 'Starting...' : 'Start replay'}
        </button>
        <button type="button" class="btn btn-secondary btn-small" onClick={props.onCancel}>
          Cancel
        </button>
      </div>
    </form>
  );
}
