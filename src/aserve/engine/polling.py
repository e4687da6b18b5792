"""Whether polling pays on the machine the server runs on, measured rather than assumed.

Polling (`spin_us`: an idle interpreter polls for its next batch, the loop for a lone
batch's answer) trades CPU for the wake-ups it saves. What a wake-up costs depends on the
machine and the moment (a virtual CPU's host, the other load): the same build's polling
has saved a lone request a good part of its round trip on one day and nothing at a
quarter more CPU on another. So the pool measures it where it runs: while lone batches
come (one in flight at a time), it
alternates short phases with polling on and off, and compares, per batch, the lone
batches' round trip (queued to answered) and the process's CPU. Polling stays on when it
saves at least `RATE` µs of round trip per µs of CPU it adds, and the verdict holds for
`HOLD_S` before the next probe. Under load no batch is lone and polling hardly happens:
nothing is measured and the verdict stands.

`PollingProbe` is the decision alone, fed readings (engine/pool.py feeds it), so that it
is tested on made-up ones.
"""

from __future__ import annotations

import statistics

PHASE_S = 0.25  # one phase: at a lone client's pace, a few hundred to thousands of batches
MAX_PHASE_S = 2.0  # a phase that has not seen MIN_JOBS lone batches by then is dropped
MIN_JOBS = 64  # lone batches a phase needs to count
PAIRS = 3  # phases on and off each before a verdict (their medians are compared)
HOLD_S = 30.0  # how long a verdict stands before polling is probed again
RATE = 1.0  # µs of round trip a µs of CPU must save for polling to stay on: an even trade


class PollingProbe:
    """Alternates polling on and off over phases of lone batches and decides whether it pays.

    Feed it `lone(seconds)` for each lone batch answered, and `tick(now, cpu_s, jobs)` on
    a timer (every PHASE_S while `probing`, else at `hold_until`): `cpu_s` the process's CPU
    seconds, `jobs` the batches answered so far. `on` is whether polling should be on now;
    `rests(now)` says the timer may stop until a lone batch comes (`restart` then)."""

    def __init__(self) -> None:
        self.on = True
        self.probing = True
        self.verdicts = 0  # decisions taken, all told
        self.pays: bool | None = None  # the last verdict (None: none yet)
        self.saved_us = 0.0  # the last verdict's round trip saved and CPU added per batch, µs
        self.cost_us = 0.0
        self._samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        self._from: tuple[float, float, int] | None = None  # the phase's start: now, cpu_s, jobs
        self._lone_n = 0
        self._lone_s = 0.0
        self._hold_until = 0.0

    def lone(self, seconds: float) -> None:
        """A lone batch was answered `seconds` after it was queued."""
        self._lone_n += 1
        self._lone_s += seconds

    def hold_until(self) -> float:
        """When the verdict that holds ends (a time on tick's clock)."""
        return self._hold_until

    def tick(self, now: float, cpu_s: float, jobs: int) -> bool:
        """Close the phase under way if it is long enough; returns whether `on` changed."""
        if not self.probing:
            if now < self._hold_until:
                return False
            self.probing = True  # probe again, starting from the other setting
            self._start(now, cpu_s, jobs)
            return self._set(not self.on)
        if self._from is None:
            self._start(now, cpu_s, jobs)
            return False
        start, cpu_from, jobs_from = self._from
        if now - start < PHASE_S:
            return False
        if self._lone_n < MIN_JOBS or jobs <= jobs_from:
            if now - start >= MAX_PHASE_S:
                self._start(now, cpu_s, jobs)  # too few lone batches: this phase says nothing
            return False
        self._samples[self.on].append((self._lone_s / self._lone_n, (cpu_s - cpu_from) / (jobs - jobs_from)))
        self._start(now, cpu_s, jobs)
        if len(self._samples[True]) >= PAIRS and len(self._samples[False]) >= PAIRS:
            return self._decide(now)
        return self._set(not self.on)

    def rests(self, now: float) -> bool:
        """A probe's phase has seen no lone batch for PHASE_S: nothing to measure until one comes."""
        return self.probing and self._from is not None and self._lone_n == 0 and now - self._from[0] >= PHASE_S

    def restart(self) -> None:
        """The timer stopped and starts again: the next tick begins a fresh phase."""
        self._from = None

    def _start(self, now: float, cpu_s: float, jobs: int) -> None:
        self._from = (now, cpu_s, jobs)
        self._lone_n = 0
        self._lone_s = 0.0

    def _set(self, on: bool) -> bool:
        changed = on != self.on
        self.on = on
        return changed

    def _decide(self, now: float) -> bool:
        on_trip, on_cpu = (statistics.median(v) for v in zip(*self._samples[True]))
        off_trip, off_cpu = (statistics.median(v) for v in zip(*self._samples[False]))
        self.saved_us = (off_trip - on_trip) * 1e6
        self.cost_us = (on_cpu - off_cpu) * 1e6
        self.pays = self.saved_us > 0 and self.saved_us >= RATE * self.cost_us
        self.verdicts += 1
        self.probing = False
        self._hold_until = now + HOLD_S
        self._samples = {True: [], False: []}
        self._from = None
        return self._set(self.pays)
