"""Seed projects for the WebUI acceptance suite (docs/design/webui.md) and its benchmark, written through the
real store API only: the `demo`/`beta` pair of the harness, an XSS probe project, and a large project.
Imported by tests/test_webui.py, tests/test_webui_team.py and the bench/webui_*.py scripts; reuses
tests/api_fixtures.py for init. The team view adds a real demo-team run and a large timeline."""
import json
import logging
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from api_fixtures import init_project
from conftest import wait_until
from store_fixtures import config_of

import suzumio_coordination as coordination
import suzumio_records

log = logging.getLogger(__name__)

DEMO_TASK = " ".join(
    f"Step {index}: survey the coordination literature, note each claim with its source, and report."
    for index in range(1, 40)
)[:1500]
LONG_BODY = "".join(f"Line {index:05d} of the long briefing for pm.\n" for index in range(1, 400))[:15000]
XSS_BODY = '<img src=x onerror="window.__xss=1"><b>bold</b>'
XSS_NAME = "<i>Yuki</i>"
MESSAGE_MARKER = "Message body text for the overview benchmark."
HISTORY_MARKER = "History row content for the benchmark, long enough to matter."
USAGE = {"selectedModel": "offline", "model": "team", "apiModel": "team",
         "tokens": {"input": 1200, "output": 340, "total": 1540}}
CONTEXT_MESSAGES = [
    {"role": "system", "content": "You are Yuki, the project manager of demo."},
    {"role": "user", "content": "# New signals\n\nPlease plan the survey."},
]

PROJECT_YAML = """\
name: {name}
task: {task}
scheduler:
  noEffectNudge:
    enabled: false
agents:
{agents}tools:
  toolpacks: {toolpacks}
backend:
  kind: local
  runner:
    model: offline
    models:
      providers:
        replay:
          type: scripted
          script: {{agents: {{}}}}
      presets:
        offline: {{provider: replay, model: team}}
"""

DEMO_AGENTS = """\
  pm:
    displayName: Yuki
    role: project-manager
    tools: [messages.send, coordination.wait_for_signal, completion.submit, "file.*", shell.exec]
  researcher:
    displayName: Akari
    role: researcher
    tools: [messages.send, coordination.wait_for_signal, "file.*"]
"""

BETA_AGENTS = """\
  pm:
    tools: [messages.send, completion.submit]
"""


def project_text(name, controller_url, *, task, agents, toolpacks):
    """A project file on the local backend with an empty scripted provider and no no-effect nudge, so
    nothing a scenario does starts a model turn unless it creates work."""
    return PROJECT_YAML.format(name=name, task=json.dumps(task), agents=agents, toolpacks=toolpacks,
                               controller_url=controller_url)


@dataclass(frozen=True)
class DemoSeed:
    """Ids the scenarios assert on."""
    newest_message_id: str
    compaction_id: str
    activation_with_context: str
    activation_without_context: str


def seed_demo(root, directory, controller_url, name="demo"):
    """docs/design/webui.md `demo`: Yuki/pm and Akari/researcher (both quiet), a 1,500-character task, 3 messages
    (newest user → pm, P1, 15,000 characters), pm history of 100 rows with rows 1–20 archived by one
    compaction, 2 completed pm activations (one with a 2-message context snapshot and token usage),
    2 completed `shell.exec` calls, every signal delivered or closed, status `initialized`.

    Deviations forced by the real store: the tool calls are pm's (a call writes history for its
    caller, and researcher must have none), and the compaction marker is row 22 with row 21 kept
    active, because a compaction keeps at least one row of the tail and gets its own id (`cmp_…`)."""
    store = init_project(root, directory / name, project_text(
        name, controller_url, task=DEMO_TASK, agents=DEMO_AGENTS, toolpacks="[core, shell]"))
    store.start()
    coordination.send_message(store, config_of(store), "user", "Please plan the survey.", recipient="pm", priority="P3")
    pending = [s["id"] for s in coordination.pending_signals(store, config_of(store), "pm")]
    act1 = coordination.start_activation(store, "pm", "# New signals\n\nPlease plan the survey.",
                                         pending)["id"]  # row 1
    store.record_activation_context(act1, "pm", {
        "version": 1, "kind": "model-context", "recordedAt": suzumio_records.now_ts(), "selectedModel": "offline",
        "model": "team", "apiModel": "team", "firstPrompt": True, "messageCount": len(CONTEXT_MESSAGES),
        "totalChars": sum(len(m["content"]) for m in CONTEXT_MESSAGES),
        "messages": [{**m, "chars": len(m["content"])} for m in CONTEXT_MESSAGES]})
    for command in ("ls /workspace", "wc -l notes.md"):  # rows 2–5
        call = store.start_tool_call("pm", act1, "shell.exec", {"command": command})["toolCallId"]
        coordination.finish_tool_call(store, "pm", act1, call, "completed", output=f"$ {command}\nok")
    coordination.send_message(store, config_of(store), "pm", "Survey plan drafted; details follow.", recipient="user",
                              source_agent="pm", source_activation=act1)
    while store.history_page("pm", limit=1)["messages"][0]["sequence"] < 21:  # rows 6–21
        store.append_history("pm", act1, "assistant", "assistant_text", "Working through the survey notes.")
    compaction = coordination.compact_history(store, "pm", act1, "Summary of the first twenty rows: plan drafted.",
                                              keep_tail=1, reason="seed")["compaction"]["id"]  # row 22
    coordination.complete_activation(store, config_of(store), act1, "pm", "Plan drafted and shared.", usage=USAGE)
    newest = coordination.send_message(store, config_of(store), "user", LONG_BODY, recipient="pm", priority="P1")
    pending = [s["id"] for s in coordination.pending_signals(store, config_of(store), "pm")]
    act2 = coordination.start_activation(store, "pm", "# New signals\n\nRead the long briefing.",
                                         pending)["id"]  # row 23
    for index in range(24, 101):
        role = "assistant" if index % 2 else "user"
        store.append_history("pm", act2, role, f"{role}_text", f"Row {index}: briefing notes, part {index}.")
    coordination.complete_activation(store, config_of(store), act2, "pm", "Briefing read.")
    store.set_status("initialized")
    return DemoSeed(newest_message_id=newest["id"], compaction_id=compaction,
                    activation_with_context=act1, activation_without_context=act2)


def seed_beta(root, directory, controller_url, name="beta"):
    """docs/design/webui.md `beta`: toolpack core, agent pm, a submitted report, status `submitted`."""
    store = init_project(root, directory / name, project_text(
        name, controller_url, task="Write the beta report.", agents=BETA_AGENTS, toolpacks="[core]"))
    coordination.submit_report(store, "pm", None, "# Beta report\n\nEverything checked.")
    return store


def seed_harness(root, directory, controller_url):
    """Both harness projects; returns the ids of `demo`."""
    seed = seed_demo(root, directory, controller_url)
    seed_beta(root, directory, controller_url)
    return seed


def seed_xss(root, directory, controller_url, name="xss"):
    """A project whose agent's display name and one message body are HTML (docs/design/webui.md)."""
    agents = (f"  pm:\n    displayName: {json.dumps(XSS_NAME)}\n    role: project-manager\n"
              "    tools: [messages.send]\n")
    store = init_project(root, directory / name, project_text(
        name, controller_url, task="Render everything as text.", agents=agents, toolpacks="[core]"))
    coordination.send_message(store, config_of(store), "user", XSS_BODY, recipient="pm")
    return store


def seed_large(root, directory, controller_url, *, messages=5000, history=20000, name="large"):
    """The benchmark project: `messages` messages (bodies of ~2 KB) and one agent with `history`
    history rows, written through the store. Signals stay pending; the benchmark never ticks."""
    store = init_project(root, directory / name, project_text(
        name, controller_url, task="Scale check.", agents=DEMO_AGENTS, toolpacks="[core, shell]"))
    body = f"{MESSAGE_MARKER} " * 44
    for index in range(messages):
        coordination.send_message(store, config_of(store), "user", f"{index}: {body}", recipient="researcher")
    content = f"{HISTORY_MARKER} " * 16
    for index in range(history):
        store.append_history("pm", None, "assistant", "assistant_text", f"{index}: {content}")
    log.info("seeded %s: %d messages, %d history rows", name, messages, history)
    return store


# ---------------------------------------------------------------------------------------------
# Team view: a real demo-team run, and a large timeline for the benchmark.

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KICKOFF = "Start. Make the greeting card with your team."


def init_demo_team(service, directory):
    """examples/demo.yaml (pm Mio, workers Akari and Ren, critic Kei) on the `local` backend with the
    scripted provider, whose runners reach this server over its runner socket; initialised like
    `suzumio init`, not started."""
    directory.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((EXAMPLES / "demo.yaml").read_text(encoding="utf-8"))
    shutil.copy(EXAMPLES / "demo-script.yaml", directory / "demo-script.yaml")
    return init_project(service.root, directory, yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def run_demo_team(service, directory, timeout=90):
    """The demo team's whole run through the HTTP API, as `make demo` drives it: start, the kickoff
    message, then real local runners replay the script until pm submits. Needs a scheduler thread."""
    store = init_demo_team(service, directory)
    assert service.post("/api/projects/demo/start").status_code == 200
    assert service.post("/api/projects/demo/messages", {"recipient": "pm", "body": KICKOFF}).status_code == 200
    wait_until(lambda: store.project()["status"] == "submitted", timeout, message="the demo team to submit")
    wait_until(lambda: not store.running_activations(), timeout, message="the last activations to end")
    return store


def seed_team_scale(root, directory, controller_url, *, activations=2000, messages=10000, name="team"):
    """The team-view benchmark project: 6 agents, `activations` activations and `messages` messages
    between them, written through the store with a travelling clock (one activation every ~9 s, five
    messages each), so the timeline spans about five hours. Signals stay pending; nothing ticks."""
    agents = "".join(f"  agent{index}:\n    displayName: Agent {index}\n    role: worker\n"
                     "    tools: [messages.send]\n" for index in range(6))
    store = init_project(root, directory / name, project_text(
        name, controller_url, task="Scale check for the team view.", agents=agents, toolpacks="[core]"))
    clock = datetime.now(UTC) - timedelta(seconds=9 * activations + 60)
    store.start(now=clock)
    per_activation = max(1, messages // activations)
    sent = 0
    for index in range(activations):
        agent = f"agent{index % 6}"
        clock += timedelta(seconds=9)
        act = coordination.start_activation(store, agent, f"Work item {index}.", [], now=clock)["id"]
        for step in range(per_activation if index < activations - 1 else messages - sent):
            recipient = f"agent{(index + step + 1) % 6}"
            coordination.send_message(store, config_of(store), agent,
                                      f"Item {index}, note {step}: handing over the next piece.",
                                      recipient=recipient, priority=("P1", "P2", "P3", "P3")[step % 4],
                                      source_agent=agent, source_activation=act,
                                      now=clock + timedelta(milliseconds=800 * (step + 1)))
            sent += 1
        coordination.complete_activation(store, config_of(store), act, agent, f"Item {index} done.", usage=USAGE,
                                         now=clock + timedelta(seconds=6))
    log.info("seeded %s: %d activations, %d messages", name, activations, sent)
    return store
