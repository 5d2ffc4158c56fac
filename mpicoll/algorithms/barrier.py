"""Barrier: no rank leaves before every rank has entered. Messages are empty."""

from __future__ import annotations

import numpy as np

from ..transport import Transport
from . import register

_EMPTY = np.empty(0, np.uint8)


@register("barrier", "linear")
def linear_barrier(t: Transport) -> None:
    """Every rank tells rank 0 it arrived; rank 0 then releases them all.

    Steps: 2 rounds of p-1 messages through rank 0.
    Cost: 2*(p-1)*alpha
    """
    p, rank = t.size, t.rank
    if rank == 0:
        t.waitall([t.irecv(_EMPTY, r) for r in range(1, p)])
        t.waitall([t.isend(_EMPTY, r) for r in range(1, p)])
    else:
        t.send(_EMPTY, 0)
        t.recv(_EMPTY, 0)


@register("barrier", "dissemination")
def dissemination_barrier(t: Transport) -> None:
    """Dissemination: in round k every rank signals rank + 2^k and waits for rank - 2^k.

    Steps: ceil(lg p) rounds, any p.
    Cost: ceil(lg p)*alpha
    """
    p, rank = t.size, t.rank
    distance = 1
    while distance < p:
        t.sendrecv(_EMPTY, (rank + distance) % p, _EMPTY, (rank - distance) % p)
        distance <<= 1
