"""Async training (``--async``): a generator process plays the coming steps while the trainer updates.

    trainer process                                generator process
    ---------------                                -----------------
    wait for trajectories/step-k.jsonl   <------   play step k (same tasks and seeds as sync)
    score, update -> weights v = k                   once the trainer has made k - K updates
    publish v into shared memory        ------->   before every generate call (a turn boundary):
                                                     load the newest weights, record v per turn

The generator holds its own copy of the policy. The trainer publishes its weights after every
update into tensors in shared memory (``torch.multiprocessing``) and bumps a version counter; the
generator copies them in between turns, so an episode in flight may go on with newer weights and
each ``Turn.policy_version`` says which weights sampled it. Admission control bounds staleness
without discarding work: step k's episodes start only once the trainer has made at least
k - ``max_staleness`` updates, so no episode starts more than ``max_staleness`` versions behind
the weights it is trained with, however long it runs. Environments keep stepping in their worker
processes (``env.workers``) or Ray actors throughout.

Every step's episodes go to ``trajectories/step-N.jsonl.part`` as they end and the file is renamed
``step-N.jsonl`` when the step is whole: that is the buffer, on disk. After a crash, ``--resume``
keeps every whole step file past the checkpoint and trains on it as it is (the steps after the
checkpoint are replayed on exactly the episodes they had), and the generator finishes a ``.part``
file's missing episodes only. So no episode is dropped and none is trained on twice by the
weights that survive.

The trainer recomputes pi_old with its own forward (``train.old_logprobs``), so the ratio is
taken under the trainer's numerics and the generator's logprobs are corrected for by importance
weights (``train.is_correction``).
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from agentkit.core import runs
from agentkit.core.errors import ConfigError, EnvError, GeneratorError, ModelError
from agentkit.core.faults import fault_point
from agentkit.core.jsonl import TrajectoryWriter, read_complete_lines
from agentkit.core.trajectory import episode_id
from agentkit.rollout.workers import die_with_parent
from agentkit.train.lora import trainable_state

POLL_S = 0.005


def default_threads(given: int, other: int) -> int:
    """``given`` torch threads, or (0) half the cores, or the cores ``other`` leaves."""
    cores = os.cpu_count() or 1
    if given:
        return given
    return max(1, cores - other) if other else max(1, cores // 2)


class Generator:
    """The trainer's handle on the generator process.

    Args:
        cfg: the run's ``TrainConfig``.
        run_dir: the run folder (the generator writes ``trajectories/`` there).
        model_dir: the weights the generator starts from (the base model or the resumed checkpoint).
        policy: the trained module; its state is copied into shared memory here and by ``publish``.
        version: the trainer's updates so far (the first step's index).
    """

    def __init__(self, cfg, run_dir: Path, model_dir: Path, policy: torch.nn.Module, version: int) -> None:
        context = mp.get_context("spawn")
        self.run_dir = run_dir
        # what an update changes (a LoRA policy's adapter alone), in shared memory
        self.weights = {name: t.detach().clone().share_memory_() for name, t in trainable_state(policy).items()}
        self.version = context.Value("q", version)
        self.lock = context.Lock()
        self.errors = context.Queue()
        self.stop = context.Event()
        threads = default_threads(cfg.async_rl.generator_threads, 0)
        # the generator dies with this process (kill -9 included), as environment workers do: a
        # resumed run must never find the old generator still writing its trajectories
        self.process = context.Process(
            target=_generator_main, name="agentkit-generator", daemon=True,
            args=(cfg.model_dump_json(), str(run_dir), str(model_dir), version, self.weights, self.version,
                  self.lock, self.errors, self.stop, threads, os.getpid(),
                  threading.current_thread() is threading.main_thread()))
        self.process.start()

    def publish(self, policy: torch.nn.Module, version: int) -> float:
        """Copy ``policy``'s weights into shared memory as ``version``; returns the seconds it took."""
        started = time.perf_counter()
        with self.lock, torch.no_grad():
            for name, tensor in trainable_state(policy).items():
                self.weights[name].copy_(tensor)
            self.version.value = version
        return time.perf_counter() - started

    def wait_for(self, step: int) -> tuple[Path, float]:
        """The whole trajectory file of ``step`` once the generator has written it, and the seconds
        the trainer waited for it. Raises the generator's own error if it stopped."""
        path, started = runs.trajectory_file(self.run_dir, step + 1), time.perf_counter()
        while not path.exists():
            self._raise_if_stopped(step)
            time.sleep(POLL_S)
        return path, time.perf_counter() - started

    def _raise_if_stopped(self, step: int) -> None:
        try:
            kind, message = self.errors.get_nowait()
        except queue.Empty:
            if self.process.is_alive():
                return
            kind, message = "died", f"the generator process exited (code {self.process.exitcode})"
        own = {"EnvError": EnvError, "ModelError": ModelError, "ConfigError": ConfigError}
        if kind in own:  # the environment's, the model's or the settings' own one-line error
            raise own[kind](f"async generator: {message}")
        raise GeneratorError(f"async generator: {message} before step {step + 1}'s trajectories were whole (its "
                             f"episodes so far are kept). Continue the run with: agentkit train --out "
                             f"{shlex.quote(str(self.run_dir))} --resume")

    def close(self) -> None:
        """Stop the generator: at once if it is waiting for admission, else killed after a second (a
        step it was playing stays in its ``.part`` file, a line torn by the kill set aside on resume)."""
        self.stop.set()
        self.process.join(timeout=1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def generator_stats(run_dir: Path, step: int) -> dict[str, float]:
    """What the generator measured while playing ``step`` (``generator_*`` metrics)."""
    path = runs.generator_file(run_dir, step + 1)
    return json.loads(path.read_text()) if path.exists() else {}


def _generator_main(cfg_json: str, run_dir: str, model_dir: str, first_step: int, weights: dict[str, torch.Tensor],
                    version, lock, errors, stop, threads: int, parent_pid: int, parent_death_signal: bool) -> None:
    """The generator process: play every step from ``first_step`` on, each once the trainer is
    close enough, loading the newest published weights before every generate call."""
    die_with_parent(parent_pid, parent_death_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops this process
    try:
        _play(cfg_json, Path(run_dir), Path(model_dir), first_step, weights, version, lock, stop, threads)
    except (EnvError, ModelError, ConfigError) as err:
        errors.put((type(err).__name__, str(err)))
    except BaseException as err:  # its traceback here, one line from the trainer
        traceback.print_exc()
        errors.put((type(err).__name__, f"{type(err).__name__}: {err}"))


def _play(cfg_json: str, run_dir: Path, model_dir: Path, first_step: int, weights, version, lock, stop,
          threads: int) -> None:
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.run import make_collector, make_envs, sampling_params
    from agentkit.train.config import TrainConfig
    from agentkit.train.episodes import episode_specs, sampling_seed, step_tasks
    from agentkit.train.policy import engine_sync, load_policy, policy_backend

    torch.set_num_threads(threads)
    cfg = TrainConfig.model_validate_json(cfg_json)
    tokenizer, model = load_tokenizer(model_dir), load_policy(model_dir, cfg.train, resumed=first_step > 0)
    model.eval()
    loaded = -1

    from agentkit.models import ensure_default_model, resolve_model_dir

    name = str(resolve_model_dir(cfg.model) if cfg.model else ensure_default_model())
    # the local copy itself, or an engine of this process's own fed from it (newest_weights)
    backend = policy_backend(cfg.backend, module=model, folder=model_dir, train=cfg.train, resumed=first_step > 0,
                             tokenizer=tokenizer, seed=cfg.seed, name=name)

    def newest_weights() -> int:
        """Called before each generate call: copy in the newest weights if there are newer ones."""
        nonlocal loaded
        if version.value != loaded:
            with lock, torch.no_grad():
                model.load_state_dict(weights, strict=not cfg.train.lora.rank)  # LoRA: the adapter's tensors
                loaded = version.value
            if backend.syncs_weights:  # from the local copy into the engine
                engine_sync(backend, model, cfg.train)
        return loaded

    envs = make_envs(cfg.env, "train")
    skills = _SkillsAsSaved(cfg, run_dir)
    errors_in_a_row = 0
    try:
        for step in range(first_step, cfg.train.steps):
            path = runs.trajectory_file(run_dir, step + 1)
            if path.exists():  # whole from before a crash: trained on as it is
                continue
            waited = time.perf_counter()
            while version.value < step - cfg.async_rl.max_staleness:  # admission control
                if stop.is_set():
                    return
                time.sleep(POLL_S)
            waited = time.perf_counter() - waited
            part = path.with_name(path.name + ".part")
            done = {t.id for t in read_complete_lines(part)[0]} if part.exists() else set()
            seed = sampling_seed(cfg.seed, step)
            collector = make_collector(backend, envs, env=cfg.env, split="train",
                                       sampling=sampling_params(cfg.sampling, seed), context=cfg.context,
                                       skills=skills.selector(seed), consecutive_errors=errors_in_a_row,
                                       policy_version=newest_weights)
            todo = [s for s in episode_specs(cfg.rollout, step_tasks(cfg.rollout, step))
                    if episode_id(cfg.env.id, "train", s.seed, s.sample) not in done]
            started = time.perf_counter()
            with TrajectoryWriter(part, mode="append") as writer:

                def keep(trajectory, writer=writer, step=step) -> None:
                    writer.write(trajectory)
                    fault_point("generator", step + 1)  # tests: the generator killed mid-step

                stats = collector.run(todo, keep)
            errors_in_a_row = collector.consecutive_errors
            runs.generator_file(run_dir, step + 1).write_text(json.dumps(
                {"generator_wait_s": waited, "generator_play_s": time.perf_counter() - started,
                 "generator_generate_s": stats.generate_s, "rollout_tokens_per_s": stats.tokens_per_s}))
            os.replace(part, path)
            if stop.is_set():
                return
    finally:
        envs.close()


class _SkillsAsSaved:
    """The skills each episode sees, from the run's bank as the trainer last saved it (none when the
    run retrieves none): the bank is read again for every step, the rest once."""

    def __init__(self, cfg, run_dir: Path) -> None:
        from agentkit.train.episodes import uses_skills

        self.cfg, self.run_dir = cfg, run_dir
        needs = cfg.objective.requirements()
        self.used, self.sees = uses_skills(cfg, needs), needs.policy_sees_skills
        self.retriever = None
        if self.used:
            from agentkit.skillbank import make_retriever

            self.retriever = make_retriever(cfg.skills.retrieval, cfg.skills.args)

    def selector(self, seed: int) -> Any:
        if not self.used:
            return None
        from agentkit.skillbank import SkillBank
        from agentkit.train.episodes import load_skill_bank, skill_selector

        saved = runs.skill_bank_file(self.run_dir)
        bank = SkillBank.load(saved) if saved.exists() else load_skill_bank(self.cfg, self.run_dir, None)
        return skill_selector(self.cfg, bank, self.retriever, seed, sees=self.sees)
