"""CuPy arrays on the MPI backend (staged, and CUDA-aware where MPI is) and the NCCL backend.

Run under mpiexec like the MPI tests. Where CuPy or a CUDA device is missing every test
here skips, with the reason; on a GPU machine set ``MPICOLL_REQUIRE_GPU=1`` and they
fail instead, so a broken driver or CuPy cannot pass as "no GPU". On one GPU, MPI ranks
share it; NCCL runs at as many ranks as there are GPUs (NCCL refuses two ranks on one
GPU, and so does mpicoll, first).
"""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from reference import (
    BARRIER_CASES,
    DTYPE_OPS,
    REDUCING,
    ROOTED,
    _dtype,
    check_every_dtype_and_op_on_device,
    check_late_barrier,
    run_case,
    run_v_case,
    v_cases,
)

import mpicoll

pytestmark = [pytest.mark.mpi, pytest.mark.gpu]
REQUIRED = os.environ.get("MPICOLL_REQUIRE_GPU") == "1"


def _no_gpu(reason: str) -> None:
    """Skip this module, or fail it where MPICOLL_REQUIRE_GPU=1 says a GPU must be there."""
    if REQUIRED:
        raise RuntimeError(f"MPICOLL_REQUIRE_GPU=1, but {reason}")
    pytest.skip(reason, allow_module_level=True)


try:
    import cupy
except ImportError as exc:
    _no_gpu(f"CuPy does not import ({exc}): no GPU tests")
try:
    DEVICES = cupy.cuda.runtime.getDeviceCount()
except Exception as exc:  # noqa: BLE001 - CuPy without a driver or a device
    DEVICES = 0
    _no_gpu(f"no CUDA device visible ({type(exc).__name__}: {exc})")
if DEVICES == 0:
    _no_gpu("no CUDA device visible")

from mpi4py import MPI  # noqa: E402

from mpicoll import cuda  # noqa: E402

cuda.select_device(MPI.COMM_WORLD)  # one GPU per local rank, shared when they are fewer
# CuPy's dtypes: no long double; bfloat16 from CuPy 14 on (ml_dtypes', with NumPy >= 2.1.2)
BFLOAT16_ON_GPU = (int(cupy.__version__.split(".")[0]) >= 14
                   and np.lib.NumpyVersion(np.__version__) >= "2.1.2")
CUPY_DTYPES = [d for d, _ in DTYPE_OPS if _dtype(d).name not in ("float128", "complex256")
               and (BFLOAT16_ON_GPU or _dtype(d).name != "bfloat16")]
SHAPES = ((0,), (1,), (17,), (1001,), (2, 3))


def _communicator(backend: str, cuda_aware: str | None = None) -> mpicoll.Communicator:
    saved = os.environ.get("MPICOLL_CUDA_AWARE")
    if cuda_aware is not None:
        os.environ["MPICOLL_CUDA_AWARE"] = cuda_aware
    try:
        comm = mpicoll.Communicator(MPI.COMM_WORLD, backend=backend)
        if backend == "mpi":  # decide now, while the variable is set
            comm.transport.direct()
        return comm
    finally:
        if saved is None:
            os.environ.pop("MPICOLL_CUDA_AWARE", None)
        else:
            os.environ["MPICOLL_CUDA_AWARE"] = saved


def _paths() -> list[str]:
    paths = ["mpi-staged"]
    if cuda.query_mpi_cuda_support():
        paths.append("mpi-cuda-aware")
    if MPI.COMM_WORLD.Get_size() <= DEVICES:
        paths.append("nccl")
    return paths


@pytest.fixture(scope="module", params=_paths())
def comm(request):
    if request.param == "nccl":
        return _communicator("nccl")
    return _communicator("mpi", "1" if request.param == "mpi-cuda-aware" else "0")


CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier"
         for a in mpicoll.algorithms(c, "nccl")]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_every_algorithm_on_the_gpu(comm, collective, algorithm):
    for shape in SHAPES:
        for root in range(comm.size) if collective in ROOTED else (0,):
            run_case(comm, collective, algorithm, shape, "f4", "sum", root, device=True)


@pytest.mark.parametrize("algorithm", mpicoll.algorithms("all_reduce", "nccl"))
def test_every_dtype_and_op(comm, algorithm):
    """bfloat16 included (CuPy 14): NCCL's type 9 on NCCL's own collectives; MPI has no
    bfloat16 reduction, so the MPI library's own refuses it (not tested here)."""
    cases = [(d, o) for d, o in DTYPE_OPS if d in CUPY_DTYPES and (
        algorithm != "native" or comm.backend == "nccl" or _dtype(d).name != "bfloat16")
             # ncclAvg on bfloat16 is within bfloat16's rounding: test_bfloat16_* checks it
             and not (_dtype(d).name == "bfloat16" and o == "avg" and algorithm == "native")]
    check_every_dtype_and_op_on_device(comm, algorithm, cases, cupy, 33)


def test_bfloat16_on_the_gpu(comm):
    if not BFLOAT16_ON_GPU:
        pytest.skip(f"CuPy {cupy.__version__} with NumPy {np.__version__}: no bfloat16")
    x = cupy.asarray(np.full(7, comm.rank + 1, ml_dtypes.bfloat16))
    algorithm = "native" if comm.backend == "nccl" else "ring"
    got = comm.all_reduce(x, algorithm=algorithm)
    assert got.dtype == ml_dtypes.bfloat16
    assert got.get().astype(np.float32).tolist() == [comm.size * (comm.size + 1) / 2] * 7
    mean = comm.all_reduce(x, "avg", algorithm=algorithm)  # within bfloat16's rounding
    np.testing.assert_allclose(mean.get().astype(np.float32), (comm.size + 1) / 2, rtol=8e-3)


@pytest.mark.parametrize("collective", REDUCING)
def test_reductions_in_place_and_out(comm, collective):
    x = cupy.arange(comm.size * 6, dtype=cupy.float32).reshape(comm.size, 6) + comm.rank
    expected = sum(np.arange(comm.size * 6, dtype=np.float32).reshape(comm.size, 6) + r
                   for r in range(comm.size))
    if collective == "all_reduce":
        y = x.copy()
        assert comm.all_reduce(y, out=y) is y  # in place: the caller's own array back
        np.testing.assert_array_equal(y.get(), expected)
    elif collective == "reduce":
        out = cupy.empty_like(x) if comm.rank == 0 else None
        got = comm.reduce(x, root=0, out=out)
        assert got is out
        if comm.rank == 0:
            np.testing.assert_array_equal(out.get(), expected)
    elif collective in ("scan", "exscan"):  # in place; exscan's rank 0: None, y untouched
        upto = comm.rank + 1 if collective == "scan" else comm.rank
        y = x.copy()
        got = getattr(comm, collective)(y, out=y)
        assert got is (y if upto else None)
        np.testing.assert_array_equal(y.get(), x.get() if not upto else sum(
            np.arange(comm.size * 6, dtype=np.float32).reshape(comm.size, 6) + r
            for r in range(upto)))
    else:
        out = cupy.empty(6, cupy.float32)
        assert comm.reduce_scatter(x, out=out) is out
        np.testing.assert_array_equal(out.get(), expected[comm.rank])


@pytest.mark.parametrize("collective,algorithm", [
    (c, a) for c, a in v_cases("nccl") if c != "reduce_scatter" or a != "native"] +
    [("reduce_scatter", "native")])
def test_v_variants(comm, collective, algorithm):
    for root in range(comm.size) if collective in ("gather_v", "scatter_v") else (0,):
        run_v_case(comm, collective, algorithm, (3,), "f8", root=root, device=True)


def test_a_stream_of_the_callers(comm):
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.full(1 << 16, comm.rank + 1, cupy.float64)
    for algorithm in ("native", "ring", "recursive_doubling"):
        got = comm.all_reduce(x, algorithm=algorithm, stream=stream)
        stream.synchronize()
        assert float(got[0]) == float(got[-1]) == comm.size * (comm.size + 1) / 2


def test_point_to_point_on_the_gpu(comm):
    """A ring of sendrecv, then a batch with both neighbours (on nccl: NCCL communicators
    per pair of ranks and tag; at one rank, messages to itself in one group)."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    mine = cupy.arange(1 << 12, dtype=cupy.float32) + 100 * comm.rank
    out = cupy.zeros_like(mine)
    assert comm.sendrecv(mine, right, out, left, 3, 3) == left
    assert float(out[1]) == 1 + 100 * left
    from_left, from_right = cupy.zeros_like(mine), cupy.zeros_like(mine)
    requests = comm.batch_isend_irecv([
        mpicoll.P2POp("isend", mine, right, tag=1), mpicoll.P2POp("isend", mine, left, tag=2),
        mpicoll.P2POp("irecv", from_left, left, tag=1),
        mpicoll.P2POp("irecv", from_right, right, tag=2)])
    assert [r.wait() for r in requests] == [None, None, left, right]
    assert float(from_left[-1]) == (1 << 12) - 1 + 100 * left
    assert float(from_right[-1]) == (1 << 12) - 1 + 100 * right


@pytest.mark.parametrize("kind", ["null", "ptds", "current"])
def test_async_on_a_stream_of_device_minus_1(comm, kind):
    """CuPy's default streams have device_id -1: an async call on one runs on the
    current device (not Device(-1), which CUDA refuses)."""
    stream = {"null": cupy.cuda.Stream.null, "ptds": cupy.cuda.Stream.ptds,
              "current": None}[kind]
    x = cupy.full(1 << 10, comm.rank + 1, cupy.float64)
    got = comm.all_reduce(x, algorithm="ring", stream=stream, async_op=True).wait()
    cupy.cuda.Device().synchronize()
    assert got.device.id == cupy.cuda.runtime.getDevice()
    assert float(got[0]) == float(got[-1]) == comm.size * (comm.size + 1) / 2


@pytest.mark.parametrize("algorithm,options", BARRIER_CASES,
                         ids=[f"{a}{o.get('radix', '')}" for a, o in BARRIER_CASES])
def test_barrier_waits_for_a_late_rank(comm, algorithm, options):
    if algorithm not in mpicoll.algorithms("barrier", comm.backend):
        pytest.skip(f"no {algorithm} barrier on {comm.backend}")
    check_late_barrier(comm, algorithm, options)


def test_mismatched_libraries_are_refused(comm):
    with pytest.raises(mpicoll.InvalidArgumentError, match="out:"):
        comm.all_reduce(cupy.zeros(4), out=np.zeros(4))
    if comm.backend == "nccl":
        with pytest.raises(mpicoll.InvalidArgumentError, match="moves GPU arrays"):
            comm.all_reduce(np.zeros(4))


def test_staging_memory_is_kept_not_reallocated():
    comm = _communicator("mpi", "0")
    x = cupy.ones(1 << 18, cupy.float32)
    sequence = ("ring", "native", "rabenseifner", "recursive_doubling", "ring_pipelined")

    def pinned():
        return [b.__array_interface__["data"][0] for b in comm.transport._staging._blocks]

    for algorithm in sequence:  # the first round may grow the pinned memory
        comm.all_reduce(x, algorithm=algorithm)
    comm.all_reduce(x, algorithm="ring")  # a reset merges what grew
    before = pinned()
    for _round in range(3):
        for algorithm in sequence:
            comm.all_reduce(x, algorithm=algorithm)
    assert pinned() == before and len(before) == 1


def test_torch_cuda_tensors_come_back_as_torch(comm):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = torch.full((8,), float(comm.rank + 1), device=f"cuda:{cupy.cuda.Device().id}")
    got = comm.all_reduce(x, "max")
    assert isinstance(got, torch.Tensor) and got.is_cuda
    assert got.cpu().tolist() == [float(comm.size)] * 8
