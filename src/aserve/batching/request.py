"""A request in a model's batcher: queued, then running in a batch, then answered."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .._native import RequestTrace
from ..tensor import Tensor

QUEUED, RUNNING, DONE = 0, 1, 2  # Request.state


class Request:
    """A request with its inputs and its future; `arrival`, `samples`, `deadline`, `budget`
    and `waited` are what the policy sees (policy.Pending)."""

    __slots__ = ("arrival", "budget", "context", "deadline", "future", "inputs", "samples", "state", "trace",
                 "waited")

    def __init__(self, arrival: float, samples: int, deadline: float | None, inputs: Sequence[Tensor],
                 future: asyncio.Future[dict[str, Tensor]], budget: float | None, trace: RequestTrace | None = None,
                 waited: float = 0.0, context: str | None = None) -> None:
        self.trace = trace  # the request's RequestTrace when it is sampled (aserve.tracing)
        self.context = context  # not sampled: the caller's W3C context for model code (tracing.batches)
        self.arrival = arrival
        self.waited = waited
        self.samples = samples
        self.deadline = deadline
        self.budget = budget
        self.inputs = inputs
        self.future = future
        self.state = QUEUED

    def finish(self, result: dict[str, Tensor] | None = None, error: BaseException | None = None) -> None:
        self.state = DONE
        future = self.future
        if future.done():  # timed out or cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
