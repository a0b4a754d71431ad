// Start from the page (docs/design/webui.md): paste or upload a project file, see the errors
// `config render` would print (each with its dotted path), then initialize it and start it.
import { useState } from 'preact/hooks';
import { checkConfig, createProject, errorText, isTokenError, type ConfigCheck } from './api';
import { ErrorBox, Panel } from './components';

export function NewProject(props: { onCreated: (project: string) => void; onClose: () => void }) {
  const [text, setText] = useState('');
  const [check, setCheck] = useState<ConfigCheck | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  function edit(value: string) {
    setText(value);
    setCheck(null);
    setError(null);
  }

  async function run<T>(work: () => Promise<T>): Promise<T | null> {
    setBusy(true);
    setError(null);
    try {
      return await work();
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
      return null;
    } finally {
      setBusy(false);
    }
  }

  async function upload(event: Event) {
    const file = (event.target as HTMLInputElement).files?.[0];
    if (file) edit(await file.text());
  }

  async function create(start: boolean) {
    const checked = await run(() => checkConfig(text));
    if (!checked) return;
    setCheck(checked);
    if (!checked.valid) return;
    const created = await run(() => createProject(text, start));
    if (created) props.onCreated(created.id);
  }

  return (
    <Panel
      title="New project"
      subtitle="Paste or upload a project file; it is checked as `suzumio config render` checks it."
      testId="new-project"
      busy={busy}
      actions={
        <button type="button" class="btn btn-secondary btn-small" onClick={props.onClose}>
          Close
        </button>
      }
    >
      <div class="new-project">
        <div class="field">
          <label for="new-project-file">Project file (YAML)</label>
          <textarea
            id="new-project-file"
            class="mono new-project-text"
            rows={16}
            spellcheck={false}
            value={text}
            placeholder={'name: my-team\ntask: ...\nagents:\n  pm:\n    tools: [messages.send, completion.submit]'}
            onInput={(e) => edit((e.target as HTMLTextAreaElement).value)}
          />
        </div>
        <label class="new-project-upload">
          <span>Or upload a file</span>
          <input type="file" accept=".yaml,.yml,text/yaml" data-testid="new-project-upload" onChange={upload} />
        </label>
        <p class="run-form-note">
          The file is read on the server in a folder of its own: `@import`, `extends` and relative paths reach
          only that folder, and {'`${VAR}`'} placeholders read no environment.
        </p>
        <div class="run-form-buttons">
          <button
            type="button"
            class="btn btn-secondary"
            disabled={busy || text.trim() === ''}
            data-testid="new-project-check"
            onClick={() => void run(() => checkConfig(text)).then((checked) => checked && setCheck(checked))}
          >
            Check
          </button>
          <button type="button" class="btn btn-secondary" disabled={busy || text.trim() === ''} onClick={() => void create(false)}>
            Initialize
          </button>
          <button type="button" class="btn btn-primary" disabled={busy || text.trim() === ''} onClick={() => void create(true)}>
            Initialize and start
          </button>
        </div>
        <ErrorBox message={error} testId="new-project-error" />
        {check && !check.valid && (
          <div class="config-errors" role="alert" data-testid="config-errors">
            <strong>{`${check.errors.length} error${check.errors.length === 1 ? '' : 's'}`}</strong>
            <ul>
              {check.errors.map((line, index) => (
                <li key={index} class="mono" data-testid="config-error">
                  {line}
                </li>
              ))}
            </ul>
          </div>
        )}
        {check?.valid && (
          <div class="config-ok" data-testid="config-ok">
            <strong>{`Valid: ${check.name} with ${check.agents?.length ?? 0} agents (${(check.agents ?? []).join(', ')})`}</strong>
            {[...(check.warnings ?? []), ...(check.unknownKeys ?? []).map((key) => `Unknown key: ${key}`)].map((line, index) => (
              <div key={index} class="config-warning">
                {line}
              </div>
            ))}
          </div>
        )}
      </div>
    </Panel>
  );
}
