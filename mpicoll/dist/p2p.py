"""torch.distributed's point-to-point calls over the Communicator's: send, recv,
isend, irecv, batch_isend_irecv."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgumentError, MpicollError
from ..p2p import ANY, Status
from ..p2p import P2POp as _P2POp
from .collectives import _member, _root
from .groups import _STATE, ProcessGroup
from .work import Work

# -- point-to-point ------------------------------------------------------------------------


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    g = _member(group, "send")
    if g is not None:
        g.comm.send(tensor, _root(g, dst, group_dst, "dst"), tag)


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` (from any rank when ``src`` is None); the sender's rank
    (-1 outside the group)."""
    g = _member(group, "recv")
    if g is None:
        return -1
    source = ANY if src is None and group_src is None else _root(g, src, group_src, "src")
    status = Status()
    sender = g.comm.recv(tensor, source, tag, status)
    _received_whole(tensor, status, g, "recv")
    return g.ranks[sender]


def _received_whole(tensor: Any, status: Status, g: ProcessGroup, what: str) -> None:
    """torch's receives fill the tensor whole: a shorter message (which MPI takes into
    the tensor's first bytes) raises, rather than leave the rest as it was."""
    nbytes = getattr(tensor, "nbytes", None)
    if nbytes is not None and status.nbytes != nbytes:
        raise InvalidArgumentError(
            f"{what}: the message from rank {g.ranks[status.source]} (tag {status.tag}) had "
            f"{status.nbytes} bytes, the tensor {nbytes}: it holds them in its first bytes; "
            "torch.distributed's receives fill the whole tensor")


class _P2PWork(Work):
    """torch's Work of an isend/irecv: ``wait(timeout)``, ``is_completed()``,
    ``source_rank()`` (an irecv's sender, its rank in the Work's group, as torch's gloo
    backend gives it; ``source()`` the same), ``result()`` (``[tensor]``, once done)."""

    def __init__(self, request: Any, group: ProcessGroup, received: Any = None,
                 tensor: Any = None) -> None:
        self._request, self._group = request, group
        self._received = received  # an irecv's tensor, checked as received whole
        self._tensor = received if tensor is None else tensor

    def wait(self, timeout: Any = None) -> bool:
        """``timeout``: a timedelta (or seconds), as torch's; None or 0 (torch's default):
        no limit of its own (the watchdog's bounds it). Not done within it: a
        CollectiveTimeoutError, the message still pending (wait again, or let it end)."""
        status = Status()
        self._request.wait(status, timeout=timeout)
        if self._received is not None:
            _received_whole(self._received, status, self._group, "irecv")
        return True

    def is_completed(self) -> bool:
        return self._request.test()

    def synchronize(self) -> None:
        """torch's ``Work.synchronize()``: the message done, as ``wait()``."""
        self.wait()

    block_current_stream = synchronize  # (torch's newer name of the same)

    def source(self) -> int:
        if self._received is None:
            raise InvalidArgumentError("source(): a send's Work has no source (an irecv's has)")
        return self._request.wait()  # (the sender's rank in the group, as gloo's)

    source_rank = source  # torch's name

    def result(self) -> list[Any]:
        """``[tensor]``, the message's tensor, as torch's ``Work.result()`` (waits)."""
        self.wait()
        return [] if self._tensor is None else [self._tensor]

    def exception(self) -> BaseException | None:
        """The error of a message that ended in one (None: none, or not done yet)."""
        try:
            if not self._request.test():
                return None
            self.wait()
        except MpicollError as exc:
            return exc
        return None

    def is_success(self) -> bool:
        """Whether it ended without an error (never raises, as torch's)."""
        try:
            return self._request.test() and self.exception() is None
        except MpicollError:
            return False

    def get_future(self) -> Any:
        """torch's point-to-point Work has no future (gloo's and NCCL's raise): wait()."""
        raise InvalidArgumentError("get_future(): a point-to-point message's Work has no "
                                   "future (as torch's); use wait() or is_completed()")


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> _P2PWork | None:
    g = _member(group, "isend")
    if g is None:
        return None
    return _P2PWork(g.comm.isend(tensor, _root(g, dst, group_dst, "dst"), tag), g, None, tensor)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> _P2PWork | None:
    g = _member(group, "irecv")
    if g is None:
        return None
    source = ANY if src is None and group_src is None else _root(g, src, group_src, "src")
    return _P2PWork(g.comm.irecv(tensor, source, tag), g, tensor)


class P2POp:
    """One message of ``batch_isend_irecv``: ``P2POp(dist.isend, tensor, peer)``. As
    torch's, ``group`` None is the default group, and ``peer`` (a global rank) and
    ``group_peer`` (its rank in the group) are both set from the one given, where the
    group has it (else as given: ``batch_isend_irecv`` refuses it)."""

    def __init__(self, op: Any, tensor: Any, peer: int | None = None, group: Any = None,
                 tag: int = 0, group_peer: int | None = None) -> None:
        if getattr(op, "__name__", None) not in ("isend", "irecv"):  # (as torch's, made)
            raise InvalidArgumentError(f"P2POp: op must be dist.isend or dist.irecv, got "
                                       f"{getattr(op, '__name__', op)!r}")
        self.op, self.tensor, self.tag = op, tensor, tag
        self._given = (peer, group_peer)  # (what batch_isend_irecv resolves, and refuses)
        self.group = _STATE["world"] if group is None else group
        self.peer, self.group_peer = peer, group_peer
        g = self.group
        if isinstance(g, ProcessGroup):
            try:
                local = _root(g, peer, group_peer, "peer")
                self.peer, self.group_peer = g.ranks[local], local
            except MpicollError:
                pass


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[_P2PWork]:
    """Start every message of the list (all on one group, as torch's)."""
    try:
        p2p_op_list = list(p2p_op_list)
    except TypeError:
        raise InvalidArgumentError(f"batch_isend_irecv: expected a list of P2POp, got "
                                   f"{type(p2p_op_list).__name__}") from None
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise InvalidArgumentError(f"batch_isend_irecv: item {i} is a "
                                       f"{type(p).__name__}, expected a dist.P2POp")
    if not p2p_op_list:
        return []
    group = p2p_op_list[0].group
    if any(p.group is not group for p in p2p_op_list):  # (None: the default group, above)
        raise InvalidArgumentError("batch_isend_irecv: every P2POp must use the same group")
    g = _member(group, "batch_isend_irecv")
    if g is None:
        return []
    ops = [_P2POp(getattr(p.op, "__name__", p.op), p.tensor,
                  _root(g, *p._given, "peer"), p.tag) for p in p2p_op_list]
    return [_P2PWork(r, g, op.tensor if op.op == "irecv" else None, op.tensor)
            for r, op in zip(g.comm.batch_isend_irecv(ops), ops, strict=True)]
