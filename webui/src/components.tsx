// Small presentational building blocks shared by the views: panels, pills, chips, placeholders,
// inline error boxes and the diff viewer (docs/design/webui.md). Every server string passed in is
// rendered as a text node.
import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { count } from './format';

export function Panel(props: {
  title: string;
  subtitle?: ComponentChildren;
  actions?: ComponentChildren;
  busy?: boolean;
  className?: string;
  testId?: string;
  children?: ComponentChildren;
}) {
  return (
    <section
      class={`panel ${props.className ?? ''}`}
      aria-busy={props.busy ? 'true' : undefined}
      data-testid={props.testId}
    >
      <header class="panel-head">
        <div class="panel-heading">
          <h2 class="panel-title">{props.title}</h2>
          {props.subtitle !== undefined && <p class="panel-subtitle">{props.subtitle}</p>}
        </div>
        {props.actions !== undefined && <div class="panel-actions">{props.actions}</div>}
      </header>
      <div class="panel-body">{props.children}</div>
    </section>
  );
}

export function StatusPill(props: { status: string; compact?: boolean; testId?: string }) {
  const tone = statusTone(props.status);
  return (
    <span class={`pill pill-${tone}${props.compact ? ' pill-compact' : ''}`} data-testid={props.testId}>
      {props.status}
    </span>
  );
}

export function statusTone(status: string): string {
  switch (status) {
    case 'running':
      return 'blue';
    case 'completed':
    case 'submitted':
      return 'green';
    case 'failed':
    case 'cancelled':
    case 'stopped':
      return 'red';
    case 'ready':
      return 'light';
    case 'panel':
    case 'action':
      return 'teal';
    default:
      return 'slate';
  }
}

export function Chip(props: { children: ComponentChildren; tone?: string; title?: string; testId?: string }) {
  return (
    <span class={`chip${props.tone ? ` chip-${props.tone}` : ''}`} title={props.title} data-testid={props.testId}>
      {props.children}
    </span>
  );
}

export function Empty(props: { children: ComponentChildren; testId?: string }) {
  return (
    <div class="empty" data-testid={props.testId}>
      {props.children}
    </div>
  );
}

export function ErrorBox(props: { message: string | null | undefined; testId?: string }) {
  if (!props.message) return null;
  return (
    <div class="error-box" role="alert" data-testid={props.testId}>
      {props.message}
    </div>
  );
}

function diffTone(line: string): string {
  if (line.startsWith('+++') || line.startsWith('---') || line.startsWith('diff --git ')) return ' diff-file';
  if (line.startsWith('@@')) return ' diff-hunk';
  if (line.startsWith('+')) return ' diff-add';
  if (line.startsWith('-')) return ' diff-del';
  return '';
}

/** A unified diff, each line coloured by what it does. With `foldAt`, a longer diff shows its first
 * `foldAt` lines and a button that shows the rest. */
export function DiffText(props: { diff: string; foldAt?: number; testId?: string }) {
  const [unfolded, setUnfolded] = useState(false);
  const lines = props.diff.replace(/\n$/, '').split('\n');
  const foldAt = props.foldAt ?? lines.length;
  const folded = !unfolded && lines.length > foldAt;
  return (
    <>
      <pre class="diff-text" data-testid={props.testId} data-folded={folded ? 'true' : undefined}>
        {(folded ? lines.slice(0, foldAt) : lines).map((line, i) => (
          <span key={i} class={`diff-line${diffTone(line)}`}>{`${line}\n`}</span>
        ))}
      </pre>
      {folded && (
        <button type="button" class="link-button diff-unfold" data-testid="diff-unfold" onClick={() => setUnfolded(true)}>
          {`Show all ${count(lines.length)} lines (${count(lines.length - foldAt)} more)`}
        </button>
      )}
    </>
  );
}
