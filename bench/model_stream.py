"""The model proxy's streaming path: a fake streaming model server (real HTTP in its own process,
Chat Completions chunks as Server-Sent Events, the first token after a fixed think time, then tokens at
an interval) read directly by a client, against the same server read through the controller: a runner's
`POST /runner/model` (the runner's own ControllerClient, over the runner socket) forwarded by the model
proxy, its first delta timed by a client of the project's SSE stream (`activation.delta`).
Two parts, each against its baseline from the same run, calls alternating between the two:
  1. one call at a time: time to the first token (direct) vs to the first delta on the project's stream;
     aim <= 1.1x + 5 ms;
  2. `--concurrent` calls at once through one controller (serve's 32 worker threads): time to the first
     token/delta and to the whole answer (p50, p95), the peak thread count of the controller process
     (sampled from /proc/self/task) against its count before the burst, and how many calls were
     forwarded at once.
`--path threaded` takes the hand-off away from the runner listener, so that every call keeps its worker
thread as calls through an HTTP proxy do (the model loop's baseline, for a before/after in one run).
The runner clients, the stream client and the direct clients share one separate process, so that
neither side holds the controller's GIL.
Usage: .venv/bin/python bench/model_stream.py [--runs 30] [--concurrent 100] [--rounds 3] [--path loop|threaded]
       [--json]"""
import argparse
import concurrent.futures
import http.client
import json
import logging
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import benchlib

PROJECT_YAML = """\
name: stream
task: Measure.
agents:
{agents}
scheduler:
  allQuietNudge: {{enabled: false}}
  failedNudge: {{enabled: false}}
  noEffectNudge: {{enabled: false}}
backend:
  kind: local
  controllerUrl: "http://127.0.0.1:9"
  runner:
    model: main
    models:
      providers:
        gw: {{type: openai-compatible, baseURL: "{model_url}"}}
      presets:
        main: {{provider: gw, model: fake-model}}
"""
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "stream": True}


# ---------------------------------------------------------------- the fake streaming model (own process)

class StreamHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        think, tokens, interval = self.server.shape
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        time.sleep(think)

        def send(data):
            frame = b"data: " + data + b"\n\n"
            self.wfile.write(b"%X\r\n%s\r\n" % (len(frame), frame))

        base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
        for index in range(tokens):
            if index:
                time.sleep(interval)
            send(json.dumps(dict(base, choices=[{"index": 0, "delta": {"content": f"tok{index} "},
                                                 "finish_reason": None}])).encode())
        send(json.dumps(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}],
                             usage={"prompt_tokens": 5, "completion_tokens": tokens,
                                    "total_tokens": 5 + tokens})).encode())
        send(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def process_request(self, request, client_address):
        # Streaming servers send each token at once (uvicorn and vLLM set TCP_NODELAY); so does this one.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().process_request(request, client_address)


def serve_model(shape, ports):
    server = ModelServer(("127.0.0.1", 0), StreamHandler)
    server.shape = shape
    ports.put(server.server_address[1])
    server.serve_forever()


# ---------------------------------------------------------------- the clients (own process)

def direct_call(port):
    """(first token, whole answer) seconds of one streamed request straight to the model server."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(BODY), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    first, buffer = None, b""
    while True:
        data = response.read1(65536)
        if not data:
            break
        buffer += data
        if first is None and b'"content"' in buffer:
            first = time.perf_counter() - started
    conn.close()
    if first is None or b"[DONE]" not in buffer:
        raise SystemExit("the model server's stream ended early")
    return first, time.perf_counter() - started


class StreamReader:
    """The project's SSE stream read by one thread: the arrival time (perf_counter) of each live delta,
    by activation and call id, and of its `done` frame."""

    def __init__(self, port, project):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(f"GET /api/projects/{project}/stream?limit=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        self.lock = threading.Lock()
        self.first = {}  # (activationId, callId) -> first delta's arrival
        self.done = {}  # (activationId, callId) -> done frame's arrival
        self.order = {}  # activationId -> callIds in the order they first came
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()
        if not self.ready.wait(30):
            raise SystemExit("the stream never began")

    def read(self):
        buffer = b""
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            moment = time.perf_counter()
            self.ready.set()
            buffer += data
            while True:
                cut = buffer.find(b"\n\n")
                if cut < 0:
                    break
                frame, buffer = buffer[:cut], buffer[cut + 2:]
                if b"event: activation.delta" not in frame:
                    continue
                row = json.loads(frame[frame.index(b"data: ") + 6:])
                key = (row["activationId"], row["callId"])
                with self.lock:
                    if key not in self.first:
                        self.first[key] = moment
                        self.order.setdefault(row["activationId"], []).append(row["callId"])
                    if row.get("done"):
                        self.done[key] = moment

    def first_delta(self, activation_id, call_number, timeout=30):
        """Arrival of the first delta of the activation's `call_number`-th call (0-based)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                calls = self.order.get(activation_id, [])
                if len(calls) > call_number:
                    return self.first[activation_id, calls[call_number]]
            time.sleep(0.001)
        raise SystemExit(f"no delta for call {call_number} of {activation_id}")

    def close(self):
        self.sock.close()


class Clients:
    """State of the client process: the stream reader and one runner client per activation."""

    def __init__(self, socket_path, api_port, identities):
        import suzumio_runner_loop

        self.reader = StreamReader(api_port, "stream")
        self.runners = [suzumio_runner_loop.ControllerClient(f"unix://{socket_path}", identity)
                        for identity in identities]
        self.calls = [0] * len(identities)

    def proxied_call(self, index):
        """(first delta, whole answer) seconds of one runner model call through the controller."""
        runner = self.runners[index]
        number = self.calls[index]
        self.calls[index] += 1
        started = time.perf_counter()
        answer = runner.post("/runner/model", {"providerId": "gw", "presetId": "main", "body": BODY},
                             read_timeout=120)
        whole = time.perf_counter() - started
        if answer.get("status") != 200 or "tok0" not in answer.get("body", ""):
            raise SystemExit(f"the proxied call failed: {answer}")
        return self.reader.first_delta(runner.identity["activationId"], number) - started, whole


CLIENTS = None


def client_setup(socket_path, api_port, identities):
    global CLIENTS
    CLIENTS = Clients(socket_path, api_port, identities)


def client_single(mode, model_port):
    return direct_call(model_port) if mode == "direct" else CLIENTS.proxied_call(0)


def client_burst(mode, model_port, count):
    """`count` calls at once, one thread each (as `count` runners would be): their (first, whole) pairs."""
    barrier = threading.Barrier(count)

    def one(index):
        barrier.wait()
        return direct_call(model_port) if mode == "direct" else CLIENTS.proxied_call(index)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


# ---------------------------------------------------------------- the controller (this process)

def counting_proxy():
    """The real ModelProxy, counting the calls it forwards at once on worker threads (the model loop
    counts its own: ModelLoop.peak_exchanges)."""
    from suzumio_model_proxy import ModelProxy

    class CountingProxy(ModelProxy):
        in_flight = peak = 0
        lock = threading.Lock()

        def drive(self, *args, **kwargs):
            with self.lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            try:
                return super().drive(*args, **kwargs)
            finally:
                with self.lock:
                    self.in_flight -= 1

    return CountingProxy()


def without_hand_off(server):
    """The runner listener's app without the hand-off: /runner/model keeps its worker thread."""
    import suzumio_sse
    app = server.server.application

    def threaded(environ, start_response):
        environ.pop(suzumio_sse.HAND_OFF, None)
        return app(environ, start_response)

    server.server.application = threaded


class ThreadPeak:
    """The largest number of threads of this process seen while it runs (sampled every millisecond)."""

    def __init__(self):
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self):
        while not self.stop.wait(0.001):
            self.peak = max(self.peak, thread_count())

    def __enter__(self):
        self.peak = thread_count()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def thread_count():
    return len(os.listdir("/proc/self/task"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="single calls of each kind, alternating")
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="bursts of each kind, alternating")
    parser.add_argument("--think-ms", type=float, default=100.0, help="the model's time to its first token")
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--interval-ms", type=float, default=10.0, help="between two tokens")
    parser.add_argument("--threads", type=int, default=32, help="the listeners' worker threads (serve's default)")
    parser.add_argument("--path", choices=("loop", "threaded"), default="loop",
                        help="how the controller forwards: its model loop, or a worker thread per call")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # 100 calls queue behind the workers
    from api_fixtures import serving

    import suzumio_coordination as coordination
    import suzumio_runtime
    results = benchlib.Results("model_stream")
    context = multiprocessing.get_context("spawn")
    ports = context.Queue()
    shape = (options.think_ms / 1000, options.tokens, options.interval_ms / 1000)
    model = context.Process(target=serve_model, args=(shape, ports), daemon=True)
    model.start()
    model_port = ports.get(timeout=30)
    count = options.concurrent
    try:
        with tempfile.TemporaryDirectory() as scratch:
            scratch = Path(scratch)
            proxy = counting_proxy()
            with serving(scratch / "root", threads=options.threads, api_token=None, model_proxy=proxy) as service:
                if options.path == "threaded":
                    without_hand_off(service.runner_server)
                loop = service.runner_server.app.config["suzumio.model_loop"]
                agents = [f"a{i}" for i in range(count)]
                text = PROJECT_YAML.format(agents="\n".join(f"  {a}: {{tools: [messages.send]}}" for a in agents),
                                           model_url=f"http://127.0.0.1:{model_port}/v1")
                store = benchlib.init_project(service.root, scratch / "src", text)
                identities = []
                for agent in agents:
                    activation = coordination.start_activation(store, agent, "Measure.", [])
                    identities.append({"project": "stream", "agentId": agent, "activationId": activation["id"],
                                       "token": store.agent(agent, include_token=True)["token"]})
                socket_path = str(suzumio_runtime.runner_socket_path(service.root.path))
                with concurrent.futures.ProcessPoolExecutor(
                        1, mp_context=context, initializer=client_setup,
                        initargs=(socket_path, service.port, identities)) as pool:
                    measure(options, results, pool, model_port, count, proxy, loop)
    finally:
        model.kill()
    results.note(f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; model: first token after "
                 f"{options.think_ms:.0f} ms, {options.tokens} tokens {options.interval_ms:.0f} ms apart; "
                 f"path: {options.path})")
    return results.emit(options.json)


def measure(options, results, pool, model_port, count, proxy, loop):
    single = {"direct": [], "proxied": []}
    for mode in ("direct", "proxied"):  # warm-up: connections, config cache, the stream's first frames
        pool.submit(client_single, mode, model_port).result()
    for _ in range(options.runs):
        for mode in single:
            single[mode].append(pool.submit(client_single, mode, model_port).result())
    direct = benchlib.median([first for first, _ in single["direct"]])
    proxied = benchlib.median([first for first, _ in single["proxied"]])
    results.add("first token, one call: SSE delta via proxy vs direct (median)", proxied, "s", direct,
                target=round(1.1 + 0.005 / direct, 2))
    results.note(f"(difference {(proxied - direct) * 1000:.1f} ms; aim <= 1.1x + 5 ms = "
                 f"{(1.1 * direct + 0.005) * 1000:.1f} ms)")
    results.add("whole answer, one call: via proxy vs direct (median)",
                benchlib.median([whole for _, whole in single["proxied"]]), "s",
                benchlib.median([whole for _, whole in single["direct"]]))
    bursts = {"direct": [], "proxied": []}
    idle = thread_count()
    peaks, forwarded = [], []
    for _ in range(options.rounds):
        for mode in bursts:
            proxy.peak = loop.peak_exchanges = 0
            with ThreadPeak() as peak:
                bursts[mode] += pool.submit(client_burst, mode, model_port, count).result()
            if mode == "proxied":
                peaks.append(peak.peak)
                forwarded.append(max(proxy.peak, loop.peak_exchanges))
    for label, index in (("first token", 0), ("whole answer", 1)):
        for name, fraction in (("p50", 0.5), ("p95", 0.95)):
            results.add(f"{label} {name}, {count} concurrent: via proxy vs direct",
                        benchlib.percentile([pair[index] for pair in bursts["proxied"]], fraction), "s",
                        benchlib.percentile([pair[index] for pair in bursts["direct"]], fraction))
    results.add(f"controller threads, {count} concurrent calls: peak vs idle", max(peaks), "threads", idle)
    results.add(f"calls forwarded at once of {count}", max(forwarded), "calls", count)


if __name__ == "__main__":
    sys.exit(main())
