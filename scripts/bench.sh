#!/usr/bin/env bash
# The main job: every all_reduce algorithm against the MPI library's own Allreduce over a
# sweep of sizes, printing time and bus bandwidth per size and algorithm.
# NP ranks (default 2); further arguments go to `python -m mpicoll.bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
NP=${NP:-2}
TIMEOUT=${MPICOLL_BENCH_TIMEOUT:-1800}  # (as timeout(1) takes it: 1800, 30m, 0 for none)
# mpicoll's watchdog, per call, well under the run's bound: a hang ends with its report
# (rank, call, peer) instead of the run's bare exit 124 (a bound in whole seconds: a
# quarter of it, 10 to 300 s; else 300 s)
if [ -z "${MPICOLL_TIMEOUT:-}" ]; then
    case "$TIMEOUT" in
        '' | *[!0-9]*) MPICOLL_TIMEOUT=300 ;;
        0) MPICOLL_TIMEOUT=300 ;;
        *) MPICOLL_TIMEOUT=$(( TIMEOUT / 4 < 10 ? 10 : TIMEOUT / 4 > 300 ? 300 : TIMEOUT / 4 )) ;;
    esac
    export MPICOLL_TIMEOUT
fi
exec timeout -k 10 "$TIMEOUT" .venv/bin/mpiexec -n "$NP" \
    .venv/bin/python -m mpi4py -m mpicoll.bench all_reduce -b 8 -e 64M -f 8 "$@"
