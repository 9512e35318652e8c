"""The chaos proxy: its pacing (pure) and its faults on a local echo server."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from tests.chaos.proxy import ProxySet, TokenBucket, forward_at
from tests.integration.harness import free_port


@pytest.mark.parametrize(
    ("steps", "expected_waits"),
    [
        # 1,000 B/s with 100 B saved up: the first 100 B go at once, then one per 0.1 s.
        ([(100, 0.0), (100, 0.0)], [0.0, 0.1]),
        ([(100, 0.0), (100, 0.1)], [0.0, 0.0]),
        ([(50, 0.0), (100, 0.0), (100, 0.0)], [0.0, 0.05, 0.15]),
        ([(100, 0.0), (100, 10.0)], [0.0, 0.0]),  # idle time saves at most the burst
    ],
)
def test_token_bucket_waits(steps: list[tuple[int, float]], expected_waits: list[float]) -> None:
    bucket = TokenBucket(rate=1000.0, burst=100.0)
    waits = [bucket.take(n, now) for n, now in steps]
    assert waits == pytest.approx(expected_waits)


@pytest.mark.parametrize(
    ("read_at", "delay_s", "previous_at", "expected"),
    [(1.0, 0.2, 0.0, 1.2), (1.0, 0.0, 0.0, 1.0), (1.0, 0.2, 1.5, 1.5)],
)
def test_forward_at_adds_the_delay_and_keeps_order(
    read_at: float, delay_s: float, previous_at: float, expected: float
) -> None:
    assert forward_at(read_at, delay_s, previous_at) == expected


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(1024):
            w.write(data)
            await w.drain()
        w.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


def _round_trip(port: int, payload: bytes, timeout_s: float) -> tuple[bytes, float]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    return got, time.monotonic() - started


async def test_the_proxy_forwards_delays_and_cuts() -> None:
    server, upstream = await _echo_server()
    listen = free_port()
    proxies = ProxySet([upstream], [listen]).start()
    try:
        got, _ = await asyncio.to_thread(_round_trip, listen, b"hello", 5)
        assert got == b"hello"
        proxies.set_delay(0.2)
        got, took_s = await asyncio.to_thread(_round_trip, listen, b"slow", 5)
        assert got == b"slow" and took_s >= 0.4  # both directions delayed
        proxies.set_delay(0.0)
        proxies.cut()
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(_round_trip, listen, b"cut", 0.5)
        proxies.heal()
        got, _ = await asyncio.to_thread(_round_trip, listen, b"healed", 5)
        assert got == b"healed"
        assert proxies.connections_total == 4
    finally:
        proxies.stop()
        server.close()
        await server.wait_closed()
