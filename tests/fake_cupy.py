"""A stand-in for CuPy made of NumPy, so the GPU code paths run where there is no GPU.

Its arrays are NumPy arrays of another type whose module is "cupy": mpicoll takes them
for device arrays and goes down every GPU path (library-aware allocation, staging through
"pinned" memory, results given back as "CuPy" arrays), while the memory is host memory
and the arithmetic NumPy's. It checks mpicoll's logic, not CUDA: the real thing runs in
tests/test_gpu.py on a GPU.
"""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np


class ndarray(np.ndarray):  # noqa: N801  (CuPy's name)
    """A 'device' array: NumPy memory, CuPy's type name and copy methods."""

    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is None:
            return np.array(self.view(np.ndarray))
        out[...] = self.view(np.ndarray)
        return out

    def set(self, arr, stream=None):
        assert isinstance(arr, np.ndarray) and type(arr) is np.ndarray, "set takes host memory"
        self.view(np.ndarray)[...] = arr

    @property
    def data(self):  # CuPy's MemoryPointer: .ptr is the address
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.__array_interface__["data"][0], False), "strides": None}


ndarray.__module__ = "cupy._core.core"


class _Stream:
    ptr = 0
    synchronized = 0

    def synchronize(self):
        _Stream.synchronized += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    """A CUDA event: the stand-in's stream has always run what was queued on it."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded = 0

    def record(self, stream=None):
        self.recorded += 1

    def synchronize(self):
        pass

    @property
    def done(self):
        return True


def _device(a):
    return np.asarray(a).view(ndarray)


# ---- cupy.cuda.nccl over MPI: NCCL's calls by address, run as MPI's ---------------------

_NCCL_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
                6: np.float16, 7: np.float32, 8: np.float64}


def _memory(ptr: int, count: int, datatype: int) -> np.ndarray:
    dtype = np.dtype(_NCCL_DTYPES[datatype])
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype)


class _Group:
    depth = 0
    pending: list = []


def groupStart():  # noqa: N802  (NCCL's names)
    _Group.depth += 1


def groupEnd():  # noqa: N802
    _Group.depth -= 1
    if _Group.depth == 0:
        pending, _Group.pending = _Group.pending, []
        requests = [call() for call in pending]  # point-to-point: all posted, then waited
        from mpi4py import MPI

        MPI.Request.Waitall([r for r in requests if r is not None])


class NcclCommunicator:
    """NCCL's communicator for the ranks of MPI.COMM_WORLD, moving bytes with MPI."""

    def __init__(self, ndev, commId, rank):  # noqa: N803
        from mpi4py import MPI

        assert len(commId) == 128 and ndev == MPI.COMM_WORLD.Get_size()
        self._comm = MPI.COMM_WORLD.Dup()
        assert self._comm.Get_rank() == rank

    def _op(self, op):
        from mpi4py import MPI

        return {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN, 4: MPI.SUM}[op]

    def _average(self, buf, op):
        if op == 4:
            buf /= self._comm.Get_size()

    def send(self, ptr, count, datatype, peer, stream):
        # synchronous: a send ends only once its receive is posted, as NCCL's kernels
        call = lambda: self._comm.Issend(_memory(ptr, count, datatype), peer, 7)  # noqa: E731
        _Group.pending.append(call) if _Group.depth else call().Wait()

    def recv(self, ptr, count, datatype, peer, stream):
        call = lambda: self._comm.Irecv(_memory(ptr, count, datatype), peer, 7)  # noqa: E731
        _Group.pending.append(call) if _Group.depth else call().Wait()

    def _now_or_in_group(self, call):
        if _Group.depth:
            _Group.pending.append(lambda: call() or None)
        else:
            call()

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        from mpi4py import MPI

        def call():
            recv = _memory(recvbuf, count, datatype)
            send = MPI.IN_PLACE if sendbuf == recvbuf else _memory(sendbuf, count, datatype)
            self._comm.Allreduce(send, recv, self._op(op))
            self._average(recv, op)

        self._now_or_in_group(call)

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        from mpi4py import MPI

        def call():
            at_root = self._comm.Get_rank() == root
            recv = _memory(recvbuf, count, datatype) if at_root else None
            send = MPI.IN_PLACE if at_root and sendbuf == recvbuf else \
                _memory(sendbuf, count, datatype)
            self._comm.Reduce(send, recv, self._op(op), root)
            if at_root:
                self._average(recv, op)

        self._now_or_in_group(call)

    def broadcast(self, sendbuf, recvbuf, count, datatype, root, stream):
        assert sendbuf == recvbuf, "mpicoll broadcasts in place"
        self._now_or_in_group(lambda: self._comm.Bcast(_memory(recvbuf, count, datatype), root))

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        from mpi4py import MPI

        def call():
            p, rank = self._comm.Get_size(), self._comm.Get_rank()
            itemsize = np.dtype(_NCCL_DTYPES[datatype]).itemsize
            assert sendbuf == recvbuf + rank * count * itemsize, "mpicoll gathers in place"
            self._comm.Allgather(MPI.IN_PLACE, _memory(recvbuf, p * count, datatype))

        self._now_or_in_group(call)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        def call():
            p = self._comm.Get_size()
            recv = _memory(recvbuf, recvcount, datatype)
            self._comm.Reduce_scatter_block(_memory(sendbuf, p * recvcount, datatype), recv,
                                            self._op(op))
            self._average(recv, op)

        self._now_or_in_group(call)

    def destroy(self):
        pass


def make_module() -> types.ModuleType:
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    cupy.empty = lambda shape, dtype=float: np.empty(shape, dtype).view(ndarray)
    cupy.zeros = lambda shape, dtype=float: np.zeros(shape, dtype).view(ndarray)
    cupy.asarray = lambda a, dtype=None: np.array(a, dtype=dtype).view(ndarray)
    cupy.ascontiguousarray = lambda a: np.ascontiguousarray(a.view(np.ndarray)).view(ndarray)
    cupy.may_share_memory = np.may_share_memory
    cupy.asnumpy = lambda a: np.array(a.view(np.ndarray))
    stream = _Stream()
    cuda = types.ModuleType("cupy.cuda")
    cuda.get_current_stream = lambda: stream
    cuda.alloc_pinned_memory = lambda nbytes: bytearray(nbytes)
    cuda.Stream = _Stream
    cuda.Event = _Event
    cupy.__version__ = "0.0-numpy-stand-in"
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, getDevice=lambda: 0, runtimeGetVersion=lambda: 0,
        getDeviceProperties=lambda n: {"name": b"NumPy stand-in"})
    cuda.driver = types.SimpleNamespace(ctxGetCurrent=lambda: 0)
    cuda.Device = lambda n=0: types.SimpleNamespace(use=lambda: None, id=n)
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    nccl.get_version = lambda: 0
    nccl.get_unique_id = lambda: tuple(range(-64, 64))
    nccl.groupStart, nccl.groupEnd = groupStart, groupEnd
    nccl.NcclCommunicator = NcclCommunicator
    cuda.nccl = nccl
    cupy.cuda = cuda
    return cupy


_NAMES = ("cupy", "cupy.cuda", "cupy.cuda.nccl")


class installed:
    """``with installed():`` makes ``import cupy`` (and cupy.cuda.nccl) give the stand-in."""

    def __enter__(self):
        self._saved = {name: sys.modules.get(name) for name in _NAMES}
        cupy = make_module()
        sys.modules.update({"cupy": cupy, "cupy.cuda": cupy.cuda,
                            "cupy.cuda.nccl": cupy.cuda.nccl})
        return cupy

    def __exit__(self, *exc):
        for name, module in self._saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        return False
