"""Run a function on N ranks that are threads of this process: tests, teaching, dry runs.

    from mpicoll.local import run_local
    results = run_local(4, lambda comm: comm.all_reduce(np.arange(3) * comm.rank))
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .communicator import Communicator
from .errors import AbortedError, InvalidArgumentError
from .observe.watchdog import timeout_setting
from .transport.local import LocalWorld


def run_local(size: int, fn: Callable[..., Any], *args: Any,
              timeout: float | Sequence[float] | None = None,
              **communicator_kwargs: Any) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``size`` thread-ranks and return each rank's result.

    ``comm`` is an ``mpicoll.Communicator`` on the local backend. If any rank raises, the
    others stop waiting and the first exception (by rank) is raised here. ``timeout``:
    seconds a blocking wait may take (a waiting receive then raises
    ``CollectiveTimeoutError``); default ``MPICOLL_TIMEOUT`` where it is set (a malformed
    one: ``ConfigError``), else a minute; 0: no limit. A sequence: each rank's own, as its
    Communicator's ``timeout`` (the rank that times out first gives up the whole world:
    to read one rank's timeout, give it the shortest).
    """
    per_rank = None
    if isinstance(timeout, Sequence) and not isinstance(timeout, (str, bytes)):  # ("5":
        # no seconds, refused as such below)
        if len(timeout) != size:
            raise InvalidArgumentError(f"timeout: a sequence gives each rank's own: expected "
                                       f"{size} of them, got {len(timeout)}")
        seconds = [timeout_setting(t) for t in timeout]  # (ConfigError on a bad one)
        per_rank = [{"timeout": t} for t in seconds]
        timeout = 0.0 if 0 in seconds else max(seconds)  # the world's: the longest (0: none)
    world = LocalWorld(size, timeout)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def body(rank: int) -> None:
        try:
            comm = Communicator(world.endpoint(rank), backend="local", **communicator_kwargs,
                                **(per_rank[rank] if per_rank else {}))
            results[rank] = fn(comm, *args)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors[rank] = exc
            world.aborted.set()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # what went wrong first, not the others' "another rank failed" (AbortedError itself:
    # a rank's timeout, CollectiveTimeoutError, is one of its kind, and is what went wrong)
    first = next((e for e in errors if e is not None and type(e) is not AbortedError),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results
