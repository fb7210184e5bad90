"""What makes a folder a model: full weights (``config.json``), or a LoRA adapter
(``adapter_config.json``, written by peft) over a base model folder that the adapter names."""

from __future__ import annotations

import json
from pathlib import Path

from agentkit.core.errors import ModelError

ADAPTER_CONFIG = "adapter_config.json"
# the files of a model's weights in a checkpoint: the whole model, or the adapter alone
WEIGHT_FILES = (("config.json", "model.safetensors"), (ADAPTER_CONFIG, "adapter_model.safetensors"))


def is_model_folder(folder: Path) -> bool:
    """A folder of full weights or of a LoRA adapter."""
    return (folder / "config.json").exists() or (folder / ADAPTER_CONFIG).exists()


def adapter_base(folder: Path) -> Path | None:
    """The base model folder of the LoRA adapter in ``folder``; None when ``folder`` holds full weights."""
    if not (folder / ADAPTER_CONFIG).exists():
        return None
    try:
        base = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"{folder / ADAPTER_CONFIG} is unreadable or names no base model ({err}); it is the LoRA "
                         "adapter's settings, written by the run that trained it.") from err
    base = Path(str(base))
    if not is_model_folder(base):
        raise ModelError(f"The LoRA adapter in {folder} was trained on the base model {base}, which is not there. "
                         f"Put that model folder back at {base}, or set base_model_name_or_path in "
                         f"{folder / ADAPTER_CONFIG} to where it is now.")
    return base
