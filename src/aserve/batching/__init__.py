"""Per-model micro-batching on the host: a queue, a dispatch policy, fair shares of a pool."""

from .batcher import Batcher
from .fair import FairScheduler
from .policy import BatchPolicy, Decision, Pending, WindowPolicy

__all__ = ["BatchPolicy", "Batcher", "Decision", "FairScheduler", "Pending", "WindowPolicy"]
