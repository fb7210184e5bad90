"""Trajectory schema, crash-safe JSONL, plugin lookup."""

from __future__ import annotations

import json

import pytest

from agentkit.core.errors import OutputExistsError, PluginError, TrajectoryFormatError, UnknownNameError
from agentkit.core.jsonl import TornLineWarning, TrajectoryWriter, read_trajectories
from agentkit.core.plugins import PluginRegistry, PluginSpec
from agentkit.core.trajectory import SCHEMA_VERSION, Trajectory, Turn


def make_trajectory(i: int = 0, turns: int = 2) -> Trajectory:
    return Trajectory(
        id=f"g{i}|0", env="demo", task="open the lock", seed=i, split="train", group=f"g{i}", sample=0,
        turns=[
            Turn(observation=f"obs {t}", context_ids=[1, 2, 3], response_ids=[4, 5], response_logprobs=[-0.5, -1.25],
                 response_text="<action>look</action>", action="look", action_valid=True, reward=0.5, feedback="ok")
            for t in range(turns)
        ],
        episode_return=1.0, won=True, score=1.0, terminated=True, truncated=False, model="tiny",
        sampling={"temperature": 1.0},
    )


def test_roundtrip_uses_documented_field_names(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(make_trajectory(0))
        w.write(make_trajectory(1))
    record = json.loads(path.read_text().splitlines()[0])
    for key in ("id", "env", "task", "seed", "group", "turns", "return", "won", "model", "sampling", "schema_version"):
        assert key in record
    for key in ("observation", "context_ids", "response_ids", "response_logprobs", "response_text", "action",
                "action_valid", "reward", "feedback"):
        assert key in record["turns"][0]
    assert read_trajectories(path) == [make_trajectory(0), make_trajectory(1)]


def test_per_turn_privileged_text_roundtrips_and_older_files_still_load(tmp_path):
    from dataclasses import replace

    plain = make_trajectory(0)
    record = plain.to_dict()
    assert all("privileged" not in turn for turn in record["turns"])  # unset: not written (older readers)
    assert Trajectory.from_dict(record) == plain
    turns = [replace(turn, privileged=f"Expert plan from here: step {t}") for t, turn in enumerate(plain.turns)]
    planned = replace(plain, privileged="Expert plan from here: step 0", turns=turns)
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(planned)
    assert json.loads(path.read_text())["turns"][1]["privileged"] == "Expert plan from here: step 1"
    assert read_trajectories(path) == [planned]
    record["turns"][0]["privileged"] = ["go west"]
    with pytest.raises(TrajectoryFormatError, match="turn 0: field 'privileged' has type list; expected str or null"):
        Trajectory.from_dict(record)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("turns"), "missing required field 'turns'"),
        (lambda r: r.update(seed="3"), "field 'seed' has type str"),
        (lambda r: r.update(won=1), "field 'won' has type int"),
        (lambda r: r.update(bogus=1), "unknown field"),
        (lambda r: r["turns"][0].update(response_logprobs=[-1.0]), "2 response_ids but 1 response_logprobs"),
        (lambda r: r["turns"][0].update(response_ids=[1, -2]), "non-negative integers"),
        (lambda r: r.update(schema_version=SCHEMA_VERSION + 1), "newer than this agentkit"),
        (lambda r: r.update(context_mode="tree"), "context_mode must be"),
    ],
)
def test_validation_names_file_line_and_problem(tmp_path, mutate, message):
    good = make_trajectory(0).to_dict()
    bad = make_trajectory(1).to_dict()
    mutate(bad)
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(TrajectoryFormatError, match=message) as info:
        read_trajectories(path)
    assert f"{path}:2" in str(info.value)


def test_torn_last_line_is_reported_not_merged(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(make_trajectory(0))
    whole = path.read_bytes()
    line = json.dumps(make_trajectory(1).to_dict()).encode()
    path.write_bytes(whole + line[: len(line) // 2])  # a crash mid-write

    with pytest.warns(TornLineWarning, match="torn last line"):
        assert read_trajectories(path) == [make_trajectory(0)]
    with pytest.raises(TrajectoryFormatError, match="torn last line"):
        read_trajectories(path, strict=True)

    with pytest.warns(TornLineWarning, match="moved it to"):
        writer = TrajectoryWriter(path, mode="append")
    writer.write(make_trajectory(2))
    writer.close()
    assert read_trajectories(path, strict=True) == [make_trajectory(0), make_trajectory(2)]
    assert (tmp_path / "t.jsonl.torn").read_bytes().strip() == line[: len(line) // 2].strip()


def test_corrupt_middle_line_raises_with_line_number(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(make_trajectory(0).to_dict()) + "\n{not json\n" + json.dumps(make_trajectory(1).to_dict()) + "\n")
    with pytest.raises(TrajectoryFormatError, match=r"t\.jsonl:2: not valid JSON"):
        read_trajectories(path)


def test_writer_refuses_existing_file_and_keeps_it(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(make_trajectory(0))
    before = path.read_bytes()
    with pytest.raises(OutputExistsError, match="--append .* --overwrite"):
        TrajectoryWriter(path)
    assert path.read_bytes() == before


def test_overwrite_replaces_only_when_complete(tmp_path):
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as w:
        w.write(make_trajectory(0))
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with TrajectoryWriter(path, mode="overwrite") as w:
            w.write(make_trajectory(1))
            raise RuntimeError("crash mid-run")
    assert path.read_bytes() == before  # the old file survives an interrupted overwrite
    with TrajectoryWriter(path, mode="overwrite") as w:
        w.write(make_trajectory(1))
    assert read_trajectories(path) == [make_trajectory(1)]


def test_registry_did_you_mean_and_escape_hatch():
    reg = PluginRegistry("agentkit.test-group", "widget")
    reg.register(PluginSpec("textworld/simple-v0", "json:dumps"))
    with pytest.raises(UnknownNameError, match=r"Did you mean 'textworld/simple-v0'"):
        reg.spec("textworld/simpel-v0")
    spec, obj = reg.load("json:loads")
    assert obj is json.loads
    with pytest.raises(PluginError, match="no attribute 'nope'"):
        reg.load("json:nope")
    with pytest.raises(PluginError, match="already registered"):
        reg.register(PluginSpec("textworld/simple-v0", "json:loads"))


def test_missing_extra_gives_install_hint(tmp_path, monkeypatch):
    from agentkit.core.errors import MissingDependencyError

    (tmp_path / "fancy_adapter.py").write_text("import some_heavy_sim_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = PluginRegistry("agentkit.test-group", "environment")
    reg.register(PluginSpec("fancy/env-v0", "fancy_adapter:Env", extra="fancy"))
    with pytest.raises(MissingDependencyError, match=r"needs the package 'some_heavy_sim_package_xyz'.*pip install 'agentkit\[fancy\]'"):
        reg.load("fancy/env-v0")
