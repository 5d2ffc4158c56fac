#!/usr/bin/env bash
# Prepare .venv with mpicoll and the embedded MPICH from PyPI: `.[mpich,test]` (or the
# extras in MPICOLL_EXTRAS, e.g. mpich,test,cuda12).
# Idempotent; every command of the README runs it first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# two jobs (or a job and a shell) setting up the same checkout take turns
if command -v flock >/dev/null; then
    exec 9>.venv.lock
    flock 9
fi

# a .venv without a working pip (made by hand where ensurepip was missing, or cut short):
# its pip put back where it can be; made again only where it serves nothing (no python,
# or neither pip nor mpicoll and mpi4py)
if [ -e .venv ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    .venv/bin/python -m ensurepip --upgrade >/dev/null 2>&1 || true
    if ! .venv/bin/python -m pip --version >/dev/null 2>&1 && \
            ! .venv/bin/python -c "import mpicoll, mpi4py" >/dev/null 2>&1; then
        echo "setup: .venv has neither a working pip nor mpicoll; making it again" >&2
        rm -rf .venv
    fi
fi
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -m venv .venv >/dev/null 2>&1; then
        # Debian's python3 has no venv module (ensurepip) until python3-venv is installed
        rm -rf .venv
        SUDO=""
        if [ "$(id -u)" != 0 ]; then
            sudo -n true 2>/dev/null || {
                echo "setup: $PYTHON cannot make a virtual environment (no venv/ensurepip);" \
                     "as root run: apt-get install python3-venv, then run this again" >&2
                exit 1; }
            SUDO="sudo -n"
        fi
        echo "setup: installing python3-venv (Debian) ..." >&2
        $SUDO apt-get update -qq
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        "$PYTHON" -m venv .venv
    fi
fi
# pip's and setuptools' chatter ("Editable installation ..." warnings) goes to a log, so
# a job's output starts with its own lines; a failed install says where its log is (the
# import check below decides whether the environment still serves, e.g. offline)
log=.venv/setup.log
: >"$log"  # (each step appends: a failed step's output stays for the one after it)
quiet_pip() {
    echo "== pip install $*" >>"$log"
    .venv/bin/python -m pip install -q --disable-pip-version-check "$@" >>"$log" 2>&1 \
        || echo "setup: pip install $* failed; its output: $log" >&2
}
quiet_pip --upgrade pip
quiet_pip -e ".[${MPICOLL_EXTRAS:-mpich,test}]"
.venv/bin/python -c "import mpicoll, mpi4py; from mpi4py import MPI" \
    || { echo "setup: mpicoll or mpi4py does not import" >&2; exit 1; }
# what the extras asked for and the README's commands use (a failed pip step above only
# said so; an older .venv may still serve, or not)
case ",${MPICOLL_EXTRAS:-mpich,test}," in *,mpich,*)
    [ -x .venv/bin/mpiexec ] \
        || { echo "setup: .venv/bin/mpiexec is missing (the mpich extra); see $log" >&2; exit 1; } ;;
esac
case ",${MPICOLL_EXTRAS:-mpich,test}," in *,test,*)
    { .venv/bin/python -c "import pytest, pytest_mpi, matplotlib" 2>/dev/null \
        && [ -x .venv/bin/ruff ]; } \
        || { echo "setup: the test extra (pytest, pytest-mpi, ruff, matplotlib) is not all there; see $log" >&2
             exit 1; } ;;
esac
# MPICH's mpiexec (hydra) reaches its proxies by this machine's name
getent hosts "$(hostname)" >/dev/null 2>&1 \
    || echo "setup: warning: this machine's name ($(hostname)) does not resolve; mpiexec may fail (add it to /etc/hosts)" >&2
