"""Describe: the record of one call, made on entry, before anything can fail.

Every rank numbers its calls on a Communicator: the number advances for every call,
refused or not, so the ranks' numbers stay equal as long as they make the same calls,
and the transport's tag for the call follows it. The records of calls are the flight
recorder's (``mpicoll.watchdog``): made once, rewritten for every N-th call, so a call
allocates none.
"""

from __future__ import annotations

from ..watchdog import Call

__all__ = ["Call"]
