"""Time against the number of ranks: the runs of ``jobs/scaling.sbatch`` put together.

    python -m mpicoll.bench.scaling DIR [-o DIR/scaling.png]

DIR holds one benchmark JSON per number of ranks (``ranks-<p>.json``, each written by
``python -m mpicoll.bench COLLECTIVE -b SIZE -e SIZE --json``). Writes ``scaling.csv``
(collective, algorithm, ranks, nodes, size, measured and predicted time) and a PNG of the
measured time of each algorithm against the ranks, with the cost model's curve for it
(dashed, the parameters each run's header names) beside it.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys
from typing import Any

from mpicoll import model
from mpicoll.bench.report import LIBRARY_ROWS, figure_path


def load(directory: str) -> list[dict[str, Any]]:
    """Every row of every run in ``directory``, with its run's ranks, nodes and model."""
    records = []
    for path in sorted(glob.glob(os.path.join(directory, "ranks-*.json"))):
        try:
            with open(path) as f:
                run = json.load(f)
            head = run["header"]
            # the nodes the run saw (simulated ones too), else its SLURM nodes or hosts
            nodes = len(head.get("nodes") or ()) or len(head.get("slurm_nodes") or ()) \
                or head["hosts"]
            ranks = _typed(head, "ranks", int)
            for row in run["rows"]:
                records.append({
                    "collective": _typed(row, "collective", str),
                    "algorithm": _typed(row, "algorithm", str),
                    "ranks": ranks, "nodes": nodes, "size": _typed(row, "size", int),
                    "time_us": _typed(row, "time_us", float),
                    "wrong": _typed(row, "wrong", int),
                    "predicted_us": _predicted(row, head),
                })
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{path}: not a benchmark's --json run ({type(exc).__name__}: "
                             f"{exc})") from None
    return sorted(records, key=lambda r: (r["collective"], r["algorithm"], r["ranks"]))


def _typed(record: dict[str, Any], key: str, kind: type) -> Any:
    """``record[key]``, of ``kind`` (float: any number; int: an integer, never a bool), or
    a TypeError naming the field (a hand-edited run's ``"ranks": "2"`` or ``null``)."""
    value = record[key]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is float and number:
        return float(value)
    if kind is int and number and float(value).is_integer():
        return int(value)
    if kind is str and isinstance(value, str):
        return value
    raise TypeError(f"{key}: expected {'a number' if kind is float else kind.__name__}, got "
                    f"{value!r}")


def _predicted(row: dict[str, Any], head: dict[str, Any]) -> float:
    """The row's own prediction (the run's whole model, two-level parameters too, and for
    auto the algorithm it ran); for a file without one, the run's alpha, beta, gamma."""
    if "predicted_us" in row:
        return _typed(row, "predicted_us", float)
    params = model.Params(alpha=head["model"]["alpha"], beta=head["model"]["beta"],
                          gamma=head["model"]["gamma"])
    stand_in = "native" if row["algorithm"] in (*LIBRARY_ROWS, "auto") else \
        row["algorithm"].split("+")[0]
    try:
        return model.predict(row["collective"], stand_in, row["size"], head["ranks"], params,
                             tuple(head.get("nodes") or ())) * 1e6
    except ValueError:
        return 0.0  # (no model of it)


def write_csv(records: list[dict[str, Any]], path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def plot(records: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(r["collective"] for r in records))
    fig, axes = plt.subplots(1, len(collectives), figsize=(7 * len(collectives), 4.5),
                             squeeze=False)
    for ax, collective in zip(axes.flat, collectives, strict=True):
        mine = [r for r in records if r["collective"] == collective]
        for name in dict.fromkeys(r["algorithm"] for r in mine):
            points = [r for r in mine if r["algorithm"] == name]
            ranks = [r["ranks"] for r in points]
            line, = ax.plot(ranks, [r["time_us"] for r in points], marker="o", label=name)
            modelled = [r for r in points if r["predicted_us"] > 0]  # 1 rank: no message
            ax.plot([r["ranks"] for r in modelled], [r["predicted_us"] for r in modelled],
                    linestyle="--", color=line.get_color(), alpha=0.6)
        sizes = sorted({r["size"] for r in mine})
        ax.set_title(f"{collective}, {', '.join(str(s) for s in sizes)} B "
                     "(dashed: cost model)")
        ax.set_xlabel("ranks")
        ax.set_ylabel("time (us)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpicoll.bench.scaling",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="the folder of ranks-<p>.json runs")
    parser.add_argument("-o", "--output", default=None,
                        help="the PNG (default DIR/scaling.png); the CSV goes beside it")
    args = parser.parse_args(argv)
    try:
        records = load(args.directory)
    except ValueError as exc:
        parser.error(str(exc))
    if not records:
        runs = glob.glob(os.path.join(args.directory, "ranks-*.json"))
        print(f"{parser.prog}: " + (f"the {len(runs)} ranks-*.json in {args.directory} have "
                                    "no rows" if runs else
                                    f"no ranks-*.json in {args.directory}"), file=sys.stderr)
        return 2
    png = args.output or os.path.join(args.directory, "scaling.png")
    png, problem = figure_path(png)
    try:
        write_csv(records, os.path.splitext(png)[0] + ".csv")
        if problem is None:
            plot(records, png)
    except OSError as exc:
        parser.error(f"-o {png}: {exc.strerror or exc}")
    for record in records:
        print(f"{record['collective']:>14} {record['algorithm']:>20} {record['ranks']:>5} ranks "
              f"{record['nodes']:>3} node(s) {record['time_us']:>12.1f} us "
              f"(model {record['predicted_us']:.1f} us)")
    if problem is not None:  # (the CSV and the table are made; the figure is not)
        print(f"{parser.prog}: -o {png}: {problem}", file=sys.stderr)
        return 2
    return 1 if any(r["wrong"] > 0 for r in records) else 0  # (-1: not checked)


if __name__ == "__main__":
    sys.exit(main())
