"""Time bounds as growth: quadrupling an input at most multiplies the time it takes by eight.

A wall-clock limit in a unit test fails on a slow or busy machine; a ratio between two sizes
measured back to back does not, and still tells linear cost (four times the time) from quadratic
(sixteen times) or exponential. The bound sits a factor of two from each, so noise that halves
or doubles one measurement still leaves the verdict right. Each size is timed several times,
interleaved, and the fastest run counts. The time is the thread's CPU time: another process on
the same cores delays the work without adding to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

GROWTH: Final = 4
GROWTH_MAX: Final = 8.0
REPEATS: Final = 5
ATTEMPTS: Final = 4
# Below this a timing is mostly the timer and the scheduler, not the work.
RESOLUTION: Final = 0.002


def elapsed(action: Callable[[], object]) -> float:
    start = time.thread_time()
    action()
    return time.thread_time() - start


def growth_ratio(make: Callable[[int], T], run: Callable[[T], object], size: int) -> float:
    """How much longer ``run`` takes on ``make(GROWTH * size)`` than on ``make(size)``."""
    small, large = make(size), make(GROWTH * size)
    small_times, large_times = [], []
    for _ in range(REPEATS):
        small_times.append(elapsed(lambda: run(small)))
        large_times.append(elapsed(lambda: run(large)))
    return max(min(large_times), RESOLUTION) / max(min(small_times), RESOLUTION)


def assert_grows_linearly(make: Callable[[int], T], run: Callable[[T], object], size: int) -> None:
    """Quadrupling the input at most multiplies the time by eight, in one of ``ATTEMPTS`` tries.

    A cache or a frequency change can slow one size and not the other; a quadratic cost
    multiplies the time by sixteen in every measurement, so it still fails.
    """
    ratios: list[float] = []
    while len(ratios) < ATTEMPTS:
        ratios.append(growth_ratio(make, run, size))
        if ratios[-1] <= GROWTH_MAX:
            return
    raise AssertionError(f"{GROWTH} times {size} multiplied the time by {ratios}")
