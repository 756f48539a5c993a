"""Command-line parsing for recipe configs: every field of a frozen config dataclass becomes a ``--flag``
whose help is the field's ``help`` metadata and default; bad values fail fast naming the field."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

ConfigT = TypeVar("ConfigT")


def option(default: Any, help: str, **kwargs: Any) -> Any:
    """A config field with its documentation (shown by ``--help``)."""
    return dataclasses.field(default=default, metadata={"help": help}, **kwargs)


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _converter(annotation: Any) -> tuple[Any, tuple[Any, ...] | None]:
    """(type converter, choices) for a field annotation."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _converter(args[0])
    if annotation is bool:
        return _parse_bool, None
    if annotation in (int, float, str, Path):
        return annotation, None
    if origin is tuple:
        item = typing.get_args(annotation)[0]
        return (lambda text: tuple(item(part) for part in text.split(",") if part)), None
    return str, None


def parse_config(config_class: type[ConfigT], argv: Sequence[str] | None = None, *, description: str = "") -> ConfigT:
    """Build ``config_class`` from ``--field value`` arguments (dashes or underscores)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        convert, choices = _converter(hints[field.name])
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            dest=field.name,
            type=convert,
            choices=choices,
            default=dataclasses.MISSING,
            help=f"{field.metadata.get('help', '')} (default: {shown})",
        )
    parsed = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not dataclasses.MISSING}
    try:
        return config_class(**parsed)
    except ValueError as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits


def config_to_json(config: Any) -> str:
    """A config as indented JSON (paths and tuples made plain)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return json.dumps(plain(config), indent=2, sort_keys=True)
