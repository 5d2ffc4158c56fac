"""Describe: the record of one call, made on entry, before anything can fail.

Every rank numbers its calls on a Communicator: the number advances for every call,
refused or not, so the ranks' numbers stay equal as long as they make the same calls,
and the transport's tag for the call follows it.
"""

from __future__ import annotations

import sys


class Call:
    """One collective call on this rank: what the fingerprint, the reports and the
    flight recorder name it by."""

    __slots__ = ("seq", "collective", "file", "line")

    def __init__(self, seq: int, collective: str, depth: int) -> None:
        self.seq, self.collective = seq, collective
        frame = sys._getframe(depth)  # the caller's frame
        self.file, self.line = frame.f_code.co_filename, frame.f_lineno

    @property
    def site(self) -> str:
        """The caller's file:line."""
        return f"{self.file}:{self.line}"

    def name(self) -> str:
        return f"{self.collective} (call #{self.seq})"
