"""Expert demonstrations in the trajectory format, as if the policy had answered.

Plays each task's ``info['expert_plan']`` and records every turn exactly as the collector would
(same context builder, system prompt and observation formatting), with the expert action written
as the environment's action format renders it (``<action>{expert action}</action>`` for most)
and tokenized by the policy's tokenizer. Nothing was sampled, so ``response_logprobs`` are 0.0
placeholders and ``sampling`` says ``{"source": "expert"}``; SFT reads only the ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentkit.envs.formats import ActionFormat
from agentkit.envs.protocol import Env
from agentkit.envs.registry import env_info
from agentkit.rollout.collector import env_answer_problem
from agentkit.rollout.context import encode_data, format_observation, make_context, task_type_of

from agentkit.core.errors import EnvError
from agentkit.core.settings import ContextSettings, default
from agentkit.core.trajectory import ContextMode, Trajectory, Turn, episode_group, episode_id


def _check(env_id: str, seed: int, op: str, answer: Any) -> None:
    problem = env_answer_problem(op, answer)
    if problem is not None:
        raise EnvError(f"{env_id} (seed {seed}): the expert's episode cannot be recorded, since the environment's "
                       f"{op}() answer is unusable: {problem}. Fix the environment.")


def play_demonstration(env: Env, tokenizer: Any, *, env_id: str, seed: int, split: str, context: ContextMode = "chat",
                       window: int = default(ContextSettings, "window"),
                       show_admissible: bool = default(ContextSettings, "show_admissible"), action_format: ActionFormat | None = None,
                       system_prompt: str | None = None, model: str = "") -> Trajectory:
    """One expert episode. ``env`` must be built with the same action parser the policy will use
    (``make(..., action_parser="format")``). ``action_format`` and ``system_prompt`` default to the
    environment's (``env_info(env_id)``), as the collector's do."""
    fmt = action_format or env_info(env_id).action_format
    builder = make_context(context, tokenizer, fmt.instruction if system_prompt is None else system_prompt, window)
    answer = env.reset(seed=seed)
    _check(env_id, seed, "reset", answer)
    obs, info = answer
    if "expert_plan" not in info:
        raise EnvError(f"{env_id} gives no info['expert_plan']: it has no expert to demonstrate.")
    task, privileged, task_type = info.get("task") or "", info.get("privileged"), task_type_of(info)
    state = builder.start(task)
    turns: list[Turn] = []
    terminated = truncated = False
    while not (terminated or truncated):
        plan = info.get("expert_plan") or []
        if not plan:
            break
        user_text = format_observation(obs, info, show_admissible=show_admissible, first=not turns)
        new_context = builder.next_turn(state, user_text)
        text = fmt.render(plan[0])
        response_ids = encode_data(tokenizer, text)
        state_privileged = info.get("privileged")
        start = time.perf_counter()
        answer = env.step(text)
        _check(env_id, seed, "step", answer)
        next_obs, reward, terminated, truncated, info = answer
        turns.append(Turn(observation=obs, context_ids=new_context, response_ids=response_ids,
                          response_logprobs=[0.0] * len(response_ids), response_text=text,
                          action=info.get("action", plan[0]), action_valid=bool(info["action_valid"]),
                          reward=float(reward), feedback=next_obs, env_s=time.perf_counter() - start,
                          privileged=state_privileged, action_read=info.get("action_read")))
        builder.end_turn(state, obs, plan[0], response_ids)
        obs = next_obs
    return Trajectory(
        id=episode_id(env_id, split, seed, 0), env=env_id, task=task, seed=seed, split=split,
        group=episode_group(env_id, split, seed), sample=0, turns=turns,
        episode_return=float(sum(t.reward for t in turns)), won=bool(info.get("won")), score=float(info.get("score") or 0.0),
        terminated=terminated, truncated=truncated, model=model, sampling={"source": "expert"}, context_mode=builder.mode,
        privileged=privileged, task_type=task_type, created_at=time.time(),
    )


def write_demonstrations(make_env: Callable[[], Env], tokenizer: Any, out, *, env_id: str, seeds, split: str,
                         mode: str = "new", **kwargs) -> tuple[int, int]:
    """Play the expert on ``seeds`` and write the won episodes; return (written, lost)."""
    from agentkit.core.jsonl import TrajectoryWriter

    env = make_env()
    written = lost = 0
    try:
        with TrajectoryWriter(out, mode=mode) as writer:
            for seed in seeds:
                trajectory = play_demonstration(env, tokenizer, env_id=env_id, seed=seed, split=split, **kwargs)
                if trajectory.won:
                    writer.write(trajectory)
                    written += 1
                else:
                    lost += 1
    finally:
        env.close()
    return written, lost
