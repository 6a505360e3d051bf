"""A scripted OpenAI-compatible chat-completions server on loopback, for tests.

A real HTTP server in a thread: each POST to ``/v1/chat/completions`` takes the next step of
the script and records the request (headers and JSON body). Steps:

- ``propose(arguments)``: an assistant message calling ``propose_tool`` with these arguments
  (a dict is sent as its JSON text, a string as it is, so malformed JSON can be sent);
- ``text(content)``: an assistant message with no tool call;
- ``fail(status)``: an HTTP error with an OpenAI-style error body;
- ``hang()``: accept the request and answer nothing until ``release()`` (or ``close()``);
- ``trickle()``: send the status and headers, then one byte of the body every half second
  until released: each read is quick, the answer never completes (``wait_dropped`` tells
  when the client closed the connection);
- ``held(step)``: hold the request until ``release()``, then answer it as ``step`` would
  (a model that is slow to answer);
- ``raw(body)``: HTTP 200 with this JSON body as it is (a dict, list or string), to send
  what no chat completion looks like;
- ``huge(size)``: HTTP 200 with a valid chat completion whose text is ``size`` bytes, sent
  in chunks with no length (it ends when the connection does); ``sent_bytes`` counts what
  the server managed to send before the client stopped reading.

When the script runs out the server answers 500 ``script exhausted``, so a test sees any
request it did not plan for. Usage::

    with ScriptedModel() as model:
        model.script(propose({...}), propose({...}))
        ... point TOOLKILN_LLM_BASE_URL at model.url ...
        assert len(model.requests) == 2
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HANG_LIMIT_S = 60.0  # a hung handler gives up at last, so no thread outlives a test run
TRICKLE_EVERY_S = 0.5


@dataclass(frozen=True)
class Step:
    kind: str
    arguments: str = ""
    content: str | None = None
    status: int = 200
    extra_calls: tuple[str, ...] = ()
    body: Any = None
    then: Step | None = None


def propose(arguments: dict[str, Any] | str, *also: str, as_object: bool = False) -> Step:
    """``also`` names more functions the reply calls after ``propose_tool`` (to see them
    answered); ``as_object`` sends the arguments as a JSON object, as some servers do."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Step("propose_object" if as_object else "propose", arguments=text, extra_calls=also)


def text(content: str) -> Step:
    return Step("text", content=content)


def fail(status: int = 500) -> Step:
    return Step("fail", status=status)


def hang() -> Step:
    return Step("hang")


def trickle() -> Step:
    return Step("trickle")


def held(step: Step) -> Step:
    return Step("held", then=step)


def raw(body: Any) -> Step:
    return Step("raw", body=body)


def huge(size: int) -> Step:
    return Step("huge", status=size)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]  # names in lower case
    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))


@dataclass
class _State:
    steps: deque[Step] = field(default_factory=deque)
    requests: list[Recorded] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hanging: threading.Event = field(default_factory=threading.Event)
    sent: int = 0  # bytes of huge() bodies sent
    dropped: threading.Event = field(default_factory=threading.Event)  # a trickle's reader left


class ScriptedModel:
    def __init__(self) -> None:
        self._state = _State()
        handler = type("Handler", (_Handler,), {"state": self._state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The base URL, as ``TOOLKILN_LLM_BASE_URL`` takes it."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def requests(self) -> list[Recorded]:
        with self._state.lock:
            return list(self._state.requests)

    def script(self, *steps: Step) -> None:
        """Replace the script and forget earlier requests; a hung request is let go."""
        self.release()
        with self._state.lock:
            self._state.steps = deque(steps)
            self._state.requests.clear()
            self._state.released = threading.Event()
            self._state.hanging = threading.Event()
            self._state.sent = 0
            self._state.dropped = threading.Event()

    @property
    def sent_bytes(self) -> int:
        with self._state.lock:
            return self._state.sent

    def wait_dropped(self, timeout: float = 30.0) -> bool:
        """True once the client of a ``trickle()`` closed its connection."""
        return self._state.dropped.wait(timeout)

    def wait_hanging(self, timeout: float = 30.0) -> bool:
        """True once a request is being held by ``hang()``."""
        return self._state.hanging.wait(timeout)

    def release(self) -> None:
        self._state.released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedModel:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    state: _State
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return None

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _trickle(self, released: threading.Event, hanging: threading.Event) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        hanging.set()
        for _ in range(int(HANG_LIMIT_S / TRICKLE_EVERY_S)):
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:  # the client gave up
                self.state.dropped.set()
                return
            if released.wait(TRICKLE_EVERY_S):
                return

    def _huge(self, size: int) -> None:
        head = (
            b'{"id": "chatcmpl-huge", "object": "chat.completion", "created": 0, "model": "m", '
            b'"choices": [{"index": 0, "finish_reason": "stop", "message": '
            b'{"role": "assistant", "content": "'
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk = b"a" * 65536
        parts = [head, *[chunk] * (size // len(chunk)), b"a" * (size % len(chunk)), b'"}}]}']
        for part in parts:
            try:
                self.wfile.write(part)
            except OSError:  # the client stopped reading and closed
                return
            with self.state.lock:
                self.state.sent += len(part)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        with self.state.lock:
            self.state.requests.append(
                Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            n = len(self.state.requests)
            step = self.state.steps.popleft() if self.state.steps else None
            released, hanging = self.state.released, self.state.hanging
        if step is not None and step.kind == "held":
            hanging.set()
            released.wait(HANG_LIMIT_S)
            step = step.then
        if not self.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
        elif step is None:
            self._send(500, {"error": {"message": "script exhausted", "type": "server_error"}})
        elif step.kind == "hang":
            hanging.set()
            released.wait(HANG_LIMIT_S)
        elif step.kind == "trickle":
            self._trickle(released, hanging)
        elif step.kind == "raw":
            self._send(200, step.body)
        elif step.kind == "huge":
            self._huge(step.status)
        elif step.kind == "fail":
            self._send(
                step.status, {"error": {"message": "scripted failure", "type": "server_error"}}
            )
        else:
            self._send(200, _completion(n, body.get("model", ""), step))


def _completion(n: int, model: str, step: Step) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.content}
    if step.kind.startswith("propose"):
        names = ("propose_tool", *step.extra_calls)
        first = json.loads(step.arguments) if step.kind == "propose_object" else step.arguments
        message["tool_calls"] = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": first if i == 0 else "{}"},
            }
            for i, name in enumerate(names)
        ]
    return {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if step.kind.startswith("propose") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 1000 + n, "completion_tokens": 200, "total_tokens": 1200 + n},
    }
