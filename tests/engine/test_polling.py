"""`PollingProbe`: polling stays on only where a measurement says it pays.

The probe is fed readings as engine/pool.py feeds it (the process's CPU, samples
answered, sample-seconds in flight), on a made-up clock, so each case is exact."""

from __future__ import annotations

import pytest

from aserve.engine.polling import HOLD_S, MAX_PHASE_S, MIN_SAMPLES, PAIRS, PHASE_S, PollingProbe


class Machine:
    """A made-up server: per sample, `trip_on`/`trip_off` seconds of round trip and
    `cpu_on`/`cpu_off` CPU seconds, whichever the probe has set."""

    def __init__(self, trip_on: float, trip_off: float, cpu_on: float, cpu_off: float) -> None:
        self.trip = {True: trip_on, False: trip_off}
        self.cpu_per = {True: cpu_on, False: cpu_off}
        self.now = 100.0
        self.cpu = 0.0
        self.jobs = 0
        self.flight = 0.0
        self.settings: list[bool] = []

    def run(self, probe: PollingProbe, seconds: float, per_phase: int = 2 * MIN_SAMPLES) -> None:
        """Serve for `seconds` in steps of PHASE_S, `per_phase` samples each."""
        end = self.now + seconds
        while self.now < end:
            for _ in range(per_phase):
                self.flight += self.trip[probe.on]
                self.cpu += self.cpu_per[probe.on]
                self.jobs += 1
            self.now += PHASE_S
            if probe.tick(self.now, self.cpu, self.jobs, self.flight):
                self.settings.append(probe.on)


def probe_until_verdict(machine: Machine) -> PollingProbe:
    probe = PollingProbe()
    machine.run(probe, PHASE_S * (2 * PAIRS + 2))
    assert probe.verdicts == 1 and not probe.probing
    return probe


def test_polling_that_saves_nothing_for_more_cpu_is_turned_off() -> None:
    # the same round trip, a quarter more CPU per batch
    probe = probe_until_verdict(Machine(150e-6, 150e-6, 250e-6, 200e-6))
    assert probe.on is False and probe.pays is False
    assert probe.saved_us == pytest.approx(0.0) and probe.cost_us == pytest.approx(50.0)


def test_polling_that_saves_more_round_trip_than_it_costs_stays_on() -> None:
    # 60 us saved for 50 us more CPU: at least RATE us saved per us of CPU
    probe = probe_until_verdict(Machine(120e-6, 180e-6, 250e-6, 200e-6))
    assert probe.on is True and probe.pays is True
    assert probe.saved_us == pytest.approx(60.0) and probe.cost_us == pytest.approx(50.0)


@pytest.mark.parametrize("trip_on", [137e-6, 179e-6])  # 45 us, then 3 us saved for 70 us more CPU
def test_polling_that_saves_less_than_its_cpu_is_turned_off(trip_on: float) -> None:
    probe = probe_until_verdict(Machine(trip_on, 182e-6, 255e-6, 185e-6))
    assert probe.on is False and probe.cost_us == pytest.approx(70.0)


def test_polling_that_saves_a_sliver_of_the_round_trip_is_turned_off_even_for_free() -> None:
    # under load: 10 us of a 700 us round trip, at no CPU cost, is within the noise
    probe = probe_until_verdict(Machine(690e-6, 700e-6, 60e-6, 60e-6))
    assert probe.on is False and probe.saved_us == pytest.approx(10.0)


def test_phases_alternate_and_a_verdict_holds_until_probed_again() -> None:
    machine = Machine(150e-6, 150e-6, 250e-6, 200e-6)
    probe = PollingProbe()
    machine.run(probe, PHASE_S * (2 * PAIRS + 2))
    # on, off, on, off, on, then the verdict (off); the last phase on measured was the PAIRS-th
    assert machine.settings[:2 * PAIRS - 1] == [False, True, False, True, False][:2 * PAIRS - 1]
    assert probe.on is False and probe.verdicts == 1
    machine.run(probe, HOLD_S - 2 * PHASE_S)
    assert probe.on is False and not probe.probing  # it holds: nothing flips meanwhile
    machine.run(probe, 4 * PHASE_S)
    assert probe.probing and probe.verdicts == 1  # probing again, from the other setting
    machine.run(probe, PHASE_S * (2 * PAIRS + 2))
    assert probe.verdicts == 2 and probe.on is False


def test_too_few_batches_measure_nothing() -> None:
    # a trickle of samples: phases never count, and polling stays as it was
    machine = Machine(150e-6, 150e-6, 250e-6, 200e-6)
    probe = PollingProbe()
    machine.run(probe, 10 * MAX_PHASE_S, per_phase=MIN_SAMPLES // 10)
    assert probe.on is True and probe.verdicts == 0 and machine.settings == []


def test_a_probe_rests_while_no_batch_comes() -> None:
    probe = PollingProbe()
    assert not probe.rests(0.0, 5)  # no phase begun
    probe.tick(10.0, 1.0, 5, 0.5)  # begins a phase
    assert not probe.rests(10.0 + PHASE_S / 2, 5)
    assert probe.rests(10.0 + PHASE_S, 5)  # a phase with nothing answered: the timer looks less often
    assert not probe.rests(10.0 + PHASE_S, 6)
    probe.tick(10.0 + MAX_PHASE_S, 1.0, 5, 0.5)  # a phase too long to say anything: a fresh one begins
    assert not probe.rests(10.0 + MAX_PHASE_S, 5)
