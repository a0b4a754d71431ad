"""Durability of the store's staged files (docs/operations.md, "What survives what"): a process killed
right after the COMMIT that names a staged file, or while its transaction is still open, leaves a store
whose next open places the committed file or removes the uncommitted one. The killed process is a real
child interpreter that SIGKILLs itself in the window; the store is a real SQLite file."""
import contextlib
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from api_fixtures import serving
from store_fixtures import init_demo

import suzumio_store as st

pytestmark = pytest.mark.timeout(120)

CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    import suzumio_coordination, suzumio_store
    window = sys.argv[1]
    store = suzumio_store.Root({root!r}).open_project("demo")
    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    if window == "after-commit":
        suzumio_store.ProjectStore._place_staged = die  # COMMIT done, nothing renamed yet
    else:
        write_file = suzumio_store._Tx.write_file
        def staged_then_die(self, path, text):
            write_file(self, path, text)
            die()  # the temp file is written, the transaction still open
        suzumio_store._Tx.write_file = staged_then_die
    suzumio_coordination.submit_report(store, "pm", None, "# Card\\n\\nDone.\\n")
""")


def killed_in_window(root_path, window):
    repo = str(Path(__file__).resolve().parent.parent)
    result = subprocess.run([sys.executable, "-c", CHILD.format(repo=repo, root=str(root_path)), window],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == -signal.SIGKILL, result.stderr


def staged_leftovers(project_dir):
    return [path.name for path in project_dir.iterdir() if st.STAGED_NAME.match(path.name)]


def test_report_committed_before_a_kill_is_placed_by_the_next_open_and_served(tmp_path):
    _root, store = init_demo(tmp_path / "root")
    store.close()
    killed_in_window(tmp_path / "root", "after-commit")
    project_dir = tmp_path / "root" / "demo"
    assert not (project_dir / "final-report.md").exists()
    assert len(staged_leftovers(project_dir)) == 1  # committed, never renamed
    with serving(tmp_path / "root") as service:  # opening the project recovers it
        answer = service.get("/api/projects/demo/report")
        assert (answer.status_code, answer.text) == (200, "# Card\n\nDone.\n")
    reopened = st.Root(tmp_path / "root").open_project("demo")
    assert reopened.project()["status"] == "submitted"
    assert staged_leftovers(project_dir) == []
    assert reopened._query_one("PRAGMA integrity_check")[0] == "ok"
    assert reopened._query("SELECT * FROM _staged_files") == []


def test_report_of_a_transaction_killed_before_its_commit_leaves_nothing(tmp_path):
    _root, store = init_demo(tmp_path / "root")
    store.close()
    killed_in_window(tmp_path / "root", "before-commit")
    project_dir = tmp_path / "root" / "demo"
    assert len(staged_leftovers(project_dir)) == 1  # written, its transaction never committed
    reopened = st.Root(tmp_path / "root").open_project("demo")
    assert staged_leftovers(project_dir) == []
    assert not (project_dir / "final-report.md").exists()
    assert reopened.project()["status"] == "running"
    assert reopened._query_one("PRAGMA integrity_check")[0] == "ok"


def test_every_connection_syncs_each_commit(tmp_path):
    _root, store = init_demo(tmp_path / "root")
    # the writer, which commits, inside a write transaction
    with store.write() as tx:
        assert tx.one("PRAGMA synchronous")[0] == 2  # FULL
        assert tx.one("PRAGMA journal_mode")[0] == "wal"
    # and every pooled reader, borrowed at once so that each is a connection of its own
    readers = []
    with contextlib.ExitStack() as stack:
        for _ in range(3):
            readers.append(stack.enter_context(store._reading()))
        assert len({id(conn) for conn in readers}) == 3
        assert [conn.execute("PRAGMA synchronous").fetchone()[0] for conn in readers] == [2, 2, 2]
