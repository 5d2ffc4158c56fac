"""Tuning and model files: a malformed range or parameter is refused when the file is
read (ConfigError naming the file and the entry, on every rank), never inside ``auto``;
what ``python -m mpicoll.bench tune`` writes is what the reader accepts."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mpicoll
from mpicoll import selection, tuning
from mpicoll.local import run_local


def _file(ranges) -> str:
    return json.dumps({"mpicoll_tuning": 1, "tables": {"2": {"all_reduce": ranges}}})


@pytest.mark.parametrize("text", ["null", "[]", "{}", "0", '""', "false"])
def test_a_tuning_file_of_no_table_is_refused_not_read_as_an_empty_one(tmp_path, text):
    """JSON that is no table (null, [], {}, a number, a string) is a corrupt file, named,
    never an empty table that would leave auto's choices to the defaults unsaid."""
    path = tmp_path / "tuning.json"
    path.write_text(text)
    with pytest.raises(mpicoll.ConfigError, match="not an mpicoll tuning file") as caught:
        selection.parse_tuning(path.read_text(), str(path))
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("ranges, fault", [
    ([{"algorithm": "ring"}], r"\[0\] .*needs 'below'"),
    ([{"below": -5, "algorithm": "ring"}, {"below": None, "algorithm": "native"}],
     r"\[0\] .*positive number of bytes, got -5"),
    ([{"below": 0, "algorithm": "ring"}], r"\[0\] .*positive number of bytes, got 0"),
    ([{"below": 4096, "algorithm": "ring"}, {"below": 4096, "algorithm": "native"}],
     r"\[1\] .*must be above 4096"),
    ([{"below": 4096, "algorithm": "ring"}, {"below": 64, "algorithm": "native"}],
     r"\[1\] .*must be above 4096.*got 64"),
    ([{"below": None, "algorithm": "ring"}, {"below": None, "algorithm": "native"}],
     r"\[0\] .*only the last range may be open"),
    ([{"below": 64.5, "algorithm": "ring"}], r"\[0\] .*must be an int or null"),
    ([{"below": True, "algorithm": "ring"}], r"\[0\] .*must be an int or null"),
    (["ring"], r"\[0\] .*needs an 'algorithm'"),
])
def test_a_malformed_range_is_refused_when_the_file_is_read(tmp_path, monkeypatch, ranges, fault):
    path = tmp_path / "tuning.json"
    path.write_text(_file(ranges))
    with pytest.raises(mpicoll.ConfigError, match=fault) as caught:
        selection.parse_tuning(path.read_text(), str(path))
    assert str(path) in str(caught.value) and "tables['2']['all_reduce']" in str(caught.value)
    monkeypatch.setenv("MPICOLL_TUNING", str(path))  # every rank, at the Communicator
    with pytest.raises(mpicoll.ConfigError, match=fault):
        run_local(2, lambda comm: comm.auto_algorithm("all_reduce", 8))


@pytest.mark.parametrize("ranks", ["02", "\u00b2", "\u0662", "-2", "2.0", ""])
def test_a_number_of_ranks_not_written_as_the_tables_name_it_is_refused(tmp_path, monkeypatch,
                                                                      ranks):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"mpicoll_tuning": 1, "tables": {
        ranks: {"all_reduce": [{"below": None, "algorithm": "ring"}]}}}))
    monkeypatch.setenv("MPICOLL_TUNING", str(path))
    with pytest.raises(mpicoll.ConfigError, match="expected a number of ranks"):
        run_local(2, lambda comm: comm.auto_algorithm("all_reduce", 8))


def test_well_formed_ranges_are_read_and_picked(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    path.write_text(_file([{"below": 64, "algorithm": "recursive_doubling"},
                           {"below": 4096, "algorithm": "rabenseifner"},
                           {"below": None, "algorithm": "ring"}]))
    monkeypatch.setenv("MPICOLL_TUNING", str(path))
    picks = run_local(2, lambda comm: [comm.auto_algorithm("all_reduce", n)
                                       for n in (0, 63, 64, 4095, 4096, 1 << 30)])
    assert picks[0] == ["recursive_doubling", "recursive_doubling", "rabenseifner",
                        "rabenseifner", "ring", "ring"]
    path.write_text(_file([{"below": 64, "algorithm": "ring"}]))  # closed: above it, no choice
    assert selection.parse_tuning(path.read_text(), str(path)).pick("all_reduce", 2, 64) is None


@pytest.mark.parametrize("field, value", [("alpha", -1e-6), ("beta", float("nan")),
                                          ("gamma", float("inf")), ("alpha", None),
                                          ("ranks", -2), ("ranks", 2.5)])
def test_a_malformed_model_parameter_is_refused_when_read(tmp_path, monkeypatch, field, value):
    data = {"alpha": 1e-6, "beta": 1e-9, "gamma": 1e-9, "ranks": 4}
    data[field] = value
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes them
    monkeypatch.setenv("MPICOLL_MODEL", str(path))
    with pytest.raises(mpicoll.ConfigError, match=rf"model file {path}: '{field}'"):
        run_local(2, lambda comm: comm.size)


@pytest.mark.parametrize("variable", ["MPICOLL_TUNING", "MPICOLL_MODEL"])
def test_a_file_nested_deeper_than_json_reads_is_a_config_error(tmp_path, monkeypatch, variable):
    """(json's RecursionError, never raw)"""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    monkeypatch.setenv(variable, str(path))
    with pytest.raises(mpicoll.ConfigError, match=f"file {path}"):
        run_local(2, lambda comm: comm.size)


@pytest.mark.parametrize("winners", [
    [(8, "ring"), (512, "native"), (32768, "ring")],
    [(0, "ring"), (0, "native"), (16, "native"), (16, "ring"), (64, "ring")],  # rounded sizes
    [(4096, "ring"), (64, "native"), (0, "native")],  # out of order
    [(0, "ring"), (0, "native")],
    [],
])
def test_what_tune_writes_the_reader_accepts(tmp_path, winners):
    ranges = tuning.ranges_from_winners(winners)
    table = tuning.TuningTable()
    table.set("all_reduce", 2, ranges)
    path = table.save(tmp_path / "tuning.json")
    read = selection.parse_tuning(path.read_text(), str(path))
    for size, _ in winners:  # each measured size picks an algorithm measured at it
        assert read.pick("all_reduce", 2, size) in {n for s, n in winners if s == size}


def test_auto_algorithm_says_what_a_small_broadcast_or_scatter_runs(tmp_path, monkeypatch):
    """Up to the backend's packed_bytes a broadcast's data (an "auto" scatter's rows) go
    in the root's header packet, moved by the packet's algorithm: auto_algorithm says
    that one, not the table's entry for the data's size (which nothing runs)."""
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"mpicoll_tuning": 1, "tables": {"3": {
        "broadcast": [{"below": 512, "algorithm": "linear"},
                      {"below": None, "algorithm": "binomial"}],
        "scatter": [{"below": 2048, "algorithm": "linear"},
                    {"below": None, "algorithm": "binomial"}]}}}))
    monkeypatch.setenv("MPICOLL_TUNING", str(path))

    def body(comm):
        said_ran = []
        for nbytes in (12, 120, 504, 732, 996, 1500, 6000):
            for collective in ("broadcast", "scatter"):
                rows = nbytes // 12  # float32: a multiple of 3 ranks
                x = np.ones((3, rows // 3) if collective == "scatter" else rows, np.float32)
                said = comm.auto_algorithm(collective, x.nbytes)
                before = len(comm.trace_events())
                getattr(comm, collective)(x if comm.rank == 0 else None, 0)
                ran = {e["algorithm"] for e in comm.trace_events()[before:]
                       if e.get("algorithm")}
                said_ran.append((collective, x.nbytes, said, ran))
        return said_ran

    from mpicoll.backends.base import PACKED_BYTES

    for collective, nbytes, said, ran in run_local(3, body, trace=True)[0]:
        # (above packed_bytes the header packet goes first, on its own)
        assert ran == {said} if nbytes <= PACKED_BYTES else said in ran, \
            (collective, nbytes, said, ran)
