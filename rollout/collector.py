"""Run many episodes at once: one batched generate per turn across every episode in flight.

Each finished episode is handed to ``on_trajectory`` (the writer) at once, so a crash loses only
the episodes still in flight. An environment that raises ends its episode (truncated, the error
recorded) without stopping the run; so does a context that would overflow the model.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agentkit.envs.protocol import Env
from agentkit.rollout.backend import GenerationBackend, SamplingParams
from agentkit.rollout.context import DEFAULT_SYSTEM_PROMPT, ChatContext, WindowContext, format_observation

from agentkit.core.trajectory import ContextMode, Trajectory, Turn


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
    env_s: float = 0.0
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

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.won += int(trajectory.won)
        self.total_return += trajectory.episode_return
        self.turns += len(trajectory.turns)
        self.invalid_actions += sum(not t.action_valid for t in trajectory.turns)
        self.generated_tokens += trajectory.num_tokens
        self.errors += int(trajectory.error is not None)


@dataclass
class _Episode:
    """Bookkeeping for one episode in flight."""

    env: Env
    spec: EpisodeSpec
    observation: str
    info: dict[str, Any]
    task: str
    privileged: str | None
    context: list[int] = field(default_factory=list)  # chat mode: every token so far
    new_context: list[int] = field(default_factory=list)  # this turn's new context tokens
    history: list[tuple[str, str]] = field(default_factory=list)  # window mode
    turns: list[Turn] = field(default_factory=list)


class Collector:
    """Plays episodes of one environment with one backend.

    Args:
        backend: the generation backend (its tokenizer formats prompts).
        make_env: builds one environment (already wrapped with the action parser and turn limit).
        env_id: recorded in trajectories.
        split: recorded in trajectories ("train" or "eval").
        sampling: sampling settings.
        context: "chat" or "window".
        window: turns of history in window mode.
        show_admissible: list the admissible actions in each observation.
        system_prompt: the system message.
        max_in_flight: episodes played at once (environments kept alive); 0 = all.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        make_env: Callable[[], Env],
        *,
        env_id: str,
        split: str = "train",
        sampling: SamplingParams | None = None,
        context: ContextMode = "chat",
        window: int = 3,
        show_admissible: bool = True,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        max_in_flight: int = 0,
    ) -> None:
        if context not in ("chat", "window"):
            raise ValueError(f"context must be 'chat' or 'window', got {context!r}")
        self.backend = backend
        self.make_env = make_env
        self.env_id = env_id
        self.split = split
        self.sampling = sampling or SamplingParams()
        self.context_mode = context
        self.show_admissible = show_admissible
        self.max_in_flight = max_in_flight
        tokenizer = backend.tokenizer
        self.chat = ChatContext(tokenizer, system_prompt) if context == "chat" else None
        self.window = WindowContext(tokenizer, system_prompt, window) if context == "window" else None
        self._idle_envs: list[Env] = []

    # -- episode lifecycle -------------------------------------------------------------------
    def _start(self, spec: EpisodeSpec) -> _Episode | Trajectory:
        env = self._idle_envs.pop() if self._idle_envs else self.make_env()
        try:
            obs, info = env.reset(seed=spec.seed)
        except Exception as err:  # noqa: BLE001 - a broken env ends its episode, not the run
            env.close()
            return self._trajectory(spec, [], task="", privileged=None, info={}, terminated=False,
                                    truncated=True, error=f"reset failed: {type(err).__name__}: {err}")
        episode = _Episode(env, spec, obs, info, info.get("task") or "", info.get("privileged"))
        self._prepare_prompt(episode, first=True)
        return episode

    def _prepare_prompt(self, ep: _Episode, *, first: bool) -> None:
        user_text = format_observation(ep.observation, ep.info, show_admissible=self.show_admissible, first=first)
        if self.chat is not None:
            if first:
                ep.new_context = self.chat.first(user_text)
            else:
                ep.context.extend(ep.turns[-1].response_ids)
                ep.new_context = self.chat.next(ep.turns[-1].response_ids, user_text)
            ep.context.extend(ep.new_context)
        else:
            ep.new_context = self.window.prompt(ep.task, ep.history, user_text, len(ep.turns))

    def _prompt(self, ep: _Episode) -> list[int]:
        return ep.context if self.chat is not None else ep.new_context

    def _trajectory(self, spec: EpisodeSpec, turns: list[Turn], *, task: str, privileged: str | None,
                    info: dict[str, Any], terminated: bool, truncated: bool, error: str | None) -> Trajectory:
        group = f"{self.env_id}|{self.split}|{spec.seed}"
        return Trajectory(
            id=f"{group}|{spec.sample}", env=self.env_id, task=task, seed=spec.seed, split=self.split,
            group=group, sample=spec.sample, turns=turns, episode_return=float(sum(t.reward for t in turns)),
            won=bool(info.get("won", False)), score=float(info.get("score", 0.0) or 0.0),
            terminated=terminated, truncated=truncated, model=self.backend.name,
            sampling=self.sampling.to_dict(), context_mode=self.context_mode, privileged=privileged,
            error=error, created_at=time.time(),
        )

    def _finish(self, ep: _Episode, *, terminated: bool, truncated: bool, error: str | None) -> Trajectory:
        if error is None:
            self._idle_envs.append(ep.env)
        else:
            ep.env.close()  # its state is unknown; build a fresh one for the next episode
        return self._trajectory(ep.spec, ep.turns, task=ep.task, privileged=ep.privileged, info=ep.info,
                                terminated=terminated, truncated=truncated, error=error)

    # -- the loop ----------------------------------------------------------------------------
    def run(
        self,
        specs: Iterable[EpisodeSpec],
        on_trajectory: Callable[[Trajectory], None],
        *,
        progress: Callable[[Trajectory, RolloutStats], None] | None = None,
    ) -> RolloutStats:
        """Play every episode; call ``on_trajectory`` for each as soon as it ends."""
        stats = RolloutStats()
        pending = deque(specs)
        limit = self.max_in_flight or len(pending)
        active: list[_Episode] = []
        start = time.perf_counter()
        tokenizer = self.backend.tokenizer
        params = self.sampling

        def emit(trajectory: Trajectory) -> None:
            stats.add(trajectory)
            on_trajectory(trajectory)
            if progress is not None:
                progress(trajectory, stats)

        def refill() -> None:
            while pending and len(active) < limit:
                t_reset = time.perf_counter()
                started = self._start(pending.popleft())
                stats.reset_s += time.perf_counter() - t_reset
                if isinstance(started, Trajectory):
                    emit(started)
                else:
                    active.append(started)

        try:
            refill()
            while active:
                # an episode whose next answer cannot fit in the model's context ends here
                for ep in [e for e in active if len(self._prompt(e)) + params.max_new_tokens > self.backend.max_context]:
                    active.remove(ep)
                    emit(self._finish(ep, terminated=False, truncated=True, error="context full"))
                if not active:
                    refill()
                    continue
                t0 = time.perf_counter()
                generations = self.backend.generate([self._prompt(e) for e in active], params)
                generate_s = time.perf_counter() - t0
                stats.generate_s += generate_s
                stats.generate_calls += 1
                still_active: list[_Episode] = []
                for ep, gen in zip(active, generations, strict=True):
                    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
                    t1 = time.perf_counter()
                    error = None
                    try:
                        obs, reward, terminated, truncated, info = ep.env.step(text)
                    except Exception as err:  # noqa: BLE001 - a broken env ends its episode, not the run
                        error = f"step failed: {type(err).__name__}: {err}"
                        obs, reward, terminated, truncated, info = "", 0.0, False, True, {**ep.info, "action_valid": False}
                    env_s = time.perf_counter() - t1
                    stats.env_s += env_s
                    ep.turns.append(Turn(
                        observation=ep.observation, context_ids=ep.new_context, response_ids=list(gen.token_ids),
                        response_logprobs=[float(x) for x in gen.logprobs], response_text=text,
                        action=info.get("action"), action_valid=bool(info.get("action_valid", False)),
                        reward=float(reward), feedback=obs, finish_reason=gen.finish_reason,
                        generation_s=generate_s, env_s=env_s, error=error,
                    ))
                    ep.history.append((ep.observation, info.get("action") or text.strip()))
                    ep.info = info
                    if terminated or truncated:
                        emit(self._finish(ep, terminated=terminated, truncated=truncated, error=error))
                        continue
                    ep.observation = obs
                    self._prepare_prompt(ep, first=False)
                    still_active.append(ep)
                active = still_active
                refill()
        finally:
            stats.wall_s = time.perf_counter() - start
            for ep in active:
                ep.env.close()
        return stats

    def close(self) -> None:
        for env in self._idle_envs:
            env.close()
        self._idle_envs.clear()
