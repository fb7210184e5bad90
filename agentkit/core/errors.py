"""One error hierarchy for everything a user controls.

Every error says what was given, what was expected, and how to fix it. Causes are kept with
``raise ... from err`` so the original type and traceback survive.
"""

from __future__ import annotations

import difflib
import errno
import os
import shutil
from collections.abc import Iterable


class AgentkitError(Exception):
    """Base class of every error agentkit raises on purpose."""


class ConfigError(AgentkitError, ValueError):
    """A setting, flag or config file is invalid."""


class UnknownNameError(AgentkitError, KeyError):
    """A plugin name (environment id, objective, ...) is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class PluginError(AgentkitError):
    """A plugin was found but could not be imported or does not satisfy its protocol."""


class MissingDependencyError(AgentkitError, ImportError):
    """An optional dependency (an extra) is not installed."""


class TrajectoryFormatError(AgentkitError, ValueError):
    """A trajectory file or record does not match the schema."""


class EnvError(AgentkitError):
    """An environment broke its contract or failed in a way the run cannot absorb."""


class ModelError(AgentkitError):
    """A model or tokenizer folder is missing, incomplete or unusable."""


class OutputExistsError(AgentkitError, FileExistsError):
    """An output file exists and neither --append nor --overwrite was given."""


class GeneratorError(AgentkitError):
    """The async generator process stopped (it died, or raised); the run can be resumed."""


class TrainingDivergedError(AgentkitError, ArithmeticError):
    """Training produced NaN/inf losses or gradients in too many updates in a row."""


# the errno values of a full disk: no space left, and the user's disk quota used up
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskFullError(AgentkitError, OSError):
    """A file could not be written because its disk, or the user's quota there, is full. Whatever
    was written before stays whole; the message names the file, the space left, and how to go on."""


def no_space(err: BaseException) -> bool:
    """Whether ``err`` says the disk (or quota) is full. Rust-backed writers (safetensors,
    tokenizers) raise plain exceptions that carry the OS error only in their text: "(os error 28)"."""
    if isinstance(err, DiskFullError):
        return True
    if isinstance(err, OSError):
        return err.errno in NO_SPACE
    return any(f"(os error {code})" in str(err) for code in NO_SPACE)


def free_space(path: str | os.PathLike) -> str:
    """The space left on the disk holding ``path`` (or its nearest existing parent), e.g. "12.0 KiB"."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        return human_bytes(shutil.disk_usage(folder).free)
    except OSError:
        return "unknown"


def human_bytes(size: int) -> str:
    """``size`` bytes for a reader: "512 B", "12.0 KiB", "3.4 GiB"."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def disk_full(what: str, path: str | os.PathLike, err: BaseException, then: str) -> DiskFullError:
    """The one-line error for a write of ``what`` to ``path`` that ran out of space: which file,
    the space left there, and ``then`` (what was kept and how to go on)."""
    cause = os.strerror(err.errno) if isinstance(err, OSError) and err.errno else "No space left on device"
    return DiskFullError(f"{cause} while writing {what} {path} ({free_space(path)} free there now). {then}")


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest candidates, or an empty string."""
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"
