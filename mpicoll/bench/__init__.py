"""Benchmark: every algorithm of a collective against the MPI library's own, in one run.

    mpiexec -n 2 python -m mpicoll.bench all_reduce -b 8 -e 64M -f 8

Columns follow nccl-tests (size, count, type, redop, root, time, algbw, busbw, #wrong)
with the same bus-bandwidth factors (doc/PERFORMANCE.md of nccl-tests), plus the
algorithm and ``vs_native``: the MPI library's time divided by this algorithm's time
(above 1: faster than the library). Time is per iteration the slowest rank's, then the
median over iterations; iterations are separated by a barrier.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

import mpicoll
from mpicoll import Communicator, model
from mpicoll.algorithms import REGISTRY
from mpicoll.buffers.arrays import empty, to_host, to_torch
from mpicoll.ops import resolve_op
from mpicoll.spec import SPECS

from . import report


@dataclass(frozen=True)
class Record:
    """One collective in the harness: how to size it, call it, and its bus-bandwidth factor.

    ``rows``: the per-rank input has a first dimension of the number of ranks.
    ``per_rank``: the nccl-tests size counts the whole result, of which each rank
    contributes 1/p (all_gather, gather).
    """

    rows: bool
    per_rank: bool
    rooted: bool
    reduces: bool
    busbw_factor: Callable[[int], float]


# every collective but barrier, from its description in mpicoll.spec: nccl-tests' ones
# in its order, then the others (scan, exscan) in the spec's
NCCL_TESTS = ("broadcast", "reduce", "all_reduce", "all_gather", "gather", "reduce_scatter",
              "scatter", "all_to_all")
RECORDS = {name: Record(s.input_rows, s.result_rows and not s.input_rows, s.rooted, s.reduces,
                        s.busbw_factor)
           for name, s in ((n, SPECS[n]) for n in (
               *NCCL_TESTS, *(n for n in SPECS if n not in NCCL_TESTS and n != "barrier")))}


def checked_sizes(parser: argparse.ArgumentParser, minbytes: str, maxbytes: str,
                  factor: float) -> list[int]:
    """The sizes ``-b``, ``-e`` and ``-f`` name, or the parser's one-line refusal."""
    try:
        begin, end = parse_size(minbytes), parse_size(maxbytes)
    except ValueError as exc:
        parser.error(f"-b/-e: {exc}")
    if begin > end:
        parser.error(f"-b {minbytes} is larger than -e {maxbytes}")
    memory = _memory_bytes()
    if memory and end > memory:  # (a buffer no rank could hold: NumPy's MemoryError, or
        # the kernel's OOM killer, after the smaller sizes ran)
        parser.error(f"-e {maxbytes}: larger than this machine's memory "
                     f"({memory / 2**30:.1f} GiB); every rank holds several buffers of it")
    if not 1 < factor < math.inf:  # (nan fails it too)
        parser.error(f"-f {factor:g}: the step factor must be a number above 1")
    # (the estimate first, so that a step factor near 1 never builds a huge list; then
    # the sizes themselves, each step rounded down to whole bytes, which may be more)
    steps = math.log(max(end, 1) / max(begin, 1)) / math.log(factor)
    listed = sizes(begin, end, factor) if steps <= MAX_SIZES else None
    if listed is None or len(listed) > MAX_SIZES:
        count = f"{steps:.0f}" if listed is None else f"{len(listed)}"
        parser.error(f"-f {factor:g}: {count} sizes from -b {minbytes} to -e {maxbytes}; "
                     f"at most {MAX_SIZES}: a larger step factor")
    return listed


MAX_SIZES = 1000  # sizes a sweep may have


def _memory_bytes() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0


def parse_size(text: str) -> int:
    """'64M' -> 67108864; K, M, G are powers of 1024.

    Raises:
        ValueError: not a number of bytes (with an optional K, M or G).
    """
    cleaned = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(cleaned[-1:], 1)
    number = cleaned[:-1] if cleaned[-1:] in ("K", "M", "G") else cleaned
    try:
        size = int(float(number) * scale)
    except (ValueError, OverflowError):  # (inf and nan: OverflowError, ValueError)
        raise ValueError(f"{text!r} is not a size (bytes, with K, M or G)") from None
    if size < 0:
        raise ValueError(f"{text!r}: a size cannot be negative")
    return size


# nccl-tests' -d names, with nccl-tests' meanings (float is float32, not NumPy's float64)
NCCL_TESTS_DTYPES = {
    "int8": "int8", "char": "int8", "uint8": "uint8", "int32": "int32", "int": "int32",
    "uint32": "uint32", "int64": "int64", "uint64": "uint64", "half": "float16",
    "float16": "float16", "float": "float32", "float32": "float32", "double": "float64",
    "float64": "float64", "bfloat16": "bfloat16",
}


def parse_dtype(name: str) -> np.dtype:
    """A dtype from nccl-tests' names (``float`` is float32, ``half`` float16, ``int``
    int32), or any other NumPy dtype name.

    Raises:
        ValueError: not a dtype.
    """
    if name in NCCL_TESTS_DTYPES:
        name = NCCL_TESTS_DTYPES[name]
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        raise ValueError(f"{name!r} is not a dtype; nccl-tests' names: "
                         f"{', '.join(NCCL_TESTS_DTYPES)}, or a NumPy name") from None


def sizes(begin: int, end: int, factor: float) -> list[int]:
    out, size = [], begin
    while size <= end:
        out.append(size)
        grown = size * factor
        nxt = int(grown) if grown <= end else end + 1
        size = nxt if nxt > size else size + 1
    if not out or out[-1] != end:
        out.append(end)
    return out


def on_buffer(x: np.ndarray, buffer: str) -> Any:
    """The benchmark's input in the chosen memory: NumPy, or CuPy on this rank's GPU."""
    if buffer == "numpy":
        return x
    import cupy

    return cupy.asarray(x)


def nccl_size(record: Record, x: Any, p: int) -> tuple[int, int]:
    """nccl-tests' size and count of a call on this rank's input ``x``: the whole
    buffer's bytes (a gather's result, a scatter's rows), and the elements of each rank's
    part (each peer's for all_to_all), as nccl-tests prints them."""
    size = (x.size * p if record.per_rank else x.size) * x.dtype.itemsize
    return size, x.size // p if record.rows else x.size


def make_input(comm: Communicator, collective: str, nbytes: int, dtype: np.dtype,
               op: str) -> np.ndarray:
    """This rank's input for ``nbytes`` of ``collective`` (nccl-tests' meaning of size)."""
    record, p = RECORDS[collective], comm.size
    count = nbytes // dtype.itemsize
    if record.per_rank or record.rows:
        count = count // p * p  # a whole number of elements per rank
    shape = (p, count // p) if record.rows else ((count // p,) if record.per_rank else (count,))
    idx = np.arange(math.prod(shape)).reshape(shape)
    x = ((idx * 7 + comm.rank * 3 + 1) % 5).astype(dtype)
    return (x % 2 + 1).astype(dtype) if op == "prod" else x


def result_shape(collective: str, x: np.ndarray, p: int) -> tuple[int, ...]:
    return SPECS[collective].result_shape(x.shape, p)


def library_call(comm: Communicator, collective: str, x: np.ndarray, op: str,
                 root: int, inplace: bool = False) -> Callable[[], None]:
    """The MPI library's own collective on ready flat buffers: no mpicoll validation,
    no allocation; the baseline of ``vs_native``. ``inplace``: its in-place form where
    the library has one (all_gather and broadcast are in place always)."""
    t, p, record = comm.transport, comm.size, RECORDS[collective]
    fn, src, is_root = comm.native_collective(collective), x.reshape(-1), comm.rank == root
    opd = resolve_op(op, x.dtype) if record.reduces else None
    dst = empty(math.prod(result_shape(collective, x, p)), x.dtype, like=x)
    if comm.backend == "nccl" and collective == "all_reduce":
        # cupy.cuda.nccl itself: the NcclCommunicator's allReduce on ready pointers
        from mpicoll.backends.nccl_native import nccl_op

        datatype, nccl_reduce, parts = nccl_op(opd, x.dtype)
        nccl, send, recv, n = t.nccl, src.data.ptr, dst.data.ptr, src.size * parts

        def direct(keep: tuple = (src, dst)) -> None:  # keep: the memory behind the pointers
            nccl.allReduce(send, recv, n, datatype, nccl_reduce, t.stream_ptr())

        direct.prepare = _check_prepared(dst, src, None)  # type: ignore[attr-defined]
        return direct
    spec = SPECS[collective]
    bounds = spec.bounds(x.shape, p)
    if inplace and collective in ("all_reduce", "scan", "exscan", "reduce"):
        src = src.copy()  # the result over it (MPI_IN_PLACE: the native functions give it
        dst = src         # where dst is src)
    elif inplace and collective == "all_to_all" and comm.backend == "mpi" and \
            type(src) is np.ndarray:
        from mpi4py import MPI

        buf, alltoall = src.copy(), t.comm.Alltoall

        def in_place() -> None:
            alltoall(MPI.IN_PLACE, buf)

        in_place.prepare = lambda: buf  # type: ignore[attr-defined]  # (its input: as made)
        return in_place
    if spec.result_at_root_only and not is_root:
        dst = None
    if spec.input_at_root_only and not is_root:
        src = None
    invoke = spec.invoke
    # avg: MPI has none; the library's sum, divided here as its caller would divide it
    # (by the ranks combined: exscan's rank 0 has no result)
    ranks = spec.combined(comm.rank, p) if opd is not None and opd.average and \
        fn not in comm._backend.averages_itself and dst is not None else 0

    def call(result: Any = dst) -> None:
        invoke(fn, t, src, result, bounds, opd, root)
        if ranks:
            result /= ranks

    own = None  # where the library's form takes this rank's input inside its result
    if spec.input_in_result:  # (all_gather: its row)
        own = slice(bounds[comm.rank], bounds[comm.rank + 1])
    elif collective == "broadcast" and is_root:  # (the root's buffer is its input)
        own = slice(None)
    call.prepare = _check_prepared(dst, src, own)  # type: ignore[attr-defined]
    return call


def _check_prepared(dst: Any, src: Any, own: slice | None) -> Callable[[], Any]:
    """Before the one run of a library call whose result is checked: its result buffer
    poisoned (see ``poison``), with this rank's input in its place where the library's
    form takes it there; gives the buffer (None: no result on this rank). An in-place
    form's buffer is its input: left as it is."""
    def prepare() -> Any:
        if dst is None or dst is src:
            return dst
        dst.fill(poison(dst.dtype))
        if own is not None:
            dst[own] = src
        return dst

    return prepare


INPLACE = report.INPLACE


class Call:
    """One call of ``collective`` through mpicoll, on buffers made once: ``run(algorithm)``.

    In place (``inplace=True``, for the collectives in INPLACE) the result overwrites the
    input, so ``reset()`` puts the input back before a call whose result is checked.
    ``reset()`` also fills the result buffer with a value no result holds (as nccl-tests
    clears its receive buffers before a check), so an algorithm that leaves some of it
    unwritten is counted wrong, never passed by the previous row's right values.
    """

    def __init__(self, comm: Communicator, collective: str, x: np.ndarray, op: str,
                 root: int, inplace: bool = False) -> None:
        self.comm, self.collective, self.x, self.op, self.root = comm, collective, x, op, root
        self.inplace = inplace and collective in INPLACE
        record, p, is_root = RECORDS[collective], comm.size, comm.rank == root
        fn, init = getattr(comm, collective), getattr(comm, f"{collective}_init")
        self._plans: dict[str, Any] = {}
        self._result: Any = None  # the buffer a call writes its result into (reset())
        if collective == "broadcast":  # always in place: the root's buffer, others' receive
            self.buf = x.copy()
            self._result = None if is_root else self.buf
            self._run = lambda algo: comm.broadcast(self.buf, root, algorithm=algo)
            self._init = lambda algo: comm.broadcast_init(self.buf, root, algorithm=algo)
            return
        if self.inplace:
            self.buf = (empty((p, *x.shape), x.dtype, like=x) if collective == "all_gather"
                        else x.copy())
            mine = self.buf[comm.rank] if collective == "all_gather" else self.buf
            out = self.buf if (is_root or not record.rooted) else None
            self._result = out
            if record.reduces:
                args = (mine, op, root) if record.rooted else (mine, op)
            else:
                args = (mine,)
            self._run = lambda algo: fn(*args, algorithm=algo, out=out)
            self._init = lambda algo: init(*args, algorithm=algo, out=out)
            return
        self.buf = None
        out = self._result = empty(result_shape(collective, x, p), x.dtype, like=x)
        if collective == "scatter":
            self._run = lambda algo: comm.scatter(x, root, algorithm=algo, out=out)
            self._init = lambda algo: comm.scatter_init(x, root, algorithm=algo, out=out)
            return
        out = self._result = out if is_root or not record.rooted else None
        if record.reduces:
            args = (x, op, root) if record.rooted else (x, op)
        else:
            args = (x, root) if record.rooted else (x,)
        self._run = lambda algo: fn(*args, algorithm=algo, out=out)
        self._init = lambda algo: init(*args, algorithm=algo, out=out)

    def run_plan(self, algorithm: str) -> np.ndarray | None:
        """The same call through a persistent plan (``<collective>_init``), made at its
        first run and started by ``plan()`` from then on."""
        plan = self._plans.get(algorithm)
        if plan is None:
            plan = self._plans[algorithm] = self._init(algorithm)
        return plan()

    def reset(self) -> None:
        if self._result is not None:
            self._result.fill(poison(self._result.dtype))
        if self.buf is None or self.collective == "broadcast":
            return
        if self.collective == "all_gather":
            self.buf[self.comm.rank] = self.x
        else:
            self.buf[...] = self.x

    def run(self, algorithm: str) -> np.ndarray | None:
        return self._run(algorithm)


def _library_result(library: Callable[[], None], reference: Any) -> Any:
    """The result of one run of the library's own collective (``library_call``), as the
    reference holds it (None where this rank gets none, as mpicoll's call gives)."""
    result = library.prepare()  # type: ignore[attr-defined]
    library()
    if result is None or reference is None:  # (exscan's rank 0: MPI's is undefined)
        return None
    return result.reshape(reference.shape) if result.size == reference.size else result


def poison(dtype: np.dtype) -> Any:
    """A value of ``dtype`` that no checked result holds (the inputs are small whole
    numbers): NaN where the dtype has one, else the integers' far end, True for bool."""
    if dtype.kind == "b":
        return True
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if dtype.kind == "i" else info.max
    try:
        return np.array(np.nan).astype(dtype)[()]
    except (TypeError, ValueError):  # (no NaN in it: its largest value)
        return np.array(np.finfo(dtype).max, dtype)[()]


TIMINGS = ("barrier", "back-to-back")
PLAN_SUFFIX = "+plan"  # the rows of an algorithm run through a persistent plan


BACK_TO_BACK_ROUNDS = 10  # back-to-back timing: the calls take turns in this many rounds


def time_interleaved(comm: Communicator, calls: dict[str, Callable[[], object]], iters: int,
                     warmup: int, barrier: Callable[[], None],
                     timing: str = "barrier",
                     spread: dict[str, tuple[float, float, float]] | None = None
                     ) -> dict[str, list[float]]:
    """Per-iteration times of each call, each the slowest rank's; warm-up excluded.
    ``spread``, where given, gets OSU's view of each call: each rank's mean over the
    iterations, and their (average, minimum, maximum) over the ranks, in seconds.

    ``timing="barrier"``: the calls take turns (iteration i of every call, in a shuffled
    order, then i+1), each after a barrier, so a slow spell of the machine hits them all
    alike and their times compare; ``"back-to-back"``: each call's iterations run in
    loops after one barrier, as an application calls them (each iteration still timed
    alone), the calls taking turns by rounds of loops (in a shuffled order each round),
    for the same reason.
    """
    from mpi4py import MPI

    for call in calls.values():
        for _ in range(warmup):
            call()
    times = {name: np.empty(iters) for name in calls}
    if timing == "back-to-back":
        names, rounds, done = list(calls), min(BACK_TO_BACK_ROUNDS, iters), 0
        for r in range(rounds):
            loop = (iters - done) // (rounds - r)
            for k in np.random.default_rng(r).permutation(len(names)):
                call, row = calls[names[k]], times[names[k]]
                barrier()
                for i in range(done, done + loop):
                    start = time.perf_counter()
                    call()
                    row[i] = time.perf_counter() - start
            done += loop
    else:
        names = list(calls)
        for i in range(iters):
            # a new order each iteration (the same on every rank: the seed is i), so no
            # algorithm always follows the same one and inherits its caches or stragglers
            for k in np.random.default_rng(i).permutation(len(names)):
                name = names[k]
                barrier()
                start = time.perf_counter()
                calls[name]()
                times[name][i] = time.perf_counter() - start
    mine = np.stack(list(times.values())) if times else np.empty((0, iters))
    slowest = np.empty_like(mine)
    control = comm.control_comm
    control.Allreduce(mine, slowest, op=MPI.MAX)
    if spread is not None:  # OSU: each rank's mean, then across the ranks
        means = mine.mean(axis=1)
        total, low, high = (np.empty_like(means) for _ in range(3))
        control.Allreduce(means, total, op=MPI.SUM)
        control.Allreduce(means, low, op=MPI.MIN)
        control.Allreduce(means, high, op=MPI.MAX)
        for k, name in enumerate(times):
            spread[name] = (total[k] / comm.size, low[k], high[k])
    return {name: slowest[k].tolist() for k, name in enumerate(times)}


def count_wrong(comm: Communicator, got: np.ndarray | None, reference: np.ndarray | None) -> int:
    from mpi4py import MPI

    wrong = 0
    got, reference = to_host(got) if got is not None else None, \
        to_host(reference) if reference is not None else None
    if (got is None) != (reference is None):
        wrong = 1
    elif got is not None:
        wrong = int(np.count_nonzero(got != reference)) if got.shape == reference.shape else got.size
    return comm.control_comm.allreduce(wrong, op=MPI.SUM)


@dataclass
class Row:
    """One measured (size, algorithm): what the table prints and JSON/CSV keep."""

    collective: str
    backend: str
    buffer: str
    size: int  # nccl-tests' size: the whole buffer's bytes
    count: int  # and its count: the elements of each rank's part (of each peer's, all_to_all)
    type: str
    redop: str
    root: int
    algorithm: str
    time_us: float
    min_us: float
    max_us: float
    p99_us: float
    algbw: float
    busbw: float
    wrong: int
    predicted_us: float
    vs_native: float = math.nan
    mean_us: float = math.nan
    inplace: bool = False
    # OSU's latency: each rank's mean over the iterations, then their average, minimum
    # and maximum over the ranks
    rank_avg_us: float = math.nan
    rank_min_us: float = math.nan
    rank_max_us: float = math.nan

    @property
    def measured_over_predicted(self) -> float:
        return self.time_us / self.predicted_us if self.predicted_us > 0 else math.nan


def _algorithm_names(collective: str, chosen: str, backend: str = "mpi") -> list[str]:
    """The rows of ``collective``: the library's, then the chosen algorithms it has."""
    library = report.library_row(backend)
    names = [library, *mpicoll.algorithms(collective, backend), "auto"]
    if chosen != "all":  # the library's row stays: it is what vs_native divides
        names = [library, *(n for n in chosen.split(",") if n != library and n in names)]
    return names


def _synchronized(call: Callable[[], object], stream: Any) -> Callable[[], None]:
    """``call`` and then a wait for the GPU stream: a GPU call has ended when the stream
    has run it, not when it returns."""

    def timed() -> None:
        call()
        stream.synchronize()

    return timed


def sweep(comm: Communicator, collective: str, sizes_: list[int], args: argparse.Namespace,
          params: model.Params, progress: report.Progress, say: Callable[..., None],
          inplace: bool = False) -> tuple[list[Row], int]:
    """Time every algorithm of ``collective`` at every size (the result over the input
    with ``inplace``); returns the rows and #wrong."""
    dtype, record = np.dtype(args.datatype), RECORDS[collective]
    names = _algorithm_names(collective, args.algo, args.backend)
    library_name = report.library_row(args.backend)
    checker, lacks = "native", None
    if "native" not in mpicoll.algorithms(collective, args.backend):  # NCCL has no scan
        lacks = f"the library has no {collective}"
    elif record.reduces and not comm.native_serves(resolve_op(args.op, dtype), dtype):
        lacks = f"the library cannot reduce {dtype}"  # bfloat16
    if lacks:
        # no library rows, and results are checked against an algorithm that combines in
        # rank order
        names = [n for n in names if n not in (library_name, "native")]
        checker = next(a.name for a in REGISTRY[collective].values() if not a.commutative_only)
        say(f"# {lacks}: no {library_name}/native rows; results checked against {checker}")
    if inplace and collective not in INPLACE:
        say(f"# {collective} has no in-place form: run out of place")
    rows, wrong_total, sizes_timed = [], 0, set()
    for nbytes in sizes_:
        x = on_buffer(make_input(comm, collective, nbytes, dtype, args.op), args.buffer)
        size, count = nccl_size(record, x, comm.size)
        if size in sizes_timed:  # (sizes that come to the same whole elements: once)
            continue
        sizes_timed.add(size)
        call = Call(comm, collective, x, args.op, args.root, inplace)
        library = library_call(comm, collective, x, args.op, args.root,
                               call.inplace) if not lacks else None
        reference = None
        if args.check:
            call.reset()
            reference = call.run(checker)
            reference = None if reference is None else reference.copy()
        runs, wrongs = {}, {}
        for name in names:
            progress.step(f"{collective} {report.human(size)} {name}")
            if name == library_name:  # its first run's result, checked as every row's
                runs[name], wrongs[name] = library, 0
                if args.check:
                    wrongs[name] = count_wrong(comm, _library_result(library, reference),
                                               reference)
                continue
            runs[name] = functools.partial(call.run, name)
            wrongs[name] = 0
            if args.check:
                call.reset()
                wrongs[name] = count_wrong(comm, runs[name](), reference)
        for name in names if args.plan else ():  # the same call through a persistent plan
            if name == library_name:
                continue
            planned = f"{name}{PLAN_SUFFIX}"
            runs[planned] = functools.partial(call.run_plan, name)
            wrongs[planned] = 0
            if args.check:
                call.reset()
                wrongs[planned] = count_wrong(comm, runs[planned](), reference)
        errors = _compressed_rows(comm, collective, x, args, names, runs, wrongs)
        wrong_total += sum(wrongs.values())
        if args.buffer == "cupy":
            from mpicoll.buffers.cuda import current_stream

            runs = {name: _synchronized(run, current_stream()) for name, run in runs.items()}
        spread: dict[str, tuple[float, float, float]] = {}
        timed = time_interleaved(comm, runs, args.iters, args.warmup_iters,
                                 lambda: comm.barrier(algorithm="native"), args.timing, spread)
        measured = {name: (timed[name], wrongs[name]) for name in runs}
        for name, (times, wrong) in measured.items():
            seconds = statistics.median(times)
            algbw = size / seconds / 1e9 if seconds > 0 else 0.0
            stand_in, wire_size = name.removesuffix(PLAN_SUFFIX), size
            if args.compress and stand_in.endswith(f"+{args.compress}"):  # 16-bit values
                stand_in, wire_size = stand_in.rsplit("+", 1)[0], size * 2 // dtype.itemsize
            automatic = stand_in == "auto"
            stand_in = "native" if stand_in in (library_name, "auto") else stand_in
            if automatic:
                stand_in = comm.auto_algorithm(collective, size, args.op if record.reduces
                                               else None, dtype)
            rows.append(Row(
                collective, args.backend, args.buffer, size, count, dtype.name,
                args.op if record.reduces else "none", args.root if record.rooted else -1,
                name, seconds * 1e6, min(times) * 1e6, max(times) * 1e6,
                float(np.percentile(times, 99)) * 1e6, algbw,
                algbw * record.busbw_factor(comm.size), wrong if args.check else -1,
                model.predict(collective, stand_in, wire_size, comm.size, params,
                              tuple(map(len, comm.nodes))) * 1e6,
                mean_us=statistics.fmean(times) * 1e6,
                inplace=inplace and collective in INPLACE and not (
                    args.compress and name.removesuffix(PLAN_SUFFIX).endswith(f"+{args.compress}")),
                # (+bf16: the compressed rows run out of place; +plan rows as their call)
                rank_avg_us=spread[name][0] * 1e6, rank_min_us=spread[name][1] * 1e6,
                rank_max_us=spread[name][2] * 1e6))
        baseline = measured.get(library_name, measured.get("native", ([math.nan], 0)))[0]
        for row in rows[-len(measured):]:
            row.vs_native = statistics.median(baseline) * 1e6 / row.time_us
        for row in rows[-len(measured):]:
            say(report.table_row(row))
        for name, (error, bound) in errors.items():
            say(f"#   {name}: largest error {error:.2e} of the largest result "
                f"(the wire's rounding allows {bound:.2e})")
        sys.stdout.flush()
    return rows, wrong_total


def _compressed_rows(comm: Communicator, collective: str, x: Any, args: argparse.Namespace,
                     names: list[str], runs: dict, wrongs: dict,
                     ) -> dict[str, tuple[float, float]]:
    """``--compress``: each algorithm's all_reduce with compress=, added to ``runs`` as
    NAME+bf16, always out of place; its error against the uncompressed call of the library
    on the same input (wrong: the elements past the wire's rounding bound, 2p units of
    16-bit rounding of the largest result). The input is x's size of values with a
    fraction (each rank's own, seeded): the benchmark's small whole numbers travel
    exactly in 16 bits, so they would show no error."""
    if args.compress is None or collective != "all_reduce" or \
            np.dtype(args.datatype) not in (np.float32, np.float64):
        return {}
    unit = 2.0 ** -8 if args.compress == "bf16" else 2.0 ** -11
    bound = 2 * comm.size * unit
    values = np.random.default_rng(1 + comm.rank).uniform(0.5, 1.5, x.shape)
    x = on_buffer(values.astype(x.dtype), args.buffer)
    out = empty(x.shape, x.dtype, like=x)
    reference = comm.all_reduce(x, args.op) if args.check else None
    errors = {}
    for name in names:
        if name in (report.library_row(args.backend), "native"):
            continue
        row = f"{name}+{args.compress}"
        runs[row] = functools.partial(comm.all_reduce, x, args.op, algorithm=name,
                                      compress=args.compress, out=out)
        wrongs[row] = 0
        if reference is not None:
            got, want = to_host(runs[row]()), to_host(reference)
            scale = max(float(np.max(np.abs(want))), np.finfo(want.dtype).tiny) if want.size \
                else 1.0
            error = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
            wrongs[row] = int(np.count_nonzero(np.abs(got - want) > bound * scale))
            errors[row] = (error, bound)
    return errors


OVERHEAD_ITERS = 100  # calls per -n: small calls need many to time well (-n 20: 2000)


def mpi_call(comm: Communicator, collective: str, x: np.ndarray, op: str,
             root: int) -> Callable[[], object] | None:
    """mpi4py's own call of ``collective`` on ready host buffers, with nothing of mpicoll
    around it (the overhead table's baseline), or None off the mpi backend, for GPU
    buffers, or where MPI cannot reduce the dtype."""
    if comm.backend != "mpi" or type(x) is not np.ndarray:
        return None
    from mpi4py import MPI

    from mpicoll.backends.mpi_native import check_op, mpi_op

    record, mpi = RECORDS[collective], comm.transport.comm
    out = np.empty(result_shape(collective, x, comm.size), x.dtype)
    is_root = comm.rank == root
    if record.reduces:
        opd = resolve_op(op, x.dtype)
        try:
            check_op(opd, x.dtype)
        except mpicoll.MpicollError:
            return None
        mop = mpi_op(opd, x.dtype)[1]
    calls = {
        "broadcast": lambda: mpi.Bcast([out, MPI.BYTE], root),
        "scatter": lambda: mpi.Scatter([x, MPI.BYTE] if is_root else None, [out, MPI.BYTE], root),
        "gather": lambda: mpi.Gather([x, MPI.BYTE], [out, MPI.BYTE] if is_root else None, root),
        "all_gather": lambda: mpi.Allgather([x, MPI.BYTE], [out, MPI.BYTE]),
        "all_to_all": lambda: mpi.Alltoall([x, MPI.BYTE], [out, MPI.BYTE]),
        "reduce": lambda: mpi.Reduce(x, out if is_root else None, mop, root),
        "all_reduce": lambda: mpi.Allreduce(x, out, mop),
        "reduce_scatter": lambda: mpi.Reduce_scatter_block(x, out, mop),
        "scan": lambda: mpi.Scan(x, out, mop),
        "exscan": lambda: mpi.Exscan(x, out, mop),
    }
    return calls.get(collective)


def default_call(comm: Communicator, collective: str, x: np.ndarray, op: str,
                 root: int) -> Callable[[], object]:
    """The call as a user writes it first: no algorithm, no out= (broadcast in place), and
    no argument that says what its default does (``comm.all_reduce(x)`` for op sum)."""
    record, fn = RECORDS[collective], getattr(comm, collective)
    given = ((op,) if record.reduces else ()) + ((root,) if record.rooted else ())
    defaults = tuple(p.default for name, p in inspect.signature(fn).parameters.items()
                     if name in ("op", "root"))
    while given and given[-1] == defaults[len(given) - 1]:  # (op "sum", root 0)
        given = given[:-1]
    if collective == "broadcast":
        buf = x.clone() if hasattr(x, "clone") else x.copy()  # a torch tensor, or an array
        return functools.partial(fn, buf, *given)
    if collective == "scatter":
        return functools.partial(fn, x if comm.rank == root else None, *given)
    return functools.partial(fn, x, *given)


def overhead(comm: Communicator, args: argparse.Namespace, say: Callable[..., None]) -> int:
    """The per-call overhead table: every collective at ``-b`` bytes (default 8 B), the MPI
    call itself (mpi4py's, on ready buffers) against mpicoll's default call, ``native`` and a plan
    (``plan()``), each timed back to back over 100 x ``-n`` calls (2000 by default), in
    one run. Where torch is installed (NumPy buffers), also the default call on torch CPU
    tensors over the same memory, against the default call on the NumPy arrays."""
    dtype, iters = np.dtype(args.datatype), args.iters * OVERHEAD_ITERS
    # every collective on the same bytes: whole blocks of at least one element per rank
    # (-b 8 of float32 at 3 ranks would give the collectives of one block per rank none)
    given = args.size_list[0]
    nbytes = max(1, given // dtype.itemsize // comm.size) * comm.size * dtype.itemsize
    torch = None
    if args.buffer == "numpy" and comm.backend == "mpi":
        with contextlib.suppress(ImportError):
            import torch
    say(f"\n# per-call overhead at {report.human(nbytes)} ({dtype.name}, op {args.op}, "
        f"{comm.size} ranks; median of {iters} back-to-back calls, the slowest rank's)")
    if nbytes != given:
        say(f"# (-b {report.human(given)}: {nbytes // dtype.itemsize // comm.size} "
            f"{dtype.name} a rank, for every collective alike)")
    say(f"# {'collective':>14} {'library(us)':>11} {'default(us)':>11} {'x':>5} "
        f"{'native(us)':>10} {'x':>5} {'plan(us)':>9} {'x':>5}"
        + (f" {'torch(us)':>9} {'x numpy':>7}" if torch is not None else ""))
    barrier = lambda: comm.barrier(algorithm="native")  # noqa: E731
    worst, first = 0.0, True
    for collective in (*RECORDS, "barrier"):
        if "native" not in mpicoll.algorithms(collective, comm.backend):
            say(f"  {collective:>14} (the library has no {collective})")
            continue
        if collective == "barrier":
            runs = {"library": comm.control_comm.Barrier if comm.backend == "mpi" else
                    functools.partial(comm.native_collective("barrier"), comm.transport),
                    "default": comm.barrier,
                    "native": lambda: comm.barrier(algorithm="native"),
                    "plan": comm.barrier_init()}
        elif RECORDS[collective].reduces and not comm.native_serves(
                resolve_op(args.op, dtype), dtype):
            say(f"  {collective:>14} (the library cannot reduce {dtype.name} with {args.op})")
            continue
        else:
            x = on_buffer(make_input(comm, collective, nbytes, dtype, args.op), args.buffer)
            call = Call(comm, collective, x, args.op, args.root)
            direct = mpi_call(comm, collective, x, args.op, args.root)
            runs = {"library": direct or library_call(comm, collective, x, args.op, args.root),
                    "default": default_call(comm, collective, x, args.op, args.root),
                    "native": functools.partial(call.run, "native"),
                    "plan": functools.partial(call.run_plan, "auto")}
            if torch is not None:
                # (a tensor over a copy of x: ml_dtypes' bfloat16 as torch's)
                runs["torch"] = default_call(comm, collective, to_torch(x.copy()),
                                             args.op, args.root)
        # a tenth of the calls first (not -w's few), and before the first row all of them
        # once, untimed: the first row would otherwise pay for the machine's warming up
        # (caches, clocks, the ranks' first waits) alone
        warmup = iters if first else max(args.warmup_iters, iters // 10)
        first = False
        timed = time_interleaved(comm, runs, iters, warmup, barrier, "back-to-back")
        us = {name: statistics.median(times) * 1e6 for name, times in timed.items()}
        ratio = {name: us[name] / us["library"] for name in us}
        worst = max(worst, ratio["default"])
        say(f"  {collective:>14} {us['library']:>11.2f} {us['default']:>11.2f} "
            f"{ratio['default']:>5.2f} {us['native']:>10.2f} {ratio['native']:>5.2f} "
            f"{us['plan']:>9.2f} {ratio['plan']:>5.2f}"
            + (f" {us['torch']:>9.2f} {us['torch'] / us['default']:>7.2f}" if "torch" in us
               else ""))
    say(f"# the default call's overhead is at most {worst:.2f}x the library's call")
    if torch is not None and "native" in mpicoll.algorithms("all_reduce", comm.backend):
        _torch_in_place(comm, torch, nbytes, dtype, args.op, iters, barrier, say)
    return 0


def _torch_in_place(comm: Communicator, torch: Any, nbytes: int, dtype: np.dtype, op: str,
                    iters: int, barrier: Callable[[], None], say: Callable[..., None]) -> None:
    """The in-place all_reduce (``out=x``: mpicoll.dist's and torch.distributed's form)
    on a torch CPU tensor against the same call on a NumPy array, in one run: what a
    tensor's call costs where no new tensor is made (a new result tensor costs
    torch.from_numpy and, once dropped, its deallocation: torch's own, above)."""
    x = make_input(comm, "all_reduce", nbytes, dtype, op)
    tensor = to_torch(x.copy())
    runs = {"numpy": functools.partial(comm.all_reduce, x, op, out=x),
            "torch": functools.partial(comm.all_reduce, tensor, op, out=tensor)}
    timed = time_interleaved(comm, runs, iters, iters // 10, barrier, "back-to-back")
    us = {name: statistics.median(times) * 1e6 for name, times in timed.items()}
    say(f"# all_reduce in place (out=x) at {report.human(nbytes)}: numpy {us['numpy']:.2f} us, "
        f"torch {us['torch']:.2f} us, {us['torch'] / us['numpy']:.2f}x numpy")


def _gpu_problem() -> str | None:
    """Why GPU buffers cannot be used here, or None."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'mpicoll[cuda12]' or '[cuda13]')"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as exc:  # no driver
        return f"CUDA is not usable here ({exc})"
    return None


def _launched(variables: tuple[str, ...], default: int) -> int:
    """A number the launcher gave this process (read before MPI starts), else ``default``."""
    import os

    for variable in variables:
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return default


def _launched_rank() -> int:
    return _launched(("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"), 0)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line, on rank 0 only, and exits 2 on
    every rank (each rank parses the same arguments, so all of them stop)."""

    def error(self, message: str) -> NoReturn:
        if _launched_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


FORMATS = ("table", "nccl", "osu")


def _parser() -> _Parser:
    parser = _Parser(
        prog="python -m mpicoll.bench",
        description="Time every algorithm of a collective against the MPI library's own.")
    parser.add_argument("collective", nargs="?", default="all_reduce",
                        help="collective to time (or several, comma-separated), all of them, "
                             "tune (write a tuning file), or overhead (the per-call overhead "
                             "table: every collective at -b bytes against the library's call)")
    parser.add_argument("-b", "--minbytes", default="8", help="smallest size (K, M, G suffixes)")
    parser.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    parser.add_argument("-f", "--stepfactor", type=float, default=8.0, help="size factor")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed iterations")
    parser.add_argument("-w", "--warmup_iters", type=int, default=3, help="untimed iterations")
    parser.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                        help="check results (0/1)")
    parser.add_argument("-d", "--datatype", default="float32",
                        help="dtype: nccl-tests' names (float is float32, half, double, int, "
                             "int8, uint8, int64, uint64, bfloat16) or a NumPy name")
    parser.add_argument("-o", "--op", default="sum", help="reduction op")
    parser.add_argument("-r", "--root", type=int, default=0, help="root rank")
    parser.add_argument("--algo", default="all",
                        help="comma-separated algorithms (auto, native included), or all")
    parser.add_argument("--backend", default="mpi", choices=["mpi", "nccl"])
    parser.add_argument("--buffer", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--inplace", action="store_true", help="result over the input")
    parser.add_argument("--compress", choices=["bf16", "fp16"], default=None,
                        help="all_reduce of float32/float64: also each algorithm with "
                             "compress= (rows NAME+bf16), its error beside it")
    parser.add_argument("--plan", action="store_true",
                        help="also time each algorithm through a persistent plan "
                             "(<collective>_init, started by plan()): rows NAME+plan")
    parser.add_argument("--timing", default="barrier", choices=TIMINGS,
                        help="a barrier before each iteration (default), or back-to-back")
    parser.add_argument("--format", default="table", choices=FORMATS,
                        help="table (every algorithm side by side, default), nccl (nccl-tests' "
                             "out-of-place and in-place columns, avg bus bandwidth), or osu "
                             "(OSU's per-size avg/min/max latency)")
    parser.add_argument("--json", default=None, help="write every row (min/max/p99 too)")
    parser.add_argument("--csv", default=None, help="write every row as CSV")
    parser.add_argument("--plot", default=None,
                        help="PNG of busbw against size; FILE-model.png: predicted vs measured")
    parser.add_argument("--min-busbw", type=_gigabytes_per_second, default=None,
                        help="exit 1 when a collective's best busbw (GB/s) stays below this")
    parser.add_argument("--model", default=None,
                        help="cost-model parameters (default: the fitted file, if any)")
    parser.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,broadcast",
                        help="tune: the collectives to tune, comma-separated, or all")
    parser.add_argument("--output", default=None,
                        help="tune: the tuning file (default: mpicoll.selection.tuning.default_path())")
    return parser


def _collectives(names: str) -> list[str]:
    # (each once, in the order given: all_reduce,all_reduce times it once)
    return list(RECORDS) if names == "all" else list(dict.fromkeys(names.split(",")))


def _check_arguments(parser: _Parser, args: argparse.Namespace) -> None:
    """Every refusal the arguments alone decide, as one line (the same on every rank)."""
    tuning = args.collective == "tune"
    chosen = _collectives(args.collectives if tuning else
                          "all" if args.collective == "overhead" else args.collective)
    unknown = [c for c in chosen if c not in RECORDS]
    if unknown:
        parser.error(f"{'--collectives: ' if tuning else ''}unknown collective "
                     f"{', '.join(unknown)}; choose from {', '.join(RECORDS)}, all"
                     + ("" if tuning else ", tune, overhead"))
    try:
        args.dtype = parse_dtype(args.datatype)
    except ValueError as exc:
        parser.error(f"-d: {exc}")
    if not (args.dtype.kind in "biufc" or args.dtype.names is None and  # (ml_dtypes':
            args.dtype.type.__module__.startswith("ml_dtypes")):        # kind "V")
        parser.error(f"-d {args.datatype}: a number type (int, float, complex, bool, "
                     f"bfloat16...), not {args.dtype}")
    args.datatype = args.dtype.name
    if args.collective in ("overhead", "tune"):  # (a table of their own: no rows to write)
        given = [flag for flag, on in (
            ("--json", args.json), ("--csv", args.csv), ("--plot", args.plot),
            ("--min-busbw", args.min_busbw is not None), ("--algo", args.algo != "all"),
            ("--format", args.format != "table"), ("--compress", args.compress is not None),
            ("--inplace", args.inplace), ("--plan", args.plan), ("-c 0", not args.check),
            ("-e", args.collective == "overhead" and args.maxbytes != "64M"),
            ("--timing", args.collective == "overhead" and args.timing != "barrier"))
            if on]
        if given:
            parser.error(f"{', '.join(given)}: not with {args.collective}, which prints its "
                         "own table" + (" and writes --output" if tuning else ""))
    if args.collective == "overhead":
        args.maxbytes = args.minbytes  # (one size: -b's)
    args.size_list = checked_sizes(parser, args.minbytes, args.maxbytes, args.stepfactor)
    if args.compress and (args.dtype not in (np.float32, np.float64)
                          or "all_reduce" not in chosen):
        parser.error(f"--compress {args.compress}: compresses all_reduce on float32 or "
                     f"float64 (got {', '.join(chosen)} on {args.dtype.name})")
    if args.compress and args.op in ("land", "lor", "lxor"):  # (as the call refuses them)
        parser.error(f"--compress {args.compress}: not with -o {args.op} (a logical op tells "
                     "zero from nonzero, which rounding to 16 bits can change)")
    if args.iters < 1:
        parser.error(f"-n {args.iters}: at least 1 timed iteration")
    if args.warmup_iters < 0:
        parser.error(f"-w {args.warmup_iters}: warm-up iterations cannot be negative")
    ranks = _launched(("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"), 0)
    if args.root < 0 or (ranks and args.root >= ranks):
        parser.error(f"-r {args.root}: a root is a rank, 0 to the number of ranks - 1"
                     + (f" ({ranks - 1})" if ranks else ""))
    if any(RECORDS[c].reduces for c in chosen):
        try:
            resolve_op(args.op, args.dtype)
        except (TypeError, ValueError) as exc:
            parser.error(f"-o {args.op}: {exc}")
    if args.algo != "all":
        known = {report.library_row(args.backend), "auto"}
        for collective in chosen:
            known.update(mpicoll.algorithms(collective, args.backend))
        unknown = [n for n in args.algo.split(",") if n not in known]
        if unknown:
            parser.error(f"--algo: unknown algorithm {', '.join(unknown)} for "
                         f"{', '.join(chosen)}; choose from {', '.join(sorted(known))}")
        if args.min_busbw is not None and \
                set(args.algo.split(",")) <= {report.library_row(args.backend)}:
            parser.error(f"--min-busbw: compares mpicoll's rows, and --algo {args.algo} "
                         "runs the MPI library's alone")


def _gigabytes_per_second(text: str) -> float:
    """--min-busbw's value: a number of GB/s, at least 0 (nan, inf or a negative one
    would pass or fail every run whatever it measured)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GB/s, a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected GB/s, a finite number >= 0, got {text!r}")
    return value


def _unwritable_output(args: argparse.Namespace) -> str | None:
    """Why rank 0 could not write an output the flags name (its folder made where
    missing), asked before the run so its hours are never lost at the end; None: it can."""
    for flag in ("json", "csv", "plot", "output"):
        path = getattr(args, flag, None)
        # (a figure: also an extension matplotlib writes, and matplotlib itself)
        problem = None if not path else report.figure_path(path)[1] if flag == "plot" \
            else report.unwritable(path)
        if problem:
            return f"--{flag} {path}: {problem}"
    if args.collective == "tune":  # (it adds to a tuning file, never writes over another)
        from mpicoll.selection import tuning

        try:
            tuning.TuningTable.load(args.output)
        except mpicoll.ConfigError as exc:
            return f"--output: {exc}; tune adds its table to a tuning file, or makes one"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    if args.backend == "nccl" and args.buffer != "cupy":
        args.buffer = "cupy"  # NCCL moves GPU memory only
    if args.buffer == "cupy":
        problem = _gpu_problem()
        if problem:
            parser.error(f"--buffer cupy / --backend nccl: {problem}")
        if args.collective == "tune":
            parser.error("tune: tunes the mpi backend on NumPy buffers; NCCL's own "
                         "collectives are auto's choice on GPUs")
    if args.buffer == "cupy" and args.backend == "mpi":
        from mpi4py import MPI

        from mpicoll.buffers.cuda import select_device

        select_device(MPI.COMM_WORLD)  # the NCCL backend selects its own
    try:
        comm = Communicator(backend=args.backend)
    except mpicoll.ConfigError as exc:  # (rank 0's model or tuning file: every rank's)
        parser.error(str(exc))
    problem = _unwritable_output(args) if comm.rank == 0 else None  # rank 0 writes them:
    problem = comm.control_comm.bcast(problem, root=0)  # its verdict, on every rank
    if problem:
        parser.error(problem)
    if args.root >= comm.size:
        parser.error(f"-r {args.root}: there are {comm.size} ranks (0..{comm.size - 1})")
    if args.collective == "tune" and comm.size < 2:
        parser.error("tune: at one rank nothing is sent, so every algorithm times alike and "
                     "its table would be noise; tune under mpiexec -n 2 or more")
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    # (--model named: a file it can read; else the default file, where there is one),
    # read by rank 0 and shared: every rank runs with its parameters, or every rank stops
    loaded: tuple[Any, str | None] = (None, None)
    if comm.rank == 0:
        try:
            params = model.load_params(args.model)
            loaded = (params, f"--model {args.model}: no such file"
                      if params is None and args.model else None)
        except mpicoll.ConfigError as exc:
            loaded = (None, f"--model: {exc}")
    params, problem = comm.control_comm.bcast(loaded, root=0)
    if problem:
        parser.error(problem)
    params = params or model.Params()
    header = report.header(comm, args, args.dtype, params)
    for line in report.header_lines(header, sweep=args.collective != "overhead"):
        say(line)
    if args.collective == "tune":
        from .tune import tune

        return tune(comm, args, args.size_list, params, say)
    if args.collective == "overhead":
        return overhead(comm, args, say)
    collectives = _collectives(args.collective)
    layouts = (False, True) if args.format == "nccl" else (args.inplace,)
    progress = report.Progress(
        comm.rank == 0, len(layouts) * len(args.size_list)
        * sum(len(_algorithm_names(c, args.algo, args.backend)) for c in collectives))
    rows, in_place_rows, wrong_total = [], [], 0
    for collective in collectives:
        if args.format == "table":
            say(f"\n# {collective}")
            say(report.TABLE_HEADER)
        for inplace in layouts:
            if inplace and len(layouts) > 1 and collective not in INPLACE:
                continue  # (--format nccl: its in-place columns say n/a)
            got, wrong = sweep(comm, collective, args.size_list, args, params, progress,
                               say if args.format == "table" else (lambda *a, **k: None),
                               inplace=inplace)
            (in_place_rows if inplace and args.format == "nccl" else rows).extend(got)
            wrong_total += wrong
    progress.done()
    if args.format == "nccl":
        for line in report.nccl_lines(rows, in_place_rows, header):
            say(line)
    elif args.format == "osu":
        for line in report.osu_lines(rows, header):
            say(line)
    for line in report.fastest_lines(rows) + report.auto_lines(rows):
        say(line)
    say("\n# Out of bounds values : N/A (-c 0: results not checked)" if not args.check else
        f"\n# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
    status = 1 if wrong_total else 0
    if args.min_busbw is not None:
        for collective, best in report.best_busbw(rows).items():
            if best < args.min_busbw:
                say(f"# {collective}: best busbw {best:.2f} GB/s is below --min-busbw "
                    f"{args.min_busbw:.2f}")
                status = 1
    if comm.rank == 0:
        report.write(rows + in_place_rows, header, args.json, args.csv, args.plot)
    return status
