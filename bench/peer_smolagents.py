"""The peer framework's side of bench/real_model.py: smolagents' ToolCallingAgent on one task with one
`file_write` tool, talking to the lab's server through a relay that keeps each request's usage, as the
controller's recorder does for Suzumio. Runs in the bench's own environment (the one with smolagents), never
in Suzumio's; prints one JSON line.
Usage: python bench/peer_smolagents.py --base URL --model NAME --root DIR --task TEXT [--seed 7] [--steps 6]"""
import argparse
import http.server
import json
import os
import threading
import time
import urllib.request

KNOWN = {"file_write": ("path", "content"), "final_answer": ("answer",)}


class Relay(http.server.ThreadingHTTPServer):
    """Forwards POSTs to the lab and keeps each answer's usage, timings and tool calls."""

    def __init__(self, upstream):
        super().__init__(("127.0.0.1", 0), RelayHandler)
        self.upstream = upstream.rstrip("/")
        self.answers = []


class RelayHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        path = self.path.removeprefix("/v1")
        request = urllib.request.Request(self.server.upstream + path, data=body,
                                         headers={"content-type": "application/json",
                                                  "authorization": self.headers.get("authorization", "")})
        with urllib.request.urlopen(request, timeout=1200) as answer:
            raw = answer.read()
            status = answer.status
        try:
            self.server.answers.append(json.loads(raw))
        except ValueError:
            pass
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_):
        pass


def valid_call(call):
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        return False
    fields = KNOWN.get(function.get("name"))
    return fields is not None and isinstance(arguments, dict) and all(f in arguments for f in fields)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    root = os.path.abspath(args.root)

    @tool
    def file_write(path: str, content: str) -> str:
        """Write a whole file.

        Args:
            path: The file's path.
            content: The file's content.
        """
        target = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(content)
        return f"Wrote {path}"

    relay = Relay(args.base)
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    model = OpenAIServerModel(model_id=args.model, api_base=f"http://127.0.0.1:{relay.server_port}/v1",
                              api_key="bench", temperature=0, seed=args.seed)
    agent = ToolCallingAgent(tools=[file_write], model=model, max_steps=args.steps, verbosity_level=0)
    started = time.monotonic()
    error = None
    try:
        agent.run(args.task)
    except Exception as caught:  # noqa: BLE001 (the peer's own failure is a result here, not a crash)
        error = f"{type(caught).__name__}: {caught}"
    wall = time.monotonic() - started
    relay.shutdown()
    calls = [call for answer in relay.answers for choice in answer.get("choices", [])
             for call in (choice.get("message") or {}).get("tool_calls") or []]
    print(json.dumps({
        "answered": any((c.get("function") or {}).get("name") == "final_answer" for c in calls),
        "calls": len(calls), "validCalls": sum(1 for c in calls if valid_call(c)),
        "usage": [{"input": a.get("usage", {}).get("prompt_tokens", 0),
                   "cacheRead": (a.get("timings") or {}).get("cache_n", 0)} for a in relay.answers],
        "wall": wall, "error": error}))


if __name__ == "__main__":
    main()
