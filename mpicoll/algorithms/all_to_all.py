"""All-to-all: block j of rank i's input becomes block i of rank j's result (a transpose).

``src`` holds p blocks, block j (for rank j) at ``send_bounds[j]:send_bounds[j+1]``;
``dst`` receives p blocks, block i (from rank i) at ``recv_bounds[i]:recv_bounds[i+1]``.
For all_to_all every block has the same size; all_to_all_v's may differ. n is the size
of one rank's input in bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ..buffers.arrays import cupy_module
from ..transport import Transport
from . import register


def _block(buf: np.ndarray, bounds: tuple[int, ...], j: int) -> np.ndarray:
    return buf[bounds[j]:bounds[j + 1]]


@register("all_to_all", "linear")
def linear_all_to_all(t: Transport, src: np.ndarray, send_bounds: tuple[int, ...],
                      dst: np.ndarray, recv_bounds: tuple[int, ...]) -> None:
    """Post every receive and every send at once and wait for them all.

    Steps: 1 round of p-1 sends and p-1 receives; bytes: (p-1)/p n per rank.
    Cost: (p-1)*alpha + (p-1)/p*n*beta
    """
    p, rank = t.size, t.rank
    others = [(rank + k) % p for k in range(1, p)]
    requests = [t.irecv(_block(dst, recv_bounds, r), r) for r in others]
    requests += [t.isend(_block(src, send_bounds, r), r) for r in others]
    _block(dst, recv_bounds, rank)[...] = _block(src, send_bounds, rank)
    t.waitall(requests)


@register("all_to_all", "pairwise")
def pairwise_all_to_all(t: Transport, src: np.ndarray, send_bounds: tuple[int, ...],
                        dst: np.ndarray, recv_bounds: tuple[int, ...]) -> None:
    """p-1 steps; at step k send to rank + k and receive from rank - k.

    Steps: p-1 exchanges; bytes: (p-1)/p n per rank.
    Cost: (p-1)*(alpha + n/p*beta)
    """
    p, rank = t.size, t.rank
    _block(dst, recv_bounds, rank)[...] = _block(src, send_bounds, rank)
    for k in range(1, p):
        to, frm = (rank + k) % p, (rank - k) % p
        t.sendrecv(_block(src, send_bounds, to), to, _block(dst, recv_bounds, frm), frm)


@register("all_to_all", "bruck", even_only=True)
def bruck_all_to_all(t: Transport, src: np.ndarray, send_bounds: tuple[int, ...],
                     dst: np.ndarray, recv_bounds: tuple[int, ...]) -> None:
    """Bruck: lg p steps; at step k every block whose distance has bit k set moves 2^k on.

    A block's distance is how far its destination is from its holder (its index after
    rotating the input by rank). Blocks go packed, about half of them per step, so
    small blocks take lg p messages instead of p-1; large ones pay lg p / 2 copies of n.
    Steps: ceil(lg p); bytes: about n/2 per step per rank, plus local copies.
    Cost: ceil(lg p)*(alpha + n/2*beta)
    """
    p, rank = t.size, t.rank
    m = send_bounds[1] - send_bounds[0]
    with t.workspace() as ws:
        if p == 1:
            dst[...] = src
            return
        # phase 1: work[i] = the block for rank (rank + i) mod p, at distance i
        work = ws.take(p * m, src.dtype).reshape(p, m)
        blocks = src.reshape(p, m)
        work[:p - rank] = blocks[rank:]
        work[p - rank:] = blocks[:rank]
        packs = ws.take(2 * p * m, src.dtype)
        outgoing, incoming = packs[:p * m].reshape(p, m), packs[p * m:].reshape(p, m)
        # phase 2: a block keeps its index (distance) as it hops; it has arrived when the
        # bits of its distance are all used up
        # index arrays live on the GPU the blocks are on: one plan per device
        device = None if type(work) is np.ndarray else work.device.id
        steps, arrived = _bruck_plan(p, rank, device)
        for bit, moving in steps:
            count = moving.size
            work.take(moving, axis=0, out=outgoing[:count])
            t.sendrecv(outgoing[:count].reshape(-1), (rank + bit) % p,
                       incoming[:count].reshape(-1), (rank - bit) % p)
            work[moving] = incoming[:count]
        # phase 3: index i now holds the block from rank (rank - i) mod p
        work.take(arrived, axis=0, out=dst.reshape(p, m))


@lru_cache(maxsize=64)
def _bruck_plan(p: int, rank: int, device: int | None = None) -> tuple[list[tuple[int, Any]], Any]:
    """Bruck's index arrays, made once per (p, rank, device): per step (2^k, the indices
    with bit k set), and the index that holds rank i's block at the end; on GPU
    ``device`` (CuPy, that device current) when the blocks are there."""
    indices = np.arange(p)
    steps = []
    bit = 1
    while bit < p:
        steps.append((bit, np.flatnonzero(indices & bit)))
        bit <<= 1
    arrived = (rank - indices) % p
    if device is not None:
        xp = cupy_module()
        with xp.cuda.Device(device):
            steps = [(bit, xp.asarray(moving)) for bit, moving in steps]
            arrived = xp.asarray(arrived)
    return steps, arrived
