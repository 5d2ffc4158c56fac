"""torch.distributed's Work and Future for async_op=True calls over mpicoll's Work."""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from ..buffers.arrays import is_cupy
from ..errors import InvalidArgumentError, MpicollError
from ..observe.watchdog import report
from ..pipeline.state import (
    entering_done_callback,
    in_done_callback,
    leaving_done_callback,
    waits_for_itself,
)
from ..work import on_progress_thread


class Work:
    """torch's ``dist.Work``: what ``async_op=True`` returns (a collective's or a
    point-to-point message's), for ``isinstance`` checks and type hints."""

    __slots__ = ()


class _Finished(Work):
    """torch's Work: ``wait()`` finishes the call (and copies what it received into the
    caller's tensors) and returns True; ``is_completed()`` does so once it has ended;
    ``get_future()`` gives a future of the call's output tensors (``value``, a list, as
    torch's), completed once the call has ended and its outputs hold the result."""

    def __init__(self, work: Any, finish: Any, value: Sequence[Any] = ()) -> None:
        self._work, self._finish = work, finish
        self._copied = False  # finish ran: the caller's tensors hold (or, on NCCL, are
        #                       queued to hold) the result
        self._done = False  # and the call has ended (on NCCL: on the GPU too)
        self._value, self._future = list(value), None
        self._lock = threading.Lock()  # (the future's callback finishes it in the
        #                                 thread that ends the call)
        # as torch's: the outputs hold the result once the call has ended, waited for or
        # not (code that waits only for a later call's handle, or drops this one, reads
        # them after a later call); the copy is made where the call ends
        work.add_done_callback(self._copy_when_ended)

    def _copy_when_ended(self, work: Any) -> None:
        """The done callback that fills the caller's tensors: a call that ended in an
        error, or a result ``finish`` refuses, leaves them as they are and is raised by
        ``wait()`` (from the thread that asks, not the one that ended the call). GPU
        results on the progress thread (the MPI backend's) are left to ``wait()`` too: that
        thread runs on device 0's null stream, not the caller's device and stream."""
        with contextlib.suppress(Exception):
            result = work.host_result()
            if on_progress_thread() and any(
                    is_cupy(r) for r in (result if isinstance(result, (tuple, list))
                                         else (result,))):
                return
            self._copy(result)

    def _copy(self, result: Any) -> None:
        with self._lock:
            if not self._copied:
                self._finish(result)
                self._copied = True

    def wait(self, timeout: Any = None) -> bool:
        """``timeout``: a timedelta (or seconds), as torch's; 0, torch's default, is no
        limit there (mpicoll.Work.wait's 0 asks without waiting): None here."""
        if not self._done:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            self._copy(self._work.wait(None if seconds == 0 else timeout))
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Whether the call has ended, in success or in an error (torch's: it never
        raises; ``wait()`` and ``exception()`` give the error)."""
        if not self._done and self._work.test():
            try:
                self.wait()  # ended: its tensors hold the result from now on, as torch's
            except MpicollError:
                return True
        return self._done

    test = is_completed

    def synchronize(self) -> None:
        """torch's ``Work.synchronize()``: the call finished (for a CPU tensor, ``wait()``;
        on NCCL, queued on the current stream, as ``wait()`` queues it)."""
        self.wait()

    block_current_stream = synchronize  # (torch's newer name of the same)

    def result(self) -> list[Any]:
        """The call's output tensors, as torch's ``Work.result()`` (waits for the call)."""
        self.wait()
        return list(self._value)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The error of a call that ended in one (None: none, or not ended yet)."""
        if not self._work.test():
            return None
        try:
            self.wait()
        except MpicollError as exc:
            return exc
        return None

    def get_future(self) -> Any:
        """A future (``torch.futures.Future`` for torch tensors, else ``mpicoll.dist.
        Future``, the same methods) whose value is the call's output tensors in a list
        (``[tensor]`` for all_reduce, ``tensor_list``'s tensors for all_gather, as
        gloo's), set once the
        call has ended (on NCCL: queued on its stream, as torch's CUDA futures), or its
        error. Its callbacks run in the thread that ends the call: keep them short."""
        with self._lock:
            made = self._future is None
            if made:
                self._future = _future_for(self._value)
        if made:
            # (its callback may run on the progress thread, on device 0's null stream: a
            # GPU output's copy is made on this caller's device and stream, as wait()'s)
            from ..buffers.cuda import capture_device_and_stream

            try:
                self._on_callers_gpu = capture_device_and_stream(None, self._value)
            except Exception:  # noqa: BLE001 - no GPU to run on: the copy as it is
                self._on_callers_gpu = contextlib.nullcontext
            self._work.add_done_callback(self._complete)
        return self._future

    def _complete(self, work: Any) -> None:
        try:  # (on NCCL: the copies queued on the stream, the GPU not waited for)
            with self._on_callers_gpu():
                self._copy(work.host_result())
        except BaseException as exc:  # noqa: BLE001 - the future's error
            self._future.set_exception(exc)
            return
        self._future.set_result(self._value)


class Future:
    """``torch.futures.Future``'s methods, for calls on NumPy or CuPy arrays (a torch
    tensor's call gives torch's own): ``wait()`` (the value, or the error raised),
    ``value()``, ``done()``, ``then(callback)`` (a Future of ``callback(this)``),
    ``add_done_callback(callback)``, ``set_result``, ``set_exception``."""

    def __init__(self) -> None:
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Any] | None = []
        # a call's future (get_future(), and what then() chains on it): its callbacks are
        # done callbacks wherever they run, so a collective made in one is refused on
        # every rank (the progress thread, or at once where the call had ended: timing);
        # a future of the caller's own, ended in its own thread, runs them as they are
        self._of_call = False

    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self) -> Any:
        if not self._ended.is_set() and in_done_callback() and on_progress_thread():
            raise waits_for_itself("Future.wait()")  # (the thread that would end it)
        self._ended.wait()
        return self.value()

    def value(self) -> Any:
        if not self._ended.is_set():
            raise InvalidArgumentError("Future.value(): not done yet (wait() for it)")
        if self._error is not None:
            raise self._error
        return self._value

    def set_result(self, result: Any) -> None:
        self._end(result, None)

    def set_exception(self, result: BaseException) -> None:
        self._end(None, result)

    def _end(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._callbacks is None:
                raise InvalidArgumentError("Future: its result was set already")
            self._value, self._error = value, error
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks:
            self._call(callback)

    def _call(self, callback: Any) -> None:
        if self._of_call:
            entering_done_callback()
        try:  # (as torch's: a callback's error is reported, and the others still run)
            callback(self)
        except Exception as exc:  # noqa: BLE001 - never into the thread that ended the call
            text = f"mpicoll.dist.Future: a callback raised {type(exc).__name__}: {exc}"
            try:
                warnings.warn(text, RuntimeWarning, stacklevel=2)
            except Exception:  # noqa: BLE001 - warnings as errors: said, the others run on
                report(text)
        finally:
            if self._of_call:
                leaving_done_callback()

    def add_done_callback(self, callback: Any) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        self._call(callback)

    def then(self, callback: Any) -> Future:
        chained = Future()
        chained._of_call = self._of_call
        self.add_done_callback(_chaining(callback, chained))
        return chained


def _chaining(callback: Any, chained: Any) -> Any:
    """``then(callback)``'s done callback: ``chained`` ends with what ``callback`` gives
    back, or the error it raises (as torch's then)."""
    def run(done: Any) -> None:
        try:
            value = callback(done)
        except Exception as exc:  # noqa: BLE001 - the chained future's error
            chained.set_exception(exc)
            return
        chained.set_result(value)

    return run


def _future_for(value: list[Any]) -> Any:
    """A call's future: torch's where torch is in use and the outputs are torch tensors
    (or none: a barrier's), else mpicoll's; its callbacks done callbacks wherever they
    run (``Future._of_call``)."""
    torch = sys.modules.get("torch")
    items = [v for item in value for v in (item if isinstance(item, (list, tuple)) else (item,))]
    if torch is not None and all(isinstance(v, torch.Tensor) for v in items):
        return _call_future_class(torch)()
    future = Future()
    future._of_call = True
    return future


_CALL_FUTURE: list[Any] = []  # the torch Future subclass below, made once torch is in use


def _call_future_class(torch: Any) -> Any:
    """torch's ``Future`` for a call's future: a callback (``add_done_callback``,
    ``then``, and the callbacks of what ``then`` chains) runs as a done callback wherever
    torch runs it: in the thread that ends the call, or inline where it had ended (torch
    runs a callback added to a completed future at once), so a collective made in one is
    refused on every rank, as ``Future._of_call``'s."""
    if _CALL_FUTURE:
        return _CALL_FUTURE[0]

    class CallFuture(torch.futures.Future):  # type: ignore[misc,name-defined]
        def add_done_callback(self, callback: Any) -> None:
            def marked(done: Any) -> None:
                entering_done_callback()
                try:
                    callback(done)
                finally:
                    leaving_done_callback()

            super().add_done_callback(marked)

        def then(self, callback: Any) -> Any:
            chained = CallFuture()
            self.add_done_callback(_chaining(callback, chained))
            return chained

    _CALL_FUTURE.append(CallFuture)
    return CallFuture


