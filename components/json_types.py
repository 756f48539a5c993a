"""The JSON types: what a request body, a config file, a server's reply or a trajectory's JSON column holds once
parsed. A value typed ``JsonObject`` came from (or goes to) ``json``; reads of its fields narrow it with
``isinstance`` or through ``components.proxy.json_fields``."""

from __future__ import annotations

from typing import TypeAlias, Union

JsonScalar: TypeAlias = None | bool | int | float | str
JsonValue: TypeAlias = Union[JsonScalar, list["JsonValue"], dict[str, "JsonValue"]]  # noqa: UP007 (recursive)
JsonObject: TypeAlias = dict[str, JsonValue]
JsonArray: TypeAlias = list[JsonValue]
