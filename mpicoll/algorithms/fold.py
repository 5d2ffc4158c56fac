"""Folding any number of ranks onto a power of two, as MPICH does for recursive doubling.

With p ranks, p2 the largest power of two <= p and rem = p - p2: among the first 2*rem
ranks, each even rank hands its data to the odd rank above it and sits out; the p2
ranks left are renumbered 0..p2-1 ("new ranks") and run the power-of-two algorithm; at
the end each odd rank hands the result back to its even partner. New rank i stands for
the old ranks (and so the blocks) 2i, 2i+1 when i < rem, else for old rank i + rem; the
blocks a new rank stands for are contiguous and in order, so a window of new ranks is
one contiguous slice of the buffer.
"""

from __future__ import annotations


class Fold:
    def __init__(self, size: int) -> None:
        self.size = size
        self.p2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.p2

    def sits_out(self, rank: int) -> bool:
        """True for the even ranks among the first 2*rem, which hand their data on."""
        return rank < 2 * self.rem and rank % 2 == 0

    def new_rank(self, rank: int) -> int | None:
        if rank < 2 * self.rem:
            return None if rank % 2 == 0 else rank // 2
        return rank - self.rem

    def old_rank(self, new: int) -> int:
        return 2 * new + 1 if new < self.rem else new + self.rem

    def first_block(self, new: int) -> int:
        """The first old block that new rank ``new`` stands for."""
        return 2 * new if new < self.rem else new + self.rem

    def end_block(self, new: int) -> int:
        """One past the last old block that new rank ``new`` stands for."""
        return self.first_block(new + 1) if new + 1 < self.p2 else self.size
