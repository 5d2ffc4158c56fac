"""A job that goes wrong on purpose, for tests/test_hangs.py (run under mpiexec).

    mpiexec -n 4 python tests/hang_job.py SCENARIO [--abort]

Every rank makes calls #1 and #2 (all_reduce), then rank 1 (the culprit) goes wrong in
or before call #3; the others make call #3 as usual. ``--abort`` installs
``mpicoll.abort_on_exception()``. The job must end through mpicoll's timeout
(MPICOLL_TIMEOUT, a few seconds) or its abort, never hang.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import mpicoll

CULPRIT = 1


def failing_op(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    raise ValueError("failing_op cannot combine these")


def main(scenario: str) -> None:
    comm = mpicoll.Communicator()
    x = np.ones(1000)
    for _ in range(2):  # calls #1 and #2
        comm.all_reduce(x, algorithm="ring")
    stamps = os.environ.get("HANG_JOB_STAMPS")
    if stamps:  # when this rank reached the scenario (the host's monotonic clock)
        with open(os.path.join(stamps, f"scenario-{comm.rank}"), "w") as f:
            f.write(repr(time.monotonic()))
    culprit = comm.rank == CULPRIT
    timeout = comm.timeout
    if scenario == "monitored_barrier":
        if comm.rank == 2:
            time.sleep(2 * timeout)
        comm.monitored_barrier(timeout=timeout / 2, wait_all_ranks=True)
    elif scenario == "async":
        comm.all_reduce(x, algorithm="ring", async_op=True).wait()  # call #1 of the progress thread
        if comm.rank == 0:  # its call #2 never completes: nobody else makes it
            comm.all_reduce(x, algorithm="ring", async_op=True).wait()
        else:
            time.sleep(3 * timeout)
        return
    elif scenario == "wait_timeout":
        # rank 1 is stopped (SIGSTOP); the others' wait() gives up before the watchdog
        # and the exception leaves the script: exiting must still end the job
        comm.all_reduce(x, algorithm="ring", async_op=True).wait()  # the progress comm's #1
        if culprit:
            os.kill(os.getpid(), signal.SIGSTOP)
        comm.all_reduce(x, algorithm="ring", async_op=True).wait(timeout=timeout / 3)
        return
    elif scenario == "unwaited":
        # every rank but 1 queues a call and leaves without waiting for it; rank 1 leaves
        comm.all_reduce(x, algorithm="ring", async_op=True).wait()  # the progress comm's #1
        if not culprit:
            comm.all_reduce(x, algorithm="ring", async_op=True)
        return
    elif culprit and scenario == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif culprit and scenario == "raise":
        raise RuntimeError("rank 1 fails between calls")
    elif culprit and scenario == "exit0":
        sys.exit(0)
    elif culprit and scenario == "sleep":
        time.sleep(3 * timeout)
    elif scenario == "monitored_long":  # rank 2 is 4 s late to a 10 s monitored barrier
        if comm.rank == 2:
            time.sleep(4)
        comm.monitored_barrier(timeout=10)
    elif scenario == "late_communicator":
        # making a Communicator is collective (MPI_Comm_dup, the exchange of nodes) before
        # the new one has a watch of its own: rank 1 comes too late to it
        if culprit:
            time.sleep(3 * timeout)
        mpicoll.Communicator()
    elif scenario.startswith("short_input:"):
        # call #3: rank 1's x is one element short (its buffer, which only it sees);
        # a rank that gets a result says whether it is right: none may be wrong
        n = x.size - 1 if culprit else x.size
        try:
            got = comm.all_reduce(np.full(n, comm.rank + 1.0),
                                  algorithm=scenario.split(":")[1])
        except mpicoll.MpicollError as exc:
            print(f"RAISED rank {comm.rank}: {type(exc).__name__}: {exc}", flush=True)
        else:
            right = got.size == x.size and bool((got == sum(range(1, comm.size + 1))).all())
            print(f"RESULT rank {comm.rank}: {'right' if right else 'wrong'}", flush=True)
        comm.all_reduce(x, algorithm="ring")
    elif culprit and scenario == "mismatch":
        comm.all_gather(x, algorithm="ring")
    elif scenario == "refuse_native":
        # call #3 with the MPI library's own all_reduce; rank 1 refuses its input alone
        # (it raises at once), then makes call #4: it must never be matched with the
        # others' call #3, which MPI would do for two native collectives
        if culprit:
            try:
                comm.all_reduce("not an array", algorithm="native")
            except mpicoll.InvalidArgumentError:
                pass
        got = comm.all_reduce(np.full(4, comm.rank + 1.0), algorithm="native")
        print(f"RESULT rank {comm.rank}: {got[0]}", flush=True)  # must never print
        return
    elif scenario in ("refuse_then_plan", "refuse_then_async", "refuse_then_dup",
                      "refuse_then_bucketer"):
        # rank 1 refuses call #3 alone, then makes a plan (its vote is MPI's own
        # Allgather) or a first async call (its progress thread's duplicate is MPI's
        # Comm_dup): the owed check comes first, never MPI's collective the others' call
        # #3 would match
        if culprit:
            try:
                comm.all_reduce("not an array", algorithm="native")
            except mpicoll.InvalidArgumentError:
                pass
            if scenario == "refuse_then_plan":
                comm.all_reduce_init(x, algorithm="native")
            elif scenario == "refuse_then_dup":  # (MPI_Comm_dup)
                comm.dup()
            elif scenario == "refuse_then_bucketer":  # (its duplicate of comm)
                mpicoll.Bucketer(comm, [x])
            else:
                comm.all_reduce(x, async_op=True).wait()
        else:
            comm.all_reduce(x, algorithm="native")
        print(f"RESULT rank {comm.rank}", flush=True)  # never on rank 1
        return
    elif scenario == "plan_started":
        # a native plan's start() is MPI_Start (call #3): the others wait in its wait(),
        # where rank 1 never started it
        plan = comm.all_reduce_init(x, algorithm="native")
        if culprit:
            time.sleep(3 * timeout)
        plan.start()
        plan.wait()
        return
    elif scenario in ("plan_test_loop", "plan_unwaited"):
        # a native plan's start() (MPI_Start, call #3) that rank 1 never makes: the others
        # poll test() (no call of theirs runs meanwhile), or exit without waiting; the
        # start is timed as a call until waited for, and waited for at exit
        plan = comm.all_reduce_init(x, algorithm="native")
        if culprit:
            time.sleep(4 * timeout)
            return
        plan.start()
        if scenario == "plan_test_loop":
            while not plan.test():
                time.sleep(0.01)
            print(f"RESULT rank {comm.rank}", flush=True)  # must never print
        return
    elif scenario == "plan_freed":
        # a native plan started (MPI_Start) by every rank but 1, then the Communicator
        # freed without a wait: free() waits for the start to end (MPI forbids freeing
        # an active request), a wait the watchdog bounds
        plan = comm.all_reduce_init(x, algorithm="native")
        if culprit:
            time.sleep(3 * timeout)
        else:
            plan.start()
        comm.free()
        return
    elif scenario in ("plan_vote", "plan_persistent"):
        # a native all_reduce plan: making it votes on MPI's persistent request
        # (plan_vote: rank 1 never comes to it) and makes it; its first start is call #3,
        # each its Start and Wait (plan_persistent: rank 1 never comes to the fourth)
        if scenario == "plan_vote" and culprit:
            time.sleep(3 * timeout)
        plan = comm.all_reduce_init(x, algorithm="native")
        plan()
        if scenario == "plan_persistent":
            plan()
            plan()
        if culprit:
            time.sleep(3 * timeout)
        plan()
        return
    elif scenario == "slow_op":
        # rank 1's op takes longer than the timeout, after its first message arrived:
        # it computes, it waits for no one (the others wait for it)
        def slow_op(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
            if culprit:
                time.sleep(3 * timeout)
            np.add(a, b, out=out)

        comm.all_reduce(x, mpicoll.Op(slow_op, commutative=True, name="slow_op"),
                        algorithm="ring")
    elif scenario == "check_skip":
        # in check mode every call first compares the ranks' calls: rank 1 never comes
        checked = mpicoll.Communicator(check=True)
        if culprit:
            time.sleep(3 * timeout)
        checked.all_reduce(x, algorithm="ring")
    elif scenario == "user_op":
        op = mpicoll.Op(failing_op if culprit else np.add, commutative=True, name="failing_op")
        try:
            comm.all_reduce(x, op, algorithm="ring")
        except mpicoll.errors.OpError as exc:
            # every rank writes its line (one write: atomic on the shared pipe) before any
            # leaves, as mpiexec kills the others when one exits 1
            os.write(2, f"mpicoll.errors.OpError: {exc}\n".encode())
            comm.barrier()  # call #4: the call after a failed op matches on every rank
            sys.exit(1)
    else:
        comm.all_reduce(x, algorithm="ring")  # call #3 of the others
    comm.all_reduce(x, algorithm="ring")  # call #4: the culprit never gets here in time


if __name__ == "__main__":
    if "--abort" in sys.argv:
        mpicoll.abort_on_exception()
    main(sys.argv[1])
