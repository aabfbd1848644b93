"""How the settings layer refuses a value: ``InvalidSettings``, its JSON pointer, its wording.

Every refusal names the RFC 6901 pointer of the offending value and the rule it broke, in one
line. The helpers here give values and types the spelling a JSON reader knows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import NoReturn

from pydantic_core import PydanticCustomError

from dispatch_kubeflow.errors import ErrInvalid

_SHOWN_MAX = 80


class InvalidSettings(ErrInvalid):
    """A settings document broke a rule. ``pointer`` is the RFC 6901 pointer of the value."""

    def __init__(self, pointer: str, rule: str) -> None:
        self.pointer = pointer
        self.rule = rule
        # A key may hold a newline; the message stays one line.
        shown = pointer if pointer.isprintable() else json.dumps(pointer, ensure_ascii=False)
        where = f" at {shown}" if pointer else ""
        super().__init__(f"invalid settings{where}: {rule}")

    def under(self, prefix: str) -> InvalidSettings:
        """The same refusal with its pointer inside ``prefix`` (e.g. ``/spec``)."""
        return InvalidSettings(prefix + self.pointer, self.rule)


def json_pointer(*parts: str | int) -> str:
    """RFC 6901: each reference token with ``~`` as ``~0`` and ``/`` as ``~1``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def shown(value: object) -> str:
    """A value as it would appear in JSON, on one line and not too long."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 4] + '..."'


def json_type(value: object) -> str:
    """The JSON type of a decoded value, with its article: "a string", "an object", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def refuse(rule: str) -> NoReturn:
    """Refuse the value a pydantic validator is judging; the caller adds the pointer."""
    raise PydanticCustomError("settings_rule", "{rule}", {"rule": rule})
