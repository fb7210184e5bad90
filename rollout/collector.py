"""Run many episodes at once: batched generation for every episode whose environment is ready.

The loop is event-driven. Environments live behind an ``EnvRunner`` (in-process, or worker
processes); the collector submits their resets and steps and, while they run, generates for the
episodes that already have an observation. When only some are ready it waits a little for the
rest (up to half of the last generate call's time, by default) so batches stay large, then goes
ahead without the stragglers: a slow environment never holds up the others.

Each episode samples with its own seed per turn (derived from the sampling seed, the task seed,
its index in the group and the turn), so a rollout reproduces exactly however its episodes
happened to be batched. Each finished episode goes to ``on_trajectory`` (the writer) at once, so
a crash loses only the episodes in flight. An environment that raises, dies or hangs ends its
episode (truncated, the error recorded) without stopping the run; so does a context that would
overflow the model. But an environment (or a model) that fails ``max_consecutive_errors`` episodes in a
row is broken, not unlucky: the run stops with an ``EnvError`` (a ``ModelError``) rather than write
nothing but errors. Why an episode ended is its ``Ending``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import numbers
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

from agentkit.envs.formats import ActionFormat
from agentkit.envs.protocol import Env
from agentkit.envs.registry import env_info
from agentkit.rollout.backend import GenerationBackend, SamplingParams, generation_problem
from agentkit.rollout.context import EpisodeContext, format_observation, make_context, task_type_of
from agentkit.rollout.workers import EnvResult, EnvRunner, InProcessEnvs

from agentkit.core.errors import ConfigError, EnvError, ModelError
from agentkit.core.settings import ContextSettings, EnvSettings, default
from agentkit.core.trajectory import (
    Trajectory,
    Turn,
    episode_group,
    episode_id,
    is_finite,
    is_unicode,
)

# Episodes in flight when max_in_flight is 0: all of a step's (a training step plays tasks x group, far
# fewer), and a bound for a huge --episodes, whose episodes then stream through (built as slots free up)
AUTO_IN_FLIGHT = 256


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: the task seed, and which sample of its group this is."""

    seed: int
    sample: int = 0


@dataclass
class RolloutStats:
    """What a rollout did, for the summary table and benchmarks."""

    episodes: int = 0
    won: int = 0
    total_return: float = 0.0
    turns: int = 0
    invalid_actions: int = 0
    generated_tokens: int = 0
    errors: int = 0
    wall_s: float = 0.0
    generate_s: float = 0.0
    env_s: float = 0.0  # environment time summed over episodes (overlaps generation with workers)
    reset_s: float = 0.0
    generate_calls: int = 0

    @property
    def success_rate(self) -> float:
        return self.won / self.episodes if self.episodes else 0.0

    @property
    def mean_return(self) -> float:
        return self.total_return / self.episodes if self.episodes else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns / self.episodes if self.episodes else 0.0

    @property
    def invalid_rate(self) -> float:
        return self.invalid_actions / self.turns if self.turns else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def env_steps_per_s(self) -> float:
        return self.turns / self.wall_s if self.wall_s else 0.0

    @property
    def generation_idle_s(self) -> float:
        """Wall time during which no generate call was running."""
        return max(0.0, self.wall_s - self.generate_s)

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.won += int(trajectory.won)
        self.total_return += trajectory.episode_return
        self.turns += len(trajectory.turns)
        self.invalid_actions += sum(not t.action_valid for t in trajectory.turns)
        self.generated_tokens += trajectory.num_tokens
        self.errors += int(trajectory.error is not None)


def turn_seed(base: int, task_seed: int, sample: int, turn: int) -> int:
    """A stable 63-bit seed for one episode's turn."""
    digest = hashlib.blake2b(f"{base}|{task_seed}|{sample}|{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def resolve_sampling(sampling: SamplingParams, action_format: ActionFormat) -> SamplingParams:
    """``sampling`` as the collector samples and records it: ``stop=None`` becomes the action
    format's stop strings (explicit ones, ``()`` included, are kept)."""
    return sampling if sampling.stop is not None else dataclasses.replace(sampling, stop=action_format.stop)


def _expert_action(info: dict[str, Any]) -> str | None:
    plan = info.get("expert_plan")
    return str(plan[0]) if isinstance(plan, (list, tuple)) and plan else None


def _action_read(info: dict[str, Any]) -> str | None:
    read = info.get("action_read")
    return read if isinstance(read, str) and read and info.get("action") is not None else None


def _text_problem(what: str, value: Any, *, optional: bool = False, limit: int | None = None) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        return f"{what} is a {type(value).__name__}, not a string"
    if not is_unicode(value):
        return f"{what} holds a lone surrogate (a \\ud800-\\udfff character), which UTF-8 cannot carry"
    if limit is not None and len(value) > limit:
        return (f"{what} has {len(value):,} characters, over env.max_observation_chars={limit:,} "
                "(--max-observation-chars)")
    return None


def _number_problem(what: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's numbers are Real too
        return f"{what} is a {type(value).__name__}, not a number"
    return None if is_finite(value) else f"{what} is {value!r}, not a finite number"


def _info_problem(info: Any, *, reset: bool) -> str | None:
    """What the collector reads from ``info`` (and writes into the trajectory) that it cannot use."""
    if not isinstance(info, dict):
        return f"info is a {type(info).__name__}, not a dict"
    actions = info.get("admissible_actions")
    problems = (
        _text_problem("info['task']", info.get("task"), optional=True) if reset else None,
        _text_problem("info['privileged']", info.get("privileged"), optional=True),
        _text_problem("info['action']", info.get("action"), optional=True),
        _number_problem("info['score']", info.get("score"), optional=True),
        None if actions is None or isinstance(actions, (list, tuple)) and all(isinstance(a, str) for a in actions)
        else "info['admissible_actions'] is not a list of strings",
    )
    return next((p for p in problems if p is not None), None)


def env_answer_problem(op: str, value: Any, max_observation_chars: int | None = None) -> str | None:
    """Why an environment's answer to ``reset`` (``(observation, info)``) or ``step`` (``(observation,
    reward, terminated, truncated, info)``) cannot be played or written, or None. The episode ends there."""
    size = 2 if op == "reset" else 5
    if not isinstance(value, tuple) or len(value) != size:
        return f"{op}() returned {type(value).__name__} {_short(value)}, not a tuple of {size}"
    problem = _text_problem("the observation", value[0], limit=max_observation_chars)
    if problem is None and op == "step":
        problem = _number_problem("the reward", value[1]) or next(
            (f"{name} is a {type(flag).__name__}, not a bool" for name, flag in (("terminated", value[2]),
             ("truncated", value[3])) if not isinstance(flag, bool) and type(flag).__name__ != "bool_"), None)
    return problem or _info_problem(value[-1], reset=op == "reset")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


CONTEXT_FULL = "context full"  # the error of an episode whose next answer would not fit in the model's context


class Ending(enum.Enum):
    """Why an episode ended."""

    PLAYED = "played"  # the environment ended it (terminated, or truncated by its turn limit)
    ENV_ERROR = "environment error"  # its reset or step raised, died, hung or answered something unusable
    MODEL_ERROR = "model error"  # the model's answer is unusable (NaN logprobs, ids outside the vocabulary)
    CONTEXT_FULL = "context full"  # its next answer would not fit in the model's context (``CONTEXT_FULL``)

    @property
    def failed(self) -> bool:
        """It counts toward ``max_consecutive_errors``."""
        return self in (Ending.ENV_ERROR, Ending.MODEL_ERROR)


@dataclass(frozen=True)
class _PendingTurn:
    """A turn's sampled half, awaiting its environment step."""

    response_ids: list[int]
    response_logprobs: list[float]
    response_text: str
    finish_reason: str
    generation_s: float
    policy_version: int | None


@dataclass
class _Episode:
    """Bookkeeping for one episode in flight."""

    slot: int
    spec: EpisodeSpec
    observation: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    task: str = ""
    task_type: str | None = None
    privileged: str | None = None
    skills: list[str] = field(default_factory=list)
    skill_text: str | None = None  # shown to the policy (skill-conditioned policies only)
    context: EpisodeContext | None = None  # the prompt so far (the context builder's state)
    new_context: list[int] = field(default_factory=list)  # this turn's new context tokens
    turns: list[Turn] = field(default_factory=list)
    pending_turn: _PendingTurn | None = None  # the generation awaiting its env step


@dataclass
class _Flight:
    """One ``run``'s episodes in flight: where each is, and what has been done."""

    pending: Iterator[EpisodeSpec]  # episodes not started yet, read lazily
    limit: int  # environment slots: 0 .. limit - 1
    on_trajectory: Callable[[Trajectory], None]
    progress: Callable[[Trajectory, RolloutStats], None] | None
    upcoming: EpisodeSpec | None = None  # the next episode to start
    free_slots: list[int] = field(default_factory=list)
    waiting: dict[int, _Episode] = field(default_factory=dict)  # slot -> episode whose environment is busy
    ready: list[_Episode] = field(default_factory=list)  # episodes with an observation, awaiting generation
    stats: RolloutStats = field(default_factory=RolloutStats)
    last_generate_s: float = 0.0

    def __post_init__(self) -> None:
        self.upcoming = next(self.pending, None)
        self.free_slots = list(range(self.limit))[::-1]  # popped from the end: slot 0 first

    @property
    def active(self) -> bool:
        return self.upcoming is not None or bool(self.waiting) or bool(self.ready)


class Collector:
    """Plays episodes of one environment with one backend.

    Args:
        backend: the generation backend (its tokenizer formats prompts).
        envs: an ``EnvRunner`` (e.g. ``WorkerPool``), or a callable building one environment
            (already wrapped with the action parser and turn limit), stepped in this process.
        env_id: recorded in trajectories; its action format (``env_info(env_id)``) gives the
            system prompt and the stop strings unless ``action_format`` is given.
        split: recorded in trajectories.
        sampling: sampling settings; ``stop=None`` (the default) means the action format's stop strings.
        context: what the model sees each turn (``ContextSettings``: ``mode`` chat or window, the
            ``window``, ``show_admissible``, the ``system_prompt``, None: the action format's
            instruction); None: the defaults.
        action_format: the environment's action format; None: ``env_info(env_id).action_format``.
        skills: picks each episode's skills after reset: ``skills(spec, task, info) -> (ids, text)``
            (``agentkit.skillbank.SkillSelector``); ids are recorded, ``text`` (None = teacher-only)
            is put before the first observation.
        max_in_flight: episodes played at once (environment slots); 0 = all of them, at most
            ``AUTO_IN_FLIGHT``.
        batch_wait_s: how long to wait for more environments once some episodes are ready to
            generate; None = half the duration of the last generate call.
        max_consecutive_errors: stop once this many episodes in a row have ended in an environment
            error (reset or step raised, its worker died or hung: ``EnvError``) or an unusable model
            answer (``ModelError``); an episode that ends otherwise resets the count (a full context
            is neither). Episodes that ended are passed to ``on_trajectory`` first. 0 = never stop.
        consecutive_errors: the count to start from (a training loop that builds one collector
            per step carries ``collector.consecutive_errors`` over to the next).
        max_observation_chars: the longest observation an episode may go on with.
        policy_version: called before each batched generate call (a turn boundary for every
            episode in it); returns the version of the weights that call samples with, recorded
            in each of its turns (``Turn.policy_version``). A training loop whose weights reach the
            sampler from elsewhere (async training) loads the newest ones there. None: not recorded.

    What an environment or the model hands back is checked before it is used: a reset or step whose
    answer cannot be played or written (``env_answer_problem``: a NaN reward, ``info=None``, a task
    that is not a string, a lone surrogate, an observation over ``max_observation_chars``) and a
    generation a trajectory file cannot hold (``generation_problem``: NaN or positive logprobs, ids
    the tokenizer does not have) end that episode, truncated, with the problem as its error; each
    counts toward ``max_consecutive_errors``.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        envs: EnvRunner | Callable[[], Env],
        *,
        env_id: str,
        split: str = "train",
        sampling: SamplingParams | None = None,
        context: ContextSettings | None = None,
        action_format: ActionFormat | None = None,
        skills: Callable[[EpisodeSpec, str, dict[str, Any]], tuple[list[str], str | None]] | None = None,
        max_in_flight: int = 0,
        batch_wait_s: float | None = None,
        max_consecutive_errors: int = default(EnvSettings, "max_errors"),
        consecutive_errors: int = 0,
        max_observation_chars: int = default(EnvSettings, "max_observation_chars"),
        policy_version: Callable[[], int] | None = None,
    ) -> None:
        if max_consecutive_errors < 0:
            raise ConfigError(f"max_consecutive_errors must be >= 0 (0 = no limit), got {max_consecutive_errors}.")
        self.backend = backend
        self.envs: EnvRunner = envs if isinstance(envs, EnvRunner) else InProcessEnvs(envs)
        self.env_id = env_id
        self.split = split
        fmt = action_format or env_info(env_id).action_format
        self.action_format = fmt
        self.sampling = resolve_sampling(sampling or SamplingParams(), fmt)
        context = context or ContextSettings()
        self.show_admissible = context.show_admissible
        self.skills = skills
        self.max_in_flight = max_in_flight
        self.batch_wait_s = batch_wait_s
        self.max_consecutive_errors = max_consecutive_errors
        self.consecutive_errors = consecutive_errors
        self._model_failures = 0  # of the failures in the row, those with an unusable model answer
        self.max_observation_chars = max_observation_chars
        self.policy_version = policy_version
        self._vocab_size = len(backend.tokenizer)
        self.context = make_context(context.mode, backend.tokenizer,
                                    fmt.instruction if context.system_prompt is None else context.system_prompt,
                                    context.window)
        self.context_mode = self.context.mode

    # -- prompts and records -----------------------------------------------------------------
    def _prepare_prompt(self, ep: _Episode, *, first: bool) -> None:
        user_text = format_observation(ep.observation, ep.info, show_admissible=self.show_admissible, first=first)
        if first:
            ep.context = self.context.start(ep.task, ep.skill_text)
        ep.new_context = self.context.next_turn(ep.context, user_text)

    def _prompt(self, ep: _Episode) -> list[int]:
        return ep.context.prompt

    def _trajectory(self, ep: _Episode, *, terminated: bool, truncated: bool, error: str | None) -> Trajectory:
        spec, info = ep.spec, ep.info
        return Trajectory(
            id=episode_id(self.env_id, self.split, spec.seed, spec.sample), env=self.env_id, task=ep.task,
            seed=spec.seed, split=self.split, group=episode_group(self.env_id, self.split, spec.seed), sample=spec.sample, turns=ep.turns, episode_return=float(sum(t.reward for t in ep.turns)),
            won=bool(info.get("won", False)), score=float(info.get("score", 0.0) or 0.0),
            terminated=terminated, truncated=truncated, model=self.backend.name,
            sampling=self.sampling.to_dict(), context_mode=self.context_mode, privileged=ep.privileged,
            error=error, skills=list(ep.skills), skills_in_prompt=ep.skill_text is not None, created_at=time.time(),
            task_type=ep.task_type,
        )

    def _count_errors(self, ending: Ending, error: str | None) -> None:
        """Track failed episodes in a row; raise once there are ``max_consecutive_errors``, blaming
        the model only when every failure in the row was the model's (a count carried in from an
        earlier collector, ``consecutive_errors``, is taken as the environment's)."""
        if not ending.failed:
            self.consecutive_errors = self._model_failures = 0
            return
        self.consecutive_errors += 1
        self._model_failures += ending is Ending.MODEL_ERROR
        limit = self.max_consecutive_errors
        if not (limit and self.consecutive_errors >= limit):
            return
        last = (error or "").strip().replace(chr(10), chr(10) + "  ")
        ending_words = (f"so the run stops instead of recording only errors. The last error:\n  {last}\n"
                        "Episodes that ended were written, with their errors. ")
        raise_limit = "if it happens only in bursts, raise the limit (--max-env-errors N; 0 = no limit)."
        models = self._model_failures
        if models == self.consecutive_errors:  # every failure in the row was the model's
            raise ModelError(
                f"The model's answers were unusable in {models} episodes in a row (the limit is {limit}), "
                + ending_words + "Check the model (weights that became NaN: lower the lr or resume from an earlier "
                "checkpoint) and that its tokenizer is the model's own; " + raise_limit)
        what = (f"failed {self.consecutive_errors} episodes in a row" if not models else
                f"and the model failed {self.consecutive_errors} episodes in a row ({models} of them with unusable "
                "model answers)")
        raise EnvError(
            f"Environment {self.env_id!r} {what} (the limit is {limit}), " + ending_words
            + f"Check the environment on its own (agentkit envs check {self.env_id}), its settings and what it needs "
            "(a JVM, data files); " + raise_limit)

    # -- the loop ----------------------------------------------------------------------------
    def _in_flight(self, specs: Iterable[EpisodeSpec]) -> int:
        """Episodes ``run(specs)`` plays at once: its environment slots are 0 .. this - 1."""
        return self.max_in_flight or (min(len(specs), AUTO_IN_FLIGHT) if isinstance(specs, Sized) else AUTO_IN_FLIGHT)

    def reset_ahead(self, specs: Sequence[EpisodeSpec]) -> None:
        """Start the resets of the episodes ``run(specs)`` will start first, in the slots it will give
        them (``EnvRunner.reset_ahead``): a training loop calls it with the next step's episodes
        before its update, so they reset while it trains. ``run`` plays the same episodes either way."""
        for slot, spec in enumerate(specs[: self._in_flight(specs)]):
            self.envs.reset_ahead(slot, spec.seed)

    def run(
        self,
        specs: Iterable[EpisodeSpec],
        on_trajectory: Callable[[Trajectory], None],
        *,
        progress: Callable[[Trajectory, RolloutStats], None] | None = None,
    ) -> RolloutStats:
        """Play every episode; call ``on_trajectory`` for each as soon as it ends.

        Each pass of the loop: start episodes in the free slots (their resets), take in what the
        environments answered, wait a little for more when only some episodes are ready, end the
        episodes whose context is full, generate one batch for the ready ones and send their actions.

        Raises after ``max_consecutive_errors`` failed episodes in a row: ``ModelError`` when every one
        of them had an unusable model answer, else ``EnvError``; the episodes still in flight are
        abandoned, so close the runner (``close()``) then.
        """
        # specs are read lazily: a billion episodes stream through at most ``_in_flight`` at a time
        flight = _Flight(iter(specs), self._in_flight(specs), on_trajectory, progress)
        start = time.perf_counter()
        try:
            while flight.active:
                self._start_episodes(flight)
                self._receive(flight)
                self._end_full_contexts(flight)
                if flight.ready:
                    self._generate(flight)
        finally:
            flight.stats.wall_s = time.perf_counter() - start
        return flight.stats

    # -- the loop's steps ----------------------------------------------------------------------
    def _start_episodes(self, flight: _Flight) -> None:
        """Reset the next episodes into the free slots (the first ones take slots 0, 1, ...: ``reset_ahead``)."""
        while flight.upcoming is not None and flight.free_slots:
            ep = _Episode(flight.free_slots.pop(), flight.upcoming)
            flight.upcoming = next(flight.pending, None)
            flight.waiting[ep.slot] = ep
            self.envs.submit(ep.slot, "reset", ep.spec.seed)

    def _receive(self, flight: _Flight) -> None:
        """Take in the environments' answers; block for the first only when nothing can be generated,
        and when some episodes are ready and others are not, wait a little for those (``batch_wait_s``)."""
        for result in self.envs.poll(timeout=0 if flight.ready else None):
            self._on_result(flight, result)
        if flight.waiting and flight.ready:
            budget = self.batch_wait_s if self.batch_wait_s is not None else 0.5 * flight.last_generate_s
            until = time.perf_counter() + budget
            while flight.waiting and time.perf_counter() < until:
                for result in self.envs.poll(timeout=until - time.perf_counter()):
                    self._on_result(flight, result)

    def _on_result(self, flight: _Flight, result: EnvResult) -> None:
        ep = flight.waiting.pop(result.slot)
        error = result.error
        if error is None:
            problem = env_answer_problem(result.op, result.value, self.max_observation_chars)
            error = None if problem is None else f"the environment's {result.op}() answer is unusable: {problem}"
        if result.op == "reset":
            flight.stats.reset_s += result.elapsed_s
            if error is not None:
                self._finish(flight, ep, Ending.ENV_ERROR, error=error)
                return
            ep.observation, ep.info = result.value
            ep.task, ep.privileged = ep.info.get("task") or "", ep.info.get("privileged")
            ep.task_type = task_type_of(ep.info)
            if self.skills is not None:
                ids, ep.skill_text = self.skills(ep.spec, ep.task, ep.info)
                ep.skills = list(ids)
            self._prepare_prompt(ep, first=True)
            flight.ready.append(ep)
            return
        flight.stats.env_s += result.elapsed_s
        turn = ep.pending_turn
        if error is not None:
            obs, reward, terminated, truncated = "", 0.0, False, True
            info = {**ep.info, "action": None, "action_valid": False, "error": error}
        else:
            obs, reward, terminated, truncated, info = result.value
        ep.turns.append(Turn(
            observation=ep.observation, context_ids=ep.new_context, action=info.get("action"),
            action_valid=bool(info.get("action_valid", False)), reward=float(reward), feedback=obs,
            env_s=result.elapsed_s, error=error, expert_action=_expert_action(ep.info),
            privileged=ep.info.get("privileged"), action_read=_action_read(info), **vars(turn),
        ))
        self.context.end_turn(ep.context, ep.observation, info.get("action") or turn.response_text.strip(),
                              turn.response_ids)
        ep.info = info
        if terminated or truncated:
            self._finish(flight, ep, Ending.PLAYED if error is None else Ending.ENV_ERROR,
                         terminated=bool(terminated), truncated=bool(truncated), error=error)
            return
        ep.observation = obs
        self._prepare_prompt(ep, first=False)
        flight.ready.append(ep)

    def _end_full_contexts(self, flight: _Flight) -> None:
        """An episode whose next answer cannot fit in the model's context ends here (not an environment error)."""
        room = self.backend.max_context - self.sampling.max_new_tokens
        for ep in [e for e in flight.ready if len(self._prompt(e)) > room]:
            flight.ready.remove(ep)
            self._finish(flight, ep, Ending.CONTEXT_FULL, error=CONTEXT_FULL)

    def _generate(self, flight: _Flight) -> None:
        """One batched generate call for every ready episode; each answer goes to its environment."""
        params, stats = self.sampling, flight.stats
        batch, flight.ready = flight.ready, []
        seeds = [turn_seed(params.seed, e.spec.seed, e.spec.sample, len(e.turns)) for e in batch]
        version = self.policy_version() if self.policy_version is not None else None
        t0 = time.perf_counter()
        generations = self.backend.generate([self._prompt(e) for e in batch], params, seeds)
        flight.last_generate_s = time.perf_counter() - t0
        stats.generate_s += flight.last_generate_s
        stats.generate_calls += 1
        for ep, gen in zip(batch, generations, strict=True):
            problem = generation_problem(gen, params, self._vocab_size)
            if problem is not None:
                self._finish(flight, ep, Ending.MODEL_ERROR, error=f"the model's answer is unusable: {problem}")
                continue
            text = self.backend.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            ep.pending_turn = _PendingTurn(
                response_ids=list(gen.token_ids), response_logprobs=[float(x) for x in gen.logprobs],
                response_text=text, finish_reason=gen.finish_reason, generation_s=flight.last_generate_s,
                policy_version=version)
            flight.waiting[ep.slot] = ep
            self.envs.submit(ep.slot, "step", text)

    def _finish(self, flight: _Flight, ep: _Episode, ending: Ending, *, terminated: bool = False,
                truncated: bool = True, error: str | None = None) -> None:
        """The episode ended (why: ``ending``): free its slot, record it, hand it on, count it
        toward ``max_consecutive_errors`` if it failed. An episode cut short is truncated."""
        flight.free_slots.append(ep.slot)
        trajectory = self._trajectory(ep, terminated=terminated, truncated=truncated, error=error)
        flight.stats.add(trajectory)
        flight.on_trajectory(trajectory)
        if flight.progress is not None:
            flight.progress(trajectory, flight.stats)
        self._count_errors(ending, error)

    def close(self) -> None:
        self.envs.close()
