"""One thread that runs the engine's blocking calls (tokenize a big chunk, collate, a model
forward) in order, each answered as a future of the event loop that asked.

Why not ``loop.run_in_executor(ThreadPoolExecutor(1), ...)``: that chains a
``concurrent.futures.Future`` to an asyncio one through callbacks on both sides; here the
thread settles the loop's future with one ``call_soon_threadsafe``. On a 2-core VM a round
trip costs ~54 µs of CPU against ~82 through the executor (both mostly the two thread wake-ups),
and a serve at 1,000 req/s runs hundreds of batches a second.

The thread is a daemon, started on the first call: a model call that never returns (a wedged
device, consumer/serve/wedge.py) cannot keep the process from exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from consumer.cpu.threads import name_os_thread

__all__ = ["WorkerThread"]

T = TypeVar("T")

_Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class WorkerThread:
    """Runs ``fn(*args)`` calls one at a time on its own thread (``name``), in submission
    order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)``; the future of the running loop gets its result or exception
        (cancelled when :meth:`shutdown` came first). Cancelling the future does not stop a
        call already running; one still queued is skipped.

        Raises:
            RuntimeError: after :meth:`shutdown`, or with no running loop.
        """
        if self._closed:
            raise RuntimeError(f"{self.name}: shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._calls.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Refuse new calls; queued ones are cancelled, a running one finishes (its result is
        still delivered). Idempotent; does not wait."""
        self._closed = True
        self._calls.put(None)

    def _serve(self) -> None:
        name_os_thread(self.name)  # top -H, ps -L: the thread's role (consumer.cpu.threads)
        while (call := self._calls.get()) is not None:
            loop, future, fn, args = call
            if self._closed or future.cancelled():
                _settle_soon(loop, _cancel, future)
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # as an executor's work item: the caller gets it
                _settle_soon(loop, _fail, future, exc)
            else:
                _settle_soon(loop, _succeed, future, result)
        while True:  # shut down: what is still queued is cancelled
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return
            if call is not None:
                _settle_soon(call[0], _cancel, call[1])


def _settle_soon(loop: asyncio.AbstractEventLoop, settle: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
        loop.call_soon_threadsafe(settle, *args)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _cancel(future: asyncio.Future[Any]) -> None:
    future.cancel()
