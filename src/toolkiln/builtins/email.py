"""``send_email``: to the workspace outbox by default, or over SMTP when configured.

Recipients (to, cc) must match the workspace's ``email_allowlist`` (an address, or a whole
domain). Header values may not contain line breaks, so nothing can be injected into the
message's headers; the message is built by :mod:`email.message`, which refuses them too.

An SMTP conversation is over by its deadline as a whole, and the server's replies are read
up to ``SMTP_MAX_REPLY_BYTES`` in all (``outbound/cap.py``).
"""

from __future__ import annotations

import smtplib
import socket
import ssl
import time
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec
from toolkiln.domain.ids import new_id, utcnow
from toolkiln.outbound import lookup
from toolkiln.outbound.cap import ByteCap, TooLarge
from toolkiln.services.ports import UnitOfWorkFactory

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

SMTP_CAP_S = 20.0  # the whole SMTP conversation, whatever the caller's time
# What the server may send in one conversation, all its replies together (a handful of
# lines each; smtplib caps each line, not how many a reply has).
SMTP_MAX_REPLY_BYTES = 1024 * 1024
ADDRESS = {"type": "string", "minLength": 3, "maxLength": 320}
ADDRESSES = {"anyOf": [ADDRESS, {"type": "array", "items": ADDRESS, "minItems": 1, "maxItems": 50}]}


@dataclass(frozen=True, slots=True)
class SmtpConfig:
    """From ``TOOLKILN_SMTP_URL``: ``smtp://user:pass@host:587?starttls=true&from=a@b.c``
    (STARTTLS), ``smtps://...:465`` (TLS from the start), or plain ``smtp://host:25``."""

    host: str
    port: int
    username: str | None
    password: str | None
    tls: bool
    starttls: bool
    sender: str
    verify: bool = True

    @classmethod
    def from_url(cls, url: str) -> SmtpConfig:
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ValueError(
                "TOOLKILN_SMTP_URL must look like smtp://host:port or smtps://host:port"
            )
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        tls = parts.scheme == "smtps"
        return cls(
            host=parts.hostname,
            port=parts.port or (465 if tls else 25),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=tls,
            starttls=query.get("starttls", "false").lower() == "true",
            sender=query.get("from", "toolkiln@localhost"),
            verify=query.get("verify", "true").lower() != "false",
        )


def _addresses(value: str | list[str] | None, field: str) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    out = []
    for item in items:
        if any(c in item for c in "\r\n\x00"):
            raise BuiltinFailure(
                "invalid_input", f"{field} contains a line break", {"field": field}
            )
        _, addr = parseaddr(item)
        if addr.count("@") != 1 or any(c.isspace() for c in addr) or addr.startswith("@"):
            raise BuiltinFailure(
                "invalid_input", f"{field}: {item!r} is not an address", {"field": field}
            )
        out.append(addr.lower())
    return out


def allowed(address: str, allowlist: list[str]) -> bool:
    domain = address.rpartition("@")[2]
    for entry in allowlist:
        entry = entry.lower()
        if "@" in entry and entry == address:
            return True
        if "@" not in entry and (domain == entry or domain.endswith("." + entry)):
            return True
    return False


class SendEmail:
    spec = BuiltinSpec(
        "send_email",
        "Send an email to recipients the workspace allows. Returns {message_id}.",
        {
            "type": "object",
            "properties": {
                "to": ADDRESSES,
                "cc": ADDRESSES,
                "reply_to": ADDRESS,
                "subject": {"type": "string", "minLength": 1, "maxLength": 998},
                "body_text": {"type": "string", "maxLength": 1_000_000},
                "body_html": {"type": "string", "maxLength": 1_000_000},
            },
            "required": ["to", "subject", "body_text"],
            "additionalProperties": False,
        },
        effects=True,
    )

    def __init__(self, uow: UnitOfWorkFactory, smtp: SmtpConfig | None) -> None:
        self._uow = uow
        self._smtp = smtp

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        to = _addresses(payload["to"], "to")
        cc = _addresses(payload.get("cc"), "cc")
        reply_to = _addresses(payload.get("reply_to"), "reply_to")
        subject = payload["subject"]
        if any(c in subject for c in "\r\n\x00"):
            raise BuiltinFailure(
                "invalid_input", "subject contains a line break", {"field": "subject"}
            )
        refused = [a for a in to + cc if not allowed(a, call.policy.email_allowlist)]
        if refused:
            raise BuiltinFailure(
                "recipient_not_allowed",
                "These recipients are not on the workspace's email allowlist.",
                {"recipients": refused},
            )
        domain = (self._smtp.sender.rpartition("@")[2] if self._smtp else None) or "toolkiln.local"
        # Random only: email.utils.make_msgid puts the time and the service's process id in
        # it, which no tool needs to see (ids say nothing but themselves).
        message_id = f"<{new_id()}@{domain}>"
        call.cost["recipients"] = len(to) + len(cc)
        if self._smtp is not None:
            until, callers = call.until(SMTP_CAP_S)
            try:
                self._send_smtp(payload, to, cc, reply_to, message_id, until)
            except _OutOfTime:
                if callers:
                    raise call.out_of_time("talking to the SMTP server") from None
                raise BuiltinFailure(
                    "delivery_failed",
                    "The SMTP server did not finish in time.",
                    {"reason": f"no answer within {SMTP_CAP_S:g} s"},
                ) from None
        else:
            with self._uow() as tx:
                tx.outbox.add(
                    {
                        "id": new_id(),
                        "workspace_id": call.workspace_id,
                        "message_id": message_id,
                        "recipients": {"to": to, "cc": cc},
                        "subject": subject,
                        "body_text": payload["body_text"],
                        "body_html": payload.get("body_html"),
                        "reply_to": reply_to[0] if reply_to else None,
                        "source": call.source,
                        "tool_call_id": call.tool_call_id,
                        "created_at": utcnow(),
                    }
                )
        return {"message_id": message_id}

    def _send_smtp(
        self,
        payload: dict[str, Any],
        to: list[str],
        cc: list[str],
        reply_to: list[str],
        message_id: str,
        until: float,
    ) -> None:
        """One SMTP conversation, over by ``until`` (``time.monotonic()``) as a whole: every
        read and write of its socket waits at most for the time left (``_OutOfTime``
        after it), so a server that trickles its answers cannot stretch it."""
        cfg = self._smtp
        assert cfg is not None
        msg = EmailMessage()
        try:
            msg["From"] = Address(addr_spec=cfg.sender)
            msg["To"] = ", ".join(to)
            if cc:
                msg["Cc"] = ", ".join(cc)
            if reply_to:
                msg["Reply-To"] = reply_to[0]
            msg["Subject"] = payload["subject"]
            msg["Message-ID"] = message_id
        except ValueError as exc:
            raise BuiltinFailure("invalid_input", f"bad header: {exc}") from None
        msg.set_content(payload["body_text"])
        if payload.get("body_html"):
            msg.add_alternative(payload["body_html"], subtype="html")
        context = ssl.create_default_context()
        if not cfg.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        context.sslsocket_class = _UntilSSLSocket
        cap = ByteCap(SMTP_MAX_REPLY_BYTES)
        try:
            client: smtplib.SMTP
            if cfg.tls:
                client = _UntilSMTPSSL(until, cap, cfg.host, cfg.port, context)
            else:
                client = _UntilSMTP(until, cap, cfg.host, cfg.port)
            with client:
                if cfg.starttls:
                    client.starttls(context=context)
                if cfg.username:
                    client.login(cfg.username, cfg.password or "")
                client.send_message(msg, from_addr=cfg.sender, to_addrs=to + cc)
        except (smtplib.SMTPException, OSError, TooLarge) as exc:
            # Over the cap, whatever the QUIT on the way out then made of the rest.
            if cap.exceeded:
                raise BuiltinFailure(
                    "delivery_failed",
                    f"The SMTP server's replies were over {cap.max_bytes} bytes.",
                    {"reason": "too_large", "max_bytes": cap.max_bytes},
                ) from None
            # smtplib reports a read that ran out of time as a lost connection.
            if time.monotonic() >= until - 0.05:
                raise _OutOfTime from None
            raise BuiltinFailure(
                "delivery_failed",
                "The SMTP server did not accept the message.",
                {"reason": str(exc)[:300]},
            ) from None


# -- an SMTP conversation with one deadline


class _OutOfTime(Exception):
    """The conversation's deadline passed."""


def _left(until: float) -> float:
    left = until - time.monotonic()
    if left <= 0:
        raise TimeoutError("the SMTP conversation's time ran out")
    return left


class _UntilSocket(socket.socket):
    """A socket whose every read and write waits at most until ``until``, so the deadline
    holds for the conversation as a whole, not for each operation; what it reads is
    charged to the conversation's ``cap``."""

    until = float("inf")
    cap = ByteCap(SMTP_MAX_REPLY_BYTES)  # replaced by the conversation's own

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_left(self.until))
        n = super().recv_into(buffer, nbytes, flags)
        self.cap.take(n)
        return n

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.settimeout(_left(self.until))
        data = super().recv(bufsize, flags)
        self.cap.take(len(data))
        return data

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self.settimeout(_left(self.until))  # sendall's timeout bounds the whole send
        super().sendall(data, flags)


class _UntilSSLSocket(ssl.SSLSocket):
    """The same for a TLS socket (made by the context: ``SSLContext.sslsocket_class``). Its
    handshake runs with the plain socket's timeout, set to the time left just before."""

    until = float("inf")
    cap = ByteCap(SMTP_MAX_REPLY_BYTES)  # replaced by the conversation's own

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        self.settimeout(_left(self.until))
        n = super().recv_into(buffer, nbytes, flags)
        self.cap.take(n)
        return n

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self.settimeout(_left(self.until))
        data = super().recv(buflen, flags)
        self.cap.take(len(data))
        return data

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:  # sendall sends in parts
        self.settimeout(_left(self.until))
        return super().send(data, flags)


class _UntilSMTP(smtplib.SMTP):
    """Connects (and reads the greeting) when made, over an ``_UntilSocket``."""

    def __init__(self, until: float, cap: ByteCap, host: str, port: int) -> None:
        self.until, self.cap = until, cap
        name = lookup.ehlo_name(until)
        super().__init__(host, port, local_hostname=name, timeout=_left(until))

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        raw = lookup.connect(host, port, self.until, self.source_address)
        sock = _UntilSocket(fileno=raw.detach())
        sock.until, sock.cap = self.until, self.cap
        sock.settimeout(_left(self.until))
        return sock

    def starttls(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        reply = super().starttls(*args, **kwargs)
        if isinstance(self.sock, _UntilSSLSocket):
            self.sock.until, self.sock.cap = self.until, self.cap
        return reply


class _UntilSMTPSSL(smtplib.SMTP_SSL, _UntilSMTP):
    def __init__(
        self, until: float, cap: ByteCap, host: str, port: int, context: ssl.SSLContext
    ) -> None:
        self.until, self.cap = until, cap
        name = lookup.ehlo_name(until)
        smtplib.SMTP_SSL.__init__(
            self, host, port, local_hostname=name, timeout=_left(until), context=context
        )

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = super()._get_socket(host, port, timeout)  # _UntilSMTP's, wrapped in TLS
        if isinstance(sock, _UntilSSLSocket):
            sock.until, sock.cap = self.until, self.cap
        return sock
