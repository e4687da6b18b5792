"""Fair sharing of one pool's interpreters among the models loaded in it.

Each model has its own batcher, and the pool's native queue is FIFO across models.
A FairScheduler owns the pool's interpreter slots (one per interpreter, or per
thread of the "main" engine): a batcher starts a batch only when it can take a slot,
besides its own `interpreters` limit, and gives the slot back when the batch ends.
So every batch goes to an interpreter that is free, and the host, not the order of
the native queue, decides which model runs next; batches form when an interpreter
can take them, from everything queued by then.

When a batch ends, its slot is offered to the models with queued work round-robin
(TensorFlow-Serving's shared batch scheduler), one batch per turn: first to the model
that took a slot least recently, so the rotation starts after the model that took the
last one, and a model that could not take its turn (no interpreter it may use was
free) keeps its place at the front. A model with work thus waits for at most one
batch of each other model. A model whose policy prefers to wait passes its turn; a
model that wants to dispatch later (an arrival, its timer) takes a free slot at once.

Models loaded on a subset of the interpreters (the first n, as `Pool.load` does) are
counted so that their batches fit those interpreters: for every k, the batches in
flight of models on at most k interpreters number at most k. Two models on one
interpreter then never hold two slots, one of them only to wait natively behind the
other while a slot another model could use stays taken. (The engine places a batch on
the lowest idle interpreter its model may use, so a batch of a model on a subset can
still wait for one batch of a model on more.) Slots are held only by batches in
flight, never reserved, and every batch ends, so counting cannot deadlock.
"""

from __future__ import annotations

from typing import Protocol


class Contender(Protocol):
    """A model's batcher as the scheduler sees it."""

    def offer_slot(self) -> bool:
        """A slot is free: start one batch now if there is work and the policy wants to
        (taking the slot with `Seat.take`); True if it did."""
        ...


class Seat:
    """One model's place at a FairScheduler: its turn in the rotation and its slot counts."""

    __slots__ = ("contender", "interpreters", "running", "scheduler", "turns")

    def __init__(self, scheduler: FairScheduler, contender: Contender, interpreters: int) -> None:
        self.scheduler = scheduler
        self.contender = contender
        self.interpreters = interpreters  # how many of the pool's interpreters serve the model
        self.running = 0  # slots it holds
        self.turns = 0  # slots it has taken

    def room(self) -> int:
        """How many more batches of this model may start now (0: wait for a release)."""
        return self.scheduler._room(self.interpreters)

    def take(self) -> None:
        """Hold one slot for a batch that starts now; room() must be positive."""
        s = self.scheduler
        assert s._room(self.interpreters) > 0, "take() without room"
        s._by_size[self.interpreters] += 1
        s.in_flight += 1
        self.running += 1
        self.turns += 1
        order = s._order
        if order and order[-1] is not self and self in order:  # the rotation goes on after it
            order.remove(self)
            order.append(self)

    def release(self) -> None:
        """A batch ended: give its slot back and offer it round-robin to the models with work."""
        s = self.scheduler
        assert self.running > 0, "release() without a slot held"
        s._by_size[self.interpreters] -= 1
        s.in_flight -= 1
        self.running -= 1
        s._rotate()

    def leave(self) -> None:
        """Leave the rotation (the model closes); slots still held are released as usual."""
        if self in self.scheduler._order:
            self.scheduler._order.remove(self)


class FairScheduler:
    """The interpreter slots of one pool, handed to its models' batchers round-robin.

    slots: the pool's interpreters (Pool.interpreters)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.in_flight = 0  # slots held
        self._order: list[Seat] = []  # the rotation: least recently served first
        self._by_size = [0] * (slots + 1)  # slots held by models on exactly k interpreters
        self._rotating = False
        self._again = False

    def join(self, contender: Contender, *, interpreters: int) -> Seat:
        """A model's seat; interpreters: how many of the pool's (the first n) serve it."""
        if interpreters < 1:
            raise ValueError(f"interpreters must be >= 1, got {interpreters}")
        seat = Seat(self, contender, min(interpreters, self.slots))
        fresh = 0  # after the other seats never served, before those served
        while fresh < len(self._order) and self._order[fresh].turns == 0:
            fresh += 1
        self._order.insert(fresh, seat)
        return seat

    @property
    def free(self) -> int:
        """Slots no batch holds (a model on a subset may have less room)."""
        return self.slots - self.in_flight

    def _room(self, n: int) -> int:
        # min over k >= n of (k - batches of models on at most k interpreters)
        slots = self.slots
        if n >= slots:
            return slots - self.in_flight
        by_size = self._by_size
        held = 0
        for k in range(1, n):
            held += by_size[k]
        room = slots
        for k in range(n, slots + 1):
            held += by_size[k]
            room = min(room, k - held)
        return room

    def _rotate(self) -> None:
        """Offer free slots to the seats, least recently served first, one batch per
        offer, until no slot is free or every seat has passed."""
        if self._rotating:  # a release during an offer: the loop below goes on
            self._again = True
            return
        self._rotating = True
        passed: list[Seat] = []
        try:
            while self.in_flight < self.slots:
                for seat in tuple(self._order):
                    if seat in passed:
                        continue
                    if seat.contender.offer_slot():
                        break  # it moved to the end of the rotation: start again from the front
                    passed.append(seat)
                else:
                    if not self._again:
                        return
                if self._again:  # a slot came back meanwhile: everyone may take it
                    self._again = False
                    passed.clear()
        finally:
            self._rotating = False

    def stats(self) -> dict[str, object]:
        """Slots, slots held (JSON-ready)."""
        return {"slots": self.slots, "in_flight": self.in_flight}
