"""torch.distributed's *_object collectives: picklable objects, from ranks you trust."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..buffers.arrays import cupy_module
from ..errors import InvalidArgumentError
from ..p2p import ANY
from ..work import program_frame
from .collectives import _member, _root, _root_of
from .groups import ProcessGroup, get_rank

# -- objects: torch's *_object collectives ---------------------------------------------------
#
# As torch's, each object goes as its pickle (a control path, never the arrays' data path:
# only for objects from ranks you trust; unpickling runs code). The bytes go as uint8 arrays
# through the v-collectives and broadcast, whose headers carry every size, each piece after
# a status byte: an object that cannot be pickled goes as its error's text instead, so its
# rank takes part and every rank that receives the piece raises, naming the rank.

_PICKLED, _FAILED = 0, 1


def _packed(obj: Any, name: str, rank: int) -> np.ndarray:
    """``obj``'s pickle after the status byte (or, where it has none, why)."""
    try:
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - any object's own error, named
        return _failed(f"{name} on rank {rank} cannot be pickled "
                       f"({type(exc).__name__}: {exc})")
    return np.frombuffer(bytes([_PICKLED]) + body, np.uint8)


def _failed(why: str) -> np.ndarray:
    """A piece that says why its object is not there (``_unpacked`` raises it)."""
    return np.frombuffer(bytes([_FAILED]) + why.encode(), np.uint8)


def _unpacked(pieces: Sequence[np.ndarray], name: str) -> list[Any]:
    """The objects of ``_packed`` pieces; a piece that says its object failed raises."""
    failed = [bytes(p[1:]).decode(errors="replace") for p in pieces if p[0] == _FAILED]
    if failed:
        raise InvalidArgumentError("; ".join(failed))
    objects = []
    for piece in pieces:
        try:
            objects.append(pickle.loads(piece[1:].tobytes()))
        except Exception as exc:  # noqa: BLE001 - the sender's class unknown here, and the like
            raise InvalidArgumentError(f"{name}: an object received cannot be unpickled here "
                                       f"({type(exc).__name__}: {exc})") from exc
    return objects


def _sent(g: ProcessGroup, data: np.ndarray | None) -> Any:
    """The bytes as the group's backend moves them: on nccl, GPU arrays (CuPy)."""
    if data is None or g.comm.backend != "nccl":
        return data
    return cupy_module().asarray(data)


def _got(data: Any) -> np.ndarray:
    """Received bytes on the host."""
    return data if data is None or type(data) is np.ndarray else data.get()


def _rows(data: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """``data`` cut into consecutive pieces of ``counts`` bytes."""
    ends = np.cumsum([0, *counts])
    return [data[ends[i]:ends[i + 1]] for i in range(len(counts))]


def _a_list(given: Any, length: int | None) -> bool:
    return isinstance(given, list) and (length is None or len(given) == length)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Every rank's ``obj`` into ``object_list`` (one entry per rank of the group)."""
    g = _member(group, "all_gather_object")
    if g is None:
        return
    gathered, counts = g.comm.all_gather_v(_sent(g, _packed(obj, "obj", get_rank())),
                                         _site=program_frame())
    objects = _unpacked(_rows(_got(gathered), counts), "object_list")
    if not _a_list(object_list, g.comm.size):  # (it took part: the others have theirs)
        raise InvalidArgumentError(f"object_list: expected a list of {g.comm.size} entries "
                                   "(one per rank of the group)")
    object_list[:] = objects


def gather_object(obj: Any, object_gather_list: list[Any] | None = None,
                  dst: int | None = None, group: Any = None,
                  group_dst: int | None = None) -> None:
    """Every rank's ``obj`` into ``dst``'s ``object_gather_list``."""
    g = _member(group, "gather_object")
    if g is None:
        return
    root = _root_of(g, g.comm.gather_v, 0 if dst is None and group_dst is None else dst,
                    group_dst, "dst", "auto", False)
    piece = _packed(obj, "obj", get_rank())
    gathered, counts = g.comm.gather_v(_sent(g, piece), root, _site=program_frame())
    if g.comm.rank != root:
        if piece[0] == _FAILED:  # its own object: it took part, and raises
            _unpacked([piece], "obj")
        if object_gather_list is not None and not (isinstance(object_gather_list, list)
                                                   and not object_gather_list):
            raise InvalidArgumentError("object_gather_list: must not be given on a rank that "
                                       "is not the destination (None or [], as torch)")
        return
    objects = _unpacked(_rows(_got(gathered), counts), "object_gather_list")
    if not _a_list(object_gather_list, g.comm.size):
        raise InvalidArgumentError(f"object_gather_list: expected a list of {g.comm.size} "
                                   "entries on the destination rank")
    object_gather_list[:] = objects  # type: ignore[index]


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """``src``'s objects into every rank's ``object_list`` (of the same length)."""
    g = _member(group, "broadcast_object_list")
    if g is None:
        return
    root = _root_of(g, g.comm.broadcast, 0 if src is None and group_src is None else src,
                    group_src, "src", "auto", False)
    mine = g.comm.rank == root
    sent = None
    # the source only reads its objects: a tuple too, as torch's (the others' are written)
    readable = isinstance(object_list, (list, tuple))
    if mine:  # (neither: why, in the packet, so every rank raises)
        sent = _packed(list(object_list), "object_list", get_rank()) \
            if readable else _failed(
                f"object_list on rank {get_rank()} (the source): expected a list, got "
                f"{type(object_list).__name__}")
    received = _got(g.comm.broadcast(_sent(g, sent), root, _site=program_frame()))  # (size: in the header)
    if mine:  # the source keeps its own objects (it raises where they failed to pickle)
        if sent[0] == _FAILED:  # type: ignore[index]
            _unpacked([sent], "object_list")  # type: ignore[list-item]
        if not readable:
            raise InvalidArgumentError("object_list: expected a list")
        return
    (objects,) = _unpacked([received], "object_list")
    if not _a_list(object_list, None) or len(objects) != len(object_list):
        raise InvalidArgumentError(f"object_list: expected a list of {len(objects)} entries, "
                                   "as the source's")
    object_list[:] = objects


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    """The j-th of ``src``'s ``scatter_object_input_list`` into rank j's
    ``scatter_object_output_list[0]``."""
    g = _member(group, "scatter_object_list")
    if g is None:
        return
    root, size = _root_of(g, g.comm.scatter_v, 0 if src is None and group_src is None
                          else src, group_src, "src", "auto", False), g.comm.size
    data = counts = None
    if g.comm.rank == root:
        problem = None
        if _a_list(scatter_object_input_list, size):
            pieces = [_packed(obj, "scatter_object_input_list", get_rank())
                      for obj in scatter_object_input_list]  # type: ignore[union-attr]
            failed = [piece for piece in pieces if piece[0] == _FAILED]
            problem = failed[0] if failed else None
        else:
            problem = _failed(f"scatter_object_input_list on rank {get_rank()}: expected a "
                              f"list of {size} objects on the source rank")
        if problem is not None:  # every rank is told (the source too), each the reason
            pieces = [problem] * size
        data, counts = np.concatenate(pieces), [piece.size for piece in pieces]
    mine = _got(g.comm.scatter_v(_sent(g, data), counts, root, _site=program_frame()))
    (obj,) = _unpacked([mine], "scatter_object_output_list")
    if not _a_list(scatter_object_output_list, None) or not scatter_object_output_list:
        raise InvalidArgumentError("scatter_object_output_list: expected a list of at least "
                                   "one entry (its first receives the object)")
    scatter_object_output_list[0] = obj


def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None,
                     use_batch: bool = False) -> None:
    """``object_list``'s objects to ``dst``, as torch's: their pickles' sizes, then the
    pickles (the receiver's list has as many entries). An object that cannot be pickled
    goes as that reason: the receiver raises it, and so does this rank, after sending.
    ``use_batch``: how torch's messages go (batched or not); the same messages here."""
    g = _member(group, "send_object_list")
    if g is None:
        return
    peer = _root(g, dst, group_dst, "dst")
    if not isinstance(object_list, list):
        raise InvalidArgumentError(f"object_list: expected a list, got {type(object_list).__name__}")
    pieces = [_packed(obj, f"object_list[{i}]", get_rank()) for i, obj in enumerate(object_list)]
    g.comm.send(_sent(g, np.array([piece.size for piece in pieces], np.int64)), peer)
    g.comm.send(_sent(g, np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)), peer)
    failed = [piece for piece in pieces if piece[0] == _FAILED]
    if failed:
        _unpacked(failed, "object_list")


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None,
                     use_batch: bool = False) -> int:
    """``send_object_list``'s objects into ``object_list`` (as many entries as were sent),
    from ``src`` or any rank; the sender's rank (-1 outside the group), as torch's."""
    g = _member(group, "recv_object_list")
    if g is None:
        return -1
    if not isinstance(object_list, list):
        raise InvalidArgumentError(f"object_list: expected a list, got {type(object_list).__name__}")
    source = ANY if src is None and group_src is None else _root(g, src, group_src, "src")
    sent = len(object_list)
    if g.comm.backend != "nccl":  # the sizes looked at first: a list of another length
        status = g.comm.probe(source, 0)  # still takes both messages, then raises (NCCL
        source, sent = status.source, status.nbytes // 8  # cannot look: exact sizes)
    sizes = _sent(g, np.zeros(sent, np.int64))
    sender = g.comm.recv(sizes, source, 0)
    counts = [int(n) for n in _got(sizes)]
    data = _sent(g, np.empty(sum(counts), np.uint8))
    g.comm.recv(data, sender, 0)
    if sent != len(object_list):
        raise InvalidArgumentError(f"object_list: rank {g.ranks[sender]} sent {sent} objects, "
                                   f"the list has {len(object_list)} entries (as torch, the "
                                   "receiver's list has as many as the sender's)")
    object_list[:] = _unpacked(_rows(_got(data), counts), "object_list")
    return g.ranks[sender]


