// Controller side of review-tools, the local toolpack of the end-to-end tests (tests/test_e2e_toolpacks.py):
// review.summarize records a review.summarized signal for pm; review.probe makes 1,000 store callbacks;
// review.hang never settles; the review.stats panel counts summaries; the scheduler hook does what
// <project dir>/review-hook.txt says.
import fs from "node:fs";
import path from "node:path";

function summaryCount(store) {
  return store.db.prepare("select count(*) as n from signals where kind = ?").get("review.summarized").n;
}

export function createControllerToolpack(context) {
  return {
    tools: {
      "review.summarize": (input) => {
        const summary = input && typeof input.summary === "string" ? input.summary.trim() : "";
        if (!summary) throw new Error("summary is required");
        const [signal] = context.recordSignal({
          kind: "review.summarized",
          targetAgent: "pm",
          payload: { summary, reviewer: context.agent.id },
        });
        return { title: "review summarized", output: `Summary recorded for pm: ${signal.id}`, metadata: { signalId: signal.id } };
      },
      "review.hang": () => new Promise(() => {}),
      "review.probe": () => {
        let agents = 0;
        for (let i = 0; i < 1000; i += 1) agents += context.store.listAgents().length;
        return {
          title: "review probe",
          output: `callbacks 1000, agents ${agents}, pm pending ${context.hasPendingSignalsForAgent("pm")}`,
        };
      },
    },
  };
}

export function createWebuiToolpack(context) {
  return {
    webui: {
      "review.stats": () => {
        const count = summaryCount(context.store);
        return { title: "review statistics", output: `Summaries: ${count}`, metadata: { metrics: [{ label: "Summaries", value: count }] } };
      },
    },
  };
}

function hookMode(context) {
  try {
    return fs.readFileSync(path.join(context.store.paths.root, "review-hook.txt"), "utf8").trim();
  } catch {
    return "idle";
  }
}

export function schedulerTick(context) {
  const mode = hookMode(context);
  if (mode === "hang") return new Promise(() => {});
  if (mode === "send") {
    const message = context.store.sendMessage({ sender: "scheduler", recipient: "pm", body: "hi from the hook" });
    const row = context.store.db.prepare("select count(*) as n from messages where id = ?").get(message.id);
    const seen = { messageId: message.id, seenRows: row.n, now: context.now, agents: context.agents };
    fs.writeFileSync(path.join(context.store.paths.root, "review-hook-seen.json"), JSON.stringify(seen));
  }
  return [];
}
