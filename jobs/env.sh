#!/usr/bin/env bash
# Sourced by every job: a virtual environment with mpicoll and the MPICH wheel, unless
# MPICOLL_PYTHON names a Python that already has mpicoll against the site's MPI.
set -euo pipefail
MPICOLL_ROOT=${MPICOLL_ROOT:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}}
if [ -n "${MPICOLL_PYTHON:-}" ]; then
    PYTHON=$MPICOLL_PYTHON
else
    bash "$MPICOLL_ROOT/scripts/setup.sh"
    PYTHON=$MPICOLL_ROOT/.venv/bin/python
fi
"$PYTHON" -c "import mpicoll" || { echo "env.sh: $PYTHON cannot import mpicoll" >&2; exit 1; }
export PYTHON MPICOLL_ROOT
# srun --mpi=pmi2 is what the MPICH wheel speaks; MPICOLL_LAUNCH=mpiexec for a site MPI
MPICOLL_LAUNCH=${MPICOLL_LAUNCH:-"srun --mpi=pmi2"}
export MPICOLL_LAUNCH
