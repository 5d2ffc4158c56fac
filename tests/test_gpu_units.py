"""The GPU paths' decisions and tables, tested where there is no GPU.

NCCL's dtype/op table, the device a rank picks, whether device buffers are staged, the
pinned staging allocator, the NCCL transport's grouping of messages (over a stand-in
for cupy.cuda.nccl), and DLPack round trips of host tensors.
"""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import arrays, cuda
from mpicoll.backends.nccl_native import (
    NCCL_AVG,
    NCCL_MAX,
    NCCL_MIN,
    NCCL_PROD,
    NCCL_SUM,
    nccl_op,
)
from mpicoll.local import run_local
from mpicoll.ops import resolve_op
from mpicoll.transport.nccl import NCCLTransport

# ---- NCCL's tables -------------------------------------------------------------------


@pytest.mark.parametrize("dtype,op,expected", [
    ("f4", "sum", (7, NCCL_SUM, 1)),
    ("f8", "prod", (8, NCCL_PROD, 1)),
    ("f2", "avg", (6, NCCL_AVG, 1)),
    ("i1", "max", (0, NCCL_MAX, 1)),
    ("u1", "min", (1, NCCL_MIN, 1)),
    ("i4", "sum", (2, NCCL_SUM, 1)),
    ("u4", "sum", (3, NCCL_SUM, 1)),
    ("i8", "prod", (4, NCCL_PROD, 1)),
    ("u8", "max", (5, NCCL_MAX, 1)),
    (ml_dtypes.bfloat16, "sum", (9, NCCL_SUM, 1)),
    ("c8", "sum", (7, NCCL_SUM, 2)),  # complex: twice the floats
    ("c16", "avg", (8, NCCL_AVG, 2)),
    ("?", "sum", (1, NCCL_MAX, 1)),  # bool: sum is OR, prod is AND
    ("?", "prod", (1, NCCL_MIN, 1)),
    ("?", "bor", (1, NCCL_MAX, 1)),
    ("?", "band", (1, NCCL_MIN, 1)),
    ("?", "lor", (1, NCCL_MAX, 1)),  # logical on bool: the same OR and AND
    ("?", "land", (1, NCCL_MIN, 1)),
])
def test_nccl_table(dtype, op, expected):
    dtype = np.dtype(dtype)
    assert nccl_op(resolve_op(op, dtype), dtype) == expected


@pytest.mark.parametrize("dtype,op,error,match", [
    ("i2", "sum", mpicoll.UnsupportedDtypeError, "cannot reduce dtype int16"),
    ("u2", "max", mpicoll.UnsupportedDtypeError, "cannot reduce dtype uint16"),
    ("g", "sum", mpicoll.UnsupportedDtypeError, "cannot reduce dtype float128"),
    ("c8", "prod", mpicoll.UnsupportedDtypeError, "complex .* only with sum or avg"),
    ("i4", "band", mpicoll.UnsupportedOpError, "no 'band'"),
    ("u8", "bxor", mpicoll.UnsupportedOpError, "no 'bxor'"),
    ("?", "bxor", mpicoll.UnsupportedOpError, "cannot bxor bool"),
    ("?", "lxor", mpicoll.UnsupportedOpError, "cannot lxor bool"),
    ("i4", "land", mpicoll.UnsupportedOpError, "no 'land'"),
    ("f4", "lor", mpicoll.UnsupportedOpError, "no 'lor'"),
    (mpicoll.loc_dtype("f4"), "minloc", mpicoll.UnsupportedOpError, "no 'minloc'"),
])
def test_nccl_table_refusals(dtype, op, error, match):
    dtype = np.dtype(dtype)
    with pytest.raises(error, match=match):
        nccl_op(resolve_op(op, dtype), dtype)


def test_nccl_refuses_user_ops():
    op = mpicoll.Op(np.add, commutative=True, name="my_add")
    with pytest.raises(mpicoll.UnsupportedOpError, match="no user-defined ops .*'my_add'"):
        nccl_op(op, np.dtype("f4"))


def test_every_op_dtype_pair_is_served_or_refused_clearly():
    from reference import DTYPE_OPS, _dtype

    for name, op in DTYPE_OPS:
        dtype = _dtype(name)
        try:
            datatype, nop, parts = nccl_op(resolve_op(op, dtype), dtype)
        except (mpicoll.UnsupportedDtypeError, mpicoll.UnsupportedOpError) as exc:
            assert "NCCL" in str(exc), (name, op, exc)
            continue
        assert 0 <= datatype <= 9 and 0 <= nop <= 4 and parts in (1, 2)
        assert dtype.itemsize % parts == 0


# ---- which device, CUDA-aware or staged ----------------------------------------------


@pytest.mark.parametrize("ranks_per_node,devices", [(1, 1), (4, 1), (4, 4), (8, 4), (3, 2)])
def test_one_gpu_per_local_rank(ranks_per_node, devices):
    picked = [cuda.choose_device(r, devices, environ={}) for r in range(ranks_per_node)]
    assert picked == [r % devices for r in range(ranks_per_node)]
    # each GPU serves ceil or floor of ranks/devices ranks
    loads = [picked.count(d) for d in range(devices)]
    assert max(loads) - min(loads) <= 1


def test_select_device_takes_device_0_for_no_choice():
    """Every thread starts on device 0 and any allocation makes a context there: only
    another current device is the user's choice."""
    from fake_cupy import installed
    from mpi4py import MPI

    with installed() as cupy:
        cupy.cuda.Device(0).use()
        assert cuda.select_device(MPI.COMM_SELF) == 0  # local rank 0 of COMM_SELF
        cupy.cuda.Device(5).use()
        assert cuda.select_device(MPI.COMM_SELF) == 5  # the user's choice is kept
        cupy.cuda.Device(0).use()


def test_device_choice_respects_the_user_and_the_environment():
    assert cuda.choose_device(3, 4, current=1, environ={}) == 1  # the user chose
    assert cuda.choose_device(3, 4, current=1, environ={"MPICOLL_DEVICE": "2"}) == 2
    with pytest.raises(mpicoll.InvalidArgumentError, match="MPICOLL_DEVICE='7'"):
        cuda.choose_device(0, 4, environ={"MPICOLL_DEVICE": "7"})
    with pytest.raises(mpicoll.InvalidArgumentError, match="no CUDA device"):
        cuda.choose_device(0, 0, environ={})


class _FakeMPI:
    """A stand-in for the MPI library's symbols (ctypes' CDLL attributes)."""

    def __init__(self, **symbols):
        self.__dict__.update(symbols)


def test_cuda_awareness_from_the_mpi_library():
    assert cuda.query_mpi_cuda_support(_FakeMPI()) is None  # it cannot tell
    assert cuda.query_mpi_cuda_support(_FakeMPI(MPIX_Query_cuda_support=lambda: 1)) is True
    assert cuda.query_mpi_cuda_support(_FakeMPI(MPIX_Query_cuda_support=lambda: 0)) is False

    def gpu_query(kind, flag):  # MPICH 4: MPIX_GPU_query_support(kind, &flag)
        assert kind.value == 0  # MPIX_GPU_SUPPORT_CUDA
        flag._obj.value = 1
        return 0

    assert cuda.query_mpi_cuda_support(_FakeMPI(MPIX_GPU_query_support=gpu_query)) is True
    # unknown means staging; the override wins either way
    assert cuda.cuda_aware_mpi({}, _FakeMPI()) is False
    assert cuda.cuda_aware_mpi({"MPICOLL_CUDA_AWARE": "1"}, _FakeMPI()) is True
    assert cuda.cuda_aware_mpi({"MPICOLL_CUDA_AWARE": "0"},
                               _FakeMPI(MPIX_Query_cuda_support=lambda: 1)) is False
    with pytest.raises(mpicoll.InvalidArgumentError, match="MPICOLL_CUDA_AWARE='maybe'"):
        cuda.cuda_aware_mpi({"MPICOLL_CUDA_AWARE": "maybe"}, _FakeMPI())


def test_this_mpi_library_answers():
    """The library mpi4py loaded is asked (its symbols are not in the process's global
    namespace): it answers yes or no, and the MPICH wheel says no."""
    from mpi4py import MPI

    answer = cuda.query_mpi_cuda_support()
    assert answer is True or answer is False, f"the MPI library did not answer: {answer!r}"
    if "MPICH" in MPI.Get_library_version() and _mpich_wheel():
        assert answer is False  # the PyPI wheel is built without CUDA
    assert cuda.query_mpi_cuda_support(ctypes.CDLL(None)) is None  # why a handle is needed


def _mpich_wheel() -> bool:
    from importlib import metadata

    try:
        metadata.version("mpich")
    except metadata.PackageNotFoundError:
        return False
    return True


class _HostStaging(cuda.PinnedStaging):
    """PinnedStaging over ordinary host memory, to test its bookkeeping without CUDA."""

    allocations = 0

    def _allocate(self, nbytes):
        type(self).allocations += 1
        self._blocks.append(np.zeros(nbytes, np.uint8))
        self._used = 0


def test_pinned_staging_is_reused_call_after_call():
    staging = _HostStaging()
    for _call in range(3):
        staging.reset()
        sends = [staging.take(1000) for _ in range(3)]  # nonblocking: kept for the call
        mark = staging.mark()
        blocking = staging.take(5000)
        staging.release(mark)  # a blocking message gives its space back
        again = staging.take(5000)
        assert again.__array_interface__["data"][0] == blocking.__array_interface__["data"][0]
        starts = [s.__array_interface__["data"][0] for s in sends]
        assert all(b - a >= 1000 for a, b in zip(starts, starts[1:], strict=False))  # apart
        assert all((s - starts[0]) % 256 == 0 for s in starts)  # aligned within the block
    assert _HostStaging.allocations == 1  # one block, made once


def test_pinned_staging_grows_then_merges():
    _HostStaging.allocations = 0
    staging = _HostStaging()
    staging.reset()
    first = staging.take(1 << 20)
    second = staging.take(3 << 20)  # does not fit: a second block for the rest of the call
    assert not np.shares_memory(first, second)
    assert len(staging._blocks) == 2
    staging.reset()  # merged into one block big enough for the whole call
    assert len(staging._blocks) == 1 and staging.capacity >= 4 << 20
    staging.take(1 << 20)
    staging.take(3 << 20)
    assert len(staging._blocks) == 1 and _HostStaging.allocations == 3


# ---- the NCCL transport's groups, over a stand-in for cupy.cuda.nccl --------------------


class _DeviceBuffer:
    def __init__(self, nbytes, ptr, dtype=np.uint8):
        self.nbytes, self.dtype = nbytes, np.dtype(dtype)
        self.data = type("Pointer", (), {"ptr": ptr})()


class _FakeNccl:
    def __init__(self):
        self.log = []

    def groupStart(self):
        self.log.append("start")

    def groupEnd(self):
        self.log.append("end")

    def send(self, ptr, count, datatype, peer, stream):
        self.log.append(("send", ptr, count, datatype, peer))

    def recv(self, ptr, count, datatype, peer, stream):
        self.log.append(("recv", ptr, count, datatype, peer))


def _fake_transport():
    t = object.__new__(NCCLTransport)
    fake = _FakeNccl()
    t._nccl, t.nccl, t._queue = fake, fake, []
    t._queued = t._issued = 0
    t._tokens = _DeviceBuffer(1, 900), _DeviceBuffer(1, 901)
    t.stream_ptr = lambda: 0
    return t, fake.log


def test_nccl_transport_drops_what_a_failed_call_left_queued():
    """NCCL has no tags: a send a failed call queued and never issued must not go out
    with the next call's messages, where the peer's receive would match it."""
    t, log = _fake_transport()
    t._device_like, t._arenas, t._tops, t._scopes, t._device = None, {}, [0, 0], [], False
    t.isend(_DeviceBuffer(8, 100), 1)  # the failed call's, never waited on
    t.begin()
    ticket = t.irecv(_DeviceBuffer(8, 200), 1)
    t.waitall([ticket])
    assert log == ["start", ("recv", 200, 8, 1, 1), "end"]


def test_nccl_transport_groups_nonblocking_messages_until_a_wait():
    t, log = _fake_transport()
    a, b, c = _DeviceBuffer(8, 100), _DeviceBuffer(8, 200), _DeviceBuffer(4, 300)
    first = t.isend(a, 1)
    second = t.irecv(b, 2)
    assert log == []  # queued, not issued
    t.waitall([second])
    assert log == ["start", ("send", 100, 8, 1, 1), ("recv", 200, 8, 1, 2), "end"]
    log.clear()
    # a wait on messages already issued issues nothing: a send queued since stays queued
    # until a wait needs it, and goes out together with the receive the peer expects
    third = t.isend(c, 1)
    t.waitall([first, second])
    assert log == []
    fourth = t.irecv(a, 2)
    t.waitall([fourth])
    assert log == ["start", ("send", 300, 4, 1, 1), ("recv", 100, 8, 1, 2), "end"]
    log.clear()
    t.waitall([third, fourth])
    t.isend(b, 1)
    t.issue()  # native collectives issue their queue explicitly
    assert log == ["start", ("send", 200, 8, 1, 1), "end"]
    log.clear()
    t.isend(a, 3)
    t.recv(c, 3)  # a blocking message issues the queue with itself, in one group
    assert log == ["start", ("send", 100, 8, 1, 3), ("recv", 300, 4, 1, 3), "end"]
    log.clear()
    t.sendrecv(a, 1, b, 2)
    assert log == ["start", ("send", 100, 8, 1, 1), ("recv", 200, 8, 1, 2), "end"]


def test_nccl_transport_empty_messages_become_tokens():
    t, log = _fake_transport()
    t.sendrecv(np.empty(0, np.uint8), 1, np.empty(0, np.uint8), 2)  # a barrier's messages
    assert log == ["start", ("send", 900, 1, 1, 1), ("recv", 901, 1, 1, 2), "end"]
    with pytest.raises(TypeError, match="device"):
        t.send(np.zeros(4, np.uint8), 1)


@pytest.mark.parametrize("dtype,count,datatype", [
    ("f8", 3, 5), ("i8", 3, 5), ("c16", 6, 5), ("c8", 3, 5), ("f4", 3, 3), ("i4", 3, 3),
    ("f2", 3, 6), (ml_dtypes.bfloat16, 3, 6), ("u1", 3, 1), ("?", 3, 1), ("V3", 9, 1),
    ("V6", 9, 6), ("V12", 9, 3)])
def test_nccl_messages_count_elements_not_bytes(dtype, count, datatype):
    """Data that only moves goes as elements of an NCCL type as wide as its items (or the
    widest that divides them), never as bytes where the dtype allows: 8 times fewer for
    float64, so a count stays below a C int for 8 times more data."""
    from mpicoll.transport.nccl import wire

    assert wire(np.zeros(3, dtype)) == (count, datatype)


def test_nccl_transport_sends_element_counts():
    t, log = _fake_transport()
    t.sendrecv(_DeviceBuffer(16, 100, np.float64), 1, _DeviceBuffer(12, 200, np.float32), 2)
    assert log == ["start", ("send", 100, 2, 5, 1), ("recv", 200, 3, 3, 2), "end"]


def _stand_in_communicator(api):
    """The stand-in's NcclCommunicator of CuPy ``api``, not started (no MPI behind it)."""
    from fake_cupy import make_module

    cls = make_module(api).cuda.nccl.NcclCommunicator
    return object.__new__(cls)


def test_nccl_count_limit_reads_the_bindings_signature():
    from mpicoll.transport.nccl import C_INT_MAX, count_limit

    for api in (13, 14):
        comm = _stand_in_communicator(api)
        for method in ("send", "recv", "allReduce", "reduce", "allGather", "reduceScatter"):
            assert count_limit(type(comm), method) == 2**64 - 1, (api, method)
        assert count_limit(type(comm), "broadcast") == (C_INT_MAX if api < 14 else 2**64 - 1)

    class Unreadable:  # no embedded signature: the narrower type is assumed
        def send(self, ptr, count, datatype, peer, stream):
            pass

    assert count_limit(Unreadable, "send") == C_INT_MAX


class _Huge:
    """A device buffer's description, with no memory behind it (the binding is never
    reached: the count is refused first)."""

    def __init__(self, nbytes, dtype):
        self.nbytes, self.dtype = nbytes, np.dtype(dtype)
        self.size = nbytes // self.dtype.itemsize
        self.data = type("Pointer", (), {"ptr": 0})()


def test_a_count_above_a_c_int_is_refused_where_cupy_takes_an_int():
    """CuPy 13's ncclBroadcast binding takes an int count: above 2**31 - 1 elements
    mpicoll refuses clearly (the binding would raise a bare OverflowError); the same
    bytes as float64 elements fit, and CuPy 14's size_t takes any count."""
    from mpicoll.backends.nccl_native import native_all_reduce, native_broadcast
    from mpicoll.transport.nccl import check_count

    t = object.__new__(NCCLTransport)
    t.stream_ptr = lambda: 0
    t.nccl = _stand_in_communicator(13)
    with pytest.raises(OverflowError):  # what the binding itself does, unchecked
        t.nccl.broadcast(0, 0, 2**31, 1, 0, 0)
    with pytest.raises(mpicoll.InvalidArgumentError,
                       match=r"broadcast \(native\): 2147483648 elements .* at most 2147483647"):
        native_broadcast(t, _Huge(2**31, np.uint8), 0)
    calls = []
    t.nccl.broadcast = lambda *args: calls.append(args)  # the call, not its memory
    native_broadcast(t, _Huge(2**31, np.float64), 0)  # the same 2 GiB, as 2**28 elements
    assert calls == [(0, 0, 2**28, 5, 0, 0)]
    assert check_count(_stand_in_communicator(14), "broadcast", 2**40, "x") == 2**40

    class IntCount:
        def allReduce(self, *args):  # noqa: N802
            """NcclCommunicator.allReduce(self, intptr_t sendbuf, intptr_t recvbuf, int count, int datatype, int op, intptr_t stream)"""  # noqa: E501
            calls.append(args)

    t.nccl = IntCount()
    with pytest.raises(mpicoll.InvalidArgumentError, match=r"all_reduce \(native\)"):
        native_all_reduce(t, _Huge(2**33, np.float32), _Huge(2**33, np.float32),
                          resolve_op("sum", np.dtype(np.float32)))
    assert len(calls) == 1


def test_nccl_transport_refuses_a_huge_message_before_issuing_any():
    class IntRecv:
        log: list = []

        def groupStart(self):  # noqa: N802
            self.log.append("start")

        def groupEnd(self):  # noqa: N802
            self.log.append("end")

        def send(self, *args):
            """NcclCommunicator.send(self, intptr_t sendbuf, int count, int datatype, int peer, intptr_t stream)"""  # noqa: E501
            self.log.append("send")

        recv = send

    t, _ = _fake_transport()
    t._nccl = t.nccl = IntRecv()
    t.isend(_DeviceBuffer(8, 100), 1)
    with pytest.raises(mpicoll.InvalidArgumentError, match="a send to rank 2: 2147483648"):
        t.sendrecv(_Huge(2**31 * 4, np.float32), 2, _DeviceBuffer(8, 200), 2)
    assert IntRecv.log == []  # nothing issued, not even the message queued before


# ---- arrays: DLPack, host and device libraries --------------------------------------


class _Tensor:
    """A foreign tensor that speaks only DLPack (like a torch or JAX CPU tensor)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_input_is_not_copied():
    data = np.arange(6, dtype=np.float32)
    array, back = arrays.as_array(_Tensor(data), "x")
    assert type(array) is np.ndarray and np.shares_memory(array, data)
    assert back(array) is array  # an unknown package: NumPy comes back


def test_dlpack_tensors_through_collectives():
    def body(comm):
        x = _Tensor(np.full(5, comm.rank + 1, np.int64))
        total = comm.all_reduce(x, algorithm="ring")
        rows = comm.all_gather(x, algorithm="bruck")
        return total, rows

    for total, rows in run_local(3, body):
        assert np.array_equal(total, np.full(5, 6))
        assert np.array_equal(rows, np.repeat(np.arange(1, 4), 5).reshape(3, 5))


def test_torch_tensors_come_back_as_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")

    def body(comm):
        x = torch.full((4,), float(comm.rank + 1))
        out = comm.all_reduce(x, "max", algorithm="recursive_doubling")
        return out

    for out in run_local(3, body):
        assert isinstance(out, torch.Tensor) and out.tolist() == [3.0] * 4


def test_device_type_must_be_host_or_cuda():
    class Elsewhere(_Tensor):
        def __dlpack_device__(self):
            return (14, 0)  # kDLOneAPI

    with pytest.raises(mpicoll.InvalidArgumentError, match="neither the host nor CUDA"):
        arrays.as_array(Elsewhere(np.zeros(2)), "x")


def test_arrays_without_cupy():
    x = np.zeros(3)
    assert arrays.module_of(x) is np and not arrays.is_cupy(x)
    assert type(arrays.empty(4, np.int8, like=x)) is np.ndarray
    assert arrays.to_host(x) is x
    dst = np.zeros(4)
    arrays.assign_from_host(dst, np.arange(4.0))
    assert dst.tolist() == [0, 1, 2, 3]


def test_stream_keyword_is_checked():
    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="stream: expected a cupy.cuda.Stream"):
            comm.all_reduce(np.zeros(2), stream="default")
        return comm.all_reduce(np.ones(2), stream=None)

    for out in run_local(2, body):
        assert out.tolist() == [2, 2]


# ---- NCCL's unique id: CuPy 14 bytes, CuPy 13 tuples of C chars ---------------------------

from mpicoll.transport import nccl as nccl_transport  # noqa: E402

RAW = bytes(range(256))[::2]  # 128 bytes, half of them above 127


def test_unique_id_as_cupy_14_takes_it():
    assert nccl_transport.unique_id_for_cupy(RAW, 14) == RAW
    assert nccl_transport.unique_id_bytes(RAW) == RAW


@pytest.mark.parametrize("machine,signed", [("x86_64", True), ("aarch64", False),
                                            ("ppc64le", False), ("AMD64", True)])
def test_unique_id_as_cupy_13_takes_it(machine, signed):
    """CuPy <= 13: a tuple of C chars, signed on x86 (-128..127), unsigned on ARM and
    POWER (0..255); the raw bytes come back from either."""
    commid = nccl_transport.unique_id_for_cupy(RAW, 13, machine)
    assert type(commid) is tuple and len(commid) == 128
    low, high = (-128, 127) if signed else (0, 255)
    assert all(low <= c <= high for c in commid) and min(commid) < 0 if signed else True
    assert nccl_transport.unique_id_bytes(commid) == RAW


def test_unique_id_of_the_wrong_length_is_refused():
    with pytest.raises(mpicoll.InvalidArgumentError, match="127 bytes, expected 128"):
        nccl_transport.unique_id_bytes(RAW[:-1])


def test_pci_bus_numbers_tell_gpus_apart():
    assert cuda.pci_bus_number("0000:3B:00.0") != cuda.pci_bus_number("0000:3C:00.0")
    assert cuda.pci_bus_number("0001:3b:00.0") != cuda.pci_bus_number("0000:3b:00.0")
    assert cuda.pci_bus_number("0000:3b:00.1") == cuda.pci_bus_number("0000:3B:00.1")


def test_agreement_names_every_failing_rank():
    """``agree`` over a stand-in communicator of three ranks, as rank 1 sees it."""

    class Three:
        def Get_size(self):  # noqa: N802
            return 3

        def Get_rank(self):  # noqa: N802
            return 1

        def Allgather(self, mine, codes):  # noqa: N802
            codes[:] = [cuda.OK, cuda.NO_DRIVER, cuda.SHARED_GPU]
            assert mine.tolist() == [cuda.NO_DRIVER]

    with pytest.raises(mpicoll.InvalidArgumentError) as error:
        cuda.agree(Three(), cuda.NO_DRIVER, "cudaErrorInsufficientDriver", "backend 'nccl'")
    text = str(error.value)
    assert "rank 1: no usable CUDA driver" in text and "rank 2: shares its GPU" in text
    assert "[rank 1: cudaErrorInsufficientDriver]" in text and "rank 0" not in text


# ---- arrays: one memory test for every library; every import failure is mpicoll's --------


def test_same_memory_without_the_array_interface():
    from fake_cupy import installed

    host = np.zeros(8)
    assert arrays.same_memory(host[2:4], host[2:4]) and not arrays.same_memory(host[2:4], host[2:5])
    with installed() as cupy:
        device = cupy.zeros(8)
        assert not hasattr(device, "__array_interface__")
        assert arrays.same_memory(device[2:4], device[2:4])
        assert not arrays.same_memory(device[2:4], device[3:5])
        assert not arrays.same_memory(device[:0], host[:0])  # host and device never


def test_copy_into_stays_in_one_library():
    from fake_cupy import installed

    with installed() as cupy:
        dst = cupy.zeros(3)
        arrays.copy_into(dst, cupy.asarray(np.arange(3.0)))
        assert dst.get().tolist() == [0, 1, 2]
        with pytest.raises(mpicoll.InvalidArgumentError, match="numpy array cannot be copied"):
            arrays.copy_into(dst, np.arange(3.0))
        with pytest.raises(TypeError):
            np.copyto(np.zeros(3), dst)  # what the Bucketer did: CuPy refuses it
        with pytest.raises(TypeError, match="Implicit conversion"):
            np.asarray(dst)
    with pytest.raises(mpicoll.UnsupportedDtypeError, match="cannot cast complex128"):
        arrays.copy_into(np.zeros(2), np.zeros(2, complex))


def test_bucketer_keeps_device_gradients_on_the_device():
    from fake_cupy import installed

    with installed() as cupy:
        def body(comm):
            grads = [cupy.asarray(np.full(3, comm.rank + 1.0)), cupy.zeros((2, 2), np.float32)]
            buckets = mpicoll.Bucketer(comm, grads, cap_bytes=16)
            assert all(isinstance(b, cupy.ndarray) for b in buckets.buffers)
            for i, g in enumerate(grads):
                buckets.add(i, g)
            return [r.get() for r in buckets.wait()]

        for first, second in run_local(2, body):
            assert first.tolist() == [3.0] * 3 and second.shape == (2, 2)


def test_cupy_13_bfloat16_is_an_mpicoll_error():
    """CuPy <= 13 raises NotImplementedError for a bfloat16 CUDA tensor."""
    from dlpack_capsule import KDL_CUDA, Tensor
    from fake_cupy import installed

    with installed(api=13), pytest.raises(mpicoll.UnsupportedDtypeError, match="CuPy >= 14"):
        arrays.as_array(Tensor(np.zeros(3, ml_dtypes.bfloat16), KDL_CUDA), "x")
    with installed(api=14):
        array, _ = arrays.as_array(Tensor(np.zeros(3, ml_dtypes.bfloat16), KDL_CUDA), "x")
        assert array.dtype == ml_dtypes.bfloat16


def test_a_producer_that_fails_is_an_mpicoll_error():
    class Broken:
        def __dlpack__(self, **kwargs):
            raise BufferError("cannot export")

        def __dlpack_device__(self):
            return (1, 0)

    class NoDevice(Broken):
        def __dlpack_device__(self):
            raise RuntimeError("no device")

    with pytest.raises(mpicoll.InvalidArgumentError, match="cannot import this DLPack tensor"):
        arrays.as_array(Broken(), "x")
    with pytest.raises(mpicoll.InvalidArgumentError, match="__dlpack_device__"):
        arrays.as_array(NoDevice(), "x")


# ---- DLPack from a producer that is not NumPy (a ctypes one), and back -------------------


def test_dlpack_of_another_producer_is_read_in_place():
    from dlpack_capsule import Tensor

    memory = np.arange(6, dtype=np.float32)
    array, back = arrays.as_array(Tensor(memory), "x")
    assert type(array) is np.ndarray and np.shares_memory(array, memory)
    assert back(array) is array  # an unknown package: NumPy comes back


def test_dlpack_of_another_producer_round_trip():
    """Its tensors in, results out, and out= a tensor of it: the result lands in the
    producer's own memory."""
    from dlpack_capsule import Tensor

    def body(comm):
        memory = np.zeros(4, np.int32)
        total = comm.all_reduce(Tensor(np.full(4, comm.rank + 1, np.int32)), algorithm="ring")
        out = Tensor(memory)
        assert comm.all_reduce(Tensor(np.full(4, comm.rank + 1, np.int32)), out=out) is out
        rows = comm.all_gather(Tensor(np.array([comm.rank], np.int64)), algorithm="bruck")
        return total, memory, rows

    for total, memory, rows in run_local(3, body):
        assert total.tolist() == memory.tolist() == [6] * 4
        assert rows.tolist() == [[0], [1], [2]]
