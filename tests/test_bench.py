"""The benchmark CLI, the cost model and tuning: run in-process on every rank under mpiexec.

``mpicoll.bench.main`` runs on COMM_WORLD like ``python -m mpicoll.bench``; the suite runs
this module at 1 rank and under mpiexec at 2, 3, 4, 5 and 8.
"""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile

import numpy as np
import pytest

import mpicoll
from mpicoll import selection, tuning
from mpicoll.algorithms import REGISTRY, register
from mpicoll.bench import RECORDS, main

pytestmark = pytest.mark.mpi

SMALL = ["-b", "8", "-e", "4K", "-f", "64", "-n", "2", "-w", "1"]


@pytest.fixture
def shared_dir():
    """A temporary folder with the same path on every rank (made by rank 0)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    path = tempfile.mkdtemp(prefix="mpicoll-bench-") if comm.rank == 0 else None
    path = comm.bcast(path, root=0)
    yield path
    comm.Barrier()


def test_sweep_writes_json_and_csv_with_nccl_tests_busbw(world, shared_dir):
    out_json, out_csv = os.path.join(shared_dir, "r.json"), os.path.join(shared_dir, "r.csv")
    assert main(["all", *SMALL, "--json", out_json, "--csv", out_csv]) == 0
    world.barrier()
    data = json.load(open(out_json))
    head, rows = data["header"], data["rows"]
    assert head["ranks"] == world.size and head["timing"] == "barrier"
    for key in ("mpicoll", "mpi_library", "mpi4py", "numpy", "hosts", "dtype", "iterations"):
        assert key in head
    assert {r["collective"] for r in rows} == set(RECORDS)
    for r in rows:
        assert r["wrong"] == 0, r
        assert r["min_us"] <= r["time_us"] <= r["max_us"] and r["p99_us"] <= r["max_us"] + 1e-9
        if r["algbw"]:
            factor = RECORDS[r["collective"]].busbw_factor(world.size)
            assert math.isclose(r["busbw"], r["algbw"] * factor, rel_tol=1e-9)
        assert r["predicted_us"] >= 0
    algos = {r["algorithm"] for r in rows if r["collective"] == "all_reduce"}
    assert algos == {"mpi_library", "auto", *mpicoll.algorithms("all_reduce")}
    with open(out_csv) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert {"size", "algorithm", "time_us", "p99_us", "busbw", "predicted_us",
            "measured_over_predicted", "vs_native"} <= set(table[0])


def test_busbw_factors_are_nccl_tests():
    p = 4
    expected = {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p,
                "reduce_scatter": (p - 1) / p, "all_to_all": (p - 1) / p,
                "broadcast": 1.0, "reduce": 1.0}
    for collective, factor in expected.items():
        assert RECORDS[collective].busbw_factor(p) == factor


@pytest.fixture
def broken_all_reduce():
    """A registered all_reduce that is wrong on rank 0, removed afterwards."""

    @register("all_reduce", "broken_for_test")
    def broken(t, src, dst, op):
        """Ring, then rank 0 spoils its first element.

        Cost: 2*(p-1)*alpha
        """
        REGISTRY["all_reduce"]["ring"].fn(t, src, dst, op)
        if t.rank == 0 and dst.size:
            dst[0] += 1

    yield "broken_for_test"
    del REGISTRY["all_reduce"]["broken_for_test"]


def test_check_catches_a_wrong_result(world, shared_dir, broken_all_reduce):
    out_json = os.path.join(shared_dir, "wrong.json")
    status = main(["all_reduce", *SMALL, "--algo", f"ring,{broken_all_reduce}",
                   "--json", out_json])
    assert status == 1
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    assert all(r["wrong"] > 0 for r in rows if r["algorithm"] == broken_all_reduce and r["count"])
    assert all(r["wrong"] == 0 for r in rows if r["algorithm"] == "ring")
    # with -c 0 nothing is checked, and the run passes
    assert main(["all_reduce", *SMALL, "-c", "0", "--algo", broken_all_reduce]) == 0


def test_min_busbw_and_back_to_back_and_inplace(world):
    assert main(["all_reduce", *SMALL, "--algo", "ring", "--min-busbw", "1e9"]) == 1
    assert main(["all_gather", *SMALL, "--algo", "ring,auto", "--timing", "back-to-back",
                 "--inplace"]) == 0
    assert main(["all_reduce", *SMALL, "--algo", "recursive_doubling", "--inplace",
                 "-d", "bfloat16"]) == 0


def test_plots_are_png(world, shared_dir):
    pytest.importorskip("matplotlib")
    path = os.path.join(shared_dir, "busbw.png")
    assert main(["all_reduce", *SMALL, "--algo", "ring,recursive_doubling", "--plot", path]) == 0
    world.barrier()
    for png in (path, os.path.join(shared_dir, "busbw-model.png")):
        with open(png, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(png) > 5000


def test_tune_round_trips_and_changes_auto(world, shared_dir, monkeypatch):
    path = os.path.join(shared_dir, "tuning.json")
    assert main(["tune", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-w", "1",
                 "--collectives", "all_reduce,broadcast", "--output", path]) == 0
    world.barrier()
    table = tuning.TuningTable.load(path)
    ranges = table.ranges("all_reduce", world.size)
    assert ranges and ranges[-1]["below"] is None
    assert all(r["algorithm"] in mpicoll.algorithms("all_reduce") for r in ranges)
    assert json.load(open(os.path.join(shared_dir, "tuning-mpich.json")))
    assert open(os.path.join(shared_dir, "tuning-ompi.rules")).read().startswith("2")
    # auto follows the file: a table that says allgather_reduce for every size
    forced = tuning.TuningTable()
    forced.set("all_reduce", 1, [{"below": None, "algorithm": "allgather_reduce"}])
    forced_path = os.path.join(shared_dir, "forced.json")
    if world.rank == 0:
        forced.save(forced_path)
    world.barrier()
    monkeypatch.setenv("MPICOLL_TUNING", forced_path)
    selection.reload()
    try:
        comm = mpicoll.Communicator()
        assert comm.auto_algorithm("all_reduce", 1 << 20, "sum", "f4") == "allgather_reduce"
        x = np.full(5, world.rank + 1.0)  # and auto runs it, correctly
        np.testing.assert_array_equal(comm.all_reduce(x), np.full(5, sum(range(1, world.size + 1))))
    finally:
        selection.reload()  # read again lazily, after monkeypatch restores the variable
