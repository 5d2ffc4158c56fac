"""Refusals on the local transport: clear errors, raised before any message, on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll.transport.local import LocalWorld, run_local


def _raises_everywhere(size, body, exc, match):
    """Every rank raises ``exc``; the errors are collected instead of aborting the world."""

    def wrapped(comm):
        with pytest.raises(exc, match=match):
            body(comm)
        return True

    assert run_local(size, wrapped, timeout=5) == [True] * size


def test_unknown_algorithm_names_the_valid_ones():
    _raises_everywhere(3, lambda c: c.all_gather(np.ones(2), algorithm="bruck"),
                       mpicoll.InvalidArgumentError, "expected 'auto' or one of ring, recursive_doubling")


def test_native_is_not_on_the_local_backend():
    _raises_everywhere(2, lambda c: c.barrier(algorithm="native"),
                       mpicoll.InvalidArgumentError, "'native' needs a library collective")


def test_input_must_be_an_array():
    _raises_everywhere(2, lambda c: c.all_reduce([1, 2, 3]), mpicoll.InvalidArgumentError,
                       "x: expected a NumPy array, got list")
    _raises_everywhere(2, lambda c: c.all_gather(np.array([object()])), TypeError, "Python objects")


def test_out_must_fit():
    _raises_everywhere(2, lambda c: c.all_reduce(np.ones(3), out=np.ones(4)),
                       mpicoll.InvalidArgumentError, r"out: expected shape \(3,\)")
    _raises_everywhere(2, lambda c: c.all_reduce(np.ones(4), out=np.ones(8)[::2]),
                       mpicoll.InvalidArgumentError, "out: must be a writeable C-contiguous")


def test_scatter_without_rows_at_the_root():
    def body(comm):
        x = np.ones(3) if comm.rank == 1 else None
        exc = mpicoll.InvalidArgumentError if comm.rank == 1 else mpicoll.RemoteError
        with pytest.raises(exc, match="one row per rank|root 1 refused"):
            comm.scatter(x, root=1)
        return comm.all_reduce(np.ones(1))  # still usable

    for got in run_local(4, body, timeout=5):
        np.testing.assert_array_equal(got, [4])


def test_check_mode_finds_a_shape_mismatch():
    def body(comm):
        x = np.ones(3 if comm.rank != 2 else 4)
        with pytest.raises(mpicoll.MismatchError, match="rank 2 differs in shape"):
            comm.all_reduce(x)
        return True

    assert run_local(4, body, timeout=5, check=True) == [True] * 4


def test_backend_and_comm_are_checked():
    with pytest.raises(mpicoll.InvalidArgumentError, match="backend: unknown"):
        mpicoll.Communicator(None, backend="gloo")
    with pytest.raises(mpicoll.InvalidArgumentError, match="comm: backend 'local'"):
        mpicoll.Communicator(None, backend="local")
    world = LocalWorld(1)
    assert mpicoll.Communicator(world.endpoint(0), backend="local").size == 1
