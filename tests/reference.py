"""Inputs every rank can rebuild for any rank, and NumPy references built from them.

Values are small integers (1 and 2 for products), so every op is exact in every dtype:
results can be compared with ``array_equal`` whatever order an algorithm combines in.
"""

from __future__ import annotations

import numpy as np

import mpicoll
from mpicoll.ops import ReduceOp, resolve_op

DTYPES = ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
OPS = tuple(op.value for op in ReduceOp)


def op_fits(op: str, dtype: str) -> bool:
    try:
        resolve_op(op, np.dtype(dtype))
    except (TypeError, ValueError):
        return False
    return True


DTYPE_OPS = tuple((d, o) for d in DTYPES for o in OPS if op_fits(o, d))


def make_input(rank: int, shape: tuple[int, ...], dtype: str, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input: different on every rank and element, exact under ``op``."""
    return np.asarray(_values(rank, shape, dtype, op)).reshape(shape)


def _values(rank: int, shape: tuple[int, ...], dtype: str, op: str) -> np.ndarray:
    dt = np.dtype(dtype)
    idx = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    base = (idx * 7 + rank * 3 + 1) % 5
    if dt.kind == "b":
        return (base % 2).astype(dt)
    if op == "prod":
        base = base % 2 + 1
    if dt.kind == "c":
        return (base + 1j * ((idx + rank) % 2)).astype(dt)
    if dt.kind == "i" and op not in ("prod",):
        base = base - 2  # negative values too
    return base.astype(dt)


def reduced(inputs: list[np.ndarray], op: str) -> np.ndarray:
    """The rank-order reduction of ``inputs`` with NumPy."""
    fn = resolve_op(op, inputs[0].dtype)
    acc = inputs[0].copy()
    for x in inputs[1:]:
        fn(acc, x, out=acc)
    if fn.average:
        np.divide(acc, len(inputs), out=acc)
    return acc


def assert_same(got: np.ndarray | None, expected: np.ndarray | None, what: str = "") -> None:
    if expected is None:
        assert got is None, f"{what}: expected None, got {got!r}"
        return
    assert isinstance(got, np.ndarray), f"{what}: expected an array, got {type(got).__name__}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert np.array_equal(got, expected), f"{what}:\n got {got}\n expected {expected}"


def strided(a: np.ndarray) -> np.ndarray:
    """The values of ``a`` in a view that is not C-contiguous (every other element)."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def run_case(comm: mpicoll.Communicator, collective: str, algorithm: str, shape: tuple[int, ...],
             dtype: str, op: str = "sum", root: int = 0, non_contiguous: bool = False) -> None:
    """Run one collective on ``comm`` and check this rank's result against NumPy.

    With ``non_contiguous``, this rank's input is a strided view of the same values.
    """
    p, rank = comm.size, comm.rank
    rows = (p, *shape)
    if collective in ("scatter", "reduce_scatter", "all_to_all"):
        inputs = [make_input(r, rows, dtype, op) for r in range(p)]
    else:
        inputs = [make_input(r, shape, dtype, op) for r in range(p)]
    x = strided(inputs[rank]) if non_contiguous else inputs[rank]
    assert not (non_contiguous and x.flags.c_contiguous), "the strided input is contiguous"
    copy = x.copy()
    what = f"{collective}/{algorithm} p={p} rank={rank} root={root} {dtype} {op} shape={shape}"
    if collective == "broadcast":
        got = comm.broadcast(x if rank == root else None, root, algorithm=algorithm)
        expected = inputs[root]
    elif collective == "scatter":
        got = comm.scatter(x if rank == root else None, root, algorithm=algorithm)
        expected = inputs[root][rank]
    elif collective == "gather":
        got = comm.gather(x, root, algorithm=algorithm)
        expected = np.stack(inputs) if rank == root else None
    elif collective == "all_gather":
        got = comm.all_gather(x, algorithm=algorithm)
        expected = np.stack(inputs)
    elif collective == "reduce":
        got = comm.reduce(x, op, root, algorithm=algorithm)
        expected = reduced(inputs, op) if rank == root else None
    elif collective == "all_reduce":
        got = comm.all_reduce(x, op, algorithm=algorithm)
        expected = reduced(inputs, op)
    elif collective == "reduce_scatter":
        got = comm.reduce_scatter(x, op, algorithm=algorithm)
        expected = reduced(inputs, op)[rank]
    elif collective == "all_to_all":
        got = comm.all_to_all(x, algorithm=algorithm)
        expected = np.stack([inputs[i][rank] for i in range(p)])
    else:
        raise ValueError(collective)
    assert_same(got, expected, what)
    assert np.array_equal(x, copy), f"{what}: the input was modified"


ROOTED = ("broadcast", "scatter", "gather", "reduce")
REDUCING = ("reduce", "all_reduce", "reduce_scatter")
