"""The GPU code paths, run on a stand-in for CuPy 14 and NCCL (tests/fake_cupy.py).

Where there is no GPU, this is how the device paths are checked. The stand-in fails where
CuPy fails (no NumPy conversion, per-thread devices and streams, work that lands when
its stream gets there, NCCL's byte ids and its refusal of two ranks on one GPU), so these
tests see what a GPU would: library-aware allocation, the MPI transport's staging
through pinned memory and its CUDA-aware path, the staged native collectives, NCCL's
start on every rank or a refusal on every rank, and results that come back as "CuPy"
arrays. tests/test_gpu.py runs the same cases on a real GPU.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import weakref

import ml_dtypes
import numpy as np
import pytest
from dlpack_capsule import KDL_CUDA, Tensor
from fake_cupy import installed
from reference import (
    BARRIER_CASES,
    DTYPE_OPS,
    ROOTED,
    _dtype,
    check_every_dtype_and_op_on_device,
    check_late_barrier,
    make_input,
    reduced,
    run_case,
    run_v_case,
    v_cases,
)

import mpicoll
from mpicoll import cuda
from mpicoll.algorithms import all_to_all
from mpicoll.local import run_local

SHAPES = ((0,), (1,), (5,), (37,), (2, 3))
# CuPy's dtypes: no long double; bfloat16 from CuPy 14 on (the stand-in plays 14)
CUPY_DTYPES = [d for d, _ in DTYPE_OPS if _dtype(d).name not in ("float128", "complex256")]


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
        comm.transport.direct()
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

        comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")  # rank k: device k
        # Bruck's index arrays are cached per (p, rank), not per device: those made on
        # device 0 by the MPI cases cannot index arrays on device k
        all_to_all._bruck_plan.cache_clear()
        return comm
    return _communicator("1" if request.param == "cuda-aware" else "0")


MPI_CASES = [(c, a) for c in mpicoll.COLLECTIVES if c != "barrier" for a in mpicoll.algorithms(c)]


@pytest.mark.mpi
@pytest.mark.parametrize("collective,algorithm", MPI_CASES)
def test_mpi_every_algorithm_on_device_arrays(comm, collective, algorithm):
    if algorithm not in mpicoll.algorithms(collective, comm.backend):  # NCCL has no scan
        with pytest.raises(mpicoll.InvalidArgumentError, match=f"'nccl' has no {collective};"):
            _all_roots(comm, collective, algorithm, (3,))
        return
    for shape in SHAPES:
        _all_roots(comm, collective, algorithm, shape)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "ring", "rabenseifner"])
def test_mpi_every_dtype_and_op_on_device(comm, algorithm, fake_cupy):
    cases = [(d, o) for d, o in DTYPE_OPS if d in CUPY_DTYPES and (
        algorithm != "native" or comm.backend == "nccl" or _dtype(d).name != "bfloat16")
             # ncclAvg on bfloat16 is within bfloat16's rounding: test_bfloat16_* checks it
             and not (_dtype(d).name == "bfloat16" and o == "avg" and algorithm == "native")]
    check_every_dtype_and_op_on_device(comm, algorithm, cases, fake_cupy, 9)


@pytest.mark.mpi
@pytest.mark.parametrize("collective,algorithm", v_cases("mpi"))
def test_mpi_v_variants_on_device(comm, collective, algorithm):
    for root in range(comm.size) if collective in ("gather_v", "scatter_v") else (0,):
        run_v_case(comm, collective, algorithm, (3,), "f8", root=root, device=True)


@pytest.mark.mpi
@pytest.mark.parametrize("collective", [c for c in mpicoll.COLLECTIVES if c != "barrier"])
def test_mpi_plans_on_device_arrays_and_a_stream(comm, collective, fake_cupy):
    """A plan (``<collective>_init``) on device arrays, started on a stream of its own, on
    every backend: each start reads the refilled input and is right. (A plan on device
    arrays or with a stream takes the whole path at every start, as mpicoll.plan says:
    its decisions serve host arrays.)"""
    spec = mpicoll.spec.SPECS[collective]
    p, r = comm.size, comm.rank
    shape = (p, 3) if spec.input_rows else (4,)
    x = fake_cupy.zeros(shape, np.float64)
    given = {**({"op": "sum"} if spec.reduces else {}), **({"root": 0} if spec.rooted else {})}
    receiver = spec.input_at_root_only and r != 0
    stream = fake_cupy.cuda.Stream()
    plan = getattr(comm, f"{collective}_init")(None if receiver else x, stream=stream, **given)
    try:
        for step in range(3):
            inputs = [make_input(j, shape, "f8") + step for j in range(p)]
            x[...] = fake_cupy.asarray(inputs[r])
            got = plan()
            want = spec.reference(inputs, r, 0, lambda some: reduced(some, "sum"))
            if want is None:
                assert got is None
            else:
                np.testing.assert_array_equal(got.get(), want)
    finally:
        plan.free()


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
@pytest.mark.parametrize("algorithm,options", BARRIER_CASES,
                         ids=[f"{a}{o.get('radix', '')}" for a, o in BARRIER_CASES])
def test_barrier_waits_for_a_late_rank(comm, algorithm, options):
    check_late_barrier(comm, algorithm, options, delay=0.1)


@pytest.mark.mpi
def test_nccl_backend_barrier_averages_and_refusals(comm, fake_cupy):
    if comm.backend != "nccl":
        pytest.skip("NCCL only")
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
    # an op NCCL lacks: auto runs mpicoll's own algorithm over NCCL (never native), as
    # for a dtype NCCL lacks
    ints = fake_cupy.asarray(np.full(4, 1 << comm.rank, np.int32))
    every = (1 << comm.size) - 1
    for op, want in (("bor", every), ("band", every if comm.size == 1 else 0),
                     ("bxor", every), ("lor", 1), ("land", 1),
                     (mpicoll.Op(np.bitwise_or, commutative=True), every)):
        assert comm.auto_algorithm("all_reduce", 16, op, "int32") != "native"
        assert comm.all_reduce(ints, op).get().tolist() == [want] * 4
        rows = fake_cupy.asarray(np.full((comm.size, 4), 1 << comm.rank, np.int32))
        assert comm.reduce_scatter(rows, op).get().tolist() == [want] * 4
        got = comm.reduce(ints, op, root=0)
        if comm.rank == 0:
            assert got.get().tolist() == [want] * 4
    # NCCL has no scan: auto runs ours over NCCL (MPICH's recursive doubling)
    for collective in ("scan", "exscan"):
        assert comm.auto_algorithm(collective, 8, "sum", "f8") == "recursive_doubling"
        got = getattr(comm, collective)(x, "sum")
        assert (got is None) == (collective == "exscan" and comm.rank == 0)
        if got is not None:
            upto = comm.rank + 1 if collective == "scan" else comm.rank
            assert got.get().tolist() == [sum(range(upto))] * 4
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
def test_bucketer_on_device_gradients(comm, fake_cupy):
    """The Bucketer on device gradients on every backend: its agreement at construction
    and its exchange at each wait are host values, which go over NCCL's MPI side (a real
    H200 showed them refused as host arrays on backend 'nccl'); one rank's refused add is
    known to every rank at wait, on NCCL too."""
    base = [fake_cupy.asarray(np.arange(n, dtype=np.float32)) for n in (10, 3000, 5, 0, 700)]
    buckets = mpicoll.Bucketer(comm, base, cap_bytes=4096, op="avg")
    try:
        assert len(buckets.bucket_bytes) > 1
        for round_ in range(2):
            for i in reversed(range(len(base))):
                buckets.add(i, base[i] * (comm.rank + 1 + round_))
            for got, b in zip(buckets.wait(), base, strict=True):
                assert isinstance(got, fake_cupy.ndarray)
                np.testing.assert_allclose(got.get(), b.get() * ((comm.size + 1) / 2 + round_))
        for i in reversed(range(len(base))):  # rank 0 gives one array of another shape
            wrong = comm.rank == 0 and i == 1
            if wrong:
                with pytest.raises(mpicoll.InvalidArgumentError):
                    buckets.add(i, fake_cupy.asarray(np.zeros(4, np.float32)))
            else:
                buckets.add(i, base[i])
        with pytest.raises(mpicoll.InvalidArgumentError if comm.rank == 0 else mpicoll.RemoteError):
            buckets.wait()
    finally:
        buckets.free()
    for i in range(len(base)):  # freed: refused as mpicoll's, on NCCL too (not MPI's error)
        with pytest.raises(mpicoll.InvalidArgumentError):
            buckets.add(i, base[i])
    with pytest.raises(mpicoll.InvalidArgumentError, match="freed"):
        buckets.wait()


def test_a_device_bucket_starts_after_the_copies_other_streams_queued(fake_cupy, monkeypatch):
    """Each add copies its gradient into the bucket on the adder's current stream; the
    bucket's all_reduce starts on the last adder's. Where an earlier add's stream is
    another (another thread's, a user's stream), the start's stream waits for that
    copy's event: it read slots whose copies could still be queued. One stream's own
    copies are in order: no wait."""
    cp = fake_cupy
    comm = _communicator("0")
    waits: list = []
    real = cp.cuda.Stream.wait_event
    monkeypatch.setattr(cp.cuda.Stream, "wait_event",
                        lambda self, event: (waits.append((self, event)), real(self, event))[1])
    base = [cp.asarray(np.arange(4, dtype=np.float32) + i) for i in range(3)]
    buckets = mpicoll.Bucketer(comm, base, cap_bytes=1 << 20)  # one bucket
    try:
        side, main = cp.cuda.Stream(), cp.cuda.Stream()
        worker = threading.Thread(target=lambda: [buckets.add(i, base[i]) for i in (0, 1)])
        with side:  # (a new thread's current stream is its own, not this one)
            worker.start()
            worker.join()
            buckets.add(2, base[2])  # this thread, on another stream: the bucket starts
        got = buckets.wait()
        # the start (on side, in this thread) waited for arrays 0 and 1 (the other
        # thread's stream), not for array 2 (its own stream's)
        assert len(waits) == 2 and all(stream is side for stream, _ in waits), waits
        for a, b in zip(got, base, strict=True):
            np.testing.assert_array_equal(a.get(), b.get() * comm.size)
        waits.clear()
        with main:  # one thread, one stream: nothing to wait for
            for i in range(3):
                buckets.add(i, base[i])
            buckets.wait()
        assert waits == []
    finally:
        buckets.free()
        comm.free()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["native", "ring", "recursive_doubling", "auto"])
def test_a_device_all_reduce_is_decided_once_and_right_every_call(comm, fake_cupy, algorithm):
    """A default all_reduce of a CuPy array keeps its decision (keyed by its GPU too) and
    runs it on each call's buffers: a new result, out=, in place, avg; rank 0 takes the
    whole path at every other call (its decisions cleared), so a decided call and the
    whole path meet (on NCCL the MPI side's tag moves alike: the Bucketer's agreement
    after them would otherwise hang); out= of another shape is refused as before."""
    comm._decisions.clear()
    p, r = comm.size, comm.rank
    total = p * (p + 1) / 2
    for step in range(4):
        if r == 0 and step % 2:
            comm._decisions.clear()
        x = fake_cupy.asarray(np.full((3, 5), r + 1.0 + step, np.float32))
        want = total + p * step
        np.testing.assert_array_equal(comm.all_reduce(x, algorithm=algorithm).get(), want)
        out = fake_cupy.empty_like(x)
        assert comm.all_reduce(x, algorithm=algorithm, out=out) is out
        np.testing.assert_array_equal(out.get(), want)
        mean = comm.all_reduce(x, "avg", algorithm=algorithm, out=out)
        np.testing.assert_allclose(mean.get(), want / p, rtol=1e-6)
        assert comm.all_reduce(x, algorithm=algorithm, out=x) is x
        np.testing.assert_array_equal(x.get(), want)
    assert any(k[:2] == ("all_reduce", "cuda") and v.call is not None
               for k, v in comm._decisions.items()), "no device decision was kept"
    other = fake_cupy.empty((5, 3) if r == 1 else (3, 5), np.float32)
    with pytest.raises(mpicoll.InvalidArgumentError, match="out:") if r == 1 else \
            contextlib.nullcontext():
        comm.all_reduce(x, algorithm=algorithm, out=other)
    ones = fake_cupy.asarray(np.full((3, 5), r + 1.0, np.float32))
    for _ in range(2):  # (rank 1 took part, then raised: every rank's next call is right)
        comm.all_reduce(ones, algorithm=algorithm, out=out)
        np.testing.assert_array_equal(out.get(), total)
    buckets = mpicoll.Bucketer(comm, [x], op="sum")  # (agreed over NCCL's MPI side)
    buckets.add(0, fake_cupy.asarray(np.ones((3, 5), np.float32)))
    np.testing.assert_array_equal(buckets.wait()[0].get(), p)
    buckets.free()


@pytest.mark.mpi
def test_a_device_binding_is_checked_once_and_keeps_no_array_alive(comm, fake_cupy,
                                                                   monkeypatch):
    """``comm.all_reduce(x, out=y)`` in a loop on the same CuPy arrays: the buffers are
    checked at the first decided call only, held by weak references only (a dropped
    out= is freed), and a current GPU changed since is refused as the whole path
    refuses it, on every rank before any message; the next call runs."""
    p, r = comm.size, comm.rank
    total = p * (p + 1) / 2
    x = fake_cupy.asarray(np.full(6, r + 1.0, np.float32))
    out = fake_cupy.empty_like(x)
    comm._decisions.clear()
    comm.all_reduce(x, out=out)  # (the whole path: the decision is kept)
    decision = next(v for k, v in comm._decisions.items() if k[:2] == ("all_reduce", "cuda"))
    binds = []
    bind = decision.bind
    monkeypatch.setattr(decision, "bind", lambda *args: binds.append(1) or bind(*args))
    for _ in range(3):
        assert comm.all_reduce(x, out=out) is out
        np.testing.assert_array_equal(out.get(), total)
    assert len(binds) == 1, "the same buffers were checked again"
    other = fake_cupy.empty_like(x)
    assert comm.all_reduce(x, out=other) is other and len(binds) == 2
    np.testing.assert_array_equal(other.get(), total)
    gone = weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None, "the decision keeps a dropped out= alive"
    comm.all_reduce(x, out=out)  # (bound to x and out again)
    out.shape = (2, 3)  # (CuPy sets a shape in place: the binding's out is another shape)
    with pytest.raises(mpicoll.InvalidArgumentError, match="out:"):
        comm.all_reduce(x, out=out)
    out.shape = (6,)
    assert comm.all_reduce(x, out=out) is out
    np.testing.assert_array_equal(out.get(), total)
    here = x.data.device_id
    elsewhere = (here + 1) % fake_cupy.cuda.runtime.getDeviceCount()
    with fake_cupy.cuda.Device(elsewhere):
        with pytest.raises(mpicoll.MpicollError,
                           match=f"on GPU {here}, not the current GPU {elsewhere}"):
            comm.all_reduce(x, out=out)
    assert comm.all_reduce(x, out=x) is x
    np.testing.assert_array_equal(x.get(), total)


@pytest.mark.mpi
def test_a_decided_call_never_reads_the_cuda_array_interface(comm, fake_cupy, monkeypatch):
    """CuPy builds ``__cuda_array_interface__`` anew at each read (about 2 us on a GPU's
    host): telling a CuPy array from others asks its type, so a call reads it never (on a
    real H200, ten reads a call made NCCL's native all_reduce 3.6x the direct call)."""
    reads = []
    interface = fake_cupy.ndarray.__cuda_array_interface__  # (the property itself)
    monkeypatch.setattr(fake_cupy.ndarray, "__cuda_array_interface__",
                        property(lambda self: reads.append(1) or interface.fget(self)))
    x = fake_cupy.asarray(np.ones(8, np.float32))
    out = fake_cupy.empty_like(x)
    for algorithm in ("native", "ring"):
        comm.all_reduce(x, algorithm=algorithm, out=out)
        reads.clear()
        comm.all_reduce(x, algorithm=algorithm, out=out)
        assert reads == [], f"{algorithm}: {len(reads)} reads of __cuda_array_interface__"


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
    staging = comm.transport._staging

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


# ---- the defects a NumPy look-alike could not show ---------------------------------------


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["staged", "nccl"])
def test_the_device_workspace_orders_a_call_on_another_stream_after_the_last(
        fake_cupy, monkeypatch, backend):
    """A call returns with its kernels queued on its stream, which may still use the
    device workspace: a later call on another stream that takes from it first waits (on
    the GPU) for an event recorded on the last one; on the same stream it need not."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl") if backend == "nccl" \
        else _communicator("0")
    t = comm.transport
    waits = []
    real = fake_cupy.cuda.Stream.wait_event

    def wait_event(stream, event):
        waits.append((stream.ptr, event._stream.ptr))
        return real(stream, event)

    monkeypatch.setattr(fake_cupy.cuda.Stream, "wait_event", wait_event)
    x = fake_cupy.asarray(np.arange(8.0))
    s1, s2 = fake_cupy.cuda.Stream(non_blocking=True), fake_cupy.cuda.Stream(non_blocking=True)
    for stream, waited in ((s1, []), (s1, []), (s2, [(s2.ptr, s1.ptr)]), (s2, [])):
        waits.clear()
        with stream:
            t.begin(x)
            t.use(x)
            t.take(4, np.float64, like=x)
            t.take(4, np.float64, like=x)  # (once a call)
        assert waits == waited
    comm.free()


@pytest.mark.mpi
def test_the_device_workspace_across_threads_and_gpus(fake_cupy, monkeypatch):
    """Another thread's per-thread default stream (Stream.ptds names each thread's own)
    cannot take an event from here: the device drains instead; a call on another GPU
    (its own arena) orders nothing."""
    comm = _communicator("0")
    t = comm.transport
    drained, waits = [], []
    monkeypatch.setattr(fake_cupy.cuda.runtime, "deviceSynchronize", lambda: drained.append(1))
    real = fake_cupy.cuda.Stream.wait_event
    monkeypatch.setattr(fake_cupy.cuda.Stream, "wait_event",
                        lambda stream, event: waits.append(1) or real(stream, event))
    x = fake_cupy.asarray(np.arange(8.0))
    device = fake_cupy.cuda.Device().id  # (a rank's GPU, current in this thread only)

    def call():
        with fake_cupy.cuda.Device(device), fake_cupy.cuda.Stream.ptds:
            t.begin(x)
            t.use(x)
            t.take(4, np.float64, like=x)

    other = threading.Thread(target=call)
    other.start()
    other.join()
    call()  # (this thread's ptds after the other's)
    assert drained == [1] and waits == []
    with fake_cupy.cuda.Device(1 if device == 0 else 0):
        y = fake_cupy.asarray(np.arange(8.0))
        t.begin(y)
        t.use(y)
        t.take(4, np.float64, like=y)
    assert drained == [1] and waits == []
    comm.free()


@pytest.mark.mpi
def test_staging_is_not_reused_while_another_stream_still_copies_from_it(fake_cupy):
    """A call's last host-to-device copies read pinned memory when their stream gets there:
    the next call, on another stream, must not overwrite it before."""
    comm = _communicator("0")
    first = fake_cupy.cuda.Stream(non_blocking=True)
    second = fake_cupy.cuda.Stream(non_blocking=True)
    x = fake_cupy.asarray(np.full(1 << 12, comm.rank + 1.0))
    y = fake_cupy.asarray(np.full(1 << 12, 100.0 * (comm.rank + 1)))
    a = comm.all_reduce(x, algorithm="ring", stream=first)
    b = comm.all_reduce(y, algorithm="ring", stream=second)
    first.synchronize()
    second.synchronize()
    total = comm.size * (comm.size + 1) / 2
    assert np.all(a.get(stream=first) == total) and np.all(b.get(stream=second) == 100 * total)


@pytest.mark.mpi
def test_a_result_is_ready_only_when_its_stream_gets_there(fake_cupy):
    """The stand-in's own honesty: an NCCL result read from another stream without a
    synchronize is stale, so a missing synchronize in mpicoll shows as a wrong result."""
    if comm_size() < 2:
        pytest.skip("needs a peer")
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
    stream = fake_cupy.cuda.Stream(non_blocking=True)
    x, out = fake_cupy.asarray(np.ones(8)), fake_cupy.zeros(8)
    comm.all_reduce(x, algorithm="native", stream=stream, out=out)
    assert np.all(out.get() == 0)  # read on another stream, without waiting: stale
    stream.synchronize()
    assert np.all(out.get() == comm.size)
    work = comm.all_reduce(x, algorithm="native", stream=stream, async_op=True)
    assert np.all(work.wait().get() == comm.size)  # wait() waits for the event
    comm.free()


def comm_size() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_size()


@pytest.mark.mpi
def test_in_place_all_gather_on_device_arrays(comm, fake_cupy):
    """out= whose row of this rank already is x: no __array_interface__ on a device array."""
    out = fake_cupy.zeros((comm.size, 4))
    mine = out[comm.rank]
    mine[...] = fake_cupy.asarray(np.full(4, comm.rank + 1.0))
    assert comm.all_gather(mine, out=out) is out
    np.testing.assert_array_equal(out.get(), np.repeat(np.arange(1.0, comm.size + 1), 4)
                                  .reshape(comm.size, 4))


@pytest.mark.mpi
def test_user_op_on_a_cuda_aware_native_reduction_is_staged(fake_cupy):
    """MPI runs a user op as a host callback over NumPy views of its buffers (device
    pointers would crash it): device buffers are staged for it through pinned memory even
    where MPI is CUDA-aware, and only for it."""
    comm = _communicator("1")
    x = fake_cupy.asarray(np.arange(5.0) * (comm.rank + 1))
    comm.all_reduce(x, "max", algorithm="native")
    assert comm.transport._staging is None  # a built-in op: the device buffers as they are
    op = mpicoll.Op(np.maximum, name="user_max")
    got = comm.all_reduce(x, op, algorithm="native")
    np.testing.assert_array_equal(got.get(), np.arange(5.0) * comm.size)
    assert comm.transport._staging.capacity > 0  # staged


@pytest.mark.mpi
def test_nccl_refuses_two_ranks_on_one_gpu_on_every_rank(monkeypatch):
    from mpi4py import MPI

    if comm_size() < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("MPICOLL_DEVICE", "0")
    with pytest.raises(mpicoll.InvalidArgumentError,
                       match=r"ranks 0, 1.*shares its GPU.*one GPU per rank"):
        mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")


@pytest.mark.mpi
def test_nccl_with_another_gpu_current_on_one_rank_is_refused_on_every_rank(fake_cupy):
    """NCCL on the stream of a GPU that is not its communicator's fails on that rank
    alone, mid-call, and left the others waiting until the timeout: a call made inside
    ``with cupy.cuda.Device(0)``, or from a new thread (which starts on GPU 0), on the
    rank whose GPU is another, is a refusal of its parameters (in check mode every rank
    raises), before any message; and the next call runs."""
    from mpi4py import MPI

    cp = fake_cupy
    if comm_size() < 2:
        pytest.skip("needs two ranks")
    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl", check=True)  # rank k: GPU k
    last = comm.size - 1
    said = f"the current GPU is 0, not this Communicator's GPU {last}"
    try:
        for algorithm in ("native", "ring"):
            x = cp.ones(4, "f4")
            if comm.rank == last:
                with cp.cuda.Device(0), pytest.raises(mpicoll.InvalidArgumentError, match=said):
                    comm.all_reduce(cp.ones(4, "f4"), algorithm=algorithm)
            else:
                with pytest.raises(mpicoll.RemoteError, match=said):
                    comm.all_reduce(x, algorithm=algorithm)
            assert cp.asnumpy(comm.all_reduce(x, algorithm=algorithm)).tolist() == [comm.size] * 4
        caught: list = []

        def in_a_thread() -> None:
            try:
                comm.barrier()
            except mpicoll.MpicollError as exc:
                caught.append(exc)

        if comm.rank == last:
            worker = threading.Thread(target=in_a_thread)
            worker.start()
            worker.join()
        else:
            in_a_thread()
        assert len(caught) == 1 and said in str(caught[0]), caught
        with cp.cuda.Device(0) if comm.rank == last else contextlib.nullcontext():
            if comm.rank == last:  # a plan made there: refused at init, on every rank
                with pytest.raises(mpicoll.InvalidArgumentError, match=said):
                    comm.all_reduce_init(cp.ones(4, "f4"))
            else:
                with pytest.raises(mpicoll.RemoteError, match=said):
                    comm.all_reduce_init(cp.ones(4, "f4"))
        comm.barrier()
        if comm.rank == last:  # a send from there: refused before NCCL sees it
            with cp.cuda.Device(0), pytest.raises(mpicoll.InvalidArgumentError, match=said):
                comm.send(cp.ones(2, "f4"), 0)
        comm.barrier()
        # host-only calls run from there (monitored_barrier: NCCL's MPI side alone)
        if comm.rank == last:
            worker = threading.Thread(target=comm.monitored_barrier)
            worker.start()
            worker.join()
        else:
            comm.monitored_barrier()
        # a message into a strided out, waited for from a new thread: copied on out's GPU
        if comm.rank == 0:
            comm.send(cp.arange(3, dtype="f4"), last)
        elif comm.rank == last:
            out = cp.zeros((3, 2), "f4")
            request = comm.irecv(out[:, 0], 0)
            got: list = []
            worker = threading.Thread(target=lambda: got.append(request.wait()))
            worker.start()
            worker.join()
            assert got == [0] and cp.asnumpy(out[:, 0]).tolist() == [0.0, 1.0, 2.0], got
        comm.barrier()
        assert cp.asnumpy(comm.all_reduce(cp.ones(4, "f4"))).tolist() == [comm.size] * 4
    finally:
        comm.free()


@pytest.mark.mpi
def test_nccl_without_a_driver_on_one_rank_fails_on_every_rank(fake_cupy, monkeypatch):
    from mpi4py import MPI

    last = comm_size() - 1
    if MPI.COMM_WORLD.Get_rank() == last:
        def no_driver():
            raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is "
                               "insufficient for CUDA runtime version")

        monkeypatch.setattr(fake_cupy.cuda.runtime, "getDeviceCount", no_driver)
    with pytest.raises(mpicoll.InvalidArgumentError,
                       match=rf"rank {last}: no usable CUDA driver"):
        mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")


@pytest.mark.mpi
def test_rank_0_failing_to_make_the_unique_id_fails_every_rank(fake_cupy, monkeypatch):
    from mpi4py import MPI

    def fails():
        raise fake_cupy.cuda.nccl.NcclError(2, "NCCL_ERROR_SYSTEM_ERROR: no network")

    monkeypatch.setattr(fake_cupy.cuda.nccl, "get_unique_id", fails)
    with pytest.raises(mpicoll.InvalidArgumentError,
                       match="rank 0 could not create NCCL's unique id"):
        mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")


@pytest.mark.mpi
def test_nccl_starts_with_cupy_13_tuple_ids():
    from mpi4py import MPI

    with installed(api=13):
        comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
        x = comm.all_reduce(__import__("cupy").asarray(np.ones(3)), algorithm="native")
        assert x.get().tolist() == [comm.size] * 3
        comm.free()


@pytest.mark.mpi
def test_nccl_transport_free_destroys_once():
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
    transport = comm.transport
    nccl = transport.nccl
    comm.free()
    assert transport.nccl is None and nccl._comm is None  # the stand-in's MPI comm freed
    transport.free()  # again: nothing to do


@pytest.mark.mpi
def test_bfloat16_that_cupy_13_cannot_import_is_refused_on_every_rank():
    """CuPy <= 13 raises NotImplementedError for a bfloat16 CUDA tensor: the root refuses
    with mpicoll's error and the others learn it, instead of waiting."""
    from mpi4py import MPI

    with installed(api=13):
        comm = _communicator("0")
        tensor = Tensor(np.ones(4, ml_dtypes.bfloat16), KDL_CUDA)
        for call in (lambda root: comm.broadcast(tensor if comm.rank == root else None, root),
                     lambda root: comm.scatter(
                         Tensor(np.ones((comm.size, 2), ml_dtypes.bfloat16), KDL_CUDA)
                         if comm.rank == root else None, root)):
            if comm.rank == 0:
                with pytest.raises(mpicoll.UnsupportedDtypeError, match="CuPy >= 14"):
                    call(0)
            else:
                with pytest.raises(mpicoll.RemoteError, match="root 0 refused"):
                    call(0)
        MPI.COMM_WORLD.Barrier()


@pytest.mark.mpi
def test_bfloat16_on_nccl_native_goes_as_nccl_type_9(fake_cupy):
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
    calls = []
    real = type(comm.transport.nccl).allReduce

    def spy(self, send, recv, count, datatype, op, stream):
        calls.append(datatype)
        return real(self, send, recv, count, datatype, op, stream)

    type(comm.transport.nccl).allReduce = spy
    try:
        x = fake_cupy.asarray(np.full(6, comm.rank + 1, ml_dtypes.bfloat16))
        got = comm.all_reduce(x, algorithm="native")
    finally:
        type(comm.transport.nccl).allReduce = real
    assert calls == [9] and got.dtype == ml_dtypes.bfloat16
    assert got.get().astype(np.float32).tolist() == [comm.size * (comm.size + 1) / 2] * 6
    mean = comm.all_reduce(x, "avg", algorithm="native")  # ncclAvg: within bfloat16's rounding
    np.testing.assert_allclose(mean.get().astype(np.float32), (comm.size + 1) / 2, rtol=8e-3)
    comm.free()


def test_a_progress_thread_runs_on_the_callers_device_and_stream(fake_cupy):
    """CUDA's current device and stream are the thread's: captured at submit time on the
    caller's thread, entered around the call on the progress thread."""
    with fake_cupy.cuda.Device(3):
        stream = fake_cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = fake_cupy.zeros(4)
            enter = cuda.capture_device_and_stream(None, (x,))
    seen = {}

    def progress():
        seen["before"] = fake_cupy.cuda.Device().id
        try:
            np.add(x, 1, out=x)  # a kernel on device 3's array from device 0
        except ValueError as exc:
            seen["refused"] = str(exc)
        with enter():
            seen["inside"] = (fake_cupy.cuda.Device().id, fake_cupy.cuda.get_current_stream())
            np.add(x, 1, out=x)
        seen["after"] = fake_cupy.cuda.Device().id

    thread = threading.Thread(target=progress)
    thread.start()
    thread.join()
    assert seen["before"] == 0 and "different from the current device" in seen["refused"]
    assert seen["inside"] == (3, stream) and seen["after"] == 0
    with fake_cupy.cuda.Device(3):
        assert x.get(stream=stream).tolist() == [1.0] * 4
    assert cuda.capture_device_and_stream(None, (np.zeros(2),))() is not None  # host: no-op


@pytest.mark.mpi
def test_async_op_on_a_device_other_than_0(fake_cupy):
    comm = _communicator("0")
    with fake_cupy.cuda.Device(2):
        stream = fake_cupy.cuda.Stream(non_blocking=True)
        x = fake_cupy.asarray(np.full(5, comm.rank + 1.0))
        work = comm.all_reduce(x, algorithm="ring", stream=stream, async_op=True)
        got = work.wait()
        assert got.device.id == 2
        assert got.get(stream=stream).tolist() == [comm.size * (comm.size + 1) / 2] * 5


@pytest.mark.mpi
@pytest.mark.parametrize("cuda_aware", ["0", "1"])
def test_a_receiver_given_no_array_gets_its_async_result_on_its_own_gpu(fake_cupy, cuda_aware):
    """broadcast(None) and scatter(None) with async_op=True, and a scatter plan's
    start()/wait(), at ranks of GPU 1 and 2: no array told the progress thread which GPU
    (the root's header tells the call it is a GPU call), so it ran on device 0 and its
    null stream: the result on another GPU, and staged, not there yet (garbage)."""
    comm = _communicator(cuda_aware)
    p, root = comm.size, 0
    with fake_cupy.cuda.Device(comm.rank % 3):
        x = fake_cupy.asarray(np.arange(2.0 * p)) if comm.rank == root else None
        rows = fake_cupy.asarray(np.arange(2.0 * p).reshape(p, 2)) if comm.rank == root \
            else None
        plan = comm.scatter_init(rows, root, algorithm="linear")
        for step in range(2):
            got = [comm.broadcast(x, root, algorithm="binomial", async_op=True).wait(),
                   comm.scatter(rows, root, algorithm="linear", async_op=True).wait()]
            plan.start()
            got.append(plan.wait())
            row = [2.0 * comm.rank, 2.0 * comm.rank + 1]
            for result, want in zip(got, (np.arange(2.0 * p), row, row), strict=True):
                assert result.device.id == comm.rank % 3, step
                assert result.get().tolist() == list(want), step
        plan.free()
    comm.free()


def _stream_of_kind(fake_cupy, kind):
    """A stream CuPy gives ``device_id == -1`` (the stream of whichever device is
    current), or None: the current stream, which is ``Stream.null`` where none was set."""
    cuda_ = fake_cupy.cuda
    made = cuda_.Stream(non_blocking=True)
    streams = {"null": cuda_.Stream.null, "ptds": cuda_.Stream.ptds,
               "null-made": cuda_.Stream(null=True), "external": cuda_.ExternalStream(made.ptr),
               "current": None}
    return streams[kind]


DEVICE_LESS_STREAMS = ("null", "ptds", "null-made", "external", "current")


@pytest.mark.parametrize("kind", DEVICE_LESS_STREAMS)
def test_a_stream_of_device_minus_1_runs_on_the_current_device(fake_cupy, kind):
    """CuPy's default streams and an ExternalStream without device_id say device -1:
    the progress thread enters the device current at submit time, not Device(-1)."""
    with fake_cupy.cuda.Device(3):
        stream = _stream_of_kind(fake_cupy, kind)
        assert (fake_cupy.cuda.get_current_stream() if stream is None else stream).device_id == -1
        x = fake_cupy.zeros(4)
        enter = cuda.capture_device_and_stream(stream, (x,))
        assert cuda.stream_device(stream) == 3
    seen = {}

    def progress():
        try:
            with enter():
                seen["inside"] = fake_cupy.cuda.Device().id
                np.add(x, 1, out=x)
        except Exception as exc:  # noqa: BLE001 - reported below
            seen["error"] = exc

    thread = threading.Thread(target=progress)
    thread.start()
    thread.join()
    assert seen == {"inside": 3}
    with fake_cupy.cuda.Device(3):
        assert x.get().tolist() == [1.0] * 4


@pytest.mark.mpi
def test_the_progress_thread_waits_for_the_callers_per_thread_stream(fake_cupy, monkeypatch):
    """Stream.ptds is each thread's own default stream: a call run on the progress thread
    under it first waits (an event recorded on the caller's at submit) for what the
    caller's had queued; another stream is the same stream there and needs no event."""
    waits = []
    real = fake_cupy.cuda.Stream.wait_event
    monkeypatch.setattr(fake_cupy.cuda.Stream, "wait_event",
                        lambda stream, event: waits.append(event) or real(stream, event))
    x = fake_cupy.zeros(4)
    for stream, expected in ((fake_cupy.cuda.Stream.ptds, 1),
                             (fake_cupy.cuda.Stream(non_blocking=True), 0),
                             (fake_cupy.cuda.Stream.null, 0)):
        waits.clear()
        enter = cuda.capture_device_and_stream(stream, (x,))

        def progress(enter=enter):
            with enter():
                pass

        thread = threading.Thread(target=progress)
        thread.start()
        thread.join()
        assert len(waits) == expected


@pytest.mark.parametrize("kind", DEVICE_LESS_STREAMS)
def test_async_op_on_a_stream_of_device_minus_1(fake_cupy, kind):
    comm = _communicator("0")
    with fake_cupy.cuda.Device(2):
        stream = _stream_of_kind(fake_cupy, kind)
        x = fake_cupy.asarray(np.full(5, comm.rank + 1.0))
        work = comm.all_reduce(x, algorithm="ring", stream=stream, async_op=True)
        got = work.wait()
        assert got.device.id == 2
        assert got.get(stream=stream).tolist() == [comm.size * (comm.size + 1) / 2] * 5
    comm.free()


def test_bruck_index_arrays_live_on_the_blocks_device(fake_cupy):
    """Bruck's cached plan is per device: blocks on GPU 2 never get GPU 1's indices."""
    for device in (1, 2, 1):
        with fake_cupy.cuda.Device(device):
            x = fake_cupy.asarray(np.arange(8.0))
        steps, arrived = all_to_all._bruck_plan(4, 1, x.device.id)
        assert arrived.device.id == device
        assert all(moving.device.id == device for _, moving in steps)


@pytest.mark.mpi
def test_split_and_new_group_on_the_nccl_backend(fake_cupy):
    """Groups of an NCCL Communicator agree over its MPI side (a bad color raises on every
    rank before any NCCL communicator is made) and get an NCCL communicator of their own,
    over their ranks only."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, backend="nccl")
    with pytest.raises(mpicoll.InvalidArgumentError, match=r"rank\(s\) 0: color"):
        comm.split("red" if comm.rank == 0 else 1)
    sub = comm.split(comm.rank % 2)
    members = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    assert sub.backend == "nccl" and (sub.rank, sub.size) == (members.index(comm.rank),
                                                              len(members))
    got = sub.all_reduce(fake_cupy.asarray(np.full(4, 3.0)), algorithm="native")
    assert np.all(got.get() == 3.0 * len(members))
    first = comm.new_group([0])
    assert (first is None) == (comm.rank != 0)
    if first is not None:
        assert first.size == 1
        first.free()
    sub.free()
    comm.free()


@pytest.mark.mpi
def test_a_cpu_group_of_an_nccl_job(fake_cupy):
    """``dist.new_group(backend="gloo")`` on an NCCL job (torch's CPU side-group for host
    metadata) is a group on the MPI backend, over the same ranks: host arrays go through
    it, as device arrays go through the NCCL groups; destroy_process_group frees both."""
    import mpicoll.dist as dist

    dist.init_process_group("nccl")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        cpu = dist.new_group(backend="gloo")
        assert dist.get_backend() == "nccl" and dist.get_backend(cpu) == "gloo"
        assert dist.get_process_group_ranks(cpu) == list(range(size))
        host = np.full(2, float(rank))
        dist.all_reduce(host, group=cpu)
        assert host.tolist() == [float(sum(range(size)))] * 2
        device = fake_cupy.asarray(np.full(2, 1.0))
        dist.all_reduce(device)
        assert device.get().tolist() == [float(size)] * 2
        last = dist.new_group([size - 1], backend="cpu:gloo")
        assert (last is dist.GroupMember.NON_GROUP_MEMBER) == (rank != size - 1)
        with pytest.raises(mpicoll.InvalidArgumentError, match=rf"rank\(s\) {size - 1}[;:, ]"):
            dist.new_group(backend="ucc" if rank == size - 1 else "gloo")  # every rank raises
        again = dist.new_group(backend="gloo")  # then the next call, as every rank makes it
        assert dist.get_backend(again) == "gloo"  # (as torch: the backend asked for)
    finally:
        dist.destroy_process_group()


@pytest.mark.mpi
def test_a_staged_receive_of_a_shorter_message_leaves_the_rest(fake_cupy):
    """On the mpi backend through pinned host memory, a device receive of a message
    shorter than its buffer copies the message's bytes alone onto the GPU (the rest of
    the buffer as it was, as MPI leaves it) and its status says how many came."""
    comm = _communicator("0")
    try:
        r, p = comm.rank, comm.size
        right, left = (r + 1) % p, (r - 1) % p
        for receive in ("recv", "irecv"):
            out = fake_cupy.asarray(np.full(6, -1.0))
            status = mpicoll.Status()
            request = comm.isend(fake_cupy.asarray(np.full(2, float(r))), right, tag=3)
            if receive == "recv" and p > 1:  # (a blocking receive from itself is refused)
                assert comm.recv(out, left, 3, status=status) == left
            else:
                assert comm.irecv(out, left, 3).wait(status) == left
            request.wait()
            assert status.count(np.float64) == 2
            assert out.get().tolist() == [float(left)] * 2 + [-1.0] * 4
    finally:
        comm.free()


@pytest.mark.mpi
def test_object_collectives_on_an_nccl_job(fake_cupy):
    """torch's *_object collectives on an NCCL job: the pickles travel as GPU bytes (the
    NCCL groups move no host arrays), each rank's objects as on the MPI backend."""
    import mpicoll.dist as dist

    dist.init_process_group("nccl")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        everyone: list = [None] * size
        dist.all_gather_object(everyone, {"rank": rank})
        assert everyone == [{"rank": r} for r in range(size)]
        objects = ["a", 2] if rank == 0 else [None, None]
        dist.broadcast_object_list(objects, src=0)
        assert objects == ["a", 2]
        gathered = [None] * size if rank == 0 else None
        dist.gather_object(rank * 3, gathered, dst=0)
        if rank == 0:
            assert gathered == [r * 3 for r in range(size)]
        out: list = [None]
        dist.scatter_object_list(out, list(range(10, 10 + size)) if rank == 0 else None, src=0)
        assert out == [10 + rank]
    finally:
        dist.destroy_process_group()


def test_a_stream_of_another_gpu_on_one_rank_is_refused_on_every_rank_in_check_mode(fake_cupy):
    """stream= made on GPU 1 while GPU 0 is current, on one rank: a refusal of the call's
    parameters (in check mode every rank raises), not CuPy's error mid-call; the next
    call runs."""
    cp = fake_cupy

    def body(comm):
        x = cp.asarray(np.arange(4.0) + comm.rank)
        if comm.rank == 1:
            with cp.cuda.Device(1):
                stream = cp.cuda.Stream()
        else:
            stream = cp.cuda.Stream()
        with pytest.raises(mpicoll.MpicollError, match="stream: cannot be made current"):
            comm.all_reduce(x, stream=stream)
        return cp.asnumpy(comm.all_reduce(x)).tolist()

    assert run_local(2, body, timeout=10, check=True) == [[1.0, 3.0, 5.0, 7.0]] * 2


def test_an_array_on_another_gpu_is_refused_before_any_message(fake_cupy):
    cp = fake_cupy

    def body(comm):
        with cp.cuda.Device(1):
            elsewhere = cp.ones(3)
        x = elsewhere if comm.rank == 0 else cp.ones(3)
        with pytest.raises(mpicoll.MpicollError, match="on GPU 1, not the current GPU 0"):
            comm.all_reduce(x, algorithm="recursive_doubling")
        with pytest.raises(mpicoll.MpicollError, match="out: on GPU 1"):
            comm.all_reduce(cp.ones(3), out=elsewhere if comm.rank == 1 else cp.ones(3))
        return cp.asnumpy(comm.all_reduce(cp.ones(3))).tolist()

    assert run_local(2, body, timeout=10, check=True) == [[2.0] * 3] * 2


def test_the_workspace_follows_the_current_gpu(fake_cupy):
    """A rank that makes another GPU current between calls gets its workspace there (an
    arena on the first GPU would meet the new GPU's arrays in one kernel)."""
    cp = fake_cupy

    def body(comm):
        got = []
        for device in (0, 1):
            with cp.cuda.Device(device):
                x = cp.asarray(np.arange(8.0) + comm.rank)
                got.append(cp.asnumpy(comm.all_reduce(x, algorithm="recursive_doubling")))
        return [g.tolist() for g in got]

    expected = (2 * np.arange(8.0) + 1).tolist()
    assert run_local(2, body, timeout=10) == [[expected, expected]] * 2


def test_the_workspace_asks_for_the_current_gpu_once_per_call(fake_cupy, monkeypatch):
    """The current GPU is asked when a call starts on device arrays (``use``), not at
    every ``take``; a device take before ``use`` asks for itself; a host take in a
    device call is host memory; and after the caller changes GPU the arena follows."""
    from mpicoll.transport.local import LocalTransport

    cp = fake_cupy
    asked = []
    original = cp.cuda.runtime.getDevice
    monkeypatch.setattr(cp.cuda.runtime, "getDevice", lambda: (asked.append(1), original())[1])
    t = LocalTransport.__new__(LocalTransport)
    mpicoll.transport.Workspace.__init__(t)
    x = cp.zeros(4)
    for call in range(3):  # (the first makes the arena: nothing to ask about)
        t._start_call(None)
        t.use(x)
        pieces = [t.take(16, np.float64) for _ in range(10)]
        assert len(asked) == call and all(type(p) is type(x) for p in pieces)
        assert type(t.take(4, np.float64, like=np.zeros(1))) is np.ndarray  # host memory
        assert len(asked) == call
    t._start_call(None)  # the next call: host until it uses a device array
    assert type(t.take(4, np.float64, like=x)) is type(x) and len(asked) == 3
    with cp.cuda.Device(1):
        t._start_call(None)
        t.use(cp.zeros(4))
        moved = t.take(4, np.float64)
    assert moved.device.id == 1 and len(asked) == 4


def test_a_scatter_receiver_may_give_a_cuda_dlpack_tensor_as_out(fake_cupy):
    def body(comm):
        rows = fake_cupy.asarray(np.arange(2 * comm.size, dtype=np.float32).reshape(comm.size, 2))
        out = Tensor(np.zeros(2, np.float32), KDL_CUDA)
        got = comm.scatter(rows if comm.rank == 0 else None, 0, out=out,
                           algorithm="linear")
        return got is out

    assert run_local(2, body, timeout=10) == [True, True]


@pytest.mark.mpi
@pytest.mark.parametrize("cuda_aware", ["0", "1"])
def test_dist_async_device_outputs_are_filled_on_the_callers_device(fake_cupy, cuda_aware,
                                                                    monkeypatch, capfd):
    """mpicoll.dist's async all_gather into a list of device arrays on device 1, on the MPI
    backend: its outputs are copied from the result on the caller's device and stream at
    wait(), not by the done callback on the progress thread (which runs on device 0: the
    stand-in's kernel on another device's arrays raises, as CuPy's), with no warning,
    whether a later handle was waited for first or not."""
    import warnings

    import mpicoll.dist as dist

    monkeypatch.setenv("MPICOLL_CUDA_AWARE", cuda_aware)
    dist.init_process_group("mpi")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        with fake_cupy.cuda.Device(1), warnings.catch_warnings():
            warnings.simplefilter("error")  # (a callback's failure is a RuntimeWarning)
            rows = [fake_cupy.zeros(2) for _ in range(size)]
            work = dist.all_gather(rows, fake_cupy.asarray(np.full(2, float(rank))),
                                   async_op=True)
            assert dist.all_reduce(np.ones(1), async_op=True).wait() is True
            assert work.wait() is True
            assert [r.get().tolist() for r in rows] == [[float(j)] * 2 for j in range(size)]
            # its future too: the copy made on device 1 and its stream (it raised there,
            # made on the progress thread's device 0)
            rows = [fake_cupy.zeros(2) for _ in range(size)]
            future = dist.all_gather(rows, fake_cupy.asarray(np.full(2, float(rank))),
                                     async_op=True).get_future()
            got = future.wait()
            assert [r.get().tolist() for r in got] == [[float(j)] * 2 for j in range(size)]
            # the list forms that stack the caller's arrays (cupy.stack, as CuPy's)
            out = fake_cupy.zeros(2)
            dist.reduce_scatter(out, [fake_cupy.ones(2) for _ in range(size)])
            assert out.get().tolist() == [float(size)] * 2
    finally:
        dist.destroy_process_group()
    # (on the progress thread a callback's failure is reported on stderr, not warned)
    assert "done callback" not in capfd.readouterr().err
