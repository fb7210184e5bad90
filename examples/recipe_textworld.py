"""The tiny model learns TextWorld Coin Collector: random init -> SFT on expert games -> GRPO.

    python examples/recipe_textworld.py --out runs/recipe-textworld               # one seed, ~15 min on 2 cores
    python examples/recipe_textworld.py --out runs/recipe-textworld --seeds 0 1 2
    python examples/recipe_textworld.py --out /tmp/recipe-quick --quick            # tiny budgets, < 2 min

For each seed, in ``OUT/seed-S/``:

1. ``model-init/``  ``agentkit model init --size tiny --seed S``
2. ``demos.jsonl``  expert demonstrations on training games ``--demo-first-seed`` onwards, far from
                    the games GRPO trains on (0 .. steps * tasks_per_step - 1)
3. ``sft/``         ``agentkit train --config examples/configs/sft_textworld.yaml``
4. ``grpo/``        ``agentkit train --config examples/configs/grpo_textworld.yaml`` from SFT's last checkpoint
5. greedy success on the eval split (held-out games, seeds 0 .. eval_episodes - 1) of all three:
   the random init is evaluated here, SFT and GRPO by their run's final evaluation (the same function,
   ``agentkit.train.evaluate``, with the same environment, context and generation settings, which the
   recipe checks).

Then ``OUT/results.json`` and ``OUT/results.md`` (a table, mean and spread over seeds), and
``OUT/model/``: the last seed's GRPO policy as a plain Hugging Face folder (no optimizer state).

Each seed's training seed and initialization seed are S; the demonstrations are the same games for
every seed. A stage whose output exists is skipped and an interrupted training run is resumed, so
running the same command again continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentkit.core import runs

CONFIGS = Path(__file__).resolve().parent / "configs"
STAGES = ("init", "sft", "grpo")
# what must agree between the SFT and GRPO configs for their evaluations to be comparable
SHARED_FIELDS = ("env.id", "env.kwargs", "env.max_turns", "eval.split", "eval.episodes", "context.mode", "context.window",
                 "context.show_admissible", "context.system_prompt", "sampling.max_new_tokens")
# --quick: every stage runs, on budgets small enough for a test
QUICK_OVERRIDES = {
    "sft": ["train.steps=3", "train.demos_per_step=2", "eval.every=0", "env.max_turns=3"],
    "grpo": ["train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.every=0", "env.max_turns=3",
             "sampling.max_new_tokens=8"],
}
QUICK_SHARED = {"sampling.max_new_tokens": 8, "eval.episodes": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/recipe-textworld", help="Folder for everything the recipe writes.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="Training and initialization seeds.")
    parser.add_argument("--sft-config", default=str(CONFIGS / "sft_textworld.yaml"), help="SFT stage config.")
    parser.add_argument("--grpo-config", default=str(CONFIGS / "grpo_textworld.yaml"), help="GRPO stage config.")
    parser.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE", help="Override in the SFT config.")
    parser.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE", help="Override in the GRPO config.")
    parser.add_argument("--size", default="tiny", help="Model size preset (agentkit model init --size).")
    parser.add_argument("--demos", type=int, default=16, help="Expert demonstrations (training games).")
    parser.add_argument("--demo-first-seed", type=int, default=10_000, help="Training-game seed of the first demonstration.")
    parser.add_argument("--quick", action="store_true", help="Tiny budgets: checks that every stage runs, learns nothing.")
    parser.add_argument("--quiet", action="store_true", help="No progress bars.")
    parser.add_argument("--install-default", action="store_true",
                        help="Copy the final policy to agentkit/data/default-model (the model `agentkit rollout` uses).")
    return parser.parse_args(argv)


def load_stage_configs(args: argparse.Namespace, seed: int, seed_dir: Path, demos: Path):
    """The SFT and GRPO configs of one seed: YAML, then the recipe's overrides, then the command line's."""
    from agentkit.core.errors import ConfigError
    from agentkit.train import resolve_defaults
    from agentkit.train.config import load_config

    quick = {name: QUICK_OVERRIDES[name] + [f"{k}={v}" for k, v in QUICK_SHARED.items()] if args.quick else []
             for name in ("sft", "grpo")}
    sft = load_config(args.sft_config, quick["sft"] + args.sft_set, values={
        "seed": seed, "out": str(seed_dir / "sft"), "model": str(seed_dir / "model-init"), "train.demos": str(demos)})
    sft_final = runs.checkpoint_dir(seed_dir / "sft", sft.train.steps)
    grpo = load_config(args.grpo_config, quick["grpo"] + args.grpo_set, values={
        "seed": seed, "out": str(seed_dir / "grpo"), "model": str(sft_final)})
    sft, grpo = resolve_defaults(sft), resolve_defaults(grpo)  # the environment's defaults filled in, as the runs record them
    if sft.objective.name != "sft" or grpo.objective.name != "grpo":
        raise ConfigError(f"{args.sft_config} must train with objective sft and {args.grpo_config} with grpo; "
                          f"got {sft.objective.name!r} and {grpo.objective.name!r}.")
    for dotted in SHARED_FIELDS:
        a, b = _get(sft, dotted), _get(grpo, dotted)
        if a != b:
            raise ConfigError(f"{dotted} differs between the SFT config ({a!r}) and the GRPO config ({b!r}); the three "
                              "evaluations are comparable only when it is the same. Set it alike in both.")
    grpo_tasks = grpo.train.steps * grpo.rollout.tasks_per_step
    if grpo_tasks > args.demo_first_seed:
        raise ConfigError(f"GRPO trains on games 0..{grpo_tasks - 1}, which reach the demonstrations' games "
                          f"(from {args.demo_first_seed}); raise --demo-first-seed above {grpo_tasks}.")
    return sft, grpo


def _get(config, dotted: str) -> Any:
    for key in dotted.split("."):
        config = getattr(config, key)
    return config


def stats_record(stats) -> dict[str, float]:
    return {"success_rate": stats.success_rate, "return_mean": stats.mean_return, "turns_mean": stats.mean_turns,
            "invalid_rate": stats.invalid_rate, "episodes": stats.episodes}


def evaluate_model(model_dir: Path, cfg) -> dict[str, float]:
    """Greedy success of a model folder on the eval split, exactly as the training loop evaluates."""
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.rollout.run import make_envs

    from agentkit.train import evaluate

    envs = make_envs(cfg.env, cfg.eval.split)
    try:
        stats, _ = evaluate(HFBackend(model_dir, seed=cfg.seed), cfg, envs, cfg.eval.episodes)
        return stats_record(stats)
    finally:
        envs.close()


def final_evaluation(run_dir: Path, steps: int) -> dict[str, float]:
    """The run's evaluation after its last step (the loop always evaluates there)."""
    records = [json.loads(line) for line in runs.eval_file(run_dir).read_text().splitlines() if line.strip()]
    last = [r for r in records if r["step"] == steps]
    if not last:
        from agentkit.core.errors import AgentkitError

        raise AgentkitError(f"{run_dir}/eval.jsonl has no evaluation at step {steps}: the run did not finish. "
                            "Run the recipe again to resume it.")
    keys = ("success_rate", "return_mean", "turns_mean", "invalid_rate", "episodes")
    return {k: last[-1][k] for k in keys}


def run_training(cfg, *, quiet: bool) -> Path:
    """Train, or resume a run that stopped; a finished run is left as it is."""
    from agentkit.train import train
    from agentkit.train.checkpoint import checkpoints

    run_dir = Path(cfg.out)
    done = checkpoints(run_dir)
    if done and done[-1] >= cfg.train.steps:
        return run_dir
    return train(cfg, resume=bool(done), show_progress=not quiet).run_dir


def run_seed(args: argparse.Namespace, seed: int, out: Path) -> dict[str, Any]:
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.run import env_factory

    from agentkit.models import init_model

    seed_dir = out / f"seed-{seed}"
    seed_dir.mkdir(parents=True, exist_ok=True)
    demos = seed_dir / "demos.jsonl"
    sft_cfg, grpo_cfg = load_stage_configs(args, seed, seed_dir, demos)
    wall: dict[str, float] = {}

    started = time.perf_counter()
    model_init = seed_dir / "model-init"
    if not (model_init / "config.json").exists():
        shutil.rmtree(model_init, ignore_errors=True)
        init_model(model_init, size=args.size, seed=seed)
    wall["model"] = time.perf_counter() - started

    started = time.perf_counter()
    if not demos.exists():
        make_env = env_factory(sft_cfg.env.id, split="train", max_turns=50, env_kwargs=sft_cfg.env.kwargs)
        partial = demos.with_suffix(".partial")
        written, lost = write_demonstrations(
            make_env, load_tokenizer(model_init), partial, env_id=sft_cfg.env.id,
            seeds=range(args.demo_first_seed, args.demo_first_seed + args.demos), split="train", mode="overwrite",
            context=sft_cfg.context.mode, window=sft_cfg.context.window,
            show_admissible=sft_cfg.context.show_admissible, system_prompt=sft_cfg.context.system_prompt,
            model="expert")
        if lost:
            print(f"seed {seed}: the expert lost {lost} of {args.demos} games; training on the {written} it won.")
        partial.rename(demos)
    wall["demos"] = time.perf_counter() - started

    started = time.perf_counter()
    init_file = seed_dir / "init_eval.json"
    if not init_file.exists():
        init_file.write_text(json.dumps(evaluate_model(model_init, grpo_cfg), indent=1))
    init_result = json.loads(init_file.read_text())
    wall["init_eval"] = time.perf_counter() - started

    started = time.perf_counter()
    run_training(sft_cfg, quiet=args.quiet)
    wall["sft"] = time.perf_counter() - started

    started = time.perf_counter()
    run_training(grpo_cfg, quiet=args.quiet)
    wall["grpo"] = time.perf_counter() - started

    return {
        "seed": seed,
        "init": init_result,
        "sft": final_evaluation(Path(sft_cfg.out), sft_cfg.train.steps),
        "grpo": final_evaluation(Path(grpo_cfg.out), grpo_cfg.train.steps),
        "final_model": str(runs.checkpoint_dir(Path(grpo_cfg.out), grpo_cfg.train.steps)),
        "wall_s": wall,
        "configs": {"sft": sft_cfg.model_dump(mode="json"), "grpo": grpo_cfg.model_dump(mode="json")},
    }


def export_model(checkpoint: Path, dest: Path, provenance: dict[str, Any]) -> None:
    """Copy the policy and tokenizer of a checkpoint (not its optimizer state) to ``dest``."""
    from agentkit.models import MODEL_INFO_FILE

    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.name not in ("optimizer.safetensors", "optimizer.json", "rng.safetensors", "state.json", "COMPLETE"):
            shutil.copy2(path, tmp / path.name)
    info_file = checkpoint.parent.parent.parent / "model-init" / MODEL_INFO_FILE
    info = json.loads(info_file.read_text()) if info_file.exists() else {}
    (tmp / MODEL_INFO_FILE).write_text(json.dumps({**info, **provenance}, indent=1))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    summary = {}
    for stage in STAGES:
        values = [r[stage]["success_rate"] for r in runs]
        summary[stage] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                          "min": min(values), "max": max(values)}
    return summary


def markdown_table(results: dict[str, Any]) -> str:
    env = results["env"]
    lines = [
        f"Greedy success on {env['id']} {env['kwargs']}, split {env['eval_split']!r}, "
        f"{env['eval_episodes']} held-out games (seeds 0..{env['eval_episodes'] - 1}), max {env['max_turns']} turns.",
        "",
        "| seed | random init | SFT | GRPO | wall time |",
        "|---:|---:|---:|---:|---:|",
    ]
    for run in results["runs"]:
        cells = [f"{run[s]['success_rate']:.1%}" for s in STAGES]
        lines.append(f"| {run['seed']} | {' | '.join(cells)} | {sum(run['wall_s'].values()) / 60:.1f} min |")
    summary = results["summary"]
    cells = [f"{summary[s]['mean']:.1%} ± {summary[s]['std']:.1%}" for s in STAGES]
    lines.append(f"| mean ± sd | {' | '.join(cells)} | {results['wall_s'] / 60:.1f} min total |")
    return "\n".join(lines) + "\n"


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("agentkit", "torch", "transformers", "textworld"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = parse_args(argv)
    if args.quick:
        args.demos = min(args.demos, 2)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = []
    for seed in args.seeds:
        run = run_seed(args, seed, out)
        runs.append(run)
        print(f"seed {seed}: " + ", ".join(f"{s} {run[s]['success_rate']:.1%}" for s in STAGES), flush=True)
    sft_cfg = runs[-1]["configs"]["sft"]
    results = {
        "recipe": "examples/recipe_textworld.py",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "quick": args.quick,
        "env": {"id": sft_cfg["env"]["id"], "kwargs": sft_cfg["env"]["kwargs"], "eval_split": sft_cfg["eval"]["split"],
                "eval_episodes": sft_cfg["eval"]["episodes"], "max_turns": sft_cfg["env"]["max_turns"]},
        "model_size": args.size,
        "demos": {"episodes": args.demos, "first_seed": args.demo_first_seed, "split": "train"},
        "runs": runs,
        "summary": summarize(runs),
        "wall_s": time.perf_counter() - started,
        "versions": versions(),
    }
    last = runs[-1]
    export_model(Path(last["final_model"]), out / "model", {
        "builder": "examples/recipe_textworld.py", "stage": "grpo", "seed": last["seed"],
        "env": results["env"], "eval_success_rate": last["grpo"]["success_rate"]})
    (out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown_table(results)
    (out / "results.md").write_text(table)
    print(table + f"\nwrote {out / 'results.json'}, {out / 'results.md'} and the final policy {out / 'model'}")
    if args.install_default:
        if args.quick:
            print("--quick: not installing a model trained on test budgets as the default.")
        else:
            from agentkit.models import DEFAULT_MODEL

            shutil.rmtree(DEFAULT_MODEL, ignore_errors=True)
            shutil.copytree(out / "model", DEFAULT_MODEL)
            (DEFAULT_MODEL / "results.md").write_text(table)
            print(f"installed it as the default model: {DEFAULT_MODEL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
