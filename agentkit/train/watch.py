"""The training loop's watch: the signs of a run that is not learning, each said once, in one line
with the setting to try, when it persists.

"Why does my reward not go up?" has a few common answers, each visible in metrics.jsonl long
before the evaluation says so:

- **no signal** (objectives that compare a task's group, GRPO and its kin): in most groups every
  episode got the same return, so every advantage is zero and the update learns nothing;
- **distillation diverging**: the reverse KL to the teacher rises instead of falling;
- **the policy collapsing**: its invalid-action rate climbs far above the start's, or its KL to the
  frozen reference explodes (the format breaks: ``<action>go crown crown crown ...``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentkit.core.trajectory import Trajectory


def signal_share(trajectories: Sequence[Trajectory]) -> float | None:
    """The share of the step's groups (two or more episodes of one task) whose returns are not all
    equal: only those give group-relative advantages. None when no group has two episodes."""
    groups: dict[str, set[float]] = {}
    sizes: dict[str, int] = {}
    for t in trajectories:
        groups.setdefault(t.group, set()).add(round(t.episode_return, 9))
        sizes[t.group] = sizes.get(t.group, 0) + 1
    counted = [len(returns) > 1 for group, returns in groups.items() if sizes[group] > 1]
    return sum(counted) / len(counted) if counted else None


@dataclass
class Watch:
    """Reads each step's metrics record; ``observe`` returns the lines to print (each sign once).

    Attributes:
        window: steps a sign must hold (and the span its trends are measured over).
        needs_groups: the objective learns from group-relative advantages (``Capabilities``).
    """

    needs_groups: bool
    window: int = 5
    history: list[dict[str, Any]] = field(default_factory=list)
    said: set[str] = field(default_factory=set)

    def observe(self, record: dict[str, Any]) -> list[str]:
        self.history.append(record)
        lines = []
        for sign, line in self._signs():
            if sign not in self.said:
                self.said.add(sign)
                lines.append(f"step {record['step']}: {line}")
        return lines

    def _series(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.history if isinstance(r.get(key), int | float)]

    def _signs(self):
        w = self.window
        signal = self._series("signal_share")
        if self.needs_groups and len(signal) >= w and all(s < 0.2 for s in signal[-w:]):
            yield "no-signal", (
                f"GRPO has no signal: in each of the last {w} steps over 80% of the groups had all-equal returns "
                f"(zero advantages; {signal[-1]:.0%} of groups differ now). Try more samples per task "
                "(--group-size), more tasks (--tasks-per-step), sampling.temperature=1.0, or a start that "
                "sometimes wins (SFT on demonstrations first).")
        rkl = self._series("reverse_kl")
        if len(rkl) >= 2 * w:
            before, now = statistics.fmean(rkl[-2 * w:-w]), statistics.fmean(rkl[-w:])
            if now > 1.25 * before and now - before > 0.05:
                yield "kl-rising", (
                    f"distillation is diverging: the reverse KL to the teacher rose from {before:.3f} to {now:.3f} "
                    f"nats/token over the last {2 * w} steps. Try a lower --lr, train.warmup_steps, or "
                    "objective.args.estimator=full (the exact KL over the vocabulary).")
        invalid = self._series("invalid_rate")
        if len(invalid) >= 2 * w:
            start, now = statistics.fmean(invalid[:w]), statistics.fmean(invalid[-w:])
            if now - start > 0.3:
                yield "collapsing", (
                    f"the policy is collapsing: its invalid-action rate rose from {start:.0%} to {now:.0%} "
                    f"(first and last {w} steps). Try a lower --lr, train.warmup_steps, or a KL to the "
                    "reference (objective.args.kl_coef).")
        kl = self._series("kl")
        if len(kl) >= w and min(kl[-w:]) > 1.0:
            yield "ref-kl", (
                f"the policy is collapsing: its KL to the reference stayed above 1 nat/token for {w} steps "
                f"({kl[-1]:.2f} now). Try a lower --lr, train.warmup_steps, or a larger objective.args.kl_coef.")
