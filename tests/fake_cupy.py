"""A stand-in for CuPy 14 and its NCCL, so the GPU code paths run where there is no GPU.

It fails where CuPy fails, so a test on it shows what a GPU would:

- Its ``ndarray`` is not a NumPy array: no ``__array_interface__``, no buffer protocol,
  and NumPy may not convert it (``np.asarray(x)`` raises CuPy's TypeError). NumPy's
  ufuncs and a few array functions dispatch to it, as they do to CuPy; anything else
  that would read device memory on the host is refused.
- Devices and streams are per thread, as in CUDA: a thread starts on device 0 and its
  null stream; arrays live on the device they were made on, and a kernel on an array of
  another device raises CuPy's ValueError.
- Work that completes later does: what NCCL receives or reduces, and copies from pinned
  host memory, land in device memory only when their stream gets there (a later kernel
  or copy on that stream, its ``synchronize``, an event recorded after them). A missing
  synchronize shows as a stale (wrong) result; pinned memory reused too soon shows as
  the next call's bytes.
- ``cupy.cuda.nccl`` has CuPy 14's API: ``get_unique_id()`` returns 128 bytes and
  ``NcclCommunicator(ndev, commId: bytes, rank)`` refuses anything else; it refuses two
  ranks on one device (``ncclInvalidUsage``, as NCCL's "Duplicate GPU detected"), and
  knows bfloat16 (type 9); its methods carry CuPy's embedded C signatures (``size_t``
  counts). ``make_module(api=13)`` gives CuPy 13's tuple ids instead, and its ``int``
  count on ``broadcast``.
- A communicator spans the ranks that make it from one id (all of MPI.COMM_WORLD, a
  group, a pair), each waiting for the others as in ncclCommInitRank; a peer's messages
  match in the order issued, and a receive not exactly as long as its send raises
  NcclError (real NCCL cannot tell: a test must see it).
- ``Stream.null``, ``Stream.ptds``, the default current stream and an ``ExternalStream``
  without ``device_id`` have ``device_id == -1``, as CuPy's: the stream of whichever
  device is current.

Memory is host memory and arithmetic is NumPy's, moved by MPI: it checks mpicoll's logic,
not CUDA. The real thing runs in tests/test_gpu.py on a GPU; tests/test_gpu_api.py checks
that this stand-in's API is the real CuPy's.
"""

from __future__ import annotations

import ctypes
import itertools
import sys
import threading
import types

import ml_dtypes
import numpy as np
from dlpack_capsule import KDL_CUDA, capsule

DEVICES = 8  # enough for one device per rank in every mpiexec run of the suite
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
api = types.SimpleNamespace(version=14)  # the CuPy major version the stand-in plays


def _check_dtype(dtype) -> np.dtype:
    """CuPy's dtypes: no long double, no Python objects; bfloat16 from CuPy 14 on."""
    dtype = np.dtype(dtype)
    if dtype.hasobject or (dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f"
                                                                     else 16)):
        raise TypeError(f"Unsupported dtype {dtype}")
    if dtype == BFLOAT16 and api.version < 14:
        raise TypeError(f"Unsupported dtype {dtype}")
    return dtype
_IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
             "construct a NumPy array explicitly.")


# ---- per-thread device and stream; streams that complete later -------------------------


class _Thread(threading.local):
    def __init__(self):
        self.device = 0
        self.streams: list[Stream] = []  # entered with `with stream:` (innermost last)


_thread = _Thread()
_lock = threading.RLock()  # streams are shared by the threads of a rank
_ptrs = itertools.count(0x1000, 0x10)
_streams_by_ptr: dict[int, Stream] = {}


def current_device() -> int:
    return _thread.device


_PTDS = 2  # cudaStreamPerThread


class Stream:
    """A CUDA stream: kernels run in order on it; what completes later waits in
    ``_pending`` until the stream gets there.

    As in CuPy, ``Stream.null`` and ``Stream.ptds`` (and ``Stream(null=True)``,
    ``Stream(ptds=True)``, an ``ExternalStream`` made without ``device_id``) have
    ``device_id == -1``: they stand for that stream of whichever device is current, so
    ``Device(stream.device_id)`` fails here as on a GPU. The current stream of a thread
    that set none is ``Stream.null``.
    """

    null: Stream
    ptds: Stream

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.non_blocking = non_blocking
        self.synchronized = 0
        if null or ptds:  # a handle: the current device's legacy / per-thread stream
            self.device_id, self.ptr = -1, 0 if null else _PTDS
            return
        self._own(current_device(), next(_ptrs))
        _streams_by_ptr[self.ptr] = self

    def _own(self, device: int, ptr: int) -> None:
        self.device_id, self.ptr = device, ptr
        self._pending: list = []  # (ticket, work) in order
        self._tickets = itertools.count(1)
        self._done = 0  # tickets completed

    @classmethod
    def _default(cls, device: int, ptr: int) -> Stream:
        """The legacy null stream (ptr 0) or per-thread stream of ``device``."""
        stream = cls.__new__(cls)
        stream.non_blocking, stream.synchronized = False, 0
        stream._own(device, ptr)
        return stream

    def _here(self) -> Stream:
        """The stream that holds the work: this one, or for a handle on a stream (a
        default stream, an external one) the stream it names on the current device."""
        if "_pending" in self.__dict__:
            return self
        return _stream_of(self.ptr)

    def __repr__(self):
        return f"<stand-in Stream {self.ptr:#x} device {self.device_id}>"

    # what other work may run first (legacy null-stream semantics)
    def _neighbours(self) -> list[Stream]:
        here = self._here()
        if here.ptr == 0:
            return [s for s in [*_streams_by_ptr.values(), *_defaults.values()]
                    if s.device_id == here.device_id and not s.non_blocking and s is not here]
        return [] if here.non_blocking else [_null_stream(here.device_id)]

    def enqueue(self, work) -> int:
        here = self._here()
        with _lock:
            ticket = next(here._tickets)
            here._pending.append((ticket, work))
            return ticket

    def complete(self, upto: int | None = None) -> None:
        """Run the pending work (up to ticket ``upto``)."""
        here = self._here()
        with _lock:
            while here._pending and (upto is None or here._pending[0][0] <= upto):
                ticket, work = here._pending.pop(0)
                work()
                here._done = ticket

    def before_kernel(self) -> None:
        """A kernel (or copy) on this stream runs after everything queued before it."""
        for other in self._neighbours():
            other.complete()
        self.complete()

    def synchronize(self):
        self.synchronized += 1
        self.before_kernel()

    def wait_event(self, event):
        event.synchronize()

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def _check_device(self):
        """CuPy's check: a stream made on one device is not made current on another."""
        if self.device_id not in (-1, current_device()):
            raise RuntimeError(f"The device that the stream is created on ({self.device_id}) "
                               f"does not match with the current device ({current_device()})")

    def use(self):
        self._check_device()
        _thread.streams[-1:] = [self]
        return self

    def __enter__(self):
        self._check_device()
        _thread.streams.append(self)
        return self

    def __exit__(self, *exc):
        _thread.streams.pop()
        return False

    @classmethod
    def from_external(cls, obj):
        """CuPy 14: a stream from ``__cuda_stream__``, on the current device."""
        version, ptr = obj.__cuda_stream__()
        stream = ExternalStream(ptr)
        stream.device_id = current_device()
        return stream

    def __cuda_stream__(self):
        return (0, self.ptr)


class ExternalStream(Stream):
    """A stream CuPy did not make, by its pointer; ``device_id`` -1 unless given."""

    def __init__(self, ptr, device_id=-1):
        self.non_blocking, self.synchronized = False, 0
        self.ptr, self.device_id = int(ptr), int(device_id)


_defaults: dict[tuple[int, int], Stream] = {}  # (ptr, device): the default streams


def _null_stream(device: int) -> Stream:
    return _default_stream(0, device)


def _default_stream(ptr: int, device: int) -> Stream:
    with _lock:
        if (ptr, device) not in _defaults:
            _defaults[ptr, device] = Stream._default(device, ptr)
        return _defaults[ptr, device]


Stream.null = Stream(null=True)
Stream.ptds = Stream(ptds=True)


def _device_synchronize() -> None:
    """cudaDeviceSynchronize: every stream of the current device runs what it holds."""
    device = current_device()
    for stream in [*_streams_by_ptr.values(), *_defaults.values()]:
        if stream.device_id == device:
            stream.complete()


def get_current_stream(device_id=None) -> Stream:
    return _thread.streams[-1] if _thread.streams else Stream.null


def _stream_of(ptr: int) -> Stream:
    if ptr in (0, _PTDS):
        return _default_stream(ptr, current_device())
    return _streams_by_ptr[ptr]


class Event:
    """A CUDA event: done once its stream has run what was queued before ``record``;
    queried before that, it says not yet, and the work then completes a little later."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded = 0
        self._stream: Stream | None = None
        self._ticket = 0

    def record(self, stream=None):
        self.recorded += 1
        self._stream = (get_current_stream() if stream is None else stream)._here()
        with _lock:
            pending = self._stream._pending
            self._ticket = pending[-1][0] if pending else self._stream._done

    def synchronize(self):
        if self._stream is not None:
            for other in self._stream._neighbours():
                other.complete()
            self._stream.complete(self._ticket)

    @property
    def done(self):
        if self._stream is None or self._stream._done >= self._ticket:
            return True
        self.synchronize()  # not yet; it will be at the next query
        return False


class Device:
    """``Device(n)``: a context manager and ``use()`` making device n current for this
    thread; ``Device()`` is the current one."""

    def __init__(self, device=None):
        self._id = current_device() if device is None else int(device)
        if not 0 <= self._id < DEVICES:
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        self._saved: list[int] = []

    @property
    def id(self):
        return self._id

    @property
    def pci_bus_id(self):
        return f"0000:{self.id + 0x10:02X}:00.0"

    def use(self):
        _thread.device = self.id

    def synchronize(self):
        for stream in [*_streams_by_ptr.values(), *_defaults.values()]:
            if stream.device_id == self.id:
                stream.complete()

    def __enter__(self):
        self._saved.append(_thread.device)
        _thread.device = self.id
        return self

    def __exit__(self, *exc):
        _thread.device = self._saved.pop()
        return False

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return self.id


# ---- device arrays ----------------------------------------------------------------------


class MemoryPointer:
    def __init__(self, ptr: int, device_id: int):
        self.ptr, self.device_id = ptr, device_id


def _host_of(x):
    """The device memory behind a stand-in array (after checking it is on this device)."""
    if x.device_id != current_device():
        raise ValueError(
            f"The device where the array resides ({x.device_id}) is different from the "
            f"current device ({current_device()}). Peer access is unavailable between "
            "these devices.")
    return x._memory


# CuPy's logical ufuncs have no complex loops (cupy/_logic/ops.py)
_NO_COMPLEX_LOOPS = frozenset({np.logical_and, np.logical_or, np.logical_xor})


def _kernel_operand(value):
    if isinstance(value, ndarray):
        return _host_of(value)
    if isinstance(value, np.ndarray):  # CuPy refuses host arrays in a kernel
        raise TypeError(f"Unsupported type {type(value)}")
    return value


def _launch(fn, *operands):
    """Run ``fn`` as a kernel on the current stream: after what is queued on it."""
    get_current_stream().before_kernel()
    return fn(*operands)


def _wrap(result):
    if isinstance(result, np.ndarray):
        return ndarray._of(result)
    if isinstance(result, tuple):
        return tuple(_wrap(r) for r in result)
    return ndarray._of(np.asarray(result))  # a 0-d array, as CuPy returns


_ARRAY_FUNCTIONS = {np.copyto, np.shape, np.may_share_memory, np.shares_memory, np.ndim,
                    np.size, np.array_equal, np.concatenate, np.stack}


class ndarray:  # noqa: N801  (CuPy's name)
    """A device array: memory on a device of this process, reached only through CuPy's
    ways (``get``/``set``, kernels on the current device, DLPack and the CUDA array
    interface), never through NumPy's."""

    __array_priority__ = 100

    def __init__(self, shape, dtype=float):
        self._memory = np.empty(shape, _check_dtype(dtype))
        self.device_id = current_device()

    @classmethod
    def _of(cls, memory: np.ndarray, device_id: int | None = None) -> ndarray:
        x = cls.__new__(cls)
        x._memory = memory
        x.device_id = current_device() if device_id is None else device_id
        return x

    # -- what CuPy's array tells about itself --
    def _set_shape(self, shape):  # CuPy's: in place, no copy (AttributeError where it
        self._memory.shape = shape  # would need one)

    shape = property(lambda self: self._memory.shape, _set_shape)
    dtype = property(lambda self: self._memory.dtype)
    size = property(lambda self: self._memory.size)
    nbytes = property(lambda self: self._memory.nbytes)
    itemsize = property(lambda self: self._memory.itemsize)
    ndim = property(lambda self: self._memory.ndim)
    strides = property(lambda self: self._memory.strides)
    flags = property(lambda self: types.SimpleNamespace(
        c_contiguous=self._memory.flags.c_contiguous,
        f_contiguous=self._memory.flags.f_contiguous, owndata=self._memory.flags.owndata))
    device = property(lambda self: Device(self.device_id))
    T = property(lambda self: self._view(self._memory.T))

    @property
    def data(self):  # CuPy's MemoryPointer: .ptr is the device address
        return MemoryPointer(self._memory.__array_interface__["data"][0], self.device_id)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.data.ptr, False), "strides": None if self.flags.c_contiguous
                else self.strides, "stream": None}

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        # the consumer (a CUDA-aware MPI) reads the memory as it is now: whoever gives it
        # must have synchronized the stream that writes it
        versioned = max_version is not None and max_version[0] >= 1
        return capsule(self._memory, KDL_CUDA, self.device_id, versioned=versioned)

    def __dlpack_device__(self):
        return (KDL_CUDA, self.device_id)

    def __array__(self, *args, **kwargs):
        raise TypeError(_IMPLICIT)

    def __len__(self):
        return len(self._memory)

    def __repr__(self):
        return f"stand-in cupy array {self.shape} {self.dtype} on device {self.device_id}"

    # -- views: the same device memory --
    def _view(self, memory):
        return ndarray._of(memory, self.device_id)

    def view(self, dtype=None):
        if dtype is None:
            return self._view(self._memory.view())
        return self._view(self._memory.view(_check_dtype(dtype)))

    def reshape(self, *shape, order="C"):
        return self._view(self._memory.reshape(*shape))

    def ravel(self):
        return self.reshape(-1)

    def transpose(self, *axes):
        return self._view(self._memory.transpose(*axes))

    def __getitem__(self, key):
        if isinstance(key, ndarray):
            key = _host_of(key)
        result = self._memory[key]
        if isinstance(result, np.ndarray) and np.may_share_memory(result, self._memory):
            return self._view(result)
        return _wrap(_launch(lambda: np.array(result)))  # a gather: a new array

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray):  # CuPy refuses host arrays here (cupy#2079)
            raise TypeError(f"Unsupported type {type(value)}")
        source = _kernel_operand(value)
        target = _host_of(self)
        if isinstance(key, ndarray):
            key = _host_of(key)
        _launch(target.__setitem__, key, source)

    # -- copies between host and device (on a stream) --
    def get(self, stream=None, order="C", out=None, blocking=True):
        """Device -> host: waits for the stream (``blocking``), then copies."""
        stream = get_current_stream() if stream is None else stream
        stream.before_kernel()
        if out is None:
            return np.array(self._memory, order=order)
        if type(out) is not np.ndarray:
            raise TypeError("out must be a numpy.ndarray")
        if out.dtype != self.dtype:  # (as CuPy's: never a cast, never a broadcast)
            raise TypeError(f"{self.dtype} array cannot be got to {out.dtype} array")
        if out.shape != self.shape:
            raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, "
                             f"actual shape: {out.shape}")
        out[...] = self._memory
        return out

    def set(self, arr, stream=None):
        """Host -> device on the stream: from pinned memory the copy reads the host memory
        when the stream gets there (later); from pageable memory it reads it now."""
        if type(arr) is not np.ndarray:
            raise TypeError("set takes a numpy.ndarray")
        if arr.dtype != self.dtype:  # (as CuPy's: never a cast, never a reshape)
            raise TypeError(f"{self.dtype} array cannot be set to {arr.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        stream = get_current_stream() if stream is None else stream
        memory = self._memory
        if _is_pinned(arr):
            stream.enqueue(lambda: memory.__setitem__(..., arr.reshape(memory.shape)))
        else:
            snapshot = arr.reshape(memory.shape).copy()
            stream.enqueue(lambda: memory.__setitem__(..., snapshot))

    def copy(self, order="C"):
        return _wrap(_launch(np.array, _host_of(self)))

    def astype(self, dtype, copy=True):
        return _wrap(_launch(lambda: _host_of(self).astype(_check_dtype(dtype))))

    def fill(self, value):
        if isinstance(value, np.ndarray) and value.ndim:
            raise TypeError(f"Unsupported type {type(value)}")
        _launch(_host_of(self).fill, value)

    def take(self, indices, axis=None, out=None):
        source, index = _host_of(self), _kernel_operand(indices)
        if out is None:
            return _wrap(_launch(lambda: source.take(index, axis=axis)))
        _launch(lambda: source.take(index, axis=axis, out=_host_of(out)))
        return out

    def tobytes(self, order="C"):
        return self.get().tobytes()

    def tolist(self):
        return self.get().tolist()

    def item(self):
        return self.get().item()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def all(self):
        return _wrap(_launch(np.all, _host_of(self)))

    def any(self):
        return _wrap(_launch(np.any, _host_of(self)))

    def sum(self, axis=None, dtype=None):
        return _wrap(_launch(lambda: np.sum(_host_of(self), axis=axis, dtype=dtype)))

    # -- NumPy's dispatch: ufuncs (np.add(a, b, out=a)) run as kernels on the device --
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__":
            return NotImplemented
        operands = [_kernel_operand(x) for x in inputs]
        if ufunc in _NO_COMPLEX_LOOPS and any(
                getattr(x, "dtype", np.dtype("?")).kind == "c" for x in operands):
            types_ = tuple(x.dtype for x in operands)
            raise TypeError(f"Wrong type ({types_}) of arguments for cupy_{ufunc.__name__}")
        out = kwargs.get("out")
        if out is not None:
            outs = out if isinstance(out, tuple) else (out,)
            kwargs["out"] = tuple(_kernel_operand(o) for o in outs)
            _launch(lambda: ufunc(*operands, **kwargs))
            return out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return _wrap(_launch(lambda: ufunc(*operands, **kwargs)))

    def __array_function__(self, func, types_, args, kwargs):
        if func not in _ARRAY_FUNCTIONS:
            return NotImplemented  # NumPy then raises TypeError, as for a CuPy gap

        def unwrap(v):
            if isinstance(v, (list, tuple)):
                return type(v)(_kernel_operand(e) for e in v)
            return _kernel_operand(v)

        if func in (np.may_share_memory, np.shares_memory):
            a, b = args[:2]
            if not (isinstance(a, ndarray) and isinstance(b, ndarray)):
                return False
            return func(a._memory, b._memory)
        if func in (np.shape, np.ndim, np.size):
            return func(args[0]._memory)
        result = _launch(lambda: func(*(unwrap(a) for a in args),
                                      **{k: unwrap(v) for k, v in kwargs.items()}))
        return None if result is None else _wrap(result)

    def _binary(ufunc, reflected=False):  # noqa: N805
        if reflected:
            return lambda self, other: ufunc(other, self)
        return lambda self, other: ufunc(self, other)

    def _inplace(ufunc):  # noqa: N805
        def apply(self, other):
            ufunc(self, other, out=self)
            return self
        return apply

    __add__, __radd__, __iadd__ = _binary(np.add), _binary(np.add, True), _inplace(np.add)
    __sub__, __rsub__, __isub__ = (_binary(np.subtract), _binary(np.subtract, True),
                                   _inplace(np.subtract))
    __mul__, __rmul__, __imul__ = (_binary(np.multiply), _binary(np.multiply, True),
                                   _inplace(np.multiply))
    __truediv__, __itruediv__ = _binary(np.true_divide), _inplace(np.true_divide)
    __floordiv__, __mod__ = _binary(np.floor_divide), _binary(np.remainder)
    __and__, __or__, __xor__ = _binary(np.bitwise_and), _binary(np.bitwise_or), \
        _binary(np.bitwise_xor)
    __eq__, __ne__ = _binary(np.equal), _binary(np.not_equal)
    __lt__, __le__, __gt__, __ge__ = (_binary(np.less), _binary(np.less_equal),
                                      _binary(np.greater), _binary(np.greater_equal))
    __neg__ = lambda self: np.negative(self)  # noqa: E731
    __hash__ = None
    del _binary, _inplace


ndarray.__module__ = "cupy._core.core"


# ---- pinned host memory -----------------------------------------------------------------


class PinnedMemoryPointer(bytearray):
    """Page-locked host memory (here: ordinary memory, marked as pinned)."""


def _is_pinned(arr: np.ndarray) -> bool:
    base = arr
    while base is not None:
        if isinstance(base, PinnedMemoryPointer):
            return True
        base = getattr(base, "base", None) if not isinstance(base, memoryview) else base.obj
    return False


# ---- array creation -------------------------------------------------------------------


def _new(memory: np.ndarray) -> ndarray:
    """A new device array holding ``memory``'s values (a copy on the current stream)."""
    get_current_stream().before_kernel()
    _check_dtype(memory.dtype)
    return ndarray._of(np.array(memory))


def asarray(a, dtype=None, order=None):
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    return _new(np.asarray(a, dtype=dtype))


def from_dlpack(x, version: int = 14):
    """A device array sharing a CUDA DLPack tensor's memory (this stand-in's arrays)."""
    device_type = int(x.__dlpack_device__()[0])
    if device_type != KDL_CUDA:
        raise TypeError(f"Unsupported array type: {device_type}")
    source = getattr(x, "_memory", None)
    if source is None:
        raise TypeError("the stand-in imports only its own CUDA tensors")
    if source.dtype == BFLOAT16 and version < 14:
        raise NotImplementedError("CuPy does not support bfloat16 yet")  # CuPy <= 13
    return ndarray._of(source, getattr(x, "device_id", 0))


def _cupy_copyto(dst, src, casting="same_kind"):
    np.copyto(dst, src, casting=casting)


# ---- cupy.cuda.nccl over MPI: NCCL's calls by address, run as MPI's ---------------------

_NCCL_DTYPES = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
                6: np.float16, 7: np.float32, 8: np.float64, 9: ml_dtypes.bfloat16}


class NcclError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _memory(ptr: int, count: int, datatype: int) -> np.ndarray:
    dtype = np.dtype(_NCCL_DTYPES[datatype])
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype)


def _land(stream: Stream, target: np.ndarray, arrived: np.ndarray) -> None:
    """What NCCL wrote reaches device memory when the stream gets there."""
    stream.enqueue(lambda: target.__setitem__(..., arrived))


class _Group:
    depth = 0
    pending: list = []


def groupStart():  # noqa: N802  (NCCL's names)
    _Group.depth += 1


def groupEnd():  # noqa: N802
    """The group's messages move now (host memory for the wire); what they deliver lands
    on the stream later."""
    _Group.depth -= 1
    if _Group.depth == 0:
        pending, _Group.pending = _Group.pending, []
        _moved([call() for call in pending])  # point-to-point: all posted, then waited


def _moved(posted: list) -> None:
    """Wait for the posted (request, after) pairs, then run each ``after(status)``: a
    receive's raises NcclError where its message was not exactly as long (real NCCL
    cannot tell; a test must see it)."""
    from mpi4py import MPI

    requests = [MPI.REQUEST_NULL if request is None else request for request, _ in posted]
    statuses = [MPI.Status() for _ in posted]
    try:
        MPI.Request.Waitall(requests, statuses)
    except MPI.Exception as exc:  # a message longer than its receive
        raise NcclError(5, f"NCCL_ERROR_INVALID_USAGE: the stand-in: {exc}") from exc
    errors = []
    for (_, after), status in zip(posted, statuses, strict=True):
        if after is not None:
            try:
                after(status)
            except NcclError as exc:
                errors.append(exc)
    if errors:
        raise errors[0]


_ids = itertools.count(1)  # the unique ids this process made


def _unique_id() -> bytes:
    """NCCL's 128 bytes (some above 127, as real ids have): the first eight say which
    rank of MPI.COMM_WORLD made the id and its number there, by which the ranks of the
    communicator find each other (real NCCL: a socket address in the id)."""
    from mpi4py import MPI

    raw = bytearray(range(128, 256))
    raw[:8] = np.array([MPI.COMM_WORLD.Get_rank(), next(_ids)], "<u4").tobytes()
    return bytes(raw)


_MEETING_TAGS = 1 << 24  # COMM_WORLD tags of the ranks meeting at an id: from here up


def _members(ndev: int, raw: bytes, rank: int) -> tuple[list[int], int]:
    """The MPI.COMM_WORLD ranks of a communicator's ranks 0..ndev-1, as the rank that
    made the id (one of them, as in mpicoll) gathers and tells them, and the id's tag:
    each rank of ``NcclCommunicator(ndev, id, rank)`` waits here for all of them, as in
    ncclCommInitRank."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    maker, number = (int(v) for v in np.frombuffer(raw[:8], "<u4"))
    tag = _MEETING_TAGS + number % (world.Get_attr(MPI.TAG_UB) - _MEETING_TAGS)
    mine = np.array([rank, world.Get_rank()], np.int64)
    members = np.full(ndev, -1, np.int64)
    sent = world.Isend(mine, maker, tag)
    if world.Get_rank() == maker:
        came = []  # the world ranks that came, each told the outcome
        for _ in range(ndev):
            got = np.empty(2, np.int64)
            world.Recv(got, MPI.ANY_SOURCE, tag)
            came.append(int(got[1]))
            if 0 <= got[0] < ndev and members[got[0]] < 0:
                members[got[0]] = got[1]
        if (members < 0).any():  # a rank twice, or out of range: every rank refuses
            members[:] = -2
        for r in came:
            if r != maker:
                world.Send(members, r, tag)
    sent.Wait()
    if world.Get_rank() != maker:
        world.Recv(members, maker, tag)
    if (members < 0).any():
        raise NcclError(4, "NCCL_ERROR_INVALID_ARGUMENT: invalid argument (ranks)")
    return members.tolist(), tag


class NcclCommunicator:
    """NCCL's communicator for ranks of MPI.COMM_WORLD (all, or some: those that call it
    with the same id), moving bytes with MPI on a communicator of their own, in NCCL's
    rank order. As NCCL's, it matches a peer's messages in the order they are issued, and
    a receive must be exactly as long as its send (here a mismatch raises NcclError).

    CuPy 14's signature; with ``api=13`` (``make_module(api=13)``), CuPy 13's tuple id.
    """

    api = 14

    def __init__(self, ndev, commId, rank, config=None):  # noqa: N803
        from mpi4py import MPI

        if self.api >= 14 and type(commId) is not bytes:
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got "
                            f"{type(commId).__name__})")
        if self.api < 14:
            if type(commId) is not tuple:
                raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got "
                                f"{type(commId).__name__})")
            if any(not -128 <= int(c) <= 127 for c in commId):  # x86's signed char
                raise OverflowError("value too large to convert to char")
        if len(commId) != 128:
            raise ValueError(f"commId length {len(commId)} != 128.")
        world = MPI.COMM_WORLD
        if not 0 <= rank < ndev <= world.Get_size():
            raise NcclError(4, "NCCL_ERROR_INVALID_ARGUMENT: invalid argument")
        members, tag = _members(ndev, bytes(int(c) & 0xFF for c in commId), rank)
        group = world.Get_group().Incl(members)
        comm = world.Create_group(group, tag)
        group.Free()
        # NCCL refuses two ranks on one GPU of a node (the device index tells, among the
        # ranks MPI puts on this node: under the two-node SLURM stand-in, per node)
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, world.Get_rank())
        devices = node.allgather(current_device())
        node.Free()
        if devices.count(current_device()) > 1:
            comm.Free()
            raise NcclError(5, "NCCL_ERROR_INVALID_USAGE: invalid usage (Duplicate GPU "
                               "detected)")
        self._comm = comm
        self.device = current_device()

    def _check_device(self):
        if current_device() != self.device:
            raise NcclError(1, "NCCL_ERROR_UNHANDLED_CUDA_ERROR: the stream is on another "
                               "device than the communicator")

    def _op(self, op):
        from mpi4py import MPI

        return {0: MPI.SUM, 1: MPI.PROD, 2: MPI.MAX, 3: MPI.MIN, 4: MPI.SUM}[op]

    def _reduce_in(self, send, op):
        """MPI cannot reduce bfloat16: reduce it as float32 (exact for the tests)."""
        return send.astype(np.float32) if send.dtype == ml_dtypes.bfloat16 else send

    def _average(self, buf, op):
        if op == 4:
            buf /= self._comm.Get_size()
        return buf

    def _queue(self, post, after=None):
        """Post now (or at groupEnd); ``after(status)`` runs once the messages have moved."""
        if _Group.depth:
            _Group.pending.append(lambda: (post(), after))
        else:
            _moved([(post(), after)])

    def send(self, ptr, count, datatype, peer, stream):
        """NcclCommunicator.send(self, intptr_t sendbuf, size_t count, int datatype, int peer, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        # synchronous: a send ends only once its receive is posted, as NCCL's kernels
        self._check_device()
        source = _stream_of(stream)
        source.before_kernel()  # the send reads what the stream wrote before it
        data = _memory(ptr, count, datatype).copy()
        self._queue(lambda: self._comm.Issend(data, peer, 7))

    def recv(self, ptr, count, datatype, peer, stream):
        """NcclCommunicator.recv(self, intptr_t recvbuf, size_t count, int datatype, int peer, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        self._check_device()
        target = _memory(ptr, count, datatype)
        arrived = np.empty(target.nbytes + 1, np.uint8)  # room to see a longer message

        def land(status):
            from mpi4py import MPI

            got = status.Get_count(MPI.BYTE)
            if got != target.nbytes:
                raise NcclError(5, f"NCCL_ERROR_INVALID_USAGE: the stand-in: a receive of "
                                   f"{target.nbytes} bytes from rank {peer} met a send of "
                                   f"{'more' if got > target.nbytes else got} bytes")
            _land(_stream_of(stream), target, arrived[:-1].view(target.dtype))

        self._queue(lambda: self._comm.Irecv(arrived, peer, 7), land)

    def _collective(self, stream, compute, target):
        """A collective: computed over MPI now, landing in ``target`` later."""
        self._check_device()
        _stream_of(stream).before_kernel()
        result = []

        def post():
            result.append(compute())

        def land(status):
            if target is not None:
                _land(_stream_of(stream), target, result[0].astype(target.dtype))

        self._queue(lambda: post() or None, land)

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        """NcclCommunicator.allReduce(self, intptr_t sendbuf, intptr_t recvbuf, size_t count, int datatype, int op, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        send = _memory(sendbuf, count, datatype).copy()

        def compute():
            total = np.empty_like(self._reduce_in(send, op))
            self._comm.Allreduce(self._reduce_in(send, op), total, self._op(op))
            return self._average(total, op)

        self._collective(stream, compute, _memory(recvbuf, count, datatype))

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        """NcclCommunicator.reduce(self, intptr_t sendbuf, intptr_t recvbuf, size_t count, int datatype, int op, int root, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        send = _memory(sendbuf, count, datatype).copy()
        at_root = self._comm.Get_rank() == root

        def compute():
            total = np.empty_like(self._reduce_in(send, op)) if at_root else None
            self._comm.Reduce(self._reduce_in(send, op), total, self._op(op), root)
            return self._average(total, op) if at_root else None

        self._collective(stream, compute, _memory(recvbuf, count, datatype) if at_root else None)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        """NcclCommunicator.broadcast(self, intptr_t sendbuff, intptr_t recvbuff, size_t count, int datatype, int root, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        data = _memory(sendbuff, count, datatype).copy()

        def compute():
            self._comm.Bcast(data, root)
            return data

        self._collective(stream, compute, _memory(recvbuff, count, datatype))

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        """NcclCommunicator.allGather(self, intptr_t sendbuf, intptr_t recvbuf, size_t count, int datatype, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        mine = _memory(sendbuf, count, datatype).copy()
        p = self._comm.Get_size()

        def compute():
            rows = np.empty(p * count, mine.dtype)
            self._comm.Allgather(mine, rows)
            return rows

        self._collective(stream, compute, _memory(recvbuf, p * count, datatype))

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        """NcclCommunicator.reduceScatter(self, intptr_t sendbuf, intptr_t recvbuf, size_t recvcount, int datatype, int op, intptr_t stream)"""  # noqa: E501 - CuPy 14's embedded signature
        p = self._comm.Get_size()
        send = _memory(sendbuf, p * recvcount, datatype).copy()

        def compute():
            mine = np.empty(recvcount, self._reduce_in(send, op).dtype)
            self._comm.Reduce_scatter_block(self._reduce_in(send, op), mine, self._op(op))
            return self._average(mine, op)

        self._collective(stream, compute, _memory(recvbuf, recvcount, datatype))

    def destroy(self):
        """NcclCommunicator.destroy(self)"""  # noqa: E501 - CuPy 14's embedded signature
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    def abort(self):
        """NcclCommunicator.abort(self)"""  # noqa: E501 - CuPy 14's embedded signature
        # ncclCommAbort: ends the communicator at once, waiting for no peer; as CuPy's,
        # once aborted (or destroyed) a later abort or destroy does nothing
        if self._comm is not None:
            self._comm.Free()
            self._comm = None


# ---- the module -------------------------------------------------------------------------


def make_module(api: int = 14) -> types.ModuleType:
    """A fresh ``cupy`` module with ``cupy.cuda`` and ``cupy.cuda.nccl``: CuPy 14's API,
    or CuPy 13's (``api=13``: tuple NCCL ids, no bfloat16 through DLPack)."""
    cupy = types.ModuleType("cupy")
    cupy.__version__ = f"{api}.0.0+numpy-stand-in"
    cupy.ndarray = ndarray
    cupy.empty = lambda shape, dtype=float: _launch(lambda: ndarray(shape, dtype))
    cupy.zeros = lambda shape, dtype=float: _new(np.zeros(shape, dtype))
    cupy.ones = lambda shape, dtype=float: _new(np.ones(shape, dtype))
    cupy.full = lambda shape, value, dtype=None: _new(np.full(shape, value, dtype))
    cupy.arange = lambda *args, dtype=None: _new(np.arange(*args, dtype=dtype))
    cupy.empty_like = lambda a, dtype=None: cupy.empty(a.shape, dtype or a.dtype)
    cupy.zeros_like = lambda a, dtype=None: cupy.zeros(a.shape, dtype or a.dtype)
    cupy.asarray = asarray
    cupy.array = lambda a, dtype=None: _new(np.asarray(a, dtype=dtype)) \
        if not isinstance(a, ndarray) else a.copy()
    cupy.ascontiguousarray = lambda a: a if a.flags.c_contiguous else a.copy()
    cupy.may_share_memory = lambda a, b: np.may_share_memory(a._memory, b._memory)
    cupy.shares_memory = lambda a, b: np.shares_memory(a._memory, b._memory)
    cupy.asnumpy = lambda a, stream=None: a.get(stream=stream)
    cupy.copyto = _cupy_copyto
    cupy.stack = lambda arrays, axis=0: np.stack(arrays, axis)  # (dispatched to ndarray's
    cupy.concatenate = lambda arrays, axis=0: np.concatenate(arrays, axis)  # own, as CuPy's)
    cupy.from_dlpack = lambda x: from_dlpack(x, api)
    cupy.float32, cupy.float64, cupy.int32 = np.float32, np.float64, np.int32

    cuda = types.ModuleType("cupy.cuda")
    cuda.get_current_stream = get_current_stream
    cuda.alloc_pinned_memory = lambda nbytes: PinnedMemoryPointer(nbytes)
    cuda.Stream = Stream
    cuda.ExternalStream = ExternalStream
    cuda.Event = Event
    cuda.Device = Device
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: DEVICES, getDevice=current_device, runtimeGetVersion=lambda: 0,
        deviceSynchronize=_device_synchronize,
        getDeviceProperties=lambda n: {"name": b"NumPy stand-in"},
        CUDARuntimeError=RuntimeError)
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available = True
    nccl.get_version = lambda: 23203
    nccl.NcclError = NcclError
    if api >= 14:
        nccl.get_unique_id = _unique_id
    else:  # C chars: signed on x86
        nccl.get_unique_id = lambda: tuple(b - 256 if b > 127 else b for b in _unique_id())
    nccl.groupStart, nccl.groupEnd = groupStart, groupEnd
    members = {"api": api}
    if api < 14:  # CuPy 13 declares broadcast's count a C int (size_t from cupy#8562)
        def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
            """NcclCommunicator.broadcast(self, intptr_t sendbuff, intptr_t recvbuff, int count, int datatype, int root, intptr_t stream)"""  # noqa: E501
            if not -2**31 <= count < 2**31:
                raise OverflowError("value too large to convert to int")
            return NcclCommunicator.broadcast(self, sendbuff, recvbuff, count, datatype, root,
                                              stream)

        members["broadcast"] = broadcast
    nccl.NcclCommunicator = type("NcclCommunicator", (NcclCommunicator,), members)
    for name, value in (("NCCL_SUM", 0), ("NCCL_PROD", 1), ("NCCL_MAX", 2), ("NCCL_MIN", 3),
                        ("NCCL_AVG", 4), ("NCCL_UINT8", 1), ("NCCL_FLOAT32", 7),
                        ("NCCL_BFLOAT16", 9)):
        setattr(nccl, name, value)
    cuda.nccl = nccl
    cupy.cuda = cuda
    return cupy


_NAMES = ("cupy", "cupy.cuda", "cupy.cuda.nccl")


class installed:
    """``with installed():`` makes ``import cupy`` (and cupy.cuda.nccl) give the stand-in
    (``installed(api=13)``: CuPy 13's API)."""

    def __init__(self, api: int = 14):
        self.api = api

    def __enter__(self):
        self._saved = {name: sys.modules.get(name) for name in _NAMES}
        self._saved_api, api.version = api.version, self.api
        cupy = make_module(self.api)
        sys.modules.update({"cupy": cupy, "cupy.cuda": cupy.cuda,
                            "cupy.cuda.nccl": cupy.cuda.nccl})
        return cupy

    def __exit__(self, *exc):
        api.version = self._saved_api
        for name, module in self._saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        return False
