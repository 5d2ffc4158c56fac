"""Where mpicoll keeps what it measured on this machine (tuning tables, model fits)."""

from __future__ import annotations

import os
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
