"""leases.store.admission: a process runs a few acquire steps at once; the rest wait their turn."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pymongo.errors
import pytest

from leases.store import admission


@contextlib.contextmanager
def slot_held_elsewhere():
    """Another thread holds an admitted step (the only slot, with a concurrency of 1)."""
    taken, release = threading.Event(), threading.Event()

    def holder():
        with admission.admitted():
            taken.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert taken.wait(5)
        yield
    finally:
        release.set()
        thread.join(5)


def test_given_a_concurrency_of_two_then_six_steps_run_two_at_a_time_and_all_complete(settings):
    settings.LEASES_STORE_CONCURRENCY = 2
    running, most, done = [0], [0], []
    lock = threading.Lock()

    def a_step():
        with admission.admitted():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
        done.append(1)

    threads = [threading.Thread(target=a_step) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most[0] == 2 and len(done) == 6


def test_given_a_step_within_a_step_then_it_is_admitted_with_its_outer_step(settings):
    settings.LEASES_STORE_CONCURRENCY = 1
    with admission.admitted():
        with admission.admitted():  # would wait for itself otherwise
            pass


def test_given_every_slot_taken_past_the_admission_bound_then_the_step_fails_as_a_store_timeout(settings):
    settings.LEASES_STORE_CONCURRENCY = 1
    settings.LEASES_STORE_ADMISSION_MS = 100
    with slot_held_elsewhere():
        started = time.monotonic()
        with pytest.raises(pymongo.errors.ExecutionTimeout):
            with admission.admitted():
                pass
        assert time.monotonic() - started < 2


def test_given_a_coroutine_then_it_never_waits_on_the_semaphore(settings):
    # The one slot is held by another thread; a coroutine asking for admission would block
    # its event loop (and then time out): it is not admitted at all.
    settings.LEASES_STORE_CONCURRENCY = 1
    settings.LEASES_STORE_ADMISSION_MS = 100

    async def in_a_loop():
        with admission.admitted():
            return True

    with slot_held_elsewhere():
        assert asyncio.run(in_a_loop())


def test_given_many_coroutines_of_one_loop_then_their_steps_run_a_few_at_a_time_without_blocking_it(settings):
    # The async path's uncontended try: a coroutine waits for its turn on the loop (the
    # others keep running), never on the threads' semaphore.
    settings.LEASES_STORE_CONCURRENCY = 2
    running, most, ticks = [0], [0], [0]

    async def a_step():
        async with admission.admitted_async():
            running[0] += 1
            most[0] = max(most[0], running[0])
            await asyncio.sleep(0.02)
            running[0] -= 1

    async def ticker(stop: asyncio.Event):
        while not stop.is_set():
            ticks[0] += 1
            await asyncio.sleep(0.005)

    async def main():
        stop = asyncio.Event()
        clock = asyncio.create_task(ticker(stop))
        await asyncio.gather(*(a_step() for _ in range(10)))
        stop.set()
        await clock

    with slot_held_elsewhere():  # a thread's step: a budget of its own
        asyncio.run(main())
    assert most[0] == 2 and ticks[0] >= 10


def test_given_a_loop_whose_slots_stay_taken_past_the_bound_then_its_step_fails_as_a_store_timeout(settings):
    settings.LEASES_STORE_CONCURRENCY = 1
    settings.LEASES_STORE_ADMISSION_MS = 100

    async def main():
        release = asyncio.Event()

        async def holder():
            async with admission.admitted_async():
                await release.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0.01)
        started = time.monotonic()
        with pytest.raises(pymongo.errors.ExecutionTimeout):
            async with admission.admitted_async():
                pass
        release.set()
        await task
        return time.monotonic() - started

    assert asyncio.run(main()) < 2


def test_given_a_step_waiting_its_turn_when_it_no_longer_needs_one_then_it_runs_while_the_turn_is_still_held(
        settings):
    # Given: the only turn is held elsewhere, and a step waits for it with a condition that
    # would let it go without one (its writes shared by the process's batches).
    settings.LEASES_STORE_CONCURRENCY = 1
    needs_none, ran = threading.Event(), threading.Event()
    with slot_held_elsewhere():
        def step():
            with admission.admitted(unless=needs_none.is_set):
                ran.set()

        thread = threading.Thread(target=step)
        thread.start()
        # Then: it waits while it needs a turn...
        assert not ran.wait(0.2)
        # When: it no longer needs one, and what it asks is said to have changed.
        needs_none.set()
        admission.recheck()
        # Then: it runs, the turn still held by the other step.
        assert ran.wait(1.0)
        thread.join(5)
