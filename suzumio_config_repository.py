"""Configuration of the team's repository (docs/teams-that-write-code.md, `repository:`): the typed
settings and the checks after the schema (the source, the agents it names). Imported by suzumio_config,
which builds it into ProjectConfig.repository."""
import fnmatch
import re
from dataclasses import dataclass

from suzumio_errors import ConfigError
from suzumio_yaml import lexical_abspath

REMOTE_SOURCE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://|[^/]+@[^/:]+:)")  # a URL or scp-like `user@host:path`


def is_remote(source):
    return bool(REMOTE_SOURCE.match(source))


@dataclass(frozen=True)
class RepositoryConfig:
    """`repository:` as validated: `source` an absolute path or a URL, `branch` None for the source's HEAD,
    `agents` the id globs of the agents with a working copy."""

    source: str
    branch: str = None
    checks: tuple = ()
    agents: tuple = ("*",)
    claims: bool = False

    def has_agent(self, agent_id):
        """Whether `agent_id` works in a working copy of the repository."""
        return any(fnmatch.fnmatchcase(agent_id, pattern) for pattern in self.agents)


def check_repository(data, base_dir, agent_ids, toolpack_entries):
    """After the schema: a local source becomes absolute (relative to the project file), every `agents`
    entry must name some agent, and the built-in `repo` toolpack joins `toolpack_entries` (a list of
    `tools.toolpacks`, changed in place) when it is not there."""
    section = data.get("repository")
    if section is None:
        return
    if "repo" not in toolpack_entries:
        toolpack_entries.append("repo")
    if not is_remote(section["source"]):
        section["source"] = lexical_abspath(section["source"], base_dir)
    for index, pattern in enumerate(section.get("agents") or []):
        if not any(fnmatch.fnmatchcase(agent_id, pattern) for agent_id in agent_ids):
            raise ConfigError(f"repository.agents.{index}: {pattern} names no agent (agents: "
                              f"{', '.join(agent_ids)})")


def repository_config(data):
    """The typed `repository:` section, or None when the project has no repository."""
    section = data.get("repository")
    if section is None:
        return None
    return RepositoryConfig(section["source"], section.get("branch"), tuple(section["checks"]),
                            tuple(section.get("agents") or ("*",)), section["claims"])
