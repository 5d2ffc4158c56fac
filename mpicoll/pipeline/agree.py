"""Agree: what the ranks share before data moves, so every decision is the same everywhere.

- ``settle``: after this rank's checks. In check mode the fingerprint of the call (its
  collective, algorithm, op, root, dtype, shape, sequence number, and this rank's
  verdict and call site) is compared across ranks first, and any refusal or mismatch is
  raised on every rank, naming ranks, calls and sites. Otherwise a refusal in the call's
  parameters or this rank's input is raised at once, before any message.
- ``resync``: the next call after a refusal this rank raised alone first checks, on tags
  no call uses, that every rank refused that same call.
- a root's header (broadcast, scatter, scatter_v): shape, dtype and the root's refusal;
- the v-variants' tables: every rank's rows (and refusal), so that ``auto`` decides
  from global totals;
- ``settings`` and ``tables`` when a Communicator is made: every rank's settings (check
  mode, timeout, flight recorder, trace, CUDA-awareness, dump folder) in one exchange, so
  a malformed one on any rank raises on every rank; check mode and tracing must be on
  everywhere or nowhere; the tuning and model files are read on rank 0 only and
  shared, so a file that differs per node cannot make ranks pick differently.

Host messages are small int64 arrays (no pickle), on the backend's control transport.
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import selection
from ..algorithms import REGISTRY
from ..buffers import dtype_code, dtype_from_code, dtype_from_text, dtype_text, even_bounds
from ..buffers.cuda import parse_flag
from ..config import unwritable
from ..errors import (
    CollectiveError,
    CollectiveTimeoutError,
    ConfigError,
    InvalidArgumentError,
    MismatchError,
    MpicollError,
    OpError,
    RemoteError,
    SettingMismatchError,
    UnsupportedDtypeError,
)
from ..observe.recorder import AGREEMENT_STEPS, DEFAULT_RECORDER, recorder_length, world_ranks
from ..observe.tracing import controlling, trace_path
from ..observe.watchdog import DEFAULT_TIMEOUT, dump_dir, made_late, timeout_setting
from ..ops import Op, op_name
from ..spec import COLLECTIVES, SPECS
from ..transport.compress import WIRE
from .describe import Call
from .validate import Verdict

if TYPE_CHECKING:
    from ..backends import Backend
    from .state import CallState

ANY = -1  # a fingerprint field this rank cannot know (broadcast/scatter with None)
# every call's name, for MismatchError's text: each collective's, and the calls beside them
NAMES = (*COLLECTIVES, "all_gather_v", "gather_v", "scatter_v", "all_to_all_v",
         "monitored_barrier")
_FIELDS = ("collective", "algorithm or its options", "op", "root", "dtype", "shape",
           "call number", "counts")
_SITE_BYTES, _TEXT_BYTES = 96, 160
_ROW = len(_FIELDS) + 1 + (_SITE_BYTES + _TEXT_BYTES) // 8


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


# the steps numbered as calls of their own (observe.recorder.AGREEMENT_STEPS) by the
# crc of their names, for check mode's report of a rank that made another call
STEPS: dict[int, str] = {crc(name): name for name in AGREEMENT_STEPS}


def dtype_crc(dtype: np.dtype) -> int:
    # the name tells bfloat16 from other 2-byte voids; a structured dtype's fields (names,
    # formats, offsets) tell it from others of its size, all '|V8void64' by str and name
    fields = "" if dtype.fields is None else repr(dtype.descr)
    return crc(dtype.str + dtype.name + fields)


def signature(dtype: np.dtype, rest: tuple[int, ...]) -> int:
    """A number for (dtype, shape after the first dimension): what the v-variants compare."""
    return crc(f"{dtype_crc(dtype)}{tuple(rest)}")


# -- collectives on the control transport --------------------------------------------


def all_gather(c: CallState, table: np.ndarray, block: int, note: str = "") -> None:
    """All-gather ``table`` (rank r's ``block`` items at r * block) over control.
    ``note``: what the watchdog says the call waits for meanwhile (a step of the call's
    own, before or after its data: it waits for every rank to reach it)."""
    b, tracer = c._backend, c._tracer
    fn = b.control_native.get("all_gather") or REGISTRY["all_gather"]["recursive_doubling"].fn
    if tracer is not None:  # (traced as mpicoll's own messages, not the algorithm's)
        tracer.control += 1
    try:
        if not note:
            fn(b.control, table, even_bounds(block, b.control.size))
            return
        rec = c._watch.current
        kept, rec.note = rec.note, f"waiting for every rank to reach {note}"
        try:
            fn(b.control, table, even_bounds(block, b.control.size))
        finally:
            rec.note = kept
    finally:
        if tracer is not None:
            tracer.control -= 1


def broadcast(c: CallState, buf: np.ndarray, root: int) -> None:
    b, tracer = c._backend, c._tracer
    fn = b.control_native.get("broadcast") or REGISTRY["broadcast"]["binomial"].fn
    if tracer is None:
        fn(b.control, buf, root)
        return
    with controlling(tracer):  # (traced as mpicoll's own messages)
        fn(b.control, buf, root)


def _text(text: str, nbytes: int) -> np.ndarray:
    raw = text.encode("utf-8", "replace")[:nbytes]
    out = np.zeros(nbytes, np.uint8)
    out[:len(raw)] = np.frombuffer(raw, np.uint8)
    return out.view(np.int64)


def _untext(words: np.ndarray) -> str:
    return words.view(np.uint8).tobytes().rstrip(b"\0").decode("utf-8", "replace")


# -- check mode, and refusals ----------------------------------------------------------


def settle(c: CallState, call: Call, verdict: Verdict, algorithm: Any, *, op: Any = None,
           root: Any = ANY, dtype: Any = None, shape: Any = None, counts: Any = None,
           input_travels: bool = False) -> None:
    """Raise what must be raised before any data moves (see the module's docstring).

    ``algorithm``: the name, or (name, tuning options): ranks must agree on both.
    ``counts``: counts several ranks give and must agree on (scatter_v's), or None.
    ``input_travels``: this rank's input refusal reaches the others in a message the
    call sends anyway (a root's header, the v-variants' tables), so it is not raised here.
    """
    if c.check:
        fingerprint(c, call, verdict, algorithm, op, root, dtype, shape, counts)
        return
    refusal = verdict.params or (None if input_travels else verdict.input)
    if refusal is not None:
        c._refused_alone = call.seq  # the next call checks that the others refused too
        raise refusal


def _algorithm_text(algorithm: Any, collective: str = "") -> str:
    """The algorithm field of a fingerprint: its name, and its tuning options if any,
    less those that say what the algorithm does without them (``intra="binomial"`` on
    one rank and nothing on another are the same call: the same messages)."""
    if isinstance(algorithm, tuple):
        name, options = algorithm
        if options:
            defaults = _option_defaults(collective, name)
            options = {k: v for k, v in options.items()
                       if k not in defaults or not _is_default(v, defaults[k])}
        return f"{name} {sorted((k, _option_value(v)) for k, v in options.items())}" \
            if options else str(name)
    return str(algorithm)


def _option_value(value: Any) -> Any:
    """An option's value as check mode compares it: an int as the call takes it
    (``np.int64(1024)`` is 1024), a name as it is, anything else by its type alone (an
    array's data is not compared: the call refuses it on every rank)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, str):  # (np.str_("bf16") is "bf16", as the call takes it)
        return str(value)
    if isinstance(value, (float, bool)) or value is None:
        return value
    return f"<{type(value).__name__}>"


def _is_default(value: Any, default: Any) -> bool:
    try:  # (a bool is no option's value: True == 1, but the call refuses it)
        return type(value) is not bool and bool(value == default)
    except Exception:  # noqa: BLE001 - a value that does not compare: not the default
        return False


def _option_defaults(collective: str, name: Any) -> dict[str, Any]:
    """The tuning options of ``collective``'s algorithm ``name`` and their defaults ({}
    where it has none, or is no registered algorithm); ``collective`` as a fingerprint
    names it ("all_gather_v", "all_reduce_init", "all_reduce async")."""
    base = collective.split(" ")[0].removesuffix("_init").removesuffix("_v")
    registered = REGISTRY.get(base, {}).get(name) if isinstance(name, str) else None
    return {} if registered is None else registered.option_defaults


def op_text(op: Any) -> str:
    """An op as check mode compares it: a built-in by its name (given as a name or an
    Op), a user's Op by its name and commutativity, never equal to a built-in's (the
    native collective and "auto" take other paths for it)."""
    if isinstance(op, Op) and not op.builtin:
        return f"user op {op.name} (commutative: {bool(op.commutative)})"
    return op_name(op)


def fingerprint(c: CallState, call: Call, verdict: Verdict, algorithm: Any, op: Any, root: Any,
                dtype: Any, shape: Any, counts: Any = None) -> None:
    """Check mode: compare the call across ranks; raise on every rank on any refusal or
    disagreement."""
    mine = np.zeros(_ROW, np.int64)
    try:
        op_field = ANY if op is None else crc(op_text(op))
    except MpicollError:
        op_field = crc(repr(op))
    mine[:len(_FIELDS) + 1] = (
        crc(call.collective), crc(_algorithm_text(algorithm, call.collective)), op_field,
        root if isinstance(root, (int, np.integer)) and not isinstance(root, bool) else ANY,
        ANY if dtype is None else dtype_crc(np.dtype(dtype)),
        ANY if shape is None else crc(repr(tuple(shape))),
        call.seq, ANY if counts is None else crc(repr(tuple(counts))), 1 if verdict else 0)
    start = len(_FIELDS) + 1
    mine[start:start + _SITE_BYTES // 8] = _text(call.site, _SITE_BYTES)
    if verdict:
        mine[start + _SITE_BYTES // 8:] = _text(str(verdict.first), _TEXT_BYTES)
    t = c._backend.control
    table = np.empty(t.size * _ROW, np.int64)
    table[t.rank * _ROW:(t.rank + 1) * _ROW] = mine
    all_gather(c, table, _ROW, "check mode's comparison of the call (every rank's "
               "collective, algorithm, op, root, dtype, shape)")
    rows = table.reshape(t.size, _ROW)
    sites = [_untext(rows[r, start:start + _SITE_BYTES // 8]) for r in range(t.size)]

    refused = [r for r in range(t.size) if rows[r, len(_FIELDS)]]
    if refused:
        if verdict:
            raise verdict.first
        detail = "; ".join(
            f"rank {r} ({sites[r]}): {_untext(rows[r, start + _SITE_BYTES // 8:])}"
            for r in refused)
        raise RemoteError(f"{call.name()}: refused on {detail}")
    fields = rows[:, :len(_FIELDS)]
    known = fields != ANY
    first_known = np.where(known.any(axis=0),
                           fields[known.argmax(axis=0), np.arange(len(_FIELDS))], fields[0])
    if (~known | (fields == first_known)).all():  # (every call: all agree, one comparison)
        return
    reference = first_known.copy()
    for f in range(len(_FIELDS)):  # the value most ranks that know the field have (in a
        values = fields[known[:, f], f]  # tie, the lowest such rank's): the ranks apart
        if values.size:                  # from it are named, never the many that agree
            reference[f] = _most(values)
    root = _data_root(call.collective, reference, rows)
    if root is not None:  # broadcast's, scatter's data is the root's: its dtype and shape
        for f in (_DTYPE, _SHAPE):  # are the call's, a receiver's buffer apart from them
            if rows[root, f] != ANY:
                reference[f] = rows[root, f]
    differ = {}
    for r in range(t.size):
        apart = [name for f, name in enumerate(_FIELDS)
                 if rows[r, f] != ANY and rows[r, f] != reference[f]]
        if apart:
            differ[r] = apart
    if differ:
        names = {crc(n): n for n in NAMES} | {crc(f"{n} async"): f"{n}(async_op=True)"
                                              for n in NAMES} | {crc(f"{n}_init"): f"{n}_init"
                                                                 for n in NAMES} | {
            crc(f"{n} plan"): f"{n} plan start" for n in NAMES} | {crc("dup"): "dup"} | STEPS

        def what(r: int) -> str:
            return f"{names.get(int(rows[r, 0]), '?')} call #{rows[r, 6]} at {sites[r]}"

        first = root if root is not None and root not in differ else \
            next((r for r in range(t.size) if r not in differ), None)
        detail = "; ".join(f"rank {r} differs in {', '.join(f)} ({what(r)})"
                           for r, f in differ.items())
        others = "" if first is None else f"; rank {first}: {what(first)}"
        raise MismatchError(f"{call.name()}: ranks disagree on the call: {detail}{others}")


_ROOT, _DTYPE, _SHAPE = (_FIELDS.index(f) for f in ("root", "dtype", "shape"))


def _data_root(collective: str, reference: np.ndarray, rows: np.ndarray) -> int | None:
    """The root whose data a call of ``collective`` (its fingerprint's name: "scatter
    async", "broadcast_init", ...) carries, where the ranks agree on it and it names
    itself; else None."""
    name = collective.split()[0].removesuffix("_init")
    spec = SPECS.get(name)
    if spec is None or not spec.input_at_root_only:
        return None
    root = int(reference[_ROOT])
    return root if 0 <= root < len(rows) and rows[root, _ROOT] == root else None


def resync(c: CallState, call: Call) -> None:
    """After this rank raised a refusal alone (call ``c._refused_alone``), check on tags
    no call uses that every rank refused that same call; raise on every rank if not.
    A rank that did not refuse is still in that call or has left it: this waits for it,
    and the Communicator's timeout ends the wait with a report."""
    refused, c._refused_alone = c._refused_alone, 0
    t = c._backend.control
    table = np.zeros(t.size, np.int64)
    table[t.rank] = refused
    saved = t.tag
    t.tag = saved + t.side_tags
    rec = c._watch.current  # what the watchdog says of the wait, should it be overdue
    note, rec.note = rec.note, (
        f"settling call #{refused}, which this rank refused or failed alone: waiting for "
        "every rank's account of it (a rank that did not is still in it or has left it: an "
        "argument only this rank gave, such as a root, counts or a shape; give every rank "
        "the same, or run with MPICOLL_CHECK=1 to have every rank raise)")
    try:  # point-to-point messages on those tags: never the library's own collective,
        # which MPI would match with a collective the others still wait in
        with controlling(c._tracer):
            REGISTRY["all_gather"]["recursive_doubling"].fn(t, table, even_bounds(1, t.size))
    except CollectiveTimeoutError as exc:  # (the local backend's receive), said with why
        c._watch.timed_out(exc, c.rank)
        raise
    finally:
        t.tag, rec.note = saved, note
    if (table != refused).any():
        detail = ", ".join(f"rank {r}: #{n}" if n else f"rank {r}: none"
                           for r, n in enumerate(table.tolist()))
        raise MismatchError(
            f"{call.name()}: after a refused call the ranks disagree on which call was "
            f"refused ({detail})")


WIRE_CODES = {"bfloat16": 1, "float16": 2}  # a compressed all_reduce's wire, as told


def told_wire(c: CallState, fn: Any, wire: np.dtype, compress: str) -> Any:
    """``fn``, a compressed all_reduce's runner ``fn(t, src, dst, *args)``, after every
    rank has told every rank its wire format: one all-gather of a word over control, on
    the call's tags, before the data. bfloat16's and float16's messages are of one length,
    so nothing else tells them apart: ranks that gave other compress= would read each
    other's bits as their own wire's, silently. Where they differ, MismatchError on every
    rank before any data. (A rank that compresses nothing sends its data first, of another
    length than the word: mpicoll's algorithms check every message's length, so it and
    its peers raise there, as they did before.)"""
    code, b = WIRE_CODES[wire.name], c._backend
    control, names = b.control, {WIRE_CODES[w]: name for name, w in WIRE.items()}
    shared = control is b.transport  # (then the data's workspace is set again after)
    exchange = REGISTRY["all_gather"]["recursive_doubling"].fn  # point-to-point messages,
    # never the library's own collective, which a rank that does not compress never makes

    def told(t: Any, src: Any, dst: Any, *args: Any) -> None:
        table = np.zeros(control.size, np.int64)
        table[control.rank] = code
        rec = c._watch.current
        note, rec.note = rec.note, ("waiting for every rank to tell its compress= (the wire "
                                    "format of a compressed all_reduce)")
        try:
            if shared:
                control.use(None)
            with controlling(c._tracer):
                exchange(control, table, even_bounds(1, control.size))
        finally:
            rec.note = note
        if shared:
            control.use(src)
        if (table != code).any():
            said = ", ".join(f"rank {r}: {names.get(int(w), 'none')}"
                             for r, w in enumerate(table.tolist()))
            raise MismatchError(f"all_reduce: the ranks gave other compress= ({said}); give "
                                f"every rank the same (this rank: {compress})")
        fn(t, src, dst, *args)

    return told


def op_failures(c: CallState, call: Call, op: Op, failure: OpError | None) -> None:
    """After a call with a user's op: tell every rank which ranks' op raised; raise
    ``OpError`` on every rank if any did (this rank's own failure as its cause)."""
    t = c._backend.control
    table = np.zeros(t.size, np.int64)
    table[t.rank] = failure is not None
    t.use(None)
    all_gather(c, table, 1, f"the account of the user's op {op.name!r} after the data")
    failed = np.flatnonzero(table).tolist()
    if not failed:
        return
    where = f"rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))}"
    text = (f"{call.name()}: op {op.name!r} raised on {where}; every rank raises this "
            "and no result was delivered")
    if failure is not None:
        cause = failure.__cause__
        raise OpError(f"{text} (here: {type(cause).__name__}: {cause})") from cause
    raise OpError(text)


# -- a root's header: what the others need to know of its data -------------------------

HEADER_LEN = 4 + 32  # [status, dtype code, itemsize, ndim | on device, dim 0, dim 1, ...]
HEADER_BYTES = HEADER_LEN * 8
MAX_NDIM = HEADER_LEN - 4
ON_DEVICE = 1 << 16  # in the ndim field: the root's array is on the GPU
IN_PACKET = 1 << 17  # in the ndim field: the data follows the header in its packet
OK, BAD_INPUT, TOO_MANY_DIMS, NO_CODE = range(4)
REFUSALS = {
    BAD_INPUT: "the root refused its own input",
    TOO_MANY_DIMS: f"the root's x has more than {MAX_NDIM} dimensions",
    NO_CODE: "the root's dtype cannot be described to the other ranks (Python objects, "
             "or a description longer than the header's room after the shape)",
}


def header_of(dtype: np.dtype | None, shape: tuple[int, ...] | None, status: int = OK,
              header: np.ndarray | None = None, extra: int = 0, device: bool = False,
              ) -> np.ndarray:
    """Fill ``header`` (or a new one, with ``extra`` slots after it) with a dtype, shape
    and whether the data is on the GPU, or a refusal status.

    A dtype of the table goes as its code; any other (byte order, structured, strings,
    datetimes) as its description in the words after the shape, so every rank can
    allocate the root's very dtype; one that cannot be described is refused (NO_CODE)."""
    header = np.zeros(HEADER_LEN + extra, np.int64) if header is None else header
    if status == OK and len(shape) > MAX_NDIM:
        status = TOO_MANY_DIMS
    code = -1
    if status == OK:
        code = dtype_code(dtype)
        if code < 0:
            text = dtype_text(dtype)
            room = (HEADER_LEN - 4 - len(shape)) * 8
            if text is None or len(text) >= room:
                status = NO_CODE
            else:
                header[4 + len(shape):HEADER_LEN] = _text(text, room)
    if status != OK:
        header[:4] = (status, 0, 0, 0)
        return header
    header[:4 + len(shape)] = (OK, code, dtype.itemsize,
                               len(shape) | (ON_DEVICE if device else 0), *shape)
    return header


def unpack_header(header: np.ndarray, root: int, call: Call | None, v: Verdict | None = None,
                  ) -> tuple[np.dtype, tuple[int, ...], bool]:
    """(dtype, shape, on the GPU) from a root's header; a root's refusal raises
    RemoteError here (the root raises its own). A dtype this rank cannot read as the
    root's (a code its ml_dtypes lacks, another itemsize: two versions of a library)
    raises; with ``v``, it is this rank's refusal instead, and the dtype given back is
    raw items of the root's itemsize, so that the receiver takes part, then raises."""
    status, code, itemsize, ndim = header[:4].tolist()
    if status != OK:
        raise RemoteError(f"{(call.name() + ': ') if call else ''}root {root} refused the "
                          f"call: {REFUSALS.get(status, 'status ' + str(status))}")
    device, ndim = bool(ndim & ON_DEVICE), ndim & (ON_DEVICE - 1)
    shape = tuple(header[4:4 + ndim].tolist())
    try:
        dtype = dtype_from_code(code) if code >= 0 else \
            dtype_from_text(_untext(header[4 + ndim:HEADER_LEN]))
        if dtype.itemsize != itemsize:
            raise UnsupportedDtypeError(
                f"the root's dtype code {code} is {itemsize} bytes an item, this rank's "
                f"{dtype} {dtype.itemsize}: the ranks' libraries (ml_dtypes) differ")
    except UnsupportedDtypeError as exc:
        if v is None or not 0 < itemsize < 1 << 20:
            raise
        v.refuse("receive", UnsupportedDtypeError(
            f"x: the root {root} sends a dtype this rank cannot read: {exc}"))
        # (an unsigned int of that size where there is one: CuPy has no void items)
        raw = f"u{itemsize}" if itemsize in (1, 2, 4, 8) else (np.void, itemsize)
        return np.dtype(raw), shape, device
    return dtype, shape, device


# -- the v-variants' tables --------------------------------------------------------------


def row_table(c: CallState, call: Call, x: Any, refusal: MpicollError | None,
              algorithm: Any, root: int | None = None) -> list[int]:
    """All-gather every rank's (rows, dtype/row-shape signature, refusal, ``algorithm``
    (with its options: ``algorithm_number``), ``root``: a gather_v's); return the rows.

    Every rank sees the whole table, so a refusal or a disagreement raises on every rank
    (an algorithm or root the ranks disagree on too: ranks that ran two algorithms would
    wait for each other until the timeout; where no rank took the root's part, every rank
    would only send, and return with nothing said).
    """
    t = c._backend.control
    table = np.zeros(5 * t.size, np.int64)
    mine = table[5 * t.rank:5 * t.rank + 5]
    mine[3:] = -1 if root is None else root, algorithm_number(algorithm, call.collective)
    if refusal is None:
        mine[:2] = x.shape[0], signature(x.dtype, x.shape[1:])
    else:
        mine[2] = 1
    all_gather(c, table, 5, "the exchange of every rank's rows, before the data")
    rows = table.reshape(t.size, 5)
    check_table(call, rows[:, 1], rows[:, 2], refusal, rows[:, 4], rows[:, 3])
    return rows[:, 0].tolist()


def algorithm_number(algorithm: Any, collective: str) -> int:
    """A number for a call's ``algorithm`` (name, or (name, options)) as check mode
    compares it: what the v-variants' tables carry."""
    return crc(_algorithm_text(algorithm, collective))


def check_table(call: Call, signatures: np.ndarray, refusals: np.ndarray,
                refusal: MpicollError | None, algorithms: np.ndarray | None = None,
                roots: np.ndarray | None = None) -> None:
    """Raise on every rank when a rank refused (that rank its own ``refusal``), or the
    ranks' algorithms, roots or signatures differ (the ranks apart from what most give
    named)."""
    if refusal is not None:
        raise refusal
    refused = np.flatnonzero(refusals).tolist()
    if refused:
        raise RemoteError(f"{call.name()}: rank(s) {', '.join(map(str, refused))} "
                          "refused their input")
    if algorithms is not None and (apart := _apart_from_most(algorithms)):
        rest = [r for r in range(len(algorithms)) if r not in apart[0]]
        raise MismatchError(
            f"{call.name()}: ranks disagree on the algorithm (or its options): rank(s) "
            f"{', '.join(map(str, apart[0]))} name another than rank(s) "
            f"{', '.join(map(str, rest))}; give every rank the same (\"auto\" and a name "
            "differ too)")
    if roots is not None and (apart := _apart_from_most(roots)):
        differ, most = apart
        raise MismatchError(
            f"{call.name()}: ranks disagree on the root: rank(s) "
            + ", ".join(f"{r} (root {roots[r]})" for r in differ)
            + f" apart from the others' root {most}")
    if apart := _apart_from_most(signatures):
        raise MismatchError(
            f"{call.name()}: ranks disagree on the dtype or the shape after the first "
            f"dimension: rank(s) {', '.join(map(str, apart[0]))} differ from the others")


def _apart_from_most(values: np.ndarray) -> tuple[list[int], int] | None:
    """The ranks whose value is not ``_most``'s, and that value; None where every rank
    gives one value."""
    if (values == values[0]).all():
        return None
    reference = _most(values)
    return [r for r in range(len(values)) if values[r] != reference], reference


def _most(values: np.ndarray) -> int:
    """The value most ranks give (in a tie, the lowest such rank's): what a disagreement
    is told apart from, so that the few apart are named, never the many that agree."""
    kinds, counts = np.unique(values, return_counts=True)
    most = kinds[counts == counts.max()]
    return next(v for v in values.tolist() if v in most)


# -- when a Communicator is made --------------------------------------------------------


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def check_setting(value: Any) -> tuple[bool, MpicollError | None]:
    """``check=`` (None: ``MPICOLL_CHECK``, which takes 1/true/yes/on or 0/false/no/off in
    any case) as a bool, or the refusal of a malformed value."""
    if value is None:
        text = os.environ.get("MPICOLL_CHECK", "").strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE, None
        return False, ConfigError(f"MPICOLL_CHECK: expected 1/true/yes/on or 0/false/no/off, "
                                  f"got {os.environ['MPICOLL_CHECK']!r}")
    if not isinstance(value, (bool, np.bool_)):
        return False, InvalidArgumentError(f"check: expected True or False, got {value!r}")
    return bool(value), None


# the settings a Communicator is made with, in the order of their fields in the table
SETTINGS = ("check", "timeout", "MPICOLL_FLIGHT_RECORDER", "trace", "MPICOLL_CUDA_AWARE",
            "MPICOLL_DUMP_DIR", "MPICOLL_RANKS_PER_NODE")
_REFUSED_CONFIG, _REFUSED_ARGUMENT = 1, 2  # a setting's field: ConfigError, InvalidArgumentError
_TRACE_FILE = 2  # the trace field: 0 off, 1 recorded, 2 and a file
# + check, trace, node key, shared node, timeout (us), exit key (job rank, pid, count),
# first refusal's text
_SETTINGS_ROW = len(SETTINGS) + 8 + _TEXT_BYTES // 8
_MADE_HERE = itertools.count()  # Communicators made in this process (their exit key)
# a node key: where it came from (and MPICOLL_RANKS_PER_NODE's k) above the node's number
_BY_BLOCKS, _BY_SLURM, _BY_HOST, _SOURCE_SHIFT, _K_SHIFT = 1, 2, 3, 56, 36


class Settings:
    """One rank's reading of every setting that shapes a Communicator (``read_settings``):
    the values, and the refusal of each malformed one, not yet raised."""

    def __init__(self, timeout: float) -> None:
        self.check = False
        self.timeout = timeout
        self.recorder = DEFAULT_RECORDER  # flight-recorder entries
        self.trace: bool | str = False  # True: record; a path: and merge into that file
        self.cuda_aware: bool | None = None  # MPICOLL_CUDA_AWARE where it is set
        self.node_key = 0  # which node this rank is on (see node_key), as a number
        self.shared_node = 0  # and its shared-memory node (see shared_node)
        self.refusals: dict[str, MpicollError] = {}  # by name in SETTINGS, in that order


def read_settings(backend: Backend, check: Any, trace: Any, timeout: Any) -> Settings:
    """Every setting that shapes a Communicator as this rank reads it (the arguments, else
    the MPICOLL_* variables), nothing raised: ``settings`` raises on every rank."""
    local = backend.ranks_are_threads
    s = Settings(backend.transport.timeout if local else DEFAULT_TIMEOUT)
    s.check, refusal = check_setting(check)
    if refusal is not None:
        s.refusals["check"] = refusal
    try:  # the local backend's default: its LocalWorld's
        s.timeout = backend.transport.timeout if local and timeout is None else \
            timeout_setting(timeout)
    except MpicollError as exc:
        s.refusals["timeout"] = exc
    try:
        s.recorder = recorder_length()
    except MpicollError as exc:
        s.refusals["MPICOLL_FLIGHT_RECORDER"] = exc
    _read_trace(s, backend, trace)
    try:  # what cuda_aware_mpi would parse at the first device message: read now
        s.cuda_aware = parse_flag(os.environ.get("MPICOLL_CUDA_AWARE"), "MPICOLL_CUDA_AWARE")
    except MpicollError as exc:
        s.refusals["MPICOLL_CUDA_AWARE"] = ConfigError(str(exc))
    folder = dump_dir()
    problem = unwritable(folder, directory=True) if folder else ""
    if problem:
        s.refusals["MPICOLL_DUMP_DIR"] = ConfigError(
            f"MPICOLL_DUMP_DIR: cannot write the hang reports to {folder}: {problem}")
    s.shared_node = shared_node(backend)  # (collective: before anything can raise)
    try:
        s.node_key = node_key(backend)
    except MpicollError as exc:
        s.refusals["MPICOLL_RANKS_PER_NODE"] = exc
    return s


def node_key(backend: Backend) -> int:
    """A number naming this rank's node, the same for the ranks of one node, from (in
    this order) ``MPICOLL_RANKS_PER_NODE=k`` (consecutive blocks of k ranks of the job:
    nodes simulated on one machine), SLURM's node of the task where srun started it (its
    ``SLURM_PROCID`` is its rank in the job: not a rank that mpiexec started inside a
    batch job, which inherits the batch step's), else 0: the shared-memory node
    (``shared_node``). Its source is part of it, so ranks that read different sources
    never agree."""
    text = os.environ.get("MPICOLL_RANKS_PER_NODE", "").strip()
    job_rank = _job_rank(backend)
    if text:
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) < 1 << 20:
            raise ConfigError("MPICOLL_RANKS_PER_NODE: expected a number of ranks from 1 to "
                              f"{(1 << 20) - 1}, got {text!r}")
        k = int(text)
        return (_BY_BLOCKS << _SOURCE_SHIFT) | (k << _K_SHIFT) | (job_rank // k)
    name = os.environ.get("SLURMD_NODENAME")
    if name and os.environ.get("SLURM_PROCID", "").strip() == str(job_rank):
        return (_BY_SLURM << _SOURCE_SHIFT) | crc(name)
    return 0


def _job_rank(backend: Backend) -> int:
    if backend.ranks_are_threads:
        return getattr(backend.transport, "job_rank", backend.transport.rank)
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def shared_node(backend: Backend) -> int:
    """A number naming this rank's shared-memory node: the lowest rank in the
    Communicator of the ranks that MPI_COMM_TYPE_SHARED puts with it (its rank there,
    not in MPI_COMM_WORLD: a Communicator over processes of two worlds, spawned and
    merged, has two of each world rank); collective: every rank of the Communicator being
    made calls it, whatever its settings. Threads of the local backend share one."""
    if backend.ranks_are_threads:
        return _BY_HOST << _SOURCE_SHIFT
    from mpi4py import MPI

    node = backend.control.comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        lowest = np.array([backend.control.comm.Get_rank()], np.int64)
        node.Allreduce(MPI.IN_PLACE, lowest, MPI.MIN)
    finally:
        node.Free()
    return (_BY_HOST << _SOURCE_SHIFT) | int(lowest[0])


def node_indices(keys: np.ndarray, shared: np.ndarray | None = None,
                 job_ranks: np.ndarray | None = None) -> tuple[int, ...]:
    """Each rank's node index from every rank's node key (and shared-memory node, used
    where a rank's key is 0, or where some ranks read SLURM's node and others could not):
    nodes numbered in the order of their first rank. Raises ConfigError where
    ``MPICOLL_RANKS_PER_NODE`` is set on some ranks only, or to different numbers.
    ``job_ranks``: every rank's MPI_COMM_WORLD rank; where two ranks have the same (a
    Communicator over two MPI worlds, spawned and merged), ``MPICOLL_RANKS_PER_NODE``'s
    blocks are of the Communicator's own ranks, as a job's would put two worlds' rank 0
    on one node."""
    sources = keys >> _SOURCE_SHIFT
    blocks = keys >> _K_SHIFT
    by_blocks = sources == _BY_BLOCKS
    if by_blocks.any() and (not by_blocks.all() or (blocks != blocks[0]).any()):
        given: dict[str, list[int]] = {}
        for r, (source, block) in enumerate(zip(sources.tolist(), blocks.tolist(), strict=True)):
            k = block & ((1 << (_SOURCE_SHIFT - _K_SHIFT)) - 1)
            given.setdefault(str(k) if source == _BY_BLOCKS else "unset", []).append(r)
        raise ConfigError("MPICOLL_RANKS_PER_NODE: it must be the same on every rank; it is "
                          + "; ".join(f"{k} on rank(s) {_ranks(ranks)}" for k, ranks in given.items()))
    if by_blocks.any() and job_ranks is not None and \
            len(set(job_ranks.tolist())) < len(job_ranks):
        k = int(blocks[0]) & ((1 << (_SOURCE_SHIFT - _K_SHIFT)) - 1)
        return tuple(r // k for r in range(len(keys)))
    if shared is not None and not by_blocks.any() and not (sources == _BY_SLURM).all():
        keys = shared  # (SLURM's node on every rank, or on none)
    return in_order(keys.tolist())


def in_order(nodes: Any) -> tuple[int, ...]:
    """Each rank's node index from any number naming its node: nodes numbered in the
    order of their first rank."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(int(k), len(first)) for k in nodes)


def _read_trace(s: Settings, backend: Backend, trace: Any) -> None:
    name, refusal = ("MPICOLL_TRACE", ConfigError) if trace is None else ("trace", InvalidArgumentError)
    value = os.environ.get("MPICOLL_TRACE", "") if trace is None else trace
    value = os.fspath(value) if isinstance(value, os.PathLike) else value
    if isinstance(value, (bool, np.bool_)):
        s.trace = bool(value)
    elif isinstance(value, str):
        s.trace = value if value.strip() else False
    else:
        s.refusals["trace"] = InvalidArgumentError(
            f"trace: expected True, False or a file's path, got {value!r}")
        return
    if s.trace is False:
        return
    if not backend.traceable:
        s.refusals["trace"] = refusal(
            f"{name}: tracing runs on the mpi and local backends, not {backend.name}")
    elif isinstance(s.trace, str) and not backend.merges_traces:
        s.refusals["trace"] = refusal(
            f"{name}: a trace file is merged over MPI; on the {backend.name} backend pass "
            "trace=True and read each rank's trace_events()")
    elif isinstance(s.trace, str):
        s.trace = os.path.abspath(s.trace)  # where rank 0 writes it, whatever chdir follows
        if backend.transport.rank == 0:
            writer = (world_ranks(backend.control) or [0])[0]  # (this rank's own)
            path = trace_path(s.trace, writer, peek=True)
            problem = unwritable(path)
            if problem:
                s.refusals["trace"] = refusal(f"{name}: cannot write the trace to {path}: {problem}")


def _ranks(ranks: list[int]) -> str:
    """``[0, 2, 3, 4]`` as "0, 2-4"."""
    parts: list[str] = []
    for i, r in enumerate(ranks):
        if i and r == ranks[i - 1] + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def settings(c: CallState, mine: Settings) -> None:
    """Every rank's settings in one all-gather of a small table (a status per setting,
    check mode, the trace's kind, the text of the rank's first refusal): a malformed
    setting on any rank raises the same error on every rank, naming it and the ranks;
    check mode and tracing (they add messages) must be alike everywhere. The timeout,
    the flight recorder and CUDA-awareness shape no message: they may differ per rank
    (rank 0's timeout is kept as ``_rank0_timeout``, for what every rank decides alike)."""
    t = c._backend.control
    n = len(SETTINGS)
    table = np.zeros(t.size * _SETTINGS_ROW, np.int64)
    row = table[t.rank * _SETTINGS_ROW:(t.rank + 1) * _SETTINGS_ROW]
    for i, name in enumerate(SETTINGS):
        if name in mine.refusals:
            config = isinstance(mine.refusals[name], ConfigError)
            row[i] = _REFUSED_CONFIG if config else _REFUSED_ARGUMENT
    row[n] = int(mine.check)
    row[n + 1] = 0 if mine.trace is False else _TRACE_FILE if isinstance(mine.trace, str) \
        else 1
    row[n + 2], row[n + 3] = mine.node_key, mine.shared_node
    row[n + 4] = round(min(mine.timeout or 0, 1e12) * 1e6)  # (microseconds; 0: no limit)
    row[n + 5:n + 8] = _job_rank(c._backend), os.getpid(), next(_MADE_HERE)
    first = next(iter(mine.refusals.values()), None)
    if first is not None:
        row[n + 8:] = _text(" ".join(str(first).split()), _TEXT_BYTES)
    t.begin()
    try:
        all_gather(c, table, _SETTINGS_ROW)
    except CollectiveTimeoutError as exc:  # (the local backend's: a rank never came)
        made_late(exc, c.rank, c.size)
        raise
    rows = table.reshape(t.size, _SETTINGS_ROW)
    refused = rows[:, :n]
    if refused.any():
        groups: dict[str, list[int]] = {}
        for r in np.flatnonzero(refused.any(axis=1)).tolist():
            names = [SETTINGS[i] for i in np.flatnonzero(refused[r]).tolist()]
            text = _untext(rows[r, n + 8:])
            if len(names) > 1:
                text += f" (and its {', '.join(names[1:])})"
            groups.setdefault(text, []).append(r)
        kind = ConfigError if (refused == _REFUSED_CONFIG).any() else InvalidArgumentError
        raise kind("Communicator: " + "; ".join(
            f"{text} (rank(s) {_ranks(ranks)})" for text, ranks in groups.items())) from first
    checks = rows[:, n]
    if (checks != checks[0]).any():
        raise SettingMismatchError(
            f"check: check mode is on for rank(s) {_ranks(np.flatnonzero(checks).tolist())} "
            "only; it must be the same on every rank (check= or MPICOLL_CHECK)")
    traces = rows[:, n + 1]
    if (traces != traces[0]).any():
        kinds = {0: "off", 1: "on", _TRACE_FILE: "on with a trace file"}
        detail = "; ".join(f"{kinds[k]} on rank(s) {_ranks(np.flatnonzero(traces == k).tolist())}"
                           for k in sorted(set(traces.tolist())))
        raise SettingMismatchError(
            f"trace: tracing must be the same on every rank (MPICOLL_TRACE or trace=; rank 0 "
            f"writes the file, at its path): {detail}")
    c._rank0_timeout = float(rows[0, n + 4]) / 1e6
    # this Communicator's place in what every rank does at exit (its trace's merge, its
    # progress thread's close: collectives), the same on every rank of it and unique
    # among the Communicators a rank shares with another: the lowest job rank's
    # (job rank, pid, how many it had made before)
    c._exit_key = tuple(rows[int(np.argmin(rows[:, n + 5])), n + 5:n + 8].tolist())
    c._node_of = node_indices(rows[:, n + 2], rows[:, n + 3], rows[:, n + 5])
    c._backend.transport.nodes = c._node_of  # what hierarchical algorithms split by


# the kinds of error a step finished apart may end in, most particular first
_OUTCOME_KINDS = (SettingMismatchError, ConfigError, InvalidArgumentError, MismatchError,
                  CollectiveTimeoutError, CollectiveError, MpicollError)


def outcome(c: CallState, what: str, failure: MpicollError | None) -> None:
    """After a step each rank of ``c`` finished apart from some others (a split's groups,
    each made by its own members, reading settings and files only they read): every
    rank's ``failure`` (its error, or None) in one all-gather over ``c``'s control, and
    where any rank has one, it is raised on every rank, naming the ranks it ended on:
    this rank's own as its kind (its cause), else the first one's."""
    t = c._backend.control
    width = 1 + _TEXT_BYTES // 8
    table = np.zeros(t.size * width, np.int64)
    if failure is not None:
        row = table[t.rank * width:(t.rank + 1) * width]
        row[0] = 1 + next(i for i, kind in enumerate(_OUTCOME_KINDS) if isinstance(failure, kind))
        row[1:] = _text(" ".join(str(failure).split()), _TEXT_BYTES)
    all_gather(c, table, width)
    rows = table.reshape(t.size, width)
    failed = np.flatnonzero(rows[:, 0]).tolist()
    if not failed:
        return
    first = failed[0]
    kind = type(failure) if failure is not None else _OUTCOME_KINDS[int(rows[first, 0]) - 1]
    said = str(failure) if failure is not None else _untext(rows[first, 1:])
    raise kind(f"{what}: failed on rank(s) {_ranks(failed)} of this Communicator (their "
               f"group could not be made; every rank raises; ranks named after this are "
               f"the group's): {said}") from failure


def tables(c: CallState) -> selection.Tables:
    """The tuning and model files as rank 0 reads them, the same on every rank (a missing
    file: None; a bad one: ConfigError naming it, on every rank)."""
    t = c._backend.control
    payload = b""
    if t.rank == 0:
        try:
            payload = json.dumps(selection.read_texts()).encode()
        except ConfigError as exc:  # unreadable: the others learn it from the payload
            payload = json.dumps({"error": str(exc)}).encode()
        except Exception as exc:  # noqa: BLE001 - anything else too: never raised here
            payload = json.dumps(  # alone, with the others waiting for the payload
                {"error": f"the tuning and model files: {type(exc).__name__}: {exc}"}).encode()
    size = np.array([len(payload)], np.int64)
    t.begin()
    broadcast(c, size, 0)
    raw = np.frombuffer(payload, np.uint8).copy() if t.rank == 0 else np.empty(size[0], np.uint8)
    if size[0]:
        broadcast(c, raw, 0)
    texts = json.loads(raw.tobytes())
    if "error" in texts:
        raise ConfigError(texts["error"])
    return selection.parse_texts(texts)
