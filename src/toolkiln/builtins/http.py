"""``http_request``: the one way tool code (and a model, where its policy allows) reaches the
network. It runs here, in the service's process; the sandbox has no network.

Each request (and each redirect hop, judged the same way) must name a host its caller may
reach: the calling tool version's ``egress`` list, or for a model's own call the workspace
policy's. ``{{secrets.NAME}}`` in the URL or a header value is replaced by the secret's value
just before sending, and only toward one of that secret's hosts; otherwise nothing is sent
(``secret_not_allowed``). The host is resolved once and that address connected to
(builtins/reach.py). The answer is read by the outbound client (outbound/http.py) up to a
cap, within the call's deadline, and any secret value it echoes is masked. docs/egress.md.
"""

from __future__ import annotations

import functools
import json
import math
import re
import ssl
import time
from typing import Any

import httpcore
import httpx
from opentelemetry.trace import SpanKind, StatusCode

from toolkiln import logs
from toolkiln.builtins import reach
from toolkiln.domain.builtin import BuiltinCall, BuiltinFailure, BuiltinSpec
from toolkiln.domain.egress import Target, allowed, denied, normal_host, rules_of, target_of
from toolkiln.domain.fair import FairShare
from toolkiln.domain.problems import scrub, scrub_all
from toolkiln.domain.secrets import MAX_VALUE_CHARS, Secret, fill, names_in
from toolkiln.outbound import lookup
from toolkiln.outbound.http import Compressed, cap_of, capped_transport, within
from toolkiln.services import tracing
from toolkiln.services.ports import SecretSource

DEFAULT_TIMEOUT_MS = 10_000
MAX_TIMEOUT_MS = 30_000
MAX_BODY_BYTES = 1_048_576  # a request's body
MAX_ANSWER_BYTES = (
    524_288  # an answer's body, decoded; past it the answer is cut (a ctx reply holds 1 MB)
)
MAX_REDIRECTS = 5
MAX_AT_ONCE = 16  # requests under way in this process
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
_REDIRECTS = (301, 302, 303, 307, 308)
_HEADER_VALUE = {"type": "string", "maxLength": 8192}

SPEC = BuiltinSpec(
    "http_request",
    "Send one HTTP request to a host this tool may reach (its egress list). "
    "{{secrets.NAME}} in the URL or a header value is replaced by a workspace secret, "
    "only toward that secret's hosts. Returns {status, headers, body | json, truncated}.",
    {
        "type": "object",
        "properties": {
            "method": {"enum": METHODS},
            "url": {"type": "string", "minLength": 1, "maxLength": 8192},
            "headers": {
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": _HEADER_VALUE,
            },
            "body": {"type": "string", "maxLength": MAX_BODY_BYTES},
            "json": {"description": "A JSON body (instead of body)."},
            "timeout_ms": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_MS},
        },
        "required": ["method", "url"],
        "additionalProperties": False,
    },
    effects=True,  # a generation's example runs send nothing (dry_run)
)


class HttpRequest:
    """The built-in. ``secrets`` reads a workspace's secrets; ``context`` (TLS trust: a
    private CA), ``resolve`` (names to addresses) and ``network`` (what connects to a judged
    address) are the seams a deployment or a test sets."""

    spec = SPEC

    def __init__(
        self,
        secrets: SecretSource,
        *,
        context: ssl.SSLContext | None = None,
        resolve: reach.Resolve | None = None,
        network: httpcore.NetworkBackend | None = None,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        at_once: int = MAX_AT_ONCE,
    ) -> None:
        self._secrets = secrets
        self._context = context or reach.ssl_context()
        self._resolve = resolve
        self._network = network
        self._max_answer = max_answer_bytes
        # Shared between workspaces fairly, as is each name's lookup (outbound/lookup.py):
        # a workspace's requests to a server that answers slowly hold at most all slots but
        # one (tests/security/test_lookup_share.py).
        self._slots = FairShare(at_once)

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        attributes = {"http.request.method": str(payload.get("method", ""))}
        with tracing.span("http_request", attributes, SpanKind.CLIENT) as span:
            try:
                answer = self._call(payload, call)
            except BuiltinFailure as failure:
                span.set_attribute("error.type", failure.code)
                span.set_status(StatusCode.ERROR)
                raise
            finally:
                # The host and status only: the URL's path and query may hold what a
                # secret filled in, and no traceparent is sent to the host.
                for event, data in call.events[-1:]:
                    if event == "http.requested" and span.is_recording():
                        if data.get("host"):
                            span.set_attribute("server.address", str(data["host"]))
                        if data.get("status") is not None:
                            span.set_attribute("http.response.status_code", data["status"])
            return answer

    def _call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        started = time.monotonic()
        audit: dict[str, Any] = {
            "method": payload["method"],
            "host": None,
            "path": None,
            "status": None,
            "bytes": 0,
            "duration_ms": 0,
        }
        try:
            first = target_of(payload["url"])
            audit.update(host=first.host, path=scrub(first.path[:512]))
            answer = self._send(payload, first, call, audit)
            audit["status"] = answer["status"]
            return answer
        except BuiltinFailure as failure:
            audit["error"] = failure.code
            if audit["host"] is None and isinstance(failure.details, dict):
                audit["host"] = failure.details.get("host")
            raise
        finally:
            audit["duration_ms"] = round((time.monotonic() - started) * 1000, 3)
            call.events.append(("http.requested", audit))

    def _send(
        self, payload: dict[str, Any], first: Target, call: BuiltinCall, audit: dict[str, Any]
    ) -> dict[str, Any]:
        rules = rules_of(call.egress)
        if not allowed(rules, first.host, first.port):  # before any secret is opened
            raise denied(first.host, _not_listed(first))
        headers = {str(k): str(v) for k, v in (payload.get("headers") or {}).items()}
        if "json" in payload and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"
        named = names_in(payload["url"]) + [n for v in headers.values() for n in names_in(v)]
        secrets = self._secrets_for(call.workspace_id, list(dict.fromkeys(named)), first)
        until, callers = call.until(payload.get("timeout_ms", DEFAULT_TIMEOUT_MS) / 1000)
        body = _body(payload)
        resolve = self._resolve or functools.partial(lookup.resolve, workspace=call.workspace_id)
        backend = reach.GuardedBackend(until, call.policy.egress_private, resolve, self._network)
        transport = capped_transport(
            max_bytes=self._max_answer,
            total_s=max(0.001, until - time.monotonic()),
            truncate=True,
            backend=backend,
            ssl_context=self._context,
        )
        url, target, method = fill(payload["url"], secrets), first, payload["method"]
        if not self._slots.acquire(call.workspace_id, until):
            raise BuiltinFailure("busy", "Too many requests are under way; try again.")
        try:
            with transport, within(until):
                for _ in range(MAX_REDIRECTS + 1):
                    if not allowed(rules, target.host, target.port):
                        raise denied(target.host, _not_listed(target))
                    sent = _headers_for(headers, secrets, target)
                    request = _request(method, url, sent, body, target)
                    response = self._exchange(transport, request, target, callers, call)
                    if response.status_code not in _REDIRECTS or "location" not in response.headers:
                        return self._answer(response, secrets, audit, callers, call)
                    response.close()
                    url = str(request.url.join(response.headers["location"]))
                    target = target_of(url)
                    if response.status_code == 303 or (
                        response.status_code in (301, 302) and method == "POST"
                    ):
                        method, body = ("GET" if method != "HEAD" else "HEAD"), None
                raise BuiltinFailure(
                    "request_failed",
                    f"More than {MAX_REDIRECTS} redirects.",
                    {"host": target.host, "reason": "redirects"},
                )
        finally:
            self._slots.release(call.workspace_id)
            if secrets:
                self._secrets.used(call.workspace_id, sorted(secrets))

    def _secrets_for(
        self, workspace_id: str, names: list[str], target: Target
    ) -> dict[str, Secret]:
        if not names:
            return {}
        found = self._secrets.for_request(workspace_id, names)
        logs.protect(*(s.value for s in found.values()))  # and no log line holds one
        for name in names:
            secret = found.get(name)
            if secret is None:
                raise _not_allowed(name, target.host, "no secret of that name")
            if not allowed(secret.hosts, target.host, target.port):
                raise _not_allowed(name, target.host, "not one of the secret's hosts")
        return found

    @staticmethod
    def _exchange(
        transport: httpx.BaseTransport,
        request: httpx.Request,
        target: Target,
        callers: bool,
        call: BuiltinCall,
    ) -> httpx.Response:
        try:
            return transport.handle_request(request)
        except reach.AddressRefused as exc:
            raise denied(target.host, f"it resolves to {exc.address}, {exc.why}") from None
        except Compressed:
            raise BuiltinFailure(
                "request_failed",
                f"{target.host} sent a compressed answer although identity was asked for.",
                {"host": target.host, "reason": "compressed"},
            ) from None
        except httpx.TimeoutException:
            if callers:
                raise call.out_of_time(f"requesting {target.host}") from None
            raise _timeout(target) from None
        except (httpx.HTTPError, httpcore.ProtocolError, OSError) as exc:
            reason = "tls" if _caused_by(exc, ssl.SSLError) else "connect"
            raise BuiltinFailure(
                "request_failed",
                f"The request to {target.host} failed ({type(exc).__name__}).",
                {"host": target.host, "reason": reason},
            ) from None

    def _answer(
        self,
        response: httpx.Response,
        secrets: dict[str, Secret],
        audit: dict[str, Any],
        callers: bool,
        call: BuiltinCall,
    ) -> dict[str, Any]:
        try:
            raw = b"".join(response.iter_raw())
            state = cap_of(response)
            truncated = bool(state and state.truncated)
        except httpx.TimeoutException:
            if callers:
                raise call.out_of_time("reading the answer") from None
            raise _timeout(None) from None
        except (httpx.HTTPError, httpcore.ProtocolError, OSError) as exc:
            raise BuiltinFailure(
                "request_failed",
                f"Reading the answer failed ({type(exc).__name__}).",
                {"reason": "read"},
            ) from None
        finally:
            response.close()
        audit["bytes"] = len(raw)
        text = raw.decode("utf-8", errors="replace")
        if truncated and secrets:
            # A secret the answer echoes across the cut has no whole value left to mask: all
            # but its cut part would be shown. The text ends a secret's longest length short
            # of the cut, whatever it holds (tests/security/test_secret_at_the_cut.py).
            text = text[: max(0, len(text) - (MAX_VALUE_CHARS - 1))]
        text = _mask(text, secrets)
        out: dict[str, Any] = {
            "status": response.status_code,
            "headers": _shown_headers(response.headers, secrets),
            "truncated": truncated,
        }
        content_type = response.headers.get("content-type", "")
        parsed = _json(text) if "json" in content_type and not truncated else None
        if parsed is not None:
            out["json"] = _mask_all(parsed[0], secrets)
        else:
            out["body"] = scrub(text)
        return out


def _request(method: str, url: str, headers: Any, body: bytes | None, target: Target) -> Any:
    """The request httpx will send, refused unless httpx reads the same scheme, host and port
    from the URL as ``target_of`` did (two parsers that disagree are how checks are passed)."""
    try:
        request = httpx.Request(method, url, headers=headers, content=body)
        raw = request.url.raw_host.decode("ascii")
        host = normal_host(f"[{raw}]" if ":" in raw else raw)
    except (httpx.InvalidURL, UnicodeError, ValueError):
        raise denied(target.host, "the URL cannot be sent as written") from None
    default = 443 if request.url.scheme == "https" else 80
    if (request.url.scheme, host, request.url.port or default) != (
        target.scheme,
        target.host,
        target.port,
    ):
        raise denied(target.host, "the URL reads as another host")
    return request


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _not_listed(target: Target) -> str:
    return f"{target.host}:{target.port} is not in the egress list this call is held to"


def _not_allowed(name: str, host: str, why: str) -> BuiltinFailure:
    return BuiltinFailure(
        "secret_not_allowed",
        f"The secret {name!r} may not be sent to {host!r}: {why}. Nothing was sent.",
        {"name": name, "host": host, "reason": why},
    )


def _timeout(target: Target | None) -> BuiltinFailure:
    where = f" to {target.host}" if target else ""
    return BuiltinFailure("timeout", f"The request{where} took longer than its timeout_ms.")


def _body(payload: dict[str, Any]) -> bytes | None:
    if "json" in payload and "body" in payload:
        raise BuiltinFailure("invalid_input", "Give body or json, not both.", {"field": "json"})
    if "json" in payload:
        return json.dumps(payload["json"], ensure_ascii=False).encode()
    if "body" in payload:
        data = payload["body"].encode("utf-8", errors="replace")
        if len(data) > MAX_BODY_BYTES:
            raise BuiltinFailure("invalid_input", f"body is over {MAX_BODY_BYTES} bytes")
        return data
    return None


def _headers_for(headers: dict[str, str], secrets: dict[str, Secret], target: Target) -> Any:
    """The headers sent to ``target``: a header holding a secret only where every secret in
    it may go to that host (a redirect to another host leaves it out); control characters
    refused. ``Accept-Encoding`` is the outbound client's (identity: the cap bounds what is
    read)."""
    out: list[tuple[str, str]] = []
    for name, value in headers.items():
        if name.lower() in ("accept-encoding", "host", "content-length", "transfer-encoding"):
            continue
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in name + value):
            raise BuiltinFailure(
                "invalid_input", f"The header {name[:64]!r} has a control character."
            )
        used = names_in(value)
        if used and not all(allowed(secrets[n].hosts, target.host, target.port) for n in used):
            continue
        out.append((name, fill(value, secrets) if used else value))
    return out


def _mask(text: str, secrets: dict[str, Secret], any_case: bool = False) -> str:
    """Each secret's value as its placeholder, the longest first: a shorter value inside a
    longer one masked first would leave the rest of the longer shown
    (tests/security/test_secret_at_the_cut.py). ``any_case``: in whatever case it comes
    (header names, which HTTP lowercases)."""
    for secret in sorted(secrets.values(), key=lambda s: -len(s.value)):
        placeholder = "{{secrets." + secret.name + "}}"
        if any_case:
            text = re.sub(re.escape(secret.value), placeholder, text, flags=re.IGNORECASE)
        else:
            text = text.replace(secret.value, placeholder)
    return text


def _mask_all(value: Any, secrets: dict[str, Secret]) -> Any:
    """Parsed JSON with every string masked (an escape such as \\u0041 hid it in the text)."""
    if isinstance(value, str):
        return _mask(value, secrets)
    if isinstance(value, dict):
        return {_mask(k, secrets): _mask_all(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_all(v, secrets) for v in value]
    return value


def _shown_headers(headers: httpx.Headers, secrets: dict[str, Secret]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in list(headers.multi_items())[:100]:
        key = scrub(_mask(name, secrets, any_case=True).lower()[:256])
        shown = scrub(_mask(value, secrets)[:8192])  # masked, then cut: never in part
        out[key] = f"{out[key]}, {shown}" if key in out else shown
    return out


def _json(text: str) -> tuple[Any] | None:
    """The answer as JSON when it is JSON a Result can carry (finite numbers), else None."""

    def finite(raw: str) -> float:
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(raw)
        return value

    def no_constants(raw: str) -> Any:
        raise ValueError(raw)

    try:
        return (scrub_all(json.loads(text, parse_float=finite, parse_constant=no_constants)),)
    except (ValueError, RecursionError):
        return None
