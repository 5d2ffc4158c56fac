"""Transports move bytes between ranks; algorithms are written over this interface only.

A transport has a ``rank`` and a ``size`` and moves flat contiguous arrays as raw bytes:
``send``, ``recv``, ``sendrecv`` (a combined exchange that never deadlocks), and the
nonblocking ``isend``/``irecv`` completed together by ``waitall``. Every collective call
starts with ``begin()``, which gives the call a tag of its own so that messages of two
calls can never match. ``scratch`` hands out workspace that is kept between calls, so
hot paths do not allocate per step or per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class Transport(Protocol):
    rank: int
    size: int

    def begin(self) -> None: ...
    def send(self, buf: np.ndarray, dest: int) -> None: ...
    def recv(self, buf: np.ndarray, source: int) -> None: ...
    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None: ...
    def isend(self, buf: np.ndarray, dest: int) -> Any: ...
    def irecv(self, buf: np.ndarray, source: int) -> Any: ...
    def waitall(self, requests: Sequence[Any]) -> None: ...
    def scratch(self, count: int, dtype: np.dtype, slot: int = 0) -> np.ndarray: ...


class ScratchPool:
    """Workspace buffers kept between calls, one per slot, grown when a call needs more.

    A caller owns a slot for the length of one algorithm; algorithms document the slots
    they use so that an algorithm calling another never shares one.
    """

    def __init__(self) -> None:
        self._slots: dict[int, np.ndarray] = {}

    def scratch(self, count: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = count * dtype.itemsize
        raw = self._slots.get(slot)
        if raw is None or raw.nbytes < nbytes:
            # grow geometrically so a slowly growing sweep does not reallocate each call
            size = max(nbytes, 0 if raw is None else 2 * raw.nbytes, 64)
            raw = self._slots[slot] = np.empty(size, np.uint8)
        return raw[:nbytes].view(dtype)
