"""SSE fan-out: N stream clients (`GET /api/projects/<p>/stream`, woken by each commit of the project) receiving
M events appended through the store: per-event delivery latency (append -> frame read by the client,
median and p99 over every client and event) at a steady append rate, and the delivery rate of a burst of
M events (events delivered to all clients per second), each against the same run with a single client.
The clients are read by one thread of a separate process, so they never hold the server's GIL.
Usage: .venv/bin/python bench/sse_fanout.py [--clients 30] [--events 150] [--burst 2000] [--rounds 15] [--json]"""
import argparse
import concurrent.futures
import multiprocessing
import os
import re
import resource
import selectors
import socket
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from api_fixtures import serving

EVENT_TYPE = "bench.sse"


# A bench event's frame, `event: bench.sse` then its data line, in which `data_json` holds `{"seq": N}`
# JSON-encoded once more. Found by one regex over each chunk, so that the measuring clients spend little
# CPU per frame: on two cores the clients' own parsing (two JSON decodes per frame per client) otherwise
# takes the core the server's fan-out needs, and the bench measures itself.
BENCH_FRAME = re.compile(rb'event: ' + re.escape(EVENT_TYPE.encode()) + rb'\n[^\n]*?\\"seq\\": ?(\d+)')


def read_streams(port, clients, first_seq, expected, ready):
    """`clients` stream connections read by one thread over a selector until each has the case's last
    frame: for each, its chunks with their arrival times (time.time()). A client only keeps each chunk and
    looks for that last frame while the case runs; arrivals_of parses the frames after it ends, so the
    measuring process spends little CPU per frame while the server works (a thread per client, each
    parsing its frames as they came, took the core the server's fan-out needed: the bench measured
    itself)."""
    last_frame = re.compile(rb'\\"seq\\": ?%d}' % (first_seq + expected - 1))
    seam = 32  # more than the last frame's marker
    selector = selectors.DefaultSelector()
    chunks = {}
    for _ in range(clients):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(f"GET /api/projects/sse/stream?limit=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        sock.setblocking(False)
        chunks[sock] = []
        selector.register(sock, selectors.EVENT_READ)
    waiting_first, open_streams = set(chunks), len(chunks)
    deadline = time.monotonic() + 120
    try:
        while open_streams:
            if time.monotonic() > deadline:
                raise SystemExit("stream clients timed out")
            for key, _ in selector.select(timeout=1):
                sock = key.fileobj
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise SystemExit("stream closed early")
                received = chunks[sock]
                received.append((time.time(), chunk))
                if sock in waiting_first:
                    waiting_first.discard(sock)
                    ready.release()
                # The last frame may be split across two chunks: look at the seam too.
                tail = received[-2][1][-seam:] if len(received) > 1 else b""
                if last_frame.search(tail + chunk):
                    selector.unregister(sock)
                    open_streams -= 1
    finally:
        selector.close()
        for sock in chunks:
            sock.close()
    return list(chunks.values())


def arrivals_of(received, first_seq, expected):
    """{seq: arrival time} of one client's chunks: a frame arrives with the chunk that completes it."""
    arrivals, buffer = {}, b""
    for moment, chunk in received:
        buffer += chunk
        end = buffer.rfind(b"\n\n")  # whole frames only; the rest waits for the next chunk
        cut = 0 if end < 0 else end + 2
        for match in BENCH_FRAME.finditer(buffer, 0, cut):
            seq = int(match.group(1))
            if seq >= first_seq:
                arrivals[seq] = moment
        buffer = buffer[cut:]
    if len(arrivals) != expected:
        raise SystemExit(f"a client received {len(arrivals)} of {expected} events")
    return arrivals


def cpu_seconds(who=resource.RUSAGE_SELF):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def client_process(port, clients, first_seq, expected, ready):
    """The clients' arrivals (by sequence number, the replayed event of an earlier case ignored) and the
    CPU seconds this process spent reading them."""
    began = cpu_seconds()
    received = read_streams(port, clients, first_seq, expected, ready)
    reading = cpu_seconds() - began
    return [arrivals_of(chunks, first_seq, expected) for chunks in received], reading


def run_case(service, store, clients, events, interval, first_seq):
    """Connect `clients`, append `events` events `interval` s apart; (latencies, burst rate, CPU seconds
    of the server process and of the client process, wall seconds)."""
    context = multiprocessing.get_context("spawn")
    ready = context.Manager().Semaphore(0)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        future = pool.submit(client_process, service.port, clients, first_seq, events, ready)
        for _ in range(clients):
            if not ready.acquire(timeout=60):
                raise SystemExit("stream clients never connected")
        appended = {}
        server_began = cpu_seconds()
        for seq in range(first_seq, first_seq + events):
            appended[seq] = time.time()
            store.append_event(EVENT_TYPE, {"seq": seq})
            if interval:
                time.sleep(interval)
        arrivals, client_cpu = future.result(timeout=120)
        server_cpu = cpu_seconds() - server_began
    latencies = [client[seq] - appended[seq] for client in arrivals for seq in appended]
    last = max(max(client.values()) for client in arrivals)
    wall = last - min(appended.values())
    return latencies, clients * events / wall, (server_cpu, client_cpu, wall)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--events", type=int, default=150, help="events of the steady phase")
    parser.add_argument("--rate", type=float, default=50.0, help="appends per second in the steady phase")
    parser.add_argument("--burst", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15, help="bursts of each client count, alternating")
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    options = parser.parse_args(argv)
    results = benchlib.Results("sse_fanout")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        with serving(scratch / "root", threads=max(32, options.clients + 16), api_token=None) as service:
            store = benchlib.init_project(service.root, scratch / "src", benchlib.project_text("sse", ["worker"]),
                                          start=False)
            seq = 0
            steady = {}
            for clients in (1, options.clients):
                latencies, _, _ = run_case(service, store, clients, options.events, 1 / options.rate, seq)
                seq += options.events
                steady[clients] = (benchlib.median(latencies), benchlib.percentile(latencies, 0.99))
            # The bursts alternate 1 and N clients, `--rounds` each: one burst is one noisy sample (it swings
            # by 20% from one to the next).
            bursts = {1: [], options.clients: []}
            for _ in range(options.rounds):
                for clients in bursts:
                    _, rate, cpu = run_case(service, store, clients, options.burst, 0, seq)
                    seq += options.burst
                    bursts[clients].append((rate / clients, cpu))
            one, many = steady[1], steady[options.clients]
            results.add(f"delivery latency median, {options.clients} clients", many[0], "s", one[0])
            results.add(f"delivery latency p99, {options.clients} clients", many[1], "s", one[1])
            rates = {clients: [rate for rate, _ in runs] for clients, runs in bursts.items()}
            # Each N-client burst against the 1-client burst just before it: the pair shares the machine's
            # state (the database grows, other load comes and goes), which the medians of all runs do not.
            paired = [many / one for one, many in zip(rates[1], rates[options.clients], strict=True)]
            results.add(f"burst of {options.burst}, per-client rate, {options.clients} clients vs 1 "
                        f"(median of {options.rounds} pairs)", benchlib.median(paired), "x", 1.0, target=0.9,
                        higher_is_better=True)
            results.add(f"burst of {options.burst}: events/s per client, {options.clients} clients "
                        f"(median of {options.rounds})", benchlib.median(rates[options.clients]), "/s",
                        benchlib.median(rates[1]))
            results.note(f"(paired ratios from {min(paired):.2f}x to {max(paired):.2f}x)")
            # Where the burst's time goes: CPU per delivered frame (one event to one client) in the server
            # process (appends included) and in the clients' process, and how busy the machine's cores were
            # (medians over the rounds).
            cores = os.cpu_count() or 1
            for label, count in (("1 client", 1), (f"{options.clients} clients", options.clients)):
                frames = options.burst * count
                runs = [cpu for _, cpu in bursts[count]]
                results.add(f"burst, {label}: server CPU per delivered frame",
                            benchlib.median([server / frames * 1e6 for server, _, _ in runs]), "us")
                results.add(f"burst, {label}: client CPU per delivered frame",
                            benchlib.median([client / frames * 1e6 for _, client, _ in runs]), "us")
                results.add(f"burst, {label}: cores busy (of {cores})",
                            benchlib.median([(server + client) / wall for server, client, wall in runs]), "x")
            results.note("(baselines: the same figures with 1 client; one hub thread reads, encodes and frames "
                         "each event once and sends the same bytes to every client)")
    return results.emit(options.json)


if __name__ == "__main__":
    sys.exit(main())
