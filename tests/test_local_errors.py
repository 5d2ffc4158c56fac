"""Refusals on the local transport: clear errors, raised before any message, on every rank."""

from __future__ import annotations

import numpy as np
import pytest

import mpicoll
from mpicoll.local import run_local
from mpicoll.transport.local import LocalWorld


def _raises_everywhere(size, body, exc, match):
    """Every rank raises ``exc``; the errors are collected instead of aborting the world."""

    def wrapped(comm):
        with pytest.raises(exc, match=match):
            body(comm)
        return True

    assert run_local(size, wrapped, timeout=5) == [True] * size


def test_unknown_algorithm_names_the_valid_ones():
    _raises_everywhere(3, lambda c: c.all_gather(np.ones(2), algorithm="brick"),
                       mpicoll.InvalidArgumentError, "expected 'auto' or one of ring, recursive_doubling")


def test_a_reduction_names_its_op_before_its_root():
    """The first refusal is the one raised: a reduction checks x, op and the algorithm,
    then the root (gather, without an op, checks the root first)."""
    _raises_everywhere(3, lambda c: c.reduce(np.ones(2), "bogus", 5),
                       mpicoll.InvalidArgumentError, "op: unknown")
    _raises_everywhere(3, lambda c: c.reduce(np.ones(2), "sum", 5, algorithm="brick"),
                       mpicoll.InvalidArgumentError, "expected 'auto' or one of")
    _raises_everywhere(3, lambda c: c.gather(np.ones(2), 5, algorithm="brick"),
                       mpicoll.InvalidArgumentError, "root: 5 is out of range")


def test_native_is_not_on_the_local_backend():
    _raises_everywhere(2, lambda c: c.barrier(algorithm="native"),
                       mpicoll.InvalidArgumentError, "'native' needs a library collective")


def test_input_must_be_an_array():
    _raises_everywhere(2, lambda c: c.all_reduce([1, 2, 3]), mpicoll.InvalidArgumentError,
                       r"x: expected a NumPy or CuPy array \(or any __dlpack__ tensor\), got list")
    _raises_everywhere(2, lambda c: c.all_gather(np.array([object()])), TypeError, "Python objects")


def test_out_must_fit():
    _raises_everywhere(2, lambda c: c.all_reduce(np.ones(3), out=np.ones(4)),
                       mpicoll.InvalidArgumentError, r"out: expected shape \(3,\)")
    read_only = np.ones(4)
    read_only.flags.writeable = False
    _raises_everywhere(2, lambda c: c.all_reduce(np.ones(4), out=read_only),
                       mpicoll.InvalidArgumentError, "out: must be a writeable array")


def test_scatter_without_rows_at_the_root():
    def body(comm):
        x = np.ones(3) if comm.rank == 1 else None
        exc = mpicoll.InvalidArgumentError if comm.rank == 1 else mpicoll.RemoteError
        with pytest.raises(exc, match="one row per rank|root 1 refused"):
            comm.scatter(x, root=1)
        return comm.all_reduce(np.ones(1))  # still usable

    for got in run_local(4, body, timeout=5):
        np.testing.assert_array_equal(got, [4])


def test_check_mode_finds_a_shape_mismatch():
    def body(comm):
        x = np.ones(3 if comm.rank != 2 else 4)
        with pytest.raises(mpicoll.MismatchError, match="rank 2 differs in shape"):
            comm.all_reduce(x)
        return True

    assert run_local(4, body, timeout=5, check=True) == [True] * 4


def test_check_mode_names_the_rank_apart_from_the_others_even_rank_0():
    """The ranks named are those apart from what most ranks called: rank 0 alone wrong
    is rank 0 (it named every other rank, as if rank 0's call were the reference)."""
    def body(comm):
        option = {"inter": "recursive_doubling"} if comm.rank == 0 else {"inter": "ring"}
        with pytest.raises(mpicoll.MismatchError) as raised:
            comm.all_reduce(np.ones(3), algorithm="hierarchical", **option)
        said = str(raised.value)
        assert "rank 0 differs in algorithm" in said and "rank 1 differs" not in said \
            and "rank 2 differs" not in said and "; rank 1: all_reduce" in said, said
        # every field apart on a rank of its own: each is named, with no reference rank
        x = [np.ones(3), np.ones(3, np.int32), np.ones(4)][comm.rank]
        op = ["sum", "max", "max"][comm.rank]
        root = [0, 0, 1][comm.rank]
        with pytest.raises(mpicoll.MismatchError) as raised:
            comm.reduce(x, op, root=root)
        said = str(raised.value)
        assert "rank 0 differs in op" in said and "rank 1 differs in dtype" in said \
            and "rank 2 differs in" in said, said
        return comm.all_reduce(np.ones(1))

    for got in run_local(3, body, timeout=5, check=True):
        np.testing.assert_array_equal(got, [3])


@pytest.mark.parametrize("collective", ["broadcast", "scatter"])
def test_check_mode_holds_a_receivers_buffer_to_the_roots_data(collective):
    """A broadcast's (scatter's) data is the root's: a receiver whose buffer (out=) is of
    another shape or dtype is the rank named, not the root, even where the receivers
    that give None leave the root alone in its shape (a tie went to the lowest rank)."""
    root = 2

    def body(comm):
        wrong = np.zeros(4) if collective == "broadcast" else np.zeros(2, np.float32)
        if collective == "broadcast":
            x = np.arange(3.0) if comm.rank == root else wrong if comm.rank == 1 else None
            call = lambda: comm.broadcast(x, root)  # noqa: E731
        else:
            x = np.ones((comm.size, 2)) if comm.rank == root else None
            out = wrong if comm.rank == 1 else None
            call = lambda: comm.scatter(x, root, out=out)  # noqa: E731
        with pytest.raises(mpicoll.MismatchError) as raised:
            call()
        said = str(raised.value)
        assert f"rank 1 differs in {'shape' if collective == 'broadcast' else 'dtype'}" in said \
            and "rank 2 differs" not in said and f"; rank {root}: {collective}" in said, said
        return comm.all_reduce(np.ones(1))

    for got in run_local(4, body, timeout=5, check=True):
        np.testing.assert_array_equal(got, [4])


def test_backend_and_comm_are_checked():
    with pytest.raises(mpicoll.InvalidArgumentError, match="backend: unknown"):
        mpicoll.Communicator(None, backend="gloo")
    with pytest.raises(mpicoll.InvalidArgumentError, match="comm: backend 'local'"):
        mpicoll.Communicator(None, backend="local")
    world = LocalWorld(1)
    assert mpicoll.Communicator(world.endpoint(0), backend="local").size == 1


def test_tuning_options_are_checked():
    _raises_everywhere(2, lambda c: c.broadcast(np.ones(2), algorithm="knomial", radix=1),
                       mpicoll.InvalidArgumentError, "radix: expected an int >= 2, got 1")
    _raises_everywhere(2, lambda c: c.broadcast(np.ones(2), algorithm="binomial", radix=4),
                       mpicoll.InvalidArgumentError, "takes no option 'radix'")
    _raises_everywhere(2, lambda c: c.all_reduce(np.ones(2), segment_bytes=64),
                       mpicoll.InvalidArgumentError, "need a named algorithm, not 'auto'")
    _raises_everywhere(2, lambda c: c.all_reduce(np.ones(2), algorithm="ring_pipelined",
                                                 segment_bytes=True),
                       mpicoll.InvalidArgumentError, "segment_bytes: expected an int")


def test_bruck_all_to_all_v_runs_on_equal_blocks_and_refuses_others_everywhere():
    """The counts' exchange tells every rank whether every block is alike: bruck runs
    there, and is refused on every rank where one rank's blocks differ."""
    def body(comm):
        rows, counts = comm.all_to_all_v(np.full((6, 2), comm.rank), [2] * 3, algorithm="bruck")
        assert counts == [2] * 3 and (rows[:, 0] == np.repeat(range(3), 2)).all()
        return True

    assert run_local(3, body, timeout=5) == [True] * 3
    _raises_everywhere(3, lambda c: c.all_to_all_v(np.ones(3), [1, 1, 1] if c.rank else [0, 1, 2],
                                                   algorithm="bruck"),
                       mpicoll.InvalidArgumentError,
                       "'bruck' needs equal blocks; for uneven counts use one of linear, pairwise")
    _raises_everywhere(3, lambda c: c.all_to_all_v(np.ones(3), [1, 1, 1] if c.rank else [0, 1, 2],
                                                   algorithm=np.str_("bruck")),  # (as 'bruck',
                       mpicoll.InvalidArgumentError,  # not np.str_('bruck'))
                       "all_to_all 'bruck' needs equal blocks")


@pytest.mark.parametrize("collective", ["all_to_all_v", "all_gather_v", "gather_v"])
def test_v_variants_whose_ranks_name_two_algorithms_raise_on_every_rank(collective):
    """Outside check mode too: the counts' exchange carries each rank's algorithm (ranks
    that ran two waited for each other until the timeout)."""
    others, apart = {"all_to_all_v": ("pairwise", "linear"),
                     "all_gather_v": ("ring", "recursive_doubling"),
                     "gather_v": ("binomial", "linear")}[collective]

    def body(comm):
        algorithm = apart if comm.rank == 2 else others
        x = np.ones((comm.size, 2))
        call = {"all_to_all_v": lambda: comm.all_to_all_v(x, [1] * comm.size, algorithm=algorithm),
                "all_gather_v": lambda: comm.all_gather_v(x, algorithm=algorithm),
                "gather_v": lambda: comm.gather_v(x, algorithm=algorithm)}[collective]
        with pytest.raises(mpicoll.MismatchError, match=r"disagree on the algorithm .*: "
                                                        r"rank\(s\) 2 name another than rank\(s\) 0, 1, 3"):
            call()
        return comm.all_reduce(np.ones(1))[0]

    assert run_local(4, body, timeout=5) == [4.0] * 4


def test_v_variant_counts_are_checked():
    _raises_everywhere(3, lambda c: c.all_to_all_v(np.ones(3), [1, 1]),
                       mpicoll.InvalidArgumentError, "send_counts: expecting 3 items")
    _raises_everywhere(3, lambda c: c.all_to_all_v(np.ones(3), [1, 1, 2]),
                       mpicoll.InvalidArgumentError, "send_counts: they add up to 4, but x has 3")
    _raises_everywhere(3, lambda c: c.reduce_scatter(np.ones(3), counts=[1, -1, 3]),
                       mpicoll.InvalidArgumentError, "counts: expected non-negative ints")
    _raises_everywhere(3, lambda c: c.all_gather_v(np.float64(1.0)),
                       mpicoll.InvalidArgumentError, "at least one dimension")
    # a dict's keys or a set: no rank order (a dict of ranks' counts would run as its keys)
    _raises_everywhere(2, lambda c: c.reduce_scatter(np.arange(3.), counts={2: 0, 1: 0}),
                       mpicoll.InvalidArgumentError, "counts: expected a sequence of 2 ints "
                       "in rank order, got dict, which has no order")
    _raises_everywhere(2, lambda c: c.all_to_all_v(np.arange(3.), {1, 2}),
                       mpicoll.InvalidArgumentError, "got set, which has no order")
    _raises_everywhere(2, lambda c: c.reduce_scatter(np.arange(3.), counts={1: 0, 2: 0}.keys()),
                       mpicoll.InvalidArgumentError, "got dict_keys, which has no order")


@pytest.mark.parametrize("apart", [0, 1])
def test_v_variants_find_a_dtype_mismatch_on_every_rank(apart):
    """The rank named is the one apart from the others, rank 0 too (it named every
    other rank, as if rank 0's call were the reference)."""
    def body(comm):
        x = np.ones((comm.rank, 2), "f4" if comm.rank != apart else "f8")
        said = rf"rank\(s\) {apart} differ from the others"
        with pytest.raises(mpicoll.MismatchError, match=said):
            comm.all_gather_v(x)
        with pytest.raises(mpicoll.MismatchError, match=said):
            comm.all_to_all_v(np.ones((comm.size, 2), x.dtype), [1] * comm.size)
        return True

    assert all(run_local(4, body, timeout=5))


@pytest.mark.parametrize("algorithm", ["linear", "binomial", "auto"])
def test_gather_v_ranks_that_disagree_on_the_root_raise_on_every_rank(algorithm):
    """Outside check mode too: the rows' exchange carries each rank's root (where no rank
    took the root's part, every rank only sent and returned None, silently)."""
    def body(comm):
        root = 0 if comm.rank == 1 else 1
        with pytest.raises(mpicoll.MismatchError,
                           match=r"disagree on the root: rank\(s\) 1 \(root 0\) apart from "
                                 r"the others' root 1"):
            comm.gather_v(np.ones((2, 2)), root=root, algorithm=algorithm)
        return comm.all_reduce(np.ones(1))[0]

    assert run_local(3, body, timeout=5) == [3.0] * 3


def test_scatter_v_refusals_reach_every_rank():
    def body(comm):
        root = 2
        x = np.ones((5, 2)) if comm.rank == root else None
        exc = mpicoll.InvalidArgumentError if comm.rank == root else mpicoll.RemoteError
        with pytest.raises(exc, match="counts: they add up to 4, but x has 5 rows|root 2 refused"):
            comm.scatter_v(x, [1, 1, 1, 1] if comm.rank == root else None, root)
        # a non-root's own counts that differ from the root's: it takes part, then refuses
        mine = [2, 1, 1, 1] if comm.rank != 0 else [1, 1, 1, 2]
        if comm.rank == 0:
            with pytest.raises(mpicoll.InvalidArgumentError, match="differ from the root's"):
                comm.scatter_v(x, mine if comm.rank != root else [2, 1, 1, 1], root)
        else:
            got = comm.scatter_v(x, mine, root)
            assert got.shape == ([2, 1, 1, 1][comm.rank], 2)
        return comm.all_reduce(np.ones(1))[0]  # still in step

    assert run_local(4, body, timeout=5) == [4.0] * 4


@pytest.mark.parametrize("algorithm", list(mpicoll.algorithms("all_reduce", "local")))
def test_a_user_op_raising_on_one_thread_rank_raises_on_every_rank(algorithm):
    def body(comm):
        def flaky(a, b, out):
            if comm.rank != 1:  # ranks 0 and 2: at least one combines in every algorithm
                raise KeyError("flaky")
            np.add(a, b, out=out)

        with pytest.raises(mpicoll.OpError, match="op 'flaky' raised on rank"):
            comm.all_reduce(np.ones(7), mpicoll.Op(flaky, name="flaky"), algorithm=algorithm)
        return comm.all_reduce(np.full(2, 1.0), algorithm=algorithm).tolist()

    assert run_local(3, body, timeout=10) == [[3.0, 3.0]] * 3


@pytest.mark.parametrize(("collective", "algorithm"), [
    ("all_reduce", "ring"), ("reduce", "binomial"), ("scan", "linear"), ("exscan", "linear")])
def test_a_ufunc_op_that_raises_raises_op_error_on_every_rank(collective, algorithm):
    """A user's Op made of a NumPy ufunc (as its docstring invites) that cannot combine
    these arrays (np.gcd on floats) is guarded as any user's op: OpError everywhere."""
    def body(comm):
        x = np.full(5, comm.rank + 1.0)
        args = (x, mpicoll.Op(np.gcd), 0) if collective == "reduce" else (x, mpicoll.Op(np.gcd))
        with pytest.raises(mpicoll.OpError, match="op 'gcd' raised on rank"):
            getattr(comm, collective)(*args, algorithm=algorithm)
        return comm.all_reduce(np.ones(2))[0]

    assert run_local(3, body, timeout=10) == [3.0] * 3


@pytest.mark.parametrize("algorithm", ["binomial", "linear"])
def test_a_builtin_op_under_numpy_seterr_raise_gives_ieee_results_on_every_rank(algorithm):
    """np.seterr(all="raise") is the caller's setting for its own arithmetic: a built-in
    sum that overflows where partial sums meet gives inf on every rank, as MPI's own
    would, and never leaves one rank out of the call's messages."""
    def body(comm):
        with np.errstate(all="raise"):  # (NumPy's error state is each thread's own)
            got = comm.reduce(np.full(3, 2e38, np.float32), "sum", 0, algorithm=algorithm)
        return None if got is None else got.tolist(), comm.all_reduce(np.ones(2))[0]

    results = run_local(3, body, timeout=10)
    assert results[0] == ([np.inf] * 3, 3.0)
    assert results[1:] == [(None, 3.0)] * 2


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("algorithm", ["binomial", "linear"])
def test_a_builtin_op_under_warnings_as_errors_gives_ieee_results_on_every_rank(algorithm):
    """python -W error (pytest's filterwarnings = error): NumPy's overflow warning, an
    exception then, once the sum has written inf: the call goes on as under np.seterr."""
    def body(comm):
        got = comm.reduce(np.full(3, 2e38, np.float32), "sum", 0, algorithm=algorithm)
        return None if got is None else got.tolist(), comm.all_reduce(np.ones(2))[0]

    results = run_local(3, body, timeout=10)
    assert results[0] == ([np.inf] * 3, 3.0)
    assert results[1:] == [(None, 3.0)] * 2


@pytest.mark.parametrize("value", [1e5, 1e-30])
def test_compressing_beyond_the_wires_range_under_seterr_raise_rounds_on_every_rank(value):
    """compress="fp16" of a value beyond float16's range (inf) or below it (0) with
    np.seterr(all="raise"): the wire's rounding, on every rank, never one rank's error."""
    def body(comm):
        x = np.full(4, value if comm.rank == 1 else 1.0, np.float32)
        with np.errstate(all="raise"):
            got = comm.all_reduce(x, algorithm="recursive_doubling", compress="fp16")
        return got.tolist(), comm.all_reduce(np.ones(2))[0]

    want = [np.inf] * 4 if value > 1 else [2.0] * 4
    assert run_local(3, body, timeout=10) == [(want, 3.0)] * 3


def test_a_user_op_that_averages_refuses_integers_before_any_message():
    def body(comm):
        averaging = mpicoll.Op(np.add, average=True, name="mean")
        with pytest.raises(mpicoll.UnsupportedDtypeError, match="'mean' averages"):
            comm.all_reduce(np.arange(3), averaging)
        return comm.all_reduce(np.arange(3.0), averaging).tolist()

    assert run_local(3, body, timeout=10) == [[0.0, 1.0, 2.0]] * 3


@pytest.mark.parametrize("size", [0, -1, True, 2.0, "2", None])
def test_run_local_refuses_a_size_that_is_no_number_of_ranks(size):
    """run_local's size: an int (NumPy's too) >= 1, else InvalidArgumentError, not a raw
    error from deep inside a collective."""
    with pytest.raises(mpicoll.InvalidArgumentError, match="size: expected a number of ranks"):
        run_local(size, lambda comm: None)
    assert run_local(np.int64(2), lambda comm: comm.all_reduce(np.ones(1))[0]) == [2.0, 2.0]


@pytest.mark.parametrize("timeout", [-1, "5", float("nan"), True])
def test_run_local_refuses_a_timeout_that_is_no_seconds(timeout):
    """run_local's and LocalWorld's timeout: seconds >= 0 (0: none), as Communicator's."""
    with pytest.raises(mpicoll.ConfigError, match="timeout: expected seconds >= 0"):
        run_local(2, lambda comm: None, timeout=timeout)
    with pytest.raises(mpicoll.ConfigError, match="timeout: expected seconds >= 0"):
        LocalWorld(2, timeout)
    assert run_local(2, lambda comm: comm.size, timeout=0) == [2, 2]


def test_run_local_takes_one_timeout_per_rank():
    """timeout=[...]: each rank's Communicator its own; one per rank, each seconds."""
    assert run_local(3, lambda comm: comm.timeout, timeout=[20, 0, 1.5]) == [20.0, 0.0, 1.5]
    with pytest.raises(mpicoll.InvalidArgumentError, match="expected 3 of them"):
        run_local(3, lambda comm: None, timeout=[1, 2])
    with pytest.raises(mpicoll.ConfigError, match="timeout: expected seconds >= 0"):
        run_local(2, lambda comm: None, timeout=[1, -1])


@pytest.mark.parametrize("collective", ["reduce", "reduce_scatter", "scan"])
def test_compress_on_a_collective_that_takes_none_says_so(collective):
    """compress= is all_reduce's: elsewhere refused as such on every rank, not as a
    tuning option that 'auto' cannot take."""
    def call(comm):
        x = np.ones((comm.size, 2))
        getattr(comm, collective)(x, compress="bf16")

    _raises_everywhere(3, call, mpicoll.InvalidArgumentError,
                       rf"compress: {collective} takes no compress=")


def test_an_out_or_receive_buffer_whose_elements_share_memory_is_refused():
    """A writeable array with a stride of 0 (as_strided's, torch's expand()): every
    element one place in memory, which would hold one value where the result has many:
    refused on the rank that gives it, the others right, and the next call right."""
    from numpy.lib.stride_tricks import as_strided

    def shared(n):
        return as_strided(np.zeros(1), shape=(n,), strides=(0,), writeable=True)

    def body(comm):
        odd = comm.rank == comm.size - 1
        x = np.arange(3.0) + comm.rank
        if odd:
            with pytest.raises(mpicoll.InvalidArgumentError, match="out: .*stride of 0"):
                comm.all_reduce(x, out=shared(3))
            with pytest.raises(mpicoll.InvalidArgumentError, match="x: .*stride of 0"):
                comm.broadcast(shared(3), 0)
        else:
            comm.all_reduce(x)
            comm.broadcast(x if comm.rank == 0 else np.zeros(3), 0)
        return comm.all_reduce(np.ones(2))[0]

    assert run_local(3, body, timeout=10) == [3.0] * 3


def test_free_and_plan_free_while_another_thread_is_in_a_call_are_refused():
    """free() (and a plan's free()) from one thread while another is in a call of the
    Communicator: ConcurrentCallError, nothing freed; the call ends right, and the frees
    made afterwards work."""
    import threading
    import time

    def slow_add(a, b, out):
        time.sleep(0.2)
        np.add(a, b, out=out)

    def body(comm):
        slow = mpicoll.Op(slow_add, name="slow_add")
        plan = comm.all_reduce_init(np.ones(2), out=np.zeros(2))
        got = {}
        thread = threading.Thread(
            target=lambda: got.setdefault("sum", comm.all_reduce(np.ones(2), slow)))
        thread.start()
        time.sleep(0.05)
        refused = []
        for free in (comm.free, plan.free):
            try:
                free()
            except mpicoll.ConcurrentCallError as exc:
                refused.append(str(exc).split(":")[0])
        thread.join()
        still = comm.freed
        plan.free()
        comm.free()
        return refused, still, got["sum"].tolist()

    assert run_local(2, body, timeout=10) == [
        (["free", "all_reduce plan.free()"], False, [2.0, 2.0])] * 2


def test_empty_results_are_no_memory_shared():
    """An empty out= (NumPy gives its dimensions a stride of 0) is an array like any:
    no elements, nothing shared."""
    def body(comm):
        got = comm.all_gather(np.zeros(0), out=np.empty((comm.size, 0)))
        return got.shape, comm.all_reduce(np.zeros((3, 0)), out=np.empty((3, 0))).shape

    assert run_local(2, body, timeout=10) == [((2, 0), (3, 0))] * 2


class _TorchLike:
    """A receive buffer of another array library (DLPack only), whose ``dtype`` and
    ``shape`` are its library's, not NumPy's (as a torch tensor's ``torch.float32``)."""

    def __init__(self, memory):
        from dlpack_capsule import Tensor

        self._tensor = Tensor(memory)
        self.dtype, self.shape = f"lib.{memory.dtype.name}", ("lib", memory.shape)

    def __dlpack__(self, **kwargs):
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


def test_check_mode_scatter_into_another_librarys_out():
    """Check mode compares a receiver's out= as the array it is (its NumPy dtype and
    shape), not the caller's object (a torch tensor's dtype is torch's): the scatter runs,
    and a receiver's out= of another dtype raises on every rank."""
    def body(comm):
        x = np.arange(comm.size * 2, dtype="f4").reshape(comm.size, 2)
        memory = np.zeros(2, "f4")
        comm.scatter(x if comm.rank == 0 else None, 0, out=_TorchLike(memory))
        assert memory.tolist() == x[comm.rank].tolist()
        other = np.zeros(2, "f8" if comm.rank == comm.size - 1 else "f4")
        with pytest.raises(mpicoll.MismatchError, match="dtype"):
            comm.scatter(x if comm.rank == 0 else None, 0, out=_TorchLike(other))
        return comm.all_reduce(np.ones(1)).tolist()

    assert run_local(3, body, check=True, timeout=20) == [[3.0]] * 3


def test_run_local_reads_mpicoll_timeout(monkeypatch):
    """MPICOLL_TIMEOUT bounds the thread-ranks' waits too, where run_local is given no
    timeout (a malformed value: ConfigError); an explicit timeout= wins over it."""
    def hang(comm):
        if comm.rank == 0:
            comm.recv(np.empty(1), 1, tag=5)  # rank 1 never sends
        return True

    monkeypatch.setenv("MPICOLL_TIMEOUT", "abc")
    with pytest.raises(mpicoll.ConfigError, match="MPICOLL_TIMEOUT"):
        run_local(2, hang)
    monkeypatch.setenv("MPICOLL_TIMEOUT", "0.5")
    assert run_local(2, lambda comm: comm.timeout) == [0.5, 0.5]
    with pytest.raises(mpicoll.CollectiveTimeoutError, match="no message from rank 1"):
        run_local(2, hang)
    assert run_local(2, lambda comm: comm.timeout, timeout=7) == [7.0, 7.0]


def test_an_x_whose_shape_raises_is_refused_as_no_array():
    """An object whose ``shape`` raises (a nested tensor's does, with torch's internal
    words): refused as an x that is no array, mpicoll's error on every rank; the flight
    recorder's entry has no shape, nothing else fails."""
    class Odd:
        @property
        def shape(self):
            raise RuntimeError("no sizes here")

    def body(comm):
        with pytest.raises(mpicoll.InvalidArgumentError, match="^x: "):
            comm.all_reduce(Odd())
        return comm.all_reduce(np.ones(2)).tolist()

    assert run_local(2, body, timeout=10) == [[2.0, 2.0]] * 2


def test_freeing_a_communicator_whose_bucketer_another_thread_waits_on():
    """free() while another thread waits in a round of a Bucketer made on it: the
    Communicator's own communicators are released all the same (its watch unregistered:
    not half freed), the Bucketer's is kept and said, and free() again, once the round
    has ended, frees it."""
    import threading
    import time

    from mpicoll.observe.watchdog import watchdog

    def body(comm):
        buckets = mpicoll.Bucketer(comm, [np.ones(2)])
        watch = buckets.comm._watch
        if comm.rank == 1:  # (its wait comes once rank 0 has tried to free)
            buckets.add(0, np.ones(2))
            time.sleep(0.5)
            got = buckets.wait()[0].tolist()
            comm.free()
            return got, buckets.comm.freed
        results = []
        waiter = threading.Thread(target=lambda: results.append(
            (buckets.add(0, np.ones(2)), buckets.wait()[0].tolist())))
        waiter.start()
        deadline = time.monotonic() + 5
        while not (watch.started and watch.current.call.collective == "Bucketer.wait"):
            assert time.monotonic() < deadline, "the waiting thread never got to its wait"
            time.sleep(0.005)
        with pytest.raises(mpicoll.ConcurrentCallError, match="a Bucketer made on it"):
            comm.free()
        assert comm.freed and all(w is not comm._watch for w in watchdog().watches)
        assert not buckets.comm.freed
        waiter.join()
        comm.free()
        return results[0][1], buckets.comm.freed

    assert run_local(2, body, timeout=10) == [([2.0, 2.0], True)] * 2


def test_a_world_given_up_sends_no_later_message_and_a_wait_raises_aborted_error():
    """Once a rank gave the local world up (its timeout): a rank that goes on to a later
    call sends nothing, and a rank whose wait meets such a message, sent as the world
    gave up, raises AbortedError, as the README says every other rank does (it raised
    MismatchError: "message from rank 2 has tag 4 ...; expected tag 3", one run in four)."""
    world = LocalWorld(2, timeout=5)
    early, late = world.endpoint(0), world.endpoint(1)
    early.begin()
    late.begin()
    late.begin()  # (a call ahead)
    late.send(np.ones(2), 0)  # its message, sent before the world was given up
    box = world.mailboxes[1][0]

    class GivenUpAsTaken:  # (the world given up as the wait takes it: the race, certain)
        def get(self, timeout):
            item = box.get(timeout=timeout)
            world.aborted.set()
            return item

        def put(self, item):
            box.put(item)

    world.mailboxes[1][0] = GivenUpAsTaken()
    with pytest.raises(mpicoll.AbortedError, match="rank 0: another rank failed"):
        early.recv(np.empty(2), 1)
    with pytest.raises(mpicoll.AbortedError, match="rank 1: another rank failed"):
        late.send(np.ones(2), 0)
    assert box.empty()
