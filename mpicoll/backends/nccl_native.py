"""NCCL's own collectives (``algorithm="native"`` on the "nccl" backend).

Each function keeps the signature of the algorithms of its collective (see
``mpicoll.algorithms``) and calls cupy.cuda.nccl on the transport's NcclCommunicator and
the current stream. NCCL has allReduce, reduce, broadcast, allGather and reduceScatter;
gather, scatter, all_to_all and the uneven (v) cases are grouped ncclSend/ncclRecv, and
barrier is a one-element allReduce followed by a stream synchronize.

Data that is only moved goes counted in elements, as an NCCL type of its items' width
(``transport.nccl.wire``). Data that is reduced goes typed, from the
tables below: NCCL reduces int8/uint8, int32/uint32, int64/uint64, float16, bfloat16,
float32 and float64 with sum, prod, min, max and avg. Complex sums (and averages) reduce
as twice as many floats; bool reduces as uint8 (sum, max, bor and lor are OR, prod, min,
band and land are AND). NCCL has no bitwise, logical (but on bool), loc or user ops. Anything else is refused with the reason, before any message, as is a count the
installed CuPy's binding cannot take (``transport.nccl.check_count``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from ..buffers.arrays import cupy_module
from ..errors import UnsupportedDtypeError, UnsupportedOpError
from ..ops import Op
from ..transport.nccl import NCCLTransport, check_count, wire

# ncclDataType_t (nccl.h)
NCCL_DTYPES: dict[np.dtype, int] = {
    np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8,
    np.dtype(ml_dtypes.bfloat16): 9,
}
# ncclRedOp_t (nccl.h)
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_OPS = {"sum": NCCL_SUM, "prod": NCCL_PROD, "max": NCCL_MAX, "min": NCCL_MIN,
            "avg": NCCL_AVG}
# on bool (as uint8 0/1): NumPy's sum is OR = max, prod is AND = min; so are the
# logical and bitwise AND and OR (NCCL has no XOR, nor logical ops on other dtypes)
NCCL_BOOL_OPS = {"sum": NCCL_MAX, "prod": NCCL_MIN, "max": NCCL_MAX, "min": NCCL_MIN,
                 "bor": NCCL_MAX, "band": NCCL_MIN, "lor": NCCL_MAX, "land": NCCL_MIN}
# complex: its real and imaginary parts reduce independently only under sum and avg
_COMPLEX_PARTS = {np.dtype(np.complex64): np.dtype(np.float32),
                  np.dtype(np.complex128): np.dtype(np.float64)}


def nccl_op(op: Op, dtype: np.dtype) -> tuple[int, int, int]:
    """(ncclDataType_t, ncclRedOp_t, elements per item) that compute ``op`` on ``dtype``.

    Raises:
        UnsupportedOpError: a user's op, or a bitwise, logical (on other than bool) or
            loc op, which NCCL does not have.
        UnsupportedDtypeError: a dtype NCCL cannot reduce (int16, long double, complex
            under prod), naming what to use instead.
    """
    dtype = np.dtype(dtype)
    if not op.builtin:
        raise UnsupportedOpError(
            f"algorithm 'native': NCCL has no user-defined ops ({op.name!r}); "
            "use one of mpicoll's own algorithms over NCCL")
    if dtype.kind == "b":
        if op.name not in NCCL_BOOL_OPS:
            raise UnsupportedOpError(f"algorithm 'native': NCCL cannot {op.name} bool")
        return NCCL_DTYPES[np.dtype(np.uint8)], NCCL_BOOL_OPS[op.name], 1
    if op.name not in NCCL_OPS:
        raise UnsupportedOpError(
            f"algorithm 'native': NCCL has no {op.name!r} (it has sum, prod, min, max, avg); "
            "use one of mpicoll's own algorithms over NCCL")
    if dtype in _COMPLEX_PARTS:
        if op.name not in ("sum", "avg"):
            raise UnsupportedDtypeError(
                f"algorithm 'native': NCCL reduces complex {dtype} only with sum or avg")
        return NCCL_DTYPES[_COMPLEX_PARTS[dtype]], NCCL_OPS[op.name], 2
    if dtype not in NCCL_DTYPES:
        raise UnsupportedDtypeError(
            f"algorithm 'native': NCCL cannot reduce dtype {dtype}; "
            "use one of mpicoll's own algorithms over NCCL")
    return NCCL_DTYPES[dtype], NCCL_OPS[op.name], 1


def _ptr(buf: Any) -> int:
    return buf.data.ptr


def _block(buf: Any, bounds: tuple[int, ...], j: int) -> Any:
    return buf[bounds[j]:bounds[j + 1]]


def _even(bounds: tuple[int, ...]) -> bool:
    first = bounds[1] - bounds[0]
    return all(bounds[j + 1] - bounds[j] == first for j in range(1, len(bounds) - 1))


def native_broadcast(t: NCCLTransport, buf: Any, root: int) -> None:
    count, datatype = wire(buf)
    check_count(t.nccl, "broadcast", count, "broadcast (native)")
    t.nccl.broadcast(_ptr(buf), _ptr(buf), count, datatype, root, t.stream_ptr())


def native_scatter(t: NCCLTransport, src: Any, dst: Any, bounds: tuple[int, ...],
                   root: int) -> None:
    if t.rank == root:
        for j in range(t.size):
            if j != root:
                t.isend(_block(src, bounds, j), j)
        dst[...] = _block(src, bounds, root)
    else:
        t.irecv(dst, root)
    t.issue()


def native_gather(t: NCCLTransport, src: Any, dst: Any, bounds: tuple[int, ...],
                  root: int) -> None:
    if t.rank == root:
        for j in range(t.size):
            if j != root:
                t.irecv(_block(dst, bounds, j), j)
        _block(dst, bounds, root)[...] = src
    else:
        t.isend(src, root)
    t.issue()


def native_all_gather(t: NCCLTransport, buf: Any, bounds: tuple[int, ...]) -> None:
    if _even(bounds):  # in place: NCCL takes sendbuff == recvbuff + rank * count
        mine = _block(buf, bounds, t.rank)
        count, datatype = wire(mine)
        check_count(t.nccl, "allGather", count, "all_gather (native)")
        t.nccl.allGather(_ptr(mine), _ptr(buf), count, datatype, t.stream_ptr())
        return
    mine = _block(buf, bounds, t.rank)
    for j in range(t.size):
        if j != t.rank:
            t.isend(mine, j)
            t.irecv(_block(buf, bounds, j), j)
    t.issue()


def native_reduce(t: NCCLTransport, src: Any, dst: Any, op: Op, root: int) -> None:
    datatype, nop, parts = nccl_op(op, src.dtype)
    recv = _ptr(dst) if dst is not None else _ptr(src)  # NCCL reads recvbuff at root only
    count = check_count(t.nccl, "reduce", src.size * parts, "reduce (native)")
    t.nccl.reduce(_ptr(src), recv, count, datatype, nop, root, t.stream_ptr())


def native_all_reduce(t: NCCLTransport, src: Any, dst: Any, op: Op) -> None:
    datatype, nop, parts = nccl_op(op, src.dtype)
    count = check_count(t.nccl, "allReduce", src.size * parts, "all_reduce (native)")
    t.nccl.allReduce(_ptr(src), _ptr(dst), count, datatype, nop, t.stream_ptr())


def direct_all_reduce(t: NCCLTransport, op: Op, dtype: np.dtype,
                      count: int) -> Callable[[Any, Any], None]:
    """``native_all_reduce`` on device arrays of ``count`` items of ``dtype``, its
    arguments fixed once: ``run(src, dst)``, the same ncclAllReduce on the current
    stream (what a decided call runs: ``pipeline.decided``)."""
    datatype, nop, parts = nccl_op(op, dtype)
    count = check_count(t.nccl, "allReduce", count * parts, "all_reduce (native)")
    all_reduce, current_stream = t.nccl.allReduce, cupy_module().cuda.get_current_stream

    def run(src: Any, dst: Any) -> None:
        all_reduce(src.data.ptr, dst.data.ptr, count, datatype, nop, current_stream().ptr)

    return run


def native_reduce_scatter(t: NCCLTransport, src: Any, bounds: tuple[int, ...], op: Op,
                          dst: Any) -> None:
    datatype, nop, parts = nccl_op(op, src.dtype)
    stream = t.stream_ptr()
    if _even(bounds):
        count = check_count(t.nccl, "reduceScatter", dst.size * parts,
                            "reduce_scatter (native)")
        t.nccl.reduceScatter(_ptr(src), _ptr(dst), count, datatype, nop, stream)
        return
    # uneven blocks: one ncclReduce per block, rooted at the rank that keeps it, grouped
    for j in range(t.size):  # every count checked before any is issued
        check_count(t.nccl, "reduce", _block(src, bounds, j).size * parts,
                    "reduce_scatter (native)")
    t._nccl.groupStart()
    try:
        for j in range(t.size):
            block = _block(src, bounds, j)
            recv = _ptr(dst) if j == t.rank else _ptr(block)
            t.nccl.reduce(_ptr(block), recv, block.size * parts, datatype, nop, j, stream)
    finally:
        t._nccl.groupEnd()


def native_all_to_all(t: NCCLTransport, src: Any, send_bounds: tuple[int, ...], dst: Any,
                      recv_bounds: tuple[int, ...]) -> None:
    for j in range(t.size):
        if j == t.rank:
            _block(dst, recv_bounds, j)[...] = _block(src, send_bounds, j)
        else:
            t.isend(_block(src, send_bounds, j), j)
            t.irecv(_block(dst, recv_bounds, j), j)
    t.issue()


def native_barrier(t: NCCLTransport) -> None:
    token = t.take(1, np.float32, like=t._device_like)
    t.nccl.allReduce(_ptr(token), _ptr(token), 1, NCCL_DTYPES[np.dtype(np.float32)], NCCL_SUM,
                     t.stream_ptr())
    t.synchronize()  # a barrier returns on the host only once every rank has entered


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
# NCCL averages itself (ncclAvg): the Communicator must not divide again
AVERAGES_ITSELF = frozenset({native_reduce, native_all_reduce, native_reduce_scatter})
