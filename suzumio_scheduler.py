"""The scheduler (docs/design/scheduler.md): one `tick` of a project in its order of steps (the token
budget, P0 restarts, the activation timeout, prompt composition, hooks, then the nudges and monitors of
suzumio_coordination), the background thread that ticks projects when something changed or fell due, and
stopping/approving projects."""
import logging
import threading
import time
from datetime import timedelta

import suzumio_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_guards
import suzumio_prompts
import suzumio_replay
import suzumio_toolpacks
from suzumio_errors import Conflict, NotFound
from suzumio_records import (
    ACT_RUNNING,
    AGENT_FAILED,
    AGENT_QUIET,
    AGENT_RUNNING,
    AGENT_STOPPED,
    EVENT_HOOK_FAILED,
    PROJECT_RUNNING,
    parse_ts,
    to_datetime,
    utc_now,
)

log = logging.getLogger(__name__)

TICK_INTERVAL_SECONDS = 2.0  # how often projects with scheduler hooks are ticked, as every project once was
HOOK_INTERVAL_SECONDS = TICK_INTERVAL_SECONDS
SAFETY_INTERVAL_SECONDS = 30.0  # a pass over every project even when nothing asked for one
MIN_WAIT_SECONDS = 0.01  # the thread's shortest sleep, so a due time a hair away cannot spin it
STOP_GRACE_SECONDS = 15.0
SETTLED = frozenset((AGENT_QUIET, AGENT_FAILED))  # statuses an agent with no ready signal keeps

# ---------------------------------------------------------------- hooks

class NoHooks:
    """The default hooks collaborator: no local toolpack hooks."""

    def run_hooks(self, store, config, now):
        return None


# ---------------------------------------------------------------- one tick

def tick(store, backends, hooks, now, configs, caps=None, replays=None):
    """One tick of one project at time `now` (docs/design/scheduler.md); the caller holds the project lock.
    `configs` (the runtime's suzumio_config.ConfigCache) spares rebuilding the ProjectConfig on every
    tick; `caps` (suzumio_guards.Caps) holds the root's concurrency cap; `replays`
    (suzumio_replay.Replays) gates the starts of replay projects. Returns when the project needs its
    next tick if nothing changes meanwhile (next_due), None for never."""
    # The commit count is read before the rows: a commit made while they are read sends the tick back to
    # reading (see `seen` below).
    seen = store.commits
    reads = store.tick_reads(now)
    if reads.project["status"] != PROJECT_RUNNING:
        return None
    config = configs.get(store)
    max_tokens = config.backend.runner.budget_max_tokens
    max_cost = config.backend.runner.budget_max_cost_usd
    if (max_tokens is not None or max_cost is not None) and coordination.pause_for_budget(
            store, max_tokens, now, max_cost_usd=max_cost) is not None:
        log.warning("project %s paused: budget (maxTokens %s, maxCostUsd %s) used up", store.project_id,
                    max_tokens, max_cost)
        return None
    if (max_tokens is not None or max_cost is not None) and coordination.warn_for_budget(
            store, max_tokens, max_cost, now):
        log.warning("project %s: 80%% of its budget is used", store.project_id)
    may_start = replays.gate(store, config, now, reads.origin) if replays is not None else None
    if store.commits != seen:  # the budget warning, the replay gate or anyone wrote since: read again
        seen = store.commits
        reads = store.tick_reads(now)
        if reads.project["status"] != PROJECT_RUNNING:
            return None
    agents, ready = reads.agents, reads.ready
    # Who has a ready signal was read once for all agents; after any commit (this tick's own expiries,
    # cancellations and starts, or anyone's) an agent's signals are read again.
    held = []  # the caps that kept a ready agent from starting in this tick
    for agent in agents:
        if (agent["status"] in SETTLED and "activeActivationId" not in agent and agent["id"] not in ready
                and store.commits == seen):
            continue  # quiet or failed, unbound, nothing ready and nothing written since: _tick_agent's no-op
        _tick_agent(store, backends, config, agent, now,
                    lambda agent_id=agent["id"]: agent_id in ready or store.commits != seen, caps, held, may_start)
    try:
        hooks.run_hooks(store, config, now)
    except Exception as error:  # noqa: BLE001  hooks never stop steps 6-9 (docs/design/scheduler.md)
        log.warning("scheduler hooks of %s failed: %s", store.project_id, error)
        store.append_event(EVENT_HOOK_FAILED, {"toolpackId": None, "error": str(error)})
    # With no commit since the reads (an idle tick), they still hold: nothing is read twice.
    dues = coordination.nudge_and_monitor(store, config, now, agents if store.commits == seen else None)
    if suzumio_guards.ROOT_CAP in held:  # freed by another project's end, which does not tick this one
        dues.append(now + timedelta(seconds=suzumio_guards.CAP_RECHECK_SECONDS))
    return next_due(store, config, now, dues, reads if store.commits == seen else None)


def next_due(store, config, now, dues, reads=None):
    """The earliest time after `now` at which this running project's next tick could decide anything
    differently with nothing else happening (no commit, no route): a delayed signal becoming ready, a
    running activation's timeout, a monitor's or the all-quiet nudge's delay (`dues`, gathered by the
    tick), or the next hook call for projects with scheduler hooks, which may act at any time. `reads`
    (the tick's TickReads, when nothing committed since) spares reading the signals and activations again."""
    candidates = [due for due in dues if due is not None]
    delayed = reads.delayed if reads is not None else store.earliest_delayed_signal(now)
    if delayed is not None:
        candidates.append(parse_ts(delayed))
    timeout = timedelta(milliseconds=config.backend.activation_timeout_ms)
    starts = reads.running_starts if reads is not None else store.running_starts()
    candidates += [parse_ts(started) + timeout for started in starts]
    try:
        has_hooks = any(pack.has_scheduler_hook for pack in config.toolpacks)
    except suzumio_config.ConfigError:
        has_hooks = True  # the hook call reports the error; it does so every interval
    if has_hooks:
        candidates.append(now + timedelta(seconds=HOOK_INTERVAL_SECONDS))
    return max(min(candidates), now) if candidates else None


def _tick_agent(store, backends, config, agent, now, may_have_ready=lambda: True, caps=None,
                held=None, may_start=None):
    """Steps 2-5 of a tick for one agent; `may_have_ready()` False (no ready pending signal when the tick read
    them for all its agents at once, and nothing committed since) spares its signal selection. A paused
    agent (a loop guard tripped) is left alone; a start a concurrency cap forbids waits, its signals
    pending, and the cap is appended to `held`; `may_start(agent_id)` False (a replay's next activation
    is another agent's) keeps it from starting."""
    def pending():
        return coordination.pending_signals(store, config, agent["id"], now) if may_have_ready() else []

    status = agent["status"]
    if status == AGENT_STOPPED or (agent.get("paused") and not agent.get("activeActivationId")):
        return
    candidates = None
    if status == AGENT_RUNNING or agent.get("activeActivationId"):
        act = store.activation(agent["activeActivationId"]) if agent.get("activeActivationId") else None
        if (act and act["status"] == ACT_RUNNING
                and suzumio_backend.is_timed_out(act, config.backend.activation_timeout_ms, now)):
            backends.expire(store, act)
            status = AGENT_FAILED
        elif act is None or act["status"] != ACT_RUNNING:
            status = store.clear_stale_binding(agent["id"]) or store.agent(agent["id"])["status"]
        else:
            selected = pending()
            p0 = [s for s in selected if s["priority"] == "P0"]
            if not p0:
                return
            coordination.cancel_activation(store, act["id"], f"Interrupted by P0 signal {p0[0]['id']}")
            backends.stop_runner(store, store.activation(act["id"]))
            status, candidates = AGENT_QUIET, selected
    if candidates is None:
        candidates = pending()
    if not candidates:
        if status not in (AGENT_QUIET, AGENT_FAILED):
            store.set_agent_status(agent["id"], AGENT_QUIET)
        return
    if may_start is not None and not may_start(agent["id"]):
        return
    if agent.get("paused"):
        return
    cap = _start_activation(store, backends, config, agent, candidates, now,
                            caps or suzumio_guards.Caps(None))
    if cap is not None and held is not None:
        held.append(cap)


def _start_activation(store, backends, config, agent, signals, now, caps):
    """Start the activation unless a concurrency cap is full; returns that cap, or None."""
    with caps.starting():  # the cap check and the activation row it allows, together (not the runner start)
        cap = caps.holding(store, config)
        if cap is not None:
            return cap
        agents = store.list_agents()
        task = store.project()["task"]
        leading = suzumio_prompts.leads(agent["id"], agents, config)
        found = None
        if leading and len(agents) > 1:
            found = suzumio_toolpacks.leader_round(store, agent, agents, task, [s["id"] for s in signals])
        team, reminder = found or (None, None)
        prompt = suzumio_prompts.user_prompt(signals, task if leading else None, team)
        try:
            activation = coordination.start_activation(store, agent["id"], prompt, signals, now, reminder=reminder)
        except Conflict as error:
            log.info("agent %s of %s not started: %s", agent["id"], store.project_id, error)
            return None
    backends.start(store, activation["id"], config)
    return None


# ---------------------------------------------------------------- stop and approve (docs/design/store.md)

def stop_project(store, backends, now=None):
    """Stop a project: cancel running activations (with resume signals), then stop their runners."""
    for activation in coordination.stop(store, now):
        backends.stop_runner(store, store.activation(activation["id"]))


def approve_project(store, backends, now=None):
    """Approve a project: cancel running activations (no resume signal), then stop their runners."""
    for activation in coordination.approve(store, now):
        backends.stop_runner(store, store.activation(activation["id"]))


# ---------------------------------------------------------------- the background thread

class Scheduler:
    """Ticks the projects of a root on its own thread, and on demand through tick() / trigger(). The
    thread ticks a project when something may change a decision: a commit made outside its own ticks
    (a route, a runner, a watcher), or the project's next due time (next_due); a pass over every
    project every `interval` seconds stays as the safety net (it also sees writes by other processes).
    One lock per project keeps the ticks of a project serial (docs/design/scheduler.md)."""

    stop_project = staticmethod(stop_project)
    approve_project = staticmethod(approve_project)

    def __init__(self, root, backends, configs, hooks=None, interval=SAFETY_INTERVAL_SECONDS, on_fatal=None,
                 max_activations=None):
        self.root = root
        self.caps = suzumio_guards.Caps(root, max_activations)
        self.on_fatal = on_fatal  # called with the error if the thread's loop itself dies
        self.backends = backends
        self.replays = suzumio_replay.Replays(root)
        self.hooks = hooks or NoHooks()
        self.interval = interval
        self._locks = {}
        self._locks_guard = threading.Lock()
        self._ticks_begun = {}  # project -> ticks begun; written under the project's lock
        self._configs = configs  # the runtime's one ConfigCache, shared with the toolpack runtime
        self._stopping = threading.Event()
        self._thread = None

    def _project_lock(self, name):
        with self._locks_guard:
            return self._locks.setdefault(name, threading.Lock())

    def tick(self, name, now=None):
        """One tick of the named project, now; it waits for a tick of the project that is already running.
        Returns the project's next due time (tick)."""
        with self._project_lock(name):
            return self._tick_locked(name, now)

    def _tick_locked(self, name, now=None):
        self._ticks_begun[name] = self._ticks_begun.get(name, 0) + 1
        store = self.root.open_project(name)
        due = tick(store, self.backends, self.hooks, to_datetime(now), self._configs, self.caps, self.replays)
        self.backends.prepare_next(store)  # Warm activations (suzumio_warm; no-op when off)
        return due

    def trigger(self, name):
        """The tick a route asks for after its commit: returns once a tick of the project that began
        after the call has run (docs/design/scheduler.md). Routes that commit while a tick runs share
        the next one instead of queueing one each: a tick that began after the call read the commit."""
        begun = self._ticks_begun.get(name, 0)
        with self._project_lock(name):
            if self._ticks_begun.get(name, 0) == begun:
                self._tick_locked(name)

    def tick_all(self, now=None):
        """One pass over every project in name order; an error in one project never stops the rest."""
        for name in self.root.list_projects():
            if self._stopping.is_set():
                return
            self._tick_guarded(name, now)

    def _tick_guarded(self, name, now=None):
        try:
            return self.tick(name, now)
        except NotFound:
            # Listed while `init` was still writing it (or just removed): nothing to schedule yet.
            log.debug("scheduler: project %s is not ready", name)
            return None
        except Exception:  # one boundary per project: it is tried again shortly
            log.exception("scheduler tick failed for project %s", name)
            return utc_now() + timedelta(seconds=HOOK_INTERVAL_SECONDS)

    def start(self):
        """Start the background thread: one pass now, then ticks as projects need them."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="suzumio-scheduler", daemon=True)
        self._thread.start()

    def _run(self):
        try:
            self._loop()
        except BaseException as error:  # the thread's one boundary: a dead scheduler must not go unnoticed
            log.critical("scheduler thread died", exc_info=True)
            if self.on_fatal is None:
                raise
            self.on_fatal("scheduler", error)

    def _loop(self):
        changes = self.root.changes
        due = {}  # project -> when its next tick is due (None: only a change can need one)
        seen = {}  # project -> its count of foreign commits when it was last ticked
        last_pass = None
        while not self._stopping.is_set():
            total = changes.foreign_total()
            full = last_pass is None or time.monotonic() - last_pass >= self.interval
            self.pass_once(due, seen, full)
            if full:
                last_pass = time.monotonic()
            now = utc_now()
            waits = [(when - now).total_seconds() for when in due.values() if when is not None]
            waits.append(self.interval - (time.monotonic() - last_pass))
            changes.wait_foreign(total, max(MIN_WAIT_SECONDS, min(waits)), self._stopping)

    def pass_once(self, due, seen, full=False):
        """Tick each project that had a foreign commit since its last tick, whose due time has come,
        or every project when `full`; its own commits made during these ticks wake nobody."""
        changes = self.root.changes
        now = utc_now()
        for name in self.root.list_projects():
            if self._stopping.is_set():
                return
            foreign = changes.foreign(name)
            when = due.get(name)
            if full or seen.get(name) != foreign or (when is not None and when <= now):
                seen[name] = foreign  # read before the tick: a commit during it asks for another
                with changes.quiet():
                    due[name] = self._tick_guarded(name)

    def stop(self, timeout=STOP_GRACE_SECONDS):
        """Stop the thread and join it; running activations keep going. A tick stuck in a slow
        engine call is left to finish on its own (the thread is a daemon) rather than hold up
        shutdown."""
        self._stopping.set()
        self.root.changes.wake()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("scheduler tick still running after %.0f s at shutdown", timeout)
            self._thread = None
