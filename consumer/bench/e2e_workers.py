"""The two hand-written consumers of ``kbatch bench e2e``, each run as its own process.

``python -m consumer.bench.e2e_workers {naive,raw_loop} --bootstrap … --request-topic …
--reply-topic … --group-id … --ready-file PATH [--model DIR --threads N]``

Both read the request topic with ``isolation_level=read_committed`` (as ``kbatch serve`` does:
the benchmark releases its pre-filled requests by committing a transaction), in poll chunks of
at most ``--max-records`` (500, ``kbatch serve``'s ``poll_max_records``), and write one reply
per request to the reply topic with the request's key and ``kafka_correlationId``:

- ``naive`` — the "before" picture: each record of a poll is decoded, tokenized and scored on
  its own (``HFTokenizer.tokenize`` and ``ModelRunner.run`` on one item, in a worker thread so
  the consumer's heartbeats go on), its reply built with :class:`consumer.replies.ReplyBuilder`
  and sent; after the poll's records, every send is awaited and the poll's offsets committed.
- ``raw_loop`` — the Kafka ceiling: no decode, no model; each record is answered with one
  constant, valid ``ok`` reply (built once at start), the poll's sends awaited, then a commit.

Both produce with ``acks=all``, idempotence and ``linger_ms=2`` as kbatch's reply sink does,
but with aiokafka's defaults otherwise: a 16 KiB ``max_batch_size`` (the sink's is 256 KiB),
aiokafka's own key partitioner and request timeout. A reply is ~2 KiB, so a partition's
round trip carries fewer replies here than the sink's would.

Readiness: once the consumer owns its partitions (and, for ``naive``, the model is loaded and
warmed up) the worker writes ``--ready-file``. SIGTERM/SIGINT stop it after the current poll.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from schemas import headers as H
from schemas.codec import Encoding, encode_reply
from schemas.models import ModelInfo, Reply, Timing, result_from_map
from schemas.records import OutRecord

__all__ = ["main", "raw_reply_value"]

log = logging.getLogger("kbatch.bench.e2e_workers")

WORKERS = ("naive", "raw_loop")

# One record in, at most one reply out; a scorer turns a record into its reply (None: skip).
Scorer = Callable[[ConsumerRecord[bytes, bytes]], OutRecord | None]


def raw_reply_value() -> bytes:
    """The constant msgpack reply of ``raw_loop``: a valid ``ok`` embed reply (4 dims, a
    zero timing of a batch of one)."""
    reply = Reply(
        status="ok",
        result=result_from_map({"embedding": [0.5, 0.5, 0.5, 0.5], "dim": 4}),
        model=ModelInfo(name="raw_loop", revision=None),
        truncated=False,
        dedup=False,
        timing=Timing(queue_ms=0.0, infer_ms=0.0, batch_size=1, padded_len=1),
    )
    return encode_reply(reply, Encoding.MSGPACK)


def _raw_scorer() -> Scorer:
    value = raw_reply_value()
    fixed: list[tuple[str, bytes | None]] = [
        (H.CONTENT_TYPE, Encoding.MSGPACK.value.encode()),
        (H.STATUS, b"ok"),
    ]

    def score(record: ConsumerRecord[bytes, bytes]) -> OutRecord:
        headers: list[tuple[str, bytes | None]] = [
            (k, v) for k, v in record.headers if k == H.CORRELATION_ID
        ]
        return OutRecord(None, None, record.key, value, headers + fixed)

    return score


def _naive_scorer(model_dir: Path, threads: int, dlq_topic: str) -> Scorer:
    """Load the model and return a scorer that computes each record alone (batch of one)."""
    from consumer.batching.types import Batch, InferenceItem, ItemOutcome, Rejected
    from consumer.model.loader import load_runner
    from consumer.model.tokenize import HFTokenizer
    from consumer.model.torch_backend import configure_threads
    from consumer.replies import ReplyBuilder
    from schemas.records import RecordDecodeError, parse_request_record

    configure_threads(threads)
    runner = load_runner(model_dir)
    tokenizer = HFTokenizer(model_dir, max_length=runner.max_length)
    runner.warmup(1, runner.max_length)
    runner.warmup(1, 16)
    replies = ReplyBuilder(ModelInfo(name=model_dir.name, revision=None), dlq_topic)
    ids = iter(range(1 << 62))

    def score(record: ConsumerRecord[bytes, bytes]) -> OutRecord | None:
        try:
            parsed = parse_request_record(record.key, record.value, tuple(record.headers))
        except RecordDecodeError:
            return None  # the benchmark sends only valid requests
        now = time.monotonic()
        item = InferenceItem(next(ids), parsed.request.text, parsed.request.truncate, now)
        (tok,) = tokenizer.tokenize([item])
        if isinstance(tok, Rejected):
            outcome = ItemOutcome(
                item.item_id, "error", None, str(tok.error_code), tok.error_message,
                False, tok.n_tokens, 0.0, 0.0, 0, 0,
            )  # fmt: skip
        else:
            (run,) = runner.run(Batch([tok], tok.n_tokens, now))
            ok = run.result is not None and run.error_code is None
            outcome = ItemOutcome(
                item.item_id, "ok" if ok else "error", run.result,
                None if ok else str(run.error_code), run.error_message, tok.truncated,
                tok.n_tokens, 0.0, run.infer_ms, run.batch_size, run.padded_len,
            )  # fmt: skip
        return replies.from_outcome(parsed, outcome, dedup=False)

    return score


async def _serve(args: argparse.Namespace, score: Scorer, in_thread: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    consumer = AIOKafkaConsumer(
        args.request_topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    # acks/idempotence/linger as the reply sink (consumer/kafka/sink.py); the rest aiokafka's
    # defaults (16 KiB batches): see the module docstring.
    producer = AIOKafkaProducer(
        bootstrap_servers=args.bootstrap, acks="all", enable_idempotence=True, linger_ms=2
    )
    await producer.start()
    await consumer.start()
    try:
        while not consumer.assignment() and not stop.is_set():
            await asyncio.sleep(0.02)
        Path(args.ready_file).write_text("ready\n")
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=50, max_records=args.max_records)
            records = [r for rs in batches.values() for r in rs]
            if not records:
                continue
            acks: list[asyncio.Future[Any]] = []
            for record in records:
                out = await asyncio.to_thread(score, record) if in_thread else score(record)
                if out is None:
                    continue
                acks.append(
                    await producer.send(
                        out.topic or args.reply_topic,
                        out.value,
                        key=out.key,
                        partition=out.partition,
                        headers=out.headers,
                    )
                )
            await asyncio.gather(*acks)
            await consumer.commit()
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
        with contextlib.suppress(Exception):
            await producer.stop()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m consumer.bench.e2e_workers")
    p.add_argument("worker", choices=WORKERS)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--request-topic", required=True)
    p.add_argument("--reply-topic", required=True)
    p.add_argument("--dlq-topic", default="kbatch.requests.dlq")
    p.add_argument("--group-id", required=True)
    p.add_argument("--ready-file", required=True)
    p.add_argument("--model", type=Path, default=None, help="naive: the model directory")
    p.add_argument("--threads", type=int, default=2, help="naive: torch intra-op threads")
    p.add_argument("--max-records", type=int, default=500, help="most records per poll")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point (see the module docstring)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    args = _parse(argv)
    if args.worker == "naive":
        if args.model is None:
            raise SystemExit("naive needs --model")
        scorer = _naive_scorer(args.model, args.threads, args.dlq_topic)
        asyncio.run(_serve(args, scorer, in_thread=True))
    else:
        asyncio.run(_serve(args, _raw_scorer(), in_thread=False))


if __name__ == "__main__":
    main()
