"""Check mode on every collective: a call whose ranks disagree raises MismatchError on
every rank (nothing else), and the same call agreeing runs; on host and device arrays."""

from __future__ import annotations

import numpy as np
import pytest
from fake_cupy import installed

import mpicoll
from mpicoll.local import run_local

P = 3
LAST = P - 1  # the rank that disagrees


def _call(comm, collective: str, disagree: bool, xp):
    """One call of ``collective`` in which, when ``disagree``, the last rank differs in
    what the fingerprint compares (dtype, shape, root or op)."""
    odd = disagree and comm.rank == LAST
    dtype = np.float32 if odd else np.float64
    rows = xp.asarray(np.ones((P, 2), dtype))
    x = xp.asarray(np.ones(3 if odd else 2))
    if collective == "broadcast":
        data = xp.asarray(np.ones(3, dtype))
        return comm.broadcast(data, root=1 if odd else 0)
    if collective == "scatter":
        return comm.scatter(rows if comm.rank == (1 if odd else 0) else None,
                            root=1 if odd else 0)
    if collective == "gather":
        return comm.gather(x, root=0)
    if collective == "all_gather":
        return comm.all_gather(x)
    if collective == "reduce":
        return comm.reduce(xp.asarray(np.ones(2)), op="max" if odd else "sum", root=0)
    if collective == "all_reduce":
        return comm.all_reduce(xp.asarray(np.ones(2, dtype)))
    if collective == "reduce_scatter":
        return comm.reduce_scatter(rows)
    if collective == "all_to_all":
        return comm.all_to_all(xp.asarray(np.ones((P, 3 if odd else 2))))
    if collective == "barrier":
        return comm.barrier(algorithm="dissemination" if odd else "auto")
    if collective in ("scan", "exscan"):
        return getattr(comm, collective)(xp.asarray(np.ones(2)), op="max" if odd else "sum")
    raise ValueError(collective)


@pytest.mark.parametrize("device", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("collective", mpicoll.COLLECTIVES)
def test_a_disagreeing_call_raises_mismatch_on_every_rank(collective, device):
    assert len(mpicoll.COLLECTIVES) == 11

    def body(comm, xp):
        try:
            _call(comm, collective, True, xp)
        except mpicoll.MismatchError as exc:
            outcome = exc
        else:
            outcome = None
        _call(comm, collective, False, xp)  # then an agreeing call runs
        return outcome

    if device:
        with installed() as cupy:
            outcomes = run_local(P, body, cupy, check=True)
    else:
        outcomes = run_local(P, body, np, check=True)
    assert all(isinstance(o, mpicoll.MismatchError) for o in outcomes), outcomes
    assert all(f"rank {LAST}" in str(o) for o in outcomes), outcomes
