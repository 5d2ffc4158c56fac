"""The algorithm registry: every collective's named algorithms, side by side.

Each collective has one module here holding all its algorithms as plain functions over
a Transport and flat 1-D arrays; ``@register`` files them under a name, so that
``Communicator.<collective>(..., algorithm=name)``, ``mpicoll.algorithms()``, the
benchmark and the tests all find them. The signature is the same for every algorithm
of a collective:

    broadcast(t, buf, root)                       in place; root's buf holds the data
    scatter(t, src | None, dst, bounds, root)     src: p blocks (root only); dst: block [rank]
    gather(t, src, dst | None, bounds, root)      src: block [rank]; dst: p blocks (root only)
    all_gather(t, buf, bounds)                    in place; rank r's block already in buf
    reduce(t, src, dst | None, op, root)          dst given at root; elsewhere workspace
    all_reduce(t, src, dst, op)                   dst may be src (in place)
    reduce_scatter(t, src, bounds, op, dst)       dst receives the reduced block [rank]
    all_to_all(t, src, send_bounds, dst, recv_bounds)   block j of src goes to rank j
    barrier(t)
    scan(t, src, dst, op)                         dst may be src (in place)
    exscan(t, src, dst, op)                       dst may be src; rank 0's is left as it was

``bounds`` are block offsets in elements (see ``mpicoll.buffers.chunk_bounds``), so the
same code serves even blocks and the v-variants' uneven ones; an algorithm that needs
equal blocks is registered ``even_only``. Tuning knobs (``radix``, ``segment_bytes``)
are keyword-only parameters with defaults, which callers pass by name
(``comm.broadcast(x, algorithm="knomial", radix=8)``).

Costs use the alpha-beta-gamma model: alpha per message, beta per byte, gamma per byte
reduced; n is the message size in bytes, p the number of ranks, p2 the largest power of
two <= p, k a tree's radix and S the number of segments of a pipelined algorithm. An
algorithm made of other collectives' algorithms on subsets of the ranks (hierarchical's
phases: q ranks inside a node, N nodes) lists them as ``phases``, and the model sums
theirs, with the algorithms a call names for them (``intra=``, ``inter=``).

Workspace: an algorithm that needs memory opens a scope, ``with t.workspace() as ws:``,
and takes from it (``ws.take(count, dtype)``): memory kept between calls, given back when
the scope ends, never shared with an algorithm it calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..spec import COLLECTIVES, SPECS


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: the function, and what the cost model and checks need."""

    collective: str
    name: str
    fn: Callable[..., None]
    cost: str
    commutative_only: bool = False
    even_only: bool = False
    options: tuple[str, ...] = ()  # keyword-only tuning parameters, e.g. ("radix",)
    # its phases in order (hierarchical's): (the option naming the phase's algorithm,
    # the collective it runs, its size in bytes as a cost expression)
    steps: tuple[tuple[str, str, str], ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()  # each option's default, as the function's

    @property
    def option_defaults(self) -> dict[str, Any]:
        """What each tuning option is where the call does not give it."""
        return dict(self.defaults)

    @property
    def phases(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """Each option naming a phase's algorithm (``intra``, ``inter``) with the
        collectives that phase runs (the name must be registered for each)."""
        named: dict[str, tuple[str, ...]] = {}
        for option, collective, _ in self.steps:
            if collective not in named.get(option, ()):
                named[option] = (*named.get(option, ()), collective)
        return tuple(named.items())


REGISTRY: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}

# the smallest value each tuning option takes
OPTION_MINIMUM = {"radix": 2, "segment_bytes": 1}


def register(collective: str, name: str, *, commutative_only: bool = False,
             even_only: bool = False, phases: tuple[tuple[str, str, str], ...] = ()):
    """File the decorated function as ``algorithm=name`` of ``collective``.

    The cost is the docstring line that starts with ``Cost:``; every algorithm has one.
    ``commutative_only``: it reorders operands, so a non-commutative op is refused.
    ``even_only``: it needs equal blocks, so the v-variants refuse it.
    ``phases``: the algorithms it runs on subsets of the ranks, in order, each as
    (the option naming its algorithm, its collective, its size in bytes): ``"intra"``
    phases run among the q ranks of a node, ``"inter"`` ones among N ranks, one per node.
    """
    named = {option for option, _, _ in phases}

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        doc = fn.__doc__ or ""
        cost = next((line.strip()[5:].strip() for line in doc.splitlines()
                     if line.strip().startswith("Cost:")), "")
        if not cost:
            raise ValueError(f"{fn.__name__}: docstring needs a 'Cost:' line")
        options = tuple(name for name, param in inspect.signature(fn).parameters.items()
                        if param.kind is inspect.Parameter.KEYWORD_ONLY)
        unknown = set(options) - set(OPTION_MINIMUM) - named
        if unknown:
            raise ValueError(f"{fn.__name__}: options {unknown} need an OPTION_MINIMUM")
        defaults = tuple((name, param.default) for name, param in
                         inspect.signature(fn).parameters.items() if name in options
                         and param.default is not inspect.Parameter.empty)
        REGISTRY[collective][name] = Algorithm(collective, name, fn, cost, commutative_only,
                                               even_only, options, tuple(phases),
                                               defaults)
        return fn

    return decorate


def _import_every_module() -> None:
    """Import each collective's module, which files its algorithms: a collective's file
    here is all it takes (named after it, or its spec's ``module``: exscan's are beside
    scan's; helpers such as ``fold`` or ``trees`` are imported by the modules using them)."""
    import importlib

    for collective in COLLECTIVES:
        importlib.import_module(f"{__name__}.{SPECS[collective].module or collective}")


_import_every_module()
