"""Build a generation backend by name: ``hf`` (transformers, CPU default), ``vllm`` (in-process
engine), ``openai`` (any OpenAI-compatible server; rollout-only: its weights are not ours to sync)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from agentkit.core.errors import ConfigError

BackendName = Literal["hf", "vllm", "openai"]
BACKENDS = ("hf", "vllm", "openai")


def make_backend(name: str, model_dir: Path, *, seed: int = 0, device: str = "cpu", base_url: str | None = None,
                 served_model: str | None = None, api: str = "completions", api_key_env: str = "OPENAI_API_KEY",
                 vllm_args: dict[str, Any] | None = None, concurrency: int = 16, request_timeout: float = 120.0,
                 max_retries: int = 4, max_response_bytes: int | None = None):
    """The backend ``name`` over the model folder ``model_dir`` (for ``openai``: the folder holding
    the served model's tokenizer)."""
    if name == "hf":
        from agentkit.rollout.hf_backend import HFBackend

        return HFBackend(model_dir, device=device, seed=seed)
    if name == "vllm":
        from agentkit.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, seed=seed, **(vllm_args or {}))
    if name == "openai":
        if not base_url:
            raise ConfigError("backend=openai needs the server: --base-url http://HOST:PORT/v1")
        from agentkit.rollout.openai_backend import OpenAIBackend

        limits = {} if max_response_bytes is None else {"max_response_bytes": max_response_bytes}
        backend = OpenAIBackend(base_url, model_dir, model=served_model, api=api, api_key_env=api_key_env,
                                concurrency=concurrency, timeout_s=request_timeout, max_retries=max_retries, **limits)
        if api == "completions":
            backend.check_tokenizer()  # token-id prompts mean the same to the server
        return backend
    from agentkit.core.errors import did_you_mean

    raise ConfigError(f"Unknown backend {name!r}.{did_you_mean(name, BACKENDS)} Choose one of {list(BACKENDS)}.")
