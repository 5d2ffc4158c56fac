"""torch.distributed's process groups over mpicoll's Communicators: the default
group, new groups, subgroups and device meshes, the backends' names, the debug level."""

from __future__ import annotations

import contextlib
import datetime
import enum
import os
import sys
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..communicator import Communicator
from ..errors import AbortedError, InvalidArgumentError, MpicollError, SettingMismatchError
from ..groups import agreed_rows, split_lists
from ..observe.watchdog import DEFAULT_TIMEOUT

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
    """torch.distributed.ReduceOp's members, as mpicoll's op names (PREMUL_SUM, NCCL's
    scaled sum, has none: a call given it refuses it, as an unknown op, on every rank)."""

    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"


reduce_op = ReduceOp  # torch's deprecated name


def _op(op: Any) -> Any:
    # _value_: the member's value without the Enum property's cost (every call pays it)
    if type(op) is ReduceOp:
        return op._value_
    if isinstance(op, ReduceOp):
        return op.value
    if type(op).__name__ == "RedOpType":  # torch.distributed's own ReduceOp.SUM ...: ours
        # of that name (another, such as UNUSED, refused by the call as an unknown op)
        name = str(getattr(op, "name", op))
        return ReduceOp[name]._value_ if name in ReduceOp.__members__ else name.lower()
    return op


class ProcessGroup:
    """A group of the job's ranks: its Communicator and the global rank of each member."""

    def __init__(self, comm: Communicator, ranks: list[int], asked: str | None = None) -> None:
        self.comm, self.ranks = comm, ranks
        if ranks != list(range(len(ranks))):  # its errors say the global ranks too
            comm._rank_names = list(ranks)
        self.asked = asked  # "gloo" where the group was asked for gloo (run over MPI)
        self._local = {g: i for i, g in enumerate(ranks)}
        # its async calls' progress thread made now, where every member is (torch's
        # first async_op=True call returns at once: made there, its duplicate
        # communicator, a collective, would wait for every member's first async call)
        if comm._backend.ranks_are_threads or _thread_multiple():
            comm.start_progress()

    def rank(self) -> int:
        return self.comm.rank

    def size(self) -> int:
        return self.comm.size

    def local(self, global_rank: int, name: str) -> int:
        """A global rank as this group's rank (torch's src/dst/peer are global)."""
        if isinstance(global_rank, (bool, np.bool_)) or not isinstance(
                global_rank, (int, np.integer)):  # (1.0 and True hash as 1)
            raise InvalidArgumentError(f"{name}: expected a rank (int), got "
                                       f"{type(global_rank).__name__} {global_rank!r}")
        try:
            return self._local[global_rank]
        except KeyError:
            raise InvalidArgumentError(
                f"{name}: rank {global_rank!r} is not in this group (ranks {self.ranks})") from None

    def __repr__(self) -> str:
        return f"<mpicoll.dist.ProcessGroup ranks {self.ranks}>"


def _thread_multiple() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (mpi4py's default), which async calls
    need (a group made without it: its first async call refuses, saying so)."""
    from mpi4py import MPI

    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


class GroupMember:
    """torch's marker for a rank outside a group that ``new_group`` made: -100, as
    torch's (``group == dist.GroupMember.NON_GROUP_MEMBER``, or ``== -100``)."""

    NON_GROUP_MEMBER = -100
    WORLD: ProcessGroup | None = None


def _outside(group: Any) -> bool:
    """Whether ``group`` is torch's marker of a rank outside the group (an int, never a
    bool or a group)."""
    return type(group) is int and group == GroupMember.NON_GROUP_MEMBER


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
                f"init_process_group: rank(s) {', '.join(map(str, ranks))} were given a rank or world size that is "
                f"not the MPI launcher's{': ' + problem if problem else ''}; start the job "
                "with mpiexec or srun")
        ranks = [int(r) for r in np.flatnonzero(flags == 2)]
        raise InvalidArgumentError(f"init_process_group: on rank(s) {', '.join(map(str, ranks))}, "
                                   f"{debug or 'TORCH_DISTRIBUTED_DEBUG is not a debug level'}")
    world = ProcessGroup(comm, list(range(comm.size)), _asked(backend))
    _STATE["world"], _STATE["backend"], _STATE["made"] = world, name, 1
    GroupMember.WORLD = _Group.WORLD = world


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free ``group``, or every group and the default one (every rank calls it; each
    frees the groups it is in, in the order they were made, as every rank made them).
    The default group itself (``dist.group.WORLD``) is all of them, as torch's."""
    if group is None or (group is _STATE["world"] and group is not None):
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
        if group.comm.freed:  # (torch: "Invalid process group specified")
            raise InvalidArgumentError(f"destroy_process_group: {group!r} was destroyed "
                                       "already")
        group.comm.free()
        groups = _STATE["groups"]  # (not kept: a loop of new_group and destroy would keep
        if group in groups:  # every freed group, and its workspace, to the end)
            groups.remove(group)
    elif not _outside(group):  # (a rank outside it: nothing to free)
        raise InvalidArgumentError(f"destroy_process_group: expected a process group (or "
                                   f"None: all of them), got {type(group).__name__}")


def _group(group: Any) -> ProcessGroup:
    if group is None:
        world = _STATE["world"]
        if world is None:
            raise InvalidArgumentError("the default process group is not initialized: call "
                                       "mpicoll.dist.init_process_group() first")
        return world
    if _outside(group):
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
    if _outside(group):
        return -1
    return _group(group).comm.rank


def get_world_size(group: Any = None) -> int:
    if _outside(group):
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
    # (0: a rank's refusal; the others: the backend most give; a value that is no
    # backend's code: a rank in another call's step of one value, counted as refused)
    codes = np.where(np.isin(codes, list(_BACKEND_CODES.values())), codes, 0)
    given = codes[codes != 0]
    most = int(np.bincount(given).argmax()) if given.size else 0
    if not codes.all() or (codes != most).any():
        odd = [r for r in range(len(codes)) if codes[r] != most or not codes[r]]
        raise InvalidArgumentError(
            f"{what}: refused on rank(s) {', '.join(map(str, odd))}{' (here: ' + problem + ')' if problem else ''}"
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
    """Whether ``reduceOp`` reduces complex tensors: sum, avg and prod (which torch
    refuses; here it is the complex product); the orderings and bitwise ops do not."""
    return _op(reduceOp) in ("sum", "avg", "prod")


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


def _grid(mesh: Any) -> np.ndarray:
    """A mesh's grid of ranks as given (a tensor, an array or nested lists) as an array;
    ragged lists, or no sequence, as a 0-d array (which no grid check accepts)."""
    try:
        return np.array(mesh.tolist() if hasattr(mesh, "tolist") else mesh)
    except Exception:  # noqa: BLE001 - refused by the caller's check
        return np.array(None)


def _distinct_names(names: tuple, ndim: int) -> bool:
    """Whether ``names`` names each of ``ndim`` dimensions once, each a string."""
    return len(names) == ndim and len(set(names)) == len(names) and \
        all(isinstance(n, str) for n in names)


class DeviceMesh:
    """torch's DeviceMesh over mpicoll: the job's ranks as an n-dimensional grid, with this
    rank's group along each dimension. ``mesh``: the global ranks in the grid's shape (a
    NumPy array, where torch's is a tensor); ``mesh["tp"]`` (or ``mesh["dp", "tp"]``): the
    sub-mesh along those dimensions through this rank, as torch's.

    Made by ``init_device_mesh`` (row-major), or as torch's constructor makes one:
    ``DeviceMesh("cpu", torch.arange(8).reshape(2, 4), mesh_dim_names=("dp", "tp"))``,
    the grid of ranks given (a tensor, an array or nested lists holding every rank of the
    job once); every rank makes it with the same grid (one split a dimension; a bad or
    different grid on any rank raises on every rank, before any group is made). Each
    dimension's groups hold their ranks in rank order (as torch's new_group)."""

    def __init__(self, device_type: str, mesh: Any, *, mesh_dim_names: Any = None,
                 **torch_options: Any) -> None:
        world = _default_group_for_mesh()
        size = world.comm.size
        ranks = _grid(mesh)
        problem = ""
        if ranks.ndim == 0 or ranks.dtype.kind not in "iu" or \
                sorted(ranks.reshape(-1).tolist()) != list(range(size)):
            problem = (f"mesh: expected a grid of the job's {size} ranks, each once, "
                       f"got {mesh!r}")
        names: tuple = ()
        if not problem:
            try:
                names = tuple(mesh_dim_names) if mesh_dim_names is not None else \
                    tuple(f"dim{d}" for d in range(ranks.ndim))
            except TypeError:
                names = (None,)
            if not _distinct_names(names, ranks.ndim):
                problem = (f"mesh_dim_names: expected {ranks.ndim} different names, got "
                           f"{mesh_dim_names!r}")
        if torch_options.keys() - {"backend_override", "_init_backend"}:
            problem = problem or f"DeviceMesh: no keyword {sorted(torch_options)[0]!r}"
        # agreed before any group is made: a problem, or another grid, on any rank raises
        # on every rank
        digest = 0 if problem else zlib.crc32(repr((ranks.tolist(), names)).encode()) + 1
        given = agreed_rows(world.comm, np.array([digest], np.int64), sys._getframe(1),
                            "DeviceMesh")[:, 0]
        if not given.all() or (given != given[0]).any():
            values = [int(v) for v in given if v]
            most = max(values, key=values.count) if values else 0  # (the grid most give)
            odd = [r for r in range(size) if given[r] != most or not most]
            raise InvalidArgumentError(
                f"DeviceMesh: refused on rank(s) {', '.join(map(str, odd))}{' (here: ' + problem + ')' if problem else ''}"
                "; every rank gives the same grid of the job's ranks and the same names")
        groups: dict[str, ProcessGroup] = {}
        try:
            for d, name in enumerate(names):  # every line of the grid along dimension d
                lines = np.moveaxis(ranks, d, -1).reshape(-1, ranks.shape[d]).tolist()
                made = split_group(None, [[world.ranks.index(r) for r in line]
                                          for line in lines])
                assert made is not None  # (every rank is on one line of each dimension)
                groups[name] = made
        except BaseException:  # a later split failed (on every rank): the groups made go
            for made in groups.values():
                with contextlib.suppress(Exception):  # (the split's own error goes on)
                    destroy_process_group(made)
            raise
        me = world.ranks[world.comm.rank]
        coordinate = tuple(int(c) for c in np.argwhere(ranks == me)[0])
        self._set(device_type, ranks, groups, names, coordinate, me, mesh_dim_names is not None)

    @classmethod
    def from_group(cls, group: Any, device_type: str, mesh: Any = None, *,
                   mesh_dim_names: Any = None) -> DeviceMesh:
        """A mesh over groups already made, as torch's ``DeviceMesh.from_group``: one
        group (a 1-D mesh of its ranks; ``mesh``, if given, its ranks in order), or a list
        of groups, this rank's along each dimension of ``mesh`` (the grid of global ranks,
        required then). No message: each rank checks its own groups against the grid."""
        groups = list(group) if isinstance(group, (list, tuple)) else [group]
        if not groups:
            raise InvalidArgumentError("DeviceMesh.from_group: expected a group, or a list "
                                       "of groups (one per dimension), got an empty list")
        for g in groups:
            if not isinstance(g, ProcessGroup):
                raise InvalidArgumentError(
                    f"DeviceMesh.from_group: expected a process group this rank is in, got "
                    f"{g!r} (a rank outside a group has no place in its mesh)")
        if mesh is None:
            if len(groups) != 1:
                raise InvalidArgumentError("DeviceMesh.from_group: a list of groups needs "
                                           "mesh=, the grid of their ranks")
            mesh = groups[0].ranks
        ranks = _grid(mesh)
        me = groups[0].ranks[groups[0].comm.rank]
        if ranks.ndim != len(groups) or ranks.dtype.kind not in "iu" or \
                len(set(ranks.reshape(-1).tolist())) != ranks.size or not (ranks == me).any():
            raise InvalidArgumentError(
                f"DeviceMesh.from_group: mesh: expected a grid of distinct global ranks with "
                f"one dimension per group ({len(groups)}) holding this rank ({me}), got {mesh!r}")
        coordinate = tuple(int(c) for c in np.argwhere(ranks == me)[0])
        for d, g in enumerate(groups):  # the line through this rank along d: g's ranks
            line = np.moveaxis(ranks, d, -1)[tuple(c for i, c in enumerate(coordinate)
                                                   if i != d)].tolist()
            if sorted(line) != sorted(g.ranks):
                raise InvalidArgumentError(
                    f"DeviceMesh.from_group: group {d} holds ranks {g.ranks}, but the mesh's "
                    f"line through rank {me} along dimension {d} is {line}")
        names = tuple(f"dim{d}" for d in range(ranks.ndim)) if mesh_dim_names is None \
            else tuple(mesh_dim_names) if isinstance(mesh_dim_names, (list, tuple)) else ()
        if not _distinct_names(names, ranks.ndim):
            raise InvalidArgumentError(f"mesh_dim_names: expected {ranks.ndim} different "
                                       f"names, got {mesh_dim_names!r}")
        return cls._of(device_type, ranks, dict(zip(names, groups, strict=True)), names,
                       coordinate, me, mesh_dim_names is not None)

    @classmethod
    def _of(cls, device_type: str, ranks: np.ndarray, groups: dict[str, ProcessGroup],
            names: tuple[str, ...], coordinate: tuple[int, ...], rank: int,
            named: bool = True) -> DeviceMesh:
        """A mesh of groups already made (init_device_mesh's, a sub-mesh's)."""
        mesh = cls.__new__(cls)
        mesh._set(device_type, ranks, groups, names, coordinate, rank, named)
        return mesh

    def _set(self, device_type: str, ranks: np.ndarray, groups: dict[str, ProcessGroup],
             names: tuple[str, ...], coordinate: tuple[int, ...], rank: int,
             named: bool) -> None:
        self.device_type, self.mesh = device_type, ranks
        # (None where it was given no names, as torch's: the dimensions are then asked
        # for by index; ``_names``, the groups' keys, are "dim0", "dim1", ...)
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
        """This rank's rank in the group along ``mesh_dim``, as torch's: the group holds its
        ranks sorted, so in a grid not in rank order (``[[3, 2], [1, 0]]``) it is not this
        rank's coordinate (``get_coordinate()``), but its place in what the group's
        collectives give, as ``dist.get_rank(mesh.get_group(mesh_dim))``."""
        return self._groups[self._names[self._dim(mesh_dim, "get_local_rank")]].comm.rank

    def get_rank(self) -> int:
        """This rank's global rank."""
        return self._rank

    def get_coordinate(self) -> tuple[int, ...]:
        """This rank's coordinates in the mesh, one per dimension (a tuple, as torch's)."""
        return self._coordinate

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
        return DeviceMesh._of(self.device_type, self.mesh[index], {n: self._groups[n] for n in names},
                          names, tuple(self._coordinate[d] for d in dims), self._rank)

    def _identity(self) -> tuple:
        return (tuple(self.mesh.reshape(-1).tolist()), self.mesh.shape, self.device_type,
                self.mesh_dim_names)

    def __eq__(self, other: object) -> bool:
        """As torch's: the same grid of ranks, device type and names (``mesh["tp"]`` made
        twice is one mesh; code compares meshes and keys dicts by them)."""
        if not isinstance(other, DeviceMesh):
            return NotImplemented
        return self is other or self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        return (f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}, "
                f"mesh_dim_names={self.mesh_dim_names})")


def _default_group_for_mesh() -> ProcessGroup:
    """The default group, made first where there is none yet, as torch's DeviceMesh makes
    it (``init_process_group()``: MPI, which takes host and GPU arrays alike; every rank
    makes the mesh, so every rank makes it)."""
    if not is_initialized():
        init_process_group()
    return _group(None)


def init_device_mesh(device_type: str, mesh_shape: Sequence[int],
                     mesh_dim_names: Sequence[str] | None = None, *,
                     backend_override: Any = None) -> DeviceMesh:
    """A mesh of the job's ranks, row-major (the last dimension inside a node when
    ranks are placed by node), as torch's ``init_device_mesh``; ``backend_override``
    taken as DeviceMesh's constructor takes it: every dimension's groups run on the
    default group's backend."""
    world = _default_group_for_mesh()
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
    return DeviceMesh._of(device_type, ranks, groups, tuple(names), tuple(mesh.coordinates),
                      world.ranks[world.comm.rank], named=mesh_dim_names is not None)


