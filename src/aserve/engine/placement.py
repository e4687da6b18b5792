"""Where a pool's interpreter threads run while one client sends its jobs one at a time.

A lone job (nothing else of the pool in flight) costs two thread hand-offs: the event loop
wakes an interpreter's thread, and the thread's answer wakes the loop. Where the woken
thread sleeps on another CPU, and that CPU idles, waking it makes the CPU leave its halt,
which on a virtual machine costs tens of microseconds each way; a thread woken on the CPU
its waker is about to leave for epoll costs a switch on that CPU. The interpreters' threads
are SCHED_BATCH, so one woken there never preempts the loop: it runs when the loop waits.

So while a pool's jobs have come alone, from one client (`sole`: the data plane's last
requests came from one connection), and run short, its interpreter threads and the loop's
are held to the CPU the loop runs on: the loop no longer moves away from them, and a client
on the same machine keeps the other CPUs. A second client, a job that comes while another
is in flight, a lone job that runs long, or polling turned on (a thread polling on the
loop's CPU would take it from the loop) spreads them over the process's CPUs again, with
every thread started meanwhile by one of them (a model's, an executor's of the loop's),
which inherited the narrowed set. Two clients or more are never held: their jobs would
come one after another on the one CPU, which then serves them all alone. A hold that ended
before it lasted as many jobs as it waited for makes the next wait twice as long: load
that comes and goes every few jobs does not pay for holds and spreads (a few dozen system
calls each) it cannot use.
"""

from __future__ import annotations

import os
import statistics
from collections import deque
from collections.abc import Callable

from .. import _native

LONE_RUN = 8  # jobs in a row that came alone before the threads are held to the loop's CPU
LONE_RUN_MAX = 1024  # ... after holds that ended sooner than that, twice as many each time, to this
SHORT_S = 1e-3  # lone jobs (queued to answered, median of the last LONE_RUN) at most this long

_PROCESS_CPUS = os.sched_getaffinity(0)  # at import, before any thread is held


class LonePlacement:
    """Holds a pool's interpreter threads to the loop's CPU while one client's jobs come alone.

    thread_ids: the interpreters' thread ids now (0: not started); loop: the loop's thread
    id; sole: whether the last jobs came from one client (None: the pool cannot tell, and
    holds on loneness alone); cpus: the CPUs the threads get back when spread (default: the
    process's at start)."""

    def __init__(self, thread_ids: Callable[[], list[int]], loop: int, sole: Callable[[], bool] | None = None,
                 cpus: set[int] | None = None) -> None:
        self._thread_ids = thread_ids
        self._loop = loop
        self._sole = sole
        self._cpus = set(_PROCESS_CPUS if cpus is None else cpus)
        self._run = 0  # jobs in a row that came alone (while held: since the hold began)
        self.need = LONE_RUN  # lone jobs in a row the next hold waits for
        self._times: deque[float] = deque(maxlen=LONE_RUN)  # the last lone jobs' seconds
        self.cpu = -1  # the CPU the threads are held to (-1: spread)
        self.held = 0  # times the threads were held to a CPU, all told
        self.spread_count = 0  # times they were spread again

    def queued(self, lone: bool, polling: bool) -> None:
        """A job of the pool was queued: `lone`, nothing else in flight; `polling`, the loop
        or the interpreters may poll for it now."""
        if not lone or polling or (self._sole is not None and not self._sole()):
            if self.cpu >= 0:
                self.spread()
            self._run = 0
            return
        self._run += 1
        if self.cpu >= 0:
            return  # held: the loop's thread is held too, so the CPU it runs on cannot have changed
        times = self._times
        if self._run < self.need or len(times) < LONE_RUN or statistics.median(times) > SHORT_S:
            return
        cpu = _native.current_cpu()
        if cpu in self._cpus:
            self._hold(cpu)

    def answered(self, seconds: float) -> None:
        """The lone job in flight was answered `seconds` after it was queued."""
        self._times.append(seconds)
        if seconds > SHORT_S:
            if self.cpu >= 0:
                self.spread()
            self._run = 0

    def _hold(self, cpu: int) -> None:
        for tid in [*self._thread_ids(), self._loop]:
            if tid:
                _set(tid, {cpu})
        self._run = 0  # counts the jobs of this hold from here
        self.cpu = cpu
        self.held += 1

    def spread(self) -> None:
        """Give the threads held, and every thread of the process held to that CPU alone (one
        of them started it meanwhile), every CPU of the process again."""
        held = {self.cpu}
        tids = {tid for tid in [*self._thread_ids(), self._loop] if tid}
        try:
            names = os.listdir("/proc/self/task")
        except OSError:
            names = []
        for name in names:
            try:
                if os.sched_getaffinity(int(name)) == held:
                    tids.add(int(name))
            except (OSError, ValueError):
                continue  # it ended meanwhile
        for tid in tids:
            _set(tid, self._cpus)
        self.need = LONE_RUN if self._run >= self.need else min(2 * self.need, LONE_RUN_MAX)
        self._run = 0
        self.cpu = -1
        self.spread_count += 1


def _set(tid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError:
        pass  # it ended meanwhile, or the set is refused (a cgroup's cpuset changed): leave it
