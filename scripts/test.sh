#!/usr/bin/env bash
# The whole test suite: lint, pytest at 1 rank on two workers (local transport, units, MPI
# at 1 rank, the real CuPy/NCCL APIs), then the MPI tests under mpiexec at 2, 3, 4 and 5
# ranks (at 8: the conformance files), and with simulated nodes (MPICOLL_RANKS_PER_NODE),
# each under a timeout. The run at 1 rank includes tests/test_slurm.py: the jobs/ scripts
# on a two-node SLURM cluster that it starts on this host (scripts/slurm-cluster.sh).
# A failing rank aborts its job (python -m mpi4py), so nothing hangs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=.venv/bin/python

# The real CuPy and NCCL wheels (about 490 MB, no GPU needed) for tests/test_gpu_api.py,
# which checks mpicoll against their Python APIs; once installed its tests must run, not
# skip. MPICOLL_GPU_API=0 leaves them out (they then skip, with the reason).
if [ "${MPICOLL_GPU_API:-1}" != 0 ] && $PY -c "import cupy, nvidia.nccl" \
        >/dev/null 2>&1; then
    echo "== CuPy and NCCL wheels: installed (a second run needs no network)"
    export MPICOLL_REQUIRE_GPU_API=${MPICOLL_REQUIRE_GPU_API:-1}
elif [ "${MPICOLL_GPU_API:-1}" != 0 ]; then
    echo "== pip install -e .[gpu_api] (CuPy and NCCL wheels)"
    # (pip's own status decides: a failed download stops here, with pip's words)
    if ! $PY -m pip install -q --disable-pip-version-check -e ".[gpu_api]" \
            >.venv/gpu_api.log 2>&1; then
        grep -v "^WARNING: Location" .venv/gpu_api.log >&2 || true
        echo "== pip install -e .[gpu_api] failed (MPICOLL_GPU_API=0 leaves the CuPy/NCCL API tests out)" >&2
        exit 1
    fi
    grep -v "^WARNING: Location" .venv/gpu_api.log || true
    export MPICOLL_REQUIRE_GPU_API=${MPICOLL_REQUIRE_GPU_API:-1}
fi
MPIEXEC=.venv/bin/mpiexec
# each run under its bound, in timeout's own process group: Ctrl-C (or a TERM to this
# script) stops that group too, pytest and every rank, and then the script
bounded() {
    timeout -k 10 "$TIMEOUT" "$@" &
    local pid=$! status=0
    trap 'kill -TERM -- -'"$pid"' 2>/dev/null; exit 130' INT
    trap 'kill -TERM -- -'"$pid"' 2>/dev/null; exit 143' TERM
    wait "$pid" || status=$?
    trap - INT TERM
    return "$status"  # (the run's own status, in any context: set -e stops on it here)
}
RANKS=${MPICOLL_TEST_RANKS:-"2 3 4 5 8"}
TIMEOUT=${MPICOLL_TEST_TIMEOUT:-600}
# mpicoll's own watchdog, well under the per-run timeout: a hang ends with its report
# (rank, call, collective, peer) instead of the run's bare exit 124. Tests that need
# another value set their own.
HALF=$(( TIMEOUT / 2 ))
export MPICOLL_TIMEOUT=${MPICOLL_TIMEOUT:-$(( HALF < 300 ? HALF : 300 ))}
echo "== MPICOLL_TIMEOUT=$MPICOLL_TIMEOUT (per-run timeout $TIMEOUT s)"

# SLURM for tests/test_slurm.py (Debian packages, as root): its tests must run, not skip.
# As root a failed install is an error (MPICOLL_SLURM=0 leaves SLURM out on purpose);
# only a user without root skips them, and says so.
if [ "$(id -u)" = 0 ] && [ "${MPICOLL_SLURM:-1}" != 0 ]; then
    bash scripts/slurm-cluster.sh install \
        || { echo "== SLURM could not be installed (as root): failing" >&2; exit 1; }
    export MPICOLL_REQUIRE_SLURM=${MPICOLL_REQUIRE_SLURM:-1}
else
    echo "== SLURM left out (not root, or MPICOLL_SLURM=0): tests/test_slurm.py will skip" >&2
fi

echo "== ruff"
.venv/bin/ruff check mpicoll tests examples

# on two workers (pytest-xdist; each an MPI process of one rank), each test file on one of
# them (--dist loadfile: a file's fixtures, the SLURM cluster's, the hang jobs', in one
# process): most of these tests keep one core busy, the thread ranks' under one GIL, or
# wait (the SLURM jobs, the hang jobs' timeouts); one after another they took 7 minutes
WORKERS=${MPICOLL_TEST_WORKERS:-2}
echo "== pytest, MPI at 1 rank ($WORKERS workers)"
bounded $PY -m mpi4py -m pytest --with-mpi -q -rfEs -p no:cacheprovider \
    -n "$WORKERS" --dist loadfile --no-loadscope-reorder tests

# nodes simulated on this machine (MPICOLL_RANKS_PER_NODE): even (2 + 2) and uneven
# (3 + 2) nodes, so the hierarchical algorithms and the groups run with several nodes;
# at those rank counts the plain run leaves these files to the run with nodes
LAYOUTS="4:2 5:3"
NODE_FILES="tests/test_mpi.py tests/test_mpi_groups_p2p.py tests/test_mpi_dist.py
            tests/test_mpi_agreement.py tests/test_mpi_plans.py tests/test_model_fit.py
            tests/test_mpi_fuzz.py"
# above 5 ranks (8: three levels of every tree, 4x oversubscribed on two cores) the
# conformance files alone: every algorithm, dtype, op, shape and root against NumPy and
# MPI's own, and the agreement scenarios; what the other files test does not change
# with the rank count past 5, and at 8 they took 2 of the suite's minutes
WIDE_FILES="tests/test_mpi.py tests/test_mpi_agreement.py tests/test_scan.py
            tests/test_mpi_fuzz.py"
# the files with MPI tests (marked mpi) alone: every rank collects the others' 4000 tests
# to deselect them, 1.4 s a rank each run
MPI_FILES=$(grep -l "pytest.mark.mpi" tests/test_*.py | tr '\n' ' ')
for n in $RANKS; do
    if [ "$n" -gt 5 ]; then
        echo "== pytest under mpiexec -n $n (the conformance files: $WIDE_FILES)"
        # shellcheck disable=SC2086
        bounded $MPIEXEC -n "$n" $PY -m mpi4py -m pytest --with-mpi -m mpi \
            -q -rfEs -p no:cacheprovider $WIDE_FILES
        continue
    fi
    files=$MPI_FILES noted=""
    for layout in $LAYOUTS; do
        if [ "${layout%%:*}" = "$n" ]; then  # (NODE_FILES run with nodes, below)
            # shellcheck disable=SC2086
            files=$(for f in $MPI_FILES; do case " $(echo $NODE_FILES) " in *" $f "*) ;;
                    *) printf '%s ' "$f" ;; esac; done)
            noted=" (NODE_FILES: with simulated nodes, below)"
        fi
    done
    echo "== pytest under mpiexec -n $n$noted"
    # shellcheck disable=SC2086
    bounded $MPIEXEC -n "$n" $PY -m mpi4py -m pytest --with-mpi -m mpi \
        -q -rfEs -p no:cacheprovider $files
done
for layout in $LAYOUTS; do
    n=${layout%%:*} k=${layout##*:}
    case " $RANKS " in *" $n "*) ;; *) continue ;; esac  # (only rank counts asked for)
    echo "== pytest under mpiexec -n $n with MPICOLL_RANKS_PER_NODE=$k"
    # shellcheck disable=SC2086
    MPICOLL_RANKS_PER_NODE=$k bounded $MPIEXEC -n "$n" $PY -m mpi4py \
        -m pytest --with-mpi -m mpi -q -rfEs -p no:cacheprovider $NODE_FILES
done
echo "== all test runs passed"
