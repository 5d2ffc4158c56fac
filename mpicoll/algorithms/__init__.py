"""The algorithm registry: every collective's named algorithms, side by side.

Each collective has one module here holding all its algorithms as plain functions over
a Transport and flat 1-D arrays; ``@register`` files them under a name, so that
``Communicator.<collective>(..., algorithm=name)``, ``mpicoll.algorithms()``, the
benchmark and the tests all find them. The signature is the same for every algorithm
of a collective:

    broadcast(t, buf, root)                       in place; root's buf holds the data
    scatter(t, src | None, dst, root)             src: size equal blocks (root only)
    gather(t, src, dst | None, root)              dst: size equal blocks (root only)
    all_gather(t, buf, bounds)                    in place; rank r's block already in buf
    reduce(t, src, dst | None, op, root)          dst given at root; elsewhere workspace
    all_reduce(t, src, dst, op)                   dst may be src (in place)
    reduce_scatter(t, src, bounds, op, dst)       dst receives the reduced block [rank]
    all_to_all(t, src, dst)                       size equal blocks each
    barrier(t)

``bounds`` are block offsets in elements (see ``mpicoll.buffers.chunk_bounds``), so the
same code serves even and uneven blocks. Costs use the alpha-beta-gamma model: alpha per
message, beta per byte, gamma per byte reduced; n is the message size in bytes and p the
number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

COLLECTIVES = ("broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce",
               "reduce_scatter", "all_to_all", "barrier")


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: the function, and what the cost model and checks need."""

    collective: str
    name: str
    fn: Callable[..., None]
    cost: str
    commutative_only: bool = False


REGISTRY: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}


def register(collective: str, name: str, *, commutative_only: bool = False):
    """File the decorated function as ``algorithm=name`` of ``collective``.

    The cost is the docstring line that starts with ``Cost:``; every algorithm has one.
    """

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        doc = fn.__doc__ or ""
        cost = next((line.strip()[5:].strip() for line in doc.splitlines()
                     if line.strip().startswith("Cost:")), "")
        if not cost:
            raise ValueError(f"{fn.__name__}: docstring needs a 'Cost:' line")
        REGISTRY[collective][name] = Algorithm(collective, name, fn, cost, commutative_only)
        return fn

    return decorate


# importing the modules fills the registry
from . import (  # noqa: E402,F401
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
