"""Trajectories as Hugging Face datasets, both ways.

``to_dataset`` turns trajectories into a ``datasets.Dataset`` with one row per episode. The turns stay
nested: a list of structs with the token ids as int lists and the logprobs as float64, so nothing is
rounded. The columns come from the trajectory schema (``agentkit.core.trajectory``). ``sampling``,
a free-form dict, is kept as its JSON text. ``from_dataset`` rebuilds the trajectories through the
schema's own validation, so a dataset from elsewhere is checked like a JSONL file.

``export`` writes a run folder's or a JSONL file's trajectories as Parquet
(``load_dataset("parquet", data_files=...)`` reads it) or as a ``save_to_disk`` folder
(``datasets.load_from_disk``). ``read_source`` reads any of the three back, which is how
``train.demos`` takes a dataset. Needs the ``datasets`` extra; only this module imports it.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from agentkit.core import runs
from agentkit.core.errors import ConfigError, MissingDependencyError, TrajectoryFormatError
from agentkit.core.jsonl import read_trajectories, step_files
from agentkit.core.trajectory import JSON_KEY, OMIT_NONE, Trajectory, Turn

FORMATS = ("parquet", "hf")
PARQUET_FILE = "trajectories.parquet"
JSON_COLUMNS = ("sampling",)  # free-form dicts, stored as their JSON text


def _datasets():
    try:
        import datasets
    except ImportError as err:
        raise MissingDependencyError("trajectories as datasets need the datasets package: "
                                     "pip install -e '.[datasets]'") from err
    datasets.disable_progress_bars()  # the commands print their own one line
    return datasets


def _feature(hint: Any, datasets) -> Any:
    """The Arrow type of one schema field (None allowed everywhere: Arrow columns are nullable)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _feature(inner, datasets)
    if typing.get_origin(hint) is Literal or hint is str:
        return datasets.Value("string")
    if typing.get_origin(hint) is list:
        (inner,) = typing.get_args(hint)
        return datasets.List(_feature(inner, datasets))
    scalar = {bool: "bool", int: "int64", float: "float64"}.get(hint)
    if scalar is None:
        raise TypeError(f"no dataset column type for the schema type {hint!r}")
    return datasets.Value(scalar)


def features():
    """The dataset columns of a trajectory, read off the schema's dataclasses."""
    datasets = _datasets()

    def record(datacls: type) -> dict[str, Any]:
        hints = typing.get_type_hints(datacls)
        columns = {}
        for f in datacls.__dataclass_fields__.values():
            key = f.metadata.get(JSON_KEY, f.name)
            if f.name in JSON_COLUMNS:
                columns[key] = datasets.Value("string")
            elif f.name == "turns":
                columns[key] = datasets.List(record(Turn))
            else:
                columns[key] = _feature(hints[f.name], datasets)
        return columns

    return datasets.Features(record(Trajectory))


def _row(trajectory: Trajectory, columns: Iterable[str], turn_columns: Iterable[str]) -> dict[str, Any]:
    record = trajectory.to_dict()
    row = {key: record.get(key) for key in columns}
    row["turns"] = [{key: turn.get(key) for key in turn_columns} for turn in record["turns"]]
    for key in JSON_COLUMNS:
        row[key] = json.dumps(row[key], sort_keys=True)
    return row


def to_dataset(trajectories: Sequence[Trajectory]):
    """One row per trajectory, the turns nested (``features()``)."""
    datasets = _datasets()
    schema = features()
    turn_columns = list(schema["turns"].feature)
    rows = [_row(t, schema, turn_columns) for t in trajectories]
    return datasets.Dataset.from_list(rows, features=schema)


def _omitted(datacls: type) -> frozenset[str]:
    """The fields a JSON record leaves out when None (a column holds None for them instead)."""
    return frozenset(f.name for f in datacls.__dataclass_fields__.values() if f.metadata.get(OMIT_NONE))


def _record(row: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as the JSON record ``Trajectory.from_dict`` reads: the None of a field written
    only when set left out (other None values, such as an unparsed turn's action, are the record's),
    the JSON columns parsed."""
    omitted, turn_omitted = _omitted(Trajectory), _omitted(Turn)
    record = {key: value for key, value in row.items() if not (value is None and key in omitted)}
    for key in JSON_COLUMNS:
        if isinstance(record.get(key), str):
            try:
                record[key] = json.loads(record[key])
            except ValueError as err:
                raise TrajectoryFormatError(f"column {key!r} must hold JSON text: {err}") from err
    if isinstance(record.get("turns"), list):
        record["turns"] = [{k: v for k, v in turn.items() if not (v is None and k in turn_omitted)}
                           if isinstance(turn, dict) else turn for turn in record["turns"]]
    return record


def from_dataset(dataset, *, where: str = "dataset") -> list[Trajectory]:
    """The trajectories of a dataset of ``to_dataset``'s columns, each validated like a JSONL line."""
    return [Trajectory.from_dict(_record(row), where=f"{where} row {index}") for index, row in enumerate(dataset)]


def source_trajectories(source: str | Path) -> list[Trajectory]:
    """The trajectories of a run folder (every ``trajectories/step-N.jsonl``, in step order) or of a
    JSONL file."""
    path = Path(source)
    if path.is_dir():
        steps = [file for _, file in step_files(runs.trajectories_dir(path))]
        if not steps:
            raise ConfigError(f"{path} holds no trajectories/step-N.jsonl files: give a training run folder or a "
                              "trajectory JSONL file (agentkit rollout --out FILE).")
        return [t for step in steps for t in read_trajectories(step)]
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: give a training run folder or a trajectory JSONL file.")
    return read_trajectories(path)


def export(source: str | Path, to: str, out: str | Path) -> tuple[Path, int]:
    """Write ``source``'s trajectories to the folder ``out`` as Parquet (``to="parquet"``: one file,
    ``PARQUET_FILE``) or as a ``save_to_disk`` dataset (``to="hf"``); returns (what was written, rows).
    A non-empty ``out`` is refused, so nothing already there is replaced."""
    if to not in FORMATS:
        raise ConfigError(f"--to must be one of {', '.join(FORMATS)}, got {to!r}.")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} already exists and is not an empty folder; give a new folder for the dataset.")
    dataset = to_dataset(source_trajectories(source))
    if to == "hf":
        dataset.save_to_disk(str(out))
        return out, len(dataset)
    out.mkdir(parents=True, exist_ok=True)
    dataset.to_parquet(str(out / PARQUET_FILE))
    return out / PARQUET_FILE, len(dataset)


def is_dataset(path: str | Path) -> bool:
    """``path`` is a dataset rather than a JSONL file: a Parquet file, a ``save_to_disk`` folder, or
    a folder of Parquet files."""
    path = Path(path)
    if path.is_file():
        return path.suffix == ".parquet"
    return path.is_dir() and ((path / "dataset_info.json").is_file() or any(path.glob("*.parquet")))


def read_source(source: str | Path) -> list[Trajectory]:
    """Trajectories from a JSONL file, a ``save_to_disk`` folder, a Parquet file, or a folder of
    Parquet files (what ``export`` writes, or a dataset with its columns from elsewhere)."""
    path = Path(source)
    if path.is_file() and not is_dataset(path):
        return read_trajectories(path)
    if path.is_dir() and (path / "dataset_info.json").is_file():
        return from_dataset(_datasets().load_from_disk(str(path)), where=str(path))
    files = [path] if path.is_file() else sorted(path.glob("*.parquet")) if path.is_dir() else []
    if not files:
        raise ConfigError(f"{path} is neither a trajectory JSONL file nor a dataset (a save_to_disk folder, a "
                          "Parquet file or a folder of them): write one with agentkit demos or agentkit export.")
    loaded = _datasets().load_dataset("parquet", data_files=[str(f) for f in files], split="train")
    return from_dataset(loaded, where=str(path))
