"""Shutdown must end a service task even when the task loses a cancel (Python 3.11's wait_for, gh-86296)."""

import asyncio
import contextlib

from services.bus.cancel import wait_closed


async def test_wait_closed_repeats_a_cancel_the_task_lost() -> None:
    resumed = asyncio.Event()

    async def loses_its_first_cancel() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # as asyncio.wait_for does on 3.11 (gh-86296)
            await asyncio.sleep(3600)
        resumed.set()
        await asyncio.sleep(3600)

    task = asyncio.create_task(loses_its_first_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(wait_closed(task, recancel_after=0.01), timeout=5)
    assert resumed.is_set() and task.cancelled()


async def test_wait_closed_swallows_what_the_task_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    await wait_closed(task)
    assert isinstance(task.exception(), RuntimeError)


async def test_a_lost_cancel_is_raised_at_the_next_nats_call_site() -> None:
    """A task inside a TaskGroup is cancelled once; after a swallowed cancel it must stop on its own."""
    from services.bus.cancel import raise_lost_cancel

    steps: list[str] = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                steps.append("swallowed")  # as asyncio.wait_for does on 3.11
            raise_lost_cancel()

    async def group() -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(loop())

    task = asyncio.create_task(group())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait_for(asyncio.wait({task}), timeout=5)
    assert task.cancelled() and steps == ["swallowed"]
