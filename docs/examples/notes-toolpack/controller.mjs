// Controller module of the example `notes` toolpack. It runs in the controller's Node host:
// - createControllerToolpack: the controller side of notes.add (support calls from runners);
// - schedulerTick: a hook run once per scheduler tick of a running project;
// - createWebuiToolpack: the handlers of the WebUI entries declared in the manifest.
// State lives in <project dir>/toolpack-state/notes/notes.json.
import fs from "node:fs";
import path from "node:path";

function notebookPath(context) {
  return path.join(context.store.paths.root, "toolpack-state", "notes", "notes.json");
}

function load(file) {
  if (!fs.existsSync(file)) return { notes: [] };
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

function save(file, notebook) {
  // Write a temporary file and rename it, so a crash never leaves half a notebook behind.
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const temporary = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(temporary, JSON.stringify(notebook, null, 2) + "\n");
  fs.renameSync(temporary, file);
}

function listing(notebook) {
  const lines = notebook.notes.map(
    (note) => `${note.id} [${note.agent}]${note.flagged ? " (flagged)" : ""} ${note.text}`);
  return {
    title: "Notebook",
    output: lines.length ? lines.join("\n") : "No notes yet.",
    metadata: { metrics: [{ label: "Notes", value: notebook.notes.length }] },
  };
}

export function createControllerToolpack(context) {
  return {
    tools: {
      "notes.add": (input) => {
        if (typeof input?.text !== "string" || !input.text.trim()) throw new Error("text is required");
        if (input.flag !== undefined && typeof input.flag !== "boolean") {
          throw new Error(`Expected boolean, got ${JSON.stringify(input.flag)}`);
        }
        const file = notebookPath(context);
        const notebook = load(file);
        const note = {
          id: `note_${notebook.notes.length + 1}`,
          text: input.text.trim(),
          agent: context.agent.id,
          activationId: context.activationId,
          flagged: input.flag === true,
          announced: false,
        };
        notebook.notes.push(note);
        save(file, notebook);
        // A closed signal with usefulEffect: true wakes nobody but tells the scheduler this
        // activation did something, so no "no-effect" nudge follows it.
        context.recordSignal({ kind: "notes.added", usefulEffect: true, payload: { noteId: note.id } });
        return {
          title: "note saved",
          output: `Saved ${note.id} (${notebook.notes.length} in the notebook).`,
          metadata: { noteId: note.id, count: notebook.notes.length },
        };
      },
    },
  };
}

// Once per tick: every flagged note that was not announced yet becomes a P3 signal for the
// coordinator. Signals returned here have no source agent and are delivered by the next tick.
export function schedulerTick(context) {
  const file = notebookPath(context);
  const notebook = load(file);
  const fresh = notebook.notes.filter((note) => note.flagged && !note.announced);
  if (fresh.length === 0) return [];
  const coordinator = context.store.config().communication.coordinatorAgent;
  for (const note of fresh) note.announced = true;
  save(file, notebook);
  return fresh.map((note) => ({
    kind: "notes.flagged",
    targetAgent: coordinator,
    priority: "P3",
    payload: { noteId: note.id, author: note.agent, text: note.text },
  }));
}

export function createWebuiToolpack(context) {
  const file = notebookPath(context);
  return {
    webui: {
      "notes.list": () => listing(load(file)),
      "notes.clear": () => {
        const removed = load(file).notes.length;
        save(file, { notes: [] });
        return { title: "Notebook cleared", output: `Removed ${removed} notes.` };
      },
    },
  };
}
