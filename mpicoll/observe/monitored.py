"""``Communicator.monitored_barrier``: a barrier that names the ranks that did not come.

As torch.distributed's: every rank tells rank 0 it arrived; rank 0 waits for them until
the timeout (for all of them with ``wait_all_ranks=True``, else until the first one
missing), then tells every rank which ranks did not arrive in time, and every rank that
gets the answer raises ``CollectiveTimeoutError`` naming them. A rank that arrives late
gets the same answer (it names that rank) and raises too; where rank 0 is the late one,
the ranks that gave up waiting for its answer tell it so, and it raises too. The call's
``timeout`` governs it even past the Communicator's (the watchdog then allows it that
long). In check mode every rank first waits for the last in the call's fingerprint
exchange; each then tells how long it waited there, and a rank that came later than the
others by more than rank 0's timeout is named on every rank. Messages are one int64 per
rank on the control transport, on the call's side tag (its tag in the range no call's
data uses, as the pipeline's resync), so a rank that skipped the barrier for another call
of the same number is never taken for one that arrived; on thread-ranks, whose messages
between two ranks come in order, with the call's own tag (such a rank's message then
fails the barrier's check of tag and length, naming it).
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
    if timeout is None:  # (rank 0's, agreed when the Communicator was made: each rank's
        timeout = c._rank0_timeout or float("inf")  # own would blame the wrong rank)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        verdict.refuse("params", InvalidArgumentError(
            f"timeout: expected seconds > 0, got {timeout!r}"))
    t, watch = c._backend.control, c._watch
    missing = np.full(t.size, -1, np.int64)  # the ranks that did not arrive, then -1s
    saved = watch.timeout  # the call's own timeout governs it, past the Communicator's
    if saved and verdict.first is None:  # (the watchdog ends it if that fails; where the
        # timeout is none, rank 0's, this rank's watchdog must not end what rank 0 waits)
        watch.timeout = 0 if timeout == float("inf") else max(saved, 2 * timeout + 1 + GRACE)
    try:
        # check mode compares the call first (every rank waits for the last there: each
        # tells how long it waited, and a rank that came later than the others by more
        # than the timeout is named on every rank); otherwise a bad timeout raises here
        arrived_at = time.monotonic()
        agree.settle(c, call, verdict, ("monitored", {"wait_all_ranks": bool(wait_all_ranks)}))
        if c.check:  # (each rank's wait and timeout; rank 0's timeout decides, as below)
            table = np.zeros((t.size, 2), np.float64)
            table[t.rank] = time.monotonic() - arrived_at, timeout
            agree.all_gather(c, table.reshape(-1), 2)
            waited, timeout = table[:, 0], float(table[0, 1])
            late = [r for r in range(t.size) if waited.max() - waited[r] > timeout]
            late = late if wait_all_ranks else late[:1]
            missing[:len(late)] = late
        elif not c._backend.ranks_are_threads:  # (on MPI: the call's side tag)
            saved_tag, t.tag = t.tag, t.tag + t.side_tags
            try:
                _arrivals(call, t, timeout, wait_all_ranks, missing)
            finally:
                t.tag = saved_tag
        else:
            _arrivals(call, t, timeout, wait_all_ranks, missing)
    finally:
        watch.timeout = saved
    late = missing[missing >= 0].tolist()
    if late:
        which = "rank " + str(late[0]) if len(late) == 1 else "ranks " + ", ".join(map(str, late))
        raise CollectiveTimeoutError(
            f"{call.name()}: {which} did not arrive within {timeout:g} s"
            + ("" if wait_all_ranks else " (the first one missing; wait_all_ranks=True "
               "names all)"))


def _arrivals(call: Any, t: Any, timeout: float, wait_all_ranks: bool,
              missing: np.ndarray) -> None:
    """Every rank tells rank 0 it arrived; rank 0 answers with the ranks that did not
    (into ``missing``): see the module's docstring."""
    arrived = np.zeros(1, np.int64)
    if t.rank == 0:
        deadline = time.monotonic() + timeout
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
