"""The training loop: one explicit function, read top to bottom.

    for step: rollouts -> objective.prepare -> (reference logprobs) -> minibatch updates with a
              token budget per micro-batch -> sync weights to the generation backend ->
              periodic greedy evaluation -> checkpoint

Every random choice is a function of (seed, step): the tasks of a step, each episode's sampling
seeds, the minibatch order. So a run resumed from its step-N checkpoint continues exactly as the
uninterrupted run would have.

Several processes (``pip install 'agentkit[distributed]'``): ``torchrun --nproc_per_node N -m
agentkit.cli train ...`` or ``accelerate launch [--config_file CFG] -m agentkit.cli train ...`` run this
same loop once per rank, with DDP or FSDP2 from the launcher's config (``accelerate.Accelerator``;
without CUDA, gloo on CPU: launch with ``--multi_gpu --num_processes N``, as ``--cpu`` starts one
process). Each rank plays its share of the step's tasks (task i on rank i % world: whole GRPO
groups); then every rank holds the whole step batch and computes the loss on its share of each
minibatch's episodes with the whole minibatch's normalizers, so the update is the one-process
update up to float rounding (about 1e-6 in the weights after two steps; not bit for bit).
Evaluation, metrics files, checkpoints (whole weights: one process can resume them, and any
launcher can resume a one-process run) and plots come from the main process.
``agentkit.distributed`` holds the details; one process uses none of it.

Failures. A process killed at any moment (``kill -9``, a lost machine) resumes with ``--resume``
from the last complete checkpoint (``agentkit.checkpoint`` writes them atomically); the metrics,
eval and trajectory files of the steps after it are dropped and played again. An update whose loss
or gradient is NaN/inf is skipped and counted (``skipped_updates``); ``train.max_bad_updates`` in a
row stop the run, after that step's metrics line. An environment that raises, dies or hangs ends
its episode with the error recorded; ``env.max_consecutive_errors`` such episodes in a row stop the
run. ``agentkit.core.faults`` names the moments the crash tests kill the loop at.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from agentkit.checkpoint import check_complete, checkpoints, load_training_state, save_checkpoint
from agentkit.core.errors import ConfigError, TrainingDivergedError
from agentkit.core.faults import fault_active, fault_point
from agentkit.core.jsonl import TrajectoryWriter, read_trajectories
from agentkit.objectives import make_objective, policy_logprobs
from agentkit.rollout import Collector, EpisodeSpec, SamplingParams
from agentkit.rollout.collector import RolloutStats
from agentkit.rollout.hf_backend import HFBackend, load_causal_lm, load_tokenizer
from agentkit.rollout.run import env_factory
from agentkit.rollout.workers import make_env_runner
from agentkit.signals import episode_signals
from agentkit.train_config import TrainConfig, dump_config, load_config


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """On resume, drop lines a crashed run wrote after its last checkpoint (and a last line torn by
    the crash); the file is replaced atomically, so a second crash here loses nothing."""
    if not path.exists():
        return
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    kept = []
    for number, line in enumerate(lines, start=1):
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines):
                break  # torn by the crash
            raise ConfigError(f"--resume: {path} line {number} is not a record with a step ({err}); "
                              "fix or delete that line.") from err
        if step <= last_step:
            kept.append(line)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Write a whole file at once (temporary name, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records))
    os.replace(tmp, path)


def _drop_lost_steps(run_dir: Path, last_step: int) -> None:
    """On resume, remove the trajectory and signal files of the steps after the checkpoint: they are played again."""
    for path in [*(run_dir / "trajectories").glob("step-*.jsonl*"), *(run_dir / "signals").glob("step-*.jsonl*")]:
        number = path.name.removeprefix("step-").split(".")[0]
        if number.isdigit() and int(number) > last_step:
            path.unlink()


def _summary(stats: RolloutStats) -> dict[str, float]:
    return {"return_mean": stats.mean_return, "success_rate": stats.success_rate, "turns_mean": stats.mean_turns,
            "invalid_rate": stats.invalid_rate, "rollout_tokens_per_s": stats.tokens_per_s}


def _make_envs(cfg: TrainConfig, split: str):
    make_env = env_factory(cfg.env.id, split=split, max_turns=cfg.env.max_turns, env_kwargs=cfg.env.kwargs)
    return make_env_runner(make_env, cfg.env.workers, ray=cfg.env.ray)


def evaluate(backend, cfg: TrainConfig, envs, episodes: int, skills=None) -> RolloutStats:
    """Greedy episodes on seeds 0..episodes-1 of the eval split (``skills``: a ``SkillSelector``
    for policies that see retrieved skills)."""
    collector = Collector(backend, envs, env_id=cfg.env.id, split=cfg.env.eval_split,
                          sampling=SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens),
                          context=cfg.rollout.context, window=cfg.rollout.window,
                          show_admissible=cfg.rollout.show_admissible, skills=skills,
                          max_consecutive_errors=cfg.env.max_consecutive_errors)
    return collector.run([EpisodeSpec(seed) for seed in range(episodes)], lambda t: None)


def load_skill_bank(cfg: TrainConfig, run_dir: Path, saved: dict[str, Any] | None):
    """The run's skill bank: the checkpoint's copy on resume, else the configured (or starter) bank.
    The run keeps its own copy at RUN_DIR/skillbank.yaml; the source file is never modified."""
    from agentkit.skillbank import Skill, SkillBank, default_bank_for, resolve_bank

    if saved is not None:
        return SkillBank([Skill.model_validate(s) for s in saved["skills"]], episodes=saved["episodes"],
                         path=run_dir / "skillbank.yaml")
    name = cfg.skills.bank or default_bank_for(cfg.env.id)
    if name is None:
        raise ConfigError(f"objective {cfg.objective.name!r} retrieves skills, and there is no starter bank for "
                          f"{cfg.env.id}: pass --skills BANK (a JSON or YAML skill bank).")
    bank = SkillBank.load(resolve_bank(name))
    bank.path = run_dir / "skillbank.yaml"
    return bank


def prepare_run(cfg: TrainConfig, resume: bool) -> tuple[TrainConfig, Path, int | None]:
    run_dir = Path(cfg.out)
    if resume:
        saved = run_dir / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume: {run_dir} has no config.yaml; nothing to resume.")
        steps = checkpoints(run_dir)
        if steps:
            check_complete(run_dir / "checkpoints" / f"step-{steps[-1]}")  # damaged: refused, never loaded
        elif incomplete := sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")):
            # there, but none complete: never replaced silently
            raise ConfigError(f"--resume: {run_dir} has no complete checkpoint: {incomplete} lack their "
                              "COMPLETE marker (damaged, or written by an agentkit without markers). Move them away "
                              "to start the run again from step 0, or choose another --out.")
        original = load_config(saved)
        # only the length of the run may change on resume
        cfg = original.model_copy(update={"train": original.train.model_copy(update={"steps": cfg.train.steps})})
        last = steps[-1] if steps else 0
        _drop_lost_steps(run_dir, last)
        if not steps:  # stopped before its first checkpoint: the same run again from its initial model
            for name in ("metrics.jsonl", "eval.jsonl"):
                _truncate_jsonl(run_dir / name, 0)
            print(f"--resume: {run_dir} has no complete checkpoint yet; starting it again from step 0 "
                  "with its saved config.", file=sys.stderr)
            return cfg, run_dir, None
        return cfg, run_dir, last
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"Run folder {run_dir} already exists and is not empty. Pass --resume to continue it, or choose another --out.")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    return cfg, run_dir, None


def train(cfg: TrainConfig, *, resume: bool = False, show_progress: bool = True) -> Path:
    """Run (or resume) training; return the run folder."""
    from agentkit.distributed import ranks as start_ranks
    from agentkit.models import ensure_default_model

    ranks = start_ranks()  # one process, or this process's place among several (agentkit.distributed)
    cfg, run_dir, resume_step = ranks.on_main(prepare_run, cfg, resume)
    torch.manual_seed(cfg.seed)
    base_model = Path(cfg.model) if cfg.model else ensure_default_model()
    start = run_dir / "checkpoints" / f"step-{resume_step}" if resume_step is not None else base_model
    tokenizer = load_tokenizer(start)
    policy = load_causal_lm(start)
    objective = make_objective(cfg.objective.name, cfg.objective.args)
    saved_state = json.loads((start / "state.json").read_text()) if resume_step is not None else {}
    # skills and teacher (distillation objectives)
    bank = retriever = None
    if getattr(objective, "uses_skills", False) or cfg.skills.bank:
        from agentkit.skillbank import SkillSelector, make_retriever

        bank = load_skill_bank(cfg, run_dir, saved_state.get("skillbank"))
        retriever = make_retriever(cfg.skills.retrieval, cfg.skills.args)
    if getattr(objective, "needs_teacher", False):
        from agentkit.teachers import make_teacher

        teacher = make_teacher(cfg.teacher.spec or objective.default_teacher, policy=policy, tokenizer=tokenizer,
                               bank=bank, privileged=cfg.teacher.privileged)
        objective = make_objective(cfg.objective.name, cfg.objective.args, teacher=teacher)
    policy_sees_skills = bool(getattr(objective, "policy_sees_skills", False))

    def skill_selector(seed: int, *, sees: bool):
        if bank is None:
            return None
        return SkillSelector(bank, retriever, cfg.skills.k, env_id=cfg.env.id, seed=seed, show_policy=sees)

    reference = None
    if objective.needs_reference:
        reference = load_causal_lm(base_model, device=str(ranks.device))  # the initial policy, frozen
        reference.requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.train.lr, betas=cfg.train.betas,
                                  weight_decay=cfg.train.weight_decay)
    first_step = 0
    # in a row, across steps: non-finite updates (train.max_bad_updates), env errors (env.max_consecutive_errors)
    bad_update_streak = saved_state.get("bad_update_streak", 0)  # absent in checkpoints of older versions
    env_error_streak = saved_state.get("env_error_streak", 0)
    if resume_step is not None:  # after every model is loaded: restores the RNG the run had
        first_step = load_training_state(start, optimizer)["step"]
        for name in ("metrics.jsonl", "eval.jsonl"):
            if ranks.is_main:  # the main process writes the run's files
                _truncate_jsonl(run_dir / name, first_step)
    # model: what the update runs (DDP/FSDP-wrapped under a launcher); sampler: the whole weights
    model, optimizer, sampler = ranks.prepare(policy, optimizer)

    if cfg.rollout.backend == "vllm":  # an engine of its own: weights synced after every update
        from agentkit.rollout.vllm_backend import VLLMBackend

        backend = VLLMBackend(start, tokenizer, seed=cfg.seed, name=str(base_model), **cfg.rollout.vllm)
    else:  # the backend samples with the very module being trained: syncing weights is free here
        backend = HFBackend(sampler, tokenizer, seed=cfg.seed, name=str(base_model), device=str(ranks.device))
    demos = read_trajectories(cfg.train.demos) if objective.uses_demonstrations else None
    train_envs = None if demos is not None else _make_envs(cfg, "train")
    eval_envs = _make_envs(cfg, cfg.env.eval_split) if ranks.is_main else None
    (run_dir / "trajectories").mkdir(exist_ok=True)
    base_sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                   max_new_tokens=cfg.rollout.max_new_tokens)
    from tqdm import tqdm

    bar = tqdm(total=cfg.train.steps, initial=first_step, desc=f"train {cfg.objective.name}", unit="step",
               disable=not (show_progress and ranks.is_main))
    try:
        for step in range(first_step, cfg.train.steps):
            started = time.perf_counter()
            rng = random.Random(f"{cfg.seed}:{step}")
            # 1. rollouts (or this step's demonstrations)
            policy.eval()
            if demos is not None:
                trajectories = rng.sample(demos, min(cfg.train.demos_per_step, len(demos)))
                rollout = RolloutStats()
                for t in trajectories:
                    rollout.add(t)
            else:
                first_task = step * cfg.rollout.tasks_per_step
                tasks = ranks.shard(range(first_task, first_task + cfg.rollout.tasks_per_step))  # whole groups
                specs = [EpisodeSpec(task, k) for task in tasks for k in range(cfg.rollout.group_size)]
                collector = Collector(backend, train_envs, env_id=cfg.env.id, split="train",
                                      sampling=replace(base_sampling, seed=cfg.seed * 1_000_003 + step),
                                      context=cfg.rollout.context, window=cfg.rollout.window,
                                      show_admissible=cfg.rollout.show_admissible,
                                      skills=skill_selector(cfg.seed * 1_000_003 + step, sees=policy_sees_skills),
                                      max_consecutive_errors=cfg.env.max_consecutive_errors,
                                      consecutive_errors=env_error_streak)
                path = run_dir / "trajectories" / f"step-{step + 1}.jsonl"
                with TrajectoryWriter(path, mode="overwrite") if ranks.is_main else contextlib.nullcontext() as writer:
                    played = []

                    def keep(t, writer=writer, played=played, step=step):
                        if writer is not None:
                            writer.write(t)
                        played.append(t)
                        fault_point("rollout", step + 1)  # tests: killed with part of the step written

                    rollout = collector.run(specs, keep)
                    env_error_streak = collector.consecutive_errors
                    trajectories, rollout = ranks.gather(played, rollout)  # every rank's episodes
                    mine = {t.id for t in played}
                    for t in trajectories:
                        if writer is not None and t.id not in mine:
                            writer.write(t)
                trajectories.sort(key=lambda t: t.id)  # arrival order depends on timing; training must not
                if bank is not None:  # UCB statistics: every episode's return, in a fixed order
                    for t in trajectories:
                        bank.record_episode(t.skills, t.episode_return)
            # 2. objective -> token batch (teacher scores and turn judgments included; no gradients)
            prepare_started = time.perf_counter()
            batch = objective.prepare(trajectories)
            prepare_s = time.perf_counter() - prepare_started
            if ranks.is_main and cfg.log.signal_episodes:  # per-token teacher signals of a few episodes
                records = episode_signals(batch, trajectories, episodes=cfg.log.signal_episodes,
                                          rng=random.Random(f"{cfg.seed}:{step}:signals"))
                if records:
                    _write_jsonl(run_dir / "signals" / f"step-{step + 1}.jsonl", records)
            if reference is not None:
                with torch.no_grad():
                    batch = replace(batch, ref_logprobs=policy_logprobs(reference, ranks.to_device(batch)).cpu())
            # 4. minibatch updates with a token budget per micro-batch
            if cfg.rollout.vllm_sleep:
                backend.sleep(level=1)  # give the accelerator's memory to the update
            policy.train()
            losses, objective_metrics, grad_norms, skipped = [], {}, [], 0
            # tests: a NaN loss, or a finite loss with an overflowed gradient, as a diverging run gets
            nan_fault, inf_grad_fault = fault_active("loss.nan", step + 1), fault_active("grad.inf", step + 1)
            episodes = torch.unique(batch.episode_index).tolist()
            for _ in range(cfg.train.epochs):
                order = episodes[:]
                rng.shuffle(order)
                for chunk in range(cfg.train.minibatches):
                    chosen = set(order[chunk::cfg.train.minibatches])
                    rows = [r for r in range(batch.num_rows) if int(batch.episode_index[r]) in chosen]
                    minibatch = batch.rows(rows).with_normalizers()
                    optimizer.zero_grad(set_to_none=True)
                    total = 0.0
                    # this rank's share of the minibatch (all of it in one process)
                    for micro in ranks.micro_batches(model, minibatch, cfg.train.micro_batch_tokens):
                        if getattr(objective, "needs_support", False):
                            logprobs, support = policy_logprobs(model, micro, support=True)
                            loss, metrics = objective.loss(micro, logprobs, support)
                        else:
                            loss, metrics = objective.loss(micro, policy_logprobs(model, micro))
                        if nan_fault:
                            loss = loss * float("nan")
                        ranks.backward(loss)
                        total += float(loss.detach())
                        share = micro.num_response_tokens / max(1, minibatch.num_response_tokens)
                        for key, value in metrics.items():
                            objective_metrics[key] = objective_metrics.get(key, 0.0) + share * value
                    if inf_grad_fault:
                        next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")
                    total = ranks.sum(total)
                    clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else float("inf")
                    norm = ranks.clip_grad_norm_(model, clip)
                    if not (math.isfinite(norm) and math.isfinite(total)):
                        skipped += 1  # a NaN/inf loss or gradient never reaches the weights
                        bad_update_streak += 1
                        optimizer.zero_grad(set_to_none=True)
                        continue
                    bad_update_streak = 0
                    fault_point("update", step + 1)  # tests: killed between a backward and its optimizer step
                    optimizer.step()
                    losses.append(total)
                    grad_norms.append(norm)
            updates = max(1, cfg.train.epochs * cfg.train.minibatches)
            objective_metrics = ranks.sum_metrics(objective_metrics)
            policy.eval()
            # 5. weights are shared with the HF backend (but for FSDP's sampling copy); vLLM loads them
            ranks.sync_weights(model, sampler)
            if cfg.rollout.vllm_sleep:
                backend.wake_up()
            sync_error = {}
            if hasattr(backend, "sync_weights"):
                backend.sync_weights(sampler)
                probe = batch.input_ids[0, : int(batch.attention_mask[0].sum())].tolist()
                sync_error = {"vllm_sync_error": backend.sync_error(sampler, probe)}
            record = {"step": step + 1, "loss": sum(losses) / max(1, len(losses)) if losses else float("nan"),
                      **_summary(rollout), "tokens": batch.num_response_tokens,
                      "grad_norm": sum(grad_norms) / max(1, len(grad_norms)), "skipped_updates": skipped,
                      "lr": cfg.train.lr, "step_s": 0.0, "data": "demonstrations" if demos is not None else "rollouts",
                      "prepare_s": prepare_s, **batch.metrics, **sync_error,
                      **{k: v / updates for k, v in objective_metrics.items()}}
            # 6. periodic greedy evaluation (files: the main process only)
            last = step + 1 == cfg.train.steps
            if ranks.is_main and (last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0)):
                stats = evaluate(backend, cfg, eval_envs, cfg.eval.episodes,
                                 skills=skill_selector(cfg.seed, sees=True) if policy_sees_skills else None)
                _append_jsonl(run_dir / "eval.jsonl", {"step": step + 1, "split": cfg.env.eval_split,
                                                      "episodes": stats.episodes, **_summary(stats)})
            record["step_s"] = time.perf_counter() - started
            if ranks.is_main:
                _append_jsonl(run_dir / "metrics.jsonl", record)
            if cfg.train.max_bad_updates and bad_update_streak >= cfg.train.max_bad_updates:
                data_file = cfg.train.demos if demos is not None else run_dir / "trajectories" / f"step-{step + 1}.jsonl"
                raise TrainingDivergedError(
                    f"{bad_update_streak} updates in a row had a NaN or inf loss or gradient (the last at step "
                    f"{step + 1}; train.max_bad_updates={cfg.train.max_bad_updates}), so the run stops. Each was "
                    f"skipped (skipped_updates in {run_dir / 'metrics.jsonl'}) and the weights are those of the "
                    f"last finite update. Start again with a lower train.lr (now {cfg.train.lr:g}) or a tighter "
                    f"train.grad_clip (now {cfg.train.grad_clip:g}); check {data_file} and the objective's "
                    f"settings for inf/NaN rewards; or set train.max_bad_updates=0 to never stop.")
            # 7. checkpoint
            if last or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
                state = {"step": step + 1, "skillbank": bank.to_dict() if bank is not None else None,
                         "bad_update_streak": bad_update_streak, "env_error_streak": env_error_streak}
                whole_optimizer = ranks.optimizer_state(model, optimizer)  # FSDP: gathered from every rank
                if ranks.is_main:
                    save_checkpoint(run_dir, step + 1, sampler, tokenizer, optimizer, state, keep=cfg.checkpoint.keep,
                                    optimizer_state=whole_optimizer)
            if bank is not None and ranks.is_main:
                bank.save()
            ranks.barrier()
            bar.update(1)
            bar.set_postfix(success=f"{record['success_rate']:.2f}", loss=f"{record['loss']:.3f}")
    finally:
        bar.close()
        if train_envs is not None:
            train_envs.close()
        if eval_envs is not None:
            eval_envs.close()
        if hasattr(backend, "close"):
            backend.close()
    if ranks.is_main:
        from agentkit.plots import plot_runs

        plot_runs([run_dir], run_dir / "curves.png")
    ranks.barrier()
    ranks.close()
    return run_dir
