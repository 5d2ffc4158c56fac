"""Run an example's main so that one failing rank aborts the whole job.

``launch`` installs ``mpicoll.abort_on_exception()``: an uncaught exception on any rank,
in any thread, prints its traceback and one line (``mpicoll: uncaught exception on rank
R; aborting the job (exit code 70)``) and calls ``MPI_Abort``, as ``python -m mpi4py``
does, instead of leaving the other ranks waiting forever in a collective that rank will
never join.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable


def launch(main: Callable[[], object]) -> None:
    import mpicoll

    mpicoll.abort_on_exception()
    try:
        main()
    except SystemExit as exc:
        # 2: a bad command line, which every rank parsed alike and left the same way
        if exc.code not in (None, 0, 2):
            from mpicoll.observe.watchdog import abort_job

            abort_job(exc.code if isinstance(exc.code, int) else 1)
        raise
    # any other exception leaves here, to sys.excepthook: abort_on_exception's


def check(ok: object, what: str) -> None:
    """The examples' checks: raise unless ``ok`` (an ``assert`` would vanish under
    ``python -O``, and the example would then print a pass line it never checked)."""
    if not ok:
        raise AssertionError(f"check failed: {what}")


def same(got: object, expected: object, what: str) -> None:
    """``got`` is ``expected``: None where that is None, else an equal array of its shape."""
    import numpy as np

    if expected is None:
        check(got is None, f"{what}: expected None, got {got!r}")
        return
    check(got is not None and np.shape(got) == np.shape(expected)
          and np.array_equal(got, expected), f"{what}: got {got!r}, expected {expected!r}")


def print_in_rank_order(comm: object, title: str, text: str, width: int = 96) -> None:
    """Rank 0 prints ``title``, then every rank's ``text`` (one line: its line breaks as
    spaces; a longer one cut at a space before ``width``, ending "...") in rank order:
    the lines travel to rank 0 with a gather, so they never interleave."""
    import numpy as np

    text = " ".join(text.split())  # (NumPy's arrays print over several lines)
    if len(text) > width:
        cut = text.rfind(" ", 0, width - 3)
        text = text[:cut if cut > 0 else width - 3] + "..."
    line = np.frombuffer(text.ljust(width)[:width].encode("ascii", "replace"), np.uint8)
    lines = comm.gather(line, 0)
    if comm.rank == 0:
        print(f"\n{title}")
        for r, row in enumerate(lines):
            print(f"  rank {r}: {row.tobytes().decode().rstrip()}")


def parser_for(doc: str) -> argparse.ArgumentParser:
    """An example's argument parser: its ``--help`` shows the whole docstring (what the
    example teaches and how to run it)."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def megabytes(text: str) -> float:
    """An argparse type: a number of megabytes of at least one byte (a bucket's cap)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value * 2**20 >= 1:  # (nan too)
        raise argparse.ArgumentTypeError(f"{text}: must be at least one byte (1e-6 MB)")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number of MB")
    return value


def _whole(text: str, least: int, said: str) -> int:
    """``text`` as a whole number of at least ``least`` (else argparse's error: ``said``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value}: {said}")
    return value


def seed(text: str) -> int:
    """An argparse type: a random seed, a whole number >= 0 (NumPy's generators refuse
    a negative one)."""
    return _whole(text, 0, "a seed is at least 0")


def widths(text: str) -> list[int]:
    """An argparse type: comma-separated layer widths, at least two, each at least 1."""
    parts = text.split(",")
    if len(parts) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: at least two widths (input, output), "
                                         "comma-separated")
    return [positive(part.strip()) for part in parts]


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a size, a count of steps)."""
    return _whole(text, 1, "must be at least 1")


def algorithm_option(description: str) -> Callable[[str], str]:
    """Parse ``--algorithm NAME`` (default auto); return collective -> the algorithm to run:
    NAME where the collective has an algorithm of that name, else "auto". A name no
    collective has is refused: one line on rank 0, and the job ends with status 2.
    ``description``: the example's docstring."""
    import mpicoll

    parser = parser_for(description)
    parser.add_argument("--algorithm", default="auto",
                        help="run every collective that has an algorithm of this name with it")
    chosen = parser.parse_args().algorithm
    known = {"auto"} | {name for c in mpicoll.COLLECTIVES for name in mpicoll.algorithms(c)}
    if chosen not in known:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() == 0:
            sys.stderr.write(f"{parser.prog}: error: --algorithm {chosen!r}: no collective has "
                             f"it; choose from {', '.join(sorted(known))}\n")
        sys.exit(2)
    return lambda collective: chosen if chosen in mpicoll.algorithms(collective) else "auto"


def algorithm_ran(comm: object, collective: str, algorithm: str, nbytes: int,
                  op: str | None = None, dtype: object = None) -> str:
    """The algorithm a call ran, for a title: the name, or what "auto" picked."""
    if algorithm != "auto":
        return algorithm
    return f"auto: {comm.auto_algorithm(collective, nbytes, op, dtype)}"
