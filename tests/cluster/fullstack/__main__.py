"""`python -m tests.cluster.fullstack build [names]`: build the full stack's binaries.

`up`, `down` and `status` of the full stack are `python -m tests.cluster up --full`, `down`
and `status`; this command only builds (or reuses) the scheduler, KWOK and controller binaries,
all or only the named ones, and prints their folder.
"""

from __future__ import annotations

import argparse
import sys

from tests.cluster.fullstack import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.fullstack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser(
        "build", help="build (or reuse) the binaries; print their folder"
    )
    build_command.add_argument("--force", action="store_true", help="rebuild even if cached")
    build_command.add_argument("only", nargs="*", help="build only these binaries")
    args = parser.parse_args(argv)
    try:
        print(build.build(force=args.force, only=tuple(args.only)))
    except build.BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
