"""serve's topics at start-up: created with ``--create-topics`` (the default), else checked.

With ``--no-create-topics`` kbatch creates nothing and the operator makes the topics:

- **a missing request topic** is one ERROR line, and serve waits for it, as a Kafka consumer
  subscribed to a topic that does not exist yet does (it is seen within the consumer's 30 s
  metadata refresh). Before, only aiokafka's "Topic … not found in cluster metadata" said so,
  now a WARNING a minute (:mod:`consumer.kafka.log_levels`).
- **a missing reply or dead-letter topic** stops serve at start (exit 1, one ERROR line): a
  request consumed then would have nowhere to go. Its reply and its dead letter would both be
  refused, and the record counted as answered and committed: lost (merely naming the missing topics
  would lose the request so).

A topic this principal may not describe is not called missing: its denial is reported where it
is used (the first poll, the first reply). A replica of ``serve --replicas N`` leaves the check
to its supervisor (one line, not N + 1).
"""

from __future__ import annotations

import logging

from consumer.config import ServeSettings
from consumer.kafka.admin import ensure_topics, missing_topics
from consumer.kafka.client_config import security_kwargs
from consumer.kafka.errors import TopicMissingError
from consumer.lifecycle import supervisor_pid

__all__ = ["prepare_topics"]

log = logging.getLogger("kbatch.serve")


async def prepare_topics(settings: ServeSettings) -> None:
    """Create the request, reply and dead-letter topics (``--create-topics``), or check that
    they exist (``--no-create-topics``; see the module docstring).

    Raises:
        KafkaUnavailableError: no broker answered; KafkaSecurityError: an unreadable CA, key
            or password file, a refused login. TopicCreationError: the broker refused to
            create one; TopicMissingError: ``--no-create-topics`` and the reply or dead-letter
            topic does not exist.
    """
    security = security_kwargs(settings)  # an unreadable CA, key or password file: now
    partitions = {
        settings.request_topic: settings.topic_partitions,
        settings.reply_topic: settings.topic_partitions,
        settings.dead_letter_topic: 1,
    }
    if settings.create_topics:
        # logs what it created, with the replicas, and a WARNING when they are too few
        await ensure_topics(
            settings.bootstrap, partitions, settings.topic_replication_factor, security
        )
        return
    if supervisor_pid() is not None:
        return
    missing = await missing_topics(settings.bootstrap, list(partitions), security)
    written = [t for t in missing if t != settings.request_topic]
    if written:
        raise TopicMissingError(
            f"{_topics(missing)} with --no-create-topics: create "
            f"{'them' if len(missing) > 1 else 'it'}, then start serve (a request consumed "
            "without its reply or dead-letter topic would be lost)"
        )
    if missing:
        log.error(
            "%s with --no-create-topics: serve waits for it (nothing is consumed until it "
            "exists; it is seen within 30 s of its creation)",
            _topics(missing),
        )


def _topics(missing: list[str]) -> str:
    """``"topic 'a' does not exist"`` or ``"topics 'a', 'b' do not exist"``."""
    names = ", ".join(repr(t) for t in missing)
    return f"topics {names} do not exist" if len(missing) > 1 else f"topic {names} does not exist"
