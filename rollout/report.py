"""What an evaluation reports, from its trajectories: success with its 95% Wilson interval,
pass@k over the samples of each task (the unbiased estimator), mean turns of the solved episodes,
the same per task type where the environment has types, and the paired difference of two
policies on the same tasks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from agentkit.core.evalstats import paired_difference, pass_at_k, wilson
from agentkit.core.trajectory import Trajectory


def _ks(samples: int) -> list[int]:
    """1, 2, 4, ... up to ``samples``, and ``samples`` itself."""
    ks = [1]
    while ks[-1] * 2 <= samples:
        ks.append(ks[-1] * 2)
    return ks if ks[-1] == samples else [*ks, samples]


def _by_task(trajectories: Sequence[Trajectory]) -> dict[int, list[Trajectory]]:
    tasks: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        tasks[t.seed].append(t)
    return dict(sorted(tasks.items()))


def _summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    tasks = _by_task(trajectories)
    episodes, won = len(trajectories), sum(t.won for t in trajectories)
    low, high = wilson(won, episodes)
    solved_turns = [len(t.turns) for t in trajectories if t.won]
    summary: dict[str, Any] = {
        "tasks": len(tasks), "episodes": episodes, "success_rate": won / episodes if episodes else 0.0,
        "success_ci95": [low, high],
        "mean_turns_solved": sum(solved_turns) / len(solved_turns) if solved_turns else None,
        "errors": sum(1 for t in trajectories if t.error),
    }
    samples = min((len(v) for v in tasks.values()), default=0)
    if samples > 1:  # pass@k needs the same n for every task: the first n samples of each
        summary["samples_per_task"] = samples
        summary["pass_at_k"] = {str(k): sum(pass_at_k(samples, sum(t.won for t in v[:samples]), k)
                                            for v in tasks.values()) / len(tasks) for k in _ks(samples)}
    return summary


def eval_report(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """The evaluation's figures over every episode, and per task type when the episodes have one.
    Each task is a seed; several samples of a seed are that task's samples (pass@k)."""
    report = _summary(trajectories)
    types: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if t.task_type is not None:
            types[t.task_type].append(t)
    if types:
        report["by_task_type"] = {name: _summary(group) for name, group in sorted(types.items())}
    return report


def compare_report(a: Sequence[Trajectory], b: Sequence[Trajectory]) -> dict[str, Any]:
    """Policy A against policy B on the tasks both played: each task's success rate over its
    samples, and the mean paired difference A - B with its 95% interval."""
    tasks_a, tasks_b = _by_task(a), _by_task(b)
    common = sorted(tasks_a.keys() & tasks_b.keys())
    rate = lambda group: sum(t.won for t in group) / len(group)  # noqa: E731
    mean, low, high = paired_difference([rate(tasks_a[s]) for s in common], [rate(tasks_b[s]) for s in common])
    return {"tasks": len(common), "a": _summary([t for s in common for t in tasks_a[s]]),
            "b": _summary([t for s in common for t in tasks_b[s]]), "difference": mean, "difference_ci95": [low, high]}
