"""The MPI transport: point-to-point messages of mpi4py on a private duplicate communicator.

Library messages travel on ``comm.Dup()``, so they never match the user's own messages,
and each collective call takes the next tag, so two calls never match each other. Data
goes as raw bytes (``MPI.BYTE``) through mpi4py's buffer interface: no pickle, and no
dtype needs an MPI datatype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from . import ScratchPool


class MPITransport(ScratchPool):
    """Point-to-point transport over a private duplicate of an mpi4py intracommunicator."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        super().__init__()
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        self._tag_limit = min(int(tag_ub) if tag_ub else 32767, 1 << 30)
        self.tag = 0

    def begin(self) -> None:
        self.tag = (self.tag + 1) % self._tag_limit

    def send(self, buf: np.ndarray, dest: int) -> None:
        self.comm.Send([buf, MPI.BYTE], dest, self.tag)

    def recv(self, buf: np.ndarray, source: int) -> None:
        self.comm.Recv([buf, MPI.BYTE], source, self.tag)

    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None:
        self.comm.Sendrecv([sendbuf, MPI.BYTE], dest, self.tag,
                           [recvbuf, MPI.BYTE], source, self.tag)

    def isend(self, buf: np.ndarray, dest: int) -> MPI.Request:
        return self.comm.Isend([buf, MPI.BYTE], dest, self.tag)

    def irecv(self, buf: np.ndarray, source: int) -> MPI.Request:
        return self.comm.Irecv([buf, MPI.BYTE], source, self.tag)

    def waitall(self, requests: Sequence[MPI.Request]) -> None:
        MPI.Request.Waitall(list(requests))

    def free(self) -> None:
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()
