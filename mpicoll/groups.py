"""Sub-communicators: ``comm.split(color, key)`` and ``comm.new_group(ranks)``.

    rows = comm.split(color=comm.rank // 2)          # ranks 0,1 | 2,3 | ...
    evens = comm.new_group(range(0, comm.size, 2))   # None on the odd ranks

Making one is a collective every rank of ``comm`` makes, in the same order as its calls.
It is agreed first: every rank's (color, key) travels in one numbered all_gather, so a
bad color or key on one rank, or ``new_group`` ranks that differ between ranks, raise on
every rank before anything is made; then MPI_Comm_split (or the local backend's own
split) makes the group, and the new Communicator agrees its settings among its ranks as
any does; whether every group was made is then agreed over the parent, so a setting
only one group's ranks read wrong raises on every rank. It has the parent's backend (on
NCCL each rank keeps its GPU), check mode, timeout and tuning and model tables (as the
parent's rank 0 read them); its rank order follows ``key`` (ties by the parent's rank),
as MPI_Comm_split's.
"""

from __future__ import annotations

import contextlib
import math
import sys
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .errors import CollectiveError, InvalidArgumentError, MismatchError, MpicollError
from .observe.recorder import AGREEMENT_STEPS
from .pipeline import agree
from .pipeline.describe import Call
from .pipeline.entry import freed, numbered, turn, watched_step

_BAD_COLOR, _BAD_KEY, _BAD_RANKS, _BAD_MESH, _BAD_BACKEND = 1, 2, 4, 8, 16
_REASONS = {_BAD_COLOR: "color: expected an int in 0..2**31-1 or None",
            _BAD_KEY: "key: expected an int in -2**31..2**31-1",
            _BAD_RANKS: "ranks: expected distinct ranks of the Communicator, ints in 0..{last}",
            _BAD_MESH: "shape: expected positive ints whose product is the ranks, with as "
                       "many distinct str names",
            _BAD_BACKEND: "backend: expected the parent's (or None)"}


def _int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


class Groups:
    """The Communicator's methods that make sub-communicators (see ``mpicoll.groups``),
    and the nodes its ranks are on."""

    @property
    def node(self) -> int:
        """This rank's node: nodes are numbered in the order of their first rank. Agreed
        by every rank when the Communicator is made, from ``MPICOLL_RANKS_PER_NODE=k``
        (consecutive blocks of k ranks of the job: nodes simulated on one machine), SLURM's
        node of the task where srun started every rank, else the shared-memory node
        (``MPI_COMM_TYPE_SHARED``)."""
        return self._node_of[self.rank]

    @property
    def nodes(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each node, in node order (uneven nodes are normal)."""
        ranks: dict[int, list[int]] = {}
        for rank, node in enumerate(self._node_of):
            ranks.setdefault(node, []).append(rank)
        return tuple(tuple(r) for _, r in sorted(ranks.items()))

    def split(self, color: int | None, key: int = 0) -> Any:
        """The Communicator of the ranks that give the same ``color`` (None: this rank
        joins none and gets None), ordered by ``key`` then by rank (MPI_Comm_split)."""
        _live(self, "split")
        faults = 0 if color is None or (_int(color) and 0 <= color < 1 << 31) else _BAD_COLOR
        faults |= 0 if _int(key) and -(1 << 31) <= key < 1 << 31 else _BAD_KEY
        with _turn(self, "split"):
            return _split(self, color, key, faults, 0, sys._getframe(1))

    def new_group(self, ranks: Iterable[int]) -> Any:
        """The Communicator of ``ranks`` (of this one), in their given order; None on the
        ranks not in it. Every rank passes the same ranks."""
        _live(self, "new_group")
        try:
            members = [int(r) if _int(r) else -1 for r in ranks]
        except Exception:  # noqa: BLE001 - whatever the caller's iterable raises is a fault
            members = [-1]  # every rank learns in the agreement (not this rank's alone)
        good = len(set(members)) == len(members) and all(0 <= r < self.size for r in members)
        faults = 0 if good else _BAD_RANKS
        mine = members.index(self.rank) if good and self.rank in members else None
        fingerprint = zlib.crc32(repr(members).encode())
        with _turn(self, "new_group"):
            return _split(self, None if mine is None else 0, mine or 0, faults, fingerprint,
                          sys._getframe(1), "new_group", "ranks")

    def mesh(self, shape: Any, names: Any = None) -> Mesh:
        """An n-dimensional grid of these ranks, row-major (``shape=(2, 4), names=("dp",
        "tp")``: ranks 0-3 and 4-7 are the two ``tp`` groups, so with ranks placed by node
        ``tp`` stays inside a node), with this rank's group along each dimension."""
        _live(self, "mesh")
        with _turn(self, "mesh"):  # (its splits one after another, no other call between)
            return make_mesh(self, shape, names, sys._getframe(1))


def _live(comm: Any, what: str) -> None:
    """Refuse ``what`` on a freed Communicator (as its collectives are refused)."""
    if comm._freed:
        raise freed(what)


def split_lists(comm: Any, lists: Any, what: str, given: str, site: Any,
                other_backend: bool = False) -> tuple[Any, list[int]]:
    """``comm`` split into one group per list of its ranks (disjoint lists, each in the
    order it gives; torch's ``split_group``), in one split: (this rank's Communicator and
    its list's ranks), or (None, []) where it is in no list. Every rank gives the same
    lists: one rank's bad or different ones raise on every rank, before any group is
    made; so does ``other_backend`` on one rank (its caller asked for another backend
    than ``comm``'s)."""
    _live(comm, what)
    try:
        rows = [[int(r) if _int(r) else -1 for r in ranks] for ranks in lists]
    except Exception:  # noqa: BLE001 - as new_group's: a fault every rank learns
        rows = []
    members = [r for ranks in rows for r in ranks]
    good = bool(rows) and all(rows) and len(set(members)) == len(members) and all(
        0 <= r < comm.size for r in members)
    faults = (0 if good else _BAD_RANKS) | (_BAD_BACKEND if other_backend else 0)
    good = good and not other_backend
    mine = [(color, ranks.index(comm.rank)) for color, ranks in enumerate(rows)
            if comm.rank in ranks] if good else []
    color, key = mine[0] if mine else (None, 0)
    fingerprint = zlib.crc32(repr(rows).encode())
    with _turn(comm, what):  # (agreed, then split: no other call between)
        sub = _split(comm, color, key, faults, fingerprint, site, what, given)
    return (None, []) if sub is None else (sub, rows[color])


def agreed_rows(comm: Any, mine: np.ndarray, site: Any, what: str,
                held: bool = False) -> np.ndarray:
    """Every rank's ``mine`` (int64 values, as many on every rank), one row per rank, in
    one numbered all_gather: a step every rank makes (check mode fingerprints it, so a
    rank making another call raises on every rank; the watchdog bounds it). On NCCL,
    whose collectives move device arrays, over its MPI side: a step watched under
    ``what`` (not numbered: check mode does not fingerprint it), refused as a call is on
    a freed Communicator or in a done callback, MPI's errors named as mpicoll's.
    ``held``: the caller holds ``comm``'s turn (``turn``) and keeps it."""
    if comm._backend.separate_control:
        n = mine.size
        table = np.zeros(n * comm.size, np.int64)
        table[n * comm.rank:n * comm.rank + n] = mine
        if held:
            call = Call(comm._seq, what)
            call.at(site)
            step = comm._watch.aside(call)
        else:
            step = watched_step(comm, what, "every rank's values", site)
        with step:
            comm._backend.control.begin()
            agree.all_gather(comm, table, n)
        return table.reshape(comm.size, n)
    # all_gather's whole path, numbered under ``what``: check mode fingerprints it as that
    # step, never as a program's all_gather of as many int64 values (which would pass,
    # and take the step's table for its result); the watchdog's report names it so
    assert what in AGREEMENT_STEPS, what  # (named where every rank's reports read it)
    return numbered(comm, what, site, (mine,), {}, type(comm).all_gather.__wrapped__,
                    held=held).reshape(comm.size, mine.size)


def _split(comm: Any, color: int | None, key: int, faults: int, fingerprint: int,
           site: Any, what: str = "split", given: str = "") -> Any:
    # agree: every rank's (faults, color, key, fingerprint) in one numbered all_gather
    # (``fingerprint``: of what ``what`` was ``given``, which every rank must give alike)
    # (and which of split, new_group, mesh, split_group each rank makes: ``what``)
    mine = np.array([faults, -1 if color is None or faults else int(color),
                     0 if faults else int(key), fingerprint, zlib.crc32(what.encode())],
                    np.int64)
    table = agreed_rows(comm, mine, site, what, held=True)
    bad = np.flatnonzero(table[:, 0]).tolist()
    if bad:
        reasons = sorted({_REASONS[f].format(last=comm.size - 1) for r in bad for f in _REASONS
                          if table[r, 0] & f})
        raise InvalidArgumentError(f"{what}: refused on rank(s) {', '.join(map(str, bad))}: "
                                   f"{'; '.join(reasons)}")
    apart = _apart(table[:, 4])  # the call each rank makes
    if apart is not None:
        raise MismatchError(
            f"{what}: rank(s) {apart[0]} make another call than rank(s) {apart[1]} (of "
            "split, new_group, mesh and split_group); every rank makes the same one")
    apart = _apart(table[:, 3])  # what each rank gives it
    if apart is not None:
        raise MismatchError(f"{what}: rank(s) {apart[0]} give other {given} than rank(s) "
                            f"{apart[1]}; every rank must pass the same {given}")
    colors, keys = table[:, 1], table[:, 2]
    call = Call(comm._seq, "split")
    call.at(site)
    with comm._watch.aside(call):  # collective: it may wait
        try:
            group, failure = _make(comm, color, key, colors, keys), None
        except Exception as exc:  # noqa: BLE001 - raised on its group's ranks alone
            group, failure = None, exc
            if not isinstance(exc, MpicollError):  # (as a call's: mpicoll's errors only)
                failure = CollectiveError(f"{what}: {type(exc).__name__}: {exc}")
                failure.__cause__ = exc
        # each group agreed its settings among its own ranks: one that failed (a trace
        # path, an environment variable only its ranks read) raises on every rank. (A
        # failure on some ranks of one group alone, after MPI_Comm_split, is no group's
        # agreed failure: its other ranks wait in the group's making, and the watchdog
        # ends it, naming the step)
        try:
            agree.outcome(comm, what, failure)
        except MpicollError:
            if group is not None:
                group.free()  # (every rank of it frees it: each learnt the same)
            raise
    return group


def _apart(values: np.ndarray) -> tuple[str, str] | None:
    """Where every rank's value is not the same: the ranks apart from the most (from
    rank 0's, in a tie) and the ranks of the most, as text; else None."""
    kinds, counts = np.unique(values, return_counts=True)
    if len(kinds) == 1:
        return None
    most = values[0] if counts.max() == counts[kinds == values[0]][0] else kinds[counts.argmax()]
    return tuple(", ".join(map(str, np.flatnonzero(same).tolist()))  # type: ignore[return-value]
                 for same in (values != most, values == most))


@contextlib.contextmanager
def _turn(comm: Any, what: str) -> Iterator[None]:
    """``comm``'s turn held for a whole split (its agreement, MPI_Comm_split and the new
    Communicator: no other thread's call between them), or a mesh's splits."""
    with turn(comm, what):
        yield


def _make(comm: Any, color: int | None, key: int, colors: np.ndarray, keys: np.ndarray) -> Any:
    """This rank's group of the split: a Communicator of the parent's class over the
    backend's split (MPI_Comm_split, or a local sub-world), None where ``color`` is None."""
    sub = comm._backend.split(color, key, colors, keys)
    if sub is None:
        return None
    # (the tuning and model files: the parent's, as its rank 0 read them, not re-read
    # on the group's own rank 0: one table for every group of a job)
    group = type(comm)(backend=sub, check=comm.check, timeout=comm.timeout,
                       _tables=comm._chooser.tables)
    # its nodes are the parent's, for its members (in MPI_Comm_split's order: key, then
    # rank), as every rank agreed them: the same on every member, and never another
    # layout than the parent's where its members alone would read one (ranks of two
    # merged MPI worlds under MPICOLL_RANKS_PER_NODE, some reading SLURM's node)
    members = sorted((int(keys[r]), r) for r in range(len(colors)) if colors[r] == color)
    group._node_of = agree.in_order(comm._node_of[r] for _, r in members)
    group._backend.transport.nodes = group._node_of
    return group


class Mesh:
    """An n-dimensional grid of a Communicator's ranks (row-major: consecutive ranks
    along the last dimension), with this rank's sub-communicator along each dimension:
    ``mesh["tp"]`` (or ``mesh.get_group("tp")``) holds the ranks that differ from this
    one only in that coordinate. ``mesh.coordinates``: this rank's place in the grid."""

    def __init__(self, shape: tuple[int, ...], names: tuple[str, ...],
                 coordinates: tuple[int, ...], groups: dict[str, Any]) -> None:
        self.shape, self.names, self.coordinates = shape, names, coordinates
        self._groups = groups

    def __getitem__(self, name: str) -> Any:
        if not isinstance(name, str) or name not in self._groups:
            raise InvalidArgumentError(f"mesh: no dimension {name!r}; it has {self.names}")
        return self._groups[name]

    get_group = __getitem__  # torch's DeviceMesh name

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}={s}" for n, s in zip(self.names, self.shape, strict=True))
        return f"<mpicoll.Mesh ({dims}) at {self.coordinates}>"

    def free(self) -> None:
        for group in self._groups.values():
            group.free()


def make_mesh(comm: Any, shape: Any, names: Any, site: Any) -> Mesh:
    """``comm.mesh(shape, names)`` (made at ``site``, the caller holding ``comm``'s turn):
    the grid and this rank's group along each dimension (one split per dimension, every
    rank alike). The first split agrees the shape and names: one rank's bad or different
    ones raise on every rank, before any group."""
    try:
        shape = tuple(int(s) if _int(s) else -1 for s in shape)
    except Exception:  # noqa: BLE001 - as new_group's: a fault every rank learns
        shape = (-1,)
    try:
        names = tuple(f"dim{d}" for d in range(len(shape))) if names is None else \
            () if isinstance(names, str) else tuple(names)  # ("ab": not the names a, b)
    except Exception:  # noqa: BLE001 - as new_group's: a fault every rank learns
        names = ()
    good = bool(shape) and all(s >= 1 for s in shape) and math.prod(shape) == comm.size \
        and len(names) == len(shape) and all(isinstance(n, str) for n in names) \
        and len(set(names)) == len(names)
    fingerprint = zlib.crc32(repr((shape, names)).encode())
    if not good:  # refused on every rank by the first split, which agrees it
        _split(comm, None, 0, _BAD_MESH, fingerprint, site, "mesh", "shape and names")
    coordinates = tuple(int(c) for c in np.unravel_index(comm.rank, shape))
    groups: dict[str, Any] = {}
    try:
        for d, name in enumerate(names):
            others = coordinates[:d] + coordinates[d + 1:]
            rest = shape[:d] + shape[d + 1:]
            color = int(np.ravel_multi_index(others, rest)) if rest else 0
            groups[name] = _split(comm, color, coordinates[d], 0, fingerprint if d == 0 else 0,
                                  site, "mesh", "shape and names")
    except BaseException:  # a later split failed (on every rank: agreed; MPI out of
        for group in groups.values():  # communicators): the groups made go, not kept
            with contextlib.suppress(Exception):  # (the split's own error goes on)
                group.free()
        raise
    return Mesh(shape, names, coordinates, groups)
