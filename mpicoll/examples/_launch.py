"""Run an example's main so that one failing rank aborts the whole job.

Like ``python -m mpi4py``: an exception on any rank prints its traceback and calls
``MPI.COMM_WORLD.Abort(1)``, instead of leaving the other ranks waiting forever in a
collective that rank will never join.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable


def launch(main: Callable[[], object]) -> None:
    from mpi4py import MPI

    try:
        main()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            MPI.COMM_WORLD.Abort(exc.code if isinstance(exc.code, int) else 1)
        raise
    except BaseException:
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"[rank {rank}] failed; aborting the job\n{traceback.format_exc()}")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def print_in_rank_order(comm: object, title: str, text: str, width: int = 96) -> None:
    """Rank 0 prints ``title``, then every rank's ``text`` (one line, cut at ``width``) in
    rank order: the lines travel to rank 0 with a gather, so they never interleave."""
    import numpy as np

    line = np.frombuffer(text.ljust(width)[:width].encode("ascii", "replace"), np.uint8)
    lines = comm.gather(line, 0)
    if comm.rank == 0:
        print(f"\n{title}")
        for r, row in enumerate(lines):
            print(f"  rank {r}: {row.tobytes().decode().rstrip()}")


def algorithm_option(description: str) -> Callable[[str], str]:
    """Parse ``--algorithm NAME`` (default auto); return collective -> the algorithm to run:
    NAME where the collective has an algorithm of that name, else "auto"."""
    import argparse

    import mpicoll

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--algorithm", default="auto",
                        help="run every collective that has an algorithm of this name with it")
    chosen = parser.parse_args().algorithm
    return lambda collective: chosen if chosen in mpicoll.algorithms(collective) else "auto"
