"""Training learns: if an objective, the loop or a default breaks learning, these fail.

On vaults' first decision (one chamber, one move: the episode is won by the exit its family's rule
marks) from a student that knows none of the families' rules (it was taught amber's), OPD with the
default (full) estimator from a teacher that knows them takes greedy dev success from near chance
to >= 80%; GRPO from the reward alone, from a student that greedy wins none of two families'
first decisions but sometimes samples the right exit, raises greedy dev success by >= 25 points with
a paired 95% interval above 0. Seeded; real model, environment and loop
(``examples/positive_controls`` runs the same controls at the vaults bench's scale)."""

from __future__ import annotations

import json

import pytest

from agentkit.core.evalstats import paired_difference
from agentkit.train import train
from agentkit.train.config import load_config

pytestmark = pytest.mark.slow

FAMILIES = "[basalt, cedar, ember, frost]"  # not amber: the student's one rule is right in none of them
TWO = "[basalt, cedar]"
FIRST = ["env.id=vaults/vaults-v0", "env.max_turns=1", "context.mode=window", "context.window=0", "eval.split=dev",
         "sampling.max_new_tokens=12", "sampling.temperature=1.0", "checkpoint.keep=1", "seed=0"]


def first_decision(families: str) -> list[str]:
    return [*FIRST, f"env.kwargs={{families: {families}, chambers: 1, moves: 1}}"]


def evals(run) -> list[dict]:
    return [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def teacher(vaults_sft_model, tmp_path_factory):
    """The student SFT'd on expert first decisions of the four families: greedy it wins them all."""
    from agentkit.envs import ActionParser, make
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer

    folder = tmp_path_factory.mktemp("teacher")
    demos = folder / "demos.jsonl"
    make_env = lambda: make("vaults/vaults-v0", max_turns=1, action_parser=ActionParser(),  # noqa: E731
                            families=["basalt", "cedar", "ember", "frost"], chambers=1, moves=1)
    write_demonstrations(make_env, load_tokenizer(vaults_sft_model), demos, env_id="vaults/vaults-v0",
                         seeds=range(64), split="train", context="window", window=0)
    run = folder / "run"
    train(load_config(None, [*first_decision(FAMILIES), "objective.name=sft", f"train.demos={demos}",
                             "train.steps=160", "train.lr=1e-2", "eval.every=160", "eval.episodes=32",
                             "eval.at_start=false", f"model={vaults_sft_model}", f"out={run}"]), show_progress=False)
    assert evals(run)[-1]["success_rate"] >= 0.95, "the teacher must know the four rules"
    return run / "checkpoints" / "step-160"


def test_opd_with_the_default_estimator_takes_the_student_to_the_teacher(vaults_sft_model, teacher, tmp_path):
    # lr 3e-3: seeds 0-3 all reach 100% by step 180 (0% -> 50% -> 75% -> 100%). At the 1e-2 this test
    # ran until 2026-12-07 the loss blew up mid-run (0.5 -> 5.5 at step 97) in some runs and not
    # others, on rounding differences of 1e-7 in one gradient: a control that passes by luck.
    run = tmp_path / "opd"
    train(load_config(None, [*first_decision(FAMILIES), "objective.name=opd", f"teacher.spec=model:{teacher}",
                             "rollout.tasks_per_step=32", "rollout.group_size=1", "train.steps=240", "train.lr=3e-3",
                             "train.warmup_steps=10", "eval.every=60", "eval.episodes=64",
                             f"model={vaults_sft_model}", f"out={run}"]), show_progress=False)
    start, end = evals(run)[0]["success_rate"], evals(run)[-1]["success_rate"]
    assert start <= 0.3 and end >= 0.8, (start, end)


@pytest.fixture(scope="module")
def half_taught(vaults_sft_model, tmp_path_factory):
    """The student after 10 SFT steps on expert first decisions of two families: greedy it wins none of
    them, sampled it sometimes takes the right exit (GRPO's groups have a signal)."""
    from agentkit.envs import ActionParser, make
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer

    folder = tmp_path_factory.mktemp("half")
    demos = folder / "demos.jsonl"
    make_env = lambda: make("vaults/vaults-v0", max_turns=1, action_parser=ActionParser(),  # noqa: E731
                            families=["basalt", "cedar"], chambers=1, moves=1)
    write_demonstrations(make_env, load_tokenizer(vaults_sft_model), demos, env_id="vaults/vaults-v0",
                         seeds=range(32), split="train", context="window", window=0)
    train(load_config(None, [*first_decision(TWO), "objective.name=sft", f"train.demos={demos}", "train.steps=10",
                             "train.lr=1e-2", "eval.every=0", f"model={vaults_sft_model}", f"out={folder / 'run'}"]),
          show_progress=False)
    return folder / "run" / "checkpoints" / "step-10"


def test_grpo_raises_dev_success_from_the_reward_alone(half_taught, tmp_path):
    run = tmp_path / "grpo"
    train(load_config(None, [*first_decision(TWO), "objective.name=grpo", "rollout.tasks_per_step=16",
                             "rollout.group_size=8", "train.steps=20", "train.lr=1e-3", "train.warmup_steps=5",
                             "eval.every=20", "eval.episodes=64", f"model={half_taught}", f"out={run}"]),
          show_progress=False)
    first, last = evals(run)[0], evals(run)[-1]
    mean, low, _ = paired_difference(last["won_by_seed"], first["won_by_seed"])
    assert first["success_rate"] <= 0.25 and mean >= 0.25 and low > 0, (first["success_rate"], mean, low)
