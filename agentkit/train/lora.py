"""LoRA for the trained policy (``train.lora``, peft): the adapter that trains, the adapter a run
resumes, the base model seen through the policy with its adapter off (the frozen reference, and a
``model:DIR`` teacher that is the base itself: no second copy of the weights), and the merged
weights a vLLM engine loads."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from agentkit.core.errors import ConfigError, MissingDependencyError, ModelError
from agentkit.train.config import LoraSection

PEFT_MISSING = ("--lora-rank (train.lora.rank > 0) trains a LoRA adapter with peft, which is not installed: "
                "pip install 'agentkit[lora]' (or set train.lora.rank=0 to train every weight).")


def check_peft(lora: LoraSection) -> None:
    """Refuse LoRA without peft at once, before any environment, model or game work."""
    if lora.rank and importlib.util.find_spec("peft") is None:
        raise MissingDependencyError(PEFT_MISSING)


def _peft():
    try:
        import peft
    except ImportError as err:
        raise MissingDependencyError(PEFT_MISSING) from err
    return peft


def add_adapter(model, lora: LoraSection, base: Path):
    """``model`` (frozen, loaded from the folder ``base``) with a new LoRA adapter on
    ``lora.target_modules``; only the adapter trains. The adapter's B starts at 0, so the module
    computes exactly what ``model`` does. Its checkpoints name ``base`` by absolute path."""
    peft = _peft()
    found = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
    missing = sorted(set(lora.target_modules) - found)
    if missing:
        raise ConfigError(f"train.lora.target_modules: this model has no linear layer named {', '.join(missing)}; "
                          f"its linear layers are {', '.join(sorted(found))}.")
    config = peft.LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    adapted = peft.get_peft_model(model, config)  # adapter weights in fp32 even on a bf16 base
    # get_peft_model names the base as the model was loaded (maybe a relative path)
    adapted.peft_config["default"].base_model_name_or_path = str(Path(base).resolve())
    return adapted


def resume_adapter(folder: Path, base):
    """The adapter a run saved in checkpoint ``folder``, trainable again, on ``base``."""
    peft = _peft()
    try:
        return peft.PeftModel.from_pretrained(base, str(folder), is_trainable=True)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise ModelError(f"Could not load the LoRA adapter in checkpoint {folder}: {err}") from err


def trainable_state(model) -> dict[str, torch.Tensor]:
    """The tensors an update changes, by ``state_dict`` name: every one for full fine-tuning, the
    adapter's alone with LoRA (what the async generator receives after each update)."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    state = model.state_dict()
    if len(trainable) == sum(1 for _ in model.parameters()):
        return state
    return {name: tensor for name, tensor in state.items() if name in trainable}


def merged_state(model) -> dict[str, torch.Tensor]:
    """The weights of base + adapter under the base model's own names, each adapted layer's weight
    plus its low-rank update, computed apart (the module's own weights are never changed and
    changed back, which would drift): what an engine without LoRA support loads."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    adapted = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name or "lora_dropout" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        merged[clean] = tensor
    with torch.no_grad():
        for name, module in adapted.items():
            weight = module.get_base_layer().weight
            delta = sum(module.get_delta_weight(adapter) for adapter in module.active_adapters)
            merged[f"{name}.weight"] = (weight.float() + delta.float()).to(weight.dtype)
    return merged


class BaseView:
    """The policy's base model: the policy called with its adapter switched off, without gradients.
    Reads like the frozen module it stands for (``config``, ``parameters``, ``dtype``)."""

    def __init__(self, policy, path: Path) -> None:
        self.policy, self.path = policy, path

    def __call__(self, *args: Any, **kwargs: Any):
        with torch.no_grad(), self.policy.disable_adapter():
            return self.policy(*args, **kwargs)

    def parameters(self):
        return self.policy.get_base_model().parameters()

    def get_output_embeddings(self) -> torch.nn.Module | None:
        return self.policy.get_output_embeddings()  # called inside the policy's forward, as the policy's own

    @property
    def config(self):
        return self.policy.config

    @property
    def dtype(self) -> torch.dtype:
        return next(p.dtype for p in self.parameters() if not p.requires_grad)

    def eval(self) -> BaseView:
        return self

    def requires_grad_(self, flag: bool = True) -> BaseView:
        return self


class MergedWeights:
    """A LoRA policy as an engine without LoRA support loads it: ``named_parameters`` gives the
    merged weights under the base model's names (``merged_state``), ``save_pretrained`` writes
    them as a full checkpoint, and calling it runs the policy itself (adapter on)."""

    def __init__(self, model) -> None:
        self.model = model

    def named_parameters(self):
        return iter(merged_state(self.model).items())

    def parameters(self):
        return self.model.parameters()

    def save_pretrained(self, folder, **kwargs: Any) -> None:
        self.model.get_base_model().save_pretrained(folder, state_dict=merged_state(self.model), **kwargs)

    def __call__(self, *args: Any, **kwargs: Any):
        return self.model(*args, **kwargs)
