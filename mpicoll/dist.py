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
arrays; "gloo" is taken as "mpi") and "nccl" (GPU arrays); ``recv`` needs ``src`` or
receives from any rank (not on "nccl") and returns the sender, as torch's.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .buffers.arrays import as_array, module_of
from .communicator import Communicator
from .errors import InvalidArgumentError
from .p2p import ANY
from .p2p import P2POp as _P2POp

__all__ = [
    "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "all_gather", "all_gather_into_tensor",
    "all_reduce", "all_to_all", "all_to_all_single", "barrier", "batch_isend_irecv",
    "broadcast", "destroy_process_group", "gather", "get_backend", "get_rank",
    "get_world_size", "init_device_mesh", "init_process_group", "irecv", "is_available",
    "is_initialized", "isend", "monitored_barrier", "new_group", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "send",
]


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


class ProcessGroup:
    """A group of the job's ranks: its Communicator and the global rank of each member."""

    def __init__(self, comm: Communicator, ranks: list[int]) -> None:
        self.comm, self.ranks = comm, ranks
        self._local = {g: i for i, g in enumerate(ranks)}

    def rank(self) -> int:
        return self.comm.rank

    def size(self) -> int:
        return self.comm.size

    def local(self, global_rank: int, name: str) -> int:
        """A global rank as this group's rank (torch's src/dst/peer are global)."""
        try:
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


_STATE: dict[str, Any] = {"world": None, "backend": None}


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _STATE["world"] is not None


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: Any = None, world_size: int = -1, rank: int = -1,
                       **_: Any) -> None:
    """Make the default group over every rank of the job (MPI_COMM_WORLD)."""
    if is_initialized():
        raise InvalidArgumentError("init_process_group: already initialized")
    name = (backend or "mpi").lower()
    name = "mpi" if name in ("gloo", "cpu:gloo", "mpi") else name
    if name not in ("mpi", "nccl"):
        raise InvalidArgumentError(f"backend: expected 'mpi' or 'nccl' (or 'gloo'), got {backend!r}")
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    comm = Communicator(backend=name, timeout=seconds)
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
    # agreed: a rank whose RANK or WORLD_SIZE is off makes every rank raise, naming it
    bad = np.array([1 if problem else 0], np.int64)
    flags = np.zeros(comm.size, np.int64)
    control = comm.control_comm
    if control is not None:
        control.Allgather(bad, flags)
    else:
        flags[comm.rank] = bad[0]
    if flags.any():
        ranks = [int(r) for r in np.flatnonzero(flags)]
        comm.free()
        raise InvalidArgumentError(
            f"init_process_group: rank(s) {ranks} were given a rank or world size that is not "
            f"the MPI launcher's{': ' + problem if problem else ''}; start the job with "
            "mpiexec or srun")
    world = ProcessGroup(comm, list(range(comm.size)))
    _STATE["world"], _STATE["backend"] = world, name
    GroupMember.WORLD = world


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Free ``group``, or every group and the default one."""
    if group is None:
        world = _STATE["world"]
        if world is not None:
            world.comm.free()
        _STATE["world"] = None
        GroupMember.WORLD = None
    elif isinstance(group, ProcessGroup):
        group.comm.free()


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
    _group(group)
    return _STATE["backend"]


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
              **_: Any) -> Any:
    """The group of ``ranks`` (sorted, as torch's; all ranks when None). Every rank of the
    job calls it; the others get ``GroupMember.NON_GROUP_MEMBER``."""
    world = _group(None)
    members = list(world.ranks) if ranks is None else list(ranks)
    if all(isinstance(r, (int, np.integer)) and not isinstance(r, bool) for r in members):
        members = sorted(int(r) for r in members)  # as torch's; else refused on every rank
    comm = world.comm.new_group(members)
    return GroupMember.NON_GROUP_MEMBER if comm is None else ProcessGroup(comm, members)


class DeviceMesh:
    """torch's DeviceMesh over mpicoll: ``get_group(name)`` is that dimension's group."""

    def __init__(self, mesh: Any, groups: dict[str, ProcessGroup], shape: tuple[int, ...],
                 names: tuple[str, ...]) -> None:
        self._mesh, self._groups = mesh, groups
        self.mesh_dim_names, self.shape = names, shape

    def get_group(self, mesh_dim: str | int = 0) -> ProcessGroup:
        name = self.mesh_dim_names[mesh_dim] if isinstance(mesh_dim, int) else mesh_dim
        if name not in self._groups:
            raise InvalidArgumentError(f"mesh_dim: no {mesh_dim!r}; the mesh has {self.mesh_dim_names}")
        return self._groups[name]

    def get_local_rank(self, mesh_dim: str | int = 0) -> int:
        return self.get_group(mesh_dim).comm.rank

    def size(self, mesh_dim: str | int | None = None) -> int:
        return int(np.prod(self.shape)) if mesh_dim is None else self.get_group(mesh_dim).comm.size

    def __getitem__(self, name: str) -> ProcessGroup:
        return self.get_group(name)


def init_device_mesh(device_type: str, mesh_shape: Sequence[int],
                     mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
    """A mesh of the job's ranks, row-major (the last dimension inside a node when
    ranks are placed by node), as torch's ``init_device_mesh``."""
    world = _group(None)
    shape = tuple(int(s) for s in mesh_shape)
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else \
        tuple(f"dim{d}" for d in range(len(shape)))
    mesh = world.comm.mesh(shape, names)
    groups = {}
    for d, name in enumerate(names):  # the ranks along dimension d through this rank
        stride = int(np.prod(shape[d + 1:]))
        first = world.comm.rank - mesh.coordinates[d] * stride
        groups[name] = ProcessGroup(mesh[name], [first + k * stride for k in range(shape[d])])
    return DeviceMesh(mesh, groups, shape, names)


# -- collectives: torch's names and in-place semantics --------------------------------


def _op(op: Any) -> Any:
    # _value_: the member's value without the Enum property's cost (every call pays it)
    return op._value_ if type(op) is ReduceOp else op.value if isinstance(op, ReduceOp) else op


def _view(tensor: Any, name: str) -> Any:
    """The tensor's memory as an array (no copy)."""
    return as_array(tensor, name)[0]


def _maybe(work: Any, async_op: bool) -> Any:
    return work if async_op else None


def _shaped(tensor: Any, name: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """(``tensor``'s memory in ``shape``, what copies a result into it afterwards): a view
    where the reshape is one, else a new array copied into the tensor at the end."""
    view = _view(tensor, name)
    shaped = view.reshape(shape)
    same = np.shares_memory(shaped, view) if type(view) is np.ndarray else \
        shaped.data.ptr == view.data.ptr
    if same or view.size == 0:
        return shaped, lambda result: None
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


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               algorithm: str = "auto") -> Any:
    """Reduce ``tensor`` across the group, in place."""
    g = _group(group)
    return _maybe(g.comm.all_reduce(tensor, _op(op), out=tensor, **_how(algorithm, async_op)),
                  async_op)


def broadcast(tensor: Any, src: int, group: Any = None, async_op: bool = False,
              algorithm: str = "auto") -> Any:
    """``src``'s tensor into every rank's ``tensor``."""
    g = _group(group)
    return _maybe(g.comm.broadcast(tensor, g.local(src, "src"), **_how(algorithm, async_op)),
                  async_op)


def reduce(tensor: Any, dst: int, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, algorithm: str = "auto") -> Any:
    """Reduce into ``dst``'s ``tensor`` (the others' are left as they were)."""
    g = _group(group)
    root = g.local(dst, "dst")
    out = tensor if g.comm.rank == root else None
    return _maybe(g.comm.reduce(tensor, _op(op), root, out=out, **_how(algorithm, async_op)),
                  async_op)


class _Finished:
    """A Work whose data still has to be copied into the caller's tensors at wait()."""

    def __init__(self, work: Any, finish: Any) -> None:
        self._work, self._finish, self._done = work, finish, False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            self._finish(self._work.wait())
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._work.test()

    test = is_completed


def _then(result: Any, finish: Any, async_op: bool) -> Any:
    if async_op:
        return _Finished(result, finish)
    finish(result)
    return None


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False,
               algorithm: str = "auto") -> Any:
    """Every rank's ``tensor`` into ``tensor_list[rank]``, on every rank."""
    g = _group(group)

    def finish(rows: Any) -> None:  # where this rank receives: it took part, now it refuses
        if len(tensor_list) != g.comm.size:
            raise InvalidArgumentError(
                f"tensor_list: expected {g.comm.size} tensors, got {len(tensor_list)}")
        for i, t in enumerate(tensor_list):
            _view(t, f"tensor_list[{i}]")[...] = rows[i]

    return _then(g.comm.all_gather(tensor, **_how(algorithm, async_op)), finish,
                 async_op)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False, algorithm: str = "auto") -> Any:
    """Every rank's input, concatenated (or stacked) in rank order, into ``output_tensor``."""
    g = _group(group)
    x = _view(input_tensor, "input_tensor")
    out, copy_back = _shaped(output_tensor, "output_tensor", (g.comm.size, *x.shape))
    result = g.comm.all_gather(input_tensor, out=out, **_how(algorithm, async_op))
    return _then(result, copy_back, async_op)


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM,
                   group: Any = None, async_op: bool = False, algorithm: str = "auto") -> Any:
    """Reduce ``input_list[j]`` across ranks into rank j's ``output``."""
    g = _group(group)
    if len(input_list) != g.comm.size:
        raise InvalidArgumentError(f"input_list: expected {g.comm.size} tensors, got {len(input_list)}")
    rows = [_view(t, f"input_list[{i}]") for i, t in enumerate(input_list)]
    stacked = module_of(rows[0]).stack(rows)
    return _maybe(g.comm.reduce_scatter(stacked, _op(op), out=output, **_how(algorithm, async_op)),
                  async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False,
                          algorithm: str = "auto") -> Any:
    """Reduce ``input`` (the group's blocks, concatenated) and keep this rank's block."""
    g = _group(group)
    out = _view(output, "output")
    x = _view(input, "input").reshape(g.comm.size, *out.shape)  # read: a copy is fine
    return _maybe(g.comm.reduce_scatter(x, _op(op), out=output, **_how(algorithm, async_op)),
                  async_op)


def all_to_all_single(output: Any, input: Any, output_split_sizes: Sequence[int] | None = None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None = None, group: Any = None,
                      async_op: bool = False, algorithm: str = "auto") -> Any:
    """Block j of ``input`` (along the first dimension) to rank j; block i of ``output``
    from rank i (even blocks, or the split sizes)."""
    g = _group(group)
    x, out = _view(input, "input"), _view(output, "output")
    p = g.comm.size
    if output_split_sizes is None and input_split_sizes is None:
        rows, copy_back = _shaped(output, "output", (p, out.size // max(p, 1)))
        result = g.comm.all_to_all(x.reshape(p, -1), out=rows, **_how(algorithm, async_op))
        return _then(result, copy_back, async_op)
    send = list(input_split_sizes) if input_split_sizes is not None else [x.shape[0] // p] * p

    def finish(result: Any) -> None:
        rows, _ = result
        out[...] = rows.reshape(out.shape)

    return _then(g.comm.all_to_all_v(x, send, **_how(algorithm, async_op)),
                 finish, async_op)


def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False, algorithm: str = "auto") -> Any:
    """``input_tensor_list[j]`` to rank j; ``output_tensor_list[i]`` from rank i."""
    g = _group(group)
    ins = [_view(t, f"input_tensor_list[{i}]").reshape(-1) for i, t in enumerate(input_tensor_list)]
    counts = [a.size for a in ins]
    flat = module_of(ins[0]).concatenate(ins)

    def finish(result: Any) -> None:
        rows, received = result
        start = 0
        for i, (t, n) in enumerate(zip(output_tensor_list, received, strict=True)):
            view = _view(t, f"output_tensor_list[{i}]")
            view[...] = rows[start:start + n].reshape(view.shape)
            start += n

    return _then(g.comm.all_to_all_v(flat, counts, **_how(algorithm, async_op)),
                 finish, async_op)


def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int = 0,
            group: Any = None, async_op: bool = False, algorithm: str = "auto") -> Any:
    """``scatter_list[j]`` of ``src`` into rank j's ``tensor``."""
    g = _group(group)
    root = g.local(src, "src")
    stacked, refusal = None, None
    if g.comm.rank == root:
        if scatter_list is None or len(scatter_list) != g.comm.size:
            refusal = InvalidArgumentError(
                f"scatter_list: the source gives {g.comm.size} tensors, got "
                f"{'None' if scatter_list is None else len(scatter_list)}")
        else:
            rows = [_view(t, f"scatter_list[{i}]") for i, t in enumerate(scatter_list)]
            stacked = module_of(rows[0]).stack(rows)
    try:  # a refused list travels in the root's header: every rank raises
        return _maybe(g.comm.scatter(stacked, root, out=tensor, **_how(algorithm, async_op)),
                      async_op)
    except InvalidArgumentError as exc:
        if refusal is not None:
            raise refusal from exc
        raise


def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int = 0, group: Any = None,
           async_op: bool = False, algorithm: str = "auto") -> Any:
    """Every rank's ``tensor`` into ``dst``'s ``gather_list``."""
    g = _group(group)
    root = g.local(dst, "dst")

    def finish(rows: Any) -> None:
        if g.comm.rank == root:
            if gather_list is None or len(gather_list) != g.comm.size:
                raise InvalidArgumentError(f"gather_list: the destination gives {g.comm.size} tensors")
            for i, t in enumerate(gather_list):
                _view(t, f"gather_list[{i}]")[...] = rows[i]

    return _then(g.comm.gather(tensor, root, **_how(algorithm, async_op)), finish,
                 async_op)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None,
            algorithm: str = "auto") -> Any:
    g = _group(group)
    return _maybe(g.comm.barrier(**_how(algorithm, async_op)), async_op)


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    _group(group).comm.monitored_barrier(seconds, wait_all_ranks)


# -- point-to-point ------------------------------------------------------------------------


def send(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> None:
    g = _group(group)
    g.comm.send(tensor, g.local(dst, "dst"), tag)


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> int:
    """Receive into ``tensor`` (from any rank when ``src`` is None); the sender's rank."""
    g = _group(group)
    got = g.comm.recv(tensor, ANY if src is None else g.local(src, "src"), tag)
    return g.ranks[got]


class _P2PWork:
    def __init__(self, request: Any, group: ProcessGroup) -> None:
        self._request, self._group = request, group

    def wait(self, timeout: Any = None) -> bool:
        self._request.wait()
        return True

    def is_completed(self) -> bool:
        return self._request.test()

    def source(self) -> int:
        return self._group.ranks[self._request.wait()]


def isend(tensor: Any, dst: int, group: Any = None, tag: int = 0) -> _P2PWork:
    g = _group(group)
    return _P2PWork(g.comm.isend(tensor, g.local(dst, "dst"), tag), g)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0) -> _P2PWork:
    g = _group(group)
    return _P2PWork(g.comm.irecv(tensor, ANY if src is None else g.local(src, "src"), tag), g)


class P2POp:
    """One message of ``batch_isend_irecv``: ``P2POp(dist.isend, tensor, peer)``."""

    def __init__(self, op: Any, tensor: Any, peer: int, group: Any = None, tag: int = 0) -> None:
        self.op, self.tensor, self.peer, self.group, self.tag = op, tensor, peer, group, tag


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[_P2PWork]:
    """Start every message of the list (one group, all on the same group)."""
    if not p2p_op_list:
        return []
    g = _group(p2p_op_list[0].group)
    ops = [_P2POp(getattr(p.op, "__name__", p.op), p.tensor, g.local(p.peer, "peer"), p.tag)
           for p in p2p_op_list]
    return [_P2PWork(r, g) for r in g.comm.batch_isend_irecv(ops)]
