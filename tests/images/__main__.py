"""python -m tests.images build: build both images locally and print their names, sizes, digests."""

from __future__ import annotations

import argparse

from tests.images import build


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.images")
    parser.add_argument("command", choices=["build"])
    parser.parse_args()
    print(build.report(build.build()))


if __name__ == "__main__":
    main()
