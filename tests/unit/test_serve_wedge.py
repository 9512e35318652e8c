"""A wedged engine (one batch past WEDGED_AFTER_TIMEOUTS × --batch-timeout-s) fails /healthz and
stops serve (consumer/serve/wedge.py): the decision on a fake clock, the engine's running-batch
clock, the watch task and the health endpoint."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.error
import urllib.request

import pytest

from consumer.batching.config import BatchPolicyConfig
from consumer.batching.engine import Engine
from consumer.batching.types import InferenceItem
from consumer.model.batch_runner import ModelRunner
from consumer.model.protocol import FakeBackend
from consumer.serve.metrics import HealthServer, Metrics
from consumer.serve.wedge import WEDGED_AFTER_TIMEOUTS, WedgeWatch, watch_engine
from tests.fakes import FakeClock
from tests.unit.test_batching_engine import WordTokenizer


class Device:
    """The batch on the model, on a fake clock: ``start()``/``end()``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.since_s: float | None = None

    def start(self) -> None:
        self.since_s = self.clock()

    def end(self) -> None:
        self.since_s = None

    def running_s(self) -> float:
        return 0.0 if self.since_s is None else self.clock() - self.since_s


def test_one_batch_past_the_bound_wedges_the_engine_for_good() -> None:
    clock = FakeClock()
    device = Device(clock)
    watch = WedgeWatch(2.0, device.running_s)
    assert watch.bound_s == 2.0 * WEDGED_AFTER_TIMEOUTS == 6.0
    assert not watch.check()  # idle
    device.start()
    clock.now_s += 5.9  # past the batch timeout (unhealthy), not past the bound
    assert not watch.check()
    assert watch.liveness() == (True, {"engine_wedged": False})
    clock.now_s += 0.1
    assert watch.check()
    device.end()  # the batch returning later does not undo it
    assert watch.check() and watch.wedged_after_s == pytest.approx(6.0)
    assert watch.liveness() == (False, {"engine_wedged": True})


def test_slow_batches_each_under_the_bound_never_wedge_it() -> None:
    clock = FakeClock()
    device = Device(clock)
    watch = WedgeWatch(2.0, device.running_s)
    for _ in range(20):  # 20 batches of 5 s back to back: 100 s unhealthy now and then
        device.start()
        for _ in range(5):
            clock.now_s += 1.0
            assert not watch.check()
        device.end()
    assert not watch.wedged


async def test_the_engine_says_how_long_its_batch_has_run_on_its_clock() -> None:
    clock = FakeClock()
    gate = threading.Event()
    backend = FakeBackend(max_length=64, gate=gate)
    done = asyncio.Event()
    engine = Engine(
        ModelRunner(backend),
        WordTokenizer(),
        BatchPolicyConfig(max_wait_ms=0.0),
        lambda outcomes: done.set(),
        clock=clock,
        batch_timeout_s=3600.0,
    )
    await engine.start()
    try:
        assert engine.running_batch_s() == 0.0
        await engine.submit([InferenceItem(item_id=0, text="hang", arrival_s=clock())])
        while not backend.calls:  # the model thread has the batch (its start noted before)
            await asyncio.sleep(0.001)
        assert engine.running_batch_s() == 0.0  # no fake second has passed yet
        clock.now_s += 7.0
        assert engine.running_batch_s() == pytest.approx(7.0)
        watch = WedgeWatch(2.0, engine.running_batch_s)
        assert watch.check()
        gate.set()
        await asyncio.wait_for(done.wait(), 30)
        assert engine.running_batch_s() == 0.0
    finally:
        gate.set()
        await engine.stop()


async def test_the_watch_stops_serve_once_wedged_with_one_error_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    device = Device(clock)
    watch = WedgeWatch(1.0, device.running_s)
    stop = asyncio.Event()
    task = asyncio.create_task(watch_engine(stop, watch, interval_s=0.01))
    device.start()
    await asyncio.sleep(0.05)
    assert not stop.is_set()
    clock.now_s += 3.0
    await asyncio.wait_for(task, 30)
    assert stop.is_set()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "engine wedged" in errors[0].getMessage()


async def test_the_watch_ends_with_serve() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(watch_engine(stop, WedgeWatch(1.0, lambda: 0.0), interval_s=30))
    stop.set()
    await asyncio.wait_for(task, 5)


def _get(port: int, path: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read())


def test_healthz_fails_once_the_engine_is_wedged() -> None:
    clock = FakeClock()
    device = Device(clock)
    watch = WedgeWatch(2.0, device.running_s)
    health = HealthServer(Metrics(), lambda: (True, {}), port=0, live=watch.liveness)
    health.start()
    try:
        health.beat()
        assert _get(health.port, "/healthz") == (
            200,
            {"alive": True, "loop_beat_age_s": pytest.approx(0, abs=5), "engine_wedged": False},
        )
        device.start()
        clock.now_s += 6.0
        code, body = _get(health.port, "/healthz")  # the event loop still beats
        assert code == 503 and body["alive"] is False and body["engine_wedged"] is True
    finally:
        health.stop()
