"""The MPI library's own collectives (``algorithm="native"`` on the "mpi" backend).

Each function keeps the signature of the algorithms of its collective (see
``mpicoll.algorithms``) and calls the collective through mpi4py's buffer methods on the
transport's private communicator. Data that is only moved goes as ``MPI.BYTE``; data
that is reduced goes typed, so the MPI library must know the dtype and the op.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .errors import UnsupportedDtypeError
from .ops import Op
from .transport.mpi import MPITransport

_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "avg": MPI.SUM, "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR}
# MPI reduces C bool only with logical ops; these give NumPy's results on bool
_MPI_BOOL_OPS = {"sum": MPI.LOR, "prod": MPI.LAND, "min": MPI.LAND, "max": MPI.LOR,
                 "band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR}
# dtypes whose buffer format mpi4py maps to an MPI datatype with reductions
NATIVE_REDUCE_DTYPES = frozenset(np.dtype(c) for c in (
    "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"))


def mpi_op(op: Op, dtype: np.dtype) -> MPI.Op:
    """The MPI op that computes ``op`` on ``dtype``, or a clear refusal."""
    if dtype not in NATIVE_REDUCE_DTYPES:
        raise UnsupportedDtypeError(
            f"algorithm 'native': the MPI library cannot reduce dtype {dtype}; "
            "use one of mpicoll's own algorithms"
        )
    table = _MPI_BOOL_OPS if dtype.kind == "b" else _MPI_OPS
    return table[op.name]


def _bytes(buf: np.ndarray) -> list:
    return [buf, MPI.BYTE]


def native_broadcast(t: MPITransport, buf: np.ndarray, root: int) -> None:
    t.comm.Bcast(_bytes(buf), root)


def native_scatter(t: MPITransport, src: np.ndarray | None, dst: np.ndarray, root: int) -> None:
    t.comm.Scatter(_bytes(src) if t.rank == root else None, _bytes(dst), root)


def native_gather(t: MPITransport, src: np.ndarray, dst: np.ndarray | None, root: int) -> None:
    t.comm.Gather(_bytes(src), _bytes(dst) if t.rank == root else None, root)


def native_all_gather(t: MPITransport, buf: np.ndarray, bounds: tuple[int, ...]) -> None:
    size = buf.itemsize
    counts = [(bounds[i + 1] - bounds[i]) * size for i in range(t.size)]
    if len(set(counts)) == 1:
        t.comm.Allgather(MPI.IN_PLACE, _bytes(buf))
    else:
        displs = [b * size for b in bounds[:-1]]
        t.comm.Allgatherv(MPI.IN_PLACE, [buf, (counts, displs), MPI.BYTE])


def native_reduce(t: MPITransport, src: np.ndarray, dst: np.ndarray | None, op: Op,
                  root: int) -> None:
    mop = mpi_op(op, src.dtype)
    if t.rank == root:
        t.comm.Reduce(MPI.IN_PLACE if dst is src else src, dst, mop, root)
    else:
        t.comm.Reduce(src, None, mop, root)


def native_all_reduce(t: MPITransport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    t.comm.Allreduce(MPI.IN_PLACE if dst is src else src, dst, mpi_op(op, src.dtype))


def native_reduce_scatter(t: MPITransport, src: np.ndarray, bounds: tuple[int, ...], op: Op,
                          dst: np.ndarray) -> None:
    counts = [bounds[i + 1] - bounds[i] for i in range(t.size)]
    mop = mpi_op(op, src.dtype)
    if len(set(counts)) == 1:
        t.comm.Reduce_scatter_block(src, dst, mop)
    else:
        t.comm.Reduce_scatter(src, dst, counts, mop)


def native_all_to_all(t: MPITransport, src: np.ndarray, dst: np.ndarray) -> None:
    t.comm.Alltoall(_bytes(src), _bytes(dst))


def native_barrier(t: MPITransport) -> None:
    t.comm.Barrier()


NATIVE = {
    "broadcast": native_broadcast,
    "scatter": native_scatter,
    "gather": native_gather,
    "all_gather": native_all_gather,
    "reduce": native_reduce,
    "all_reduce": native_all_reduce,
    "reduce_scatter": native_reduce_scatter,
    "all_to_all": native_all_to_all,
    "barrier": native_barrier,
}

NATIVE_COSTS = {c: "the MPI library's own collective" for c in NATIVE}
