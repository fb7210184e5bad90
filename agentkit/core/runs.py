"""The run folder's layout, in one place: every file that reads or writes a training run's folder
asks here for a path instead of spelling it.

    RUN/config.yaml                          the settings (what --resume and the CLI read back)
    RUN/metrics.jsonl                        a line per step
    RUN/eval.jsonl                           a line per evaluation (step 0: the starting policy)
    RUN/checkpoints/step-N/                  the policy after step N (complete when it holds its marker)
    RUN/trajectories/step-N.jsonl            the episodes step N trained on
    RUN/trajectories/step-N.generator.json   the async generator's record of the episodes of step N
    RUN/signals/step-N.jsonl                 per-token teacher signals of a few episodes of step N

Steps are counted from 1 in names (step N is the N-th update); a step still being written carries
a suffix (``.part``) and is no step yet.
"""

from __future__ import annotations

from pathlib import Path

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
EVAL = "eval.jsonl"
CHECKPOINTS = "checkpoints"
TRAJECTORIES = "trajectories"
SIGNALS = "signals"
SKILL_BANK = "skillbank.yaml"
CHECKPOINT_MARKER = "COMPLETE"  # written last into a checkpoint folder: it is complete
STEP_PREFIX = "step-"


def step_name(step: int) -> str:
    """``step-N``: a checkpoint folder's name and every per-step file's stem."""
    return f"{STEP_PREFIX}{step}"


def step_of(name: str) -> int | None:
    """N of a ``step-N`` folder name, None for any other name (temporary or trash folders too)."""
    digits = name[len(STEP_PREFIX):] if name.startswith(STEP_PREFIX) else ""
    return int(digits) if digits.isdigit() else None


def config_file(run_dir: Path) -> Path:
    return Path(run_dir) / CONFIG


def metrics_file(run_dir: Path) -> Path:
    return Path(run_dir) / METRICS


def eval_file(run_dir: Path) -> Path:
    return Path(run_dir) / EVAL


def skill_bank_file(run_dir: Path) -> Path:
    """The run's own copy of its skill bank, with the statistics of the steps so far."""
    return Path(run_dir) / SKILL_BANK


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """The folder of the checkpoint after step ``step``."""
    return checkpoints_dir(run_dir) / step_name(step)


def trajectories_dir(run_dir: Path) -> Path:
    return Path(run_dir) / TRAJECTORIES


def trajectory_file(run_dir: Path, step: int) -> Path:
    """The episodes step ``step`` (from 1) trained on."""
    return trajectories_dir(run_dir) / f"{step_name(step)}.jsonl"


def generator_file(run_dir: Path, step: int) -> Path:
    """The async generator's record of step ``step`` (from 1)."""
    return trajectories_dir(run_dir) / f"{step_name(step)}.generator.json"


def signals_dir(run_dir: Path) -> Path:
    return Path(run_dir) / SIGNALS


def signals_file(run_dir: Path, step: int) -> Path:
    """Per-token teacher signals of step ``step`` (from 1)."""
    return signals_dir(run_dir) / f"{step_name(step)}.jsonl"


def step_folders(run_dir: Path) -> list[int]:
    """Steps of every ``checkpoints/step-N`` folder, complete or not (``checkpoints`` lists the complete ones)."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted(step for p in root.iterdir() if (step := step_of(p.name)) is not None)


def checkpoints(run_dir: Path) -> list[int]:
    """Steps of the checkpoints in ``run_dir`` that were completely written (holding their marker;
    temporary folders of an interrupted write ignored). ``agentkit.train.checkpoint.check_complete``
    verifies one against its marker."""
    return [step for step in step_folders(run_dir) if (checkpoint_dir(run_dir, step) / CHECKPOINT_MARKER).exists()]


def is_run_folder(folder: Path) -> bool:
    """A training run's folder (it has its settings or checkpoints), not a model folder."""
    folder = Path(folder)
    return checkpoints_dir(folder).is_dir() or config_file(folder).exists()
