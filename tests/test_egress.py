"""Egress through the controller (docs/operations.md#egress): the allowlist grammar and decisions, and,
with the real controller, the real runner (in the real runner image on docker-chat) and curl in
shell.exec, connections out through the forwarder and the egress proxy: allowed ones reach a real
upstream server, refused ones get the refusal text, and each is one audited event. Names resolve
through a resolver injected into the proxy (a name that resolves to a private address is a fault the
machine's own DNS cannot be made to produce); every other part is real."""
import http.server
import ipaddress
import json
import os
import socket
import threading

import pytest
from e2e_fixtures import call, kind_params
from test_sandbox import agent, sandbox_team

import suzumio
import suzumio_coordination as coordination
import suzumio_egress as egress
import suzumio_egress_policy as policy

pytestmark = pytest.mark.timeout(300)

BODY = b"hello from upstream\n"


class Upstream:
    """A real HTTP server on the host's loopback standing for a site on the internet."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                self.wfile.write(BODY)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="test-upstream", daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def names_resolver(names):
    """Resolution as the controller would see it for the test's names; any other name does not exist."""
    def resolve(host, port):
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ipaddress.ip_address(address) for address in names[host]]
    return resolve


@pytest.fixture
def upstream():
    server = Upstream()
    yield server
    server.close()


# ---------------------------------------------------------------- the grammar and the decision

def addr(text):
    return ipaddress.ip_address(text)


def test_entries_parse_to_their_kinds_and_bad_ones_say_why():
    assert policy.parse_entry("Example.COM") == policy.Entry("host", "example.com")
    assert policy.parse_entry("example.com:443") == policy.Entry("host", "example.com", 443)
    assert policy.parse_entry("*.example.com") == policy.Entry("domain", "example.com")
    assert policy.parse_entry("10.0.0.0/8") == policy.Entry("network", ipaddress.ip_network("10.0.0.0/8"))
    assert policy.parse_entry("[::1]:8080") == policy.Entry("address", addr("::1"), 8080)
    assert policy.parse_entry("public") == policy.Entry("public")
    for text, message in [("", "expected host"), ("a b", "invalid host name"), ("::/0", "names every address"),
                          ("h:0", "invalid port"), ("h:x", "invalid port"), ("1.2.3.0/33", "invalid CIDR")]:
        with pytest.raises(ValueError, match=message):
            policy.parse_entry(text)


def test_names_let_only_public_addresses_through_and_exact_addresses_open_private_ones():
    rules = policy.Allowlist(["api.example.com:443", "*.example.org", "127.0.0.1:8080", "10.1.0.0/16"])
    assert rules.names_host("api.example.com", 443) and not rules.names_host("api.example.com", 80)
    assert rules.names_host("a.b.example.org", 80) and not rules.names_host("example.org", 80)
    assert not rules.names_host("evil-example.org", 80)
    assert rules.names_address(addr("127.0.0.1"), 8080) and not rules.names_address(addr("127.0.0.1"), 8081)
    assert rules.names_address(addr("10.1.2.3"), 22) and not rules.names_address(addr("10.2.0.1"), 22)
    assert policy.Allowlist(["public"]).names_host("anything.example", 1)
    for private in ("127.0.0.1", "10.0.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "::1", "fd00::1",
                    "0.0.0.0", "224.0.0.1"):
        assert not policy.is_public(addr(private)), private
    assert policy.is_public(addr("93.184.216.34")) and policy.is_public(addr("2606:4700::1111"))
    assert policy.ip_or_none("::ffff:127.0.0.1") == addr("127.0.0.1")


def test_the_refusal_text_names_the_setting_to_change():
    assert policy.refusal("example.com", 443, "pm") == (
        "egress to example.com:443 is not allowed for pm; add it to agents.pm.egress")


# ---------------------------------------------------------------- through the sandbox

def curl(url, *flags):
    """A curl line printing `<status> <CONNECT status> <bytes>` and the body on the next line."""
    options = " ".join(flags)
    return (f"curl -sS {options} -o /tmp/body -w '%{{http_code}} %{{http_connect}} %{{size_download}}\\n' "
            f"'{url}' 2>/dev/null; cat /tmp/body 2>/dev/null; rm -f /tmp/body")


def shell_and_fetches(team, agent_id, commands, fetches):
    """One activation of `agent_id`: a shell.exec of `commands`, then a web.fetch of each URL; returns
    (the shell's stdout, the web.fetch results as the model read them)."""
    calls = [call("shell.exec", command="; ".join(commands))] + [call("web.fetch", url=url) for url in fetches]
    team.model.enqueue(tool_calls=calls, model="worker")
    team.model.enqueue(content="Checked.", model="worker")
    before = len(team.tool_messages("worker"))
    count = len(team.activations(agent_id))
    team.send(agent_id, "Run the check.")
    activation = team.wait_activations(agent_id, count + 1)[-1]
    assert activation["status"] == "completed", team.describe()
    results = team.tool_messages("worker")[before:]
    shell = results[0]
    assert "\n[exit code " not in shell and "\n[killed by " not in shell, shell  # it exited 0
    stdout = shell.split("[stdout]\n", 1)[1].split("\n[stderr]", 1)[0]
    return activation, stdout, results[1:]


def egress_events(team, activation_id):
    return [(event["type"], event["data"]) for event in team.events("egress.allowed") + team.events("egress.denied")
            if event["data"]["activation"] == activation_id]


@pytest.mark.parametrize("kind", kind_params())
def test_an_allowlisted_host_is_reached_through_the_proxy_and_everything_else_is_refused_and_audited(
        tmp_path, upstream, kind):
    names = {"upstream.test": ["127.0.0.1"]}
    agents = {"pm": agent(), "listed": agent("web.fetch", egress=["127.0.0.1"])}
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), kind=kind) as team:
        api_port = team.service.port
        commands = ["echo $(ls /sys/class/net)", 'echo "$http_proxy $HTTPS_PROXY $NO_PROXY"',
                    curl(f"http://upstream.test:{upstream.port}/plain"),
                    curl(f"http://upstream.test:{upstream.port}/tunnel", "-p"),
                    curl("http://unlisted.test/"),
                    curl(f"http://upstream.test:{api_port}/health")]
        activation, stdout, fetched = shell_and_fetches(
            team, "listed", commands, [f"http://upstream.test:{upstream.port}/fetched", "http://unlisted.test/x"])
        events = egress_events(team, activation["id"])
    lines = stdout.splitlines()
    if kind == "docker-chat":
        assert lines.pop(0) == "lo", "the container's only interface is the loopback"
    else:
        lines.pop(0)
    proxy, https_proxy, no_proxy = lines.pop(0).split()
    assert proxy == https_proxy and proxy.startswith("http://127.0.0.1:") and no_proxy == "localhost,127.0.0.1,::1"
    refusal = "egress to unlisted.test:80 is not allowed for listed; add it to agents.listed.egress"
    own = f"egress to upstream.test:{api_port} is not allowed for listed; add it to agents.listed.egress"
    assert lines == [f"200 000 {len(BODY)}", BODY.decode().strip(),
                     f"200 200 {len(BODY)}", BODY.decode().strip(),
                     f"403 000 {len(refusal) + 1}", refusal,
                     f"403 000 {len(own) + 1}", own]
    assert fetched[0] == BODY.decode()  # a 200: the body as it came, no status line
    assert refusal in fetched[1]
    allowed = [data for kind_, data in events if kind_ == "egress.allowed"]
    denied = [data for kind_, data in events if kind_ == "egress.denied"]
    assert sorted(d["method"] for d in allowed) == ["CONNECT", "GET", "GET"]
    for data in allowed:
        assert (data["agent"], data["host"], data["port"], data["address"]) == (
            "listed", "upstream.test", upstream.port, "127.0.0.1")
        assert data["bytesIn"] > len(BODY) and data["bytesOut"] > 0 and data["durationMs"] >= 0
        assert "error" not in data
    assert sorted((d["host"], d["port"]) for d in denied) == [
        ("unlisted.test", 80), ("unlisted.test", 80), ("upstream.test", api_port)]
    assert {d["reason"] for d in denied} == {refusal, own}
    assert all(d["bytesIn"] == d["bytesOut"] == 0 for d in denied)
    assert sorted((d["host"], d["address"]) for d in denied) == [
        ("unlisted.test", None), ("unlisted.test", None), ("upstream.test", "127.0.0.1")]


@pytest.mark.parametrize("kind", kind_params())
def test_public_refuses_metadata_loopback_and_names_that_resolve_to_private_addresses(tmp_path, upstream, kind):
    names = {"upstream.test": ["127.0.0.1"], "private.test": ["10.1.2.3"], "rebound.test": ["169.254.169.254"]}
    agents = {"pm": agent(), "open": agent("web.fetch")}  # web.fetch, no egress written: [public]
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), kind=kind) as team:
        commands = [curl("http://169.254.169.254/latest/meta-data/", "--noproxy ''"),
                    curl(f"http://127.0.0.1:{upstream.port}/", "--noproxy ''"),
                    curl(f"http://upstream.test:{upstream.port}/"),
                    curl("http://private.test/"),
                    curl("https://rebound.test/")]
        activation, stdout, fetched = shell_and_fetches(
            team, "open", commands, ["http://169.254.169.254/latest/meta-data/", "https://private.test/"])
        events = egress_events(team, activation["id"])

    def refused(host, port):
        return f"egress to {host}:{port} is not allowed for open; add it to agents.open.egress"

    lines = stdout.splitlines()
    for host, port in [("169.254.169.254", 80), ("127.0.0.1", upstream.port), ("upstream.test", upstream.port),
                       ("private.test", 80)]:
        assert lines.pop(0).startswith("403 000 ") and lines.pop(0) == refused(host, port)
    assert lines.pop(0).startswith("000 403 "), "CONNECT to a name that resolves to the metadata address"
    assert refused("169.254.169.254", 80) in fetched[0]
    assert refused("private.test", 443) in fetched[1]
    assert [kind_ for kind_, _ in events] == ["egress.denied"] * 7
    assert {(d["host"], d["port"], d["address"]) for _, d in events} == {
        ("169.254.169.254", 80, "169.254.169.254"), ("127.0.0.1", upstream.port, "127.0.0.1"),
        ("upstream.test", upstream.port, "127.0.0.1"), ("private.test", 80, "10.1.2.3"),
        ("rebound.test", 443, "169.254.169.254"), ("private.test", 443, "10.1.2.3")}


def test_status_shows_egress_totals_per_agent(tmp_path, upstream, capsys):
    names = {"upstream.test": ["127.0.0.1"]}
    agents = {"pm": agent(), "listed": agent(egress=[f"127.0.0.1:{upstream.port}"])}
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), kind="local") as team:
        shell_and_fetches(team, "listed", [curl(f"http://upstream.test:{upstream.port}/"), curl("http://nope.test/")],
                          [])
        root = str(team.service.root.path)
        assert suzumio.main(["status", "e2e", "--root", root, "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        assert suzumio.main(["status", "e2e", "--root", root]) == 0
        text = capsys.readouterr().out
    listed = next(a for a in document[0]["agents"] if a["id"] == "listed")
    assert listed["egress"]["connections"] == 1 and listed["egress"]["denied"] == 1
    assert listed["egress"]["bytesIn"] > len(BODY) and listed["egress"]["bytesOut"] > 0
    pm = next(a for a in document[0]["agents"] if a["id"] == "pm")
    assert pm["egress"] == {"connections": 0, "denied": 0, "bytesIn": 0, "bytesOut": 0}
    row = next(line for line in text.splitlines() if line.strip().startswith("listed"))
    assert "egress 1 out, 1 denied" in row


def test_the_control_room_shows_each_agents_egress_totals(tmp_path, upstream):
    from playwright.sync_api import expect
    from provisioning_fixtures import chromium_browser
    from test_webui import SCREENSHOTS

    names = {"upstream.test": ["127.0.0.1"]}
    agents = {"pm": agent(), "listed": agent(egress=[f"127.0.0.1:{upstream.port}"])}
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), kind="local") as team, \
            chromium_browser() as browser:
        shell_and_fetches(team, "listed", [curl(f"http://upstream.test:{upstream.port}/"), curl("http://nope.test/")],
                          [])
        totals = team.store.egress_totals()["listed"]
        token = team.service.auth_headers["Authorization"].split(" ", 1)[1]
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(f"{team.service.base_url}/?token={token}#/{team.name}/overview")
        card = page.get_by_test_id("agent-card").filter(has_text="listed")
        size = totals["bytesIn"] + totals["bytesOut"]
        expect(card.get_by_test_id("agent-egress")).to_have_text(f"egress 1 out, 1 denied, {size} B", timeout=10000)
        expect(page.get_by_test_id("agent-egress")).to_have_count(1)  # pm made no connection
        expect(page.get_by_test_id("metric-egress")).to_contain_text(f"1 denied, {size} B through the controller")
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "egress-overview.png"))


def test_limits_cap_an_activations_connections_and_bytes(tmp_path, upstream):
    names = {"upstream.test": ["127.0.0.1"]}
    entry = f"127.0.0.1:{upstream.port}"
    agents = {"pm": agent(), "few": agent(egress=[entry], egressLimits={"connections": 2}),
              "small": agent(egress=[entry], egressLimits={"bytes": 100})}
    url = f"http://upstream.test:{upstream.port}/"
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), kind="local") as team:
        _, few, _ = shell_and_fetches(team, "few", [curl(url), curl(url), curl(url)], [])
        _, again, _ = shell_and_fetches(team, "few", [curl(url)], [])  # counted per activation
        _, small, _ = shell_and_fetches(team, "small", [curl(url)], [])
        denied = [event["data"] for event in team.events("egress.denied")]
        allowed = [event["data"] for event in team.events("egress.allowed") if event["data"]["agent"] == "small"]
    limit = "egress connection limit (2) reached for few; raise agents.few.egressLimits.connections"
    assert few.splitlines()[::2] == [f"200 000 {len(BODY)}", f"200 000 {len(BODY)}", f"429 000 {len(limit) + 1}"]
    assert few.splitlines()[-1] == limit
    assert again.splitlines()[0] == f"200 000 {len(BODY)}"
    assert [(d["agent"], d["reason"]) for d in denied] == [("few", limit)]
    # The request alone is under 100 bytes; the answer takes the activation over: the tunnel is cut.
    assert not small.startswith("200 000 20")
    [cut] = allowed
    assert cut["error"] == "byte limit reached" and cut["bytesIn"] < len(BODY) + 200


def plain_answer(address, data):
    """What a TCP listener answers `data` sent in clear (b"" when it resets the connection)."""
    with socket.create_connection(address, timeout=10) as plain:
        plain.sendall(data)
        try:
            with plain.makefile("rb") as reader:
                return reader.read()
        except ConnectionResetError:
            return b""


def test_the_egress_tunnel_is_tls_to_the_runner_listener_and_a_plain_one_is_dropped(tmp_path, upstream):
    names = {"upstream.test": ["127.0.0.1"]}
    agents = {"pm": agent(), "listed": agent(egress=[f"127.0.0.1:{upstream.port}"])}
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), kind="local",
                      runner_listen=("127.0.0.1", 0)) as team:
        activation, stdout, _ = shell_and_fetches(team, "listed", [curl(f"http://upstream.test:{upstream.port}/")], [])
        given = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())["egress"]
        token = team.store.agent("listed", include_token=True)["token"]
        # The same preamble in clear to the runner listener: no TLS handshake, so nothing behind it reads it.
        answer = plain_answer(("127.0.0.1", team.service.runner_server.port),
                              f"SUZUMIO-EGRESS/1 {team.name} {activation['id']} {token}\n".encode()
                              + b"GET http://upstream.test/ HTTP/1.1\r\nHost: upstream.test\r\n\r\n")
        events = egress_events(team, activation["id"])
    assert given == f"tls://127.0.0.1:{team.service.runner_server.port}"
    assert stdout.splitlines() == [f"200 000 {len(BODY)}", BODY.decode().strip()]
    assert not answer.startswith(b"HTTP/")
    assert [kind_ for kind_, _ in events] == ["egress.allowed"]


def test_docker_chat_under_a_tls_runner_listener_has_only_loopback_and_the_runner_socket(tmp_path, upstream):
    names = {"upstream.test": ["127.0.0.1"]}
    agents = {"pm": agent(), "listed": agent(egress=[f"127.0.0.1:{upstream.port}"])}
    with sandbox_team(tmp_path, agents, resolver=names_resolver(names), runner_listen=("127.0.0.1", 0)) as team:
        commands = ["ls /sys/class/net", curl(f"http://upstream.test:{upstream.port}/")]
        activation, stdout, _ = shell_and_fetches(team, "listed", commands, [])
        given = json.loads((team.store.activation_dir(activation["id"]) / "input.json").read_text())
    assert stdout.splitlines() == ["lo", f"200 000 {len(BODY)}", BODY.decode().strip()]
    assert given["controllerUrl"].startswith("unix:///") and given["egress"].startswith("unix:///")
    assert "controllerCa" not in given


def test_a_tunnel_needs_a_running_activations_token_and_the_proxy_joins_its_threads(tmp_path):
    from api_fixtures import init_project, project_yaml, running_activation, serving

    with serving(tmp_path / "root") as service:
        store = init_project(service.root, tmp_path / "demo", project_yaml("demo", service.base_url))
        store.start()
        activation = running_activation(store, "worker")
        token = store.agent("worker", include_token=True)["token"]
        path = os.path.join(os.path.dirname(service.runner_socket), egress.EGRESS_SOCKET)

        def tunnel(activation_id, given):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(path)
                sock.sendall(f"SUZUMIO-EGRESS/1 demo {activation_id} {given}\n".encode()
                             + b"GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\n\r\n")
                return sock.makefile("rb").read().decode()

        forged = tunnel(activation["id"], "not-the-token")
        unknown = tunnel("act_missing", token)
        listed = tunnel(activation["id"], token)  # the worker's egress is empty: refused and audited
        coordination.cancel_activation(store, activation["id"], "over")
        ended = tunnel(activation["id"], token)
        events = [json.loads(e["data_json"]) for e in store.list_events(1000) if e["type"].startswith("egress.")]
        threads = [t.name for t in threading.enumerate() if t.name.startswith("suzumio-egress")]
    assert forged.startswith("HTTP/1.1 403 egress tunnel not authorized\r\n") and "Invalid agent token" in forged
    assert unknown.startswith("HTTP/1.1 403 egress tunnel not authorized\r\n")
    assert "Activation " in ended and "is cancelled" in ended
    refusal = "egress to example.test:80 is not allowed for worker; add it to agents.worker.egress"
    assert listed.startswith(f"HTTP/1.1 403 {refusal}\r\n") and listed.endswith(refusal + "\n")
    assert [(e["agent"], e["activation"], e["reason"]) for e in events] == [("worker", activation["id"], refusal)]
    assert threads and not [t for t in threading.enumerate() if t.name.startswith("suzumio-egress")]
