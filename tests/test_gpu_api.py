"""mpicoll against the real CuPy and NCCL Python APIs, on a machine without a GPU.

Everything mpicoll calls in CuPy and cupy.cuda.nccl is checked here where it can be
without a device: each attribute exists, NCCL's methods take the arguments in the order
mpicoll passes them, the type and op numbers match NCCL's, the unique id goes through
mpicoll's bootstrap over MPI and is of the type ``NcclCommunicator`` takes, and without
a driver every entry point refuses with mpicoll's error on every rank. The next API
change of CuPy fails here instead of in a user's job. tests/fake_cupy.py, the stand-in
the other GPU tests run on, is checked against the same API.

Needs ``pip install cupy-cuda12x nvidia-nccl-cu12`` (the ``gpu_api`` extra); skipped
without them unless ``MPICOLL_REQUIRE_GPU_API=1`` (as scripts/test.sh sets), which makes
a missing CuPy an error. Run in one process and under mpiexec (``-m mpi``).
"""

from __future__ import annotations

import os
import re
import warnings

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import arrays, cuda
from mpicoll.backends.nccl_native import (
    NCCL_AVG,
    NCCL_DTYPES,
    NCCL_MAX,
    NCCL_MIN,
    NCCL_PROD,
    NCCL_SUM,
)
from mpicoll.transport import nccl as nccl_transport

pytestmark = pytest.mark.gpu_api

try:
    import cupy
    from cupy.cuda import nccl
except ImportError as exc:
    if os.environ.get("MPICOLL_REQUIRE_GPU_API") == "1":
        raise ImportError(f"MPICOLL_REQUIRE_GPU_API=1 but CuPy/NCCL do not import: {exc}") from exc
    pytest.skip(f"CuPy or its NCCL is not installed ({exc}): pip install "
                "cupy-cuda12x nvidia-nccl-cu12", allow_module_level=True)

MAJOR = nccl_transport.cupy_major()
NO_DEVICE = arrays.cuda_problem(cupy)  # "" where a GPU is there


def signature(method) -> list[str]:
    """A Cython method's parameter names, from the signature CuPy embeds in its docstring
    ("NcclCommunicator.send(self, intptr_t sendbuf, size_t count, ...)")."""
    first = (method.__doc__ or "").strip().splitlines()[0]
    inside = re.search(r"\((.*)\)", first).group(1)
    names = [p.split("=")[0].strip().split()[-1] for p in inside.split(",") if p.strip()]
    return [n for n in names if n != "self"]


# ---- the versions mpicoll supports ---------------------------------------------------------


def test_cupy_is_a_supported_version():
    assert MAJOR in (13, 14), f"CuPy {cupy.__version__}: mpicoll supports CuPy 13 and 14"
    assert nccl.available, "CuPy's NCCL binding did not load (pip install nvidia-nccl-cu12)"
    assert nccl.get_version() >= 21000, "NCCL < 2.10 has no bfloat16 (type 9)"


# ---- every attribute mpicoll uses ------------------------------------------------------------

USED = {
    "cupy": ["ndarray", "empty", "zeros", "asarray", "ascontiguousarray", "may_share_memory",
             "from_dlpack", "__version__"],
    "cupy.ndarray": ["get", "set", "view", "reshape", "take", "tobytes", "copy", "data",
                     "flags", "nbytes", "dtype", "shape", "size", "__cuda_array_interface__",
                     "__dlpack__", "__dlpack_device__", "__array_ufunc__",
                     "__array_function__"],
    "cupy.cuda": ["get_current_stream", "alloc_pinned_memory", "Stream", "Event", "Device",
                  "runtime", "driver"],
    "cupy.cuda.runtime": ["getDeviceCount", "getDevice", "runtimeGetVersion",
                          "getDeviceProperties", "CUDARuntimeError"],
    "cupy.cuda.Stream": ["synchronize", "__enter__", "__exit__", "record", "wait_event", "use"],
    "cupy.cuda.Event": ["record", "synchronize", "done"],
    "cupy.cuda.Device": ["use", "id", "pci_bus_id", "synchronize", "__enter__"],
    "cupy.cuda.nccl": ["available", "get_version", "get_unique_id", "groupStart", "groupEnd",
                       "NcclCommunicator", "NcclError"],
    "cupy.cuda.nccl.NcclCommunicator": ["send", "recv", "allReduce", "reduce", "broadcast",
                                        "allGather", "reduceScatter", "destroy", "abort"],
}


def _resolve(path: str):
    obj = cupy
    for part in path.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("where", USED)
def test_every_attribute_mpicoll_uses_exists(where):
    obj = _resolve(where)
    missing = [name for name in USED[where] if not hasattr(obj, name)]
    assert not missing, f"{where} has no {missing} (CuPy {cupy.__version__})"


def test_the_null_stream_has_a_pointer():
    assert cupy.cuda.Stream.null.ptr == 0


def _device_less_streams(module):
    """The streams CuPy says belong to no device (``device_id == -1``: the stream of
    whichever device is current), and one made for device 3."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ExternalStream, CuPy 14
        external = module.cuda.ExternalStream(0)
        external_on_3 = module.cuda.ExternalStream(0, 3)
    stream = module.cuda.Stream
    return {"Stream.null": stream.null, "Stream.ptds": stream.ptds,
            "Stream(null=True)": stream(null=True), "ExternalStream(ptr)": external}, \
        external_on_3


def test_default_and_external_streams_say_device_minus_1():
    """What ``cuda.stream_device`` relies on: these streams carry ``device_id`` -1, never
    a device to pass to ``Device()``; a stream made with a device keeps it."""
    device_less, on_3 = _device_less_streams(cupy)
    assert {name: s.device_id for name, s in device_less.items()} == dict.fromkeys(device_less, -1)
    assert on_3.device_id == 3
    assert cupy.cuda.Stream.ptds.ptr == cupy.cuda.runtime.streamPerThread
    assert signature(cupy.cuda.get_current_stream) == ["device_id"]
    if not NO_DEVICE:  # the current stream of a thread that set none: Stream.null (or ptds)
        assert cupy.cuda.get_current_stream().device_id == -1
        assert cuda.stream_device(cupy.cuda.Stream.null) == cupy.cuda.runtime.getDevice()


def test_the_stand_in_streams_say_what_cupys_say():
    from fake_cupy import make_module

    fake = make_module(api=MAJOR)
    real, real_on_3 = _device_less_streams(cupy)
    stand_in, stand_in_on_3 = _device_less_streams(fake)
    assert {n: s.device_id for n, s in stand_in.items()} == {n: s.device_id for n, s in real.items()}
    assert {n: s.ptr for n, s in stand_in.items()} == {n: s.ptr for n, s in real.items()}
    assert stand_in_on_3.device_id == real_on_3.device_id
    assert fake.cuda.get_current_stream().device_id == -1  # Stream.null, as CuPy's


# NCCL's methods as native_nccl.py and transport/nccl.py call them, positionally
NCCL_CALLS = {
    "send": ["sendbuf", "count", "datatype", "peer", "stream"],
    "recv": ["recvbuf", "count", "datatype", "peer", "stream"],
    "allReduce": ["sendbuf", "recvbuf", "count", "datatype", "op", "stream"],
    "reduce": ["sendbuf", "recvbuf", "count", "datatype", "op", "root", "stream"],
    "broadcast": ["sendbuff", "recvbuff", "count", "datatype", "root", "stream"],
    "allGather": ["sendbuf", "recvbuf", "count", "datatype", "stream"],
    "reduceScatter": ["sendbuf", "recvbuf", "recvcount", "datatype", "op", "stream"],
    "destroy": [],
    "abort": [],
}


@pytest.mark.parametrize("method", NCCL_CALLS)
def test_nccl_methods_take_what_mpicoll_passes(method):
    assert signature(getattr(nccl.NcclCommunicator, method)) == NCCL_CALLS[method]


@pytest.mark.parametrize("method", NCCL_CALLS)
def test_the_stand_in_declares_cupys_nccl_signatures(method):
    """The stand-in's NCCL methods embed this CuPy's C signatures (count types included),
    which ``transport.nccl.count_limit`` reads."""
    from fake_cupy import make_module

    fake = make_module(api=MAJOR).cuda.nccl.NcclCommunicator

    def first(m):
        return (getattr(m, method).__doc__ or "").strip().splitlines()[0]

    assert first(fake) == first(nccl.NcclCommunicator)


def test_count_limits_are_this_cupys():
    """CuPy 14 takes every NCCL count as size_t; CuPy 13 its broadcast's as a C int
    (cupy#8562), which mpicoll refuses above 2**31 - 1 elements instead of overflowing."""
    limits = {m: nccl_transport.count_limit(nccl.NcclCommunicator, m)
              for m in NCCL_CALLS if m not in ("destroy", "abort")}
    if MAJOR >= 14:
        assert limits == dict.fromkeys(limits, 2**64 - 1)
    else:
        assert limits["broadcast"] in (2**31 - 1, 2**64 - 1)
        assert {m: v for m, v in limits.items() if m != "broadcast"} == \
            dict.fromkeys(set(limits) - {"broadcast"}, 2**64 - 1)


def test_copies_and_streams_take_what_mpicoll_passes():
    assert signature(cupy.ndarray.get)[:3] == ["stream", "order", "out"]
    assert signature(cupy.ndarray.set) == ["arr", "stream"]
    assert signature(cupy.ndarray.take) == ["indices", "axis", "out"]
    assert signature(cupy.cuda.Event.record) == ["stream"]
    first = nccl.NcclCommunicator.__doc__.strip().splitlines()[0]
    expected = "bytes commId" if MAJOR >= 14 else "tuple commId"
    assert f"int ndev, {expected}, int rank" in first, first


# ---- NCCL's numbers -----------------------------------------------------------------------


def test_nccl_type_table_is_nccls():
    names = {np.int8: "NCCL_INT8", np.uint8: "NCCL_UINT8", np.int32: "NCCL_INT32",
             np.uint32: "NCCL_UINT32", np.int64: "NCCL_INT64", np.uint64: "NCCL_UINT64",
             np.float16: "NCCL_FLOAT16", np.float32: "NCCL_FLOAT32",
             np.float64: "NCCL_FLOAT64", ml_dtypes.bfloat16: "NCCL_BFLOAT16"}
    assert {np.dtype(t): getattr(nccl, n) for t, n in names.items()} == NCCL_DTYPES
    assert nccl_transport.NCCL_UINT8 == nccl.NCCL_UINT8


def test_nccl_op_table_is_nccls():
    assert (NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG) == (
        nccl.NCCL_SUM, nccl.NCCL_PROD, nccl.NCCL_MAX, nccl.NCCL_MIN, nccl.NCCL_AVG)


def test_bfloat16_is_cupys_where_cupy_has_it():
    """CuPy 14 takes bfloat16 from ml_dtypes (with NumPy >= 2.1.2): the dtype mpicoll's
    tables name is that one."""
    if MAJOR < 14:
        pytest.skip("CuPy 13 has no bfloat16")
    from cupy._core import dlpack

    assert np.lib.NumpyVersion(np.__version__) < "2.1.2" or \
        np.dtype(dlpack.bfloat16) == np.dtype(ml_dtypes.bfloat16)


# ---- the unique id -----------------------------------------------------------------------


def test_unique_id_round_trip_is_what_ncclcommunicator_takes():
    """NCCL's id made here, as raw bytes and back in this CuPy's form: the constructor
    accepts its type and length (it then fails only for want of a GPU)."""
    made = nccl.get_unique_id()
    assert isinstance(made, bytes if MAJOR >= 14 else tuple) and len(made) == 128
    raw = nccl_transport.unique_id_bytes(made)
    commid = nccl_transport.unique_id_for_cupy(raw, MAJOR)
    assert commid == made
    if not NO_DEVICE:
        pytest.skip("a GPU is here: tests/test_gpu.py starts NCCL for real")
    with pytest.raises(nccl.NcclError):  # not TypeError, ValueError or OverflowError
        nccl.NcclCommunicator(1, commid, 0)
    with pytest.raises(TypeError):  # what mpicoll passed before: the wrong type
        nccl.NcclCommunicator(1, tuple(raw) if MAJOR >= 14 else raw, 0)


@pytest.mark.mpi
def test_unique_id_over_mpi_reaches_every_rank_and_ncclcommunicator(comm_world):
    """mpicoll's bootstrap: rank 0's id, broadcast, equal everywhere, of the type the
    constructor takes on every rank."""
    from mpi4py import MPI

    raw = nccl_transport.unique_id_over_mpi(comm_world)
    assert isinstance(raw, bytes) and len(raw) == 128
    assert comm_world.allgather(raw) == [raw] * comm_world.Get_size()
    if not NO_DEVICE:
        pytest.skip("a GPU is here: tests/test_gpu.py starts NCCL for real")
    commid = nccl_transport.unique_id_for_cupy(raw, MAJOR)
    with pytest.raises(nccl.NcclError):
        nccl.NcclCommunicator(comm_world.Get_size(), commid, comm_world.Get_rank())
    MPI.COMM_WORLD.Barrier()


@pytest.fixture
def comm_world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


# ---- without a GPU: mpicoll's error on every rank ----------------------------------------


def _without_gpu():
    if not NO_DEVICE:
        pytest.skip("a GPU is here")


@pytest.mark.mpi
def test_nccl_backend_without_a_gpu_refuses_on_every_rank():
    from mpi4py import MPI

    _without_gpu()
    with pytest.raises(mpicoll.InvalidArgumentError, match="no usable CUDA driver"):
        mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
    MPI.COMM_WORLD.Barrier()  # every rank got here: none is left waiting


@pytest.mark.mpi
def test_select_device_without_a_gpu_refuses_on_every_rank():
    from mpi4py import MPI

    _without_gpu()
    with pytest.raises(mpicoll.InvalidArgumentError, match=r"rank.* 0.*no usable CUDA driver"):
        cuda.select_device(MPI.COMM_WORLD)
    with pytest.raises(mpicoll.InvalidArgumentError, match="no usable CUDA driver"):
        cuda.require_nccl(MPI.COMM_WORLD)
    cuda.require_nccl()  # the software alone is there


def test_device_buffers_without_a_gpu_are_refused_clearly():
    _without_gpu()
    with pytest.raises(mpicoll.InvalidArgumentError, match="needs a CUDA device"):
        arrays.device_like()
    from dlpack_capsule import KDL_CUDA, Tensor

    with pytest.raises(mpicoll.InvalidArgumentError, match="needs a CUDA device"):
        arrays.as_array(Tensor(np.zeros(3), KDL_CUDA), "x")


def test_host_collectives_run_with_cupy_installed_and_no_gpu():
    from mpicoll.local import run_local

    out = run_local(2, lambda comm: comm.all_reduce(np.ones(3), algorithm="ring"))
    assert [o.tolist() for o in out] == [[2.0] * 3] * 2


# ---- the stand-in speaks the same API --------------------------------------------------------


def test_the_stand_in_has_every_attribute_checked_here():
    from fake_cupy import make_module

    fake = make_module(api=MAJOR)
    for where in ("cupy.cuda.nccl", "cupy.cuda.nccl.NcclCommunicator", "cupy.cuda.Event",
                  "cupy.cuda.Device"):
        obj = fake
        for part in where.split(".")[1:]:
            obj = getattr(obj, part)
        missing = [name for name in USED[where] if not hasattr(obj, name)]
        assert not missing, f"the stand-in's {where} lacks {missing}"
    assert type(fake.cuda.nccl.get_unique_id()) is type(nccl.get_unique_id())
    wrong = tuple(range(128)) if MAJOR >= 14 else bytes(128)
    with pytest.raises(TypeError):
        fake.cuda.nccl.NcclCommunicator(1, wrong, 0)
