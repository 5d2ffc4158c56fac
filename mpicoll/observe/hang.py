"""Read the flight-recorder dumps of a job that timed out, and say what went wrong.

    python -m mpicoll.trace hang DIR      # DIR: the job's MPICOLL_DUMP_DIR

Each rank wrote ``DIR/rank-<r>.json`` (``mpicoll.observe.watchdog``) when its call timed out,
when another rank's timeout told it to, or when it exited. This groups the ranks by the
call they are in, finds the call the stuck ranks wait in, and names what differs: a rank
in another collective at that call number (a mismatch), a rank that never reached it
(it left, died or is busy elsewhere), a rank whose call failed, a rank with no dump.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections import Counter
from typing import Any


def load_dumps(directory: str, unread: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """Every rank's dump in ``directory``, by rank; a file that is no dump (a rank killed
    while writing it) is left out, said in ``unread`` (file: why)."""
    dumps = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.json"))):
        if re.fullmatch(r"rank-\d+\.json", os.path.basename(path)):
            try:
                with open(path) as f:
                    data = json.load(f)
                rank = int(data["rank"])
                if not isinstance(data.get("communicators"), list):
                    raise KeyError("communicators")
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                if unread is not None:
                    reason = f"lacks {exc}" if isinstance(exc, KeyError) else \
                        f"{type(exc).__name__}: {exc}"
                    unread.append(f"{path}: not a dump mpicoll wrote ({reason})")
                continue
            dumps[rank] = data
    return dumps


def _communicator(dump: dict[str, Any], index: int) -> dict[str, Any] | None:
    return next((c for c in dump["communicators"] if c["index"] == index), None)


def _key(comm: dict[str, Any] | None) -> Any:
    """What tells a communicator apart across the dumps: its members' world ranks and the
    tag its ranks agreed when it was made (a dup of the same ranks agreed another), or
    (dumps without them, the local backend) its index."""
    if comm is None:
        return None
    members = comm.get("members")
    return (tuple(members), comm.get("born_tag")) if members else comm["index"]


def _on(dump: dict[str, Any], key: Any) -> dict[str, Any] | None:
    """A rank's record of the communicator ``key`` (``_key``'s) tells, if it has one."""
    return next((c for c in dump["communicators"] if _key(c) == key), None)


def _stuck_elsewhere(dump: dict[str, Any], key: Any) -> dict[str, Any] | None:
    """The communicator (not the one of ``key``) whose call this rank is stuck in, if
    any: a rank "not in a call" here may wait in a split's, a dup's or a mesh's."""
    return next((c for c in dump["communicators"] if "in_call" in c and _key(c) != key), None)


def _elsewhere(comm: dict[str, Any]) -> str:
    """Where a rank stuck on another communicator waits, in words."""
    now = comm["in_call"]
    members = comm.get("members")
    of = f" (of world ranks {', '.join(map(str, members))})" if members else ""
    site = now.get("site")
    where = f"{now.get('collective', 'a step')} call #{now['seq']}" + (
        f" ({_short(site)})" if site else "")
    waits = f"; {now['waiting']}" if now.get("waiting") else ""
    return (f"{where} on communicator {comm['index']}{of}, stuck "
            f"{now.get('running_s', 0.0):.1f} s{waits}")


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _short(site: str) -> str:
    file, _, line = site.rpartition(":")
    return f"{os.path.basename(file)}:{line}"


def _call(record: dict[str, Any]) -> str:
    return f"call #{record['seq']} {record['collective']} ({_short(record['site'])})"


def explain(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """What went wrong, as lines of text (one screen)."""
    if not dumps:
        return ["no dumps (rank-<r>.json) found: was MPICOLL_DUMP_DIR set on every rank?"]
    # the communicator the job hangs in: the one most ranks' overdue calls are on, known
    # by its members' world ranks (a process's index of it may differ from another's:
    # split, dup on some ranks), else by that index
    stuck_on = [_key(_communicator(d, d["overdue"])) for d in dumps.values()
                if d.get("overdue") is not None]
    if not stuck_on:  # (no rank overdue: dumps written at exit) the first communicator
        stuck_on = [_key(_communicator(d, 0)) for d in dumps.values()]
    key = Counter(stuck_on).most_common(1)[0][0]
    states: dict[int, dict[str, Any]] = {}
    size = 0
    for rank, dump in dumps.items():
        comm = _on(dump, key)
        if comm is None:
            continue
        size = max(size, comm["size"])
        states[rank] = comm
    members = list(key[0]) if type(key) is tuple else list(range(size))
    world = members.__getitem__  # a rank of this communicator as MPI_COMM_WORLD's
    index = next((c["index"] for c in states.values()), 0)
    lines = [f"{len(dumps)} dump(s) of {size} rank(s); communicator {index}"
             + (f" (of world ranks {', '.join(map(str, members))})"
                if members != list(range(len(members))) else "")]

    # the call number the stuck ranks wait in
    waiting = {r: c for r, c in states.items() if "in_call" in c}
    target = (Counter(c["in_call"]["seq"] for c in waiting.values()).most_common(1)[0][0]
              if waiting else max((c["calls"][-1]["seq"] for c in states.values() if c["calls"]),
                                  default=0))

    def at(rank: int, seq: int) -> dict[str, Any] | None:
        return next((r for r in states[rank]["calls"] if r["seq"] == seq), None)

    # group the ranks by what they are doing
    groups: dict[str, list[int]] = {}
    waits: dict[str, list[str]] = {}
    elsewhere: dict[int, dict[str, Any]] = {}  # ranks stuck in another communicator's call
    stuck_key = key
    for rank in sorted(states):
        comm, calls = states[rank], states[rank]["calls"]
        last = calls[-1] if calls else None
        if "in_call" in comm:
            now = comm["in_call"]
            record = None if now.get("aside") else at(rank, now["seq"]) or last
            if record is None:  # a step that is not a numbered call (point-to-point, making
                # a Communicator), or a call the recorder has no entry of
                after = f" after call #{now['seq']}" if now["seq"] else ""
                site = now.get("site", "?:0")
                key = (f"in {now.get('collective', 'a step')}{after}"
                       f"{'' if site is None else f' ({_short(site)})'}, stuck "
                       f"{now['running_s']:.1f} s")
            else:
                key = (f"in {_call(record)}, algorithm {record.get('algorithm')}, stuck "
                       f"{now['running_s']:.1f} s")
            peer = (f"rank {rank} step {now['step']} waits for rank {world(now['peer'])} "
                    f"({now['kind']})" if 0 <= now.get("peer", -1) < len(members)
                    else f"rank {rank}: {now['waiting']}")
            waits.setdefault(key, []).append(peer)
        elif (other := _stuck_elsewhere(dumps[rank], stuck_key)) is not None:
            key = f"in {_elsewhere(other)}"
            elsewhere[rank] = other
        elif last is None:
            key = "made no call"
        else:
            key = f"not in a call; last {_call(last)}: {last['state']}"
            reason = dumps[rank]["reason"]
            if reason.startswith("exit"):
                key += f" -- then it left ({reason})"
            elif reason == "uncaught exception":  # (its traceback: on its stderr)
                key += " -- then it raised an uncaught exception, which ended the job"
        groups.setdefault(key, []).append(rank)
    for key, ranks in groups.items():
        lines.append(f"{_ranks(ranks)}: {key}")
        lines += [f"    {w}" for w in waits.get(key, [])]
    missing = [r for r in members if r not in dumps]
    if missing:
        lines.append(f"{_ranks(missing)}: no dump (killed, or gone before the others timed out)")

    # the verdict: what differs at the call the others wait in
    lines.append("")
    verdict = []
    kinds: dict[str, list[int]] = {}
    for rank in sorted(states):
        record = at(rank, target)
        if record is not None:
            kinds.setdefault(_call(record), []).append(rank)
    if len({k.split(" (")[0] for k in kinds}) > 1:
        verdict.append(f"mismatch at call #{target}: " + "; ".join(
            f"{_ranks(r)} called {k.split(' ', 2)[2]}" for k, r in kinds.items()))
    else:  # the same collective: what else its records say the ranks gave apart (a root
        # two ranks take, two algorithms' steps; not a broadcast's or scatter's algorithm,
        # which a repeated call records as its header's mover until the data goes)
        headed = any(k.split(" ")[2] in ("broadcast", "scatter") for k in kinds)
        for field in ("root", "op") if headed else ("root", "algorithm", "op"):
            given: dict[str, list[int]] = {}
            for rank in sorted(states):
                record = at(rank, target)
                if record is not None and record.get(field) is not None:
                    given.setdefault(str(record[field]), []).append(rank)
            if len(given) > 1:
                verdict.append(f"the ranks gave call #{target} another {field}: " + "; ".join(
                    f"{_ranks(r)} {field} {value}" for value, r in given.items()))
    asides = {r: c["in_call"] for r, c in waiting.items() if c["in_call"].get("aside")}
    behind: dict[str, list[int]] = {}
    for rank in sorted(states):
        record = at(rank, target)
        if record is None and rank in asides:  # (in a step of its own: said below)
            continue
        if record is None and rank in elsewhere:  # (said below: where it waits)
            continue
        if record is None:
            last = states[rank]["calls"][-1] if states[rank]["calls"] else None
            behind.setdefault(f"last {_call(last)}" if last else "no call", []).append(rank)
        elif record["state"].startswith(("failed", "refused")):
            verdict.append(f"rank {rank} failed {_call(record)}: {record['state']}")
    verdict += [f"{_ranks(r)} never reached call #{target} ({b})" for b, r in behind.items()]
    for rank in sorted(dumps):  # a rank that could not end its async calls at exit
        if dumps[rank].get("reason", "").startswith("exit with "):
            verdict.append(f"rank {rank} ended the job at its exit, "
                           f"{dumps[rank]['reason'].removeprefix('exit ')}")
    raised = sorted(r for r, d in dumps.items() if d.get("reason") == "uncaught exception")
    if raised:  # (first: the others' states follow from it, dumped or not)
        verdict.insert(0, f"{_ranks(raised)} raised an uncaught exception, which ended the "
                       "job: its traceback (on its stderr) says why")
    if missing:
        verdict.append(f"{_ranks(missing)} left no dump"
                       + (" (ended by the abort before writing one)" if raised
                          else ": look there first"))
    for rank, other in elsewhere.items():
        verdict.append(f"rank {rank} never reached call #{target} here: it is stuck "
                       f"in {_elsewhere(other)}")
        # there, the members not in that call (by their dumps): the ones it waits for
        seq, there = other["in_call"]["seq"], _key(other)
        for peer in sorted(dumps):
            theirs = _on(dumps[peer], there)
            if peer == rank or theirs is None or theirs.get("in_call", {}).get("seq") == seq:
                continue
            last = theirs["calls"][-1]["seq"] if theirs["calls"] else 0
            if last < seq:
                verdict.append(f"rank {peer} never reached call #{seq} on communicator "
                               f"{theirs['index']} (its last there: #{last})")
    for rank, now in asides.items():  # a point-to-point message, making a Communicator
        verdict.append(f"rank {rank} waits in {now.get('collective')}: {now['waiting']}")
    if not verdict and waiting:
        peers = sorted({world(c["in_call"]["peer"]) for c in waiting.values()
                        if 0 <= c["in_call"].get("peer", -1) < len(members)})
        them = _ranks(peers) if peers else "the library's own collective"
        gone = sorted(r for r in states if r not in waiting)
        if gone:  # (some finished the call and went on: what the others wait for is a
            # message they never sent, or one that went elsewhere)
            verdict.append(f"{_ranks(sorted(waiting))} wait in call #{target} for {them}; "
                           f"{_ranks(gone)}: in no call of it (finished it, or went on): "
                           "look for an argument they gave apart that the records do not "
                           "show (counts, a size)")
        else:
            verdict.append(f"every rank with a dump is in call #{target}; they wait for "
                           + them)
    lines += ["what went wrong: " + v for v in verdict] or ["what went wrong: nothing found"]
    return lines
