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


@dataclass(frozen=True)
class AgentEgress:
    """Where one agent's connections may go (Allowlist entries), why, and its limits
    per activation (None: no limit)."""

    entries: tuple
    reason: str
    max_bytes: int = None
    max_connections: int = None

    @property
    def label(self):
        return ", ".join(self.entries) if self.entries else "nothing"


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
