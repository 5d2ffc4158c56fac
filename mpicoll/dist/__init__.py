"""torch.distributed's shape over mpicoll: the tutorials' code runs with one changed import.

    import mpicoll.dist as dist                     # instead of torch.distributed
    dist.init_process_group("mpi")                  # under mpiexec or srun
    dist.all_reduce(t, op=dist.ReduceOp.SUM)        # in place, as torch's
    group = dist.new_group([0, 1])

Every function takes torch's argument names and keeps its semantics: results land in the
tensors given (in place), ``src``/``dst``/``peer`` are ranks of the whole job (global
ranks, as torch's) even with ``group=``, ``async_op=True`` returns a ``Work`` whose
``wait()`` finishes the call. Tensors are NumPy arrays, CuPy arrays or torch tensors (CPU
or CUDA, through DLPack, without a copy). Each collective also takes ``algorithm=``
(mpicoll's algorithm names, default "auto").

What differs from torch: the job is started by an MPI launcher (mpiexec, srun), not by
torchrun's rendezvous (``init_method`` is accepted and ignored; torch's ``RANK`` and
``WORLD_SIZE``, when set, must agree with MPI's); backends are "mpi" (CPU and GPU
arrays; "gloo" and torch's per-device "cpu:gloo,cuda:nccl" are taken as "mpi") and
"nccl" (GPU arrays); ``recv`` needs ``src`` or
receives from any rank (not on "nccl") and returns the sender, as torch's;
``all_reduce_coalesced`` and ``all_gather_coalesced`` agree the ranks' lists of tensors
first, where torch's leave a mismatch unchecked; ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch's
desync checks) makes the groups in mpicoll's check mode. ``mpicoll.dist.device_mesh``
holds ``init_device_mesh`` and ``DeviceMesh``, as ``torch.distributed.device_mesh`` does.
"""

from __future__ import annotations

import datetime
import enum
import hashlib
import os
import pickle
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

from ..buffers import overlapping, overlaps_itself, writable
from ..buffers.arrays import as_array, cupy_module, is_cupy, module_of
from ..communicator import Communicator
from ..errors import (
    AbortedError,
    InvalidArgumentError,
    MismatchError,
    MpicollError,
    SettingMismatchError,
)
from ..groups import agreed_rows, split_lists
from ..observe.watchdog import DEFAULT_TIMEOUT, report
from ..p2p import ANY, Status
from ..p2p import P2POp as _P2POp
from ..pipeline.agree import op_text
from ..pipeline.state import (
    entering_done_callback,
    in_done_callback,
    leaving_done_callback,
    waits_for_itself,
)
from ..work import on_progress_thread

__all__ = [
    "Backend", "DebugLevel", "DeviceMesh", "DistBackendError", "DistError", "DistNetworkError",
    "DistStoreError", "Future", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "Work",
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object",
    "all_gather_single", "all_reduce", "all_reduce_coalesced", "all_to_all", "all_to_all_single",
    "barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list", "default_pg_timeout",
    "destroy_process_group", "gather", "gather_object", "get_backend", "get_backend_config",
    "get_debug_level", "get_default_backend_for_device", "get_global_rank", "get_group_rank",
    "get_node_local_rank", "get_pg_count", "get_process_group_ranks", "get_rank", "get_world_size",
    "group", "init_device_mesh", "init_process_group", "irecv", "is_available",
    "is_backend_available", "is_gloo_available", "is_initialized", "is_mpi_available",
    "is_nccl_available", "is_torchelastic_launched", "is_ucc_available", "is_xccl_available",
    "isend", "monitored_barrier", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "recv", "recv_object_list", "reduce", "reduce_op", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "send_object_list",
    "set_debug_level", "set_debug_level_from_env", "split_group", "supports_complex",
]


# torch's errors as mpicoll's, so that torch's callers' except clauses catch what mpicoll
# raises: DistError, any mpicoll error (a RuntimeError, as torch's); DistBackendError, a call ended by the watchdog's
# timeout or an abort (torch's NCCL watchdog raises it for those). mpicoll has no store
# and no network rendezvous of its own, so nothing raises the last two.
DistError = MpicollError
DistBackendError = AbortedError


class DistNetworkError(MpicollError):
    """torch's name; mpicoll's rendezvous is the MPI launcher's: never raised."""


class DistStoreError(MpicollError):
    """torch's name; mpicoll has no key-value store: never raised."""


# torch's default timeout of a process group's calls: what init_process_group's timeout=None
# gives here too where MPICOLL_TIMEOUT is not set (the watchdog's 1800 s)
default_pg_timeout = datetime.timedelta(seconds=DEFAULT_TIMEOUT)


class ReduceOp(enum.Enum):
    """torch.distributed.ReduceOp's members, as mpicoll's op names."""

    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


reduce_op = ReduceOp  # torch's deprecated name


class ProcessGroup:
    """A group of the job's ranks: its Communicator and the global rank of each member."""

    def __init__(self, comm: Communicator, ranks: list[int], asked: str | None = None) -> None:
        self.comm, self.ranks = comm, ranks
        if ranks != list(range(len(ranks))):  # its errors say the global ranks too
            comm._rank_names = list(ranks)
        self.asked = asked  # "gloo" where the group was asked for gloo (run over MPI)
        self._local = {g: i for i, g in enumerate(ranks)}

    def rank(self) -> int:
        return self.comm.rank

    def size(self) -> int:
        return self.comm.size

    def local(self, global_rank: int, name: str) -> int:
        """A global rank as this group's rank (torch's src/dst/peer are global)."""
        try:
            if isinstance(global_rank, (bool, np.bool_)) or not isinstance(
                    global_rank, (int, np.integer)):  # (1.0 and True hash as 1)
                raise TypeError
            return self._local[global_rank]
        except (KeyError, TypeError):
            raise InvalidArgumentError(
                f"{name}: rank {global_rank!r} is not in this group (ranks {self.ranks})") from None

    def __repr__(self) -> str:
        return f"<mpicoll.dist.ProcessGroup ranks {self.ranks}>"


class GroupMember:
    """torch's marker for a rank outside a group that ``new_group`` made."""

    NON_GROUP_MEMBER = object()
    WORLD: ProcessGroup | None = None


class _Group:
    """torch's ``dist.group``: ``WORLD``, the default group once initialized."""

    WORLD: ProcessGroup | None = None


group = _Group  # (dist.group.WORLD; a function's group= argument hides this name)


class Backend(str):
    """torch's backend names: ``Backend("gloo")``, ``Backend.NCCL`` (lower-case strings;
    "gloo" runs as "mpi" here)."""

    UNDEFINED, GLOO, NCCL, MPI = "undefined", "gloo", "nccl", "mpi"

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):
            raise InvalidArgumentError(f"Backend: expected a name, got {type(name).__name__}")
        return super().__new__(cls, name.lower())


# the default group, its backend, and every group made since (destroy_process_group frees them)
_STATE: dict[str, Any] = {"world": None, "backend": None, "groups": [], "made": 0}
# ("made": the groups made since init_process_group, the default one included: every rank
# counts each call that makes groups alike, member or not, as torch's group_count)


def is_available() -> bool:
    return True


def is_mpi_available() -> bool:
    return True


def is_gloo_available() -> bool:
    """True: "gloo" runs as "mpi" (on the CPU, as gloo's users want)."""
    return True


def is_nccl_available() -> bool:
    """Whether CuPy and its NCCL bindings import here (a GPU is not asked for)."""
    from ..buffers.cuda import OK, gpu_status

    return gpu_status(need_nccl=True, need_device=False)[0] == OK


def is_ucc_available() -> bool:
    return False


def is_xccl_available() -> bool:
    return False


class DebugLevel(enum.Enum):
    """torch's debug levels. ``DETAIL`` (``TORCH_DISTRIBUTED_DEBUG=DETAIL``, or
    ``set_debug_level`` before ``init_process_group``) makes the process groups in check
    mode, torch's collective desync checks: every call's fingerprint (collective, shapes,
    dtype, op, root) is compared across ranks first, and a rank that differs makes every
    rank raise MismatchError before any message (``mpicoll.Communicator(check=True)``)."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_DEBUG: list[DebugLevel] = []  # set_debug_level's, else TORCH_DISTRIBUTED_DEBUG's


def set_debug_level(level: DebugLevel) -> None:
    if not isinstance(level, DebugLevel):
        raise InvalidArgumentError(f"set_debug_level: expected a DebugLevel, got {level!r}")
    _DEBUG[:] = [level]


def set_debug_level_from_env() -> None:
    """The level ``TORCH_DISTRIBUTED_DEBUG`` names (OFF, INFO, DETAIL; unset: OFF)."""
    text = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").strip().upper() or "OFF"
    if text not in DebugLevel.__members__:
        raise InvalidArgumentError(
            f"TORCH_DISTRIBUTED_DEBUG: expected OFF, INFO or DETAIL, got {text!r}")
    _DEBUG[:] = [DebugLevel[text]]


def get_debug_level() -> DebugLevel:
    if not _DEBUG:
        set_debug_level_from_env()
    return _DEBUG[0]


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` ("mpi", "gloo", "nccl") can run here, as torch's."""
    name = str(backend).lower()
    if name in ("mpi", "gloo", "cpu:gloo"):
        return True
    return name in ("nccl", "cuda:nccl") and is_nccl_available()


def is_initialized() -> bool:
    return _STATE["world"] is not None


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: Any = None, world_size: int = -1, rank: int = -1,
                       **_: Any) -> None:
    """Make the default group over every rank of the job (MPI_COMM_WORLD)."""
    if is_initialized():
        raise InvalidArgumentError("init_process_group: already initialized")
    name = _backend_name(backend or "mpi")
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    try:  # DETAIL: check mode (a rank whose level differs: every rank raises, as made)
        check, debug = True if get_debug_level() is DebugLevel.DETAIL else None, ""
    except InvalidArgumentError as exc:  # (agreed below, with the ranks' other problems)
        check, debug = None, str(exc)
    try:
        comm = Communicator(backend=name, timeout=seconds, check=check)
    except SettingMismatchError as exc:  # (every rank raises it, alike)
        if not str(exc).startswith("check:"):
            raise
        raise SettingMismatchError(f"init_process_group: {exc}; TORCH_DISTRIBUTED_DEBUG=DETAIL "
                                   "is check mode here") from exc
    problem = ""
    for variable, mine in (("WORLD_SIZE", comm.size), ("RANK", comm.rank)):
        given = world_size if variable == "WORLD_SIZE" else rank
        text = os.environ.get(variable)
        try:
            wrong = (given not in (-1, None) and int(given) != mine) or (
                bool(text) and text.isdigit() and int(text) != mine)
        except (TypeError, ValueError):
            wrong = True
        if wrong and not problem:
            problem = (f"{variable.lower()} {given if given not in (-1, None) else text} "
                       f"differs from the MPI launcher's {mine}")
    # agreed: a rank whose RANK or WORLD_SIZE is off (1), or whose TORCH_DISTRIBUTED_DEBUG
    # is not a level (2), makes every rank raise, naming it
    bad = np.array([1 if problem else 2 if debug else 0], np.int64)
    flags = np.zeros(comm.size, np.int64)
    control = comm.control_comm
    if control is not None:
        control.Allgather(bad, flags)
    else:
        flags[comm.rank] = bad[0]
    if flags.any():
        comm.free()
        ranks = [int(r) for r in np.flatnonzero(flags == 1)]
        if ranks:
            raise InvalidArgumentError(
                f"init_process_group: rank(s) {ranks} were given a rank or world size that is "
                f"not the MPI launcher's{': ' + problem if problem else ''}; start the job "
                "with mpiexec or srun")
        ranks = [int(r) for r in np.flatnonzero(flags == 2)]
        raise InvalidArgumentError(f"init_process_group: on rank(s) {ranks}, "
                                   f"{debug or 'TORCH_DISTRIBUTED_DEBUG is not a debug level'}")
    world = ProcessGroup(comm, list(range(comm.size)), _asked(backend))
    _STATE["world"], _STATE["backend"], _STATE["made"] = world, name, 1
    GroupMember.WORLD = _Group.WORLD = world


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free ``group``, or every group and the default one (every rank calls it; each
    frees the groups it is in, in the order they were made, as every rank made them)."""
    if group is None:
        groups, _STATE["groups"] = _STATE["groups"], []
        for made in groups:
            if not made.comm.freed:
                made.comm.free()
        for other in _STATE.pop("others", {}).values():
            if not other.freed:
                other.free()
        world = _STATE["world"]
        if world is not None:
            world.comm.free()
        _STATE["world"] = _STATE["backend"] = None
        _STATE["made"] = 0
        GroupMember.WORLD = _Group.WORLD = None
    elif isinstance(group, ProcessGroup):
        group.comm.free()
        groups = _STATE["groups"]  # (not kept: a loop of new_group and destroy would keep
        if group in groups:  # every freed group, and its workspace, to the end)
            groups.remove(group)
    elif group is not GroupMember.NON_GROUP_MEMBER:  # (a rank outside it: nothing to free)
        raise InvalidArgumentError(f"destroy_process_group: expected a process group (or "
                                   f"None: all of them), got {type(group).__name__}")


def _group(group: Any) -> ProcessGroup:
    if group is None:
        world = _STATE["world"]
        if world is None:
            raise InvalidArgumentError("the default process group is not initialized: call "
                                       "mpicoll.dist.init_process_group() first")
        return world
    if group is GroupMember.NON_GROUP_MEMBER:
        raise InvalidArgumentError("group: this rank is not a member of the group")
    if not isinstance(group, ProcessGroup):
        raise InvalidArgumentError(f"group: expected a ProcessGroup, got {type(group).__name__}")
    return group


def get_backend(group: Any = None) -> str:
    """The group's backend as torch names it: "nccl", "mpi", or "gloo" where
    init_process_group asked for gloo (which mpicoll runs over MPI)."""
    g = _group(group)
    backend = g.comm.backend
    return g.asked if g.asked is not None and backend == "mpi" else backend


def get_backend_config(group: Any = None) -> str:
    """The group's backend per device, as torch writes it: "cpu:mpi,cuda:mpi" (CPU and
    GPU arrays over MPI), "cuda:nccl", or the per-device string init_process_group was
    given ("cpu:gloo,cuda:nccl")."""
    g = _group(group)
    if g.asked is not None and "," in g.asked:
        return g.asked
    name = get_backend(g)
    return "cuda:nccl" if name == "nccl" else f"cpu:{name},cuda:{name}"


def _asked(backend: Any) -> str | None:
    """What get_backend answers where torch's backend name asks for gloo (mpicoll runs it
    over MPI): "gloo", or the per-device string as given ("cpu:gloo,cuda:nccl")."""
    name = "" if backend is None else str(backend).lower()
    return None if "gloo" not in name else name if "," in name else "gloo"


def get_rank(group: Any = None) -> int:
    """This rank in ``group`` (-1 where it is not a member)."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).comm.rank


def get_world_size(group: Any = None) -> int:
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group).comm.size


def new_group(ranks: Sequence[int] | None = None, timeout: Any = None, backend: Any = None,
              pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: Any = None, device_id: Any = None, sort_ranks: bool = True) -> Any:
    """The group of ``ranks`` (all ranks when None; sorted unless ``sort_ranks=False``,
    where the order gives the group ranks, as torch's). Every rank of the job calls it;
    the others get ``GroupMember.NON_GROUP_MEMBER``. ``use_local_synchronization=True``
    (only the members call it) is refused: it does not work with MPI, as torch says."""
    world = _group(None)
    if use_local_synchronization:  # (at once: torch's callers of it are the members alone)
        raise InvalidArgumentError(
            "new_group: use_local_synchronization=True is not supported (as torch's, it does "
            "not work with MPI): every rank of the job calls new_group")
    problem = ""  # (refused on every rank: the others agree on the backend with this one)
    try:
        members = list(world.ranks) if ranks is None else list(ranks)
    except Exception:  # noqa: BLE001 - whatever the caller's iterable raises: every rank's
        members, problem = [], f"ranks: expected a list of ranks, got {type(ranks).__name__}"
    if sort_ranks and all(isinstance(r, (int, np.integer)) and not isinstance(r, bool)
                          for r in members):
        members = sorted(int(r) for r in members)  # as torch's; else refused on every rank
    comm = _world_on(backend, problem).new_group(members)
    _STATE["made"] += 1  # (on every rank: the group is made, this rank in it or not)
    if comm is None:
        return GroupMember.NON_GROUP_MEMBER
    made = ProcessGroup(comm, [int(r) for r in members],
                        world.asked if backend is None else _asked(backend))
    _STATE["groups"].append(made)
    return made


def _named_backends(backend: Any) -> set[str]:
    """The backends torch's backend string names, as mpicoll's ("gloo" is "mpi"): one for
    "gloo", "mpi" or "nccl", one a device for a per-device "cpu:gloo,cuda:nccl"."""
    parts = {part.split(":")[-1].strip() for part in str(backend).lower().split(",")}
    return {"mpi" if part == "gloo" else part for part in parts}


def _backend_name(backend: Any) -> str:
    """torch's backend name as mpicoll's: "gloo" and "mpi" are "mpi"; a per-device string
    (torch's "cpu:gloo,cuda:nccl") is "mpi" where it names gloo or mpi for a device (mpicoll's
    MPI backend takes host and GPU arrays alike), else "nccl" where it names only NCCL."""
    names = _named_backends(backend)
    if "mpi" in names and names <= {"mpi", "nccl"}:
        return "mpi"
    if names == {"nccl"}:
        return "nccl"
    raise InvalidArgumentError(f"backend: expected 'mpi' or 'nccl' (or 'gloo', or torch's "
                               f"per-device 'cpu:gloo,cuda:nccl'), got {backend!r}")


def _names_backend(backend: Any, name: str) -> bool:
    """Whether torch's backend string names mpicoll's backend ``name`` for one of its
    devices; never raises (a caller's object whose str() fails: False)."""
    try:
        return name in _named_backends(backend)
    except Exception:  # noqa: BLE001 - a caller's object whose str() fails: none named
        return False


_BACKEND_CODES = {"mpi": 1, "nccl": 2}


def _world_on(backend: Any, problem: str = "", what: str = "new_group") -> Communicator:
    """The job's Communicator on ``backend`` (None: the default group's), agreed by every
    rank (a bad or different name on any rank, or its ``problem`` with the call, raises on
    every rank, naming them), watched as every call is: a CPU group of an NCCL job
    (``new_group(backend="gloo")``) is made over an MPI Communicator of every rank, made
    once (every rank makes it, at its first such new_group)."""
    world = _group(None)
    try:
        name = _STATE["backend"] if backend is None else _backend_name(backend)
    except InvalidArgumentError as exc:
        name, problem = "", problem or str(exc)
    # a numbered step of every rank (check mode fingerprints it: a rank making another
    # call raises on every rank; a rank that never comes: the watchdog's report)
    codes = agreed_rows(world.comm, np.array([0 if problem else _BACKEND_CODES.get(name, 0)],
                                             np.int64), sys._getframe(2), what)[:, 0]
    given = codes[codes != 0]  # (0: a rank's refusal; the others: the backend most give)
    most = int(np.bincount(given).argmax()) if given.size else 0
    if not codes.all() or (codes != most).any():
        odd = [r for r in range(len(codes)) if codes[r] != most or not codes[r]]
        raise InvalidArgumentError(
            f"{what}: refused on rank(s) {odd}{' (here: ' + problem + ')' if problem else ''}"
            f"; every rank gives the same backend (here {backend!r}) and valid arguments")
    if name == _STATE["backend"]:
        return world.comm
    made = _STATE.setdefault("others", {})
    if name not in made:
        made[name] = Communicator(world.comm.control_comm, backend=name,
                                  timeout=world.comm.timeout, check=world.comm.check)
    return made[name]


def get_group_rank(group: Any, global_rank: int) -> int:
    """``global_rank``'s rank in ``group``."""
    g = _group(group)
    return g.local(global_rank, "global_rank")


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` of ``group``."""
    g = _group(group)
    if not isinstance(group_rank, (int, np.integer)) or isinstance(group_rank, bool) \
            or not 0 <= group_rank < len(g.ranks):
        raise InvalidArgumentError(
            f"group_rank: expected a rank of the group (0..{len(g.ranks) - 1}), got {group_rank!r}")
    return g.ranks[group_rank]


def get_process_group_ranks(group: Any) -> list[int]:
    """The global ranks of ``group``'s members, in group-rank order."""
    return list(_group(group).ranks)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This rank's place among the ranks of its node (torch reads ``LOCAL_RANK``, which
    torchrun sets; here the job's agreed node layout, ``Communicator.nodes``, says it:
    ``MPICOLL_RANKS_PER_NODE``, SLURM's nodes, or the shared-memory node)."""
    world = _STATE["world"]
    if world is None:
        text = os.environ.get("LOCAL_RANK", "")
        if text.isdigit():
            return int(text)
        if fallback_rank is not None:
            return int(fallback_rank)
        raise InvalidArgumentError("get_node_local_rank: the default process group is not "
                                   "initialized and LOCAL_RANK is not set")
    comm = world.comm
    return comm.nodes[comm.node].index(comm.rank)


def get_pg_count() -> int:
    """The calls that made process groups since init_process_group, the default group
    included (new_group and split_group one each, a mesh one a dimension): the same on
    every rank, whether in the groups or not, and never lowered by destroying one group,
    as torch's group_count (0 before init_process_group and after destroying them all)."""
    return _STATE["made"]


def get_default_backend_for_device(device: Any) -> str:
    """torch's default backend of a device type: "gloo" for "cpu" (run over MPI here),
    "nccl" for "cuda"."""
    kind = str(getattr(device, "type", device)).split(":")[0].lower()
    if kind not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"get_default_backend_for_device: no backend for device "
                                   f"{device!r} (cpu or cuda)")
    return "gloo" if kind == "cpu" else "nccl"


def supports_complex(reduceOp: Any) -> bool:  # noqa: N803 - torch's name
    """Whether ``reduceOp`` reduces complex tensors (sum and avg; the orderings and
    bitwise ops do not, and torch refuses prod too)."""
    return _op(reduceOp) in ("sum", "avg")


def is_torchelastic_launched() -> bool:
    """Whether torchrun (torch elastic) started this process: never under mpiexec or srun."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def new_subgroups(group_size: int | None = None, group: Any = None, timeout: Any = None,
                  backend: Any = None, pg_options: Any = None,
                  group_desc: Any = None) -> tuple[ProcessGroup, list[Any]]:
    """Groups of ``group_size`` consecutive ranks (default: the ranks of a node, where
    every node has as many), as torch's: (this rank's group, every group, in order;
    ``GroupMember.NON_GROUP_MEMBER`` for those this rank is not in). Every rank calls it."""
    world = _group(None)
    size = world.comm.size
    problem = ""  # (refused on every rank: agreed with the backend, below)
    if group is not None:
        problem = "group= is not supported; subgroups are of the default group"
    elif group_size is None:
        sizes = {len(node) for node in world.comm.nodes}
        if len(sizes) != 1:
            problem = "the nodes have different numbers of ranks; give group_size"
        else:
            group_size = sizes.pop()
    if not problem and (isinstance(group_size, bool) or not isinstance(
            group_size, (int, np.integer)) or group_size <= 0 or size % group_size):
        problem = f"group_size must divide the world size {size}, got {group_size!r}"
    _world_on(backend, problem, "new_subgroups")
    assert isinstance(group_size, (int, np.integer))  # (refused above otherwise)
    subgroups = [new_group(list(range(first, first + group_size)), backend=backend)
                 for first in range(0, size, group_size)]
    return subgroups[world.comm.rank // group_size], subgroups


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]],
                                 timeout: Any = None, backend: Any = None,
                                 pg_options: Any = None, group_desc: Any = None
                                 ) -> tuple[Any, list[Any]]:
    """A group of each list of ranks, as torch's: (this rank's group, or None where it is
    in none; every group, in order, ``GroupMember.NON_GROUP_MEMBER`` for those this rank
    is not in). A rank may be in one list at most. Every rank calls it, with the same lists."""
    problem = ""  # (refused on every rank: agreed with the backend, below)
    seen: set[int] = set()
    try:  # (whatever the caller's lists raise as they are read: refused on every rank)
        lists = [list(ranks) for ranks in ranks_per_subgroup_list]
        for ranks in lists:
            twice = seen.intersection(ranks)
            if twice and not problem:
                problem = (f"ranks_per_subgroup_list: rank {min(twice)} is in more than one "
                           "subgroup")
            seen.update(r for r in ranks if isinstance(r, (int, np.integer)))
    except Exception:  # noqa: BLE001 - as new_group's: refused on every rank
        lists, problem = [], "ranks_per_subgroup_list: expected a list of lists of ranks"
    _world_on(backend, problem, "new_subgroups_by_enumeration")
    me = get_rank()
    subgroups = [new_group(ranks, backend=backend) for ranks in lists]
    mine = [group for group, ranks in zip(subgroups, lists, strict=True) if me in ranks]
    return (mine[0] if mine else None), subgroups


def split_group(parent_pg: Any = None, split_ranks: Sequence[Sequence[int]] | None = None,
                timeout: Any = None, pg_options: Any = None, group_desc: Any = None,
                backend: Any = None) -> ProcessGroup | None:
    """The parent group (default: the whole job) split into disjoint groups, one per list
    of ``split_ranks`` (ranks of the parent group, as torch's; each list sorted, as
    torch's: its group's ranks in rank order), in one split (MPI_Comm_split): this rank's group, or None where it is in no
    list. Every rank of the parent calls it with the same lists; one rank's bad or
    different lists (or another backend than the parent's) raise on every rank, before
    any group is made."""
    parent = _group(parent_pg)
    other = backend is not None and not _names_backend(backend, parent.comm.backend)
    try:  # each list sorted, as torch's (ranks of each group in rank order); a list that
        # cannot be (not integers) goes as given, refused on every rank by split_lists
        split_ranks = [list(ranks) for ranks in split_ranks]  # (each read once: iterators)
        split_ranks = [sorted(int(r) for r in ranks) if all(
            isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in ranks)
            else ranks for ranks in split_ranks]
    except Exception:  # noqa: BLE001 - an iterable that raises: as split_lists finds it
        pass
    sub, ranks = split_lists(parent.comm, split_ranks, "split_group", "split_ranks",
                             sys._getframe(1), other_backend=other)
    _STATE["made"] += 1  # (on every rank, as new_group's)
    if sub is None:
        return None
    made = ProcessGroup(sub, [parent.ranks[r] for r in ranks], parent.asked)
    _STATE["groups"].append(made)
    return made


class DeviceMesh:
    """torch's DeviceMesh over mpicoll: the job's ranks as an n-dimensional grid, with this
    rank's group along each dimension. ``mesh``: the global ranks in the grid's shape (a
    NumPy array, where torch's is a tensor); ``mesh["tp"]`` (or ``mesh["dp", "tp"]``): the
    sub-mesh along those dimensions through this rank, as torch's."""

    def __init__(self, device_type: str, ranks: np.ndarray, groups: dict[str, ProcessGroup],
                 names: tuple[str, ...], coordinate: tuple[int, ...], rank: int,
                 named: bool = True) -> None:
        self.device_type, self.mesh = device_type, ranks
        # (None where init_device_mesh was given no names, as torch's: the dimensions are
        # then asked for by index; ``_names``, the groups' keys, are "dim0", "dim1", ...)
        self.mesh_dim_names = names if named else None
        self._names, self._groups, self._coordinate, self._rank = names, groups, coordinate, rank

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.mesh.shape)

    @property
    def ndim(self) -> int:
        return self.mesh.ndim

    def _dim(self, mesh_dim: str | int | None, what: str) -> int:
        """The index of ``mesh_dim`` (a name or an index; None on a 1-D mesh only)."""
        if mesh_dim is None:
            if self.ndim != 1:
                raise InvalidArgumentError(
                    f"{what}: this mesh has {self.ndim} dimensions {self.mesh_dim_names}; "
                    "name the one you mean (mesh_dim=)")
            return 0
        if isinstance(mesh_dim, str):
            if self.mesh_dim_names is None or mesh_dim not in self.mesh_dim_names:
                has = "no names (made without mesh_dim_names): give the dimension's " \
                    "index" if self.mesh_dim_names is None else self.mesh_dim_names
                raise InvalidArgumentError(f"mesh_dim: no {mesh_dim!r}; the mesh has {has}")
            return self._names.index(mesh_dim)
        if isinstance(mesh_dim, (int, np.integer)) and not isinstance(mesh_dim, bool) \
                and -self.ndim <= mesh_dim < self.ndim:
            return int(mesh_dim) % self.ndim
        raise InvalidArgumentError(f"mesh_dim: expected a name of {self.mesh_dim_names} or a "
                                   f"dimension index, got {mesh_dim!r}")

    def get_group(self, mesh_dim: str | int | None = None) -> ProcessGroup:
        """The group of the ranks along ``mesh_dim`` through this rank."""
        return self._groups[self._names[self._dim(mesh_dim, "get_group")]]

    def get_all_groups(self) -> list[ProcessGroup]:
        return [self._groups[name] for name in self._names]

    def get_local_rank(self, mesh_dim: str | int | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (its rank in that dimension's group)."""
        return self._coordinate[self._dim(mesh_dim, "get_local_rank")]

    def get_rank(self) -> int:
        """This rank's global rank."""
        return self._rank

    def get_coordinate(self) -> list[int]:
        """This rank's coordinates in the mesh, one per dimension."""
        return list(self._coordinate)

    def size(self, mesh_dim: str | int | None = None) -> int:
        return int(self.mesh.size) if mesh_dim is None else \
            self.shape[self._dim(mesh_dim, "size")]

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh along these dimensions (in the mesh's order) through this rank (a
        mesh made without names has none to slice by, as torch's)."""
        try:
            wanted = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else \
                tuple(mesh_dim_names)
        except TypeError:  # (mesh[0], mesh[None]: no names; refused below)
            wanted = ()
        dims = [self._dim(name, "mesh[...]") if isinstance(name, str) else -1 for name in wanted]
        if not dims or -1 in dims or dims != sorted(set(dims)):
            raise InvalidArgumentError(
                f"mesh[{mesh_dim_names!r}]: expected names of {self.mesh_dim_names}, each once, "
                "in the mesh's order")
        # the other dimensions fixed at this rank's coordinates
        index = tuple(slice(None) if d in dims else self._coordinate[d] for d in range(self.ndim))
        names = tuple(self._names[d] for d in dims)
        return DeviceMesh(self.device_type, self.mesh[index], {n: self._groups[n] for n in names},
                          names, tuple(self._coordinate[d] for d in dims), self._rank)

    def __repr__(self) -> str:
        return (f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}, "
                f"mesh_dim_names={self.mesh_dim_names})")


def init_device_mesh(device_type: str, mesh_shape: Sequence[int],
                     mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
    """A mesh of the job's ranks, row-major (the last dimension inside a node when
    ranks are placed by node), as torch's ``init_device_mesh``."""
    world = _group(None)
    mesh = world.comm.mesh(mesh_shape, mesh_dim_names)  # agreed there: bad ones raise on every rank
    shape, names = mesh.shape, mesh.names
    groups = {}
    for d, name in enumerate(names):  # the ranks along dimension d through this rank
        stride = int(np.prod(shape[d + 1:]))
        first = world.comm.rank - mesh.coordinates[d] * stride
        groups[name] = ProcessGroup(mesh[name], [first + k * stride for k in range(shape[d])],
                                    world.asked)
        _STATE["groups"].append(groups[name])
    _STATE["made"] += len(names)  # (one split a dimension, on every rank)
    ranks = np.array(world.ranks).reshape(shape)
    return DeviceMesh(device_type, ranks, groups, tuple(names), tuple(mesh.coordinates),
                      world.ranks[world.comm.rank], named=mesh_dim_names is not None)


# -- collectives: torch's names and in-place semantics --------------------------------
#
# A problem one rank alone can see is settled as mpicoll's own calls settle it: in what
# the rank receives (its output tensors, lists), the rank takes part and then raises, so
# the others get their results and nothing is left queued; in what it gives (its input
# list, its split sizes), the call is made refused (the core call's ``_refusal``): this
# rank raises at once, every rank in check mode, and its next call resyncs.


def _member(group: Any, what: str) -> ProcessGroup | None:
    """The group a call of ``what`` runs on; None where this rank is outside it (torch's
    ``GroupMember.NON_GROUP_MEMBER``): there the call does nothing, with torch's warning."""
    if group is None:
        world = _STATE["world"]
        if world is not None:
            return world
    elif group is GroupMember.NON_GROUP_MEMBER:
        warnings.warn(f"Running {what} on global rank {get_rank()} which does not belong "
                      "to the given group.", stacklevel=3)
        return None
    return _group(group)


def _op(op: Any) -> Any:
    # _value_: the member's value without the Enum property's cost (every call pays it)
    return op._value_ if type(op) is ReduceOp else op.value if isinstance(op, ReduceOp) else op


def _view(tensor: Any, name: str) -> Any:
    """The tensor's memory as an array (no copy)."""
    return as_array(tensor, name)[0]


def _given(tensor: Any, name: str) -> Any:
    """An input tensor's memory as an array; the tensor itself where it has none (the
    core call refuses it then, as it refuses its own inputs)."""
    try:
        return _view(tensor, name)
    except MpicollError:
        return tensor


def _given_list(tensors: Any) -> bool:
    """Whether a rank gave a list (torch: None and [] are none; anything else is one,
    checked as a list)."""
    return tensors is not None and not (isinstance(tensors, (list, tuple)) and not tensors)


def _is_array(a: Any) -> bool:
    return type(a) is np.ndarray or is_cupy(a)


def _read_only(view: Any, name: str) -> str | None:
    """What is wrong with ``view`` as memory a call writes its result into, if anything."""
    if type(view) is np.ndarray and not view.flags.writeable:
        return f"{name}: must be a writeable array (it is read-only)"
    if overlaps_itself(view):
        return str(overlapping(name))
    return None


def _tensors(tensors: Any, name: str, count: int, like: Any, written: bool = False,
             any_size: bool = False) -> tuple[list[Any], str | None]:
    """Views of a list of ``count`` tensors of ``like``'s size and dtype (torch's rule for a
    collective's list; ``any_size``: its dtype alone), or what is wrong with it;
    ``written``: the call writes into them (so none may be read-only)."""
    if not isinstance(tensors, (list, tuple)):
        return [], f"{name}: expected a list of {count} tensors, got {type(tensors).__name__}"
    if len(tensors) != count:
        return [], f"{name}: expected {count} tensors (one per rank of the group), got {len(tensors)}"
    views = []
    for i, t in enumerate(tensors):
        try:
            view = _view(t, f"{name}[{i}]")
        except MpicollError as exc:
            return [], str(exc)
        first = like if _is_array(like) else views[0] if views else view
        if module_of(view) is not module_of(first):
            return [], (f"{name}[{i}]: a {module_of(view).__name__} array among "
                        f"{module_of(first).__name__} ones")
        if _is_array(like) and any_size and view.dtype != like.dtype:
            return [], (f"{name}[{i}]: expected {like.dtype} (as the tensor), got "
                        f"{view.dtype}")
        if _is_array(like) and not any_size and (view.size != like.size or
                                                  view.dtype != like.dtype):
            return [], (f"{name}[{i}]: expected {like.size} elements of {like.dtype} (as the "
                        f"tensor), got shape {tuple(view.shape)} of {view.dtype}")
        wrong = _read_only(view, f"{name}[{i}]") if written else None
        if wrong is not None:
            return [], wrong
        views.append(view)
    return views, None


class Work:
    """torch's ``dist.Work``: what ``async_op=True`` returns (a collective's or a
    point-to-point message's), for ``isinstance`` checks and type hints."""

    __slots__ = ()


class _Finished(Work):
    """torch's Work: ``wait()`` finishes the call (and copies what it received into the
    caller's tensors) and returns True; ``is_completed()`` does so once it has ended;
    ``get_future()`` gives a future of the call's output tensors (``value``, a list, as
    torch's), completed once the call has ended and its outputs hold the result."""

    def __init__(self, work: Any, finish: Any, value: Sequence[Any] = ()) -> None:
        self._work, self._finish = work, finish
        self._copied = False  # finish ran: the caller's tensors hold (or, on NCCL, are
        #                       queued to hold) the result
        self._done = False  # and the call has ended (on NCCL: on the GPU too)
        self._value, self._future = list(value), None
        self._lock = threading.Lock()  # (the future's callback finishes it in the
        #                                 thread that ends the call)

    def _copy(self, result: Any) -> None:
        with self._lock:
            if not self._copied:
                self._finish(result)
                self._copied = True

    def wait(self, timeout: Any = None) -> bool:
        """``timeout``: a timedelta (or seconds), as torch's; 0, torch's default, is no
        limit there (mpicoll.Work.wait's 0 asks without waiting): None here."""
        if not self._done:
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            self._copy(self._work.wait(None if seconds == 0 else timeout))
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Whether the call has ended, in success or in an error (torch's: it never
        raises; ``wait()`` and ``exception()`` give the error)."""
        if not self._done and self._work.test():
            try:
                self.wait()  # ended: its tensors hold the result from now on, as torch's
            except MpicollError:
                return True
        return self._done

    test = is_completed

    def result(self) -> list[Any]:
        """The call's output tensors, as torch's ``Work.result()`` (waits for the call)."""
        self.wait()
        return list(self._value)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The error of a call that ended in one (None: none, or not ended yet)."""
        if not self._work.test():
            return None
        try:
            self.wait()
        except MpicollError as exc:
            return exc
        return None

    def get_future(self) -> Any:
        """A future (``torch.futures.Future`` for torch tensors, else ``mpicoll.dist.
        Future``, the same methods) whose value is the call's output tensors in a list
        (``[tensor]`` for all_reduce, ``tensor_list``'s tensors for all_gather, as
        gloo's), set once the
        call has ended (on NCCL: queued on its stream, as torch's CUDA futures), or its
        error. Its callbacks run in the thread that ends the call: keep them short."""
        with self._lock:
            made = self._future is None
            if made:
                self._future = _future_for(self._value)
        if made:
            self._work.add_done_callback(self._complete)
        return self._future

    def _complete(self, work: Any) -> None:
        try:  # (on NCCL: the copies queued on the stream, the GPU not waited for)
            self._copy(work.host_result())
        except BaseException as exc:  # noqa: BLE001 - the future's error
            self._future.set_exception(exc)
            return
        self._future.set_result(self._value)


class Future:
    """``torch.futures.Future``'s methods, for calls on NumPy or CuPy arrays (a torch
    tensor's call gives torch's own): ``wait()`` (the value, or the error raised),
    ``value()``, ``done()``, ``then(callback)`` (a Future of ``callback(this)``),
    ``add_done_callback(callback)``, ``set_result``, ``set_exception``."""

    def __init__(self) -> None:
        self._ended = threading.Event()
        self._lock = threading.Lock()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Any] | None = []
        # a call's future (get_future(), and what then() chains on it): its callbacks are
        # done callbacks wherever they run, so a collective made in one is refused on
        # every rank (the progress thread, or at once where the call had ended: timing);
        # a future of the caller's own, ended in its own thread, runs them as they are
        self._of_call = False

    def done(self) -> bool:
        return self._ended.is_set()

    def wait(self) -> Any:
        if not self._ended.is_set() and in_done_callback() and on_progress_thread():
            raise waits_for_itself("Future.wait()")  # (the thread that would end it)
        self._ended.wait()
        return self.value()

    def value(self) -> Any:
        if not self._ended.is_set():
            raise InvalidArgumentError("Future.value(): not done yet (wait() for it)")
        if self._error is not None:
            raise self._error
        return self._value

    def set_result(self, result: Any) -> None:
        self._end(result, None)

    def set_exception(self, result: BaseException) -> None:
        self._end(None, result)

    def _end(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._callbacks is None:
                raise InvalidArgumentError("Future: its result was set already")
            self._value, self._error = value, error
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks:
            self._call(callback)

    def _call(self, callback: Any) -> None:
        if self._of_call:
            entering_done_callback()
        try:  # (as torch's: a callback's error is reported, and the others still run)
            callback(self)
        except Exception as exc:  # noqa: BLE001 - never into the thread that ended the call
            text = f"mpicoll.dist.Future: a callback raised {type(exc).__name__}: {exc}"
            try:
                warnings.warn(text, RuntimeWarning, stacklevel=2)
            except Exception:  # noqa: BLE001 - warnings as errors: said, the others run on
                report(text)
        finally:
            if self._of_call:
                leaving_done_callback()

    def add_done_callback(self, callback: Any) -> None:
        with self._lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        self._call(callback)

    def then(self, callback: Any) -> Future:
        chained = Future()
        chained._of_call = self._of_call
        self.add_done_callback(_chaining(callback, chained))
        return chained


def _chaining(callback: Any, chained: Any) -> Any:
    """``then(callback)``'s done callback: ``chained`` ends with what ``callback`` gives
    back, or the error it raises (as torch's then)."""
    def run(done: Any) -> None:
        try:
            value = callback(done)
        except Exception as exc:  # noqa: BLE001 - the chained future's error
            chained.set_exception(exc)
            return
        chained.set_result(value)

    return run


def _future_for(value: list[Any]) -> Any:
    """A call's future: torch's where torch is in use and the outputs are torch tensors
    (or none: a barrier's), else mpicoll's; its callbacks done callbacks wherever they
    run (``Future._of_call``)."""
    torch = sys.modules.get("torch")
    items = [v for item in value for v in (item if isinstance(item, (list, tuple)) else (item,))]
    if torch is not None and all(isinstance(v, torch.Tensor) for v in items):
        return _call_future_class(torch)()
    future = Future()
    future._of_call = True
    return future


_CALL_FUTURE: list[Any] = []  # the torch Future subclass below, made once torch is in use


def _call_future_class(torch: Any) -> Any:
    """torch's ``Future`` for a call's future: a callback (``add_done_callback``,
    ``then``, and the callbacks of what ``then`` chains) runs as a done callback wherever
    torch runs it: in the thread that ends the call, or inline where it had ended (torch
    runs a callback added to a completed future at once), so a collective made in one is
    refused on every rank, as ``Future._of_call``'s."""
    if _CALL_FUTURE:
        return _CALL_FUTURE[0]

    class CallFuture(torch.futures.Future):  # type: ignore[misc,name-defined]
        def add_done_callback(self, callback: Any) -> None:
            def marked(done: Any) -> None:
                entering_done_callback()
                try:
                    callback(done)
                finally:
                    leaving_done_callback()

            super().add_done_callback(marked)

        def then(self, callback: Any) -> Any:
            chained = CallFuture()
            self.add_done_callback(_chaining(callback, chained))
            return chained

    _CALL_FUTURE.append(CallFuture)
    return CallFuture


def _nothing(result: Any) -> None:
    return None


def _listed(tensors: Any) -> list[Any]:
    """A list-of-tensors output as its future's value: the tensors themselves, flat, as
    gloo's (and torch's MPI backend's) ``all_gather``, ``gather`` and ``all_to_all`` give."""
    return list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]


def _maybe(work: Any, async_op: bool, value: Sequence[Any] = ()) -> Any:
    return _Finished(work, _nothing, value) if async_op else None


def _other_dtype(out: Any, x: Any, name: str, source: str) -> str | None:
    """What is wrong with an output of another dtype than the input it receives (named
    as the caller named both), or None (the core call checks the rest)."""
    if _is_array(out) and _is_array(x) and out.dtype != x.dtype:
        return f"{name}: expected dtype {x.dtype} (as {source}), got {out.dtype}"
    return None


def _no_output(output: Any, name: str) -> str | None:
    """What is wrong with an output given as None (torch writes the result into it: the
    call would make one and drop it); None where one is given (the core call checks it)."""
    return f"{name}: expected the tensor to receive the result, got None" \
        if output is None else None


def _unpack(outs: list[Any], flat: Any, received: Sequence[int], name: str) -> None:
    """A v-call's result (``flat``: every rank's elements in rank order, ``received`` of
    each) into the list's tensors ``outs``, where each holds what its rank sent."""
    sizes = [o.size for o in outs]
    if list(received) != sizes:
        raise InvalidArgumentError(f"{name}: this rank received {list(received)} elements "
                                   f"from the ranks, its tensors hold {sizes}")
    start = 0
    for view, n in zip(outs, sizes, strict=True):
        view[...] = flat[start:start + n].reshape(view.shape)
        start += n


def _then(call: Any, args: tuple, finish: Any, problem: str | None,
          value: Sequence[Any] = (), **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, then ``finish(result)`` (at ``wait()`` where kwargs hold
    ``async_op=True``: a Work whose future gives ``value``, the output tensors); where
    this rank found a ``problem`` in what it receives, it takes part (the call made as the
    others make it, async too, and waited for), then raises."""
    result = call(*args, **kwargs)
    if problem is not None:
        if kwargs.get("async_op"):
            result.wait()
        raise InvalidArgumentError(problem)
    if kwargs.get("async_op"):
        return _Finished(result, finish, value)
    finish(result)
    return None


def _refused(call: Any, problem: str, algorithm: str, async_op: bool) -> NoReturn:
    """``call`` (as the others make it, async too) refused on this rank for ``problem`` in
    what it gives (see above): it raises."""
    call(None, _refusal=InvalidArgumentError(problem), **_how(algorithm, async_op))
    raise InvalidArgumentError(problem)  # (not reached: the refused call raises it)


def _refused_by(call: Any, args: tuple, problem: str, algorithm: str, async_op: bool) -> NoReturn:
    """``call(*args)`` (as the others make it, async too), whose own exchange refuses what
    is wrong here on every rank (a v-variant's counts), then this rank raises ``problem``
    (also where the call took it: torch's rule is the stricter)."""
    try:
        work = call(*args, **_how(algorithm, async_op))
        if async_op:
            work.wait()
    except MpicollError as exc:
        raise InvalidArgumentError(problem) from exc
    raise InvalidArgumentError(problem)


def _shaped(tensor: Any, name: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """(``tensor``'s memory in ``shape``, what copies a result into it afterwards): a view
    where the reshape is one, else a new array copied into the tensor at the end."""
    view = _view(tensor, name)
    shaped = view.reshape(shape)
    same = np.shares_memory(shaped, view) if type(view) is np.ndarray else \
        shaped.data.ptr == view.data.ptr
    if same or view.size == 0:
        return shaped, _nothing
    shaped = module_of(view).empty(shape, view.dtype)

    def copy_back(result: Any) -> None:
        view[...] = shaped.reshape(view.shape)

    return shaped, copy_back


def _how(algorithm: str, async_op: bool) -> dict[str, Any]:
    """The keywords a call passes on: none where they are the defaults, so that the call
    is keyed for its kept decision as the same direct call is (``pipeline.decided``)."""
    if algorithm == "auto" and not async_op:
        return {}
    return {"algorithm": algorithm, "async_op": async_op}


def _root(g: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    """The group rank of torch's ``src``/``dst`` (a global rank) or ``group_src``/
    ``group_dst`` (a rank of the group): one of them."""
    if group_rank is None:
        if rank is None:
            raise InvalidArgumentError(f"{name}: give {name} (a global rank) or group_{name}")
        return g.local(rank, name)
    if rank is not None:
        raise InvalidArgumentError(f"{name}: give {name} or group_{name}, not both")
    if not isinstance(group_rank, (int, np.integer)) or isinstance(group_rank, bool) \
            or not 0 <= group_rank < g.comm.size:
        raise InvalidArgumentError(
            f"group_{name}: expected a rank of the group (0..{g.comm.size - 1}), got {group_rank!r}")
    return int(group_rank)


def _root_of(g: ProcessGroup, call: Any, rank: int | None, group_rank: int | None,
             name: str, algorithm: str, async_op: bool) -> int:
    """``_root``; a bad one is ``call`` refused (what this rank gives)."""
    try:
        return _root(g, rank, group_rank, name)
    except InvalidArgumentError as exc:
        _refused(call, str(exc), algorithm, async_op)


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               algorithm: str = "auto") -> Any:
    """Reduce ``tensor`` across the group, in place."""
    g = _STATE["world"] if group is None else None
    if g is None:
        g = _member(group, "all_reduce")
        if g is None:
            return None
    if algorithm == "auto" and not async_op:  # the most frequent call, with nothing between
        g.comm.all_reduce(tensor, op._value_ if type(op) is ReduceOp else _op(op), out=tensor)
        return None
    return _maybe(g.comm.all_reduce(tensor, _op(op), out=tensor, **_how(algorithm, async_op)),
                  async_op, [tensor])


def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None, algorithm: str = "auto") -> Any:
    """``src``'s tensor into every rank's ``tensor``."""
    g = _member(group, "broadcast")
    if g is None:
        return None
    root = _root_of(g, g.comm.broadcast, src, group_src, "src", algorithm, async_op)
    try:  # a number: the call could not write into it (torch refuses it too)
        writable(tensor, "tensor")
        problem = None
    except InvalidArgumentError as exc:
        problem = str(exc)
    return _then(g.comm.broadcast, (tensor, root), _nothing, problem, [tensor],
                 **_how(algorithm, async_op))


def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None,
           algorithm: str = "auto") -> Any:
    """Reduce into ``dst``'s ``tensor`` (the others' are left as they were)."""
    g = _member(group, "reduce")
    if g is None:
        return None
    root = _root_of(g, g.comm.reduce, dst, group_dst, "dst", algorithm, async_op)
    out = tensor if g.comm.rank == root else None
    return _maybe(g.comm.reduce(tensor, _op(op), root, out=out, **_how(algorithm, async_op)),
                  async_op, [tensor])


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False,
               algorithm: str = "auto") -> Any:
    """Every rank's ``tensor`` into ``tensor_list[rank]``, on every rank."""
    g = _member(group, "all_gather")
    if g is None:
        return None
    x = _given(tensor, "tensor")
    # every rank's tensor may have a size of its own (torch: "uneven sized tensors are
    # supported"): all_gather_v of them flat, whose counts exchange agrees the sizes
    outs, problem = _tensors(tensor_list, "tensor_list", g.comm.size, x, written=True,
                             any_size=True)

    def finish(result: Any) -> None:
        _unpack(outs, *result, "tensor_list")

    return _then(g.comm.all_gather_v, (x.reshape(-1) if _is_array(x) else x,), finish,
                 problem, _listed(tensor_list), **_how(algorithm, async_op))


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False, algorithm: str = "auto") -> Any:
    """Every rank's input, concatenated (or stacked) in rank order, into ``output_tensor``."""
    g = _member(group, "all_gather_into_tensor")
    if g is None:
        return None
    x = _given(input_tensor, "input_tensor")
    shape = (g.comm.size, *getattr(x, "shape", ()))
    try:
        out = _view(output_tensor, "output_tensor")
    except MpicollError as exc:
        return _then(g.comm.all_gather, (x,), _nothing, str(exc), **_how(algorithm, async_op))
    wrong = f"output_tensor: expected {int(np.prod(shape))} elements (the group's " \
        f"{g.comm.size} inputs of shape {shape[1:]}), got shape {tuple(out.shape)}" \
        if out.size != int(np.prod(shape)) else \
        _other_dtype(out, x, "output_tensor", "input_tensor") or _read_only(out, "output_tensor")
    if wrong is not None:  # (taking part, then refused: nothing written)
        return _then(g.comm.all_gather, (x,), _nothing, wrong, **_how(algorithm, async_op))
    out, copy_back = _shaped(output_tensor, "output_tensor", shape)
    return _then(g.comm.all_gather, (x,), copy_back, None, [output_tensor], out=out,
                 **_how(algorithm, async_op))


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM,
                   group: Any = None, async_op: bool = False, algorithm: str = "auto") -> Any:
    """Reduce ``input_list[j]`` across ranks into rank j's ``output``."""
    g = _member(group, "reduce_scatter")
    if g is None:
        return None
    rows, problem = _tensors(input_list, "input_list", g.comm.size, None)
    if problem is None and len({(r.shape, r.dtype, module_of(r)) for r in rows}) > 1:
        problem = "input_list: tensors of one shape and dtype, in one array library"
    if problem is not None:  # what it gives: refused
        return _refused(g.comm.reduce_scatter, problem, algorithm, async_op)
    stacked = module_of(rows[0]).stack(rows)
    out = _given(output, "output")
    if _is_array(out) and out.size == rows[0].size:
        stacked = stacked.reshape(len(rows), *out.shape)  # (any shape of that size, as torch)
    return _reduced_into(g, stacked, op, output, out, "input_list's tensors", algorithm,
                         async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False,
                          algorithm: str = "auto") -> Any:
    """Reduce ``input`` (the group's blocks, concatenated) and keep this rank's block."""
    g = _member(group, "reduce_scatter_tensor")
    if g is None:
        return None
    out, x = _given(output, "output"), _given(input, "input")
    p = g.comm.size
    if _is_array(x):
        if x.size % p:  # what it gives: refused
            return _refused(g.comm.reduce_scatter,
                            f"input: its {x.size} elements do not split into the group's {p} "
                            "blocks", algorithm, async_op)
        # read: a copy is fine; a wrong output: the core call takes part, then refuses it
        x = x.reshape(p, *out.shape) if _is_array(out) and out.size * p == x.size else \
            x.reshape(p, -1)
    return _reduced_into(g, x, op, output, out, "input", algorithm, async_op)


def _reduced_into(g: ProcessGroup, rows: Any, op: Any, output: Any, out: Any, source: str,
                  algorithm: str, async_op: bool) -> Any:
    """reduce_scatter of ``rows`` (the group's blocks, named ``source`` as the caller named
    them) into ``output`` (``out``: its array). An output of another dtype: this rank takes
    part, then refuses it in the caller's names (nothing written); any other wrong output:
    the core call takes part, then refuses it (None: this function)."""
    other = _other_dtype(out, rows, "output", source)
    if other is not None:
        return _then(g.comm.reduce_scatter, (rows, _op(op)), _nothing, other,
                     **_how(algorithm, async_op))
    return _then(g.comm.reduce_scatter, (rows, _op(op)), _nothing, _no_output(output, "output"),
                 [output], out=output, **_how(algorithm, async_op))


# torch 2.13's names for the single-tensor forms (the older names are deprecated there)
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


# -- the coalesced forms: many tensors as one call over their concatenation. torch does not
# check that the ranks' lists match ("individual shape checking is not implemented"): two
# lists of one total size but other shapes would combine the wrong elements, silently. So
# every rank's list (shapes, dtype, array library, op, algorithm, async_op) is agreed first,
# in one small exchange of a number for it, and any rank's refusal with it: every rank
# raises. That exchange is made as the call is entered, with async_op=True too (as check
# mode agrees every asynchronous call): the call returns once every rank has entered it.

def _coalesced(tensors: Any, name: str, one: bool = True) -> tuple[list[Any], str | None]:
    """Views of a list of tensors of one dtype and array library (``one``: a tensor alone
    is a list of it, as torch's all_reduce_coalesced takes it), or what is wrong with them."""
    if not isinstance(tensors, (list, tuple)):
        if not one:
            return [], f"{name}: expected a list of tensors, got {type(tensors).__name__}"
        tensors = [tensors]
    views = []
    for i, t in enumerate(tensors):
        try:
            writable(t, f"{name}[{i}]")  # (a number: no tensor, as torch's refuses it)
            view = _view(t, f"{name}[{i}]")
        except MpicollError as exc:
            return [], str(exc)
        if views and (view.dtype != views[0].dtype or module_of(view) is not module_of(views[0])):
            return [], (f"{name}[{i}]: {module_of(view).__name__} {view.dtype} among "
                        f"{module_of(views[0]).__name__} {views[0].dtype} tensors (all of "
                        "one dtype, as torch's)")
        views.append(view)
    return views, None


def _layout(views: Sequence[Any], *more: Any) -> int:
    """A number for a list's shapes, dtype and array library, and ``more``, alike on every
    rank that gives the same (63 bits of BLAKE2b: not Python's per-process hash)."""
    described = [(tuple(v.shape), str(v.dtype), module_of(v).__name__) for v in views]
    digest = hashlib.blake2b(repr((described, *more)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _agree_lists(g: ProcessGroup, what: str, problem: str | None, layout: int) -> None:
    """Every rank's refusal and layout in one numbered step of the group (a rank making
    another call meanwhile: check mode raises, the watchdog bounds it); any refusal, or a
    layout other than the group's first rank's, raises on every rank, naming the ranks."""
    table = agreed_rows(g.comm, np.array([problem is not None, 0 if problem else layout],
                                         np.int64), sys._getframe(2), what)
    refused = np.flatnonzero(table[:, 0]).tolist()
    if refused:
        if problem is not None:
            raise InvalidArgumentError(f"{what}: {problem}")
        raise InvalidArgumentError(f"{what}: refused on rank(s) {_global(g, refused)} (their "
                                   "tensors); nothing was sent")
    differ = np.flatnonzero(table[:, 1] != table[0, 1]).tolist()
    if differ:
        raise MismatchError(
            f"{what}: rank(s) {_global(g, differ)} give other tensors (number, shapes or dtype), "
            f"op or algorithm than rank {g.ranks[0]}; every rank gives the same list")


def _done_future(value: list[Any]) -> Any:
    future = _future_for(value)
    future.set_result(value)
    return future


def _global(g: ProcessGroup, ranks: Sequence[int]) -> str:
    return ", ".join(str(g.ranks[r]) for r in ranks)


def all_reduce_coalesced(tensors: Any, op: Any = ReduceOp.SUM, group: Any = None,
                         async_op: bool = False, algorithm: str = "auto") -> Any:
    """Reduce each tensor of ``tensors`` (of one dtype) in place, as one all_reduce of
    their concatenation; with ``async_op=True``, a Future of the tensors, as torch's. The
    ranks' lists are agreed first, as the call is entered (torch's are not checked: see
    above)."""
    g = _member(group, "all_reduce_coalesced")
    if g is None:
        return None
    views, problem = _coalesced(tensors, "tensors")
    for i, view in enumerate(views):
        problem = problem or _read_only(view, f"tensors[{i}]")
    try:  # (the op as check mode compares it: a user's Op by its name, not its address)
        op_named = op_text(_op(op))
    except MpicollError as exc:
        op_named, problem = "", problem or str(exc)
    _agree_lists(g, "all_reduce_coalesced", problem,
                 _layout(views, op_named, algorithm, async_op))
    if not views:  # (every rank's list is empty: nothing to send)
        return _done_future([]) if async_op else None
    xp = module_of(views[0])
    flat = xp.concatenate([v.reshape(-1) for v in views])

    def finish(result: Any) -> None:
        start = 0
        for view in views:
            view[...] = flat[start:start + view.size].reshape(view.shape)
            start += view.size

    work = _then(g.comm.all_reduce, (flat, _op(op)), finish, None, _listed(tensors),
                 out=flat, **_how(algorithm, async_op))
    return work.get_future() if async_op else None


def all_gather_coalesced(output_tensor_lists: Any, input_tensor_list: Any, group: Any = None,
                         async_op: bool = False, algorithm: str = "auto") -> Any:
    """Every rank's ``input_tensor_list`` into ``output_tensor_lists[rank]`` (a list of
    tensors shaped as the inputs), as one all_gather of their concatenation; with
    ``async_op=True``, a Future of the output lists, as torch's. The ranks' input lists
    are agreed first, as the call is entered (torch's are not checked: see above)."""
    g = _member(group, "all_gather_coalesced")
    if g is None:
        return None
    views, problem = _coalesced(input_tensor_list, "input_tensor_list", one=False)
    outs: list[list[Any]] = []
    if problem is None:
        if not isinstance(output_tensor_lists, (list, tuple)) or \
                len(output_tensor_lists) != g.comm.size:
            problem = (f"output_tensor_lists: expected a list of {g.comm.size} lists (one per "
                       "rank of the group)")
        for r, row in enumerate(output_tensor_lists if problem is None else ()):
            got, problem = _coalesced(row, f"output_tensor_lists[{r}]", one=False)
            if problem is None and len(got) != len(views):
                problem = (f"output_tensor_lists[{r}]: expected {len(views)} tensors (as "
                           f"input_tensor_list), got {len(got)}")
            for k, (out, view) in enumerate(zip(got, views, strict=True) if problem is None
                                            else ()):
                name = f"output_tensor_lists[{r}][{k}]"
                problem = problem or (
                    f"{name}: expected {view.size} elements of {module_of(view).__name__} "
                    f"{view.dtype} (as input_tensor_list[{k}]), got shape {tuple(out.shape)} "
                    f"of {module_of(out).__name__} {out.dtype}"
                    if out.size != view.size or out.dtype != view.dtype or
                    module_of(out) is not module_of(view) else _read_only(out, name))
            if problem is not None:
                break
            outs.append(got)
    _agree_lists(g, "all_gather_coalesced", problem, _layout(views, algorithm, async_op))
    # the future's value: the output lists (the one list where the group has one rank), as
    # gloo's
    rows = [list(row) for row in output_tensor_lists]
    value = rows[0] if len(rows) == 1 else rows
    if not views:  # (every rank's list is empty: nothing to send)
        return _done_future(value) if async_op else None
    flat = module_of(views[0]).concatenate([v.reshape(-1) for v in views])

    def finish(rows: Any) -> None:
        for row, got in zip(rows, outs, strict=True):
            start = 0
            for out in got:
                out[...] = row[start:start + out.size].reshape(out.shape)
                start += out.size

    work = _then(g.comm.all_gather, (flat,), finish, None, value, **_how(algorithm, async_op))
    return work.get_future() if async_op else None


def _splits(sizes: Sequence[int] | None, rows: int, p: int, name: str) -> tuple[list[int], str | None]:
    """torch's split sizes (rows of dim 0 per rank; even when None) for a tensor of
    ``rows`` rows, or what is wrong with them."""
    if sizes is None:
        if rows % p:
            return [], f"{name}: {rows} rows do not split evenly over {p} ranks (give split sizes)"
        return [rows // p] * p, None
    try:
        values = list(sizes)
    except Exception:  # noqa: BLE001 - as new_group's: refused on every rank
        return [], f"{name}_split_sizes: expected {p} ints, got {sizes!r}"
    if len(values) != p or not all(isinstance(v, (int, np.integer)) and not isinstance(
            v, (bool, np.bool_)) and v >= 0 for v in values):
        return [], f"{name}_split_sizes: expected {p} non-negative ints, got {values}"
    values = [int(v) for v in values]  # (summed as NumPy's uint8 they would wrap)
    if sum(values) != rows:
        return [], (f"{name}_split_sizes: they sum to {sum(values)}, but the {name} has "
                    f"{rows} rows (dim 0)")
    return values, None


def all_to_all_single(output: Any, input: Any, output_split_sizes: Sequence[int] | None = None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None = None, group: Any = None,
                      async_op: bool = False, algorithm: str = "auto") -> Any:
    """Block j of ``input`` (along the first dimension) to rank j; block i of ``output``
    from rank i (even blocks, or the split sizes). One collective whether split sizes are
    given or not (all_to_all_v: its counts exchange agrees what every rank sends), so a
    rank that gives even sizes meets one that gives None, as in torch."""
    g = _member(group, "all_to_all_single")
    if g is None:
        return None
    p = g.comm.size
    made = g.comm.all_to_all_v
    x = _given(input, "input")
    problem = f"input: expected a tensor, got {type(input).__name__}" \
        if not hasattr(x, "shape") else \
        "input: needs at least one dimension (dim 0 is split)" if x.ndim == 0 else None
    send: list[int] = []
    if problem is None:
        send, problem = _splits(input_split_sizes, x.shape[0], p, "input")
    if problem is not None:  # all_to_all_v's counts exchange refuses it on every rank
        _refused_by(made, (None, None), problem, algorithm, async_op)
    out, expect, problem = None, [], None
    try:
        out = _view(output, "output")
        writable(output, "output")
        problem = _read_only(out, "output")
    except MpicollError as exc:
        problem = str(exc)
    if problem is None and (out.ndim == 0 or out.dtype != x.dtype):
        problem = (f"output: expected a tensor of {x.dtype} (as the input) with a dim 0, got "
                   f"shape {tuple(out.shape)} of {out.dtype}")
    if problem is None and output_split_sizes is None and input_split_sizes is None:
        # torch: without split sizes, an output of any shape of the input's size
        if out.size != x.size:
            problem = f"output: expected {x.size} elements (as the input), got shape {tuple(out.shape)}"
        expect = [x.shape[0] // max(p, 1)] * p
    elif problem is None:
        expect, problem = _splits(output_split_sizes, out.shape[0], p, "output")
        if problem is None and out.shape[1:] != x.shape[1:]:
            problem = (f"output: expected rows of shape {tuple(x.shape[1:])} (as the input's), "
                       f"got shape {tuple(out.shape)}")

    def finish(result: Any) -> None:
        rows, received = result
        if list(received) != expect:
            given = "output_split_sizes" if output_split_sizes is not None else \
                "output_split_sizes (None: even blocks)"
            raise InvalidArgumentError(
                f"{given}: this rank received {list(received)} rows from the ranks, "
                f"expected {expect} (the senders' input_split_sizes differ)")
        out[...] = rows.reshape(out.shape)  # (rows in rank order: any shape of their size)

    return _then(made, (x, send), finish, problem, [output], **_how(algorithm, async_op))


def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False, algorithm: str = "auto") -> Any:
    """``input_tensor_list[j]`` to rank j; ``output_tensor_list[i]`` from rank i."""
    g = _member(group, "all_to_all")
    if g is None:
        return None
    p = g.comm.size
    ins, problem = _tensors(input_tensor_list, "input_tensor_list", p, None)
    if problem is None and len({a.dtype for a in ins}) > 1:
        problem = f"input_tensor_list: tensors of one dtype, got {sorted({str(a.dtype) for a in ins})}"
    if problem is not None:  # (all_to_all_v's counts exchange refuses it on every rank)
        _refused_by(g.comm.all_to_all_v, (None, None), problem, algorithm, async_op)
    flat = module_of(ins[0]).concatenate([a.reshape(-1) for a in ins]) if ins else None
    outs, problem = _tensors(output_tensor_list, "output_tensor_list", p, None, written=True)
    if problem is None and any(o.dtype != flat.dtype for o in outs):
        problem = f"output_tensor_list: tensors of the inputs' dtype {flat.dtype}"

    def finish(result: Any) -> None:
        _unpack(outs, *result, "output_tensor_list")

    return _then(g.comm.all_to_all_v, (flat, [a.size for a in ins]), finish, problem,
                 _listed(output_tensor_list), **_how(algorithm, async_op))


def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None,
            algorithm: str = "auto") -> Any:
    """``scatter_list[j]`` of ``src`` into rank j's ``tensor``."""
    g = _member(group, "scatter")
    if g is None:
        return None
    root = _root_of(g, g.comm.scatter, 0 if src is None and group_src is None else src,
                    group_src, "src", algorithm, async_op)
    stacked, refusal, problem = None, None, None
    if g.comm.rank == root:
        like = _given(tensor, "tensor")
        rows, wrong = _tensors(scatter_list, "scatter_list", g.comm.size, like) \
            if _given_list(scatter_list) else ([], "scatter_list: must be given on the source rank")
        if wrong is not None:
            refusal = InvalidArgumentError(wrong)
        else:
            shape = like.shape if _is_array(like) else rows[0].shape
            if any(r.size != rows[0].size or r.dtype != rows[0].dtype for r in rows):
                refusal = InvalidArgumentError("scatter_list: tensors of one size and dtype")
            else:
                stacked = module_of(rows[0]).stack([r.reshape(shape) for r in rows])
    elif _given_list(scatter_list):
        problem = "scatter_list: must not be given on a rank that is not the source (as torch)"
    problem = problem or _no_output(tensor, "tensor")
    try:  # a refused list travels in the root's header: every rank raises
        return _then(g.comm.scatter, (stacked, root), _nothing, problem, [tensor],
                     out=tensor, **_how(algorithm, async_op))
    except InvalidArgumentError as exc:
        if refusal is not None:
            raise refusal from exc
        raise


def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None,
           algorithm: str = "auto") -> Any:
    """Every rank's ``tensor`` into ``dst``'s ``gather_list``."""
    g = _member(group, "gather")
    if g is None:
        return None
    root = _root_of(g, g.comm.gather, 0 if dst is None and group_dst is None else dst,
                    group_dst, "dst", algorithm, async_op)
    x = _given(tensor, "tensor")
    if g.comm.rank == root:
        outs, problem = _tensors(gather_list, "gather_list", g.comm.size, x,
                                 written=True) \
            if _given_list(gather_list) else ([], "gather_list: must be given on the destination rank")
    else:
        outs, problem = [], ("gather_list: must not be given on a rank that is not the "
                             "destination (as torch)") if _given_list(gather_list) else None

    def finish(rows: Any) -> None:
        for view, row in zip(outs, rows if rows is not None else (), strict=True):
            view[...] = row.reshape(view.shape)

    return _then(g.comm.gather, (x, root), finish, problem,
                 _listed(gather_list) if outs else [], **_how(algorithm, async_op))


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None,
            timeout: Any = None, algorithm: str = "auto") -> Any:
    """``timeout``: a timedelta (or seconds), as torch's: the barrier not done within it
    raises CollectiveTimeoutError naming the ranks not there yet (as monitored_barrier);
    None: the group's own timeout bounds it, as every call. With ``async_op=True`` give
    the timeout to the Work's ``wait()``."""
    g = _member(group, "barrier")
    if g is None:
        return None
    if timeout is not None and not async_op:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        g.comm.monitored_barrier(seconds)
        return None
    return _maybe(g.comm.barrier(**_how(algorithm, async_op)), async_op)


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    g = _member(group, "monitored_barrier")
    if g is None:
        return
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    g.comm.monitored_barrier(seconds, wait_all_ranks)


# -- objects: torch's *_object collectives ---------------------------------------------------
#
# As torch's, each object goes as its pickle (a control path, never the arrays' data path:
# only for objects from ranks you trust; unpickling runs code). The bytes go as uint8 arrays
# through the v-collectives and broadcast, whose headers carry every size, each piece after
# a status byte: an object that cannot be pickled goes as its error's text instead, so its
# rank takes part and every rank that receives the piece raises, naming the rank.

_PICKLED, _FAILED = 0, 1


def _packed(obj: Any, name: str, rank: int) -> np.ndarray:
    """``obj``'s pickle after the status byte (or, where it has none, why)."""
    try:
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any object's own error, named
        return _failed(f"{name} on rank {rank} cannot be pickled "
                       f"({type(exc).__name__}: {exc})")
    return np.frombuffer(bytes([_PICKLED]) + body, np.uint8)


def _failed(why: str) -> np.ndarray:
    """A piece that says why its object is not there (``_unpacked`` raises it)."""
    return np.frombuffer(bytes([_FAILED]) + why.encode(), np.uint8)


def _unpacked(pieces: Sequence[np.ndarray], name: str) -> list[Any]:
    """The objects of ``_packed`` pieces; a piece that says its object failed raises."""
    failed = [bytes(p[1:]).decode(errors="replace") for p in pieces if p[0] == _FAILED]
    if failed:
        raise InvalidArgumentError("; ".join(failed))
    objects = []
    for piece in pieces:
        try:
            objects.append(pickle.loads(piece[1:].tobytes()))
        except Exception as exc:  # noqa: BLE001 - the sender's class unknown here, and the like
            raise InvalidArgumentError(f"{name}: an object received cannot be unpickled here "
                                       f"({type(exc).__name__}: {exc})") from exc
    return objects


def _sent(g: ProcessGroup, data: np.ndarray | None) -> Any:
    """The bytes as the group's backend moves them: on nccl, GPU arrays (CuPy)."""
    if data is None or g.comm.backend != "nccl":
        return data
    return cupy_module().asarray(data)


def _got(data: Any) -> np.ndarray:
    """Received bytes on the host."""
    return data if data is None or type(data) is np.ndarray else data.get()


def _rows(data: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """``data`` cut into consecutive pieces of ``counts`` bytes."""
    ends = np.cumsum([0, *counts])
    return [data[ends[i]:ends[i + 1]] for i in range(len(counts))]


def _a_list(given: Any, length: int | None) -> bool:
    return isinstance(given, list) and (length is None or len(given) == length)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Every rank's ``obj`` into ``object_list`` (one entry per rank of the group)."""
    g = _member(group, "all_gather_object")
    if g is None:
        return
    gathered, counts = g.comm.all_gather_v(_sent(g, _packed(obj, "obj", get_rank())))
    objects = _unpacked(_rows(_got(gathered), counts), "object_list")
    if not _a_list(object_list, g.comm.size):  # (it took part: the others have theirs)
        raise InvalidArgumentError(f"object_list: expected a list of {g.comm.size} entries "
                                   "(one per rank of the group)")
    object_list[:] = objects


def gather_object(obj: Any, object_gather_list: list[Any] | None = None,
                  dst: int | None = None, group: Any = None,
                  group_dst: int | None = None) -> None:
    """Every rank's ``obj`` into ``dst``'s ``object_gather_list``."""
    g = _member(group, "gather_object")
    if g is None:
        return
    root = _root_of(g, g.comm.gather_v, 0 if dst is None and group_dst is None else dst,
                    group_dst, "dst", "auto", False)
    piece = _packed(obj, "obj", get_rank())
    gathered, counts = g.comm.gather_v(_sent(g, piece), root)
    if g.comm.rank != root:
        if piece[0] == _FAILED:  # its own object: it took part, and raises
            _unpacked([piece], "obj")
        if object_gather_list is not None:
            raise InvalidArgumentError("object_gather_list: must not be given on a rank that "
                                       "is not the destination (as torch)")
        return
    objects = _unpacked(_rows(_got(gathered), counts), "object_gather_list")
    if not _a_list(object_gather_list, g.comm.size):
        raise InvalidArgumentError(f"object_gather_list: expected a list of {g.comm.size} "
                                   "entries on the destination rank")
    object_gather_list[:] = objects  # type: ignore[index]


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """``src``'s objects into every rank's ``object_list`` (of the same length)."""
    g = _member(group, "broadcast_object_list")
    if g is None:
        return
    root = _root_of(g, g.comm.broadcast, 0 if src is None and group_src is None else src,
                    group_src, "src", "auto", False)
    mine = g.comm.rank == root
    sent = None
    if mine:  # (not a list: why, in the packet, so every rank raises)
        sent = _packed(list(object_list), "object_list", get_rank()) \
            if _a_list(object_list, None) else _failed(
                f"object_list on rank {get_rank()} (the source): expected a list, got "
                f"{type(object_list).__name__}")
    received = _got(g.comm.broadcast(_sent(g, sent), root))  # (its size: in the header)
    if mine:  # the source keeps its own objects (it raises where they failed to pickle)
        if sent[0] == _FAILED:  # type: ignore[index]
            _unpacked([sent], "object_list")  # type: ignore[list-item]
        if not _a_list(object_list, None):
            raise InvalidArgumentError("object_list: expected a list")
        return
    (objects,) = _unpacked([received], "object_list")
    if not _a_list(object_list, None) or len(objects) != len(object_list):
        raise InvalidArgumentError(f"object_list: expected a list of {len(objects)} entries, "
                                   "as the source's")
    object_list[:] = objects


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    """The j-th of ``src``'s ``scatter_object_input_list`` into rank j's
    ``scatter_object_output_list[0]``."""
    g = _member(group, "scatter_object_list")
    if g is None:
        return
    root, size = _root_of(g, g.comm.scatter_v, 0 if src is None and group_src is None
                          else src, group_src, "src", "auto", False), g.comm.size
    data = counts = None
    if g.comm.rank == root:
        problem = None
        if _a_list(scatter_object_input_list, size):
            pieces = [_packed(obj, "scatter_object_input_list", get_rank())
                      for obj in scatter_object_input_list]  # type: ignore[union-attr]
            failed = [piece for piece in pieces if piece[0] == _FAILED]
            problem = failed[0] if failed else None
        else:
            problem = _failed(f"scatter_object_input_list on rank {get_rank()}: expected a "
                              f"list of {size} objects on the source rank")
        if problem is not None:  # every rank is told (the source too), each the reason
            pieces = [problem] * size
        data, counts = np.concatenate(pieces), [piece.size for piece in pieces]
    mine = _got(g.comm.scatter_v(_sent(g, data), counts, root))
    (obj,) = _unpacked([mine], "scatter_object_output_list")
    if not _a_list(scatter_object_output_list, None) or not scatter_object_output_list:
        raise InvalidArgumentError("scatter_object_output_list: expected a list of at least "
                                   "one entry (its first receives the object)")
    scatter_object_output_list[0] = obj


def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None) -> None:
    """``object_list``'s objects to ``dst``, as torch's: their pickles' sizes, then the
    pickles (the receiver's list has as many entries). An object that cannot be pickled
    goes as that reason: the receiver raises it, and so does this rank, after sending."""
    g = _member(group, "send_object_list")
    if g is None:
        return
    peer = _root(g, dst, group_dst, "dst")
    if not isinstance(object_list, list):
        raise InvalidArgumentError(f"object_list: expected a list, got {type(object_list).__name__}")
    pieces = [_packed(obj, f"object_list[{i}]", get_rank()) for i, obj in enumerate(object_list)]
    g.comm.send(_sent(g, np.array([piece.size for piece in pieces], np.int64)), peer)
    g.comm.send(_sent(g, np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)), peer)
    failed = [piece for piece in pieces if piece[0] == _FAILED]
    if failed:
        _unpacked(failed, "object_list")


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None) -> int:
    """``send_object_list``'s objects into ``object_list`` (as many entries as were sent),
    from ``src`` or any rank; the sender's rank (-1 outside the group), as torch's."""
    g = _member(group, "recv_object_list")
    if g is None:
        return -1
    if not isinstance(object_list, list):
        raise InvalidArgumentError(f"object_list: expected a list, got {type(object_list).__name__}")
    source = ANY if src is None and group_src is None else _root(g, src, group_src, "src")
    sent = len(object_list)
    if g.comm.backend != "nccl":  # the sizes looked at first: a list of another length
        status = g.comm.probe(source, 0)  # still takes both messages, then raises (NCCL
        source, sent = status.source, status.nbytes // 8  # cannot look: exact sizes)
    sizes = _sent(g, np.zeros(sent, np.int64))
    sender = g.comm.recv(sizes, source, 0)
    counts = [int(n) for n in _got(sizes)]
    data = _sent(g, np.empty(sum(counts), np.uint8))
    g.comm.recv(data, sender, 0)
    if sent != len(object_list):
        raise InvalidArgumentError(f"object_list: rank {g.ranks[sender]} sent {sent} objects, "
                                   f"the list has {len(object_list)} entries (as torch, the "
                                   "receiver's list has as many as the sender's)")
    object_list[:] = _unpacked(_rows(_got(data), counts), "object_list")
    return g.ranks[sender]


# -- point-to-point ------------------------------------------------------------------------


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    g = _member(group, "send")
    if g is not None:
        g.comm.send(tensor, _root(g, dst, group_dst, "dst"), tag)


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` (from any rank when ``src`` is None); the sender's rank
    (-1 outside the group)."""
    g = _member(group, "recv")
    if g is None:
        return -1
    source = ANY if src is None and group_src is None else _root(g, src, group_src, "src")
    status = Status()
    sender = g.comm.recv(tensor, source, tag, status)
    _received_whole(tensor, status, g, "recv")
    return g.ranks[sender]


def _received_whole(tensor: Any, status: Status, g: ProcessGroup, what: str) -> None:
    """torch's receives fill the tensor whole: a shorter message (which MPI takes into
    the tensor's first bytes) raises, rather than leave the rest as it was."""
    nbytes = getattr(tensor, "nbytes", None)
    if nbytes is not None and status.nbytes != nbytes:
        raise InvalidArgumentError(
            f"{what}: the message from rank {g.ranks[status.source]} (tag {status.tag}) had "
            f"{status.nbytes} bytes, the tensor {nbytes}: it holds them in its first bytes; "
            "torch.distributed's receives fill the whole tensor")


class _P2PWork(Work):
    """torch's Work of an isend/irecv: ``wait(timeout)``, ``is_completed()``,
    ``source_rank()`` (an irecv's sender, its rank in the Work's group, as torch's gloo
    backend gives it; ``source()`` the same), ``result()`` (``[tensor]``, once done)."""

    def __init__(self, request: Any, group: ProcessGroup, received: Any = None,
                 tensor: Any = None) -> None:
        self._request, self._group = request, group
        self._received = received  # an irecv's tensor, checked as received whole
        self._tensor = received if tensor is None else tensor

    def wait(self, timeout: Any = None) -> bool:
        """``timeout``: a timedelta (or seconds), as torch's; None or 0 (torch's default):
        no limit of its own (the watchdog's bounds it). Not done within it: a
        CollectiveTimeoutError, the message still pending (wait again, or let it end)."""
        status = Status()
        self._request.wait(status, timeout=timeout)
        if self._received is not None:
            _received_whole(self._received, status, self._group, "irecv")
        return True

    def is_completed(self) -> bool:
        return self._request.test()

    def source(self) -> int:
        if self._received is None:
            raise InvalidArgumentError("source(): a send's Work has no source (an irecv's has)")
        return self._request.wait()  # (the sender's rank in the group, as gloo's)

    source_rank = source  # torch's name

    def result(self) -> list[Any]:
        """``[tensor]``, the message's tensor, as torch's ``Work.result()`` (waits)."""
        self.wait()
        return [] if self._tensor is None else [self._tensor]

    def exception(self) -> BaseException | None:
        """The error of a message that ended in one (None: none, or not done yet)."""
        try:
            if not self._request.test():
                return None
            self.wait()
        except MpicollError as exc:
            return exc
        return None

    def is_success(self) -> bool:
        """Whether it ended without an error (never raises, as torch's)."""
        try:
            return self._request.test() and self.exception() is None
        except MpicollError:
            return False

    def get_future(self) -> Any:
        """torch's point-to-point Work has no future (gloo's and NCCL's raise): wait()."""
        raise InvalidArgumentError("get_future(): a point-to-point message's Work has no "
                                   "future (as torch's); use wait() or is_completed()")


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> _P2PWork | None:
    g = _member(group, "isend")
    if g is None:
        return None
    return _P2PWork(g.comm.isend(tensor, _root(g, dst, group_dst, "dst"), tag), g, None, tensor)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> _P2PWork | None:
    g = _member(group, "irecv")
    if g is None:
        return None
    source = ANY if src is None and group_src is None else _root(g, src, group_src, "src")
    return _P2PWork(g.comm.irecv(tensor, source, tag), g, tensor)


class P2POp:
    """One message of ``batch_isend_irecv``: ``P2POp(dist.isend, tensor, peer)``."""

    def __init__(self, op: Any, tensor: Any, peer: int | None = None, group: Any = None,
                 tag: int = 0, group_peer: int | None = None) -> None:
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag
        self.group_peer = group_peer


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[_P2PWork]:
    """Start every message of the list (all on one group, as torch's)."""
    try:
        p2p_op_list = list(p2p_op_list)
    except TypeError:
        raise InvalidArgumentError(f"batch_isend_irecv: expected a list of P2POp, got "
                                   f"{type(p2p_op_list).__name__}") from None
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise InvalidArgumentError(f"batch_isend_irecv: item {i} is a "
                                       f"{type(p).__name__}, expected a dist.P2POp")
    if not p2p_op_list:
        return []
    group = p2p_op_list[0].group
    if any(p.group is not group for p in p2p_op_list):
        raise InvalidArgumentError("batch_isend_irecv: every P2POp must use the same group")
    g = _member(group, "batch_isend_irecv")
    if g is None:
        return []
    ops = [_P2POp(getattr(p.op, "__name__", p.op), p.tensor,
                  _root(g, p.peer, p.group_peer, "peer"), p.tag) for p in p2p_op_list]
    return [_P2PWork(r, g, op.tensor if op.op == "irecv" else None, op.tensor)
            for r, op in zip(g.comm.batch_isend_irecv(ops), ops, strict=True)]
