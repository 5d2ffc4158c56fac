"""The Swing butterfly and Bine's negabinary labels: the schedule shared by the Swing and
Bine algorithms of all_reduce, reduce_scatter and all_gather.

Swing (De Sensi et al., NSDI 2024) pairs the p ranks (p a power of two) at step
k = 0, 1, ..., lg p - 1 at the distance

    rho(k) = sum of (-2)^i for i = 0..k  =  1, -1, 3, -5, 11, -21, ...

taken forward from an even rank and backward from an odd one:

    peer(r, k) = r + rho(k) mod p   (r even)        r - rho(k) mod p   (r odd)

so a rank swings from one side of itself to the other while the distance only about
doubles (|rho(k)| is about 2^(k+1)/3, against recursive doubling's 2^k): on a ring or a
torus the messages cross fewer links. rho(k) is odd, so the peer has the other parity
and ``peer(peer(r, k), k) == r``: every step pairs the ranks. Bine (De Sensi et al.,
SC 2025) reads the same distances as negabinary (base -2) numbers, rho(k) being 1...1
(k+1 ones), and builds its butterflies on them: a Bine butterfly has Swing's peers.

Subtrees. S_k(r), the ranks that r reaches through the steps k, k+1, ..., lg p - 1
(each taken or not, in that order), splits as S_k(r) = S_{k+1}(r) + S_{k+1}(peer(r, k)),
two disjoint halves. A butterfly reduce_scatter keeps at step k the blocks of
S_{k+1}(r) and sends the peer those of S_{k+1}(peer); an all_gather runs the steps
backwards. The sets are scattered over the ranks (S_1(0) = {0, 3, 4, 7} at p = 8), but
Bine's label

    nu(r) = bit_reverse(gray(negabinary(v)))   v = r for odd r, -r for even r (mod p)

numbers the ranks so that each S_k(r) is the ranks whose labels share r's top k bits:
an aligned range of labels. Blocks laid out by label are contiguous at every step.
"""

from __future__ import annotations

from functools import cache


def rho(step: int) -> int:
    """The distance of step ``step``: 1 - 2 + 4 - ... + (-2)^step = (1 - (-2)^(step+1)) / 3."""
    return (1 - (-2) ** (step + 1)) // 3


def peer(rank: int, step: int, size: int) -> int:
    """The rank that ``rank`` exchanges with at ``step`` of a Swing or Bine butterfly of
    ``size`` ranks (a power of two): rho(step) ahead of an even rank, behind an odd one."""
    return (rank + rho(step)) % size if rank % 2 == 0 else (rank - rho(step)) % size


def negabinary(value: int) -> int:
    """The base -2 digits of ``value``, as the bits of an int: 3 = 4 - 2 + 1 -> 0b111."""
    digits, place = 0, 1
    while value:
        if value & 1:  # odd (Python's & sees negative numbers in two's complement)
            digits |= place
            value -= 1
        value //= -2
        place <<= 1
    return digits


@cache
def labels(size: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Bine's label nu(r) of every rank of a butterfly of ``size`` ranks (a power of two),
    and its inverse: ``label[r]`` and ``rank_of[label]``."""
    bits = size.bit_length() - 1
    label = []
    for r in range(size):
        v = (r if r % 2 else -r) % size
        if negabinary(v).bit_length() > bits:  # of v and v - p, the one with lg p digits
            v -= size
        gray = negabinary(v) ^ (negabinary(v) >> 1)
        label.append(int(f"{gray:0{bits}b}"[::-1], 2) if bits else 0)
    rank_of = [0] * size
    for r, mine in enumerate(label):
        rank_of[mine] = r
    return tuple(label), tuple(rank_of)


def window(label: int, step: int, bits: int) -> tuple[int, int]:
    """The labels [lo, hi) that share their top ``step`` bits (of ``bits``) with ``label``:
    the subtree S_step of the rank so labelled."""
    width = 1 << (bits - step)
    lo = label & ~(width - 1)
    return lo, lo + width
