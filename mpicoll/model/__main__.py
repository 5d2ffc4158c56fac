"""``python -m mpicoll.model``: fit the cost model here, or print its predictions.

    mpiexec -n 4 python -m mpicoll.model fit [-o model.json] [-n 20]
    python -m mpicoll.model table [--params model.json] [-p 8]
    python -m mpicoll.model table --topology torus:8x8 [-p 64] [--link-bandwidth GBPS]
        [--hop-latency US] [--alpha US] [--reduce-bandwidth GBPS] [--collective all_reduce]

``fit`` writes ``MPICOLL_MODEL`` or ``~/.config/mpicoll/model.json``, the file ``auto``
reads; ``table`` reads that same file unless ``--params`` names another. With
``--topology`` (``torus:AxB[xC...]``, ``fattree:k[,ratio]``, ``dragonfly:g,a,t``) it prints
the topology model's times instead (``mpicoll.model.topology``: every message of each
algorithm's real schedule routed over the topology, with link contention), for 64..1024
ranks that fit (or ``-p``), 32 B .. 128 MiB.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..errors import ConfigError
from . import Params, default_path, load_params, save_params, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.model",
                                     description="Fit and print mpicoll's cost model.")
    sub = parser.add_subparsers(dest="command", required=True)
    fit_cmd = sub.add_parser("fit", help="measure alpha, beta, gamma here (run under mpiexec)")
    fit_cmd.add_argument("-o", "--output", default=None,
                         help=f"JSON file (default {default_path()}, which auto reads)")
    fit_cmd.add_argument("-n", "--iters", type=int, default=20)
    show = sub.add_parser("table", help="print predicted times")
    show.add_argument("--params", default=None,
                      help=f"a fitted JSON file (default {default_path()}, as auto reads)")
    show.add_argument("--nodes", type=int, default=1,
                      help="nodes the ranks are spread over, evenly (without --topology)")
    show.add_argument("-p", "--ranks", type=int, default=None,
                      help="ranks (default 8; with --topology: 64..1024 that fit)")
    show.add_argument("--topology", default=None,
                      help="torus:8x8, torus:4x4x4, fattree:16[,2], dragonfly:9,4,4 (groups, "
                           "routers, nodes a router)")
    show.add_argument("--collective", default=None, help="with --topology (default all_reduce)")
    show.add_argument("--link-bandwidth", type=float, default=None, metavar="GBPS",
                      help="GB/s a link (default: the model's 1/beta)")
    show.add_argument("--hop-latency", type=float, default=None, metavar="US",
                      help="microseconds a hop (default 0.1)")
    show.add_argument("--alpha", type=float, default=None, metavar="US",
                      help="microseconds a message (default: the model's)")
    show.add_argument("--reduce-bandwidth", type=float, default=None, metavar="GBPS",
                      help="GB/s reduced (default: the model's 1/gamma; 0: free)")
    args = parser.parse_args(argv)
    if args.command == "fit":
        if args.iters < 1:
            parser.error("-n: at least 1 iteration")
        from mpi4py import MPI

        from ..bench.report import unwritable
        from .fit import fit

        if MPI.COMM_WORLD.Get_size() < 2:  # (every rank sees the same size)
            parser.error("fit: at one rank a message goes to itself, so alpha and beta "
                         "would be a memory copy's, not the network's, and auto would read "
                         "them; fit under mpiexec -n 2 or more")
        # rank 0 writes the file: whether it can, asked before measuring, on every rank
        path = str(args.output or default_path())
        problem = unwritable(path) if MPI.COMM_WORLD.Get_rank() == 0 else None
        problem = MPI.COMM_WORLD.bcast(problem, root=0)
        if problem:
            parser.error(f"-o: {problem}")
        from ..communicator import Communicator
        from ..selection import Tables

        # (no tuning or model file read: the fit times named algorithms, never auto, and
        # a bad model file is what it replaces; it refused to run past one)
        comm = Communicator(_tables=Tables())
        params = fit(comm, iters=args.iters)
        nodes = [len(ranks) for ranks in comm.nodes]  # (the table's layout: the fit's)
        comm.free()
        if MPI.COMM_WORLD.Get_rank() == 0:
            path = save_params(params, args.output)
            print(f"# wrote {path}")
            if path.resolve() != default_path().resolve():
                print(f"# auto reads {default_path()}: set MPICOLL_MODEL={path} for it to "
                      "read this one")
            print(table(params, params.ranks, nodes=nodes))
        return 0
    if args.ranks is not None and args.ranks < 1:
        parser.error("-p: at least 1 rank")
    path = Path(args.params) if args.params else default_path()
    try:
        params = load_params(path)
    except ConfigError as exc:
        parser.error(f"--params: {exc}" if args.params else str(exc))
    if params is None:
        if args.params:
            parser.error(f"--params {path}: not a readable model file")
        print(f"# no fitted parameters at {path} (python -m mpicoll.model fit writes them): "
              "the defaults")
        params = Params()
    for name in ("link_bandwidth", "hop_latency", "alpha", "reduce_bandwidth"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < math.inf:  # (nan fails it too)
            parser.error(f"--{name.replace('_', '-')}: must be a number >= 0, got {value:g}")
    # --alpha and --reduce-bandwidth change the parameters of either table
    from dataclasses import replace

    if args.alpha is not None:
        params = replace(params, alpha=args.alpha * 1e-6, source=f"{params.source}, --alpha")
    if args.reduce_bandwidth is not None:
        params = replace(params, gamma=1 / (args.reduce_bandwidth * 1e9) if args.reduce_bandwidth
                         else 0.0, source=f"{params.source}, --reduce-bandwidth")
    if args.topology is None:
        alone = [flag for flag, value in (("--collective", args.collective),
                                          ("--link-bandwidth", args.link_bandwidth),
                                          ("--hop-latency", args.hop_latency))
                 if value is not None]
        if alone:
            parser.error(f"{', '.join(alone)}: only with --topology")
        ranks = args.ranks or 8
        if not 1 <= args.nodes <= ranks:
            parser.error(f"--nodes {args.nodes}: 1 to the {ranks} ranks")
        print(table(params, ranks, nodes=args.nodes))
        return 0
    if args.nodes != 1:
        parser.error("--nodes: without --topology (a topology places the ranks itself)")
    args.collective = args.collective or "all_reduce"
    return _topology_table(parser, args, params)


def _topology_table(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    params: Params) -> int:
    """``table --topology``: the topology model's table (``params`` with --alpha and
    --reduce-bandwidth applied)."""
    from ..algorithms import REGISTRY
    from . import topology

    try:
        network = topology.parse(args.topology)
    except ValueError as exc:
        parser.error(f"--topology: {exc}")
    if args.collective not in REGISTRY:
        parser.error(f"--collective: unknown collective {args.collective!r}")
    if args.ranks is not None and args.ranks > network.nodes:
        parser.error(f"-p: {args.ranks} ranks do not fit {network.spec} ({network.nodes} nodes)")
    if args.link_bandwidth == 0:
        parser.error("--link-bandwidth: must be > 0")
    print(topology.table(network, params, [args.ranks] if args.ranks else None,
                         collective=args.collective,
                         link_bandwidth=args.link_bandwidth * 1e9 if args.link_bandwidth else None,
                         hop_latency=topology.HOP_LATENCY if args.hop_latency is None
                         else args.hop_latency * 1e-6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
