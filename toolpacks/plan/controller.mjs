// Controller module of the packaged `plan` toolpack (docs/design/toolpacks.md): the project's active
// plan kept in <project dir>/toolpack-state/plan/state.json, edited by the plan.* tools and WebUI
// actions, and a scheduler hook that requests P2 continuation nudges. Runs in the controller's Node host.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const ITEM_STATUSES = ["tbd", "done", "wont_do"];
const CLOSE_STATUSES = ["done", "abandoned"];
const ITEM_MODES = ["append", "replace"];
const MAX_ARCHIVED = 20;
const DEFAULT_COOLDOWN_MS = 60000;
const NUDGE_KIND = "plan.continuation_nudge";
const ITEM_MARKER = /^\s*(?:[-*]\s+|\d+[.)]\s*)/;
const NO_ACTIVE_PLAN = "No active plan; create one with plan.create";

// --- value readers ---------------------------------------------------------------------

function describe(value) {
  return typeof value === "string" ? value : String(JSON.stringify(value));
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function objectInput(input, absentIsEmpty = false) {
  if (absentIsEmpty && (input === undefined || input === null)) return {};
  if (!isObject(input)) throw new Error("Tool input must be an object");
  return input;
}

function stringValue(value) {
  return typeof value === "string" && value.trim() ? value.trim() : undefined;
}

function requiredString(value, name) {
  if (typeof value !== "string" || !value.trim()) throw new Error(`${name} is required`);
  return value.trim();
}

function booleanValue(value) {
  return value === true || value === false ? value : undefined;
}

function numberValue(value) {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value === "number" && Number.isFinite(value)) return value;
  throw new Error(`Expected a finite number, got ${describe(value)}`);
}

function nonNegativeInteger(value, fallback) {
  const number = numberValue(value);
  return number === undefined ? fallback : Math.max(0, Math.trunc(number));
}

function has(args, key) {
  return Object.prototype.hasOwnProperty.call(args, key);
}

// The tick (or the caller) may pass `now`; otherwise the current time.
function nowIso(context) {
  const given = context && typeof context.now === "string" ? Date.parse(context.now) : NaN;
  return new Date(Number.isFinite(given) ? given : Date.now()).toISOString();
}

// --- state file ------------------------------------------------------------------

function statePath(context) {
  return path.join(context.store.paths.root, "toolpack-state", "plan", "state.json");
}

function loadState(file) {
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (error) {
    if (error.code === "ENOENT") return { version: 1, activePlan: null, archivedPlans: [] };
    throw error;
  }
  let data;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new Error(`Invalid state file ${file}: ${error.message}`);
  }
  if (!isObject(data)) throw new Error(`Invalid state file ${file}: expected a JSON object`);
  return {
    version: 1,
    ...data,
    activePlan: isObject(data.activePlan) ? data.activePlan : null,
    archivedPlans: Array.isArray(data.archivedPlans) ? data.archivedPlans : [],
  };
}

// Atomic replace: the host may be killed mid-invocation, and a torn file would stop the toolpack.
function saveState(file, state) {
  const directory = path.dirname(file);
  fs.mkdirSync(directory, { recursive: true });
  const temporary = path.join(directory, `.${path.basename(file)}.${process.pid}.${crypto.randomUUID()}.tmp`);
  fs.writeFileSync(temporary, JSON.stringify(state, null, 2) + "\n");
  fs.renameSync(temporary, file);
}

// --- plan rules ------------------------------------------------------------

function planItems(plan) {
  if (!Array.isArray(plan.items)) plan.items = [];
  return plan.items;
}

function isComplete(plan) {
  const items = Array.isArray(plan.items) ? plan.items : [];
  return items.length > 0 && items.every((item) => isObject(item) && (item.status === "done" || item.status === "wont_do"));
}

function finalize(plan, now) {
  if (!isComplete(plan)) return false;
  const changed = plan.status !== "done" || !plan.completedAt;
  plan.status = "done";
  if (!plan.completedAt) plan.completedAt = now;
  return changed;
}

function reopen(plan) {
  if (plan.status === "done" && !isComplete(plan)) {
    plan.status = "active";
    delete plan.completedAt;
  }
}

function readItems(args) {
  if (Array.isArray(args.items)) {
    return args.items.filter((item) => typeof item === "string").map((item) => item.trim()).filter(Boolean);
  }
  const text = stringValue(args.itemsText);
  if (text === undefined) return [];
  return text
    .split(/\r?\n/)
    .map((line) => line.replace(ITEM_MARKER, "").trim())
    .filter(Boolean);
}

function appendItems(plan, texts, now) {
  const items = planItems(plan);
  let number = Number.isInteger(plan.nextItemNumber) && plan.nextItemNumber > 0 ? plan.nextItemNumber : items.length + 1;
  for (const text of texts) {
    items.push({ id: `item_${number}`, text, status: "tbd", createdAt: now, updatedAt: now });
    number += 1;
  }
  plan.nextItemNumber = number;
}

function resolveTarget(value, store) {
  let target = stringValue(value);
  if (target === undefined) {
    const config = store.config() || {};
    target = (isObject(config.communication) && config.communication.coordinatorAgent) || "pm";
  }
  const agentIds = store.listAgents().map((agent) => agent.id);
  if (!agentIds.includes(target)) throw new Error(`Unknown targetAgent: ${target}`);
  return target;
}

function archive(state, status, reason, now) {
  const archived = { ...state.activePlan, status };
  if (reason !== undefined) archived.closeReason = reason;
  else delete archived.closeReason;
  archived.closedAt = now;
  archived.updatedAt = now;
  if (status === "done" && !archived.completedAt) archived.completedAt = now;
  state.archivedPlans = [archived, ...state.archivedPlans].slice(0, MAX_ARCHIVED);
  state.activePlan = null;
}

function requireActivePlan(state) {
  if (!state.activePlan) throw new Error(NO_ACTIVE_PLAN);
  return state.activePlan;
}

// --- output ---------------------------------------------------------------------------

function planResult(state, title, includeArchived) {
  const plan = state.activePlan;
  const lines = [];
  let metrics;
  if (plan) {
    const items = Array.isArray(plan.items) ? plan.items.filter(isObject) : [];
    const count = (status) => items.filter((item) => item.status === status).length;
    const nudges = plan.nudgeCount || 0;
    lines.push(
      `Plan ${plan.id}: ${plan.title}`,
      `Status: ${plan.status}`,
      `Target: ${plan.targetAgent}`,
      `Items: ${count("tbd")} tbd, ${count("done")} done, ${count("wont_do")} wont_do`,
      `Nudges: ${nudges}${plan.lastNudgeAt ? `, last ${plan.lastNudgeAt}` : ""}`,
    );
    if (plan.instructions) lines.push(`Instructions: ${plan.instructions}`);
    lines.push("Items:");
    items.forEach((item, index) => {
      lines.push(`${index + 1}. ${item.id} [${item.status}] ${item.text}${item.note ? ` \u2014 ${item.note}` : ""}`);
    });
    const nudgeMetric = { label: "Nudges", value: nudges };
    if (plan.lastNudgeAt) nudgeMetric.description = `last ${plan.lastNudgeAt}`;
    metrics = [
      { label: "Status", value: plan.status },
      { label: "TBD", value: count("tbd") },
      { label: "Done", value: count("done") },
      { label: "Won't do", value: count("wont_do") },
      nudgeMetric,
    ];
  } else {
    lines.push("No active plan.");
    metrics = [{ label: "Active plan", value: "none" }];
  }
  const metadata = { metrics, activePlan: plan || null };
  if (includeArchived) {
    lines.push("", "Archived plans:");
    const archived = state.archivedPlans.filter(isObject);
    if (archived.length === 0) lines.push("- none");
    for (const entry of archived) {
      const when = entry.closedAt || entry.completedAt || entry.updatedAt || "unknown time";
      lines.push(`- ${entry.id} [${entry.status}] ${entry.title} (${when})`);
    }
    metadata.archivedPlans = state.archivedPlans;
  }
  return { title, output: lines.join("\n"), metadata };
}

// --- operations -------------------------------------------------------------------

function createPlan(context, input) {
  const args = objectInput(input);
  const file = statePath(context);
  const state = loadState(file);
  const replaceActive = booleanValue(args.replaceActive) === true;
  if (state.activePlan && !isComplete(state.activePlan) && !replaceActive) {
    throw new Error(`Active plan already exists: ${state.activePlan.id}; use plan.update or pass replaceActive: true`);
  }
  const texts = readItems(args);
  if (texts.length === 0) throw new Error("plan.create needs at least one item in itemsText");
  const title = requiredString(args.title, "title");
  const targetAgent = resolveTarget(args.targetAgent, context.store);
  const instructions = stringValue(args.instructions);
  const nudgeCooldownMs = nonNegativeInteger(args.nudgeCooldownMs, DEFAULT_COOLDOWN_MS);
  const maxNudges = nonNegativeInteger(args.maxNudges, 0);
  const now = nowIso(context);
  if (state.activePlan) {
    const status = replaceActive ? "replaced" : isComplete(state.activePlan) ? "done" : state.activePlan.status;
    archive(state, status, "replaced by new plan", now);
  }
  const plan = { id: `pln_${crypto.randomUUID()}`, status: "active", title, targetAgent };
  if (instructions !== undefined) plan.instructions = instructions;
  Object.assign(plan, { items: [], nextItemNumber: 1, nudgeCooldownMs, maxNudges, nudgeCount: 0, createdAt: now, updatedAt: now });
  appendItems(plan, texts, now);
  state.activePlan = plan;
  saveState(file, state);
  return planResult(state, "plan created", false);
}

function planStatus(context, input) {
  const args = objectInput(input, true);
  const state = loadState(statePath(context));
  return planResult(state, "plan status", booleanValue(args.includeArchived) === true);
}

function updatePlan(context, input) {
  const args = objectInput(input);
  const file = statePath(context);
  const state = loadState(file);
  const plan = requireActivePlan(state);
  const title = stringValue(args.title);
  if (title !== undefined) plan.title = title;
  if (has(args, "targetAgent")) plan.targetAgent = resolveTarget(args.targetAgent, context.store);
  if (has(args, "instructions")) {
    const instructions = stringValue(args.instructions);
    if (instructions !== undefined) plan.instructions = instructions;
    else delete plan.instructions;
  }
  if (has(args, "nudgeCooldownMs")) plan.nudgeCooldownMs = nonNegativeInteger(args.nudgeCooldownMs, plan.nudgeCooldownMs);
  if (has(args, "maxNudges")) plan.maxNudges = nonNegativeInteger(args.maxNudges, plan.maxNudges);
  const now = nowIso(context);
  const texts = readItems(args);
  if (texts.length > 0) {
    const mode = stringValue(args.itemMode) ?? "append";
    if (!ITEM_MODES.includes(mode)) throw new Error(`Invalid itemMode: ${mode}`);
    if (mode === "replace") {
      plan.items = [];
      plan.nextItemNumber = 1;
    }
    appendItems(plan, texts, now);
    reopen(plan);
  }
  plan.updatedAt = now;
  finalize(plan, now);
  saveState(file, state);
  return planResult(state, "plan updated", false);
}

function setItemStatus(context, input) {
  const args = objectInput(input);
  const file = statePath(context);
  const state = loadState(file);
  const plan = requireActivePlan(state);
  const items = planItems(plan);
  const itemId = stringValue(args.itemId);
  let item;
  if (itemId !== undefined) {
    item = items.find((candidate) => isObject(candidate) && candidate.id === itemId);
    if (!item) throw new Error(`Unknown plan item: ${itemId}`);
  } else {
    const itemIndex = numberValue(args.itemIndex);
    if (itemIndex === undefined) throw new Error("plan.set_item_status needs itemId or itemIndex");
    const position = Math.trunc(itemIndex);
    item = position >= 1 && position <= items.length ? items[position - 1] : undefined;
    if (!isObject(item)) throw new Error(`Unknown plan item index: ${itemIndex}`);
  }
  const status = stringValue(args.status);
  if (!ITEM_STATUSES.includes(status)) throw new Error(`Invalid item status: ${describe(args.status)}`);
  const now = nowIso(context);
  item.status = status;
  item.updatedAt = now;
  if (has(args, "text")) item.text = requiredString(args.text, "text");
  if (has(args, "note")) {
    const note = stringValue(args.note);
    if (note !== undefined) item.note = note;
    else delete item.note;
  }
  reopen(plan);
  plan.updatedAt = now;
  finalize(plan, now);
  saveState(file, state);
  return planResult(state, "plan item updated", false);
}

function closePlan(context, input) {
  const args = objectInput(input, true);
  const file = statePath(context);
  const state = loadState(file);
  const plan = requireActivePlan(state);
  const status = stringValue(args.status) ?? "done";
  if (!CLOSE_STATUSES.includes(status)) throw new Error(`Invalid close status: ${status}`);
  if (status === "done" && !isComplete(plan)) {
    throw new Error(
      "Cannot close the plan as done while tbd items remain; mark them done or wont_do, or close it as abandoned",
    );
  }
  archive(state, status, stringValue(args.reason), nowIso(context));
  saveState(file, state);
  return planResult(state, "plan closed", true);
}

// --- continuation nudge ---------------------------------------------------------------

function nudgeMessage(plan, remaining) {
  const lines = [
    "Continue the active plan ahead of routine queued work.",
    `Plan: ${plan.title}`,
    `Plan id: ${plan.id}`,
    `Target agent: ${plan.targetAgent}`,
  ];
  if (plan.instructions) lines.push(`Instructions: ${plan.instructions}`);
  lines.push("Remaining TBD items:");
  for (const item of remaining) lines.push(`- ${item.id}: ${item.text}`);
  lines.push(
    "After meaningful progress, mark items done or wont_do with plan.set_item_status; use plan.status to see the current plan.",
  );
  return lines.join("\n");
}

function hasPendingNudge(context, plan) {
  const rows = context.store.db
    .prepare(
      "SELECT payload_json FROM signals WHERE project = ? AND status = 'pending' AND kind = ? AND target_agent = ?",
    )
    .all(context.project, NUDGE_KIND, plan.targetAgent);
  return rows.some((row) => {
    let payload;
    try {
      payload = JSON.parse(row.payload_json);
    } catch (error) {
      return true;
    }
    return !isObject(payload) || payload.planId === plan.id;
  });
}

function integerSetting(value, fallback) {
  const number = Number(value);
  return value === undefined || value === null || !Number.isFinite(number) ? fallback : Math.max(0, Math.trunc(number));
}

export function schedulerTick(context) {
  const file = statePath(context);
  const state = loadState(file);
  const plan = state.activePlan;
  if (!plan || plan.status !== "active") return [];
  const now = nowIso(context);
  if (isComplete(plan)) {
    finalize(plan, now);
    saveState(file, state);
    return [];
  }
  const agents = Array.isArray(context.agents) ? context.agents : [];
  const target = agents.find((agent) => agent && agent.id === plan.targetAgent);
  if (!target) return [];
  if (target.modelAlive === true) return [];
  if (hasPendingNudge(context, plan)) return [];
  const cooldown = integerSetting(plan.nudgeCooldownMs, DEFAULT_COOLDOWN_MS);
  const lastNudge = typeof plan.lastNudgeAt === "string" ? Date.parse(plan.lastNudgeAt) : NaN;
  if (Number.isFinite(lastNudge) && cooldown > 0 && Date.parse(now) - lastNudge < cooldown) return [];
  const maxNudges = integerSetting(plan.maxNudges, 0);
  const nudgeCount = integerSetting(plan.nudgeCount, 0);
  if (maxNudges > 0 && nudgeCount >= maxNudges) return [];
  plan.nudgeCount = nudgeCount + 1;
  plan.lastNudgeAt = now;
  plan.updatedAt = now;
  saveState(file, state);
  const remaining = planItems(plan)
    .filter((item) => isObject(item) && item.status === "tbd")
    .map((item) => ({ id: item.id, text: item.text }));
  return [
    {
      kind: NUDGE_KIND,
      targetAgent: plan.targetAgent,
      priority: "P2",
      usefulEffect: false,
      payload: {
        planId: plan.id,
        title: plan.title,
        message: nudgeMessage(plan, remaining),
        remainingItems: remaining,
        nudgeCount: plan.nudgeCount,
      },
    },
  ];
}

// --- module exports --------------------------------------------------------------------

function handlers(context) {
  return {
    "plan.create": (input) => createPlan(context, input),
    "plan.status": (input) => planStatus(context, input),
    "plan.update": (input) => updatePlan(context, input),
    "plan.set_item_status": (input) => setItemStatus(context, input),
    "plan.close": (input) => closePlan(context, input),
  };
}

export function createControllerToolpack(context) {
  return { tools: handlers(context) };
}

export function createWebuiToolpack(context) {
  const tools = handlers(context);
  return {
    webui: {
      "plan.board": tools["plan.status"],
      "plan.create": tools["plan.create"],
      "plan.update": tools["plan.update"],
      "plan.set_item_status": tools["plan.set_item_status"],
      "plan.close": tools["plan.close"],
    },
  };
}
