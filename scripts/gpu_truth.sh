#!/usr/bin/env bash
# Every GPU path on a real GPU, in one bounded run (issue 26): the GPU tests at 1, 2 and 4
# ranks (MPI ranks share one GPU; NCCL at as many ranks as GPUs), scripts/gpu_truth.py's
# checks and figures, the benchmark on CuPy buffers (MPI staged, every algorithm; NCCL at
# 1 rank) against NumPy buffers, and the examples. Each step has its own timeout, and a
# step that would start past MPICOLL_GPU_BUDGET seconds is skipped (said so), so the run
# ends inside a lease. Logs go to $OUT (or ./gpu-truth).
#
# The machine needs CuPy and a CUDA driver; mpich, mpi4py and pytest-mpi, if missing,
# come as wheels in .whl/ (installed into a venv that sees the system's packages).
#     MPICOLL_GPU_STEPS="tests1 tests2 ..." picks steps (default: all, in this order).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-truth}
mkdir -p "$OUT"
LOG=$OUT/log.txt
BUDGET=${MPICOLL_GPU_BUDGET:-420}
START=$(date +%s)
STEPS=${MPICOLL_GPU_STEPS:-"facts tests1 truth tests2 bench nccl tests4 api examples"}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MPICOLL_TIMEOUT=${MPICOLL_TIMEOUT:-60}
export MPICOLL_REQUIRE_GPU=1

say() { echo "$*" | tee -a "$LOG"; }
PY=python3
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    # (python3 may itself be a venv's, whose packages --system-site-packages would not
    # see: its site-packages join the new venv's through a .pth file, after its own)
    python3 -m venv /tmp/gpu-venv \
        && python3 -c "import site; print(site.getsitepackages()[0])" \
            >"$(/tmp/gpu-venv/bin/python -c 'import site; print(site.getsitepackages()[0])')/base.pth" \
        && /tmp/gpu-venv/bin/python -m pip install -q --no-index --no-deps --no-compile \
            .whl/*.whl >>"$LOG" 2>&1 \
        && PY=/tmp/gpu-venv/bin/python
fi
MPIEXEC=$(dirname "$(command -v "$PY")")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=$(command -v mpiexec || echo mpiexec)
# NCCL's wheel, for cupy.cuda.nccl, where CuPy does not find it itself
NCCL_LIB=$($PY -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$NCCL_LIB" ] && export LD_LIBRARY_PATH=$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PYTEST=(-m mpi4py -m pytest --with-mpi -q -rfEs -p no:cacheprovider)
status=0

step() {  # step NAME TIMEOUT COMMAND...
    local name=$1 limit=$2 elapsed rc
    shift 2
    case " $STEPS " in *" $name "*) ;; *) return 0 ;; esac
    elapsed=$(( $(date +%s) - START ))
    if [ $(( elapsed + limit / 3 )) -gt "$BUDGET" ]; then
        say "== $name: SKIPPED (at ${elapsed} s of a ${BUDGET} s budget)"
        return 0
    fi
    [ $(( elapsed + limit )) -gt "$BUDGET" ] && limit=$(( BUDGET - elapsed ))
    say "== $name (at ${elapsed} s, limit ${limit} s): $*"
    local t0; t0=$(date +%s)
    timeout -k 5 "$limit" "$@" >>"$LOG" 2>&1
    rc=$?
    say "== $name: rc=$rc in $(( $(date +%s) - t0 )) s"
    [ "$rc" = 0 ] || status=1
}

step facts 60 bash -c "nvidia-smi -L; $PY scripts/gpu_truth.py facts"
step tests1 150 $PY "${PYTEST[@]}" tests/test_gpu.py
TRUTH=${MPICOLL_GPU_TRUTH:-staging nccl device profile}  # scripts/gpu_truth.py's parts
step truth 120 bash -c "$PY scripts/gpu_truth.py $TRUTH \
    && $MPIEXEC -n 2 $PY scripts/gpu_truth.py device profile"
step tests2 150 $MPIEXEC -n 2 $PY "${PYTEST[@]}" -m mpi tests/test_gpu.py
# every all_reduce algorithm at 2 ranks, CuPy (staged) then NumPy buffers, 16 B..256 MiB
step bench 200 bash -c "for b in cupy numpy; do echo \"## --buffer \$b\"; \
    $MPIEXEC -n 2 $PY -m mpicoll.bench all_reduce --buffer \$b -b 16 -e 256M -f 8 -n 5 -w 1 \
    --algo all || exit 1; done"
step nccl 60 $PY -m mpicoll.bench all_reduce --backend nccl --buffer cupy -b 8 -e 256M -f 8 \
    -n 20 -w 3 --algo all
step tests4 180 $MPIEXEC -n 4 $PY "${PYTEST[@]}" -m mpi tests/test_gpu.py
step api 60 env MPICOLL_REQUIRE_GPU_API=1 $PY "${PYTEST[@]}" tests/test_gpu_api.py
step examples 120 $PY "${PYTEST[@]}" tests/test_examples.py
say "== gpu_truth: status $status after $(( $(date +%s) - START )) s"
exit "$status"
