// A small, safe Markdown renderer for reports and artifacts (docs/design/webui.md): headings, paragraphs,
// lists, block quotes, fenced code, rules, and inline code, bold, italic and links. It builds Preact
// elements from text nodes only; HTML in the source is shown as text, never interpreted, and a link is
// kept only when it is http(s), mailto or relative (never `javascript:`).
import type { ComponentChildren, VNode } from 'preact';

type Block =
  | { kind: 'heading'; level: number; text: string }
  | { kind: 'paragraph'; text: string }
  | { kind: 'list'; ordered: boolean; items: string[] }
  | { kind: 'quote'; text: string }
  | { kind: 'code'; text: string }
  | { kind: 'rule' };

const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
const FENCE = /^\s*(```|~~~)/;

export function parseBlocks(source: string): Block[] {
  const lines = source.replace(/\r\n?/g, '\n').split('\n');
  const blocks: Block[] = [];
  let index = 0;
  while (index < lines.length) {
    const line = lines[index];
    if (line.trim() === '') {
      index += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      const body: string[] = [];
      index += 1;
      while (index < lines.length && !lines[index].trim().startsWith(fence[1])) body.push(lines[index++]);
      index += 1;
      blocks.push({ kind: 'code', text: body.join('\n') });
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      blocks.push({ kind: 'heading', level: heading[1].length, text: heading[2] });
      index += 1;
      continue;
    }
    if (RULE.test(line)) {
      blocks.push({ kind: 'rule' });
      index += 1;
      continue;
    }
    if (line.trimStart().startsWith('>')) {
      const body: string[] = [];
      while (index < lines.length && lines[index].trimStart().startsWith('>')) {
        body.push(lines[index++].trimStart().replace(/^>\s?/, ''));
      }
      blocks.push({ kind: 'quote', text: body.join('\n') });
      continue;
    }
    const ordered = NUMBERED.test(line);
    if (ordered || BULLET.test(line)) {
      const pattern = ordered ? NUMBERED : BULLET;
      const items: string[] = [];
      while (index < lines.length && lines[index].trim() !== '') {
        const item = pattern.exec(lines[index]);
        if (item) items.push(item[1]);
        else if (items.length > 0) items[items.length - 1] += ` ${lines[index].trim()}`;
        index += 1;
      }
      blocks.push({ kind: 'list', ordered, items });
      continue;
    }
    const body: string[] = [];
    while (
      index < lines.length &&
      lines[index].trim() !== '' &&
      !HEADING.test(lines[index]) &&
      !FENCE.test(lines[index]) &&
      !BULLET.test(lines[index]) &&
      !NUMBERED.test(lines[index])
    ) {
      body.push(lines[index++].trim());
    }
    blocks.push({ kind: 'paragraph', text: body.join(' ') });
  }
  return blocks;
}

/** A link target kept as a link: http(s), mailto, or relative without a scheme. */
export function safeHref(href: string): string | null {
  const target = href.trim();
  if (/^(https?:|mailto:)/i.test(target)) return target;
  if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('//')) return null;
  return target === '' ? null : target;
}

const INLINE = /(`+)([\s\S]*?)\1|\*\*([^*]+)\*\*|__([^_]+)__|\*([^*\s][^*]*)\*|_([^_\s][^_]*)_|\[([^\]]+)\]\(([^)\s]+)\)/g;

export function renderInline(text: string): ComponentChildren[] {
  const out: ComponentChildren[] = [];
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    const at = match.index ?? 0;
    if (at > last) out.push(text.slice(last, at));
    if (match[1] !== undefined) out.push(<code>{match[2]}</code>);
    else if (match[3] !== undefined || match[4] !== undefined) out.push(<strong>{renderInline(match[3] ?? match[4])}</strong>);
    else if (match[5] !== undefined || match[6] !== undefined) out.push(<em>{renderInline(match[5] ?? match[6])}</em>);
    else {
      const href = safeHref(match[8]);
      out.push(
        href === null ? (
          match[0]
        ) : (
          <a href={href} target="_blank" rel="noopener noreferrer">
            {renderInline(match[7])}
          </a>
        ),
      );
    }
    last = at + match[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

function renderBlock(block: Block, key: number): VNode {
  switch (block.kind) {
    case 'heading': {
      const Tag = `h${Math.min(6, block.level + 1)}` as 'h2';
      return <Tag key={key}>{renderInline(block.text)}</Tag>;
    }
    case 'list': {
      const items = block.items.map((item, i) => <li key={i}>{renderInline(item)}</li>);
      return block.ordered ? <ol key={key}>{items}</ol> : <ul key={key}>{items}</ul>;
    }
    case 'quote':
      return <blockquote key={key}>{renderInline(block.text)}</blockquote>;
    case 'code':
      return (
        <pre key={key}>
          <code>{block.text}</code>
        </pre>
      );
    case 'rule':
      return <hr key={key} />;
    default:
      return <p key={key}>{renderInline(block.text)}</p>;
  }
}

export function Markdown(props: { source: string; testId?: string }) {
  return (
    <div class="markdown" data-testid={props.testId}>
      {parseBlocks(props.source).map(renderBlock)}
    </div>
  );
}
