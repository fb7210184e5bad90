"""Shared fixtures: a tiny real model built locally, and a private cache for generated games."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
