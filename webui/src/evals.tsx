// The Evals page (docs/evals.md): every kept eval, one eval as a runs × tasks matrix coloured by verdict
// (each cell opens its run's project in the Team view), and two evals compared task by task with the
// one-sided Fisher test the CLI uses for regressions. Reads GET /api/evals and GET /api/evals/:id only.
import { useEffect, useState } from 'preact/hooks';
import { errorText, getEval, listEvals, type EvalDocument, type EvalRun, type EvalSummary } from './api';
import { Empty, ErrorBox, Panel } from './components';

const POLL_MS = 3000;

function comb(n: number, k: number): number {
  if (k < 0 || k > n) return 0;
  let value = 1;
  for (let i = 1; i <= k; i += 1) value = (value * (n - k + i)) / i;
  return value;
}

/** One-sided Fisher exact p that the second pass rate is lower than the first. */
export function fisherLower(basePassed: number, baseRuns: number, passed: number, runs: number): number {
  const total = baseRuns + runs;
  const successes = basePassed + passed;
  let p = 0;
  for (let x = 0; x <= passed; x += 1) p += comb(successes, x) * comb(total - successes, runs - x);
  return p / comb(total, runs);
}

function rate(value: number | null | undefined): string {
  return value === null || value === undefined ? '-' : `${Math.round(value * 100)}%`;
}

function verdict(run: EvalRun | undefined): string {
  if (!run) return 'none';
  if (run.status !== 'graded') return run.status;
  return run.passed ? 'pass' : 'fail';
}

function cellTitle(run: EvalRun): string {
  const failed = run.grades.filter((grade) => !grade.passed);
  const lines = [`${run.project}: ${verdict(run)}`];
  for (const grade of failed) lines.push(`${grade.kind}: ${grade.evidence}`);
  if (run.error) lines.push(run.error);
  return lines.join('\n');
}

function Matrix(props: { doc: EvalDocument; onOpen: (project: string) => void }) {
  const { doc } = props;
  const width = Math.max(1, ...doc.results.map((row) => doc.runs.filter((r) => r.task === row.task && r.variant === row.variant).length));
  return (
    <table class="eval-matrix" data-testid="eval-matrix">
      <thead>
        <tr>
          <th>task</th>
          <th>variant</th>
          {Array.from({ length: width }, (_, i) => (
            <th key={i}>run {i + 1}</th>
          ))}
          <th>pass</th>
          <th>pass^k</th>
          <th>95% interval</th>
        </tr>
      </thead>
      <tbody>
        {doc.results.map((row) => {
          const runs = doc.runs.filter((r) => r.task === row.task && r.variant === row.variant);
          const k = String(row.runs);
          return (
            <tr key={`${row.task}/${row.variant}`}>
              <td class="mono">{row.task}</td>
              <td class="mono">{row.variant}</td>
              {Array.from({ length: width }, (_, i) => {
                const run = runs.find((r) => r.index === i);
                return (
                  <td key={i}>
                    {run ? (
                      <button
                        type="button"
                        class={`eval-cell eval-${verdict(run)}`}
                        data-testid="eval-cell"
                        data-verdict={verdict(run)}
                        title={cellTitle(run)}
                        onClick={() => props.onOpen(run.project)}
                      >
                        {verdict(run)}
                      </button>
                    ) : null}
                  </td>
                );
              })}
              <td>
                {row.passed}/{row.runs} {row.flaky ? <span class="chip chip-amber">flaky</span> : null}
              </td>
              <td>{rate(row.passPowK[k])}</td>
              <td>
                {rate(row.interval[0])}–{rate(row.interval[1])}
              </td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

function Comparison(props: { a: EvalDocument; b: EvalDocument }) {
  const rows = props.a.results.map((row) => {
    const other = props.b.results.find((item) => item.task === row.task && item.variant === row.variant);
    const p = other && other.runs && row.runs ? fisherLower(other.passed, other.runs, row.passed, row.runs) : null;
    const regressed = p !== null && (row.passRate ?? 0) < (other?.passRate ?? 0) && p < 0.05;
    return { row, other, p, regressed };
  });
  return (
    <table class="eval-compare" data-testid="eval-compare">
      <thead>
        <tr>
          <th>task</th>
          <th>variant</th>
          <th>{props.b.id}</th>
          <th>{props.a.id}</th>
          <th>change</th>
        </tr>
      </thead>
      <tbody>
        {rows.map(({ row, other, p, regressed }) => (
          <tr key={`${row.task}/${row.variant}`} class={regressed ? 'eval-regressed' : undefined}>
            <td class="mono">{row.task}</td>
            <td class="mono">{row.variant}</td>
            <td>{other ? `${other.passed}/${other.runs} (${rate(other.passRate)})` : '-'}</td>
            <td>
              {row.passed}/{row.runs} ({rate(row.passRate)})
            </td>
            <td data-testid="eval-change">
              {regressed ? `regression (p=${p!.toFixed(3)})` : p === null ? '-' : 'no significant drop'}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function EvalsPage(props: { onOpen: (project: string) => void }) {
  const [evals, setEvals] = useState<EvalSummary[] | null>(null);
  const [chosen, setChosen] = useState<string>('');
  const [against, setAgainst] = useState<string>('');
  const [doc, setDoc] = useState<EvalDocument | null>(null);
  const [other, setOther] = useState<EvalDocument | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    let stale = false;
    const load = () =>
      listEvals()
        .then((list) => {
          if (stale) return;
          setEvals(list);
          setChosen((old) => old || (list.length ? list[list.length - 1].id : ''));
        })
        .catch((caught) => !stale && setError(errorText(caught)));
    void load();
    const timer = window.setInterval(load, POLL_MS);
    return () => {
      stale = true;
      window.clearInterval(timer);
    };
  }, []);

  useEffect(() => {
    if (!chosen) return;
    let stale = false;
    const load = () =>
      getEval(chosen)
        .then((value) => !stale && setDoc(value))
        .catch((caught) => !stale && setError(errorText(caught)));
    void load();
    const timer = window.setInterval(load, POLL_MS);
    return () => {
      stale = true;
      window.clearInterval(timer);
    };
  }, [chosen]);

  useEffect(() => {
    if (!against) {
      setOther(null);
      return;
    }
    let stale = false;
    getEval(against)
      .then((value) => !stale && setOther(value))
      .catch((caught) => !stale && setError(errorText(caught)));
    return () => {
      stale = true;
    };
  }, [against]);

  if (evals !== null && evals.length === 0) {
    return (
      <Panel title="Evals" testId="evals-page">
        <Empty>No evals yet. Run `suzumio eval SUITE` with serve running (docs/evals.md).</Empty>
      </Panel>
    );
  }
  const progress = doc?.progress;
  return (
    <div class="evals-page" data-testid="evals-page">
      <ErrorBox message={error} />
      <Panel
        title="Evals"
        subtitle={doc ? `${doc.suite} · ${doc.mode} · ${doc.status} · ${progress?.done}/${progress?.runs} runs, ${progress?.passed} passing, ${progress?.tokens} tokens` : 'Loading'}
        actions={
          <>
            <label class="eval-pick">
              eval{' '}
              <select value={chosen} onChange={(event) => setChosen((event.target as HTMLSelectElement).value)}>
                {(evals ?? []).map((item) => (
                  <option key={item.id} value={item.id}>
                    {item.id} · {item.suite} · {item.mode} · {item.passed}/{item.runs}
                  </option>
                ))}
              </select>
            </label>
            <label class="eval-pick">
              compare with{' '}
              <select value={against} onChange={(event) => setAgainst((event.target as HTMLSelectElement).value)}>
                <option value="">none</option>
                {(evals ?? [])
                  .filter((item) => item.id !== chosen)
                  .map((item) => (
                    <option key={item.id} value={item.id}>
                      {item.id} · {item.suite} · {item.passed}/{item.runs}
                    </option>
                  ))}
              </select>
            </label>
          </>
        }
      >
        {doc ? <Matrix doc={doc} onOpen={props.onOpen} /> : null}
      </Panel>
      {doc && other ? (
        <Panel title="Comparison" subtitle={`${doc.id} against ${other.id}: one-sided Fisher test, p < 0.05`}>
          <Comparison a={doc} b={other} />
        </Panel>
      ) : null}
    </div>
  );
}
