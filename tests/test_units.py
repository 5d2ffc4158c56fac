"""Unit tests of the pieces under the algorithms: bounds, the fold, ops, selection, registry."""

from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll import selection
from mpicoll.algorithms import REGISTRY
from mpicoll.algorithms.fold import Fold
from mpicoll.buffers import DTYPE_TABLE, chunk_bounds, dtype_code, dtype_from_code, even_bounds
from mpicoll.ops import resolve_op


@pytest.mark.parametrize("count", [0, 1, 2, 7, 8, 9, 100, 101])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 5, 7, 8, 16])
def test_chunk_bounds_cover_count_evenly(count, parts):
    bounds = chunk_bounds(count, parts)
    sizes = np.diff(bounds)
    assert len(bounds) == parts + 1 and bounds[0] == 0 and bounds[-1] == count
    assert sizes.max() - sizes.min() <= 1
    assert list(sizes) == sorted(sizes, reverse=True)  # the larger chunks come first


def test_chunk_bounds_examples_and_errors():
    assert chunk_bounds(10, 4) == (0, 3, 6, 8, 10)
    assert chunk_bounds(2, 4) == (0, 1, 2, 2, 2)
    assert even_bounds(3, 3) == (0, 3, 6, 9)
    with pytest.raises(ValueError):
        chunk_bounds(4, 0)


@pytest.mark.parametrize("size", range(1, 40))
def test_fold_maps_every_rank_and_block_once(size):
    fold = Fold(size)
    assert fold.p2 <= size < 2 * fold.p2 and fold.p2 & (fold.p2 - 1) == 0
    news = [fold.new_rank(r) for r in range(size)]
    active = [n for n in news if n is not None]
    assert sorted(active) == list(range(fold.p2))
    assert sum(fold.sits_out(r) for r in range(size)) == fold.rem
    for r, n in enumerate(news):
        if n is not None:
            assert fold.old_rank(n) == r
            assert fold.first_block(n) <= r < fold.end_block(n)  # a rank stands for its own block
    # the blocks of the new ranks tile 0..size in order
    spans = [(fold.first_block(n), fold.end_block(n)) for n in range(fold.p2)]
    assert spans[0][0] == 0 and spans[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(spans[:-1], spans[1:], strict=True))


@pytest.mark.parametrize("op,kinds", [("sum", "biufc"), ("prod", "biufc"), ("min", "biuf"),
                                      ("max", "biuf"), ("avg", "fc"), ("band", "biu"),
                                      ("bor", "biu"), ("bxor", "biu")])
def test_op_dtype_table(op, kinds):
    for dtype in ("?", "i1", "u8", "f2", "f8", "c8"):
        dt = np.dtype(dtype)
        if dt.kind in kinds:
            assert resolve_op(op, dt).name == op
        else:
            with pytest.raises(mpicoll.UnsupportedDtypeError, match=f"op '{op}' cannot reduce"):
                resolve_op(op, dt)


def test_ops_accept_reduce_op_members():
    assert resolve_op(mpicoll.ReduceOp.MAX, np.dtype("f4")).name == "max"
    assert mpicoll.ReduceOp.SUM == "sum"
    with pytest.raises(mpicoll.InvalidArgumentError, match="op: unknown"):
        resolve_op("mean", np.dtype("f4"))


def test_dtype_codes_round_trip():
    for dt in DTYPE_TABLE:
        assert dtype_from_code(dtype_code(dt)) == dt
    assert dtype_code(np.dtype("M8[s]")) == -1


def test_every_algorithm_has_a_cost_line():
    for collective, algos in REGISTRY.items():
        assert algos, f"{collective} has no algorithm"
        for algo in algos.values():
            assert "alpha" in algo.cost, f"{collective}/{algo.name}: cost {algo.cost!r}"


def test_algorithms_lists_names_for_each_backend():
    assert mpicoll.algorithms("all_reduce") == [
        "ring", "recursive_doubling", "reduce_broadcast", "native"]
    assert "native" not in mpicoll.algorithms("all_reduce", "local")
    with pytest.raises(mpicoll.InvalidArgumentError, match="collective: unknown"):
        mpicoll.algorithms("allreduce")
    with pytest.raises(mpicoll.InvalidArgumentError, match="backend: unknown"):
        mpicoll.algorithms("all_reduce", "gloo")


@pytest.mark.parametrize("collective", mpicoll.COLLECTIVES)
@pytest.mark.parametrize("size", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("nbytes", [0, 8, 4096, 1 << 20, 1 << 26])
@pytest.mark.parametrize("has_native", [True, False])
def test_auto_picks_a_registered_algorithm(collective, size, nbytes, has_native):
    op = resolve_op("sum", np.dtype("f4"))
    name = selection.select(collective, nbytes, size, op, has_native)
    valid = mpicoll.algorithms(collective, "mpi" if has_native else "local")
    assert name in valid


def test_readme_lists_every_algorithm_with_its_cost():
    import pathlib

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    for collective, algos in REGISTRY.items():
        for algo in algos.values():
            row = f"| {collective} | `{algo.name}` | `{algo.cost}` |"
            assert row in readme, f"README.md lacks the row {row}"
