"""Build a generation backend from its settings: ``hf`` (transformers, CPU default), ``vllm`` (in-process
engine), ``openai`` (any OpenAI-compatible server; rollout-only: its weights are not ours to sync)."""

from __future__ import annotations

from pathlib import Path

from agentkit.core.settings import BackendSettings, HFBackendSettings, VLLMBackendSettings


def make_backend(settings: BackendSettings, model_dir: Path, *, seed: int = 0):
    """The backend ``settings`` describe (``agentkit.core.settings``: hf, vllm or openai, each with
    its own options) over the model folder ``model_dir`` (for ``openai``: the folder holding the
    served model's tokenizer)."""
    if isinstance(settings, HFBackendSettings):
        from agentkit.rollout.hf_backend import HFBackend

        return HFBackend(model_dir, device=settings.device, seed=seed, prefix_cache_mb=settings.prefix_cache_mb)
    if isinstance(settings, VLLMBackendSettings):
        from agentkit.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, seed=seed, **settings.args)
    from agentkit.rollout.openai_backend import OpenAIBackend

    backend = OpenAIBackend(settings.base_url, model_dir, model=settings.served_model, api=settings.api,
                            api_key_env="OPENAI_API_KEY", concurrency=settings.concurrency,
                            timeout_s=settings.request_timeout, max_retries=settings.max_retries,
                            max_response_bytes=settings.max_response_bytes)
    if settings.api == "completions":
        backend.check_tokenizer()  # token-id prompts mean the same to the server
    return backend
