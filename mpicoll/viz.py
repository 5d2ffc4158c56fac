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
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

import mpicoll
from mpicoll.local import run_local


def _run(comm: Any, collective: str, algorithm: str, per_chunk: int) -> list[dict[str, Any]]:
    p, r = comm.size, comm.rank
    rows = np.arange(p * per_chunk, dtype=np.float32).reshape(p, per_chunk) + 100 * r
    flat = rows.reshape(-1)
    calls = {
        "broadcast": lambda: comm.broadcast(flat if r == 0 else np.empty_like(flat), 0,
                                            algorithm=algorithm),
        "scatter": lambda: comm.scatter(rows if r == 0 else None, 0, algorithm=algorithm),
        "gather": lambda: comm.gather(rows[0], 0, algorithm=algorithm),
        "all_gather": lambda: comm.all_gather(rows[0], algorithm=algorithm),
        "reduce": lambda: comm.reduce(flat, "sum", 0, algorithm=algorithm),
        "all_reduce": lambda: comm.all_reduce(flat, "sum", algorithm=algorithm),
        "reduce_scatter": lambda: comm.reduce_scatter(rows, "sum", algorithm=algorithm),
        "all_to_all": lambda: comm.all_to_all(rows, algorithm=algorithm),
        "barrier": lambda: comm.barrier(algorithm=algorithm),
    }
    calls[collective]()
    return list(comm.trace_events())


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


def flow(collective: str, algorithm: str, ranks: int, per_chunk: int = 4
         ) -> list[list[tuple[int, int, int | None, int]]]:
    """The messages of one call, by round: steps[k] = [(sender, receiver, chunk, bytes)]."""
    if collective not in mpicoll.COLLECTIVES:
        raise mpicoll.InvalidArgumentError(f"collective: unknown collective {collective!r}")
    if algorithm not in mpicoll.algorithms(collective, "local"):
        raise mpicoll.InvalidArgumentError(
            f"algorithm: {collective} has no algorithm {algorithm!r} to draw; choose from "
            f"{', '.join(mpicoll.algorithms(collective, 'local'))}")
    per_rank = run_local(ranks, _run, collective, algorithm, per_chunk, timeout=30, trace=True)
    per_rank = [[e for e in events if e["kind"] in ("send", "recv")] for events in per_rank]
    round_of = rounds(per_rank)
    steps: list[list[tuple[int, int, int | None, int]]] = [
        [] for _ in range(max(round_of.values(), default=0))]
    for events in per_rank:
        for e in events:
            if e["kind"] == "send":
                steps[round_of[id(e)] - 1].append((e["rank"], e["peer"], e["chunk"], e["bytes"]))
    return [sorted(messages) for messages in steps]


def ascii_diagram(collective: str, algorithm: str, ranks: int,
                  steps: list[list[tuple[int, int, int | None, int]]]) -> str:
    lines = [f"{collective} {algorithm}, {ranks} rank(s), {len(steps)} step(s): "
             "sender->receiver [chunk] bytes"]
    for k, messages in enumerate(steps):
        cells = "  ".join(f"{s}->{d} [{'-' if c is None else c}] {b}" for s, d, c, b in messages)
        lines.append(f"step {k + 1:>2}: {cells}")
    return "\n".join(lines)


def draw(collective: str, algorithm: str, ranks: int,
         steps: list[list[tuple[int, int, int | None, int]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * max(len(steps), 1), 0.8 + 0.7 * ranks))
    for k, messages in enumerate(steps):
        for sender, receiver, chunk, _nbytes in messages:
            color = colors((chunk or 0) % 10)
            ax.add_patch(Rectangle((k + 0.05, sender - 0.3), 0.4, 0.6, color=color))
            ax.text(k + 0.25, sender, "" if chunk is None else str(chunk), ha="center",
                    va="center", fontsize=8, color="white")
            ax.add_patch(FancyArrowPatch((k + 0.45, sender), (k + 0.95, receiver),
                                         arrowstyle="-|>", mutation_scale=10, color=color,
                                         linewidth=1.2))
    ax.set_xlim(0, max(len(steps), 1))
    ax.set_ylim(ranks - 0.5, -0.5)
    ax.set_xticks([k + 0.5 for k in range(len(steps))], [f"step {k + 1}" for k in range(len(steps))])
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    for k in range(1, len(steps)):
        ax.axvline(k, color="0.85", linewidth=0.8)
    ax.set_title(f"{collective} {algorithm}, {ranks} ranks: a block is a message, its number "
                 "the chunk it carries", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.viz",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("collective", choices=mpicoll.COLLECTIVES)
    parser.add_argument("--algorithm", required=True)
    parser.add_argument("-n", "--ranks", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=4, help="elements per rank-chunk")
    parser.add_argument("-o", "--output", help="the PNG to write")
    parser.add_argument("--ascii", action="store_true", help="print the steps instead")
    args = parser.parse_args(argv)
    if args.ranks < 1:
        parser.error("-n: at least 1 rank")
    if not args.ascii and not args.output:
        parser.error("give -o FILE.png, or --ascii")
    try:
        steps = flow(args.collective, args.algorithm, args.ranks, args.chunks)
    except mpicoll.InvalidArgumentError as exc:
        parser.error(str(exc))
    if args.ascii:
        print(ascii_diagram(args.collective, args.algorithm, args.ranks, steps))
    if args.output:
        draw(args.collective, args.algorithm, args.ranks, steps, args.output)
        print(f"wrote {args.output} ({len(steps)} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
