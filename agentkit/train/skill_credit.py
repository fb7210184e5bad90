"""What the training loop credits a retrieved skill with, for UCB retrieval (``SkillBank.record_episode``).

A bandit learns only from a reward its arm can move (``docs/methods.md``, "Skill-bank retrieval
credit"). Who sees the skills decides what that is, and the objective declares it (``Capabilities``):

- The policy sees them (``policy_sees_skills``: Skill-GRPO): the episode's return.
- Only the teacher does (SDAR, OPSD, RLSD, Skill-SD; any objective with a teacher given a bank):
  the student's actions, and so the return, are what they would have been with any other skills;
  what a skill changes is the teacher's guidance. It is credited with whether that guidance points
  the way the outcome did: the teacher holding it raises the probability of the student's own
  actions in won episodes and lowers it in lost ones.
- Nobody does (a bank given to an objective without a teacher): nothing they change; every
  episode credits ``NEUTRAL``, so UCB only explores.

The teacher-only credit of episode i, whose group (the episodes of one task) has returns R:

    lift      u_i = mean over i's response tokens of (teacher log-prob - sampling log-prob)
    outcome   a_i = (R_i - mean R) / max_j |R_j - mean R|      in [-1, 1]; 0 when all R are equal
    credit    (1 + a_i * sign(u_i)) / 2                        in [0, 1]; 0.5 says nothing

Choices, and why:
- The sign of the lift, not its size. Log-ratios have no fixed scale (they vary with the model,
  the tokenizer and how long responses are), while UCB's exploration weight ``c`` is set for
  rewards in [0, 1]: this credit has the scale of a success rate, so the default ``c`` explores as
  much as it does with 0/1 returns. A skill that moves the teacher only slightly but always the
  right way earns as much as one that moves it a lot.
- The outcome is centred within the group, so it sums to zero over a group: a skill whose lift
  has nothing to do with the outcome earns 0.5 on average, whatever the success rate and whether
  its lift is mostly positive or mostly negative (with the plain sign of R_i - mean R, when one
  episode in four wins, a skill that makes the teacher disfavour everything would look
  informative). Comparing episodes of one task also takes task difficulty out.
- A group that cannot tell won from lost (one episode, or equal returns) credits 0.5, recorded
  rather than skipped: ``uses`` stays the number of episodes that used a skill, and since a skill
  the policy never sees cannot change the returns, such groups pull every skill's mean towards 0.5
  alike and never reorder them in expectation. OPSD with ``rollout.group_size=1`` therefore gives
  UCB nothing to learn from.
- The lift is measured against the sampling-time log-probs, which the step has already; with the
  ``self`` teacher the two differ by the privileged block alone (and the backend's numerics). A
  separate teacher model adds its own preferences to every skill's lift alike: they rank no skill,
  but where they outweigh what the skills change they hide it.
- A group's outcome is its episodes' returns, not an objective's shaped returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentkit.core.errors import ConfigError
from agentkit.core.trajectory import Trajectory
from agentkit.objectives import Capabilities, StepScores, TokenBatch

NEUTRAL = 0.5  # the credit that says nothing about a skill


def teacher_lift(teacher_logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor,
                 episode_index: torch.Tensor, episodes: int) -> list[float]:
    """Per episode, the mean over its response tokens of ``teacher_logprobs - old_logprobs``
    (0 for an episode with none): how much the teacher raises the probability of the student's own
    tokens. Tensors are ``[B, L]`` in ``build_batch``'s layout, ``episode_index`` ``[B]``."""
    mask = response_mask.double()  # [B, L]
    row_sums = ((teacher_logprobs.double() - old_logprobs.double()) * mask).sum(dim=1)  # [B]
    sums = torch.zeros(episodes, dtype=torch.float64).index_add_(0, episode_index, row_sums)  # [E]
    counts = torch.zeros(episodes, dtype=torch.float64).index_add_(0, episode_index, mask.sum(dim=1))  # [E]
    return (sums / counts.clamp(min=1)).tolist()


def group_outcomes(returns: Sequence[float], groups: Sequence[str]) -> list[float]:
    """Per episode, (R_i - mean R) / max |R_j - mean R| over its group: in [-1, 1], summing to
    zero over each group; 0 throughout a group of one or of equal returns."""
    members: dict[str, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    out = [0.0] * len(returns)
    for indices in members.values():
        values = [float(returns[i]) for i in indices]
        mean = sum(values) / len(values)
        spread = max(abs(v - mean) for v in values)
        if spread > 0:
            for i, v in zip(indices, values, strict=True):
                out[i] = (v - mean) / spread
    return out


def lift_credits(lifts: Sequence[float], returns: Sequence[float], groups: Sequence[str]) -> list[float]:
    """The teacher-only credit of each episode, ``(1 + a_i * sign(u_i)) / 2`` in [0, 1] (module
    docstring): high when the teacher endorsed a won episode's actions or disfavoured a lost one's."""
    outcomes = group_outcomes(returns, groups)
    return [(1.0 + a * ((u > 0) - (u < 0))) / 2 for a, u in zip(outcomes, lifts, strict=True)]


def skill_credits(capabilities: Capabilities, trajectories: Sequence[Trajectory], scores: StepScores | None,
                  batch: TokenBatch) -> list[float]:
    """What each episode credits its skills with, in ``trajectories``' order: its return when the
    policy sees the skills, the teacher-only credit when only a teacher does (``scores`` from
    ``agentkit.train.scoring.score_step``), ``NEUTRAL`` when nobody does. ``batch`` is the step's token
    batch in ``build_batch(trajectories)``'s layout, the one the teacher's scores are aligned with
    (the objective's prepared batch: the loop does not pad the step a third time)."""
    if capabilities.policy_sees_skills:
        return [t.episode_return for t in trajectories]
    if not capabilities.needs_teacher:
        return [NEUTRAL] * len(trajectories)
    if scores is None or scores.teacher is None:
        raise ConfigError("skill_credits(): the objective has a teacher but no teacher scores were given; pass "
                          "the step's score_step(...) result.")
    teacher = scores.teacher.logprobs.cpu()  # [B, L]
    if teacher.shape != batch.response_mask.shape:
        raise ValueError(f"skill_credits(): the teacher's scores are {tuple(teacher.shape)}, the step's batch "
                         f"{tuple(batch.response_mask.shape)}; score the same trajectories, in the same order.")
    lifts = teacher_lift(teacher, batch.old_logprobs, batch.response_mask, batch.episode_index, len(trajectories))
    return lift_credits(lifts, [t.episode_return for t in trajectories], [t.group for t in trajectories])
