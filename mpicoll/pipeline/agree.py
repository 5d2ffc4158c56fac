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
- ``settings`` and ``tables`` when a Communicator is made: check mode must be on
  everywhere or nowhere, and the tuning and model files are read on rank 0 only and
  shared, so a file that differs per node cannot make ranks pick differently.

Host messages are small int64 arrays (no pickle), on the backend's control transport.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

import numpy as np

from .. import selection
from ..algorithms import REGISTRY
from ..buffers import dtype_code, even_bounds
from ..errors import (
    ConfigError,
    InvalidArgumentError,
    MismatchError,
    MpicollError,
    OpError,
    RemoteError,
)
from ..ops import Op, op_name
from .describe import Call
from .validate import Verdict

ANY = -1  # a fingerprint field this rank cannot know (broadcast/scatter with None)
NAMES = ("broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce",
         "reduce_scatter", "all_to_all", "barrier", "all_gather_v", "gather_v", "scatter_v",
         "all_to_all_v", "monitored_barrier")
_FIELDS = ("collective", "algorithm", "op", "root", "dtype", "shape", "call number")
_SITE_BYTES, _TEXT_BYTES = 96, 160
_ROW = len(_FIELDS) + 1 + (_SITE_BYTES + _TEXT_BYTES) // 8


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


def dtype_crc(dtype: np.dtype) -> int:
    return crc(dtype.str + dtype.name)  # the name tells bfloat16 from other 2-byte voids


def signature(dtype: np.dtype, rest: tuple[int, ...]) -> int:
    """A number for (dtype, shape after the first dimension): what the v-variants compare."""
    return crc(f"{dtype_crc(dtype)}{tuple(rest)}")


# -- collectives on the control transport --------------------------------------------


def all_gather(c: Any, table: np.ndarray, block: int) -> None:
    """All-gather ``table`` (rank r's ``block`` items at r * block) over control."""
    b = c._backend
    fn = b.control_native.get("all_gather") or REGISTRY["all_gather"]["recursive_doubling"].fn
    fn(b.control, table, even_bounds(block, b.control.size))


def broadcast(c: Any, buf: np.ndarray, root: int) -> None:
    b = c._backend
    fn = b.control_native.get("broadcast") or REGISTRY["broadcast"]["binomial"].fn
    fn(b.control, buf, root)


def _text(text: str, nbytes: int) -> np.ndarray:
    raw = text.encode("utf-8", "replace")[:nbytes]
    out = np.zeros(nbytes, np.uint8)
    out[:len(raw)] = np.frombuffer(raw, np.uint8)
    return out.view(np.int64)


def _untext(words: np.ndarray) -> str:
    return words.view(np.uint8).tobytes().rstrip(b"\0").decode("utf-8", "replace")


# -- check mode, and refusals ----------------------------------------------------------


def settle(c: Any, call: Call, verdict: Verdict, algorithm: Any, *, op: Any = None,
           root: Any = ANY, dtype: Any = None, shape: Any = None,
           input_travels: bool = False) -> None:
    """Raise what must be raised before any data moves (see the module's docstring).

    ``algorithm``: the name, or (name, tuning options): ranks must agree on both.
    ``input_travels``: this rank's input refusal reaches the others in a message the
    call sends anyway (a root's header, the v-variants' tables), so it is not raised here.
    """
    if c.check:
        fingerprint(c, call, verdict, algorithm, op, root, dtype, shape)
        return
    refusal = verdict.params or (None if input_travels else verdict.input)
    if refusal is not None:
        c._refused_alone = call.seq  # the next call checks that the others refused too
        raise refusal


def _algorithm_text(algorithm: Any) -> str:
    """The algorithm field of a fingerprint: its name, and its tuning options if any."""
    if isinstance(algorithm, tuple):
        name, options = algorithm
        return f"{name} {sorted(options.items())}" if options else str(name)
    return str(algorithm)


def fingerprint(c: Any, call: Call, verdict: Verdict, algorithm: Any, op: Any, root: Any,
                dtype: Any, shape: Any) -> None:
    """Check mode: compare the call across ranks; raise on every rank on any refusal or
    disagreement."""
    mine = np.zeros(_ROW, np.int64)
    try:
        op_field = ANY if op is None else crc(op.name if isinstance(op, Op) else op_name(op))
    except MpicollError:
        op_field = crc(repr(op))
    mine[:len(_FIELDS) + 1] = (
        crc(call.collective), crc(_algorithm_text(algorithm)), op_field,
        root if isinstance(root, (int, np.integer)) and not isinstance(root, bool) else ANY,
        ANY if dtype is None else dtype_crc(np.dtype(dtype)),
        ANY if shape is None else crc(repr(tuple(shape))),
        call.seq, 1 if verdict else 0)
    start = len(_FIELDS) + 1
    mine[start:start + _SITE_BYTES // 8] = _text(call.site, _SITE_BYTES)
    if verdict:
        mine[start + _SITE_BYTES // 8:] = _text(str(verdict.first), _TEXT_BYTES)
    t = c._backend.control
    table = np.empty(t.size * _ROW, np.int64)
    table[t.rank * _ROW:(t.rank + 1) * _ROW] = mine
    all_gather(c, table, _ROW)
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
    reference = rows[0, :len(_FIELDS)].copy()
    for f in range(len(_FIELDS)):  # a rank that knows the field sets it for rank 0
        known = rows[:, f][rows[:, f] != ANY]
        if known.size:
            reference[f] = known[0]
    differ = {}
    for r in range(t.size):
        fields = [name for f, name in enumerate(_FIELDS)
                  if rows[r, f] != ANY and rows[r, f] != reference[f]]
        if fields:
            differ[r] = fields
    if differ:
        names = {crc(n): n for n in NAMES}

        def what(r: int) -> str:
            return f"{names.get(int(rows[r, 0]), '?')} call #{rows[r, 6]} at {sites[r]}"

        first = next(r for r in range(t.size) if r not in differ)
        detail = "; ".join(f"rank {r} differs in {', '.join(f)} ({what(r)})"
                           for r, f in differ.items())
        raise MismatchError(f"{call.name()}: ranks disagree on the call: {detail}; "
                            f"rank {first}: {what(first)}")


def resync(c: Any, call: Call) -> None:
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
    try:  # point-to-point messages on those tags: never the library's own collective,
        # which MPI would match with a collective the others still wait in
        REGISTRY["all_gather"]["recursive_doubling"].fn(t, table, even_bounds(1, t.size))
    finally:
        t.tag = saved
    if (table != refused).any():
        detail = ", ".join(f"rank {r}: #{n}" if n else f"rank {r}: none"
                           for r, n in enumerate(table.tolist()))
        raise MismatchError(
            f"{call.name()}: after a refused call the ranks disagree on which call was "
            f"refused ({detail})")


def op_failures(c: Any, call: Call, op: Op, failure: OpError | None) -> None:
    """After a call with a user's op: tell every rank which ranks' op raised; raise
    ``OpError`` on every rank if any did (this rank's own failure as its cause)."""
    t = c._backend.control
    table = np.zeros(t.size, np.int64)
    table[t.rank] = failure is not None
    t.use(None)
    all_gather(c, table, 1)
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
OK, BAD_INPUT, TOO_MANY_DIMS, NO_CODE = range(4)
REFUSALS = {
    BAD_INPUT: "the root refused its own input",
    TOO_MANY_DIMS: f"the root's x has more than {MAX_NDIM} dimensions",
    NO_CODE: "the root's dtype has no header code, so the others cannot allocate a result",
}


def header_of(dtype: np.dtype | None, shape: tuple[int, ...] | None, status: int = OK,
              header: np.ndarray | None = None, extra: int = 0, device: bool = False,
              ) -> np.ndarray:
    """Fill ``header`` (or a new one, with ``extra`` slots after it) with a dtype, shape
    and whether the data is on the GPU, or a refusal status."""
    header = np.zeros(HEADER_LEN + extra, np.int64) if header is None else header
    if status == OK and len(shape) > MAX_NDIM:
        status = TOO_MANY_DIMS
    if status != OK:
        header[:4] = (status, 0, 0, 0)
        return header
    header[:4 + len(shape)] = (OK, dtype_code(dtype), dtype.itemsize,
                               len(shape) | (ON_DEVICE if device else 0), *shape)
    return header


def unpack_header(header: np.ndarray, root: int, call: Call,
                  ) -> tuple[int, int, tuple[int, ...], bool]:
    """(dtype code, itemsize, shape, on the GPU) from a root's header; a root's refusal
    raises RemoteError here (the root raises its own)."""
    status, code, itemsize, ndim = header[:4].tolist()
    if status != OK:
        raise RemoteError(f"{call.name()}: root {root} refused the call: "
                          f"{REFUSALS.get(status, 'status ' + str(status))}")
    device, ndim = bool(ndim & ON_DEVICE), ndim & (ON_DEVICE - 1)
    return code, itemsize, tuple(header[4:4 + ndim].tolist()), device


# -- the v-variants' tables --------------------------------------------------------------


def row_table(c: Any, call: Call, x: Any, refusal: MpicollError | None) -> list[int]:
    """All-gather every rank's (rows, dtype/row-shape signature, refusal); return the rows.

    Every rank sees the whole table, so a refusal or a disagreement raises on every rank.
    """
    t = c._backend.control
    table = np.zeros(3 * t.size, np.int64)
    if refusal is None:
        table[3 * t.rank:3 * t.rank + 3] = (x.shape[0], signature(x.dtype, x.shape[1:]), 0)
    else:
        table[3 * t.rank + 2] = 1
    all_gather(c, table, 3)
    rows = table.reshape(t.size, 3)
    check_table(call, rows[:, 1], rows[:, 2], refusal)
    return rows[:, 0].tolist()


def check_table(call: Call, signatures: np.ndarray, refusals: np.ndarray,
                refusal: MpicollError | None) -> None:
    """Raise on every rank when a rank refused (that rank its own ``refusal``), or the
    ranks' signatures differ."""
    if refusal is not None:
        raise refusal
    refused = np.flatnonzero(refusals).tolist()
    if refused:
        raise RemoteError(f"{call.name()}: rank(s) {', '.join(map(str, refused))} "
                          "refused their input")
    differ = [r for r in range(len(signatures)) if signatures[r] != signatures[0]]
    if differ:
        raise MismatchError(
            f"{call.name()}: ranks disagree on the dtype or the shape after the first "
            f"dimension: rank(s) {', '.join(map(str, differ))} differ from rank 0")


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


def settings(c: Any, check: bool | None, check_error: MpicollError | None) -> None:
    """Every rank must run check mode alike (it adds a message to every call): raise
    on every rank when a rank's MPICOLL_CHECK is malformed or the ranks disagree."""
    t = c._backend.control
    table = np.zeros(t.size, np.int64)
    table[t.rank] = -1 if check_error is not None else int(bool(check))
    t.begin()
    all_gather(c, table, 1)
    if check_error is not None:
        raise check_error
    if (table < 0).any():
        bad = ", ".join(map(str, np.flatnonzero(table < 0).tolist()))
        raise ConfigError(f"check: MPICOLL_CHECK is malformed on rank(s) {bad}")
    if (table != table[0]).any():
        on = ", ".join(map(str, np.flatnonzero(table).tolist()))
        raise MismatchError(f"check: check mode is on for rank(s) {on} only; it must be "
                            "the same on every rank (check= or MPICOLL_CHECK)")


def tables(c: Any) -> selection.Tables:
    """The tuning and model files as rank 0 reads them, the same on every rank (a missing
    file: None; a bad one: ConfigError naming it, on every rank)."""
    t = c._backend.control
    payload = b""
    if t.rank == 0:
        try:
            payload = json.dumps(selection.read_texts()).encode()
        except ConfigError as exc:  # unreadable: the others learn it from the payload
            payload = json.dumps({"error": str(exc)}).encode()
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
