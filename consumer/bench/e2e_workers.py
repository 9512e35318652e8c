"""The hand-written consumers of ``kbatch bench e2e``, each run as its own process.

``python -m consumer.bench.e2e_workers WORKER --bootstrap … --request-topic … --reply-topic …
--group-id … --ready-file PATH [--model DIR --threads N]`` (WORKER one of :data:`WORKERS`)

Each reads the request topic with ``isolation_level=read_committed`` (as ``kbatch serve`` does:
the benchmark releases its pre-filled requests by committing a transaction), in poll chunks of
at most ``--max-records`` (500, ``kbatch serve``'s ``poll_max_records``), and write one reply
per request to the reply topic with the request's key and ``kafka_correlationId``:

- ``naive`` — the honest "before" picture, written as a user writes it without kbatch: each
  record of a poll is decoded with msgpack, embedded on its own with plain transformers
  (:class:`consumer.model.baselines.PlainModel`: tokenizer, model, mean pooling, normalise),
  called inline; its reply (``{"status": "ok", "result": {"embedding", "dim"}}`` in msgpack,
  the correlation id and ``kbatch-status`` headers) sent; after the poll's records, every send
  is awaited and the poll's offsets committed.
- ``raw_loop`` — the Kafka ceiling: no decode, no model; each record is answered with one
  constant, valid ``ok`` reply (built once at start), the poll's sends awaited, then a commit.
- ``raw_tokenize`` — the host path a user writes around an accelerator, the yardstick of
  kbatch's host CPU per request: each poll's records decoded with msgpack, their
  texts tokenized in one ``encode_batch`` of the model's fast tokenizer (truncated to its
  maximum length), and each answered with a 384-float embedding reply packed with msgpack
  (what ``kbatch serve --model sim:…`` answers), the sends awaited, then a commit. No model,
  no batching policy, no dedup, no metrics. It tokenizes without a Rayon pool
  (``TOKENIZERS_PARALLELISM=false``), as ``kbatch serve`` does on an accelerator host of this
  size (docs/CPU.md): with Rayon's default pool the loop also pays for its spin-waiting
  threads (~0.08 ms a request at 1,000/s here), which would flatter kbatch.
- ``raw_tokenize_confluent`` — ``raw_tokenize``'s work on confluent-kafka (librdkafka) in one
  thread instead of aiokafka on an event loop (:mod:`consumer.bench.e2e_confluent`, where its
  client settings are): the same host path with the other Kafka client.

The aiokafka loops produce with ``acks=all``, idempotence and ``linger_ms=2`` as kbatch's
reply sink does, but with aiokafka's defaults otherwise: a 16 KiB ``max_batch_size`` (the
sink's is 256 KiB), aiokafka's own key partitioner and request timeout. A reply is ~2 KiB, so
a partition's round trip carries fewer replies here than the sink's would.

Readiness: once the consumer owns its partitions (and, for ``naive``, the model is loaded and
warmed up) the worker writes ``--ready-file``. SIGTERM/SIGINT stop it after the current poll.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from consumer.bench.e2e_confluent import Polled, PollScorer, serve_confluent
from schemas import headers as H
from schemas.codec import Encoding, encode_reply
from schemas.models import ModelInfo, Reply, Timing, result_from_map
from schemas.records import OutRecord

__all__ = ["main", "raw_reply_value"]

log = logging.getLogger("kbatch.bench.e2e_workers")

WORKERS = ("naive", "raw_loop", "raw_tokenize", "raw_tokenize_confluent")

# One record (key, value, headers) in, at most one reply out (None: skip). A PollScorer takes
# a poll's records at once (raw_tokenize works per poll, as a user's loop would).
Scorer = Callable[[Polled], OutRecord | None]


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

    def score(record: Polled) -> OutRecord:
        key, _value, in_headers = record
        headers: list[tuple[str, bytes | None]] = [
            (k, v) for k, v in in_headers if k == H.CORRELATION_ID
        ]
        return OutRecord(None, None, key, value, headers + fixed)

    return score


def _naive_scorer(model_dir: Path, threads: int | None) -> Scorer:
    """The loop a user writes without kbatch: msgpack in, plain transformers (tokenizer, model,
    mean pooling, normalise: :class:`consumer.model.baselines.PlainModel`) on each text alone,
    msgpack out. No kbatch batching, tokenizer, runner or reply builder."""
    import msgpack

    from consumer.model.baselines import PlainModel

    model = PlainModel(model_dir, threads=threads)
    model.embed(["warm up"])

    def score(record: Polled) -> OutRecord | None:
        key, value, in_headers = record
        start = time.perf_counter()
        request = msgpack.unpackb(value)
        vector = model.embed([request["text"]])[0].tolist()
        infer_ms = (time.perf_counter() - start) * 1000.0
        # The contract's ok reply (docs/CONTRACT.md), written out by hand.
        reply = {
            "status": "ok",
            "result": {"embedding": vector, "dim": len(vector)},
            "model": {"name": model_dir.name, "revision": None},
            "truncated": False,
            "dedup": False,
            "timing": {"queue_ms": 0.0, "infer_ms": infer_ms, "batch_size": 1, "padded_len": 0},
        }
        headers = [(k, v) for k, v in in_headers if k == H.CORRELATION_ID]
        headers += [(H.STATUS, b"ok"), (H.CONTENT_TYPE, b"application/msgpack")]
        return OutRecord(None, None, key, msgpack.packb(reply), headers)

    return score


def _tokenize_scorer(model_dir: Path, dim: int = 384) -> PollScorer:
    """``raw_tokenize`` and ``raw_tokenize_confluent`` (module docstring): msgpack in, one
    ``encode_batch`` per poll, a ``dim``-float embedding reply per record in msgpack."""
    import msgpack
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    vector = [0.05] * dim

    def score(records: list[Polled]) -> list[OutRecord]:
        requests = [msgpack.unpackb(value) for _key, value, _headers in records]
        encodings = tokenizer.encode_batch([q["text"] for q in requests])
        out = []
        for (key, _value, in_headers), enc in zip(records, encodings, strict=True):
            reply = {
                "status": "ok",
                "result": {"embedding": vector, "dim": dim},
                "model": {"name": model_dir.name, "revision": None},
                "truncated": False,
                "dedup": False,
                "timing": {"queue_ms": 0.0, "infer_ms": 0.0, "batch_size": len(records),
                           "padded_len": len(enc.ids)},
            }  # fmt: skip
            headers = [(k, v) for k, v in in_headers if k == H.CORRELATION_ID]
            headers += [(H.STATUS, b"ok"), (H.CONTENT_TYPE, b"application/msgpack")]
            out.append(OutRecord(None, None, key, msgpack.packb(reply), headers))
        return out

    return score


def _per_record(score: Scorer) -> PollScorer:
    def score_poll(records: list[Polled]) -> list[OutRecord]:
        return [out for r in records if (out := score(r)) is not None]

    return score_poll


async def _serve(args: argparse.Namespace, score: PollScorer) -> None:
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
            records: list[Polled] = [
                (r.key, r.value, r.headers) for rs in batches.values() for r in rs
            ]
            if not records:
                continue
            acks: list[asyncio.Future[Any]] = []
            for out in score(records):
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
    p.add_argument(
        "--threads", type=int, default=None, help="naive: torch intra-op threads (torch's default)"
    )
    p.add_argument("--max-records", type=int, default=500, help="most records per poll")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point (see the module docstring)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    args = _parse(argv)
    if args.worker == "naive":
        if args.model is None:
            raise SystemExit("naive needs --model")
        # A user's loop calls the model inline, blocking the event loop for one forward
        # (≈ 10-20 ms; aiokafka's heartbeats tolerate that).
        asyncio.run(_serve(args, _per_record(_naive_scorer(args.model, args.threads))))
    elif args.worker in ("raw_tokenize", "raw_tokenize_confluent"):
        if args.model is None:
            raise SystemExit(f"{args.worker} needs --model")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before the first encode_batch
        if args.worker == "raw_tokenize":
            asyncio.run(_serve(args, _tokenize_scorer(args.model)))
        else:
            serve_confluent(args, _tokenize_scorer(args.model))
    else:
        asyncio.run(_serve(args, _per_record(_raw_scorer())))


if __name__ == "__main__":
    main()
