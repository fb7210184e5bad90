"""Typed settings at the command line: each leaf field of a settings model becomes a flag and a
``--set`` key whose help is the field's description, so the docs live in one place (the model). Also the one way agentkit reads YAML
(config files, skill banks, ``--set KEY=VALUE``): every failure is a ConfigError naming the file and line."""

from __future__ import annotations

import argparse
import os
import types
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from agentkit.core.errors import ConfigError, did_you_mean


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Setting:
    """One leaf setting of a settings model: its ``--set`` key, flag, type, default and help."""

    key: str  # dotted, e.g. "env.max_turns"
    flag: str  # e.g. "--max-turns"
    annotation: Any
    default: Any
    description: str
    choices: tuple[Any, ...] | None = None
    variant: str | None = None  # backend settings: the backend kind this option belongs to
    runtime: bool = False  # how a run is carried out, not what it computes (``settings.RUNTIME``)


def _unwrap_optional(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (types.UnionType, typing.Union) and len(args) == 1:
        return args[0]
    return annotation


def _submodel(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap_optional(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _union_variants(annotation: Any) -> list[type[BaseModel]]:
    """The models of a (tagged, discriminated) union of settings models, else []."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) not in (types.UnionType, typing.Union):
        return []
    variants = []
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) is typing.Annotated:
            arg = typing.get_args(arg)[0]
        if not (isinstance(arg, type) and issubclass(arg, BaseModel)):
            return []
        variants.append(arg)
    return variants


def _union_tags(model: type[BaseModel]) -> set[str]:
    """The tags (``kind``) of every discriminated union of settings models within ``model``."""
    tags: set[str] = set()
    for field in model.model_fields.values():
        if (sub := _submodel(field.annotation)) is not None:
            tags |= _union_tags(sub)
        for variant in _union_variants(field.annotation):
            tags.add(variant.model_fields["kind"].default)
            tags |= _union_tags(variant)
    return tags


def _default_of(field: FieldInfo) -> Any:
    return None if field.is_required() else field.get_default(call_default_factory=True)


def settings_of(model: type[BaseModel], prefix: str = "") -> list[Setting]:
    """Every leaf setting of ``model`` (nested models walked; a discriminated union of models, such
    as the backend, contributes its tag once and each variant's own options)."""
    rows: list[Setting] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if (sub := _submodel(field.annotation)) is not None:
            rows += settings_of(sub, f"{key}.")
            continue
        if variants := _union_variants(field.annotation):
            tag = variants[0].model_fields["kind"]
            tag_extra = tag.json_schema_extra if isinstance(tag.json_schema_extra, dict) else {}
            kinds = tuple(v.model_fields["kind"].default for v in variants)
            rows.append(Setting(f"{key}.kind", tag_extra.get("flag", _flag(name)), str, kinds[0],
                                tag.description or "", kinds))
            for variant, kind in zip(variants, kinds, strict=True):
                rows += [replace(row, variant=kind) for row in settings_of(variant, f"{key}.") if row.key != f"{key}.kind"]
            continue
        annotation = _unwrap_optional(field.annotation)
        choices = typing.get_args(annotation) if typing.get_origin(annotation) is Literal else None
        rows.append(Setting(key, extra.get("flag", _flag(name)), annotation, _default_of(field),
                            field.description or "", choices, runtime=bool(extra.get("runtime"))))
    return rows


def parse_pairs(values: list[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` words (values read as YAML), or one JSON object, into a dict."""
    if len(values) == 1 and values[0].lstrip().startswith("{"):
        return _json_object(values[0], flag)
    return dict(parse_assignment(v, flag=flag, form="key=value", example="level=3") for v in values)


def add_settings_arguments(parser: argparse.ArgumentParser, model: type[BaseModel], *,
                           skip: frozenset[str] = frozenset()) -> None:
    """One flag per leaf setting of ``model`` (``skip``: dotted keys without a flag). Defaults stay
    unset, so the model's own apply; ``settings_from_args`` reads back what was given."""
    for row in settings_of(model):
        if row.key in skip:
            continue
        shown = row.default if row.default not in (None, "", {}, []) else None
        help_text = row.description + (f" (default: {shown})" if shown is not None else "") + f" [{row.key}]"
        kwargs: dict[str, Any] = {"help": help_text.replace("%", "%%"), "default": argparse.SUPPRESS,
                                  "dest": "setting:" + row.key}
        origin = typing.get_origin(row.annotation)
        if row.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif row.choices is not None:
            kwargs["choices"] = list(row.choices)
        elif row.annotation in (int, float, str):
            kwargs["type"] = row.annotation
            kwargs["metavar"] = row.key.split(".")[-1].split("_")[-1].upper()
        elif origin in (list, tuple):
            kwargs["nargs"] = "*"
            item = typing.get_args(row.annotation)[:1]
            if item and typing.get_origin(item[0]) is Literal:  # the words it takes, as argparse shows choices
                kwargs["metavar"] = "{" + ",".join(map(str, typing.get_args(item[0]))) + "}"
        elif origin is dict or row.annotation is dict:
            kwargs["nargs"] = "+"
            kwargs["metavar"] = "KEY=VALUE"
        parser.add_argument(row.flag, **kwargs)


def settings_from_args(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The flags given on the command line as ``{dotted key: value}``."""
    rows = {row.key: row for row in settings_of(model)}
    given = {}
    for dest, value in vars(args).items():
        if not dest.startswith("setting:"):
            continue
        key = dest.removeprefix("setting:")
        row = rows[key]
        if typing.get_origin(row.annotation) is dict or row.annotation is dict:
            value = parse_pairs(value, row.flag)
        given[key] = value
    return given


def _json_object(text: str, flag: str) -> dict[str, Any]:
    import json

    fix = f"write {flag} KEY=VALUE [KEY=VALUE ...] or one JSON object such as '{{\"key\": 1}}'"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{flag} {text!r}: not JSON ({err.msg} at character {err.pos}); {fix}.") from err
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} {text!r}: not a JSON object; {fix}.")
    return value


MISSING = object()  # what ``get_dotted`` answers for a key a mapping does not hold


def get_dotted(data: Any, dotted: str) -> Any:
    """The value of dotted ``key`` in nested mappings (``env.kwargs.families`` too), or ``MISSING``."""
    for key in dotted.split("."):
        data = data.get(key, MISSING) if isinstance(data, dict) else MISSING
    return data


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {key!r} is not a section.")
    node[keys[-1]] = value


def _unknown_key_message(loc: tuple, model: type[BaseModel], renamed: dict[str, str]) -> str:
    dotted = ".".join(str(p) for p in loc)
    for old, new in renamed.items():
        if dotted == old or dotted.startswith(old + "."):
            return f"{dotted!r} is now {new + dotted[len(old):]!r}; rename it."
    node: Any = model
    path = []
    for part in loc:
        sub = _submodel(node) if node is not model else model
        if sub is None:
            variants = _union_variants(node)
            fields = {n for v in variants for n in v.model_fields}
            if variants and str(part) in fields:
                owners = [v.model_fields["kind"].default for v in variants if str(part) in v.model_fields]
                return f"{'.'.join([*path, str(part)])!r} is an option of backend {' / '.join(owners)}, not of the one chosen."
            if variants and str(part) in {v.model_fields["kind"].default for v in variants}:
                continue  # pydantic puts the union's tag in the location
            break
        fields = sub.model_fields
        if str(part) not in fields:
            return (f"unknown key {'.'.join([*path, str(part)])!r}.{did_you_mean(str(part), fields)} "
                    f"Known here: {sorted(fields)}")
        path.append(str(part))
        node = fields[str(part)].annotation
    return f"unknown key {dotted!r}"


def load_settings(model: type[BaseModel], path: str | os.PathLike | None = None, overrides: list[str] | None = None,
                  values: dict[str, Any] | None = None, *, renamed: dict[str, str] | None = None,
                  what: str = "settings", base: dict[str, Any] | None = None) -> Any:
    """Build ``model`` from ``base`` (dotted key -> value), then a YAML file, then ``--set
    key=value`` overrides, then ``values`` (the flags given, by dotted key). Every problem is one
    ConfigError that names the key and its flag."""
    data: dict[str, Any] = {}
    for key, value in (base or {}).items():
        set_dotted(data, key, value)
    if path is not None:
        loaded = read_yaml(path, what="config")  # problems name the file and line
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"Config {path} must be a YAML mapping of sections, got {type(loaded).__name__}.")
        _merge(data, loaded)
    for item in overrides or []:
        key, value = parse_assignment(item)
        set_dotted(data, key, value)
    for key, value in (values or {}).items():
        set_dotted(data, key, value)
    return validate_settings(model, data, renamed=renamed or {}, what=what)


def _merge(data: dict[str, Any], more: dict[str, Any]) -> None:
    """Merge ``more`` into ``data``, section by section."""
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            _merge(data[key], value)
        else:
            data[key] = value


def validate_settings(model: type[BaseModel], data: dict[str, Any], *, renamed: dict[str, str] | None = None,
                      what: str = "settings") -> Any:
    flags = {row.key: row.flag for row in settings_of(model)}
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems, tags = [], _union_tags(model)
        for e in err.errors():
            loc = tuple(p for p in e["loc"] if p not in tags)  # a union's tag is not a key of its section
            if e["type"] == "extra_forbidden":
                problems.append(_unknown_key_message(tuple(e["loc"]), model, renamed or {}))
                continue
            key = ".".join(str(p) for p in loc)
            message = e["msg"].removeprefix("Value error, ")
            if key in flags:
                problems.append(f"{flags[key]} ({key}): {message}")
            else:  # a check across a section's settings: its message names them
                problems.append(message if e["type"] == "value_error" or not key else f"{key}: {message}")
        raise ConfigError(f"Invalid {what}:\n  " + "\n  ".join(problems)) from err


def describe_settings(model: type[BaseModel], prefix: str = "", *, flags: bool = True) -> list[str]:
    """``key (flag, default): description`` for every leaf setting of ``model``."""
    lines = []
    for row in settings_of(model, prefix):
        owner = f"; backend {row.variant}" if row.variant else ""
        shown = f"{row.flag}, " if flags else ""
        lines.append(f"  {row.key} ({shown}default {row.default!r}{owner}): {row.description}")
    return lines


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
