"""consumer.batching.routes: each outcome goes to the callback its submit named."""

from __future__ import annotations

import logging

import pytest

from consumer.batching.routes import OutcomeRoutes
from consumer.batching.types import ItemOutcome


def _ok(item_id: int) -> ItemOutcome:
    return ItemOutcome(
        item_id=item_id, status="ok", result={}, error_code=None, error_message=None,
        truncated=False, n_tokens=1, queue_ms=0.0, infer_ms=0.0, batch_size=1, padded_len=1,
    )  # fmt: skip


def test_each_callback_gets_its_share_in_one_call_and_the_rest_goes_to_the_default() -> None:
    routes, mine, default = OutcomeRoutes(), [], []
    routes.add([1, 2], mine.append)
    routes.emit([_ok(1), _ok(3), _ok(2)], default.append)
    assert [[o.item_id for o in call] for call in mine] == [[1, 2]]
    assert [[o.item_id for o in call] for call in default] == [[3]]
    routes.add([4], mine.append)
    with pytest.raises(ValueError, match="already in flight"):  # 4 has no outcome yet
        routes.add([4], default.append)


def test_an_outcome_with_no_callback_and_no_default_is_logged_not_silently_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    routes, mine = OutcomeRoutes(), []
    routes.add([1], mine.append)
    with caplog.at_level(logging.ERROR, logger="consumer.batching.routes"):
        routes.emit([_ok(1), _ok(7)], None)
    assert [[o.item_id for o in call] for call in mine] == [[1]]
    assert "outcomes of items [7] have no callback" in caplog.text
