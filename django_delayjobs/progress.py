"""A watchdog for the threads of a worker that wait on the database outside any job.

A call to the database can wait for a very long time: over a connection left half-open
(a failover or a network cut that sent no reset) a socket read waits as long as the
kernel retransmits the request, about 15 minutes, and for good once the request was
acknowledged, unless TCP keepalives are on. The reconcile sweep and the database
housekeeping would then stop, unseen, in a process that goes on heartbeating, and a
``--burst`` putting back the jobs whose lease it lost would never end. So each marks its
progress, and one that has gone ``STUCK_BEATS`` ``HEARTBEAT_SECONDS`` past its
own pause without a mark counts as a dead thread (see ``WorkerProcess.supervise``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from .conf import delayjobs_settings

#: How many ``HEARTBEAT_SECONDS`` a watched thread may go past its pause without progress
#: (5 minutes at the default 10 s): far longer than any sound call to the database takes,
#: and than a lock of the job table should be held, yet well short of the 15 minutes of a
#: kernel's retransmissions.
STUCK_BEATS = 30


class Progress:
    """When each watched thread of a process last made progress, and its bound."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[float, float]] = {}  # name -> (last mark, bound)

    def watch(self, pause: float) -> Callable[[], None]:
        """Watch the calling thread, which may pause ``pause`` seconds between two marks of
        its progress; return the function it marks its progress with (marked now)."""
        name = threading.current_thread().name
        bound = pause + STUCK_BEATS * delayjobs_settings.HEARTBEAT_SECONDS

        def mark() -> None:
            self._marks[name] = (time.monotonic(), bound)

        mark()
        return mark

    @contextlib.contextmanager
    def watching(self) -> Iterator[Callable[[], None]]:
        """Watch the calling thread (``watch``) for the length of the block only: a worker
        thread's call to the database between jobs, which no ``Execution`` watches."""
        mark = self.watch(0.0)
        try:
            yield mark
        finally:
            self._marks.pop(threading.current_thread().name, None)

    def stuck(self) -> str | None:
        """Why a watched thread counts as dead, or None if none does."""
        now = time.monotonic()
        for name, (last, bound) in list(self._marks.items()):
            if now - last > bound:
                return (f"thread {name} has made no progress for {now - last:.0f} s (more "
                        f"than {bound:g} s): stuck in a call that does not return, most "
                        "likely to a database that does not answer (a connection left "
                        "half-open by a failover or a network cut)")  # fmt: skip
        return None
