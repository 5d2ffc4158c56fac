"""Checks and figures that only a real GPU gives (issue 26), run by scripts/gpu_truth.sh.

    python scripts/gpu_truth.py facts       # GPU, driver, CUDA, CuPy, NCCL, MPI, CUDA-awareness
    python scripts/gpu_truth.py staging     # mpicoll's pinned staging copies vs raw cudaMemcpy
    python scripts/gpu_truth.py nccl        # NCCL native all_reduce at 1 rank vs cupy.cuda.nccl
    mpiexec -n N python scripts/gpu_truth.py device   # Bucketer and async on device arrays
    python scripts/gpu_truth.py profile     # cProfile of small calls
    python scripts/gpu_truth.py hostcost    # each piece of a decided NCCL call, host time

Each part prints its own lines and, where it fails, its traceback, and goes on; the exit
status is 1 if any check failed.
"""

# ruff: noqa: B023 - each loop's functions are timed within that iteration
from __future__ import annotations

import statistics
import sys
import time
import traceback

import numpy as np

FAILED: list[str] = []


def part(function):
    def run(*args):
        try:
            function(*args)
        except Exception:  # noqa: BLE001 - report it, go on with the next part
            FAILED.append(function.__name__)
            print(f"FAILED {function.__name__}:", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
    return run


def _seconds(action, repeat: int, sync) -> float:
    """Median over 5 rounds of the time per action, ``repeat`` actions a round."""
    action()
    sync()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeat):
            action()
        sync()
        rounds.append((time.perf_counter() - start) / repeat)
    return statistics.median(rounds)


@part
def facts() -> None:
    import cupy
    import mpi4py
    from mpi4py import MPI

    from mpicoll import cuda

    runtime = cupy.cuda.runtime
    props = runtime.getDeviceProperties(0)
    print(f"GPU: {props['name'].decode()} x{runtime.getDeviceCount()}, "
          f"compute {props['major']}.{props['minor']}, "
          f"{props['totalGlobalMem'] / 2**30:.1f} GiB")
    print(f"driver CUDA {runtime.driverGetVersion()}, runtime CUDA {runtime.runtimeGetVersion()}")
    print(f"CuPy {cupy.__version__}, NumPy {np.__version__}, mpi4py {mpi4py.__version__}")
    print(f"MPI: {MPI.Get_library_version().splitlines()[0]}")
    print(f"MPI CUDA support (MPIX_Query_cuda_support): {cuda.query_mpi_cuda_support()}")
    try:
        from cupy.cuda import nccl
        print(f"NCCL {nccl.get_version()} (through cupy.cuda.nccl)")
    except Exception as exc:  # noqa: BLE001
        print(f"NCCL: does not load ({type(exc).__name__}: {exc})")
    try:
        import torch
        print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}")
    except ImportError:
        print("torch: not installed")


@part
def staging() -> None:
    """The staged path's physical limit: device <-> pinned host copies. mpicoll's own
    (``MPITransport._copy_to_host`` / ``_copy_to_device``, as a staged message makes them)
    against cudaMemcpy between the same device memory and one pinned block."""
    import cupy
    from mpi4py import MPI

    import mpicoll

    comm = mpicoll.Communicator(MPI.COMM_SELF)
    transport = comm.transport
    transport.force_cuda_aware(False)
    runtime = cupy.cuda.runtime
    stream = cupy.cuda.get_current_stream()
    print(f"{'bytes':>11} {'to host GB/s':>13} {'memcpy':>8} {'ratio':>6} "
          f"{'to device GB/s':>15} {'memcpy':>8} {'ratio':>6}")
    for nbytes in (1 << 16, 1 << 20, 16 << 20, 256 << 20):
        buf = cupy.ones(nbytes, cupy.uint8)
        pinned = cupy.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(pinned, np.uint8, nbytes)
        repeat = max(3, min(200, (2 << 30) // nbytes // 4))

        def ours_out():
            transport._pinned().reset()
            transport._copy_to_host(buf)

        def ours_in():
            transport._pinned().reset()
            transport._copy_to_device(host, buf)

        def raw_out():
            runtime.memcpy(host.ctypes.data, buf.data.ptr, nbytes, runtime.memcpyDeviceToHost)

        def raw_in():
            runtime.memcpy(buf.data.ptr, host.ctypes.data, nbytes, runtime.memcpyHostToDevice)

        rates = [nbytes / _seconds(f, repeat, stream.synchronize) / 1e9
                 for f in (ours_out, raw_out, ours_in, raw_in)]
        print(f"{nbytes:>11} {rates[0]:>13.2f} {rates[1]:>8.2f} {rates[0] / rates[1]:>6.2f} "
              f"{rates[2]:>15.2f} {rates[3]:>8.2f} {rates[2] / rates[3]:>6.2f}", flush=True)
    comm.free()


@part
def nccl() -> None:
    """NCCL's own all_reduce at 1 rank: mpicoll's 'native' on the nccl backend against the
    same ncclAllReduce called directly through cupy.cuda.nccl, each call waited for."""
    import cupy
    from cupy.cuda import nccl as cnccl
    from mpi4py import MPI

    import mpicoll

    comm = mpicoll.Communicator(MPI.COMM_SELF, backend="nccl")
    direct = cnccl.NcclCommunicator(1, cnccl.get_unique_id(), 0)
    stream = cupy.cuda.get_current_stream()
    print(f"{'bytes':>11} {'mpicoll us':>11} {'direct us':>10} {'ratio':>6}   (each call then "
          "a stream sync; median of 5 rounds)")
    for nbytes in (8, 1 << 10, 1 << 16, 1 << 20, 16 << 20, 256 << 20):
        x = cupy.ones(nbytes // 4, cupy.float32)
        y = cupy.empty_like(x)
        z = cupy.empty_like(x)
        repeat = max(5, min(500, (4 << 30) // nbytes // 8))

        def ours():
            comm.all_reduce(x, algorithm="native", out=y)
            stream.synchronize()

        def theirs():
            direct.allReduce(x.data.ptr, z.data.ptr, x.size, cnccl.NCCL_FLOAT32, cnccl.NCCL_SUM,
                             stream.ptr)
            stream.synchronize()

        def on_ours():  # the same direct call on mpicoll's own NCCL communicator and y
            comm.transport.nccl.allReduce(x.data.ptr, y.data.ptr, x.size, cnccl.NCCL_FLOAT32,
                                          cnccl.NCCL_SUM, stream.ptr)
            stream.synchronize()

        def ours_queued():  # nccl-tests' way: calls back to back, one sync a round
            comm.all_reduce(x, algorithm="native", out=y)

        def theirs_queued():
            direct.allReduce(x.data.ptr, z.data.ptr, x.size, cnccl.NCCL_FLOAT32, cnccl.NCCL_SUM,
                             stream.ptr)

        t_theirs, t_ours, t_on_ours, t_again, q_theirs, q_ours, q_again = (
            _seconds(f, repeat, stream.synchronize) for f in (
                theirs, ours, on_ours, theirs, theirs_queued, ours_queued, theirs_queued))
        assert bool((y == z).all()), "mpicoll's native all_reduce differs from NCCL's"
        print(f"{nbytes:>11} {t_ours * 1e6:>11.1f} {t_theirs * 1e6:>10.1f} "
              f"{t_ours / t_theirs:>6.3f}   direct on mpicoll's communicator and out: "
              f"{t_on_ours * 1e6:.1f} us; direct again: {t_again * 1e6:.1f} us; back to back "
              f"(one sync a round): mpicoll {q_ours * 1e6:.1f}, direct {q_theirs * 1e6:.1f} "
              f"and {q_again * 1e6:.1f} us, ratio {q_ours / min(q_theirs, q_again):.3f}",
              flush=True)
    comm.free()


@part
def device() -> None:
    """At any number of ranks (MPI backend; and NCCL where every rank has its own GPU):
    the Bucketer on device gradients, and async calls on a non-default stream."""
    import cupy
    from mpi4py import MPI

    import mpicoll
    from mpicoll import cuda

    cuda.select_device(MPI.COMM_WORLD)
    backends = ["mpi"]
    if MPI.COMM_WORLD.Get_size() <= cupy.cuda.runtime.getDeviceCount():
        backends.append("nccl")
    for backend in backends:
        comm = mpicoll.Communicator(MPI.COMM_WORLD, backend=backend)
        rank, size = comm.rank, comm.size
        shapes = [(1000,), (37, 3), (5,), (300_000,), (0,), (64, 64)]
        base = [cupy.arange(int(np.prod(s)), dtype=cupy.float32).reshape(s) for s in shapes]
        buckets = mpicoll.Bucketer(comm, base, cap_bytes=64 << 10, op="avg")
        for round_ in range(3):
            for i in reversed(range(len(base))):  # as backward makes them
                buckets.add(i, base[i] * (rank + 1 + round_))
            got = buckets.wait()
            for g, b in zip(got, base, strict=True):
                assert isinstance(g, cupy.ndarray), type(g)
                np.testing.assert_allclose(g.get(), b.get() * ((size + 1) / 2 + round_),
                                           rtol=1e-6)
        buckets.free()
        print(f"{backend}: Bucketer on {len(base)} device gradients, "
              f"{len(buckets.bucket_bytes)} buckets, 3 rounds: right", flush=True)

        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.full(1 << 20, rank + 1, cupy.float64)
            works = [comm.all_reduce(x, algorithm=a, async_op=True)
                     for a in mpicoll.algorithms("all_reduce", backend)]
            for work in works:
                got = work.wait()
                stream.synchronize()
                assert float(got[0]) == float(got[-1]) == size * (size + 1) / 2
        print(f"{backend}: {len(works)} async all_reduce (every algorithm) on a "
              "non-default stream: right", flush=True)
        comm.free()


@part
def profile() -> None:
    """Where a small call's time goes on a real GPU's host: cProfile of NCCL's native
    all_reduce (1 rank), and of the staged MPI ring (every rank; rank 0 prints)."""
    import cProfile
    import io
    import pstats

    import cupy
    from mpi4py import MPI

    import mpicoll
    from mpicoll import cuda

    cuda.select_device(MPI.COMM_WORLD)
    cases = [("mpi", "ring", 300), ("mpi", "native", 300)]
    if MPI.COMM_WORLD.Get_size() == 1:
        cases.insert(0, ("nccl", "native", 3000))
    for backend, algorithm, repeat in cases:
        comm = mpicoll.Communicator(MPI.COMM_WORLD, backend=backend)
        x = cupy.ones(4, cupy.float32)
        y = cupy.empty_like(x)
        for _ in range(20):
            comm.all_reduce(x, algorithm=algorithm, out=y)
        comm.barrier()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(repeat):
            comm.all_reduce(x, algorithm=algorithm, out=y)
        profiler.disable()
        seconds = (time.perf_counter() - start) / repeat
        if comm.rank == 0:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
            print(f"-- {backend} {algorithm} 16 B at {comm.size} rank(s): "
                  f"{seconds * 1e6:.1f} us a call (profiled)")
            print("\n".join(text.getvalue().splitlines()[4:]), flush=True)
        comm.free()


@part
def hostcost() -> None:
    """What each piece of a decided NCCL all_reduce costs on the host (1 rank, no sync
    per call): the attribute reads of CuPy arrays and the runtime queries a call makes."""
    import timeit

    import cupy
    from cupy.cuda import nccl as cnccl
    from mpi4py import MPI

    import mpicoll
    from mpicoll.buffers.arrays import is_cupy
    from mpicoll.pipeline import decided

    comm = mpicoll.Communicator(MPI.COMM_SELF, backend="nccl")
    direct = cnccl.NcclCommunicator(1, cnccl.get_unique_id(), 0)
    x = cupy.ones(2, cupy.float32)
    y = cupy.empty_like(x)
    stream = cupy.cuda.get_current_stream()
    t = comm.transport
    pieces = {
        "mpicoll all_reduce(x, native, out=y)":
            lambda: comm.all_reduce(x, algorithm="native", out=y),
        "mpicoll all_reduce(x, out=y)": lambda: comm.all_reduce(x, out=y),
        "direct allReduce": lambda: direct.allReduce(
            x.data.ptr, y.data.ptr, 2, cnccl.NCCL_FLOAT32, cnccl.NCCL_SUM, stream.ptr),
        "is_cupy(x)": lambda: is_cupy(x),
        "x.flags.c_contiguous": lambda: x.flags.c_contiguous,
        "x.device.id": lambda: x.device.id,
        "x.shape": lambda: x.shape,
        "x.strides": lambda: x.strides,
        "x.dtype": lambda: x.dtype,
        "x.data.ptr": lambda: x.data.ptr,
        "x.size": lambda: x.size,
        "get_current_stream().ptr": lambda: cupy.cuda.get_current_stream().ptr,
        "runtime.getDevice()": lambda: cupy.cuda.runtime.getDevice(),
        "may_share_memory(y, x)": lambda: cupy.may_share_memory(y, x),
        "decided.key": lambda: decided.key("all_reduce", (x,), {"algorithm": "native",
                                                                "out": y}),
        "transport.begin()": lambda: t.begin(),
        "control.begin()": lambda: comm._backend.control.begin(),
    }
    for name, action in pieces.items():
        n = 3000
        best = min(timeit.repeat(action, number=n, repeat=5)) / n
        stream.synchronize()
        print(f"{name:>40}: {best * 1e6:7.2f} us", flush=True)
    comm.free()


def main() -> int:
    parts = {"facts": facts, "staging": staging, "nccl": nccl, "device": device,
             "profile": profile, "hostcost": hostcost}
    names = sys.argv[1:] or list(parts)
    for name in names:
        print(f"== gpu_truth {name}", flush=True)
        parts[name]()
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
