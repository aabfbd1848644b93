"""python -m tests.images build | lock

build: both images, built locally; prints their names, sizes, digests and build times.
lock: requirements.lock and requirements-build.lock made again from pyproject.toml.
"""

from __future__ import annotations

import argparse

from tests.images import build, locks


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.images")
    parser.add_argument("command", choices=["build", "lock"])
    if parser.parse_args().command == "lock":
        locks.make()
    else:
        print(build.report(build.build()))


if __name__ == "__main__":
    main()
