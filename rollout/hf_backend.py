"""A transformers backend for CPUs (and small GPUs): batched sampling with a KV cache.

Our own decoding loop rather than ``model.generate``: it returns the logprob of each sampled token
under the exact distribution it was drawn from (temperature, top-k and top-p applied), which
``generate`` does not expose, and it stops each row on its own stop tokens or strings.

Prefix cache: after each ``generate`` the keys and values of every row (its prompt and response)
are kept (``PrefixCache``); a later prompt that starts with a kept row's ids (the next turn of a
chat-mode episode: the conversation so far, then the new observation) reads only its new tokens.
The kept rows are dropped when the weights they were computed with change (checked on every call,
so an in-place optimizer step on a shared module counts), and the oldest go first when they
outgrow the memory budget. Reusing one only saves time: tokens and logprobs are those of a full
prefill up to float rounding (``tests/test_prefix_cache.py``).
"""

from __future__ import annotations

import os
import types
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from agentkit.rollout.backend import Generation, SamplingParams, row_seeds
from safetensors import SafetensorError

from agentkit.core import runs
from agentkit.core.errors import ModelError
from agentkit.core.model_files import adapter_base, is_model_folder


def _local_folder(path: str | Path) -> Path:
    """``path`` as an existing local folder, else a ModelError naming it and the fix.

    Loading is local only (``local_files_only``): a mistyped path fails here at once instead of
    being tried as a hub id (which, offline, waits for the network to time out). Hub ids and run
    folders are turned into folders before this (``agentkit.models.resolve_model_dir``).
    """
    folder = Path(path)
    if not folder.exists():
        raise ModelError(f"Model folder {path} does not exist. Check the path, or build a model there with: "
                         f"agentkit model init --out {path}")
    if not folder.is_dir():
        raise ModelError(f"{path} is a file, not a model folder (a folder with config.json and the tokenizer).")
    if not is_model_folder(folder) and runs.is_run_folder(folder):
        raise ModelError(f"{path} is a training run folder, not a model folder: pass one of its checkpoints "
                         f"({path}/checkpoints/step-N), or give the run folder to --model, which uses its newest.")
    return folder


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    folder = _local_folder(path)
    if not (folder / "tokenizer_config.json").exists() and not (folder / "tokenizer.json").exists():
        raise ModelError(f"{path} has no tokenizer (tokenizer.json, tokenizer_config.json). Build a model folder with: "
                         "agentkit model init --out DIR")
    if (folder / "tokenizer.json").exists() and not (folder / "tokenizer_config.json").exists():
        # without it the tokenizer loads, but with the wrong end-of-sequence and padding tokens
        raise ModelError(f"The tokenizer in {path} has no tokenizer_config.json (it names the special tokens); "
                         "copy it back from where the model came from.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelError(f"Could not load a tokenizer from {path}: {err}") from err
    if not getattr(tokenizer, "chat_template", None):
        raise ModelError(f"The tokenizer in {path} has no chat template; agentkit formats every prompt with one.")
    return tokenizer


def load_causal_lm(path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    folder = _local_folder(path)
    if (base := adapter_base(folder)) is not None:
        return _merged_adapter(folder, load_causal_lm(base, dtype=dtype, device=device))
    if not (folder / "config.json").exists():
        raise ModelError(
            f"{path} is not a model folder (no config.json). Build one with: agentkit model init --out {path}"
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, use_safetensors=True,  # never a pickle
                                                     local_files_only=True)
    except (OSError, ValueError, SafetensorError) as err:  # SafetensorError: a truncated or corrupt weights file
        raise ModelError(f"Could not load the model in {path}: {err}") from err
    return model.to(device).eval()


def _merged_adapter(folder: Path, base):
    """``base`` with the LoRA adapter in ``folder`` merged into its weights: a plain module that
    samples as fast as the base (``agentkit eval``/``rollout`` of a LoRA run, a teacher, a new run's
    start). Training resumes the adapter itself (``agentkit.train.lora``)."""
    try:
        from peft import PeftModel
    except ImportError as err:
        raise ModelError(f"{folder} holds a LoRA adapter; loading it needs peft: pip install 'agentkit[lora]'.") from err
    try:
        merged = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as err:
        raise ModelError(f"Could not load the LoRA adapter in {folder} onto its base model: {err}") from err
    merged.config._name_or_path = str(folder)  # what this module is: an adapter added onto it names this folder
    merged.name_or_path = str(folder)
    return merged.eval()


PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mixed_precision(model, precision: str):
    """``model`` (fp32 weights) with its forward under bf16 autocast when ``precision`` is "bf16"
    (mixed precision: the weights, their gradients and the optimizer state stay fp32; matrix
    products run in bf16, reductions and softmaxes in fp32); as it is for "fp32". The forward is
    replaced on the instance (a method bound to it, so a deep copy binds to the copy), and DDP,
    FSDP2, gradient checkpointing and the transformers backend all go through it; its logits come
    out bf16 and every reader casts them with ``.float()``."""
    if PRECISIONS[precision] != torch.float32:
        model.forward = types.MethodType(_forward_in_bf16, model)
    return model


def _forward_in_bf16(self, *args, **kwargs):
    device_type = next(self.parameters()).device.type  # where the module is now (prepare may move it)
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
        return type(self).forward(self, *args, **kwargs)


def sample_logprobs(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | list[torch.Generator],
                    uniform: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (token ids [B], their logprobs under the sampling distribution [B]).

    With one generator per row, each row is sampled by inverting its CDF at one uniform number from
    its own generator, so a row's sample does not depend on the other rows of the batch;
    ``uniform`` [B] is that number drawn ahead, else it is drawn here.
    """
    logits = logits.float()  # [B, V]
    if params.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]
        tokens = logprobs.argmax(dim=-1)  # [B]
        return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= params.top_p  # [B, V]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]
    if isinstance(generator, list):
        if uniform is None:
            uniform = torch.cat([torch.rand(1, generator=g) for g in generator])  # [B]
        cdf = logprobs.exp().cumsum(dim=-1)  # [B, V]
        total = cdf[:, -1:]  # [B, 1]
        # the first token whose CDF exceeds u * total (zero-probability tokens never do)
        target = torch.minimum(uniform.to(cdf.device)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp(max=cdf.shape[-1] - 1)  # [B]
    else:
        tokens = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(1)  # [B]
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


@dataclass
class CachedRow:
    """One row's keys and values: ``layers[l] = (keys, values)``, each [heads, len(tokens), head_dim]."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)


def default_prefix_cache_mb(device: str = "cpu") -> int:
    """A quarter of the memory free now on ``device`` (host memory on Linux, else 1 GiB)."""
    if device.startswith("cuda"):
        return max(64, torch.cuda.mem_get_info(torch.device(device))[0] // 4 // 2**20)
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1024
    return max(64, free // 4 // 2**20)


class PrefixCache:
    """Kept rows of earlier ``generate`` calls, oldest first, within ``budget_bytes``.

    ``take(prompt)`` hands over (and forgets) the longest kept row whose ids start ``prompt``: each
    episode's row is used by its next turn once, then that turn's row is kept in its place.
    ``weights`` is the fingerprint of the weights the rows were computed with (``HFBackend``
    clears the cache when it changes).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.rows: OrderedDict[int, CachedRow] = OrderedDict()
        self.bytes = 0
        self.weights: object = None
        self._next = 0

    def clear(self, weights: object = None) -> None:
        self.rows.clear()
        self.bytes, self.weights = 0, weights

    def take(self, prompt: Sequence[int]) -> CachedRow | None:
        best, best_key = None, None
        n_prompt = len(prompt)
        for key, row in self.rows.items():
            n = len(row.tokens)
            # a few cheap probes before comparing the whole prefix (responses differ near their end)
            if n > n_prompt or (best is not None and n <= len(best.tokens)) or row.tokens[-1] != prompt[n - 1] \
                    or row.tokens[n // 2] != prompt[n // 2]:
                continue
            if list(prompt[:n]) == row.tokens:
                best, best_key = row, key
        if best_key is not None:
            del self.rows[best_key]
            self.bytes -= best.nbytes
        return best

    def put(self, row: CachedRow) -> None:
        if not row.tokens:
            return
        size = row.nbytes
        if size > self.budget_bytes:
            return
        while self.rows and self.bytes + size > self.budget_bytes:
            _, old = self.rows.popitem(last=False)
            self.bytes -= old.nbytes
        self.rows[self._next] = row
        self._next += 1
        self.bytes += size


class HFBackend:
    """Sampling with a Hugging Face causal LM.

    Args:
        model: a model folder, or an already-loaded ``PreTrainedModel`` (training shares it).
        tokenizer: required when ``model`` is a loaded model.
        device: "cpu" or "cuda".
        seed: seeds the sampler; the same seed and batches give the same samples.
        prefix_cache_mb: memory for the prefix cache (the module's docstring); None: a quarter of
            the memory free now; 0: off (every prompt is prefilled from its first token).

    A backend given a loaded model samples with that very module (training's weights, no copy:
    ``syncs_weights`` False); one given a folder holds its own copy, which ``sync_weights`` updates.
    Nothing to put to sleep or to close.
    """

    can_sleep = False

    def __init__(self, model, tokenizer=None, *, device: str = "cpu", seed: int = 0, name: str | None = None,
                 prefix_cache_mb: int | None = None) -> None:
        self.syncs_weights = isinstance(model, (str, Path))
        if isinstance(model, (str, Path)):
            self.name = name or str(model)
            self.tokenizer = tokenizer or load_tokenizer(model)
            self.model = load_causal_lm(model, device=device)
        else:
            if tokenizer is None:
                raise ValueError("HFBackend: pass the tokenizer along with a loaded model.")
            self.name = name or getattr(model.config, "_name_or_path", "model")
            self.model, self.tokenizer = model, tokenizer
        self.device = device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.stop_ids = {i for i in (self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
                         if isinstance(i, int) and i >= 0 and i != self.tokenizer.unk_token_id}
        budget_mb = default_prefix_cache_mb(device) if prefix_cache_mb is None else prefix_cache_mb
        if budget_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 turns the prefix cache off), got {prefix_cache_mb}")
        self.prefix_caching = budget_mb > 0
        self.cache = PrefixCache(budget_mb * 2**20)
        self.prompt_tokens = 0  # prompt tokens asked for, and those the model read (the rest came from the cache)
        self.prefilled_tokens = 0

    def _weights(self) -> tuple[tuple[int, int], ...]:
        """What identifies the weights now: each parameter's storage and in-place version counter."""
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def sync_weights(self, module) -> None:
        if module is not self.model:  # a shared module is already current
            self.model.load_state_dict(module.state_dict())
        self.cache.clear()

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        self.cache.clear()

    def close(self) -> None:
        self.cache.clear()

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[Generation]:
        if not prompts:
            return []
        sampler = self.generator if seeds is None else [torch.Generator().manual_seed(s)
                                                        for s in row_seeds(prompts, params, seeds)]
        batch = len(prompts)
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise ValueError("generate(): every prompt needs at least one token.")
        kept = self._kept_rows(prompts)
        # columns: [kept keys and values (P) | fed prompt tokens (S)], every row right-aligned in both
        # parts, so every row's last prompt token sits in the last column. A row feeds at least its
        # last prompt token (its logits start the response); rows with nothing kept feed it all.
        fed_width = max(1, *(len(p) - (len(k.tokens) if k else 0) for p, k in zip(prompts, kept, strict=True)))
        use = [max(0, len(p) - fed_width) for p in prompts]  # kept tokens each row reads from its cache
        past = max(use)
        input_ids = torch.full((batch, fed_width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, past + fed_width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            fed = prompt[use[row]:]
            input_ids[row, fed_width - len(fed):] = torch.tensor(fed, dtype=torch.long)
            attention[row, past - use[row]:past] = 1
            attention[row, past + fed_width - len(fed):] = 1
        positions = ((attention.cumsum(dim=1) - 1).clamp(min=0))[:, past:]  # [B, S]
        self.prompt_tokens += sum(lengths)
        self.prefilled_tokens += sum(lengths) - sum(use)
        input_ids, attention, positions = (t.to(self.device) for t in (input_ids, attention, positions))
        cache = self._past(kept, use, past)
        tokens_out: list[list[int]] = [[] for _ in range(batch)]
        logprobs_out: list[list[float]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        active = [True] * batch
        stop_strings = params.stop_strings
        tail_tokens = max((len(s) for s in stop_strings), default=0) + 2
        step_ids, step_pos = input_ids, positions
        # one uniform per row and step, each row from its own generator
        uniforms = torch.stack([torch.rand(params.max_new_tokens, generator=g) for g in sampler]) \
            if isinstance(sampler, list) else None  # [B, T]
        for step in range(params.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=attention, position_ids=step_pos,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            logits = out.logits[:, -1, :]  # [B, V]
            next_tokens, next_logprobs = sample_logprobs(logits, params, sampler, None if uniforms is None else uniforms[:, step])
            next_list, lp_list = next_tokens.tolist(), next_logprobs.tolist()
            for row in range(batch):
                if not active[row]:
                    continue
                token = next_list[row]
                tokens_out[row].append(token)
                logprobs_out[row].append(lp_list[row])
                if token in self.stop_ids:
                    active[row], finish[row] = False, "stop"
                elif stop_strings:
                    tail = self.tokenizer.decode(tokens_out[row][-tail_tokens:])
                    if any(s in tail for s in stop_strings):
                        active[row], finish[row] = False, "stop"
            if not any(active):
                break
            fed = next_tokens.masked_fill(~torch.tensor(active, device=next_tokens.device), self.pad_id)
            step_ids = fed[:, None]
            step_pos = step_pos[:, -1:] + 1
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=attention.dtype, device=attention.device)], dim=1)
        self._keep(cache, prompts, tokens_out, past + fed_width)
        return [Generation(tokens_out[r], logprobs_out[r], finish[r]) for r in range(batch)]

    # -- the prefix cache ---------------------------------------------------------------------------
    def _kept_rows(self, prompts: Sequence[Sequence[int]]) -> list[CachedRow | None]:
        """Each prompt's kept row (None: prefilled in full); rows of other weights are dropped first."""
        if not self.prefix_caching:
            return [None] * len(prompts)
        weights = self._weights()
        if weights != self.cache.weights:
            self.cache.clear(weights)
        return [self.cache.take(p) for p in prompts]

    def _past(self, kept: list[CachedRow | None], use: list[int], past: int):
        """A cache of ``past`` columns holding each row's first ``use[row]`` kept tokens, right-aligned."""
        from transformers import DynamicCache

        cache = DynamicCache()
        if not past:
            return cache
        template = next(k for k, n in zip(kept, use, strict=True) if k is not None and n)
        for layer, (keys0, values0) in enumerate(template.layers):
            heads, _, dim = keys0.shape
            keys = keys0.new_zeros((len(kept), heads, past, dim))
            values = values0.new_zeros((len(kept), values0.shape[0], past, values0.shape[2]))
            for row, (k, n) in enumerate(zip(kept, use, strict=True)):
                if n:
                    keys[row, :, past - n:] = k.layers[layer][0][:, :n]
                    values[row, :, past - n:] = k.layers[layer][1][:, :n]
            cache.update(keys.to(self.device), values.to(self.device), layer)
        return cache

    def _keep(self, cache, prompts: Sequence[Sequence[int]], responses: list[list[int]], end: int) -> None:
        """Keep each row's keys and values: its prompt and its response but the last token (never fed)."""
        if not self.prefix_caching or any(layer.is_sliding for layer in cache.layers):
            return
        for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            fed_response = max(0, len(response) - 1)
            start, stop = end - len(prompt), end + fed_response
            self.cache.put(CachedRow(list(prompt) + response[:fed_response],
                                     [(layer.keys[row, :, start:stop].clone(), layer.values[row, :, start:stop].clone())
                                      for layer in cache.layers]))
