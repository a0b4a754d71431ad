"""Replays of recorded runs (docs/replay.md): a new project re-runs its source's team, the source's user
messages arriving where they arrived, activations starting in the source's order, and every model request
answered from the source's recording while it matches; the first that does not is a `replay.diverged`
event, after which the replay stops or goes on live. With `tools: recorded` the tools that act outside
the controller (everything but messages, coordination and completion) are not run: their results come
from the source's audit and the agent's files from its artifact versions."""
import difflib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections import namedtuple
from pathlib import Path

import suzumio_config
import suzumio_coordination as coordination
import suzumio_recorder
import suzumio_repository
from suzumio_errors import BadRequest, Conflict, NotFound
from suzumio_records import (
    PROJECT_COMPLETED,
    PROJECT_INITIALIZED,
    PROJECT_RUNNING,
    PROJECT_STOPPED,
    PROJECT_SUBMITTED,
    TOOL_CALL_END_STATUSES,
)

log = logging.getLogger(__name__)

KIND_REPLAY = "replay"
KIND_FORK = "fork"
TOOLS_MODES = ("live", "recorded")
ON_DIVERGE = ("stop", "live")
EVENT_DIVERGED = "replay.diverged"
EVENT_ENDED = "replay.ended"
# Tools whose effects are the controller's own records: they always run, so the replay's messages,
# signals and submission are its own (with `tools: recorded` too).
CONTROLLER_TOOLS = ("messages.", "coordination.", "completion.")
# Store ids (`<prefix>_<millis>_<hex8>`) and timestamps differ in every run: never a difference.
STORE_ID = re.compile(r"\b[a-z]+_\d{13}_[0-9a-f]{8}\b")
TIMESTAMP = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
DIFF_LINES = 80
# Signals of the merge queue: a replay with recorded tools delivers the source's own (_deliveries).
QUEUE_SIGNALS = (suzumio_repository.EVENT_MERGED, suzumio_repository.EVENT_FAILED)
MAX_CHOSEN = 4096  # the sources kept for running activations
ENDED_EVENTS = ("activation.completed", "activation.failed", "activation.cancelled")

Recorded = namedtuple("Recorded", "exchange answer")
# Where the source was when something came: activations started, those ended (indexes in start order) and,
# for each running one, its tool calls started and ended.
Position = namedtuple("Position", "started ended progress")


def normalized(text):
    """`text` with store ids and times blanked (what never counts as a difference)."""
    return TIMESTAMP.sub("<time>", STORE_ID.sub("<id>", text))


def request_text(body):
    return json.dumps(body, sort_keys=True, ensure_ascii=False, indent=1)


def readable_diff(recorded, replayed):
    """A unified diff of two normalized requests, at most DIFF_LINES lines."""
    lines = list(difflib.unified_diff(recorded.splitlines(), replayed.splitlines(), "recorded", "replay",
                                      n=2, lineterm=""))
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"... ({len(lines) - DIFF_LINES} more lines)"]
    return "\n".join(lines)


def is_controller_tool(tool):
    return tool.startswith(CONTROLLER_TOOLS)


class Replay:
    """One replay project with its source: the mappings between the two runs."""

    def __init__(self, store, source, origin):
        self.store = store
        self.source = source
        self.origin = origin
        # The two projects' folders, never their bare names: a name may occur anywhere in a path (a
        # root `team-runs/` holding a replay named `team`). Both spellings of each folder, as the runner
        # may see the resolved one.
        self._folders = [(spelling(store.dir, resolve), spelling(source.dir, resolve)) for resolve in (False, True)]

    @property
    def diverged(self):
        return self.origin["diverged"] is not None

    def to_source(self, text):
        """The replay's project folder written as the source's (the replay's request mapped)."""
        for mine, theirs in self._folders:
            text = folder_pattern(mine).sub(lambda _match, theirs=theirs: theirs, text)
        return text

    def to_replay(self, text):
        """The source's project folder written as the replay's (a recorded answer handed to the replay)."""
        for mine, theirs in self._folders:
            text = folder_pattern(theirs).sub(lambda _match, mine=mine: mine, text)
        return text

    def source_activation(self, activation_id):
        """The source activation a replay activation re-runs: the one at the same place in start order."""
        mine = self.store.activation_ids_in_order()
        theirs = self.source.activation_ids_in_order()
        index = mine.index(activation_id) if activation_id in mine else None
        return theirs[index] if index is not None and index < len(theirs) else None

    # -- model requests

    def answer(self, activation_id, source_id, agent_id, provider_id, preset_id, body):
        """The recorded answer to the replay's next request of `activation_id`, which re-runs the source's
        `source_id` (Recorded), or the divergence (a dict) when it matches no recording (its agent,
        preset and body)."""
        index = len(self.store.exchanges(activation_id))
        recorded = self.source.exchanges(source_id) if source_id is not None else []
        exchange = recorded[index] if index < len(recorded) else None
        mine = normalized(self.to_source(request_text(body)))
        theirs = normalized(request_text(exchange["request"])) if exchange is not None else ""
        same_call = exchange is not None and (exchange["agentId"], exchange["providerId"], exchange["presetId"]) \
            == (agent_id, provider_id, preset_id)
        if same_call and mine == theirs:
            return Recorded(exchange, self.to_replay(exchange["answer"]))
        if exchange is None:
            diff = (f"the source's activation {source_id} made {len(recorded)} model request(s); this is "
                    f"request {index}" if source_id else "the source has no activation here")
        elif not same_call:
            diff = (f"{agent_id} asked {provider_id}/{preset_id}; the recording has {exchange['agentId']} asking "
                    f"{exchange['providerId']}/{exchange['presetId']}\n" + readable_diff(theirs, mine))
        else:
            diff = readable_diff(theirs, mine)
        return {"agentId": agent_id, "activationId": activation_id, "sourceActivationId": source_id,
                "requestIndex": index, "diff": diff}

    # -- tools

    def recorded_tool(self, activation_id, source_id, tool, model_call_id):
        """The source's result of this activation's next tool call (tools: recorded): {status, output,
        error, text} where `text` is the tool message the source's model was sent, or None to run it."""
        if self.origin["tools"] != "recorded" or is_controller_tool(tool) or source_id is None:
            return None
        position = len(self.store.tool_calls_of(activation_id)) - 1  # this call's start is recorded
        theirs = self.source.tool_calls_of(source_id)
        if position >= len(theirs) or theirs[position]["tool"] != tool:
            return None
        row = theirs[position]
        text = None
        for exchange in self.source.exchanges(source_id):
            for message in exchange["request"].get("messages") or []:
                if message.get("role") == "tool" and message.get("tool_call_id") == model_call_id:
                    text = message.get("content")
        if text is None:
            text = json.dumps({"output": row["output"]}, separators=(",", ":")) if row["status"] == "completed" \
                else (row["error"] or "")
        mapped = {key: self.to_replay(value) if isinstance(value, str) else value
                  for key, value in (("output", row["output"]), ("error", row["error"]), ("text", text))}
        return dict(mapped, status=row["status"])

    def restore(self, agent_id, source_id):
        """tools: recorded: the agent's folder becomes what the source recorded after the activation
        this one re-runs (files from the blobs; files it did not have removed), and its working copy and
        the integration branch what the source's repository held then."""
        if source_id is None:
            return
        state = self.source.artifact_state(agent_id, source_id)
        if state is not None:
            restore_folder(self.source, self.store.artifacts_dir(agent_id), state)
        try:
            suzumio_repository.restore_replayed(self.source, self.store, agent_id, source_id)
        except (OSError, suzumio_repository.GitError) as error:
            # Logged, not raised: the activation's output must still be taken; its code is then the replay's own.
            log.warning("replay %s: working copy of %s not restored: %s", self.store.project_id, agent_id, error)


def spelling(folder, resolve):
    return os.path.realpath(folder) if resolve else str(folder)


def folder_pattern(folder):
    """`folder` as a whole path: not the start of a longer name (`…/team` in `…/team-2`)."""
    return re.compile(re.escape(folder) + r"(?![\w.-])")


class Live:
    """The sources of an activation that re-runs nothing (no replay, or a replay gone live or ended):
    the provider answers its requests and its tools run."""

    def answer(self, agent_id, provider_id, preset_id, body):
        return None

    def recorded_tool(self, tool, model_call_id):
        return None

    def ended(self, agent_id):
        return None


LIVE = Live()


class ReplayedActivation:
    """The sources of one replay activation, chosen when it starts: the source activation it re-runs,
    whose recorded answers answer its requests while they match, and whose recorded results stand in for
    its tools (tools: recorded) until the replay diverges."""

    def __init__(self, replay, activation_id, source_id):
        self.replay = replay
        self.activation_id = activation_id
        self.source_id = source_id

    def _diverged(self):
        # Any activation of the replay may be the one that diverges: from then on every request is live.
        self.replay.origin = self.replay.store.origin()
        return self.replay.diverged

    def answer(self, agent_id, provider_id, preset_id, body):
        """For /runner/model: a Recorded answer, a divergence dict (recorded here: the first one is an
        event), or None when the request goes to the provider."""
        if self._diverged():
            return None
        store = self.replay.store
        result = self.replay.answer(self.activation_id, self.source_id, agent_id, provider_id, preset_id, body)
        if isinstance(result, Recorded):
            return result
        on_diverge = self.replay.origin["onDiverge"]
        with store.write() as tx:
            if store.mark_diverged(tx, result):
                store.add_event(tx, EVENT_DIVERGED, dict(result, onDiverge=on_diverge))
        log.info("replay %s diverged at %s request %s", store.project_id, self.activation_id, result["requestIndex"])
        return dict(result, onDiverge=on_diverge)

    def recorded_tool(self, tool, model_call_id):
        if self._diverged():
            return None
        return self.replay.recorded_tool(self.activation_id, self.source_id, tool, model_call_id)

    def ended(self, agent_id):
        """tools: recorded: the agent's files and code as the source had them after the activation re-run."""
        if self.replay.origin["tools"] == "recorded" and not self._diverged():
            self.replay.restore(agent_id, self.source_id)


def reached(store, position):
    """Whether the replay `store` is at or past `position` of its source."""
    mine = store.activation_ids_in_order()
    if len(mine) < position.started:
        return False
    for index in position.ended:
        if index >= len(mine) or store.activation(mine[index])["status"] == "running":
            return False
    for index, (called, finished) in position.progress.items():
        if index >= len(mine) or store.activation(mine[index])["status"] != "running":
            continue  # ended: past wherever it was
        calls = store.tool_calls_of(mine[index])
        if len(calls) < called or sum(1 for call in calls if call["status"] in TOOL_CALL_END_STATUSES) < finished:
            return False
    return True


def restore_folder(source, folder, state):
    """Make `folder` hold exactly `state` ({path: (digest, size)}), reading the blobs of `source`."""
    folder.mkdir(parents=True, exist_ok=True)
    for relative, path in suzumio_recorder.folder_files(folder).items():
        if relative not in state:
            path.unlink()
    for relative, (digest, _) in state.items():
        target = folder / relative
        if target.is_file() and not target.is_symlink() and suzumio_recorder.digest_of(target) == digest:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.restore.tmp")
        temp.write_bytes(suzumio_recorder.read_blob(source, digest))
        os.replace(temp, target)


UNREAD = object()  # an argument the caller did not read: the callee reads it


class Replays:
    """The replays of one runtime root: which projects are replays, their gates, answers and ends."""

    def __init__(self, root):
        self.root = root
        self._lock = threading.Lock()
        self._chosen = {}  # (project, activation id) -> LIVE or the source activation re-run; oldest first

    def context(self, store, origin=UNREAD):
        """The Replay of `store`, or None for a project that is no replay (or whose source is gone);
        `origin`: the store's origin when the caller read it already."""
        origin = store.origin() if origin is UNREAD else origin
        if origin is None or origin["kind"] != KIND_REPLAY:
            return None
        try:
            source = self.root.open_project(origin["source"])
        except NotFound:
            return None
        return Replay(store, source, origin)

    # -- the scheduler's part

    def gate(self, store, config, now=None, origin=UNREAD):
        """Before a tick starts activations of a replay: deliver the source's user messages that are
        due, end a replay that reached its source's end, and answer which agent may start now
        (`may_start(agent_id)`), or None when starts are not gated (no replay, or it went live)."""
        replay = self.context(store, origin)
        if replay is None or replay.diverged or replay.origin["ended"]:
            return None
        theirs = replay.source.activation_ids_in_order()
        deliveries = self._deliveries(replay, theirs)  # read once a tick: it walks the source's events
        self._deliver_due_messages(replay, config, deliveries, now)
        self._end_if_done(replay, theirs, deliveries, now)

        def may_start(agent_id):
            started = len(store.activation_ids_in_order())
            if started >= len(theirs):
                return False
            return replay.source.activation(theirs[started])["agentId"] == agent_id

        return may_start

    def _deliveries(self, replay, theirs):
        """What the replay delivers itself, in the source's order: [(event type, data, Position)]. The
        source's user messages; with `tools: recorded` also the signals its merge queue raised
        (`repo.merged`, `repo.merge_failed`): the replay's `repo.merge` calls are the recording's, so its
        own queue never lands anything."""
        recorded = replay.origin["tools"] == "recorded"
        tool_ends = tuple(f"tool.{status}" for status in TOOL_CALL_END_STATUSES)
        positions = replay.source.event_positions(("message.created", "signal.created", "activation.started",
                                                   "tool.called", *tool_ends, *ENDED_EVENTS))
        index_of = {activation_id: number for number, activation_id in enumerate(theirs)}
        started, ended, due = 0, set(), []
        running = {}  # index of each running activation -> [tool calls started, ended]
        call_of = {}  # tool call id -> index of its activation
        for _, kind, data in positions:
            index = index_of.get(data.get("activationId"))
            if kind == "activation.started":
                started += 1
                if index is not None:
                    running[index] = [0, 0]
            elif kind in ENDED_EVENTS:
                if index is not None:
                    ended.add(index)
                    running.pop(index, None)
            elif kind == "tool.called":
                if index in running:
                    call_of[data.get("id")] = index
                    running[index][0] += 1
            elif kind in tool_ends:
                if call_of.get(data.get("id")) in running:
                    running[call_of[data["id"]]][1] += 1
            elif (kind == "message.created" and data.get("sender") == "user") or (
                    kind == "signal.created" and recorded and data.get("kind") in QUEUE_SIGNALS):
                progress = {i: tuple(counts) for i, counts in running.items()}
                due.append((kind, data, Position(started, frozenset(ended), progress)))
        return due

    def _deliver_due_messages(self, replay, config, deliveries, now):
        """Each delivery (`_deliveries`) once the replay is where the source was when it came: the same
        activations started and ended, and each running one as far in its tool calls (a P1 signal reaches a
        running activation at its next tool call, so it must not come early)."""
        store = replay.store
        delivered = replay.origin["injectedMessages"]
        for kind, data, position in deliveries[delivered:]:
            if not reached(store, position):
                return
            with store.write(now) as tx:
                if not store.mark_injected(tx, delivered + 1):
                    return
                if kind == "message.created":
                    coordination.send_message(store, config, "user", data["body"], data.get("recipient"),
                                              data.get("channel"), data.get("priority"))
                else:
                    coordination.record_signal(store, config, data["kind"], target_agent=data.get("targetAgent"),
                                               priority=data.get("priority"), payload=data.get("payload"))
            delivered += 1

    def _end_if_done(self, replay, theirs, deliveries, now):
        """Every source activation re-run and ended, everything delivered: the replay ends in the
        source's status (submitted, completed or stopped, as the source is now)."""
        store = replay.store
        mine = store.activation_ids_in_order()
        if len(mine) < len(theirs) or store.running_activations() or \
                store.origin()["injectedMessages"] < len(deliveries):
            return
        status = replay.source.project()["status"]
        # The end and the status in one transaction: whoever reads that the replay ended reads its status.
        with store.write(now) as tx:
            if not store.mark_replay_ended(tx):
                return
            store.add_event(tx, EVENT_ENDED, {"source": replay.source.project_id, "status": status,
                                              "activations": len(mine)})
            if status == PROJECT_STOPPED:
                coordination.stop(store, now, tx)
            elif status == PROJECT_COMPLETED:
                coordination.approve(store, now, tx)
            elif status == PROJECT_SUBMITTED and store.project()["status"] != PROJECT_SUBMITTED:
                store.set_project_status(tx, PROJECT_SUBMITTED)

    # -- the runner routes' part

    def sources(self, store, activation_id):
        """Where `activation_id`'s answers and tool results come from: LIVE, or a ReplayedActivation
        bound to the source activation it re-runs. Chosen at its first ask (its first request or tool
        call) and kept while it runs; a controller restart chooses the same, as the store's order of
        starts decides it. Only the choice is kept: stores are opened afresh, as they may be closed."""
        key = (store.project_id, activation_id)
        with self._lock:
            known, source_id = key in self._chosen, self._chosen.get(key)
        if not known:
            replay = self.context(store)
            live = replay is None or replay.diverged or replay.origin["ended"]
            source_id = LIVE if live else replay.source_activation(activation_id)
            with self._lock:
                source_id = self._chosen.setdefault(key, source_id)
                while len(self._chosen) > MAX_CHOSEN:  # activations that failed never say they ended
                    self._chosen.pop(next(iter(self._chosen)))
        if source_id is LIVE:
            return LIVE
        replay = self.context(store)
        return LIVE if replay is None else ReplayedActivation(replay, activation_id, source_id)

    def ended(self, store, activation_id, agent_id):
        """An activation reported its output: its sources' last word (tools: recorded restores its
        agent's files), then they are forgotten."""
        self.sources(store, activation_id).ended(agent_id)
        with self._lock:
            self._chosen.pop((store.project_id, activation_id), None)


# ---------------------------------------------------------------- creating a replay

def check_name(root, name):
    if not isinstance(name, str) or not name:
        raise BadRequest("as is required")
    if root.exists(name):
        raise Conflict(f"Project already initialized: {name}")


def new_project_config(root, source, name, config_text=None, config_file=None):
    """The loaded ProjectConfig of a replay or fork named `name`: `config_file` (a project file, whose
    relative paths are read from its own folder) or `config_text` (its text, paths from nowhere: the
    HTTP API), its `name` replaced, or else the source's resolved config; the agents must be the source's."""
    if config_file is not None:
        try:
            loaded = suzumio_config.load_project(config_file)
        except suzumio_config.ConfigError as error:
            raise BadRequest(f"config: {error.message}") from None
        config = suzumio_config.ProjectConfig.from_data(dict(loaded.data, name=name))
        source_text = loaded.source_text
    elif config_text is None:
        data = dict(source.config(), name=name)
        config = suzumio_config.ProjectConfig.from_data(data)
        source_text = source.source_yaml_path.read_text(encoding="utf-8") \
            if source.source_yaml_path.exists() else config.render()
    else:
        if not isinstance(config_text, str) or not config_text.strip():
            raise BadRequest("config must be a project file (YAML text)")
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "project.yaml"
            path.write_text(config_text, encoding="utf-8")
            try:
                loaded = suzumio_config.load_project(path)
            except suzumio_config.ConfigError as error:
                raise BadRequest(f"config: {error.message}") from None
        config = suzumio_config.ProjectConfig.from_data(dict(loaded.data, name=name))
        source_text = config_text
    mine = sorted(agent.id for agent in config.agents)
    theirs = sorted(source.agent_ids())
    if mine != theirs:
        raise BadRequest(f"config must have the source's agents ({', '.join(theirs)}), not {', '.join(mine)}")
    return config, source_text


def create_replay(root, source_name, name, tools="live", on_diverge="stop", config_text=None, config_file=None,
                  now=None):
    """Initialize `name` as a replay of `source_name` and start it (the caller ticks it)."""
    source = root.open_project(source_name)  # an unknown source is a 404 before any field is read
    if tools not in TOOLS_MODES:
        raise BadRequest(f"tools must be one of {', '.join(TOOLS_MODES)}")
    if on_diverge not in ON_DIVERGE:
        raise BadRequest(f"onDiverge must be one of {', '.join(ON_DIVERGE)}")
    check_name(root, name)
    if source.project()["status"] in (PROJECT_INITIALIZED, PROJECT_RUNNING):
        raise Conflict(f"Project {source_name} is {source.project()['status']}; replay a run that has ended")
    config, source_text = new_project_config(root, source, name, config_text, config_file)
    store = root.init_project(name, config.task, config.data, config.agents, source_text, config.render(),
                              now=now)
    store.set_origin(KIND_REPLAY, source_name, tools=tools, on_diverge=on_diverge, now=now)
    store.start(now=now)
    return store


# ---------------------------------------------------------------- forks

# What a fork copies, parents before children; agents, the project row and approvals are its own.
FORK_TABLES = ("messages", "signals", "activations", "tool_calls", "agent_history_compactions",
               "agent_history_messages", "agent_history_parts", "model_calls", "model_exchanges",
               "artifact_versions", "artifact_snapshots", "events")


def _fork_row(row, source, store):
    """A source row as the fork stores it: its project, and the source's folder written as the fork's."""
    out = {}
    for key, value in row.items():
        if key == "project":
            value = store.project_id
        elif isinstance(value, str):
            value = value.replace(str(source.dir), str(store.dir))
        out[key] = value
    return out


def create_fork(root, source_name, name, at, config_text=None, config_file=None, now=None):
    """Initialize `name` holding `source_name` as it was when activation `at` ended (messages, signals,
    histories, activations, audits, recordings, artifacts), then start it live (the caller ticks it)."""
    source = root.open_project(source_name)  # an unknown source is a 404 before any field is read
    if not isinstance(at, str) or not at:
        raise BadRequest("at is required")
    check_name(root, name)
    point = source.activation(at)
    if point["status"] == "running":
        raise Conflict(f"Activation {at} is running; fork at an activation that has ended")
    if source.artifact_snapshot(at) is None:
        raise Conflict(f"Activation {at} has no recorded artifacts (recording off, or past "
                       "recording.keepActivations)")
    cut = point["completedAt"]
    kept = [a for a in source.activation_ids_in_order()
            if (row := source.activation(a))["status"] != "running" and row["completedAt"] <= cut]
    if suzumio_repository.has_repository(source) and source.repository_refs(at) is None:
        raise Conflict(f"Activation {at} has no recorded repository state (it ended before the repository "
                       "was made)")
    config, source_text = new_project_config(root, source, name, config_text, config_file)
    store = root.init_project(name, config.task, config.data, config.agents, source_text, config.render(),
                              now=now)
    for table in FORK_TABLES:
        store.insert_fork_rows(table, [_fork_row(row, source, store) for row in source.fork_rows(table, cut, kept)],
                               now=now)
    store.reopen_signals(kept, now=now)
    for row in source.fork_rows("agent_history_compactions", cut, kept):
        _copy_archive(source, store, row)
    for agent_id in source.agent_ids():
        theirs = [a for a in kept if source.activation(a)["agentId"] == agent_id and source.artifact_snapshot(a)]
        state = source.artifact_state(agent_id, theirs[-1]) if theirs else {}
        restore_folder(source, store.artifacts_dir(agent_id), state or {})
    suzumio_repository.fork_repository(source, store, at)
    store.set_origin(KIND_FORK, source_name, at_activation=at, now=now)
    store.start(now=now)
    return store


def _copy_archive(source, store, compaction):
    """The archived history of a copied compaction, where the fork's row now names it."""
    original = Path(compaction["archive_path"])
    if original.is_file():
        target = Path(_fork_row(compaction, source, store)["archive_path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(original, target)
