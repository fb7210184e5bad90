"""The transformers backend's prefix cache: a turn whose prompt starts with an earlier row's ids reads
only its new tokens, and gives the tokens and logprobs of a full prefill (fp32, within 1e-5)."""

from __future__ import annotations

import random

import pytest
import torch
from agentkit.envs import ActionParser, make
from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
from agentkit.rollout.hf_backend import CachedRow, HFBackend, PrefixCache, load_causal_lm, load_tokenizer

from agentkit.core.settings import ContextSettings

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def shared(tiny_model_dir):
    """One module, sampled by a backend with the cache and one without (both see every weight change)."""
    model, tokenizer = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    return (model, HFBackend(model, tokenizer, prefix_cache_mb=0), HFBackend(model, tokenizer, prefix_cache_mb=64))


def _play(off: HFBackend, on: HFBackend, *, turns: int = 16, rows: int = 6, change_weights=None) -> None:
    """``rows`` conversations of different lengths, each turn's prompt = the last prompt, its response
    and a new observation; row r stops after ``6 + 2r`` turns; ``change_weights()`` runs before turn 8."""
    rng = random.Random(0)
    vocab = off.tokenizer.vocab_size
    prompts = {r: [rng.randrange(vocab) for _ in range(5 + 7 * r)] for r in range(rows)}
    for turn in range(turns):
        if turn == 8 and change_weights is not None:
            change_weights()
        live = [r for r in range(rows) if turn < 6 + 2 * r]
        seeds = [1000 * r + turn for r in live]
        batch = [prompts[r] for r in live]
        plain, cached = off.generate(batch, PARAMS, seeds), on.generate(batch, PARAMS, seeds)
        for r, a, b in zip(live, plain, cached, strict=True):
            assert b.token_ids == a.token_ids, (turn, r)
            assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0), (turn, r)
            prompts[r] = prompts[r] + a.token_ids + [rng.randrange(vocab) for _ in range(rng.randrange(2, 9))]


def test_sixteen_turns_of_mixed_lengths_give_a_full_prefill_s_tokens_and_logprobs(shared):
    _, off, on = shared
    before_off, before_on = off.prefilled_tokens, on.prefilled_tokens
    _play(off, on)
    read_off, read_on = off.prefilled_tokens - before_off, on.prefilled_tokens - before_on
    assert on.prefix_caching and not off.prefix_caching
    assert read_on < read_off / 4, (read_on, read_off)  # the cache was used: most prompt tokens not read again


def test_an_in_place_update_of_the_shared_weights_mid_episode_drops_the_cache(shared):
    model, off, on = shared

    def step():  # an optimizer step on the module both backends sample with
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)

    _play(off, on, change_weights=step)


def test_sync_weights_mid_episode_drops_the_cache(tiny_model_dir):
    trained = load_causal_lm(tiny_model_dir)
    off = HFBackend(tiny_model_dir, prefix_cache_mb=0)
    on = HFBackend(tiny_model_dir, prefix_cache_mb=64)

    def sync():
        with torch.no_grad():
            for p in trained.parameters():
                p.mul_(1.1)
        off.sync_weights(trained)
        on.sync_weights(trained)

    _play(off, on, turns=12, rows=3, change_weights=sync)


def test_a_prompt_that_is_not_an_extension_is_prefilled_in_full(shared):
    _, off, on = shared
    prompt = list(range(3, 40))
    first = on.generate([prompt], PARAMS, [1])[0]
    read = on.prefilled_tokens
    rebuilt = prompt[5:] + first.token_ids  # a window that dropped the oldest tokens
    assert on.generate([rebuilt], PARAMS, [2])[0] == off.generate([rebuilt], PARAMS, [2])[0]
    assert on.prefilled_tokens - read == len(rebuilt)


def test_the_cache_keeps_the_newest_rows_within_its_budget_and_hands_each_over_once():
    def row(tokens):
        return CachedRow(tokens, [(torch.zeros(2, len(tokens), 4), torch.zeros(2, len(tokens), 4))])

    size = row([1, 2, 3]).nbytes
    cache = PrefixCache(budget_bytes=2 * size)
    for tokens in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        cache.put(row(tokens))
    assert cache.bytes == 2 * size and cache.take([1, 2, 3, 10]) is None  # the oldest went first
    assert cache.take([4, 5, 6, 10]).tokens == [4, 5, 6]
    assert cache.take([4, 5, 6, 10]) is None and cache.bytes == size  # handed over once
    assert cache.take([7, 8]) is None  # longer than the prompt
    cache.put(row([7, 8, 9, 1, 2]))
    assert cache.take([7, 8, 9, 1, 2, 3]).tokens == [7, 8, 9, 1, 2]  # the longest that starts the prompt


def test_collector_chat_episodes_are_the_same_with_the_cache_on_and_off(vaults_sft_model):
    """Real vaults episodes in chat mode, 16 turns at most, ending at different turns (a policy that
    often wins, in 2 turns or after mistakes)."""

    def episodes(prefix_cache_mb: int):
        backend = HFBackend(vaults_sft_model, seed=0, prefix_cache_mb=prefix_cache_mb)
        collector = Collector(backend, lambda: make("vaults/vaults-v0", max_turns=16, action_parser=ActionParser(),
                                                    families="amber", chambers=2, moves=16),
                              env_id="vaults/vaults-v0", context=ContextSettings(mode="chat"),
                              sampling=SamplingParams(temperature=0.7, max_new_tokens=16))
        found = []
        collector.run([EpisodeSpec(seed, s) for seed in range(3) for s in range(2)], found.append)
        collector.close()
        return sorted(found, key=lambda t: t.id), backend

    plain, off = episodes(0)
    cached, on = episodes(64)
    assert len({len(t.turns) for t in plain}) > 1, [len(t.turns) for t in plain]
    for a, b in zip(plain, cached, strict=True):
        assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
        for x, y in zip(a.turns, b.turns, strict=True):
            assert torch.allclose(torch.tensor(x.response_logprobs), torch.tensor(y.response_logprobs), atol=1e-5, rtol=0)
    assert on.prefilled_tokens < off.prefilled_tokens / 3, (on.prefilled_tokens, off.prefilled_tokens)
