"""``Communicator.monitored_barrier``: a barrier that names the ranks that did not come.

As torch.distributed's: every rank tells rank 0 it arrived; rank 0 waits for them until
the timeout (for all of them with ``wait_all_ranks=True``, else until the first one
missing), then tells every rank which ranks did not arrive in time, and every rank that
gets the answer raises ``CollectiveTimeoutError`` naming them. A rank that arrives late
gets the same answer (it names that rank) and raises too; where rank 0 is the late one,
the ranks that gave up waiting for its answer tell it so, and it raises too. The call's
``timeout`` governs it even past the Communicator's (the watchdog then allows it that
long). Messages are one int64 per rank on the control transport, with the call's own
tag, which no later call uses.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import CollectiveTimeoutError, InvalidArgumentError
from ..pipeline import agree
from ..pipeline.validate import Verdict

GRACE = 5.0  # seconds past a monitored barrier's own bound before the watchdog ends it
GAVE_UP = 2  # a rank's second note to rank 0: it stopped waiting for rank 0's answer


def monitored_barrier(c: Any, call: Any, timeout: float | None, wait_all_ranks: bool) -> None:
    """The body of ``Communicator.monitored_barrier`` (see the module's docstring)."""
    verdict = Verdict()
    if timeout is None:
        timeout = c.timeout or float("inf")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        verdict.refuse("params", InvalidArgumentError(
            f"timeout: expected seconds > 0, got {timeout!r}"))
    # check mode compares the call first; otherwise a bad timeout raises before any message
    agree.settle(c, call, verdict, ("monitored", {"wait_all_ranks": bool(wait_all_ranks)}))
    t, watch = c._backend.control, c._watch
    missing = np.full(t.size, -1, np.int64)  # the ranks that did not arrive, then -1s
    saved = watch.timeout  # the call's own timeout governs it, past the Communicator's
    if saved and timeout != float("inf"):  # (the watchdog ends it only if that fails)
        watch.timeout = max(saved, 2 * timeout + 1 + GRACE)
    try:
        if t.rank == 0:
            deadline = time.monotonic() + timeout
            arrived = np.zeros(1, np.int64)
            late, came = [], []
            for r in range(1, t.size):
                if t.try_recv(arrived, r, deadline - time.monotonic()):
                    came.append(r)
                else:
                    late.append(r)
                    if not wait_all_ranks:
                        break
            missing[:len(late)] = late
            for r in range(1, t.size):
                t.post(missing, r)
            # ranks that gave up waiting for the answer said so: rank 0 itself came late
            # (a note sent after their arrival, on this call's tag)
            gave_up = [r for r in came if t.try_recv(arrived, r, 0.0) and arrived[0] == GAVE_UP]
            if gave_up:
                raise CollectiveTimeoutError(
                    f"{call.name()}: rank 0 (this rank) came too late: rank(s) "
                    f"{', '.join(map(str, gave_up))} gave up waiting for its answer")
        else:
            t.post(np.ones(1, np.int64), 0)
            if not t.try_recv(missing, 0, 2 * timeout + 1):  # rank 0 waits up to timeout
                t.post(np.full(1, GAVE_UP, np.int64), 0)  # (rank 0, late, learns it was)
                raise CollectiveTimeoutError(
                    f"{call.name()}: rank 0 did not arrive within {2 * timeout + 1:g} s "
                    f"(rank {t.rank} waited for its answer)")
    finally:
        watch.timeout = saved
    late = missing[missing >= 0].tolist()
    if late:
        which = "rank " + str(late[0]) if len(late) == 1 else "ranks " + ", ".join(map(str, late))
        raise CollectiveTimeoutError(
            f"{call.name()}: {which} did not arrive within {timeout:g} s"
            + ("" if wait_all_ranks else " (the first one missing; wait_all_ranks=True "
               "names all)"))
