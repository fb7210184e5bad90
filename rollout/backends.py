"""Every kind of generation backend, its settings and how to build it: ``hf`` (transformers, CPU
default), ``vllm`` (in-process engine), ``openai`` (any OpenAI-compatible server; rollout-only: its
weights are not ours to sync).

Every command builds its backend here (``rollout``, ``eval``, the training loop and the async
generator): ``make_backend`` over a model folder, or, for a kind that samples a loaded module, over
the trained module itself. What a kind is before one is built (its settings, does it sample a loaded
module, can training sample with it, is its package installed) is its ``BackendKind`` in
``BACKENDS``, and the ``backend`` section of every command's settings is the union of the kinds'
settings. A new backend (SGLang, say) adds its module and, here, its settings class, its builder and
one ``BACKENDS`` entry; the loop reads the entry, never the kind's name.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from agentkit.rollout.backend import GenerationBackend
from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from agentkit.core.errors import ConfigError
from agentkit.core.settings import RUNTIME, Settings, flag


# -- each kind's settings: only its own options --------------------------------------------------
class BackendSettingsBase(Settings):
    """What every backend's settings have: its ``kind`` (the union's tag)."""

    kind: str

    @property
    def sleep_during_updates(self) -> bool:
        """Whether the training loop frees the backend's memory during each update (a kind that
        samples with the trained module, or a server's, has nothing of ours to free)."""
        return False

    def training_problem(self) -> str | None:
        """Why a training run cannot sample with these settings, with the fix (None: it can)."""
        return None


class HFBackendSettings(BackendSettingsBase):
    kind: Literal["hf"] = Field("hf", json_schema_extra=flag("--backend"),
                                description="Generation backend: hf (transformers; in training it samples with the "
                                            "trained module itself), vllm (an in-process vLLM engine; weights synced "
                                            "after every update), openai (an OpenAI-compatible server at --base-url; "
                                            "--model is the folder with its tokenizer; not for training).")
    device: str = Field("cpu", description="Torch device of the transformers backend.")
    prefix_cache_mb: int | None = Field(None, ge=0, json_schema_extra=flag("--prefix-cache-mb") | RUNTIME,
                                        description="Memory (MiB) for the transformers backend's prefix cache: each "
                                                    "row's keys and values are kept, and a later prompt that starts "
                                                    "with them (a chat episode's next turn) reads only its new tokens. "
                                                    "Default: a quarter of the memory free at start; 0 turns it off.")

    def training_problem(self) -> str | None:
        if self.device != "cpu":
            return (f"--device {self.device} (backend.device): one training process trains and samples on the CPU; "
                    "accelerators come from a launcher (accelerate launch or torchrun, see docs/scaling.md), or "
                    "sample with --backend vllm. Drop --device.")
        return None


class VLLMBackendSettings(BackendSettingsBase):
    kind: Literal["vllm"] = "vllm"
    args: dict[str, Any] = Field(default_factory=dict, json_schema_extra=flag("--vllm-args"),
                                 description="vllm.LLM settings (gpu_memory_utilization, dtype, weight_sync="
                                             "direct|ipc|file, kv_cache_gib, enable_sleep_mode, tensor_parallel_size...).")
    sleep: bool = Field(False, json_schema_extra=flag("--vllm-sleep"),
                        description="Put the vLLM engine to sleep during updates (GPU; needs "
                                    "--vllm-args enable_sleep_mode=true).")

    @property
    def sleep_during_updates(self) -> bool:
        """Whether the training loop puts the engine to sleep during each update (``sleep``)."""
        return self.sleep

    @model_validator(mode="after")
    def _check(self) -> VLLMBackendSettings:
        if self.sleep and not self.args.get("enable_sleep_mode"):
            raise ValueError("backend.sleep (--vllm-sleep) needs backend.args.enable_sleep_mode=true "
                             "(--vllm-args enable_sleep_mode=true).")
        return self


class OpenAIBackendSettings(BackendSettingsBase):
    kind: Literal["openai"] = "openai"
    base_url: str = Field(..., description="Server API root for --backend openai, e.g. http://127.0.0.1:8000/v1 "
                          "(key from $OPENAI_API_KEY).")
    served_model: str | None = Field(None, description="Model name on the server (default: the first it lists).")
    api: Literal["completions", "chat"] = Field("completions", description="completions: token-id prompts, "
                                                "token-exact (vLLM, SGLang); chat: messages (hosted APIs; "
                                                "re-tokenized when the server returns no ids).")
    concurrency: int = Field(16, gt=0, description="Requests in flight.")
    request_timeout: float = Field(120.0, gt=0, description="Seconds one request may take (each retry gets as long).")
    max_retries: int = Field(4, ge=0, description="Retries of a failed request (connection errors, timeouts, "
                             "429/5xx, malformed answers), with exponential backoff.")
    max_response_bytes: int = Field(64 * 2**20, gt=0, description="Largest answer accepted, in bytes.")


def _nothing_to_check() -> None:
    pass


@dataclass(frozen=True)
class BackendKind:
    """What a kind of backend is, known from its settings before one is built.

    Attributes:
        settings: its settings class (``kind`` a ``Literal`` of its name, ``BACKENDS``' key).
        build: ``build(settings, model, seed=, tokenizer=, name=, device=, lora_rank=)`` -> the
            backend (``make_backend``'s arguments); it imports the backend's module when called.
        samples_module: it can sample with an already-loaded module, the trained one itself: a
            training run needs no engine of its own, nothing to sync, and the sampling logprobs are
            the trainer's numerics (transformers). False: it loads weights from a folder into an
            engine of its own (vLLM) or they live on a server.
        trains: training can sample with it: it samples the trained module or takes the trained
            weights after each update (a server's weights are not ours to sync: rollout and eval only).
        check_installed: raises ``MissingDependencyError`` naming the install command when the
            backend's package is missing (run before any environment, model or game work).
    """

    settings: type[BackendSettingsBase]
    build: Callable[..., GenerationBackend]
    samples_module: bool
    trains: bool = True
    check_installed: Callable[[], None] = _nothing_to_check


def _hf(settings, model, *, seed: int, tokenizer: Any, name: str | None, device: str | None, lora_rank: int):
    from agentkit.rollout.hf_backend import HFBackend

    return HFBackend(model, tokenizer, device=device or settings.device, seed=seed, name=name,
                     prefix_cache_mb=settings.prefix_cache_mb)


def _vllm(settings, model, *, seed: int, tokenizer: Any, name: str | None, device: str | None, lora_rank: int):
    from agentkit.rollout.vllm_backend import VLLMBackend

    return VLLMBackend(model, tokenizer, seed=seed, name=name, lora_rank=lora_rank, **settings.args)


def _openai(settings, model, *, seed: int, tokenizer: Any, name: str | None, device: str | None, lora_rank: int):
    from agentkit.rollout.openai_backend import OpenAIBackend

    backend = OpenAIBackend(settings.base_url, model if tokenizer is None else tokenizer, model=settings.served_model,
                            api=settings.api, api_key_env="OPENAI_API_KEY", concurrency=settings.concurrency,
                            timeout_s=settings.request_timeout, max_retries=settings.max_retries,
                            max_response_bytes=settings.max_response_bytes, name=name)
    if settings.api == "completions":
        backend.check_tokenizer()  # token-id prompts mean the same to the server
    return backend


def _check_vllm() -> None:
    from agentkit.rollout.vllm_backend import check_vllm

    check_vllm()


# keyed by the settings' ``kind``; the first is the default backend
BACKENDS: dict[str, BackendKind] = {
    "hf": BackendKind(HFBackendSettings, _hf, samples_module=True),
    "vllm": BackendKind(VLLMBackendSettings, _vllm, samples_module=False, check_installed=_check_vllm),
    "openai": BackendKind(OpenAIBackendSettings, _openai, samples_module=False, trains=False),
}


# -- the ``backend`` section: a discriminated union of the kinds' settings -----------------------
def _backend_section(value: Any) -> Any:
    """``backend: vllm`` (or ``--set backend=vllm``) is short for ``backend: {kind: vllm}``; an
    empty section is the default backend."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {"kind": value}
    return value


def _backend_kind(value: Any) -> str | None:
    """The variant of a backend section: its ``kind``, the default's when not given (None: not a section)."""
    if isinstance(value, dict):
        return value.get("kind", next(iter(BACKENDS)))
    if isinstance(value, BackendSettingsBase):
        return value.kind
    return None


def _section(kinds: dict[str, BackendKind], message: str) -> Any:
    """The settings type of a ``backend`` section that may be any of ``kinds``, told apart by ``kind``."""
    if len(kinds) == 1:  # a union of one is its member
        return Annotated[next(iter(kinds.values())).settings, BeforeValidator(_backend_section)]
    variants = tuple(Annotated[kind.settings, Tag(name)] for name, kind in kinds.items())
    return Annotated[Union[variants], Discriminator(_backend_kind, custom_error_type="backend_kind",  # noqa: UP007
                                                    custom_error_message=message), BeforeValidator(_backend_section)]


def _either(names) -> str:
    *most, last = names
    return f"{', '.join(most)} or {last}" if most else last


_TRAINING = {name: kind for name, kind in BACKENDS.items() if kind.trains}
_NOT_TRAINING = [name for name in BACKENDS if name not in _TRAINING]
BackendSettings = _section(BACKENDS, f"must be {_either(BACKENDS)} (--backend), or a section with that kind")
# training samples with the weights it trains: no server backend
TrainBackendSettings = _section(
    _TRAINING, f"training samples with the weights it trains: {_either(_TRAINING)} (--backend)"
               + (f"; {_either(_NOT_TRAINING)} only for agentkit rollout and eval" if _NOT_TRAINING else ""))
BACKEND_VARIANTS: tuple[type[BackendSettingsBase], ...] = tuple(kind.settings for kind in BACKENDS.values())


def backend_default() -> BackendSettingsBase:
    return next(iter(BACKENDS.values())).settings()


def backend_kind(settings: BackendSettingsBase) -> BackendKind:
    """The ``BackendKind`` of the backend ``settings`` describe."""
    return BACKENDS[settings.kind]


def make_backend(settings: BackendSettingsBase, model: str | os.PathLike | Any, *, seed: int = 0, tokenizer: Any = None,
                 name: str | None = None, device: str | None = None, lora_rank: int = 0) -> GenerationBackend:
    """The backend ``settings`` describe.

    Args:
        settings: one kind's settings (``BACKENDS``), each with its own options.
        model: a model folder (for ``openai``: the folder holding the served model's tokenizer), or,
            for a kind that ``samples_module``, an already-loaded module it samples with as it is
            (training's own weights: pass ``tokenizer`` with it).
        seed: seeds the backend's sampler.
        tokenizer: the tokenizer to format prompts with (default: the folder's).
        name: the model's name in trajectories (default: the folder, or the module's own).
        device: where a loaded-module backend samples, over the settings' (a launcher's rank device).
        lora_rank: the rank of the LoRA adapter training will send (vLLM sizes its LoRA slots).
    """
    kind = backend_kind(settings)
    if not (kind.samples_module or isinstance(model, (str, os.PathLike))):
        raise ConfigError(f"backend {settings.kind} loads its weights from a model folder; it was given a loaded "
                          f"{type(model).__name__}. Pass the folder the module was loaded from.")
    return kind.build(settings, model, seed=seed, tokenizer=tokenizer, name=name, device=device, lora_rank=lora_rank)
