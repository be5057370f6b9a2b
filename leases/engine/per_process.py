"""One object per OS process, made at first use and made anew in a forked child.

A worker forked from a parent that already ran a background thread (a claim pool, the
rollback retry) inherits the parent's object but none of its threads: work submitted to it
would never run. So each use asks :meth:`PerProcess.get`, which makes the object again when
the process id changed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """This process's ``T``, made by ``make`` at the first :meth:`get` in each process."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._held: tuple[int, T] | None = None

    def get(self) -> T:
        """This process's object (made now if this process has none yet)."""
        with self._lock:
            if self._held is None or self._held[0] != os.getpid():
                self._held = (os.getpid(), self._make())
            return self._held[1]
