"""Can the seeds' claims show at nano scale? SDAR and SAGE-OPD on vaults, judged on runs that learn:
a dev-split sweep frozen before test, paired seeds and bootstrap intervals.

    python examples/vaults_bench/run.py --out runs/vaults-bench        # the whole grid: 80 min on 2 cores (--jobs 2)
    python examples/vaults_bench/run.py --out /tmp/vb-quick --quick    # every stage on tiny budgets (CI)
    python examples/vaults_bench/run.py --out runs/vaults-bench --report-only

The environment (``vaults/vaults-v0``, ``envs/vaults_env.py``): each task is a vault of a family;
one marked exit is right in every chamber of every vault of that family (the family's rule). The
family name is in every observation, the rule only in a skill ("In kelp vaults take the exit marked
sun."). The grid plays a vault's first decision (``FIRST_DECISION``: one chamber, one move), the
decision the rule decides, on ``RL_FAMILIES``: the setting in which the positive controls
(``examples/positive_controls``) learn, GRPO included (many distinct tasks per step, a group of 8).

Stages, each cached in ``OUT/`` (a stage whose output exists is skipped; the same command continues
an interrupted grid):

1. ``prepare``  the tiny model; a rule bank for the self-teacher (one skill per named family, no
   ``applies_to`` filter, so a retriever can hand a task the wrong family's rule); expert
   demonstrations of whole vaults on the 240 *practice* families (rules drawn over all 12 markers,
   so memorizing does not pay: the rule has to be read), most of them with the right skill as the
   self-teacher renders it; SFT (the student, and the self-teacher: same weights, skill in front).
   OPD's and SAGE-OPD's teacher: a separate policy, the student SFT'd further on expert games of the
   12 named families without skills (it knows their rules). The positive controls start from it too.
2. ``premise``  before any RL, on dev first decisions: the student without skills, with the right
   skill, with a wrong family's skill (teacher-forced expert actions and greedy play), the teacher.
3. ``pilot``    GRPO on dev at ``PILOT_LRS`` for ``pilot_steps``; the best final dev success fixes the
   shared lr; that run fixes every run's budget (steps x tasks x group): the pilot's length, or,
   when it gained beyond noise, the checkpoint with 90% of its gain.
4. ``sweep``    each method's coefficient on dev only (``SWEEP``), one seed each; the best dev success
   per method is frozen in ``OUT/frozen.json`` before anything is evaluated on test.
5. ``main``     every arm (``ARMS``) x ``--seeds`` with the frozen settings, same budget, the same KL
   coefficient (the objectives' 0.01 wherever there is one), paired seeds (seed s draws the same
   training tasks and sampling seeds in every arm); curves on dev, then greedy on ``test_games``
   test games (without skills; Skill-GRPO also with them).
6. ``phrasings``  SAGE-OPD's *semantically valid alternative*: the student SFT'd further on the same
   practice games with every exit said one of ``PHRASINGS``' ways (``take the anchor exit``; the teacher
   says ``go anchor`` only), then OPD and SAGE-OPD from it (``PHRASED_ARMS``, frozen settings, the same
   seeds). The environment reports each action as it read it (``info['action_read']``), so the oracle
   judge sees the teacher's action in the student's words; the stage counts those turns, their labels,
   and what each method does to the student's wording.
7. the report (``report.py``): premise, pilot, sweep, per-claim paired differences with bootstrap
   95% intervals over seeds and games and the minimum detectable effect, curves with the seeds'
   band, SDAR's gate and SAGE-OPD's turn labels over training, time.

Departures, on purpose: SAGE-OPD's judge is the ``oracle`` (the expert action; a tiny teacher cannot
write a label); SDAR's retriever is ``keyword`` (BM25 on the task text, which names the family) with
``k = 1``; ``ucb`` ranks skills by mean reward over all families, which is not what this bank is for.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentkit.core import runs

HERE = Path(__file__).resolve().parent
ENV_ID = "vaults/vaults-v0"
TEACHER_FAMILIES = "all"  # OPD's teacher learns the 12 named families' rules; SFT sees only the practice families
RL_FAMILIES = ["amber", "basalt", "cedar"]  # the grid's tasks: few families, many tasks per step (the GRPO control)
FIRST_DECISION = {"chambers": 1, "moves": 1}  # the grid's episode: a vault's first decision, the one the rule decides
DEAD_ENDS = True  # a wrong exit leads into a dead end; `go back` (never in a demonstration) leads out
GROUP = "objective.args.aggregation=sequence-mean"  # GRPO's family, as in the GRPO control
SELF = ["teacher.privileged=[skills]", "skills.retrieval=keyword", "skills.k=1"]
TEACHER = "teacher.spec=model:{teacher}"
SAGE = ["objective.name=sage_opd", TEACHER, "objective.args.judge=oracle"]
SEEDS = (0, 1, 2)
SWEEP_SEED = 100  # the sweep's own seed: none of the main grid's training draws


def _nano():
    """The generic helpers of examples/nano_repro/run.py (train-or-resume, jsonl, process liveness)."""
    spec = importlib.util.spec_from_file_location("nano_repro_run", HERE.parent / "nano_repro" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Budget:
    demos: int = 1024
    hinted_share: float = 0.875
    sft_steps: int = 600
    sft_lr: float = 3e-3
    teacher_demos: int = 384
    teacher_steps: int = 200
    premise_games: int = 128
    pilot_steps: int = 40
    min_steps: int = 10
    tasks_per_step: int = 32
    group_size: int = 8
    warmup_steps: int = 10
    curve_points: int = 4
    curve_games: int = 128
    test_games: int = 256
    max_turns: int = 8  # stage 1's whole vaults; RL plays FIRST_DECISION, one turn
    max_new_tokens: int = 12
    phrasing_demos: int = 1024  # stage 6: the same practice games, each exit said one of PHRASINGS' ways
    phrasing_steps: int = 200


QUICK = Budget(demos=16, sft_steps=4, teacher_demos=4, teacher_steps=2, premise_games=4, pilot_steps=2, min_steps=1,
               tasks_per_step=2, group_size=2, warmup_steps=1, curve_points=1, curve_games=4, test_games=6, max_turns=4,
               phrasing_demos=4, phrasing_steps=2)
PILOT_LRS = (3e-4, 1e-3)  # the controls' lr and a third of it

# arm -> (objective, overrides); "{lr}" and the method's swept keys are filled from frozen.json
# OPD and SAGE-OPD run with the default estimator (`full`, on which their claims are judged) and with
# the papers' (`sampled`); SAGE-OPD's ablations with the default
ARMS: dict[str, list[str]] = {
    "grpo": ["objective.name=grpo", GROUP],
    "sdar": ["objective.name=sdar", GROUP, *SELF],
    "sdar-random": ["objective.name=sdar", GROUP, *SELF, "skills.retrieval=random"],
    "grpo_opsd": ["objective.name=grpo_opsd", GROUP, *SELF],
    "opsd": ["objective.name=opsd", GROUP, *SELF],
    "skill_grpo": ["objective.name=skill_grpo", GROUP, "skills.retrieval=keyword", "skills.k=1"],
    "opd": ["objective.name=opd", TEACHER],
    "opd-sampled": ["objective.name=opd", TEACHER, "objective.args.estimator=sampled"],
    "sage_opd": SAGE,
    "sage_opd-sampled": [*SAGE, "objective.args.estimator=sampled"],
    "sage_opd-s=i": [*SAGE, "objective.args.confidence=false"],
    "sage_opd-noZ": [*SAGE, "objective.args.normalize=false"],
}
# which swept method's frozen settings an arm takes
METHOD_OF = {"grpo": "grpo", "skill_grpo": "grpo", "opsd": "grpo", "sdar": "sdar", "sdar-random": "sdar",
             "grpo_opsd": "grpo_opsd", "opd": "grpo", "opd-sampled": "grpo", "sage_opd": "grpo",
             "sage_opd-sampled": "grpo", "sage_opd-s=i": "grpo", "sage_opd-noZ": "grpo"}
# method -> candidate coefficients (dev only, at the pilot's lr); methods without one take the pilot's lr
SWEEP: dict[str, list[dict[str, Any]]] = {
    "sdar": [{"lam": lam, "beta": 5.0} for lam in (0.01, 0.1, 1.0)],
    "grpo_opsd": [{"lam": lam} for lam in (0.01, 1.0)],
}
SWEEP_ARM = {"sdar": "sdar", "grpo_opsd": "grpo_opsd"}
# stage 6, SAGE-OPD's "semantically valid alternative": these arms again, from a student that says an exit
# several ways (the teacher says `go <marker>` only), with the frozen lr and budget
PHRASED_ARMS = ("opd", "sage_opd")
DIAGNOSTICS = ("gate_mean", "gate_above_half", "gap_mean", "negative_gap_share", "reverse_kl", "judge_skip_share",
               "judge_weak_share", "judge_strong_share", "judge_check_share", "judge_alternative_share",
               "judge_alternative_skip_share", "confidence_mean", "Z", "kl")
OVER_TIME = ("gate_above_half", "gate_mean", "judge_skip_share", "judge_weak_share", "judge_strong_share",
             "judge_alternative_share")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/vaults-bench", help="Folder for everything the grid writes.")
    parser.add_argument("--report", default=None, help="Markdown report (default OUT/vaults_bench.md); PNGs beside it.")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="Main-grid seeds (paired across arms).")
    parser.add_argument("--only", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM",
                        help=f"Main-grid arms: {', '.join(ARMS)}.")
    parser.add_argument("--jobs", type=int, default=2,
                        help="Runs at a time (one thread each); 0: one after another in this process.")
    parser.add_argument("--quick", action="store_true", help="Tiny budgets: checks that every stage runs, learns nothing.")
    parser.add_argument("--report-only", action="store_true", help="Write the report from what has finished.")
    parser.add_argument("--run-one", nargs=2, metavar=("STAGE", "NAME"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------- settings


def env_kwargs(families: str | list[str], *, first_decision: bool) -> dict[str, Any]:
    """The vaults settings: stage 1 plays whole vaults, the grid (RL, premise, test) a vault's first decision."""
    return {"families": families, "dead_ends": DEAD_ENDS, **(FIRST_DECISION if first_decision else {})}


def base_overrides(budget: Budget, kwargs: dict[str, Any]) -> list[str]:
    def yaml(value) -> str:
        if isinstance(value, list):
            return "[" + ", ".join(value) + "]"
        return str(value).lower() if isinstance(value, bool) else str(value)

    inline = ", ".join(f"{k}: {yaml(v)}" for k, v in kwargs.items())
    turns = kwargs.get("moves", budget.max_turns)
    return [f"env.id={ENV_ID}", f"env.kwargs={{{inline}}}", "eval.split=dev",
            f"env.max_turns={turns}", f"sampling.max_new_tokens={budget.max_new_tokens}",
            "context.mode=window", "context.window=0", "checkpoint.keep=1"]


def budget_of(budget: Budget, out: Path) -> dict[str, Any]:
    """The pilot's choice: shared lr and RL steps (``pilot.json``)."""
    return json.loads((out / "pilot.json").read_text())["chosen"]


def rl_overrides(budget: Budget, arm: str, settings: dict[str, Any], *, lr: float, steps: int, seed: int,
                 model: Path, teacher: Path, bank: Path, out: Path) -> list[str]:
    every = max(1, steps // budget.curve_points)
    overrides = [o.replace("{teacher}", str(teacher)) for o in ARMS[arm]]
    overrides += [f"objective.args.{k}={v}" for k, v in settings.items() if k != "lr_scale"]
    lr = lr * settings.get("lr_scale", 1.0)
    return [*base_overrides(budget, env_kwargs(RL_FAMILIES, first_decision=True)), *overrides, f"skills.bank={bank}",
            f"train.lr={lr:.3g}", f"train.steps={steps}", f"train.warmup_steps={min(budget.warmup_steps, steps)}",
            f"rollout.tasks_per_step={budget.tasks_per_step}", f"rollout.group_size={budget.group_size}",
            "sampling.temperature=1.0", f"eval.every={every}", f"eval.episodes={budget.curve_games}",
            f"checkpoint.every={every}", f"seed={seed}", f"model={model}", f"out={out}"]


def load(overrides: list[str]):
    from agentkit.train.config import load_config

    return load_config(None, overrides)


# ---------------------------------------------------------------- stage 1: model, bank, demonstrations, SFT


def write_bank(path: Path) -> None:
    """One skill per named family, for any vaults task (no per-family ``applies_to``)."""
    from agentkit.envs.vaults_env import META_FAMILIES, TARGET_FAMILIES, rule_text
    from agentkit.skillbank import Skill, SkillBank

    bank = SkillBank([Skill(id=f"vaults.{f}", title=f"The right exit in {f} vaults", text=rule_text(f),
                            keywords=[f], applies_to=[ENV_ID]) for f in (*META_FAMILIES, *TARGET_FAMILIES)])
    bank.save(path)


def practice_bank():
    from agentkit.envs.vaults_env import PRACTICE_FAMILIES, rule_text
    from agentkit.skillbank import Skill, SkillBank

    return SkillBank([Skill(id=f"vaults.{f}", title=f"The right exit in {f} vaults", text=rule_text(f), keywords=[f])
                      for f in PRACTICE_FAMILIES])


def with_skill(trajectory, skill_ids: list[str], bank, tokenizer):
    """The episode as the self-teacher sees it: the skills block before every turn's prompt."""
    from agentkit.teachers.context import prefix_ids, privileged_text

    t = dataclasses.replace(trajectory, skills=skill_ids)
    block = prefix_ids(tokenizer, privileged_text(t, ["skills"], bank))
    return dataclasses.replace(t, turns=[dataclasses.replace(x, context_ids=block + x.context_ids) for x in t.turns],
                               id=t.id + "|skill")


def expert_games(tokenizer, *, families: str | list[str], split: str, seeds, budget: Budget,
                 first_decision: bool = False) -> list:
    from agentkit.rollout.demos import play_demonstration
    from agentkit.rollout.run import env_factory

    kwargs = env_kwargs(families, first_decision=first_decision)
    env = env_factory(ENV_ID, split=split, max_turns=kwargs.get("moves", budget.max_turns), env_kwargs=kwargs)()
    try:
        return [play_demonstration(env, tokenizer, env_id=ENV_ID, seed=s, split=split, model="expert",
                                   context="window", window=0) for s in seeds]
    finally:
        env.close()


def reword(trajectory, rng: random.Random, tokenizer):
    """The expert's game in other words: every exit taken said one of ``PHRASINGS``' ways, drawn by ``rng``."""
    from agentkit.envs.registry import env_info
    from agentkit.envs.vaults_env import PHRASINGS, parse_move
    from agentkit.rollout.context import encode_data

    render = env_info(ENV_ID).action_format.render
    turns = []
    for turn in trajectory.turns:
        move = parse_move(turn.action or "")
        if move in (None, "back"):
            turns.append(turn)
            continue
        action = rng.choice(PHRASINGS).format(m=move)
        ids = encode_data(tokenizer, render(action))
        turns.append(dataclasses.replace(turn, action=action, response_text=render(action), response_ids=ids,
                                         response_logprobs=[0.0] * len(ids)))
    return dataclasses.replace(trajectory, turns=turns)


def write_jsonl(path: Path, rows) -> None:
    from agentkit.core.jsonl import TrajectoryWriter

    partial = path.with_suffix(".partial")
    with TrajectoryWriter(partial, mode="overwrite") as writer:
        for row in rows:
            writer.write(row)
    partial.rename(path)


def sft(budget: Budget, *, model: Path, demos: Path, out: Path, steps: int, lr: float, families: str) -> Path:
    cfg = load([*base_overrides(budget, env_kwargs(families, first_decision=False)), "objective.name=sft",
                f"train.lr={lr}", "train.demos_per_step=16", f"train.steps={steps}", "eval.every=0",
                "eval.episodes=4", f"checkpoint.every={steps}", "seed=0", f"model={model}", f"train.demos={demos}",
                f"out={out}"])
    NANO.run_training(cfg)
    return runs.checkpoint_dir(out, steps)


def prepare(budget: Budget, out: Path, times: dict[str, float]) -> None:
    from agentkit.rollout.hf_backend import load_tokenizer

    from agentkit.models import init_model

    started = time.perf_counter()
    if not (out / "model-init" / "config.json").exists():
        init_model(out / "model-init", size="tiny", seed=0, include_textworld=False)
    if not (out / "bank.yaml").exists():
        write_bank(out / "bank.yaml")
    tokenizer = load_tokenizer(out / "model-init")
    if not (out / "demos.jsonl").exists():
        bank, rng = practice_bank(), random.Random(0)
        games = expert_games(tokenizer, families="practice", split="train", seeds=range(budget.demos), budget=budget)
        write_jsonl(out / "demos.jsonl", [with_skill(g, [f"vaults.{g.task_type}"], bank, tokenizer)
                                          if rng.random() < budget.hinted_share else g for g in games])
    if not (out / "teacher-demos.jsonl").exists():  # the RL families' rules, never a wrong exit
        games = expert_games(tokenizer, families=TEACHER_FAMILIES, split="train",
                             seeds=range(10**5, 10**5 + budget.teacher_demos),
                             budget=budget)
        write_jsonl(out / "teacher-demos.jsonl", games)
    student = sft(budget, model=out / "model-init", demos=out / "demos.jsonl", out=out / "sft",
                  steps=budget.sft_steps, lr=budget.sft_lr, families="practice")
    # from the student: trained from scratch on 384 games a tiny model sometimes stalls before it learns the rules
    sft(budget, model=student, demos=out / "teacher-demos.jsonl", out=out / "teacher", steps=budget.teacher_steps,
        lr=budget.sft_lr, families=TEACHER_FAMILIES)
    times.setdefault("prepare", time.perf_counter() - started)


def student_dir(budget: Budget, out: Path) -> Path:
    return runs.checkpoint_dir(out / "sft", budget.sft_steps)


def teacher_dir(budget: Budget, out: Path) -> Path:
    return runs.checkpoint_dir(out / "teacher", budget.teacher_steps)


def phrasing_student_dir(budget: Budget, out: Path) -> Path:
    return runs.checkpoint_dir(out / "phrasings-sft", budget.phrasing_steps)


# ---------------------------------------------------------------- evaluation


def play(budget: Budget, policy: Path, *, split: str, games: int, bank: Path | None = None) -> list[int]:
    """Greedy play on seeds 0 .. games-1 of ``split`` (RL families); 1/0 per game, in seed order.
    With ``bank``, the policy sees its family's skill (keyword retrieval, k 1) in every prompt."""
    from agentkit.rollout.config import EvalConfig
    from agentkit.rollout.run import resolve_env, run_eval
    from agentkit.skillbank import policy_selector

    won: dict[int, int] = {}
    cfg = EvalConfig.model_validate({
        "episodes": games, "split": split, "env": {"id": ENV_ID, "kwargs": env_kwargs(RL_FAMILIES, first_decision=True),
                                                   "max_turns": FIRST_DECISION["moves"]},
        "sampling": {"max_new_tokens": budget.max_new_tokens}, "context": {"mode": "window", "window": 0},
        "skills": {"bank": str(bank) if bank else None, "retrieval": "keyword", "k": 1}})
    cfg = cfg.model_copy(update={"env": resolve_env(cfg.env)})
    sink = Path(os.environ.get("TMPDIR", "/tmp")) / f"vb-{os.getpid()}-{time.monotonic_ns()}.jsonl"
    try:
        run_eval(cfg, policy, out=sink, skills=policy_selector(cfg.skills, env_id=ENV_ID, seed=0))
        for row in NANO.read_jsonl(sink):
            won[int(row["seed"])] = int(bool(row["won"]))
    finally:
        sink.unlink(missing_ok=True)
    return [won[s] for s in range(games)]


def premise(budget: Budget, out: Path, times: dict[str, float]) -> None:
    """Does the student read skills, zero-shot, on the RL families? And how good is OPD's teacher?"""
    if (out / "premise.json").exists():
        return
    import torch
    from agentkit.objectives.batch import build_batch
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.skillbank import SkillBank
    from agentkit.teachers.model import ModelTeacher
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    student, teacher = student_dir(budget, out), teacher_dir(budget, out)
    tokenizer = load_tokenizer(student)
    bank = SkillBank.load(out / "bank.yaml")
    ids = [s.id for s in bank]
    rng = random.Random(1)
    games = expert_games(tokenizer, families=RL_FAMILIES, split="dev", seeds=range(budget.premise_games), budget=budget,
                         first_decision=True)
    result: dict[str, Any] = {"games": len(games)}
    for name, path in (("student", student), ("teacher", teacher)):
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        for kind in ("none", "right", "wrong"):
            def skills(g, kind=kind):
                right = f"vaults.{g.task_type}"
                return {"none": [], "right": [right], "wrong": [rng.choice([i for i in ids if i != right])]}[kind]
            trajs = [dataclasses.replace(g, skills=skills(g)) for g in games]
            batch = build_batch(trajs)
            with torch.no_grad():
                scores = ModelTeacher(model, tokenizer, name=kind, privileged=("skills",), bank=bank).score(batch, trajs)
            mask = batch.response_mask.bool()
            top1 = scores.logprobs >= scores.top1 - 1e-6  # [N, T]
            keys = batch.episode_index[:, None] * 1000 + batch.turn_index  # [N, T]
            greedy = [bool(top1[mask & (keys == k)].all()) for k in keys[mask].unique()]
            first = [bool(top1[mask & (keys == k)].all()) for k in keys[mask & (batch.turn_index == 0)].unique()]
            result[f"{name}/{kind}"] = {"expert_action_top1": sum(greedy) / max(len(greedy), 1),
                                        "first_action_top1": sum(first) / max(len(first), 1),
                                        "expert_logprob": float(scores.logprobs[mask].mean())}
    result["play"] = {"student": statistics.fmean(play(budget, student, split="dev", games=budget.premise_games)),
                      "student+skill": statistics.fmean(play(budget, student, split="dev", games=budget.premise_games,
                                                             bank=out / "bank.yaml")),
                      "teacher": statistics.fmean(play(budget, teacher, split="dev", games=budget.premise_games))}
    (out / "premise.json").write_text(json.dumps(result, indent=1))
    times["premise"] = time.perf_counter() - started


# ---------------------------------------------------------------- RL runs (one process each)


def run_dir(out: Path, stage: str, name: str) -> Path:
    return out / stage / name


def train_and_test(out: Path, stage: str, name: str, budget: Budget) -> None:
    """One RL run (``stage`` pilot|sweep|main, ``name`` ARM[@SETTING]:seed-S) and its evaluation."""
    folder = run_dir(out, stage, name)
    if (folder / "result.json").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    spec = json.loads((folder / "spec.json").read_text())
    started = time.perf_counter()
    student = phrasing_student_dir(budget, out) if stage == "phrasings" else student_dir(budget, out)
    cfg = load(rl_overrides(budget, spec["arm"], spec["settings"], lr=spec["lr"], steps=spec["steps"], seed=spec["seed"],
                            model=student, teacher=teacher_dir(budget, out), bank=out / "bank.yaml",
                            out=folder / "train"))
    NANO.run_training(cfg)
    train_s = time.perf_counter() - started
    metrics = NANO.read_jsonl(runs.metrics_file(folder / "train"))
    result = {**spec, "train_s": train_s,
              "curve": [{"step": r["step"], "success_rate": r["success_rate"]}
                        for r in NANO.read_jsonl(runs.eval_file(folder / "train"))],
              "diagnostics": diagnostics(metrics),
              "over_time": [{"step": m["step"], **{k: m[k] for k in OVER_TIME if k in m}} for m in metrics
                            if any(k in m for k in OVER_TIME)]}
    if stage in ("main", "phrasings"):  # test games only here, after frozen.json
        final = runs.checkpoint_dir(folder / "train", spec["steps"])
        result["test"] = play(budget, final, split="test", games=budget.test_games)
        if spec["arm"] == "skill_grpo":
            result["test_with_skills"] = play(budget, final, split="test", games=budget.test_games, bank=out / "bank.yaml")
    result["wall_s"] = time.perf_counter() - started
    (folder / "result.json").write_text(json.dumps(result, indent=1))


def diagnostics(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Each of ``DIAGNOSTICS`` averaged over the steps that logged it; the Skip share of valid
    alternatives over the steps that had some (a step without any logged 0 before it was left out)."""
    out = {}
    for key in DIAGNOSTICS:
        seen = [m[key] for m in metrics if key in m
                and (key != "judge_alternative_skip_share" or m.get("judge_alternative_share", 0) > 0)]
        if seen:
            out[key] = statistics.fmean(seen)
    return out


def run_all(args: argparse.Namespace, out: Path, stage: str, specs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``specs`` (name -> spec) ``--jobs`` at a time, each in a one-thread process; return results."""
    for name, spec in specs.items():
        folder = run_dir(out, stage, name)
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "spec.json").exists():
            (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    pending = [n for n in specs if not (run_dir(out, stage, n) / "result.json").exists()]
    if args.jobs == 0:  # one after another in this process: no interpreter start-up per run (the quick test)
        for name in pending:
            train_and_test(out, stage, name, QUICK if args.quick else Budget())
            print(f"{stage} {name}: done", flush=True)
    else:
        NANO.run_processes({f"{stage} {n}": ([sys.executable, __file__, "--out", str(out), "--run-one", stage, n,
                                              *(["--quick"] if args.quick else [])], run_dir(out, stage, n) / "log.txt")
                            for n in pending}, args.jobs)
    return [json.loads((run_dir(out, stage, n) / "result.json").read_text()) for n in specs
            if (run_dir(out, stage, n) / "result.json").exists()]


def final_dev(result: dict[str, Any]) -> float:
    return result["curve"][-1]["success_rate"] if result["curve"] else 0.0


def pilot(args, budget: Budget, out: Path, times: dict[str, float]) -> dict[str, Any]:
    """GRPO at ``PILOT_LRS``: the best final dev success picks the lr; its curve picks the budget."""
    if (out / "pilot.json").exists():
        return json.loads((out / "pilot.json").read_text())
    started = time.perf_counter()
    specs = {f"grpo@lr={lr:g}": {"arm": "grpo", "settings": {}, "lr": lr, "steps": budget.pilot_steps,
                                 "seed": SWEEP_SEED} for lr in PILOT_LRS}
    results = run_all(args, out, "pilot", specs)
    best = max(results, key=final_dev)
    curve = [(p["step"], p["success_rate"]) for p in best["curve"]]
    start = json.loads((out / "premise.json").read_text())["play"]["student"]  # the SFT policy, same dev games
    gain = final_dev(best) - start
    noise = 2 * (max(start, 0.05) * (1 - start) / budget.curve_games) ** 0.5  # 2 standard errors of a dev rate
    steps = budget.pilot_steps  # GRPO still has room: every run gets the whole pilot length
    if gain > noise:  # GRPO gained for real: stop where it has 90% of that gain (its plateau)
        steps = next(step for step, s in curve if s - start >= 0.9 * gain)
    chosen = {"lr": best["lr"], "steps": max(budget.min_steps, steps)}
    record = {"runs": results, "chosen": chosen, "start": start, "gain": gain, "noise": noise,
              "rule": "lr: the best final dev success; steps: the pilot's length, unless that run gained more than "
                      "2 standard errors of a dev rate over the SFT start, then the first checkpoint with 90% of "
                      f"its gain (at least {budget.min_steps})"}
    (out / "pilot.json").write_text(json.dumps(record, indent=1))
    times["pilot"] = time.perf_counter() - started
    return record


def sweep(args, budget: Budget, out: Path, times: dict[str, float]) -> dict[str, Any]:
    """A few settings per method on dev (one seed each); the best is frozen in ``frozen.json``."""
    if (out / "frozen.json").exists():
        return json.loads((out / "frozen.json").read_text())
    started = time.perf_counter()
    chosen = budget_of(budget, out)
    specs = {}
    for method, settings in SWEEP.items():
        for s in settings:
            label = ",".join(f"{k}={v:.3g}" for k, v in s.items())
            specs[f"{method}@{label}"] = {"arm": SWEEP_ARM[method], "settings": s, "lr": chosen["lr"],
                                          "steps": chosen["steps"], "seed": SWEEP_SEED, "method": method}
    results = run_all(args, out, "sweep", specs)
    frozen = {"lr": chosen["lr"], "steps": chosen["steps"], "methods": {"grpo": {}}}
    for method in SWEEP:
        runs = [r for r in results if r.get("method") == method]
        if runs:
            frozen["methods"][method] = max(runs, key=final_dev)["settings"]
    frozen["frozen_at"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    (out / "sweep.json").write_text(json.dumps(results, indent=1))
    (out / "frozen.json").write_text(json.dumps(frozen, indent=1))  # before any test game is played
    times["sweep"] = time.perf_counter() - started
    return frozen


def frozen_specs(frozen: dict[str, Any], seeds, arms) -> dict[str, dict[str, Any]]:
    """Every arm x seed with the frozen lr, budget and each arm's method settings, seed-major (a grid
    cut short has every arm)."""
    return {f"{arm}:seed-{seed}": {"arm": arm, "settings": frozen["methods"].get(METHOD_OF[arm], {}),
                                   "lr": frozen["lr"], "steps": frozen["steps"], "seed": seed}
            for seed in seeds for arm in arms}


def main_grid(args, budget: Budget, out: Path, frozen: dict[str, Any], times: dict[str, float]) -> list[dict[str, Any]]:
    started = time.perf_counter()
    if not (out / "start_test.json").exists():  # the SFT policy every run starts from, on the same test games
        (out / "start_test.json").write_text(json.dumps(play(budget, student_dir(budget, out), split="test",
                                                             games=budget.test_games)))
    results = run_all(args, out, "main", frozen_specs(frozen, args.seeds, args.only))
    times["main"] = times.get("main", 0.0) + time.perf_counter() - started
    return results


def phrasings(args, budget: Budget, out: Path, frozen: dict[str, Any], times: dict[str, float]) -> list[dict[str, Any]]:
    """OPD and SAGE-OPD from a student that says an exit several ways (stage 6)."""
    from agentkit.rollout.hf_backend import load_tokenizer

    started = time.perf_counter()
    demos = out / "phrasings-demos.jsonl"
    if not demos.exists():  # the stage-1 games (same seeds, same hinted share), each exit reworded
        tokenizer, bank, rng = load_tokenizer(out / "model-init"), practice_bank(), random.Random(6)
        games = expert_games(tokenizer, families="practice", split="train", seeds=range(budget.phrasing_demos),
                             budget=budget)
        rows = []
        for game in games:
            game = reword(game, rng, tokenizer)
            rows.append(with_skill(game, [f"vaults.{game.task_type}"], bank, tokenizer)
                        if rng.random() < budget.hinted_share else game)
        write_jsonl(demos, rows)
    student = sft(budget, model=student_dir(budget, out), demos=demos, out=out / "phrasings-sft",
                  steps=budget.phrasing_steps, lr=budget.sft_lr, families="practice")
    if not (out / "phrasings_start.json").exists():
        (out / "phrasings_start.json").write_text(json.dumps(play(budget, student, split="test",
                                                                  games=budget.test_games)))
    results = run_all(args, out, "phrasings", frozen_specs(frozen, args.seeds, PHRASED_ARMS))
    times["phrasings"] = times.get("phrasings", 0.0) + time.perf_counter() - started
    return results


def wording(train_dir: Path, step: int) -> dict[str, float] | None:
    """How the policy said the expert's action in its training episodes of ``step``: the share of
    turns that took it (as the environment read it), and of those, the share said in other words
    than the teacher's (the valid alternatives)."""
    turns = [t for e in NANO.read_jsonl(runs.trajectory_file(train_dir, step)) for t in e["turns"]]
    if not turns:
        return None
    right = [t for t in turns if t["action_valid"] and t.get("expert_action")
             and t.get("action_read", t["action"]) == t["expert_action"]]
    return {"expert_action": len(right) / len(turns),
            "in_other_words": sum(t["action"] != t["expert_action"] for t in right) / max(1, len(right))}


def phrasing_record(folder: Path) -> dict[str, Any]:
    """A stage-6 run's result with its wording at the first and last step and its judge's shares per
    step, read from the run's own files."""
    result = json.loads((folder / "result.json").read_text())
    metrics = NANO.read_jsonl(runs.metrics_file(folder / "train"))
    return {**result, "diagnostics": diagnostics(metrics),
            "wording": {"first": wording(folder / "train", 1), "last": wording(folder / "train", result["steps"])},
            "by_step": [{k: m[k] for k in ("step", "judge_alternative_share", "judge_check_share") if k in m}
                        for m in metrics]}


def behaviour(train_dir: Path, step: int) -> dict[str, float] | None:
    """What the policy did in its training episodes of ``step`` (sampled at temperature 1): shares of
    episodes whose first action was right, that entered a dead end, that went back out of one, won."""
    from agentkit.envs.vaults_env import parse_move

    episodes = NANO.read_jsonl(runs.trajectory_file(train_dir, step))
    if not episodes:
        return None

    def share(test) -> float:
        return statistics.fmean(bool(test(e)) for e in episodes)

    return {"first_right": share(lambda e: e["turns"] and parse_move(e["turns"][0]["action"] or "") == parse_move(
                e["turns"][0].get("expert_action") or "")),
            "dead_end": share(lambda e: any("into a dead end" in (t.get("feedback") or "") for t in e["turns"])),
            "went_back": share(lambda e: any(parse_move(t["action"] or "") == "back" for t in e["turns"])),
            "won": share(lambda e: e["won"])}


def collect(args, budget: Budget, out: Path, times: dict[str, float]) -> dict[str, Any]:
    def read(name):
        path = out / name
        return json.loads(path.read_text()) if path.exists() else None

    return {"command": " ".join(["examples/vaults_bench/run.py", *sys.argv[1:]]), "quick": args.quick,
            "budget": dataclasses.asdict(budget), "seeds": args.seeds, "arms": args.only, "premise": read("premise.json"),
            "setting": {"families": RL_FAMILIES, "episode": FIRST_DECISION},
            "pilot": read("pilot.json"), "sweep": read("sweep.json"), "frozen": read("frozen.json"),
            "main": [{**r, "behaviour": {"first": behaviour(p.parent / "train", 1),
                                         "last": behaviour(p.parent / "train", r["steps"])}}
                     for p in sorted((out / "main").glob("*/result.json")) for r in [json.loads(p.read_text())]],
            "start_test": read("start_test.json"),
            "phrasings": [phrasing_record(p.parent) for p in sorted((out / "phrasings").glob("*/result.json"))],
            "phrasings_start": read("phrasings_start.json"),
            "times": times}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    NANO.quiet_libraries()
    budget = QUICK if args.quick else Budget()
    out = Path(args.out)
    if args.run_one:
        import torch

        torch.set_num_threads(1)
        train_and_test(out, *args.run_one, budget)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    times_file = out / "times.json"
    times = json.loads(times_file.read_text()) if times_file.exists() else {}
    started = time.perf_counter()
    if not args.report_only:
        for stage in (prepare, premise):
            stage(budget, out, times)
            times_file.write_text(json.dumps(times, indent=1))
        print(f"prepared ({time.perf_counter() - started:.0f} s)", flush=True)
        pilot(args, budget, out, times)
        times_file.write_text(json.dumps(times, indent=1))
        frozen = sweep(args, budget, out, times)
        times_file.write_text(json.dumps(times, indent=1))
        main_grid(args, budget, out, frozen, times)
        times_file.write_text(json.dumps(times, indent=1))
        phrasings(args, budget, out, frozen, times)
        times_file.write_text(json.dumps(times, indent=1))
    results = collect(args, budget, out, times)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    sys.path.insert(0, str(HERE))
    from report import write_report  # examples/vaults_bench/report.py

    report = Path(args.report) if args.report else out / "vaults_bench.md"
    write_report(results, report)
    report.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(f"wrote {report}", flush=True)
    return 0


NANO = _nano()

if __name__ == "__main__":
    sys.exit(main())
