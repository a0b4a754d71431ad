"""Checks that the machine provides what the real-part tests need: a Docker engine, the runner image
with python3 >= 3.9, node >= 18, bash, git and curl (docs/design/runner.md), and Debian's Chromium
driven by Playwright. Skips only when a part is absent and its SUZUMIO_REQUIRE_* variable is unset."""
import base64
import logging
import re
from pathlib import Path

import pytest
from provisioning_fixtures import (
    RUNNER_IMAGE,
    chromium_browser,
    docker_client_or_skip,
    runner_image_or_skip,
    serve_pages,
)

log = logging.getLogger(__name__)

SCREENSHOTS = Path(__file__).parent / "screenshots"

PAGE = """<!doctype html>
<html><head><title>Suzumio provisioning</title>
<style>body { margin: 0; } #swatch { width: 200px; height: 100px; background: rgb(255, 0, 0); }</style>
</head><body>
<div id="swatch"></div>
<h1 id="greeting">rendered by Chromium</h1>
<button id="press" onclick="document.getElementById('count').textContent = String(++window.presses)">
press</button>
<p>presses: <span id="count">0</span></p>
<script>window.presses = 0;</script>
</body></html>
"""

# Decodes a PNG in the page itself and reads one pixel, so the test needs no image library.
PIXEL_AT = """async ([dataUrl, x, y]) => {
  const img = new Image();
  img.src = dataUrl;
  await img.decode();
  const canvas = document.createElement('canvas');
  canvas.width = img.width;
  canvas.height = img.height;
  const context = canvas.getContext('2d');
  context.drawImage(img, 0, 0);
  return {width: img.width, height: img.height, rgba: Array.from(context.getImageData(x, y, 1, 1).data)};
}"""


@pytest.fixture(scope="module")
def docker_client():
    client = docker_client_or_skip()
    yield client
    client.close()


@pytest.fixture(scope="module")
def runner_image(docker_client):
    return runner_image_or_skip(docker_client)


def run_in_runner_image(client, command):
    """Runs `bash -c command` in a throwaway runner container on the host network; returns its output."""
    # Engine 20.10 can drop a last output line that has no newline when the container exits at once.
    script = f"{command}\nstatus=$?\necho\nexit $status"
    output = client.containers.run(
        RUNNER_IMAGE, ["bash", "-c", script], remove=True, network_mode="host", stderr=True
    )
    return output.decode().strip()


def version_tuple(text):
    return tuple(int(part) for part in re.search(r"(\d+)\.(\d+)", text).groups())


@pytest.mark.docker
def test_docker_engine_answers_ping_and_reports_its_version(docker_client):
    assert docker_client.ping() is True
    version = docker_client.version()
    assert version["Version"]
    assert version_tuple(version["ApiVersion"]) >= (1, 41)


@pytest.mark.docker
def test_runner_image_has_python3_3_9_or_newer(docker_client, runner_image):
    output = run_in_runner_image(docker_client, "python3 -c 'import sys; print(sys.version.split()[0])'")
    assert version_tuple(output) >= (3, 9), output


@pytest.mark.docker
def test_runner_image_has_node_18_or_newer(docker_client, runner_image):
    output = run_in_runner_image(docker_client, "node --version")
    assert output.startswith("v"), output
    assert version_tuple(output[1:])[0] >= 18, output


@pytest.mark.docker
def test_runner_image_has_bash_git_curl_and_ca_certificates(docker_client, runner_image):
    output = run_in_runner_image(
        docker_client,
        'echo "bash $BASH_VERSION"; git --version; curl --version | head -n 1; '
        "test -s /etc/ssl/certs/ca-certificates.crt && echo certificates",
    )
    lines = output.splitlines()
    assert lines[0].startswith("bash 5."), output
    assert lines[1].startswith("git version 2."), output
    assert lines[2].startswith("curl "), output
    assert lines[3] == "certificates", output


@pytest.mark.docker
def test_runner_image_runs_as_root_with_empty_mount_points_and_no_entrypoint(docker_client, runner_image):
    output = run_in_runner_image(
        docker_client, "id -u; pwd; for d in /activation /workspace /opt/suzumio; do ls -A $d | wc -l; done"
    )
    assert output.splitlines() == ["0", "/workspace", "0", "0", "0"]
    assert not runner_image.attrs["Config"].get("Entrypoint")


@pytest.mark.docker
def test_runner_container_on_host_network_reaches_a_loopback_server(docker_client, runner_image):
    with serve_pages({"/ping": "pong from the host"}) as base_url:
        output = run_in_runner_image(docker_client, f"curl -fsS {base_url}/ping")
    assert output == "pong from the host"


@pytest.mark.browser
def test_chromium_renders_a_local_page_and_screenshots_it():
    SCREENSHOTS.mkdir(exist_ok=True)
    shot = SCREENSHOTS / "provisioning-chromium.png"
    shot.unlink(missing_ok=True)
    with serve_pages({"/": PAGE}) as base_url, chromium_browser() as browser:
        page = browser.new_page(viewport={"width": 640, "height": 360})
        response = page.goto(f"{base_url}/")
        assert response.status == 200
        assert page.title() == "Suzumio provisioning"
        assert page.text_content("#greeting") == "rendered by Chromium"
        png = page.screenshot(path=str(shot))
        data_url = "data:image/png;base64," + base64.b64encode(png).decode()
        pixel = page.evaluate(PIXEL_AT, [data_url, 100, 50])
    assert shot.read_bytes() == png
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert (pixel["width"], pixel["height"]) == (640, 360)
    assert pixel["rgba"] == [255, 0, 0, 255]


@pytest.mark.browser
def test_chromium_runs_page_scripts_when_a_button_is_clicked():
    with serve_pages({"/": PAGE}) as base_url, chromium_browser() as browser:
        page = browser.new_page()
        page.goto(f"{base_url}/")
        page.click("#press")
        page.click("#press")
        assert page.text_content("#count") == "2"
