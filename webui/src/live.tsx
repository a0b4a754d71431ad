// Live model output: the ephemeral `activation.delta` frames of the project's SSE stream,
// folded per running activation into its text, reasoning and tool calls as the model streams them.
// Frames are never stored; an activation's entry goes when its activation ends.
import { Panel } from './components';

export interface ActivationDelta {
  type: 'activation.delta';
  activationId: string;
  agentId: string;
  presetId: string;
  callId: string;
  text?: string;
  reasoning?: string;
  toolCalls?: { index: number; id?: string | null; name?: string | null; arguments?: string }[];
  done?: boolean;
}

export interface LiveTool {
  name: string;
  arguments: string;
}

export interface LiveEntry {
  activationId: string;
  agentId: string;
  presetId: string;
  text: string;
  reasoning: string;
  /** Tool calls of the current model call, by stream index; earlier calls' tools are kept before them. */
  tools: LiveTool[];
  callId: string;
  callTools: Record<number, LiveTool>;
}

export type LiveOutput = Record<string, LiveEntry>;

/** The live output after one delta (a new object; the input is not changed). */
export function applyDelta(live: LiveOutput, delta: ActivationDelta): LiveOutput {
  const previous = live[delta.activationId];
  let entry: LiveEntry = previous
    ? { ...previous, callTools: { ...previous.callTools } }
    : {
        activationId: delta.activationId,
        agentId: delta.agentId,
        presetId: delta.presetId,
        text: '',
        reasoning: '',
        tools: [],
        callId: delta.callId,
        callTools: {},
      };
  if (entry.callId !== delta.callId) {
    entry = { ...entry, tools: [...entry.tools, ...Object.values(entry.callTools)], callTools: {}, callId: delta.callId };
  }
  if (delta.text) entry.text += delta.text;
  if (delta.reasoning) entry.reasoning += delta.reasoning;
  for (const call of delta.toolCalls ?? []) {
    const slot = entry.callTools[call.index] ?? { name: '', arguments: '' };
    entry.callTools[call.index] = {
      name: slot.name || call.name || '',
      arguments: slot.arguments + (call.arguments ?? ''),
    };
  }
  return { ...live, [delta.activationId]: entry };
}

/** The live output without the activation that just ended. */
export function endActivation(live: LiveOutput, activationId: string | undefined): LiveOutput {
  if (!activationId || !(activationId in live)) return live;
  const next = { ...live };
  delete next[activationId];
  return next;
}

export function LivePanel(props: { live: LiveOutput }) {
  const entries = Object.values(props.live);
  if (entries.length === 0) return null;
  return (
    <Panel title="Live model output" subtitle="streamed as the model writes" className="live-panel" testId="live-output">
      {entries.map((entry) => {
        const tools = [...entry.tools, ...Object.values(entry.callTools)];
        return (
          <div class="live-entry" key={entry.activationId} data-testid="live-entry">
            <div class="live-head">
              <strong>{entry.agentId}</strong> <span class="muted">{entry.activationId} · {entry.presetId}</span>
            </div>
            {entry.reasoning && (
              <pre class="live-reasoning" data-testid="live-reasoning">
                {entry.reasoning}
              </pre>
            )}
            <pre class="live-text" data-testid="live-text">
              {entry.text}
            </pre>
            {tools.map((tool, index) => (
              <div class="live-tool" key={index} data-testid="live-tool">
                {`→ ${tool.name}(${tool.arguments})`}
              </div>
            ))}
          </div>
        );
      })}
    </Panel>
  );
}
