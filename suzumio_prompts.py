"""What a model reads at each activation (docs/real-models.md): the system message, which stays the same
across an agent's activations (identity, instructions, team, files, then the contract written for the
tools the agent has, named exactly as the model calls them), and the user message with what is new.
The scheduler renders the user message; the backend renders the system message into the runner's input."""
from suzumio_records import render_signal
from suzumio_registry import model_tool_name

SIGNALS_HEADING = "# New Signals"
CONTRACT_HEADING = "# How You Work"
ACT_NOW = ("Act on the new signals above now, with your tools. Earlier turns are history: do not redo "
           "work they show as done.")

SEND = "messages.send"
WAIT = "coordination.wait_for_signal"
SUBMIT = "completion.submit"


def user_prompt(signals):
    """The user message of one activation: the signals delivered to it, and one line on what to do."""
    return "\n\n".join([SIGNALS_HEADING] + [render_signal(s) for s in signals] + [ACT_NOW])


def system_prompt(*, task, agent, agents, config, tools, workspace, artifacts_root, mounts=()):
    """The system message of `agent`'s activations. `tools` are the tool names the agent has (after its
    allowlist), `mounts` its read-only inputs as (path, read-write?, description)."""
    coordinator = config.communication.coordinator_agent
    team = sorted(agents, key=lambda a: a["id"])
    alone = len(team) <= 1
    blocks = [_identity(agent, coordinator, alone), "# Project Task\n\n" + task.strip()]
    if (agent.get("prompt") or "").strip():
        blocks.append("# Your Instructions\n\n" + agent["prompt"].strip())
    if not alone:
        blocks.append(_team(agent, team, coordinator))
    blocks.append(_files(agent, team, workspace, artifacts_root, mounts))
    if config.channels and SEND in tools:
        blocks.append("# Channels\n\n" + ", ".join(f"`{c}`" for c in config.channels)
                      + " (messages_send with `channel` instead of `recipient`)")
    blocks.append(contract(agent, team, config, tools))
    return "\n\n".join(blocks)


def _identity(agent, coordinator, alone):
    name = agent.get("displayName") or agent["id"]
    if alone:
        return f"You are {name} (agent id `{agent['id']}`), {agent['role']}. You work alone on this project."
    lead = " You coordinate the team." if agent["id"] == coordinator else ""
    return (f"You are {name} (agent id `{agent['id']}`), {agent['role']}, one agent of a team working on "
            f"one project.{lead}")


def _team(agent, team, coordinator):
    lines = ["# Team", ""]
    for member in team:
        notes = [member["role"]]
        if member["id"] == coordinator and member["role"] != "coordinator":
            notes.append("coordinator")
        if member["id"] == agent["id"]:
            notes.append("you")
        lines.append(f"- `{member['id']}` ({member.get('displayName') or member['id']}): {', '.join(notes)}")
    lines.append("- `user`: the person who runs the project")
    return "\n".join(lines)


def _files(agent, team, workspace, artifacts_root, mounts):
    lines = ["# Files", "",
             f"- `{workspace}`: your private working folder, kept between activations.",
             f"- `{artifacts_root}/{agent['id']}`: your published folder. Put finished work here; the others "
             "read it there."]
    others = [m["id"] for m in team if m["id"] != agent["id"]]
    if others:
        lines.append(f"- `{artifacts_root}/<agent id>`: each other agent's published folder, read-only for you.")
    for path, writable, description in mounts:
        line = f"- `{path}`: an input, {'read-write' if writable else 'read-only'}"
        lines.append(line + (f": {description}" if description else "."))
    return "\n".join(lines)


def contract(agent, team, config, tools):
    """The rules of the agent's tools, naming only tools it has, as the model must call them."""
    have = set(tools)
    communication = config.communication
    coordinator = communication.coordinator_agent
    has_coordinator = any(m["id"] == coordinator for m in team)
    leads = agent["id"] == coordinator or not has_coordinator
    alone = len(team) <= 1
    call = model_tool_name
    lines = [CONTRACT_HEADING, "",
             "You are woken when something new arrives for you; it is in the user message under New Signals. "
             "You act only by calling tools: text without a tool call reaches no one.",
             "Your tools: " + (", ".join(f"`{call(t)}`" for t in tools) if tools else "none")
             + ". Call them by exactly these names."]
    if SUBMIT in have and leads:
        lines.append(f"When the task is done, call `{call(SUBMIT)}` with the final report (Markdown). "
                     "It ends your work until the user answers.")
    if SEND in have and not alone:
        if leads:
            lines.append(f"Give work to another agent with `{call(SEND)}` to its id. Its answer comes as a new "
                         "signal in a later activation, so after delegating, end this activation"
                         + (f" with `{call(WAIT)}`." if WAIT in have else "."))
        else:
            target = f"`{coordinator}`" if has_coordinator else "whoever asked"
            lines.append(f"When your assignment is done, report it to {target} with `{call(SEND)}`: what you did "
                         "and the exact paths of your files"
                         + (f"; then call `{call(WAIT)}`." if WAIT in have else "."))
        if communication.restrict_non_coordinator_to_coordinator and not leads:
            lines.append(f"Send messages only to `{coordinator}`, at priority "
                         f"{communication.non_coordinator_max_priority} or lower.")
        lines.append("Use priority P3 unless it is urgent: P1 only to unblock active work, P0 only for "
                     "emergencies. Never message yourself; do not send acknowledgements.")
    elif SEND in have:
        lines.append(f"`{call(SEND)}` to `user` only when you are blocked and need the person.")
    if WAIT in have:
        lines.append(f"`{call(WAIT)}` ends this activation until a new signal arrives; call it once you have "
                     "done and reported what the signals asked.")
    if SEND in have and not leads:
        lines.append(f"If the work is unclear or impossible, say so to `{coordinator if has_coordinator else 'user'}` "
                     f"with `{call(SEND)}`; never end silently.")
    return "\n".join(lines)
