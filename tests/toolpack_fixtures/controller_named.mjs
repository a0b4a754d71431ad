// Controller module with a named factory, a WebUI factory and no scheduler hook.
import fs from "node:fs";

let calls = 0;

export function createControllerToolpack(context) {
  return {
    tools: {
      "t.echo": (input) => ({
        output: JSON.stringify(input),
        metadata: {
          project: context.project,
          toolpackId: context.toolpackId,
          agent: context.agent.id,
          activationId: context.activationId,
          storeProject: context.store.project,
          paths: context.store.paths,
          now: context.now ?? null,
        },
      }),
      "t.count": () => ({ output: String(++calls) }),
      "t.send": () => {
        const message = context.store.sendMessage({ sender: "scheduler", recipient: "pm", body: "hi" });
        const row = context.store.db.prepare("select count(*) as n from messages where id = ?").get(message.id);
        return { output: `${message.id} ${row.n}` };
      },
      "t.many": () => {
        let total = 0;
        for (let i = 0; i < 1000; i += 1) total += context.store.listAgents().length;
        return { output: String(total) };
      },
      "t.missingRow": () => {
        const row = context.store.db.prepare("select 1 where 0").get();
        return { output: row === undefined ? "undefined" : JSON.stringify(row) };
      },
      "t.callbackError": () => {
        try {
          context.store.sendMessage({ sender: "x", recipient: "ghost", body: "hi" });
          return { output: "no error" };
        } catch (error) {
          return { output: `${error instanceof Error} ${error.message}` };
        }
      },
      "t.unsupported": () => context.store.projectStats(),
      "t.pending": () => ({
        output: `${context.hasPendingSignals()} ${context.hasPendingSignalsForAgent("pm")} ${context.hasPendingSignalsForAgent("pm", true)}`,
      }),
      "t.recordSignal": (input) => ({ output: JSON.stringify(context.recordSignal(input)) }),
      "t.await": async () => {
        await new Promise((resolve) => setTimeout(resolve, 20));
        const agents = context.store.listAgents();
        return { output: agents.map((agent) => agent.id).join(",") };
      },
      "t.noisy": () => {
        console.log("log line");
        console.info("info line");
        console.warn("warn line");
        console.error("error line");
        console.debug("debug line");
        process.stdout.write("stdout write\n");
        return { output: "quiet" };
      },
      "t.garbage": () => {
        fs.writeSync(1, "this is not protocol json\n");
        return { output: "after garbage" };
      },
      "t.crash": () => {
        process.exit(3);
      },
      "t.hang": () => new Promise(() => {}),
      "t.throw": () => {
        throw new Error("no summary");
      },
      "t.throwString": () => {
        throw "plain string";
      },
      "t.undefined": () => undefined,
      "t.bigint": () => ({ output: 1n }),
    },
  };
}

export function createWebuiToolpack(context) {
  return {
    webui: {
      "w.panel": (input) => ({
        output: `panel ${JSON.stringify(input)}`,
        metadata: { project: context.project, toolpackId: context.toolpackId, hasAgent: "agent" in context },
      }),
    },
  };
}
