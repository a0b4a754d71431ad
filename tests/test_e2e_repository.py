"""End to end, a team that writes code (docs/teams-that-write-code.md) through the real controller, the
real runner and the FakeModel, on `local` and `docker-chat`, and on `swarm` with the Swarm lab (the
working copies travelling through the runner listener; `make test-swarm`): three workers with working copies of a
fixture repository land changes through the merge queue; a conflicting change is sent back with its
paths, synced, resolved and landed; a change that breaks the checks never lands; the integration branch
ends holding exactly the landed commits; and no route lets an agent move another's branch."""

import pytest
from conftest import wait_until
from e2e_fixtures import call, kind_params, running_team
from fake_model import answer
from repository_fixtures import CHECK, log_subjects, make_fixture_repository
from test_swarm_backend import lab, our_services, swarm_team  # noqa: F401 - `lab` is the swarm leg's fixture

import suzumio_repository as repository
from suzumio_config import ProjectConfig

pytestmark = pytest.mark.timeout(300)
KINDS = kind_params()

REPO_TOOLS = ["messages.send", "coordination.wait_for_signal", "file.*", "repo.*"]


def team_options(tmp_path):
    source = make_fixture_repository(tmp_path, bare=True)
    agents = {"pm": {"model": "pm", "tools": ["messages.send", "coordination.wait_for_signal"]},
              **{name: {"model": name, "tools": REPO_TOOLS} for name in ("w1", "w2", "w3")}}
    presets = {name: {"provider": "fake", "model": name} for name in ("pm", "w1", "w2", "w3")}
    return {"agents": agents, "presets": presets, "toolpacks": ("core",),
            "extra": {"repository": {"source": str(source), "checks": [CHECK], "agents": ["w*"]}}}


def wait(model, agent):
    model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Done.", notifyPm=False)], model=agent)


def waits(request):
    """pm hears of every landing (a P3 signal) and only waits; so does anyone the test queued nothing for
    (a fork's agents, running again what the fork point left pending)."""
    return answer(tool_calls=[call("coordination.wait_for_signal", reason="Noted.", notifyPm=False)])


def files_of(git_dir, ref):
    """The paths at the top of a branch's tree (repository.rev names commits only)."""
    return repository.out("ls-tree", "--name-only", ref, git_dir=git_dir).split("\n")


def tool_outputs(team, agent):
    return team.tool_messages(agent)


def run_team_of_three(team):
    """The scripted team of three: w1 and w2 land changes to different files, w2's broken change is refused
    by the checks, w3's conflicting change is sent back, synced, resolved and landed. Returns the project's
    repository, its first tip, the first landing's event data and pm's activation after it."""
    model, store = team.model, team.store
    git_dir = repository.ensure_repository(store, ProjectConfig.from_data(store.config()))
    start_tip = repository.integration_tip(git_dir)
    model.responder = waits
    # w3's working copy is made now, from the first tip: it changes shared.txt later, against it.
    model.enqueue(tool_calls=[call("repo.status")], model="w3")
    wait(model, "w3")
    team.send("w3", "Look at the repository.")
    team.wait_activations("w3", 1)
    # w1 changes a.txt and the first shared line, and lands.
    model.enqueue(tool_calls=[call("file.write", path="a.txt", content="a by w1\n"),
                              call("file.write", path="shared.txt",
                                   content="shared line one by w1\nshared line two\n")], model="w1")
    model.enqueue(tool_calls=[call("repo.merge", message="w1: a and shared")], model="w1")
    wait(model, "w1")
    team.send("w1", "Change a.txt and shared.txt, then merge.")
    team.wait_for(lambda: len(team.events("repo.merged")) == 1, message="w1's change landed")
    first = team.events("repo.merged")[0]["data"]
    assert first["agent"] == "w1" and first["branch"] == "main"
    # pm is told of it (P3) and waits: its activation ends after the first landing, before any other.
    [after_first] = team.wait_activations("pm", 1)
    # w2 changes b.txt and lands; then tries a change that breaks the checks.
    model.enqueue(tool_calls=[call("file.write", path="b.txt", content="b by w2\n")], model="w2")
    model.enqueue(tool_calls=[call("repo.merge", message="w2: b")], model="w2")
    model.enqueue(tool_calls=[call("file.write", path="BROKEN", content="oops\n")], model="w2")
    model.enqueue(tool_calls=[call("repo.merge", message="w2: broken")], model="w2")
    wait(model, "w2")
    team.send("w2", "Change b.txt, then merge.")
    team.wait_for(lambda: any(e["data"]["reason"] == "checks" for e in team.events("repo.merge_failed")),
                  message="w2's broken change refused")
    assert [e["data"]["agent"] for e in team.events("repo.merged")] == ["w1", "w2"]
    [broken] = [e["data"] for e in team.events("repo.merge_failed") if e["data"]["agent"] == "w2"]
    assert broken["reason"] == "checks" and CHECK in broken["output"]
    # w2 hears of it with a P1 signal (it waits meanwhile): it removes the file and waits again.
    model.enqueue(tool_calls=[call("repo.status")], model="w2")
    wait(model, "w2")
    # w3 changes the first shared line too: the queue sends it back with the path.
    model.enqueue(tool_calls=[call("file.write", path="shared.txt",
                                   content="shared line one by w3\nshared line two\n")], model="w3")
    model.enqueue(tool_calls=[call("repo.merge", message="w3: shared")], model="w3")
    # Told of the conflict (a P1 signal), w3 syncs, resolves and lands. The signal reaches it with its
    # repo.merge's result when the queue answers before that call's finish is recorded (on swarm a workspace
    # sync sits between them), else it starts w3's next activation: w3 answers what it is told, either way.
    # It reads the file the sync left in conflict: its workspace holds the markers (on swarm, fetched again).
    # (ids of their own: answer()'s numbering and the queue's can meet, and tool_outputs tells calls by id)
    resolution = [answer(tool_calls=[dict(call("repo.sync"), id="w3_sync"),
                                     dict(call("file.read", path="shared.txt"), id="w3_read")]),
                  answer(tool_calls=[dict(call("file.write", path="shared.txt",
                                               content="shared line one by w1 and w3\nshared line two\n"),
                                          id="w3_resolve")]),
                  answer(tool_calls=[dict(call("repo.merge", message="w3: shared, resolved"), id="w3_land")])]
    told = []

    def w3_resolves_when_told(request):
        last = str(((request.get("messages") or [{}])[-1]).get("content") or "")
        if request.get("model") == "w3" and resolution and (told or "call repo.sync" in last):
            told.append(True)
            return resolution.pop(0)
        return waits(request)

    model.responder = w3_resolves_when_told
    team.send("w3", "Change shared.txt, then merge.")
    team.wait_for(lambda: len(team.events("repo.merged")) == 3, message="w3's resolved change landed")
    team.wait_quiet()
    return git_dir, start_tip, first, after_first


@pytest.mark.parametrize("kind", KINDS)
def test_a_team_lands_changes_through_the_merge_queue(tmp_path, kind):
    # The scheduler thread runs as on `serve`: a landing's signal wakes it, not a route.
    with running_team(tmp_path, kind, scheduler_interval=1.0, **team_options(tmp_path)) as team:
        store = team.store
        git_dir, start_tip, first, after_first = run_team_of_three(team)
        conflicts = [e["data"] for e in team.events("repo.merge_failed") if e["data"]["agent"] == "w3"]
        assert [(c["reason"], c["paths"]) for c in conflicts] == [("conflict", ["shared.txt"])]
        signals = [s for s in store.list_signals(limit=1000) if s["kind"] == "repo.merge_failed"]
        assert {(s["targetAgent"], s["priority"]) for s in signals} == {("w2", "P1"), ("w3", "P1")}
        assert any("conflicts in: shared.txt" in text for text in tool_outputs(team, "w3"))
        assert any("<<<<<<<" in text and "by w1" in text for text in tool_outputs(team, "w3"))
        # The coordinator was told of each landing (P3).
        merged_signals = [s for s in store.list_signals(limit=1000) if s["kind"] == "repo.merged"]
        assert [(s["targetAgent"], s["priority"]) for s in merged_signals] == [("pm", "P3")] * 3
        landed = {e["data"]["commit"] for e in team.events("repo.merged")}
        assert {s["payload"]["commit"] for s in merged_signals} == landed
        assert all(s["payload"]["commit"][:12] in s["payload"]["text"] for s in merged_signals)
        # The integration branch holds exactly the landed commits, and the resolved text.
        assert log_subjects(git_dir)[:4] == ["w3: shared, resolved", "w2: b", "w1: a and shared", "Add the files"]
        assert len(log_subjects(git_dir)) == 5
        assert repository.out("show", "main:shared.txt", git_dir=git_dir) == \
            "shared line one by w1 and w3\nshared line two"
        assert "BROKEN" not in files_of(git_dir, "main")
        assert repository.is_ancestor(git_dir, start_tip, "main")
        # Every activation of a worker carries its commit range; the API shows them.
        for activation in team.activations("w1") + team.activations("w3"):
            assert activation["commitStart"] and activation["commitEnd"]
        listed = team.service.get(f"/api/projects/{team.name}/activations").json()
        assert all("commitEnd" in a for a in listed if a["agentId"] in ("w1", "w2", "w3"))
        assert all("commitStart" not in a for a in listed if a["agentId"] == "pm")
        overview = team.service.get(f"/api/projects/{team.name}/repository").json()
        assert overview["branch"] == "main" and overview["head"] == repository.integration_tip(git_dir)
        assert [entry["subject"] for entry in overview["log"][:3]] == \
            ["w3: shared, resolved", "w2: b", "w1: a and shared"]
        assert {branch["name"] for branch in overview["branches"]} == {"agents/w1", "agents/w2", "agents/w3"}
        diff = team.service.get(f"/api/projects/{team.name}/repository/diff",
                                params={"from": start_tip, "to": "main"}).json()
        assert "+b by w2" in diff["diff"] and "BROKEN" not in diff["diff"]
        # A fork after the first landing starts with that commit in place and the later ones absent.
        forked = team.service.post(f"/api/projects/{team.name}/fork", {"as": "e2e-fork", "at": after_first["id"]})
        assert forked.status_code == 201, forked.text
        fork_dir = store.dir.parent / "e2e-fork" / repository.REPOSITORY_DIR
        assert log_subjects(fork_dir) == ["w1: a and shared", "Add the files", "Initial commit"]
        assert repository.out("rev-parse", "main", git_dir=fork_dir) == first["commit"]
        assert {name for name in repository.branch_heads(fork_dir) if name.startswith("refs/heads/agents/")} == {
            "refs/heads/agents/w1", "refs/heads/agents/w3"}
        compared = team.service.get(f"/api/projects/{team.name}/diff/e2e-fork").json()
        assert compared["sections"]["repository"]["identical"] is False
        assert len(compared["sections"]["repository"]["a"]) == 5
        # The working copies' git folders are out of the agents' reach: never inside a workspace.
        for agent in ("w1", "w2", "w3"):
            assert not (store.workspace(agent) / ".git").exists()
            assert (store.dir / "agents" / agent / repository.WORKCOPY_GITDIR / "HEAD").is_file()


@pytest.mark.swarm
@pytest.mark.timeout(900)
def test_a_team_lands_changes_through_the_merge_queue_on_swarm(tmp_path, lab):  # noqa: F811 - the fixture
    """The same team on the Swarm lab's workers: each worker's /workspace is fetched from its working copy,
    its edits reach the controller as workspace changesets before each repo.* call, repo.sync's merge
    comes back into the task, and the checks run on the controller's own engine."""
    settings, client, teams = lab
    options = team_options(tmp_path)
    extra = options.pop("extra")
    team, stack, model = swarm_team(tmp_path, settings, options["agents"], toolpacks=options["toolpacks"],
                                    extra=extra)
    teams.append((team, stack, model))
    store = team.store
    git_dir, start_tip, first, _ = run_team_of_three(team)
    conflicts = [e["data"] for e in team.events("repo.merge_failed") if e["data"]["agent"] == "w3"]
    assert [(c["reason"], c["paths"]) for c in conflicts] == [("conflict", ["shared.txt"])]
    [broken] = [e["data"] for e in team.events("repo.merge_failed") if e["data"]["agent"] == "w2"]
    assert broken["reason"] == "checks" and CHECK in broken["output"]
    # repo.sync's conflict markers reached w3's task: it answered with the paths, and what it wrote over
    # them (sent before its repo.merge) is what landed.
    assert any("conflicts in: shared.txt" in text for text in tool_outputs(team, "w3"))
    assert any("<<<<<<<" in text and "by w1" in text for text in tool_outputs(team, "w3"))
    assert log_subjects(git_dir)[:4] == ["w3: shared, resolved", "w2: b", "w1: a and shared", "Add the files"]
    assert repository.out("show", "main:shared.txt", git_dir=git_dir) == \
        "shared line one by w1 and w3\nshared line two"
    assert repository.out("show", "main:a.txt", git_dir=git_dir) == "a by w1"
    assert "BROKEN" not in files_of(git_dir, "main")
    assert first["agent"] == "w1" and repository.is_ancestor(git_dir, start_tip, "main")
    # Every worker's activations ran on a Swarm node, and each carries its commit range.
    for agent in ("w1", "w2", "w3"):
        for activation in team.activations(agent):
            assert activation["containerName"].startswith("swarm:"), activation
            assert activation["commitStart"] and activation["commitEnd"], activation
    # w2's broken file went from its task to its branch (the end commit), never to the integration branch.
    assert "BROKEN" in files_of(git_dir, "agents/w2")
    for agent in ("w1", "w2", "w3"):
        assert not (store.workspace(agent) / ".git").exists()
    # Every ended activation's service is removed (a later test on the lab counts this project's services).
    wait_until(lambda: not our_services(client, team), 30, message="the ended services to be removed")


def test_a_replay_with_recorded_tools_ends_with_the_code_the_source_had(tmp_path):
    """tools: recorded runs no file write and lands nothing: each agent's working copy is restored from
    the source's end commit when its activation ends, the integration branch follows the source's, and
    the merge queue's signals come from the recording, so the replay wakes the agents the source woke."""
    with running_team(tmp_path, "local", scheduler_interval=1.0, **team_options(tmp_path)) as team:
        git_dir, *_ = run_team_of_three(team)
        assert team.service.post(f"/api/projects/{team.name}/stop", {}).status_code == 200
        team.wait_quiet()
        asked = len(team.model.requests)
        answer = team.service.post(f"/api/projects/{team.name}/replay", {"as": "e2e-again", "tools": "recorded"})
        assert answer.status_code == 201, answer.text
        copy = team.service.root.open_project("e2e-again")
        team.wait_for(lambda: copy.origin()["ended"] and not copy.running_activations(), 120, "the replay's end")
        assert copy.origin()["diverged"] is None and copy.project()["status"] == "stopped"
        assert len(team.model.requests) == asked
        assert len(copy.list_activations(1000)) == len(team.store.list_activations(1000))
        replayed = repository.repository_dir(copy)

        def tree(folder, ref):
            return repository.out("rev-parse", f"{ref}^{{tree}}", git_dir=folder)

        for ref in ("main", "agents/w1", "agents/w2", "agents/w3"):
            assert tree(replayed, ref) == tree(git_dir, ref), ref
        assert repository.out("show", "main:shared.txt", git_dir=replayed) == \
            "shared line one by w1 and w3\nshared line two"
        # Nothing landed in the replay itself: its merges were the recording's, its signals the source's.
        assert [e for e in copy.list_events(10000) if e["type"] == "repo.merged"] == []
        kinds = [s["kind"] for s in copy.list_signals(limit=1000) if s["kind"].startswith("repo.")]
        assert sorted(kinds) == sorted(s["kind"] for s in team.store.list_signals(limit=1000)
                                       if s["kind"].startswith("repo."))


@pytest.mark.docker
def test_an_activation_sees_its_files_but_no_repository_it_could_move(tmp_path):
    options = team_options(tmp_path)
    options["agents"]["w1"]["tools"] = REPO_TOOLS + ["shell.*"]
    options["toolpacks"] = ("core", "shell")
    with running_team(tmp_path, "docker-chat", **options) as team:
        git_dir = repository.ensure_repository(team.store, ProjectConfig.from_data(team.store.config()))
        tip = repository.integration_tip(git_dir)
        probe = ("ls -a /workspace; git -C /workspace rev-parse HEAD 2>&1; "
                 "echo mounts=$(grep -c -e repository.git -e workcopy.git /proc/mounts); "
                 "find / -xdev -name '*.git' -maxdepth 4 2>/dev/null | grep -v '^/proc' ; echo end")
        team.model.enqueue(tool_calls=[call("shell.exec", command=probe)], model="w1")
        wait(team.model, "w1")
        team.send("w1", "Look around.")
        team.wait_activations("w1", 1)
        [output] = team.tool_messages("w1")[:1]
        assert "a.txt" in output and "shared.txt" in output
        assert "not a git repository" in output and "mounts=0" in output
        assert output.rstrip().endswith("end") and ".git\n" not in output
        assert repository.integration_tip(git_dir) == tip
        assert [b["name"] for b in repository.branches(git_dir, "main")] == ["agents/w1"]
