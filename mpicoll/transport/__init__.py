"""Transports move bytes between ranks; algorithms are written over this interface only.

A transport has a ``rank`` and a ``size`` and moves flat contiguous arrays as raw bytes:
``send``, ``recv``, ``sendrecv`` (a combined exchange that never deadlocks), and the
nonblocking ``isend``/``irecv`` completed together by ``waitall``. Every collective call
starts with ``begin()``, which gives the call a tag of its own so that messages of two
calls can never match, and frees the workspace: ``with t.workspace() as ws:
ws.take(n, dtype)`` hands out memory kept between calls, so hot paths do not allocate
per step or per call. ``synchronize`` waits for queued work (NCCL); ``free`` releases.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..buffers.arrays import cupy_module, is_cupy
from ..errors import CollectiveError, InvalidArgumentError


class Status:
    """What a point-to-point receive got (MPI's status): the rank that sent it, its tag,
    and its bytes; ``count(dtype)``: its elements of ``dtype`` (``MPI_Get_count``)."""

    __slots__ = ("source", "tag", "nbytes")

    def __init__(self, source: int = -1, tag: int = -1, nbytes: int = 0) -> None:
        self.source, self.tag, self.nbytes = source, tag, nbytes

    def count(self, dtype: Any = np.uint8) -> int:
        """The message's elements of ``dtype`` (a message that is not a whole number of
        them raises, where MPI_Get_count gives MPI_UNDEFINED)."""
        try:
            kind = np.dtype(dtype)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"dtype: {dtype!r} is not a dtype") from None
        if kind.hasobject:
            raise InvalidArgumentError(f"dtype: {kind} holds Python objects, which no "
                                       "message carries")
        if kind.itemsize == 0:
            raise InvalidArgumentError(f"dtype: {dtype!r} has no bytes to count")
        if self.nbytes % kind.itemsize:
            raise InvalidArgumentError(
                f"dtype: the message's {self.nbytes} bytes are not a whole number of "
                f"{kind} elements ({kind.itemsize} bytes each)")
        return self.nbytes // kind.itemsize

    def fill(self, other: Status) -> None:
        """Take ``other``'s values (a caller's ``status=`` filled in place)."""
        self.source, self.tag, self.nbytes = other.source, other.tag, other.nbytes

    def __repr__(self) -> str:
        return f"Status(source={self.source}, tag={self.tag}, nbytes={self.nbytes})"


def cut_short(source: int, tag: int, nbytes: int) -> CollectiveError:
    """A message longer than its receive buffer of ``nbytes`` (MPI's MPI_ERR_TRUNCATE;
    the buffer may hold its first bytes, or none: MPICH writes none of a large message a
    rank sends itself), from ``source`` with ``tag`` (-1: not known)."""
    sender = f"rank {source}" if source >= 0 else "the sender"
    return CollectiveError(
        f"the message from {sender}{f' (tag {tag})' if tag >= 0 else ''} is longer than "
        f"the {nbytes} bytes of the buffer it was received into, which may hold its first "
        "bytes, or none of it; probe() tells a message's size before its receive")


class Transport(Protocol):
    rank: int
    size: int

    def begin(self, like: Any = None) -> None: ...
    def use(self, like: Any, device: bool | None = None) -> None: ...
    def send(self, buf: np.ndarray, dest: int) -> None: ...
    def recv(self, buf: np.ndarray, source: int) -> None: ...
    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None: ...
    def isend(self, buf: np.ndarray, dest: int) -> Any: ...
    def irecv(self, buf: np.ndarray, source: int) -> Any: ...
    def waitall(self, requests: Sequence[Any]) -> None: ...
    def workspace(self) -> Workspace: ...
    def take(self, count: int, dtype: np.dtype, like: Any = None) -> Any: ...
    def synchronize(self) -> None: ...
    def free(self) -> None: ...


class Workspace:
    """Scratch memory kept between calls and handed out by scope, so hot paths allocate
    nothing once warm and no two users of it ever overlap.

    Every collective call starts with all of it free (``begin()``); ``take`` hands out
    the next piece (aligned, grown geometrically when a call needs more); and a scope
    (``with t.workspace() as ws:``) gives back, on leaving, everything taken inside it,
    so an algorithm that calls another shares nothing with it and the memory is reused
    by the next scope. A view taken inside a scope must not be used after it. Memory
    lives where the call's data lives: ``begin(like)`` (or ``use(like)``) says which
    array library (NumPy by default, CuPy on a GPU).
    """

    _ALIGN = 64

    def __init__(self) -> None:
        self._arenas: dict[bool, Any] = {}  # host / device: one raw buffer each
        self._tops = [0, 0]  # bytes taken so far, host and device
        self._scopes: list[tuple[int, int]] = []
        self._device = False
        self._arena_stream: Any = None  # the CUDA stream of the last call on the device arena
        self._arena_where: tuple = ()  # and (its ptr, the arena's moves then, its thread)
        self._arena_ordered = False  # this call's stream is ordered after it (see take)
        self._arena_moves = 0  # times the device arena was dropped for another GPU

    def let_go(self) -> None:
        """Give the host memory back (the transport is freed: a Communicator still
        referenced after ``free()`` no longer holds it). The GPU's stays: kernels queued
        on a stream may still read it, and CuPy's pool would hand it out again at once."""
        self._arenas.pop(False, None)
        self._tops[0] = 0

    def use(self, like: Any, device: bool | None = None) -> None:
        """Take workspace from ``like``'s array library from now on (on a GPU: the
        current one, asked once here, not at every ``take``); ``device``: whether it is
        a GPU's, where the caller knows (NCCL's workspace always is)."""
        if device is None:
            device = like is not None and type(like) is not np.ndarray and is_cupy(like)
        self._device = device
        if device:
            self._follow_current_gpu()

    def _follow_current_gpu(self) -> None:
        """Drop the device arena where it lies on another GPU than the current one (the
        caller changed the current device): the next ``take`` makes one here, as the
        caller's arrays and kernels are (views taken keep the old one alive until they go)."""
        raw = self._arenas.get(True)
        if raw is not None and raw.device.id != cupy_module().cuda.runtime.getDevice():
            del self._arenas[True]
            self._tops[1] = 0
            self._arena_moves += 1

    def _order_device_arena(self) -> None:
        """The device arena is reused call after call, and a GPU call returns with its
        kernels and messages queued on its stream: where this call runs on another stream
        than the last that took from the arena, this one first waits (on the GPU, through
        an event) for what that one queued, which may still read or write it."""
        cuda = cupy_module().cuda
        stream, thread = cuda.get_current_stream(), threading.get_ident()
        # (ptr, the arena's moves to another GPU so far, the thread where ptr names a
        # per-thread default stream): a new GPU's arena is other memory, nothing to order
        here = (stream.ptr, self._arena_moves, thread if stream.ptr == 2 else 0)
        if self._arena_stream is not None and self._arena_where != here:
            _, moves, owner = self._arena_where
            if moves == self._arena_moves:  # (the same arena)
                if owner and owner != thread:
                    # another thread's per-thread default stream (ptr 2 names each
                    # thread's own): no event can be recorded on it from here; the device
                    # drains
                    cuda.runtime.deviceSynchronize()
                else:
                    stream.wait_event(self._arena_stream.record())
        self._arena_stream, self._arena_where, self._arena_ordered = stream, here, True

    def _start_call(self, like: Any, device: bool | None = None) -> None:
        """What every transport's ``begin`` does besides its tag: no blocking call yet
        (the watchdog's step and wait slots), workspace in ``like``'s library, and all of
        it free again (scopes always close: ``with``); ``device``: as ``use``'s."""
        self.step, self.wait_kind = 0, None
        self._arena_ordered = False
        if like is None:
            self._device = False
        else:
            self.use(like, device)
        tops = self._tops
        if tops[0] or tops[1]:
            tops[0] = tops[1] = 0

    def workspace(self) -> Workspace:
        """A scope: ``with t.workspace() as ws: a = ws.take(n, dtype)``."""
        return self

    def arenas(self) -> tuple[Any, ...]:
        """The raw buffers the workspace is taken from now (a tracer tells a message in
        the workspace from one in the caller's buffers by them)."""
        return tuple(self._arenas.values())

    def __enter__(self) -> Workspace:
        self._scopes.append((self._tops[0], self._tops[1]))
        return self

    def __exit__(self, *exc: object) -> None:
        self._tops[0], self._tops[1] = self._scopes.pop()

    def take(self, count: int, dtype: Any, like: Any = None) -> Any:
        """``count`` elements of ``dtype`` of workspace (in ``like``'s library if given)."""
        if not isinstance(dtype, np.dtype):
            dtype = np.dtype(dtype)
        device = self._device
        if like is not None:
            on_device = type(like) is not np.ndarray and is_cupy(like)
            if on_device and not device:  # (before the call's use(): its GPU asked here)
                self._follow_current_gpu()
            device = on_device
        if device and not self._arena_ordered:
            self._order_device_arena()
        nbytes = count * dtype.itemsize
        start = self._tops[device]
        end = start + nbytes
        raw = self._arenas.get(device)
        if raw is None or raw.nbytes < end:
            # a bigger arena; views already taken keep the old one alive until they go
            size = max(end, 0 if raw is None else 2 * raw.nbytes, 4096)
            raw = self._arenas[device] = (cupy_module().empty(size, np.uint8) if device
                                          else np.empty(size, np.uint8))
        self._tops[device] = -(-end // self._ALIGN) * self._ALIGN
        if device or dtype.hasobject:
            return raw[start:end].view(dtype)  # (NumPy refuses a view of bytes as objects)
        return np.ndarray((count,), dtype, raw, start)  # the same view, made a third as dear
