"""Teachers score the student's exact tokens (with and without privileged context), refuse a
foreign tokenizer, and the turn judges label turns as SAGE-OPD needs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from agentkit.objectives import build_batch, policy_logprobs
from agentkit.skillbank import SkillBank, resolve_bank
from agentkit.teachers import LLMJudge, OracleJudge, Teacher, make_judge, make_teacher, parse_label
from agentkit.teachers.context import prefix_ids, privileged_text

from agentkit.core.errors import ConfigError, ModelError, PluginError, UnknownNameError
from agentkit.core.settings import ContextSettings

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
    # each row at its own sampling temperature (rows of one step can come from different samplers)
    hot = replace(batch, temperature=torch.linspace(0.6, 1.4, batch.num_rows))
    with torch.no_grad():
        expected = policy_logprobs(backend.model, hot) * hot.response_mask
    assert torch.allclose(teacher.score(hot, trajectories, topk=4).logprobs, expected, atol=1e-5)
    assert not torch.allclose(expected[mask], batch.old_logprobs[mask], atol=1e-2)


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
    """``agentkit.train.scoring``: teacher and judge built from the objective's capabilities; the step's
    scores are the teacher's own and the objective's batch carries them unchanged."""
    from agentkit.objectives import make_objective

    from agentkit.train.scoring import build_teacher_and_judge, score_step

    trajectories, bank = episodes
    sage = make_objective("sage_opd", {"judge": "oracle", "estimator": "sampled"})  # the teacher's tokens only
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
                                          r"'NoScore', which lacks full_vocabulary, score, generation_backend"):
        make_teacher("half", policy=backend.model, tokenizer=backend.tokenizer)
    monkeypatch.setitem(REGISTRY._specs, "value", PluginSpec("value", 3, distribution="v"))
    with pytest.raises(PluginError, match="'value' from 'v'.*not callable"):
        make_teacher("value", policy=backend.model, tokenizer=backend.tokenizer)


def test_a_teacher_with_only_its_top_k_is_refused_at_setup_where_the_objective_needs_the_whole_vocabulary(
        backend, monkeypatch):
    from agentkit.objectives import Capabilities
    from agentkit.teachers import REGISTRY
    from agentkit.teachers.remote import PromptLogprobTeacher

    from agentkit.core.plugins import PluginSpec
    from agentkit.train.scoring import build_teacher_and_judge

    def served(**_):  # what a server teacher is (openai:URL, vllm:DIR), without a server to ask
        return PromptLogprobTeacher(None, backend.tokenizer, name="served")

    monkeypatch.setitem(REGISTRY._specs, "served", PluginSpec("served", served, distribution="test"))
    setup = dict(teacher_spec="served", policy=backend.model, tokenizer=backend.tokenizer, bank=None, objective="opd")
    with pytest.raises(ConfigError, match=r"needs the teacher's whole distribution.*teacher served gives its top k "
                                          r"only.*objective.args.topk"):
        build_teacher_and_judge(Capabilities(needs_teacher=True, needs_support=True, topk=0), **setup)
    teacher, _ = build_teacher_and_judge(Capabilities(needs_teacher=True, needs_support=True, topk=5), **setup)
    assert not teacher.full_vocabulary
    local, _ = build_teacher_and_judge(Capabilities(needs_teacher=True, needs_support=True, topk=0),
                                       **{**setup, "teacher_spec": "self"})
    assert local.full_vocabulary


# -- privileged text per turn: the expert's plan from the state the student is in ---------------
# Coin Collector level 103, seed 0: the route starts "go west"; "go south" leaves it (into a distractor room).
DEVIATION = ["look", "go south", "go north", "go west"]  # the plan per turn: reset's, reset's, replanned, reset's


class ScriptedBackend:
    """Answers each turn with the next scripted action (the tiny model's samples never leave the
    route on purpose); tokenizer and limits are the real backend's."""

    def __init__(self, inner, actions):
        from agentkit.envs.registry import env_info

        self.tokenizer, self.name, self.max_context = inner.tokenizer, "scripted", inner.max_context
        self.actions, self.render = list(actions), env_info("textworld/coin-v0").action_format.render

    def generate(self, prompts, params, seeds=None):
        from agentkit.rollout.backend import Generation
        from agentkit.rollout.context import encode_data

        out = []
        for _ in prompts:
            ids = encode_data(self.tokenizer, self.render(self.actions.pop(0)))
            out.append(Generation(ids, [-0.5] * len(ids), "stop"))
        return out


@pytest.fixture(scope="module")
def deviating(backend):
    """The DEVIATION episode, recorded by the collector in each context mode."""
    from agentkit.rollout import Collector, EpisodeSpec
    from agentkit.rollout.run import env_factory

    out = {}
    for context in ("chat", "window"):
        collector = Collector(ScriptedBackend(backend, DEVIATION), env_factory(
            "textworld/coin-v0", split="train", max_turns=len(DEVIATION), env_kwargs={"level": 103}),
            env_id="textworld/coin-v0", context=ContextSettings(mode=context))
        collector.run([EpisodeSpec(0, 0)], lambda t, context=context: out.__setitem__(context, t))
        assert [t.action for t in out[context].turns] == DEVIATION
    return out


def test_each_turn_records_the_expert_plan_from_its_own_state(deviating):
    from agentkit.envs import make

    episode = deviating["chat"]
    plans = [turn.privileged for turn in episode.turns]
    assert plans[0] == episode.privileged == "Expert plan from here: go west > go north > take coin"
    assert plans[1] == plans[3] == episode.privileged  # "look" moves nowhere; "go north" is back at the start
    assert plans[2] != episode.privileged and plans[2].startswith("Expert plan from here: go north > go west")
    env = make("textworld/coin-v0", level=103)  # the same game, replayed: the plan from after "go south"
    try:
        env.reset(seed=0)
        env.step("look")
        assert env.step("go south")[-1]["privileged"] == plans[2]
    finally:
        env.close()
    assert [turn.privileged for turn in deviating["window"].turns] == plans


def _turn_by_turn(model, tokenizer, trajectory, env_texts):
    """The reference: per turn, one forward pass over the block of ``env_texts[t]`` and the student's
    ids through turn t's response; the log-probs of turn t's response tokens."""
    out = []
    for t, turn in enumerate(trajectory.turns):
        earlier = trajectory.turns[:t] if trajectory.one_sequence else []
        ids = [i for u in earlier for i in u.context_ids + u.response_ids] + turn.context_ids + turn.response_ids
        seq = prefix_ids(tokenizer, f"[Privileged Environment Information]\n{env_texts[t]}") + ids
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)  # [S, V]
        n = len(turn.response_ids)
        out.append(logp[torch.arange(len(seq) - n - 1, len(seq) - 1), torch.tensor(seq[len(seq) - n:])])  # [n]
    return out


class SequenceLog:
    """The lengths of the sequences a model runs (a forward pre-hook)."""

    def __init__(self, model):
        self.lengths: list[int] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        self.lengths += kwargs["attention_mask"].sum(dim=1).tolist()

    def close(self):
        self.handle.remove()


class HFPromptLogprobs:
    """``prompt_logprobs`` as vLLM answers them, from the tiny model: the remote teacher on a CPU."""

    def __init__(self, model):
        self.model = model

    def prompt_logprobs(self, sequences, topk=1):
        out = []
        for seq in sequences:
            with torch.no_grad():
                logp = torch.log_softmax(self.model(input_ids=torch.tensor([seq])).logits[0].float(), -1)  # [S, V]
            rows = [None]
            for j in range(1, len(seq)):
                dist, top = logp[j - 1], logp[j - 1].topk(topk)
                ranked = enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True), 1)
                entry = {i: (v, rank) for rank, (v, i) in ranked}
                entry.setdefault(seq[j], (float(dist[seq[j]]), int((dist > dist[seq[j]]).sum()) + 1))
                rows.append(entry)
            out.append(rows)
        return out


@pytest.mark.parametrize("context", ["chat", "window"])
def test_the_teacher_scores_each_turn_behind_its_own_plan(backend, deviating, context):
    """Token for token what scoring each turn on its own, behind its own block, gives; in chat mode
    turns that share a block share one pass."""
    from agentkit.teachers.model import ModelTeacher
    from agentkit.teachers.remote import PromptLogprobTeacher

    episode = deviating[context]
    model, tokenizer = backend.model, backend.tokenizer
    batch = build_batch([episode])
    teacher = ModelTeacher(model, tokenizer, name="self", privileged=("env",))
    log = SequenceLog(model)
    try:
        scores = teacher.score(batch, [episode])
    finally:
        log.close()
    mask = batch.response_mask.bool()
    per_turn = [scores.logprobs[mask & (batch.turn_index == t)] for t in range(len(episode.turns))]
    expected = _turn_by_turn(model, tokenizer, episode, [turn.privileged for turn in episode.turns])
    for got, want in zip(per_turn, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-5)
    # the reset's plan (what the teacher saw before) is wrong where the student left the route
    at_reset = _turn_by_turn(model, tokenizer, episode, [episode.privileged] * len(episode.turns))
    assert torch.allclose(per_turn[1], at_reset[1], atol=1e-5)
    assert not torch.allclose(per_turn[2], at_reset[2], atol=1e-4)
    blocks = [len(prefix_ids(tokenizer, privileged_text(episode, ["env"], None, turn=t))) for t in range(4)]
    through = [sum(len(u.context_ids) + len(u.response_ids) for u in episode.turns[: t + 1]) for t in range(4)]
    if context == "chat":  # turns 0-1 share the reset's block (cut after turn 1's response), 2 and 3 each have theirs
        assert sorted(log.lengths) == sorted([blocks[1] + through[1], blocks[2] + through[2], blocks[3] + through[3]])
    else:  # one pass per turn, as always
        assert sorted(log.lengths) == sorted(b + len(u.context_ids) + len(u.response_ids)
                                             for b, u in zip(blocks, episode.turns, strict=True))
    # the prompt_logprobs teacher (vLLM, OpenAI-compatible servers) cuts the same sequences
    served = PromptLogprobTeacher(HFPromptLogprobs(model), tokenizer, name="served", privileged=("env",)).score(
        batch, [episode], topk=2)
    assert torch.allclose(served.logprobs[mask], scores.logprobs[mask], atol=1e-5)
    assert torch.allclose(served.top1[mask], scores.top1[mask], atol=1e-5)


def test_a_block_that_never_changes_is_one_pass_per_row(backend, deviating, episodes):
    """Skills only (the self-teacher's default), or a file without per-turn plans: the episode's one
    block in front of the whole row, one pass, as before per-turn plans."""
    from dataclasses import replace

    from agentkit.teachers.model import ModelTeacher

    trajectories, bank = episodes
    model, tokenizer = backend.model, backend.tokenizer
    old_file = replace(deviating["chat"], skills=trajectories[0].skills,
                       turns=[replace(turn, privileged=None) for turn in deviating["chat"].turns])
    cases = [(["skills"], [deviating["chat"], *trajectories]), (["skills", "env"], [old_file])]
    for sources, episodes_ in cases:
        batch = build_batch(episodes_)
        log = SequenceLog(model)
        try:
            scores = ModelTeacher(model, tokenizer, name="self", privileged=sources, bank=bank).score(batch, episodes_)
        finally:
            log.close()
        blocks = [prefix_ids(tokenizer, privileged_text(e, sources, bank)) for e in episodes_]
        lengths = batch.attention_mask.sum(dim=1).tolist()
        episode_of = batch.episode_index.tolist()
        assert sorted(log.lengths) == sorted(len(blocks[e]) + n for e, n in zip(episode_of, lengths, strict=True))
        for r, e in enumerate(episode_of):
            ids = blocks[e] + batch.input_ids[r, : lengths[r]].tolist()
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)  # [S, V]
            want = logp[len(blocks[e]):-1].gather(1, batch.input_ids[r, 1: lengths[r]][:, None]).squeeze(1)
            row_mask = batch.response_mask[r, : lengths[r] - 1].bool()
            assert torch.allclose(scores.logprobs[r, : lengths[r] - 1][row_mask], want[row_mask], atol=1e-5)


def test_teachers_score_at_the_sampling_temperature(backend):
    # episodes sampled at T = 0.7: the self-teacher without a block reproduces their recorded logprobs
    from dataclasses import replace

    from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
    from agentkit.rollout.run import env_factory
    from agentkit.teachers.remote import PromptLogprobTeacher

    out = []
    collector = Collector(backend, env_factory("textworld/coin-v0", split="train", max_turns=2, env_kwargs={"level": 1}),
                          env_id="textworld/coin-v0", sampling=SamplingParams(temperature=0.7, max_new_tokens=6, seed=2))
    collector.run([EpisodeSpec(0, 0), EpisodeSpec(1, 0)], out.append)
    batch = build_batch(out)
    mask = batch.response_mask.bool()
    teacher = make_teacher("self", policy=backend.model, tokenizer=backend.tokenizer, privileged=[])
    scores = teacher.score(batch, out)
    assert torch.allclose(scores.logprobs[mask], batch.old_logprobs[mask], atol=1e-4)
    at_one = teacher.score(replace(batch, temperature=None), out)  # the plain softmax: other numbers
    assert not torch.allclose(at_one.logprobs[mask], batch.old_logprobs[mask], atol=1e-2)
    # a server's prompt logprobs are at temperature 1: refused for episodes sampled otherwise
    remote = PromptLogprobTeacher(None, backend.tokenizer, name="openai:http://127.0.0.1:1/v1")
    with pytest.raises(ConfigError, match=r"prompt_logprobs, which are at temperature 1.*--temperature 1"):
        remote.score(batch, out, topk=1)
