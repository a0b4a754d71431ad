"""Configuration of the `swarm` backend (docs/configuration.md, backend.swarm and agents.<id>.swarm): the
typed settings, where one agent's tasks may run and what they reserve, and what `config render` says about
the tasks' network. Imported by suzumio_config, which re-exports what other modules use."""
from dataclasses import dataclass

from suzumio_config_schema import parse_size

SEALED = "sealed"  # backend.swarm.network: a task's own internal overlay, and the node's gateway to the controller


@dataclass(frozen=True)
class SwarmPlacement:
    """Where one agent's activation tasks may run and what they reserve: backend.swarm with
    agents.<id>.swarm on top (each field it writes replaces the backend's). Sizes in bytes."""

    constraints: tuple = ()
    preferences: tuple = ()
    reserve_cpus: float = None
    reserve_memory: int = None
    limit_cpus: float = None
    limit_memory: int = None


@dataclass(frozen=True)
class SwarmConfig:
    """`backend.swarm` (docs/configuration.md); present only with backend.kind swarm or when written."""

    engine: str = None
    network: str = SEALED
    resolve_image: str = "never"
    placement: object = None  # the placement fields as written

    @property
    def host_network(self):
        return self.network == "host"

    @property
    def sealed(self):
        return self.network == SEALED


def swarm_config(swarm):
    """The SwarmConfig of a normalized backend.swarm ({} when absent)."""
    placement = {key: swarm[key] for key in ("constraints", "preferences", "reservations", "limits") if key in swarm}
    return SwarmConfig(swarm.get("engine"), swarm.get("network", SEALED), swarm.get("resolveImage", "never"),
                       placement)


def swarm_placement(swarm, agent):
    """The SwarmPlacement of one expanded agent: agents.<id>.swarm fields over backend.swarm's."""
    merged = dict(swarm.placement or {})
    merged.update(agent.swarm or {})
    reserve, limit = merged.get("reservations") or {}, merged.get("limits") or {}

    def size(part):
        return None if part.get("memory") is None else parse_size(part["memory"])

    return SwarmPlacement(tuple(merged.get("constraints") or ()), tuple(merged.get("preferences") or ()),
                          reserve.get("cpus"), size(reserve), limit.get("cpus"), size(limit))


def swarm_network_warning(swarm):
    """What `config render` says about the tasks' network: nothing when sealed (no route but the
    node's gateway to the runner listener); `host` and a named overlay are escape hatches."""
    if swarm.sealed:
        return None
    if swarm.host_network:
        return ("Warning: backend.swarm.network host puts every activation task on its node's network: agent tools "
                "can reach whatever that node reaches (its 127.0.0.1 services included), outside the egress "
                "allowlist and its audit")
    return (f"Warning: backend.swarm.network {swarm.network}: agent tools can reach every service on that overlay "
            "network and whatever it routes to, outside the egress allowlist and its audit (the default, sealed, "
            "gives each task no route but the runner listener)")
