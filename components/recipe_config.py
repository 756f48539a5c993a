"""Recipe configs on the command line and in files.

A recipe config is a frozen dataclass whose fields are plain values or *brick configs* (frozen dataclasses of
their own: engine, proxy, sandbox, trainer, algorithm, rollout, monitoring). ``parse_config`` turns it into one
flat, readable command line — one convention: a brick's field ``trainer.workers`` is ``--trainer-workers``
(a field may keep a shorter historical flag with ``option(..., flag="learning-rate")``) — and reads
``--config FILE`` (YAML or JSON, nested like the dataclasses: ``trainer: {workers: 2}``); flags given on the
command line override the file. ``--help`` lists every field, grouped by brick, with its meaning and default.
A bad value fails naming the field (``trainer.workers: must be > 0``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

ConfigT = TypeVar("ConfigT")


def option(default: Any, help: str, *, flag: str | None = None, **kwargs: Any) -> Any:
    """A config field with its documentation (shown by ``--help``). ``default`` may be a brick config (a
    dataclass instance); ``flag`` replaces the derived ``--prefix-name`` flag (for short historical flags)."""
    metadata = {"help": help, **({"flag": flag} if flag else {})}
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=lambda: default, metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


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


def _is_brick(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]  # ("trainer", "workers")
    flag: str  # "trainer-workers"
    annotation: Any
    default: Any
    help: str


def _field_default(field: dataclasses.Field) -> Any:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _leaves(config_class: type, path: tuple[str, ...] = (), brick_default: Any = None) -> list[_Leaf]:
    """Every plain field of ``config_class`` and of its brick configs, depth first, with its flag and default
    (a brick's defaults are those of the instance the recipe config gives it)."""
    hints = typing.get_type_hints(config_class)
    leaves = []
    for field in dataclasses.fields(config_class):
        if not field.init:
            continue
        value = getattr(brick_default, field.name) if brick_default is not None else _field_default(field)
        if _is_brick(hints[field.name]):
            leaves += _leaves(hints[field.name], (*path, field.name), value)
            continue
        flag = field.metadata.get("flag") or "-".join((*path, field.name)).replace("_", "-")
        leaves.append(
            _Leaf((*path, field.name), flag, hints[field.name], value, field.metadata.get("help", ""))
        )
    return leaves


def config_flags(config_class: type) -> dict[str, str]:
    """Every plain field of ``config_class`` and its bricks (dotted: ``trainer.workers``) → its command-line flag
    (``--trainer-workers``)."""
    return {".".join(leaf.path): f"--{leaf.flag}" for leaf in _leaves(config_class)}


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """A value read from a config file as the field's type (lists → tuples, str → Path, checked Literals)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value not in choices:
            raise ValueError(f"{where}: must be one of {list(choices)}, got {value!r}")
        return value
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        item_type = typing.get_args(annotation)[0]
        return tuple(item_type(item) for item in items)
    if annotation is bool and not isinstance(value, bool):
        return _parse_bool(str(value))
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is Path:
        return Path(value)
    if annotation in (int, float, str) and not isinstance(value, annotation):
        raise ValueError(f"{where}: expected {annotation.__name__}, got {value!r}")
    return value


def _build(
    config_class: type, overrides: Mapping[str, Any], path: tuple[str, ...] = (), base: Any = None
) -> Any:
    """``config_class`` (or ``base``, a brick's default) with ``overrides`` (nested dicts) applied; validation
    errors name the dotted field."""
    hints = typing.get_type_hints(config_class)
    fields = {f.name: f for f in dataclasses.fields(config_class) if f.init}
    changes: dict[str, Any] = {}
    for name, value in overrides.items():
        where = ".".join((*path, name))
        if name not in fields:
            raise ValueError(f"{where}: no such field (known: {sorted(fields)})")
        if _is_brick(hints[name]):
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}: expected a mapping of its fields, got {value!r}")
            brick_default = getattr(base, name) if base is not None else _field_default(fields[name])
            changes[name] = _build(hints[name], value, (*path, name), brick_default)
        else:
            changes[name] = _coerce(value, hints[name], where)
    try:
        return config_class(**changes) if base is None else dataclasses.replace(base, **changes)
    except ValueError as error:
        prefix = ".".join(path)
        raise ValueError(
            f"{prefix}.{error}" if prefix and not str(error).startswith(prefix) else str(error)
        ) from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML (``.yaml``/``.yml``) or JSON config file as nested dicts."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        loaded = yaml.safe_load(text) or {}
    else:
        loaded = json.loads(text)
    if not isinstance(loaded, dict):
        raise ValueError(f"config: {path} must hold a mapping of fields, got {type(loaded).__name__}")
    return loaded


def _merge(base: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        base = base.setdefault(key, {})
    base[path[-1]] = value


def parse_config(
    config_class: type[ConfigT], argv: Sequence[str] | None = None, *, description: str = ""
) -> ConfigT:
    """Build ``config_class`` from ``--config FILE`` and ``--flag value`` arguments (flags win over the file)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of fields (nested by brick); flags override it",
    )
    leaves = _leaves(config_class)
    hints = typing.get_type_hints(config_class)
    brick_help = {
        f.name: f.metadata.get("help", "")
        for f in dataclasses.fields(config_class)
        if _is_brick(hints[f.name])
    }
    groups: dict[str, Any] = {}
    for leaf in leaves:
        convert, choices = _converter(leaf.annotation)
        shown = ",".join(map(str, leaf.default)) if isinstance(leaf.default, tuple) else leaf.default
        brick = leaf.path[0] if len(leaf.path) > 1 else ""
        if brick not in groups:
            groups[brick] = (
                parser.add_argument_group(f"{brick} brick", description=brick_help.get(brick))
                if brick
                else parser
            )
        groups[brick].add_argument(
            f"--{leaf.flag}",
            dest="/".join(leaf.path),
            metavar=leaf.flag.upper().replace("-", "_") if choices is None else None,
            type=convert,
            choices=choices,
            default=dataclasses.MISSING,
            help=f"{leaf.help} (default: {shown})",
        )
    namespace = vars(parser.parse_args(argv))
    try:
        overrides: dict[str, Any] = (
            read_config_file(namespace.pop("config")) if namespace.get("config") else {}
        )
        namespace.pop("config", None)
        for dest, value in namespace.items():
            if value is not dataclasses.MISSING:
                _merge(overrides, tuple(dest.split("/")), value)
        return _build(config_class, overrides)
    except (ValueError, OSError) as error:
        parser.error(str(error))
        raise  # unreachable: parser.error exits


REDACTED = "***"
# Names of fields that hold credentials (api_key, sglang_admin_api_key, judge_api_key, admin_key, hf_token, ...):
# written as REDACTED, so RUN_DIR/config.json and the tracker's run config never carry a secret.
_SECRET_NAME = re.compile(
    r"(^|_)(key|token|secret|password|credentials?)$|api_key|secret|password", re.IGNORECASE
)


def config_to_json(config: Any) -> str:
    """A config as indented JSON (paths and tuples made plain; credentials ``REDACTED``, their names kept)."""

    def field(name: str, value: Any) -> Any:
        if _SECRET_NAME.search(name) and value not in (None, ""):  # unset stays visible: it is no secret
            return REDACTED
        return plain(value)

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: field(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {str(key): field(str(key), item) for key, item in value.items()}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return json.dumps(plain(config), indent=2, sort_keys=True)
