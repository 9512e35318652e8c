"""The reply-topic allow-list (consumer/replies/topic_policy.py): table of topics → verdicts,
and the log rate limit on a fake clock."""

from __future__ import annotations

import re

import pytest

from consumer.replies.topic_policy import LOG_INTERVAL_S, ReplyTopicPolicy
from tests.fakes import FakeClock


def policy(pattern: str | None, clock: FakeClock | None = None) -> ReplyTopicPolicy:
    return ReplyTopicPolicy(
        reply_topic="kbatch.replies",
        request_topic="kbatch.requests",
        dlq_topic="kbatch.requests.dlq",
        allowed_pattern=pattern,
        clock=clock or FakeClock(),
    )


@pytest.mark.parametrize(
    ("pattern", "topic", "allowed", "rule"),
    [
        (None, None, True, ""),  # no kafka_replyTopic: the configured topic
        (None, "kbatch.replies", True, ""),
        (None, "billing.events", False, "only the configured reply topic"),
        (r"replies\..*", "replies.app-1", True, ""),
        (r"replies\..*", "billing.events", False, "does not match"),
        (r"replies\..*", "xreplies.app-1", False, "does not match"),  # full match, not search
        (r"replies\..*", "replies.app-1.x", True, ""),
        (r"replies\.[a-z0-9-]+", "replies.app-1.x", False, "does not match"),  # anchored at end
        (r".*", "kbatch.requests", False, "request and dead-letter"),  # never, whatever
        (r".*", "kbatch.requests.dlq", False, "request and dead-letter"),
        (r".*", "__consumer_offsets", False, "internal"),
        (r".*", "__transaction_state", False, "internal"),
        (r".*", "any.topic", True, ""),
    ],
)
def test_which_reply_topics_are_allowed(
    pattern: str | None, topic: str | None, allowed: bool, rule: str
) -> None:
    refusal = policy(pattern).check(topic)
    assert (refusal is None) is allowed
    if refusal is not None:
        assert rule in refusal.message and repr(topic) in refusal.message


def test_a_refused_topic_is_logged_once_a_minute_per_topic() -> None:
    clock = FakeClock()
    p = policy(None, clock)
    logs = []
    for step_s, topic in [(0, "a"), (1, "a"), (1, "b"), (LOG_INTERVAL_S - 3, "a"), (1, "a")]:
        clock.now_s += step_s
        refusal = p.check(topic)
        assert refusal is not None  # every refusal is refused (and counted by the owner)
        logs.append(refusal.log)
    # a: logged at 0, not at 1, not at 58, logged again at 60 (a full minute later); b: first
    assert logs == [True, False, True, False, True]


def test_an_invalid_pattern_is_refused_at_construction() -> None:
    with pytest.raises(re.error):
        policy("replies.(")


def test_a_refusal_shows_the_pattern_as_the_operator_wrote_it() -> None:
    # repr() of the pattern doubled its backslashes (kbatch\\.replies.*).
    refusal = policy(r"kbatch\.replies\..*").check("billing.events")
    assert refusal is not None
    assert "--allowed-reply-topics 'kbatch\\.replies\\..*'" in refusal.message
    assert "\\\\" not in refusal.message
