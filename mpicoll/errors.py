"""mpicoll's exceptions.

Every refusal is raised before any message is sent, so that every rank of a correct
program raises the same error and no rank is left waiting. The classes subclass the
built-in exception a Python user would expect (``ValueError``/``TypeError``) so that
``except ValueError`` keeps working.
"""

from __future__ import annotations


class MpicollError(Exception):
    """Base class of every exception mpicoll raises on purpose."""


class InvalidArgumentError(MpicollError, ValueError):
    """An argument has a bad value (unknown name, root out of range, wrong shape)."""


class UnsupportedDtypeError(MpicollError, TypeError):
    """The op, algorithm or backend cannot work on this dtype."""


class UnsupportedOpError(MpicollError, ValueError):
    """The algorithm cannot serve this reduction op (e.g. a ring with a non-commutative op)."""


class MismatchError(MpicollError, ValueError):
    """Ranks called a collective with arguments that disagree (found in check mode)."""


class RemoteError(MpicollError, ValueError):
    """Another rank refused the call (e.g. the root of a scatter saw bad input)."""


class AbortedError(MpicollError, RuntimeError):
    """A peer of the local transport failed, so this rank gave up waiting."""
