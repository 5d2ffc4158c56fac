"""torch CPU tensors through the Communicator's calls (skipped where torch is not
installed): the same results as NumPy arrays, the caller's own tensor back where the
result is its memory, and the tensors NumPy cannot view (bfloat16, strided) through
the whole path. Runs at 1 rank and under mpiexec."""

from __future__ import annotations

import numpy as np
import pytest

import mpicoll

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi


def _x(world, shape=(6,)):
    return torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape) + world.rank


@pytest.mark.parametrize("algorithm", ["auto", "native", "ring", "recursive_doubling"])
def test_all_reduce_of_a_tensor_is_a_tensor_equal_to_numpys(world, algorithm):
    for _ in range(3):  # the first takes the whole path, the next its decision
        x = _x(world)
        got = world.all_reduce(x, algorithm=algorithm)
        want = world.all_reduce(x.numpy().copy(), algorithm=algorithm)
        assert isinstance(got, torch.Tensor)
        np.testing.assert_array_equal(got.numpy(), want)
        same = world.all_reduce(x, out=x, algorithm=algorithm)
        assert same is x
        np.testing.assert_array_equal(x.numpy(), want)


@pytest.mark.parametrize("collective", ["broadcast", "scatter", "gather", "all_gather", "reduce",
                                        "reduce_scatter", "all_to_all", "scan", "exscan"])
def test_every_collective_takes_tensors(world, collective):
    p, r = world.size, world.rank
    spec = mpicoll.spec.SPECS[collective]
    shape = (p, 3) if spec.input_rows else (4,)
    for _ in range(3):
        x = _x(world, shape)
        args = (x, 0) if spec.rooted and not spec.reduces else \
            (x, "sum", 0) if spec.rooted else (x,)
        got = getattr(world, collective)(*args)
        want = getattr(world, collective)(x.numpy().copy(), *args[1:])
        if want is None:
            assert got is None
        else:
            assert isinstance(got, torch.Tensor)
            np.testing.assert_array_equal(got.numpy(), want)
    if collective == "broadcast":
        x = _x(world, shape) if r == 0 else torch.zeros(shape)
        assert world.broadcast(x, 0) is x  # the root's input, a receiver's buffer itself
        np.testing.assert_array_equal(x.numpy(), np.arange(4))


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce", "gather",
                                        "all_gather", "scan"])
def test_the_same_tensor_called_again_and_again(world, collective, monkeypatch):
    """``comm.all_reduce(t)`` on one tensor in a loop (its view kept, the call's decision
    kept): a new tensor each time, equal to NumPy's, or the caller's own tensor where the
    result is its memory (a broadcast), or None (a reduce's non-root); from the second
    call on without the longer ways' conversion (``decided.to_caller``)."""
    from mpicoll.pipeline import decided

    x = _x(world, (4,))
    for step in range(4):
        if step == 2:  # the view and the decision are kept by now
            monkeypatch.setattr(decided, "to_caller", lambda *args: pytest.fail("longer way"))
        x.copy_(_x(world, (4,)) + step)
        want = getattr(world, collective)(x.numpy().copy())
        got = getattr(world, collective)(x)
        if want is None:
            assert got is None
        elif collective == "broadcast":
            assert got is x
            np.testing.assert_array_equal(x.numpy(), want)
        else:
            assert isinstance(got, torch.Tensor) and got.data_ptr() != x.data_ptr()
            np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("form", ["op", "root", "out_itself", "out_other", "option",
                                  "op_and_out"])
def test_repeated_tensor_calls_with_arguments_are_found_at_once(world, form, monkeypatch):
    """A small tensor's call with an op, a root, out= (itself or another kept tensor) or an
    option: from the second call on, its decision is found from the entry on the tensor's
    kept view (no longer way's conversion, ``decided.from_torch``), with the same result
    as NumPy's and the caller's own tensor back where it is out=."""
    from mpicoll.pipeline import decided

    x, into = _x(world, (4,)), torch.zeros(4)
    calls = {
        "op": lambda: world.all_reduce(x, "max"),
        "root": lambda: world.reduce(x, "sum", world.size - 1),
        "out_itself": lambda: world.all_reduce(x, out=x),
        "out_other": lambda: world.all_reduce(x, out=into),
        "option": lambda: world.all_reduce(x, algorithm="ring"),
        "op_and_out": lambda: world.all_reduce(x, "min", out=into),
    }
    wants = {
        "op": lambda a: world.all_reduce(a, "max"),
        "root": lambda a: world.reduce(a, "sum", world.size - 1),
        "out_itself": lambda a: world.all_reduce(a),
        "out_other": lambda a: world.all_reduce(a),
        "option": lambda a: world.all_reduce(a, algorithm="ring"),
        "op_and_out": lambda a: world.all_reduce(a, "min"),
    }
    for step in range(4):
        if step == 2:  # the views and the decision are kept by now
            monkeypatch.setattr(decided, "from_torch",
                                lambda *args: pytest.fail("the longer way"))
        x.copy_(_x(world, (4,)) + step)
        want = wants[form](x.numpy().copy())
        got = calls[form]()
        if want is None:
            assert got is None
            continue
        if form == "out_itself":
            assert got is x
        elif form in ("out_other", "op_and_out"):
            assert got is into
        else:
            assert isinstance(got, torch.Tensor) and got.data_ptr() != x.data_ptr()
        np.testing.assert_array_equal(got.numpy(), want)


def test_tensors_numpy_cannot_view_take_the_whole_path(world):
    p = world.size
    grad = torch.ones(3, requires_grad=True)  # its memory, as torch.distributed uses it
    np.testing.assert_array_equal(world.all_reduce(grad).numpy(), np.full(3, p))
    assert world.all_reduce(grad, out=grad) is grad and grad.requires_grad
    np.testing.assert_array_equal(grad.detach().numpy(), np.full(3, p))
    weight = torch.nn.Linear(2, 3).weight  # a parameter: broadcast from rank 0 at start
    expected = world.broadcast(weight.detach().clone(), 0).numpy()
    assert world.broadcast(weight, 0) is weight
    np.testing.assert_array_equal(weight.detach().numpy(), expected)
    strided = torch.ones(8)[::2]
    np.testing.assert_array_equal(world.all_reduce(strided).numpy(), np.full(4, p))
    half = torch.ones(5, dtype=torch.bfloat16)
    got = world.all_reduce(half)
    assert got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.float().numpy(), np.full(5, p))


def test_torchs_float8_types_and_its_sub_byte_placeholders(world):
    """Every float8 type torch and ml_dtypes share reduces as NumPy's (its result a tensor
    of the same dtype); torch's sub-byte integers (int4, uint1, ...: a byte an element,
    exported as 8-bit integers) are refused on every rank, not given back as int8."""
    p = world.size
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu"):
        if not hasattr(torch, name):
            continue
        got = world.all_reduce(torch.ones(4).to(getattr(torch, name)), "max")
        assert got.dtype == getattr(torch, name), name
        np.testing.assert_array_equal(got.float().numpy(), np.ones(4))
    for name in ("int4", "uint4", "uint1"):
        if not hasattr(torch, name):
            continue
        placeholder = torch.ones(2, dtype=torch.uint8 if name[0] == "u" else torch.int8)
        with pytest.raises(mpicoll.UnsupportedDtypeError, match="placeholder"):
            world.all_reduce(placeholder.view(getattr(torch, name)))
    np.testing.assert_array_equal(world.all_reduce(np.ones(1)), np.full(1, p))


def test_a_kept_view_follows_the_tensor_it_views(world):
    """A small tensor's NumPy view is kept between calls (mpicoll.buffers.arrays.torch_numpy);
    a tensor changed in place (new memory, new shape, needing grad) is viewed again or
    refused as the first time, never through the old view."""
    p = world.size
    x = torch.ones(4)
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(x, out=x).numpy(), np.full(4, p))
        x.fill_(1.0)
    x.set_(torch.full((6,), 2.0))  # other memory, other shape
    got = world.all_reduce(x, out=x)
    assert got is x
    np.testing.assert_array_equal(x.numpy(), np.full(6, 2.0 * p))
    x.fill_(1.0)
    x.unsqueeze_(0)  # the same memory in another shape
    got = world.all_reduce(x)
    assert tuple(got.shape) == (1, 6)
    np.testing.assert_array_equal(got.numpy(), np.full((1, 6), float(p)))
    x.requires_grad_(True)  # needing grad: the same memory, still its view
    np.testing.assert_array_equal(world.all_reduce(x).numpy(), np.full((1, 6), float(p)))
    x.requires_grad_(False)
    np.testing.assert_array_equal(world.all_reduce(x).numpy(), np.full((1, 6), float(p)))


def test_a_kept_view_follows_a_tensor_transposed_in_place(world):
    p = world.size
    x = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(x).numpy(), x.numpy() * p)
    x.t_()  # the same memory and shape, other strides
    np.testing.assert_array_equal(world.all_reduce(x).numpy(), x.numpy() * p)


def test_a_kept_view_follows_a_tensor_given_another_dtype_in_place(world):
    """``t.data = t.data.view(torch.int32)``: the same memory, shape and strides in another
    dtype; the call reduces (and gives back) int32, never the float32 it viewed before."""
    p = world.size
    x = torch.full((3,), 2.0)
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(x).numpy(), np.full(3, 2.0 * p))
    x.data = x.data.view(torch.int32)
    x.fill_(3)  # (float32's 3 is other bits)
    got = world.all_reduce(x)
    assert got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy(), np.full(3, 3 * p, np.int32))
    assert world.all_reduce(x, out=x) is x and x.dtype == torch.int32
    np.testing.assert_array_equal(x.numpy(), np.full(3, 3 * p, np.int32))


def test_tensors_with_a_lazy_conjugate_or_negation_are_refused_on_every_rank(world):
    """torch's lazy bits: the memory holds other values than the tensor shows (DLPack
    exports the negative bit's memory as it is): refused before any message, and the next
    call goes on; a kept complex view given the bit later too. (One rank's alone, in MPI's
    own all_reduce: the others wait in it, as for any input one rank refuses there.)"""
    p = world.size
    plain = torch.full((2,), 2.0)
    lazy = {"neg": torch.conj(torch.tensor([1 + 2j, 3 + 4j])).imag,
            "conj": torch.conj(torch.tensor([1 + 2j, 3 + 4j]))}
    for bit, x in lazy.items():
        for algorithm in ("native", "ring"):
            with pytest.raises(mpicoll.InvalidArgumentError, match=f"resolve_{bit}"):
                world.all_reduce(x, algorithm=algorithm)
            np.testing.assert_array_equal(world.all_reduce(plain).numpy(), np.full(2, 2.0 * p))
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    for _ in range(2):
        np.testing.assert_array_equal(world.all_reduce(z).numpy(), z.numpy() * p)
    z.data = z.data.conj()  # the same memory, shape, strides and dtype
    with pytest.raises(mpicoll.InvalidArgumentError, match="resolve_conj"):
        world.all_reduce(z)
    base = torch.tensor([1.0, 2.0])  # a kept real view given the negative bit later
    t = torch.empty(0)
    t.set_(base.untyped_storage(), 1, (1,), (2,))
    for _ in range(2):
        assert world.all_reduce(t).tolist() == [2.0 * p]
    t.data = torch.conj(base.view(torch.complex64)).imag  # shows -2.0 at the same address
    with pytest.raises(mpicoll.InvalidArgumentError, match="resolve_neg"):
        world.all_reduce(t)

    class Mine(torch.Tensor):  # a subclass of the caller's own is a tensor too
        pass

    with pytest.raises(mpicoll.InvalidArgumentError, match="resolve_neg"):
        world.all_reduce(lazy["neg"].as_subclass(Mine))
    got = world.all_reduce(plain.as_subclass(Mine))
    assert isinstance(got, torch.Tensor) and got.tolist() == [2.0 * p] * 2


def test_a_tensor_that_needs_grad_is_not_kept_with_its_graph(world):
    """dist.all_reduce(loss) for a log: the tensor (which needs grad) is not kept for the
    next call, so neither is its autograd graph and the memory the graph saved."""
    import gc
    import weakref

    import mpicoll.buffers.arrays as arrays

    big = torch.ones(1 << 16, requires_grad=True)
    loss = (big * 2.0).sum()
    saved = weakref.ref(big)
    assert world.all_reduce(loss).item() == 2.0 * (1 << 16) * world.size
    assert id(loss) not in arrays._VIEWS
    del big, loss
    gc.collect()
    assert saved() is None


def test_an_output_tensor_whose_elements_share_memory_is_refused(world):
    """An expanded output (stride 0: every element one place) would hold one value where
    the result has many: refused on the rank that gives it (as torch refuses it), the
    others right, and the next call right."""
    odd = world.rank == world.size - 1
    out = torch.zeros(1).expand(3) if odd else torch.zeros(3)
    x = torch.arange(3.0) + world.rank
    if odd:
        with pytest.raises(mpicoll.InvalidArgumentError, match="stride of 0"):
            world.all_reduce(x, out=out)
    else:
        got = world.all_reduce(x, out=out)
        assert got is out and out.tolist() == (np.arange(3.0) * world.size + sum(
            range(world.size))).tolist()
    assert world.all_reduce(torch.ones(2)).tolist() == [world.size] * 2


def test_out_tensors_and_arrays_mixed_with_tensors_across_repeated_calls(world):
    """out= another tensor, an array for a tensor's x and a tensor for an array's x: each
    form repeated (its decision kept, then found at once), the result in out= and out=
    itself returned, as the first call gives it."""
    p = world.size
    x, into = torch.ones(4), torch.zeros(4)
    array, array_into = np.ones(4, np.float32), np.zeros(4, np.float32)
    for step in range(3):
        x.fill_(step + 1.0)
        array[...] = step + 1.0
        want = np.full(4, (step + 1.0) * p, np.float32)
        got = world.all_reduce(x, out=into)
        assert got is into
        np.testing.assert_array_equal(into.numpy(), want)
        got = world.all_reduce(x, out=array_into)
        assert got is array_into
        np.testing.assert_array_equal(array_into, want)
        got = world.all_reduce(array, out=into)
        assert got is into
        np.testing.assert_array_equal(into.numpy(), want)
        got = world.all_reduce(x, "sum", algorithm="ring", out=x)
        assert got is x
        np.testing.assert_array_equal(x.numpy(), want)


def test_dist_lists_of_bfloat16_and_parameters_as_torch_distributed():
    """mpicoll.dist on torch tensors: lists of bfloat16 tensors (NumPy cannot hold
    torch's bfloat16: its rows go through ml_dtypes' views) and a parameter needing grad
    (its memory, as torch.distributed broadcasts a model's weights at start)."""
    import mpicoll.dist as dist

    dist.init_process_group("mpi")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        mine = torch.full((3,), float(rank), dtype=torch.bfloat16)
        rows = [torch.zeros(3, dtype=torch.bfloat16) for _ in range(size)]
        dist.all_gather(rows, mine)
        assert [r.float().tolist() for r in rows] == [[float(r)] * 3 for r in range(size)]
        got = [torch.zeros(3, dtype=torch.bfloat16) for _ in range(size)] if rank == 0 else None
        dist.gather(mine, got, dst=0)
        if rank == 0:
            assert [g[0].item() for g in got] == [float(r) for r in range(size)]
        weight = torch.nn.Parameter(torch.full((2, 2), float(rank)))
        dist.broadcast(weight, src=0)
        assert weight.requires_grad and (weight.detach() == 0).all()
        # a mixed list is named in torch's words (it said "numpy int64 among numpy float32")
        with pytest.raises(mpicoll.InvalidArgumentError,
                           match=r"tensors\[1\]: torch.int64 among torch.float32 tensors"):
            dist.all_reduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.int64)])
    finally:
        dist.destroy_process_group()


def test_dist_takes_torch_distributeds_own_reduce_ops():
    """Code that names torch.distributed.ReduceOp (``from torch.distributed import
    ReduceOp`` beside ``import mpicoll.dist as dist``): its members reduce as ours of that
    name; PREMUL_SUM, which mpicoll has not, is refused on every rank; the next call is
    right."""
    import torch.distributed as torch_dist

    import mpicoll.dist as dist

    dist.init_process_group("mpi")
    try:
        rank, size = dist.get_rank(), dist.get_world_size()
        for theirs, want in ((torch_dist.ReduceOp.SUM, sum(range(size))),
                             (torch_dist.ReduceOp.MAX, size - 1),
                             (torch_dist.ReduceOp.MIN, 0)):
            t = torch.full((2,), float(rank))
            dist.all_reduce(t, op=theirs)
            assert t.tolist() == [float(want)] * 2, theirs
        for premul in (torch_dist.ReduceOp.PREMUL_SUM, dist.ReduceOp.PREMUL_SUM):
            with pytest.raises(mpicoll.InvalidArgumentError, match="PREMUL_SUM .* not supported"):
                dist.all_reduce(torch.ones(2), op=premul)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [float(size)] * 2
    finally:
        dist.destroy_process_group()


def test_dist_futures_of_tensors_are_torchs_as_ddp_comm_hooks_chain_them():
    """A torch tensor's async call: ``get_future()`` is a ``torch.futures.Future`` whose
    value is ``[tensor]``, chained as a DDP comm hook chains it (sum, then divide)."""
    import mpicoll.dist as dist

    dist.init_process_group("mpi")
    try:
        size = dist.get_world_size()
        bucket = torch.full((4,), float(dist.get_rank() + 1))
        fut = dist.all_reduce(bucket, async_op=True).get_future()
        assert isinstance(fut, torch.futures.Future)
        averaged = fut.then(lambda f: f.value()[0] / size).wait()
        assert fut.value()[0] is bucket
        torch.testing.assert_close(averaged, torch.full((4,), (size + 1) / 2))
    finally:
        dist.destroy_process_group()


def test_a_collective_in_a_torch_futures_callback_is_refused_wherever_it_runs():
    """torch runs a callback added to a completed future at once, in the caller's
    thread: a collective made in a call's future's callback (add_done_callback, then, and
    what then chains) is refused there too, as on the progress thread: on every rank."""
    import mpicoll.dist as dist

    dist.init_process_group("mpi")
    try:
        size = dist.get_world_size()
        import threading

        def collective(f):
            return dist.all_reduce(torch.ones(1))

        for ended in (False, True):
            future = dist.all_reduce(torch.ones(2), async_op=True).get_future()
            if ended:
                future.wait()
            refused, ran = [], threading.Event()

            def hook(f, refused=refused, ran=ran):
                try:
                    collective(f)
                except mpicoll.ConcurrentCallError:
                    refused.append(True)
                ran.set()

            future.add_done_callback(hook)
            with pytest.raises(mpicoll.ConcurrentCallError, match="done callback"):
                future.then(collective).wait()
            with pytest.raises(mpicoll.ConcurrentCallError, match="done callback"):
                future.then(lambda f: f.value()[0]).then(collective).wait()
            assert ran.wait(30) and refused == [True]
        after = torch.ones(3)
        dist.all_reduce(after)
        assert after.tolist() == [size] * 3
    finally:
        dist.destroy_process_group()


def test_a_bucketer_of_tensors_gives_tensors_back(world):
    """Bucketer.wait() gives each result as its array's kind: torch tensors over the
    buckets (valid until the next round's adds, as NumPy's views are)."""
    grads = [torch.ones(3), torch.full((2, 2), 2.0)]
    buckets = mpicoll.Bucketer(world, grads, cap_bytes=16)
    try:
        for step in range(2):
            for i, g in enumerate(grads):
                buckets.add(i, g * (step + 1))
            got = buckets.wait()
            assert all(isinstance(t, torch.Tensor) for t in got)
            assert [t.shape for t in got] == [g.shape for g in grads]
            for t, g in zip(got, grads, strict=True):
                assert t.tolist() == (g * (step + 1) * world.size).tolist()
    finally:
        buckets.free()


@pytest.mark.parametrize("mode", ["check", "trace", "stream"])
def test_the_callers_own_tensor_comes_back_on_the_longer_way_too(mode):
    """Where no decision is kept (check mode, traces) or the call takes the whole path
    (stream=), a broadcast of a tensor and an all_reduce into out=x give the caller's
    own tensor back, as a decided call does, not a new tensor over the same memory."""
    from mpi4py import MPI

    comm = mpicoll.Communicator(MPI.COMM_WORLD, check=mode == "check",
                                trace=mode == "trace")
    extra = {"stream": None} if mode == "stream" else {}
    try:
        for _ in range(3):
            t = _x(comm, (4,))
            assert comm.broadcast(t, 0, **extra) is t
            np.testing.assert_array_equal(t.numpy(), np.arange(4))
            assert comm.all_reduce(t, out=t, **extra) is t
            np.testing.assert_array_equal(t.numpy(), comm.size * np.arange(4))
    finally:
        comm.free()


def test_a_kept_tensor_whose_memory_was_swapped_away_is_refused_not_raised(world):
    """A small tensor whose NumPy view is kept since earlier calls, its memory swapped for
    a sparse tensor's since (``torch.utils.swap_tensors``: its data_ptr raises): refused as
    every tensor NumPy cannot view, mpicoll's error, not torch's raw RuntimeError (which
    left the call unnumbered, so that rank's next call met the others' call before)."""
    if world.size > 1:
        pytest.skip("one rank's refusal alone leaves the others in MPI's own all_reduce")
    t = torch.ones(4)
    for _ in range(3):
        world.all_reduce(t)
    torch.utils.swap_tensors(t, torch.ones(4).to_sparse())
    with pytest.raises(mpicoll.InvalidArgumentError, match="layout"):
        world.all_reduce(t)
    np.testing.assert_array_equal(world.all_reduce(torch.ones(2)).numpy(), np.ones(2))
