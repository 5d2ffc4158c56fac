"""End the whole job at once: when a call times out, or when one rank raises.

``abort_on_exception()`` makes an uncaught exception on any rank, in any thread, end the
job (as ``python -m mpi4py script.py`` does) instead of leaving the other ranks waiting
for the rank that left. Use it in scripts and jobs; leave it out where a rank should
survive an exception (an interactive session, a test runner that reports failures).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .watchdog import (
    EXIT_UNCAUGHT,
    abort_job,
    dump_dir,
    mark,
    report,
    watchdog,
    world_rank,
    write_dump,
)

_INSTALLED = False


def _abort_after(print_exception: Any) -> Any:
    def hook(*args: Any) -> None:
        print_exception(*args)  # the traceback first, as Python prints it
        lines = [f"mpicoll: uncaught exception on rank {world_rank(0)}; aborting the job "
                 f"(exit code {EXIT_UNCAUGHT})"]
        if dump_dir():
            path = write_dump(watchdog(), "uncaught exception")
            mark(world_rank(0))
            lines.append(f"mpicoll: flight recorder written to {path}")
        report("\n".join(lines))
        # a moment before MPI_Abort: every rank that raised prints its traceback, and the
        # launcher forwards it, before the first abort kills them all; with dumps, long
        # enough for the others' watchdogs, which look for the mark once a second at most,
        # to write theirs (as a timeout's abort waits)
        abort_job(EXIT_UNCAUGHT, grace=1.5 if dump_dir() else 0.2)

    return hook


def abort_on_exception() -> None:
    """Install ``sys.excepthook`` and ``threading.excepthook`` so that an uncaught
    exception on this rank prints its traceback and then aborts the whole job with exit
    code ``EXIT_UNCAUGHT`` (70). Calling it again changes nothing."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    sys.excepthook = _abort_after(sys.excepthook)
    thread_hook = _abort_after(threading.excepthook)

    def in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:  # a thread's sys.exit() ends only the thread
            return
        thread_hook(args)

    threading.excepthook = in_thread
