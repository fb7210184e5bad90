"""Training: ``train(cfg)`` runs the loop (``agentkit.train.loop``, the only importer of which is this
package) in a run folder (``agentkit.train.run_folder``).

The names users import from ``agentkit.train`` stay here: the loop and its phases, the run folder's
``prepare_run`` and ``resolve_defaults``, and the loop's helpers ``load_policy`` (``agentkit.policy``),
``update`` and ``step_lr`` (``agentkit.update``).
"""

from agentkit.policy import load_policy
from agentkit.train.loop import (
    Run,
    TrainResult,
    checkpoint,
    collect,
    evaluate,
    learned,
    score,
    setup,
    sync,
    train,
)
from agentkit.train.run_folder import NothingToDo, check_packages, prepare_run, resolve_defaults
from agentkit.update import step_lr, update

__all__ = ["NothingToDo", "Run", "TrainResult", "check_packages", "checkpoint", "collect", "evaluate", "learned",
           "load_policy", "prepare_run", "resolve_defaults", "score", "setup", "step_lr", "sync", "train", "update"]
