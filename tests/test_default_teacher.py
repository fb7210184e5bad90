"""``agentkit train --objective X`` with default settings, for an objective that distills from a
separate teacher (opd, sage_opd) or trains on demonstrations (sft): the run builds the default
teacher / demonstrations of its environment on first use, caches them under a key that changes with
what determines them, says which teacher it used, and records it in config.yaml. The real CLI in
process, the shipped default model, the built-in vaults environment (the default environment's
teacher is built by the slow test over every objective, ``test_train_every_objective.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from agentkit.objectives import Capabilities
from agentkit.rollout.run import resolve_env

import agentkit.train.default_teacher as default_teacher
from agentkit.cli import main
from agentkit.core.errors import ConfigError
from agentkit.core.settings import ContextSettings, EnvSettings
from agentkit.train.scoring import choose_teacher

SMALL = ["--env", "vaults/vaults-v0", "--tasks-per-step", "1", "--group-size", "2", "--eval-episodes", "1",
         "--max-new-tokens", "8", "--no-eval-at-start", "--quiet"]
# the recipe at a test's budget (the real one: the slow test); the cache key changes with it
QUICK = default_teacher.Recipe(demo_games=3, steps=2, warmup_steps=1, demos_per_step=2)


@pytest.fixture
def quick_recipe(monkeypatch):
    monkeypatch.setattr(default_teacher, "RECIPE", QUICK)


def test_the_teacher_is_chosen_from_declared_capabilities():
    built = []

    def separate():
        built.append(1)
        return "model:/teachers/default"

    separate_model = Capabilities(needs_teacher=True)
    assert choose_teacher(separate_model, None, separate=separate) == "model:/teachers/default" and built == [1]
    assert choose_teacher(separate_model, "model:/mine", separate=separate) == "model:/mine"
    assert choose_teacher(Capabilities(needs_teacher=True, default_teacher="self"), None, separate=separate) == "self"
    assert choose_teacher(Capabilities(), None, separate=separate) is None and built == [1]
    with pytest.raises(ConfigError, match="'opd' distills from a separate teacher model: pass --teacher model:DIR"):
        choose_teacher(separate_model, None, objective="opd")  # a library caller that offers no default


def test_opd_with_no_teacher_builds_the_default_one_then_reuses_it(tmp_path, capsys, quick_recipe, agentkit_cache):
    started = time.perf_counter()
    assert main(["train", "--objective", "opd", "--steps", "1", "--out", str(tmp_path / "a"), *SMALL]) == 0
    out, err = capsys.readouterr()
    first_s = time.perf_counter() - started
    assert "teacher: building the default teacher for vaults/vaults-v0" in err, err
    assert "teacher: the default teacher for vaults/vaults-v0 (" in err and "built in" in err, err
    spec = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["teacher"]["spec"]
    folder = Path(spec.removeprefix("model:"))
    assert spec.startswith("model:") and folder.parent == agentkit_cache / "teachers", spec
    assert (folder / "model.safetensors").is_file() and (folder / default_teacher.INFO_FILE).is_file()
    # the final lines say which teacher was used
    assert f"teacher: the default teacher for vaults/vaults-v0 ({folder}" in out, out

    started = time.perf_counter()
    assert main(["train", "--objective", "sage_opd", "--steps", "1", "--out", str(tmp_path / "b"), *SMALL]) == 0
    out, err = capsys.readouterr()
    assert "building" not in err and f"teacher: the default teacher for vaults/vaults-v0 ({folder})" in err, err
    assert f"teacher: the default teacher for vaults/vaults-v0 ({folder}" in out, out
    assert yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["teacher"]["spec"] == spec
    print(f"opd with a teacher built: {first_s:.1f} s; sage_opd reusing it: {time.perf_counter() - started:.1f} s")


def test_the_cache_key_changes_with_what_makes_the_teacher(monkeypatch):
    env = resolve_env(EnvSettings(id="vaults/vaults-v0"))
    context = ContextSettings()
    folder = default_teacher.teacher_folder(env, context)
    assert default_teacher.teacher_folder(env, context) == folder
    others = [default_teacher.teacher_folder(env.model_copy(update={"kwargs": {**env.kwargs, "chambers": 3}}), context),
              default_teacher.teacher_folder(env.model_copy(update={"max_turns": env.max_turns + 1}), context),
              default_teacher.teacher_folder(env, ContextSettings(mode="window"))]
    monkeypatch.setattr(default_teacher, "RECIPE", default_teacher.Recipe(steps=default_teacher.RECIPE.steps + 1))
    others.append(default_teacher.teacher_folder(env, context))
    monkeypatch.setattr(default_teacher, "_files_digest", lambda folder, names: "another default model")
    others.append(default_teacher.teacher_folder(env, context))
    assert len({folder, *others}) == len(others) + 1, others


def test_sft_with_no_demos_trains_on_the_default_demonstrations(tmp_path, capsys, quick_recipe):
    assert main(["train", "--objective", "sft", "--steps", "1", "--out", str(tmp_path / "run"), *SMALL]) == 0
    err = capsys.readouterr().err
    demos = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["demos"]
    assert "demonstrations: the default ones for vaults/vaults-v0" in err and demos in err, err
    assert len(Path(demos).read_text().splitlines()) == QUICK.demo_games


def test_a_student_with_another_tokenizer_gets_one_line(tiny_model_dir, tmp_path, capsys, quick_recipe, agentkit_cache):
    before = sorted((agentkit_cache / "teachers").glob("*")) if (agentkit_cache / "teachers").exists() else []
    assert main(["train", "--objective", "opd", "--steps", "1", "--model", str(tiny_model_dir),
                 "--out", str(tmp_path / "run"), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert "whose tokenizer --model" in err and "--teacher model:DIR" in err, err
    assert not (tmp_path / "run").exists()
    after = sorted((agentkit_cache / "teachers").glob("*")) if (agentkit_cache / "teachers").exists() else []
    assert after == before  # nothing built


def test_the_teacher_is_what_train_sft_makes_with_the_recipe(tmp_path, capsys, quick_recipe):
    """Built with the loop's own update and sampling: the same weights as ``agentkit train --objective
    sft`` on the default demonstrations with the recipe's settings."""
    from safetensors.torch import load_file

    from agentkit.models import ensure_default_model

    env = resolve_env(EnvSettings(id="vaults/vaults-v0"))
    teacher = default_teacher.default_teacher(env, ContextSettings())
    demos = default_teacher.default_demonstrations(env, ContextSettings(), ensure_default_model())
    assert main(["train", "--objective", "sft", "--env", env.id, "--demos", str(demos), "--steps", str(QUICK.steps),
                 "--lr", str(QUICK.lr), "--set", f"train.warmup_steps={QUICK.warmup_steps}",
                 "--set", f"train.demos_per_step={QUICK.demos_per_step}", "--seed", str(QUICK.seed),
                 "--out", str(tmp_path / "sft"), "--eval-episodes", "1", "--no-eval-at-start", "--quiet"]) == 0
    ours = load_file(teacher / "model.safetensors")
    theirs = load_file(tmp_path / "sft" / "checkpoints" / f"step-{QUICK.steps}" / "model.safetensors")
    assert sorted(ours) == sorted(theirs) and all(ours[k].equal(theirs[k]) for k in ours)


def test_bad_environment_settings_fail_before_the_teacher_is_built(tmp_path, capsys, quick_recipe, monkeypatch):
    monkeypatch.setenv("AGENTKIT_CACHE", str(tmp_path / "cache"))
    assert main(["train", "--objective", "opd", "--steps", "1", "--out", str(tmp_path / "run"), *SMALL,
                 "--env-kwargs", "families=nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown vault families ['nonsense']" in err and "teacher" not in err, err
    assert not (tmp_path / "cache" / "teachers").exists() and not (tmp_path / "run").exists()


class _NoExpert:
    """A playable environment with no expert plan in its info."""

    def __init__(self, split="train"):
        self.split = split

    def reset(self, *, seed=None, options=None):
        return "a room", {"task": "leave", "admissible_actions": ["wait"]}

    def step(self, action):
        return "still here", 0.0, False, False, {"action_valid": True, "won": False}

    def close(self):
        pass


def test_an_environment_without_an_expert_says_what_to_pass(tmp_path, capsys, quick_recipe, monkeypatch):
    from agentkit.envs import REGISTRY, register

    monkeypatch.setattr(REGISTRY, "_specs", dict(REGISTRY._specs))
    register("testing/no-expert-v0", _NoExpert, splits=("train", "eval"), eval_split="eval")
    monkeypatch.setenv("AGENTKIT_CACHE", str(tmp_path / "cache"))
    for objective, given in (("opd", "--teacher model:DIR"), ("sft", "--demos FILE")):
        assert main(["train", "--objective", objective, "--env", "testing/no-expert-v0", "--steps", "1",
                     "--out", str(tmp_path / objective), *SMALL[2:]]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().count("\n") <= 1 and given in err, err
        assert "testing/no-expert-v0: its expert's games" in err and not (tmp_path / objective).exists(), err
