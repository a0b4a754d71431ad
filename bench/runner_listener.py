"""The runner listener's transports side by side: the median time of one runner request (a new
connection each, as the runner's ControllerClient makes them) to the real runner app of a real root,
over the runner socket, over plain TCP (Waitress on 127.0.0.1, what `serve --runner-listen` served
before it spoke TLS), and over TLS (`serve --runner-listen` now: the suzumio_tls relay in front of the
app's private socket, the runner verifying the root's CA). Two requests: a signal recorded in the store
(a write, what most runner calls are) and a refused one (a wrong token: the transport's cost alone).
A bare TLS handshake with the same listener (connect, handshake, close) is timed too: it is the
cryptography's share, paid once per request because runners open a connection per request. Target:
the relay's own share (TLS request minus the handshake) <= 1.5x the plain TCP request.
Usage: .venv/bin/python bench/runner_listener.py [--runs 300] [--json]"""
import argparse
import socket
import ssl
import tempfile
from pathlib import Path

import benchlib

import suzumio_api
import suzumio_backend
import suzumio_config
import suzumio_coordination as coordination
import suzumio_runner_support
import suzumio_scheduler
import suzumio_store
import suzumio_tls
import suzumio_toolpacks
from suzumio_runner_loop import ControllerClient, ControllerError


def transports(root, app):
    """(name, url, ca, server) for the three listeners of one runner app; the caller closes them."""
    folder = Path(tempfile.mkdtemp(prefix="suzumio-bench-"))
    socket_server = suzumio_api.Server(app, unix_socket=folder / "runner.sock").start()
    tcp_server = suzumio_api.Server(app, "127.0.0.1", 0).start()
    tls = suzumio_tls.generated_tls(root.path, "127.0.0.1")
    tls_server = suzumio_tls.TlsRunnerListener(app, "127.0.0.1", 0, tls).start()
    return [("socket", f"unix://{folder / 'runner.sock'}", None, socket_server),
            ("plain TCP", f"http://127.0.0.1:{tcp_server.port}", None, tcp_server),
            ("TLS", f"https://127.0.0.1:{tls_server.port}", tls.ca_pem, tls_server)]


def handshake(port, ca_pem, contexts={}):
    context = contexts.get(ca_pem) or contexts.setdefault(ca_pem, ssl.create_default_context(cadata=ca_pem))
    with socket.create_connection(("127.0.0.1", port)) as raw:
        context.wrap_socket(raw, server_hostname="127.0.0.1").close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    results = benchlib.Results("runner_listener")
    with tempfile.TemporaryDirectory() as folder:
        root = suzumio_store.Root(Path(folder) / "root")
        store = benchlib.init_project(root, Path(folder) / "demo", benchlib.project_text("demo", ["worker"]))
        activation = coordination.start_activation(store, "worker", "Measure.", [])
        token = store.agent("worker", include_token=True)["token"]
        # The collaborators serve gives the app; the scheduler is never started (no activation runs).
        configs = suzumio_config.ConfigCache()
        toolpacks = suzumio_toolpacks.ToolpackRuntime(configs)
        scheduler = suzumio_scheduler.Scheduler(root, suzumio_backend.Backends(configs=configs), configs,
                                                hooks=toolpacks)
        app = suzumio_runner_support.make_runner_app(root, toolpacks, scheduler)
        listeners = transports(root, app)
        try:
            medians = {}
            for name, url, ca, _server in listeners:
                identity = {"project": "demo", "agentId": "worker", "activationId": activation["id"]}
                good = ControllerClient(url, {**identity, "token": token}, ca=ca)
                bad = ControllerClient(url, {**identity, "token": "wrong"}, ca=ca)

                def refused(client=bad):
                    try:
                        client.post("/runner/signals", {"kind": "bench.x"})
                    except ControllerError as error:
                        assert error.status == 403, error
                    else:
                        raise AssertionError("a wrong token was accepted")

                medians[name, "recorded"] = benchlib.median(benchlib.timed(
                    lambda client=good: client.post("/runner/signals", {"kind": "bench.x"}), options.runs, warmup=20))
                medians[name, "refused"] = benchlib.median(benchlib.timed(refused, options.runs, warmup=20))
                if ca is not None:
                    medians["handshake"] = benchlib.median(benchlib.timed(
                        lambda port=_server.port, ca=ca: handshake(port, ca), options.runs, warmup=20))
            results.add("bare TLS handshake with the listener", medians["handshake"], "s")
            for request in ("recorded", "refused"):
                results.add(f"{request} signal over the runner socket", medians["socket", request], "s")
                results.add(f"{request} signal over plain TCP (the old --runner-listen)",
                            medians["plain TCP", request], "s", medians["socket", request])
                results.add(f"{request} signal over TLS vs plain TCP", medians["TLS", request], "s",
                            medians["plain TCP", request])
                results.add(f"{request} signal over TLS minus the handshake vs plain TCP",
                            medians["TLS", request] - medians["handshake"], "s", medians["plain TCP", request],
                            target=1.5)
        finally:
            for _name, _url, _ca, server in listeners:
                server.close()
            toolpacks.close()
            root.close()
    return results.emit(options.json)


if __name__ == "__main__":
    raise SystemExit(main())
