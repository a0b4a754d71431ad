"""What a model reads at each activation (docs/real-models.md): the system message, which stays the same
across an agent's activations (identity, instructions, team, files, then the contract written for the
tools the agent has, named exactly as the model calls them), and the user message with what is new.
The scheduler renders the user message; the backend renders the system message into the runner's input.

The project's task is in the user message of the agent that leads the work (the coordinator, or an agent
alone), at the top of every activation's, and in the system message of the others, for whom it is the
background of an assignment. Measured with a 1.5B model on three one-file tasks: given the task in the system
message, it copied that message into the file on two of them; given it in the user message, it wrote the file
and submitted on all three, in two requests each.

Channels are described to the agent that leads the work only, and only its messages_send has a `channel`
field: measured with a 1.5B model on five first requests of poets given a clear assignment, each asked with
and without its part of the task in the user message, told of the channels it sent its poem as a message
("#project" first) in five of the ten; without them it sent none and wrote the file in eight.

Both are plain paragraphs, not Markdown sections: measured with a 1.5B model, a system message laid out as a
document of headings was copied whole into the files and reports the model wrote."""
import json
import re

from suzumio_records import render_signal
from suzumio_registry import model_tool_name
from suzumio_runner_calls import NO_CALL

SEND = "messages.send"
WAIT = "coordination.wait_for_signal"
SUBMIT = "completion.submit"


def user_prompt(signals, task=None, team=None):
    """The user message of one activation: the project's task for the agent that leads the work (`task`,
    else None), then the signals delivered to it, one paragraph each, then `team` (team_round's
    paragraph). The task's part for a worker is not repeated here: measured with a 1.5B model on five
    first requests of poets with channels described, given it at the top of the user message the poet sent
    its poem as a message in four, against one without it."""
    paragraphs = [task_paragraph(task)] if task is not None else []
    return "\n\n".join(paragraphs + [render_signal(s) for s in signals] + ([team] if team else []))


def clauses(text, colon=False):
    """The lines, sentences and clauses of `text`, split after . ; ! ? (and : with `colon`), stripped."""
    ends = ".;:!?" if colon else ".;!?"
    return [part.strip() for part in re.split(rf"(?<=[{ends}])\s+|\n+", text) if part.strip()]


def task_part(task, agent_id):
    """The sentences and clauses of the task that name agent_id, joined; "" when none does."""
    named = re.compile(rf"(?<![\w-]){re.escape(agent_id)}(?![\w-])")
    return " ".join(clause.rstrip(" ;.") for clause in clauses(task) if named.search(clause))


def answered(agent_id, agents, task, sent, received):
    """(given, idle) once everyone the leading agent gave work to has answered it since its last message to
    them: `given` those agents, `idle` the agents the task names that it has given nothing yet. None while
    an answer is outstanding, or before it gave any work. `sent` and `received` are the store's
    last_exchanges."""
    ids = {a["id"] for a in agents}
    given = sorted(other for other in sent if other in ids and other != agent_id)
    if not given or any(received.get(other, "") <= sent[other] for other in given):
        return None
    idle = [a["id"] for a in agents if a["id"] != agent_id and a["id"] not in sent and task_part(task, a["id"])]
    return given, idle


def team_round(given, idle, files, task, can_send, can_submit):
    """What the leading agent is told once everyone it gave work to has answered (`given` and `idle`, from
    answered), with the files they wrote before answering: the paragraph that ends its user message, and
    the contract reminder of that activation ({"text", "tool"}: the runner's turn after a text answer
    offers that tool alone and requires a call), or None when it has no tool for the next step.

    The next step is the assignment of an agent the task names and that has no work yet, else the final
    report. Measured with a 1.5B model coordinating two poets: woken by the first poet's answer it messaged
    itself, and told "You have given worker-2 nothing yet; what the project task asks of worker-2: …" it
    sent worker-2 its assignment. Woken by the second poet's notice, told "If the task is done, call
    completion_submit …; if it is not, send the next assignment", it answered an empty text, as it did with
    nothing said; told to call completion_submit now it submitted in some runs and answered empty text in
    others, and to the contract reminder as well; with every tool offered and a call required it sent a
    message; offered the submission alone it wrote a report naming both poems, in every request tried."""
    text = f"Everyone you gave work to has answered: {', '.join(given)}."
    if files:
        text += f" Files they wrote: {', '.join(files)}."
    if idle:
        if not can_send:
            return None
        send = model_tool_name(SEND)
        for other in idle:
            text += f' You have given {other} nothing yet; what the project task asks of {other}: ' \
                    f'"{task_part(task, other)}".'
        text += f" Send {idle[0] if len(idle) == 1 else 'each'} that assignment with {send} now."
        first = idle[0]
        reminder = (f"{NO_CALL}. Everyone you gave work to has answered, and {first} has no work yet: call {send} "
                    f'now with recipient {first} and its assignment, what the project task asks of it: '
                    f'"{task_part(task, first)}".')
        return text, {"text": reminder, "tool": send}
    if not can_submit:
        return text + " Send the next assignment if the task needs more work.", None
    submit = model_tool_name(SUBMIT)
    reminder = (f"{NO_CALL}. Everyone you gave work to has answered: call {submit} now with the final report "
                "(Markdown): what was made and the exact paths of the files.")
    # Without "naming these files", one coordinator's report held two poems of its own and no file name.
    naming = ", naming these files," if files else ","
    return (text + f" Call {submit} now with the final report{naming} unless the task needs more work.",
            {"text": reminder, "tool": submit})


def written_paths(calls):
    """The paths completed file.write and file.patch calls (tool_calls rows) wrote, in order, once each."""
    paths = []
    for call in calls:
        if call["status"] != "completed" or call["tool"] not in ("file.write", "file.patch"):
            continue
        try:
            data = json.loads(call["input_json"])
        except (TypeError, ValueError):
            continue
        data = data if isinstance(data, dict) else {}
        operations = data.get("operations") if call["tool"] == "file.patch" else [data]
        for operation in operations if isinstance(operations, list) else ():
            path = operation.get("path") if isinstance(operation, dict) else None
            if isinstance(path, str) and operation.get("op") != "delete" and path not in paths:
                paths.append(path)
    return paths


def task_paragraph(task):
    return "Project task: " + task.strip()


def leads(agent_id, agents, config):
    """Whether the agent leads the work: the team's coordinator, or any agent of a team without one."""
    coordinator = config.communication.coordinator_agent
    return agent_id == coordinator or not any(a["id"] == coordinator for a in agents)


def system_prompt(*, task, agent, agents, config, tools, workspace, artifacts_root, mounts=()):
    """The system message of `agent`'s activations. `tools` are the tool names the agent has (after its
    allowlist), `mounts` its read-only inputs as (path, read-write?, description)."""
    coordinator = config.communication.coordinator_agent
    team = sorted(agents, key=lambda a: a["id"])
    alone = len(team) <= 1
    blocks = [_identity(agent, coordinator, alone)]
    if not leads(agent["id"], team, config):
        blocks.append(task_paragraph(task))
    if (agent.get("prompt") or "").strip():
        blocks.append("Your instructions: " + agent["prompt"].strip())
    if not alone:
        blocks.append(_team(agent, team, coordinator))
    blocks.append(_files(agent, team, workspace, artifacts_root, mounts))
    if config.channels and SEND in tools and not alone and leads(agent["id"], team, config):
        blocks.append("Channels: " + ", ".join(config.channels)
                      + f" ({model_tool_name(SEND)} with `channel` instead of `recipient`).")
    blocks.append(contract(agent, team, config, tools))
    return "\n\n".join(blocks)


def _identity(agent, coordinator, alone):
    name = agent.get("displayName") or agent["id"]
    role = agent["role"]
    acts = "You act only by calling tools; text without a tool call reaches no one."
    if alone:
        return f"You are {name} (agent id {agent['id']}, {role}). You work alone on a project for a user. {acts}"
    lead = " You coordinate the team." if agent["id"] == coordinator else ""
    return (f"You are {name} (agent id {agent['id']}, {role}), one agent of a team working on a project for a "
            f"user.{lead} {acts}")


def _team(agent, team, coordinator):
    members = []
    for member in team:
        notes = [member["role"]]
        if member["id"] == coordinator and member["role"] != "coordinator":
            notes.append("coordinator")
        if member["id"] == agent["id"]:
            notes.append("you")
        name = member.get("displayName") or member["id"]
        who = member["id"] if name == member["id"] else f"{member['id']} ({name})"
        members.append(f"{who}: {', '.join(notes)}")
    return "Team: " + "; ".join(members) + "; user: the person who runs the project."


def _files(agent, team, workspace, artifacts_root, mounts):
    # The artifact folder comes first, under the name tasks use for it: a small model writes to the first
    # folder it reads of, and took a "published folder" for something other than the task's "artifact folder".
    lines = [f"Files: your artifact folder is {artifacts_root}/{agent['id']}: put finished work there, where "
             + ("the user and the others read it." if len(team) > 1 else "the user reads it.")
             + f" Your private working folder is {workspace}, kept between activations."]
    if len(team) > 1:
        lines.append(f"Each other agent's artifact folder is {artifacts_root}/<agent id>, read-only for you.")
    for path, writable, description in mounts:
        line = f"Input {path} ({'read-write' if writable else 'read-only'})"
        lines.append(line + (f": {description}" if description else "."))
    return " ".join(lines)


def contract(agent, team, config, tools):
    """The rules of the agent's tools, naming only tools it has, as the model must call them."""
    have = set(tools)
    communication = config.communication
    coordinator = communication.coordinator_agent
    has_coordinator = any(m["id"] == coordinator for m in team)
    leading = leads(agent["id"], team, config)
    alone = len(team) <= 1
    call = model_tool_name
    lines = ["Your tools: " + (", ".join(call(t) for t in tools) if tools else "none")
             + ". Call them by exactly these names. What arrives for you comes in the user message."]
    if SUBMIT in have and leading:
        lines.append(f"When the task is done, call {call(SUBMIT)} with the final report (Markdown); it ends your "
                     "work until the user answers.")
    if SEND in have and not alone:
        if leading:
            lines.append(f"Give work to another agent with {call(SEND)} to its id. Its answer comes as a new "
                         "message in a later activation: after delegating, end this activation"
                         + (f" with {call(WAIT)}." if WAIT in have else "."))
        else:
            target = coordinator if has_coordinator else "whoever asked"
            lines.append(f"When your assignment is done, report it to {target} with {call(SEND)}: what you did "
                         "and the exact paths of your files"
                         + (f"; then call {call(WAIT)}." if WAIT in have else "."))
        if communication.restrict_non_coordinator_to_coordinator and not leading:
            lines.append(f"Send messages only to {coordinator}, at priority "
                         f"{communication.non_coordinator_max_priority} or lower.")
        lines.append("Use priority P3 unless it is urgent: P1 only to unblock active work, P0 only for "
                     "emergencies. Never message yourself; do not send acknowledgements.")
    elif SEND in have:
        lines.append(f"Use {call(SEND)} only to ask the user something when you are blocked.")
    if WAIT in have:
        # Told only what the call does, a coordinator called it first thing, before delegating anything.
        lines.append(f"Never call {call(WAIT)} before you have acted on what you were asked.")
    if SEND in have and not leading:
        lines.append(f"If the work is unclear or impossible, say so to {coordinator if has_coordinator else 'user'} "
                     f"with {call(SEND)}; never end silently.")
    return " ".join(lines)
