"""Expert demonstrations in the trajectory format, as if the policy had answered.

Plays each task's ``info['expert_plan']`` and records every turn exactly as the collector would
(same chat or window context, same observation formatting), with the response
``<action>{expert action}</action>`` tokenized by the policy's tokenizer. Nothing was sampled, so
``response_logprobs`` are 0.0 placeholders and ``sampling`` says ``{"source": "expert"}``; SFT
reads only the ids.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentkit.envs.protocol import Env
from agentkit.rollout.context import (
    DEFAULT_SYSTEM_PROMPT,
    ChatContext,
    WindowContext,
    encode,
    format_observation,
)

from agentkit.core.errors import EnvError
from agentkit.core.trajectory import ContextMode, Trajectory, Turn


def expert_response(action: str, parses_actions: bool) -> str:
    return action if parses_actions else f"<action>{action}</action>"


def play_demonstration(env: Env, tokenizer: Any, *, env_id: str, seed: int, split: str, context: ContextMode = "chat",
                       window: int = 3, show_admissible: bool = True, parses_actions: bool = False,
                       system_prompt: str = DEFAULT_SYSTEM_PROMPT, model: str = "") -> Trajectory:
    """One expert episode. ``env`` must be built with the same action parser the policy will use."""
    chat = ChatContext(tokenizer, system_prompt) if context == "chat" else None
    win = WindowContext(tokenizer, system_prompt, window) if context == "window" else None
    obs, info = env.reset(seed=seed)
    if "expert_plan" not in info:
        raise EnvError(f"{env_id} gives no info['expert_plan']: it has no expert to demonstrate.")
    task, privileged = info.get("task") or "", info.get("privileged")
    turns: list[Turn] = []
    history: list[tuple[str, str]] = []
    terminated = truncated = False
    while not (terminated or truncated):
        plan = info.get("expert_plan") or []
        if not plan:
            break
        user_text = format_observation(obs, info, show_admissible=show_admissible, first=not turns)
        if chat is not None:
            new_context = chat.first(user_text) if not turns else chat.next(turns[-1].response_ids, user_text)
        else:
            new_context = win.prompt(task, history, user_text, len(turns))
        text = expert_response(plan[0], parses_actions)
        response_ids = encode(tokenizer, text)
        start = time.perf_counter()
        next_obs, reward, terminated, truncated, info = env.step(text)
        turns.append(Turn(observation=obs, context_ids=new_context, response_ids=response_ids,
                          response_logprobs=[0.0] * len(response_ids), response_text=text,
                          action=info.get("action", plan[0]), action_valid=bool(info["action_valid"]),
                          reward=float(reward), feedback=next_obs, env_s=time.perf_counter() - start))
        history.append((obs, plan[0]))
        obs = next_obs
    group = f"{env_id}|{split}|{seed}"
    return Trajectory(
        id=f"{group}|0", env=env_id, task=task, seed=seed, split=split, group=group, sample=0, turns=turns,
        episode_return=float(sum(t.reward for t in turns)), won=bool(info.get("won")), score=float(info.get("score") or 0.0),
        terminated=terminated, truncated=truncated, model=model, sampling={"source": "expert"}, context_mode=context,
        privileged=privileged, created_at=time.time(),
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
