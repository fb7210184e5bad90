"""agentkit.train.watch: the share of groups with a learning signal, and the failure signs said once each."""

from __future__ import annotations

from agentkit.core.trajectory import Trajectory
from agentkit.train.watch import Watch, signal_share


def _episode(group: str, sample: int, ret: float) -> Trajectory:
    return Trajectory(id=f"{group}-{sample}", env="e", task=group, seed=0, split="train", group=group, sample=sample,
                      turns=[], episode_return=ret, won=ret > 0, score=ret, terminated=True, truncated=False,
                      model="m", sampling={})


def test_signal_share_counts_groups_whose_returns_differ():
    episodes = [_episode("a", 0, 1.0), _episode("a", 1, 0.0),  # differs
                _episode("b", 0, 0.5), _episode("b", 1, 0.5), _episode("b", 2, 0.5),  # all equal
                _episode("c", 0, 0.0), _episode("c", 1, 0.0),  # all equal
                _episode("d", 0, 1.0)]  # a group of one: no comparison, not counted
    assert signal_share(episodes) == 1 / 3
    assert signal_share([_episode("a", 0, 1.0), _episode("b", 0, 0.0)]) is None


def _steps(watch: Watch, records: list[dict]) -> list[str]:
    said = []
    for step, record in enumerate(records, 1):
        said += watch.observe({"step": step, **record})
    return said


def test_no_signal_is_said_once_after_five_steps_without_it():
    records = [{"signal_share": s} for s in (0.5, 0.1, 0.1, 0.0, 0.15, 0.3, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.0)]
    said = _steps(Watch(needs_groups=True), records)
    assert len(said) == 1 and said[0].startswith("step 11: GRPO has no signal") and "--group-size" in said[0], said
    assert _steps(Watch(needs_groups=False), records) == []  # not an objective that compares groups


def test_rising_reverse_kl_and_collapse_are_said():
    kl = [0.5, 0.45, 0.4, 0.42, 0.41, 0.5, 0.55, 0.6, 0.62, 0.7]  # 0.436 -> 0.594 over the last 10 steps
    said = _steps(Watch(needs_groups=False), [{"reverse_kl": x} for x in kl])
    assert len(said) == 1 and said[0].startswith("step 10: distillation is diverging") and "0.436 to 0.594" in said[0]
    falling = _steps(Watch(needs_groups=False), [{"reverse_kl": x} for x in reversed(kl)])
    assert falling == []
    invalid = [0.1] * 5 + [0.2, 0.25, 0.45, 0.5, 0.55, 0.6]  # first five 10%, last five 47%
    said = _steps(Watch(needs_groups=False), [{"invalid_rate": x} for x in invalid])
    assert len(said) == 1 and said[0].startswith("step 11: the policy is collapsing: its invalid-action rate rose from 10% to 47%")
    said = _steps(Watch(needs_groups=True), [{"kl": x} for x in (0.01, 0.5, 1.2, 1.5, 2.0, 3.0, 4.0)])
    assert len(said) == 1 and said[0].startswith("step 7: the policy is collapsing: its KL to the reference")
