"""Build a generation backend from its settings: ``hf`` (transformers, CPU default), ``vllm`` (in-process
engine), ``openai`` (any OpenAI-compatible server; rollout-only: its weights are not ours to sync).

Every command builds its backend here (``rollout``, ``eval``, the training loop and the async
generator): ``make_backend`` over a model folder, or, for a kind that samples a loaded module, over
the trained module itself. What a kind is before one is built (does it sample a loaded module, is
its package installed) is its ``BackendKind`` in ``BACKENDS``: a new backend adds its module and one
entry here, and the loop reads the entry, never the kind's name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentkit.rollout.backend import GenerationBackend

from agentkit.core.errors import ConfigError
from agentkit.core.settings import BackendSettings


def _nothing_to_check() -> None:
    pass


@dataclass(frozen=True)
class BackendKind:
    """What a kind of backend is, known from its settings before one is built.

    Attributes:
        build: ``build(settings, model, seed=, tokenizer=, name=, device=, lora_rank=)`` -> the
            backend (``make_backend``'s arguments); it imports the backend's module when called.
        samples_module: it can sample with an already-loaded module, the trained one itself: a
            training run needs no engine of its own, nothing to sync, and the sampling logprobs are
            the trainer's numerics (transformers). False: it loads weights from a folder into an
            engine of its own (vLLM) or they live on a server.
        check_installed: raises ``MissingDependencyError`` naming the install command when the
            backend's package is missing (run before any environment, model or game work).
    """

    build: Callable[..., GenerationBackend]
    samples_module: bool
    check_installed: Callable[[], None] = _nothing_to_check


def _hf(settings, model, *, seed: int, tokenizer: Any, name: str | None, device: str | None, lora_rank: int):
    from agentkit.rollout.hf_backend import HFBackend

    return HFBackend(model, tokenizer, device=device or settings.device, seed=seed, name=name,
                     prefix_cache_mb=settings.prefix_cache_mb)


def _vllm(settings, model, *, seed: int, tokenizer: Any, name: str | None, device: str | None, lora_rank: int):
    from agentkit.rollout.vllm_backend import VLLMBackend

    return VLLMBackend(model, tokenizer, seed=seed, name=name, lora_rank=lora_rank, **settings.args)


def _openai(settings, model, *, seed: int, tokenizer: Any, name: str | None, device: str | None, lora_rank: int):
    from agentkit.rollout.openai_backend import OpenAIBackend

    backend = OpenAIBackend(settings.base_url, model if tokenizer is None else tokenizer, model=settings.served_model,
                            api=settings.api, api_key_env="OPENAI_API_KEY", concurrency=settings.concurrency,
                            timeout_s=settings.request_timeout, max_retries=settings.max_retries,
                            max_response_bytes=settings.max_response_bytes, name=name)
    if settings.api == "completions":
        backend.check_tokenizer()  # token-id prompts mean the same to the server
    return backend


def _check_vllm() -> None:
    from agentkit.rollout.vllm_backend import check_vllm

    check_vllm()


# keyed by the settings' ``kind`` (agentkit.core.settings: one settings class per kind)
BACKENDS: dict[str, BackendKind] = {
    "hf": BackendKind(_hf, samples_module=True),
    "vllm": BackendKind(_vllm, samples_module=False, check_installed=_check_vllm),
    "openai": BackendKind(_openai, samples_module=False),
}


def backend_kind(settings: BackendSettings) -> BackendKind:
    """The ``BackendKind`` of the backend ``settings`` describe."""
    return BACKENDS[settings.kind]


def make_backend(settings: BackendSettings, model: str | os.PathLike | Any, *, seed: int = 0, tokenizer: Any = None,
                 name: str | None = None, device: str | None = None, lora_rank: int = 0) -> GenerationBackend:
    """The backend ``settings`` describe.

    Args:
        settings: ``agentkit.core.settings``'s hf, vllm or openai settings, each with its own options.
        model: a model folder (for ``openai``: the folder holding the served model's tokenizer), or,
            for a kind that ``samples_module``, an already-loaded module it samples with as it is
            (training's own weights: pass ``tokenizer`` with it).
        seed: seeds the backend's sampler.
        tokenizer: the tokenizer to format prompts with (default: the folder's).
        name: the model's name in trajectories (default: the folder, or the module's own).
        device: where a loaded-module backend samples, over the settings' (a launcher's rank device).
        lora_rank: the rank of the LoRA adapter training will send (vLLM sizes its LoRA slots).
    """
    kind = backend_kind(settings)
    if not (kind.samples_module or isinstance(model, (str, os.PathLike))):
        raise ConfigError(f"backend {settings.kind} loads its weights from a model folder; it was given a loaded "
                          f"{type(model).__name__}. Pass the folder the module was loaded from.")
    return kind.build(settings, model, seed=seed, tokenizer=tokenizer, name=name, device=device, lora_rank=lora_rank)
