"""The training loop: one explicit loop, read top to bottom, each phase a function of this file (the
update's in ``agentkit.train.update``, which the default teacher's fine-tuning runs too; the run folder's
lifecycle, starting a run or checking a resumed one, in ``agentkit.train.run_folder``). Import it as
``agentkit.train``: nothing else imports this module.

    setup, then for step:
        collect     rollouts (or this step's demonstrations; async: the step file the generator
                    process wrote, ``agentkit.train.async_rollout``)
        score       the teacher and the judge (no gradients), the skills' credit for UCB,
                    objective.prepare -> token batch, reference logprobs
        update      minibatch updates with a token budget per micro-batch (``agentkit.train.update``)
        sync        weights to the generation backend (async: published to the generator)
        evaluate    periodic greedy evaluation
        checkpoint  atomic checkpoint of weights, optimizer, RNG and loop state

Every random choice is a function of (seed, step): the tasks of a step, each episode's sampling
seeds, the minibatch order. So a run resumed from its step-N checkpoint continues exactly as the
uninterrupted run would have. Async runs (``--async``) depend on timing too (which weights sampled
which turn); resumed, they train on the step files their generator had written, as written.

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
``agentkit.train.distributed`` holds the details; one process uses none of it.

Failures. A process killed at any moment (``kill -9``, a lost machine) resumes with ``--resume``
from the last complete checkpoint (``agentkit.train.checkpoint`` writes them atomically); the metrics,
eval and trajectory files of the steps after it are dropped and played again. A full disk stops
the run with one ``DiskFullError`` (the file, the space left, the ``--resume`` command), every line
and checkpoint already written whole. An update whose loss
or gradient is NaN/inf is skipped and counted (``skipped_updates``); ``train.max_bad_updates`` in a
row stop the run, after that step's metrics line. An environment that raises, dies or hangs ends
its episode with the error recorded; ``env.max_errors`` such episodes in a row stop the run, and
a step whose every episode failed stops it with the episodes' own error. ``agentkit.core.faults`` names the moments the crash tests kill the loop at.
"""

from __future__ import annotations

import contextlib
import json
import random
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from agentkit.core import runs
from agentkit.core.errors import (
    ConfigError,
    DiskFullError,
    EnvError,
    TrainingDivergedError,
    disk_full,
    no_space,
)
from agentkit.core.evalstats import paired_difference
from agentkit.core.faults import fault_point
from agentkit.core.jsonl import TrajectoryWriter, read_records, read_trajectories
from agentkit.core.settings import GenerationSettings
from agentkit.core.trajectory import Trajectory
from agentkit.objectives import Capabilities, policy_logprobs
from agentkit.objectives.common import off_policy_correction
from agentkit.report.trackers import Trackers, open_trackers
from agentkit.rollout import EpisodeSpec
from agentkit.rollout.backends import HFBackendSettings
from agentkit.rollout.collector import RolloutStats
from agentkit.rollout.export import read_source
from agentkit.rollout.hf_backend import PRECISIONS, load_causal_lm, load_tokenizer
from agentkit.rollout.report import eval_report
from agentkit.rollout.run import (
    make_collector,
    make_envs,
    sampling_params,
)
from agentkit.train.async_rollout import generator_stats
from agentkit.train.checkpoint import (
    checkpoints,
    load_training_state,
    save_checkpoint,
)
from agentkit.train.config import TrainConfig
from agentkit.train.episodes import (
    episode_specs,
    load_skill_bank,
    sampling_seed,
    skill_selector,
    step_tasks,
    uses_skills,
)
from agentkit.train.lora import BaseView
from agentkit.train.policy import engine_sync, load_policy, policy_backend, samples_policy_itself
from agentkit.train.run_folder import NothingToDo, append_jsonl, prepare_run, truncate_jsonl, write_jsonl
from agentkit.train.scoring import build_teacher_and_judge, score_step
from agentkit.train.signals import episode_signals
from agentkit.train.skill_credit import skill_credits
from agentkit.train.update import step_lr, update
from agentkit.train.watch import Watch, signal_share

# eval_report's figures that eval.jsonl records beside _summary's
_EVAL_REPORT_KEYS = ("success_ci95", "mean_turns_solved", "by_task_type", "won_by_seed")


def _summary(stats: RolloutStats) -> dict[str, float]:
    return {"return_mean": stats.mean_return, "success_rate": stats.success_rate, "turns_mean": stats.mean_turns,
            "invalid_rate": stats.invalid_rate, "rollout_tokens_per_s": stats.tokens_per_s}


@dataclass
class Run:
    """Everything the phases share, built once by ``setup``."""

    cfg: TrainConfig
    run_dir: Path
    ranks: Any  # agentkit.train.distributed: one process, or this process's place among several
    tokenizer: Any
    policy: torch.nn.Module  # the trained weights
    model: Any  # what the update runs (DDP/FSDP-wrapped under a launcher)
    sampler: torch.nn.Module  # the whole weights the backend samples with
    optimizer: torch.optim.Optimizer
    backend: Any
    objective: Any
    needs: Capabilities  # what the objective needs from the loop
    teacher: Any = None
    judge: Any = None
    bank: Any = None
    retriever: Any = None
    reference: torch.nn.Module | None = None
    demos: list | None = None
    train_envs: Any = None
    eval_envs: Any = None
    first_step: int = 0
    bad_update_streak: int = 0  # in a row, across steps: non-finite updates (train.max_bad_updates)
    env_error_streak: int = 0  # and episodes ended by an env error (env.max_errors)
    last_eval: dict[str, Any] | None = None
    last_checkpoint: Path | None = None
    generator: Any = None  # agentkit.train.async_rollout.Generator: the async run's generator process
    trainer_old_logprobs: bool = False  # pi_old from the trainer's forward (train.old_logprobs)
    trackers: Trackers = field(default_factory=Trackers)  # log.report_to (the main process's; none elsewhere)

    def skill_selector(self, seed: int, *, sees: bool):
        return skill_selector(self.cfg, self.bank, self.retriever, seed, sees=sees)

    @property
    def sleeps_during_updates(self) -> bool:
        """The backend's memory is freed for each update (``sleep``) and taken back before the sync."""
        return self.backend.can_sleep and self.cfg.backend.sleep_during_updates

    def close(self) -> None:
        self.trackers.close()
        if self.generator is not None:
            self.generator.close()
        for envs in (self.train_envs, self.eval_envs):
            if envs is not None:
                envs.close()
        self.backend.close()


@dataclass(frozen=True)
class TrainResult:
    """What a finished ``train`` call reports."""

    run_dir: Path
    steps: int
    final_eval: dict[str, Any] | None
    checkpoint: Path | None
    start_eval: dict[str, Any] | None = None  # eval.jsonl's step 0: the policy before any update
    teacher: str | None = None  # the teacher the objective distilled from (teacher.spec), if any

    def summary(self) -> str:
        lines = [f"run folder: {self.run_dir} (metrics.jsonl, eval.jsonl, checkpoints/, curves.png)"]
        if self.teacher is not None:
            from agentkit.train.default_teacher import describe_teacher

            lines.append(f"teacher: {describe_teacher(self.teacher)}")
        if self.final_eval is not None:
            end = self.final_eval
            lines.append(f"eval ({end['split']} split, {end['episodes']} greedy episodes): success "
                         + (f"{_success(self.start_eval)} at the start (step 0), " if self.start_eval else "")
                         + f"{_success(end)} at the end (step {end['step']})")
            if self.start_eval is not None:
                lines.append("  " + learned(self.start_eval, end))
        if self.checkpoint is not None:
            lines.append(f"checkpoint: {self.checkpoint} (use it with --model {self.run_dir})")
        return "\n".join(lines)


def _success(record: dict[str, Any]) -> str:
    low, high = record.get("success_ci95") or (None, None)
    return f"{record['success_rate']:.1%}" + (f" [{low:.1%}, {high:.1%}]" if low is not None else "")


def learned(start: dict[str, Any], end: dict[str, Any]) -> str:
    """Did the run learn? The mean paired difference end - start over the evaluation's seeds (the same
    tasks, greedy both times) with its 95% interval, and what it says."""
    a, b = end.get("won_by_seed"), start.get("won_by_seed")
    if not a or not b or len(a) != len(b):
        return "(no per-episode results to pair: the change has no interval)"
    if len(a) < 2:
        return (f"change {a[0] - b[0]:+.0%} on one task: no interval (pass --eval-episodes 16 or more to tell "
                "a change from noise)")
    mean, low, high = paired_difference(a, b)
    verdict = ("the policy improved (the interval is above 0)" if low > 0 else
               "the policy got worse (the interval is below 0)" if high < 0 else
               "no change shown: the interval holds 0 (more --eval-episodes or --steps would tell)")
    return f"change {mean:+.1%} [{low:+.1%}, {high:+.1%}] (95%, paired over {len(a)} tasks): {verdict}"


def setup(cfg: TrainConfig, resume: bool, given: dict[str, Any] | None) -> Run:
    """Run folder, models, optimizer, backend, objective with its teacher and judge, environments."""
    from agentkit.models import ensure_default_model, resolve_model_dir
    from agentkit.train.distributed import ranks as start_ranks

    ranks = start_ranks()
    cfg, run_dir, resume_step = ranks.on_main(prepare_run, cfg, resume, given)
    if cfg.async_rl.enabled and ranks.world > 1:
        raise ConfigError(f"--async runs one trainer process with one generator process; this launch has {ranks.world} "
                          "processes. Launch one process, or drop --async.")
    torch.manual_seed(cfg.seed)
    if cfg.async_rl.enabled:  # the trainer's share of the cores; the generator sets its own
        from agentkit.train.async_rollout import default_threads

        torch.set_num_threads(default_threads(cfg.async_rl.trainer_threads,
                                              default_threads(cfg.async_rl.generator_threads, 0)))
    base_model = resolve_model_dir(cfg.model) if cfg.model else ensure_default_model()
    start = runs.checkpoint_dir(run_dir, resume_step) if resume_step is not None else base_model
    tokenizer = load_tokenizer(start)
    policy = load_policy(start, cfg.train, resumed=resume_step is not None, device=ranks.device)
    objective = cfg.objective.build()
    needs = objective.requirements()
    saved_state = json.loads((start / "state.json").read_text()) if resume_step is not None else {}
    bank = retriever = None
    if uses_skills(cfg, needs):
        from agentkit.skillbank import make_retriever

        bank = load_skill_bank(cfg, run_dir, saved_state.get("skillbank"))
        retriever = make_retriever(cfg.skills.retrieval, cfg.skills.args)
    # with LoRA the base weights are the policy's own with its adapter off: the reference (the initial
    # policy) and a model:DIR teacher that is the base model read them, with no second copy
    base_view = BaseView(policy, base_model) if cfg.train.lora.rank else None
    teacher, judge = build_teacher_and_judge(needs, teacher_spec=cfg.teacher.spec, policy=policy, tokenizer=tokenizer,
                                             bank=bank, privileged=cfg.teacher.privileged, objective=cfg.objective.name,
                                             dtype=PRECISIONS[cfg.train.precision],
                                             device=cfg.teacher.device or str(ranks.device), base=base_view)
    reference = None
    if needs.needs_reference:  # the initial policy, frozen
        reference = base_view or load_causal_lm(base_model, dtype=PRECISIONS[cfg.train.precision], device=str(ranks.device))
        reference.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.train.lr,
                                  betas=cfg.train.betas, weight_decay=cfg.train.weight_decay)
    first_step = 0
    if resume_step is not None:  # after every model is loaded: restores the RNG the run had
        first_step = load_training_state(start, optimizer)["step"]
        for name in (runs.METRICS, runs.EVAL):
            if ranks.is_main:  # the main process writes the run's files
                truncate_jsonl(run_dir / name, first_step)
    model, optimizer, sampler = ranks.prepare(policy, optimizer)
    # an async run's generator process holds the configured backend: its trainer evaluates with the
    # trained module itself; else an engine of its own gets the weights after every update (or the
    # backend samples with the very module being trained: syncing weights is free)
    sampling = HFBackendSettings() if cfg.async_rl.enabled else cfg.backend
    backend = policy_backend(sampling, module=sampler, folder=start, train=cfg.train, resumed=resume_step is not None,
                             tokenizer=tokenizer, seed=cfg.seed, name=str(base_model), device=str(ranks.device))
    if backend.syncs_weights and cfg.train.lora.rank:  # the engine holds the base: the adapter (a resumed run's) goes to it now
        engine_sync(backend, sampler, cfg.train)
    demos = read_source(cfg.train.demos) if needs.uses_demonstrations else None
    if demos is not None:
        _check_token_ids(demos, len(tokenizer), cfg.train.demos)
    runs.trajectories_dir(run_dir).mkdir(exist_ok=True)
    generator = None
    if cfg.async_rl.enabled:
        from agentkit.train.async_rollout import Generator

        generator = Generator(cfg, run_dir, start, policy, first_step)
    old_from = cfg.train.old_logprobs
    trainer_old = old_from == "trainer" or (old_from == "auto" and (not samples_policy_itself(cfg.backend)
                                                                    or cfg.async_rl.enabled
                                                                    or cfg.train.precision != "fp32"))
    trackers = Trackers()  # only the main process reports
    if ranks.is_main:
        trackers = open_trackers(cfg.log.report_to, run_dir, config=cfg.model_dump(mode="json"), first_step=first_step,
                                 project=cfg.log.project, table_episodes=cfg.log.table_episodes, seed=cfg.seed)
    return Run(cfg=cfg, run_dir=run_dir, ranks=ranks, tokenizer=tokenizer, policy=policy, model=model, sampler=sampler,
               optimizer=optimizer, backend=backend, objective=objective, needs=needs, teacher=teacher, judge=judge,
               bank=bank, retriever=retriever, reference=reference, demos=demos,
               train_envs=None if demos is not None or generator is not None else make_envs(cfg.env, "train"),
               eval_envs=make_envs(cfg.env, cfg.eval.split) if ranks.is_main else None,
               first_step=first_step, bad_update_streak=saved_state.get("bad_update_streak", 0),
               env_error_streak=saved_state.get("env_error_streak", 0), generator=generator,
               trainer_old_logprobs=trainer_old, trackers=trackers)


def _check_token_ids(trajectories: list, vocab_size: int, path: str) -> None:
    """Refuse trajectories holding ids this tokenizer does not have (an ``IndexError`` mid-step otherwise)."""
    for t in trajectories:
        for i, turn in enumerate(t.turns):
            bad = next((x for ids in (turn.context_ids, turn.response_ids) for x in ids if x >= vocab_size), None)
            if bad is not None:
                raise ConfigError(f"{path}: episode {t.id!r}, turn {i} holds token id {bad}, outside this model's "
                                  f"vocabulary (0..{vocab_size - 1}): the file was written with another tokenizer. "
                                  "Record the demonstrations again with this model (agentkit demos --model ...).")


def collect(run: Run, step: int, rng: random.Random) -> tuple[list, RolloutStats]:
    """This step's episodes (every rank's, sorted by id) or demonstrations, and their statistics."""
    cfg, ranks = run.cfg, run.ranks
    run.policy.eval()
    if run.demos is not None:
        trajectories = rng.sample(run.demos, min(cfg.train.demos_per_step, len(run.demos)))
        stats = RolloutStats()
        for t in trajectories:
            stats.add(t)
        return trajectories, stats
    if run.generator is not None:  # async: the generator process played (or is playing) this step
        path, waited = run.generator.wait_for(step)
        trajectories = sorted(read_trajectories(path, strict=True), key=lambda t: t.id)
        stats = RolloutStats(wall_s=waited)
        for t in trajectories:
            stats.add(t)
        _check_played(trajectories, path, cfg, step)
        return trajectories, stats
    specs = episode_specs(cfg.rollout, ranks.shard(step_tasks(cfg.rollout, step)))  # this rank's share: whole groups
    seed = sampling_seed(cfg.seed, step)
    collector = make_collector(run.backend, run.train_envs, env=cfg.env, split="train",
                               sampling=sampling_params(cfg.sampling, seed), context=cfg.context,
                               skills=run.skill_selector(seed, sees=run.needs.policy_sees_skills),
                               consecutive_errors=run.env_error_streak, policy_version=lambda: step)
    path = runs.trajectory_file(run.run_dir, step + 1)
    with TrajectoryWriter(path, mode="overwrite") if ranks.is_main else contextlib.nullcontext() as writer:
        played = []

        def keep(t, writer=writer, played=played, step=step):
            if writer is not None:
                writer.write(t)
            played.append(t)
            fault_point("rollout", step + 1)  # tests: killed with part of the step written

        stats = collector.run(specs, keep)
        if cfg.env.reset_ahead and step + 1 < cfg.train.steps:  # the next step's resets run while this one trains
            collector.reset_ahead(episode_specs(cfg.rollout, ranks.shard(step_tasks(cfg.rollout, step + 1))))
        run.backend.reset_prefix_cache()  # the step's episodes are over: kept rows would only hold memory
        run.env_error_streak = collector.consecutive_errors
        trajectories, stats = ranks.gather(played, stats)  # every rank's episodes
        mine = {t.id for t in played}
        for t in trajectories:
            if writer is not None and t.id not in mine:
                writer.write(t)
    trajectories.sort(key=lambda t: t.id)  # arrival order depends on timing; training must not
    _check_played(trajectories, path, cfg, step)
    return trajectories, stats


def _check_played(trajectories: list, path: Path, cfg: TrainConfig, step: int) -> None:
    if trajectories and all(t.error and not t.turns for t in trajectories):
        raise EnvError(f"every episode of step {step + 1} failed before its first turn ({path}); the first one's "
                       f"error: {trajectories[0].error}. Check --env and --env-kwargs (agentkit envs check "
                       f"{cfg.env.id}).")


def score(run: Run, trajectories: list, step: int):
    """Teacher scores and turn judgments (the loop's, without gradients), and with them each episode's
    credit to its skills (``agentkit.train.skill_credit``: the return when the policy sees the skills, the
    teacher's lift when only the teacher does); then the objective's token batch with the reference
    policy's logprobs; writes a few episodes' per-token signals."""
    cfg, ranks = run.cfg, run.ranks
    started = time.perf_counter()
    scores = score_step(run.needs, run.teacher, run.judge, trajectories, step=step + 1)
    batch = run.objective.prepare(trajectories, scores)
    if run.bank is not None:  # UCB statistics: what each episode credits its skills with, in a fixed order
        for t, credit in zip(trajectories, skill_credits(run.needs, trajectories, scores, batch), strict=True):
            run.bank.record_episode(t.skills, credit)
    prepare_s = time.perf_counter() - started
    if ranks.is_main and cfg.log.signal_episodes:  # per-token teacher signals of a few episodes
        records = episode_signals(batch, trajectories, episodes=cfg.log.signal_episodes,
                                  rng=random.Random(f"{cfg.seed}:{step}:signals"))
        if records:
            write_jsonl(runs.signals_file(run.run_dir, step + 1), records)
    if run.reference is not None:
        with torch.no_grad():
            batch = replace(batch, ref_logprobs=policy_logprobs(run.reference, ranks.to_device(batch)).cpu())
    if run.trainer_old_logprobs and run.demos is None:  # pi_old under the trainer's numerics, corrected
        old = no_grad_logprobs(run.model, batch, cfg.train.micro_batch_tokens, ranks)
        batch = off_policy_correction(batch, old, cfg.train.is_correction, cfg.train.is_cap)
    if run.demos is None:
        batch = replace(batch, metrics={**batch.metrics, **staleness(trajectories, step)})
    return batch, prepare_s


def no_grad_logprobs(model, batch, max_tokens: int, ranks) -> torch.Tensor:
    """[B, L] the logprobs of ``batch``'s targets under ``model``, without gradients, in chunks of
    consecutive rows of at most ``max_tokens`` padded tokens (one row at least)."""
    out = torch.zeros_like(batch.old_logprobs)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    start = 0
    with torch.no_grad():
        while start < batch.num_rows:
            end = start + 1
            while end < batch.num_rows and max(lengths[start:end + 1]) * (end + 1 - start) <= max_tokens:
                end += 1
            chunk = batch.rows(range(start, end))
            values = policy_logprobs(model, ranks.to_device(chunk)).float().cpu()
            out[start:end, : values.shape[1]] = values
            start = end
    return out


def staleness(trajectories: list, step: int) -> dict[str, float]:
    """How many policy versions behind the trainer (``step`` updates made) each turn was sampled:
    ``staleness_mean``, ``staleness_max`` and the share of turns at each value (``staleness_0``, ...);
    turns sampled by weights newer than the trainer's (a resumed async run trains on episodes its
    lost steps' weights played) count as 0."""
    lags = [max(0, step - turn.policy_version) for t in trajectories for turn in t.turns if turn.policy_version is not None]
    if not lags:
        return {}
    shares = {f"staleness_{lag}": lags.count(lag) / len(lags) for lag in sorted(set(lags))}
    return {"staleness_mean": sum(lags) / len(lags), "staleness_max": float(max(lags)), **shares}


def sync(run: Run, batch, step: int) -> dict[str, float]:
    """The updated weights to the generation backend (shared with the HF backend already, but for
    FSDP's sampling copy; vLLM loads them and the probe measures how far its logprobs moved), or
    (async) published to the generator, which loads them between its turns."""
    if run.generator is not None:
        return {"publish_s": run.generator.publish(run.policy, step + 1), **generator_stats(run.run_dir, step)}
    run.ranks.sync_weights(run.model, run.sampler)
    if run.sleeps_during_updates:
        run.backend.wake_up()
    if not run.backend.syncs_weights:
        return {}
    weights = engine_sync(run.backend, run.sampler, run.cfg.train)
    probe = batch.input_ids[0, : int(batch.attention_mask[0].sum())].tolist()
    return {"vllm_sync_error": run.backend.sync_error(weights, probe)}


def evaluate(backend, cfg: TrainConfig, envs, episodes: int, skills=None) -> tuple[RolloutStats, dict[str, Any]]:
    """Greedy episodes on seeds 0..episodes-1 of the held-out split (``skills``: a ``SkillSelector``
    for policies that see retrieved skills): the rollout's statistics and ``eval_report``'s figures
    (success with its 95% Wilson interval, mean turns of solved episodes, per task type)."""
    collector = make_collector(backend, envs, env=cfg.env, split=cfg.eval.split,
                               sampling=sampling_params(GenerationSettings(max_new_tokens=cfg.sampling.max_new_tokens), 0),
                               context=cfg.context, skills=skills)
    played: list[Trajectory] = []
    stats = collector.run([EpisodeSpec(seed) for seed in range(episodes)], played.append)
    backend.reset_prefix_cache()  # the evaluation's episodes are over: its kept rows would only hold memory
    report = eval_report(played)
    report["won_by_seed"] = [int(t.won) for t in sorted(played, key=lambda t: t.seed)]  # to pair two evaluations
    return stats, report


def start_eval(run_dir: Path) -> dict[str, Any] | None:
    """eval.jsonl's step-0 record (the starting policy), if the run has one."""
    return next((r for r in read_records(runs.eval_file(run_dir)) if r.get("step") == 0), None)


def evaluate_step(run: Run, step: int) -> None:
    """The evaluate phase: greedy episodes after ``step`` updates (0: the starting policy), one
    record in eval.jsonl and the trackers."""
    cfg = run.cfg
    stats, report = evaluate(run.backend, cfg, run.eval_envs, cfg.eval.episodes,
                             skills=run.skill_selector(cfg.seed, sees=True) if run.needs.policy_sees_skills else None)
    run.last_eval = {"step": step, "split": cfg.eval.split, "episodes": stats.episodes, **_summary(stats),
                     **{key: report[key] for key in _EVAL_REPORT_KEYS if key in report}}
    append_jsonl(runs.eval_file(run.run_dir), run.last_eval)
    run.trackers.log_eval(step, run.last_eval)


def checkpoint(run: Run, step: int) -> None:
    """Weights, optimizer, RNG and loop state of the step, written atomically (main process)."""
    state = {"step": step + 1, "skillbank": run.bank.to_dict() if run.bank is not None else None,
             "bad_update_streak": run.bad_update_streak, "env_error_streak": run.env_error_streak}
    whole_optimizer = run.ranks.optimizer_state(run.model, run.optimizer)  # FSDP: gathered from every rank
    if run.ranks.is_main:
        run.last_checkpoint = save_checkpoint(run.run_dir, step + 1, run.sampler, run.tokenizer, run.optimizer, state,
                                              keep=run.cfg.checkpoint.keep, optimizer_state=whole_optimizer)


def _resumable(run_dir: Path, err: OSError) -> DiskFullError:
    """A full disk during the loop, as one line: the file, the space left, and the command that goes on."""
    if not isinstance(err, DiskFullError):  # a file written outside this module's helpers
        err = disk_full("a file of the run", err.filename or run_dir, err, "Free some space there to go on.")
    steps = checkpoints(run_dir)
    since = f"from checkpoint {runs.step_name(steps[-1])}" if steps else "from step 0: it has no checkpoint yet"
    return DiskFullError(f"{err} Then continue the run ({since}) with: agentkit train --out "
                         f"{shlex.quote(str(run_dir))} --resume")


def trained_on(run: Run, step: int) -> Path:
    """The file holding the episodes (0-based) ``step`` trained on: its trajectories, or the demonstrations."""
    return Path(run.cfg.train.demos) if run.demos is not None else runs.trajectory_file(run.run_dir, step + 1)


def _check_divergence(run: Run, step: int) -> None:
    cfg = run.cfg
    if not (cfg.train.max_bad_updates and run.bad_update_streak >= cfg.train.max_bad_updates):
        return
    data_file = trained_on(run, step)
    raise TrainingDivergedError(
        f"{run.bad_update_streak} updates in a row had a NaN or inf loss or gradient (the last at step "
        f"{step + 1}; train.max_bad_updates={cfg.train.max_bad_updates}), so the run stops. Each was "
        f"skipped (skipped_updates in {run.run_dir / 'metrics.jsonl'}) and the weights are those of the "
        f"last finite update. Start again with a lower train.lr (now {cfg.train.lr:g}) or a tighter "
        f"train.grad_clip (now {cfg.train.grad_clip:g}); check {data_file} and the objective's "
        f"settings for inf/NaN rewards; or set train.max_bad_updates=0 to never stop.")


def train(cfg: TrainConfig, *, resume: bool = False, show_progress: bool = True,
          given: dict[str, Any] | None = None) -> TrainResult:
    """Run (or resume) training. ``given``: the settings the user gave explicitly (dotted keys), so
    that ``--resume`` keeps the saved run length unless ``train.steps`` is among them and names the
    others as ignored; None (a config built in Python): the resumed run takes ``cfg.train.steps``."""
    try:
        run = setup(cfg, resume, given)
    except NothingToDo as done:
        records = read_records(runs.eval_file(done.run_dir))
        return TrainResult(done.run_dir, done.last, records[-1] if records else None,
                           runs.checkpoint_dir(done.run_dir, done.last), start_eval=start_eval(done.run_dir))
    cfg, ranks = run.cfg, run.ranks
    from agentkit.core.progress import progress_bar

    bar = progress_bar(total=cfg.train.steps, initial=run.first_step, desc=f"train {cfg.objective.name}", unit="step",
                       disable=not (show_progress and ranks.is_main))
    watch = Watch(needs_groups=run.needs.needs_groups)
    try:
        if ranks.is_main and cfg.eval.at_start and run.first_step == 0:
            evaluate_step(run, 0)  # the starting policy, for the summary's start-to-end comparison
            if show_progress:
                bar.write(f"eval at the start (step 0, {cfg.eval.split} split, {run.last_eval['episodes']} greedy "
                          f"episodes): success {_success(run.last_eval)}", file=sys.stderr)
        for step in range(run.first_step, cfg.train.steps):
            started = time.perf_counter()
            rng = random.Random(f"{cfg.seed}:{step}")
            trajectories, rollout = collect(run, step, rng)
            collect_s = time.perf_counter() - started
            batch, prepare_s = score(run, trajectories, step)
            if run.sleeps_during_updates:
                run.backend.sleep(level=1)  # give the accelerator's memory to the update
            run.policy.train()
            update_started = time.perf_counter()
            updated = update(run.model, run.optimizer, run.objective, batch, train=cfg.train, ranks=ranks, rng=rng,
                             needs_support=run.needs.needs_support, bad_streak=run.bad_update_streak, step=step)
            update_s = time.perf_counter() - update_started
            run.bad_update_streak = updated.bad_streak
            run.policy.eval()
            synced = sync(run, batch, step)
            if run.generator is not None:
                synced["trainer_wait_s"] = rollout.wall_s  # the trainer's wait for this step's episodes
            record = {"step": step + 1, "loss": sum(updated.losses) / len(updated.losses) if updated.losses else float("nan"),
                      **_summary(rollout), "tokens": batch.num_response_tokens,
                      "grad_norm": sum(updated.grad_norms) / max(1, len(updated.grad_norms)),
                      "skipped_updates": updated.skipped, "lr": step_lr(cfg.train, step), "step_s": 0.0,
                      "data": "demonstrations" if run.demos is not None else "rollouts",
                      "collect_s": collect_s, "update_s": update_s, "prepare_s": prepare_s, **batch.metrics, **synced, **updated.objective_metrics}
            share = signal_share(trajectories) if run.demos is None else None
            if share is not None:
                record["signal_share"] = share  # groups whose returns differ (agentkit.train.watch)
            last = step + 1 == cfg.train.steps
            if ranks.is_main and (last or (cfg.eval.every and (step + 1) % cfg.eval.every == 0)):
                evaluate_step(run, step + 1)
            record["step_s"] = time.perf_counter() - started
            if ranks.is_main:
                append_jsonl(runs.metrics_file(run.run_dir), record)
                run.trackers.log_step(step + 1, record, trajectories, trained_on(run, step))
                for line in watch.observe(record):  # the signs of a run that is not learning, once each
                    bar.write(line, file=sys.stderr)
            _check_divergence(run, step)
            if last or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
                checkpoint(run, step)
            if run.bank is not None and ranks.is_main:
                run.bank.save()
            ranks.barrier()
            bar.update(1)
            bar.set_postfix(success=f"{record['success_rate']:.2f}", loss=f"{record['loss']:.3f}")
    except OSError as err:
        if not no_space(err):
            raise
        raise _resumable(run.run_dir, err) from err
    finally:
        bar.close()
        run.close()
    if ranks.is_main:
        from agentkit.report.plots import plot_runs

        plot_runs([run.run_dir], run.run_dir / "curves.png")
    ranks.barrier()
    ranks.close()
    steps = checkpoints(run.run_dir) if ranks.is_main else []
    return TrainResult(run.run_dir, cfg.train.steps, run.last_eval,
                       runs.checkpoint_dir(run.run_dir, steps[-1]) if steps else None,
                       start_eval=start_eval(run.run_dir) if ranks.is_main else None,
                       teacher=cfg.teacher.spec if run.needs.needs_teacher else None)
