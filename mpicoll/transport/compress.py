"""Compressed messages: float32/float64 data carried as 16-bit floats on the wire.

``Compressing(t, wire)`` wraps a transport so that every message of the data's floats
goes as ``wire`` values (bfloat16 or float16): a send casts the buffer down into wire
scratch and sends that, a receive receives wire values and casts them up into the
caller's buffer. The algorithms run over it unchanged, so every one of them compresses,
and every reduction still happens in the input's precision (as torch's bf16/fp16
compression hooks and Horovod's fp16 compression do): only what travels is rounded, once
per hop. Half the bytes move; the price is the wire format's rounding (a relative error
of about 2^-8 per hop for bfloat16, 2^-11 for float16; float16's range is narrow at
both ends: from 65520 on a value travels as inf, below 6.1e-5 as a subnormal with fewer
bits, below 3e-8 as zero).

Every rank ends with the same bits: a sender keeps what it sent (the buffer it sends is
rounded in place to the wire's values too, so two ranks that combine the same operands
compute the same value), and the result is rounded to the wire's values at the end
(``round_result``: a rank that sent its value and one that computed the same value and
kept it now hold the same; an owner that kept its block at full precision while the
others got it rounded would otherwise end with another result than theirs). Both rules
are one wrapper of the algorithm (``rounding``), which runs it on buffers of the call (the
result, workspace), never on the caller's input.

Scratch is kept between calls: one pair of buffers for the blocking messages (free
again when each returns), and a pool for the nonblocking ones, free again once
``waitall`` has completed every request in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..buffers.arrays import empty

WIRE = {"bf16": "bfloat16", "fp16": "float16"}  # compress= -> the wire dtype's name


def wire_dtype(name: str) -> np.dtype:
    """The dtype ``compress=name`` puts on the wire."""
    if WIRE[name] == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float16)


class _Received:
    """A nonblocking receive of wire values, cast up into ``buf`` once waited for."""

    __slots__ = ("request", "wire", "buf")

    def __init__(self, request: Any, wire: Any, buf: Any) -> None:
        self.request, self.wire, self.buf = request, wire, buf


class Compressing:
    """``inner`` with every message's floats sent as ``wire`` values (see the module)."""

    def __init__(self, inner: Any, wire: np.dtype) -> None:
        self._inner, self._wire = inner, wire
        self._blocking: list[Any] = [None, None]  # send and receive scratch, kept
        self._pool: Any = None  # the nonblocking messages' scratch, kept
        self._top = 0  # bytes of the pool in use by requests not yet waited for
        self._outstanding = 0  # nonblocking messages posted and not yet waited for

    def __getattr__(self, name: str) -> Any:  # rank, size, begin, workspace, take, ...
        return getattr(self._inner, name)

    @property
    def tag(self) -> int:
        return self._inner.tag

    @tag.setter
    def tag(self, value: int) -> None:
        self._inner.tag = value

    def _scratch(self, which: int, buf: Any) -> Any:
        kept = self._blocking[which]
        if kept is None or kept.size < buf.size or type(kept) is not type(buf):
            kept = self._blocking[which] = empty(max(buf.size, 1024), self._wire, like=buf)
        return kept[:buf.size]

    def _posted(self, buf: Any) -> Any:
        nbytes = buf.size * self._wire.itemsize
        pool = self._pool
        if pool is None or pool.nbytes < self._top + nbytes or type(pool) is not type(buf):
            # a bigger pool; views of the old one keep it alive until their requests end
            pool = self._pool = empty(max(2 * (self._top + nbytes), 4096), np.uint8, like=buf)
            self._top = 0
        start = self._top
        self._top = start + -(-nbytes // 64) * 64
        self._outstanding += 1
        return pool[start:start + nbytes].view(self._wire)

    def rounding(self, fn: Callable[..., None]) -> Callable[..., None]:
        """``fn``, an all_reduce algorithm ``fn(t, src, dst, *args)``, as a compressed call
        runs it: on a copy of its input in the call's workspace where that is not its result
        (a sender rounds what it sends in place, so never the caller's x), then the result
        rounded to the wire's values (every rank the same bits)."""
        def rounded(t: Any, src: Any, dst: Any, *args: Any) -> None:
            if src is not dst:
                copy = self.take(src.size, src.dtype, like=src)
                copy[...] = src
                src = copy
            fn(t, src, dst, *args)
            self.round_result(dst)

        return rounded

    def round_result(self, buf: Any) -> None:
        """The call's result rounded to the wire's values, in place (see the module)."""
        for lo in range(0, buf.size, 1 << 20):  # (through the send scratch, a slice at a time)
            part = buf[lo:lo + (1 << 20)]
            wire = self._scratch(0, part)
            _narrow(wire, part)
            part[...] = wire

    def send(self, buf: Any, dest: int) -> None:
        wire = self._scratch(0, buf)
        _narrow(wire, buf)
        buf[...] = wire  # (the sender keeps what it sent: see the module)
        self._inner.send(wire, dest)

    def recv(self, buf: Any, source: int) -> None:
        wire = self._scratch(1, buf)
        self._inner.recv(wire, source)
        buf[...] = wire

    def sendrecv(self, sendbuf: Any, dest: int, recvbuf: Any, source: int) -> None:
        out, into = self._scratch(0, sendbuf), self._scratch(1, recvbuf)
        _narrow(out, sendbuf)
        sendbuf[...] = out
        self._inner.sendrecv(out, dest, into, source)
        recvbuf[...] = into

    def isend(self, buf: Any, dest: int) -> Any:
        wire = self._posted(buf)
        _narrow(wire, buf)
        buf[...] = wire
        return self._inner.isend(wire, dest)

    def irecv(self, buf: Any, source: int) -> _Received:
        wire = self._posted(buf)
        return _Received(self._inner.irecv(wire, source), wire, buf)

    def waitall(self, requests: Sequence[Any]) -> None:
        self._inner.waitall([r.request if type(r) is _Received else r for r in requests])
        for r in requests:
            if type(r) is _Received:
                r.buf[...] = r.wire
        self._outstanding -= len(requests)
        if self._outstanding <= 0:  # nothing in flight: the whole pool is free again
            self._outstanding = self._top = 0


def _narrow(wire: Any, buf: Any) -> None:
    """``buf`` rounded into the narrower ``wire``: beyond its range inf, below it 0 (IEEE's
    rounding, as the module says), never an error a rank alone raises mid-call where the
    caller set np.seterr(over="raise") or runs python -W error."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        wire[...] = buf
