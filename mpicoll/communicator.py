"""The public API: a Communicator whose collectives run a chosen algorithm.

Each method is a short entry into the call pipeline (``mpicoll.pipeline``): the call is
numbered and described on entry, checked, agreed, chosen, run and delivered, the same
way on every rank. What a backend is and can do lives in ``mpicoll.backends``; what a
collective is, in ``mpicoll.spec``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .algorithms import COLLECTIVES
from .backends import BACKENDS, Backend, make_backend, watched_making
from .errors import InvalidArgumentError
from .groups import Groups
from .observe.recorder import Watch
from .observe.tracing import TraceFile, attach, write_merged
from .observe.watchdog import watchdog
from .ops import Op, ReduceOp, resolve_op
from .p2p import PointToPoint
from .pipeline import agree, run
from .pipeline.choose import Chooser, check_collective
from .pipeline.choose import algorithms as _names
from .pipeline.describe import Call
from .pipeline.entry import announce, entry, freed, resync_owed, turn
from .pipeline.state import CallState, close_progress, let_go, refuse_in_callback
from .pipeline.validate import dtype_given
from .plan import end_running_starts, init_method
from .work import ProgressThread, Work, finish_at_exit, start_progress, submit

__all__ = ["BACKENDS", "Communicator", "algorithms"]


def algorithms(collective: str, backend: str = "mpi") -> list[str]:
    """The names valid for ``algorithm=`` of ``collective`` on ``backend`` (not "auto")."""
    check_collective(collective)
    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend: unknown backend {backend!r}; expected one of {BACKENDS}")
    return _names(collective, backend)


class Communicator(CallState, PointToPoint, Groups):
    """Collectives with named algorithms over MPI, NCCL, or threads in one process.

    Args:
        comm: an mpi4py intracommunicator (default ``MPI.COMM_WORLD``); mpicoll works on
            a private duplicate, so its messages never match the caller's. For
            ``backend="local"``, an endpoint of ``mpicoll.transport.local.LocalWorld``.
        backend: "mpi" (default: NumPy or CuPy arrays, CUDA-aware or staged through
            pinned memory), "nccl" (CuPy arrays; NCCL's collectives as "native", every
            other algorithm over ncclSend/ncclRecv; ``comm`` bootstraps it and carries
            the small host messages), or "local" (ranks as threads; no "native").
        check: compare a fingerprint of every call (with each rank's own verdict on it)
            across ranks first, raising on every rank when any rank refuses or they
            disagree (default: ``MPICOLL_CHECK``; it must be the same on every rank).
        trace: record every message (True), or also merge them into a Chrome trace file
            (a path, MPI only; default ``MPICOLL_TRACE``) that rank 0 writes at its path
            at ``free()`` (at exit if never freed): checked here. On for every rank alike
            (``MPICOLL_TRACE`` on rank 0 only raises ConfigError on every rank).
        timeout: seconds any call (and ``Work.wait()``) may take before this rank reports
            what it waits for and aborts the job (default ``MPICOLL_TIMEOUT``, else
            1800; 0: never; it may differ per rank). On the local backend the waiting
            receive raises ``CollectiveTimeoutError`` instead (default: the LocalWorld's
            timeout). See ``mpicoll.observe.watchdog``.

    Making one is collective: these settings and ``MPICOLL_FLIGHT_RECORDER``,
    ``MPICOLL_CUDA_AWARE``, ``MPICOLL_DUMP_DIR`` are read here and exchanged in one
    step (a malformed one on any rank raises the same error on every rank, naming it
    and the ranks), and the tuning and model files are agreed (rank 0's; see
    ``mpicoll.selection``); a constructor that raises frees what it made. One
    Communicator serves one thread at a time; ``dup()`` gives another thread its own.
    Every collective takes ``stream=`` (a ``cupy.cuda.Stream``) and ``async_op=True``.
    """

    def __init__(self, comm: Any = None, backend: str | Backend = "mpi", *,
                 check: bool | None = None, trace: bool | str | None = None,
                 timeout: float | None = None, _tables: Any = None) -> None:
        # (_tables: a parent's agreed tuning and model tables: a split's or dup's)
        self._progress: ProgressThread | None = None  # runs the async_op=True calls
        with watched_making(backend, comm, timeout, sys._getframe(1)):  # collective steps
            super().__init__(backend if isinstance(backend, Backend) else  # the calls' state
                             make_backend(backend, comm))  # (pipeline.state.CallState)
            try:  # the settings as this rank reads them, nothing raised before they are agreed
                mine = agree.read_settings(self._backend, check, trace, timeout)
            except BaseException:
                with contextlib.suppress(Exception):  # its own error matters more
                    self._backend.free()
                raise
        try:
            self.timeout, self.check, self._traced = mine.timeout, mine.check, mine.trace
            local = self._backend.ranks_are_threads  # a stall raises; it does not end the job
            if local:
                self._backend.transport.timeout = mine.timeout
            self._watch = Watch(self, mine.timeout, not local, mine.recorder)
            watchdog().register(self._watch)
            self._watch.enter(0, "Communicator", sys._getframe(1), (), {})  # collective too
            try:
                agree.settings(self, mine)  # a refusal on any rank raises on every rank
                self._chooser = Chooser(self._backend, self.size,
                                        agree.tables(self) if _tables is None else _tables)
            finally:
                self._watch.leave()
        except BaseException:  # free what was made: MPI's duplicate, NCCL's, the watch
            if self._watch is not None:
                watchdog().unregister(self._watch)
            with contextlib.suppress(Exception):  # the constructor's own error matters more
                self._backend.free()
            raise
        self._chooser.watch = self._watch  # it records the algorithm and bytes of each call
        self._backend.force_cuda_aware(mine.cuda_aware)  # not at the first device message
        if mine.trace:
            self._tracer = self._chooser.tracer = attach(self._backend, self.rank, self.size)
        self._trace_file = (TraceFile(mine.trace, self._merge_trace,  # merged at free() or exit
                                      (self._watch.members or [0])[0], finish_at_exit, self._exit_key) if isinstance(mine.trace, str) else None)
        self._packet = np.zeros(agree.HEADER_BYTES + max(self._backend.packed_bytes, 0), np.uint8)
        self._packet_header = self._packet[:agree.HEADER_BYTES].view(np.int64)
        if self._tracer is not None:  # (its messages are the header's: see observe.tracing)
            self._tracer.header = self._packet
        if not (self.check or self._tracer is not None):
            self._decisions = {}  # what a default call decided, for the next like it

    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def device(self) -> int | None:
        """The GPU this rank's NCCL backend runs on (None on other backends)."""
        return self._backend.device

    @property
    def calls(self) -> int:
        """How many collective calls this Communicator has numbered so far."""
        return self._seq

    # -- public hooks for the tools (bench, model fit): no reaching into private fields --

    @property
    def transport(self) -> Any:
        """The transport the algorithms run over (tools time algorithms on it directly;
        call ``transport.begin()`` before each operation, on every rank alike)."""
        return self._backend.transport

    @property
    def control_comm(self) -> Any:
        """The mpi4py communicator of this Communicator's host messages (a private
        duplicate), or None on the local backend. For tools' own metadata."""
        return getattr(self._backend.control, "comm", None)

    def native_collective(self, collective: str) -> Callable[..., None]:
        """The backend's own ``collective`` (the algorithms' signature), or a refusal."""
        check_collective(collective)
        return self._chooser._lookup(collective, "native")[0]

    def native_serves(self, op: Any, dtype: Any) -> bool:
        """Whether ``algorithm="native"`` can run a call with this op and dtype."""
        dtype = dtype_given(dtype, "native_serves")
        opd = op if op is None or isinstance(op, Op) else resolve_op(op, dtype)
        return self._chooser.native_serves(opd, dtype)

    def auto_algorithm(self, collective: str, nbytes: int, op: Any = None,
                       dtype: Any = None, uneven: bool = False) -> str:
        """The algorithm ``algorithm="auto"`` runs for a call of ``collective`` moving
        ``nbytes`` (the benchmark's size: the whole buffer for reductions and broadcast,
        the whole result for gathers, the whole input for scatter and all_to_all)."""
        check_collective(collective)
        if isinstance(nbytes, (bool, np.bool_)) or not isinstance(nbytes, (int, np.integer)) \
                or nbytes < 0:
            raise InvalidArgumentError(
                f"auto_algorithm: nbytes: expected a number of bytes >= 0, got {nbytes!r}")
        nbytes = int(nbytes)
        dtype = dtype_given(dtype, "auto_algorithm")
        opd = None if op is None else resolve_op(op, dtype if dtype is not None else np.dtype("f8"))
        return self._chooser.runs(collective, nbytes, opd, dtype, uneven)

    # -- duplicates, async calls, traces, freeing ------------------------------------------

    def dup(self, check: bool | None = None) -> Communicator:
        """A Communicator of the same ranks and backend whose messages never match this
        one's, for another thread (collective); ``check``: its check mode (default: this one's)."""
        if self._freed:
            raise freed("dup")
        with turn(self, "dup"):  # it sends on this one's communicator too
            return self._duplicate(sys._getframe(1), check)

    def _duplicate(self, site: Any, check: bool | None = None) -> Communicator:
        """``dup()`` for a caller that holds this Communicator's entry (made at ``site``)."""
        announce(self, "dup", site, None, algorithm="dup") if self.check else \
            resync_owed(self, "dup", site)  # (check mode agrees it; else a resync owed first)
        call = Call(self._seq, "dup")
        call.at(site)
        with self._watch.aside(call):  # collective: it may wait (traced as this one is: its
            return Communicator(backend=self._backend.duplicate(),  # file numbered apart)
                                check=self.check if check is None else check,
                                trace=self._traced, timeout=self.timeout,
                                _tables=self._chooser.tables)

    def _submit(self, name: str, args: tuple, kwargs: dict, stream: Any, frame: Any,
                refused: Exception | None = None) -> Work:
        if self._freed:
            raise freed(name)
        return submit(self, name, args, kwargs, stream, frame, refused)  # see mpicoll.work

    def trace_events(self) -> list[dict[str, Any]]:
        """This rank's traced events so far (``trace=True``), in its own clock."""
        if self._tracer is None:
            raise InvalidArgumentError("trace_events: this communicator was made without trace=True")
        return self._tracer.events

    def write_trace(self, path: str) -> None:
        """Collective: merge every rank's trace on rank 0, clocks aligned to rank 0's, and
        write it there as Chrome trace JSON (Perfetto, chrome://tracing). MPI backend."""
        if self._freed:  # (free() wrote it, where it was given a file)
            raise freed("write_trace")
        if self._tracer is None:
            raise InvalidArgumentError("write_trace: this communicator was made without trace=True")
        if not self._backend.merges_traces:
            raise InvalidArgumentError("write_trace: merges over MPI; on the local backend "
                                       "use trace_events() of each rank")
        self._merge_trace(path, InvalidArgumentError)

    def _merge_trace(self, path: str, refusal: type[Exception]) -> None:
        """write_trace, watched; rank 0's failure to write raises ``refusal`` everywhere."""
        with turn(self, "write_trace"), \
                self._watch.aside(Call(self._seq, "write_trace", 3)):  # (it sends on this
            failure = write_merged(self._tracer, self._backend.transport, path)  # one too)
        if failure is not None:
            raise refusal(failure)

    def start_progress(self) -> None:
        """Collective: make now the progress thread that runs this Communicator's
        ``async_op=True`` calls (its duplicate communicator: a collective of this one).
        The first async call (or plan) makes it otherwise; call this where every rank is
        when ranks may make their first async calls on two Communicators in other orders."""
        start_progress(self, sys._getframe(1))

    @property
    def freed(self) -> bool:
        """Whether ``free()`` was called (its calls then refuse)."""
        return self._freed

    def free(self) -> None:
        """Collective: finish pending async calls, write the trace file (``MPICOLL_TRACE``,
        ``trace=path``), release the private communicators (also at MPI finalization)."""
        refuse_in_callback("free")  # (it would join the progress thread it runs on)
        end_running_starts(self)  # (a watched wait, before its calls refuse)
        with turn(self, "free"):  # (another thread in a call: refused, nothing freed)
            self._freed, self._decisions = True, None  # its calls and plans refuse from
            # now on (no kept decision runs on the released communicators)
        close_progress(self)
        try:
            if self._trace_file is not None:
                self._trace_file.write()
        finally:
            watchdog().unregister(self._watch)
            self._backend.free()
            let_go(self)  # (its private Communicators: a Bucketer's)

    # -- collectives: each a pass through the pipeline (mpicoll.pipeline.run) ------------

    @entry
    def broadcast(self, call: Call, x: Any, root: int = 0, *, algorithm: str = "auto",
                  **options: int) -> Any:
        """Send the root's ``x`` to every rank.

        Args:
            x: at the root, the data; elsewhere a receive buffer of the same shape and
                dtype (filled in place and returned) or None.
            root: the rank whose data is sent.
            algorithm: "auto", "native" or a name from ``algorithms("broadcast")``.
            **options: the algorithm's tuning options (``radix=`` for knomial,
                ``segment_bytes=`` for pipelined_chain).

        Returns:
            The root's data on every rank (the root's own ``x`` at the root).
        """
        return run.broadcast(self, call, x, root, algorithm, options)

    @entry
    def scatter(self, call: Call, x: Any, root: int = 0, *, algorithm: str = "auto",
                out: Any = None, **options: int) -> Any:
        """Send row j of the root's ``x`` to rank j.

        Args:
            x: at the root, shape (size, *rest); elsewhere ignored (pass None).
            root: the rank whose data is scattered.
            algorithm: "auto", "native" or a name from ``algorithms("scatter")``.
            out: optional result buffer of shape rest; at the root it may be ``x[root]``
                (in place, as MPI_IN_PLACE).
            **options: the algorithm's tuning options (``radix=`` for knomial).

        Returns:
            ``x[rank]`` of the root, shape rest.
        """
        return run.scatter(self, call, x, root, algorithm, out, options)

    @entry
    def gather(self, call: Call, x: Any, root: int = 0, *, algorithm: str = "auto",
               out: Any = None, **options: int) -> Any:
        """Collect every rank's ``x`` on the root, stacked in rank order.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            root: the rank that receives.
            algorithm: "auto", "native" or a name from ``algorithms("gather")``.
            out: optional result buffer of shape (size, *x.shape), at the root.
            **options: the algorithm's tuning options (``radix=`` for knomial).

        Returns:
            At the root, shape (size, *x.shape); None elsewhere.
        """
        return run.collective(self, call, "gather", x, algorithm, out, options, root=root)

    @entry
    def all_gather(self, call: Call, x: Any, *, algorithm: str = "auto", out: Any = None,
                   **options: int) -> Any:
        """Collect every rank's ``x`` on every rank, stacked in rank order.

        Args:
            x: this rank's data; the same shape and dtype on every rank. It may be
                ``out[rank]`` itself (in place).
            algorithm: "auto", "native" or a name from ``algorithms("all_gather")``.
            out: optional result buffer of shape (size, *x.shape).
            **options: the algorithm's tuning options (none of all_gather's takes one).

        Returns:
            Shape (size, *x.shape), on every rank.
        """
        return run.collective(self, call, "all_gather", x, algorithm, out, options)

    @entry
    def all_gather_v(self, call: Call, x: Any, *, algorithm: str = "auto",
                     **options: int) -> tuple[Any, list[int]]:
        """Collect every rank's rows on every rank, concatenated in rank order.

        Args:
            x: this rank's rows, shape (rows, *rest); rows may differ per rank (0 too),
                dtype and rest may not.
            algorithm: "auto", "native" (MPI_Allgatherv) or a name from
                ``algorithms("all_gather")``.

        Returns:
            (result of shape (sum of rows, *rest), the rows of every rank).
        """
        return run.all_gather_v(self, call, x, algorithm, options)

    @entry
    def gather_v(self, call: Call, x: Any, root: int = 0, *, algorithm: str = "auto",
                 **options: int) -> tuple[Any, list[int]]:
        """Collect every rank's rows on the root, concatenated in rank order.

        Args:
            x: this rank's rows, shape (rows, *rest); rows may differ per rank (0 too).
            root: the rank that receives.
            algorithm: "auto", "native" (MPI_Gatherv) or a name from ``algorithms("gather")``.

        Returns:
            (at the root the result of shape (sum of rows, *rest), else None; the rows
            of every rank, on every rank).
        """
        return run.gather_v(self, call, x, root, algorithm, options)

    @entry
    def scatter_v(self, call: Call, x: Any, counts: Sequence[int] | None = None,
                  root: int = 0, *, algorithm: str = "auto", **options: int) -> Any:
        """Send ``counts[j]`` rows of the root's ``x`` to rank j, in rank order.

        Args:
            x: at the root, shape (sum(counts), *rest); elsewhere ignored (pass None).
            counts: the rows for each rank; needed at the root, optional elsewhere (when
                given, it must equal the root's).
            root: the rank whose data is scattered.
            algorithm: "auto", "native" (MPI_Scatterv) or a name from ``algorithms("scatter")``.

        Returns:
            This rank's rows, shape (counts[rank], *rest).
        """
        return run.scatter_v(self, call, x, counts, root, algorithm, options)

    @entry
    def all_to_all_v(self, call: Call, x: Any, send_counts: Sequence[int], *,
                     algorithm: str = "auto", **options: int) -> tuple[Any, list[int]]:
        """Send ``send_counts[j]`` rows of ``x`` to rank j, in rank order; receive in turn.

        Args:
            x: shape (sum(send_counts), *rest); rest and dtype the same on every rank.
            send_counts: the rows for each rank (0 too).
            algorithm: "auto", "native" (MPI_Alltoallv) or a name from
                ``algorithms("all_to_all")`` that takes uneven blocks; "auto" decides
                from the total over all ranks, agreed with the counts.

        Returns:
            (the rows received, concatenated in the order of the ranks that sent them;
            the rows received from each rank).
        """
        return run.all_to_all_v(self, call, x, send_counts, algorithm, options)

    @entry
    def reduce(self, call: Call, x: Any, op: str | ReduceOp | Op = "sum", root: int = 0, *,
               algorithm: str = "auto", out: Any = None, **options: int) -> Any:
        """Combine every rank's ``x`` elementwise with ``op``; the result goes to the root.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", a ReduceOp,
                or an ``mpicoll.Op`` (a non-commutative one is combined in rank order).
            root: the rank that receives the result.
            algorithm: "auto", "native" or a name from ``algorithms("reduce")``.
            out: optional result buffer at the root (may be ``x``: in place).
            **options: the algorithm's tuning options (``radix=`` for knomial).

        Returns:
            At the root, the reduction, shape x.shape; None elsewhere.
        """
        return run.collective(self, call, "reduce", x, algorithm, out, options, op, root)

    @entry
    def all_reduce(self, call: Call, x: Any, op: str | ReduceOp | Op = "sum", *,
                   algorithm: str = "auto", out: Any = None, compress: str | None = None,
                   **options: int) -> Any:
        """Combine every rank's ``x`` elementwise with ``op``; every rank gets the result.

        Args:
            x: this rank's data; the same shape and dtype on every rank.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", a ReduceOp,
                or an ``mpicoll.Op`` (a non-commutative one is combined in rank order).
            algorithm: "auto", "native" or a name from ``algorithms("all_reduce")``.
            out: optional result buffer (``out=x`` reduces in place).
            compress: "bf16" or "fp16" (float32/float64 input): every message carries
                16-bit values, every reduction runs in x's precision (any algorithm but
                "native"; see ``mpicoll.transport.compress``); the same on every rank.
            **options: the algorithm's tuning options (``segment_bytes=`` for
                ring_pipelined).

        Returns:
            The reduction, shape x.shape, on every rank.
        """
        return run.all_reduce(self, call, x, op, algorithm, out, options, compress)

    @entry
    def reduce_scatter(self, call: Call, x: Any, op: str | ReduceOp | Op = "sum", *,
                       counts: Sequence[int] | None = None, algorithm: str = "auto",
                       out: Any = None, **options: int) -> Any:
        """Reduce every rank's ``x`` with ``op``; rank j gets row j (or block j) of the result.

        Args:
            x: shape (size, *rest), the same on every rank; with ``counts``, any shape
                whose size is ``sum(counts)``, split flat.
            op: "sum", "prod", "min", "max", "avg", "band", "bor", "bxor", a ReduceOp,
                or an ``mpicoll.Op`` (a non-commutative one is combined in rank order).
            counts: the number of elements of each rank's block, for uneven flat splits
                (the same on every rank).
            algorithm: "auto", "native" or a name from ``algorithms("reduce_scatter")``.
            out: optional result buffer of shape rest (with counts: ``(counts[rank],)``).
            **options: the algorithm's tuning options (none of reduce_scatter's takes one).

        Returns:
            Row [rank] of the reduction, shape rest; with counts, block [rank], 1-D.
        """
        return run.reduce_scatter(self, call, x, op, counts, algorithm, out, options)

    @entry
    def scan(self, call: Call, x: Any, op: str | ReduceOp | Op = "sum", *,
             algorithm: str = "auto", out: Any = None, **options: int) -> Any:
        """Prefix reduction in rank order (MPI_Scan): rank r gets x_0 op x_1 op ... op x_r.

        Args:
            x, op, out: as in ``all_reduce`` (``out=x``: in place); "avg" divides rank r's
                result by r + 1, the number of ranks it combines.
            algorithm: "auto", "native" (MPI) or a name from ``algorithms("scan")``.

        Returns:
            This rank's prefix, shape x.shape.
        """
        return run.collective(self, call, "scan", x, algorithm, out, options, op)

    @entry
    def exscan(self, call: Call, x: Any, op: str | ReduceOp | Op = "sum", *,
               algorithm: str = "auto", out: Any = None, **options: int) -> Any:
        """``scan`` without this rank's own x (MPI_Exscan): rank r gets x_0 op ... op
        x_(r-1), "avg" divided by r. Rank 0 takes part (the others need its x) and gets
        None, as MPI leaves its result undefined (its ``out=`` is left as it was)."""
        return run.collective(self, call, "exscan", x, algorithm, out, options, op)

    @entry
    def all_to_all(self, call: Call, x: Any, *, algorithm: str = "auto", out: Any = None,
                   **options: int) -> Any:
        """Send row j of ``x`` to rank j; row i of the result came from rank i.

        Args:
            x: shape (size, *rest); the same shape and dtype on every rank.
            algorithm: "auto", "native" or a name from ``algorithms("all_to_all")``.
            out: optional result buffer of shape x.shape (may be ``x``: in place).
            **options: the algorithm's tuning options (none of all_to_all's takes one).

        Returns:
            Shape x.shape: the transpose of the rows across ranks.
        """
        return run.collective(self, call, "all_to_all", x, algorithm, out, options)

    @entry
    def barrier(self, call: Call, *, algorithm: str = "auto", **options: int) -> None:
        """Return only once every rank has entered the barrier.

        Args:
            algorithm: "auto", "native" or a name from ``algorithms("barrier")``.
            **options: the algorithm's tuning options (``radix=`` for knomial).
        """
        return run.barrier(self, call, algorithm, options)

    @entry
    def monitored_barrier(self, call: Call, timeout: float | None = None,
                          wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not arrive in time (as torch's).

        Rank 0 collects the others' arrivals; every rank that arrived (late ones too)
        raises ``CollectiveTimeoutError`` naming the ranks that did not come within
        ``timeout``. Slower than ``barrier()``: for debugging hangs.

        Args:
            timeout: seconds rank 0 waits for the others (default: the Communicator's).
            wait_all_ranks: name every rank that did not arrive, not only the first.
        """
        from .observe.monitored import monitored_barrier

        monitored_barrier(self, call, timeout, wait_all_ranks)


for _name in (*COLLECTIVES, "all_gather_v", "gather_v", "scatter_v", "all_to_all_v"):
    setattr(Communicator, f"{_name}_init", init_method(_name))  # persistent: mpicoll.plan

assert set(COLLECTIVES) <= set(dir(Communicator))
