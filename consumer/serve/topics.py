"""serve's topics at start-up: created with ``--create-topics`` (the default), else checked.

With ``--no-create-topics`` kbatch creates nothing and the operator makes the topics. A
missing request topic used to show only as aiokafka's "Topic … not found in cluster metadata",
now a WARNING a minute (:mod:`consumer.kafka.log_levels`), and serve waited without a word of
its own. Now one ERROR line names each missing topic at start; serve still waits for them, as
a Kafka consumer subscribed to a topic that does not exist yet does. A topic this principal may
not describe is not called missing: its denial is reported where it is used (the first poll,
the first reply). A replica of ``serve --replicas N`` leaves the check to its supervisor (one
line, not N + 1).
"""

from __future__ import annotations

import logging

from consumer.config import ServeSettings
from consumer.kafka.admin import ensure_topics, missing_topics
from consumer.kafka.client_config import security_kwargs
from consumer.lifecycle import supervisor_pid

__all__ = ["prepare_topics"]

log = logging.getLogger("kbatch.serve")


async def prepare_topics(settings: ServeSettings) -> None:
    """Create the request, reply and dead-letter topics (``--create-topics``), or say which
    of them do not exist (``--no-create-topics``).

    Raises:
        KafkaUnavailableError: no broker answered; KafkaSecurityError: an unreadable CA, key
            or password file, a refused login. TopicCreationError: the broker refused.
    """
    security = security_kwargs(settings)  # an unreadable CA, key or password file: now
    partitions = {
        settings.request_topic: settings.topic_partitions,
        settings.reply_topic: settings.topic_partitions,
        settings.dead_letter_topic: 1,
    }
    if settings.create_topics:
        created = await ensure_topics(
            settings.bootstrap, partitions, settings.topic_replication_factor, security
        )
        if created:
            log.info("created topics %s", created)
        return
    if supervisor_pid() is not None:
        return
    missing = await missing_topics(settings.bootstrap, list(partitions), security)
    if missing:
        log.error(
            "topic%s %s do%s not exist, and --no-create-topics leaves creating them to you: "
            "serve waits for them (the request topic: nothing is consumed until it exists)",
            "s" if len(missing) > 1 else "",
            ", ".join(repr(t) for t in missing),
            "" if len(missing) > 1 else "es",
        )
