// One step of an agent's work, readable in place (docs/design/webui.md): a tool call shows the tool's
// name and its input, a tool result its output or error, any other history row its text; long text is
// folded behind its first lines. Shared by the Agent history view and the Team view's details.
import type { HistoryRow } from './api';
import { count } from './format';

const FOLD_CHARS = 600;
const FOLD_LINES = 10;
const PREVIEW_LINES = 4;

export interface ToolStepParts {
  tool?: string;
  input?: string;
  output?: string;
  error?: string;
  status?: string;
}

function prettyInput(raw: string): string {
  try {
    return JSON.stringify(JSON.parse(raw), null, 2);
  } catch {
    return raw;
  }
}

/** The tool call or result of a history row, from its parts (then its metadata). */
export function toolStep(row: HistoryRow): ToolStepParts | null {
  if (row.role !== 'tool_call' && row.role !== 'tool_result') return null;
  const part = (row.parts ?? []).find((p) => p.type === 'tool_call' || p.type === 'tool_result');
  const text = (key: string) => (part && typeof part[key] === 'string' ? (part[key] as string) : undefined);
  const meta = row.metadata ?? {};
  const status = typeof meta.status === 'string' ? meta.status : undefined;
  const tool = text('toolName') ?? (typeof meta.tool === 'string' ? meta.tool : undefined);
  const input = text('inputJson');
  return {
    tool,
    input: input === undefined ? undefined : prettyInput(input),
    output: text('output'),
    error: text('error'),
    status,
  };
}

/** Text shown whole when short, else its first lines with the rest behind a fold. */
export function Folded(props: { text: string; label: string; tone?: string; testId?: string; open?: boolean }) {
  const { text } = props;
  const lines = text.replace(/\n$/, '').split('\n');
  const long = text.length > FOLD_CHARS || lines.length > FOLD_LINES;
  const cls = `step-text${props.tone ? ` step-${props.tone}` : ''}`;
  if (!long) {
    return (
      <div class="step-block" data-testid={props.testId}>
        <span class="step-label">{props.label}</span>
        <pre class={cls}>{text}</pre>
      </div>
    );
  }
  return (
    <details class="step-block step-folded" data-testid={props.testId} open={props.open}>
      <summary>
        <span class="step-label">{props.label}</span>
        <span class="step-size">{`${count(lines.length)} lines · ${count(text.length)} chars`}</span>
        <pre class={`${cls} step-preview`}>{lines.slice(0, PREVIEW_LINES).join('\n')}</pre>
      </summary>
      <pre class={cls}>{text}</pre>
    </details>
  );
}

/** A tool call's input, or a result's output and error, inline. */
export function ToolStepBody(props: { step: ToolStepParts; role: string }) {
  const { step } = props;
  if (props.role === 'tool_call') {
    return <Folded text={step.input ?? '{}'} label="Input" testId="step-input" />;
  }
  return (
    <>
      {step.error && <Folded text={step.error} label="Error" tone="error" testId="step-error" />}
      {step.output ? (
        <Folded text={step.output} label="Output" testId="step-output" />
      ) : (
        !step.error && <div class="step-block step-none">No output</div>
      )}
    </>
  );
}

/** The one-line heading of a history row: the tool and its outcome, or the role and kind. */
export function stepTitle(row: HistoryRow, tool: string | undefined): string {
  if (row.role === 'tool_call') return `tool call · ${tool ?? '?'}`;
  if (row.role === 'tool_result') {
    const status = typeof row.metadata?.status === 'string' ? row.metadata.status : row.kind === 'tool_error' ? 'failed' : 'completed';
    return `tool result · ${tool ?? '?'} · ${status}`;
  }
  return `${row.role} / ${tool ?? row.kind ?? ''}`;
}
