// Controller module of the packaged `scheduler` toolpack (docs/design/toolpacks.md): scheduled
// messages kept in <project dir>/toolpack-state/scheduler/jobs.json, created by the schedule.* tools
// and WebUI actions, and sent by the scheduler hook when due. Runs in the controller's Node host.
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";

const PRIORITIES = ["P0", "P1", "P2", "P3"];
const WEEKDAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
const DELAY_FACTORS = { afterMs: 1, afterSeconds: 1000, afterMinutes: 60000, afterHours: 3600000, afterDays: 86400000 };
const INTERVAL_FACTORS = { everyMs: 1, everyMinutes: 60000, everyHours: 3600000, everyDays: 86400000 };
const TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d+))?)?(Z|[+-]\d{2}:\d{2})?)?$/;

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
  return value;
}

function booleanValue(value) {
  return value === true || value === false ? value : undefined;
}

function numberValue(value) {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value === "number" && Number.isFinite(value)) return value;
  throw new Error(`Expected a finite number, got ${describe(value)}`);
}

function priorityValue(value) {
  if (value === undefined || value === null || value === "") return "P3";
  if (PRIORITIES.includes(value)) return value;
  throw new Error(`Invalid priority: ${describe(value)}`);
}

// Milliseconds of an ISO-8601 date-time or date (a zoneless time is UTC), or NaN.
function parseTimestamp(value) {
  if (typeof value !== "string") return NaN;
  const match = TIMESTAMP.exec(value);
  if (!match) return NaN;
  const [, year, month, day, hour = "0", minute = "0", second = "0", fraction = "", zone = "Z"] = match;
  const numbers = [year, month, day, hour, minute, second].map(Number);
  const [y, mo, d, h, mi, s] = numbers;
  if (mo < 1 || mo > 12 || h > 23 || mi > 59 || s > 59) return NaN;
  const millis = Number((fraction + "000").slice(0, 3));
  const local = Date.UTC(y, mo - 1, d, h, mi, s, millis);
  if (new Date(local).getUTCDate() !== d) return NaN;
  let offset = 0;
  if (zone !== "Z") {
    const zoneHours = Number(zone.slice(1, 3));
    const zoneMinutes = Number(zone.slice(4, 6));
    if (zoneHours > 23 || zoneMinutes > 59) return NaN;
    offset = (zone[0] === "-" ? -1 : 1) * (zoneHours * 60 + zoneMinutes) * 60000;
  }
  return local - offset;
}

function timestampValue(value, label) {
  const millis = parseTimestamp(value);
  if (Number.isNaN(millis)) throw new Error(`Invalid ${label} timestamp: ${describe(value)}`);
  return millis;
}

function iso(millis) {
  return new Date(millis).toISOString();
}

// The tick (or the caller) may pass `now`; otherwise the current time.
function nowMillis(context) {
  const given = context && typeof context.now === "string" ? Date.parse(context.now) : NaN;
  return Number.isFinite(given) ? given : Date.now();
}

function oneLine(text, limit) {
  const collapsed = String(text ?? "").replace(/\s+/g, " ").trim();
  const characters = Array.from(collapsed);
  return characters.length > limit ? characters.slice(0, limit - 3).join("") + "..." : collapsed;
}

function sumOf(args, factors) {
  let total = 0;
  for (const [key, factor] of Object.entries(factors)) {
    const value = numberValue(args[key]);
    if (value !== undefined) total += Math.max(0, value) * factor;
  }
  return total;
}

// --- state file ------------------------------------------------------------------

function jobsPath(context) {
  return path.join(context.store.paths.root, "toolpack-state", "scheduler", "jobs.json");
}

function loadState(file) {
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (error) {
    if (error.code === "ENOENT") return { version: 1, jobs: [] };
    throw error;
  }
  let data;
  try {
    data = JSON.parse(text);
  } catch (error) {
    throw new Error(`Invalid state file ${file}: ${error.message}`);
  }
  if (!isObject(data)) throw new Error(`Invalid state file ${file}: expected a JSON object`);
  return { version: 1, ...data, jobs: Array.isArray(data.jobs) ? data.jobs : [] };
}

// Atomic replace: the host may be killed mid-invocation, and a torn file would stop the toolpack.
function saveState(file, state) {
  const directory = path.dirname(file);
  fs.mkdirSync(directory, { recursive: true });
  const temporary = path.join(directory, `.${path.basename(file)}.${process.pid}.${crypto.randomUUID()}.tmp`);
  fs.writeFileSync(temporary, JSON.stringify(state, null, 2) + "\n");
  fs.renameSync(temporary, file);
}

// --- schedules -------------------------------------------------------------------------

function nextFiring(schedule, after) {
  if (isObject(schedule) && schedule.mode === "interval") {
    const every = Math.max(1, Math.trunc(Number(schedule.everyMs)));
    if (Number.isFinite(every)) return after + every;
  }
  if (isObject(schedule) && schedule.mode === "weekly") {
    const weekday = WEEKDAYS.indexOf(schedule.weekday);
    const { hour, minute } = schedule;
    if (weekday >= 0 && Number.isInteger(hour) && Number.isInteger(minute)) {
      const base = new Date(after);
      for (let offset = 0; offset <= 7; offset += 1) {
        const candidate = Date.UTC(base.getUTCFullYear(), base.getUTCMonth(), base.getUTCDate() + offset, hour, minute);
        if (new Date(candidate).getUTCDay() === weekday && candidate > after) return candidate;
      }
    }
  }
  throw new Error(`Invalid schedule: ${describe(schedule)}`);
}

function readWeeklySchedule(weekday, time) {
  if (!WEEKDAYS.includes(weekday)) throw new Error(`Invalid weekday: ${weekday}`);
  const match = /^(\d{1,2}):(\d{2})$/.exec(time);
  const hour = match ? Number(match[1]) : NaN;
  const minute = match ? Number(match[2]) : NaN;
  if (!match || hour > 23 || minute > 59) throw new Error(`Invalid time (expected HH:MM): ${time}`);
  return { mode: "weekly", weekday, hour, minute, timezone: "UTC" };
}

// --- routing ---------------------------------------------------------------------------

function route(args, store) {
  const recipient = stringValue(args.recipient);
  const channel = stringValue(args.channel);
  if (recipient !== undefined && channel !== undefined) {
    throw new Error("Give either recipient or channel, not both");
  }
  if (channel !== undefined) {
    const config = store.config() || {};
    const channels = Array.isArray(config.channels) ? config.channels : [];
    if (!channels.includes(channel)) throw new Error(`Unknown channel: ${channel}`);
    return { channel };
  }
  const agentIds = store.listAgents().map((agent) => agent.id).sort();
  let target = recipient;
  if (target === undefined) {
    const config = store.config() || {};
    const coordinator = (isObject(config.communication) && config.communication.coordinatorAgent) || "pm";
    target = agentIds.includes(coordinator) ? coordinator : agentIds.length > 0 ? agentIds[0] : "user";
  }
  if (target !== "user" && !agentIds.includes(target)) throw new Error(`Unknown recipient: ${target}`);
  return { recipient: target };
}

// --- operations -------------------------------------------------------------------------------

function createJob(context, type, routing, nextAt, priority, body, schedule, args, now) {
  const job = {
    id: `sch_${crypto.randomUUID()}`,
    type,
    status: "active",
    createdAt: iso(now),
    nextAt: iso(nextAt),
    sentCount: 0,
    sender: stringValue(args.sender) ?? "scheduler",
    ...routing,
    priority,
    waitForQuiet: booleanValue(args.waitForQuiet) ?? false,
    body,
    schedule,
  };
  const file = jobsPath(context);
  const state = loadState(file);
  state.jobs.push(job);
  saveState(file, state);
  return {
    title: "scheduled message created",
    output: [
      `Scheduled ${job.id}.`,
      `Next: ${job.nextAt}`,
      `Route: ${job.sender} -> ${job.recipient ?? job.channel}`,
      `Priority: ${job.priority}`,
    ].join("\n"),
    metadata: { job },
  };
}

function scheduleOnce(context, input) {
  const args = objectInput(input);
  const routing = route(args, context.store);
  const now = nowMillis(context);
  const delay = sumOf(args, DELAY_FACTORS);
  const at = stringValue(args.at);
  let nextAt;
  if (at !== undefined) {
    nextAt = timestampValue(at, "at");
  } else {
    if (!(delay > 0)) throw new Error("schedule.once needs at or a positive after* delay");
    nextAt = Math.floor(now + delay);
  }
  const priority = priorityValue(args.priority);
  const body = requiredString(args.body, "body");
  const schedule = {};
  if (at !== undefined) schedule.at = at;
  if (delay > 0) schedule.afterMs = delay;
  return createJob(context, "once", routing, nextAt, priority, body, schedule, args, now);
}

function scheduleRecurring(context, input) {
  const args = objectInput(input);
  const routing = route(args, context.store);
  const now = nowMillis(context);
  const interval = sumOf(args, INTERVAL_FACTORS);
  const weekday = stringValue(args.weekday);
  const time = stringValue(args.time);
  let schedule;
  if (interval > 0) {
    if (weekday !== undefined || time !== undefined) {
      throw new Error("Give either an every* interval or weekday plus time, not both");
    }
    schedule = { mode: "interval", everyMs: interval };
  } else {
    if (weekday === undefined || time === undefined) {
      throw new Error("schedule.recurring needs a positive every* interval, or weekday plus time");
    }
    schedule = readWeeklySchedule(weekday, time);
  }
  const startAtText = stringValue(args.startAt);
  const startAt = startAtText === undefined ? undefined : timestampValue(startAtText, "startAt");
  const priority = priorityValue(args.priority);
  const body = requiredString(args.body, "body");
  const futureStart = startAt !== undefined && startAt > now;
  const nextAt =
    schedule.mode === "interval" && futureStart ? startAt : nextFiring(schedule, futureStart ? startAt - 1 : now);
  if (startAtText !== undefined) schedule.startAt = startAtText;
  return createJob(context, "recurring", routing, nextAt, priority, body, schedule, args, now);
}

function jobLine(job) {
  const target = job.recipient ?? job.channel ?? "no target";
  const waits = job.waitForQuiet === true ? ", waits for quiet" : "";
  return (
    `- ${job.id} [${job.status}/${job.type}] next ${job.nextAt || "none"}, ${job.priority} ${job.sender} -> ` +
    `${target}, sent ${job.sentCount || 0}${waits}: ${oneLine(job.body, 140)}`
  );
}

function listJobs(context, input) {
  const args = objectInput(input, true);
  const includeInactive = booleanValue(args.includeInactive) === true;
  const jobs = loadState(jobsPath(context)).jobs.filter(isObject);
  const listed = includeInactive ? jobs : jobs.filter((job) => job.status === "active");
  const count = (status) => jobs.filter((job) => job.status === status).length;
  return {
    title: "scheduled messages",
    output: ["Scheduled messages:", ...(listed.length > 0 ? listed.map(jobLine) : ["- none"])].join("\n"),
    metadata: {
      metrics: [
        { label: "Active", value: count("active") },
        { label: "Done", value: count("done") },
        { label: "Cancelled", value: count("cancelled") },
      ],
      jobs: listed,
    },
  };
}

function cancelJob(context, input) {
  const args = objectInput(input);
  const id = requiredString(args.id, "id");
  const file = jobsPath(context);
  const state = loadState(file);
  const job = state.jobs.find((candidate) => isObject(candidate) && candidate.id === id);
  if (!job) throw new Error(`Unknown scheduled job: ${id}`);
  if (job.status === "active") {
    job.status = "cancelled";
    job.cancelledAt = iso(nowMillis(context));
    saveState(file, state);
  }
  return { title: "scheduled message cancelled", output: `Cancelled ${id}.`, metadata: { job } };
}

// --- module exports --------------------------------------------------------------------

function handlers(context) {
  return {
    "schedule.once": (input) => scheduleOnce(context, input),
    "schedule.recurring": (input) => scheduleRecurring(context, input),
    "schedule.list": (input) => listJobs(context, input),
    "schedule.cancel": (input) => cancelJob(context, input),
  };
}

export function createControllerToolpack(context) {
  return { tools: handlers(context) };
}

export function createWebuiToolpack(context) {
  const tools = handlers(context);
  return {
    webui: {
      "schedule.jobs": tools["schedule.list"],
      "schedule.once": tools["schedule.once"],
      "schedule.recurring": tools["schedule.recurring"],
      "schedule.cancel": tools["schedule.cancel"],
    },
  };
}

// Due jobs. Saved after every send, so a failure later in the tick never resends a job; each send
// carries the run's key (job id and due time), so a crash between the send and the save makes the next
// tick's send answer the message already recorded instead of writing a second one.
export function schedulerTick(context) {
  const file = jobsPath(context);
  const state = loadState(file);
  const now = nowMillis(context);
  const agents = Array.isArray(context.agents) ? context.agents : [];
  const modelAlive = new Set(agents.filter((agent) => agent && agent.modelAlive === true).map((agent) => agent.id));
  for (let index = 0; index < state.jobs.length; index += 1) {
    const job = state.jobs[index];
    if (!isObject(job) || job.status !== "active") continue;
    const due = parseTimestamp(job.nextAt);
    if (Number.isNaN(due)) throw new Error(`Invalid nextAt timestamp: ${describe(job.nextAt)}`);
    if (due > now) continue;
    if (job.waitForQuiet === true && typeof job.recipient === "string" && modelAlive.has(job.recipient)) continue;
    // Computed before sending: a broken schedule must fail the hook before a message goes out.
    const recurring = job.type === "recurring";
    const nextAt = recurring ? iso(nextFiring(job.schedule, now)) : undefined;
    const message = {
      sender: job.sender ?? "scheduler",
      priority: job.priority ?? "P3",
      body: job.body,
      idempotencyKey: `scheduler:${job.id}@${job.nextAt}`,
    };
    if (job.recipient !== undefined) message.recipient = job.recipient;
    if (job.channel !== undefined) message.channel = job.channel;
    const sent = context.store.sendMessage(message);
    const updated = { ...job, sentCount: (Number(job.sentCount) || 0) + 1, lastSentAt: iso(now), lastMessageId: sent.id };
    if (recurring) {
      updated.nextAt = nextAt;
    } else {
      updated.status = "done";
      updated.completedAt = iso(now);
    }
    state.jobs[index] = updated;
    saveState(file, state);
  }
  return [];
}
