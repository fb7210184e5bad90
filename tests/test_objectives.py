"""Golden values on hand-computed tensors for every objective, and the objective registry."""

from __future__ import annotations

import math

import pytest
import torch
from agentkit.objectives import TokenBatch, build_batch, make_objective
from agentkit.objectives.common import aggregate, group_advantages, k3_kl

from agentkit.core.errors import ConfigError, UnknownNameError
from agentkit.core.trajectory import Trajectory, Turn


def batch_of(response_mask, old, adv, episodes=None, ref=None) -> TokenBatch:
    mask = torch.tensor(response_mask, dtype=torch.float32)
    rows, length = mask.shape
    return TokenBatch(
        input_ids=torch.zeros((rows, length + 1), dtype=torch.long), attention_mask=torch.ones((rows, length + 1), dtype=torch.long),
        response_mask=mask, old_logprobs=torch.tensor(old), advantages=torch.tensor(adv), weights=mask.clone(),
        episode_index=torch.tensor(episodes if episodes is not None else list(range(rows))),
        turn_index=torch.zeros((rows, length), dtype=torch.long), ref_logprobs=None if ref is None else torch.tensor(ref),
    ).with_normalizers()


def test_group_advantages_golden():
    # group a: returns 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +-1; group b: all equal -> 0
    adv = group_advantages([1, 0, 0, 1, 3, 3], ["a", "a", "a", "a", "b", "b"], eps=0.0)
    assert adv == pytest.approx([1, -1, -1, 1, 0, 0])
    assert group_advantages([1, 0], ["a", "a"], normalize_std=False) == pytest.approx([0.5, -0.5])


def test_sft_golden():
    batch = batch_of([[0, 1, 1], [1, 0, 0]], [[0, 0, 0]] * 2, [[0, 0, 0]] * 2)
    logprobs = torch.tensor([[-9.0, -1.0, -2.0], [-3.0, -9.0, -9.0]])
    loss, metrics = make_objective("sft").loss(batch, logprobs)
    assert float(loss) == pytest.approx((1 + 2 + 3) / 3)  # masked tokens (-9) do not count
    assert metrics["nll"] == pytest.approx(2.0)


def test_grpo_clipped_loss_golden():
    # one row, two response tokens; ratios e^0.5 = 1.6487 (clipped to 1.28) and e^-0.5 = 0.6065
    old = [[0.0, -1.0, -1.0]]
    logprobs = torch.tensor([[0.0, -0.5, -1.5]])
    grpo = make_objective("grpo", {"clip_low": 0.2, "clip_high": 0.28})
    loss_pos, m = grpo.loss(batch_of([[0, 1, 1]], old, [[0, 1, 1]]), logprobs)
    assert float(loss_pos) == pytest.approx(-(1.28 + math.exp(-0.5)) / 2, rel=1e-5)
    assert m["clip_fraction"] == pytest.approx(0.5)
    loss_neg, _ = grpo.loss(batch_of([[0, 1, 1]], old, [[0, -1, -1]]), logprobs)
    assert float(loss_neg) == pytest.approx((math.exp(0.5) + 0.8) / 2, rel=1e-5)


def test_grpo_kl_and_sequence_mean_golden():
    assert float(k3_kl(torch.tensor(-0.5), torch.tensor(-1.0))) == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    # two episodes: 1 token with per-token loss 2, and 3 tokens with loss 1, 1, 4
    batch = batch_of([[1, 0, 0], [1, 1, 1]], [[0, 0, 0]] * 2, [[0, 0, 0]] * 2)
    per_token = torch.tensor([[2.0, 7.0, 7.0], [1.0, 1.0, 4.0]])
    assert float(aggregate(per_token, batch, "token-mean")) == pytest.approx(8 / 4)
    assert float(aggregate(per_token, batch, "sequence-mean")) == pytest.approx((2 + 2) / 2)
    grpo = make_objective("grpo", {"kl_coef": 0.5})
    logprobs = torch.tensor([[-0.5, 0.0, 0.0]])
    batch = batch_of([[1, 0, 0]], [[-0.5, 0, 0]], [[0.0, 0, 0]], ref=[[-1.0, 0, 0]])
    loss, metrics = grpo.loss(batch, logprobs)
    assert float(loss) == pytest.approx(0.5 * (math.exp(-0.5) + 0.5 - 1), rel=1e-5)
    assert metrics["kl"] == pytest.approx(math.exp(-0.5) + 0.5 - 1, rel=1e-5)


def _traj(group: str, ret: float, invalid: int = 0) -> Trajectory:
    turns = [Turn(observation="o", context_ids=[1, 2], response_ids=[3, 4], response_logprobs=[-0.1, -0.2],
                  response_text="x", action="a", action_valid=i >= invalid, reward=ret if i == 0 else 0.0, feedback="f")
             for i in range(2)]
    return Trajectory(id=f"{group}|{ret}", env="e", task="t", seed=0, split="train", group=group, sample=0, turns=turns,
                      episode_return=ret, won=ret > 0, score=ret, terminated=True, truncated=False, model="m", sampling={})


def test_grpo_prepare_spreads_episode_advantage_and_penalty():
    trajs = [_traj("g", 1.0), _traj("g", 0.0, invalid=2)]
    batch = make_objective("grpo", {"invalid_action_penalty": 0.5}).prepare(trajs)
    # chat rows: [1,2,3,4,1,2,3,4] -> targets are ids[1:]; response targets at columns 1,2,5,6
    assert batch.response_mask[0].tolist() == [0, 1, 1, 0, 0, 1, 1]
    assert batch.old_logprobs[0].tolist() == pytest.approx([0, -0.1, -0.2, 0, 0, -0.1, -0.2])
    # returns 1 and 0 - 2*0.5 = -1 -> advantages +1 and -1 on every response token
    assert batch.advantages[0].tolist() == pytest.approx([0, 1, 1, 0, 0, 1, 1], abs=1e-5)
    assert batch.advantages[1].tolist() == pytest.approx([0, -1, -1, 0, 0, -1, -1], abs=1e-5)
    assert batch.token_normalizer == 8 and batch.sequence_normalizer == 2


def test_micro_batches_keep_minibatch_normalizers():
    batch = build_batch([_traj("g", 1.0), _traj("g", 0.0), _traj("h", 1.0)])
    parts = batch.micro_batches(max_tokens=16)
    assert len(parts) == 2 and sum(p.num_rows for p in parts) == 3
    assert all(p.token_normalizer == batch.token_normalizer for p in parts)
    logprobs = torch.full(batch.response_mask.shape, -1.0)
    whole, _ = make_objective("sft").loss(batch, logprobs)
    split = sum(make_objective("sft").loss(p, torch.full(p.response_mask.shape, -1.0))[0] for p in parts)
    assert float(split) == pytest.approx(float(whole))


def test_registry_errors():
    with pytest.raises(UnknownNameError, match="Did you mean 'grpo'"):
        make_objective("gpro")
    with pytest.raises(ConfigError, match=r"objective 'grpo'.*klcoef.*Extra inputs"):
        make_objective("grpo", {"klcoef": 0.1})
