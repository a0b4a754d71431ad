// Repository view (docs/teams-that-write-code.md): the integration branch's log, each agent's branch
// ahead/behind, the merge queue, the claims in force, and a diff viewer. A hash `#/<project>/repository/
// <from>..<to>` (what the Team view's activation detail links to) opens that diff.
import { useEffect, useState } from 'preact/hooks';
import { errorText, getRepository, getRepositoryDiff, isTokenError, type Repository } from './api';
import { Chip, DiffText, Empty, ErrorBox, Panel } from './components';
import { clockTime } from './format';

const short = (commit: string | undefined) => (commit ?? '').slice(0, 12);

function rangeFromHash(): [string, string] | null {
  const segment = window.location.hash.replace(/^#\/?/, '').split('/')[2];
  if (!segment || !segment.includes('..')) return null;
  const [from, to] = decodeURIComponent(segment).split('..');
  return from && to ? [from, to] : null;
}

// The range a page opened with: read before the app rewrites its hash to `#/<project>/<view>`.
let openedWith = rangeFromHash();

function initialRange(): [string, string] | null {
  const range = rangeFromHash() ?? openedWith;
  openedWith = null;
  return range;
}

/** The link of an activation's commit range (Team view). */
export function commitRangeHash(project: string, from: string, to: string): string {
  return `#/${encodeURIComponent(project)}/repository/${encodeURIComponent(`${from}..${to}`)}`;
}

export function RepositoryView(props: { project: string; refresh: number }) {
  const [repo, setRepo] = useState<Repository | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [range, setRange] = useState<[string, string] | null>(initialRange);
  const [diff, setDiff] = useState<string | null>(null);
  const [cut, setCut] = useState(false); // the answer holds only the start of a longer diff
  const [diffError, setDiffError] = useState<string | null>(null);

  useEffect(() => {
    let live = true;
    getRepository(props.project)
      .then((answer) => {
        if (!live) return;
        setRepo(answer);
        setError(null);
        if (!range && answer.log.length > 1) setRange([answer.log[1].commit, answer.log[0].commit]);
      })
      .catch((caught) => live && !isTokenError(caught) && setError(errorText(caught)));
    return () => {
      live = false;
    };
  }, [props.project, props.refresh]);

  useEffect(() => {
    // A commit range linked while this view is open (the app then rewrites the address without it).
    const follow = () => {
      const linked = rangeFromHash();
      if (linked) setRange(linked);
    };
    window.addEventListener('hashchange', follow);
    return () => window.removeEventListener('hashchange', follow);
  }, []);

  useEffect(() => {
    if (!range) return;
    let live = true;
    setDiff(null);
    setDiffError(null);
    getRepositoryDiff(props.project, range[0], range[1])
      .then((answer) => {
        if (!live) return;
        setDiff(answer.diff);
        setCut(answer.truncated === true);
      })
      .catch((caught) => live && !isTokenError(caught) && setDiffError(errorText(caught)));
    return () => {
      live = false;
    };
  }, [props.project, range?.[0], range?.[1]]);

  if (!repo) {
    return (
      <Panel title="Repository" testId="repository-view">
        {error ? <ErrorBox message={error} /> : <Empty>Loading...</Empty>}
      </Panel>
    );
  }
  const waiting = repo.queue.filter((request) => request.status === 'queued' || request.status === 'running');
  return (
    <div class="repository-view" data-testid="repository-view">
      <Panel title={`Integration branch ${repo.branch}`} subtitle={`at ${short(repo.head)}`} testId="repository-log">
        <ol class="repo-log" role="list">
          {repo.log.map((entry, index) => (
            <li key={entry.commit} class="repo-log-item">
              <button
                type="button"
                class="link-button"
                title="Show this commit's diff"
                onClick={() => setRange([index + 1 < repo.log.length ? repo.log[index + 1].commit : `${entry.commit}~1`, entry.commit])}
              >
                <code>{short(entry.commit)}</code>
              </button>{' '}
              <strong>{entry.subject}</strong> <span class="muted">{entry.author}</span>
              {entry.date && <span class="muted"> · {clockTime(entry.date)}</span>}
            </li>
          ))}
        </ol>
      </Panel>
      <Panel title="Agent branches" subtitle={`${repo.branches.length} branches`} testId="repository-branches">
        {repo.branches.length === 0 ? (
          <Empty>No agent has worked yet</Empty>
        ) : (
          <table class="data-table">
            <thead>
              <tr>
                <th>Branch</th>
                <th>Head</th>
                <th>Ahead</th>
                <th>Behind</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {repo.branches.map((branch) => (
                <tr key={branch.name} data-testid="repository-branch">
                  <td>{branch.name}</td>
                  <td>
                    <code>{short(branch.head)}</code>
                  </td>
                  <td>{branch.ahead}</td>
                  <td>{branch.behind}</td>
                  <td>
                    <button type="button" class="btn btn-secondary btn-small" onClick={() => setRange([repo.branch, branch.name])}>
                      Diff against {repo.branch}
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
      </Panel>
      <Panel title="Merge queue" subtitle={`${waiting.length} waiting`} testId="repository-queue">
        {repo.queue.length === 0 ? (
          <Empty>No merge requested yet</Empty>
        ) : (
          <ul class="repo-queue" role="list">
            {repo.queue.map((request) => (
              <li key={request.id} data-testid="repository-request">
                <Chip tone={request.status === 'merged' ? 'green' : request.status === 'failed' ? 'red' : 'blue'}>
                  {request.status}
                  {request.reason ? `: ${request.reason}` : ''}
                </Chip>{' '}
                <strong>{request.agent}</strong> {request.message}
                {request.commit && request.status === 'merged' && <code> {short(request.commit)}</code>}
                {request.paths && request.paths.length > 0 && <span class="muted"> ({request.paths.join(', ')})</span>}
              </li>
            ))}
          </ul>
        )}
        {repo.claims.length > 0 && (
          <div class="team-detail-section">
            <h3>Claims</h3>
            <ul role="list">
              {repo.claims.map((claim) => (
                <li key={claim.id}>
                  <code>{claim.path}</code> by {claim.agent}: {claim.reason} (until {clockTime(claim.expiresAt)})
                </li>
              ))}
            </ul>
          </div>
        )}
      </Panel>
      <Panel
        title="Diff"
        subtitle={range ? `${short(range[0]) || range[0]} → ${short(range[1]) || range[1]}` : 'pick a commit or a branch'}
        testId="repository-diff"
      >
        {diffError !== null ? (
          <ErrorBox message={diffError} />
        ) : diff === null ? (
          <Empty>{range ? 'Loading...' : 'Nothing selected'}</Empty>
        ) : diff === '' ? (
          <Empty>No changes</Empty>
        ) : (
          <>
            <DiffText diff={diff} />
            {cut && (
              <p class="muted" data-testid="repository-diff-cut">
                The diff is longer than this: shown up to {diff.length.toLocaleString('en-US')} characters.
                `suzumio repo export` gives the whole repository.
              </p>
            )}
          </>
        )}
      </Panel>
    </div>
  );
}
