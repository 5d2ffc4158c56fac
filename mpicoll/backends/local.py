"""The local backend: ranks as threads of one process (tests, teaching, dry runs); no
``native``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .base import PACKED_BYTES, Backend, _no_native


class LocalBackend(Backend):
    """The local backend of one rank: ``endpoint``, a LocalWorld's endpoint."""

    name = "local"
    device_only = False
    separate_control = False
    packed_bytes = PACKED_BYTES
    queues_on_stream = False
    auto_prefers_native = False
    has_native = False
    native_is_mpi = False
    traceable = True
    merges_traces = False
    ranks_are_threads = True

    def __init__(self, endpoint: Any) -> None:
        from ..transport.local import LocalPeers, LocalTransport

        if not isinstance(endpoint, LocalTransport):
            raise InvalidArgumentError("comm: backend 'local' takes a LocalWorld endpoint")
        super().__init__(endpoint, {}, _no_native)
        self.peers = LocalPeers(endpoint)
        self._splits = 0  # splits so far: the same on every rank, names each sub-world

    def duplicate(self) -> LocalBackend:
        return LocalBackend(self.transport.duplicate())

    def split(self, color: int | None, key: int, colors: np.ndarray,
              keys: np.ndarray) -> LocalBackend | None:
        """A sub-world of this rank's group, its members in (key, rank) order, as
        MPI_Comm_split orders them."""
        self._splits += 1
        if color is None:
            return None
        t = self.transport
        members = sorted((int(keys[r]), r) for r in range(t.size) if colors[r] == color)
        rank = [r for _, r in members].index(t.rank)
        world = t.world.subworld(self._splits, int(color), len(members))
        endpoint = world.endpoint(rank)
        endpoint.job_rank = t.job_rank  # its node is the job rank's
        return LocalBackend(endpoint)
