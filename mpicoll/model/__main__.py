"""``python -m mpicoll.model``: fit the cost model here, or print its predictions.

    mpiexec -n 4 python -m mpicoll.model fit [-o model.json] [-n 20]
    python -m mpicoll.model table [--params model.json] [-p 8]

``fit`` writes ``MPICOLL_MODEL`` or ``~/.config/mpicoll/model.json``, the file ``auto``
reads; ``table`` reads that same file unless ``--params`` names another.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    show.add_argument("-p", "--ranks", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "fit":
        if args.iters < 1:
            parser.error("-n: at least 1 iteration")
        from mpi4py import MPI

        from .fit import fit

        params = fit(iters=args.iters)
        if MPI.COMM_WORLD.Get_rank() == 0:
            path = save_params(params, args.output)
            print(f"# wrote {path}")
            if path.resolve() != default_path().resolve():
                print(f"# auto reads {default_path()}: set MPICOLL_MODEL={path} for it to "
                      "read this one")
            print(table(params, params.ranks))
        return 0
    if args.ranks < 1:
        parser.error("-p: at least 1 rank")
    path = Path(args.params) if args.params else default_path()
    params = load_params(path)
    if params is None:
        if args.params:
            parser.error(f"--params {path}: not a readable model file")
        print(f"# no fitted parameters at {path} (python -m mpicoll.model fit writes them): "
              "the defaults")
        params = Params()
    print(table(params, args.ranks))
    return 0


sys.exit(main())
