"""Where mpicoll keeps what it measured on this machine (tuning tables, model fits)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ConfigError


def config_file(variable: str, name: str) -> Path:
    """The path in environment ``variable``, else ``$XDG_CONFIG_HOME/mpicoll/<name>``
    (``~/.config/mpicoll/<name>``)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    base = os.environ.get("XDG_CONFIG_HOME")
    if not base:
        try:
            base = Path.home() / ".config"
        except (RuntimeError, KeyError):  # no home folder (a user with no passwd entry
            base = Path("/nonexistent/.config")  # and no HOME): Debian's home of such users
    return Path(base) / "mpicoll" / name


def read_config(path: Path) -> str | None:
    """The text of a tuning or model file; None where there is no such file, a
    ConfigError naming it where it cannot be read."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def unwritable(path: str, directory: bool = False) -> str:
    """Why ``path`` cannot be written as a file (or, with ``directory``, made and written
    as a folder: it is made, as ``os.makedirs`` would, and a file made in it and removed),
    or "" when it can. (A folder is tried, not judged by its permissions: root may write
    anywhere by them, yet cannot make /proc/x, nor write on a read-only file system.)"""
    if directory:
        probe = os.path.abspath(path)
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)  # makedirs makes the missing ones below it
        if not os.path.isdir(probe):
            return f"{probe} is not a directory"
        try:
            os.makedirs(path, exist_ok=True)
            handle, name = tempfile.mkstemp(prefix=".mpicoll-probe-", dir=path)
            os.close(handle)
            os.remove(name)
        except OSError as exc:
            return f"it cannot be made a writable folder ({exc.strerror or exc})"
        return ""
    if os.path.isdir(path):
        return "it is a directory"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"there is no directory {folder}"
    if os.path.exists(path):
        return "" if os.access(path, os.W_OK) else "the file is read-only"
    return "" if os.access(folder, os.W_OK | os.X_OK) else f"{folder} is not writable"
