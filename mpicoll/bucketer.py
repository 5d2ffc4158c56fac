"""Gradient bucketing, as DDP does it: many small arrays all_reduced in a few big messages.

    buckets = mpicoll.Bucketer(comm, grads_like, cap_bytes=25 << 20, op="avg")
    for i, grad in backward():          # gradients as the backward pass produces them
        buckets.add(i, grad)            # a full bucket starts its all_reduce at once
    averaged = buckets.wait()           # every array, reduced, in the order given

The arrays are assigned, in the order given (give them in the order they will be ready:
for a backward pass, last layer first), to buckets of at most ``cap_bytes`` (an array
larger than the cap gets a bucket to itself), one dtype per bucket. Each bucket is one
flat buffer allocated once; ``add`` copies an array into its slot, and once every slot of
a bucket is filled its all_reduce starts asynchronously (``async_op=True``), while the
caller goes on computing the next gradients. Buckets start strictly in bucket order, so
every rank starts them in the same order whatever order ``add`` is called in. ``wait``
returns views of the buckets shaped as the inputs: valid until the next round of ``add``.

Making a Bucketer is collective (every rank of ``comm``, with the same arrays, cap_bytes,
op and algorithm: agreed there, a rank that differs or refuses raises on every rank): it
works on a duplicate of ``comm`` (``free()`` releases it), so its buckets' calls never
pair with the caller's own asynchronous calls on ``comm``, which ranks may make between
their ``add`` calls at different points. Its calls are decided by what was agreed, so
check mode does not fingerprint them (each start would be a step every rank makes at once).
An ``add`` that refuses its array (another shape, no array) raises on its rank at once,
but its slot goes as zeros, so every bucket still starts; ``wait`` ends each round with one
small exchange, where every rank learns of such a refusal and raises (the others a
RemoteError: their sums lack that rank's part), in check mode or not. An array a rank
never added this round (no gradient this step, an add that raised) is such a refusal at
``wait``: it goes as zeros, the buckets it held back start, and every rank raises.

Buckets live where the arrays do: CuPy gradients fill device buckets (copied by a kernel
on the current stream), NumPy ones host buckets; a bucket's arrays are all on the GPU or
all on the host.
"""

from __future__ import annotations

import math
import sys
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .buffers.arrays import as_array, copy_into, cupy_module, empty
from .errors import (
    CollectiveTimeoutError,
    InvalidArgumentError,
    MismatchError,
    MpicollError,
    RemoteError,
)
from .groups import agreed_rows
from .ops import resolve_op
from .pipeline.agree import op_text
from .pipeline.choose import algorithms
from .work import start_progress

DEFAULT_CAP_BYTES = 25 * 1024 * 1024  # DDP's bucket_cap_mb default


class Bucketer:
    def __init__(self, comm: Any, arrays: Sequence[Any], *, cap_bytes: int = DEFAULT_CAP_BYTES,
                 op: Any = "sum", algorithm: str = "auto", **unknown: Any) -> None:
        from .communicator import Communicator

        if not isinstance(comm, Communicator):  # (the same on every rank: no message yet)
            raise InvalidArgumentError(
                f"comm: expected an mpicoll Communicator, got {type(comm).__name__} "
                "(mpicoll.Communicator(mpi_comm) takes an mpi4py one)")
        self.op, self.algorithm = op, algorithm
        # a refusal is raised on every rank once the duplicate (collective) is made, and
        # the buckets' layout is agreed there: one rank's other arrays or cap_bytes would
        # pair its buckets' messages with the others' other buckets
        refusal = None if not unknown else InvalidArgumentError(  # (refused on every rank)
            f"{', '.join(unknown)}: Bucketer takes no such argument (its keywords: "
            "cap_bytes, op, algorithm)")
        if isinstance(cap_bytes, (bool, np.bool_)) or not isinstance(cap_bytes, (int, np.integer)) \
                or cap_bytes <= 0:
            refusal = refusal or InvalidArgumentError(
                f"cap_bytes: expected a positive int, got {cap_bytes!r}")
        backs: list[Any] = []  # how each result goes back as its array's kind (torch's)
        try:
            given = [as_array(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
            arrays, backs = [a for a, _ in given], [back for _, back in given]
        except MpicollError as exc:
            refusal, arrays = refusal or exc, []
        except TypeError:
            refusal, arrays = refusal or InvalidArgumentError(
                f"arrays: expected a sequence of arrays, got {type(arrays).__name__}"), []
        try:
            op_given = op_text(op)
            for a in arrays:  # (avg of ints, bitwise ops of floats: never at a first wait)
                resolve_op(op, np.dtype(a.dtype))
        except MpicollError as exc:
            refusal, op_given = refusal or exc, None
        names = algorithms("all_reduce", comm.backend)
        if refusal is None and algorithm != "auto" and algorithm not in names:
            refusal = InvalidArgumentError(
                f"algorithm: unknown all_reduce algorithm {algorithm!r}; expected 'auto' or "
                f"one of {', '.join(names)}")
        # its own (see above), where check mode is off: every call on it is decided by
        # what is agreed here, bucket by bucket in bucket order, so a check at each start
        # (a step every rank makes at once) could only make ranks that add in different
        # orders around other calls wait for each other
        self.comm = comm.dup(check=False)
        self._parent = comm
        layout = (None if refusal else int(cap_bytes), [tuple(a.shape) for a in arrays],
                  [repr(np.dtype(a.dtype)) for a in arrays], [type(a) is np.ndarray for a in arrays],
                  op_given, algorithm if isinstance(algorithm, str) else type(algorithm).__name__)
        try:
            _agree(self.comm, refusal, zlib.crc32(repr(layout).encode()))
        except MpicollError:
            self.comm.free()
            raise
        comm._private.append(self.comm)  # (freed with comm, should this be dropped unfreed)
        start_progress(self.comm, sys._getframe(1))  # (not at a first add: see work.py)
        self.shapes = [tuple(a.shape) for a in arrays]
        self._backs = backs
        dtypes = [np.dtype(a.dtype) for a in arrays]
        on_host = [type(a) is np.ndarray for a in arrays]
        # bucket b holds arrays members[b]; array i sits at [offset[i], offset[i] + size)
        self.members: list[list[int]] = []
        self.bucket_of, self.offset = [0] * len(arrays), [0] * len(arrays)
        sizes: list[int] = []
        for i, (shape, dtype) in enumerate(zip(self.shapes, dtypes, strict=True)):
            n = math.prod(shape)
            last = self.members[-1][0] if self.members else None
            fits = (last is not None and dtypes[last] == dtype and on_host[last] == on_host[i]
                    and (sizes[-1] + n) * dtype.itemsize <= cap_bytes)
            if not fits:
                self.members.append([])
                sizes.append(0)
            self.bucket_of[i], self.offset[i] = len(self.members) - 1, sizes[-1]
            self.members[-1].append(i)
            sizes[-1] += n
        self.buffers = [empty(n, dtypes[m[0]], like=arrays[m[0]])
                        for n, m in zip(sizes, self.members, strict=True)]
        self.works: list[Any] = [None] * len(self.members)
        self._missing = [len(m) for m in self.members]
        self._filled = [False] * len(arrays)
        self._next = 0  # the next bucket to start
        self._refused: MpicollError | None = None  # this round's first refused add, if any
        self.dtypes = dtypes
        # a device array's copy into its slot runs on its adder's current stream: where a
        # bucket starts on another (another thread's, a user's stream), the start waits
        # for the copies of the others (each slot's event, recorded at its add)
        self._copied: list[tuple[Any, Any] | None] = [None] * len(arrays)
        # adds and waits from any threads (an autograd hook's, a pool's), one at a time:
        # the buckets start in bucket order on every rank whichever thread fills them
        self._lock = threading.RLock()

    @property
    def bucket_bytes(self) -> list[int]:
        return [b.nbytes for b in self.buffers]

    def _slot(self, i: int) -> Any:
        b = self.bucket_of[i]
        return self.buffers[b][self.offset[i]:self.offset[i] + math.prod(self.shapes[i])]

    def add(self, i: int, array: Any) -> None:
        """Array ``i`` is ready: copy it into its bucket; start every bucket now complete
        (in bucket order). Any thread may add (one at a time: the others wait here)."""
        with self._lock:
            self._refuse_freed("add")
            self._add(i, array, sys._getframe(1))

    def _refuse_freed(self, what: str) -> None:
        """Refuse a call after this Bucketer was freed, or the Communicator it was made
        on (which frees the one it works on: each rank's, as free() is collective),
        before anything is copied or counted."""
        if self.comm.freed:
            raise InvalidArgumentError(
                f"Bucketer.{what}: the Communicator this Bucketer was made on was freed "
                "(its free() frees its Bucketers' too); make a Bucketer on a live one"
                if self._parent.freed else
                f"Bucketer.{what}: this Bucketer was freed (Bucketer.free()); make a new one")

    def _add(self, i: int, array: Any, site: Any) -> None:
        # (a bad index, an array added twice: refused here, nothing copied, and this
        # round's wait() raises on every rank, as for every refused add)
        wrong = None
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) or \
                not 0 <= i < len(self.shapes):
            wrong = InvalidArgumentError(f"index: expected an int in 0..{len(self.shapes) - 1}"
                                         f" (one of the arrays'), got {i!r}")
        elif self._filled[i]:
            wrong = InvalidArgumentError(f"array {i} was already added this round")
        if wrong is not None:
            self._refused = self._refused or wrong
            raise wrong
        refusal = None
        try:
            array, _ = as_array(array, f"array {i}")
            if array.shape != self.shapes[i] or array.dtype != self.dtypes[i]:
                # (another dtype: cast into the bucket's, it could wrap or overflow)
                raise InvalidArgumentError(
                    f"array {i}: shape {array.shape} of {array.dtype}, expected "
                    f"{self.shapes[i]} of {self.dtypes[i]}")
            copy_into(self._slot(i).reshape(self.shapes[i]), array)
        except MpicollError as exc:  # this rank takes part on zeros, then raises; wait()
            refusal, self._refused = exc, self._refused or exc  # tells every rank
            self._slot(i)[...] = 0
        self._mark_copied(i)
        self._filled_in(i)
        self._start_full(site)  # (a hang report names the caller's add)
        if refusal is not None:
            raise refusal

    def _filled_in(self, i: int) -> None:
        """Array ``i``'s slot is filled this round (its bucket one array nearer full)."""
        self._filled[i] = True
        self._missing[self.bucket_of[i]] -= 1

    def _mark_copied(self, i: int) -> None:
        """Array ``i``'s copy into its slot, where that is on the GPU, is queued on this
        thread's current stream: an event after it, and who queued it."""
        if type(self.buffers[self.bucket_of[i]]) is np.ndarray:
            return
        cuda, stream, here = _current_stream()
        kept = self._copied[i]
        event = cuda.Event(block=False, disable_timing=True) if kept is None else kept[1]
        stream.record(event)
        self._copied[i] = (here, event)

    def _after_copies(self, bucket: int) -> None:
        """The current stream waits for the copies into ``bucket``, where that is on the
        GPU, that other streams queued (the start's all_reduce runs on it; one stream's
        own copies are in order)."""
        if type(self.buffers[bucket]) is np.ndarray:
            return
        _, stream, here = _current_stream()
        for i in self.members[bucket]:
            kept = self._copied[i]
            if kept is not None and kept[0] != here:
                stream.wait_event(kept[1])

    def _start_full(self, site: Any) -> None:
        """Start every bucket now full, in bucket order (the order on every rank)."""
        while self._next < len(self.members) and self._missing[self._next] == 0:
            flat = self.buffers[self._next]
            self._after_copies(self._next)
            if self.comm._progress is not None:  # (the earlier buckets another thread
                self.comm._progress.adopt()       # started: this one follows them)
            self.works[self._next] = self.comm.all_reduce(
                flat, self.op, algorithm=self.algorithm, out=flat, async_op=True, _site=site)
            self._next += 1

    def wait(self) -> list[Any]:
        """Every array reduced (views of the buckets, in the order given, as the arrays'
        kind: torch tensors over them for torch's; valid until the next round's adds);
        then a new round of ``add`` may begin. Any thread may wait (after every add)."""
        with self._lock:
            self._refuse_freed("wait")
            return self._wait()

    def _wait(self) -> list[Any]:
        failure = None
        missing = [i for i, filled in enumerate(self._filled) if not filled]
        if missing:  # (on this rank alone, maybe: an array with no gradient this step, an
            # add that raised) as refused adds: zeros in their place, the buckets they
            # held back started, and every rank raises below
            self._refused = self._refused or InvalidArgumentError(
                f"wait: arrays {missing} were never added this round (they went as zeros)")
            for i in missing:
                self._slot(i)[...] = 0
                self._mark_copied(i)
                self._filled_in(i)
            try:
                self._start_full(sys._getframe(2))
            except MpicollError as exc:  # (its bucket is one never started, below)
                failure = exc
        if self._next < len(self.members):  # its all_reduce was refused at add: the round
            # ends here, once the buckets started before it are done, failed
            failure = failure or InvalidArgumentError(
                f"wait: bucket {self._next} was never started this round (add raised when it "
                "was full)")
        for work in self.works[:self._next]:  # every one, even after one failed: the buckets
            try:                              # are free for the next round only once no
                work.wait()                   # call still uses them
            except CollectiveTimeoutError:
                raise  # (the job is ending: the watchdog's report says why)
            except MpicollError as exc:
                failure = failure or exc
        # an array one rank's add refused went as zeros: every rank learns it here (one
        # small exchange a round), so no rank takes such a round's sums for right
        refused = self._refused  # (forgotten once every rank has learnt it: an exchange
        # refused, in a done callback or on a freed Communicator, leaves the round open)
        ranks = np.flatnonzero(agreed_rows(self.comm, np.array([refused is not None], np.int64),
                                           sys._getframe(2), "Bucketer.wait")[:, 0]).tolist()
        self._refused = None
        if ranks and failure is None:
            failure = refused or RemoteError(
                f"Bucketer.wait: add refused an array on rank(s) {_ranks(ranks)}, which took "
                "part with zeros in its place: this round's results are not the sums")
        # the round ends, failed or not (an OpError on every rank): a new one may begin
        self._missing = [len(m) for m in self.members]
        self._filled = [False] * len(self.shapes)
        self._next = 0  # (works stay: each wait's Works, their times, until the next round)
        if failure is not None:
            raise failure
        return [back(self._slot(i).reshape(shape))  # (a torch tensor over it for torch's)
                for i, (shape, back) in enumerate(zip(self.shapes, self._backs, strict=True))]

    def free(self) -> None:
        """Collective: release the Bucketer's communicator (after its last ``wait``)."""
        self.comm.free()
        private = self._parent._private
        if any(c is self.comm for c in private):
            private.remove(self.comm)


def _current_stream() -> tuple[Any, Any, tuple[int, int, int]]:
    """(cupy.cuda, this thread's current stream, who queues on it: thread, stream, GPU)."""
    cuda = cupy_module().cuda
    stream = cuda.get_current_stream()
    return cuda, stream, (threading.get_ident(), stream.ptr, cuda.runtime.getDevice())


def _agree(comm: Any, refusal: MpicollError | None, layout: int) -> None:
    """Raise on every rank where any rank refused its arguments (``refusal``) or holds
    another layout of the buckets (``layout``, a number for it) than rank 0."""
    # (over NCCL's MPI side on backend 'nccl', whose collectives move device arrays only)
    table = agreed_rows(comm, np.array([refusal is not None, layout], np.int64),
                        sys._getframe(2), "Bucketer")
    refused = np.flatnonzero(table[:, 0]).tolist()
    if refused:
        if refusal is not None:
            raise refusal
        raise InvalidArgumentError(f"Bucketer: refused on rank(s) {_ranks(refused)} (their "
                                   "arrays, cap_bytes, op or algorithm); every rank gives the same")
    differ = np.flatnonzero(table[:, 1] != table[0, 1]).tolist()
    if differ:
        raise MismatchError(f"Bucketer: rank(s) {_ranks(differ)} give other arrays (shapes, "
                            "dtypes, host or device), cap_bytes, op or algorithm than rank 0; "
                            "every rank gives the same")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
