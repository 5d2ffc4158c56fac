"""What the benchmark prints and writes: header, table rows, progress, JSON, CSV, plots."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

from mpicoll import model
from mpicoll.selection.tuning import ranges_from_winners

TABLE_HEADER = (f"# {'size(B)':>12} {'count':>12} {'type':>8} {'redop':>6} {'root':>4} "
                f"{'algorithm':>20} {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} "
                f"{'model(us)':>10} {'meas/model':>10} {'vs_native':>9}")


MPI_LIBRARY = "mpi_library"  # the row of the MPI library's collective called directly
NCCL_LIBRARY = "nccl_library"  # on backend nccl: cupy.cuda.nccl called directly
LIBRARY_ROWS = (MPI_LIBRARY, NCCL_LIBRARY)
# the collectives whose in-place form the benchmark times (every rank's result into its
# own input: out=x, x=out[rank], broadcast's one buffer); the others run out of place twice
INPLACE = ("all_reduce", "reduce", "all_gather", "all_to_all", "broadcast", "scan", "exscan")


def library_row(backend: str) -> str:
    """The row of the library's own collective on ``backend``."""
    return NCCL_LIBRARY if backend == "nccl" else MPI_LIBRARY

def human(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes}B"


def wrong(row: Any) -> str:
    """A row's #wrong: "N/A" where results were not checked (-c 0; -1 in its JSON)."""
    return "N/A" if row.wrong < 0 else str(row.wrong)


def table_row(row: Any) -> str:
    return (f"  {row.size:>12} {row.count:>12} {row.type:>8} {row.redop:>6} {row.root:>4} "
            f"{row.algorithm:>20} {row.time_us:>10.1f} {row.algbw:>7.2f} {row.busbw:>7.2f} "
            f"{wrong(row):>6} {row.predicted_us:>10.1f} {row.measured_over_predicted:>10.2f} "
            f"{row.vs_native:>9.2f}")


def header(comm: Any, args: Any, dtype: Any, params: Any) -> dict[str, Any]:
    """What was run, where and how: the JSON header and the comment lines above the table."""
    import mpi4py
    import numpy as np
    from mpi4py import MPI

    import mpicoll

    hosts = sorted(set(comm.control_comm.allgather(MPI.Get_processor_name())))
    # SLURM's node names: several slurmd on one host are distinct nodes with one host name
    slurm_nodes = sorted({n for n in comm.control_comm.allgather(
        os.environ.get("SLURMD_NODENAME")) if n})
    return {
        "mpicoll": mpicoll.__version__,
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
        "mpi4py": mpi4py.__version__,
        "numpy": np.__version__,
        "ranks": comm.size,
        "hosts": len(hosts),
        "host_names": hosts,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_nodes": slurm_nodes,
        # the nodes mpicoll's node-aware algorithms see (comm.nodes: MPICOLL_RANKS_PER_NODE,
        # SLURM's nodes under srun, else hosts), as ranks per node
        "nodes": [len(n) for n in comm.nodes],
        "backend": args.backend,
        "buffer": args.buffer,
        "dtype": dtype.name,
        "op": args.op,
        "root": args.root,
        "iterations": args.iters,
        "warmup": args.warmup_iters,
        "inplace": args.inplace,
        "timing": args.timing,
        "model": {"alpha": params.alpha, "beta": params.beta, "gamma": params.gamma,
                  "source": params.source},
        **_gpu_versions(args),
    }


def _gpu_versions(args: Any) -> dict[str, Any]:
    if args.buffer != "cupy":
        return {}
    import cupy

    versions = {"cupy": cupy.__version__, "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                "gpu": cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]}
    if isinstance(versions["gpu"], bytes):
        versions["gpu"] = versions["gpu"].decode()
    if args.backend == "nccl":
        versions["nccl"] = cupy.cuda.nccl.get_version()
    return versions


def header_lines(h: dict[str, Any], sweep: bool = True) -> list[str]:
    """The run's header: versions, ranks and buffers, and (``sweep``: a sweep's, not the
    overhead table's, which says how it times in its own header) timing, model, columns."""
    timing = ("a barrier before each iteration, the algorithms taking turns in a shuffled order"
              if h["timing"] == "barrier" else "back-to-back iterations")
    slurm = (f" | SLURM job {h['slurm_job_id']} on nodes {','.join(h['slurm_nodes'])}"
             if h["slurm_job_id"] else "")
    gpu = []
    if "cupy" in h:
        timing += "; the CUDA stream synchronized after every call, inside the timed span"
        gpu = [f"# GPU {h['gpu']} | CuPy {h['cupy']} | CUDA runtime {h['cuda_runtime']}"
               + (f" | NCCL {h['nccl']}" if "nccl" in h else "")]
    library = library_row(h["backend"])
    run = [
        f"# mpicoll {h['mpicoll']} | {h['mpi_library']} | mpi4py {h['mpi4py']} | numpy {h['numpy']}",
        *gpu,
        f"# {h['ranks']} ranks on {h['hosts']} host(s){slurm} | {len(h['nodes'])} node(s) of "
        f"{'+'.join(map(str, h['nodes']))} ranks | backend {h['backend']} "
        f"({h['buffer']} buffers) | dtype {h['dtype']} | op {h['op']} | root {h['root']}"
        f"{' | in place' if h['inplace'] else ''}",
    ]
    if not sweep:
        return run
    return [
        *run,
        f"# {h['iterations']} iterations after {h['warmup']} warm-up; time: per iteration the "
        f"slowest rank's, then the median; {timing}",
        f"# model: alpha {h['model']['alpha'] * 1e6:.2f} us, beta "
        f"{model.rate(h['model']['beta'])}, gamma {model.rate(h['model']['gamma'])} "
        f"({h['model']['source']}); native and auto are modelled by the algorithm they run",
        f"# vs_native: the time of the {'NCCL' if library == NCCL_LIBRARY else 'MPI'} library's"
        f" collective called directly ({library}) / this row's time (>1: faster than the"
        " library); 'native' is that collective called through mpicoll",
    ]


class Progress:
    """A progress bar on stderr (rank 0 only), shown once a sweep has run 3 seconds.

    On a terminal it redraws one line; elsewhere (a SLURM log) it prints a line every
    10% so the log shows the sweep is alive.
    """

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.done_steps = enabled, max(total, 1), 0
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.last_tenth = -1

    def step(self, label: str) -> None:
        self.done_steps += 1
        if not self.enabled or time.monotonic() - self.start < 3:
            return
        fraction = min(self.done_steps / self.total, 1.0)
        if self.tty:
            bar = "#" * int(30 * fraction)
            sys.stderr.write(f"\r[{bar:<30}] {self.done_steps}/{self.total} {label:<40}")
            sys.stderr.flush()
        elif int(fraction * 10) > self.last_tenth:
            self.last_tenth = int(fraction * 10)
            sys.stderr.write(f"# progress {fraction:4.0%} ({label})\n")

    def done(self) -> None:
        if self.enabled and self.tty and time.monotonic() - self.start >= 3:
            sys.stderr.write("\n")


def fastest_lines(rows: list[Any]) -> list[str]:
    """One line per collective naming the fastest algorithm per size range: mpicoll's own
    and ``native`` (the library's collective through mpicoll, marked with a *)."""
    lines = []
    for collective in dict.fromkeys(r.collective for r in rows):
        mine = [r for r in rows if r.collective == collective  # per call, exact: plans and
                and r.algorithm not in (*LIBRARY_ROWS, "auto") and "+" not in r.algorithm]
        #                                                        compressed rows apart
        winners = []
        for size in sorted({r.size for r in mine}):
            at = [r for r in mine if r.size == size]
            winners.append((size, min(at, key=lambda r: r.time_us).algorithm))
        if not winners:
            continue
        ranges = ranges_from_winners(winners)

        def name(algorithm: str) -> str:
            return "native*" if algorithm == "native" else algorithm

        text = ", ".join(f"{name(r['algorithm'])} below {human(r['below'])}"
                         if r["below"] is not None
                         else (f"then {name(r['algorithm'])}" if len(ranges) > 1
                               else name(r["algorithm"]))
                         for r in ranges)
        note = (" (*: the library's collective through mpicoll)"
                if any(r["algorithm"] == "native" for r in ranges) else "")
        lines.append(f"# fastest algorithm, {collective}: {text}{note}")
    return lines


NCCL_HEADER = [
    f"# {'':>54}{'out-of-place':>24}{'in-place':>33}",
    f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} "
    f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6} "
    f"{'time':>9} {'algbw':>7} {'busbw':>7} {'#wrong':>6}",
    f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>5} "
    f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} "
    f"{'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6}",
]


def _blocks(rows: list[Any]) -> list[tuple[str, str, list[Any]]]:
    """(collective, algorithm, rows by size) in the order they were measured."""
    keys = dict.fromkeys((r.collective, r.algorithm) for r in rows)
    return [(c, a, sorted((r for r in rows if (r.collective, r.algorithm) == (c, a)),
                          key=lambda r: r.size)) for c, a in keys]


def average_busbw(rows: list[Any]) -> float:
    return sum(r.busbw for r in rows) / len(rows) if rows else 0.0


# the type column as nccl-tests names its types (any other dtype: NumPy's name)
_NCCL_TYPE_NAMES = {"float16": "half", "float32": "float", "float64": "double"}


def nccl_lines(out_of_place: list[Any], in_place: list[Any], head: dict[str, Any]) -> list[str]:
    """nccl-tests' layout: per collective and algorithm, out-of-place and in-place columns
    in one table, then its average bus bandwidth (over both, as nccl-tests averages)."""
    lines = []
    placed = {(r.collective, r.algorithm, r.size): r for r in in_place}
    for collective, algorithm, mine in _blocks(out_of_place):
        lines += ["", f"# {collective}, algorithm {algorithm} ({head['ranks']} ranks)"
                  + ("" if collective in INPLACE else "; no in-place form: its in-place "
                     "columns n/a"), *NCCL_HEADER]
        both = []
        for r in mine:
            other = placed.get((collective, algorithm, r.size))
            both += [r] + ([other] if other else [])
            cells = (f"{other.time_us:>9.2f} {other.algbw:>7.2f} {other.busbw:>7.2f} "
                     f"{wrong(other):>6}" if other else f"{'n/a':>9} {'':>7} {'':>7} {'':>6}")
            kind = _NCCL_TYPE_NAMES.get(r.type, r.type)
            lines.append(f"  {r.size:>10} {r.count:>12} {kind:>8} {r.redop:>6} {r.root:>5} "
                         f"{r.time_us:>9.2f} {r.algbw:>7.2f} {r.busbw:>7.2f} {wrong(r):>6} "
                         + cells)
        lines.append(f"# Avg bus bandwidth    : {average_busbw(both):.6g} ")
    return lines


# OSU's message size, from nccl-tests' bytes: per rank (a gather's, a scatter's row) or per
# peer (all_to_all) where nccl-tests counts the whole buffer
_OSU_PER_RANK = frozenset(("all_gather", "gather", "scatter", "all_to_all"))


def osu_lines(rows: list[Any], head: dict[str, Any]) -> list[str]:
    """OSU micro-benchmarks' layout and meaning: per collective and algorithm, at each
    message size (OSU's: per rank for all_gather, gather and scatter, per peer for
    all_to_all), each rank's mean latency over the iterations, then their average,
    minimum and maximum over the ranks."""
    lines = []
    ranks = int(head["ranks"])
    for collective, algorithm, mine in _blocks(rows):
        lines += ["", f"# OSU-style {collective} latency test, algorithm {algorithm}, "
                  f"{ranks} ranks",
                  f"# {'Size':<10} {'Avg Latency(us)':>17} {'Min Latency(us)':>17} "
                  f"{'Max Latency(us)':>17} {'Iterations':>11}"]
        for r in mine:
            size = r.size // ranks if collective in _OSU_PER_RANK else r.size
            lines.append(f"{size:<12} {r.rank_avg_us:>17.2f} {r.rank_min_us:>17.2f} "
                         f"{r.rank_max_us:>17.2f} "
                         f"{head['iterations']:>11}")
    return lines


def auto_lines(rows: list[Any]) -> list[str]:
    """Per collective, how far ``auto`` is from the fastest row (and from ``native``)."""
    lines = []
    for collective in dict.fromkeys(r.collective for r in rows):
        # (auto against the other per-call rows of the same values: not a plan's rows,
        # nor compressed ones, whose results differ)
        mine = [r for r in rows if r.collective == collective and r.algorithm not in LIBRARY_ROWS
                and "+" not in r.algorithm]
        to_best, to_native = [], []  # (auto's time over the other's, size), where compared
        for size in sorted({r.size for r in mine}):
            at = {r.algorithm: r.time_us for r in mine if r.size == size}
            if "auto" not in at or len(at) < 2:
                continue
            to_best.append((at["auto"] / min(t for n, t in at.items() if n != "auto"), size))
            if "native" in at:
                to_native.append((at["auto"] / at["native"], size))
        slowest = max(to_best, default=(1.0, 0))
        if slowest[0] > 1.0:
            said = f"at most {slowest[0]:.2f}x the fastest (at {human(slowest[1])})"
            if to_native:  # (only where a native row ran beside it)
                worst = max(to_native)
                said += (f", {worst[0]:.2f}x native (at {human(worst[1])})" if worst[0] > 1.0
                         else ", never slower than native")
            lines.append(f"# auto, {collective}: {said}")
        elif to_best:
            lines.append(f"# auto, {collective}: the fastest at every size")
    return lines


def best_busbw(rows: list[Any]) -> dict[str, float]:
    """The best busbw any of mpicoll's rows reached, per collective."""
    best: dict[str, float] = {}
    for r in rows:
        if r.algorithm not in LIBRARY_ROWS:
            best[r.collective] = max(best.get(r.collective, 0.0), r.busbw)
    return best


def _row_dict(row: Any) -> dict[str, Any]:
    out = dataclasses.asdict(row)
    out["measured_over_predicted"] = row.measured_over_predicted
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


# the run's header, repeated on every CSV row (the JSON keeps it once, as "header")
CSV_RUN_COLUMNS = ("ranks", "hosts", "host_names", "dtype", "op", "timing", "iterations",
                   "warmup", "mpicoll", "mpi_library", "mpi4py", "numpy", "slurm_job_id")


def figure_path(path: str) -> tuple[str, str | None]:
    """Where matplotlib's ``savefig(path)`` writes (a name without an extension gets
    .png, as savefig appends it), and why it cannot (None: it can): an extension
    matplotlib writes no file of, or a place ``unwritable`` refuses; matplotlib missing."""
    try:
        import matplotlib  # noqa: F401 - only whether it is there
    except ImportError:
        return path, ("drawing needs matplotlib: pip install matplotlib (mpicoll's plot "
                      "extra, pip install -e '.[plot]')")
    extension = os.path.splitext(path)[1][1:].lower()
    if not extension:
        path += ".png"
    else:
        from matplotlib.backend_bases import FigureCanvasBase

        kinds = FigureCanvasBase.get_supported_filetypes()
        if extension not in kinds:
            return path, (f"matplotlib writes no .{extension} file; give one of "
                          f"{', '.join('.' + k for k in sorted(kinds))}")
    return path, unwritable(path)


def unwritable(path: str) -> str | None:
    """Why the file ``path`` could not be written (None: it can), its folder made where
    missing: asked before a run, so hours of measurements are never lost at its end."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{path} is a folder"
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        return f"cannot make the folder {folder} ({exc.strerror or exc})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    existed = os.path.exists(path)
    try:  # (opened as the end of the run will, but to append: nothing of it is lost; a
        # root's os.access says yes to files it cannot write: an immutable one, /proc's)
        with open(path, "a"):
            pass
    except OSError as exc:
        return f"cannot write {path} ({exc.strerror or exc})"
    if not existed:
        os.remove(path)
    return None


def write(rows: list[Any], head: dict[str, Any], json_path: str | None, csv_path: str | None,
          plot_path: str | None) -> None:
    records = [_row_dict(r) for r in rows]
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"header": head, "rows": records}, f, indent=1)
            f.write("\n")
    if csv_path:
        run = {name: head[name] for name in CSV_RUN_COLUMNS}
        run["host_names"] = " ".join(head["host_names"])
        rows_with_run = [{**record, **run} for record in records]
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows_with_run[0]) if rows_with_run
                                    else ["collective", *run])
            writer.writeheader()
            writer.writerows(rows_with_run)
    if plot_path:
        plot(rows, head, plot_path)


def model_plot_path(path: str) -> str:
    root, ext = os.path.splitext(path)
    return f"{root}-model{ext or '.png'}"


def plot(rows: list[Any], head: dict[str, Any], path: str) -> None:
    """busbw against size, a panel per collective; and predicted against measured time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = list(dict.fromkeys(r.collective for r in rows))
    columns = min(len(collectives), 2) or 1
    lines_ = math.ceil(len(collectives) / columns) or 1
    fig, axes = plt.subplots(lines_, columns, figsize=(6.5 * columns, 4 * lines_), squeeze=False)
    for ax, collective in zip(axes.flat, collectives, strict=False):
        mine = [r for r in rows if r.collective == collective]
        for name in dict.fromkeys(r.algorithm for r in mine):
            points = sorted((r.size, r.busbw) for r in mine if r.algorithm == name
                            and r.busbw > 0)  # 0 B: nothing moved, nothing to draw
            style = ({"linewidth": 2.5, "color": "black", "linestyle": "-" if name in LIBRARY_ROWS else "--"}
                     if name in (*LIBRARY_ROWS, "native") else {})
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o",
                    markersize=3, label=name, **style)
        ax.set_xscale("log", base=2)
        if any(r.busbw > 0 for r in mine):  # log: the small sizes' busbw is readable too
            ax.set_yscale("log")
        ax.set_title(f"{collective}, {head['ranks']} ranks, {head['dtype']}")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s, log scale)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(collectives):]:
        ax.set_visible(False)
    fig.suptitle(f"mpicoll {head['mpicoll']} | {head['mpi_library']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 6))
    for collective in collectives:
        mine = [r for r in rows if r.collective == collective and r.predicted_us > 0]
        ax.scatter([r.predicted_us for r in mine], [r.time_us for r in mine], s=10,
                   label=collective)
    finite = [v for r in rows for v in (r.predicted_us, r.time_us) if v > 0]
    if finite:
        lo, hi = min(finite), max(finite)
        ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted time (us)")
    ax.set_ylabel("measured time (us)")
    ax.set_title(f"cost model vs measurement, {head['ranks']} ranks")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(model_plot_path(path), dpi=100)
    plt.close(fig)
