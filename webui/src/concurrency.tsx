// Concurrency card on the overview (docs/operations.md#runaways): the project's and the root's caps, what
// runs, the agents whose signals wait on a full cap, and the agents a loop guard paused, each with Resume.
// Reloads whenever the project element is reloaded (every stream event or poll); shown only when a cap is
// set or an agent is paused.
import { useEffect, useRef, useState } from 'preact/hooks';
import { errorText, getConcurrency, isTokenError, resumeAgent, type Concurrency, type Project } from './api';
import { ErrorBox, Panel } from './components';

export function ConcurrencyCard(props: { project: Project; onResumed: () => void }) {
  const [shown, setShown] = useState<Concurrency | null>(null);
  const [error, setError] = useState<string | null>(null);
  const sequence = useRef(0);
  const id = props.project.id;

  async function load() {
    const request = ++sequence.current;
    try {
      const answer = await getConcurrency(id);
      if (request !== sequence.current) return;
      setShown(answer);
      setError(null);
    } catch (caught) {
      if (request === sequence.current && !isTokenError(caught)) setError(errorText(caught));
    }
  }

  useEffect(() => {
    void load();
  }, [props.project]);

  if (shown === null && error === null) return null;
  const capped = shown?.maxConcurrentActivations !== undefined || shown?.rootMaxActivations !== undefined;
  if (shown !== null && !capped && shown.paused.length === 0 && error === null) return null;
  return (
    <Panel
      title="Concurrency"
      subtitle={shown && shown.waiting.length > 0 ? `${shown.waiting.length} waiting on a full cap` : 'caps and paused agents'}
      className="concurrency-panel"
      testId="concurrency-card"
    >
      <ErrorBox message={error} testId="concurrency-error" />
      {shown && (
        <>
          <dl class="concurrency-caps">
            <div>
              <dt>Running</dt>
              <dd data-testid="concurrency-running">
                {shown.maxConcurrentActivations !== undefined
                  ? `${shown.running} of ${shown.maxConcurrentActivations}`
                  : String(shown.running)}
              </dd>
            </div>
            {shown.rootMaxActivations !== undefined && (
              <div>
                <dt>Whole root</dt>
                <dd data-testid="concurrency-root">{`${shown.rootRunning ?? 0} of ${shown.rootMaxActivations}`}</dd>
              </div>
            )}
          </dl>
          {shown.waiting.length > 0 && (
            <>
              <h3 class="concurrency-heading">Waiting on the cap</h3>
              <ul class="concurrency-list" role="list">
                {shown.waiting.map((wait) => (
                  <li key={wait.agentId} data-testid="concurrency-waiting">
                    <strong>{wait.agentId}</strong>
                    <span class="paused-reason">
                      {`${wait.signals} ${wait.signals === 1 ? 'signal' : 'signals'} since ${wait.since} (${wait.cap} cap)`}
                    </span>
                  </li>
                ))}
              </ul>
            </>
          )}
          {shown.paused.length > 0 && (
            <>
              <h3 class="concurrency-heading">Paused by a loop guard</h3>
              <ul class="concurrency-list" role="list">
                {shown.paused.map((pause) => (
                  <PausedItem
                    key={pause.agentId}
                    project={id}
                    agentId={pause.agentId}
                    text={`${pause.rule}: ${pause.reason ?? ''}`}
                    onResumed={() => {
                      void load();
                      props.onResumed();
                    }}
                  />
                ))}
              </ul>
            </>
          )}
        </>
      )}
    </Panel>
  );
}

function PausedItem(props: { project: string; agentId: string; text: string; onResumed: () => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  return (
    <li data-testid="concurrency-paused">
      <strong>{props.agentId}</strong>
      <span class="paused-reason">{props.text}</span>
      <ResumeButton project={props.project} agentId={props.agentId} busy={busy} setBusy={setBusy} setError={setError}
        onResumed={props.onResumed} />
      <ErrorBox message={error} testId="resume-error" />
    </li>
  );
}

export function ResumeButton(props: {
  project: string;
  agentId: string;
  busy: boolean;
  setBusy: (busy: boolean) => void;
  setError: (error: string | null) => void;
  onResumed: () => void;
}) {
  async function resume() {
    if (props.busy) return;
    props.setBusy(true);
    props.setError(null);
    try {
      await resumeAgent(props.project, props.agentId);
      props.onResumed();
    } catch (caught) {
      if (!isTokenError(caught)) props.setError(errorText(caught));
    } finally {
      props.setBusy(false);
    }
  }
  return (
    <button type="button" class="btn btn-primary btn-small" disabled={props.busy} onClick={resume}
      data-testid="resume-agent">
      Resume
    </button>
  );
}
