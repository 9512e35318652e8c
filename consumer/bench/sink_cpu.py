"""CPU per record of the two reply sinks: :class:`consumer.kafka.sink.KafkaSink` (aiokafka)
and :class:`consumer.kafka.confluent_adapter.sink.ConfluentSink` (librdkafka), same run.

Each sink sends ``records`` keyed records (``value_bytes`` each, two headers) to a fresh topic
in calls of ``per_call`` and awaits every acknowledgement; ``time.process_time`` around that
(every thread of the process: the loop, the poller, librdkafka's own) divided by the count is
the figure. Run: ``python -m consumer.bench.sink_cpu --bootstrap 127.0.0.1:9092``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

from consumer.kafka.admin import create_topics, delete_topics
from consumer.kafka.config import KafkaClientSettings, SinkSettings
from consumer.kafka.confluent_adapter.sink import ConfluentSink
from consumer.kafka.sink import KafkaSink
from schemas.records import OutRecord

__all__ = ["measure"]


async def measure(
    bootstrap: str,
    records: int = 20_000,
    value_bytes: int = 1536,
    per_call: int = 64,
    rounds: int = 3,
) -> dict[str, float]:
    """CPU µs per record sent and acknowledged, per sink (``aiokafka``, ``confluent``): the
    least of ``rounds`` (the least disturbed by other processes), the sinks alternating."""
    client = KafkaClientSettings.model_validate({"bootstrap": bootstrap})
    topic = f"bench.sink.{uuid.uuid4().hex[:10]}"
    await create_topics(bootstrap, [topic], partitions=4)
    value = b"v" * value_bytes
    batch = [
        OutRecord(
            topic=None,
            partition=None,
            key=f"req-{i}".encode(),
            value=value,
            headers=[("kafka_correlationId", b"c-%d" % i), ("content-type", b"application/json")],
        )
        for i in range(per_call)
    ]
    out: dict[str, float] = {}
    try:
        for _ in range(rounds):
            for name, cls in (("aiokafka", KafkaSink), ("confluent", ConfluentSink)):
                sink = cls(client, SinkSettings.model_validate({}), default_topic=topic)
                await sink.start()
                await asyncio.gather(*await sink.send(batch))  # warm: metadata, producer id
                started = time.process_time()
                acks = []
                for _ in range(records // per_call):
                    acks.extend(await sink.send(batch))
                await asyncio.gather(*acks)
                spent_us = (time.process_time() - started) / (records // per_call * per_call) * 1e6
                out[name] = min(out.get(name, spent_us), spent_us)
                await sink.stop()
    finally:
        await delete_topics(bootstrap, [topic])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    for name, us in asyncio.run(measure(args.bootstrap, args.records)).items():
        print(f"{name}: {us:.1f} CPU µs per record")


if __name__ == "__main__":
    main()
