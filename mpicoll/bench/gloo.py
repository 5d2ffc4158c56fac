"""mpicoll against torch.distributed's gloo on the same torch CPU tensors (torch needed).

    mpiexec -n 2 python -m mpicoll.bench.gloo [-b 8] [-e 64M] [-f 8] [-n 20] [-w 3]

For a CPU user, gloo is what torch.distributed offers instead. Per size, in one run:
``dist.all_reduce(t)`` through torch.distributed's gloo backend, through
``mpicoll.dist`` (torch's API over mpicoll, the same tensor), and mpicoll's own call on
the NumPy view of it (``comm.all_reduce(a, out=a)``), all in place, sum of float32. Time:
per iteration the slowest rank's, then the median; a barrier before each iteration, the
three taking turns. gloo's rendezvous is a TCP store on rank 0 (its host's name, a free
port), told to the others over MPI: no torchrun needed.
"""

from __future__ import annotations

import argparse
import socket
import sys

import numpy as np

from mpicoll.bench import checked_sizes, time_interleaved
from mpicoll.bench.report import human


def _rendezvous(comm: object) -> str:
    """``tcp://host:port`` of a free port on rank 0's host, the same on every rank."""
    world = comm.control_comm
    address = None
    if world.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        hosts = {socket.gethostname()}
        address = f"tcp://{'127.0.0.1' if len(hosts) == 1 else socket.gethostname()}:{port}"
    hosts = set(world.allgather(socket.gethostname()))
    address = world.bcast(address, root=0)
    if len(hosts) > 1:  # several hosts: rank 0's name, not the loopback
        address = address.replace("127.0.0.1", world.bcast(socket.gethostname(), root=0))
    return address


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.bench.gloo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-b", default="8", help="smallest size (bytes; K, M, G)")
    parser.add_argument("-e", default="64M", help="largest size")
    parser.add_argument("-f", type=float, default=8.0, help="step factor (above 1)")
    parser.add_argument("-n", type=int, default=20, help="timed iterations")
    parser.add_argument("-w", type=int, default=3, help="warm-up iterations")
    args = parser.parse_args(argv)
    size_list = checked_sizes(parser, args.b, args.e, args.f)
    if args.n < 1 or args.w < 0:
        parser.error("-n: at least 1 timed iteration; -w: not negative")
    try:
        import torch
        import torch.distributed as torch_dist
    except ImportError:
        from mpi4py import MPI

        if MPI.COMM_WORLD.rank == 0:  # (once, not a line from every rank)
            print("python -m mpicoll.bench.gloo: needs torch (pip install torch)",
                  file=sys.stderr)
        return 2
    import mpicoll.dist as dist

    dist.init_process_group("mpi")
    comm = dist.GroupMember.WORLD.comm
    rank, size = comm.rank, comm.size
    torch_dist.init_process_group("gloo", init_method=_rendezvous(comm), rank=rank,
                                  world_size=size)
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"# all_reduce of float32 torch CPU tensors, sum, in place, {size} ranks; torch "
        f"{torch.__version__} gloo | mpicoll.dist | mpicoll on the NumPy view")
    say(f"# {'size':>10} {'gloo(us)':>10} {'dist(us)':>10} {'mpicoll(us)':>11} "
        f"{'gloo/dist':>9} {'gloo/mpicoll':>12}")
    for nbytes in size_list:
        tensor = torch.ones(max(nbytes // 4, 1))
        view = tensor.numpy()
        runs = {"gloo": lambda t=tensor: torch_dist.all_reduce(t),
                "dist": lambda t=tensor: dist.all_reduce(t),
                "mpicoll": lambda a=view: comm.all_reduce(a, out=a)}
        timed = time_interleaved(comm, runs, args.n, args.w,
                                 lambda: comm.barrier(algorithm="native"))
        us = {name: float(np.median(times)) * 1e6 for name, times in timed.items()}
        say(f"  {human(tensor.numel() * 4):>10} {us['gloo']:>10.1f} {us['dist']:>10.1f} "
            f"{us['mpicoll']:>11.1f} {us['gloo'] / us['dist']:>9.2f} "
            f"{us['gloo'] / us['mpicoll']:>12.2f}")
    torch_dist.destroy_process_group()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
