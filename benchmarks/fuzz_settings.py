"""Fuzz the settings parser and ``dispatch-kubeflow validate`` with seeded mutations.

Documents are mutations of ``examples/settings.json``: renamed, deleted and added keys, wrong
types, huge numbers, NaN, deep nesting, duplicate keys, invalid UTF-8, a BOM, lone surrogates,
line separators, long strings and keys, many entries, odd durations, truncation and byte flips;
some are grown to up to 1 MiB. Every one goes through ``parse_settings``, which must accept it or
refuse it with ``ErrInvalid``; a sample also goes through ``validate`` in-process (as JSON, or
as a YAML manifest), which must exit 0, 1 or 2 with one line for a refusal. Each parse is timed,
with the garbage collector paused as ``timeit`` does, and the 20 slowest are timed again at the
end (best of three) to tell cost from a busy machine.

Run from the repository root: ``python3 benchmarks/fuzz_settings.py [--documents N] [--seed S]``.
Exits 1 if anything but ``ErrInvalid`` was raised, or an input took 100 ms or more when timed
again.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import heapq
import io
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from dispatch_kubeflow import cli
from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.settings import parse_settings

EXAMPLE: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "examples/settings.json").read_text()
)
MIB = 1024 * 1024
LIMIT = 0.100  # seconds, for any input of at most 1 MiB
SLOWEST_KEPT = 20  # timed again at the end, to tell cost from a busy machine
ODD_STRINGS = [
    "",
    " ",
    "\u2028",
    "\u0085",
    "\ud800",
    "\ufeff",
    "a\n",
    "[key]",
    "~1/",
    "é",
    "\x00",
    "NaN",
    "0",
    "-",
]
ODD_DURATIONS = [
    "0",
    "-5m",
    "5",
    "5d",
    ".s",
    "1h-1m",
    "9223372036854775808ns",
    "3000000h",
    "0.1ns",
    "1µs",
    "1μs",
    "+5m",
    "5m\n",
    "1" * 70 + "s",
    "1ns" * 30,
]
ODD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    1.5,
    10**30,
    1e308,
    [],
    {},
    [None],
    {"": ""},
    "x" * 300,
]
KEYS = sorted({*EXAMPLE, "probe_runtime", "Namespace", "extra", "kueue ", ""})


def paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value under ``node``, containers included."""
    found = [path] if path else []
    if isinstance(node, dict):
        for key, child in node.items():
            found += paths(child, (*path, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += paths(child, (*path, index))
    return found


def parent_of(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        document = document[part]
    return document


def value_at(document: Any, path: tuple[Any, ...]) -> Any:
    return parent_of(document, path)[path[-1]]


def nested(rng: random.Random, depth: int) -> Any:
    value: Any = rng.choice(["x", 1, None])
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


def huge(rng: random.Random) -> Any:
    """A value that makes the document large, up to about 1 MiB."""
    size = rng.choice([1_000, 10_000, 100_000, 300_000, 900_000])
    kind = rng.randrange(8)
    if kind == 0:
        return "x" * size
    if kind == 1:
        return {f"example.com/k{i}": "v" for i in range(size // 25)}
    if kind == 2:
        return [{"secretName": f"s{i}", "mountPath": f"/m/{i}"} for i in range(size // 40)]
    if kind == 3:
        return "1ns" * (size // 3)
    if kind == 4:
        return [[] for _ in range(size // 3)]
    if kind == 5:
        return {"k" * size: "v"}
    if kind == 6:
        return [rng.random() for _ in range(size // 20)]
    return "\u2028é\ud800" * (size // 6)


def structural(rng: random.Random, document: dict[str, Any]) -> None:
    """One change to the decoded document."""
    targets = paths(document)
    path = rng.choice(targets) if targets else ("namespace",)
    parent = parent_of(document, path)
    last = path[-1]
    kind = rng.randrange(10)
    if kind == 0 and isinstance(parent, dict):  # rename a key
        parent[rng.choice([*KEYS, str(last).upper(), str(last) + rng.choice(ODD_STRINGS)])] = (
            parent.pop(last)
        )
    elif kind == 1 and isinstance(parent, dict):  # delete a key
        del parent[last]
    elif kind == 2:  # add a key somewhere
        objects = [document, *(value_at(document, p) for p in targets)]
        target = rng.choice([o for o in objects if isinstance(o, dict)])
        target[rng.choice([*KEYS, *ODD_STRINGS])] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif kind == 3:
        parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
    elif kind == 4:
        parent[last] = rng.choice(ODD_STRINGS) * rng.choice([1, 2, 100])
    elif kind == 5:
        # Deeper nesting is made in the text (below): the harness itself recurses on values.
        parent[last] = nested(rng, rng.choice([2, 5, 15, 16, 17, 40, 100]))
    elif kind == 6:
        duration = rng.choice(["nodeLossWindow", "timeouts"])
        if duration == "timeouts":
            document["timeouts"] = {"request": rng.choice(ODD_DURATIONS)}
        else:
            document["nodeLossWindow"] = rng.choice(ODD_DURATIONS)
    elif kind == 7:
        key = rng.choice(["labels", "annotations", "credentials", "runtimes", "nodeLossTaints"])
        document[key] = huge(rng) if rng.random() < 0.1 else [document.get(key)] * 65
    elif kind == 8:
        parent[last] = huge(rng) if rng.random() < 0.2 else rng.choice(ODD_STRINGS) * 1000
    else:
        document[rng.choice(["labels", "annotations"])] = {
            rng.choice(ODD_STRINGS) + "k": rng.choice(ODD_STRINGS)
        }


def textual(rng: random.Random, text: str) -> str | bytes:
    """One change to the JSON text."""
    kind = rng.randrange(12)
    if kind == 0:  # a duplicate key
        return text.replace('"namespace"', '"namespace": "b", "namespace"', 1)
    if kind == 1:
        return "\ufeff" + text
    if kind == 2:
        return text[: rng.randrange(len(text) + 1)]
    if kind == 3:
        return text + rng.choice([" {}", "x", "\n\t ", "[]"])
    if kind == 4:  # invalid UTF-8
        data = bytearray(text.encode("utf-8", "surrogatepass"))
        data.insert(rng.randrange(len(data) + 1), rng.choice([0xFF, 0xC0, 0x80, 0xED]))
        return bytes(data)
    if kind == 5:
        return text.replace('"team-a"', rng.choice(["NaN", "Infinity", "-Infinity", "1e999"]), 1)
    if kind == 6:
        return text.replace('"team-a"', "1" * rng.choice([100, 4300, 5000, 100_000]), 1)
    if kind == 7:  # a byte flipped
        data = bytearray(text.encode("utf-8", "surrogatepass"))
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 8:
        depth = rng.choice([100, 1000, 100_000])
        return text.replace('"team-a"', "[" * depth + "]" * depth, 1)
    if kind == 9:
        return text.replace('"a"', '"\\ud800"', 1)
    return text


def generate(rng: random.Random) -> tuple[str | bytes, str]:
    """A mutated document, and what was done to it."""
    document = copy.deepcopy(EXAMPLE)
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        structural(rng, document)
    text = json.dumps(document, ensure_ascii=rng.random() < 0.5)
    data: str | bytes = textual(rng, text) if rng.random() < 0.4 else text
    return data, ("text" if data is not text else "structure")


def size(data: str | bytes) -> int:
    return len(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))


def timed(action: Callable[[], object]) -> float:
    """Seconds ``action`` takes, the collector paused as ``timeit`` does: the harness's own
    garbage (documents of up to 1 MiB, made by the thousand) is not the parser's cost."""
    gc.disable()
    try:
        start = time.perf_counter()
        action()
        return time.perf_counter() - start
    finally:
        gc.enable()


def best_of_three(data: str | bytes) -> float:
    return min(timed(partial(parse_once, data)) for _ in range(3))


def parse_once(data: str | bytes) -> str:
    try:
        parse_settings(data)
    except ErrInvalid:
        return "refused"
    except Exception as exc:  # what the fuzz is looking for
        return f"other: {type(exc).__name__}: {str(exc)[:120]}"
    return "accepted"


def through_cli(data: str | bytes, as_manifest: bool) -> str:
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if as_manifest:
        try:  # the harness's own reading, to wrap the document; not what is tested
            spec = json.loads(raw)
        except (ValueError, RecursionError):
            spec = raw.decode("utf-8", "replace")
        manifest = {
            "apiVersion": "dispatch.phpboyscout.uk/v1alpha1",
            "kind": "KubeflowAdapter",
            "metadata": {"name": "fuzz"},
            "spec": spec,
        }
        with contextlib.suppress(yaml.YAMLError, RecursionError):
            raw = yaml.safe_dump(manifest, allow_unicode=False).encode()
    streams = (sys.stdin, sys.stdout, sys.stderr)
    sys.stdin = io.TextIOWrapper(io.BytesIO(raw))
    sys.stdout = io.TextIOWrapper(io.BytesIO())
    sys.stderr = io.StringIO()
    try:
        code = cli.main(["validate", "-"])
        message = sys.stderr.getvalue()
    except BaseException as exc:
        return f"other: {type(exc).__name__}: {str(exc)[:120]}"
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
    if code not in (0, 1, 2):
        return f"other: exit {code}: {message.strip()[:160]}"
    if code and message.count("\n") != 1:
        return f"other: exit {code} with {message.count(chr(10))} lines"
    return f"exit {code}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--cli-every", type=int, default=50, help="every Nth also via the CLI")
    parser.add_argument("--seconds", type=float, default=900.0, help="stop after this long")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    outcomes: Counter[str] = Counter()
    cli_outcomes: Counter[str] = Counter()
    others: list[str] = []
    # A min-heap of the slowest documents: (seconds, number, document, how it was mutated).
    slowest: list[tuple[float, int, str | bytes, str]] = []
    over_limit = 0
    oversized = 0
    started = time.perf_counter()
    done = 0
    for done in range(1, args.documents + 1):
        data, how = generate(rng)
        if size(data) > MIB:
            oversized += 1
            raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
            data = raw[:MIB]
        outcome = ""

        def parse(data: str | bytes = data) -> None:
            nonlocal outcome
            outcome = parse_once(data)

        elapsed = timed(parse)
        outcomes["other" if outcome.startswith("other") else outcome] += 1
        if outcome.startswith("other"):
            others.append(outcome)
        over_limit += elapsed >= LIMIT
        if len(slowest) < SLOWEST_KEPT:
            heapq.heappush(slowest, (elapsed, done, data, how))
        elif elapsed > slowest[0][0]:
            heapq.heapreplace(slowest, (elapsed, done, data, how))
        if done % args.cli_every == 0:
            result = through_cli(data, as_manifest=rng.random() < 0.3)
            cli_outcomes["other" if result.startswith("other") else result] += 1
            if result.startswith("other"):
                others.append("cli " + result)
        if time.perf_counter() - started > args.seconds:
            break
    wall = time.perf_counter() - started

    first = max(slowest)
    retimed = max((best_of_three(data), size(data)) for _, _, data, _ in slowest)
    print(f"documents: {done:,} (seed {args.seed}, {wall:.1f} s, every one at most 1 MiB)")
    print(f"  accepted:             {outcomes['accepted']:,}")
    print(f"  refused (ErrInvalid): {outcomes['refused']:,}")
    print(f"  other exceptions:     {outcomes['other']:,}")
    print(
        f"  slowest, first timed: {first[0] * 1000:.1f} ms "
        f"({size(first[2]):,} bytes, mutated in its {first[3]})"
    )
    print(
        f"  slowest of the {SLOWEST_KEPT} slowest, timed again (best of 3): "
        f"{retimed[0] * 1000:.1f} ms ({retimed[1]:,} bytes)"
    )
    print(f"  at or over 100 ms when first timed: {over_limit}")
    print(f"CLI sample: {sum(cli_outcomes.values()):,} documents through validate, in-process")
    for key in sorted(cli_outcomes):
        print(f"  {key}: {cli_outcomes[key]:,}")
    for other in others[:20]:
        print(f"  ! {other}")
    return 1 if others or retimed[0] >= LIMIT or over_limit > SLOWEST_KEPT else 0


if __name__ == "__main__":
    sys.exit(main())
