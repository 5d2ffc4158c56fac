"""Scan and exscan: prefix reductions in rank order.

``scan``: rank r gets x0 op x1 op ... op xr (MPI_Scan). ``exscan``: rank r gets
x0 op ... op x(r-1) (MPI_Exscan); rank 0 gets nothing, and its ``dst`` is left as it was
(workspace: the Communicator returns None there). ``src`` is this rank's input (read only
unless it is ``dst``); ``dst`` receives the prefix and may be ``src`` itself (in place).
Operands are always combined lower ranks first, so non-commutative ops are exact.

Terms: a rank's *prefix* is the reduction of its own rank and all below it; a *block* is
a run of consecutive ranks, and a block's *partial* is the reduction of their inputs.
n is the message size in bytes.
"""

from __future__ import annotations

import numpy as np

from ..ops import Op
from ..transport import Transport
from . import register


@register("scan", "linear")
def linear_scan(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Chain: rank r receives the prefix of ranks 0..r-1 from r-1, combines its own input
    after it and sends the prefix of 0..r on to r+1.

    Steps: p-1, one after another; bytes: n per message; reductions: n per rank but 0.
    Cost: (p-1)*(alpha + n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if rank == 0:
            if dst is not src:
                dst[...] = src
        else:
            incoming = ws.take(src.size, src.dtype)
            t.recv(incoming, rank - 1)
            op(incoming, src, out=dst)
        if rank + 1 < p:
            t.send(dst, rank + 1)


@register("exscan", "linear")
def linear_exscan(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Chain: rank r receives the prefix of ranks 0..r-1 from r-1 (its result), and sends
    that prefix combined with its own input on to r+1.

    Steps: p-1, one after another; bytes: n per message; reductions: n per rank but the
    first and the last.
    Cost: (p-1)*(alpha + n*beta) + (p-2)*n*gamma
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        if rank == 0:
            if p > 1:
                t.send(src, 1)
            return
        incoming = dst if dst is not src else ws.take(src.size, src.dtype)
        t.recv(incoming, rank - 1)
        if rank + 1 < p:
            onward = ws.take(src.size, src.dtype)
            op(incoming, src, out=onward)
            t.send(onward, rank + 1)
        if incoming is not dst:  # in place: src was read, now it takes the result
            dst[...] = incoming


@register("scan", "recursive_doubling")
def recursive_doubling_scan(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Recursive doubling (Hillis-Steele; MPICH's default scan): at step k every rank
    swaps its block's partial with rank XOR 2^k, whose block of 2^k ranks lies next to its
    own; a partner below is combined in front of both the rank's prefix and its partial.

    Any p: a partner past the last rank is skipped.
    Steps: ceil(lg p); bytes: n per step; reductions: up to 2n per step (n at the last).
    Cost: ceil(lg p)*(alpha + n*beta) + (2*ceil(lg p) - 1)*n*gamma
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        partial = ws.take(src.size, src.dtype)  # my block of ranks' reduction
        incoming = ws.take(src.size, src.dtype)
        partial[...] = src
        if dst is not src:
            dst[...] = src
        mask = 1
        while mask < p:
            partner = rank ^ mask
            if partner < p:
                t.sendrecv(partial, partner, incoming, partner)
                if partner < rank:
                    op(incoming, dst, out=dst)
                if mask << 1 < p:  # (the last step's partial would never be sent)
                    if partner < rank:
                        op(incoming, partial, out=partial)
                    else:
                        op(partial, incoming, out=partial)
            mask <<= 1


@register("exscan", "recursive_doubling")
def recursive_doubling_exscan(t: Transport, src: np.ndarray, dst: np.ndarray,
                              op: Op) -> None:
    """Recursive doubling (MPICH's exscan): the scan's exchanges, with the rank's own input
    left out of its result: the first partner below gives the result its first operand.

    Any p: a partner past the last rank is skipped.
    Steps: ceil(lg p); bytes: n per step; reductions: up to 2n per step (n at the last;
    the first value the result gets is copied, not reduced).
    Cost: ceil(lg p)*(alpha + n*beta) + (2*ceil(lg p) - 2)*n*gamma
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        partial = ws.take(src.size, src.dtype)
        incoming = ws.take(src.size, src.dtype)
        partial[...] = src  # before dst is written: dst may be src
        started = False  # dst holds a reduction of lower ranks
        mask = 1
        while mask < p:
            partner = rank ^ mask
            if partner < p:
                t.sendrecv(partial, partner, incoming, partner)
                if partner < rank:
                    if started:
                        op(incoming, dst, out=dst)
                    else:
                        dst[...] = incoming
                        started = True
                if mask << 1 < p:  # (the last step's partial would never be sent)
                    if partner < rank:
                        op(incoming, partial, out=partial)
                    else:
                        op(partial, incoming, out=partial)
            mask <<= 1


@register("scan", "binomial")
def binomial_scan(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """Binomial tree up, then down (Blelloch's up-sweep/down-sweep over ranks, in the
    Fenwick-tree form that takes any p). With i = rank + 1 and d = 1, 2, 4, ...:

    Up: at level d a rank with i % 2d == 0 receives the partial of the d ranks below its
    block from rank - d and combines it in front: it then holds ranks i-2d .. rank. A
    rank with i a power of two now holds its prefix.
    Down, from the top level: a rank with i % 2d == 0 (its prefix complete) sends it to
    rank + d, whose block starts there; that rank combines it in front: its prefix.
    Half the recursive doubling's reductions, twice its depth.
    Steps: 2 ceil(lg p) - 1 on the critical path; bytes: n per message; reductions: n per
    message received, at most 2 per rank.
    Cost: (2*ceil(lg p) - 1)*(alpha + n*beta + n*gamma)
    """
    p, rank = t.size, t.rank
    i = rank + 1  # a Fenwick tree's index: this rank's block is (i - lowbit(i), i]
    levels = (p - 1).bit_length()  # ceil(lg p)
    with t.workspace() as ws:
        incoming = ws.take(src.size, src.dtype)
        if dst is not src:
            dst[...] = src
        for k in range(levels):  # up: blocks double
            d = 1 << k
            if i % (2 * d) == 0:
                t.recv(incoming, rank - d)
                op(incoming, dst, out=dst)
            else:  # i % 2d == d: this rank's block is complete; it goes up, or stays
                if rank + d < p:
                    t.send(dst, rank + d)
                break
        for k in reversed(range(levels - 1)):  # down: prefixes fill in the gaps
            d = 1 << k
            if i % (2 * d) == 0:
                if rank + d < p:
                    t.send(dst, rank + d)
            elif i % (2 * d) == d and i > d:
                t.recv(incoming, rank - d)
                op(incoming, dst, out=dst)


@register("exscan", "binomial")
def binomial_exscan(t: Transport, src: np.ndarray, dst: np.ndarray, op: Op) -> None:
    """The binomial scan into workspace, then every prefix shifted one rank up.

    Steps: 2 ceil(lg p); bytes: n per message; reductions: as the binomial scan.
    Cost: 2*ceil(lg p)*(alpha + n*beta) + (2*ceil(lg p) - 1)*n*gamma
    """
    p, rank = t.size, t.rank
    with t.workspace() as ws:
        prefix = ws.take(src.size, src.dtype)
        binomial_scan(t, src, prefix, op)
        if 0 < rank < p - 1:
            t.sendrecv(prefix, rank + 1, dst, rank - 1)
        elif rank < p - 1:
            t.send(prefix, rank + 1)
        elif rank > 0:
            t.recv(dst, rank - 1)
