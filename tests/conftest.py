"""Shared fixtures: an isolated runtime root, the served app with its `demo` project, a fake model server,
a small disk of its own (small_disk, fill), free_port, and wait_until for other threads and processes."""
import os
import random
import socket
import subprocess
import time
from pathlib import Path

import pytest


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition"):
    """Poll predicate until it returns a truthy value; fail the test after timeout seconds. `message`
    may be a function, called at the failure (to say what the last poll saw)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message() if callable(message) else message}")
        time.sleep(interval)


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty Suzumio runtime root; SUZUMIO_ROOT points at it."""
    path = tmp_path / "root"
    monkeypatch.setenv("SUZUMIO_ROOT", str(path))
    return path


@pytest.fixture
def model():
    """A fake Chat Completions server (tests/fake_model.py) on 127.0.0.1, closed after the test."""
    from fake_model import FakeModel
    fake = FakeModel()
    yield fake
    fake.close()


def require(kind):
    """Skip when an optional real part is absent, unless SUZUMIO_REQUIRE_<KIND> makes it a failure."""
    flag = f"SUZUMIO_REQUIRE_{kind.upper()}"
    def fail_or_skip(reason):
        if os.environ.get(flag):
            pytest.fail(f"{reason} ({flag} is set)")
        pytest.skip(reason)
    return fail_or_skip


SMALL_DISK_SIZE = "8m"


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of SMALL_DISK_SIZE mounted for the test (so it needs root; SUZUMIO_REQUIRE_ROOT turns the
    skip into a failure): a disk the test can fill without filling the machine's."""
    if os.geteuid() != 0:
        require("root")("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_SIZE}", "suzumio-test-disk", str(mount_point)],
                   check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path):
    """Write zeros into `path` until the filesystem refuses (what `dd` into an artifacts folder does).
    Unbuffered, so that a short last write leaves nothing behind for close() to fail on again."""
    with open(path, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 16))
        except OSError as error:
            assert error.errno == 28  # ENOSPC
    return path


def free_port():
    """A port that was free a moment ago, for a child process that must be told its port up front."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RESTART_PORTS_FROM = 20000  # registered ports below the ephemeral range that no test server binds


def restart_port():
    """A free port below the kernel's ephemeral range, for a serve that is killed and started again on
    the same port: inside the range any process's outgoing connection may take the port as its own
    local port between the kill and the restart, and the restart then fails with EADDRINUSE."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.sample(range(RESTART_PORTS_FROM, low), min(200, low - RESTART_PORTS_FROM)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {RESTART_PORTS_FROM} and {low}")


@pytest.fixture
def service_options():
    """Keyword arguments of api_fixtures.serving for `service`; a test file overrides this fixture."""
    return {}


def started_demo(service, tmp_path):
    """Initialize and start the default `demo` project in `service`; returns its store."""
    from api_fixtures import init_project, project_yaml
    store = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
    store.start()
    return store


@pytest.fixture
def demo_project():
    """How `service` creates its project `demo`: (service, tmp_path) -> store; a test file overrides it."""
    return started_demo


@pytest.fixture
def service(tmp_path, service_options, demo_project):
    """The real app on Waitress at port 0 over a fresh root, holding the started project `demo`."""
    from api_fixtures import serving
    with serving(tmp_path / "root", **service_options) as served:
        demo_project(served, tmp_path)
        yield served


@pytest.fixture
def demo(service):
    """The `demo` project's store in `service`."""
    return service.store("demo")
