"""Deliver: the result in the caller's kind of array, or the refusal this rank took part with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .validate import Verdict


def give(verdict: Verdict, result: Any, out: Any, back: Callable[[Any], Any]) -> Any:
    """What a collective returns: the caller's own ``out`` when given (filled in place),
    else the result in the caller's kind of array; a receive refusal is raised instead
    (the rank has taken part with workspace, so nothing is left for a later call)."""
    if verdict.receive is not None:
        raise verdict.receive
    if result is None:
        return None
    if verdict.strided is not None:  # out= was a strided view: the one copy into it
        verdict.strided[...] = result
    return out if out is not None else back(result)


def average(result: Any, op: Any, fn: Any, size: int, averages_itself: frozenset) -> None:
    """avg: the algorithms sum, then the receiving ranks divide (unless the library did)."""
    if op.average and fn not in averages_itself:
        result /= size
