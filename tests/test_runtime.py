"""suzumio_runtime: the runtime built in one place, started and closed in order, and one `serve` per
root (the root's serve lock): a second serve on a root refuses, naming the first, and leaves it working."""
import os
import stat

import pytest
from conftest import wait_until
from test_cli import cli, run, serving, sleepy_project

import suzumio_runtime
import suzumio_store
from suzumio_errors import Conflict


def test_the_serve_lock_admits_one_holder_and_names_it(tmp_path):
    first = suzumio_runtime.ServeLock.acquire(tmp_path)
    first.record("http://127.0.0.1:4321")
    with pytest.raises(Conflict) as refused:
        suzumio_runtime.ServeLock.acquire(tmp_path)
    assert str(refused.value) == (f"another suzumio serve (process {os.getpid()}, http://127.0.0.1:4321) holds "
                                  f"the root {tmp_path}; stop it first or use another --root")
    assert suzumio_runtime.serve_holder(tmp_path) == (str(os.getpid()), "http://127.0.0.1:4321")
    first.release()
    first.release()
    assert suzumio_runtime.serve_holder(tmp_path) is None
    again = suzumio_runtime.ServeLock.acquire(tmp_path)
    assert (tmp_path / "serve.lock").read_text() == f"{os.getpid()}\n"
    again.release()


def test_a_runtime_is_built_started_and_closed_once(tmp_path):
    runtime = suzumio_runtime.build_runtime(suzumio_runtime.RuntimeOptions(
        root=tmp_path / "root", listeners=suzumio_runtime.Listeners(threads=16, reconcile=False)))
    try:
        runtime.start()
        assert runtime.address == f"http://127.0.0.1:{runtime.server.port}"
        assert stat.S_ISSOCK(os.stat(runtime.runner_socket).st_mode)
        assert runtime.api_token == suzumio_runtime.read_api_token(tmp_path / "root")
        assert suzumio_runtime.serve_holder(tmp_path / "root") == (str(os.getpid()), runtime.address)
        with pytest.raises(Conflict):  # the same process holds the root too
            suzumio_runtime.build_runtime(suzumio_runtime.RuntimeOptions(
                root=tmp_path / "root", listeners=suzumio_runtime.Listeners(threads=16)))
        assert stat.S_ISSOCK(os.stat(runtime.runner_socket).st_mode)
    finally:
        runtime.close()
    runtime.close()
    assert not os.path.exists(runtime.runner_socket)
    assert suzumio_runtime.serve_holder(tmp_path / "root") is None


def test_a_second_serve_on_a_root_refuses_and_the_first_still_runs_activations(tmp_path):
    root = tmp_path / "R"
    assert run("init", str(sleepy_project(tmp_path, 1234)), "--root", str(root)).code == 0
    store = suzumio_store.Root(root).open_project("demo")
    with serving("--root", str(root), "--port", "0") as first:
        socket_path = first.runner.removeprefix("unix://")
        second = cli("serve", "--root", str(root), "--port", "0", timeout=30)
        assert second.returncode == 1
        errors = [line for line in second.stderr.splitlines() if line.startswith("Error:")]
        assert errors == [f"Error: another suzumio serve (process {first.process.pid}, {first.url}) holds the "
                          f"root {root}; stop it first or use another --root"]
        assert second.stdout == ""
        assert stat.S_ISSOCK(os.stat(socket_path).st_mode), "the first serve's runner socket is gone"
        first.post("/api/projects/demo/start").raise_for_status()
        first.post("/api/projects/demo/messages", {"recipient": "worker-1", "body": "hello"}).raise_for_status()
        done = wait_until(lambda: [a for a in store.list_activations() if a["status"] == "completed"],
                          timeout=30, message="an activation of the first serve to complete")
        assert done[0]["agentId"] == "worker-1"
    assert first.process.returncode == 0
