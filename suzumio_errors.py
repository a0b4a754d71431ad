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


class BadGateway(SuzumioError):
    """The controller could not get an answer from an upstream service (a model provider)."""

    status = 502
