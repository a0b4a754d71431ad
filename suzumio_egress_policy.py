"""The egress allowlist (docs/operations.md#egress): the grammar of `agents.<id>.egress` entries, the
decision over a host, a port and its addresses, and the refusal an agent reads. The config validates
with it; the egress proxy decides with it."""

import functools
import ipaddress
from dataclasses import dataclass

PUBLIC = "public"
_HOST_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def refusal(host, port, agent_id):
    """What the agent reads when a connection is refused by its allowlist."""
    return f"egress to {host}:{port} is not allowed for {agent_id}; add it to agents.{agent_id}.egress"


@dataclass(frozen=True)
class Entry:
    """One allowlist entry: kind `public`, `host` (a name), `domain` (`*.domain`: names under it),
    `address` (one IP) or `network` (a CIDR); `port` None means any port."""

    kind: str
    value: object = None
    port: int = None

    def port_matches(self, port):
        return self.port is None or self.port == port


def ip_or_none(text):
    """The IP address `text` spells (brackets allowed, IPv4-mapped IPv6 made IPv4), else None."""
    text = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return address.ipv4_mapped if address.version == 6 and address.ipv4_mapped else address


def split_port(text):
    """(host, port) of `host`, `host:port`, `[v6]:port` or a bare IPv6 address; port None when absent."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError("expected [address]:port")
        return host, _port(rest[1:]) if rest else None
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, _port(port)
    return text, None


def _port(text):
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"invalid port {text!r} (1-65535)")
    return int(text)


def _check_name(name):
    if not name or not set(name) <= _HOST_CHARS or name.startswith(".") or name.endswith(".") or ".." in name:
        raise ValueError(f"invalid host name {name!r}")


def parse_entry(text):
    """An Entry from its config spelling; raises ValueError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("expected host, host:port, *.domain, a CIDR or public")
    text = text.strip().lower()
    if text == PUBLIC:
        return Entry(PUBLIC)
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ValueError(f"invalid CIDR {text!r}") from None
        if network.prefixlen == 0:
            raise ValueError(f"{text} names every address; write public for the public ones")
        return Entry("network", network)
    host, port = split_port(text)
    address = ip_or_none(host)
    if address is not None:
        return Entry("address", address, port)
    if host.startswith("*."):
        _check_name(host[2:])
        return Entry("domain", host[2:], port)
    _check_name(host)
    return Entry("host", host, port)


def is_public(address):
    """True for a globally routable unicast address: not loopback, private, link-local (cloud metadata
    at 169.254.169.254 included), shared, reserved, unspecified or multicast."""
    return address.is_global and not address.is_multicast


class Allowlist:
    """The parsed entries of one agent, and the decision over a host, a port and its addresses."""

    def __init__(self, entries):
        self.entries = tuple(parse_entry(text) for text in entries)
        self.has_addresses = any(entry.kind in ("address", "network") for entry in self.entries)

    def names_host(self, host, port):
        """Whether an entry lets `host` through by name (its addresses must still be public)."""
        for entry in self.entries:
            if entry.kind == PUBLIC:
                return True
            if not entry.port_matches(port):
                continue
            if entry.kind == "host" and entry.value == host:
                return True
            if entry.kind == "domain" and host.endswith("." + entry.value):
                return True
        return False

    def names_address(self, address, port):
        """Whether an entry names this exact address (or a CIDR holding it): the only way to a
        loopback, private or link-local address."""
        for entry in self.entries:
            if entry.kind == "address" and entry.value == address and entry.port_matches(port):
                return True
            if entry.kind == "network" and address.version == entry.value.version and address in entry.value:
                return True
        return False


@functools.lru_cache(maxsize=256)
def allowlist(entries):
    return Allowlist(entries)


SCHEMES = ("Bearer", "Basic", "none")


@dataclass(frozen=True)
class Credential:
    """What the egress proxy adds to each request to one host: a header (`header`, written with `scheme`)
    or a query parameter (`query`), whose value it reads from the controller's environment variable
    `value_env` at request time. The value itself is never part of the config."""

    value_env: str
    header: str = None
    query: str = None
    scheme: str = "none"

    @property
    def label(self):
        if self.query is not None:
            return f"query {self.query} from ${self.value_env}"
        scheme = "" if self.scheme == "none" else f"{self.scheme} "
        return f"{self.header}: {scheme}from ${self.value_env}"


@dataclass(frozen=True)
class HostRule:
    """An egress entry written as a mapping: one host (and port) that the proxy opens, with a credential
    it adds and/or the `Idempotency-Key` of the tool call that makes the request."""

    host: str
    port: int = None
    credential: Credential = None
    idempotency_key: bool = False

    @property
    def text(self):
        """Its allowlist spelling."""
        return self.host if self.port is None else f"{self.host}:{self.port}"

    @property
    def intercepted(self):
        """Whether the proxy must read and change its requests (TLS ended with the project's CA)."""
        return self.credential is not None or self.idempotency_key

    def matches(self, host, port):
        return self.host == host and (self.port is None or self.port == port)


_HOST_KEYS = {"host", "port", "credentials", "idempotencyKey"}
_CREDENTIAL_KEYS = {"header", "query", "valueEnv", "scheme"}
_TOKEN = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def parse_host_rule(value):
    """A HostRule from a mapping entry `{host, port?, credentials?, idempotencyKey?}`; raises ValueError
    naming the key at fault (relative to the entry)."""
    unknown = sorted(set(value) - _HOST_KEYS)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown key (expected host, port, credentials, idempotencyKey)")
    host = value.get("host")
    if not isinstance(host, str) or not host.strip():
        raise ValueError("host: expected a host name")
    host = host.strip().lower()
    if ip_or_none(host) is None:
        _check_name(host)
    port = value.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise ValueError("port: expected an integer 1-65535")
    idempotency = value.get("idempotencyKey", False)
    if not isinstance(idempotency, bool):
        raise ValueError("idempotencyKey: expected true or false")
    credentials = value.get("credentials")
    credential = None if credentials is None else _parse_credential(credentials)
    return HostRule(host, port, credential, idempotency)


def _parse_credential(value):
    if not isinstance(value, dict):
        raise ValueError("credentials: expected {header, valueEnv, scheme?} or {query, valueEnv}")
    unknown = sorted(set(value) - _CREDENTIAL_KEYS)
    if unknown:
        raise ValueError(f"credentials.{unknown[0]}: unknown key (expected header or query, valueEnv, scheme)")
    env = value.get("valueEnv")
    if not isinstance(env, str) or not env or not set(env) <= _TOKEN:
        raise ValueError("credentials.valueEnv: expected the name of an environment variable of the controller")
    header, query = value.get("header"), value.get("query")
    if (header is None) == (query is None):
        raise ValueError("credentials: give exactly one of header and query")
    for key, name in (("header", header), ("query", query)):
        if name is not None and (not isinstance(name, str) or not name or not set(name) <= _TOKEN):
            raise ValueError(f"credentials.{key}: expected a {key} name")
    scheme = value.get("scheme", "none")
    if scheme not in SCHEMES:
        raise ValueError(f"credentials.scheme: expected one of {', '.join(SCHEMES)}")
    if query is not None and scheme != "none":
        raise ValueError("credentials.scheme: only with header")
    return Credential(env, header, query, scheme)


def entry_text(value):
    """The allowlist spelling of an entry as written: a string, or a mapping's host[:port]."""
    return parse_host_rule(value).text if isinstance(value, dict) else value


@dataclass(frozen=True)
class AgentEgress:
    """Where one agent's connections may go (Allowlist entries), why, its limits per activation (None:
    no limit), and the hosts written as mappings (HostRule: credentials, idempotency keys)."""

    entries: tuple
    reason: str
    max_bytes: int = None
    max_connections: int = None
    hosts: tuple = ()

    @property
    def label(self):
        if not self.entries:
            return "nothing"
        added = {rule.text: rule for rule in self.hosts if rule.intercepted}
        return ", ".join(_labelled(text, added.get(text)) for text in self.entries)

    def host_rule(self, host, port):
        """The HostRule of a destination whose requests the proxy changes, or None."""
        return next((rule for rule in self.hosts if rule.intercepted and rule.matches(host, port)), None)


def _labelled(text, rule):
    if rule is None:
        return text
    parts = ([f"credential {rule.credential.label} added by the proxy"] if rule.credential else []) + (
        ["Idempotency-Key added by the proxy"] if rule.idempotency_key else [])
    return f"{text} [{'; '.join(parts)}]"


def egress_of(entries, reason, max_bytes=None, max_connections=None):
    """The AgentEgress of entries as written (strings and mappings)."""
    hosts = tuple(parse_host_rule(dict(value)) for value in entries if not isinstance(value, str))
    return AgentEgress(tuple(entry_text(dict(v) if not isinstance(v, str) else v) for v in entries), reason,
                       max_bytes, max_connections, hosts)


def egress_warnings(agent, egress):
    """Entries that open a loopback, private or link-local address to an agent."""
    lines = []
    for text in egress.entries:
        entry = parse_entry(text)
        if entry.kind == "address" and not is_public(entry.value):
            lines.append(f"Warning: agents.{agent.key}.egress {text} lets {agent.id} reach a non-public address")
        elif entry.kind == "network" and not entry.value.is_global:
            lines.append(f"Warning: agents.{agent.key}.egress {text} lets {agent.id} reach non-public addresses")
    return lines
