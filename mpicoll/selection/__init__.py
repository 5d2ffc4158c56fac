"""``algorithm="auto"``: pick an algorithm by collective, message size, ranks and op.

In this order, taking the first answer that can serve the call (a non-commutative op,
uneven blocks, a dtype the MPI library cannot reduce):

1. the tuning file that ``python -m mpicoll.bench tune`` wrote (``mpicoll.selection.tuning``);
2. the cost model with parameters fitted on this machine (``python -m mpicoll.model
   fit``), when there are some;
3. MPICH's default thresholds (``mpicoll.selection.mpich_rules``), with ``native`` for small
   messages, where the Python cost of each of our steps outweighs the wire.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from .. import model
from ..algorithms import REGISTRY
from ..config import read_config
from ..errors import ConfigError
from ..model import parse_params  # (auto's reader of the model file: model's own)
from ..ops import Op
from . import tuning
from .mpich_rules import NATIVE_BELOW, RULED, mpich_default


class Tables(NamedTuple):
    """What ``auto`` reads besides the call: the tuning table and the model's parameters
    (None where there is no file). A Communicator reads them once, on rank 0, and every
    rank gets the same copy (``mpicoll.pipeline.agree.tables``)."""

    tuning: tuning.TuningTable | None = None
    params: model.Params | None = None


def files() -> tuple[Path, Path]:
    """Where the tuning table and the model's parameters are read from."""
    return tuning.default_path(), model.default_path()


def _check_ranges(ranges: Any, collective: str, where: str) -> None:
    """A collective's size ranges as ``auto`` reads them (``TuningTable.pick``, first
    range whose ``below`` exceeds the size): each names an algorithm and ends ``below`` a
    positive number of bytes, the ends strictly increasing; only the last may be open
    (``"below": null``: every larger size). Anything else would raise inside ``auto`` or
    hold a range that can never be chosen."""
    if not isinstance(ranges, list):
        raise ValueError(f"{where}: expected a list of ranges")
    previous = 0
    for i, entry in enumerate(ranges):
        at = f"{where}[{i}] {json.dumps(entry)[:120]}"
        if not isinstance(entry, dict) or not isinstance(entry.get("algorithm"), str):
            raise ValueError(f"{at}: a range needs an 'algorithm' name")
        if entry["algorithm"] not in (*REGISTRY[collective], "native"):
            raise ValueError(f"{at}: unknown algorithm {entry['algorithm']!r}")
        if "below" not in entry:
            raise ValueError(f"{at}: a range needs 'below' (bytes; null: the last range, "
                             "every larger size)")
        below = entry["below"]
        if below is None:
            if i != len(ranges) - 1:
                raise ValueError(f"{at}: only the last range may be open ('below': null); "
                                 "the ranges after it could never be chosen")
            continue
        if isinstance(below, bool) or not isinstance(below, int):
            raise ValueError(f"{at}: 'below' must be an int or null, got {below!r}")
        if below <= previous:
            raise ValueError(
                f"{at}: 'below' must be above {previous} (the previous range's end: sizes "
                f"go up from 0 bytes), got {below}" if i else
                f"{at}: 'below' must be a positive number of bytes, got {below}")
        previous = below


def parse_tuning(text: str, path: str) -> tuning.TuningTable:
    """A tuning table from a file's text, or a ConfigError naming the file and the fault."""
    try:
        data = json.loads(text)
        if data is None:  # (a file's null: no table; TuningTable(None) is a new, empty one)
            raise ValueError("not an mpicoll tuning file (version 1)")
        table = tuning.TuningTable(data)  # (refuses JSON of any other kind: [], 0, "")
        for ranks, collectives in table.tables.items():
            # a number as the tables name it: ASCII digits, no leading zero ("02", "²": no)
            if not (str(ranks).isascii() and str(ranks).isdigit()
                    and str(int(ranks)) == str(ranks)) or not isinstance(collectives, dict):
                raise ValueError(f"tables[{ranks!r}]: expected a number of ranks and collectives")
            for collective, ranges in collectives.items():
                if collective not in REGISTRY:
                    raise ValueError(f"tables[{ranks!r}]: unknown collective {collective!r}")
                _check_ranges(ranges, collective, f"tables[{ranks!r}][{collective!r}]")
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:  # (nested
        raise ConfigError(f"tuning file {path}: {exc}") from None  # too deep for json)
    return table


def read_texts() -> dict[str, list[str | None]]:
    """Both files' paths and texts as this process sees them ({"tuning": [path, text],
    "model": [...]}; text None: no file), or a ConfigError when one cannot be read."""
    return {key: [str(path), read_config(path)]
            for key, path in zip(("tuning", "model"), files(), strict=True)}


def parse_texts(texts: dict[str, list[str | None]]) -> Tables:
    """``read_texts``' result as Tables (a bad file: ConfigError naming it)."""
    (tuning_path, tuning_text), (model_path, model_text) = texts["tuning"], texts["model"]
    return Tables(None if tuning_text is None else parse_tuning(tuning_text, tuning_path),
                  None if model_text is None else parse_params(model_text, model_path))


def read_tables() -> Tables:
    """Read and check both files here (a missing file: None; a bad one: ConfigError)."""
    return parse_texts(read_texts())


_LOADED: dict[str, Tables] = {}


def reload() -> None:
    """Forget the tables read for calls without ``tables=`` (read again on next use);
    Communicators keep what they agreed on when they were made."""
    _LOADED.clear()


def _local_tables() -> Tables:
    if "tables" not in _LOADED:
        _LOADED["tables"] = read_tables()
    return _LOADED["tables"]


def serves(collective: str, name: str, commutative: bool, has_native: bool,
           uneven: bool) -> bool:
    """Whether ``name`` can run this call without a refusal."""
    if name == "native":
        return has_native
    spec = REGISTRY[collective].get(name)
    if spec is None:
        return False
    return (commutative or not spec.commutative_only) and not (uneven and spec.even_only)

def select(collective: str, nbytes: int, size: int, op: Op | None, has_native: bool,
           uneven: bool = False, tables: Tables | None = None,
           nodes: int | tuple[int, ...] = 1) -> str:
    """The algorithm name ``auto`` runs for this call: a function of its arguments and
    ``tables`` only (default: this process's own reading of the files), so ranks that
    pass the same values pick the same algorithm.

    ``has_native``: the library's collective can run this call (it knows dtype and op).
    A non-commutative op gets an algorithm that keeps rank order; uneven blocks one that
    takes them. ``nodes``: the ranks of each node (agreed when the Communicator was made),
    or how many nodes, for the cost model, whose node-aware algorithms' costs depend on it.
    """
    commutative = op is None or op.commutative
    tables = _local_tables() if tables is None else tables
    table = tables.tuning
    if table is not None:
        name = table.pick(collective, size, nbytes)
        if name is not None and serves(collective, name, commutative, has_native, uneven):
            return name
    params = tables.params
    if params is None and collective not in RULED:  # a collective MPICH's rules lack
        params = model.Params()
    if params is not None and has_native and nbytes < NATIVE_BELOW.get(collective, 0):
        # a small call: the library's own, as the rules below (the model's alpha is what
        # our messages cost, Python's steps included: it cannot price the library's C
        # below our copy of the same algorithm, where the per-call cost is all there is)
        return "native"
    if params is not None:
        # native first: of times the model prices alike, the library's own (its C runs
        # the algorithm it stands for, without our per-step Python), so a fitted model
        # keeps the small calls on it as the rules below do
        candidates = [n for n in ["native", *REGISTRY[collective]]
                      if serves(collective, n, commutative, has_native, uneven)]
        return model.best(collective, nbytes, size, params, candidates, nodes)
    return mpich_default(collective, nbytes, size, op, has_native, uneven)
