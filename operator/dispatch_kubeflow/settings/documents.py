"""From text to ``Settings``: strict JSON decoding, plain documents, and refusals with pointers.

A settings document is one JSON object (or the ``spec`` of a ``KubeflowAdapter``). A value that
breaks a rule is refused with ``InvalidSettings`` (an ``ErrInvalid``) naming the JSON pointer of
the value and the rule, in one line. Nothing is coerced and nothing silently takes a default: an
unknown key, a duplicate key, a null, trailing data or a value of the wrong type is refused.
What pydantic cannot see (duplicate keys, nulls, lone surrogates, non-JSON constants) is found
here, and pydantic's errors are turned into the project's wording and pointers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from pydantic import ValidationError

from dispatch_kubeflow.settings.models import DOCUMENT_CONTEXT, Settings
from dispatch_kubeflow.settings.refusals import InvalidSettings, json_pointer, json_type, shown


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as decoded, every key kept, so duplicates can be found with their pointer."""


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _decode_json(data: str | bytes) -> Any:
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidSettings("", f"not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(data, object_pairs_hook=_Pairs, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            rule = (
                f"trailing data after the settings object at line {exc.lineno} column {exc.colno}"
            )
        else:
            rule = f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise InvalidSettings("", rule) from None
    except ValueError as exc:
        raise InvalidSettings("", f"not valid JSON: {exc}") from None


def plain_document(value: Any) -> Any:
    """Check a decoded document for duplicate keys, nulls and non-string keys; freeze arrays.

    Objects become dicts, arrays become tuples. Everything else is left for the models to judge.
    """
    path: list[str | int] = []  # where the walk is; turned into a pointer only on refusal
    try:
        return _plain(value, path)
    except _Refusal as refusal:
        raise InvalidSettings(json_pointer(*path), refusal.rule) from None


class _Refusal(Exception):
    def __init__(self, rule: str) -> None:
        self.rule = rule


def _plain(value: Any, path: list[str | int]) -> Any:
    if value is None:
        raise _Refusal("null is not allowed: omit the key for its default")
    if isinstance(value, str):
        if not value.isascii():
            _check_encodable(value)
        return value
    if isinstance(value, _Pairs):
        return _plain_object(value, path)
    if isinstance(value, dict | Mapping):  # dict first: the ABC check is slow
        return _plain_object(list(value.items()), path)
    if isinstance(value, list | tuple):
        items = []
        for index, item in enumerate(value):
            path.append(index)
            items.append(_plain(item, path))
            path.pop()
        return tuple(items)
    return value


def _check_encodable(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refusal("not valid Unicode (a lone surrogate)") from None


def _plain_object(pairs: list[tuple[Any, Any]], path: list[str | int]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, item in pairs:
        if not isinstance(key, str):
            raise _Refusal(f"key {shown(key)} is not a string")
        path.append(key)
        if key in result:
            raise _Refusal(f"duplicate key {shown(key)}")
        result[key] = _plain(item, path)
        path.pop()
    return result


_TYPE_RULES: Final = {
    "string_type": "must be a string",
    "bool_type": "must be a boolean",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "mapping_type": "must be an object",
    "tuple_type": "must be an array",
    "list_type": "must be an array",
}


def _error_rule(error: Any) -> str:
    kind = error["type"]
    if kind == "settings_rule":
        return str(error["ctx"]["rule"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind in _TYPE_RULES:
        return f"{_TYPE_RULES[kind]}, not {json_type(error['input'])}"
    if kind == "literal_error":
        return f"must be one of {error['ctx']['expected']}, got {shown(error['input'])}"
    return str(error["msg"])


def _error_pointer(loc: tuple[str | int, ...]) -> str:
    # A map key's own error carries a trailing "[key]"; the pointer is that of the key's entry.
    parts = loc[:-1] if loc and loc[-1] == "[key]" else loc
    return json_pointer(*parts)


def parse_settings_object(document: Any, *, pointer: str = "") -> Settings:
    """Validate an already-decoded settings object (e.g. a manifest's ``spec``).

    ``pointer`` is where the object sits in its own document (``/spec``); every refusal names a
    pointer under it.
    """
    try:
        plain = plain_document(document)
        if not isinstance(plain, dict):
            raise InvalidSettings("", f"must be an object, not {json_type(document)}")
        return Settings.model_validate(
            plain, by_alias=True, by_name=False, context=DOCUMENT_CONTEXT
        )
    except InvalidSettings as exc:
        raise exc.under(pointer) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidSettings(pointer + _error_pointer(first["loc"]), _error_rule(first)) from None


def parse_settings(data: str | bytes) -> Settings:
    """Parse a settings document, JSON text, refusing whatever the settings rules refuse."""
    return parse_settings_object(_decode_json(data))
