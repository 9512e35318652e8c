"""A created topic is usable when creation returns: the broker's metadata lists it, each
partition with a leader (``consumer.kafka.admin.TOPIC_VISIBLE_TIMEOUT_S``). Without the wait,
a Metadata request right after CreateTopics could say ``UNKNOWN_TOPIC_OR_PARTITION`` (a range
reader listing a new topic's partitions was told it did not exist)."""

from __future__ import annotations

import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from consumer.kafka.admin import create_topics, delete_topics, ensure_topics

pytestmark = pytest.mark.integration


async def test_a_topic_is_in_the_metadata_with_leaders_when_its_creation_returns(
    kafka_bootstrap: str,
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    names: list[str] = []
    try:
        for i in range(16):  # half of them by each way of creating topics
            name = f"test.visible.{uuid.uuid4().hex[:10]}"
            names.append(name)
            if i % 2:
                await create_topics(kafka_bootstrap, [name], partitions=3)
            else:
                assert await ensure_topics(kafka_bootstrap, {name: 3}, replication_factor=1) == [
                    name
                ]
            (described,) = await admin.describe_topics([name])
            assert described["error_code"] == 0, (i, described)
            assert sorted(p["partition"] for p in described["partitions"]) == [0, 1, 2]
            assert all(p["leader"] >= 0 for p in described["partitions"]), described
    finally:
        await admin.close()
        await delete_topics(kafka_bootstrap, names)
