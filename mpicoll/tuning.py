"""Tuning files: what ``python -m mpicoll.bench tune`` measured, for ``algorithm="auto"``.

A tuning file is JSON: for each number of ranks and collective, size ranges (in the
benchmark's bytes, nccl-tests' meaning) and the algorithm that was fastest there:

    {"mpicoll_tuning": 1, "library": "...", "hosts": 1,
     "tables": {"4": {"all_reduce": [{"below": 4096, "algorithm": "native"},
                                     {"below": null, "algorithm": "ring"}]}}}

``auto`` reads ``MPICOLL_TUNING`` (a path) or else ``$XDG_CONFIG_HOME/mpicoll/tuning.json``
(``~/.config/mpicoll/tuning.json``); for a number of ranks the file lacks, the table of
the nearest smaller number of ranks serves. The same table exports to MPICH's JSON
selection format (``MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE``) and to Open MPI's tuned
rules file (``coll_tuned_dynamic_rules_filename``), so the MPI library can use what
mpicoll learned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .config import config_file

VERSION = 1


def default_path() -> Path:
    return config_file("MPICOLL_TUNING", "tuning.json")


class TuningTable:
    """Decision tables by number of ranks: ``pick(collective, p, nbytes)``."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        data = data or {"mpicoll_tuning": VERSION, "tables": {}}
        if data.get("mpicoll_tuning") != VERSION or not isinstance(data.get("tables"), dict):
            raise ValueError("not an mpicoll tuning file (version 1)")
        self.data = data

    @property
    def tables(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        return self.data["tables"]

    def ranges(self, collective: str, p: int) -> list[dict[str, Any]] | None:
        """The ranges for ``collective`` at ``p`` ranks, or the nearest smaller p's."""
        known = sorted(int(k) for k, table in self.tables.items() if collective in table)
        fitting = [k for k in known if k <= p]
        if not fitting:
            return None
        return self.tables[str(fitting[-1])][collective]

    def pick(self, collective: str, p: int, nbytes: int) -> str | None:
        ranges = self.ranges(collective, p)
        if ranges is None:
            return None
        for entry in ranges:
            if entry["below"] is None or nbytes < entry["below"]:
                return entry["algorithm"]
        return None

    def set(self, collective: str, p: int, ranges: list[dict[str, Any]]) -> None:
        self.tables.setdefault(str(p), {})[collective] = ranges

    @classmethod
    def load(cls, path: str | Path | None = None) -> TuningTable | None:
        path = Path(path) if path else default_path()
        try:
            return cls(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path) if path else default_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, indent=2) + "\n")
        return path


def ranges_from_winners(winners: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """Size ranges from the fastest algorithm at each measured size (ascending sizes).

    A range ends below the first measured size where another algorithm won; the last
    range is open ("below": null).
    """
    ranges: list[dict[str, Any]] = []
    for size, name in winners:
        if ranges and ranges[-1]["algorithm"] == name:
            continue
        if ranges:
            ranges[-1]["below"] = size
        ranges.append({"below": None, "algorithm": name})
    return ranges


# -- export to the MPI libraries --------------------------------------------------------

# mpicoll's algorithm -> MPICH's (None: MPICH's default choice serves)
_MPICH = {
    "broadcast": ("bcast", "avg_msg_size", {
        "binomial": "MPIR_Bcast_intra_binomial",
        "scatter_allgather": "MPIR_Bcast_intra_scatter_ring_allgather",
        "pipelined_chain": "MPIR_Bcast_intra_pipelined_tree",
        "knomial": "MPIR_Bcast_intra_tree"}),
    "all_reduce": ("allreduce", "avg_msg_size", {
        "recursive_doubling": "MPIR_Allreduce_intra_recursive_doubling",
        "rabenseifner": "MPIR_Allreduce_intra_reduce_scatter_allgather",
        "ring": "MPIR_Allreduce_intra_ring",
        "ring_pipelined": "MPIR_Allreduce_intra_ring"}),
    "all_gather": ("allgather", "total_msg_size", {
        "ring": "MPIR_Allgather_intra_ring",
        "recursive_doubling": "MPIR_Allgather_intra_recursive_doubling",
        "bruck": "MPIR_Allgather_intra_brucks"}),
    "reduce": ("reduce", "avg_msg_size", {
        "binomial": "MPIR_Reduce_intra_binomial",
        "rabenseifner": "MPIR_Reduce_intra_reduce_scatter_gather"}),
    "reduce_scatter": ("reduce_scatter", "total_msg_size", {
        "recursive_halving": "MPIR_Reduce_scatter_intra_recursive_halving",
        "pairwise": "MPIR_Reduce_scatter_intra_pairwise",
        "ring": "MPIR_Reduce_scatter_intra_pairwise",
        "recursive_doubling": "MPIR_Reduce_scatter_intra_recursive_doubling"}),
    "all_to_all": ("alltoall", "total_msg_size", {
        "linear": "MPIR_Alltoall_intra_scattered",
        "pairwise": "MPIR_Alltoall_intra_pairwise",
        "bruck": "MPIR_Alltoall_intra_brucks"}),
    "gather": ("gather", "total_msg_size", {"binomial": "MPIR_Gather_intra_binomial"}),
    "scatter": ("scatter", "total_msg_size", {"binomial": "MPIR_Scatter_intra_binomial"}),
}

# mpicoll's algorithm -> Open MPI tuned's algorithm id, per collective id (0: fixed rules)
_OMPI = {
    "all_gather": (0, {"bruck": 2, "recursive_doubling": 3, "ring": 4}),
    "all_reduce": (2, {"reduce_broadcast": 2, "recursive_doubling": 3, "ring": 4,
                       "ring_pipelined": 5, "rabenseifner": 6, "allgather_reduce": 7}),
    "all_to_all": (3, {"linear": 1, "pairwise": 2, "bruck": 3}),
    "barrier": (6, {"linear": 1, "recursive_doubling": 3, "dissemination": 4, "knomial": 6}),
    "broadcast": (7, {"linear": 1, "pipelined_chain": 2, "binomial": 6, "knomial": 7,
                      "scatter_allgather": 9}),
    "gather": (9, {"linear": 1, "binomial": 2}),
    "reduce": (11, {"linear": 1, "binomial": 5, "rabenseifner": 7, "knomial": 8}),
    "reduce_scatter": (12, {"recursive_halving": 2, "ring": 3}),
    "scatter": (15, {"linear": 1, "binomial": 2}),
}


def _mpich_choice(collective: str, name: str, nbytes: int, p: int) -> str:
    from .model import native_stand_in

    names = _MPICH[collective][2]
    if name in names:
        return names[name]
    fallback = native_stand_in(collective, nbytes, p)  # MPICH's default for that call
    return names.get(fallback) or next(iter(names.values()))


def to_mpich(table: TuningTable) -> dict[str, Any]:
    """MPICH's JSON selection tree: per collective, ``comm_size<=p`` branches (ascending,
    first match), then size ranges. Algorithms MPICH lacks (and ``native``) become the
    algorithm MPICH's own default runs there."""
    out: dict[str, Any] = {}
    for collective, (mpich_name, size_key, _) in _MPICH.items():
        sizes = sorted(int(p) for p, t in table.tables.items() if collective in t)
        if not sizes:
            continue
        intra: dict[str, Any] = {}
        for i, p in enumerate(sizes):
            branch: dict[str, Any] = {}
            lower = 0
            for entry in table.tables[str(p)][collective]:
                below = entry["below"]
                probe = lower if below is None else max(below - 1, 0)
                algorithm = {f"algorithm={_mpich_choice(collective, entry['algorithm'], probe, p)}": {}}
                key = f"{size_key}=any" if below is None else f"{size_key}<{below}"
                branch[key] = algorithm
                lower = below or lower
            intra["comm_size=any" if i == len(sizes) - 1 else f"comm_size<={p}"] = branch
        out[f"collective={mpich_name}"] = {"comm_type=intra": intra}
    return out


def to_ompi_rules(table: TuningTable) -> str:
    """Open MPI tuned's classic dynamic rules file (version 1: bytes alg topo segsize).

    Message sizes are lower bounds, ascending, the first one 0. Algorithms tuned lacks
    (and ``native``) become 0: tuned's fixed rules decide there.
    """
    blocks = []
    for collective, (cid, ids) in _OMPI.items():
        sizes = sorted(int(p) for p, t in table.tables.items() if collective in t)
        if not sizes:
            continue
        lines = [f"{cid}  # collective id: {collective}", f"{len(sizes)}  # number of comm sizes"]
        for p in sizes:
            ranges = table.tables[str(p)][collective]
            lines += [f"{p}  # comm size", f"{len(ranges)}  # number of message sizes"]
            lower = 0
            for entry in ranges:
                segment = 65536 if entry["algorithm"] in ("ring_pipelined", "pipelined_chain") else 0
                lines.append(f"{lower} {ids.get(entry['algorithm'], 0)} 0 {segment}"
                             f"  # {entry['algorithm']}")
                lower = entry["below"] or lower
        blocks.append("\n".join(lines))
    return f"{len(blocks)}  # number of collectives\n" + "\n".join(blocks) + "\n"
