"""mpicoll's exceptions.

Every refusal is raised before any message is sent, so that every rank of a correct
program raises the same error and no rank is left waiting; a refusal only one rank can
see is raised after that rank took part (where it receives) or at once (where it
contributes), as mpicoll.pipeline describes. The classes subclass the
built-in exception a Python user would expect (``ValueError``/``TypeError``) so that
``except ValueError`` keeps working, and every one is a ``RuntimeError`` too, as
mpi4py's ``MPI.Exception`` and torch.distributed's errors are (``except RuntimeError``
around a torch program's collectives catches mpicoll.dist's refusals as gloo's).
"""

from __future__ import annotations


class MpicollError(RuntimeError):
    """Base class of every exception mpicoll raises on purpose."""


class InvalidArgumentError(MpicollError, ValueError):
    """An argument has a bad value (unknown name, root out of range, wrong shape)."""


class UnsupportedDtypeError(MpicollError, TypeError, ValueError):
    """The op, algorithm or backend cannot work on this dtype (a TypeError, as NumPy's;
    a ValueError too, as torch.distributed's: MAX of complex tensors)."""


class UnsupportedOpError(MpicollError, ValueError):
    """The algorithm cannot serve this reduction op (e.g. a ring with a non-commutative op)."""


class MismatchError(MpicollError, ValueError):
    """Ranks called a collective with arguments that disagree (found in check mode)."""


class RemoteError(MpicollError, ValueError):
    """Another rank refused the call (e.g. the root of a scatter saw bad input)."""


class AbortedError(MpicollError):
    """A peer of the local transport failed, so this rank gave up waiting."""


class ConfigError(MpicollError, ValueError):
    """A tuning or model file, or an MPICOLL_* variable, cannot be read (named in the message)."""


class SettingMismatchError(ConfigError, MismatchError):
    """A setting of the whole job (check mode, tracing) differs between ranks: a
    configuration error (``MPICOLL_CHECK``, ``MPICOLL_TRACE`` set on some ranks only) and
    a mismatch (``check=``, ``trace=``) both, so either except clause catches it."""


class ConcurrentCallError(MpicollError):
    """Two threads called collectives on one Communicator at once (use ``comm.dup()``)."""


class OpError(MpicollError):
    """A user's reduction op raised while combining data."""


class CollectiveError(MpicollError):
    """A failure inside a collective that is not one of the refusals above (the message
    names the call; the original exception is its ``__cause__``)."""


class CollectiveTimeoutError(AbortedError, TimeoutError):
    """A call, a wait or a monitored barrier did not finish within its timeout (the
    message names the rank, the call and what it waited for)."""
