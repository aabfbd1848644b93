"""How the settings layer refuses a value: ``InvalidSettings``, its JSON pointer, its wording.

Every refusal names the RFC 6901 pointer of the offending value and the rule it broke, in one
line of at most ``MESSAGE_MAX`` characters, whatever the document held: a character that is not
printable (a newline, U+2028, U+0085, a lone surrogate) is shown as its JSON escape, and a long
pointer or value is cut with an ellipsis: a pointer after ``POINTER_SHOWN_MAX`` characters (so
the rule keeps room), the rule at the end of the line. The helpers here give values and types
the spelling a JSON reader knows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Final, NoReturn

from pydantic_core import PydanticCustomError

from dispatch_kubeflow.errors import ErrInvalid

MESSAGE_MAX: Final = 300
POINTER_SHOWN_MAX: Final = 200
_SHOWN_MAX: Final = 80
ELLIPSIS: Final = "\u2026"


def printable(text: str) -> str:
    """``text`` with every character that is not printable written as its JSON escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 1`` characters and an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + ELLIPSIS


def shown_pointer(pointer: str) -> str:
    """A pointer as a message shows it: as written, or quoted when it holds odd characters."""
    head = pointer[: POINTER_SHOWN_MAX + 1]
    if head.isprintable():
        return cut(head, POINTER_SHOWN_MAX)
    quoted = printable(json.dumps(head, ensure_ascii=False)[1:-1])
    return '"' + cut(quoted, POINTER_SHOWN_MAX - 2) + '"'


class InvalidSettings(ErrInvalid):
    """A settings document broke a rule. ``pointer`` is the RFC 6901 pointer of the value.

    The message is one bounded line (see the module); ``pointer`` keeps the whole pointer for code
    that needs it.
    """

    def __init__(self, pointer: str, rule: str) -> None:
        self.pointer = pointer
        self.rule = cut(printable(rule[: MESSAGE_MAX * 2]), MESSAGE_MAX)
        where = (
            f"invalid settings at {shown_pointer(pointer)}: " if pointer else "invalid settings: "
        )
        super().__init__(cut(where + self.rule, MESSAGE_MAX))

    def under(self, prefix: str) -> InvalidSettings:
        """The same refusal with its pointer inside ``prefix`` (e.g. ``/spec``)."""
        return InvalidSettings(prefix + self.pointer, self.rule)


def json_pointer(*parts: str | int) -> str:
    """RFC 6901: each reference token with ``~`` as ``~0`` and ``/`` as ``~1``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def shown(value: object) -> str:
    """A value as it would appear in JSON, on one line and not too long."""
    if isinstance(value, str) and len(value) > _SHOWN_MAX:
        value = value[:_SHOWN_MAX]
    if isinstance(value, Decimal):
        text = str(value)[: _SHOWN_MAX + 1]
    else:
        text = json.dumps(value, ensure_ascii=False, default=str)
    text = printable(text)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 4] + '..."'


def json_type(value: object) -> str:
    """The JSON type of a decoded value, with its article: "a string", "an object", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float | Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def too_many(count: int, limit: int, what: str = "entries") -> str:
    """The rule for a list or map longer than its bound."""
    return f"has {count} {what}, more than the {limit} allowed"


def refuse(rule: str) -> NoReturn:
    """Refuse the value a pydantic validator is judging; the caller adds the pointer."""
    raise PydanticCustomError("settings_rule", "{rule}", {"rule": rule})
