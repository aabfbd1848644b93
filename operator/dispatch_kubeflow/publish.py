#!/usr/bin/env python3
"""publish: hand a small result of a training program to dispatch.

The training program runs ``/opt/dispatch/publish '{"loss": 0.12, "checkpoint": "s3://..."}'``
(or pipes the record on stdin). The record, a JSON object of at most 4 KiB, is written to the
container's termination message, where the adapter reads it back with the job's ``Finished``
event and from ``find``. A later call replaces an earlier record.

This file is the whole program: it imports nothing but the standard library and runs with any
Python 3, because it is copied as a single file into the publish image and run by whatever
``python3`` the trainer image has. For the same reason it repeats its two constants rather than
importing them.
"""

import json
import os
import sys

MAX_BYTES = 4096  # the kubelet keeps at most 4096 bytes of a termination message
MAX_INPUT_BYTES = 1024 * 1024  # refuse absurd input before parsing it
DEFAULT_PATH = "/dev/termination-log"
PATH_VARIABLE = "DISPATCH_TERMINATION_LOG"  # where to write instead, for tests
USAGE = "usage: publish '<JSON object>'  (or the object on stdin)"


class Refused(Exception):
    """The record cannot be published; the message says why, in one line."""


def _refuse_constant(name: str) -> object:
    raise Refused(f"the record is not valid JSON: {name} is not a JSON number")


def _unique_keys(pairs: "list[tuple[str, object]]") -> "dict[str, object]":
    record = {}  # type: dict[str, object]
    for key, value in pairs:
        if key in record:
            raise Refused(f"the record has the key {key!r} twice")
        record[key] = value
    return record


def encode(text: str) -> bytes:
    """The compact JSON bytes of ``text``, or ``Refused`` naming what is wrong with it."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES:
        raise Refused(f"the record is over {MAX_INPUT_BYTES} bytes")
    try:
        record = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except ValueError as error:
        raise Refused(f"the record is not valid JSON: {error}") from None
    if not isinstance(record, dict):
        raise Refused(f"the record must be a JSON object, not {type(record).__name__}")
    data = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(data) > MAX_BYTES:
        raise Refused(f"the record is {len(data)} bytes, over the {MAX_BYTES}-byte limit")
    return data


def read_input(argv: "list[str]") -> str:
    if len(argv) > 1:
        raise Refused("too many arguments; " + USAGE)
    if argv and argv[0] != "-":
        return argv[0]
    if sys.stdin is None or sys.stdin.isatty():
        raise Refused("no record given; " + USAGE)
    text = sys.stdin.read(MAX_INPUT_BYTES + 1)
    if not text.strip():
        raise Refused("no record given; " + USAGE)
    return text


def write(data: bytes, path: str) -> None:
    with open(path, "wb") as sink:
        sink.write(data)


def main(argv: "list[str] | None" = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    path = os.environ.get(PATH_VARIABLE) or DEFAULT_PATH
    try:
        data = encode(read_input(args))
    except Refused as refusal:
        sys.stderr.write(f"publish: {refusal}\n")
        return 2
    try:
        write(data, path)
    except OSError as error:
        sys.stderr.write(f"publish: cannot write {path}: {error.strerror or error}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
