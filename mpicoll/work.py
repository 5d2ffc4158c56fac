"""Asynchronous collectives: ``comm.all_reduce(x, async_op=True)`` returns a ``Work``.

How communication progresses while the caller computes: a progress thread per
communicator runs the asynchronous calls, one after another in the order they were
made, on a duplicate of the communicator (its own MPI communicator, or its own local
world), so their messages never match the caller's own blocking calls. Why a thread and
not nonblocking state machines: every algorithm is written once as straight-line code over
point-to-point messages, as the textbook gives it; a thread runs each one unchanged, and
mpi4py's blocking calls and NumPy's reductions release the GIL, so the thread moves and
reduces data while the caller's NumPy code runs. It needs MPI_THREAD_MULTIPLE (what
mpi4py asks for by default). Order: every rank makes its asynchronous calls in the same
order (as MPI requires of collectives), so one thread per rank running them in that order
matches them across ranks; handles may be waited on in any order.

On the NCCL backend an asynchronous call is queued on the CUDA stream as every NCCL call
is; its ``Work`` waits for a CUDA event recorded after it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import CollectiveTimeoutError
from .watchdog import timeout_setting

_UNSET = object()


class Work:
    """The handle of an asynchronous collective.

    ``wait()`` blocks until the collective has finished on this rank and returns its result
    (what the blocking call returns), or raises what the blocking call would have raised.
    ``test()`` and ``done`` tell, without blocking, whether it has finished. ``wait`` is
    bounded by the Communicator's timeout (``timeout``; 0: unbounded) plus ``GRACE``
    seconds, so that the watchdog, which times the call itself, reports it first.
    """

    GRACE = 5.0

    def __init__(self, what: str, timeout: float | None = None) -> None:
        self.what = what
        self.timeout = timeout_setting(timeout)
        self._finished = threading.Event()
        self._result: Any = _UNSET
        self._error: BaseException | None = None
        self._event: Any = None  # NCCL: a CUDA event after the call
        self.started_at = self.finished_at = float("nan")  # time.perf_counter() on this rank

    def _set(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self.finished_at = time.perf_counter()
        self._finished.set()

    @property
    def done(self) -> bool:
        if self._event is not None and self._finished.is_set() and self._error is None:
            return bool(self._event.done)
        return self._finished.is_set()

    def test(self) -> bool:
        """True once the collective has finished (``wait`` would not block)."""
        return self.done

    is_completed = test  # torch.distributed's name

    def wait(self, timeout: float | None = None) -> Any:
        """The collective's result, once it has finished.

        Raises:
            CollectiveTimeoutError (a TimeoutError): not finished within ``timeout``
                seconds (default: the Communicator's timeout, plus ``GRACE``).
        """
        seconds = (self.timeout and self.timeout + self.GRACE) if timeout is None else timeout
        deadline = time.monotonic() + seconds if seconds else float("inf")
        if not self._finished.wait(None if deadline == float("inf") else seconds):
            raise CollectiveTimeoutError(f"{self.what}: not finished after {seconds:g} s")
        if self._error is not None:
            raise self._error
        if self._event is not None:  # NCCL: the call is queued on a stream
            while not self._event.done:
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(
                        f"{self.what}: the GPU has not finished it after {seconds:g} s")
                time.sleep(0.0001)
        return self._result

    def __repr__(self) -> str:
        state = "done" if self._finished.is_set() else "pending"
        return f"<mpicoll.Work {self.what} {state}>"


class ProgressThread:
    """Runs a communicator's asynchronous calls in order on a duplicate of it."""

    def __init__(self, duplicate: Any) -> None:
        self.comm = duplicate
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="mpicoll-progress", daemon=True)
        self._thread.start()

    def submit(self, name: str, call: Callable[[Any], Any]) -> Work:
        work = Work(name, self.comm.timeout)
        self._calls.put((work, call))
        return work

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            work, call = item
            item = None
            work.started_at = time.perf_counter()
            try:
                work._set(call(self.comm))
            except BaseException as exc:  # noqa: BLE001 - handed to wait() on this rank
                work._set(error=exc)
            work = call = None  # nothing of the call (its op, its input) outlives it here

    def close(self) -> None:
        """Finish what was submitted, then stop the thread and free the duplicate."""
        self._calls.put(None)
        self._thread.join()
        self.comm.free()


def queued_on_stream(name: str, call: Callable[[Any], Any], stream: Any) -> Work:
    """An asynchronous call on a backend that queues its work on a CUDA stream (NCCL):
    ``call(stream)`` now, on ``stream`` (default: the current one), and a CUDA event
    recorded after it, which ``wait()`` synchronizes; a failure is raised by ``wait()``,
    as on the MPI backend."""
    from .arrays import cupy_module

    cuda = cupy_module().cuda
    work = Work(name)
    current = stream if stream is not None else cuda.get_current_stream()
    try:
        result = call(current)
        work._event = cuda.Event(block=False, disable_timing=True)
        work._event.record(current)
        work._set(result)
    except Exception as exc:  # noqa: BLE001 - raised by wait()
        work._set(error=exc)
    return work
