"""``Communicator.monitored_barrier``: a barrier that names the ranks that did not come.

As torch.distributed's: every rank tells rank 0 it arrived; rank 0 waits for them until
the timeout (for all of them with ``wait_all_ranks=True``, else until the first one
missing), then tells every rank which ranks did not arrive in time, and every rank that
gets the answer raises ``CollectiveTimeoutError`` naming them. A rank that arrives late
gets the same answer (it names that rank) and raises too. Where none is missing, rank 0
may be the late one: each rank tells it how long it waited for the answer, rank 0 takes
its own wait from theirs (how much later it came than each: no clocks compared) and
tells every rank its verdict, so a rank 0 later than another by more than its timeout is
named on every rank; a rank that gave up waiting for the answer (after twice its
timeout and a second) said so, and is named with it. Rank 0's timeout decides; a rank
whose ``timeout=`` is bad takes part as with none given, then raises. The call's
``timeout`` governs it even past the Communicator's (the watchdog then allows it that
long). In check mode every rank first waits for the last in the call's fingerprint
exchange; each then tells how long it waited there, and a rank that came later than the
others by more than rank 0's timeout is named on every rank. Messages are float64 notes
on the control transport, on the call's side tag (its tag in the range no call's data
uses, as the pipeline's resync), so a rank that skipped the barrier for another call of
the same number is never taken for one that arrived; on thread-ranks, whose messages
between two ranks come in order, with the call's own tag (such a rank's message then
fails the barrier's check of tag and length, naming it).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import numpy as np

from ..errors import CollectiveTimeoutError, InvalidArgumentError
from ..pipeline import agree
from ..pipeline.validate import Verdict

GRACE = 5.0  # seconds past a monitored barrier's own bound before the watchdog ends it


def monitored_barrier(c: Any, call: Any, timeout: float | None, wait_all_ranks: bool) -> None:
    """The body of ``Communicator.monitored_barrier`` (see the module's docstring)."""
    verdict = Verdict()
    if isinstance(timeout, timedelta):  # (as torch's, and mpicoll.dist's)
        timeout = timeout.total_seconds()
    if timeout is None:  # (rank 0's, agreed when the Communicator was made: each rank's
        timeout = c._rank0_timeout or float("inf")  # own would blame the wrong rank)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        verdict.refuse("params", InvalidArgumentError(
            f"timeout: expected seconds > 0 (or a timedelta), got {timeout!r}"))
        if not c.check:  # this rank alone: it takes part as with no timeout=, then raises
            # (the others would name it as not arrived, and its next call resync alone)
            try:
                monitored_barrier(c, call, None, wait_all_ranks)
            except CollectiveTimeoutError as found:
                raise verdict.first from found
            raise verdict.first
    t, watch = c._backend.control, c._watch
    missing = np.full(t.size, -1, np.int64)  # the ranks that did not arrive, then -1s
    saved = watch.timeout  # the call's own timeout governs it, past the Communicator's
    if saved and verdict.first is None:  # (the watchdog ends it if that fails; where the
        # timeout is none, rank 0's, this rank's watchdog must not end what rank 0 waits)
        watch.timeout = 0 if timeout == float("inf") else max(saved, 2 * timeout + 1 + GRACE)
    try:
        # check mode compares the call first (every rank waits for the last there: each
        # tells how long it waited, and a rank that came later than the others by more
        # than the timeout is named on every rank, and a bad timeout on every rank)
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
            try:  # (rank 0's timeout, as every rank names it)
                timeout = _arrivals(call, t, timeout, wait_all_ranks, missing)
            finally:
                t.tag = saved_tag
        else:
            timeout = _arrivals(call, t, timeout, wait_all_ranks, missing)
    finally:
        watch.timeout = saved
    late = missing[missing >= 0].tolist()
    if late:
        which = "rank " + str(late[0]) if len(late) == 1 else "ranks " + ", ".join(map(str, late))
        raise CollectiveTimeoutError(
            f"{call.name()}: {which} did not arrive within {timeout:g} s"
            + ("" if wait_all_ranks else " (the first one missing; wait_all_ranks=True "
               "names all)"))


# a rank's notes to rank 0 (float64 triples: what, its seconds since it arrived, its
# timeout (-1: none)); rank 0's messages to a rank are float64 arrays of p + 3 too
ARRIVED, GAVE_UP, ANSWERED = 1.0, 2.0, 3.0


def _arrivals(call: Any, t: Any, timeout: float, wait_all_ranks: bool,
              missing: np.ndarray) -> float:
    """Every rank tells rank 0 it arrived; rank 0 answers with the ranks that did not
    (into ``missing``). Where none is missing, each rank then tells rank 0 how long it
    waited for that answer, and rank 0 tells every rank whether rank 0 itself came later
    than one of them by more than its timeout (their wait, less rank 0's own, is how
    much later it came: no clock is compared), or whether a rank gave up on its answer
    first (its timeout= shorter than rank 0's): every rank raises it alike. Returns rank
    0's timeout (its answer carries it): the one that decided."""
    p, arrived_at = t.size, time.monotonic()
    note, message = np.zeros(3, np.float64), np.full(p + 3, -1.0)
    mine = -1.0 if timeout == float("inf") else float(timeout)
    if t.rank != 0:
        note[:] = ARRIVED, 0.0, mine
        t.post(note, 0)
        if not t.try_recv(message, 0, 2 * timeout + 1):  # rank 0 waits up to its timeout
            note[:] = GAVE_UP, time.monotonic() - arrived_at, mine
            t.post(note, 0)  # (rank 0, late, learns by how much)
            raise CollectiveTimeoutError(
                f"{call.name()}: rank 0 did not arrive within {timeout:g} s (rank {t.rank} "
                f"had no answer from it in {2 * timeout + 1:g} s; unless rank 0's own "
                "timeout= is longer: give every rank the same)")
        missing[:] = message[:p]
        decided = float("inf") if message[p] < 0 else float(message[p])
        if (missing >= 0).any():
            return decided
        note[:] = ANSWERED, time.monotonic() - arrived_at, mine
        t.post(note, 0)
        if not t.try_recv(message, 0, 2 * timeout + 1):  # (sent as soon as all answered)
            raise CollectiveTimeoutError(
                f"{call.name()}: rank 0 answered, then sent no verdict within "
                f"{2 * timeout + 1:g} s")
        _raise_verdict(call, message, p)
        return decided
    deadline = arrived_at + timeout
    late, came = [], []
    for r in range(1, p):
        if t.try_recv(note, r, deadline - time.monotonic()):
            came.append(r)
        else:
            late.append(r)
            if not wait_all_ranks:
                break
    missing[:len(late)] = late
    message[:p], message[p] = missing, mine
    for r in range(1, p):
        t.post(message, r)
    if late:
        # ranks that gave up waiting for the answer said so (a note sent after their
        # arrival, on this call's tag): rank 0 itself came late, unless each gave up first
        # for a timeout= shorter than rank 0's (then the missing rank is the news)
        gave_up = []
        for r in came:
            if t.try_recv(note, r, 0.0) and note[0] == GAVE_UP:
                gave_up.append((r, float(note[2])))
        if not all(_shorter(theirs, timeout) for _, theirs in gave_up):
            raise CollectiveTimeoutError(
                f"{call.name()}: rank 0 (this rank) came too late: rank(s) "
                f"{', '.join(str(r) for r, _ in gave_up)} gave up waiting for its answer")
        return timeout
    # each rank's second note: it had the answer, or gave up on it. How much later than
    # rank r rank 0 came: r's wait less rank 0's, each until r's note (for a note that
    # was waiting here, less than that: a rank that gave up is judged by its timeout)
    later_by, after, gave_up, shorter = 0.0, -1, [], True
    for r in range(1, p):
        if not t.try_recv(note, r, 2 * timeout + 1):  # (each sends it as it is answered)
            note[:] = GAVE_UP, 0.0, -1.0  # (no word from it: as one that gave up)
        if note[0] == GAVE_UP:
            gave_up.append(r)
            shorter = shorter and _shorter(float(note[2]), timeout)
            continue
        by = float(note[1]) - (time.monotonic() - arrived_at)
        if by > later_by:
            later_by, after = by, r
    message[:] = -1.0
    message[:4] = VERDICT_OK, after, mine, later_by
    message[4:4 + len(gave_up)] = gave_up
    if gave_up:
        message[0] = VERDICT_SHORTER if shorter else VERDICT_LATE_GAVE_UP
    elif later_by > timeout:
        message[0] = VERDICT_LATE
    for r in range(1, p):
        if r not in gave_up:
            t.post(message, r)
    _raise_verdict(call, message, p)
    return timeout


def _shorter(theirs: float, timeout: float) -> bool:
    """Whether a rank that gave up on rank 0's answer did so for a timeout= shorter than
    rank 0's (its note's -1: none, never shorter), not because rank 0 came late."""
    return 0 <= theirs < timeout


VERDICT_OK, VERDICT_LATE, VERDICT_LATE_GAVE_UP, VERDICT_SHORTER = 0.0, 1.0, 2.0, 3.0


def _raise_verdict(call: Any, message: np.ndarray, p: int) -> None:
    """Raise rank 0's verdict, where it found one (see ``_arrivals``): ``message`` is
    (what, the rank rank 0 came latest after, its timeout (-1: none), how much later,
    the ranks that gave up on its answer)."""
    what, after, timeout, later_by = message[:4].tolist()
    gave_up = ", ".join(str(int(r)) for r in message[4:] if r >= 0)
    said = f"{timeout:g} s" if timeout >= 0 else "its timeout"
    if what == VERDICT_LATE:
        raise CollectiveTimeoutError(
            f"{call.name()}: rank 0 did not arrive within {said}: it came {later_by:.3g} s "
            f"after rank {int(after)}")
    if what == VERDICT_LATE_GAVE_UP:
        raise CollectiveTimeoutError(
            f"{call.name()}: rank 0 did not arrive within {said}: rank(s) {gave_up} gave "
            "up waiting for its answer")
    if what == VERDICT_SHORTER:
        raise CollectiveTimeoutError(
            f"{call.name()}: rank(s) {gave_up} gave up waiting for rank 0's answer first: "
            f"their timeout= is shorter than rank 0's ({said}); give every rank the same")
