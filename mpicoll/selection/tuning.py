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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import config_file, read_config

VERSION = 1


def default_path() -> Path:
    return config_file("MPICOLL_TUNING", "tuning.json")


class TuningTable:
    """Decision tables by number of ranks: ``pick(collective, p, nbytes)``."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        if data is None:  # (a new, empty table; a file's JSON of any other kind is refused)
            data = {"mpicoll_tuning": VERSION, "tables": {}}
        if not isinstance(data, dict) or data.get("mpicoll_tuning") != VERSION or \
                not isinstance(data.get("tables"), dict):
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
        """The table in ``path`` (default: ``default_path()``), read as ``auto`` reads it;
        None where there is no such file, a ConfigError where it cannot be read or is no
        tuning file (so ``tune`` never writes its table over another file)."""
        from . import parse_tuning  # (auto's reader of the file: the same checks)

        path = Path(path) if path else default_path()
        text = read_config(path)
        return None if text is None else parse_tuning(text, str(path))

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path) if path else default_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, indent=2) + "\n")
        return path


def ranges_from_winners(winners: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """Size ranges from the fastest algorithm at each measured size (ascending sizes).

    A range ends below the first measured size where another algorithm won; the last
    range is open ("below": null). Sizes are taken in ascending order and a size measured
    twice (two requested sizes that round to the same buffer) counts once, so the ends
    strictly increase from above 0, as the reader (``selection.parse_tuning``) requires.
    """
    ranges: list[dict[str, Any]] = []
    last = None
    for size, name in sorted(winners, key=lambda winner: winner[0]):
        if size == last:
            continue
        last = size
        if ranges and ranges[-1]["algorithm"] == name:
            continue
        if ranges:
            ranges[-1]["below"] = size
        ranges.append({"below": None, "algorithm": name})
    return ranges


# -- export to the MPI libraries --------------------------------------------------------
#
# MPICH reads its JSON selection file *instead of* its own tree, so the export starts from
# MPICH's default tree (mpicoll.selection.mpich_json) and replaces, per tuned collective, the
# intra-communicator branch. Each tuned range names an MPICH algorithm only where MPICH
# has the same one and only under that algorithm's preconditions (MPICH asserts them:
# allreduce's reduce_scatter_allgather needs count >= pof2 and a built-in op, ring a
# commutative op, recursive-doubling allgather a power-of-two size, Bruck's alltoall a
# separate send buffer); everywhere else, MPICH's own choice runs.


@dataclass(frozen=True)
class MpichAlgorithm:
    """An MPICH algorithm: its name, the parameters its container needs (MPICH leaves
    unnamed ones uninitialised), and the precondition it asserts."""

    name: str
    params: tuple[str, ...] = ()
    needs: str | None = None  # a key of _MPICH_GUARDS


@dataclass(frozen=True)
class MpichCollective:
    names: tuple[str, ...]  # MPICH's collectives it is called as (reduce_scatter: both)
    size_key: str           # the MPICH size whose bytes are the tuning table's bytes
    algorithms: dict[str, dict[str, MpichAlgorithm]]  # per MPICH name: ours -> MPICH's


def _same(mapping: dict[str, MpichAlgorithm]) -> dict[str, dict[str, MpichAlgorithm]]:
    return {"": mapping}


_MPICH: dict[str, MpichCollective] = {
    "broadcast": MpichCollective(("bcast",), "avg_msg_size", _same({
        "binomial": MpichAlgorithm("MPIR_Bcast_intra_binomial"),
        "scatter_allgather": MpichAlgorithm("MPIR_Bcast_intra_scatter_ring_allgather"),
        "knomial": MpichAlgorithm("MPIR_Bcast_intra_tree", (
            "tree_type=knomial_1", "k=4", "is_non_blocking=0", "topo_overhead=0",
            "topo_diff_groups=0", "topo_diff_switches=0", "topo_same_switches=0")),
        "pipelined_chain": MpichAlgorithm("MPIR_Bcast_intra_pipelined_tree", (
            "tree_type=kary", "k=1", "is_non_blocking=0", "chunk_size=65536",
            "recv_pre_posted=0")),
    })),
    "all_reduce": MpichCollective(("allreduce",), "avg_msg_size", _same({
        "recursive_doubling": MpichAlgorithm("MPIR_Allreduce_intra_recursive_doubling"),
        "rabenseifner": MpichAlgorithm("MPIR_Allreduce_intra_reduce_scatter_allgather",
                                       needs="builtin_op_count_ge_pof2"),
        "ring": MpichAlgorithm("MPIR_Allreduce_intra_ring", needs="commutative"),
        "ring_pipelined": MpichAlgorithm("MPIR_Allreduce_intra_ring", needs="commutative"),
    })),
    "all_gather": MpichCollective(("allgather",), "total_msg_size", _same({
        "ring": MpichAlgorithm("MPIR_Allgather_intra_ring"),
        "recursive_doubling": MpichAlgorithm("MPIR_Allgather_intra_recursive_doubling",
                                             needs="pow2_ranks"),
        "bruck": MpichAlgorithm("MPIR_Allgather_intra_brucks"),
    })),
    "reduce": MpichCollective(("reduce",), "avg_msg_size", _same({
        "binomial": MpichAlgorithm("MPIR_Reduce_intra_binomial"),
        "rabenseifner": MpichAlgorithm("MPIR_Reduce_intra_reduce_scatter_gather",
                                       needs="builtin_op_count_ge_pof2"),
    })),
    "reduce_scatter": MpichCollective(("reduce_scatter", "reduce_scatter_block"),
                                      "total_msg_size", {
        "reduce_scatter": {
            "recursive_halving": MpichAlgorithm(
                "MPIR_Reduce_scatter_intra_recursive_halving", needs="commutative"),
            "pairwise": MpichAlgorithm("MPIR_Reduce_scatter_intra_pairwise",
                                       needs="commutative"),
            "recursive_doubling": MpichAlgorithm(
                "MPIR_Reduce_scatter_intra_recursive_doubling"),
        },
        "reduce_scatter_block": {
            "recursive_halving": MpichAlgorithm(
                "MPIR_Reduce_scatter_block_intra_recursive_halving", needs="commutative"),
            "pairwise": MpichAlgorithm("MPIR_Reduce_scatter_block_intra_pairwise",
                                       needs="commutative"),
            "recursive_doubling": MpichAlgorithm(
                "MPIR_Reduce_scatter_block_intra_recursive_doubling"),
        },
    }),
    "all_to_all": MpichCollective(("alltoall",), "total_msg_size", _same({
        "linear": MpichAlgorithm("MPIR_Alltoall_intra_scattered", needs="not_in_place"),
        "pairwise": MpichAlgorithm("MPIR_Alltoall_intra_pairwise", needs="not_in_place"),
        "bruck": MpichAlgorithm("MPIR_Alltoall_intra_brucks", needs="not_in_place"),
    })),
    # gather and scatter: MPICH's total_msg_size counts elements there, not bytes
    # (csel.c), so a table in bytes cannot be expressed; MPICH's choice stays.
}


def _guard(needs: str | None, leaf: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """``leaf`` where the precondition ``needs`` holds, MPICH's ``default`` elsewhere."""
    if needs is None:
        return leaf
    if needs == "builtin_op_count_ge_pof2":
        return {"is_op_built_in=yes": {"count<pow2": default, "count=any": leaf},
                "is_op_built_in=any": default}
    key = {"commutative": "is_commutative=yes", "pow2_ranks": "comm_size=pow2",
           "not_in_place": "is_sendbuf_inplace=no"}[needs]
    return {key: leaf, key.split("=")[0] + "=any": default}


def _mpich_branch(ranges: list[dict[str, Any]], size_key: str,
                  algorithms: dict[str, MpichAlgorithm], default: dict[str, Any]
                  ) -> dict[str, Any]:
    """One comm size's ranges as MPICH size branches (``<`` tests, the last one ``any``)."""
    branch: dict[str, Any] = {}
    for entry in ranges:
        mine = algorithms.get(entry["algorithm"])
        if mine is None:  # native, or an algorithm MPICH lacks: MPICH's own choice
            target = default
        else:
            leaf = {f"algorithm={mine.name}": {param: {} for param in mine.params}}
            target = _guard(mine.needs, leaf, default)
        below = entry["below"]
        if below is not None and below >= 2**31 - 1:  # MPICH reads a limit as an int
            below = None  # (atoi): this range takes every size from here, no later one
        key = f"{size_key}=any" if below is None else f"{size_key}<{below}"
        branch[key] = target
        if below is None:
            break
    if f"{size_key}=any" not in branch:
        branch[f"{size_key}=any"] = default
    return branch


def to_mpich(table: TuningTable) -> dict[str, Any]:
    """MPICH's JSON selection tree with this table's choices (for
    ``MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE``).

    MPICH's default tree, with the intra-communicator branch of each tuned collective
    replaced: ``comm_size<=`` branches (the table of p ranks serves p up to the next
    table's p - 1, the last one any larger size; below the first, MPICH's own rules),
    then the size ranges. ``native``, algorithms MPICH lacks, and calls outside an
    algorithm's preconditions keep MPICH's own choice.
    """
    from .mpich_json import default_tree

    tree = default_tree()
    for collective, export in _MPICH.items():
        ranks = sorted(int(p) for p, t in table.tables.items() if collective in t)
        if not ranks:
            continue
        for mpich_name in export.names:
            node = tree[f"collective={mpich_name}"]
            default = node["comm_type=intra"]
            algorithms = export.algorithms.get(mpich_name, export.algorithms.get(""))
            intra: dict[str, Any] = {}
            if ranks[0] > 1:
                intra[f"comm_size<={ranks[0] - 1}"] = default
            for p, following in zip(ranks, [*ranks[1:], None], strict=True):
                key = "comm_size=any" if following is None else f"comm_size<={following - 1}"
                intra[key] = _mpich_branch(table.tables[str(p)][collective], export.size_key,
                                           algorithms, default)
            node["comm_type=intra"] = intra
    return tree


# mpicoll's algorithm -> Open MPI tuned's algorithm id, per collective id, for Open MPI 4.1
# and 5.0 (coll_tuned_<collective>_decision.c). Tuned runs a rule's algorithm for every
# op and buffer (coll_tuned_decision_dynamic.c), and its rules cannot name a condition,
# so only algorithms right for every call are exported; the others are 0 (tuned's fixed
# rules decide): allreduce ring and segmented ring (4, 5), reduce's binomial (5) and
# reduce_scatter's recursive halving and ring (2, 3) assume a commutative op (measured:
# wrong results with one); allgather_reduce (7) and reduce's knomial (8) came after 5.0. reduce_scatter is also MPI_Reduce_scatter_block (13) for
# equal blocks, whose recursive halving falls back by itself.
_OMPI: dict[str, tuple[tuple[int, dict[str, int]], ...]] = {
    "all_gather": ((0, {"bruck": 2, "recursive_doubling": 3, "ring": 4}),),
    "all_reduce": ((2, {"reduce_broadcast": 2, "recursive_doubling": 3, "rabenseifner": 6}),),
    "all_to_all": ((3, {"linear": 1, "pairwise": 2, "bruck": 3}),),
    "barrier": ((6, {"linear": 1, "recursive_doubling": 3, "dissemination": 4}),),
    "broadcast": ((7, {"linear": 1, "pipelined_chain": 2, "binomial": 6, "knomial": 7,
                       "scatter_allgather": 9}),),
    "gather": ((9, {"linear": 1, "binomial": 2}),),
    "reduce": ((11, {"linear": 1, "rabenseifner": 7}),),
    "reduce_scatter": ((12, {}), (13, {"recursive_doubling": 2, "recursive_halving": 3})),
    "scatter": ((15, {"linear": 1, "binomial": 2}),),
    # Open MPI 5's tuned scan and exscan (coll_tuned_{scan,exscan}_decision.c): linear
    # and recursive doubling, both in rank order, so right for every op
    "scan": ((14, {"linear": 1, "recursive_doubling": 2}),),
    "exscan": ((8, {"linear": 1, "recursive_doubling": 2}),),
}
_OMPI_SEGMENTED = ("ring_pipelined", "pipelined_chain")  # given a 64 KiB segment size
# Open MPI's dynamic scatter and gather take the message size from the send count and type
# (coll_tuned_decision_dynamic.c), which a scatter's non-root ranks and a gather's in-place
# root need not give (MPI ignores them there): sized rules could pick another algorithm on
# those ranks than on the others, and the job would hang. Their rules never vary by size.
_OMPI_SIZED_BY_SENDER = frozenset(("scatter", "gather"))
# Open MPI's dynamic scan and exscan look their rules up at the type's size times the
# ranks (coll_tuned_decision_dynamic.c: dsize *= comsize), not the message's: sized rules
# would run one algorithm at every message size. They too keep one algorithm, or none.
_OMPI_SIZE_UNREAD = frozenset(("scan", "exscan"))


def to_ompi_rules(table: TuningTable) -> str:
    """Open MPI tuned's classic dynamic rules file (coll_tuned_dynamic_file.c, format 1:
    per message size ``bytes algorithm faninout segsize``).

    Open MPI 4.1/5.0 read a comm-size rule as applying from that size up (the first one
    also below it), and message sizes as lower bounds, the first one 0. So a table of p
    ranks is a rule at p; below the smallest table a rule at 1 with algorithm 0 (tuned's
    fixed rules). Its message sizes are the same bytes as the table's (count times type
    size, times the ranks for the gathers, scatters and all_to_all). ``native`` and
    algorithms tuned lacks are 0: the fixed rules decide there. Scatter and gather keep
    one algorithm for all sizes, or the fixed rules (see _OMPI_SIZED_BY_SENDER); so do
    scan and exscan (_OMPI_SIZE_UNREAD).
    """
    blocks = []
    for collective, exports in _OMPI.items():
        ranks = sorted(int(p) for p, t in table.tables.items() if collective in t)
        if not ranks:
            continue
        for cid, ids in exports:
            rules = [(1, [(0, 0, "fixed rules below the smallest table")])] if ranks[0] > 1 else []
            for p in ranks:
                lower, sizes = 0, []
                for entry in table.tables[str(p)][collective]:
                    sizes.append((lower, ids.get(entry["algorithm"], 0), entry["algorithm"]))
                    lower = entry["below"] or lower
                one = collective in _OMPI_SIZED_BY_SENDER or collective in _OMPI_SIZE_UNREAD
                if one and len({a for _, a, _ in sizes}) > 1:
                    sizes = [(0, 0, "fixed rules: the table varies by size, which Open MPI "
                                    "cannot read alike on every rank here"
                              if collective in _OMPI_SIZED_BY_SENDER else
                              "fixed rules: the table varies by size, and Open MPI looks "
                              f"{collective} rules up by the type's size, not the message's")]
                elif one:
                    sizes = sizes[:1]
                rules.append((p, sizes))
            lines = [f"{cid}  # collective id: {collective}",
                     f"{len(rules)}  # number of comm sizes"]
            for p, sizes in rules:
                lines += [f"{p}  # comm size", f"{len(sizes)}  # number of message sizes"]
                for lower, algorithm, name in sizes:
                    segment = 65536 if name in _OMPI_SEGMENTED else 0
                    lines.append(f"{lower} {algorithm} 0 {segment}  # {name}")
            blocks.append("\n".join(lines))
    return f"{len(blocks)}  # number of collectives\n" + "\n".join(blocks) + "\n"
