// Activations + context view (docs/design/webui.md): recent work cycles newest first, with reported token
// usage, and the model context window of one activation fetched on demand.
import { useEffect, useState } from 'preact/hooks';
import {
  errorText,
  formatCost,
  getActivationContext,
  getCosts,
  isTokenError,
  type Activation,
  type ActivationContext,
  type Costs,
} from './api';
import { Chip, Empty, ErrorBox, Panel, StatusPill } from './components';
import { ForkButton } from './runs';
import { activationDuration, count, readUsage, relativeTime, utcTitle, type TokenUsage } from './format';

export function ActivationsView(props: {
  project: string;
  activations: Activation[] | null;
  loading: boolean;
  now: number;
}) {
  const [context, setContext] = useState<ActivationContext | null>(null);
  const [contextLoading, setContextLoading] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  // What the controller saw each activation's model calls cost (only when a preset has prices).
  const [costs, setCosts] = useState<Costs | null>(null);
  useEffect(() => {
    let current = true;
    getCosts(props.project)
      .then((result) => current && setCosts(result))
      .catch(() => current && setCosts(null));
    return () => {
      current = false;
    };
  }, [props.project, props.activations]);
  const list = props.activations ?? [];
  const newestFirst = [...list].reverse();
  const totalTokens = list.reduce((sum, activation) => sum + (readUsage(activation)?.total ?? 0), 0);

  async function viewContext(id: string) {
    setContextLoading(id);
    setContext(null);
    setError(null);
    try {
      const result = await getActivationContext(props.project, id);
      setContext(result);
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setContextLoading(null);
    }
  }

  return (
    <div class="stack">
      <Panel
        title="Activations"
        subtitle={props.loading ? 'Loading...' : `${list.length} recent work cycles`}
        busy={props.loading}
        testId="activations-panel"
        actions={
          totalTokens > 0 ? (
            <span class="header-stat" data-testid="activations-token-total">
              {`${count(totalTokens)} tokens reported`}
            </span>
          ) : undefined
        }
      >
        {newestFirst.length === 0 ? (
          <Empty>{props.loading ? 'Loading...' : 'No activations yet'}</Empty>
        ) : (
          <ol class="activation-list" role="list">
            {newestFirst.map((activation) => (
              <ActivationItem
                key={activation.id}
                project={props.project}
                activation={activation}
                now={props.now}
                loading={contextLoading === activation.id}
                selected={context?.activation?.id === activation.id}
                cost={formatCost(costs?.activations[activation.id]?.costUsd)}
                onView={viewContext}
              />
            ))}
          </ol>
        )}
        <ErrorBox message={error} testId="activations-error" />
      </Panel>
      {contextLoading !== null && (
        <Panel title="Model context" testId="context-loading">
          <Empty>Loading context...</Empty>
        </Panel>
      )}
      {context && <ContextPanel context={context} now={props.now} onClose={() => setContext(null)} />}
    </div>
  );
}

function ActivationItem(props: {
  project: string;
  activation: Activation;
  now: number;
  loading: boolean;
  selected: boolean;
  cost: string;
  onView: (id: string) => void;
}) {
  const { activation } = props;
  const usage = readUsage(activation);
  const result = activation.error ?? activation.text ?? 'No result text recorded.';
  const ran = activationDuration(activation, props.now);
  let line = `${relativeTime(activation.startedAt, props.now)} - ${activation.completedAt ? 'ran' : 'running for'} ${ran} - ${activation.emittedMessages ?? 0} emitted messages`;
  if (activation.hasContext) line += ' - context recorded';
  if (props.cost) line += ` - ${props.cost}`;
  return (
    <li
      class={`activation-item status-${activation.status}${props.selected ? ' is-selected' : ''}`}
      data-testid="activation-item"
      data-activation-id={activation.id}
    >
      <div class="activation-head">
        <strong class="activation-agent">{activation.agentId}</strong>
        <StatusPill status={activation.status} compact />
        <span class="mono meta-id">{activation.id}</span>
        <button
          type="button"
          class="btn btn-mini activation-context-btn"
          disabled={props.loading}
          onClick={() => props.onView(activation.id)}
        >
          View context
        </button>
      </div>
      <div class="activation-line" data-testid="activation-line" title={`started ${utcTitle(activation.startedAt) ?? ''}`}>
        {line}
      </div>
      {usage && <UsageRow usage={usage} />}
      {activation.status !== 'running' && <ForkButton project={props.project} activation={activation.id} />}
      <div class={`activation-result prewrap${activation.error ? ' is-error' : ''}`} data-testid="activation-result">
        {result}
      </div>
    </li>
  );
}

function UsageRow(props: { usage: TokenUsage }) {
  const { usage } = props;
  const model = usage.apiModel ?? usage.model ?? usage.selectedModel;
  const parts: [string, number | undefined][] = [
    ['in', usage.input],
    ['out', usage.output],
    ['reasoning', usage.reasoning],
    ['cache read', usage.cacheRead],
    ['cache write', usage.cacheWrite],
  ];
  return (
    <div class="usage-row" data-testid="activation-usage">
      <span class="usage-total">{`${count(usage.total)} tokens`}</span>
      {parts
        .filter(([, value]) => typeof value === 'number')
        .map(([label, value]) => (
          <span class="usage-part" key={label}>
            {`${label} ${count(value)}`}
          </span>
        ))}
      {model && (
        <span class="usage-model mono" title={usage.selectedModel ? `preset ${usage.selectedModel}` : undefined}>
          {model}
        </span>
      )}
    </div>
  );
}

function ContextPanel(props: { context: ActivationContext; now: number; onClose: () => void }) {
  const { activation, context } = props.context;
  const messages = context?.messages ?? [];
  const model = context?.selectedModel ?? context?.model ?? 'model unknown';
  const recorded = context?.recordedAt ? `recorded ${relativeTime(context.recordedAt, props.now)}` : 'recorded time unknown';
  return (
    <Panel
      title="Model context window"
      subtitle={`${activation?.agentId ?? ''} / ${activation?.id ?? ''}`}
      testId="context-panel"
      actions={
        <button type="button" class="btn btn-secondary btn-small" onClick={props.onClose}>
          Close
        </button>
      }
    >
      <div class="chip-row">
        <Chip>{`${context?.messageCount ?? messages.length} messages`}</Chip>
        <Chip>{`${count(context?.totalChars ?? 0)} chars`}</Chip>
        <Chip tone="blue">{model}</Chip>
        {context?.apiModel && context.apiModel !== model && <Chip>{context.apiModel}</Chip>}
        <Chip>{recorded}</Chip>
      </div>
      <div class="context-blocks">
        {messages.map((message, index) => (
          <details
            class={`context-block role-${message.role}`}
            key={`${props.context.activation?.id}-${index}`}
            open={messages.length <= 3 || index === messages.length - 1}
            data-testid="context-block"
          >
            <summary>
              <span>{`${index + 1}. ${message.role}`}</span>
              <span class="summary-right">{`${count(message.chars ?? (message.content ?? '').length)} chars`}</span>
            </summary>
            <pre class="code-block scroll-58">{message.content ?? ''}</pre>
          </details>
        ))}
      </div>
    </Panel>
  );
}
