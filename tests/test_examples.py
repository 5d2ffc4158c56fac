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
    # (timeout's TERM reaches mpiexec, which ends its ranks; subprocess's own bound, a
    # SIGKILL to mpiexec alone, would leave them running)
    return subprocess.run(["timeout", "-k", "5", str(timeout), MPIEXEC, "-n", str(n),
                           sys.executable, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout + 30)


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


# every example, its own check included, at 1, 3 and 4 ranks
EXAMPLES = {
    "cheatsheet": ("no rank left before rank", "--algorithm", "ring"),
    "distributed_mean": ("np.mean on all of them",),
    "distributed_softmax": ("equals the unsharded softmax", "-n", "3"),
    "distributed_argmax": ("np.argmax over everything agrees",),
    "ring_all_reduce": ("== comm.all_reduce", "-n", "7"),
    "data_parallel": ("weights equal single-process training", "--steps", "4",
                      "--bucket-mb", "0.1"),
    "tensor_parallel_mlp": ("equal the unsharded MLP's", "--hidden", "10"),
    "moe_all_to_all": ("every token came back processed by its expert",),
    "dist_tutorial": ("equal single-process training",),
    "mesh_mlp": ("slices of W1, b1, W2, b2 equal single-process training",),
    "zero_step": ("of the first averaged gradient, and the losses equal single-process "
                  "training with Adam",),
    "pipeline_parallel": ("every stage's layer equals single-process training",),
}


@needs_mpiexec
@pytest.mark.parametrize("n", [1, 3, 4])  # one rank, an odd count, a power of two
@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example(name, n):
    expected, *args = EXAMPLES[name]
    done = mpiexec(n, "-m", f"mpicoll.examples.{name}", *args)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout, done.stdout


@needs_mpiexec
@pytest.mark.parametrize("per_node,placement", [
    ("2", "nodes [[0, 1], [2, 3]]: every tp group inside one node"),
    ("1", "nodes [[0], [1], [2], [3]]: some tp group spans nodes"),
])
def test_mesh_mlp_says_where_its_tp_groups_are(monkeypatch, per_node, placement):
    """The mesh is row-major: tp groups are consecutive ranks, so with (simulated) nodes
    of two ranks each tp group is one node, and with nodes of one rank it is not."""
    monkeypatch.setenv("MPICOLL_RANKS_PER_NODE", per_node)
    done = mpiexec(4, "-m", "mpicoll.examples.mesh_mlp")
    assert done.returncode == 0, done.stderr
    assert ("mesh dp=2 x tp=2: tp groups [[0, 1], [2, 3]], dp groups [[0, 2], [1, 3]]; "
            + placement) in done.stdout, done.stdout
    assert "equal single-process training" in done.stdout


@needs_mpiexec
def test_mesh_mlp_refuses_a_tp_that_does_not_divide_the_ranks():
    done = mpiexec(4, "-m", "mpicoll.examples.mesh_mlp", "--tp", "3", timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()  # one line, from rank 0 only
    assert line.endswith("error: --tp 3 does not divide the 4 ranks; choose a divisor of 4"), \
        done.stderr


@needs_mpiexec
def test_data_parallel_refuses_a_bucket_cap_of_no_byte():
    """--bucket-mb 0 (or below a byte): argparse's error and exit 2, never the Bucketer's
    refusal as a traceback from every rank."""
    done = mpiexec(2, "-m", "mpicoll.examples.data_parallel", "--bucket-mb", "0", timeout=60)
    assert done.returncode == 2
    assert "--bucket-mb: 0: must be at least one byte" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize("example,flags,said", [
    ("data_parallel", ["--sizes", "a,b"], "--sizes: 'a' is not a whole number"),
    ("data_parallel", ["--sizes", "32"], "--sizes: '32': at least two widths"),
    ("data_parallel", ["--sizes", "32,0,8"], "--sizes: 0: must be at least 1"),
    ("data_parallel", ["--bucket-mb", "inf"], "--bucket-mb: inf: must be a finite number"),
    ("distributed_mean", ["--seed", "-1"], "--seed: -1: a seed is at least 0"),
    ("distributed_argmax", ["--seed", "-5"], "--seed: -5: a seed is at least 0")])
def test_bad_example_flags_are_argparse_errors(example, flags, said):
    """Each was a traceback from every rank and exit 70 (int() of a width, max() of no
    hidden layer, a negative seed for NumPy's generator, int(inf) bytes)."""
    done = subprocess.run([sys.executable, "-m", f"mpicoll.examples.{example}", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@needs_mpiexec
def test_pipeline_example_draws_the_gpipe_schedule():
    """At 3 stages: all forwards, then all backwards in reverse, the bubble 2/(M+2)."""
    done = mpiexec(3, "-m", "mpicoll.examples.pipeline_parallel", "--micro-batches", "2")
    assert done.returncode == 0, done.stderr
    assert "each stage idles 2/4 of a step" in done.stdout
    assert "\n  stage 0: F0 F1 .. .. .. .. B1 B0\n  stage 1: .. F0 F1 .. .. B1 B0 ..\n" \
           "  stage 2: .. .. F0 F1 B1 B0 .. ..\n" in done.stdout, done.stdout


@needs_mpiexec
@pytest.mark.parametrize("n", [3, 4])
def test_ring_example_numbers_chunks_as_viz_draws_them(n):
    """Step k of the example sends what python -m mpicoll.viz draws in column k: the same
    chunk numbers, rank r ending the reduce-scatter with chunk r, both saying so."""
    import re

    from mpicoll import viz

    done = mpiexec(n, "-m", "mpicoll.examples.ring_all_reduce", "-n", str(3 * n))
    assert done.returncode == 0, done.stderr
    assert "after the reduce-scatter rank r holds chunk r reduced" in done.stdout
    example: dict[int, set] = {}
    step = 0
    for line in done.stdout.splitlines():
        title = re.match(r"(reduce-scatter|all-gather) step (\d+)$", line)
        if title:
            step = int(title.group(2))
        sent = re.match(r"  rank (\d+): sent chunk (\d+) to rank (\d+)", line)
        if sent and step:
            r, chunk, to = map(int, sent.groups())
            example.setdefault(step, set()).add((r, to, chunk))
    drawn = viz.trace_flow("all_reduce", "ring", n)
    assert example == {k + 1: {(s, d, c) for s, d, c, _ in messages}
                       for k, messages in enumerate(drawn.steps)}
    assert drawn.owner_note() == "then rank r holds chunk r reduced"
    assert drawn.phases("all_reduce", "ring") == [("reduce-scatter", 1, n - 1),
                                                   ("all-gather", n, 2 * n - 2)]


BROKEN = {  # a collective that returns too early or wrong, and the check that must fail
    "barrier": ("mpicoll.Communicator.barrier = lambda self, *a, **k: None",
                "check failed: barrier: rank 0 left too early"),
    "gather": ("real = mpicoll.Communicator.gather\n"
               "def gather(self, x, root=0, **k):\n"
               "    got = real(self, x, root, **k)\n"
               "    return got if got is None else got[::-1].copy()\n"
               "mpicoll.Communicator.gather = gather", "check failed: gather"),
    "reduce": ("real = mpicoll.Communicator.reduce\n"
               "def reduce(self, x, op='sum', root=0, **k):\n"
               "    got = real(self, x, op, root, **k)\n"
               "    return got if got is None else got + 1\n"
               "mpicoll.Communicator.reduce = reduce", "check failed: reduce"),
}


@needs_mpiexec
@pytest.mark.parametrize("example,broken", [("cheatsheet", "barrier"), ("cheatsheet", "gather"),
                                            ("quickstart", "gather"), ("quickstart", "reduce")])
def test_an_example_fails_where_a_collective_is_wrong(tmp_path, example, broken):
    """The pass lines are checked: with a barrier that does not wait, or a gather or
    reduce that delivers wrong data, the example fails (under ``python -O`` too)."""
    patch, message = BROKEN[broken]
    script = tmp_path / "broken.py"
    script.write_text(f"import runpy, sys\nimport mpicoll\n{patch}\n"
                      f"sys.argv = ['{example}']\n"
                      f"runpy.run_module('mpicoll.examples.{example}', run_name='__main__')\n")
    done = mpiexec(3, "-O", str(script), timeout=60)
    assert done.returncode == 70, done.stderr
    assert message in done.stderr and "with NumPy on" not in done.stdout, done.stderr


@needs_mpiexec
def test_cheatsheet_draws_reduce_scatter_apart_from_all_reduce():
    """reduce_scatter as the tutorials draw it: rank j ends with chunk j of the sum only."""
    done = mpiexec(4, "-m", "mpicoll.examples.cheatsheet")
    assert done.returncode == 0, done.stderr
    blocks = {block.splitlines()[0]: block.splitlines()[1:]
              for block in done.stdout.split("\n\n") if block.strip()}
    [title] = [t for t in blocks if t.startswith("reduce_scatter")]
    rows = [line.split(":", 1)[1].split() for line in blocks[title]]
    assert rows == [[f"[{a}0", f"{a}1", f"{a}2", f"{a}3]", "->", f"[A{j}+B{j}+C{j}+D{j}]"]
                    for j, a in enumerate("ABCD")]
    [all_reduce] = [t for t in blocks if t.startswith("all_reduce")]
    assert len({line.split("->")[1] for line in blocks[all_reduce]}) == 1  # the same everywhere


@needs_mpiexec
def test_data_parallel_default_cap_makes_buckets_that_overlap():
    """The default bucket cap splits this model's gradients into several buckets (one
    bucket would start only after backward, overlapping nothing), and says so."""
    import re

    done = mpiexec(2, "-m", "mpicoll.examples.data_parallel", "--steps", "3")
    assert done.returncode == 0, done.stderr
    buckets = int(re.search(r"(\d+) bucket\(s\) of", done.stdout).group(1))
    assert buckets > 1, done.stdout
    assert "bucket cap 0.25 MB (DDP's bucket_cap_mb)" in done.stdout
    assert "starts as soon as backward has filled it" in done.stdout
    one = mpiexec(1, "-m", "mpicoll.examples.data_parallel", "--steps", "1", "--bucket-mb", "25")
    assert one.returncode == 0, one.stderr
    assert "1 bucket(s)" in one.stdout and "nothing overlaps; lower --bucket-mb" in one.stdout


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
    with open(os.path.join(ROOT, "examples", "library_use.py")) as f:
        assert "mpicoll.abort_on_exception()" in f.read()  # as a user's script should


UNCAUGHT = "mpicoll: uncaught exception on rank 1; aborting the job (exit code 70)"


def _one_clear_message(stderr: str, cause: str) -> None:
    """The failing rank's traceback and abort_on_exception's line, each once."""
    assert stderr.count(cause) == 1 and stderr.count(UNCAUGHT) == 1, stderr
    assert stderr.count("Traceback (most recent call last)") == 1, stderr


@needs_mpiexec
@pytest.mark.parametrize("where", ["main", "thread"])
def test_one_failing_rank_aborts_the_job(tmp_path, where):
    """_launch installs mpicoll.abort_on_exception(): an exception on one rank, in its
    main thread or another, ends every rank at once with exit code 70."""
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent(f"""
        import threading
        import numpy as np
        import mpicoll
        from mpicoll.examples._launch import launch

        def give_up():
            raise RuntimeError("rank 1 gives up")

        def main():
            comm = mpicoll.Communicator()
            if comm.rank == 1:
                if {where!r} == "thread":
                    threading.Thread(target=give_up).start()
                    threading.Event().wait()  # the thread's exception must end this too
                give_up()
            comm.all_reduce(np.ones(4))  # the others would wait here forever

        launch(main)
    """))
    done = mpiexec(3, str(script), timeout=60)
    assert done.returncode == 70, done.stderr
    _one_clear_message(done.stderr, "RuntimeError: rank 1 gives up")


@needs_mpiexec
def test_a_failing_rank_ends_the_benchmark_at_once(tmp_path):
    """``python -m mpicoll.bench`` (the SLURM jobs' entry point) installs
    abort_on_exception: one rank raising mid-sweep ends the job, exit 70."""
    script = tmp_path / "bench_fails.py"
    script.write_text(textwrap.dedent("""
        import runpy
        from mpi4py import MPI
        import mpicoll.bench as bench

        if MPI.COMM_WORLD.Get_rank() == 1:
            def make_input(*args, **kwargs):
                raise RuntimeError("rank 1 cannot make its input")
            bench.make_input = make_input
        runpy.run_module("mpicoll.bench", run_name="__main__", alter_sys=True)
    """))
    done = mpiexec(3, str(script), "all_reduce", "-e", "64", "-n", "1", "-w", "1", timeout=60)
    assert done.returncode == 70, done.stderr
    _one_clear_message(done.stderr, "RuntimeError: rank 1 cannot make its input")


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


def test_data_parallel_says_each_ranks_own_overlap():
    """Rank 0 blocked 9 ms and its all_reduces ran 12, rank 1 blocked 2 and ran 4: every
    rank overlapped at least 2 ms (the maxima's difference, 12 - 9, was no rank's); rank 0
    blocked 9 and ran 8, rank 1 blocked 1 and ran 12: rank 0 overlapped nothing (the
    maxima said 3)."""
    import numpy as np

    from mpicoll.examples.data_parallel import least_overlap

    assert least_overlap(np.array([[9e-3, 12e-3, 0.1], [2e-3, 4e-3, 0.1]])) == \
        pytest.approx(2e-3)
    assert least_overlap(np.array([[9e-3, 8e-3, 0.1], [1e-3, 12e-3, 0.1]])) == 0.0


def test_rank_ordered_lines_are_one_line_cut_at_a_space(capsys):
    """A NumPy array's text (several lines) printed as one line, a long one cut at a
    space with "..." (it was cut mid-number, and its line breaks garbled the output)."""
    import types

    import numpy as np

    from mpicoll.examples._launch import print_in_rank_order

    comm = types.SimpleNamespace(rank=0, gather=lambda line, root: [line])
    print_in_rank_order(comm, "t", str(np.arange(40)), width=40)
    print_in_rank_order(comm, "u", "1.25e-01 " * 6, width=30)
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "  rank 0: [ 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14..." and len(lines) == 6, \
        lines
    assert lines[5] == "  rank 0: 1.25e-01 1.25e-01 1.25e-01...", lines
