"""The ``raw_tokenize_confluent`` loop of ``kbatch bench e2e``: ``raw_tokenize`` on confluent-kafka.

It does the work of ``raw_tokenize`` (:mod:`consumer.bench.e2e_workers`) with librdkafka
instead of aiokafka, so the two loops' CPU per request shows what the Kafka client itself
costs.

The loop is the one a user writes with confluent-kafka, in one thread that owns both clients:

- the consumer (``isolation.level=read_committed``, no auto-commit, ``auto.offset.reset=
  earliest``) wakes on the first record: ``poll(0.1)``, then ``consume(max_records - 1,
  timeout=0)`` takes what else is already fetched, at most ``max_records`` (500) a poll;
- each record's reply is handed to ``Producer.produce()`` with the reply headers the scorer
  built, then ``flush()`` waits for every delivery report of the poll (any failed delivery
  stops the worker, as a failed send does the aiokafka loops);
- then a synchronous ``commit()`` of the consumed positions.

The producer sends with ``acks=all``, ``enable.idempotence=true`` and ``linger.ms=2`` (as
kbatch's reply sink and the aiokafka loops do) and ``partitioner=murmur2_random``: Java's
murmur2 of the key, so a keyed reply lands on the partition aiokafka and the Java client pick
(librdkafka's default, ``consistent_random``, hashes with CRC32 and picks another partition for
many keys; tests/integration/test_partitioner_parity.py). librdkafka's defaults otherwise
(1 MB ``batch.size``).

Records reach the scorer as :data:`Polled` triples ``(key, value, headers)``; records that
carry an error (a partition's end, a topic that went away) are logged and skipped.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from schemas.records import OutRecord

__all__ = ["PRODUCER_CONFIG", "PollScorer", "Polled", "serve_confluent"]

log = logging.getLogger("kbatch.bench.e2e_confluent")

Polled = tuple[bytes | None, bytes, Sequence[tuple[str, bytes | None]]]
"""One consumed record as the bench's scorers read it: (key, value, headers)."""

PollScorer = Callable[[list[Polled]], list[OutRecord]]
"""A poll's records in, their replies out."""

PRODUCER_CONFIG: dict[str, str | int | bool] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 2,
    "partitioner": "murmur2_random",
}
"""The reply producer's settings besides ``bootstrap.servers`` (module docstring)."""

POLL_TIMEOUT_S = 0.1
"""How long one ``poll`` waits for a first record (and how soon a stop signal is seen)."""


def _polled(messages: Sequence[Message]) -> list[Polled]:
    out: list[Polled] = []
    for m in messages:
        error = m.error()
        if error is not None:
            log.warning("consume error on %s[%s]: %s", m.topic(), m.partition(), error)
            continue
        # A consumed record's headers are a list of (str, bytes | None); the dict form is
        # produce()'s only.
        headers = cast("list[tuple[str, bytes | None]]", m.headers() or [])
        out.append((m.key(), m.value() or b"", headers))
    return out


def serve_confluent(args: argparse.Namespace, score: PollScorer) -> None:
    """Run the loop (module docstring) until SIGTERM/SIGINT; ``args`` as
    :func:`consumer.bench.e2e_workers.main` parses them. Writes ``args.ready_file`` once the
    consumer owns its partitions.

    Raises:
        KafkaException: a reply was not delivered or a commit failed.
    """
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = Producer({"bootstrap.servers": args.bootstrap, **PRODUCER_CONFIG})
    failed: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failed.append(error)

    consumer.subscribe([args.request_topic])
    ready = False
    try:
        while not stopping:
            first = consumer.poll(POLL_TIMEOUT_S)
            if not ready and consumer.assignment():
                Path(args.ready_file).write_text("ready\n")
                ready = True
            if first is None:
                continue
            records = _polled([first, *consumer.consume(args.max_records - 1, timeout=0)])
            if not records:
                continue
            for out in score(records):
                producer.produce(
                    out.topic or args.reply_topic,
                    out.value,
                    out.key,
                    partition=-1 if out.partition is None else out.partition,
                    on_delivery=delivered,
                    headers=list(out.headers),
                )
            producer.flush()
            if failed:
                raise KafkaException(failed[0])
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
        producer.flush(10)
