"""The generation-backend protocol: token ids in, exact sampled ids and logprobs out.

Backends never re-tokenize: the collector hands over token ids and gets back the ids the model
sampled with the logprob of each under the distribution it was sampled from (after temperature
and top-p). At temperature 1 and top-p 1 that is the model's own logprob. Greedy decoding
(temperature 0) records the model's own logprob of the chosen token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentkit.rollout.context import encode_chat

from agentkit.core.settings import SamplingSettings, default
from agentkit.core.trajectory import is_logprob


@dataclass(frozen=True)
class SamplingParams:
    """How to sample.

    Attributes:
        temperature: 0 means greedy.
        top_p: nucleus sampling mass (1 = off).
        top_k: keep the k most likely tokens (0 = off).
        max_new_tokens: the most tokens one response may have.
        stop: strings that end a response (the token that completes one is kept). None: the
            environment's action format decides (the collector fills in ``env_info(id).action_format.stop``);
            a backend given None stops only at the end-of-turn token, as with ``()``.
        seed: seeds the backend's sampler.
    """

    temperature: float = default(SamplingSettings, "temperature")
    top_p: float = default(SamplingSettings, "top_p")
    top_k: int = default(SamplingSettings, "top_k")
    max_new_tokens: int = default(SamplingSettings, "max_new_tokens")
    stop: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {self.max_new_tokens}")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings a backend applies (none when ``stop`` is None)."""
        return tuple(s for s in self.stop or () if s)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stop"] = None if self.stop is None else list(self.stop)
        return d


@dataclass(frozen=True)
class Generation:
    """One sampled response.

    Attributes:
        token_ids: the sampled ids, stop token included when one ended the response.
        logprobs: per sampled id, its logprob under the sampling distribution.
        finish_reason: "stop" or "length".
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    extra: dict[str, Any] = field(default_factory=dict)


def generation_problem(generation: Generation, params: SamplingParams, vocab_size: int) -> str | None:
    """What makes ``generation`` unusable, or None: the rules a trajectory file holds its answers to
    (token ids the tokenizer has, one finite logprob <= 0 per id) and at most ``max_new_tokens`` ids.
    A server's answer that breaks them is malformed; a local model's (NaN weights) ends its episode."""
    ids, logprobs = generation.token_ids, generation.logprobs
    if len(ids) > params.max_new_tokens:
        return f"{len(ids)} tokens where at most max_new_tokens={params.max_new_tokens} were asked for"
    if len(logprobs) != len(ids):
        return f"{len(ids)} token ids but {len(logprobs)} logprobs"
    bad_id = next((i for i in ids if type(i) is not int or not 0 <= i < vocab_size), None)
    if bad_id is not None:
        return f"token id {bad_id!r} is outside the tokenizer's vocabulary (0..{vocab_size - 1})"
    bad_lp = next((x for x in logprobs if not isinstance(x, (int, float)) or not is_logprob(x)), None)
    if bad_lp is not None:
        return f"logprob {bad_lp!r} (a logprob is a finite number <= 0)"
    return None


@runtime_checkable
class GenerationBackend(Protocol):
    """Batched sampling over token ids.

    Attributes:
        tokenizer: a Hugging Face tokenizer with a chat template (shared with training).
        name: the model's name or path, recorded in trajectories.
        max_context: the most tokens prompt + response may hold.
        syncs_weights: the backend samples from its own copy of the weights: after each update the
            loop calls ``sync_weights(module)``, or the backend keeps sampling the old policy; one
            the loop trains with (vLLM's) is then a ``WeightSync`` too. False: it samples with the
            trained module itself (nothing to copy) or cannot take weights at all (a remote server).
        can_sleep: ``sleep()`` frees accelerator memory for the update and ``wake_up()`` gets it
            back (vLLM built with ``enable_sleep_mode``); False: both do nothing.
        prefix_caching: a prompt whose start the backend has already read (a multi-turn episode's
            earlier turns) is prefilled from where that start ends (vLLM's automatic prefix
            caching, on wherever the engine supports the model; the transformers backend's kept
            rows, ``hf_backend.PrefixCache``); False: every prompt is read from its first token,
            or (a remote server) the cache is not ours to know.
    """

    tokenizer: Any
    name: str
    max_context: int
    syncs_weights: bool
    can_sleep: bool
    prefix_caching: bool

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        """Sample one response per prompt, all prompts in one batch.

        ``seeds`` (one per prompt) make each row's sample depend only on its own seed, not on the
        rest of the batch, so rollouts reproduce however episodes were batched together.
        """
        ...

    def sync_weights(self, module: Any) -> None:
        """Sample from ``module``'s current parameters from now on (needed when ``syncs_weights``)."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory until ``wake_up()`` (a no-op unless ``can_sleep``)."""
        ...

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo ``sleep()`` (``tags``: only these parts, e.g. ["weights"]; a no-op unless ``can_sleep``)."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forget every prefix read so far (a no-op unless ``prefix_caching``): the next prompts are
        read from their first token (benchmarks comparing two runs on one backend)."""
        ...

    def close(self) -> None:
        """Release engines, connections and threads (a no-op when there are none); call once."""
        ...


class WeightSync(Protocol):
    """What the training loop calls to push an update into a backend that samples from its own copy
    of the weights (``syncs_weights``), and to check that it arrived. vLLM's backend is one.

    Attributes:
        lora_sync: how a trained LoRA adapter reaches the backend: "adapter" (``sync_adapter``: the
            adapter alone, the backend's base weights stay) or "merged" (base + adapter merged,
            through ``sync_weights``, for engines without LoRA).
    """

    lora_sync: str

    def sync_weights(self, module: Any) -> None:
        """Sample from ``module``'s current parameters (the whole weights) from now on."""
        ...

    def sync_adapter(self, module: Any) -> None:
        """Sample from the backend's base weights plus ``module``'s LoRA adapter (a peft model) from now on."""
        ...

    def sync_error(self, module: Any, ids: Sequence[int]) -> float:
        """The largest |served - module| logprob over the tokens of ``ids``: how far the backend's
        weights are from ``module``'s after a sync (~1e-6 in float32)."""
        ...


def row_seeds(prompts: Sequence[Sequence[int]], params: SamplingParams, seeds: Sequence[int] | None) -> list[int]:
    """One sampling seed per prompt: ``seeds`` when given (checked to match ``prompts``), else
    ``params.seed + row``. Backends that seed each row use it."""
    if seeds is not None:
        if len(seeds) != len(prompts):
            raise ValueError(f"generate(): {len(prompts)} prompts but {len(seeds)} seeds")
        return [int(s) for s in seeds]
    return [params.seed + row for row in range(len(prompts))]


def chat_completer(backend: GenerationBackend, max_new_tokens: int) -> Callable[[Sequence[str]], list[str]]:
    """``complete(messages) -> answers``: each text sent as one user message with the backend's chat
    template, answered greedily in one batch (a prompt longer than the context keeps its end).
    For callers below the rollout layer that need text from a model (skill extraction)."""
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    tokenizer = backend.tokenizer

    def complete(messages: Sequence[str]) -> list[str]:
        prompts = []
        for message in messages:
            ids = encode_chat(tokenizer, [{"role": "user", "content": message}], True)
            prompts.append(ids[-(backend.max_context - max_new_tokens):])
        generations = backend.generate(prompts, params, [0] * len(prompts))
        return [tokenizer.decode(g.token_ids, skip_special_tokens=True) for g in generations]

    return complete
