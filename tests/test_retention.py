"""Bounded containers: each exited activation container leaves its log tail in its activation
folder and only the newest `backend.docker.keep` per agent stay on the engine; `keep: all` keeps them
all; `suzumio gc` removes what is left over. Real engine, real runner image, the FakeModel."""
import io
import json

import docker.errors
import pytest
from e2e_fixtures import call, running_team

import suzumio
import suzumio_backend
import suzumio_runtime

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def agent_containers(team, agent_id, include_foreign=False):
    """The agent's containers on the engine that belong to this root: those of its activations and its
    unclaimed prepared ones. Another root on the same engine (a parallel run, or one a killed run left)
    may hold containers with the same project and agent labels; `include_foreign` lists those too."""
    labels = ["suzumio.managed=true", f"suzumio.project={team.name}", f"suzumio.agent={agent_id}"]
    for _ in range(5):
        try:
            found = team.docker.containers.list(all=True, filters={"label": labels})
            break
        except docker.errors.NotFound:  # retired between the listing and the SDK's inspect of it
            continue
    else:
        found = team.docker.containers.list(all=True, filters={"label": labels})
    if include_foreign:
        return found
    owner = suzumio_backend.warm_owner(suzumio_runtime.runner_socket_path(team.service.root.path))

    def ours(container):
        activation_id = suzumio_backend.container_activation(container.name, container.labels, team.name, agent_id)
        if activation_id:
            return team.store.activation_dir(activation_id).is_dir()
        return container.labels.get("suzumio.warm") == owner

    return [container for container in found if ours(container)]


def activation_of(team, container):
    """The activation a container ran: its label, or (a claimed prepared container) its name."""
    return suzumio_backend.container_activation(container.name, container.labels, team.name, "worker-1")


def run_activations(team, count):
    """`count` activations of worker-1, one after another, each failing with its own model error."""
    for index in range(count):
        # a 400: not retried by the controller, so each activation fails on its own error
        team.model.enqueue_error(400, f"model error number {index}", model="worker-1")
        team.send("worker-1", f"Task {index}.")
        team.wait_activations("worker-1", index + 1)
    return team.activations("worker-1")


def test_only_the_newest_containers_stay_and_every_log_tail_is_kept(tmp_path):
    with running_team(tmp_path, "docker-chat", docker={"keep": 2}) as team:
        activations = run_activations(team, 6)

        team.wait_for(lambda: len(agent_containers(team, "worker-1")) <= 2, 30, "containers retired")
        kept = {activation_of(team, c) for c in agent_containers(team, "worker-1")}
        newest = sorted((a["id"] for a in activations), reverse=True)[:2]
        assert kept == set(newest)
        for index, activation in enumerate(sorted(activations, key=lambda a: a["id"])):
            log_path = team.store.activation_dir(activation["id"]) / "runner.log"
            assert log_path.stat().st_mode & 0o777 == 0o600
            assert f"model error number {index}" in log_path.read_text(encoding="utf-8")
            assert activation["status"] == "failed"


def test_after_200_warm_activations_the_engine_holds_only_the_kept_ones_and_every_log_tail(tmp_path):
    """The same check with prepared containers on: 200 activations of one agent, `keep: 3`."""
    with running_team(tmp_path, "docker-chat", docker={"keep": 3}, warm_limit=4) as team:
        activations = run_activations(team, 200)

        def finished():
            return [c for c in agent_containers(team, "worker-1") if activation_of(team, c)]
        team.wait_for(lambda: len(finished()) <= 3, 60, "containers retired")
        newest = sorted((a["id"] for a in activations), reverse=True)[:3]
        assert {activation_of(team, c) for c in finished()} == set(newest)
        # Besides them at most the one prepared container of the agent's next activation.
        assert len(agent_containers(team, "worker-1")) <= 4
        # The kept ones ran in prepared containers: created before their activation, so unlabelled.
        assert any("suzumio.activation" not in c.labels for c in finished())
        for index, activation in enumerate(sorted(activations, key=lambda a: a["id"])):
            log_path = team.store.activation_dir(activation["id"]) / "runner.log"
            assert f"model error number {index}" in log_path.read_text(encoding="utf-8")
            assert activation["status"] == "failed"


def test_keep_all_keeps_every_container_and_gc_removes_the_extra_ones(tmp_path):
    with running_team(tmp_path, "docker-chat", docker={"keep": "all"}) as team:
        run_activations(team, 4)
        assert len(agent_containers(team, "worker-1")) == 4

        # An operator lowers keep in the stored config (as a new config would) and runs `suzumio gc`.
        config = team.store.config()
        config["backend"]["docker"]["keep"] = 1
        with team.store.write() as tx:
            tx.execute("UPDATE projects SET config_json = ? WHERE id = ?", (json.dumps(config), team.name))
        team.store._config = None
        out, err = io.StringIO(), io.StringIO()
        code = suzumio.main(["gc", team.name, "--root", str(team.service.root.path)], out=out, err=err)

        assert (code, err.getvalue()) == (0, "")
        assert out.getvalue() == f"{team.name}: removed 3 containers\n"
        assert len(agent_containers(team, "worker-1")) == 1
        for activation in team.activations("worker-1"):
            assert (team.store.activation_dir(activation["id"]) / "runner.log").exists()


def test_gc_removes_a_created_container_whose_activation_ended(tmp_path):
    with running_team(tmp_path, "docker-chat", docker={"keep": "all"}) as team:
        team.model.enqueue(tool_calls=[call("coordination.wait_for_signal", reason="Idle.")], model="worker-1")
        team.send("worker-1", "Task.")
        activation = team.wait_activations("worker-1", 1)[0]
        orphan = team.docker.containers.create(
            "suzumio-runner:dev", command=["true"], name=f"suzumio_{team.name}_worker-1_{activation['id']}_x",
            labels={"suzumio.managed": "true", "suzumio.project": team.name, "suzumio.agent": "worker-1",
                    "suzumio.activation": activation["id"]})
        out = io.StringIO()
        try:
            assert suzumio.main(["gc", team.name, "--root", str(team.service.root.path)], out=out) == 0
            assert out.getvalue() == f"{team.name}: removed 1 container\n"
            assert orphan.id not in {c.id for c in agent_containers(team, "worker-1", include_foreign=True)}
        finally:
            for container in agent_containers(team, "worker-1", include_foreign=True):
                if container.id == orphan.id:
                    container.remove(force=True)


def test_retention_and_gc_leave_another_roots_containers_alone(tmp_path):
    # Two roots on one engine can hold projects and agents of the same names: one's retention and gc
    # remove only containers of its own activations.
    with running_team(tmp_path, "docker-chat", docker={"keep": 0}) as team:
        foreign = [team.docker.containers.create(
            "suzumio-runner:dev", command=["true"], name=f"suzumio_{team.name}_worker-1_act_other{state}",
            labels={"suzumio.managed": "true", "suzumio.project": team.name, "suzumio.agent": "worker-1",
                    "suzumio.activation": f"act_other{state}"}) for state in ("created", "exited")]
        try:
            foreign[1].start()
            foreign[1].wait(timeout=60)
            run_activations(team, 2)
            team.wait_for(lambda: not agent_containers(team, "worker-1"), 30, "own containers retired")
            out = io.StringIO()
            assert suzumio.main(["gc", team.name, "--root", str(team.service.root.path)], out=out) == 0
            remaining = {c.id for c in agent_containers(team, "worker-1", include_foreign=True)}
            assert {c.id for c in foreign} <= remaining
        finally:
            for container in foreign:
                container.remove(force=True)


def test_gc_removes_only_this_roots_stale_prepared_containers(tmp_path):
    # A prepared container carries its root's hash (suzumio.warm); gc removes this root's stale ones
    # and leaves another root's, of the same project and agent names, alone.
    with running_team(tmp_path, "docker-chat") as team:
        ours = suzumio_backend.warm_owner(suzumio_runtime.runner_socket_path(team.service.root.path))
        prepared = {owner: team.docker.containers.create(
            "suzumio-runner:dev", command=["true"], name=f"suzumio_{team.name}_worker-1_warm-gc{index}",
            labels={"suzumio.managed": "true", "suzumio.project": team.name, "suzumio.agent": "worker-1",
                    "suzumio.warm": owner}) for index, owner in enumerate((ours, "0123456789abcdef"))}
        try:
            out = io.StringIO()
            assert suzumio.main(["gc", team.name, "--root", str(team.service.root.path)], out=out) == 0
            assert out.getvalue() == f"{team.name}: removed 1 container\n"
            left = {c.id for c in team.docker.containers.list(all=True, filters={"label": "suzumio.warm"})}
            assert prepared[ours].id not in left
            assert prepared["0123456789abcdef"].id in left
        finally:
            for container in prepared.values():
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
