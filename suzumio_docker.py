"""The Docker SDK as the container backends use it: imported on first use under one lock, the errors
an engine call raises, and the user a container or task runs as. Imported by suzumio_backend and
suzumio_backend_swarm, and by the evals' check sandbox (suzumio_eval_graders, suzumio_eval_runner,
suzumio_eval_cli); CLI commands that never start a container never import the SDK."""
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


UNPRIVILEGED_IDS = (65532, 65532)


def container_user(configured, host_uid, host_gid):
    """The `user` of an activation container: the configured one, else the controller's uid:gid, else
    (the controller is root) a fixed unprivileged uid:gid that then owns the agent's writable folders."""
    if configured:
        return configured
    if host_uid != 0:
        return f"{host_uid}:{host_gid}"
    return "{}:{}".format(*UNPRIVILEGED_IDS)


def numeric_ids(user):
    """(uid, gid) of a `uid` or `uid:gid` user, gid defaulting to uid; None for names (not resolvable
    on the host, so their folders cannot be handed over)."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        return None
    return int(uid), int(gid or uid)
