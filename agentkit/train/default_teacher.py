"""What a training run uses when it names no teacher or demonstrations: a default teacher and
default demonstrations for its environment, built on first use and cached under ``$AGENTKIT_CACHE``.

An objective that declares ``needs_teacher`` with no ``default_teacher`` of its own (``opd``,
``sage_opd``) distills from a separate model. Given no ``--teacher``, the run takes the default
teacher of its environment: the shipped default policy trained further (SFT, ``RECIPE``) on that
environment's expert games. It is built once, in well under a minute on a laptop CPU, into
``$AGENTKIT_CACHE/teachers/<env>-<key>``; the key hashes everything that determines it (the default
model's files, the environment's id, settings and turn limit, the context the games are recorded
in, the recipe), so a changed model, setting or recipe never reuses a stale teacher. Objectives
that train on demonstrations (``sft``) given no ``--demos`` take the same expert games, recorded
with the student's tokenizer.

Measured on the default environment (textworld/coin-v0, level 3; greedy, the 64 held-out games of
its eval split): the default policy wins 85.9% of them, its default teacher 95.3% (with 16 expert
games instead of 24: 73.4%, with 12: 39.1%). Building it took 51-53 s from a fresh cache, about 35 s
of which generate its 24 TextWorld games, and 17 s with the games cached (2 cores, one busy).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from agentkit.core.errors import ConfigError, EnvError
from agentkit.core.paths import build_folder_once, cache_dir
from agentkit.core.settings import ContextSettings, EnvSettings


@dataclass(frozen=True)
class Recipe:
    """How the default teacher is made; any change here makes a new cache key (bump ``version``
    when the code that builds it changes)."""

    version: int = 1
    demo_games: int = 24  # expert games of the train split, seeds 0 .. demo_games - 1
    steps: int = 40
    lr: float = 1e-3
    warmup_steps: int = 10  # AdamW's first steps at full lr break the already-trained policy
    demos_per_step: int = 16
    seed: int = 0


RECIPE = Recipe()
TEACHERS = "teachers"  # under cache_dir()
DEMOS = "demos"
INFO_FILE = "agentkit_model.json"  # written last: the folder is complete when it is there
BUILDER = "agentkit.default_teacher"  # recorded in the teachers it built (cached): kept as first written
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _notice(text: str) -> None:
    print(text, file=sys.stderr)


def _digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def _files_digest(folder: Path, names: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in names:
        path = folder / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(absent)") + b"\0")
    return digest.hexdigest()


def _what_plays(env: EnvSettings, context: ContextSettings) -> dict:
    """The settings that change the recorded games: the environment, its turn limit, the context."""
    return {"env": env.id, "kwargs": env.kwargs, "max_turns": env.max_turns,
            "context": context.model_dump(mode="json")}


def _slug(env_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in env_id)


def default_demonstrations(env: EnvSettings, context: ContextSettings, model_dir: Path) -> Path:
    """The expert games of ``env``'s train split (seeds 0 .. ``RECIPE.demo_games`` - 1) recorded in
    ``context`` with ``model_dir``'s tokenizer, as a trajectory file (cached; written whole or not at
    all). ``env`` with its defaults filled in (``agentkit.rollout.run.resolve_env``)."""
    games = RECIPE.demo_games
    key = _digest({"what": "demos", "version": RECIPE.version, "games": games, **_what_plays(env, context),
                   "tokenizer": _files_digest(model_dir, TOKENIZER_FILES)})
    path = cache_dir() / DEMOS / f"{_slug(env.id)}-{key[:12]}.jsonl"
    if path.is_file():
        return path
    from agentkit.rollout.demos import write_demonstrations
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.rollout.run import env_factory

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        written, _ = write_demonstrations(
            env_factory(env.id, split="train", max_turns=env.max_turns, env_kwargs=env.kwargs), load_tokenizer(model_dir),
            tmp, env_id=env.id, seeds=range(games), split="train", mode="overwrite", context=context.mode,
            window=context.window, show_admissible=context.show_admissible, system_prompt=context.system_prompt,
            model="expert")
        if not written:
            raise ConfigError(f"{env.id}: its expert lost all {games} games it played within env.max_turns="
                              f"{env.max_turns}, so there are no default demonstrations; raise --max-turns, or pass "
                              "--demos FILE (agentkit demos).")
        os.replace(tmp, path)
    except EnvError as err:
        raise ConfigError(f"{env.id}: its expert's games, the default demonstrations (and the default teacher's "
                          f"data), cannot be recorded: {err} Pass --demos FILE, or --teacher model:DIR for an objective "
                          "that distills from a teacher.") from err
    finally:
        tmp.unlink(missing_ok=True)
    return path


def teacher_folder(env: EnvSettings, context: ContextSettings) -> Path:
    """Where the default teacher for ``env`` played in ``context`` is cached: the name hashes the
    default model's files, the environment's settings, the context and ``RECIPE``."""
    from agentkit.models import ensure_default_model

    model_dir = ensure_default_model()
    key = _digest({"what": "teacher", "recipe": asdict(RECIPE), **_what_plays(env, context),
                   "model": _files_digest(model_dir, ("config.json", "model.safetensors", *TOKENIZER_FILES))})
    return cache_dir() / TEACHERS / f"{_slug(env.id)}-{key[:12]}"


def default_teacher(env: EnvSettings, context: ContextSettings, *, student: Path | None = None,
                    notice: Callable[[str], None] = _notice) -> Path:
    """The default teacher's model folder for ``env`` (played in ``context``), built on first use;
    one line of ``notice`` says which one is used (and how long building it took). ``student``: the
    student's model folder, which must share the default model's tokenizer."""
    from agentkit.models import ensure_default_model

    model_dir = ensure_default_model()
    if student is not None and student.resolve() != model_dir.resolve():
        _check_tokenizer(student, model_dir)
    folder = teacher_folder(env, context)
    if (folder / INFO_FILE).is_file():
        notice(f"teacher: the default teacher for {env.id} ({folder})")
        return folder
    notice(f"teacher: building the default teacher for {env.id} on first use: the default policy trained on "
           f"{RECIPE.demo_games} of its expert games ({RECIPE.steps} SFT steps)")
    started = time.perf_counter()
    demos = default_demonstrations(env, context, model_dir)
    with build_folder_once(folder, INFO_FILE) as tmp:
        _fine_tune(model_dir, demos, tmp)
        info = json.loads((model_dir / INFO_FILE).read_text()) if (model_dir / INFO_FILE).is_file() else {}
        info.update({"builder": BUILDER, "stage": "default teacher", "base": str(model_dir),
                     "env": _what_plays(env, context), "recipe": asdict(RECIPE), "demonstrations": str(demos)})
        info.pop("eval_success_rate", None)  # the base policy's, not this one's
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=1))
    notice(f"teacher: the default teacher for {env.id} ({folder}), built in {time.perf_counter() - started:.0f} s")
    return folder


def _check_tokenizer(student: Path, model_dir: Path) -> None:
    from agentkit.rollout.hf_backend import load_tokenizer

    if load_tokenizer(student).get_vocab() != load_tokenizer(model_dir).get_vocab():
        raise ConfigError(f"the default teacher is built from the default model, whose tokenizer --model {student} does "
                          "not share (token-level distillation needs one tokenizer): pass --teacher model:DIR, a "
                          "teacher with the student's tokenizer.")


def _fine_tune(model_dir: Path, demos: Path, out: Path) -> None:
    """What ``agentkit train --objective sft --demos DEMOS`` does with ``RECIPE``'s settings (the same
    sampling of each step's demonstrations and the same update), without evaluation or checkpoints."""
    import torch

    from agentkit.core.jsonl import read_trajectories
    from agentkit.objectives import make_objective
    from agentkit.rollout.hf_backend import load_tokenizer
    from agentkit.train.config import TrainSection
    from agentkit.train.distributed import SingleProcess
    from agentkit.train.policy import load_policy
    from agentkit.train.update import update

    train = TrainSection(steps=RECIPE.steps, lr=RECIPE.lr, warmup_steps=RECIPE.warmup_steps,
                         demos_per_step=RECIPE.demos_per_step)
    torch.manual_seed(RECIPE.seed)
    policy = load_policy(model_dir, train)
    objective = make_objective("sft")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=train.lr, betas=train.betas, weight_decay=train.weight_decay)
    trajectories = read_trajectories(demos)
    ranks = SingleProcess()
    policy.train()
    for step in range(train.steps):
        rng = random.Random(f"{RECIPE.seed}:{step}")
        batch = objective.prepare(rng.sample(trajectories, min(train.demos_per_step, len(trajectories))))
        update(policy, optimizer, objective, batch, train=train, ranks=ranks, rng=rng, needs_support=False, step=step)
    policy.eval()
    policy.save_pretrained(out, safe_serialization=True)
    load_tokenizer(model_dir).save_pretrained(out)


def with_run_defaults(cfg, *, notice: Callable[[str], None] = _notice):
    """``cfg`` (a ``TrainConfig``, environment defaults filled in) with what its objective needs and
    the settings leave unset: the teacher (``agentkit.train.scoring.choose_teacher``: for an objective
    that distills from a separate model, the default teacher of the environment) and, for one that
    trains on demonstrations, the default demonstrations. The config.yaml of the run records both."""
    from agentkit.models import ensure_default_model, resolve_model_dir
    from agentkit.train.scoring import choose_teacher, resolve_teacher_spec

    needs = cfg.objective.requirements()

    def student() -> Path:
        return resolve_model_dir(cfg.model) if cfg.model else ensure_default_model()

    train, teacher = cfg.train, cfg.teacher
    if needs.uses_demonstrations and not train.demos:
        demos = default_demonstrations(cfg.env, cfg.context, student())
        notice(f"demonstrations: the default ones for {cfg.env.id}, its expert's games on train seeds 0-"
               f"{RECIPE.demo_games - 1} ({demos})")
        train = train.model_copy(update={"demos": str(demos)})
    spec = choose_teacher(needs, teacher.spec, objective=cfg.objective.name,
                          separate=lambda: f"model:{default_teacher(cfg.env, cfg.context, student=student(), notice=notice)}")
    if spec:
        resolve_teacher_spec(spec)  # a mistyped folder fails now, naming it
        teacher = teacher.model_copy(update={"spec": spec})
    return cfg.model_copy(update={"train": train, "teacher": teacher})


def describe_teacher(spec: str) -> str:
    """``spec`` as a run's final lines show it; a default teacher is named as such."""
    name, _, folder = spec.partition(":")
    info_file = Path(folder) / INFO_FILE
    if name == "model" and info_file.is_file():
        info = json.loads(info_file.read_text())
        if info.get("builder") == BUILDER:
            return (f"the default teacher for {info['env']['env']} ({folder}; the default policy trained on "
                    f"{info['recipe']['demo_games']} of its expert games)")
    return spec
