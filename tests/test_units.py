"""Unit tests of the pieces under the algorithms: bounds, the fold, ops, selection, registry."""

from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest

import mpicoll
from mpicoll import selection
from mpicoll.algorithms import REGISTRY
from mpicoll.algorithms.fold import Fold
from mpicoll.backends import (
    BACKENDS,
    CAPABILITIES,
    Backend,
    LocalBackend,
    MPIBackend,
    NCCLBackend,
)
from mpicoll.buffers import DTYPE_TABLE, chunk_bounds, dtype_code, dtype_from_code, even_bounds
from mpicoll.ops import dtype_kind, resolve_op
from mpicoll.transport.local import LocalWorld


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
                                      ("bor", "biu"), ("bxor", "biu"), ("land", "biufc"),
                                      ("lor", "biufc"), ("lxor", "biufc")])
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


# ---- logical ops, minloc/maxloc, reduce_local ------------------------------------------

# every numeric dtype, ml_dtypes' narrow floats and integers included (float8_e8m0fnu,
# powers of two only, has no zero: no truth table)
ALL_NUMERIC = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "g",
               "c8", "c16", "G", ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
               ml_dtypes.float8_e5m2, *(getattr(ml_dtypes, name) for name in (
                   "float8_e4m3", "float8_e3m4", "float6_e2m3fn", "float4_e2m1fn", "int4",
                   "uint4", "int2", "uint2") if hasattr(ml_dtypes, name))]
TRUTH = {"land": lambda p, q: p & q, "lor": lambda p, q: p | q, "lxor": lambda p, q: p ^ q}


@pytest.mark.parametrize("op", ["land", "lor", "lxor"])
@pytest.mark.parametrize("dtype", ALL_NUMERIC, ids=lambda d: np.dtype(d).name)
def test_logical_ops_give_one_or_zero_of_the_dtype(op, dtype):
    """MPI_LAND/LOR/LXOR: an element is true where nonzero (0.5, -2, 1j too); the result
    is 1 or 0 in the input's dtype, also where the result is written over an operand."""
    dt = np.dtype(dtype)
    kind = dtype_kind(dt)
    # values a bitwise op would get wrong (2 and 3, -2 and 3); the 2-bit integers hold
    # -2..1 or 0..3 only: 2 and 1, -2 and 1 there
    tiny = kind in "iu" and dt.kind == "V" and ml_dtypes.iinfo(dt).max < 7
    a = {"b": [0, 0, 1, 1], "u": [0, 0, 2, 3, 1], "c": [0, 0, 1j, 0.5, 2 + 2j]}.get(
        kind, [0, 0, -2, 0.5 if kind == "f" else 3, 1])
    b = {"b": [0, 1, 0, 1], "c": [0, 1j, 0, -3, 0.5j]}.get(kind, [0, 2, 0, 3, 1])
    if tiny:
        a, b = [0, 0, 2 if kind == "u" else -2, 1, 1], [0, 1, 0, 2 if kind == "u" else 1, 1]
    a, b = np.array(a, dt), np.array(b, dt)
    expected = TRUTH[op](a != 0, b != 0)
    assert expected.any() and not expected.all()
    fn = resolve_op(op, dt)
    for out in ("new", "a", "b"):
        x, y = a.copy(), b.copy()
        into = {"new": np.full_like(x, 7 if dt.kind != "b" else 1), "a": x, "b": y}[out]
        fn(x, y, into)
        assert into.dtype == dt
        assert np.array_equal(into, expected.astype(dt)), (op, dt, out, into)


def test_logical_ops_refuse_a_dtype_without_zero():
    """float8_e8m0fnu (powers of two, no 0) cannot hold a logical op's 0: refused, not
    a NaN that the next combination would take for true."""
    with pytest.raises(mpicoll.UnsupportedDtypeError, match="no 0"):
        resolve_op("lxor", np.dtype(ml_dtypes.float8_e8m0fnu))
    assert resolve_op("max", np.dtype(ml_dtypes.float8_e8m0fnu)) is not None


LOC_REFUSED = [np.dtype("f8"), np.dtype([("value", "f8")]),
               np.dtype([("value", "c8"), ("index", "i4")]),
               np.dtype([("value", "f8"), ("index", "f4")]),
               np.dtype([("value", "f8"), ("index", "i4"), ("rank", "i4")]),
               np.dtype([("value", "f8", (2,)), ("index", "i4")]),
               np.dtype([("val", "f8"), ("index", "i4")])]


@pytest.mark.parametrize("op", ["minloc", "maxloc"])
def test_loc_ops_take_value_index_dtypes_only(op):
    for dtype in LOC_REFUSED:
        with pytest.raises(mpicoll.UnsupportedDtypeError,
                           match=f"op '{op}' cannot reduce .*fields 'value'.* and 'index'"):
            resolve_op(op, dtype)
    for value in ("?", "i1", "u8", "f2", "f4", "f8", "g", ml_dtypes.bfloat16):
        for index in ("i4", "i8", "u2"):
            assert resolve_op(op, mpicoll.loc_dtype(value, index)).name == op
            packed = np.dtype([("index", index), ("value", value)])  # any order, no padding
            assert resolve_op(op, packed).name == op
    assert resolve_op(mpicoll.ReduceOp.MINLOC, mpicoll.loc_dtype("f8")).commutative


def test_loc_dtype_is_c_struct_layout():
    """mpicoll.loc_dtype: {value; index} with C's alignment (MPI's pair types' layout)."""
    assert mpicoll.loc_dtype("f8") == np.dtype(
        {"names": ["value", "index"], "formats": ["f8", "i4"], "offsets": [0, 8], "itemsize": 16})
    assert mpicoll.loc_dtype("f4").itemsize == 8
    assert mpicoll.loc_dtype("i2").fields["index"][1] == 4
    assert mpicoll.loc_dtype("f8", "i8").fields["index"][0] == np.dtype("i8")
    for value, index in (("c8", "i4"), ("f8", "f8"), ("f8", "?")):
        with pytest.raises(mpicoll.UnsupportedDtypeError, match="loc_dtype: the value must"):
            mpicoll.loc_dtype(value, index)


@pytest.mark.parametrize("op,better", [("minloc", np.less), ("maxloc", np.greater)])
def test_loc_ops_keep_the_extreme_value_and_on_a_tie_the_lower_index(op, better):
    dt = mpicoll.loc_dtype("f4")
    a = np.array([(1, 5), (2, 3), (1, 1), (4, 2), (-1, -7)], dt)
    b = np.array([(1, 4), (2, 7), (0, 9), (5, 8), (-1, -7)], dt)
    pick_b = better(b["value"], a["value"]) | (
        (b["value"] == a["value"]) & (b["index"] < a["index"]))
    expected = np.where(pick_b, b, a)
    assert expected["index"].tolist()[:2] == [4, 3]  # the ties go to the lower index
    fn = resolve_op(op, dt)
    for first, second in ((a, b), (b, a)):  # commutative
        new, x, y = np.zeros_like(a), first.copy(), second.copy()
        fn(first, second, new)
        fn(x, second, x)  # out may be either operand
        fn(first, y, y)
        for got in (new, x, y):
            assert np.array_equal(got, expected), (op, got)


@pytest.mark.parametrize("value", ["f8", "f2", "bfloat16"])
@pytest.mark.parametrize("op", ["minloc", "maxloc"])
def test_loc_ops_let_a_nan_win_whatever_the_order_of_the_operands(op, value):
    """A NaN value beats any other (as NumPy's minimum and maximum), the lower index among
    NaNs: commutative and associative with NaNs too (bfloat16's, whose kind is not "f",
    as float64's)."""
    if value == "bfloat16":
        value = pytest.importorskip("ml_dtypes").bfloat16
    dt = mpicoll.loc_dtype(value)
    rows = [np.array([(np.nan, 3), (1.0, 5), (np.nan, 7), (2.0, 1)], dt),
            np.array([(1.0, 2), (np.nan, 6), (np.nan, 4), (2.0, 0)], dt),
            np.array([(0.5, 1), (0.5, 0), (np.nan, 9), (np.nan, 8)], dt)]
    fn = resolve_op(op, dt)
    results = []
    for order in ((0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1)):
        acc = rows[order[0]].copy()
        for i in order[1:]:
            fn(acc, rows[i], acc)
        results.append(acc)
    assert all(np.array_equal(r["index"], results[0]["index"]) for r in results)
    assert np.isnan(results[0]["value"]).all()
    assert results[0]["index"].tolist() == [3, 6, 4, 8]


def test_reduce_local_is_b_equals_a_op_b_in_place():
    a = np.arange(6.0).reshape(2, 3)
    b = np.full((2, 3), 10.0)
    assert mpicoll.reduce_local(a, b, "sum") is b
    np.testing.assert_array_equal(b, a + 10)
    subtract = mpicoll.Op(np.subtract, commutative=False)  # a first, as rank order
    c = np.full((2, 3), 10.0)
    mpicoll.reduce_local(a, c, subtract)
    np.testing.assert_array_equal(c, a - 10)
    d = a.copy()
    mpicoll.reduce_local(d, d, mpicoll.ReduceOp.PROD)  # b may be a itself
    np.testing.assert_array_equal(d, a * a)
    wide = np.full((2, 6), 10.0)  # a strided b is written where it is
    mpicoll.reduce_local(a, wide[:, ::2], "max")
    np.testing.assert_array_equal(wide[:, ::2], np.maximum(a, 10))
    np.testing.assert_array_equal(wide[:, 1::2], 10)
    mpicoll.reduce_local(np.full((2, 6), 1.0)[:, ::2], wide[:, 1::2], subtract)
    np.testing.assert_array_equal(wide[:, 1::2], -9)
    def each(a, b, out):  # element by element: it would read what it wrote
        for i in range(len(out)):
            out[i] = a[i] - b[i]

    shifted = np.arange(5, dtype="i8")  # a and b overlap, shifted by one element
    mpicoll.reduce_local(shifted[:4], shifted[1:], mpicoll.Op(each, commutative=False))
    np.testing.assert_array_equal(shifted, [0, -1, -1, -1, -1])
    flags = np.array([0, 3, 0, 5], "i4")
    mpicoll.reduce_local(np.array([2, 2, 0, 0], "i4"), flags, "land")
    np.testing.assert_array_equal(flags, [0, 1, 0, 0])
    z = np.array(3.0)  # 0-d
    mpicoll.reduce_local(np.array(4.0), z, "min")
    assert z == 3.0


@pytest.mark.parametrize("a,b,op,error,match", [
    (np.ones(3), np.ones(4), "sum", mpicoll.InvalidArgumentError, "b: shape .* same shape"),
    (np.ones(3), np.ones(3, "f4"), "sum", mpicoll.InvalidArgumentError, "dtype float32"),
    (np.ones(3), np.ones(3).reshape(3, 1), "sum", mpicoll.InvalidArgumentError, "shape"),
    (np.ones(3), np.ones(3), "avg", mpicoll.InvalidArgumentError, "'avg' divides"),
    (np.ones(3), np.ones(3), "mean", mpicoll.InvalidArgumentError, "op: unknown"),
    (np.ones(3), 1.0, "sum", mpicoll.InvalidArgumentError, "b: expected an array"),
    (np.ones(3), None, "sum", mpicoll.InvalidArgumentError, "b: expected an array"),
    ([1.0, 2.0], np.ones(2), "sum", mpicoll.InvalidArgumentError, "a: expected"),
    (np.ones(3), np.ones(3), "band", mpicoll.UnsupportedDtypeError, "'band' cannot reduce"),
    (np.ones(3), np.ones(3), "minloc", mpicoll.UnsupportedDtypeError, "'minloc' cannot"),
])
def test_reduce_local_refuses(a, b, op, error, match):
    before = None if not isinstance(b, np.ndarray) else b.copy()
    with pytest.raises(error, match=match):
        mpicoll.reduce_local(a, b, op)
    if before is not None:
        np.testing.assert_array_equal(b, before)


def test_reduce_local_refuses_a_read_only_b_and_reports_a_failing_op():
    b = np.ones(3)
    b.flags.writeable = False
    with pytest.raises(mpicoll.InvalidArgumentError, match="b: the array is read-only"):
        mpicoll.reduce_local(np.ones(3), b, "sum")

    def broken(a, b, out):
        raise RuntimeError("nope")

    with pytest.raises(mpicoll.OpError, match="op 'broken' raised RuntimeError: nope"):
        mpicoll.reduce_local(np.ones(3), np.ones(3), mpicoll.Op(broken))


def test_native_mpi_refuses_what_mpi_has_no_op_for():
    """MPI defines land/lor/lxor on integers and bool only, minloc/maxloc on its pair types."""
    from mpicoll.backends.mpi_native import check_op, mpi_op

    for dtype in ("?", "i1", "u8"):
        for op in ("land", "lor", "lxor"):
            check_op(resolve_op(op, np.dtype(dtype)), np.dtype(dtype))
    for dtype in ("f2", "f8", "c8"):
        with pytest.raises(mpicoll.UnsupportedDtypeError, match="MPI defines 'land' on integer"):
            check_op(resolve_op("land", np.dtype(dtype)), np.dtype(dtype))
    for value in ("f4", "f8", "l", "i", "h", "g"):
        dtype = mpicoll.loc_dtype(value)
        datatype, _ = mpi_op(resolve_op("maxloc", dtype), dtype)
        assert datatype.Get_extent() == (0, dtype.itemsize)
    for dtype in (mpicoll.loc_dtype("f2"), mpicoll.loc_dtype("f8", "i8"),
                  mpicoll.loc_dtype("u4"), np.dtype([("value", "f8"), ("index", "i4")]),
                  np.dtype([("index", "i4"), ("value", "f4")])):
        with pytest.raises(mpicoll.UnsupportedDtypeError, match="MPI library's minloc cannot"):
            check_op(resolve_op("minloc", dtype), dtype)


def test_dtype_codes_round_trip():
    for dt in DTYPE_TABLE:
        if dt is not None:
            assert dtype_from_code(dtype_code(dt)) == dt
    assert dtype_code(np.dtype("M8[s]")) == -1


def test_dtype_codes_are_fixed_whatever_ml_dtypes_has(monkeypatch):
    """A rank whose ml_dtypes lacks some types gives every other type the code it has
    where all are there (the header's codes mean one dtype on every rank), and refuses
    the codes of those it lacks, naming the type."""
    import importlib

    import mpicoll.buffers as buffers

    full = {dt: buffers.dtype_code(dt) for dt in buffers.DTYPE_TABLE if dt is not None}
    assert buffers.dtype_code(np.dtype(ml_dtypes.int4)) == 16 + buffers.ML_DTYPE_NAMES.index("int4")
    try:
        for name in ("float8_e3m4", "float8_e8m0fnu", "int2", "uint2"):  # (0.4's lacks)
            monkeypatch.delattr(ml_dtypes, name)
        older = importlib.reload(buffers)
        for dt, code in full.items():
            if dt.name not in ("float8_e3m4", "float8_e8m0fnu", "int2", "uint2"):
                assert older.dtype_code(dt) == code and older.dtype_from_code(code) == dt
        with pytest.raises(mpicoll.UnsupportedDtypeError, match="ml_dtypes' int2, which this "
                                                                "rank's ml_dtypes"):
            older.dtype_from_code(full[np.dtype(ml_dtypes.int4)] - 1)
    finally:
        monkeypatch.undo()
        importlib.reload(buffers)


def test_every_algorithm_has_a_cost_line():
    for collective, algos in REGISTRY.items():
        assert algos, f"{collective} has no algorithm"
        for algo in algos.values():
            assert "alpha" in algo.cost, f"{collective}/{algo.name}: cost {algo.cost!r}"


def test_algorithms_lists_names_for_each_backend():
    assert mpicoll.algorithms("all_reduce") == [
        "ring", "recursive_doubling", "swing_latency", "swing_bandwidth", "bine_latency",
        "bine_bandwidth", "reduce_broadcast", "rabenseifner", "ring_pipelined",
        "allgather_reduce", "hierarchical", "hierarchical_sharded", "double_binary_tree",
        "native"]
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


@pytest.mark.parametrize("collective", ["reduce", "all_reduce", "reduce_scatter"])
@pytest.mark.parametrize("size", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("nbytes", [0, 8, 4096, 1 << 20, 1 << 26])
@pytest.mark.parametrize("has_native", [True, False])
def test_auto_never_picks_an_algorithm_that_would_refuse(collective, size, nbytes, has_native):
    """A non-commutative op gets one that keeps rank order; uneven blocks one that takes them."""
    op = mpicoll.Op(np.subtract, commutative=False)
    name = selection.select(collective, nbytes, size, op, has_native)
    assert name == "native" or not REGISTRY[collective][name].commutative_only
    for coll in ("all_to_all", "all_gather", "gather", "scatter", "reduce_scatter"):
        name = selection.select(coll, nbytes, size, None, has_native, uneven=True)
        assert name == "native" or not REGISTRY[coll][name].even_only


def test_knomial_trees_cover_every_rank_once():
    from mpicoll.algorithms.trees import knomial_children, knomial_parent, knomial_subtree_end

    for p in (1, 2, 3, 5, 9, 16, 17, 31):
        for radix in (2, 3, 4, 8):
            seen = {0}
            for rel in range(p):
                for child, end in knomial_children(rel, p, radix):
                    assert knomial_parent(child, radix) == rel
                    assert knomial_subtree_end(child, p, radix) == end
                    seen.add(child)
                ranks = [c for c, _ in knomial_children(rel, p, radix)]
                assert ranks == sorted(ranks)
            assert seen == set(range(p))


def test_rotated_and_counts_bounds():
    from mpicoll.buffers import counts_bounds, rotated_bounds

    assert counts_bounds([2, 0, 3]) == (0, 2, 2, 5)
    assert rotated_bounds((0, 2, 2, 5), 1) == (0, 0, 3, 5)  # blocks 1, 2, 0
    assert rotated_bounds((0, 2, 2, 5), 0) == (0, 2, 2, 5)


def test_user_op_and_bfloat16():
    import ml_dtypes

    op = mpicoll.Op(np.add, commutative=True, identity=0)
    assert resolve_op(op, np.dtype("f4")) is op and op.name == "add" and not op.builtin
    assert resolve_op("sum", np.dtype("f4")).builtin
    assert resolve_op("avg", np.dtype(ml_dtypes.bfloat16)).average
    with pytest.raises(mpicoll.UnsupportedDtypeError):
        resolve_op("band", np.dtype(ml_dtypes.bfloat16))
    with pytest.raises(mpicoll.InvalidArgumentError, match="fn must be callable"):
        mpicoll.Op(3)
    assert dtype_from_code(dtype_code(np.dtype(ml_dtypes.bfloat16))) == np.dtype(ml_dtypes.bfloat16)


def test_readme_lists_every_algorithm_with_its_cost():
    import pathlib

    readme = (pathlib.Path(__file__).parent.parent / "README.md").read_text()
    for collective, algos in REGISTRY.items():
        for algo in algos.values():
            row = f"| {collective} | `{algo.name}` | `{algo.cost}` |"
            assert row in readme, f"README.md lacks the row {row}"


def test_every_algorithm_has_a_model_formula():
    from mpicoll import model

    for collective, algos in REGISTRY.items():
        for name in [*algos, "native"]:
            assert model.formula(collective, name)
            for p in (1, 2, 3, 4, 5, 8, 17, 64):
                for nbytes in (0, 8, 4096, 1 << 20):
                    t = model.predict(collective, name, nbytes, p)
                    assert t >= 0 and math.isfinite(t), (collective, name, p, nbytes)
        assert all(model.native_stand_in(collective, n, p) in algos
                   for n in (0, 8, 1 << 20) for p in (2, 3, 8, 16))


def test_model_formulas_read_like_the_docstrings():
    from mpicoll import model

    assert model.python_expression("ceil(lg p)*(alpha + n*beta)") == "_ceil_log(p, 2)*(alpha + n*beta)"
    assert model.python_expression("(lg p2 + 2*[p != p2])*alpha") == "(_lg(p2) + 2*(p != p2))*alpha"
    params = model.Params(alpha=1.0, beta=0.0, gamma=0.0)
    # steps only: ring all_reduce 2(p-1), recursive doubling lg p2 (+2 folded), knomial k=4
    assert model.predict("all_reduce", "ring", 64, 5, params) == 8
    assert model.predict("all_reduce", "recursive_doubling", 64, 5, params) == 4
    assert model.predict("broadcast", "knomial", 64, 16, params) == 2 * 3
    assert model.predict("broadcast", "knomial", 64, 16, params, radix=2) == 4
    # a pipeline's segments count: 4 MiB in 64 KiB segments at 3 ranks: (2 + 63) steps
    assert model.predict("broadcast", "pipelined_chain", 1 << 22, 3, params) == 65


def test_tuning_table_ranges_and_nearest_ranks():
    from mpicoll import tuning

    ranges = tuning.ranges_from_winners([(8, "native"), (64, "native"), (4096, "ring"),
                                         (1 << 20, "ring"), (1 << 24, "rabenseifner")])
    assert ranges == [{"below": 4096, "algorithm": "native"},
                      {"below": 1 << 24, "algorithm": "ring"},
                      {"below": None, "algorithm": "rabenseifner"}]
    table = tuning.TuningTable()
    table.set("all_reduce", 4, ranges)
    assert table.pick("all_reduce", 4, 100) == "native"
    assert table.pick("all_reduce", 6, 1 << 21) == "ring"  # 6 ranks: the 4-rank table
    assert table.pick("all_reduce", 2, 100) is None         # nothing at or below 2 ranks
    assert table.pick("broadcast", 4, 100) is None
    # its exports to MPICH and Open MPI: tests/test_tuning_export.py
    with pytest.raises(ValueError):
        tuning.TuningTable({"tables": {}})


def test_selection_prefers_tuning_then_model_then_mpich(tmp_path, monkeypatch):
    from mpicoll import model, tuning

    table = tuning.TuningTable()
    table.set("all_reduce", 2, [{"below": None, "algorithm": "ring"}])
    table.save(tmp_path / "t.json")
    model.save_params(model.Params(alpha=1e-3, beta=1e-12, gamma=1e-12), tmp_path / "m.json")
    op = resolve_op("sum", np.dtype("f4"))
    noncommutative = mpicoll.Op(np.subtract, commutative=False)
    monkeypatch.setenv("MPICOLL_TUNING", str(tmp_path / "t.json"))
    monkeypatch.setenv("MPICOLL_MODEL", str(tmp_path / "m.json"))
    selection.reload()
    try:
        assert selection.select("all_reduce", 64, 2, op, True) == "ring"
        # ring refuses a non-commutative op: the model picks among those that keep order;
        # with alpha dominant, the fewest steps
        assert selection.select("all_reduce", 64, 2, noncommutative, False) in (
            "recursive_doubling", "allgather_reduce", "reduce_broadcast")
        monkeypatch.setenv("MPICOLL_MODEL", str(tmp_path / "none.json"))
        selection.reload()
        assert selection.select("broadcast", 64, 2, None, True) == "native"  # MPICH's rules
    finally:
        selection.reload()


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "all_to_all", "barrier",
                                        "reduce", "gather", "all_gather"])
def test_a_fitted_model_keeps_small_calls_on_the_librarys_own(collective):
    """The model prices native as the algorithm MPI runs for it, which is also ours: of
    the two, the library's (its C, without our per-step Python). Before, a fitted model
    made auto run our copy (recursive doubling, linear, dissemination) at 8 B, 1.4-1.9x
    slower than native."""
    from mpicoll import model

    tables = selection.Tables(params=model.Params(alpha=20e-6, beta=1e-9, gamma=1e-10))
    for p in (2, 4, 8):
        assert selection.select(collective, 8, p, None, True, tables=tables) == "native"
    assert selection.select(collective, 8, 4, None, False, tables=tables) != "native"


def test_the_model_picks_by_the_number_of_nodes():
    """With a slow network between nodes, the model's auto takes the node-aware
    algorithm only where there are several nodes (the tables give their number)."""
    from mpicoll import model

    params = model.Params(alpha=50e-6, beta=1 / 1e9, gamma=1 / 1e10, alpha_intra=0.5e-6,
                          beta_intra=1 / 2e10)
    tables = selection.Tables(tuning=None, params=params)
    op = resolve_op("sum", np.dtype("f4"))
    candidates = [n for n in mpicoll.algorithms("all_reduce") if n != "native"]
    on_one = model.best("all_reduce", 8, 64, params, candidates, nodes=1)
    on_two = model.best("all_reduce", 8, 64, params, candidates, nodes=2)
    assert on_two == "hierarchical" != on_one  # one node: every message on the fast link
    assert selection.select("all_reduce", 8, 64, op, False, tables=tables, nodes=2) == on_two
    assert selection.select("all_reduce", 8, 64, op, False, tables=tables) == on_one


def test_no_mpi_library_says_what_to_install():
    """Without the mpich extra and no system MPI, making a Communicator names what to install
    (here: mpi4py pointed at a library that is not there)."""
    import subprocess
    import sys

    code = ("import mpicoll\n"
            "try:\n    mpicoll.Communicator()\n"
            "except mpicoll.InvalidArgumentError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MPI4PY_LIBMPI": "/nonexistent/libmpi.so.12"})
    assert "cannot load an MPI library" in done.stdout and "mpicoll[mpich]" in done.stdout, \
        done.stdout + done.stderr


@pytest.mark.parametrize("cls", [MPIBackend, NCCLBackend, LocalBackend], ids=lambda c: c.name)
def test_each_backend_class_declares_every_capability(cls):
    """What the pipeline reads of a backend is declared by each library's class itself
    (no capability inherited by accident), and the base documents each one."""
    documented = Backend.__doc__.split("Capabilities")[1]
    for name in CAPABILITIES:
        assert f"\n        {name}: " in documented, f"Backend's docstring lacks {name}"
        assert name in vars(cls), f"{cls.__name__} does not declare {name}"
    assert cls.name in BACKENDS and issubclass(cls, Backend)
    assert cls.device_only is (cls is NCCLBackend)  # only NCCL refuses host arrays
    assert cls.ranks_are_threads is (cls is LocalBackend)
    assert cls.has_native is (cls is not LocalBackend)


def test_the_local_backend_is_a_local_backend_object():
    world = LocalWorld(1)
    comm = mpicoll.Communicator(world.endpoint(0), backend="local")
    try:
        assert type(comm._backend) is LocalBackend and comm.backend == "local"
        assert comm._backend.like is None and comm._backend.averages_itself == frozenset()
    finally:
        comm.free()


def test_a_collectives_signature_is_the_one_its_caller_writes():
    """``help(comm.all_reduce)`` shows no hidden ``call`` and shows the entry's keywords;
    a plan's ``_init`` shows the same parameters, no ``async_op``, and returns a Plan."""
    import inspect

    for name in (*mpicoll.COLLECTIVES, "all_gather_v", "gather_v", "scatter_v",
                 "all_to_all_v"):
        defined = inspect.signature(getattr(mpicoll.Communicator, name).__wrapped__)
        shown = inspect.signature(getattr(mpicoll.Communicator, name))
        init = inspect.signature(getattr(mpicoll.Communicator, f"{name}_init"))
        written = [p for p in defined.parameters.values() if p.name != "call"]
        entry = {"stream": None, "async_op": False}
        assert [p for p in shown.parameters.values() if p.name not in entry] == written, name
        assert [p for p in init.parameters.values() if p.name != "stream"] == written, name
        for keyword, default in entry.items():
            parameter = shown.parameters[keyword]
            assert parameter.kind is parameter.KEYWORD_ONLY and parameter.default is default
        assert "async_op" not in init.parameters and init.return_annotation == "Plan", name
        shown.bind_partial(None, *(["x"] if "x" in shown.parameters else []), stream=None,
                           async_op=True, algorithm="ring")  # a call a user writes binds


def test_a_phased_algorithms_cost_line_is_the_sum_of_its_default_phases():
    """hierarchical's cost line (README, docstring) is what the model's sum of its phases
    gives for the defaults; intra=/inter= change the prediction by the phase's own."""
    from mpicoll import model

    params = model.Params(alpha=2e-6, beta=1 / 1.2e9, gamma=1 / 5e9, alpha_intra=0.5e-6,
                          beta_intra=1 / 12e9)
    phased = [(c, name) for c, algos in REGISTRY.items() for name, a in algos.items()
              if a.steps]
    assert {c for c, _ in phased} == {"all_reduce", "all_gather", "reduce_scatter",
                                      "broadcast", "reduce", "barrier"}
    for collective, name in phased:
        defaults = model.option_defaults(collective, name)
        for p, nodes in ((16, 2), (512, 64), (8, 1), (12, 3), (4, 4), (5, 2), (7, (3, 3, 1)),
                         (5, (2, 3))):
            for nbytes in (8, 1 << 20, 1 << 26):
                line = model._cost_line(collective, name, nbytes, p, params,
                                        model._layout(p, nodes), defaults)
                assert model.predict(collective, name, nbytes, p, params, nodes) == \
                    pytest.approx(line, rel=1e-9, abs=1e-15), (collective, name, p, nodes, nbytes)
    # 64 nodes x 8 ranks, 64 MiB: the leaders' all_reduce as recursive doubling, not ring
    n, p, nodes = 1 << 26, 512, 64
    ring = model.predict("all_reduce", "hierarchical", n, p, params, nodes)
    doubling = model.predict("all_reduce", "hierarchical", n, p, params, nodes,
                             inter="recursive_doubling")
    between = model.Params(params.alpha, params.beta, params.gamma)
    assert doubling - ring == pytest.approx(
        model.predict("all_reduce", "recursive_doubling", n, nodes, between)
        - model.predict("all_reduce", "ring", n, nodes, between))
    assert doubling > ring  # the bandwidth term: lg 64 whole messages against 2(N-1)/N
    # uneven nodes (3 + 3 + 1): one shard, so the whole vector crosses between nodes, and
    # each of a node's ring steps moves all of it (blocks n, 0, 0: priced as 3n in 3)
    uneven = model.predict("all_reduce", "hierarchical_sharded", n, 7, params, (3, 3, 1))
    node_link = model.Params(params.alpha_intra, params.beta_intra, params.gamma)
    assert uneven - model.predict("all_reduce", "ring", n, 3, between) == pytest.approx(
        model.predict("reduce_scatter", "ring", 3 * n, 3, node_link)
        + model.predict("all_gather", "ring", 3 * n, 3, node_link))
    # one node: the sharded sum is ring's line added up in another order; a tie of
    # rounding goes to the earlier candidate (ring), at every size and rank count
    fitted = model.Params(alpha=3.1e-6, beta=1 / 7.3e9, gamma=1 / 3.3e9)
    for ranks in (3, 5, 7, 12, 24):
        for nbytes in (8, 1 << 14, 1 << 16, 1 << 20, 3 << 20):
            assert model.best("all_reduce", nbytes, ranks, fitted,
                              ["ring", "hierarchical_sharded"], (ranks,)) == "ring"
    assert model._layout(7, 3) == (3, 3, 2) and model._layout(7, (3, 3, 1)) == (3, 3, 1)
    with pytest.raises(ValueError, match="no all_reduce algorithm 'nope'"):
        model.predict("all_reduce", "nope", n, p, params)
    with pytest.raises(ValueError, match="takes no option radix"):
        model.predict("all_reduce", "ring", n, p, params, radix=4)
    with pytest.raises(ValueError, match="no reduce_scatter algorithm 'linear'"):
        model.predict("all_reduce", "hierarchical_sharded", n, p, params, nodes, intra="linear")
    inside = model.Params(params.alpha_intra, params.beta_intra, params.gamma)
    linear = model.predict("all_reduce", "hierarchical", n, p, params, nodes, intra="linear")
    assert linear - ring == pytest.approx(
        model.predict("reduce", "linear", n, 8, inside) + model.predict(
            "broadcast", "linear", n, 8, inside)
        - model.predict("reduce", "binomial", n, 8, inside)
        - model.predict("broadcast", "binomial", n, 8, inside))


@pytest.mark.parametrize("seed", range(40))
def test_columns_pack_and_unpack_every_layout(seed):
    """The sharded algorithms' layout (``algorithms.columns``) on random nodes (consecutive,
    interleaved, uneven) and blocks (empty too): every rank's block packed once, shard by
    shard and node by node; a shard's parts are its holders' nodes'; a rank's holder is in
    its node; pack then unpack gives the input back, the one-copy transpose as the loop."""
    from mpicoll.algorithms.columns import Columns

    rng = np.random.default_rng(seed)
    p = int(rng.integers(1, 13))
    if seed % 3 == 0:  # consecutive equal nodes, equal blocks: the transpose
        q = int(rng.choice([d for d in range(1, p + 1) if p % d == 0]))
        nodes, counts = [r // q for r in range(p)], [int(rng.integers(0, 4))] * p
    else:
        nodes = [int(k) for k in rng.integers(0, int(rng.integers(1, p + 1)), p)]
        counts = [int(c) for c in rng.integers(0, 4, p)]
    bounds = tuple(int(b) for b in np.concatenate([[0], np.cumsum(counts)]))
    src = np.arange(bounds[-1], dtype=np.int64)
    packings = set()
    for rank in range(p):
        mine = tuple(r for r in range(p) if nodes[r] == nodes[rank])
        grid = Columns(tuple(nodes), mine, rank, bounds)
        assert grid.transposed is not None or seed % 3  # (a random layout may be one too)
        assert sorted(grid.order) == list(range(p))
        # shard by shard (a rank's place in its node mod s), node by node within a shard
        members = [[r for r in range(p) if nodes[r] == k] for k in dict.fromkeys(nodes)]
        s = min(map(len, members))
        assert list(grid.order) == [r for j in range(s) for group in members
                                    for r in group if group.index(r) % s == j]
        assert grid.holder in mine and grid.holds == (grid.holder == rank)
        assert grid.carried[0] == grid.holder and (rank in grid.carried)
        assert [nodes[h] for h in grid.holders] == list(dict.fromkeys(nodes))
        assert grid.holders[grid.node] == grid.holder
        assert grid.node_bounds == grid.shard_bounds + (bounds[-1],) * (len(mine) - s)
        j = grid.column
        shard = grid.shard_bounds[j + 1] - grid.shard_bounds[j]
        assert grid.part_bounds[-1] == shard
        mine_part = grid.part_bounds[grid.node + 1] - grid.part_bounds[grid.node]
        assert mine_part == sum(counts[r] for r in grid.carried)
        packed = np.empty_like(src)
        grid.pack(src, packed)
        want = np.concatenate([src[bounds[r]:bounds[r + 1]] for r in grid.order] or [src[:0]])
        np.testing.assert_array_equal(packed, want)
        back = np.full_like(src, -1)
        grid.unpack(packed, back)
        np.testing.assert_array_equal(back, src)
        packings.add(packed.tobytes())
    assert len(packings) == 1  # every rank packs alike


def test_same_memory_is_the_same_bytes_exactly():
    """In place is the same start and size: overlapping views of one size that start
    apart are not (the quick answer from the bounds must not say so); a view of the same
    bytes through another shape or dtype is."""
    from mpicoll.buffers.arrays import same_memory

    buf = np.arange(16, dtype=np.float32)
    assert same_memory(buf[2:6], buf[2:6])
    assert same_memory(buf[2:6], buf[2:6].view(np.int32).reshape(2, 2))
    assert not same_memory(buf[2:6], buf[3:7])  # overlapping, one element apart
    assert not same_memory(buf[2:6], buf[2:7])  # same start, another size
    assert not same_memory(buf[2:6], buf.copy()[2:6])
    assert same_memory(buf[4:4], buf[4:4])
    rows = buf.reshape(4, 4)
    assert same_memory(rows[1], buf[4:8]) and not same_memory(rows[1], rows[:, 1])


@pytest.mark.parametrize("timeout", [0.0, 30.0])
def test_a_library_error_making_a_communicator_is_named_not_raw(timeout):
    """MPI failing as a Communicator is made (MPI_Comm_split_type once the job ran out of
    communicators: dup()s never freed): a CollectiveError naming the rank, the step and
    the likely cause, never mpi4py's raw Exception; mpicoll's own errors go as they are."""
    import sys

    from mpi4py import MPI

    from mpicoll.observe.watchdog import making

    with pytest.raises(mpicoll.CollectiveError, match="making a Communicator failed on rank "
                       "3: Exception: Other MPI error.*free\\(\\) the Communicators"):
        with making(3, 4, "mpi", timeout, sys._getframe()):
            raise MPI.Exception(MPI.ERR_OTHER)
    # (a failure that is not MPI's: named, without the hint of MPI's)
    with pytest.raises(mpicoll.CollectiveError, match="3: NameError: name 'x' is not "
                       "defined$"):
        with making(3, 4, "mpi", timeout, sys._getframe()):
            raise NameError("name 'x' is not defined")
    with pytest.raises(mpicoll.ConfigError):
        with making(3, 4, "mpi", timeout, sys._getframe()):
            raise mpicoll.ConfigError("its own")


def test_a_cut_short_receive_names_its_sender_where_mpi_left_the_status_empty():
    """MPI need not fill in a receive's status when it fails (MPI_ERR_TRUNCATE): the
    error then names the sender and tag the receive asked for (not ANY), else "the
    sender"; a status MPI filled in wins."""
    from mpi4py import MPI

    from mpicoll.transport.mpi import _cut_short

    truncated, buf = MPI.Exception(MPI.ERR_TRUNCATE), np.zeros(2)
    empty = MPI.Status()
    assert "from rank 0 (tag 3) is longer than the 16 bytes" in str(
        _cut_short(truncated, buf, empty, 0, 3))
    assert "from the sender is longer than the 16 bytes" in str(
        _cut_short(truncated, buf, empty, -1, -1))
    filled = MPI.Status()
    filled.Set_source(2)
    filled.Set_tag(7)
    assert "from rank 2 (tag 7)" in str(_cut_short(truncated, buf, filled, -1, -1))
    other = MPI.Exception(MPI.ERR_OTHER)
    assert _cut_short(other, buf, empty, 0, 3) is other


def test_a_receive_longer_than_its_buffer_mpi_did_not_report_is_said_so():
    """MPICH's receive from ANY_SOURCE now and then completes a message longer than its
    buffer with no MPI_ERR_TRUNCATE, its status holding the whole length: the status
    tells it, and the request's wait (every wait) and test raise mpicoll's error, as for
    one MPI reported; a status within the buffer is a receive as any."""
    from mpi4py import MPI

    from mpicoll.transport.mpi import PeerRequest, _check_length

    def status_of(nbytes: int) -> MPI.Status:
        status = MPI.Status()
        status.Set_source(0)
        status.Set_tag(4)
        status.Set_elements(MPI.BYTE, nbytes)
        return status

    buf = np.zeros(2)
    with pytest.raises(mpicoll.CollectiveError, match=r"from rank 0 \(tag 4\) is longer than "
                                                      "the 16 bytes"):
        _check_length(buf, status_of(32), -1, -1)
    _check_length(buf, status_of(16), -1, -1)
    _check_length(buf, status_of(8), -1, -1)

    class Completed:  # an MPI request that completes with the status given
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

        def _fill(self, status: MPI.Status) -> None:
            status.Set_source(0)
            status.Set_tag(4)
            status.Set_elements(MPI.BYTE, self.nbytes)

        def Wait(self, status: MPI.Status) -> None:  # noqa: N802 - mpi4py's names
            self._fill(status)

        def Test(self, status: MPI.Status) -> bool:  # noqa: N802
            self._fill(status)
            return True

    for finish in ("wait", "test"):
        request = PeerRequest(Completed(32), buf, source=-1, tag=-1, receive=True)
        for _ in range(2):
            with pytest.raises(mpicoll.CollectiveError, match="is longer than the 16 bytes"):
                getattr(request, finish)()
            finish = "wait"  # (the error again at the next wait)
    assert PeerRequest(Completed(16), buf, receive=True).wait().nbytes == 16
    sent = PeerRequest(Completed(32), buf)  # (a send's request: its status says nothing)
    assert sent.test()


def test_ranks_per_node_that_differs_names_each_value_and_its_ranks():
    from mpicoll.pipeline import agree

    def blocks(k: int, job_rank: int) -> int:
        return (agree._BY_BLOCKS << agree._SOURCE_SHIFT) | (k << agree._K_SHIFT) | (job_rank // k)

    keys = np.array([blocks(2, 0), blocks(2, 1), blocks(3, 2), 0], np.int64)
    with pytest.raises(mpicoll.ConfigError, match=r"it is 2 on rank\(s\) 0-1; 3 on rank\(s\) 2; "
                                                  r"unset on rank\(s\) 3"):
        agree.node_indices(keys)
    assert agree.node_indices(np.array([blocks(2, r) for r in range(5)], np.int64)) == \
        (0, 0, 1, 1, 2)


def test_ranks_per_node_over_two_merged_worlds_blocks_the_communicators_ranks():
    """A Communicator over a spawned world merged with its parent has two of each job
    rank: blocks of the job's ranks would put both worlds' rank 0 on one node."""
    from mpicoll.pipeline import agree

    def blocks(k: int, job_rank: int) -> int:
        return (agree._BY_BLOCKS << agree._SOURCE_SHIFT) | (k << agree._K_SHIFT) | (job_rank // k)

    job_ranks = np.array([0, 1, 0, 1], np.int64)  # parent's 0, 1; then the child's 0, 1
    for k, nodes in ((1, (0, 1, 2, 3)), (2, (0, 0, 1, 1)), (3, (0, 0, 0, 1))):
        keys = np.array([blocks(k, r) for r in job_ranks.tolist()], np.int64)
        assert agree.node_indices(keys, None, job_ranks) == nodes
    # one world: the job's ranks, whatever the Communicator's order (a new_group's)
    keys = np.array([blocks(2, r) for r in (3, 0, 1, 2)], np.int64)
    assert agree.node_indices(keys, None, np.array([3, 0, 1, 2], np.int64)) == (0, 1, 1, 0)


def test_no_home_folder_means_no_tuning_or_model_file(monkeypatch):
    """A user with no home (no passwd entry, no HOME) reads no file of its own, never a
    raw RuntimeError (on rank 0 it left the others waiting)."""
    from pathlib import Path

    from mpicoll import config, selection

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    for name in ("XDG_CONFIG_HOME", "MPICOLL_TUNING", "MPICOLL_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    path = config.config_file("MPICOLL_TUNING", "tuning.json")
    assert config.read_config(path) is None
    assert selection.read_texts() is not None  # (every file missing: nothing raised)


@pytest.mark.parametrize("collective", ["broadcast", "scatter", "gather", "reduce"])
def test_a_knomial_tree_of_fewer_ranks_than_its_radix_is_priced_by_its_messages(collective):
    """At p <= k a k-nomial tree is the root's p-1 messages, not k-1 (at 2 ranks, radix
    4: one message, as binomial's; it was priced at three)."""
    from mpicoll import model

    params = model.Params(alpha=5e-6, beta=1e-9, gamma=1e-10)
    assert model.predict(collective, "knomial", 1024, 2, params) == pytest.approx(
        model.predict(collective, "binomial", 1024, 2, params))
    # (at 3 ranks, radix 8: the root's two messages, as the linear algorithm's)
    assert model.predict(collective, "knomial", 1024, 3, params, radix=8) == pytest.approx(
        model.predict(collective, "linear", 1024, 3, params))
