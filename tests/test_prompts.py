"""What a model reads (suzumio_prompts, docs/real-models.md): the system message that stays the same across an
agent's activations, and the user message with the new signals."""
import copy

import suzumio_backend
import suzumio_config
import suzumio_prompts as prompts
from suzumio_records import render_signal

BASE = {
    "name": "demo",
    "task": "Write a poem about the sea.",
    "backend": {"kind": "local", "runner": {"model": "m", "models": {
        "providers": {"p": {"type": "scripted", "script": {"agents": {}}}},
        "presets": {"m": {"provider": "p", "model": "x"}}}}},
}
ALL = ["messages.send", "coordination.wait_for_signal", "completion.submit", "file.read", "file.write"]


def config(agents, **extra):
    return suzumio_config.ProjectConfig.from_data(dict(copy.deepcopy(BASE), agents=agents, **extra))


def agent(agent_id, role="worker", prompt="", name=None):
    return {"id": agent_id, "displayName": name or agent_id, "role": role, "prompt": prompt}


def system(config_, me, team, tools=ALL, mounts=(), kind_paths=("/workspace", "/artifacts")):
    return prompts.system_prompt(task=config_.task, agent=me, agents=team, config=config_, tools=tools,
                                 workspace=kind_paths[0], artifacts_root=kind_paths[1], mounts=mounts)


def test_system_message_orders_identity_task_instructions_team_files_and_contract():
    team = [agent("pm", "coordinator", "Keep it short.", "Mio"), agent("worker-1", "writer", "Rhyme.")]
    cfg = config({"pm": {}, "worker-1": {}})
    worker = system(cfg, team[1], team)
    order = ["You are worker-1 (agent id worker-1, writer), one agent of a team working on a project for a user. "
             "You act only by calling tools", "Project task: Write a poem about the sea.", "Your instructions: Rhyme.",
             "Team: pm (Mio): coordinator; worker-1: writer, you; user: the person who runs the project."]
    positions = [worker.index(part) for part in order]
    assert positions == sorted(positions)
    # the coordinator leads the work: its task is in the user message of each activation instead
    text = system(cfg, team[0], team)
    assert "Project task:" not in text
    order = ["You are Mio (agent id pm, coordinator), one agent of a team working on a project for a user. You "
             "coordinate the team. You act only by calling tools", "Your instructions: Keep it short.",
             "Team: pm (Mio): coordinator, you; worker-1: writer; user: the person who runs the project.",
             "Files: your artifact folder is /artifacts/pm: put finished work there",
             "Your private working folder is /workspace", "Each other agent's artifact folder is /artifacts/<agent id>",
             "Channels: #project, #blocked", "Your tools: "]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)
    # paragraphs, not a document of headings a small model copies into what it writes
    assert not any(line.startswith("#") for line in text.splitlines())


def test_the_contract_names_exactly_the_tools_the_agent_has_as_the_model_calls_them():
    team = [agent("pm", "coordinator"), agent("w", "writer")]
    cfg = config({"pm": {}, "w": {}})
    lead = system(cfg, team[0], team)
    assert ("Your tools: messages_send, coordination_wait_for_signal, completion_submit, file_read, "
            "file_write. Call them by exactly these names.") in lead
    assert "call completion_submit with the final report" in lead
    assert "Give work to another agent with messages_send" in lead
    # no dotted name the model cannot call, and no tool the agent lacks
    contract = lead[lead.index("Your tools: "):]
    for dotted in ALL + ["shell.exec", "shell_exec"]:
        assert dotted not in contract
    worker = system(cfg, team[1], team, tools=["messages.send", "coordination.wait_for_signal", "file.write"])
    assert "report it to pm with messages_send" in worker and "then call coordination_wait_for_signal" in worker
    assert "completion_submit" not in worker


def test_channels_are_described_to_the_agent_that_leads_the_work_only():
    team = [agent("pm", "coordinator"), agent("w", "writer")]
    cfg = config({"pm": {}, "w": {}}, channels=["#project", "#news"])
    assert "Channels: #project, #news (messages_send with `channel` instead of `recipient`)." in system(cfg, team[0],
                                                                                                        team)
    worker = system(cfg, team[1], team)
    assert "Channels:" not in worker and "#project" not in worker
    # nor does a worker's messages_send have the field: the runner input leaves it out
    specs, _ = suzumio_backend.runner_toolpack_specs(cfg, {"id": "w", "tools": ["messages.send"]}, "local")
    [send] = [tool for spec in specs for tool in spec["tools"]]
    assert send["name"] == "messages.send" and "channel" not in send["inputSchema"]["properties"]
    assert "recipient" in send["inputSchema"]["properties"]
    specs, _ = suzumio_backend.runner_toolpack_specs(cfg, {"id": "pm", "tools": ["messages.send"]}, "local")
    assert "channel" in specs[0]["tools"][0]["inputSchema"]["properties"]


def test_an_agent_alone_is_told_so_and_gets_no_team_rules():
    me = agent("pm", "poet")
    text = system(config({"pm": {}}), me, [me])
    assert text.startswith("You are pm (agent id pm, poet). You work alone on a project for a user.")
    assert "Team:" not in text and "Give work to another agent" not in text and "Never message yourself" not in text
    assert "Channels:" not in text
    assert "Use messages_send only to ask the user something when you are blocked." in text
    assert "call completion_submit with the final report" in text
    solo = system(config({"pm": {}}), me, [me], tools=["completion.submit", "file.write"])
    assert "messages_send" not in solo and "coordination_wait_for_signal" not in solo


def test_mounted_inputs_and_restricted_messaging_are_in_the_system_message():
    team = [agent("pm", "coordinator"), agent("w")]
    cfg = config({"pm": {}, "w": {}}, communication={"restrictNonCoordinatorToCoordinator": True})
    text = system(cfg, team[1], team, mounts=[("/mnt/ref", False, "Reference data"), ("/mnt/out", True, "")])
    assert "Input /mnt/ref (read-only): Reference data" in text
    assert "Input /mnt/out (read-write)." in text
    assert "Send messages only to pm, at priority P2 or lower." in text


def test_the_system_message_is_the_same_for_every_activation_and_the_user_message_holds_only_signals():
    team = [agent("pm", "coordinator"), agent("w")]
    cfg = config({"pm": {}, "w": {}})
    assert system(cfg, team[0], team) == system(cfg, team[0], list(reversed(team)))
    signal = {"id": "sig_1", "kind": "message.created", "priority": "P3", "createdAt": "2026-01-01T00:00:00Z",
              "payload": {"id": "msg_1", "sender": "user", "recipient": "pm", "body": "Please begin.",
                          "priority": "P3", "createdAt": "2026-01-01T00:00:00Z"}}
    urgent = {"id": "sig_2", "kind": "message.created", "priority": "P1", "createdAt": "2026-01-01T00:00:01Z",
              "payload": {"id": "msg_2", "sender": "w", "channel": "#project", "body": "Blocked on the key.",
                          "priority": "P1", "createdAt": "2026-01-01T00:00:01Z"}}
    user = prompts.user_prompt([signal, urgent])
    assert user == "The user says: Please begin.\n\nw says in #project (P1): Blocked on the key."
    assert user == "\n\n".join([render_signal(signal), render_signal(urgent)])
    # the agent that leads the work reads the task first, where a small model looks for what to do
    lead = prompts.user_prompt([signal], cfg.task)
    assert lead == "Project task: Write a poem about the sea.\n\nThe user says: Please begin."
    # no dotted signal kind reads like a tool to call, and no id or clock a model copies into its answer
    assert "message.created" not in user and "msg_1" not in user and "2026" not in user
