"""All-to-all: block j of rank i's input becomes block i of rank j's result (a transpose).

``src`` and ``dst`` each hold p equal blocks. n is the size of one rank's input in bytes.
"""

from __future__ import annotations

import numpy as np

from ..transport import Transport
from . import register


@register("all_to_all", "linear")
def linear_all_to_all(t: Transport, src: np.ndarray, dst: np.ndarray) -> None:
    """Post every receive and every send at once and wait for them all.

    Steps: 1 round of p-1 sends and p-1 receives; bytes: (p-1)/p n per rank.
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank, m = t.size, t.rank, src.size // t.size
    others = [(rank + k) % p for k in range(1, p)]
    requests = [t.irecv(dst[r * m:(r + 1) * m], r) for r in others]
    requests += [t.isend(src[r * m:(r + 1) * m], r) for r in others]
    dst[rank * m:(rank + 1) * m] = src[rank * m:(rank + 1) * m]
    t.waitall(requests)


@register("all_to_all", "pairwise")
def pairwise_all_to_all(t: Transport, src: np.ndarray, dst: np.ndarray) -> None:
    """p-1 steps; at step k send to rank + k and receive from rank - k.

    Steps: p-1 exchanges; bytes: (p-1)/p n per rank.
    Cost: (p-1)*(alpha + n/p*beta)
    """
    p, rank, m = t.size, t.rank, src.size // t.size
    dst[rank * m:(rank + 1) * m] = src[rank * m:(rank + 1) * m]
    for k in range(1, p):
        to, frm = (rank + k) % p, (rank - k) % p
        t.sendrecv(src[to * m:(to + 1) * m], to, dst[frm * m:(frm + 1) * m], frm)
