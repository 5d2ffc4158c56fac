"""jobs/ on a real SLURM cluster: slurmctld and two slurmd (virtual nodes c1 and c2) on
this host, started by scripts/slurm-cluster.sh for this module and stopped after it.

Each CPU job is submitted with small sizes and waited for (``sbatch_wait``); the checks are its
exit status, that its ranks ran on both nodes, and its CSV (every algorithm's row, no
wrong result). compare_gpu.sbatch is checked for syntax, ``sbatch --test-only`` and its
refusals of wrong allocations. Skipped, with the reason, where SLURM cannot be started
(not root, not installed); ``MPICOLL_REQUIRE_SLURM=1`` (set by scripts/test.sh once it
has installed SLURM) turns that skip into a failure.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpicoll.bench import RECORDS, _algorithm_names

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "scripts" / "slurm-cluster.sh"
JOBS = sorted((ROOT / "jobs").glob("*.sbatch"))
PNG = b"\x89PNG\r\n\x1a\n"


# a job's states before it has ended (squeue(1)'s JOB STATE CODES)
_NOT_ENDED = frozenset(("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                        "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "STAGE_OUT",
                        "SIGNALING", "STOPPED"))


def sbatch_wait(args: list[str], *, cwd: Path, env: dict[str, str],
                timeout: float) -> subprocess.CompletedProcess:
    """``sbatch --parsable --wait ARGS``, without its waits: sbatch polls the job at 2, 4,
    8... seconds, so a job of one second took four; this submits, then asks scontrol every
    tenth of a second. Its returncode is the job's exit status as ``--wait`` gives it (1
    where a signal ended it); stdout is sbatch's (the job id)."""
    submitted = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env=env,
                               capture_output=True, text=True, timeout=30)
    if submitted.returncode != 0:
        return submitted
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while True:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env,
                               capture_output=True, text=True, timeout=30).stdout
        state = re.search(r"\bJobState=(\S+)", shown)
        if state is not None and state[1] not in _NOT_ENDED:
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=env, timeout=30)
            raise subprocess.TimeoutExpired(["sbatch", *args], timeout)
        time.sleep(0.1)
    code = re.search(r"\bExitCode=(\d+):(\d+)", shown)
    assert code is not None, shown
    returncode = 1 if int(code[2]) else int(code[1])
    return subprocess.CompletedProcess(["sbatch", *args], returncode, submitted.stdout,
                                       submitted.stderr)


def _plain_env(**extra: str) -> dict[str, str]:
    """This environment without what would leak into a job: MPI's and SLURM's variables
    (the suite may itself run under mpiexec or inside a job)."""
    env = {k: v for k, v in os.environ.items()
           if not re.match(r"(PMI|PMIX|HYDRA|MPIR|MPICH|OMPI|SLURM)_", k)}
    return {**env, **extra}


def test_job_scripts_parse():
    assert {p.name for p in JOBS} >= {"compare_cpu.sbatch", "compare_gpu.sbatch",
                                      "scaling.sbatch", "tests.sbatch", "examples.sbatch"}
    for script in [*JOBS, ROOT / "jobs" / "env.sh", CLUSTER]:
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("left,given,bound", [
    ("59:30", "", "3540"), ("1:00:00", "", "3570"), ("2-03:04:05", "", "183815"),
    ("UNLIMITED", "", "1500"), ("INVALID", "", "1500"), ("1:00:00", "240", "240"),
    ("1:00", "", "30"), ("0:20", "", "10")])  # (a job's last minute: its time left, not 1500)
def test_a_steps_bound_is_the_jobs_time_left(tmp_path, left, given, bound):
    """Each launch runs under the job's time left (squeue's %L) less 30 s, so a job
    given -t 2:00:00 is not cut at a fixed 1500 s (it was, its results never written);
    1500 where squeue cannot tell; MPICOLL_STEP_TIMEOUT where given."""
    squeue = tmp_path / "squeue"
    squeue.write_text(f"#!/bin/sh\necho '{left}'\n")
    squeue.chmod(0o755)
    functions = re.findall(r"^(?:job_seconds_left|step_bound)\(\) \{.*?^\}",
                           (ROOT / "jobs" / "env.sh").read_text(), re.M | re.S)
    assert len(functions) == 2
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + "\n".join(functions) + "\nstep_bound"],
        env=_plain_env(PATH=f"{tmp_path}:{os.environ['PATH']}", SLURM_JOB_ID="7",
                       STEP_TIMEOUT_GIVEN="1" if given else "", MPICOLL_STEP_TIMEOUT=given),
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == bound, (done.stdout, done.stderr)


@pytest.mark.parametrize("job", ["compare_cpu.sbatch", "scaling.sbatch"])
def test_jobs_that_plot_need_matplotlib_before_they_run(tmp_path, job):
    """A site Python without matplotlib failed only after the whole sweep (the benchmark's
    --plot refused it); the jobs that plot ask env.sh to check it first."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "env.sh").write_text('echo "needs=${MPICOLL_NEEDS:-}"; exit 0\n')
    env = _plain_env(MPICOLL_ROOT=str(tmp_path), SLURM_JOB_ID="1")
    env.pop("MPICOLL_NEEDS", None)
    done = subprocess.run(["bash", str(ROOT / "jobs" / job)], env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "needs=matplotlib", done


def test_a_relative_results_folder_is_taken_from_where_the_job_started(tmp_path):
    """MPICOLL_RESULTS=out, a job started in another folder than the checkout: its
    results folder is made there and named by an absolute path (the jobs cd to the
    checkout, where "out/..." named a folder never made)."""
    env = _plain_env(MPICOLL_ROOT=str(ROOT), SLURM_JOB_ID="5", MPICOLL_RESULTS="out",
                     MPICOLL_PYTHON=sys.executable, MPICOLL_LAUNCHER="mpiexec")
    done = subprocess.run(["bash", "-c", f'source "{ROOT}/jobs/env.sh"; echo "at=$RESULTS"'],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"at={tmp_path}/out/job-5", done.stdout
    assert (tmp_path / "out" / "job-5").is_dir()


def test_launch_takes_srun_options_only_before_the_command():
    """launch's own "--" ends the srun options that come first; a "--" of the command's
    (tests.sbatch ... -k x -- tests/a.py, for pytest) or one inside an argument was taken
    for it (the command cut in two, or the shell's 'unbound variable')."""
    text = (ROOT / "jobs" / "env.sh").read_text()
    functions = [*re.findall(r"^mpicoll_fail\(\) \{.*\}$", text, re.M),
                 *re.findall(r"^(?:step_bound|launch)\(\) \{.*?^\}", text, re.M | re.S)]
    assert len(functions) == 3
    script = "\n".join(["set -euo pipefail", *functions,
                        "STEP_TIMEOUT_GIVEN=1 MPICOLL_STEP_TIMEOUT=5 MPICOLL_LAUNCHER=pmi2",
                        "srun() { printf '<%s>' \"$@\"; echo; }",
                        "timeout() { shift 3; \"$@\"; }",
                        "launch python -m pytest tests -k x -- tests/a.py",
                        "launch -n 2 -N 1 -- python 'a -- b'",
                        "launch python 'a -- b'"])
    done = subprocess.run(["bash", "-c", script], env=_plain_env(), capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "<--mpi=pmi2><python><-m><pytest><tests><-k><x><--><tests/a.py>",
        "<--mpi=pmi2><-n><2><-N><1><python><a -- b>",
        "<--mpi=pmi2><python><a -- b>"], done.stdout


def test_job_logs_go_to_results_which_every_checkout_has():
    """sbatch does not make --output's folder: results/ is kept in the checkout by its
    own .gitignore, which ignores everything else in it."""
    for job in JOBS:
        assert "#SBATCH --output=results/%x-%j.out\n" in job.read_text(), job.name
    placeholder = (ROOT / "results" / ".gitignore").read_text().splitlines()
    assert placeholder[-2:] == ["*", "!.gitignore"]


def test_a_job_outside_slurm_fails_at_once():
    done = subprocess.run(["bash", str(ROOT / "jobs" / "compare_cpu.sbatch")], cwd=ROOT,
                          env=_plain_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "not inside a SLURM job" in done.stderr


@pytest.mark.parametrize("job", sorted(p.name for p in JOBS if p.name != "compare_gpu.sbatch"))
def test_a_job_submitted_from_outside_the_checkout_says_so(job, tmp_path):
    # (compare_gpu.sbatch first refuses an allocation without GPUs, as here)
    """Submitted from another folder (sbatch's SLURM_SUBMIT_DIR), a job names what to do
    instead of bash's 'No such file or directory'."""
    env = {**_plain_env(), "SLURM_JOB_ID": "1", "SLURM_SUBMIT_DIR": str(tmp_path)}
    env.pop("MPICOLL_ROOT", None)
    done = subprocess.run(["bash", str(ROOT / "jobs" / job)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "submit from the checkout's root" in done.stderr, done.stderr


@pytest.mark.parametrize("job,gpus,required", [
    ("tests.sbatch", None, ""), ("tests.sbatch", "0", ""), ("tests.sbatch", "2", "1"),
    ("compare_gpu.sbatch", "4", "1")])
def test_jobs_on_gpu_nodes_require_the_gpu(tmp_path, job, gpus, required):
    """On a GPU allocation the jobs export MPICOLL_REQUIRE_GPU=1 (a broken CuPy fails the
    GPU tests instead of skipping them) and the tests job takes the CuPy virtualenv; on a
    CPU allocation the tests job sets neither. No SLURM needed: the jobs run up to
    jobs/env.sh, here a stand-in (MPICOLL_ROOT) that prints what they exported."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "env.sh").write_text(
        'echo "require=${MPICOLL_REQUIRE_GPU:-} venv=${MPICOLL_VENV:-} '
        'needs=${MPICOLL_NEEDS:-}"; exit 0\n')
    env = _plain_env(MPICOLL_ROOT=str(tmp_path), SLURM_JOB_ID="1",
                     **_fake_nvidia_smi(tmp_path, 4))
    env.pop("MPICOLL_REQUIRE_GPU", None)
    env.pop("MPICOLL_VENV", None)
    if gpus is not None:
        env.update(SLURM_GPUS_ON_NODE=gpus, SLURM_NTASKS_PER_NODE=gpus)
    done = subprocess.run(["bash", str(ROOT / "jobs" / job)], env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    venv, needs = (".venv-gpu", "cupy") if required else ("", "")
    if job == "compare_gpu.sbatch":  # (its plots: a Python without matplotlib fails first)
        needs += ", matplotlib"
    assert done.stdout.strip() == f"require={required} venv={venv} needs={needs}"


def _free_ports(count: int) -> int:
    """A base port with ``count`` free ports from it (slurmctld, then each slurmd)."""
    for base in range(17100, 30000, 7):
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free ports")


def _why_not() -> str | None:
    if os.environ.get("MPICOLL_SLURM") == "0":
        return "MPICOLL_SLURM=0 leaves SLURM out"
    if sys.platform != "linux":
        return "SLURM's daemons run on Linux"
    if os.geteuid() != 0:
        return "slurmd must run as root (run the suite as root, as CI does)"
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "munged") if not shutil.which(c)]
    if missing:
        return f"{', '.join(missing)} not installed (bash scripts/slurm-cluster.sh install)"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = _why_not()
    required = os.environ.get("MPICOLL_REQUIRE_SLURM") == "1"
    if why:
        if required:
            pytest.fail(f"MPICOLL_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    state = tmp_path_factory.mktemp("slurm")
    env = _plain_env(MPICOLL_SLURM_DIR=str(state), MPICOLL_SLURM_PORT=str(_free_ports(3)))
    # the daemons leave pytest's process group: a run ended by its bound (timeout's
    # SIGTERM) stops them too, as a KeyboardInterrupt (pytest ends the session and runs
    # the fixtures' teardowns)
    terminated = signal.signal(signal.SIGTERM, _terminated)
    try:
        try:
            started = subprocess.run(["bash", str(CLUSTER), "start"], env=env,
                                     capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as exc:
            started = subprocess.CompletedProcess(exc.cmd, 124, "", f"{exc}")
        if started.returncode != 0:  # (what it started before failing is stopped below)
            message = f"the SLURM cluster did not start:\n{started.stderr[-3000:]}"
            if required:
                pytest.fail(message)
            pytest.skip(message)
        env["SLURM_CONF"] = started.stdout.strip().splitlines()[-1]
        yield env
    finally:  # (the handler back first: a second TERM must not cut stop short)
        signal.signal(signal.SIGTERM, terminated)
        subprocess.run(["bash", str(CLUSTER), "stop"], env=env, timeout=60)
        pids = list(state.glob("*.pid"))
        assert not pids, f"left running: {pids}"


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping the SLURM cluster")


def _submit(cluster, tmp_path, script: str, *args: str, sbatch: tuple[str, ...] = (),
            timeout: int = 300, **variables: str) -> tuple[int, str, Path]:
    """Submit a job of jobs/ and wait for it (``sbatch_wait``), from ``tmp_path`` as from a checkout
    (a results/ folder there; MPICOLL_ROOT names the real one) with the job's own
    ``--output``; its exit status, its log (results/<jobname>-<jobid>.out) and stderr,
    and its results folder."""
    submit_dir = tmp_path / "submit"
    (submit_dir / "results").mkdir(parents=True, exist_ok=True)
    env = {**cluster, "MPICOLL_ROOT": str(ROOT), "MPICOLL_RESULTS": str(tmp_path / "results"),
           **variables}
    done = sbatch_wait(["-t", "5", *sbatch, str(ROOT / "jobs" / script), *args],
                       cwd=submit_dir, env=env, timeout=timeout)
    job_id = done.stdout.strip().split(";")[0]
    logs = list((submit_dir / "results").glob(f"*-{job_id}.out")) if job_id else []
    output = logs[0].read_text() if logs else ""
    output += done.stderr
    assert not list(submit_dir.glob("*.out")), "a log outside results/"
    folders = list((tmp_path / "results").glob(f"*-{job_id}")) if job_id else []
    return done.returncode, output, folders[0] if folders else tmp_path / "missing"


def test_compare_cpu_on_two_nodes(cluster, tmp_path):
    status, output, results = _submit(
        cluster, tmp_path, "compare_cpu.sbatch", "-w", "1",
        MPICOLL_MAX_BYTES="1K", MPICOLL_ITERS="2")
    assert status == 0, output
    # its steps bounded by its -t 5 (300 s) less 30 s, as squeue tells the time left
    bound = re.search(r"steps bounded at (\d+) s", output)
    assert bound and 200 <= int(bound[1]) <= 270, output
    with open(results / "bench.json") as f:
        header = json.load(f)["header"]
    assert header["slurm_nodes"] == ["c1", "c2"] and header["ranks"] == 4, header
    assert header["nodes"] == [2, 2], header  # mpicoll's node-aware algorithms see them too
    with open(results / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    for collective in RECORDS:
        names = {r["algorithm"] for r in rows if r["collective"] == collective}
        assert names == set(_algorithm_names(collective, "all")), collective
    assert {r["collective"] for r in rows if r["algorithm"] == "hierarchical"} >= {
        "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"}
    assert rows and all(r["wrong"] == "0" for r in rows)
    summary = (results / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == \
        [f"fastest algorithm, {c}" for c in RECORDS]
    for png in ("bench.png", "bench-model.png"):
        assert (results / png).read_bytes().startswith(PNG)


def test_compare_cpu_takes_collectives_algorithms_and_arguments(cluster, tmp_path):
    status, output, results = _submit(
        cluster, tmp_path, "compare_cpu.sbatch", "-e", "64", sbatch=("-N", "2", "-n", "3"),
        MPICOLL_COLLECTIVES="all_reduce,all_gather", MPICOLL_ALGOS="ring,native",
        MPICOLL_ITERS="2", MPICOLL_WARMUP="1")
    assert status == 0, output
    with open(results / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["collective"], r["algorithm"]) for r in rows} == {
        (c, a) for c in ("all_reduce", "all_gather") for a in ("mpi_library", "ring", "native")}
    assert max(int(r["size"]) for r in rows) <= 64  # the job's -e 64 wins over the default
    assert "3 ranks" in output


def test_scaling_over_ranks_and_nodes(cluster, tmp_path):
    status, output, results = _submit(
        cluster, tmp_path, "scaling.sbatch", "-w", "1",
        MPICOLL_SIZE="4K", MPICOLL_ITERS="2", MPICOLL_ALGOS="ring,recursive_doubling,native")
    assert status == 0, output
    ranks = sorted(int(p.stem.split("-")[1]) for p in results.glob("ranks-*.json"))
    assert ranks == [1, 2, 4]
    with open(results / "ranks-4.json") as f:
        assert json.load(f)["header"]["slurm_nodes"] == ["c1", "c2"]
    with open(results / "scaling.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["algorithm"], int(r["ranks"])) for r in rows} == {
        (a, p) for a in ("mpi_library", "ring", "recursive_doubling", "native") for p in ranks}
    assert all(r["wrong"] == "0" for r in rows)
    assert all(float(r["predicted_us"]) > 0 for r in rows if r["ranks"] != "1")
    assert (results / "scaling.png").read_bytes().startswith(PNG)


def test_tests_job_across_nodes(cluster, tmp_path):
    status, output, results = _submit(cluster, tmp_path, "tests.sbatch", "-k", "all_reduce and ring")
    assert status == 0, output
    assert "on c[1-2]: 4 tasks" in output
    report = (results / "tests.txt").read_text()
    assert re.search(r"\d+ passed", report) and "failed" not in report


def test_examples_job_across_nodes(cluster, tmp_path):
    """Every example, each checking its own result, with its ranks on both nodes; mesh_mlp
    finds its tp groups inside a node (the nodes seen as SLURM's)."""
    import pkgutil

    import mpicoll.examples

    status, output, results = _submit(cluster, tmp_path, "examples.sbatch", timeout=600)
    assert status == 0, output
    assert "# every example passed" in output
    names = [m.name for m in pkgutil.iter_modules(mpicoll.examples.__path__)
             if not m.name.startswith("_")]
    assert names and all((results / f"{name}.txt").is_file() for name in names), names
    assert "nodes [[0, 1], [2, 3]]: every tp group inside one node" in \
        (results / "mesh_mlp.txt").read_text()
    status, output, _ = _submit(cluster, tmp_path, "examples.sbatch",
                                MPICOLL_EXAMPLES="quickstart no_such_example")
    assert status != 0 and "no example 'no_such_example'" in output, output


def test_a_failing_test_fails_the_tests_job(cluster, tmp_path):
    status, output, _ = _submit(cluster, tmp_path, "tests.sbatch", "-k", "no_such_test_anywhere")
    assert status != 0  # pytest collects nothing: exit 5 on every rank


def _fake_nvidia_smi(tmp_path, gpus: int) -> dict[str, str]:
    """PATH with an nvidia-smi that lists ``gpus`` GPUs (none: "No devices were found")."""
    folder = tmp_path / f"nvidia-smi-{gpus}"
    folder.mkdir()
    listing = "".join(f"echo 'GPU {i}: Fake GPU (UUID: GPU-{i})'\n" for i in range(gpus))
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + (listing or "echo 'No devices were found'; exit 6\n"))
    tool.chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_compare_gpu_submission_and_refusals(cluster, tmp_path):
    """Each refusal comes before anything is installed; CuPy is installed only on a node
    with a GPU, and then into the job's own virtualenv, never the shared .venv."""
    script = str(ROOT / "jobs" / "compare_gpu.sbatch")
    test_only = subprocess.run(["sbatch", "--test-only", script], cwd=ROOT, env=cluster,
                               capture_output=True, text=True, timeout=30)
    assert test_only.returncode == 0 and "to start at" in test_only.stderr, test_only.stderr
    own_venv = tmp_path / "gpu-venv"
    python = {"MPICOLL_PYTHON": sys.executable}
    no_python = {"MPICOLL_PYTHON": os.path.join(sys.base_prefix, "bin", "python3")}
    try:
        import cupy  # noqa: F401

        cupy_here = "CuPy sees no GPU on c1"
    except ImportError:
        cupy_here = "cannot import mpicoll, mpi4py, cupy"
    four_gpus = _fake_nvidia_smi(tmp_path, 4)
    cases = [
        (("--gpus-per-node=0",), {}, "no GPUs in this allocation"),
        (("--ntasks-per-node=8", "--gpus-per-node=4"), {}, "one rank per GPU"),
        ((), {"MPICOLL_BACKENDS": "nccl gloo"}, "'gloo' is not nccl or mpi"),
        ((), _fake_nvidia_smi(tmp_path, 0), "nvidia-smi lists 0 GPU(s) on c1 for 4 rank(s)"),
        ((), {**_fake_nvidia_smi(tmp_path, 2)}, "nvidia-smi lists 2 GPU(s) on c1"),
        ((), {**four_gpus, **no_python}, "cannot import mpicoll, mpi4py, cupy"),
        ((), {**four_gpus, **python}, cupy_here),
    ]
    if shutil.which("nvidia-smi", path=_plain_env()["PATH"]) is None:
        cases.append(((), {}, "no nvidia-smi on c1: no NVIDIA driver there"))
    for sbatch, variables, message in cases:
        status, output, _ = _submit(cluster, tmp_path, "compare_gpu.sbatch", sbatch=sbatch,
                                    MPICOLL_VENV=str(own_venv), **variables)
        assert status == 2 and message in output, (sbatch, variables, output)
        assert not own_venv.exists(), "installed before every check had passed"
    # a GPU listed and no Python given: the job's own virtualenv is built, not the shared
    # .venv (offline here, so pip fails and the job says where pip's output is)
    shared = sorted(p.name for p in (ROOT / ".venv").glob("lib/python*/site-packages/*"))
    status, output, _ = _submit(cluster, tmp_path, "compare_gpu.sbatch",
                                MPICOLL_VENV=str(own_venv), PIP_NO_INDEX="1", **four_gpus)
    assert status == 2, output
    assert f"building {own_venv} with .[mpich,test,cuda12]" in output
    assert f"could not build {own_venv} with .[mpich,test,cuda12]" in output
    assert (own_venv / "setup.log").exists() and (own_venv / "bin" / "python").exists()
    assert sorted(p.name for p in (ROOT / ".venv").glob("lib/python*/site-packages/*")) == shared


def test_a_job_submitted_from_the_checkout_logs_into_its_results(cluster):
    """The user's way: sbatch from the checkout's root, nothing set; the log is
    results/<jobname>-<jobid>.out there, none in the root."""
    before = set(ROOT.glob("*.out"))
    done = sbatch_wait(["-t", "5", "--gpus-per-node=0", "jobs/compare_gpu.sbatch"],
                       cwd=ROOT, env=cluster, timeout=120)
    job_id = done.stdout.strip().split(";")[0]
    log = ROOT / "results" / f"mpicoll-compare-gpu-{job_id}.out"
    try:
        assert done.returncode == 2, done.stderr
        assert "no GPUs in this allocation" in log.read_text()
        assert set(ROOT.glob("*.out")) == before
    finally:
        log.unlink(missing_ok=True)


def test_an_impossible_request_fails_at_once(cluster):
    done = subprocess.run(["sbatch", "-N", "3", "--wrap", "true"], env=cluster,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "Node count specification invalid" in done.stderr
