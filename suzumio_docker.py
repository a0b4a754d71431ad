"""The Docker SDK as the container backends use it: imported on first use under one lock, and the errors
an engine call raises. Imported by suzumio_backend and suzumio_backend_swarm, and by the evals' check
sandbox (suzumio_eval_graders, suzumio_eval_runner, suzumio_eval_cli); CLI commands that never start a
container never import the SDK."""
import threading

# Two threads importing the SDK for the first time at once (right after a restart: the reconciler
# inspecting a container while the scheduler creates one) can see a partially initialised
# `docker.types` and fail with ImportError, so every first import goes through this lock.
_SDK_IMPORT_LOCK = threading.Lock()


def docker_sdk():
    """The `docker` package with `docker.errors` and `docker.types` (and `requests.exceptions`) loaded."""
    with _SDK_IMPORT_LOCK:
        import docker.errors  # binds `docker`, the package
        import docker.types
        import requests.exceptions  # noqa: F401 - loaded here for engine_errors, under the same lock
    return docker


def engine_errors():
    """What the SDK raises when the engine fails or cannot be reached."""
    docker = docker_sdk()
    import requests.exceptions
    return docker.errors.DockerException, requests.exceptions.RequestException


def http_status(error):
    """The HTTP status of an engine error, or None."""
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None) or getattr(error, "status_code", None)
