"""Positive controls: does training learn? Each method, from the vaults bench's prepared student, on
the one decision that carries the rule (the first exit of a vault), with a greedy dev curve.

    python examples/positive_controls/run.py --out runs/positive-controls          # every control
    python examples/positive_controls/run.py --out runs/positive-controls --only opd-full grpo
    python examples/positive_controls/run.py --out /tmp/pc-quick --quick           # tiny budgets (CI)

The problem: ``vaults/vaults-v0`` with one chamber and one move (``FIRST_DECISION``): the episode is
the vault's first decision, won when the agent takes the exit its family's rule marks. The family
name is in the observation, the rule only in a skill. The student (the bench's stage 1: SFT on 240
*practice* families, most demonstrations with the right skill in front) reads a rule when it is
given one and has no rule of the 12 named families: greedy it takes about one family's exit for all.

Controls (``CONTROLS``; each a ``agentkit train`` run, one thread, cached in ``OUT/NAME/``):

- ``opd-*``: OPD from the bench's separate teacher (the student SFT'd on the named families' expert
  games: it knows every rule), one per estimator: ``full`` (the exact reverse KL over the vocabulary),
  ``topk16`` / ``topk64`` (over the teacher's top k, renormalized), ``sampled`` (the sampled-token
  estimator of the OPD paper). Converged = at least 90% of the teacher's dev success.
- ``grpo``: GRPO from the reward alone, many distinct tasks per step and a group of 8, on
  ``GRPO_FAMILIES`` (fewer families: see the report for why); ``grpo-6`` the same on six families.
- ``sft``: the upper bound, the teacher itself (SFT on the named families' expert games).
- ``opsd*`` / ``sdar*``: self-distillation, the self-teacher = the policy with its family's skill in
  front; at the reference's small lam (0.01) and at lam 1, with the live self-teacher and with one
  frozen at the start (``--teacher model:START --teacher-privileged skills``: the starting weights
  with the same privileged block; it separates a collapsing teacher from a collapsing student).
  ``opsd_rkl*``: the same self-teacher through OPD's reverse KL with its default (exact) estimator.
  ``self-teacher`` evaluates the student with its family's skill in the prompt: what they distill from.

Every control reports its dev curve (greedy, ``DEV_GAMES`` dev games every ``EVAL_EVERY`` steps),
start and end with Wilson 95% intervals and the paired change's interval (the loop's own verdict),
and its wall time. ``--report`` writes the markdown and a PNG of the curves.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from agentkit.core import runs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FIRST_DECISION = {"chambers": 1, "moves": 1, "dead_ends": True}
GRPO_FAMILIES = "[amber, basalt, cedar]"
DEV_GAMES, EVAL_EVERY = 128, 10


def _bench():
    """examples/vaults_bench/run.py: its prepared student and teacher (stage 1) are these controls' start."""
    spec = importlib.util.spec_from_file_location("vaults_bench_run", ROOT / "examples" / "vaults_bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class Control:
    overrides: list[str]
    steps: int
    lr: float
    tasks: int = 32
    group: int = 1
    families: str = "all"
    warmup: int = 10
    uses: str = "student"  # the policy: student | teacher (a row with steps 0 evaluates it, no training)
    with_skill: bool = False  # a row with steps 0: evaluated with its family's skill in the prompt


TEACHER = ["objective.name=opd", "teacher.spec=model:{teacher}"]
SELF = ["teacher.privileged=[skills]", "skills.retrieval=keyword", "skills.k=1", "skills.bank={bank}"]
CONTROLS: dict[str, Control] = {
    "opd-full": Control([*TEACHER, "objective.args.estimator=full"], steps=120, lr=1e-3),
    "opd-topk64": Control([*TEACHER, "objective.args.estimator=full", "objective.args.topk=64"], steps=120, lr=1e-3),
    "opd-topk16": Control([*TEACHER, "objective.args.estimator=full", "objective.args.topk=16"], steps=120, lr=1e-3),
    "opd-sampled": Control([*TEACHER, "objective.args.estimator=sampled"], steps=120, lr=1e-3),
    "grpo": Control(["objective.name=grpo", "objective.args.aggregation=sequence-mean"], steps=150, lr=1e-3,
                    group=8, families=GRPO_FAMILIES),
    "grpo-6": Control(["objective.name=grpo", "objective.args.aggregation=sequence-mean"], steps=150, lr=1e-3,
                      group=8, families="[amber, basalt, cedar, ember, frost, garnet]"),
    "sft": Control([], steps=0, lr=0.0, uses="teacher"),
    "opsd": Control(["objective.name=opsd", *SELF], steps=120, lr=1e-3),
    "opsd-frozen": Control(["objective.name=opsd", *SELF, "teacher.spec=model:{student}"], steps=120, lr=1e-3),
    "sdar": Control(["objective.name=sdar", *SELF], steps=120, lr=1e-3, group=4),
    "sdar-frozen": Control(["objective.name=sdar", *SELF, "teacher.spec=model:{student}"], steps=120, lr=1e-3,
                           group=4),
    "opsd-lam1": Control(["objective.name=opsd", *SELF, "objective.args.lam=1.0"], steps=120, lr=1e-3),
    "opsd-lam1-frozen": Control(["objective.name=opsd", *SELF, "objective.args.lam=1.0", "teacher.spec=model:{student}"],
                                steps=120, lr=1e-3),
    "opsd_rkl": Control(["objective.name=opsd_rkl", *SELF], steps=120, lr=1e-3),
    "opsd_rkl-frozen": Control(["objective.name=opsd_rkl", *SELF, "teacher.spec=model:{student}"], steps=120, lr=1e-3),
    "self-teacher": Control([], steps=0, lr=0.0, with_skill=True),
}
QUICK_STEPS = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/positive-controls", help="Folder for everything the controls write.")
    parser.add_argument("--bench", default=None,
                        help="A vaults bench folder whose stage 1 (student and teacher) to start from "
                             "(default OUT/prepared: built here, about 8 min).")
    parser.add_argument("--only", nargs="+", default=list(CONTROLS), choices=list(CONTROLS), metavar="CONTROL",
                        help=f"Controls to run: {', '.join(CONTROLS)}.")
    parser.add_argument("--jobs", type=int, default=2, help="Controls at a time (one thread each); 0: in this process.")
    parser.add_argument("--quick", action="store_true", help="Tiny budgets: checks that every control runs.")
    parser.add_argument("--report", default=None, help="Markdown report (default OUT/positive_controls.md).")
    parser.add_argument("--run-one", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def overrides(control: Control, *, prepared: Path, budget, quick: bool, out: Path) -> list[str]:
    steps = QUICK_STEPS if quick else control.steps
    bench = BENCH
    fill = {"{teacher}": str(bench.teacher_dir(budget, prepared)), "{bank}": str(prepared / "bank.yaml"),
            "{student}": str(bench.student_dir(budget, prepared))}
    extra = list(control.overrides)
    for key, value in fill.items():
        extra = [o.replace(key, value) for o in extra]
    kwargs = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in
                       {"families": control.families, **FIRST_DECISION}.items())
    return [f"env.id={bench.ENV_ID}", f"env.kwargs={{{kwargs}}}", "env.max_turns=1", "eval.split=dev",
            "context.mode=window", "context.window=0", f"sampling.max_new_tokens={budget.max_new_tokens}",
            "sampling.temperature=1.0", *extra, f"train.steps={steps}", f"train.lr={control.lr}",
            f"train.warmup_steps={min(control.warmup, steps)}", f"rollout.tasks_per_step={control.tasks}",
            f"rollout.group_size={control.group}", f"eval.every={min(EVAL_EVERY, steps)}",
            f"eval.episodes={4 if quick else DEV_GAMES}", f"checkpoint.every={steps}", "checkpoint.keep=1",
            "seed=0", f"model={bench.student_dir(budget, prepared)}", f"out={out}"]


def run_one(out: Path, name: str, prepared: Path, quick: bool) -> None:
    """One control: its training run (or, for ``sft``, the teacher's evaluation) and result.json."""
    from agentkit.rollout.run import run_eval  # noqa: F401  (imported here: one thread set first)

    from agentkit.train.config import load_config

    folder = out / name
    if (folder / "result.json").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    budget = BENCH.QUICK if quick else BENCH.Budget()
    control = CONTROLS[name]
    started = time.perf_counter()
    if not control.steps:
        policy = BENCH.teacher_dir(budget, prepared) if control.uses == "teacher" else BENCH.student_dir(budget, prepared)
        bank = prepared / "bank.yaml" if control.with_skill else None
        curve = [{"step": 0, **evaluate(policy, control, quick, bank=bank)}]
    else:
        BENCH.NANO.run_training(load_config(None, overrides(control, prepared=prepared, budget=budget, quick=quick,
                                                            out=folder / "train")))
        curve = [{"step": r["step"], "success_rate": r["success_rate"], "won_by_seed": r.get("won_by_seed")}
                 for r in BENCH.NANO.read_jsonl(runs.eval_file(folder / "train"))]
    metrics = BENCH.NANO.read_jsonl(runs.metrics_file(folder / "train"))
    keys = ("reverse_kl", "full_kl", "signal_share", "invalid_rate", "success_rate", "kl", "gate_mean")
    result = {"name": name, "control": dataclasses.asdict(control), "curve": curve, "wall_s": time.perf_counter() - started,
              "metrics": [{"step": m["step"], **{k: m[k] for k in keys if k in m}} for m in metrics]}
    (folder / "result.json").write_text(json.dumps(result, indent=1))


def evaluate(policy: Path, control: Control, quick: bool, bank: Path | None = None) -> dict[str, Any]:
    """Greedy dev success of ``policy`` on the controls' first decisions (the loop's eval settings);
    with ``bank``, each prompt holds the task's family skill (keyword retrieval, k 1: the self-teacher's view)."""
    from agentkit.rollout.config import EvalConfig
    from agentkit.rollout.run import resolve_env, run_eval
    from agentkit.skillbank import policy_selector

    budget = BENCH.QUICK if quick else BENCH.Budget()
    games = 4 if quick else DEV_GAMES
    cfg = EvalConfig.model_validate({
        "episodes": games, "split": "dev", "env": {"id": BENCH.ENV_ID, "kwargs": {"families": control.families,
                                                                                   **FIRST_DECISION}, "max_turns": 1},
        "sampling": {"max_new_tokens": budget.max_new_tokens}, "context": {"mode": "window", "window": 0},
        "skills": {"bank": str(bank) if bank else None, "retrieval": "keyword", "k": 1}})
    cfg = cfg.model_copy(update={"env": resolve_env(cfg.env)})
    sink = Path(os.environ.get("TMPDIR", "/tmp")) / f"pc-{os.getpid()}-{time.monotonic_ns()}.jsonl"
    try:
        run_eval(cfg, policy, out=sink, skills=policy_selector(cfg.skills, env_id=BENCH.ENV_ID, seed=0))
        won = {int(r["seed"]): int(bool(r["won"])) for r in BENCH.NANO.read_jsonl(sink)}
    finally:
        sink.unlink(missing_ok=True)
    return {"success_rate": sum(won.values()) / max(1, len(won)), "won_by_seed": [won[s] for s in sorted(won)]}


def run_all(args: argparse.Namespace, out: Path, prepared: Path) -> None:
    pending = [n for n in args.only if not (out / n / "result.json").exists()]
    if args.jobs == 0:
        for name in pending:
            run_one(out, name, prepared, args.quick)
            print(f"{name}: done", flush=True)
        return
    BENCH.NANO.run_processes({name: ([sys.executable, __file__, "--out", str(out), "--bench", str(prepared), "--run-one",
                                      name, *(["--quick"] if args.quick else [])], out / name / "log.txt")
                              for name in pending}, args.jobs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    BENCH.NANO.quiet_libraries()
    out = Path(args.out)
    prepared = Path(args.bench) if args.bench else out / "prepared"
    budget = BENCH.QUICK if args.quick else BENCH.Budget()
    if args.run_one:
        import torch

        torch.set_num_threads(1)
        run_one(out, args.run_one, prepared, args.quick)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if not BENCH.teacher_dir(budget, prepared).exists():
        started = time.perf_counter()
        prepared.mkdir(parents=True, exist_ok=True)
        BENCH.prepare(budget, prepared, {})
        print(f"prepared the student and the teacher ({time.perf_counter() - started:.0f} s)", flush=True)
    run_all(args, out, prepared)
    sys.path.insert(0, str(HERE))
    from report import write_report  # examples/positive_controls/report.py

    report = Path(args.report) if args.report else out / "positive_controls.md"
    results = [json.loads((out / n / "result.json").read_text()) for n in CONTROLS if (out / n / "result.json").exists()]
    write_report(results, report, command=" ".join(["examples/positive_controls/run.py", *sys.argv[1:]]))
    print(f"wrote {report}", flush=True)
    return 0


BENCH = _bench()

if __name__ == "__main__":
    sys.exit(main())
