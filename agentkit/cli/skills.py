"""``agentkit skills list | retrieve | extract``: skill banks."""

from __future__ import annotations

import argparse
import sys

from agentkit.cli.common import quiet_hf
from agentkit.core.errors import ConfigError


def add_parsers(sub) -> None:
    """This module's commands on the ``agentkit`` parser's subcommands."""
    from agentkit.core.settings import SkillSettings

    skills = sub.add_parser("skills", help="Skill banks: list, retrieve, extract.").add_subparsers(
        dest="skills_command", metavar="SUBCOMMAND")
    p = skills.add_parser("list", help="Every skill of a bank with its usage statistics.")
    p.add_argument("bank", help="Bank file (JSON/YAML) or starter name (textworld, alfworld, scienceworld, search_qa).")
    p.set_defaults(func=cmd_skills_list)
    p = skills.add_parser("retrieve", help="The skills a retriever picks for a task.")
    p.add_argument("bank", help="Bank file or starter name.")
    p.add_argument("--task", required=True, help="Task text.")
    p.add_argument("--strategy", default=SkillSettings.model_fields["retrieval"].default,
                   help="ucb | keyword | full | random (or a plugin); the default is that of --retrieval.")
    p.add_argument("-k", type=int, default=SkillSettings.model_fields["k"].default, help="Skills to return.")
    p.add_argument("--env", help="Only skills that apply to this environment id.")
    p.add_argument("--task-type", help="Only skills for this task type (e.g. pick_heat_then_place).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random retriever.")
    p.set_defaults(func=cmd_skills_retrieve)
    p = skills.add_parser("extract", help="Summarize new skills from won episodes with an LLM (deduplicated).")
    p.add_argument("--trajectories", required=True, help="Trajectory JSONL.")
    p.add_argument("--bank", required=True, help="Bank file to add to (created if missing).")
    p.add_argument("--teacher", required=True, help="The writer: model:DIR (a Hugging Face folder).")
    p.add_argument("--max-new-tokens", type=int, default=96, help="Answer length.")
    p.add_argument("--dedup", type=float, default=0.6, help="Word-overlap (Jaccard) at which a skill is a duplicate.")
    p.set_defaults(func=cmd_skills_extract)


def _load_bank(name: str):
    from agentkit.skillbank import SkillBank, resolve_bank

    return SkillBank.load(resolve_bank(name))


def cmd_skills_list(args: argparse.Namespace) -> int:
    bank = _load_bank(args.bank)
    print(f"{bank.path}: {len(bank)} skills, {bank.episodes} episodes recorded")
    for s in bank:
        where = ",".join(s.applies_to) or "all"
        print(f"{s.id:26} uses {s.stats.uses:5d}  mean reward {s.stats.mean_reward:6.3f}  [{where}]  {s.title}")
    return 0


def cmd_skills_retrieve(args: argparse.Namespace) -> int:
    import random

    from agentkit.skillbank import make_retriever

    if args.k <= 0:
        raise ConfigError(f"-k must be positive, got {args.k}.")
    bank = _load_bank(args.bank)
    chosen = make_retriever(args.strategy).retrieve(bank, args.task, args.k, env=args.env, task_type=args.task_type,
                                                    rng=random.Random(args.seed))
    for s in chosen:
        print(f"{s.id}\t{s.title}\t{s.text}")
    if not chosen:
        print("(no skill matched)", file=sys.stderr)
    return 0


def cmd_skills_extract(args: argparse.Namespace) -> int:
    from agentkit.core.jsonl import read_trajectories
    from agentkit.rollout.backend import chat_completer
    from agentkit.rollout.hf_backend import HFBackend
    from agentkit.skillbank import SkillBank, resolve_bank
    from agentkit.skillbank.extract import extract_skills
    from agentkit.teachers import split_spec

    name, arg = split_spec(args.teacher)
    if name != "model" or not arg:
        raise ConfigError(f"--teacher {args.teacher!r}: extraction needs a model to write skills: --teacher model:DIR.")
    quiet_hf()
    trajectories = read_trajectories(args.trajectories)
    path = resolve_bank(args.bank)
    bank = SkillBank.load(path) if path.exists() else SkillBank(path=path)
    report = extract_skills(trajectories, bank, chat_completer(HFBackend(arg), args.max_new_tokens),
                            dedup_threshold=args.dedup, source=str(args.trajectories))
    if report.added:
        bank.save(path)
    print(f"{report.episodes} won episodes -> {len(report.added)} new skills in {path} "
          f"({report.duplicates} duplicates, {report.empty} empty, {report.unformatted} without TITLE/SKILL lines)")
    for skill_id in report.added:
        print(f"  {skill_id}: {bank.get(skill_id).title}")
    return 0
