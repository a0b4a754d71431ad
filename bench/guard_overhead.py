"""What the loop guards cost at a tool-call start: starts/s through the guard check and
`suzumio_approvals.start_tool_call` (what `/runner/tool-calls/start` runs) with the default guards on,
against the same starts in a twin project with both guards off, in one run, alternating rounds. Two
cases: a plain tool call (the repeated-call read only), and a `messages.send` to an agent whose pair
is at the ping-pong limit less one, so every start also looks at the project's artifacts (`--files`
files, written after those messages: the walk stops at the first change and the call goes through).
Usage: .venv/bin/python bench/guard_overhead.py [--starts 800] [--files 200] [--rounds 3] [--json]"""
import argparse
import sys
import tempfile
from pathlib import Path

import benchlib

import suzumio_approvals
import suzumio_config
import suzumio_coordination as coordination
import suzumio_guards


def project(root, scratch, name, guards):
    text = benchlib.project_text(name, ["pm", "worker"], tools='[messages.send, "file.*"]')
    if guards is not None:
        text += f"guards: {guards}\n"
    return benchlib.init_project(root, scratch / name, text)


def start_rate(store, config, count, tool, make_input):
    """Starts/s of `count` tool calls of one running activation of `worker`, each a fresh input."""
    activation = coordination.start_activation(store, "worker", "Work.", [])["id"]

    def starts():
        for index in range(count):
            tool_input = make_input(index)
            tripped = suzumio_guards.tripped_guard(store, config, "worker", tool, tool_input)
            assert tripped is None, tripped  # the bench measures the check, never a trip
            suzumio_approvals.start_tool_call(store, config, "worker", activation, tool, tool_input)

    [seconds] = benchlib.timed(starts, repeat=1, warmup=0)
    coordination.cancel_activation(store, activation, "bench round over")
    return count / seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=800)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="alternating on/off rounds; medians reported")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("guard_overhead")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        import suzumio_store

        root = suzumio_store.Root(scratch / "root")
        try:
            stores = {"on": project(root, scratch, "guarded", None),
                      "off": project(root, scratch, "unguarded", "{repeatedToolCall: false, pingPong: false}")}
            configs = {key: suzumio_config.ProjectConfig.from_data(store.config()) for key, store in stores.items()}
            for key, store in stores.items():
                # the pair at the default pingPong limit less one, then artifacts written after those
                # messages: every start walks them, finds the change, and lets the call through
                for sender, recipient in [("pm", "worker"), ("worker", "pm")] * 4 + [("pm", "worker")]:
                    coordination.send_message(store, configs[key], sender, "bounce", recipient=recipient)
                for index in range(options.files):
                    folder = store.artifacts_dir("pm") / f"part-{index % 10}"
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / f"file-{index}.md").write_text("x", encoding="utf-8")
            cases = [("file.read (repeated-call check)", "file.read", lambda i: {"path": f"notes-{i}.md"}),
                     (f"messages.send at the pair's limit ({options.files} artifact files, changed since)",
                      "messages.send", lambda i: {"recipient": "pm", "body": f"status {i}"})]
            for label, tool, make_input in cases:
                rates = {"on": [], "off": []}
                for _ in range(options.rounds):
                    for key in ("off", "on"):
                        rates[key].append(start_rate(stores[key], configs[key], options.starts, tool, make_input))
                results.add(f"tool-call start, {label}, guards on vs off", benchlib.median(rates["on"]), "/s",
                            benchlib.median(rates["off"]), higher_is_better=True, target=0.5)
        finally:
            root.close()
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
