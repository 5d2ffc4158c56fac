"""The MPI library's own collectives (``algorithm="native"`` on the "mpi" backend).

Each function keeps the signature of the algorithms of its collective (see
``mpicoll.algorithms``) and calls the collective through mpi4py's buffer methods on the
transport's private communicator. Data that is only moved goes as ``MPI.BYTE``; data
that is reduced goes typed, so the MPI library must know the dtype and the op.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
from mpi4py import MPI

from ..buffers.arrays import same_memory
from ..errors import UnsupportedDtypeError
from ..ops import Op
from ..transport.mpi import MPITransport

_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "avg": MPI.SUM, "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
            "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
            "minloc": MPI.MINLOC, "maxloc": MPI.MAXLOC}
# MPI reduces C bool only with logical ops; these give NumPy's results on bool
_MPI_BOOL_OPS = {"sum": MPI.LOR, "prod": MPI.LAND, "min": MPI.LAND, "max": MPI.LOR,
                 "band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR,
                 "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR}
# dtypes whose buffer format mpi4py maps to an MPI datatype with reductions
NATIVE_REDUCE_DTYPES = frozenset(np.dtype(c) for c in (
    "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"))
# (and long double, real and complex, where the MPI library has a type of its size: set
# below, from mpi4py's table, as ``typed`` reads it)
# MPI defines its logical ops on C integer and logical (bool) types only (the standard's
# table of predefined reduction ops; MPICH refuses them on floating and complex types)
_LOGICAL = frozenset({"land", "lor", "lxor"})


def _pair_types() -> dict[np.dtype, MPI.Datatype]:
    """MPI's pair types for MINLOC/MAXLOC by the structured dtype of the same layout
    (C's struct {value; int index;}: ``mpicoll.loc_dtype(value)``), where the extents
    agree on this platform."""
    pairs = {}
    for value, datatype in (("f", MPI.FLOAT_INT), ("d", MPI.DOUBLE_INT), ("l", MPI.LONG_INT),
                            ("i", MPI.TWOINT), ("h", MPI.SHORT_INT),
                            ("g", MPI.LONG_DOUBLE_INT)):
        dtype = np.dtype([("value", value), ("index", "i")], align=True)
        if datatype != MPI.DATATYPE_NULL and datatype.Get_extent() == (0, dtype.itemsize):
            pairs[dtype] = datatype
    return pairs


PAIR_TYPES = _pair_types()


def _pair_type(dtype: np.dtype) -> MPI.Datatype | None:
    """The MPI pair type laid out as ``dtype`` (same fields, offsets and size), or None."""
    for pair, datatype in PAIR_TYPES.items():
        if dtype.names == pair.names and dtype.fields == pair.fields and \
                dtype.itemsize == pair.itemsize:
            return datatype
    return None


_BUILTIN: dict[tuple[Op, np.dtype], tuple[None, MPI.Op]] = {}
# a user's Op -> {dtype: (its MPI datatype, its MPI op)}, kept only while the Op lives:
# MPI has room for few user ops (MPICH: a few dozen), and programs make an Op per step
_USER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RETIRED: list[tuple[MPI.Datatype, MPI.Op]] = []  # freed at the next mpi_op, never mid-call


def check_op(op: Op, dtype: np.dtype) -> None:
    """Refuse (op, dtype) where the MPI library cannot reduce it (a user's op it always
    can: MPI runs its function on the bytes); makes no MPI object."""
    if not op.builtin:
        return
    if op.name in ("minloc", "maxloc"):
        if _pair_type(dtype) is None:
            raise UnsupportedDtypeError(
                f"algorithm 'native': the MPI library's {op.name} cannot reduce dtype "
                f"{dtype}: it takes the layouts of MPI's pair types, "
                "mpicoll.loc_dtype(v) with v float32, float64, C long, int, short or long "
                "double; use one of mpicoll's own algorithms")
        return
    if dtype not in NATIVE_REDUCE_DTYPES:
        raise UnsupportedDtypeError(
            f"algorithm 'native': the MPI library cannot reduce dtype {dtype}; "
            "use one of mpicoll's own algorithms"
        )
    if op.name in _LOGICAL and dtype.kind not in "biu":
        raise UnsupportedDtypeError(
            f"algorithm 'native': MPI defines {op.name!r} on integer and bool dtypes only, "
            f"not {dtype}; use one of mpicoll's own algorithms")


def mpi_op(op: Op, dtype: np.dtype) -> tuple[MPI.Datatype | None, MPI.Op]:
    """The MPI datatype and op that compute ``op`` on ``dtype``, or a clear refusal.

    A built-in op gets the MPI library's own op on the dtype's MPI datatype (None: mpi4py
    finds it from the buffer; minloc/maxloc: MPI's pair type of the dtype's layout). A user's ``mpicoll.Op`` becomes an MPI user op on a
    contiguous datatype of one element, whose callback runs ``op.fn`` on NumPy views of
    MPI's buffers; MPI keeps rank order for a non-commutative one. The MPI objects live
    as long as the ``Op``: when it is garbage, they are freed at the next call here
    (outside any MPI call, so never while a collective uses them).
    """
    if op.builtin:
        try:
            return _BUILTIN[op, dtype]
        except KeyError:
            check_op(op, dtype)
            resolved = _BUILTIN[op, dtype] = (
                _pair_type(dtype) if dtype.names else None,
                (_MPI_BOOL_OPS if dtype.kind == "b" else _MPI_OPS)[op.name])
            return resolved
    if _RETIRED:
        _free_retired()
    by_dtype = _USER.get(op)
    if by_dtype is None:
        by_dtype = _USER[op] = {}
        weakref.finalize(op, _RETIRED.extend, by_dtype.values())
    resolved = by_dtype.get(dtype)
    if resolved is None:
        element = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
        mop = MPI.Op.Create(_weak_callback(op, dtype), commute=bool(op.commutative))
        resolved = by_dtype[dtype] = (element, mop)
    return resolved


def _weak_callback(op: Op, dtype: np.dtype) -> Callable[..., None]:
    """MPI's callback for ``op`` on ``dtype``: inout = in (op) inout, on NumPy views of
    MPI's buffers; it holds ``op`` weakly, so the Op can die and its MPI op be freed."""
    ref = weakref.ref(op)

    def combine(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        live = ref()
        if live is not None:
            b = np.frombuffer(inoutbuf, dtype)
            live(np.frombuffer(inbuf, dtype), b, b)  # a raise is kept by the call's guard

    return combine


def _free_retired() -> None:
    """Free the MPI objects of Ops that are gone."""
    while _RETIRED:
        element, mop = _RETIRED.pop()
        if not MPI.Is_finalized():
            mop.Free()
            element.Free()


def _reduction(op: Op, dtype: np.dtype) -> tuple[MPI.Datatype | None, MPI.Op]:
    """``mpi_op``'s (datatype, op), with the datatype named for both buffers wherever
    mpi4py has one for the dtype: not left to mpi4py's reading of each buffer's format,
    which differs for equal dtypes (int64 as 'l' and 'q': mpi4py would name x MPI_LONG and
    an out= MPI_LONG_LONG, and refuse the pair) and for an unaligned array (NumPy's format
    '=d', which mpi4py maps to no datatype: a memmap at an odd offset)."""
    datatype, mop = mpi_op(op, dtype)
    if datatype is None:
        datatype = typed(dtype)
    return datatype, mop


def _typed(buf: np.ndarray | None, datatype: MPI.Datatype | None):
    """A buffer spec for a reduction: mpi4py's own mapping, or ``datatype`` per element."""
    if buf is None or datatype is None:
        return buf
    return [buf, buf.size, datatype]


def _bytes(buf: np.ndarray) -> list:
    return [buf, MPI.BYTE]


def native_broadcast(t: MPITransport, buf: np.ndarray, root: int) -> None:
    t.comm.Bcast(_bytes(buf), root)


def _bytes_v(buf: np.ndarray, bounds: tuple[int, ...]) -> list:
    """A v-collective buffer spec: block j is ``bounds[j]:bounds[j+1]``, in bytes."""
    size = buf.itemsize
    counts = [(bounds[j + 1] - bounds[j]) * size for j in range(len(bounds) - 1)]
    return [buf, (counts, [b * size for b in bounds[:-1]]), MPI.BYTE]


@lru_cache(maxsize=256)
def _even(bounds: tuple[int, ...]) -> bool:
    first = bounds[1] - bounds[0]
    return all(bounds[j + 1] - bounds[j] == first for j in range(1, len(bounds) - 1))


def native_scatter(t: MPITransport, src: np.ndarray | None, dst: np.ndarray,
                   bounds: tuple[int, ...], root: int) -> None:
    recv = _bytes(dst)
    if t.rank == root and same_memory(dst, src[bounds[root]:bounds[root + 1]]):
        recv = MPI.IN_PLACE  # the root's out is its own block of x: MPI's in-place scatter
    if _even(bounds):
        t.comm.Scatter(_bytes(src) if t.rank == root else None, recv, root)
    else:
        t.comm.Scatterv(_bytes_v(src, bounds) if t.rank == root else None, recv, root)


def native_gather(t: MPITransport, src: np.ndarray, dst: np.ndarray | None,
                  bounds: tuple[int, ...], root: int) -> None:
    if _even(bounds):
        t.comm.Gather(_bytes(src), _bytes(dst) if t.rank == root else None, root)
    else:
        t.comm.Gatherv(_bytes(src), _bytes_v(dst, bounds) if t.rank == root else None, root)


def native_all_gather(t: MPITransport, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
    if _even(bounds):
        t.comm.Allgather(MPI.IN_PLACE, _bytes(buf))
    else:
        t.comm.Allgatherv(MPI.IN_PLACE, _bytes_v(buf, bounds))


def native_reduce(t: MPITransport, src: np.ndarray, dst: np.ndarray | None, op: Op,
                  root: int) -> None:
    datatype, mop = _reduction(op, src.dtype)
    if t.rank == root:
        sendbuf = MPI.IN_PLACE if dst is src else _typed(src, datatype)
        t.comm.Reduce(sendbuf, _typed(dst, datatype), mop, root)
    else:
        t.comm.Reduce(_typed(src, datatype), None, mop, root)


def native_all_reduce(t: MPITransport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    datatype, mop = _reduction(op, src.dtype)
    sendbuf = MPI.IN_PLACE if dst is src else _typed(src, datatype)
    t.comm.Allreduce(sendbuf, _typed(dst, datatype), mop)


def native_reduce_scatter(t: MPITransport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                          dst: np.ndarray) -> None:
    datatype, mop = _reduction(op, src.dtype)
    if dst.size == 0:  # (an empty block at x's address, as out=x[0:0]: MPI refuses the
        dst = np.empty(0, dst.dtype)  # two buffers at one address, for 0 elements too)
    if _even(bounds):  # MPI_Reduce_scatter_block, as a decided call's (host_direct), for
        if datatype is None:  # a datatype named too (int64 as 'l' and 'q': every rank the
            t.comm.Reduce_scatter_block(src, dst, mop)  # one collective, whatever its path)
        else:  # (mpi4py reads the send buffer's count as each rank's block)
            block = bounds[1] - bounds[0]
            t.comm.Reduce_scatter_block([src, block, datatype], [dst, block, datatype], mop)
    else:
        counts = [bounds[i + 1] - bounds[i] for i in range(t.size)]
        t.comm.Reduce_scatter(_typed(src, datatype), _typed(dst, datatype), counts, mop)


def native_all_to_all(t: MPITransport, src: np.ndarray, send_bounds: tuple[int, ...],
                      dst: np.ndarray, recv_bounds: tuple[int, ...]) -> None:
    """MPI_Alltoall where the blocks are even (all_to_all: on every rank alike, its shape
    being agreed), else MPI_Alltoallv."""
    if _even(send_bounds) and _even(recv_bounds):
        t.comm.Alltoall(_bytes(src), _bytes(dst))
    else:
        t.comm.Alltoallv(_bytes_v(src, send_bounds), _bytes_v(dst, recv_bounds))


def native_all_to_all_v(t: MPITransport, src: np.ndarray, send_bounds: tuple[int, ...],
                        dst: np.ndarray, recv_bounds: tuple[int, ...]) -> None:
    """MPI_Alltoallv on every rank: a rank's own counts being even says nothing of the
    others' (one rank in MPI_Alltoall, another in MPI_Alltoallv would never match)."""
    t.comm.Alltoallv(_bytes_v(src, send_bounds), _bytes_v(dst, recv_bounds))


def native_barrier(t: MPITransport) -> None:
    t.comm.Barrier()


def native_scan(t: MPITransport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    datatype, mop = _reduction(op, src.dtype)
    sendbuf = MPI.IN_PLACE if dst is src else _typed(src, datatype)
    t.comm.Scan(sendbuf, _typed(dst, datatype), mop)


def native_exscan(t: MPITransport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """MPI_Exscan; rank 0's ``dst`` is left undefined, as MPI does."""
    datatype, mop = _reduction(op, src.dtype)
    sendbuf = MPI.IN_PLACE if dst is src else _typed(src, datatype)
    t.comm.Exscan(sendbuf, _typed(dst, datatype), mop)


def host_direct(t: MPITransport, collective: str, op: Op | None, dtype: np.dtype,
                root: int = 0, count: int | None = None
                ) -> Callable[[np.ndarray, np.ndarray | None], None] | None:
    """MPI's own ``collective`` on contiguous host arrays of ``dtype`` as one mpi4py call
    whose arguments are fixed once: ``run(x, result)`` (``result`` None where a rank has
    none: a reduce's or gather's non-root; x as result: in place), even blocks only. What
    the decided calls run; the functions above do the same call on the same buffers
    (so the same messages). None where it takes more than that call: a user's op, MPI's
    pair types. ``count``: x's elements, where every call's x has that many: the
    reductions then name it and its MPI datatype (``typed``), as mpi4py would find them
    from the buffer, which it need not then read each call."""
    comm, bytes_ = t.comm, MPI.BYTE
    if op is not None:
        if not op.builtin:
            return None
        datatype, mop = mpi_op(op, dtype)
        if datatype is not None:
            return None
        datatype = None if count is None else typed(dtype)
        if datatype is not None:  # (buffer, count, datatype): the same call, told
            return _typed_direct(t, collective, mop, datatype, count, root)  # type: ignore[arg-type]
    if collective == "all_reduce":
        allreduce, in_place = comm.Allreduce, MPI.IN_PLACE
        return lambda x, result: allreduce(in_place if x is result else x, result, mop)
    if collective == "reduce":
        reduce, in_place = comm.Reduce, MPI.IN_PLACE
        if t.rank == root:
            return lambda x, result: reduce(in_place if x is result else x, result, mop, root)
        return lambda x, result: reduce(x, None, mop, root)
    if collective in ("scan", "exscan"):
        scan, in_place = comm.Scan if collective == "scan" else comm.Exscan, MPI.IN_PLACE
        return lambda x, result: scan(in_place if x is result else x, result, mop)
    if collective == "reduce_scatter":
        reduce_scatter = comm.Reduce_scatter_block
        return lambda x, result: reduce_scatter(x, result, mop)
    if collective == "all_gather":  # x into its own row, then MPI's in-place form (as
        allgather, in_place, rank = comm.Allgather, MPI.IN_PLACE, t.rank  # every rank's)

        def all_gather(x: np.ndarray, result: np.ndarray) -> None:
            result[rank] = x
            allgather(in_place, [result, bytes_])

        return all_gather
    if collective == "gather":
        gather = comm.Gather
        if t.rank == root:
            return lambda x, result: gather([x, bytes_], [result, bytes_], root)
        return lambda x, result: gather([x, bytes_], None, root)
    if collective == "all_to_all":
        alltoall = comm.Alltoall
        return lambda x, result: alltoall([x, bytes_], [result, bytes_])
    if collective == "barrier":
        barrier = comm.Barrier
        return lambda x, result: barrier()
    if collective == "broadcast":  # x: the root's data, or where a receiver's lands
        bcast = comm.Bcast
        return lambda x, result: bcast([x, bytes_], root)
    if collective == "scatter":  # x: the root's rows (a receiver's: None)
        scatter = comm.Scatter
        if t.rank == root:
            return lambda x, result: scatter([x, bytes_], [result, bytes_], root)
        return lambda x, result: scatter(None, [result, bytes_], root)
    return None


@functools.cache
def typed(dtype: np.dtype) -> MPI.Datatype | None:
    """The MPI datatype mpi4py gives a host buffer of ``dtype`` (its buffer format looked
    up in mpi4py's own table, as mpi4py does on every call), or None: a dtype it finds no
    predefined datatype for (byte-swapped, structured, ml_dtypes' own)."""
    if not dtype.isnative or dtype.fields is not None or dtype.subdtype is not None:
        return None
    formats = _formats(dtype)
    table = getattr(MPI, "_typedict", {})
    datatypes = [table.get(f) for f in sorted(formats)]
    if not datatypes or any(d is None or d.Get_size() != dtype.itemsize for d in datatypes):
        return None
    # one datatype for every dtype equal to this one (one decision, one key): int64 is 'l'
    # and 'q' on Linux, whose buffers mpi4py names MPI_LONG and MPI_LONG_LONG: named by
    # the first (MPI reduces integers of one size and sign alike, whatever their C name)
    return datatypes[0]


@functools.cache
def _formats(dtype: np.dtype) -> frozenset[str]:
    """The buffer formats of ``dtype`` and of every NumPy type code of a dtype equal to
    it (none where one has no buffer format)."""
    formats = set()
    for code in {dtype.char, *(c for c in np.typecodes["All"] if np.dtype(c) == dtype)}:
        try:
            formats.add(memoryview(np.empty(0, np.dtype(code))).format)
        except (TypeError, ValueError):  # (a dtype with no buffer format)
            return frozenset()
    return frozenset(formats)


def _typed_direct(t: MPITransport, collective: str, mop: MPI.Op, datatype: MPI.Datatype,
                  count: int, root: int) -> Callable[[np.ndarray, np.ndarray | None], None] | None:
    """``host_direct``'s reductions with each buffer given as (array, count, datatype)."""
    comm, in_place, n = t.comm, MPI.IN_PLACE, count
    if collective == "all_reduce":
        allreduce = comm.Allreduce
        return lambda x, result: allreduce(
            in_place if x is result else (x, n, datatype), (result, n, datatype), mop)
    if collective == "reduce":
        reduce = comm.Reduce
        if t.rank == root:
            return lambda x, result: reduce(
                in_place if x is result else (x, n, datatype), (result, n, datatype), mop,
                root)
        return lambda x, result: reduce((x, n, datatype), None, mop, root)
    if collective in ("scan", "exscan"):
        scan = comm.Scan if collective == "scan" else comm.Exscan
        return lambda x, result: scan(
            in_place if x is result else (x, n, datatype), (result, n, datatype), mop)
    if collective == "reduce_scatter":
        # (mpi4py reads the count of its send buffer as the count of each rank's block)
        reduce_scatter, block = comm.Reduce_scatter_block, count // t.size
        return lambda x, result: reduce_scatter((x, block, datatype), (result, block, datatype),
                                                mop)
    return None


def host_packet(t: MPITransport, packet: np.ndarray, root: int) -> Callable[[], None]:
    """MPI's own broadcast of one fixed host buffer (a Communicator's header packet) as
    one call whose arguments are made once: ``host_direct``'s broadcast on it, the same
    message, without a Python frame around it (every small broadcast and scatter sends it).
    Its message is made once too, as mpi4py's own buffer with its count (mpi4py then reads
    no NumPy array each call: 60 ns of a call that costs 1.7 us)."""
    return functools.partial(t.comm.Bcast, [MPI.buffer(packet), packet.nbytes, MPI.BYTE], root)


class _Kept:
    """Stands in for a transport's communicator: the collective call made on it is kept
    (its mpi4py method's name and arguments), not made."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.call = rank, size, None
        self.comm = self

    def __getattr__(self, name: str) -> Callable[..., None]:
        def keep(*args: Any) -> None:
            self.call = (name, args)

        return keep


def host_persistent(t: MPITransport, collective: str, op: Op | None, dtype: np.dtype,
                    root: int, x: np.ndarray, result: np.ndarray | None) -> MPI.Prequest | None:
    """MPI-4's persistent ``collective`` on these host arrays (``MPI_Allreduce_init`` and
    kin): the very call ``host_direct`` makes on them, made by its ``_init`` instead
    (collective: every rank makes it at the same point); None where host_direct has none."""
    kept = _Kept(t.rank, t.size)
    # (x's count: its reductions name their datatype, as host_direct's decided calls do)
    run = host_direct(kept, collective, op, dtype, root,  # type: ignore[arg-type]
                      None if x is None else x.size)
    if run is None:
        return None
    run(x, result)
    name, args = kept.call
    return t.persistent(name, *args)


def _user_op_in(args: tuple) -> bool:
    """Whether a reduction's op is a user's: MPI runs it as a host callback over NumPy
    views of MPI's buffers, so device buffers are staged even for a CUDA-aware MPI."""
    return any(isinstance(a, Op) and not a.builtin for a in args)


def _staged(fn: Callable[..., None], reads: tuple[int, ...], writes: tuple[int, ...],
            probe: int = 0) -> Callable[..., None]:
    """``fn`` for device buffers too: given to a CUDA-aware MPI as they are (unless a
    user's op reduces them: its callback reads host memory), or else staged through the
    transport's pinned host memory (the buffers it reads copied
    there, the MPI library run on the host copies, the buffers it writes copied back).
    ``reads``/``writes``: the argument positions of the buffers it reads and writes;
    ``probe``: a position that is never None (it tells host from device)."""

    @functools.wraps(fn)
    def native(t: MPITransport, *args: Any) -> None:
        if type(args[probe]) is np.ndarray or (t.direct() and not _user_op_in(args)):
            fn(t, *args)
            return
        host = list(args)
        copies: dict[int, np.ndarray] = {}  # one host copy per device buffer (in place)
        for i in reads + writes:
            buf = args[i]
            if buf is not None and id(buf) not in copies:
                copies[id(buf)] = t.to_host(buf) if i in reads else t.host_space(buf)
            if buf is not None:
                host[i] = copies[id(buf)]
        fn(t, *host)
        for i in writes:
            if args[i] is not None:
                t.to_device(host[i], args[i])

    return native


NATIVE = {  # each: (function, positions of the buffers it reads, and of those it writes)
    "broadcast": _staged(native_broadcast, (0,), (0,)),
    "scatter": _staged(native_scatter, (0,), (1,), probe=1),
    "gather": _staged(native_gather, (0,), (1,)),
    "all_gather": _staged(native_all_gather, (0,), (0,)),
    "reduce": _staged(native_reduce, (0,), (1,)),
    "all_reduce": _staged(native_all_reduce, (0,), (1,)),
    "reduce_scatter": _staged(native_reduce_scatter, (0,), (3,)),
    "all_to_all": _staged(native_all_to_all, (0,), (2,)),
    "barrier": native_barrier,
    "scan": _staged(native_scan, (0,), (1,)),
    "exscan": _staged(native_exscan, (0,), (1,)),
}
# all_to_all_v's: MPI_Alltoallv on every rank (see native_all_to_all_v)
NATIVE["all_to_all"].v_form = _staged(native_all_to_all_v, (0,), (2,))  # type: ignore[attr-defined]
NATIVE_REDUCE_DTYPES |= frozenset(
    dtype for dtype in (np.dtype("g"), np.dtype("G")) if typed(dtype) is not None)
