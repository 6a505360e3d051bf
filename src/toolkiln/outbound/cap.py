"""How many bytes of an answer from outside may still be read.

One ``ByteCap`` per answer (an HTTP body) or per conversation (an SMTP session's replies),
charged as the bytes come off the wire, before anything holds them whole: past the cap the
reader stops and ``TooLarge`` is raised, so an answer of any size costs at most the cap in
memory (tests/security/test_outside_reads.py).
"""

from __future__ import annotations


class TooLarge(Exception):
    """An answer from outside went over its cap; what was read of it is dropped."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"the answer is over {max_bytes} bytes")
        self.max_bytes = max_bytes


class ByteCap:
    """``take`` counts bytes read; past ``max_bytes`` it raises ``TooLarge``, and again at
    every later call (a reader that goes on after the first refusal is refused too)."""

    __slots__ = ("max_bytes", "seen")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.seen = 0

    @property
    def exceeded(self) -> bool:
        return self.seen > self.max_bytes

    @property
    def room(self) -> int:
        return max(0, self.max_bytes - self.seen)

    def take(self, n: int) -> None:
        self.seen += n
        if self.seen > self.max_bytes:
            raise TooLarge(self.max_bytes)
