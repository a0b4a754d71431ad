// Suzumio Node host for local toolpack `.mjs` modules: one script, two roles.
//   --role controller  controller modules, scheduler hooks and WebUI handlers, driven by the
//                      controller (docs/design/tools.md) with synchronous callbacks into its store.
//   --role runner      runner modules inside an activation (docs/design/runner.md).
// Started by suzumio_node.py (controller) and suzumio_runner.py (runner); Node >= 18, stdlib only.
// stdout carries only protocol lines (one compact JSON object per line); everything else goes to stderr.

import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import { pathToFileURL } from "node:url";
import util from "node:util";

const MIN_NODE_MAJOR = 18;
const PARENT_CHECK_MS = 500; // how often an invocation in flight checks that its controller lives
const READ_RETRY_MS = 5;
const CONTROLLER_REQUEST_TIMEOUT_MS = 300000;

// ---------------------------------------------------------------------------------------------
// Output discipline: module output must never reach stdout, which belongs to the protocol.

const stderrLog = (...args) => {
  process.stderr.write(util.format(...args) + "\n");
};

function redirectConsoleToStderr() {
  for (const method of ["log", "info", "warn", "error", "debug", "trace"]) {
    console[method] = stderrLog;
  }
  // Modules that write to process.stdout directly get stderr too. Touching the real stdout stream
  // would also switch fd 1 to non-blocking mode, so the getter never creates it.
  const descriptor = Object.getOwnPropertyDescriptor(process, "stdout");
  Object.defineProperty(process, "stdout", {
    configurable: true,
    enumerable: descriptor ? descriptor.enumerable : true,
    get: () => process.stderr,
  });
}

const sleepBuffer = new Int32Array(new SharedArrayBuffer(4));

function pause(ms) {
  Atomics.wait(sleepBuffer, 0, 0, ms);
}

function writeAllSync(fd, text) {
  const bytes = Buffer.from(text, "utf8");
  let offset = 0;
  while (offset < bytes.length) {
    try {
      offset += fs.writeSync(fd, bytes, offset, bytes.length - offset);
    } catch (error) {
      if (error.code !== "EAGAIN") throw error;
      pause(READ_RETRY_MS);
    }
  }
}

function sendLine(message) {
  writeAllSync(1, JSON.stringify(message) + "\n");
}

function errorMessage(error) {
  return error instanceof Error ? error.message : String(error);
}

function plainValue(value) {
  return value === undefined ? null : value;
}

// ---------------------------------------------------------------------------------------------
// Controller role: synchronous line reader on fd 0 (docs/design/tools.md). process.stdin is never used:
// creating it would make the pipe non-blocking and compete for its bytes.

class SyncLineReader {
  constructor(fd) {
    this.fd = fd;
    this.pending = Buffer.alloc(0);
    this.chunk = Buffer.alloc(65536);
    this.ended = false;
  }

  // The next line without its newline, or null at end of input.
  readLine() {
    for (;;) {
      const newline = this.pending.indexOf(0x0a);
      if (newline >= 0) {
        const line = this.pending.subarray(0, newline).toString("utf8");
        this.pending = this.pending.subarray(newline + 1);
        return line;
      }
      if (this.ended) {
        if (this.pending.length === 0) return null;
        const rest = this.pending.toString("utf8");
        this.pending = Buffer.alloc(0);
        return rest;
      }
      let count;
      try {
        count = fs.readSync(this.fd, this.chunk, 0, this.chunk.length, null);
      } catch (error) {
        if (error.code === "EAGAIN") {
          pause(READ_RETRY_MS);
          continue;
        }
        if (error.code === "EOF") {
          count = 0;
        } else {
          throw error;
        }
      }
      if (count === 0) {
        this.ended = true;
      } else {
        this.pending = Buffer.concat([this.pending, this.chunk.subarray(0, count)]);
      }
    }
  }
}

class ControllerHost {
  constructor() {
    this.reader = new SyncLineReader(0);
    this.invocationId = null;
    this.nextCallId = 1;
  }

  // A synchronous callback into the controller: write the call, block until its reply arrives.
  call(name, args) {
    const callId = this.nextCallId++;
    const trimmed = [...args];
    while (trimmed.length > 0 && trimmed[trimmed.length - 1] === undefined) trimmed.pop();
    sendLine({ type: "call", id: this.invocationId, callId, name, args: trimmed });
    for (;;) {
      const line = this.reader.readLine();
      if (line === null) {
        stderrLog("suzumio host: controller closed stdin during callback %s", name);
        process.exit(0);
      }
      if (!line.trim()) continue;
      let message;
      try {
        message = JSON.parse(line);
      } catch (error) {
        stderrLog("suzumio host: ignoring invalid line while waiting for reply: %s", line.slice(0, 200));
        continue;
      }
      if (!message || message.type !== "reply" || message.callId !== callId) {
        stderrLog("suzumio host: ignoring unexpected message while waiting for reply %d", callId);
        continue;
      }
      if (message.ok) return message.value;
      throw new Error(typeof message.error === "string" ? message.error : String(message.error));
    }
  }

  caller(name) {
    return (...args) => this.call(name, args);
  }

  buildStore(context) {
    const statement = (sql) => ({
      all: (...params) => this.call("store.db.all", [sql, ...params]),
      get: (...params) => {
        const row = this.call("store.db.get", [sql, ...params]);
        return row === null ? undefined : row;
      },
      run: (...params) => this.call("store.db.run", [sql, ...params]),
    });
    const store = {
      project: context.project,
      paths: { ...(context.paths || {}) },
      db: { prepare: statement },
    };
    for (const name of [
      "config",
      "projectRow",
      "projectStats",
      "listAgents",
      "requireAgent",
      "sendMessage",
      "recordSignal",
      "listMessages",
      "message",
      "listEvents",
      "appendEvent",
      "hasPendingSignals",
      "hasPendingSignalsForAgent",
    ]) {
      store[name] = this.caller(`store.${name}`);
    }
    return store;
  }

  buildContext(op, request) {
    const given = request.context || {};
    const context = {
      store: this.buildStore(given),
      project: given.project,
      toolpackId: request.toolpackId,
      recordSignal: this.caller("context.recordSignal"),
      hasPendingSignals: this.caller("context.hasPendingSignals"),
      hasPendingSignalsForAgent: this.caller("context.hasPendingSignalsForAgent"),
    };
    if (given.now !== undefined) context.now = given.now;
    if (op === "support") {
      context.agent = given.agent;
      context.activationId = given.activationId;
    } else if (op === "schedulerTick") {
      context.agents = Array.isArray(given.agents) ? given.agents : [];
    }
    return context;
  }

  async dispatch(request) {
    const op = request.op;
    if (op !== "support" && op !== "webui" && op !== "schedulerTick") {
      throw new Error(`Unknown host operation: ${op}`);
    }
    if (typeof request.module !== "string" || !request.module) {
      throw new Error("module is required");
    }
    const mod = await import(pathToFileURL(request.module).href);
    const context = this.buildContext(op, request);
    if (op === "support") return supportDispatch(mod, request, context);
    if (op === "webui") return webuiDispatch(mod, request, context);
    return schedulerTickDispatch(mod, context);
  }

  async run() {
    for (;;) {
      const line = this.reader.readLine();
      if (line === null) return;
      if (!line.trim()) continue;
      let request;
      try {
        request = JSON.parse(line);
      } catch (error) {
        sendLine({ type: "result", id: null, ok: false, error: `Invalid invocation line: ${errorMessage(error)}` });
        continue;
      }
      if (!request || request.type !== "invoke") {
        stderrLog("suzumio host: ignoring message of type %s between invocations", request && request.type);
        continue;
      }
      this.invocationId = request.id;
      this.nextCallId = 1;
      // A module awaiting a promise that never settles leaves Node with nothing to do, and Node
      // would exit; the timer keeps the process alive until the controller's timeout kills it. It
      // also watches the parent: a controller killed meanwhile never closes our stdin while nothing
      // reads it, so an orphaned host (re-parented) exits by itself.
      const parent = process.ppid;
      const keepAlive = setInterval(() => {
        if (process.ppid !== parent) process.exit(1);
      }, PARENT_CHECK_MS);
      let reply;
      try {
        const value = await this.dispatch(request);
        reply = { type: "result", id: request.id, ok: true, value: plainValue(value) };
        JSON.stringify(reply);
      } catch (error) {
        reply = { type: "result", id: request.id, ok: false, error: errorMessage(error) };
      }
      clearInterval(keepAlive);
      this.invocationId = null;
      sendLine(reply);
    }
  }
}

// docs/design/tools.md
async function supportDispatch(mod, request, context) {
  const id = request.toolpackId;
  const tool = request.tool;
  const factory =
    typeof mod.createControllerToolpack === "function"
      ? mod.createControllerToolpack
      : typeof mod.default === "function"
        ? mod.default
        : null;
  if (!factory) {
    throw new Error(`Controller module of ${id} exports neither createControllerToolpack nor a default factory`);
  }
  const instance = await factory(context);
  if (instance && typeof instance.support === "function") {
    return instance.support(tool, request.input);
  }
  const handlers = instance && instance.tools != null ? instance.tools : instance;
  if (handlers && typeof handlers[tool] === "function") {
    return handlers[tool](request.input);
  }
  return {
    title: "toolpack support",
    output: `Controller side of ${id} did not handle ${tool}.`,
    metadata: { toolpack: id, tool },
  };
}

// docs/design/tools.md
async function webuiDispatch(mod, request, context) {
  const id = request.toolpackId;
  const entryId = request.entryId;
  let instance;
  if (typeof mod.createWebuiToolpack === "function") {
    instance = await mod.createWebuiToolpack(context);
  } else {
    instance = mod.webui !== undefined ? mod.webui : mod.default;
  }
  if (typeof instance === "function") {
    return instance(entryId, request.input);
  }
  let handlers = instance;
  if (instance && instance.webui != null) handlers = instance.webui;
  else if (instance && instance.tools != null) handlers = instance.tools;
  if (handlers && typeof handlers[entryId] === "function") {
    return handlers[entryId](request.input);
  }
  return {
    title: "toolpack webui",
    output: `WebUI side of ${id} did not handle ${entryId}.`,
    metadata: { toolpack: id, entryId },
  };
}

// docs/design/tools.md: the raw resolved value; the controller validates the requests.
async function schedulerTickDispatch(mod, context) {
  if (typeof mod.schedulerTick === "function") {
    return mod.schedulerTick(context);
  }
  if (typeof mod.createSchedulerToolpack === "function") {
    const made = await mod.createSchedulerToolpack(context);
    if (typeof made === "function") return made();
    if (made && typeof made.schedulerTick === "function") return made.schedulerTick();
    if (made && typeof made.tick === "function") return made.tick();
  }
  return null;
}

// ---------------------------------------------------------------------------------------------
// Runner role (docs/design/runner.md): newline-delimited requests on stdin, answered in order.

function controllerErrorText(status, body) {
  const text = body.trim();
  if (text) {
    try {
      const parsed = JSON.parse(text);
      if (parsed && typeof parsed === "object" && !Array.isArray(parsed) && typeof parsed.error === "string") {
        return parsed.error;
      }
    } catch (error) {
      // Not JSON: the raw body is the message.
    }
    return text;
  }
  return `Request failed: ${status}`;
}

// node:http takes (url, options, callback) or (options, callback): a socket target is options.
function openRequest(transport, target, options, callback) {
  return target instanceof URL
    ? transport.request(target, options, callback)
    : transport.request({ ...target, ...options }, callback);
}

// POST JSON straight to the controller; never through a proxy (node:http ignores proxy variables).
// A `unix://<path>` controllerUrl is the controller's runner socket; an https one is verified against
// `ca` (the activation's controllerCa) when given.
function postToController(controllerUrl, path, body, ca) {
  return new Promise((resolve, reject) => {
    let target;
    let transport = http;
    if (controllerUrl.startsWith("unix://")) {
      target = { socketPath: controllerUrl.slice("unix://".length), path };
    } else {
      try {
        target = new URL(controllerUrl.replace(/\/+$/, "") + path);
      } catch (error) {
        reject(new Error(`Invalid controllerUrl: ${controllerUrl}`));
        return;
      }
      transport = target.protocol === "https:" ? https : http;
    }
    const payload = Buffer.from(JSON.stringify(body), "utf8");
    const request = openRequest(
      transport,
      target,
      {
        method: "POST",
        agent: false,
        headers: { "Content-Type": "application/json", "Content-Length": payload.length },
        timeout: CONTROLLER_REQUEST_TIMEOUT_MS,
        ...(transport === https && ca ? { ca } : {}),
      },
      (response) => {
        const chunks = [];
        response.on("data", (chunk) => chunks.push(chunk));
        response.on("error", (error) => reject(new Error(`Suzumio controller request failed: ${error.message}`)));
        response.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          const status = response.statusCode || 0;
          if (status < 200 || status >= 300) {
            reject(new Error(controllerErrorText(status, text)));
            return;
          }
          if (!text.trim()) {
            resolve({});
            return;
          }
          try {
            resolve(JSON.parse(text));
          } catch (error) {
            reject(new Error(`Invalid JSON response from controller: ${errorMessage(error)}`));
          }
        });
      },
    );
    request.on("timeout", () => request.destroy(new Error(`timed out after ${CONTROLLER_REQUEST_TIMEOUT_MS} ms`)));
    request.on("error", (error) =>
      reject(
        new Error(
          `Suzumio controller request failed: ${error.message}. The Suzumio server must be running and ` +
            `reachable at ${controllerUrl} (its runner socket, or serve --runner-listen HOST:PORT ` +
            `named by backend.controllerUrl).`,
        ),
      ),
    );
    request.end(payload);
  });
}

class RunnerHost {
  constructor() {
    this.toolpackId = null;
    this.handlers = null;
  }

  async init(request) {
    const given = request.context || {};
    const identity = {
      project: given.project,
      agentId: given.agentId,
      activationId: given.activationId,
      token: given.token,
    };
    const context = {
      project: given.project,
      agentId: given.agentId,
      activationId: given.activationId,
      workspace: given.workspace,
      toolpackId: given.toolpackId,
      callSupport: (tool, input) =>
        postToController(given.controllerUrl, given.supportPath, { ...identity, tool, input: input ?? {} }, given.controllerCa),
      recordSignal: (signal) =>
        postToController(given.controllerUrl, "/runner/signals", { ...identity, ...signal }, given.controllerCa),
    };
    const mod = await import(pathToFileURL(request.module).href);
    const factory =
      typeof mod.createRunnerToolpack === "function"
        ? mod.createRunnerToolpack
        : typeof mod.default === "function"
          ? mod.default
          : null;
    if (!factory) throw new Error(`Runner module for ${given.toolpackId} must export createRunnerToolpack`);
    const instance = await factory(context);
    const handlers = instance && instance.tools != null ? instance.tools : instance;
    this.toolpackId = given.toolpackId;
    this.handlers = handlers && typeof handlers === "object" ? handlers : {};
    return Object.keys(this.handlers).filter((name) => typeof this.handlers[name] === "function");
  }

  async callTool(request) {
    if (!this.handlers) throw new Error("Runner module is not initialized");
    const name = request.tool;
    const handler = this.handlers[name];
    if (typeof handler !== "function") {
      throw new Error(`Runner module for ${this.toolpackId} did not register ${name}`);
    }
    const result = await handler.call(this.handlers, request.input ?? {});
    if (!result || typeof result !== "object" || Array.isArray(result) || typeof result.output !== "string") {
      throw new Error(`Runner tool ${name} returned an invalid result`);
    }
    const clean = { output: result.output };
    if (result.title !== undefined) clean.title = result.title;
    if (result.metadata !== undefined) clean.metadata = result.metadata;
    return clean;
  }

  async handle(line) {
    let request;
    try {
      request = JSON.parse(line);
    } catch (error) {
      sendLine({ id: null, ok: false, error: `Invalid request line: ${errorMessage(error)}` });
      return;
    }
    const id = request && request.id !== undefined ? request.id : null;
    try {
      if (request.op === "init") {
        sendLine({ id, ok: true, tools: await this.init(request) });
      } else if (request.op === "call") {
        const reply = { id, ok: true, result: await this.callTool(request) };
        sendLine(reply);
      } else {
        throw new Error(`Unknown runner host operation: ${request.op}`);
      }
    } catch (error) {
      sendLine({ id, ok: false, error: errorMessage(error) });
    }
  }

  run() {
    // Requests are answered strictly in order: a call never overtakes the init before it.
    let queue = Promise.resolve();
    let buffered = "";
    const input = process.stdin;
    input.setEncoding("utf8");
    input.on("data", (text) => {
      buffered += text;
      let newline;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.trim()) queue = queue.then(() => this.handle(line));
      }
    });
    input.on("end", () => {
      if (buffered.trim()) {
        const line = buffered;
        queue = queue.then(() => this.handle(line));
      }
      queue.then(() => process.exit(0));
    });
  }
}

// ---------------------------------------------------------------------------------------------

function roleFromArgs(argv) {
  const index = argv.indexOf("--role");
  if (index >= 0) return argv[index + 1];
  const inline = argv.find((arg) => arg.startsWith("--role="));
  return inline ? inline.slice("--role=".length) : undefined;
}

async function main() {
  redirectConsoleToStderr();
  const major = Number(process.versions.node.split(".")[0]);
  if (major < MIN_NODE_MAJOR) {
    stderrLog("suzumio host: Node.js %d or newer is required (found %s)", MIN_NODE_MAJOR, process.versions.node);
    process.exit(1);
  }
  const role = roleFromArgs(process.argv.slice(2));
  if (role === "controller") {
    await new ControllerHost().run();
    process.exit(0);
  } else if (role === "runner") {
    new RunnerHost().run();
  } else {
    stderrLog("usage: node suzumio_toolpack_host.mjs --role controller|runner");
    process.exit(2);
  }
}

process.on("unhandledRejection", (reason) => {
  stderrLog("suzumio host: unhandled rejection: %s", errorMessage(reason));
});

main().catch((error) => {
  stderrLog("suzumio host: %s", error && error.stack ? error.stack : String(error));
  process.exit(1);
});
