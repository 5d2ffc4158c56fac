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
