"""``python -m mpicoll.bench tune``: measure, and write the decision table ``auto`` reads.

For each collective and size every algorithm (and ``native``) is timed; the fastest at
each size becomes a range of the table for this number of ranks, merged into the tuning
file with whatever other numbers of ranks it already holds. The table is also written in
MPICH's JSON selection format and as Open MPI tuned's rules next to it.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mpicoll import Communicator, model, tuning
from mpicoll.ops import resolve_op

from . import RECORDS, Call, library_call, make_input, nccl_size, report, time_interleaved
from .report import Progress, human


def tune(comm: Communicator, args: argparse.Namespace, sizes: list[int],
         params: model.Params, say: Callable[..., None]) -> int:
    chosen = list(RECORDS) if args.collectives == "all" else args.collectives.split(",")
    unknown = [c for c in chosen if c not in RECORDS]
    if unknown:
        say(f"# tune: unknown collective(s) {', '.join(unknown)}")
        return 2
    dtype = np.dtype(args.datatype)
    path = Path(args.output) if args.output else tuning.default_path()
    table = (tuning.TuningTable.load(path) or tuning.TuningTable()) if comm.rank == 0 else None
    progress = Progress(comm.rank == 0, len(chosen) * len(sizes))
    for collective in chosen:
        record = RECORDS[collective]
        names = [*(n for n in _candidates(comm, collective, dtype, args.op))]
        winners = []
        say(f"\n# tune {collective} at {comm.size} ranks: {', '.join(names)}")
        for nbytes in sizes:
            progress.step(f"{collective} {human(nbytes)}")
            x = make_input(comm, collective, nbytes, dtype, args.op)
            call = Call(comm, collective, x, args.op, args.root)
            runs = {name: functools.partial(call.run, name) for name in names}
            if "native" in names:  # (not where the library cannot take the dtype or op)
                runs[report.MPI_LIBRARY] = library_call(comm, collective, x, args.op, args.root)
            timed = time_interleaved(comm, runs, args.iters, args.warmup_iters,
                                     lambda: comm.barrier(algorithm="native"), args.timing)
            times = {name: statistics.median(timed[name]) for name in names}
            best = min(times, key=times.get)
            size, _ = nccl_size(record, x, comm.size)
            winners.append((size, best))
            library = (f"MPI library {statistics.median(timed[report.MPI_LIBRARY]) * 1e6:.1f} us"
                       if report.MPI_LIBRARY in timed else "the MPI library cannot take it")
            say(f"#   {human(size):>8}: {best:<20} {times[best] * 1e6:10.1f} us ({library})")
        ranges = tuning.ranges_from_winners(winners)
        if table is not None:
            table.set(collective, comm.size, ranges)
    progress.done()
    if table is None:
        return 0
    from mpi4py import MPI

    table.data["library"] = MPI.Get_library_version().splitlines()[0].strip()
    saved = table.save(path)
    mpich = saved.with_name(saved.stem + "-mpich.json")
    ompi = saved.with_name(saved.stem + "-ompi.rules")
    import json

    mpich.write_text(json.dumps(tuning.to_mpich(table), indent=2) + "\n")
    ompi.write_text(tuning.to_ompi_rules(table))
    saved = saved.resolve()
    reads = "auto reads it" if saved == tuning.default_path().resolve() else \
        f"auto reads it with MPICOLL_TUNING={saved}"
    say(f"\n# wrote {saved}: {reads}")
    say(f"# MPICH selection (MPICH 4.3 and later): "
        f"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE={mpich}")
    say(f"# Open MPI tuned: --mca coll_tuned_use_dynamic_rules 1 "
        f"--mca coll_tuned_dynamic_rules_filename {ompi}")
    return 0


def _candidates(comm: Communicator, collective: str, dtype: np.dtype, op: str) -> list[str]:
    """Every algorithm that serves this dtype and op (native when the library can)."""
    import mpicoll
    from mpicoll.selection import serves

    opd = resolve_op(op, dtype) if RECORDS[collective].reduces else None
    native_ok = comm.native_serves(opd, dtype)
    return [n for n in mpicoll.algorithms(collective)
            if serves(collective, n, opd is None or opd.commutative, native_ok, False)]
