"""Egress rules: which hosts a request may reach, and which addresses may be connected to.

A rule is ``host``, ``*.domain`` or either with ``:port``; an IP literal is written as is
(``203.0.113.7``, ``[2001:db8::1]:8443``). Without a port a rule allows the default ports,
80 and 443. ``*.example.org`` allows every name under ``example.org``, not ``example.org``
itself. An empty list allows nothing. Names are compared in lower case, a final dot dropped.

A host is one of: a canonical IP literal (dotted quad, or IPv6 in brackets) or a DNS name
whose labels are letters, digits and hyphens and whose last label is not all digits. Anything
a resolver would read as an address in another form (``2130706433``, ``0177.0.0.1``,
``0x7f.1``) is neither, and is refused: tests/security/test_egress_hosts.py.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from toolkiln.domain.builtin import BuiltinFailure
from toolkiln.domain.problems import Problem, problem, scrub

MAX_RULES = 100
MAX_RULE_CHARS = 253
DEFAULT_PORTS = (80, 443)
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

# An entry of an egress list, as the API document states it and the domain checks it: a name
# (its last label starting with a letter, so no resolver reads it as an address), optionally
# "*." before it; a canonical IPv4 address; an IPv6 address in brackets; an optional port
# 1-65535 without leading zeros. tests/egress/test_tool_egress.py.
_NAME = (
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?"
)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_V4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H = r"[0-9A-Fa-f]{1,4}"
_V6 = (
    rf"(?:(?:{_H}:){{7}}{_H}|(?:{_H}:){{1,7}}:|(?:{_H}:){{1,6}}:{_H}"
    rf"|(?:{_H}:){{1,5}}(?::{_H}){{1,2}}|(?:{_H}:){{1,4}}(?::{_H}){{1,3}}"
    rf"|(?:{_H}:){{1,3}}(?::{_H}){{1,4}}|(?:{_H}:){{1,2}}(?::{_H}){{1,5}}"
    rf"|{_H}:(?::{_H}){{1,6}}|:(?:(?::{_H}){{1,7}}|:)"
    rf"|::(?:[Ff]{{4}}(?::0{{1,4}})?:)?{_V4}|(?:{_H}:){{1,4}}:{_V4})"
)
_PORT = (
    r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
    r"|[1-9][0-9]{0,3}))?"
)
ENTRY_PATTERN = rf"^(?:(?:\*\.)?{_NAME}|{_V4}|\[{_V6}\]){_PORT}$"
_ENTRY = re.compile(ENTRY_PATTERN)
# Addresses no request reaches, whatever the policy: the cloud metadata services.
METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class BadHost(ValueError):
    """A host that is neither a canonical IP literal nor a DNS name."""


@dataclass(frozen=True, slots=True)
class Rule:
    host: str  # a name, a "*." suffix rule (kept as ".domain"), or an address's text
    port: int | None

    def allows(self, host: str, port: int) -> bool:
        if self.port is None and port not in DEFAULT_PORTS:
            return False
        if self.port is not None and port != self.port:
            return False
        if self.host.startswith("."):
            return host.endswith(self.host) and len(host) > len(self.host)
        return host == self.host


def normal_host(raw: str) -> str:
    """``raw`` as a rule or a URL names a host, compared form; ``BadHost`` if it is none."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in raw) or not raw.isascii():
        raise BadHost("has a control character, a space or a non-ASCII character")
    if raw.startswith("["):
        if not raw.endswith("]"):
            raise BadHost("is not a bracketed IPv6 address")
        try:
            return str(ipaddress.IPv6Address(raw[1:-1]))
        except ValueError:
            raise BadHost("is not an IPv6 address") from None
    host = raw.lower().removesuffix(".")
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    if _reads_as_address(host):
        raise BadHost("reads as an IP address in a form other than a.b.c.d")
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise BadHost("is not a host name (letters, digits, hyphens and dots)")
    if labels[-1].isdigit():
        raise BadHost("ends in a numeric label")
    return host


def _reads_as_address(host: str) -> bool:
    """Whether a resolver would take ``host`` for an IPv4 address (inet_aton's forms)."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def parse_rule(raw: str) -> Rule:
    """One rule, or ``BadHost`` saying what is wrong with it."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_RULE_CHARS:
        raise BadHost(f"must be 1 to {MAX_RULE_CHARS} characters")
    if not _ENTRY.fullmatch(raw):
        raise BadHost(
            "is not a host name (its last label starting with a letter), *.domain, an IPv4 "
            "address a.b.c.d or an [IPv6] address, with an optional :port 1-65535"
        )
    host, port = _split_port(raw)
    if host.startswith("*."):
        rest = normal_host(host[2:])
        if _is_address(rest):
            raise BadHost("a wildcard needs a domain, not an address")
        return Rule("." + rest, port)
    if "*" in host:
        raise BadHost("a wildcard is only '*.' at the start")
    return Rule(normal_host(host), port)


def _split_port(raw: str) -> tuple[str, int | None]:
    if raw.startswith("["):
        end = raw.find("]")
        host, rest = raw[: end + 1], raw[end + 1 :]
    elif raw.count(":") == 1:
        host, rest = raw.split(":")[0], ":" + raw.split(":")[1]
    else:
        host, rest = raw, ""
    if not rest:
        return host, None
    digits = rest[1:]
    if not rest.startswith(":") or not digits.isdigit() or not 0 < int(digits) < 65536:
        raise BadHost("has a port that is not 1 to 65535")
    return host, int(digits)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_rules(raw: object, field: str = "egress") -> list[Problem]:
    """Every bad rule of an egress list, each named."""
    if not isinstance(raw, list):
        return [problem(field, "must be a list of hosts")]
    if len(raw) > MAX_RULES:
        return [problem(field, f"must have at most {MAX_RULES} hosts")]
    out: list[Problem] = []
    for i, entry in enumerate(raw):
        try:
            parse_rule(entry)
        except BadHost as exc:
            shown = entry[:80] if isinstance(entry, str) else entry
            out.append(problem(f"{field}.{i}", f"{shown!r} {exc}"))
    return out


def rules_of(raw: list[str] | tuple[str, ...]) -> tuple[Rule, ...]:
    """The rules of a list that passed ``check_rules`` (a bad entry, if any, is skipped)."""
    out = []
    for entry in raw:
        try:
            out.append(parse_rule(entry))
        except BadHost:
            continue
    return tuple(out)


def allowed(rules: tuple[Rule, ...], host: str, port: int) -> bool:
    return any(r.allows(host, port) for r in rules)


def address_refusal(address: Address, private_ok: bool) -> str | None:
    """Why a connection to ``address`` is refused, or None. An IPv4 address inside IPv6
    (mapped, or NAT64's well-known prefix) is judged as the IPv4 address it carries."""
    inner = _carried(address)
    if inner in METADATA or address in METADATA:
        return "a cloud metadata address"
    if inner.is_multicast or (inner.is_unspecified and not private_ok):
        return "not a unicast address"
    if not private_ok and not inner.is_global:
        return "a private, loopback, link-local or otherwise non-public address"
    return None


def _carried(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


# Built-ins that reach past the service whatever the policy says (an SMTP server, a search
# provider), and those that reach what the policy's egress list allows (a model's own
# http_request, and the http_request of code it runs).
ALWAYS_OUTSIDE = frozenset({"send_email", "web_search"})
THROUGH_EGRESS = frozenset({"http_request", "run_code"})


def builtin_open_world(name: str, policy_egress: list[str]) -> bool:
    """Whether a model calling built-in ``name`` may reach the network (openWorldHint)."""
    return name in ALWAYS_OUTSIDE or (name in THROUGH_EGRESS and bool(policy_egress))


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str  # as compared: lower case, an IPv6 address without brackets
    port: int
    path: str  # without the query: what the audit keeps


def target_of(url: str) -> Target:
    """Where ``url`` goes, or ``egress_denied``: http(s) only, no user-info, a host that is a
    name or a canonical address, a port in range. A placeholder in the host is refused."""
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise denied("", "the URL has a control character or a space")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise denied(parts.netloc[:80], "only http:// and https:// URLs")
    if "{{" in parts.netloc:
        raise BuiltinFailure(
            "secret_not_allowed",
            "A secret may not choose the host of a request.",
            {"message": "a secret may not choose the host of a request"},
        )
    if "@" in parts.netloc:
        raise denied(parts.netloc[:80], "a URL with a user-info part (user@host)")
    try:
        host_part, port = _split_port(parts.netloc)
        host = normal_host(host_part)
    except BadHost as exc:
        raise denied(parts.netloc[:80], f"the host {exc}") from None
    port = port or (443 if parts.scheme == "https" else 80)
    return Target(parts.scheme, host, port, parts.path or "/")


def denied(host: str, why: str) -> BuiltinFailure:
    shown = scrub(host)
    return BuiltinFailure(
        "egress_denied",
        f"This request may not reach {shown!r}: {why}.",
        {"host": shown, "reason": why},
    )
