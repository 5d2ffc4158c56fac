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

from .watchdog import EXIT_UNCAUGHT, dump_and_abort, world_rank

_INSTALLED = False


def _abort_after(print_exception: Any) -> Any:
    def hook(*args: Any) -> None:
        print_exception(*args)  # the traceback first, as Python prints it
        # (a moment before MPI_Abort: every rank that raised prints its traceback, and
        # the launcher forwards it, before the first abort kills them all)
        dump_and_abort([f"mpicoll: uncaught exception on rank {world_rank(0)}; aborting the "
                        f"job (exit code {EXIT_UNCAUGHT})"], "uncaught exception",
                       world_rank(0), EXIT_UNCAUGHT, grace=0.2)

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
