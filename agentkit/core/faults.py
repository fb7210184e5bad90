"""Deterministic fault injection, for crash and numerics tests only.

Some failures cannot be produced on demand by a real part: a ``kill -9`` that lands after the
first trajectory of step 3 was written, or a NaN loss at step 2. The training loop names a few
moments with ``fault_point`` (and ``fault_active`` for faults that are not a kill); they do nothing
unless the environment variable ``AGENTKIT_FAULT`` names them::

    AGENTKIT_FAULT=checkpoint.write@2     # SIGKILL this process while step 2's checkpoint is written
    AGENTKIT_FAULT=loss.nan@2,loss.nan@3  # a NaN loss at steps 2 and 3
    AGENTKIT_FAULT=loss.nan               # a NaN loss at every step

Steps are 1-based, as in metrics.jsonl and ``checkpoints/step-N``. Unset, each call is one
dictionary lookup. Never set it outside tests.

Points in agentkit: ``rollout`` (after a trajectory of the step was written, before the step's
other episodes end), ``update`` (after a backward, before ``optimizer.step``), ``checkpoint.write``
(after the model files of a checkpoint, before its optimizer state and marker), ``generator`` (the
async generator process, after a trajectory of the step was written); and, read with
``fault_active``, ``loss.nan`` (the step's losses are multiplied by NaN) and ``grad.inf`` (a finite
loss, one gradient entry set to inf before clipping).
"""

from __future__ import annotations

import os
import signal

from agentkit.core.errors import ConfigError

VARIABLE = "AGENTKIT_FAULT"


def _wanted(spec: str, name: str, step: int | None) -> bool:
    for item in spec.split(","):
        point, _, at = item.strip().partition("@")
        if point != name:
            continue
        if not at:
            return True
        if not at.isdigit():
            raise ConfigError(f"{VARIABLE}={spec!r}: {item!r} should be NAME or NAME@STEP (e.g. {name}@2).")
        if step is not None and int(at) == step:
            return True
    return False


def fault_active(name: str, step: int | None = None) -> bool:
    """Whether ``AGENTKIT_FAULT`` asks for fault ``name`` (at ``step``)."""
    spec = os.environ.get(VARIABLE)
    return bool(spec) and _wanted(spec, name, step)


def fault_point(name: str, step: int | None = None) -> None:
    """SIGKILL this process here if ``AGENTKIT_FAULT`` names this point (at ``step``): no cleanup,
    no ``finally``, no flush, exactly as ``kill -9`` from outside would."""
    if fault_active(name, step):
        os.kill(os.getpid(), signal.SIGKILL)
