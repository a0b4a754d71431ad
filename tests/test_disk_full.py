"""A full disk is an error, not a crash (docs/operations.md, "What survives what"): the runtime root on
a small tmpfs of its own (mounted by the test, so it needs root; SUZUMIO_REQUIRE_ROOT turns the skip into
a failure) is filled as an agent would fill its artifacts folder. The real user app answers
507 {"error": "Insufficient storage: …"}, /health names the disk, serve stays up, every accepted message
is kept, SQLite's integrity check stays ok, and writes succeed again once space returns."""
import os
import subprocess

import pytest
from api_fixtures import serving
from conftest import require
from store_fixtures import init_demo

pytestmark = pytest.mark.timeout(180)

TMPFS_SIZE = "8m"
BODY = "x" * 4000


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        require("root")("mounting a tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "suzumio-test-disk", str(mount_point)],
                   check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path):
    """Write zeros into `path` until the filesystem refuses (what `dd` into an artifacts folder does)."""
    with open(path, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 16))
                handle.flush()
        except OSError as error:
            assert error.errno == 28  # ENOSPC
    return path


def test_a_full_disk_answers_507_keeps_serve_up_and_loses_no_accepted_message(small_disk):
    root_path = small_disk / "root"
    _root, store = init_demo(root_path)
    store.close()
    with serving(root_path) as service:
        accepted = []

        def send(index):
            answer = service.post("/api/projects/demo/messages", {"recipient": "worker", "body": f"{index} {BODY}"})
            if answer.status_code == 200:
                accepted.append(answer.json()["id"])
            return answer

        for index in range(5):
            assert send(index).status_code == 200
        filler = fill(root_path / "demo" / "artifacts" / "worker" / "filler.bin")
        refused = None
        for index in range(5, 400):  # the WAL absorbs a few before SQLite needs a new page
            answer = send(index)
            assert answer.status_code in (200, 507), answer.text
            if answer.status_code == 507:
                refused = answer
                break
        assert refused is not None, "no write was refused on a full disk"
        assert refused.json()["error"].startswith("Insufficient storage: ")
        health = service.get("/health")
        assert health.status_code == 503 and health.json()["components"]["disk"].startswith("full")
        assert service.get("/api/projects/demo").status_code == 200  # reads go on
        filler.unlink()  # space returns
        assert service.get("/health").status_code == 200
        assert send(1000).status_code == 200
        check = service.store("demo")
        assert check._query_one("PRAGMA integrity_check")[0] == "ok"
        kept = {row["id"] for row in check._query("SELECT id FROM messages")}
        assert set(accepted) <= kept and len(accepted) >= 6
