"""Teachers score the student's exact tokens (with and without privileged context), refuse a
foreign tokenizer, and the turn judges label turns as SAGE-OPD needs."""

from __future__ import annotations

import pytest
import torch
from agentkit.objectives import build_batch, policy_logprobs
from agentkit.skillbank import SkillBank, resolve_bank
from agentkit.teachers import LLMJudge, OracleJudge, Teacher, make_judge, make_teacher, parse_label
from agentkit.teachers.context import prefix_ids, privileged_text

from agentkit.core.errors import ConfigError, ModelError, PluginError, UnknownNameError

pytestmark = pytest.mark.textworld
pytest.importorskip("textworld")


@pytest.fixture(scope="module")
def episodes(backend):
    """Two real 2-turn TextWorld episodes from the tiny model, with retrieved skills recorded."""
    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.run import env_factory
    from agentkit.skillbank import SkillSelector, make_retriever

    bank = SkillBank.load(resolve_bank("textworld"))
    selector = SkillSelector(bank, make_retriever("random"), 2, env_id="textworld/coin-v0", seed=0)
    out = []
    collector = Collector(backend, env_factory("textworld/coin-v0", split="train", max_turns=2, env_kwargs={"level": 1}),
                          env_id="textworld/coin-v0", sampling=SamplingParams(max_new_tokens=6, seed=1), skills=selector)
    collector.run([EpisodeSpec(0, 0), EpisodeSpec(1, 0)], out.append)
    out.sort(key=lambda t: t.id)
    assert all(len(t.skills) == 2 and not t.skills_in_prompt for t in out)
    return out, bank


def test_self_teacher_without_privilege_is_the_policy(backend, episodes):
    trajectories, bank = episodes
    teacher = make_teacher("self", policy=backend.model, tokenizer=backend.tokenizer, bank=bank, privileged=[])
    batch = build_batch(trajectories)
    scores = teacher.score(batch, trajectories, topk=4)
    with torch.no_grad():
        expected = policy_logprobs(backend.model, batch) * batch.response_mask
    assert torch.allclose(scores.logprobs, expected, atol=1e-5)
    mask = batch.response_mask.bool()
    # the recorded sampling logprobs are the same numbers (the tokens were sampled by these weights)
    assert torch.allclose(scores.logprobs[mask], batch.old_logprobs[mask], atol=1e-4)
    assert bool((scores.top1[mask] >= scores.logprobs[mask] - 1e-6).all())
    assert torch.allclose(scores.support_logprobs[..., 0][mask], scores.top1[mask])  # top-k sorted, first = top-1
    assert scores.support_ids.shape[-1] == 4


def test_privileged_context_is_a_prefix_the_student_never_sees(backend, episodes):
    trajectories, bank = episodes
    teacher = make_teacher("self", policy=backend.model, tokenizer=backend.tokenizer, bank=bank)
    text = privileged_text(trajectories[0], ["skills"], bank)
    assert text.startswith("[Privileged Skill Information]")
    assert all(bank.get(i).title in text for i in trajectories[0].skills)
    batch = build_batch(trajectories[:1])
    scores = teacher.score(batch, trajectories[:1], topk=0)
    prefix = prefix_ids(backend.tokenizer, text)
    ids = prefix + batch.input_ids[0].tolist()
    with torch.no_grad():
        logits = backend.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prefix):-1]  # [L, V]
    target = batch.input_ids[0, 1:]
    mask = batch.response_mask[0].bool()
    assert torch.allclose(scores.logprobs[0][mask], logp.gather(1, target[:, None]).squeeze(1)[mask], atol=1e-5)
    assert scores.support_logprobs.shape[-1] == logits.shape[-1]  # topk=0: the whole vocabulary
    assert not torch.allclose(scores.logprobs[0][mask], batch.old_logprobs[0][mask], atol=1e-4)  # the block matters


def test_model_teacher_loads_a_folder_and_refuses_another_tokenizer(tiny_model_dir, backend, tmp_path):
    teacher = make_teacher(f"model:{tiny_model_dir}", policy=backend.model, tokenizer=backend.tokenizer)
    assert teacher.name.startswith("model:") and teacher.privileged == ()
    assert not any(p.requires_grad for p in teacher.model.parameters())
    from agentkit.models import init_model

    other = init_model(tmp_path / "other", size="tiny", seed=0, vocab_size=400, include_textworld=False)
    with pytest.raises(ModelError, match="different tokenizer from the student"):
        make_teacher(f"model:{other}", policy=backend.model, tokenizer=backend.tokenizer)
    with pytest.raises(UnknownNameError, match="Did you mean 'self'"):
        make_teacher("slef", policy=backend.model, tokenizer=backend.tokenizer)
    with pytest.raises(ConfigError, match="model:DIR"):
        make_teacher("model", policy=backend.model, tokenizer=backend.tokenizer)


@pytest.mark.parametrize(("answer", "label"), [
    ("STRONG", "strong"), ("skip.", "skip"), ("Label: Weak", "weak"), ("**WEAK** because", "weak"),
    ("I think skip, no wait. Label: STRONG", "strong"), ("skip or strong", None), ("", None), ("<action>go", None),
    ("weakly", None),
])
def test_parse_label(answer, label):
    assert parse_label(answer) == label


class CountingBackend:
    """The real backend, counting what is asked of it (to show what the judge never asks)."""

    def __init__(self, backend):
        self.inner, self.prompts = backend, []
        self.tokenizer, self.max_context = backend.tokenizer, backend.max_context

    def generate(self, prompts, params, seeds=None):
        self.prompts += list(prompts)
        return self.inner.generate(prompts, params, seeds)


def test_llm_judge_checks_first_and_counts_unparseable(backend, episodes):
    from dataclasses import replace

    trajectories, _ = episodes
    counting = CountingBackend(backend)
    judge = LLMJudge(counting)
    invalid = [replace(t, turns=[replace(turn, action_valid=False) for turn in t.turns]) for t in trajectories]
    result = judge.judge(invalid)
    assert counting.prompts == [] and result.asked == 0  # an invalid action is strong without asking
    assert all(label == "strong" for episode in result.labels for label in episode)
    assert result.metrics()["judge_check_share"] == 1.0
    valid = [replace(t, turns=[replace(turn, action_valid=True) for turn in t.turns]) for t in trajectories]
    result = judge.judge(valid)
    turns = sum(len(t.turns) for t in valid)
    assert result.asked == turns == len(counting.prompts)
    # the untrained tiny model answers gibberish: every such answer is strong, and counted
    assert result.unparseable == sum(parse_label(a) is None for a in result.answers)
    assert result.metrics()["judge_unparseable_share"] == result.unparseable / turns
    text = counting.tokenizer.decode(counting.prompts[0])
    assert "Student's response" in text and valid[0].task[:20] in text


def test_oracle_judge_compares_with_the_expert_action(episodes):
    from dataclasses import replace

    trajectories, _ = episodes
    t = trajectories[0]
    assert t.turns[0].expert_action  # the collector records the expert's next action per turn
    turns = [replace(t.turns[0], action=t.turns[0].expert_action, action_valid=True),
             replace(t.turns[1], action="look", action_valid=True, expert_action="go east")]
    labels = OracleJudge().judge([replace(t, turns=turns)]).labels
    assert labels == [["skip", "weak"]]
    assert isinstance(make_judge("oracle"), OracleJudge)
    with pytest.raises(ConfigError, match="Did you mean 'oracle'"):
        make_judge("oracel")


def test_judge_template_must_have_its_placeholders(backend, tmp_path):
    bad = tmp_path / "judge.txt"
    bad.write_text("Label the turn: {response}")
    with pytest.raises(ConfigError, match="lacks the placeholder"):
        LLMJudge(backend, bad)


def test_the_loop_scores_what_the_objective_declares(backend, episodes):
    """``agentkit.scoring``: teacher and judge built from the objective's capabilities; the step's
    scores are the teacher's own and the objective's batch carries them unchanged."""
    from agentkit.objectives import make_objective

    from agentkit.scoring import build_teacher_and_judge, score_step

    trajectories, bank = episodes
    sage = make_objective("sage_opd", {"judge": "oracle"})
    with pytest.raises(ConfigError, match="'sage_opd' distills from a separate teacher model"):
        build_teacher_and_judge(sage.requirements(), teacher_spec=None, policy=backend.model,
                                tokenizer=backend.tokenizer, objective="sage_opd")
    teacher, judge = build_teacher_and_judge(sage.requirements(), teacher_spec="self", policy=backend.model,
                                             tokenizer=backend.tokenizer, bank=bank, objective="sage_opd")
    assert isinstance(teacher, Teacher) and isinstance(judge, OracleJudge)
    scores = score_step(sage.requirements(), teacher, judge, trajectories)
    direct = teacher.score(build_batch(trajectories), trajectories)
    assert torch.equal(scores.teacher.logprobs, direct.logprobs) and scores.teacher.support_logprobs is None
    assert scores.judgments.labels == judge.judge(trajectories).labels
    batch = sage.prepare(trajectories, scores)
    assert torch.equal(batch.teacher_logprobs, direct.logprobs)
    # a full-vocabulary objective asks the teacher for its distribution; grpo asks for nothing
    opsd = make_objective("opsd_rkl", {"estimator": "full", "topk": 3}).requirements()
    teacher, judge = build_teacher_and_judge(opsd, teacher_spec=None, policy=backend.model,
                                             tokenizer=backend.tokenizer, bank=bank)
    assert teacher.name == "self" and judge is None
    assert score_step(opsd, teacher, None, trajectories).teacher.support_ids.shape[-1] == 3
    grpo = make_objective("grpo").requirements()
    assert build_teacher_and_judge(grpo, teacher_spec=None, policy=None, tokenizer=None) == (None, None)
    assert score_step(grpo, None, None, trajectories) is None


def test_a_teacher_plugin_is_checked_against_the_protocol(backend, monkeypatch):
    from agentkit.teachers import REGISTRY

    from agentkit.core.plugins import PluginSpec

    class NoScore:
        name, tokenizer = "half", None

    monkeypatch.setitem(REGISTRY._specs, "half", PluginSpec("half", lambda **_: NoScore(), distribution="half-dist"))
    with pytest.raises(PluginError, match=r"Teacher 'half' from 'half-dist' \(group 'agentkit.teachers'\) built "
                                          r"'NoScore', which lacks score, generation_backend"):
        make_teacher("half", policy=backend.model, tokenizer=backend.tokenizer)
    monkeypatch.setitem(REGISTRY._specs, "value", PluginSpec("value", 3, distribution="v"))
    with pytest.raises(PluginError, match="'value' from 'v'.*not callable"):
        make_teacher("value", policy=backend.model, tokenizer=backend.tokenizer)
