"""Generation backend and collector with a real tiny model and real TextWorld games."""

from __future__ import annotations

import math

import pytest
import torch
from agentkit.envs import ACTION_TAG, ActionFormat, ActionParser, make
from agentkit.rollout import ChatContext, Collector, EpisodeSpec, SamplingParams
from agentkit.rollout.context import ContextBuilder, encode_data, make_context
from agentkit.rollout.hf_backend import sample_logprobs

from agentkit.core.jsonl import TrajectoryWriter, read_trajectories
from agentkit.core.settings import ContextSettings


def teacher_forced_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) for i >= 1 under a plain full-sequence forward pass."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1).gather(1, x[0, 1:, None]).squeeze(1)


def test_batched_sampling_logprobs_equal_teacher_forcing(backend):
    tok = backend.tokenizer
    prompts = [encode_data(tok, "go north please"), encode_data(tok, "a much longer prompt about a fridge, a stove and a key")]
    gens = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, stop=()))
    for prompt, gen in zip(prompts, gens, strict=True):
        assert len(gen.token_ids) == len(gen.logprobs) == 16 and gen.finish_reason == "length"
        ref = teacher_forced_logprobs(backend.model, prompt + gen.token_ids)[len(prompt) - 1:]
        assert torch.allclose(ref, torch.tensor(gen.logprobs), atol=1e-4)


def test_greedy_is_deterministic_and_seeded_sampling_reproducible(backend):
    prompt = [encode_data(backend.tokenizer, "look around")]
    greedy = SamplingParams(temperature=0, max_new_tokens=8, stop=())
    assert backend.generate(prompt, greedy)[0].token_ids == backend.generate(prompt, greedy)[0].token_ids
    params = SamplingParams(temperature=1.0, max_new_tokens=8, stop=())
    backend.reseed(7)
    first = backend.generate(prompt * 3, params)
    backend.reseed(7)
    assert [g.token_ids for g in backend.generate(prompt * 3, params)] == [g.token_ids for g in first]


def test_top_p_and_temperature_logprobs_are_of_the_sampling_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.7, top_p=0.8)
    # the nucleus of softmax(logits / 0.7) at 0.8 mass keeps tokens 0 and 1
    scaled = torch.softmax(logits / 0.7, dim=-1)[0]
    kept = scaled[:2] / scaled[:2].sum()
    seen = set()
    for _ in range(200):
        token, logprob = sample_logprobs(logits, params, gen)
        seen.add(int(token))
        assert math.isclose(float(logprob), math.log(float(kept[int(token)])), rel_tol=1e-5)
    assert seen == {0, 1}


def test_per_row_sampler_draws_from_the_sampling_distribution():
    # per-row generators (seeded generation) invert each row's CDF at a uniform from its own stream
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]] * 4)
    params = SamplingParams(temperature=1.0, top_k=4)
    probs = torch.softmax(logits[0].masked_fill(torch.arange(5) == 4, float("-inf")), dim=-1)
    generators = [torch.Generator().manual_seed(100 + r) for r in range(4)]
    counts = torch.zeros(5)
    for _ in range(2500):
        tokens, logprobs = sample_logprobs(logits, params, generators)
        counts += torch.bincount(tokens, minlength=5)
        assert torch.allclose(logprobs, probs.log()[tokens])
    assert counts[4] == 0  # outside the top-k: never drawn
    freq = counts / counts.sum()  # 10,000 draws: standard error <= 0.005
    assert torch.allclose(freq, probs, atol=0.02), (freq, probs)
    # row r's draw depends only on its own generator
    alone = sample_logprobs(logits[:1], params, [torch.Generator().manual_seed(7)])[0]
    batched = sample_logprobs(logits, params, [torch.Generator().manual_seed(s) for s in (7, 1, 2, 3)])[0]
    assert int(alone[0]) == int(batched[0])


def test_stop_string_ends_response(backend):
    tok = backend.tokenizer
    prompt = [encode_data(tok, "hello")]
    free = backend.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, stop=()))[0]
    stop = tok.decode(free.token_ids[2:4])  # greedy will produce this text again at tokens 2-3
    assert stop.strip(), "pick a visible stop string"
    gen = backend.generate(prompt, SamplingParams(temperature=0, max_new_tokens=8, stop=(stop,)))[0]
    assert gen.finish_reason == "stop"
    assert stop in tok.decode(gen.token_ids) and len(gen.token_ids) <= 4
    assert gen.token_ids == free.token_ids[: len(gen.token_ids)]


def test_chat_context_is_token_exact_across_turns(backend):
    tok = backend.tokenizer
    ctx = ChatContext(tok)
    first = ctx.first("obs one")
    response = encode_data(tok, "<action>look</action>")  # no end-of-turn token sampled
    second = ctx.next(response, "obs two")
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": ctx.system_prompt}, {"role": "user", "content": "obs one"},
         {"role": "assistant", "content": "<action>look</action>"}, {"role": "user", "content": "obs two"}],
        tokenize=False, add_generation_prompt=True)
    assert tok.decode(first + response + second) == rendered
    # when the model sampled the end-of-turn token itself it is not added twice
    with_eos = response + [tok.eos_token_id]
    assert tok.decode(first + with_eos + ctx.next(with_eos, "obs two")) == rendered


@pytest.mark.parametrize("context", ["chat", "window"])
def test_collector_multi_turn_trajectories_rebuild_exactly(backend, tmp_path, context):
    pytest.importorskip("textworld")
    parser = ActionParser()
    collector = Collector(
        backend, lambda: make("textworld/coin-v0", max_turns=4, action_parser=parser, level=2),
        env_id="textworld/coin-v0", sampling=SamplingParams(temperature=1.0, max_new_tokens=12), context=ContextSettings(mode=context),
    )
    backend.reseed(1)
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        stats = collector.run([EpisodeSpec(seed, s) for seed in range(2) for s in range(2)], writer.write)
    collector.close()
    trajectories = read_trajectories(path)
    assert stats.episodes == 4 and len(trajectories) == 4
    assert {t.group for t in trajectories} == {"textworld/coin-v0|train|0", "textworld/coin-v0|train|1"}
    for traj in trajectories:
        assert traj.context_mode == context and len(traj.turns) == 4 and traj.truncated
        if context == "chat":
            ids, positions, logprobs = [], [], []
            for turn in traj.turns:
                ids += turn.context_ids
                positions += range(len(ids), len(ids) + len(turn.response_ids))
                ids += turn.response_ids
                logprobs += turn.response_logprobs
            ref = teacher_forced_logprobs(backend.model, ids)[[p - 1 for p in positions]]
            assert torch.allclose(ref, torch.tensor(logprobs), atol=1e-4)
        else:
            for turn in traj.turns:
                ref = teacher_forced_logprobs(backend.model, turn.context_ids + turn.response_ids)
                assert torch.allclose(ref[len(turn.context_ids) - 1:], torch.tensor(turn.response_logprobs), atol=1e-4)
            assert "Recent history" in backend.tokenizer.decode(traj.turns[2].context_ids)
        for turn in traj.turns:
            assert turn.response_text == backend.tokenizer.decode(turn.response_ids, skip_special_tokens=True)


class _ExplodingEnv:
    """Injects a fault no real environment produces on demand: step() raises on the 2nd call."""

    def __init__(self):
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        self.calls = 0
        return "a room", {"task": "t", "admissible_actions": None, "action_valid": True, "won": False,
                          "score": 0.0, "privileged": None}

    def step(self, action):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("simulator crashed")
        return "still a room", 0.0, False, False, {"task": "t", "admissible_actions": None, "action_valid": True,
                                                    "won": False, "score": 0.0, "privileged": None}

    def close(self):
        pass


def test_env_error_ends_episode_and_run_continues(backend):
    from agentkit.envs.wrappers import TurnLimit

    collector = Collector(backend, lambda: TurnLimit(_ExplodingEnv(), 5), env_id="exploding",
                          sampling=SamplingParams(max_new_tokens=4), action_format=ACTION_TAG)
    written = []
    stats = collector.run([EpisodeSpec(0), EpisodeSpec(1)], written.append)
    assert stats.episodes == 2 and stats.errors == 2
    for traj in written:
        assert traj.truncated and "simulator crashed" in traj.error and len(traj.turns) == 2
        assert traj.turns[-1].error and not traj.turns[-1].action_valid


def test_context_builders_share_one_protocol(backend):
    tok = backend.tokenizer
    chat, window = make_context("chat", tok, "Answer.", 2), make_context("window", tok, "Answer.", 2)
    assert isinstance(chat, ContextBuilder) and isinstance(window, ContextBuilder)
    assert (chat.mode, window.mode) == ("chat", "window")
    with pytest.raises(ValueError, match=r"context mode must be one of \['chat', 'window'\], got 'memory'"):
        make_context("memory", tok)
    # chat: the prompt grows by exactly the response and the next turn's new ids
    state = chat.start("find the key", prefix="Skill: look first.")
    first = chat.next_turn(state, "obs one")
    assert state.prompt == first and "Skill: look first.\n\nobs one" in tok.decode(first)
    response = encode_data(tok, "<action>look</action>")
    chat.end_turn(state, "obs one", "look", response)
    second = chat.next_turn(state, "obs two")
    assert state.prompt == first + response + second and "Skill" not in tok.decode(second)
    # window: each prompt stands alone, with the prefix and the last turns
    state = window.start("find the key", prefix="Skill: look first.")
    window.next_turn(state, "obs one")
    window.end_turn(state, "obs one", "look", response)
    prompt = tok.decode(window.next_turn(state, "obs two"))
    assert "Skill: look first." in prompt and "Action: look" in prompt and state.turns == 1


class _EchoEnv:
    """One-turn task whose step records what it was given (after the wrappers)."""

    def reset(self, *, seed=None, options=None):
        return "Pick a colour.", {"task": "pick", "admissible_actions": None, "action_valid": True, "won": False,
                                  "score": 0.0, "privileged": None}

    def step(self, action):
        return "ok", 0.0, True, False, {"task": "pick", "admissible_actions": None, "action_valid": True,
                                        "won": False, "score": 0.0, "privileged": None, "action": action}

    def close(self):
        pass


def test_collector_takes_prompt_and_stop_strings_from_the_action_format(backend):
    fmt = ActionFormat("Answer with a colour in double brackets, like [[red]].", stop=("]]", "\n\n"))
    seen = []

    class Recording:
        tokenizer, name, max_context = backend.tokenizer, backend.name, backend.max_context

        def generate(self, prompts, params, seeds=None):
            seen.append(params)
            return backend.generate(prompts, params, seeds)

    written = []
    Collector(Recording(), _EchoEnv, env_id="echo", action_format=fmt,
              sampling=SamplingParams(max_new_tokens=4)).run([EpisodeSpec(0)], written.append)
    assert seen[0].stop == ("]]", "\n\n") and written[0].sampling["stop"] == ["]]", "\n\n"]
    assert fmt.instruction in backend.tokenizer.decode(written[0].turns[0].context_ids)
    # explicit stop strings and system prompt win over the format's
    Collector(Recording(), _EchoEnv, env_id="echo", action_format=fmt, context=ContextSettings(system_prompt="Be brief."),
              sampling=SamplingParams(max_new_tokens=4, stop=())).run([EpisodeSpec(0)], written.append)
    assert seen[1].stop == () and "Be brief." in backend.tokenizer.decode(written[1].turns[0].context_ids)
