"""TLS for the runner listener on TCP (`serve --runner-listen HOST:PORT`).

The runner routes stay a plain WSGI app on Waitress, bound to a Unix socket in a private folder of the
root; TlsFront accepts TLS on HOST:PORT and relays each connection's bytes to that socket (or, when
the client chose the egress ALPN protocol, to the egress proxy's socket), so nothing on the network
ever speaks plain HTTP to the runner routes or a plain tunnel to the proxy. The certificate is the operator's (cert,
key and the CA runners verify it against), or a CA and server certificate created in `<root>/tls/` on
first start with the `openssl` command (Python's standard library cannot issue certificates; see
docs/spec-notes.md#tls-certificates-come-from-the-openssl-command). Runners get the CA with their activation."""

import ipaddress
import logging
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

from suzumio_errors import SuzumioError
from suzumio_runner_egress import ALPN_EGRESS, relay_tls

log = logging.getLogger("suzumio.tls")

TLS_DIR = "tls"
CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
CERT_FILE = "server.pem"
KEY_FILE = "server-key.pem"
NAMES_FILE = "server.names"
PUBLISHED_CA_FILE = "runner-ca.pem"  # the CA of the listener serving now, for activations CLI commands start
CA_DAYS = 3650
CERT_DAYS = 825
OPENSSL_TIMEOUT_S = 60
HANDSHAKE_TIMEOUT_S = 10
ALPN_HTTP = "http/1.1"
RELAY_LIMIT = 1024  # connections relayed at once; more are closed at once
ACCEPT_BACKOFF_S = 0.1
# Names every generated certificate carries: runners on this host and in its containers.
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1", "host.docker.internal")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class RunnerTls:
    """The server certificate and key files, and the CA (PEM text) runners verify them against."""

    def __init__(self, cert_file, key_file, ca_pem):
        self.cert_file = str(cert_file)
        self.key_file = str(key_file)
        self.ca_pem = ca_pem

    def server_context(self):
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise SuzumioError(f"Cannot load the runner listener's certificate {self.cert_file}: {error}") from None
        return context


def certificate_names(host):
    """The names a generated server certificate carries for a listener on `host`."""
    names = list(LOCAL_NAMES)
    extra = [socket.gethostname()]
    if host not in WILDCARD_HOSTS:
        extra.insert(0, host)
    for name in extra:
        if name and name not in names:
            names.append(name)
    return names


def subject_alt_names(names):
    entries = []
    for name in names:
        try:
            ipaddress.ip_address(name)
            entries.append(f"IP:{name}")
        except ValueError:
            entries.append(f"DNS:{name}")
    return ",".join(entries)


def openssl(*args):
    try:
        completed = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S,
                                   check=False)
    except FileNotFoundError:
        raise SuzumioError("serve --runner-listen needs the openssl command to create its certificates "
                           "(install openssl, or pass --runner-cert and --runner-key)") from None
    if completed.returncode != 0:
        raise SuzumioError(f"openssl {args[0]} failed: {completed.stderr.strip()[-400:]}")


def _new_key(path):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    os.chmod(path, 0o600)


def create_ca(folder):
    _new_key(folder / CA_KEY_FILE)
    openssl("req", "-x509", "-new", "-key", str(folder / CA_KEY_FILE), "-out", str(folder / CA_FILE),
            "-days", str(CA_DAYS), "-subj", "/CN=Suzumio runner listener CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")


def issue_server_certificate(folder, names):
    """A server certificate for `names`, signed by the root's CA (written over the previous one)."""
    _new_key(folder / KEY_FILE)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        request = Path(scratch) / "server.csr"
        extensions = Path(scratch) / "server.ext"
        extensions.write_text(f"subjectAltName={subject_alt_names(names)}\nbasicConstraints=critical,CA:FALSE\n"
                              "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n", encoding="utf-8")
        openssl("req", "-new", "-key", str(folder / KEY_FILE), "-out", str(request), "-subj", "/CN=suzumio-controller")
        openssl("x509", "-req", "-in", str(request), "-CA", str(folder / CA_FILE), "-CAkey", str(folder / CA_KEY_FILE),
                "-CAcreateserial", "-CAserial", str(Path(scratch) / "ca.srl"), "-out", str(folder / CERT_FILE),
                "-days", str(CERT_DAYS), "-extfile", str(extensions))
    (folder / NAMES_FILE).write_text("\n".join(names) + "\n", encoding="utf-8")


def generated_tls(root_path, host):
    """The root's own CA and server certificate, created on first start; the server certificate is
    issued anew (same CA) when it does not name `host`."""
    folder = Path(root_path) / TLS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    if not (folder / CA_FILE).is_file() or not (folder / CA_KEY_FILE).is_file():
        create_ca(folder)
        (folder / CERT_FILE).unlink(missing_ok=True)
    names = certificate_names(host)
    names_file = folder / NAMES_FILE
    known = names_file.read_text(encoding="utf-8").split() if names_file.is_file() else []
    if not (folder / CERT_FILE).is_file() or not (folder / KEY_FILE).is_file() or not set(names) <= set(known):
        issue_server_certificate(folder, names)
    return RunnerTls(folder / CERT_FILE, folder / KEY_FILE, (folder / CA_FILE).read_text(encoding="utf-8"))


def operator_tls(cert_file, key_file, ca_file=None):
    """The operator's certificate and key; runners verify it against `ca_file`, else the certificate
    file itself (a self-signed certificate, or one whose chain ends there)."""
    for path in (cert_file, key_file, ca_file):
        if path is not None and not Path(path).is_file():
            raise SuzumioError(f"Runner listener certificate file not found: {path}")
    ca_pem = Path(ca_file or cert_file).read_text(encoding="utf-8")
    if "-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise SuzumioError(f"No PEM certificate in {ca_file or cert_file}")
    return RunnerTls(cert_file, key_file, ca_pem)


def publish_ca(root_path, ca_pem):
    folder = Path(root_path) / TLS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / PUBLISHED_CA_FILE
    scratch = path.with_suffix(".tmp")
    scratch.write_text(ca_pem, encoding="utf-8")
    os.replace(scratch, path)


def unpublish_ca(root_path):
    (Path(root_path) / TLS_DIR / PUBLISHED_CA_FILE).unlink(missing_ok=True)


def published_ca(root_path):
    """The CA `serve --runner-listen` published in the root, or None."""
    path = Path(root_path) / TLS_DIR / PUBLISHED_CA_FILE
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


class TlsFront:
    """Accepts TLS on host:port and relays each connection to the Unix socket `backend_socket`, or to
    `alpn_sockets[protocol]` when the client offered that ALPN protocol (the egress tunnels of runners
    that have no other route to the controller). A client that does not complete a TLS handshake
    (plain HTTP, or a plain egress tunnel) is dropped: nothing behind sees it. One thread per
    connection, at most RELAY_LIMIT at once."""

    def __init__(self, context, host, port, backend_socket, name="suzumio-runner-tls", on_fatal=None,
                 handshake_timeout=HANDSHAKE_TIMEOUT_S, limit=RELAY_LIMIT, alpn_sockets=None):
        self.context = context
        self.on_fatal = on_fatal  # called with the error if the accept loop itself dies
        self.handshake_timeout = handshake_timeout
        self.backend_socket = str(backend_socket)
        self.alpn_sockets = {name: str(path) for name, path in (alpn_sockets or {}).items()}
        if self.alpn_sockets:
            # A client offering none of these (the runner's HTTP client offers none) gets no ALPN
            # answer and the runner routes.
            context.set_alpn_protocols([ALPN_HTTP, *self.alpn_sockets])
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((host, port))
        except OSError as error:
            self.listener.close()
            raise SuzumioError(f"Cannot listen on {host}:{port}: {error}") from None
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self._slots = threading.BoundedSemaphore(limit)
        self._closing = threading.Event()
        self._connections = set()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name=name, daemon=True)
        self.name = name

    def start(self):
        self.thread.start()
        return self

    def _accept(self):
        try:
            while not self._closing.is_set():
                try:
                    client, _address = self.listener.accept()
                except OSError as error:
                    if self._closing.is_set():
                        return
                    # Out of descriptors or a connection reset before accept: the next one may do.
                    log.warning("runner listener: accept failed: %s", error)
                    self._closing.wait(ACCEPT_BACKOFF_S)
                    continue
                if not self._slots.acquire(blocking=False):
                    client.close()
                    continue
                threading.Thread(target=self._serve, args=(client,), name=f"{self.name}-relay", daemon=True).start()
        except BaseException as error:  # the loop's one boundary: a deaf listener must end the process
            log.critical("runner listener accept loop died", exc_info=True)
            if self.on_fatal is None:
                raise
            self.on_fatal("runner-http", error)

    def _serve(self, client):
        tls = None
        with self._lock:
            self._connections.add(client)
        try:
            # Requests and answers are small writes: Nagle's delay against the peer's delayed ACK would
            # add 40 ms to each (measured by bench/runner_listener.py).
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.settimeout(self.handshake_timeout)
            try:
                tls = self.context.wrap_socket(client, server_side=True)
            except (OSError, ssl.SSLError) as error:
                log.info("runner listener: a connection without TLS was refused (%s)", error)
                return
            with tls:
                with self._lock:
                    self._connections.add(tls)
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                with upstream:
                    upstream.connect(self.alpn_sockets.get(tls.selected_alpn_protocol(), self.backend_socket))
                    relay_tls(tls, upstream)
        except (OSError, ssl.SSLError) as error:
            log.debug("runner listener relay ended: %s", error)
        finally:
            with self._lock:
                self._connections.discard(client)
                self._connections.discard(tls)
            client.close()
            self._slots.release()

    def close(self):
        self._closing.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(timeout=5)


class TlsRunnerListener:
    """The runner app as `serve --runner-listen` serves it: Waitress on a Unix socket in a private
    temporary folder (mode 0700), reachable only through a TlsFront on host:port, which hands the
    connections offering ALPN_EGRESS to `egress_socket` (the egress proxy's) instead."""

    def __init__(self, runner_app, host, port, runner_tls, egress_socket=None, **server_options):
        import suzumio_api

        self.relay_dir = Path(tempfile.mkdtemp(prefix="suzumio-tls-"))
        try:
            self.server = suzumio_api.Server(runner_app, unix_socket=self.relay_dir / "runner.sock", **server_options)
            try:
                self.front = TlsFront(runner_tls.server_context(), host, port, self.relay_dir / "runner.sock",
                                      on_fatal=server_options.get("on_fatal"),
                                      alpn_sockets={ALPN_EGRESS: egress_socket} if egress_socket else None)
            except BaseException:
                self.server.close()
                raise
        except BaseException:
            shutil.rmtree(self.relay_dir, ignore_errors=True)
            raise
        self.port = self.front.port
        self.unix_socket = None  # reached on TCP

    def start(self):
        self.server.start()
        self.front.start()
        return self

    def close(self):
        self.front.close()
        self.server.close()
        shutil.rmtree(self.relay_dir, ignore_errors=True)
