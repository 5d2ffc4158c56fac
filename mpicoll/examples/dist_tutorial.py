"""PyTorch's "Writing Distributed Applications" tutorial through mpicoll.dist, on NumPy
arrays: its calls as the tutorial makes them (``torch.zeros`` as ``np.zeros``; guards for
fewer ranks than it assumes; its SGD on a small linear model written out, not torch.nn).
The tutorial's own torch code runs unchanged but the import (torch tensors go through
DLPack); this file needs no torch.

    mpiexec -n 4 python -m mpicoll.examples.dist_tutorial

The tutorial's steps, each checked: blocking point-to-point (rank 0 sends, rank 1
receives), the same with isend/irecv, all_reduce in a group, its own ring all_reduce
written with isend/irecv (compared with dist.all_reduce), and distributed synchronous SGD:
each rank's gradients all_reduced and divided by the world size, so every rank keeps the
same weights, the weights single-process training on all the data would reach.
"""

from __future__ import annotations

import numpy as np

import mpicoll.dist as dist  # the tutorial: import torch.distributed as dist
from mpicoll.examples._launch import check, launch, parser_for


def run_blocking(rank: int, size: int) -> None:
    """Blocking point-to-point communication."""
    tensor = np.zeros(1)
    if size < 2:
        return
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)  # send the tensor to process 1
    elif rank == 1:
        dist.recv(tensor=tensor, src=0)  # receive the tensor from process 0
        check(tensor[0] == 1, f"rank 1 received {tensor[0]}, expected 1")


def run_nonblocking(rank: int, size: int) -> None:
    """Non-blocking point-to-point communication."""
    tensor = np.zeros(1)
    if size < 2:
        return
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
        req.wait()
    elif rank == 1:
        req = dist.irecv(tensor=tensor, src=0)
        req.wait()
        check(tensor[0] == 1, f"rank 1 received {tensor[0]}, expected 1")


def run_group_all_reduce(rank: int, size: int) -> None:
    """All-reduce example: the sum of the ones of the first two ranks (a group)."""
    members = [0, 1] if size > 1 else [0]
    group = dist.new_group(members)
    tensor = np.ones(1)
    if rank in members:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        check(tensor[0] == len(members), f"rank {rank}: the group's sum is {tensor[0]}")


def allreduce(send: np.ndarray, recv: np.ndarray) -> None:
    """The tutorial's own ring all_reduce (every rank adds what passes by)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    send_buff = send.copy()  # the tutorial: send.clone() (a torch tensor's copy)
    recv_buff = send.copy()
    accum = send.copy()
    left = ((rank - 1) + size) % size
    right = (rank + 1) % size
    for i in range(size - 1):
        if i % 2 == 0:  # send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:  # send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def run_ring(rank: int, size: int) -> None:
    send = np.arange(5.0) + rank
    recv = np.zeros(5)
    allreduce(send, recv)
    reference = send.copy()
    dist.all_reduce(reference)
    check(np.array_equal(recv, reference), f"rank {rank}: ring {recv} != all_reduce {reference}")


def run_sgd(rank: int, size: int, steps: int = 20) -> np.ndarray:
    """Distributed synchronous SGD on linear regression: each rank's shard, gradients
    averaged (the tutorial's average_gradients), the same weights everywhere."""
    rng = np.random.default_rng(0)
    features, truth = rng.normal(size=(64, 3)), np.array([1.0, -2.0, 0.5])
    targets = features @ truth
    shard = slice(rank * 64 // size, (rank + 1) * 64 // size)
    weights, whole = np.zeros(3), np.zeros(3)
    for _ in range(steps):
        x, y = features[shard], targets[shard]
        grad = 2 * x.T @ (x @ weights - y) * size / 64  # this shard's share of the mean
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)  # average_gradients: sum ...
        grad /= size  # ... then divide by the world size
        weights -= 0.1 * grad
        whole -= 0.1 * 2 * features.T @ (features @ whole - targets) / 64
    check(np.allclose(weights, whole), f"rank {rank}: weights {weights} != one process's {whole}")
    return weights


def main() -> None:
    parser_for(__doc__).parse_args()  # (no options: --help tells what it teaches)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    run_blocking(rank, size)
    run_nonblocking(rank, size)
    run_group_all_reduce(rank, size)
    run_ring(rank, size)
    weights = run_sgd(rank, size)
    dist.barrier()
    if rank == 0:
        print(f"the tutorial's steps ran on {size} rank(s) through mpicoll.dist: point-to-point, "
              f"a group's all_reduce, its ring all_reduce == dist.all_reduce, and SGD weights "
              f"{np.round(weights, 4)} equal single-process training")
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(main)
