"""``PerProcess``: one object a process, made again in a forked child (real ``os.fork``)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from leases.engine.per_process import PerProcess


def test_given_one_process_then_every_get_answers_the_object_made_at_the_first():
    made = []
    one = PerProcess(lambda: made.append(object()) or made[-1])
    assert made == []  # nothing is made before it is asked for
    assert one.get() is one.get() is made[0] and len(made) == 1


def test_given_a_forked_child_then_it_makes_its_own_and_its_threads_run():
    # The parent's pool has a running thread; the child inherits the pool but not the thread.
    pool = PerProcess(lambda: ThreadPoolExecutor(max_workers=1))
    parent = pool.get()
    assert parent.submit(os.getpid).result(5) == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report whether it got its own pool and whether work runs there
        try:
            mine = pool.get()
            ok = mine is not parent and mine.submit(os.getpid).result(5) == os.getpid() and pool.get() is mine
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"
    assert pool.get() is parent  # the parent keeps its own
