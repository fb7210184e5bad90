"""Typed configs at the command line: each pydantic field becomes a flag whose help is the field's
description, so the docs live in one place (the config class)."""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

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
