"""Credentials and idempotency keys added at the egress proxy
(docs/operations.md#what-an-agent-can-do-to-the-outside-world): the grammar of a mapping entry and what
`config render` says; then a fake HTTPS service with a CA of the test's own that wants a bearer token,
reached through the real proxy (by hand over its socket, and from a real runner's curl and web.fetch on
local and docker-chat). The token must reach the service and nothing the agent can see: no variable,
file, process argument or recorded exchange holds it, an answer that echoes it shows it masked, and a
host without credentials is a plain tunnel."""
import http.server
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
import yaml
from api_fixtures import init_project, project_yaml, running_activation, serving
from e2e_fixtures import call, kind_params, project_config, served_team

import suzumio_config
import suzumio_egress as egress
import suzumio_egress_policy as policy
import suzumio_egress_tls

pytestmark = pytest.mark.timeout(300)

TOKEN = "tok-7f3c9e1a55d04b2e9c1d"  # the test's secret: searched for everywhere afterwards
TOKEN_ENV = "EXAMPLE_TOKEN"
NAMES = {"api.test": ["127.0.0.1"], "plain.test": ["127.0.0.1"], "pay.test": ["127.0.0.1"]}


# ---------------------------------------------------------------- the grammar

def test_mapping_entries_parse_and_bad_ones_name_the_key():
    rule = policy.parse_host_rule({"host": "API.example.com", "credentials": {
        "header": "Authorization", "valueEnv": TOKEN_ENV, "scheme": "Bearer"}})
    assert rule == policy.HostRule("api.example.com", None, policy.Credential(TOKEN_ENV, "Authorization", None,
                                                                               "Bearer"))
    query = policy.parse_host_rule({"host": "q.example.com", "port": 8443,
                                    "credentials": {"query": "key", "valueEnv": "Q"}})
    assert (query.text, query.credential.query, query.credential.scheme) == ("q.example.com:8443", "key", "none")
    assert policy.parse_host_rule({"host": "pay.example.com", "idempotencyKey": True}).intercepted
    assert not policy.parse_host_rule({"host": "plain.example.com"}).intercepted
    for entry, message in (
            ({"host": "a.example", "credentials": {"header": "X", "query": "y", "valueEnv": "V"}},
             "credentials: give exactly one of header and query"),
            ({"host": "a.example", "credentials": {"header": "X", "valueEnv": "V", "scheme": "Digest"}},
             "credentials.scheme: expected one of Bearer, Basic, none"),
            ({"host": "a.example", "credentials": {"header": "X", "value": "secret", "valueEnv": "V"}},
             "credentials.value: unknown key"),
            ({"host": "a.example", "port": 0}, "port: expected an integer 1-65535"),
            ({"credentials": {}}, "host: expected a host name")):
        with pytest.raises(ValueError, match=message):
            policy.parse_host_rule(entry)


def test_config_render_names_each_credential_but_never_its_value(tmp_path, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    text = """\
name: demo
task: t
agents:
  worker:
    tools: [shell.exec]
    egress:
      - {host: api.example.com, credentials: {header: Authorization, valueEnv: EXAMPLE_TOKEN, scheme: Bearer}}
      - {host: pay.example.com, idempotencyKey: true}
      - github.com
      - {host: bad.example.com, credentials: {header: Authorization, valueEnv: "no good"}}
tools: {toolpacks: [core, shell]}
backend:
  kind: local
  runner:
    model: offline
    models:
      providers: {replay: {type: scripted, script: {agents: {}}}}
      presets: {offline: {provider: replay, model: team}}
"""
    path = tmp_path / "project.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(Exception, match=r"agents\.worker\.egress\.3\.credentials\.valueEnv: expected the name"):
        suzumio_config.load_project(path, env={})
    path.write_text(text.replace('valueEnv: "no good"', "valueEnv: OTHER"), encoding="utf-8")
    config = suzumio_config.load_project(path, env={})
    [line] = [line for line in config.network_report() if line.startswith("Egress:")]
    assert line == ("Egress: worker may reach api.example.com [credential Authorization: Bearer from $EXAMPLE_TOKEN "
                    "added by the proxy], pay.example.com [Idempotency-Key added by the proxy], github.com, "
                    "bad.example.com [credential Authorization: from $OTHER added by the proxy] "
                    "(agents.worker.egress)")
    assert TOKEN not in config.render() and TOKEN not in "\n".join(config.network_report())


def test_a_masker_hides_a_secret_split_across_pieces():
    masker = suzumio_egress_tls.Masker([b"Bearer abc", b"abc"])
    out = masker.feed(b"xx Bear") + masker.feed(b"er a") + masker.feed(b"bc yy abc") + masker.end()
    assert out == b"xx ********** yy ***" and masker.masked == 2


# ---------------------------------------------------------------- a fake HTTPS service

def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def service_ca(tmp_path_factory):
    """A CA of the test's own and a certificate for the fake service's names (none of them real)."""
    folder = tmp_path_factory.mktemp("service-ca")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=test service CA", "-keyout", str(folder / "ca-key.pem"), "-out", str(folder / "ca.pem"),
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    (folder / "ext").write_text("subjectAltName=DNS:api.test,DNS:plain.test,DNS:pay.test,IP:127.0.0.1\n"
                                "extendedKeyUsage=serverAuth\n", encoding="utf-8")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=api.test",
            "-keyout", str(folder / "key.pem"), "-out", str(folder / "csr.pem"))
    openssl("x509", "-req", "-in", str(folder / "csr.pem"), "-CA", str(folder / "ca.pem"), "-CAkey",
            str(folder / "ca-key.pem"), "-CAcreateserial", "-days", "2", "-extfile", str(folder / "ext"),
            "-out", str(folder / "cert.pem"))
    return folder


class FakeService:
    """An HTTPS server that wants `Authorization: Bearer TOKEN` on /api (401 otherwise), echoes the
    header on /echo, and records every request's path and headers."""

    def __init__(self, folder):
        seen = self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                             "body": body.decode()})
                authorized = self.headers.get("Authorization") == f"Bearer {TOKEN}"
                if self.path.startswith("/echo"):
                    status, text = 200, f"you sent: {self.headers.get('Authorization')}\n"
                elif self.path.startswith("/api") or self.path.startswith("/charge"):
                    status, text = (200, "welcome\n") if authorized or self.path.startswith("/charge") else (
                        401, "token required\n")
                else:
                    status, text = 200, "plain\n"
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(folder / "cert.pem"), str(folder / "key.pem"))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-https", daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def fake_service(service_ca):
    server = FakeService(service_ca)
    yield server
    server.close()


def resolver(host, port):
    if host not in NAMES:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return [ipaddress.ip_address(a) for a in NAMES[host]]


def egress_entries(port):
    return [{"host": "api.test", "credentials": {"header": "Authorization", "valueEnv": TOKEN_ENV,
                                                 "scheme": "Bearer"}},
            {"host": "pay.test", "idempotencyKey": True}, "plain.test", "127.0.0.1"]


# ---------------------------------------------------------------- through the proxy, by hand

def tunnel(socket_path, who, host, port):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(socket_path))
    sock.sendall(f"SUZUMIO-EGRESS/1 {who[0]} {who[1]} {who[2]}\n".encode()
                 + f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(1)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    return sock


def https_get(sock, host, cadata, path, method="GET", body=b""):
    context = ssl.create_default_context(cadata=cadata)
    with context.wrap_socket(sock, server_hostname=host) as tls:
        cert = tls.getpeercert()
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        tls.sendall(head.encode() + body)
        data = b""
        while True:
            chunk = tls.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode(), cert


def test_the_proxy_adds_the_credential_and_the_call_key_and_masks_echoes(tmp_path, fake_service, service_ca):
    environ = {TOKEN_ENV: TOKEN}
    with serving(tmp_path / "root", resolver=resolver, egress_environ=environ,
                 egress_cafile=str(service_ca / "ca.pem")) as service:
        text = project_yaml("demo", service.base_url)
        data = yaml.safe_load(text)
        data["agents"]["worker"]["egress"] = egress_entries(fake_service.port)
        store = init_project(service.root, tmp_path / "demo", yaml.safe_dump(data))
        store.start()
        activation = running_activation(store, "worker")["id"]
        token = store.agent("worker", include_token=True)["token"]
        who = ("demo", activation, token)
        path = Path(service.runner_socket).parent / egress.EGRESS_SOCKET
        project_ca = suzumio_egress_tls.project_ca_pem(service.root.path, "demo")

        answer, cert = https_get(tunnel(path, who, "api.test", fake_service.port), "api.test", project_ca, "/api/me")
        assert answer.startswith("HTTP/1.1 200") and answer.endswith("welcome\n")
        assert dict(x[0] for x in cert["issuer"])["commonName"] == "Suzumio egress CA demo"
        echoed, _ = https_get(tunnel(path, who, "api.test", fake_service.port), "api.test", project_ca, "/echo")
        assert "you sent: " + "*" * len(f"Bearer {TOKEN}") in echoed and TOKEN not in echoed
        assert fake_service.seen[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"
        assert "Idempotency-Key" not in fake_service.seen[0]["headers"]

        # The running tool call's key, the same when the runner asks its start again.
        start = {"project": "demo", "agentId": "worker", "activationId": activation, "token": token,
                 "tool": "shell.exec", "input": {"command": "curl -X POST https://pay.test/charge"}, "callKey": "ck-1"}
        first = service.post("/runner/tool-calls/start", start).json()
        https_get(tunnel(path, who, "pay.test", fake_service.port), "pay.test", project_ca, "/charge", "POST", b"a=1")
        again = service.post("/runner/tool-calls/start", start).json()
        assert again["toolCallId"] == first["toolCallId"]
        https_get(tunnel(path, who, "pay.test", fake_service.port), "pay.test", project_ca, "/charge", "POST", b"a=1")
        charges = [r for r in fake_service.seen if r["path"] == "/charge"]
        assert [(r["headers"].get("Idempotency-Key"), r["body"]) for r in charges] == [("ck-1", "a=1")] * 2
        assert "Authorization" not in charges[0]["headers"]

        # A host without credentials: a plain tunnel, the service's own certificate.
        plain, cert = https_get(tunnel(path, who, "plain.test", fake_service.port), "plain.test",
                                (service_ca / "ca.pem").read_text(), "/")
        assert plain.endswith("plain\n") and dict(x[0] for x in cert["issuer"])["commonName"] == "test service CA"
        assert "Authorization" not in fake_service.seen[-1]["headers"]

        # No value in the controller's environment: refused, and said why (the name only).
        environ.pop(TOKEN_ENV)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        sock.sendall(f"SUZUMIO-EGRESS/1 demo {activation} {token}\n".encode()
                     + f"CONNECT api.test:{fake_service.port} HTTP/1.1\r\n\r\n".encode())
        missing = sock.makefile("rb").read().decode()
        sock.close()
        assert missing.startswith("HTTP/1.1 502 egress credential missing") and "$EXAMPLE_TOKEN" in missing

        events = [json.loads(e["data_json"]) for e in store.list_events(1000) if e["type"] == "egress.allowed"]
    credentialed = [e for e in events if e.get("credential") == TOKEN_ENV]
    assert [(e.get("request"), e.get("status"), e.get("masked")) for e in reversed(credentialed)] == [
        ("GET /api/me HTTP/1.1", 200, None), ("GET /echo HTTP/1.1", 200, 1), (None, None, None)]
    keyed = [e for e in events if e.get("idempotencyKey")]
    assert [e["idempotencyKey"] for e in keyed] == ["ck-1", "ck-1"]
    assert not any("intercepted" in e for e in events if e["host"] == "plain.test")
    assert TOKEN not in json.dumps(events)
    assert_token_nowhere(tmp_path / "root")


def assert_token_nowhere(folder):
    """Every file under `folder` (the root: projects, their databases and WAL, logs) without the token."""
    for path in Path(folder).rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- from a real sandbox

def curl(url, *flags):
    options = " ".join(flags)
    return f"curl -sS {options} -w ' %{{http_code}}\\n' '{url}' 2>&1 || echo \" exit $?\""


@pytest.mark.parametrize("kind", kind_params())
def test_an_agents_curl_and_web_fetch_get_through_with_a_token_they_never_hold(tmp_path, fake_service, service_ca,
                                                                                kind):
    port = fake_service.port
    agents = {"pm": {"model": "worker", "tools": ["messages.send"]},
              "worker": {"model": "worker", "tools": ["messages.send", "shell.exec", "web.fetch"],
                         "egress": egress_entries(port)}}

    def make_config(service, model):
        config = project_config(kind, None, model.base_url, agents=agents,
                                presets={"worker": {"provider": "fake", "model": "worker"}}, model="worker")
        return config

    service_pem = (service_ca / "ca.pem").read_text()
    # What the sandbox holds goes where the test searches it (the root): every process's arguments and
    # environment, this shell's variables and the files the runner wrote to /tmp. The command itself never
    # names the token, or its own arguments would.
    search = ("mkdir -p scan; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' "
              "> scan/procs.txt; env | tee scan/env.txt; cp -r /tmp/suzumio-trust-* scan/ 2>/dev/null; echo scanned")
    commands = [curl(f"https://api.test:{port}/api/me"), curl(f"https://api.test:{port}/echo"),
                curl(f"https://plain.test:{port}/"),
                f"printf '%s' '{service_pem}' > /tmp/service-ca.pem",
                curl(f"https://plain.test:{port}/", "--cacert /tmp/service-ca.pem"),
                curl(f"https://pay.test:{port}/charge", "-X POST -d amount=5"), 'echo "key=$SUZUMIO_CALL_KEY"',
                search]
    with served_team(tmp_path, kind, make_config, resolver=resolver, egress_environ={TOKEN_ENV: TOKEN},
                     egress_cafile=str(service_ca / "ca.pem")) as team:
        team.model.enqueue(tool_calls=[call("shell.exec", command="; ".join(commands)),
                                       call("web.fetch", url=f"https://api.test:{port}/api/me")], model="worker")
        team.model.enqueue(content="Checked.", model="worker")
        team.send("worker", "Check the API.")
        [activation] = team.wait_activations("worker", 1)
        assert activation["status"] == "completed", team.describe()
        shell, fetched = team.tool_messages("worker")[-2:]
        effects = team.service.get(f"/api/projects/{team.store.project_id}/effects").json()
        requests_seen = list(fake_service.seen)
    out = shell
    assert "welcome\n 200" in out  # curl with the proxy's credential
    assert "you sent: " + "*" * len(f"Bearer {TOKEN}") + "\n 200" in out
    assert "exit 60" in out  # plain.test: the service's own certificate, which the sandbox does not trust
    assert "plain\n 200" in out  # ... and with the service's CA, the real certificate verifies
    [effect] = [e for e in effects if e["tool"] == "shell.exec"]
    assert f"key={effect['callKey']}" in out and effect["state"] == "done"
    [charge] = [r for r in requests_seen if r["path"] == "/charge"]
    assert charge["headers"]["Idempotency-Key"] == effect["callKey"]
    assert "SSL_CERT_FILE=" in out and f"{TOKEN_ENV}=" not in out and "scanned" in out
    assert TOKEN not in out
    [procs] = (tmp_path / "root").rglob("scan/procs.txt")
    assert "SUZUMIO_CALL_KEY" in procs.read_text(errors="replace")  # the shell's own environment was read
    assert list(procs.parent.glob("suzumio-trust-*/ca-bundle.pem"))
    assert fetched == "welcome\n"  # a 200: the body as it came, no status line
    assert [r["headers"].get("Authorization") for r in requests_seen if r["path"] == "/api/me"] == \
        [f"Bearer {TOKEN}"] * 2
    assert_token_nowhere(tmp_path / "root")
    assert os.environ.get(TOKEN_ENV) != TOKEN
