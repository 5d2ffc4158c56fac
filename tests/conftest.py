"""Shared fixtures, and a report header naming the MPI library and the number of ranks."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for `import reference`

# "auto" must not depend on a tuning or model file a user wrote in ~/.config: the suite
# reads none unless these are set on purpose (the tuning tests point them at their own)
os.environ.setdefault("MPICOLL_TUNING", os.devnull + ".mpicoll-tuning-none")
os.environ.setdefault("MPICOLL_MODEL", os.devnull + ".mpicoll-model-none")


def _under_mpi(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False) or
                config.getoption("--only-mpi", default=False))


# the files that take longest first: on the suite's two workers (scripts/test.sh: --dist
# loadfile --no-loadscope-reorder, which keeps this order) each starts at once and the
# other files fill in around them; xdist's own order (most tests first) started the SLURM
# and hang jobs, few tests and minutes of waiting, last, to run on alone at the end
LONGEST_FIRST = ("test_slurm.py", "test_hangs.py", "test_local.py", "test_examples.py")


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # (stable)


def pytest_report_header(config):
    import numpy

    import mpicoll

    lines = [f"mpicoll {mpicoll.__version__}, numpy {numpy.__version__}"]
    if _under_mpi(config):
        import mpi4py
        from mpi4py import MPI

        vendor = MPI.Get_library_version().splitlines()[0].strip()
        lines.append(f"mpi4py {mpi4py.__version__}, {vendor}, "
                     f"{MPI.COMM_WORLD.Get_size()} rank(s)")
    return lines


@pytest.fixture(scope="session")
def world():
    """mpicoll's Communicator on MPI.COMM_WORLD."""
    from mpi4py import MPI

    import mpicoll

    return mpicoll.Communicator(MPI.COMM_WORLD)
