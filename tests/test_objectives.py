"""Golden values on hand-computed tensors for every objective, and the objective registry."""

from __future__ import annotations

import ast
import math
from dataclasses import asdict, replace
from pathlib import Path

import agentkit.objectives
import pytest
import torch
from agentkit.objectives import (
    REGISTRY,
    Capabilities,
    Judgments,
    StepScores,
    TeacherScores,
    build_batch,
    capabilities_of,
    make_objective,
)
from agentkit.objectives.common import aggregate, group_advantages, k3_kl
from helpers import batch_of
from pydantic import BaseModel

from agentkit.core.errors import ConfigError, PluginError, UnknownNameError
from agentkit.core.plugins import PluginSpec
from agentkit.core.settings import ContextSettings
from agentkit.core.trajectory import Trajectory, Turn


def test_group_advantages_golden():
    # group a: returns 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3) -> +-0.866 (verl, TRL);
    # population std 0.5 -> +-1; group b: all equal -> 0; a group of one -> 0
    returns, groups = [1, 0, 0, 1, 3, 3, 5], ["a", "a", "a", "a", "b", "b", "c"]
    a = 0.5 / math.sqrt(1 / 3)
    assert group_advantages(returns, groups, eps=0.0) == pytest.approx([a, -a, -a, a, 0, 0, 0])
    assert group_advantages(returns, groups, eps=0.0, unbiased_std=False) == pytest.approx([1, -1, -1, 1, 0, 0, 0])
    assert group_advantages([1, 0, 4], ["a"] * 3, eps=0.5) == pytest.approx([(x - 5 / 3) / (math.sqrt(13 / 3) + 0.5)
                                                                             for x in (1, 0, 4)])
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
    grpo = make_objective("grpo", {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0})
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
    batch = make_objective("grpo", {"invalid_action_penalty": 0.5}).prepare(trajs, None)
    # chat rows: [1,2,3,4,1,2,3,4] -> targets are ids[1:]; response targets at columns 1,2,5,6
    assert batch.response_mask[0].tolist() == [0, 1, 1, 0, 0, 1, 1]
    assert batch.old_logprobs[0].tolist() == pytest.approx([0, -0.1, -0.2, 0, 0, -0.1, -0.2])
    # returns 1 and 0 - 2*0.5 = -1 -> mean 0, unbiased std sqrt(2): advantages +-1/sqrt(2) on every response token
    a = 1 / math.sqrt(2)
    assert batch.advantages[0].tolist() == pytest.approx([0, a, a, 0, 0, a, a], abs=1e-5)
    assert batch.advantages[1].tolist() == pytest.approx([0, -a, -a, 0, 0, -a, -a], abs=1e-5)
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


def test_capabilities_are_declared_and_readable_without_building():
    # every registered objective declares its needs on the class: read here without an instance
    for name in REGISTRY.names():
        declared = capabilities_of(name)
        assert isinstance(declared, Capabilities), name
        resolved = make_objective(name).requirements()
        assert isinstance(resolved, Capabilities), name
        # a setting may switch a need off, never add one the class does not declare
        declared_needs, resolved_needs = asdict(declared), asdict(resolved)
        for need in ("needs_teacher", "uses_skills", "needs_support", "needs_groups", "needs_judge", "needs_reference"):
            assert declared_needs[need] or not resolved_needs[need], (name, need)
    assert capabilities_of("sft").uses_demonstrations and not capabilities_of("sft").needs_groups
    # every GRPO-family objective compares episodes within a group; distillation from a separate model does not
    family = ("grpo", "sdar", "grpo_opsd", "grpo_opsd_rkl", "rlsd", "skill_sd", "skill_grpo")
    assert all(make_objective(n).requirements().needs_groups for n in family)
    assert not capabilities_of("opd").needs_groups and capabilities_of("opd").default_teacher is None
    assert capabilities_of("opsd").default_teacher == "self" and capabilities_of("opsd_rkl").default_teacher == "self"
    # one KL default for the whole GRPO family (and the paper's OPSD): every one needs the reference
    assert all(make_objective(n).config.kl_coef == 0.01 for n in (*family, "opsd"))
    # settings resolve the needs that depend on them
    assert not make_objective("grpo", {"kl_coef": 0.0}).requirements().needs_reference
    assert make_objective("grpo").requirements().needs_reference
    assert not make_objective("opsd").requirements().needs_groups
    assert make_objective("opsd", {"pg_coef": 1.0}).requirements().needs_groups
    full = make_objective("opd", {"estimator": "full", "topk": 5}).requirements()
    assert full.needs_support and full.topk == 5
    assert make_objective("opd").requirements().needs_support  # full is the default estimator
    assert not make_objective("opd", {"estimator": "sampled"}).requirements().needs_support
    assert make_objective("sage_opd").requirements().needs_support
    assert not make_objective("sage_opd", {"estimator": "sampled"}).requirements().needs_support
    sage = make_objective("sage_opd", {"judge": "oracle"}).requirements()
    assert sage.needs_judge and sage.judge == "oracle" and sage.needs_teacher
    with pytest.raises(ValueError, match="default_teacher is set but needs_teacher is False"):
        Capabilities(default_teacher="self")


class _NoCapabilities:
    """An objective plugin written before capabilities were declared."""

    class Config(BaseModel):
        pass

    def __init__(self, config) -> None:
        self.config = config

    def prepare(self, trajectories, scores=None):
        return build_batch(trajectories)

    def loss(self, batch, logprobs):
        return logprobs.sum(), {}


def test_plugin_without_capabilities_is_refused_naming_it(monkeypatch):
    spec = PluginSpec("legacy_obj", _NoCapabilities, distribution="legacy-dist")
    monkeypatch.setitem(REGISTRY._specs, "legacy_obj", spec)
    expected = r"Objective 'legacy_obj' from 'legacy-dist' \(group 'agentkit.objectives'\).*has no `capabilities`.*requirements\(\)"
    with pytest.raises(PluginError, match=expected):
        capabilities_of("legacy_obj")
    with pytest.raises(PluginError, match=expected):
        make_objective("legacy_obj")
    monkeypatch.setitem(REGISTRY._specs, "not_a_class", PluginSpec("not_a_class", lambda config: None, distribution="x"))
    with pytest.raises(PluginError, match="'not_a_class' from 'x'.*is a function, not a class"):
        capabilities_of("not_a_class")


def test_objectives_import_nothing_above_the_core():
    # objectives are pure maths: the loop runs teachers, judges, rollouts and skill banks (DESIGN.md)
    folder = Path(agentkit.objectives.__file__).parent
    offending = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offending += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "agentkit"
                          and n.split(".")[1:2] not in (["core"], ["objectives"])]
    assert offending == []


def test_teacher_objectives_prepare_from_the_loops_scores():
    trajs = [_traj("g", 1.0), _traj("g", 0.0)]
    layout = build_batch(trajs)
    logT = torch.full(layout.response_mask.shape, -0.3) * layout.response_mask  # [B, L]
    scores = StepScores(teacher=TeacherScores(logprobs=logT, top1=logT))
    batch = make_objective("sdar").prepare(trajs, scores)
    assert torch.equal(batch.teacher_logprobs, logT)
    a = 1 / math.sqrt(2)
    assert batch.advantages[0].tolist() == pytest.approx([0, a, a, 0, 0, a, a], abs=1e-5)  # GRPO's part unchanged
    for name in ("opd", "opsd", "opsd_rkl", "sdar", "grpo_opsd", "grpo_opsd_rkl", "rlsd", "skill_sd", "sage_opd"):
        with pytest.raises(ValueError, match="needs the teacher's scores: pass prepare"):
            make_objective(name).prepare(trajs, None)
    with pytest.raises(ValueError, match="teacher's scores are"):
        make_objective("opd").prepare(trajs[:1], scores)  # scores of other trajectories
    # SAGE-OPD: labels from the loop's judgments; turn 0 strong, turn 1 skip in both episodes
    judged = Judgments(labels=[["strong", "skip"], ["strong", "skip"]], by_check=[[False, False]] * 2)
    sage = make_objective("sage_opd").prepare(trajs, StepScores(teacher=scores.teacher, judgments=judged))
    assert sage.weights[0].tolist() == pytest.approx([0, 2, 2, 0, 0, 0, 0], abs=1e-6)  # Z = 8 tokens / 4 weighted
    assert sage.metrics["judge_strong_share"] == 0.5
    with pytest.raises(ValueError, match="sage_opd needs the turn judgments"):
        make_objective("sage_opd").prepare(trajs, scores)


@pytest.mark.parametrize("context", ["chat", "window"])
def test_ratio_is_one_before_the_update_at_the_sampling_temperature(backend, context):
    # real episodes sampled at T = 0.7: the trainer's logprobs equal the recorded ones (ratio 1)
    from agentkit.envs import ActionParser, make
    from agentkit.objectives import policy_logprobs
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams

    collector = Collector(backend, lambda: make("vaults/vaults-v0", max_turns=3, action_parser=ActionParser()),
                          env_id="vaults/vaults-v0", sampling=SamplingParams(temperature=0.7, max_new_tokens=8),
                          context=ContextSettings(mode=context))
    trajectories = []
    backend.reseed(3)
    collector.run([EpisodeSpec(seed, s) for seed in range(2) for s in range(2)], trajectories.append)
    collector.close()
    grpo = make_objective("grpo", {"kl_coef": 0.0})
    batch = grpo.prepare(trajectories, None)
    assert batch.temperature.tolist() == pytest.approx([0.7] * batch.num_rows)
    mask = batch.response_mask > 0
    with torch.no_grad():
        logprobs = policy_logprobs(backend.model, batch)
        _, metrics = grpo.loss(batch, logprobs)
        plain = policy_logprobs(backend.model, replace(batch, temperature=None))  # the raw softmax
    assert torch.allclose(logprobs[mask], batch.old_logprobs[mask], atol=1e-4)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and metrics["clip_fraction"] == 0.0
    assert not torch.allclose(plain[mask], batch.old_logprobs[mask], atol=1e-2)


def test_training_refuses_truncated_sampling():
    from agentkit.train.config import TrainConfig

    for sampling in ({"top_p": 0.9}, {"top_k": 20}):
        with pytest.raises(ValueError, match="training samples from the whole distribution.*Drop --top-p/--top-k"):
            TrainConfig(sampling=sampling)
    assert TrainConfig(sampling={"temperature": 0.7}).sampling.temperature == 0.7


def test_policy_logprobs_equal_the_full_softmax_at_every_response_position(tiny_model_dir):
    """The output layer and the softmax run on the response positions only; values, support and
    gradients must equal the plain [B, L, V] computation. Rows as chat mode
    lays them out: several responses per row, at other columns in each row, rows of unequal length,
    a temperature per row, and a teacher's top-k support."""
    from agentkit.objectives import TokenBatch, policy_logprobs
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    V = model.config.vocab_size
    lengths, spans = [40, 33, 26], [[(5, 9), (20, 27)], [(12, 15), (25, 31)], [(3, 6), (9, 12), (18, 24)]]
    B, L = len(lengths), max(lengths) - 1
    input_ids = torch.zeros((B, L + 1), dtype=torch.long)
    attention = torch.zeros((B, L + 1), dtype=torch.long)
    response = torch.zeros((B, L))
    for b, (n, row_spans) in enumerate(zip(lengths, spans, strict=True)):
        input_ids[b, :n] = torch.randint(3, V, (n,))
        attention[b, :n] = 1
        for start, stop in row_spans:
            response[b, start:stop] = 1.0
    batch = TokenBatch(input_ids=input_ids, attention_mask=attention, response_mask=response,
                       old_logprobs=torch.zeros((B, L)), advantages=torch.zeros((B, L)), weights=response.clone(),
                       episode_index=torch.arange(B), turn_index=torch.full((B, L), -1),
                       temperature=torch.tensor([0.7, 1.0, 1.3]),
                       teacher_support_ids=torch.randint(0, V, (B, L, 5)))
    mask = response > 0
    weights = torch.randn(B, L)  # a loss with a distinct weight on every position

    def grads(loss):
        model.zero_grad(set_to_none=True)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    seen = []  # what the output layer computed
    handle = model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(out.shape))
    sampled, support = policy_logprobs(model, batch, support=True)
    _, full = policy_logprobs(model, replace(batch, teacher_support_ids=None), support=True)
    handle.remove()
    assert seen == [(int(mask.sum()), V)] * 2  # the response positions' logits, not the kept columns of every row
    ours = grads((sampled * weights).sum() + support.sum() + full[:, :7].sum())

    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / batch.temperature[:, None, None]
    logp = torch.log_softmax(logits, dim=-1)  # [B, L, V]
    plain = logp.gather(2, input_ids[:, 1:, None]).squeeze(2) * response
    plain_support = logp[mask].gather(1, batch.teacher_support_ids[mask])
    reference = grads((plain * weights).sum() + plain_support.sum() + logp[mask][:, :7].sum())

    assert plain[mask].std() > 0.1 and sampled[mask].abs().min() > 0  # non-degenerate values
    assert torch.allclose(sampled, plain, atol=1e-5) and not sampled[~mask].any()
    assert torch.allclose(support, plain_support, atol=1e-5) and torch.allclose(full, logp[mask], atol=1e-5)
    for got, want in zip(ours, reference, strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_position_logits_of_a_model_that_does_not_call_its_output_layer(tiny_model_dir):
    """A forward that multiplies by the output layer's weight itself (no module call) gets its kept
    columns' logits picked after the fact: the same values. One that reshapes what its output layer
    returned is refused with a clear error rather than scored wrong."""
    from agentkit.core.errors import ModelError
    from agentkit.objectives import position_logits
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    V = model.config.vocab_size

    class OwnProduct(torch.nn.Module):
        def __init__(self, reshape: bool = False) -> None:
            super().__init__()
            self.inner, self.reshape = model, reshape

        def get_output_embeddings(self):
            return self.inner.lm_head

        def forward(self, input_ids, attention_mask, logits_to_keep, use_cache):
            hidden = self.inner.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if self.reshape:  # calls the layer, then views its output as [B, C, V]
                logits = self.inner.lm_head(hidden[:, logits_to_keep]).view(input_ids.shape[0], -1, V)
            else:
                logits = torch.nn.functional.linear(hidden[:, logits_to_keep], self.inner.lm_head.weight)
            return type("Out", (), {"logits": logits})()

    ids = torch.randint(3, V, (3, 20))
    mask = torch.ones_like(ids)
    mask[2, 15:] = 0
    rows, columns = torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([3, 11, 7, 9, 3, 14])
    want = model(input_ids=ids, attention_mask=mask).logits[rows, columns]
    assert want.std() > 0.1
    assert torch.allclose(position_logits(model, ids, mask, rows, columns), want, atol=1e-5)
    assert torch.allclose(position_logits(OwnProduct(), ids, mask, rows, columns), want, atol=1e-5)
    with pytest.raises(ModelError, match="reshaped its output layer's logits"):
        position_logits(OwnProduct(reshape=True), ids, mask, rows, columns)
