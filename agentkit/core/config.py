"""Typed configs at the command line: each pydantic field becomes a flag whose help is the field's
description, so the docs live in one place (the config class). Also the one way agentkit reads YAML
(config files, skill banks, ``--set KEY=VALUE``): every failure is a ConfigError naming the file and line."""

from __future__ import annotations

import argparse
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from agentkit.core.errors import ConfigError


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], *, skip: set[str] = frozenset()) -> None:
    """Add one flag per field of ``model``; defaults stay unset so the config's own apply."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        annotation = field.annotation
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin in (types.UnionType, typing.Union) and len(args) == 1:
            annotation, origin = args[0], typing.get_origin(args[0])
        default = None if field.default is None or field.is_required() or field.default_factory else field.default
        help_text = (field.description or "") + (f" (default: {default})" if default not in (None, "") else "")
        kwargs: dict[str, Any] = {"help": help_text, "default": argparse.SUPPRESS, "dest": name}
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif origin is Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
        elif annotation in (int, float, str):
            kwargs["type"] = annotation
            kwargs["metavar"] = name.split("_")[-1].upper()
        elif origin in (list, tuple):
            kwargs["nargs"] = "*"
        elif origin is dict:
            kwargs["type"] = _json_object
            kwargs["metavar"] = "JSON"
        parser.add_argument(_flag(name), **kwargs)


def _json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err.msg} at character {err.pos}): {text!r}; "
                                         'write an object such as \'{"dtype": "float32"}\'') from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object ({{...}}), got {text!r}")
    return value


def build_config(model: type[BaseModel], values: dict[str, Any]):
    """Validate ``values`` into ``model``; any problem becomes a ConfigError naming the flag."""
    try:
        return model(**values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "config"
            flag = _flag(str(e["loc"][0])) if e["loc"] else "config"
            problems.append(f"{flag} ({loc}): {e['msg']}")
        raise ConfigError("Invalid settings:\n  " + "\n  ".join(problems)) from err


# -- YAML ---------------------------------------------------------------------------------------
class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose scalar failures carry a position like its syntax errors do."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # `2001-13-45` matches the timestamp pattern but is no date
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {node.value!r} ({err}); quote it to keep it as text", node.start_mark) from err


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)


def _problem(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError):
        return "; ".join(p for p in (err.context, err.problem) if p)
    return str(err)


def load_yaml(text: str, *, where: str) -> Any:
    """Parse YAML text (safe tags only); any problem is a ConfigError that starts with
    ``where:LINE:COLUMN`` when YAML knows the position."""
    try:
        return _yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        raise ConfigError(f"{at}: invalid YAML: {_problem(err)}.") from err
    except RecursionError as err:
        raise ConfigError(f"{where}: YAML nested too deeply to read; flatten it.") from err


def read_yaml(path: str | os.PathLike, *, what: str = "config") -> Any:
    """Read and parse a YAML file; every problem is a ConfigError naming the file (and the line)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"Cannot read {what} {path}: {err.strerror or err}.") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}:{line}: {what} is not UTF-8 text (byte {raw[err.start]:#04x} at offset {err.start}); "
                          "save it as UTF-8.") from err
    return load_yaml(text, where=str(path))


def parse_assignment(item: str, *, flag: str = "--set", form: str = "section.key=value",
                     example: str = "train.lr=1e-5") -> tuple[str, Any]:
    """Split ``KEY=VALUE`` and read VALUE as YAML (``0.5``, ``true``, ``[a, b]``, ``{k: v}``)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"{flag} expects {form}, got {item!r} (e.g. {flag} {example}).")
    try:
        return key, _yaml(raw)
    except (yaml.YAMLError, RecursionError) as err:
        problem = _problem(err) if isinstance(err, yaml.YAMLError) else "nested too deeply"
        hint = "" if "quote it" in problem else f" Quote it to pass it as text: {flag} {key}='\"...\"'."
        shown = item if len(item) <= 200 else item[:200] + "..."
        raise ConfigError(f"{flag} {shown!r}: the value is not valid YAML ({problem}).{hint}") from err
