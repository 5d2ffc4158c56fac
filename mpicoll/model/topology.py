"""A topology term for the cost model: every message of an algorithm's real schedule
routed over a torus, fat tree or dragonfly, with per-link bandwidth and contention.

The flat alpha-beta-gamma model (``mpicoll.model.predict``) charges every message the
same, wherever its peer is. On a torus or a dragonfly a message to a far rank crosses
more links, and the messages of one step share links: Swing's and Bine's point (De Sensi
et al., NSDI 2024 and SC 2025) is exactly that their peers are nearer than recursive
doubling's. This module predicts from the messages the algorithm really sends:

1. **Schedule.** The algorithm's own code runs once per rank over a recording transport
   (``record``): no data moves, a receive returns at once, and every send, receive, wait
   and reduction is written down in program order. The algorithms' control flow depends
   on rank, size, count and options only, never on the data, so each rank can run alone,
   one after another, with no threads (ring all_reduce at 1024 ranks, 2 million
   messages, takes about 6 s). The k-th message from s to d is the k-th receive that d
   posts from s; a schedule whose sends and receives do not match, or that would
   deadlock, is refused.
2. **Rounds.** Each rank keeps a clock: a blocking send goes out in round c and the next
   operation starts in c + 1; nonblocking sends go out in round c and complete in c + 1;
   a receive of a message sent in round r completes in r + 1 (a rank waits at
   ``recv``/``waitall``: clock = max(clock, r + 1)); a sendrecv is both in one round. So
   every message lands in the earliest round it can go in: ring's 2(p-1) steps, a
   tree's levels, a pipeline's segments, and folded ranks' extra steps, as they are.
   A reduction counts in the round whose message it combines.
3. **Routes.** Rank i sits on node i. Torus (``torus:8x8``, ``torus:4x4x4``, any number
   of dimensions): dimension-order routing, each dimension the short way round; a tie
   (exactly half way) splits the bytes over both directions. Fat tree (``fattree:k`` or
   ``fattree:k,r``): the three-level k-ary fat tree of k^3/4 hosts, up/down routing with
   D-mod-k upward ports; r oversubscribes it (edge-to-aggregation links carry 1/r of a
   host link). Dragonfly (``dragonfly:g,a,t``): g groups of a routers of t nodes, routers
   of a group all-to-all, one global link between every two groups (group i's link to
   group j on router ((j - i - 1) mod g) mod a), minimal routing: up, local, global,
   local, down. Links are directed (full duplex), all of bandwidth B but the
   oversubscribed ones.
4. **Time.** Per round r, with m_r the most messages one rank sends or receives in it
   (a rank handles its messages one after another: a linear broadcast's root pays p-1
   alphas), h_r the most links any message of the round crosses, load_r(l) the bytes of
   the round that cross link l, and red_r the most bytes any rank reduces in it::

       T_r = alpha * m_r + h_r * hop_latency + max_l load_r(l) / B_l + red_r * gamma
       T   = sum over the rounds

   Contention is the max over links: two messages of a round on one link take twice as
   long. With no contention and no hop latency this is the flat model's alpha-beta term
   (a ring on a full fat tree matches ``predict`` exactly; tests/test_topology.py).

Scale. Message sizes are linear in the count, so a call of n bytes is recorded at a few
elements per block (m0 = p elements of float32 when p is a power of two) and its bytes
multiplied by n / (4 m0), exactly for even blocks; sizes under m0 elements are recorded
as they are (their uneven blocks, empty ones included), unless the schedule has more
than 100 000 operations (ring at 256 ranks and up), where the m0 schedule is scaled down
too (the same messages, each off by under one element). Pipelined algorithms
(``segment_bytes``) are recorded with their segments scaled along; past 64 segments the
time is extrapolated linearly in n from 32 and 64 segments (each segment adds the same
rounds). Profiles (four sums per schedule and topology) are cached per process.

Against the Swing paper (De Sensi, Bonato, Saam, Hoefler, NSDI 2024, arXiv 2401.09356):
its figures come from SST packet simulations with 400 Gb/s links (B = 50 GB/s), 100 ns a
link and 300 ns a router (0.4 us a hop) and no reduction cost; alpha = 0.5 us is the one
value chosen here::

    python -m mpicoll.model table --topology torus:8x8 --alpha 0.5 --hop-latency 0.4 \\
        --link-bandwidth 50 --reduce-bandwidth 0

    32 B all_reduce (us)        8x8  64x16  128x8  256x4  64x64  8x8x8  8x8x8x8
    paper: recursive doubling   8.7     36     59    109     57     13       17
    model: recursive_doubling   8.6   36.2   58.7  108.3   56.5   12.9     17.2
    paper: Swing                  7     26     41     74     40     10       14
    model: swing_latency       11.8   40.2   51.5   79.1   93.3   24.9     42.8
    paper: Hamiltonian rings    120   2000   2000   2000   7000      -        -
    model: ring               163.8   2660   2660   2660      -   1737        -

Large vectors. Congestion (the busiest link's bytes over the most bytes a rank sends,
summed over the rounds) of swing_bandwidth: 1.25 on 8x8, 1.56 on 32x32, 1.72 on 64x64,
1.28 on 8x8x8, where the paper gives its Swing 1.19 on any 2-D torus and 1.03 on 3-D;
rabenseifner 1.86, 6.9, 13.5 (the paper's torus-ordered one: 1.5); recursive_doubling
1.67, 4.6, 7.8; ring 1. At 512 MiB on 64x64 swing_bandwidth reaches 116 Gb/s, 58% of
one port's 200 Gb/s (paper: 77% of its four ports' 800 Gb/s, at most 1/1.19 = 81%).
Swing's gain (the better of swing_latency and swing_bandwidth against the best of
recursive_doubling, rabenseifner, double_binary_tree, reduce_broadcast and ring) from
32 B to 512 MiB: 8x8 -27% .. +34% (2 MiB), ring ahead from 32 MiB; 32x32 -35% .. +121%
(8 MiB), ring ahead from 128 MiB; 64x16 up to +190%, 128x8 +338%, 256x4 +347% (8 MiB).
The paper: up to +120% on square tori (at 2 MiB), up to 3x on 128x8 and 256x4, behind
the bucket algorithm from 128 MiB by at most 22%, and behind the ring past 512 MiB on
the 1024-node rectangles. So the model agrees where the schedules are the same
(recursive doubling's latency, within 2%) and in the shape of the large-vector results
(Swing ahead from about 512 KiB to 8-32 MiB, from 32 B on narrow tori, by more on
narrower tori; a ring ahead for the largest), and differs for these reasons:

- Ports. The paper's Swing, bucket and Hamiltonian rings cut the vector into 2D parts
  (D dimensions) and drive all 2D links of a node at once; mpicoll's algorithms send to one peer a
  step, so their bandwidth-bound times are about 2D times the paper's (peak n/T = B/2,
  not D B), and mpicoll has no bucket algorithm to compare.
- Swing's peers. mpicoll's Swing is the 1-D algorithm, peers r +- 1, 3, 5, 11, 21, ...
  in rank order; the paper's alternates the torus dimensions. On a square torus in
  row-major order those distances cross rows (on 8x8 its steps take up to 1, 2, 4, 4,
  5, 6 hops, recursive doubling's powers of two 1, 2, 4, 1, 2, 4), so at 32 B it is
  behind recursive doubling where the paper's Swing is 20-30% ahead; on narrow tori the
  ranks are nearly a ring and it wins, as in the paper.
- Rabenseifner. mpicoll's halves first with the rank p/2 away, so its biggest halves
  cross the most links; the paper's torus-ordered one (Sack and Gropp) contends far
  less, so Swing's gains over it are bigger here.
- The model. Rounds are bulk-synchronous (a round ends when its busiest link drains;
  latency and bytes add; nothing overlaps across rounds) and routing is static, where
  SST pipelines packets over hops and routes adaptively; contended bandwidth-bound times
  are upper bounds.

Cost of a table: the algorithms' own code runs once per rank and recording; 32x32
(64..1024 ranks, every all_reduce) takes about 40 s of one core, most of it ring and
ring_pipelined at 1024 ranks (2 million messages each); 8x8 about 2 s.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from array import array
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..algorithms import REGISTRY
from ..buffers import chunk_bounds, counts_bounds
from ..ops import resolve_op
from ..transport import Workspace
from . import Params, _size

HOP_LATENCY = 1e-7  # seconds a hop (one link and one router) when none is given
ITEMSIZE = 4  # the calls are modelled on float32 elements
EXACT_OPERATIONS = 100_000  # record small sizes as they are up to this many operations
SEGMENTS = 64  # record a pipeline up to this many segments, extrapolate beyond
SIZES = tuple(32 << (2 * i) for i in range(12))  # 32 B, 128 B, ..., 128 MiB
_LINK_CELLS = 1 << 23  # (round, link) load cells summed at once


class ScheduleError(RuntimeError):
    """A recorded schedule that cannot have run: unmatched messages or a deadlock."""


# -- topologies -------------------------------------------------------------------------


class Topology:
    """Nodes, directed links and a route between any two nodes.

    ``paths(src, dst)`` gives every hop of every message as three arrays: the message's
    index, the link, and the share of the message's bytes on that hop (1, or less where
    a route splits); ``hops(src, dst)`` the links each message crosses; ``scale[l]`` link
    l's bandwidth as a multiple of the link bandwidth B.
    """

    spec: str
    nodes: int
    links: int
    scale: np.ndarray
    routing: str

    def paths(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def hops(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.spec} ({self.nodes} nodes, {self.links} links; {self.routing})"


def _expand(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For items with ``counts[i]`` hops each: the item of every hop and its number 0..c-1."""
    item = np.repeat(np.arange(len(counts)), counts)
    starts = np.cumsum(counts) - counts
    return item, np.arange(len(item)) - np.repeat(starts, counts)


class Torus(Topology):
    """A torus of ``dims`` (``torus:8x8``): node i at row-major coordinates (the last
    dimension fastest), links to both neighbours in every dimension (two directed
    links each way per dimension; in a dimension of 2 the two neighbours coincide)."""

    routing = "dimension-order routing, ties split both ways"

    def __init__(self, dims: tuple[int, ...]) -> None:
        self.dims = dims
        self.spec = "torus:" + "x".join(map(str, dims))
        self.nodes = math.prod(dims)
        self.strides = tuple(math.prod(dims[d + 1:]) for d in range(len(dims)))
        self.links = self.nodes * 2 * len(dims)
        self.scale = np.ones(self.links)

    def link(self, node: Any, dim: int, plus: Any) -> Any:
        """The link leaving ``node`` in dimension ``dim``, in the + or - direction."""
        return node * 2 * len(self.dims) + 2 * dim + (1 - np.asarray(plus, dtype=np.int64))

    def hops(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        total = np.zeros(len(src), np.int64)
        for k, stride in zip(self.dims, self.strides, strict=True):
            delta = (dst // stride % k - src // stride % k) % k
            total += np.minimum(delta, k - delta)
        return total

    def paths(self, src, dst):
        which = np.arange(len(src))
        share = np.ones(len(src))
        here = src.astype(np.int64)
        out: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for dim, (k, stride) in enumerate(zip(self.dims, self.strides, strict=True)):
            a = here // stride % k
            b = dst[which] // stride % k
            delta = (b - a) % k
            plus = delta <= k - delta  # the short way; a tie goes + here ...
            twins = np.flatnonzero(2 * delta == k)
            if len(twins):  # ... with half its bytes, and - with the other half
                share[twins] /= 2
                which, share = np.concatenate([which, which[twins]]), np.concatenate([share, share[twins]])
                here, a, b, delta = (np.concatenate([v, v[twins]]) for v in (here, a, b, delta))
                plus = np.concatenate([plus, np.zeros(len(twins), bool)])
            steps = np.where(plus, delta, (k - delta) % k)
            item, j = _expand(steps)
            sign = np.where(plus[item], 1, -1)
            position = (a[item] + sign * j) % k
            node = here[item] + (position - a[item]) * stride
            out.append((which[item], self.link(node, dim, plus[item]), share[item]))
            here = here + (b - a) * stride
        return tuple(np.concatenate(parts) for parts in zip(*out, strict=True))


class FatTree(Topology):
    """The three-level k-ary fat tree (``fattree:k``; Al-Fares et al. 2008): k pods of
    k/2 edge and k/2 aggregation switches, k/2 hosts on each edge switch, (k/2)^2 core
    switches; k^3/4 hosts. ``fattree:k,r``: the edge switches' uplinks have 1/r of a
    host link's bandwidth (r:1 oversubscribed). Up/down routing, D-mod-k: a message to
    host d goes up through aggregation switch d mod k/2 and core (d div k/2) mod k/2."""

    routing = "up/down routing, D-mod-k ports"

    def __init__(self, k: int, oversubscription: float = 1.0) -> None:
        if k < 2 or k % 2:
            raise ValueError(f"fattree:{k}: k must be even and at least 2")
        if oversubscription < 1:
            raise ValueError(f"fattree: the oversubscription ratio must be >= 1, got {oversubscription:g}")
        self.k, self.half, self.ratio = k, k // 2, oversubscription
        self.spec = f"fattree:{k}" + (f",{oversubscription:g}" if oversubscription != 1 else "")
        h = self.half
        self.nodes = k * h * h
        edges, aggs, cores = k * h, k * h, h * h
        # link blocks: host up, host down, edge->agg, agg->edge, agg->core, core->agg
        self.base = np.cumsum([0, self.nodes, self.nodes, edges * h, aggs * h, aggs * h, cores * k])
        self.links = int(self.base[-1])
        self.scale = np.ones(self.links)
        self.scale[self.base[2]:self.base[4]] = 1 / oversubscription

    def _levels(self, src, dst):
        h = self.half
        edge_s, edge_d = src // h, dst // h
        pod_s, pod_d = edge_s // h, edge_d // h
        same_edge, same_pod = edge_s == edge_d, pod_s == pod_d
        return edge_s, edge_d, pod_s, pod_d, same_edge, same_pod

    def hops(self, src, dst):
        _, _, _, _, same_edge, same_pod = self._levels(src, dst)
        return np.where(src == dst, 0, np.where(same_edge, 2, np.where(same_pod, 4, 6)))

    def paths(self, src, dst):
        h, base = self.half, self.base
        edge_s, edge_d, pod_s, pod_d, same_edge, same_pod = self._levels(src, dst)
        j, c = dst % h, dst // h % h
        index = np.arange(len(src))
        moves = src != dst
        up = moves & ~same_edge
        far = up & ~same_pod
        hops = [
            (moves, base[0] + src),  # host -> edge
            (up, base[2] + edge_s * h + j),  # edge -> aggregation j
            (far, base[4] + (pod_s * h + j) * h + c),  # aggregation -> core (j, c)
            (far, base[5] + (j * h + c) * self.k + pod_d),  # core -> aggregation j of pod_d
            (up, base[3] + (pod_d * h + j) * h + edge_d % h),  # aggregation -> edge
            (moves, base[1] + dst),  # edge -> host
        ]
        which = np.concatenate([index[m] for m, _ in hops])
        link = np.concatenate([ids[m] for m, ids in hops])
        return which, link, np.ones(len(which))


class Dragonfly(Topology):
    """A dragonfly (``dragonfly:g,a,t``; Kim et al. 2008): g groups of a routers with t
    nodes each; the routers of a group all-to-all; one global link between every two
    groups, group i's to group j on its router ((j - i - 1) mod g) mod a. Minimal
    routing: node, its router, a local hop to the router with the global link, the
    global link, a local hop to the destination's router, the node."""

    routing = "minimal routing"

    def __init__(self, groups: int, routers: int, per_router: int) -> None:
        if min(groups, routers, per_router) < 1:
            raise ValueError("dragonfly:g,a,t: every number must be >= 1")
        self.g, self.a, self.t = groups, routers, per_router
        self.spec = f"dragonfly:{groups},{routers},{per_router}"
        self.nodes = groups * routers * per_router
        n = self.nodes
        self.local_base, self.global_base = 2 * n, 2 * n + groups * routers * routers
        self.links = self.global_base + groups * groups
        self.scale = np.ones(self.links)

    def _gateway(self, group, other):
        """The router (within its group) of ``group``'s global link to ``other``."""
        return (other - group - 1) % self.g % self.a

    def _route(self, src, dst):
        router_s, router_d = src // self.t, dst // self.t
        group_s, group_d = router_s // self.a, router_d // self.a
        x, y = router_s % self.a, router_d % self.a
        out_gate, in_gate = self._gateway(group_s, group_d), self._gateway(group_d, group_s)
        moves = src != dst
        across = group_s != group_d
        local = moves & ~across & (x != y)
        first = across & (x != out_gate)
        last = across & (in_gate != y)
        lb = self.local_base
        return [
            (moves, src),  # node -> router
            (local, lb + (group_s * self.a + x) * self.a + y),
            (first, lb + (group_s * self.a + x) * self.a + out_gate),
            (across, self.global_base + group_s * self.g + group_d),
            (last, lb + (group_d * self.a + in_gate) * self.a + y),
            (moves, self.nodes + dst),  # router -> node
        ]

    def hops(self, src, dst):
        return sum(mask.astype(np.int64) for mask, _ in self._route(src, dst))

    def paths(self, src, dst):
        index = np.arange(len(src))
        hops = self._route(src, dst)
        which = np.concatenate([index[m] for m, _ in hops])
        link = np.concatenate([ids[m] for m, ids in hops])
        return which, link, np.ones(len(which))


def parse(spec: str) -> Topology:
    """The topology a spec names: ``torus:8x8``, ``torus:4x4x4``, ``fattree:16``,
    ``fattree:16,2`` (2:1 oversubscribed), ``dragonfly:9,4,4`` (groups, routers, nodes
    per router).

    Raises:
        ValueError: naming what is wrong with ``spec``.
    """
    kind, _, rest = spec.strip().partition(":")
    try:
        if kind == "torus" and re.fullmatch(r"\d+(x\d+)*", rest):
            dims = tuple(int(d) for d in rest.split("x"))
            if min(dims) < 1:
                raise ValueError("every dimension must be >= 1")
            return Torus(dims)
        if kind == "fattree" and re.fullmatch(r"\d+(,\d+(\.\d+)?)?", rest):
            k, _, ratio = rest.partition(",")
            return FatTree(int(k), float(ratio) if ratio else 1.0)
        if kind == "dragonfly" and re.fullmatch(r"\d+,\d+,\d+", rest):
            return Dragonfly(*(int(v) for v in rest.split(",")))
    except ValueError as exc:
        raise ValueError(f"topology {spec!r}: {exc}") from None
    raise ValueError(f"topology {spec!r}: expected torus:AxB[xC...], fattree:k[,ratio] or "
                     "dragonfly:groups,routers,nodes")


# -- recording a schedule ---------------------------------------------------------------

# operations, three ints each: (kind, peer or request, bytes); sends first, then receives
_SEND, _SR_SEND, _ISEND, _RECV, _SR_RECV, _IRECV, _WAIT, _REDUCE = range(8)


class _Recorder(Workspace):
    """One rank's transport in a dry run: writes down every operation, moves nothing.

    Operations go into a flat int array, three ints each: (kind, peer, bytes) for sends
    and receives (a sendrecv is one of each, in one round), (WAIT, request, 0) for each
    request a ``waitall`` waits for, (REDUCE, bytes, 0) for a reduction."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__()
        self.rank, self.size, self.tag = rank, size, 0
        self.ops = array("q")
        self.requests = 0

    def begin(self, like: Any = None) -> None:
        self._start_call(like)

    def synchronize(self) -> None:
        """Nothing is queued."""

    def free(self) -> None:
        """Nothing to release."""

    def send(self, buf: np.ndarray, dest: int) -> None:
        self.ops.extend((_SEND, dest, buf.nbytes))

    def recv(self, buf: np.ndarray, source: int) -> None:
        self.ops.extend((_RECV, source, buf.nbytes))

    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None:
        self.ops.extend((_SR_SEND, dest, sendbuf.nbytes, _SR_RECV, source, recvbuf.nbytes))

    def isend(self, buf: np.ndarray, dest: int) -> int:
        self.ops.extend((_ISEND, dest, buf.nbytes))
        self.requests += 1
        return self.requests - 1

    def irecv(self, buf: np.ndarray, source: int) -> int:
        self.ops.extend((_IRECV, source, buf.nbytes))
        self.requests += 1
        return self.requests - 1

    def waitall(self, requests: Any) -> None:
        for request in requests:  # waiting for each in turn ends in the same round
            if request is not None:
                self.ops.extend((_WAIT, request, 0))


@dataclass(frozen=True, eq=False)
class Schedule:
    """Every message of one call, in rounds: message i goes from ``source[i]`` to
    ``dest[i]`` in round ``round[i]`` with ``nbytes[i]`` bytes (each rank's sends in its
    program order); receive j is rank ``recv_rank[j]``'s from ``recv_source[j]`` of
    ``recv_bytes[j]`` (program order); reduction k combines ``reduce_bytes[k]`` bytes on
    rank ``reduce_rank[k]`` in round ``reduce_round[k]``."""

    collective: str
    algorithm: str
    ranks: int
    count: int
    itemsize: int
    round: np.ndarray
    source: np.ndarray
    dest: np.ndarray
    nbytes: np.ndarray
    recv_rank: np.ndarray
    recv_source: np.ndarray
    recv_bytes: np.ndarray
    reduce_round: np.ndarray
    reduce_rank: np.ndarray
    reduce_bytes: np.ndarray

    @property
    def rounds(self) -> int:
        return int(max(self.round.max(initial=-1), self.reduce_round.max(initial=-1)) + 1)

    def sends(self, rank: int) -> list[tuple[int, int]]:
        """(dest, bytes) of every message ``rank`` sends, in its program order."""
        mine = self.source == rank
        return list(zip(self.dest[mine].tolist(), self.nbytes[mine].tolist(), strict=True))

    def receives(self, rank: int) -> list[tuple[int, int]]:
        """(source, bytes) of every receive ``rank`` posts, in its program order."""
        mine = self.recv_rank == rank
        return list(zip(self.recv_source[mine].tolist(), self.recv_bytes[mine].tolist(),
                        strict=True))


def _call(collective: str, algorithm: str, t: Any, count: int, dtype: np.dtype, op: Any,
          options: dict[str, Any]) -> None:
    """Run ``algorithm`` as rank t.rank of ``collective`` on ``count`` elements (the
    whole vector; for the collectives of p blocks, all p blocks, as ``chunk_bounds`` cuts
    them, or count // p each for an algorithm that needs equal blocks), root 0."""
    p, rank = t.size, t.rank
    entry = REGISTRY[collective][algorithm]
    fn = entry.fn
    if entry.even_only:
        count = max(count // p, 1) * p
    whole = np.zeros(count, dtype)
    if collective not in ("all_reduce", "scan", "exscan", "reduce", "broadcast", "barrier"):
        bounds = chunk_bounds(count, p)
        block = slice(bounds[rank], bounds[rank + 1])
    if collective in ("all_reduce", "scan", "exscan"):
        fn(t, whole, np.zeros(count, dtype), op, **options)
    elif collective == "reduce":
        fn(t, whole, np.zeros(count, dtype) if rank == 0 else None, op, 0, **options)
    elif collective == "broadcast":
        fn(t, whole, 0, **options)
    elif collective == "all_gather":
        fn(t, whole, bounds, **options)
    elif collective == "reduce_scatter":
        fn(t, whole, bounds, op, np.zeros(block.stop - block.start, dtype), **options)
    elif collective == "scatter":
        fn(t, whole if rank == 0 else None, whole[block].copy(), bounds, 0, **options)
    elif collective == "gather":
        fn(t, whole[block].copy(), whole if rank == 0 else None, bounds, 0, **options)
    elif collective == "all_to_all":  # every rank sends rank j a block of j's size
        mine = block.stop - block.start
        fn(t, whole, bounds, np.zeros(p * mine, dtype), counts_bounds([mine] * p), **options)
    elif collective == "barrier":
        fn(t, **options)
    else:
        raise ValueError(f"collective: unknown collective {collective!r}")


def record(collective: str, algorithm: str, ranks: int, count: int,
           dtype: Any = np.float32, **options: Any) -> Schedule:
    """The schedule of ``algorithm`` on ``ranks`` ranks and ``count`` elements of
    ``dtype``: its own code run rank by rank over a recording transport, every message
    put in the earliest round it can go in (see the module's docstring).

    Raises:
        ScheduleError: the ranks' sends and receives do not match, or would deadlock.
    """
    dtype = np.dtype(dtype)
    programs = [program(collective, algorithm, rank, ranks, count, dtype, **options)
                for rank in range(ranks)]
    return _rounds(collective, algorithm, ranks, count, dtype.itemsize, programs)


def program(collective: str, algorithm: str, rank: int, ranks: int, count: int,
            dtype: Any = np.float32, **options: Any) -> array:
    """Rank ``rank``'s operations in a dry run (see ``_Recorder``), in program order."""
    t = _Recorder(rank, ranks)
    ops = t.ops

    def reduce(a: Any, b: Any, out: Any) -> None:
        ops.extend((_REDUCE, out.nbytes, 0))

    dtype = np.dtype(dtype)
    op = dataclasses.replace(resolve_op("sum", dtype), fn=reduce)
    t.begin()
    _call(collective, algorithm, t, count, dtype, op, options)
    return ops


def _rounds(collective: str, algorithm: str, p: int, count: int, itemsize: int,
            programs: list[array]) -> Schedule:
    """Replay the ranks' programs together, each message in the earliest round it can go
    in; then match the k-th message from s to d with the k-th receive d posts from s."""
    where = f"{collective} {algorithm} at {p} ranks"
    clock, position, waiting = [0] * p, [0] * p, [-1] * p
    marks = [array("q", bytes(len(ops) // 3 * 8)) for ops in programs]  # round of each op
    sent: dict[int, list[int]] = {}  # source * p + dest -> the round of each message so far
    taken: dict[int, int] = {}  # source * p + dest -> receives posted so far
    requests: list[list[Any]] = [[] for _ in range(p)]  # a send's round done, or (pair, k)
    ready = deque(range(p))
    while ready:
        r = ready.popleft()
        ops, i, c, mark, mine = programs[r], position[r], clock[r], marks[r], requests[r]
        end = len(ops)
        while i < end:
            kind = ops[i]
            if kind <= _ISEND:  # a send goes out in round c
                d = ops[i + 1]
                box = sent.get(r * p + d)
                if box is None:
                    box = sent[r * p + d] = []
                box.append(c)
                mark[i // 3] = c
                if waiting[d] == r:
                    waiting[d] = -1
                    ready.append(d)
                if kind == _SEND:
                    c += 1
                elif kind == _ISEND:
                    mine.append(c + 1)
            elif kind <= _IRECV:
                s = ops[i + 1]
                key = s * p + r
                k = taken.get(key, 0)
                if kind == _IRECV:
                    mine.append((key, k))
                else:
                    box = sent.get(key)
                    if box is None or k >= len(box):
                        waiting[r] = s
                        break
                    got = box[k] + 1
                    c = max(c + 1, got) if kind == _SR_RECV else max(c, got)
                taken[key] = k + 1
            elif kind == _WAIT:
                entry = mine[ops[i + 1]]
                if entry.__class__ is int:
                    got = entry
                else:
                    box = sent.get(entry[0])
                    if box is None or entry[1] >= len(box):
                        waiting[r] = entry[0] // p
                        break
                    got = box[entry[1]] + 1
                if got > c:
                    c = got
            else:  # _REDUCE: part of the round whose message it combines
                mark[i // 3] = c - 1
            i += 3
        position[r], clock[r] = i, c
    stuck = [r for r in range(p) if position[r] < len(programs[r])]
    if stuck:
        raise ScheduleError(f"{where}: the schedule deadlocks (rank {stuck[0]} waits for rank "
                            f"{waiting[stuck[0]]}; {len(stuck)} rank(s) stuck)")
    ops = np.concatenate([np.frombuffer(o, np.int64) for o in programs]).reshape(-1, 3)
    mark = np.concatenate([np.frombuffer(m, np.int64) for m in marks])
    rank = np.repeat(np.arange(p), [len(o) // 3 for o in programs])
    kind, peer, nbytes = ops[:, 0], ops[:, 1], ops[:, 2]
    sends, receives, reduces = kind <= _ISEND, (kind >= _RECV) & (kind <= _IRECV), kind == _REDUCE
    schedule = Schedule(collective, algorithm, p, count, itemsize, mark[sends], rank[sends],
                        peer[sends], nbytes[sends], rank[receives], peer[receives],
                        nbytes[receives], np.maximum(mark[reduces], 0), rank[reduces],
                        peer[reduces])
    _match(schedule, where)
    return schedule


def _match(s: Schedule, where: str) -> None:
    """Every message received once, into a receive of its size."""
    out = s.source * s.ranks + s.dest
    into = s.recv_source * s.ranks + s.recv_rank
    pairs, sent = np.unique(out, return_counts=True)
    pairs_in, received = np.unique(into, return_counts=True)
    if len(pairs) != len(pairs_in) or (pairs != pairs_in).any() or (sent != received).any():
        bad = next(int(key) for key in np.union1d(pairs, pairs_in)
                   if (out == key).sum() != (into == key).sum())
        raise ScheduleError(f"{where}: rank {bad // s.ranks} sends {(out == bad).sum()} "
                            f"message(s) to rank {bad % s.ranks}, which receives {(into == bad).sum()}")
    by_pair, by_pair_in = np.argsort(out, kind="stable"), np.argsort(into, kind="stable")
    wrong = np.flatnonzero(s.nbytes[by_pair] != s.recv_bytes[by_pair_in])
    if len(wrong):
        i, j = by_pair[wrong[0]], by_pair_in[wrong[0]]
        raise ScheduleError(f"{where}: rank {s.source[i]} sends {s.nbytes[i]} bytes where rank "
                            f"{s.dest[i]} receives {s.recv_bytes[j]}")


# -- the model ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Profile:
    """A schedule on a topology, per round and summed over the rounds: the most messages
    a rank sends or receives (``handled``), the most links a message crosses
    (``hops``), the most bytes per unit of link bandwidth on any link (``load``: seconds
    at 1 B/s) and the most bytes a rank reduces (``reduced``); per-round arrays beside."""

    messages: int
    operations: int  # messages, receives and reductions: the cost of recording it
    rounds: int  # rounds that send
    handled: float
    hops: float
    load: float
    reduced: float
    round_handled: np.ndarray
    round_hops: np.ndarray
    round_load: np.ndarray
    round_reduced: np.ndarray

    def time(self, alpha: float, hop_latency: float, link_bandwidth: float, gamma: float,
             scale: float = 1.0) -> float:
        """Seconds, with every message's bytes multiplied by ``scale``."""
        return (self.handled * alpha + self.hops * hop_latency
                + scale * (self.load / link_bandwidth + self.reduced * gamma))


def link_loads(schedule: Schedule, topology: Topology) -> np.ndarray:
    """Bytes crossing each link in each round: shape (rounds, links)."""
    rounds = max(schedule.rounds, 1)
    which, link, share = topology.paths(schedule.source, schedule.dest)
    key = schedule.round[which] * topology.links + link
    return np.bincount(key, weights=schedule.nbytes[which] * share,
                       minlength=rounds * topology.links).reshape(rounds, topology.links)


def profile(schedule: Schedule, topology: Topology) -> Profile:
    """The per-round maxima of ``schedule`` with rank i on node i of ``topology``."""
    if schedule.ranks > topology.nodes:
        raise ValueError(f"{schedule.ranks} ranks do not fit {topology.spec} "
                         f"({topology.nodes} nodes)")
    rounds = max(schedule.rounds, 1)
    sends = np.bincount(schedule.round, minlength=rounds) > 0
    cells = rounds * schedule.ranks
    out = np.bincount(schedule.round * schedule.ranks + schedule.source, minlength=cells)
    into = np.bincount(schedule.round * schedule.ranks + schedule.dest, minlength=cells)
    round_handled = np.maximum(out, into).reshape(rounds, schedule.ranks).max(axis=1)
    round_hops = np.zeros(rounds)
    np.maximum.at(round_hops, schedule.round, topology.hops(schedule.source, schedule.dest))
    round_load = np.zeros(rounds)
    which, link, share = topology.paths(schedule.source, schedule.dest)
    when = schedule.round[which]
    weight = schedule.nbytes[which] * share / topology.scale[link]
    step = max(1, _LINK_CELLS // topology.links)
    order = np.argsort(when, kind="stable")
    when, link, weight = when[order], link[order], weight[order]
    cuts = np.searchsorted(when, np.arange(0, rounds + step, step))
    for first, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        if lo == hi:
            continue
        base = first * step
        cells = np.bincount((when[lo:hi] - base) * topology.links + link[lo:hi],
                            weights=weight[lo:hi], minlength=step * topology.links)
        top = cells.reshape(step, topology.links).max(axis=1)
        round_load[base:base + step] = top[: max(0, min(step, rounds - base))]
    round_reduced = np.zeros(rounds)
    if len(schedule.reduce_round):
        per_rank = np.bincount(schedule.reduce_round * schedule.ranks + schedule.reduce_rank,
                               weights=schedule.reduce_bytes, minlength=rounds * schedule.ranks)
        round_reduced = per_rank.reshape(rounds, schedule.ranks).max(axis=1)
    operations = len(schedule.round) + len(schedule.recv_rank) + len(schedule.reduce_round)
    return Profile(len(schedule.round), operations, int(sends.sum()),
                   float(round_handled.sum()), float(round_hops[sends].sum()),
                   float(round_load.sum()), float(round_reduced.sum()),
                   round_handled, round_hops, round_load, round_reduced)


@lru_cache(maxsize=512)
def _profile(collective: str, algorithm: str, p: int, count: int, spec: str,
             options: tuple[tuple[str, Any], ...]) -> Profile:
    return profile(record(collective, algorithm, p, count, **dict(options)), parse(spec))


def _unit(p: int) -> int:
    """Elements of the scaled recording: a multiple of p and of p2 (even blocks for
    every algorithm, folded or not) where that is under 64 p, else 64 p."""
    p2 = 1 << (p.bit_length() - 1)
    both = p * p2 // math.gcd(p, p2)
    return both if both <= 64 * p else 64 * p


def _segment_bytes(collective: str, algorithm: str, options: dict[str, Any]) -> int | None:
    if "segment_bytes" in options:
        return int(options["segment_bytes"])
    param = inspect.signature(REGISTRY[collective][algorithm].fn).parameters.get("segment_bytes")
    return None if param is None else int(param.default)


def predict(collective: str, algorithm: str, nbytes: int, p: int, topology: Topology | str,
            params: Params | None = None, link_bandwidth: float | None = None,
            hop_latency: float = HOP_LATENCY, **options: Any) -> float:
    """The model's time in seconds for ``algorithm`` on ``nbytes`` (float32 elements;
    for collectives of p blocks, all of them) at ``p`` ranks, rank i on node i of
    ``topology``: alpha and gamma from ``params``, B = ``link_bandwidth`` bytes/s
    (default 1 / params.beta), ``hop_latency`` seconds a hop.

    Raises:
        ValueError: p ranks do not fit the topology.
        ScheduleError: the algorithm's schedule does not hold together.
    """
    params = params or Params()
    topology = parse(topology) if isinstance(topology, str) else topology
    if p > topology.nodes:
        raise ValueError(f"{p} ranks do not fit {topology.spec} ({topology.nodes} nodes)")
    bandwidth = link_bandwidth or 1 / params.beta
    costs = (params.alpha, hop_latency, bandwidth, params.gamma)
    if p == 1:
        return 0.0
    return _time(collective, algorithm, int(nbytes), p, topology.spec, costs, options)


def _time(collective: str, algorithm: str, nbytes: int, p: int, spec: str,
          costs: tuple[float, float, float, float], options: dict[str, Any]) -> float:
    itemsize = ITEMSIZE
    segment = _segment_bytes(collective, algorithm, options)
    if segment and nbytes > SEGMENTS * segment:  # each further segment adds the same rounds
        low, high = SEGMENTS // 2 * segment, SEGMENTS * segment
        t_low = _time(collective, algorithm, low, p, spec, costs, options)
        t_high = _time(collective, algorithm, high, p, spec, costs, options)
        return t_low + (nbytes - low) * (t_high - t_low) / (high - low)
    count = max(1, nbytes // itemsize)
    unit = _unit(p)

    def profiled(elements: int, more: dict[str, Any] | None = None) -> Profile:
        chosen = {**options, **(more or {})}
        if segment and chosen.get("segment_bytes", segment) >= elements * itemsize:
            chosen["segment_bytes"] = elements * itemsize  # one name for "no segments"
        return _profile(collective, algorithm, p, elements, spec, tuple(sorted(chosen.items())))

    if count < unit:
        whole = profiled(unit)
        if whole.operations > EXACT_OPERATIONS:  # the same messages, bytes scaled down
            return whole.time(*costs, scale=nbytes / (unit * itemsize))
        return profiled(count).time(*costs, scale=nbytes / (count * itemsize))
    factor = count // unit  # elements of the call per element recorded
    if segment:  # segments scaled along, a whole number of elements each
        factor = max(1, min(factor, segment // itemsize))
        factor = 1 << (factor.bit_length() - 1)
    elements = max(1, round(count / factor))
    more = None
    if segment:
        scaled = max(1, segment // itemsize // factor) * itemsize
        whole = elements * itemsize  # one segment as big as everything: no segments at all
        if scaled >= whole or _segments_idle(collective, algorithm, p, elements, scaled,
                                             tuple(sorted(options.items()))):
            scaled = whole
        more = {"segment_bytes": scaled}
    return profiled(elements, more).time(*costs, scale=nbytes / (elements * itemsize))


@lru_cache(maxsize=512)
def _segments_idle(collective: str, algorithm: str, p: int, count: int, segment: int,
                   options: tuple[tuple[str, Any], ...]) -> bool:
    """Whether ``segment`` bytes a segment leave the messages of a few ranks (0, 1, p/2,
    p-1) as they are without segments: then one recording serves every such size."""
    chosen = {k: v for k, v in options if k != "segment_bytes"}
    for rank in sorted({0, 1 % p, p // 2, p - 1}):
        cut = program(collective, algorithm, rank, p, count, segment_bytes=segment, **chosen)
        whole = program(collective, algorithm, rank, p, count,
                        segment_bytes=count * ITEMSIZE, **chosen)
        if cut != whole:
            return False
    return True


# -- the table ---------------------------------------------------------------------------


def fitting_ranks(topology: Topology) -> list[int]:
    """The numbers of ranks the table shows: powers of two from 64 to 1024 that fit,
    and the whole topology where it has 1024 nodes or fewer."""
    ranks = [p for p in (64, 128, 256, 512, 1024) if p <= topology.nodes]
    if topology.nodes <= 1024 and topology.nodes not in ranks:
        ranks.append(topology.nodes)
    return ranks


def table(topology: Topology | str, params: Params | None = None, ranks: list[int] | None = None,
          sizes: tuple[int, ...] = SIZES, collective: str = "all_reduce",
          link_bandwidth: float | None = None, hop_latency: float = HOP_LATENCY,
          algorithms: list[str] | None = None) -> str:
    """Predicted microseconds of every registered algorithm of ``collective`` at each
    size, per number of ranks, the fastest per size marked ``*``, as text."""
    params = params or Params()
    topology = parse(topology) if isinstance(topology, str) else topology
    bandwidth = link_bandwidth or 1 / params.beta
    names = algorithms or list(REGISTRY[collective])
    gamma = f"{1 / params.gamma / 1e9:.2f} GB/s" if params.gamma else "none"
    lines = [f"# {collective} on {topology.describe()}; rank i on node i",
             f"# alpha {params.alpha * 1e6:.2f} us, {hop_latency * 1e6:.2f} us a hop, links "
             f"{bandwidth / 1e9:.2f} GB/s, reductions {gamma} (parameters: {params.source})",
             "# predicted time (us); * the fastest at a size (ties: each)"]
    for p in ranks or fitting_ranks(topology):
        times: dict[str, list[float] | str] = {}
        for name in names:
            try:
                times[name] = [predict(collective, name, n, p, topology, params, bandwidth,
                                       hop_latency) for n in sizes]
            except (ScheduleError, ValueError, TypeError) as exc:
                times[name] = f"not modelled: {exc}"
        timed = [t for t in times.values() if not isinstance(t, str)]
        best = [min(t[i] for t in timed) if timed else 0.0 for i in range(len(sizes))]
        lines.append(f"## {p} ranks")
        lines.append(f"  {'algorithm':<20}" + "".join(f"{_size(s):>12}" for s in sizes))
        for name, t in times.items():
            if isinstance(t, str):
                lines.append(f"  {name:<20}  {t}")
                continue
            cells = "".join(f"{v * 1e6:>11.1f}{'*' if v <= best[i] * (1 + 1e-9) else ' '}"
                            for i, v in enumerate(t))
            lines.append(f"  {name:<20}{cells}")
    return "\n".join(lines)

