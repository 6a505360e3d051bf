"""Workspace secrets: the record, its rules, and the ``{{secrets.NAME}}`` placeholder.

A secret's value is written once and never shown again; the host puts it into an
``http_request`` (a header value or the URL) just before sending, and only toward one of the
secret's ``hosts`` (the same rules as an egress list, domain/egress.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from toolkiln.domain.egress import Rule, check_rules, parse_rule
from toolkiln.domain.problems import Problem, problem

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
PLACEHOLDER = re.compile(r"\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_]{0,63})\s*\}\}")
MAX_VALUE_CHARS = 8192
MAX_SECRETS = 200  # a workspace's


@dataclass(slots=True)
class SecretInfo:
    """What anyone may see of a secret: never its value."""

    name: str
    hosts: list[str]
    created_at: datetime
    updated_at: datetime
    last_used_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Secret:
    """A secret ready to be sent: its value and the hosts it may be sent to. Its repr
    shows no value (a traceback or a debug log of one shows the name only)."""

    name: str
    value: str
    hosts: tuple[Rule, ...]

    def __repr__(self) -> str:
        return f"Secret({self.name!r})"


def check_name(name: str) -> list[Problem]:
    if not NAME_RE.fullmatch(name):
        return [problem("name", "must be letters, digits and _, not starting with a digit")]
    return []


def check_value(value: str) -> list[Problem]:
    """A value goes into a header or a URL: it holds no control character."""
    if not 0 < len(value) <= MAX_VALUE_CHARS:
        return [problem("value", f"must be 1 to {MAX_VALUE_CHARS} characters")]
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return [problem("value", "must hold no control character (a line break, NUL, ...)")]
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return [problem("value", "must be valid Unicode text")]
    return []


def check_hosts(hosts: object) -> list[Problem]:
    if isinstance(hosts, list) and not hosts:
        return [problem("hosts", "must name at least one host the secret may be sent to")]
    return check_rules(hosts, "hosts")


def names_in(text: str) -> list[str]:
    """The secrets ``text`` refers to, in order, each once."""
    return list(dict.fromkeys(PLACEHOLDER.findall(text)))


def fill(text: str, secrets: dict[str, Secret]) -> str:
    """``text`` with each placeholder replaced by its secret's value (all are in
    ``secrets``: the caller checked)."""
    return PLACEHOLDER.sub(lambda m: secrets[m.group(1)].value, text)


def rules(hosts: list[str]) -> tuple[Rule, ...]:
    return tuple(parse_rule(h) for h in hosts)
