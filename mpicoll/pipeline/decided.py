"""Decided calls: what a call decided, run again on new buffers without deciding again.

A call's decision (the algorithm's function, the op, the block bounds, the root's
header) is made from values every rank holds alike or the call agreed: the collective,
the shape and dtype, the op, the root, the algorithm and its options, the number of ranks
and the tables agreed when the Communicator was made. Once a call with those values has
run the whole pipeline, the decision is kept and run again:

- by a persistent plan (``mpicoll.plan``), on its bound buffers at every start;
- by the default call (``comm.all_reduce(x)``), from the Communicator's table of
  decisions keyed by those values (``key``), on the new call's buffers.

A decision runs exactly what the whole path runs for the same values (the same
function on the same views, so the same messages: the other ranks cannot tell a hit from
a miss), numbered and watched by the entry like every call. It declines (``MISS``,
before any message) a buffer it was not made for (not a contiguous host NumPy array of
its shape and dtype, an ``out=`` of another shape or overlapping the input), and the
whole path runs that call. Check mode, traces, CUDA streams, the NCCL backend, user ops
in the default call and a rank that owes a resync always take the whole path.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arrays import same_memory, to_torch, torch_numpy
from ..buffers import counts_bounds, even_bounds
from ..ops import ReduceOp, resolve_op
from ..transport.compress import Compressing, wire_dtype
from . import agree
from .deliver import average

MISS = object()  # a decision declined the call's buffers: the whole path runs it
DECLINED = object()  # in the table: such calls take the whole path

# a default call is kept only when every argument but x and out is one of these: values
# that hash by what they are (never a user's Op, which the table would keep alive)
_PLAIN = frozenset((str, int, float, bool, type(None), ReduceOp))
_LIMIT = 256  # decisions one Communicator keeps; the table starts over beyond it

SIGNATURES: dict[str, inspect.Signature] = {}  # each collective's method, from @entry


def key(name: str, args: tuple, kwargs: dict) -> tuple | None:
    """The default call's key in the table of decisions, or None (not kept)."""
    if args:
        x = args[0]
        if type(x) is np.ndarray:
            if not x.flags.c_contiguous:
                return None
            head: tuple = (name, x.shape, x.dtype)
        elif x is None:
            head = (name, None)
        else:
            return None
        for a in args[1:]:
            if type(a) not in _PLAIN:
                return None
    else:
        head = (name,)
    if kwargs:
        rest = []
        for k, v in kwargs.items():
            if k != "out":
                if type(v) not in _PLAIN:
                    return None
                rest.append((k, v))
        return (*head, args[1:], *rest)
    return (*head, args[1:])


def from_torch(args: tuple, kwargs: dict) -> tuple[tuple, dict, Callable[[Any], Any] | None]:
    """A torch CPU tensor's call as the same call on NumPy views of its tensors (no copy:
    ``Tensor.numpy()``, far cheaper than a DLPack import), and how to give the result back
    (the caller's own tensor where the result is its memory, else a tensor over the
    result's); ``back`` None: not such a call (a GPU tensor, one that needs grad, a dtype
    NumPy lacks), which takes the whole path as it is."""
    x = args[0]
    if not type(x).__module__.startswith("torch") or not getattr(x, "is_cpu", False):
        return args, kwargs, None
    out = kwargs.get("out")
    host = torch_numpy(x)
    if host is None:
        return args, kwargs, None
    host_out = None
    if out is not None:
        host_out = host if out is x else torch_numpy(out) \
            if type(out).__module__.startswith("torch") and getattr(out, "is_cpu", False) \
            else None
        if host_out is None:
            return args, kwargs, None

    def back(result: Any) -> Any:
        if result is None:
            return None
        if result is host_out:
            return out
        if result is host:
            return x
        return to_torch(result)

    if out is not None:
        kwargs = {**kwargs, "out": host_out}
    return (host, *args[1:]), kwargs, back


def keep(c: Any, name: str, args: tuple, kwargs: dict, key: tuple) -> None:
    """Keep the decision of the call that just ran the whole path (DECLINED: none)."""
    decisions = c._decisions
    if len(decisions) >= _LIMIT:
        decisions.clear()
    try:
        decisions[key] = decide(c, name, args, kwargs) or DECLINED
    except Exception:  # noqa: BLE001 - the call succeeded: its later ones take the whole path
        decisions[key] = DECLINED


def decide(c: Any, name: str, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """The decision of a call of ``name`` with these arguments, which has just run the
    whole path successfully on this rank; None where the whole path must keep running
    such calls."""
    decider = _DECIDERS.get(name)
    if decider is None or c.check or c._tracer is not None or c._backend.separate_control:
        return None
    try:
        bound = SIGNATURES[name].bind(c, None, *args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = bound.arguments
    x = a.get("x")
    if x is not None and (type(x) is not np.ndarray or not x.flags.c_contiguous):
        return None
    return decider(c, a, x)


def _out(out: Any, shape: tuple[int, ...], dtype: np.dtype, x: np.ndarray) -> bool:
    """Whether ``out`` is a result buffer a decision serves: a contiguous, writeable
    host array of the result's shape and dtype, not overlapping ``x`` (unless it is x)."""
    return (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable
            and (out is x or not np.may_share_memory(out, x)))


def _src(t: Any, x: np.ndarray, dst: Any) -> Any:
    """x, flat, as the algorithms may read it: ``run._input``'s rule (a copy in workspace
    when it overlaps the result or cannot be written)."""
    src = x.reshape(-1)
    if not x.flags.writeable or (dst is not None and np.may_share_memory(src, dst)):
        copy = t.take(src.size, src.dtype)
        copy[...] = src
        return copy
    return src


def _resolve(c: Any, collective: str, algorithm: str, nbytes: int, op: Any, options: dict,
             dtype: Any, uneven: bool = False) -> tuple[Callable[..., Any], str]:
    return c._chooser._resolve(collective, algorithm, nbytes, op, options or None, dtype, uneven)


def _reduce_with(c: Any, opd: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as the reduction's runner: a user's op guarded, its failures agreed."""
    if opd.builtin:
        return lambda call, *args: fn(*args)
    from .run import _reducing

    return lambda call, *args: _reducing(c, call, opd, fn, *args)


# -- the collectives where every rank contributes: x's shape and dtype decide -------------


def _all_reduce(c: Any, a: dict, x: np.ndarray) -> Callable[..., Any]:
    opd = resolve_op(a["op"], x.dtype)
    t, watch, shape, dtype, nbytes = c._backend.transport, c._watch, x.shape, x.dtype, x.nbytes
    if a["compress"] is None:
        fn, name = _resolve(c, "all_reduce", a["algorithm"], nbytes, opd, a["options"], dtype)
    else:  # as run.all_reduce: chosen for the wire's bytes, over the compressing transport
        wire = wire_dtype(a["compress"])
        fn, name = c._chooser._resolve("all_reduce", a["algorithm"], x.size * wire.itemsize,
                                       opd, a["options"] or None, dtype, False, False)
        t = Compressing(t, wire)
    size, averages_itself = c.size, c._backend.averages_itself
    reduce = _reduce_with(c, opd, fn)
    native_mpi = name == "native" and c.backend == "mpi" and opd.builtin
    if native_mpi:  # MPI_Allreduce called directly: what native.native_all_reduce calls
        from mpi4py import MPI

        from ..native import mpi_op

        datatype, mop = mpi_op(opd, dtype)
        native_mpi = datatype is None
        allreduce, in_place = t.comm.Allreduce, MPI.IN_PLACE

    def start(call: Any, x: Any, out: Any) -> Any:
        if out is None:
            result = np.empty(shape, dtype)
            dst = result.reshape(-1)
            src = x.reshape(-1) if x.flags.writeable else _src(t, x, None)
        elif out is x and x.flags.writeable:
            result, src = x, x.reshape(-1)
            dst = src
        elif _out(out, shape, dtype, x):
            result, dst = out, out.reshape(-1)
            src = _src(t, x, dst)
        else:
            return MISS
        rec = watch.current  # the flight recorder's algorithm and bytes, as choose writes
        rec.algorithm, rec.nbytes = name, nbytes
        if native_mpi:
            allreduce(in_place if src is dst else src, dst, mop)
        else:
            reduce(call, t, src, dst, opd)
        if opd.average:
            average(result, opd, fn, size, averages_itself)
        return result

    return start


def _scan(c: Any, a: dict, x: np.ndarray, collective: str) -> Callable[..., Any]:
    """scan and exscan: exscan's rank 0 takes part with workspace and gets None."""
    opd = resolve_op(a["op"], x.dtype)
    fn, name = _resolve(c, collective, a["algorithm"], x.nbytes, opd, a["options"], x.dtype)
    t, watch, shape, dtype, nbytes = c._backend.transport, c._watch, x.shape, x.dtype, x.nbytes
    nothing = collective == "exscan" and c.rank == 0
    combined = c.rank + 1 if collective == "scan" else c.rank
    averages_itself, reduce = c._backend.averages_itself, _reduce_with(c, opd, fn)

    def start(call: Any, x: Any, out: Any) -> Any:
        if out is None:
            result = None if nothing else np.empty(shape, dtype)
        elif out is x and x.flags.writeable or _out(out, shape, dtype, x):
            result = out
        else:
            return MISS
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        if nothing:
            dst = t.take(x.size, dtype)
            reduce(call, t, _src(t, x, dst), dst, opd)
            return None
        dst = result.reshape(-1)
        src = dst if result is x else _src(t, x, dst)
        reduce(call, t, src, dst, opd)
        if opd.average:
            average(result, opd, fn, combined, averages_itself)
        return result

    return start


def _reduce(c: Any, a: dict, x: np.ndarray) -> Callable[..., Any] | None:
    root = a["root"]
    if type(root) is not int:
        return None
    opd = resolve_op(a["op"], x.dtype)
    fn, name = _resolve(c, "reduce", a["algorithm"], x.nbytes, opd, a["options"], x.dtype)
    t, watch, shape, dtype, nbytes = c._backend.transport, c._watch, x.shape, x.dtype, x.nbytes
    is_root, size = c.rank == root, c.size
    averages_itself, reduce = c._backend.averages_itself, _reduce_with(c, opd, fn)

    def start(call: Any, x: Any, out: Any) -> Any:
        result = dst = None
        if is_root:
            if out is None:
                result = np.empty(shape, dtype)
            elif out is x and x.flags.writeable or _out(out, shape, dtype, x):
                result = out
            else:
                return MISS
            dst = result.reshape(-1)
        elif out is not None:
            return MISS  # the whole path checks and ignores a non-root's out
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        # linear reduce reads x after writing out: x is copied where it is the result
        reduce(call, t, _src(t, x, dst), dst, opd, root)
        if result is not None and opd.average:
            average(result, opd, fn, size, averages_itself)
        return result

    return start


def _reduce_scatter(c: Any, a: dict, x: np.ndarray) -> Callable[..., Any] | None:
    counts = a["counts"]
    if counts is None:
        if x.ndim == 0 or x.shape[0] != c.size:
            return None
        bounds, shape = even_bounds(x[0].size, c.size), x.shape[1:]
    else:
        counts = [int(n) for n in counts]
        if len(counts) != c.size or sum(counts) != x.size or min(counts) < 0:
            return None
        bounds, shape = counts_bounds(counts), (counts[c.rank],)
    opd = resolve_op(a["op"], x.dtype)
    fn, name = _resolve(c, "reduce_scatter", a["algorithm"], x.nbytes, opd, a["options"],
                        x.dtype, counts is not None)
    t, watch, dtype, nbytes, size = c._backend.transport, c._watch, x.dtype, x.nbytes, c.size
    averages_itself, reduce = c._backend.averages_itself, _reduce_with(c, opd, fn)

    def start(call: Any, x: Any, out: Any) -> Any:
        if out is None:
            result = np.empty(shape, dtype)
        elif _out(out, shape, dtype, x):
            result = out
        else:
            return MISS
        dst = result.reshape(-1)
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        reduce(call, t, _src(t, x, dst), bounds, opd, dst)
        if opd.average:
            average(result, opd, fn, size, averages_itself)
        return result

    return start


def _all_gather(c: Any, a: dict, x: np.ndarray) -> Callable[..., Any] | None:
    if x.ndim > 31:
        return None
    size, rank = c.size, c.rank
    nbytes = x.nbytes * size
    fn, name = _resolve(c, "all_gather", a["algorithm"], nbytes, None, a["options"], None)
    t, watch, dtype, shape = c._backend.transport, c._watch, x.dtype, (size, *x.shape)
    bounds = even_bounds(x.size, size)
    lo, hi = bounds[rank], bounds[rank + 1]

    def start(call: Any, x: Any, out: Any) -> Any:
        if out is None:
            result = np.empty(shape, dtype)
        elif (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
              and out.flags.c_contiguous and out.flags.writeable):
            result = out  # x may be its own row (in place), not any other part of it
        else:
            return MISS
        buf = result.reshape(-1)
        mine, src = buf[lo:hi], x.reshape(-1)
        if out is not None and not same_memory(src, mine):
            if np.may_share_memory(src, buf):
                return MISS
            mine[...] = src
        elif out is None:
            mine[...] = src
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        fn(t, buf, bounds)
        return result

    return start


def _gather(c: Any, a: dict, x: np.ndarray) -> Callable[..., Any] | None:
    root = a["root"]
    if type(root) is not int or x.ndim > 31:
        return None
    size = c.size
    nbytes = x.nbytes * size
    fn, name = _resolve(c, "gather", a["algorithm"], nbytes, None, a["options"], None)
    t, watch, dtype, shape = c._backend.transport, c._watch, x.dtype, (size, *x.shape)
    is_root, bounds = c.rank == root, even_bounds(x.size, size)

    def start(call: Any, x: Any, out: Any) -> Any:
        result = dst = None
        if is_root:
            if out is None:
                result = np.empty(shape, dtype)
            elif (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
                  and out.flags.c_contiguous and out.flags.writeable):
                result = out  # x=out[root] is the in-place form: _src copies an overlap
            else:
                return MISS
            dst = result.reshape(-1)
        elif out is not None:
            return MISS
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        fn(t, _src(t, x, dst if out is not None else None), dst, bounds, root)
        return result

    return start


def _all_to_all(c: Any, a: dict, x: np.ndarray) -> Callable[..., Any] | None:
    if x.ndim == 0 or x.shape[0] != c.size:
        return None
    fn, name = _resolve(c, "all_to_all", a["algorithm"], x.nbytes, None, a["options"], None)
    t, watch, dtype, shape, nbytes = c._backend.transport, c._watch, x.dtype, x.shape, x.nbytes
    bounds = even_bounds(x.size // c.size, c.size)

    def start(call: Any, x: Any, out: Any) -> Any:
        if out is None:
            result = np.empty(shape, dtype)
        elif out is x and x.flags.writeable or _out(out, shape, dtype, x):
            result = out
        else:
            return MISS
        dst = result.reshape(-1)
        rec = watch.current
        rec.algorithm, rec.nbytes = name, nbytes
        fn(t, _src(t, x, dst if out is not None else None), bounds, dst, bounds)
        return result

    return start


def _barrier(c: Any, a: dict, x: Any) -> Callable[..., Any]:
    fn, name = _resolve(c, "barrier", a["algorithm"], 0, None, a["options"], None)
    t, watch = c._backend.transport, c._watch

    def start(call: Any, x: Any, out: Any) -> None:
        rec = watch.current
        rec.algorithm, rec.nbytes = name, 0
        fn(t)

    return start


# -- broadcast: the root's header still goes first, with the data when it fits ------------


def _broadcast(c: Any, a: dict, x: Any) -> Callable[..., Any] | None:
    """The root sends the header it sent before (its x's shape and dtype are the key's);
    a receiver compares the header that comes with what it decided from: the same, it
    takes the data as decided; another, it goes on as the whole path does from there."""
    root, algorithm, options = a["root"], a["algorithm"], a["options"]
    if type(root) is not int or not 0 <= root < c.size:
        return None
    b = c._backend
    t, watch, packet, header, limit = b.transport, c._watch, c._packet, c._packet_header, \
        b.packed_bytes
    pack_fn, pack_name = _resolve(c, "broadcast", algorithm, agree.HEADER_BYTES + limit, None,
                                  options, None)
    if c.rank == root:
        if x is None:
            return None
        words = agree.header_of(x.dtype, x.shape)
        if words[0] != agree.OK:
            return None
        nbytes, shape, dtype = x.nbytes, x.shape, x.dtype
    else:
        words = header.copy()  # the root's header of the call that just ran
        if words[0] != agree.OK:
            return None
        from ..errors import MpicollError

        try:
            dtype, shape, device = agree.unpack_header(words, root, None)
        except MpicollError:
            return None
        if device or (x is not None and (x.shape != shape or x.dtype != dtype)):
            return None
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    packed = nbytes <= limit
    fn = name = None
    if not packed:
        fn, name = _resolve(c, "broadcast", algorithm, nbytes, None, options, None)
    end = agree.HEADER_BYTES + nbytes
    expected = words.tobytes()

    if c.rank == root:
        def start(call: Any, x: Any, out: Any) -> Any:
            rec = watch.current
            header[:] = words
            if packed:
                packet[agree.HEADER_BYTES:end] = x.reshape(-1).view(np.uint8)
            rec.algorithm, rec.nbytes = pack_name, agree.HEADER_BYTES + limit
            pack_fn(t, packet, root)
            if not packed:
                rec.algorithm, rec.nbytes = name, nbytes
                fn(t, _src(t, x, None), root)
            return x

        return start

    from .run import broadcast_received

    def receive(call: Any, x: Any, out: Any) -> Any:
        if x is not None and not x.flags.writeable:
            return MISS  # the whole path refuses it
        rec = watch.current
        rec.algorithm, rec.nbytes = pack_name, agree.HEADER_BYTES + limit
        pack_fn(t, packet, root)
        if header.tobytes() != expected:  # the root sent another header: as the whole path
            return broadcast_received(c, call, x, root, algorithm, options)
        result = np.empty(shape, dtype) if x is None else x
        if packed:
            result.reshape(-1).view(np.uint8)[...] = packet[agree.HEADER_BYTES:end]
        else:
            rec.algorithm, rec.nbytes = name, nbytes
            fn(t, result.reshape(-1), root)
        return result

    return receive


def _scatter(c: Any, a: dict, x: Any) -> Callable[..., Any] | None:
    """As broadcast: the root sends the header (with every row, when "auto" and small)
    it sent before; a receiver that gets another goes on as the whole path does."""
    root, algorithm, options = a["root"], a["algorithm"], a["options"]
    if type(root) is not int or not 0 <= root < c.size:
        return None
    b = c._backend
    t, watch, packet, header, size, rank = b.transport, c._watch, c._packet, \
        c._packet_header, c.size, c.rank
    if rank == root:
        if x is None or x.ndim == 0 or x.shape[0] != size:
            return None
        words = agree.header_of(x.dtype, x.shape[1:])
        if words[0] != agree.OK:
            return None
        if algorithm == "auto" and x.nbytes <= b.packed_bytes:
            words[3] |= agree.IN_PACKET
        dtype, shape = x.dtype, x.shape[1:]
    else:  # a receiver's x is not read (its result is out=, or made)
        words = header.copy()  # the root's header of the call that just ran
        if words[0] != agree.OK:
            return None
        from ..errors import MpicollError

        try:
            dtype, shape, device = agree.unpack_header(words, root, None)
        except MpicollError:
            return None
        if device:
            return None
    in_packet = bool(words[3] & agree.IN_PACKET)
    count = int(np.prod(shape, dtype=np.int64))
    nbytes = count * dtype.itemsize * size
    bounds = even_bounds(count, size)
    fn = name = None
    if not in_packet:
        fn, name = _resolve(c, "scatter", algorithm, nbytes, None, options, None)
    lo, hi = bounds[rank], bounds[rank + 1]
    first, last = (agree.HEADER_BYTES + i * dtype.itemsize for i in (lo, hi))
    end = agree.HEADER_BYTES + nbytes

    def result_for(out: Any, x: Any) -> Any:
        if out is None:
            return np.empty(shape, dtype)
        if (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
                and out.flags.c_contiguous and out.flags.writeable):
            return out
        return None

    if rank == root:
        def start(call: Any, x: Any, out: Any) -> Any:
            result = result_for(out, x)
            if result is None:
                return MISS
            src, dst = x.reshape(-1), result.reshape(-1)
            mine = src[lo:hi]
            if out is not None and np.may_share_memory(src, dst) and not same_memory(dst, mine):
                return MISS  # the whole path's stand-in
            rec = watch.current
            rec.algorithm, rec.nbytes = name or "packet", nbytes
            header[:] = words
            if in_packet:
                packet[agree.HEADER_BYTES:end] = src.view(np.uint8)
            agree.broadcast(c, packet, root)
            if in_packet:
                if not same_memory(dst, mine):
                    dst[...] = mine
            else:
                fn(t, src, dst, bounds, root)
            return result

        return start

    expected = words.tobytes()
    from .run import scatter_received

    def receive(call: Any, x: Any, out: Any) -> Any:
        result = result_for(out, x)
        if result is None:
            return MISS
        rec = watch.current
        rec.algorithm, rec.nbytes = name or "packet", nbytes
        agree.broadcast(c, packet, root)
        if header.tobytes() != expected:  # the root sent another header: as the whole path
            return scatter_received(c, call, root, algorithm, out, options)
        if in_packet:
            result.reshape(-1).view(np.uint8)[...] = packet[first:last]
        else:
            fn(t, None, result.reshape(-1), bounds, root)
        return result

    return receive


_DECIDERS: dict[str, Callable[..., Any]] = {
    "all_reduce": _all_reduce, "reduce": _reduce, "reduce_scatter": _reduce_scatter,
    "all_gather": _all_gather, "gather": _gather, "all_to_all": _all_to_all,
    "barrier": _barrier, "broadcast": _broadcast, "scatter": _scatter,
    "scan": lambda c, a, x: _scan(c, a, x, "scan"),
    "exscan": lambda c, a, x: _scan(c, a, x, "exscan"),
}
DECIDED = frozenset(_DECIDERS)
