"""Hostile inputs: model output, trajectory files, config files, checkpoints and skill banks.

Whatever a model writes is an invalid action (``action_valid=False``) or an action it really wrote,
never an exception. Whatever a file holds is read, or refused with an ``AgentkitError`` that names
the file and line; a refused file is never modified by the attempt. Hypothesis fuzzes the action
parser (with model-like text and with real decodes of random token ids), the trajectory reader and
the config loader; the environments, tokenizer, model and checkpoints are real and tiny.
"""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
import warnings
from pathlib import Path

import pytest
import yaml
from agentkit.envs import ActionParser
from agentkit.envs.wrappers import INVALID_FORMAT_FEEDBACK
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentkit.core.config import load_settings, parse_assignment, settings_from_args
from agentkit.core.errors import ConfigError, ModelError, PluginError, TrajectoryFormatError, UnknownNameError
from agentkit.core.jsonl import TornLineWarning, TrajectoryWriter, read_trajectories
from agentkit.core.trajectory import SCHEMA_VERSION, Trajectory, Turn

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (or ``root`` itself) with its bytes: a failed load must leave it so."""
    if root.is_file():
        return {root.name: root.read_bytes()}
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# =============================================================================================
# model output -> action
# =============================================================================================

# what models write when they go wrong; ids name the pytest cases
HOSTILE_OUTPUTS = {
    "empty": "",
    "whitespace": " \n\t ",
    "10k-chars": "x" * 10_000,
    "10k-in-tags": "<action>" + "go north " * 1_250 + "</action>",
    "no-tags": "I should probably look around first, then take the key.",
    "nested": "<action><action>look</action></action>",
    "repeated": "<action>look</action>" * 500,
    "repeated-last-wins": "<action>inventory</action> wait <action>look</action>",
    "only-open-tags": "<action>" * 1_250,
    "only-close-tags": "</action>" * 1_000,
    "reversed-tags": "</action>look<action>",
    "empty-tags": "<action></action><action> \t</action>",
    "unclosed": "<action>look",
    "lone-surrogates": "<action>\ud800lo\udfffok</action>",
    "utf8-replaced": b"<action>lo\xff\xfeok</action>".decode("utf-8", errors="replace"),
    "utf8-surrogateescape": b"<action>lo\xffok</action>".decode("utf-8", errors="surrogateescape"),
    "utf8-ignored": b"<action>lo\xffok</action>".decode("utf-8", errors="ignore"),
    "nul-inside-word": "<action>lo\x00ok</action>",
    "control-chars": "<action>\x00\x01\x07\x08\x0b\x0c\x1b\x7f\x9b</action>",
    "ansi-colours": "<action>\x1b[1mlook\x1b[0m</action>",
    "only-nul": "\x00" * 100,
    "zero-width": "<action>lo\u200bok</action>",
    "backslash-escape": "<action>\\quit</action>",
    "backslashes": "<action>\\\\</action>\\n\\x00",
    "other-format-tags": "<search>the key</search><answer>look</answer>",
    "mixed-case-tags": "<ACTION>  LOOK  </Action>",
    "line-separators": "<action>look\u2028\u2029</action>",
    "emoji": "<action>🔑 take key</action>",
}


def action_tags_in(text: str) -> bool:
    return bool(re.search("<action>", text, re.IGNORECASE) and re.search("</action>", text, re.IGNORECASE))


def assert_real_action(text: str, action: str | None) -> None:
    """None, or an action the text really holds: inside action tags, made of the text's own words,
    printable, short, and writable as UTF-8."""
    if action is None:
        return
    assert action_tags_in(text), f"an action from text without action tags: {text!r} -> {action!r}"
    assert action == " ".join(action.split()) and 0 < len(action) <= ActionParser().max_length
    assert action.isprintable(), f"control characters or surrogates survived: {action!r}"
    action.encode("utf-8")
    assert all(word in text for word in action.split()), f"{action!r} invents words not in {text!r}"


@pytest.mark.parametrize("text", list(HOSTILE_OUTPUTS.values()), ids=list(HOSTILE_OUTPUTS))
def test_action_parser_on_hostile_outputs(text):
    action = ActionParser().parse(text)
    assert_real_action(text, action)


def test_action_parser_hostile_outputs_golden():
    parse = ActionParser().parse
    assert parse(HOSTILE_OUTPUTS["repeated"]) == "look"
    assert parse(HOSTILE_OUTPUTS["repeated-last-wins"]) == "look"
    assert parse(HOSTILE_OUTPUTS["mixed-case-tags"]) == "LOOK"
    # a control character or a lost byte splits a word instead of fusing its halves into a command
    for key in ("lone-surrogates", "utf8-replaced", "utf8-surrogateescape", "nul-inside-word", "zero-width"):
        assert parse(HOSTILE_OUTPUTS[key]) != "look", key
    for key in ("empty", "whitespace", "10k-chars", "10k-in-tags", "no-tags", "only-open-tags", "only-close-tags",
                "reversed-tags", "empty-tags", "unclosed", "control-chars", "only-nul", "other-format-tags"):
        assert parse(HOSTILE_OUTPUTS[key]) is None, key


# model-like text: tags, nesting, control characters, surrogates, backslashes and long runs, mixed
MODEL_TEXT = st.lists(
    st.one_of(
        st.text(max_size=12),
        st.sampled_from(["<action>", "</action>", "<ACTION>", "</Action>", "<action >", "look", "inventory",
                         "go north", "open chest drawer", " ", "\n", "\t", "\x00", "\x07", "\x1b[0m", "\x85",
                         "\u200b", "\u2028", "\ufeff", "\ud800", "\udfff", "\udcff", "\\", "\\quit", "é", "🔑",
                         "<search>", "</answer>", "x" * 301]),
    ),
    max_size=14,
).map("".join)


@FUZZ
@given(MODEL_TEXT)
def test_action_parser_fuzz_only_real_actions(text):
    assert_real_action(text, ActionParser().parse(text))


# -- through real environments, built as the collector builds them ---------------------------------
@pytest.fixture(scope="module")
def textworld_env():
    pytest.importorskip("textworld", reason="needs the textworld extra")
    from agentkit.rollout.run import env_factory

    env = env_factory("textworld/simple-v0", split="train", max_turns=8, env_kwargs={})()
    yield env
    env.close()


@pytest.fixture(scope="module")
def search_qa_env():
    pytest.importorskip("bm25s", reason="needs the search extra (bm25s)")
    from agentkit.rollout.run import env_factory

    env = env_factory("search-qa/generated-v0", split="eval", max_turns=8, env_kwargs={})()
    yield env
    env.close()


def step_textworld(env, text: str) -> None:
    """One step of model text: an invalid action (format feedback, no reward, state kept) unless the
    text holds an action; then valid exactly when the game admits it."""
    _, before = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(text)
    expected = ActionParser().parse(text)
    assert info["action"] == expected and isinstance(info["action_valid"], bool)
    if expected is None:
        assert info["action_valid"] is False and obs == INVALID_FORMAT_FEEDBACK
        assert reward == 0.0 and not terminated and not truncated
    else:
        assert info["action_valid"] == (expected.lower() in before["admissible_actions"])
    assert isinstance(obs, str) and math.isfinite(reward)


@pytest.mark.parametrize("text", list(HOSTILE_OUTPUTS.values()), ids=list(HOSTILE_OUTPUTS))
def test_textworld_step_on_hostile_outputs(textworld_env, text):
    step_textworld(textworld_env, text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(MODEL_TEXT)
def test_textworld_step_fuzz(textworld_env, text):
    step_textworld(textworld_env, text)


@pytest.mark.parametrize("text", list(HOSTILE_OUTPUTS.values()), ids=list(HOSTILE_OUTPUTS))
def test_search_qa_step_on_hostile_outputs(search_qa_env, text):
    # Search-QA reads the whole response itself (<search>/<answer>); the collector adds no parser
    from agentkit.envs.search_qa.env import parse_action

    search_qa_env.reset(seed=0)
    obs, reward, terminated, truncated, info = search_qa_env.step(text)
    assert isinstance(obs, str) and isinstance(info["action_valid"], bool)
    if parse_action(text) is None:
        assert info["action_valid"] is False and reward == 0 and not terminated and not truncated


# -- real decodes of random token ids ------------------------------------------------------------
@pytest.fixture(scope="module")
def default_tokenizer():
    from agentkit.rollout.hf_backend import load_tokenizer

    from agentkit.models import ensure_default_model

    return load_tokenizer(ensure_default_model())


# random ids (some past the vocabulary) mixed with the ids of real tags and actions
TOKEN_PIECES = st.lists(
    st.one_of(st.integers(min_value=0, max_value=2**16), st.sampled_from(["<action>", "</action>", "look", " ", "\n"])),
    max_size=40,
)


def decode(tokenizer, pieces, *, skip_special_tokens: bool) -> str:
    ids: list[int] = []
    for piece in pieces:
        if isinstance(piece, str):
            ids += tokenizer.encode(piece, add_special_tokens=False)
        else:
            ids.append(piece % (len(tokenizer) + 8))
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@FUZZ
@given(TOKEN_PIECES, st.booleans())
def test_decoded_random_token_ids_parse_to_real_actions_or_none(default_tokenizer, pieces, skip_special):
    text = decode(default_tokenizer, pieces, skip_special_tokens=skip_special)
    assert_real_action(text, ActionParser().parse(text))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(TOKEN_PIECES)
def test_decoded_random_token_ids_through_textworld(default_tokenizer, textworld_env, pieces):
    # the collector decodes with skip_special_tokens=True and steps the wrapped environment
    step_textworld(textworld_env, decode(default_tokenizer, pieces, skip_special_tokens=True))


# =============================================================================================
# trajectory files
# =============================================================================================


def make_trajectory(i: int = 0) -> Trajectory:
    turn = Turn(observation="obs", context_ids=[1, 2, 3], response_ids=[4, 5], response_logprobs=[-0.5, -1.25],
                response_text="<action>look</action>", action="look", action_valid=True, reward=0.5, feedback="ok",
                error=None, expert_action="look", privileged="Expert plan from here: look")
    return Trajectory(id=f"g{i}-0", env="demo", task="open the lock", seed=i, split="train", group=f"g{i}", sample=0,
                      turns=[turn, turn], episode_return=1.0, won=True, score=1.0, terminated=True, truncated=False,
                      model="tiny", sampling={"temperature": 1.0, "stop": ["</action>"]}, skills=["s.1"])


def line(trajectory: Trajectory) -> bytes:
    return json.dumps(trajectory.to_dict()).encode() + b"\n"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("robust")


def read_or_refuse(path: Path, *, strict: bool) -> list[Trajectory] | None:
    """Read ``path``: validated trajectories that the writer can write back unchanged, or a
    TrajectoryFormatError naming the file and a line it has. Never another exception; never a change."""
    before = path.read_bytes()
    lines = before.count(b"\n") + (0 if before.endswith(b"\n") or not before else 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TornLineWarning)
            trajectories = read_trajectories(path, strict=strict)
    except TrajectoryFormatError as err:
        where = re.match(re.escape(str(path)) + r":(\d+)[:,]", str(err))
        assert where, f"the error does not start with FILE:LINE: {err}"
        assert 1 <= int(where.group(1)) <= lines
        trajectories = None
    assert path.read_bytes() == before, "reading changed the file"
    if trajectories:
        copy = path.with_name(path.name + ".copy")
        with TrajectoryWriter(copy, mode="overwrite") as writer:
            for t in trajectories:
                writer.write(t)
        assert read_trajectories(copy, strict=True) == trajectories
    return trajectories


@FUZZ
@given(st.binary(max_size=400), st.booleans())
def test_reader_fuzz_arbitrary_bytes(scratch, data, strict):
    path = scratch / "bytes.jsonl"
    path.write_bytes(data)
    read_or_refuse(path, strict=strict)


JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
    st.sampled_from([10**30, 10**400, -1, 2**31, 2**63, -0.0, "\ud800", "\x00", ""]),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@FUZZ
@given(st.lists(JSON_VALUES, min_size=1, max_size=3), st.booleans())
def test_reader_fuzz_arbitrary_json_lines(scratch, values, torn):
    path = scratch / "values.jsonl"
    data = b"".join(json.dumps(v).encode() + b"\n" for v in values)  # NaN, Infinity, "\ud800" escapes
    path.write_bytes(line(make_trajectory(0)) + (data[:-1] if torn else data))
    read_or_refuse(path, strict=False)


_TURN_KEYS = list(make_trajectory().to_dict()["turns"][0])
_FIELD_PATHS = [(k,) for k in make_trajectory().to_dict() if k != "turns"] + [("turns",)] + \
               [("turns", 1, k) for k in _TURN_KEYS] + [("turns", 0, "response_ids", 0), ("sampling", "temperature")]
MUTANTS = st.one_of(
    JSON_VALUES,
    st.sampled_from([math.nan, math.inf, -math.inf, 10**400, 10**30, 2**31, -1, True, False, None, "", "\ud800",
                     [], {}, [[]], SCHEMA_VERSION + 1, 1e308, -1e-7]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(_FIELD_PATHS), st.sampled_from(["set", "delete", "extra"]), MUTANTS, st.booleans())
def test_reader_fuzz_one_field_mutated(scratch, field_path, how, value, strict):
    record = json.loads(line(make_trajectory(1)))
    *parents, last = field_path
    node = record
    for key in parents:
        node = node[key]
    if how == "set":
        node[last] = value
    elif how == "delete":
        del node[last]
    elif isinstance(node, dict):
        node[f"{last}_extra"] = value
    else:
        node.append(value)
    path = scratch / "mutated.jsonl"
    path.write_bytes(line(make_trajectory(0)) + json.dumps(record).encode() + b"\n")
    trajectories = read_or_refuse(path, strict=strict)
    if trajectories is None:
        with pytest.raises(TrajectoryFormatError, match=re.escape(f"{path}:2")):
            read_trajectories(path)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"1" * 5_000, "not valid JSON"),  # an integer longer than Python converts
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),  # nesting deeper than the recursion limit
        (b'{"id": "\\ud800"}', "lone surrogate|missing required field"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"   ", "empty line"),
        (b"[]", "must be a JSON object"),
    ],
    ids=["long-integer", "deep-nesting", "escaped-surrogate", "not-utf8", "blank", "array"],
)
def test_corrupted_middle_line_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "t.jsonl"
    path.write_bytes(line(make_trajectory(0)) + bad + b"\n" + line(make_trajectory(2)))
    before = path.read_bytes()
    for strict in (False, True):
        with pytest.raises(TrajectoryFormatError, match=rf"^{re.escape(str(path))}:2: .*({message})"):
            read_trajectories(path, strict=strict)
    assert path.read_bytes() == before


def test_torn_last_line_is_skipped_or_refused_naming_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    whole = line(make_trajectory(1))
    path.write_bytes(line(make_trajectory(0)) + whole[: len(whole) // 3])
    before = path.read_bytes()
    with pytest.warns(TornLineWarning, match=rf"{re.escape(str(path))}:2: torn last line"):
        assert read_trajectories(path) == [make_trajectory(0)]
    with pytest.raises(TrajectoryFormatError, match=rf"{re.escape(str(path))}:2: torn last line"):
        read_trajectories(path, strict=True)
    assert path.read_bytes() == before, "reading never moves the torn fragment (only an append does)"


def test_schema_version_from_the_future_says_upgrade(tmp_path):
    future = make_trajectory(1).to_dict()
    future["schema_version"] = SCHEMA_VERSION + 1
    future["a_field_from_the_future"] = {"x": 1}  # a newer schema adds fields: still the upgrade message
    del future["sampling"]
    path = tmp_path / "t.jsonl"
    path.write_bytes(line(make_trajectory(0)) + json.dumps(future).encode() + b"\n")
    for strict in (False, True):
        with pytest.raises(TrajectoryFormatError, match=rf"{re.escape(str(path))}:2: schema_version {SCHEMA_VERSION + 1} "
                                                        r"is newer .*written by a newer agentkit.*upgrade agentkit"):
            read_trajectories(path, strict=strict)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.update(score=10**400), "'score' must be a finite number"),
        (lambda r: r["turns"][0].update(env_s=math.inf), "turn 0: field 'env_s' must be a finite number"),
        (lambda r: r.update(**{"return": math.nan}), "'return' must be a finite number"),
        (lambda r: r["turns"][1].update(response_ids=[4, 2**40]), "turn 1: 'response_ids' must be a list of non-negative"),
        (lambda r: r["turns"][0].update(response_logprobs=[-math.inf, -1.0]), "response_logprobs must be finite"),
        (lambda r: r.update(task="\udc80"), "field 'task' holds a lone surrogate"),
        (lambda r: r["sampling"].update(temperature=math.nan), "'sampling' holds a value JSON cannot carry"),
    ],
    ids=["huge-int-score", "inf-seconds", "nan-return", "huge-token-id", "inf-logprob", "surrogate", "nan-sampling"],
)
def test_values_the_writer_could_not_write_back_are_refused(tmp_path, mutate, message):
    record = make_trajectory(1).to_dict()
    mutate(record)
    path = tmp_path / "t.jsonl"
    path.write_bytes(line(make_trajectory(0)) + json.dumps(record).encode() + b"\n")
    with pytest.raises(TrajectoryFormatError, match=rf"{re.escape(str(path))}:2[:,].*{re.escape(message)}"):
        read_trajectories(path)


# =============================================================================================
# config files and overrides
# =============================================================================================


def dotted_keys(model) -> list[str]:
    """Every ``--set`` key of a settings model (each backend kind's own options included)."""
    from agentkit.core.config import settings_of

    return [row.key for row in settings_of(model)]


@functools.cache
def train_keys() -> list[str]:
    from agentkit.train.config import TrainConfig

    return dotted_keys(TrainConfig)


YAML_VALUES = st.one_of(
    st.text(max_size=16),
    st.sampled_from(["0", "-1", "1e-5", "0.5", "true", "null", "~", ".nan", ".inf", "[1, 2]", "{a: 1}", "[", "{", "]",
                     ":", "- a", "'", '"', "\t", "&a [*a]", "*b", "!!binary xx", "!!python/object:os.getcwd x",
                     "2001-13-45", "1" * 5_000, "[" * 600, "grpo", "sft", "ucb", "chat", "vllm", "a:b"]),
)
OVERRIDES = st.lists(
    st.one_of(
        st.text(max_size=24),
        st.tuples(st.one_of(st.deferred(lambda: st.sampled_from(train_keys())),
                            st.sampled_from(["train", "train.lr.x", "nope", "", " ", "objective.args.x", "a..b"])),
                  YAML_VALUES).map(lambda kv: "=".join(kv)),
    ),
    max_size=4,
)
YAML_FILES = st.one_of(
    st.binary(max_size=120),
    st.text(max_size=200).map(str.encode),
    st.dictionaries(
        st.sampled_from(["train", "rollout", "env", "sampling", "context", "backend", "objective", "skills", "model",
                         "seed", "bogus"]),
        st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(["lr", "steps", "id", "name", "args", "k", "kind", "mode",
                                                                "x"]),
                                               JSON_VALUES, max_size=3)),
        max_size=4,
    ).map(lambda d: yaml.safe_dump(d, allow_unicode=False).encode()),
    st.lists(YAML_VALUES, max_size=4).map(lambda lines: "\n".join(f"train:\n  lr: {v}" for v in lines).encode()),
)


def load_or_refuse(path: Path | None, overrides: list[str]):
    """A TrainConfig, or an AgentkitError the CLI prints: ConfigError, or UnknownNameError /
    PluginError (with did-you-mean) for names. File problems name the file, YAML ones the line."""
    from agentkit.train.config import TrainConfig, load_config

    before = path.read_bytes() if path else None
    try:
        config = load_config(path, overrides)
    except (ConfigError, UnknownNameError, PluginError) as err:
        message = str(err)
        assert message.strip() and "Traceback" not in message
        causes = []
        while err.__cause__ is not None:
            err = err.__cause__
            causes.append(err)
        if path is not None and any(isinstance(c, (yaml.YAMLError, UnicodeError, RecursionError)) for c in causes) \
                and not message.startswith("--set"):
            assert re.match(rf"{re.escape(str(path))}(:\d+)*: ", message), message
        config = None
    else:
        assert isinstance(config, TrainConfig)
    if path is not None:
        assert path.read_bytes() == before
    return config


@FUZZ
@given(YAML_FILES, OVERRIDES)
def test_config_loader_fuzz(scratch, text, overrides):
    path = scratch / "config.yaml"
    path.write_bytes(text)
    load_or_refuse(path, overrides)


@FUZZ
@given(OVERRIDES)
def test_config_overrides_fuzz(overrides):
    load_or_refuse(None, overrides)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"train:\n  lr: [\n", r":3:1: invalid YAML: while parsing a flow"),
        (b"train:\n  lr: 1\n\tsteps: 2\n", r":3:1: invalid YAML: .*'\\t'"),
        (b"train:\n  lr: 2001-13-45\n", r":2:7: invalid YAML: cannot read '2001-13-45'.*quote it"),
        (b"train: {lr: 0.1}\nseed: " + b"1" * 5_000 + b"\n", r":2:7: invalid YAML: cannot read"),
        (b"env:\n  id: caf\xe9\n", r":2: config is not UTF-8 text"),
        (b"- " * 3_000 + b"x\n", r": YAML nested too deeply"),
        (b"? [a]\n: 1\n", r":1:3: invalid YAML: .*unhashable key"),
    ],
    ids=["unclosed-list", "tab", "bad-date", "huge-int", "latin-1", "deep", "unhashable-key"],
)
def test_bad_config_file_names_file_and_line(tmp_path, text, message):
    from agentkit.train.config import load_config

    path = tmp_path / "config.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError, match=re.escape(str(path)) + message):
        load_config(path)
    assert path.read_bytes() == text


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("train.lr=[", r"--set 'train.lr=\[': the value is not valid YAML .*Quote it"),
        ("train.lr=2001-13-45", r"not valid YAML \(cannot read '2001-13-45'"),
        ("seed=" + "[" * 600, r"not valid YAML"),
        ("train.lr", r"--set expects section.key=value"),
        ("backend=7", r"backend: training samples with the weights it trains: hf or vllm \(--backend\)"),  # backend=vllm is short for its kind
    ],
    ids=["unclosed", "bad-date", "deep", "no-equals", "backend-not-a-section"],
)
def test_bad_override_is_a_config_error(item, message):
    from agentkit.train.config import load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, [item])


@functools.cache
def rollout_keys() -> list[str]:
    from agentkit.rollout.config import RolloutConfig

    return dotted_keys(RolloutConfig)


@FUZZ
@given(st.dictionaries(st.one_of(st.deferred(lambda: st.sampled_from(rollout_keys())),
                                 st.sampled_from(["bogus", "env-kwargs", "env.bogus", ""])), MUTANTS, max_size=5),
       st.lists(st.one_of(st.text(max_size=16), st.tuples(st.text(max_size=6), YAML_VALUES).map("=".join)), max_size=3))
def test_rollout_config_fuzz(values, env_kwargs):
    """``agentkit rollout`` builds its config from the flags (by ``--set`` key) and the
    ``--env-kwargs KEY=VALUE`` words, read as the command line reads them."""
    import argparse

    from agentkit.rollout.config import RolloutConfig

    flags = argparse.Namespace(**({"setting:env.kwargs": env_kwargs} if env_kwargs else {}))
    try:
        config = load_settings(RolloutConfig, None, None, {**values, **settings_from_args(flags, RolloutConfig)},
                               what="rollout settings")
    except ConfigError as err:
        assert str(err).strip()
        assert str(err).startswith(("Invalid rollout settings:", "--env-kwargs")), str(err)
    else:
        assert isinstance(config, RolloutConfig)


def test_parse_assignment_reads_yaml_values():
    assert parse_assignment("train.lr=0.5") == ("train.lr", 0.5)
    assert parse_assignment(" env.kwargs = {level: 3}") == ("env.kwargs", {"level": 3})
    assert parse_assignment('model="[not a list"') == ("model", "[not a list")
    assert parse_assignment("out=a=b") == ("out", "a=b")
    with pytest.raises(ConfigError, match=r"--env-kwargs expects key=value, got 'level' \(e.g. --env-kwargs level=10\)"):
        parse_assignment("level", flag="--env-kwargs", form="key=value", example="level=10")


# =============================================================================================
# checkpoints and model folders
# =============================================================================================


@pytest.fixture(scope="module")
def run_with_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """A run folder with one real checkpoint (tiny model, AdamW after one update)."""
    import torch
    from agentkit.rollout.hf_backend import load_causal_lm, load_tokenizer

    from agentkit.train.checkpoint import save_checkpoint
    from agentkit.train.config import dump_config, load_config

    run = tmp_path_factory.mktemp("run")
    model, tokenizer = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sum(p.sum() for p in model.parameters()).backward()
    optimizer.step()
    (run / "config.yaml").write_text(dump_config(load_config(None, [f"out={run}", f"model={tiny_model_dir}"])))
    save_checkpoint(run, 1, model, tokenizer, optimizer, {"step": 1})
    return run


def fresh_optimizer(folder: Path):
    import torch
    from agentkit.rollout.hf_backend import load_causal_lm

    return torch.optim.AdamW(load_causal_lm(folder).parameters(), lr=1e-3)


def test_checkpoint_loads_when_whole(run_with_checkpoint, tiny_model_dir):
    from agentkit.train.checkpoint import load_training_state

    state = load_training_state(run_with_checkpoint / "checkpoints" / "step-1", fresh_optimizer(tiny_model_dir))
    assert state == {"step": 1}


def checkpoint_files(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints" / "step-1").iterdir())


def test_checkpoint_missing_each_file_is_refused_naming_folder_and_file(run_with_checkpoint, tiny_model_dir, tmp_path):
    from agentkit.train import prepare_run
    from agentkit.train.checkpoint import MARKER, check_complete, load_training_state
    from agentkit.train.config import load_config

    optimizer = fresh_optimizer(tiny_model_dir)
    names = checkpoint_files(run_with_checkpoint)
    assert {"model.safetensors", "optimizer.safetensors", "state.json", "tokenizer.json", MARKER} <= set(names)
    for name in names:
        run = tmp_path / name
        shutil.copytree(run_with_checkpoint, run)
        folder = run / "checkpoints" / "step-1"
        (folder / name).unlink()
        before = snapshot(run)
        named = rf"{re.escape(str(folder))}.*{re.escape(name)}"
        for load in (check_complete, lambda f: load_training_state(f, optimizer)):
            with pytest.raises(ConfigError, match=named):
                load(folder)
        # --resume: a checkpoint without its marker was never complete, and there is no other
        resume = r"no complete checkpoint" if name == MARKER else named
        with pytest.raises(ConfigError, match=resume):
            prepare_run(load_config(None, [f"out={run}"]), resume=True)
        assert snapshot(run) == before, f"a refused resume changed the run folder ({name} missing)"


@pytest.mark.parametrize("name", ["state.json", "optimizer.json", "optimizer.safetensors", "rng.safetensors"])
def test_checkpoint_corrupted_file_is_refused_naming_it(run_with_checkpoint, tiny_model_dir, tmp_path, name):
    """Damage that keeps the file's size: the marker's SHA-256 tells; under an older agentkit's marker
    (sizes only), reading the file tells."""
    from agentkit.train.checkpoint import MARKER, load_training_state

    run = tmp_path / "run"
    shutil.copytree(run_with_checkpoint, run)
    path = run / "checkpoints" / "step-1" / name
    size = path.stat().st_size
    path.write_bytes(b"\xff" * size)
    before = snapshot(run)
    with pytest.raises(ConfigError, match=rf"step-1 is damaged: {re.escape(name)} changed since it was written \(same size"):
        load_training_state(path.parent, fresh_optimizer(tiny_model_dir))
    assert snapshot(run) == before
    marker = path.parent / MARKER
    marker.write_text(json.dumps({file: entry["size"] for file, entry in json.loads(marker.read_text()).items()}))
    before = snapshot(run)
    with pytest.raises(ConfigError, match=rf"step-1: cannot restore from .*{re.escape(name)}"):
        load_training_state(path.parent, fresh_optimizer(tiny_model_dir))
    assert snapshot(run) == before


# the files a model folder cannot work without; the rest are optional
MODEL_REQUIRED = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def test_model_folder_missing_each_file(tiny_model_dir, tmp_path):
    """--model DIR: a missing file is a ModelError naming the folder; an optional one changes nothing."""
    from agentkit.rollout.hf_backend import load_causal_lm, load_tokenizer

    intact = load_tokenizer(tiny_model_dir)
    names = sorted(p.name for p in tiny_model_dir.iterdir())
    assert MODEL_REQUIRED < set(names)
    for name in names:
        folder = tmp_path / name
        shutil.copytree(tiny_model_dir, folder)
        (folder / name).unlink()
        before = snapshot(folder)
        if name in MODEL_REQUIRED:
            with pytest.raises(ModelError, match=re.escape(str(folder))):
                load_tokenizer(folder)
                load_causal_lm(folder)
        else:
            tokenizer = load_tokenizer(folder)
            assert (tokenizer.eos_token, tokenizer.pad_token) == (intact.eos_token, intact.pad_token), name
            load_causal_lm(folder)
        assert snapshot(folder) == before


def test_model_folder_with_truncated_weights(tiny_model_dir, tmp_path):
    from agentkit.rollout.hf_backend import load_causal_lm

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelError, match=re.escape(str(folder))):
        load_causal_lm(folder)


# =============================================================================================
# skill banks
# =============================================================================================

GOOD_SKILL = "- id: a\n  title: Look first\n  text: Look before you act.\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("skills:\n" + GOOD_SKILL + "- id: b\n  title: t\n  text: x\n  keywords:\n  - on\n",
         r"skill #2 \('b'\): keywords.0: Input should be a valid string \(line 9\)"),
        ("skills:\n" + GOOD_SKILL + "- id: b\n  title: Only a title\n", r"skill #2 \('b'\): text: Field required \(line 5\)"),
        ("skills:\n" + GOOD_SKILL + "- id: b\n  title: t\n  text: ''\n", r"skill #2 \('b'\): text: .*at least 1 character \(line 7\)"),
        ("skills:\n" + GOOD_SKILL + GOOD_SKILL, r"skill #2 \('a'\): id 'a' appears twice \(line 5\)"),
        ("skills:\n" + GOOD_SKILL + "  txt: typo\n", r"skill #1 \('a'\): txt: Extra inputs are not permitted \(line 5\)"),
        ("skills:\n" + GOOD_SKILL + "  stats: {uses: -2}\n", r"stats.uses: .*greater than or equal to 0 \(line 5\)"),
        ("skills:\n" + GOOD_SKILL + "- just a string\n", r"skill #2: the skill: Input should be a valid dictionary.* \(line 5\)"),
        ("skills:\n" + GOOD_SKILL + "- id: b c\n  title: t\n  text: x\n", r"skill #2 \('b c'\): id: .*only letters, digits .*\(line 5\)"),
        ("episodes: lots\nskills:\n" + GOOD_SKILL, r"'episodes' must be a non-negative integer.*got 'lots' \(line 1\)"),
        ("skills:\n" + GOOD_SKILL + "extra: 1\n", r"unknown top-level keys \['extra'\] \(line 5\)"),
        ("skills:\n" + GOOD_SKILL + "  title: 2001-13-45\n", r":5:10: invalid YAML: cannot read '2001-13-45'"),
        ("skills: [\n", r":2:1: invalid YAML"),
        ("skills: 3\n", r"must be a mapping with a 'skills' list"),
    ],
    ids=["wrong-type", "missing-text", "empty-text", "duplicate-id", "unknown-key", "bad-stats", "not-a-mapping",
         "bad-id", "bad-episodes", "unknown-top-level", "bad-date", "bad-yaml", "skills-not-a-list"],
)
def test_bad_skill_bank_names_file_skill_and_line(tmp_path, text, message):
    from agentkit.skillbank import SkillBank, SkillBankError

    path = tmp_path / "bank.yaml"
    path.write_text(text)
    with pytest.raises(SkillBankError, match=re.escape(str(path)) + r".*" + message):
        SkillBank.load(path)
    assert path.read_text() == text, "a failed load changed the bank file"


def test_bad_json_skill_bank_names_file_and_line(tmp_path):
    from agentkit.skillbank import SkillBank, SkillBankError

    path = tmp_path / "bank.json"
    path.write_text('{"skills": [\n  {"id": "a", "title": "t", "text": "x"},\n  {"id": "a",\n')
    with pytest.raises(SkillBankError, match=re.escape(str(path)) + r":4:1: not valid JSON"):
        SkillBank.load(path)
    path.write_text('{"skills": [{"id": "a", "title": "t", "text": "x"}], "episodes": ' + "9" * 5_000 + "}")
    with pytest.raises(SkillBankError, match=re.escape(str(path))):
        SkillBank.load(path)
    path.write_bytes(b'{"skills": [{"id": "a", "title": "caf\xe9", "text": "x"}]}')
    with pytest.raises(SkillBankError, match=re.escape(str(path)) + r".*not UTF-8"):
        SkillBank.load(path)


@FUZZ
@given(st.text(max_size=200))
def test_skill_bank_fuzz_arbitrary_yaml(scratch, text):
    from agentkit.skillbank import SkillBank, SkillBankError

    path = scratch / "fuzz-bank.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    before = path.read_bytes()
    try:
        bank = SkillBank.load(path)
    except SkillBankError as err:
        assert str(path) in str(err)
    else:
        assert all(skill.text for skill in bank)
    assert path.read_bytes() == before
