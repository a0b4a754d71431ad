// Tool status view (docs/design/webui.md): the per-tool workspace. Builds the page index from
// tool-status rows and WebUI entries, renders tool and control pages, and generates control-card
// forms from each entry's inputSchema with roster-populated dropdowns.
import { useEffect, useId, useMemo, useRef, useState } from 'preact/hooks';
import {
  errorText,
  invokeToolUi,
  isTokenError,
  type Agent,
  type JsonSchema,
  type ToolMetric,
  type ToolStatus,
  type ToolUiEntry,
  type ToolUiResult,
} from './api';
import { Empty, ErrorBox, Panel, StatusPill } from './components';
import { count, metricValue, relativeTime } from './format';
import { agentLabel } from './overview';

// ---------------------------------------------------------------------------------------------
// Page index.

const RELATED_TOOLS: Record<string, string[]> = {
  'messages.conversation': ['messages.send'],
  'messages.send': ['messages.send'],
  'coordination.signals': ['coordination.wait_for_signal'],
  'completion.report': ['completion.submit'],
  'file.activity': ['file.read', 'file.write', 'file.patch'],
  'shell.activity': ['shell.exec'],
  'web.activity': ['web.fetch'],
  'schedule.jobs': ['schedule.list'],
  'schedule.once': ['schedule.once'],
  'schedule.recurring': ['schedule.recurring'],
  'schedule.cancel': ['schedule.cancel'],
  'plan.board': ['plan.status'],
  'plan.create': ['plan.create'],
  'plan.update': ['plan.update'],
  'plan.set_item_status': ['plan.set_item_status'],
  'plan.close': ['plan.close'],
};

export type ToolPageSpec =
  | { kind: 'tool'; key: string; status: ToolStatus; entries: ToolUiEntry[] }
  | { kind: 'control'; key: string; entry: ToolUiEntry };

export function buildToolPages(statuses: ToolStatus[], entries: ToolUiEntry[]): ToolPageSpec[] {
  const known = new Set(statuses.map((status) => status.tool));
  const attached = new Map<string, ToolUiEntry[]>();
  const standalone: ToolPageSpec[] = [];
  for (const entry of entries) {
    const related = (RELATED_TOOLS[entry.id] ?? []).filter((tool) => known.has(tool));
    if (related.length === 0) {
      standalone.push({ kind: 'control', key: `control:${entry.toolpackId}:${entry.id}`, entry });
      continue;
    }
    for (const tool of related) attached.set(tool, [...(attached.get(tool) ?? []), entry]);
  }
  const toolPages: ToolPageSpec[] = statuses.map((status) => ({
    kind: 'tool',
    key: `tool:${status.tool}`,
    status,
    entries: attached.get(status.tool) ?? [],
  }));
  return [...standalone, ...toolPages];
}

// ---------------------------------------------------------------------------------------------
// Workspace.

export function ToolWorkspace(props: {
  project: string;
  statuses: ToolStatus[] | null;
  entries: ToolUiEntry[] | null;
  loading: boolean;
  agents: Agent[];
  toolKey: string | null;
  now: number;
  onSelect: (key: string) => void;
  onNormalize: (key: string) => void;
}) {
  const pages = useMemo(
    () => buildToolPages(props.statuses ?? [], props.entries ?? []),
    [props.statuses, props.entries],
  );
  const requested = pages.find((page) => page.key === props.toolKey);
  const current = requested ?? pages[0];
  const loaded = props.statuses !== null && props.entries !== null;

  useEffect(() => {
    if (loaded && current && current.key !== props.toolKey) props.onNormalize(current.key);
  }, [loaded, current?.key, props.toolKey]);

  if (pages.length === 0) {
    const waiting = props.loading || !loaded;
    return (
      <Panel
        title="Tool workspace"
        subtitle={waiting ? 'Loading...' : 'No tools registered'}
        busy={waiting}
        testId="tool-workspace-empty"
      >
        <Empty>{waiting ? 'Loading tool workspace...' : 'No configured tools or WebUI controls yet'}</Empty>
      </Panel>
    );
  }

  const statusCount = props.statuses?.length ?? 0;
  const entryCount = props.entries?.length ?? 0;
  return (
    <div class="tool-workspace" aria-busy={props.loading ? 'true' : undefined}>
      <nav class="tool-index" aria-label="Tool pages" data-testid="tool-index">
        <div class="tool-index-head">
          <div class="eyebrow eyebrow-dark">TOOL WORKSPACE</div>
          <div class="tool-index-count" data-testid="tool-page-count">{`${pages.length} pages`}</div>
          <div class="tool-index-sub">{`${statusCount} runtime tools / ${entryCount} controls`}</div>
        </div>
        <ul class="tool-index-list" role="list">
          {pages.map((page) => {
            const active = page.key === current?.key;
            return (
              <li key={page.key}>
                <button
                  type="button"
                  class={`tool-index-item${active ? ' is-active' : ''}`}
                  aria-current={active ? 'page' : undefined}
                  data-testid="tool-index-item"
                  data-key={page.key}
                  onClick={() => props.onSelect(page.key)}
                >
                  <span class="tool-index-text">
                    <span class="tool-index-title">{page.kind === 'tool' ? page.status.tool : page.entry.title}</span>
                    <span class="tool-index-kicker mono">{pageKicker(page)}</span>
                  </span>
                  {page.kind === 'tool' && (
                    <span class="tool-index-calls">{`${count(page.status.callCount)} calls`}</span>
                  )}
                </button>
              </li>
            );
          })}
        </ul>
      </nav>
      {current && (
        <div class="tool-page" key={current.key} data-testid="tool-page" data-key={current.key}>
          {current.kind === 'tool' ? (
            <ToolPage
              project={props.project}
              page={current}
              agents={props.agents}
              now={props.now}
            />
          ) : (
            <ControlPage project={props.project} entry={current.entry} agents={props.agents} />
          )}
        </div>
      )}
    </div>
  );
}

function toolKicker(status: ToolStatus): string {
  if (!status.toolpackId) return 'observed runtime tool';
  return `${status.toolpackKind ?? 'builtin'} / ${status.toolpackId}`;
}

function pageKicker(page: ToolPageSpec): string {
  if (page.kind === 'tool') return toolKicker(page.status);
  return `${page.entry.toolpackId} / ${page.entry.id}`;
}

function ToolPage(props: {
  project: string;
  page: Extract<ToolPageSpec, { kind: 'tool' }>;
  agents: Agent[];
  now: number;
}) {
  const { status, entries } = props.page;
  const pill = status.submittedReportPath ? 'submitted' : status.lastStatus ?? 'ready';
  const enabled = status.enabledForAgents ?? [];
  const lastActivity = status.lastAt
    ? `${relativeTime(status.lastAt, props.now)}${status.lastAgentId ? ` by ${status.lastAgentId}` : ''}`
    : 'No calls yet';
  return (
    <>
      <header class="tool-hero hero-tool">
        <div class="tool-hero-text">
          <div class="eyebrow eyebrow-dark" data-testid="tool-kicker">
            {toolKicker(status)}
          </div>
          <h2 class="tool-hero-title">{status.tool}</h2>
          {status.description && <p class="tool-hero-desc">{status.description}</p>}
        </div>
        <StatusPill status={pill} testId="tool-status-pill" />
      </header>
      <div class="tool-summary" data-testid="tool-summary">
        <SummaryCell label="Total calls" value={count(status.callCount)} />
        <SummaryCell label="Running" value={count(status.runningCount)} />
        <SummaryCell label="Completed" value={count(status.completedCount)} />
        <SummaryCell label="Failed" value={count(status.failedCount)} tone={(status.failedCount ?? 0) > 0 ? 'red' : undefined} />
        <SummaryCell
          label="Enabled agents"
          value={enabled.length > 0 ? enabled.join(', ') : 'No current agent allowlist'}
          wide
        />
        <SummaryCell label="Last activity" value={lastActivity} wide />
        {status.submittedReportPath && (
          <SummaryCell label="Final report" value={status.submittedReportPath} wide mono />
        )}
        {status.lastError && <SummaryCell label="Last error" value={status.lastError} wide tone="error" mono />}
      </div>
      <section class="tool-controls">
        <div class="section-head">
          <h3 class="section-title">Controls</h3>
          <span class="section-note" data-testid="tool-controls-count">
            {entries.length > 0 ? `${entries.length} WebUI controls` : 'No dedicated control'}
          </span>
        </div>
        {entries.length === 0 ? (
          <Empty>This tool has no WebUI control; only its runtime status is available.</Empty>
        ) : (
          <div class="control-stack">
            {entries.map((entry) => (
              <ControlCard
                key={`${props.project}:${entry.toolpackId}:${entry.id}`}
                project={props.project}
                entry={entry}
                agents={props.agents}
              />
            ))}
          </div>
        )}
      </section>
    </>
  );
}

function SummaryCell(props: { label: string; value: string; wide?: boolean; tone?: string; mono?: boolean }) {
  return (
    <div
      class={`summary-cell${props.wide ? ' is-wide' : ''}${props.tone ? ` tone-cell-${props.tone}` : ''}`}
      data-testid="tool-summary-cell"
    >
      <div class="summary-label">{props.label}</div>
      <div class={`summary-value${props.mono ? ' mono prewrap' : ''}`}>{props.value}</div>
    </div>
  );
}

function ControlPage(props: { project: string; entry: ToolUiEntry; agents: Agent[] }) {
  const { entry } = props;
  return (
    <>
      <header class="tool-hero hero-control">
        <div class="tool-hero-text">
          <div class="eyebrow eyebrow-dark" data-testid="tool-kicker">{`${entry.toolpackId} / ${entry.id}`}</div>
          <h2 class="tool-hero-title">{entry.title}</h2>
          {entry.description && <p class="tool-hero-desc">{entry.description}</p>}
        </div>
        <StatusPill status={entry.kind} />
      </header>
      <div class="control-stack">
        <ControlCard
          key={`${props.project}:${entry.toolpackId}:${entry.id}`}
          project={props.project}
          entry={entry}
          agents={props.agents}
        />
      </div>
    </>
  );
}

// ---------------------------------------------------------------------------------------------
// Control cards and schema forms.

const ROSTER_FIELDS = new Set(['sender', 'agentA', 'agentB', 'recipient', 'targetAgent']);
/** Free-text fields likely to hold prose get the full form width; layout only, never behaviour. */
const PROSE_FIELD = /body|content|text|instructions|summary|description|notes|items|report|prompt/i;

interface Option {
  value: string;
  label: string;
}

type FieldControl =
  | { control: 'select'; options: Option[] }
  | { control: 'checkbox' }
  | { control: 'number' }
  | { control: 'text' };

interface FieldSpec {
  name: string;
  label: string;
  description?: string;
  required: boolean;
  schema: JsonSchema;
  control: FieldControl;
}

type FormValues = Record<string, unknown>;

function asSchema(value: unknown): JsonSchema {
  return value && typeof value === 'object' && !Array.isArray(value) ? (value as JsonSchema) : {};
}

function rosterOptions(name: string, required: boolean, agents: Agent[]): Option[] {
  const agentOptions = agents.map((agent) => ({ value: agent.id, label: agentLabel(agent) }));
  if (name === 'recipient') {
    return [{ value: '', label: 'Auto / no direct recipient' }, { value: 'user', label: 'User' }, ...agentOptions];
  }
  if (name === 'targetAgent') return [{ value: '', label: 'All agents' }, ...agentOptions];
  const options = [{ value: 'user', label: 'User' }, ...agentOptions];
  return required ? options : [{ value: '', label: '(empty)' }, ...options];
}

function describeFields(schema: JsonSchema | undefined, agents: Agent[]): FieldSpec[] {
  const root = asSchema(schema);
  const properties = asSchema(root.properties);
  const required = new Set(
    Array.isArray(root.required) ? root.required.filter((item): item is string => typeof item === 'string') : [],
  );
  return Object.entries(properties).map(([name, raw]) => {
    const property = asSchema(raw);
    const isRequired = required.has(name);
    const enumValues = Array.isArray(property.enum)
      ? property.enum.filter((item): item is string => typeof item === 'string')
      : [];
    let control: FieldControl;
    if (ROSTER_FIELDS.has(name)) {
      control = { control: 'select', options: rosterOptions(name, isRequired, agents) };
    } else if (enumValues.length > 0) {
      const options = enumValues.map((value) => ({ value, label: value }));
      const needsEmpty = !isRequired && !enumValues.includes('');
      control = { control: 'select', options: needsEmpty ? [{ value: '', label: '(empty)' }, ...options] : options };
    } else if (property.type === 'boolean') {
      control = { control: 'checkbox' };
    } else if (property.type === 'number' || property.type === 'integer') {
      control = { control: 'number' };
    } else {
      control = { control: 'text' };
    }
    const title = typeof property.title === 'string' ? property.title : name;
    return {
      name,
      label: isRequired ? `${title} *` : title,
      description: typeof property.description === 'string' ? property.description : undefined,
      required: isRequired,
      schema: property,
      control,
    };
  });
}

function initialValues(fields: FieldSpec[]): FormValues {
  const values: FormValues = {};
  for (const field of fields) {
    if ('default' in field.schema && field.schema.default !== undefined) {
      values[field.name] = field.schema.default;
    } else if (field.control.control === 'checkbox') {
      values[field.name] = false;
    } else if (field.required && field.control.control === 'select' && field.control.options.length > 0) {
      values[field.name] = field.control.options[0].value;
    }
  }
  return values;
}

function ControlCard(props: { project: string; entry: ToolUiEntry; agents: Agent[] }) {
  const { entry } = props;
  const fields = describeFields(entry.inputSchema, props.agents);
  const [values, setValues] = useState<FormValues>(() => initialValues(fields));
  const [running, setRunning] = useState(false);
  const [result, setResult] = useState<ToolUiResult | null>(null);
  const [error, setError] = useState<string | null>(null);
  const idPrefix = `ctl-${useId()}`;
  const valuesRef = useRef(values);
  valuesRef.current = values;

  async function run() {
    setRunning(true);
    setError(null);
    try {
      const body: FormValues = {};
      for (const [key, value] of Object.entries(valuesRef.current)) {
        if (value !== undefined) body[key] = value;
      }
      const response = await invokeToolUi(props.project, entry.toolpackId, entry.id, body);
      setResult(response ?? {});
    } catch (caught) {
      if (!isTokenError(caught)) setError(errorText(caught));
    } finally {
      setRunning(false);
    }
  }

  useEffect(() => {
    if (entry.kind === 'panel') void run();
  }, []);

  function setValue(name: string, value: unknown) {
    setValues((current) => {
      const next = { ...current };
      if (value === undefined) delete next[name];
      else next[name] = value;
      return next;
    });
  }

  const submitLabel = entry.submitLabel ?? (entry.kind === 'panel' ? 'Refresh' : 'Run');
  return (
    <article class="control-card" data-testid="control-card" data-entry={`${entry.toolpackId}/${entry.id}`}>
      <header class="control-head">
        <div class="control-title-row">
          <h4 class="control-title">{entry.title}</h4>
          <span class="badge badge-violet">{entry.kind}</span>
        </div>
        <div class="control-id mono">{`${entry.toolpackId} / ${entry.id}`}</div>
        {entry.description && <p class="control-desc">{entry.description}</p>}
      </header>
      <form
        class="control-form"
        onSubmit={(event) => {
          event.preventDefault();
          if (!running) void run();
        }}
      >
        {fields.length > 0 && (
          <div class="control-fields">
            {fields.map((field) => (
              <FormField
                key={field.name}
                id={`${idPrefix}-${field.name}`}
                field={field}
                value={values[field.name]}
                onChange={(value) => setValue(field.name, value)}
              />
            ))}
          </div>
        )}
        <div class="control-actions">
          <button type="submit" class="btn btn-secondary" disabled={running}>
            {running ? 'Running...' : submitLabel}
          </button>
        </div>
      </form>
      <ErrorBox message={error} testId="control-error" />
      {result && <ControlResult result={result} />}
    </article>
  );
}

function FormField(props: { id: string; field: FieldSpec; value: unknown; onChange: (value: unknown) => void }) {
  const { field, id } = props;
  const helpId = field.description ? `${id}-help` : undefined;
  const help = field.description ? (
    <div class="field-help" id={helpId}>
      {field.description}
    </div>
  ) : null;

  if (field.control.control === 'checkbox') {
    return (
      <div class="field field-check">
        <input
          id={id}
          type="checkbox"
          checked={props.value === true}
          aria-describedby={helpId}
          onChange={(event) => props.onChange((event.target as HTMLInputElement).checked)}
        />
        <label for={id}>{field.label}</label>
        {help}
      </div>
    );
  }

  let control;
  if (field.control.control === 'select') {
    const current = typeof props.value === 'string' ? props.value : '';
    let options = field.control.options;
    if (current !== '' && !options.some((option) => option.value === current)) {
      options = [{ value: current, label: current }, ...options];
    }
    control = (
      <select
        id={id}
        value={current}
        aria-describedby={helpId}
        onChange={(event) => props.onChange((event.target as HTMLSelectElement).value)}
      >
        {options.map((option) => (
          <option key={option.value} value={option.value}>
            {option.label}
          </option>
        ))}
      </select>
    );
  } else if (field.control.control === 'number') {
    control = (
      <input
        id={id}
        type="number"
        value={props.value === undefined ? '' : String(props.value)}
        aria-describedby={helpId}
        onInput={(event) => {
          const text = (event.target as HTMLInputElement).value;
          props.onChange(text.trim() === '' ? undefined : Number(text));
        }}
      />
    );
  } else {
    const text = props.value === undefined ? '' : typeof props.value === 'string' ? props.value : JSON.stringify(props.value);
    control = (
      <textarea
        id={id}
        rows={2}
        value={text}
        aria-describedby={helpId}
        onInput={(event) => props.onChange((event.target as HTMLTextAreaElement).value)}
      />
    );
  }
  return (
    <div class={`field${field.control.control === 'text' && PROSE_FIELD.test(field.name) ? ' field-wide' : ''}`}>
      <label for={id}>{field.label}</label>
      {control}
      {help}
    </div>
  );
}

function ControlResult(props: { result: ToolUiResult }) {
  const { result } = props;
  const rawMetrics = result.metadata?.metrics;
  const metrics = Array.isArray(rawMetrics)
    ? (rawMetrics as ToolMetric[]).filter(
        (metric) => metric && typeof metric === 'object' && typeof metric.label === 'string',
      )
    : [];
  const output = typeof result.output === 'string' ? result.output : result.output === undefined ? '' : JSON.stringify(result.output, null, 2);
  return (
    <div class="control-result" data-testid="control-result">
      {typeof result.title === 'string' && result.title !== '' && (
        <div class="result-title" data-testid="control-result-title">
          {result.title}
        </div>
      )}
      {metrics.length > 0 && (
        <div class="result-metrics">
          {metrics.map((metric, index) => (
            <div class="result-metric" key={`${String(metric.label)}-${index}`} data-testid="result-metric">
              <div class="result-metric-label">{String(metric.label)}</div>
              <div class="result-metric-value">{metricValue(metric.value)}</div>
              {typeof metric.description === 'string' && <div class="result-metric-desc">{metric.description}</div>}
            </div>
          ))}
        </div>
      )}
      <pre class="code-block scroll-22" data-testid="control-output">
        {output}
      </pre>
    </div>
  );
}
