"""The one backend builder (rollout/backends.py): every backend kind the settings allow has its
entry, a kind that samples a loaded module samples the trained module itself, and the loop's
decisions come from the entries, never from a kind's name."""

from __future__ import annotations

import typing

import pytest
from agentkit.rollout.backends import (
    BACKEND_VARIANTS,
    BACKENDS,
    HFBackendSettings,
    VLLMBackendSettings,
    backend_kind,
    make_backend,
)
from agentkit.rollout.hf_backend import load_causal_lm, load_tokenizer

from agentkit.core.errors import ConfigError
from agentkit.train.config import TrainSection
from agentkit.train.policy import policy_backend, samples_policy_itself


def test_every_backend_kind_has_its_entry():
    kinds = {typing.get_args(variant.model_fields["kind"].annotation)[0] for variant in BACKEND_VARIANTS}
    assert kinds == set(BACKENDS)
    assert samples_policy_itself(HFBackendSettings()) and not samples_policy_itself(VLLMBackendSettings())


def test_a_folder_gives_a_copy_and_a_module_is_sampled_as_it_is(tiny_model_dir):
    from_folder = make_backend(HFBackendSettings(), tiny_model_dir, seed=0)
    assert from_folder.syncs_weights and from_folder.name == str(tiny_model_dir)
    module, tokenizer = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    shared = policy_backend(HFBackendSettings(), module=module, folder=tiny_model_dir, train=TrainSection(),
                            resumed=False, tokenizer=tokenizer, seed=0, name="policy")
    assert shared.model is module and not shared.syncs_weights and not shared.can_sleep
    assert shared.name == "policy"


def test_an_engine_kind_refuses_a_loaded_module_with_the_fix(tiny_model_dir):
    with pytest.raises(ConfigError, match="loads its weights from a model folder.*Pass the folder"):
        make_backend(VLLMBackendSettings(), load_causal_lm(tiny_model_dir))


def test_sleeping_during_updates_is_the_settings_choice():
    assert not HFBackendSettings().sleep_during_updates
    assert not VLLMBackendSettings(args={"enable_sleep_mode": True}).sleep_during_updates
    assert VLLMBackendSettings(sleep=True, args={"enable_sleep_mode": True}).sleep_during_updates
    assert backend_kind(HFBackendSettings()).check_installed() is None  # nothing to install


def test_a_new_kind_is_its_settings_and_one_entry():
    """A kind added to BACKENDS (an SGLang engine, say) is a `backend` section of its own: its
    settings parse, its options get flags, and training offers it only when it trains."""
    from typing import Literal

    from agentkit.rollout import backends
    from pydantic import BaseModel, Field

    from agentkit.core.config import settings_of, validate_settings

    class SGLangSettings(backends.BackendSettingsBase):
        kind: Literal["sglang"] = "sglang"
        mem_fraction: float = Field(0.8, description="Share of GPU memory for the engine.")

    kinds = {**BACKENDS, "sglang": backends.BackendKind(SGLangSettings, lambda *a, **k: None, samples_module=False,
                                                        trains=False)}

    class Config(BaseModel):
        backend: backends._section(kinds, "must be a known kind") = Field(default_factory=HFBackendSettings)

    parsed = validate_settings(Config, {"backend": {"kind": "sglang", "mem_fraction": 0.5}})
    assert isinstance(parsed.backend, SGLangSettings) and parsed.backend.mem_fraction == 0.5
    assert isinstance(validate_settings(Config, {"backend": "vllm"}).backend, VLLMBackendSettings)
    rows = {row.key: row for row in settings_of(Config)}
    assert rows["backend.kind"].choices == ("hf", "vllm", "openai", "sglang")
    assert rows["backend.mem_fraction"].variant == "sglang"
    with pytest.raises(ConfigError, match=r"backend.mem_fraction"):  # the tag is not part of the key
        validate_settings(Config, {"backend": {"kind": "sglang", "mem_fraction": "lots"}})


def test_the_commands_offer_the_kinds_of_the_entries():
    from agentkit.rollout.config import RolloutConfig

    from agentkit.core.config import settings_of
    from agentkit.train.config import TrainConfig

    def kinds(model):
        return next(row.choices for row in settings_of(model) if row.key == "backend.kind")

    assert kinds(RolloutConfig) == tuple(BACKENDS)
    assert kinds(TrainConfig) == tuple(name for name, kind in BACKENDS.items() if kind.trains) == ("hf", "vllm")
