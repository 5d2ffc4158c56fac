"""Inputs every rank can rebuild for any rank, and NumPy references built from them.

Values are small integers (1 and 2 for products), so every op is exact in every dtype:
results can be compared with ``array_equal`` whatever order an algorithm combines in.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import mpicoll
from mpicoll.algorithms import REGISTRY
from mpicoll.backends.mpi_native import typed
from mpicoll.ops import ReduceOp
from mpicoll.spec import SPECS

BFLOAT16 = np.dtype(ml_dtypes.bfloat16).name
DTYPES = ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", BFLOAT16, "f4", "f8",
          "g", "c8", "c16", "G")
# what the MPI library has no reduction type for: native refuses to reduce them (long
# double, real and complex, where this MPI library has no type of its size)
NO_MPI_REDUCTION = (BFLOAT16, *(d for d in ("g", "G") if typed(np.dtype(d)) is None))
OPS = tuple(op.value for op in ReduceOp)
# read from the collectives' specs, so a new collective joins every test that loops on them
ROOTED = tuple(name for name, spec in SPECS.items() if spec.rooted)
REDUCING = tuple(name for name, spec in SPECS.items() if spec.reduces)
SCANS = tuple(name for name, spec in SPECS.items() if spec.combined(0, 2) != 2)  # prefixes


def _dtype(name: str) -> np.dtype:
    if name in LOC_DTYPES:
        return LOC_DTYPES[name]
    return np.dtype(ml_dtypes.bfloat16) if name == BFLOAT16 else np.dtype(name)


# User-defined ops. Non-commutative: the product of 2x2 integer matrices (mod a prime,
# so it stays exact), one matrix per element of a structured dtype; and the
# concatenation of strings of octal digits, an element being (digits, length).
MATRIX = np.dtype([("m", "i8", (2, 2))])
STRING = np.dtype([("digits", "u8"), ("length", "u1")])
_PRIME = 1_000_003


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    product = np.matmul(a["m"], b["m"]) % _PRIME  # a temporary: out may alias a or b
    out["m"] = product


def _concat(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    digits = a["digits"] * (np.uint64(8) ** b["length"].astype("u8")) + b["digits"]
    length = a["length"] + b["length"]
    out["digits"], out["length"] = digits, length


USER_OPS = {
    "matmul": (mpicoll.Op(_matmul, commutative=False, name="matmul"), MATRIX),
    "concat": (mpicoll.Op(_concat, commutative=False, name="concat"), STRING),
    "gcd": (mpicoll.Op(np.gcd, commutative=True, identity=0), np.dtype("i8")),
}
NON_COMMUTATIVE = ("matmul", "concat")


# The references are NumPy's own ufuncs, never mpicoll's op table: on bool too, where
# NumPy's add is OR, multiply AND, minimum AND, maximum OR. avg is NumPy's sum of the
# ranks' inputs divided by their number (in the dtype, as NumPy divides).
NUMPY_OPS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
             "avg": np.add, "band": np.bitwise_and, "bor": np.bitwise_or,
             "bxor": np.bitwise_xor}
# the dtype kinds mpicoll documents each built-in op for (b bool, i/u integers, f
# floating, bfloat16 included, c complex): avg on floating and complex only, bitwise ops
# on bool and integers only, min/max on anything but complex, logical ops on all;
# minloc/maxloc on none of DTYPES: on LOC_DTYPES only
OP_KINDS = {"sum": "biufc", "prod": "biufc", "min": "biuf", "max": "biuf", "avg": "fc",
            "band": "biu", "bor": "biu", "bxor": "biu", "land": "biufc", "lor": "biufc",
            "lxor": "biufc", "minloc": "", "maxloc": ""}
LOGICAL = ("land", "lor", "lxor")
LOC_OPS = ("minloc", "maxloc")


def _pair(value: object, index: str = "i4", align: bool = True) -> np.dtype:
    return np.dtype([("value", value), ("index", index)], align=align)


# minloc/maxloc's dtypes, written out here: C's struct {value; int index;} of MPI's pair
# types (MPI_FLOAT_INT, DOUBLE_INT, LONG_INT, 2INT, SHORT_INT, LONG_DOUBLE_INT), which
# the MPI library reduces too, and layouts it has no type for (NO_MPI_PAIR)
LOC_DTYPES = {
    "loc:float_int": _pair("f4"), "loc:double_int": _pair("f8"), "loc:long_int": _pair("l"),
    "loc:2int": _pair("i4"), "loc:short_int": _pair("h"), "loc:long_double_int": _pair("g"),
    "loc:double_int_packed": _pair("f8", align=False),
    "loc:bfloat16_int64": _pair(ml_dtypes.bfloat16, "i8"), "loc:uint8_uint16": _pair("u1", "u2"),
}
NO_MPI_PAIR = ("loc:double_int_packed", "loc:bfloat16_int64", "loc:uint8_uint16")
LOC_DTYPE_OPS = tuple((d, o) for d in LOC_DTYPES for o in LOC_OPS)


def mpi_reduces(dtype: str | None, op: str) -> bool:
    """Whether the MPI library reduces ``dtype`` with ``op`` (else native refuses): not
    bfloat16 or long double, logical ops on bool and integers only (the MPI standard's
    table), minloc/maxloc on its pair types only; a user op always."""
    if dtype is None:
        return True
    if dtype in LOC_DTYPES:
        return dtype not in NO_MPI_PAIR
    return dtype not in NO_MPI_REDUCTION and not (op in LOGICAL and _dtype(dtype).kind in "fc")


def op_fits(op: str, dtype: str) -> bool:
    kind = "f" if dtype == BFLOAT16 else _dtype(dtype).kind
    return kind in OP_KINDS[op]


# the logical ops take every numeric dtype alike: tested on one of each kind and width
# (those the MPI library reduces with them and those it refuses), to keep the suite short
LOGICAL_DTYPES = ("?", "i1", "u2", "i8", "u8", "f2", BFLOAT16, "f8", "g", "c8")
DTYPE_OPS = tuple((d, o) for d in DTYPES for o in OPS if op_fits(o, d)
                  and (o not in LOGICAL or d in LOGICAL_DTYPES))


def make_input(rank: int, shape: tuple[int, ...], dtype: str, op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input: different on every rank and element, exact under ``op``.

    For a user op (a key of USER_OPS) the dtype is the op's own.
    """
    return np.asarray(_values(rank, shape, dtype, op)).reshape(shape)


def _user_values(idx: np.ndarray, rank: int, op: str) -> np.ndarray:
    out = np.zeros(idx.shape, USER_OPS[op][1])
    pick = (idx * 7 + rank * 3 + 1) % 3
    if op == "matmul":
        generators = np.array([[[1, 1], [0, 1]], [[1, 0], [1, 1]], [[2, 1], [1, 1]]])
        out["m"] = generators[pick]
    elif op == "concat":
        out["digits"], out["length"] = (idx + 5 * rank) % 8, 1
    else:
        out[...] = (pick + 1) * 6 * (1 + rank % 2)
    return out


def _values(rank: int, shape: tuple[int, ...], dtype: str, op: str) -> np.ndarray:
    idx = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    if op in USER_OPS:
        return _user_values(idx, rank, op)
    if dtype in LOC_DTYPES:
        return _loc_values(idx, rank, dtype)
    dt = _dtype(dtype)
    base = (idx * 7 + rank * 3 + 1) % 5
    if dt.kind == "b":
        return (base % 2).astype(dt)
    if op == "prod":
        base = base % 2 + 1
    if dt.kind == "c":
        return (base + 1j * ((idx + rank) % 2)).astype(dt)
    if dt.kind == "i" and op not in ("prod",):
        base = base - 2  # negative values too
    return base.astype(dt)


def _loc_values(idx: np.ndarray, rank: int, dtype: str) -> np.ndarray:
    """(value, index) pairs with ties: at every third element all ranks hold one value,
    at the next ranks 0-1, 2-3, ... pair up, at the next they differ; indices run in no
    rank order (rank*5 mod 7), so "the lowest index" is not "the first rank"."""
    out = np.zeros(idx.shape, LOC_DTYPES[dtype])
    step, group = idx // 3, idx % 3
    value = np.where(group == 0, step, np.where(group == 1, step + rank // 2, step + rank)) % 4
    if out["value"].dtype.kind == "b":
        value = value % 2
    out["value"] = value
    signed = out["index"].dtype.kind == "i"
    out["index"] = (rank * 5 + idx * 3) % 7 - (3 if signed else 0)
    return out


def as_op(op: str) -> object:
    """What a test passes as ``op``: the name of a built-in op, or a user Op."""
    return USER_OPS[op][0] if op in USER_OPS else op


def reduced(inputs: list[np.ndarray], op: str) -> np.ndarray:
    """The rank-order reduction of ``inputs`` with NumPy's ufunc for ``op`` (a user op:
    the test's own function above)."""
    if op in LOGICAL and len(inputs) == 1:
        return inputs[0].copy()  # as in MPI: one rank's input is combined with nothing
    if op in LOGICAL:  # MPI's: each element's truth (nonzero), as 1 or 0 of the dtype
        truth = np.stack([np.asarray(x) != 0 for x in inputs])
        result = {"land": truth.all(axis=0), "lor": truth.any(axis=0),
                  "lxor": truth.sum(axis=0) % 2 == 1}[op]
        return np.asarray(result).astype(inputs[0].dtype)
    if op in LOC_OPS:  # MPI's: the least (greatest) value, the lowest index holding it
        values = np.stack([x["value"] for x in inputs])
        index = np.stack([x["index"] for x in inputs])
        best = values.min(axis=0) if op == "minloc" else values.max(axis=0)
        lowest = np.where(values == best, index, np.iinfo(index.dtype).max).min(axis=0)
        out = np.zeros_like(inputs[0])
        out["value"], out["index"] = best, lowest
        return out
    fn = USER_OPS[op][0].fn if op in USER_OPS else NUMPY_OPS[op]
    acc = inputs[0].copy()
    for x in inputs[1:]:
        if isinstance(fn, np.ufunc):
            fn(acc, x, out=acc)
        else:
            fn(acc, x, acc)
    if op == "avg":
        np.true_divide(acc, len(inputs), out=acc)
    return acc


def assert_same(got: np.ndarray | None, expected: np.ndarray | None, what: str = "") -> None:
    if expected is None:
        assert got is None, f"{what}: expected None, got {got!r}"
        return
    assert isinstance(got, np.ndarray), f"{what}: expected an array, got {type(got).__name__}"
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    assert np.array_equal(got, expected), f"{what}:\n got {got}\n expected {expected}"


def scanned(inputs: list[np.ndarray], op: str, exclusive: bool = False) -> list:
    """Every rank's scan result, or exscan's (``exclusive``: None on rank 0, as mpicoll
    returns there). For NumPy's ufuncs their ``accumulate`` over the ranks, in the dtype
    (``np.cumsum`` for sum), avg divided by the number of ranks combined (exscan's rank r:
    r, which is scan's rank r - 1); other ops: the reduction of each prefix of ranks."""
    if op in NUMPY_OPS:
        stacked = np.stack(inputs)
        prefixes = NUMPY_OPS[op].accumulate(stacked, axis=0, dtype=stacked.dtype)
        if op == "avg":
            for r in range(len(inputs)):
                np.true_divide(prefixes[r, ...], r + 1, out=prefixes[r, ...])
        results = [prefixes[r, ...] for r in range(len(inputs))]
    else:
        results = [reduced(inputs[:r + 1], op) for r in range(len(inputs))]
    return [None, *results[:-1]] if exclusive else results


def strided(a: np.ndarray) -> np.ndarray:
    """The values of ``a`` in a view that is not C-contiguous (every other element)."""
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def to_device(x: np.ndarray | None, device: bool) -> object:
    """``x`` as a CuPy array when ``device`` (the GPU tests), else as it is."""
    if not device or x is None:
        return x
    import cupy

    return cupy.asarray(x)


def to_host(got: object, device: bool, what: str = "") -> np.ndarray | None:
    """A GPU result as NumPy, checking that it came back as a CuPy array."""
    if not device or got is None:
        return got
    import cupy

    assert isinstance(got, cupy.ndarray), f"{what}: expected a CuPy array, got {type(got)}"
    return got.get()


def run_case(comm: mpicoll.Communicator, collective: str, algorithm: str, shape: tuple[int, ...],
             dtype: str, op: str = "sum", root: int = 0, non_contiguous: bool = False,
             device: bool = False) -> None:
    """Run one collective on ``comm`` and check this rank's result against NumPy.

    With ``non_contiguous``, this rank's input is a strided view of the same values; with
    ``device``, inputs are CuPy arrays and results must come back as CuPy arrays.
    """
    p, rank = comm.size, comm.rank
    rows = (p, *shape)
    if SPECS[collective].input_rows:  # scatter, reduce_scatter, all_to_all
        inputs = [make_input(r, rows, dtype, op) for r in range(p)]
    else:
        inputs = [make_input(r, shape, dtype, op) for r in range(p)]
    x = strided(inputs[rank]) if non_contiguous else inputs[rank]
    assert not (non_contiguous and x.flags.c_contiguous), "the strided input is contiguous"
    copy = x.copy()
    x = to_device(x, device)
    what = f"{collective}/{algorithm} p={p} rank={rank} root={root} {dtype} {op} shape={shape}"
    # the call and its reference by the collective's spec (mpicoll.spec): which ranks
    # give input, whether it takes op= and root=, and what each rank must get
    spec = SPECS[collective]
    given: dict = {"algorithm": algorithm}
    if spec.reduces:
        given["op"] = as_op(op)
    if spec.rooted:
        given["root"] = root
    got = getattr(comm, collective)(
        x if rank == root or not spec.input_at_root_only else None, **given)
    expected = spec.reference(inputs, rank, root, lambda some: reduced(some, op))
    assert_same(to_host(got, device, what), expected, what)
    assert np.array_equal(to_host(x, device), copy), f"{what}: the input was modified"



# ---- barrier: a late rank, and nobody leaves before it came ------------------------------

BARRIER_DELAY = 0.3  # seconds the late rank sleeps before it enters the barrier
# every barrier algorithm, and the library's own, with the options the knomial one takes
BARRIER_CASES = [(a, {}) for a in REGISTRY["barrier"]] + [("native", {})] + \
    [("knomial", {"radix": r}) for r in (2, 4)]


def check_late_barrier(comm: mpicoll.Communicator, algorithm: str, options: dict,
                       delay: float = BARRIER_DELAY) -> None:
    """Under mpiexec: the last rank, then the first, enters ``comm.barrier`` ``delay``
    late; on every rank, no rank left before it entered (``comm`` spans COMM_WORLD)."""
    from mpi4py import MPI

    for late in dict.fromkeys((comm.size - 1, 0)):
        MPI.COMM_WORLD.Barrier()  # MPI's own: everyone starts together
        stamp = barrier_stamps(lambda: _barrier(comm, algorithm, options), comm.rank == late,
                               delay)
        check_barrier_stamps(MPI.COMM_WORLD.allgather(stamp), late,
                             f"barrier/{algorithm} {options} {comm.backend} p={comm.size}",
                             delay)


def check_late_barrier_local(size: int, algorithm: str, options: dict,
                             delay: float = 0.05) -> None:
    """``check_late_barrier`` on ``size`` local thread-ranks (one clock)."""
    import threading

    from mpicoll.local import run_local

    lates = list(dict.fromkeys((size - 1, 0)))
    start = threading.Barrier(size)  # Python's own: every thread starts together

    def body(comm):
        stamps = []
        for late in lates:
            start.wait()
            stamps.append(barrier_stamps(lambda: _barrier(comm, algorithm, options),
                                         comm.rank == late, delay))
        return stamps

    per_rank = run_local(size, body, timeout=20)
    for i, late in enumerate(lates):
        check_barrier_stamps([stamps[i] for stamps in per_rank], late,
                             f"barrier/{algorithm} {options} local p={size}", delay)


def _barrier(comm: mpicoll.Communicator, algorithm: str, options: dict) -> None:
    """``comm.barrier``; with ``async_op=True`` in ``options``, until its Work is done."""
    work = comm.barrier(algorithm=algorithm, **options)
    if options.get("async_op"):
        work.wait()


def barrier_stamps(barrier, late: bool,
                   delay: float = BARRIER_DELAY) -> tuple[str, float, float]:
    """(host, entered, left) of one ``barrier()`` call on this rank, the late one (who
    sleeps ``delay`` first) or not. Times are the monotonic clock, which all processes of
    one host share."""
    import socket
    import time

    if late:
        time.sleep(delay)
    entered = time.monotonic()
    barrier()
    return socket.gethostname(), entered, time.monotonic()


def check_barrier_stamps(stamps: list[tuple[str, float, float]], late: int, what: str,
                         delay: float = BARRIER_DELAY) -> None:
    """No rank left the barrier before rank ``late`` entered it.

    On ``late``'s host the clocks are one: each rank must leave after ``late`` entered,
    with no margin (a correct barrier cannot do otherwise, however loaded the machine).
    A rank on another host, where clocks differ, must have waited a third of the late
    rank's ``delay`` (the ranks entered together after MPI's own barrier).
    """
    host, entered, _ = stamps[late]
    early = [r for r, (h, e, left) in enumerate(stamps) if r != late and (
        left < entered if h == host else left - e < delay / 3)]
    assert not early, (f"{what}: rank(s) {early} left the barrier before rank {late} "
                       f"entered it (host, entered, left: {stamps})")


V_COLLECTIVES = ("all_gather_v", "gather_v", "scatter_v", "all_to_all_v", "reduce_scatter")
V_ALGORITHMS = {"all_gather_v": "all_gather", "gather_v": "gather", "scatter_v": "scatter",
                "all_to_all_v": "all_to_all", "reduce_scatter": "reduce_scatter"}


def check_nccl_average(comm: mpicoll.Communicator, dtype: str, cupy: object) -> None:
    """ncclAvg divides in its own way (sum times 1/p, or per part of a complex): equal to
    the NumPy reference within rounding, not bit for bit."""
    inputs = [make_input(r, (9,), dtype, "avg") for r in range(comm.size)]
    got = comm.all_reduce(cupy.asarray(inputs[comm.rank]), "avg", algorithm="native")
    expected = sum(x.astype(np.complex128) for x in inputs) / comm.size
    np.testing.assert_allclose(got.get(), expected, rtol=1e-3 if dtype == "f2" else 1e-6)


def check_every_dtype_and_op_on_device(comm: mpicoll.Communicator, algorithm: str,
                                       dtype_ops: list[tuple[str, str]], cupy: object,
                                       length: int) -> None:
    """all_reduce of every (dtype, op) on device arrays against NumPy; only NCCL's own
    collectives may refuse, and only what NCCL lacks (NCCL's avg within rounding)."""
    for dtype, op in dtype_ops:
        if op == "avg" and algorithm == "native" and comm.backend == "nccl":
            check_nccl_average(comm, dtype, cupy)
            continue
        try:
            run_case(comm, "all_reduce", algorithm, (length,), dtype, op, device=True)
        except (mpicoll.UnsupportedDtypeError, mpicoll.UnsupportedOpError) as exc:
            lacks = (comm.backend == "nccl" and "NCCL" in str(exc)) or \
                (comm.backend == "mpi" and not mpi_reduces(dtype, op) and "MPI" in str(exc))
            assert algorithm == "native" and lacks, exc


def keeps_order(collective: str, algorithm: str, op: str) -> bool:
    """Whether ``algorithm`` serves ``op``: any op, unless it reorders a non-commutative one."""
    return (op not in NON_COMMUTATIVE or algorithm in ("native", "auto")
            or not REGISTRY[collective][algorithm].commutative_only)


def v_cases(backend: str) -> list[tuple[str, str]]:
    """(v-variant, algorithm) for every algorithm that takes uneven blocks."""
    return [(v, a) for v in V_COLLECTIVES for a in mpicoll.algorithms(V_ALGORITHMS[v], backend)
            if a == "native" or not REGISTRY[V_ALGORITHMS[v]][a].even_only]


def user_op_cases(backend: str) -> list[tuple[str, str, str]]:
    """(collective, algorithm, user op) for every reducing algorithm and op it serves."""
    return [(c, a, op) for c in REDUCING for a in mpicoll.algorithms(c, backend)
            for op in USER_OPS if keeps_order(c, a, op)]


def v_rows(rank: int) -> int:
    """Rows rank ``rank`` gives in the v-variant tests: 1, 0, 3, 2, 1, 0, ... (zeros too)."""
    return (rank * 3 + 1) % 4


def v_send_rows(rank: int, dest: int) -> int:
    """Rows rank ``rank`` sends to rank ``dest`` in the all_to_all_v tests (zeros too)."""
    return (rank + 2 * dest) % 3


def run_v_case(comm: mpicoll.Communicator, collective: str, algorithm: str,
               rest: tuple[int, ...], dtype: str, op: str = "sum", root: int = 0,
               device: bool = False) -> None:
    """Run one v-variant (or reduce_scatter with counts) and check it against NumPy."""
    p, rank = comm.size, comm.rank

    def on(x):
        return to_device(x, device)

    def back(got):
        return to_host(got, device, what)

    rows = [v_rows(r) for r in range(p)]
    what = f"{collective}/{algorithm} p={p} rank={rank} root={root} {dtype} rest={rest}"
    if collective == "all_gather_v":
        inputs = [make_input(r, (rows[r], *rest), dtype) for r in range(p)]
        got, counts = comm.all_gather_v(on(inputs[rank]), algorithm=algorithm)
        assert counts == rows, what
        assert_same(back(got), np.concatenate(inputs), what)
    elif collective == "gather_v":
        inputs = [make_input(r, (rows[r], *rest), dtype) for r in range(p)]
        got, counts = comm.gather_v(on(inputs[rank]), root, algorithm=algorithm)
        assert counts == rows, what
        assert_same(back(got), np.concatenate(inputs) if rank == root else None, what)
    elif collective == "scatter_v":
        data = make_input(root, (sum(rows), *rest), dtype)
        given = rows if rank == root or rank % 2 else None  # counts are optional off the root
        got = comm.scatter_v(on(data) if rank == root else None, given, root, algorithm=algorithm)
        start = sum(rows[:rank])
        assert_same(back(got), data[start:start + rows[rank]], what)
    elif collective == "all_to_all_v":
        send = [[v_send_rows(r, d) for d in range(p)] for r in range(p)]
        inputs = [make_input(r, (sum(send[r]), *rest), dtype) for r in range(p)]
        got, counts = comm.all_to_all_v(on(inputs[rank]), send[rank], algorithm=algorithm)
        assert counts == [send[i][rank] for i in range(p)], what
        pieces = [inputs[i][sum(send[i][:rank]):sum(send[i][:rank + 1])] for i in range(p)]
        assert_same(back(got), np.concatenate(pieces), what)
    elif collective == "reduce_scatter":
        counts = [2 * r for r in rows]
        inputs = [make_input(r, (sum(counts),), dtype, op) for r in range(p)]
        got = comm.reduce_scatter(on(inputs[rank]), as_op(op), counts=counts, algorithm=algorithm)
        start = sum(counts[:rank])
        assert_same(back(got), reduced(inputs, op)[start:start + counts[rank]], what)
    else:
        raise ValueError(collective)
