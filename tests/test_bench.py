"""The benchmark CLI, the cost model and tuning: run in-process on every rank under mpiexec.

``mpicoll.bench.main`` runs on COMM_WORLD like ``python -m mpicoll.bench``; the suite runs
this module at 1 rank and under mpiexec at 2, 3, 4 and 5.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest

import mpicoll
from mpicoll import selection, tuning
from mpicoll.algorithms import REGISTRY, register
from mpicoll.bench import RECORDS, main, parse_dtype, report

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
    if comm.rank == 0:
        shutil.rmtree(path)


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
        # nccl-tests' size is the whole buffer; its count each rank's part (each peer's)
        parts = world.size if r["collective"] in (
            "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all") else 1
        assert r["count"] * parts * 4 == r["size"], r
    algos = {r["algorithm"] for r in rows if r["collective"] == "all_reduce"}
    assert algos == {"mpi_library", "auto", *mpicoll.algorithms("all_reduce")}
    with open(out_csv) as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    assert {"size", "algorithm", "time_us", "p99_us", "busbw", "predicted_us",
            "measured_over_predicted", "vs_native", "mean_us"} <= set(table[0])
    # the run's metadata travels with every CSV row
    for row in table:
        assert int(row["ranks"]) == world.size and int(row["hosts"]) >= 1
        assert row["dtype"] == "float32" and row["op"] == "sum"
        assert row["mpi_library"] == head["mpi_library"] and row["mpicoll"] == head["mpicoll"]


@pytest.mark.parametrize("name,expected", [
    ("float", "float32"), ("half", "float16"), ("double", "float64"), ("int", "int32"),
    ("int8", "int8"), ("uint8", "uint8"), ("int64", "int64"), ("uint64", "uint64"),
    ("bfloat16", "bfloat16"), ("float64", "float64"), ("i2", "int16")])
def test_dtype_names_are_nccl_tests(name, expected):
    assert parse_dtype(name).name == expected


def test_float_means_float32_in_the_output(world, shared_dir):
    out_json = os.path.join(shared_dir, "float.json")
    assert main(["all_reduce", *SMALL, "--algo", "ring", "-d", "float", "--json", out_json]) == 0
    world.barrier()
    data = json.load(open(out_json))
    assert data["header"]["dtype"] == "float32"
    assert {r["type"] for r in data["rows"]} == {"float32"}


@pytest.mark.parametrize("flags,message", [
    (["--algo", "rnig"], "--algo: unknown algorithm rnig"),
    (["-e", "64X"], "'64X' is not a size"),
    (["-n", "0"], "-n 0: at least 1"),
    (["-o", "avg", "-d", "int32"], "-o avg:"),
    (["-b", "1K", "-e", "8"], "-b 1K is larger than -e 8"),
    (["-d", "floaty"], "'floaty' is not a dtype"),
    (["-f", "1"], "-f 1: the step factor must be a number above 1"),
    (["-f", "nan"], "-f nan: the step factor must be a number above 1"),
    (["-e", "inf"], "'inf' is not a size"),
    (["-b", "8", "-e", "9999999G"], "-e 9999999G: larger than this machine's memory"),
    (["-d", "int32", "--compress", "bf16"], "--compress bf16: compresses all_reduce"),
    (["--compress", "bf16", "-o", "land"], "--compress bf16: not with -o land"),
    (["--csv", "/proc/mpicoll-bench.csv"], "--csv /proc/mpicoll-bench.csv: cannot write"),
    (["--json", "/proc/no/such/x.json"], "--json /proc/no/such/x.json: cannot make the folder"),
    (["-c", "2"], "argument -c/--check"),
    (["-d", "U3"], "-d U3: a number type"),
    (["-d", "O"], "-d O: a number type"),
    (["--model", "/no/such/model.json"], "--model /no/such/model.json: no such file"),
    # (more sizes than the step factor's estimate, each step rounded down to whole bytes)
    (["-d", "int8", "-b", "100", "-e", "2095915", "-f", "1.01"],
     "-f 1.01: 1059 sizes from -b 100 to -e 2095915; at most 1000"),
    (["-b", "1", "-e", "1G", "-f", "1.0001"], "sizes from -b 1 to -e 1G; at most 1000"),
    (["--plot", "/tmp/mpicoll-bench-figure.xyz"], "matplotlib writes no .xyz file"),
    # flags overhead and tune would take and not use
    (["overhead", "--compress", "bf16"], "--compress: not with overhead"),
    (["overhead", "--inplace", "--plan"], "--inplace, --plan: not with overhead"),
    (["overhead", "-e", "1K"], "-e: not with overhead"),
    (["overhead", "--timing", "back-to-back"], "--timing: not with overhead"),
    (["tune", "-c", "0"], "-c 0: not with tune"),
    # a floor that passes or fails every run, or with nothing of mpicoll's to compare
    (["--min-busbw", "nan"], "--min-busbw: expected GB/s, a finite number >= 0"),
    (["--min-busbw", "-1"], "--min-busbw: expected GB/s, a finite number >= 0"),
    (["--min-busbw", "fast"], "--min-busbw: expected GB/s, a number"),
    (["--algo", "mpi_library", "--min-busbw", "1"], "--min-busbw: compares mpicoll's rows"),
])
def test_bad_flags_are_one_line_and_exit_2(world, capsys, flags, message):
    with pytest.raises(SystemExit) as stop:
        main(flags if flags[0] in ("overhead", "tune") else ["all_reduce", *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    if world.rank == 0:
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, err
    else:
        assert err == ""


def test_fastest_summary_includes_native_marked():
    def row(algorithm, size, time_us):
        return SimpleNamespace(collective="all_reduce", algorithm=algorithm, size=size,
                               time_us=time_us)

    rows = [row("mpi_library", 64, 1.0), row("native", 64, 2.0), row("ring", 64, 3.0),
            row("auto", 64, 0.5), row("native", 1 << 20, 9.0), row("ring", 1 << 20, 5.0)]
    (line,) = report.fastest_lines(rows)
    assert line.startswith("# fastest algorithm, all_reduce: native* below 1M, then ring")
    assert "*: the library's collective through mpicoll" in line


@pytest.mark.parametrize("layout", ["nccl", "osu"])
def test_nccl_and_osu_layouts(world, capsys, layout):
    assert main(["all_reduce", *SMALL, "--algo", "ring", "--format", layout]) == 0
    out = capsys.readouterr().out
    if world.rank == 0:
        if layout == "nccl":
            assert "out-of-place" in out and "in-place" in out
            assert out.count("# Avg bus bandwidth    : ") == 2  # mpi_library and ring
            rows = [line.split() for line in out.splitlines()
                    if line.strip() and not line.startswith("#")]
            assert rows and all(row[2] == "float" for row in rows)  # nccl-tests' type name
        else:
            assert "Avg Latency(us)" in out and "Min Latency(us)" in out


def test_busbw_factors_are_nccl_tests():
    p = 4
    expected = {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p,
                "reduce_scatter": (p - 1) / p, "all_to_all": (p - 1) / p,
                "broadcast": 1.0, "reduce": 1.0, "scan": 1.0, "exscan": 1.0}
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


@pytest.fixture
def lazy_algorithms():
    """An all_reduce that writes nothing into its result and an all_gather that sends
    nothing (in place: the others' rows left as they were), removed afterwards."""

    @register("all_reduce", "lazy_for_test")
    def lazy_all_reduce(t, src, dst, op):
        """Nothing at all.

        Cost: 0
        """

    @register("all_gather", "lazy_for_test")
    def lazy_all_gather(t, buf, bounds):
        """Nothing at all.

        Cost: 0
        """

    yield "lazy_for_test"
    del REGISTRY["all_reduce"]["lazy_for_test"], REGISTRY["all_gather"]["lazy_for_test"]


def test_check_counts_a_result_left_unwritten_wrong(world, shared_dir, lazy_algorithms):
    """The rows of a size share their result buffer: a row that leaves it unwritten must
    not pass on the right values the row before it left there (as nccl-tests clears its
    receive buffers before each check, so does the benchmark)."""
    for collective, extra in (("all_reduce", ()), ("all_reduce", ("--plan",)),
                              ("all_gather", ("--inplace", "--plan"))):
        out_json = os.path.join(shared_dir, f"lazy-{collective}.json")
        status = main([collective, *SMALL, "--algo", f"native,{lazy_algorithms}", *extra,
                       "--json", out_json])
        world.barrier()
        rows = json.load(open(out_json))["rows"]
        lazy = [r for r in rows if r["algorithm"].startswith(lazy_algorithms) and r["count"]]
        if "--inplace" in extra:  # (the +plan rows run in place as their calls do)
            assert all(r["inplace"] for r in rows), rows
        if collective == "all_gather" and world.size == 1:  # (its own row: nothing to send)
            assert status == 0 and all(r["wrong"] == 0 for r in lazy), rows
            continue
        assert status == 1 and lazy and all(r["wrong"] > 0 for r in lazy), (collective, rows)
        assert all(r["wrong"] == 0 for r in rows if r["algorithm"] == "native")


def test_check_counts_the_librarys_own_row_too(world, shared_dir, monkeypatch):
    """The mpi_library row's result is checked as every row's (it showed 0 wrong
    unchecked): a library collective that writes nothing is counted wrong."""
    import mpicoll

    monkeypatch.setattr(mpicoll.Communicator, "native_collective",
                        lambda self, collective: lambda *args: None)
    out_json = os.path.join(shared_dir, "library.json")
    assert main(["all_reduce", *SMALL, "--algo", "ring", "--json", out_json]) == 1
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    library = [r for r in rows if r["algorithm"] == "mpi_library" and r["count"]]
    assert library and all(r["wrong"] > 0 for r in library), rows
    assert all(r["wrong"] == 0 for r in rows if r["algorithm"] == "ring")


def test_avg_rows_of_the_library_are_its_sum_divided(world, shared_dir):
    """-o avg: MPI has no avg; the mpi_library row is its sum divided by the ranks
    combined, as its caller divides it (it was the sum, counted wrong at every size)."""
    out_json = os.path.join(shared_dir, "avg.json")
    collectives = "all_reduce,reduce,reduce_scatter,scan,exscan"
    assert main([collectives, "-o", "avg", *SMALL, "--algo", "ring", "--json", out_json]) == 0
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    library = [r for r in rows if r["algorithm"] == "mpi_library"]
    assert {r["collective"] for r in library} == set(collectives.split(","))
    assert all(r["wrong"] == 0 for r in rows), rows


def test_a_collective_named_twice_is_timed_once(world, shared_dir):
    out_json = os.path.join(shared_dir, "twice.json")
    assert main(["all_reduce,all_reduce", *SMALL, "--algo", "ring", "--json", out_json]) == 0
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    keys = [(r["size"], r["algorithm"]) for r in rows]
    assert rows and len(keys) == len(set(keys)), keys


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


def test_tune_round_trips_and_changes_auto(world, shared_dir, monkeypatch, capsys):
    path = os.path.join(shared_dir, "tuning.json")
    if world.size == 1:  # (nothing is sent: a table of noise that would rule every p)
        with pytest.raises(SystemExit) as stop:
            main(["tune", "-b", "8", "-e", "8", "--output", path])
        assert stop.value.code == 2 and "tune: at one rank" in capsys.readouterr().err
        assert not os.path.exists(path)
        pytest.skip("tune needs two ranks or more")
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


def test_plan_rows_are_checked_and_beside_the_per_call_rows(world, shared_dir, broken_all_reduce):
    out_json = os.path.join(shared_dir, "plan.json")
    assert main(["all", *SMALL, "--plan", "--algo", "ring,native,auto", "--json", out_json]) == 0
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    names = {r["algorithm"] for r in rows if r["collective"] == "all_reduce"}
    assert {"ring+plan", "native+plan", "auto+plan", "ring", "mpi_library"} <= names
    assert all(r["wrong"] == 0 for r in rows)
    # a plan of a wrong algorithm is caught as its per-call row is
    assert main(["all_reduce", *SMALL, "--plan", "--algo", broken_all_reduce,
                 "--json", out_json]) == 1
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    assert all(r["wrong"] > 0 for r in rows
               if r["algorithm"] == f"{broken_all_reduce}+plan" and r["count"])


def test_overhead_table_names_every_collective(world, capsys):
    assert main(["overhead", "-n", "1", "-w", "2"]) == 0
    if world.rank == 0:
        out = capsys.readouterr().out
        # (whole blocks of one float32 a rank at least: never a row of no data)
        moved = max(1, 2 // world.size) * world.size * 4
        assert f"per-call overhead at {moved}B" in out
        for collective in (*RECORDS, "barrier"):
            assert any(line.split()[:1] == [collective] for line in out.splitlines()), collective


def test_compressed_rows_beside_the_plain_ones_with_their_error(world, shared_dir, capsys):
    out_json = os.path.join(shared_dir, "compress.json")
    assert main(["all_reduce", *SMALL, "--compress", "bf16", "--algo", "ring,auto",
                 "--json", out_json]) == 0
    world.barrier()
    rows = json.load(open(out_json))["rows"]
    names = {r["algorithm"] for r in rows}
    assert {"ring", "ring+bf16", "auto+bf16", "mpi_library"} <= names
    assert "native+bf16" not in names  # the library does not compress
    assert all(r["wrong"] == 0 for r in rows)
    if world.rank == 0:  # measured on values with a fraction: bf16 rounds them (whole
        # numbers as the plain rows' would travel exactly, an error of 0 said nothing)
        found = re.search(r"ring\+bf16: largest error (\S+) of the largest result \(the wire's "
                          r"rounding allows (\S+)\)", capsys.readouterr().out)
        assert found and 0 < float(found[1]) <= float(found[2]), found
    world.barrier()
    assert main(["all_reduce", *SMALL, "--compress", "bf16", "--algo", "ring", "--inplace",
                 "--json", out_json]) == 0
    world.barrier()
    rows = json.load(open(out_json))["rows"]  # (the compressed rows run out of place)
    assert {(r["algorithm"], r["inplace"]) for r in rows} >= {("ring", True),
                                                              ("ring+bf16", False)}


def test_gloo_comparison_runs_where_torch_is(world, capsys):
    pytest.importorskip("torch")
    from mpicoll.bench import gloo

    assert gloo.main(["-b", "8", "-e", "64", "-n", "2", "-w", "1"]) == 0
    if world.rank == 0:
        out = capsys.readouterr().out
        assert "gloo/dist" in out and "64B" in out


def test_osu_layout_means_what_osu_means():
    """OSU's latency is each rank's mean over the iterations, then its average, minimum
    and maximum over the ranks (not the iterations' spread), at OSU's message size (per
    rank for all_gather, per peer for all_to_all)."""
    from mpicoll.bench import Row

    def row(collective, size):
        return Row(collective, "mpi", "numpy", size, size // 4, "float32", "sum", -1, "ring",
                   9.0, 1.0, 50.0, 40.0, 0.0, 0.0, 0, 0.0, mean_us=12.0,
                   rank_avg_us=10.0, rank_min_us=8.0, rank_max_us=12.0)

    head = {"ranks": 4, "iterations": 20}
    lines = report.osu_lines([row("all_reduce", 1024), row("all_gather", 1024),
                              row("all_to_all", 1024)], head)
    data = [line.split() for line in lines if line and not line.startswith("#")]
    assert data == [["1024", "10.00", "8.00", "12.00", "20"],
                    ["256", "10.00", "8.00", "12.00", "20"],
                    ["256", "10.00", "8.00", "12.00", "20"]]


def test_overhead_and_tune_on_a_dtype_the_library_cannot_reduce(world, shared_dir, capsys):
    """bfloat16: MPI cannot reduce it; the overhead table says so for the reducing rows and
    tune leaves the library's column out, neither stops."""
    assert main(["overhead", "-n", "1", "-w", "0", "-d", "bfloat16"]) == 0
    out = capsys.readouterr().out
    if world.rank == 0:
        assert "all_reduce (the library cannot reduce bfloat16 with sum)" in out
        assert "all_gather" in out
    path = os.path.join(shared_dir, "bf16-tuning.json")
    if world.size == 1:
        return  # (tune needs two ranks or more)
    assert main(["tune", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "-d", "bfloat16",
                 "--collectives", "all_reduce", "--output", path]) == 0
    if world.rank == 0:
        assert "the MPI library cannot take it" in capsys.readouterr().out


def test_model_and_tuning_files_that_are_not_theirs_are_refused(world, shared_dir, capsys):
    """--model with a file auto's reader refuses (a negative alpha) and tune --output
    naming a file that is no tuning file (a model file): one line, exit 2, before any
    run; the file is left as it was. A beta or gamma of 0 (no limit) prints as such."""
    import json

    bad, model_file = f"{shared_dir}/bad-model.json", f"{shared_dir}/model.json"
    if world.rank == 0:
        with open(bad, "w") as f:
            json.dump({"alpha": -1e-6, "beta": 1e-10, "gamma": 1e-10}, f)
        with open(model_file, "w") as f:
            json.dump({"alpha": 1e-6, "beta": 0, "gamma": 0}, f)
    world.barrier()
    kept = open(model_file).read()
    for argv, message in ((["all_reduce", "--model", bad], "'alpha' must be a non-negative"),
                          (["tune", "-b", "8", "-e", "8", "--output", model_file],
                           "tune adds its table to a tuning file")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert world.rank != 0 or (message in err and "Traceback" not in err), err
    assert open(model_file).read() == kept
    assert main(["all_reduce", *SMALL, "--algo", "ring", "--model", model_file]) == 0
    assert world.rank != 0 or "beta unlimited, gamma unlimited" in capsys.readouterr().out


def test_the_auto_line_is_there_when_auto_wins_and_ignores_compressed_rows():
    """The summary says how close auto came even where it was the fastest everywhere;
    compressed and plan rows (other values, or another call form) are never its yardstick,
    nor "the fastest algorithm"."""
    from types import SimpleNamespace as Row

    from mpicoll.bench.report import auto_lines, fastest_lines

    rows = [Row(collective="all_reduce", algorithm=a, size=s, time_us=t)
            for s in (8, 64) for a, t in (("auto", 1.0), ("ring", 2.0), ("ring+bf16", 0.5),
                                          ("ring+plan", 0.4))]
    assert auto_lines(rows) == ["# auto, all_reduce: the fastest at every size"]
    assert "ring" in fastest_lines(rows)[0] and "+" not in fastest_lines(rows)[0]


def test_a_model_file_only_one_rank_can_read_is_rank_0s_verdict(world, shared_dir, capsys,
                                                                 monkeypatch):
    """The default model file is read by rank 0 and shared: another rank whose
    MPICOLL_MODEL names a broken file runs with rank 0's (it stopped alone, and rank 0
    hung in the header's exchange); rank 0's broken file stops every rank."""
    bad = os.path.join(shared_dir, "broken-model.json")
    if world.rank == 0:
        with open(bad, "w") as f:
            f.write("{not json")
    world.barrier()
    if world.rank == world.size - 1 and world.size > 1:
        monkeypatch.setenv("MPICOLL_MODEL", bad)
    assert main(["all_reduce", *SMALL, "--algo", "ring"]) == 0
    monkeypatch.setenv("MPICOLL_MODEL", bad)  # (now rank 0's too: every rank stops)
    with pytest.raises(SystemExit) as stop:
        main(["all_reduce", *SMALL, "--algo", "ring"])
    assert stop.value.code == 2


def test_unchecked_repeated_and_auto_only_runs_say_what_they_did(world, capsys):
    """-c 0: #wrong N/A; sizes that round to the same elements (8, 9, 10 B of float32)
    run once; auto beside ring alone names no native comparison."""
    assert main(["all_reduce", "-b", "8", "-e", "12", "-f", "1.2", "-n", "1", "-w", "0",
                 "-c", "0", "--algo", "ring,auto"]) == 0
    out = capsys.readouterr().out
    if world.rank == 0:
        rows = [line.split() for line in out.splitlines()
                if line.strip() and not line.startswith("#") and line.split()[5] != "mpi_library"]
        assert [(r[0], r[5]) for r in rows] == [("8", "ring"), ("8", "auto"),
                                               ("12", "ring"), ("12", "auto")]
        assert all(r[9] == "N/A" for r in rows)
        assert "Out of bounds values : N/A" in out
        assert "native (at" not in out


def test_scaling_takes_each_rows_own_prediction(world, shared_dir, capsys):
    """The scaling summary of runs with plan rows (and any model): each row's predicted
    time as the run printed it, not one recomputed from alpha, beta, gamma alone."""
    from mpicoll.bench import scaling

    path = os.path.join(shared_dir, f"ranks-{world.size}.json")
    assert main(["all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--plan",
                 "--algo", "ring,auto", "--json", path]) == 0
    world.barrier()
    if world.rank == 0:
        rows = json.load(open(path))["rows"]
        assert any("+plan" in r["algorithm"] for r in rows)
        assert scaling.main([shared_dir, "-o", os.path.join(shared_dir, "s.png")]) == 0
        records = scaling.load(shared_dir)
        assert {r["algorithm"]: r["predicted_us"] for r in records} == \
            {r["algorithm"]: r["predicted_us"] for r in rows}
    world.barrier()


@pytest.mark.parametrize("edit, message", [
    ({"time_us": None}, "time_us: expected a number, got None"),
    ({"wrong": None}, "wrong: expected int, got None"),
    ({"size": "8"}, "size: expected int, got '8'"),
    ({"ranks": "2"}, "ranks: expected int, got '2'"),
    ({"rows": []}, "have no rows"),
])
def test_scaling_refuses_a_hand_edited_run_in_one_line(tmp_path, capsys, edit, message):
    """A ranks-*.json whose fields are not of their kind: one line naming the field and
    exit 2, before any CSV or figure is written (they were a raw TypeError, after)."""
    from mpicoll.bench import scaling

    row = {"collective": "all_reduce", "algorithm": "ring", "size": 8, "time_us": 1.5,
           "wrong": 0, "predicted_us": 1.0}
    head = {"ranks": 2, "hosts": 1}
    for key, value in edit.items():
        (head if key == "ranks" else row)[key] = value
    run = {"header": head, "rows": edit.get("rows", [row])}
    (tmp_path / "ranks-2.json").write_text(json.dumps(run))
    good = dict(run, header={"ranks": 4, "hosts": 1}, rows=[dict(row, time_us=2.0)])
    (tmp_path / "ranks-4.json").write_text(json.dumps(good if "rows" not in edit else run))
    png = str(tmp_path / "s.png")
    try:
        status = scaling.main([str(tmp_path), "-o", png])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and message in err and "Traceback" not in err, err
    assert not os.path.exists(str(tmp_path / "s.csv"))


def test_a_figure_without_matplotlib_is_refused_before_the_run(world, shared_dir, capsys,
                                                                monkeypatch):
    """--plot where matplotlib will not import: one line and exit 2 before any row is
    timed (never hours of rows lost at the end); the scaling summary still writes its
    CSV and table, says why there is no figure, and exits 2."""
    import sys

    from mpicoll.bench import scaling

    path = os.path.join(shared_dir, f"ranks-{world.size}.json")
    assert main(["all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--algo", "ring",
                 "--json", path]) == 0
    world.barrier()
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import matplotlib: ImportError)
    with pytest.raises(SystemExit) as stop:
        main(["all_reduce", "-b", "1K", "-e", "1K", "--plot", os.path.join(shared_dir, "f.png")])
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    if world.rank == 0:
        assert "drawing needs matplotlib" in err and err.count("\n") == 1, err
        assert "ring" not in out  # (no row was timed)
        png = os.path.join(shared_dir, "no-matplotlib.png")
        assert scaling.main([shared_dir, "-o", png]) == 2
        out, err = capsys.readouterr()
        assert "drawing needs matplotlib" in err and "ring" in out
        assert os.path.exists(os.path.join(shared_dir, "no-matplotlib.csv"))
        assert not os.path.exists(png)
    world.barrier()
