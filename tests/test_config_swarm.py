"""backend.swarm and agents.<id>.swarm (suzumio_config_swarm): defaults, an agent's placement over the
backend's, limits from backend.docker, what `config render` says about the tasks' network; and an
activation of a swarm project failing at start, with the reason, when the controller serves no TCP
runner listener."""
import pytest
import yaml
from api_fixtures import init_project, serving
from conftest import wait_until
from test_config import base, error, load

import suzumio_backend
import suzumio_backend_swarm
from suzumio_config import Mount
from suzumio_config_swarm import SwarmPlacement


def swarm_project(swarm=None, agent_swarm=None):
    data = base()
    data["backend"].update(kind="swarm", swarm=swarm or {})
    if agent_swarm is not None:
        data["agents"]["pm"]["swarm"] = agent_swarm
    return data


def test_swarm_defaults_to_the_sealed_network_and_preloaded_images_and_render_warns_about_the_others(tmp_path):
    config = load(tmp_path, swarm_project())
    assert (config.backend.swarm.engine, config.backend.swarm.network, config.backend.swarm.resolve_image) == \
        (None, "sealed", "never")
    assert not [line for line in config.warnings if "backend.swarm.network" in line]
    assert ("Network: pm gets sealed (backend.swarm.network: its own internal network, no route but its node's "
            "gateway to the runner listener)") in config.network_report()
    host = load(tmp_path, swarm_project({"network": "host"}))
    assert host.warnings[0].startswith("Warning: backend.swarm.network host puts every activation task on its "
                                       "node's network")
    assert "Network: pm gets host (backend.swarm.network: its task reaches the runner listener over it)" in \
        host.network_report()
    overlay = load(tmp_path, swarm_project({"network": "agents"}))
    assert overlay.warnings[0].startswith("Warning: backend.swarm.network agents: agent tools can reach every "
                                          "service on that overlay network")


def test_an_agents_placement_replaces_the_backends_field_by_field(tmp_path):
    config = load(tmp_path, swarm_project(
        {"constraints": ["node.role == worker"], "preferences": ["node.labels.zone"],
         "limits": {"cpus": 1, "memory": "1GiB"}},
        {"constraints": ["node.labels.gpu == yes"], "reservations": {"memory": "64MiB", "cpus": 0.5}}))
    assert config.swarm_placement("pm") == SwarmPlacement(
        ("node.labels.gpu == yes",), ("node.labels.zone",), 0.5, 64 * 2**20, 1, 2**30)
    resources = suzumio_backend_swarm.SwarmBackend.resources(config.swarm_placement("pm"), config.sandbox("pm"))
    assert resources == {"Limits": {"NanoCPUs": 10**9, "MemoryBytes": 2**30, "Pids": 1024},
                         "Reservations": {"NanoCPUs": 5 * 10**8, "MemoryBytes": 64 * 2**20}}
    # Without swarm limits, the docker-chat ones apply.
    plain = load(tmp_path, swarm_project())
    assert suzumio_backend_swarm.SwarmBackend.resources(plain.swarm_placement("pm"), plain.sandbox("pm")) == \
        {"Limits": {"NanoCPUs": 2 * 10**9, "MemoryBytes": 4 * 2**30, "Pids": 1024}}


def test_bad_swarm_settings_name_their_path(tmp_path):
    message = error(tmp_path, swarm_project({"resolveImage": "sometimes", "limits": {"memory": "lots"}},
                                            {"constraints": "node.role == worker"}))
    assert "backend.swarm.resolveImage: Invalid enum value. Expected 'never' | 'always' | 'changed'" in message
    assert "backend.swarm.limits.memory: Expected a size such as 2GiB" in message
    assert "agents.pm.swarm.constraints: Expected array" in message


def test_tasks_get_a_folder_of_their_own_for_every_mount_outside_the_scratch_folders(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "f.txt").write_text("x")
    mounts = [Mount(str(folder), "/data/in"), Mount(str(folder / "f.txt"), "/mnt/x/f.txt"),
              Mount(str(folder / "f.txt"), "/cfg/f.txt"), Mount(str(folder / "f.txt"), "/top.txt")]
    assert suzumio_backend_swarm.scratch_targets(mounts) == [
        "/workspace", "/artifacts", "/mnt", "/toolpacks", "/data/in", "/cfg"]


def test_a_tasks_writable_folders_are_tmpfs_volumes_its_user_owns_one_set_per_agent():
    volume = suzumio_backend_swarm.scratch_volume
    url, owner = "https://10.0.0.1:7443", ("65532", "65532")
    name = volume(url, "demo", "pm", owner, "/workspace")
    assert name.startswith("suzumio-scratch-") and name == volume(url, "demo", "pm", owner, "/workspace")
    others = {volume(url, "demo", "dev", owner, "/workspace"), volume(url, "other", "pm", owner, "/workspace"),
              volume("https://10.0.0.2:7443", "demo", "pm", owner, "/workspace"),
              volume(url, "demo", "pm", ("1000", "1000"), "/workspace"), volume(url, "demo", "pm", None, "/workspace"),
              volume(url, "demo", "pm", owner, "/mnt")}
    assert name not in others and len(others) == 6
    mount = suzumio_backend_swarm.scratch_mount("/workspace", name, owner, {"suzumio.agent": "pm"})
    # A volume, not a tmpfs mount (runc gives that the image folder's mode), not filled from the image.
    assert (mount["Type"], mount["Source"], mount["Target"]) == ("volume", name, "/workspace")
    options = mount["VolumeOptions"]
    assert options["NoCopy"] is True
    assert options["Labels"] == {"suzumio.agent": "pm", "suzumio.scratch": "/workspace"}
    assert options["DriverConfig"]["Options"] == {"type": "tmpfs", "device": "tmpfs",
                                                  "o": "uid=65532,gid=65532,mode=0700,nosuid,nodev,noexec"}
    open_to_all = suzumio_backend_swarm.scratch_mount("/mnt", name, None, {})
    assert open_to_all["VolumeOptions"]["DriverConfig"]["Options"]["o"] == "mode=1777,nosuid,nodev,noexec"


def test_service_names_are_what_swarm_accepts_and_recorded_with_their_prefix():
    assert suzumio_backend_swarm.service_name("act_1796010303779_aafa6391") == "suzumio-act-1796010303779-aafa6391"
    assert suzumio_backend_swarm.swarm_service("swarm:suzumio-act-1") == "suzumio-act-1"
    assert suzumio_backend_swarm.swarm_service("suzumio_demo_pm_act_1") is None
    assert suzumio_backend_swarm.swarm_service("local-42") is None


def test_a_swarm_activation_fails_at_start_without_a_tcp_runner_listener(tmp_path):
    data = swarm_project()
    data["agents"]["pm"]["tools"] = ["messages.send", "completion.submit"]
    with serving(tmp_path / "root") as service:  # the runner socket only, as `serve` without --runner-listen
        store = init_project(service.root, tmp_path / "p", yaml.safe_dump(data))
        store.start()
        service.post(f"/api/projects/{store.project_id}/messages", {"recipient": "pm", "body": "Go."})
        wait_until(lambda: store.list_activations(10) and store.list_activations(10)[0]["status"] == "failed",
                   10, message="the activation to fail")
        assert store.list_activations(10)[0]["error"] == suzumio_backend.SWARM_NEEDS_LISTENER


def test_a_swarm_runners_input_says_its_files_come_through_the_controller_and_its_route_is_the_gateway(tmp_path):
    sealed = load(tmp_path, swarm_project())
    swarm = suzumio_backend.backend_class("swarm")
    assert swarm.input_fields(sealed) == {"files": "controller", "noNewPrivileges": True,
                                          "controllerVia": suzumio_backend_swarm.GATEWAY_SOCKET}
    assert swarm.input_fields(load(tmp_path, swarm_project({"network": "host"}))) == {
        "files": "controller", "noNewPrivileges": True}
    assert suzumio_backend.backend_class("docker-chat").input_fields(sealed) == {}
    assert suzumio_backend.backend_class("local").input_fields(sealed) == {}


def test_a_swarm_runner_refuses_a_local_toolpack_that_docker_chat_mounts_and_local_runs_in_place(tmp_path):
    class Pack:
        id, safe_id, path = "notes", "notes", tmp_path
        runner_module, container_runner_module = "/host/notes/runner.mjs", "/toolpacks/notes/runner.mjs"

    assert suzumio_backend.backend_class("local").local_toolpack(Pack) == ("/host/notes/runner.mjs", None)
    assert suzumio_backend.backend_class("docker-chat").local_toolpack(Pack) == (
        "/toolpacks/notes/runner.mjs", ("notes", str(tmp_path)))
    with pytest.raises(ValueError, match=r"^backend\.kind swarm cannot run the local toolpack notes yet"):
        suzumio_backend.backend_class("swarm").local_toolpack(Pack)
