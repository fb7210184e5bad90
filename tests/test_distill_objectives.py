"""OPD's full estimator, gradient isolation of teacher quantities, Skill-GRPO and SAGE-OPD's
weighting helpers; every objective's golden loss and gradient are in test_objective_golden.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from agentkit.objectives import make_objective
from agentkit.objectives.opd import full_reverse_kl
from agentkit.objectives.sage_opd import normalize_weights, turn_scores
from helpers import batch_of


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def teacher_batch(logT, adv=None, old=None, mask=None, top1=None):
    """One row of 2 response tokens after one context position."""
    mask = mask or [[0, 1, 1]]
    old = old or [[0.0, -1.0, -2.0]]
    batch = batch_of(mask, old, adv or [[0, 0, 0]])
    return replace(batch, teacher_logprobs=torch.tensor(logT), teacher_top1=None if top1 is None else torch.tensor(top1))


LOGS = [[0.0, -1.0, -2.0]]  # current policy = sampling policy (ratio 1)
LOGT = [[0.0, -0.5, -3.0]]  # teacher: likes token 1 more (+0.5), token 2 less (-1.0)


def test_opd_full_golden():
    # full-vocabulary reverse KL at one position: pS = (0.5, 0.5), pT = (0.9, 0.1)
    s = torch.log(torch.tensor([[[0.5, 0.5]]]))
    t = torch.log(torch.tensor([[[0.9, 0.1]]]))
    expected = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert float(full_reverse_kl(s, t, renormalize=False)) == pytest.approx(expected, rel=1e-6)
    # top-k: (0.3, 0.3) of a larger vocabulary renormalizes to (0.5, 0.5)
    s_top = torch.log(torch.tensor([[[0.3, 0.3]]]))
    t_top = torch.log(torch.tensor([[[0.45, 0.05]]]))
    assert float(full_reverse_kl(s_top, t_top, renormalize=True)) == pytest.approx(expected, rel=1e-6)
    opd = make_objective("opd", {"estimator": "full", "topk": 0})
    batch = replace(batch_of([[1]], [[0.0]], [[0.0]]), teacher_logprobs=torch.tensor([[0.0]]), teacher_support_logprobs=t)
    loss, _ = opd.loss(batch, torch.tensor([[math.log(0.5)]]), s)
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_no_gradient_flows_through_gate_or_teacher():
    logS = torch.tensor(LOGS, requires_grad=True)
    logT = torch.tensor(LOGT, requires_grad=True)
    batch = replace(teacher_batch(LOGT, adv=[[0, 0, 0]]), teacher_logprobs=logT)
    sdar = make_objective("sdar", {"lam": 1.0, "beta": 5.0, "kl_coef": 0.0})
    loss, _ = sdar.loss(batch, logS)
    loss.backward()
    # A = 0, so only L_SDAR = mean(g * (logT - logS)) remains: d/dlogS = -g / N with g constant
    g = torch.sigmoid(5 * (torch.tensor(LOGT) - torch.tensor(LOGS)))
    assert torch.allclose(logS.grad[0, 1:], -g[0, 1:] / 2, atol=1e-6)
    assert logT.grad is None or torch.count_nonzero(logT.grad) == 0
    for name in ("opd", "opsd", "opsd_rkl", "rlsd", "skill_sd", "grpo_opsd", "grpo_opsd_rkl", "sage_opd"):
        logT = torch.tensor(LOGT, requires_grad=True)
        args = {"estimator": "sampled"} if name in ("opd", "opsd_rkl", "sage_opd") else {"kl_coef": 0.0}
        loss, _ = make_objective(name, args).loss(replace(batch, teacher_logprobs=logT, advantages=torch.tensor([[0.0, 1.0, -1.0]])),
                                            torch.tensor(LOGS, requires_grad=True))
        loss.backward()
        assert logT.grad is None or torch.count_nonzero(logT.grad) == 0, name


def test_skill_grpo_is_grpo_with_skills_in_the_prompt():
    sg, g = make_objective("skill_grpo", {"kl_coef": 0.0}), make_objective("grpo", {"kl_coef": 0.0})
    assert sg.capabilities.policy_sees_skills and sg.capabilities.uses_skills and not g.capabilities.policy_sees_skills
    batch = batch_of([[0, 1, 1]], [[0.0, -1.0, -1.0]], [[0, 1, -1]])
    assert float(sg.loss(batch, torch.tensor([[0.0, -0.5, -1.5]]))[0]) == float(g.loss(batch, torch.tensor([[0.0, -0.5, -1.5]]))[0])


def test_sage_turn_scores_and_z_golden():
    # row of 4 response tokens: turn 0 (2 tokens, strong), turn 1 (2 tokens, weak)
    mask = torch.ones((1, 4))
    turns = torch.tensor([[0, 0, 1, 1]])
    labels = torch.tensor([[2, 2, 1, 1]])
    top1 = torch.log(torch.tensor([[0.8, 0.6, 0.5, 0.3]]))
    s, c = turn_scores(labels, top1, turns, mask, alpha=0.5)
    assert c[0].tolist() == pytest.approx([0.7, 0.7, 0.4, 0.4])
    assert s[0].tolist() == pytest.approx([0.7, 0.7, 0.2, 0.2])
    w, z = normalize_weights(s, mask)
    assert z == pytest.approx(4 / 1.8)
    assert float(w.mean()) == pytest.approx(1.0)  # Z keeps the mean token weight at 1
    # all skip -> weights 0 -> zero loss
    s0, _ = turn_scores(torch.zeros((1, 4), dtype=torch.long), top1, turns, mask, alpha=0.5)
    w0, z0 = normalize_weights(s0, mask)
    assert z0 == 0.0 and float(w0.abs().sum()) == 0.0
    sage = make_objective("sage_opd", {"estimator": "sampled"})
    batch = replace(batch_of([[1, 1, 1, 1]], [[-1.0] * 4], [[0.0] * 4]), teacher_logprobs=torch.tensor([[-0.5] * 4]))
    logS = torch.tensor([[-1.0] * 4], requires_grad=True)
    loss, _ = sage.loss(replace(batch, weights=w0), logS)
    assert float(loss.detach()) == 0.0
    # weighted: per-token OPD loss -(logT - logS) = -0.5 each; weights w -> mean(w * -0.5) = -0.5
    loss, _ = sage.loss(replace(batch, weights=w), logS)
    assert float(loss) == pytest.approx(-0.5, rel=1e-6)
