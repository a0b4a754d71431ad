// Small presentational building blocks shared by the views: panels, pills, chips, placeholders and
// inline error boxes (docs/design/webui.md). Every server string passed in is rendered as a text node.
import type { ComponentChildren } from 'preact';

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
