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

Its parts: ``groups`` (the default group, new groups and subgroups, device meshes, the
backends' and debug levels' names), ``collectives`` (torch's collectives over mpicoll's,
with torch's checks of lists and sizes), ``work`` (the Work and Future that
``async_op=True`` gives), ``objects`` (the ``*_object`` collectives), ``p2p`` (send, recv
and their batches).
"""

from __future__ import annotations

from .collectives import (
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    monitored_barrier,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
)
from .groups import (
    Backend,
    DebugLevel,
    DeviceMesh,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    GroupMember,
    ProcessGroup,
    ReduceOp,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_debug_level,
    get_default_backend_for_device,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_device_mesh,
    init_process_group,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    reduce_op,
    set_debug_level,
    set_debug_level_from_env,
    split_group,
    supports_complex,
)
from .objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .p2p import (
    P2POp,
    batch_isend_irecv,
    irecv,
    isend,
    recv,
    send,
)
from .work import (
    Future,
    Work,
    _Finished,  # noqa: F401 - (tests: isinstance)
)

from . import device_mesh  # noqa: E402 - (dist.device_mesh, as torch.distributed's; it
# imports this package's names)

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
