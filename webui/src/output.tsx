// The Output view (docs/design/webui.md): the team's final report rendered as Markdown, and a file
// browser over every agent's artifact folder: each file opened in place (text rendered, anything else
// downloaded), its versions from the flight recorder, and a diff between two of them.
import { useEffect, useState } from 'preact/hooks';
import {
  errorText,
  getArtifact,
  getArtifactBlob,
  getArtifactDiff,
  getReport,
  isTokenError,
  listArtifacts,
  type ArtifactContent,
  type ArtifactDiff,
  type ArtifactFile,
  type Project,
  type Report,
} from './api';
import { DiffText, Empty, ErrorBox, Panel, StatusPill } from './components';
import { formatBytes } from './format';
import { Markdown } from './markdown';

function useLoad<T>(load: () => Promise<T>, deps: unknown[]): { value: T | null; error: string | null; busy: boolean } {
  const [state, setState] = useState<{ value: T | null; error: string | null; busy: boolean }>({
    value: null,
    error: null,
    busy: true,
  });
  useEffect(() => {
    let live = true;
    setState((old) => ({ ...old, busy: true }));
    load().then(
      (value) => live && setState({ value, error: null, busy: false }),
      (caught) => live && setState({ value: null, error: isTokenError(caught) ? null : errorText(caught), busy: false }),
    );
    return () => {
      live = false;
    };
  }, deps);
  return state;
}

export function OutputView(props: { project: Project }) {
  const { project } = props;
  return (
    <div class="output-view">
      <ReportPanel project={project} />
      <ArtifactBrowser project={project} />
    </div>
  );
}

/** The final report; reloaded when the project's status or report path changes. */
export function ReportPanel(props: { project: Project; compact?: boolean }) {
  const { project } = props;
  const report = useLoad<Report>(() => getReport(project.id), [project.id, project.status, project.submitted_report]);
  const text = report.value?.report ?? null;
  const subtitle =
    project.status === 'submitted'
      ? 'Report awaiting review: approve it or request changes above.'
      : text === null
        ? 'The team has not submitted a report yet.'
        : project.status === 'running'
          ? 'The last submitted report; the team is back at work on it.'
          : `Submitted; the project is ${project.status}.`;
  return (
    <Panel title="Final report" subtitle={subtitle} busy={report.busy} testId="report-panel" actions={<StatusPill status={project.status} compact />}>
      <ErrorBox message={report.error} testId="report-error" />
      {text !== null ? (
        <Markdown source={text} testId="report-body" />
      ) : (
        !report.busy && <Empty testId="report-empty">No report submitted.</Empty>
      )}
    </Panel>
  );
}

function isMarkdown(path: string): boolean {
  return /\.(md|markdown)$/i.test(path);
}

function ArtifactBrowser(props: { project: Project }) {
  const { project } = props;
  const [nonce, setNonce] = useState(0);
  const files = useLoad<ArtifactFile[]>(() => listArtifacts(project.id), [project.id, nonce, project.updated_at]);
  const [open, setOpen] = useState<string | null>(null);
  const list = files.value ?? [];
  const agents = [...new Set(list.map((file) => file.agent))];
  const selected = list.find((file) => `${file.agent}/${file.path}` === open) ?? null;
  return (
    <Panel
      title="Artifacts"
      subtitle={`${list.length} file${list.length === 1 ? '' : 's'} in ${agents.length} agent folder${agents.length === 1 ? '' : 's'}`}
      busy={files.busy}
      testId="artifacts-panel"
      actions={
        <button type="button" class="btn btn-secondary btn-small" onClick={() => setNonce((n) => n + 1)}>
          Reload files
        </button>
      }
    >
      <ErrorBox message={files.error} testId="artifacts-error" />
      {list.length === 0 && !files.busy ? (
        <Empty testId="artifacts-empty">No agent has written an artifact yet.</Empty>
      ) : (
        <div class="artifact-browser">
          <nav class="artifact-tree" aria-label="Artifact files" data-testid="artifact-tree">
            {agents.map((agent) => (
              <div class="artifact-folder" key={agent}>
                <div class="artifact-folder-name mono">{`${agent}/`}</div>
                {list
                  .filter((file) => file.agent === agent)
                  .map((file) => {
                    const key = `${file.agent}/${file.path}`;
                    return (
                      <button
                        type="button"
                        key={key}
                        class={`artifact-file${key === open ? ' is-active' : ''}`}
                        aria-current={key === open ? 'true' : undefined}
                        data-testid="artifact-file"
                        data-path={key}
                        onClick={() => setOpen(key)}
                      >
                        <span class="mono artifact-file-name">{file.path}</span>
                        <span class="artifact-file-meta">
                          {`${formatBytes(file.size)} · ${file.versions} version${file.versions === 1 ? '' : 's'}`}
                        </span>
                      </button>
                    );
                  })}
              </div>
            ))}
          </nav>
          <div class="artifact-pane">
            {selected ? (
              <ArtifactViewer key={open ?? ''} project={project.id} file={selected} />
            ) : (
              <Empty>Choose a file to open it.</Empty>
            )}
          </div>
        </div>
      )}
    </Panel>
  );
}

function download(blob: Blob, name: string) {
  const url = URL.createObjectURL(blob);
  const link = document.createElement('a');
  link.href = url;
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  window.setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function ArtifactViewer(props: { project: string; file: ArtifactFile }) {
  const { project, file } = props;
  const path = `${file.agent}/${file.path}`;
  // null: the file as it is now
  const [version, setVersion] = useState<number | null>(null);
  const [raw, setRaw] = useState(false);
  const content = useLoad<ArtifactContent>(() => getArtifact(project, path, version), [project, path, version]);
  const [downloadError, setDownloadError] = useState<string | null>(null);
  const shown = content.value;
  const versions = Array.from({ length: file.versions }, (_, i) => i + 1);

  async function save() {
    setDownloadError(null);
    try {
      download(await getArtifactBlob(project, path, version), file.path.split('/').pop() || 'artifact');
    } catch (caught) {
      if (!isTokenError(caught)) setDownloadError(errorText(caught));
    }
  }

  return (
    <div class="artifact-viewer" data-testid="artifact-viewer" data-path={path}>
      <div class="artifact-head">
        <span class="mono artifact-path" title={path}>
          {path}
        </span>
        <label class="artifact-version">
          <span>Version</span>
          <select
            data-testid="artifact-version"
            value={version === null ? 'now' : String(version)}
            onChange={(event) => {
              const value = (event.target as HTMLSelectElement).value;
              setVersion(value === 'now' ? null : Number(value));
            }}
          >
            <option value="now">Now</option>
            {versions.map((v) => (
              <option key={v} value={String(v)}>{`Version ${v}`}</option>
            ))}
          </select>
        </label>
        {shown && !shown.binary && isMarkdown(path) && (
          <button type="button" class="btn btn-secondary btn-small" onClick={() => setRaw(!raw)}>
            {raw ? 'Rendered' : 'Source'}
          </button>
        )}
        <button type="button" class="btn btn-secondary btn-small" data-testid="artifact-download" onClick={save}>
          Download
        </button>
      </div>
      <ErrorBox message={content.error ?? downloadError} testId="artifact-error" />
      {shown && (
        <div class="artifact-meta">
          {`${formatBytes(shown.size)} · ${shown.version === null ? 'not recorded yet' : `version ${shown.version} of ${shown.versions}`}`}
        </div>
      )}
      {shown &&
        (shown.binary || shown.content === null ? (
          <Empty testId="artifact-binary">Not text: use Download to open it.</Empty>
        ) : isMarkdown(path) && !raw ? (
          <div class="artifact-content">
            <Markdown source={shown.content} testId="artifact-content" />
          </div>
        ) : (
          <pre class="artifact-content artifact-text" data-testid="artifact-content">
            {shown.content}
          </pre>
        ))}
      {file.versions > 0 && <VersionDiff project={project} path={path} versions={file.versions} />}
    </div>
  );
}

function VersionDiff(props: { project: string; path: string; versions: number }) {
  const { project, path, versions } = props;
  const [from, setFrom] = useState(1);
  const [to, setTo] = useState<number | null>(null);
  const [diff, setDiff] = useState<ArtifactDiff | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const numbers = Array.from({ length: versions }, (_, i) => i + 1);

  async function compare() {
    setBusy(true);
    setError(null);
    try {
      setDiff(await getArtifactDiff(project, path, from, to));
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setBusy(false);
    }
  }

  return (
    <div class="artifact-diff" data-testid="artifact-diff">
      <div class="artifact-diff-controls">
        <span class="artifact-diff-label">Compare</span>
        <select aria-label="From version" data-testid="diff-from" value={String(from)} onChange={(e) => setFrom(Number((e.target as HTMLSelectElement).value))}>
          {numbers.map((v) => (
            <option key={v} value={String(v)}>{`Version ${v}`}</option>
          ))}
        </select>
        <span>with</span>
        <select
          aria-label="To version"
          data-testid="diff-to"
          value={to === null ? 'now' : String(to)}
          onChange={(e) => {
            const value = (e.target as HTMLSelectElement).value;
            setTo(value === 'now' ? null : Number(value));
          }}
        >
          {numbers.map((v) => (
            <option key={v} value={String(v)}>{`Version ${v}`}</option>
          ))}
          <option value="now">Now</option>
        </select>
        <button type="button" class="btn btn-secondary btn-small" disabled={busy} data-testid="diff-run" onClick={compare}>
          Show diff
        </button>
      </div>
      <ErrorBox message={error} testId="diff-error" />
      {diff &&
        (diff.diff === '' ? (
          <Empty testId="diff-same">The two versions are the same.</Empty>
        ) : (
          <DiffText diff={diff.diff} testId="diff-text" />
        ))}
    </div>
  );
}
