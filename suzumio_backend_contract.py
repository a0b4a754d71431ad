"""The backend contract, written once: what every activation backend implements (`local`, `docker-chat`,
`swarm`, and the tests' FakeBackend), the backend kinds, and how a runner ended. The implementations live
in suzumio_backend_local, suzumio_backend_docker and suzumio_backend_swarm; suzumio_backend's BACKENDS
table maps each kind to its class (docs/operations.md, "A fourth backend"). Imported by the config schema
(the kinds) and the backends."""
from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

KIND_DOCKER = "docker-chat"
KIND_LOCAL = "local"
KIND_SWARM = "swarm"
BACKEND_KINDS = (KIND_DOCKER, KIND_LOCAL, KIND_SWARM)  # backend.kind's values; the first is the default
REDACTED = "<redacted>"

# What crosses the seam, named for the reader; the contract imports none of it (it sits below them all).
ProjectStore = Any  # suzumio_store.ProjectStore: one project's rows, its activation folders
ProjectConfig = Any  # suzumio_config.ProjectConfig: the project's typed configuration
Launch = Any  # suzumio_backend.Launch: the activation, agent, config, input.json data, env, secrets
Slot = Any  # suzumio_warm.Slot: one prepared runner of the warm pool
WarmPool = Any  # suzumio_warm.WarmPool
ToolpackSpec = Any  # suzumio_registry.ToolpackSpec: one toolpack of the project
Host = Any  # suzumio_backend.Backends


def redact(text: str, secrets: list[str]) -> str:
    """`text` with every secret value replaced by REDACTED: what a backend keeps of a runner's log."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    return text


def no_log() -> str:
    return ""


class Exit:
    """How a runner ended: its exit `code` (None when unknown: a runner found gone), `log()` its log tail
    (asked only for a failure text), or `error`, a failure that is no exit (its service or node lost)."""

    def __init__(self, code: int | None = None, log: Callable[[], str] = no_log, error: str | None = None):
        self.code, self.log, self.error = code, log, error

    def __repr__(self):
        return f"Exit(code={self.code!r}, error={self.error!r})"


class Backend(ABC):
    """One way of running activations' runners. `host` is the Backends that owns it: its `environ`,
    `configs`, `closed` event, `runner_socket`, `controller_ca`, `follow(store, activation_id, name,
    secrets)` (wait for the runner on a watcher thread, then settle the activation and call `ended`),
    `stop_runner(store, activation)`, `watched(activation_id)` and `secrets(config, agent)`. A runner is
    known by the name recorded as the activation's containerName; only its backend reads that name."""

    kind: str = ""  # the backend.kind value this class runs
    container: bool = True  # the runner sees the container layout (/workspace, /artifacts) and the mounts
    collects_garbage: bool = True  # `suzumio gc` without a project name goes over its projects
    listener_required: str | None = None  # why its runners need serve --runner-listen; None: they do not
    prepares: bool = False  # it prepares runners ahead of their activations (fingerprint ... discard)
    socket_dir: str | None = None  # where its runner sees the runner socket's folder mounted; None: host path

    # -- what input.json says (asked of the class, for a Launch)

    @staticmethod
    def local_toolpack(pack: ToolpackSpec) -> tuple[str, tuple[str, str] | None]:
        """The `runnerModule` of a local toolpack's spec and what to mount for it ((safe id, host root) or
        None); raises when this backend's runners cannot reach local toolpacks."""
        return pack.runner_module, None

    @staticmethod
    def input_fields(config: ProjectConfig) -> dict:
        """What input.json carries for this backend's runners beyond the fields every runner gets."""
        return {}

    def __init__(self, host: Host):
        self.host = host

    # -- one activation

    @abstractmethod
    def start(self, store: ProjectStore, launch: Launch, slot: Slot | None = None) -> None:
        """Start the runner of `launch` (in the claimed prepared runner `slot`, cold when that is gone),
        record its name, and `host.follow` it; a runner whose activation ended meanwhile is stopped or
        never started. Raises when it cannot start (the caller fails the activation)."""

    @abstractmethod
    def wait(self, store: ProjectStore, activation_id: str, name: str, secrets: list[str],
             closed: threading.Event) -> Exit | None:
        """Block until the runner ends and say how (a log it keeps shows none of `secrets`); None when
        `closed` is set first (the runner keeps going)."""

    def ended(self, store: ProjectStore, activation_id: str, name: str, secrets: list[str]) -> None:
        """After the activation was settled on its runner's end: keep its log tail, release what it held."""
        return None  # by default nothing to do

    @abstractmethod
    def stop(self, store: ProjectStore, activation_id: str, name: str) -> None:
        """Stop the runner of an ended activation; one already gone counts as stopped; raises on failure."""

    @abstractmethod
    def log_tail(self, store: ProjectStore, activation_id: str, name: str) -> str:
        """The runner's last log lines (LOG_TAIL_LINES); '' when none are kept."""

    # -- after a controller restart

    @abstractmethod
    def owns(self, name: str) -> bool:
        """True when a recorded name names one of this backend's runners."""

    @abstractmethod
    def find(self, store: ProjectStore, config: ProjectConfig, activation_id: str) -> str | None:
        """The name of the runner of an activation whose name was never recorded (its controller died
        between starting and recording it), or None."""

    def may_start_later(self, store: ProjectStore, activation_id: str) -> bool:
        """Whether a runner `find` does not see now may still appear (the reconciler then waits
        NEVER_STARTED_GRACE_MS before failing the activation)."""
        return True

    @abstractmethod
    def adopt(self, store: ProjectStore, activation: dict, name: str) -> Exit | None:
        """A running activation's runner that no watcher follows: None when it still runs (the caller
        follows it), else how it ended."""

    def collect_garbage(self, store: ProjectStore, config: ProjectConfig, runner_socket: Path) -> int:
        """`suzumio gc`: remove what runners of ended activations left; returns the count removed."""
        return 0

    def sweep(self, runner_socket: Path | None, pool: WarmPool | None) -> list[str]:
        """Remove the prepared runners a killed controller of this root left (not held by `pool`, this
        process's WarmPool or None); returns their names."""
        return []

    # -- prepared runners (optional: a backend without them keeps these)

    def fingerprint(self, launch: Launch, agent_ids: list[str]) -> str | None:
        """Everything a prepared runner shares with the activation it may serve; None: none prepared."""
        return None

    def prepare(self, store: ProjectStore, launch: Launch, slot: Slot, warm_socket: Path) -> None:
        """Create and start the runner of `slot` for a future activation, waiting on the warm socket."""
        raise TypeError(f"{type(self).__name__} prepares no runners (prepares is False)")

    def claim(self, store: ProjectStore, launch: Launch, slot: Slot) -> bool:
        """Hand the prepared runner of `slot` its activation (input, environment, log), for `start`; False
        when it turned out gone or unusable (`start` then starts one cold)."""
        raise TypeError(f"{type(self).__name__} prepares no runners (prepares is False)")

    def discard(self, slot: Slot) -> None:
        """Remove a prepared runner no activation will use."""
        return None  # by default nothing to do

    def close(self) -> None:
        """Release engine clients (idempotent); runners keep going and the next serve adopts them."""
        return None  # by default nothing to do
