"""Training: ``train(cfg)`` runs the loop (``agentkit.train.loop``, which only this package imports)
in a run folder (``agentkit.train.run_folder``).

The loop's parts, each in its module: ``update`` (minibatch updates with a token budget per
micro-batch), ``policy`` (the policy and its sampling backend), ``episodes`` (a step's tasks, seeds
and skill selector, shared with the async generator ``async_rollout``), ``scoring`` (the teacher and
the judge), ``checkpoint``, ``distributed``, ``lora``. The names users import from ``agentkit.train``
stay here: ``train`` and the loop's phases, ``prepare_run`` and ``resolve_defaults``, ``load_policy``.
"""

from agentkit.train.loop import Run, TrainResult, collect, evaluate, learned, score, setup, sync, train
from agentkit.train.policy import load_policy
from agentkit.train.run_folder import NothingToDo, check_packages, prepare_run, resolve_defaults

__all__ = ["NothingToDo", "Run", "TrainResult", "check_packages", "collect", "evaluate", "learned", "load_policy",
           "prepare_run", "resolve_defaults", "score", "setup", "sync", "train"]
