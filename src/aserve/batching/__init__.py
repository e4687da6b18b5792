"""Per-model micro-batching on the host: a queue, a dispatch policy, concatenation and split."""

from .batcher import Batcher, concat_inputs, split_outputs
from .fair import FairScheduler
from .policy import BatchPolicy, Decision, Pending, WindowPolicy

__all__ = [
    "BatchPolicy", "Batcher", "Decision", "FairScheduler", "Pending", "WindowPolicy", "concat_inputs",
    "split_outputs",
]
