"""The backend contract (suzumio_backend_contract), one suite run against every backend: the in-memory
FakeBackend and `local` always, `docker-chat` on a real engine with the runner image (skipped only while
SUZUMIO_REQUIRE_DOCKER is unset), and `swarm` on the Swarm lab (the `swarm` marker; SUZUMIO_SWARM_LAB
names its settings). Real backends run the stand-in runner (tests/stand_in_runner.py), the fake plays
the same STANDIN_MODE; the suite goes through Backends and the Reconciler as the controller does."""
import contextlib
import uuid

import pytest
from backend_fixtures import local_project, open_activation
from conftest import wait_until
from fake_backend import FakeEngine

import suzumio_backend
import suzumio_config_schema
import suzumio_coordination as coordination
import suzumio_tls
from suzumio_backend_contract import BACKEND_KINDS, KIND_DOCKER, KIND_LOCAL, KIND_SWARM, Backend
from suzumio_backend_reconcile import Reconciler

IMAGE = "suzumio-runner:dev"
RUN_TIMEOUT = 60.0  # a container or a Swarm task starts in seconds; a process or a fake at once
SWARM_TIMEOUT = 120.0


def docker_engine():
    from test_backend_docker import engine
    return engine()


class Subject:
    """One backend under test: how to make a project on it, and what to clean up after."""

    def __init__(self, name, tmp_path):
        self.name, self.tmp_path = name, tmp_path
        self.project_name = f"contract-{uuid.uuid4().hex[:10]}"
        self.timeout = RUN_TIMEOUT
        self.engine = None  # the FakeEngine
        self.client = None  # a Docker SDK client to clean up with
        self.options = {}
        if name == "fake":
            self.engine = FakeEngine()
            self.options = {"kind": KIND_LOCAL, "implementations": {KIND_LOCAL: self.engine.backend}}
        elif name == KIND_LOCAL:
            self.options = {"kind": KIND_LOCAL}
        elif name == KIND_DOCKER:
            self.client = docker_engine()
            self.options = {"kind": KIND_DOCKER, "docker": {"network": "host"}}
        else:
            from test_swarm_lab import lab_settings
            settings = lab_settings()
            import docker
            self.client = docker.DockerClient(base_url=settings["SUZUMIO_SWARM_ENGINE"])
            self.timeout = SWARM_TIMEOUT
            # The stub controller is the runner listener the nodes reach: on the lab's host address, over TLS
            # with a certificate of the project's own CA, which the stand-in verifies as the runner does.
            host = settings["SUZUMIO_LAB_HOST_IP"]
            tls = suzumio_tls.generated_tls(tmp_path, host)
            swarm = {"engine": settings["SUZUMIO_SWARM_ENGINE"], "constraints": ["node.role == worker"],
                     "network": "host"}
            self.options = {"kind": KIND_SWARM, "controller_ca": tls.ca_pem, "controller_host": host,
                            "controller_tls": tls, "controller_url": f"https://{host}:{{port}}",
                            "edit": lambda config: config["backend"].update(swarm=swarm)}

    @contextlib.contextmanager
    def project(self, mode, text=None):
        """A running project whose agents' runners do what STANDIN_MODE `mode` says."""
        agent_env = {"STANDIN_MODE": mode, **({"STANDIN_TEXT": text} if text else {})}
        try:
            with local_project(self.tmp_path / uuid.uuid4().hex[:6], name=self.project_name, image=IMAGE,
                               agent_env=agent_env, **self.options) as env:
                yield env
        finally:
            self.clean()

    def clean(self):
        if self.client is None:
            return
        label = {"label": f"suzumio.project={self.project_name}"}
        if self.name == KIND_SWARM:
            for service in self.client.services.list(filters=label):
                service.remove()
            for secret in self.client.secrets.list(filters=label):
                with contextlib.suppress(Exception):
                    secret.remove()
        else:
            for container in self.client.containers.list(all=True, filters=label):
                container.remove(force=True)


@pytest.fixture(params=["fake", KIND_LOCAL, pytest.param(KIND_DOCKER, marks=pytest.mark.docker),
                        pytest.param(KIND_SWARM, marks=pytest.mark.swarm)])
def subject(request, tmp_path):
    subject = Subject(request.param, tmp_path)
    yield subject
    subject.clean()
    if subject.client is not None:
        subject.client.close()


def started(env, subject):
    """Start an activation of `worker` and wait until its runner's name is recorded."""
    activation = open_activation(env, "worker")
    env.backends.start(env.store, activation["id"])
    name = wait_until(lambda: env.store.activation(activation["id"]).get("containerName"), subject.timeout,
                      message="the runner's name recorded")
    return activation["id"], name


def settled(env, subject, activation_id):
    """Wait until the activation ended and no watcher follows it; returns the activation."""
    wait_until(lambda: env.store.activation(activation_id)["status"] != "running", subject.timeout,
               message="the activation ended")
    wait_until(lambda: not env.backends.watched(activation_id), subject.timeout, message="its watcher ended")
    return env.store.activation(activation_id)


def stop(env, activation_id):
    coordination.cancel_activation(env.store, activation_id, "test over")
    env.backends.stop_runner(env.store, env.store.activation(activation_id))


# ---------------------------------------------------------------- one table, one set of kinds

def test_every_kind_has_one_backend_class_and_the_schema_offers_exactly_those_kinds():
    assert tuple(suzumio_backend.BACKENDS) == BACKEND_KINDS
    for kind, cls in suzumio_backend.BACKENDS.items():
        assert issubclass(cls, Backend) and cls.kind == kind
    schema_kinds = {key: node for key, node, _default in suzumio_config_schema._BACKEND.fields}["kind"]
    assert schema_kinds.values == BACKEND_KINDS


# ---------------------------------------------------------------- the contract, on every backend

class TestBackendContract:

    def test_a_runner_that_submits_output_completes_its_activation(self, subject):
        with subject.project("output", text="contract done") as env:
            activation_id, name = started(env, subject)
            activation = settled(env, subject, activation_id)
            assert (activation["status"], activation["text"]) == ("completed", "contract done")
            assert env.backends.backend_of(name) is env.backends.backend(env.store.config()["backend"]["kind"])

    def test_a_runner_that_exits_nonzero_fails_its_activation_with_its_log_tail(self, subject):
        with subject.project("exit:3", text="boom from the runner") as env:
            activation_id, name = started(env, subject)
            activation = settled(env, subject, activation_id)
            assert activation["status"] == "failed"
            assert activation["error"].startswith("Runner exited with 3")
            assert "boom from the runner" in activation["error"]
            backend = env.backends.backend_of(name)
            assert "boom from the runner" in backend.log_tail(env.store, activation_id, name)

    def test_stop_ends_a_running_runner_and_its_watcher(self, subject):
        with subject.project("sleep") as env:
            activation_id, name = started(env, subject)
            backend = env.backends.backend_of(name)
            assert backend.adopt(env.store, env.store.activation(activation_id), name) is None  # it runs
            stop(env, activation_id)
            assert settled(env, subject, activation_id)["status"] == "cancelled"
            wait_until(lambda: backend.adopt(env.store, env.store.activation(activation_id), name) is not None,
                       subject.timeout, message="the stopped runner seen as ended")

    def test_a_restarted_controller_finds_and_adopts_a_running_runner(self, subject):
        with subject.project("sleep") as env:
            activation_id, name = started(env, subject)
            config = env.backends.configs.get(env.store)
            env.backends.close()  # the controller goes; its runner keeps going
            later = env.new_backends()
            backend = later.backend(config.backend.kind)
            assert backend.owns(name) and later.backend_of(name) is backend
            assert [b for b in later.backends() if b.owns(name)] == [backend]
            assert backend.find(env.store, config, activation_id) == name
            assert backend.adopt(env.store, env.store.activation(activation_id), name) is None
            Reconciler(later).reconcile([env.store])
            assert later.watched(activation_id)
            assert env.store.activation(activation_id)["status"] == "running"
            coordination.cancel_activation(env.store, activation_id, "test over")
            later.stop_runner(env.store, env.store.activation(activation_id))
            wait_until(lambda: not later.watched(activation_id), subject.timeout, message="the adopted runner ended")

    def test_an_ended_runner_is_settled_when_a_restarted_controller_adopts_it(self, subject):
        with subject.project("sleep") as env:
            activation_id, _name = started(env, subject)
            env.backends.close()
            env.new_backends().stop_runner(env.store, env.store.activation(activation_id))  # ends while unwatched
            later = env.new_backends()
            reconciler = Reconciler(later)
            wait_until(lambda: reconciler.reconcile([env.store])
                       or env.store.activation(activation_id)["status"] != "running", subject.timeout,
                       interval=0.5, message="the ended runner's activation settled")
            assert env.store.activation(activation_id)["status"] == "failed"

    def test_gc_leaves_a_running_runner_alone(self, subject):
        with subject.project("sleep") as env:
            activation_id, name = started(env, subject)
            config = env.backends.configs.get(env.store)
            removed = Reconciler(env.backends).collect_garbage(env.store, config, env.tmp_path / "no.sock")
            assert removed == 0
            assert env.backends.backend_of(name).adopt(env.store, env.store.activation(activation_id), name) is None
            stop(env, activation_id)
            settled(env, subject, activation_id)
