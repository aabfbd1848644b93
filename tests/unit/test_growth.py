"""The growth check itself: linear cost passes, quadratic cost fails however often it is tried."""

from __future__ import annotations

import pytest

from tests.unit.growth import assert_grows_linearly


def quadratic(n: int) -> int:
    return sum(i ^ j for i in range(n) for j in range(n))


def linear(n: int) -> int:
    return sum(range(n))


def test_a_linear_cost_passes() -> None:
    assert_grows_linearly(lambda n: n, linear, 400_000)


def test_a_quadratic_cost_fails() -> None:
    with pytest.raises(AssertionError, match="multiplied the time"):
        assert_grows_linearly(lambda n: n, quadratic, 400)
