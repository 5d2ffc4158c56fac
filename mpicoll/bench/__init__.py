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
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import mpicoll
from mpicoll import Communicator
from mpicoll.algorithms import REGISTRY
from mpicoll.buffers import even_bounds
from mpicoll.native import NATIVE
from mpicoll.ops import resolve_op


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


RECORDS = {
    "broadcast": Record(False, False, True, False, lambda p: 1.0),
    "reduce": Record(False, False, True, True, lambda p: 1.0),
    "all_reduce": Record(False, False, False, True, lambda p: 2 * (p - 1) / p),
    "all_gather": Record(False, True, False, False, lambda p: (p - 1) / p),
    "gather": Record(False, True, True, False, lambda p: (p - 1) / p),
    "reduce_scatter": Record(True, False, False, True, lambda p: (p - 1) / p),
    "scatter": Record(True, False, True, False, lambda p: (p - 1) / p),
    "all_to_all": Record(True, False, False, False, lambda p: (p - 1) / p),
}


def parse_size(text: str) -> int:
    """'64M' -> 67108864; K, M, G are powers of 1024."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    return int(float(number) * scale)


def sizes(begin: int, end: int, factor: float) -> list[int]:
    out, size = [], begin
    while size <= end:
        out.append(size)
        nxt = int(size * factor)
        size = nxt if nxt > size else size + 1
    if not out or out[-1] != end:
        out.append(end)
    return out


MPI_LIBRARY = "mpi_library"  # the row of the MPI library's collective called directly


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
    if RECORDS[collective].per_rank:
        return (p, *x.shape)
    if collective in ("scatter", "reduce_scatter"):
        return x.shape[1:]
    return x.shape


def library_call(comm: Communicator, collective: str, x: np.ndarray, op: str,
                 root: int) -> Callable[[], None]:
    """The MPI library's own collective on ready flat buffers: no mpicoll validation,
    no allocation; the baseline of ``vs_native``."""
    t, p, record = comm._transport, comm.size, RECORDS[collective]
    fn, src, is_root = NATIVE[collective], x.reshape(-1), comm.rank == root
    opd = resolve_op(op, x.dtype) if record.reduces else None
    dst = np.empty(math.prod(result_shape(collective, x, p)), x.dtype)
    if collective == "broadcast":
        return lambda: fn(t, dst, root)
    if collective == "scatter":
        bounds = even_bounds(dst.size, p)
        return lambda: fn(t, src if is_root else None, dst, bounds, root)
    if collective == "gather":
        bounds = even_bounds(src.size, p)
        return lambda: fn(t, src, dst if is_root else None, bounds, root)
    if collective == "all_gather":
        bounds = even_bounds(src.size, p)
        return lambda: fn(t, dst, bounds)
    if collective == "reduce":
        return lambda: fn(t, src, dst if is_root else None, opd, root)
    if collective == "all_reduce":
        return lambda: fn(t, src, dst, opd)
    if collective == "reduce_scatter":
        bounds = even_bounds(dst.size, p)
        return lambda: fn(t, src, bounds, opd, dst)
    bounds = even_bounds(src.size // p, p)
    return lambda: fn(t, src, bounds, dst, bounds)


def make_call(comm: Communicator, collective: str, x: np.ndarray, op: str,
              root: int) -> Callable[[str], np.ndarray | None]:
    """A function running one call of ``collective`` through mpicoll with an algorithm."""
    record = RECORDS[collective]
    if collective == "broadcast":
        buf = x.copy()
        return lambda algo: comm.broadcast(buf, root, algorithm=algo)
    out = np.empty(result_shape(collective, x, comm.size), x.dtype)
    if collective == "scatter":
        return lambda algo: comm.scatter(x, root, algorithm=algo, out=out)
    out = out if comm.rank == root or not record.rooted else None
    fn = getattr(comm, collective)
    if record.reduces:
        if record.rooted:
            return lambda algo: fn(x, op, root, algorithm=algo, out=out)
        return lambda algo: fn(x, op, algorithm=algo, out=out)
    if record.rooted:
        return lambda algo: fn(x, root, algorithm=algo, out=out)
    return lambda algo: fn(x, algorithm=algo, out=out)


def time_calls(comm: Communicator, call: Callable[[], object], iters: int, warmup: int,
               barrier: Callable[[], None]) -> list[float]:
    """Per-iteration times, each the slowest rank's, barrier-separated; warm-up excluded."""
    from mpi4py import MPI

    for _ in range(warmup):
        call()
    times = np.empty(iters)
    for i in range(iters):
        barrier()
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    slowest = np.empty_like(times)
    comm._transport.comm.Allreduce(times, slowest, op=MPI.MAX)
    return slowest.tolist()


def count_wrong(comm: Communicator, got: np.ndarray | None, reference: np.ndarray | None) -> int:
    from mpi4py import MPI

    wrong = 0
    if (got is None) != (reference is None):
        wrong = 1
    elif got is not None:
        wrong = int(np.count_nonzero(got != reference)) if got.shape == reference.shape else got.size
    return comm._transport.comm.allreduce(wrong, op=MPI.SUM)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mpicoll.bench",
        description="Time every algorithm of a collective against the MPI library's own.")
    parser.add_argument("collective", nargs="?", default="all_reduce",
                        choices=[*RECORDS, "all"], help="collective to time, or all")
    parser.add_argument("-b", "--minbytes", default="8", help="smallest size (8, 1K, 64M)")
    parser.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    parser.add_argument("-f", "--stepfactor", type=float, default=8.0, help="size factor")
    parser.add_argument("-n", "--iters", type=int, default=20, help="timed iterations")
    parser.add_argument("-w", "--warmup_iters", type=int, default=3, help="untimed iterations")
    parser.add_argument("-c", "--check", type=int, default=1, help="check results (0/1)")
    parser.add_argument("-d", "--datatype", default="float32", help="NumPy dtype name")
    parser.add_argument("-o", "--op", default="sum", help="reduction op")
    parser.add_argument("-r", "--root", type=int, default=0, help="root rank")
    parser.add_argument("--algo", default="all",
                        help="comma-separated algorithms, 'all' (every one, native and auto)")
    args = parser.parse_args(argv)

    comm = Communicator()
    dtype = np.dtype(args.datatype)
    collectives = list(RECORDS) if args.collective == "all" else [args.collective]
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    from mpi4py import MPI

    library = MPI.Get_library_version().splitlines()[0].strip()
    say(f"# mpicoll {mpicoll.__version__} | {library} | mpi4py {__import__('mpi4py').__version__}"
        f" | numpy {np.__version__}")
    say(f"# {comm.size} ranks on {len(set(MPI.COMM_WORLD.allgather(MPI.Get_processor_name())))}"
        f" host(s) | dtype {dtype} | op {args.op} | root {args.root} | {args.iters} iterations"
        f" after {args.warmup_iters} warm-up | time: median over iterations of the slowest"
        f" rank, barrier-separated")
    say(f"# vs_native: the time of the MPI library's collective called directly ({MPI_LIBRARY})"
        " / this row's time (>1: faster than the library); 'native' is that collective"
        " called through mpicoll")
    wrong_total = 0
    for collective in collectives:
        names = [MPI_LIBRARY, *mpicoll.algorithms(collective), "auto"]
        if args.algo != "all":  # the library's row stays: it is what vs_native divides
            names = [MPI_LIBRARY, *(n for n in args.algo.split(",") if n != MPI_LIBRARY)]
        record = RECORDS[collective]
        say(f"\n# {collective}")
        checker = "native"
        if record.reduces and not comm._native_serves(resolve_op(args.op, dtype), dtype):
            # the MPI library cannot reduce this dtype (bfloat16): no library rows, and
            # results are checked against an algorithm that combines in rank order
            names = [n for n in names if n not in (MPI_LIBRARY, "native")]
            checker = next(a.name for a in REGISTRY[collective].values() if not a.commutative_only)
            say(f"# the MPI library cannot reduce {dtype}: no {MPI_LIBRARY}/native rows; "
                f"results checked against {checker}")
        say(f"# {'size(B)':>12} {'count':>12} {'type':>8} {'redop':>6} {'root':>4} "
            f"{'algorithm':>20} {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} "
            f"{'vs_native':>9}")
        for nbytes in sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor):
            x = make_input(comm, collective, nbytes, dtype, args.op)
            count = x.size * comm.size if record.per_rank else x.size
            call = make_call(comm, collective, x, args.op, args.root)
            library = library_call(comm, collective, x, args.op, args.root)
            reference = call(checker) if args.check else None
            reference = None if reference is None else reference.copy()
            results = {}
            for name in names:
                if name == MPI_LIBRARY:  # its result is the reference itself
                    run, wrong = library, 0
                else:
                    run = functools.partial(call, name)
                    wrong = count_wrong(comm, run(), reference) if args.check else 0
                wrong_total += wrong
                times = time_calls(comm, run, args.iters, args.warmup_iters,
                                   lambda: comm.barrier(algorithm="native"))
                results[name] = (statistics.median(times), wrong)
            native = results.get(MPI_LIBRARY, results.get("native", (math.nan, 0)))[0]
            size = count * dtype.itemsize
            for name, (seconds, wrong) in results.items():
                algbw = size / seconds / 1e9 if seconds > 0 else 0.0
                busbw = algbw * record.busbw_factor(comm.size)
                say(f"  {size:>12} {count:>12} {dtype.name:>8} "
                    f"{args.op if record.reduces else 'none':>6} "
                    f"{args.root if record.rooted else -1:>4} {name:>20} {seconds * 1e6:>10.1f} "
                    f"{algbw:>7.2f} {busbw:>7.2f} {wrong:>6} {native / seconds:>9.2f}")
            sys.stdout.flush()
    say(f"\n# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
    return 1 if wrong_total else 0
