"""Peer benchmark: the same multi-turn TextWorld GRPO workload in agentkit and in TRL's ``GRPOTrainer``.

    flock /tmp/agentkit-bench.lock python benchmarks/peer_trl_multiturn.py
    flock /tmp/agentkit-bench.lock python benchmarks/peer_trl_multiturn.py --turns 2 4 8 16 --rounds 2 --steps 2

The default run (2, 4, 8 and 16 turns; 2 rounds of 2 timed steps after 1 warm-up step; 16 episodes
per step) took 8.5 minutes on a quiet 2-core machine. Before each run it waits (``--quiet-wait``, 60 s
at most) until other processes leave ``--threads`` cores free, and it reports the share of the CPUs
other processes took during the runs: on 2 cores one busy neighbour slows two-thread torch
several-fold, so a figure with that share above a few percent is not a measurement. Skips (exit 0)
when trl is missing (``pip install -c constraints.txt trl``).

The game: TextWorld tw-simple (``textworld/simple-v0``'s games, cached under ``$AGENTKIT_CACHE``;
the script generates the ones it needs before timing), registered here as ``peer/textworld-simple-v0``
with one change to the action format: no stop string, and the command is the text inside
``<action></action>`` when there is one, else the whole answer (``ActionParser(require_match=False)``).
The untrained model never writes the tags, so with agentkit's default parser every turn would end
in a canned "invalid format" reply without reaching the game; this way every turn steps the game.

agentkit runs through ``agentkit.train.train`` (Collector -> HFBackend -> GRPO.prepare -> AdamW), chat
context (one growing conversation per episode, trained as one sequence). TRL runs its own
multi-turn path: ``environment_factory`` builds one ``TextWorldGame`` per rollout, which wraps the
same agentkit environment (``agentkit.envs.make``, same wrappers, same turn limit) and exposes one
tool, ``act(response)``; ``GRPOTrainer``'s tool loop generates, parses the answer, calls the tool,
appends the tool's reply as token ids and generates again, and trains on the whole conversation
with the tool replies masked out. Both sides:

- same tiny default model (``agentkit.models.ensure_default_model``), fp32, CPU, one process, ``--threads``;
- same tasks: step ``s`` plays games ``s * tasks_per_step ...`` (TRL: a dataset of seeds, not shuffled),
  ``--group-size`` episodes each; at most ``--max-tokens-per-turn`` tokens per answer (stopping at the
  end-of-turn token); ``--turns`` answers per episode, each stepped in the game (TRL: ``max_tool_calling_iterations``
  = turns - 1, and the reward function steps the last answer, so both sides play every answer);
- same prompts: agentkit's system prompt, then the first observation (agentkit's ``format_observation``)
  as the user message; each reply comes back as a user message holding the formatted observation;
- GRPO as in ``peer_trl.py``: temperature 1, beta 0 (agentkit: ``kl_coef`` 0, no reference model; until
  2026-12-07 its default 0.01 was left on, so agentkit ran a reference TRL did not), one pass and one
  optimizer step per batch, token-mean
  loss (``dapo``), group-std advantages, clip 0.2, gradient clipping 1, AdamW; reward = the episode return.

What differs, and why:

- TRL reads tool calls from the model's text with the tokenizer's response template. The untrained model
  writes no tool-call syntax, so the TRL side sets a response template that reads every answer as a call
  ``act(response=<the answer>)``, and a chat template for its tool messages (agentkit's ChatML template
  plus: a tool message renders as a user message; TRL's checks need assistant tool calls rendered, as
  JSON, but generation and training use the sampled ids, never that rendering). The tool schema is not
  put in the prompt (the model cannot use it), so the prompt tokens are agentkit's.
- An answer cut at the length limit: agentkit closes it with ``<|im_end|>`` before the next observation,
  TRL does not (one token per such turn); an answer that is only the end-of-turn token ends TRL's
  episode (no tool call) while agentkit plays it as an empty command.
- An episode the game ends early (won or lost) stops in agentkit; TRL's tool loop has no "done" signal,
  so it keeps generating until the turn limit (the tool answers "The game is over."). The untrained
  model does not win tw-simple, so this does not happen in practice.
- agentkit's loop runs one extra, untimed final step (it evaluates and checkpoints at the last step).

TRL runs in the two configurations of ``peer_trl.py``: its ``GRPOConfig`` defaults (gradient
checkpointing on) and ``expert`` (gradient checkpointing off, as one would for a model this small).
Each side runs in its own subprocess; for every turn count the three take turns (the order rotates
every round). Figures are medians over rounds of samples (episodes) or generated tokens per second of
wall time over the timed steps.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from peer_trl import (
    SIDES,
    AgentkitClock,
    TrlClock,
    add_run_arguments,
    rotated,
    run_side,
    run_this_side,
    summarize,
    trl_grpo_config,
)

ENV_ID = "peer/textworld-simple-v0"
CHALLENGE = "tw-simple"
OBSERVATION_TOKENS = 512  # room per turn for the game's reply in TRL's whole-completion budget (never reached)
# agentkit's ChatML template (agentkit.models.CHAT_TEMPLATE), plus tool messages and assistant tool calls
TOOL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|im_start|>user\n{{ message['content'] }}<|im_end|>\n"
    "{% elif message['tool_calls'] is defined and message['tool_calls'] %}<|im_start|>assistant\n"
    "{{ message['content'] }}{% for call in message['tool_calls'] %}<tool_call>{{ call['function'] | tojson }}"
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# transformers' response template: the whole answer, up to the end-of-turn token, is one call of act()
ACT_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant", "content": ""},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {"tool_calls": {"close_pattern": r"<\|im_end\|>\s*", "content": "text", "repeats": True,
                              "transform": {"type": "function",
                                            "function": {"name": "act", "arguments": {"response": "{content}"}}}}},
}


def action_format():
    from agentkit.envs import ACTION_TAG, ActionFormat, ActionParser

    return ActionFormat(ACTION_TAG.instruction, parser=ActionParser(require_match=False))


def register_env() -> None:
    from agentkit.envs import registry

    registry.register(ENV_ID, "agentkit.envs.textworld_env:TextWorldEnv", action_format=action_format(),
                      requires=("textworld",), extra="textworld", overwrite=True, challenge=CHALLENGE)


if __name__ == "__mp_main__":  # an environment worker process (--env-workers) imports this script as its main
    register_env()


def task_seeds(args) -> range:
    return range(args.tasks_per_step * (args.warmup + args.steps + 1))


class TextWorldGame:
    """TRL's environment: one agentkit TextWorld episode per rollout; ``act`` is the model's tool."""

    def __init__(self, max_turns: int, show_admissible: bool) -> None:
        from agentkit.envs import make

        self._env = make(ENV_ID, max_turns=max_turns, action_parser="format")
        self._show_admissible = show_admissible
        self.episode_return = 0.0
        self.over = True

    def _format(self, observation: str, info: dict, first: bool) -> str:
        from agentkit.rollout.context import format_observation

        return format_observation(observation, info, show_admissible=self._show_admissible, first=first)

    def reset(self, seed: int, **kwargs) -> str:
        observation, info = self._env.reset(seed=int(seed))
        self.episode_return, self.over = 0.0, False
        return self._format(observation, info, first=True)

    def act(self, response: str) -> str:
        """Play an answer in the game.

        Args:
            response: the answer; the command is the text inside <action></action>, or the whole answer.

        Returns:
            What the game says back.
        """
        if self.over:
            return "The game is over."
        observation, reward, terminated, truncated, info = self._env.step(response)
        self.episode_return += float(reward)
        self.over = bool(terminated or truncated)
        return self._format(observation, info, first=False)


class EnvClock:
    """Times every ``reset`` and ``step`` of the TextWorld adapter, on either side (patched on the class)."""

    def __init__(self) -> None:
        from agentkit.envs.textworld_env import TextWorldEnv

        self.calls: list[tuple[str, float, float]] = []  # (method, start, seconds)
        for name in ("reset", "step"):
            original = getattr(TextWorldEnv, name)

            def timed(self, *a, _name=name, _original=original, _calls=self.calls, **k):
                start = time.perf_counter()
                try:
                    return _original(self, *a, **k)
                finally:
                    _calls.append((_name, start, time.perf_counter() - start))

            setattr(TextWorldEnv, name, timed)

    def result(self, window: tuple[float, float]) -> dict:
        """Seconds in ``reset`` and in ``step`` of the calls that start in ``window``."""
        timed = [(name, seconds) for name, start, seconds in self.calls if window[0] <= start < window[1]]
        return {"env_s": sum(seconds for _, seconds in timed),
                "env_reset_s": sum(seconds for name, seconds in timed if name == "reset")}


def answer_text(message: dict) -> str:
    """The answer an assistant message holds: its act() call's argument (every answer is one)."""
    calls = message.get("tool_calls") or []
    return calls[0]["function"]["arguments"]["response"] if calls else message.get("content", "")


def run_agentkit(args, model_dir: Path, work: Path, turns: int) -> dict:
    import torch

    from agentkit.train import train

    torch.set_num_threads(args.threads)
    register_env()
    clock, env_clock = AgentkitClock(), EnvClock()
    result = clock.result(train(agentkit_config(args, model_dir, work, turns), show_progress=False).run_dir,
                          args.warmup, args.steps)
    return result | env_clock.result(result["window"])


def agentkit_config(args, model_dir: Path, work: Path, turns: int):
    """agentkit's side of the workload: the training settings (TRL's: ``run_trl``'s ``trl_grpo_config``)."""
    from agentkit.train.config import TrainConfig

    return TrainConfig.model_validate({
        "model": str(model_dir), "out": str(work / "agentkit-run"), "seed": args.seed,
        "env": {"id": ENV_ID, "kwargs": {}, "max_turns": turns, "workers": args.env_workers},
        "rollout": {"tasks_per_step": args.tasks_per_step, "group_size": args.group_size},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": args.max_tokens_per_turn},
        "context": {"mode": "chat", "show_admissible": args.show_admissible},
        "objective": {"name": "grpo", "args": {"clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.0}},
        "train": {"steps": args.warmup + args.steps + 1, "lr": 1e-5, "grad_clip": 1.0},  # + 1: the untimed last step
        "eval": {"every": 0, "episodes": 1, "split": "train"},
        "checkpoint": {"every": 0, "keep": 1},
    })


def run_trl(args, model_dir: Path, work: Path, turns: int, config: str) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    torch.set_num_threads(args.threads)
    register_env()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = ACT_RESPONSE_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    system = {"role": "system", "content": action_format().instruction}
    # reset() gets each row's seed and returns the first observation, which TRL appends to the empty user message
    dataset = Dataset.from_list([{"prompt": [system, {"role": "user", "content": ""}], "seed": seed}
                                 for seed in task_seeds(args)])

    def episode_return(completions, environments, **kwargs) -> list[float]:
        for messages, game in zip(completions, environments, strict=True):
            game.act(answer_text(messages[-1]))  # the last answer, which the tool loop leaves unplayed
        return [game.episode_return for game in environments]

    clock, env_clock = TrlClock(), EnvClock()
    config_args = trl_grpo_config(
        out=work / "trl-run", config=config, seed=args.seed, steps=args.warmup + args.steps,
        samples=args.tasks_per_step * args.group_size, group_size=args.group_size,
        max_completion=turns * (args.max_tokens_per_turn + OBSERVATION_TOKENS),  # the whole conversation's budget
        generation_kwargs={"max_new_tokens": args.max_tokens_per_turn}, max_tool_calling_iterations=turns - 1,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=episode_return, args=config_args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[clock.callback],
                          environment_factory=functools.partial(TextWorldGame, turns, args.show_admissible))
    trainer.train()
    result = clock.result(args.warmup, args.steps)
    return result | env_clock.result(result["window"]) | {"trl_version": trl.__version__,
                     "gradient_checkpointing": config_args.gradient_checkpointing}


def print_tables(args, summaries: dict[int, dict[str, dict]]) -> None:
    samples_per_step = args.tasks_per_step * args.group_size
    print(f"\n{samples_per_step} episodes per step ({args.tasks_per_step} tasks x group {args.group_size}), "
          f"<= {args.max_tokens_per_turn} tokens per answer, {args.steps} timed steps, {args.rounds} rounds\n")
    print("| turns | agentkit samples/s | agentkit tok/s | TRL defaults samples/s | TRL defaults tok/s | "
          "TRL expert samples/s | TRL expert tok/s | agentkit / TRL defaults | agentkit / TRL expert |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for turns, summary in summaries.items():
        ours = summary["agentkit"]
        cells = [f"{summary[side]['samples_per_s']:.2f} | {summary[side]['tokens_per_s']:.0f}" for side in SIDES]
        ratios = []
        for side in SIDES[1:]:
            per_round = [a["samples_per_s"] / t["samples_per_s"]
                         for a, t in zip(ours["per_round"], summary[side]["per_round"], strict=True)]
            ratios.append(f"**{statistics.median(per_round):.2f}x** ({', '.join(f'{r:.2f}' for r in per_round)})")
        print(f"| {turns} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    first = next(iter(summaries))
    print(f"\nstep seconds (x the {first}-turn step), and generation's and the game's shares of the step\n")
    print("| turns | " + " | ".join(f"{side} step s | {side} generation / game" for side in SIDES)
          + " | tokens/episode | other processes' CPU (max) |")
    print("| --- |" + " --- | --- |" * len(SIDES) + " --- | --- |")
    for turns, summary in summaries.items():
        cells = [f"{summary[side]['step_s']:.2f} ({summary[side]['step_s'] / summaries[first][side]['step_s']:.1f}x) | "
                 f"{summary[side]['generate_share']:.0%} / {summary[side]['env_share']:.0%}" for side in SIDES]
        tokens = "/".join(f"{summary[side]['tokens_per_sample']:.0f}" for side in SIDES)
        foreign = max(summary[side]["foreign_cpu_share_max"] for side in SIDES)
        print(f"| {turns} | {' | '.join(cells)} | {tokens} | {foreign:.0%} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8, 16], help="Turn counts to measure.")
    parser.add_argument("--tasks-per-step", type=int, default=2, help="Games per optimizer step.")
    parser.add_argument("--group-size", type=int, default=8, help="Episodes per game (GRPO group).")
    parser.add_argument("--max-tokens-per-turn", type=int, default=16, help="Most generated tokens per answer.")
    parser.add_argument("--show-admissible", action="store_true", help="List the admissible commands each turn.")
    parser.add_argument("--env-workers", type=int, default=0,
                        help="agentkit's environment worker processes (0: in its process, as TRL's); with workers the "
                             "next step's resets run during the update, and the game's share is not timed.")
    add_run_arguments(parser, steps=2, rounds=2)  # rounds: runs of each side per turn count
    args = parser.parse_args()

    if importlib.util.find_spec("trl") is None:
        print("peer_trl_multiturn: trl is not installed; skipping (pip install -c constraints.txt trl).")
        return 0
    if min(args.turns) < 2:
        parser.error("--turns: a multi-turn peer needs 2 or more turns")
    from agentkit.models import ensure_default_model

    model_dir = ensure_default_model()
    if args.side is not None:  # one run, in this subprocess
        (turns,) = args.turns
        return run_this_side(args, run_agentkit, run_trl, model_dir, turns)

    from agentkit.envs.textworld_env import TextWorldEnv

    TextWorldEnv(CHALLENGE).prepare(task_seeds(args))  # generate the games before anything is timed
    forwarded = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                 if k not in ("side", "json", "rounds", "turns", "show_admissible")]
    forwarded += ["--show-admissible"] if args.show_admissible else []
    results: dict[int, dict[str, list[dict]]] = {turns: {side: [] for side in SIDES} for turns in args.turns}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for turns in args.turns:
                for side in rotated(SIDES, round_index):
                    out = Path(tmp) / f"{side}-{turns}-{round_index}.json"
                    results[turns][side].append(run_side(__file__, [*forwarded, f"--turns={turns}"], side, out,
                                                         args.quiet_wait, args.threads))
                    print(f"round {round_index + 1}, {turns} turns, {side}: {results[turns][side][-1]}", flush=True)
    samples_per_step = args.tasks_per_step * args.group_size
    summaries = {turns: {side: summarize(side, rs, samples_per_step, args.steps)
                         | {"env_share": statistics.median(r["env_s"] / r["wall_s"] for r in rs)}
                         for side, rs in by_side.items()}
                 for turns, by_side in results.items()}
    print(json.dumps({"trl_version": results[args.turns[0]]["trl-defaults"][0]["trl_version"],
                      "summaries": summaries}, indent=1))
    print_tables(args, summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
