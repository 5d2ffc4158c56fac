"""The GPU code paths, run on a NumPy stand-in for CuPy (tests/fake_cupy.py).

Where there is no GPU, this is how the device paths are checked: arrays whose type says
"cupy" go through library-aware allocation, the MPI transport's staging through pinned
memory (and its CUDA-aware path, whose stream synchronization is counted), the staged
native collectives, and come back as "CuPy" arrays. tests/test_gpu.py runs the same
cases on a real GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from fake_cupy import installed
from reference import (
    DTYPE_OPS,
    ROOTED,
    _dtype,
    check_every_dtype_and_op_on_device,
    run_case,
    run_v_case,
    v_cases,
)

import mpicoll
from mpicoll.algorithms import all_to_all
from mpicoll.transport.local import run_local

SHAPES = ((0,), (1,), (5,), (37,), (2, 3))
HOST_DTYPES = [d for d, _ in DTYPE_OPS]


@pytest.fixture(scope="module", autouse=True)
def fake_cupy():
    with installed() as cupy:
        yield cupy
    all_to_all._bruck_plan.cache_clear()  # it holds index arrays of the stand-in


def _all_roots(comm, collective, algorithm, shape, dtype="f4", op="sum"):
    for root in range(comm.size) if collective in ROOTED else (0,):
        run_case(comm, collective, algorithm, shape, dtype, op, root, device=True)


@pytest.mark.parametrize("size", (1, 2, 3, 5))
@pytest.mark.parametrize("collective,algorithm", [
    (c, a) for c in mpicoll.COLLECTIVES if c != "barrier" for a in mpicoll.algorithms(c, "local")])
def test_local_every_algorithm_on_device_arrays(collective, algorithm, size):
    def body(comm):
        for shape in SHAPES:
            _all_roots(comm, collective, algorithm, shape)

    run_local(size, body, timeout=20)


# ---- the MPI transport: staged, and CUDA-aware ------------------------------------------


def _communicator(cuda_aware: str) -> mpicoll.Communicator:
    from mpi4py import MPI

    saved = os.environ.get("MPICOLL_CUDA_AWARE")
    os.environ["MPICOLL_CUDA_AWARE"] = cuda_aware
    try:
        comm = mpicoll.Communicator(MPI.COMM_WORLD)
        comm._transport.direct()
        return comm
    finally:
        if saved is None:
            os.environ.pop("MPICOLL_CUDA_AWARE")
        else:
            os.environ["MPICOLL_CUDA_AWARE"] = saved


@pytest.fixture(scope="module", params=["staged", "cuda-aware", "nccl"])
def comm(request):
    if request.param == "nccl":  # the stand-in's NCCL runs its calls as MPI's
        from mpi4py import MPI

        return mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
    return _communicator("1" if request.param == "cuda-aware" else "0")


MPI_CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier" for a in mpicoll.algorithms(c)]


@pytest.mark.mpi
@pytest.mark.parametrize("collective,algorithm", MPI_CASES)
def test_mpi_every_algorithm_on_device_arrays(comm, collective, algorithm):
    for shape in SHAPES:
        _all_roots(comm, collective, algorithm, shape)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "ring", "rabenseifner"])
def test_mpi_every_dtype_and_op_on_device(comm, algorithm, fake_cupy):
    cases = [(d, o) for d, o in DTYPE_OPS if algorithm != "native"
             or _dtype(d).name not in ("bfloat16", "float128", "complex256")]
    check_every_dtype_and_op_on_device(comm, algorithm, cases, fake_cupy, 9)


@pytest.mark.mpi
@pytest.mark.parametrize("collective,algorithm", v_cases("mpi"))
def test_mpi_v_variants_on_device(comm, collective, algorithm):
    for root in range(comm.size) if collective in ("gather_v", "scatter_v") else (0,):
        run_v_case(comm, collective, algorithm, (3,), "f8", root=root, device=True)


@pytest.mark.mpi
def test_mpi_in_place_and_out_on_device(comm, fake_cupy):
    x = fake_cupy.asarray(np.arange(8.0) + comm.rank)
    expected = sum(np.arange(8.0) + r for r in range(comm.size))
    for algorithm in ("native", "ring", "recursive_doubling"):
        y = x.copy()
        assert comm.all_reduce(y, out=y, algorithm=algorithm) is y
        np.testing.assert_array_equal(y.get(), expected)
    with pytest.raises(mpicoll.InvalidArgumentError, match="out: a numpy array for a cupy input"):
        comm.all_reduce(x, out=np.empty(8))


@pytest.mark.mpi
def test_nccl_backend_barrier_averages_and_refusals(comm, fake_cupy):
    if comm.backend != "nccl":
        pytest.skip("NCCL only")
    for algorithm in mpicoll.algorithms("barrier", "nccl"):
        comm.barrier(algorithm=algorithm)
    x = fake_cupy.asarray(np.full(4, float(comm.rank)))
    for algorithm in ("native", "ring"):  # NCCL's avg, and a sum divided by p: the same
        got = comm.all_reduce(x, "avg", algorithm=algorithm)
        np.testing.assert_array_equal(got.get(), np.full(4, (comm.size - 1) / 2))
    with pytest.raises(mpicoll.InvalidArgumentError, match="moves GPU arrays"):
        comm.all_reduce(np.zeros(4))
    with pytest.raises(mpicoll.UnsupportedOpError, match="NCCL has no 'bxor'"):
        comm.all_reduce(fake_cupy.asarray(np.zeros(4, np.int32)), "bxor", algorithm="native")
    assert comm.all_reduce(fake_cupy.asarray(np.zeros(4, np.int32)), "bxor",
                           algorithm="ring").get().tolist() == [0] * 4
    # scatter and broadcast at ranks that pass no buffer: results on the GPU
    rows = fake_cupy.asarray(np.arange(comm.size * 2.0).reshape(comm.size, 2))
    got = comm.scatter(rows if comm.rank == 0 else None, algorithm="native")
    assert isinstance(got, fake_cupy.ndarray) and got.get().tolist() == [2.0 * comm.rank,
                                                                         2.0 * comm.rank + 1]


@pytest.mark.mpi
def test_async_op_on_device_arrays(comm, fake_cupy):
    """async_op=True on GPU arrays: the progress thread on MPI (staged or CUDA-aware), an
    event on the stream on NCCL; results come back as device arrays."""
    x = fake_cupy.asarray(np.arange(6.0) + comm.rank)
    works = [comm.all_reduce(x, algorithm=a, async_op=True) for a in ("ring", "native")]
    gathered = comm.all_gather(x, async_op=True)
    expected = sum(np.arange(6.0) + r for r in range(comm.size))
    for work in works[::-1]:
        got = work.wait()
        assert isinstance(got, fake_cupy.ndarray) and np.array_equal(got.get(), expected)
    assert gathered.wait().get().shape == (comm.size, 6)
    if comm.backend == "nccl":
        assert works[0]._event is not None and works[0]._event.recorded == 1
    bad = comm.all_reduce(x, algorithm="no_such_algorithm", async_op=True)
    with pytest.raises(mpicoll.InvalidArgumentError):
        bad.wait()


@pytest.mark.mpi
def test_cuda_aware_path_synchronizes_the_stream_before_messages(fake_cupy):
    comm = _communicator("1")
    stream = fake_cupy.cuda.get_current_stream()
    x = fake_cupy.asarray(np.ones(64))
    before = stream.synchronized
    comm.all_reduce(x, algorithm="ring")
    comm.all_reduce(x, algorithm="native")
    if comm.size > 1:
        assert stream.synchronized - before >= 2 * (comm.size - 1) + 1


@pytest.mark.mpi
def test_staged_memory_is_reused_call_after_call(fake_cupy):
    comm = _communicator("0")
    x = fake_cupy.asarray(np.ones(1 << 15, np.float32))
    sequence = ("ring", "native", "rabenseifner", "recursive_doubling", "ring_pipelined")
    staging = comm._transport._staging

    def pinned():
        return [b.__array_interface__["data"][0] for b in staging._blocks]

    for algorithm in sequence:
        comm.all_reduce(x, algorithm=algorithm, segment_bytes=4096) \
            if algorithm == "ring_pipelined" else comm.all_reduce(x, algorithm=algorithm)
    comm.all_reduce(x, algorithm="ring")  # the reset merges what grew into one block
    before = pinned()
    for _round in range(3):
        for algorithm in sequence:
            comm.all_reduce(x, algorithm=algorithm)
    assert pinned() == before and len(before) == 1


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["mpi", "nccl"])
def test_bench_on_gpu_buffers(backend, tmp_path_factory, capsys):
    """``python -m mpicoll.bench all_reduce --buffer cupy`` (and --backend nccl): every
    algorithm row, the library's row, no wrong result, and the GPU in the header."""
    from mpi4py import MPI

    from mpicoll.bench import main

    path = MPI.COMM_WORLD.bcast(str(tmp_path_factory.mktemp("bench")) + "/rows.json")
    status = main(["all_reduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1",
                   "--buffer", "cupy", "--backend", backend, "--json", path])
    assert status == 0
    MPI.COMM_WORLD.Barrier()
    import json

    with open(path) as f:
        report = json.load(f)
    library = "nccl_library" if backend == "nccl" else "mpi_library"
    names = {row["algorithm"] for row in report["rows"]}
    assert names == {library, "auto", *mpicoll.algorithms("all_reduce", backend)}
    assert all(row["wrong"] == 0 and row["buffer"] == "cupy" for row in report["rows"])
    assert report["header"]["gpu"] == "NumPy stand-in"
    if MPI.COMM_WORLD.Get_rank() == 0:
        out = capsys.readouterr().out
        assert "stream synchronized after every call" in out and f"({library})" in out
