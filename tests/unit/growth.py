"""Time bounds as growth: doubling an input at most triples the time it takes.

A wall-clock limit in a unit test fails on a slow or busy machine; a ratio between two sizes
measured back to back does not, and still tells linear cost from quadratic (which quadruples)
or exponential. Each size is timed several times, interleaved, and the fastest run counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

GROWTH_MAX: Final = 3.0
REPEATS: Final = 5
ATTEMPTS: Final = 4
# Below this a timing is mostly the timer and the scheduler, not the work.
RESOLUTION: Final = 0.002


def elapsed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def doubling_ratio(make: Callable[[int], T], run: Callable[[T], object], size: int) -> float:
    """How much longer ``run`` takes on ``make(2 * size)`` than on ``make(size)``."""
    small, large = make(size), make(2 * size)
    small_times, large_times = [], []
    for _ in range(REPEATS):
        small_times.append(elapsed(lambda: run(small)))
        large_times.append(elapsed(lambda: run(large)))
    return max(min(large_times), RESOLUTION) / max(min(small_times), RESOLUTION)


def assert_grows_linearly(make: Callable[[int], T], run: Callable[[T], object], size: int) -> None:
    """Doubling the input at most triples the time, in one of ``ATTEMPTS`` measurements.

    A busy machine (other processes on the same cores) can slow one size and not the other; a
    quadratic cost quadruples the time in every measurement, so it still fails.
    """
    ratios: list[float] = []
    while len(ratios) < ATTEMPTS:
        ratios.append(doubling_ratio(make, run, size))
        if ratios[-1] <= GROWTH_MAX:
            return
    raise AssertionError(f"doubling {size} multiplied the time by {ratios}")
