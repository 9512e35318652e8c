"""Drive a real ``kbatch serve`` process against the real broker, as a client would.

Nothing here is mocked: requests go through Kafka in the contract's encodings, replies are read
back from the reply topic, the service's state is read from its ``/metrics`` endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from schemas.codec import Encoding, decode_reply, encode_request
from schemas.models import Reply, Request

KBATCH = str(Path(sys.executable).with_name("kbatch"))
KAFKA_CLIENT = os.environ.get("KBATCH_KAFKA_CLIENT", "aiokafka")
"""The Kafka client the kbatch processes of a test run use (``KBATCH_KAFKA_CLIENT``, which
they inherit; ``make test`` runs the Kafka-semantics tests once per client)."""


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_pair() -> int:
    """A port ``p`` with ``p + 1`` free too (a local broker and its controller listener)."""
    for _ in range(50):
        port = free_port()
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port + 1))
            return port
    raise AssertionError("no free port pair on 127.0.0.1")


def poll_until(
    predicate: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.1
) -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


@dataclass
class ServeProcess:
    """One ``kbatch serve`` subprocess with its own metrics port and log file."""

    args: list[str]
    log_path: Path
    metrics_port: int
    proc: subprocess.Popen[bytes] | None = None
    peak_rss_bytes: int = 0
    env_drop: tuple[str, ...] = ()
    """Variables of this process's environment the server does not inherit."""

    @classmethod
    def start(
        cls,
        tmp_path: Path,
        *,
        bootstrap: str,
        request_topic: str,
        reply_topic: str,
        dlq_topic: str,
        group_id: str,
        model: str,
        task: str = "embed",
        name: str = "serve",
        extra: Sequence[str] = (),
        torch_threads: int | None = 1,
        prefix: Sequence[str] = (),
        env_drop: Sequence[str] = (),
    ) -> ServeProcess:
        """Start ``kbatch serve`` (under the command ``prefix``, e.g. a cgroup runner);
        ``torch_threads`` None leaves the thread counts to the CPU budget plan; ``env_drop``:
        variables of the test process's environment it does not inherit."""
        port = free_port()
        threads = () if torch_threads is None else ("--torch-threads", str(torch_threads))
        args = [
            *prefix,
            KBATCH, "serve",
            "--bootstrap", bootstrap,
            "--request-topic", request_topic,
            "--reply-topic", reply_topic,
            "--dlq-topic", dlq_topic,
            "--group-id", group_id,
            "--model", model,
            "--task", task,
            "--metrics-port", str(port),
            *threads,
            "--session-timeout-ms", "10000",
            "--heartbeat-interval-ms", "1000",
            "--commit-interval-ms", "200",
            *extra,
        ]  # fmt: skip
        log_path = tmp_path / f"{name}.log"
        server = cls(args=args, log_path=log_path, metrics_port=port, env_drop=tuple(env_drop))
        server.launch()
        return server

    def launch(self) -> None:
        """(Re)start the process with the same arguments."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    **{k: v for k, v in os.environ.items() if k not in self.env_drop},
                    "PYTHONUNBUFFERED": "1",
                },
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}{path}", timeout=2
            ) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()
        except OSError:
            return 0, b""

    def ready(self) -> bool:
        """``/readyz`` answers 200 (assigned, engine warm, not wedged)."""
        self.sample_rss()
        return self._get("/readyz")[0] == 200

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Poll ``/readyz`` until ready; fail early when the process died."""

        def check() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"kbatch serve exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            return self.ready()

        poll_until(check, timeout_s, "kbatch serve /readyz")

    def readyz(self) -> dict[str, Any]:
        """The ``/readyz`` body (under ``--replicas``: each replica's pid, readiness, restarts);
        ``{}`` while nothing answers yet."""
        code, body = self._get("/readyz")
        if code == 0:
            return {}
        assert code in (200, 503), f"/readyz answered {code}"
        detail: dict[str, Any] = json.loads(body)
        return detail

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics`` as ``name{label="v",…}`` → value."""
        code, body = self._get("/metrics")
        assert code == 200, f"/metrics answered {code}"
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def sample_rss(self) -> int:
        """Current RSS of the process (bytes); keeps the peak seen."""
        try:
            rss = int(psutil.Process(self.pid).memory_info().rss)
        except psutil.Error:
            return 0
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        return rss

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 60) -> int:
        """Wait for exit; the exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout_s)

    def stop(self) -> None:
        """Best-effort cleanup: SIGTERM, then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, n: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


# ---- client side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    """One request record to produce."""

    key: bytes | None
    value: bytes | None  # None: a tombstone
    headers: tuple[tuple[str, bytes | None], ...] = ()
    partition: int | None = None


def request(
    key: str | bytes | None, text: str, encoding: Encoding = Encoding.MSGPACK, **fields: object
) -> Req:
    """A valid request record in ``encoding`` (content-type header set for JSON)."""
    value = encode_request(Request.model_validate({"text": text, **fields}), encoding)
    headers: tuple[tuple[str, bytes], ...] = ()
    if encoding is Encoding.JSON:
        headers = (("content-type", b"application/json"),)
    raw_key = key.encode() if isinstance(key, str) else key
    return Req(raw_key, value, headers)


async def produce(bootstrap: str, topic: str, records: Iterable[Req]) -> int:
    """Produce and wait for every acknowledgement; the number sent."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic, r.value, key=r.key, headers=list(r.headers), partition=r.partition
            )
            for r in records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(futures)


@dataclass(frozen=True)
class ReplyRecord:
    """One record read back from a reply topic."""

    key: bytes | None
    partition: int
    offset: int
    headers: dict[str, bytes]
    raw: bytes
    reply: Reply


@dataclass
class Collected:
    replies: list[ReplyRecord] = field(default_factory=list)

    def by_key(self) -> dict[bytes | None, list[ReplyRecord]]:
        out: dict[bytes | None, list[ReplyRecord]] = {}
        for r in self.replies:
            out.setdefault(r.key, []).append(r)
        return out


async def read_topic(
    bootstrap: str,
    topic: str,
    until: Callable[[list[ReplyRecord]], bool],
    timeout_s: float,
    decode: bool = True,
) -> list[ReplyRecord]:
    """Read ``topic`` from the beginning until ``until(records)`` or ``timeout_s`` passes.

    Raises:
        AssertionError: the condition did not hold in time (with what was read).
    """
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[ReplyRecord] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not until(out):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s}s on {topic}: read {len(out)} records"
                )
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                out.extend(_reply_record(r, decode) for r in records)
    finally:
        await consumer.stop()
    return out


def _reply_record(r: Any, decode: bool) -> ReplyRecord:
    """One consumed aiokafka ``ConsumerRecord`` as a :class:`ReplyRecord` (value decoded as a
    reply when ``decode``)."""
    headers = {k: v for k, v in r.headers}
    reply = _decode(r.value or b"", headers) if decode else Reply.model_construct()
    return ReplyRecord(r.key, r.partition, r.offset, headers, r.value or b"", reply)


def _decode(value: bytes, headers: dict[str, bytes]) -> Reply:
    ct = headers.get("content-type", b"application/msgpack")
    encoding = Encoding.JSON if ct == b"application/json" else Encoding.MSGPACK
    return decode_reply(value, encoding)


async def committed_offsets(
    bootstrap: str, group: str, topic: str, partitions: int
) -> dict[int, int | None]:
    """The group's committed offset per partition (None when none)."""
    from aiokafka import TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()


def kill(server: ServeProcess) -> None:
    """SIGKILL, no chance to clean up (kill -9)."""
    os.kill(server.pid, signal.SIGKILL)
    server.wait(30)


async def read_all(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 30, decode: bool = True
) -> list[ReplyRecord]:
    """Every record in ``topic`` now: reads until each partition's end offset taken at start."""
    from aiokafka import TopicPartition

    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        ends = await probe.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await probe.stop()
    total = sum(ends.values())
    return await read_topic(bootstrap, topic, lambda rs: len(rs) >= total, timeout_s, decode=decode)


async def read_committed(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 30, decode: bool = True
) -> list[ReplyRecord]:
    """Every record of ``topic`` a ``read_committed`` reader sees now: reads each partition up
    to its last stable offset taken at start (records of open or aborted transactions are
    never returned; transaction markers are stepped over)."""
    from aiokafka import TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    out: list[ReplyRecord] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)  # the last stable offsets (read_committed)
        deadline = time.monotonic() + timeout_s
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"{topic} not read to {ends} in {timeout_s} s"
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(_reply_record(r, decode) for r in records)
    finally:
        await consumer.stop()
    return out
