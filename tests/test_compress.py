"""Compressed all_reduce (``compress="bf16"|"fp16"``) under mpiexec: every algorithm,
16-bit values on the wire (half of float32's bytes, a quarter of float64's, counted at
the transport), accumulation in the input's precision, and the error within the wire
format's rounding; refusals on every rank; the default call's kept decision compresses
too."""

from __future__ import annotations

import numpy as np
import pytest
from test_mpi_decided import recorded

import mpicoll
from mpicoll.algorithms import REGISTRY

UNIT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}  # the wire format's unit roundoff


def _x(world, dtype, step=0):
    rng = np.random.default_rng(1000 * step + world.rank)
    return (rng.random(1001) + 0.5).astype(dtype)  # positive: no cancellation


@pytest.mark.parametrize("compress", ["bf16", "fp16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algorithm", [*REGISTRY["all_reduce"], "auto"])
@pytest.mark.mpi
def test_every_algorithm_compresses_within_the_wire_rounding(world, algorithm, dtype, compress):
    p = world.size
    for step in range(3):  # the whole path, then the kept decision
        x = _x(world, dtype, step)
        exact = world.all_reduce(x.astype(np.float64), algorithm="native")
        with recorded(world) as plain:
            world.all_reduce(x, algorithm=algorithm if algorithm != "auto" else "ring")
        with recorded(world) as log:
            got = world.all_reduce(x, compress=compress, algorithm=algorithm)
        assert got.dtype == dtype and got.shape == x.shape
        assert np.array_equal(x, _x(world, dtype, step))  # the input is left as it was
        if not (algorithm in ("swing_latency", "bine_latency") and p >= 8):  # (README)
            rows = world.all_gather(got, algorithm="ring")
            assert (rows == rows[0]).all(), "every rank holds the same bits"
        error = np.max(np.abs(got - exact) / exact)
        # each value is rounded once per hop it travels: at most 2p hops in any algorithm
        assert error <= 2 * p * UNIT[compress], error
        if p > 1:
            assert error > 1e-5  # it did travel as 16-bit values (float32 rounds at 6e-8)
        if algorithm != "auto":
            with recorded(world) as told:  # every rank's wire told first: an empty call's
                # messages are that alone (agree.told_wire)
                world.all_reduce(np.zeros(0, dtype), compress=compress, algorithm=algorithm)
            sent, plain_sent, told_sent = (
                sum(m[1] for m in messages if m[0] in ("send", "isend", "sendrecv"))
                for messages in (log, plain, told))
            assert p == 1 or told_sent > 0
            assert (sent - told_sent) * np.dtype(dtype).itemsize == plain_sent * 2


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", [">f4", ">f8"])
def test_a_big_endian_x_compresses_as_its_native_twin(world, dtype):
    """x of the other byte order (all-reduced as it is without compress=): refused as
    "not float32" with it; now compressed, the result of x's own dtype."""
    x = _x(world, np.dtype(dtype).newbyteorder("="))
    exact = world.all_reduce(x.astype(np.float64), algorithm="native")
    got = world.all_reduce(x.astype(dtype), compress="bf16", algorithm="ring")
    assert got.dtype == np.dtype(dtype)
    assert np.max(np.abs(got - exact) / exact) <= 2 * world.size * UNIT["bf16"]


@pytest.mark.mpi
def test_compressed_in_place_and_avg(world):
    x = _x(world, np.float32)
    want = world.all_reduce(x.astype(np.float64), "avg")
    got = world.all_reduce(x, "avg", out=x, compress="fp16", algorithm="ring")
    assert got is x
    np.testing.assert_allclose(x, want, rtol=2 * world.size * UNIT["fp16"])


@pytest.mark.mpi
@pytest.mark.parametrize(("x", "kwargs", "text"), [
    (np.ones(4, np.int32), {"compress": "bf16"}, "float32 or float64"),
    (np.ones(4, np.float32), {"compress": "int8"}, "expected one of"),
    (np.ones(4, np.float32), {"compress": ["bf16"]}, "expected one of"),  # (unhashable)
    (np.ones(4, np.float32), {"compress": "bf16", "algorithm": "native"}, "native"),
    # (a value too small for the wire would travel as zero: false, where it is true)
    (np.full(4, 1e-8, np.float32), {"op": "land", "compress": "fp16"}, "tells zero from"),
    (np.full(4, 1e-300), {"op": "lor", "compress": "bf16"}, "tells zero from"),
])
def test_refusals_on_every_rank_then_the_next_call(world, x, kwargs, text):
    with pytest.raises(mpicoll.InvalidArgumentError, match=text):
        world.all_reduce(x, **kwargs)
    np.testing.assert_array_equal(world.all_reduce(np.ones(3)), np.full(3, world.size))


@pytest.mark.mpi
@pytest.mark.parametrize(("kwargs", "text"), [
    ({"compress": "zz"}, "expected one of"),
    ({"compress": "bf16", "algorithm": "native"}, "native"),
    ({"compress": "fp16", "op": "land"}, "tells zero from"),
])
def test_a_plan_refuses_compress_at_init_on_every_rank(world, kwargs, text):
    """compress= is checked when the plan is made, as a call's (refused on the last
    rank alone here: there its error, elsewhere a RemoteError), never at a first start
    the others wait in; the next calls are right."""
    last = world.rank == world.size - 1
    given = kwargs if last else {k: v for k, v in kwargs.items() if k != "compress"}
    with pytest.raises(mpicoll.InvalidArgumentError if last else mpicoll.RemoteError,
                       match=text if last else "refused on rank"):
        world.all_reduce_init(np.ones(4, np.float32), **given)
    np.testing.assert_array_equal(world.all_reduce(np.ones(3)), np.full(3, world.size))


@pytest.mark.mpi
def test_a_plan_compresses_every_start(world):
    x = np.zeros(100, np.float32)
    with world.all_reduce_init(x, compress="bf16", algorithm="recursive_doubling") as plan:
        for step in range(3):
            x[...] = _x(world, np.float32, step)[:100]
            exact = world.all_reduce(x.astype(np.float64), algorithm="native")
            got = plan()
            assert np.max(np.abs(got - exact) / exact) <= 2 * world.size * UNIT["bf16"]


@pytest.mark.mpi
@pytest.mark.parametrize("form", ["call", "plan"])
def test_check_mode_catches_ranks_compressing_differently(world, form):
    """A call where one rank compresses, a plan (when it is made) with bf16 on one rank
    and fp16 on the others: MismatchError on every rank, and the next one is right."""
    if world.size < 2:
        pytest.skip("needs two ranks")
    checked = mpicoll.Communicator(check=True)
    try:
        x = np.ones(8, np.float32)
        with pytest.raises(mpicoll.MismatchError):
            if form == "call":
                checked.all_reduce(x, compress="bf16" if world.rank == 0 else None,
                                   algorithm="ring")
            else:
                checked.all_reduce_init(x, compress="bf16" if world.rank == 0 else "fp16",
                                        algorithm="ring")
        if form == "call":
            got = checked.all_reduce(x, compress="fp16", algorithm="ring")
        else:
            with checked.all_reduce_init(x, compress="fp16", algorithm="ring") as plan:
                got = plan()
        np.testing.assert_array_equal(got, np.full(8, world.size))
    finally:
        checked.free()



@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
@pytest.mark.parametrize("size", [2, 3, 5, 6])
def test_every_rank_holds_the_same_bits_local(op, size):
    """A sender keeps what it sent (rounded as the wire carries it), so no rank ends
    with a block at full precision that the others hold rounded: one result, on every
    rank, every algorithm, for any number of ranks."""
    from mpicoll.local import run_local

    for algorithm in [*REGISTRY["all_reduce"], "auto"]:
        if algorithm in ("swing_latency", "bine_latency") and size >= 8:
            continue

        def body(comm, algorithm=algorithm):
            x = np.linspace(0.1, 1.0, 37) * (1.001 + comm.rank / 7)
            before = x.copy()
            got = comm.all_reduce(x, op, algorithm=algorithm, compress="bf16")
            assert np.array_equal(x, before)
            return got

        rows = run_local(size, body, timeout=20)
        assert all(np.array_equal(r, rows[0]) for r in rows), (algorithm, rows)


def test_check_mode_takes_a_numpy_str_as_the_name_it_is():
    from mpicoll.local import run_local

    def body(comm):
        name = np.str_("bf16") if comm.rank == 0 else "bf16"
        return comm.all_reduce(np.ones(2), compress=name).tolist()

    assert run_local(3, body, check=True) == [[3.0, 3.0]] * 3


@pytest.mark.parametrize("size", [2, 3, 4])
def test_fp16_out_of_range_on_one_rank_under_seterr_raise_local(size):
    """A value beyond float16's range on one rank (inf on the wire) and one below its
    normal range on another (a subnormal: the cast sets the underflow flag) with the
    caller's ``np.errstate(all="raise")``: every algorithm rounds as IEEE does, on
    every rank (no rank leaves the call alone, mid-call, the others waiting), every
    send path alike (isend's too)."""
    from mpicoll.local import run_local

    for algorithm in [*REGISTRY["all_reduce"], "auto"]:
        def body(comm, algorithm=algorithm):
            x = np.full(8, 0.5, np.float32)
            if comm.rank == 0:
                x[0] = 1e6
            if comm.rank == 1:
                x[1] = 1e-6
            with np.errstate(all="raise"):
                return comm.all_reduce(x, algorithm=algorithm, compress="fp16")

        rows = run_local(size, body, timeout=20)
        for got in rows:
            assert np.isinf(got[0]) and got[0] > 0, (algorithm, got)
            want = np.full(7, 0.5 * size)
            want[0] -= 0.5  # (rank 1's 1e-6 in place of its 0.5)
            np.testing.assert_allclose(got[1:], want, rtol=2 * size * 2 ** -11)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "auto"])
def test_another_wire_on_one_rank_raises_on_every_rank_then_the_next_call(world, algorithm):
    """bf16 on every rank but the last, fp16 there: both wires' messages are of one
    length, so only the wire told first (agree.told_wire) keeps the ranks from reading
    each other's bits as their own, silently. MismatchError on every rank, naming both,
    by the whole path, the kept decision and a plan; the next call is right."""
    if world.size < 2:
        pytest.skip("needs another rank")
    x = _x(world, np.float32)
    exact = world.all_reduce(x.astype(np.float64), algorithm="native")
    for _ in range(2):  # (the second call: the kept decision on the ranks that agree)
        world.all_reduce(x, compress="bf16", algorithm=algorithm)
    mine = "fp16" if world.rank == world.size - 1 else "bf16"
    for _ in range(2):
        with pytest.raises(mpicoll.MismatchError, match=f"rank {world.size - 1}: fp16"):
            world.all_reduce(x, compress=mine, algorithm=algorithm)
        got = world.all_reduce(x, compress="bf16", algorithm=algorithm)
        np.testing.assert_allclose(got, exact, rtol=2 * world.size * UNIT["bf16"])
    with world.all_reduce_init(x, compress=mine, algorithm=algorithm) as plan:
        with pytest.raises(mpicoll.MismatchError, match="other compress="):
            plan()
    np.testing.assert_array_equal(world.all_reduce(np.ones(3)), np.full(3, world.size))
