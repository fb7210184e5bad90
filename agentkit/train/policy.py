"""The trained policy and the backend that samples it, for the training loop and the async
generator alike (``agentkit.train`` and ``agentkit.train.async_rollout`` import this; it imports neither).

``load_policy`` loads the trained weights (fp32, or a LoRA adapter over a frozen base);
``policy_backend`` is the one way both processes build the backend that samples them: the module
itself where the configured kind samples a loaded module, else an engine of its own (``engine_model``
is the folder it loads) that ``engine_sync`` sends every update to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentkit.core.model_files import adapter_base
from agentkit.rollout.backend import GenerationBackend, WeightSync
from agentkit.rollout.backends import BackendSettings, backend_kind, make_backend
from agentkit.rollout.hf_backend import PRECISIONS, load_causal_lm, mixed_precision
from agentkit.train.config import TrainSection
from agentkit.train.lora import MergedWeights, add_adapter, resume_adapter


def load_policy(path: Path, train: TrainSection, *, resumed: bool = False, device: torch.device | str = "cpu"):
    """The trained policy from ``path``: fp32 weights, or with ``train.lora`` a frozen base (bf16
    under ``train.precision`` bf16) with a new LoRA adapter in fp32, or, ``resumed`` from a LoRA
    run's checkpoint, the adapter saved there. Then ``train.precision``'s autocast and, if set,
    gradient checkpointing (active in training mode only; sampling keeps its KV cache). On ``device``,
    before an optimizer holds its parameters."""
    base_dtype = PRECISIONS[train.precision] if train.lora.rank else torch.float32
    if resumed and (base := adapter_base(path)) is not None:
        policy = resume_adapter(path, load_causal_lm(base, dtype=base_dtype))
    else:  # a folder holding an adapter loads merged: a new adapter then trains on top of it
        policy = load_causal_lm(path, dtype=base_dtype)
        if train.lora.rank:
            policy = add_adapter(policy, train.lora, path)
    policy = mixed_precision(policy.to(device), train.precision)
    if train.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return policy


def engine_model(start: Path, train: TrainSection, *, resumed: bool) -> Path:
    """The folder an engine of its own loads: ``start``, but for a resumed LoRA run the adapter's base
    (the adapter itself then reaches the engine through ``engine_sync``)."""
    base = adapter_base(start) if train.lora.rank and resumed else None
    return base or start


def engine_sync(backend: WeightSync, module, train: TrainSection):
    """Send ``module``'s current weights to a backend with its own copy of them; what it now serves,
    for ``sync_error``. A LoRA policy's adapter goes as itself (``lora_sync: adapter``, vLLM's
    default), or merged into the backend's weights (``merged``)."""
    if not train.lora.rank:
        backend.sync_weights(module)
        return module
    if backend.lora_sync == "adapter":
        backend.sync_adapter(module)
        return module
    merged = MergedWeights(module)
    backend.sync_weights(merged)
    return merged


def samples_policy_itself(settings: BackendSettings) -> bool:
    """Whether a backend of these settings samples with the trained module itself (no engine of its
    own: nothing to sync, and its logprobs are the trainer's numerics)."""
    return backend_kind(settings).samples_module


def policy_backend(settings: BackendSettings, *, module: Any, folder: Path, train: TrainSection, resumed: bool,
                   tokenizer: Any, seed: int, name: str, device: str | None = None) -> GenerationBackend:
    """The backend that samples the policy ``module`` (loaded from ``folder``): ``module`` itself where
    the kind samples a loaded module (on ``device``), else an engine of its own loaded from
    ``engine_model(folder)``, with LoRA slots for ``train.lora``, that the caller syncs
    (``engine_sync``) before it samples ``module``'s weights."""
    if samples_policy_itself(settings):
        return make_backend(settings, module, tokenizer=tokenizer, seed=seed, name=name, device=device)
    return make_backend(settings, engine_model(folder, train, resumed=resumed), tokenizer=tokenizer, seed=seed,
                        name=name, lora_rank=train.lora.rank)
