"""``agentkit rollout`` as a library call: validate, build, collect, write, summarize."""

from __future__ import annotations

import functools
import os
from datetime import datetime
from pathlib import Path

from agentkit.envs import ActionParser, make
from agentkit.envs.registry import lookup, parses_own_actions
from agentkit.rollout.backend import SamplingParams
from agentkit.rollout.collector import Collector, EpisodeSpec, RolloutStats
from agentkit.rollout.config import RolloutConfig
from agentkit.rollout.workers import make_env_runner

from agentkit.core.errors import AgentkitError, ConfigError, ModelError, OutputExistsError
from agentkit.core.jsonl import TrajectoryWriter


def default_out_path() -> Path:
    return Path("runs") / f"rollout-{datetime.now().strftime('%Y%m%d-%H%M%S')}.jsonl"


def check_output(path: Path, *, append: bool, overwrite: bool) -> None:
    """Refuse before any work is done: existing file without --append/--overwrite, unwritable place."""
    if path.is_dir():
        raise ConfigError(f"--out {path} is a directory; give a file name, e.g. {path / 'trajectories.jsonl'}.")
    if path.exists() and path.stat().st_size > 0 and not (append or overwrite):
        raise OutputExistsError(f"Output file {path} already exists. Pass --append to add to it or --overwrite to replace it.")
    parent = path.parent if str(path.parent) else Path(".")
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"Cannot write {path}: {existing} is not a writable directory.")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"Cannot write {path}: the file is not writable.")


def env_factory(env_id: str, *, split: str, max_turns: int, env_kwargs: dict) -> functools.partial:
    """A picklable builder of one wrapped environment (worker processes call it)."""
    parser = None if parses_own_actions(env_id) else ActionParser()
    return functools.partial(make, env_id, max_turns=max_turns, action_parser=parser, split=split, **env_kwargs)


def run_rollout(cfg: RolloutConfig, model_dir: Path, *, progress=None, out: Path | None = None) -> tuple[RolloutStats, Path]:
    """Play ``cfg.episodes`` tasks ``cfg.group_size`` times each and write the trajectories."""
    out = Path(out or cfg.out or default_out_path())
    check_output(out, append=cfg.append, overwrite=cfg.overwrite)
    lookup(cfg.env)  # unknown id -> did-you-mean, before anything is loaded
    if not (model_dir / "config.json").exists():
        raise ModelError(f"--model {model_dir}: no model there (no config.json). Build one with: agentkit model init --out {model_dir}")
    if cfg.ray is not None:
        from agentkit.rollout.ray_workers import connect

        connect(cfg.ray)  # a bad address fails here, before a model is loaded

    from agentkit.rollout.backends import make_backend

    backend = make_backend(cfg.backend, model_dir, seed=cfg.seed, device=cfg.device, base_url=cfg.base_url,
                           served_model=cfg.served_model, api=cfg.api, vllm_args=cfg.vllm_args,
                           concurrency=cfg.concurrency)
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                              max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    make_env = env_factory(cfg.env, split=cfg.split, max_turns=cfg.max_turns, env_kwargs=cfg.env_kwargs)
    make_env().close()  # bad env settings fail here, before the output file is touched
    envs = make_env_runner(make_env, cfg.env_workers, ray=cfg.ray, step_timeout_s=cfg.step_timeout)
    selector = None
    if cfg.skills:
        from agentkit.skillbank import SkillBank, SkillSelector, make_retriever, resolve_bank

        selector = SkillSelector(SkillBank.load(resolve_bank(cfg.skills)), make_retriever(cfg.retrieval), cfg.skills_k,
                                 env_id=cfg.env, seed=cfg.seed, show_policy=True)
    collector = Collector(backend, envs, env_id=cfg.env, split=cfg.split, sampling=sampling,
                          context=cfg.context, window=cfg.window, show_admissible=cfg.show_admissible,
                          max_in_flight=cfg.max_in_flight, skills=selector)
    specs = [EpisodeSpec(seed=cfg.seed + task, sample=s) for task in range(cfg.episodes) for s in range(cfg.group_size)]
    mode = "append" if cfg.append else "overwrite" if cfg.overwrite else "new"
    try:
        writer = TrajectoryWriter(out, mode=mode)
    except AgentkitError:
        raise
    except OSError as err:
        raise ConfigError(f"Cannot write {out}: {err}") from err
    try:
        with writer:
            stats = collector.run(specs, writer.write, progress=progress)
    finally:
        collector.close()
    return stats, out
