"""The public API: a Communicator whose collectives run a chosen algorithm.

Every method validates its input, picks the algorithm, runs it over the backend's
transport (or calls the library's own collective for ``algorithm="native"``) and returns
a result in the shape table of DESIGN.md. Validation happens before any message, so a
bad call raises the same error on every rank; what only the root can see (broadcast or
scatter with ``None`` elsewhere) travels in a small integer header, so the other ranks
raise too. In check mode a fingerprint of the call is compared across ranks first.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import selection
from .algorithms import COLLECTIVES, OPTION_MINIMUM, REGISTRY
from .arrays import (
    as_array,
    assign_from_host,
    cupy_module,
    device_like,
    empty,
    may_share_memory,
    same,
    to_host,
)
from .buffers import (
    counts_bounds,
    dtype_code,
    dtype_from_code,
    even_bounds,
    flat,
    result_buffer,
)
from .errors import (
    InvalidArgumentError,
    MismatchError,
    RemoteError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from .native_nccl import AVERAGES_ITSELF as _AVERAGES_ITSELF
from .ops import Op, ReduceOp, op_name, resolve_op
from .tracing import Tracer, TracingTransport, chrome_trace, gather_events, timed_op
from .work import ProgressThread, Work

BACKENDS = ("mpi", "nccl", "local")

# broadcast/scatter header: [status, dtype code, itemsize, ndim, dim 0, dim 1, ...]
_MAX_NDIM = 32
_HEADER_LEN = 4 + _MAX_NDIM
_OK, _BAD_INPUT, _BAD_SHAPE, _TOO_MANY_DIMS, _BAD_OUT, _BAD_COUNTS, _NO_ROWS, _NO_CODE = range(8)
_REFUSALS = {
    _BAD_INPUT: "the root's x is not an array that can travel as bytes",
    _BAD_SHAPE: "the root's x does not have the number of ranks as its first dimension",
    _TOO_MANY_DIMS: f"the root's x has more than {_MAX_NDIM} dimensions",
    _BAD_OUT: "the root's out does not fit its x",
    _BAD_COUNTS: "the root's counts do not fit its x",
    _NO_ROWS: "the root's x has no first dimension to split",
    _NO_CODE: "the root's dtype has no header code, so the others cannot allocate a result",
}
# broadcasts up to this many bytes travel in one message with their header
_PACKED_BYTES = 4096
_HEADER_BYTES = _HEADER_LEN * 8
_ON_DEVICE = 1 << 16  # in the header's ndim field: the root's array is on the GPU
_PACKET_BYTES = _HEADER_BYTES + _PACKED_BYTES
_FINGERPRINT_FIELDS = ("collective", "algorithm", "op", "root", "dtype", "shape")
_TRACED = 0  # communicators traced to MPICOLL_TRACE's file so far
_ANY = -1  # a fingerprint field this rank cannot know (broadcast/scatter with None)


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _dtype_crc(dtype: np.dtype) -> int:
    return _crc(dtype.str + dtype.name)  # the name tells bfloat16 from other 2-byte voids


def _give(result: Any, out: Any, back: Callable[[Any], Any]) -> Any:
    """What a collective returns: the caller's own ``out`` when given (filled in place),
    else the result in the caller's kind of array."""
    if result is None:
        return None
    return out if out is not None else back(result)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    return a.size == b.size and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def _no_native(op: Op, dtype: np.dtype) -> None:
    raise UnsupportedDtypeError("this backend has no native collectives")


def algorithms(collective: str, backend: str = "mpi") -> list[str]:
    """The names valid for ``algorithm=`` of ``collective`` on ``backend`` (not "auto")."""
    if collective not in COLLECTIVES:
        raise InvalidArgumentError(
            f"collective: unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}"
        )
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend: unknown backend {backend!r}; expected one of {BACKENDS}")
    names = list(REGISTRY[collective])
    return names if backend == "local" else names + ["native"]


def _mpi_comm(comm: Any) -> Any:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise InvalidArgumentError(
            f"comm: expected an mpi4py intracommunicator, got {type(comm).__name__}")
    return comm


def _current(stream: Any) -> Any:
    """A context that makes ``stream`` the current CUDA stream (none: nothing to do)."""
    return contextlib.nullcontext() if stream is None else stream


def _collective(method: Callable[..., Any]) -> Callable[..., Any]:
    """Give a collective its common keywords.

    ``stream=``: run it with that CUDA stream current (its messages, copies and reductions
    are queued on it). Default: the current stream.
    ``async_op=True``: return a ``mpicoll.Work`` at once; its ``wait()`` returns the result
    (see ``mpicoll.work`` for how it progresses). The input must not change until then.
    """
    name = method.__name__

    @functools.wraps(method)
    def collective(self: Communicator, *args: Any, stream: Any = None, async_op: bool = False,
                   **kwargs: Any) -> Any:
        if stream is not None and (not hasattr(stream, "ptr") or not hasattr(stream, "__enter__")):
            raise InvalidArgumentError(
                f"stream: expected a cupy.cuda.Stream, got {type(stream).__name__}")
        if async_op:
            return self._submit(name, method, args, kwargs, stream)
        tracer = self._tracer
        if tracer is not None:
            tracer.begin_call(name)
        try:
            with _current(stream):
                return method(self, *args, **kwargs)
        finally:
            if tracer is not None:
                tracer.end_call()

    return collective


class Communicator:
    """Collectives with named algorithms over MPI, NCCL, or threads in one process.

    Args:
        comm: an mpi4py intracommunicator (default ``MPI.COMM_WORLD``); mpicoll works on
            a private duplicate, so its messages never match the caller's. For
            ``backend="local"``, an endpoint of ``mpicoll.transport.local.LocalWorld``.
        backend: "mpi" (default: NumPy or CuPy arrays, CUDA-aware or staged through
            pinned memory), "nccl" (CuPy arrays; NCCL's collectives as "native", every
            other algorithm over ncclSend/ncclRecv; ``comm`` bootstraps it and carries
            the small host messages), or "local" (ranks as threads; no "native").
        check: compare a fingerprint of every call across ranks first, raising
            MismatchError on every rank when they disagree (default: ``MPICOLL_CHECK=1``).

    Every collective takes ``stream=`` (a ``cupy.cuda.Stream``) for GPU arrays: the call
    is queued on it, and its result is ready when the stream gets there, as with NCCL.
    """

    def __init__(self, comm: Any = None, backend: str = "mpi", *, check: bool | None = None,
                 trace: bool | str | None = None) -> None:
        self._like: Any = None  # an array of the library a rank without input allocates in
        self._packed_bytes = _PACKED_BYTES
        if backend == "mpi":
            from .native import NATIVE, mpi_op
            from .transport.mpi import MPITransport

            self._transport: Any = MPITransport(_mpi_comm(comm))
            self._native: dict[str, Callable[..., None]] = NATIVE
            self._native_op_check: Callable[[Op, np.dtype], object] = mpi_op
        elif backend == "nccl":
            from .cuda import require_nccl, select_device
            from .native import NATIVE as MPI_NATIVE
            from .native_nccl import NATIVE, nccl_op
            from .transport.mpi import MPITransport
            from .transport.nccl import NCCLTransport

            comm = _mpi_comm(comm)
            require_nccl()
            self.device = select_device(comm)
            control = MPITransport(comm)
            self._transport = NCCLTransport(control.comm)
            self._control, self._control_native = control, MPI_NATIVE
            self._native = NATIVE
            self._native_op_check = nccl_op
            self._like = self._transport._device_like
            self._packed_bytes = -1  # data always goes over NCCL, never in the host packet
        elif backend == "local":
            from .transport.local import LocalTransport

            if not isinstance(comm, LocalTransport):
                raise InvalidArgumentError("comm: backend 'local' takes a LocalWorld endpoint")
            self._transport = comm
            self._native = {}
            self._native_op_check = _no_native
        else:
            raise InvalidArgumentError(
                f"backend: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}"
            )
        self._tracer: Tracer | None = None
        trace = os.environ.get("MPICOLL_TRACE") or None if trace is None else trace
        if trace:
            if backend == "nccl":
                raise InvalidArgumentError("trace: tracing runs on the mpi and local backends")
            self._tracer = Tracer(self._transport.rank, self._transport.size)
            self._transport = TracingTransport(self._transport, self._tracer)
            if isinstance(trace, str):  # MPICOLL_TRACE=path: written when Python exits
                import atexit

                global _TRACED
                _TRACED += 1  # the second traced communicator writes path.2.json, ...
                if _TRACED > 1:
                    root, ext = os.path.splitext(trace)
                    trace = f"{root}.{_TRACED}{ext or '.json'}"
                atexit.register(self.write_trace, trace)
        if backend != "nccl":  # headers, counts and fingerprints share the data's transport
            self._control, self._control_native = self._transport, self._native
        self._backend = backend
        self._progress: ProgressThread | None = None  # runs the async_op=True calls
        self.check = os.environ.get("MPICOLL_CHECK", "0") == "1" if check is None else check
        self._chosen: dict[tuple[str, str], tuple[Callable[..., None], Any]] = {}
        self._auto: dict[tuple, str] = {}  # what "auto" picked, by call
        self._native_ok: dict[tuple[Op, np.dtype], bool] = {}
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

    # -- public hooks for the tools (bench, model fit): no reaching into private fields --

    @property
    def transport(self) -> Any:
        """The transport the algorithms run over (tools time algorithms on it directly;
        call ``transport.begin()`` before each operation, on every rank alike)."""
        return self._transport

    @property
    def control_comm(self) -> Any:
        """The mpi4py communicator of this Communicator's host messages (a private
        duplicate), or None on the local backend. For tools' own metadata."""
        return getattr(self._control, "comm", None)

    def native_collective(self, collective: str) -> Callable[..., None]:
        """The backend's own collective for ``collective`` with the algorithms'
        signature, or a refusal where the backend has none."""
        return self._lookup(collective, "native")[0]

    def native_serves(self, op: Any, dtype: Any) -> bool:
        """Whether ``algorithm="native"`` can run a call with this op and dtype."""
        dtype = None if dtype is None else np.dtype(dtype)
        opd = op if op is None or isinstance(op, Op) else resolve_op(op, dtype)
        return self._native_serves(opd, dtype)

    def _duplicate(self) -> Communicator:
        """A communicator of the same ranks and backend whose messages never match this
        one's (collective: every rank calls it at the same point)."""
        if self._backend == "local":
            return Communicator(self._transport.duplicate(), "local", check=self.check,
                                trace=False)
        return Communicator(self._transport.comm, self._backend, check=self.check, trace=False)

    def _submit(self, name: str, method: Callable[..., Any], args: tuple, kwargs: dict,
                stream: Any) -> Work:
        if self._backend == "nccl":  # NCCL is asynchronous already: queue it on the stream
            work = Work(name)
            current = stream if stream is not None else cupy_module().cuda.get_current_stream()
            try:
                with current:
                    result = method(self, *args, **kwargs)
                work._event = cupy_module().cuda.Event(block=False, disable_timing=True)
                work._event.record(current)
                work._set(result)
            except Exception as exc:  # noqa: BLE001 - raised by wait(), as on the MPI backend
                work._set(error=exc)
            return work
        if self._progress is None:
            if self._backend == "mpi":
                from mpi4py import MPI

                if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
                    raise InvalidArgumentError(
                        "async_op=True: needs MPI_THREAD_MULTIPLE (mpi4py's default; "
                        "mpi4py.rc.thread_level was set lower)")
            self._progress = ProgressThread(self._duplicate())

        def call(duplicate: Communicator) -> Any:
            with _current(stream):
                return method(duplicate, *args, **kwargs)

        return self._progress.submit(name, call)

    def trace_events(self) -> list[dict[str, Any]]:
        """This rank's traced events so far (``trace=True``), in its own clock."""
        if self._tracer is None:
            raise InvalidArgumentError("trace_events: this communicator was made without trace=True")
        return self._tracer.events

    def write_trace(self, path: str) -> None:
        """Collective: merge every rank's trace on rank 0, clocks aligned to rank 0's, and
        write it there as Chrome trace JSON (Perfetto, chrome://tracing). MPI backend."""
        if self._tracer is None:
            raise InvalidArgumentError("write_trace: this communicator was made without trace=True")
        if self._backend != "mpi":
            raise InvalidArgumentError("write_trace: merges over MPI; on the local backend "
                                       "use trace_events() of each rank")
        events = gather_events(self._tracer, self._transport.comm)
        if events is not None:
            with open(path, "w") as f:
                json.dump(chrome_trace(events, self.size), f)

    def free(self) -> None:
        """Release the private MPI communicator (also done at MPI finalization)."""
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        for t in {id(self._transport): self._transport, id(self._control): self._control}.values():
            free = getattr(t, "free", None)
            if free is not None:
                free()

    def _array(self, x: Any) -> tuple[Any, Callable[[Any], Any]]:
        """The input as an array (and how to give a result back), refused on NCCL when it
        is not on the GPU."""
        array, back = as_array(x, "x")
        if self._like is not None and type(array) is np.ndarray:
            raise InvalidArgumentError(
                "x: backend 'nccl' moves GPU arrays (CuPy, or a CUDA __dlpack__ tensor); "
                "got a host array: use backend 'mpi' for host memory")
        return array, back

    # -- choosing and checking ------------------------------------------------------

    def _algorithm(self, collective: str, algorithm: str, nbytes: int, op: Op | None = None,
                   options: dict[str, Any] | None = None, *, dtype: np.dtype | None = None,
                   uneven: bool = False) -> Callable[..., None]:
        """The function that runs ``algorithm`` (resolving "auto"), or a clear refusal.

        Refused: an unknown name; a non-commutative op on an algorithm that reorders
        operands; uneven blocks on an algorithm that needs equal ones; tuning options
        the algorithm does not take; "native" where the library cannot reduce the
        dtype. "auto" never picks a refused one.
        """
        if algorithm == "auto":
            if options:
                raise InvalidArgumentError(
                    f"{', '.join(options)}: tuning options need a named algorithm, not 'auto'")
            native_ok = self._native_serves(op, dtype)
            key = (collective, nbytes, op is None or op.commutative, native_ok, uneven)
            picked = self._auto.get(key)
            if picked is None:
                if len(self._auto) > 4096:
                    self._auto.clear()
                # NCCL's own collectives are tuned for the GPU: auto takes them where they
                # serve; tables and thresholds measured over MPI do not apply to NCCL
                picked = self._auto[key] = "native" if native_ok and self._backend == "nccl" \
                    else selection.select(collective, nbytes, self.size, op, native_ok, uneven)
            algorithm = picked
        spec = self._chosen.get((collective, algorithm))
        if spec is None:
            spec = self._chosen[(collective, algorithm)] = self._lookup(collective, algorithm)
        fn, registered = spec
        if self._tracer is not None:
            self._tracer.chose(algorithm, nbytes)
        if registered is None:  # native
            if op is not None and not self._native_serves(op, dtype):
                self._native_op_check(op, dtype)  # the library must know dtype and op
            if options:
                raise InvalidArgumentError(
                    f"{', '.join(options)}: 'native' takes no tuning options")
            return fn
        if op is not None and registered.commutative_only and not op.commutative:
            able = [a.name for a in REGISTRY[collective].values() if not a.commutative_only]
            raise UnsupportedOpError(
                f"algorithm: {collective} {algorithm!r} needs a commutative op; "
                f"{op.name!r} is not. Algorithms that keep rank order: {', '.join(able)}"
                + (", native" if self._native else "")
            )
        if uneven and registered.even_only:
            able = [a.name for a in REGISTRY[collective].values() if not a.even_only]
            raise InvalidArgumentError(
                f"algorithm: {collective} {algorithm!r} needs equal blocks; for uneven "
                f"counts use one of {', '.join(able + (['native'] if self._native else []))}"
            )
        if options:
            for name, value in options.items():
                if name not in registered.options:
                    takes = ", ".join(registered.options) or "none"
                    raise InvalidArgumentError(
                        f"{name}: {collective} {algorithm!r} takes no option {name!r} "
                        f"(its options: {takes})")
                if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
                        or value < OPTION_MINIMUM[name]):
                    raise InvalidArgumentError(
                        f"{name}: expected an int >= {OPTION_MINIMUM[name]}, got {value!r}")
            return functools.partial(fn, **{k: int(v) for k, v in options.items()})
        return fn

    def auto_algorithm(self, collective: str, nbytes: int, op: Any = None,
                       dtype: Any = None, uneven: bool = False) -> str:
        """The algorithm ``algorithm="auto"`` runs for a call of ``collective`` moving
        ``nbytes`` (the benchmark's size: the whole buffer for reductions and broadcast,
        the whole result for gathers, the whole input for scatter and all_to_all)."""
        if collective not in COLLECTIVES:
            raise InvalidArgumentError(f"collective: unknown collective {collective!r}")
        dtype = None if dtype is None else np.dtype(dtype)
        opd = None if op is None else resolve_op(op, dtype if dtype is not None else np.dtype("f8"))
        return selection.select(collective, nbytes, self.size, opd,
                                self._native_serves(opd, dtype), uneven)

    def _lookup(self, collective: str, algorithm: Any) -> tuple[Callable[..., None], Any]:
        """(function, registry entry) of a name; the entry is None for "native"."""
        if algorithm == "native":
            fn = self._native.get(collective)
            if fn is None:
                raise InvalidArgumentError(
                    f"algorithm: 'native' needs a library collective; backend "
                    f"{self._backend!r} has none"
                )
            return fn, None
        registered = REGISTRY[collective].get(algorithm) if isinstance(algorithm, str) else None
        if registered is None:
            raise InvalidArgumentError(
                f"algorithm: unknown {collective} algorithm {algorithm!r}; expected "
                f"'auto' or one of {', '.join(algorithms(collective, self._backend))}"
            )
        return registered.fn, registered

    def _native_serves(self, op: Op | None, dtype: np.dtype | None) -> bool:
        """Whether "native" can run this call (the library knows the dtype and op)."""
        if not self._native:
            return False
        if op is None or dtype is None:
            return True
        key = (op, dtype)
        ok = self._native_ok.get(key)
        if ok is None:
            try:
                self._native_op_check(op, dtype)
                ok = True
            except UnsupportedDtypeError:
                ok = False
            self._native_ok[key] = ok
        return ok

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

    def _counts(self, counts: Any, name: str) -> list[int]:
        """``counts`` as p non-negative ints, or a refusal naming the argument."""
        try:
            values = list(counts)
        except TypeError:
            raise InvalidArgumentError(
                f"{name}: expected a sequence of {self.size} ints, got {type(counts).__name__}"
            ) from None
        if len(values) != self.size:
            raise InvalidArgumentError(
                f"{name}: expecting {self.size} items (one per rank), got {len(values)}")
        for c in values:
            if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)) or c < 0:
                raise InvalidArgumentError(f"{name}: expected non-negative ints, got {c!r}")
        return [int(c) for c in values]

    def _v_input(self, x: Any, collective: str) -> tuple[Any, Callable[[Any], Any]]:
        x, back = self._array(x)
        if x.ndim == 0:
            raise InvalidArgumentError(
                f"x: {collective} needs at least one dimension (the rows this rank gives)")
        return x, back

    def _mismatch(self, signatures: np.ndarray, collective: str) -> None:
        """Raise on every rank when the ranks' dtype/row-shape signatures differ."""
        differ = [r for r in range(self.size) if signatures[r] != signatures[0]]
        if differ:
            raise MismatchError(
                f"{collective}: ranks disagree on the dtype or the shape after the first "
                f"dimension: rank(s) {', '.join(map(str, differ))} differ from rank 0")

    def _row_table(self, x: np.ndarray, collective: str) -> list[int]:
        """All-gather every rank's (rows, dtype and row shape signature); return the rows.

        Every rank sees the whole table, so a disagreement raises on every rank.
        """
        t = self._control
        table = np.empty(2 * t.size, np.int64)
        table[2 * t.rank:2 * t.rank + 2] = (x.shape[0], _crc(f"{_dtype_crc(x.dtype)}{x.shape[1:]}"))
        fn = self._control_native.get("all_gather") or REGISTRY["all_gather"]["recursive_doubling"].fn
        t.begin()
        fn(t, table, even_bounds(2, t.size))
        self._mismatch(table[1::2], collective)
        return table[0::2].tolist()

    def _fingerprint(self, collective: str, algorithm: str, op: Any = None, root: int = 0,
                     dtype: np.dtype | None = None, shape: tuple[int, ...] | None = None) -> None:
        """Check mode: compare this call's fingerprint across ranks; raise on a mismatch."""
        t = self._control
        mine = np.array([
            COLLECTIVES.index(collective),
            _crc(str(algorithm)),
            _ANY if op is None else _crc(op_name(op) if not isinstance(op, Op) else op.name),
            root,
            _ANY if dtype is None else _dtype_crc(np.dtype(dtype)),
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

    def _header_pack(self, t: Any, packet: np.ndarray, root: int) -> None:
        self._header_broadcast(packet, root)

    def _header_broadcast(self, header: np.ndarray, root: int) -> None:
        fn = self._control_native.get("broadcast") or REGISTRY["broadcast"]["binomial"].fn
        self._control.begin()
        fn(self._control, header, root)

    @staticmethod
    def _header_of(dtype: np.dtype | None, shape: tuple[int, ...] | None, status: int = _OK,
                   header: np.ndarray | None = None, extra: int = 0, device: bool = False,
                   ) -> np.ndarray:
        """Fill ``header`` (or a new one, with ``extra`` slots after it) with a dtype,
        shape and whether the data is on the GPU, or a refusal status."""
        header = np.zeros(_HEADER_LEN + extra, np.int64) if header is None else header
        if status == _OK and len(shape) > _MAX_NDIM:
            status = _TOO_MANY_DIMS
        if status != _OK:
            header[:4] = (status, 0, 0, 0)
            return header
        header[: 4 + len(shape)] = (_OK, dtype_code(dtype), dtype.itemsize,
                                    len(shape) | (_ON_DEVICE if device else 0), *shape)
        return header

    @staticmethod
    def _unpack_header(header: np.ndarray, root: int, collective: str
                       ) -> tuple[int, int, tuple[int, ...], bool]:
        """(dtype code, itemsize, shape, on the GPU) from a root's header."""
        status, code, itemsize, ndim = header[:4].tolist()
        if status != _OK:
            raise RemoteError(f"{collective}: root {root} refused the call: {_REFUSALS[status]}")
        device, ndim = bool(ndim & _ON_DEVICE), ndim & (_ON_DEVICE - 1)
        return code, itemsize, tuple(header[4:4 + ndim].tolist()), device

    def _receive_like(self, device: bool) -> tuple[Any, InvalidArgumentError | None]:
        """What a rank without a buffer of its own allocates its result like: the root's
        array library (CuPy when the root's data is on the GPU), or why it cannot."""
        if not device or self._like is not None:
            return self._like, None
        try:
            return device_like(), None
        except InvalidArgumentError as exc:
            return None, exc

    # -- collectives ------------------------------------------------------------------

    @_collective
    def broadcast(self, x: np.ndarray | None, root: int = 0, *, algorithm: str = "auto",
                  **options: int) -> np.ndarray:
        """Send the root's ``x`` to every rank.

        Args:
            x: at the root, the data; elsewhere a receive buffer of the same shape and
                dtype (filled in place and returned) or None.
            root: the rank whose data is sent.
            algorithm: "auto", "native" or a name from ``algorithms("broadcast")``.
            **options: the algorithm's tuning options (``radix=`` for knomial,
                ``segment_bytes=`` for pipelined_chain).

        Returns:
            The root's data on every rank (the root's own ``x`` at the root).
        """
        t, root = self._transport, self._root(root)
        # Only the root knows shape and dtype, so a fixed-size packet goes first: the
        # header, and the data too when it fits, so that small broadcasts take one round.
        # "auto" is resolved from the packet's size, then from the header: the same on
        # every rank. A bad name is refused before any message.
        pack_fn = self._algorithm("broadcast", algorithm, _PACKET_BYTES, options=options)
        if self._control is not t:  # NCCL: the host packet goes over MPI, the data over NCCL
            pack_fn = self._header_pack
        limit = self._packed_bytes
        packet, header = self._packet, self._packet_header
        back = same
        if t.rank == root:
            try:
                x, back = self._array(x)
                self._header_of(x.dtype, x.shape, header=header, device=type(x) is not np.ndarray)
            except (TypeError, ValueError):
                self._header_of(None, None, _BAD_INPUT, header)
                # tell the others before raising, so no rank waits for data that never comes
                t.begin()
                pack_fn(t, packet, root)
                raise
            if header[0] == _OK and x.nbytes <= limit:
                packet[_HEADER_BYTES:_HEADER_BYTES + x.nbytes] = to_host(flat(x)).view(np.uint8)
        elif x is not None:
            x, back = self._array(x)
            if type(x) is np.ndarray and not x.flags.writeable:
                raise InvalidArgumentError("x: the receive buffer must be writeable")
        if self.check:
            self._fingerprint("broadcast", algorithm, root=root,
                              dtype=None if x is None else x.dtype,
                              shape=None if x is None else x.shape)
        t.begin(x)
        pack_fn(t, packet, root)
        if t.rank == root:
            if header[0] != _OK:
                raise InvalidArgumentError(f"x: {_REFUSALS[int(header[0])]}")
            if x.nbytes > limit:
                self._algorithm("broadcast", algorithm, x.nbytes, options=options)(t, flat(x), root)
            return back(x)
        code, itemsize, shape, device = self._unpack_header(header, root, "broadcast")
        like, no_library = self._receive_like(device)
        nbytes = math.prod(shape) * itemsize
        packed = nbytes <= limit
        fn = None if packed else self._algorithm("broadcast", algorithm, nbytes, options=options)
        mismatch = None
        if x is not None and (x.shape != shape or x.dtype.itemsize != itemsize
                              or (code >= 0 and x.dtype != dtype_from_code(code))):
            mismatch = (f"x: the receive buffer has shape {x.shape} and dtype {x.dtype}, "
                        f"but the root sends shape {shape} and "
                        f"{'dtype ' + str(dtype_from_code(code)) if code >= 0 else f'{itemsize}-byte items'}")
        if x is None and code < 0:
            mismatch = (f"x: the root's dtype has no header code; pass a receive buffer "
                        f"of shape {shape}")
        if x is None and no_library is not None:
            mismatch = str(no_library)
        if mismatch is not None:  # take part with a scratch buffer, then refuse
            if fn is not None:
                fn(t, empty(nbytes, np.uint8, like=self._like), root)
            raise InvalidArgumentError(mismatch)
        if x is None:
            x = empty(shape, dtype_from_code(code), like=like)
        if packed:
            data = packet[_HEADER_BYTES:_HEADER_BYTES + nbytes]
            if x.flags.c_contiguous:
                assign_from_host(x.reshape(-1).view(np.uint8), data)
            else:
                assign_from_host(x, data.view(x.dtype).reshape(shape))
        elif x.flags.c_contiguous:
            fn(t, x.reshape(-1), root)
        else:
            buf = empty(x.size, x.dtype, like=x)
            fn(t, buf, root)
            x[...] = buf.reshape(x.shape)
        return back(x)

    @_collective
    def scatter(self, x: np.ndarray | None, root: int = 0, *, algorithm: str = "auto",
                out: np.ndarray | None = None, **options: int) -> np.ndarray:
        """Send row j of the root's ``x`` to rank j.

        Args:
            x: at the root, shape (size, *rest); elsewhere ignored (pass None).
            root: the rank whose data is scattered.
            algorithm: "auto", "native" or a name from ``algorithms("scatter")``.
            out: optional result buffer of shape rest.
            **options: the algorithm's tuning options (``radix=`` for knomial).

        Returns:
            ``x[rank]`` of the root, shape rest.
        """
        t, root = self._transport, self._root(root)
        is_root = t.rank == root
        self._algorithm("scatter", algorithm, 0, options=options)  # refused before any message
        back = same
        if is_root:
            status = _BAD_INPUT  # what the others are told if a check below fails
            try:
                x, back = self._array(x)
                status = _BAD_SHAPE
                self._rows(x, "scatter")
                status = _BAD_OUT
                result = result_buffer(out, x.shape[1:], x.dtype, like=x)
                header = self._header_of(x.dtype, x.shape[1:], device=type(x) is not np.ndarray)
            except (TypeError, ValueError):
                self._header_broadcast(self._header_of(None, None, status), root)
                raise
        else:
            header = np.empty(_HEADER_LEN, np.int64)
        if self.check:
            self._fingerprint("scatter", algorithm, root=root,
                              dtype=x.dtype if is_root else None if out is None else out.dtype,
                              shape=x.shape[1:] if is_root else None if out is None else out.shape)
        self._header_broadcast(header, root)
        code, itemsize, shape, device = self._unpack_header(header, root, "scatter")
        # "auto" resolved from the header, so that every rank picks the same algorithm
        fn = self._algorithm("scatter", algorithm, math.prod(shape) * itemsize * t.size,
                             options=options)
        bounds = even_bounds(math.prod(shape), t.size)
        if is_root:
            t.use(x)
            fn(t, flat(x), result.reshape(-1), bounds, root)
            return _give(result, out, back)
        like, refusal = self._receive_like(device) if out is None else (out, None)
        if code < 0 and out is None:
            refusal = InvalidArgumentError(
                f"out: the root's dtype has no header code; pass out of shape {shape}")
        elif refusal is None:
            try:
                result = result_buffer(out, shape, out.dtype if code < 0 else dtype_from_code(code),
                                       like=like)
            except InvalidArgumentError as exc:
                refusal = exc
        if refusal is not None:  # take part with a scratch buffer, then refuse
            scratch = empty(math.prod(shape) * itemsize, np.uint8, like=self._like)
            fn(t, None, scratch, even_bounds(scratch.size, t.size), root)
            raise refusal
        t.use(result)
        fn(t, None, result.reshape(-1), bounds, root)
        return _give(result, out, same)

    @_collective
    def gather(self, x: np.ndarray, root: int = 0, *, algorithm: str = "auto",
               out: np.ndarray | None = None, **options: int) -> np.ndarray | None:
        """Collect every rank's ``x`` on the root, stacked in rank order.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            root: the rank that receives.
            algorithm: "auto", "native" or a name from ``algorithms("gather")``.
            out: optional result buffer of shape (size, *x.shape), at the root.
            **options: the algorithm's tuning options (``radix=`` for knomial).

        Returns:
            At the root, shape (size, *x.shape); None elsewhere.
        """
        t, root = self._transport, self._root(root)
        x, back = self._array(x)
        fn = self._algorithm("gather", algorithm, x.nbytes * t.size, options=options)
        is_root = t.rank == root
        result = result_buffer(out, (t.size, *x.shape), x.dtype, like=x) if is_root else None
        if self.check:
            self._fingerprint("gather", algorithm, root=root, dtype=x.dtype, shape=x.shape)
        src = flat(x)
        dst = None if result is None else result.reshape(-1)
        src = self._unaliased(src, dst, out)
        t.begin(x)
        fn(t, src, dst, even_bounds(src.size, t.size), root)
        return _give(result, out, back)

    @_collective
    def all_gather(self, x: np.ndarray, *, algorithm: str = "auto",
                   out: np.ndarray | None = None, **options: int) -> np.ndarray:
        """Collect every rank's ``x`` on every rank, stacked in rank order.

        Args:
            x: this rank's data; the same shape and dtype on every rank. It may be
                ``out[rank]`` itself (in place).
            algorithm: "auto", "native" or a name from ``algorithms("all_gather")``.
            out: optional result buffer of shape (size, *x.shape).
            **options: the algorithm's tuning options (none of all_gather's takes one).

        Returns:
            Shape (size, *x.shape), on every rank.
        """
        t = self._transport
        x, back = self._array(x)
        fn = self._algorithm("all_gather", algorithm, x.nbytes * t.size, options=options)
        result = result_buffer(out, (t.size, *x.shape), x.dtype, like=x)
        if self.check:
            self._fingerprint("all_gather", algorithm, dtype=x.dtype, shape=x.shape)
        buf = result.reshape(-1)
        bounds = even_bounds(x.size, t.size)
        mine = buf[bounds[t.rank]:bounds[t.rank + 1]]
        src = flat(x)
        # the result's own row, unless x already is that row (in place)
        if out is None or not may_share_memory(src, mine) or not _same_memory(src, mine):
            mine[...] = src
        t.begin(x)
        fn(t, buf, bounds)
        return _give(result, out, back)

    # -- v-variants: a different number of rows on every rank ----------------------------

    @_collective
    def all_gather_v(self, x: np.ndarray, *, algorithm: str = "auto",
                     **options: int) -> tuple[np.ndarray, list[int]]:
        """Collect every rank's rows on every rank, concatenated in rank order.

        Args:
            x: this rank's rows, shape (rows, *rest); rows may differ per rank (0 too),
                dtype and rest may not.
            algorithm: "auto", "native" (MPI_Allgatherv) or a name from
                ``algorithms("all_gather")``.

        Returns:
            (result of shape (sum of rows, *rest), the rows of every rank).
        """
        t = self._transport
        x, back = self._v_input(x, "all_gather_v")
        self._algorithm("all_gather", algorithm, 0, options=options, uneven=True)
        rows = self._row_table(x, "all_gather_v")
        rest = math.prod(x.shape[1:])
        bounds = counts_bounds([r * rest for r in rows])
        fn = self._algorithm("all_gather", algorithm, bounds[-1] * x.itemsize, options=options,
                             uneven=True)
        result = empty((sum(rows), *x.shape[1:]), x.dtype, like=x)
        buf = result.reshape(-1)
        buf[bounds[t.rank]:bounds[t.rank + 1]] = flat(x)
        t.begin(x)
        fn(t, buf, bounds)
        return back(result), rows

    @_collective
    def gather_v(self, x: np.ndarray, root: int = 0, *, algorithm: str = "auto",
                 **options: int) -> tuple[np.ndarray | None, list[int]]:
        """Collect every rank's rows on the root, concatenated in rank order.

        Args:
            x: this rank's rows, shape (rows, *rest); rows may differ per rank (0 too).
            root: the rank that receives.
            algorithm: "auto", "native" (MPI_Gatherv) or a name from ``algorithms("gather")``.

        Returns:
            (at the root the result of shape (sum of rows, *rest), else None; the rows
            of every rank, on every rank).
        """
        t, root = self._transport, self._root(root)
        x, back = self._v_input(x, "gather_v")
        self._algorithm("gather", algorithm, 0, options=options, uneven=True)
        rows = self._row_table(x, "gather_v")  # the trees need every subtree's size
        rest = math.prod(x.shape[1:])
        bounds = counts_bounds([r * rest for r in rows])
        fn = self._algorithm("gather", algorithm, bounds[-1] * x.itemsize, options=options,
                             uneven=True)
        result = empty((sum(rows), *x.shape[1:]), x.dtype, like=x) if t.rank == root else None
        t.begin(x)
        fn(t, flat(x), None if result is None else result.reshape(-1), bounds, root)
        return back(result), rows

    @_collective
    def scatter_v(self, x: np.ndarray | None, counts: Sequence[int] | None = None,
                  root: int = 0, *, algorithm: str = "auto", **options: int) -> np.ndarray:
        """Send ``counts[j]`` rows of the root's ``x`` to rank j, in rank order.

        Args:
            x: at the root, shape (sum(counts), *rest); elsewhere ignored (pass None).
            counts: the rows for each rank; needed at the root, optional elsewhere (when
                given, it must equal the root's).
            root: the rank whose data is scattered.
            algorithm: "auto", "native" (MPI_Scatterv) or a name from ``algorithms("scatter")``.

        Returns:
            This rank's rows, shape (counts[rank], *rest).
        """
        t, root = self._transport, self._root(root)
        p, is_root = t.size, t.rank == root
        self._algorithm("scatter", algorithm, 0, options=options, uneven=True)
        mine, refusal = None, None
        if counts is not None and not is_root:
            try:
                mine = self._counts(counts, "counts")
            except InvalidArgumentError as exc:
                refusal = exc  # a non-root takes part first, then refuses
        back = same
        if is_root:
            status = _BAD_INPUT
            try:
                x, back = self._array(x)
                status = _NO_CODE
                if dtype_code(x.dtype) < 0:
                    raise UnsupportedDtypeError(
                        f"x: dtype {x.dtype} has no header code, so the other ranks cannot "
                        "allocate their result; use scatter with out= on every rank")
                status = _NO_ROWS
                x, back = self._v_input(x, "scatter_v")
                status = _BAD_COUNTS
                if counts is None:
                    raise InvalidArgumentError("counts: the root must give counts")
                mine = self._counts(counts, "counts")
                if sum(mine) != x.shape[0]:
                    raise InvalidArgumentError(
                        f"counts: they add up to {sum(mine)}, but x has {x.shape[0]} rows")
                header = self._header_of(x.dtype, x.shape[1:], extra=p,
                                         device=type(x) is not np.ndarray)
                header[_HEADER_LEN:] = mine
            except (TypeError, ValueError):
                self._header_broadcast(self._header_of(None, None, status, extra=p), root)
                raise
        else:
            header = np.empty(_HEADER_LEN + p, np.int64)
        self._header_broadcast(header, root)
        code, itemsize, rest, device = self._unpack_header(header, root, "scatter_v")
        like, no_library = (x, None) if is_root else self._receive_like(device)
        if no_library is not None:  # take part with host memory, then refuse
            like, refusal = None, no_library
        rows = header[_HEADER_LEN:].tolist()
        row = math.prod(rest)
        bounds = counts_bounds([r * row for r in rows])
        fn = self._algorithm("scatter", algorithm, bounds[-1] * itemsize, options=options,
                             uneven=True)
        result = empty((rows[t.rank], *rest), dtype_from_code(code), like=like)
        if is_root:
            t.use(x)
            fn(t, flat(x), result.reshape(-1), bounds, root)
            return back(result)
        t.use(result)
        fn(t, None, result.reshape(-1), bounds, root)  # take part, then check the counts
        if refusal is not None:
            raise refusal
        if mine is not None and mine != rows:
            raise InvalidArgumentError(f"counts: this rank's {mine} differ from the root's {rows}")
        return result

    @_collective
    def all_to_all_v(self, x: np.ndarray, send_counts: Sequence[int], *,
                     algorithm: str = "auto", **options: int) -> tuple[np.ndarray, list[int]]:
        """Send ``send_counts[j]`` rows of ``x`` to rank j, in rank order; receive in turn.

        Args:
            x: shape (sum(send_counts), *rest); rest and dtype the same on every rank.
            send_counts: the rows for each rank (0 too).
            algorithm: "auto", "native" (MPI_Alltoallv) or a name from
                ``algorithms("all_to_all")`` that takes uneven blocks.

        Returns:
            (the rows received, concatenated in the order of the ranks that sent them;
            the rows received from each rank).
        """
        t = self._transport
        x, back = self._v_input(x, "all_to_all_v")
        send = self._counts(send_counts, "send_counts")
        if sum(send) != x.shape[0]:
            raise InvalidArgumentError(
                f"send_counts: they add up to {sum(send)}, but x has {x.shape[0]} rows")
        self._algorithm("all_to_all", algorithm, 0, options=options, uneven=True)
        # every rank tells every rank how many rows come, with its dtype/shape signature
        signature = _crc(f"{_dtype_crc(x.dtype)}{x.shape[1:]}")
        outgoing = np.empty((t.size, 2), np.int64)
        outgoing[:, 0], outgoing[:, 1] = send, signature
        incoming = np.empty_like(outgoing)
        pairs = even_bounds(2, t.size)
        fn = self._control_native.get("all_to_all") or REGISTRY["all_to_all"]["pairwise"].fn
        self._control.begin()
        fn(self._control, outgoing.reshape(-1), pairs, incoming.reshape(-1), pairs)
        self._mismatch(incoming[:, 1], "all_to_all_v")
        received = incoming[:, 0].tolist()
        row = math.prod(x.shape[1:])
        send_bounds = counts_bounds([c * row for c in send])
        recv_bounds = counts_bounds([c * row for c in received])
        fn = self._algorithm("all_to_all", algorithm, x.nbytes, options=options, uneven=True)
        result = empty((sum(received), *x.shape[1:]), x.dtype, like=x)
        t.begin(x)
        fn(t, flat(x), send_bounds, result.reshape(-1), recv_bounds)
        return back(result), received

    def _reduction(self, collective: str, x: Any, op: Any, algorithm: str,
                   options: dict[str, Any], uneven: bool = False,
                   ) -> tuple[Any, Op, Callable[..., None], Callable[[Any], Any]]:
        x, back = self._array(x)
        opd = resolve_op(op, x.dtype)
        fn = self._algorithm(collective, algorithm, x.nbytes, opd, options, dtype=x.dtype,
                             uneven=uneven)
        if self._tracer is not None and self._tracer.algorithm != "native":
            opd = timed_op(opd, self._tracer)
        return x, opd, fn, back

    def _unaliased(self, src: np.ndarray, dst: np.ndarray | None,
                   out: np.ndarray | None) -> np.ndarray:
        """``src``, or a copy of it in workspace when it overlaps the user's ``out``.

        Only a user's buffer can overlap: a result mpicoll allocated never does.
        """
        if out is None or dst is None or not may_share_memory(src, dst):
            return src
        copy = self._transport.scratch(src.size, src.dtype, slot=3, like=src)
        copy[...] = src
        return copy

    def _average(self, result: np.ndarray, opd: Op, fn: Callable[..., None]) -> None:
        if opd.average and fn not in _AVERAGES_ITSELF:
            result /= self.size

    @_collective
    def reduce(self, x: np.ndarray, op: str | ReduceOp | Op = "sum", root: int = 0, *,
               algorithm: str = "auto", out: np.ndarray | None = None,
               **options: int) -> np.ndarray | None:
        """Combine every rank's ``x`` elementwise with ``op``; the result goes to the root.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", a ReduceOp,
                or an ``mpicoll.Op`` (a non-commutative one is combined in rank order).
            root: the rank that receives the result.
            algorithm: "auto", "native" or a name from ``algorithms("reduce")``.
            out: optional result buffer at the root (may be ``x``: in place).
            **options: the algorithm's tuning options (``radix=`` for knomial).

        Returns:
            At the root, the reduction, shape x.shape; None elsewhere.
        """
        t, root = self._transport, self._root(root)
        x, opd, fn, back = self._reduction("reduce", x, op, algorithm, options)
        result = result_buffer(out, x.shape, x.dtype, like=x) if t.rank == root else None
        if self.check:
            self._fingerprint("reduce", algorithm, opd, root, x.dtype, x.shape)
        src = flat(x)
        dst = None if result is None else result.reshape(-1)
        src = self._unaliased(src, dst, out)  # linear reduce reads x after writing out
        t.begin(x)
        fn(t, src, dst, opd, root)
        if result is not None:
            self._average(result, opd, fn)
        return _give(result, out, back)

    @_collective
    def all_reduce(self, x: np.ndarray, op: str | ReduceOp | Op = "sum", *,
                   algorithm: str = "auto", out: np.ndarray | None = None,
                   **options: int) -> np.ndarray:
        """Combine every rank's ``x`` elementwise with ``op``; every rank gets the result.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", a ReduceOp,
                or an ``mpicoll.Op`` (a non-commutative one is combined in rank order).
            algorithm: "auto", "native" or a name from ``algorithms("all_reduce")``.
            out: optional result buffer (``out=x`` reduces in place).
            **options: the algorithm's tuning options (``segment_bytes=`` for
                ring_pipelined).

        Returns:
            The reduction, shape x.shape, on every rank.
        """
        t = self._transport
        x, opd, fn, back = self._reduction("all_reduce", x, op, algorithm, options)
        result = result_buffer(out, x.shape, x.dtype, like=x)
        if self.check:
            self._fingerprint("all_reduce", algorithm, opd, 0, x.dtype, x.shape)
        src, dst = flat(x), result.reshape(-1)
        if result is x:
            src = dst  # in place: every all_reduce algorithm allows src is dst
        else:
            src = self._unaliased(src, dst, out)
        t.begin(x)
        fn(t, src, dst, opd)
        self._average(result, opd, fn)
        return _give(result, out, back)

    @_collective
    def reduce_scatter(self, x: np.ndarray, op: str | ReduceOp | Op = "sum", *,
                       counts: Sequence[int] | None = None, algorithm: str = "auto",
                       out: np.ndarray | None = None, **options: int) -> np.ndarray:
        """Reduce every rank's ``x`` with ``op``; rank j gets row j (or block j) of the result.

        Args:
            x: shape (size, *rest), the same on every rank; with ``counts``, any shape
                whose size is ``sum(counts)``, split flat.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", a ReduceOp,
                or an ``mpicoll.Op`` (a non-commutative one is combined in rank order).
            counts: the number of elements of each rank's block, for uneven flat splits
                (the same on every rank).
            algorithm: "auto", "native" or a name from ``algorithms("reduce_scatter")``.
            out: optional result buffer of shape rest (with counts: ``(counts[rank],)``).
            **options: the algorithm's tuning options (none of reduce_scatter's takes one).

        Returns:
            Row [rank] of the reduction, shape rest; with counts, block [rank], 1-D.
        """
        t = self._transport
        x, opd, fn, back = self._reduction("reduce_scatter", x, op, algorithm, options,
                                           uneven=counts is not None)
        if counts is None:
            self._rows(x, "reduce_scatter")
            result = result_buffer(out, x.shape[1:], x.dtype, like=x)
            bounds = even_bounds(result.size, t.size)
        else:
            counts = self._counts(counts, "counts")
            if sum(counts) != x.size:
                raise InvalidArgumentError(
                    f"counts: they add up to {sum(counts)}, but x has {x.size} elements")
            result = result_buffer(out, (counts[t.rank],), x.dtype, like=x)
            bounds = counts_bounds(counts)
        if self.check:
            self._fingerprint("reduce_scatter", algorithm, opd, 0, x.dtype,
                              x.shape if counts is None else tuple(counts))
        src, dst = flat(x), result.reshape(-1)
        src = self._unaliased(src, dst, out)
        t.begin(x)
        fn(t, src, bounds, opd, dst)
        self._average(result, opd, fn)
        return _give(result, out, back)

    @_collective
    def all_to_all(self, x: np.ndarray, *, algorithm: str = "auto",
                   out: np.ndarray | None = None, **options: int) -> np.ndarray:
        """Send row j of ``x`` to rank j; row i of the result came from rank i.

        Args:
            x: shape (size, *rest); the same shape and dtype on every rank.
            algorithm: "auto", "native" or a name from ``algorithms("all_to_all")``.
            out: optional result buffer of shape x.shape (may be ``x``: in place).
            **options: the algorithm's tuning options (none of all_to_all's takes one).

        Returns:
            Shape x.shape: the transpose of the rows across ranks.
        """
        t = self._transport
        x, back = self._array(x)
        self._rows(x, "all_to_all")
        fn = self._algorithm("all_to_all", algorithm, x.nbytes, options=options)
        result = result_buffer(out, x.shape, x.dtype, like=x)
        if self.check:
            self._fingerprint("all_to_all", algorithm, dtype=x.dtype, shape=x.shape)
        src, dst = flat(x), result.reshape(-1)
        src = self._unaliased(src, dst, out)
        bounds = even_bounds(src.size // t.size, t.size)
        t.begin(x)
        fn(t, src, bounds, dst, bounds)
        return _give(result, out, back)

    @_collective
    def barrier(self, *, algorithm: str = "auto", **options: int) -> None:
        """Return only once every rank has entered the barrier.

        Args:
            algorithm: "auto", "native" or a name from ``algorithms("barrier")``.
            **options: the algorithm's tuning options (``radix=`` for knomial).
        """
        fn = self._algorithm("barrier", algorithm, 0, options=options)
        if self.check:
            self._fingerprint("barrier", algorithm)
        self._transport.begin()
        fn(self._transport)
        if self._control is not self._transport:  # NCCL: wait until the stream has run it
            self._transport.synchronize()
