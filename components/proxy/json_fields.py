"""Typed reads of fields from a request's JSON, each failure an ``InvalidRequestError`` naming the field."""

from __future__ import annotations

import json
import math
from typing import TypeVar, overload

from components.json_types import JsonArray, JsonObject, JsonValue
from components.proxy.errors import InvalidRequestError
from components.tito.messages import ToolSpec

D = TypeVar("D")

_MISSING = object()


def parse_json_object(body: bytes) -> JsonObject:
    """The request body as a JSON object."""
    if not body:
        raise InvalidRequestError("request body: empty; expected a JSON object")
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequestError(f"request body: malformed JSON ({error})") from None
    except RecursionError:
        raise InvalidRequestError("request body: JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"request body: expected a JSON object, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def require_object(value: JsonValue, where: str) -> JsonObject:
    """``value`` must be a JSON object."""
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where}: expected an object, got {_kind(value)}")
    return value


def require_list(value: JsonValue, where: str) -> JsonArray:
    """``value`` must be a JSON array."""
    if not isinstance(value, list):
        raise InvalidRequestError(f"{where}: expected an array, got {_kind(value)}")
    return value


@overload
def get_str(obj: JsonObject, key: str, where: str) -> str: ...
@overload
def get_str(obj: JsonObject, key: str, where: str, *, default: D) -> str | D: ...
def get_str(obj: JsonObject, key: str, where: str, *, default: object = _MISSING) -> object:
    """A string field (``default`` when absent or null; required when no default)."""
    value = obj.get(key)
    if value is None:
        if default is _MISSING:
            raise InvalidRequestError(f"{where}.{key}: missing required string")
        return default
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where}.{key}: expected a string, got {_kind(value)}")
    return value


@overload
def get_list(obj: JsonObject, key: str, where: str) -> JsonArray: ...
@overload
def get_list(obj: JsonObject, key: str, where: str, *, default: D) -> JsonArray | D: ...
def get_list(obj: JsonObject, key: str, where: str, *, default: object = _MISSING) -> object:
    """An array field (``default`` when absent or null; required when no default)."""
    value = obj.get(key)
    if value is None:
        if default is _MISSING:
            raise InvalidRequestError(f"{where}.{key}: missing required array")
        return default
    return require_list(value, f"{where}.{key}")


def get_bool(obj: JsonObject, key: str, where: str, *, default: bool = False) -> bool:
    """A boolean field."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{where}.{key}: expected a boolean, got {_kind(value)}")
    return value


def get_int(
    obj: JsonObject, key: str, where: str, *, default: int | None = None, minimum: int | None = None
) -> int | None:
    """An integer field, optionally bounded below."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise InvalidRequestError(f"{where}.{key}: expected an integer, got {_kind(value)} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidRequestError(f"{where}.{key}: must be >= {minimum}, got {value}")
    return value


def get_number(
    obj: JsonObject,
    key: str,
    where: str,
    *,
    default: float,
    minimum: float,
    maximum: float,
    open_low: bool = False,
) -> float:
    """A finite number in ``[minimum, maximum]`` (``(minimum, maximum]`` with ``open_low``)."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{where}.{key}: expected a number, got {_kind(value)} {value!r}")
    low_ok = value > minimum if open_low else value >= minimum
    if not low_ok or value > maximum:
        bracket = "(" if open_low else "["
        raise InvalidRequestError(f"{where}.{key}: must be in {bracket}{minimum}, {maximum}], got {value!r}")
    return float(value)


def get_stop(obj: JsonObject, key: str, where: str) -> tuple[str, ...]:
    """A stop field: a string or an array of strings."""
    value = obj.get(key)
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    stops: list[str] = []
    for index, item in enumerate(require_list(value, f"{where}.{key}")):
        if not isinstance(item, str):
            raise InvalidRequestError(f"{where}.{key}[{index}]: expected a string, got {_kind(item)}")
        if item:
            stops.append(item)
    return tuple(stops)


def json_text(value: JsonValue, where: str) -> str:
    """Tool-call arguments as JSON text: strings pass through, objects are serialized."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    raise InvalidRequestError(f"{where}: expected a JSON string or object, got {_kind(value)}")


def read_tool_spec(declaration: JsonObject, where: str, *, schema_key: str) -> ToolSpec:
    """One tool declaration (``name``, ``description``, a JSON schema under ``schema_key``) → a ``ToolSpec``;
    a missing schema means a tool without parameters."""
    schema = declaration.get(schema_key)
    return ToolSpec(
        name=get_str(declaration, "name", where),
        description=get_str(declaration, "description", where, default=""),
        parameters=require_object(schema, f"{where}.{schema_key}")
        if schema is not None
        else {"type": "object", "properties": {}},
    )
