"""The command queue from the loop to a Consumer's owner thread (owner_thread.OwnerCommands),
shared by the group source and the range readers: answers on the loop, a rebalance handler
served while the owner waits for it, and what is queued after the end."""

from __future__ import annotations

import asyncio
import threading

import pytest

from consumer.kafka.confluent_adapter.owner_thread import OwnerCommands
from consumer.kafka.errors import KafkaUnavailableError


def _owner(commands: OwnerCommands, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            commands.serve(0.01)
        commands.end()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_calls_answer_on_the_loop_and_end_answers_the_rest_as_closed() -> None:
    commands = OwnerCommands("unit")
    commands.loop = asyncio.get_running_loop()
    stop = threading.Event()
    thread = _owner(commands, stop)
    ran_on: list[str] = []
    assert await commands.call(lambda: ran_on.append(threading.current_thread().name) or 7, 0) == 7
    assert ran_on == [thread.name]

    def boom() -> None:
        raise KeyError("owner-side")

    with pytest.raises(KeyError):
        await commands.call(boom, None)
    commands.send(boom)  # logged, and the owner goes on
    assert await commands.call(lambda: 8, 0) == 8
    stop.set()
    await asyncio.to_thread(thread.join, 5)
    assert await commands.call(lambda: 9, 0) == 0  # ended: the closed value
    closed = KafkaUnavailableError("closed")
    with pytest.raises(KafkaUnavailableError):
        await commands.call(lambda: 9, closed)


async def test_a_handler_awaited_by_the_owner_is_served_its_commands() -> None:
    """Inside a rebalance callback the owner waits for the handler on the loop; the handler's
    own calls (a commit) must run meanwhile, or both would wait for ever."""
    commands = OwnerCommands("unit")
    commands.loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def handler() -> None:
        seen.append(await commands.call(lambda: "committed", "closed"))

    def callback() -> None:  # the owner thread, inside consume()
        commands.await_on_loop(handler())
        seen.append("callback returned")

    await asyncio.wait_for(asyncio.to_thread(callback), 5)
    assert seen == ["committed", "callback returned"]
