"""Checkpoints: a Hugging Face model folder plus optimizer, RNG and loop state, written atomically.

``checkpoints/step-N/`` is written under a temporary name (``.step-N-XXXX``), its files synced,
then ``COMPLETE`` is written (every file's name, size and SHA-256) and the folder renamed into place. So a
process killed at any moment leaves either no ``step-N`` or a whole one; the temporary folder it
leaves is ignored, and removed by the next save. Old checkpoints are renamed away before they are
deleted, so a half-deleted one is never visible either. A disk that fills up mid-write ends in
``DiskFullError`` (the file, the space left, the last complete checkpoint); the partial folder is
removed, which gives its space back.

Resume takes the newest ``step-N`` and checks it against its marker first: a marker, a file
missing, of the wrong size or with other bytes (damage from outside, an edit by hand: agentkit
never leaves a checkpoint so) is
refused with an error that names the file, rather than silently falling back to an older
checkpoint. Everything is safetensors or JSON: nothing is ever unpickled from a run folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from agentkit.core import runs
from agentkit.core.errors import ConfigError, DiskFullError, disk_full, human_bytes, no_space
from agentkit.core.faults import fault_point
from agentkit.core.model_files import WEIGHT_FILES
from agentkit.core.runs import checkpoints

MARKER = runs.CHECKPOINT_MARKER
REQUIRED = ("optimizer.safetensors", "optimizer.json", "rng.safetensors", "state.json", MARKER)  # and WEIGHT_FILES


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


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(folder: Path) -> None:
    """Rename ``folder`` out of sight, then delete it: a kill mid-delete never leaves a ``step-N``
    with some files gone."""
    trash = folder.with_name(f".trash-{folder.name}-{os.getpid()}")
    os.rename(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any], keep: int = 2, optimizer_state: dict[str, Any] | None = None) -> Path:
    """``optimizer_state``: the optimizer's whole state dict, where ``optimizer`` holds only a shard
    of it (FSDP; ``agentkit.train.distributed``)."""
    root = runs.checkpoints_dir(run_dir)
    final = runs.checkpoint_dir(run_dir, step)
    tmp: Path | None = None
    part = "its folder"  # what was being written, for the message of a full disk
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in [*root.glob(f".{runs.STEP_PREFIX}*"), *root.glob(".trash-*")]:  # left by a process killed mid-write
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{runs.step_name(step)}-", dir=root))
        part = "its model weights"
        model.save_pretrained(tmp, safe_serialization=True)
        part = "its tokenizer files"
        tokenizer.save_pretrained(tmp)
        fault_point("checkpoint.write", step)  # tests: killed with some files written, not all
        tensors, meta = _optimizer_tensors(optimizer_state if optimizer_state is not None else optimizer.state_dict())
        part = "optimizer.safetensors"
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        part = "optimizer.json"
        (tmp / "optimizer.json").write_text(json.dumps(meta))
        part = "rng.safetensors"
        save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        part = "state.json"
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        part = "its files, syncing them to disk"
        for path in tmp.iterdir():
            _fsync(path)
        part = MARKER
        # the marker last, once everything it lists is on disk
        (tmp / MARKER).write_text(json.dumps({p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
                                              for p in sorted(tmp.iterdir())}, indent=1))
        _fsync(tmp / MARKER)
        if final.exists():
            _remove(final)
        os.rename(tmp, final)
        _fsync(root)
    except Exception as err:  # noqa: BLE001 - a full disk becomes one clear error; anything else propagates as it was
        if not no_space(err):
            raise
        if tmp is not None:  # the partial checkpoint: never visible as step-N, and its space is given back
            shutil.rmtree(tmp, ignore_errors=True)
        raise _disk_full(run_dir, step, part, tmp or root, err) from err
    finally:
        if tmp is not None and tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    for old in sorted(checkpoints(run_dir))[:-keep]:
        _remove(runs.checkpoint_dir(run_dir, old))
    return final


def _disk_full(run_dir: Path, step: int, part: str, where: Path, err: BaseException) -> DiskFullError:
    done = checkpoints(run_dir)
    if done:
        last = runs.checkpoint_dir(run_dir, done[-1])
        size = sum(p.stat().st_size for p in last.iterdir() if p.is_file())
        kept = (f"{runs.step_name(done[-1])}, the last complete checkpoint, and the run's other files are intact (a checkpoint "
                f"here takes {human_bytes(size)})")
    else:
        kept = "the run's other files are intact; it has no complete checkpoint yet"
    return disk_full(f"checkpoint {runs.step_name(step)} ({part}) to", where, err,
                     f"The partial checkpoint was removed; {kept}. Free some space there to go on.")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fallback(path: Path) -> str:
    earlier = [step for step in checkpoints(path.parent.parent) if path.name != runs.step_name(step)]
    return f"delete {path} to resume from step {earlier[-1]}" if earlier else f"delete {path} and start again"


def check_complete(path: Path) -> None:
    """Raise ``ConfigError`` naming what is missing or changed if ``path`` is not the checkpoint
    written: every file its marker lists, at the size and with the SHA-256 written (older markers
    list sizes, or names only), and every file a resume reads."""
    if not (path / MARKER).exists():
        raise ConfigError(f"Checkpoint {path} has no {MARKER} marker. agentkit writes the marker last and only then "
                          f"moves the folder into place, so something outside it removed the marker. Restore it, "
                          f"or {_fallback(path)} (resuming never replaces a newer folder).")
    try:
        written = json.loads((path / MARKER).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"Checkpoint {path}: its {MARKER} marker is unreadable ({err}). "
                          "Delete the folder to resume from an earlier checkpoint.") from err
    # {name: {"size", "sha256"}}; markers of older agentkits: {name: size}, or a list of names
    files: dict[str, dict[str, Any]] = ({name: {} for name in written} if isinstance(written, list) else
                                        {name: e if isinstance(e, dict) else {"size": e} for name, e in written.items()})
    # the whole model's files, or the LoRA adapter's (the checkpoint's config names which)
    weights = WEIGHT_FILES[1] if (path / WEIGHT_FILES[1][0]).exists() else WEIGHT_FILES[0]
    missing = sorted({name for name in [*files, *REQUIRED, *weights] if not (path / name).exists()})
    resized = sorted(name for name, e in files.items()
                     if "size" in e and name not in missing and (path / name).stat().st_size != e["size"])
    edited = sorted(name for name, e in files.items()
                    if "sha256" in e and name not in missing and name not in resized and _sha256(path / name) != e["sha256"])
    if missing or resized or edited:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"{', '.join(resized)} changed size since it was written"] if resized else []) + (
            [f"{', '.join(edited)} changed since it was written (same size, other bytes: its SHA-256 is not the "
             f"one in {MARKER})"] if edited else [])
        raise ConfigError(f"Checkpoint {path} is damaged: {'; '.join(problems)}. agentkit writes checkpoints "
                          f"atomically, so something outside it removed or changed these files. Restore them, or "
                          f"{_fallback(path)}.")


def load_training_state(path: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore the optimizer and RNG from ``path``; return the loop state."""
    check_complete(path)
    with _reading(path, "optimizer.safetensors and optimizer.json"):
        tensors = load_file(str(path / "optimizer.safetensors"))
        meta = json.loads((path / "optimizer.json").read_text(encoding="utf-8"))
        state: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            index, _, name = key.partition(".")
            state.setdefault(int(index), {})[name] = value
        for index, values in meta["scalars"].items():
            state.setdefault(int(index), {}).update(values)
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    with _reading(path, "rng.safetensors"):
        torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    with _reading(path, "state.json"):
        loop_state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if not isinstance(loop_state, dict) or type(loop_state.get("step")) is not int:
            raise ValueError(f"expected an object with an integer 'step', got {str(loop_state)[:80]}")
    return loop_state


@contextlib.contextmanager
def _reading(path: Path, what: str):
    """Turn any failure to read or apply ``what`` into a ConfigError naming the checkpoint and file."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, SafetensorError) as err:
        raise ConfigError(f"Checkpoint {path}: cannot restore from {what} ({type(err).__name__}: {err}). The file is "
                          "corrupt or from another model or optimizer; delete this checkpoint to resume from an "
                          "earlier one.") from err
