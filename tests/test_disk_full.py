"""A full disk is an error, not a crash (docs/operations.md, "What survives what"): the runtime root on
a small tmpfs of its own (conftest's small_disk: mounted by the test, so it needs root;
SUZUMIO_REQUIRE_ROOT turns the skip into a failure) is filled as an agent would fill its artifacts
folder. The real user app answers 507 {"error": "Insufficient storage: …"}, /health names the disk,
serve stays up, every accepted message is kept, SQLite's integrity check stays ok, and writes succeed
again once space returns."""
import pytest
from api_fixtures import serving
from conftest import fill
from crash_fixtures import busy_runner
from e2e_fixtures import call, running_team
from store_fixtures import init_demo

pytestmark = pytest.mark.timeout(180)

BODY = "x" * 4000


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


def test_an_activation_runs_through_a_full_disk_and_completes_once_space_returns(small_disk, caplog):
    # The agent fills the disk, as `dd` into its folder would, then reports a large result: its tool call
    # cannot be recorded while the disk is full, and the runner asks again until it can. The project's
    # log is emptied into its database first, so that the report needs room the log has no more of.
    filler, go = small_disk / "filler.bin", small_disk / "go"
    command = (f"while [ ! -e {go} ]; do sleep 0.05; done; dd if=/dev/zero of={filler} bs=64k 2>/dev/null; "
               "head -c 100000 /dev/zero | tr '\\0' x; echo; echo filled")
    with running_team(small_disk, "local") as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command=command)], model="worker-1")
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal")], model="worker-1")
        team.send("worker-1", "Fill the disk.")
        team.wait_for(lambda: busy_runner(team.store, "worker-1"), 60, "worker-1 inside its shell call")
        team.store._query_one("PRAGMA wal_checkpoint(TRUNCATE)")
        go.touch()

        def refused_report():
            return any("/runner/tool-calls/finish" in record.getMessage() and "Insufficient storage" in
                       record.getMessage() for record in caplog.records)
        team.wait_for(refused_report, 60, "the report of the call refused for space")
        assert team.service.get("/health").status_code == 503
        [running] = team.activations("worker-1")
        assert running["status"] == "running"
        filler.unlink()  # space returns
        [done] = team.wait_activations("worker-1", 1)
        assert done["status"] == "completed"
        [shell] = [c for c in team.store.list_tool_calls(limit=10) if c["tool"] == "shell.exec"]
        assert shell["status"] == "completed" and "filled" in shell["output"]
        assert team.store._query_one("PRAGMA integrity_check")[0] == "ok"
