#!/usr/bin/env bash
# Sourced by every job in jobs/: prepares the environment and checks it, failing at once
# with a message that says what is wrong, before any rank starts.
#
#   MPICOLL_ROOT      the mpicoll checkout (default: $SLURM_SUBMIT_DIR, so submit from it)
#   MPICOLL_MODULES   site modules to `module load` first (e.g. "python/3.11 openmpi/4.1")
#   MPICOLL_PYTHON    a Python that already has mpicoll (built against the site's MPI);
#                     default: the Python of MPICOLL_VENV
#   MPICOLL_VENV      the virtualenv to use (default: the checkout's .venv; a relative path
#                     is taken from the checkout), made with .[$MPICOLL_EXTRAS] (default
#                     mpich,test: the MPICH wheel) when it cannot import what the job needs:
#                     the .venv by scripts/setup.sh, any other here (the GPU job's own,
#                     .venv-gpu, so CuPy never goes into the shared .venv)
#   MPICOLL_LAUNCHER  pmi2 (default: srun --mpi=pmi2, what the MPICH wheel speaks),
#                     pmix (srun --mpi=pmix, for an MPI built with PMIx), or mpiexec
#                     (the MPI library's own launcher, for a site MPI that wants it)
#   MPICOLL_RESULTS   where results/<jobname>-<jobid>/ is made (default: $MPICOLL_ROOT/results)
#   MPICOLL_TIMEOUT   mpicoll's watchdog, per call (default here 300 s, not the library's
#                     1800: a hung call ends with mpicoll's report inside the job's limit)
#   MPICOLL_STEP_TIMEOUT  each launch's own bound, in seconds (default: the job's time
#                     left at that launch, less 30 s, so the job's own --time bounds the
#                     run and a step cut short still says so; 1500 where squeue cannot
#                     tell it; examples.sbatch sets 240 for each of its 13 steps; the
#                     watchdog ends a hang first, this whatever else)
#
# After sourcing: $PYTHON, $MPICOLL_ROOT, $RESULTS (this job's results folder, created),
# and `launch [srun options --] command...`, which starts one rank per task.
set -euo pipefail

mpicoll_fail() { echo "mpicoll job: $*" >&2; exit 2; }

[ -n "${SLURM_JOB_ID:-}" ] || mpicoll_fail "not inside a SLURM job; submit with sbatch (see jobs/README.md)"
MPICOLL_ROOT=${MPICOLL_ROOT:-${SLURM_SUBMIT_DIR:-}}
[ -f "$MPICOLL_ROOT/jobs/env.sh" ] || mpicoll_fail "MPICOLL_ROOT=$MPICOLL_ROOT is not an mpicoll checkout; submit from the checkout's root or set MPICOLL_ROOT"

if [ -n "${MPICOLL_MODULES:-}" ]; then
    type module >/dev/null 2>&1 || mpicoll_fail "MPICOLL_MODULES is set but this node has no 'module' command"
    # shellcheck disable=SC2086
    module load $MPICOLL_MODULES || mpicoll_fail "module load $MPICOLL_MODULES failed"
fi

mpicoll_imports() { "$1" -c "import mpicoll, mpi4py.MPI${MPICOLL_NEEDS:+, $MPICOLL_NEEDS}" 2>/dev/null; }

# mpicoll_build_venv DIR EXTRAS: a virtualenv of its own at DIR with the checkout's
# .[EXTRAS] (pip's output in DIR/setup.log); two jobs building the same DIR take turns
mpicoll_build_venv() {
    local venv=$1 extras=$2
    mkdir -p "$(dirname "$venv")" || return 1
    (
        if command -v flock >/dev/null; then flock 9; fi
        mpicoll_imports "$venv/bin/python" && exit 0  # the job before this one made it
        echo "# mpicoll job: building $venv with .[$extras] (a few minutes, once)"
        "${MPICOLL_BASE_PYTHON:-python3}" -m venv "$venv" || exit 1
        echo "*" > "$venv/.gitignore"  # never committed, wherever it lies
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip \
            >"$venv/setup.log" 2>&1
        "$venv/bin/python" -m pip install -q --disable-pip-version-check \
            -e "$MPICOLL_ROOT[$extras]" >>"$venv/setup.log" 2>&1
    ) 9>"$venv.lock"
}

# the Python a venv is built with: MPICOLL_BASE_PYTHON, else the PYTHON the caller gave
# (as scripts/setup.sh takes it), else python3; PYTHON itself becomes the venv's below
MPICOLL_BASE_PYTHON=${MPICOLL_BASE_PYTHON:-${PYTHON:-python3}}
if [ -n "${MPICOLL_PYTHON:-}" ]; then
    PYTHON=$MPICOLL_PYTHON
else
    MPICOLL_VENV=${MPICOLL_VENV:-.venv}
    [[ "$MPICOLL_VENV" == /* ]] || MPICOLL_VENV=$MPICOLL_ROOT/$MPICOLL_VENV
    PYTHON=$MPICOLL_VENV/bin/python
    if ! mpicoll_imports "$PYTHON"; then
        if [ "$MPICOLL_VENV" = "$MPICOLL_ROOT/.venv" ]; then
            PYTHON=$MPICOLL_BASE_PYTHON MPICOLL_EXTRAS=${MPICOLL_EXTRAS:-mpich,test} \
                bash "$MPICOLL_ROOT/scripts/setup.sh" \
                || mpicoll_fail "scripts/setup.sh could not build $MPICOLL_ROOT/.venv"
        else
            mpicoll_build_venv "$MPICOLL_VENV" "${MPICOLL_EXTRAS:-mpich,test}" \
                || mpicoll_fail "could not build $MPICOLL_VENV with .[${MPICOLL_EXTRAS:-mpich,test}] (pip's output: $MPICOLL_VENV/setup.log)"
        fi
    fi
fi
mpicoll_imports "$PYTHON" || mpicoll_fail "$PYTHON cannot import mpicoll, mpi4py${MPICOLL_NEEDS:+, $MPICOLL_NEEDS}"

MPICOLL_LAUNCHER=${MPICOLL_LAUNCHER:-pmi2}
case "$MPICOLL_LAUNCHER" in
    pmi2 | pmix)
        command -v srun >/dev/null || mpicoll_fail "srun is not on PATH"
        # (the list read whole first: grep -q stopping at the first match could end srun
        # with SIGPIPE, a failed pipeline under pipefail)
        plugins=$(timeout 60 srun --mpi=list 2>&1 || true)
        grep -qw "$MPICOLL_LAUNCHER" <<<"$plugins" \
            || mpicoll_fail "this SLURM has no --mpi=$MPICOLL_LAUNCHER plugin ($(tr '\n' ' ' <<<"$plugins"))"
        ;;
    mpiexec)
        command -v mpiexec >/dev/null || [ -x "$(dirname "$PYTHON")/mpiexec" ] \
            || mpicoll_fail "MPICOLL_LAUNCHER=mpiexec but there is no mpiexec"
        getent hosts "$(hostname -s)" >/dev/null \
            || mpicoll_fail "mpiexec needs this node's name ($(hostname -s)) to resolve"
        ;;
    *) mpicoll_fail "MPICOLL_LAUNCHER=$MPICOLL_LAUNCHER: choose pmi2, pmix or mpiexec" ;;
esac

# The MPICH wheel under srun --mpi=pmi2 with its default UCX netmod puts each rank's UCX
# address (about 7 KB) through PMI-1 as nine long lines, which Slurm's pmi2 plugin
# (22.05 measured) now and then misreads ("value not properly terminated"), failing or
# hanging MPI_Init; OFI's addresses are a few bytes. So OFI, unless chosen otherwise.
if [ "$MPICOLL_LAUNCHER" = pmi2 ]; then
    export MPIR_CVAR_CH4_NETMOD=${MPIR_CVAR_CH4_NETMOD:-ofi}
fi

# the seconds this job has left (squeue's %L, [D-][HH:]MM:SS), or nothing where squeue
# cannot say (no limit, no squeue)
job_seconds_left() {
    local left
    left=$(timeout 30 squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null) || return 0
    if [[ "$left" =~ ^(([0-9]+)-)?(([0-9]+):)?([0-9]+):([0-9]+)$ ]]; then
        echo $(( ${BASH_REMATCH[2]:-0} * 86400 + 10#${BASH_REMATCH[4]:-0} * 3600
                 + 10#${BASH_REMATCH[5]} * 60 + 10#${BASH_REMATCH[6]} ))
    fi
}

# a launch's bound in seconds: MPICOLL_STEP_TIMEOUT where given, else the job's time left
# less 30 s (a step cut short by it says so before SLURM ends the job; at least 10 s: a
# job in its last minute still gets a bound of its own), else 1500
step_bound() {
    if [ -n "$STEP_TIMEOUT_GIVEN" ]; then
        echo "$MPICOLL_STEP_TIMEOUT"
        return
    fi
    local left
    left=$(job_seconds_left)
    if [ -z "$left" ]; then echo 1500; elif [ "$left" -gt 40 ]; then echo $((left - 30)); else echo 10; fi
}

# launch [srun options --] command...: one rank per task of the allocation, or the srun
# options' share of it (-n N for a step of N ranks). Options come first (a command never
# starts with "-"): a "--" later on, the command's own (pytest's), is left to it
launch() {
    local options=()
    if [[ "${1:-}" == -* ]]; then
        while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do options+=("$1"); shift; done
        [ "$#" -gt 0 ] || mpicoll_fail "launch: srun options (${options[*]}) without -- and a command"
        shift
    fi
    case "$MPICOLL_LAUNCHER" in
        pmi2 | pmix) timeout -k 10 "$(step_bound)" srun --mpi="$MPICOLL_LAUNCHER" "${options[@]}" "$@" ;;
        mpiexec)
            local n=${SLURM_NTASKS:-1} i
            for ((i = 0; i < ${#options[@]}; i++)); do  # mpiexec takes only the rank count
                case "${options[i]}" in -n | --ntasks) n=${options[i + 1]} ;; --ntasks=*) n=${options[i]#*=} ;; esac
            done
            local mpiexec
            mpiexec="$(dirname "$PYTHON")/mpiexec"  # (the venv's MPI first: another MPI's
            [ -x "$mpiexec" ] || mpiexec=$(command -v mpiexec || echo mpiexec)  # would start
            # N singletons)
            timeout -k 10 "$(step_bound)" "$mpiexec" -n "$n" "$@"
            ;;
    esac
}

export MPICOLL_TIMEOUT=${MPICOLL_TIMEOUT:-300}
STEP_TIMEOUT_GIVEN=${MPICOLL_STEP_TIMEOUT:+1}
if [ -n "$STEP_TIMEOUT_GIVEN" ]; then
    [[ "$MPICOLL_STEP_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || mpicoll_fail "MPICOLL_STEP_TIMEOUT=$MPICOLL_STEP_TIMEOUT: expected whole seconds above 0"
fi
RESULTS=${MPICOLL_RESULTS:-$MPICOLL_ROOT/results}/${SLURM_JOB_NAME:-job}-$SLURM_JOB_ID
# (a relative MPICOLL_RESULTS: from where the job was submitted, as its folder is made
# here; the jobs then cd to the checkout, where the relative path would name another)
[[ "$RESULTS" == /* ]] || RESULTS=$PWD/$RESULTS
mkdir -p "$RESULTS" || mpicoll_fail "cannot create $RESULTS"
export PYTHON MPICOLL_ROOT RESULTS MPICOLL_LAUNCHER
echo "# mpicoll job $SLURM_JOB_ID (${SLURM_JOB_NAME:-}) on ${SLURM_JOB_NODELIST:-?}: ${SLURM_NTASKS:-?} tasks, launcher $MPICOLL_LAUNCHER${MPIR_CVAR_CH4_NETMOD:+ (MPICH netmod $MPIR_CVAR_CH4_NETMOD)}, python $PYTHON, results in $RESULTS, steps bounded at $(step_bound) s${STEP_TIMEOUT_GIVEN:+ (MPICOLL_STEP_TIMEOUT)}"

# compare [bench arguments...]: every chosen collective x algorithm (and the library's own)
# over the size sweep, on all tasks; the table, CSV, JSON and plots into $RESULTS, and one
# line per collective naming the fastest algorithm per size range into $RESULTS/summary.txt.
#   MPICOLL_COLLECTIVES (all, or a comma list), MPICOLL_ALGOS (all, or a comma list),
#   MPICOLL_MIN_BYTES (8), MPICOLL_MAX_BYTES (16M), MPICOLL_FACTOR (8),
#   MPICOLL_ITERS (20), MPICOLL_WARMUP (3); arguments given to sbatch after the script
#   go to the benchmark last, so they win (e.g. -e 1G -d float64).
compare() {
    local status=0
    launch "$PYTHON" -m mpi4py -m mpicoll.bench "${MPICOLL_COLLECTIVES:-all}" \
        --algo "${MPICOLL_ALGOS:-all}" -b "${MPICOLL_MIN_BYTES:-8}" -e "${MPICOLL_MAX_BYTES:-16M}" \
        -f "${MPICOLL_FACTOR:-8}" -n "${MPICOLL_ITERS:-20}" -w "${MPICOLL_WARMUP:-3}" \
        --csv "$RESULTS/bench.csv" --json "$RESULTS/bench.json" --plot "$RESULTS/bench.png" \
        "$@" | tee "$RESULTS/bench.txt" || status=$?
    grep "^# fastest algorithm" "$RESULTS/bench.txt" | sed 's/^# //' > "$RESULTS/summary.txt" || true
    echo "# summary ($RESULTS/summary.txt):"
    cat "$RESULTS/summary.txt"
    return "$status"
}
