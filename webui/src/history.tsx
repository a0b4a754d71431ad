// Agent history view (docs/design/webui.md): paged model-visible history of one agent, newest first,
// plus the raw compaction archive on demand. Owns its own loads; live stream events reload the
// first page only while the user has not paged further back.
import { useEffect, useRef, useState } from 'preact/hooks';
import {
  errorText,
  getHistory,
  getHistoryArchive,
  isTokenError,
  type Agent,
  type HistoryArchive,
  type HistoryRow,
} from './api';
import { ApprovalsCard } from './approvals';
import { Chip, Empty, ErrorBox, Panel } from './components';
import { count, localTime, prettyJson, utcTitle } from './format';
import { Folded, stepTitle, toolStep, ToolStepBody } from './steps';
import { agentLabel } from './overview';

/** Tool name resolution: parts, then metadata.tool, then a `Tool:` content line. */
export function historyToolName(row: HistoryRow): string | undefined {
  for (const part of row.parts ?? []) {
    if ((part.type === 'tool_call' || part.type === 'tool_result') && typeof part.toolName === 'string' && part.toolName) {
      return part.toolName;
    }
  }
  const metaTool = row.metadata?.tool;
  if (typeof metaTool === 'string' && metaTool !== '') return metaTool;
  for (const line of (row.content ?? '').split('\n')) {
    if (line.startsWith('Tool:')) {
      const name = line.slice('Tool:'.length).trim();
      if (name !== '') return name;
    }
  }
  return undefined;
}

function compactionIdOf(row: HistoryRow): string | undefined {
  const fromMeta = row.metadata?.compactionId;
  if (typeof fromMeta === 'string' && fromMeta !== '') return fromMeta;
  return row.compactionId;
}

function roleTone(role: string): string {
  switch (role) {
    case 'user':
      return 'blue';
    case 'assistant':
      return 'green';
    case 'tool_call':
    case 'tool_result':
      return 'amber';
    case 'compaction':
      return 'violet';
    default:
      return 'grey';
  }
}

export function HistoryView(props: {
  project: string;
  agents: Agent[];
  now: number;
  /** Agent ids whose history changed, bumped by the live stream. */
  pulse: { agentId: string; n: number } | null;
  /** Reloads the agent's pending approvals. */
  approvalPulse: number;
}) {
  const firstAgent = props.agents[0]?.id ?? '';
  const [agentId, setAgentId] = useState(firstAgent);
  const [rows, setRows] = useState<HistoryRow[]>([]);
  const [nextBefore, setNextBefore] = useState<number | undefined>(undefined);
  const [pages, setPages] = useState(0);
  const [loading, setLoading] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [archive, setArchive] = useState<HistoryArchive | null>(null);
  const [stale, setStale] = useState(false);
  const sequence = useRef(0);

  const rosterKey = props.agents.map((agent) => agent.id).join('\n');
  useEffect(() => {
    if (!props.agents.some((agent) => agent.id === agentId)) setAgentId(firstAgent);
  }, [rosterKey]);

  async function loadFirstPage(agent: string, quiet = false) {
    if (!agent) return;
    const request = ++sequence.current;
    if (!quiet) {
      setLoading(true);
      setArchive(null);
    }
    setError(null);
    try {
      const page = await getHistory(props.project, agent);
      if (request !== sequence.current) return;
      setRows(page.messages ?? []);
      setNextBefore(page.nextBefore);
      setPages(1);
      setStale(false);
    } catch (caught) {
      if (request !== sequence.current) return;
      if (!isTokenError(caught)) setError(errorText(caught));
      if (!quiet) setRows([]);
      setNextBefore(undefined);
    } finally {
      if (request === sequence.current) setLoading(false);
    }
  }

  async function loadOlder() {
    if (nextBefore === undefined) return;
    const request = ++sequence.current;
    setLoading(true);
    setError(null);
    try {
      const page = await getHistory(props.project, agentId, nextBefore);
      if (request !== sequence.current) return;
      setRows((current) => [...current, ...(page.messages ?? [])]);
      setNextBefore(page.nextBefore);
      setPages((n) => n + 1);
    } catch (caught) {
      if (request === sequence.current && !isTokenError(caught)) setError(errorText(caught));
    } finally {
      if (request === sequence.current) setLoading(false);
    }
  }

  async function openArchive(compactionId: string) {
    const request = ++sequence.current;
    setLoading(true);
    setError(null);
    try {
      const result = await getHistoryArchive(props.project, agentId, compactionId);
      if (request === sequence.current) setArchive(result);
    } catch (caught) {
      if (request === sequence.current && !isTokenError(caught)) setError(errorText(caught));
    } finally {
      if (request === sequence.current) setLoading(false);
    }
  }

  useEffect(() => {
    setRows([]);
    setNextBefore(undefined);
    setPages(0);
    void loadFirstPage(agentId);
  }, [props.project, agentId]);

  // Live stream: refresh the newest page in place unless the user is reading older pages.
  const seenPulse = useRef(props.pulse?.n ?? 0);
  useEffect(() => {
    if (!props.pulse || props.pulse.n === seenPulse.current) return;
    seenPulse.current = props.pulse.n;
    if (props.pulse.agentId !== agentId) return;
    if (pages <= 1 && !archive && !loading) void loadFirstPage(agentId, true);
    else setStale(true);
  }, [props.pulse?.n]);

  const emptyText = loading ? 'Loading history...' : 'No history for this agent yet';

  return (
    <div class="stack">
      {agentId && <ApprovalsCard project={props.project} agentId={agentId} pulse={props.approvalPulse} />}
      <Panel
        title="Agent history"
        subtitle="Model-visible history of one agent, newest first, 80 rows per page."
        busy={loading}
        testId="history-panel"
      >
        <div class="toolbar">
          <div class="field field-inline">
            <label for="history-agent">Agent</label>
            <select
              id="history-agent"
              value={agentId}
              onChange={(event) => setAgentId((event.target as HTMLSelectElement).value)}
            >
              {props.agents.map((agent) => (
                <option key={agent.id} value={agent.id}>
                  {agentLabel(agent)}
                </option>
              ))}
            </select>
          </div>
          <button
            type="button"
            class="btn btn-secondary"
            disabled={loading || !agentId}
            onClick={() => loadFirstPage(agentId)}
          >
            {loading ? 'Loading' : 'Reload'}
          </button>
          {rows.length > 0 && <span class="toolbar-note">{`${rows.length} rows shown`}</span>}
          {stale && (
            <span class="toolbar-note note-live" data-testid="history-stale">
              New history rows recorded - Reload to see them
            </span>
          )}
        </div>
        <ErrorBox message={error} testId="history-error" />
        {rows.length === 0 ? (
          <Empty>{emptyText}</Empty>
        ) : (
          <ol class="history-list" role="list">
            {rows.map((row) => (
              <HistoryItem key={row.id} row={row} now={props.now} onArchive={openArchive} />
            ))}
          </ol>
        )}
        {nextBefore !== undefined && rows.length > 0 && (
          <button type="button" class="btn btn-secondary btn-block load-older" disabled={loading} onClick={loadOlder}>
            {loading ? 'Loading' : 'Load older history'}
          </button>
        )}
      </Panel>
      {archive && <ArchivePanel archive={archive} onClose={() => setArchive(null)} />}
    </div>
  );
}

function HistoryItem(props: { row: HistoryRow; now: number; onArchive: (id: string) => void }) {
  const { row } = props;
  const tool = historyToolName(row);
  const compactionId = row.role === 'compaction' ? compactionIdOf(row) : undefined;
  const openByDefault = row.role === 'user' || row.role === 'compaction';
  const content = row.content ?? '';
  const step = toolStep(row);
  return (
    <li
      class={`history-row role-${roleTone(row.role)}${row.archived ? ' is-archived' : ''}`}
      data-testid="history-row"
      data-sequence={row.sequence}
    >
      <div class="history-head">
        <span class="history-title" data-testid="history-title">
          {`${row.sequence}. ${stepTitle(row, tool)}`}
        </span>
        <span class="meta-time" title={utcTitle(row.createdAt)}>
          {localTime(row.createdAt)}
        </span>
      </div>
      <div class="chip-row">
        <Chip>{row.id}</Chip>
        {row.activationId && <Chip>{row.activationId}</Chip>}
        {tool && <Chip tone="amber">{tool}</Chip>}
        {row.archived && <Chip tone="muted">archived</Chip>}
        {compactionId && (
          <button type="button" class="btn btn-mini btn-violet" onClick={() => props.onArchive(compactionId)}>
            View raw archive
          </button>
        )}
      </div>
      <div class="history-content">
        {step ? (
          <ToolStepBody step={step} role={row.role} />
        ) : (
          <Folded text={content} label={row.role === 'compaction' ? 'Summary' : 'Text'} open={openByDefault} />
        )}
      </div>
    </li>
  );
}

function ArchivePanel(props: { archive: HistoryArchive; onClose: () => void }) {
  const compaction = props.archive.compaction ?? {};
  const messages = typeof compaction.archivedMessageCount === 'number' ? count(compaction.archivedMessageCount) : '?';
  const chars = typeof compaction.rawChars === 'number' ? count(compaction.rawChars) : '?';
  return (
    <Panel
      title="Compaction archive"
      subtitle="Raw history rows saved before compaction replaced them with a summary."
      testId="archive-panel"
      actions={
        <button type="button" class="btn btn-secondary btn-small" onClick={props.onClose}>
          Close
        </button>
      }
    >
      <div class="chip-row">
        <Chip tone="violet">{typeof compaction.id === 'string' ? compaction.id : 'archive'}</Chip>
        <Chip>{`${messages} messages`}</Chip>
        <Chip>{`${chars} chars`}</Chip>
      </div>
      <pre class="code-block scroll-68" data-testid="archive-json">
        {prettyJson(props.archive.archive)}
      </pre>
    </Panel>
  );
}
