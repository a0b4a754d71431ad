"""Files through the controller (suzumio_files, the /runner/files/* routes): what an activation may read,
and changesets applied only inside its own agent's artifacts folder, all or nothing: no `..`, no absolute
path, no symbolic link leading out, the artifact quota enforced. The runner's side (suzumio_runner_files)
against the same routes."""
import base64
import os

import pytest
from api_fixtures import init_project, project_yaml, running_activation, serving
from repository_fixtures import make_fixture_repository

import suzumio_coordination as coordination
import suzumio_repository as repository
import suzumio_runner_files
from suzumio_config import ProjectConfig
from suzumio_runner_loop import ControllerClient, ControllerError


def b64(text):
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def served(tmp_path):
    with serving(tmp_path / "root") as service:
        text = project_yaml("demo", service.runner_url).replace("  kind: local\n",
                                                               "  kind: local\n  artifactQuota: 1KiB\n")
        demo = init_project(service.root, tmp_path / "demo", text)
        demo.start()
        activation = running_activation(demo, "worker")
        identity = {"project": "demo", "agentId": "worker", "activationId": activation["id"],
                    "token": service.token("demo", "worker")}
        yield service, demo, identity


def changeset(service, identity, changes):
    return service.post("/runner/files/changeset", dict(identity, changes=changes))


def test_a_changeset_writes_links_and_deletes_inside_the_agents_own_folder(served):
    service, demo, identity = served
    folder = demo.artifacts_dir("worker")
    (folder / "old.md").write_text("old")
    answer = changeset(service, identity, [
        {"path": "notes/a.md", "data": b64("hello"), "mode": 0o644},
        {"path": "run.sh", "data": b64("echo hi"), "mode": 0o755},
        {"path": "notes/latest", "link": "a.md"},
        {"path": "old.md", "delete": True}])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "applied", "written": 3, "deleted": 1, "usedBytes": 12}
    assert (folder / "notes" / "a.md").read_text() == "hello"
    assert os.access(folder / "run.sh", os.X_OK)
    assert os.readlink(folder / "notes" / "latest") == "a.md"
    assert not (folder / "old.md").exists()


@pytest.mark.parametrize(("change", "error"), [
    ({"path": "../pm/x.md", "data": b64("x")}, "changes.1.path must not contain empty, '.' or '..' parts: ../pm/x.md"),
    ({"path": "/etc/passwd", "data": b64("x")},
     "changes.1.path must be relative to the agent's artifacts folder: /etc/passwd"),
    ({"path": "a//b", "data": b64("x")}, "changes.1.path must not contain empty, '.' or '..' parts: a//b"),
    ({"path": "out", "link": "../pm"}, "changes.1: symbolic link out -> ../pm leads out of the artifacts folder"),
    ({"path": "deep/out", "link": "../../x"},
     "changes.1: symbolic link deep/out -> ../../x leads out of the artifacts folder"),
    ({"path": "abs", "link": "/etc"}, "changes.1: symbolic link abs must have a relative target"),
    ({"path": "x.md", "data": "not base64!"}, "changes.1.data must be base64"),
    ({"path": "x.md"}, "changes.1 needs data (base64), link or delete: true"),
])
def test_a_changeset_with_one_bad_entry_is_refused_whole(served, change, error):
    service, demo, identity = served
    answer = changeset(service, identity, [{"path": "fine.md", "data": b64("fine")}, change])
    assert (answer.status_code, answer.json()) == (400, {"error": error})
    assert list(demo.artifacts_dir("worker").iterdir()) == []


def test_a_changeset_through_a_symbolic_link_already_in_the_folder_is_refused(served, tmp_path):
    service, demo, identity = served
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, demo.artifacts_dir("worker") / "escape")
    answer = changeset(service, identity, [{"path": "escape/x.md", "data": b64("x")}])
    assert answer.status_code == 400
    assert answer.json() == {"error": "escape/x.md leads out of the artifacts folder through the symbolic link escape"}
    assert list(outside.iterdir()) == []


def test_a_changeset_past_the_artifact_quota_is_refused_and_writes_nothing(served):
    service, demo, identity = served
    assert changeset(service, identity, [{"path": "a.md", "data": b64("a" * 600)}]).status_code == 200
    answer = changeset(service, identity, [{"path": "b.md", "data": b64("b" * 600)}])
    assert (answer.status_code, answer.json()) == (409, {"error": "artifact quota exceeded (1.2 KiB of 1.0 KiB)"})
    assert not (demo.artifacts_dir("worker") / "b.md").exists()
    # Replacing a file counts its new size, not both.
    assert changeset(service, identity, [{"path": "a.md", "data": b64("a" * 900)}]).status_code == 200


def test_files_routes_need_the_agent_token_and_a_running_activation(served):
    service, demo, identity = served
    wrong = dict(identity, token="nope")
    assert service.post("/runner/files/list", wrong).json() == {"error": "Invalid agent token"}
    tokenless = {key: value for key, value in identity.items() if key != "token"}
    answer = service.post("/runner/files/read", dict(tokenless, path="/artifacts/pm/x"))
    assert (answer.status_code, answer.json()) == (400, {"error": "token is required"})
    assert changeset(service, identity, "nothing").json() == {"error": "changes must be a non-empty array"}
    coordination.fail_activation(demo, identity["activationId"], "ended")
    answer = changeset(service, identity, [{"path": "late.md", "data": b64("late")}])
    assert (answer.status_code, answer.json()) == (409, {"error": f"Activation {identity['activationId']} is failed; "
                                                                  "its files are no longer exchanged"})


def test_reading_refuses_paths_outside_the_readable_folders_and_links_leading_out(served, tmp_path):
    service, demo, identity = served
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    os.symlink(secret, demo.artifacts_dir("pm") / "peek")
    answer = service.post("/runner/files/read", dict(identity, path="/artifacts/pm/peek"))
    assert (answer.status_code, answer.json()) == (400, {"error": "/artifacts/pm/peek leads out of /artifacts/pm"})
    answer = service.post("/runner/files/read", dict(identity, path="/artifacts/pm/../../etc/passwd"))
    assert (answer.status_code, answer.json()) == (400, {"error": "path must be an absolute, normalized path"})
    answer = service.post("/runner/files/read", dict(identity, path="/etc/passwd"))
    assert answer.status_code == 404
    listed = service.post("/runner/files/list", identity).json()
    assert listed == {"files": [], "own": "/artifacts/worker"}  # the link is not listed


def test_the_runner_fetches_sends_its_changes_and_reads_the_current_version_of_another_agents_file(served, tmp_path):
    service, demo, identity = served
    (demo.artifacts_dir("pm") / "plan.md").write_text("v1")
    (demo.artifacts_dir("worker") / "keep.md").write_text("kept")
    client = ControllerClient(service.runner_url, identity)
    task = tmp_path / "task" / "artifacts"
    files = suzumio_runner_files.FileSync(client, str(task), "worker", ControllerError)
    files.pull()
    assert (task / "pm" / "plan.md").read_text() == "v1"
    assert (task / "worker" / "keep.md").read_text() == "kept"
    assert files.push() == 0
    (task / "worker" / "out.md").write_text("result")
    (task / "worker" / "keep.md").unlink()
    assert files.push() == 2
    assert (demo.artifacts_dir("worker") / "out.md").read_text() == "result"
    assert not (demo.artifacts_dir("worker") / "keep.md").exists()
    (demo.artifacts_dir("pm") / "plan.md").write_text("v2")
    files.refresh(str(task / "pm" / "plan.md"))
    assert (task / "pm" / "plan.md").read_text() == "v2"
    # A refused changeset is sent again after the next change.
    (task / "worker" / "big.md").write_text("x" * 2000)
    with pytest.raises(ControllerError, match="artifact quota exceeded"):
        files.push()
    (task / "worker" / "big.md").write_text("small")
    assert files.push() == 1
    assert (demo.artifacts_dir("worker") / "big.md").read_text() == "small"


# ---------------------------------------------------------------- a working copy's /workspace

@pytest.fixture
def coding(tmp_path):
    """`worker` has a working copy of a fixture repository (made as an activation's start makes it); pm
    has none."""
    source = make_fixture_repository(tmp_path, bare=True)
    with serving(tmp_path / "root") as service:
        text = project_yaml("code", service.runner_url,
                            extra=f"repository: {{source: {source}, agents: [worker]}}\n")
        store = init_project(service.root, tmp_path / "code", text)
        store.start()
        config = ProjectConfig.from_data(store.config())
        activation = running_activation(store, "worker")
        repository.start_working_copy(store, config, activation)
        identity = {"project": "code", "agentId": "worker", "activationId": activation["id"],
                    "token": service.token("code", "worker")}
        yield service, store, identity


def workspace_changeset(service, identity, changes):
    return service.post("/runner/files/workspace-changeset", dict(identity, changes=changes))


def test_a_workspace_changeset_changes_the_agents_own_work_tree_and_nothing_git_holds(coding):
    service, store, identity = coding
    tree = store.workspace("worker")
    copy = repository.WorkingCopy(store, "worker")
    head = copy.head()
    answer = workspace_changeset(service, identity, [{"path": "a.txt", "data": b64("a by worker\n")},
                                                     {"path": "src/new.py", "data": b64("x = 1\n")},
                                                     {"path": "b.txt", "delete": True}])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "applied", "written": 2, "deleted": 1}
    assert (tree / "a.txt").read_text() == "a by worker\n" and not (tree / "b.txt").exists()
    assert copy.head() == head  # written, not committed: the controller commits at repo.* and the end
    assert copy.commit("Activation of worker") != head
    assert repository.out("show", "agents/worker:src/new.py", git_dir=copy.repository) == "x = 1"


@pytest.mark.parametrize(("change", "error"), [
    ({"path": "../../pm/workspace/x", "data": b64("x")},
     "changes.1.path must not contain empty, '.' or '..' parts: ../../pm/workspace/x"),
    ({"path": "/workspace/x", "data": b64("x")},
     "changes.1.path must be relative to the agent's workspace: /workspace/x"),
    ({"path": ".git/config", "data": b64("x")},
     "changes.1.path must not contain a .git part: .git/config (the working copy's git folder is the controller's)"),
    ({"path": "sub/.git/hooks/post-checkout", "data": b64("x")},
     "changes.1.path must not contain a .git part: sub/.git/hooks/post-checkout (the working copy's git folder "
     "is the controller's)"),
    ({"path": "gitdir", "link": "../workcopy.git"},
     "changes.1: symbolic link gitdir -> ../workcopy.git leads out of the workspace"),
])
def test_a_workspace_changeset_leading_out_of_the_work_tree_or_into_git_is_refused_whole(coding, change, error):
    service, store, identity = coding
    tree = store.workspace("worker")
    before = sorted(p.name for p in tree.iterdir())
    answer = workspace_changeset(service, identity, [{"path": "fine.txt", "data": b64("fine")}, change])
    assert (answer.status_code, answer.json()) == (400, {"error": error})
    assert sorted(p.name for p in tree.iterdir()) == before
    assert not (store.workspace("pm") / "x").exists()


def test_only_an_agent_with_a_working_copy_sends_workspace_changesets_and_only_its_own(coding, tmp_path):
    service, store, identity = coding
    pm_activation = running_activation(store, "pm")
    pm = {"project": "code", "agentId": "pm", "activationId": pm_activation["id"], "token": service.token("code", "pm")}
    answer = workspace_changeset(service, pm, [{"path": "x.txt", "data": b64("x")}])
    refusal = "pm has no working copy of the repository (repository.agents): its /workspace is its task's own"
    assert (answer.status_code, answer.json()) == (403, {"error": refusal})
    # Another agent's work tree is named by no path: only by its identity, which needs its token.
    answer = workspace_changeset(service, dict(identity, agentId="pm"), [{"path": "x.txt", "data": b64("x")}])
    assert (answer.status_code, answer.json()) == (403, {"error": "Invalid agent token"})
    answer = workspace_changeset(service, dict(identity, activationId=pm_activation["id"]),
                                 [{"path": "x.txt", "data": b64("x")}])
    assert answer.status_code == 403 and set(answer.json()) == {"error"}
    # A link an agent left in its work tree does not lead a later change out of it.
    os.symlink(tmp_path, store.workspace("worker") / "escape")
    answer = workspace_changeset(service, identity, [{"path": "escape/x.txt", "data": b64("x")}])
    assert (answer.status_code, answer.json()) == (
        400, {"error": "escape/x.txt leads out of the workspace through the symbolic link escape"})
    assert not (tmp_path / "x.txt").exists()
    assert not list(store.workspace("pm").iterdir())


def test_a_working_copy_is_listed_and_read_as_workspace_without_any_git_folder(coding):
    service, store, identity = coding
    (store.workspace("worker") / ".git").mkdir()
    (store.workspace("worker") / ".git" / "config").write_text("[core]\n")
    listed = service.post("/runner/files/list", identity).json()
    assert listed["workspace"] == "/workspace"
    paths = [entry["path"] for entry in listed["files"]]
    assert sorted(p for p in paths if p.startswith("/workspace/")) == [
        "/workspace/README.md", "/workspace/a.txt", "/workspace/b.txt", "/workspace/shared.txt"]
    assert not [p for p in paths if ".git" in p]
    answer = service.post("/runner/files/read", dict(identity, path="/workspace/.git/config"))
    assert answer.status_code == 404 and set(answer.json()) == {"error"}
    answer = service.post("/runner/files/read", dict(identity, path="/workspace/a.txt"))
    assert base64.b64decode(answer.json()["data"]) == b"a\n"
    pm_activation = running_activation(store, "pm")
    pm = {"project": "code", "agentId": "pm", "activationId": pm_activation["id"], "token": service.token("code", "pm")}
    listed = service.post("/runner/files/list", pm).json()
    assert "workspace" not in listed and not [e for e in listed["files"] if e["path"].startswith("/workspace")]
    assert service.post("/runner/files/read", dict(pm, path="/workspace/a.txt")).status_code == 404


def test_the_runner_mirrors_its_working_copy_and_sends_it_back_before_repo_calls(coding, tmp_path):
    service, store, identity = coding
    tree = store.workspace("worker")
    client = ControllerClient(service.runner_url, identity)
    task = tmp_path / "task"
    (task / "workspace").mkdir(parents=True)
    (task / "workspace" / "left-over.txt").write_text("from a task still stopping")
    files = suzumio_runner_files.FileSync(client, str(task / "artifacts"), "worker", ControllerError,
                                          str(task / "workspace"))
    files.pull()
    assert sorted(p.name for p in (task / "workspace").iterdir()) == ["README.md", "a.txt", "b.txt", "shared.txt"]
    assert files.push() == 0
    # An edit is sent after a writing tool; a .git the agent makes stays in the task.
    (task / "workspace" / "a.txt").write_text("a by worker\n")
    (task / "workspace" / ".git").mkdir()
    (task / "workspace" / ".git" / "HEAD").write_text("ref: refs/heads/x\n")
    files.after("file.write")
    assert (tree / "a.txt").read_text() == "a by worker\n" and not (tree / ".git").exists()
    # Before a repo.* call the current files are on the controller, whatever the last tool was.
    (task / "workspace" / "b.txt").unlink()
    files.after("file.read")
    assert (tree / "b.txt").exists()
    files.before("repo.status", {})
    assert not (tree / "b.txt").exists()
    # repo.sync changes the work tree on the controller: the runner fetches it, and sends none of it back.
    (tree / "shared.txt").write_text("<<<<<<< merged\n")
    (tree / "synced.txt").write_text("from main\n")
    (tree / "a.txt").unlink()
    files.after("repo.sync")
    assert (task / "workspace" / "shared.txt").read_text() == "<<<<<<< merged\n"
    assert (task / "workspace" / "synced.txt").read_text() == "from main\n"
    assert not (task / "workspace" / "a.txt").exists()
    assert files.push() == 0
