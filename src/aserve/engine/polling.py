"""Whether polling pays on the machine the server runs on, measured rather than assumed.

Polling (`spin_us`: an idle interpreter polls for its next batch, the loop for a lone
batch's answer) trades CPU for the wake-ups it saves. What a wake-up costs depends on the
machine and the moment (a virtual CPU's host, the other load), and a polling thread takes
CPU the loop may need: the same build's polling has saved a lone request a good part of
its round trip on one day, and cost a quarter more CPU per request for nothing on
another. So the pool measures it where it runs: while batches come, it alternates short
phases with polling on and off and compares, per sample (a batch's row), the round trip
through the interpreters (queued to answered: the sample-seconds in flight over the
samples answered, which the pool counts for every batch, the fronts' too) and the
process's CPU; per sample, since polling changes how many requests a batch takes.
Polling stays on when it saves at least `RATE` µs of round trip per µs of CPU it adds,
and a noticeable share of the round trip (under load, where a wake-up is a sliver of a
request's time, it rarely does); the verdict holds for `HOLD_S`, then the next probe starts.

`PollingProbe` is the decision alone, fed readings (engine/pool.py feeds it), so that it
is tested on made-up ones.
"""

from __future__ import annotations

import statistics

PHASE_S = 0.25  # one phase: at one client's pace, hundreds to thousands of batches
MAX_PHASE_S = 2.0  # a phase that has not seen MIN_SAMPLES by then is dropped
REST_S = 1.0  # how often the timer looks while no batch comes
MIN_SAMPLES = 64  # samples answered a phase needs to count
PAIRS = 3  # phases on and off each before a verdict (their medians are compared)
HOLD_S = 30.0  # how long a verdict stands before polling is probed again
RATE = 1.0  # µs of round trip a µs of CPU must save for polling to stay on: an even trade
NOTICEABLE = 0.05  # and the share of the round trip it must save: less is within the noise


class PollingProbe:
    """Alternates polling on and off over phases and decides whether it pays.

    `tick(now, cpu_s, answered, flight_s)` on a timer (every PHASE_S while `probing`, else
    at `hold_until()`): `cpu_s` the process's CPU seconds, `answered` the samples answered
    so far, `flight_s` the sample-seconds spent in flight so far (the integral of the
    samples in flight over time). `on` is whether polling should be on now; `rests(now,
    answered)` says no batch came in a phase: the timer may look less often."""

    def __init__(self) -> None:
        self.on = True
        self.probing = True
        self.verdicts = 0  # decisions taken, all told
        self.pays: bool | None = None  # the last verdict (None: none yet)
        self.saved_us = 0.0  # the last verdict's round trip saved and CPU added per sample, µs
        self.cost_us = 0.0
        self._samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        self._from: tuple[float, float, int, float] | None = None  # the phase's start readings
        self._hold_until = 0.0

    def hold_until(self) -> float:
        """When the verdict that holds ends (a time on tick's clock)."""
        return self._hold_until

    def rests(self, now: float, answered: int) -> bool:
        """A probe's phase has seen no batch for PHASE_S: nothing to measure until one comes."""
        start = self._from
        return self.probing and start is not None and answered == start[2] and now - start[0] >= PHASE_S

    def tick(self, now: float, cpu_s: float, answered: int, flight_s: float) -> bool:
        """Close the phase under way if it is long enough; returns whether `on` changed."""
        reading = (now, cpu_s, answered, flight_s)
        if not self.probing:
            if now < self._hold_until:
                return False
            self.probing = True  # probe again, starting from the other setting
            self._from = reading
            return self._set(not self.on)
        if self._from is None:
            self._from = reading
            return False
        start, cpu_from, answered_from, flight_from = self._from
        if now - start < PHASE_S:
            return False
        n = answered - answered_from
        if n < MIN_SAMPLES:
            if now - start >= MAX_PHASE_S:
                self._from = reading  # too few samples: this phase says nothing
            return False
        self._samples[self.on].append(((flight_s - flight_from) / n, (cpu_s - cpu_from) / n))
        self._from = reading
        if len(self._samples[True]) >= PAIRS and len(self._samples[False]) >= PAIRS:
            return self._decide(now)
        return self._set(not self.on)

    def _set(self, on: bool) -> bool:
        changed = on != self.on
        self.on = on
        return changed

    def _decide(self, now: float) -> bool:
        on_trip, on_cpu = (statistics.median(v) for v in zip(*self._samples[True]))
        off_trip, off_cpu = (statistics.median(v) for v in zip(*self._samples[False]))
        self.saved_us = (off_trip - on_trip) * 1e6
        self.cost_us = (on_cpu - off_cpu) * 1e6
        self.pays = self.saved_us >= max(RATE * self.cost_us, NOTICEABLE * off_trip * 1e6) and self.saved_us > 0
        self.verdicts += 1
        self.probing = False
        self._hold_until = now + HOLD_S
        self._samples = {True: [], False: []}
        self._from = None
        return self._set(self.pays)
