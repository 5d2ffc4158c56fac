"""The topology model (mpicoll.model.topology): routes and link loads against hand
counts, the recorded schedules against traced local runs, the flat model where nothing
contends, the Swing paper's claims, and ``python -m mpicoll.model table --topology``."""

from __future__ import annotations

import runpy
import sys
import threading
from array import array

import numpy as np
import pytest

from mpicoll.algorithms import REGISTRY
from mpicoll.local import run_local
from mpicoll.model import Params
from mpicoll.model import predict as flat_predict
from mpicoll.model import topology as T
from mpicoll.observe.tracing import Tracer, TracingTransport
from mpicoll.ops import resolve_op
from mpicoll.transport.local import LocalWorld

# the Swing paper's network (NSDI 2024, Sec. 5): 400 Gb/s links, 100 ns a link and 300 ns
# a router; alpha 0.5 us (chosen here), reductions not modelled
PAPER = Params(alpha=0.5e-6, beta=1 / 50e9, gamma=0.0, source="Swing paper")
PAPER_HOP = 0.4e-6


def schedule_of(messages: list[tuple[int, int, int, int]], ranks: int) -> T.Schedule:
    """A schedule of (round, source, dest, bytes) messages, no reductions."""
    m = np.array(messages, np.int64).reshape(-1, 4)
    none = np.zeros(0, np.int64)
    return T.Schedule("all_to_all", "by hand", ranks, 0, 1, m[:, 0], m[:, 1], m[:, 2], m[:, 3],
                      m[:, 2], m[:, 1], m[:, 3], none, none, none)


def test_specs_parse_and_bad_ones_are_named():
    torus = T.parse("torus:4x4x2")
    assert (torus.nodes, torus.links) == (32, 32 * 6)
    fat = T.parse("fattree:4,2")
    assert fat.nodes == 16 and fat.scale.min() == 0.5 and fat.scale.max() == 1.0
    fly = T.parse("dragonfly:5,2,2")
    assert fly.nodes == 20
    for bad in ("torus:8x", "torus:0x4", "fattree:5", "fattree:4,0.5", "dragonfly:3,2", "mesh:4"):
        with pytest.raises(ValueError, match="topology"):
            T.parse(bad)


def test_ring_on_a_2x2_torus_by_hand():
    """4 ranks, ring all_reduce: 6 rounds, each rank sending b = n/4 to the next. On a
    2x2 torus every step is a tie (both ways are one hop), so each message splits in
    halves: 0->1 and 2->3 one hop, 1->2 and 3->0 two hops (one per dimension). Link
    (node, dim, +/-) ids are node*4 + 2*dim + (0 for +, 1 for -)."""
    n = 4 * 1024 * 4  # 4096 floats
    b = n // 4
    schedule = T.record("all_reduce", "ring", 4, n // 4)
    assert schedule.rounds == 6
    assert all(schedule.sends(r) == [((r + 1) % 4, b)] * 6 for r in range(4))
    torus = T.parse("torus:2x2")

    def link(node, dim, sign):
        return node * 4 + 2 * dim + (0 if sign > 0 else 1)

    hand = np.zeros(16)
    for node, dim in ((0, 1), (1, 0), (3, 1),  # 0->1; 1->2 via node 3
                      (2, 1), (3, 0), (1, 1)):  # 2->3; 3->0 via node 1
        for sign in (1, -1):
            hand[link(node, dim, sign)] += b / 2
    loads = T.link_loads(schedule, torus)
    assert all(np.array_equal(loads[r], hand) for r in range(6))
    assert torus.hops(np.arange(4), np.array([1, 2, 3, 0])).tolist() == [1, 2, 1, 2]
    alpha, hop, bandwidth, gamma = 2e-6, 3e-7, 1e9, 1 / 2e9
    # every round: alpha, 2 hops, b/2 on the busiest link; reduce-scatter rounds add b
    expected = 6 * (alpha + 2 * hop + b / 2 / bandwidth) + 3 * b * gamma
    params = Params(alpha=alpha, beta=1 / bandwidth, gamma=gamma)
    assert T.predict("all_reduce", "ring", n, 4, torus, params, hop_latency=hop) == \
        pytest.approx(expected, rel=1e-12)


def test_recursive_doubling_on_a_4x4_torus_by_hand():
    """Ranks 0..3 on the first row: step 1 pairs 0-1 and 2-3 (one hop each way), step 2
    pairs 0-2 and 1-3, two hops either way round, so each message halves over both; the
    busiest link then carries two halves (0->2's and 3->1's), n in all."""
    n = 4096
    params = Params(alpha=1e-6, beta=1 / 2e9, gamma=1 / 8e9)
    expected = 2 * params.alpha + (1 + 2) * 1e-7 + 2 * n * params.beta + 2 * n * params.gamma
    assert T.predict("all_reduce", "recursive_doubling", n, 4, "torus:4x4", params,
                     hop_latency=1e-7) == pytest.approx(expected, rel=1e-12)
    loads = T.link_loads(T.record("all_reduce", "recursive_doubling", 4, n // 4), T.parse("torus:4x4"))
    assert loads[0].max() == n and loads[1].max() == n and loads[1].sum() == 4 * n * 2


def test_fat_tree_and_dragonfly_routes_by_hand():
    """fattree:4 (16 hosts, 2 a switch, 4 pods): host 0 to host 15 goes up through
    aggregation switch 15 mod 2 = 1 and core (1, 15 div 2 mod 2 = 1), down through pod
    3's aggregation switch 1 to edge switch 7. dragonfly:3,2,1: node 0 (group 0, router
    0) to node 5 (group 2, router 1) leaves group 0 on router (2-0-1) mod 3 mod 2 = 1 and
    enters group 2 on router (0-2-1) mod 3 mod 2 = 0."""
    fat = T.parse("fattree:4")
    b = fat.base
    _, link, _ = fat.paths(np.array([0]), np.array([15]))
    assert link.tolist() == [b[0] + 0, b[2] + 0 * 2 + 1, b[4] + (0 * 2 + 1) * 2 + 1,
                             b[5] + (1 * 2 + 1) * 4 + 3, b[3] + (3 * 2 + 1) * 2 + 1, b[1] + 15]
    assert fat.hops(np.array([0, 0, 0, 0]), np.array([0, 1, 2, 15])).tolist() == [0, 2, 4, 6]
    fly = T.parse("dragonfly:3,2,1")
    _, link, _ = fly.paths(np.array([0]), np.array([5]))
    local = fly.local_base
    assert link.tolist() == [0, local + (0 * 2 + 0) * 2 + 1, fly.global_base + 0 * 3 + 2,
                             local + (2 * 2 + 0) * 2 + 1, 6 + 5]


@pytest.mark.parametrize("spec", ["torus:4x4x2", "torus:5x3", "torus:6", "fattree:4",
                                  "fattree:4,2", "dragonfly:5,2,2", "dragonfly:3,3,1"])
def test_routes_conserve_bytes(spec):
    """Every message's shares add up to one per hop it makes, so the bytes on all links
    are each message's bytes times its hops, round by round."""
    topology = T.parse(spec)
    rng = np.random.default_rng(7)
    p = topology.nodes
    messages = [(int(rng.integers(3)), int(rng.integers(p)), int(rng.integers(p)),
                 int(rng.integers(1, 1000))) for _ in range(300)]
    schedule = schedule_of(messages, p)
    which, link, share = topology.paths(schedule.source, schedule.dest)
    assert ((link >= 0) & (link < topology.links)).all()
    hops = topology.hops(schedule.source, schedule.dest)
    assert np.allclose(np.bincount(which, weights=share, minlength=len(messages)), hops)
    loads = T.link_loads(schedule, topology)
    for r in range(3):
        mine = schedule.round == r
        assert loads[r].sum() == pytest.approx((schedule.nbytes[mine] * hops[mine]).sum())


def _traced_run(collective: str, algorithm: str, p: int, count: int):
    """Each rank's (sends, receives) of the algorithm run for real: p threads over a
    LocalWorld, every message traced, buffers as ``record`` lays them out."""
    world = LocalWorld(p, timeout=30)
    dtype = np.dtype(np.float32)
    results: list = [None] * p
    failures: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            tracer = Tracer(rank, p)
            t = TracingTransport(world.endpoint(rank), tracer)
            t.begin()
            tracer.begin_call(collective)
            T._call(collective, algorithm, t, count, dtype, resolve_op("sum", dtype), {})
            tracer.end_call()
            results[rank] = _messages(tracer.events)
        except BaseException as exc:  # noqa: BLE001 - raised below
            failures.append(exc)
            world.aborted.set()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(p)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return results


def _messages(events):
    mine = [e for e in events if e["kind"] in ("send", "recv")]
    return ([(e["peer"], e["bytes"]) for e in mine if e["kind"] == "send"],
            [(e["peer"], e["bytes"]) for e in mine if e["kind"] == "recv"])


CASES = [(c, a) for c in REGISTRY for a in REGISTRY[c]]


@pytest.mark.parametrize("collective,algorithm", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_recorded_schedule_is_the_traced_local_run(collective, algorithm):
    """The dry run sends, rank by rank and in order, the messages a real run does."""
    p, count = 5, 37  # uneven blocks
    schedule = T.record(collective, algorithm, p, count)
    for rank, (sends, receives) in enumerate(_traced_run(collective, algorithm, p, count)):
        assert schedule.sends(rank) == sends, rank
        assert schedule.receives(rank) == receives, rank


@pytest.mark.parametrize("algorithm", list(REGISTRY["all_reduce"]))
def test_recorded_all_reduce_is_a_communicators_traced_call(algorithm):
    """The same through the public API: comm.all_reduce(x, algorithm=...), traced."""
    def body(comm):
        comm.all_reduce(np.arange(37, dtype=np.float32), algorithm=algorithm)
        return _messages([e for e in comm.trace_events() if e["collective"] == "all_reduce"])

    schedule = T.record("all_reduce", algorithm, 6, 37)
    for rank, (sends, receives) in enumerate(run_local(6, body, trace=True, timeout=30)):
        assert schedule.sends(rank) == sends, rank
        assert schedule.receives(rank) == receives, rank


def test_rounds_of_a_binomial_broadcast():
    """A blocking send takes its round; a rank forwards in the round after it received."""
    schedule = T.record("broadcast", "binomial", 8, 8)
    assert schedule.rounds == 3
    assert np.bincount(schedule.round).tolist() == [1, 2, 4]


def test_schedules_that_cannot_run_are_refused():
    recv_first = [array("q", [T._RECV, 1, 8, T._SEND, 1, 8]), array("q", [T._RECV, 0, 8, T._SEND, 0, 8])]
    with pytest.raises(T.ScheduleError, match="deadlocks"):
        T._rounds("all_reduce", "by hand", 2, 2, 4, recv_first)
    sizes = [array("q", [T._SEND, 1, 8]), array("q", [T._RECV, 0, 16])]
    with pytest.raises(T.ScheduleError, match="sends 8 bytes where rank 1 receives 16"):
        T._rounds("all_reduce", "by hand", 2, 2, 4, sizes)
    unmatched = [array("q", [T._SEND, 1, 8, T._SEND, 1, 8]), array("q", [T._RECV, 0, 8])]
    with pytest.raises(T.ScheduleError, match="sends 2 message"):
        T._rounds("all_reduce", "by hand", 2, 2, 4, unmatched)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner",
                                       "swing_bandwidth"])
def test_no_contention_is_the_flat_model(algorithm):
    """On a full-bisection fat tree with no hop latency nothing contends: the flat
    model's cost line, exactly."""
    params = Params()
    for nbytes in (1 << 16, 1 << 24):
        topology = T.predict("all_reduce", algorithm, nbytes, 64, "fattree:8", params,
                             hop_latency=0.0)
        assert topology == pytest.approx(flat_predict("all_reduce", algorithm, nbytes, 64, params),
                                         rel=1e-9)


def test_swing_beats_recursive_doubling_on_a_large_torus_for_large_messages():
    """The paper's claim (Fig. 6, 7): for megabytes on a 2-D torus Swing's near peers
    beat recursive doubling, whole vectors (latency-optimal) or halves (Rabenseifner)."""
    for nbytes in (2 << 20, 32 << 20):
        times = {name: T.predict("all_reduce", name, nbytes, 256, "torus:16x16", PAPER,
                                 hop_latency=PAPER_HOP)
                 for name in ("swing_bandwidth", "recursive_doubling", "rabenseifner")}
        assert times["swing_bandwidth"] < times["rabenseifner"] / 1.5
        assert times["swing_bandwidth"] < times["recursive_doubling"] / 5


@pytest.mark.parametrize("spec,paper_us", [("torus:8x8", 8.7), ("torus:8x8x8", 13),
                                           ("torus:64x16", 36)])
def test_recursive_doubling_latency_is_the_papers(spec, paper_us):
    """32 B all_reduce by recursive doubling: the paper's simulated times (Fig. 6, 10,
    11) within 3%: its hops add up, dimension by dimension, as ours do."""
    topology = T.parse(spec)
    t = T.predict("all_reduce", "recursive_doubling", 32, topology.nodes, topology, PAPER,
                  hop_latency=PAPER_HOP)
    assert t * 1e6 == pytest.approx(paper_us, rel=0.03)


def test_swing_latency_beats_recursive_doubling_on_a_narrow_torus():
    """256x4 (Fig. 10c): the paper's 32 B times are Swing 74 us, recursive doubling
    109 us; ranks in row-major order on a narrow torus are nearly a ring, where
    mpicoll's Swing (the 1-D one) keeps its peers near as well."""
    times = {name: T.predict("all_reduce", name, 32, 1024, "torus:256x4", PAPER,
                             hop_latency=PAPER_HOP) for name in ("swing_latency", "recursive_doubling")}
    assert times["swing_latency"] < 0.8 * times["recursive_doubling"]


def test_ranks_must_fit():
    with pytest.raises(ValueError, match="do not fit"):
        T.predict("all_reduce", "ring", 64, 17, "torus:4x4")


def _cli(monkeypatch, capsys, *argv):
    monkeypatch.setattr(sys, "argv", ["python -m mpicoll.model", *argv])
    with pytest.raises(SystemExit) as done:
        runpy.run_module("mpicoll.model", run_name="__main__")
    return done.value.code, capsys.readouterr()


def test_cli_prints_the_table(monkeypatch, capsys):
    code, out = _cli(monkeypatch, capsys, "table", "--topology", "torus:4x4", "--alpha", "0.5",
                     "--hop-latency", "0.4", "--link-bandwidth", "50", "--reduce-bandwidth", "0")
    assert code == 0
    assert "torus:4x4 (16 nodes" in out.out and "## 16 ranks" in out.out
    rows = [line.split() for line in out.out.splitlines() if line.startswith("  ")]
    assert rows[0][:3] == ["algorithm", "32B", "128B"] and rows[0][-1] == "128M"
    names = [row[0] for row in rows[1:]]
    assert names == list(REGISTRY["all_reduce"])
    for column in range(1, 13):  # a fastest marked at every size
        assert any(row[column].endswith("*") for row in rows[1:])


def test_alpha_and_reduce_bandwidth_shape_the_plain_table_too(monkeypatch, capsys, tmp_path):
    """--alpha and --reduce-bandwidth without --topology: the plain table's parameters
    (as with it), checked alike; never taken and ignored."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    tables = {}
    for flags in ((), ("--alpha", "100"), ("--reduce-bandwidth", "0.001")):
        code, out = _cli(monkeypatch, capsys, "table", "-p", "8", *flags)
        assert code == 0, out.err
        tables[flags] = [line for line in out.out.splitlines() if not line.startswith("#")]
    assert len({tuple(rows) for rows in tables.values()}) == 3, "a flag changed no figure"
    code, out = _cli(monkeypatch, capsys, "table", "--alpha", "-5")
    assert code == 2 and "--alpha: must be a number >= 0" in out.err


def test_cli_refuses_bad_topologies(monkeypatch, capsys):
    code, out = _cli(monkeypatch, capsys, "table", "--topology", "torus:4y4")
    assert code == 2 and "--topology" in out.err
    code, out = _cli(monkeypatch, capsys, "table", "--topology", "torus:4x4", "-p", "32")
    assert code == 2 and "do not fit" in out.err
