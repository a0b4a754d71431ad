"""Access to the machine's real Docker engine, runner image and Debian Chromium for tests.
Owns the image tag, the Chromium path and launch flags, and the skip-or-fail rules of
`conftest.require`; any test module may import it (WebUI and Docker backend tests included)."""
import logging
import os
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import require

log = logging.getLogger(__name__)

RUNNER_IMAGE = os.environ.get("SUZUMIO_RUNNER_IMAGE", "suzumio-runner:dev")
CHROMIUM_PATH = "/usr/bin/chromium"
# Root needs --no-sandbox; the background-networking flags keep Chromium from dialling out of this
# closed network at every start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def docker_client_or_skip():
    """A Docker SDK client whose engine answers ping; skips (or fails under SUZUMIO_REQUIRE_DOCKER)."""
    try:
        import docker
    except ImportError as exc:
        require("docker")(f"the Docker SDK is not installed: {exc}")
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        require("docker")(f"no Docker engine answers (run scripts/start-dockerd): {exc}")
    return client


def runner_image_or_skip(client, tag=RUNNER_IMAGE):
    """The runner image `tag` from the engine; skips (or fails) when it was never built."""
    import docker

    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        require("docker")(f"runner image {tag} is missing (run scripts/build-runner-image {tag})")


@contextmanager
def chromium_browser():
    """Debian's Chromium launched headless through Playwright; skips (or fails) when it is absent."""
    if not os.access(CHROMIUM_PATH, os.X_OK):
        require("browser")(f"{CHROMIUM_PATH} is missing (run scripts/install-chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        require("browser")(f"Playwright for Python is not installed: {exc}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM_PATH, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def serve_pages(pages):
    """A real HTTP server on 127.0.0.1 and an ephemeral port serving {path: html}; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path)
            if body is None:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):
            log.debug("page server: " + fmt, *args)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="page-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
