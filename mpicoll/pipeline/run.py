"""Run: each collective as one pass through validate -> agree -> choose -> run -> deliver.

Every function takes the call state ``c`` (a Communicator: ``pipeline.state.CallState``),
the call's record and the caller's arguments, and returns what the public method returns.

``collective`` runs every collective whose ranks all know the input's shape before any
message (gather, all_gather, reduce, reduce_scatter, scan, exscan, all_to_all), read from
its ``CollectiveSpec``: a new collective of that kind is its spec entry and its
algorithms file. What remains written out is only what truly differs: broadcast's and
scatter's header packet (the root alone knows the shape), the v-variants' counts
exchange, and all_reduce, the most frequent call of all, with its wire compression.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..buffers import counts_bounds, dtype_code, even_bounds, flat
from ..buffers.arrays import (
    assign_from_host,
    device_like,
    empty,
    may_share_memory,
    same,
    same_memory,
    to_host,
)
from ..errors import InvalidArgumentError, MpicollError
from ..ops import Op, guarded_ops
from ..spec import SPECS
from ..transport.compress import WIRE, Compressing, wire_dtype
from . import agree, validate
from .deliver import average, give
from .describe import Call
from .validate import Verdict

if TYPE_CHECKING:
    from .state import CallState


def _stand_in(t: Any, count: int, dtype: np.dtype, like: Any) -> Any:
    """Workspace a rank that refuses where it receives takes part with (the call's own:
    free again at the next call)."""
    return t.take(count, dtype, like=like)


def _items_like(dtype: np.dtype, device: bool) -> np.dtype:
    """The dtype of workspace a rank takes part with: algorithms cut blocks and segments
    in items, so the stand-in must count items as the others do."""
    if not device or dtype_code(dtype) >= 0:
        return dtype
    return np.dtype(np.uint8)  # CuPy has no structured dtypes: none reaches a GPU


def _input(t: Any, src: Any, dst: Any = None) -> Any:
    """``src`` as the algorithms may read it: a copy in workspace when it overlaps the
    result buffer ``dst`` or cannot be written (some algorithms stage blocks in it)."""
    if (dst is not None and may_share_memory(src, dst)) or \
            (type(src) is np.ndarray and not src.flags.writeable):
        copy = t.take(src.size, src.dtype, like=src)
        copy[...] = src
        return copy
    return src


_op = validate.reduction_op


def _reducing(c: CallState, call: Call, opd: Any, fn: Any, *args: Any) -> None:
    """Run ``fn(*args)``, a reduction with ``opd``. A user's op may raise on some ranks:
    it is guarded (the rank goes on with what it has, so nothing is left queued), and the
    ranks then agree whether it raised anywhere: ``OpError`` on every rank if so. Only
    calls with a user's op pay for that exchange."""
    if opd.builtin:
        fn(*args)
        return
    with guarded_ops() as failures:
        fn(*args)
    agree.op_failures(c, call, opd, failures[0] if failures else None)


def _traced(c: CallState, opd: Any) -> Any:
    tracer = c._tracer
    if tracer is not None and opd is not None and tracer.algorithm != "native":
        from ..observe.tracing import timed_op

        return timed_op(opd, tracer)
    return opd


# -- rooted collectives whose root alone knows the data: a header goes first ------------


def broadcast(c: CallState, call: Call, x: Any, root: Any, algorithm: Any,
              options: dict[str, Any]) -> Any:
    b = c._backend
    t, v = b.transport, Verdict()
    root = validate.root(v, root, t.size)
    # the first message is a fixed-size packet: the header, and the data too when it
    # fits, so that small broadcasts take one round; "auto" for the data is resolved
    # from the header, the same on every rank
    pack_fn = c._chooser.pick(v, "broadcast", algorithm, agree.HEADER_BYTES + b.packed_bytes,
                              options=options)
    is_root, back = t.rank == root, same
    if is_root:
        x, back = validate.array(v, x, "input", device_only=b.device_only)
    elif x is not None:
        x, back = validate.array(v, x, "receive", device_only=b.device_only)
        validate.writeable_receive(v, x)
    agree.settle(c, call, v, (algorithm, options), root=root, dtype=None if x is None else x.dtype,
                 shape=None if x is None else x.shape, input_travels=True)
    packet, header, limit = c._packet, c._packet_header, b.packed_bytes

    def send_packet() -> None:
        if b.separate_control:  # NCCL: the host packet goes over MPI, the data over NCCL
            agree.broadcast(c, packet, root)
        else:
            pack_fn(t, packet, root)

    if is_root:
        header[:] = 0  # every word defined: a receiver compares the whole header
        if v.input is not None:
            agree.header_of(None, None, agree.BAD_INPUT, header)
        else:
            agree.header_of(x.dtype, x.shape, header=header, device=type(x) is not np.ndarray)
            if header[0] == agree.OK and x.nbytes <= limit:
                packet[agree.HEADER_BYTES:agree.HEADER_BYTES + x.nbytes] = \
                    to_host(flat(x)).view(np.uint8)
        t.use(x)
        send_packet()
        if v.input is not None:
            raise v.input
        if header[0] != agree.OK:
            raise InvalidArgumentError(f"x: {agree.REFUSALS[int(header[0])]}")
        if x.nbytes > limit:
            fn = c._chooser.function("broadcast", algorithm, x.nbytes, options=options)
            fn(t, _input(t, flat(x)), root)
        return back(x)
    t.use(x)
    send_packet()
    return back(broadcast_received(c, call, x, root, algorithm, options, v))


def broadcast_received(c: CallState, call: Call, x: Any, root: int, algorithm: Any,
                       options: dict[str, Any], v: Verdict | None = None) -> Any:
    """A receiver's broadcast once the root's packet has come: the root's dtype and shape
    from its header, the data from the packet or the chosen algorithm (``v``: this rank's
    verdict on its receive buffer ``x`` so far)."""
    b = c._backend
    t, v = b.transport, v or Verdict()
    packet, header, limit = c._packet, c._packet_header, b.packed_bytes
    dtype, shape, device = agree.unpack_header(header, root, call, v)
    nbytes = math.prod(shape) * dtype.itemsize
    packed = nbytes <= limit
    fn = None if packed else c._chooser.function("broadcast", algorithm, nbytes, options=options)
    like = b.like
    if x is None and v.receive is None:
        if device and like is None:
            try:
                like = device_like()
            except MpicollError as exc:
                v.refuse("receive", exc)
    elif x is not None and v.receive is None and (x.shape != shape or x.dtype != dtype):
        v.refuse("receive", InvalidArgumentError(
            f"x: the receive buffer has shape {x.shape} and dtype {x.dtype}, but the root "
            f"sends shape {shape} and dtype {dtype}"))
    if v.receive is not None:  # take part with workspace of the root's items, then refuse
        if fn is not None:
            items = _items_like(dtype, b.device_only)
            fn(t, _stand_in(t, nbytes // items.itemsize, items, b.like), root)
        raise v.receive
    if x is None:
        x = empty(shape, dtype, like=like)
    if packed:
        data = packet[agree.HEADER_BYTES:agree.HEADER_BYTES + nbytes]
        if x.flags.c_contiguous:
            assign_from_host(x.reshape(-1).view(np.uint8), data)
        else:
            assign_from_host(x, data.view(x.dtype).reshape(shape))
    elif x.flags.c_contiguous:
        fn(t, x.reshape(-1), root)
    else:
        buf = empty(x.size, x.dtype, like=x)
        fn(t, buf, root)
        x[...] = buf.reshape(x.shape)
    return x


def _root_header(c: CallState, call: Call, v: Verdict, is_root: bool, header: np.ndarray,
                 root: int, packet: np.ndarray | None = None,
                 ) -> tuple[np.dtype, tuple[int, ...], bool]:
    """Broadcast the root's header (in ``packet`` when given: the header and what goes
    with it); the root raises its own input refusal after sending it, the others a
    RemoteError."""
    if is_root and v.input is not None:
        header[:4] = (agree.BAD_INPUT, 0, 0, 0)
    c._backend.control.use(None)
    agree.broadcast(c, header if packet is None else packet, root)
    if is_root and v.input is not None:
        raise v.input
    if is_root and header[0] != agree.OK:
        raise InvalidArgumentError(f"x: {agree.REFUSALS[int(header[0])]}")
    return agree.unpack_header(header, root, call, v)


def scatter(c: CallState, call: Call, x: Any, root: Any, algorithm: Any, out: Any,
            options: dict[str, Any]) -> Any:
    b = c._backend
    t, v = b.transport, Verdict()
    root = validate.root(v, root, t.size)
    c._chooser.pick(v, "scatter", algorithm, 0, options=options)  # a bad name: before messages
    if algorithm == "auto":  # the header goes first, with the rows when they fit; what
        c._chooser.label(c._chooser.packet_mover(), 0)  # moves them is chosen after it
    is_root, back, result = t.rank == root, same, None
    packet, header, limit = c._packet, c._packet_header, b.packed_bytes
    if is_root:
        header[:] = 0  # every word defined: a receiver compares the whole header
        x, back = validate.array(v, x, "input", device_only=b.device_only)
        if validate.rows(v, x, t.size, "scatter"):
            agree.header_of(x.dtype, x.shape[1:], header=header, device=type(x) is not np.ndarray)
            result = validate.out(v, out, x.shape[1:], x.dtype, like=x)
    received = None
    if not is_root and out is not None:  # a receiver's out= that is no array it can
        # write: refused before the settle, where check mode tells every rank (its shape
        # waits for the root's header, scatter_received)
        received, _ = validate.array(v, out, "receive", "out", device_only=b.device_only)
        validate.writeable_receive(v, received, "out")
    # a non-root's out, compared in check mode: as an array (a torch tensor's dtype is
    # torch's; a refused out, None: nothing to compare)
    theirs = received
    agree.settle(c, call, v, (algorithm, options), root=root,
                 dtype=x.dtype if is_root and x is not None else getattr(theirs, "dtype", None),
                 shape=x.shape[1:] if is_root and x is not None and x.ndim
                 else getattr(theirs, "shape", None),
                 input_travels=True)
    if is_root and v.input is None and header[0] == agree.OK and algorithm == "auto" \
            and x.nbytes <= limit:
        # small, and "auto": every row goes in the packet with the header (one round)
        header[3] |= agree.IN_PACKET
        packet[agree.HEADER_BYTES:agree.HEADER_BYTES + x.nbytes] = to_host(flat(x)).view(np.uint8)
    _root_header(c, call, v, is_root, header, root, packet)
    if is_root:
        return _scatter_root(c, x, root, algorithm, out, options, v, result, back)
    return scatter_received(c, call, root, algorithm, out, options, v)


def _scatter_root(c: CallState, x: Any, root: int, algorithm: Any, out: Any,
                  options: dict[str, Any], v: Verdict, result: Any, back: Any) -> Any:
    """The root's scatter once its header has gone: its own row, and the others' rows
    unless they went with the header."""
    t = c._backend.transport
    count = x[0].size
    bounds = even_bounds(count, t.size)
    src = flat(x)
    mine = src[bounds[root]:bounds[root + 1]]
    whole = None if result is None else result.reshape(-1)
    if c._packet_header[3] & agree.IN_PACKET:
        if whole is not None and not same_memory(whole, mine):
            whole[...] = mine
        return give(v, result, out, back)
    fn = c._chooser.function("scatter", algorithm, x.nbytes, options=options)
    if whole is None:  # the root's out refused: take part, then raise
        dst = _stand_in(t, count, x.dtype, x)
    elif out is not None and may_share_memory(src, whole) and not same_memory(whole, mine):
        dst = _stand_in(t, count, x.dtype, x)  # overlaps x elsewhere than its own row
    else:
        dst = whole  # may be x[root] itself: MPI's in-place scatter
    t.use(x)
    fn(t, src, dst, bounds, root)
    if whole is not None and dst is not whole:
        whole[...] = dst
    return give(v, result, out, back)


def scatter_received(c: CallState, call: Call, root: int, algorithm: Any, out: Any,
                     options: dict[str, Any], v: Verdict | None = None) -> Any:
    """A receiver's scatter once the root's header has come: its row from the packet, or
    by the chosen algorithm (``v``: this rank's verdict so far)."""
    b = c._backend
    t, v = b.transport, v or Verdict()
    header = c._packet_header
    dtype, shape, device = agree.unpack_header(header, root, call, v)
    count = math.prod(shape)
    bounds = even_bounds(count, t.size)
    in_packet = bool(header[3] & agree.IN_PACKET)
    fn = None if in_packet else c._chooser.function(
        "scatter", algorithm, count * dtype.itemsize * t.size, options=options)
    like = b.like if out is None else None  # (out= given: checked as its own kind)
    if out is None and device and like is None:
        try:
            like = device_like()
        except MpicollError as exc:
            v.refuse("receive", exc)
    result = None
    if v.receive is None:
        result = validate.out(v, out, shape, dtype, like)
    if v.receive is not None:  # take part with workspace of the root's items, then refuse
        if fn is not None:
            items = _items_like(dtype, b.device_only)
            stand_in = _stand_in(t, count * dtype.itemsize // items.itemsize, items, b.like)
            fn(t, None, stand_in, even_bounds(stand_in.size, t.size), root)
        raise v.receive
    if in_packet:
        lo, hi = (agree.HEADER_BYTES + i * dtype.itemsize for i in bounds[t.rank:t.rank + 2])
        assign_from_host(result.reshape(-1).view(np.uint8), c._packet[lo:hi])
    else:
        t.use(result)
        fn(t, None, result.reshape(-1), bounds, root)
    return give(v, result, out, same)


def scatter_v(c: CallState, call: Call, x: Any, counts: Any, root: Any, algorithm: Any,
              options: dict[str, Any]) -> Any:
    b = c._backend
    t, v = b.transport, Verdict()
    p = t.size
    root = validate.root(v, root, p)
    c._chooser.pick(v, "scatter", algorithm, 0, options=options, uneven=True)
    is_root, back, mine = t.rank == root, same, None
    if counts is not None and not is_root:
        mine = validate.counts(v, counts, p, "counts", where="receive")
    header = np.zeros(agree.HEADER_LEN + p, np.int64)
    if is_root:
        x, back = validate.array(v, x, "input", device_only=b.device_only)
        validate.vector(v, x, "scatter_v")
        if x is not None and x.ndim and v.input is None:
            if counts is None:
                v.refuse("input", InvalidArgumentError("counts: the root must give counts"))
            else:
                mine = validate.counts(v, counts, p, "counts", where="input")
            if mine is not None and sum(mine) != x.shape[0]:
                v.refuse("input", InvalidArgumentError(
                    f"counts: they add up to {sum(mine)}, but x has {x.shape[0]} rows"))
        if v.input is None and agree.header_of(x.dtype, x.shape[1:], header=header,
                                               extra=p, device=type(x) is not np.ndarray)[0] == agree.OK:
            header[agree.HEADER_LEN:] = mine
    agree.settle(c, call, v, (algorithm, options), root=root,
                 dtype=x.dtype if is_root and x is not None else None,
                 shape=x.shape[1:] if is_root and x is not None and x.ndim else None,
                 counts=mine, input_travels=True)
    dtype, rest, device = _root_header(c, call, v, is_root, header, root)
    like = x if is_root else b.like
    if not is_root and device and like is None:
        try:
            like = device_like()
        except MpicollError as exc:  # take part with host memory, then refuse
            v.refuse("receive", exc)
    rows = header[agree.HEADER_LEN:].tolist()
    row = math.prod(rest)
    bounds = counts_bounds([r * row for r in rows])
    fn = c._chooser.function("scatter", algorithm, bounds[-1] * dtype.itemsize, options=options,
                             uneven=True)
    result = empty((rows[t.rank], *rest), dtype, like=like)
    t.use(result)
    fn(t, flat(x) if is_root else None, result.reshape(-1), bounds, root)
    if v.receive is None and mine is not None and mine != rows:
        v.refuse("receive", InvalidArgumentError(
            f"counts: this rank's {mine} differ from the root's {rows}"))
    return give(v, result, None, back)


# -- collectives where every rank knows every shape: the spec says all the rest -----------


def collective(c: CallState, call: Call, name: str, x: Any, algorithm: Any, out: Any,
               options: dict[str, Any], op: Any = None, root: Any = 0) -> Any:
    """validate -> agree -> choose -> run -> deliver for a collective whose ranks all
    know the input's shape before any message (gather, all_gather, reduce,
    reduce_scatter, scan, exscan, all_to_all), read from ``SPECS[name]``: which buffers
    are rows, who receives, the result's shape, the size "auto" chooses by, how the
    algorithms take their arguments, what avg divides by."""
    spec = SPECS[name]
    b = c._backend
    t, v = b.transport, Verdict()
    p, rank = t.size, t.rank
    if spec.rooted and not spec.reduces:  # (a reduction checks its op first, then root)
        root = validate.root(v, root, p)
    x, back = validate.array(v, x, device_only=b.device_only)
    if spec.input_rows:
        validate.rows(v, x, p, name)
    elif spec.result_rows:
        validate.result_dims(v, x, 1)
    opd = fn = None
    if not spec.reduces:
        fn = c._chooser.pick(v, name, algorithm,
                             0 if x is None else spec.chosen_bytes(x.nbytes, p), options=options)
    else:
        opd = _op(v, op, x)
        if x is not None and opd is not None:
            fn = c._chooser.pick(v, name, algorithm, x.nbytes, opd, options, dtype=x.dtype)
        opd = _traced(c, opd)
        if spec.rooted:
            root = validate.root(v, root, p)
    receives = not spec.result_at_root_only or rank == root
    combined = spec.combined(rank, p)  # 0: no result here (exscan's rank 0)
    result = None
    if receives and not v and (combined or out is not None):  # exscan's rank 0: out checked
        result = validate.out(v, out, spec.result_shape(x.shape, p), x.dtype, like=x)
    agree.settle(c, call, v, (algorithm, options), op=op if spec.reduces else None,
                 root=root if spec.rooted else agree.ANY, dtype=getattr(x, "dtype", None),
                 shape=getattr(x, "shape", None))
    src, dst = flat(x), None
    if receives:
        if result is not None and combined:
            dst = result.reshape(-1)
        else:  # out refused, or exscan's rank 0: take part with workspace
            dst = _stand_in(t, math.prod(spec.result_shape(x.shape, p)), x.dtype, x)
            if not combined:
                result = None  # (exscan's rank 0: its out= is left as it was)
    bounds = spec.bounds(x.shape, p)
    if spec.input_in_result:  # all_gather: x goes into its own row, the algorithm does the rest
        mine = dst[bounds[rank]:bounds[rank + 1]]
        if not same_memory(src, mine):  # unless x is that row already (in place)
            mine[...] = src
    elif spec.dst_may_be_src and result is x:
        src = dst  # in place, which these algorithms allow
    else:  # a copy where x overlaps out (linear reduce reads x after writing out) or is
        src = _input(t, src, dst if out is not None else None)  # read-only
    t.use(x)
    if opd is None or opd.builtin:
        spec.invoke(fn, t, src, dst, bounds, opd, root)
    else:
        _reducing(c, call, opd, spec.invoke, fn, t, src, dst, bounds, opd, root)
    if result is not None and opd is not None:
        average(result, opd, fn, combined, b.averages_itself)  # avg: by the ranks combined
    return give(v, result, out, back)


def _reduction(c: CallState, call: Call, collective: str, x: Any, op: Any, algorithm: Any,
               options: dict[str, Any], uneven: bool = False,
               ) -> tuple[Verdict, Any, Any, Any, Any]:
    """The checks every reducing collective makes: (verdict, x, back, op, function)."""
    b = c._backend
    v = Verdict()
    x, back = validate.array(v, x, device_only=b.device_only)
    opd = _op(v, op, x)
    fn = None
    if x is not None and opd is not None:
        fn = c._chooser.pick(v, collective, algorithm, x.nbytes, opd, options, dtype=x.dtype,
                             uneven=uneven)
    return v, x, back, _traced(c, opd), fn


def all_reduce(c: CallState, call: Call, x: Any, op: Any, algorithm: Any, out: Any,
               options: dict[str, Any], compress: Any = None) -> Any:
    # the most frequent call of all: the pipeline's stages written out without helpers
    t = c._backend.transport
    v = Verdict()
    if type(x) is np.ndarray and not c._backend.device_only and not x.dtype.hasobject:
        back = same
    else:
        x, back = validate.array(v, x, device_only=c._backend.device_only)
    opd = _op(v, op, x)
    fn = result = None
    wire = None if compress is None else _wire(v, compress, x, algorithm, opd)
    if opd is not None and (compress is None or wire is not None):
        try:  # compressed: chosen for the bytes on the wire, where the library cannot go
            fn = c._chooser.function("all_reduce", algorithm, x.nbytes, opd, options,
                                     dtype=x.dtype) if wire is None else \
                c._chooser.function("all_reduce", algorithm, x.size * wire.itemsize, opd,
                                    options, dtype=x.dtype, library=False)
        except MpicollError as exc:
            v.refuse("params", exc)
        if wire is not None:
            t = Compressing(t, wire)
            if fn is not None:  # (its wire told to every rank first: agree.told_wire)
                fn = agree.told_wire(c, t.rounding(fn), wire, compress)
        if c._tracer is not None:
            opd = _traced(c, opd)
        if fn is not None:
            result = np.empty(x.shape, x.dtype) if out is None and type(x) is np.ndarray \
                else validate.out(v, out, x.shape, x.dtype, like=x)
    if v.refused or c.check:
        agree.settle(c, call, v, (algorithm, options if compress is None else
                                  {**options, "compress": compress}),
                     op=op, dtype=getattr(x, "dtype", None), shape=getattr(x, "shape", None))
    if result is None:
        result = _stand_in(t, x.size, x.dtype, x)
    dst = result.reshape(-1)
    if result is x:
        src = dst  # in place: every all_reduce algorithm allows src is dst
    elif out is None and x.flags.c_contiguous and (type(x) is not np.ndarray or x.flags.writeable):
        src = x.reshape(-1)
    else:
        src = _input(t, flat(x), dst if out is not None else None)
    if type(x) is not np.ndarray:
        t.use(x)  # workspace on the GPU (begin took the host)
    if opd.builtin:
        fn(t, src, dst, opd)
    else:
        _reducing(c, call, opd, fn, t, src, dst, opd)
    if opd.average:
        average(result, opd, fn, t.size, c._backend.averages_itself)
    if v.receive is not None:
        raise v.receive
    if v.strided is not None:
        v.strided[...] = result
    return out if out is not None else result if back is same else back(result)


def _wire(v: Verdict, compress: Any, x: Any, algorithm: Any, op: Op | None = None,
          ) -> np.dtype | None:
    """The wire dtype of ``compress=`` (None, with the refusal kept in ``v``)."""
    if not isinstance(compress, str) or compress not in WIRE:  # (a list is unhashable)
        v.refuse("params", InvalidArgumentError(
            f"compress: expected one of {sorted(WIRE)} or None, got {compress!r}"))
    elif x is not None and (x.dtype.kind != "f" or x.dtype.itemsize not in (4, 8)):
        # (either byte order: x.dtype may be >f4)
        v.refuse("params", InvalidArgumentError(
            f"compress: float32 or float64 data only, got {x.dtype}"))
    elif op is not None and op.builtin and op.name in ("land", "lor", "lxor"):
        v.refuse("params", InvalidArgumentError(
            f"compress: op {op.name!r} tells zero from nonzero, and a value too small for "
            f"the {compress} wire would travel as zero; compress sum, avg, min, max, prod"))
    elif algorithm == "native":
        v.refuse("params", InvalidArgumentError(
            "compress: the library's own all_reduce ('native') sends x's own values; "
            "compress with one of mpicoll's algorithms (or 'auto')"))
    else:
        return wire_dtype(compress)
    return None


def reduce_scatter(c: CallState, call: Call, x: Any, op: Any, counts: Any, algorithm: Any,
                   out: Any, options: dict[str, Any]) -> Any:
    """reduce_scatter; with ``counts``, its v-form: the blocks' sizes, checked against x
    and agreed in check mode, cut x flat instead of by rows."""
    if counts is None:
        return collective(c, call, "reduce_scatter", x, algorithm, out, options, op)
    t = c._backend.transport
    v, x, back, opd, fn = _reduction(c, call, "reduce_scatter", x, op, algorithm, options,
                                     uneven=True)
    counts = validate.block_counts(v, counts, t.size, x)
    result = validate.out(v, out, (counts[t.rank],), x.dtype, like=x) if not v else None
    # (check mode: the v-form's shape field is its own, never a plain call's shape, so
    # counts [2, 3] never pass for a plain call's x of shape (2, 3), cut by rows)
    agree.settle(c, call, v, (algorithm, options), op=op, dtype=getattr(x, "dtype", None),
                 shape=("counts",), counts=tuple(counts or ()))
    bounds = counts_bounds(counts)
    dst = result.reshape(-1) if result is not None else \
        _stand_in(t, counts[t.rank], x.dtype, x)  # out refused: take part with workspace
    src = _input(t, flat(x), dst if out is not None else None)
    t.use(x)
    _reducing(c, call, opd, fn, t, src, bounds, opd, dst)
    if result is not None:
        average(result, opd, fn, t.size, c._backend.averages_itself)
    return give(v, result, out, back)


def barrier(c: CallState, call: Call, algorithm: Any, options: dict[str, Any]) -> None:
    b = c._backend
    v = Verdict()
    fn = c._chooser.pick(v, "barrier", algorithm, 0, options=options)
    agree.settle(c, call, v, (algorithm, options))
    b.transport.use(None)
    fn(b.transport)
    if b.queues_on_stream:  # NCCL: wait until the stream has run it
        b.transport.synchronize()


# -- v-variants: a different number of rows on every rank -----------------------------


def all_gather_v(c: CallState, call: Call, x: Any, algorithm: Any,
                 options: dict[str, Any]) -> Any:
    b = c._backend
    t, v = b.transport, Verdict()
    x, back = validate.array(v, x, device_only=b.device_only)
    validate.vector(v, x, "all_gather_v")
    c._chooser.pick(v, "all_gather", algorithm, 0, options=options, uneven=True)
    agree.settle(c, call, v, (algorithm, options), dtype=getattr(x, "dtype", None),
                 shape=x.shape[1:] if x is not None and x.ndim else None, input_travels=True)
    b.control.use(None)
    rows = agree.row_table(c, call, x, v.input, (algorithm, options))
    rest = math.prod(x.shape[1:])
    bounds = counts_bounds([r * rest for r in rows])
    fn = c._chooser.function("all_gather", algorithm, bounds[-1] * x.itemsize, options=options,
                             uneven=True)
    result = empty((sum(rows), *x.shape[1:]), x.dtype, like=x)
    buf = result.reshape(-1)
    buf[bounds[t.rank]:bounds[t.rank + 1]] = flat(x)
    t.use(x)
    fn(t, buf, bounds)
    return back(result), rows


def gather_v(c: CallState, call: Call, x: Any, root: Any, algorithm: Any,
             options: dict[str, Any]) -> Any:
    b = c._backend
    t, v = b.transport, Verdict()
    root = validate.root(v, root, t.size)
    x, back = validate.array(v, x, device_only=b.device_only)
    validate.vector(v, x, "gather_v")
    c._chooser.pick(v, "gather", algorithm, 0, options=options, uneven=True)
    agree.settle(c, call, v, (algorithm, options), root=root, dtype=getattr(x, "dtype", None),
                 shape=x.shape[1:] if x is not None and x.ndim else None, input_travels=True)
    b.control.use(None)
    rows = agree.row_table(c, call, x, v.input, (algorithm, options), root)  # (trees need
    # every subtree's size)
    rest = math.prod(x.shape[1:])
    bounds = counts_bounds([r * rest for r in rows])
    fn = c._chooser.function("gather", algorithm, bounds[-1] * x.itemsize, options=options,
                             uneven=True)
    result = empty((sum(rows), *x.shape[1:]), x.dtype, like=x) if t.rank == root else None
    t.use(x)
    fn(t, flat(x), None if result is None else result.reshape(-1), bounds, root)
    return back(result), rows


def all_to_all_v(c: CallState, call: Call, x: Any, send_counts: Any, algorithm: Any,
                 options: dict[str, Any]) -> Any:
    b = c._backend
    t, v = b.transport, Verdict()
    x, back = validate.array(v, x, device_only=b.device_only)
    validate.vector(v, x, "all_to_all_v")
    send = validate.counts(v, send_counts, t.size, "send_counts", where="input")
    if send is not None and x is not None and x.ndim and sum(send) != x.shape[0]:
        v.refuse("input", InvalidArgumentError(
            f"send_counts: they add up to {sum(send)}, but x has {x.shape[0]} rows"))
    # (an algorithm of equal blocks, bruck: refused below, on every rank alike, where the
    # exchange finds the blocks uneven)
    c._chooser.pick(v, "all_to_all", algorithm, 0, options=options)
    agree.settle(c, call, v, (algorithm, options), dtype=getattr(x, "dtype", None),
                 shape=x.shape[1:] if x is not None and x.ndim else None, input_travels=True)
    # every rank tells every rank how many rows come, with its dtype/shape signature, its
    # refusal, its whole input's size (so "auto" decides from the global total), the
    # rows of each of its blocks where all are alike (-1: not: every rank learns whether
    # every block of the call is alike, so an algorithm of equal blocks may run) and its
    # algorithm (ranks that ran two would wait for each other)
    refused = v.input is not None
    outgoing = np.zeros((t.size, 6), np.int64)
    outgoing[:, 5] = agree.algorithm_number((algorithm, options), call.collective)
    if refused:
        outgoing[:, 2] = 1
    else:
        outgoing[:, 0], outgoing[:, 1], outgoing[:, 3] = send, agree.signature(
            x.dtype, x.shape[1:]), x.nbytes
        outgoing[:, 4] = send[0] if len(set(send)) == 1 else -1
    incoming = np.empty_like(outgoing)
    pairs = even_bounds(6, t.size)
    exchange = b.control_native.get("all_to_all") or _pairwise()
    b.control.use(None)
    exchange(b.control, outgoing.reshape(-1), pairs, incoming.reshape(-1), pairs)
    agree.check_table(call, incoming[:, 1], incoming[:, 2], v.input, incoming[:, 5])
    received = incoming[:, 0].tolist()
    total = int(incoming[:, 3].sum())  # the same on every rank
    alike = bool(incoming[0, 4] >= 0 and (incoming[:, 4] == incoming[0, 4]).all())  # (too)
    row = math.prod(x.shape[1:])
    send_bounds = counts_bounds([n * row for n in send])
    recv_bounds = counts_bounds([n * row for n in received])
    fn = c._chooser.function("all_to_all", algorithm, total // t.size, options=options,
                             uneven=not alike)
    if fn is b.native.get("all_to_all"):  # the library's own: its v-form, where it has one
        fn = getattr(fn, "v_form", fn)
    result = empty((sum(received), *x.shape[1:]), x.dtype, like=x)
    t.use(x)
    fn(t, flat(x), send_bounds, result.reshape(-1), recv_bounds)
    return back(result), received


def _pairwise() -> Any:
    from ..algorithms import REGISTRY

    return REGISTRY["all_to_all"]["pairwise"].fn


def compress_refusal(compress: Any, x: Any, op: Any, algorithm: Any) -> MpicollError | None:
    """What all_reduce refuses of ``compress=`` on these values (a plan asks at init)."""
    v, aside = Verdict(), Verdict()  # (x and op themselves: refused as a call's are)
    x, _ = validate.array(aside, x)
    opd = validate.reduction_op(aside, op, x)
    _wire(v, compress, x, algorithm, opd)
    return v.first
