"""Old module names, from before the package was grouped, import the modules that moved.

``import mpicoll.native`` gives ``mpicoll.backends.mpi_native`` itself (the same module
object, so a patch through either name is seen by both), for scripts and notebooks
written against the flat layout. New code uses the new names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED = {  # old name -> where it lives now
    "mpicoll.native": "mpicoll.backends.mpi_native",
    "mpicoll.native_nccl": "mpicoll.backends.nccl_native",
    "mpicoll.tuning": "mpicoll.selection.tuning",
    "mpicoll.mpich_rules": "mpicoll.selection.mpich_rules",
    "mpicoll.mpich_selection": "mpicoll.selection.mpich_json",
    "mpicoll.recorder": "mpicoll.observe.recorder",
    "mpicoll.watchdog": "mpicoll.observe.watchdog",
    "mpicoll.abort": "mpicoll.observe.abort",
    "mpicoll.tracing": "mpicoll.observe.tracing",
    "mpicoll.monitored": "mpicoll.observe.monitored",
    "mpicoll.hang": "mpicoll.observe.hang",
    "mpicoll.tracefile": "mpicoll.observe.tracefile",
    "mpicoll.arrays": "mpicoll.buffers.arrays",
    "mpicoll.cuda": "mpicoll.buffers.cuda",
}


class OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module now at its new name."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # its own spec, which the import system
        return module  # overwrites with the old name's: exec_module gives it back

    def exec_module(self, module: ModuleType) -> None:
        own = module.__spec__.loader_state
        if own is not None:
            module.__spec__ = own

    def get_code(self, fullname: str) -> object:
        """``python -m`` with an old name runs the module at its new name (as __main__)."""
        return compile(f"import runpy; runpy.run_module({MOVED[fullname]!r}, "
                       "run_name='__main__', alter_sys=True)", f"<{fullname}>", "exec")

    def is_package(self, fullname: str) -> bool:
        return False


def attribute(name: str) -> ModuleType:
    """``mpicoll.<old name>`` as an attribute (as the flat package had them, imported
    with it): the module at its new name; AttributeError for any other name."""
    moved = MOVED.get(f"mpicoll.{name}")
    if moved is None:
        raise AttributeError(f"module 'mpicoll' has no attribute {name!r}")
    return importlib.import_module(moved)


def install() -> None:
    if not any(isinstance(finder, OldNames) for finder in sys.meta_path):
        sys.meta_path.append(OldNames())
