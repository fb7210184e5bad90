"""Checkpoints: a Hugging Face model folder plus optimizer, RNG and loop state, written atomically.

``checkpoints/step-N/`` is written under a temporary name and renamed into place, so a folder with
that name is always complete; ``COMPLETE`` inside it names what was written. Everything is
safetensors or JSON: nothing is ever unpickled from a run folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agentkit.core.errors import ConfigError

MARKER = "COMPLETE"
REQUIRED = ("config.json", "model.safetensors", "optimizer.safetensors", "optimizer.json", "rng.safetensors", "state.json", MARKER)


def _optimizer_tensors(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int = 2, optimizer_state: dict[str, Any] | None = None) -> Path:
    """``optimizer_state``: the optimizer's whole state dict, where ``optimizer`` holds only a shard
    of it (FSDP; ``agentkit.distributed``)."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step-{step}-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tensors, meta = _optimizer_tensors(optimizer_state if optimizer_state is not None else optimizer.state_dict())
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(meta))
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        (tmp / MARKER).write_text(json.dumps(sorted(p.name for p in tmp.iterdir())))
        for path in tmp.iterdir():
            with path.open("rb") as f:
                os.fsync(f.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for old in sorted(checkpoints(run_dir))[:-keep]:
        shutil.rmtree(root / f"step-{old}", ignore_errors=True)
    return final


def checkpoints(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints in ``run_dir`` (temporary, half-written folders ignored)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        if path.name.startswith("step-") and path.name[5:].isdigit() and (path / MARKER).exists():
            steps.append(int(path.name[5:]))
    return sorted(steps)


def check_complete(path: Path) -> None:
    missing = [name for name in REQUIRED if not (path / name).exists()]
    if missing:
        raise ConfigError(f"Checkpoint {path} is incomplete: missing {missing}. Delete it to resume from an earlier one.")


def load_training_state(path: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore the optimizer and RNG from ``path``; return the loop state."""
    check_complete(path)
    tensors = load_file(str(path / "optimizer.safetensors"))
    meta = json.loads((path / "optimizer.json").read_text())
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        state.setdefault(int(index), {})[name] = value
    for index, values in meta["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    return json.loads((path / "state.json").read_text())
