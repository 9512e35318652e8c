"""Start-up helpers of ``kbatch serve`` (consumer/serve/app.py) that need no broker or model."""

from __future__ import annotations

import gc

from consumer.serve.app import GC_THRESHOLDS, freeze_startup_heap


def test_the_start_up_heap_is_frozen_out_of_the_collectors_reach() -> None:
    alive = [object() for _ in range(10)]  # a tracked container, alive at start-up
    thresholds = gc.get_threshold()
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() > 0
        assert not any(o is alive for o in gc.get_objects())  # no collection walks it now
        assert gc.get_threshold() == GC_THRESHOLDS  # fewer collections while serving
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
