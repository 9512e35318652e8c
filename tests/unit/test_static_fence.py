"""A static member is fenced when it loses its membership twice within the window."""

from __future__ import annotations

import pytest

from consumer.kafka.static_fence import StaticFenceDetector


@pytest.mark.parametrize(
    ("losses_at_s", "fenced"),
    [
        ([10.0], [False]),  # one session expiry (a long network cut) is not a fence
        ([10.0, 11.0], [False, True]),  # a duplicate id flaps every heartbeat
        ([10.0, 80.0], [False, False]),  # two expiries a window apart
        ([10.0, 80.0, 100.0], [False, False, True]),
    ],
)
def test_losses_within_the_window_fence(losses_at_s: list[float], fenced: list[bool]) -> None:
    detector = StaticFenceDetector(window_s=60.0, losses=2)
    assert [detector.lost(at) for at in losses_at_s] == fenced
