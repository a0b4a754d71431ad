// Overview view (docs/design/webui.md): metric strip, agent roster and the message composer.
// Rendered only from the lightweight project-list element; the composer posts one message.
import { useEffect, useState } from 'preact/hooks';
import {
  errorText,
  formatCost,
  isTokenError,
  sendMessage,
  type Agent,
  type EgressTotals,
  type Project,
  type Spend,
} from './api';
import { ApprovalsCard } from './approvals';
import { ErrorBox, Panel, StatusPill } from './components';
import { ConcurrencyCard, ResumeButton } from './concurrency';
import { EffectsCard } from './effects';
import { formatBytes, initials } from './format';

const PRIORITIES = ['P0', 'P1', 'P2', 'P3'];

export function agentLabel(agent: Agent): string {
  return `${agent.displayName || agent.id} / ${agent.id}`;
}

export function Overview(props: { project: Project; approvalPulse: number; onSent: () => void }) {
  return (
    <div class="overview">
      <MetricStrip project={props.project} />
      <ApprovalsCard project={props.project.id} pulse={props.approvalPulse} />
      <EffectsCard project={props.project.id} pulse={props.approvalPulse} />
      <ConcurrencyCard project={props.project} onResumed={props.onSent} />
      <div class="overview-grid">
        <Roster
          project={props.project.id}
          agents={props.project.agents ?? []}
          spend={props.project.agentSpend ?? {}}
          egress={props.project.agentEgress ?? {}}
          onResumed={props.onSent}
        />
        <Composer project={props.project} onSent={props.onSent} />
      </div>
    </div>
  );
}

function MetricStrip(props: { project: Project }) {
  const stats = props.project.stats ?? {};
  // What the controller saw the models spend (part of the project-list element).
  const spend = props.project.spend;
  const agents = props.project.agents ?? [];
  const runningAgents = agents.filter((agent) => agent.status === 'running').length;
  const failed = stats.failedActivationCount ?? 0;
  const egress = Object.values(props.project.agentEgress ?? {});
  const connections = egress.reduce((sum, totals) => sum + totals.connections, 0);
  const denied = egress.reduce((sum, totals) => sum + totals.denied, 0);
  const bytes = egress.reduce((sum, totals) => sum + totals.bytesIn + totals.bytesOut, 0);
  return (
    <div class="metric-strip" data-testid="metric-strip">
      <Metric label="Agents" value={agents.length} note={`${runningAgents} running now`} tone="blue" />
      <Metric label="Messages" value={stats.messageCount ?? 0} note="open Messages to inspect" tone="amber" />
      <Metric
        label="Activations"
        value={stats.activationCount ?? 0}
        note={`${stats.runningActivationCount ?? 0} running, ${failed} failed`}
        tone={failed > 0 ? 'red' : 'blue'}
      />
      <Metric label="Tools" value={stats.toolCallCount ?? 0} note="open Tool status for details" tone="blue" />
      {spend !== undefined && spend.calls > 0 && (
        <Metric
          label="Cost"
          value={formatCost(spend.costUsd) || '—'}
          note={`${spend.tokens} tokens${spend.cachedTokens ? ` (${spend.cachedTokens} cached)` : ''} in ${
            spend.calls
          } model calls`}
          tone="amber"
        />
      )}
      {egress.length > 0 && (
        <Metric
          label="Egress"
          value={connections}
          note={`${denied} denied, ${formatBytes(bytes)} through the controller`}
          tone={denied > 0 ? 'red' : 'blue'}
        />
      )}
    </div>
  );
}

function Metric(props: { label: string; value: number | string; note: string; tone: string }) {
  return (
    <div class="metric" data-testid={`metric-${props.label.toLowerCase()}`}>
      <div class="metric-label">{props.label}</div>
      <div class={`metric-value tone-${props.tone}`} data-testid="metric-value">
        {String(props.value)}
      </div>
      <div class="metric-note">{props.note}</div>
    </div>
  );
}

function agentTone(status: string): string {
  if (status === 'running') return 'running';
  if (status === 'ready') return 'ready';
  if (status === 'failed' || status === 'stopped') return 'failed';
  return 'quiet';
}

export function egressSummary(totals: EgressTotals): string {
  return `egress ${totals.connections} out, ${totals.denied} denied, ${formatBytes(totals.bytesIn + totals.bytesOut)}`;
}

function Roster(props: {
  project: string;
  agents: Agent[];
  spend: Record<string, Spend>;
  egress: Record<string, EgressTotals>;
  onResumed: () => void;
}) {
  return (
    <Panel
      title="Agent roster"
      subtitle={`${props.agents.length} ${props.agents.length === 1 ? 'agent' : 'agents'} with live status`}
      className="roster-panel"
      testId="roster"
    >
      {props.agents.length === 0 ? (
        <div class="empty">No agents configured</div>
      ) : (
        <ul class="roster" role="list">
          {props.agents.map((agent) => {
            const name = agent.displayName || agent.id;
            const cost = formatCost(props.spend[agent.id]?.costUsd);
            return (
              <li class={`agent-card agent-${agentTone(agent.status)}`} key={agent.id} data-testid="agent-card">
                <span class="avatar" aria-hidden="true" data-testid="agent-avatar">
                  {initials(name)}
                </span>
                <div class="agent-main">
                  <div class="agent-name-row">
                    <strong class="agent-name" data-testid="agent-name">
                      {name}
                    </strong>
                    <StatusPill status={agent.status} compact testId="agent-status" />
                  </div>
                  <div class="agent-role" data-testid="agent-role">
                    {agent.role ?? ''}
                  </div>
                  <div class="agent-id mono" data-testid="agent-id">
                    {agent.activeActivationId ? `${agent.id} - ${agent.activeActivationId}` : agent.id}
                  </div>
                  {cost && (
                    <div class="agent-cost" data-testid="agent-cost">
                      {cost} in {props.spend[agent.id].calls} model calls
                    </div>
                  )}
                  {props.egress[agent.id] && (
                    <div
                      class={`agent-egress${props.egress[agent.id].denied > 0 ? ' agent-egress-denied' : ''}`}
                      data-testid="agent-egress"
                    >
                      {egressSummary(props.egress[agent.id])}
                    </div>
                  )}
                  {agent.paused && (
                    <PausedMark project={props.project} agentId={agent.id} rule={agent.paused.rule}
                      onResumed={props.onResumed} />
                  )}
                </div>
              </li>
            );
          })}
        </ul>
      )}
    </Panel>
  );
}

/** A loop guard paused this agent: which rule, and Resume. */
function PausedMark(props: { project: string; agentId: string; rule: string; onResumed: () => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  return (
    <div class="agent-paused-row" data-testid="agent-paused">
      <span class="agent-paused">{`paused (${props.rule})`}</span>{' '}
      <ResumeButton project={props.project} agentId={props.agentId} busy={busy} setBusy={setBusy} setError={setError}
        onResumed={props.onResumed} />
      <ErrorBox message={error} testId="agent-resume-error" />
    </div>
  );
}

function Composer(props: { project: Project; onSent: () => void }) {
  const agents = props.project.agents ?? [];
  const firstAgent = agents[0]?.id ?? 'pm';
  const [recipient, setRecipient] = useState(firstAgent);
  const [priority, setPriority] = useState('P3');
  const [body, setBody] = useState('');
  const [sending, setSending] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const rosterKey = agents.map((agent) => agent.id).join('\n');
  useEffect(() => {
    if (!agents.some((agent) => agent.id === recipient)) setRecipient(firstAgent);
  }, [props.project.id, rosterKey]);

  const trimmed = body.trim();

  async function submit(event: Event) {
    event.preventDefault();
    if (trimmed === '' || sending) return;
    setSending(true);
    setError(null);
    try {
      await sendMessage(props.project.id, { recipient, priority, body: trimmed });
      setBody('');
      props.onSent();
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setSending(false);
    }
  }

  return (
    <Panel
      title="Send a signal"
      subtitle="Sends a direct message to one agent and wakes it if it is idle."
      className="composer-panel"
      testId="composer"
    >
      <form class="composer" onSubmit={submit}>
        <div class="composer-row">
          <div class="field">
            <label for="composer-recipient">Recipient</label>
            <select
              id="composer-recipient"
              value={recipient}
              onChange={(event) => setRecipient((event.target as HTMLSelectElement).value)}
            >
              {agents.map((agent) => (
                <option key={agent.id} value={agent.id}>
                  {agentLabel(agent)}
                </option>
              ))}
            </select>
          </div>
          <div class="field field-narrow">
            <label for="composer-priority">Priority</label>
            <select
              id="composer-priority"
              value={priority}
              onChange={(event) => setPriority((event.target as HTMLSelectElement).value)}
            >
              {PRIORITIES.map((value) => (
                <option key={value} value={value}>
                  {value}
                </option>
              ))}
            </select>
          </div>
        </div>
        <div class="field">
          <label for="composer-message">Message</label>
          <textarea
            id="composer-message"
            rows={5}
            value={body}
            placeholder="Instructions, questions or context for the agent..."
            onInput={(event) => setBody((event.target as HTMLTextAreaElement).value)}
          />
        </div>
        <ErrorBox message={error} testId="composer-error" />
        <button type="submit" class="btn btn-primary btn-block" disabled={sending || trimmed === ''}>
          {sending ? 'Sending...' : 'Send message'}
        </button>
      </form>
    </Panel>
  );
}
