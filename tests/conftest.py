"""Shared fixtures: a tiny real model built locally, a private cache for generated games, and tiny
students after a short SFT (built once per session, read-only: tests train from them into their
own folders)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # scripts/test.sh runs one worker per core: one torch thread each
    # (two workers of two threads on two cores spin against each other); subprocesses inherit it
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


# Tests that take minutes start first, so that scripts/test.sh's two xdist workers end together instead
# of one playing a long test alone at the end of its stage (measured: ~110 s of the slow stage's 22 min).
MINUTES_LONG = ("test_train_every_env.py", "test_train_every_objective.py", "test_vaults_bench.py", "test_nano_repro.py",
                "test_memory_levers.py", "test_peer_trl_multiturn.py")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name not in MINUTES_LONG)  # stable: the rest keep their order


def pytest_configure(config):
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


@pytest.fixture(scope="session", autouse=True)
def agentkit_cache(tmp_path_factory) -> Path:
    """Generated games and default models go to a per-session folder, never the user's cache.

    Set AGENTKIT_TEST_CACHE to reuse generated games across test runs.
    """
    path = Path(os.environ.get("AGENTKIT_TEST_CACHE") or tmp_path_factory.mktemp("agentkit-cache"))
    old = os.environ.get("AGENTKIT_CACHE")
    os.environ["AGENTKIT_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("AGENTKIT_CACHE", None)
    else:
        os.environ["AGENTKIT_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A real tiny Qwen3 model and BPE tokenizer (seed corpus only, so it builds in about a second)."""
    from agentkit.models import init_model

    return init_model(tmp_path_factory.mktemp("models") / "tiny", size="tiny", seed=0, include_textworld=False)


@pytest.fixture(scope="session")
def backend(tiny_model_dir):
    from agentkit.rollout.hf_backend import HFBackend

    return HFBackend(tiny_model_dir, seed=0)


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """The demo plugin distribution (tests/plugin_env) installed into a private folder."""
    import subprocess
    import sys

    target = tmp_path_factory.mktemp("plugin-site")
    source = Path(__file__).parent / "plugin_env"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
    )
    return target


# -- SFT'd students ----------------------------------------------------------------------------
# Read-only once built: a test that trains from one writes its run into its own folder.


def _demos(tiny_model_dir: Path, out: Path, env_id: str, **env_kwargs) -> Path:
    from agentkit.envs import ActionParser, make
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer

    make_env = lambda: make(env_id, max_turns=5, action_parser=ActionParser(), **env_kwargs)  # noqa: E731
    written, lost = write_demonstrations(make_env, load_tokenizer(tiny_model_dir), out, env_id=env_id,
                                         seeds=range(16), split="train")
    assert written == 16 and lost == 0
    return out


def _sft(tiny_model_dir: Path, demos: Path, run: Path, settings: list[str], lr: float = 3e-3) -> Path:
    from agentkit.train import train
    from agentkit.train.config import load_config

    cfg = load_config(None, [*settings, "objective.name=sft", f"train.demos={demos}", "train.steps=12", f"train.lr={lr}",
                             "eval.every=0", f"model={tiny_model_dir}", f"out={run}"])
    train(cfg, show_progress=False)
    return run / "checkpoints" / "step-12"


@pytest.fixture(scope="session")
def demos(tiny_model_dir, tmp_path_factory) -> Path:
    """16 expert episodes of TextWorld Coin Collector level 1."""
    pytest.importorskip("textworld")
    return _demos(tiny_model_dir, tmp_path_factory.mktemp("demos") / "coin1.jsonl", "textworld/coin-v0", level=1)


@pytest.fixture(scope="session")
def sft_model(tiny_model_dir, demos, tmp_path_factory) -> Path:
    """The tiny model after a short SFT on ``demos``: greedy wins coin level 1, sampling is still noisy."""
    coin1 = ["env.id=textworld/coin-v0", "env.kwargs.level=1", "env.max_turns=3", "eval.episodes=4"]
    return _sft(tiny_model_dir, demos, tmp_path_factory.mktemp("sft") / "run", coin1)


# One family (amber: its right exit is always "anchor"), so 12 steps teach the tiny model the answer
# as they teach it "take coin" on Coin Collector level 1.
_VAULTS_AMBER = ["env.id=vaults/vaults-v0", "env.kwargs.families=amber"]


@pytest.fixture(scope="session")
def vaults_demos(tiny_model_dir, tmp_path_factory) -> Path:
    """16 expert episodes of amber vaults (pure Python: no extra, no game generation)."""
    return _demos(tiny_model_dir, tmp_path_factory.mktemp("demos") / "vaults.jsonl", "vaults/vaults-v0",
                  families="amber")


@pytest.fixture(scope="session")
def vaults_sft_model(tiny_model_dir, vaults_demos, tmp_path_factory) -> Path:
    """The tiny model after a short SFT on ``vaults_demos``: greedy wins amber vaults; at temperature
    0.5 about half its actions are valid and its episodes get different distances (GRPO has a gradient)."""
    settings = [*_VAULTS_AMBER, "env.max_turns=4", "eval.episodes=4"]
    return _sft(tiny_model_dir, vaults_demos, tmp_path_factory.mktemp("sft") / "vaults", settings, lr=1e-2)
