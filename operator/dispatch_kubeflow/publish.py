#!/usr/bin/env python3
"""publish: hand a small result of a training program to dispatch.

The training program runs ``/opt/dispatch/publish '{"loss": 0.12, "checkpoint": "s3://..."}'``
(or pipes the record on stdin). The record, a JSON object of at most 4 KiB, is written to the
container's termination message, where the adapter reads it back with the job's ``Finished``
event and from ``find``. A later call replaces an earlier record.

Exit status: 0 published; 2 refused (not UTF-8, not one JSON object, a duplicate key, NaN, a
number JSON cannot hold, a lone surrogate, nesting past 64 levels, over 4096 bytes) or bad usage;
1 the termination message cannot be written; 3 an internal error. Every failure is one line on
standard error. The record replaces the earlier one whole: it is written to a temporary file that
is renamed over the old one, or, where the path cannot be replaced (the kubelet mounts the
termination-log file itself), written in one call and only then cut to its length, so a write that
fails leaves the earlier record in place.

This file is the whole program: it imports nothing but the standard library and runs with any
Python 3, because it is copied as a single file into the publish image and run by whatever
``python3`` the trainer image has. For the same reason it repeats its constants rather than
importing them.
"""

import contextlib
import json
import math
import os
import re
import stat
import sys
import tempfile

MAX_BYTES = 4096  # the kubelet keeps at most 4096 bytes of a termination message
MAX_INPUT_BYTES = 1024 * 1024  # refuse absurd input before parsing it
MAX_DEPTH = 64  # arrays and objects inside one another; decoders recurse once per level
SHOWN_MAX = 80
DEFAULT_PATH = "/dev/termination-log"
PATH_VARIABLE = "DISPATCH_TERMINATION_LOG"  # where to write instead, for tests
USAGE = "usage: publish '<JSON object>'  (or the object on stdin)"

# A JSON string, closed or running to the end of the text.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class Refused(Exception):
    """The record cannot be published; the message says why, in one line."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 3] + "..."


def _refuse_constant(name: str) -> object:
    raise Refused(f"the record is not valid JSON: {name} is not a JSON number")


def _integer(digits: str) -> int:
    if len(digits) > MAX_BYTES:
        raise Refused(f"the record holds a number of {len(digits)} digits")
    return int(digits)


def _float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise Refused(f"the record holds {_shown(text)}, beyond what a JSON number can be")
    return number


def _unique_keys(pairs: "list[tuple[str, object]]") -> "dict[str, object]":
    record = {}  # type: dict[str, object]
    for key, value in pairs:
        if key in record:
            raise Refused(f"the record has the key {_shown(key)} twice")
        record[key] = value
    return record


def _too_deep(text: str) -> bool:
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def encode(text: str) -> bytes:
    """The compact JSON bytes of ``text``, or ``Refused`` naming what is wrong with it."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES:
        raise Refused(f"the record is over {MAX_INPUT_BYTES} bytes")
    if _too_deep(text):
        raise Refused(f"the record is nested more than {MAX_DEPTH} levels deep")
    try:
        record = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_refuse_constant,
            parse_int=_integer,
            parse_float=_float,
        )
    except ValueError as error:
        raise Refused(f"the record is not valid JSON: {error}") from None
    if not isinstance(record, dict):
        raise Refused(f"the record must be a JSON object, not {type(record).__name__}")
    try:
        data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        surrogate = error.object[error.start : error.end]
        raise Refused(
            f"the record holds {surrogate!a}, a lone surrogate, which is not Unicode"
        ) from None
    if len(data) > MAX_BYTES:
        raise Refused(f"the record is {len(data)} bytes, over the {MAX_BYTES}-byte limit")
    return data


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Refused(f"the record is not UTF-8 text (byte {error.start})") from None


def read_input(argv: "list[str]") -> str:
    if len(argv) > 1:
        raise Refused("too many arguments; " + USAGE)
    if argv and argv[0] != "-":
        # The bytes the program was given: Python decoded them with surrogateescape.
        return _utf8(os.fsencode(argv[0]))
    if sys.stdin is None or sys.stdin.isatty():
        raise Refused("no record given; " + USAGE)
    text = _utf8(sys.stdin.buffer.read(MAX_INPUT_BYTES + 1))
    if not text.strip():
        raise Refused("no record given; " + USAGE)
    return text


def _replace(data: bytes, path: str) -> None:
    """Write ``data`` to a new file beside ``path`` and rename it over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=".publish-", dir=directory)
    try:
        with os.fdopen(descriptor, "wb") as sink:
            sink.write(data)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _overwrite(data: bytes, path: str) -> None:
    """Write ``data`` over ``path`` in one call, and only then cut the file to its length."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        written = os.write(descriptor, data)
        if written != len(data):
            raise OSError(f"only {written} of {len(data)} bytes were written")
        os.ftruncate(descriptor, len(data))
    finally:
        os.close(descriptor)


def _replaceable(path: str) -> bool:
    """Whether ``path`` is a regular file of its own directory, or absent: safe to rename over."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISREG(mode) and not os.path.ismount(path)


def write(data: bytes, path: str) -> None:
    if _replaceable(path):
        try:
            _replace(data, path)
            return
        except OSError:
            pass  # a mounted file that looked like its directory's own: write over it instead
    _overwrite(data, path)


def _say(message: str) -> None:
    if sys.stderr is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write("publish: " + message.replace("\n", "\\n") + "\n")


def main(argv: "list[str] | None" = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    path = os.environ.get(PATH_VARIABLE) or DEFAULT_PATH
    try:
        data = encode(read_input(args))
    except Refused as refusal:
        _say(str(refusal))
        return 2
    except Exception as error:  # a fault of this program, not of the record
        _say(f"internal error ({type(error).__name__}: {error})")
        return 3
    try:
        write(data, path)
    except OSError as error:
        _say(f"cannot write {path}: {error.strerror or error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
