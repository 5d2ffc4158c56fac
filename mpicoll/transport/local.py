"""The local transport: N ranks as threads of one process, for tests and teaching.

Each (source, dest) pair has a FIFO mailbox. A send copies the bytes into the mailbox and
returns at once (an eager, buffered send); a receive waits for the next message of its
pair, checks that its tag and size match what the algorithm expects, and copies it out.
A receive that waits too long, or whose world was aborted because another rank raised,
raises instead of hanging.

    (``mpicoll.local.run_local`` runs a function on N thread-ranks with Communicators.)
"""

from __future__ import annotations

import operator
import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..buffers.arrays import assign_from_host
from ..errors import (
    AbortedError,
    CollectiveError,
    CollectiveTimeoutError,
    InvalidArgumentError,
    MismatchError,
)
from . import Status, Workspace, cut_short


class LocalWorld:
    """The shared state of N thread-ranks: one mailbox per (source, dest) pair."""

    def __init__(self, size: int, timeout: float | None = None) -> None:
        from ..observe.watchdog import timeout_setting

        try:
            ranks = operator.index(size)  # (an int or NumPy's, not 2.0 or True)
        except TypeError:
            ranks = 0
        if ranks < 1 or isinstance(size, bool):
            raise InvalidArgumentError(f"size: expected a number of ranks >= 1, got {size!r}")
        self.size = ranks
        # MPICOLL_TIMEOUT when set, else a minute (0: no limit); seconds >= 0 or ConfigError
        self.timeout = timeout_setting(None) if timeout is None and os.environ.get(
            "MPICOLL_TIMEOUT", "").strip() else timeout_setting(60.0 if timeout is None else timeout)
        self.aborted = threading.Event()
        self.mailboxes = [[queue.SimpleQueue() for _ in range(size)] for _ in range(size)]
        self.board = PeerBoard()  # the program's own point-to-point messages
        self._duplicates: dict[int, LocalWorld] = {}
        self._subworlds: dict[tuple[int, int], LocalWorld] = {}
        self._lock = threading.Lock()

    def duplicate(self, index: int) -> LocalWorld:
        """The ``index``-th duplicate of this world (made by the first rank that asks):
        its own mailboxes, and aborted together with this one."""
        with self._lock:
            if index not in self._duplicates:
                twin = LocalWorld(self.size, self.timeout)
                twin.aborted = self.aborted
                self._duplicates[index] = twin
            return self._duplicates[index]

    def subworld(self, split: int, color: int, size: int) -> LocalWorld:
        """The world of ``color`` in this world's ``split``-th split (made by the first of
        its ranks that asks), aborted together with this one."""
        with self._lock:
            key = (split, color)
            if key not in self._subworlds:
                sub = LocalWorld(size, self.timeout)
                sub.aborted = self.aborted
                self._subworlds[key] = sub
            return self._subworlds[key]

    def endpoint(self, rank: int) -> LocalTransport:
        if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < self.size:
            raise InvalidArgumentError(f"rank: expected a rank of this world, 0..{self.size - 1}, "
                                       f"got {rank!r}")
        return LocalTransport(self, int(rank))


class PeerBoard:
    """The point-to-point messages of a LocalWorld's ranks: posted in order, taken by the
    first that matches (source or any, tag), as MPI matches them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: list[tuple[int, int, int, bytes]] = []  # (source, dest, tag, data)
        self.posted = 0  # messages posted so far (a waiting receive wakes when it grows)

    def post(self, source: int, dest: int, tag: int, data: bytes) -> None:
        with self.cond:
            self.messages.append((source, dest, tag, data))
            self.posted += 1
            self.cond.notify_all()

    def _match(self, dest: int, source: int, tag: int) -> int:
        for i, (s, d, t, _) in enumerate(self.messages):
            if d == dest and (tag < 0 or t == tag) and (source < 0 or s == source):
                return i
        return -1

    def await_new(self, seen: int, seconds: float) -> None:
        """Wait (at most ``seconds``, a twentieth of a second at a time) until a message
        is posted after the ``seen``-th."""
        with self.cond:
            if self.posted == seen and seconds > 0:
                self.cond.wait(min(seconds, 0.05))

    def take(self, dest: int, source: int, tag: int, buf: Any) -> Status | None:
        """Receive the first matching message (source and tag: either may be mpicoll.ANY)
        into ``buf``, without waiting: its Status, or None while there is none. ``buf``
        None: look, leaving the message where it is (a probe)."""
        with self.cond:
            i = self._match(dest, source, tag)
            if i < 0:
                return None
            s, _, t, data = self.messages[i]
            if buf is None:
                return Status(s, t, len(data))
            del self.messages[i]
        if len(data) > buf.nbytes:  # as MPI: taken, cut short to the buffer's first bytes
            assign_from_host(buf.reshape(-1).view(np.uint8),
                             np.frombuffer(data, np.uint8)[:buf.nbytes])
            raise cut_short(s, t, buf.nbytes)
        assign_from_host(buf.reshape(-1).view(np.uint8)[:len(data)], np.frombuffer(data, np.uint8))
        return Status(s, t, len(data))


class LocalPeers:
    """One thread-rank's point-to-point messages (``comm.send``/``recv``), on its world's
    board: never mixed with the collectives' mailboxes.

    Matching as MPI's: a message goes to the receives in the order they were posted. So
    before any receive (or probe) looks at the board, the irecvs posted before it take,
    in order, each the first message it matches, if one is there; what they leave is the
    later receive's. A posted irecv that has no message yet never holds a later receive
    up (a later ``recv(source=ANY)`` takes the message of another rank). A matching pass
    holds the board (its condition's lock, which ``take`` takes again) from the first
    irecv's look to the last: a message another rank posted in between would otherwise
    go to a later receive, past the earlier irecv that found none a moment before."""

    def __init__(self, transport: LocalTransport) -> None:
        self.transport, self.rank = transport, transport.rank
        self.board = transport.world.board
        self.max_tag = (1 << 31) - 1
        self.posted: list[LocalPeerRequest] = []  # irecvs not yet matched, in posting order
        self.lock = threading.RLock()  # the board's matching, one thread of the rank at a time

    def progress(self, before: Any = None) -> None:
        """The posted irecvs (those before ``before``) take their messages, in order."""
        for request in list(self.posted):
            if request is before:
                break
            request.try_take()

    def take(self, buf: Any, source: int, tag: int, request: Any = None) -> Status | None:
        """Wait (up to the timeout) for the first message for (source, tag) that no receive
        posted earlier takes, into ``buf`` (None: look only); or, given a posted
        ``request``, until it has taken its message (its Status; None: cut short)."""
        t = self.transport
        limit = t.timeout or float("inf")
        deadline = time.monotonic() + limit
        while True:
            seen = self.board.posted
            got = None
            with self.lock, self.board.cond:  # (the whole pass, as the class says)
                self.progress(request)
                if request is None:
                    got = self.board.take(self.rank, source, tag, buf)
                else:  # (taken by its own matching, or, in another thread, by another's)
                    request.try_take()
                    if request.finished:
                        return request.got
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                t.world.aborted.set()
                raise CollectiveTimeoutError(
                    f"mpicoll: timeout: rank {self.rank}: no message from "
                    f"{'any rank' if source < 0 else f'rank {source}'} (tag {tag}) in "
                    f"{t.timeout:g} s")
            if t.world.aborted.is_set():
                raise AbortedError(f"rank {self.rank}: another rank failed; giving up")
            self.board.await_new(seen, left)

    def send(self, buf: Any, dest: int, tag: int) -> None:
        self.board.post(self.rank, dest, tag, _host_bytes(buf))

    def recv(self, buf: Any, source: int, tag: int) -> Status:
        return self.take(buf, source, tag)

    def probe(self, source: int, tag: int, wait: bool) -> Status | None:
        """The next matching message's Status, left to be received (None: none yet,
        where ``wait`` is False). As MPI's, it sees only what no posted receive takes."""
        if wait:
            return self.take(None, source, tag)
        with self.lock, self.board.cond:
            self.progress()
            return self.board.take(self.rank, source, tag, None)

    def sendrecv(self, sendbuf: Any, dest: int, send_tag: int, recvbuf: Any, source: int,
                 recv_tag: int) -> Status:
        self.send(sendbuf, dest, send_tag)
        return self.recv(recvbuf, source, recv_tag)

    def isend(self, buf: Any, dest: int, tag: int) -> LocalPeerRequest:
        self.send(buf, dest, tag)  # buffered: complete at once
        return LocalPeerRequest(self, None, -1, tag, done=True)

    def irecv(self, buf: Any, source: int, tag: int) -> LocalPeerRequest:
        request = LocalPeerRequest(self, buf, source, tag)
        self.posted.append(request)
        return request

    def free(self) -> None:
        """Nothing to release."""


class LocalPeerRequest:
    def __init__(self, peers: LocalPeers, buf: Any, source: int, tag: int,
                 done: bool = False) -> None:
        self.peers, self.buf, self.source, self.tag = peers, buf, source, tag
        self.finished, self.got = done, None
        self.error: Exception | None = None  # cut short (raised at every wait)
        self._told = False  # whether a test() has raised the error yet

    def try_take(self) -> None:
        """Take this receive's message if it is on the board (its error kept, raised by
        its own wait or test, not by the receive that ran the matching)."""
        if self.finished:
            return
        try:
            got = self.peers.board.take(self.peers.rank, self.source, self.tag, self.buf)
        except CollectiveError as error:
            self.error = error
            self._done(None)
            return
        if got is not None:
            self._done(got)

    def _done(self, got: Status | None) -> None:
        self.got, self.finished = got, True
        if self in self.peers.posted:
            self.peers.posted.remove(self)

    def _raise(self) -> None:
        self._told = True
        raise CollectiveError(str(self.error)) from self.error

    def wait(self) -> Status | None:
        if not self.finished:
            self.peers.take(self.buf, self.source, self.tag, request=self)
        if self.error is not None:
            self._raise()
        return self.got

    def test(self) -> bool:
        p = self.peers
        if not self.finished:
            if not p.lock.acquire(False):
                return False  # (another thread of the rank matches now)
            try:
                with p.board.cond:
                    p.progress(before=self)
                    self.try_take()
            finally:
                p.lock.release()
        if self.error is not None and not self._told:
            self._raise()
        return self.finished


def _host_bytes(buf: Any) -> bytes:
    return buf.tobytes() if type(buf) is np.ndarray else buf.get().tobytes()


class _Recv:
    """A posted receive; the local transport completes it in waitall, in posting order."""

    __slots__ = ("buf", "source")

    def __init__(self, buf: np.ndarray, source: int) -> None:
        self.buf, self.source = buf, source


class LocalTransport(Workspace):
    """One thread-rank's end of a LocalWorld."""

    def __init__(self, world: LocalWorld, rank: int) -> None:
        super().__init__()
        self.world, self.rank, self.size = world, rank, world.size
        self.tag = 0
        self.timeout = world.timeout  # seconds a receive waits (0: no limit); Communicator(timeout=)
        self.step, self.wait_kind, self.wait_peer = 0, None, -1  # for the watchdog's reports
        self.side_tags = 1 << 40  # the pipeline's resync tags: above every call's
        self.job_rank = rank  # this thread-rank in the first world (a split's endpoint: its)
        self._duplicates = 0
        self._held: dict[int, tuple[int, bytes]] = {}  # a later call's message, by source

    def duplicate(self) -> LocalTransport:
        """This rank's endpoint of a duplicate world (every rank calls it in turn, as
        MPI_Comm_dup)."""
        self._duplicates += 1
        twin = self.world.duplicate(self._duplicates).endpoint(self.rank)
        twin.job_rank = self.job_rank
        return twin

    def begin(self, like: Any = None) -> None:
        self.tag += 1
        self._start_call(like)

    def synchronize(self) -> None:
        """Nothing to wait for: a local call has finished when it returns."""

    def free(self) -> None:
        """The workspace given back; the world's mailboxes go with the last reference."""
        self.let_go()

    def send(self, buf: np.ndarray, dest: int) -> None:
        # (the world given up: no message of a later call goes out, which a rank still in
        # an earlier one would take for a mismatch)
        if self.world.aborted.is_set():
            raise AbortedError(f"rank {self.rank}: another rank failed; giving up")
        self.world.mailboxes[self.rank][dest].put((self.tag, buf.tobytes()))

    def recv(self, buf: np.ndarray, source: int) -> None:
        self.step += 1
        self.wait_kind, self.wait_peer = "recv", source
        if not self._take(buf, source, self.timeout or float("inf")):
            self.world.aborted.set()
            raise CollectiveTimeoutError(
                f"mpicoll: timeout: rank {self.rank}: no message from rank {source} "
                f"in {self.timeout:g} s (receive, tag {self.tag}, step {self.step})")

    def try_recv(self, buf: np.ndarray, source: int, seconds: float) -> bool:
        """Receive into ``buf`` if the message comes within ``seconds``; whether it came.
        A later call's message (its sender has gone on: a monitored barrier's rank that
        raised) is kept for that call, not taken for a mismatch: False."""
        self.step += 1
        self.wait_kind, self.wait_peer = "recv", source
        return self._take(buf, source, max(seconds, 0.0), trying=True)

    def post(self, buf: np.ndarray, dest: int) -> None:
        """Send without waiting (every local send is buffered)."""
        self.send(buf, dest)

    def _take(self, buf: np.ndarray, source: int, seconds: float, trying: bool = False) -> bool:
        box = self.world.mailboxes[source][self.rank]
        deadline = time.monotonic() + seconds
        while True:
            if self.world.aborted.is_set():
                raise AbortedError(f"rank {self.rank}: another rank failed; giving up")
            held = self._held.pop(source, None)  # (a later call's, kept by a try_recv)
            if held is not None:
                tag, data = held
            else:
                try:
                    tag, data = box.get(timeout=min(0.05, max(deadline - time.monotonic(),
                                                              0.001)))
                except queue.Empty:
                    if time.monotonic() > deadline:
                        return False
                    continue
            if trying and tag > self.tag:  # (its sender is in a later call: kept for it)
                self._held[source] = (tag, data)
                return False
            if tag >= self.tag:
                break
            # an earlier call's message that no receive took (that call was refused):
            # as in MPI, it never matches a later call
        if tag != self.tag or len(data) != buf.nbytes:
            if self.world.aborted.is_set():  # (a later call's, sent as the world gave up)
                raise AbortedError(f"rank {self.rank}: another rank failed; giving up")
            self.world.aborted.set()
            raise MismatchError(
                f"rank {self.rank}: message from rank {source} has tag {tag} and "
                f"{len(data)} bytes; expected tag {self.tag} and {buf.nbytes} bytes "
                "(the ranks are not in the same call)"
            )
        assign_from_host(buf.view(np.uint8), np.frombuffer(data, np.uint8))
        return True

    def sendrecv(self, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int) -> None:
        self.send(sendbuf, dest)
        self.recv(recvbuf, source)

    def isend(self, buf: np.ndarray, dest: int) -> None:
        self.send(buf, dest)
        return None

    def irecv(self, buf: np.ndarray, source: int) -> _Recv:
        return _Recv(buf, source)

    def waitall(self, requests: Sequence[Any]) -> None:
        for request in requests:
            if request is not None:
                self.recv(request.buf, request.source)
