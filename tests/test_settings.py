"""Settings are defined once: every command spells, defaults and applies each shared setting the
same way, flags and ``--set`` keys agree, and the docs table is generated from the models."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentkit.rollout.config import DemosConfig, EvalConfig, RolloutConfig

from agentkit.cli import build_parser
from agentkit.core.config import load_settings, settings_from_args, settings_of
from agentkit.core.errors import ConfigError
from agentkit.train.config import TrainConfig, load_config

COMMANDS = {"rollout": RolloutConfig, "eval": EvalConfig, "demos": DemosConfig, "train": TrainConfig}
SHARED_SECTIONS = ("env.", "sampling.", "context.", "skills.", "backend.")
# a value other than the default for each shared setting, as typed on a command line
OTHER_VALUE = {
    "env.id": ("vaults/vaults-v0", "vaults/vaults-v0"), "env.kwargs": ("level=5", {"level": 5}),
    "env.max_turns": ("17", 17), "env.workers": ("3", 3), "env.ray": ("local", "local"),
    "env.step_timeout": ("9.5", 9.5), "env.max_errors": ("4", 4), "sampling.max_new_tokens": ("11", 11),
    "sampling.temperature": ("0.7", 0.7), "sampling.top_p": ("0.9", 0.9), "sampling.top_k": ("5", 5),
    "context.mode": ("window", "window"), "context.window": ("2", 2), "context.show_admissible": (None, False),
    "context.system_prompt": ("Be brief.", "Be brief."), "skills.bank": ("alfworld", "alfworld"),
    "skills.retrieval": ("keyword", "keyword"), "skills.k": ("2", 2), "skills.args": ("c=0.5", {"c": 0.5}),
    "backend.kind": ("vllm", "vllm"), "backend.device": ("cuda", "cuda"),
}
REQUIRED = {"demos": ["--out", "d.jsonl"]}


def _parse(command: str, *argv: str):
    args = build_parser().parse_args([command, *REQUIRED.get(command, []), *argv])
    return load_settings(COMMANDS[command], args.config, args.set, settings_from_args(args, COMMANDS[command]))


def _get(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _shared_rows():
    rows: dict[str, dict[str, object]] = {}
    for name, model in COMMANDS.items():
        for row in settings_of(model):
            if row.key.startswith(SHARED_SECTIONS):
                rows.setdefault(row.key, {})[name] = row
    return rows


def test_every_command_spells_and_defaults_each_shared_setting_the_same_way():
    rows = _shared_rows()
    assert {"env.id", "env.max_turns", "context.mode", "context.window", "sampling.max_new_tokens"} <= set(rows)
    for key, by_command in rows.items():
        flags = {row.flag for row in by_command.values()}
        defaults = {repr(row.default) for row in by_command.values()}
        descriptions = {row.description for row in by_command.values()}
        assert len(flags) == 1, f"{key} is spelled {flags} across commands"
        assert len(defaults) == 1, f"{key} defaults to {defaults} across commands"
        assert len(descriptions) == 1, f"{key} is described differently across commands"
    # the settings whose drift gave wrong results: eval has the context of training
    for key in ("context.mode", "context.window", "context.show_admissible", "env.max_turns", "env.kwargs",
                "env.step_timeout"):
        assert set(rows[key]) == set(COMMANDS), f"{key} is missing from {set(COMMANDS) - set(rows[key])}"
    assert set(rows["sampling.max_new_tokens"]) == {"rollout", "eval", "train"}  # demos generate nothing


@pytest.mark.parametrize("key", sorted(OTHER_VALUE))
def test_a_shared_flag_sets_the_same_key_in_every_command_that_has_it(key):
    typed, expected = OTHER_VALUE[key]
    for command, rows in ((c, {r.key: r for r in settings_of(m)}) for c, m in COMMANDS.items()):
        if key not in rows:
            continue
        row = rows[key]
        argv = [f"--no-{row.flag[2:]}"] if typed is None else [row.flag, typed]
        if command == "train" and key == "backend.device":
            with pytest.raises(ConfigError, match=r"--device cuda \(backend.device\): one training process"):
                _parse(command, row.flag, typed)
            continue
        if command == "train" and key in ("sampling.top_p", "sampling.top_k"):
            with pytest.raises(ConfigError, match=r"training samples from the whole distribution"):
                _parse(command, row.flag, typed)
            assert _get(_parse(command, row.flag, typed, "--objective", "sft", "--demos", "d.jsonl"), key) == expected
            continue
        workers = ["--env-workers", "1"] if key == "env.ray" else []
        cfg = _parse(command, *argv, *workers)
        assert _get(cfg, key) == expected, (command, key)
        assignment = (f"{key}.{typed}" if isinstance(expected, dict)  # --set env.kwargs.level=5
                      else f"{key}={typed if typed is not None else 'false'}")
        via_set = _parse(command, "--set", assignment, *workers)
        assert _get(via_set, key) == expected, (command, key, "--set")


def test_training_takes_the_vllm_backend_and_refuses_a_server():
    assert _parse("train", "--backend", "vllm", "--vllm-args", "dtype=float32").backend.args == {"dtype": "float32"}
    with pytest.raises(ConfigError, match=r"training samples with the weights it trains: hf or vllm \(--backend\)"):
        load_config(None, ["backend.kind=openai", "backend.base_url=http://127.0.0.1:1/v1"])
    with pytest.raises(SystemExit):  # train has no server options: argparse refuses them
        build_parser().parse_args(["train", "--base-url", "http://127.0.0.1:1/v1"])


def test_flags_win_over_set_which_wins_over_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("context:\n  window: 1\nsampling:\n  temperature: 0.3\nenv:\n  max_turns: 4\n")
    args = build_parser().parse_args(["rollout", "--config", str(config), "--set", "context.window=2",
                                      "--set", "env.max_turns=5", "--max-turns", "6"])
    cfg = load_settings(RolloutConfig, args.config, args.set, settings_from_args(args, RolloutConfig))
    assert (cfg.context.window, cfg.sampling.temperature, cfg.env.max_turns) == (2, 0.3, 6)


def test_a_backend_option_of_another_backend_is_refused_naming_its_backend():
    with pytest.raises(ConfigError, match=r"base_url.*option of backend openai"):
        _parse("rollout", "--base-url", "http://127.0.0.1:8000/v1")
    with pytest.raises(ConfigError, match=r"--base-url \(backend.base_url\): Field required"):
        _parse("rollout", "--backend", "openai")
    assert _parse("rollout", "--backend", "openai", "--base-url", "http://127.0.0.1:8000/v1").backend.base_url


def test_backend_short_forms():
    assert load_config(None, ["backend=vllm"]).backend.kind == "vllm"  # --set backend=vllm
    assert load_config(None, ["backend=null"]).backend.kind == "hf"  # an empty section: the default
    with pytest.raises(ConfigError, match=r"backend: training samples with the weights it trains: hf or vllm"):
        load_config(None, ["backend=[1]"])
    with pytest.raises(ConfigError, match=r"backend: must be hf, vllm or openai \(--backend\)"):
        load_settings(RolloutConfig, None, ["backend=[1]"])


def test_an_old_key_names_its_new_one(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("rollout:\n  context: window\n  max_new_tokens: 8\nenv:\n  eval_split: eval\n")
    with pytest.raises(ConfigError) as err:
        load_config(old)
    text = str(err.value)
    assert "'rollout.context' is now 'context.mode'" in text
    assert "'rollout.max_new_tokens' is now 'sampling.max_new_tokens'" in text
    assert "'env.eval_split' is now 'eval.split'" in text


def test_unknown_key_gets_did_you_mean():
    with pytest.raises(ConfigError, match=r"unknown key 'context.windw'.*window"):
        load_config(None, ["context.windw=2"])


def test_environment_defaults_come_from_its_registration():
    from agentkit.envs import env_info
    from agentkit.rollout.run import held_out_split, resolve_env

    from agentkit.train import resolve_defaults

    cfg = resolve_defaults(load_config(None, [], {"env.id": "vaults/vaults-v0"}))
    info = env_info("vaults/vaults-v0")
    assert cfg.env.max_turns == info.max_turns and cfg.eval.split == info.eval_split == held_out_split(cfg.env.id)
    assert cfg.env.kwargs == info.kwargs  # recorded as played
    coin = resolve_env(load_config(None, ["env.kwargs.goal=brief"]).env)
    assert coin.kwargs["level"] == env_info("textworld/coin-v0").kwargs["level"] and coin.kwargs["goal"] == "brief"
    assert resolve_env(cfg.env.model_copy(update={"max_turns": 3})).max_turns == 3  # given: kept


def test_docs_settings_table_is_generated_from_the_models():
    from agentkit.settings_doc import render

    path = Path(__file__).parents[1] / "docs" / "settings.md"
    assert path.read_text() == render(), "docs/settings.md is out of date: python -m agentkit.settings_doc > docs/settings.md"
