"""From text to ``Settings``: strict JSON decoding, plain documents, and refusals with pointers.

A settings document is one JSON object (or the ``spec`` of a ``KubeflowAdapter``). A value that
breaks a rule is refused with ``InvalidSettings`` (an ``ErrInvalid``) naming the JSON pointer of
the value and the rule, in one line. Nothing is coerced and nothing silently takes a default: an
unknown key, a duplicate key, a null, trailing data or a value of the wrong type is refused.
What pydantic cannot see (duplicate keys, nulls, lone surrogates, non-JSON constants) is found
here, and pydantic's errors are turned into the project's wording and pointers.

Hostile input costs time linear in its size: more arrays and objects than a settings document
can hold, and nesting deeper than ``MAX_DEPTH``, are refused before the text is decoded, and a
list or map longer than ``ENTRIES_MAX`` before its entries are looked at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from pydantic import ValidationError

from dispatch_kubeflow.settings.models import DOCUMENT_CONTEXT, ENTRIES_MAX, Settings
from dispatch_kubeflow.settings.refusals import (
    InvalidSettings,
    json_pointer,
    json_type,
    shown,
    too_many,
)

# The settings object nests three levels (settings, kueue, admissionLease); this leaves room for
# a value of the wrong type to be reported where it is, and refuses anything deeper unread.
MAX_DEPTH: Final = 16
# The most arrays and objects a settings document holds: itself, cluster, probeRuntime, kueue,
# its admissionLease, labels, annotations, timeouts, publish, the three lists, and every runtime
# and credential.
MAX_CONTAINERS: Final = 12 + 2 * ENTRIES_MAX
# The longest integer kept as an int; a longer one (never a settings value) stays a Decimal.
_INT_DIGITS_MAX: Final = 640

# A JSON string, closed or running to the end of the text (an unrolled loop: linear in re).
_JSON_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")

# Python's words for broken JSON, in the project's.
_JSON_PROBLEMS: Final = (
    ("Expecting value", "a value was expected"),
    ("Expecting ',' delimiter", "',' or a closing bracket was expected"),
    ("Expecting ':' delimiter", "':' was expected after a key"),
    ("Expecting property name enclosed in double quotes", "a key in double quotes was expected"),
    ("Unterminated string", "a string is not closed"),
    ("Invalid control character", "a control character in a string must be escaped"),
    ("Invalid \\uXXXX escape", "a string holds an invalid \\u escape"),
    ("Invalid \\escape", "a string holds an invalid escape"),
    ("Unexpected UTF-8 BOM", "the text begins with a byte-order mark (U+FEFF)"),
)


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as decoded, every key kept, so duplicates can be found with their pointer."""


class _NotJson(ValueError):
    """NaN or Infinity, which Python's decoder reads and JSON does not have."""


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON")


def _integer(digits: str) -> int | Decimal:
    return int(digits) if len(digits) <= _INT_DIGITS_MAX else Decimal(digits)


def _skeleton(text: str) -> bytes:
    """The brackets of JSON ``text`` outside its strings, in order."""
    outside = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    return outside.translate(None, _NOT_BRACKETS)


def nested_too_deep(skeleton: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the brackets of a skeleton nest more than ``limit`` deep; counted, not recursed."""
    depth = 0
    for bracket in skeleton:
        depth += 1 if bracket in b"[{" else -1
        if depth > limit:
            return True
    return False


def _check_shape(text: str, max_depth: int, max_containers: int) -> None:
    """Refuse more than ``max_containers`` arrays and objects, or nesting past ``max_depth``.

    Asked before decoding: decoders recurse once per level and build every container. The text
    is scanned in C (its strings dropped, its brackets kept); only a skeleton of at most
    ``2 * max_containers`` brackets is walked in Python.
    """
    if text.count("[") + text.count("{") <= min(max_depth, max_containers):
        return
    skeleton = _skeleton(text)
    # Depth is judged on what a document within the bound would hold, so that also a text with
    # too many containers is told it nests too deep when it does so early.
    if nested_too_deep(skeleton[: 2 * max_containers], max_depth):
        raise InvalidSettings("", f"nested more than {max_depth} levels deep")
    containers = skeleton.count(b"[") + skeleton.count(b"{")
    if containers > max_containers:
        raise InvalidSettings(
            "",
            f"holds {containers} arrays and objects, more than a settings document can "
            f"({max_containers})",
        )


def _json_problem(exc: json.JSONDecodeError) -> str:
    where = f"at line {exc.lineno} column {exc.colno}"
    if exc.msg == "Extra data":
        return f"trailing data after the settings object {where}"
    for python, ours in _JSON_PROBLEMS:
        if exc.msg.startswith(python):
            return f"not valid JSON: {ours} {where}"
    return f"not valid JSON {where}"


def decode_json(
    data: str | bytes, *, max_depth: int = MAX_DEPTH, max_containers: int = MAX_CONTAINERS
) -> Any:
    """JSON text as decoded values, objects as ``_Pairs``; ``InvalidSettings`` if it is not JSON.

    UTF-8 only, no byte-order mark, no NaN or Infinity, nesting at most ``max_depth`` deep and
    at most ``max_containers`` arrays and objects (a manifest around the settings holds more).
    """
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidSettings("", f"not UTF-8 text (byte {exc.start})") from None
    _check_shape(data, max_depth, max_containers)
    try:
        try:
            return json.loads(data, object_pairs_hook=_Pairs, parse_constant=_refuse_constant)
        except (json.JSONDecodeError, _NotJson):
            raise
        except ValueError:
            # An integer too long for int(): read again keeping long ones as Decimal.
            return json.loads(
                data,
                object_pairs_hook=_Pairs,
                parse_constant=_refuse_constant,
                parse_int=_integer,
            )
    except json.JSONDecodeError as exc:
        raise InvalidSettings("", _json_problem(exc)) from None
    except _NotJson as exc:
        raise InvalidSettings("", f"not valid JSON: {exc}") from None
    except ValueError:
        raise InvalidSettings("", "not valid JSON: a number cannot be read") from None


def object_keys(document: Any) -> frozenset[str]:
    """The keys of a JSON object as ``decode_json`` returns it; none for any other value."""
    if isinstance(document, _Pairs):
        return frozenset(key for key, _ in document)
    return frozenset()


def plain_document(value: Any) -> Any:
    """Check a decoded document for duplicate keys, nulls and non-string keys; freeze arrays.

    Objects become dicts, arrays become tuples. Everything else is left for the models to judge.
    Nesting past ``MAX_DEPTH``, a list or map of more than ``ENTRIES_MAX`` entries and a string
    that is not valid Unicode are refused where they are, before anything inside them is read.
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
        _check_encodable(value)
        return value
    if isinstance(value, _Pairs):
        return _plain_object(value, path)
    if isinstance(value, dict | Mapping):  # dict first: the ABC check is slow
        return _plain_object(list(value.items()), path)
    if isinstance(value, list | tuple):
        _check_container(len(value), path)
        items = []
        for index, item in enumerate(value):
            path.append(index)
            items.append(_plain(item, path))
            path.pop()
        return tuple(items)
    return value


def _check_container(entries: int, path: list[str | int]) -> None:
    if len(path) >= MAX_DEPTH:
        raise _Refusal(f"nested more than {MAX_DEPTH} levels deep")
    if entries > ENTRIES_MAX:
        raise _Refusal(too_many(entries, ENTRIES_MAX))


def _check_encodable(value: str) -> None:
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refusal("not valid Unicode (a lone surrogate)") from None


def _plain_object(pairs: list[tuple[Any, Any]], path: list[str | int]) -> dict[str, Any]:
    _check_container(len(pairs), path)
    result: dict[str, Any] = {}
    for key, item in pairs:
        if not isinstance(key, str):
            raise _Refusal(f"key {shown(key)} is not a string")
        path.append(key)
        _check_encodable(key)
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
# Where the settings object has maps: pydantic reports a map key's own error with "[key]" after
# the key, so the marker is told from a key named "[key]" by where it stands.
_MAPS: Final = frozenset({("labels",), ("annotations",)})
_KEY_MARKER: Final = "[key]"


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
    return f"is not a valid value here ({json_type(error['input'])})"


def _error_pointer(loc: tuple[str | int, ...]) -> str:
    if len(loc) >= 3 and loc[-1] == _KEY_MARKER and tuple(loc[:-2]) in _MAPS:
        loc = loc[:-1]
    return json_pointer(*loc)


def parse_settings_object(document: Any, *, pointer: str = "") -> Settings:
    """Validate an already-decoded settings object (e.g. a manifest's ``spec``).

    ``pointer`` is where the object sits in its own document (``/spec``); every refusal names a
    pointer under it.
    """
    try:
        if document is None:
            raise InvalidSettings("", "null is not allowed: the settings must be an object")
        plain = plain_document(document)
        if not isinstance(plain, dict):
            raise InvalidSettings("", f"must be an object, not {json_type(document)}")
        return Settings.model_validate(
            plain, by_alias=True, by_name=False, context=DOCUMENT_CONTEXT
        )
    except InvalidSettings as exc:
        raise exc.under(pointer) from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise InvalidSettings(pointer + _error_pointer(first["loc"]), _error_rule(first)) from None


def parse_settings(data: str | bytes) -> Settings:
    """Parse a settings document, JSON text, refusing whatever the settings rules refuse."""
    return parse_settings_object(decode_json(data))
