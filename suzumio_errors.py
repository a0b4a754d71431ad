"""The one error hierarchy of the controller. Each class carries its HTTP status; the request boundary
(suzumio_api, suzumio_runner_support) turns any of them into {"error": message}, and the CLI prints the
message on one line."""


class SuzumioError(Exception):
    """Base class: a user-facing failure with a one-line message."""

    status = 400

    def __init__(self, message):
        super().__init__(message)
        self.message = str(message)

    def __str__(self):
        return self.message


class BadRequest(SuzumioError):
    status = 400


class ConfigError(BadRequest):
    """The configuration (or a file it imports) is invalid; the message names the field path."""


class Unauthorized(SuzumioError):
    """A user API request without the API token, or with a wrong one."""

    status = 401


class Forbidden(SuzumioError):
    status = 403


class NotFound(SuzumioError):
    status = 404


class Conflict(SuzumioError):
    status = 409


class InternalError(SuzumioError):
    """A failure of the controller itself; the message names an error id the log has, never the cause."""

    status = 500


class BadGateway(SuzumioError):
    """The controller could not get an answer from an upstream service (a model provider)."""

    status = 502


class Unavailable(SuzumioError):
    """The controller is shutting down the part that would answer."""

    status = 503


class InsufficientStorage(SuzumioError):
    """A write failed because the disk (or the user's quota) of the runtime root is full."""

    status = 507


ENOSPC, EDQUOT = 28, 122  # errno values on Linux: no space left, quota exceeded
SQLITE_FULL = 13


def storage_error(error):
    """An InsufficientStorage for `error` when it, or an error it came from, says the disk is full
    (an OSError ENOSPC/EDQUOT, SQLite's SQLITE_FULL); else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (ENOSPC, EDQUOT):
            return InsufficientStorage("Insufficient storage: no space left on the disk of the runtime root")
        if getattr(error, "sqlite_errorcode", None) == SQLITE_FULL or "database or disk is full" in str(error):
            return InsufficientStorage("Insufficient storage: the project database cannot grow (disk full)")
        error = error.__cause__ or error.__context__
    return None
