"""Which reply topics a request may name: the operator's allow-list (``--allowed-reply-topics``).

Pure (no Kafka, no I/O): :meth:`ReplyTopicPolicy.check` decides; serve's
:class:`~consumer.serve.outbox.Outbox`, where every reply leaves, asks it for every record read
(one that fails to decode too: its error reply is a reply), dead-letters a refused record
(``reply_topic_not_allowed``) and logs when the decision says so.

Why: without it, anyone who may write to the request topic can make kbatch write into any topic
kbatch's principal may write to — a confused deputy (one record is enough to write into
a topic kbatch was never configured for). Rules, in order:

1. no ``kafka_replyTopic``: the configured reply topic, always allowed;
2. never the request topic, the dead-letter topic or an internal topic (a name starting ``__``,
   Kafka's ``__consumer_offsets``, ``__transaction_state``), whatever the pattern says;
3. the configured reply topic is allowed;
4. else the name must match the operator's pattern in full (:func:`re.fullmatch`); with no
   pattern, nothing else is allowed.

A refused topic is logged at most once per :data:`LOG_INTERVAL_S` per topic (a client sending
thousands of such requests must not flood the log); the metric counts every refusal.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LOG_INTERVAL_S", "ReplyTopicPolicy", "ReplyTopicRefusal"]

LOG_INTERVAL_S = 60.0
"""Seconds between two log lines about the same refused topic."""

_MAX_REMEMBERED_TOPICS = 10_000
"""Refused topics whose last log time is kept (names come from clients: bounded)."""


@dataclass(frozen=True, slots=True)
class ReplyTopicRefusal:
    """A refused ``kafka_replyTopic``: ``message`` for the dead letter's
    ``kbatch.error.message`` (names the topic and the rule); ``log``: whether this refusal is
    the first of its topic in :data:`LOG_INTERVAL_S` (the owner logs it then)."""

    message: str
    log: bool


class ReplyTopicPolicy:
    """Decides whether a request's ``kafka_replyTopic`` may get kbatch's reply.

    Args:
        reply_topic: the configured reply topic (``--reply-topic``), always allowed.
        request_topic: never allowed (a reply there would be read back as a request).
        dlq_topic: never allowed.
        allowed_pattern: a regular expression the whole topic name must match
            (``--allowed-reply-topics``); None: only ``reply_topic``.
        clock: monotonic seconds (the log rate limit).

    Raises:
        re.error: ``allowed_pattern`` is not a valid regular expression.
    """

    def __init__(
        self,
        *,
        reply_topic: str,
        request_topic: str,
        dlq_topic: str,
        allowed_pattern: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reply_topic = reply_topic
        self._never = frozenset({request_topic, dlq_topic})
        self._pattern = re.compile(allowed_pattern) if allowed_pattern is not None else None
        self._clock = clock
        self._last_logged: dict[str, float] = {}

    def _rule(self, topic: str) -> str | None:
        """Why ``topic`` is refused, or None when it is allowed."""
        if topic.startswith("__"):
            return "internal topics (__*) never get replies"
        if topic in self._never:
            return "the request and dead-letter topics never get replies"
        if topic == self._reply_topic:
            return None
        if self._pattern is None:
            return f"only the configured reply topic {self._reply_topic!r} is allowed"
        if self._pattern.fullmatch(topic) is None:
            # As the operator wrote it: repr() would double each backslash (kbatch\\.x).
            return f"it does not match --allowed-reply-topics '{self._pattern.pattern}'"
        return None

    def check(self, topic: str | None) -> ReplyTopicRefusal | None:
        """None when a reply may go to ``topic`` (None: the configured reply topic); else the
        refusal."""
        if topic is None or topic == self._reply_topic:
            return None
        rule = self._rule(topic)
        if rule is None:
            return None
        now = self._clock()
        last = self._last_logged.get(topic)
        log = last is None or now - last >= LOG_INTERVAL_S
        if log:
            if len(self._last_logged) >= _MAX_REMEMBERED_TOPICS:
                self._last_logged.clear()
            self._last_logged[topic] = now
        return ReplyTopicRefusal(f"reply topic {topic!r} is not allowed: {rule}", log)
