"""Soak: one `suzumio serve` keeps a fixed set of projects at work for a while. Each round
starts every project again and sends its pm "Round N": pm delegates to worker, worker reports back, pm
submits, while clients browse the project list. The model (`--model server`, the default) is a real
Chat Completions server in this process whose context holds CONTEXT_MESSAGES messages: a longer request
is answered as a context overflow, so the runners compact their agents' histories as they would against
a real model and every round costs the same (with `--model scripted`, the offline provider, histories
only grow, and so does what each activation start reads and writes). Prints the controller's
descriptors, threads and resident memory after the first round, after a warm-up and at the end, and
fails when an activation failed, a round did not finish, or a figure grew after the warm-up
(descriptors and threads beyond a small margin, memory beyond 1.25x). The warm-up is time, not rounds:
the SQLite page caches (up to 2 MiB a connection), malloc's and pymalloc's high-water marks and the
parsed configs fill over the first minutes.
Usage: .venv/bin/python bench/soak_teams.py [--minutes 20] [--warmup-minutes 5] [--projects 4]
       [--model server|scripted] [--json]"""
import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import benchlib
from fake_model import OVERFLOW_REPLY, FakeModel, answer
from load_fixtures import ServeProcess, browse, init_from_text

import suzumio_store

ROUND_TIMEOUT_S = 300.0
CONTEXT_MESSAGES = 60  # the fake model's context window, in messages
PROJECT_YAML = """\
name: {name}
task: Answer each round.
scheduler:
  noEffectNudge: {{maxConsecutive: 1}}
agents:
  pm: {{tools: [messages.send, coordination.wait_for_signal, completion.submit]}}
  worker: {{tools: [messages.send, coordination.wait_for_signal, file.write]}}
backend:
  kind: local
  runner:
    model: main
    models:
      providers:
        replay: {provider}
      presets:
        main: {{provider: replay, model: soak}}
"""


def steps(kind, tag):
    """The tool calls of one turn: pm's "Round" (delegate, wait), worker's "Task" (write, report, wait) and
    pm's "Done" (submit)."""
    if kind == "Round":
        return [("messages.send", {"recipient": "worker", "body": f"Task {tag}."}),
                ("coordination.wait_for_signal", {"reason": "Waiting."})]
    if kind == "Task":
        return [("file.write", {"path": "{artifacts}/round.txt", "content": tag}),
                ("messages.send", {"recipient": "pm", "body": f"Done {tag}."}),
                ("coordination.wait_for_signal", {"reason": "Reported.", "notifyPm": False})]
    return [("completion.submit", {"report": f"# Round {tag}\n\nDone.\n"})]


def script(rounds):
    """The scripted provider's script: every round's turns, matched by their prompts."""
    agents = {"pm": [], "worker": []}
    for number in range(rounds):
        tag = f"R{number:04d}"
        for agent, kind in (("pm", "Round"), ("pm", "Done"), ("worker", "Task")):
            agents[agent].append({"when": f"{kind} {tag}.", "steps": [
                {"tools": [{"name": name, "input": fields}]} for name, fields in steps(kind, tag)]})
    return {"agents": agents}


TURN = re.compile(r"\b(Round|Task|Done) (R\d{4})\.")


def text_of(message):
    content = message.get("content")
    return content if isinstance(content, str) else json.dumps(content)


def respond(request):
    """The fake model's answer to one request (`--model server`): a summary for a compaction's summary
    request, an overflow for a request beyond the context, else the next step of the turn that the last
    user message (the activation's prompt) names, or a plain answer once its steps are done."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    prompts = [index for index, message in enumerate(messages) if message.get("role") == "user"]
    if not prompts:
        return answer("Nothing to do.")
    prompt = text_of(messages[prompts[-1]])
    if "# Agent History To Compact" in prompt:
        return answer("Earlier rounds were all delegated, reported and submitted.")
    if len(messages) > CONTEXT_MESSAGES:
        return OVERFLOW_REPLY
    turns = TURN.findall(prompt)
    if not turns:
        return answer("Nothing to do.")
    kind, tag = turns[-1]
    done = sum(1 for message in messages[prompts[-1] + 1:] if message.get("role") == "assistant")
    names = {tool["function"]["name"] for tool in request.get("tools") or []}
    todo = steps(kind, tag)
    if done >= len(todo):
        return answer("Done.")
    name, fields = todo[done]
    safe = name.replace(".", "_")
    return answer(tool_calls=[(safe if safe in names else name, fields)])


def init_projects(root_path, names, rounds, model_url=None):
    """The projects, on the scripted provider or (with `model_url`) on the fake model server."""
    root = suzumio_store.Root(root_path)
    try:
        for name in names:
            folder = Path(root_path) / "_sources" / name
            folder.mkdir(parents=True, exist_ok=True)
            if model_url is None:
                (folder / "script.json").write_text(json.dumps(script(rounds)), encoding="utf-8")
                provider = "{type: scripted, script: script.json}"
            else:
                provider = f"{{type: openai-compatible, baseURL: '{model_url}', apiKey: soak}}"
            init_from_text(root, folder, PROJECT_YAML.format(name=name, provider=provider))
    finally:
        root.close()


def figures(serve):
    return {"descriptors": serve.descriptors(), "threads": serve.threads(), "rss_kib": serve.rss_kib()}


def run_round(serve, names, number):
    tag = f"R{number:04d}"
    for name in names:
        for path, body in ((f"/api/projects/{name}/start", b"{}"),
                           (f"/api/projects/{name}/messages",
                            json.dumps({"recipient": "pm", "body": f"Round {tag}."}).encode())):
            status, answer = serve.request("POST", path, body)
            if status != 200:
                raise SystemExit(f"POST {path}: {status} {answer[:200]!r}")
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    pending = set(names)
    while pending and time.monotonic() < deadline:
        browse(serve, 2, 2)
        for name in list(pending):
            _status, body = serve.request("GET", f"/api/projects/{name}/report")
            if f"# Round {tag}" in body.decode("utf-8", "replace"):
                pending.discard(name)
        time.sleep(0.05)
    if pending:
        raise SystemExit(f"round {tag} did not finish within {ROUND_TIMEOUT_S:.0f} s: {sorted(pending)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--projects", type=int, default=4, help="projects at work at once, every round")
    parser.add_argument("--warmup-minutes", type=float, default=5.0,
                        help="rounds run before the figures the end is compared with")
    parser.add_argument("--rounds", type=int, default=2000, help="turns the script holds (an upper bound)")
    parser.add_argument("--model", choices=("server", "scripted"), default="server",
                        help="a fake model server with a bounded context (histories compact), or the "
                             "scripted provider (histories grow)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = benchlib.Results("soak_teams")
    names = [f"soak-{index}" for index in range(args.projects)]
    model = FakeModel(responder=respond, record=False) if args.model == "server" else None
    with tempfile.TemporaryDirectory(prefix="suzumio-soak-") as folder:
        root = Path(folder) / "root"
        root.mkdir()
        init_projects(root, names, args.rounds, model and model.base_url)
        serve = ServeProcess(root, Path(folder) / "serve.log").start()
        try:
            run_round(serve, names, 0)
            start = figures(serve)
            number = 0
            warm = time.monotonic() + args.warmup_minutes * 60
            while time.monotonic() < warm and number + 1 < args.rounds:
                number += 1
                run_round(serve, names, number)
            warmup_rounds = number + 1
            first = figures(serve)
            samples = []  # resident size every 25 rounds after the warm-up
            ends = time.monotonic() + args.minutes * 60
            while time.monotonic() < ends and number + 1 < args.rounds:
                number += 1
                run_round(serve, names, number)
                if number % 25 == 0:
                    now = figures(serve)
                    samples.append(now["rss_kib"])
                    results.note(f"after round {number}: {now['descriptors']} descriptors, {now['threads']} "
                                 f"threads, {now['rss_kib'] / 1024:.1f} MiB")
            last = figures(serve)
            _status, body = serve.request("GET", "/api/projects")
            failed = sum(project["stats"]["failedActivationCount"] for project in json.loads(body))
            activations = sum(project["stats"]["activationCount"] for project in json.loads(body))
            compactions = sum(project["stats"]["historyCompactionCount"] for project in json.loads(body))
        finally:
            serve.stop()
            if model is not None:
                model.close()
    rounds = number + 1 - warmup_rounds
    results.note(f"{rounds} rounds in {args.minutes:g} min after {warmup_rounds} warm-up rounds in "
                 f"{args.warmup_minutes:g} min, {args.projects} projects each ({activations} activations in "
                 f"all, {failed} failed; {compactions} history compactions; model: {args.model})")
    results.note(f"after the first round: {start['descriptors']} descriptors, {start['threads']} threads, "
                 f"{start['rss_kib'] / 1024:.1f} MiB")
    results.add("descriptors: end against after warm-up", last["descriptors"], "count", first["descriptors"])
    results.add("threads: end against after warm-up", last["threads"], "count", first["threads"])
    results.add("resident memory: end against after warm-up", last["rss_kib"] / 1024, "MiB", first["rss_kib"] / 1024)
    # One reading swings by a few MiB with what is in flight; medians of the first and last samples
    # after the warm-up show the trend.
    window = max(1, len(samples) // 4)
    early = benchlib.median(samples[:window] or [first["rss_kib"]])
    late = benchlib.median(samples[-window:] or [last["rss_kib"]])
    results.add(f"resident memory: median of the last {window} samples against the first {window}",
                late / 1024, "MiB", early / 1024)
    code = results.emit(args.json)
    grew = (last["descriptors"] > first["descriptors"] + 16 or last["threads"] > first["threads"] + 4
            or last["rss_kib"] > first["rss_kib"] * 1.25)
    return 1 if grew or failed else code


if __name__ == "__main__":
    sys.exit(main())
