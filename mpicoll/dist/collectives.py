"""torch.distributed's collectives over mpicoll's: torch's names, in-place semantics,
lists of tensors and their checks, the coalesced forms."""

from __future__ import annotations

import hashlib
import operator
import sys
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

from ..buffers import overlapping, overlaps_itself, writable
from ..buffers.arrays import as_array, is_cupy, module_of
from ..errors import InvalidArgumentError, MismatchError, MpicollError
from ..groups import agreed_rows
from ..pipeline.agree import op_text
from ..pipeline.validate import unordered
from .groups import (
    _STATE,
    GroupMember,
    ProcessGroup,
    ReduceOp,
    _group,
    _op,
    _outside,
    get_rank,
)
from ..work import program_frame
from .work import _Finished, _future_for

# -- collectives: torch's names and in-place semantics --------------------------------
#
# A problem one rank alone can see is settled as mpicoll's own calls settle it: in what
# the rank receives (its output tensors, lists), the rank takes part and then raises, so
# the others get their results and nothing is left queued; in what it gives (its input
# list, its split sizes), the call is made refused (the core call's ``_refusal``): this
# rank raises at once, every rank in check mode, and its next call resyncs.


def _member(group: Any, what: str) -> ProcessGroup | None:
    """The group a call of ``what`` runs on; None where this rank is outside it (torch's
    ``GroupMember.NON_GROUP_MEMBER``): there the call does nothing, with torch's warning."""
    if group is None:
        world = _STATE["world"]
        if world is not None:
            return world
    elif _outside(group):
        warnings.warn(f"Running {what} on global rank {get_rank()} which does not belong "
                      "to the given group.", stacklevel=3)
        return None
    return _group(group)




def _view(tensor: Any, name: str) -> Any:
    """The tensor's memory as an array (no copy)."""
    return as_array(tensor, name)[0]


def _given(tensor: Any, name: str) -> Any:
    """An input tensor's memory as an array; the tensor itself where it has none (the
    core call refuses it then, as it refuses its own inputs)."""
    try:
        return _view(tensor, name)
    except MpicollError:
        return tensor


def _given_list(tensors: Any) -> bool:
    """Whether a rank gave a list (torch: None and [] are none; anything else is one,
    checked as a list)."""
    return tensors is not None and not (isinstance(tensors, (list, tuple)) and not tensors)


def _is_array(a: Any) -> bool:
    return type(a) is np.ndarray or is_cupy(a)


def _read_only(view: Any, name: str) -> str | None:
    """What is wrong with ``view`` as memory a call writes its result into, if anything."""
    if type(view) is np.ndarray and not view.flags.writeable:
        return f"{name}: must be a writeable array (it is read-only)"
    if overlaps_itself(view):
        return str(overlapping(name))
    return None


def _tensors(tensors: Any, name: str, count: int, like: Any, written: bool = False,
             any_size: bool = False) -> tuple[list[Any], str | None]:
    """Views of a list of ``count`` tensors of ``like``'s size and dtype (torch's rule for a
    collective's list; ``any_size``: its dtype alone), or what is wrong with it;
    ``written``: the call writes into them (so none may be read-only)."""
    if not isinstance(tensors, (list, tuple)):
        return [], f"{name}: expected a list of {count} tensors, got {type(tensors).__name__}"
    if len(tensors) != count:
        return [], f"{name}: expected {count} tensors (one per rank of the group), got {len(tensors)}"
    views = []
    for i, t in enumerate(tensors):
        try:
            view = _view(t, f"{name}[{i}]")
        except MpicollError as exc:
            return [], str(exc)
        first = like if _is_array(like) else views[0] if views else view
        if module_of(view) is not module_of(first):
            return [], (f"{name}[{i}]: a {module_of(view).__name__} array among "
                        f"{module_of(first).__name__} ones")
        if _is_array(like) and any_size and view.dtype != like.dtype:
            return [], (f"{name}[{i}]: expected {like.dtype} (as the tensor), got "
                        f"{view.dtype}")
        if _is_array(like) and not any_size and (view.size != like.size or
                                                  view.dtype != like.dtype):
            return [], (f"{name}[{i}]: expected {like.size} elements of {like.dtype} (as the "
                        f"tensor), got shape {tuple(view.shape)} of {view.dtype}")
        wrong = _read_only(view, f"{name}[{i}]") if written else None
        if wrong is not None:
            return [], wrong
        views.append(view)
    return views, None


def _nothing(result: Any) -> None:
    return None


def _listed(tensors: Any) -> list[Any]:
    """A list-of-tensors output as its future's value: the tensors themselves, flat, as
    gloo's (and torch's MPI backend's) ``all_gather``, ``gather`` and ``all_to_all`` give."""
    return list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]


def _maybe(work: Any, async_op: bool, value: Sequence[Any] = ()) -> Any:
    return _Finished(work, _nothing, value) if async_op else None


def _other_dtype(out: Any, x: Any, name: str, source: str) -> str | None:
    """What is wrong with an output of another dtype than the input it receives (named
    as the caller named both), or None (the core call checks the rest)."""
    if _is_array(out) and _is_array(x) and out.dtype != x.dtype:
        return f"{name}: expected dtype {x.dtype} (as {source}), got {out.dtype}"
    return None


def _no_output(output: Any, name: str) -> str | None:
    """What is wrong with an output given as None (torch writes the result into it: the
    call would make one and drop it); None where one is given (the core call checks it)."""
    return f"{name}: expected the tensor to receive the result, got None" \
        if output is None else None


def _unpack(outs: list[Any], flat: Any, received: Sequence[int], name: str) -> None:
    """A v-call's result (``flat``: every rank's elements in rank order, ``received`` of
    each) into the list's tensors ``outs``, where each holds what its rank sent."""
    sizes = [o.size for o in outs]
    if list(received) != sizes:
        raise InvalidArgumentError(f"{name}: this rank received {list(received)} elements "
                                   f"from the ranks, its tensors hold {sizes}")
    _split_into(outs, flat)


def _split_into(outs: Sequence[Any], flat: Any) -> None:
    """``flat``'s elements into the tensors ``outs``, in order, each its size's run."""
    start = 0
    for view in outs:
        view[...] = flat[start:start + view.size].reshape(view.shape)
        start += view.size


def _then(call: Any, args: tuple, finish: Any, problem: str | None,
          value: Sequence[Any] = (), **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, then ``finish(result)`` (at ``wait()`` where kwargs hold
    ``async_op=True``: a Work whose future gives ``value``, the output tensors); where
    this rank found a ``problem`` in what it receives, it takes part (the call made as the
    others make it, async too, and waited for), then raises."""
    result = call(*args, **kwargs)
    if problem is not None:
        if kwargs.get("async_op"):
            result.wait()
        raise InvalidArgumentError(problem)
    if kwargs.get("async_op"):
        return _Finished(result, finish, value)
    finish(result)
    return None


def _refused(call: Any, problem: str, algorithm: str, async_op: bool) -> NoReturn:
    """``call`` (as the others make it, async too) refused on this rank for ``problem`` in
    what it gives (see above): it raises."""
    call(None, _refusal=InvalidArgumentError(problem), **_how(algorithm, async_op))
    raise InvalidArgumentError(problem)  # (not reached: the refused call raises it)


def _refused_by(call: Any, args: tuple, problem: str, algorithm: str, async_op: bool) -> NoReturn:
    """``call(*args)`` (as the others make it, async too), whose own exchange refuses what
    is wrong here on every rank (a v-variant's counts), then this rank raises ``problem``
    (also where the call took it: torch's rule is the stricter)."""
    try:
        work = call(*args, **_how(algorithm, async_op))
        if async_op:
            work.wait()
    except MpicollError as exc:
        raise InvalidArgumentError(problem) from exc
    raise InvalidArgumentError(problem)


def _shaped(tensor: Any, name: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """(``tensor``'s memory in ``shape``, what copies a result into it afterwards): a view
    where the reshape is one, else a new array copied into the tensor at the end."""
    view = _view(tensor, name)
    shaped = view.reshape(shape)
    same = np.shares_memory(shaped, view) if type(view) is np.ndarray else \
        shaped.data.ptr == view.data.ptr
    if same or view.size == 0:
        return shaped, _nothing
    shaped = module_of(view).empty(shape, view.dtype)

    def copy_back(result: Any) -> None:
        view[...] = shaped.reshape(view.shape)

    return shaped, copy_back


def _named(exc: InvalidArgumentError, **names: str) -> None:
    """The core call's refusal of its ``x`` or ``out=`` in the caller's names (torch's:
    ``x="tensor", out="tensor"`` for an in-place call's one tensor), made in ``exc``
    (raised again as it is, its cause and traceback kept)."""
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
    for name, torchs in names.items():
        if text.startswith(f"{name}: "):
            exc.args = (f"{torchs}: {text.removeprefix(f'{name}: ')}", *exc.args[1:])
            return


def _how(algorithm: str, async_op: bool) -> dict[str, Any]:
    """The keywords a call passes on: the program's line that called (the call's site,
    ``_site``, which no decision is keyed by), and no others where they are the defaults,
    so that the call is keyed for its kept decision as the same direct call is
    (``pipeline.decided``)."""
    if algorithm == "auto" and not async_op:
        return {"_site": program_frame()}
    return {"algorithm": algorithm, "async_op": async_op, "_site": program_frame()}


def _root(g: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    """The group rank of torch's ``src``/``dst`` (a global rank) or ``group_src``/
    ``group_dst`` (a rank of the group): one of them."""
    if group_rank is None:
        if rank is None:
            raise InvalidArgumentError(f"{name}: give {name} (a global rank) or group_{name}")
        return g.local(rank, name)
    if rank is not None:
        raise InvalidArgumentError(f"{name}: give {name} or group_{name}, not both")
    if not isinstance(group_rank, (int, np.integer)) or isinstance(group_rank, bool) \
            or not 0 <= group_rank < g.comm.size:
        raise InvalidArgumentError(
            f"group_{name}: expected a rank of the group (0..{g.comm.size - 1}), got {group_rank!r}")
    return int(group_rank)


def _root_of(g: ProcessGroup, call: Any, rank: int | None, group_rank: int | None,
             name: str, algorithm: str, async_op: bool) -> int:
    """``_root``; a bad one is ``call`` refused (what this rank gives)."""
    try:
        return _root(g, rank, group_rank, name)
    except InvalidArgumentError as exc:
        _refused(call, str(exc), algorithm, async_op)


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False,
               algorithm: str = "auto") -> Any:
    """Reduce ``tensor`` across the group, in place."""
    g = _STATE["world"] if group is None else None
    if g is None:
        g = _member(group, "all_reduce")
        if g is None:
            return None
    try:
        if algorithm == "auto" and not async_op:  # the most frequent call, nothing between
            g.comm.all_reduce(tensor, op._value_ if type(op) is ReduceOp else _op(op),
                              out=tensor, _site=sys._getframe(1))
            return None
        return _maybe(g.comm.all_reduce(tensor, _op(op), out=tensor,
                                        **_how(algorithm, async_op)), async_op, [tensor])
    except InvalidArgumentError as exc:
        _named(exc, x="tensor", out="tensor")
        raise


def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None, algorithm: str = "auto") -> Any:
    """``src``'s tensor into every rank's ``tensor``."""
    g = _member(group, "broadcast")
    if g is None:
        return None
    root = _root_of(g, g.comm.broadcast, src, group_src, "src", algorithm, async_op)
    try:  # a number: the call could not write into it (torch refuses it too)
        writable(tensor, "tensor")
        problem = None
    except InvalidArgumentError as exc:
        problem = str(exc)
    return _then(g.comm.broadcast, (tensor, root), _nothing, problem, [tensor],
                 **_how(algorithm, async_op))


def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None,
           algorithm: str = "auto") -> Any:
    """Reduce into ``dst``'s ``tensor`` (the others' are left as they were)."""
    g = _member(group, "reduce")
    if g is None:
        return None
    root = _root_of(g, g.comm.reduce, dst, group_dst, "dst", algorithm, async_op)
    out = tensor if g.comm.rank == root else None
    try:  # a number: torch refuses it on every rank (the root's call cannot write into
        writable(tensor, "tensor")  # it; the others take part, then raise)
        problem = None
    except InvalidArgumentError as exc:
        problem = str(exc)
    try:
        return _then(g.comm.reduce, (tensor, _op(op), root), _nothing, problem, [tensor],
                     out=out, **_how(algorithm, async_op))
    except InvalidArgumentError as exc:
        _named(exc, x="tensor", out="tensor")
        raise


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False,
               algorithm: str = "auto") -> Any:
    """Every rank's ``tensor`` into ``tensor_list[rank]``, on every rank."""
    g = _member(group, "all_gather")
    if g is None:
        return None
    x = _given(tensor, "tensor")
    # every rank's tensor may have a size of its own (torch: "uneven sized tensors are
    # supported"): all_gather_v of them flat, whose counts exchange agrees the sizes
    outs, problem = _tensors(tensor_list, "tensor_list", g.comm.size, x, written=True,
                             any_size=True)

    def finish(result: Any) -> None:
        _unpack(outs, *result, "tensor_list")

    return _then(g.comm.all_gather_v, (x.reshape(-1) if _is_array(x) else x,), finish,
                 problem, _listed(tensor_list), **_how(algorithm, async_op))


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False, algorithm: str = "auto") -> Any:
    """Every rank's input, concatenated (or stacked) in rank order, into ``output_tensor``."""
    g = _member(group, "all_gather_into_tensor")
    if g is None:
        return None
    x = _given(input_tensor, "input_tensor")
    shape = (g.comm.size, *getattr(x, "shape", ()))
    try:
        out = _view(output_tensor, "output_tensor")
    except MpicollError as exc:
        return _then(g.comm.all_gather, (x,), _nothing, str(exc), **_how(algorithm, async_op))
    wrong = f"output_tensor: expected {int(np.prod(shape))} elements (the group's " \
        f"{g.comm.size} inputs of shape {shape[1:]}), got shape {tuple(out.shape)}" \
        if out.size != int(np.prod(shape)) else \
        _other_dtype(out, x, "output_tensor", "input_tensor") or _read_only(out, "output_tensor")
    if wrong is not None:  # (taking part, then refused: nothing written)
        return _then(g.comm.all_gather, (x,), _nothing, wrong, **_how(algorithm, async_op))
    out, copy_back = _shaped(output_tensor, "output_tensor", shape)
    return _then(g.comm.all_gather, (x,), copy_back, None, [output_tensor], out=out,
                 **_how(algorithm, async_op))


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM,
                   group: Any = None, async_op: bool = False, algorithm: str = "auto") -> Any:
    """Reduce ``input_list[j]`` across ranks into rank j's ``output``."""
    g = _member(group, "reduce_scatter")
    if g is None:
        return None
    rows, problem = _tensors(input_list, "input_list", g.comm.size, None)
    if problem is None and len({(r.shape, r.dtype, module_of(r)) for r in rows}) > 1:
        problem = "input_list: tensors of one shape and dtype, in one array library"
    if problem is not None:  # what it gives: refused
        return _refused(g.comm.reduce_scatter, problem, algorithm, async_op)
    stacked = module_of(rows[0]).stack(rows)
    out = _given(output, "output")
    if _is_array(out) and out.size == rows[0].size:
        stacked = stacked.reshape(len(rows), *out.shape)  # (any shape of that size, as torch)
    return _reduced_into(g, stacked, op, output, out, "input_list's tensors", algorithm,
                         async_op)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,  # noqa: A002
                          group: Any = None, async_op: bool = False,
                          algorithm: str = "auto") -> Any:
    """Reduce ``input`` (the group's blocks, concatenated) and keep this rank's block."""
    g = _member(group, "reduce_scatter_tensor")
    if g is None:
        return None
    out, x = _given(output, "output"), _given(input, "input")
    p = g.comm.size
    if _is_array(x):
        if x.size % p:  # what it gives: refused
            return _refused(g.comm.reduce_scatter,
                            f"input: its {x.size} elements do not split into the group's {p} "
                            "blocks", algorithm, async_op)
        # read: a copy is fine; a wrong output: the core call takes part, then refuses it
        x = x.reshape(p, *out.shape) if _is_array(out) and out.size * p == x.size else \
            x.reshape(p, -1)
    return _reduced_into(g, x, op, output, out, "input", algorithm, async_op)


def _reduced_into(g: ProcessGroup, rows: Any, op: Any, output: Any, out: Any, source: str,
                  algorithm: str, async_op: bool) -> Any:
    """reduce_scatter of ``rows`` (the group's blocks, named ``source`` as the caller named
    them) into ``output`` (``out``: its array). An output of another dtype: this rank takes
    part, then refuses it in the caller's names (nothing written); any other wrong output:
    the core call takes part, then refuses it (None: this function)."""
    other = _other_dtype(out, rows, "output", source)
    if other is not None:
        return _then(g.comm.reduce_scatter, (rows, _op(op)), _nothing, other,
                     **_how(algorithm, async_op))
    try:
        return _then(g.comm.reduce_scatter, (rows, _op(op)), _nothing,
                     _no_output(output, "output"), [output], out=output,
                     **_how(algorithm, async_op))
    except InvalidArgumentError as exc:
        _named(exc, out="output")
        raise


# torch 2.13's names for the single-tensor forms (the older names are deprecated there)
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor


# -- the coalesced forms: many tensors as one call over their concatenation. torch does not
# check that the ranks' lists match ("individual shape checking is not implemented"): two
# lists of one total size but other shapes would combine the wrong elements, silently. So
# every rank's list (shapes, dtype, array library, op, algorithm, async_op) is agreed first,
# in one small exchange of a number for it, and any rank's refusal with it: every rank
# raises. That exchange is made as the call is entered, with async_op=True too (as check
# mode agrees every asynchronous call): the call returns once every rank has entered it.

def _coalesced(tensors: Any, name: str, one: bool = True) -> tuple[list[Any], str | None]:
    """Views of a list of tensors of one dtype and array library (``one``: a tensor alone
    is a list of it, as torch's all_reduce_coalesced takes it), or what is wrong with them."""
    if not isinstance(tensors, (list, tuple)):
        if not one:
            return [], f"{name}: expected a list of tensors, got {type(tensors).__name__}"
        tensors = [tensors]
    views = []
    for i, t in enumerate(tensors):
        try:
            writable(t, f"{name}[{i}]")  # (a number: no tensor, as torch's refuses it)
            view = _view(t, f"{name}[{i}]")
        except MpicollError as exc:
            return [], str(exc)
        if views and (view.dtype != views[0].dtype or module_of(view) is not module_of(views[0])):
            return [], (f"{name}[{i}]: {_kind(t, view)} among {_kind(tensors[0], views[0])} "
                        "tensors (all of one dtype, as torch's)")
        views.append(view)
    return views, None


def _kind(tensor: Any, view: Any) -> str:
    """A tensor's dtype as its caller names it: torch.float32, numpy float32, cupy int8."""
    dtype = getattr(tensor, "dtype", None)
    if type(tensor).__module__.split(".")[0] == "torch" and dtype is not None:
        return str(dtype)
    return f"{module_of(view).__name__} {view.dtype}"


def _layout(views: Sequence[Any], *more: Any) -> int:
    """A number for a list's shapes, dtype and array library, and ``more``, alike on every
    rank that gives the same (63 bits of BLAKE2b: not Python's per-process hash)."""
    described = [(tuple(v.shape), str(v.dtype), module_of(v).__name__) for v in views]
    digest = hashlib.blake2b(repr((described, *more)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _agree_lists(g: ProcessGroup, what: str, problem: str | None, layout: int) -> None:
    """Every rank's refusal and layout in one numbered step of the group (a rank making
    another call meanwhile: check mode raises, the watchdog bounds it); any refusal, or a
    layout other than the group's first rank's, raises on every rank, naming the ranks."""
    table = agreed_rows(g.comm, np.array([problem is not None, 0 if problem else layout],
                                         np.int64), sys._getframe(2), what)
    refused = np.flatnonzero(table[:, 0]).tolist()
    if refused:
        if problem is not None:
            raise InvalidArgumentError(f"{what}: {problem}")
        raise InvalidArgumentError(f"{what}: refused on rank(s) {_global(g, refused)} (their "
                                   "tensors); nothing was sent")
    differ = np.flatnonzero(table[:, 1] != table[0, 1]).tolist()
    if differ:
        raise MismatchError(
            f"{what}: rank(s) {_global(g, differ)} give other tensors (number, shapes or dtype), "
            f"op or algorithm than rank {g.ranks[0]}; every rank gives the same list")


def _done_future(value: list[Any]) -> Any:
    future = _future_for(value)
    future.set_result(value)
    return future


def _global(g: ProcessGroup, ranks: Sequence[int]) -> str:
    return ", ".join(str(g.ranks[r]) for r in ranks)


def all_reduce_coalesced(tensors: Any, op: Any = ReduceOp.SUM, group: Any = None,
                         async_op: bool = False, algorithm: str = "auto") -> Any:
    """Reduce each tensor of ``tensors`` (of one dtype) in place, as one all_reduce of
    their concatenation; with ``async_op=True``, a Future of the tensors, as torch's. The
    ranks' lists are agreed first, as the call is entered (torch's are not checked: see
    above)."""
    g = _member(group, "all_reduce_coalesced")
    if g is None:
        return None
    views, problem = _coalesced(tensors, "tensors")
    for i, view in enumerate(views):
        problem = problem or _read_only(view, f"tensors[{i}]")
    try:  # (the op as check mode compares it: a user's Op by its name, not its address)
        op_named = op_text(_op(op))
    except MpicollError as exc:
        op_named, problem = "", problem or str(exc)
    _agree_lists(g, "all_reduce_coalesced", problem,
                 _layout(views, op_named, algorithm, async_op))
    if not views:  # (every rank's list is empty: nothing to send)
        return _done_future([]) if async_op else None
    xp = module_of(views[0])
    flat = xp.concatenate([v.reshape(-1) for v in views])

    def finish(result: Any) -> None:
        _split_into(views, flat)

    work = _then(g.comm.all_reduce, (flat, _op(op)), finish, None, _listed(tensors),
                 out=flat, **_how(algorithm, async_op))
    return work.get_future() if async_op else None


def all_gather_coalesced(output_tensor_lists: Any, input_tensor_list: Any, group: Any = None,
                         async_op: bool = False, algorithm: str = "auto") -> Any:
    """Every rank's ``input_tensor_list`` into ``output_tensor_lists[rank]`` (a list of
    tensors shaped as the inputs), as one all_gather of their concatenation; with
    ``async_op=True``, a Future of the output lists, as torch's. The ranks' input lists
    are agreed first, as the call is entered (torch's are not checked: see above)."""
    g = _member(group, "all_gather_coalesced")
    if g is None:
        return None
    views, problem = _coalesced(input_tensor_list, "input_tensor_list", one=False)
    outs: list[list[Any]] = []
    if problem is None:
        if not isinstance(output_tensor_lists, (list, tuple)) or \
                len(output_tensor_lists) != g.comm.size:
            problem = (f"output_tensor_lists: expected a list of {g.comm.size} lists (one per "
                       "rank of the group)")
        for r, row in enumerate(output_tensor_lists if problem is None else ()):
            got, problem = _coalesced(row, f"output_tensor_lists[{r}]", one=False)
            if problem is None and len(got) != len(views):
                problem = (f"output_tensor_lists[{r}]: expected {len(views)} tensors (as "
                           f"input_tensor_list), got {len(got)}")
            for k, (out, view) in enumerate(zip(got, views, strict=True) if problem is None
                                            else ()):
                name = f"output_tensor_lists[{r}][{k}]"
                problem = problem or (
                    f"{name}: expected {view.size} elements of {module_of(view).__name__} "
                    f"{view.dtype} (as input_tensor_list[{k}]), got shape {tuple(out.shape)} "
                    f"of {module_of(out).__name__} {out.dtype}"
                    if out.size != view.size or out.dtype != view.dtype or
                    module_of(out) is not module_of(view) else _read_only(out, name))
            if problem is not None:
                break
            outs.append(got)
    _agree_lists(g, "all_gather_coalesced", problem, _layout(views, algorithm, async_op))
    # the future's value: the output lists (the one list where the group has one rank), as
    # gloo's
    rows = [list(row) for row in output_tensor_lists]
    value = rows[0] if len(rows) == 1 else rows
    if not views:  # (every rank's list is empty: nothing to send)
        return _done_future(value) if async_op else None
    flat = module_of(views[0]).concatenate([v.reshape(-1) for v in views])

    def finish(rows: Any) -> None:
        for row, got in zip(rows, outs, strict=True):
            _split_into(got, row)

    work = _then(g.comm.all_gather, (flat,), finish, None, value, **_how(algorithm, async_op))
    return work.get_future() if async_op else None


def _whole(value: Any) -> int | None:
    """``value`` as an int where it is one (not a bool, not a float): else None."""
    if isinstance(value, (bool, np.bool_)) or "bool" in str(getattr(value, "dtype", "")) \
            or getattr(value, "ndim", 0) != 0:  # (a 0-d array or tensor of ints: one)
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _splits(sizes: Sequence[int] | None, rows: int, p: int, name: str) -> tuple[list[int], str | None]:
    """torch's split sizes (rows of dim 0 per rank; even when None) for a tensor of
    ``rows`` rows, or what is wrong with them."""
    if sizes is None:
        if rows % p:
            return [], f"{name}: {rows} rows do not split evenly over {p} ranks (give split sizes)"
        return [rows // p] * p, None
    if unordered(sizes):
        return [], f"{name}_split_sizes: expected {p} ints in rank order, got {sizes!r}"
    try:
        values = list(sizes)
    except Exception:  # noqa: BLE001 - as new_group's: refused on every rank
        return [], f"{name}_split_sizes: expected {p} ints, got {sizes!r}"
    whole = [_whole(v) for v in values]  # (ints, NumPy's, or torch's 0-d int tensors:
    # list(torch.tensor(sizes)), as torch takes them; summed as ints, not as uint8 that wrap)
    if len(values) != p or any(v is None or v < 0 for v in whole):
        return [], f"{name}_split_sizes: expected {p} non-negative ints, got {values}"
    values = whole
    if sum(values) != rows:
        return [], (f"{name}_split_sizes: they sum to {sum(values)}, but the {name} has "
                    f"{rows} rows (dim 0)")
    return values, None


def all_to_all_single(output: Any, input: Any, output_split_sizes: Sequence[int] | None = None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None = None, group: Any = None,
                      async_op: bool = False, algorithm: str = "auto") -> Any:
    """Block j of ``input`` (along the first dimension) to rank j; block i of ``output``
    from rank i (even blocks, or the split sizes). One collective whether split sizes are
    given or not (all_to_all_v: its counts exchange agrees what every rank sends), so a
    rank that gives even sizes meets one that gives None, as in torch."""
    g = _member(group, "all_to_all_single")
    if g is None:
        return None
    p = g.comm.size
    made = g.comm.all_to_all_v
    x = _given(input, "input")
    problem = f"input: expected a tensor, got {type(input).__name__}" \
        if not hasattr(x, "shape") else \
        "input: needs at least one dimension (dim 0 is split)" if x.ndim == 0 else None
    send: list[int] = []
    if problem is None:
        send, problem = _splits(input_split_sizes, x.shape[0], p, "input")
    if problem is not None:  # all_to_all_v's counts exchange refuses it on every rank
        _refused_by(made, (None, None), problem, algorithm, async_op)
    out, expect, problem = None, [], None
    try:
        out = _view(output, "output")
        writable(output, "output")
        problem = _read_only(out, "output")
    except MpicollError as exc:
        problem = str(exc)
    if problem is None and (out.ndim == 0 or out.dtype != x.dtype):
        problem = (f"output: expected a tensor of {x.dtype} (as the input) with a dim 0, got "
                   f"shape {tuple(out.shape)} of {out.dtype}")
    if problem is None and output_split_sizes is None and input_split_sizes is None:
        # torch: without split sizes, an output of any shape of the input's size
        if out.size != x.size:
            problem = f"output: expected {x.size} elements (as the input), got shape {tuple(out.shape)}"
        expect = [x.shape[0] // max(p, 1)] * p
    elif problem is None:
        expect, problem = _splits(output_split_sizes, out.shape[0], p, "output")
        if problem is None and out.shape[1:] != x.shape[1:]:
            problem = (f"output: expected rows of shape {tuple(x.shape[1:])} (as the input's), "
                       f"got shape {tuple(out.shape)}")

    def finish(result: Any) -> None:
        rows, received = result
        if list(received) != expect:
            given = "output_split_sizes" if output_split_sizes is not None else \
                "output_split_sizes (None: even blocks)"
            raise InvalidArgumentError(
                f"{given}: this rank received {list(received)} rows from the ranks, "
                f"expected {expect} (the senders' input_split_sizes differ)")
        out[...] = rows.reshape(out.shape)  # (rows in rank order: any shape of their size)

    return _then(made, (x, send), finish, problem, [output], **_how(algorithm, async_op))


def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False, algorithm: str = "auto") -> Any:
    """``input_tensor_list[j]`` to rank j; ``output_tensor_list[i]`` from rank i."""
    g = _member(group, "all_to_all")
    if g is None:
        return None
    p = g.comm.size
    ins, problem = _tensors(input_tensor_list, "input_tensor_list", p, None)
    if problem is None and len({a.dtype for a in ins}) > 1:
        problem = f"input_tensor_list: tensors of one dtype, got {sorted({str(a.dtype) for a in ins})}"
    if problem is not None:  # (all_to_all_v's counts exchange refuses it on every rank)
        _refused_by(g.comm.all_to_all_v, (None, None), problem, algorithm, async_op)
    flat = module_of(ins[0]).concatenate([a.reshape(-1) for a in ins]) if ins else None
    outs, problem = _tensors(output_tensor_list, "output_tensor_list", p, None, written=True)
    if problem is None and any(o.dtype != flat.dtype for o in outs):
        problem = f"output_tensor_list: tensors of the inputs' dtype {flat.dtype}"

    def finish(result: Any) -> None:
        _unpack(outs, *result, "output_tensor_list")

    return _then(g.comm.all_to_all_v, (flat, [a.size for a in ins]), finish, problem,
                 _listed(output_tensor_list), **_how(algorithm, async_op))


def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None,
            algorithm: str = "auto") -> Any:
    """``scatter_list[j]`` of ``src`` into rank j's ``tensor``."""
    g = _member(group, "scatter")
    if g is None:
        return None
    root = _root_of(g, g.comm.scatter, 0 if src is None and group_src is None else src,
                    group_src, "src", algorithm, async_op)
    stacked, refusal, problem = None, None, None
    if g.comm.rank == root:
        like = _given(tensor, "tensor")
        rows, wrong = _tensors(scatter_list, "scatter_list", g.comm.size, like) \
            if _given_list(scatter_list) else ([], "scatter_list: must be given on the source rank")
        if wrong is not None:
            refusal = InvalidArgumentError(wrong)
        else:
            shape = like.shape if _is_array(like) else rows[0].shape
            if any(r.size != rows[0].size or r.dtype != rows[0].dtype for r in rows):
                refusal = InvalidArgumentError("scatter_list: tensors of one size and dtype")
            else:
                stacked = module_of(rows[0]).stack([r.reshape(shape) for r in rows])
    elif _given_list(scatter_list):
        problem = "scatter_list: must not be given on a rank that is not the source (as torch)"
    problem = problem or _no_output(tensor, "tensor")
    if refusal is not None:  # (async too: the root waits for the call, then raises it)
        problem = str(refusal)
    try:  # a refused list travels in the root's header: every rank raises
        return _then(g.comm.scatter, (stacked, root), _nothing, problem, [tensor],
                     out=tensor, **_how(algorithm, async_op))
    except InvalidArgumentError as exc:
        if refusal is not None:
            raise refusal from exc
        raise


def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None,
           algorithm: str = "auto") -> Any:
    """Every rank's ``tensor`` into ``dst``'s ``gather_list``."""
    g = _member(group, "gather")
    if g is None:
        return None
    root = _root_of(g, g.comm.gather, 0 if dst is None and group_dst is None else dst,
                    group_dst, "dst", algorithm, async_op)
    x = _given(tensor, "tensor")
    if g.comm.rank == root:
        outs, problem = _tensors(gather_list, "gather_list", g.comm.size, x,
                                 written=True) \
            if _given_list(gather_list) else ([], "gather_list: must be given on the destination rank")
    else:
        outs, problem = [], ("gather_list: must not be given on a rank that is not the "
                             "destination (as torch)") if _given_list(gather_list) else None

    def finish(rows: Any) -> None:
        for view, row in zip(outs, rows if rows is not None else (), strict=True):
            view[...] = row.reshape(view.shape)

    return _then(g.comm.gather, (x, root), finish, problem,
                 _listed(gather_list) if outs else [], **_how(algorithm, async_op))


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None,
            timeout: Any = None, algorithm: str = "auto") -> Any:
    """``timeout``: a timedelta (or seconds), as torch's: the barrier not done within it
    raises CollectiveTimeoutError naming the ranks not there yet (as monitored_barrier);
    None: the group's own timeout bounds it, as every call. With ``async_op=True`` give
    the timeout to the Work's ``wait()``."""
    g = _member(group, "barrier")
    if g is None:
        return None
    if timeout is not None and not async_op:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
        g.comm.monitored_barrier(seconds, _site=program_frame())
        return None
    return _maybe(g.comm.barrier(**_how(algorithm, async_op)), async_op)


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    g = _member(group, "monitored_barrier")
    if g is None:
        return
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    g.comm.monitored_barrier(seconds, wait_all_ranks, _site=program_frame())


