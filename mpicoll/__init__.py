"""mpicoll: collective operations with named algorithms, over MPI point-to-point messages.

    from mpicoll import Communicator
    comm = Communicator()                      # MPI.COMM_WORLD
    total = comm.all_reduce(x, "sum", algorithm="ring")

See ``mpicoll.algorithms`` for the algorithms and their costs.

The package, by what each part is:

    communicator, plan, work, p2p, groups, dist, bucketer   the API
    spec                 one description per collective, read by every layer
    pipeline/            a call's stages: entry, validate, agree, choose, run, decided
    algorithms/          one file per collective, its algorithms side by side
    backends/            a Backend per library, and the libraries' own collectives
    selection/           what "auto" picks: tuning files, the cost model, MPICH's rules
    transport/           moving bytes: MPI, NCCL, local threads
    buffers/             NumPy/CuPy/DLPack arrays, flat views and bounds, CUDA staging
    observe/             the watchdog, flight recorder, traces, hang reports, aborts
    model/, bench/, viz, trace, examples/                    tools above the runtime
"""

from . import _moved
from .algorithms import COLLECTIVES
from .bucketer import Bucketer
from .communicator import BACKENDS, Communicator, algorithms
from .errors import (
    AbortedError,
    CollectiveError,
    CollectiveTimeoutError,
    ConcurrentCallError,
    ConfigError,
    InvalidArgumentError,
    MismatchError,
    MpicollError,
    OpError,
    RemoteError,
    SettingMismatchError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from .observe.abort import abort_on_exception
from .ops import Op, ReduceOp, loc_dtype, reduce_local
from .p2p import ANY, P2POp, Request, Status
from .plan import Plan
from .work import Work

_moved.install()  # the flat layout's module names still import (mpicoll._moved)


def __getattr__(name: str) -> object:
    return _moved.attribute(name)  # mpicoll.watchdog and the like, as attributes too


__version__ = "0.1.0"

__all__ = [
    "ANY",
    "BACKENDS",
    "Bucketer",
    "COLLECTIVES",
    "AbortedError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "ConcurrentCallError",
    "ConfigError",
    "Communicator",
    "InvalidArgumentError",
    "MismatchError",
    "MpicollError",
    "OpError",
    "Op",
    "P2POp",
    "Plan",
    "ReduceOp",
    "RemoteError",
    "SettingMismatchError",
    "Request",
    "Status",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
    "Work",
    "__version__",
    "abort_on_exception",
    "algorithms",
    "loc_dtype",
    "reduce_local",
]
