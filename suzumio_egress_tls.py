"""What the egress proxy does for a host whose entry carries credentials or asks for idempotency keys
(docs/operations.md#what-an-agent-can-do-to-the-outside-world): a certificate authority per project (made
with the `openssl` command, its key kept under `<root>/tls/egress/`, never given to anyone), the agent's
TLS ended with a certificate for the host it issues, one request read, the credential and the call's
`Idempotency-Key` added, the request sent on the proxy's own TLS verified against the system's
authorities, and the answer relayed with any echo of the credential masked. Imported by suzumio_egress
and the backends (the CA a sandbox trusts)."""

import base64
import logging
import os
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from suzumio_errors import SuzumioError

log = logging.getLogger(__name__)

EGRESS_CA_DIR = ("tls", "egress")
CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
CA_DAYS = 3650
CERT_DAYS = 397
OPENSSL_TIMEOUT_S = 60
HEAD_LIMIT = 1 << 16
CHUNK = 1 << 16
MASK = b"*"
# Headers the proxy drops from a request it changes: hop-by-hop ones (each exchange is one request, then
# the connection closes), Accept-Encoding (an answer must come uncompressed for its echoes to be masked)
# and Expect (the proxy answers `100 Continue` itself).
DROPPED = (b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"upgrade",
           b"accept-encoding", b"expect")


def run_openssl(*args, needed_for="the egress proxy's certificate authority"):
    """One `openssl` command; SuzumioError with its last words when it fails or is missing."""
    try:
        completed = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S,
                                   check=False)
    except FileNotFoundError:
        raise SuzumioError(f"{needed_for} needs the openssl command (install openssl)") from None
    if completed.returncode != 0:
        raise SuzumioError(f"openssl {args[0]} failed: {completed.stderr.strip()[-400:]}")


def _subject_alt_name(host):
    return f"IP:{host}" if host.replace(".", "").isdigit() or ":" in host else f"DNS:{host}"


class ProjectAuthority:
    """One project's CA (its folder holds the key, 0600) and the host certificates it issued, loaded once
    as server contexts."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self._lock = threading.Lock()
        self._contexts = {}
        if not (self.folder / CA_FILE).is_file() or not (self.folder / CA_KEY_FILE).is_file():
            self._create()
        self.ca_pem = (self.folder / CA_FILE).read_text(encoding="utf-8")

    def _create(self):
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.folder / CA_KEY_FILE
        run_openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))
        os.chmod(key, 0o600)
        run_openssl("req", "-x509", "-new", "-key", str(key), "-out", str(self.folder / CA_FILE),
                    "-days", str(CA_DAYS), "-subj", f"/CN=Suzumio egress CA {self.folder.name}",
                    "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def server_context(self, host):
        """A TLS server context presenting a certificate for `host` signed by this CA (issued once)."""
        with self._lock:
            context = self._contexts.get(host)
            if context is None:
                cert, key = self._issue(host)
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.set_alpn_protocols(["http/1.1"])
                context.load_cert_chain(str(cert), str(key))
                self._contexts[host] = context
            return context

    def _issue(self, host):
        hosts = self.folder / "hosts"
        hosts.mkdir(mode=0o700, exist_ok=True)
        cert, key = hosts / f"{host}.pem", hosts / f"{host}-key.pem"
        if cert.is_file() and key.is_file():
            return cert, key
        run_openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))
        os.chmod(key, 0o600)
        with tempfile.TemporaryDirectory(dir=hosts) as scratch:
            request, extensions = Path(scratch) / "host.csr", Path(scratch) / "host.ext"
            extensions.write_text(f"subjectAltName={_subject_alt_name(host)}\nbasicConstraints=critical,CA:FALSE\n"
                                  "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n", encoding="utf-8")
            run_openssl("req", "-new", "-key", str(key), "-out", str(request), "-subj", f"/CN={host}")
            run_openssl("x509", "-req", "-in", str(request), "-CA", str(self.folder / CA_FILE),
                        "-CAkey", str(self.folder / CA_KEY_FILE), "-CAserial", str(Path(scratch) / "ca.srl"),
                        "-CAcreateserial", "-out", str(cert), "-days", str(CERT_DAYS), "-extfile", str(extensions))
        return cert, key


class Authorities:
    """The projects' CAs under one root, each made on first use."""

    def __init__(self, root_path):
        self.folder = Path(root_path).joinpath(*EGRESS_CA_DIR)
        self._lock = threading.Lock()
        self._projects = {}

    def of(self, project):
        with self._lock:
            authority = self._projects.get(project)
            if authority is None:
                authority = self._projects[project] = ProjectAuthority(self.folder / project)
            return authority


def project_ca_pem(root_path, project):
    """The PEM of a project's egress CA (made now if it is not there), for its sandboxes' trust store."""
    return ProjectAuthority(Path(root_path).joinpath(*EGRESS_CA_DIR, project)).ca_pem


# ---------------------------------------------------------------- one request, changed

@dataclass
class Additions:
    """What goes into one request: headers, a query parameter, and the secrets masked in its answer."""

    headers: list = field(default_factory=list)  # (name, value) as bytes
    query: tuple = None  # (name, value) as text
    secrets: list = field(default_factory=list)  # bytes, longest first


def additions(credential, value, call_key):
    """The Additions for a HostRule's credential (with its value) and the running call's key."""
    added = Additions()
    if credential is not None:
        if credential.query is not None:
            added.query = (credential.query, value)
            added.secrets = [value.encode(), quote(value, safe="").encode()]
        else:
            shown = value
            if credential.scheme == "Basic":
                shown = "Basic " + base64.b64encode(value.encode()).decode("ascii")
            elif credential.scheme == "Bearer":
                shown = "Bearer " + value
            added.headers.append((credential.header.encode("latin-1"), shown.encode("latin-1")))
            added.secrets = [value.encode(), shown.encode("latin-1")]
            if credential.scheme == "Basic":
                added.secrets.append(base64.b64encode(value.encode()))
    if call_key:
        added.headers.append((b"Idempotency-Key", call_key.encode("ascii")))
    added.secrets = sorted({s for s in added.secrets if s}, key=len, reverse=True)
    return added


class ExchangeError(SuzumioError):
    status = 400


def read_head(sock, buffered=b""):
    """The request head (through the blank line) and the bytes after it."""
    data = bytearray(buffered)
    while True:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            return bytes(data[:end + 4]), bytes(data[end + 4:])
        if len(data) > HEAD_LIMIT:
            raise ExchangeError("request head too large")
        chunk = sock.recv(CHUNK)
        if not chunk:
            raise ExchangeError("connection closed before a request")
        data += chunk


def rewrite(head, added):
    """The request head with the Additions: the same method, target (with the query parameter) and
    headers, those the proxy sets replaced, and `Connection: close`. Returns (head, request line as the
    agent wrote it, body framing)."""
    lines = head[:-4].split(b"\r\n")
    try:
        method, target, version = lines[0].split(b" ")
    except ValueError:
        raise ExchangeError("malformed request line") from None
    seen = lines[0].decode("latin-1")
    if added.query is not None:
        name, value = added.query
        joiner = b"&" if b"?" in target else b"?"
        target += joiner + quote(name, safe="").encode() + b"=" + quote(value, safe="").encode()
    replaced = {name.lower() for name, _ in added.headers}
    headers, length, chunked, expects = [], None, False, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == b"content-length":
            length = int(value.strip() or b"0")
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif key == b"expect":
            expects = b"100-continue" in value.lower()
        if key in DROPPED or key in replaced:
            continue
        headers.append(line)
    headers += [name + b": " + value for name, value in added.headers] + [b"Connection: close"]
    out = b"\r\n".join([b" ".join([method, target, version]), *headers]) + b"\r\n\r\n"
    return out, seen, (length, chunked, expects)


def forward_body(client, upstream, framing, buffered):
    """The request body from the client to upstream, as framed by Content-Length or chunks; its bytes."""
    length, chunked, _ = framing
    sent = 0
    if chunked:
        data = bytearray(buffered)
        while not _chunks_end(data):
            chunk = client.recv(CHUNK)
            if not chunk:
                break
            data += chunk
        upstream.sendall(bytes(data))
        return len(data)
    remaining = length or 0
    first = buffered[:remaining]
    if first:
        upstream.sendall(first)
        sent += len(first)
        remaining -= len(first)
    while remaining > 0:
        chunk = client.recv(min(CHUNK, remaining))
        if not chunk:
            break
        upstream.sendall(chunk)
        sent += len(chunk)
        remaining -= len(chunk)
    return sent


def _chunks_end(data):
    """Whether `data` holds a whole chunked body (walks the chunk sizes)."""
    at = 0
    while True:
        end = data.find(b"\r\n", at)
        if end < 0:
            return False
        try:
            size = int(data[at:end].split(b";")[0], 16)
        except ValueError:
            return True  # malformed: forward what came, the server answers it
        if size == 0:
            return data.find(b"\r\n\r\n", end) >= 0
        at = end + 2 + size + 2
        if at > len(data):
            return False


class Masker:
    """Replaces every secret in a byte stream with as many `*` (lengths, hence Content-Length, kept),
    across the boundaries of the pieces it is fed."""

    def __init__(self, secrets):
        self.secrets = secrets
        self.keep = max((len(s) for s in secrets), default=1) - 1
        self.tail = b""
        self.masked = 0

    def feed(self, data):
        text = self.tail + data
        for secret in self.secrets:
            if secret in text:
                self.masked += text.count(secret)
                text = text.replace(secret, MASK * len(secret))
        if self.keep <= 0:
            self.tail = b""
            return text
        self.tail = text[-self.keep:]
        return text[:-self.keep]

    def end(self):
        tail, self.tail = self.tail, b""
        return tail


def relay_answer(upstream, client, masker):
    """The answer from upstream to the client until upstream closes; (bytes, HTTP status or None)."""
    count, status, first = 0, None, b""
    while True:
        try:
            chunk = upstream.recv(CHUNK)
        except ssl.SSLError:
            chunk = b""  # a server that closes without close_notify: the answer has ended
        if not chunk:
            break
        if status is None:
            first += chunk
            parts = first.split(b" ", 2)
            if len(parts) >= 2 and parts[1][:3].isdigit():
                status = int(parts[1][:3])
        count += len(chunk)
        client.sendall(masker.feed(chunk))
    client.sendall(masker.end())
    return count, status


@dataclass
class Outcome:
    request: str = None
    status: int = None
    bytes_out: int = 0
    bytes_in: int = 0
    masked: int = 0


def exchange(client, upstream, added, buffered=b""):
    """One request read from `client` (plain or TLS), changed, sent to `upstream`, its answer relayed
    with the secrets masked. Returns an Outcome."""
    outcome = Outcome()
    head, rest = read_head(client, buffered)
    changed, outcome.request, framing = rewrite(head, added)
    if framing[2]:
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    upstream.sendall(changed)
    outcome.bytes_out = len(changed) + forward_body(client, upstream, framing, rest)
    masker = Masker(added.secrets)
    outcome.bytes_in, outcome.status = relay_answer(upstream, client, masker)
    outcome.masked = masker.masked
    return outcome


def upstream_context(cafile=None):
    """The proxy's own TLS to a host: verified against the system's authorities (or `cafile`)."""
    context = ssl.create_default_context(cafile=cafile)
    context.set_alpn_protocols(["http/1.1"])
    return context
