"""Project files sent as text (docs/http-api.md#projects-from-a-file): checked by the same pipeline as
`suzumio config render`, every schema error with its dotted path, and initialized as `suzumio init`
does. The text is written to a private temporary folder and loaded from there, so `@import`,
`extends` and relative paths resolve inside that folder only, and `${VAR}` placeholders see no
environment: a file sent over the API never reads the controller's variables or files."""
import tempfile
from pathlib import Path

import suzumio_config
from suzumio_errors import BadRequest

FILE_NAME = "project.yaml"
ERROR_ITEM = "  - "


def error_lines(message):
    """The ConfigError message as one line per error (the pipeline lists several under a heading)."""
    lines = message.splitlines()
    items = [line[len(ERROR_ITEM):] for line in lines if line.startswith(ERROR_ITEM)]
    return items or [line for line in lines if line.strip()]


def load_text(text):
    """The ProjectConfig of a project file's text; ConfigError when it is invalid."""
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("config must be a project file (YAML text)")
    with tempfile.TemporaryDirectory(prefix="suzumio-config-") as folder:
        path = Path(folder) / FILE_NAME
        path.write_text(text, encoding="utf-8")
        return suzumio_config.load_project(path, env={})


def check(text):
    """{"valid", "errors"} and, when valid, the project's name, agent ids, warnings and unknown keys."""
    try:
        config = load_text(text)
    except suzumio_config.ConfigError as error:
        return {"valid": False, "errors": error_lines(error.message)}
    return {"valid": True, "errors": [], "name": config.name, "agents": [agent.id for agent in config.agents],
            "warnings": list(config.warnings), "unknownKeys": list(config.unknown_keys)}


def init_from_text(root, text, now=None):
    """Initialize a project from a project file's text as `suzumio init` does; returns its store.
    BadRequest naming every error for an invalid file, Conflict when the name is taken."""
    try:
        config = load_text(text)
    except suzumio_config.ConfigError as error:
        raise BadRequest("Invalid project config: " + "; ".join(error_lines(error.message))) from None
    return root.init_project(name=config.data["name"], task=config.data["task"], config=config.data,
                             agents=config.agents, source_text=text, resolved_text=config.render(), now=now)
