""":class:`TransactionalSink` on the real broker: a commit makes replies, offset and kb1 metadata
visible together; a new owner of the partition fences the old one; a close aborts."""

from __future__ import annotations

import pytest

from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.errors import TransactionError
from consumer.kafka.transactions import TransactionalSink
from schemas.records import OutRecord
from tests.conftest import TopicFactory, unique_group
from tests.integration.harness import committed_offsets, read_committed

pytestmark = pytest.mark.integration


def sink(bootstrap: str, out: str, group: str) -> TransactionalSink:
    return TransactionalSink(
        KafkaClientSettings(bootstrap=bootstrap),
        SinkSettings(),
        default_topic=out,
        group_id=group,
        id_prefix="test",
    )


def replies(*values: bytes) -> list[OutRecord]:
    return [OutRecord(topic=None, partition=None, key=v, value=v, headers=[]) for v in values]


async def test_commit_fence_and_abort(kafka_bootstrap: str, new_topic: TopicFactory) -> None:
    src, out = await new_topic("txn-src"), await new_topic("txn-out")
    group = unique_group("txn")
    tp = (src, 0)
    old = sink(kafka_bootstrap, out, group)
    await old.open(tp)
    try:
        for ack in await old.send_from(tp, replies(b"a", b"b")):
            await ack
        assert await old.commit({tp: 2}, {tp: "kb1:x"}) == {tp: 2}
        for ack in await old.send_from(tp, replies(b"zombie")):
            await ack  # written, in a transaction that never commits
        new = sink(kafka_bootstrap, out, group)
        await new.open(tp)  # the partition's next owner: fences the old producer
        try:
            with pytest.raises(TransactionError) as caught:
                await old.commit({tp: 3}, {tp: ""})
            assert caught.value.committed == {}
            assert tp not in old.open_partitions
            for ack in await new.send_from(tp, replies(b"c")):
                await ack
            await new.commit({tp: 3}, {tp: ""})
            for ack in await new.send_from(tp, replies(b"aborted")):
                await ack
            await new.close(tp)  # what was sent since the last commit is aborted
        finally:
            await new.stop()
    finally:
        await old.stop()
    seen = [r.key for r in await read_committed(kafka_bootstrap, out, 1, decode=False)]
    assert seen == [b"a", b"b", b"c"]
    assert await committed_offsets(kafka_bootstrap, group, src, 1) == {0: 3}
