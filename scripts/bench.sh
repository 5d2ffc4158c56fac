#!/usr/bin/env bash
# The main job: every all_reduce algorithm against the MPI library's own Allreduce over a
# sweep of sizes, printing time and bus bandwidth per size and algorithm.
# NP ranks (default 2); further arguments go to `python -m mpicoll.bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
NP=${NP:-2}
exec timeout -k 10 "${MPICOLL_BENCH_TIMEOUT:-1800}" .venv/bin/mpiexec -n "$NP" \
    .venv/bin/python -m mpi4py -m mpicoll.bench all_reduce -b 8 -e 64M -f 8 "$@"
