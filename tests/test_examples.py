"""The examples run under mpiexec, and one failing rank aborts the whole job (no hang)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec next to Python or on PATH")


def mpiexec(n: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_"))}
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@needs_mpiexec
@pytest.mark.parametrize("n,algorithm", [(1, "auto"), (3, "binomial"), (4, "ring")])
def test_quickstart(n, algorithm):
    done = mpiexec(n, "-m", "mpicoll.examples.quickstart", "--algorithm", algorithm)
    assert done.returncode == 0, done.stderr
    assert f"all collectives agree with NumPy on {n} rank(s)" in done.stdout


@needs_mpiexec
@pytest.mark.parametrize("name", ["quickstart", "cheatsheet"])
def test_an_unknown_algorithm_is_refused_in_one_line(name):
    done = mpiexec(2, "-m", f"mpicoll.examples.{name}", "--algorithm", "rnig")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [line for line in done.stderr.strip().splitlines()
                                                if "--algorithm 'rnig': no collective has it"
                                                in line] and done.stderr.strip(), done.stderr


@needs_mpiexec
def test_quickstart_names_the_algorithms_and_keeps_whole_rows():
    done = mpiexec(4, "-m", "mpicoll.examples.quickstart", "--algorithm", "ring")
    assert done.returncode == 0, done.stderr
    assert "all_reduce max (ring)" in done.stdout and "broadcast from rank 0 (auto: " in done.stdout
    assert "-> [[6, 7], [106, 107], [206, 207], [306, 307]]" in done.stdout  # not cut


# every example, its own check included, at 1, 2, 3 and 4 ranks
EXAMPLES = {
    "cheatsheet": ("every collective agrees with NumPy", "--algorithm", "ring"),
    "distributed_mean": ("np.mean on all of them",),
    "distributed_softmax": ("equals the unsharded softmax", "-n", "3"),
    "distributed_argmax": ("np.argmax over everything agrees",),
    "ring_all_reduce": ("== comm.all_reduce", "-n", "7"),
    "data_parallel": ("weights equal single-process training", "--steps", "4",
                      "--bucket-mb", "0.1"),
    "tensor_parallel_mlp": ("equal the unsharded MLP's", "--hidden", "10"),
    "moe_all_to_all": ("every token came back processed by its expert",),
}


@needs_mpiexec
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example(name, n):
    expected, *args = EXAMPLES[name]
    done = mpiexec(n, "-m", f"mpicoll.examples.{name}", *args)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout, done.stdout


def test_every_example_is_indexed_and_tested():
    import mpicoll.examples as package

    names = {f[:-3] for f in os.listdir(os.path.dirname(package.__file__))
             if f.endswith(".py") and not f.startswith("_")}
    with open(os.path.join(ROOT, "examples", "README.md")) as f:
        index = f.read()
    assert names == set(EXAMPLES) | {"quickstart"}
    assert all(f"| `{name}` |" in index for name in names)


@needs_mpiexec
def test_library_use_example():
    done = mpiexec(3, "examples/library_use.py")
    assert done.returncode == 0, done.stderr
    assert "3 ranks: sum = 3" in done.stdout


@needs_mpiexec
def test_one_failing_rank_aborts_the_job(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import mpicoll
        from mpicoll.examples._launch import launch

        def main():
            comm = mpicoll.Communicator()
            if comm.rank == 1:
                raise RuntimeError("rank 1 gives up")
            comm.all_reduce(np.ones(4))  # the others would wait here forever

        launch(main)
    """))
    done = mpiexec(3, str(script), timeout=60)
    assert done.returncode != 0
    assert "rank 1 gives up" in done.stderr


@needs_mpiexec
def test_benchmark_runs_every_collective_and_checks_results():
    done = mpiexec(3, "-m", "mpicoll.bench", "all", "-b", "8", "-e", "4K", "-f", "64",
                   "-n", "2", "-w", "1", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "# Out of bounds values : 0 OK" in done.stdout
    for collective in ("broadcast", "all_reduce", "all_to_all", "reduce_scatter"):
        assert f"# {collective}\n" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("  ")]
    assert {row[5] for row in rows} >= {"mpi_library", "native", "auto", "ring"}
    assert all(row[9] == "0" for row in rows)  # #wrong


@needs_mpiexec
@pytest.mark.parametrize("flags", [["--algo", "rnig"], ["-e", "64X"], ["-o", "avg", "-d", "int"]])
def test_benchmark_refuses_bad_flags_in_one_line(flags):
    done = mpiexec(2, "-m", "mpi4py", "-m", "mpicoll.bench", "all_reduce", *flags, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert done.stderr.startswith("python -m mpicoll.bench: error: ")
