"""Every objective's loss and gradient pinned on non-degenerate values (docs/methods.md).

One shared batch: two episodes of unequal length, with distinct current (logS), sampling (logOld),
teacher (logT) and reference (logRef) logprobs and unequal advantages, so that a formula that
swaps logS for logOld, drops a clamp, detaches the wrong factor or changes the aggregation gives
a different number. The expected values are written out here per token in plain Python (each
formula and its hand-derived gradient once), never by calling the code under test.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from agentkit.objectives import Judgments, StepScores, TeacherScores, build_batch, make_objective
from agentkit.objectives.common import aggregate
from helpers import batch_of

from agentkit.core.trajectory import Trajectory, Turn

# row 0 = episode 0 (3 response tokens, A = +0.8), row 1 = episode 1 (2 response tokens, A = -1.3)
MASK = [[0, 1, 1, 1], [0, 1, 1, 0]]
LOGS = [[0.0, -0.7, -1.2, -0.3], [0.0, -2.0, -0.5, 0.0]]
LOGOLD = [[0.0, -0.9, -1.0, -0.35], [0.0, -1.6, -0.55, 0.0]]
LOGT = [[0.0, -0.2, -2.0, -0.1], [0.0, -2.5, -0.4, 0.0]]
LOGREF = [[0.0, -0.8, -1.5, -0.2], [0.0, -1.9, -0.7, 0.0]]
ADV = [0.8, -1.3]
TOKENS = [(b, t) for b in range(2) for t in range(4) if MASK[b][t]]
N = len(TOKENS)  # 5 response tokens
EPISODE_TOKENS = [3, 2]


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def shared_batch(**changes):
    adv = [[ADV[b] * m for m in MASK[b]] for b in range(2)]
    batch = batch_of(MASK, LOGOLD, adv, ref=LOGREF)
    return replace(batch, teacher_logprobs=torch.tensor(LOGT), **changes)


def run(name: str, args: dict, batch=None, logs=LOGS):
    """(loss, d loss / d logS [2, 4], metrics) of objective ``name`` on the shared batch."""
    objective = make_objective(name, args)
    logS = torch.tensor(logs, requires_grad=True)
    loss, metrics = objective.loss(batch if batch is not None else shared_batch(), logS)
    loss.backward()
    return float(loss), logS.grad, metrics


def ppo_token(s: float, old: float, a: float, low: float = 0.2, high: float = 0.2, c: float = 3.0):
    """-min(r a, clip(r) a), dual-clipped at -c a for a < 0; and its derivative in s."""
    r = math.exp(s - old)
    r_clip = min(max(r, 1 - low), 1 + high)
    if r * a <= r_clip * a:  # the unclipped branch is the min
        loss, grad = -r * a, -r * a
    else:
        loss, grad = -r_clip * a, 0.0
    if c and a < 0 and -c * a < loss:
        loss, grad = -c * a, 0.0
    return loss, grad


def k3_token(s: float, ref: float):
    """exp(ref - s) - (ref - s) - 1 and its derivative in s."""
    d = ref - s
    return math.exp(d) - d - 1, -math.exp(d) + 1


def expect(per_token, mode: str = "token-mean"):
    """(loss, grad [2, 4]) from per-token (loss, d/ds) pairs, reduced as ``mode`` does."""
    grad = [[0.0] * 4 for _ in range(2)]
    loss = 0.0
    for (b, t), (value, g) in zip(TOKENS, per_token, strict=True):
        scale = 1 / N if mode == "token-mean" else 1 / (EPISODE_TOKENS[b] * 2)
        loss += value * scale
        grad[b][t] = g * scale
    return loss, torch.tensor(grad)


def check(got, want, rel=1e-5):
    loss, grad, _ = got
    want_loss, want_grad = want
    assert loss == pytest.approx(want_loss, rel=rel, abs=1e-9)
    assert torch.allclose(grad, want_grad, atol=1e-6), (grad, want_grad)


def grpo_tokens(kl_coef: float = 0.01, c: float = 3.0):
    out = []
    for b, t in TOKENS:
        pg, dpg = ppo_token(LOGS[b][t], LOGOLD[b][t], ADV[b], c=c)
        kl, dkl = k3_token(LOGS[b][t], LOGREF[b][t])
        out.append((pg + kl_coef * kl, dpg + kl_coef * dkl))
    return out


def test_the_shared_batch_is_not_degenerate():
    # one token clipped above (A > 0, r = e^0.2), one clipped below (A < 0, r = e^-0.4), the rest inside
    ratios = [math.exp(LOGS[b][t] - LOGOLD[b][t]) for b, t in TOKENS]
    assert ratios[0] > 1.2 and ratios[3] < 0.8 and all(0.8 < r < 1.2 for r in (ratios[1], ratios[2], ratios[4]))
    gaps = [LOGT[b][t] - LOGS[b][t] for b, t in TOKENS]
    assert any(g > 0 for g in gaps) and any(g < 0 for g in gaps) and len(set(gaps)) == N


def test_grpo_golden():
    got = run("grpo", {})
    check(got, expect(grpo_tokens()))  # defaults: clip 0.2/0.2, dual-clip 3, kl 0.01
    assert got[2]["clip_fraction"] == pytest.approx(2 / 5)  # tokens 0 and 3; the three inside the clip are not
    assert got[2]["ratio_mean"] == pytest.approx(sum(math.exp(LOGS[b][t] - LOGOLD[b][t]) for b, t in TOKENS) / N)
    assert got[2]["kl"] == pytest.approx(sum(k3_token(LOGS[b][t], LOGREF[b][t])[0] for b, t in TOKENS) / N)
    check(run("grpo", {"kl_coef": 0.0}), expect(grpo_tokens(kl_coef=0.0)))
    check(run("grpo", {"kl_coef": 0.3, "aggregation": "sequence-mean"}),
          expect(grpo_tokens(kl_coef=0.3), "sequence-mean"))


def test_grpo_dual_clip_caps_negative_advantages():
    # token 0: A = -2, r = e^1.5 = 4.48 > c = 3: the PPO loss 8.96 is capped at 3 * 2 = 6 with no gradient;
    # token 1: A = -2, r = e^-0.1 inside the clip: loss -rA = 2r, d/ds = 2r; token 2: A = +0.5, r = e^0.1 inside
    batch = batch_of([[1, 1, 1]], [[-2.5, -1.0, -1.0]], [[-2.0, -2.0, 0.5]])
    logs = [[-1.0, -1.1, -0.9]]
    second = (2 * math.exp(-0.1), 2 * math.exp(-0.1))
    third = (-0.5 * math.exp(0.1), -0.5 * math.exp(0.1))
    for c, first, clipped in ((3.0, (6.0, 0.0), 1 / 3), (0.0, (2 * math.exp(1.5), 2 * math.exp(1.5)), 0.0)):
        got = run("grpo", {"kl_coef": 0.0, "dual_clip": c}, batch, logs)
        assert got[0] == pytest.approx((first[0] + second[0] + third[0]) / 3, rel=1e-6)
        assert got[1][0].tolist() == pytest.approx([first[1] / 3, second[1] / 3, third[1] / 3], rel=1e-6)
        assert got[2]["clip_fraction"] == pytest.approx(clipped)  # the dual-clipped token counts as clipped
    for bad in (0.5, 1.0):
        with pytest.raises(Exception, match="dual_clip must be above 1"):
            make_objective("grpo", {"dual_clip": bad})
    assert make_objective("grpo", {"dual_clip": 1.5}).config.dual_clip == 1.5


def test_k3_kl_is_clamped_at_ten():
    # logRef - logS = 3: k3 = e^3 - 4 = 16.09 -> 10, and no gradient through the clamp
    batch = batch_of([[1]], [[-5.0]], [[0.0]], ref=[[-2.0]])
    loss, grad, m = run("grpo", {"kl_coef": 1.0}, batch, [[-5.0]])
    assert loss == pytest.approx(10.0) and float(grad[0, 0]) == 0.0 and m["kl"] == pytest.approx(10.0)
    loss, _, _ = run("grpo", {"kl_coef": 1.0, "kl_clamp": 0.0}, batch, [[-5.0]])
    assert loss == pytest.approx(math.exp(3) - 4, rel=1e-6)
    loss, _, _ = run("grpo", {"kl_coef": 1.0, "kl_clamp": 1.0}, batch, [[-5.0]])
    assert loss == pytest.approx(1.0)
    # the log-ratio is clamped at 20 before exp (verl): logRef - logS = 25 counts as 20
    far = batch_of([[1]], [[-30.0]], [[0.0]], ref=[[-5.0]])
    loss, _, _ = run("grpo", {"kl_coef": 1.0, "kl_clamp": 0.0}, far, [[-30.0]])
    assert loss == pytest.approx(math.exp(20) - 20 - 1, rel=1e-6)


def test_the_policy_ratio_is_clamped_at_e20():
    # logS - logOld = 25 with A = -1 and no dual-clip: loss -rA = r, r = e^20 (not e^25)
    batch = batch_of([[1]], [[-30.0]], [[-1.0]])
    loss, _, _ = run("grpo", {"kl_coef": 0.0, "dual_clip": 0.0}, batch, [[-5.0]])
    assert loss == pytest.approx(math.exp(20), rel=1e-6)


def sdar_tokens(lam: float, beta: float, pg_coef: float = 1.0, kl_coef: float = 0.01):
    out = []
    for (b, t), (grpo, dgrpo) in zip(TOKENS, grpo_tokens(kl_coef=0.0), strict=True):
        kl, dkl = k3_token(LOGS[b][t], LOGREF[b][t])
        gap = LOGT[b][t] - LOGS[b][t]
        g = sig(beta * gap)  # from the current logS, no gradient through it
        out.append((pg_coef * grpo + kl_coef * kl + lam * g * gap, pg_coef * dgrpo + kl_coef * dkl - lam * g))
    return out


def test_sdar_golden():
    check(run("sdar", {}), expect(sdar_tokens(lam=0.01, beta=5.0)))  # the reference defaults
    got = run("sdar", {"lam": 0.7, "beta": 2.0, "aggregation": "sequence-mean"})
    check(got, expect(sdar_tokens(lam=0.7, beta=2.0), "sequence-mean"))  # the policy loss's aggregation
    gates = [sig(2.0 * (LOGT[b][t] - LOGS[b][t])) for b, t in TOKENS]
    assert got[2]["gate_mean"] == pytest.approx(sum(gates) / N)
    assert got[2]["gate_above_half"] == pytest.approx(sum(g > 0.5 for g in gates) / N)
    assert got[2]["negative_gap_share"] == pytest.approx(2 / 5)
    distill = [(g * (LOGT[b][t] - LOGS[b][t]), 0.0) for g, (b, t) in zip(gates, TOKENS, strict=True)]
    assert got[2]["sdar_loss"] == pytest.approx(expect(distill, "sequence-mean")[0], rel=1e-5)
    assert got[2]["grpo_loss"] == pytest.approx(expect(grpo_tokens(kl_coef=0.0), "sequence-mean")[0], rel=1e-5)


def test_sdar_records_the_gate_at_sampling_time():
    # prepare's per-token signal for the viewer: sigmoid(beta * (logT - logOld)) on response tokens, 0 elsewhere
    trajectories = [_trajectory("g", 1.0, [3], [[-0.9, -1.0, -0.35]]), _trajectory("g", 0.0, [2], [[-1.6, -0.55]])]
    batch = build_batch(trajectories)
    teacher = torch.zeros_like(batch.response_mask)
    teacher[batch.response_mask > 0] = torch.tensor([-0.2, -2.0, -0.1, -2.5, -0.4])
    prepared = make_objective("sdar", {"beta": 3.0}).prepare(
        trajectories, StepScores(teacher=TeacherScores(logprobs=teacher, top1=teacher)))
    gaps = [-0.2 + 0.9, -2.0 + 1.0, -0.1 + 0.35, -2.5 + 1.6, -0.4 + 0.55]
    gate = prepared.signals["gate"]
    assert gate[batch.response_mask > 0].tolist() == pytest.approx([sig(3.0 * g) for g in gaps], rel=1e-6)
    assert float(gate[batch.response_mask == 0].abs().sum()) == 0.0


def test_opsd_is_the_papers_pg_free_sdar():
    check(run("opsd", {}), expect(sdar_tokens(lam=0.01, beta=5.0, pg_coef=0.0)))
    check(run("opsd", {"lam": 0.5, "kl_coef": 0.0}), expect(sdar_tokens(lam=0.5, beta=5.0, pg_coef=0.0, kl_coef=0.0)))
    needs = make_objective("opsd").requirements()
    assert not needs.needs_groups and needs.needs_teacher and needs.default_teacher == "self" and needs.needs_reference


def test_grpo_opsd_is_sdar_with_a_flat_gate():
    check(run("grpo_opsd", {}), expect(sdar_tokens(lam=0.01, beta=0.0)))
    check(run("grpo_opsd", {"lam": 2.0}), expect(sdar_tokens(lam=2.0, beta=0.0)))


def opd_tokens(weights=None, high: float = 0.28):
    out = []
    for i, (b, t) in enumerate(TOKENS):
        a = LOGT[b][t] - LOGS[b][t]  # -(logS - logT), detached
        loss, grad = ppo_token(LOGS[b][t], LOGOLD[b][t], a, low=0.2, high=high, c=0.0)
        w = 1.0 if weights is None else weights[i]
        out.append((w * loss, w * grad))
    return out


REVERSE_KL = sum(LOGS[b][t] - LOGT[b][t] for b, t in TOKENS) / N  # the metric: mean of logS - logT
GAP_MEAN = -REVERSE_KL


def test_opd_sampled_golden():
    got = run("opd", {"estimator": "sampled"})
    check(got, expect(opd_tokens()))
    assert got[2]["reverse_kl"] == pytest.approx(REVERSE_KL)
    assert got[2]["teacher_logprob_mean"] == pytest.approx(sum(LOGT[b][t] for b, t in TOKENS) / N)
    check(run("opsd_rkl", {"estimator": "sampled"}), expect(opd_tokens()))  # the reverse-KL self-distillation variant
    # topk 1: renormalized over the teacher's single token both distributions are 1 there: KL 0
    one = torch.log(torch.tensor([[[0.7]]]))
    batch = replace(batch_of([[1]], [[0.0]], [[0.0]]), teacher_logprobs=torch.zeros(1, 1),
                    teacher_support_logprobs=torch.log(torch.tensor([[[0.4]]])))
    loss, _ = make_objective("opd", {"estimator": "full", "topk": 1}).loss(batch, torch.zeros(1, 1), one[0])
    assert float(loss) == pytest.approx(0.0, abs=1e-7)


def test_grpo_opsd_rkl_adds_the_reverse_kl_term():
    grpo, opd = grpo_tokens(), opd_tokens(high=0.2)
    want = [(g + 0.5 * o, dg + 0.5 * do) for (g, dg), (o, do) in zip(grpo, opd, strict=True)]
    got = run("grpo_opsd_rkl", {"lam": 0.5})
    check(got, expect(want))
    assert got[2]["reverse_kl"] == pytest.approx(REVERSE_KL) and got[2]["gap_mean"] == pytest.approx(GAP_MEAN)
    assert got[2]["distill_loss"] == pytest.approx(sum(o for o, _ in opd) / N, rel=1e-5)
    assert got[2]["grpo_loss"] == pytest.approx(sum(ppo_token(LOGS[b][t], LOGOLD[b][t], ADV[b])[0]
                                                    for b, t in TOKENS) / N, rel=1e-5)


def skill_sd_tokens(coef: float, max_log_ratio: float = 10.0, max_exponent: float = 20.0):
    out = []
    for (b, t), (grpo, dgrpo) in zip(TOKENS, grpo_tokens(), strict=True):
        s, T, old = LOGS[b][t], LOGT[b][t], LOGOLD[b][t]
        ell = s - T
        exponent = min(-ell, max_exponent)
        k3 = math.exp(exponent) - 1 + ell
        dk3 = (-math.exp(-ell) if -ell < max_exponent else 0.0) + 1
        log_rho = min(s - old, max_log_ratio)
        rho = math.exp(log_rho)
        drho = rho if s - old < max_log_ratio else 0.0
        out.append((grpo + coef * rho * k3, dgrpo + coef * (drho * k3 + rho * dk3)))
    return out


def test_skill_sd_golden():
    got = run("skill_sd", {})
    check(got, expect(skill_sd_tokens(coef=0.001)))
    k3 = [math.exp(LOGT[b][t] - LOGS[b][t]) - 1 + LOGS[b][t] - LOGT[b][t] for b, t in TOKENS]
    rho = [math.exp(LOGS[b][t] - LOGOLD[b][t]) for b, t in TOKENS]
    assert got[2]["gap_mean"] == pytest.approx(GAP_MEAN) and got[2]["distill_k3"] == pytest.approx(sum(k3) / N)
    assert got[2]["distill_loss"] == pytest.approx(sum(r * k for r, k in zip(rho, k3, strict=True)) / N, rel=1e-5)
    check(run("skill_sd", {"coef": 0.9}), expect(skill_sd_tokens(coef=0.9)))
    # rho is differentiable: below the clamps the term's gradient is the reverse-KL one, rho (logS - logT)
    _, grad, _ = run("skill_sd", {"coef": 1.0, "kl_coef": 0.0, "clip_low": 10.0, "clip_high": 10.0},
                     shared_batch(advantages=torch.zeros(2, 4)))
    for b, t in TOKENS:
        rho = math.exp(LOGS[b][t] - LOGOLD[b][t])
        assert float(grad[b, t]) == pytest.approx(rho * (LOGS[b][t] - LOGT[b][t]) / N, rel=1e-5)


def test_skill_sd_clamps():
    # logS - logOld = 1.0 > 0.5: rho = e^0.5 with no gradient through it; logT - logS = 1.5 > 1.0:
    # the exponent is clamped at 1.0 (k3 = e^1 - 1 - 1.5) and its part of the gradient vanishes
    batch = replace(batch_of([[1]], [[-2.0]], [[0.0]]), teacher_logprobs=torch.tensor([[0.5]]))
    loss, grad, _ = run("skill_sd", {"coef": 1.0, "kl_coef": 0.0, "max_log_ratio": 0.5, "max_exponent": 1.0},
                        batch, [[-1.0]])
    k3 = math.e - 1 - 1.5
    assert loss == pytest.approx(math.exp(0.5) * k3, rel=1e-6)
    assert float(grad[0, 0]) == pytest.approx(math.exp(0.5) * 1.0, rel=1e-6)  # rho * dk3/ds, dk3/ds = 1


def _trajectory(group: str, ret: float, lengths: list[int], logprobs: list[list[float]], *, one_sequence=True,
                actions_valid=None) -> Trajectory:
    turns = [Turn(observation="o", context_ids=[7] * (2 if one_sequence or i == 0 else 3), response_ids=[5] * n,
                  response_logprobs=logprobs[i], response_text="x", action="a",
                  action_valid=True if actions_valid is None else actions_valid[i], reward=0.0, feedback="f")
             for i, n in enumerate(lengths)]
    return Trajectory(id=f"{group}|{ret}|{len(lengths)}", env="e", task="t", seed=0, split="train", group=group,
                      sample=0, turns=turns, episode_return=ret, won=ret > 0, score=ret, terminated=True,
                      truncated=False, model="m", sampling={"temperature": 1.0},
                      context_mode="chat" if one_sequence else "window")


def test_rlsd_reweights_advantages_from_the_sampling_time_gap_with_a_decaying_lambda():
    # two episodes of one group: returns 2 and -1 -> A = +-(1.5 / std), std unbiased = 2.1213
    trajectories = [_trajectory("g", 2.0, [3], [[-0.9, -1.0, -0.35]]), _trajectory("g", -1.0, [2], [[-1.6, -0.55]])]
    batch = build_batch(trajectories)
    teacher = torch.zeros_like(batch.response_mask)
    teacher[batch.response_mask > 0] = torch.tensor([-0.2, -2.0, -0.1, -2.5, -0.4])
    scores = lambda step: StepScores(teacher=TeacherScores(logprobs=teacher, top1=teacher), step=step)  # noqa: E731
    rlsd = make_objective("rlsd")
    a = 1.5 / (math.sqrt(4.5) + 1e-6)
    for step, lam_s in ((1, 0.5 * 0.99), (50, 0.25), (99, 0.005), (100, 0.0), (250, 0.0)):
        prepared = rlsd.prepare(trajectories, scores(step))
        got = prepared.advantages[prepared.response_mask > 0].tolist()
        gaps = [-0.2 + 0.9, -2.0 + 1.0, -0.1 + 0.35, -2.5 + 1.6, -0.4 + 0.55]
        signs = [1, 1, 1, -1, -1]
        want = [sign * a * ((1 - lam_s) + lam_s * min(max(math.exp(sign * gap), 0.8), 1.2))
                for sign, gap in zip(signs, gaps, strict=True)]
        assert got == pytest.approx(want, rel=1e-5), step
        assert prepared.metrics["rlsd_lambda"] == pytest.approx(lam_s)
        weights = [min(max(math.exp(sign * gap), 0.8), 1.2) for sign, gap in zip(signs, gaps, strict=True)]
        assert prepared.metrics["weight_mean"] == pytest.approx(sum(weights) / 5, rel=1e-6)
        raw = [math.exp(sign * gap) for sign, gap in zip(signs, gaps, strict=True)]
        assert prepared.metrics["weight_clipped_share"] == pytest.approx(sum(not 0.8 <= r <= 1.2 for r in raw) / 5)
    constant = make_objective("rlsd", {"decay_steps": 0}).prepare(trajectories, scores(500))
    assert constant.metrics["rlsd_lambda"] == 0.5
    assert make_objective("rlsd", {"decay_steps": 1}).prepare(trajectories, scores(1)).metrics["rlsd_lambda"] == 0.0
    # the loss is GRPO's on the reweighted advantages (no teacher term of its own)
    prepared = rlsd.prepare(trajectories, scores(1))
    logS = torch.where(prepared.response_mask > 0, prepared.old_logprobs + 0.05, torch.zeros(()))
    got, _ = rlsd.loss(replace(prepared, ref_logprobs=prepared.old_logprobs), logS)
    want, _ = make_objective("grpo").loss(replace(prepared, ref_logprobs=prepared.old_logprobs), logS)
    assert float(got) == float(want)


def test_sage_opd_label_turn_confidence_and_z_mapping():
    # one chat episode of three turns (2, 1, 3 response tokens) labelled strong, skip, weak; another of
    # two turns (2, 2) labelled weak, strong; distinct teacher top-1 probabilities per token
    trajectories = [_trajectory("a", 1.0, [2, 1, 3], [[-0.5, -0.6], [-0.7], [-0.2, -0.3, -0.4]]),
                    _trajectory("b", 0.0, [2, 2], [[-1.0, -1.1], [-0.9, -0.8]])]
    batch = build_batch(trajectories)
    where = batch.response_mask > 0
    p_top1 = [0.9, 0.7, 0.5, 0.6, 0.8, 0.4, 0.3, 0.5, 0.95, 0.85]
    top1 = torch.zeros_like(batch.response_mask)
    top1[where] = torch.log(torch.tensor(p_top1))
    logT = torch.zeros_like(batch.response_mask)
    logT[where] = torch.tensor([-0.4, -0.9, -0.1, -0.5, -0.2, -0.6, -1.5, -0.7, -0.3, -1.2])
    judgments = Judgments(labels=[["strong", "skip", "weak"], ["weak", "strong"]],
                          by_check=[[False, False, False], [False, True]])
    scores = StepScores(teacher=TeacherScores(logprobs=logT, top1=top1), judgments=judgments)
    sage = make_objective("sage_opd", {"alpha": 0.3, "estimator": "sampled"})  # the paper's L_OPD
    prepared = sage.prepare(trajectories, scores)
    # c_t = the turn's mean top-1 probability; s_t = i_t * c_t with i = (strong 1, skip 0, weak 0.3)
    c = [(0.9 + 0.7) / 2, 0.5, (0.6 + 0.8 + 0.4) / 3, (0.3 + 0.5) / 2, (0.95 + 0.85) / 2]
    s = [1 * c[0], 0 * c[1], 0.3 * c[2], 0.3 * c[3], 1 * c[4]]
    sizes = [2, 1, 3, 2, 2]
    z = sum(sizes) / sum(si * n for si, n in zip(s, sizes, strict=True))
    want = [z * si for si, n in zip(s, sizes, strict=True) for _ in range(n)]
    assert prepared.weights[where].tolist() == pytest.approx(want, rel=1e-5)
    assert prepared.metrics["Z"] == pytest.approx(z, rel=1e-6)
    assert prepared.metrics["confidence_mean"] == pytest.approx(sum(c) / 5, rel=1e-6)
    assert prepared.metrics["judge_check_share"] == pytest.approx(1 / 5)
    # the loss: token-mean of weight * OPD's per-token loss (A = logT - logS, PPO clip 0.2 / 0.28)
    logS = torch.zeros_like(batch.response_mask)
    logS[where] = torch.tensor([-0.45, -0.65, -0.75, -0.2, -0.25, -0.5, -1.0, -1.0, -0.95, -0.7])
    logS.requires_grad_(True)
    loss, metrics = sage.loss(prepared, logS)
    loss.backward()
    old, lT, lS = batch.old_logprobs[where].tolist(), logT[where].tolist(), logS.detach()[where].tolist()
    per = [ppo_token(s_, o, t_ - s_, low=0.2, high=0.28, c=0.0) for s_, o, t_ in zip(lS, old, lT, strict=True)]
    assert float(loss) == pytest.approx(sum(w * p[0] for w, p in zip(want, per, strict=True)) / 10, rel=1e-5)
    assert metrics["reverse_kl"] == pytest.approx(sum(s_ - t_ for s_, t_ in zip(lS, lT, strict=True)) / 10, rel=1e-5)
    assert logS.grad[where].tolist() == pytest.approx([w * p[1] / 10 for w, p in zip(want, per, strict=True)], rel=1e-5)


def test_sequence_mean_is_exact_across_micro_batches():
    # window mode: one row per turn; an episode's turns land in different micro-batches
    trajectories = [_trajectory("a", 1.0, [1, 3], [[-0.1], [-0.2, -0.3, -0.4]], one_sequence=False),
                    _trajectory("a", 0.0, [2, 2, 1], [[-0.5, -0.6], [-0.7, -0.8], [-0.9]], one_sequence=False)]
    batch = build_batch(trajectories)
    assert batch.num_rows == 5 and batch.episode_tokens.tolist() == [4, 4, 5, 5, 5]
    per_token = torch.ones_like(batch.response_mask)
    assert float(aggregate(per_token, batch, "sequence-mean")) == pytest.approx(1.0)
    unequal = torch.arange(batch.response_mask.numel(), dtype=torch.float32).reshape(batch.response_mask.shape)
    whole = float(aggregate(unequal, batch, "sequence-mean"))
    for max_tokens in (1, 8, 12, 1000):
        parts = batch.micro_batches(max_tokens)
        rows = torch.cat([torch.as_tensor(p.episode_index) for p in parts])
        assert sorted(rows.tolist()) == sorted(batch.episode_index.tolist())
        index = [_index_of(batch, p) for p in parts]
        split = sum(float(aggregate(unequal[i][:, : p.response_mask.shape[1]], p, "sequence-mean"))
                    for i, p in zip(index, parts, strict=True))
        ones = sum(float(aggregate(torch.ones_like(p.response_mask), p, "sequence-mean")) for p in parts)
        assert split == pytest.approx(whole, rel=1e-6) and ones == pytest.approx(1.0), max_tokens
    # by hand: episode a's tokens hold the values at its response positions, over 4; b's over 5
    values = unequal[batch.response_mask > 0].tolist()
    rows = batch.episode_index.repeat_interleave(batch.response_mask.sum(dim=1).long()).tolist()
    a = [v for v, r in zip(values, rows, strict=True) if r == 0]
    b = [v for v, r in zip(values, rows, strict=True) if r == 1]
    assert whole == pytest.approx((sum(a) / 4 + sum(b) / 5) / 2)


def _index_of(batch, part) -> list[int]:
    """Rows of ``batch`` that ``part`` holds (matched by their ids and masks)."""
    out = []
    for r in range(part.num_rows):
        n = int(part.attention_mask[r].sum())
        out.append(next(i for i in range(batch.num_rows) if i not in out
                        and int(batch.attention_mask[i].sum()) == n
                        and torch.equal(batch.response_mask[i, : n - 1], part.response_mask[r, : n - 1])
                        and int(batch.episode_index[i]) == int(part.episode_index[r])))
    return out


def test_opd_full_estimator_on_the_policys_support_layout():
    # the loop passes the policy's support log-probs as [N, K] (N = response positions, row-major):
    # two rows, three response positions, a 3-token vocabulary; the teacher's [B, L, V] carries no gradient
    mask = [[1, 0], [1, 1]]
    student = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.6, 0.2, 0.2]]))  # [N, V]
    teacher_rows = [[[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]], [[0.2, 0.2, 0.6], [0.7, 0.1, 0.2]]]
    teacher = torch.log(torch.tensor(teacher_rows)).requires_grad_(True)  # [B, L, V]
    batch = replace(batch_of(mask, [[-1.0, 0.0], [-1.0, -1.0]], [[0.0, 0.0], [0.0, 0.0]]),
                    teacher_logprobs=torch.zeros(2, 2), teacher_support_logprobs=teacher)
    support = student.clone().requires_grad_(True)
    loss, _ = make_objective("opd", {"estimator": "full", "topk": 0}).loss(batch, torch.zeros(2, 2), support)
    loss.backward()
    pairs = [(student[0], teacher_rows[0][0]), (student[1], teacher_rows[1][0]), (student[2], teacher_rows[1][1])]
    kls = [sum(math.exp(s) * (s - math.log(t)) for s, t in zip(st.tolist(), tt, strict=True)) for st, tt in pairs]
    assert float(loss) == pytest.approx(sum(kls) / 3, rel=1e-5)
    assert teacher.grad is None or float(teacher.grad.abs().sum()) == 0.0
    # d KL / d log pS(v) = pS(v) (log pS(v) - log pT(v) + 1), over 3 positions
    s0, t0 = student[0].tolist(), teacher_rows[0][0]
    want = [math.exp(s) * (s - math.log(t) + 1) / 3 for s, t in zip(s0, t0, strict=True)]
    assert support.grad[0].tolist() == pytest.approx(want, rel=1e-5)


def test_sage_opd_default_estimator_weights_each_positions_exact_reverse_kl():
    # SAGE-OPD's default L_OPD is the exact reverse KL per response position (opd's full estimator),
    # times the token's weight Z * s_t, token-mean over the batch's response tokens
    mask = [[1, 0], [1, 1]]
    student = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.6, 0.2, 0.2]]))  # [N, V]
    teacher_rows = [[[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]], [[0.2, 0.2, 0.6], [0.7, 0.1, 0.2]]]
    weights = torch.tensor([[1.6, 0.0], [0.3, 1.1]])  # [B, L]
    batch = replace(batch_of(mask, [[-1.0, 0.0], [-1.0, -1.0]], [[0.0, 0.0], [0.0, 0.0]]),
                    teacher_logprobs=torch.zeros(2, 2), teacher_support_logprobs=torch.log(torch.tensor(teacher_rows)),
                    weights=weights)
    sage = make_objective("sage_opd")
    assert sage.requirements().needs_support and sage.requirements().topk == 0
    loss, metrics = sage.loss(batch, torch.zeros(2, 2), student)
    pairs = [(student[0], teacher_rows[0][0]), (student[1], teacher_rows[1][0]), (student[2], teacher_rows[1][1])]
    kls = [sum(math.exp(s) * (s - math.log(t)) for s, t in zip(st.tolist(), tt, strict=True)) for st, tt in pairs]
    assert float(loss) == pytest.approx((1.6 * kls[0] + 0.3 * kls[1] + 1.1 * kls[2]) / 3, rel=1e-5)
    assert metrics["full_kl"] == pytest.approx(sum(kls) / 3, rel=1e-5)


def test_sage_opd_keeps_weights_when_the_weighted_mass_is_below_one():
    # one weak turn of one token with confidence 0.5: sum s |a| = 0.15 < 1, still Z = 1 / 0.15
    trajectories = [_trajectory("a", 1.0, [1], [[-0.5]])]
    batch = build_batch(trajectories)
    top1 = torch.zeros_like(batch.response_mask)
    top1[batch.response_mask > 0] = math.log(0.5)
    scores = StepScores(teacher=TeacherScores(logprobs=top1, top1=top1),
                        judgments=Judgments(labels=[["weak"]], by_check=[[False]]))
    prepared = make_objective("sage_opd", {"alpha": 0.3}).prepare(trajectories, scores)
    assert prepared.metrics["Z"] == pytest.approx(1 / 0.15) and prepared.metrics["confidence_mean"] == pytest.approx(0.5)
    assert prepared.weights[batch.response_mask > 0].tolist() == pytest.approx([1.0])


@pytest.mark.parametrize("ablation", ["confidence", "normalize"])
def test_sage_opd_ablations_drop_the_confidence_or_z(ablation):
    # the three-turn episode of the mapping test: labels strong, skip, weak with distinct top-1 probabilities
    trajectories = [_trajectory("a", 1.0, [2, 1, 3], [[-0.5, -0.6], [-0.7], [-0.2, -0.3, -0.4]])]
    batch = build_batch(trajectories)
    where = batch.response_mask > 0
    top1 = torch.zeros_like(batch.response_mask)
    top1[where] = torch.log(torch.tensor([0.9, 0.7, 0.5, 0.6, 0.8, 0.4]))
    scores = StepScores(teacher=TeacherScores(logprobs=top1, top1=top1),
                        judgments=Judgments(labels=[["strong", "skip", "weak"]], by_check=[[False] * 3]))
    prepared = make_objective("sage_opd", {"alpha": 0.3, ablation: False}).prepare(trajectories, scores)
    c = [0.8, 0.5, 0.6]
    i = [1.0, 0.0, 0.3]
    s = i if ablation == "confidence" else [a * b for a, b in zip(i, c, strict=True)]
    sizes = [2, 1, 3]
    z = 1.0 if ablation == "normalize" else sum(sizes) / sum(a * n for a, n in zip(s, sizes, strict=True))
    want = [z * si for si, n in zip(s, sizes, strict=True) for _ in range(n)]
    assert prepared.weights[where].tolist() == pytest.approx(want, rel=1e-5)
    assert prepared.metrics["Z"] == pytest.approx(z, rel=1e-6)
    assert prepared.metrics["confidence_mean"] == pytest.approx(sum(c) / 3, rel=1e-6)  # still recorded


IS_W = [[0.0, 1.7, 0.4, 1.0], [0.0, 0.6, 2.0, 0.0]]  # importance weights pi_old / pi_sampler per token


def test_importance_weights_scale_each_sampled_token_term_and_not_the_kl():
    """``batch.is_weights`` (the loop's off-policy correction) multiplies each token's policy-gradient or
    sampled reverse-KL term; GRPO's KL to the reference is not an expectation over the sampler and stays."""
    batch = shared_batch(is_weights=torch.tensor(IS_W))
    w = [IS_W[b][t] for b, t in TOKENS]
    grpo = []
    for (b, t), wi in zip(TOKENS, w, strict=True):
        pg, dpg = ppo_token(LOGS[b][t], LOGOLD[b][t], ADV[b])
        kl, dkl = k3_token(LOGS[b][t], LOGREF[b][t])
        grpo.append((wi * pg + 0.01 * kl, wi * dpg + 0.01 * dkl))
    check(run("grpo", {}, batch), expect(grpo))
    check(run("opd", {"estimator": "sampled"}, batch), expect(opd_tokens(weights=w)))
    opd = opd_tokens(weights=w, high=0.2)
    check(run("grpo_opsd_rkl", {"lam": 0.5}, batch),
          expect([(g + 0.5 * o, dg + 0.5 * do) for (g, dg), (o, do) in zip(grpo, opd, strict=True)]))
    skill = [(g + 0.3 * wi * (s_sd - g0) / 0.3, dg + 0.3 * wi * (ds_sd - dg0) / 0.3)
             for (g, dg), wi, (s_sd, ds_sd), (g0, dg0) in zip(grpo, w, skill_sd_tokens(0.3), grpo_tokens(), strict=True)]
    check(run("skill_sd", {"coef": 0.3}, batch), expect(skill))
