"""Suzumio's version and where its runtime files are at run time: the WebUI bundle (`webui_dist/`), the
packaged toolpacks (`toolpacks/`), the Node toolpack host (`suzumio_toolpack_host.mjs`) and the example
projects (`examples/`, for `suzumio examples`).

In a checkout, an editable install and the unpacked pex they sit beside the modules. A regular wheel
cannot put directories beside flat top-level modules, so it installs them as data files under
`<prefix>/share/suzumio/` (pyproject.toml `[tool.setuptools.data-files]`); `resource_path` looks beside
the modules first, then there. The runner modules are Python modules and always sit beside these.
Standard library only."""
import sys
import sysconfig
from pathlib import Path

# The one version string: pyproject.toml reads it from here (`dynamic = ["version"]`), the CLI prints
# it (`suzumio --version`), the API answers it (`GET /api/version`, `Suzumio-Version` header).
__version__ = "0.1.0"
VERSION = __version__

MODULE_DIR = Path(__file__).resolve().parent
SHARE_PARTS = ("share", "suzumio")


def data_dirs():
    """Where runtime files may be, in the order they are looked for: beside the modules, then the
    share directory of this interpreter's install scheme, of its prefix, and of a `--user` install."""
    dirs = [MODULE_DIR]
    bases = [sysconfig.get_path("data"), sys.prefix]
    try:
        bases.append(sysconfig.get_path("data", f"{sysconfig.get_default_scheme().split('_')[0]}_user"))
    except KeyError:
        pass
    for base in bases:
        candidate = Path(base, *SHARE_PARTS)
        if candidate not in dirs:
            dirs.append(candidate)
    return dirs


def resource_path(name):
    """The path of a runtime file or directory; beside the modules when it is found nowhere, so that an
    error message names the place a checkout would have it."""
    for directory in data_dirs():
        candidate = directory / name
        if candidate.exists():
            return candidate
    return MODULE_DIR / name
