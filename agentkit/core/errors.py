"""One error hierarchy for everything a user controls.

Every error says what was given, what was expected, and how to fix it. Causes are kept with
``raise ... from err`` so the original type and traceback survive.
"""

from __future__ import annotations

import difflib
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


class TrainingDivergedError(AgentkitError, ArithmeticError):
    """Training produced NaN/inf losses or gradients in too many updates in a row."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest candidates, or an empty string."""
    matches = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.5)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"
