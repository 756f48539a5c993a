"""Recipe configs on the command line and in files.

A recipe config is a frozen dataclass whose fields are plain values or *brick configs* (frozen dataclasses of
their own: engine, proxy, sandbox, trainer, algorithm, rollout, monitoring). ``parse_config`` turns it into one
flat, readable command line — one convention: a brick's field ``trainer.use_gpu`` is ``--trainer-use-gpu``
(a field may keep a shorter historical flag with ``option(..., flag="learning-rate")``) — and reads
``--config FILE`` (YAML or JSON, nested like the dataclasses: ``trainer: {num_workers: 2}``); flags given on the
command line override the file. ``--help`` lists every field, grouped by brick, with its meaning and default.
A bool field's flag alone means true (``--agent-sampling``). A bad value fails naming the field
(``trainer.num_workers: must be > 0``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from components.config import option, slot

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from components.registry import Registry

__all__ = [
    "REDACTED",
    "command_line_flags",
    "config_flags",
    "config_to_json",
    "option",
    "parse_config",
    "read_config_file",
    "slot",
]

ConfigT = TypeVar("ConfigT", bound="DataclassInstance")


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _converter(annotation: object) -> tuple[Callable[[str], object], tuple[object, ...] | None]:
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


def _representable(annotation: object) -> bool:
    """Whether a value of this type can be typed on a command line (a callable or ``Any`` field cannot: it is
    set from Python only)."""
    origin = typing.get_origin(annotation)
    if origin is Literal or annotation in (bool, int, float, str, Path):
        return True
    if origin in (typing.Union, types.UnionType):
        return all(_representable(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    if origin is tuple:
        return all(arg in (int, float, str) or arg is Ellipsis for arg in typing.get_args(annotation))
    return False


def _is_brick(annotation: object) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _brick_class(annotation: object, value: object) -> type | None:
    """The config class of a brick field holding ``value``: its annotation when that is a dataclass; for a field
    typed by a Protocol, its value's class (``formats: TemplateFormats = option(TemplateFormatsConfig(), ...)``:
    the fields of ``TemplateFormatsConfig``); None for a plain field."""
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    is_protocol = isinstance(annotation, type) and getattr(annotation, "_is_protocol", False)
    if is_protocol and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value)
    return None


def _registry(field: dataclasses.Field, annotation: object = None) -> Registry | None:
    """The seam's registry of a slot: a ``slot(...)`` field, or a field typed by a seam's Protocol whose default
    is a registered kind (a recipe overriding a slot's default with ``option(LocalProxyConfig(), ...)``)."""
    if "registry" in field.metadata:
        return field.metadata["registry"]
    if annotation is None or _is_brick(annotation) or field.default_factory is dataclasses.MISSING:
        return None
    from components.registry import registry_of

    default = field.default_factory()
    if not callable(getattr(default, "build", None)):  # every registered kind builds its brick: none of them
        return None
    return registry_of(default)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    path: tuple[str, ...]  # ("trainer", "workers"); a slot's kind: ("engine", "kind")
    flags: tuple[str, ...]  # ("trainer-workers",): the derived flag first, then a historical one
    annotation: object
    default: object
    help: str
    choices: tuple[str, ...] | None = None  # a slot's registered kinds

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def _field_default(field: dataclasses.Field) -> object:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()


def _flags(path: tuple[str, ...], field: dataclasses.Field) -> tuple[str, ...]:
    """The derived flag, then the field's historical ones (``option(..., flag=...)``: one or a tuple)."""
    derived = "-".join(path).replace("_", "-")
    historical = field.metadata.get("flag") or ()
    historical = (historical,) if isinstance(historical, str) else tuple(historical)
    return (derived, *(flag for flag in historical if flag != derived))


def _leaves(
    config_class: type,
    path: tuple[str, ...] = (),
    brick_default: object = None,
    kinds: Mapping[tuple[str, ...], str] | None = None,
) -> list[_Leaf]:
    """Every plain field of ``config_class`` and of its brick configs, depth first, with its flags and default
    (a brick's defaults are those of the instance the recipe config gives it). A slot contributes its kind
    (``kinds[path]`` when given, else its default's) and the fields of that kind's config class."""
    kinds = kinds or {}
    hints = typing.get_type_hints(config_class)
    leaves = []
    for field in dataclasses.fields(config_class):
        if not field.init or "set_by" in field.metadata:
            continue
        value = getattr(brick_default, field.name) if brick_default is not None else _field_default(field)
        field_path = (*path, field.name)
        registry = _registry(field, hints[field.name])
        if registry is not None:
            default_kind = registry.name_of(value)
            kind = kinds.get(field_path, default_kind)
            kind_class = registry.get(kind)
            help = field.metadata.get("help", "")
            leaves.append(
                _Leaf(
                    (*field_path, "kind"),
                    _flags(field_path, field),
                    str,
                    default_kind,
                    help,
                    registry.kinds(),
                )
            )
            leaves += _leaves(kind_class, field_path, value if type(value) is kind_class else None, kinds)
            continue
        brick_class = _brick_class(hints[field.name], value)
        if brick_class is not None:
            leaves += _leaves(brick_class, field_path, value, kinds)
            continue
        if not _representable(hints[field.name]):
            continue
        leaves.append(
            _Leaf(
                field_path,
                _flags(field_path, field),
                hints[field.name],
                value,
                field.metadata.get("help", ""),
            )
        )
    return leaves


def config_flags(config_class: type, kinds: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every plain field of ``config_class`` and its bricks (dotted: ``trainer.use_gpu``; a slot's kind:
    ``engine.kind``) → its command-line flag (``--trainer-workers``; a field with historical flags: the first).
    ``kinds`` (slot path → kind, e.g. ``{"engine": "sglang"}``) lists another kind's fields than the default's."""
    by_path = {tuple(path.split(".")): kind for path, kind in (kinds or {}).items()}
    return {
        leaf.dotted: f"--{leaf.flags[min(1, len(leaf.flags) - 1)]}"
        for leaf in _leaves(config_class, kinds=by_path)
    }


def _coerce(value: object, annotation: object, where: str) -> object:
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
        if not isinstance(value, str | list | tuple):
            raise ValueError(f"{where}: expected a list or comma-separated items, got {value!r}")
        items = value.split(",") if isinstance(value, str) else value
        item_type = typing.get_args(annotation)[0]
        return tuple(item_type(item) for item in items)
    if annotation is bool and not isinstance(value, bool):
        return _parse_bool(str(value))
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is Path:
        if not isinstance(value, str | Path):
            raise ValueError(f"{where}: expected a path, got {value!r}")
        return Path(value)
    if annotation in (int, float, str) and not isinstance(value, annotation):
        raise ValueError(f"{where}: expected {annotation.__name__}, got {value!r}")
    return value


def command_line_flags(config_class: type, argv: Sequence[str] = ()) -> set[str]:
    """Every flag ``parse_config(config_class, argv)`` knows (besides ``--config``/``--help``): those of the
    slots' kinds ``argv`` picks (e.g. ``--engine sglang`` brings ``--sglang-url``), historical ones included."""
    kinds = _chosen_kinds(config_class, argv, {})
    return {f"--{flag}" for leaf in _leaves(config_class, kinds=kinds) for flag in leaf.flags}


def _kind_text(text: str) -> tuple[str, str | None]:
    """``KIND`` or ``KIND:VALUE`` (the short form of a kind's ``shorthand`` field: ``swebench:rows.parquet``)."""
    kind, separator, value = text.partition(":")
    return (kind, value) if separator else (text, None)


def _kind_choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    """argparse ``type`` of a slot's flag: a registered kind, or ``KIND:VALUE``."""

    def check(text: str) -> str:
        if _kind_text(text)[0] not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(map(repr, choices))})"
            )
        return text

    return check


def _kind_and_fields(value: object, where: str) -> tuple[str | None, dict[str, object]]:
    """A slot's overrides: ``KIND`` or ``{kind: KIND, field: ...}`` (kind optional)."""
    if isinstance(value, str):
        return value, {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected a kind or a mapping of its fields, got {value!r}")
    fields = dict(value)
    return fields.pop("kind", None), fields


def _build(
    config_class: type[ConfigT],
    overrides: Mapping[str, object],
    path: tuple[str, ...] = (),
    base: ConfigT | None = None,
) -> ConfigT:
    """``config_class`` (or ``base``, a brick's default) with ``overrides`` (nested dicts) applied; validation
    errors name the dotted field."""
    hints = typing.get_type_hints(config_class)
    fields = {f.name: f for f in dataclasses.fields(config_class) if f.init and "set_by" not in f.metadata}
    changes: dict[str, object] = {}
    for name, value in overrides.items():
        where = ".".join((*path, name))
        if name not in fields:
            raise ValueError(f"{where}: no such field (known: {sorted(fields)})")
        brick_default = getattr(base, name) if base is not None else _field_default(fields[name])
        registry = _registry(fields[name], hints[name])
        if registry is not None:
            kind, kind_fields = _kind_and_fields(value, where)
            shorthand = None
            if kind is not None:
                kind, shorthand = _kind_text(kind)
                if kind not in registry.kinds():
                    raise ValueError(f"{where}: must be one of {list(registry.kinds())}, got {kind!r}")
            kind_class = type(brick_default) if kind is None else registry.get(kind)
            if shorthand is not None:
                shorthand_field = getattr(kind_class, "shorthand", None)
                if shorthand_field is None:
                    raise ValueError(f"{where}: kind {kind!r} has no {kind}:VALUE form")
                kind_fields.setdefault(shorthand_field, shorthand)
            kind_base = brick_default if type(brick_default) is kind_class else None
            changes[name] = _build(kind_class, kind_fields, (*path, name), kind_base)
        elif (brick_class := _brick_class(hints[name], brick_default)) is not None:
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}: expected a mapping of its fields, got {value!r}")
            changes[name] = _build(brick_class, value, (*path, name), brick_default)
        else:
            changes[name] = _coerce(value, hints[name], where)
    try:
        return config_class(**changes) if base is None else dataclasses.replace(base, **changes)
    except ValueError as error:
        prefix = ".".join(path)
        raise ValueError(
            f"{prefix}.{error}" if prefix and not str(error).startswith(prefix) else str(error)
        ) from None


def read_config_file(path: str | Path) -> dict[str, object]:
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


def _merge(base: dict[str, object], path: tuple[str, ...], value: object) -> None:
    for depth, key in enumerate(path[:-1]):
        if isinstance(base.get(key), str):  # a slot given as its kind alone (``algorithm: gspo``)
            base[key] = {"kind": base[key]}
        child = base.setdefault(key, {})
        if not isinstance(child, dict):
            raise ValueError(
                f"{'.'.join(path[: depth + 1])}: expected a mapping of its fields, got {child!r}"
            )
        base = child
    base[path[-1]] = value


def _chosen_kinds(
    config_class: type, argv: Sequence[str] | None, file_fields: Mapping[str, object]
) -> dict[tuple[str, ...], str]:
    """The kind of every slot, from its flag, else from the config file (else its default): the fields a
    slot's kind brings depend on it, so the full parser is built after this first pass."""
    kinds: dict[tuple[str, ...], str] = {}
    for _ in range(4):  # a chosen kind may bring slots of its own
        parser = argparse.ArgumentParser(add_help=False)
        kind_leaves = [leaf for leaf in _leaves(config_class, kinds=kinds) if leaf.choices is not None]
        for leaf in kind_leaves:
            parser.add_argument(*(f"--{flag}" for flag in leaf.flags), dest="/".join(leaf.path), default=None)
        namespace = vars(parser.parse_known_args(argv)[0])
        chosen = dict(kinds)
        for leaf in kind_leaves:
            slot_path = leaf.path[:-1]
            kind = namespace["/".join(leaf.path)] or _file_kind(file_fields, slot_path)
            kind = _kind_text(kind)[0] if kind is not None else None
            if kind is not None and kind in leaf.choices:  # a bad one fails in the full parser, listing them
                chosen[slot_path] = kind
        if chosen == kinds:
            return kinds
        kinds = chosen
    return kinds


def _file_kind(file_fields: Mapping[str, object], slot_path: tuple[str, ...]) -> str | None:
    value: object = file_fields
    for key in slot_path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, str):
        return value
    return value.get("kind") if isinstance(value, Mapping) else None


def parse_config(
    config_class: type[ConfigT],
    argv: Sequence[str] | None = None,
    *,
    description: str = "",
    prog: str | None = None,
) -> ConfigT:
    """Build ``config_class`` from ``--config FILE`` and ``--flag value`` arguments (flags win over the file);
    ``prog`` names the command in usage and error lines (default: the script's name)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML or JSON file of fields (nested by brick); flags override it",
    )
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    config_file = vars(pre.parse_known_args(argv)[0])["config"]
    try:
        file_fields: dict[str, object] = read_config_file(config_file) if config_file else {}
    except (ValueError, OSError) as error:
        parser.error(str(error))
    leaves = _leaves(config_class, kinds=_chosen_kinds(config_class, argv, file_fields))
    hints = typing.get_type_hints(config_class)
    fields = dataclasses.fields(config_class)
    brick_help = {
        f.name: f.metadata.get("help", "")
        for f in fields
        if _registry(f, hints[f.name]) is not None
        or _brick_class(hints[f.name], _field_default(f)) is not None
    }
    groups: dict[str, argparse._ActionsContainer] = {}
    for leaf in leaves:
        convert, choices = _converter(leaf.annotation) if leaf.choices is None else (str, leaf.choices)
        shown = ",".join(map(str, leaf.default)) if isinstance(leaf.default, tuple) else leaf.default
        brick = leaf.path[0] if len(leaf.path) > 1 else ""
        if brick not in groups:
            groups[brick] = (
                parser.add_argument_group(f"{brick} brick", description=brick_help.get(brick))
                if brick
                else parser
            )
        help = leaf.help if leaf.choices is None else f"{leaf.help}: one of the registered kinds"
        groups[brick].add_argument(
            *(f"--{flag}" for flag in leaf.flags),
            dest="/".join(leaf.path),
            metavar=leaf.flags[0].upper().replace("-", "_")
            if choices is None
            else f"{{{','.join(map(str, choices))}}}",
            type=convert if leaf.choices is None else _kind_choice(leaf.choices),
            choices=choices if leaf.choices is None else None,
            default=dataclasses.MISSING,
            help=f"{help} (default: {shown})",
            # a bool flag alone means true (``--agent-sampling``); ``--agent-sampling false`` still parses
            **({"nargs": "?", "const": True} if convert is _parse_bool else {}),
        )
    namespace = vars(parser.parse_args(argv))
    namespace.pop("config", None)
    try:
        overrides = file_fields
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


def config_to_json(config: object) -> str:
    """A config as indented JSON (paths and tuples made plain; credentials ``REDACTED``, their names kept)."""

    def field(name: str, value: object) -> object:
        if _SECRET_NAME.search(name) and value not in (None, ""):  # unset stays visible: it is no secret
            return REDACTED
        return plain(value)

    def brick(registry: Registry, value: object) -> dict[str, object]:  # a slot's brick names its kind
        fields = plain(value)
        assert isinstance(fields, dict), f"{registry.seam}: a registered kind is a dataclass config"
        return {"kind": registry.name_of(value), **fields}

    def registries(value: DataclassInstance | type[DataclassInstance]) -> dict[str, Registry]:
        try:
            hints = typing.get_type_hints(type(value))
        except (NameError, TypeError):  # annotations only importable for type checkers: no slot among them
            hints = {}
        found = {f.name: _registry(f, hints.get(f.name)) for f in dataclasses.fields(value)}
        return {name: registry for name, registry in found.items() if registry is not None}

    def plain(value: object) -> object:
        if dataclasses.is_dataclass(value):
            slots = registries(value)
            return {
                f.name: brick(slots[f.name], getattr(value, f.name))
                if f.name in slots
                else field(f.name, getattr(value, f.name))
                for f in dataclasses.fields(value)
            }
        if isinstance(value, Mapping):
            return {str(key): field(str(key), item) for key, item in value.items()}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, Path):
            return str(value)
        return value

    return json.dumps(plain(config), indent=2, sort_keys=True)
