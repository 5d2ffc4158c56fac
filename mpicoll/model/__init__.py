"""The alpha-beta-gamma cost model: a predicted time for every algorithm, and a fit of the
machine's alpha, beta and gamma.

    T = steps * alpha + bytes moved * beta + bytes reduced * gamma

The formulas are the ``Cost:`` lines of the algorithms' docstrings (Thakur, Rabenseifner
and Gropp 2005, "Optimization of Collective Communication Operations in MPICH", where
they exist), which the registry keeps as one table: ``REGISTRY[collective][name].cost``.
This module only evaluates them. Their notation: n bytes, p ranks, p2 the largest power
of two <= p, ``lg`` the base-2 logarithm, ``log_k`` base k, ``[cond]`` 1 when cond holds,
k a tree's radix and S a pipeline's number of segments (both from the algorithm's
options or their defaults). ``native`` is predicted with the formula of the algorithm
MPICH's default selection (``coll_selection.json``) runs for that call.

    python -m mpicoll.model fit [-o model.json]     # under mpiexec: measure, save, print
    python -m mpicoll.model table [--params model.json] [-p 8]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from .algorithms import COLLECTIVES, REGISTRY
from .config import config_file


@dataclass(frozen=True)
class Params:
    """Seconds per message (alpha), per byte moved (beta), per byte reduced (gamma)."""

    alpha: float = 5e-6
    beta: float = 1 / 4e9
    gamma: float = 1 / 4e9
    ranks: int = 0  # the number of ranks the fit ran at (0: not measured)
    source: str = "default"


def default_path() -> Path:
    """Where ``fit`` writes and ``auto`` reads the fitted parameters: ``MPICOLL_MODEL``,
    else ``$XDG_CONFIG_HOME/mpicoll/model.json`` (``~/.config/mpicoll/model.json``)."""
    return config_file("MPICOLL_MODEL", "model.json")


def load_params(path: str | Path | None = None) -> Params | None:
    """Fitted parameters from ``path`` (default: ``default_path()``), or None."""
    path = Path(path) if path else default_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    fields = {k: data[k] for k in ("alpha", "beta", "gamma", "ranks") if k in data}
    return Params(**fields, source=str(path))


def save_params(params: Params, path: str | Path | None = None) -> Path:
    path = Path(path) if path else default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(params), indent=2) + "\n")
    return path


# -- formulas --------------------------------------------------------------------------


def _ceil_log(x: float, base: int) -> int:
    """ceil(log_base x) for x >= 1, exactly (no floating-point rounding at powers)."""
    steps, reach = 0, 1
    while reach < x:
        reach *= base
        steps += 1
    return steps


def _lg(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


def python_expression(cost: str) -> str:
    """A docstring cost line rewritten as a Python expression."""
    expr = cost.replace("ceil(lg p)", "_ceil_log(p, 2)").replace("ceil(log_k p)", "_ceil_log(p, k)")
    expr = re.sub(r"\blg (\w+)", r"_lg(\1)", expr)
    expr = re.sub(r"\[([^\]]+)\]", r"(\1)", expr)
    return expr


@cache
def _compiled(collective: str, algorithm: str):
    return compile(python_expression(REGISTRY[collective][algorithm].cost),
                   f"<cost of {collective}/{algorithm}>", "eval")


def formula(collective: str, algorithm: str) -> str:
    """The cost line of a registered algorithm (``native``: the one MPICH would run)."""
    if algorithm == "native":
        return "native: " + ", ".join(sorted({native_stand_in(collective, n, p)
                                              for n in (8, 1 << 20) for p in (2, 8)}))
    return REGISTRY[collective][algorithm].cost


def option_defaults(collective: str, algorithm: str) -> dict[str, int]:
    fn = REGISTRY[collective][algorithm].fn
    return {name: param.default for name, param in inspect.signature(fn).parameters.items()
            if param.kind is inspect.Parameter.KEYWORD_ONLY}


def native_stand_in(collective: str, nbytes: int, p: int) -> str:
    """The algorithm MPICH's default selection runs (src/mpi/coll/coll_selection.json)."""
    pow2 = p & (p - 1) == 0
    if collective == "broadcast":
        if p < 8 or nbytes <= 12288:
            return "binomial"
        return "scatter_allgather"
    if collective == "all_reduce":
        return "recursive_doubling" if nbytes <= 8 else "rabenseifner"
    if collective == "all_gather":
        if pow2:
            return "recursive_doubling" if nbytes < 524288 else "ring"
        return "bruck" if nbytes < 81920 else "ring"
    if collective == "reduce":
        return "binomial" if nbytes <= 2048 else "rabenseifner"
    if collective == "reduce_scatter":
        return "recursive_halving" if nbytes < 524288 else "pairwise"
    if collective == "all_to_all":
        block = nbytes // max(p, 1)
        if p >= 8 and block <= 256:
            return "bruck"
        return "linear" if block <= 32768 else "pairwise"
    if collective == "barrier":
        return "dissemination"
    return "binomial"  # gather, scatter


def predict(collective: str, algorithm: str, nbytes: int, p: int,
            params: Params | None = None, **options: int) -> float:
    """The model's time in seconds for ``algorithm`` on ``nbytes`` (the benchmark's size:
    nccl-tests' meaning) at ``p`` ranks."""
    params = params or Params()
    if algorithm == "native":
        algorithm = native_stand_in(collective, nbytes, p)
    values = {**option_defaults(collective, algorithm), **options}
    k = values.get("radix", 2)
    segments = max(1, math.ceil(nbytes / values["segment_bytes"])) if "segment_bytes" in values else 1
    p2 = 1 << (max(p, 1).bit_length() - 1)
    scope = {"p": p, "p2": p2, "n": float(nbytes), "k": k, "S": segments,
             "alpha": params.alpha, "beta": params.beta, "gamma": params.gamma,
             "_lg": _lg, "_ceil_log": _ceil_log, "ceil": math.ceil}
    if p == 1:
        return 0.0
    return float(eval(_compiled(collective, algorithm), {"__builtins__": {}}, scope))


def best(collective: str, nbytes: int, p: int, params: Params, candidates: list[str]) -> str:
    """The candidate with the smallest predicted time."""
    return min(candidates, key=lambda name: predict(collective, name, nbytes, p, params))


# -- fitting ---------------------------------------------------------------------------


def _alpha_beta(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """alpha: the time of the smallest messages; beta: the median time per byte beyond
    alpha of the large ones (a straight least-squares line lets the large sizes swamp
    the intercept)."""
    small = [t for s, t in zip(sizes, times, strict=True) if s <= 256] or [min(times)]
    alpha = sorted(small)[len(small) // 2]
    large = sorted((t - alpha) / s for s, t in zip(sizes, times, strict=True) if s >= 1 << 16)
    beta = large[len(large) // 2] if large else 0.0
    return alpha, beta


def fit(comm=None, sizes: tuple[int, ...] = tuple(1 << s for s in range(0, 25, 2)),
        iters: int = 20) -> Params:
    """Measure alpha and beta with a ring exchange of every size over mpicoll's transport
    (all ranks at once, as the algorithms move data), and gamma with NumPy additions.

    Every rank returns the same numbers (the slowest rank's times are used).
    """
    import numpy as np
    from mpi4py import MPI

    from .communicator import Communicator

    comm = comm or Communicator()
    t = comm.transport
    p, rank = t.size, t.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    big = max(sizes)
    send, recv = np.ones(big, np.uint8), np.empty(big, np.uint8)
    per_message = []
    for size in sizes:
        for _ in range(3):
            t.begin()
            t.sendrecv(send[:size], right, recv[:size], left)
        t.comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            t.begin()
            t.sendrecv(send[:size], right, recv[:size], left)
        per_message.append(t.comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))
    alpha, beta = _alpha_beta(list(sizes), per_message)
    # gamma: per byte reduced, float32 sums on arrays as large as the transfers
    x = np.ones(big // 4, np.float32)
    y = np.ones_like(x)
    reduce_sizes = [s // 4 for s in sizes if s >= 4096]
    reduce_times = []
    for count in reduce_sizes:
        np.add(x[:count], y[:count], out=y[:count])
        start = time.perf_counter()
        for _ in range(iters):
            np.add(x[:count], y[:count], out=y[:count])
        reduce_times.append(t.comm.allreduce((time.perf_counter() - start) / iters, op=MPI.MAX))
    per_byte = sorted(t / (4.0 * c) for c, t in zip(reduce_sizes, reduce_times, strict=True))
    gamma = per_byte[len(per_byte) // 2]
    return Params(alpha=max(alpha, 1e-8), beta=max(beta, 1e-13), gamma=max(gamma, 1e-13),
                  ranks=p, source="fit")


def table(params: Params, p: int, sizes: tuple[int, ...] = (8, 1 << 12, 1 << 16, 1 << 20, 1 << 24),
          collectives: tuple[str, ...] = COLLECTIVES) -> str:
    """Predicted microseconds of every algorithm at a few sizes, as text."""
    lines = [f"# predicted time (us) at {p} ranks: alpha {params.alpha * 1e6:.2f} us, "
             f"beta {1 / params.beta / 1e9:.2f} GB/s, gamma {1 / params.gamma / 1e9:.2f} GB/s "
             f"({params.source})",
             f"# {'collective':<15} {'algorithm':<20}" + "".join(f"{_size(s):>11}" for s in sizes)]
    for collective in collectives:
        for name in [*REGISTRY[collective], "native"]:
            row = "".join(f"{predict(collective, name, s, p, params) * 1e6:>11.1f}" for s in sizes)
            lines.append(f"  {collective:<15} {name:<20}{row}")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.model",
                                     description="Fit and print mpicoll's cost model.")
    sub = parser.add_subparsers(dest="command", required=True)
    fit_cmd = sub.add_parser("fit", help="measure alpha, beta, gamma here (run under mpiexec)")
    fit_cmd.add_argument("-o", "--output", default=None, help=f"JSON file (default {default_path()})")
    fit_cmd.add_argument("-n", "--iters", type=int, default=20)
    show = sub.add_parser("table", help="print predicted times")
    show.add_argument("--params", default=None, help="a fitted JSON file (default: the default path)")
    show.add_argument("-p", "--ranks", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "fit":
        from mpi4py import MPI

        params = fit(iters=args.iters)
        if MPI.COMM_WORLD.Get_rank() == 0:
            path = save_params(params, args.output)
            print(f"# wrote {path}")
            print(table(params, params.ranks))
        return 0
    params = load_params(args.params) or Params()
    print(table(params, args.ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
