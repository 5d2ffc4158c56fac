"""Choose: the function that runs a call, from agreed values only.

``algorithm="auto"`` is resolved by ``mpicoll.selection`` from the collective, the
agreed size in bytes, the number of ranks, the op's properties and the tables the ranks
agreed on when the Communicator was made; a named algorithm is looked up in the registry
and refused, with the names that would serve, where it cannot run the call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import selection
from ..algorithms import COLLECTIVES, OPTION_MINIMUM, REGISTRY
from ..errors import InvalidArgumentError, MpicollError, UnsupportedDtypeError, UnsupportedOpError
from ..ops import Op
from ..spec import SPECS
from .validate import Verdict

if TYPE_CHECKING:
    from ..backends import Backend


def algorithms(collective: str, backend: str) -> list[str]:
    """``collective``'s algorithm names, and "native" where ``backend``'s library has it."""
    names = list(REGISTRY[collective])
    return names + ["native"] if backend in SPECS[collective].native_on else names


def _drops_nan(op: Op | None, dtype: np.dtype | None) -> bool:
    """Whether the library's own op may give another result than mpicoll's where a
    value is NaN: min and max (and minloc, maxloc) on floating values (MPI's MPI_MIN is
    a < b ? a : b, which keeps or drops a NaN by the order of its operands; NumPy's, and
    mpicoll's loc ops, let it win). "auto" leaves those calls to mpicoll's algorithms, so
    a call's result never depends on the size that chose the algorithm;
    ``algorithm="native"`` still gives the library's."""
    if op is None or dtype is None or not op.builtin:
        return False
    if op.name in ("minloc", "maxloc") and dtype.fields and "value" in dtype.fields:
        return dtype.fields["value"][0].kind == "f"  # (mpicoll's: the NaN wins there too)
    return op.name in ("min", "max") and dtype.kind == "f"


class Chooser:
    """Resolves ``algorithm=`` for one Communicator (its backend, size and tables)."""

    def __init__(self, backend: Backend, size: int, tables: selection.Tables) -> None:
        self.backend, self.size, self.tables = backend, size, tables
        self.tracer: Any = None
        self.watch: Any = None  # mpicoll.observe.recorder.Watch: the flight recorder's algorithm, bytes
        self._functions: dict[tuple[str, Any], tuple[Callable[..., None], Any]] = {}
        self._auto: dict[tuple, str] = {}  # what "auto" picked, by call
        self._native_ok: dict[tuple[Any, np.dtype], bool] = {}
        self._resolved: dict[tuple, Callable[..., None]] = {}  # function() by its arguments

    def pick(self, verdict: Verdict, collective: str, algorithm: Any, nbytes: int,
             op: Op | None = None, options: dict[str, Any] | None = None, *,
             dtype: np.dtype | None = None, uneven: bool = False) -> Callable[..., None] | None:
        """``function``, with a refusal kept in ``verdict.params`` (None returned)."""
        try:
            return self.function(collective, algorithm, nbytes, op, options, dtype=dtype,
                                 uneven=uneven)
        except MpicollError as exc:
            verdict.refuse("params", exc)
            return None

    def function(self, collective: str, algorithm: Any, nbytes: int, op: Op | None = None,
                 options: dict[str, Any] | None = None, *, dtype: np.dtype | None = None,
                 uneven: bool = False, library: bool = True) -> Callable[..., None]:
        """The function that runs ``algorithm`` (resolving "auto"), or a clear refusal.

        Refused: an unknown name; a non-commutative op on an algorithm that reorders
        operands; uneven blocks on an algorithm that needs equal ones; tuning options
        the algorithm does not take; "native" where the library cannot reduce the
        dtype. "auto" never picks a refused one, nor "native" where ``library`` is False
        (a compressed call: the library would send the values uncompressed).
        """
        if not isinstance(algorithm, str):
            raise InvalidArgumentError(
                f"algorithm: expected a name (str), got {type(algorithm).__name__}")
        if options or self.tracer is not None:
            fn, name = self._resolve(collective, algorithm, nbytes, op, options, dtype, uneven,
                                     library)
        else:  # every call asks this: what was resolved once is looked up (auto by size)
            key = (collective, algorithm, nbytes if algorithm == "auto" else -1, _op_key(op),
                   dtype, uneven, library)
            resolved = self._resolved.get(key)
            if resolved is None:
                resolved = self._resolve(collective, algorithm, nbytes, op, options, dtype,
                                         uneven, library)
                if len(self._resolved) > 4096:
                    self._resolved.clear()
                self._resolved[key] = resolved
            fn, name = resolved
        watch = self.watch
        if watch is not None:  # the flight recorder's algorithm and bytes of this call
            watch.current.chose(name, nbytes)
        return fn

    def _resolve(self, collective: str, algorithm: Any, nbytes: int, op: Op | None,
                 options: dict[str, Any] | None, dtype: np.dtype | None,
                 uneven: bool, library: bool = True) -> tuple[Callable[..., None], str]:
        """(the function, the algorithm's name) for ``function``."""
        if options and "out" in options:  # (a collective without out= took it as an option)
            raise InvalidArgumentError(
                "out: this call takes no out= (it returns its result; its keywords besides "
                f"algorithm= are tuning options of the {collective} algorithms)")
        if options and "compress" in options:  # (all_reduce's keyword: an option here)
            raise InvalidArgumentError(
                f"compress: {collective} takes no compress= (all_reduce alone compresses "
                "its messages)")
        if algorithm == "auto":
            if options:
                raise auto_takes_no_options(collective, options)
            algorithm = self.auto(collective, nbytes, op, dtype, uneven, library)
        entry = self._functions.get((collective, algorithm))
        if entry is None:
            entry = self._functions[(collective, algorithm)] = self._lookup(collective, algorithm)
        fn, registered = entry
        if self.tracer is not None:
            self.tracer.chose(algorithm, nbytes)
        self.refuse(collective, algorithm, registered, op, dtype, uneven)
        if registered is None:  # native
            if options:
                raise InvalidArgumentError(f"{', '.join(options)}: 'native' takes no tuning options")
            return fn, algorithm
        if options:
            options = self._options(collective, algorithm, registered, options)
            return functools.partial(fn, **options), algorithm
        return fn, algorithm

    def refuse(self, collective: str, algorithm: str, registered: Any, op: Op | None,
               dtype: np.dtype | None, uneven: bool) -> None:
        """Raise what the algorithm (``registered``, from ``_lookup``; None: native)
        refuses of a call's op and blocks, the same at every call (a plan: at init)."""
        if registered is None:  # native: the library must know dtype and op
            if op is not None and not self.native_serves(op, dtype):
                self.backend.op_check(op, dtype)
            return
        if op is not None and registered.commutative_only and not op.commutative:
            able = [a.name for a in REGISTRY[collective].values() if not a.commutative_only]
            raise UnsupportedOpError(
                f"algorithm: {collective} {str(algorithm)!r} needs a commutative op; "
                f"{op.name!r} is not. Algorithms that keep rank order: {', '.join(able)}"
                + (", native" if collective in self.backend.native else ""))
        if uneven and registered.even_only:
            able = [a.name for a in REGISTRY[collective].values() if not a.even_only]
            raise InvalidArgumentError(
                f"algorithm: {collective} {str(algorithm)!r} needs equal blocks; for uneven "
                f"counts use one of {', '.join(able + (['native'] if collective in self.backend.native else []))}")

    def auto(self, collective: str, nbytes: int, op: Op | None, dtype: np.dtype | None,
             uneven: bool, library: bool = True) -> str:
        """What "auto" runs: cached by the values that decide it."""
        native_ok = library and collective in self.backend.native and \
            self.native_serves(op, dtype) and not _drops_nan(op, dtype)
        key = (collective, nbytes, op is None or op.commutative, native_ok, uneven)
        picked = self._auto.get(key)
        if picked is None:
            if len(self._auto) > 4096:
                self._auto.clear()
            # NCCL's own collectives are tuned for the GPU: auto takes them where they
            # serve; tables and thresholds measured over MPI do not apply to NCCL
            picked = self._auto[key] = (
                "native" if native_ok and self.backend.auto_prefers_native
                else selection.select(collective, nbytes, self.size, op, native_ok, uneven,
                                      tables=self.tables, nodes=self._nodes()))
        return picked

    def packet_mover(self) -> str:
        """The algorithm that moves a root's header packet (``agree.broadcast``): MPI's
        own broadcast ("native") where the backend has one, else a binomial tree."""
        return "native" if "broadcast" in self.backend.control_native else "binomial"

    def label(self, algorithm: str, nbytes: int) -> None:
        """Name what the call's messages from here are moved by (the flight recorder's
        entry, the trace's events), where no ``function`` chose it."""
        if self.watch is not None:
            self.watch.current.chose(algorithm, nbytes)
        if self.tracer is not None:
            self.tracer.chose(algorithm, nbytes)

    def runs(self, collective: str, nbytes: int, op: Op | None, dtype: np.dtype | None,
             uneven: bool) -> str:
        """What "auto" runs for a call moving ``nbytes`` (``comm.auto_algorithm``): as
        ``auto``, but where the data goes in the root's header packet (a broadcast, or a
        scatter's rows, up to the backend's ``packed_bytes``), what moves the packet: a
        broadcast's algorithm for the packet's size; a scatter's, ``packet_mover``."""
        limit = self.backend.packed_bytes
        if collective == "broadcast" and nbytes <= limit:
            from .agree import HEADER_BYTES

            return self.auto("broadcast", HEADER_BYTES + limit, None, None, False)
        if collective == "scatter" and nbytes <= limit:
            return self.packet_mover()
        return self.auto(collective, nbytes, op, dtype, uneven)

    def _nodes(self) -> tuple[int, ...]:
        """The ranks of each node (from the transport's agreed node of each rank)."""
        nodes = getattr(self.backend.transport, "nodes", None)
        if not nodes:
            return (self.size,)
        return tuple(nodes.count(node) for node in dict.fromkeys(nodes))

    @staticmethod
    def _options(collective: str, algorithm: str, registered: Any,
                 options: dict[str, Any]) -> dict[str, int]:
        phases = dict(registered.phases)
        for name, value in options.items():
            if name not in registered.options:
                takes = ", ".join(registered.options) or "none"
                raise InvalidArgumentError(
                    f"{name}: {collective} {str(algorithm)!r} takes no option {name!r} "
                    f"(its options: {takes})")
            if name in phases:  # the algorithm of a phase, by name
                # (a phase runs on one node's ranks or one per node: an algorithm made
                # of phases itself would find one node there)
                able = [a for a in REGISTRY[phases[name][0]] if all(
                    a in REGISTRY[c] and not REGISTRY[c][a].steps for c in phases[name])]
                # (a name only: an array of one name compares equal to it, and would
                # reach the registry's lookup on the ranks that run the phase alone)
                if not isinstance(value, str) or value not in able:
                    raise InvalidArgumentError(
                        f"{name}: expected one of {', '.join(able)} (the algorithm of "
                        f"{algorithm}'s {' and '.join(phases[name])} phase), got {value!r}")
                continue
            if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
                    or value < OPTION_MINIMUM[name]):
                raise InvalidArgumentError(
                    f"{name}: expected an int >= {OPTION_MINIMUM[name]}, got {value!r}")
        return {k: v if k in phases else int(v) for k, v in options.items()}

    def _lookup(self, collective: str, algorithm: Any) -> tuple[Callable[..., None], Any]:
        """(function, registry entry) of a name; the entry is None for "native"."""
        if algorithm == "native":
            fn = self.backend.native.get(collective)
            if fn is None:
                name = self.backend.name
                raise InvalidArgumentError(
                    f"algorithm: 'native' needs a library collective; backend {name!r} has "
                    + (f"no {collective}; use one of {', '.join(algorithms(collective, name))}"
                       if self.backend.has_native else "none"))
            return fn, None
        registered = REGISTRY[collective].get(algorithm) if isinstance(algorithm, str) else None
        if registered is None:
            names = algorithms(collective, self.backend.name)
            raise InvalidArgumentError(
                f"algorithm: unknown {collective} algorithm {algorithm!r}; expected "
                f"'auto' or one of {', '.join(names)}")
        return registered.fn, registered

    def native_serves(self, op: Op | None, dtype: np.dtype | None) -> bool:
        """Whether "native" can run this call (the library knows the dtype and op: NCCL
        has no bitwise, logical or user's op, which then go to mpicoll's algorithms)."""
        if not self.backend.has_native:
            return False
        if op is None or dtype is None:
            return True
        key = (_op_key(op), dtype)
        ok = self._native_ok.get(key)
        if ok is None:
            try:
                self.backend.op_check(op, dtype)
                ok = True
            except (UnsupportedDtypeError, UnsupportedOpError):
                ok = False
            self._native_ok[key] = ok
        return ok


def _op_key(op: Op | None) -> Any:
    """An op as the caches key it: a built-in by itself, a user's by what decides for it
    (never the Op itself: a cache must not keep a user's Op, nor its MPI op, alive)."""
    return op if op is None or op.builtin else ("user", op.commutative)


def check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise InvalidArgumentError(
            f"collective: unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


# the keywords of the collectives' calls (a misspelled one arrives as a tuning option)
_CALL_KEYWORDS = ("algorithm", "op", "root", "out", "counts", "compress", "stream", "async_op")


def auto_takes_no_options(collective: str, options: dict[str, Any]) -> InvalidArgumentError:
    """The refusal of keywords "auto" cannot take: a tuning option (an algorithm's own
    keyword) names the algorithms that take it; another name, the call's keyword it is
    closest to (``algoritm=`` is a misspelled ``algorithm=``, no tuning option)."""
    import difflib

    takers: dict[str, list[str]] = {}
    for algorithm, registered in REGISTRY.get(collective, {}).items():
        for option in getattr(registered, "options", ()):
            takers.setdefault(option, []).append(algorithm)
    said = []
    for name in options:
        if name in takers:
            said.append(f"{name}= is a tuning option of {collective} {', '.join(takers[name])}: "
                        "give algorithm= one of them (tuning options need a named algorithm, "
                        "not 'auto')")
            continue
        close = difflib.get_close_matches(  # (another name: root= is no keyword of
            name, sorted({*_CALL_KEYWORDS, *takers} - {name}), n=1,  # all_reduce's, and
            cutoff=0.75)  # "did you mean root=?" would say nothing)
        said.append(f"{name}= is no keyword of {collective}" + (
            f" (did you mean {close[0]}=?)" if close else
            " nor a tuning option of its algorithms (tuning options need a named algorithm, "
            "not 'auto')"))
    return InvalidArgumentError("; ".join(said))
