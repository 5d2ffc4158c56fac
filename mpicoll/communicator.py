"""The public API: a Communicator whose collectives run a chosen algorithm.

Every method validates its input, picks the algorithm, runs it over the backend's
transport (or calls the library's own collective for ``algorithm="native"``) and returns
a result in the shape table of DESIGN.md. Validation happens before any message, so a
bad call raises the same error on every rank; what only the root can see (broadcast or
scatter with ``None`` elsewhere) travels in a small integer header, so the other ranks
raise too. In check mode a fingerprint of the call is compared across ranks first.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from . import selection
from .algorithms import COLLECTIVES, REGISTRY
from .buffers import as_array, dtype_code, dtype_from_code, even_bounds, flat, result_buffer
from .errors import (
    InvalidArgumentError,
    MismatchError,
    RemoteError,
    UnsupportedOpError,
)
from .ops import Op, ReduceOp, op_name, resolve_op

BACKENDS = ("mpi", "local")

# broadcast/scatter header: [status, dtype code, itemsize, ndim, dim 0, dim 1, ...]
_MAX_NDIM = 32
_HEADER_LEN = 4 + _MAX_NDIM
_OK, _BAD_INPUT, _BAD_SHAPE, _TOO_MANY_DIMS, _BAD_OUT = 0, 1, 2, 3, 4
_REFUSALS = {
    _BAD_INPUT: "the root's x is not an array that can travel as bytes",
    _BAD_SHAPE: "the root's x does not have the number of ranks as its first dimension",
    _TOO_MANY_DIMS: f"the root's x has more than {_MAX_NDIM} dimensions",
    _BAD_OUT: "the root's out does not fit its x",
}
# broadcasts up to this many bytes travel in one message with their header
_PACKED_BYTES = 4096
_HEADER_BYTES = _HEADER_LEN * 8
_PACKET_BYTES = _HEADER_BYTES + _PACKED_BYTES
_FINGERPRINT_FIELDS = ("collective", "algorithm", "op", "root", "dtype", "shape")
_ANY = -1  # a fingerprint field this rank cannot know (broadcast/scatter with None)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def algorithms(collective: str, backend: str = "mpi") -> list[str]:
    """The names valid for ``algorithm=`` of ``collective`` on ``backend`` (not "auto")."""
    if collective not in COLLECTIVES:
        raise InvalidArgumentError(
            f"collective: unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}"
        )
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend: unknown backend {backend!r}; expected one of {BACKENDS}")
    names = list(REGISTRY[collective])
    return names + ["native"] if backend == "mpi" else names


class Communicator:
    """Collectives with named algorithms over an MPI communicator (or local threads).

    Args:
        comm: an mpi4py intracommunicator (default ``MPI.COMM_WORLD``); mpicoll works on
            a private duplicate, so its messages never match the caller's. For
            ``backend="local"``, an endpoint of ``mpicoll.transport.local.LocalWorld``.
        backend: "mpi" (default) or "local" (ranks as threads; no "native").
        check: compare a fingerprint of every call across ranks first, raising
            MismatchError on every rank when they disagree (default: ``MPICOLL_CHECK=1``).
    """

    def __init__(self, comm: Any = None, backend: str = "mpi", *, check: bool | None = None) -> None:
        if backend == "mpi":
            from mpi4py import MPI

            from .native import NATIVE, mpi_op
            from .transport.mpi import MPITransport

            comm = MPI.COMM_WORLD if comm is None else comm
            if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
                raise InvalidArgumentError(
                    f"comm: expected an mpi4py intracommunicator, got {type(comm).__name__}"
                )
            self._transport: Any = MPITransport(comm)
            self._native: dict[str, Callable[..., None]] = NATIVE
            self._native_op_check: Callable[[Op, np.dtype], object] | None = mpi_op
        elif backend == "local":
            from .transport.local import LocalTransport

            if not isinstance(comm, LocalTransport):
                raise InvalidArgumentError("comm: backend 'local' takes a LocalWorld endpoint")
            self._transport = comm
            self._native = {}
            self._native_op_check = None
        else:
            raise InvalidArgumentError(
                f"backend: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}"
            )
        self._backend = backend
        self.check = os.environ.get("MPICOLL_CHECK", "0") == "1" if check is None else check
        self._chosen: dict[tuple[str, str], Callable[..., None]] = {}
        self._auto: dict[tuple[str, int, bool], str] = {}  # what "auto" picked, by call
        # broadcast's first message: the header, and the data when it fits
        self._packet = np.zeros(_PACKET_BYTES, np.uint8)
        self._packet_header = self._packet[:_HEADER_BYTES].view(np.int64)

    @property
    def rank(self) -> int:
        return self._transport.rank

    @property
    def size(self) -> int:
        return self._transport.size

    @property
    def backend(self) -> str:
        return self._backend

    def free(self) -> None:
        """Release the private MPI communicator (also done at MPI finalization)."""
        free = getattr(self._transport, "free", None)
        if free is not None:
            free()

    # -- choosing and checking ------------------------------------------------------

    def _algorithm(self, collective: str, algorithm: str, nbytes: int,
                   op: Op | None = None) -> Callable[..., None]:
        """The function that runs ``algorithm`` (resolving "auto"), or a clear refusal."""
        if algorithm == "auto":
            key = (collective, nbytes, op is None or op.commutative)
            picked = self._auto.get(key)
            if picked is None:
                if len(self._auto) > 4096:
                    self._auto.clear()
                picked = self._auto[key] = selection.select(
                    collective, nbytes, self.size, op, bool(self._native))
            algorithm = picked
        fn = self._chosen.get((collective, algorithm))
        if fn is not None and (op is None or op.commutative):
            return fn
        if algorithm == "native":
            fn = self._native.get(collective)
            if fn is None:
                raise InvalidArgumentError(
                    f"algorithm: 'native' needs a library collective; backend "
                    f"{self._backend!r} has none"
                )
        else:
            spec = REGISTRY[collective].get(algorithm) if isinstance(algorithm, str) else None
            if spec is None:
                raise InvalidArgumentError(
                    f"algorithm: unknown {collective} algorithm {algorithm!r}; expected "
                    f"'auto' or one of {', '.join(algorithms(collective, self._backend))}"
                )
            if op is not None and spec.commutative_only and not op.commutative:
                able = [a.name for a in REGISTRY[collective].values() if not a.commutative_only]
                raise UnsupportedOpError(
                    f"algorithm: {collective} {algorithm!r} needs a commutative op; "
                    f"{op.name!r} is not. Algorithms that keep rank order: {', '.join(able)}"
                )
            fn = spec.fn
        self._chosen[(collective, algorithm)] = fn
        return fn

    def _root(self, root: Any) -> int:
        if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)):
            raise InvalidArgumentError(f"root: expected an int, got {type(root).__name__}")
        if not 0 <= root < self.size:
            raise InvalidArgumentError(f"root: {root} is out of range for {self.size} ranks")
        return int(root)

    def _rows(self, x: np.ndarray, what: str) -> None:
        if x.ndim == 0 or x.shape[0] != self.size:
            raise InvalidArgumentError(
                f"x: {what} expects shape ({self.size}, ...) with one row per rank, got {x.shape}"
            )

    def _fingerprint(self, collective: str, algorithm: str, op: Any = None, root: int = 0,
                     dtype: np.dtype | None = None, shape: tuple[int, ...] | None = None) -> None:
        """Check mode: compare this call's fingerprint across ranks; raise on a mismatch."""
        t = self._transport
        mine = np.array([
            COLLECTIVES.index(collective),
            _crc(str(algorithm)),
            _ANY if op is None else _crc(op_name(op) if not isinstance(op, Op) else op.name),
            root,
            _ANY if dtype is None else _crc(np.dtype(dtype).str),
            _ANY if shape is None else _crc(repr(tuple(shape))),
        ], np.int64)
        table = np.empty(t.size * mine.size, np.int64)
        table[t.rank * mine.size:(t.rank + 1) * mine.size] = mine
        t.begin()
        REGISTRY["all_gather"]["recursive_doubling"].fn(t, table, even_bounds(mine.size, t.size))
        rows = table.reshape(t.size, mine.size)
        reference = rows[0].copy()
        for field in range(mine.size):  # a rank that knows the field sets it for rank 0
            known = rows[:, field][rows[:, field] != _ANY]
            if known.size:
                reference[field] = known[0]
        differ = {}
        for r in range(t.size):
            fields = [name for f, name in enumerate(_FINGERPRINT_FIELDS)
                      if rows[r, f] != _ANY and rows[r, f] != reference[f]]
            if fields:
                differ[r] = fields
        if differ:
            detail = "; ".join(f"rank {r} differs in {', '.join(f)}" for r, f in differ.items())
            raise MismatchError(f"{collective}: ranks disagree on the call: {detail}")

    def _header_broadcast(self, header: np.ndarray, root: int) -> None:
        fn = self._native.get("broadcast") or REGISTRY["broadcast"]["binomial"].fn
        fn(self._transport, header, root)

    @staticmethod
    def _header_of(x: Any, status: int = _OK, header: np.ndarray | None = None) -> np.ndarray:
        """Fill ``header`` (or a new one) with x's dtype and shape, or a refusal status."""
        header = np.zeros(_HEADER_LEN, np.int64) if header is None else header
        if status == _OK and x.ndim > _MAX_NDIM:
            status = _TOO_MANY_DIMS
        if status != _OK:
            header[:4] = (status, 0, 0, 0)
            return header
        header[: 4 + x.ndim] = (_OK, dtype_code(x.dtype), x.dtype.itemsize, x.ndim, *x.shape)
        return header

    @staticmethod
    def _unpack_header(header: np.ndarray, root: int, collective: str) -> tuple[int, int, tuple[int, ...]]:
        status, code, itemsize, ndim = header[:4].tolist()
        if status != _OK:
            raise RemoteError(f"{collective}: root {root} refused the call: {_REFUSALS[status]}")
        return code, itemsize, tuple(header[4:4 + ndim].tolist())

    # -- collectives ------------------------------------------------------------------

    def broadcast(self, x: np.ndarray | None, root: int = 0, *, algorithm: str = "auto") -> np.ndarray:
        """Send the root's ``x`` to every rank.

        Args:
            x: at the root, the data; elsewhere a receive buffer of the same shape and
                dtype (filled in place and returned) or None.
            root: the rank whose data is sent.
            algorithm: "auto", "native" or a name from ``algorithms("broadcast")``.

        Returns:
            The root's data on every rank (the root's own ``x`` at the root).
        """
        t, root = self._transport, self._root(root)
        # Only the root knows shape and dtype, so a fixed-size packet goes first: the
        # header, and the data too when it fits, so that small broadcasts take one round.
        # "auto" is resolved from the packet's size, then from the header: the same on
        # every rank. A bad name is refused before any message.
        pack_fn = self._algorithm("broadcast", algorithm, _PACKET_BYTES)
        packet, header = self._packet, self._packet_header
        if t.rank == root:
            try:
                x = as_array(x, "x")
                self._header_of(x, header=header)
            except (TypeError, ValueError):
                self._header_of(None, _BAD_INPUT, header)
                # tell the others before raising, so no rank waits for data that never comes
                t.begin()
                pack_fn(t, packet, root)
                raise
            if header[0] == _OK and x.nbytes <= _PACKED_BYTES:
                packet[_HEADER_BYTES:_HEADER_BYTES + x.nbytes] = flat(x).view(np.uint8)
        elif x is not None:
            x = as_array(x, "x")
            if not x.flags.writeable:
                raise InvalidArgumentError("x: the receive buffer must be writeable")
        if self.check:
            self._fingerprint("broadcast", algorithm, root=root,
                              dtype=None if x is None else x.dtype,
                              shape=None if x is None else x.shape)
        t.begin()
        pack_fn(t, packet, root)
        if t.rank == root:
            if header[0] != _OK:
                raise InvalidArgumentError(f"x: {_REFUSALS[int(header[0])]}")
            if x.nbytes > _PACKED_BYTES:
                self._algorithm("broadcast", algorithm, x.nbytes)(t, flat(x), root)
            return x
        code, itemsize, shape = self._unpack_header(header, root, "broadcast")
        nbytes = math.prod(shape) * itemsize
        packed = nbytes <= _PACKED_BYTES
        fn = None if packed else self._algorithm("broadcast", algorithm, nbytes)
        mismatch = None
        if x is not None and (x.shape != shape or x.dtype.itemsize != itemsize
                              or (code >= 0 and x.dtype != dtype_from_code(code))):
            mismatch = (f"x: the receive buffer has shape {x.shape} and dtype {x.dtype}, "
                        f"but the root sends shape {shape} and "
                        f"{'dtype ' + str(dtype_from_code(code)) if code >= 0 else f'{itemsize}-byte items'}")
        if x is None and code < 0:
            mismatch = (f"x: the root's dtype has no header code; pass a receive buffer "
                        f"of shape {shape}")
        if mismatch is not None:  # take part with a scratch buffer, then refuse
            if fn is not None:
                fn(t, np.empty(nbytes, np.uint8), root)
            raise InvalidArgumentError(mismatch)
        if x is None:
            x = np.empty(shape, dtype_from_code(code))
        if packed:
            data = packet[_HEADER_BYTES:_HEADER_BYTES + nbytes]
            if x.flags.c_contiguous:
                x.reshape(-1).view(np.uint8)[...] = data
            else:
                x[...] = data.view(x.dtype).reshape(shape)
        elif x.flags.c_contiguous:
            fn(t, x.reshape(-1), root)
        else:
            buf = np.empty(x.size, x.dtype)
            fn(t, buf, root)
            x[...] = buf.reshape(x.shape)
        return x

    def scatter(self, x: np.ndarray | None, root: int = 0, *, algorithm: str = "auto",
                out: np.ndarray | None = None) -> np.ndarray:
        """Send row j of the root's ``x`` to rank j.

        Args:
            x: at the root, shape (size, *rest); elsewhere ignored (pass None).
            root: the rank whose data is scattered.
            algorithm: "auto", "native" or a name from ``algorithms("scatter")``.
            out: optional result buffer of shape rest.

        Returns:
            ``x[rank]`` of the root, shape rest.
        """
        t, root = self._transport, self._root(root)
        is_root = t.rank == root
        self._algorithm("scatter", algorithm, 0)  # a bad name is refused before any message
        if is_root:
            status = _BAD_INPUT  # what the others are told if a check below fails
            try:
                x = as_array(x, "x")
                status = _BAD_SHAPE
                self._rows(x, "scatter")
                status = _BAD_OUT
                result = result_buffer(out, x.shape[1:], x.dtype)
                header = self._header_of(x[0])
            except (TypeError, ValueError):
                t.begin()
                self._header_broadcast(self._header_of(None, status), root)
                raise
        else:
            header = np.empty(_HEADER_LEN, np.int64)
        if self.check:
            self._fingerprint("scatter", algorithm, root=root,
                              dtype=x.dtype if is_root else None if out is None else out.dtype,
                              shape=x.shape[1:] if is_root else None if out is None else out.shape)
        t.begin()
        self._header_broadcast(header, root)
        code, itemsize, shape = self._unpack_header(header, root, "scatter")
        # "auto" resolved from the header, so that every rank picks the same algorithm
        fn = self._algorithm("scatter", algorithm, math.prod(shape) * itemsize * t.size)
        if is_root:
            fn(t, flat(x), result.reshape(-1), root)
            return result
        refusal = None
        if code < 0 and out is None:
            refusal = InvalidArgumentError(
                f"out: the root's dtype has no header code; pass out of shape {shape}")
        else:
            try:
                result = result_buffer(out, shape, out.dtype if code < 0 else dtype_from_code(code))
            except InvalidArgumentError as exc:
                refusal = exc
        if refusal is not None:  # take part with a scratch buffer, then refuse
            fn(t, None, np.empty(math.prod(shape) * itemsize, np.uint8), root)
            raise refusal
        fn(t, None, result.reshape(-1), root)
        return result

    def gather(self, x: np.ndarray, root: int = 0, *, algorithm: str = "auto",
               out: np.ndarray | None = None) -> np.ndarray | None:
        """Collect every rank's ``x`` on the root, stacked in rank order.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            root: the rank that receives.
            algorithm: "auto", "native" or a name from ``algorithms("gather")``.
            out: optional result buffer of shape (size, *x.shape), at the root.

        Returns:
            At the root, shape (size, *x.shape); None elsewhere.
        """
        t, root = self._transport, self._root(root)
        x = as_array(x, "x")
        fn = self._algorithm("gather", algorithm, x.nbytes * t.size)
        is_root = t.rank == root
        result = result_buffer(out, (t.size, *x.shape), x.dtype) if is_root else None
        if self.check:
            self._fingerprint("gather", algorithm, root=root, dtype=x.dtype, shape=x.shape)
        src = flat(x)
        dst = None if result is None else result.reshape(-1)
        src = self._unaliased(src, dst, out)
        t.begin()
        fn(t, src, dst, root)
        return result

    def all_gather(self, x: np.ndarray, *, algorithm: str = "auto",
                   out: np.ndarray | None = None) -> np.ndarray:
        """Collect every rank's ``x`` on every rank, stacked in rank order.

        Args:
            x: this rank's data; the same shape and dtype on every rank. It may be
                ``out[rank]`` itself (in place).
            algorithm: "auto", "native" or a name from ``algorithms("all_gather")``.
            out: optional result buffer of shape (size, *x.shape).

        Returns:
            Shape (size, *x.shape), on every rank.
        """
        t = self._transport
        x = as_array(x, "x")
        fn = self._algorithm("all_gather", algorithm, x.nbytes * t.size)
        result = result_buffer(out, (t.size, *x.shape), x.dtype)
        if self.check:
            self._fingerprint("all_gather", algorithm, dtype=x.dtype, shape=x.shape)
        buf = result.reshape(-1)
        bounds = even_bounds(x.size, t.size)
        mine = buf[bounds[t.rank]:bounds[t.rank + 1]]
        src = flat(x)
        if not (src.size and src.__array_interface__["data"][0] == mine.__array_interface__["data"][0]):
            mine[...] = src  # the result's own row, unless x already is that row
        t.begin()
        fn(t, buf, bounds)
        return result

    def _reduction(self, collective: str, x: Any, op: Any, algorithm: str,
                   nbytes_factor: int = 1) -> tuple[np.ndarray, Op, Callable[..., None]]:
        x = as_array(x, "x")
        opd = resolve_op(op, x.dtype)
        fn = self._algorithm(collective, algorithm, x.nbytes * nbytes_factor, opd)
        if self._native_op_check is not None and fn is self._native[collective]:
            self._native_op_check(opd, x.dtype)  # the MPI library must know dtype and op
        return x, opd, fn

    def _unaliased(self, src: np.ndarray, dst: np.ndarray | None,
                   out: np.ndarray | None) -> np.ndarray:
        """``src``, or a copy of it in workspace when it overlaps the user's ``out``.

        Only a user's buffer can overlap: a result mpicoll allocated never does.
        """
        if out is None or dst is None or not np.may_share_memory(src, dst):
            return src
        copy = self._transport.scratch(src.size, src.dtype, slot=3)
        copy[...] = src
        return copy

    def _average(self, result: np.ndarray, opd: Op) -> None:
        if opd.average:
            np.divide(result, self.size, out=result)

    def reduce(self, x: np.ndarray, op: str | ReduceOp = "sum", root: int = 0, *,
               algorithm: str = "auto", out: np.ndarray | None = None) -> np.ndarray | None:
        """Combine every rank's ``x`` elementwise with ``op``; the result goes to the root.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" or a ReduceOp.
            root: the rank that receives the result.
            algorithm: "auto", "native" or a name from ``algorithms("reduce")``.
            out: optional result buffer at the root (may be ``x``: in place).

        Returns:
            At the root, the reduction, shape x.shape; None elsewhere.
        """
        t, root = self._transport, self._root(root)
        x, opd, fn = self._reduction("reduce", x, op, algorithm)
        result = result_buffer(out, x.shape, x.dtype) if t.rank == root else None
        if self.check:
            self._fingerprint("reduce", algorithm, opd, root, x.dtype, x.shape)
        src = flat(x)
        dst = None if result is None else result.reshape(-1)
        src = self._unaliased(src, dst, out)  # linear reduce reads x after writing out
        t.begin()
        fn(t, src, dst, opd, root)
        if result is not None:
            self._average(result, opd)
        return result

    def all_reduce(self, x: np.ndarray, op: str | ReduceOp = "sum", *, algorithm: str = "auto",
                   out: np.ndarray | None = None) -> np.ndarray:
        """Combine every rank's ``x`` elementwise with ``op``; every rank gets the result.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" or a ReduceOp.
            algorithm: "auto", "native" or a name from ``algorithms("all_reduce")``.
            out: optional result buffer (``out=x`` reduces in place).

        Returns:
            The reduction, shape x.shape, on every rank.
        """
        t = self._transport
        x, opd, fn = self._reduction("all_reduce", x, op, algorithm)
        result = result_buffer(out, x.shape, x.dtype)
        if self.check:
            self._fingerprint("all_reduce", algorithm, opd, 0, x.dtype, x.shape)
        src, dst = flat(x), result.reshape(-1)
        if out is x:
            src = dst  # in place: every all_reduce algorithm allows src is dst
        else:
            src = self._unaliased(src, dst, out)
        t.begin()
        fn(t, src, dst, opd)
        self._average(result, opd)
        return result

    def reduce_scatter(self, x: np.ndarray, op: str | ReduceOp = "sum", *,
                       algorithm: str = "auto", out: np.ndarray | None = None) -> np.ndarray:
        """Reduce every rank's ``x`` with ``op``; rank j gets row j of the result.

        Args:
            x: shape (size, *rest); the same on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor" or a ReduceOp.
            algorithm: "auto", "native" or a name from ``algorithms("reduce_scatter")``.
            out: optional result buffer of shape rest.

        Returns:
            Row [rank] of the reduction, shape rest.
        """
        t = self._transport
        x, opd, fn = self._reduction("reduce_scatter", x, op, algorithm)
        self._rows(x, "reduce_scatter")
        result = result_buffer(out, x.shape[1:], x.dtype)
        if self.check:
            self._fingerprint("reduce_scatter", algorithm, opd, 0, x.dtype, x.shape)
        src, dst = flat(x), result.reshape(-1)
        src = self._unaliased(src, dst, out)
        t.begin()
        fn(t, src, even_bounds(dst.size, t.size), opd, dst)
        self._average(result, opd)
        return result

    def all_to_all(self, x: np.ndarray, *, algorithm: str = "auto",
                   out: np.ndarray | None = None) -> np.ndarray:
        """Send row j of ``x`` to rank j; row i of the result came from rank i.

        Args:
            x: shape (size, *rest); the same shape and dtype on every rank.
            algorithm: "auto", "native" or a name from ``algorithms("all_to_all")``.
            out: optional result buffer of shape x.shape (may be ``x``: in place).

        Returns:
            Shape x.shape: the transpose of the rows across ranks.
        """
        t = self._transport
        x = as_array(x, "x")
        self._rows(x, "all_to_all")
        fn = self._algorithm("all_to_all", algorithm, x.nbytes)
        result = result_buffer(out, x.shape, x.dtype)
        if self.check:
            self._fingerprint("all_to_all", algorithm, dtype=x.dtype, shape=x.shape)
        src, dst = flat(x), result.reshape(-1)
        src = self._unaliased(src, dst, out)
        t.begin()
        fn(t, src, dst)
        return result

    def barrier(self, *, algorithm: str = "auto") -> None:
        """Return only once every rank has entered the barrier.

        Args:
            algorithm: "auto", "native" or a name from ``algorithms("barrier")``.
        """
        fn = self._algorithm("barrier", algorithm, 0)
        if self.check:
            self._fingerprint("barrier", algorithm)
        self._transport.begin()
        fn(self._transport)
