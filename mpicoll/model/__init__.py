"""The alpha-beta-gamma cost model: a predicted time for every algorithm, and a fit of the
machine's alpha, beta and gamma.

    T = steps * alpha + bytes moved * beta + bytes reduced * gamma

The formulas are the ``Cost:`` lines of the algorithms' docstrings (Thakur, Rabenseifner
and Gropp 2005, "Optimization of Collective Communication Operations in MPICH", where
they exist), which the registry keeps as one table: ``REGISTRY[collective][name].cost``.
This module evaluates them, and sums those of an algorithm made of phases (hierarchical's:
its phases' algorithms' lines). Their notation: n bytes, p ranks, p2 the largest power
of two <= p, ``lg`` the base-2 logarithm, ``log_k`` base k, ``[cond]`` 1 when cond holds,
k a tree's radix and S a pipeline's number of segments (both from the algorithm's
options or their defaults). ``native`` is predicted with the formula of the algorithm
MPICH's default selection runs for that call (``mpich_rules.mpich_native``).

This package is the runtime part (``auto`` reads it); the fit and the command line are
tools beside it (``mpicoll.model.fit``, ``python -m mpicoll.model``):

    mpiexec -n 4 python -m mpicoll.model fit [-o model.json]   # measure, save, print
    python -m mpicoll.model table [--params model.json] [-p 8]
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms import COLLECTIVES, REGISTRY
from ..config import config_file, read_config
from ..errors import ConfigError
from ..selection.mpich_rules import RULED, mpich_native


@dataclass(frozen=True)
class Params:
    """Seconds per message (alpha), per byte moved (beta), per byte reduced (gamma)."""

    alpha: float = 5e-6
    beta: float = 1 / 4e9
    gamma: float = 1 / 4e9
    ranks: int = 0  # the number of ranks the fit ran at (0: not measured)
    source: str = "default"
    # inside a node (hierarchical algorithms' intra-node phases): alpha and beta when None
    alpha_intra: float | None = None
    beta_intra: float | None = None


def default_path() -> Path:
    """Where ``fit`` writes and ``auto`` reads the fitted parameters: ``MPICOLL_MODEL``,
    else ``$XDG_CONFIG_HOME/mpicoll/model.json`` (``~/.config/mpicoll/model.json``)."""
    return config_file("MPICOLL_MODEL", "model.json")


def parse_params(text: str, path: str) -> Params:
    """Model parameters from a file's text, or a ConfigError naming the file and the fault."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        fields = {}
        for key in ("alpha", "beta", "gamma"):
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{key!r} must be a non-negative number, got {value!r}")
            fields[key] = float(value)
        for key in ("alpha_intra", "beta_intra"):  # inside a node: optional (fit measures
            value = data.get(key)                   # them where there are several nodes)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ValueError(f"{key!r} must be a non-negative number or null, got {value!r}")
            fields[key] = float(value)
        if "ranks" in data:
            ranks = data["ranks"]
            if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 0:
                raise ValueError(f"'ranks' must be a number of ranks >= 0, got {ranks!r}")
            fields["ranks"] = ranks
        return Params(**fields, source=str(path))
    except (ValueError, TypeError, RecursionError) as exc:  # (nested too deep for json)
        raise ConfigError(f"model file {path}: {exc}") from None


def load_params(path: str | Path | None = None) -> Params | None:
    """Fitted parameters from ``path`` (default: ``default_path()``), read as ``auto``
    reads them (``parse_params``); None where there is no such file, a ConfigError
    where it cannot be read or holds no parameters."""
    path = Path(path) if path else default_path()
    text = read_config(path)
    return None if text is None else parse_params(text, str(path))


def rate(seconds_per_byte: float) -> str:
    """A beta or gamma as GB/s (0 s/B: no limit)."""
    return "unlimited" if not seconds_per_byte else f"{1 / seconds_per_byte / 1e9:.2f} GB/s"


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
    expr = re.sub(r"ceil\(lg (\w+)\)", r"_ceil_log(\1, 2)", cost).replace(
        "ceil(log_k p)", "_ceil_log(p, k)")
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
    """The algorithm MPICH's default selection runs for this call
    (``mpich_rules.mpich_native``); for a collective those rules lack, its first
    registered algorithm."""
    if collective not in RULED:
        return next(iter(REGISTRY[collective]))
    return mpich_native(collective, nbytes, p, None)


def predict(collective: str, algorithm: str, nbytes: int, p: int,
            params: Params | None = None, nodes: int | Sequence[int] = 1,
            **options: Any) -> float:
    """The model's time in seconds for ``algorithm`` on ``nbytes`` (the benchmark's size:
    nccl-tests' meaning) at ``p`` ranks on ``nodes`` nodes: their number, the ranks
    spread evenly, or each node's number of ranks (``comm.nodes``' sizes). In the cost
    lines N is the number of nodes, q the ranks of the largest, s of the smallest, and
    alpha_intra, beta_intra a node's link. An algorithm made of phases (hierarchical's) is
    the sum of its phases' algorithms (``intra=``, ``inter=``, else its defaults), each at
    its ranks on its link; its cost line is that sum for the defaults. An unknown
    algorithm or option raises ValueError."""
    params = params or Params()
    if algorithm == "native":
        algorithm = native_stand_in(collective, nbytes, p)
    registered = REGISTRY.get(collective, {}).get(algorithm)
    if registered is None:
        raise ValueError(f"model: no {collective} algorithm {algorithm!r}")
    unknown = set(options) - set(registered.options)
    if unknown:
        raise ValueError(f"model: {collective} {algorithm!r} takes no option "
                         f"{', '.join(sorted(unknown))}")
    values = {**option_defaults(collective, algorithm), **options}
    if p == 1:
        return 0.0
    layout = _layout(p, nodes)
    if registered.steps:
        return _phased(registered.steps, values, nbytes, p, params, layout)
    return _cost_line(collective, algorithm, nbytes, p, params, layout, values)


def _layout(p: int, nodes: int | Sequence[int]) -> tuple[int, int, int]:
    """(N, q, s): the number of nodes and the ranks of the largest and the smallest, of
    ``nodes`` (a number: p ranks spread evenly over that many; or each node's ranks)."""
    if isinstance(nodes, (int, np.integer)) and not isinstance(nodes, (bool, np.bool_)):
        count = min(max(int(nodes), 1), max(p, 1))
        return count, math.ceil(p / count), p // count
    try:
        sizes = [int(k) for k in nodes if k != 0]
        whole = all(isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_))
                    for k in nodes)
    except (TypeError, ValueError):
        sizes, whole = [], False
    if not whole or any(k < 0 for k in sizes) or sum(sizes) != p:
        raise ValueError(f"model: nodes: expected a number of nodes or each node's number of "
                         f"ranks (ints >= 0 that add up to the {p} ranks), got {nodes!r}")
    return len(sizes), max(sizes), min(sizes)


def _phased(steps: tuple[tuple[str, str, str], ...], values: dict[str, Any], nbytes: float,
            p: int, params: Params, layout: tuple[int, int, int]) -> float:
    """The sum of the phases' times: an intra phase among the q ranks of the largest node
    on the node's link, an inter phase among N ranks (one per node) on the link between
    nodes; a phase's size in bytes is its expression of n, p, q, s and N."""
    nodes, q, smallest = layout
    inside = Params(params.alpha if params.alpha_intra is None else params.alpha_intra,
                    params.beta if params.beta_intra is None else params.beta_intra,
                    params.gamma)
    between = Params(params.alpha, params.beta, params.gamma)
    total = 0.0
    for option, phase, size in steps:
        ranks, link = (q, inside) if option == "intra" else (nodes, between)
        phase_bytes = eval(size, {"__builtins__": {}}, {"n": float(nbytes), "p": p, "q": q,
                                                        "s": smallest, "N": nodes})
        total += predict(phase, values[option], phase_bytes, ranks, link)
    return total


def _cost_line(collective: str, algorithm: str, nbytes: float, p: int, params: Params,
               layout: tuple[int, int, int], values: dict[str, Any]) -> float:
    """The algorithm's ``Cost:`` line evaluated (``values``: its options; ``layout``:
    ``_layout``'s)."""
    nodes, q, smallest = layout
    k = values.get("radix", 2)
    segments = max(1, math.ceil(nbytes / values["segment_bytes"])) if "segment_bytes" in values else 1
    p2 = 1 << (max(p, 1).bit_length() - 1)
    alpha_intra = params.alpha if params.alpha_intra is None else params.alpha_intra
    beta_intra = params.beta if params.beta_intra is None else params.beta_intra
    # on one node every message stays inside it: the node's own link for every algorithm
    alpha, beta = (alpha_intra, beta_intra) if nodes == 1 else (params.alpha, params.beta)
    scope = {"p": p, "p2": p2, "n": float(nbytes), "k": k, "S": segments,
             "alpha": alpha, "beta": beta, "gamma": params.gamma,
             "N": nodes, "q": q, "s": smallest,
             "alpha_intra": alpha_intra, "beta_intra": beta_intra,
             "_lg": _lg, "_ceil_log": _ceil_log, "ceil": math.ceil, "min": min}
    return float(eval(_compiled(collective, algorithm), {"__builtins__": {}}, scope))


def best(collective: str, nbytes: int, p: int, params: Params, candidates: list[str],
         nodes: int | Sequence[int] = 1) -> str:
    """The candidate with the smallest predicted time (on ``nodes`` nodes); of times
    equal but for rounding (a phased algorithm's sum on one node is its flat twin's
    line, added up in another order), the earlier candidate."""
    chosen, fastest = candidates[0], math.inf
    for name in candidates:
        time = predict(collective, name, nbytes, p, params, nodes=nodes)
        if time < fastest * (1 - 1e-9):
            chosen, fastest = name, time
    return chosen


def table(params: Params, p: int, sizes: tuple[int, ...] = (8, 1 << 12, 1 << 16, 1 << 20, 1 << 24),
          collectives: tuple[str, ...] = COLLECTIVES, nodes: int | Sequence[int] = 1) -> str:
    """Predicted microseconds of every algorithm at a few sizes, at ``p`` ranks on
    ``nodes`` nodes (a number: p ranks spread evenly; or each node's ranks), as text; its
    header names the link parameters the rows use."""
    alpha_in = params.alpha if params.alpha_intra is None else params.alpha_intra
    beta_in = params.beta if params.beta_intra is None else params.beta_intra
    inside = f"alpha {alpha_in * 1e6:.2f} us, beta {rate(beta_in)}"
    count = _layout(p, nodes)[0]
    links = f"inside a node {inside}" if count == 1 else (
        f"between nodes alpha {params.alpha * 1e6:.2f} us, beta "
        f"{rate(params.beta)}; inside a node {inside}")
    spread = "" if isinstance(nodes, (int, np.integer)) or len(set(nodes)) == 1 else \
        f" of {'+'.join(str(int(k)) for k in nodes)} ranks"
    lines = [f"# predicted time (us) at {p} ranks on {count} node(s){spread}: {links}; gamma "
             f"{rate(params.gamma)} ({params.source})",
             f"# {'collective':<15} {'algorithm':<20}" + "".join(f"{_size(s):>11}" for s in sizes)]
    for collective in collectives:
        for name in [*REGISTRY[collective], "native"]:
            row = "".join(f"{predict(collective, name, s, p, params, nodes) * 1e6:>11.1f}"
                          for s in sizes)
            lines.append(f"  {collective:<15} {name:<20}{row}")
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"
