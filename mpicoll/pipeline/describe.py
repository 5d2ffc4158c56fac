"""Describe: the call's description (``Call``), made on entry, before anything can fail.

Every rank numbers its calls on a Communicator: the number advances for every call,
refused or not, so the ranks' numbers stay equal as long as they make the same calls,
and the transport's tag for the call follows it. The descriptions of calls are held by
the flight recorder's entries (``mpicoll.observe.recorder``): made once, rewritten for every
N-th call, so a call allocates none.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["Call"]


class Call:
    """One collective call on this rank: what the fingerprint, the reports and the
    flight recorder name it by.

    Its site is kept as the caller's code object and instruction offset, and turned into
    file:line only when something reads it: a frame's ``f_lineno`` scans the code's line
    table, which costs a microsecond in a long function, on every call.
    """

    __slots__ = ("seq", "collective", "code", "offset")

    def __init__(self, seq: int = 0, collective: str = "", depth: int | None = None) -> None:
        self.seq, self.collective = seq, collective
        self.code, self.offset = None, -1
        if depth is not None:
            self.at(sys._getframe(depth))

    def at(self, frame: Any) -> None:
        """The call is made in ``frame``, at its current instruction."""
        self.code, self.offset = frame.f_code, frame.f_lasti

    @property
    def file(self) -> str:
        return "?" if self.code is None else self.code.co_filename

    @property
    def line(self) -> int:
        if self.code is not None:
            for start, end, line in self.code.co_lines():
                if start <= self.offset < end:
                    return line or 0
        return 0

    @property
    def site(self) -> str:
        """The caller's file:line."""
        return f"{self.file}:{self.line}"

    def name(self) -> str:
        return f"{self.collective} (call #{self.seq})"
