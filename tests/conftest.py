"""Shared fixtures: an isolated runtime root, and wait_until for other threads and processes."""
import os
import time

import pytest


def wait_until(predicate, timeout=10.0, interval=0.02, message="condition"):
    """Poll predicate until it returns a truthy value; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty Suzumio runtime root; SUZUMIO_ROOT points at it."""
    path = tmp_path / "root"
    monkeypatch.setenv("SUZUMIO_ROOT", str(path))
    return path


def require(kind):
    """Skip when an optional real part is absent, unless SUZUMIO_REQUIRE_<KIND> makes it a failure."""
    flag = f"SUZUMIO_REQUIRE_{kind.upper()}"
    def fail_or_skip(reason):
        if os.environ.get(flag):
            pytest.fail(f"{reason} ({flag} is set)")
        pytest.skip(reason)
    return fail_or_skip
