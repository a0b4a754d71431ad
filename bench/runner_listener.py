"""The runner listener's transports side by side: the median time of one runner request (a new
connection each, as the runner's ControllerClient makes them) to the real runner app of a real root,
over the runner socket, over plain TCP (Waitress on 127.0.0.1, what `serve --runner-listen` served
before it spoke TLS), and over TLS (`serve --runner-listen` now: the suzumio_tls relay in front of the
app's private socket, the runner verifying the root's CA). Two requests: a signal recorded in the store
(a write, what most runner calls are) and a refused one (a wrong token: the transport's cost alone).
Over TLS the runner's client resumes the TLS session of its previous request; a client made anew for
each request (a full handshake every time) shows what that saves. Target: the recorded signal over
TLS <= 3x plain TCP (a handshake round trip and its cryptography on a request of about a millisecond).
Usage: .venv/bin/python bench/runner_listener.py [--runs 300] [--json]"""
import argparse
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
                    assert good.tls_sessions.resumed, "the runner's client did not resume its TLS session"
                    medians["fresh"] = benchlib.median(benchlib.timed(
                        lambda url=url, ca=ca, who=good.identity: ControllerClient(url, who, ca=ca).post(
                            "/runner/signals", {"kind": "bench.x"}), options.runs, warmup=20))
            for request in ("recorded", "refused"):
                results.add(f"{request} signal over the runner socket", medians["socket", request], "s")
                results.add(f"{request} signal over plain TCP (the old --runner-listen)",
                            medians["plain TCP", request], "s", medians["socket", request])
                results.add(f"{request} signal over TLS vs plain TCP", medians["TLS", request], "s",
                            medians["plain TCP", request], target=3 if request == "recorded" else None)
            results.add("recorded signal over TLS, full handshake each vs resumed", medians["fresh"], "s",
                        medians["TLS", "recorded"])
        finally:
            for _name, _url, _ca, server in listeners:
                server.close()
            toolpacks.close()
            root.close()
    return results.emit(options.json)


if __name__ == "__main__":
    raise SystemExit(main())
