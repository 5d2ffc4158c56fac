"""MPICH's default choices, as thresholds: what ``auto`` falls back to without a tuning
table or a fitted model, and what the cost model takes ``native`` to run.

From MPICH's ``coll_selection.json`` (the intra-node defaults of MPICH 4/5), with
``native`` below the sizes where the Python cost of each of our steps outweighs the wire.
"""

from __future__ import annotations

from ..ops import Op

# Below these sizes (bytes) the MPI library's collective wins: its steps cost a few
# microseconds of C, ours a few microseconds of Python each.
NATIVE_BELOW = {
    "broadcast": 1 << 16,
    "scatter": 1 << 16,
    "gather": 1 << 16,
    "all_gather": 1 << 16,
    "reduce": 1 << 16,
    "all_reduce": 1 << 12,
    "reduce_scatter": 1 << 16,
    "all_to_all": 1 << 16,
    "scan": 1 << 16,
    "exscan": 1 << 16,
}


# the collectives these rules know; auto takes the cost model's pick for any other
RULED = frozenset((*NATIVE_BELOW, "barrier"))

# reduce: Rabenseifner's reduce_scatter + gather beats the binomial tree from here (bytes)
RABENSEIFNER_REDUCE_FROM = 1 << 22  # measured at 2 and 4 ranks: binomial wins at 1 MiB
# scan, exscan: the binomial tree beats recursive doubling from here (bytes)
BINOMIAL_SCAN_FROM = 1 << 18


def _power_of_two(p: int) -> bool:
    return p & (p - 1) == 0


def mpich_default(collective: str, nbytes: int, size: int, op: Op | None, has_native: bool,
                  uneven: bool = False) -> str:
    """What ``auto`` falls back to: ``native`` for small messages, else MPICH's default
    thresholds (``mpich_native``), except where our own algorithms measured otherwise
    here (all_reduce, reduce, scan and exscan: below)."""
    if collective == "barrier":
        return "native" if has_native else "dissemination"
    if has_native and nbytes < NATIVE_BELOW[collective]:
        return "native"
    commutative = op is None or op.commutative
    if collective == "reduce":  # (MPICH: Rabenseifner from 2 KiB)
        return "rabenseifner" if commutative and nbytes >= RABENSEIFNER_REDUCE_FROM else "binomial"
    if collective == "all_reduce" and commutative:
        # (MPICH: Rabenseifner from 2 KiB) measured here (one node): recursive doubling
        # up to about 1 MiB, where the ring's halved reduction work starts to win
        return "recursive_doubling" if nbytes < (1 << 20) else "ring"
    if collective in ("scan", "exscan"):
        # (MPICH: recursive doubling at every size) measured here (one node, 2 and 3
        # ranks): the binomial tree's fewer reductions and messages per rank win from
        # 256 KiB (2x at 4 MiB, also over MPICH's own scan)
        return "recursive_doubling" if nbytes < BINOMIAL_SCAN_FROM else "binomial"
    return mpich_native(collective, nbytes, size, op, uneven)


def mpich_native(collective: str, nbytes: int, size: int, op: Op | None,
                 uneven: bool = False) -> str:
    """The algorithm MPICH's default selection runs for this call (the intra-node
    defaults of MPICH 4/5's ``coll_selection.json``), as mpicoll names it: what the cost
    model takes MPI's own collective (``native``) to run."""
    commutative = op is None or op.commutative
    builtin = op is None or op.builtin  # (MPICH's tree asks is_op_built_in)
    if collective == "barrier":
        return "dissemination"
    if collective == "broadcast":  # binomial up to 12 KiB or below 8 ranks
        return "binomial" if nbytes <= 12288 or size < 8 else "scatter_allgather"
    if collective in ("scatter", "gather"):
        return "binomial"
    if collective == "all_gather":
        # at powers of two recursive doubling below 512 KiB, else Bruck below 80 KiB;
        # ring above
        if nbytes < (524288 if _power_of_two(size) else 81920):
            return "recursive_doubling" if _power_of_two(size) else "bruck"
        return "ring"
    # reduce and all_reduce: Rabenseifner above 2 KiB and 8 B, for built-in ops (and
    # where the count reaches the ranks' power of two, which bytes alone do not tell)
    if collective == "reduce":
        return "rabenseifner" if builtin and nbytes > 2048 else "binomial"
    if collective == "all_reduce":
        return "rabenseifner" if builtin and nbytes > 8 else "recursive_doubling"
    if collective == "reduce_scatter":  # recursive halving below 512 KiB
        if not commutative:
            return "recursive_doubling"
        return "recursive_halving" if nbytes < 524288 else "ring"
    if collective == "all_to_all":
        # Bruck for blocks up to 256 B at 8+ ranks, isend/irecv below 32 KiB blocks,
        # pairwise above
        block = nbytes // max(size, 1)
        if not uneven and block <= 256 and size >= 8:
            return "bruck"
        return "linear" if block < 32768 else "pairwise"
    if collective in ("scan", "exscan"):  # recursive doubling at every size
        return "recursive_doubling"
    raise ValueError(f"no selection rule for {collective!r}")
