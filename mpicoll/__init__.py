"""mpicoll: collective operations with named algorithms, over MPI point-to-point messages.

    from mpicoll import Communicator
    comm = Communicator()                      # MPI.COMM_WORLD
    total = comm.all_reduce(x, "sum", algorithm="ring")

See ``mpicoll.algorithms`` for the algorithms and their costs.
"""

from .abort import abort_on_exception
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
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from .ops import Op, ReduceOp, loc_dtype, reduce_local
from .p2p import ANY, P2POp, Request
from .plan import Plan
from .work import Work

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
    "Request",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
    "Work",
    "__version__",
    "abort_on_exception",
    "algorithms",
    "loc_dtype",
    "reduce_local",
]
