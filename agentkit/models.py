"""Build the tiny default policy offline: a byte-level BPE tokenizer and a small Qwen3 model.

No hub is needed. The tokenizer is trained on text from the environments (a seed corpus shipped
with agentkit, plus observations from TextWorld expert playthroughs when TextWorld is installed),
has ChatML special tokens and a chat template, and is saved as a standard Hugging Face folder that
``AutoTokenizer``/``AutoModelForCausalLM`` (and vLLM) load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from agentkit.core import runs
from agentkit.core.errors import ConfigError, ModelError
from agentkit.core.model_files import is_model_folder

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_INFO_FILE = "agentkit_model.json"


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


SIZES: dict[str, ModelSize] = {
    # ~0.5M parameters: the CPU default (about 1,500 generated tokens/s at batch 16 on 2 cores)
    "tiny": ModelSize(64, 256, 2, 4, 2, 16),
    # ~3M: a bigger "teacher" for distillation experiments
    "small": ModelSize(128, 512, 4, 4, 2, 32),
    # ~10M
    "base": ModelSize(256, 768, 6, 8, 4, 32),
    # Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query and 8 KV heads of 128): ~0.44B with the local
    # vocabulary (Qwen3's 151k-token embedding is the rest); for memory and speed figures, not for CPU runs
    "qwen3-0.6b": ModelSize(1024, 3072, 28, 16, 8, 128),
    # Qwen3-1.7B's shape (28 layers, hidden 2048): ~1.4B with the local vocabulary
    "qwen3-1.7b": ModelSize(2048, 6144, 28, 16, 8, 128),
}


def corpus_lines(include_textworld: bool = True) -> list[str]:
    """The tokenizer's training text, deterministic for the same installed extras."""
    seed = resources.files("agentkit").joinpath("data/seed_corpus.txt").read_text(encoding="utf-8")
    lines = [line for line in seed.splitlines() if line.strip()] + _vaults_text()
    if include_textworld:
        lines += _textworld_text()
    return lines


def _vaults_text() -> list[str]:
    """The built-in vaults environment's words (rules, observations, every phrasing, a dead end), so
    its markers and family names are whole tokens rather than letters."""
    from agentkit.envs.vaults_env import META_FAMILIES, PHRASINGS, TARGET_FAMILIES, VaultsEnv, rule_text

    lines = [rule_text(family) for family in (*META_FAMILIES, *TARGET_FAMILIES)]
    env = VaultsEnv(families="all")
    for seed in range(len(META_FAMILIES) + len(TARGET_FAMILIES)):
        obs, info = env.reset(seed=seed)
        wrong = next(a for a in info["admissible_actions"] if a not in info["expert_plan"])
        lines += [obs, info["task"], "Available actions: " + ", ".join(info["admissible_actions"])]
        for action in (wrong, "go back", *info["expert_plan"]):
            obs, _, terminated, _, info = env.step(action)
            lines += [f"<action>{action}</action>", obs]
            if terminated:
                break
    lines += [f"<action>{phrasing.format(m='star')}</action>" for phrasing in PHRASINGS]
    return lines


def _textworld_text() -> list[str]:
    try:
        import textworld  # noqa: F401
    except ImportError:
        return []
    from agentkit.envs import make

    lines: list[str] = []
    for env_id in ("textworld/simple-v0", "textworld/coin-v0", "textworld/treasure-v0", "textworld/cooking-v0"):
        env = make(env_id, split="train")
        try:
            for seed in (0, 1):
                obs, info = env.reset(seed=seed)
                lines += [obs, info["task"], "Available actions: " + ", ".join(info["admissible_actions"])]
                for action in info["expert_plan"]:
                    obs, _, terminated, truncated, info = env.step(action)
                    lines += [f"<action>{action}</action>", obs, "Available actions: " + ", ".join(info["admissible_actions"])]
                    if terminated or truncated:
                        break
        finally:
            env.close()
    return lines


def train_tokenizer(lines: list[str], vocab_size: int = 3000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        additional_special_tokens=["<|im_start|>"], chat_template=CHAT_TEMPLATE, model_max_length=8192,
    )


def init_model(out: str | os.PathLike, *, size: str = "tiny", seed: int = 0, vocab_size: int = 3000,
               include_textworld: bool = True, max_context: int = 8192) -> Path:
    """Write a tokenizer and a randomly initialized Qwen3 model to ``out`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    if size not in SIZES:
        raise ConfigError(f"Unknown model size {size!r}; choose one of {sorted(SIZES)}.")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ModelError(f"{out} already exists and is not empty; choose another --out or remove it.")
    lines = corpus_lines(include_textworld)
    tokenizer = train_tokenizer(lines, vocab_size)
    dims = SIZES[size]
    config = Qwen3Config(
        vocab_size=len(tokenizer), max_position_embeddings=max_context, tie_word_embeddings=True,
        rope_theta=10000.0, bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **asdict(dims),
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp, safe_serialization=True)
        info = {
            "builder": "agentkit model init", "size": size, "seed": seed, "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "corpus_sha1": hashlib.sha1("\n".join(lines).encode()).hexdigest(), "corpus_lines": len(lines),
        }
        (tmp / MODEL_INFO_FILE).write_text(json.dumps(info, indent=1))
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


DEFAULT_MODEL = Path(__file__).parent / "data" / "default-model"


def default_model_dir() -> Path:
    return DEFAULT_MODEL


def ensure_default_model() -> Path:
    """The model ``agentkit rollout`` uses when no --model is given: the tiny policy that
    ``examples/recipe_textworld.py`` trains (random init -> SFT -> GRPO on TextWorld Coin Collector),
    shipped with the package (under 1 MB). Rebuild it with
    ``python examples/recipe_textworld.py --seeds 0 1 2 --install-default``."""
    path = default_model_dir()
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise ModelError(f"The default model is missing from {path} (a damaged install?). Rebuild it with: "
                         "python examples/recipe_textworld.py --seeds 0 1 2 --install-default, or pass --model DIR.")
    return path


# what a model is loaded from; the rest of a hub repository (other weight formats, images) is not fetched
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def resolve_model_dir(path: str | os.PathLike, *, flag: str = "--model") -> Path:
    """The model folder that ``path`` (the value of ``flag``) names, or a ModelError at once.

    - a model folder (with config.json): itself;
    - a training run folder (``checkpoints/step-N/``, ``config.yaml``): its newest complete
      checkpoint, with a note on stderr;
    - a hub id (``org/name``, where ``org`` is no local folder): its copy in the Hugging Face cache,
      downloaded first unless the hub is offline (``HF_HUB_OFFLINE=1``).
    Anything else fails here, before any hub lookup, naming the path and the fix.
    """
    text = os.fspath(path)
    given = f"{flag}{text}" if flag.endswith(":") else f"{flag} {text}"  # "--model DIR", "--teacher model:DIR"
    folder = Path(text).expanduser()
    if folder.is_dir():
        if folder.name == runs.CHECKPOINTS and not is_model_folder(folder):
            folder = folder.parent  # the run's checkpoints folder: the run
        if is_model_folder(folder):  # full weights, or a LoRA adapter over the base it names
            return folder
        if runs.is_run_folder(folder):
            return _newest_checkpoint(folder, given)
        raise ModelError(f"{given}: not a model folder (no config.json) and not a training run folder "
                         "(no checkpoints/). Build a model with: agentkit model init --out DIR")
    if folder.exists():
        raise ModelError(f"{given} is a file; give a model folder (one with config.json) or a run folder.")
    if _looks_like_hub_id(text):
        return _hub_snapshot(text, given)
    raise ModelError(f"{given}: no such folder. Give a model folder (one with config.json), a training run "
                     "folder (its newest checkpoint is used), or build a model with: agentkit model init --out DIR")


def _newest_checkpoint(run_dir: Path, given: str) -> Path:
    steps = runs.checkpoints(run_dir)
    if not steps:
        raise ModelError(f"{given} is a training run folder with no complete checkpoint yet "
                         f"(checkpoints/step-N with a COMPLETE marker). Continue it with: agentkit train --out {run_dir} "
                         "--resume, or give a model folder.")
    newest = runs.checkpoint_dir(run_dir, steps[-1])
    print(f"{given} is a run folder: using its newest checkpoint, {newest}", file=sys.stderr)
    return newest


def _looks_like_hub_id(text: str) -> bool:
    """``org/name`` with hub characters, and ``org`` not a local folder (then it is a mistyped path)."""
    parts = text.split("/")
    return (len(parts) == 2 and all(part and part[0] not in ".~-" and all(c.isalnum() or c in "-_." for c in part)
                                    for part in parts)
            and not Path(parts[0]).exists())


def _hub_snapshot(repo_id: str, given: str) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError as err:  # transformers depends on it, so only a broken install gets here
        raise ModelError(f"{given}: no such folder, and huggingface_hub is not installed to look it up "
                         "on the hub.") from err
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE:
        raise ModelError(f"{given}: no such folder, and no hub model of that name is in the Hugging Face "
                         "cache (the hub is offline: HF_HUB_OFFLINE is set). Check the path, or build a model with: "
                         "agentkit model init --out DIR")
    print(f"{given}: no such folder; looking for a model of that name on the Hugging Face hub", file=sys.stderr)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as err:  # noqa: BLE001 - network, auth and not-found errors all end here
        why = ("nor a model on the Hugging Face hub" if isinstance(err, RepositoryNotFoundError) else
               f"and the Hugging Face hub could not be asked ({type(err).__name__})")
        raise ModelError(f"{given}: no such folder, {why}. Check the path, or build a model with: "
                         "agentkit model init --out DIR") from err
