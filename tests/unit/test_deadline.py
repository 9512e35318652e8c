"""The drain/revoke deadline on a fake clock."""

from __future__ import annotations

import math

import pytest

from consumer.deadline import Deadline


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_remaining_counts_down_to_zero_and_expires() -> None:
    clock = Clock()
    d = Deadline.after(5.0, clock)
    assert d.remaining_s() == 5.0 and not d.expired
    clock.now_s += 4.5
    assert d.remaining_s() == pytest.approx(0.5)
    clock.now_s += 1.0
    assert d.remaining_s() == 0.0 and d.expired  # never negative


def test_sooner_keeps_a_reserve_and_never_starts_in_the_past() -> None:
    clock = Clock()
    d = Deadline.after(5.0, clock)
    work = d.sooner(1.0)
    assert work.remaining_s() == 4.0 and d.remaining_s() == 5.0
    clock.now_s += 4.0
    assert work.expired and not d.expired  # the reserve is left for the last step
    assert d.sooner(10.0).remaining_s() == 0.0


def test_never_and_bad_timeouts() -> None:
    assert Deadline.never(Clock()).remaining_s() == math.inf
    with pytest.raises(ValueError, match="timeout_s"):
        Deadline.after(-1.0, Clock())
    with pytest.raises(ValueError, match="timeout_s"):
        Deadline.after(math.nan, Clock())
