"""Training: ``train(cfg)`` runs the loop (``agentkit.train.loop``, which only this package imports)
in a run folder (``agentkit.train.run_folder``) with the run's settings (``agentkit.train.config``).

The loop's parts, each in its module: ``update`` (minibatch updates with a token budget per
micro-batch), ``policy`` (the policy and its sampling backend), ``episodes`` (a step's tasks, seeds
and skill selector, shared with the async generator ``async_rollout``), ``scoring`` (the teacher and
the judge), ``checkpoint``, ``distributed``, ``lora``. The names users import from ``agentkit.train``
stay here: ``train`` and the loop's phases, ``prepare_run`` and ``resolve_defaults``, ``load_policy``.
They load on first use, so reading the settings (``agentkit.train.config``: the CLI's parsers) does
not load the loop, torch and the models.
"""

from __future__ import annotations

from typing import Any

_LOOP = ("Run", "TrainResult", "collect", "evaluate", "learned", "score", "setup", "sync", "train")
_RUN_FOLDER = ("NothingToDo", "check_packages", "prepare_run", "resolve_defaults")
__all__ = [*_LOOP, *_RUN_FOLDER, "load_policy"]


def __getattr__(name: str) -> Any:
    if name in _LOOP:
        from agentkit.train import loop as module
    elif name in _RUN_FOLDER:
        from agentkit.train import run_folder as module
    elif name == "load_policy":
        from agentkit.train import policy as module
    else:
        raise AttributeError(f"module 'agentkit.train' has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
