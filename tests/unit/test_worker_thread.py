"""The engine's worker thread (consumer/batching/worker_thread.py): calls run in order on
its own thread, each answered as a future of the loop that asked."""

from __future__ import annotations

import asyncio
import threading

import pytest

from consumer.batching.worker_thread import WorkerThread


async def test_calls_run_in_order_on_the_named_thread_and_answer_their_futures() -> None:
    worker = WorkerThread("kbatch-test")
    seen: list[tuple[int, str]] = []

    def call(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 10

    try:
        results = await asyncio.gather(*(worker.run(call, i) for i in range(5)))
    finally:
        worker.shutdown()
    assert results == [0, 10, 20, 30, 40]
    assert seen == [(i, "kbatch-test") for i in range(5)]


async def test_an_exception_reaches_the_caller_and_the_thread_goes_on() -> None:
    worker = WorkerThread("kbatch-test")

    def fail() -> None:
        raise MemoryError("out of device memory")

    try:
        with pytest.raises(MemoryError, match="out of device memory"):
            await worker.run(fail)
        assert await worker.run(lambda: "next") == "next"
    finally:
        worker.shutdown()


async def test_shutdown_cancels_what_is_queued_and_refuses_new_calls() -> None:
    worker = WorkerThread("kbatch-test")
    release = threading.Event()
    running = threading.Event()

    def block() -> str:
        running.set()
        release.wait(10)
        return "finished"

    first = worker.run(block)
    queued = worker.run(lambda: "never")
    await asyncio.get_running_loop().run_in_executor(None, running.wait, 10)
    worker.shutdown()
    release.set()
    assert await first == "finished"  # a running call still delivers its result
    with pytest.raises(asyncio.CancelledError):
        await queued
    with pytest.raises(RuntimeError, match="shut down"):
        worker.run(lambda: None)


async def test_a_cancelled_future_of_a_queued_call_skips_the_call() -> None:
    worker = WorkerThread("kbatch-test")
    release = threading.Event()
    ran: list[str] = []
    first = worker.run(release.wait, 10)
    skipped = worker.run(ran.append, "ran")
    skipped.cancel()
    release.set()
    try:
        assert await first is True
        assert await worker.run(lambda: "after") == "after"  # in order: the skip came first
    finally:
        worker.shutdown()
    assert ran == []
