"""Data-flow diagrams of the algorithms, drawn from the code that runs, not by hand.

    python -m mpicoll.viz all_reduce --algorithm ring -n 4 -o ring.png
    python -m mpicoll.viz broadcast --algorithm binomial -n 8 --ascii

The collective runs once, traced, on the local transport (every rank a thread of this
process), with a buffer of ``--chunks`` elements per rank-chunk. Every message becomes a
block on its sender's row in the column of its round (one more than the latest round the
sender had sent or received in before it: ring's steps, a tree's levels),
coloured by the chunk of the buffer it carries, with an arrow to the receiver's row:
ranks as rows, one column per step, as the tutorials draw ring and tree algorithms.
``--ascii`` prints the same, step by step, for the terminal.

Chunks are numbered as the textbook figures of the ring number them: chunk c is the c-th
of p equal parts of a rank's buffer, counted from 0, and a ring's reduce-scatter leaves
rank r holding chunk r reduced (the block ``reduce_scatter`` gives rank r), so at step 1
rank r sends chunk r - 1. Algorithms made of two phases (ring all_reduce: reduce-scatter,
then all-gather) have their phases labelled above the steps: the first phase is the steps
whose messages the receiver reduces, the second the steps that only pass results on.

``--ranks-per-node K`` runs it with ``MPICOLL_RANKS_PER_NODE=K`` (nodes of K consecutive
ranks, as the node-aware algorithms see them) and draws the node boundaries: a line
between the rows of two nodes, each row labelled with its node, and the messages that
cross a boundary drawn bold (``=>`` in ``--ascii``): the ones a slower network carries.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

import mpicoll
from mpicoll.local import run_local
from mpicoll.observe.tracing import algorithm_messages
from mpicoll.spec import SPECS

_ITEMS = np.dtype(np.float32)  # the traced call's data


def _run(comm: Any, collective: str, algorithm: str,
         per_chunk: int) -> tuple[int, list[dict[str, Any]]]:
    p, r = comm.size, comm.rank
    rows = np.arange(p * per_chunk, dtype=_ITEMS).reshape(p, per_chunk) + 100 * r
    flat = rows.reshape(-1)
    spec = SPECS[collective]  # the input by its role: rows, this rank's row, or flat
    x = rows if spec.input_rows else rows[0] if spec.result_rows else flat
    if spec.input_at_root_only and r != 0:  # a receiver: None, or a buffer to fill
        x = None if spec.input_rows else np.empty_like(x)
    given = {"algorithm": algorithm, **({"op": "sum"} if spec.reduces else {}),
             **({"root": 0} if spec.rooted else {})}
    if spec.name == "barrier":
        comm.barrier(**given)
    else:
        getattr(comm, collective)(x, **given)
    return comm.node, list(comm.trace_events())  # (its node as the run agreed it)


def rounds(per_rank: list[list[dict[str, Any]]]) -> dict[int, int]:
    """The round of every send (by ``id`` of its event): one more than the latest round
    this rank has sent in or received from before it. So ring's steps, and a tree's
    levels: a rank forwards in the round after the one it received in. The k-th message
    from s to d is the k-th that d receives from s (messages of a pair keep their order)."""
    sends = {id(e): 1 for events in per_rank for e in events if e["kind"] == "send"}
    by_pair: dict[tuple[int, int], list[dict]] = {}
    for events in per_rank:
        for e in events:
            if e["kind"] == "send":
                by_pair.setdefault((e["rank"], e["peer"]), []).append(e)
    for _ in range(len(sends) + 1):  # each pass settles at least one more round
        changed = False
        for events in per_rank:
            level, seen = 0, {}
            for e in events:
                if e["kind"] == "recv":
                    k = seen.get(e["peer"], 0)
                    seen[e["peer"]] = k + 1
                    pair = by_pair.get((e["peer"], e["rank"]), [])
                    if k < len(pair):
                        level = max(level, sends[id(pair[k])])
                elif e["kind"] == "send":
                    if sends[id(e)] != level + 1:
                        sends[id(e)], changed = level + 1, True
                    level += 1
        if not changed:
            break
    return sends


Steps = list[list[tuple[int, int, int | None, int]]]

# algorithms made of two phases, named as the tutorials name them
PHASES: dict[tuple[str, str], tuple[str, str]] = {
    ("all_reduce", "ring"): ("reduce-scatter", "all-gather"),
    ("all_reduce", "ring_pipelined"): ("reduce-scatter", "all-gather"),
    ("all_reduce", "rabenseifner"): ("reduce-scatter", "all-gather"),
    ("all_reduce", "swing_bandwidth"): ("reduce-scatter", "all-gather"),
    ("all_reduce", "bine_bandwidth"): ("reduce-scatter", "all-gather"),
    ("all_reduce", "reduce_broadcast"): ("reduce", "broadcast"),
}


@dataclass
class Flow:
    """The messages of one call, by round, and what the trace says about each round."""

    steps: Steps  # steps[k] = [(sender, receiver, chunk, bytes)], sorted
    reduces: list[bool]  # steps[k]: some receiver reduces what it got in this round
    holds: dict[int, int | None]  # rank -> the chunk of its last reduced receive
    nodes: tuple[int, ...] = ()  # rank -> its node, as the traced run's Communicators saw it

    def phases(self, collective: str, algorithm: str) -> list[tuple[str, int, int]]:
        """(name, first step, last step), steps from 1, of a two-phase algorithm: the
        steps up to the last that reduces, then the rest; [] for any other."""
        names = PHASES.get((collective, algorithm))
        if not names or not any(self.reduces):
            return []
        last = max(k for k, reduces in enumerate(self.reduces) if reduces) + 1
        found = [(names[0], 1, last)]
        if last < len(self.steps):
            found.append((names[1], last + 1, len(self.steps)))
        return found

    def owner_note(self) -> str:
        """'rank r holds chunk r reduced', when the first phase leaves every rank so."""
        if self.holds and all(chunk == rank for rank, chunk in self.holds.items()):
            return "then rank r holds chunk r reduced"
        return ""


@contextlib.contextmanager
def _ranks_per_node(k: int | None) -> Any:
    """``MPICOLL_RANKS_PER_NODE=k`` while the traced run makes its Communicators."""
    before = os.environ.get("MPICOLL_RANKS_PER_NODE")
    if k is not None:
        os.environ["MPICOLL_RANKS_PER_NODE"] = str(k)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MPICOLL_RANKS_PER_NODE", None)
        else:
            os.environ["MPICOLL_RANKS_PER_NODE"] = before


def _follow_workspace(per_rank: list[list[dict[str, Any]]], chunk_bytes: int) -> None:
    """Name the chunk of each message in a rank's workspace (the tracer names none there:
    chunk None, ``offset`` its place in the workspace), by following the data: a receive
    carries its sender's message's chunk; a reduction into the workspace, the chunk of an
    operand that has one; a send from bytes an earlier receive or reduction of the rank
    wrote carries the chunk at its place there (chunks of ``chunk_bytes``). What the rank
    copied into its workspace itself stays unnamed."""
    sends: dict[tuple[int, int], list[dict]] = {}
    recvs: dict[tuple[int, int], list[dict]] = {}
    for events in per_rank:
        for e in events:
            if e["kind"] != "reduce":
                pair = (e["rank"], e["peer"]) if e["kind"] == "send" else (e["peer"], e["rank"])
                (sends if e["kind"] == "send" else recvs).setdefault(pair, []).append(e)
    # the k-th message from s to d is the k-th that d receives from s
    sender = {id(r): s for pair, rs in recvs.items()
              for r, s in zip(rs, sends.get(pair, []), strict=False)}
    unnamed = {id(e) for events in per_rank for e in events
               if e["kind"] != "reduce" and e["chunk"] is None}

    def written(landed: dict, lo: int, hi: int) -> int | None:
        """The chunk at lo..hi of what the rank last wrote there."""
        return next((c + (lo - a) // chunk_bytes for (a, b), c in reversed(landed.items())
                     if c is not None and a <= lo and hi <= b
                     and (lo - a) % chunk_bytes == 0), None)

    def write(landed: dict, lo: int, hi: int, chunk: int | None) -> None:
        for place in [p for p in landed if p[0] < hi and lo < p[1]]:
            del landed[place]  # overwritten
        if hi > lo:
            landed[(lo, hi)] = chunk

    for _ in range(len(unnamed) + 1):  # each pass names at least one more, or none is left
        changed = False
        for events in per_rank:
            landed: dict[tuple[int, int], int | None] = {}  # (offset, end): its chunk
            for e in events:
                lo = e["offset"]
                if e["kind"] == "reduce":
                    if e["chunk"] is None and e.get("sources"):
                        hi = lo + e["bytes"]
                        named = [c if c is not None else written(landed, o, o + e["bytes"])
                                 for c, o in e["sources"]]
                        write(landed, lo, hi, next((c for c in named if c is not None), None))
                    continue
                if id(e) not in unnamed:
                    continue
                hi = lo + e["bytes"]
                if e["kind"] == "recv":
                    chunk = sender[id(e)]["chunk"] if id(e) in sender else None
                    write(landed, lo, hi, chunk)
                else:
                    chunk = written(landed, lo, hi)
                if chunk != e["chunk"]:
                    e["chunk"], changed = chunk, True
        if not changed:
            return


def trace_flow(collective: str, algorithm: str, ranks: int, per_chunk: int = 4,
               ranks_per_node: int | None = None) -> Flow:
    """Run the call once, traced, on the local transport (with nodes of
    ``ranks_per_node`` consecutive ranks when given); its messages by round."""
    if collective not in mpicoll.COLLECTIVES:
        raise mpicoll.InvalidArgumentError(f"collective: unknown collective {collective!r}")
    if algorithm not in mpicoll.algorithms(collective, "local"):
        raise mpicoll.InvalidArgumentError(
            f"algorithm: {collective} has no algorithm {algorithm!r} to draw; choose from "
            f"{', '.join(mpicoll.algorithms(collective, 'local'))}")
    with _ranks_per_node(ranks_per_node):
        ran = run_local(ranks, _run, collective, algorithm, per_chunk, timeout=30, trace=True)
    nodes, traced = tuple(node for node, _ in ran), [events for _, events in ran]
    # the algorithm's messages alone (not the header packet's where the data went apart
    # from it; never mpicoll's agreements), as the tutorials draw it
    drawn = {id(e) for e in algorithm_messages([e for events in traced for e in events])}
    traced = [[e for e in events if e["kind"] not in ("send", "recv") or id(e) in drawn]
              for events in traced]
    _follow_workspace([[e for e in events if e["kind"] in ("send", "recv", "reduce")]
                       for events in traced], per_chunk * _ITEMS.itemsize)
    # a receive is reduced when the rank's next event after it is a reduction
    reduced: set[int] = set()
    holds: dict[int, int | None] = {}
    for rank, events in enumerate(traced):
        events = [e for e in events if e["kind"] in ("send", "recv", "reduce")]
        for e, after in zip(events, events[1:], strict=False):
            if e["kind"] == "recv" and after["kind"] == "reduce":
                reduced.add(id(e))
                holds[rank] = e["chunk"]
    per_rank = [[e for e in events if e["kind"] in ("send", "recv")] for events in traced]
    round_of = rounds(per_rank)
    count = max(round_of.values(), default=0)
    steps: Steps = [[] for _ in range(count)]
    reduces = [False] * count
    # the k-th message from s to d is the k-th that d receives from s
    received: dict[tuple[int, int], list[dict]] = {}
    for events in per_rank:
        for e in events:
            if e["kind"] == "recv":
                received.setdefault((e["peer"], e["rank"]), []).append(e)
    sent: dict[tuple[int, int], int] = {}
    for events in per_rank:
        for e in events:
            if e["kind"] != "send":
                continue
            k = round_of[id(e)] - 1
            steps[k].append((e["rank"], e["peer"], e["chunk"], e["bytes"]))
            pair = (e["rank"], e["peer"])
            index = sent[pair] = sent.get(pair, -1) + 1
            matches = received.get(pair, [])
            if index < len(matches) and id(matches[index]) in reduced:
                reduces[k] = True
    return Flow([sorted(messages) for messages in steps], reduces, holds, nodes)


def flow(collective: str, algorithm: str, ranks: int, per_chunk: int = 4) -> Steps:
    """The messages of one call, by round: steps[k] = [(sender, receiver, chunk, bytes)]."""
    return trace_flow(collective, algorithm, ranks, per_chunk).steps


CHUNKS = "chunk c = the c-th of p equal parts of a rank's buffer, from 0"


def _phase_title(name: str, first: int, last: int, note: str, sep: str = ", ") -> str:
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    return f"{name}, {steps}{sep + note if note else ''}"


def ascii_diagram(collective: str, algorithm: str, ranks: int, steps: Steps,
                  phases: list[tuple[str, int, int]] = (), note: str = "",
                  nodes: tuple[int, ...] = ()) -> str:
    """The steps as text; ``phases`` (name, first, last step) head their steps, and
    ``note`` follows the first phase's name; with ``nodes`` (each rank's node), a message
    between two nodes is ``=>``."""
    nodes = nodes or (0,) * ranks
    lines = [f"{collective} {algorithm}, {ranks} rank(s), {len(steps)} step(s): "
             f"sender->receiver [chunk] bytes; {CHUNKS}"]
    if len(set(nodes)) > 1:
        members = [[r for r in range(ranks) if nodes[r] == n] for n in sorted(set(nodes))]
        lines.append("nodes: " + " | ".join(f"node {n}: ranks {m[0]}-{m[-1]}"
                                              for n, m in enumerate(members))
                     + "; => crosses nodes")
    starts = {first: (name, first, last) for name, first, last in phases}
    for k, messages in enumerate(steps):
        if k + 1 in starts:
            name, first, last = starts[k + 1]
            lines.append(_phase_title(name, first, last, note if first == 1 else ""))
        cells = "  ".join(f"{s}{'=>' if nodes[s] != nodes[d] else '->'}{d} "
                          f"[{'-' if c is None else c}] {b}" for s, d, c, b in messages)
        lines.append(f"step {k + 1:>2}: {cells}")
    return "\n".join(lines)


def diagram(collective: str, algorithm: str, ranks: int, steps: Steps,
            phases: list[tuple[str, int, int]] = (), note: str = "",
            nodes: tuple[int, ...] = ()) -> Any:
    """The diagram as a matplotlib Figure: ranks as rows, one column per step, a block per
    message coloured by its chunk with an arrow to the receiver; ``phases`` bracketed and
    named above their steps, ``note`` under the first phase's name; with ``nodes`` (each
    rank's node), a line between nodes and the messages that cross it bold."""
    nodes = nodes or (0,) * ranks
    several = len(set(nodes)) > 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    colors = plt.get_cmap("tab10")
    top = -1.3 if phases else -0.5  # room above rank 0 for the phases' brackets
    fig, ax = plt.subplots(figsize=(1.6 + max(1.3 * len(steps), 5.2),
                                    1.2 + 0.7 * ranks + (0.6 if phases else 0)))
    for k, messages in enumerate(steps):
        for sender, receiver, chunk, _nbytes in messages:
            color = colors((chunk or 0) % 10)
            ax.add_patch(Rectangle((k + 0.05, sender - 0.3), 0.4, 0.6, color=color))
            ax.text(k + 0.25, sender, "" if chunk is None else str(chunk), ha="center",
                    va="center", fontsize=8, color="white")
            crosses = nodes[sender] != nodes[receiver]
            ax.add_patch(FancyArrowPatch((k + 0.45, sender), (k + 0.95, receiver),
                                         arrowstyle="-|>", mutation_scale=10, color=color,
                                         linewidth=2.6 if crosses else 1.2))
    ax.set_xlim(0, max(len(steps), 1))
    ax.set_ylim(ranks - 0.5, top)
    ax.set_xticks([k + 0.5 for k in range(len(steps))], [f"step {k + 1}" for k in range(len(steps))])
    ax.set_yticks(range(ranks), [f"rank {r}" + (f" (node {nodes[r]})" if several else "")
                                 for r in range(ranks)])
    for r in range(1, ranks):
        if nodes[r] != nodes[r - 1]:  # a node boundary: the slower network lies across it
            ax.axhline(r - 0.5, color="0.2", linewidth=1.6)
    bounds = {first - 1 for _, first, _ in phases[1:]}
    for k in range(1, len(steps)):
        if k in bounds:  # between phases: a firm line
            ax.axvline(k, color="0.3", linewidth=1.2, linestyle="--")
        else:  # between steps: a light one, below the brackets
            ax.vlines(k, ranks - 0.5, -0.5, color="0.85", linewidth=0.8)
    for name, first, last in phases:
        left, right = first - 1 + 0.08, last - 0.08
        ax.plot([left, left, right, right], [-0.55, -0.65, -0.65, -0.55], color="0.25",
                linewidth=1)
        ax.text((left + right) / 2, -0.72, _phase_title(name, first, last,
                                                        note if first == 1 else "", "\n"),
                ha="center", va="bottom", fontsize=8, linespacing=1.1)
    ax.set_title(f"{collective} {algorithm}, {ranks} ranks: a block is a message, its number "
                 f"the chunk it carries\n({CHUNKS})", fontsize=9)
    fig.tight_layout()
    return fig


def draw(collective: str, algorithm: str, ranks: int, steps: Steps, path: str,
         phases: list[tuple[str, int, int]] = (), note: str = "",
         nodes: tuple[int, ...] = ()) -> None:
    """The diagram (see ``diagram``) as a PNG."""
    import matplotlib.pyplot as plt

    fig = diagram(collective, algorithm, ranks, steps, phases, note, nodes)
    fig.savefig(path, dpi=110)
    plt.close(fig)


MAX_RANKS = 256  # viz -n: the most ranks a diagram is traced on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.viz",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("collective", choices=mpicoll.COLLECTIVES)
    parser.add_argument("--algorithm", required=True)
    parser.add_argument("-n", "--ranks", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=4, help="elements per rank-chunk")
    parser.add_argument("-o", "--output", help="the PNG to write")
    parser.add_argument("--ascii", action="store_true", help="print the steps instead")
    parser.add_argument("--ranks-per-node", type=int, default=None, metavar="K",
                        help="nodes of K consecutive ranks (MPICOLL_RANKS_PER_NODE): drawn")
    args = parser.parse_args(argv)
    if not 1 <= args.ranks <= MAX_RANKS:  # (each rank a thread of run_local: 128 take
        parser.error(f"-n: 1 to {MAX_RANKS} ranks")  # some 5 s, 500 over a minute)
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        parser.error("--ranks-per-node: at least 1")
    if args.chunks < 1:
        parser.error("--chunks: at least 1 element per rank-chunk")
    if not args.ascii and not args.output:
        parser.error("give -o FILE.png, or --ascii")
    if args.output:
        from mpicoll.bench.report import figure_path

        given = args.output
        args.output, problem = figure_path(given)
        if problem:
            parser.error(f"-o {given}: {problem}")
    try:
        traced = trace_flow(args.collective, args.algorithm, args.ranks, args.chunks,
                            args.ranks_per_node)
    except mpicoll.MpicollError as exc:  # (a bad argument, or setting: MPICOLL_TUNING's)
        parser.error(str(exc))
    steps, phases = traced.steps, traced.phases(args.collective, args.algorithm)
    note, nodes = traced.owner_note(), traced.nodes  # (--ranks-per-node, else the
    #                                                    environment's MPICOLL_RANKS_PER_NODE)
    if args.ascii:
        print(ascii_diagram(args.collective, args.algorithm, args.ranks, steps, phases, note,
                            nodes))
    if args.output:
        try:
            draw(args.collective, args.algorithm, args.ranks, steps, args.output, phases,
                 note, nodes)
        except OSError as exc:  # (a place that refuses the file only when written)
            print(f"{parser.prog}: -o {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.output} ({len(steps)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
