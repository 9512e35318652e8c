"""An asyncio TCP proxy in front of each broker: cut, delay, bandwidth limit.

The brokers of a :class:`consumer.broker.cluster.LocalCluster` advertise the proxies' ports
(``advertised_ports``), so every connection of kbatch and of the test clients goes through a
proxy, while replication between brokers (the ``INTERNAL`` listener) does not.

Faults, applied to every link of every proxy at once (:class:`LinkFaults`):

- **cut**: nothing is forwarded in either direction and new connections are held, as a network
  partition where TCP retransmits: the bytes wait, clients time out on their own. ``heal()``
  lets the held bytes through (unless the client gave up and closed the socket).
- **delay**: each chunk is forwarded ``delay_s`` after it was read (added latency, order kept,
  throughput unchanged).
- **bandwidth**: at most ``bytes_per_s`` per direction per link (a token bucket,
  :class:`TokenBucket`).
- ``reset()`` closes every open connection (as a middlebox's RST).

The proxies run on their own event loop in a daemon thread, so a test may block its own loop
(``poll_until``) without freezing the network. The pure parts (:class:`TokenBucket`,
:func:`forward_at`) are unit-tested in ``tests/unit/test_chaos_proxy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

CHUNK_BYTES = 64 * 1024


@dataclass
class TokenBucket:
    """``rate`` bytes per second with at most ``burst`` bytes saved up (pure; the caller passes
    the monotonic time ``now`` in seconds).

    :meth:`take` returns how long to wait before sending ``n`` bytes (0.0 when they may go now);
    the bytes are charged at once, so the next caller waits behind them.
    """

    rate: float
    burst: float
    tokens: float = 0.0
    last: float | None = None

    def take(self, n: int, now: float) -> float:
        if self.last is None:
            self.tokens, self.last = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        self.tokens -= n
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


def forward_at(read_at: float, delay_s: float, previous_at: float) -> float:
    """When a chunk read at ``read_at`` is forwarded under ``delay_s`` of added latency, never
    before the chunk read before it (``previous_at``): order is kept."""
    return max(read_at + delay_s, previous_at)


@dataclass
class LinkFaults:
    """The faults every link applies now (changed only on the proxies' loop)."""

    delay_s: float = 0.0
    bytes_per_s: float | None = None


class ProxySet:
    """One proxy per upstream port, all on one background event loop.

    Args:
        upstream_ports: the brokers' client listeners, by node.
        listen_ports: where each proxy listens (the ports the brokers advertise).

    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, upstream_ports: list[int], listen_ports: list[int]) -> None:
        self.upstream_ports = upstream_ports
        self.listen_ports = listen_ports
        self.faults = LinkFaults()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._servers: list[asyncio.Server] = []
        self._open: asyncio.Event | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.connections_total = 0

    # ---- control (any thread) ---------------------------------------------------------------

    def start(self) -> ProxySet:
        self._thread.start()
        self._call(self._start)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> ProxySet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def cut(self) -> None:
        """Stop forwarding on every link, both ways; hold new connections."""
        self._call(self._set_open, False)

    def heal(self) -> None:
        """Forward again (held bytes first)."""
        self._call(self._set_open, True)

    def set_delay(self, delay_s: float) -> None:
        """Add ``delay_s`` of latency to every chunk, both ways (0 to remove)."""
        self._call(setattr, self.faults, "delay_s", delay_s)

    def set_bandwidth(self, bytes_per_s: float | None) -> None:
        """Limit each direction of each new chunk to ``bytes_per_s`` (None: no limit)."""
        self._call(setattr, self.faults, "bytes_per_s", bytes_per_s)

    def reset(self) -> None:
        """Close every open connection (the clients reconnect)."""
        self._call(self._reset)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        async def run() -> Any:
            out = fn(*args)
            if asyncio.iscoroutine(out):
                out = await out
            return out

        future: Future[Any] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(30)

    # ---- the loop's side ----------------------------------------------------------------------

    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        for listen, upstream in zip(self.listen_ports, self.upstream_ports, strict=True):
            server = await asyncio.start_server(
                lambda r, w, up=upstream: self._serve(r, w, up), "127.0.0.1", listen
            )
            self._servers.append(server)

    async def _stop(self) -> None:
        for server in self._servers:
            server.close()
        self._reset()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    def _set_open(self, value: bool) -> None:
        assert self._open is not None
        self._open.set() if value else self._open.clear()

    def _reset(self) -> None:
        for writer in list(self._links):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._links.clear()

    async def _serve(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, upstream: int
    ) -> None:
        self.connections_total += 1
        self._links.add(client_w)
        assert self._open is not None
        try:
            await self._open.wait()
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
            except OSError:
                return  # the broker is down: the client sees the connection close
            self._links.add(up_w)
            try:
                await asyncio.gather(self._pipe(client_r, up_w), self._pipe(up_r, client_w))
            finally:
                self._links.discard(up_w)
                up_w.transport.abort()
        finally:
            self._links.discard(client_w)
            client_w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer`` under the current faults until either side closes."""
        assert self._open is not None
        bucket: TokenBucket | None = None
        previous_at = 0.0
        try:
            while True:
                chunk = await reader.read(CHUNK_BYTES)
                if not chunk:
                    break
                read_at = time.monotonic()
                await self._open.wait()
                if self.faults.bytes_per_s is not None:
                    if bucket is None or bucket.rate != self.faults.bytes_per_s:
                        rate = self.faults.bytes_per_s
                        bucket = TokenBucket(rate=rate, burst=rate / 10)
                    await asyncio.sleep(bucket.take(len(chunk), time.monotonic()))
                previous_at = forward_at(read_at, self.faults.delay_s, previous_at)
                wait_s = previous_at - time.monotonic()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                await self._open.wait()  # a cut during the delay holds the chunk
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
